"""The attention and position variants every model-level guarantee is tested over.

Each is a set of GPTConfig overrides; a test parametrises over `VARIANTS` (or `variant_cases`) and
builds its model with them, so no-leak, cached-vs-uncached and explicit-vs-sdpa run on every one.
"""

import pytest

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
