"""Round 16's measurement (not a change): how much a count-based token n-gram, learned from the train split, adds to
a trained model when their next-token probabilities are mixed, p = lam p_model + (1 - lam) p_ngram.

The n-gram is interpolated absolute discounting (d = 0.75) up to `--order`, counted on the first of train.bin's BPE
segmentations (the text once), scored on every val token in the windows `bench_quality.py --score` uses; the model's
log-probabilities come from its best checkpoint, exactly as the score computes them.

    python docs/recipe/round16/ngram_mix.py RUN --order 4
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from analysis.trained import find_checkpoint, load_model
from data.config import DataConfig
from data.prepare import prepare
from training.runtime import autocast, resolve_precision

DISCOUNT = 0.75
HASH_BASE = np.uint64(1_000_003)


@torch.no_grad()
def model_log_probs(model, val: np.ndarray, ctx) -> np.ndarray:
    """log p(token t + 1) of every val token, in non-overlapping windows of block_size (training/evaluate.py)."""
    model.eval()
    ids = torch.from_numpy(val.astype(np.int64))
    n, window = len(ids) - 1, model.config.block_size
    out = np.zeros(n)
    for start in range(0, n, window):
        length = min(window, n - start)
        with ctx:
            logits, _ = model(ids[start : start + length][None])
        targets = ids[start + 1 : start + 1 + length]
        out[start : start + length] = torch.log_softmax(logits.float()[0], -1).gather(1, targets[:, None])[:, 0]
    return out


def ngram_hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """A hash of each run of n tokens, indexed by its first token."""
    h = np.zeros(len(tokens) - n + 1, dtype=np.uint64)
    for j in range(n):
        h = h * HASH_BASE + tokens[j : len(tokens) - n + 1 + j].astype(np.uint64) + np.uint64(1)
    return h


def counts_of(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    unique, counts = np.unique(keys, return_counts=True)
    at = np.searchsorted(unique, queries).clip(0, len(unique) - 1)
    return np.where(unique[at] == queries, counts[at], 0)


def ngram_probs(train: np.ndarray, val: np.ndarray, order: int, vocab: int) -> np.ndarray:
    """p(token t + 1 | up to order - 1 tokens before it) for every val token, lower orders interpolated in."""
    targets = val[1:]
    p = (np.bincount(train, minlength=vocab)[targets] + 1) / (len(train) + vocab)  # add-one unigram
    for n in range(2, order + 1):
        context_train, full_train = ngram_hashes(train[:-1], n - 1), ngram_hashes(train, n)
        context_val = np.zeros(len(targets), dtype=np.uint64)
        full_val = np.zeros(len(targets), dtype=np.uint64)
        context_val[n - 2 :], full_val[n - 2 :] = ngram_hashes(val[:-1], n - 1), ngram_hashes(val, n)
        seen = counts_of(context_train, context_val)
        first = np.unique(full_train, return_index=True)[1]
        followers = counts_of(context_train[first], context_val)  # distinct tokens seen after the context
        kept = np.maximum(counts_of(full_train, full_val) - DISCOUNT, 0)
        mixed = (kept + DISCOUNT * followers * p) / np.maximum(seen, 1)
        has_context = (np.arange(len(targets)) >= n - 2) & (seen > 0)
        p = np.where(has_context, mixed, p)
    return p


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run")
    parser.add_argument("--order", type=int, default=4)
    args = parser.parse_args()
    model, ckpt = load_model(find_checkpoint(Path(args.run)))
    config = ckpt.meta["config"]
    data = prepare(DataConfig(**config["data"]), progress=False)
    ctx = autocast(torch.device("cpu"), resolve_precision(config.get("precision", "auto"), torch.device("cpu")))
    val = np.asarray(data.val, dtype=np.int64)
    train = np.asarray(data.train, dtype=np.int64)
    last_eot = np.flatnonzero(train == data.meta["eot_id"])[data.meta["num_documents"]["train"] - 1]
    train = train[: last_eot + 1]  # the first segmentation: the train text once
    model_p = np.exp(model_log_probs(model, val, ctx))
    ngram_p = ngram_probs(train, val, args.order, model.config.vocab_size)

    def bpb(p: np.ndarray) -> float:
        return data.bits_per_byte(float(-np.log(p).mean()))

    print(f"model {bpb(model_p):.4f}  {args.order}-gram {bpb(ngram_p):.4f} bits/byte")
    for lam in (0.8, 0.85, 0.9, 0.95):
        print(f"lam {lam}: {bpb(lam * model_p + (1 - lam) * ngram_p):.4f}")


if __name__ == "__main__":
    main()
