"""The run directory as the training loop sees it: one `Run` with a small interface.

    set-up    acquire (the lock), resume_path (which checkpoint, refusing what would lose a file)
    the loop  start, step_done, eval_done, save, finish, close

Behind it: the lock and atomic writes (rundir/files.py), the checkpoint format (rundir/checkpoint.py),
which checkpoints a run may replace (rundir/checkpoints.py), the records and wandb (rundir/records.py),
and the progress bar. Records are written by rank 0 only; on the other ranks they are no-ops, and the
trainer calls `save` on rank 0 alone.

Below `Run`, the run's state across restarts (`RunState`): what a checkpoint records about the run, the
checks that a checkpoint fits this run (tokenizer, vocabulary, architecture), and restoring weights,
optimizer and counters. Batches are a pure function of (seed, step, micro_step) (data/batches.py) and
checkpoints are only written between optimizer steps, so the step is the data position and the
accumulation position is always 0. RNG states are restored by the caller just before the first step.
"""

import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from data.batches import PreparedData
from data.text_file import loads_json
from model.config import GPTConfig
from rundir import checkpoint as ckpt_io
from rundir.checkpoints import CheckpointDir, trim_metrics
from rundir.files import METRICS, SUMMARY, RunLock
from rundir.records import (
    LoggerConfig,
    MetricsLogger,
    log_to_file,
    mfu,
    start_wandb,
    write_config,
    write_json,
    write_run_info,
)

log = logging.getLogger(__name__)


class Run:
    """One run's directory, RUN/. Nothing in it is written before `start`, which the loop calls once every
    check has passed; until then a refused run leaves no trace (`release(discard=True)`)."""

    def __init__(self, out_dir: str | Path, keep_last: int | None = 2) -> None:
        self.out_dir = Path(out_dir)
        self.lock = RunLock(self.out_dir)
        self.checkpoints = CheckpointDir(self.out_dir / "checkpoints", keep_last)
        self.resume_from: Path | None = None
        self.logger: MetricsLogger | None = None
        self.bar: tqdm | None = None
        self.throughputs: list[float] = []

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

    def start(self, config: dict[str, Any], state: "RunState", shape: dict[str, Any], peak_flops: float) -> None:
        """Every check has passed: only now may this run replace what out_dir holds. Starts the records
        (metrics.jsonl trimmed to the step it continues, train.log, config.yaml, run_info.json, wandb)
        and the progress bar; `shape` is the model's sizes, FLOPs/token and tokens/step."""
        # wandb first, then the records: what can fail (no API key, no network, a record it cannot read) fails
        # before any record or checkpoint is replaced
        wandb_run = start_wandb(self.out_dir, LoggerConfig(**config["logger"]), config, state.wandb_run_id)
        try:
            self.checkpoints.check_writable()
            trim_metrics(self.out_dir / METRICS, self.checkpoints.history_kept(self.resume_from, state.step))
            self.checkpoints.start(self.resume_from, state.step)
            log_to_file(self.out_dir / "train.log")
            write_config(self.out_dir / "config.yaml", config)  # the first file written: a full disk stops here
        except BaseException:
            if wandb_run is not None:
                wandb_run.finish(exit_code=1)
            raise
        self.logger = MetricsLogger(self.out_dir, wandb_run)
        state.wandb_run_id = wandb_run.id if wandb_run is not None else state.wandb_run_id
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
        self.peak = max(self.peak, self.flops_per_token * tok_s)  # a faster step than the peak: the peak is stale
        record = {"train/loss": loss, "train/grad_norm": grad_norm, "lr": lr}
        record |= {"throughput/tokens_per_s": tok_s, "throughput/mfu": mfu(self.flops_per_token, tok_s, self.peak)}
        record |= {"time/elapsed_s": elapsed_s}
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
        # neither the evaluation's time nor the save's (the loop calls this after both) is throughput
        self.interval_start, self.interval_step = time.perf_counter(), self.step

    def save(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        state: "RunState",
        config: dict[str, Any],
        data: PreparedData,
        metrics: dict[str, float],
        is_best: bool,
        averaged: dict[str, torch.Tensor] | None = None,
    ) -> Path:
        """checkpoints/step_N.safetensors (and best.safetensors when `is_best`): weights (and their average),
        optimizer, RNG, counters, the config, what the data was and the last evaluation's metrics."""
        meta = checkpoint_meta(state, config, data, metrics)
        return self.checkpoints.save(model, optimizer, meta, state.step, is_best, averaged)

    def finish(self, state: "RunState", metrics: dict[str, float]) -> None:
        """summary.json: final metrics and speed of a finished run (tokens/s: the median over this process's
        log intervals)."""
        if self.bar is None:
            return
        record = {"status": "completed", "step": state.step, "best_val_loss": state.best_val_loss}
        record |= {"tokens_per_s": statistics.median(self.throughputs) if self.throughputs else None}
        # the whole run's, across resumes: the clock budget_s counts, and steps on_nonfinite=skip dropped
        record |= {"elapsed_s": state.elapsed_s, "skipped_steps": state.skipped_steps}
        record |= {"train_flops": self.flops_per_token * self.tokens_per_step * state.step, **metrics}
        write_json(self.out_dir / SUMMARY, record)

    def close(self) -> None:
        """The bar and the records (wandb's too); once, however the run ended."""
        if self.bar is not None:
            self.bar.close()
        if self.logger is not None:
            self.logger.close()
        self.bar = self.logger = None


# -- the run's state across restarts -------------------------------------------------------------------------

# Every GPTConfig field must match on resume, except these, which change how the same function is
# computed or regularised, not which function the weights define:
RESUMABLE_MODEL_FIELDS = {
    "attn_backend",  # explicit / sdpa / materialized compute the same attention (tests prove it)
    "dropout",  # regularisation only; the weights mean the same with or without it
    "attn_dropout",
}
# Allowed to change on resume, but then the run no longer matches an uninterrupted one: the batches, the
# schedule's length (max_steps or budget_s) or its arithmetic; and of the model, its regularisation.
TRAJECTORY_KEYS = (
    "seed",
    "batch_size",
    "grad_accum_steps",
    "global_batch_size",
    "max_steps",
    "budget_s",
    "optim",
    "precision",
)
TRAJECTORY_MODEL_FIELDS = ("dropout", "attn_dropout")


@dataclass
class RunState:
    step: int = 0  # optimizer steps done; also the LR-schedule step and the data position
    best_val_loss: float = math.inf
    skipped_steps: int = 0  # non-finite steps dropped under on_nonfinite=skip
    wandb_run_id: str | None = None
    elapsed_s: float = 0.0  # training wall-clock so far: a budget_s run resumes its schedule from here
    average_progress: float | None = None  # of the last step in the weight average (training/average.py)

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> "RunState":
        return cls(**{k: meta[k] for k in asdict(cls()) if k in meta})


def checkpoint_meta(state: "RunState", config: dict[str, Any], data: PreparedData, metrics: dict) -> dict[str, Any]:
    return {
        **asdict(state),
        "data_position": {"seed": config["seed"], "step": state.step, "micro_step": 0},
        "config": config,
        "tokenizer": data.tokenizer_meta,
        "vocab_size": data.vocab_size,
        "data_fingerprint": data.fingerprint,
        "metrics": metrics,
    }


def describe_tokenizer(meta: dict | None) -> str:
    meta = meta or {}
    if meta.get("name") == "char" and isinstance(meta.get("chars"), str):
        return f"char ({len(meta['chars'])} characters)"
    if meta.get("name") == "bpe" and isinstance(meta.get("spec"), str):
        return f"bpe ({len(loads_json(meta['spec'], 'the tokenizer spec')['model']['vocab'])} ids)"
    return repr(meta.get("name"))


def check_compatible(
    ckpt: ckpt_io.Checkpoint, path: Path, config: dict[str, Any], data: PreparedData, warn: bool = True
) -> None:
    """Refuse a checkpoint this run (its whole config, as a dict) cannot continue; warn (`warn`: one rank of
    several says it) where it continues on a different trajectory."""
    where = f"checkpoint {str(path)!r}"
    if "optim_param_groups" not in ckpt.meta:
        raise ValueError(f"{where} holds no optimizer state (weights only); it can be sampled from, not resumed")
    if ckpt.meta.get("tokenizer") != data.tokenizer_meta:
        saved, now = describe_tokenizer(ckpt.meta.get("tokenizer")), describe_tokenizer(data.tokenizer_meta)
        if saved == now:  # e.g. two char vocabularies of the same size
            now += " with other symbols"
        raise ValueError(f"{where} was trained with tokenizer {saved}, which does not match the data's tokenizer {now}")
    if ckpt.meta.get("vocab_size") != data.vocab_size:
        raise ValueError(
            f"{where} was trained on a vocabulary of {ckpt.meta.get('vocab_size')} tokens; "
            f"the data's is {data.vocab_size}"
        )
    saved = ckpt.meta.get("config")
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
        raise ValueError(f"{where} has no run config in its header; it was not written by train.py")
    check_same_model(saved["model"], config["model"], where)
    then, now = (saved.get("optim") or {}).get("optimizer"), config["optim"]["optimizer"]
    if then is not None and then != now:  # its state has another shape: the first step failed with a KeyError
        raise ValueError(
            f"{where} was trained with optim.optimizer={then}, this run has {now}; an optimizer's state does not "
            f"carry over to another: resume with optim={then}"
        )
    changed = [key for key in TRAJECTORY_KEYS if saved.get(key) != config.get(key)]
    changed += [f"model.{k}" for k in TRAJECTORY_MODEL_FIELDS if saved["model"].get(k) != config["model"].get(k)]
    if ckpt.meta.get("data_fingerprint") != data.fingerprint:
        changed.append("data")
    if changed and warn:
        log.warning("resuming with a different %s: the run continues, but not as the original would have", changed)


def check_same_model(saved: dict[str, Any], model: dict[str, Any], where: str) -> None:
    """Every GPTConfig field (derived from the dataclass, so a new knob is covered) must match, but the
    RESUMABLE_MODEL_FIELDS; a field the checkpoint predates must still be at its default."""
    defaults = asdict(GPTConfig())
    differ = [f.name for f in fields(GPTConfig) if f.name not in RESUMABLE_MODEL_FIELDS]
    differ = [name for name in differ if saved.get(name, defaults[name]) != model[name]]
    if differ:  # every one: naming the first alone sent a user through them one refusal at a time
        then = ", ".join(f"model.{name}={saved.get(name, defaults[name])!r}" for name in differ)
        now = ", ".join(f"model.{name}={model[name]!r}" for name in differ)
        raise ModelMismatch(f"{where} has {then} but this run has {now}; resume with the checkpoint's model config")


class ModelMismatch(ValueError):
    """A checkpoint whose model this run's config does not build; train.py adds the command that continues it."""


def restore(
    path: Path,
    config: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: PreparedData,
    warn: bool = True,
) -> tuple[RunState, ckpt_io.Checkpoint]:
    """Weights, optimizer state and counters from `path` into this run (`config`: its whole config as a
    dict); RNG states are restored by the caller, just before the first step. `warn`: check_compatible's."""
    ckpt = ckpt_io.load_checkpoint(path)
    check_compatible(ckpt, path, config, data, warn)
    ckpt_io.load_model_weights(model, ckpt, "train." if ckpt.section("train.") else "model.")
    ckpt_io.restore_optimizer(optimizer, ckpt)
    state = RunState.from_meta(ckpt.meta)
    log.info("resuming from %s at step %d", path, state.step)
    return state, ckpt
