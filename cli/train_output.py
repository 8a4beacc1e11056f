"""What `python train.py` shows and where it writes: the run directory's name, a quiet terminal (a short
header, log lines that never glue onto the progress bar), the closing lines that say where the run is
and how to sample from it or continue it, and the sweep's closing hint.
"""

import contextlib
import dataclasses
import json
import logging
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from analysis.sweep import matches, planned_sweep
from cli.config import CONFIG_DIR, check_override_words, config_options, hydra_value, shell_quote
from cli.errors import replace_unencodable
from cli.sweep_check import check_every_job, live_sweep
from cli.sweep_jobs import jobs_at_a_time
from data.text_file import read_yaml_text
from rundir.checkpoint import read_header
from rundir.checkpoints import BEST, CheckpointDir, find_checkpoint, run_files
from rundir.files import RunDirInUse, live_run_in, run_dir_itself
from rundir.run import ModelMismatch
from training.config import TrainConfig
from training.distributed import DistInfo

OUTPUTS = Path("outputs")
log = logging.getLogger(__name__)


class ConsoleStream:
    """sys.stdout / sys.stderr of a run: what it cannot write once the console's reader is gone is dropped,
    not raised. `python train.py 2>&1 | tee log` then Ctrl-C kills tee too, and the progress bar's next
    write (EPIPE) would end the run before its save; train.log and metrics.jsonl keep the record."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        replace_unencodable(stream)

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(BrokenPipeError):
            self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ... as the stream has them
        return getattr(self.stream, name)


class TqdmHandler(logging.Handler):
    """Console log lines written above the progress bar (tqdm.write), never glued onto it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


def console_logging(level: int = logging.INFO) -> None:
    """INFO and above to the terminal as plain messages (train.log keeps timestamps and names)."""
    root = logging.getLogger()
    root.setLevel(level)
    if not any(isinstance(h, TqdmHandler) for h in root.handlers):
        handler = TqdmHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    for noisy in ("httpx", "huggingface_hub", "datasets", "filelock", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def python_command() -> str:
    """How to run this interpreter from the shell: `python` where that is the one on PATH (an activated
    venv), else its path (`.venv/bin/python` after README command 1), so every command printed runs as
    pasted rather than failing with `No module named 'torch'`."""
    on_path = shutil.which("python")
    if on_path and os.path.abspath(on_path) == os.path.abspath(sys.executable):
        return "python"
    executable = Path(sys.executable).absolute()
    with contextlib.suppress(ValueError):
        return shlex.quote(str(executable.relative_to(Path.cwd().absolute())))
    return shlex.quote(str(executable))


def new_run_dir(root: Path = OUTPUTS) -> Path:
    """`outputs/DATE/TIME`, not yet created; `-2`, `-3`, ... when a run of the same second has it."""
    base = root / time.strftime("%Y-%m-%d") / time.strftime("%H-%M-%S")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def newest_run(root: Path) -> Path | None:
    """The most recently written run under `root` that holds a step checkpoint (for error hints)."""
    runs = [p.parent.parent for p in Path(root).glob("**/checkpoints/step_*.safetensors")]
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None


def point_latest(root: Path, run: Path) -> None:
    """`root/latest` -> `run`, replaced atomically (a symlink, relative, so the tree can move)."""
    link = Path(root) / "latest"
    if link.exists() and not link.is_symlink():  # someone's own file or folder named latest: not ours to replace
        log.warning(
            "%s is not the link train.py keeps (a %s of its own): left as it is",
            link,
            "folder" if link.is_dir() else "file",
        )
        return
    tmp = link.with_name(f".latest.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(os.path.relpath(run.resolve(), link.parent.resolve()), tmp)
    os.replace(tmp, link)


def train_in_new_dir(cfg: TrainConfig, train: Callable[[TrainConfig], dict], root: Path = OUTPUTS) -> dict:
    """`train(cfg)` in the new run directory cfg.out_dir or, where a run started in the same second took that
    name first (`... &` in a loop: its lock is held), in the next free one."""
    while True:
        try:
            return train(cfg)
        except RunDirInUse:
            cfg.out_dir = str(new_run_dir(root))


# Keys a continue command sets itself, and the ends a user chooses anew when extending a finished run.
RUN_KEYS = ("out_dir", "resume", "overwrite")
END_KEYS = ("max_steps", "budget_s")


def override_key(override: str) -> str:
    """The key a Hydra override sets: '+model.n_head=8' -> 'model.n_head', '~seed' -> 'seed'."""
    return override.split("=", 1)[0].lstrip("+~")


def run_overrides(task: Sequence[str], argv: Sequence[str], multirun: bool) -> list[str]:
    """The overrides that compose this run again: Hydra's task overrides (a sweep job's are its own
    values). A sweep job, or a run continuing one (hydra.mode=RUN typed in argv; Hydra adds its own
    mode override to every run, so its list cannot tell), continues as the one run it is, in its
    directory, not as a new sweep."""
    return [*task, *(["hydra.mode=RUN"] if multirun or "hydra.mode=RUN" in argv else [])]


def continue_command(out_dir: Path | str, overrides: Sequence[str], drop: Sequence[str] = ()) -> str:
    """The exact command that continues the run in `out_dir`: resume=auto there, with the overrides the
    run was started with (without them it would compose another model, and be refused)."""
    keys = (*RUN_KEYS, *drop)
    kept = [o for o in overrides if override_key(o) not in keys]
    out_dir = run_dir_itself(Path(out_dir))
    run = f"out_dir={shell_quote(hydra_value(str(out_dir)))}"
    return " ".join([python_command(), "train.py", run, "resume=auto", *map(shell_quote, kept)])


def insisted_hint(out_dir: Path, overrides: Sequence[str]) -> str | None:
    """After a second Ctrl-C, which stops before the step in progress is saved: how to continue from the
    newest checkpoint (None when there is none: nothing to continue)."""
    latest = CheckpointDir(out_dir / "checkpoints").latest()
    if latest is None:
        return None
    return f"interrupted before a save; continue from {latest} with: {continue_command(out_dir, overrides)}"


def sweep_continue_command(sweep_dir: str, argv: Sequence[str]) -> str:
    """The command that continues an interrupted sweep as a whole: the sweep typed again, in its folder, with
    resume=auto (each started job continues its checkpoint, a finished one stays as it is, the rest start)."""
    keys = (*RUN_KEYS, "hydra.sweep.dir")
    kept = [a for a in argv if a not in ("-m", "--multirun") and override_key(a) not in keys]
    folder = f"hydra.sweep.dir={shell_quote(hydra_value(sweep_dir))}"
    return " ".join([python_command(), "train.py -m", *map(shell_quote, kept), folder, "resume=auto"])


def nothing_to_resume(out_dir: Path, overrides: Sequence[str], cfg: TrainConfig) -> ValueError:
    """resume=auto without out_dir: a new directory has nothing in it; point at the newest run, with the overrides
    that give this command's config the newest run's (else the command it prints was refused, naming one field)."""
    newest = newest_run(OUTPUTS)
    hint = "no run under outputs/ has checkpoints"
    if newest:
        differences = config_differences(newest, cfg)  # the newest run's values, in place of this command's
        keys = {override_key(d) for d in differences}
        command = continue_command(newest, [*(o for o in overrides if override_key(o) not in keys), *differences])
        hint = f"the newest run with checkpoints is {newest}: {command}"
    return ValueError(f"resume=auto: {out_dir} is a new run directory, so there is nothing to resume; {hint}")


def with_continue_command(e: Exception, cfg: TrainConfig | None, overrides: Sequence[str]) -> Exception:
    """resume=auto refused for another model config (`+debug=tiny`'s run continued by the default config): the
    refusal, with the command that continues the run as it was trained."""
    if not isinstance(e, ModelMismatch) or cfg is None or cfg.resume != "auto":
        return e
    run = Path(cfg.out_dir)
    if not (differences := config_differences(run, cfg)):
        return e
    keys = {override_key(d) for d in differences}
    command = continue_command(run, [*(o for o in overrides if override_key(o) not in keys), *differences])
    return ValueError(f"{e}: {command}")


def config_differences(run: Path, cfg: TrainConfig) -> list[str]:
    """Overrides that turn `cfg` into the config `run` was started with (its newest checkpoint's, which resume
    compares with, not config.yaml, which anyone may edit), except the run's place and ends, which a continue
    command sets itself; none where the run has no config to read."""
    try:
        saved = read_header(CheckpointDir(run / "checkpoints").latest())[0]["config"]
    except Exception:  # damaged or foreign: the plain command, as before
        return []
    if not isinstance(saved, dict):
        return []
    differences: list[str] = []

    def walk(then: dict, now: dict, prefix: str) -> None:
        for key, value in then.items():
            name = prefix + str(key)
            if isinstance(value, dict) and isinstance(now.get(key), dict):
                walk(value, now[key], name + ".")
            elif name not in (*RUN_KEYS, *END_KEYS, "model.vocab_size") and key in now and now[key] != value:
                differences.append(f"{name}={override_text(value)}")  # vocab_size: the run filled it in

    walk(saved, dataclasses.asdict(cfg), "")
    return differences


def override_text(value: Any) -> str:
    """A config value as an override writes it: null, true, 0.5, [a,b], a path in Hydra's quotes where needed."""
    if isinstance(value, list):
        return "[" + ",".join(override_text(v) for v in value) + "]"
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return str(value) if isinstance(value, int | float) else hydra_value(str(value))


def how_far(out_dir: Path) -> dict[str, Any] | None:
    """The newest step checkpoint's step, elapsed_s and the ends it ran under (max_steps, budget_s), from
    its header alone (no weights read); None where there is none to read."""
    latest = CheckpointDir(Path(out_dir) / "checkpoints").latest()
    if latest is None:
        return None
    try:
        meta, _ = read_header(latest)
        config = meta["config"]
        far = {k: meta[k] for k in ("step", "elapsed_s")} | {k: config[k] for k in END_KEYS}
        # "ROMEO:" is a line of Shakespeare's, not of your own corpus (where a BPE encodes it all the same)
        shakespeare = (config.get("data") or {}).get("source", "shakespeare") == "shakespeare"
        return far | {"prompt": DEMO_PROMPT if shakespeare and encodes(meta["tokenizer"], DEMO_PROMPT) else ""}
    except Exception:  # safetensors raises several types for a damaged file: the generic line then
        return None


DEMO_PROMPT = "ROMEO:"  # the closing sample command's prompt


def encodes(tokenizer: dict[str, Any], text: str) -> bool:
    """A checkpoint's tokenizer (its header's meta) can encode `text`: the byte-level BPEs anything, a char
    vocabulary only its own characters (one learned from another corpus may lack ROMEO's letters)."""
    return tokenizer.get("name") != "char" or set(text) <= set(tokenizer.get("chars") or "")


def new_end(far: dict[str, Any] | None) -> tuple[tuple[str, ...], str]:
    """(the end keys the continue command drops, the new end it asks for). A budget is total training
    time, continued across resumes, so a run that ended on its budget needs a larger total, or none:
    dropping only budget_s would bring back the config's, already spent (the default run's 280 s)."""
    if far is None:
        return END_KEYS, "max_steps=N  (or budget_s=SECONDS)"
    if far["budget_s"] and (not far["max_steps"] or far["step"] < far["max_steps"]):
        trained = f"{far['elapsed_s']:,.1f} s"
        hint = f"a total, more than the {trained} trained; or budget_s=null max_steps=N"
        return ("budget_s",), f"budget_s=SECONDS  ({hint})"
    budget = f"; its budget_s={far['budget_s']:g} still applies" if far["budget_s"] else ""
    return ("max_steps",), f"max_steps=N  (a total, more than the {far['step']:,} steps trained{budget})"


def checkpoint_line(out_dir: Path) -> str:
    """The checkpoint sample.py will read for this run: best.safetensors, or the newest step checkpoint of
    a run that never saved a best (every evaluation non-finite, as a diverged run under on_nonfinite=skip)."""
    try:
        path = find_checkpoint(out_dir)
    except FileNotFoundError:
        return "no checkpoint"
    return f"best checkpoint: {path}" if path.name == BEST else f"checkpoint (no best: no finite val loss): {path}"


# The val above is the loop's fixed batches (the default's are 128 tokens long, where the continuous cache has little
# to point at); --score reads every held-out token with its document's context, the README table's measure.
SCORE_HINT = "bits/byte on every held-out token, read as the README's table reads them"


def closing_lines(out_dir: Path, metrics: dict[str, Any], overrides: Sequence[str]) -> str:
    """Where the run is, and the exact commands to sample from it, score it and continue it."""
    out_dir = run_dir_itself(out_dir)
    out = shlex.quote(str(out_dir))
    checkpoint = checkpoint_line(out_dir)
    val = f"val loss {metrics['val/loss']:.4f}, {metrics['val/bpb']:.4f} bits/byte; " if "val/loss" in metrics else ""
    far = how_far(out_dir)
    dropped, end = new_end(far)
    prompt = f' "{DEMO_PROMPT}"' if far is None or far["prompt"] else ""  # none: it starts as a document does
    python = python_command()
    return "\n".join(
        [
            f"done: {val}run directory {out_dir}",
            f"  {checkpoint}",
            f"  sample:   {python} scripts/sample.py {out}{prompt}",
            f"  score:    {python} bench/bench_quality.py --score {out}  ({SCORE_HINT})",
            f"  continue: {continue_command(out_dir, overrides, drop=dropped)} {end}",
            f"  plots:    {out_dir / 'plots.png'}  ({python} scripts/plot_run.py {out} OTHER_RUN ... to compare)",
        ]
    )


class SweepHint(Callback):
    """After a multirun: the sweep folder and the report command. Hydra calls `on_multirun_end` only when
    every job succeeded; when one failed it raises that job's error once all have run, and train.py
    prints `sweep_hint(**SweepHint.sweep, failed=True)` before it. A paper's recipe names its report
    section and reference cell (`hydra.callbacks.sweep_hint.paper`, `.reference`), so the printed command
    is the one to paste."""

    sweep: ClassVar[dict[str, str | bool | None]] = {}  # the running sweep's sweep_hint arguments, set when it starts

    def __init__(self, paper: str | None = None, reference: str | None = None, full_val: bool = False) -> None:
        self.paper, self.reference, self.full_val = paper, reference, full_val
        self.jobs, self.at_a_time, self.started = 0, 1, 0.0  # set when a multirun starts; a single run has no jobs

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        jobs = planned_sweep(config.hydra.sweeper, list(config.hydra.overrides.task))
        # part of a recipe (model.n_head=1,2 of vaswani_a's five) may leave out its reference cell
        reference = self.reference if jobs is None or reference_in_plan(self.reference, jobs) else None
        SweepHint.sweep = {
            "sweep_dir": str(config.hydra.sweep.dir),
            "paper": self.paper,
            "reference": reference,
            "full_val": self.full_val,
        }
        self.jobs, self.started = len(jobs or []), time.perf_counter()
        launcher = config.hydra.get("launcher") or {}  # the parallel launcher's jobs at a time; Hydra's: one
        self.at_a_time = jobs_at_a_time(launcher.get("jobs")) if "jobs" in launcher else 1

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """`job i of N`, and once a job has finished, the time the rest will take at the pace so far. Jobs run
        `at_a_time` at once start as others finish; the ones still running count as half done."""
        if not self.jobs:  # a single run: Hydra calls this too, without a job number
            return
        done = int(config.hydra.job.num)
        eta = ""
        if done >= self.at_a_time:
            finished = done - (self.at_a_time - 1) / 2
            left = (time.perf_counter() - self.started) / finished * (self.jobs - finished)
            eta = f", about {left / 60:.0f} min left" if left >= 60 else f", about {left:.0f} s left"
        own = " ".join(config.hydra.overrides.task) or "defaults"  # as typed: override_dirname joins them with commas
        print(f"job {done + 1} of {self.jobs}: {own}{eta}", file=sys.stderr)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        print(sweep_hint(**SweepHint.sweep), file=sys.stderr)


def reference_in_plan(reference: str | None, jobs: list[list[str]]) -> bool:
    """Whether some job of the sweep has the `--reference` cell's values ('model.n_head=4,model.d_k=null'); a key
    no job's overrides set is taken to match (the recipe fixed it)."""
    if not reference:
        return True
    wanted = [part.partition("=")[::2] for part in reference.split(",")]
    for job in jobs:
        values = dict(o.partition("=")[::2] for o in job)
        if all(key not in values or matches(values[key], value) for key, value in wanted):
            return True
    return False


def sweep_hint(
    sweep_dir: str, paper: str | None = None, reference: str | None = None, failed: bool = False, full_val: bool = False
) -> str:
    """The folder and the report command, with the `--paper` section, the `--reference` cell and the
    `--full-val` scoring a recipe names."""
    done = "sweep done, with failed jobs (the report lists them)" if failed else "sweep done"
    report = f"{python_command()} scripts/ablation_report.py {shlex.quote(sweep_dir)}"
    if paper:
        report += f" --paper {paper}"
    if reference:
        report += f" --reference {shlex.quote(reference)}"
    if full_val:
        report += " --full-val"
    return f"{done}: {sweep_dir}\n  report: {report}"


def help_text(config_dir: Path) -> str:
    """`python train.py --help`: the config groups and their options, then every key of the schema with
    its type, meaning (from the dataclasses, so it cannot drift from them) and the value the default run
    gives it (configs/*.yaml composed over the schema, as `--cfg job` shows: budget_s 280, not null)."""
    from cli.config import default_run_values
    from cli.schema_help import render_help
    from studies.fairness import StudyRunConfig

    groups = sorted(d for d in config_dir.iterdir() if d.is_dir())
    lines = [
        "usage: python train.py [GROUP=OPTION ...] [KEY=VALUE ...]   (Hydra overrides; -m sweeps comma lists)",
        "",
        "config groups (GROUP=OPTION; +GROUP=OPTION for experiment and debug):",
        *[f"  {g.name:<12}{', '.join(config_options(g))}" for g in groups],
        "",
        "keys (KEY=VALUE), with the default run's values (configs/config.yaml):",
        render_help(StudyRunConfig, defaults=default_run_values(config_dir)),
        "",
        "examples:",
        "  python train.py                             # the default model on Shakespeare, a few minutes on a CPU",
        "  python train.py model.n_head=8 model.d_k=16 budget_s=120",
        "  python train.py out_dir=runs/a resume=auto  # start, or continue, the run in runs/a",
        "  python train.py --cfg job                   # print the resolved config and exit",
        "  python train.py --hydra-help                # Hydra's own flags, and tab completion for your shell:",
        '  eval "$(python train.py -sc install=bash)"  # completes keys and options (model.n_h<TAB>)',
    ]
    return "\n".join(lines)


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


def check_no_live_job(sweep_dir: Path) -> None:
    """A second sweep into a folder whose jobs are still training is refused before Hydra writes anything
    (it rewrote the live job's .hydra/ files and multirun.yaml before that job's own lock refused it)."""
    if not sweep_dir.is_dir():
        return
    for job in [sweep_dir, *sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.is_symlink())]:
        if live := live_run_in(job):
            raise live_sweep(sweep_dir, live)


def check_no_finished_jobs(sweep_dir: Path, args: Sequence[str]) -> None:
    """A sweep into a folder whose jobs hold runs is refused before Hydra writes anything, unless it continues
    them (resume=) or replaces them (overwrite=true): each job refused itself, but only after Hydra had rewritten
    the finished sweep's multirun.yaml and every job's .hydra/ files with the new command's."""
    given = {override_key(a): a.partition("=")[2] for a in args}
    if given.get("resume", "null") != "null" or given.get("overwrite", "false").lower() == "true":
        return
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and run_files(p)) if sweep_dir.is_dir() else []
    if jobs:
        held = f"{jobs[0].name}/: {', '.join(run_files(jobs[0]))}"
        raise ValueError(
            f"hydra.sweep.dir={sweep_dir} already holds a sweep's runs ({held}); "
            "continue it with resume=auto, replace its runs with overwrite=true, or give another folder"
        )


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
    folder = next((a.partition("=")[2] for a in args if override_key(a) == "hydra.sweep.dir"), None)
    if sweep and folder:
        check_no_live_job(Path(folder))
        check_no_finished_jobs(Path(folder), args)
    auto = any(override_key(a) == "resume" and a.partition("=")[2] == "auto" for a in args)
    if sweep and not folder and auto:  # a new, dated folder holds nothing to continue: it started afresh unsaid
        raise ValueError(
            "resume=auto continues a sweep in its own folder, and without hydra.sweep.dir this one gets a new "
            "dated folder with nothing in it: give hydra.sweep.dir=FOLDER (its sweep done: line names it)"
        )
    # Hydra's own flags (--cfg job, --info: no job runs; -cd DIR: another config) are Hydra's to read, and the
    # check read "--cfg" as an override ("token recognition error at: '-'")
    flags = [arg for arg in args if arg.startswith("-") and arg not in multirun]
    if sweep and info.is_main and not flags:
        check_every_job([arg for arg in args if arg not in multirun])  # before Hydra makes the sweep's folder
    argv = [program, *multirun, *(arg for arg in args if arg not in multirun)]
    if info.is_main:
        return argv
    ours = {"hydra.run.dir": ".", "hydra.output_subdir": "null", "hydra/job_logging": "none"}
    kept = [arg for arg in argv if override_key(arg) not in ours]
    return [*kept, *(f"{key}={value}" for key, value in ours.items())]
