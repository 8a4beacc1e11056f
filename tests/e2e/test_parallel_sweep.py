"""The parallel launcher end to end (`hydra/launcher=parallel`, what the study recipes use): two tiny jobs train
at once, each in its own process on one torch thread, into the folders and .hydra/ files a sweep run one job
after another leaves; the sweep ends with its report command once; a failed job ends it with its one line;
Ctrl-C, and the launcher's death, stop every job with a save and leave no process behind."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rundir.files import live_run_in
from scripts.ablation_report import write_report
from training.threads import usable_cores

ROOT = Path(__file__).resolve().parents[2]


def sweep_command(tiny_run_overrides: list[str], sweep: Path, *overrides: str) -> list[str]:
    tiny = [o for o in tiny_run_overrides if not o.startswith("out_dir=")]
    launcher = ["hydra/launcher=parallel", "hydra.launcher.jobs=2"]  # two at once even on a one-core machine
    return [
        sys.executable,
        "train.py",
        "-m",
        *tiny,
        "sample_tokens=0",
        *launcher,
        f"hydra.sweep.dir={sweep}",
        *overrides,
    ]


def test_two_jobs_train_at_once_on_one_thread_each_into_a_sweep_the_report_reads(tiny_run_overrides, tmp_path):
    sweep, peak_cache = tmp_path / "sweep", tmp_path / "attnlab_cache"
    # Each job trains 3 s of wall-clock (budget_s), so one run after the other could not overlap.
    long = ["max_steps=100000", "budget_s=3", "eval_interval=100000", "log_interval=100000", "seed=0,1"]
    env = {**os.environ, "ATTNLAB_CACHE": str(peak_cache)}  # a fresh cache: only these jobs write its peak key
    env.pop("OMP_NUM_THREADS", None)  # pytest-xdist's: unset, the launcher gives each job its share of the cores
    env["PYTHONPATH"] = f"{ROOT / 'tests/e2e/no_pickle'}{os.pathsep}{ROOT}"  # a job that unpickles anything fails
    done = subprocess.run(
        sweep_command(tiny_run_overrides, sweep, *long), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = [sweep / "0", sweep / "1"]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]
    for job in jobs:
        assert sorted(p.name for p in (job / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
        assert json.loads((job / "summary.json").read_text())["status"] == "completed"
    # From the job's .hydra/ (written as its process starts) to its summary.json (its end): the two overlap.
    started = [(job / ".hydra" / "config.yaml").stat().st_mtime for job in jobs]
    ended = [(job / "summary.json").stat().st_mtime for job in jobs]
    assert max(started) < min(ended), (started, ended)
    # The matmul peak each job measured for its MFU is keyed by the torch threads it computed with: its share.
    cores = usable_cores()
    share = max(1, cores // 2)  # one each on two cores
    keys = list(json.loads((peak_cache / "peak_flops.json").read_text()))
    assert keys and all(f"|threads={share}|" in key for key in keys), keys

    lines = done.stderr.splitlines()
    headers = [line for line in lines if "tokens/step" in line]  # each job's run header says what it chose
    assert len(headers) == 2 and all(
        f"threads {share} (a share of {cores} cores, 2 jobs at once)" in h for h in headers
    )
    assert [re.sub(r":.*", "", line) for line in lines if line.startswith("job ")] == ["job 1 of 2", "job 2 of 2"]
    assert f"[job 1] run directory {sweep / '0'} (full config: config.yaml)" in lines
    assert f"[job 2] run directory {sweep / '1'} (full config: config.yaml)" in lines
    assert lines[-2:] == [f"sweep done: {sweep}", f"  report: python scripts/ablation_report.py {sweep} --full-val"]
    assert sum("report:" in line for line in lines) == 1

    report = write_report(sweep, tmp_path / "report").read_text()  # it reads each job's .hydra/ and records
    assert "All 2 runs completed." in report
    assert [line for line in report.splitlines() if line.endswith("| 0, 1 |")]  # one cell: the two seeds


def test_a_failed_job_ends_the_sweep_with_its_one_line_and_the_other_job_runs(tiny_run_overrides, tmp_path):
    sweep = tmp_path / "sweep"
    # the second job fails once it reads its data (a bad config value is refused before any job: test_ablation.py)
    command = sweep_command(tiny_run_overrides, sweep, "max_steps=2", "batch_size=2,100000")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    (error,) = [line.removeprefix("[job 2] ") for line in lines if line.startswith("[job 2] the train split has")]
    assert "fewer than one batch needs" in error  # the job's own line, as it happened
    assert lines[-4:-2] == [  # printed as the last job ends; then Hydra's line naming the failed job, its error
        f"sweep done, with failed jobs (the report lists them): {sweep}",
        f"  report: python scripts/ablation_report.py {sweep} --full-val",
    ]
    assert lines[-2].startswith("Error executing job with overrides: [") and lines[-1] == f"error: {error}"
    assert (sweep / "0" / "checkpoints" / "step_0000002.safetensors").is_file()
    assert (sweep / "1" / ".hydra" / "overrides.yaml").is_file()  # how the report finds a job failed at start-up


def start_endless_sweep(tiny_run_overrides: list[str], sweep: Path) -> subprocess.Popen:
    """A sweep of three jobs that would train for ever, once its first two are training (the third waits)."""
    command = sweep_command(tiny_run_overrides, sweep, "max_steps=100000", "eval_interval=5", "seed=0,1,2")
    env = {**os.environ, "TMPDIR": str(sweep.parent)}  # a killed launcher leaves its job files there, not in /tmp
    sweep_process = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not all((sweep / job / "metrics.jsonl").is_file() for job in ("0", "1")):
        assert sweep_process.poll() is None and time.monotonic() < deadline, "the jobs did not start"
        time.sleep(0.2)
    return sweep_process


def job_pids(sweep: Path) -> list[int]:
    """The processes that held the jobs' locks (the lock file keeps `pid N: command`)."""
    return [int(re.match(r"pid (\d+):", (sweep / job / ".lock").read_text())[1]) for job in ("0", "1")]


def alive(pid: int) -> bool:
    """The process exists and has not exited: a zombie (an exited job not yet reaped by whichever process
    adopted it) counts as gone."""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except ProcessLookupError:
        return False
    except OSError:  # no /proc (not Linux), or it exited between the two looks
        return os.path.exists(f"/proc/{pid}") or sys.platform != "linux"


@pytest.mark.slow
def test_ctrl_c_stops_every_running_job_with_a_save_and_starts_no_other(tiny_run_overrides, tmp_path):
    sweep = tmp_path / "sweep"
    sweep_process = start_endless_sweep(tiny_run_overrides, sweep)
    try:
        sweep_process.send_signal(signal.SIGINT)
        _, stderr = sweep_process.communicate(timeout=120)
    finally:
        sweep_process.kill()
    assert sweep_process.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    for n, job in ((1, "0"), (2, "1")):
        assert re.search(
            rf"^\[job {n}\] stopped by SIGINT after step \d+; saved .*{job}/checkpoints/step_", stderr, re.M
        )
        assert list((sweep / job / "checkpoints").glob("step_*.safetensors"))
        assert live_run_in(sweep / job) is None
    assert not (sweep / "2").exists()  # the third job never started
    assert not any(alive(pid) for pid in job_pids(sweep))


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="a job learns of its launcher's death by Linux's PR_SET_PDEATHSIG")
def test_when_the_launcher_is_killed_its_jobs_save_and_stop(tiny_run_overrides, tmp_path):
    sweep = tmp_path / "sweep"
    sweep_process = start_endless_sweep(tiny_run_overrides, sweep)
    sweep_process.kill()  # SIGKILL: no handler of the launcher's runs
    sweep_process.communicate()
    pids = job_pids(sweep)
    deadline = time.monotonic() + 120
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, "a job trains on without its launcher"
        time.sleep(0.2)
    for job in ("0", "1"):
        assert live_run_in(sweep / job) is None
        assert list((sweep / job / "checkpoints").glob("step_*.safetensors"))  # SIGTERM: saved, then stopped


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="a run learns of its parent's death by Linux's PR_SET_PDEATHSIG")
def test_when_bench_quality_is_terminated_its_runs_save_and_stop(tiny_run_overrides, tmp_path):
    # Defect: a SIGTERM to bench_quality alone (a batch system's, `kill PID`) left its runs training to the end of
    # their budgets, children of PID 1, with no one to score them.
    overrides = [o for o in tiny_run_overrides if not o.startswith("out_dir=")]
    keep = tmp_path / "runs"
    args = ["--budget", "600", "--recipes", "default", "--reference", "default", "--seeds", "1", "--keep", str(keep)]
    bench = subprocess.Popen(
        [sys.executable, "bench/bench_quality.py", *args, "--", *overrides, "eval_interval=5"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run = keep / "default_1"
    try:
        deadline = time.monotonic() + 300
        while not (run / "metrics.jsonl").is_file():
            assert bench.poll() is None and time.monotonic() < deadline, "the run did not start"
            time.sleep(0.2)
        (pid,) = [int(re.match(r"pid (\d+):", (run / ".lock").read_text())[1])]
        bench.terminate()  # SIGTERM to bench_quality alone, not its process group
        bench.wait(timeout=60)
        deadline = time.monotonic() + 120
        while alive(pid):
            assert time.monotonic() < deadline, "the run trains on without bench_quality"
            time.sleep(0.2)
    finally:
        bench.kill()
    assert live_run_in(run) is None
