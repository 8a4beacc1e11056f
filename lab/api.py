"""The lab's JSON API: one function per endpoint, taking the session and the request body.

Every problem a user can cause (a prompt outside the vocabulary, a bad setting, a missing run)
is a ValueError or FileNotFoundError with one line, which the server sends as {"error": ...}.
"""

from collections.abc import Iterator
from typing import Any

import torch

from analysis.attention import token_label
from analysis.head_mask import gates_without
from lab import runs
from lab.measures import attention_layer, float32_base64, gated, next_token_top, prompt_loss
from lab.session import LabSession
from model.generate import stream_text
from model.sampling import SamplingParams

MAX_NEW_TOKENS = 2000


def optional_number(body: dict, key: str, kind: type, default: Any) -> Any:
    """body[key] as int/float; missing keeps the default, null or "" means none (no limit; temperature 0)."""
    value = body.get(key, default)
    if value is None or value == "":
        return None
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key}={value!r} is not {'an integer' if kind is int else 'a number'}") from None


def sampling_settings(body: dict) -> SamplingParams:
    """temperature, top_k, top_p, seed, max_tokens from a request, checked by SamplingParams itself (the
    rules scripts/sample.py applies)."""
    temperature = optional_number(body, "temperature", float, 0.8)
    max_tokens = optional_number(body, "max_tokens", int, 200)
    if max_tokens is None or not 1 <= max_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"max_tokens={max_tokens} is invalid; it must be 1 to {MAX_NEW_TOKENS}")
    seed = optional_number(body, "seed", int, 1337)
    return SamplingParams(
        max_new_tokens=max_tokens,
        temperature=temperature or 0.0,
        top_k=optional_number(body, "top_k", int, 200),
        top_p=optional_number(body, "top_p", float, None),
        seed=1337 if seed is None else seed,
    )


def sample(session: LabSession, body: dict) -> tuple[dict, Iterator[dict]]:
    """Check the request now (so errors come back as JSON), then stream {"text": ...} records."""
    settings = sampling_settings(body)
    idx = session.encode(body.get("prompt", ""))

    def records() -> Iterator[dict]:
        with session.lock:
            ids = idx.tolist()
            for piece in stream_text(session.model, session.tokenizer, ids, settings, session.device):
                yield {"text": piece}

    return {"prompt_tokens": int(idx.shape[0])}, records()


def attention(session: LabSession, body: dict) -> dict:
    idx = session.encode(body.get("prompt", ""))
    layer = optional_number(body, "layer", int, 0)
    with session.lock:
        weights = attention_layer(session.model, idx, 0 if layer is None else layer)  # (H, T, T)
    return {
        "tokens": session.token_texts(idx),
        "labels": [token_label(t) for t in session.token_texts(idx)],
        "layer": layer,
        "shape": list(weights.shape),
        "weights": float32_base64(weights),
    }


def heads_from(body: dict) -> list[tuple[int, int]]:
    heads = body.get("heads_off", [])
    if not isinstance(heads, list) or not all(isinstance(h, list) and len(h) == 2 for h in heads):
        raise ValueError("heads_off must be a list of [layer, head] pairs")
    return [(int(layer), int(head)) for layer, head in heads]


def measure(session: LabSession, idx: torch.Tensor, gates: torch.Tensor | None, settings: SamplingParams) -> dict:
    """Loss on the prompt, top-10 next tokens and a sample, with the given gates (None = full model)."""
    model, tokenizer = session.model, session.tokenizer
    loss = prompt_loss(model, idx, gates) if idx.shape[0] >= 2 else None
    top = [{"token": tokenizer.decode([i]), "p": p} for i, p in next_token_top(model, idx, 10, gates)]
    with gated(model, gates):
        text = "".join(stream_text(model, tokenizer, idx.tolist(), settings, session.device))
    return {"loss": loss, "top": top, "sample": text}


def intervene(session: LabSession, body: dict) -> dict:
    """The full model and the model with `heads_off` switched off, measured side by side."""
    settings = sampling_settings(body)
    idx = session.encode(body.get("prompt", ""))
    with session.lock:
        heads = heads_from(body)
        gates = gates_without(session.model, heads)
        full = measure(session, idx, None, settings)
        ablated = measure(session, idx, gates, settings)
    return {"heads_off": heads, "full": full, "ablated": ablated}


def importance(session: LabSession, body: dict) -> dict:
    """Each head's importance on this prompt: the loss with that head alone off, minus the full loss."""
    idx = session.encode(body.get("prompt", ""))
    with session.lock:
        model = session.model
        full = prompt_loss(model, idx)
        c = model.config
        delta = [
            [prompt_loss(model, idx, gates_without(model, [(layer, head)])) - full for head in range(c.n_head)]
            for layer in range(c.n_layer)
        ]
    return {"loss": full, "delta": delta}


def load(session: LabSession, body: dict) -> dict:
    path = body.get("path")
    if not isinstance(path, str) or not path.strip():
        raise ValueError("give a checkpoint file or run directory to load")
    session.load(path.strip())
    return session.info()


def run_view(session: LabSession, body: dict) -> dict:
    path = body.get("path") or (str(session.run_dir) if session.run_dir else "")
    if not path:
        raise ValueError("give a run directory or a sweep directory")
    return runs.view(path)


ROUTES = {
    "/api/attention": attention,
    "/api/importance": importance,
    "/api/intervene": intervene,
    "/api/load": load,
    "/api/runs": run_view,
}
