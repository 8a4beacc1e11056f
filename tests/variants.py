"""The attention and position variants every model-level guarantee is tested over.

Each is a set of GPTConfig overrides; a test parametrises over `VARIANTS` (or `variant_cases`) and
builds its model with them, so no-leak, cached-vs-uncached and explicit-vs-sdpa run on every one.
"""

import pytest
import torch

from model import GPT, GPTConfig

VARIANTS: dict[str, dict] = {
    "learned": {},  # GPT-2
    "sinusoidal": {"pos_encoding": "sinusoidal"},
    "rope": {"pos_encoding": "rope"},
    "gqa": {"n_kv_head": 2},
    "mqa": {"n_kv_head": 1},
    "qk_norm": {"qk_norm": True},
    "rope_gqa_qk_norm": {"pos_encoding": "rope", "n_kv_head": 2, "qk_norm": True},  # Llama/Qwen-like
}

# The head shape the non-default variants run at: 6 heads (groups of 3 with n_kv_head 2), d_k 10,
# which is even (RoPE) and != d_model 48 / n_head, so the independent-d_k paths are covered too.
VARIANT_HEADS = (6, 10)


def variant_cases(head_grid: list[tuple[int, int | None]]) -> list:
    """pytest params (variant, n_head, d_k): GPT-2 over the whole head grid, the others at VARIANT_HEADS."""
    cases = [pytest.param("learned", n_head, d_k, id=f"learned-{n_head}-{d_k}") for n_head, d_k in head_grid]
    cases += [pytest.param(name, *VARIANT_HEADS, id=name) for name in VARIANTS if name != "learned"]
    return cases


def variant_model(backend: str, n_head: int, d_k: int | None, variant: str, vocab_size: int, block_size: int) -> GPT:
    """The tests' small GPT (2 layers, d_model 48) of one variant, seeded, in eval mode."""
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=vocab_size,
        block_size=block_size,
        n_layer=2,
        n_head=n_head,
        d_model=48,
        d_k=d_k,
        attn_backend=backend,
        **VARIANTS[variant],
    )
    return GPT(cfg).eval()
