"""The parallel launcher's parts (cli/sweep_jobs.py) without training: how many jobs at once, the stop signals
passed on, a job's output relayed, a finished job's return, and the `job i of N` pace with jobs side by side.
The launcher end to end is tests/e2e/test_parallel_sweep.py."""

import io
import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from cli.sweep_jobs import Job, JobFailed, check_launcher_values, job_return, jobs_at_a_time, pass_on, relay_lines


@pytest.mark.parametrize("cores,expected", [({0}, 1), ({0, 1}, 2), ({0, 1, 2, 3, 4, 5, 6, 7}, 2)])
def test_by_default_two_jobs_run_at_once_or_one_on_a_single_core(monkeypatch, cores, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cores, raising=False)
    assert jobs_at_a_time(None) == expected
    assert jobs_at_a_time(3) == 3  # as asked, whatever the cores


@pytest.mark.parametrize("jobs,threads,bad", [(0, 1, "jobs=0"), (2, 0, "threads=0"), (-1, 1, "jobs=-1")])
def test_a_bad_launcher_value_is_refused_in_one_line(jobs, threads, bad):
    with pytest.raises(HydraException, match=rf"^hydra.launcher.{bad} is invalid; it must be >= 1$"):
        check_launcher_values(jobs, threads)
    check_launcher_values(None, 1)  # the defaults pass


class FakeJob:
    """What pass_on reads of a Job; the signals it would send are recorded."""

    def __init__(self, name: str) -> None:
        self.name, self.signals_sent, self.sent = name, 0, []

    def send(self, signum: int) -> None:
        self.sent.append(signum)


def test_each_stop_signal_reaches_every_running_job_once_and_a_third_kills(capsys):
    jobs = [FakeJob("job 1"), FakeJob("job 2")]
    signals: list[int] = []
    pass_on(signals, jobs)
    assert [j.sent for j in jobs] == [[], []]
    signals.append(signal.SIGINT)
    pass_on(signals, jobs)
    pass_on(signals, jobs)  # the loop comes round again: nothing is sent twice
    assert [j.sent for j in jobs] == [[signal.SIGINT], [signal.SIGINT]]
    assert capsys.readouterr().err.splitlines() == [
        "job 1: stopping; it saves first (Ctrl-C again stops it at once)",
        "job 2: stopping; it saves first (Ctrl-C again stops it at once)",
    ]
    late = FakeJob("job 3")  # a job that has had none of the signals gets each in turn
    signals += [signal.SIGTERM, signal.SIGINT]
    pass_on(signals, [*jobs, late])
    assert jobs[0].sent == [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]
    assert late.sent == [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]


def test_a_jobs_lines_come_under_its_number_as_a_terminal_would_leave_them(capsys):
    output = b"header\n\r  5%|#   |\r 50%|##  |\r          \rstep 10: val loss 3.0\r\n\xff\n"
    relay_lines(io.BytesIO(output), "[job 3] ")
    assert capsys.readouterr().err.splitlines() == ["[job 3] header", "[job 3] step 10: val loss 3.0", "[job 3] \ufffd"]


def finished_job(tmp_path, code: str, outcome: dict | None) -> Job:
    """A Job whose process ran `code` and exited, with `outcome` as its result file (None: it wrote none)."""
    config = OmegaConf.create(
        {
            "seed": 3,
            "hydra": {
                "job": {"num": 0, "name": "train", "override_dirname": "seed=3"},
                "overrides": {"task": ["seed=3"]},
            },
        }
    )
    process = subprocess.Popen([sys.executable, "-c", code])
    process.wait()
    relay = threading.Thread(target=lambda: None)
    relay.start()
    result = tmp_path / "job_0.json"
    if outcome is not None:
        result.write_text(json.dumps(outcome))
    return Job(config, process, relay, result)


def test_a_finished_jobs_return_is_its_value_or_its_one_line_error(tmp_path):
    done = job_return(finished_job(tmp_path, "pass", {"error": None, "value": 2.5}))
    assert (done.status, done.return_value, done.overrides, done.cfg.seed) == (JobStatus.COMPLETED, 2.5, ["seed=3"], 3)
    assert "hydra" not in done.cfg and done.hydra_cfg.hydra.job.num == 0
    failed = job_return(
        finished_job(tmp_path, "raise SystemExit(1)", {"error": "model.n_head=3 is bad", "value": None})
    )
    assert failed.status == JobStatus.FAILED
    with pytest.raises(JobFailed, match=r"^model.n_head=3 is bad$") as refused:
        _ = failed.return_value  # what Hydra's sweeper reads, and raises, once every job has run
    assert not refused.value.stopped


def test_a_job_that_dies_without_a_word_fails_with_how_it_ended(tmp_path):
    killed = job_return(finished_job(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", None))
    with pytest.raises(JobFailed, match=r"^job 1 \(seed=3\) was killed by SIGKILL before it finished$") as died:
        _ = killed.return_value
    assert died.value.stopped  # resume=auto continues it: train.py prints the sweep's continue command
    crashed = job_return(finished_job(tmp_path, "raise SystemExit(3)", None))
    with pytest.raises(JobFailed, match=r"^job 1 \(seed=3\) exited with code 3 before it finished$"):
        _ = crashed.return_value


def job_config(num: int) -> DictConfig:
    return OmegaConf.create({"hydra": {"job": {"num": num}, "overrides": {"task": [f"seed={num + 1}"]}}})


def test_with_two_jobs_at_once_the_pace_counts_the_running_one_half_done(capsys, monkeypatch):
    from cli import sweep_hint
    from cli.sweep_hint import SweepHint

    hint = SweepHint()
    start = {"sweep": {"dir": "multirun/x"}, "sweeper": {"params": {"seed": "1,2,3,4,5,6"}}, "overrides": {"task": []}}
    clock = iter([100.0, 160.0])  # the sweep starts; job 3 starts a minute later, when one of the first two ends
    monkeypatch.setattr(sweep_hint.time, "perf_counter", lambda: next(clock))
    hint.on_multirun_start(OmegaConf.create({"hydra": start}))
    hint.on_job_start(job_config(0))
    hint.on_job_start(job_config(1))
    hint.on_job_end(job_config(0), JobReturn(status=JobStatus.COMPLETED))
    hint.on_job_start(job_config(2))
    # 1.5 jobs done in 60 s (one finished, one half): 40 s a job, 4.5 jobs to go
    assert capsys.readouterr().err.splitlines() == [
        "job 1 of 6: seed=1",
        "job 2 of 6: seed=2",
        "job 3 of 6: seed=3, about 3 min left",
    ]


def test_jobs_that_start_together_share_one_estimate(capsys, monkeypatch):
    # Defect: with two jobs at a time, the two that started as the first two ended printed "about 8 min left" and
    # "about 4 min left" at the same moment: each counted the other as done.
    from cli import sweep_hint
    from cli.sweep_hint import SweepHint

    hint = SweepHint()
    start = {"sweep": {"dir": "multirun/x"}, "sweeper": {"params": {"seed": "1,2,3,4,5,6"}}, "overrides": {"task": []}}
    clock = iter([100.0, 160.0, 220.0])
    monkeypatch.setattr(sweep_hint.time, "perf_counter", lambda: next(clock))
    hint.on_multirun_start(OmegaConf.create({"hydra": start}))
    for num in (0, 1):
        hint.on_job_start(job_config(num))
    for num in (0, 1):  # both end within one poll of the launcher: the next two start together
        hint.on_job_end(job_config(num), JobReturn(status=JobStatus.COMPLETED))
    for num in (2, 3):
        hint.on_job_start(job_config(num))
    hint.on_job_end(job_config(2), JobReturn(status=JobStatus.COMPLETED))
    hint.on_job_start(job_config(4))
    # 2 jobs in 60 s: 4 to go at 30 s each; then 3 done and 1 half done in 120 s: 2.5 to go at 34 s each, 86 s
    assert capsys.readouterr().err.splitlines() == [
        "job 1 of 6: seed=1",
        "job 2 of 6: seed=2",
        "job 3 of 6: seed=3, about 2 min left",
        "job 4 of 6: seed=4",
        "job 5 of 6: seed=5, about 1 min left",
    ]


def test_the_report_command_names_the_recipes_paper_and_reference_cell_and_scores_on_full_val(monkeypatch):
    # Defect: the closing line suggested the loop-val report, whose seed spread is 4.5 times the full val's
    from cli import sweep_hint as hints

    monkeypatch.setattr(hints, "python_command", lambda: "python")
    assert hints.sweep_hint("multirun/s", "bhojanapalli", "model.n_head=8,model.d_k=null").splitlines() == [
        "sweep done: multirun/s",
        "  report: python scripts/ablation_report.py multirun/s --paper bhojanapalli"
        " --reference model.n_head=8,model.d_k=null --full-val",
    ]
    assert hints.SweepHint().full_val  # a recipe that names no full_val gets the full-val report too
    assert hints.sweep_hint("multirun/s", full_val=False).endswith("ablation_report.py multirun/s")


def test_jobs_that_all_finish_within_one_poll_do_not_end_the_sweep_early(monkeypatch):
    # Defect: a 15-job sweep ended after 6, saying "sweep done", when its two running jobs finished within
    # one poll: with none running, the loop stopped before starting the next.
    from cli import sweep_jobs

    class Finished:
        pid, returncode = 0, 0

        def poll(self) -> int:
            return 0  # every job has ended by the launcher's next look

    started, ended = [], []

    def start_job(config, folder, threads):
        started.append(config.n)
        return Job(config, Finished(), threading.Thread(), folder / "none.json")

    class Callbacks:
        def on_job_start(self, config, task_function):
            pass

        def on_job_end(self, config, job_return):
            ended.append(job_return)

    monkeypatch.setattr(sweep_jobs, "start_job", start_job)
    monkeypatch.setattr(sweep_jobs, "job_return", lambda job: job.config.n)
    monkeypatch.setattr(sweep_jobs, "POLL_S", 0.0)
    monkeypatch.setattr(sweep_jobs, "sorted", lambda returns, key: returns, raising=False)
    configs = iter(OmegaConf.create({"n": n}) for n in range(7))
    returns = sweep_jobs.run_jobs(configs, 2, 1, Callbacks(), lambda: None)
    assert started == list(range(7)) and ended == returns == list(range(7))


def test_a_jobs_second_ctrl_c_ends_it_in_one_line_as_a_single_run_does(tmp_path, monkeypatch, capsys):
    # Defect: a sweep job's process ran Hydra's run_job outside train.py's own handling, so a second Ctrl-C
    # (KeyboardInterrupt, which run_job does not catch) ended it with a traceback relayed to the terminal
    from cli import sweep_job

    script = tmp_path / "train.py"
    script.write_text("def start_process():\n    pass\n\n\ndef main(cfg):\n    raise KeyboardInterrupt\n")
    monkeypatch.setattr(sweep_job, "run_job_file", lambda job_file, task: task(None))
    monkeypatch.setattr(sys, "argv", ["cli/sweep_job.py", str(script), "seed=1"])
    monkeypatch.setenv(sweep_job.JOB_FILE, str(tmp_path / "job.yaml"))
    with pytest.raises(SystemExit) as ended:
        sweep_job.main()
    assert ended.value.code == 130 and capsys.readouterr().err == "interrupted\n"
    assert sys.argv == [str(script), "seed=1"]  # the job's command line is the sweep's own
