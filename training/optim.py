"""AdamW with weight-decay groups and the warmup + cosine learning-rate schedule."""

import inspect
import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class OptimConfig:
    lr: float = 1e-3
    min_lr: float = 1e-4  # floor of the cosine decay
    warmup_steps: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # max global grad norm; 0 disables

    def validate(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optim.lr={self.lr} is invalid; it must be > 0")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"optim.min_lr={self.min_lr} is invalid; it must be in [0, optim.lr={self.lr}]")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps={self.warmup_steps} is invalid; it must be >= 0")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay={self.weight_decay} is invalid; it must be >= 0")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"optim.{name}={getattr(self, name)} is invalid; it must be in [0, 1)")
        if self.grad_clip < 0:
            raise ValueError(f"optim.grad_clip={self.grad_clip} is invalid; it must be >= 0 (0 disables)")


def build_optimizer(model: nn.Module, cfg: OptimConfig, device_type: str) -> torch.optim.AdamW:
    """Decay matrices (matmul weights, embeddings); never biases or LayerNorm gains."""
    params = [p for p in model.parameters() if p.requires_grad]  # tied weights appear once
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # The fused kernel is one launch per step on CUDA; on CPU the foreach path is the fast one.
    fused = device_type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused or None, foreach=None if fused else True
    )


def lr_at(step: int, progress: float, cfg: OptimConfig) -> float:
    """Linear warmup to lr over warmup_steps, then cosine decay to min_lr as progress (0..1) reaches 1.

    progress is the fraction of training done: step / max_steps, or elapsed / budget_s under a time
    budget, so the decay lands at the end on a fast or a slow machine alike.
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(max(progress, 0.0), 1.0)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)
