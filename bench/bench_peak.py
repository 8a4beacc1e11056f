"""Measure this device's matmul peak per dtype (the denominator of MFU) and cache it.

python bench/bench_peak.py                 # cpu or the auto-detected GPU
python bench/bench_peak.py --device cpu --remeasure
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import training.threads  # noqa: F401  # isort: skip  (before torch: OpenMP reads its wait policy once)
import torch

from cli.schema_help import OneLineParser
from data.config import resolve_cache_dir
from training.runtime import cpu_supports_bf16, device_name, peak_flops, resolve_device


def main() -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--remeasure", action="store_true", help="ignore the cached figures")
    args = parser.parse_args()
    try:
        device = resolve_device(args.device)
    except ValueError as e:  # a device this machine lacks: a bad command line
        parser.error(str(e))
    cache_file = resolve_cache_dir() / "peak_flops.json"
    precisions = ["fp32"]
    if device.type == "cuda" or cpu_supports_bf16():
        precisions.append("bf16")
    if device.type == "cuda":
        precisions.append("fp16")
    print(f"device: {device_name(device)} ({device}), torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'dtype':<6} {'TFLOP/s':>8}")
    for p in precisions:
        print(f"{p:<6} {peak_flops(device, p, cache_file, args.remeasure) / 1e12:>8.3f}")
    print(f"cached in {cache_file}")


if __name__ == "__main__":
    main()
