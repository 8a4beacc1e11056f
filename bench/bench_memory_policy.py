"""The training step with and without keeping freed memory (training.runtime.keep_freed_memory), side by side.

    python bench/bench_memory_policy.py                     # the default model and data, 5 rounds
    python bench/bench_memory_policy.py --rounds 3 -- model.n_layer=6

glibc's policy is process-wide and cannot be undone, so each measurement is a fresh child process: the
two policies alternate, round after round, and the table gives the median over rounds of each process's
median step time, with its page faults a step. A child builds a Trainer from the config train.py would compose,
on the CPU, and steps it eager: it never calls Trainer.prepare, so compile: true does not compile. For glibc's own
policy it replaces keep_freed_memory with a no-op first. Run it on a quiet machine.
"""

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import training.threads  # noqa: F401  # isort: skip  (before torch: OpenMP reads its wait policy once)
import torch

from bench.bench_train import in_fresh_process, load_config
from cli.schema_help import OneLineParser, at_least
from data.prepare import prepare
from studies.fairness import measure_seconds_per_step
from training import trainer
from training.runtime import device_name

POLICIES = ("glibc's own", "keep freed memory")


def measure(job: dict) -> dict:
    """One process: the policy, warm-up steps, then the median step (fairness.measure_seconds_per_step, the
    timer bench_quality and the iso_time calibration use) and the page faults a step while it ran."""
    if not job["keep"]:
        trainer.keep_freed_memory = lambda: False  # glibc's own policy: mmap a large block, unmap it on free
    cfg = load_config(["out_dir=unused"] + job["overrides"])
    run = trainer.Trainer(cfg, prepare(cfg.data, progress=False), torch.device("cpu"))
    for _ in range(job["warmup"]):
        run.step(cfg.optim.lr)
    faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    seconds = measure_seconds_per_step(run, job["steps"])  # its own warm-up step, then `steps` timed ones
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before
    return {"ms": seconds * 1e3, "faults_per_step": faults / (job["steps"] + 1)}


def main() -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=at_least(1), default=5, help="processes per policy, alternating")
    parser.add_argument("--steps", type=at_least(1), default=30, help="timed steps per process (median)")
    parser.add_argument("--warmup", type=at_least(0), default=5, help="untimed steps first")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, after --")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(json.loads(args.worker))))
        return
    try:
        load_config(args.overrides)
    except ValueError as e:
        parser.error(str(e))
    cpu = device_name(torch.device("cpu"))
    print(f"attnlab bench_memory_policy: {time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}, {cpu}")
    print(f"overrides: {' '.join(args.overrides) or '(the default)'}; {args.rounds} rounds x {args.steps} steps")
    results: dict[str, list[dict]] = {policy: [] for policy in POLICIES}
    for _ in range(args.rounds):
        for policy in POLICIES:
            job = {"keep": policy != POLICIES[0], "steps": args.steps, "warmup": args.warmup}
            results[policy].append(in_fresh_process(__file__, "--worker", job | {"overrides": args.overrides}))
    print(f"{'policy':<20}{'ms/step (median)':>18}{'per round':>32}{'page faults/step':>18}")
    medians = {}
    for policy, rows in results.items():
        medians[policy] = statistics.median(r["ms"] for r in rows)
        rounds = " ".join(f"{r['ms']:.0f}" for r in rows)
        faults = statistics.median(r["faults_per_step"] for r in rows)
        print(f"{policy:<20}{medians[policy]:>18.1f}{rounds:>32}{faults:>18,.0f}")
    print(f"step time, kept over glibc's own: {medians[POLICIES[1]] / medians[POLICIES[0]]:.2f}x")


if __name__ == "__main__":
    main()
