"""Where one training step's time goes: `Trainer.advance`, the step `python train.py` runs (forward,
backward, clipping, the optimizer, the weight average), compiled where the config compiles it, under
torch.profiler, its ops by self time. A compiled step lists inductor's fused kernels; `compile=false` lists
the eager ops they came from.

    python bench/profile_step.py                      # the default model and data
    python bench/profile_step.py --steps 20 -- model.n_layer=6

It prints the machine, the median step time, the share of the step spent in matrix products (what a
faster kernel elsewhere cannot buy back) and the ops that take the most. Profiling adds overhead of its
own: read the shares, and time a step with bench/bench_train.py.
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import training.threads  # noqa: F401  # isort: skip  (before torch: OpenMP reads its wait policy once)
import torch
from torch._inductor import config as inductor_config
from torch.profiler import ProfilerActivity, profile

from bench.bench_train import load_config
from cli.schema_help import OneLineParser, at_least
from data.prepare import prepare
from studies.fairness import measure_seconds_per_step
from training.runtime import device_name, resolve_device
from training.trainer import Trainer

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
PROGRESS = 1.0  # the run's end, where the weight average folds in every step (as measure_seconds_per_step times it)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=at_least(1), default=10, help="profiled steps (after the timed ones)")
    parser.add_argument("--warmup", type=at_least(1), default=10, help="untimed steps first")
    parser.add_argument("--rows", type=at_least(1), default=20, help="ops shown")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, after --")
    return parser


def advance(trainer: Trainer, steps: int) -> None:
    for _ in range(steps):
        trainer.advance(PROGRESS)


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    try:
        cfg = load_config(args.overrides)
    except ValueError as e:
        parser.error(str(e))
    device = resolve_device(cfg.device)
    trainer = Trainer(cfg, prepare(cfg.data), device)
    inductor_config.cpp.enable_kernel_profile = True  # each generated CPU kernel a row, not one for the whole graph
    trainer.prepare()  # compiles, where the config does, as train.py's step is
    advance(trainer, args.warmup)
    median_ms = 1000 * measure_seconds_per_step(trainer, max(args.steps, 10))  # the iso-time calibration's timer
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        advance(trainer, args.steps)
        if cuda:
            torch.cuda.synchronize(device)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    ops = sorted(prof.key_averages(), key=lambda op: getattr(op, key), reverse=True)
    total = sum(getattr(op, key) for op in ops)  # microseconds over the profiled steps
    matmul = sum(getattr(op, key) for op in ops if op.key in MATMULS)

    print(
        f"attnlab profile_step: {time.strftime('%Y-%m-%d %H:%M')}, {device_name(device)}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}; overrides {' '.join(args.overrides) or 'none'}"
    )
    print(
        f"{cfg.batch_size} x {cfg.model.train_length} tokens a step; median step {median_ms:.1f} ms "
        f"(unprofiled), {'compiled' if trainer.compiled else 'eager'}; matrix products {100 * matmul / total:.0f}% "
        "of the profiled op time"
    )
    print(f"\n{'op':<52} {'ms/step':>8} {'share':>6} {'calls/step':>10}")
    for op in ops[: args.rows]:
        per_step = getattr(op, key) / args.steps / 1000
        print(f"{op.key[:52]:<52} {per_step:8.2f} {100 * getattr(op, key) / total:5.1f}% {op.count / args.steps:10.0f}")


if __name__ == "__main__":
    main()
