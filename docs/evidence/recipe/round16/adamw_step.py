"""Round 16's timing of the fused AdamW update: one trainer of the default (compiled, as `python train.py` runs), its
steps (`Trainer.advance` in the cooldown: forward, backward, clipping, the optimizer, the weight average) timed in
alternating rounds with MuonAdamW's AdamW groups updated by round 15's per-tensor loop or by torch's fused kernel
(training/optim.py). Both update the same weights by the same formula; only the kernels differ.

    python docs/recipe/round16/adamw_step.py --rounds 10 [overrides]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from adamw_kernel import per_tensor  # this folder's: the script's own directory leads sys.path

from bench.bench_train import load_config
from data.prepare import prepare
from training.optim import MuonAdamW
from training.runtime import device_name, resolve_device
from training.trainer import Trainer


@torch.no_grad()
def per_tensor_adamw(self: MuonAdamW, params: list[torch.Tensor], group: dict) -> None:
    """Round 15's AdamW update of a group: adamw_kernel.per_tensor over each parameter, one at a time."""
    (beta1, beta2), lr = group["betas"], group["lr"]
    for p in params:
        state = self.state[p]
        if not state:
            state |= {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
        state["step"] += 1
        m, v = state["exp_avg"], state["exp_avg_sq"]
        per_tensor(p, p.grad, m, v, int(state["step"].item()), lr, beta1, beta2, group["weight_decay"], group["eps"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = load_config(args.overrides)
    device = resolve_device(cfg.device)
    trainer = Trainer(cfg, prepare(cfg.data, progress=False), device)
    trainer.prepare()
    ways = {"per-tensor": per_tensor_adamw, "fused": MuonAdamW._adamw}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(args.rounds + 1):
        for name, update in ways.items():
            MuonAdamW._adamw = update
            steps = []
            for _ in range(args.steps):
                start = time.perf_counter()
                trainer.advance(0.8)
                steps.append(time.perf_counter() - start)
            if round_:  # the first round warms both up
                times[name].append(1000 * statistics.median(steps))
    ratios = [f / p for f, p in zip(times["fused"], times["per-tensor"], strict=True)]
    print(f"{device_name(device)}; torch {torch.__version__}; overrides {' '.join(args.overrides) or '(none)'}")
    for name, ms in times.items():
        print(f"{name}: {statistics.median(ms):.1f} ms/step (rounds: {' '.join(f'{m:.1f}' for m in ms)})")
    print(f"fused / per-tensor: {statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
