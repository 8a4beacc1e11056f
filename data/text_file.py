"""A UTF-8 text a user names on a command line (sample.py's --prompt-file and stdin, head_importance.py's
--text): a file or a pipe (`<(printf ...)`, a FIFO), read up to a limit so that /dev/zero or a runaway pipe
cannot fill memory, and refused in one line naming it when it is none of these."""

from pathlib import Path

MAX_TEXT_BYTES = 16 * 2**20


def read_text_file(path: Path, what: str, noun: str = "text", why: str = "") -> str:
    """The text of `path`; `what` names it in errors (e.g. "--text"); `noun` and `why` word the size limit's."""
    where = f"{what} {str(path)!r}"
    if path.is_dir():
        raise ValueError(f"{where} is a directory; give a UTF-8 text file")
    if not path.exists():  # a pipe exists, though it is no regular file
        raise FileNotFoundError(f"{where} does not exist")
    with open(path, "rb") as f:
        return decode_text(f.read(MAX_TEXT_BYTES + 1), where, noun, why)


def decode_text(data: bytes, where: str, noun: str = "text", why: str = "") -> str:
    """`data` (read with one byte past the limit) as UTF-8, refused in one line naming `where`."""
    if len(data) > MAX_TEXT_BYTES:
        raise ValueError(f"{where} holds more than {MAX_TEXT_BYTES // 2**20} MiB{why}; give a shorter {noun}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where} is not UTF-8 text (byte {e.start})") from None
