"""Optimizers, their parameter groups by role, gradient clipping, and the learning-rate schedules as a
pure function of (step, progress).

`optim.optimizer=muon` trains the nn.Linear weights inside the blocks with Muon (Jordan et al. 2024:
momentum, then a few Newton-Schulz iterations towards the nearest orthogonal matrix) and everything
else (embeddings, LM head, gains, biases, bare parameters) with AdamW, as one torch optimizer, `MuonAdamW`. Each group
carries `lr_scale`, its peak lr over `optim.lr`, so one schedule moves every group by the same factor.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.optim.adamw import adamw

from model.bigram import BigramEmbedding
from training.runtime import cpu_supports_bf16

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "wsd")
COOLDOWNS = ("linear", "1-sqrt")
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's quintic, steepest at zero
MAX_LR = 1000.0  # every peak lr: see OptimConfig.validate
GROUP_LRS = ("embedding_lr", "head_lr", "bigram_lr")  # a group's own peak lr, or null for optim.lr


@dataclass
class OptimConfig:
    optimizer: str = "adamw"  # "adamw" (every parameter) or "muon" (block matrices; AdamW for the rest)
    lr: float = 1e-3  # AdamW's peak lr
    min_lr: float = 1e-4  # where the decay ends, at progress 1 (Muon's group ends at min_lr * lr_scale)
    warmup_steps: int = 50  # linear warmup from lr / warmup_steps, in optimizer steps
    schedule: str = "cosine"  # "cosine" (to min_lr at progress 1) or "wsd" (warmup, stable, decay)
    cooldown_frac: float = 0.2  # wsd: the last fraction of progress spent decaying to min_lr
    cooldown: str = "linear"  # wsd's decay shape: "linear" or "1-sqrt" (Hagele et al. 2024)
    weight_decay: float = 0.1  # matmul weights (and an untied LM head)
    embedding_weight_decay: float = 0.0  # token/position tables (and a tied head); gains, biases never
    beta1: float = 0.9
    beta2: float = 0.99
    muon_lr: float = 0.02  # Muon's peak lr for the block matrices
    # Peak lrs of the token/position tables and of the LM head (a tied head's, its tables' too); null: optim.lr.
    # nanochat sets them apart (its embeddings learn ~50x faster than its head): one row of the table moves only
    # when its token occurs.
    embedding_lr: float | None = None
    head_lr: float | None = None
    # Peak lr of a hashed bigram table (model.bigram_embeds); null: optim.lr. Not the token table's: a row of pairs
    # occurs far more rarely than a token, and at the token table's 0.3 it memorised (docs/evidence/recipe/round15.md).
    bigram_lr: float | None = None
    muon_momentum: float = 0.95
    muon_weight_decay: float = 0.0  # decoupled, times Muon's lr
    grad_clip: float = 1.0  # max global grad norm; 0 disables
    # Weight averaging (training/average.py): from this fraction of training on, the run evaluates, saves
    # and samples an exponential moving average of its weights, of time constant average_window of the
    # run (0.08 of 2,500 steps: decay 0.995 a step); null: off.
    average_from: float | None = None
    average_window: float = 0.08

    def validate(self) -> None:
        choices = {"optimizer": OPTIMIZERS, "schedule": SCHEDULES, "cooldown": COOLDOWNS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"optim.{name}={getattr(self, name)!r} is unknown; choose one of: {', '.join(allowed)}"
                )
        # Adam and Muon move each weight by about lr a step, so an lr above 1 only diverges, and 1e300 overflowed
        # the update's float32 scalars: a crash after the run's first records. MAX_LR is generous and stays far
        # below that overflow, also after Adam's bias correction (lr / (1 - beta1) < 1e19 for any float beta1 < 1).
        for name in ("lr", "muon_lr", *GROUP_LRS):
            if getattr(self, name) is None and name in GROUP_LRS:
                continue  # null: optim.lr
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"optim.{name}={getattr(self, name)} is invalid; it must be a finite number > 0")
            if getattr(self, name) > MAX_LR:
                raise ValueError(
                    f"optim.{name}={getattr(self, name)} is invalid; it must be a finite number > 0 and <= {MAX_LR:g} "
                    "(a step moves each weight by about lr: far smaller values already diverge)"
                )
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
        if self.average_from is not None and not 0 <= self.average_from < 1:
            raise ValueError(f"optim.average_from={self.average_from} is invalid; it must be in [0, 1) or null (off)")
        if not 0 < self.average_window < math.inf:
            raise ValueError(f"optim.average_window={self.average_window} is invalid; it must be a finite number > 0")
        if not 0 <= self.grad_clip < math.inf:  # NaN fails both comparisons
            raise ValueError(
                f"optim.grad_clip={self.grad_clip} is invalid; it must be a finite number >= 0 (0 disables)"
            )


def lr_at(step: int, progress: float, cfg: OptimConfig) -> float:
    """The lr of optimizer step `step` (0-based) at `progress` in [0, 1], the fraction of training done:
    linear warmup over warmup_steps, then cosine to min_lr over progress 0..1, or wsd (flat until
    1 - cooldown_frac, then down to min_lr, linearly or as 1 - sqrt of the cooldown's progress)."""
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
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def clip_grad_norm_(params: list[nn.Parameter], max_norm: float) -> Tensor:
    """Global L2 norm of the gradients (on the device, no sync); clips them to `max_norm` when > 0."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def param_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Parameters by role: "hidden" (the nn.Linear weights inside the blocks), "head" (an untied LM head),
    "embedding" (token/position tables, with a tied head), "gain" (norm gains, biases and every bare parameter: a
    sink, a scalar, a variant's own mixing matrix), "bigram" (a hashed bigram table: an embedding at its own lr).
    Muon takes the "hidden" role: it orthogonalises a layer's update and decays it, which a matrix that starts as the
    identity (or a mix of heads) should not get unasked, so a bare 2-D parameter is AdamW's without decay."""
    embeddings = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    bigrams = {id(p) for m in model.modules() if isinstance(m, BigramEmbedding) for p in m.parameters()}
    linears = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    groups: dict[str, list[nn.Parameter]] = {"hidden": [], "head": [], "embedding": [], "gain": [], "bigram": []}
    for name, p in model.named_parameters():  # a tied weight appears once, as the embedding
        if not p.requires_grad:
            continue
        if id(p) in bigrams:
            groups["bigram"].append(p)
        elif id(p) in embeddings:
            groups["embedding"].append(p)
        elif id(p) in linears:
            groups["head" if name.startswith("lm_head") else "hidden"].append(p)
        else:
            groups["gain"].append(p)
    return groups


def tied_head(model: nn.Module) -> bool:
    """Whether the LM head shares its weight with a token table (model.tie_embeddings)."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return any(id(m.weight) in tables for m in model.modules() if isinstance(m, nn.Linear))


def fusable(params: list[Tensor]) -> bool:
    """Whether torch's fused AdamW kernel takes these: plain tensors on a CPU or a GPU, not FSDP's sharded DTensors.
    On a CPU it makes one pass over each tensor: on the AMX Xeon, 1.7 ms for a 32,768 x 128 table where a hand-written
    eight operations per tensor took 6.8-20, and 1.5 ms over the default's parameters where torch's foreach path took
    5.3 (docs/evidence/recipe/round16.md)."""
    return all(p.device.type in ("cpu", "cuda") and not hasattr(p, "full_tensor") for p in params)


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, device_type: str, precision: str = "fp32"
) -> torch.optim.Optimizer:
    """AdamW over every group (decay as configured per role), or Muon for "hidden" and AdamW for the rest."""
    tables = cfg.embedding_weight_decay
    decay = {"hidden": cfg.weight_decay, "head": cfg.weight_decay, "embedding": tables, "bigram": tables}
    peak = {"embedding": cfg.embedding_lr, "head": cfg.head_lr, "bigram": cfg.bigram_lr}  # gains: optim.lr
    if tied_head(model):  # the table is the output layer too: at the embeddings' 0.3 a tied GPT-2 rose above uniform
        peak["embedding"] = cfg.head_lr
    adam = {"betas": (cfg.beta1, cfg.beta2), "eps": 1e-8}
    groups = [
        {"params": params, "role": role, "weight_decay": decay.get(role, 0.0), **adam}
        | {"lr_scale": (peak.get(role) or cfg.lr) / cfg.lr}
        for role, params in param_groups(model).items()
        if params
    ]
    if cfg.optimizer == "adamw":  # fused: one kernel, one pass over each tensor (FSDP's shards: foreach)
        fused = fusable(list(model.parameters()))
        return torch.optim.AdamW(groups, lr=cfg.lr, fused=fused or None, foreach=None if fused else True)
    for group in groups:
        if group["role"] == "hidden":
            group |= {"lr_scale": cfg.muon_lr / cfg.lr, "weight_decay": cfg.muon_weight_decay, "eps": 1e-7}
            group |= {"momentum": cfg.muon_momentum, "nesterov": True, "ns_coefficients": NS_COEFFICIENTS}
            group |= {"ns_steps": 5}
    # Newton-Schulz in bf16 (torch.optim.Muon's choice) on GPUs, and on a CPU whose run is in bf16 (`precision`,
    # resolved) and has it natively: on a Zen 4 the default's optimizer step takes 15 ms instead of 22
    # (docs/evidence/recipe/round4.md). A CPU run in fp32 iterates in fp32, so it stays exact (DDP = one process); so do
    # CPUs that emulate bf16 (AVX2 only), where a 768x512x512 bf16 matmul took 760 ms against fp32's 13.
    cpu_bf16 = device_type == "cpu" and precision == "bf16" and cpu_supports_bf16()
    ns_dtype = torch.bfloat16 if device_type == "cuda" or cpu_bf16 else torch.float32
    return MuonAdamW(groups, lr=cfg.lr, ns_dtype=ns_dtype)


def orthogonalize(g: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float) -> Tensor:
    """Newton-Schulz's quintic iteration towards the nearest semi-orthogonal matrix of g (m, n) or of
    each of a batch (k, m, n), in g's dtype: X <- a X + (b A + c A^2) X with A = X X^T, from
    X = g / ||g||_F (spectral norm <= 1). Each polynomial is one fused multiply-add (baddbmm)."""
    a, b, c = coefficients
    tall = g.shape[-2] > g.shape[-1]
    wide = g.mT if tall else g  # iterate on the wide side: A is the smaller square
    x = wide.reshape(-1, *wide.shape[-2:])  # a batch of one for a single matrix
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    x = x.reshape(wide.shape)
    return x.mT if tall else x


class MuonAdamW(torch.optim.Optimizer):
    """Muon for the groups whose role is "hidden", AdamW for the others: one optimizer, so the trainer,
    the GradScaler and checkpoints see torch's usual groups and state dict. The updates are
    torch.optim.Muon's (Nesterov momentum, "original" lr adjustment, decoupled decay; Newton-Schulz in
    `ns_dtype`) and torch.optim.AdamW's. Under FSDP, a sharded matrix is gathered to orthogonalise it whole."""

    def __init__(self, groups: list[dict], lr: float, ns_dtype: torch.dtype) -> None:
        super().__init__(groups, {"lr": lr})
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        assert closure is None, "MuonAdamW takes no closure"
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if group["role"] == "hidden":
                self._muon(params, group)
            else:
                self._adamw(params, group)

    def _muon(self, params: list[Tensor], group: dict) -> None:
        lr, momentum = group["lr"], group["momentum"]
        updates = []
        for p in params:
            buf = self._zeros_once(p, "momentum_buffer", p.grad)
            buf.lerp_(p.grad, 1 - momentum)
            updates.append(p.grad.lerp(buf, momentum) if group["nesterov"] else buf)
        for p, update in zip(params, self._orthogonalized(updates, group), strict=True):
            p.mul_(1 - lr * group["weight_decay"])
            p.add_(update.to(p.dtype), alpha=-lr * math.sqrt(max(1.0, p.shape[0] / p.shape[1])))

    def _orthogonalized(self, updates: list[Tensor], group: dict) -> list[Tensor]:
        """Newton-Schulz of each update. Matrices of one shape iterate as one batch, every layer's in one
        bmm per product: small matrices are overhead-bound (with the fused baddbmm, the default model's
        optimizer step took 30 ms instead of 47 on a 2-core EPYC, and its training step 144 instead of 158).
        A tall matrix iterates as its transpose anyway, so it joins the wide ones of that shape: an MLP's
        (512, 128) and (128, 512) make one batch."""
        ns = group["ns_coefficients"], group["ns_steps"], group["eps"]
        out: list[Tensor | None] = [None] * len(updates)
        tall = [update.shape[-2] > update.shape[-1] for update in updates]
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, update in enumerate(updates):
            if hasattr(update, "full_tensor"):  # an FSDP shard (a DTensor; its module costs 1.3 s to import)
                from torch.distributed.tensor import distribute_tensor

                full = orthogonalize(update.full_tensor().to(self.ns_dtype), *ns)
                out[i] = distribute_tensor(full, update.device_mesh, update.placements)
            else:
                by_shape.setdefault(tuple(update.mT.shape if tall[i] else update.shape), []).append(i)
        for indices in by_shape.values():
            batch = torch.stack([updates[i].mT if tall[i] else updates[i] for i in indices])
            for i, x in zip(indices, orthogonalize(batch.to(self.ns_dtype), *ns).unbind(), strict=True):
                out[i] = x.mT if tall[i] else x
        return out

    def _zeros_once(self, p: Tensor, name: str, like: Tensor) -> Tensor:
        """p's state buffer `name`, made as zeros on the first step (setdefault made a new one every step)."""
        state = self.state[p]
        if name not in state:
            state[name] = torch.zeros_like(like)
        return state[name]

    def _adamw(self, params: list[Tensor], group: dict) -> None:
        """torch.optim.AdamW's update of a group's tensors, as one call of torch's own: its fused kernel on a CPU
        (`fusable`), its foreach path on a GPU or for FSDP's shards. The step counts stay on the CPU, as torch keeps
        them for a GPU's foreach path, so a checkpoint reads the same on either."""
        if not params:
            return
        states = []
        for p in params:
            state = self.state[p]
            if not state:
                state |= {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
            states.append(state)
        fused = params[0].device.type == "cpu" and fusable(params)
        beta1, beta2 = group["betas"]
        adamw(
            params,
            [p.grad for p in params],
            [state["exp_avg"] for state in states],
            [state["exp_avg_sq"] for state in states],
            [],
            [state["step"] for state in states],
            foreach=None if fused else True,
            fused=fused or None,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )
