"""Round 17's timing of Muon's Newton-Schulz batches: the default's block matrices orthogonalised by shape (round 16:
(512, 128) and (128, 512) in two batches) or by the shape they iterate in (a tall matrix as its transpose: one batch),
alternating in one process, on the optimizer alone and inside one compiled trainer's step (`Trainer.advance` in the
cooldown). Both compute the same update; only the number of batched matmuls differs.

    python docs/recipe/round17/ns_batches.py --rounds 12
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch

from bench.bench_train import load_config
from data.prepare import prepare
from training.optim import MuonAdamW, orthogonalize
from training.runtime import device_name, resolve_device
from training.trainer import Trainer


def by_shape(self: MuonAdamW, updates: list[torch.Tensor], group: dict) -> list[torch.Tensor]:
    """Round 16's batches: one per shape as stored (no FSDP shards here)."""
    ns = group["ns_coefficients"], group["ns_steps"], group["eps"]
    out: list[torch.Tensor | None] = [None] * len(updates)
    shapes: dict[tuple[int, ...], list[int]] = {}
    for i, update in enumerate(updates):
        shapes.setdefault(tuple(update.shape), []).append(i)
    for indices in shapes.values():
        batch = orthogonalize(torch.stack([updates[i] for i in indices]).to(self.ns_dtype), *ns)
        for i, x in zip(indices, batch.unbind(), strict=True):
            out[i] = x
    return out


def timed(fn, steps: int = 40) -> float:
    """Median milliseconds of `steps` calls of fn."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    cfg = load_config([])
    device = resolve_device(cfg.device)
    trainer = Trainer(cfg, prepare(cfg.data, progress=False), device)
    trainer.prepare()
    optimizer = trainer.optimizer
    hidden = next(group for group in optimizer.param_groups if group["role"] == "hidden")
    updates = [torch.randn_like(p) for p in hidden["params"]]
    ways = {"by shape": by_shape, "by iterated shape": MuonAdamW._orthogonalized}
    alone: dict[str, list[float]] = {name: [] for name in ways}
    step: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(args.rounds + 1):
        for name, way in ways.items():
            MuonAdamW._orthogonalized = way
            ns_ms = timed(lambda: optimizer._orthogonalized(updates, hidden), args.steps)
            step_ms = timed(lambda: trainer.advance(0.8), args.steps)
            if round_:  # the first round warms both up
                alone[name].append(ns_ms)
                step[name].append(step_ms)
    shapes = sorted({tuple(p.shape) for p in hidden["params"]})
    print(f"{device_name(device)}; torch {torch.__version__}; {len(updates)} matrices of shapes {shapes}")
    for label, times in (("Newton-Schulz alone", alone), ("training step", step)):
        for name, ms in times.items():
            print(f"{label}, {name}: {statistics.median(ms):.2f} ms (rounds: {' '.join(f'{m:.2f}' for m in ms)})")
        ratios = [new / old for new, old in zip(times["by iterated shape"], times["by shape"], strict=True)]
        print(
            f"{label}, by iterated shape / by shape: {statistics.median(ratios):.3f} "
            f"(rounds {min(ratios):.3f}-{max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
