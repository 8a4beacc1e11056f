"""RUN/checkpoints/: which checkpoint a run resumes from, which files it may replace, and rotation.

- A run deletes only checkpoints it owns: files it wrote itself, or regular files it verified as
  attnlab checkpoints (format and digest) before taking the directory over. Never a symlink, never a
  file it could not read, never anything it does not know.
- A fresh run refuses a directory that holds another run's files unless overwrite=true, and even then
  refuses one holding anything it cannot verify. resume=auto continues from the newest checkpoint and
  refuses when that one cannot be read (rather than going back to an older one and overwriting it);
  with no checkpoint it starts afresh only where that replaces no run's files, as a fresh run does.
"""

import logging
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from data.text_file import NotJSON, json_lines, loads_json
from rundir.checkpoint import load_checkpoint, save_checkpoint
from rundir.files import (
    METRICS,
    NO_SPACE,
    NOT_A_RUN,
    RUN_INFO,
    SUMMARY,
    atomic_write_bytes,
    link_or_copy,
    missing_target,
)

log = logging.getLogger(__name__)

STEP_NAME = re.compile(r"step_(\d+)\.safetensors")
BEST = "best.safetensors"


def checkpoint_step(path: Path) -> int | None:
    match = STEP_NAME.fullmatch(path.name)
    return int(match.group(1)) if match else None


def run_files(directory: Path) -> list[str]:
    """Names in a run directory that belong to some run (not the lock, not Hydra's job files)."""
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if p.name not in NOT_A_RUN)


def find_checkpoint(path: str | Path) -> Path:
    """A file as given; a run directory (or `outputs/latest`) means RUN/checkpoints/best.safetensors,
    else its newest step checkpoint."""
    path = Path(path).expanduser()
    if not path.is_dir():
        if target := missing_target(path):  # outputs/latest after its run was deleted or moved
            raise FileNotFoundError(
                f"{str(path)!r} is a symlink to {target}, which is missing; give a checkpoint file or a run directory"
            )
        if not path.exists():
            raise FileNotFoundError(f"{str(path)!r} does not exist; give a checkpoint file or a run directory")
        if not path.is_file():  # /dev/null, a pipe: it exists, and saying it did not misled
            raise FileNotFoundError(f"{str(path)!r} is not a file; give a checkpoint file or a run directory")
        return path
    for folder in (path / "checkpoints", path):
        if (folder / BEST).is_file():
            return folder / BEST
        steps = [p for p in folder.glob("step_*.safetensors") if checkpoint_step(p) is not None]
        if steps:
            return max(steps, key=lambda p: checkpoint_step(p) or -1)
    raise FileNotFoundError(
        f"run directory {str(path)!r} holds no checkpoint (no checkpoints/{BEST} or checkpoints/step_*.safetensors)"
    )


# What only a run writes into its directory: a folder holding none of them is no run's (a config.yaml alone is
# as likely a project's own, configs/config.yaml, which overwrite=true replaced on the refusal's advice).
RUN_RECORDS = ("checkpoints", "train.log", METRICS, RUN_INFO, SUMMARY)


class CheckpointDir:
    """`step_0000500.safetensors`, ... (the newest `keep_last`, or every one for None) and `best.safetensors`."""

    def __init__(self, directory: Path, keep_last: int | None = 2) -> None:
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.owned: set[str] = set()  # file names this run may delete

    def step_checkpoints(self) -> list[Path]:
        """Step checkpoints, oldest first (symlinks included: they can be read, never deleted)."""
        return sorted(self.directory.glob("step_*.safetensors"), key=lambda p: checkpoint_step(p) or -1)

    def latest(self) -> Path | None:
        existing = self.step_checkpoints()
        return existing[-1] if existing else None

    def resume_path(self, resume: str | None, overwrite: bool) -> Path | None:
        """Which checkpoint to resume from, or None for a fresh run; refuses what would lose a file."""
        newest = self.latest()
        if resume is None or (resume == "auto" and newest is None):  # auto: e.g. killed before its first save
            self.check_fresh_start(resume, overwrite)
            path, step = None, -1
        elif resume == "auto":
            path, step = newest, self.readable_step(newest)
        else:
            path, step = self.given_checkpoint(resume, overwrite)
        self.adopt(keep_up_to=step)
        return path

    def check_fresh_start(self, resume: str | None, overwrite: bool) -> None:
        """A run that starts at step 0 here replaces no other run's files unless told to (overwrite=true)."""
        self.check_a_runs_or_empty()
        if not (held := self._files_in_the_way(overwrite)):
            return
        if resume == "auto":
            raise ValueError(
                f"resume=auto: {self.directory.parent} holds another run's files ({held}) but no checkpoint "
                "to continue from; pass overwrite=true to start afresh, or another out_dir"
            )
        if self.latest() is None:  # e.g. a run killed before its first save: resume=auto is refused too
            raise ValueError(
                f"{self.directory.parent} already holds another run's files ({held}), with no checkpoint "
                "to continue; pass overwrite=true to replace them, or another out_dir"
            )
        raise ValueError(
            f"{self.directory.parent} already holds another run's files ({held}); "
            "pass resume=auto to continue it, overwrite=true to replace it, or another out_dir"
        )

    def readable_step(self, path: Path) -> int:
        """resume=auto: the newest checkpoint's step, refused in one line if it cannot be read."""
        try:
            load_checkpoint(path)
        except ValueError as e:
            raise ValueError(
                f"resume=auto: the newest checkpoint cannot be read ({e}); move it away to resume from an "
                "older one, or give resume=PATH"
            ) from None
        return checkpoint_step(path) or -1  # listed from this directory: its name is its step

    def given_checkpoint(self, resume: str, overwrite: bool) -> tuple[Path, int]:
        """resume=PATH: a whole attnlab checkpoint, and its step here (-1 for one from elsewhere). Refuses
        newer checkpoints or another run's files it does not continue: two histories would interleave."""
        path = Path(resume).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"resume={resume!r} is not a file; give resume=auto or a checkpoint path")
        load_checkpoint(path)  # refused here, in one line, if it is not a whole attnlab checkpoint
        step = checkpoint_step(path) if self.holds(path) else None
        step = -1 if step is None else step
        newer = [p.name for p in self.step_checkpoints() if (checkpoint_step(p) or -1) > step]
        if newer and not overwrite:
            raise ValueError(
                f"{self.directory} holds checkpoints that {path.name} does not continue ({', '.join(newer)}); "
                "pass overwrite=true to replace them, or resume=auto for the newest"
            )
        if not self.holds(path) and (held := self._files_in_the_way(overwrite)):  # a new history here
            raise ValueError(
                f"{self.directory.parent} already holds another run's files ({held}), which {path.name} "
                "does not continue; pass overwrite=true to replace them, or another out_dir"
            )
        return path, step

    def check_a_runs_or_empty(self) -> None:
        """A fresh start replaces a run's files (with overwrite=true), never files no run wrote: overwrite does not
        make `out_dir=.` in the repository (.git, README.md) or configs/ a run's directory."""
        held = run_files(self.directory.parent)
        records = [self.directory.parent / name for name in RUN_RECORDS]
        if held and not any(p.exists() or p.is_symlink() for p in records):  # a copy's link to a deleted run too
            raise ValueError(  # not "another run's files", which offered overwrite=true
                f"{self.directory.parent} holds files no run wrote ({', '.join(held[:4])}); give a new or empty out_dir"
            )

    def _files_in_the_way(self, overwrite: bool) -> str:
        """The files of another run that a fresh run here would replace ("" for none, or under overwrite)."""
        return "" if overwrite else ", ".join(run_files(self.directory.parent)[:4])

    def holds(self, path: Path) -> bool:
        """`path` is listed in this directory (a symlink there too: its name is its step here)."""
        return path.absolute().parent.resolve() == self.directory.resolve()

    def adopt(self, keep_up_to: int) -> None:
        """Take ownership of the files this run will replace: checkpoints after `keep_up_to` (and best,
        for a fresh start) must be regular attnlab checkpoints, verified, or the run is refused."""
        if not self.directory.is_dir():
            return
        for path in sorted(self.directory.iterdir()):
            step = checkpoint_step(path)
            if path.name.startswith(".") and ".tmp-" in path.name:
                continue  # a killed save's temp file: removed when the run starts
            if step is not None and step <= keep_up_to:
                if not path.is_symlink():
                    self.owned.add(path.name)  # this run's own history, rotated as it goes
                continue
            if path.name == BEST and keep_up_to >= 0:
                continue  # a resumed run keeps best until it saves a better one
            self._verify_replaceable(path)
            self.owned.add(path.name)

    def _verify_replaceable(self, path: Path) -> None:
        what = f"{path} is not a checkpoint this run can verify"
        if path.is_symlink() or not path.is_file():
            raise ValueError(f"{what} (a symlink or not a regular file); move it away first")
        if checkpoint_step(path) is None and path.name != BEST:
            raise ValueError(f"{what} (an unknown file); move it away first")
        try:
            load_checkpoint(path)
        except ValueError as e:
            raise ValueError(f"{what} ({e}); move it away first") from None

    def history_kept(self, resume_from: Path | None, step: int) -> int:
        """The last step of this directory's records that the run continues: `step` when it resumes one of
        its checkpoints, else -1 (a fresh run, or a foreign checkpoint's, starts the records afresh)."""
        return step if resume_from is not None and self.holds(resume_from) else -1

    def check_writable(self) -> None:
        """Before anything of the run is replaced, what its first save needs: a checkpoints/ that is a folder it
        may write, and a best.safetensors that is no folder. Each failed only at that save, after the run had
        rewritten its records (a read-only checkpoints/ after 250 steps)."""
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"{self.directory} is not a folder; a run saves its checkpoints there: move it away")
        if (self.directory / BEST).is_dir():
            raise ValueError(f"{self.directory / BEST} is a folder; a run writes its best checkpoint there: move it")
        if not self.directory.is_dir():
            return  # made at the first save, beside the run's other files
        probe = self.directory / f".probe.tmp-{os.getpid()}"  # the name start() removes, if a kill leaves it
        try:
            probe.touch()
            probe.unlink()
        except OSError as e:
            raise ValueError(
                f"{self.directory} cannot be written ({e.strerror}); a run saves its checkpoints there"
            ) from None

    def start(self, resume_from: Path | None, step: int) -> None:
        """Before the first step: drop temp files of killed saves and the owned checkpoints this run
        replaces (those after the step it continues from)."""
        if not self.directory.is_dir():
            return
        for tmp in self.directory.glob(".*.tmp-*"):
            log.info("removing %s, left by an interrupted save", tmp)
            tmp.unlink(missing_ok=True)
        keep_up_to = self.history_kept(resume_from, step)
        for name in sorted(self.owned):
            path = self.directory / name
            if (checkpoint_step(path) or -1) > keep_up_to or (name == BEST and keep_up_to < 0):
                log.warning("replacing %s: this run does not continue it", path)
                path.unlink(missing_ok=True)
                self.owned.discard(name)

    def save(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        meta: dict[str, Any],
        step: int,
        is_best: bool,
        averaged: dict[str, torch.Tensor] | None = None,
    ):
        name = f"step_{step:07d}.safetensors"
        if (self.directory / name).is_symlink():
            raise ValueError(f"{self.directory / name} is a symlink; this run will not write through it")
        try:
            path = save_checkpoint(self.directory / name, model, optimizer, meta, averaged)
            self.owned.add(name)
            if is_best:  # replaces a symlink there (a cp -as copy's), never writes through it: link_or_copy renames
                link_or_copy(path, self.directory / BEST)
                self.owned.add(BEST)
        except OSError as e:
            if e.errno not in NO_SPACE:
                raise
            raise OSError(e.errno, f"{e.strerror}; {self.after_no_space()}") from None
        if self.keep_last is None:  # every step checkpoint kept: head importance over training reads them all
            return path
        owned_steps = [p for p in self.step_checkpoints() if p.name in self.owned and not p.is_symlink()]
        for old in owned_steps[: -self.keep_last]:
            old.unlink()
            self.owned.discard(old.name)
        return path

    def after_no_space(self) -> str:
        """What to do after a save that did not fit; resume=auto only where there is a checkpoint to continue
        (writes are atomic, so the newest one here is whole)."""
        newest = self.latest()
        if newest is None:  # a fresh run's first save: its records are here, so a new start needs overwrite
            return (
                "no checkpoint of this run is saved yet, so there is nothing to resume: free space, then start "
                "again with overwrite=true"
            )
        return f"{newest.name} is intact: free space, then continue with resume=auto"


def trim_metrics(path: Path, step: int) -> None:
    """Keep only records up to `step` (and no torn last line), so a resumed run logs each step once;
    step -1 keeps none (a record without a step counts as step 0)."""
    if not path.exists():
        return
    kept = []
    for number, line in json_lines(path, "the run's record"):  # a bounded line at a time
        try:
            record = loads_json(line.decode("utf-8"), f"{path} line {number}")
        except UnicodeDecodeError as e:
            raise ValueError(
                f"{path} is not UTF-8 text (line {number}, byte {e.start}); records are JSON lines: move it away"
            ) from None
        except NotJSON:
            continue  # a line torn by a kill
        if not isinstance(record, dict):
            continue
        at = record.get("step", 0)
        if isinstance(at, bool) or not isinstance(at, int):  # refused before anything of the run is replaced
            raise ValueError(f"{path} has a record with step {at!r}; each record's step is an integer: mend that line")
        if at <= step:
            kept.append(line if line.endswith(b"\n") else line + b"\n")
    atomic_write_bytes(path, b"".join(kept))
