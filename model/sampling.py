"""Choosing the next token from logits: greedy, temperature, top-k and nucleus (top-p) sampling.

Pure functions; randomness comes only from the `torch.Generator` passed in, so a seed reproduces a
sample exactly. Top-p is from Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration".
"""

import torch
from torch import Tensor


def check_sampling_args(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise ValueError naming the first bad sampling setting."""
    if temperature < 0:
        raise ValueError(f"temperature={temperature} is invalid; it must be >= 0 (0 = greedy)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k} is invalid; it must be >= 1 (or null for no limit)")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p={top_p} is invalid; it must be in (0, 1] (or null for no limit)")


def keep_top_k(logits: Tensor, k: int) -> Tensor:
    """Logits (B, V) with all but the k largest per row set to -inf (exactly k kept, ties broken by index)."""
    top = torch.topk(logits, min(k, logits.shape[-1]), dim=-1)
    return torch.full_like(logits, float("-inf")).scatter(-1, top.indices, top.values)


def keep_top_p(logits: Tensor, p: float) -> Tensor:
    """Logits (B, V) restricted to the smallest set of most likely tokens whose probability reaches p."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above each one
    sorted_logits = sorted_logits.masked_fill(mass_before >= p, float("-inf"))  # the top token always stays
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Next token ids (B,) from last-position logits (B, V); greedy (argmax) when temperature == 0."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None:
        logits = keep_top_k(logits, top_k)
    if top_p is not None and top_p < 1.0:
        logits = keep_top_p(logits, top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)
