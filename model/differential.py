"""Differential attention (Ye et al. 2024, "Differential Transformer"): the difference of two softmax maps.

Each head splits its d_k query and key channels into halves (Q1 | Q2, K1 | K2) and reads

    (softmax(Q1 K1^T / sqrt(d) + mask) - lambda softmax(Q2 K2^T / sqrt(d) + mask)) V,   d = d_k / 2,

so noise that both maps put on the same keys cancels. lambda is one learned scalar per layer,

    lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init,   lambda_init = 0.8 - 0.6 exp(-0.3 layer),

(the paper's schedule, layer counted from 0), and each head's output goes through an RMSNorm and is scaled by
1 - lambda_init. V keeps its d_k channels. model/attention.py computes the weights' difference on the explicit
path; a kernel computes one softmax map per head, so it takes the two maps as 2H heads (`maps_as_heads`) and
their outputs are subtracted (`subtract_maps`): A1 V - lambda A2 V is the same product, with one more AV.
"""

import math

import torch
from torch import Tensor, nn


def lambda_init(layer: int) -> float:
    """The paper's starting lambda for layer `layer` (from 0): 0.2 at the first layer, towards 0.8 deeper."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


class DifferentialLambda(nn.Module):
    """A layer's learned lambda and the RMSNorm its heads' outputs go through.

    lq1, lk1, lq2, lk2 are bare parameters of d_k / 2 each; GPT.reset_parameters draws them from
    N(0, 0.1), as the paper does, so lambda starts near lambda_init.
    """

    def __init__(self, d_k: int, layer: int) -> None:
        super().__init__()
        self.lambda_init = lambda_init(layer)
        self.lq1, self.lk1, self.lq2, self.lk2 = (nn.Parameter(torch.zeros(d_k // 2)) for _ in range(4))
        self.head_norm = nn.RMSNorm(d_k, eps=1e-5)  # one gain per channel of a head, shared by the heads

    def forward(self) -> Tensor:
        """lambda, a float32 scalar (a 0-dim tensor keeps the dtype of what it multiplies)."""
        first, second = (self.lq1.float() @ self.lk1.float()), (self.lq2.float() @ self.lk2.float())
        return torch.exp(first) - torch.exp(second) + self.lambda_init


def maps_as_heads(q: Tensor, k: Tensor, v: Tensor | None = None) -> tuple[Tensor, ...]:
    """The two maps as heads of their own: q (B, H, T, d_k) -> (B, 2H, T, d_k / 2), first halves first; k the
    same with H_kv heads; v (B, H_kv, T, d_k) repeated -> (B, 2 H_kv, T, d_k). Query head H + h reads key/value
    head H_kv + h // group, the second half of the key head its query head h used: GQA's grouping survives."""
    q, k = (torch.cat(t.chunk(2, dim=-1), dim=1) for t in (q, k))
    return (q, k) if v is None else (q, k, torch.cat((v, v), dim=1))


def subtract_maps(x: Tensor, lam: Tensor) -> Tensor:
    """(B, 2H, ...) of the two maps' heads -> (B, H, ...): first map minus lambda times the second. Works on
    weights (B, 2H, Tq, Tk) and on outputs (B, 2H, Tq, d_k) alike, as the product with V is linear."""
    first, second = x.chunk(2, dim=1)
    return first - lam * second
