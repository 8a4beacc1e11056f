"""The check that a user's file is UTF-8 text, done once per file version.

A binary, UTF-16 or unreadable file is refused in one line naming it, before any tokenizing. A file that
passed is remembered by its stamp (path, size, mtime, ctime: no user call sets the change time back), one
hash a line in `<cache>/utf8_checked.txt`, so an unchanged gigabyte corpus is not read twice for it.
"""

import codecs
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

CHECKED_FILE = "utf8_checked.txt"
BLOCK = 1 << 20


def file_stamp(path: Path) -> list:
    # The change time too: `cp -p` and `touch -r` restore size and mtime, but no user call sets ctime.
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


def stamp_hash(stamp: list) -> str:
    return hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:32]


def check_utf8_files(paths: list[Path], cache_dir: Path, on_bytes: Callable[[int], None] = lambda n: None) -> None:
    """Check every file of `paths` not already checked in this version; `on_bytes(n)` after each n bytes read."""
    record = cache_dir / CHECKED_FILE
    checked = set(record.read_text(errors="replace").split()) if record.is_file() else set()
    for path in paths:
        key = stamp_hash(file_stamp(path))
        if key in checked:
            on_bytes(path.stat().st_size)
            continue
        check_utf8_text(path, on_bytes)
        _remember(record, key)


def _remember(record: Path, key: str) -> None:
    # O_APPEND writes of one short line do not interleave; a torn line only costs that file a second check.
    try:
        fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{key}\n".encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # a cache we cannot note this in only checks the file again next time


def check_utf8_text(path: Path, on_bytes: Callable[[int], None] = lambda n: None) -> None:
    """Refuse a binary, non-UTF-8 or unreadable file in one line before it is tokenized at length."""
    try:
        _check_utf8_bytes(path, on_bytes)
    except OSError as e:  # e.g. another user's file: one line naming it, not the bare errno
        raise ValueError(f"data.files entry {str(path)!r} cannot be read ({e.strerror}); give readable files") from None


def _check_utf8_bytes(path: Path, on_bytes: Callable[[int], None]) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        if f.read(2) in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):  # Notepad's "Unicode"; its NULs read as binary
            raise ValueError(f"data.files entry {str(path)!r} is UTF-16 text; convert it to UTF-8 (e.g. with iconv)")
        f.seek(0)
        while True:
            chunk = f.read(BLOCK)
            if b"\0" in chunk:
                raise ValueError(f"data.files entry {str(path)!r} is a binary file; give UTF-8 text files")
            pending = len(decoder.getstate()[0])  # bytes of a character the last chunk cut, counted in e.start
            try:
                decoder.decode(chunk, final=not chunk)  # final: a character cut short at the end is refused too
            except UnicodeDecodeError as e:
                byte = offset - pending + e.start
                raise ValueError(
                    f"data.files entry {str(path)!r} is not UTF-8 text (byte {byte}); give UTF-8 text files"
                ) from None
            if not chunk:
                return
            offset += len(chunk)
            on_bytes(len(chunk))
