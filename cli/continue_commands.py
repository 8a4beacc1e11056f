"""The exact commands `python train.py` prints for what comes next: continue a run or a whole sweep, and the
closing lines of a finished run (sample from it, score it, continue it, compare its plots). Each is printed
to be pasted: it names this interpreter and the overrides that compose the run's own config."""

import contextlib
import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cli.config import hydra_value, override_key, shell_quote
from cli.config_diff import config_differences
from cli.run_dirs import OUTPUTS, newest_run
from rundir.checkpoint import read_header
from rundir.checkpoints import BEST, CheckpointDir, find_checkpoint
from rundir.files import run_dir_itself
from rundir.run import ModelMismatch
from training.config import TrainConfig


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


# Keys a continue command sets itself, and the ends a user chooses anew when extending a finished run.
RUN_KEYS = ("out_dir", "resume", "overwrite")
END_KEYS = ("max_steps", "budget_s")


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
        differences = config_differences(newest, cfg, skip=(*RUN_KEYS, *END_KEYS))  # the newest run's values
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
    if not (differences := config_differences(run, cfg, skip=(*RUN_KEYS, *END_KEYS))):
        return e
    keys = {override_key(d) for d in differences}
    command = continue_command(run, [*(o for o in overrides if override_key(o) not in keys), *differences])
    return ValueError(f"{e}: {command}")


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
