"""Attention weights of a trained GPT for one sequence, from the explicit equation.

The blocks are walked here (as tests/test_causality.py does) rather than hooked inside model/, so
each layer's weights are softmax(QK^T / sqrt(d_k) + mask) computed from that layer's real input,
whatever backend the model trains with. The walk also returns the logits, which must equal the
model's own forward: that is what proves the walk is the model.

The walk also reads what a layer's variant adds around the weights (docs/variants.md), through the
attention module's own methods, so nothing of the equation is written twice: the sliding window, the
sinks' share of each row (a row's weights sum to 1 minus it), the gate of gated attention and that of
value embeddings.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from data.tokenizer import Tokenizer
from model import GPT

# The most tokens a map is drawn for. Its weights grow as the square of the prompt (n_head x T x T a layer: 16 MB of
# float32 for 4 heads at 1,024, 268 MB at the default's 4,096-token context), and a wider panel shows the eye no more.
MAX_MAP_TOKENS = 1024


@dataclass
class AttentionWalk:
    """One sequence's walk through the blocks: every layer's weights and what its variant changes."""

    weights: Tensor  # (n_layer, n_head, T, T): row = query, column = key
    logits: Tensor  # (T, vocab)
    windows: list[int | None]  # keys a query of each layer sees (sliding window); None: every earlier key
    # (n_layer, n_head, T): 1 - each row's weights, what the sink took; None without sinks, and under differential
    # attention, whose two maps each have the sink
    sink_share: Tensor | None
    output_gates: Tensor | None  # (n_layer, n_head, T): gated attention's sigmoid(x W_gate), a head's channels averaged
    value_gates: Tensor | None  # (n_layer, n_kv_head, T): value embeddings' 2 sigmoid(x W_ve_gate)


@torch.no_grad()
def attention_walk(model: GPT, idx: Tensor) -> AttentionWalk:
    """idx (T,) token ids -> the walk's weights, logits and variant readings, in eval mode."""
    if idx.ndim != 1:
        raise ValueError(f"expected one sequence of token ids (T,), got shape {tuple(idx.shape)}")
    T = idx.shape[0]
    if not 1 <= T <= model.config.block_size:
        raise ValueError(f"the sequence has {T} tokens; it needs 1 to block_size={model.config.block_size}")
    was_training = model.training
    model.eval()
    idx = idx[None].to(model.tok_emb.weight.device)  # (1, T)
    positions = torch.arange(T, device=idx.device)[None]  # (1, T)
    x, rotary = model.embed(idx, positions)  # (1, T, d_model), RoPE's (cos, sin) or None
    x0, maps, output_gates, value_gates = x, [], [], []
    for layer, block in enumerate(model.blocks):
        x = model.block_input(layer, x, x0)  # under x0_mix, the learned mix of the stream and the embedded tokens
        attn, normed = block.attn, block.ln_1(x)
        maps.append(attn.weights(normed, rotary)[0])  # (H, T, T), with the layer's soft cap, sinks, window
        if attn.gate_proj is not None:
            output_gates.append(attn.output_gate(normed)[0].mean(-1))  # (H, T)
        if attn.value_embed is not None:
            value_gates.append(attn.value_embed_gate(normed)[0, ..., 0])  # (H_kv, T)
        x = block(x, rotary=rotary, tokens=idx)  # tokens: a value-embedding variant reads them
    logits = model.head(x, idx)[0]  # (T, vocab): the soft cap and the continuous cache as the model has them
    model.train(was_training)
    weights = torch.stack(maps)
    return AttentionWalk(
        weights=weights,
        logits=logits,
        windows=[block.attn.window for block in model.blocks],
        # Differential attention's rows sum to 1 - lambda with no sink at all: the row sum is no sink's share.
        sink_share=1 - weights.sum(-1) if model.config.attn_sinks and not model.config.attn_diff else None,
        output_gates=torch.stack(output_gates) if output_gates else None,
        value_gates=torch.stack(value_gates) if value_gates else None,
    )


def attention_maps(model: GPT, idx: Tensor) -> tuple[Tensor, Tensor]:
    """idx (T,) token ids -> weights (n_layer, n_head, T, T) and logits (T, vocab), in fp32, eval mode."""
    walk = attention_walk(model, idx)
    return walk.weights, walk.logits


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """One token's text; bytes that are only part of a character (byte-level BPE splits a rare "ï" or
    "—" into several tokens) written as escapes, \\xc3, rather than each drawn as the same "\ufffd"."""
    return tokenizer.token_bytes(token_id).decode("utf-8", errors="backslashreplace")


def token_label(text: str) -> str:
    """A token's text made visible on an axis: spaces, newlines and tabs drawn as symbols."""
    return text.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t") or "∅"
