"""What a head-count / d_k ablation holds fixed, so runs of different shapes compare fairly.

fixed_d_model  d_model, depth and steps fixed; d_k is free (params and FLOPs grow with n_head * d_k)
iso_param      d_k = d_model / n_head, so params and FLOPs/token are the same for every n_head (Vaswani et al.);
               the model has no weight sized by d_k alone (QK-norm off, n_kv_head = n_head)
iso_flop       max_steps = flop_budget / (flops_per_token * tokens_per_step): equal training FLOPs
iso_time       max_steps = time_budget_s / (median seconds of a throw-away copy's steps): equal wall-clock

A study is a layer above training: `StudyRunConfig` is a run's config with the study's settings on top
(what `python train.py` composes), and `resolve_budget` turns an iso_flop / iso_time budget into plain
`max_steps` before the run starts, so the training core never reads them. The max_steps used is written
to run_info.json. A resumed iso_time run measures again, so its max_steps may differ: resume iso_flop."""

import copy
import dataclasses
import logging
import math
import statistics
import time
from dataclasses import dataclass, field

import torch

from data.prepare import prepare as prepare_data
from model.config import GPTConfig
from training.config import TrainConfig
from training.distributed import env_info, local_device
from training.runtime import compile_or_eager, resolve_device
from training.trainer import Trainer

log = logging.getLogger(__name__)

FAIRNESS_MODES = ("fixed_d_model", "iso_param", "iso_flop", "iso_time")
STEP_BUDGETS = {"iso_flop": "flop_budget", "iso_time": "time_budget_s"}  # the modes whose budget sets max_steps
MAX_BUDGET_STEPS = 10**9  # a budget buying more is a slip of the exponent: no run is that long


@dataclass
class FairnessConfig:
    mode: str = "fixed_d_model"
    flop_budget: float | None = None  # iso_flop: total training FLOPs of each run
    time_budget_s: float | None = None  # iso_time: seconds of training steps per run (eval excluded)
    calibration_steps: int = 5  # iso_time: timed steps (after one warm-up step) to measure the step time

    @property
    def step_budget(self) -> tuple[str, float] | None:
        """(field, value) of the budget that sets the run's length under iso_flop / iso_time, else None."""
        name = STEP_BUDGETS.get(self.mode)
        return (name, getattr(self, name)) if name else None

    def validate(self, model: GPTConfig) -> None:
        if self.mode not in FAIRNESS_MODES:
            raise ValueError(f"fairness.mode={self.mode!r} is unknown; choose one of: {', '.join(FAIRNESS_MODES)}")
        for mode, name in STEP_BUDGETS.items():
            value = getattr(self, name)
            if self.mode == mode and (value is None or not 0 < value < math.inf):  # NaN fails both
                raise ValueError(f"fairness.{name}={value} is invalid; fairness.mode={mode} needs a finite value > 0")
            if self.mode != mode and value is not None:
                raise ValueError(f"fairness.{name} is set but fairness.mode={self.mode}; it is used only by {mode}")
        if self.calibration_steps < 1:
            raise ValueError(f"fairness.calibration_steps={self.calibration_steps} is invalid; it must be >= 1")
        if self.mode == "iso_param":
            if model.d_model % model.n_head:
                raise ValueError(
                    f"fairness.mode=iso_param needs model.d_model ({model.d_model}) divisible by "
                    f"model.n_head ({model.n_head})"
                )
            tied = model.d_model // model.n_head
            if model.d_k is not None and model.d_k != tied:
                raise ValueError(
                    f"model.d_k={model.d_k} conflicts with fairness.mode=iso_param, which ties d_k to "
                    f"d_model / n_head = {tied}; leave model.d_k unset or use fairness.mode=fixed_d_model"
                )
            # Weights with d_k or n_kv_head * d_k entries change size with n_head, so no count is held fixed.
            if model.qk_norm:
                raise ValueError(
                    "fairness.mode=iso_param needs model.qk_norm=false: QK-norm's d_k gains a layer change the "
                    "parameter count with n_head; set model.qk_norm=false or use fairness.mode=fixed_d_model"
                )
            if model.kv_heads != model.n_head:
                raise ValueError(
                    f"fairness.mode=iso_param needs model.n_kv_head unset (= n_head), not {model.n_kv_head} with "
                    f"model.n_head={model.n_head}: the key and value projections, n_kv_head * d_k wide, would change "
                    "the parameter count with n_head; use fairness.mode=fixed_d_model for GQA"
                )


@dataclass
class StudyRunConfig(TrainConfig):
    """A run's config as `python train.py` composes it: TrainConfig plus what an ablation holds fixed."""

    fairness: FairnessConfig = field(default_factory=FairnessConfig)

    def validate(self) -> None:
        self.fairness.validate(self.model)
        budget = self.fairness.step_budget
        if budget is None:
            return super().validate()
        if self.budget_s is not None:  # the time budget would cut the fair one short
            raise ValueError(
                f"budget_s={self.budget_s} and fairness.{budget[0]}={budget[1]} both set the run's length "
                f"(fairness.mode={self.fairness.mode}); pass budget_s=null"
            )
        # max_steps is the budget's to set (resolve_budget): checked as if it had set it already
        TrainConfig.validate(dataclasses.replace(self, max_steps=self.max_steps or MAX_BUDGET_STEPS))


def resolve_budget(cfg: TrainConfig) -> None:
    """Under iso_flop / iso_time, set cfg.max_steps from the budget, measured on a throw-away Trainer of this
    config on this process's device (under torchrun the run takes rank 0's figure)."""
    fairness = getattr(cfg, "fairness", None)
    if fairness is None or fairness.step_budget is None:
        return
    cfg.validate()
    device = local_device(resolve_device(cfg.device), env_info())
    probe = Trainer(copy.deepcopy(cfg), prepare_data(cfg.data, progress=cfg.progress), device)
    if cfg.compile:  # as the run will step: compiled, or eager where the compiler fails (Trainer.prepare)
        probe.train_model = compile_or_eager(probe.model, probe.trial_step)
    cfg.max_steps = max_steps_for(fairness, probe)


def steps_for_flops(flop_budget: float, flops_per_token: int, tokens_per_step: int) -> int:
    """The whole number of optimizer steps that fits in `flop_budget` training FLOPs."""
    one_step = f"{flops_per_token} FLOPs/token x {tokens_per_step} tokens/step"
    return whole_steps("flop_budget", flop_budget, flop_budget // (flops_per_token * tokens_per_step), one_step)


def steps_for_time(time_budget_s: float, seconds_per_step: float) -> int:
    return whole_steps("time_budget_s", time_budget_s, time_budget_s // seconds_per_step, f"{seconds_per_step:.3g} s")


def whole_steps(name: str, budget: float, steps: float, one_step: str) -> int:
    """`steps` a budget buys, refused below one step or above MAX_BUDGET_STEPS (a typo, not a run)."""
    if steps < 1:
        raise ValueError(f"fairness.{name}={budget:.3g} is below one step ({one_step})")
    if steps > MAX_BUDGET_STEPS:
        raise ValueError(
            f"fairness.{name}={budget:.3g} buys {steps:.3g} steps, more than {MAX_BUDGET_STEPS:,}; "
            "give a smaller budget"
        )
    return int(steps)


def max_steps_for(cfg: FairnessConfig, probe: Trainer) -> int:
    """max_steps under iso_flop (from the FLOP budget) or iso_time (from a probe's measured step time)."""
    if cfg.mode == "iso_flop":
        steps = steps_for_flops(cfg.flop_budget, probe.model.flops_per_token(), probe.tokens_per_step)
        log.info("iso_flop: %.3g FLOPs -> max_steps %d", cfg.flop_budget, steps)
        return steps
    seconds = measure_seconds_per_step(probe, cfg.calibration_steps)
    steps = steps_for_time(cfg.time_budget_s, seconds)
    log.info("iso_time: %.3f s/step -> max_steps %d", seconds, steps)
    return steps


def measure_seconds_per_step(probe: Trainer, steps: int) -> float:
    """Median seconds of `probe.advance` (the run's own step, as late in the run as it gets: with the weight
    average's update) after a warm-up step. The probe is a throw-away Trainer (resolve_budget builds one) and
    the RNG is forked, so the run is the same as without calibration."""
    devices = [p.device for p in probe.model.parameters() if p.device.type == "cuda"][:1]
    times = []
    with torch.random.fork_rng(devices=devices):
        for i in range(steps + 1):
            t0 = time.perf_counter()
            probe.advance(1.0)  # reads the loss on the host, so the device has finished
            if i > 0:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)
