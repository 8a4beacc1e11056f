"""Attention kernels alone, forward + backward, side by side: where `attn_backend=auto` switches.

    python bench/bench_attention.py
    python bench/bench_attention.py --lengths 128 256 512 --dtypes bf16 --repeats 9

At a fixed number of tokens per batch (B * T), it times the explicit equation (autograd), the fused
kernel (F.scaled_dot_product_attention, is_causal) and the materialized kernel for each sequence
length and dtype, and prints medians and the fused / materialized ratio. MATERIALIZED_MAX_KEYS in
model/attention.py is where `auto` stops taking the materialized kernel: beyond it the gain is
small and the memory of the probabilities grows quadratically.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import training.threads  # noqa: F401  # isort: skip  (before torch: OpenMP reads its wait policy once)
import torch
import torch.nn.functional as F

from cli.schema_help import OneLineParser, at_least
from model.attention import MATERIALIZED_MAX_KEYS, scaled_dot_product_attention
from model.causal_mask import build_causal_mask
from model.materialized_attention import causal_materialized_attention
from training.runtime import device_name

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def time_fwd_bwd(fn, shape: tuple[int, ...], dtype: torch.dtype, repeats: int) -> float:
    """Median seconds of fn(q, k, v).backward(grad) over `repeats` runs, after two warm-up runs."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g).to(dtype).requires_grad_() for _ in range(3))
    grad = torch.randn(shape, generator=g).to(dtype)
    times = []
    for i in range(repeats + 2):
        start = time.perf_counter()
        fn(q, k, v).backward(grad)
        if i >= 2:
            times.append(time.perf_counter() - start)
        q.grad = k.grad = v.grad = None
    return statistics.median(times)


def main() -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--tokens",
        type=at_least(1),
        default=8192,
        help="B * T for every row (default 8192: 32 sequences x 256 tokens, TrainConfig's and GPTConfig's defaults; "
        "the default run steps 12 x 128)",
    )
    parser.add_argument("--heads", type=at_least(1), default=4)
    parser.add_argument(
        "--head-dim",
        type=at_least(1),
        default=64,
        help="d_k (default 64: GPTConfig's d_model 256 / 4 heads; the default run's model has 32)",
    )
    parser.add_argument("--lengths", type=at_least(1), nargs="*", default=[64, 128, 256, 512, 1024, 2048])
    parser.add_argument("--dtypes", nargs="*", default=["bf16", "fp32"], choices=list(DTYPES))
    parser.add_argument("--repeats", type=at_least(1), default=7)
    args = parser.parse_args()
    print(
        f"attnlab bench_attention: {time.strftime('%Y-%m-%d')}, {device_name(torch.device('cpu'))}, "
        f"torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {args.tokens} tokens, {args.heads} heads of {args.head_dim}; "
        f"auto takes the materialized kernel for training on a CPU up to {MATERIALIZED_MAX_KEYS} keys"
    )
    print(f"{'dtype':<6}{'T':>6}{'B':>5}{'explicit ms':>13}{'sdpa ms':>10}{'materialized ms':>17}{'sdpa/mat.':>11}")
    for name in args.dtypes:
        for T in args.lengths:
            B = max(1, args.tokens // T)
            shape = (B, args.heads, T, args.head_dim)
            mask = build_causal_mask(T)
            explicit = time_fwd_bwd(
                lambda q, k, v, mask=mask: scaled_dot_product_attention(q, k, v, mask),
                shape,
                DTYPES[name],
                args.repeats,
            )
            fused = time_fwd_bwd(
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                shape,
                DTYPES[name],
                args.repeats,
            )
            materialized = time_fwd_bwd(causal_materialized_attention, shape, DTYPES[name], args.repeats)
            print(
                f"{name:<6}{T:>6}{B:>5}{explicit * 1e3:>13.1f}{fused * 1e3:>10.1f}{materialized * 1e3:>17.1f}"
                f"{fused / materialized:>11.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
