"""The prepared-data cache as a place on disk: it can be written, a full disk is one line naming it, a build is
locked while it runs, and what a killed build or a damaged entry left is cleared before it misleads anyone."""

import errno
import fcntl
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

BUILD_LOCK = ".building"  # flocked by the process writing a temp dir, for as long as it writes
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)


def check_writable(cache_dir: Path) -> None:
    """Refuse a cache that cannot be written in one line, before the sdist, `datasets` or the tokens do
    with a bare errno: e.g. a read-only or another user's $ATTNLAB_CACHE."""
    try:
        (cache_dir / "prepared").mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=cache_dir / "prepared").close()
    except OSError as e:
        if e.errno in FULL_DISK:
            raise full_disk(cache_dir, e) from None
        raise ValueError(
            f"the data cache {cache_dir} cannot be written ({e.strerror}: {e.filename}); "
            "set ATTNLAB_CACHE or data.cache_dir to a writable directory"
        ) from None


def full_disk_cause(error: BaseException) -> OSError | None:
    """The ENOSPC / EDQUOT behind `error`, however a library wrapped it (`datasets` raises its own
    DatasetGenerationError from the OSError), or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in FULL_DISK:
            return error
        error = error.__cause__ or error.__context__
    return None


def full_disk(cache_dir: Path, cause: OSError) -> ValueError:
    where = f" writing {cause.filename}" if cause.filename else ""
    return ValueError(
        f"the data cache {cache_dir} is full ({cause.strerror}{where}); nothing half-made was kept: free some space "
        "there, or set ATTNLAB_CACHE or data.cache_dir to a disk with room"
    )


def hold_build_lock(tmp: Path) -> int:
    fd = os.open(tmp / BUILD_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def remove_abandoned_builds(prepared: Path) -> None:
    """Delete the temp dirs of preparations whose process died (SIGKILL, a crash): their lock is free.
    A corpus's partial token files can be gigabytes, in a hidden directory no one would find, so every
    preparation, of any corpus and cached or not, clears them."""
    for tmp in prepared.glob(".*-*"):
        try:
            fd = os.open(tmp / BUILD_LOCK, os.O_RDWR)
        except OSError:  # no lock file: not a build of ours (or one a moment old), left alone
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live preparation, in another process
        finally:
            os.close(fd)
        log.info("removing %s, left by a preparation that was killed", tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def remove_unfinished(directory: Path) -> None:
    """Clear a cache entry with no meta.json so it is prepared again: entries are published whole (renamed into
    place with meta.json inside), so one without it was damaged after the fact, and no reader can trust it.
    Renamed aside first, so a reader never finds half of it; refused in one line when that fails."""
    aside = directory.with_name(f".{directory.name}-unfinished")
    try:
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(directory, aside)
    except OSError as e:
        raise ValueError(
            f"{directory} has no meta.json and cannot be cleared ({e.strerror}); delete it and prepare again"
        ) from None
    log.info("%s had no meta.json (damaged); preparing it again", directory)
    shutil.rmtree(aside, ignore_errors=True)
