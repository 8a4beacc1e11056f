"""Moved to bench/bench_generate.py (the benchmarks have their own folder); this alias runs it, for one release."""

import runpy
import sys
from pathlib import Path

sys.stderr.write("note: scripts/bench_generate.py moved to bench/bench_generate.py\n")
runpy.run_path(str(Path(__file__).resolve().parents[1] / "bench" / Path(__file__).name), run_name="__main__")
