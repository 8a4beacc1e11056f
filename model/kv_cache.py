"""The key/value cache for autoregressive decoding, and the one rule for token positions.

Decoding token t with a causal model only needs token t's query against the keys and values of
tokens 0..t, and those of 0..t-1 do not change once computed. The cache keeps them: per layer one
preallocated (B, n_kv_head, max_length, d_k) buffer for keys and one for values, written at the
current length. Rows of a batch may start with padding (prompts of different lengths, padded on
the left); the cache remembers which slots are real so attention can ignore the rest, and positions
count from each row's first real token, so a padded row computes exactly what it would alone.

A sliding-window layer (window W, GPTConfig.layer_window) keeps only the last W - 1 slots: with the
newest token's own key those are all that this or any later query of the layer can still see. Its
update returns the kept slots followed by the new ones, so attention sees the last W - 1 + T slots in
order, the one lower-right-aligned window mask applies unchanged, and the padding of those slots is
the last columns of the cache's padding mask. Positions and RoPE come before the cache as for a full
layer: a kept key carries the rotation of its own position.

A rolling cache (rolling=True) takes one token at a time past its max_length: the oldest slot (every
layer's keys and values, its padding, pointer state and token) is dropped, the rest move one slot to
the front, and positions keep counting. A windowed layer keeps its last window - 1 slots as before; a
full layer then sees the last max_length keys. It is for models whose output never reads further back
than the cache holds (generation/generate.py, `rolls`): under rotary positions each kept key carries
the rotation of its absolute position and a score depends only on the distance between query and key,
so the rolled cache computes what a recompute of the last max_length tokens at 0..max_length - 1 does.
"""

import torch
from torch import Tensor

from model.bigram import NO_TOKEN
from model.config import GPTConfig


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

    def drop_oldest(self) -> None:
        """Move every slot one to the front, forgetting slot 0 (a rolling cache that is full)."""
        for buffer in (self.keys, self.values):
            buffer[:, :, :-1] = buffer[:, :, 1:].clone()  # an overlapping in-place copy is undefined


class WindowLayerCache(LayerCache):
    """A sliding-window layer's view of a KVCache: keeps the last window - 1 keys/values, in order."""

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Return the kept keys/values followed by k, v (B, H_kv, T, d_k): the last kept + T slots, in
        order, every one that the T new queries may see. Then keep the last window - 1 of them.

        A chunk longer than the window needs keys that keeping overwrites, so the result is a new
        tensor rather than a view of the buffer (one copy of at most window - 1 + T slots).
        """
        start, end = self.owner.start, self.owner.length
        assert k.shape[-2] == end - start, f"{k.shape[-2]} new keys for {end - start} reserved slots"
        capacity = self.keys.shape[-2]  # window - 1
        kept = min(start, capacity)
        keys = torch.cat([self.keys[:, :, :kept], k], dim=2)  # (B, H_kv, kept + T, d_k)
        values = torch.cat([self.values[:, :, :kept], v], dim=2)
        keep = min(end, capacity)
        first = keys.shape[-2] - keep  # not keys[-keep:]: keep may be 0 (a window of 1)
        self.keys[:, :, :keep] = keys[:, :, first:]
        self.values[:, :, :keep] = values[:, :, first:]
        return keys, values

    def drop_oldest(self) -> None:
        """Nothing to move: the kept slots are the last window - 1 however many the cache dropped before them
        (a rolling cache past its length takes one token at a time, so `start` >= max_length - 1 >= window - 1)."""


class KVCache:
    """Keys and values of every layer for a batch of sequences, for up to `max_length` slots.

    `windows` gives each layer's sliding window (None: full context, the default for every layer);
    a layer whose window is shorter than max_length keeps only window - 1 slots (WindowLayerCache).

    Use: `positions, padding = cache.reserve(T, padding_mask)` once per forward pass (the model
    does this), then each attention layer calls `cache.layers[i].update(k, v)`. rolling: once full, each
    further token drops the oldest slot instead of being refused (one token at a time).
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
        windows: list[int | None] | None = None,
        d_v: int | None = None,
        pointer_width: int = 0,
        rolling: bool = False,
    ) -> None:
        d_v = d_k if d_v is None else d_v  # a value's width; MLA caches its latent as a key with no value (0)
        windows = windows if windows is not None else [None] * n_layer
        if len(windows) != n_layer:
            raise ValueError(f"KV cache windows {windows} must give one window (or None: full) per layer, {n_layer}")
        if any(w is not None and w < 1 for w in windows):
            raise ValueError(f"KV cache windows {windows} are invalid; each must be >= 1 (or None: full)")

        def buffer(slots: int, width: int = d_k) -> Tensor:
            return torch.zeros((batch_size, n_kv_head, slots, width), device=device, dtype=dtype)

        def layer(window: int | None) -> LayerCache:
            if window is None or window >= max_length:  # a window as long as the cache hides nothing in it
                return LayerCache(self, buffer(max_length), buffer(max_length, d_v))
            return WindowLayerCache(self, buffer(window - 1), buffer(window - 1, d_v))

        # Separate tensors per layer (not one stacked tensor), so writing one layer's slots never
        # bumps the autograd version of another's: one forward pass with gradients through the cache
        # works (the causality tests backpropagate through it).
        self.layers = [layer(window) for window in windows]
        self.max_length = max_length
        self.real = torch.ones(batch_size, max_length, dtype=torch.bool, device=device)  # False = padding slot
        self.n_real = torch.zeros(batch_size, dtype=torch.long, device=device)  # real tokens seen, per row
        self.start = 0  # first slot of the tokens in flight
        self.length = 0  # slots filled (the same for every row)
        self.rolling = rolling
        self.dropped = 0  # slots a rolling cache has dropped from the front
        self.padded = False  # any padding so far; without it attention needs no padding mask
        # Per row, the last real token so far, which a model with a bigram table keeps here (GPT.forward).
        self.last_token = torch.full((batch_size,), NO_TOKEN, dtype=torch.long, device=device)
        # The continuous cache (model/pointer.py), pointer_width > 0: every slot's final state (float32) and token.
        self.pointer_states = torch.zeros(batch_size, max_length, pointer_width, device=device)
        self.tokens = torch.zeros(batch_size, max_length if pointer_width else 0, dtype=torch.long, device=device)

    @property
    def nbytes(self) -> int:
        """Bytes held by the key/value buffers: 2 * B * n_kv_head * d_k * itemsize per slot, max_length slots
        for a full layer and window - 1 for a windowed one."""
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.layers)

    def reset(self) -> None:
        """Forget every token (the buffers are reused, not freed)."""
        self.real.fill_(True)
        self.n_real.zero_()
        self.start = self.length = self.dropped = 0
        self.padded = False
        self.last_token.fill_(NO_TOKEN)

    def reserve(self, length: int, padding_mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Claim the next `length` slots for new tokens.

        Returns their positions (B or 1, length) and the padding mask over every filled slot
        (B, self.length), or None when no slot is padding.
        """
        if self.length + length > self.max_length:
            if not self.rolling:
                raise ValueError(
                    f"KV cache is full: {self.length} + {length} tokens exceed its {self.max_length} slots"
                )
            if length != 1:
                # a chunk's first queries would see fewer slots than the cache holds: not what a recompute sees
                raise ValueError(
                    f"a rolling KV cache takes one token at a time once full: {self.length} + {length} tokens "
                    f"exceed its {self.max_length} slots"
                )
            self.drop_oldest()
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

    def drop_oldest(self) -> None:
        """Forget the oldest slot of a full cache: every layer's, its padding, pointer state and token."""
        for layer in self.layers:
            layer.drop_oldest()
        for buffer in (self.real, self.pointer_states, self.tokens):
            if buffer.shape[1]:
                buffer[:, :-1] = buffer[:, 1:].clone()
        self.real[:, -1] = True
        self.length -= 1
        self.dropped += 1


def cache_layout(config: GPTConfig) -> tuple[int, int, int]:
    """What the cache keeps per token and layer, as (heads, key width, value width): n_kv_head keys and values
    of d_k (GQA: fewer heads); multi-head latent attention instead its latent and rope key (mla_latent +
    mla_rope_dim), held as one key head with no value (model/latent_attention.py)."""
    if config.mla_latent is not None:
        return 1, config.mla_latent + config.mla_rope_dim, 0
    return config.kv_heads, config.head_dim, config.head_dim


def kv_bytes_per_token(config: GPTConfig, dtype: torch.dtype) -> int:
    """Bytes one token takes in the cache, over every layer, in `dtype` (a windowed layer holds at most
    window - 1 tokens, each of this size)."""
    heads, key_width, value_width = cache_layout(config)
    return config.n_layer * heads * (key_width + value_width) * torch.empty(0, dtype=dtype).element_size()
