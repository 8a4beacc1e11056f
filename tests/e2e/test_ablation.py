"""Ablations over n_head x d_k: fairness modes, per-run records, a real multirun sweep and its report."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.types import RunMode

import training.trainer
from analysis.report import table
from analysis.sweep import COMPLETED, CRASHED, FAILED_AT_START, aggregate, find_runs
from scripts.ablation_report import write_report
from tests.helpers import CONFIG_DIR, compose_config, hand_count
from training import fairness
from training.config import to_train_config
from training.fairness import steps_for_flops, steps_for_time
from training.trainer import train

ROOT = Path(__file__).resolve().parents[2]
# The head sweeps; the single-run recipes (nanogpt_baby, bpe_budget) are tested in tests/unit/test_knobs.py.
EXPERIMENTS = sorted(p.stem for p in (ROOT / "configs" / "experiment").glob("ablate_*.yaml"))


def run_train(overrides: list[str]) -> dict:
    return train(to_train_config(compose_config(overrides)))


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_and_validates(name, tiny_run_overrides):
    train_cfg = to_train_config(compose_config([f"+experiment={name}", *tiny_run_overrides]))  # registers the schema
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        hydra_cfg = compose("config", [f"+experiment={name}", *tiny_run_overrides], return_hydra_config=True).hydra
    assert hydra_cfg.mode == RunMode.MULTIRUN and "model.n_head" in hydra_cfg.sweeper.params
    expected = {"iso_param": "iso_param", "iso_flop": "iso_flop", "iso_time": "iso_time"}
    assert train_cfg.fairness.mode == next((m for k, m in expected.items() if k in name), "fixed_d_model")


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["fairness.mode=iso"], r"fairness.mode='iso' is unknown; choose one of: fixed_d_model, iso_param"),
        (["fairness.mode=iso_param", "model.d_k=8"], r"model.d_k=8 conflicts with fairness.mode=iso_param.* = 16"),
        (
            ["fairness.mode=iso_param", "model.n_head=3", "model.d_k=10"],
            r"needs model.d_model \(32\) divisible by model.n_head \(3\)",
        ),
        (["fairness.mode=iso_flop"], r"fairness.flop_budget=None is invalid; fairness.mode=iso_flop needs"),
        (["fairness.mode=iso_time", "fairness.time_budget_s=0"], r"fairness.time_budget_s=0.0 is invalid"),
        (["fairness.flop_budget=1e9"], r"fairness.flop_budget is set but fairness.mode=fixed_d_model"),
        (["fairness.mode=iso_flop", "fairness.flop_budget=10"], r"fairness.flop_budget=10 is below one step"),
    ],
)
def test_bad_fairness_settings_are_refused(tiny_run_overrides, overrides, message):
    with pytest.raises(ValueError, match=message):
        run_train([*tiny_run_overrides, *overrides])


def test_budget_arithmetic():
    assert steps_for_flops(1000 * 64 * 99.9, flops_per_token=1000, tokens_per_step=64) == 99
    assert steps_for_time(10.0, seconds_per_step=0.3) == 33
    with pytest.raises(ValueError, match=r"fairness.time_budget_s=0.1 is below one step \(0.3 s\)"):
        steps_for_time(0.1, 0.3)


def test_run_info_and_summary_match_a_hand_count_with_free_d_k(tiny_run_overrides, tmp_path):
    # d_k = 5 with n_head = 3 over d_model = 32: n_head * d_k = 15 != d_model
    run_train([*tiny_run_overrides, "model.n_head=3", "model.d_k=5", "max_steps=4", "eval_interval=4"])
    info, summary = read_json(tmp_path / "run" / "run_info.json"), read_json(tmp_path / "run" / "summary.json")
    V, T, L, D, HD = info["config"]["model"]["vocab_size"], 32, 2, 32, 15
    assert (info["n_head"], info["d_k"], info["fairness"]) == (3, 5, "fixed_d_model")
    assert info["params"] == hand_count(V, T, L, 3, 5, D, 4 * D, bias=False)
    forward = L * (2 * D * 3 * HD + 2 * HD * D + 2 * 2 * D * 4 * D + 2 * 2 * T * HD) + 2 * D * V
    assert info["flops_per_token"] == 3 * forward
    assert summary["status"] == "completed" and summary["step"] == 4 == info["max_steps"]
    assert summary["train_flops"] == 3 * forward * 8 * 32 * 4
    last_val = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert summary["val/loss"] == last_val["val/loss"] and summary["tokens_per_s"] > 0


def test_iso_param_ties_d_k_to_d_model_over_n_head(tiny_run_overrides, tmp_path):
    sizes = []
    for n_head in (1, 4):
        run_train(
            [*tiny_run_overrides, "fairness.mode=iso_param", f"model.n_head={n_head}", "max_steps=2", "overwrite=true"]
        )
        info = read_json(tmp_path / "run" / "run_info.json")
        assert info["d_k"] * n_head == 32
        sizes.append((info["params"], info["flops_per_token"]))
    assert sizes[0] == sizes[1]


def test_iso_flop_runs_spend_the_same_budget(tiny_run_overrides, tmp_path):
    budget = 1.5e8
    for n_head, d_k in ((1, 4), (4, 16)):
        run_train([*tiny_run_overrides, "fairness.mode=iso_flop", f"fairness.flop_budget={budget}",
                   f"model.n_head={n_head}", f"model.d_k={d_k}", "overwrite=true"])  # fmt: skip
        info, summary = read_json(tmp_path / "run" / "run_info.json"), read_json(tmp_path / "run" / "summary.json")
        step_flops = info["flops_per_token"] * info["tokens_per_step"]
        assert info["max_steps"] == summary["step"] == int(budget // step_flops)
        assert budget - step_flops < summary["train_flops"] <= budget


def test_iso_time_calibration_leaves_the_run_as_it_would_be(tiny_run_overrides, tmp_path, monkeypatch):
    measured = []

    def spy_measure(*args, **kwargs):
        measured.append(fairness.measure_seconds_per_step(*args, **kwargs))
        return measured[-1]

    # The step time on a shared machine is anything; fix the step count, keep the real measurement.
    monkeypatch.setattr(training.trainer, "measure_seconds_per_step", spy_measure)
    monkeypatch.setattr(training.trainer, "steps_for_time", lambda budget, seconds: 3)
    overrides = [*tiny_run_overrides, "model.dropout=0.1", "eval_interval=100"]  # dropout draws random numbers
    iso = run_train([*overrides, "fairness.mode=iso_time", "fairness.time_budget_s=60"])
    assert len(measured) == 1 and measured[0] > 0
    assert read_json(tmp_path / "run" / "run_info.json")["max_steps"] == 3
    # The timed steps ran on a copy under a forked RNG: a plain 3-step run ends at the identical loss.
    plain = run_train([*overrides, f"out_dir={tmp_path / 'plain'}", "max_steps=3"])
    assert plain["val/loss"] == iso["val/loss"]


def write_run(directory: Path, n_head: int, d_k: int, seed: int, loss: float | None, params: int = 1000) -> None:
    """A run directory as the trainer leaves it; loss None = crashed after its first eval."""
    directory.mkdir(parents=True)
    info = {"n_head": n_head, "d_k": d_k, "seed": seed, "params": params, "flops_per_token": 6000}
    (directory / "run_info.json").write_text(json.dumps({**info, "fairness": "fixed_d_model"}))
    (directory / "metrics.jsonl").write_text(json.dumps({"step": 10, "val/loss": 3.0}) + "\n")
    if loss is not None:
        summary = {"status": "completed", "step": 20, "tokens_per_s": 100.0, "val/loss": loss, "val/bpb": loss / 2}
        (directory / "summary.json").write_text(json.dumps(summary))


def test_aggregate_over_seeds_gives_mean_and_sample_std(tmp_path):
    write_run(tmp_path / "a", 2, 8, 0, 1.4)
    write_run(tmp_path / "b", 2, 8, 1, 1.6)
    write_run(tmp_path / "c", 1, 8, 0, 2.0, params=900)
    write_run(tmp_path / "d", 1, 8, 1, None, params=900)
    runs = find_runs(tmp_path)
    assert [r.status for r in runs] == [COMPLETED, COMPLETED, COMPLETED, CRASHED]
    rows = aggregate(runs)
    assert [(r.n_head, r.d_k, len(r.runs)) for r in rows] == [(1, 8, 1), (2, 8, 2)]
    text = table(rows)
    assert "| 2 | 8 | 16 | 1.00k | 6.00k | 20 | 100 | 1.5000 ± 0.1414 | 0.7500 ± 0.0707 | 2 |" in text
    assert "| 1 | 8 | 8 | 900 | 6.00k | 20 | 100 | 2.0000 | 1.0000 | 1 |" in text


def test_aggregate_refuses_runs_that_differ_beyond_heads_and_seed(tmp_path):
    write_run(tmp_path / "a", 2, 8, 0, 1.4, params=1000)
    write_run(tmp_path / "b", 2, 8, 1, 1.6, params=2000)
    with pytest.raises(ValueError, match=r"runs with n_head=2, d_k=8 differ in size"):
        aggregate(find_runs(tmp_path))


def test_a_job_that_failed_before_training_is_reported_with_its_error(tmp_path):
    write_run(tmp_path / "ok", 2, 8, 0, 1.4)
    job = tmp_path / "bad"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "config.yaml").write_text("model:\n  n_head: 3\n  d_k: 0\nseed: 0\n")
    (job / "train.log").write_text("[2026-01-01 00:00:00,000][train][ERROR] - model.d_k=0 is invalid\n")
    report = write_report(tmp_path).read_text()
    assert f"| bad | 3 | 0 | 0 | {FAILED_AT_START} | — | model.d_k=0 is invalid |" in report


def test_missing_sweep_dir_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"sweep directory .* does not exist"):
        find_runs(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no runs under"):
        find_runs(tmp_path)


@pytest.mark.slow
def test_multirun_sweep_to_report_with_a_crashed_run(tiny_run_overrides, tmp_path, monkeypatch):
    sweep = tmp_path / "sweep"
    overrides = [o for o in tiny_run_overrides if not o.startswith("out_dir=")]
    overrides += ["max_steps=6", "eval_interval=3", "log_interval=3"]
    grid = 'hydra.sweeper.params={model.n_head:"1,2",model.d_k:"4,8",seed:"0"}'
    cmd = [sys.executable, "train.py", "+experiment=ablate_heads_dk", *overrides, f"hydra.sweep.dir={sweep}", grid]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["h1_dk4_s0", "h1_dk8_s0", "h2_dk4_s0", "h2_dk8_s0"]
    groups = {read_json(p)["config"]["logger"]["group"] for p in sweep.glob("*/run_info.json")}
    assert groups == {f"{tmp_path.name}/sweep"}  # one wandb group for the sweep

    # A fifth run in the sweep dies mid-training, after its first evaluation.
    real_sample_batch = training.trainer.sample_batch

    def failing_sample_batch(*args, step: int, **kwargs):
        if step == 4:
            raise RuntimeError("simulated crash at step 4")
        return real_sample_batch(*args, step=step, **kwargs)

    monkeypatch.setattr(training.trainer, "sample_batch", failing_sample_batch)
    crashed = [*overrides, f"out_dir={sweep / 'h2_dk16_s0'}", "model.n_head=2", "model.d_k=16", "seed=0"]
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_train(crashed)

    report = write_report(sweep, tmp_path / "report").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [line.split("|")[1:3] for line in rows] == [[" 1 ", " 4 "], [" 1 ", " 8 "], [" 2 ", " 4 "], [" 2 ", " 8 "]]
    assert f"| h2_dk16_s0 | 2 | 16 | 0 | {CRASHED} | 3 |" in report
    assert "1 of 5 runs did not complete" in report
    for name in ("val_loss_curves.png", "val_loss_heatmap.png"):
        png = (tmp_path / "report" / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 5000
        assert f"]({name})" in report
    losses = [float(line.split("|")[8]) for line in rows]
    assert all(math.isfinite(v) and 0 < v < math.log(25) + 0.5 for v in losses)
