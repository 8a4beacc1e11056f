"""Round 23's rescoring: runs' best checkpoints scored as bench_quality.py --score does (every held-out token once, in
windows of block_size), with the continuous cache (model/pointer.py) at each given weight and scale. Training does
not read the cache, so one checkpoint gives the paired figures with it and without it (weight 0).

    python docs/recipe/round23/score_pointer.py RUN [RUN ...] --pairs 0,15 0.2,15 0.15,20
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from analysis.trained import find_checkpoint, load_model
from data.config import DataConfig
from data.prepare import prepare
from training.evaluate import split_loss
from training.runtime import autocast, resolve_precision

parser = argparse.ArgumentParser()
parser.add_argument("runs", nargs="+", type=Path)
parser.add_argument("--pairs", nargs="+", required=True, help="WEIGHT,SCALE")
args = parser.parse_args()
for run in args.runs:
    model, ckpt = load_model(find_checkpoint(run))
    config = ckpt.meta["config"]
    data = prepare(DataConfig(**config["data"]), progress=False)
    device = next(model.parameters()).device
    ctx = autocast(device, resolve_precision(config.get("precision", "auto"), device))
    for pair in args.pairs:
        model.config.pointer_weight, model.config.pointer_scale = map(float, pair.split(","))
        loss = split_loss(model, data.val, model.config.block_size, device, precision_ctx=ctx)
        split = config["data"].get("split_seed")
        print(f"{run} split_seed {split} weight,scale {pair}: {data.bits_per_byte(loss):.4f}", flush=True)
