"""The files of a run directory, and how they are written so that none is ever lost or torn.

    RUN/.lock                        held (flock) by the live run; holds its PID and command
    RUN/config.yaml, train.log, metrics.jsonl, run_info.json, summary.json, plots.png
    RUN/checkpoints/step_NNNNNNN.safetensors (the newest keep_last), best.safetensors

- One live run per directory: an exclusive `flock` on RUN/.lock for the run's life. The kernel drops
  it when the holder exits or dies, so a lock is never stale; a second run is refused in one line.
- Every file is written to a temporary file beside it, fsynced and renamed (`atomic_write_bytes`), so a
  crash at any instant leaves the previous version whole.

Nothing here imports torch: the tools that only read records (the report, the lab's runs tab) use it too.
"""

import contextlib
import errno
import fcntl
import os
import sys
from pathlib import Path

LOCK = ".lock"
METRICS = "metrics.jsonl"  # one JSON record per log step and per evaluation
RUN_INFO = "run_info.json"  # shape, size and resolved config, written when training starts
SUMMARY = "summary.json"  # final metrics and speed, written when it ends
# Written into a sweep job's directory by Hydra before the run starts; they do not make it another run's.
NOT_A_RUN = {LOCK, ".hydra", "train.log"}


def file_above(path: Path) -> Path | None:
    """The nearest existing ancestor of `path` when it is not a directory (nothing can be made under it)."""
    parent = next((p for p in path.parents if p.exists()), None)
    return parent if parent is not None and not parent.is_dir() else None


def atomic_write_bytes(path: Path, payload: bytes) -> None:
    """Temp file in the same directory, fsync, rename, fsync the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise OSError(
                e.errno,
                f"no space to write {path} ({len(payload) / 1e6:.1f} MB: {os.strerror(e.errno)}); "
                "earlier checkpoints are intact; free space, then continue with resume=auto",
            ) from None
        raise
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)  # the rename itself survives a crash once the directory is synced
    os.fsync(dir_fd)
    os.close(dir_fd)


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
