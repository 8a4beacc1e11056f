"""Exact resume: a run stopped by SIGTERM or killed by SIGKILL at random steps, then resumed, logs
the same per-step losses as an uninterrupted run; resume=<path> and the wandb run id."""

import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rundir.run
import training.trainer
from rundir.checkpoint import load_checkpoint
from rundir.checkpoints import CheckpointDir
from tests.helpers import run_cli, run_train
from training.runtime import RunInterrupted, StopSignals

ROOT = Path(__file__).resolve().parents[2]
# Dropout makes the losses depend on the torch RNG stream too, not just weights and batches; the weight
# average from step 6 on (what evaluation reads) is under way at every stop.
EXACT = ["max_steps=20", "eval_interval=4", "log_interval=1", "model.dropout=0.1", "sample_tokens=0"]
EXACT += ["optim.average_from=0.3"]


@pytest.fixture
def run_overrides(shared_corpus_overrides, tmp_path) -> list[str]:
    return [*shared_corpus_overrides, *EXACT, f"out_dir={tmp_path / 'run'}"]


def logged(out_dir: Path, key: str = "train/loss") -> dict[int, float]:
    """{step: value} from metrics.jsonl; complete lines only (the file may be mid-write)."""
    path = Path(out_dir) / "metrics.jsonl"
    out = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if key in record:
                out[record["step"]] = record[key]
    return out


@pytest.fixture(scope="module")
def reference(shared_corpus_overrides, tmp_path_factory) -> Path:
    """An uninterrupted run of the same config, in its own directory."""
    out_dir = tmp_path_factory.mktemp("reference")
    run_train([*shared_corpus_overrides, *EXACT, f"out_dir={out_dir}"])
    return out_dir


def test_signal_flag_then_second_ctrl_c_interrupts():
    before = signal.getsignal(signal.SIGINT)
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):  # a stop is already pending: the user insists
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs at the next bytecode boundary
                time.sleep(0.001)
    assert signal.getsignal(signal.SIGINT) is before


def test_ctrl_c_saves_the_current_step_and_resume_matches(run_overrides, tmp_path, reference, monkeypatch):
    """In-process SIGINT (the CLI test below covers SIGTERM and SIGKILL)."""
    real_lr_at = training.trainer.lr_at
    signum = signal.SIGINT

    def lr_at_signalling(step, *args):  # the signal lands mid-run, between two checkpoints
        if step == 9:
            os.kill(os.getpid(), signum)
        return real_lr_at(step, *args)

    monkeypatch.setattr(training.trainer, "lr_at", lr_at_signalling)
    with pytest.raises(RunInterrupted, match=rf"stopped by {signum.name} after step 10; saved .*step_0000010"):
        run_train(run_overrides)
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "step_0000010.safetensors").meta["step"] == 10
    monkeypatch.setattr(training.trainer, "lr_at", real_lr_at)
    run_train([*run_overrides, "resume=auto"])
    assert logged(tmp_path / "run") == logged(reference)  # exact, every step
    assert logged(tmp_path / "run", "val/loss") == logged(reference, "val/loss")
    # the whole run's clock, not the second process's alone (it counted from 0 again)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["elapsed_s"] >= max(logged(tmp_path / "run", "time/elapsed_s").values())  # and the last eval


def test_a_ctrl_c_during_the_end_of_run_plot_is_a_stop_after_the_complete_run(run_overrides, tmp_path, monkeypatch):
    # Defect: the signal handlers were gone by then, so it read as a second Ctrl-C: "interrupted before a save",
    # beside a summary.json saying completed, and a sweep's "continue the whole sweep" line was never printed.
    import training.setup

    def plot_interrupted(out_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(training.setup, "plot_run", plot_interrupted)
    with pytest.raises(
        RunInterrupted,
        match=r"^stopped by SIGINT after the run's last step \(20, saved .*step_0000020"
        r".*\); the run is complete, its end-of-run plot and sample were skipped$",
    ) as stopped:
        run_train(run_overrides)
    assert stopped.value.finished and stopped.value.exit_code == 130
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "completed"


def test_a_signal_during_the_last_step_finishes_the_run(run_overrides, tmp_path, monkeypatch):
    # Defect: a stop requested during the last step raised "stopped by SIGINT" with a continue command,
    # though the run had reached its end; summary.json was never written, so the run read as unfinished
    # for good (its resume=auto found nothing left to train and wrote none either).
    real_lr_at = training.trainer.lr_at

    def lr_at_signalling(step, *args):
        if step == 19:  # the 20th and last step
            os.kill(os.getpid(), signal.SIGINT)
        return real_lr_at(step, *args)

    monkeypatch.setattr(training.trainer, "lr_at", lr_at_signalling)
    metrics = run_train(run_overrides)
    assert "val/loss" in metrics
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["step"] == 20


def test_ctrl_c_while_the_run_directory_is_written_stops_at_a_saved_step(run_overrides, tmp_path, monkeypatch):
    # Defect: Ctrl-C after config.yaml and metrics.jsonl were written but before the loop (wandb's start
    # takes seconds) was a bare KeyboardInterrupt: "interrupted", no checkpoint and no continue command,
    # and the same command again was refused for the files it had left.
    real_write_run_info = rundir.run.write_run_info

    def write_run_info_interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return real_write_run_info(*args, **kwargs)

    monkeypatch.setattr(rundir.run, "write_run_info", write_run_info_interrupted)
    with pytest.raises(RunInterrupted, match=r"stopped by SIGINT after step 1; saved .*step_0000001"):
        run_train(run_overrides)
    monkeypatch.setattr(rundir.run, "write_run_info", real_write_run_info)
    run_train([*run_overrides, "resume=auto"])
    assert sorted(logged(tmp_path / "run")) == list(range(1, 21))


def test_resume_from_a_path_in_a_new_directory(run_overrides, tmp_path, reference):
    short = [*run_overrides, "max_steps=12", f"out_dir={tmp_path / 'short'}"]
    run_train(short)  # its schedule differs after step 12, so resume it under the full max_steps
    ckpt = tmp_path / "short" / "checkpoints" / "step_0000012.safetensors"
    run_train([*run_overrides, f"resume={ckpt}", f"out_dir={tmp_path / 'continued'}"])
    continued = logged(tmp_path / "continued")
    assert sorted(continued) == list(range(13, 21))
    assert continued == {s: v for s, v in logged(reference).items() if s > 12}


def test_resume_path_of_a_finished_checkpoint_into_a_new_directory_is_refused(run_overrides, tmp_path):
    # Defect: it trained nothing and wrote nothing, yet ended "done: ...; run directory NEW" with "no
    # checkpoint", a sample command for the empty NEW and a continue command (resume=auto there) that
    # would have started a fresh run; NEW was left behind holding only .lock.
    short = [*run_overrides, "max_steps=12", f"out_dir={tmp_path / 'short'}"]
    run_train(short)
    ckpt = tmp_path / "short" / "checkpoints" / "step_0000012.safetensors"
    with pytest.raises(ValueError, match=rf"resume={ckpt} finished at step 12: nothing left to train; raise"):
        run_train([*short, f"resume={ckpt}", f"out_dir={tmp_path / 'new'}"])
    assert not (tmp_path / "new").exists()


def test_a_finished_run_resumed_says_so_before_compiling(run_overrides, tmp_path, monkeypatch):
    # Defect: resume=auto of a finished run compiled its step for about 40 s before "nothing left to train".
    run_train([*run_overrides, "max_steps=4"])
    monkeypatch.setattr(training.trainer, "compile_or_eager", lambda *a: pytest.fail("compiled a finished run"))
    metrics = run_train([*run_overrides, "max_steps=4", "resume=auto", "compile=true"])
    assert metrics["val/loss"] == json.loads((tmp_path / "run" / "summary.json").read_text())["val/loss"]


def launch(overrides: list[str], log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log_path, "w") as log_file:
        return subprocess.Popen(
            [sys.executable, "train.py", *overrides], cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )


def wait_for_step(proc: subprocess.Popen, out_dir: Path, step: int, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while max(logged(out_dir), default=0) < step:
        assert proc.poll() is None, f"run exited with {proc.returncode} before step {step}"
        assert time.monotonic() < deadline, f"run did not reach step {step} in {timeout}s"
        time.sleep(0.005)


@pytest.mark.slow
def test_sigkill_and_sigterm_at_random_steps_resume_to_identical_losses(run_overrides, tmp_path, reference):
    """The real CLI, killed from outside at random steps (mid-step, mid-eval, mid-save)."""
    out_dir = tmp_path / "run"
    # A preemptible job's relaunch: the newest checkpoint, or afresh over a run killed before its first save.
    overrides = [*run_overrides, "resume=auto", "overwrite=true"]
    rng = random.Random(5)
    stops = []
    for i, signum in enumerate([signal.SIGKILL, signal.SIGKILL, signal.SIGTERM]):
        proc = launch(overrides, tmp_path / f"launch{i}.log")
        # Past every step the previous launch logged, so the stale tail of metrics.jsonl cannot count.
        target = max(logged(out_dir), default=0) + rng.randint(1, 4)
        wait_for_step(proc, out_dir, target)
        proc.send_signal(signum)
        proc.wait(timeout=120)
        stops.append(max(logged(out_dir)))
        if signum == signal.SIGKILL:
            assert proc.returncode == -signal.SIGKILL
        else:
            output = (tmp_path / f"launch{i}.log").read_text()
            assert proc.returncode == 128 + signal.SIGTERM, output[-2000:]
            assert f"stopped by SIGTERM after step {stops[-1]}; saved" in output
            assert (out_dir / "checkpoints" / f"step_{stops[-1]:07d}.safetensors").is_file()
    assert stops[-1] < 20 and len(set(stops)) == 3
    run_train(overrides)  # the last resume in-process: it only saves a fourth interpreter start-up
    assert logged(out_dir) == logged(reference)  # every step, bit for bit
    assert logged(out_dir, "val/loss") == logged(reference, "val/loss")


@pytest.mark.slow
def test_resumed_run_continues_the_same_wandb_run(run_overrides, tmp_path):
    offline = [*run_overrides, "logger=wandb", "logger.mode=offline", "max_steps=8"]
    run_train(offline)
    first = load_checkpoint(tmp_path / "run" / "checkpoints" / "step_0000008.safetensors").meta["wandb_run_id"]
    run_train([*offline, "max_steps=12", "resume=auto"])
    second = load_checkpoint(tmp_path / "run" / "checkpoints" / "step_0000012.safetensors").meta["wandb_run_id"]
    assert first and second == first
    runs = sorted(p.name for p in (tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(name.endswith(f"-{first}") for name in runs)


def test_a_second_ctrl_c_names_the_checkpoint_to_continue_from(shared_corpus_overrides, tmp_path):
    # Defect: Ctrl-C twice (the second before the first's save) ended with a bare "interrupted": no word
    # of the checkpoints already saved, nor of the command that continues from the newest.
    out_dir = tmp_path / "run"
    big = ["model.d_model=384", "model.n_layer=6"]  # a save of ~0.3 s: the second Ctrl-C lands before it ends
    every_step = ["max_steps=10000", "eval_interval=1", "log_interval=1", "sample_tokens=0", "logger=none"]
    proc = launch([*shared_corpus_overrides, *big, *every_step, f"out_dir={out_dir}"], tmp_path / "log")
    wait_for_step(proc, out_dir, 2)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    output = (tmp_path / "log").read_text()
    assert proc.returncode == 130 and output.rstrip().endswith("interrupted"), output[-2000:]
    newest = CheckpointDir(out_dir / "checkpoints").latest()
    assert f"interrupted before a save; continue from {newest} with: python train.py out_dir={out_dir} " in output


def test_ctrl_c_through_a_pipe_whose_reader_it_also_killed_still_saves(shared_corpus_overrides, tmp_path):
    # Defect: `python train.py 2>&1 | tee log` then Ctrl-C: tee dies too, the progress bar's next write
    # raised BrokenPipeError, and the run exited 1 before its save (the error line itself lost).
    out_dir = tmp_path / "run"
    every_step = ["max_steps=10000", "eval_interval=1000", "log_interval=1", "sample_tokens=0", "logger=none"]
    args = [sys.executable, "train.py", *shared_corpus_overrides, *every_step, "progress=true", f"out_dir={out_dir}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wait_for_step(proc, out_dir, 2)
    proc.stdout.close()  # the pipe's reader is gone, as tee is after the same Ctrl-C
    time.sleep(0.5)  # steps go on meanwhile, each writing the bar into the dead pipe
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    stopped = max(logged(out_dir))
    assert proc.returncode == 130
    assert (out_dir / "checkpoints" / f"step_{stopped:07d}.safetensors").is_file()


def test_a_resumed_run_whose_budget_compiling_spent_says_no_step_ran(run_overrides, tmp_path, monkeypatch, caplog):
    # Defect: `budget_s=300` on a run that had trained 279.9 s compiled for more than the 20 s left and ended
    # "done:" with the same step and loss as before, saying nothing of why it had not trained.
    budget = [o for o in run_overrides if not o.startswith("max_steps=")] + ["max_steps=null"]
    run_train([*budget, "budget_s=3"])
    steps = max(logged(tmp_path / "run"))
    prepare = training.trainer.Trainer.prepare

    def slow_compile(self):  # as if compiling had taken longer than the second left
        prepare(self)
        self.compile_s = 5.0

    monkeypatch.setattr(training.trainer.Trainer, "prepare", slow_compile)
    with caplog.at_level("WARNING", logger="training.trainer"):
        run_train([*budget, "budget_s=4", "resume=auto"])
    assert max(logged(tmp_path / "run")) == steps
    said = r"no step ran: budget_s=4 left (\d\.\d) s after the (\d\.\d) s already trained, and compiling the step took"
    said += r" 5\.0 s; continue with a larger budget_s"
    left, trained = map(float, re.search(said, caplog.text).groups())
    assert trained <= 3.0 and abs(left + trained - 4.0) < 0.11


def test_resume_auto_of_another_model_names_every_difference_and_the_command_that_continues_it(run_overrides, tmp_path):
    # Defect: the README's "continue the same run" after its +debug=tiny run named one field ("has model.block_size=32
    # but this run has 4096; resume with the checkpoint's model config") and not how.
    import training.setup
    from cli.config import to_train_config
    from cli.continue_commands import with_continue_command
    from rundir.run import ModelMismatch
    from tests.helpers import compose_config

    run_train([*run_overrides, "max_steps=4"])
    data = [o for o in run_overrides if o.startswith("data.")]
    again = [*data, f"out_dir={tmp_path / 'run'}", "resume=auto", "compile=false", "logger=none"]
    cfg = to_train_config(compose_config(again))
    with pytest.raises(ModelMismatch) as refused:
        training.setup.train(cfg)
    assert re.search(
        r"has model.block_size=\d+, model.n_layer=2, .* but this run has model.block_size=", str(refused.value)
    )
    message = str(with_continue_command(refused.value, cfg, again))
    command = shlex.split(message.rsplit("; resume with the checkpoint's model config: ", 1)[1])
    assert command[1:4] == ["train.py", f"out_dir={tmp_path / 'run'}", "resume=auto"]
    assert "model.n_layer=2" in command
    metrics = run_train([*command[2:], "max_steps=6"])  # pasted, it continues the run
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["step"] == 6 and "val/loss" in metrics


def test_set_up_warnings_reach_the_runs_train_log(run_overrides, tmp_path):
    # Defect: "resuming with a different ['max_steps']" (and ['data'], where a file of data.files changed) was logged
    # before train.log opened: the console had it, the run's own log never did.
    for steps in (4, 6, 8):  # each in its own process, as a user runs them
        resume = ["resume=auto"] if steps > 4 else []
        done = run_cli([str(ROOT / "train.py"), *run_overrides, f"max_steps={steps}", *resume], cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
    log = (tmp_path / "run" / "train.log").read_text()
    assert log.count("resuming with a different ['max_steps']") == 2  # once for each resume, not held over
    assert log.index("resuming with a different") < log.index("resuming from")  # in the order they happened
