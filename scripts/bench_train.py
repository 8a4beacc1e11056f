"""Training throughput, MFU and memory, measured side by side in one run.

    python scripts/bench_train.py                       # the default model and data
    python scripts/bench_train.py --no-compile --steps 5
    python scripts/bench_train.py -- model.n_head=8     # Hydra overrides after `--`

Table 1: tokens/s, MFU (against this machine's measured matmul peak for the row's dtype) and
peak memory for explicit vs sdpa attention x fp32 vs bf16 x eager vs torch.compile, plus
HF transformers' GPT2LMHeadModel of the same shape when transformers is installed.
Table 2: memory of one forward+backward vs block_size for explicit vs sdpa attention.
Each measurement runs in a fresh subprocess, so compile caches and memory high-water marks do
not leak between rows. Speeds are medians over the timed steps; ratios are against the
fp32 / explicit / eager row of the same run.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from data.batches import sample_batch
from data.prepare import prepare
from model import GPT
from model.hf_interop import to_hf_config
from training.config import TrainConfig, register_configs
from training.device import autocast, resolve_device
from training.mfu import mfu, peak_flops
from training.optim import build_optimizer


def load_config(overrides: list[str]) -> TrainConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose(config_name="config", overrides=["out_dir=unused", "logger=none", *overrides])
    return OmegaConf.to_object(cfg)


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class MemoryMeter:
    """Peak memory of the measured region: CUDA allocator stats, or the CPU RSS high-water mark."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.base = current_rss_bytes()

    def peak_above_base(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated() - self.base
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base


def build_hf_gpt2(cfg: TrainConfig) -> torch.nn.Module:
    """transformers' GPT2LMHeadModel of our model's shape (it adds biases), no dropout, the SDPA kernel."""
    from transformers import GPT2LMHeadModel

    hf_cfg = to_hf_config(cfg.model)  # refuses shapes GPT-2 cannot express (d_k != d_model / n_head, GQA, ...)
    hf_cfg.resid_pdrop = hf_cfg.embd_pdrop = hf_cfg.attn_pdrop = 0.0
    hf_cfg._attn_implementation = "sdpa"
    return GPT2LMHeadModel(hf_cfg)


def measure(job: dict) -> dict:
    """One row: warm up, then time `steps` optimizer steps of the configured model."""
    cfg = load_config(job["overrides"])
    device = resolve_device(cfg.device)
    data = prepare(cfg.data, progress=False)
    cfg.model.vocab_size = data.meta["vocab_size"]
    cfg.model.attn_backend = job.get("backend", cfg.model.attn_backend)
    if "block_size" in job:
        cfg.model.block_size = job["block_size"]
    torch.manual_seed(0)
    model = (build_hf_gpt2(cfg) if job.get("hf") else GPT(cfg.model)).to(device)
    flops = GPT(cfg.model).flops_per_token()  # the same shape, so the same useful work
    optimizer = build_optimizer(model, cfg.optim, device.type)
    train_model = torch.compile(model) if job["compile"] else model
    ctx = autocast(device, job["precision"])
    batch_size, T = job.get("batch_size", cfg.batch_size), cfg.model.block_size

    def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = sample_batch(data.train, batch_size, T, seed=0, step=i)
        return x.to(device), y.to(device)

    def step(i: int) -> None:
        x, y = batch(i)
        with ctx:
            loss = train_model(input_ids=x, labels=x).loss if job.get("hf") else train_model(x, y)[1]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()

    for i in range(job["warmup"]):
        step(i)
    meter = MemoryMeter(device)
    times = []
    for i in range(job["steps"]):
        start = time.perf_counter()
        step(job["warmup"] + i)
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    batch_times = []
    for i in range(20):
        start = time.perf_counter()
        batch(i)
        batch_times.append(time.perf_counter() - start)
    tokens_per_s = batch_size * T / step_s
    return {
        "tokens_per_s": tokens_per_s,
        "step_s": step_s,
        "mfu": mfu(flops, tokens_per_s, peak_flops(device, job["precision"])),
        "peak_mem_mb": meter.peak_above_base() / 2**20,
        "batch_fraction": statistics.median(batch_times) / step_s,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
    }


def run_job(job: dict) -> dict | None:
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  failed: {job}\n{proc.stderr[-1500:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def throughput_table(args: argparse.Namespace) -> None:
    jobs = []
    for compiled in [False] + ([] if args.no_compile else [True]):
        for precision in ("fp32", "bf16"):
            for backend in ("explicit", "sdpa"):
                jobs.append({"backend": backend, "precision": precision, "compile": compiled})
    try:
        import transformers  # noqa: F401

        jobs += [{"hf": True, "precision": p, "compile": False} for p in ("fp32", "bf16")]
    except ImportError:
        print("(transformers is not installed: no HF GPT2 rows)")
    print(
        f"\n{'model':<16}{'attention':<10}{'dtype':<6}{'mode':<9}{'tokens/s':>10}{'x base':>8}{'MFU':>7}"
        f"{'peak MB':>9}{'batch %':>9}"
    )
    base = None
    for job in jobs:
        job.update(overrides=args.overrides, steps=args.steps, warmup=args.warmup + (2 if job["compile"] else 0))
        r = run_job(job)
        if r is None:
            continue
        base = base or r["tokens_per_s"]
        name = "HF GPT2" if job.get("hf") else "attnlab GPT"
        print(
            f"{name:<16}{job.get('backend', 'sdpa'):<10}{job['precision']:<6}"
            f"{'compile' if job['compile'] else 'eager':<9}{r['tokens_per_s']:>10,.0f}{r['tokens_per_s'] / base:>8.2f}"
            f"{r['mfu']:>7.1%}{r['peak_mem_mb']:>9,.0f}{r['batch_fraction']:>9.2%}",
            flush=True,
        )


def memory_table(args: argparse.Namespace) -> None:
    print(f"\nmemory of one training step vs block_size (batch 1, {args.memory_precision}), MB above the model")
    print(f"{'block_size':>10}{'explicit':>10}{'sdpa':>10}{'ratio':>8}")
    for T in args.memory_sizes:
        row = {}
        for backend in ("explicit", "sdpa"):
            job = {
                "backend": backend,
                "precision": args.memory_precision,
                "compile": False,
                "block_size": T,
                "batch_size": 1,
                "steps": 1,
                "warmup": 1,
                "overrides": args.overrides,
            }
            r = run_job(job)
            row[backend] = r["peak_mem_mb"] if r else float("nan")
        print(f"{T:>10}{row['explicit']:>10,.0f}{row['sdpa']:>10,.0f}{row['explicit'] / row['sdpa']:>8.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per row (median reported)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (+2 for compiled rows)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    parser.add_argument("--memory-sizes", type=int, nargs="*", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--memory-precision", default="bf16")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, after --")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(json.loads(args.worker))))
        return
    device = resolve_device(load_config(args.overrides).device)
    print(
        f"attnlab bench_train: {time.strftime('%Y-%m-%d')}, torch {torch.__version__}, device {device}, "
        f"{torch.get_num_threads()} threads"
    )
    peaks = {p: peak_flops(device, p, remeasure=True) for p in ("fp32", "bf16")}  # fresh, in this run
    print(f"matmul peak: fp32 {peaks['fp32'] / 1e12:.3f} TFLOP/s, bf16 {peaks['bf16'] / 1e12:.3f} TFLOP/s")
    throughput_table(args)
    if args.memory_sizes:
        memory_table(args)


if __name__ == "__main__":
    main()
