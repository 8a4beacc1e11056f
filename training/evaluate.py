"""Validation metrics: loss, perplexity and bits per byte (comparable across tokenizers)."""

import contextlib
import math

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
