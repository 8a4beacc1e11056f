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

And those of 2025-26, each one GPTConfig field, off by default (docs/variants.md):
- gated attention (Qiu et al. 2025, "Gated Attention for Large Language Models"): head h's output
  times sigmoid(x W_gate), one gate per head or per channel, before W_O;
- a soft cap on the scores, S = c tanh(S / c) before the mask (Gemma 2, Gemma Team 2024);
- attention sinks: a learned logit per head in the softmax's denominator, with no value behind it
  (gpt-oss, OpenAI 2025; Xiao et al. 2023 found heads making one of a key);
- sliding windows per layer: an "SSSL" pattern of windowed (S) and full (L) layers (Gemma 2,
  gpt-oss, nanochat); a windowed layer's cache keeps only its last window - 1 keys and the mask
  hides any before the window (model/kv_cache.py);
- value embeddings (modded-nanogpt, nanochat): v + 2 sigmoid(x W_g) * ve[token], a second token
  embedding per layer mixed into the values;
- differential attention (Ye et al. 2024): softmax(Q1 K1^T) - lambda softmax(Q2 K2^T) from the two
  halves of each query and key head, a learned lambda per layer (model/differential.py);
- multi-head latent attention (DeepSeek-V2): keys and values up-projected from a cached low-rank
  latent (model/latent_attention.py, a subclass of the module here).
The fused kernel cannot change the scores, so `sdpa` refuses the soft cap and sinks, and `auto`
takes the materialized kernel (explicit under dropout) for them.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.causal_mask import build_aligned_causal_mask
from model.config import KERNELS, GPTConfig
from model.differential import DifferentialLambda, maps_as_heads, subtract_maps
from model.kv_cache import LayerCache
from model.materialized_attention import causal_materialized_attention, softmax_with_sink
from model.position import apply_rotary

# Up to this key length `auto` takes the materialized kernel on a CPU. bench/bench_attention.py
# (fwd+bwd, 8192 tokens, 2-core Zen 4) measured it 2.0-3.2x faster than the fused kernel in bf16 and
# 1.1-1.4x in fp32 for 64-512 keys, 1.1-1.2x at 1024, where its probabilities grow to tens of MB.
MATERIALIZED_MAX_KEYS = 512


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


def attention_weights(
    query: Tensor,
    key: Tensor,
    attention_mask: Tensor | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    diff_lambda: Tensor | None = None,
) -> Tensor:
    """softmax(QK^T / sqrt(d_k) + mask), shape (B, H, Tq, Tk); rows with no visible key are zero.

    key may have fewer heads than query (GQA); each then serves a group of query heads. softcap c
    replaces the scores S by c tanh(S / c) before the mask (Gemma 2), so none exceeds c in size.
    sinks (H,): one more logit per head in every row's denominator, with no value behind it.
    diff_lambda: differential attention; the halves of each query and key head make two maps (each
    with the soft cap and sink), and the weights are the first minus diff_lambda times the second.
    """
    if diff_lambda is not None:  # the two maps as 2H heads of half the width (model/differential.py)
        query, key = maps_as_heads(query, key)
        sinks = None if sinks is None else sinks.repeat(2)
    d_k = query.shape[-1]
    key = expand_kv_heads(key, query.shape[1])
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, Tq, Tk)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    has_visible = None
    if attention_mask is not None:
        attention_mask, has_visible = open_blind_rows(attention_mask)
        scores = scores.masked_fill(~attention_mask, float("-inf"))  # mask before softmax
    weights = scores.softmax(dim=-1) if sinks is None else softmax_with_sink(scores, sinks)[..., :-1]
    weights = weights if has_visible is None else weights * has_visible
    return weights if diff_lambda is None else subtract_maps(weights, diff_lambda)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    diff_lambda: Tensor | None = None,
) -> Tensor:
    """softmax(QK^T / sqrt(d_k) + mask) V for query (B, H, Tq, D) and key/value (B, H_kv, Tk, D).

    `attention_mask` is boolean, True = visible, broadcastable to (B, H, Tq, Tk). H_kv divides H.
    softcap, sinks and diff_lambda change the weights as `attention_weights` says.
    """
    _check_shapes(query, key, value)
    weights = attention_weights(query, key, attention_mask, softcap, sinks, diff_lambda)
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
    `layer` (its index in the model) picks its sliding window from the config's window_pattern.
    """

    # What a subclass may replace (MultiHeadLatentAttention does): the projection's width, how the queries and what
    # the cache keeps come from x (`project`), how the keys and values come from what it kept (`keys_values`), and
    # the score FLOPs. Every other step, `project_qkv` and `forward` among them, is shared, so a variant written
    # there runs under every subclass; tests/unit/test_variants.py fails for a subclass that replaces anything else.
    HOOKS = ("projection_width", "project", "keys_values", "score_flops")

    def __init__(self, config: GPTConfig, layer: int = 0) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.kv_heads
        self.d_k = config.head_dim
        self.backend = config.attn_backend
        self.score_kernels = config.score_kernels()  # the kernels that compute this model's scores
        self.dropout = config.attention_dropout
        self.softcap = config.attn_softcap
        self.window = config.layer_window(layer)  # keys a query sees (sliding window), or None: every earlier key
        q_dim, kv_dim = self.n_head * self.d_k, self.n_kv_head * self.d_k
        self.qkv_proj = nn.Linear(config.d_model, self.projection_width(config), bias=config.bias)  # W_Q | W_K | W_V
        self.out_proj = nn.Linear(q_dim, config.d_model, bias=config.bias)  # W_O
        gate_width = {"headwise": self.n_head, "elementwise": q_dim}.get(config.attn_gate)
        self.gate_proj = nn.Linear(config.d_model, gate_width, bias=config.bias) if gate_width else None  # W_gate
        # One gain per channel of a head, shared by the heads (a head is a vector, the norm is over d_k);
        # differential attention normalises each half of a head, the query or key of one of its maps.
        qk_width = self.d_k // 2 if config.attn_diff else self.d_k
        self.q_norm = nn.RMSNorm(qk_width, eps=1e-6) if config.qk_norm else None
        self.k_norm = nn.RMSNorm(qk_width, eps=1e-6) if config.qk_norm else None
        # Differential attention: the layer's learned lambda and the RMSNorm of each head's output.
        self.differential = DifferentialLambda(self.d_k, layer) if config.attn_diff else None
        # Attention sinks: a learned logit per head in every softmax's denominator; 0 at init (GPT.reset_parameters).
        self.sinks = nn.Parameter(torch.zeros(self.n_head)) if config.attn_sinks else None
        # Value embeddings: a (vocab, H_kv * d_k) table per layer, mixed into V by a gate per key/value head.
        self.value_embed = nn.Embedding(config.vocab_size, kv_dim) if config.value_embeds else None
        self.value_gate = nn.Linear(config.d_model, self.n_kv_head, bias=config.bias) if config.value_embeds else None
        self.resid_dropout = nn.Dropout(config.dropout)

    def project_qkv(
        self,
        x: Tensor,
        rotary: tuple[Tensor, Tensor] | None = None,
        cache: LayerCache | None = None,
        tokens: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, H, T, d_k) of the T new tokens of x (B, T, d_model), and k, v (B, H_kv, Tk, d_k) of every token
        they may read: with a cache, the cached ones and then the new ones, which the cache keeps.

        The one path from x to what the heads attend, for every attention class (`forward` and the lab's `weights`
        both take it, and a subclass replaces only the hooks it calls): a variant that changes the queries, keys or
        values does it here, after `keys_values`. tokens: the ids that value embeddings look up; without them (the
        lab's maps, which read no values) v is the projection alone.
        """
        B, T, _ = x.shape
        q, k, v = self.project(x, rotary)  # (B, H, T, d_k), what the cache keeps: (B, H_kv, T, d_k) each
        if self.value_embed is not None and tokens is not None:  # v + 2 sigmoid(x W_ve_gate) * ve: near v at init
            # before the cache, which keeps each token's values (a latent cache cannot: the config refuses the pair)
            ve = self.value_embed(tokens).view(B, T, self.n_kv_head, self.d_k).transpose(1, 2)  # (B, H_kv, T, d_k)
            v = v + (self.value_embed_gate(x) * ve).type_as(v)  # keep v's dtype: the table is float32 under autocast
        if cache is not None:
            k, v = cache.update(k, v)  # (B, H_kv, Tk, d_k)
        return q, *self.keys_values(k, v)

    def project(self, x: Tensor, rotary: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Hook: (B, T, d_model) -> q (B, H, T, d_k) and what the cache keeps of the T tokens, here k and
        v (B, H_kv, T, d_k), QK-normed and rotated as configured, so that a cached key is rotated once."""
        B, T, _ = x.shape
        q, k, v = self.qkv_proj(x).split([self.n_head * self.d_k, *[self.n_kv_head * self.d_k] * 2], dim=-1)
        q = q.view(B, T, self.n_head, self.d_k).transpose(1, 2)  # (B, H, T, d_k)
        k = k.view(B, T, self.n_kv_head, self.d_k).transpose(1, 2)  # (B, H_kv, T, d_k)
        v = v.view(B, T, self.n_kv_head, self.d_k).transpose(1, 2)
        return self.norm_and_rotate(q, self.q_norm, rotary), self.norm_and_rotate(k, self.k_norm, rotary), v

    def keys_values(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Hook: the keys and values (B, H_kv, Tk, d_k) the heads read, from what `project` and the cache keep:
        here those are the keys and values themselves."""
        return k, v

    def projection_width(self, config: GPTConfig) -> int:
        """Hook: output width of qkv_proj, W_Q | W_K | W_V (MultiHeadLatentAttention projects differently)."""
        return (self.n_head + 2 * self.n_kv_head) * self.d_k

    def norm_and_rotate(self, x: Tensor, norm: nn.RMSNorm | None, rotary: tuple[Tensor, Tensor] | None) -> Tensor:
        """QK-norm, then RoPE, of queries or keys (B, heads, T, D) as configured; under differential
        attention each half of a head on its own, as each is the query or key of a map of its own."""
        parts = x.chunk(2, dim=-1) if self.differential is not None else (x,)
        if norm is not None:
            parts = [rms_norm(norm, part) for part in parts]
        if rotary is not None:
            parts = [apply_rotary(part, rotary) for part in parts]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def output_gate(self, x: Tensor) -> Tensor:
        """Gated attention's sigmoid(x W_gate) for x (B, T, d_model): (B, H, T, 1 headwise or d_k elementwise)."""
        B, T, _ = x.shape
        return torch.sigmoid(self.gate_proj(x)).view(B, T, self.n_head, -1).transpose(1, 2)

    def value_embed_gate(self, x: Tensor) -> Tensor:
        """Value embeddings' gate 2 sigmoid(x W_ve_gate) for x (B, T, d_model): (B, H_kv, T, 1), near 1 at init."""
        return 2 * torch.sigmoid(self.value_gate(x)).transpose(1, 2)[..., None]

    def forward(
        self,
        x: Tensor,
        padding_mask: Tensor | None = None,
        cache: LayerCache | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
        tokens: Tensor | None = None,
    ) -> Tensor:
        """x: (B, T, d_model); padding_mask: optional (B, Tk) bool over every key, True for real tokens.

        With a cache, this layer's new keys/values are stored in it and the queries attend over all
        keys so far (Tk = cached + T, or a windowed layer's last window - 1 + T); without one, Tk = T.
        rotary: RoPE's (cos, sin) for the T new positions, or None. tokens: the (B, T) ids of x, which
        value embeddings look up.
        """
        B, T, _ = x.shape
        assert tokens is not None or self.value_embed is None, "value embeddings look up the token ids; pass tokens"
        q, k, v = self.project_qkv(x, rotary, cache, tokens)  # (B, H, T, d_k), (B, H_kv, Tk, d_k)
        if cache is not None and padding_mask is not None:
            # it covers every slot; a windowed layer's cache returns only the last Tk
            padding_mask = padding_mask[:, padding_mask.shape[1] - k.shape[-2] :]
        y = self.attend(q, k, v, padding_mask)  # (B, H, T, d_k)
        if self.differential is not None:  # Ye et al. 2024: each head RMS-normed and scaled by 1 - lambda_init
            y = rms_norm(self.differential.head_norm, y) * (1 - self.differential.lambda_init)
        if self.gate_proj is not None:  # Qiu et al. 2025: y_h * sigmoid(x W_gate), per head or per channel
            y = y * self.output_gate(x)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.d_k)  # concat heads
        return self.resid_dropout(self.out_proj(y))

    def score_flops(self, context: int) -> int:
        """Hook: forward FLOPs of one query's QK^T and AV over `context` keys: 2 * context * H * d_k each.
        Every query head attends, so GQA saves nothing here (only in the K, V projections). Differential
        attention's two maps of d_k / 2 cost one map of d_k on the explicit path; a kernel, which takes them
        as 2H heads, does one more AV (not counted: the count is of the model, not of a kernel)."""
        return 2 * 2 * context * self.n_head * self.d_k

    def kernel(self, q: Tensor, key_length: int, dropout_p: float) -> str:
        """The path `attend` takes: the configured backend, or for "auto" the fastest correct one.

        That is the fused kernel, except in training (a backward will follow) over at most
        MATERIALIZED_MAX_KEYS keys on a CPU, where the materialized kernel is faster: most of its
        gain is in the backward. Inference, where small batches would pay its per-block overhead,
        and attention dropout stay fused. A change to the scores (a soft cap, sinks: GPTConfig.score_changes)
        takes the materialized kernel where it computes it and there is no dropout, else the equation.
        """
        if self.backend != "auto":
            return self.backend
        if self.score_kernels != tuple(KERNELS):  # the fused kernel cannot change the scores
            return "materialized" if "materialized" in self.score_kernels and dropout_p == 0.0 else "explicit"
        short_on_cpu = q.device.type == "cpu" and key_length <= MATERIALIZED_MAX_KEYS
        return "materialized" if short_on_cpu and q.requires_grad and dropout_p == 0.0 else "sdpa"

    def mask(
        self, query_length: int, key_length: int, padding_mask: Tensor | None = None, device: torch.device | None = None
    ) -> Tensor:
        """Which keys each query sees, (1 or B, 1, Tq, Tk): earlier ones, within the window, not padding.

        The window counts slots, not positions: padding only ever comes first in a row (left-padded
        prompts), so between a row's real tokens slots and positions advance together.
        """
        mask = build_aligned_causal_mask(query_length, key_length, device, self.window)
        return mask if padding_mask is None else mask & padding_mask[:, None, None, :]

    def weights(self, x: Tensor, rotary: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """This layer's attention weights (B, H, T, T) for its input x (B, T, d_model), from the explicit
        equation with every variant of the scores (soft cap, sinks, window): what each head reads.
        Differential attention's are the difference of its two maps, so they can be negative and a row
        sums to 1 - lambda."""
        q, k, _ = self.project_qkv(x, rotary)
        T = x.shape[1]
        lam = self.differential() if self.differential is not None else None
        return attention_weights(q, k, self.mask(T, T, device=x.device), self.softcap, self.sinks, lam)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """Causal attention of the last Tq queries over Tk keys, with an optional (B, Tk) padding mask.

        Differential attention: the explicit path computes (A1 - lambda A2) V, the equation; a kernel
        computes one softmax map per head, so it takes the two maps as 2H heads and the outputs are
        subtracted, A1 V - lambda A2 V: the same numbers (model/differential.py).
        """
        dropout_p = self.dropout if self.training else 0.0
        kernel = self.kernel(q, k.shape[-2], dropout_p)
        lam = self.differential() if self.differential is not None else None
        if lam is None or kernel == "explicit":
            return self.attend_heads(q, k, v, padding_mask, kernel, dropout_p, self.sinks, lam)
        sinks = None if self.sinks is None else self.sinks.repeat(2)  # each map's softmax has the head's sink
        y = self.attend_heads(*maps_as_heads(q, k, v), padding_mask, kernel, dropout_p, sinks)  # (B, 2H, T, d_k)
        return subtract_maps(y, lam)

    def attend_heads(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        padding_mask: Tensor | None,
        kernel: str,
        dropout_p: float,
        sinks: Tensor | None,
        diff_lambda: Tensor | None = None,
    ) -> Tensor:
        """`attend` on `kernel`, one softmax map per head of q (the explicit path also takes diff_lambda)."""
        Tq, Tk = q.shape[-2], k.shape[-2]
        causal_only = padding_mask is None and (self.window is None or self.window >= Tk)  # a window binds if shorter
        if causal_only and (Tq == 1 or kernel == "materialized"):
            # One query at the last position sees every key, and the materialized kernel is causal
            # by construction: neither needs a mask.
            mask = None
        elif causal_only and Tq == Tk and kernel == "sdpa":
            return fused_attention(q, k, v, dropout_p=dropout_p, is_causal=True)  # flash-eligible
        else:
            mask = self.mask(Tq, Tk, padding_mask, q.device)
        if kernel == "explicit":
            return scaled_dot_product_attention(q, k, v, mask, dropout_p, self.softcap, sinks, diff_lambda)
        has_visible = None
        if padding_mask is not None:
            # A padding query may see no key at all, and some fused CUDA kernels return NaN for such a
            # row (which would poison later layers even under a zero weight). As the explicit path
            # does: let the row see every key, then zero its output.
            mask, has_visible = open_blind_rows(mask)
        if kernel == "materialized":
            n_head = q.shape[1]
            k, v = expand_kv_heads(k, n_head), expand_kv_heads(v, n_head)
            y = causal_materialized_attention(q, k, v, mask, self.softcap, sinks, self.window)
        else:
            y = fused_attention(q, k, v, mask, dropout_p=dropout_p)
        return y if has_visible is None else y * has_visible
