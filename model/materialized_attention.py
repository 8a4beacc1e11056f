"""Causal attention that keeps its probabilities, block by block, with a backward written by hand.

It computes the same softmax(QK^T / sqrt(d_k) + mask) V as the explicit path, for the case where
that is the fastest way: a CPU and short sequences. There PyTorch's fused (flash) kernel runs its
small tiles far below the matmul peak (in bf16 no faster than in fp32), while a few large batched
matmuls run at it, and the probabilities cost little memory at these lengths.

Queries go in blocks of QUERY_BLOCK; a block only multiplies the keys up to its last query's
position, so the work above the causal diagonal is mostly skipped (about 5/8 of the full product
is done at T = 512; up to T = 128 one block does all of it), and under a sliding window only the keys
from its first query's window on: a windowed layer's work grows with T, not T^2. Autograd through the
explicit path would store the scores, the masked and the scaled scores and pass over each again; by hand,
the backward needs only the saved probabilities P.
With O = P V and P = softmax(S):
    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - rowsum(dP * P)),
    dQ = dS K / sqrt(d_k),   dK = dS^T Q / sqrt(d_k).
Masked entries have P = 0, so their dS is 0 without another pass over the mask. Two variants of
the scores: a soft cap S = c tanh(S' / c) (Gemma 2) multiplies dS by 1 - tanh^2 (the tanh is
saved); a sink logit s per head (gpt-oss) joins the softmax with no value behind it, so dP_sink = 0,
dS keeps its form and ds = -sum P_sink * rowsum(dP * P) (P_sink is saved).
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from model.causal_mask import build_aligned_causal_mask

# Smaller blocks skip more of the upper triangle but run the matmuls less efficiently, and each block is more
# code to compile: at 128 and at 512 tokens, blocks of 128 step as fast as blocks of 64 and the default compiles
# in ~5 s less from an empty cache (docs/evidence/recipe/round12.md).
QUERY_BLOCK = 128


def softmax_with_sink(scores: Tensor, sinks: Tensor) -> Tensor:
    """softmax over the keys and one more logit per head, the sink: (B, H, Tq, Tk) -> (B, H, Tq, Tk + 1).

    No value stands behind the sink (the last column), so callers drop its share: the rows of the
    weights then sum to 1 - P_sink, and a head that finds nothing worth reading can put its weight
    there (attention sinks as gpt-oss learns them, one logit per head).
    """
    sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.cat([scores, sink], dim=-1).softmax(dim=-1)


def _query_blocks(query_length: int, key_length: int, window: int | None = None) -> list[tuple[int, int, int, int]]:
    """(start, stop, first, last): queries start..stop-1 (the last of key_length positions) see keys first..last-1
    at most; `window` (keys a query sees, its own included) moves `first` up to the block's first query's window."""
    offset = key_length - query_length
    blocks = []
    for start in range(0, query_length, QUERY_BLOCK):
        stop = min(start + QUERY_BLOCK, query_length)
        first = max(0, offset + start - window + 1) if window is not None else 0
        blocks.append((start, stop, first, offset + stop))
    return blocks


class _CausalMaterializedAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        hidden: Tensor,
        softcap: float | None,
        sinks: Tensor | None,
        window: int | None,
    ) -> Tensor:
        Tq = query.shape[-2]
        # Work in the inputs' dtype: under autocast, softmax would otherwise come back in float32.
        with torch.autocast(query.device.type, enabled=False):
            scaled_query = query * query.shape[-1] ** -0.5  # scale the (T, D) side, not the (T, T) one
            # Heads split off a fused projection are strided views; the batched matmuls would copy
            # them once per block.
            key, value = key.contiguous(), value.contiguous()
            probs, tanhs, sink_probs, outs = [], [], [], []
            for start, stop, first, last in _query_blocks(Tq, key.shape[-2], window):
                keys = slice(first, last)
                scores = scaled_query[:, :, start:stop] @ key[:, :, keys].transpose(-2, -1)  # (B, H, block, keys)
                if softcap is not None:  # S = c tanh(S / c); the backward needs the tanh
                    tanhs.append(torch.tanh(scores / softcap))
                    scores = softcap * tanhs[-1]
                scores.masked_fill_(hidden[..., start:stop, keys], float("-inf"))  # mask before softmax
                if sinks is None:
                    probs.append(scores.softmax(dim=-1))
                else:  # the sink's share of each row is kept for its gradient
                    with_sink = softmax_with_sink(scores, sinks)
                    probs.append(with_sink[..., :-1].contiguous())
                    sink_probs.append(with_sink[..., -1:].contiguous())
                outs.append(probs[-1] @ value[:, :, keys])
        ctx.blocks, ctx.softcap, ctx.sinks, ctx.window = len(probs), softcap is not None, sinks is not None, window
        ctx.save_for_backward(scaled_query, key, value, *probs, *tanhs, *sink_probs)
        return torch.cat(outs, dim=-2)

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None, Tensor | None, None]:
        scaled_query, key, value, *saved = ctx.saved_tensors
        n, none = ctx.blocks, [None] * ctx.blocks
        probs, saved = saved[:n], saved[n:]
        tanhs, saved = (saved[:n], saved[n:]) if ctx.softcap else (none, saved)
        sink_probs = saved if ctx.sinks else none
        grad_out = grad_out.to(value.dtype).contiguous()
        blocks = _query_blocks(scaled_query.shape[-2], key.shape[-2], ctx.window)
        # Key and value gradients sum over the query blocks, in float32 at least, each block's share padded with
        # zeros to every key and added out of place, not `grad_key[..., first:last] += ...`: inductor fuses an
        # in-place slice add into a select that reads the sum so far twice, so the fused kernel's work doubled
        # with every block (context 256, 4 blocks: 1.8x the step). A single block is the sum, in the inputs' dtype.
        accumulate = key.dtype if len(blocks) == 1 else torch.promote_types(key.dtype, torch.float32)
        grad_queries, grad_key, grad_value, grad_sinks = [], None, None, 0.0
        steps = zip(reversed(blocks), reversed(probs), reversed(tanhs), reversed(sink_probs), strict=True)
        for (start, stop, first, last), p, t, sink_p in steps:
            keys = slice(first, last)
            grad_block = grad_out[:, :, start:stop]
            value_share = p.transpose(-2, -1) @ grad_block
            grad_probs = grad_block @ value[:, :, keys].transpose(-2, -1)
            grad_scores = torch._softmax_backward_data(grad_probs, p, -1, p.dtype)  # P * (dP - rowsum(dP P))
            if sink_p is not None:  # the sink has no value, so its dP is 0: d sink = P_sink * (0 - rowsum(dP P))
                rowsum = (grad_probs * p).sum(-1, keepdim=True, dtype=torch.promote_types(p.dtype, torch.float32))
                grad_sinks = grad_sinks - (sink_p * rowsum).sum((0, 2, 3))
            if t is not None:  # through the soft cap: d(c tanh(s / c))/ds = 1 - tanh^2
                grad_scores = grad_scores * (1 - t.square())
            grad_queries.append(grad_scores @ key[:, :, keys])
            key_share = grad_scores.transpose(-2, -1) @ scaled_query[:, :, start:stop]
            pad = (0, 0, first, key.shape[-2] - last)
            if any(pad):
                key_share, value_share = F.pad(key_share, pad), F.pad(value_share, pad)
            if grad_key is None:
                grad_key, grad_value = key_share.to(accumulate), value_share.to(accumulate)
            else:
                grad_key, grad_value = grad_key + key_share, grad_value + value_share
        grad_query = torch.cat(grad_queries[::-1], dim=-2).mul_(key.shape[-1] ** -0.5)
        grad_sinks = grad_sinks.to(key.dtype) if ctx.sinks else None
        return grad_query, grad_key.to(key.dtype), grad_value.to(value.dtype), None, None, grad_sinks, None


def causal_materialized_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    window: int | None = None,
) -> Tensor:
    """Causal softmax(QK^T / sqrt(d_k) + mask) V; query (B, H, Tq, D), key/value (B, H, Tk, D), one dtype.

    The queries are the last Tq of Tk positions (lower-right alignment, as for cached decoding), and
    none sees a key after its own position. `attention_mask` (boolean, True = visible, broadcastable
    to (B, H, Tq, Tk)) can narrow that further, e.g. to hide padding or keep a sliding window, but
    every row must keep at least one visible key (`model.attention.open_blind_rows`). `softcap` c
    replaces the scores S by c tanh(S / c) before the mask (Gemma 2); `sinks` (H,) adds one logit per
    head to every softmax's denominator (`softmax_with_sink`). `window` w: each query sees only the last
    w keys up to its own (a sliding window), and the blocks skip the keys before them. No dropout:
    callers that need it take another path.
    """
    if not query.dtype == key.dtype == value.dtype:
        raise ValueError(f"query, key and value dtypes differ: {query.dtype}, {key.dtype}, {value.dtype}")
    Tq, Tk = query.shape[-2], key.shape[-2]
    if Tk < Tq:
        raise ValueError(f"causal attention needs at least as many keys as queries, got {Tk} keys for {Tq}")
    if window is not None and window < 1:
        raise ValueError(f"window={window} is invalid; a query sees at least its own key (window >= 1)")
    visible = build_aligned_causal_mask(Tq, Tk, query.device, window)
    if attention_mask is not None:
        visible = visible & attention_mask
    sinks = sinks.to(query.dtype) if sinks is not None else None
    return _CausalMaterializedAttention.apply(query, key, value, ~visible, softcap, sinks, window)
