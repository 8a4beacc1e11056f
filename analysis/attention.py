"""Attention weights of a trained GPT for one sequence, from the explicit equation.

The blocks are walked here (as tests/test_causality.py does) rather than hooked inside model/, so
each layer's weights are softmax(QK^T / sqrt(d_k) + mask) computed from that layer's real input,
whatever backend the model trains with. The walk also returns the logits, which must equal the
model's own forward: that is what proves the walk is the model.
"""

import torch
from torch import Tensor

from data.tokenizer import Tokenizer
from model import GPT


@torch.no_grad()
def attention_maps(model: GPT, idx: Tensor) -> tuple[Tensor, Tensor]:
    """idx (T,) token ids -> weights (n_layer, n_head, T, T) and logits (T, vocab), in fp32, eval mode."""
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
    maps = []
    for block in model.blocks:
        maps.append(block.attn.weights(block.ln_1(x), rotary)[0])  # (H, T, T), with the layer's soft cap, sinks, window
        x = block(x, rotary=rotary, tokens=idx)  # tokens: a value-embedding variant reads them
    logits = model.lm_head(model.ln_f(x))[0]  # (T, vocab)
    model.train(was_training)
    return torch.stack(maps), logits


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """One token's text; bytes that are only part of a character (byte-level BPE splits a rare "ï" or
    "—" into several tokens) written as escapes, \\xc3, rather than each drawn as the same "\ufffd"."""
    return tokenizer.token_bytes(token_id).decode("utf-8", errors="backslashreplace")


def token_label(text: str) -> str:
    """A token's text made visible on an axis: spaces, newlines and tabs drawn as symbols."""
    return text.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t") or "∅"
