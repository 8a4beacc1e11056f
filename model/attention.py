"""Causal multi-head self-attention, written from the equation of "Attention Is All You Need".

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + mask) V

The mask is applied to the scores *before* the softmax, so every row renormalises over the
positions it may see. The explicit path below is the reference; the `sdpa` backend calls
PyTorch's fused kernel and is proven equal to it by the tests.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.kv_cache import LayerCache

BACKENDS = ("explicit", "sdpa")


def build_causal_mask(sequence_length: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean (1, 1, T, T) mask, True where query i may see key j (j <= i)."""
    if sequence_length < 1:
        raise ValueError(f"sequence_length must be >= 1, got {sequence_length}")
    return build_aligned_causal_mask(sequence_length, sequence_length, device)


def build_aligned_causal_mask(query_length: int, key_length: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean (1, 1, Tq, Tk) causal mask for queries that are the *last* Tq of Tk positions.

    This is the lower-right alignment cached decoding needs: query i sits at absolute position
    Tk - Tq + i and sees keys 0..Tk - Tq + i. (`F.scaled_dot_product_attention(is_causal=True)`
    aligns upper-left instead, which is wrong whenever Tq < Tk.)
    """
    if query_length < 1 or key_length < query_length:
        raise ValueError(f"need 1 <= query_length <= key_length, got {query_length} and {key_length}")
    offset = key_length - query_length
    mask = torch.ones(query_length, key_length, dtype=torch.bool, device=device).tril(diagonal=offset)
    return mask.view(1, 1, query_length, key_length)


def _check_shapes(query: Tensor, key: Tensor, value: Tensor) -> None:
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"key and value lengths differ: {key.shape[-2]} vs {value.shape[-2]}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query and key head dims differ: {query.shape[-1]} vs {key.shape[-1]}")


def attention_weights(query: Tensor, key: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """softmax(QK^T / sqrt(d_k) + mask), shape (B, H, Tq, Tk); rows with no visible key are zero."""
    d_k = query.shape[-1]
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, Tq, Tk)
    if attention_mask is None:
        return scores.softmax(dim=-1)
    # A row that sees nothing would be softmax over all -inf = NaN. Let such rows see everything
    # (keeps values and gradients finite), then zero them after the softmax.
    has_visible = attention_mask.any(dim=-1, keepdim=True)
    attention_mask = attention_mask | ~has_visible
    scores = scores.masked_fill(~attention_mask, float("-inf"))  # mask before softmax
    return scores.softmax(dim=-1) * has_visible


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """softmax(QK^T / sqrt(d_k) + mask) V for query (B, H, Tq, D) and key/value (B, H, Tk, D).

    `attention_mask` is boolean, True = visible, broadcastable to (B, H, Tq, Tk).
    """
    _check_shapes(query, key, value)
    weights = attention_weights(query, key, attention_mask)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ value  # (B, H, Tq, D)


def fused_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> Tensor:
    """The same computation through PyTorch's fused kernels (flash / memory-efficient / math)."""
    _check_shapes(query, key, value)
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout_p, is_causal=is_causal
    )


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention where n_head and d_k are independent knobs.

    W_Q, W_K, W_V map d_model -> n_head * d_k (fused into one matmul); W_O maps n_head * d_k -> d_model.
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        d_k: int | None = None,
        dropout: float = 0.0,
        bias: bool = False,
        backend: str = "sdpa",
    ) -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"attention backend {backend!r} is unknown; choose one of: {', '.join(BACKENDS)}")
        self.n_head = n_head
        self.d_k = d_k or d_model // n_head
        self.backend = backend
        self.dropout = dropout
        self.qkv_proj = nn.Linear(d_model, 3 * n_head * self.d_k, bias=bias)  # W_Q | W_K | W_V
        self.out_proj = nn.Linear(n_head * self.d_k, d_model, bias=bias)  # W_O
        self.resid_dropout = nn.Dropout(dropout)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, d_model) -> three (B, H, T, d_k) tensors."""
        B, T, _ = x.shape
        q, k, v = self.qkv_proj(x).split(self.n_head * self.d_k, dim=-1)
        return tuple(t.view(B, T, self.n_head, self.d_k).transpose(1, 2) for t in (q, k, v))

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, cache: LayerCache | None = None) -> Tensor:
        """x: (B, T, d_model); padding_mask: optional (B, Tk) bool over every key, True for real tokens.

        With a cache, this layer's new keys/values are stored in it and the queries attend over all
        keys so far (Tk = cached + T); without one, Tk = T.
        """
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x)  # (B, H, T, d_k)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, H, Tk, d_k)
        y = self.attend(q, k, v, padding_mask)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.d_k)  # concat heads
        return self.resid_dropout(self.out_proj(y))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """Causal attention of the last Tq queries over Tk keys, with an optional (B, Tk) padding mask."""
        Tq, Tk = q.shape[-2], k.shape[-2]
        dropout_p = self.dropout if self.training else 0.0
        if padding_mask is None and Tq == 1:
            mask = None  # one query at the last position sees every key: decoding needs no mask at all
        elif padding_mask is None and Tq == Tk and self.backend == "sdpa":
            return fused_attention(q, k, v, dropout_p=dropout_p, is_causal=True)  # flash-eligible
        else:
            mask = build_aligned_causal_mask(Tq, Tk, q.device)
            if padding_mask is not None:
                mask = mask & padding_mask[:, None, None, :]  # (B, 1, Tq, Tk)
        if self.backend == "sdpa" and padding_mask is not None:
            # A padding query may see no key at all, and some fused CUDA kernels return NaN for such a
            # row (which would poison later layers even under a zero weight). As the explicit path
            # does: let the row see every key, then zero its output.
            has_visible = mask.any(dim=-1, keepdim=True)  # (B, 1, Tq, 1)
            return fused_attention(q, k, v, mask | ~has_visible, dropout_p=dropout_p) * has_visible
        if self.backend == "sdpa":
            return fused_attention(q, k, v, mask, dropout_p=dropout_p)
        return scaled_dot_product_attention(q, k, v, mask, dropout_p=dropout_p)
