"""The Trainer: one step for everything that steps, probes that share nothing with the run, the
time-budget schedule, and resume refusing any architecture change."""

import copy
import json
import logging
import math
import platform
import resource
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rundir.run import RESUMABLE_MODEL_FIELDS, check_compatible, check_same_model, checkpoint_meta
from studies import fairness
from tests.helpers import tiny_trainer
from training.optim import lr_at

pytestmark = pytest.mark.usefixtures("one_thread")


def snapshot(trainer) -> dict:
    return {
        "model": {k: v.clone() for k, v in trainer.model.state_dict().items()},
        "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
        "scaler": trainer.scaler.state_dict(),
        "grads": [p.grad for p in trainer.model.parameters()],
        "step": trainer.state.step,
    }


def same(x, y) -> bool:
    """Equal nested state: dicts, lists and tensors compared element by element."""
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(same(a, b) for a, b in zip(x, y, strict=True))
    return x == y


def assert_same(a: dict, b: dict) -> None:
    assert a["step"] == b["step"] and a["scaler"] == b["scaler"]
    assert same(a["model"], b["model"]) and same(a["optimizer"], b["optimizer"])
    assert all(g is None for g in b["grads"])


def test_iso_time_calibration_under_fp16_leaves_the_runs_model_optimizer_and_scaler_untouched(tmp_path):
    # Defect on the old main: calibration unscaled the run's real optimizer and advanced its GradScaler.
    trainer = tiny_trainer(tmp_path, "precision=fp16", "fairness.mode=iso_time", "fairness.time_budget_s=5")
    assert trainer.scaler.is_enabled()
    trainer.step(1e-3)  # a run in progress: optimizer state and a scaler that has counted a step
    before = snapshot(trainer)
    seconds = fairness.measure_seconds_per_step(trainer.probe(), steps=2)
    assert seconds > 0
    assert_same(before, snapshot(trainer))


def test_the_compile_trial_leaves_the_run_untouched(tmp_path):
    trainer = tiny_trainer(tmp_path, "precision=fp16")
    trainer.step(1e-3)
    before = snapshot(trainer)
    trainer.trial_step(trainer.model)  # what compile_or_eager runs through the compiled module
    trainer.model.zero_grad(set_to_none=True)  # compile_or_eager drops the trial's gradients
    assert_same(before, snapshot(trainer))


def test_the_compiled_model_steps_and_the_plain_one_evaluates(tmp_path, monkeypatch):
    """Evaluation runs the wrapped but uncompiled model: a compiled no-grad graph is a second compilation
    (6.8 s of a 280 s run) for forwards that cost ~0.1 s more each eagerly."""
    calls = {"train": 0, "eval": 0}

    class Compiled(torch.nn.Module):  # what compile_or_eager would return: counts the calls it gets
        def __init__(self, model):
            super().__init__()
            self.inner = model

        def forward(self, *args, **kwargs):
            calls["train" if torch.is_grad_enabled() else "eval"] += 1
            return self.inner(*args, **kwargs)

    monkeypatch.setattr("training.trainer.compile_or_eager", lambda model, trial: Compiled(model))
    trainer = tiny_trainer(tmp_path, "compile=true")
    trainer.prepare()
    assert trainer.compiled and trainer.eval_model is trainer.model
    trainer.step(1e-3)
    loss = trainer.evaluate()["val/loss"]
    assert calls == {"train": trainer.layout.accum_steps, "eval": 0} and math.isfinite(loss)
    assert loss == trainer.mean_loss(trainer.val_batches)  # the same plain forwards, the same number


def test_a_probe_trains_its_own_copy(tmp_path):
    trainer = tiny_trainer(tmp_path)
    probe = trainer.probe()
    probe.step(1e-2)
    assert probe.state.step == 1 and trainer.state.step == 0
    changed = [not torch.equal(a, b) for a, b in zip(probe.model.parameters(), trainer.model.parameters(), strict=True)]
    assert all(changed)


def test_two_trainers_of_one_config_step_identically(tmp_path):
    a, b = tiny_trainer(tmp_path), tiny_trainer(tmp_path)
    losses = [(a.step(1e-3).loss, b.step(1e-3).loss) for _ in range(3)]
    assert all(x == y for x, y in losses) and losses[0][0] > losses[-1][0] - 1.0
    assert math.isclose(losses[0][0], math.log(a.cfg.model.vocab_size), rel_tol=0.1)  # ~ln(vocab) at init


def test_progress_runs_toward_whichever_end_comes_first(tmp_path):
    trainer = tiny_trainer(tmp_path, "max_steps=100", "budget_s=10")
    trainer.state.step = 20
    assert trainer.progress(elapsed_s=1.0) == pytest.approx(0.2)  # steps first
    assert trainer.progress(elapsed_s=5.0) == pytest.approx(0.5)  # the clock first
    assert trainer.progress(elapsed_s=50.0) == 1.0
    only_time = tiny_trainer(tmp_path, "max_steps=null", "budget_s=10")
    assert only_time.progress(elapsed_s=2.5) == pytest.approx(0.25)


@pytest.mark.parametrize(
    "field,value",
    [("pos_encoding", "learned"), ("rope_base", 500.0), ("qk_norm", False), ("n_kv_head", 1), ("d_ff", 64)],
)
def test_resume_refuses_any_model_field_change_naming_both_values(tmp_path, field, value):
    # Defect on the old main: only a hand list of shape keys was compared, so these resumed silently.
    trainer = tiny_trainer(tmp_path, "model.n_head=2")
    saved = {k: getattr(trainer.cfg.model, k) for k in trainer.cfg.model.__dataclass_fields__}
    setattr(trainer.cfg.model, field, value)
    with pytest.raises(ValueError, match=rf"has model\.{field}=.* but this run has model\.{field}={value!r}"):
        check_same_model(saved, asdict(trainer.cfg.model), "checkpoint 'x'")


def test_resume_allows_only_the_commented_fields_to_change(tmp_path):
    trainer = tiny_trainer(tmp_path)
    saved = {k: getattr(trainer.cfg.model, k) for k in trainer.cfg.model.__dataclass_fields__}
    trainer.cfg.model.attn_backend = "explicit"
    trainer.cfg.model.dropout = trainer.cfg.model.attn_dropout = 0.1
    check_same_model(saved, asdict(trainer.cfg.model), "checkpoint 'x'")
    assert RESUMABLE_MODEL_FIELDS == {"attn_backend", "dropout", "attn_dropout"}


def test_resume_on_other_data_or_another_trajectory_warns_naming_what_changed(tmp_path, caplog):
    trainer = tiny_trainer(tmp_path)
    meta = checkpoint_meta(trainer.state, asdict(trainer.cfg), trainer.data, {}) | {"optim_param_groups": []}
    ckpt = SimpleNamespace(meta=meta)  # check_compatible reads only the header
    with caplog.at_level(logging.WARNING, logger="rundir.run"):
        check_compatible(ckpt, Path("x"), asdict(trainer.cfg), trainer.data)
        assert not caplog.records  # the same run continues as it would have
        meta["data_fingerprint"], meta["config"]["seed"] = "another corpus", trainer.cfg.seed + 1
        meta["config"]["precision"] = "bf16" if trainer.cfg.precision != "bf16" else "fp32"  # a bf16 run in fp32
        check_compatible(ckpt, Path("x"), asdict(trainer.cfg), trainer.data)
        assert "different ['seed', 'precision', 'data']" in caplog.text
        # a longer budget stretches the schedule as max_steps does; dropout changes the noise
        meta["config"] = asdict(trainer.cfg) | {"budget_s": 7.0}
        meta["config"]["model"] = asdict(trainer.cfg.model) | {"dropout": 0.3}
        meta["data_fingerprint"] = trainer.data.fingerprint
        check_compatible(ckpt, Path("x"), asdict(trainer.cfg), trainer.data)
        assert "different ['budget_s', 'model.dropout']" in caplog.text
        caplog.clear()  # Defect: under torchrun every rank said it; rank 0 alone does
        check_compatible(ckpt, Path("x"), asdict(trainer.cfg), trainer.data, warn=False)
    assert not caplog.records


def test_bench_train_times_the_trainers_own_step(tmp_path, monkeypatch):
    # Defect on the old main: the benchmark timed a step of its own (no scaler, no guard, no host read). It
    # times the loop's step, late in the run (the schedule's last lr, the weight average's update).
    from bench import bench_train
    from training.trainer import Trainer

    calls = []
    real_step = Trainer.step
    monkeypatch.setattr(Trainer, "step", lambda self, lr: calls.append(lr) or real_step(self, lr))
    cfg = tiny_trainer(tmp_path).cfg
    monkeypatch.setattr(bench_train, "load_config", lambda overrides: copy.deepcopy(cfg))
    step, _, info = bench_train.prepare_row({"overrides": [], "precision": "fp32", "compile": False})
    step(0)
    assert calls == [lr_at(0, 1.0, cfg.optim)] and info["tokens_per_step"] == cfg.batch_size * cfg.model.block_size


@pytest.mark.parametrize("batch_tokens", [64, 10])  # two windows a batch; fewer tokens than a window: one
def test_split_loss_scores_every_token_once(tmp_path, batch_tokens):
    from training.evaluate import split_loss

    trainer = tiny_trainer(tmp_path)
    tokens = trainer.data.val[:101]  # 100 targets: three windows of 32 and one of 4
    by_hand = 0.0
    model = trainer.model.eval()
    for start in range(0, 100, 32):
        length = min(32, 100 - start)
        x = torch.from_numpy(tokens[start : start + length].astype("int64"))[None]
        y = torch.from_numpy(tokens[start + 1 : start + 1 + length].astype("int64"))[None]
        by_hand += model(x, y)[1].item() * length
    loss = split_loss(model, tokens, 32, torch.device("cpu"), batch_tokens=batch_tokens)
    assert loss == pytest.approx(by_hand / 100, rel=1e-6)


@pytest.mark.parametrize("mode,budget", [("iso_flop", "flop_budget=1e9"), ("iso_time", "time_budget_s=600")])
def test_a_fairness_budget_alone_sets_the_runs_length(mode, budget):
    # Defect: the default config's budget_s (then 270) silently capped an iso_flop / iso_time run.
    from cli.config import to_train_config
    from tests.helpers import compose_config

    overrides = [f"fairness.mode={mode}", f"fairness.{budget}", "out_dir=x"]
    with pytest.raises(ValueError, match=rf"budget_s=280.0 and fairness\.{budget.split('=')[0]}=.*budget_s=null"):
        to_train_config(compose_config(overrides))
    cfg = to_train_config(compose_config([*overrides, "budget_s=null"]))
    assert cfg.budget_s is None and cfg.max_steps is None  # prepare() sets max_steps from the budget


def test_fairness_budgets_buy_a_sane_whole_number_of_steps():
    # Defect: flop_budget=inf crashed converting NaN to int; 1e300 printed a 289-digit step count.
    assert fairness.steps_for_flops(1e12, flops_per_token=1000, tokens_per_step=1000) == 1_000_000
    with pytest.raises(ValueError, match=r"fairness.flop_budget=1e\+300 buys 1e\+294 steps, more than 1,000,000,000"):
        fairness.steps_for_flops(1e300, flops_per_token=1000, tokens_per_step=1000)
    with pytest.raises(ValueError, match=r"fairness.time_budget_s=1e\+12 buys 1e\+15 steps, more than"):
        fairness.steps_for_time(1e12, seconds_per_step=1e-3)


def test_the_budget_bar_stays_on_its_budget_when_the_clock_passes_it(tmp_path):
    # Defect: a run whose clock passed budget_s (a first evaluation longer than the budget, or the one
    # step every run trains) showed "train:   0%| | 122/None s": tqdm drops the total once n exceeds it.
    run = started(tiny_trainer(tmp_path, "budget_s=30", "max_steps=null", "progress=true"), tmp_path).run
    run.step_done(1.0, 1.0, 1e-3, elapsed_s=122.0, last=True)
    shown = str(run.bar)
    run.close()
    assert "30/30 s" in shown and "100%" in shown, shown


def test_the_bar_shows_an_evaluation_as_soon_as_it_is_done(tmp_path):
    # Defect: the bar's val= was set only at the next logged step, so after "step 10: val loss 4.334"
    # it still read the previous evaluation's 4.413 (and a run ended on a stale one).
    run = started(tiny_trainer(tmp_path, "log_interval=1", "progress=true"), tmp_path).run
    run.eval_done({"val/loss": 4.413}, elapsed_s=1.0)
    run.step_done(4.5, 1.0, 1e-3, elapsed_s=2.0, last=False)
    assert "val=4.413" in str(run.bar)
    run.eval_done({"val/loss": 4.334}, elapsed_s=3.0)
    assert "val=4.334" in str(run.bar), str(run.bar)
    run.close()


def started(trainer, tmp_path):
    """`trainer` with its run directory started, as train() starts it (records, the bar)."""
    from rundir.run import Run
    from training.setup import start_records

    trainer.cfg.logger.wandb = False
    trainer.run = Run(tmp_path / "run").acquire()
    start_records(trainer)
    return trainer


def test_the_tokens_per_second_after_an_evaluation_leave_out_the_save(tmp_path, monkeypatch):
    # Defect: the interval was restarted after the evaluation but before the save, so the step logged after each
    # evaluation counted the checkpoint's write as training time (353 tokens/s there, 1,457 elsewhere).
    from training import trainer as trainer_module
    from training.runtime import StopSignals

    trainer = started(tiny_trainer(tmp_path, "log_interval=1", "eval_interval=3", "max_steps=7"), tmp_path)
    real_save = trainer_module.Trainer.save
    monkeypatch.setattr(trainer_module.Trainer, "save", lambda self, best: time.sleep(1.0) or real_save(self, best))
    with StopSignals() as stop:
        trainer.fit(stop)
    trainer.run.close()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rates = {r["step"]: r["throughput/tokens_per_s"] for r in records if "throughput/tokens_per_s" in r}
    tokens = trainer.tokens_per_step
    assert rates[4] > tokens / 0.5 and rates[7] > tokens / 0.5  # a step, not the 1 s save before it


def test_a_budget_run_on_a_busy_machine_says_so_once_with_what_to_do(tmp_path, monkeypatch, caplog):
    # Defect: a default run beside another job did 150 steps at 935 tokens/s and ended at 2.376 bits/byte
    # (the README's figure: ~1.97), and nothing said why.
    from training import setup
    from training.distributed import DistInfo

    cfg = tiny_trainer(tmp_path, "budget_s=30", "max_steps=null").cfg
    monkeypatch.setattr(setup.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setattr(setup.os, "cpu_count", lambda: 2)
    with caplog.at_level(logging.WARNING, logger="training.setup"):
        setup.warn_if_busy(cfg, DistInfo())
    assert [r.getMessage() for r in caplog.records] == [
        "this machine is busy (load average 9.0 on 2 cores): a 30 s budget buys fewer steps than on a quiet "
        "machine; for a result that does not depend on the load, train max_steps=N budget_s=null"
    ]
    caplog.clear()
    monkeypatch.setattr(setup.os, "getloadavg", lambda: (1.0, 1.0, 1.0))
    setup.warn_if_busy(cfg, DistInfo())
    cfg.budget_s, cfg.max_steps = None, 10  # a step count does not depend on the load
    monkeypatch.setattr(setup.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    setup.warn_if_busy(cfg, DistInfo())
    assert caplog.records == []


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the memory policy is glibc's")
def test_a_cpu_trainer_keeps_freed_memory_so_big_tensors_cost_no_page_faults(tmp_path):
    # Defect: glibc mmapped every large block afresh, 22,700 page faults (a quarter of the time) a default step.
    tiny_trainer(tmp_path)  # sets the process's policy on a CPU

    def faults_of_big_tensors() -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):
            torch.ones(10_000_000).sum()  # 40 MB a time: 9,800 pages each under glibc's own policy
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    faults_of_big_tensors()  # the first one may grow the heap
    assert faults_of_big_tensors() < 500
