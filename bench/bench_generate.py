"""Benchmark generation: KV-cached vs uncached decoding, per-token latency, and HF GPT-2 for comparison.

    python bench/bench_generate.py                 # the GPT-2-layout model below, vocab 65
    python bench/bench_generate.py --vocab 50257   # GPT-2's vocabulary: the LM head dominates
    python bench/bench_generate.py --quick         # 128 / 512 new tokens only, for a fast check
    python bench/bench_generate.py --threads 1     # one thread: batch-1 decoding is latency-bound, and
                                                     # a second thread only helps on an otherwise idle CPU
    python bench/bench_generate.py --contention    # the default model's decode, quiet and beside a busy job,
                                                     # with torch's default threads and decode_threads' choice

Model: 4 layers, d_model 256, 4 heads of d_k 64, learned positions (the earlier default, not today's
configs/model/small.yaml: d_model 128, RoPE + QK-norm), so HF's GPT-2 has the same shape; block_size
2048, so that 64 prompt + 1024 new tokens never reach the sliding window. Random weights, fp32, batch 1,
greedy decoding (temperature 0) everywhere, so every path does the same work per token.
tokens/s = new tokens / median wall time of whole `generate` calls (prefill of the 64-token prompt
included); latency = median of 32 single decode steps with the cache holding `position` tokens.
HF rows (only when `transformers` is installed): GPT2LMHeadModel of the same shape, randomly
initialised, `generate(do_sample=False, use_cache=True)`.

--contention: the default run's model (configs/, composed as train.py does; random weights) decodes greedily
from a 16-token prompt to its block_size, again and again for --seconds, with torch's default thread count
and with the count generation.generate.decode_threads picks for it (as if OMP_NUM_THREADS were unset);
first on a quiet CPU, then beside a competing process that multiplies matrices on every core until it is
killed. tokens/s = new tokens / wall time.

--long: one long greedy sample (default 10,000 tokens from a 16-token prompt) from the default run's model
(configs/, composed as train.py does, plus any Hydra overrides after --long's flags; random weights, or the
trained weights of --checkpoint), with the threads generation.generate.decode_threads picks. It reports the
tokens/s of the first --first tokens (default 2,000; prefill included), of the last --first, and of the whole
sample, and whole / first (the rolling cache's target: >= 0.8), and whether the cache rolls (`rolls`). Past
the context (block_size 4,096 for the default) a model whose layers reach only their windows keeps the cost
of a token constant; elsewhere each further token re-reads the whole window. Random and trained weights do
the same work per token: greedy decoding runs every step whatever the tokens are.

    python bench/bench_generate.py --long                          # the default model, random weights
    python bench/bench_generate.py --long --checkpoint outputs/latest   # a trained run's weights
    python bench/bench_generate.py --long --tokens 20000 --first 4000
"""

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python bench/bench_generate.py): make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import training.threads  # noqa: F401  # isort: skip  (before torch: OpenMP reads its wait policy once)
import torch

from cli.schema_help import OneLineParser, at_least
from generation.generate import SamplingParams, decode_threads, generate, rolls, stream_tokens, torch_threads
from model import GPT, GPTConfig
from training.runtime import device_name

PROMPT = 64
BLOCK_SIZE = 2048


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def make_model(vocab: int) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=vocab, block_size=BLOCK_SIZE, n_layer=4, n_head=4, d_model=256)
    return GPT(cfg).eval()


def make_hf_model(vocab: int):
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return None
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=vocab, n_positions=BLOCK_SIZE, n_embd=256, n_layer=4, n_head=4, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(cfg).eval()


@torch.no_grad()
def decode_latency(model: GPT, position: int, steps: int = 32) -> float:
    """Median seconds of one cached decode step when the cache already holds `position` tokens."""
    cache = model.new_cache(1, position + steps)
    idx = torch.randint(0, model.config.vocab_size, (1, position + steps))
    model(idx[:, :position], cache=cache, last_only=True)
    times = []
    for t in range(position, position + steps):
        start = time.perf_counter()
        model(idx[:, t : t + 1], cache=cache, last_only=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def uncached_latency(model: GPT, position: int, repeats: int = 5) -> float:
    idx = torch.randint(0, model.config.vocab_size, (1, position + 1))
    return median_seconds(lambda: model(idx, last_only=True), repeats)


# The competing job: every core multiplying matrices, "ready" once it is busy. It stops when killed, and by
# itself when its parent is gone (a benchmark killed in turn) or after 15 minutes: never left spinning.
BUSY_JOB = """
import os, sys, time, torch
parent, end = int(sys.argv[1]), time.monotonic() + 900
a = torch.randn(384, 384)
a @ a
print("ready", flush=True)
while os.getppid() == parent and time.monotonic() < end:
    a @ a
"""


def busy_job(cores: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(cores)}
    command = [sys.executable, "-c", BUSY_JOB, str(os.getpid())]
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    if job.stdout is None or job.stdout.readline().strip() != "ready":
        job.kill()
        raise RuntimeError("the competing process did not start")
    return job


@torch.no_grad()
def decode_rate(model: GPT, seconds: float) -> float:
    """New tokens per second of greedy cached generation from a 16-token prompt to block_size, repeated
    for at least `seconds` (at least once)."""
    prompt = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    params = SamplingParams(model.config.block_size - 16, temperature=0, top_k=None, seed=None)
    tokens, start = 0, time.perf_counter()
    while tokens == 0 or time.perf_counter() - start < seconds:
        generate(model, prompt, params)
        tokens += params.max_new_tokens
    return tokens / (time.perf_counter() - start)


def contention(seconds: float) -> None:
    """The default model's decode tokens/s, quiet and beside a busy job, with each thread count."""
    from bench.bench_train import load_config  # Hydra: only this mode needs it

    cfg = load_config([])
    model_cfg = dataclasses.replace(cfg.model, vocab_size=cfg.model.vocab_size or cfg.data.bpe_vocab_size)
    torch.manual_seed(0)
    model = GPT(model_cfg).eval()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    default = torch.get_num_threads()
    chosen = decode_threads(model, environ={}) or default
    print(
        f"cpu: {device_name(torch.device('cpu'))}, {cores} cores; model: the default run's "
        f"({model.num_params() / 1e6:.1f}M params, block_size {model_cfg.block_size}), fp32, torch {torch.__version__}"
    )
    settings = {f"torch default ({default})": default, f"decode_threads ({chosen})": chosen}
    generate(model, torch.zeros(1, 1, dtype=torch.long), SamplingParams(8, temperature=0, seed=None))  # warm-up
    quiet = {}
    for name, threads in settings.items():
        with torch_threads(threads):
            quiet[name] = decode_rate(model, seconds)
    busy, job = {}, busy_job(cores)
    try:
        for name, threads in settings.items():
            with torch_threads(threads):
                busy[name] = decode_rate(model, seconds)
    finally:
        job.kill()
        job.wait()
    header = f"{'threads':>20} | {'quiet tok/s':>11} | {'beside a busy job tok/s':>23} | {'busy / quiet':>12}"
    print("\n" + header + "\n" + "-" * len(header))
    for name in settings:
        print(f"{name:>20} | {quiet[name]:>11.1f} | {busy[name]:>23.1f} | {busy[name] / quiet[name]:>11.2f}x")
    first, second = settings
    print(
        f"\n{second} / {first}: quiet {quiet[second] / quiet[first]:.2f}x, beside a busy job "
        f"{busy[second] / busy[first]:.2f}x"
    )


def long_model(checkpoint: str | None, overrides: list[str]) -> tuple[GPT, str]:
    """The default run's model with random weights (configs/ and `overrides`), or a checkpoint's; and which."""
    if checkpoint is not None:
        from analysis.trained import load_model
        from rundir.checkpoints import find_checkpoint

        path = find_checkpoint(checkpoint)
        return load_model(path)[0], f"trained weights of {path}"
    from bench.bench_train import load_config  # Hydra: only this mode needs it

    cfg = load_config(overrides)
    model_cfg = dataclasses.replace(cfg.model, vocab_size=cfg.model.vocab_size or cfg.data.bpe_vocab_size)
    torch.manual_seed(0)
    return GPT(model_cfg).eval(), "random weights (seed 0)"


def token_times(model: GPT, tokens: int) -> list[float]:
    """Seconds from the call to each of `tokens` greedy tokens from a 16-token prompt (prefill included)."""
    prompt = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    params = SamplingParams(tokens, temperature=0, top_k=None, seed=None)
    times, start = [], time.perf_counter()
    for _ in stream_tokens(model, prompt, params):
        times.append(time.perf_counter() - start)
    return times


def long_sample(tokens: int, first: int, checkpoint: str | None, overrides: list[str]) -> None:
    """Tokens/s of the first `first` tokens of one `tokens`-token sample, of its last `first`, and of the whole."""
    model, weights = long_model(checkpoint, overrides)
    context = model.config.block_size
    threads = decode_threads(model)
    rolling = rolls(model, context, pointer=False)
    print(
        f"attnlab bench_generate --long: {time.strftime('%Y-%m-%d')}, {device_name(torch.device('cpu'))}; model: "
        f"{model.num_params() / 1e6:.1f}M params, block_size {context}, {weights}, fp32, "
        f"{threads or torch.get_num_threads()} threads, torch {torch.__version__}; cache rolls: {rolling}"
    )
    with torch_threads(threads):
        generate(model, torch.zeros(1, 1, dtype=torch.long), SamplingParams(8, temperature=0, seed=None))  # warm-up
        times = token_times(model, tokens)
    first_rate = first / times[first - 1]
    last_rate = first / (times[-1] - times[-first - 1]) if tokens > first else first_rate
    whole_rate = tokens / times[-1]
    print(f"first {first:,} tokens: {first_rate:.1f} tokens/s")
    print(f"last {first:,} tokens: {last_rate:.1f} tokens/s")
    print(f"whole {tokens:,} tokens: {whole_rate:.1f} tokens/s ({times[-1]:.1f} s)")
    print(f"whole / first: {whole_rate / first_rate:.2f}x (target >= 0.8)")


def main() -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--vocab", type=at_least(1), default=65, help="vocabulary size (65: Shakespeare chars; 50257: GPT-2)"
    )
    parser.add_argument("--repeats", type=at_least(1), default=3, help="runs per cached measurement (median)")
    parser.add_argument("--quick", action="store_true", help="skip the 1024-token rows")
    parser.add_argument("--threads", type=at_least(0), default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument(
        "--contention", action="store_true", help="decode tokens/s quiet and beside a busy job, per thread count"
    )
    parser.add_argument(
        "--seconds", type=at_least(1), default=5, help="--contention: seconds per measurement (--quick: 0.2)"
    )
    parser.add_argument("--long", action="store_true", help="one long sample from the default model: tokens/s")
    parser.add_argument("--tokens", type=at_least(2), default=10_000, help="--long: tokens in the sample")
    parser.add_argument("--first", type=at_least(1), default=2_000, help="--long: the first tokens' count")
    parser.add_argument("--checkpoint", help="--long: a run or checkpoint file whose trained weights sample")
    parser.add_argument("overrides", nargs="*", help="--long: Hydra overrides of the default model (random weights)")
    args = parser.parse_args()
    if args.overrides and not args.long:
        parser.error(f"unrecognized arguments: {' '.join(args.overrides)} (Hydra overrides go with --long)")
    if args.long and args.first >= args.tokens:
        parser.error(f"argument --first: {args.first} is invalid; it must be below --tokens ({args.tokens})")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.contention:
        contention(0.2 if args.quick else args.seconds)
        return
    if args.long:
        try:
            long_sample(args.tokens, args.first, args.checkpoint, args.overrides)
        except (ValueError, FileNotFoundError) as e:
            parser.error(str(e))
        return

    model, hf = make_model(args.vocab), make_hf_model(args.vocab)
    print(
        f"attnlab bench_generate: {time.strftime('%Y-%m-%d')}, {device_name(torch.device('cpu'))}; "
        f"model: 4 layers, d_model 256, 4 heads, block_size {BLOCK_SIZE}, vocab {args.vocab}, "
        f"{model.num_params() / 1e6:.1f}M params, fp32, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    prompt = torch.randint(0, args.vocab, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    generate(model, prompt, SamplingParams(16, temperature=0, top_k=None, seed=None))  # warm-up
    if hf is not None:
        hf.generate(prompt, max_new_tokens=16, do_sample=False, pad_token_id=0)

    lengths = (128, 512) if args.quick else (128, 512, 1024)
    header = f"{'new tokens':>10} | {'cached tok/s':>12} | {'uncached tok/s':>14} | {'speed-up':>8}"
    header += f" | {'HF GPT2 cached tok/s':>20} | {'ours / HF':>9}" if hf is not None else ""
    print("\n" + header + "\n" + "-" * len(header))
    for n in lengths:
        runs = {
            "ours": lambda n=n: generate(
                model, prompt, SamplingParams(n, temperature=0, use_cache=True, top_k=None, seed=None)
            )
        }
        if hf is not None:
            runs["hf"] = lambda n=n: hf.generate(
                prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True, pad_token_id=0
            )
        # Interleaved (ours, HF, ours, HF, ...): a load spike on a shared machine hits both alike.
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, run in runs.items():
                times[name].append(median_seconds(run, 1))
        cached = statistics.median(times["ours"])
        # Uncached runs are long and steady; one run each keeps the benchmark to a few minutes.
        uncached = median_seconds(
            lambda n=n: generate(
                model, prompt, SamplingParams(n, temperature=0, use_cache=False, top_k=None, seed=None)
            ),
            1,
        )
        row = f"{n:>10} | {n / cached:>12.1f} | {n / uncached:>14.1f} | {uncached / cached:>7.1f}x"
        if hf is not None:
            hf_s = statistics.median(times["hf"])
            row += f" | {n / hf_s:>20.1f} | {hf_s / cached:>8.2f}x"
        print(row)

    positions = (64, 512) if args.quick else (64, 1024)
    print(f"\n{'position':>10} | {'cached ms/token':>15} | {'uncached ms/token':>17}")
    print("-" * 49)
    latencies = {}
    for p in positions:
        latencies[p] = decode_latency(model, p)
        print(f"{p:>10} | {latencies[p] * 1e3:>15.2f} | {uncached_latency(model, p) * 1e3:>17.2f}")
    first, last = positions
    print(f"\ncached latency at position {last} / at {first}: {latencies[last] / latencies[first]:.2f}x")


if __name__ == "__main__":
    main()
