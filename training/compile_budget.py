"""Whether compiling can pay for itself within a run's budget, and where compiled kernels are kept.

Compiled kernels are cached across runs under the attnlab cache (<cache>/inductor: inductor's FX graph cache and
AOT autograd's cache, on by default in torch 2.13, written to TORCHINDUCTOR_CACHE_DIR, which a user's setting
overrides). A second compile of the same shape then skips C++ builds, though dynamo still traces.

A budget_s run compiles only where the time compiling takes comes back within the budget: with compile seconds
C, a compiled step `speedup` times the eager one's rate, and B seconds to train, compiling trains more steps
only if (B - C) x speedup > B, that is B > C x speedup / (speedup - 1). C and the speedup are what earlier runs
of this shape on this machine recorded (<cache>/compile_times.json), else COLD_COMPILE_S and DEFAULT_SPEEDUP
(budget_s=60 on a fresh cache compiled for 71 s and trained 1 step, against 31 eager, on a busy 2-core Zen 4).
"""

import hashlib
import json
import logging
import os
import statistics
from dataclasses import asdict
from pathlib import Path

import torch

from data.config import resolve_cache_dir
from rundir.files import atomic_write_bytes
from training.config import TrainConfig
from training.runtime import device_name

log = logging.getLogger(__name__)

COLD_COMPILE_S = 50.0  # a first compile of the default model on a 2-core CPU took 31-37 s quiet, up to 71 s busy
WARM_COMPILE_S = 10.0  # a compile whose kernels are cached (~7 s on a Zen 4), until a run records its own
DEFAULT_SPEEDUP = 1.29  # compiled over eager steps a second of the default model (configs/config.yaml's note)
RECORDS = "compile_times.json"


def kernel_cache_dir() -> Path:
    """Where inductor keeps compiled kernels: the user's TORCHINDUCTOR_CACHE_DIR, else <attnlab cache>/inductor."""
    return Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or resolve_cache_dir() / "inductor")


def use_kernel_cache() -> None:
    """Point inductor's caches at kernel_cache_dir(); inductor reads the variable when it first compiles."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(kernel_cache_dir())


def shape_key(cfg: TrainConfig, device: torch.device) -> str:
    """What a compiled graph depends on: the model, the batch, the precision, the machine, torch, the kernel cache."""
    what = {"model": asdict(cfg.model), "batch": cfg.batch_size, "precision": cfg.precision, "optim": asdict(cfg.optim)}
    what |= {"device": device_name(device), "threads": torch.get_num_threads(), "torch": torch.__version__}
    what |= {"kernels": str(kernel_cache_dir())}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_records(path: Path | None = None) -> dict:
    try:
        records = json.loads((path or resolve_cache_dir() / RECORDS).read_text())
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


def estimate(record: dict) -> tuple[float, float, str]:
    """(compile seconds, compiled/eager speedup, where the compile figure comes from) for one shape's record."""
    if "warm_compile_s" in record:
        compile_s, source = record["warm_compile_s"], "as this shape's last compile took"
    elif "cold_compile_s" in record:
        compile_s, source = WARM_COMPILE_S, "its kernels cached by an earlier run"
    else:
        compile_s, source = COLD_COMPILE_S, "a first compile of this shape on this machine"
    eager, compiled = record.get("eager_step_s"), record.get("compiled_step_s")
    speedup = eager / compiled if eager and compiled else DEFAULT_SPEEDUP
    return compile_s, speedup, source


def skip_reason(budget_s: float | None, record: dict) -> str | None:
    """One line saying why compiling cannot pay for itself within `budget_s`, or None where it can (or no budget)."""
    if not budget_s:
        return None
    compile_s, speedup, source = estimate(record)
    pays_after = compile_s * speedup / (speedup - 1) if speedup > 1 else float("inf")
    if budget_s > pays_after:
        return None
    return (
        f"training eager, not compiled: compiling takes ~{compile_s:.0f} s ({source}) and the compiled step is "
        f"~{speedup:.2f}x the eager one, which pays back only in a budget_s above {pays_after:.0f} s (this run's: "
        f"{budget_s:g} s)"
    )


def skip_for_budget(cfg: TrainConfig, device: torch.device) -> str | None:
    """skip_reason for this run where its length is its budget_s (not max_steps), else None; points inductor at the
    kernel cache first."""
    if not cfg.compile:
        return None
    use_kernel_cache()  # every compile, budget or not
    if cfg.max_steps or not cfg.budget_s:
        return None
    return skip_reason(cfg.budget_s, read_records().get(shape_key(cfg, device), {}))


def record_run(
    cfg: TrainConfig,
    device: torch.device,
    compiled: bool,
    compile_s: float,
    tokens_per_step: int,
    throughputs: list[float],
    path: Path | None = None,
) -> None:
    """Note this run's compile seconds and median step time for its shape, for the next run's estimate."""
    path = path or resolve_cache_dir() / RECORDS
    step_s = tokens_per_step / statistics.median(throughputs) if throughputs else None
    records, key = read_records(path), shape_key(cfg, device)
    record = records.setdefault(key, {})
    if compiled:
        record["warm_compile_s" if "cold_compile_s" in record else "cold_compile_s"] = round(compile_s, 2)
    if step_s:
        record["compiled_step_s" if compiled else "eager_step_s"] = step_s
    try:
        atomic_write_bytes(path, (json.dumps(records, indent=2) + "\n").encode())
    except OSError as e:  # a read-only cache: the next run estimates from the defaults
        log.debug("compile times not recorded: %s", e)
