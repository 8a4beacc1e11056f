"""End to end: train.py through Hydra on a generated corpus, metrics, checkpoints, errors."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.trained import load_model
from rundir.checkpoint import load_checkpoint
from tests.helpers import run_train

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_run_learns_and_writes_metrics_and_checkpoints(tiny_run_overrides, tmp_path):
    metrics = run_train([*tiny_run_overrides, "max_steps=60", "eval_interval=30", "optim.lr=3e-3"])
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    val = [line["val/loss"] for line in lines if "val/loss" in line]
    assert len(val) == 2 and val[-1] < val[0]
    assert val[-1] < math.log(25)  # well below a uniform guess over the ~25-symbol vocabulary
    # char tokens are ~1 byte each (plus one EOT per document), so bits/byte ~ loss / ln 2
    assert metrics["val/bpb"] == pytest.approx(metrics["val/loss"] / math.log(2), rel=0.01)
    assert {"train/loss", "lr", "throughput/tokens_per_s"} <= set(lines[0])
    ckpts = sorted((tmp_path / "run" / "checkpoints").glob("*.safetensors"))
    assert [p.name for p in ckpts] == ["best.safetensors", "step_0000030.safetensors", "step_0000060.safetensors"]
    ckpt = load_checkpoint(ckpts[-1])
    assert ckpt.meta["step"] == 60 and ckpt.meta["tokenizer"]["name"] == "char"
    model, _ = load_model(ckpts[-1])
    assert model.config.n_layer == 2


def test_a_learned_bpe_run_trains_scores_per_byte_and_samples_any_prompt(tiny_run_overrides, tmp_path, capsys):
    from scripts.sample import main as sample_main

    bpe = ["data.tokenizer=bpe", "data.bpe_vocab_size=300", "max_steps=30", "eval_interval=30", "optim.lr=3e-3"]
    metrics = run_train([*tiny_run_overrides, *bpe])
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints" / "best.safetensors")
    assert ckpt.meta["tokenizer"]["name"] == "bpe" and ckpt.meta["config"]["model"]["vocab_size"] == 300
    # a token covers more than a byte, so bits/byte is below the loss in bits/token
    assert metrics["val/bpb"] < 0.8 * metrics["val/loss"] / math.log(2)
    prompt = "ROMEO: hi, there — naïve 😀"  # characters the corpus never had: BPE falls back to bytes
    capsys.readouterr()  # the run's own closing sample
    sample_main([str(tmp_path / "run"), prompt, "--temperature", "0", "--max-new-tokens", "10", "--device", "cpu"])
    assert capsys.readouterr().out.startswith(prompt)


def test_resume_continues_from_the_last_checkpoint(tiny_run_overrides, tmp_path):
    run_train([*tiny_run_overrides, "max_steps=20"])
    metrics = run_train([*tiny_run_overrides, "max_steps=30", "resume=auto"])
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 30 and "val/loss" in metrics


def test_a_second_fresh_run_refuses_to_overwrite(tiny_run_overrides, tmp_path):
    run_train(tiny_run_overrides)
    before = (tmp_path / "run" / "checkpoints" / "step_0000020.safetensors").read_bytes()
    with pytest.raises(ValueError, match=r"already holds another run's files \(.*\); pass resume=auto"):
        run_train(tiny_run_overrides)
    assert (tmp_path / "run" / "checkpoints" / "step_0000020.safetensors").read_bytes() == before


@pytest.mark.slow
def test_train_py_cli_runs_and_errors_cleanly(tiny_run_overrides, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ok = subprocess.run(
        [sys.executable, "train.py", *tiny_run_overrides],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "--- sample ---" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "train.py", *tiny_run_overrides, "model.n_head=0", "overwrite=true"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines()[-1] == "error: model.n_head=0 is invalid; it must be >= 1"


def logged(tmp_path, key: str, run: str = "run") -> list[float]:
    lines = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
    return [line[key] for line in lines if key in line]


def test_mfu_is_logged_against_the_measured_peak(tiny_run_overrides, tmp_path):
    run_train(tiny_run_overrides)
    mfu = logged(tmp_path, "throughput/mfu")
    assert len(mfu) == 4 and all(0 < m < 1.5 for m in mfu)


def test_compile_failure_falls_back_to_eager(tiny_run_overrides, tmp_path, monkeypatch, caplog):
    import torch

    def broken_compile(model, *args, **kwargs):
        def fail(*a, **k):
            raise RuntimeError("compiler exploded")

        return fail

    monkeypatch.setattr(torch, "compile", broken_compile)
    run_train([*tiny_run_overrides, "compile=true", "precision=fp32", f"out_dir={tmp_path / 'compiled'}"])
    assert "torch.compile failed (RuntimeError: compiler exploded); training in eager mode" in caplog.text
    assert " compiled | " not in caplog.text  # the header says what it trains: eager
    run_train([*tiny_run_overrides, "precision=fp32"])
    assert logged(tmp_path, "train/loss", "compiled") == logged(tmp_path, "train/loss")  # the trial left no trace


def test_the_run_clock_counts_the_compilation(tiny_run_overrides, tmp_path, monkeypatch, caplog):
    # The default compiles inside its 280 s: the budget and the schedule must pay for the compilation, or the
    # whole process would overrun 300 s on a first run.
    import time

    import torch

    class Compiled(torch.nn.Module):  # what torch.compile returns: a module that runs the original
        def __init__(self, model):
            super().__init__()
            self.inner = model

        def forward(self, *args, **kwargs):
            return self.inner(*args, **kwargs)

    def slow_compile(model, *args, **kwargs):
        time.sleep(1.0)
        return Compiled(model)

    monkeypatch.setattr(torch, "compile", slow_compile)
    with caplog.at_level("INFO"):
        run_train([*tiny_run_overrides, "compile=true", "max_steps=4", "eval_interval=2"])
    elapsed = logged(tmp_path, "time/elapsed_s")
    assert elapsed and min(elapsed) >= 1.0  # every record's clock started before the compilation
    assert "compiling the step" in caplog.text and " compiled | " in caplog.text  # said, then in the header


@pytest.mark.slow
def test_compiled_training_matches_eager(tiny_run_overrides, tmp_path):
    steps = ["max_steps=6", "log_interval=1", "eval_interval=6", "precision=fp32", "sample_tokens=0"]
    run_train([*tiny_run_overrides, *steps])
    run_train([*tiny_run_overrides, *steps, "compile=true", f"out_dir={tmp_path / 'compiled'}"])
    eager, compiled = logged(tmp_path, "train/loss"), logged(tmp_path, "train/loss", "compiled")
    assert len(eager) == 6 and max(abs(a - b) for a, b in zip(eager, compiled, strict=True)) < 1e-4


def test_a_budget_too_small_for_a_step_still_trains_and_saves_one(tiny_run_overrides, tmp_path):
    # Defect: it trained 0 steps, and its closing lines pointed at a best.safetensors that did not exist.
    run_train([*tiny_run_overrides, "budget_s=1e-9", "sample_tokens=0"])
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["step"] == 1
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == ["best.safetensors", "step_0000001.safetensors"]
