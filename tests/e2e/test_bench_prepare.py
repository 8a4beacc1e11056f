"""bench/bench_prepare.py builds a corpus of real text, prepares it and reports what it claims (no speed asserted)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def bench_prepare(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "bench/bench_prepare.py", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_bench_prepare_times_each_phase_and_reports_memory_the_cache_and_ctrl_c(tmp_path):
    done = bench_prepare("--size", "200KB", "--dir", str(tmp_path), "--vocab", "300", "--interrupt", "learn:0")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"corpus 0\.2 MB in 16 files \([\d.]+ MB of distinct text from this machine\)", out)
    files = sorted((tmp_path / "corpus-200000").glob("*.txt"))
    assert len(files) == 16 and sum(f.stat().st_size for f in files) == 200_000  # the size asked, exactly
    assert all(f.read_text(encoding="utf-8") for f in files)  # real text, UTF-8
    phases = dict(re.findall(r"^ *(utf8|split|learn|tokenize|rest|total): +([\d.]+) s", out, re.M))
    assert list(phases) == ["utf8", "split", "learn", "tokenize", "rest", "total"]
    assert re.search(r"tokenize: +[\d.]+ s \([\d.]+ cores busy\)", out)
    rss = re.search(r"peak RSS: preparing process ([\d,.]+) MB, BPE learner ([\d,.]+) MB", out)
    assert rss and all(float(x.replace(",", "")) > 10 for x in rss.groups())  # a Python with numpy: > 10 MB each
    cache = re.search(r"cache ([\d.]+) MB / token files ([\d.]+) MB = ([\d.]+)x", out)
    assert cache and float(cache[2]) > 0
    assert re.search(r"UTF-8 check again, files unchanged: [\d.]+ s", out)
    line = re.search(
        r"SIGINT 0 s into learn: preparation stopped after ([\d.]+) s, every process gone after "
        r"([\d.]+) s, exit status 130, left in the cache: nothing",
        out,
    )
    assert line, out
    assert "learning BPE" in done.stderr and "tokenizing" in done.stderr  # the bars, in bytes
    assert re.search(
        r"learning the BPE from all [\d,]+ bytes of train text \(the sample's bound: 67,108,864", done.stderr
    )
    again = bench_prepare("--size", "200KB", "--dir", str(tmp_path), "--vocab", "300", "--no-progress")
    assert again.returncode == 0 and "ready in 0.0 s" in again.stdout  # the corpus is built once
    assert "learning BPE" not in again.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--size", "12XB"], "error: argument --size: '12XB' is invalid; give a size of at least 1KB, e.g. 200KB,"),
        (["--size", "10"], "error: argument --size: '10' is invalid; give a size of at least 1KB"),
        (["--vocab", "100"], "error: argument --vocab: 100 is invalid; it must be an integer >= 257"),
        (["--interrupt", "lunch:2"], "error: argument --interrupt: 'lunch:2' is invalid; give PHASE:SECONDS with"),
        (["--interrupt", "learn:-1"], "error: argument --interrupt: 'learn:-1' is invalid; give PHASE:SECONDS"),
    ],
)
def test_bench_prepare_refuses_a_bad_value_in_one_line_before_building_anything(tmp_path, args, message):
    done = bench_prepare("--dir", str(tmp_path / "work"), *args)
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith(message) and not (tmp_path / "work").exists()
