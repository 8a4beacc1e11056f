"""Where and how a run computes, and how its process stops: device and precision choice, the autocast
context, torch.compile as a switch that can never break a run, the measured matmul peak of this device
(for MFU), and SIGTERM/SIGINT, whose handler only sets a flag: the loop finishes its step, saves and
exits with 128 + signal (a second Ctrl-C interrupts at once).

MFU (rundir.records.mfu) = FLOPs per token x tokens per second / this peak, never above 1 (a run faster than
the peak raises the peak to its own rate). The peak is the median rate of large matmuls in the run's dtype,
measured per (device, dtype, threads, torch version) and cached as JSON with when and beside what load it was
measured (about a second on a CPU); measured again where that load was high or the figure is a week old.
"""

import contextlib
import ctypes
import json
import logging
import platform
import signal
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType

import torch
from torch import nn

from data.config import resolve_cache_dir
from data.text_file import read_json_object
from rundir.files import atomic_write_bytes
from training.threads import CpuLoad

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' picks CUDA, then Apple MPS, then CPU; anything else must be a device this machine has."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    invalid = f"device={name!r} is invalid; use auto, cpu, cuda, cuda:N or mps"
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(invalid) from e
    if device.type not in ("cpu", "cuda", "mps"):  # torch knows meta, xla, hpu...: a run crashed on them late
        raise ValueError(invalid)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} was asked for but CUDA is not available; use device=auto or cpu")
    if device.type == "cuda" and (device.index or 0) >= (count := torch.cuda.device_count()):
        raise ValueError(
            f"device={name!r} is not here: this machine has {count} CUDA devices (cuda:0 to cuda:{count - 1})"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={name!r} was asked for but Apple MPS is not available; use device=auto or cpu")
    return device


# glibc's mallopt parameters (malloc.h): no block is served by mmap, and freed memory is never trimmed.
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4


def keep_freed_memory() -> bool:
    """Make glibc keep the memory a step frees for the next step, instead of handing it back to the kernel.

    glibc serves a large block (the default's 25 MB fp32 logits and their gradient, among others) with a
    fresh mmap and unmaps it on free, so every step starts on new pages that the kernel faults in and
    zeroes one by one: 22,700 page faults a step at the default, about a quarter of its time on a 2-core
    Zen 4 (docs/evidence/recipe/round4.md). Serving every block from the heap and never trimming it takes that to
    none; the price is that a process keeps its peak memory until it exits, which a training run does
    anyway. Process-wide and idempotent; False where the C library is not glibc (macOS, musl), which
    keeps its own policy.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)  # the C library this process already runs on
        never = 2**31 - 1  # mallopt takes a C int
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, never))
    except (OSError, AttributeError):
        return False


def cpu_supports_bf16() -> bool:
    """True where the CPU has native bf16 matmul (AVX512-BF16 or AMX), so autocast pays off."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def resolve_precision(precision: str, device: torch.device) -> str:
    """'auto': bf16 where the hardware does it natively, fp16 on older CUDA GPUs, else fp32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is unknown; choose one of: {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if device.type == "cpu" and cpu_supports_bf16():
        return "bf16"
    return "fp32"


def check_precision_runs(precision: str, device: torch.device) -> None:
    """Refuse a precision this CPU has no fast kernels for: fp16 on any CPU, bf16 on one without AVX512-BF16
    or AMX, which emulates it (a default-model step took 11.7 s against fp32's 0.18 on a 2-core AVX2 EPYC, and
    the MFU probe minutes), with nothing to say why. A bare Trainer still allows them, so the loss-scaler
    logic can be tested on a CPU."""
    if device.type != "cpu" or precision not in ("fp16", "bf16"):
        return
    native_bf16 = cpu_supports_bf16()
    if precision == "bf16" and native_bf16:
        return
    fast = "auto (bf16 on this CPU), bf16 or fp32" if native_bf16 else "auto (fp32 on this CPU) or fp32"
    where = "a CPU" if precision == "fp16" else "this CPU (no AVX512-BF16 or AMX: it emulates bf16)"
    raise ValueError(f"precision={precision} has no fast kernels on {where}; a step takes ~60x fp32's: use {fast}")


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed-precision context: matmuls in bf16/fp16, reductions and weights stay fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def compile_or_eager(model: nn.Module, trial_step: Callable[[nn.Module], None]) -> nn.Module:
    """`torch.compile(model)`, or `model` itself if compiling fails.

    Compilation is lazy, so a broken toolchain (no C++ compiler, an unsupported op) would only
    surface mid-run. `trial_step` runs one forward/backward through the compiled model here, where
    a failure can still fall back; its gradients are discarded and the RNG state is restored, so the
    run is the same as if the trial never happened.
    """
    rng_state = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        compiled = compile_trusting_the_cpu(model, trial_step)
    except Exception as e:  # any compiler failure: the eager model is always a correct answer
        log.warning("torch.compile failed (%s); training in eager mode", first_line(e))
        compiled = model
    finally:
        model.zero_grad(set_to_none=True)
        torch.set_rng_state(rng_state)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    return compiled


def first_line(e: BaseException) -> str:
    """An error as one line: inductor's run to pages with advice, and a cut at 300 characters split them mid-line
    over a warning's several lines; a PermissionError (a read-only TORCHINDUCTOR_CACHE_DIR) names its file."""
    inner = inner_error(e)
    line = (str(inner).strip().splitlines() or [""])[0]
    return f"{type(inner).__name__}: {line[:300]}"


def inner_error(e: BaseException) -> BaseException:
    """The error inductor wrapped (its InductorError keeps it as inner_exception), else `e`."""
    inner = getattr(e, "inner_exception", None)
    return inner if isinstance(inner, BaseException) else e


def compile_trusting_the_cpu(model: nn.Module, trial_step: Callable[[nn.Module], None]) -> nn.Module:
    """`torch.compile(model)`, tried on one step, its C++ kernels vectorized for the ISA the CPU reports.

    Inductor otherwise compiles and loads a test program for each vector ISA the CPU lists before its first
    kernel (`cpp.vec_isa_ok` unset), in every run with an empty cache: trusting the list took a median of 10.9 s
    off a first run's compilation on the 2-core Xeon, the same ISA chosen (docs/evidence/recipe/round15.md). What those
    checks guard against, a compiler that cannot build for an ISA the CPU has, fails the trial step here
    instead, and then this compiles again with them. A TORCHINDUCTOR_VEC_ISA_OK the user set wins."""
    from torch._inductor import config as inductor
    from torch._inductor import cpu_vec_isa

    trusting = inductor.cpp.vec_isa_ok is None
    if trusting:
        inductor.cpp.vec_isa_ok = True
    try:
        compiled = torch.compile(model)
        trial_step(compiled)
        return compiled
    except Exception as e:
        if not trusting or isinstance(inner_error(e), PermissionError):  # its cache folder: no ISA check helps
            raise
        log.info("compiling again with inductor's vector ISA checks (%s)", first_line(e))
        inductor.cpp.vec_isa_ok = None
        cpu_vec_isa.valid_vec_isa_list.cache_clear()
        torch._dynamo.reset()
    compiled = torch.compile(model)
    trial_step(compiled)
    return compiled


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


# (m, k, n) matmuls to take the best of. On CPU a square one alone reads low for bf16: oneDNN's AMX
# kernels ran a (16384, 512) @ (512, 512) faster (0.9-1.8 against 0.6-0.75 TFLOP/s on a
# 2-core Xeon), and that tall shape is what a model's linears are (tokens x d_model @ d_model x d_ff).
PEAK_SHAPES = {"cuda": ((4096, 4096, 4096), (8192, 8192, 8192)), "cpu": ((2048, 2048, 2048), (16384, 512, 512))}
PEAK_PROBE = 2  # in the cache key: a cached peak from another probe is measured again


def measure_matmul_peak(
    device: torch.device, precision: str, shapes: tuple[tuple[int, int, int], ...] = (), repeats: int = 10
) -> float:
    """FLOP/s of the fastest of several (m, k, n) matmul shapes, each the median of `repeats` runs."""
    dtype = DTYPES[precision]
    shapes = shapes or PEAK_SHAPES["cuda" if device.type == "cuda" else "cpu"]
    best = 0.0
    for m, k, n in shapes:
        g = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(m, k, device=device, dtype=dtype, generator=g)
        b = torch.randn(k, n, device=device, dtype=dtype, generator=g)
        for _ in range(3):  # warm up kernels and caches
            a @ b
        times = []
        for _ in range(repeats):
            _sync(device)
            start = time.perf_counter()
            a @ b
            _sync(device)
            times.append(time.perf_counter() - start)
        best = max(best, 2 * m * k * n / statistics.median(times))
    return best


def peak_cache_key(device: torch.device, precision: str) -> str:
    return (
        f"{device_name(device)}|{precision}|threads={torch.get_num_threads()}|torch={torch.__version__}"
        f"|probe={PEAK_PROBE}"
    )


PEAK_MAX_AGE_S = 7 * 24 * 3600  # the same CPU model read 0.40 and 0.84-0.94 TFLOP/s on different days
PEAK_MAX_BUSY = 0.25  # of the cores other work kept busy while the peak was measured: more, and it is measured again


def stale_peak(entry: object, now: float, cores: int) -> str | None:
    """Why a cached peak must be measured again (it reads low), or None if it holds."""
    if not isinstance(entry, dict) or not {"flops", "measured_at", "others_busy"} <= entry.keys():
        return "the cache does not say when or under what load it was measured"
    if entry["others_busy"] > PEAK_MAX_BUSY * cores:
        return f"it was measured while other work kept {entry['others_busy']:.1f} of {cores} cores busy"
    if now - entry["measured_at"] > PEAK_MAX_AGE_S:
        return f"it was measured {(now - entry['measured_at']) / 86400:.0f} days ago"
    return None


def peak_flops(device: torch.device, precision: str, cache_file: Path | None = None, remeasure: bool = False) -> float:
    """Measured matmul peak for this device and precision, cached across runs with when and beside what load it
    was measured; measured again where that load was high or the figure is old (a peak measured under load read
    0.064 TFLOP/s against 0.403 quiet, and every later run's MFU read 6.3x too high)."""
    cache_file = cache_file or resolve_cache_dir() / "peak_flops.json"
    key, cores, now = peak_cache_key(device, precision), max(1, torch.get_num_threads()), time.time()
    try:
        cache = read_json_object(cache_file)
    except (OSError, ValueError):  # absent, torn or foreign (data.text_file's bounds): measured again
        cache = {}
    if not isinstance(cache, dict):
        cache = {}
    why = "asked to" if remeasure else "none cached" if key not in cache else stale_peak(cache[key], now, cores)
    if why:
        load = CpuLoad()
        flops = measure_matmul_peak(device, precision)
        others = load.others_busy() or 0.0
        cache[key] = {"flops": flops, "measured_at": now, "others_busy": round(others, 2), "cores": cores}
        log.info(
            "measured %s matmul peak on %s: %.3f TFLOP/s (%s; other work on %.1f of %d cores)",
            precision, device_name(device), flops / 1e12, why, others, cores,
        )  # fmt: skip
        atomic_write_bytes(cache_file, (json.dumps(cache, indent=2) + "\n").encode())  # a per-process temp file
    return float(cache[key]["flops"])


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunInterrupted(Exception):
    """Raised by `train` after a signal-triggered save; `exit_code` is the shell's 128 + signum (the
    command that continues the run is the CLI's to say: it knows the overrides the run was started with)."""

    def __init__(self, signum: int, step: int, path: str, out_dir: str, finished: bool = False) -> None:
        name = signal.Signals(signum).name
        if finished:  # after the last step: the run is complete, only what follows it was cut short
            super().__init__(f"stopped by {name} after the run's last step ({step}, saved {path}); the run is "
                             "complete, its end-of-run plot and sample were skipped")  # fmt: skip
        else:
            super().__init__(f"stopped by {name} after step {step}; saved {path}")
        self.signum, self.out_dir, self.finished = signum, out_dir, finished
        self.exit_code = 128 + signum


class StopSignals:
    """Context manager; `requested` is the first stop signal received, or None."""

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS) -> None:
        self.signals = signals
        self.requested: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = signum

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
