"""Causal attention that keeps its probabilities, block by block, with a backward written by hand.

It computes the same softmax(QK^T / sqrt(d_k) + mask) V as the explicit path, for the case where
that is the fastest way: a CPU and short sequences. There PyTorch's fused (flash) kernel runs its
small tiles far below the matmul peak (in bf16 no faster than in fp32), while a few large batched
matmuls run at it, and the probabilities cost little memory at these lengths.

Queries go in blocks of QUERY_BLOCK; a block only multiplies the keys up to its last query's
position, so the work above the causal diagonal is mostly skipped (about 5/8 of the full product
at T = 256). Autograd through the explicit path would store the scores, the masked and the scaled
scores and pass over each again; by hand, the backward needs only the saved probabilities P.
With O = P V and P = softmax(S):
    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - rowsum(dP * P)),
    dQ = dS K / sqrt(d_k),   dK = dS^T Q / sqrt(d_k).
Masked entries have P = 0, so their dS is 0 without another pass over the mask.
"""

import torch
from torch import Tensor

QUERY_BLOCK = 64  # smaller blocks skip more of the upper triangle but run the matmuls less efficiently


def _query_blocks(query_length: int, key_length: int) -> list[tuple[int, int, int]]:
    """(start, stop, keys): queries start..stop-1 (the last of key_length positions) see keys < `keys`."""
    offset = key_length - query_length
    blocks = []
    for start in range(0, query_length, QUERY_BLOCK):
        stop = min(start + QUERY_BLOCK, query_length)
        blocks.append((start, stop, offset + stop))
    return blocks


class _CausalMaterializedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query: Tensor, key: Tensor, value: Tensor, hidden: Tensor) -> Tensor:
        Tq = query.shape[-2]
        # Work in the inputs' dtype: under autocast, softmax would otherwise come back in float32.
        with torch.autocast(query.device.type, enabled=False):
            scaled_query = query * query.shape[-1] ** -0.5  # scale the (T, D) side, not the (T, T) one
            # Heads split off a fused projection are strided views; the batched matmuls would copy
            # them once per block.
            key, value = key.contiguous(), value.contiguous()
            probs, outs = [], []
            for start, stop, keys in _query_blocks(Tq, key.shape[-2]):
                scores = scaled_query[:, :, start:stop] @ key[:, :, :keys].transpose(-2, -1)  # (B, H, block, keys)
                scores.masked_fill_(hidden[..., start:stop, :keys], float("-inf"))  # mask before softmax
                probs.append(scores.softmax(dim=-1))
                outs.append(probs[-1] @ value[:, :, :keys])
        ctx.save_for_backward(scaled_query, key, value, *probs)
        return torch.cat(outs, dim=-2)

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        scaled_query, key, value, *probs = ctx.saved_tensors
        grad_out = grad_out.to(value.dtype).contiguous()
        blocks = _query_blocks(scaled_query.shape[-2], key.shape[-2])
        # Key and value gradients sum over the query blocks, in float32 at least. The last block
        # sees every key, so going backwards its share starts the sums: no zero fill, no sum at all
        # for a single block.
        accumulate = key.dtype if len(blocks) == 1 else torch.promote_types(key.dtype, torch.float32)
        grad_queries, grad_key, grad_value = [], None, None
        for (start, stop, keys), p in zip(reversed(blocks), reversed(probs), strict=True):
            grad_block = grad_out[:, :, start:stop]
            value_share = p.transpose(-2, -1) @ grad_block
            grad_probs = grad_block @ value[:, :, :keys].transpose(-2, -1)
            grad_scores = torch._softmax_backward_data(grad_probs, p, -1, p.dtype)  # P * (dP - rowsum(dP P))
            grad_queries.append(grad_scores @ key[:, :, :keys])
            key_share = grad_scores.transpose(-2, -1) @ scaled_query[:, :, start:stop]
            if grad_key is None:
                grad_key, grad_value = key_share.to(accumulate), value_share.to(accumulate)
            else:
                grad_key[:, :, :keys] += key_share
                grad_value[:, :, :keys] += value_share
        grad_query = torch.cat(grad_queries[::-1], dim=-2).mul_(key.shape[-1] ** -0.5)
        return grad_query, grad_key.to(key.dtype), grad_value.to(value.dtype), None


def causal_materialized_attention(
    query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None = None
) -> Tensor:
    """Causal softmax(QK^T / sqrt(d_k) + mask) V; query (B, H, Tq, D), key/value (B, H, Tk, D), one dtype.

    The queries are the last Tq of Tk positions (lower-right alignment, as for cached decoding), and
    none sees a key after its own position. `attention_mask` (boolean, True = visible, broadcastable
    to (B, H, Tq, Tk)) can narrow that further, e.g. to hide padding, but every row must keep at
    least one visible key (`model.attention.open_blind_rows`). No dropout: callers that need it
    take another path.
    """
    if not query.dtype == key.dtype == value.dtype:
        raise ValueError(f"query, key and value dtypes differ: {query.dtype}, {key.dtype}, {value.dtype}")
    Tq, Tk = query.shape[-2], key.shape[-2]
    if Tk < Tq:
        raise ValueError(f"causal attention needs at least as many keys as queries, got {Tk} keys for {Tq}")
    visible = torch.ones(Tq, Tk, dtype=torch.bool, device=query.device).tril(diagonal=Tk - Tq)
    if attention_mask is not None:
        visible = visible & attention_mask
    return _CausalMaterializedAttention.apply(query, key, value, ~visible)
