"""Round 13's micro-benchmark: GELU's tanh approximation compiled in its tanh form and in its sigmoid form
(the same function: 1 + tanh(u) = 2 sigmoid(2u)), and ReLU^2, forward and backward on the default's MLP
activations (1,536 tokens x 512, bf16). Run from the repository root: python docs/recipe/round13/act_micro.py"""

import statistics
import time

import torch
import torch.nn.functional as F

SCALE = 0.7978845608028654  # sqrt(2 / pi)
ROUNDS, CALLS = 30, 10


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def gelu_sigmoid(x):
    return x * torch.sigmoid(2 * SCALE * (x + 0.044715 * x * x * x))


def relu2(x):
    return F.relu(x).square()


def main() -> None:
    torch.manual_seed(0)
    wide = torch.randn(100_000, dtype=torch.float32) * 4
    print(f"max |tanh form - sigmoid form| in fp32: {(gelu_tanh(wide) - gelu_sigmoid(wide)).abs().max().item():.2e}")
    x0 = torch.randn(1536, 512).to(torch.bfloat16)
    grad = torch.randn(1536, 512).to(torch.bfloat16)
    compiled = {f.__name__: torch.compile(f) for f in (gelu_tanh, gelu_sigmoid, relu2)}
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
