"""Round 13's micro-benchmark: GELU's tanh approximation compiled in its tanh form (PyTorch's op) and as
model/block.py's gelu_tanh compiles it (x sigmoid(2u), the same function: 1 + tanh(u) = 2 sigmoid(2u)), and ReLU^2,
forward and backward on the default's MLP activations (1,536 tokens x 512, bf16).
Run from the repository root: python docs/recipe/round13/act_micro.py"""

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

# the forms the project ships, not copies: compiled, gelu_tanh is the sigmoid form
from model.block import gelu_tanh as gelu_sigmoid
from model.block import relu2

ROUNDS, CALLS = 30, 10


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def main() -> None:
    torch.manual_seed(0)
    wide = torch.randn(100_000, dtype=torch.float32) * 4
    compiled = {"gelu_tanh": torch.compile(gelu_tanh), "gelu_sigmoid": torch.compile(gelu_sigmoid)}
    compiled["relu2"] = torch.compile(relu2)
    gap = (compiled["gelu_tanh"](wide) - compiled["gelu_sigmoid"](wide)).abs().max().item()
    print(f"max |tanh form - sigmoid form| in fp32, both compiled: {gap:.2e}")
    x0 = torch.randn(1536, 512).to(torch.bfloat16)
    grad = torch.randn(1536, 512).to(torch.bfloat16)
    for fn in compiled.values():  # compile and warm up
        for _ in range(5):
            fn(x0.clone().requires_grad_()).backward(grad)
    times = {name: [] for name in compiled}
    for _ in range(ROUNDS):  # the three in turns, so a drifting host falls on each alike
        for name, fn in compiled.items():
            x = x0.clone().requires_grad_()
            start = time.perf_counter()
            for _ in range(CALLS):
                fn(x).backward(grad)
            times[name].append((time.perf_counter() - start) / CALLS * 1000)
    for name, ms in times.items():
        print(f"{name}: {statistics.median(ms):.3f} ms forward + backward (median of {ROUNDS} rounds)")


if __name__ == "__main__":
    main()
