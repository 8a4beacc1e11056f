"""RoPE: the rotation itself, scores that depend only on the offset between positions, explicit ==
sdpa, and generation with more context than the trained block_size."""

import math

import pytest
import torch

from generation.generate import SamplingParams, generate, pad_prompts
from model import GPT, GPTConfig
from model.attention import CausalSelfAttention
from model.position import RotaryEmbedding, apply_rotary

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 40


def rope_model(backend: str = "sdpa", pos_encoding: str = "rope") -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=VOCAB,
        block_size=16,
        n_layer=2,
        n_head=4,
        d_model=32,
        pos_encoding=pos_encoding,
        attn_backend=backend,
    )
    model = GPT(cfg).eval()
    with torch.no_grad():  # decisive logits, so greedy comparisons test the math, not near-ties
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    return model


def rotate(x: torch.Tensor, position: int, base: float = 10000.0) -> torch.Tensor:
    """x (..., D) as one head of one token at `position`."""
    rotary = RotaryEmbedding(x.shape[-1], base)(torch.tensor([[position]]))
    return apply_rotary(x.view(1, 1, 1, -1), rotary).flatten()


def test_rotation_of_each_channel_pair_is_by_position_times_its_frequency():
    d, base, pos = 8, 100.0, 3
    for i in range(d // 2):  # the unit vector in channel i lands at (cos, sin) in channels (i, i + d/2)
        x = torch.zeros(d)
        x[i] = 1.0
        angle = pos * base ** (-2 * i / d)
        expected = torch.zeros(d)
        expected[i], expected[i + d // 2] = math.cos(angle), math.sin(angle)
        torch.testing.assert_close(rotate(x, pos, base), expected)
    x = torch.randn(d)
    torch.testing.assert_close(rotate(x, 0), x)  # position 0 is the identity
    torch.testing.assert_close(rotate(x, 1234).norm(), x.norm())  # a rotation keeps lengths


def test_scores_depend_only_on_the_offset_between_positions():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(16, generator=g), torch.randn(16, generator=g)
    for offset in (0, 1, 5, 40):
        scores = [rotate(q, m + offset) @ rotate(k, m) for m in (0, 7, 100, 1000)]
        for s in scores[1:]:
            assert s.item() == pytest.approx(scores[0].item(), abs=1e-4), f"offset {offset}"
    # ...and the offset does matter, so the property is not vacuous
    assert abs((rotate(q, 3) @ rotate(k, 0)).item() - (rotate(q, 9) @ rotate(k, 0)).item()) > 1e-2


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "materialized"])
@pytest.mark.parametrize("n_kv_head,qk_norm", [(None, False), (2, True)])
def test_attention_output_is_unchanged_by_shifting_every_position(backend, n_kv_head, qk_norm):
    torch.manual_seed(0)
    config = GPTConfig(d_model=32, n_head=4, attn_backend=backend, n_kv_head=n_kv_head, qk_norm=qk_norm)
    attn = CausalSelfAttention(config).eval()
    rope = RotaryEmbedding(attn.d_k)
    x = torch.randn(2, 9, 32)
    positions = torch.arange(9)[None]
    base = attn(x, rotary=rope(positions))
    torch.testing.assert_close(attn(x, rotary=rope(positions + 500)), base, atol=1e-4, rtol=0)
    assert (attn(x, rotary=rope(positions * 2)) - base).abs().max() > 1e-3, "positions should matter"


def test_explicit_and_sdpa_give_the_same_logits():
    explicit, sdpa = rope_model("explicit"), rope_model("sdpa")
    sdpa.load_state_dict(explicit.state_dict())
    prompts = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (16, 5)]
    idx, padding_mask = pad_prompts(prompts)
    with torch.no_grad():
        torch.testing.assert_close(explicit(idx)[0], sdpa(idx)[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(
            explicit(idx, padding_mask=padding_mask)[0], sdpa(idx, padding_mask=padding_mask)[0], atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("pos_encoding", ["rope", "sinusoidal"])
def test_context_beyond_block_size_is_allowed_and_cached_equals_uncached(pos_encoding):
    model = rope_model(pos_encoding=pos_encoding)
    idx = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(0))
    cached = generate(model, idx, SamplingParams(36, temperature=0, context_length=40, top_k=None, seed=None))
    uncached = generate(
        model, idx, SamplingParams(36, temperature=0, context_length=40, use_cache=False, top_k=None, seed=None)
    )
    assert torch.equal(cached, uncached)
    with torch.no_grad():  # the last token saw all 39 before it, at positions past block_size
        logits, _ = model(cached[:, :-1])
    assert torch.equal(logits[:, -1].argmax(-1), cached[:, -1])
    cropped = generate(
        model, idx, SamplingParams(36, temperature=0, top_k=None, seed=None)
    )  # the default still crops to block_size
    assert not torch.equal(cropped, cached)


def test_learned_positions_refuse_context_beyond_block_size():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=16, n_layer=1, n_head=2, d_model=16)).eval()
    with pytest.raises(ValueError, match=r"context_length=17 is invalid; .* <= block_size \(16\)"):
        generate(
            model,
            torch.zeros(1, 1, dtype=torch.long),
            SamplingParams(3, context_length=17, temperature=1.0, top_k=None, seed=None),
        )
    with pytest.raises(ValueError, match="KV cache length 17 must be in"):
        model.new_cache(1, 17)


def test_the_table_of_the_first_positions_is_the_rotation_computed_for_them():
    rope = RotaryEmbedding(8, table_length=16)
    for length in (1, 16, 20):  # 20: past the table, computed on the call
        table, computed = rope.leading(length, torch.device("cpu")), rope(torch.arange(length)[None])
        assert all(torch.equal(t, c) for t, c in zip(table, computed, strict=True))
        assert table[0].shape == (1, 1, length, 4)


def test_a_cast_model_keeps_its_rope_table_in_float32_and_out_of_its_weights():
    model = rope_model()
    exact = model.rotary(torch.arange(16)[None])
    model.to(torch.bfloat16)  # a bf16 table would rotate position 15 by a visibly wrong angle
    assert model.rotary.cos_table.dtype == torch.float32
    assert torch.equal(model.rotary.cos_table, exact[0]) and torch.equal(model.rotary.sin_table, exact[1])
    assert not [name for name in model.state_dict() if "table" in name]  # checkpoints and exports: weights only


def test_logits_from_the_table_equal_those_from_positions_computed_on_the_call():
    model = rope_model(backend="explicit")
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        from_table, _ = model(idx)  # no padding, no cache: positions 0..15 from the table
        computed, _ = model(idx, padding_mask=torch.ones(2, 16, dtype=torch.bool))  # the same positions, counted
    assert torch.equal(from_table, computed)
