"""bench/bench_train.py --beside K: the competitors it starts run while it measures and are stopped however it ends,
its two workers (attnlab's thread policy and torch's defaults) are measured in alternating pairs, and the report
says the CPU, the measured peak, the alone ratio with its interval and each policy's fraction of the fair share.
Functional only: the figures of a tiny model on a shared machine mean nothing, so none is bounded."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import beside
from training.threads import usable_cores

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_competitors_burn_a_core_each_and_are_stopped_when_the_block_fails():
    with pytest.raises(RuntimeError, match=r"^mid-measurement$"), beside.competitors(2) as procs:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
        cpu = [float(Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[11]) for p in procs]
        time.sleep(0.3)
        later = [float(Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[11]) for p in procs]
        assert all(b > a for a, b in zip(cpu, later, strict=True))  # CPU-bound: user time grows
        raise RuntimeError("mid-measurement")
    assert all(p.returncode is not None for p in procs)


def test_pairs_alternate_which_policy_goes_first():
    order: list[str] = []
    speeds = beside.pairs(lambda policy: order.append(policy) or len(order), 3)
    assert order == ["attnlab", "torch", "torch", "attnlab", "attnlab", "torch"]
    assert speeds == {"attnlab": [1, 4, 5], "torch": [2, 3, 6]}


def test_the_median_interval_is_the_widest_order_statistics_that_keep_their_coverage():
    assert beside.median_interval([5.0, 1.0, 3.0, 2.0, 4.0]) == (1.0, 5.0, 1 - 2 / 32)  # n = 5: min-max, 94%
    low, high, coverage = beside.median_interval([float(x) for x in range(10)])
    assert (low, high) == (1.0, 8.0) and coverage == pytest.approx(1 - 2 * 11 / 1024)  # 98%; one rank in: 89%


def test_the_fair_share_counts_each_competitor_as_one_more_thread():
    assert beside.fair_share(3000.0, 2, 1) == 2000.0
    assert beside.fair_share(3000.0, 2, 4) == 1000.0


def quick_env(tmp_path: Path) -> dict[str, str]:
    """One thread each (the user's setting, which both workers keep): the figures mean nothing here, and torch's
    default spin on a busy 2-core test machine made the pairs take minutes."""
    return {**os.environ, "ATTNLAB_CACHE": str(tmp_path / "attnlab_cache"), "OMP_NUM_THREADS": "1"}


def beside_command(tiny_run_overrides: list[str], *args: str) -> list[str]:
    overrides = [o for o in tiny_run_overrides if not o.startswith("out_dir=")]
    flags = ["--steps", "2", "--warmup", "1", "--dtypes", "fp32"]
    return [sys.executable, "bench/bench_train.py", "--beside", *args, *flags, "--", *overrides]


def test_beside_one_competitor_reports_the_share_and_the_cost_alone(tiny_run_overrides, tmp_path):
    env = quick_env(tmp_path)
    done = subprocess.run(
        beside_command(tiny_run_overrides, "1"), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(
        line.startswith(f"CPU: {beside.cpu_model()} (") and "measured matmul peak: fp32 " in line for line in lines
    )
    assert any(line.startswith("attnlab's thread policy: threads OMP_NUM_THREADS=1 (yours), ") for line in lines)
    assert "alone: 5 interleaved pairs, attnlab's thread policy against torch's defaults" in lines
    (ratio,) = [line for line in lines if "attnlab / torch, pair by pair: median " in line]
    assert "94% interval " in ratio
    cores = usable_cores()
    assert f"beside 1 CPU-bound competitor ({cores} cores: fair share = alone x {cores}/{cores + 1})" in lines
    shares = [line.split()[0] for line in lines if "of its fair share median " in line]
    assert shares == ["attnlab", "torch"]


def test_ctrl_c_stops_the_benchmark_its_workers_and_its_competitors(tiny_run_overrides, tmp_path):
    env = quick_env(tmp_path) | {"PYTHONUNBUFFERED": "1"}
    command = [*beside_command(tiny_run_overrides, "2"), "model.n_layer=4"]  # slower steps: it is caught measuring
    bench = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children: set[int] = set()
    try:
        assert bench.stdout is not None
        for line in bench.stdout:
            if line.startswith("beside 2 CPU-bound competitors"):
                break
        time.sleep(1.0)  # the competitors started, a measurement under way
        children = {int(p) for p in Path(f"/proc/{bench.pid}/task/{bench.pid}/children").read_text().split()}
        assert len(children) == 4, children  # two workers, two competitors
        bench.send_signal(signal.SIGINT)
        _, stderr = bench.communicate(timeout=60)
    finally:
        bench.kill()
        bench.wait()
    assert bench.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert not [pid for pid in children if alive(pid)]  # reaped before it exited: none left orphaned
