"""A trained model as the tools open it (sampling, the lab, attention maps, head importance, export,
scoring): what a user means by a checkpoint, and the model and tokenizer rebuilt from its header."""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from data.tokenizer import Tokenizer, tokenizer_from_meta
from model import GPT
from rundir.checkpoint import Checkpoint, load_checkpoint, load_model_weights, model_config
from rundir.checkpoints import find_checkpoint

if TYPE_CHECKING:
    from data.batches import PreparedData


def load_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[GPT, Checkpoint]:
    """A GPT rebuilt from a checkpoint file's own config and weights, in eval mode."""
    ckpt = load_checkpoint(path)
    config = ckpt.meta.get("config")
    model_cfg = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model_cfg, dict):
        raise ValueError(f"checkpoint {str(path)!r} has no model config in its header")
    model = GPT(model_config(model_cfg, f"checkpoint {str(path)!r}"))  # refuses unknown or bad fields in one line
    load_model_weights(model, ckpt)
    return model.to(device).eval(), ckpt


def saved_cache_dir(meta: dict[str, Any]) -> str:
    """The data cache the run that wrote this header used ("" for the default, or a header without one)."""
    config = meta.get("config")
    data = config.get("data") if isinstance(config, dict) else None
    return str(data.get("cache_dir", "")) if isinstance(data, dict) else ""


@dataclass
class Trained:
    model: GPT  # in eval mode
    tokenizer: Tokenizer
    path: Path  # the checkpoint file that was read
    meta: dict[str, Any]  # its header: config, step, metrics, ...


def load_trained(source: str | Path, device: torch.device | str = "cpu", cache_dir: str = "") -> Trained:
    """The model and tokenizer of a checkpoint or run directory. A GPT-2 tokenizer's ranks are looked for in
    `cache_dir`, else where the run's data config cached them."""
    path = find_checkpoint(source)
    model, ckpt = load_model(path, device)
    tokenizer_meta = ckpt.meta.get("tokenizer")
    if not isinstance(tokenizer_meta, dict):
        raise ValueError(f"checkpoint {str(path)!r} has no tokenizer in its header")
    try:
        tokenizer = tokenizer_from_meta(tokenizer_meta, cache_dir or saved_cache_dir(ckpt.meta))
    except (TypeError, KeyError, AttributeError) as e:  # a header that parses but does not fit the schema
        raise ValueError(f"checkpoint {str(path)!r} has a malformed tokenizer ({type(e).__name__}: {e})") from None
    except ValueError as e:
        raise ValueError(f"checkpoint {str(path)!r}: {e}") from None
    return Trained(model, tokenizer, path, ckpt.meta)


def check_checkpoint_data(meta: dict, data: "PreparedData", advice: str) -> None:
    """The data a checkpoint's header names must be what its run trained on: its own tokenizer (both read from
    JSON: the rule resume applies), else the same ids mean other tokens; and the same documents, where the header
    records them, else a file added to data.files (or a relative path read from another folder) moves text the
    model trained on into the held-out split. Either way the numbers are wrong, not an error."""
    if data.tokenizer_meta != meta.get("tokenizer"):
        raise ValueError(
            f"the checkpoint's tokenizer differs from the one its data config prepares "
            f"({data.tokenizer_meta['name']}, {data.vocab_size} ids); {advice}"
        )
    trained_on = meta.get("data_fingerprint")
    if trained_on is not None and trained_on != data.fingerprint:
        files = (meta.get("config") or {}).get("data", {}).get("files") or []
        relative = any(not Path(f).expanduser().is_absolute() for f in files)
        raise ValueError(
            f"the data its config names has changed since the run trained (prepared {data.fingerprint}, trained on "
            f"{trained_on}: a file of data.files added, removed or edited"
            f"{', or its relative paths read from another folder' if relative else ''}); the held-out split "
            "would not be its run's and may hold text it trained on: give it the files it trained on"
        )
