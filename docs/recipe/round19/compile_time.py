"""Where a first run's compilation goes: the default's trainer compiled from an empty cache, with every C++ build
inductor runs timed (the builds run in its worker processes, which inherit the timing wrapper).

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python docs/recipe/round19/compile_time.py [OVERRIDES...]

It prints the compile's seconds (Trainer.prepare: compile and one trial step), the builds' count and their summed
seconds, and inductor's own phase timings (dynamo's compile_times).
"""

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

LOG = Path(sys.argv[0]).with_suffix(".builds.tmp")
run_build = cpp_builder._run_compile_cmd


def timed_build(cmd_line: str, cwd: str) -> None:
    start = time.perf_counter()
    run_build(cmd_line, cwd)
    with LOG.open("a") as f:  # one line per build, appended from whichever process ran it
        f.write(f"{time.perf_counter() - start:.3f}\n")


def main() -> None:
    cpp_builder._run_compile_cmd = timed_build
    LOG.unlink(missing_ok=True)
    cfg = load_config(sys.argv[1:])
    trainer = Trainer(cfg, prepare(cfg.data, progress=False), resolve_device(cfg.device))
    start = time.perf_counter()
    trainer.prepare()
    compile_s = time.perf_counter() - start
    builds = [float(line) for line in LOG.read_text().split()] if LOG.exists() else []
    LOG.unlink(missing_ok=True)
    print(f"cpu: {device_name(trainer.device)}; compile and trial step {compile_s:.1f} s")
    print(f"C++ builds: {len(builds)}, {sum(builds):.1f} s summed, median {sorted(builds)[len(builds) // 2]:.2f} s")
    print(compile_times(repr="str"))


if __name__ == "__main__":
    main()
