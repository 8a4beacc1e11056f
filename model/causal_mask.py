"""Causal masks: which keys each query may see, as a boolean tensor (True = visible).

Kept apart from the kernels so that every path builds the same mask: the explicit and fused ones in
model/attention.py and the materialized one in model/materialized_attention.py.
"""

import torch
from torch import Tensor


def build_causal_mask(sequence_length: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean (1, 1, T, T) mask, True where query i may see key j (j <= i)."""
    if sequence_length < 1:
        raise ValueError(f"sequence_length must be >= 1, got {sequence_length}")
    return build_aligned_causal_mask(sequence_length, sequence_length, device)


def build_aligned_causal_mask(
    query_length: int, key_length: int, device: torch.device | str | None = None, window: int | None = None
) -> Tensor:
    """Boolean (1, 1, Tq, Tk) causal mask for queries that are the *last* Tq of Tk positions.

    This is the lower-right alignment cached decoding needs: query i sits at absolute position
    Tk - Tq + i and sees keys 0..Tk - Tq + i. (`F.scaled_dot_product_attention(is_causal=True)`
    aligns upper-left instead, which is wrong whenever Tq < Tk.) With a sliding window it sees only
    the last `window` of those, its own included: keys Tk - Tq + i - window + 1 .. Tk - Tq + i.
    """
    if query_length < 1 or key_length < query_length:
        raise ValueError(f"need 1 <= query_length <= key_length, got {query_length} and {key_length}")
    offset = key_length - query_length
    mask = torch.ones(query_length, key_length, dtype=torch.bool, device=device).tril(diagonal=offset)
    if window is not None:
        mask = mask.triu(diagonal=offset - window + 1)
    return mask.view(1, 1, query_length, key_length)
