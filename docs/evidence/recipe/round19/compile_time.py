"""Where a first run's compilation goes: the default's trainer compiled from an empty cache, with every C++ build
inductor runs timed (inductor runs them from a pool of threads in this process, so one wrapper sees them all).

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python docs/recipe/round19/compile_time.py [OVERRIDES...]

It prints the compile's seconds (Trainer.prepare: compile and one trial step), the builds' count and their summed
seconds, and inductor's own phase timings (dynamo's compile_times).
"""

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch._inductor.cpp_builder as cpp_builder  # noqa: E402
from torch._dynamo.utils import compile_times  # noqa: E402

from bench.bench_train import load_config  # noqa: E402
from data.prepare import prepare  # noqa: E402
from training.runtime import device_name, resolve_device  # noqa: E402
from training.trainer import Trainer  # noqa: E402

BUILD_S: list[float] = []  # each build's seconds; list.append is atomic, so the pool's threads can share it
run_build = cpp_builder._run_compile_cmd


def timed_build(cmd_line: str, cwd: str) -> None:
    start = time.perf_counter()
    run_build(cmd_line, cwd)
    BUILD_S.append(time.perf_counter() - start)


def main() -> None:
    cpp_builder._run_compile_cmd = timed_build
    cfg = load_config(sys.argv[1:])
    trainer = Trainer(cfg, prepare(cfg.data, progress=False), resolve_device(cfg.device))
    start = time.perf_counter()
    trainer.prepare()
    compile_s = time.perf_counter() - start
    print(f"cpu: {device_name(trainer.device)}; compile and trial step {compile_s:.1f} s")
    if BUILD_S:
        print(f"C++ builds: {len(BUILD_S)}, {sum(BUILD_S):.1f} s summed, median {statistics.median(BUILD_S):.2f} s")
    else:  # a warm cache: every kernel was already built
        print("C++ builds: none (the cache held every kernel; an empty TORCHINDUCTOR_CACHE_DIR measures a first run)")
    print(compile_times(repr="str"))


if __name__ == "__main__":
    main()
