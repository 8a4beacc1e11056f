"""A sweep's jobs several at a time, each in a process of its own with its share of the cores as torch threads,
one each on two cores (the `parallel` launcher, hydra_plugins/attnlab_launcher.py, calls `run_jobs`). On a
2-core CPU two one-thread jobs finish a study sooner than one two-thread job after another: a small model's
step gains well under 2x from a second thread, and one job's start-up, evaluations and saves leave the cores
idle that the other job then uses.

The launcher composes each job's config as Hydra's basic launcher does and writes it as YAML into a private
folder (never a pickle: a job reads it with OmegaConf, and train.py types it against the schema again);
the job's process (cli/sweep_job.py) runs the sweep's own train.py on that file with the sweep's command line
as its own, so its lock and continue lines read as a single run's: Hydra's `run_job` (the job's folder, its
.hydra/ files, the task), the outcome written beside the file.

Each job is in a process group of its own, so a terminal's Ctrl-C reaches it once, forwarded by the launcher
(`run_jobs`): the job saves and stops as a single run does, a second Ctrl-C stops it at once, a third kills
it, and no new job starts. On Linux a job also gets SIGTERM when the launcher dies (kill -9 included), so
no job trains on unseen. A job's output comes to this terminal line by line under `[job i]`.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict

from cli.errors import LAUNCHER_PID
from cli.sweep_job import JOB_FILE
from data.text_file import read_json_object
from training.threads import sharing

ROOT = Path(__file__).resolve().parents[1]
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
POLL_S = 0.1  # how often the launcher looks for finished jobs and stop signals to pass on
KILL_AFTER_S = 30.0  # a job that has not stopped this long after SIGTERM (the launcher failing) is killed


class JobFailed(ValueError):
    """A sweep job failed; the message is the job's own one-line error, which train.py prints as it prints a bad
    value's (a ValueError). `stopped`: its process ended before the job could say why (a kill, the OOM killer),
    so resume=auto continues it from its newest checkpoint."""

    def __init__(self, message: str, stopped: bool = False) -> None:
        super().__init__(message)
        self.stopped = stopped


def jobs_at_a_time(jobs: int | None) -> int:
    """How many jobs run at once: `jobs`, or by default two, where the machine lets this process use two cores."""
    if jobs is not None:
        return jobs
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(2, cores)


def check_launcher_values(jobs: int | None, threads: int | None) -> None:
    """A HydraException, as for any config Hydra cannot use: it is said in one line before any job starts."""
    for name, value in (("jobs", jobs), ("threads", threads)):
        if value is not None and value < 1:
            raise HydraException(f"hydra.launcher.{name}={value} is invalid; it must be >= 1")


@dataclass
class Job:
    """One running job: its config, its process (a process group of its own) and the signals passed to it."""

    config: DictConfig
    process: subprocess.Popen
    relay: threading.Thread
    result: Path
    signals_sent: int = 0

    @property
    def name(self) -> str:
        return f"job {self.config.hydra.job.num + 1}"

    def send(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)


def run_jobs(
    configs: Iterator[DictConfig], at_a_time: int, threads: int | None, callbacks: Any, task_function: Callable
) -> list[JobReturn]:
    """Run every job, `at_a_time` at once with `threads` torch threads each (None: a share of the cores, or the
    user's OMP_NUM_THREADS; training/threads.py's `sharing`); their returns in job order. A stop
    signal is passed on to the running jobs, no job starts after it, and the sweep exits 128 + signal. The
    sweep's callbacks run here, as Hydra's launchers call them (`task_function` is only theirs to see)."""
    folder = Path(tempfile.mkdtemp(prefix="attnlab-sweep-"))  # mode 0700: only this user reads the job files
    environ = sharing(dict(os.environ), threads, at_a_time)
    running: list[Job] = []
    returns: list[JobReturn] = []
    exhausted = False  # every job has been started
    try:
        with StopsReceived() as stops:
            while True:
                while not exhausted and len(running) < at_a_time and not stops.signals:
                    if (config := next(configs, None)) is None:
                        exhausted = True
                        break
                    callbacks.on_job_start(config=config, task_function=task_function)  # `job i of N`
                    running.append(start_job(config, folder, environ))
                pass_on(stops.signals, running)
                for job in [job for job in running if job.process.poll() is not None]:
                    running.remove(job)
                    returns.append(job_return(job))
                    callbacks.on_job_end(config=job.config, job_return=returns[-1])
                # Defect: `if not running` alone ended a sweep whose running jobs all finished within one
                # poll, with jobs still to start (a 15-job sweep stopped after 6 and said "sweep done").
                if not running and (exhausted or stops.signals):
                    break
                time.sleep(POLL_S)
        if stops.signals:
            raise SystemExit(128 + stops.signals[0])  # each stopped job said how to continue it and the sweep
        return sorted(returns, key=lambda r: r.hydra_cfg.hydra.job.num)
    finally:
        stop_now(running)  # only where something above raised: no job outlives its sweep
        shutil.rmtree(folder, ignore_errors=True)


class StopsReceived:
    """While the jobs run, SIGINT and SIGTERM are recorded (`signals`) instead of stopping the launcher, which
    passes them on from its loop: a handler that signalled processes itself could race the loop starting one."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self.previous: dict[int, Any] = {}

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)

    def __enter__(self) -> "StopsReceived":
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self.previous[signum] = signal.signal(signum, self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def pass_on(signals: list[int], running: list[Job]) -> None:
    """Each stop signal to every running job once: the first saves and stops it, the second stops it at once
    (as for a single run); from the third on, SIGKILL."""
    for job in running:
        if job.signals_sent == 0 < len(signals):
            print(f"{job.name}: stopping; it saves first (Ctrl-C again stops it at once)", file=sys.stderr)
        while job.signals_sent < len(signals):
            job.send(signals[job.signals_sent] if job.signals_sent < 2 else signal.SIGKILL)
            job.signals_sent += 1


def start_job(config: DictConfig, folder: Path, environ: dict[str, str]) -> Job:
    """The job's process: the sweep's own command line (what its run lock and continue commands show), told
    by ATTNLAB_SWEEP_JOB to run this one composed config, in `environ` (run_jobs': its share of the threads)."""
    job_file = folder / f"job_{config.hydra.job.num}.yaml"
    with open_dict(config):  # the sweep's folder as this process resolved ${now:}, not the job's own clock
        config.hydra.sweep.dir = str(config.hydra.sweep.dir)
    OmegaConf.save(config, job_file)
    env = {**environ, JOB_FILE: str(job_file), LAUNCHER_PID: str(os.getpid())}
    # -P: the job's modules come from this checkout (PYTHONPATH), never from a cli/ in the folder it runs in
    env["PYTHONUNBUFFERED"], env["PYTHONPATH"] = "1", os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    process = subprocess.Popen(
        [sys.executable, "-P", "-m", "cli.sweep_job", *sys.argv],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        process_group=0,  # the terminal's Ctrl-C goes to the launcher alone, which passes it on once
    )
    prefix = f"[job {config.hydra.job.num + 1}] "
    relay = threading.Thread(target=relay_lines, args=(process.stdout, prefix), daemon=True)
    relay.start()
    return Job(config, process, relay, job_file.with_suffix(".json"))


def relay_lines(stream: IO[bytes], prefix: str) -> None:
    """A job's output onto this terminal, each line under `prefix`; of a line a progress bar redrew (carriage
    returns), what a terminal would have left: the text after the last one."""
    for raw in stream:
        text = raw.decode(errors="replace").rstrip("\r\n").rsplit("\r", 1)[-1]
        sys.stderr.write(f"{prefix}{text}\n")


def job_return(job: Job) -> JobReturn:
    """What Hydra's sweeper expects of a finished job; a failed one returns JobFailed with its one-line error."""
    job.relay.join(timeout=5)  # the rest of its output first (a process it started may hold the pipe open)
    config = job.config
    ret = JobReturn(overrides=list(config.hydra.overrides.task), working_dir=os.getcwd())
    ret.cfg, ret.hydra_cfg = without_hydra(config), OmegaConf.masked_copy(config, "hydra")
    ret.task_name = config.hydra.job.name
    stopped = False
    try:
        outcome = read_json_object(job.result)
    except (OSError, ValueError):
        code, stopped = job.process.returncode, True
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        own = " ".join(config.hydra.overrides.task)  # as typed: override_dirname joins them with commas
        outcome = {"error": f"{job.name} ({own}) {how} before it finished"}
    ret.status = JobStatus.FAILED if outcome["error"] else JobStatus.COMPLETED
    ret.return_value = JobFailed(outcome["error"], stopped) if outcome["error"] else outcome.get("value")
    return ret


def without_hydra(config: DictConfig) -> DictConfig:
    task = OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])
    assert isinstance(task, DictConfig)
    return task


def stop_now(running: list[Job]) -> None:
    """SIGTERM to every job still running (each saves and stops), SIGKILL to one that outlasts KILL_AFTER_S."""
    for job in running:
        job.send(signal.SIGTERM)
    deadline = time.monotonic() + KILL_AFTER_S
    for job in running:
        try:
            job.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            job.send(signal.SIGKILL)
            job.process.wait()
