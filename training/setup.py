"""`train(cfg)`: a run from its config to its last checkpoint. Set-up checks everything before anything in
out_dir is written (the lock, the checkpoint to resume, the data, the sizes, the prompt of the closing
sample), then the loop (training/trainer.py) runs, and the run ends with its plot and a sample."""

import logging
import math
import os
import signal
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from data.batches import PreparedData
from data.prepare import prepare as prepare_data
from generation.generate import SamplingParams, decode_threads, encode_prompt, stream_text, torch_threads
from model.config import GPTConfig
from model.gpt import GPT
from rundir.checkpoint import Checkpoint, host_memory, restore_rng_state
from rundir.files import run_dir_itself
from rundir.records import held_records, plot_runs
from rundir.run import Run
from training import compile_budget, distributed, threads
from training.config import TrainConfig
from training.distributed import DistInfo
from training.runtime import RunInterrupted, StopSignals, check_precision_runs, peak_flops, resolve_device
from training.trainer import Trainer

log = logging.getLogger(__name__)

SCAN_CHUNK = 1 << 24  # tokens per pass; keeps the scan of a huge memmap out of memory


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run training as configured; returns the final metrics. User errors raise ValueError /
    FileNotFoundError before anything in out_dir is touched; a saved SIGTERM/SIGINT stop raises
    training.runtime.RunInterrupted, a non-finite step under on_nonfinite=stop FloatingPointError."""
    cfg.validate()
    # set-up's log (a resume's "resuming with a different ...") reaches train.log too, once it opens
    with distributed.process_group(cfg.distributed, resolve_device(cfg.device)) as (dist, device), held_records():
        return train_in_group(cfg, dist, device)  # its trainer is gone before the group is


def train_in_group(cfg: TrainConfig, dist: DistInfo, device: torch.device) -> dict[str, Any]:
    """train() inside the process group: the run directory, set-up, the loop and what follows it."""
    # rank 0's: each rank's clock named its own new folder, and outputs/latest may move on while this runs
    cfg.out_dir = distributed.broadcast_object(str(run_dir_itself(Path(cfg.out_dir))), dist)
    run = Run(cfg.out_dir, cfg.keep_last)
    distributed.on_main(run.acquire, dist)  # held until the run ends, however it ends
    try:
        trainer, resumed, prompt_ids = set_up(cfg, run, dist, device)
    except BaseException:
        run.release(discard=True)  # refused at start-up: a directory made for it goes again
        raise
    try:
        if trainer.run is None:  # resumed a finished run: its records stay as they are
            return trainer.metrics
        # From the first file written a signal stops the run at a saved step (wandb's start takes seconds).
        with StopSignals() as stop:
            start_records(trainer)
            warn_if_busy(cfg, dist)
            warn_if_dropout_across_ranks(cfg, dist)
            if resumed is not None:
                restore_rng_state(resumed)  # last, so no set-up above draws from the restored streams
            try:
                metrics = trainer.fit(stop)
            except RuntimeError as e:  # a rank that died (OOM killer, kill -9) fails the others' collective
                if lost := distributed.lost_peer(e, dist):
                    raise lost from None
                raise
        record = (cfg, device, trainer.compiled, trainer.compile_s, trainer.tokens_per_step, run.throughputs)
        distributed.on_main(lambda: compile_budget.record_run(*record), dist)  # the next run's compile estimate
        run.close()
        try:
            if dist.is_main:
                plot_run(Path(cfg.out_dir))
            if cfg.sample_tokens > 0:
                print_sample(trainer, prompt_ids)
        except KeyboardInterrupt:  # a Ctrl-C after the last step: said as a stop, not as a second Ctrl-C's loss
            raise RunInterrupted(signal.SIGINT, trainer.state.step, str(run.latest()), cfg.out_dir, True) from None
        return metrics
    finally:
        run.close()
        run.release(discard=True)  # a run that wrote nothing (a full disk at its first save) leaves no trace


def set_up(
    cfg: TrainConfig, run: Run, dist: DistInfo, device: torch.device
) -> tuple[Trainer, Checkpoint | None, list[int]]:
    """Every check, the data, the model and its resumed state; writes nothing into out_dir. Returns the trainer
    (its `run` left None where the checkpoint resumed has nothing left to train), that checkpoint, and the
    end-of-run sample's prompt ids."""
    check_precision_runs(cfg.precision, device)  # needs only the device: before the data, which can take minutes
    resume_path = run.resume_path(cfg.resume, cfg.overwrite)
    distributed.check_same(str(resume_path), "the checkpoint to resume", "out_dir must be on a shared disk", dist)
    data = distributed.main_first(lambda: prepare_data(cfg.data, progress=cfg.progress), dist)
    check_data_fits(data, cfg.model, cfg.batch_size)
    cfg.model.vocab_size = cfg.model.vocab_size or data.vocab_size  # before the memory check, which sizes it
    prompt_ids = sample_prompt_ids(data, cfg.sample_prompt, cfg.sample_tokens)
    check_fits_in_memory(cfg.model, device)
    trainer = Trainer(cfg, data, device, dist)
    resumed = trainer.resume(resume_path) if resume_path is not None else None
    # rank 0's answer (a study may have measured max_steps on each), before compiling: it took 40 s to say "nothing"
    finished = resumed is not None and trainer.progress(trainer.state.elapsed_s) >= 1.0
    if distributed.broadcast_object(finished, dist):
        if not run.holds(resume_path):  # out_dir would end with nothing in it to sample or continue
            raise ValueError(
                f"resume={resume_path} finished at step {trainer.state.step}: nothing left to train; raise "
                f"max_steps or budget_s to continue it in {cfg.out_dir}"
            )
        log.info("%s finished at step %d: nothing left to train", resume_path, trainer.state.step)
        return trainer, resumed, prompt_ids
    trainer.prepare()
    trainer.run = run
    return trainer, resumed, prompt_ids


def start_records(trainer: Trainer) -> None:
    """Every check has passed: only now may this run replace what out_dir holds (rank 0 writes)."""
    cfg, model = trainer.cfg, trainer.model
    shape = {"n_head": cfg.model.n_head, "d_k": cfg.model.head_dim, "d_model": cfg.model.d_model}
    shape |= {"n_layer": cfg.model.n_layer, "block_size": cfg.model.block_size, "params": model.num_params()}
    shape |= {"train_block_size": cfg.model.train_length}
    shape |= {"params_non_embedding": model.num_params(exclude_embeddings=True)}
    shape |= {"flops_per_token": model.flops_per_token(), "tokens_per_step": trainer.tokens_per_step}
    shape |= {"world_size": trainer.dist.world_size, "threads": torch.get_num_threads()}  # what tokens/s and MFU count

    def start() -> None:
        peak = peak_flops(trainer.device, trainer.precision) * trainer.dist.world_size
        trainer.run.start(asdict(cfg), trainer.state, shape, peak)
        log.info("%s", run_header(trainer))

    distributed.on_main(start, trainer.dist)


def warn_if_dropout_across_ranks(cfg: TrainConfig, dist: DistInfo) -> None:
    """Once, where several processes train with dropout: each draws masks for its part of a micro-batch, so the
    run matches one process in distribution, not step for step, as it does without dropout (docs/guide.md)."""
    if dist.world_size > 1 and dist.is_main and (cfg.model.dropout > 0 or cfg.model.attention_dropout > 0):
        log.warning(
            "with dropout (model.dropout=%g, attention %g), %d processes draw other masks than one process would: "
            "the losses match one process's in distribution, not step for step",
            cfg.model.dropout,
            cfg.model.attention_dropout,
            dist.world_size,
        )


def warn_if_busy(cfg: TrainConfig, dist: DistInfo) -> None:
    """Once, at the start of a budget_s run on a machine with other work (a load average above its cores):
    such a run does fewer steps and ends far from a quiet machine's figure, which nothing else would say."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if cfg.budget_s and dist.is_main and load > cores:
        log.warning(
            "this machine is busy (load average %.1f on %d cores): a %g s budget buys fewer steps than on a quiet "
            "machine; for a result that does not depend on the load, train max_steps=N budget_s=null",
            load,
            cores,
            cfg.budget_s,
        )


def run_header(trainer: Trainer) -> str:
    """The few facts a person checks before walking away from a run (the rest is in RUN/config.yaml)."""
    cfg, m = trainer.cfg, trainer.model.config
    ends = [f"{cfg.max_steps} steps" if cfg.max_steps else "", f"{cfg.budget_s:g} s budget" if cfg.budget_s else ""]
    start = f", resumed at step {trainer.state.step}" if trainer.state.step else ""
    context = f" (context {m.block_size})" if m.train_length < m.block_size else ""  # train short, score long
    heads = f"{m.n_head} {'head' if m.n_head == 1 else 'heads'} x d_k {m.head_dim}"
    ranks = trainer.dist.world_size
    cpu_threads = f" | {threads.summary()}" if trainer.device.type == "cpu" else ""  # how its OpenMP threads wait
    processes = f" x {ranks} processes ({cfg.distributed.strategy})" if ranks > 1 else ""  # tokens/s are all of theirs
    return (
        f"model {trainer.model.num_params() / 1e6:.2f}M params ({m.n_layer} layers, d_model {m.d_model}, "
        f"{heads}) | data {cfg.data.source}/{trainer.data.tokenizer_meta['name']} "
        f"({m.vocab_size} tokens) | {trainer.device}{processes} {trainer.precision}"
        f"{' compiled' if trainer.compiled else ''}{cpu_threads} | "
        f"{' or '.join(e for e in ends if e)}, "
        f"{trainer.tokens_per_step:,} tokens/step in sequences of {m.train_length}{context}{start}\n"
        f"run directory {cfg.out_dir} (full config: config.yaml)"
    )


# -- checks before any work ---------------------------------------------------------------------------------


def check_data_fits(data: PreparedData, model: GPTConfig, batch_size: int) -> None:
    """The vocabulary fits the model, each split holds one batch, and every token id is in range."""
    vocab = data.vocab_size
    if model.vocab_size is not None and model.vocab_size < vocab:
        raise ValueError(f"model.vocab_size={model.vocab_size} is smaller than the tokenizer's vocabulary ({vocab})")
    need = batch_size * model.train_length + 1
    for split in ("train", "val"):
        tokens = getattr(data, split)
        if len(tokens) < need:
            documents = data.meta.get("num_documents") or {}
            if data.meta.get("split_by") == "bytes":  # data/split.py: val_fraction of the bytes, a document cut
                by_document = f" (split by bytes: data.val_fraction={data.meta['val_fraction']} of the text held out)"
            elif isinstance(documents, dict) and {"train", "val"} <= documents.keys():  # 2 files: half the text in val
                by_document = f" (the split is by document: {documents['train']} train, {documents['val']} val)"
            else:
                by_document = ""
            raise ValueError(
                f"the {split} split has {len(tokens)} tokens{by_document}, fewer than one batch needs "
                f"(batch_size={batch_size} x {model.train_length} tokens a sequence + 1 = {need}); "
                "use more data or a smaller batch_size / model.block_size (model.train_block_size)"
            )
        top = max_token(tokens)
        if top >= vocab:
            raise ValueError(
                f"the {split} split holds token id {top}, outside the vocabulary [0, {vocab}); "
                f"the prepared data in {data.directory} is corrupt: delete it to prepare again"
            )


def max_token(tokens: np.ndarray) -> int:
    return max(int(tokens[i : i + SCAN_CHUNK].max()) for i in range(0, len(tokens), SCAN_CHUNK))


def sample_prompt_ids(data: PreparedData, prompt: str, sample_tokens: int) -> list[int]:
    """The end-of-run sample's prompt ids, checked now rather than after training ([] when no sample)."""
    if sample_tokens == 0:
        return []
    if not prompt:
        return [data.tokenizer.eot_id]  # the default: start the sample as a new document starts
    try:
        return encode_prompt(data.tokenizer, prompt, data.vocab_size)
    except ValueError as e:
        raise ValueError(f"sample_prompt={prompt!r}: {e}") from None


def check_fits_in_memory(model: GPTConfig, device: torch.device) -> None:
    """Refuse a model whose weights, gradients and AdamW state (16 bytes/parameter) exceed the memory."""
    with torch.device("meta"):
        params = GPT(model).num_params()
    need = 16 * params
    have = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else host_memory()
    if need > have:
        raise ValueError(
            f"the model has {params / 1e6:,.0f}M parameters and needs about {need / 2**30:,.1f} GiB to train; "
            f"this {device.type} has {have / 2**30:,.1f} GiB: make model.d_model / model.n_layer smaller"
        )


# -- the end of a run ---------------------------------------------------------------------------------------


def print_sample(trainer: Trainer, prompt_ids: list[int]) -> None:
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
        params = SamplingParams(max_new_tokens=cfg.sample_tokens, seed=cfg.seed)  # scripts/sample.py's defaults
        sampled = model.to(trainer.device).eval()
        with torch_threads(decode_threads(sampled)):  # one thread for a small model's decode: fast on a busy CPU
            text = "".join(stream_text(sampled, trainer.data.tokenizer, prompt_ids, params, trainer.device))
        print(f"\n--- sample ---\n{cfg.sample_prompt}{text}\n--------------")

    distributed.on_main(show, trainer.dist)


def plot_run(out_dir: Path) -> None:
    """RUN/plots.png: losses, lr and tokens/s against step and wall time (scripts/plot_run.py)."""
    try:
        plot_runs([out_dir], out_dir / "plots.png")
    except (OSError, ValueError) as e:  # a plot is a convenience: it never fails a finished run
        log.warning("no plots.png: %s", e)
