"""The attention function and masks: the equation, its contract, and the fused backend's equality."""

import math

import pytest
import torch
import torch.nn.functional as F

from model.attention import (
    CausalSelfAttention,
    attention_weights,
    expand_kv_heads,
    fused_attention,
    open_blind_rows,
    scaled_dot_product_attention,
)
from model.causal_mask import build_aligned_causal_mask, build_causal_mask
from model.config import GPTConfig
from model.differential import maps_as_heads, subtract_maps
from model.materialized_attention import causal_materialized_attention
from tests.variants import VARIANT_HEADS, backend_variants, variant_model


def qkv(B=2, H=3, Tq=5, Tk=5, D=8, seed=0, H_kv=None):
    g = torch.Generator().manual_seed(seed)
    H_kv = H_kv or H
    return (
        torch.randn(B, H, Tq, D, generator=g),
        torch.randn(B, H_kv, Tk, D, generator=g),
        torch.randn(B, H_kv, Tk, D, generator=g),
    )


def test_causal_mask_is_lower_triangular_bool():
    mask = build_causal_mask(4, "cpu")
    assert mask.dtype == torch.bool and mask.shape == (1, 1, 4, 4)
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(mask[0, 0], expected)


@pytest.mark.parametrize("length", [0, -3])
def test_causal_mask_rejects_empty_sequences(length):
    with pytest.raises(ValueError, match="sequence_length must be >= 1"):
        build_causal_mask(length, "cpu")


def test_aligned_mask_is_lower_right_unlike_is_causal():
    # 2 queries that are positions 3 and 4 of 5 keys: they see 4 and 5 keys.
    mask = build_aligned_causal_mask(2, 5)
    assert torch.equal(mask[0, 0], torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool))
    # PyTorch's is_causal aligns upper-left, i.e. treats the queries as positions 0 and 1.
    q, k, v = qkv(Tq=2, Tk=5)
    ours = scaled_dot_product_attention(q, k, v, mask)
    upper_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(ours, upper_left, atol=1e-3)
    assert torch.allclose(ours, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-6)


def test_sliding_window_mask_keeps_the_last_window_keys_of_each_query():
    # 2 queries that are positions 3 and 4 of 5 keys, a window of 2: keys 2-3 and 3-4.
    mask = build_aligned_causal_mask(2, 5, window=2)
    assert torch.equal(mask[0, 0], torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]], dtype=torch.bool))
    assert torch.equal(build_aligned_causal_mask(4, 4, window=4), build_causal_mask(4))  # a window as long as all
    assert torch.equal(build_aligned_causal_mask(3, 3, window=1)[0, 0], torch.eye(3, dtype=torch.bool))


def test_matches_the_equation():
    q, k, v = qkv()
    mask = build_causal_mask(5)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores + torch.where(mask, 0.0, float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ v
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask), expected)


def test_softcap_caps_the_scores_before_the_mask():
    q, k, v = qkv()
    q = q * 4  # scores of several units, beyond the cap
    mask = build_causal_mask(5)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    capped = 2.0 * torch.tanh(scores / 2.0)
    expected = torch.softmax(capped + torch.where(mask, 0.0, float("-inf")), dim=-1) @ v
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask, softcap=2.0), expected)
    assert scores.abs().max() > 4 and capped.abs().max() < 2  # the cap did bind
    assert not torch.allclose(scaled_dot_product_attention(q, k, v, mask), expected, atol=1e-3)


def test_a_sink_is_one_more_logit_in_the_denominator_with_no_value_behind_it():
    q, k, v = qkv()
    mask = build_causal_mask(5)
    sinks = torch.tensor([0.0, 1.0, 30.0])  # per head; the third drowns every key
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + torch.where(mask, 0.0, float("-inf"))
    exp = scores.exp()
    expected = exp / (exp.sum(-1, keepdim=True) + sinks.exp().view(1, 3, 1, 1))
    weights = attention_weights(q, k, mask, sinks=sinks)
    torch.testing.assert_close(weights, expected)
    assert (weights.sum(-1) < 1).all() and weights[:, 2].sum(-1).max() < 1e-6  # the third head reads nothing
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask, sinks=sinks), expected @ v)


def test_shape_contract():
    q, k, v = qkv(B=2, H=4, Tq=3, Tk=7, D=6)
    assert scaled_dot_product_attention(q, k, v).shape == (2, 4, 3, 6)


def test_value_dim_may_differ_from_key_dim():
    q, k, _ = qkv(D=8)
    v = torch.randn(2, 3, 5, 4)
    assert scaled_dot_product_attention(q, k, v).shape == (2, 3, 5, 4)


def test_rejects_key_value_length_mismatch():
    q, k, v = qkv(Tk=5)
    with pytest.raises(ValueError, match="key and value lengths differ: 5 vs 4"):
        scaled_dot_product_attention(q, k, v[:, :, :4])


def test_rejects_query_key_dim_mismatch():
    q, k, v = qkv(D=8)
    with pytest.raises(ValueError, match="query and key head dims differ: 8 vs 6"):
        scaled_dot_product_attention(q, k[..., :6], v)


def test_mask_before_softmax_renormalises_and_after_does_not():
    # The article's example: weights [0.2, 0.3, 0.5], the last position hidden.
    scores = torch.log(torch.tensor([0.2, 0.3, 0.5])).view(1, 1, 1, 3)
    visible = torch.tensor([True, True, False]).view(1, 1, 1, 3)
    after = scores.softmax(-1) * visible  # mask applied after softmax: rows no longer sum to 1
    torch.testing.assert_close(after.flatten(), torch.tensor([0.2, 0.3, 0.0]))
    assert after.sum().item() == pytest.approx(0.5)
    # Ours masks before the softmax, so the visible weights renormalise to 0.4 / 0.6.
    key = torch.eye(3).view(1, 1, 3, 3)
    query = scores * math.sqrt(3)  # so that q k^T / sqrt(d_k) equals the scores above
    weights = attention_weights(query, key, visible)
    torch.testing.assert_close(weights.flatten(), torch.tensor([0.4, 0.6, 0.0]))


def test_row_with_no_visible_key_is_zero_not_nan():
    q, k, v = qkv()
    mask = build_causal_mask(5).clone()
    mask[..., 2, :] = False
    q.requires_grad_(True)
    out = scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_weights_rows_sum_to_one_and_vanish_above_diagonal():
    q, k, _ = qkv(Tq=6, Tk=6)
    w = attention_weights(q, k, build_causal_mask(6))
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 6))
    above = torch.ones(6, 6, dtype=torch.bool).triu(1)
    assert (w[..., above] == 0).all()


@pytest.mark.parametrize("Tq,Tk", [(5, 5), (1, 9), (3, 9)])
@pytest.mark.parametrize("with_padding", [False, True])
@pytest.mark.parametrize("H_kv", [6, 2, 1], ids=["mha", "gqa", "mqa"])
def test_fused_backend_matches_explicit(Tq, Tk, with_padding, H_kv):
    q, k, v = qkv(H=6, Tq=Tq, Tk=Tk, D=16, H_kv=H_kv)
    mask = build_aligned_causal_mask(Tq, Tk)
    if with_padding:
        pad = torch.ones(2, Tk, dtype=torch.bool)
        pad[0, :2] = False  # left padding in the first sequence
        mask = mask & pad[:, None, None, :]
    explicit = scaled_dot_product_attention(q, k, v, mask)
    fused = fused_attention(q, k, v, mask)
    assert (explicit - fused).abs().max().item() < 1e-5
    opened, has_visible = open_blind_rows(mask)
    k, v = expand_kv_heads(k, q.shape[1]), expand_kv_heads(v, q.shape[1])
    materialized = causal_materialized_attention(q, k, v, opened) * has_visible
    assert (explicit - materialized).abs().max().item() < 1e-5


@pytest.mark.parametrize("n_kv_head,qk_norm", [(None, False), (2, False), (1, False), (None, True), (2, True)])
@pytest.mark.parametrize("n_head,d_k", [(4, None), (2, 40), (8, 4)])
@pytest.mark.parametrize("backend", ["sdpa", "materialized"])
def test_module_backends_agree(backend, n_head, d_k, n_kv_head, qk_norm):
    torch.manual_seed(0)
    shape = dict(d_model=48, n_head=n_head, d_k=d_k, n_kv_head=n_kv_head, qk_norm=qk_norm)
    explicit = CausalSelfAttention(GPTConfig(**shape, attn_backend="explicit"))
    other = CausalSelfAttention(GPTConfig(**shape, attn_backend=backend))
    other.load_state_dict(explicit.state_dict())
    x = torch.randn(2, 11, 48)
    assert (explicit(x) - other(x)).abs().max().item() < 1e-5
    pad = torch.ones(2, 11, dtype=torch.bool)
    pad[1, :3] = False
    assert (explicit(x, pad) - other(x, pad)).abs().max().item() < 1e-5


def test_module_n_head_and_d_k_are_independent():
    attn = CausalSelfAttention(GPTConfig(d_model=32, n_head=6, d_k=5))
    assert attn.qkv_proj.weight.shape == (3 * 6 * 5, 32)
    assert attn.out_proj.weight.shape == (32, 6 * 5)
    assert CausalSelfAttention(GPTConfig(d_model=32, n_head=4)).d_k == 8


def test_grouped_query_projection_shapes():
    attn = CausalSelfAttention(GPTConfig(d_model=32, n_head=6, d_k=5, n_kv_head=2))
    assert attn.qkv_proj.weight.shape == ((6 + 2 * 2) * 5, 32)  # W_Q: 6 heads, W_K and W_V: 2 each
    q, k, v = attn.project_qkv(torch.randn(3, 7, 32))
    assert q.shape == (3, 6, 7, 5) and k.shape == v.shape == (3, 2, 7, 5)
    with pytest.raises(ValueError, match=r"n_kv_head \(4\) must divide model.n_head \(6\)"):
        GPTConfig(d_model=32, n_head=6, d_k=5, n_kv_head=4).validate()


def test_query_heads_must_be_a_multiple_of_key_value_heads():
    q, k, v = qkv(H=6, H_kv=4)
    with pytest.raises(ValueError, match="6 query heads cannot share 4 key / 4 value heads"):
        scaled_dot_product_attention(q, k, v)


def test_module_rejects_unknown_backend():
    with pytest.raises(ValueError, match="'flash' is unknown; choose one of: auto, explicit, sdpa, materialized"):
        GPTConfig(d_model=32, n_head=4, attn_backend="flash").validate()


@pytest.mark.parametrize("backend,variant", backend_variants(("sdpa", "materialized")))
def test_every_variant_computes_the_same_on_every_backend_that_takes_it(backend, variant):
    """Logits and every parameter's gradient, in training and with padding: equal to the explicit equation."""
    explicit = variant_model("explicit", *VARIANT_HEADS, variant, vocab_size=50, block_size=16).train()
    with torch.no_grad():  # wider than GPT-2's init, so large scores reach a soft cap and sinks matter
        for p in (p for p in explicit.parameters() if p.dim() > 1):
            p.normal_(0.0, 0.15, generator=torch.Generator().manual_seed(p.numel()))
    other = variant_model(backend, *VARIANT_HEADS, variant, vocab_size=50, block_size=16).train()
    other.load_state_dict(explicit.state_dict())
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    for model in (explicit, other):
        model(idx, idx)[1].backward()
    torch.testing.assert_close(other(idx)[0], explicit(idx)[0], atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(explicit.named_parameters(), other.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
    pad = torch.ones(2, 16, dtype=torch.bool)
    pad[1, :5] = False
    with torch.no_grad():
        got, want = other.eval()(idx, padding_mask=pad)[0], explicit.eval()(idx, padding_mask=pad)[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("with_padding", [False, True])
@pytest.mark.parametrize("softcap,sinks", [(None, False), (2.0, False), (None, True), (2.0, True)])
def test_materialized_kernel_equals_the_equation_for_each_score_variant(softcap, sinks, with_padding):
    """Values and the hand-written gradients (float64, several query blocks: tests/conftest.py)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (3 * torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64) for n in (6, 13, 13))
    mask = build_aligned_causal_mask(6, 13)
    if with_padding:
        mask = mask & (torch.arange(13) >= torch.tensor([[0], [4]]))[:, None, None, :]  # left padding
    inputs = [t.requires_grad_() for t in (q, k, v)]
    options = {"softcap": softcap}
    if sinks:  # as an input, so that its gradient is compared and checked too
        inputs.append(torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64, requires_grad=True))
        options = {"softcap": softcap, "sinks": inputs[-1]}
    want = scaled_dot_product_attention(q, k, v, mask, **options)
    got = causal_materialized_attention(q, k, v, mask, **options)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)
    grad = torch.randn(want.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(got, inputs, grad), torch.autograd.grad(want, inputs, grad), strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)

    def materialized(q, k, v, *sink):
        return causal_materialized_attention(q, k, v, mask, softcap, *sink)

    assert torch.autograd.gradcheck(materialized, inputs)


@pytest.mark.parametrize("H_kv", [4, 2])
def test_differential_weights_are_the_first_map_minus_lambda_times_the_second(H_kv):
    """Ye et al. 2024 on tiny tensors: softmax(Q1 K1^T / sqrt(d) + mask) - lambda softmax(Q2 K2^T / sqrt(d) + mask),
    the halves of each head, d = d_k / 2; then through each kernel as 2H heads, subtracted (model/differential.py)."""
    q, k, v = qkv(B=2, H=4, Tq=5, Tk=7, D=8, H_kv=H_kv, seed=3)
    q, k, v = (3 * t.double() for t in (q, k, v))  # large scores: the two maps differ clearly
    lam = torch.tensor(0.6, dtype=torch.float64)
    mask = build_aligned_causal_mask(5, 7)
    group = 4 // H_kv
    k1, k2 = (half.repeat_interleave(group, dim=1) for half in (k[..., :4], k[..., 4:]))  # query head h: kv h // group
    hidden = torch.full((5, 7), float("-inf"), dtype=torch.float64).triu(3)  # query i sees keys 0..i + 2
    maps = [(qi @ ki.transpose(-2, -1) / 2 + hidden).softmax(-1) for qi, ki in ((q[..., :4], k1), (q[..., 4:], k2))]
    want = maps[0] - lam * maps[1]
    torch.testing.assert_close(attention_weights(q, k, mask, diff_lambda=lam), want)
    out = want @ v.repeat_interleave(group, dim=1)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask, diff_lambda=lam), out)
    q2, k2, v2 = maps_as_heads(q, k, v)  # what the kernels get: 2H heads of d_k / 2, values twice
    expanded = [expand_kv_heads(t, 8) for t in (k2, v2)]
    torch.testing.assert_close(subtract_maps(fused_attention(q2, k2, v2, mask), lam), out)
    torch.testing.assert_close(subtract_maps(causal_materialized_attention(q2, *expanded), lam), out)
    assert (want.sum(-1) - (1 - lam)).abs().max() < 1e-12 and (want < 0).any()  # rows sum to 1 - lambda
