"""Round 23: how often a sample repeats itself, the share of its 4-token n-grams already seen earlier in it, at
sample.py's temperature 0.8 and top_k 200, with the continuous cache at weights 0, 0.1, 0.2, against the same share in
stretches of held-out text of the same length.

    python docs/recipe/round23/repeats.py RUN
"""

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from analysis.trained import load_trained
from data.config import DataConfig
from data.prepare import prepare
from generation.generate import SamplingParams, encode_prompt, generate

N = 400  # tokens a sample


def repeat_share(tokens: list[int]) -> float:
    grams = [tuple(tokens[i : i + 4]) for i in range(len(tokens) - 3)]
    seen, repeated = set(), 0
    for gram in grams:
        repeated += gram in seen
        seen.add(gram)
    return repeated / len(grams)


trained = load_trained(sys.argv[1])
model, config = trained.model.eval(), trained.model.config
val = np.asarray(prepare(DataConfig(**trained.meta["config"]["data"]), progress=False).val)
real = [repeat_share(val[s : s + N].tolist()) for s in range(0, len(val) - N, len(val) // 20)]
print(f"held-out text, {len(real)} stretches of {N} tokens: {np.mean(real):.3f}")
idx = torch.tensor([encode_prompt(trained.tokenizer, "ROMEO:\n", config.vocab_size)])
for weight in (0.0, 0.1, 0.2):
    config.pointer_weight, config.pointer_scale = weight, 15.0
    shares = []
    for seed in range(1, 9):
        params = SamplingParams(N, temperature=0.8, top_k=200, seed=seed, pointer=True)
        shares.append(repeat_share(generate(model, idx, params)[0, idx.shape[1] :].tolist()))
    spread = f"{min(shares):.3f}-{max(shares):.3f}"
    print(f"pointer_weight {weight}: samples' repeated 4-grams {np.mean(shares):.3f} (8 seeds: {spread})", flush=True)
