"""The training loop: `train(cfg)` prepares data, builds the model, trains, evaluates, checkpoints."""

import logging
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from data.batches import eval_batches, sample_batch
from data.prepare import PreparedData, prepare
from model import GPT
from training import checkpoint as ckpt_io
from training import distributed
from training.batch_layout import batch_layout
from training.config import TrainConfig
from training.device import autocast, resolve_device, resolve_precision
from training.evaluate import eval_metrics, mean_loss
from training.fairness import measure_seconds_per_step, steps_for_flops, steps_for_time
from training.loggers import MetricsLogger
from training.optim import build_optimizer, lr_at
from training.run_dir import CheckpointDir
from training.run_info import write_run_info, write_summary

log = logging.getLogger(__name__)


def check_data_fits(data: PreparedData, cfg: TrainConfig) -> None:
    vocab = data.meta["vocab_size"]
    if cfg.model.vocab_size is not None and cfg.model.vocab_size < vocab:
        raise ValueError(
            f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's vocabulary ({vocab})"
        )
    for split in ("train", "val"):
        n = len(getattr(data, split))
        if n <= cfg.model.block_size:
            raise ValueError(
                f"the {split} split has {n} tokens; it needs more than model.block_size={cfg.model.block_size}"
            )


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run training as configured (on every rank, under torchrun); returns the final metrics."""
    cfg.validate()
    with distributed.process_group(cfg.distributed, resolve_device(cfg.device)) as (dist_info, device):
        return train_on_rank(cfg, dist_info, device)


def train_on_rank(cfg: TrainConfig, dist_info: distributed.DistInfo, device: torch.device) -> dict[str, Any]:
    cfg.out_dir = distributed.broadcast_object(cfg.out_dir, dist_info)  # Hydra made one per rank
    layout = batch_layout(cfg.batch_size, cfg.grad_accum_steps, cfg.global_batch_size, dist_info.world_size)
    accum = layout.accum_steps
    out_dir = Path(cfg.out_dir)
    checkpoints = CheckpointDir(out_dir / "checkpoints")
    resume_path = checkpoints.resume_path(cfg.resume, cfg.overwrite)
    distributed.check_same(
        str(resume_path), "the checkpoint to resume", "out_dir must be on a shared filesystem", dist_info
    )
    precision = resolve_precision(cfg.precision, device)
    data = distributed.main_first(lambda: prepare(cfg.data, progress=cfg.progress), dist_info)
    check_data_fits(data, cfg)
    if cfg.model.vocab_size is None:
        cfg.model.vocab_size = data.meta["vocab_size"]

    def plain_model() -> GPT:  # the architecture on the CPU, for FSDP to gather shards into
        return GPT(cfg.model)

    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model).to(device)

    def new_optimizer(m: torch.nn.Module) -> torch.optim.Optimizer:
        return build_optimizer(m, cfg.optim, device.type)

    optimizer = new_optimizer(model)
    start_step, best_val, wandb_id = 0, math.inf, None
    if resume_path is not None:
        start_step, best_val, wandb_id = restore(resume_path, model, optimizer, data)
    ctx = autocast(device, precision)
    tokens_per_step = layout.micro_batch * accum * dist_info.world_size * cfg.model.block_size  # all ranks

    def train_step(m: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> torch.Tensor:
        """One optimizer step over this rank's micro-batches; returns the summed loss."""
        loss_sum = torch.zeros((), device=device)
        for micro in range(accum):
            micro_step, rows = layout.locate(micro, dist_info)
            x, y = sample_batch(
                data.train, cfg.batch_size, cfg.model.block_size, seed=cfg.seed, step=step, micro_step=micro_step
            )
            x, y = x[rows], y[rows]
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with distributed.grad_sync(m, micro == accum - 1):  # all-reduce on the last micro-step only
                with ctx:
                    _, loss = m(x, y)
                (loss / accum).backward()
            loss_sum += loss.detach()
        if cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(m.parameters(), cfg.optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss_sum

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
    if cfg.compile:
        train_model = torch.compile(train_model)

    config_dict = asdict(cfg)
    logger = MetricsLogger(out_dir, cfg.logger, config_dict, run_id=wandb_id) if dist_info.is_main else None
    if dist_info.is_main:
        write_run_info(out_dir, model, config_dict, tokens_per_step)
    log.info(
        "model: %.2fM parameters, %.1f MFLOP/token, device %s, precision %s",
        model.num_params() / 1e6,
        model.flops_per_token() / 1e6,
        device,
        precision,
    )
    val_batches = eval_batches(data.val, cfg.batch_size, cfg.model.block_size, cfg.eval_batches, cfg.seed)
    metrics: dict[str, Any] = {}
    throughputs: list[float] = []
    train_seconds = 0.0

    def evaluate_and_save(step: int) -> None:
        nonlocal best_val, metrics
        val_loss = distributed.sharded_mean_loss(
            lambda batches: mean_loss(train_model, batches, device, ctx), val_batches, dist_info, device
        )
        metrics = eval_metrics(val_loss, data.meta["val_tokens"], data.meta["val_bytes"])
        if logger:
            logger.log(metrics, step)
        log.info("step %d: val loss %.4f, bpb %.4f", step, val_loss, metrics["val/bpb"])
        is_best = val_loss < best_val
        best_val = min(best_val, val_loss)
        meta = {
            "step": step,
            "best_val_loss": best_val,
            "config": config_dict,
            "tokenizer": data.meta["tokenizer"],
            "data_fingerprint": data.meta["fingerprint"],
            "wandb_run_id": logger.run_id if logger else None,
            "metrics": metrics,
        }
        full_model, full_optimizer = distributed.gather_for_save(
            model, optimizer, plain_model, new_optimizer, dist_info
        )
        distributed.on_main(lambda: checkpoints.save(full_model, full_optimizer, meta, step, is_best), dist_info)

    model.train()
    bar = tqdm(
        range(start_step, cfg.max_steps),
        initial=start_step,
        total=cfg.max_steps,
        disable=not cfg.progress or not dist_info.is_main,
        dynamic_ncols=True,
    )
    t0 = time.perf_counter()
    for step in bar:
        lr = lr_at(step, cfg.optim, cfg.max_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = train_step(train_model, optimizer, step)

        done = step + 1
        if done % cfg.log_interval == 0 or done == cfg.max_steps:
            train_loss = distributed.mean_over_ranks(loss_sum / accum, dist_info).item()  # the step's one host sync
            if not math.isfinite(train_loss):
                raise FloatingPointError(f"loss became {train_loss} at step {step}; last good checkpoint kept")
            elapsed, t0 = time.perf_counter() - t0, time.perf_counter()
            steps_done = cfg.log_interval if done % cfg.log_interval == 0 else done % cfg.log_interval
            tok_s = tokens_per_step * steps_done / elapsed
            throughputs.append(tok_s)
            train_seconds += elapsed
            if logger:
                logger.log({"train/loss": train_loss, "lr": lr, "throughput/tokens_per_s": tok_s}, done)
            bar.set_postfix(loss=f"{train_loss:.3f}", lr=f"{lr:.1e}", tok_s=f"{tok_s:,.0f}")
        if done % cfg.eval_interval == 0 or done == cfg.max_steps:
            evaluate_and_save(done)
            t0 = time.perf_counter()  # keep eval time out of throughput
    bar.close()
    if dist_info.is_main:
        write_summary(
            out_dir,
            metrics,
            cfg.max_steps,
            best_val,
            throughputs,
            train_seconds,
            model.flops_per_token(),
            tokens_per_step,
        )

    if cfg.sample_tokens > 0:
        sampler, _ = distributed.gather_for_save(model, None, plain_model, new_optimizer, dist_info)

        def print_sample() -> None:
            text = sample_text(sampler.to(device), data, cfg.sample_prompt, cfg.sample_tokens, device, cfg.seed)
            print(f"\n--- sample ---\n{text}\n--------------")

        distributed.on_main(print_sample, dist_info)
    if logger:
        logger.close()
    return metrics


def restore(path: Path, model: GPT, optimizer: torch.optim.Optimizer, data: PreparedData) -> tuple:
    ckpt = ckpt_io.load_checkpoint(path)
    if ckpt.meta.get("tokenizer") != data.meta["tokenizer"]:
        raise ValueError(
            f"checkpoint {str(path)!r} was trained with tokenizer {ckpt.meta.get('tokenizer', {}).get('name')!r}, "
            f"which does not match the data's tokenizer {data.meta['tokenizer'].get('name')!r}"
        )
    ckpt_io.load_model_weights(model, ckpt)
    ckpt_io.restore_optimizer(optimizer, ckpt)
    ckpt_io.restore_rng_state(ckpt)
    log.info("resumed from %s at step %d", path, ckpt.meta["step"])
    return ckpt.meta["step"], ckpt.meta.get("best_val_loss", math.inf), ckpt.meta.get("wandb_run_id")


def sample_text(model: GPT, data: PreparedData, prompt: str, n: int, device: torch.device, seed: int) -> str:
    tok = data.tokenizer
    ids = tok.encode(prompt) or [tok.eot_id]
    idx = torch.tensor([ids], device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    model.eval()
    out = model.generate(idx, n, temperature=0.8, top_k=200, generator=generator)
    return tok.decode(out[0].tolist())
