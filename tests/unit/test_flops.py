"""GPT.flops_per_token against torch's own FLOP counter, for every variant of tests/variants.py.

FlopCounterMode counts the matmuls aten runs (mm, addmm, bmm: 2 FLOPs per multiply-add) in one
training step, forward and backward; it counts nothing for norms, softmax, tanh, sigmoid, RoPE,
embedding lookups, bias adds or the loss, which is exactly what the formula leaves out too. The
explicit backend computes the full T x T scores and masks them afterwards, so the counter sees the
full-context attention the formula charges (a causal kernel could skip half of it). Backward =
2x forward holds because both inputs of every matmul need a gradient (even the first layer's: it
comes from the trained embedding). So the two agree exactly, with no tolerance.
"""

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from model import GPT, GPTConfig
from tests.variants import VARIANT_HEADS, VARIANTS

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, B, T = 50, 2, 12


def tiny(n_head: int, d_k: int | None, **overrides) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=VOCAB, block_size=T, n_layer=2, n_head=n_head, d_model=48, d_k=d_k, **overrides)
    cfg.attn_backend = "explicit"  # every matmul visible to the counter; fp32, no compile
    return GPT(cfg).train()


def counted_flops_per_token(model: GPT, length: int = T) -> float:
    """FLOPs the counter sees in one training step (forward + backward) on B x length tokens, per token."""
    idx = torch.randint(0, VOCAB, (B, length), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        _, loss = model(idx, idx)
        loss.backward()
    return counter.get_total_flops() / (B * length)


CASES = [pytest.param(name, *VARIANT_HEADS, id=name) for name in VARIANTS]
CASES += [pytest.param("learned", n_head, d_k, id=f"learned-{n_head}-{d_k}") for n_head, d_k in [(1, None), (3, 10)]]


@pytest.mark.parametrize("variant,n_head,d_k", CASES)
def test_flops_per_token_equals_the_counted_matmuls_of_a_training_step(variant, n_head, d_k):
    model = tiny(n_head, d_k, **VARIANTS[variant])
    for length in (T, T // 2):  # attention's share scales with the length
        derived, counted = model.flops_per_token(seq_len=length), counted_flops_per_token(model, length)
        assert derived == counted, (
            f"{variant}: GPT.flops_per_token gives {derived:,} a token, torch's counter {counted:,.0f}: each "
            "nn.Linear is counted by its type, so a matmul outside one (a new product of the scores, a bare "
            "weight) needs its FLOPs in CausalSelfAttention.score_flops (or GPT.flops_per_token)"
        )


@pytest.mark.parametrize("knob", [{"d_ff": 40}, {"tie_embeddings": False}, {"bias": True}])
def test_flops_per_token_follows_the_mlp_and_head_knobs(knob):
    model = tiny(*VARIANT_HEADS, **knob)
    assert model.flops_per_token() == counted_flops_per_token(model)


class GatedOutput(nn.Module):
    """W_O behind a gate no config knows: y -> W_O(y * sigmoid(y W_g)), one more Linear per layer."""

    def __init__(self, out_proj: nn.Linear) -> None:
        super().__init__()
        self.gate = nn.Linear(out_proj.in_features, out_proj.in_features, bias=False)
        self.out_proj = out_proj

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.out_proj(y * torch.sigmoid(self.gate(y)))


@pytest.fixture
def unlisted_variant() -> GPT:
    """A model with a gate Linear added to every attention layer behind the config's back."""
    model = tiny(*VARIANT_HEADS)
    for block in model.blocks:
        block.attn.out_proj = GatedOutput(block.attn.out_proj)
    return model


def remembered_formula(c: GPTConfig) -> int:
    """The hand-written formula flops_per_token used to be: right only for the modules it listed."""
    hd, qkv = c.n_head * c.head_dim, (c.n_head + 2 * c.kv_heads) * c.head_dim
    per_layer = 2 * c.d_model * (qkv + hd + 2 * c.ff_dim) + 4 * c.block_size * hd
    return 3 * (c.n_layer * per_layer + 2 * c.d_model * c.vocab_size)


def test_a_variant_nobody_listed_is_counted(unlisted_variant):
    counted = counted_flops_per_token(unlisted_variant)
    assert unlisted_variant.flops_per_token() == counted
    # the remembered formula misses the gate: this test fails on it
    hd = unlisted_variant.config.n_head * unlisted_variant.config.head_dim
    assert counted - remembered_formula(unlisted_variant.config) == 3 * 2 * 2 * hd * hd
