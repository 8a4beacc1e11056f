"""The step time of a change against the run without it, both in one process, stepped in alternating rounds.

    python bench/bench_step_pair.py --change model.x0_mix=true       # the default, and the default with it
    python bench/bench_step_pair.py --change model.n_head=8 --rounds 12 --steps 10
    python bench/bench_step_pair.py --change model.activation=relu2 -- model.n_layer=6   # overrides for both

On a drifting host the same step timed in two processes differed by 10-15% (docs/evidence/recipe/round10.md), more
than most changes it is asked to measure. Here both trainers are built (and compiled, as configured) first, then
each takes `--steps` steps in turn, `--rounds` times; each round gives one ratio (with the change / without, of
the two rounds' median step times), so a drift between rounds falls on both. It prints the machine, each median
step time, the median ratio and the range of the rounds' ratios. A step is `Trainer.advance` inside the cooldown
(the schedule's lr, the optimizer step and the weight average): what the loop runs. (bench_train.py interleaves
eager rows the same way, but gives each compiled row a process of its own, for its memory high-water mark.)
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import training.threads  # noqa: F401  # isort: skip  (before torch: OpenMP reads its wait policy once)
import torch

from bench.bench_train import load_config
from cli.schema_help import OneLineParser, at_least
from data.prepare import prepare
from training.config import TrainConfig
from training.runtime import device_name, resolve_device
from training.trainer import Trainer

PROGRESS = 0.8  # inside the default's cooldown, where the weight average runs too


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--change", nargs="+", required=True, help="the overrides the second trainer adds")
    parser.add_argument("--rounds", type=at_least(1), default=12, help="alternations of the two")
    parser.add_argument("--steps", type=at_least(1), default=10, help="steps of each trainer a round")
    parser.add_argument("--warmup", type=at_least(1), default=10, help="untimed steps of each after compiling")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for both, after --")
    return parser


def ready_trainer(cfg: TrainConfig, warmup: int) -> Trainer:
    trainer = Trainer(cfg, prepare(cfg.data, progress=False), resolve_device(cfg.device))
    trainer.prepare()  # compiles, where the config does
    round_ms(trainer, warmup)
    return trainer


def round_ms(trainer: Trainer, steps: int) -> float:
    """The median wall-clock of `steps` steps, in ms."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        trainer.advance(PROGRESS)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    try:  # both composed first: a refusal in one line, before anything is built
        configs = [load_config(args.overrides), load_config([*args.overrides, *args.change])]
    except ValueError as e:
        parser.error(str(e))
    without, with_change = (ready_trainer(cfg, args.warmup) for cfg in configs)
    rounds = [(round_ms(without, args.steps), round_ms(with_change, args.steps)) for _ in range(args.rounds)]
    ratios = sorted(changed / plain for plain, changed in rounds)
    print(f"cpu: {device_name(torch.device('cpu'))}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    shared, change = " ".join(args.overrides) or "the default", " ".join(args.change)
    print(f"both: {shared}")
    for name, trainer, ms in (
        ("without", without, [p for p, _ in rounds]),
        (f"with {change}", with_change, [c for _, c in rounds]),
    ):
        print(f"{name}: {statistics.median(ms):.1f} ms/step, compiled: {trainer.compiled}")
    print(
        f"with / without: {statistics.median(ratios):.3f} (median of {args.rounds} rounds of {args.steps} steps each; "
        f"rounds {ratios[0]:.3f}-{ratios[-1]:.3f})"
    )


if __name__ == "__main__":
    main()
