"""Device and numeric-precision set-up, shared by training, sampling and benchmarks."""

import contextlib

import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' picks CUDA, then Apple MPS, then CPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"device={name!r} is invalid; use auto, cpu, cuda, cuda:N or mps") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} was asked for but CUDA is not available; use device=auto or cpu")
    return device


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


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed-precision context: matmuls in bf16/fp16, reductions and weights stay fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)
