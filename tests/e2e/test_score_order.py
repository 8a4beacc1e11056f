"""bench_quality --score prints the model's figure before the compressors' floor is measured."""

import subprocess
import sys
from pathlib import Path

from cli.config import to_train_config
from tests.helpers import compose_config
from training.setup import train

ROOT = Path(__file__).resolve().parents[2]


def test_score_prints_the_models_figure_first_then_measures_the_floor_once(tiny_run_overrides):
    # Defect: nothing was printed until the compressors' floor was measured (over 300 s on a fresh cache), and the
    # model's figure was lost with an interrupted floor
    cfg = to_train_config(compose_config([*tiny_run_overrides, "max_steps=2", "sample_tokens=0"]))
    train(cfg)
    command = [sys.executable, "bench/bench_quality.py", "--score", cfg.out_dir]
    first = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    lines = first.stderr.splitlines()
    assert lines[0].startswith(f"{cfg.out_dir} (best.safetensors, step 2): ") and lines[0].endswith(" bits/byte")
    assert lines[1] == "classical floor: measuring the compressors on this corpus (once; cached)"
    second = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and "measuring the compressors" not in second.stderr  # cached per corpus
    assert second.stdout == first.stdout
