"""Which attention heads matter (Michel et al. 2019, "Are Sixteen Heads Really Better than One?").

For a trained GPT and a fixed set of validation windows:
- the loss change when each head alone is masked (its gate set to 0, analysis/head_mask.py);
- the paper's importance score I_h = E_x |d loss / d gate_h| at gates of ones, averaged over
  batches and normalised per layer by its L2 norm (the paper's layer-wise normalisation)
  (head_scores gives both: the numbers of the one-checkpoint report and of head importance over training);
- a greedy pruning curve: heads removed cumulatively in increasing order of importance;
- what each head looks at, from the explicit attention weights: mean entropy of its rows, mass on
  the first position (an "attention sink"), and mean weight on the previous token (t - 1).
Query position 0 sees only itself, so its row is left out of the three attention statistics.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from analysis.attention import attention_maps
from analysis.head_mask import gates_without, head_gates, ones_gates
from model import GPT

Batches = list[tuple[Tensor, Tensor]]


def as_batches(idx_or_batches: Tensor | Batches) -> Batches:
    """Token ids (T + 1,) or (B, T + 1) -> one (inputs, next-token targets) batch; batches pass through."""
    if isinstance(idx_or_batches, Tensor):
        idx = idx_or_batches if idx_or_batches.ndim == 2 else idx_or_batches[None]
        if idx.ndim != 2 or idx.shape[1] < 2:
            raise ValueError(f"token ids have shape {tuple(idx_or_batches.shape)}; give (T + 1,) or (B, T + 1), T >= 1")
        return [(idx[:, :-1], idx[:, 1:])]
    if not idx_or_batches:
        raise ValueError("no batches given; give token ids or at least one (inputs, targets) batch")
    return list(idx_or_batches)


def gated_loss(model: GPT, batches: Batches, gates: Tensor) -> Tensor:
    """Mean next-token loss over `batches` with head outputs scaled by `gates` (L, H); differentiable."""
    device = model.tok_emb.weight.device
    with head_gates(model, gates):
        losses = [model(x.to(device), y.to(device))[1].float() for x, y in batches]
    return torch.stack(losses).mean()


@torch.no_grad()
def masked_loss(model: GPT, idx_or_batches: Tensor | Batches, heads_off: list[tuple[int, int]]) -> float:
    """Mean next-token loss (nats) with the heads in `heads_off` ((layer, head) pairs) switched off.

    `idx_or_batches`: token ids (T + 1,) or (B, T + 1) (each position predicts the next), or a list
    of (inputs, targets) batches. Eval mode; the model is left as it was found.
    """
    was_training = model.training
    model.eval()
    try:
        return gated_loss(model, as_batches(idx_or_batches), gates_without(model, heads_off)).item()
    finally:
        model.train(was_training)


@torch.no_grad()
def single_head_effects(model: GPT, batches: Batches) -> tuple[float, Tensor]:
    """The loss with every head on, and (L, H) loss(head alone off) - loss(all on)."""
    base = masked_loss(model, batches, [])
    c = model.config
    effects = torch.zeros(c.n_layer, c.n_head)
    for layer in range(c.n_layer):
        for head in range(c.n_head):
            effects[layer, head] = masked_loss(model, batches, [(layer, head)]) - base
    return base, effects


def gradient_importance(model: GPT, batches: Batches) -> tuple[Tensor, Tensor]:
    """The paper's score: mean over batches of |d loss / d gate| at gates of ones -> (raw, per-layer L2-normalised)."""
    was_training = model.training
    model.eval()
    scores = torch.zeros(model.config.n_layer, model.config.n_head)
    for batch in batches:
        gates = ones_gates(model).requires_grad_(True)
        (grad,) = torch.autograd.grad(gated_loss(model, [batch], gates), gates)
        scores += grad.abs().cpu()
    model.train(was_training)
    raw = scores / len(batches)
    norm = raw.norm(dim=1, keepdim=True).clamp_min(1e-12)  # (L, 1)
    return raw, raw / norm


def head_scores(model: GPT, batches: Batches) -> dict[str, float | list[list[float]]]:
    """Both measures of every head on `batches`, as plain lists (layer-major): the loss with every head on
    (base_loss), its change with each head alone masked (delta_loss), and the paper's score (importance,
    per-layer normalised; importance_raw)."""
    base, delta = single_head_effects(model, batches)
    raw, importance = gradient_importance(model, batches)
    return {
        "base_loss": base,
        "delta_loss": delta.tolist(),
        "importance": importance.tolist(),
        "importance_raw": raw.tolist(),
    }


def pruning_curve(model: GPT, batches: Batches, importance: Tensor) -> list[tuple[float, float]]:
    """(fraction of heads removed, loss) as heads go off one by one, least important first (ties by index)."""
    L, H = importance.shape
    order = sorted((importance[layer, head].item(), layer, head) for layer in range(L) for head in range(H))
    curve, off = [(0.0, masked_loss(model, batches, []))], []
    for _, layer, head in order:
        off.append((layer, head))
        curve.append((len(off) / (L * H), masked_loss(model, batches, off)))
    return curve


@dataclass
class AttentionStats:
    """(L, H) per-head means over query positions t >= 1 of the given sequences."""

    entropy: Tensor  # nats; ln(t + 1) is uniform attention over the t + 1 keys a row sees
    first_position: Tensor  # weight on key 0
    previous_token: Tensor  # weight on key t - 1


def attention_stats(model: GPT, sequences: list[Tensor]) -> AttentionStats:
    """Means over the sequences (each (T,), T >= 2) of each head's row statistics."""
    totals = None
    for idx in sequences:
        maps, _ = attention_maps(model, idx)  # (L, H, T, T)
        rows = maps[:, :, 1:, :]  # (L, H, T-1, T): query 0 sees only itself
        entropy = -(rows * rows.clamp_min(1e-30).log()).sum(-1).mean(-1)
        first = rows[..., 0].mean(-1)
        previous = torch.diagonal(maps, offset=-1, dim1=-2, dim2=-1).mean(-1)  # weight of t on t - 1
        stats = torch.stack([entropy, first, previous])
        totals = stats if totals is None else totals + stats
    if totals is None:
        raise ValueError("no sequences given for the attention statistics")
    mean = totals.cpu() / len(sequences)
    return AttentionStats(mean[0], mean[1], mean[2])


def uniform_entropy(T: int, window: int | None = None) -> float:
    """Mean entropy of uniform causal attention over rows t = 1..T-1 (the most diffuse a head can be); a layer
    with a sliding `window` sees at most that many keys (model.window_size: ln(window) at most)."""
    keys = [t + 1 if window is None else min(t + 1, window) for t in range(1, T)]
    return sum(math.log(k) for k in keys) / max(1, T - 1)
