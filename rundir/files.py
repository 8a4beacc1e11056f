"""The files of a run directory, and how they are written so that none is ever lost or torn.

    RUN/.lock                        held (flock) by the live run; holds its PID and command
    RUN/config.yaml, train.log, metrics.jsonl, run_info.json, summary.json, plots.png
    RUN/checkpoints/step_NNNNNNN.safetensors (the newest keep_last), best.safetensors

- One live run per directory: an exclusive `flock` on RUN itself and on RUN/.lock for the run's life. The
  kernel drops them when the holder exits or dies, so a lock is never stale; a second run is refused in one
  line, also when RUN/.lock was deleted by hand (the directory's lock cannot be).
- Every file is written to a temporary file beside it, fsynced and renamed (`atomic_write_bytes`), so a
  crash at any instant leaves the previous version whole. The rename replaces a symlink or hard link found
  at the name rather than writing through it; the files a run appends to are first made its own
  (`open_for_append`), and a lock file that is not a run's own regular file is refused, never opened. So a
  run never writes outside its directory, nor into the original of a `cp -as` / `cp -al` copy it resumes.

Nothing here imports torch: the tools that only read records (the report, the lab's runs tab) use it too.
"""

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TextIO

from data.text_file import open_regular

LOCK = ".lock"
METRICS = "metrics.jsonl"  # one JSON record per log step and per evaluation
RUN_INFO = "run_info.json"  # shape, size and resolved config, written when training starts
SUMMARY = "summary.json"  # final metrics and speed, written when it ends
# Written into a sweep job's directory by Hydra before the run starts; they do not make it another run's.
NOT_A_RUN = {LOCK, ".hydra", "train.log"}
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a write that did not fit: a full disk, quota, size limit


def file_above(path: Path) -> Path | None:
    """The nearest existing ancestor of `path` when it is not a directory (nothing can be made under it)."""
    parent = next((p for p in path.parents if p.exists()), None)
    return parent if parent is not None and not parent.is_dir() else None


def missing_target(path: Path) -> str | None:
    """Where `path` points, if it is a symlink to something missing (outputs/latest after its run went); else None."""
    return os.readlink(path) if path.is_symlink() and not path.exists() else None


def run_dir_itself(out_dir: Path) -> Path:
    """The directory a symlinked out_dir points to, relative where out_dir was; out_dir itself otherwise. A run
    works in it from its lock on: outputs/latest moves on with the next run, and a run that followed the
    link at every write wrote into the next run's directory and rotated its checkpoints away (so must a
    command printed for this run not follow it)."""
    if not out_dir.is_symlink() or missing_target(out_dir):  # a dangling link is refused as such, by the lock
        return out_dir
    target = out_dir.resolve()
    return target if out_dir.is_absolute() else Path(os.path.relpath(target))


def atomic_write_bytes(path: Path, payload: bytes) -> None:
    """Temp file in the same directory, fsync, rename, fsync the directory. The rename replaces the name
    `path` itself: a symlink there is replaced, its target never written."""
    _atomic_write(path, len(payload), lambda f: f.write(payload))


def atomic_copy(src: Path, dst: Path, what: str = "") -> None:
    """`dst` made an atomic copy of the regular file `src`, streamed (a checkpoint, a long metrics.jsonl);
    `data.text_file.open_regular` refuses a FIFO or a device (a link to /dev/zero) in one line naming it."""
    with open_regular(src, what) as source:
        _atomic_write(dst, os.fstat(source.fileno()).st_size, lambda f: shutil.copyfileobj(source, f, 2**20))


def _atomic_write(path: Path, size: int, write: Callable[[BinaryIO], object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)  # a killed save's of the same pid, or a link: "x" creates, never follows
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if e.errno in NO_SPACE:  # what happened to this file only: whether a run can continue is the caller's
            raise OSError(
                e.errno,
                f"no space to write {path} ({size / 1e6:.1f} MB: {os.strerror(e.errno)}); "
                "it was not written, and its previous version, if any, is intact",
            ) from None
        raise
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)  # the rename itself survives a crash once the directory is synced
    os.fsync(dir_fd)
    os.close(dir_fd)


def open_for_append(path: Path) -> TextIO:
    """`path` opened to append lines (created if missing), never through a link: a symlink or a hard link
    found there (a `cp -as` / `cp -al` copy of a run, say) is first replaced by a copy of its own, so the
    file it points to stays as it was. O_NOFOLLOW refuses a link made after that check."""
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_nlink > 1):
            if path.exists():  # streamed, from a regular file only (a link to /dev/zero is refused)
                atomic_copy(path, path, "a run's record")
            else:  # a dangling link: empty
                atomic_write_bytes(path, b"")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # O_NONBLOCK: a FIFO there is refused here, not waited on
        os.close(fd)
        raise ValueError(f"{path} is not a regular file; a run appends only to its own files: move it away")
    return os.fdopen(fd, "a", buffering=1, encoding="utf-8")


def link_or_copy(src: Path, dst: Path) -> None:
    """Atomically make `dst` a hard link to `src` (no extra disk space), or a copy where links fail."""
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
        os.replace(tmp, dst)
    except OSError:
        tmp.unlink(missing_ok=True)
        atomic_copy(src, dst)


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
        self._dir_fd: int | None = None

    def acquire(self) -> "RunLock":
        missing = [self.directory, *self.directory.parents]
        nearest = next(d for d in missing if d.exists() or d.is_symlink())
        if target := missing_target(nearest):  # mkdir cannot make its target
            where = "is a symlink" if nearest == self.directory else f"is under a symlink ({nearest})"
            raise ValueError(f"out_dir={str(self.directory)!r} {where} to {target}, which is missing")
        if not nearest.is_dir():
            where = "is a file" if nearest == self.directory else f"is under a file ({nearest})"
            raise ValueError(f"out_dir={str(self.directory)!r} {where}, not a directory")
        self.created = missing[: missing.index(nearest)]
        try:
            self._dir_fd = self._lock_directory()
            self.found = {p.name for p in self.directory.iterdir()}
            self._fd = self._open_locked()
        except (OSError, ValueError) as e:  # ValueError: in use, or a lock path that is not a run's lock
            self._close()
            for made in self.created:
                with contextlib.suppress(OSError):
                    made.rmdir()
            if isinstance(e, ValueError):
                raise
            # read-only, another user's, a name too long, a full disk: one line naming out_dir
            where = f"{e.strerror}: {e.filename}"
            remedy = "; free space on it or choose another out_dir" if e.errno in NO_SPACE else ""
            raise ValueError(f"out_dir={str(self.directory)!r} cannot be written ({where}){remedy}") from None
        try:
            os.ftruncate(self._fd, 0)  # verified by _open_locked: our own kind of file, and no other name for it
            os.write(self._fd, f"pid {os.getpid()}: {' '.join([Path(sys.argv[0]).name, *sys.argv[1:]])}\n".encode())
        except OSError as e:  # a full disk: the write's own error names no file, and the lock made was left
            self.release(discard=True)
            remedy = "free space on it or choose another out_dir" if e.errno in NO_SPACE else "choose another out_dir"
            raise ValueError(
                f"out_dir={str(self.directory)!r} cannot be written ({e.strerror or e}: {self.directory / LOCK}); "
                f"{remedy}"
            ) from None
        return self

    def _lock_directory(self) -> int | None:
        """The directory itself, flocked: unlike RUN/.lock it cannot be deleted from under a live run. A
        refused run may remove a directory it made: one locked just before that is made and locked again."""
        while True:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunDirInUse(self._in_use()) from None
            except OSError:  # NFS emulates flock with POSIX locks, which a read-only fd cannot take: the lock
                os.close(fd)  # file alone guards the directory there
                return None
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(fd), os.stat(self.directory)):
                    return fd
            os.close(fd)

    def _open_locked(self) -> int:
        """The lock file, verified and flocked. It is opened only where it is a run's: never through a
        symlink (O_NOFOLLOW), never a file with another name (a hard link), a FIFO, a directory, or a file
        holding anything but a run's pid line, any of which acquire would otherwise truncate. A refused run
        unlinks the lock file it made: one opened just before that is no longer the directory's, so it is
        opened again."""
        path = self.directory / LOCK
        while True:
            try:  # O_NONBLOCK: a FIFO named .lock is refused below instead of hanging open()
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise self._not_a_lock(f"a symlink (to {os.readlink(path)})") from None
                if e.errno == errno.EISDIR:
                    raise self._not_a_lock("a directory") from None
                raise
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise self._not_a_lock("not a regular file")
                if st.st_nlink > 1:
                    raise self._not_a_lock(f"a hard link ({st.st_nlink} names for one file)")
                head = os.pread(fd, 4, 0)
                if head and head != b"pid ":
                    raise self._not_a_lock("a file that does not start with a run's 'pid ' line")
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunDirInUse(self._in_use()) from None
            except BaseException:
                os.close(fd)
                raise
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False)):
                    return fd
            os.close(fd)

    def _not_a_lock(self, what: str) -> ValueError:
        return ValueError(
            f"{self.directory / LOCK} is {what}, not a run's lock file; move it away (a run neither opens nor "
            "truncates it), then start again"
        )

    def _in_use(self) -> str:
        """The refusal, naming the live run from its lock file's pid line where that can be read safely."""
        holder = "another process"
        with contextlib.suppress(OSError):
            fd = os.open(self.directory / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                text = os.read(fd, 4096).decode(errors="replace").strip() if stat.S_ISREG(os.fstat(fd).st_mode) else ""
            finally:
                os.close(fd)
            holder = text if text.startswith("pid ") else holder
        return f"{self.directory} is in use by a live run ({holder}); wait for it or choose another out_dir"

    def _close(self) -> None:
        """Closing the descriptors releases the flocks."""
        for fd in (self._fd, self._dir_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._dir_fd = None

    def release(self, discard: bool = False) -> None:
        if self._fd is None:
            return
        if discard and {p.name for p in self.directory.iterdir()} <= self.found | {LOCK}:
            if LOCK not in self.found:  # while still held: a run that opened it meanwhile opens it again
                (self.directory / LOCK).unlink(missing_ok=True)
            for made in self.created:
                with contextlib.suppress(OSError):  # not empty: another run wrote there meanwhile
                    made.rmdir()
        self._close()


def live_run_in(directory: Path) -> str | None:
    """The refusal naming a live run that holds `directory` (its flock), or None: a probe that takes and at
    once drops a shared lock, so it never holds up a run (a sweep checks its folder's jobs before it starts)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return RunLock(directory)._in_use()
    except OSError:  # no flock on this file system: the run's own lock file still guards it
        return None
    finally:
        os.close(fd)
    return None
