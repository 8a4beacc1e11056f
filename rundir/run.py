"""The run directory as the training loop sees it: one `Run` with a small interface.

    set-up    acquire (the lock), resume_path (which checkpoint, refusing what would lose a file)
    the loop  start, step_done, eval_done, save, finish, close

Behind it: the lock and atomic writes (rundir/files.py), the checkpoint format (rundir/checkpoint.py),
which checkpoints a run may replace (rundir/checkpoints.py), the records and wandb (rundir/records.py),
and the progress bar. Records are written by rank 0 only; on the other ranks every method is a no-op
but `save`'s bookkeeping, which the trainer calls on rank 0 alone.
"""

import logging
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from data import PreparedData
from rundir.checkpoints import CheckpointDir, trim_metrics
from rundir.files import METRICS, SUMMARY, RunLock
from rundir.records import LoggerConfig, MetricsLogger, log_to_file, write_config, write_json, write_run_info
from rundir.resume import RunState, checkpoint_meta, restore

__all__ = ["Run", "RunState", "restore"]

log = logging.getLogger(__name__)


class Run:
    """One run's directory, RUN/. Nothing in it is written before `start`, which the loop calls once every
    check has passed; until then a refused run leaves no trace (`release(discard=True)`)."""

    def __init__(self, out_dir: str | Path, keep_last: int = 2) -> None:
        self.out_dir = Path(out_dir)
        self.lock = RunLock(self.out_dir)
        self.checkpoints = CheckpointDir(self.out_dir / "checkpoints", keep_last)
        self.resume_from: Path | None = None
        self.logger: MetricsLogger | None = None
        self.bar: tqdm | None = None
        self.throughputs: list[float] = []
        self.train_seconds = 0.0

    # -- set-up: the lock, and which checkpoint the run continues -----------------------------------------

    def acquire(self) -> "Run":
        self.lock.acquire()
        return self

    def release(self, discard: bool = False) -> None:
        self.lock.release(discard)

    def resume_path(self, resume: str | None, overwrite: bool) -> Path | None:
        self.resume_from = self.checkpoints.resume_path(resume, overwrite)
        return self.resume_from

    def holds(self, path: Path) -> bool:
        return self.checkpoints.holds(path)

    def latest(self) -> Path | None:
        return self.checkpoints.latest()

    # -- the loop's interface -------------------------------------------------------------------------------

    def start(self, config: dict[str, Any], state: RunState, shape: dict[str, Any], peak_flops: float) -> None:
        """Every check has passed: only now may this run replace what out_dir holds. Starts the records
        (metrics.jsonl trimmed to the step it continues, train.log, config.yaml, run_info.json, wandb)
        and the progress bar; `shape` is the model's sizes, FLOPs/token and tokens/step."""
        self.checkpoints.start(self.resume_from, state.step)
        trim_metrics(self.out_dir / METRICS, self.checkpoints.history_kept(self.resume_from, state.step))
        log_to_file(self.out_dir / "train.log")
        write_config(self.out_dir / "config.yaml", config)
        logger_cfg = LoggerConfig(**config["logger"])
        self.logger = MetricsLogger(self.out_dir, logger_cfg, config, run_id=state.wandb_run_id)
        state.wandb_run_id = self.logger.run.id if self.logger.run is not None else state.wandb_run_id
        write_run_info(self.out_dir, shape, config)
        self.tokens_per_step, self.flops_per_token = shape["tokens_per_step"], shape["flops_per_token"]
        self.peak, self.log_interval = peak_flops, config["log_interval"]
        self.step = state.step
        self.by_time = bool(config["budget_s"])  # under a budget the bar counts seconds: steps are not known
        self.bar = tqdm(
            initial=int(state.elapsed_s) if self.by_time else self.step,
            total=int(config["budget_s"]) if self.by_time else config["max_steps"],
            unit="s" if self.by_time else "step",
            # under a budget the rate would read "1.00s/s": show seconds done of the budget instead
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n}/{total} s [{elapsed}<{remaining}{postfix}]"
            if self.by_time
            else None,
            disable=not config["progress"],
            dynamic_ncols=True,
            desc="train",
        )
        self.interval_start, self.interval_step = time.perf_counter(), self.step
        self.val_loss: float | None = None
        self.postfix: dict[str, str | int] = {}

    def step_done(self, loss: float, grad_norm: float, lr: float, elapsed_s: float, last: bool) -> None:
        """One optimizer step ended: the bar moves; every log_interval steps (and the last) a record."""
        if self.bar is None:
            return
        self.step = step = self.step + 1
        # capped at the budget: tqdm drops a total that n passes (a first eval or the one step past it)
        self.bar.update(min(int(elapsed_s), self.bar.total) - self.bar.n if self.by_time else 1)
        if step % self.log_interval and not last:
            return
        now = time.perf_counter()
        seconds, self.interval_start = now - self.interval_start, now
        tok_s = self.tokens_per_step * (step - self.interval_step) / seconds
        self.interval_step = step
        self.throughputs.append(tok_s)
        self.train_seconds += seconds
        mfu = self.flops_per_token * tok_s / self.peak  # fraction of the measured matmul peak
        record = {"train/loss": loss, "train/grad_norm": grad_norm, "lr": lr}
        record |= {"throughput/tokens_per_s": tok_s, "throughput/mfu": mfu, "time/elapsed_s": elapsed_s}
        self.logger.log(record, step)
        self.postfix = {"step": step, "loss": f"{loss:.3f}", "lr": f"{lr:.1e}", "tok_s": f"{tok_s:,.0f}"}
        self.show_postfix()

    def show_postfix(self) -> None:
        if self.val_loss is not None:
            self.postfix["val"] = f"{self.val_loss:.3f}"
        self.bar.set_postfix(self.postfix, refresh=False)

    def eval_done(self, metrics: dict[str, float], elapsed_s: float) -> None:
        if self.bar is None:
            return
        self.val_loss = metrics["val/loss"]
        self.show_postfix()  # now, not at the next logged step: the bar never shows a stale evaluation
        self.logger.log({**metrics, "time/elapsed_s": elapsed_s}, self.step)
        self.interval_start, self.interval_step = time.perf_counter(), self.step  # eval time is not throughput

    def save(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        state: RunState,
        config: dict[str, Any],
        data: PreparedData,
        metrics: dict[str, float],
        is_best: bool,
    ) -> Path:
        """checkpoints/step_N.safetensors (and best.safetensors when `is_best`): weights, optimizer, RNG,
        counters, the config, what the data was and the last evaluation's metrics."""
        meta = checkpoint_meta(state, config, data, metrics)
        return self.checkpoints.save(model, optimizer, meta, state.step, is_best)

    def finish(self, state: RunState, metrics: dict[str, float]) -> None:
        """summary.json: final metrics and speed of a finished run (tokens/s: the median over log intervals)."""
        if self.bar is None:
            return
        record = {"status": "completed", "step": state.step, "best_val_loss": state.best_val_loss}
        record |= {"tokens_per_s": statistics.median(self.throughputs) if self.throughputs else None}
        record |= {"train_seconds": self.train_seconds}
        record |= {"train_flops": self.flops_per_token * self.tokens_per_step * state.step, **metrics}
        write_json(self.out_dir / SUMMARY, record)

    def close(self) -> None:
        """The bar and the records (wandb's too); once, however the run ended."""
        if self.bar is not None:
            self.bar.close()
        if self.logger is not None:
            self.logger.close()
        self.bar = self.logger = None
