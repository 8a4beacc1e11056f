"""The training loop as one object. `Trainer` owns a run's model, optimizer, loss scaler, batch layout and
data; `step` is the one optimizer step that everything calls (the loop, iso_time calibration, the
compile trial, the benchmarks), and `fit` is the loop, read top-down. `train(cfg)` adds the run
directory, resume and the end-of-run sample."""

import copy
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from data.batches import eval_batches, sample_batch
from data.prepare import PreparedData
from data.prepare import prepare as prepare_data
from model import GPT
from model.generate import stream_text
from model.sampling import SamplingParams
from training import checkpoint as ckpt_io
from training import distributed, fairness, guards
from training.batch_layout import batch_layout
from training.config import TrainConfig
from training.distributed import DistInfo
from training.evaluate import eval_metrics, mean_loss
from training.loggers import Meter, MetricsLogger, log_to_file, write_config, write_run_info
from training.optim import build_optimizer, lr_at, set_lr
from training.resume import RunState, checkpoint_meta, restore
from training.run_dir import CheckpointDir, RunLock, trim_metrics
from training.run_files import METRICS
from training.runtime import autocast, check_precision_runs, compile_or_eager, resolve_device, resolve_precision

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    loss: float  # mean training loss of the step's micro-batches, all ranks
    grad_norm: float  # before clipping
    lr: float
    applied: bool  # False when the update was dropped (non-finite under skip, or an fp16 overflow)


class Trainer:
    """One run's training state; `Trainer(cfg, data, device)` is ready to `step` (tests and benchmarks
    use it so), `train(cfg)` below adds the run directory, resume and the loop."""

    def __init__(self, cfg: TrainConfig, data: PreparedData, device: torch.device, dist: DistInfo | None = None):
        self.cfg, self.data, self.device, self.dist = cfg, data, device, dist or DistInfo()
        take_data_vocab(cfg, data)
        self.layout = batch_layout(cfg.batch_size, cfg.grad_accum_steps, cfg.global_batch_size, self.dist.world_size)
        self.precision = resolve_precision(cfg.precision, device)
        self.autocast = autocast(device, self.precision)
        torch.manual_seed(cfg.seed)
        self.model = GPT(cfg.model).to(device)
        self.train_model: nn.Module = self.model  # the model as stepped: compiled and/or DDP/FSDP-wrapped
        self.optimizer = self.new_optimizer(self.model)
        # fp16 (GPUs without bf16) needs loss scaling; for bf16/fp32 the disabled scaler passes through.
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.precision == "fp16")
        self.state = RunState()
        self.checkpoints: CheckpointDir | None = None  # set by train(); a bare Trainer saves nothing
        self.resume_path: Path | None = None
        self.sample_prompt_ids: list[int] = []  # checked before training (guards.check_prompt)
        self.val_batches = eval_batches(data.val, cfg.batch_size, cfg.model.block_size, cfg.eval_batches, cfg.seed)
        self.metrics: dict[str, float] = {}  # the last evaluation's

    def new_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return build_optimizer(model, self.cfg.optim, self.device.type)

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step, all ranks together."""
        return self.layout.micro_batch * self.layout.accum_steps * self.dist.world_size * self.cfg.model.block_size

    def probe(self) -> "Trainer":
        """A throw-away copy for calibration and the compile trial: the same config, data and weights,
        but its own model, optimizer, scaler and state, so nothing it does reaches this run."""
        probe = copy.copy(self)  # config, data, layout and device are only read
        probe.model = probe.train_model = copy.deepcopy(self.model)
        probe.optimizer = probe.new_optimizer(probe.model)
        probe.scaler = torch.amp.GradScaler(self.device.type, enabled=self.scaler.is_enabled())
        probe.state, probe.checkpoints = RunState(), None
        return probe

    def forward_backward(self, step: int) -> tuple[Tensor, Tensor]:
        """This rank's micro-batches of `step`, forward and backward: (mean loss of all ranks, grad norm
        before clipping), both still on the device."""
        cfg, model = self.cfg, self.train_model
        loss_sum = torch.zeros((), device=self.device)
        accum = self.layout.accum_steps
        for micro in range(accum):
            micro_step, rows = self.layout.locate(micro, self.dist)  # rows of a one-process micro-batch
            x, y = sample_batch(
                self.data.train, cfg.batch_size, cfg.model.block_size, seed=cfg.seed, step=step, micro_step=micro_step
            )
            x, y = x[rows], y[rows]
            if self.device.type == "cuda":  # pinned host memory lets the copy overlap with compute
                x, y = x.pin_memory(), y.pin_memory()
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with distributed.grad_sync(model, micro == accum - 1):  # all-reduce on the last micro-step only
                with self.autocast:
                    _, loss = model(x, y)
                self.scaler.scale(loss / accum).backward()
            loss_sum += loss.detach()
        self.scaler.unscale_(self.optimizer)  # clip and check the true gradients
        norm = distributed.full_tensor(guards.grad_norm_(list(model.parameters()), cfg.optim.grad_clip))
        return distributed.mean_over_ranks(loss_sum / accum, self.dist), norm

    def step(self, lr: float) -> StepResult:
        """One optimizer step at `lr`, the run's next (`state.step`); the loop's one host sync reads
        its loss and grad norm, to name a bad step and keep it out of the weights."""
        set_lr(self.optimizer, lr)  # each group at lr times its own lr_scale
        loss, norm = guards.read_step(*self.forward_backward(self.state.step))
        self.state.step += 1
        # Under fp16 an inf gradient means the loss scale is too high: the scaler skips that update.
        applied = guards.is_finite(loss, norm) or (self.scaler.is_enabled() and math.isfinite(loss))
        if applied:
            self.scaler.step(self.optimizer)
        elif self.cfg.on_nonfinite == "skip":
            self.state.skipped_steps += 1
            log.warning("step %d: loss %s / grad norm %s; update skipped", self.state.step, loss, norm)
        else:
            last = self.checkpoints.latest() if self.checkpoints else None
            raise guards.nonfinite_error(self.state.step, loss, norm, str(last) if last else None)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(loss, norm, lr, applied)

    def evaluate(self) -> dict[str, float]:
        """Val loss, perplexity and bits/byte on the run's fixed val batches, shared out over ranks."""
        loss = distributed.sharded_mean_loss(
            lambda batches: mean_loss(self.train_model, batches, self.device, self.autocast),
            self.val_batches,
            self.dist,
            self.device,
        )
        self.metrics = eval_metrics(loss, self.data.val_tokens, self.data.val_bytes)
        return self.metrics

    def save(self, is_best: bool) -> Path:
        """A checkpoint of the whole state (FSDP shards gathered to rank 0, which writes it)."""
        assert self.checkpoints is not None, "save() needs the run directory that train() sets"
        meta = checkpoint_meta(self.state, asdict(self.cfg), self.data, self.metrics)
        model, optimizer = distributed.gather_for_save(
            self.model, self.optimizer, lambda: GPT(self.cfg.model), self.new_optimizer, self.dist
        )

        def write() -> Path:
            guards.check_weights_finite(model, self.state.step)
            return self.checkpoints.save(model, optimizer, meta, self.state.step, is_best)

        return Path(distributed.broadcast_object(str(distributed.on_main(write, self.dist)), self.dist))

    def restore(self, path: Path) -> ckpt_io.Checkpoint:
        self.state, ckpt = restore(path, self.cfg, self.model, self.optimizer, self.data)
        self.metrics = ckpt.meta.get("metrics") or {}
        return ckpt

    def prepare(self) -> None:
        """Before the first step: fairness budgets into max_steps, DDP/FSDP wrapping, compilation."""
        cfg = self.cfg
        if cfg.fairness.step_budget is not None:
            probe = self.probe()
            if cfg.compile:
                probe.train_model = torch.compile(probe.model)
            cfg.max_steps = fairness.max_steps_for(cfg.fairness, probe)
        cfg.max_steps = distributed.broadcast_object(cfg.max_steps, self.dist)  # rank 0's timing decides
        self.train_model, self.optimizer = distributed.wrap(
            self.model, self.optimizer, self.new_optimizer, cfg.distributed, self.dist, self.device
        )
        if cfg.compile:  # compiled now on a probe's step, so a failing toolchain falls back to eager here
            self.train_model = compile_or_eager(self.train_model, lambda compiled: self.trial_step(compiled))

    def trial_step(self, compiled: nn.Module) -> None:
        probe = self.probe()
        probe.train_model = compiled
        probe.forward_backward(self.state.step)

    def progress(self, elapsed_s: float) -> float:
        """Fraction of training done, toward whichever end comes first: max_steps or budget_s."""
        done = [self.state.step / self.cfg.max_steps] if self.cfg.max_steps else []
        if self.cfg.budget_s:
            done.append(elapsed_s / self.cfg.budget_s)
        return min(max(done), 1.0)

    def fit(
        self, logger: MetricsLogger | None, stop: guards.StopSignals, resumed: ckpt_io.Checkpoint | None = None
    ) -> dict[str, Any]:
        """The loop: step, log, evaluate and save, until max_steps or budget_s; returns the final metrics.
        Under a budget it stops early enough that the last evaluation and save still fit. A signal `stop`
        caught (even before the loop) ends it at the next step, saved."""
        cfg = self.cfg
        clock, meter = Clock(self.state.elapsed_s, self.dist), Meter(self, logger)
        if resumed is not None:
            ckpt_io.restore_rng_state(resumed)  # last, so no set-up above draws from the restored streams
        self.model.train()
        with meter:
            if cfg.budget_s and self.state.step == 0:
                self.evaluate_and_save(meter, clock, save=False)  # the loss at init, and what an eval costs
            now, _ = clock.agreed()
            while not self.finished(now, clock):
                result = self.step(lr_at(self.state.step, self.progress(now), cfg.optim))
                clock.lap()
                now, requested = clock.agreed(stop.requested)  # one all-reduce a step, under torchrun
                last = self.finished(now, clock)
                meter.step_done(result, now, last)
                if self.state.step % cfg.eval_interval == 0 or last:
                    self.evaluate_and_save(meter, clock)
                    now, _ = clock.agreed()  # the evaluation took time; a signal waits for the next step
                if requested and not last:  # every rank stops at the same step; at the last one the run is done
                    self.state.elapsed_s = clock.local()
                    path = self.checkpoints.latest() if meter.saved_step == self.state.step else self.save(False)
                    raise guards.RunInterrupted(requested, self.state.step, str(path), cfg.out_dir)
        self.state.elapsed_s = clock.local()
        meter.finish(self)
        return self.metrics

    def finished(self, now: float, clock: "Clock") -> bool:
        """At the end (max_steps or budget_s), or one more step and the last evaluation would overrun budget_s."""
        if self.state.step == 0:  # a run saves at least one step, so a budget too short for one overruns by it
            return False
        over = bool(self.cfg.budget_s) and now + clock.step_s + clock.eval_s >= self.cfg.budget_s
        return over or self.progress(now) >= 1.0

    def evaluate_and_save(self, meter: Meter, clock: "Clock", save: bool = True) -> None:
        start = time.perf_counter()
        val_loss = self.evaluate()["val/loss"]
        meter.eval_done(self.metrics, clock.local())
        log.info("step %d: val loss %.4f, bpb %.4f", self.state.step, val_loss, self.metrics["val/bpb"])
        if save:
            is_best = val_loss < self.state.best_val_loss
            self.state.best_val_loss = min(self.state.best_val_loss, val_loss)
            self.state.elapsed_s = clock.local()
            self.save(is_best)
            meter.saved_step = self.state.step
        clock.paused(time.perf_counter() - start)


class Clock:
    """Training wall-clock, continued across resumes, with the last step's and evaluation's durations
    for the budget check. `agreed` gives the rank-max of the clock and of the stop signal in one
    all-reduce, so every rank takes the same decisions at the same step."""

    def __init__(self, already_s: float, dist: DistInfo) -> None:
        self.start = self.mark = time.perf_counter()
        self.already_s, self.dist, self.laps = already_s, dist, 0
        self.step_s = self.eval_s = 0.0

    def local(self) -> float:
        return self.already_s + time.perf_counter() - self.start

    def agreed(self, stop: int | None = None) -> tuple[float, int]:
        elapsed, signum = distributed.max_over_ranks([self.local(), float(stop or 0)], self.dist)
        return elapsed, int(signum)

    def lap(self) -> None:
        """A step ended: step_s is the mean step time since the last evaluation."""
        self.laps += 1
        self.step_s = (time.perf_counter() - self.mark) / self.laps

    def paused(self, seconds: float) -> None:
        self.eval_s, self.mark, self.laps = seconds, time.perf_counter(), 0


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run training as configured; returns the final metrics. User errors raise ValueError /
    FileNotFoundError before anything in out_dir is touched; a saved SIGTERM/SIGINT stop raises
    guards.RunInterrupted, a non-finite step under on_nonfinite=stop FloatingPointError."""
    cfg.validate()
    with distributed.process_group(cfg.distributed, resolve_device(cfg.device)) as (dist, device):
        cfg.out_dir = distributed.broadcast_object(cfg.out_dir, dist)  # Hydra made one per rank
        lock = RunLock(Path(cfg.out_dir))
        distributed.on_main(lock.acquire, dist)  # held until the run ends, however it ends
        try:
            trainer, resumed = set_up(cfg, dist, device)
        except BaseException:
            lock.release(discard=True)  # refused at start-up: a directory made for it goes again
            raise
        try:
            if trainer.checkpoints is None:  # resumed a finished run: its records stay as they are
                return trainer.metrics
            # From the first file written a signal stops the run at a saved step (wandb's start takes seconds).
            with guards.StopSignals() as stop:
                metrics = trainer.fit(start_records(trainer), stop, resumed)
            if dist.is_main:
                plot_run(Path(cfg.out_dir))
            if cfg.sample_tokens > 0:
                print_sample(trainer)
            return metrics
        finally:
            lock.release()


def take_data_vocab(cfg: TrainConfig, data: PreparedData) -> None:
    """model.vocab_size unset (the default) means the data's vocabulary."""
    cfg.model.vocab_size = cfg.model.vocab_size or data.vocab_size


def set_up(cfg: TrainConfig, dist: DistInfo, device: torch.device) -> tuple[Trainer, ckpt_io.Checkpoint | None]:
    """Every check, the data, the model and its resumed state; writes nothing into out_dir."""
    check_precision_runs(cfg.precision, device)  # needs only the device: before the data, which can take minutes
    checkpoints = CheckpointDir(Path(cfg.out_dir) / "checkpoints", cfg.keep_last)
    resume_path = checkpoints.resume_path(cfg.resume, cfg.overwrite)
    distributed.check_same(str(resume_path), "the checkpoint to resume", "out_dir must be on a shared disk", dist)
    data = distributed.main_first(lambda: prepare_data(cfg.data, progress=cfg.progress), dist)
    guards.check_data_fits(data, cfg.model, cfg.batch_size)
    take_data_vocab(cfg, data)  # before the memory check, which sizes the embedding
    prompt_ids = guards.check_prompt(data, cfg.sample_prompt, cfg.sample_tokens)
    guards.check_fits_in_memory(cfg.model, device)
    trainer = Trainer(cfg, data, device, dist)
    trainer.sample_prompt_ids = prompt_ids
    resumed = trainer.restore(resume_path) if resume_path is not None else None
    trainer.prepare()
    if resumed is not None and trainer.progress(trainer.state.elapsed_s) >= 1.0:
        if not checkpoints.holds(resume_path):  # out_dir would end with nothing in it to sample or continue
            raise ValueError(
                f"resume={resume_path} finished at step {trainer.state.step}: nothing left to train; raise "
                f"max_steps or budget_s to continue it in {cfg.out_dir}"
            )
        log.info("%s finished at step %d: nothing left to train", resume_path, trainer.state.step)
    else:
        trainer.checkpoints, trainer.resume_path = checkpoints, resume_path
    return trainer, resumed


def start_records(trainer: Trainer) -> MetricsLogger | None:
    """Every check has passed: only now may this run replace what out_dir holds."""
    cfg, state, out_dir = trainer.cfg, trainer.state, Path(trainer.cfg.out_dir)

    def start_run_dir() -> None:
        trainer.checkpoints.start(trainer.resume_path, state.step)
        trim_metrics(out_dir / METRICS, trainer.checkpoints.history_kept(trainer.resume_path, state.step))
        log_to_file(out_dir / "train.log")
        write_config(out_dir / "config.yaml", asdict(cfg))

    distributed.on_main(start_run_dir, trainer.dist)
    if not trainer.dist.is_main:
        return None
    logger = MetricsLogger(out_dir, cfg.logger, asdict(cfg), run_id=state.wandb_run_id)
    state.wandb_run_id = logger.run.id if logger.run is not None else state.wandb_run_id
    write_run_info(out_dir, trainer.model, asdict(cfg), trainer.tokens_per_step)
    log.info("%s", run_header(trainer))
    return logger


def run_header(trainer: Trainer) -> str:
    """The few facts a person checks before walking away from a run (the rest is in RUN/config.yaml)."""
    cfg, m = trainer.cfg, trainer.model.config
    ends = [f"{cfg.max_steps} steps" if cfg.max_steps else "", f"{cfg.budget_s:g} s budget" if cfg.budget_s else ""]
    start = f", resumed at step {trainer.state.step}" if trainer.state.step else ""
    return (
        f"model {trainer.model.num_params() / 1e6:.2f}M params ({m.n_layer} layers, d_model {m.d_model}, "
        f"{m.n_head} heads x d_k {m.head_dim}) | data {cfg.data.source}/{trainer.data.tokenizer_meta['name']} "
        f"({m.vocab_size} tokens) | {trainer.device} {trainer.precision} | {' or '.join(e for e in ends if e)}, "
        f"{trainer.tokens_per_step:,} tokens/step{start}\nrun directory {cfg.out_dir} (full config: config.yaml)"
    )


def print_sample(trainer: Trainer) -> None:
    """A few hundred tokens from the trained model, so a run ends with something to read."""
    cfg = trainer.cfg
    val_loss = trainer.metrics.get("val/loss", math.nan)
    if not math.isfinite(val_loss):  # e.g. diverged under on_nonfinite=skip: its logits are NaN/inf too
        log.warning("no end-of-run sample: the final val loss is %s", val_loss)
        return
    model, _ = distributed.gather_for_save(
        trainer.model, None, lambda: GPT(cfg.model), trainer.new_optimizer, trainer.dist
    )

    def show() -> None:
        params = SamplingParams(max_new_tokens=cfg.sample_tokens, temperature=0.8, top_k=200, seed=cfg.seed)
        tokens = stream_text(
            model.to(trainer.device).eval(), trainer.data.tokenizer, trainer.sample_prompt_ids, params, trainer.device
        )
        print(f"\n--- sample ---\n{cfg.sample_prompt}{''.join(tokens)}\n--------------")

    distributed.on_main(show, trainer.dist)


def plot_run(out_dir: Path) -> None:
    """RUN/plots.png: losses, lr and tokens/s against step and wall time (scripts/plot_run.py)."""
    from analysis.run_plots import plot_runs

    try:
        plot_runs([out_dir], out_dir / "plots.png")
    except (OSError, ValueError) as e:  # a plot is a convenience: it never fails a finished run
        log.warning("no plots.png: %s", e)
