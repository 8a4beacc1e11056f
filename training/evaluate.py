"""Scoring a model on every token of a split (bench/bench_quality.py --score); the loop's own evaluation on
fixed val batches is `Trainer.evaluate`, and bits per byte is `PreparedData.bits_per_byte`."""

import contextlib

import numpy as np
import torch
from torch import nn


@torch.no_grad()
def split_loss(
    model: nn.Module,
    tokens: np.ndarray,
    block_size: int,
    device: torch.device,
    batch_tokens: int = 32 * 1024,
    precision_ctx: contextlib.AbstractContextManager | None = None,
) -> float:
    """Mean next-token cross-entropy (nats) over *every* token of a split: non-overlapping windows of
    block_size, the last one shorter; each token is predicted once, from the window it falls in.
    Windows go batch_tokens at a time (at least one): the logits of a batch are most of its memory."""
    was_training = model.training
    model.eval()
    ids = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    n = len(ids) - 1  # every token but the first is a target
    starts = list(range(0, n, block_size))
    total = torch.zeros((), dtype=torch.float64, device=device)
    full = [s for s in starts if s + block_size <= n]
    batch_size = max(1, batch_tokens // block_size)
    groups = [full[i : i + batch_size] for i in range(0, len(full), batch_size)] + [[s] for s in starts[len(full) :]]
    for group in groups:
        length = min(block_size, n - group[0])
        x = torch.stack([ids[s : s + length] for s in group]).to(device)
        y = torch.stack([ids[s + 1 : s + 1 + length] for s in group]).to(device)
        with precision_ctx or contextlib.nullcontext():
            _, loss = model(x, y)
        total += loss.double() * y.numel()
    model.train(was_training)
    return (total / n).item()
