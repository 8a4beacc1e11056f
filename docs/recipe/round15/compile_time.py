"""compile_s of the default trainer from an empty inductor cache (fresh process per call).
--checked: inductor's own ISA checks (the code before round 15); else the trusted CPU ISA list (round 15)."""
import os, sys, tempfile
cache = tempfile.mkdtemp(); os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
sys.path.insert(0, "/work/main")
import torch
import training.runtime as runtime
checked = "--checked" in sys.argv
if checked:
    def plain(model, trial_step):
        compiled = torch.compile(model); trial_step(compiled); return compiled
    runtime.compile_trusting_the_cpu = plain
from bench.bench_train import load_config
from data.prepare import prepare
from training.trainer import Trainer
from training.runtime import resolve_device
cfg = load_config([a for a in sys.argv[1:] if a != "--checked"])
t = Trainer(cfg, prepare(cfg.data, progress=False), resolve_device(cfg.device))
t.prepare()
from torch._inductor.cpu_vec_isa import pick_vec_isa
print(f"{'checked' if checked else 'trusted'} compile_s {t.compile_s:.1f} isa {pick_vec_isa()} compiled {t.compiled}", flush=True)
