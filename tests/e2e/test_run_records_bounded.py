"""A run's own records read bounded end to end: RUN/metrics.jsonl linked to /dev/zero (it grew train.py to 22 GB
and the OOM killer ended it) stops `resume=auto` in one line, quickly, in bounded memory, changing nothing."""

import resource
import sys
import time
from pathlib import Path

from tests.helpers import run_cli, run_train


def test_metrics_jsonl_linked_to_dev_zero_stops_resume_in_one_line_with_bounded_memory(tiny_run_overrides):
    out = Path(next(o.split("=", 1)[1] for o in tiny_run_overrides if o.startswith("out_dir=")))
    run_train([*tiny_run_overrides, "max_steps=10"])
    records = {
        p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name not in ("metrics.jsonl", ".lock")
    }
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").symlink_to("/dev/zero")
    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = run_cli(["train.py", *tiny_run_overrides, "resume=auto", "max_steps=20"], timeout=120)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:") or "Traceback" in line]
    assert errors == [
        f"error: the run's record '{out / 'metrics.jsonl'}' is a device, not a regular file; give a regular file"
    ], proc.stderr
    assert time.monotonic() - started < 90
    assert max(peak_kib, before) < 2 * 2**20 or sys.platform == "darwin", f"peak {peak_kib / 2**20:.1f} GiB"
    assert (out / "metrics.jsonl").is_symlink()
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name in records} == records
