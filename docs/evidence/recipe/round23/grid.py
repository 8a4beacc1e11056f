"""Round 23's screen: the continuous cache computed outside the model on one run's full-val windows, over a grid of
(scale, weight) and of gaps (keys at least `gap` tokens back; 1: every earlier position).

    python docs/recipe/round23/grid.py RUN 1,16,64,128
"""

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from analysis.trained import find_checkpoint, load_model
from data.config import DataConfig
from data.prepare import prepare
from training.runtime import autocast, resolve_precision

GRID = [(15, 0.15), (15, 0.2), (15, 0.25), (20, 0.2), (10, 0.2)]  # (scale, weight)

run, gaps = Path(sys.argv[1]), [int(g) for g in sys.argv[2].split(",")]
model, ckpt = load_model(find_checkpoint(run))
config = ckpt.meta["config"]
data = prepare(DataConfig(**config["data"]), progress=False)
ctx = autocast(torch.device("cpu"), resolve_precision(config.get("precision", "auto"), torch.device("cpu")))
model.eval()
states = {}
model.ln_f.register_forward_hook(lambda module, args, out: states.__setitem__("h", out.float()))
ids = torch.from_numpy(np.asarray(data.val, dtype=np.int64))
n, window = len(ids) - 1, model.config.block_size
nats = {(g, s, w): 0.0 for g in gaps for s, w in GRID}
with torch.no_grad():
    for start in range(0, n, window):
        length = min(window, n - start)
        x, y = ids[start : start + length][None], ids[start + 1 : start + 1 + length]
        with ctx:
            logits, _ = model(x)  # an old checkpoint: no pointer of its own
        p_model = torch.softmax(logits[0].float(), -1).gather(1, y[:, None])[:, 0].double()
        h = torch.nn.functional.normalize(states["h"][0], dim=-1)
        cosine, same = h @ h.T, y[:, None] == y[None, :]  # key j holds y[j], the token after position j
        for g in gaps:
            visible = torch.ones(length, length, dtype=torch.bool).tril(-g)
            has = visible.any(1)
            for s, w in GRID:
                attention = torch.softmax((s * cosine).masked_fill(~visible, -1e9), -1) * has[:, None]
                p_pointer = (attention * (same & visible)).sum(1).double()
                share = w * has.double()
                nats[(g, s, w)] += -((1 - share) * p_model + share * p_pointer).log().sum().item()
for g in gaps:
    cells = " ".join(f"s{s}w{w}:{data.bits_per_byte(nats[(g, s, w)] / n):.4f}" for s, w in GRID)
    print(run.name, "gap", g, cells, flush=True)
