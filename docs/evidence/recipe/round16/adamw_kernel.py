"""Round 16's timing of one AdamW update: round 15's MuonAdamW update (eight operations, one tensor at a time) against
torch's fused CPU kernel on a table of ROWS x 128; and torch.optim.AdamW's foreach path against its fused one over the
default model's parameters (`optimizer=adamw`). Medians of 36 updates (the optimizers: 10, in 8 alternating rounds).

    python docs/recipe/round16/adamw_kernel.py
"""

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch

from bench.bench_train import load_config
from model.gpt import GPT
from training.runtime import device_name

LR, BETA1, BETA2, DECAY, EPS = 3e-3, 0.9, 0.99, 0.01, 1e-8


def per_tensor(
    p: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int,
    lr: float = LR, beta1: float = BETA1, beta2: float = BETA2, decay: float = DECAY, eps: float = EPS,
) -> None:  # fmt: skip
    """Round 15's AdamW update of one tensor (MuonAdamW._adamw before round 16): eight operations over it."""
    p.mul_(1 - lr * decay)
    m.lerp_(grad, 1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (v.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
    p.addcdiv_(m, denom, value=-lr / (1 - beta1**step))


def fused(p: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, steps: list[torch.Tensor]) -> None:
    torch._foreach_add_(steps, 1)
    torch._fused_adamw_(
        [p], [grad], [m], [v], [], steps, lr=LR, beta1=BETA1, beta2=BETA2, weight_decay=DECAY, eps=EPS, amsgrad=False,
        maximize=False,
    )  # fmt: skip


def median_ms(update: Callable[[], None], calls: int = 36) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        update()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def one_table(rows: int) -> str:
    grad = torch.randn(rows, 128)
    ours = [torch.randn(rows, 128), torch.zeros(rows, 128), torch.zeros(rows, 128)]
    theirs, steps, count = [t.clone() for t in ours], [torch.tensor(0.0)], iter(range(1, 10_000))
    for _ in range(3):
        per_tensor(*ours[:1], grad, *ours[1:], next(count))
        fused(*theirs[:1], grad, *theirs[1:], steps)
    difference = (ours[0] - theirs[0]).abs().max().item()
    slow = median_ms(lambda: per_tensor(*ours[:1], grad, *ours[1:], next(count)))
    fast = median_ms(lambda: fused(*theirs[:1], grad, *theirs[1:], steps))
    return f"{rows} x 128: per-tensor {slow:.2f} ms, fused {fast:.2f} ms (after 3 steps: {difference:.0e} apart)"


def whole_model() -> str:
    config = dataclasses.replace(load_config([]).model, vocab_size=4096)
    params = list(GPT(config).parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    paths = {name: torch.optim.AdamW(params, lr=LR, **{name: True}) for name in ("foreach", "fused")}
    ms: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(8):  # alternating, so a drifting host falls on both
        for name, optimizer in paths.items():
            ms[name].append(median_ms(optimizer.step, 10))
    medians = ", ".join(f"{name} {statistics.median(values):.2f} ms" for name, values in ms.items())
    return f"torch.optim.AdamW over the default's {sum(p.numel() for p in params):,} parameters: {medians}"


if __name__ == "__main__":
    print(f"{device_name(torch.device('cpu'))}; torch {torch.__version__}")
    print(one_table(8192))
    print(one_table(32768))
    print(whole_model())
