"""Per-run records for sweeps: `run_info.json` when training starts, `summary.json` when it ends.

A run directory with run_info.json but no summary.json crashed or is still running; the ablation
report (analysis/sweep.py) lists such runs instead of dropping them.
"""

import json
import statistics
from pathlib import Path
from typing import Any

from model import GPT
from training.checkpoint import atomic_write_bytes

RUN_INFO = "run_info.json"
SUMMARY = "summary.json"


def write_json(path: Path, record: dict[str, Any]) -> None:
    atomic_write_bytes(path, (json.dumps(record, indent=2) + "\n").encode())


def write_run_info(out_dir: Path, model: GPT, config: dict[str, Any], tokens_per_step: int) -> dict[str, Any]:
    """Shape, size and cost of the run, with its resolved config; clears an older summary."""
    c = model.config
    record = {
        "n_head": c.n_head,
        "d_k": c.head_dim,
        "d_model": c.d_model,
        "n_layer": c.n_layer,
        "block_size": c.block_size,
        "params": model.num_params(),
        "params_non_embedding": model.num_params(exclude_embeddings=True),
        "flops_per_token": model.flops_per_token(),
        "tokens_per_step": tokens_per_step,
        "max_steps": config["max_steps"],
        "seed": config["seed"],
        "fairness": config["fairness"]["mode"],
        "config": config,
    }
    (Path(out_dir) / SUMMARY).unlink(missing_ok=True)  # a resumed run is unfinished until it ends again
    write_json(Path(out_dir) / RUN_INFO, record)
    return record


def write_summary(
    out_dir: Path,
    metrics: dict[str, Any],
    step: int,
    best_val_loss: float,
    tokens_per_s: list[float],
    train_seconds: float,
    flops_per_token: int,
    tokens_per_step: int,
) -> dict[str, Any]:
    """Final metrics and speed of a finished run; tokens/s is the median over logging intervals."""
    record = {
        "status": "completed",
        "step": step,
        "best_val_loss": best_val_loss,
        "tokens_per_s": statistics.median(tokens_per_s) if tokens_per_s else None,
        "train_seconds": train_seconds,
        "train_flops": flops_per_token * tokens_per_step * step,
        **metrics,
    }
    write_json(Path(out_dir) / SUMMARY, record)
    return record
