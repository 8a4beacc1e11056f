"""Validation metrics: loss, perplexity and bits per byte (comparable across tokenizers)."""

import contextlib
import math

import numpy as np
import torch
from torch import Tensor, nn


@torch.no_grad()
def mean_loss(
    model: nn.Module,
    batches: list[tuple[Tensor, Tensor]],
    device: torch.device,
    precision_ctx: contextlib.AbstractContextManager | None = None,
) -> float:
    """Mean next-token cross-entropy (nats) over fixed batches, in eval mode."""
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=device)
    for x, y in batches:
        with precision_ctx or contextlib.nullcontext():
            _, loss = model(x.to(device), y.to(device))
        total += loss.float()
    model.train(was_training)
    return (total / len(batches)).item()


def bits_per_byte(loss_nats: float, num_tokens: int, num_bytes: int) -> float:
    """Cross-entropy in bits per UTF-8 byte of the text: loss / ln 2 * tokens / bytes."""
    return loss_nats / math.log(2) * num_tokens / num_bytes


def eval_metrics(loss_nats: float, num_tokens: int, num_bytes: int, prefix: str = "val") -> dict[str, float]:
    return {
        f"{prefix}/loss": loss_nats,
        f"{prefix}/ppl": math.exp(min(loss_nats, 50.0)),
        f"{prefix}/bpb": bits_per_byte(loss_nats, num_tokens, num_bytes),
    }


@torch.no_grad()
def split_loss(
    model: nn.Module,
    tokens: np.ndarray,
    block_size: int,
    device: torch.device,
    batch_size: int = 32,
    precision_ctx: contextlib.AbstractContextManager | None = None,
) -> float:
    """Mean next-token cross-entropy (nats) over *every* token of a split: non-overlapping windows of
    block_size, the last one shorter; each token is predicted once, from the window it falls in."""
    was_training = model.training
    model.eval()
    ids = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    n = len(ids) - 1  # every token but the first is a target
    starts = list(range(0, n, block_size))
    total = torch.zeros((), dtype=torch.float64, device=device)
    full = [s for s in starts if s + block_size <= n]
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
