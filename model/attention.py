"""Causal multi-head self-attention, written from the equation of "Attention Is All You Need".

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + mask) V

The mask is applied to the scores *before* the softmax, so every row renormalises over the
positions it may see. The explicit path below is the reference; the `sdpa` backend calls
PyTorch's fused kernel, `materialized` a blocked kernel with a hand-written backward
(model/materialized_attention.py), and `auto` picks the fastest of these for the device, the
length and whether a backward follows. The tests prove each of them equal to the reference.

Variants of the multi-head module: grouped-query attention (Ainslie et al. 2023, "GQA"; MQA when
n_kv_head = 1), where groups of n_head / n_kv_head query heads share one key/value head, so the KV
cache shrinks by that factor; QK-norm (RMSNorm of each query and key head before the dot product,
as in OLMo 2 and Qwen3), which bounds the logits of the softmax; and RoPE (model/position.py),
applied to queries and keys after the norm and before the cache, so cached keys are rotated once.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import GPTConfig
from model.kv_cache import LayerCache
from model.materialized_attention import causal_materialized_attention
from model.position import apply_rotary

# Up to this key length `auto` takes the materialized kernel on a CPU. bench/bench_attention.py
# (fwd+bwd, 8192 tokens, 2-core Zen 4) measured it 2.0-3.2x faster than the fused kernel in bf16 and
# 1.1-1.4x in fp32 for 64-512 keys, 1.1-1.2x at 1024, where its probabilities grow to tens of MB.
MATERIALIZED_MAX_KEYS = 512


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
    if key.shape[1] != value.shape[1] or query.shape[1] % key.shape[1]:
        raise ValueError(
            f"{query.shape[1]} query heads cannot share {key.shape[1]} key / {value.shape[1]} value heads; "
            "the key/value heads must be equal in number and divide the query heads"
        )


def expand_kv_heads(x: Tensor, n_head: int) -> Tensor:
    """(B, H_kv, T, D) -> (B, n_head, T, D): query head h uses key/value head h // (n_head / H_kv)."""
    groups = n_head // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def open_blind_rows(attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(mask, has_visible): rows that see no key are opened to every key, to be zeroed afterwards.

    A row that sees nothing is a softmax over all -inf = NaN (and some fused kernels return NaN for
    it); seeing everything keeps values and gradients finite, and `* has_visible` zeroes the row.
    """
    has_visible = attention_mask.any(dim=-1, keepdim=True)  # (..., Tq, 1)
    return attention_mask | ~has_visible, has_visible


def attention_weights(query: Tensor, key: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """softmax(QK^T / sqrt(d_k) + mask), shape (B, H, Tq, Tk); rows with no visible key are zero.

    key may have fewer heads than query (GQA); each then serves a group of query heads.
    """
    d_k = query.shape[-1]
    key = expand_kv_heads(key, query.shape[1])
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, Tq, Tk)
    if attention_mask is None:
        return scores.softmax(dim=-1)
    attention_mask, has_visible = open_blind_rows(attention_mask)
    scores = scores.masked_fill(~attention_mask, float("-inf"))  # mask before softmax
    return scores.softmax(dim=-1) * has_visible


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """softmax(QK^T / sqrt(d_k) + mask) V for query (B, H, Tq, D) and key/value (B, H_kv, Tk, D).

    `attention_mask` is boolean, True = visible, broadcastable to (B, H, Tq, Tk). H_kv divides H.
    """
    _check_shapes(query, key, value)
    weights = attention_weights(query, key, attention_mask)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ expand_kv_heads(value, query.shape[1])  # (B, H, Tq, D)


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
    # enable_gqa lets the kernel share key/value heads without copying them; it is only passed for
    # GQA so that plain multi-head attention keeps every kernel it is eligible for.
    gqa = {"enable_gqa": True} if key.shape[1] != query.shape[1] else {}
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout_p, is_causal=is_causal, **gqa
    )


def rms_norm(norm: nn.RMSNorm, x: Tensor) -> Tensor:
    """`norm` applied in float32, returned in x's dtype. Under bf16 autocast x is bf16 and the gain
    float32, with bf16 weights the reverse; mixed dtypes would miss the fused kernel (and warn)."""
    return F.rms_norm(x.float(), norm.normalized_shape, norm.weight.float(), norm.eps).type_as(x)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention where n_head, d_k and n_kv_head are independent knobs.

    W_Q maps d_model -> n_head * d_k, W_K and W_V map d_model -> n_kv_head * d_k (the three fused
    into one matmul); W_O maps n_head * d_k -> d_model. n_kv_head = None means n_head (plain MHA).
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.kv_heads
        self.d_k = config.head_dim
        self.backend = config.attn_backend
        self.dropout = config.dropout
        q_dim, kv_dim = self.n_head * self.d_k, self.n_kv_head * self.d_k
        self.qkv_proj = nn.Linear(config.d_model, q_dim + 2 * kv_dim, bias=config.bias)  # W_Q | W_K | W_V
        self.out_proj = nn.Linear(q_dim, config.d_model, bias=config.bias)  # W_O
        # One gain per channel of a head, shared by the heads (a head is a vector, the norm is over d_k).
        self.q_norm = nn.RMSNorm(self.d_k, eps=1e-6) if config.qk_norm else None
        self.k_norm = nn.RMSNorm(self.d_k, eps=1e-6) if config.qk_norm else None
        self.resid_dropout = nn.Dropout(config.dropout)

    def project_qkv(self, x: Tensor, rotary: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, d_model) -> q (B, H, T, d_k) and k, v (B, H_kv, T, d_k), QK-normed and rotated as configured."""
        B, T, _ = x.shape
        q, k, v = self.qkv_proj(x).split([self.n_head * self.d_k, *[self.n_kv_head * self.d_k] * 2], dim=-1)
        q = q.view(B, T, self.n_head, self.d_k).transpose(1, 2)  # (B, H, T, d_k)
        k = k.view(B, T, self.n_kv_head, self.d_k).transpose(1, 2)  # (B, H_kv, T, d_k)
        v = v.view(B, T, self.n_kv_head, self.d_k).transpose(1, 2)
        if self.q_norm is not None:
            q, k = rms_norm(self.q_norm, q), rms_norm(self.k_norm, k)
        if rotary is not None:
            q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
        return q, k, v

    def forward(
        self,
        x: Tensor,
        padding_mask: Tensor | None = None,
        cache: LayerCache | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """x: (B, T, d_model); padding_mask: optional (B, Tk) bool over every key, True for real tokens.

        With a cache, this layer's new keys/values are stored in it and the queries attend over all
        keys so far (Tk = cached + T); without one, Tk = T. rotary: RoPE's (cos, sin) for the T new
        positions, or None.
        """
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x, rotary)  # (B, H, T, d_k), (B, H_kv, T, d_k)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, H_kv, Tk, d_k)
        y = self.attend(q, k, v, padding_mask)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.d_k)  # concat heads
        return self.resid_dropout(self.out_proj(y))

    def kernel(self, q: Tensor, key_length: int, dropout_p: float) -> str:
        """The path `attend` takes: the configured backend, or for "auto" the fastest correct one.

        That is the fused kernel, except in training (a backward will follow) over at most
        MATERIALIZED_MAX_KEYS keys on a CPU, where the materialized kernel is faster: most of its
        gain is in the backward. Inference, where small batches would pay its per-block overhead,
        and attention dropout stay fused.
        """
        if self.backend != "auto":
            return self.backend
        short_on_cpu = q.device.type == "cpu" and key_length <= MATERIALIZED_MAX_KEYS
        return "materialized" if short_on_cpu and q.requires_grad and dropout_p == 0.0 else "sdpa"

    def attend(self, q: Tensor, k: Tensor, v: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """Causal attention of the last Tq queries over Tk keys, with an optional (B, Tk) padding mask."""
        Tq, Tk = q.shape[-2], k.shape[-2]
        dropout_p = self.dropout if self.training else 0.0
        kernel = self.kernel(q, Tk, dropout_p)
        if padding_mask is None and (Tq == 1 or kernel == "materialized"):
            # One query at the last position sees every key, and the materialized kernel is causal
            # by construction: neither needs a mask.
            mask = None
        elif padding_mask is None and Tq == Tk and kernel == "sdpa":
            return fused_attention(q, k, v, dropout_p=dropout_p, is_causal=True)  # flash-eligible
        else:
            mask = build_aligned_causal_mask(Tq, Tk, q.device)
            if padding_mask is not None:
                mask = mask & padding_mask[:, None, None, :]  # (B, 1, Tq, Tk)
        if kernel == "explicit":
            return scaled_dot_product_attention(q, k, v, mask, dropout_p=dropout_p)
        has_visible = None
        if padding_mask is not None:
            # A padding query may see no key at all, and some fused CUDA kernels return NaN for such a
            # row (which would poison later layers even under a zero weight). As the explicit path
            # does: let the row see every key, then zero its output.
            mask, has_visible = open_blind_rows(mask)
        if kernel == "materialized":
            n_head = q.shape[1]
            y = causal_materialized_attention(q, expand_kv_heads(k, n_head), expand_kv_heads(v, n_head), mask)
        else:
            y = fused_attention(q, k, v, mask, dropout_p=dropout_p)
        return y if has_visible is None else y * has_visible
