"""Round 14's rescoring: one checkpoint's full-val bits/byte in windows of T tokens, with each layer's
attention window set by hand (no retraining), the scorer bench_quality.py --score uses otherwise.

    python docs/recipe/round14/score_in_windows.py RUN/checkpoints/best.safetensors 128:64,64,64,full 1024:64,64,64,128

Each spec is T:W0,W1,...: windows of T tokens, layer i seeing the last Wi keys ("full": all of them)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from analysis.trained import load_model
from data.config import DataConfig
from data.prepare import prepare
from training.evaluate import split_loss
from training.runtime import autocast, resolve_precision

model, ckpt = load_model(sys.argv[1])
config = ckpt.meta["config"]
data = prepare(DataConfig(**config["data"]), progress=False)
device = next(model.parameters()).device
ctx = autocast(device, resolve_precision(config.get("precision", "auto"), device))
for spec in sys.argv[2:]:
    length, windows = spec.split(":")
    for block, window in zip(model.blocks, windows.split(","), strict=True):
        block.attn.window = None if window == "full" else int(window)
    loss = split_loss(model, data.val, int(length), device, precision_ctx=ctx)
    print(spec, "loss", round(loss, 5), "bpb", round(data.bits_per_byte(loss), 5), flush=True)
