"""Checkpoints as one safetensors file: tensors plus a JSON header, never pickle.

A file holds the model weights (`model.*`), the optimizer state (`optim.*`), the RNG states
(`rng.*`) and, in the header, the resolved config, tokenizer identity, step and the rest of the
run state. Under weight averaging `model.*` is the average (the run's result, which inference reads) and
`train.*` the weights training continues from. A SHA-256 over the header and every tensor's bytes is
stored beside them, so a truncated, bit-flipped or hand-edited file is refused (integrity, not
authentication: anyone can recompute it). The file is written to a temporary file, fsynced and renamed,
so a crash at any instant leaves the previous checkpoint whole.
"""

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.torch
import torch
from torch import Tensor, nn

from data.text_file import NotJSON, loads_json
from rundir.files import atomic_write_bytes

FORMAT = "attnlab-checkpoint"
FORMAT_VERSION = 2  # 2: adds the sha256 digest
WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # added by torch.compile and DDP


@dataclass
class Checkpoint:
    meta: dict[str, Any]
    tensors: dict[str, Tensor]

    def section(self, prefix: str) -> dict[str, Tensor]:
        return {k[len(prefix) :]: v for k, v in self.tensors.items() if k.startswith(prefix)}


def strip_wrapper_prefixes(name: str) -> str:
    """'_orig_mod.module.wte.weight' -> 'wte.weight'; only leading wrapper names are removed."""
    while name.startswith(WRAPPER_PREFIXES):
        name = name.split(".", 1)[1]
    return name


def clean_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """State dict without wrapper prefixes, each shared (tied) tensor stored once."""
    out: dict[str, Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        out[strip_wrapper_prefixes(name)] = tensor.detach().cpu().contiguous()
    return out


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under torch.compile / DDP wrappers."""
    while hasattr(model, "_orig_mod") or hasattr(model, "module"):
        model = getattr(model, "_orig_mod", None) or model.module
    return model


def capture_rng_state() -> tuple[dict[str, Tensor], dict[str, Any]]:
    """torch's streams as tensors; Python's and NumPy's (which a user's change may draw from) in the header."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    tensors = {"rng.torch": torch.get_rng_state()} | {f"rng.cuda.{i}": state for i, state in enumerate(cuda)}
    py_version, py_state, py_gauss = random.getstate()
    np_state = np.random.get_state()
    return tensors, {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
    }


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
    # JSON turned tuples such as AdamW's betas into lists; `params` is the one real list.
    groups = [
        {k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in group.items()}
        for group in ckpt.meta["optim_param_groups"]
    ]
    saved, now = group_layout(groups), group_layout(optimizer.param_groups)
    if any(role is None for role, _ in saved):  # a checkpoint from before groups had roles: their sizes alone
        saved, now = [size for _, size in saved], [size for _, size in now]
    if saved != now:  # torch would load it, and the first step would fail or update the wrong tensors
        raise ValueError(f"the checkpoint's optimizer groups {saved} are not this run's {now}; resume with its config")
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def group_layout(groups: list[dict]) -> list[tuple[str | None, int]]:
    """Each optimizer group's role and size: what a saved state must match to be loaded into an optimizer."""
    return [(group.get("role"), len(group["params"])) for group in groups]


def digest(header: str, tensors: dict[str, Tensor]) -> str:
    """SHA-256 over the JSON header and each tensor's name, dtype, shape and raw bytes."""
    h = hashlib.sha256(header.encode())
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())  # bf16 has no numpy dtype
    return h.hexdigest()


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    meta: dict,
    averaged: dict[str, Tensor] | None = None,
) -> Path:
    """Write model + optimizer + RNG + meta atomically to `path`; with `averaged` (a weight average's state
    dict), that is stored as the model and `model`'s own weights as `train.*`."""
    path = Path(path)
    weights = clean_state_dict(model)
    tensors = {f"model.{k}": v for k, v in (weights if averaged is None else averaged).items()}
    if averaged is not None:
        tensors |= {f"train.{k}": v for k, v in weights.items()}
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, **meta}
    if optimizer is not None:
        optim_tensors, param_groups = optimizer_tensors(optimizer)
        tensors.update(optim_tensors)
        meta["optim_param_groups"] = param_groups
    rng_tensors, meta["rng"] = capture_rng_state()
    tensors.update(rng_tensors)
    header = json.dumps(meta)
    metadata = {"attnlab": header, "attnlab_sha256": digest(header, tensors)}
    atomic_write_bytes(path, safetensors.torch.save(tensors, metadata=metadata))
    return path


def looks_like_pickle(head: bytes) -> bool:
    """A pickle (protocol 2-5) or torch.save zip, named rather than called a damaged safetensors file
    (whose 8-byte header length may start with 0x80 too, but is followed by its JSON header's `{`)."""
    if head.startswith(b"PK\x03\x04"):
        return True
    return head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05") and head[8:9] != b"{"


def read_header(path: str | Path) -> tuple[dict, list[str]]:
    """A checkpoint's attnlab meta and tensor names from its header alone, no weights read and nothing checked
    (load_checkpoint checks); safetensors' own error for a damaged file, KeyError/ValueError for a foreign one."""
    with safetensors.safe_open(str(path), framework="pt") as f:
        return loads_json((f.metadata() or {})["attnlab"], f"checkpoint {str(path)!r} header"), list(f.keys())


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint; refuse anything that is not a whole, unmodified attnlab checkpoint. Only
    safetensors parses the file: no pickle is ever loaded, so a crafted file runs nothing."""
    path, where = Path(path), f"checkpoint {str(path)!r}"
    if not path.is_file():
        raise FileNotFoundError(f"{where} does not exist")
    for _ in range(READ_TRIES - 1):
        opened = file_identity(path)
        try:
            return read_checkpoint(path, where)
        except ValueError:
            if file_identity(path) == opened:  # the file it read is damaged, not replaced meanwhile
                raise
    return read_checkpoint(path, where)


# safetensors opens the path twice (its header, then the weights): a live run's best.safetensors replaced between
# the two paired one file's header with the other's weights, read as "fails its sha256 check" (9 in 6,000 loads)
READ_TRIES = 3


def file_identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def read_checkpoint(path: Path, where: str) -> Checkpoint:
    """One read of the checkpoint file at `path` (load_checkpoint's checks)."""
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
    except Exception as e:  # safetensors raises several types for truncated/corrupt files
        with open(path, "rb") as f:
            if looks_like_pickle(f.read(9)):
                raise ValueError(f"{where} is a pickle/torch.save file; only attnlab safetensors load") from None
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{where} is corrupt or not a safetensors file ({msg})") from None
    header = metadata.get("attnlab") or "null"
    try:
        meta = loads_json(header, where)
    except NotJSON:  # not JSON, or nested past any header's depth
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{where} is not an attnlab checkpoint (no {FORMAT!r} header)")
    if meta.get("format_version") != FORMAT_VERSION:
        version = meta.get("format_version")
        raise ValueError(f"{where} has format version {version}; this code reads version {FORMAT_VERSION}")
    if metadata.get("attnlab_sha256") != digest(header, tensors):
        raise ValueError(f"{where} fails its sha256 check: it was modified or damaged after saving")
    return Checkpoint(meta=meta, tensors=tensors)


def load_model_weights(model: nn.Module, ckpt: Checkpoint, section: str = "model.") -> None:
    """Load weights (`section`: "train." for the ones training continues from); only tied copies may be absent
    from the file."""
    target = unwrap(model)
    weights = ckpt.section(section)
    expected = target.state_dict()
    for name, tensor in weights.items():
        if name in expected and expected[name].shape != tensor.shape:
            raise ValueError(
                f"checkpoint weight {name} has shape {tuple(tensor.shape)}; the model has {tuple(expected[name].shape)}"
            )
    missing, unexpected = target.load_state_dict(weights, strict=False)
    tied = dict(target.named_parameters(remove_duplicate=False)).keys() - dict(target.named_parameters()).keys()
    if unexpected or set(missing) - tied:
        missing = sorted(set(missing) - tied)
        raise ValueError(f"checkpoint weights do not fit the model: missing {missing}, unexpected {sorted(unexpected)}")
