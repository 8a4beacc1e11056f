"""Multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2"): keys and values from a low-rank latent.

    c = x W_DKV,   K_h = c W_UK_h,   V_h = c W_UV_h      (c: d_c = mla_latent channels per token)

so the KV cache keeps c, d_c numbers per token and layer, instead of the 2 H_kv d_k of keys and values.

RoPE cannot rotate K_h = c W_UK_h once and cache it, since K_h is not what is cached: every step would
have to rotate every cached key again. As in the paper it rides on channels of its own (decoupled RoPE):
each head's query gets a part q_R = RoPE(x W_QR)_h and every head's key the same shared rope key
k_R = RoPE(x W_KR), d_R = d_k / 2 channels each (the paper's d_h^R = d_h / 2), so the scores are
(q_C . k_C + q_R . k_R) / sqrt(d_k + d_R), and the cache keeps [c ; k_R], k_R rotated once, at its position.

Simpler than the paper, for a short module: queries are not compressed (DeepSeek-V2-Lite does the same),
the latent has no RMSNorm of its own, and keys and values are up-projected from the cached latent at each
step rather than W_UK folded into the queries and W_UV into W_O (the same function; more FLOPs when
decoding). n_kv_head counts the key/value heads the latent is up-projected to (GQA on top of MLA);
QK-norm normalises the content parts q_C and k_C.
"""

import torch
from torch import Tensor, nn

from model.attention import CausalSelfAttention
from model.config import GPTConfig
from model.position import apply_rotary


class MultiHeadLatentAttention(CausalSelfAttention):
    """CausalSelfAttention with keys and values from a cached latent. It replaces only the parent's hooks
    (CausalSelfAttention.HOOKS): how the queries and the latent come from x, and the keys and values from the
    latent; the path through them (`project_qkv`), the kernels, the masks, the gate and W_O are the parent's.
    qkv_proj holds W_Q | W_QR | W_DKV | W_KR (one matmul from x), kv_up_proj W_UK | W_UV."""

    def __init__(self, config: GPTConfig, layer: int = 0) -> None:
        super().__init__(config, layer)
        self.d_c, self.d_rope = config.mla_latent, config.mla_rope_dim  # d_rope 0 without RoPE
        self.kv_up_proj = nn.Linear(self.d_c, 2 * self.n_kv_head * self.d_k, bias=config.bias)  # W_UK | W_UV

    def projection_width(self, config: GPTConfig) -> int:
        """W_Q | W_QR | W_DKV | W_KR: each head's query and its rope part, the latent and the shared rope key."""
        d_rope = config.mla_rope_dim
        return config.n_head * (config.head_dim + d_rope) + config.mla_latent + d_rope

    def project(self, x: Tensor, rotary: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, d_model) -> q (B, H, T, d_k + d_R), and what the cache keeps: latent (B, 1, T, d_c + d_R),
        c and the rotated rope key, shaped as one key head, as its keys, and no values (B, 1, T, 0)."""
        B, T, _ = x.shape
        q, latent = self.qkv_proj(x).split([self.n_head * (self.d_k + self.d_rope), self.d_c + self.d_rope], dim=-1)
        q = q.view(B, T, self.n_head, -1).transpose(1, 2)  # (B, H, T, d_k + d_R)
        latent = latent[:, None]  # (B, 1, T, d_c + d_R)
        q_content, q_rope = q.split([self.d_k, self.d_rope], dim=-1)
        q = self.norm_and_rotate(q_content, self.q_norm, None)
        if self.d_rope:
            assert rotary is not None, "MLA under RoPE rotates its rope channels; pass rotary"
            c, k_rope = latent.split([self.d_c, self.d_rope], dim=-1)
            q = torch.cat([q, apply_rotary(q_rope, rotary)], dim=-1)
            latent = torch.cat([c, apply_rotary(k_rope, rotary)], dim=-1)
        return q, latent, latent[..., :0]

    def keys_values(self, latent: Tensor, _: Tensor) -> tuple[Tensor, Tensor]:
        """latent (B, 1, Tk, d_c + d_R), as the cache keeps it, -> k (B, H_kv, Tk, d_k + d_R), c W_UK_h then
        the shared rope key, and v (B, H_kv, Tk, d_k), c W_UV_h."""
        B, _, Tk, _ = latent.shape
        c, k_rope = latent[:, 0].split([self.d_c, self.d_rope], dim=-1)  # (B, Tk, d_c), (B, Tk, d_R)
        kv = self.kv_up_proj(c).view(B, Tk, 2 * self.n_kv_head, self.d_k).transpose(1, 2)  # (B, 2 H_kv, Tk, d_k)
        k, v = kv.chunk(2, dim=1)
        k = self.norm_and_rotate(k, self.k_norm, None)
        if self.d_rope:  # one rope key, shared by every head
            k = torch.cat([k, k_rope[:, None].expand(B, self.n_kv_head, Tk, self.d_rope)], dim=-1)
        return k, v

    def score_flops(self, context: int) -> int:
        """Forward FLOPs of one query's QK^T (over d_k + d_R channels) and AV (over d_k) for `context` keys."""
        return 2 * context * self.n_head * (2 * self.d_k + self.d_rope)
