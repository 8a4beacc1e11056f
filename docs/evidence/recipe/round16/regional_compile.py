"""Round 16's screen of regional compilation: the default trainer's first compilation from an empty inductor cache
and its compiled step, with torch.compile over the whole model (as training/runtime.py does) or over each block
(`blocks`: the blocks' code compiled once per distinct block, the rest eager) and the loss (`blocks_loss`).

    python docs/recipe/round16/regional_compile.py whole|blocks|blocks_loss [overrides]
"""

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()  # before torch reads it
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from torch._inductor import config as inductor

import training.runtime as runtime
from bench.bench_train import load_config
from data.prepare import prepare
from training.trainer import Trainer

mode = sys.argv[1]
if mode != "whole":

    def compile_regions(model, trial_step):
        with inductor.patch({"cpp.vec_isa_ok": True}):  # as training/runtime.py compiles
            for block in model.blocks:
                block.compile()
            if mode == "blocks_loss":
                model.loss = torch.compile(model.loss)
            trial_step(model)
        return model

    runtime.compile_trusting_the_cpu = compile_regions
cfg = load_config(sys.argv[2:])
trainer = Trainer(cfg, prepare(cfg.data, progress=False), runtime.resolve_device(cfg.device))
trainer.prepare()
print(f"{mode} compile_s {trainer.compile_s:.1f}", flush=True)
for _ in range(10):
    trainer.advance(0.8)
rounds = []
for _ in range(5):
    steps = []
    for _ in range(10):
        start = time.perf_counter()
        trainer.advance(0.8)
        steps.append(time.perf_counter() - start)
    rounds.append(1000 * statistics.median(steps))
print(f"{mode} step_ms " + " ".join(f"{ms:.1f}" for ms in rounds), flush=True)
