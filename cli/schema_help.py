"""Help text generated from a dataclass schema: every field's dotted name, type, default and meaning.

The meaning is the comment written beside the field in its class (`n_head: int = 4  # heads`), or
the comment lines just above it, or `field(metadata={"help": ...})`. The class source is parsed
with `ast` and `tokenize`, so the help is the schema itself and cannot drift from it. Nested
dataclasses (TrainConfig.model, .data, ...) are walked, giving names like `model.d_model`.
`OneLineParser` is the argparse parser the tools share, whose errors are one line.
"""

import argparse
import ast
import dataclasses
import difflib
import inspect
import io
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass
from functools import cache
from typing import NoReturn


@dataclass(frozen=True)
class FieldDoc:
    name: str  # dotted, e.g. "optim.lr"
    type: str  # as written: "int | None"
    default: object  # the default value (a factory's product); MISSING when there is none
    help: str  # the field's comment or metadata help; "" when it has neither


@cache
def field_comments(cls: type) -> dict[str, str]:
    """{field name: comment} for the fields a class body declares, its bases' included."""
    comments: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # built in a REPL or generated: no source to read
            continue
        comments.update(class_body_comments(source))
    return comments


def class_body_comments(source: str) -> dict[str, str]:
    """Comments of the annotated assignments directly in the first class of `source`."""
    by_line: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            by_line[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))
    comments = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        beside = [by_line[n] for n in range(stmt.lineno, stmt.end_lineno + 1) if n in by_line]
        above, n = [], stmt.lineno - 1
        while n in by_line and lines[n - 1].lstrip().startswith("#"):  # a comment block just above
            above.insert(0, by_line[n])
            n -= 1
        text = " ".join(beside or above)
        if text:
            comments[stmt.target.id] = text
    return comments


def type_name(tp: object) -> str:
    """`int | None` rather than `typing.Optional[int]`."""
    if tp is type(None):
        return "None"
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return str(tp).replace("typing.", "")


def default_of(f: dataclasses.Field) -> object:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def schema_fields(cls: type, prefix: str = "") -> list[FieldDoc]:
    """Every leaf field of a dataclass schema, nested dataclasses expanded, in declaration order."""
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    docs = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints.get(f.name, f.type)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            docs.extend(schema_fields(tp, f"{prefix}{f.name}."))
            continue
        meaning = f.metadata.get("help") or comments.get(f.name, "")
        docs.append(FieldDoc(f"{prefix}{f.name}", type_name(tp), default_of(f), meaning))
    return docs


def show_default(value: object) -> str:
    if value is MISSING:
        return "(required)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, tuple):  # a list, flattened to a tuple (analysis.sweep.flatten): shown as typed
        return str(list(value))
    return str(value)


def render_help(cls: type, prefix: str = "", width: int = 100, defaults: dict[str, object] | None = None) -> str:
    """A block of help lines: one `name  type  = default` line per field, its meaning beneath.
    defaults: {dotted name: value} shown instead of the schema's (what a composed config gives)."""
    docs = schema_fields(cls, prefix)
    defaults = defaults or {}
    name_w = max(len(d.name) for d in docs)
    type_w = max(len(d.type) for d in docs)
    lines = []
    for d in docs:
        default = defaults.get(d.name, d.default)
        lines.append(f"  {d.name:<{name_w}}  {d.type:<{type_w}}  = {show_default(default)}")
        if d.help:
            lines.extend(textwrap.wrap(d.help, width, initial_indent=" " * 6, subsequent_indent=" " * 6))
    return "\n".join(lines)


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one `error: ...` line on stderr (exit 2), not usage + message;
    `unrecognized_hint` is added to an unrecognized-arguments error (e.g. how to pass a prompt like `-x`)."""

    unrecognized_hint = ""
    extra_word_hint = ""  # for a word that is no option (`RUN ROMEO: hi` with the quotes left out)

    def parse_known_args(self, args=None, namespace=None):
        words = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(self.dashed(words), namespace)

    def dashed(self, words: list[str]) -> list[str]:
        """`--max_new_tokens=9` as `--max-new-tokens=9` (the README's promise for every tool), where
        only the dashed flag exists; words after `--` stay as typed."""
        out, known = [], self._option_string_actions
        for n, word in enumerate(words):
            if word == "--":
                return out + words[n:]
            flag, eq, value = word.partition("=")
            if flag.startswith("--") and flag not in known and flag.replace("_", "-") in known:
                word = flag.replace("_", "-") + eq + value
            out.append(word)
        return out

    def error(self, message: str) -> NoReturn:
        dashed = message.startswith("unrecognized arguments: -")  # an unknown option, or a prompt such as -x
        if near := self.near_option(message):  # a misspelt option, not a prompt: `--temprature 0.5`
            message += f" (did you mean {near}?)"
        elif message.startswith("unrecognized arguments") and self.unrecognized_hint:
            message += f"; {self.unrecognized_hint if dashed else self.extra_word_hint}"
        sys.stderr.write(f"error: {message} (see --help)\n")
        sys.exit(2)

    def near_option(self, message: str) -> str | None:
        """The option an unrecognized `--word` (or `--word=value`) was probably meant to be, if one is close."""
        words = message.removeprefix("unrecognized arguments: ").split()
        if not message.startswith("unrecognized arguments: --") or not words:
            return None
        typed = words[0].partition("=")[0].replace("_", "-")
        options = [o for o in self._option_string_actions if o.startswith("--")]
        near = difflib.get_close_matches(typed, options, n=2, cutoff=0.75)  # `--prot`: --root or --port
        return " or ".join(near) or None


def at_least(low: int, high: int | None = None, why: str = "") -> Callable[[str], int]:
    """An argparse type: an integer >= low (and <= high), else one `error:` line before any work is done."""
    rule = f"it must be an integer >= {low}" if high is None else f"it must be an integer from {low} to {high}{why}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; {rule}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is invalid; {rule}")
        return value

    return parse


def check_device_option(parser: argparse.ArgumentParser, device: str) -> None:
    """A --device this machine lacks is a bad command line: one `error:` line and exit 2, in every tool alike
    (attention_map.py and head_importance.py exited 1 where sample.py and lab.py exited 2)."""
    from training.runtime import resolve_device

    try:
        resolve_device(device)
    except ValueError as e:
        parser.error(str(e))
