"""How the model knows where a token is: learned, sinusoidal or rotary (RoPE) positions.

- `learned` (GPT-2): a trained (block_size, d_model) table added to the token embeddings. It has no
  row for a position >= block_size, so such a model never sees one.
- `sinusoidal` ("Attention Is All You Need", section 3.5): the fixed table
  PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)),
  added to the token embeddings and computed for any position.
- `rope` (Su et al. 2021, "RoFormer"): no table at all; each attention layer rotates every
  (x_i, x_{i + d_k/2}) pair of a query or key by the angle pos * base^(-2i/d_k). A rotation by
  angle(m) on q and by angle(n) on k leaves q.k depending on m - n only, so attention scores see
  relative positions. The pairing is the half-split one of GPT-NeoX and Llama (not the adjacent
  pairs of the paper): the same math with one permutation of the weights, and no strided copies.

Angles are float32, from integer positions. RoPE keeps the cos/sin of positions 0..block_size - 1 in a
float32 table that a cast of the model (`model.to(bf16)`) recomputes rather than rounds, since large
positions need the precision: a compiled step read from it instead of recomputing pow, cos and sin per
element in every layer's kernels, forward and backward (docs/evidence/recipe/round10.md). Other positions (left
padding, a KV cache, beyond the table) are computed on the call.
"""

from collections.abc import Callable

import torch
from torch import Tensor, nn

SINUSOID_BASE = 10000.0


def inverse_frequencies(dim: int, base: float, device: torch.device | None = None) -> Tensor:
    """base^(-2i/dim) for i = 0 .. ceil(dim/2) - 1, float32: one frequency per pair of channels."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim)


def angles(positions: Tensor, dim: int, base: float) -> Tensor:
    """pos * base^(-2i/dim) for integer positions (B or 1, T) -> (B or 1, T, ceil(dim/2)), float32."""
    return positions.float()[..., None] * inverse_frequencies(dim, base, positions.device)


class SinusoidalPositions(nn.Module):
    """The fixed sinusoid table of the Transformer paper, for any position; no parameters."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model

    def forward(self, positions: Tensor) -> Tensor:
        """(B or 1, T) integer positions -> (B or 1, T, d_model) float32, sin/cos interleaved."""
        theta = angles(positions, self.d_model, SINUSOID_BASE)  # (B, T, ceil(d/2))
        table = torch.stack((theta.sin(), theta.cos()), dim=-1).flatten(-2)  # sin, cos, sin, cos, ...
        return table[..., : self.d_model]  # an odd d_model ends with a sine


class RotaryEmbedding(nn.Module):
    """RoPE's cos/sin for given positions; `apply_rotary` turns them into rotated queries and keys.
    `leading(T)` is those of positions 0..T - 1, from the table of the first `table_length`."""

    def __init__(self, d_k: int, base: float = 10000.0, table_length: int = 0) -> None:
        super().__init__()
        if d_k % 2:
            raise ValueError(f"RoPE rotates pairs of channels; the head dim d_k ({d_k}) must be even")
        self.d_k = d_k
        self.base = base
        # Not saved (persistent=False): checkpoints and exports hold weights only, and the table is a function of them.
        self.register_buffer("cos_table", torch.empty(0), persistent=False)
        self.register_buffer("sin_table", torch.empty(0), persistent=False)
        self.fill_table(table_length, None)

    def fill_table(self, length: int, device: torch.device | None) -> None:
        if torch.empty(0, device=device).is_meta:  # a shapes-only build: the tables' size, no values (arange on
            self.cos_table = torch.empty(1, 1, length, self.d_k // 2, device=device)  # meta imports torch._dynamo)
            self.sin_table = torch.empty_like(self.cos_table)
            return
        self.cos_table, self.sin_table = self(torch.arange(length, device=device)[None])

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> "RotaryEmbedding":
        """A move or cast of the model: a table cast to another dtype is computed again in float32."""
        super()._apply(fn, recurse)
        if self.cos_table.dtype != torch.float32:
            self.fill_table(self.cos_table.shape[-2], self.cos_table.device)
        return self

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(B or 1, T) integer positions -> cos, sin, each (B or 1, 1, T, d_k / 2) float32."""
        theta = angles(positions, self.d_k, self.base)[:, None]  # (B, 1, T, d_k/2): one angle for all heads
        return theta.cos(), theta.sin()

    def leading(self, length: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """cos, sin of positions 0..length - 1, each (1, 1, length, d_k / 2) float32: the table's when it has them."""
        if length <= self.cos_table.shape[-2]:
            return self.cos_table[:, :, :length], self.sin_table[:, :, :length]
        return self(torch.arange(length, device=device)[None])


def apply_rotary(x: Tensor, rotary: tuple[Tensor, Tensor]) -> Tensor:
    """Rotate each pair (x_i, x_{i + D/2}) of x (B, H, T, D) by its angle; float32 math, x's dtype out."""
    cos, sin = rotary
    x1, x2 = x.float().chunk(2, dim=-1)  # (B, H, T, D/2) each
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.type_as(x)
