"""The lab's JSON API: one function per endpoint, taking the session and the request body.

Every problem a user can cause (a prompt outside the vocabulary, a bad setting, a missing run)
is a ValueError or FileNotFoundError with one line, which the server sends as {"error": ...}.
"""

import contextlib
import difflib
import re
import reprlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from analysis.attention import token_label, token_text
from analysis.head_mask import gates_without
from generation.generate import SamplingParams, stream_text
from lab import runs
from lab.measures import attention_layer, float32_base64, gated, next_token_top, prompt_loss
from lab.session import LabSession

MAX_NEW_TOKENS = 2000


def shown(value: Any) -> str:
    """A bad value as an error message quotes it: its repr, cut short (a body may hold a megabyte)."""
    return reprlib.repr(value)


# A number's text as JSON or the page's form fields write it, in ASCII digits: int() and float() alone
# also take ' 5 ', '1_0' and '٣'.
NUMBER_TEXT = {int: re.compile(r"-?[0-9]+"), float: re.compile(r"-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")}
WANTED = {int: "an integer; give a whole number such as 3", float: "a number; give one such as 0.8"}


def parse_number(key: str, value: Any, kind: type[int] | type[float]) -> int | float:
    """`value` as `kind`: a JSON number, or its text (the page sends its form fields as typed). A bool is
    refused (true is not 1), and an integer refuses a float rather than rounding it: 1.7, 2.0 and 1e400
    (infinity) are mistakes, not a count. Ranges are the caller's."""
    if isinstance(value, str) and NUMBER_TEXT[kind].fullmatch(value):
        with contextlib.suppress(ValueError):  # more digits than int() converts
            return kind(value)
    elif isinstance(value, int | kind) and not isinstance(value, bool):
        return kind(value)
    raise ValueError(f"{key}={shown(value)} is not {WANTED[kind]}")


def integer(key: str, value: Any) -> int:
    return parse_number(key, value, int)


def number(key: str, value: Any) -> float:
    return parse_number(key, value, float)


def text(body: dict, key: str) -> str:
    """body[key] as a string ("" when missing): a number or a list there is refused, not turned into text."""
    value = body.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{key}={shown(value)} is not text; give it as a JSON string")
    return value


def optional(body: dict, key: str, parse: Callable[[str, Any], Any], default: Any) -> Any:
    """body[key] read by `parse` (integer or number); missing keeps the default, null or "" means none
    (no limit; temperature 0)."""
    value = body.get(key, default)
    return None if value is None or value == "" else parse(key, value)


def sampling_settings(body: dict) -> SamplingParams:
    """temperature, top_k, top_p, seed, max_tokens from a request, checked by SamplingParams itself (the
    rules scripts/sample.py applies)."""
    temperature = optional(body, "temperature", number, 0.8)
    max_tokens = optional(body, "max_tokens", integer, 200)
    if max_tokens is None:  # a cleared field: there is no "no limit" for the length of a sample
        raise ValueError(f"max_tokens is empty; give 1 to {MAX_NEW_TOKENS}")
    if not 1 <= max_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"max_tokens={max_tokens} is invalid; it must be 1 to {MAX_NEW_TOKENS}")
    seed = optional(body, "seed", integer, 1337)
    return SamplingParams(
        max_new_tokens=max_tokens,
        temperature=temperature or 0.0,
        top_k=optional(body, "top_k", integer, 200),
        top_p=optional(body, "top_p", number, None),
        seed=1337 if seed is None else seed,
    )


class LastDecode:
    """A tokenizer that remembers how many ids it decoded last. stream_text decodes a piece's ids just before
    it yields the piece, so that is the piece's token count: a BPE piece held back until its UTF-8 character
    is whole holds several tokens, and counting pieces undercounted the sample."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.ids = tokenizer, 0

    def decode(self, ids: list[int]) -> str:
        self.ids = len(ids)
        return self.tokenizer.decode(ids)


def sample(session: LabSession, body: dict) -> tuple[dict, Iterator[dict]]:
    """Check the request now (so errors come back as JSON), then stream {"text": ..., "tokens": n} records."""
    settings = sampling_settings(body)
    idx = session.encode(text(body, "prompt"))

    def records() -> Iterator[dict]:
        counted = LastDecode(session.tokenizer)
        pieces = stream_text(session.model, counted, idx.tolist(), settings, session.device)
        try:  # the model a token at a time: another tab's request runs between two (its cache is its own)
            while True:
                with session.using_model(f"a sample of {settings.max_new_tokens} tokens"), session.sampling_threads():
                    piece = next(pieces, None)
                if piece is None:
                    return
                yield {"text": piece, "tokens": counted.ids}
                session.let_others_in()
        finally:
            pieces.close()

    return {"prompt_tokens": int(idx.shape[0])}, records()


def attention(session: LabSession, body: dict) -> dict:
    idx = session.encode(text(body, "prompt"))
    layer = optional(body, "layer", integer, 0)
    layer = 0 if layer is None else layer  # a cleared field is the first layer, and the answer says so (it said null)
    with session.using_model("an attention map"):
        weights, variant = attention_layer(session.model, idx, layer)  # (H, T, T)
    return {
        "tokens": session.token_texts(idx),
        "labels": [token_label(t) for t in session.token_texts(idx)],
        "layer": layer,
        "shape": list(weights.shape),
        "weights": float32_base64(weights),
        **variant,  # window, softcap, sink_share, gate, gate_mean, value_gate_mean: None where the model has none
    }


def heads_from(body: dict) -> list[tuple[int, int]]:
    heads = body.get("heads_off", [])
    if not isinstance(heads, list) or not all(isinstance(h, list) and len(h) == 2 for h in heads):
        raise ValueError(f"heads_off={shown(heads)} is invalid; it must be a list of [layer, head] pairs of integers")
    return [(integer("heads_off layer", layer), integer("heads_off head", head)) for layer, head in heads]


def measure(session: LabSession, idx: torch.Tensor, gates: torch.Tensor | None, settings: SamplingParams) -> dict:
    """Loss on the prompt, top-10 next tokens and a sample, with the given gates (None = full model)."""
    model, tokenizer = session.model, session.tokenizer
    loss = prompt_loss(model, idx, gates) if idx.shape[0] >= 2 else None
    top = [{"token": token_text(tokenizer, i), "p": p} for i, p in next_token_top(model, idx, 10, gates)]
    with gated(model, gates), session.sampling_threads():
        text = "".join(stream_text(model, tokenizer, idx.tolist(), settings, session.device))
    return {"loss": loss, "top": top, "sample": text}


def intervene(session: LabSession, body: dict) -> dict:
    """The full model and the model with `heads_off` switched off, measured side by side."""
    settings = sampling_settings(body)
    idx = session.encode(text(body, "prompt"))
    with session.using_model("an intervention"):
        heads = heads_from(body)
        gates = gates_without(session.model, heads)
        full = measure(session, idx, None, settings)
        ablated = measure(session, idx, gates, settings)
    return {"heads_off": heads, "full": full, "ablated": ablated}


def importance(session: LabSession, body: dict) -> dict:
    """Each head's importance on this prompt: the loss with that head alone off, minus the full loss."""
    idx = session.encode(text(body, "prompt"))
    with session.using_model("a head importance"):
        model = session.model
        full = prompt_loss(model, idx)
        c = model.config
        delta = [
            [prompt_loss(model, idx, gates_without(model, [(layer, head)])) - full for head in range(c.n_head)]
            for layer in range(c.n_layer)
        ]
    return {"loss": full, "delta": delta}


def load(session: LabSession, body: dict) -> dict:
    path = text(body, "path")
    if not path.strip():
        raise ValueError("give a checkpoint file or run directory to load")
    session.load(path.strip())
    return session.info()


def run_path(session: LabSession, body: dict, wanted: str) -> Path:
    """body's path as load reads it, else the loaded model's run; refused outside the lab's root."""
    path = text(body, "path").strip() or (str(session.run_dir) if session.run_dir else "")
    if not path:
        raise ValueError(f"give {wanted}")
    return session.inside_root(path)


def run_view(session: LabSession, body: dict) -> dict:
    return runs.view(run_path(session, body, "a run directory or a sweep directory"))


def run_head_importance(session: LabSession, body: dict) -> dict:
    """A run's head importance at each step checkpoint, as `scripts/head_importance.py RUN --over-training`
    wrote it (read, not measured: measuring every checkpoint of a long run takes minutes)."""
    return runs.head_importance(run_path(session, body, "a run directory"))


SAMPLING_KEYS = ("temperature", "top_k", "top_p", "seed", "max_tokens")
# The keys each API reads. Any other is refused, naming the nearest: `max_new_tokens` (the command line's name) was
# ignored, and the page's default of 200 tokens came back.
KEYS = {
    "/api/sample": ("prompt", *SAMPLING_KEYS),
    "/api/attention": ("prompt", "layer"),
    "/api/importance": ("prompt",),
    "/api/intervene": ("prompt", "heads_off", *SAMPLING_KEYS),
    "/api/load": ("path",),
    "/api/runs": ("path",),
    "/api/runs/head_importance": ("path",),
}


def checked_keys(path: str, body: dict) -> dict:
    """body, if every key is one `path` reads; ValueError naming the first that is not, and what is."""
    unknown = [key for key in body if key not in KEYS[path]]
    if unknown:
        near = difflib.get_close_matches(str(unknown[0]), KEYS[path], n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ValueError(f"{shown(unknown[0])} is not a key of {path}{hint}; it takes: {', '.join(KEYS[path])}")
    return body


ROUTES = {
    "/api/attention": attention,
    "/api/importance": importance,
    "/api/intervene": intervene,
    "/api/load": load,
    "/api/runs": run_view,
    "/api/runs/head_importance": run_head_importance,
}
