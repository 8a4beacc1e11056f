"""data/text_file.py's bounded reader, directly: what it refuses (a link to /dev/zero, a FIFO, a file past its
cap, a line past the line cap, nesting past MAX_DEPTH, a YAML alias bomb), each in one line naming the file."""

import json
import os
import time

import pytest

from data import text_file
from data.text_file import (
    MAX_DEPTH,
    MAX_LINE_BYTES,
    MAX_YAML_NODES,
    Refused,
    json_lines,
    json_records,
    loads_json,
    read_bytes,
    read_json,
    read_text_file,
    read_yaml,
    read_yaml_text,
)

# 306 bytes (the size of the probe's) that expand to 9^9 (about 387 million) values once their aliases are followed
BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)


def one_line(e: pytest.ExceptionInfo) -> str:
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_link_to_dev_zero_is_refused_without_reading_it(tmp_path):
    link = tmp_path / "metrics.jsonl"
    link.symlink_to("/dev/zero")
    for read in (lambda: read_bytes(link, "the record"), lambda: list(json_lines(link, "the record"))):
        with pytest.raises(ValueError) as info:
            read()
        assert one_line(info) == f"the record {str(link)!r} is a device, not a regular file; give a regular file"


def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path):
    fifo = tmp_path / "run_info.json"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"is a FIFO, not a regular file; give a regular file$"):
        read_json(fifo)
    assert time.monotonic() - started < 2, "it waited for a writer"


def test_a_file_past_its_cap_is_refused_naming_the_cap_and_its_size(tmp_path):
    big = tmp_path / "config.json"
    with open(big, "wb") as f:
        f.truncate(3 * 2**20)  # sparse: 3 MiB on paper
    with pytest.raises(ValueError) as info:
        read_bytes(big, "config", limit=2**20)
    assert one_line(info) == f"config {str(big)!r} holds more than 1 MiB (3.0 MiB); give a smaller file"


def test_a_prompt_from_a_stream_is_read_to_its_cap_and_no_further(tmp_path):
    with pytest.raises(ValueError, match=r"holds more than 16 MiB; give a shorter prompt$"):
        read_text_file(text_file.Path("/dev/zero"), "--prompt-file", noun="prompt")


def test_jsonl_is_streamed_a_bounded_line_at_a_time(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n' + "x" * (MAX_LINE_BYTES + 5) + "\n")
    lines = json_lines(path)
    assert next(lines) == (1, b'{"step": 1}\n'), "the first line comes before the long one is read"
    with pytest.raises(ValueError) as info:
        next(lines)
    assert one_line(info) == (
        f"{str(path)!r} line 2 is longer than 1 MiB; a run writes records of a few hundred bytes: move it away"
    )
    with pytest.raises(ValueError, match=r"holds more than 0.5 MiB \(1.0 MiB\); give a smaller file$"):
        list(json_lines(path, limit=2**19))


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])
def test_json_nested_past_max_depth_is_refused_without_recursion(tmp_path, depth):
    text = "[" * depth + "]" * depth
    with pytest.raises(ValueError) as info:
        loads_json(text, "header")
    assert one_line(info) == f"header nests deeper than {MAX_DEPTH} levels; no tool of this project writes that"
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n' + text + "\n")
    (_, record), (_, deep) = json_records(path)
    assert record == {"step": 1} and isinstance(deep, Refused) and "line 2 nests deeper" in str(deep)
    assert loads_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "header") is not None, "the cap itself is allowed"


def test_yaml_nested_past_max_depth_is_refused(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ValueError, match=rf"nests deeper than {MAX_DEPTH} levels"):
        read_yaml(path)


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    assert len(BOMB.encode()) < 310
    path = tmp_path / "config.yaml"
    path.write_text(BOMB)
    started = time.monotonic()
    with pytest.raises(ValueError) as info:
        read_yaml_text(path, "the run's config")
    assert one_line(info) == (
        f"the run's config {str(path)!r} expands to more than {MAX_YAML_NODES:,} values through its aliases "
        "(&anchor / *alias); no tool of this project writes that"
    )
    assert time.monotonic() - started < 2
    path.write_text("a: &a [1, 2]\nb: *a\nc: *a\n")
    assert read_yaml(path) == {"a": [1, 2], "b": [1, 2], "c": [1, 2]}, "a few aliases are fine"


def test_a_yaml_value_that_contains_itself_is_refused(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("a: &a [1, *a]\n")
    with pytest.raises(ValueError, match="holds an alias inside its own anchor"):
        read_yaml(path)


def test_an_ordinary_record_reads_back(tmp_path):
    path = tmp_path / "run_info.json"
    path.write_text(json.dumps({"config": {"model": {"n_layer": 2}}}))
    assert read_json(path) == {"config": {"model": {"n_layer": 2}}}
