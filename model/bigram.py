"""Hashed bigram embeddings: a second token table indexed by the pair (previous token, this token).

A row of it is added to the token's embedding, so the model's input already says which two tokens end here, a
feature a small model would otherwise spend a layer's attention on (modded-nanogpt's speedrun keeps one; the hash
of the pair into a few vocabularies' worth of rows is its idea, the code is ours). Pairs share rows where the hash
collides; row 0 is the pair's absence (a sequence's first token has no previous one) and starts, like every row,
at zero, so the model begins as it would without the table.

The previous token is the last *real* token before this one: padding is skipped, and with a KV cache the first new
token's previous one is the last token the cache saw (KVCache.last_token), so decoding computes what one forward
pass over the whole sequence does.
"""

import torch
from torch import Tensor, nn

# Two odd multipliers spread (previous, current) over the int64 range before the modulo; any two large odd
# constants do, these are primes.
PREVIOUS_MULTIPLIER = 1_000_003
CURRENT_MULTIPLIER = 998_244_353
NO_TOKEN = -1  # "no previous token": a sequence's first, or a row of only padding so far


def tokens_before(idx: Tensor, padding_mask: Tensor | None = None, last: Tensor | None = None) -> Tensor:
    """(B, T + 1): the last real token before each position of idx, and in column T the last real token of all
    (what a KV cache keeps for the next call); NO_TOKEN where there is none.

    padding_mask (B, T): True for real tokens; last (B,): the last real token before idx (NO_TOKEN: none)."""
    B, T = idx.shape
    if padding_mask is None and last is None:  # training's case, kept to one shift so the compiled step stays small
        return torch.cat([idx.new_full((B, 1), NO_TOKEN), idx], dim=1)
    last = idx.new_full((B,), NO_TOKEN) if last is None else last
    tokens = torch.cat([last[:, None], idx], dim=1)  # (B, T + 1): slot 0 is what came before idx
    real = torch.cat([last[:, None] != NO_TOKEN, torch.ones_like(idx, dtype=torch.bool)], dim=1)
    if padding_mask is not None:
        real[:, 1:] = padding_mask
    slots = torch.arange(T + 1, device=idx.device).expand(B, -1)
    latest = torch.where(real, slots, -1).cummax(dim=1).values  # the last real slot at or before each slot
    return torch.where(latest >= 0, tokens.gather(1, latest.clamp(min=0)), NO_TOKEN)


def previous_tokens(idx: Tensor, padding_mask: Tensor | None = None, last: Tensor | None = None) -> Tensor:
    """(B, T): the last real token before each position of idx, NO_TOKEN where there is none (tokens_before)."""
    return tokens_before(idx, padding_mask, last)[:, :-1]


def bigram_rows(previous: Tensor, idx: Tensor, rows: int) -> Tensor:
    """The table row of each (previous, current) pair: 0 where there is no previous token, else 1..rows - 1."""
    mixed = (previous * PREVIOUS_MULTIPLIER) ^ (idx * CURRENT_MULTIPLIER)
    return torch.where(previous == NO_TOKEN, 0, 1 + mixed.remainder(rows - 1))


class BigramEmbedding(nn.Module):
    """rows x d_model table of hashed token pairs, read by `forward(previous, idx)` -> (B, T, d_model)."""

    def __init__(self, rows: int, d_model: int) -> None:
        super().__init__()
        self.table = nn.Embedding(rows, d_model)

    def forward(self, previous: Tensor, idx: Tensor) -> Tensor:
        return self.table(bigram_rows(previous, idx, self.table.num_embeddings))
