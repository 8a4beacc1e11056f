"""Round 17's in-trainer timing of a cross-entropy with a hand-written backward (softmax minus the one-hot target, in
one pass) against F.cross_entropy's (whose compiled backward sums the one-hot gradient over all 4,096 ids of every
row): two compiled trainers of the default, one with the hand-written loss, alternating rounds of 10 steps.

    python docs/recipe/round17/manual_ce_step.py --rounds 8
"""

import argparse
import statistics
import sys
import types
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from ns_batches import timed  # this folder's: the script's own directory leads sys.path

from bench.bench_train import load_config
from data.prepare import prepare
from training.runtime import device_name, resolve_device
from training.trainer import Trainer


class CrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over targets != -1, with the gradient written out: (softmax - one-hot) / count."""

    @staticmethod
    def forward(ctx, logits, targets):
        flat, keep = logits.float(), targets != -1
        safe = torch.where(keep, targets, 0)
        lse = torch.logsumexp(flat, -1)
        count = keep.sum().clamp(min=1)
        ctx.save_for_backward(logits, lse, safe, keep, count)
        return ((lse - flat.gather(1, safe[:, None]).squeeze(1)) * keep).sum() / count

    @staticmethod
    def backward(ctx, grad):
        logits, lse, safe, keep, count = ctx.saved_tensors
        probs = torch.exp(logits.float() - lse[:, None])
        target = torch.arange(logits.shape[1])[None, :] == safe[:, None]
        return ((probs - target.float()) * (grad / count * keep)[:, None]).to(logits.dtype), None


def hand_written_loss(self, logits, targets):
    return CrossEntropy.apply(logits.flatten(0, 1), targets.flatten())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    cfg = load_config([])
    device = resolve_device(cfg.device)
    data = prepare(cfg.data, progress=False)
    trainers = {"F.cross_entropy": Trainer(cfg, data, device), "hand-written": Trainer(cfg, data, device)}
    trainers["hand-written"].model.loss = types.MethodType(hand_written_loss, trainers["hand-written"].model)
    for trainer in trainers.values():
        trainer.prepare()
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for round_ in range(args.rounds + 1):
        for name, trainer in trainers.items():
            ms = timed(partial(trainer.advance, 0.8), 10)
            if round_:  # the first round warms both up
                times[name].append(ms)
    ratios = [b / a for a, b in zip(*times.values(), strict=True)]
    print(f"{device_name(device)}; torch {torch.__version__}")
    for name, ms in times.items():
        print(f"{name}: {statistics.median(ms):.1f} ms/step (rounds: {' '.join(f'{m:.1f}' for m in ms)})")
    spread = f"rounds {min(ratios):.3f}-{max(ratios):.3f}"
    print(f"hand-written / F.cross_entropy: {statistics.median(ratios):.3f} ({spread})")


if __name__ == "__main__":
    main()
