"""Training throughput, MFU and memory, measured side by side in one run.

    python bench/bench_train.py                       # the default model and data
    python bench/bench_train.py --no-compile --steps 5
    python bench/bench_train.py -- model.n_head=8     # Hydra overrides after `--`
    python bench/bench_train.py --beside 1 4          # eager, beside 1 then 4 CPU-bound competitors it starts

Table 1: tokens/s, MFU (against this machine's measured matmul peak for the row's dtype) and
peak memory for explicit vs sdpa vs auto attention x fp32 vs bf16 x eager vs torch.compile, plus
HF transformers' GPT2LMHeadModel of the same shape when transformers is installed: as GPT-2's
config has it (GELU "gelu_new", a composite of small ops) and, in bf16, with the one-kernel GELU
("gelu_pytorch_tanh", the same function), the stronger baseline. A summary prints the ratios the
performance targets are stated in: the default config's attention and precision (auto, bf16) stepped
eager, over fp32 explicit eager and over HF in bf16. Eager, though the default run compiles
(configs/config.yaml, compile: true): the compiled rows are in the table.
Table 2: memory of one forward+backward vs block_size for explicit vs sdpa attention.
--beside K [K ...] prints neither: the default config stepped eager, its tokens/s beside K competitors as a
fraction of the fair share, and the thread policy's cost alone, in --pairs interleaved pairs (bench/beside.py).
Speeds are medians over the timed steps; ratios are against the fp32 / explicit / eager row of the
same run. The eager rows (ours and HF's) are built in one process and stepped in turn, because on
a shared machine the spread between processes is larger than the gaps between rows. Compiled rows
and each row's peak memory get a fresh process, so compile caches and memory high-water marks do
not leak between rows.
"""

import argparse
import contextlib
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import training.threads  # noqa: F401  # isort: skip  (before torch: OpenMP reads its wait policy once)
import torch
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from bench import beside
from cli.config import compose_configs, composition_error, to_train_config
from cli.schema_help import OneLineParser, at_least
from data.batches import sample_batch
from data.prepare import PreparedData, prepare
from data.text_file import read_json_object
from interop.hf_model import in_gpt2_layout, to_hf_config
from model import GPT
from rundir.files import SUMMARY
from rundir.records import mfu
from training import threads
from training.config import TrainConfig
from training.runtime import cpu_supports_bf16, device_name, peak_flops, resolve_device
from training.setup import train
from training.trainer import Trainer


def load_config(overrides: list[str]) -> TrainConfig:
    """configs/ composed with `overrides` and checked as train.py checks them; a refusal is one ValueError line."""
    try:
        return to_train_config(compose_configs(["out_dir=unused", "logger=none", *overrides]))
    except (HydraException, OmegaConfBaseException) as e:
        raise ValueError(composition_error(e)) from None


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
        return max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base)  # high-water mark


class HFAdapter(torch.nn.Module):
    """transformers' GPT2LMHeadModel behind our forward(idx, targets) -> (logits, loss), so the HF rows
    run through the same Trainer.step as ours (scaler, accumulation, clipping, guard, host read)."""

    def __init__(self, cfg: TrainConfig, activation: str) -> None:
        super().__init__()
        from transformers import GPT2LMHeadModel

        # The same sizes in GPT-2's layout (learned positions, no QK-norm, no gate, windows, mix or bigram table, a
        # tied head: every field GPT-2 fixes, at its default), which is what HF's GPT2LMHeadModel computes.
        hf_cfg = to_hf_config(in_gpt2_layout(cfg.model))
        hf_cfg.activation_function = activation  # a name for GELU's tanh form, as ours
        hf_cfg.resid_pdrop = hf_cfg.embd_pdrop = hf_cfg.attn_pdrop = 0.0
        hf_cfg._attn_implementation = "sdpa"
        self.hf = GPT2LMHeadModel(hf_cfg)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.hf(input_ids=idx).logits
        return logits, torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def row_config(job: dict) -> tuple[TrainConfig, PreparedData]:
    cfg = load_config(job["overrides"])
    data = prepare(cfg.data, progress=False)
    cfg.model.attn_backend = job.get("backend", cfg.model.attn_backend)
    cfg.precision = job["precision"]
    cfg.compile = job["compile"]
    cfg.batch_size = job.get("batch_size", cfg.batch_size)
    if "block_size" in job:  # the memory table trains that many tokens a sequence, every key in view
        cfg.model.block_size = job["block_size"]
        cfg.model.train_block_size = cfg.model.long_window_size = None
    return cfg, data


def prepare_row(job: dict) -> tuple[Callable[[int], None], Callable[[int], object], dict]:
    """One row of the table, built: step(i) runs the trainer's own optimizer step (Trainer.step, the one
    `python train.py` runs); batch(i) only cuts a batch."""
    cfg, data = row_config(job)
    device = resolve_device(cfg.device)
    trainer = Trainer(cfg, data, device)
    if job.get("hf"):
        torch.manual_seed(0)
        trainer.model = trainer.train_model = HFAdapter(cfg, job["hf"]).to(device)
        trainer.optimizer = trainer.new_optimizer(trainer.model)
    if cfg.compile:
        trainer.train_model = torch.compile(trainer.model)

    def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = sample_batch(data.train, cfg.batch_size, cfg.model.train_length, seed=0, step=i)
        return x.to(device), y.to(device)

    def step(i: int) -> None:
        trainer.advance(1.0)  # the loop's step, late in the run: reads loss and grad norm on the host

    info = {
        "device": device,
        "tokens_per_step": trainer.tokens_per_step,
        "flops_per_token": GPT(cfg.model).flops_per_token(),  # the same shape, so the same useful work
        "precision": trainer.precision,
    }
    return step, batch, info


def loop_overhead(job: dict) -> dict:
    """The whole `python train.py` loop (data, guard, logging, metrics.jsonl, progress bar) against the
    bare Trainer.step, in one process, in alternating rounds. Both sides get the statistic summary.json
    reports: the median tokens/s over windows of log_interval steps (evaluation excluded)."""
    step, _, info = prepare_row(job)
    for i in range(job["warmup"]):
        step(i)
    window, overheads = 5, []
    for round_ in range(job["rounds"]):
        rates = []
        for w in range(job["loop_steps"] // window):
            start = time.perf_counter()
            for i in range(window):
                step(w * window + i)
            rates.append(info["tokens_per_step"] * window / (time.perf_counter() - start))
        with tempfile.TemporaryDirectory() as out:
            cfg, _ = row_config(job)
            cfg.out_dir, cfg.max_steps, cfg.budget_s = out, job["loop_steps"], None
            cfg.eval_interval, cfg.log_interval, cfg.sample_tokens, cfg.progress = 10**9, window, 0, True
            cfg.seed += round_
            with contextlib.redirect_stderr(io.StringIO()):  # the bar runs, out of sight
                train(cfg)
            loop = read_json_object(Path(out) / SUMMARY)["tokens_per_s"]
        overheads.append(1 - loop / statistics.median(rates))
    return {"overheads": overheads}


def timed(fn: Callable[[int], object], i: int) -> float:
    start = time.perf_counter()
    fn(i)
    return time.perf_counter() - start


def summarize(step_times: list[float], batch: Callable[[int], object], info: dict) -> dict:
    step_s = statistics.median(step_times)
    tokens_per_s = info["tokens_per_step"] / step_s
    return {
        "tokens_per_s": tokens_per_s,
        "step_s": step_s,
        "mfu": mfu(info["flops_per_token"], tokens_per_s, peak_flops(info["device"], info["precision"])),
        "batch_fraction": statistics.median(timed(batch, i) for i in range(20)) / step_s,
    }


def measure(job: dict) -> dict:
    """One row alone in this process: its speed and the peak memory of its steps."""
    step, batch, info = prepare_row(job)
    for i in range(job["warmup"]):
        step(i)
    meter = MemoryMeter(info["device"])
    times = [timed(step, job["warmup"] + i) for i in range(job["steps"])]
    return summarize(times, batch, info) | {"peak_mem_mb": meter.peak_above_base() / 2**20}


def measure_interleaved(jobs: list[dict]) -> list[dict]:
    """Several rows in one process, one step of each in turn: the machine's drifts, and the spread
    between processes (larger here than the gaps being measured), hit every row alike."""
    rows = [prepare_row(job) for job in jobs]
    warmup, steps = jobs[0]["warmup"], jobs[0]["steps"]
    times = [[] for _ in rows]
    for i in range(warmup + steps):
        for (step, _, _), row_times in zip(rows, times, strict=True):
            t = timed(step, i)
            if i >= warmup:
                row_times.append(t)
    return [summarize(row_times, batch, info) for (_, batch, info), row_times in zip(rows, times, strict=True)]


def in_fresh_process(script: str, flag: str, job: object) -> object:
    """`python script flag JSON(job)` in a process of its own (a benchmark's worker); the JSON its last line of
    output prints. A failure raises RuntimeError with the end of its stderr."""
    proc = subprocess.run([sys.executable, script, flag, json.dumps(job)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(script).name} {flag} {json.dumps(job)} failed:\n{proc.stderr[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_worker(payload: dict | list[dict]) -> dict | list[dict] | None:
    """A fresh process measuring one row (dict) or several interleaved (list); None, said, if it failed."""
    try:
        return in_fresh_process(__file__, "--worker", payload)
    except RuntimeError as e:
        print(f"  {e}", file=sys.stderr)
        return None


def throughput_table(args: argparse.Namespace) -> None:
    eager = [
        {"backend": backend, "precision": precision, "compile": False}
        for precision in args.dtypes
        for backend in ("explicit", "sdpa", "auto")
    ]
    try:
        import transformers  # noqa: F401

        eager += [{"hf": "gelu_new", "precision": p, "compile": False} for p in args.dtypes]
        eager += [{"hf": "gelu_pytorch_tanh", "precision": p, "compile": False} for p in args.dtypes if p == "bf16"]
    except ImportError:
        print("(transformers is not installed: no HF GPT2 rows)")
    compiled = [] if args.no_compile else [job | {"compile": True} for job in eager if not job.get("hf")]
    for job in eager + compiled:
        job.update(overrides=args.overrides, steps=args.steps, warmup=args.warmup + (2 if job["compile"] else 0))
    print(
        f"(eager rows: {len(eager)} models in one process, stepped in turn; compiled rows and every peak "
        "memory: a fresh process each)",
        flush=True,
    )
    speeds = run_worker(eager) or [None] * len(eager)
    memory = [run_worker(job | {"steps": 1, "warmup": 1}) for job in eager]
    for r, m in zip(speeds, memory, strict=True):
        if r is not None:
            r["peak_mem_mb"] = m["peak_mem_mb"] if m else float("nan")
    speeds += [run_worker(job) for job in compiled]
    print(
        f"\n{'model':<28}{'attention':<10}{'dtype':<6}{'mode':<9}{'tokens/s':>10}{'x base':>8}{'MFU':>7}"
        f"{'peak MB':>9}{'batch %':>9}"
    )
    base, by_row = None, {}
    for job, r in zip(eager + compiled, speeds, strict=True):
        if r is None:
            continue
        base = base or r["tokens_per_s"]
        name = f"HF GPT2 {job['hf']}" if job.get("hf") else "attnlab GPT"
        backend, mode = job.get("backend", "sdpa"), "compile" if job["compile"] else "eager"
        by_row[(job.get("hf"), backend, job["precision"], mode)] = r["tokens_per_s"]
        print(
            f"{name:<28}{backend:<10}{job['precision']:<6}{mode:<9}{r['tokens_per_s']:>10,.0f}"
            f"{r['tokens_per_s'] / base:>8.2f}{r['mfu']:>7.1%}{r['peak_mem_mb']:>9,.0f}{r['batch_fraction']:>9.2%}",
            flush=True,
        )
    best = "bf16" if "bf16" in args.dtypes else "fp32"  # what precision=auto takes on this machine
    default = by_row.get((None, "auto", best, "eager"))
    if default and base:
        print(f"\ndefault config, eager (auto, {best}) / fp32 explicit eager: {default / base:.2f}x")
        for activation in ("gelu_new", "gelu_pytorch_tanh"):
            hf = by_row.get((activation, "sdpa", best, "eager"))
            if hf:
                print(f"default config, eager / HF GPT2 ({activation}, {best}, eager): {default / hf:.2f}x")


def loop_table(args: argparse.Namespace) -> None:
    """The loop users run against the bare step, at the default config stepped eager (target: at most 5% overhead)."""
    job = {"precision": "auto", "compile": False, "overrides": args.overrides, "warmup": args.warmup}
    job |= {"rounds": 5, "loop_steps": max(20, 2 * args.steps)}  # loop_overhead times loop_steps a round
    r = run_worker(job)
    if r:
        each = ", ".join(f"{o:+.1%}" for o in r["overheads"])
        config = (f"overrides {' '.join(args.overrides)}" if args.overrides else "default config") + ", eager"
        print(
            f"\nwhole train.py loop vs bare Trainer.step ({config}, {job['rounds']} alternating rounds, "
            f"paired): loop overhead {statistics.median(r['overheads']):+.1%} (median; rounds {each})",
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
            r = run_worker(job)
            row[backend] = r["peak_mem_mb"] if r else float("nan")
        print(f"{T:>10}{row['explicit']:>10,.0f}{row['sdpa']:>10,.0f}{row['explicit'] / row['sdpa']:>8.1f}", flush=True)


def beside_table(args: argparse.Namespace, device: torch.device) -> None:
    """The default config (or the overrides') stepped eager beside K competitors and alone, each thread policy in
    a worker process of its own (bench/beside.py)."""
    job = {"precision": "auto", "compile": False, "overrides": args.overrides, "steps": args.steps}
    job["warmup"] = args.warmup
    prepare(load_config(args.overrides).data, progress=False)  # once, here: the two workers then only read it
    peaks = {p: peak_flops(device, p, remeasure=True) for p in args.dtypes}  # fresh, before any competitor
    cores = threads.usable_cores()
    envs = {policy: beside.policy_env(policy, dict(os.environ), args.spin) for policy in beside.POLICIES}
    ours = threads.choose(envs["attnlab"], cores, threads.openmp_runtime())
    measured = ", ".join(f"{p} {peak / 1e12:.3f} TFLOP/s" for p, peak in peaks.items())
    print(f"CPU: {beside.cpu_model()} ({cores} cores this process may use); measured matmul peak: {measured}")
    print(f"attnlab's thread policy: {ours}; torch's: its OpenMP defaults")
    print(f"eager steps of {' '.join(args.overrides) or 'the default config'}, {args.steps} timed a measurement")
    with beside.workers([sys.executable, __file__, "--serve", json.dumps(job)], envs) as running:
        beside.report(lambda policy: running[policy].measure(), args.beside, args.pairs, cores)


def serve(job: dict) -> None:
    """--serve: a worker of beside_table, stepping one row on request (bench/beside.py's Worker)."""
    step, _, info = prepare_row(job)
    beside.serve(step, info["tokens_per_step"], job["warmup"], job["steps"])


def main() -> None:
    # Bad values are one `error:` line here, before any row is built (a worker's failure is a traceback).
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=at_least(1), default=8, help="timed steps per row (median reported)")
    parser.add_argument("--warmup", type=at_least(0), default=2, help="untimed steps first (+2 for compiled rows)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    parser.add_argument("--memory-sizes", type=at_least(1), nargs="*", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--memory-precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--dtypes", nargs="*", choices=("fp32", "bf16"), help="default: bf16 too where it is native")
    parser.add_argument("--beside", type=at_least(1), nargs="+", metavar="K", help="beside K competitors (above)")
    parser.add_argument("--pairs", type=at_least(5), default=5, help="--beside: interleaved pairs per setting")
    parser.add_argument("--spin", type=at_least(0), help="--beside: GOMP_SPINCOUNT for attnlab's side (a trial)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, after --")
    args = parser.parse_args()
    if args.worker:
        payload = json.loads(args.worker)
        if isinstance(payload, list):
            print(json.dumps(measure_interleaved(payload)))
        else:
            print(json.dumps(loop_overhead(payload) if payload.get("loop_steps") else measure(payload)))
        return
    if args.serve:
        serve(json.loads(args.serve))
        return
    try:
        device = resolve_device(load_config(args.overrides).device)
    except ValueError as e:  # a bad override or device: a bad command line
        parser.error(str(e))
    print(
        f"attnlab bench_train: {time.strftime('%Y-%m-%d')}, torch {torch.__version__}, device {device} "
        f"({device_name(device)}), {torch.get_num_threads()} threads"
    )
    chosen = bool(args.dtypes)  # the note below explains only the machine's choice, not the user's
    args.dtypes = args.dtypes or (["fp32", "bf16"] if device.type == "cuda" or cpu_supports_bf16() else ["fp32"])
    if args.beside:
        if device.type != "cpu":
            parser.error(f"--beside measures CPU threads beside CPU-bound work; device={device.type} is not the CPU")
        try:
            beside_table(args, device)
        except KeyboardInterrupt:  # its workers and competitors are stopped on the way out
            sys.exit(130)
        return
    peaks = {p: peak_flops(device, p, remeasure=True) for p in args.dtypes}  # fresh, in this run
    print("matmul peak: " + ", ".join(f"{p} {peak / 1e12:.3f} TFLOP/s" for p, peak in peaks.items()))
    if "bf16" not in args.dtypes and not chosen:
        print(
            "(no bf16 rows: this CPU has no native bf16 matmul, so autocast would emulate it; "
            "--dtypes fp32 bf16 forces them)"
        )
    throughput_table(args)
    loop_table(args)
    if args.memory_sizes:
        memory_table(args)


if __name__ == "__main__":
    main()
