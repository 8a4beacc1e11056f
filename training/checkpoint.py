"""Checkpoints as one safetensors file: tensors plus a JSON header, never pickle.

A file holds the model weights (`model.*`), the optimizer state (`optim.*`), the RNG states
(`rng.*`) and, in the header, the resolved config, tokenizer identity, step and the rest of the
run state. It is written to a temporary file, fsynced and renamed, so a crash at any instant
leaves the previous checkpoint whole.
"""

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.torch
import torch
from torch import Tensor, nn

FORMAT = "attnlab-checkpoint"
FORMAT_VERSION = 1
WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # added by torch.compile and DDP


@dataclass
class Checkpoint:
    meta: dict[str, Any]
    tensors: dict[str, Tensor]

    def section(self, prefix: str) -> dict[str, Tensor]:
        return {k[len(prefix) :]: v for k, v in self.tensors.items() if k.startswith(prefix)}


def clean_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """State dict without wrapper prefixes, each shared (tied) tensor stored once."""
    out: dict[str, Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        for prefix in WRAPPER_PREFIXES:
            name = name.replace(prefix, "")
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        out[name] = tensor.detach().cpu().contiguous()
    return out


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under torch.compile / DDP wrappers."""
    while hasattr(model, "_orig_mod") or hasattr(model, "module"):
        model = getattr(model, "_orig_mod", None) or model.module
    return model


def capture_rng_state() -> tuple[dict[str, Tensor], dict[str, Any]]:
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = state
    py_version, py_state, py_gauss = random.getstate()
    np_state = np.random.get_state()
    info = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
    }
    return tensors, info


def restore_rng_state(ckpt: Checkpoint) -> None:
    torch.set_rng_state(ckpt.tensors["rng.torch"])
    cuda_states = [ckpt.tensors[k] for k in sorted(ckpt.tensors) if k.startswith("rng.cuda.")]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states[: torch.cuda.device_count()])
    py_version, py_state, py_gauss = ckpt.meta["rng"]["python"]
    random.setstate((py_version, tuple(py_state), py_gauss))
    kind, keys, *rest = ckpt.meta["rng"]["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, Tensor], list[dict]]:
    state = optimizer.state_dict()
    tensors = {}
    for index, param_state in state["state"].items():
        for key, value in param_state.items():
            tensors[f"optim.{index}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    return tensors, state["param_groups"]


def restore_optimizer(optimizer: torch.optim.Optimizer, ckpt: Checkpoint) -> None:
    state: dict[int, dict[str, Tensor]] = {}
    for key, value in ckpt.section("optim.").items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": ckpt.meta["optim_param_groups"]})


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    meta: dict[str, Any],
) -> Path:
    """Write model + optimizer + RNG + meta atomically to `path`."""
    path = Path(path)
    tensors = {f"model.{k}": v for k, v in clean_state_dict(model).items()}
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, **meta}
    if optimizer is not None:
        optim_tensors, param_groups = optimizer_tensors(optimizer)
        tensors.update(optim_tensors)
        meta["optim_param_groups"] = param_groups
    rng_tensors, meta["rng"] = capture_rng_state()
    tensors.update(rng_tensors)
    payload = safetensors.torch.save(tensors, metadata={"attnlab": json.dumps(meta)})
    atomic_write_bytes(path, payload)
    return path


def atomic_write_bytes(path: Path, payload: bytes) -> None:
    """Temp file in the same directory, fsync, rename, fsync the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint; refuse anything that is not a whole attnlab checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            header = (f.metadata() or {}).get("attnlab")
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
        meta = json.loads(header) if header else None
    except Exception as e:  # safetensors raises several types for truncated/corrupt files
        raise ValueError(f"checkpoint {str(path)!r} is corrupt or not a safetensors file ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"checkpoint {str(path)!r} is not an attnlab checkpoint (no {FORMAT!r} header)")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"checkpoint {str(path)!r} has format version {meta.get('format_version')}; "
            f"this code reads version {FORMAT_VERSION}"
        )
    return Checkpoint(meta=meta, tensors=tensors)


def load_model_weights(model: nn.Module, ckpt: Checkpoint) -> None:
    """Load weights; only tied copies may be absent from the file."""
    target = unwrap(model)
    missing, unexpected = target.load_state_dict(ckpt.section("model."), strict=False)
    tied = {name for name, _ in target.named_parameters(remove_duplicate=False)} - {
        name for name, _ in target.named_parameters()
    }
    if unexpected or set(missing) - tied:
        raise ValueError(
            f"checkpoint weights do not fit the model: missing {sorted(set(missing) - tied)}, "
            f"unexpected {sorted(unexpected)}"
        )


def load_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[nn.Module, Checkpoint]:
    """A GPT rebuilt from a checkpoint's own config and weights, in eval mode (for sampling, analysis)."""
    from model import GPT, GPTConfig

    ckpt = load_checkpoint(path)
    model_cfg = ckpt.meta.get("config", {}).get("model")
    if not isinstance(model_cfg, dict):
        raise ValueError(f"checkpoint {str(path)!r} has no model config in its header")
    model = GPT(GPTConfig(**model_cfg))
    load_model_weights(model, ckpt)
    return model.to(device).eval(), ckpt
