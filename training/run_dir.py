"""A run's directory, and the rule that nothing in it is ever lost.

    RUN/.lock                        held (flock) by the live run; holds its PID and command
    RUN/config.yaml, train.log, metrics.jsonl, run_info.json, summary.json
    RUN/checkpoints/step_NNNNNNN.safetensors (the newest keep_last), best.safetensors

- One live run per directory: an exclusive `flock` on RUN/.lock for the run's life. The kernel drops
  it when the holder exits or dies, so a lock is never stale; a second run is refused in one line.
- A run deletes only checkpoints it owns: files it wrote itself, or regular files it verified as
  attnlab checkpoints (format and digest) before taking the directory over. Never a symlink, never a
  file it could not read, never anything it does not know.
- A fresh run refuses a directory that holds another run's files unless overwrite=true, and even then
  refuses one holding anything it cannot verify. resume=auto continues from the newest checkpoint and
  refuses when that one cannot be read (rather than going back to an older one and overwriting it);
  with no checkpoint it starts afresh only where that replaces no run's files, as a fresh run does.
"""

import contextlib
import fcntl
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.checkpoint import atomic_write_bytes, load_checkpoint, save_checkpoint

log = logging.getLogger(__name__)

STEP_NAME = re.compile(r"step_(\d+)\.safetensors")
BEST = "best.safetensors"
LOCK = ".lock"
# Written into a sweep job's directory by Hydra before the run starts; they do not make it another run's.
NOT_A_RUN = {LOCK, ".hydra", "train.log"}


def checkpoint_step(path: Path) -> int | None:
    match = STEP_NAME.fullmatch(path.name)
    return int(match.group(1)) if match else None


class RunDirInUse(ValueError):
    """Another live process holds the run directory's lock."""


class RunLock:
    """An exclusive lock on a run directory; `release(discard=True)` undoes what `acquire` made, the lock
    file and the directories, when nothing else was written (a run refused at start-up leaves no trace)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.created: list[Path] = []  # the directory and the parents that acquire made, innermost first
        self.found: set[str] = set()  # the names the directory held before acquire
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        missing = [self.directory, *self.directory.parents]
        nearest = next(d for d in missing if d.exists() or d.is_symlink())
        if nearest.is_symlink() and not nearest.exists():  # mkdir cannot make its target
            where = "is a symlink" if nearest == self.directory else f"is under a symlink ({nearest})"
            raise ValueError(f"out_dir={str(self.directory)!r} {where} to {os.readlink(nearest)}, which is missing")
        if not nearest.is_dir():
            where = "is a file" if nearest == self.directory else f"is under a file ({nearest})"
            raise ValueError(f"out_dir={str(self.directory)!r} {where}, not a directory")
        self.created = missing[: missing.index(nearest)]
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.found = {p.name for p in self.directory.iterdir()}
            self._fd = self._open_locked()
        except OSError as e:  # read-only, another user's, a name too long: one line naming out_dir
            for made in self.created:
                with contextlib.suppress(OSError):
                    made.rmdir()
            where = f"{e.strerror}: {e.filename}"
            raise ValueError(f"out_dir={str(self.directory)!r} cannot be written ({where})") from None
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"pid {os.getpid()}: {' '.join([Path(sys.argv[0]).name, *sys.argv[1:]])}\n".encode())
        return self

    def _open_locked(self) -> int:
        """The lock file, flocked. A refused run unlinks the lock file it made: one opened just before
        that is no longer the directory's, so it is opened again."""
        path = self.directory / LOCK
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 4096).decode(errors="replace").strip() or "another process"
                os.close(fd)
                raise RunDirInUse(
                    f"{self.directory} is in use by a live run ({holder}); wait for it or choose another out_dir"
                ) from None
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(fd), os.stat(path)):
                    return fd
            os.close(fd)

    def release(self, discard: bool = False) -> None:
        if self._fd is None:
            return
        if discard and {p.name for p in self.directory.iterdir()} <= self.found | {LOCK}:
            if LOCK not in self.found:  # while still held: a run that opened it meanwhile opens it again
                (self.directory / LOCK).unlink(missing_ok=True)
            for made in self.created:
                with contextlib.suppress(OSError):  # not empty: another run wrote there meanwhile
                    made.rmdir()
        os.close(self._fd)  # closing the descriptor releases the flock
        self._fd = None


def run_files(directory: Path) -> list[str]:
    """Names in a run directory that belong to some run (not the lock, not Hydra's job files)."""
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if p.name not in NOT_A_RUN)


class CheckpointDir:
    """`step_0000500.safetensors`, ... (the newest `keep_last`) and `best.safetensors`."""

    def __init__(self, directory: Path, keep_last: int = 2) -> None:
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
        if resume is None:
            if held := self._files_in_the_way(overwrite):
                if self.latest() is None:  # e.g. a run killed before its first save: resume=auto is refused too
                    raise ValueError(
                        f"{self.directory.parent} already holds another run's files ({held}), with no checkpoint "
                        "to continue; pass overwrite=true to replace them, or another out_dir"
                    )
                raise ValueError(
                    f"{self.directory.parent} already holds another run's files ({held}); "
                    "pass resume=auto to continue it, overwrite=true to replace it, or another out_dir"
                )
            path, step = None, -1
        elif resume == "auto" and self.latest() is None:  # e.g. a run killed before its first save
            if held := self._files_in_the_way(overwrite):
                raise ValueError(
                    f"resume=auto: {self.directory.parent} holds another run's files ({held}) but no checkpoint "
                    "to continue from; pass overwrite=true to start afresh, or another out_dir"
                )
            path, step = None, -1
        elif resume == "auto":
            path = self.latest()
            try:
                load_checkpoint(path)
            except ValueError as e:
                raise ValueError(
                    f"resume=auto: the newest checkpoint cannot be read ({e}); move it away to resume from an "
                    "older one, or give resume=PATH"
                ) from None
            step = checkpoint_step(path) or -1  # listed from this directory: its name is its step
        else:
            path = Path(resume).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"resume={resume!r} is not a file; give resume=auto or a checkpoint path")
            load_checkpoint(path)  # refused here, in one line, if it is not a whole attnlab checkpoint
            step = checkpoint_step(path) if self.holds(path) else None
            step = -1 if step is None else step
            # Resuming an older or a foreign checkpoint here would interleave two histories.
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
        self.adopt(keep_up_to=step)
        return path

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

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict[str, Any], step: int, is_best: bool):
        name = f"step_{step:07d}.safetensors"
        if (self.directory / name).is_symlink():
            raise ValueError(f"{self.directory / name} is a symlink; this run will not write through it")
        path = save_checkpoint(self.directory / name, model, optimizer, meta)
        self.owned.add(name)
        if is_best and not (self.directory / BEST).is_symlink():
            link_or_copy(path, self.directory / BEST)
            self.owned.add(BEST)
        owned_steps = [p for p in self.step_checkpoints() if p.name in self.owned and not p.is_symlink()]
        for old in owned_steps[: -self.keep_last]:
            old.unlink()
            self.owned.discard(old.name)
        return path


def link_or_copy(src: Path, dst: Path) -> None:
    """Atomically make `dst` a hard link to `src` (no extra disk space), or a copy where links fail."""
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
        os.replace(tmp, dst)
    except OSError:
        tmp.unlink(missing_ok=True)
        atomic_write_bytes(dst, src.read_bytes())


def trim_metrics(path: Path, step: int) -> None:
    """Keep only records up to `step` (and no torn last line), so a resumed run logs each step once;
    step -1 keeps none (a record without a step counts as step 0)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by a kill
        if isinstance(record, dict) and record.get("step", 0) <= step:
            kept.append(line + "\n")
    atomic_write_bytes(path, "".join(kept).encode())
