"""The attention and position variants every model-level guarantee is tested over.

Each is a set of GPTConfig overrides; a test parametrises over `VARIANTS` (or `variant_cases`) and
builds its model with them, so no-leak, cached-vs-uncached and explicit-vs-sdpa run on every one.
A backend that cannot compute a variant refuses it (GPTConfig.validate); `variant_cases` and
`backend_variants` derive from that refusal which pairs to run, and tests/unit/test_variants.py
checks that each refusal names the backends that can.
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
    "gate_headwise": {"attn_gate": "headwise"},
    "gate_elementwise": {"attn_gate": "elementwise"},
    "softcap": {"attn_softcap": 2.0},  # low, so that the cap binds at the tests' scores
    "sinks": {"attn_sinks": True},
    "window": {"window_pattern": "SL", "window_size": 4},  # layer 0 sees 4 keys, layer 1 all of them
    "window_long": {"window_pattern": "SL", "window_size": 4, "long_window_size": 6},  # and layer 1 sees 6: every layer
    "value_embeds": {"value_embeds": True, "n_kv_head": 2},
    "diff": {"attn_diff": True},
    "diff_rope_gqa_qk_norm": {"attn_diff": True, "pos_encoding": "rope", "n_kv_head": 2, "qk_norm": True},
    "mla_window": {"mla_latent": 16, "window_pattern": "SL", "window_size": 4},  # a latent cache, windowed in layer 0
    "mla_rope_gqa_qk_norm": {"mla_latent": 16, "pos_encoding": "rope", "n_kv_head": 2, "qk_norm": True},
    "x0_mix": {"x0_mix": True, "pos_encoding": "rope"},  # per-layer scalars of the residual stream and the embeddings
    "bigram": {"bigram_embeds": 13, "pos_encoding": "rope"},  # hashed (previous, current) pairs, 13 rows: collisions
    # The continuous cache (model/pointer.py), weighted and sharp enough that a leak or a wrong key would show.
    "pointer": {"pointer_weight": 0.3, "pointer_scale": 4.0, "pos_encoding": "rope"},
    # The default run's model (configs/model/small.yaml) at the tests' scale: every layer windowed, as it trains.
    "default_run": {
        **{"pos_encoding": "rope", "qk_norm": True, "attn_gate": "elementwise", "tie_embeddings": False},
        **{"x0_mix": True, "window_pattern": "SL", "window_size": 4, "long_window_size": 6, "bigram_embeds": 13},
        **{"pointer_weight": 0.3, "pointer_scale": 4.0},
    },
}
# Where "default_run" differs from configs/model/small.yaml: the sizes, scaled to the tests' 2 layers and short inputs.
DEFAULT_RUN_SCALED = ("window_pattern", "window_size", "long_window_size", "bigram_embeds", "pointer_weight")
DEFAULT_RUN_SCALED += ("pointer_scale",)
# GPTConfig fields in no entry above: the shape (the tests' head grids run over it), what acts on each position alone
# (so cannot carry a token from one position to another) or only in training, and the backend the tests choose.
NOT_VARIANTS = {
    *("vocab_size", "block_size", "train_block_size", "n_layer", "n_head", "d_model", "d_k", "d_ff", "attn_backend"),
    *("dropout", "attn_dropout"),  # training only
    *("bias", "activation", "norm", "zero_init_proj", "logit_softcap", "rope_base"),  # per position, or a constant
}

BACKENDS = ("explicit", "sdpa", "materialized")

# The head shape the non-default variants run at: 6 heads (groups of 3 with n_kv_head 2), d_k 12,
# a multiple of 4 (RoPE rotates pairs of each half of a differential head, and MLA's d_k / 2 rope key)
# and != d_model 48 / n_head, so the independent-d_k paths are covered too.
VARIANT_HEADS = (6, 12)
PERTURBATION = 0.1  # std of the noise variant_model adds to every parameter


def refusal(backend: str, variant: str) -> str | None:
    """The one-line message with which `backend` refuses `variant`, or None where it computes it."""
    n_head, d_k = VARIANT_HEADS
    try:
        GPTConfig(n_head=n_head, d_model=48, d_k=d_k, attn_backend=backend, **VARIANTS[variant]).validate()
    except ValueError as error:
        return str(error)
    return None


def backend_variants(backends: tuple[str, ...] = BACKENDS) -> list:
    """pytest params (backend, variant) for every variant on every backend that computes it."""
    pairs = [(b, v) for b in backends for v in VARIANTS if refusal(b, v) is None]
    return [pytest.param(b, v, id=f"{b}-{v}") for b, v in pairs]


def variant_cases(head_grid: list[tuple[int, int | None]], backends: tuple[str, ...] | None = None) -> list:
    """pytest params (variant, n_head, d_k): GPT-2 over the whole head grid, the others at VARIANT_HEADS.
    With `backends`: (backend, variant, n_head, d_k) for each backend that computes the variant."""
    cases = [("learned", n_head, d_k) for n_head, d_k in head_grid]
    cases += [(name, *VARIANT_HEADS) for name in VARIANTS if name != "learned"]
    ids = [name if name != "learned" else f"learned-{n_head}-{d_k}" for name, n_head, d_k in cases]
    if backends is None:
        return [pytest.param(*case, id=i) for case, i in zip(cases, ids, strict=True)]
    return [
        pytest.param(b, *case, id=f"{b}-{i}")
        for b in backends
        for case, i in zip(cases, ids, strict=True)
        if refusal(b, case[0]) is None
    ]


def variant_model(
    backend: str, n_head: int, d_k: int | None, variant: str | dict, vocab_size: int, block_size: int
) -> GPT:
    """The tests' small GPT (2 layers, d_model 48) of one variant (a name of VARIANTS, or overrides), seeded,
    in eval mode."""
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=vocab_size,
        block_size=block_size,
        n_layer=2,
        n_head=n_head,
        d_model=48,
        d_k=d_k,
        attn_backend=backend,
        **(VARIANTS[variant] if isinstance(variant, str) else variant),
    )
    model = GPT(cfg).eval()
    # Every parameter moved away from its start, as training moves it: a start at zero, one or the identity (a sink,
    # a gate, a mix, a table, a norm's gain, a new variant's own) hides a path that skips it, and GPT-2's small init
    # keeps the scores so small that a soft cap would never bind.
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param), alpha=PERTURBATION)
    if model.bigram_emb is not None:  # it starts at zero, which would hide a pair read from the wrong token
        torch.nn.init.normal_(model.bigram_emb.table.weight, std=0.5)
    if model.x0_scales is not None:  # they start as the plain stream, which would hide a block that skips the mix
        torch.nn.init.normal_(model.x0_scales, std=0.5)
    return model


def combined(first: str, second: str) -> dict | None:
    """The overrides of two variants at once, or None where they set one field two ways (gqa and mqa, two windows):
    those are alternatives, not a pair."""
    a, b = VARIANTS[first], VARIANTS[second]
    if any(a[key] != b[key] for key in a.keys() & b.keys()):
        return None
    return a | b


def variant_pairs() -> list:
    """pytest params (overrides, refusal) for every variant alone and every pair of them: refusal is GPTConfig's
    one-line message where the config refuses the pair (on the explicit backend, which computes every variant)."""
    n_head, d_k = VARIANT_HEADS
    names = list(VARIANTS)
    cases = [(name, VARIANTS[name]) for name in names]
    cases += [(f"{a}+{b}", knobs) for i, a in enumerate(names) for b in names[i + 1 :] if (knobs := combined(a, b))]
    params = []
    for case_id, knobs in cases:
        try:
            GPTConfig(n_head=n_head, d_model=48, d_k=d_k, attn_backend="explicit", **knobs).validate()
            refused = None
        except ValueError as error:
            refused = str(error)
        params.append(pytest.param(knobs, refused, id=case_id))
    return params
