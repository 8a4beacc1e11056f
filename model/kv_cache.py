"""The key/value cache for autoregressive decoding, and the one rule for token positions.

Decoding token t with a causal model only needs token t's query against the keys and values of
tokens 0..t, and those of 0..t-1 do not change once computed. The cache keeps them: per layer one
preallocated (B, n_kv_head, max_length, d_k) buffer for keys and one for values, written at the
current length. Rows of a batch may start with padding (prompts of different lengths, padded on
the left); the cache remembers which slots are real so attention can ignore the rest, and positions
count from each row's first real token, so a padded row computes exactly what it would alone.
"""

import torch
from torch import Tensor


def token_positions(
    length: int, padding_mask: Tensor | None = None, offset: Tensor | int = 0, device: torch.device | None = None
) -> Tensor:
    """Positions of `length` new tokens that follow `offset` real tokens already seen (per row).

    Without padding they are offset .. offset + length - 1. With a (B, length) padding mask (True
    = real token) only real tokens advance the count; padding repeats the position of the real token
    before it (0 at the start of a row), which never matters because attention ignores padding.
    Returns (1, length) or (B, length).
    """
    if padding_mask is not None:
        steps = padding_mask.long().cumsum(-1)  # (B, T): real tokens so far, including this one
    else:
        steps = torch.arange(1, length + 1, device=device)[None]  # (1, T)
    if isinstance(offset, Tensor):
        offset = offset[:, None]
    return (steps + offset - 1).clamp(min=0)


class LayerCache:
    """One layer's view of a KVCache: stores its new keys/values and returns all of them so far."""

    def __init__(self, owner: "KVCache", keys: Tensor, values: Tensor) -> None:
        self.owner = owner
        self.keys = keys  # (B, H_kv, max_length, d_k)
        self.values = values

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v (B, H_kv, T, d_k) at the slots the owner reserved; return keys/values of every filled slot."""
        start, end = self.owner.start, self.owner.length
        assert k.shape[-2] == end - start, f"{k.shape[-2]} new keys for {end - start} reserved slots"
        self.keys[:, :, start:end] = k
        self.values[:, :, start:end] = v
        return self.keys[:, :, :end], self.values[:, :, :end]  # (B, H_kv, end, d_k)


class KVCache:
    """Keys and values of every layer for a batch of sequences, for up to `max_length` slots.

    Use: `positions, padding = cache.reserve(T, padding_mask)` once per forward pass (the model
    does this), then each attention layer calls `cache.layers[i].update(k, v)`.
    """

    def __init__(
        self,
        n_layer: int,
        batch_size: int,
        n_kv_head: int,
        max_length: int,
        d_k: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        shape = (batch_size, n_kv_head, max_length, d_k)

        def buffer() -> Tensor:
            return torch.zeros(shape, device=device, dtype=dtype)

        # Separate tensors per layer (not one stacked tensor), so writing one layer's slots never
        # bumps the autograd version of another's: one forward pass with gradients through the cache
        # works (the causality tests backpropagate through it).
        self.layers = [LayerCache(self, buffer(), buffer()) for _ in range(n_layer)]
        self.max_length = max_length
        self.real = torch.ones(batch_size, max_length, dtype=torch.bool, device=device)  # False = padding slot
        self.n_real = torch.zeros(batch_size, dtype=torch.long, device=device)  # real tokens seen, per row
        self.start = 0  # first slot of the tokens in flight
        self.length = 0  # slots filled (the same for every row)
        self.padded = False  # any padding so far; without it attention needs no padding mask

    @property
    def nbytes(self) -> int:
        """Bytes held by the key/value buffers: 2 * n_layer * B * n_kv_head * max_length * d_k * itemsize."""
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.layers)

    def reset(self) -> None:
        """Forget every token (the buffers are reused, not freed)."""
        self.real.fill_(True)
        self.n_real.zero_()
        self.start = self.length = 0
        self.padded = False

    def reserve(self, length: int, padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Claim the next `length` slots for new tokens.

        Returns their positions (B or 1, length) and the padding mask over every filled slot
        (B, self.length), or None when no slot is padding.
        """
        if self.length + length > self.max_length:
            raise ValueError(f"KV cache is full: {self.length} + {length} tokens exceed its {self.max_length} slots")
        device = self.n_real.device
        positions = token_positions(length, padding_mask, self.n_real, device)
        self.start, self.length = self.length, self.length + length
        if padding_mask is None:
            self.n_real += length
        else:
            self.real[:, self.start : self.length] = padding_mask
            self.n_real += padding_mask.sum(-1)
            self.padded = True
        return positions, self.real[:, : self.length] if self.padded else None
