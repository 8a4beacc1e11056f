"""The training loop and its one step. `Trainer` owns a run's model, optimizer, loss scaler and data;
`step` is the one optimizer step that everything calls (the loop, a study's calibration, the benchmarks;
the compile trial runs its `forward_backward`), and `fit` is the loop, read top-down. It talks to six
components: the model, the batches (data/), the optimizer and schedule (training/optim.py), the runtime
(device, precision, compile, signals), the distributed helpers (no-ops in one process) and the run
directory (rundir.Run).
Set-up (data, checks, which checkpoint to resume) and the end-of-run sample are training/setup.py's."""

import copy
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from data.batches import PreparedData, batch_layout, eval_batches, sample_batch
from model.gpt import GPT
from rundir.checkpoint import Checkpoint, clean_state_dict
from rundir.run import Run, RunState, restore
from training import compile_budget, distributed
from training.average import WeightAverage
from training.config import TrainConfig
from training.distributed import DistInfo
from training.optim import build_optimizer, clip_grad_norm_, lr_at, set_lr
from training.runtime import (
    RunInterrupted,
    StopSignals,
    autocast,
    compile_or_eager,
    keep_freed_memory,
    resolve_precision,
)

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    loss: float  # mean training loss of the step's micro-batches, all ranks
    grad_norm: float  # before clipping
    lr: float


class Trainer:
    """One run's training state; `Trainer(cfg, data, device)` is ready to `step` (tests and benchmarks
    use it so); training/setup.py's `train(cfg)` adds the run directory, resume and the loop."""

    def __init__(self, cfg: TrainConfig, data: PreparedData, device: torch.device, dist: DistInfo | None = None):
        self.cfg, self.data, self.device, self.dist = cfg, data, device, dist or DistInfo()
        if device.type == "cpu":
            keep_freed_memory()  # a quarter of a CPU step went to faulting in pages freed by the last one
        cfg.model.vocab_size = cfg.model.vocab_size or data.vocab_size  # unset (the default): the data's
        self.layout = batch_layout(cfg.batch_size, cfg.grad_accum_steps, cfg.global_batch_size, self.dist.world_size)
        self.precision = resolve_precision(cfg.precision, device)
        self.autocast = autocast(device, self.precision)
        torch.manual_seed(cfg.seed)
        self.model = GPT(cfg.model).to(device)
        self.train_model: nn.Module = self.model  # the model as stepped: compiled and/or DDP/FSDP-wrapped
        # The model as evaluated: wrapped, never compiled. Compiling its no-grad graph too took 6.8 s of a 280 s
        # run on a Zen 4, and eager evaluation costs only 0.1 s more each (docs/evidence/recipe/round11.md).
        self.eval_model: nn.Module = self.model
        self.compile_s, self.compiled = 0.0, False  # torch.compile's seconds in prepare(), which the clock counts
        self.optimizer = self.new_optimizer(self.model)
        self.average = WeightAverage(cfg.optim.average_from, cfg.optim.average_window)
        # fp16 (GPUs without bf16) needs loss scaling; for bf16/fp32 the disabled scaler passes through.
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.precision == "fp16")
        self.state = RunState()
        self.run: Run | None = None  # set by train(); a bare Trainer saves nothing
        self.val_batches = eval_batches(data.val, cfg.batch_size, cfg.model.train_length, cfg.eval_batches, cfg.seed)
        self.metrics: dict[str, float] = {}  # the last evaluation's

    def new_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return build_optimizer(model, self.cfg.optim, self.device.type, self.precision)

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step, all ranks together."""
        return self.layout.micro_batch * self.layout.accum_steps * self.dist.world_size * self.cfg.model.train_length

    def probe(self, own_weights: bool = True) -> "Trainer":
        """A throw-away copy: the same config, data and weights, but its own optimizer, scaler and state,
        and (`own_weights`) its own copy of the model, so no step it takes reaches this run. The compile
        trial passes False: it takes no optimizer step, and compile_or_eager discards its gradients."""
        probe = copy.copy(self)  # config, data, layout and device are only read
        model = copy.deepcopy(self.model) if own_weights else self.model
        probe.model = probe.train_model = probe.eval_model = model
        probe.optimizer = probe.new_optimizer(probe.model)
        probe.scaler = torch.amp.GradScaler(self.device.type, enabled=self.scaler.is_enabled())
        probe.state, probe.run = RunState(), None
        probe.average = WeightAverage(self.cfg.optim.average_from, self.cfg.optim.average_window)
        return probe

    # -- one optimizer step ---------------------------------------------------------------------------------

    def forward_backward(self, step: int) -> tuple[Tensor, Tensor]:
        """This rank's micro-batches of `step`, forward and backward: (mean loss of all ranks, grad norm
        before clipping), both still on the device."""
        cfg, model = self.cfg, self.train_model
        loss_sum = torch.zeros((), device=self.device)
        accum = self.layout.accum_steps
        for micro in range(accum):
            micro_step, rows = self.layout.locate(micro, self.dist)  # rows of a one-process micro-batch
            x, y = sample_batch(
                self.data.train, cfg.batch_size, cfg.model.train_length, seed=cfg.seed, step=step, micro_step=micro_step
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
        norm = distributed.full_tensor(clip_grad_norm_(list(model.parameters()), cfg.optim.grad_clip))
        return distributed.mean_over_ranks(loss_sum / accum, self.dist), norm

    def step(self, lr: float) -> StepResult:
        """One optimizer step at `lr`, the run's next (`state.step`). Its one host sync reads the loss and
        grad norm, to name a bad step and keep it out of the weights."""
        set_lr(self.optimizer, lr)  # each group at lr times its own lr_scale
        loss_t, norm_t = self.forward_backward(self.state.step)
        loss, norm = torch.stack([loss_t.float(), norm_t.float()]).tolist()
        self.state.step += 1
        # Under fp16 an inf gradient means the loss scale is too high: the scaler itself skips that update.
        to_scaler = (math.isfinite(loss) and math.isfinite(norm)) or (self.scaler.is_enabled() and math.isfinite(loss))
        if to_scaler:
            self.scaler.step(self.optimizer)
        elif self.cfg.on_nonfinite == "skip":
            self.state.skipped_steps += 1
            log.warning("step %d: loss %s / grad norm %s; update skipped", self.state.step, loss, norm)
        else:
            last = self.run.latest() if self.run else None
            kept = f"last good checkpoint: {last}" if last else "no checkpoint was saved yet"
            raise FloatingPointError(
                f"step {self.state.step}: loss {loss} / gradient norm {norm} is not finite; stopped without "
                f"saving ({kept}); lower optim.lr or set on_nonfinite=skip to skip such steps"
            )
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(loss, norm, lr)

    def advance(self, progress: float) -> StepResult:
        """The loop's step at `progress` (the fraction of training done): the schedule's lr, one optimizer
        step, then the weight average folds it in (from optim.average_from on). What iso-time calibration
        and the benchmarks time."""
        result = self.step(lr_at(self.state.step, progress, self.cfg.optim))
        self.average.update(self.model, progress)
        return result

    # -- evaluation and checkpoints -------------------------------------------------------------------------

    @torch.no_grad()
    def mean_loss(self, batches: list[tuple[Tensor, Tensor]]) -> float:
        """Mean next-token cross-entropy (nats) over fixed batches, in eval mode."""
        model = self.eval_model
        was_training = model.training
        model.eval()
        total = torch.zeros((), device=self.device)
        for x, y in batches:
            with self.autocast:
                _, loss = model(x.to(self.device), y.to(self.device))
            total += loss.float()
        model.train(was_training)
        return (total / len(batches)).item()

    def evaluate(self) -> dict[str, float]:
        """Val loss, perplexity and bits/byte on the run's fixed val batches, shared out over ranks (of the
        weight average, once there is one)."""
        with self.average.swapped_in(self.model):
            loss = distributed.sharded_mean_loss(self.mean_loss, self.val_batches, self.dist, self.device)
        self.metrics = {
            "val/loss": loss,
            "val/ppl": math.exp(min(loss, 50.0)),
            "val/bpb": self.data.bits_per_byte(loss),
        }
        return self.metrics

    def save(self, is_best: bool) -> Path:
        """A checkpoint of the whole state (FSDP shards gathered to rank 0, which writes it); weights an
        update made non-finite are refused, so the last checkpoint stays a good one."""
        assert self.run is not None, "save() needs the run directory that train() sets"
        self.state.average_progress = self.average.progress
        averaged = None
        if self.average.active:  # the average is the run's result; training continues from its own weights
            with self.average.swapped_in(self.model):
                plain, _ = distributed.gather_for_save(
                    self.model, None, lambda: GPT(self.cfg.model), self.new_optimizer, self.dist
                )
                averaged = plain and {k: v.clone() for k, v in clean_state_dict(plain).items()}
        model, optimizer = distributed.gather_for_save(
            self.model, self.optimizer, lambda: GPT(self.cfg.model), self.new_optimizer, self.dist
        )

        def write() -> Path:
            bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
            if bad:
                raise FloatingPointError(
                    f"step {self.state.step}: weights {', '.join(bad[:3])} are not finite; not saving them"
                )
            return self.run.save(
                model, optimizer, self.state, asdict(self.cfg), self.data, self.metrics, is_best, averaged
            )

        return Path(distributed.broadcast_object(str(distributed.on_main(write, self.dist)), self.dist))

    # -- before the first step, and the loop ----------------------------------------------------------------

    def resume(self, path: Path) -> Checkpoint:
        """Continue the run saved at `path`: weights, optimizer, weight average, counters and its last metrics,
        each checked against this run first. Its RNG streams are the caller's to restore, just before the first
        step, so nothing set up after this draws from them."""
        # every rank restores, one says how this run differs from the checkpoint's (it printed once per rank)
        self.state, resumed = restore(path, asdict(self.cfg), self.model, self.optimizer, self.data, self.dist.is_main)
        self.average.load(resumed.section("model."), self.state.average_progress)
        self.metrics = resumed.meta.get("metrics") or {}
        return resumed

    def prepare(self) -> None:
        """Before the first step: DDP/FSDP wrapping and compilation. Every rank takes rank 0's max_steps (a
        study may have measured it on each)."""
        cfg = self.cfg
        cfg.max_steps = distributed.broadcast_object(cfg.max_steps, self.dist)
        self.train_model, self.optimizer = distributed.wrap(
            self.model, self.optimizer, self.new_optimizer, cfg.distributed, self.dist, self.device
        )
        self.eval_model = self.train_model
        skip = distributed.broadcast_object(compile_budget.skip_for_budget(cfg, self.device), self.dist)
        if cfg.compile and skip:
            log.info("%s", skip)  # one line: why this budget trains eager
        elif cfg.compile:  # compiled now on a probe's step, so a failing toolchain falls back to eager here
            log.info("compiling the step (torch.compile; its seconds count against budget_s; compile=false skips it)")
            start, wrapped = time.perf_counter(), self.train_model
            self.train_model = compile_or_eager(wrapped, self.trial_step)
            self.compiled = self.train_model is not wrapped  # False: the compiler failed and it trains eager
            self.compile_s = time.perf_counter() - start  # training time: the budget pays for it (fit)

    def trial_step(self, compiled: nn.Module) -> None:
        probe = self.probe(own_weights=False)  # a fresh scaler: an unscale_ without an update would stay in ours
        probe.train_model = compiled
        probe.forward_backward(self.state.step)

    def progress(self, elapsed_s: float) -> float:
        """Fraction of training done, toward whichever end comes first: max_steps or budget_s."""
        done = [self.state.step / self.cfg.max_steps] if self.cfg.max_steps else []
        if self.cfg.budget_s:
            done.append(elapsed_s / self.cfg.budget_s)
        return min(max(done), 1.0)

    def fit(self, stop: StopSignals) -> dict[str, float]:
        """The loop: step, log, evaluate and save, until max_steps or budget_s; returns the final metrics.
        Under a budget it stops early enough that the last evaluation and save still fit. A signal `stop`
        caught (even before the loop) ends it at the next step, saved."""
        cfg, run = self.cfg, self.run
        clock, saved_step = Clock(self.state.elapsed_s + self.compile_s, self.dist), self.state.step
        first_step, trained_s = self.state.step, self.state.elapsed_s
        self.model.train()
        if cfg.budget_s and self.state.step == 0:
            self.evaluate_and_save(clock, save=False)  # the loss at init, and what an evaluation costs
        now, _ = clock.agreed()
        while not self.finished(now, clock):
            result = self.advance(self.progress(now))
            clock.lap()
            now, requested = clock.agreed(stop.requested)  # one all-reduce a step, under torchrun
            last = self.finished(now, clock)
            run.step_done(result.loss, result.grad_norm, result.lr, now, last)
            if self.state.step % cfg.eval_interval == 0 or last:
                self.evaluate_and_save(clock)
                saved_step = self.state.step
                now, _ = clock.agreed()  # the evaluation took time; a signal waits for the next step
            if requested and not last:  # every rank stops at the same step; at the last one the run is done
                self.state.elapsed_s = clock.local()
                path = run.latest() if saved_step == self.state.step else self.save(False)
                raise RunInterrupted(requested, self.state.step, str(path), cfg.out_dir)
        self.state.elapsed_s = clock.local()
        if self.state.step == first_step and cfg.budget_s:  # only a resumed run: a new one always takes a step
            log.warning(
                "no step ran: budget_s=%g left %.1f s after the %.1f s already trained, and compiling the step took "
                "%.1f s; continue with a larger budget_s (a total) or compile=false",
                cfg.budget_s, cfg.budget_s - trained_s, trained_s, self.compile_s,
            )  # fmt: skip
        run.finish(self.state, self.metrics)
        self.average.install(self.model)  # what the run returns and samples
        return self.metrics

    def finished(self, now: float, clock: "Clock") -> bool:
        """At the end (max_steps or budget_s), or one more step and the last evaluation would overrun budget_s."""
        if self.state.step == 0:  # a run saves at least one step, so a budget too short for one overruns by it
            return False
        over = bool(self.cfg.budget_s) and now + clock.step_s + clock.eval_s >= self.cfg.budget_s
        return over or self.progress(now) >= 1.0

    def evaluate_and_save(self, clock: "Clock", save: bool = True) -> None:
        start = time.perf_counter()
        val_loss = self.evaluate()["val/loss"]
        evaluated_at = clock.local()
        log.info("step %d: val loss %.4f, bpb %.4f", self.state.step, val_loss, self.metrics["val/bpb"])
        if save:
            is_best = val_loss < self.state.best_val_loss
            self.state.best_val_loss = min(self.state.best_val_loss, val_loss)
            self.state.elapsed_s = clock.local()
            self.save(is_best)
        # after the save: the next tokens/s interval starts here (it counted the save's seconds as training's)
        self.run.eval_done(self.metrics, evaluated_at)
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
