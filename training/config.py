"""The run's structured config: dataclasses from each package, composed (cli/config.py registers it for
Hydra, with a study's settings on top: studies/fairness.py).

YAML files under `configs/` only choose values; the types, defaults and rules live here and next to
the code they configure (`GPTConfig`, `DataConfig`, `OptimConfig`, `LoggerConfig`, `DistributedConfig`).
"""

import math
from dataclasses import dataclass, field

from data.config import DataConfig
from model.config import GPTConfig
from rundir.records import LoggerConfig
from training.distributed import DistributedConfig
from training.optim import OptimConfig
from training.runtime import PRECISIONS

NONFINITE_POLICIES = ("stop", "skip")


@dataclass
class TrainConfig:
    model: GPTConfig = field(default_factory=GPTConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    seed: int = 1337
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    precision: str = "auto"  # auto | fp32 | bf16 | fp16
    compile: bool = False
    batch_size: int = 32  # sequences per micro-batch (ranks may split it: data/batches.py)
    grad_accum_steps: int = 1  # micro-batches per optimizer step (in one process)
    global_batch_size: int | None = None  # sequences per optimizer step, all ranks; null: batch_size * grad_accum_steps
    max_steps: int | None = 600  # optimizer steps; with budget_s, the run ends at whichever comes first
    # training wall-clock (steps + evals); the LR schedule runs on elapsed / budget. null under a study's
    # iso_flop / iso_time budget, which sets max_steps (studies/fairness.py).
    budget_s: float | None = None
    eval_interval: int = 100
    eval_batches: int = 10
    log_interval: int = 10
    out_dir: str | None = None  # the run's folder; unset, train.py makes a new outputs/DATE/TIME
    resume: str | None = None  # null | auto | path to a checkpoint
    overwrite: bool = False  # allow a fresh run in a directory that holds another run's checkpoints
    keep_last: int | None = 2  # step checkpoints kept (plus best.safetensors); null keeps every one
    on_nonfinite: str = "stop"  # stop | skip: what a NaN/inf loss or gradient does
    sample_tokens: int = 300  # printed after training; 0 skips
    sample_prompt: str = ""  # "": start as a new document does (after the end-of-text token)
    progress: bool = True

    def validate(self) -> None:
        """Checks only; the first bad value raises ValueError naming it and the rule."""
        for part in (self.model, self.data, self.optim, self.logger, self.distributed):
            part.validate()
        for name in ("batch_size", "grad_accum_steps", "eval_interval", "eval_batches", "log_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is invalid; it must be >= 1")
        if self.keep_last is not None and self.keep_last < 1:
            raise ValueError(
                f"keep_last={self.keep_last} is invalid; it must be >= 1, or null to keep every step checkpoint"
            )
        if self.max_steps is None and self.budget_s is None:
            raise ValueError("max_steps and budget_s are both null; give max_steps=N, budget_s=SECONDS or both")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps={self.max_steps} is invalid; it must be >= 1 (or null with budget_s set)")
        if self.budget_s is not None and not 0 < self.budget_s < math.inf:
            raise ValueError(f"budget_s={self.budget_s} is invalid; it must be a finite number of seconds > 0")
        if self.global_batch_size is not None:
            if self.grad_accum_steps != 1:
                raise ValueError(
                    f"global_batch_size={self.global_batch_size} and grad_accum_steps={self.grad_accum_steps} "
                    "are both set; give one (accumulation is derived from global_batch_size)"
                )
            if self.global_batch_size < 1 or self.global_batch_size % self.batch_size:
                raise ValueError(
                    f"global_batch_size={self.global_batch_size} is invalid; "
                    f"it must be a positive multiple of batch_size ({self.batch_size})"
                )
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} is unknown; choose one of: {', '.join(PRECISIONS)}")
        if not self.out_dir:
            raise ValueError("out_dir is not set; give out_dir=PATH (train.py makes a new outputs/DATE/TIME)")
        if self.on_nonfinite not in NONFINITE_POLICIES:
            raise ValueError(
                f"on_nonfinite={self.on_nonfinite!r} is unknown; choose one of: {', '.join(NONFINITE_POLICIES)}"
            )
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed={self.seed} is invalid; it must be an integer in [0, 2**63)")
        if self.sample_tokens < 0:
            raise ValueError(f"sample_tokens={self.sample_tokens} is invalid; it must be >= 0")
