"""Where the analysis tools may write: the checks their --out paths pass before any work is done, so a
bad path is one line, nothing written, and an existing file is replaced only when asked (--force)."""

from pathlib import Path

from rundir.files import file_above


def check_out_dir(out: Path, flag: str = "--out") -> None:
    """ValueError unless `out` is, or can be made as, a directory."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{flag} {str(out)!r} is a file; give a directory")
    above = file_above(out)
    if above is not None:
        raise ValueError(f"{flag} {str(out)!r} cannot be written: {str(above)!r} is a file, not a directory")


def check_replaceable(path: Path, force: bool, flag: str = "--out") -> None:
    """ValueError for an existing file, unless --force says it may be replaced."""
    if (path.exists() or path.is_symlink()) and not force:
        raise ValueError(f"{flag} {str(path)!r} already exists; pass --force to replace it")
