"""Optimizers (AdamW, or Muon for the hidden matrices with AdamW for the rest), their parameter
groups, and the learning-rate schedules as a pure function of (step, progress).

Muon (Jordan et al. 2024; `torch.optim.Muon`) orthogonalises each update of a 2-D matrix by a
few Newton-Schulz iterations, which suits the matmul weights inside the blocks; embeddings, the
LM head, norm gains and biases are not such matrices and stay with AdamW. The two optimizers are
wrapped in one `CombinedOptimizer`, which the trainer, the GradScaler and checkpoints treat as a
single torch optimizer.

torch's Muon runs Newton-Schulz in bf16, which a CPU without native bf16 (AVX2 only) computes ~50x
slower than fp32 (measured: a 768x512x512 matmul takes 760 ms against 13 ms); on a CPU,
`Float32Muon` runs the same update with the iteration in float32 instead.

Every parameter group carries `lr_scale`: its peak lr over `optim.lr`. `set_lr` multiplies the
schedule's lr by it, so one schedule moves every group by the same factor.
"""

import inspect
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, distribute_tensor

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "wsd")
COOLDOWNS = ("linear", "1-sqrt")


@dataclass
class OptimConfig:
    optimizer: str = "adamw"  # "adamw" (every parameter) or "muon" (block matrices; AdamW for the rest)
    lr: float = 1e-3  # AdamW's peak lr
    min_lr: float = 1e-4  # where the decay ends, at progress 1 (Muon's groups end at min_lr * lr_scale)
    warmup_steps: int = 50  # linear warmup from lr / warmup_steps, in optimizer steps
    schedule: str = "cosine"  # "cosine" (to min_lr at progress 1) or "wsd" (warmup, stable, decay)
    cooldown_frac: float = 0.2  # wsd: the last fraction of progress spent decaying to min_lr
    cooldown: str = "linear"  # wsd's decay shape: "linear" or "1-sqrt" (Hagele et al. 2024)
    weight_decay: float = 0.1  # matmul weights (and an untied LM head)
    embedding_weight_decay: float = 0.0  # token/position tables (and a tied head); gains, biases never
    beta1: float = 0.9
    beta2: float = 0.99
    muon_lr: float = 0.02  # Muon's peak lr for the block matrices
    muon_momentum: float = 0.95
    muon_weight_decay: float = 0.0  # decoupled, times Muon's lr
    grad_clip: float = 1.0  # max global grad norm; 0 disables

    def validate(self) -> None:
        choices = {"optimizer": OPTIMIZERS, "schedule": SCHEDULES, "cooldown": COOLDOWNS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"optim.{name}={getattr(self, name)!r} is unknown; choose one of: {', '.join(allowed)}"
                )
        for name in ("lr", "muon_lr"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"optim.{name}={getattr(self, name)} is invalid; it must be a finite number > 0")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"optim.min_lr={self.min_lr} is invalid; it must be in [0, optim.lr={self.lr}]")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps={self.warmup_steps} is invalid; it must be >= 0")
        if not 0 < self.cooldown_frac <= 1:
            raise ValueError(f"optim.cooldown_frac={self.cooldown_frac} is invalid; it must be in (0, 1]")
        for name in ("weight_decay", "embedding_weight_decay", "muon_weight_decay"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"optim.{name}={getattr(self, name)} is invalid; it must be a finite number >= 0")
        for name in ("beta1", "beta2", "muon_momentum"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"optim.{name}={getattr(self, name)} is invalid; it must be in [0, 1)")
        if not 0 <= self.grad_clip < math.inf:  # NaN fails both comparisons
            raise ValueError(
                f"optim.grad_clip={self.grad_clip} is invalid; it must be a finite number >= 0 (0 disables)"
            )


def lr_at(step: int, progress: float, cfg: OptimConfig) -> float:
    """The lr of optimizer step `step` (0-based) at `progress` in [0, 1], the fraction of training done.

    Linear warmup over the first warmup_steps steps, then cosine from lr to min_lr over progress
    0..1, or wsd: lr until 1 - cooldown_frac, then down to min_lr at 1 (linearly, or as 1 - sqrt
    of the cooldown's own progress). Progress past 1 stays at min_lr.
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    p = min(max(progress, 0.0), 1.0)
    if cfg.schedule == "cosine":
        weight = 0.5 * (1.0 + math.cos(math.pi * p))
    else:
        t = max(0.0, p - (1.0 - cfg.cooldown_frac)) / cfg.cooldown_frac  # 0 until the cooldown, 1 at the end
        weight = 1.0 - (math.sqrt(t) if cfg.cooldown == "1-sqrt" else t)
    return cfg.min_lr + weight * (cfg.lr - cfg.min_lr)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Give every group the schedule's lr times its own lr_scale (1 where a group has none)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def param_groups(model: nn.Module, cfg: OptimConfig) -> dict[str, list[nn.Parameter]]:
    """Parameters by role: "hidden" (2-D matmul weights inside the blocks), "head" (an untied LM head),
    "embedding" (token/position tables, with a tied head), "gain" (norm gains and biases)."""
    embeddings = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    groups: dict[str, list[nn.Parameter]] = {"hidden": [], "head": [], "embedding": [], "gain": []}
    for name, p in model.named_parameters():  # a tied weight appears once, as the embedding
        if not p.requires_grad:
            continue
        if id(p) in embeddings:
            groups["embedding"].append(p)
        elif p.dim() < 2:
            groups["gain"].append(p)
        elif name.startswith("lm_head"):
            groups["head"].append(p)
        else:
            groups["hidden"].append(p)
    return groups


def build_optimizer(model: nn.Module, cfg: OptimConfig, device_type: str) -> torch.optim.Optimizer:
    """AdamW over every group (decay as configured per role), or Muon for "hidden" and AdamW for the rest."""
    groups = param_groups(model, cfg)
    decay = {"hidden": cfg.weight_decay, "head": cfg.weight_decay, "embedding": cfg.embedding_weight_decay}
    adam_roles = ["head", "embedding", "gain"] if cfg.optimizer == "muon" else ["hidden", "head", "embedding", "gain"]
    adam_groups = [
        {"params": groups[role], "weight_decay": decay.get(role, 0.0), "lr_scale": 1.0, "role": role}
        for role in adam_roles
        if groups[role]
    ]
    # The fused kernel is one launch per step on CUDA; on CPU the foreach path is the fast one.
    fused = device_type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
    adamw = torch.optim.AdamW(
        adam_groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused or None, foreach=None if fused else True
    )
    if cfg.optimizer == "adamw":
        return adamw
    muon_group = {"params": groups["hidden"], "lr_scale": cfg.muon_lr / cfg.lr, "role": "hidden"}
    sharded = any(isinstance(p, DTensor) for p in groups["hidden"])  # FSDP: torch's Muon takes no shards
    muon_class = torch.optim.Muon if device_type == "cuda" and not sharded else Float32Muon
    muon = muon_class([muon_group], lr=cfg.muon_lr, weight_decay=cfg.muon_weight_decay, momentum=cfg.muon_momentum)
    return CombinedOptimizer([muon, adamw])


def orthogonalize(g: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float) -> Tensor:
    """Newton-Schulz's quintic iteration towards the nearest semi-orthogonal matrix of each g (..., m, n),
    in g's dtype: X <- a X + (b A + c A^2) X with A = X X^T, from X = g / ||g||_F (spectral norm <= 1)."""
    a, b, c = coefficients
    tall = g.shape[-2] > g.shape[-1]
    x = g.mT if tall else g  # iterate on the wide side: A is the smaller square
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


class Float32Muon(torch.optim.Muon):
    """torch.optim.Muon's update (momentum, Nesterov, the "original" lr adjustment, decoupled weight
    decay) and state layout, with Newton-Schulz in float32: for CPUs, where bf16 may be emulated.
    Under FSDP each rank gathers a sharded matrix, orthogonalises it whole and keeps its own shard.
    """

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        assert closure is None, "Float32Muon takes no closure"
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p.grad))
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                coefficients, steps, eps = group["ns_coefficients"], group["ns_steps"], group["eps"]
                if isinstance(update, DTensor):  # an FSDP shard: orthogonalise the whole matrix, keep our shard
                    full = orthogonalize(update.full_tensor().float(), coefficients, steps, eps)
                    update = distribute_tensor(full, update.device_mesh, update.placements)
                else:
                    update = orthogonalize(update.float(), coefficients, steps, eps)
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update.to(p.dtype), alpha=-lr * math.sqrt(max(1.0, p.shape[0] / p.shape[1])))


class CombinedOptimizer(torch.optim.Optimizer):
    """Several optimizers over disjoint parameters, seen as one: param_groups is their union, and
    step / zero_grad / state_dict / load_state_dict act on each. The state dict has torch's flat
    layout (integer parameter ids numbered across the optimizers in order), so training/checkpoint.py
    saves and restores it like any other optimizer's.

    It subclasses torch.optim.Optimizer for isinstance checks only: its state lives in the parts.
    """

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers
        self.defaults: dict[str, Any] = {}
        self._optimizer_step_pre_hooks: dict = {}
        self._optimizer_step_post_hooks: dict = {}

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # the parts' own dicts: writing "lr" reaches them
        return [group for opt in self.optimizers for group in opt.param_groups]

    @property
    def state(self) -> dict:
        return {p: s for opt in self.optimizers for p, s in opt.state.items()}

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        assert closure is None, "CombinedOptimizer takes no closure"
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        state, groups, offset = {}, [], 0
        for opt in self.optimizers:
            sd = opt.state_dict()
            state |= {offset + index: s for index, s in sd["state"].items()}
            groups += [{**g, "params": [offset + i for i in g["params"]]} for g in sd["param_groups"]]
            offset += sum(len(g["params"]) for g in opt.param_groups)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = list(state_dict["param_groups"])
        if len(groups) != len(self.param_groups):
            raise ValueError(
                f"optimizer state has {len(groups)} parameter groups; this optimizer has {len(self.param_groups)}"
            )
        offset = 0
        for opt in self.optimizers:
            mine, groups = groups[: len(opt.param_groups)], groups[len(opt.param_groups) :]
            count = sum(len(g["params"]) for g in opt.param_groups)
            state = {int(i) - offset: s for i, s in state_dict["state"].items() if offset <= int(i) < offset + count}
            opt.load_state_dict(
                {"state": state, "param_groups": [{**g, "params": [i - offset for i in g["params"]]} for g in mine]}
            )
            offset += count

    def __repr__(self) -> str:
        return f"CombinedOptimizer({', '.join(type(opt).__name__ for opt in self.optimizers)})"
