"""Model FLOPs utilisation against the *measured* matmul peak of this device, not a datasheet.

MFU = FLOPs per token (from the model) x tokens per second / peak FLOP/s. The peak is the median
rate of large square matmuls in the run's dtype, measured once per (device, dtype, threads, torch
version) and cached as JSON, so a run pays for it once (about a second on a CPU).
"""

import json
import logging
import platform
import statistics
import time
from pathlib import Path

import torch

from data.config import resolve_cache_dir

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or platform.machine()
    return device.type


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_matmul_peak(device: torch.device, precision: str, sizes: tuple[int, ...] = (), repeats: int = 10) -> float:
    """FLOP/s of the fastest of several square-matmul sizes, each the median of `repeats` runs."""
    dtype = DTYPES[precision]
    sizes = sizes or ((4096, 8192) if device.type == "cuda" else (1024, 2048))
    best = 0.0
    for n in sizes:
        g = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
        b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
        for _ in range(3):  # warm up kernels and caches
            a @ b
        times = []
        for _ in range(repeats):
            _sync(device)
            start = time.perf_counter()
            a @ b
            _sync(device)
            times.append(time.perf_counter() - start)
        best = max(best, 2 * n**3 / statistics.median(times))
    return best


def peak_cache_key(device: torch.device, precision: str) -> str:
    return f"{device_name(device)}|{precision}|threads={torch.get_num_threads()}|torch={torch.__version__}"


def peak_flops(device: torch.device, precision: str, cache_file: Path | None = None, remeasure: bool = False) -> float:
    """Measured matmul peak for this device and precision, cached across runs."""
    cache_file = cache_file or resolve_cache_dir() / "peak_flops.json"
    key = peak_cache_key(device, precision)
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    if remeasure or key not in cache:
        cache[key] = measure_matmul_peak(device, precision)
        log.info("measured %s matmul peak on %s: %.3f TFLOP/s", precision, device_name(device), cache[key] / 1e12)
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache, indent=2) + "\n")
        tmp.replace(cache_file)
    return cache[key]


def mfu(flops_per_token: float, tokens_per_s: float, peak: float) -> float:
    """Fraction of the measured peak the model's useful FLOPs reach."""
    return flops_per_token * tokens_per_s / peak
