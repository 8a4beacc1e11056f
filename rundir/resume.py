"""Run state across restarts: what a checkpoint records about the run, the checks that a checkpoint
fits this run (tokenizer, vocabulary, architecture), and restoring weights, optimizer and counters.

Batches are a pure function of (seed, step, micro_step) (data/batches.py) and checkpoints are only
written between optimizer steps, so the step is the data position and the accumulation position
is always 0. RNG states are restored by the caller just before the first step.
"""

import json
import logging
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from data.prepare import PreparedData
from model.gpt import GPTConfig
from rundir import checkpoint as ckpt_io

log = logging.getLogger(__name__)

# Every GPTConfig field must match on resume, except these, which change how the same function is
# computed or regularised, not which function the weights define:
RESUMABLE_MODEL_FIELDS = {
    "attn_backend",  # explicit / sdpa / materialized compute the same attention (tests prove it)
    "dropout",  # regularisation only; the weights mean the same with or without it
}
# Allowed to change on resume, but then the run no longer matches an uninterrupted one.
TRAJECTORY_KEYS = ("seed", "batch_size", "grad_accum_steps", "global_batch_size", "max_steps", "optim", "precision")


@dataclass
class RunState:
    step: int = 0  # optimizer steps done; also the LR-schedule step and the data position
    best_val_loss: float = math.inf
    skipped_steps: int = 0  # non-finite steps dropped under on_nonfinite=skip
    wandb_run_id: str | None = None
    elapsed_s: float = 0.0  # training wall-clock so far: a budget_s run resumes its schedule from here

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> "RunState":
        return cls(**{k: meta[k] for k in asdict(cls()) if k in meta})


def checkpoint_meta(state: RunState, config: dict[str, Any], data: PreparedData, metrics: dict) -> dict[str, Any]:
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
        return f"bpe ({len(json.loads(meta['spec'])['model']['vocab'])} ids)"
    return repr(meta.get("name"))


def check_compatible(ckpt: ckpt_io.Checkpoint, path: Path, config: dict[str, Any], data: PreparedData) -> None:
    """Refuse a checkpoint this run (its whole config, as a dict) cannot continue; warn where it continues
    on a different trajectory."""
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
    changed = [key for key in TRAJECTORY_KEYS if saved.get(key) != config.get(key)]
    if ckpt.meta.get("data_fingerprint") != data.fingerprint:
        changed.append("data")
    if changed:
        log.warning("resuming with a different %s: the run continues, but not as the original would have", changed)


def check_same_model(saved: dict[str, Any], model: dict[str, Any], where: str) -> None:
    """Every GPTConfig field (derived from the dataclass, so a new knob is covered) must match, but the
    RESUMABLE_MODEL_FIELDS; a field the checkpoint predates must still be at its default."""
    defaults = asdict(GPTConfig())
    for f in fields(GPTConfig):
        if f.name in RESUMABLE_MODEL_FIELDS:
            continue
        then, now = saved.get(f.name, defaults[f.name]), model[f.name]
        if then != now:
            raise ValueError(
                f"{where} has model.{f.name}={then!r} but this run has model.{f.name}={now!r}; "
                "resume with the checkpoint's model config"
            )


def restore(
    path: Path, config: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer, data: PreparedData
) -> tuple[RunState, ckpt_io.Checkpoint]:
    """Weights, optimizer state and counters from `path` into this run (`config`: its whole config as a
    dict); RNG states are restored by the caller, just before the first step."""
    ckpt = ckpt_io.load_checkpoint(path)
    check_compatible(ckpt, path, config, data)
    ckpt_io.load_model_weights(model, ckpt)
    ckpt_io.restore_optimizer(optimizer, ckpt)
    state = RunState.from_meta(ckpt.meta)
    log.info("resuming from %s at step %d", path, state.step)
    return state, ckpt
