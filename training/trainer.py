"""The training loop: `train(cfg)` prepares data, builds the model, trains, evaluates, checkpoints.

Failures are handled in their own files: run_dir.py (which checkpoint to resume, no clobbering),
resume.py (what a checkpoint records and restoring it), signals.py (SIGTERM/SIGINT: finish the
step, save, exit), guards.py (non-finite loss or gradient), preflight.py (data checks).
"""

import contextlib
import logging
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from data.batches import eval_batches, sample_batch
from data.prepare import PreparedData
from data.prepare import prepare as prepare_data
from model import GPT
from training import checkpoint as ckpt_io
from training import distributed
from training.batch_layout import batch_layout
from training.compile import compile_or_eager
from training.config import TrainConfig
from training.device import autocast, resolve_device, resolve_precision
from training.evaluate import eval_metrics, mean_loss
from training.fairness import measure_seconds_per_step, steps_for_flops, steps_for_time
from training.guards import check_weights_finite, grad_norm_, is_finite, nonfinite_error, read_step
from training.loggers import MetricsLogger
from training.mfu import peak_flops
from training.optim import build_optimizer, lr_at, set_lr
from training.preflight import check_data_fits
from training.resume import RunState, checkpoint_meta, restore
from training.run_dir import CheckpointDir, trim_metrics
from training.run_info import write_run_info, write_summary
from training.signals import RunInterrupted, StopSignals

log = logging.getLogger(__name__)


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run training as configured; returns the final metrics.

    Raises RunInterrupted once a SIGTERM/SIGINT stop has been saved, and FloatingPointError on a
    non-finite step under on_nonfinite=stop; user errors raise ValueError/FileNotFoundError
    before anything in out_dir is touched.
    """
    cfg.validate()
    with distributed.process_group(cfg.distributed, resolve_device(cfg.device)) as (dist_info, device):
        return train_on_rank(cfg, dist_info, device)


def train_on_rank(cfg: TrainConfig, dist_info: distributed.DistInfo, device: torch.device) -> dict[str, Any]:
    """`train` on one rank (the only one, without torchrun); under torchrun all ranks run it in lockstep."""
    cfg.out_dir = distributed.broadcast_object(cfg.out_dir, dist_info)  # Hydra made one per rank
    layout = batch_layout(cfg.batch_size, cfg.grad_accum_steps, cfg.global_batch_size, dist_info.world_size)
    accum = layout.accum_steps
    out_dir = Path(cfg.out_dir)
    checkpoints = CheckpointDir(out_dir / "checkpoints", cfg.keep_last)
    resume_path = checkpoints.resume_path(cfg.resume, cfg.overwrite)
    distributed.check_same(
        str(resume_path), "the checkpoint to resume", "out_dir must be on a shared filesystem", dist_info
    )
    precision = resolve_precision(cfg.precision, device)
    data = distributed.main_first(lambda: prepare_data(cfg.data, progress=cfg.progress), dist_info)
    check_data_fits(data, cfg.model, cfg.batch_size)
    if cfg.model.vocab_size is None:
        cfg.model.vocab_size = data.meta["vocab_size"]

    def plain_model() -> GPT:  # the architecture on the CPU, for FSDP to gather shards into
        return GPT(cfg.model)

    def new_optimizer(m: torch.nn.Module) -> torch.optim.Optimizer:
        return build_optimizer(m, cfg.optim, device.type)

    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model).to(device)
    optimizer = new_optimizer(model)
    state, ckpt = RunState(), None
    if resume_path is not None:
        state, ckpt = restore(resume_path, cfg, model, optimizer, data)
    ctx = autocast(device, precision)
    # fp16 (GPUs without bf16) needs loss scaling; for bf16/fp32 the disabled scaler passes through.
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    tokens_per_step = layout.micro_batch * accum * dist_info.world_size * cfg.model.block_size  # all ranks

    def forward_backward(m: torch.nn.Module, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's micro-batches forward and backward: (mean loss of all ranks, clipped grad norm), no host sync."""
        loss_sum = torch.zeros((), device=device)
        for micro in range(accum):
            micro_step, rows = layout.locate(micro, dist_info)  # rows of a one-process run's micro-batch
            x, y = sample_batch(
                data.train, cfg.batch_size, cfg.model.block_size, seed=cfg.seed, step=step, micro_step=micro_step
            )
            x, y = x[rows], y[rows]
            if device.type == "cuda":  # pinned host memory lets the copy overlap with compute
                x, y = x.pin_memory(), y.pin_memory()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with distributed.grad_sync(m, micro == accum - 1):  # all-reduce on the last micro-step only
                with ctx:
                    _, loss = m(x, y)
                scaler.scale(loss / accum).backward()
            loss_sum += loss.detach()
        scaler.unscale_(optimizer)  # clip and check the true gradients
        norm = distributed.full_tensor(grad_norm_(list(m.parameters()), cfg.optim.grad_clip))
        return distributed.mean_over_ranks(loss_sum / accum, dist_info), norm

    def train_step(m: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> torch.Tensor:
        """One optimizer step as iso_time calibration times it (the loop below also handles bad steps)."""
        loss, norm = forward_backward(m, step)
        if is_finite(*read_step(loss, norm)):
            scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss

    # iso-FLOP / iso-time ablations derive max_steps from their budget (training/fairness.py).
    if cfg.fairness.mode == "iso_flop":
        cfg.max_steps = steps_for_flops(cfg.fairness.flop_budget, model.flops_per_token(), tokens_per_step)
    elif cfg.fairness.mode == "iso_time":
        seconds = measure_seconds_per_step(
            model,
            lambda m: build_optimizer(m, cfg.optim, device.type),
            train_step,
            cfg.fairness.calibration_steps,
            compile=cfg.compile,
        )
        cfg.max_steps = steps_for_time(cfg.fairness.time_budget_s, seconds)
        log.info("iso_time: %.3f s/step -> max_steps %d", seconds, cfg.max_steps)
    cfg.max_steps = distributed.broadcast_object(cfg.max_steps, dist_info)  # rank 0's timing decides for all
    train_model, optimizer = distributed.wrap(model, optimizer, new_optimizer, cfg.distributed, dist_info, device)
    if cfg.compile:  # compiled now, on a real batch, so a failing toolchain falls back to eager here
        train_model = compile_or_eager(train_model, lambda m: (forward_backward(m, state.step), scaler.update()))
    peak = peak_flops(device, precision)  # measured once per machine, cached (training/mfu.py)
    flops_per_token = model.flops_per_token()

    # Every check has passed: only now may this run replace what out_dir holds.
    def start_run_dir() -> None:
        checkpoints.start(resume_path, state.step)
        trim_metrics(out_dir / "metrics.jsonl", state.step)

    distributed.on_main(start_run_dir, dist_info)
    config_dict = asdict(cfg)
    logger = MetricsLogger(out_dir, cfg.logger, config_dict, run_id=state.wandb_run_id) if dist_info.is_main else None
    state.wandb_run_id = (logger and logger.run_id) or state.wandb_run_id
    if dist_info.is_main:
        write_run_info(out_dir, model, config_dict, tokens_per_step)
    log.info(
        "model: %.2fM parameters, %.1f MFLOP/token, device %s, precision %s (measured peak %.3f TFLOP/s)",
        model.num_params() / 1e6,
        flops_per_token / 1e6,
        device,
        precision,
        peak / 1e12,
    )
    val_batches = eval_batches(data.val, cfg.batch_size, cfg.model.block_size, cfg.eval_batches, cfg.seed)
    metrics: dict[str, Any] = {}
    throughputs: list[float] = []
    train_seconds = 0.0
    saved_step = state.step

    def save(is_best: bool) -> Path:
        nonlocal saved_step
        meta = checkpoint_meta(state, config_dict, data, metrics)
        full_model, full_optimizer = distributed.gather_for_save(
            model, optimizer, plain_model, new_optimizer, dist_info
        )

        def write() -> Path:
            check_weights_finite(full_model, state.step)
            return checkpoints.save(full_model, full_optimizer, meta, state.step, is_best)

        path = distributed.broadcast_object(distributed.on_main(write, dist_info), dist_info)
        saved_step = state.step
        return path

    def evaluate_and_save() -> None:
        nonlocal metrics
        val_loss = distributed.sharded_mean_loss(
            lambda batches: mean_loss(train_model, batches, device, ctx), val_batches, dist_info, device
        )
        metrics = eval_metrics(val_loss, data.meta["val_tokens"], data.meta["val_bytes"])
        if logger:
            logger.log(metrics, state.step)
        log.info("step %d: val loss %.4f, bpb %.4f", state.step, val_loss, metrics["val/bpb"])
        is_best = val_loss < state.best_val_loss
        state.best_val_loss = min(state.best_val_loss, val_loss)
        save(is_best)

    if ckpt is not None:
        ckpt_io.restore_rng_state(ckpt)  # last, so no set-up above draws from the restored streams
    model.train()
    bar = tqdm(
        range(state.step, cfg.max_steps),
        initial=state.step,
        total=cfg.max_steps,
        disable=not cfg.progress or not dist_info.is_main,
        dynamic_ncols=True,
    )
    t0, last_logged = time.perf_counter(), state.step
    with (
        StopSignals() as stop,
        contextlib.closing(logger) if logger else contextlib.nullcontext(),
        contextlib.closing(bar),
    ):
        for step in bar:
            lr = lr_at(step, step / cfg.max_steps, cfg.optim)
            set_lr(optimizer, lr)  # each group: lr * its lr_scale (Muon's matrices have their own)
            train_loss, grad_norm = read_step(*forward_backward(train_model, step))
            state.step = done = step + 1
            # Under fp16 an inf gradient means the loss scale is too high: the scaler skips that update.
            if is_finite(train_loss, grad_norm) or (scaler.is_enabled() and math.isfinite(train_loss)):
                scaler.step(optimizer)
            elif cfg.on_nonfinite == "skip":
                state.skipped_steps += 1
                log.warning("step %d: loss %s / grad norm %s; update skipped", done, train_loss, grad_norm)
            else:
                raise nonfinite_error(done, train_loss, grad_norm, checkpoints.latest())
            scaler.update()
            optimizer.zero_grad(set_to_none=True)

            if done % cfg.log_interval == 0 or done == cfg.max_steps:
                elapsed = time.perf_counter() - t0
                tok_s = tokens_per_step * (done - last_logged) / elapsed
                t0, last_logged = time.perf_counter(), done
                mfu = flops_per_token * tok_s / (peak * dist_info.world_size)
                throughputs.append(tok_s)
                train_seconds += elapsed
                record = {"train/loss": train_loss, "train/grad_norm": grad_norm, "lr": lr}
                record |= {
                    "throughput/tokens_per_s": tok_s,
                    "throughput/mfu": mfu,
                    "train/skipped_steps": state.skipped_steps,
                }
                if logger:
                    logger.log(record, done)
                bar.set_postfix(loss=f"{train_loss:.3f}", lr=f"{lr:.1e}", tok_s=f"{tok_s:,.0f}", mfu=f"{mfu:.1%}")
            if done % cfg.eval_interval == 0 or done == cfg.max_steps:
                evaluate_and_save()
                t0, last_logged = time.perf_counter(), done  # keep eval time out of throughput
            requested = distributed.max_over_ranks(stop.requested or 0, dist_info)  # all stop at one step
            if requested:
                path = checkpoints.latest() if saved_step == done else save(is_best=False)
                raise RunInterrupted(requested, done, str(path))
    if dist_info.is_main:
        write_summary(
            out_dir,
            metrics,
            cfg.max_steps,
            state.best_val_loss,
            throughputs,
            train_seconds,
            flops_per_token,
            tokens_per_step,
        )

    if cfg.sample_tokens > 0:
        sampler, _ = distributed.gather_for_save(model, None, plain_model, new_optimizer, dist_info)

        def print_sample() -> None:
            text = sample_text(sampler.to(device), data, cfg.sample_prompt, cfg.sample_tokens, device, cfg.seed)
            print(f"\n--- sample ---\n{text}\n--------------")

        distributed.on_main(print_sample, dist_info)
    return metrics


def sample_text(model: GPT, data: PreparedData, prompt: str, n: int, device: torch.device, seed: int) -> str:
    tok = data.tokenizer
    ids = tok.encode(prompt) or [tok.eot_id]
    idx = torch.tensor([ids], device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    model.eval()
    out = model.generate(idx, n, temperature=0.8, top_k=200, generator=generator)
    return tok.decode(out[0].tolist())
