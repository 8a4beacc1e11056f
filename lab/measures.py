"""What the page shows about one prompt: the loss on it, the next-token distribution, attention weights.

Each takes optional head gates (analysis/head_mask.py), so the intervened model is measured by
exactly the masking the head-importance analysis uses, and gates=None is the full model.
"""

import base64
import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor

from analysis.attention import MAX_MAP_TOKENS, attention_walk
from analysis.head_importance import masked_loss
from analysis.head_mask import head_gates
from model import GPT


def gated(model: GPT, gates: Tensor | None) -> contextlib.AbstractContextManager:
    return head_gates(model, gates) if gates is not None else contextlib.nullcontext()


def check_length(model: GPT, idx: Tensor, at_least: int = 1) -> None:
    T, block_size = idx.shape[0], model.config.block_size
    if not at_least <= T <= block_size:
        # at_least 2 is a loss: every token but the first is predicted from those before it
        what = "a loss on it needs" if at_least == 2 else "this needs"
        why = " (a next token to predict); give a longer prompt" if T < at_least else ""
        raise ValueError(
            f"the prompt has {T} token{'' if T == 1 else 's'}; {what} {at_least} to block_size={block_size}{why}"
        )


@torch.no_grad()
def prompt_loss(model: GPT, idx: Tensor, gates: Tensor | None = None) -> float:
    """Mean next-token cross-entropy (nats) of the prompt's tokens idx (T,): token t+1 predicted from 0..t,
    with the heads whose gate is 0 switched off: the head-importance analysis's own `masked_loss`."""
    check_length(model, idx, at_least=2)
    heads_off = [] if gates is None else [tuple(lh) for lh in (gates == 0).nonzero().tolist()]
    return masked_loss(model, idx, heads_off)


@torch.no_grad()
def next_token_top(model: GPT, idx: Tensor, k: int = 10, gates: Tensor | None = None) -> list[tuple[int, float]]:
    """The k most likely next tokens after idx (T,), as (token id, probability), most likely first."""
    check_length(model, idx)
    with gated(model, gates):
        logits, _ = model(idx[None], last_only=True)  # (1, 1, vocab)
    probs = F.softmax(logits[0, -1].float(), dim=-1)
    top = torch.topk(probs, min(k, probs.shape[0]))
    return [(int(i), float(p)) for i, p in zip(top.indices, top.values, strict=True)]


def attention_layer(model: GPT, idx: Tensor, layer: int) -> tuple[Tensor, dict]:
    """Layer `layer`'s weights (n_head, T, T) for idx (T,), row = query position, column = key, and what the
    layer's variant changes, as JSON: its window (keys a query sees, None: all), each query's weight the sink
    took (n_head lists of T), the output gate per head and per token (and its mean over the prompt's tokens),
    and the value-embedding gate's mean per key/value head; None where the model has no such variant."""
    check_length(model, idx)
    if idx.shape[0] > MAX_MAP_TOKENS:  # the page would be sent n_head x T x T weights
        raise ValueError(
            f"the prompt has {idx.shape[0]} tokens; the attention view draws at most {MAX_MAP_TOKENS} (its weights "
            "grow as the square of the prompt); give a shorter prompt"
        )
    if not 0 <= layer < model.config.n_layer:
        raise ValueError(f"layer {layer} does not exist; the model has layers 0..{model.config.n_layer - 1}")
    walk = attention_walk(model, idx)

    def listed(readings: Tensor | None, mean: bool = False) -> list | None:
        if readings is None:
            return None
        return (readings[layer].mean(-1) if mean else readings[layer]).float().tolist()

    variant = {
        "window": walk.windows[layer],
        "softcap": model.config.attn_softcap,
        "sink_share": listed(walk.sink_share),
        "gate": listed(walk.output_gates),
        "gate_mean": listed(walk.output_gates, mean=True),
        "value_gate_mean": listed(walk.value_gates, mean=True),
    }
    return walk.weights[layer], variant


def float32_base64(t: Tensor) -> str:
    """Little-endian float32 bytes, base64: exact, and a (16, 256, 256) layer is 5.6 MB, not 14 MB of JSON numbers."""
    return base64.b64encode(t.detach().cpu().float().numpy().astype("<f4").tobytes()).decode("ascii")
