"""The continuous cache (Grave et al. 2017, "Improving Neural Language Models with a Continuous Cache"):
at prediction time the model also points back into its own context.

Each earlier position j of the context is a key, the model's final hidden state there (what the head
reads, unit-normed), and holds the token that came next, x[j + 1]. A query position i attends over the
keys j < i with weights softmax(scale * cos(h_i, h_j)), and the pointer's distribution puts each weight
on its key's next token. The prediction is the mixture

    p(x[i + 1]) = (1 - weight) * softmax(logits_i) + weight * pointer_i

(only the model where i has no earlier key). A name or a phrase the text used a thousand tokens ago comes
back although no layer looks that far: the layers are windowed to 64-128 keys and the pointer has no
parameters, so it meets no distance it was not trained on; it reads states the model already computed.

It has no parameters and acts only in eval mode: training's 128-token sequences would give it little to
point at. `weight` and `scale` are set, not learned (docs/evidence/recipe/round23.md).
"""

import torch
import torch.nn.functional as F
from torch import Tensor


def pointer_states(hidden: Tensor) -> Tensor:
    """The keys and queries: each position's final hidden state (B, T, d), unit-normed in float32."""
    return F.normalize(hidden.float(), dim=-1)


def mix_pointer(
    logits: Tensor,
    states: Tensor,
    tokens: Tensor,
    weight: float,
    scale: float,
    real: Tensor | None = None,
) -> Tensor:
    """Log-probabilities (B, T, vocab) of the model's softmax mixed with the pointer's distribution.

    logits: (B, T, vocab) for the last T of the S positions in `states` (B, S, d) and `tokens` (B, S), the
    whole context so far (S = T without a KV cache). real: (B, S) True for real tokens, None: all real.
    Query t sits at position S - T + t and sees the keys j < S - T + t, each holding tokens[j + 1].
    """
    with torch.autocast(logits.device.type, enabled=False):  # float32 throughout: a bf16 cosine is 3 digits
        return _mix(logits, states, tokens, weight, scale, real)


def _mix(logits: Tensor, states: Tensor, tokens: Tensor, weight: float, scale: float, real: Tensor | None) -> Tensor:
    B, T, _ = logits.shape
    S = states.shape[1]
    queries, keys, nexts = states[:, S - T :], states[:, :-1], tokens[:, 1:]  # key j holds the token after it
    visible = torch.arange(S - 1, device=logits.device)[None] < torch.arange(S - T, S, device=logits.device)[:, None]
    visible = visible[None].expand(B, T, S - 1)  # (B, T, S - 1): j < query's position
    if real is not None:  # padding is on the left, so a real key's next token is real too
        visible = visible & real[:, None, :-1]
    scores = (scale * queries @ keys.transpose(1, 2)).masked_fill(~visible, float("-inf"))
    has_keys = visible.any(-1, keepdim=True)  # (B, T, 1): the first real position has none
    attention = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row of only -inf gives NaN: no pointer
    pointer = torch.zeros(B, T, logits.shape[-1], device=logits.device, dtype=torch.float32)
    pointer.scatter_add_(-1, nexts[:, None, :].expand(B, T, S - 1), attention)
    share = weight * has_keys.float()
    probs = (1 - share) * torch.softmax(logits.float(), dim=-1) + share * pointer
    return probs.clamp_min(torch.finfo(probs.dtype).tiny).log()
