"""Batches of (input, target) windows cut from a flat token array, as pure functions of their keys.

Offsets come from a generator seeded with (seed, step, micro_step, rank), so a batch depends on
nothing but those numbers: a resumed run sees exactly the batches it would have seen, and ranks
of a distributed run draw different windows without talking to each other.
"""

import numpy as np
import torch


def check_block_size(tokens: np.ndarray, block_size: int, split: str = "train") -> None:
    """Raise ValueError unless `tokens` holds at least one window of block_size + 1 tokens."""
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be >= 1")
    if len(tokens) <= block_size:
        raise ValueError(f"{split} split has {len(tokens)} tokens; it needs more than block_size={block_size}")


def sample_batch(
    tokens: np.ndarray,
    batch_size: int,
    block_size: int,
    *,
    seed: int,
    step: int,
    micro_step: int = 0,
    rank: int = 0,
    split: str = "train",
) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 (x, y), both (batch_size, block_size), where y[:, t] is the token after x[:, t]."""
    check_block_size(tokens, block_size, split)
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    rng = np.random.default_rng([seed, step, micro_step, rank])
    # The window [start, start + block_size] must fit, hence the exclusive high end.
    starts = rng.integers(0, len(tokens) - block_size, size=batch_size)
    windows = np.stack([tokens[s : s + block_size + 1] for s in starts]).astype(np.int64)  # (B, T+1)
    x = torch.from_numpy(windows[:, :-1].copy())  # (B, T)
    y = torch.from_numpy(windows[:, 1:].copy())  # (B, T)
    return x, y


def eval_batches(
    tokens: np.ndarray, batch_size: int, block_size: int, num_batches: int, seed: int, split: str = "val"
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same `num_batches` batches on every call, so evaluations are comparable across steps."""
    return [sample_batch(tokens, batch_size, block_size, seed=seed, step=i, split=split) for i in range(num_batches)]
