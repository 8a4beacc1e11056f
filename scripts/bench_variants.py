"""Benchmark the attention/position variants side by side: training tokens/s, KV-cache bytes per
token, cached decoding tokens/s.

    python -m scripts.bench_variants                       # the default model shape (small.yaml)
    python -m scripts.bench_variants --d-model 128 --block-size 128 --batch-size 16

Every variant is the same shape (4 layers, 4 heads) with random weights. A training step is forward
+ backward + AdamW under the precision train.py would pick (bf16 on CPUs that have it), on random
tokens. The variants take turns (round robin, `--rounds` times), so a load spike on a shared machine
hits them alike; each figure is a median. KV bytes/token = 2 (K and V) x n_layer x n_kv_head x d_k
x the cache's element size (the weights' dtype: fp32 here, as scripts/sample.py loads checkpoints).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from model import GPT, GPTConfig
from training.device import autocast, resolve_device, resolve_precision

VARIANTS = {  # name -> GPTConfig overrides (the README table's rows)
    "learned (GPT-2)": {},
    "sinusoidal": {"pos_encoding": "sinusoidal"},
    "rope": {"pos_encoding": "rope"},
    "gqa (n_kv_head 2)": {"n_kv_head": 2},
    "mqa (n_kv_head 1)": {"n_kv_head": 1},
    "qk_norm": {"qk_norm": True},
    "rope + gqa 2 + qk_norm": {"pos_encoding": "rope", "n_kv_head": 2, "qk_norm": True},
}
VOCAB = 85  # Shakespeare's characters + EOT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5, help="round-robin rounds of --steps training steps")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--decode-tokens", type=int, default=100)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device("auto")
    precision = resolve_precision("auto", device)

    models, optimizers = {}, {}
    for name, overrides in VARIANTS.items():
        torch.manual_seed(0)
        cfg = GPTConfig(vocab_size=VOCAB, block_size=args.block_size, d_model=args.d_model, **overrides)
        models[name] = GPT(cfg).to(device)
        optimizers[name] = torch.optim.AdamW(models[name].parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (args.batch_size, args.block_size), generator=g).to(device)
    y = torch.randint(0, VOCAB, (args.batch_size, args.block_size), generator=g).to(device)

    def train_steps(name: str) -> float:
        model, opt = models[name], optimizers[name]
        model.train()
        start = time.perf_counter()
        for _ in range(args.steps):
            with autocast(device, precision):
                _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / args.steps

    prompt = x[:1, :16]

    def decode(name: str) -> float:
        model = models[name].eval()
        start = time.perf_counter()
        model.generate(prompt, args.decode_tokens, temperature=0)
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
    print(
        f"d_model {args.d_model}, 4 layers, 4 heads, block_size {args.block_size}, batch {args.batch_size}, "
        f"{device} {precision}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    columns = ("params", "train tok/s", "vs GPT-2", "KV B/token", "decode tok/s")
    header = f"{'variant':<24} | " + " | ".join(f"{c:>{max(len(c), 8)}}" for c in columns)
    print(header + "\n" + "-" * len(header))
    for name, model in models.items():
        step = statistics.median(step_s[name])
        kv_bytes = model.new_cache(1, 1).nbytes  # one slot of one row: the bytes of one token
        decode_tok_s = args.decode_tokens / statistics.median(decode_s[name])
        print(
            f"{name:<24} | {model.num_params() / 1e6:>7.2f}M | {tokens / step:>11.0f} | {base / step:>7.2f}x "
            f"| {kv_bytes:>10} | {decode_tok_s:>12.0f}"
        )


if __name__ == "__main__":
    main()
