"""Round 17's screen of a fused LM head: the default's head and loss (1,536 rows of d_model 128, 4,096 ids, bf16
matmuls, float32 softmax), forward and backward, compiled, as the model computes them (the logits whole, then
F.cross_entropy) or in chunks of rows that never hold all the logits (the loss's backward recomputes each chunk's
logits). The same loss and gradients to float rounding; alternating rounds in one process.

    python docs/recipe/round17/fused_head.py --chunks 128 256 512 --rounds 12
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
import torch.nn.functional as F

from training.runtime import device_name

ROWS, WIDTH, VOCAB = 1536, 128, 4096


class ChunkedHeadLoss(torch.autograd.Function):
    """Mean cross-entropy of h @ w.T against t (-1: ignored), `chunk` rows at a time."""

    @staticmethod
    def forward(ctx, h, w, t, chunk):
        keep = t != -1
        safe = torch.where(keep, t, 0)
        hb, wb = h.to(torch.bfloat16), w.to(torch.bfloat16)
        lse, picked = [], []
        for start in range(0, h.shape[0], chunk):
            logits = (hb[start : start + chunk] @ wb.t()).float()
            lse.append(torch.logsumexp(logits, -1))
            picked.append(logits.gather(1, safe[start : start + chunk, None]).squeeze(1))
        lse = torch.cat(lse)
        count = keep.sum().clamp(min=1)
        ctx.save_for_backward(hb, wb, lse, safe, keep, count)
        ctx.chunk, ctx.dtypes = chunk, (h.dtype, w.dtype)
        return ((lse - torch.cat(picked)) * keep).sum() / count

    @staticmethod
    def backward(ctx, grad):
        hb, wb, lse, safe, keep, count = ctx.saved_tensors
        scale = grad / count * keep
        ids = torch.arange(wb.shape[0])
        dh, dw = [], torch.zeros(wb.shape)
        for start in range(0, hb.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            probs = torch.exp((hb[rows] @ wb.t()).float() - lse[rows, None])
            dlogits = ((probs - (ids[None, :] == safe[rows, None]).float()) * scale[rows, None]).to(torch.bfloat16)
            dh.append(dlogits @ wb)
            dw += (dlogits.t() @ hb[rows]).float()
        return torch.cat(dh).to(ctx.dtypes[0]), dw.to(ctx.dtypes[1]), None, None


def whole(h, w, t):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = h @ w.t()
    loss = F.cross_entropy(logits.float(), t, ignore_index=-1)
    loss.backward()
    return loss.detach()


def chunked(chunk):
    def step(h, w, t):
        loss = ChunkedHeadLoss.apply(h, w, t, chunk)
        loss.backward()
        return loss.detach()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    torch.manual_seed(0)
    h = torch.randn(ROWS, WIDTH, requires_grad=True)
    w = (0.05 * torch.randn(VOCAB, WIDTH)).requires_grad_()
    t = torch.randint(0, VOCAB, (ROWS,))
    t[:7] = -1
    ways = {"whole": torch.compile(whole)} | {f"chunks of {c}": torch.compile(chunked(c)) for c in args.chunks}
    reference = None
    for name, step in ways.items():
        h.grad = w.grad = None
        loss = step(h, w, t).item()
        reference = reference or (loss, h.grad.clone(), w.grad.clone())
        apart = max((h.grad - reference[1]).abs().max().item(), (w.grad - reference[2]).abs().max().item())
        print(f"{name}: loss {loss:.6f}, gradients at most {apart:.1e} from whole's")
    times: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(args.rounds + 1):
        for name, step in ways.items():
            laps = []
            for _ in range(10):
                h.grad = w.grad = None
                start = time.perf_counter()
                step(h, w, t)
                laps.append(time.perf_counter() - start)
            if round_:
                times[name].append(1000 * statistics.median(laps))
    print(f"{device_name(torch.device('cpu'))}; torch {torch.__version__}")
    for name, ms in times.items():
        ratios = [m / base for m, base in zip(ms, times["whole"], strict=True)]
        print(
            f"{name}: {statistics.median(ms):.2f} ms, / whole {statistics.median(ratios):.3f} "
            f"(rounds {min(ratios):.3f}-{max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
