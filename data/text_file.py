"""Bounded reads of every file a tool opens: a prompt, a run's records, a config, a checkpoint's header, a
tokenizer. Each read has a size cap the refusal names, a record file must be a regular file (a FIFO would wait
for a writer, /dev/zero never ends), a file large by nature (metrics.jsonl) is streamed a bounded line at a
time, JSON and YAML nest at most MAX_DEPTH levels (deeper, json and OmegaConf end in RecursionError), and a
YAML file's aliases may expand to at most MAX_YAML_NODES values (a 302-byte alias bomb expands to 10^9). Every
refusal is one ValueError / FileNotFoundError line naming the file, so the next reader is covered by calling
these instead of open()."""

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

MAX_TEXT_BYTES = 16 * 2**20  # a prompt or a --text: the model reads only its context's tail of it
MAX_RECORD_BYTES = 64 * 2**20  # a JSON or YAML file: run_info.json, config.json, a 250k-vocab tokenizer.json
MAX_JSONL_BYTES = 256 * 2**20  # metrics.jsonl: a million logged steps are about 250 MB
MAX_LINE_BYTES = 2**20  # one record of a JSON-lines file (a run writes a few hundred bytes)
MAX_DEPTH = 100  # nesting of JSON and YAML: configs nest 5 deep; Python's own limit is 1000 frames
MAX_YAML_NODES = 100_000  # values a YAML file holds once its aliases are expanded


TOO_DEEP = f"nests deeper than {MAX_DEPTH} levels; no tool of this project writes that"


SMALL_RECORDS = "a run writes records of a few hundred bytes: move it away"


class Refused(ValueError):
    """A file refused: its message is `where` (the file, as the caller names it) and `reason` (what is wrong
    and what to do), kept apart for a report that names the file its own way."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where} {reason}")
        self.where, self.reason = where, reason


class NotJSON(Refused):
    """Text that is not JSON, or nests past MAX_DEPTH."""


def _where(path: Path, what: str) -> str:
    return f"{what} {str(path)!r}" if what else repr(str(path))


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


def open_regular(path: Path, what: str = "") -> BinaryIO:
    """`path` open to read, where it is (or links to) a regular file; FileNotFoundError if missing, else
    ValueError naming it: a FIFO (opened without waiting for a writer), a device, a socket, a directory."""
    where = _where(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"{where} does not exist") from None
    except OSError as e:
        raise Refused(where, f"cannot be read ({e.strerror or e})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else f"{_kind(mode)}, not a regular file"
        raise Refused(where, f"is {kind}; give a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "a special file"


def read_bytes(
    path: Path, what: str = "", limit: int = MAX_RECORD_BYTES, *, streams: bool = False, why: str = "", noun: str = ""
) -> bytes:
    """At most `limit` bytes of `path`, refused in one line beyond it (`why` and `noun` word the refusal). With
    `streams`, a pipe or FIFO (`<(printf ...)`) or a device is read too, up to the limit; otherwise only a
    regular file, whose size is checked before any of it is read."""
    where = _where(path, what)
    if streams and path.is_dir():  # a text a user names: say what to give instead
        raise Refused(where, "is a directory; give a UTF-8 text file")
    if streams:
        try:
            f = open(path, "rb")  # noqa: SIM115 (closed below; a FIFO's open waits for its writer, as it should)
        except FileNotFoundError:
            raise FileNotFoundError(f"{where} does not exist") from None
        except OSError as e:
            raise Refused(where, f"cannot be read ({e.strerror or e})") from None
    else:
        f = open_regular(path, what)
    with f:
        size = os.fstat(f.fileno()).st_size
        if stat.S_ISREG(os.fstat(f.fileno()).st_mode) and size > limit:
            raise Refused(where, _too_big(limit, why, noun, f" ({size / 2**20:.1f} MiB)"))
        try:
            data = f.read(limit + 1)
        except OSError as e:  # a read's own error (EIO) names no file
            raise Refused(where, f"cannot be read ({e.strerror or e})") from None
    if len(data) > limit:
        raise Refused(where, _too_big(limit, why, noun, ""))
    return data


def _too_big(limit: int, why: str, noun: str, size: str) -> str:
    return f"holds more than {_mib(limit)}{size}{why}; give {f'a shorter {noun}' if noun else 'a smaller file'}"


def read_text(path: Path, what: str = "", limit: int = MAX_RECORD_BYTES, *, errors: str = "strict", **kw: Any) -> str:
    """`path` as UTF-8 text (read_bytes' limits; `errors="replace"` for a log read leniently)."""
    where = _where(path, what)
    return _decode(read_bytes(path, what, limit, **kw), where, errors)


def read_text_file(path: Path, what: str, noun: str = "text", why: str = "") -> str:
    """A text a user names on a command line (sample.py's --prompt-file, head_importance.py's --text): a file
    or a pipe, at most MAX_TEXT_BYTES."""
    return read_text(path, what, MAX_TEXT_BYTES, streams=True, why=why, noun=noun)


def decode_text(data: bytes, where: str, noun: str = "text", why: str = "") -> str:
    """`data` (read to one byte past MAX_TEXT_BYTES: a prompt on stdin) as UTF-8, or refused naming `where`."""
    if len(data) > MAX_TEXT_BYTES:
        raise Refused(where, _too_big(MAX_TEXT_BYTES, why, noun, ""))
    return _decode(data, where)


def _decode(data: bytes, where: str, errors: str = "strict") -> str:
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise Refused(where, f"is not UTF-8 text (byte {e.start})") from None


# -- JSON ------------------------------------------------------------------------------------------------------


def loads_json(text: str | bytes, where: str) -> Any:
    """JSON text as Python; NotJSON naming `where` for text that does not parse, or nests past MAX_DEPTH."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise NotJSON(where, TOO_DEEP) from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError; a 5000-digit integer
        raise NotJSON(where, f"is not valid JSON ({error_text(e)})") from None
    if nesting(value) > MAX_DEPTH:
        raise NotJSON(where, TOO_DEEP)
    return value


def error_text(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]


def nesting(value: Any, stop: int = MAX_DEPTH) -> int:
    """How deep lists and dicts nest in `value` (0 for a scalar), counted without recursion up to `stop` + 1."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > stop:
            break
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return deepest


def read_json(path: Path, what: str = "", limit: int = MAX_RECORD_BYTES) -> Any:
    """A JSON file, bounded (read_bytes) and parsed with loads_json."""
    where = _where(path, what)
    return loads_json(_decode(read_bytes(path, what, limit), where), where)


def read_json_object(path: Path, what: str = "", limit: int = MAX_RECORD_BYTES) -> dict[str, Any]:
    """A JSON file that must hold an object (a run's record, a config.json)."""
    value = read_json(path, what, limit)
    if not isinstance(value, dict):
        raise Refused(_where(path, what), f"holds a JSON {type(value).__name__}; it must hold a JSON object")
    return value


def json_lines(path: Path, what: str = "", limit: int = MAX_JSONL_BYTES) -> Iterator[tuple[int, bytes]]:
    """(number, line) for each line of a JSON-lines file, streamed: at most MAX_LINE_BYTES a line and `limit`
    in all, each refused in one line naming the file. The last line may lack its newline (a write cut short)."""
    where = _where(path, what)
    with open_regular(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise Refused(where, _too_big(limit, "", "", f" ({size / 2**20:.1f} MiB)"))
        total = 0
        for number in range(1, 2**62):
            try:
                line = f.readline(MAX_LINE_BYTES + 1)
            except OSError as e:
                raise Refused(where, f"cannot be read ({e.strerror or e})") from None
            if not line:
                return
            total += len(line)
            if len(line) > MAX_LINE_BYTES:
                raise Refused(where, f"line {number} is longer than {_mib(MAX_LINE_BYTES)}; {SMALL_RECORDS}")
            if total > limit:  # it grew while read
                raise Refused(where, f"grew past {_mib(limit)} while read; {SMALL_RECORDS}")
            yield number, line


def json_records(path: Path, what: str = "", limit: int = MAX_JSONL_BYTES) -> Iterator[tuple[int, Any]]:
    """(number, value) for each line of a JSON-lines file that parses (json_lines' bounds; loads_json's depth);
    a line that does not (torn by a kill, or crafted) yields (number, NotJSON)."""
    where = _where(path, what)
    for number, line in json_lines(path, what, limit):
        try:
            yield number, loads_json(line, f"{where} line {number}")
        except NotJSON as e:
            yield number, e


# -- YAML ------------------------------------------------------------------------------------------------------


def read_yaml_text(path: Path, what: str = "", limit: int = MAX_RECORD_BYTES) -> str:
    """A YAML file's text, checked by check_yaml, for a loader of the caller's choice (OmegaConf.create)."""
    where = _where(path, what)
    text = _decode(read_bytes(path, what, limit), where)
    check_yaml(text, where)
    return text


def read_yaml(path: Path, what: str = "", limit: int = MAX_RECORD_BYTES) -> Any:
    """A YAML file as plain Python (yaml's safe loader), bounded and checked by check_yaml."""
    import yaml

    text = read_yaml_text(path, what, limit)
    return yaml.load(text, Loader=yaml.SafeLoader)


def check_yaml(text: str, where: str) -> None:
    """ValueError naming `where` for YAML that does not parse as one document, nests past MAX_DEPTH, refers to
    itself, or whose aliases expand past MAX_YAML_NODES values (which anything converting it would build)."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)  # nodes only: nothing is built yet
    except RecursionError:
        raise Refused(where, TOO_DEEP) from None
    except yaml.YAMLError as e:
        raise Refused(where, f"is not valid YAML ({' '.join(str(e).split())[:200]})") from None
    if root is not None:
        _expanded(root, 1, {}, set(), where)


def _expanded(node: Any, depth: int, seen: dict[int, tuple[int, int]], open_: set[int], where: str) -> tuple[int, int]:
    """(values, depth below) of `node` with its aliases expanded; each node is counted once (`seen`)."""
    import yaml

    if id(node) in seen:
        size, height = seen[id(node)]
    elif isinstance(node, yaml.ScalarNode):
        size, height = 1, 0
    else:
        if id(node) in open_:
            raise Refused(where, "holds an alias inside its own anchor (a value that contains itself)")
        open_.add(id(node))
        items = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
        size, height = 1, 0
        for item in items:
            if depth + 1 > MAX_DEPTH:
                raise Refused(where, TOO_DEEP)
            child_size, child_height = _expanded(item, depth + 1, seen, open_, where)
            size, height = size + child_size, max(height, child_height + 1)
            if size > MAX_YAML_NODES:
                raise Refused(
                    where,
                    f"expands to more than {MAX_YAML_NODES:,} values through its aliases (&anchor / *alias); "
                    "no tool of this project writes that",
                )
        open_.discard(id(node))
        seen[id(node)] = size, height
    if depth + height > MAX_DEPTH:
        raise Refused(where, TOO_DEEP)
    return size, height
