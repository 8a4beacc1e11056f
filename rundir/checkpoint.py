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
import math
import os
import random
import re
import types
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, get_args

import numpy as np
import safetensors
import safetensors.torch
import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from data.text_file import NotJSON, error_text, loads_json
from model.config import GPTConfig
from model.gpt import GPT
from rundir.files import atomic_write_bytes

FORMAT = "attnlab-checkpoint"
FORMAT_VERSION = 2  # 2: adds the sha256 digest
WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # added by torch.compile and DDP


@dataclass
class Checkpoint:
    meta: dict[str, Any]
    tensors: dict[str, Tensor]
    path: Path | None = None  # the file it was read from, which errors name

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


def python_rng_state(rng: dict) -> tuple:
    version, state, gauss = rng["python"]
    if not (gauss is None or isinstance(gauss, float)):  # setstate takes any object, and gauss() returned it
        raise ValueError(f"its cached gauss is {clip(gauss)}, not a float or null")
    return version, tuple(state), gauss


def numpy_rng_state(rng: dict) -> tuple:
    kind, keys, *rest = rng["numpy"]
    return (kind, np.asarray(keys, dtype=np.uint32), *rest)


def restore_rng_state(ckpt: Checkpoint) -> None:
    """The streams as they were at the save; load_checkpoint restored each into a scratch generator first, so
    none of this fails after a resume has started its records."""
    torch.set_rng_state(ckpt.tensors["rng.torch"])
    cuda_states = [ckpt.tensors[k] for k in sorted(ckpt.tensors) if k.startswith("rng.cuda.")]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states[: torch.cuda.device_count()])
    random.setstate(python_rng_state(ckpt.meta["rng"]))
    np.random.set_state(numpy_rng_state(ckpt.meta["rng"]))


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, Tensor], list[dict]]:
    state = optimizer.state_dict()
    tensors = {}
    for index, param_state in state["state"].items():
        for key, value in param_state.items():
            tensors[f"optim.{index}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    return tensors, state["param_groups"]


def restore_optimizer(optimizer: torch.optim.Optimizer, ckpt: Checkpoint) -> None:
    """The checkpoint's optimizer state into `optimizer`, refused in one line unless it fits: the same groups,
    each hyperparameter of the kind this optimizer keeps, and each state tensor of the shape its parameter needs
    (torch loads a moment of any shape, and the first step read past it or broadcast it into NaNs)."""
    where = f"checkpoint {str(ckpt.path)!r}" if ckpt.path else "the checkpoint"
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
    for number, (group, live) in enumerate(zip(groups, optimizer.param_groups, strict=True)):
        check_group_fits(group, live, optimizer.defaults, f"{where}: optim_param_groups[{number}]")
        for index, param in zip(group["params"], live["params"], strict=True):
            for name, value in state.get(index, {}).items():
                need = STATE_SHAPES[name](tuple(param.shape))
                if tuple(value.shape) != need:
                    raise ValueError(
                        f"{where}: tensor optim.{index}.{name} has shape {tuple(value.shape)}; its parameter "
                        f"(group {live.get('role', number)!r}) has shape {tuple(param.shape)}, whose {name} is {need}"
                    )
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def check_group_fits(saved: dict, live: dict, defaults: dict, where: str) -> None:
    """Each hyperparameter this optimizer's group keeps is in the saved group, of the same kind: a number, a flag,
    a tuple of as many numbers; a key torch defaults itself (`defaults`), and the role, may be missing."""
    missing = [k for k in live if k not in saved and k not in defaults and k not in ("params", "role")]
    if missing:
        raise ValueError(f"{where} has no {missing[0]!r}, which this run's optimizer needs")
    for key, value in saved.items():
        if key == "params" or key not in live or value is None or live[key] is None:
            continue
        now = live[key]
        if isinstance(now, bool) or isinstance(value, bool):
            fits = isinstance(now, bool) == isinstance(value, bool)
        elif isinstance(now, (int, float)):
            fits = is_number(value)
        elif isinstance(now, tuple):
            fits = isinstance(value, tuple) and len(value) == len(now) and all(map(is_number, value))
        else:
            fits = type(value) is type(now)
        if not fits:
            raise ValueError(f"{where} has {key}={clip(value)}; this run's optimizer keeps {clip(now)} there")


# The shape of each optimizer state tensor, from its parameter's (torch's AdamW and our MuonAdamW:
# tests/unit/test_checkpoint.py saves each and checks every key is here): a step count is a scalar, a moment has
# the parameter's shape; a run saved with NorMuon (no longer an option) holds one value per row, which loads unread.
STATE_SHAPES = {
    "step": lambda shape: (),
    "exp_avg": lambda shape: shape,
    "exp_avg_sq": lambda shape: shape,
    "max_exp_avg_sq": lambda shape: shape,
    "momentum_buffer": lambda shape: shape,
    "row_second_moment": lambda shape: (*shape[:1], 1),
}


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
    ckpt = Checkpoint(meta=meta, tensors=tensors, path=path)
    check_checkpoint(ckpt, where)
    return ckpt


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


# -- a checkpoint checked against itself, before anything is built from it or restored ---------------------------


def check_checkpoint(ckpt: Checkpoint, where: str) -> None:
    """Refuse, in one line naming `where` and the field, a checkpoint that does not hold what its own header says.
    Every reader calls it (load_checkpoint does), so sample.py, the lab, scoring, export and a resume refuse the same
    files: each header field's type and range (HEADER), tensors of the names and dtypes this format writes, finite
    weights and optimizer state, RNG states that a scratch generator takes, optimizer state that fits its groups, and
    the model config against the weights' shapes, from a model built on the meta device (no memory, no weights). A
    digest proves a file whole, not sane: anyone can recompute it over a crafted header."""
    meta, tensors = ckpt.meta, ckpt.tensors
    for name, (fits, rule) in HEADER.items():
        if name in meta and not fits(meta[name]):
            raise ValueError(f"{where}: header field {name}={clip(meta[name])} is invalid; it must be {rule}")
    if isinstance(meta.get("data_position"), dict) and "step" in meta and meta["data_position"]["step"] != meta["step"]:
        raise ValueError(f"{where}: header field data_position.step differs from step ({meta['step']})")
    for name, tensor in tensors.items():
        dtype = next((d for prefix, d in TENSOR_DTYPES.items() if name.startswith(prefix)), None)
        if dtype is None or not (TENSOR_NAME.fullmatch(name)):
            raise ValueError(f"{where} holds tensor {clip(name)}, which this format never writes ({FORMAT_TENSORS})")
        if tensor.dtype != dtype:  # a load would convert it: F16 rounded, I32 truncated weights trained on silently
            raise ValueError(f"{where}: tensor {name} is {tensor.dtype}; this format writes {dtype} there")
        if dtype.is_floating_point and not bool(torch.isfinite(tensor).all()):  # a run never saves such a tensor
            raise ValueError(f"{where}: tensor {name} holds NaN or inf values; a run saves only finite ones")
    check_rng(ckpt, where)
    check_optimizer_state(ckpt, where)
    check_model(ckpt, where)


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_finite(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


def is_data_position(value: Any) -> bool:
    if not (isinstance(value, dict) and value.keys() == {"seed", "step", "micro_step"}):
        return False
    return (
        isinstance(value["seed"], int)
        and not isinstance(value["seed"], bool)
        and is_count(value["step"])
        and (is_count(value["micro_step"]) and value["micro_step"] == 0)
    )


def is_param_groups(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(g, dict) and isinstance(g.get("params"), list) and all(map(is_count, g["params"])) for g in value
    )


def clip(value: object, width: int = 60) -> str:
    """repr(value), cut to `width` characters: a header can hold a list of a million."""
    text = repr(value)
    return text if len(text) <= width else text[:width] + "..."


# Every field a checkpoint's header holds (rundir.run.checkpoint_meta, save_checkpoint, convert_hf's import; a test
# checks RunState's fields are all here): what reading it needs. Fields it does not name are nobody's and ignored.
HEADER: dict[str, tuple[Any, str]] = {
    "step": (is_count, "a non-negative integer"),
    "best_val_loss": (lambda v: is_number(v) and not math.isnan(v), "a number (inf before any evaluation)"),
    "skipped_steps": (is_count, "a non-negative integer"),
    "wandb_run_id": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "elapsed_s": (lambda v: is_finite(v) and v >= 0, "a finite number of seconds >= 0"),
    "average_progress": (lambda v: v is None or (is_finite(v) and 0 <= v <= 1), "null or a number in [0, 1]"),
    "data_position": (is_data_position, "{seed, step, micro_step: 0}, integers (saves fall between optimizer steps)"),
    "config": (
        lambda v: isinstance(v, dict) and all(isinstance(v.get(k, {}), dict) for k in ("model", "data", "optim")),
        "an object whose model, data and optim are objects",
    ),
    "tokenizer": (lambda v: isinstance(v, dict) and isinstance(v.get("name"), str), "an object with a string name"),
    "vocab_size": (lambda v: is_count(v) and v > 0, "a positive integer"),
    "data_fingerprint": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "metrics": (
        lambda v: isinstance(v, dict) and all(x is None or is_number(x) for x in v.values()),
        "an object of numbers",
    ),
    "optim_param_groups": (is_param_groups, "a list of objects, each with its params' indices"),
    "rng": (
        lambda v: isinstance(v, dict) and isinstance(v.get("python"), list) and isinstance(v.get("numpy"), list),
        "an object with the python and numpy states",
    ),
    "source": (lambda v: isinstance(v, dict), "an object"),
}

TENSOR_DTYPES = {"model.": torch.float32, "train.": torch.float32, "optim.": torch.float32, "rng.": torch.uint8}
TENSOR_NAME = re.compile(r"(model|train)\.[\w.]+|optim\.\d+\.\w+|rng\.torch|rng\.cuda\.\d+")
FORMAT_TENSORS = "model.*, train.*, optim.N.*, rng.torch, rng.cuda.N"
CUDA_RNG_BYTES = 16  # a CUDA generator's state: its seed and offset (tests/test_cuda.py checks it on a GPU)


def check_rng(ckpt: Checkpoint, where: str) -> None:
    """Each saved RNG state restored into a scratch generator, so a resume's restore, just before its first step and
    after its records have started, cannot fail."""
    if "rng.torch" not in ckpt.tensors or "rng" not in ckpt.meta:
        raise ValueError(f"{where} holds no RNG state (rng.torch and the header's rng); a save always writes them")
    rng = ckpt.meta["rng"]
    for field, restore in [
        ("rng.python", lambda: random.Random().setstate(python_rng_state(rng))),
        ("rng.numpy", lambda: np.random.RandomState().set_state(numpy_rng_state(rng))),
        ("rng.torch", lambda: torch.Generator().set_state(ckpt.tensors["rng.torch"])),
    ]:
        try:
            restore()
        except Exception as e:  # each generator raises its own types (IndexError for a short numpy state)
            what = "tensor" if field == "rng.torch" else "header field"
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(f"{where}: {what} {field} is not a state its generator takes ({reason})") from None
    for name, tensor in ckpt.tensors.items():
        if name.startswith("rng.cuda.") and tuple(tensor.shape) != (CUDA_RNG_BYTES,):
            raise ValueError(
                f"{where}: tensor {name} has shape {tuple(tensor.shape)}; a CUDA RNG state is ({CUDA_RNG_BYTES},)"
            )


def check_optimizer_state(ckpt: Checkpoint, where: str) -> None:
    """Optimizer state only with its groups, for parameters they list once each, under keys this code restores
    (restore_optimizer then checks each shape against this run's parameter)."""
    state = ckpt.section("optim.")
    groups = ckpt.meta.get("optim_param_groups")
    if groups is None:
        if state:
            raise ValueError(f"{where} holds optimizer state (optim.*) but no optim_param_groups in its header")
        return
    indices = [i for group in groups for i in group["params"]]
    if len(set(indices)) != len(indices):
        raise ValueError(f"{where}: header field optim_param_groups lists a parameter twice")
    for name, tensor in state.items():
        index, key = name.split(".", 1)
        if int(index) not in indices:
            raise ValueError(f"{where}: tensor optim.{name} is for parameter {index}, which no group lists")
        if key not in STATE_SHAPES:
            raise ValueError(
                f"{where}: tensor optim.{name} is a state this code does not restore ({', '.join(STATE_SHAPES)})"
            )
        if key == "step" and tensor.dim() != 0:
            raise ValueError(f"{where}: tensor optim.{name} has shape {tuple(tensor.shape)}; a step count is a scalar")


def check_model(ckpt: Checkpoint, where: str) -> None:
    """The header's model config builds, and builds exactly the weights the file holds (model.*, and train.* when
    there): names and shapes. Its layer count is compared first, from the names alone: building 3,000 layers even on
    the meta device took a minute."""
    model_cfg = (ckpt.meta.get("config") or {}).get("model")
    if model_cfg is None:
        return  # a tool that needs one says so (analysis.trained.load_model); a resume refuses it (check_compatible)
    config = model_config(model_cfg, where)
    weights = ckpt.section("model.")
    layers = {int(m.group(1)) for name in weights if (m := re.match(r"blocks\.(\d+)\.", name))}
    if layers != set(range(config.n_layer)):
        raise ValueError(
            f"{where}: header field config.model.n_layer={config.n_layer}, but its weights hold "
            f"{len(layers)} blocks (model.blocks.N)"
        )
    if "vocab_size" in ckpt.meta and ckpt.meta["vocab_size"] > config.vocab_size:
        raise ValueError(
            f"{where}: header field vocab_size={ckpt.meta['vocab_size']} exceeds config.model.vocab_size="
            f"{config.vocab_size}: the tokenizer's ids would be outside the model"
        )
    layout, tied, size = model_layout(config, where)
    for prefix in ("model.", "train."):
        held = ckpt.section(prefix)
        if prefix == "train." and not held:
            continue  # written only under a weight average
        missing, unexpected = sorted(layout.keys() - held.keys() - tied), sorted(held.keys() - layout.keys())
        if missing or unexpected:
            raise ValueError(
                f"{where}: its weights are not the ones its header's model config builds (missing "
                f"{[prefix + n for n in missing[:3]]}, unexpected {[prefix + n for n in unexpected[:3]]})"
            )
        for name, tensor in held.items():
            if tuple(tensor.shape) != layout[name]:
                raise ValueError(
                    f"{where}: tensor {prefix}{name} has shape {tuple(tensor.shape)}; its header's model config "
                    f"builds {layout[name]}"
                )
    if size > host_memory():  # the weights are the file's: what is left is a table no weight's shape sizes
        raise ValueError(
            f"{where}: its header's model config builds {size / 2**30:,.1f} GiB of weights and tables "
            f"(model.block_size={config.block_size}); this machine has {host_memory() / 2**30:,.1f} GiB"
        )


# Fields older headers carry that acted only on the training loss: the weights build the same model without them.
RETIRED_MODEL_FIELDS = ("z_loss",)


def model_config(values: dict, where: str) -> GPTConfig:
    """A header's model config as a GPTConfig: known fields only, each of its field's type, validated."""
    known = {f.name: f for f in fields(GPTConfig)}
    cannot = f"{where} has a model config this code cannot build"
    values = {name: value for name, value in values.items() if name not in RETIRED_MODEL_FIELDS}
    for name, value in values.items():
        if name not in known:
            raise ValueError(f"{cannot} (unknown field model.{clip(name)})")
        allowed = get_args(known[name].type) if isinstance(known[name].type, types.UnionType) else (known[name].type,)
        if not any(fits_type(value, t) for t in allowed):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            raise ValueError(f"{cannot} (model.{name}={clip(value)} is not {names})")
    try:
        config = GPTConfig(**values)
        config.validate()
    except (TypeError, ValueError) as e:
        raise ValueError(f"{cannot} ({e})") from None
    if config.vocab_size is None:
        raise ValueError(f"{cannot} (model.vocab_size is null)")
    return config


def fits_type(value: Any, kind: type) -> bool:
    if kind is type(None):
        return value is None
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    if kind is float:
        return is_finite(value)
    return isinstance(value, kind)


def model_layout(config: GPTConfig, where: str) -> tuple[dict[str, tuple[int, ...]], set[str], int]:
    """The shapes of the weights `config` builds, by name, the names of tied copies (a save stores one), and the
    bytes the build allocates: its weights and its tables (RoPE's, of block_size rows), which no weight's shape
    shows. Refused in one line where the build itself cannot be done."""
    try:
        with torch.device("meta"), NoInit():
            model = GPT(config)
    except (RuntimeError, ValueError, OverflowError, MemoryError) as e:  # e.g. a size torch's storage overflows
        raise ValueError(f"{where} has a model config this code cannot build ({error_text(e)})") from None
    size = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    tied = dict(model.named_parameters(remove_duplicate=False)).keys() - dict(model.named_parameters()).keys()
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}, set(tied), size


def host_memory() -> int:
    """Bytes of physical memory: every model is built on the host first, whatever device it then moves to."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class NoInit(TorchFunctionMode):
    """Skips the in-place random init of modules built inside it: meta tensors hold no values to draw, and drawing
    them the first time imports torch._dynamo (2.3 s on a busy 2-core machine; the whole build then takes 3 ms)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init" or func is torch.Tensor.normal_:
            return kwargs.get("tensor", args[0] if args else None)
        return func(*args, **kwargs)
