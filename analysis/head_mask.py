"""Switching attention heads off (Michel et al. 2019, "Are Sixteen Heads Really Better than One?").

Each layer's heads are concatenated along the last dim of the input of its output projection W_O, so
a gate per (layer, head) multiplied into that input removes a head from the residual stream exactly as
zeroing its d_k columns of W_O would. The gates are a tensor: with requires_grad, d loss / d gate is
the paper's importance score. Hooks, not model code, so every backend and variant is covered as is:
gated attention, sinks, sliding windows, the soft cap and value embeddings all act on a head's output
before W_O reads it, so a zero there removes the head whatever they did (tests/unit/test_lab_variants.py
checks each against zeroed columns of W_O).
"""

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from model import GPT


def ones_gates(model: GPT) -> Tensor:
    """All heads on: (n_layer, n_head) ones on the model's device."""
    c = model.config
    return torch.ones(c.n_layer, c.n_head, device=model.tok_emb.weight.device)


def gates_without(model: GPT, heads: list[tuple[int, int]]) -> Tensor:
    """Gates with each (layer, head) in `heads` off and the rest on; bad indices raise ValueError."""
    gates = ones_gates(model)
    for layer, head in heads:
        if not (0 <= layer < gates.shape[0] and 0 <= head < gates.shape[1]):
            raise ValueError(
                f"head (layer {layer}, head {head}) does not exist; the model has "
                f"layers 0..{gates.shape[0] - 1} and heads 0..{gates.shape[1] - 1}"
            )
        gates[layer, head] = 0.0
    return gates


@contextlib.contextmanager
def head_gates(model: GPT, gates: Tensor) -> Iterator[Tensor]:
    """Within the block, head h of layer l's output is multiplied by gates[l, h] (0 = off)."""
    c = model.config
    if tuple(gates.shape) != (c.n_layer, c.n_head):
        raise ValueError(f"gates have shape {tuple(gates.shape)}; the model needs ({c.n_layer}, {c.n_head})")
    handles = []
    for layer, block in enumerate(model.blocks):

        def gate_input(module, args, layer=layer):
            (y,) = args  # (B, T, H * d_k), heads concatenated
            B, T, _ = y.shape
            g = gates[layer].to(device=y.device, dtype=y.dtype).view(1, 1, c.n_head, 1)
            return ((y.view(B, T, c.n_head, -1) * g).view(B, T, -1),)

        handles.append(block.attn.out_proj.register_forward_pre_hook(gate_input))
    try:
        yield gates
    finally:
        for handle in handles:
            handle.remove()
