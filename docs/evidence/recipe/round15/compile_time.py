"""Round 15's compilation timing: the default trainer's first compilation from an empty inductor cache, in a fresh
process per call, as round 15 compiles (trusting the CPU's vector ISA list) or, with --checked, as before (inductor
compiling and loading a test program for each ISA first). It prints compile_s and the ISA inductor chose.

    S=docs/recipe/round15/compile_time.py; for i in 1 2 3 4 5; do python $S --checked; python $S; done
"""

import os
import sys
import tempfile
from pathlib import Path

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()  # before torch reads it
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from torch._inductor.cpu_vec_isa import pick_vec_isa

import training.runtime as runtime
from bench.bench_train import load_config
from data.prepare import prepare
from training.trainer import Trainer

checked = "--checked" in sys.argv
if checked:

    def compile_with_inductors_checks(model, trial_step):
        compiled = torch.compile(model)
        trial_step(compiled)
        return compiled

    runtime.compile_trusting_the_cpu = compile_with_inductors_checks

cfg = load_config([a for a in sys.argv[1:] if a != "--checked"])
trainer = Trainer(cfg, prepare(cfg.data, progress=False), runtime.resolve_device(cfg.device))
trainer.prepare()
how = "checked" if checked else "trusted"
print(f"{how} compile_s {trainer.compile_s:.1f} isa {pick_vec_isa()} compiled {trainer.compiled}", flush=True)
