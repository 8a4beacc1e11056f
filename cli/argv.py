"""train.py's command line before Hydra reads it: `-m` where Hydra's parser takes it, the refusals Hydra would
answer with its whole usage or not at all (a group set to null, out_dir= on a sweep, hydra.run.dir=), and the
overrides that keep ranks other than 0 from writing. A sweep's own checks (every job composed, its folder not
live nor holding runs) are its guard's, cli/sweep_check.py, which Hydra runs as the sweep starts."""

from collections.abc import Sequence

from omegaconf import OmegaConf

from cli.config import CONFIG_DIR, check_override_words, config_options, override_key
from data.text_file import read_yaml_text
from training.distributed import DistInfo


def sweeping_recipe(args: Sequence[str]) -> str | None:
    """`+experiment=NAME` when that recipe's YAML turns Hydra's multirun on (it is a sweep without -m), unless
    the command line turns it off again (hydra.mode=RUN: one job of the recipe, as its continue line runs it)."""
    if "hydra.mode=RUN" in args:
        return None
    for arg in args:
        key, _, name = arg.lstrip("+").partition("=")
        path = CONFIG_DIR / "experiment" / f"{name}.yaml"
        if key == "experiment" and path.is_file():
            mode = OmegaConf.select(OmegaConf.create(read_yaml_text(path, "recipe")), "hydra.mode", default=None)
            if str(mode) == "MULTIRUN":
                return arg
    return None


def hydra_argv(argv: list[str], info: DistInfo) -> list[str]:
    """Hydra's command line on this rank: `-m` before the overrides, wherever it was typed (Hydra's parser
    refuses overrides on both sides of it, with its whole usage); ranks other than 0 write nothing of their
    own (their clocks would name other `outputs/DATE/TIME`s); `train` gives them rank 0's run directory.
    They log through train.py's own handler only: a Hydra one beside it would print each warning twice.
    `out_dir=` with `-m` is refused: Hydra gives each job its own folder, so it would be dropped unsaid."""
    program, *args = argv
    check_override_words(args)
    for arg in args:  # Hydra's own answer was "Config group override must be a string or a list. Got NoneType"
        key, _, value = arg.partition("=")
        group = CONFIG_DIR / key.lstrip("+")
        if value == "null" and group.is_dir():
            options = ", ".join(config_options(group))
            raise ValueError(f"{arg}: the config group {group.name} takes one of {options}, not null")
    multirun = [arg for arg in args if arg in ("-m", "--multirun")]
    sweep = "-m" if multirun else sweeping_recipe(args)
    if sweep and (given := [arg for arg in args if override_key(arg) == "out_dir"]):  # before any folder
        raise ValueError(
            f"{given[0]} does not apply to a sweep ({sweep}): each job writes to its own folder under "
            f"hydra.sweep.dir; give hydra.sweep.dir={given[0].partition('=')[2] or 'DIR'} instead"
        )
    if not sweep and (given := [arg for arg in args if override_key(arg) == "hydra.run.dir"]):
        raise ValueError(  # Hydra made that folder and left it empty: train.py names a run's folder itself
            f"{given[0]} does not place the run: give out_dir={given[0].partition('=')[2] or 'DIR'} instead"
        )
    folder = any(override_key(a) == "hydra.sweep.dir" for a in args)
    auto = any(override_key(a) == "resume" and a.partition("=")[2] == "auto" for a in args)
    if sweep and not folder and auto:  # a new, dated folder holds nothing to continue: it started afresh unsaid
        raise ValueError(
            "resume=auto continues a sweep in its own folder, and without hydra.sweep.dir this one gets a new "
            "dated folder with nothing in it: give hydra.sweep.dir=FOLDER (its sweep done: line names it)"
        )
    argv = [program, *multirun, *(arg for arg in args if arg not in multirun)]
    if info.is_main:
        return argv
    ours = {"hydra.run.dir": ".", "hydra.output_subdir": "null", "hydra/job_logging": "none"}
    kept = [arg for arg in argv if override_key(arg) not in ours]
    return [*kept, *(f"{key}={value}" for key, value in ours.items())]
