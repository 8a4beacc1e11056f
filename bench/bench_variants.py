"""Benchmark the attention/position variants side by side: training tokens/s, KV-cache bytes per
token, cached decoding tokens/s.

    python -m bench.bench_variants                       # d_model 256, block_size 256, batch 8
    python -m bench.bench_variants --d-model 128 --block-size 128 --batch-size 16

Every variant starts from GPTConfig's own defaults (4 layers, 4 heads, learned positions, a tied LM head),
not the default run's model (configs/model/small.yaml), and has random weights; --d-model and --block-size
set its width and context, and the first line printed gives the shape. A training step is the trainer's own
step (Trainer.step: forward, backward, clipping, guard, optimizer) with TrainConfig's defaults (AdamW, eager:
no torch.compile) under the precision train.py would pick (bf16 on CPUs that have it), on TrainConfig's data:
Shakespeare's complete works in characters, not the default run's BPE.
The variants take turns (round robin, `--rounds` times), so a load spike on a shared machine
hits them alike; each figure is a median. KV bytes/token (model.kv_cache.kv_bytes_per_token) =
2 (K and V) x n_layer x n_kv_head x d_k, or for MLA n_layer x (latent + rope key), x the cache's element
size (the weights' dtype: fp32 here, as scripts/sample.py loads checkpoints).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import training.threads  # noqa: F401  # isort: skip  (before torch: OpenMP reads its wait policy once)
import torch

from cli.schema_help import OneLineParser, at_least
from data.prepare import prepare
from generation.generate import SamplingParams, generate
from model import GPTConfig
from model.kv_cache import kv_bytes_per_token
from training.config import TrainConfig
from training.runtime import device_name, resolve_device
from training.trainer import Trainer

VARIANTS = {  # name -> GPTConfig overrides (the README table's rows)
    "learned (GPT-2)": {},
    "sinusoidal": {"pos_encoding": "sinusoidal"},
    "rope": {"pos_encoding": "rope"},
    "gqa (n_kv_head 2)": {"n_kv_head": 2},
    "mqa (n_kv_head 1)": {"n_kv_head": 1},
    "qk_norm": {"qk_norm": True},
    "rope + gqa 2 + qk_norm": {"pos_encoding": "rope", "n_kv_head": 2, "qk_norm": True},
    "gated attention (headwise)": {"attn_gate": "headwise"},
    "gated attention (elementwise)": {"attn_gate": "elementwise"},
    "attention soft-cap 30": {"attn_softcap": 30.0},
    "attention sinks": {"attn_sinks": True},
    "sliding window SSSL": {"window_pattern": "SSSL", "window_size": 64},
    "value embeddings": {"value_embeds": True},
    "differential attention": {"attn_diff": True},
    "MLA (latent 64)": {"mla_latent": 64},
    "MLA (latent 64) + rope": {"mla_latent": 64, "pos_encoding": "rope"},
}


def main() -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=at_least(1), default=256)
    parser.add_argument("--block-size", type=at_least(1), default=256)
    parser.add_argument("--batch-size", type=at_least(1), default=8)
    parser.add_argument("--rounds", type=at_least(1), default=5, help="round-robin rounds of --steps training steps")
    parser.add_argument("--steps", type=at_least(1), default=3)
    parser.add_argument("--decode-tokens", type=at_least(1), default=100)
    parser.add_argument("--threads", type=at_least(0), default=0, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    configs = {}
    for name, overrides in VARIANTS.items():  # every variant checked before any is built (--d-model 30: a traceback)
        cfg = TrainConfig(out_dir="unused", batch_size=args.batch_size, seed=0)
        cfg.model = GPTConfig(block_size=args.block_size, d_model=args.d_model, **overrides)
        try:
            cfg.validate()
        except ValueError as e:
            parser.error(f"variant {name}: {e}")
        configs[name] = cfg
    trainers = {}
    for name, cfg in configs.items():
        data = prepare(cfg.data, progress=False)
        trainers[name] = Trainer(cfg, data, resolve_device(cfg.device))
    any_trainer = next(iter(trainers.values()))
    device, precision = any_trainer.device, any_trainer.precision
    models = {name: t.model for name, t in trainers.items()}

    def train_steps(name: str) -> float:
        """Seconds per step of the trainer's own step (Trainer.step, as `python train.py` runs it)."""
        trainer = trainers[name]
        trainer.model.train()
        start = time.perf_counter()
        for _ in range(args.steps):
            trainer.advance(1.0)
        return (time.perf_counter() - start) / args.steps

    prompt = torch.from_numpy(data.val[:16].astype("int64"))[None].to(device)

    def decode(name: str) -> float:
        model = models[name].eval()
        start = time.perf_counter()
        generate(model, prompt, SamplingParams(args.decode_tokens, temperature=0, top_k=None, seed=None))
        return time.perf_counter() - start

    for name in VARIANTS:  # warm-up
        train_steps(name)
        decode(name)
    step_s: dict[str, list[float]] = {name: [] for name in VARIANTS}
    decode_s: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name in VARIANTS:
            step_s[name].append(train_steps(name))
            decode_s[name].append(decode(name))

    tokens = args.batch_size * args.block_size
    base = statistics.median(step_s["learned (GPT-2)"])
    shape = models["learned (GPT-2)"].config  # every variant's shape: its overrides leave these alone
    print(
        f"d_model {shape.d_model}, {shape.n_layer} layers, {shape.n_head} heads, block_size {shape.block_size}, "
        f"batch {args.batch_size}, "
        f"{device} ({device_name(device)}) {precision}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    columns = ("params", "train tok/s", "vs GPT-2", "KV B/token", "decode tok/s")
    width = max(len(name) for name in ["variant", *models])  # a long name once pushed its row out of line
    # params in full: a variant's few added scalars (a per-head temperature: +16) vanished in "0.05M"
    header = f"{'variant':<{width}} | " + " | ".join(f"{c:>{max(len(c), 9)}}" for c in columns)
    print(header + "\n" + "-" * len(header))
    for name, model in models.items():
        step = statistics.median(step_s[name])
        kv_bytes = kv_bytes_per_token(model.config, next(model.parameters()).dtype)
        decode_tok_s = args.decode_tokens / statistics.median(decode_s[name])
        print(
            f"{name:<{width}} | {model.num_params():>9,} | {tokens / step:>11.0f} | {base / step:>8.2f}x "
            f"| {kv_bytes:>10} | {decode_tok_s:>12.0f}"
        )


if __name__ == "__main__":
    main()
