"""The materialized kernel: equal to the equation in values and gradients, block skipping included,
causal whatever the mask says, and what `auto` picks it for."""

from functools import partial

import pytest
import torch
import torch.nn.functional as F

import model.materialized_attention as materialized
from model.attention import (
    MATERIALIZED_MAX_KEYS,
    CausalSelfAttention,
    open_blind_rows,
    scaled_dot_product_attention,
)
from model.causal_mask import build_aligned_causal_mask
from model.config import GPTConfig
from model.materialized_attention import causal_materialized_attention


def tensors(B=2, H=3, Tq=13, Tk=13, D=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, D)]
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype).requires_grad_() for s in shapes]


def padded_mask(B, Tq, Tk, seed=0):
    """Causal mask with random padding keys: some rows then see no key at all."""
    pad = torch.rand(B, Tk, generator=torch.Generator().manual_seed(seed)) > 0.4
    return build_aligned_causal_mask(Tq, Tk) & pad[:, None, None, :]


def assert_matches_the_equation(attend, mask, Tq, Tk) -> tuple[torch.Tensor, torch.Tensor]:
    """attend(q, k, v) equals the equation under `mask` in its output and in the gradients of q, k and v (float64);
    returns the key and value it was given, gradients filled in."""
    q, k, v = tensors(Tq=Tq, Tk=Tk)
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = attend(q, k, v)
    ref = scaled_dot_product_attention(qr, kr, vr, mask)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    out.backward(grad)
    ref.backward(grad)
    for got, want in ((out, ref), (q.grad, qr.grad), (k.grad, kr.grad), (v.grad, vr.grad)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)
    return k, v


@pytest.mark.parametrize("block", [5, 64])  # several blocks, the last ragged; one block covering all
@pytest.mark.parametrize("Tq,Tk", [(13, 13), (1, 9), (4, 17), (12, 30)])
@pytest.mark.parametrize("with_padding", [False, True])
def test_values_and_gradients_match_the_equation(monkeypatch, block, Tq, Tk, with_padding):
    monkeypatch.setattr(materialized, "QUERY_BLOCK", block)
    mask = padded_mask(2, Tq, Tk) if with_padding else build_aligned_causal_mask(Tq, Tk)
    opened, has_visible = open_blind_rows(mask)

    def masked(q, k, v):
        return causal_materialized_attention(q, k, v, opened) * has_visible

    assert_matches_the_equation(masked, mask, Tq, Tk)


@pytest.mark.parametrize("block", [4, 64])
@pytest.mark.parametrize("window", [1, 3, 5, 9, 40])  # one key; shorter than a block; longer; wider than every row
@pytest.mark.parametrize("Tq,Tk", [(13, 13), (1, 9), (4, 17), (12, 30)])
def test_a_window_skips_only_keys_it_hides(monkeypatch, block, window, Tq, Tk):
    """With `window`, each block reads only the keys from its first query's window on: values and gradients
    still equal the equation's under the same sliding-window mask, and no gradient reaches an older key."""
    monkeypatch.setattr(materialized, "QUERY_BLOCK", block)
    mask = build_aligned_causal_mask(Tq, Tk, window=window)
    k, v = assert_matches_the_equation(partial(causal_materialized_attention, window=window), mask, Tq, Tk)
    oldest = max(0, Tk - Tq - window + 1)  # the first query's window starts here: older keys are read by no query
    assert k.grad[:, :, :oldest].eq(0).all() and v.grad[:, :, :oldest].eq(0).all()


def test_a_window_works_with_soft_cap_and_sinks_and_refuses_zero(monkeypatch):
    monkeypatch.setattr(materialized, "QUERY_BLOCK", 4)
    q, k, v = tensors(Tq=12, Tk=12)
    sinks = torch.randn(3, dtype=torch.float64, requires_grad=True)
    mask = build_aligned_causal_mask(12, 12, window=3)
    got = causal_materialized_attention(q, k, v, softcap=5.0, sinks=sinks, window=3)
    torch.testing.assert_close(got, causal_materialized_attention(q, k, v, mask, softcap=5.0, sinks=sinks))
    assert torch.autograd.gradcheck(
        lambda q, k, v, s: causal_materialized_attention(q, k, v, softcap=5.0, sinks=s, window=3), (q, k, v, sinks)
    )
    with pytest.raises(ValueError, match="window=0 is invalid"):
        causal_materialized_attention(q, k, v, window=0)


def test_hand_written_backward_passes_gradcheck():
    q, k, v = tensors(B=1, H=2, Tq=12, Tk=12, D=4)
    mask = open_blind_rows(padded_mask(1, 12, 12, seed=3))[0]
    assert torch.autograd.gradcheck(lambda q, k, v: causal_materialized_attention(q, k, v, mask), (q, k, v))


def test_causal_whatever_the_mask_allows():
    q, k, v = tensors()
    everything = torch.ones(13, 13, dtype=torch.bool)
    torch.testing.assert_close(
        causal_materialized_attention(q, k, v, everything), scaled_dot_product_attention(q, k, v, everything.tril())
    )


def test_no_gradient_flows_from_a_later_key_or_value():
    q, k, v = tensors()
    out = causal_materialized_attention(q, k, v)
    out[:, :, 6].sum().backward()
    assert k.grad[:, :, 7:].eq(0).all() and v.grad[:, :, 7:].eq(0).all()
    assert k.grad[:, :, :7].ne(0).any(-1).all() and v.grad[:, :, :7].ne(0).any(-1).all()


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


def test_bf16_is_as_accurate_as_the_fused_kernel():
    """Documented tolerance: in bf16, output and gradients within 1.5x the fused kernel's error
    against a float64 reference (both are about 2^-8 relative)."""
    q, k, v = tensors(B=2, H=2, Tq=150, Tk=150, D=32)
    grad = torch.randn(2, 2, 150, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ref = scaled_dot_product_attention(q, k, v, build_aligned_causal_mask(150, 150))
    want = [ref, *torch.autograd.grad(ref, (q, k, v), grad)]

    def run(fn):
        qb, kb, vb = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
        out = fn(qb, kb, vb)
        return [out, *torch.autograd.grad(out, (qb, kb, vb), grad.bfloat16())]

    mine = run(causal_materialized_attention)
    fused = run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    for m, f, w in zip(mine, fused, want, strict=True):
        assert m.dtype == torch.bfloat16
        assert relative_error(m, w) <= 1.5 * relative_error(f, w) + 1e-3


def test_runs_in_its_inputs_dtype_under_autocast():
    q, k, v = (t.detach().bfloat16() for t in tensors())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert causal_materialized_attention(q, k, v).dtype == torch.bfloat16


def test_rejects_mixed_dtypes_and_fewer_keys_than_queries():
    q, k, v = tensors(Tq=5, Tk=5)
    with pytest.raises(ValueError, match="dtypes differ"):
        causal_materialized_attention(q.float(), k, v)
    q, k, v = tensors(Tq=6, Tk=4)
    with pytest.raises(ValueError, match="at least as many keys as queries, got 4 keys for 6"):
        causal_materialized_attention(q, k, v)


def test_auto_picks_the_materialized_kernel_only_where_it_is_faster():
    attn = CausalSelfAttention(GPTConfig(d_model=32, n_head=4, attn_backend="auto"))

    def pick(T, dtype=torch.bfloat16, dropout_p=0.0, training=True):
        return attn.kernel(torch.zeros(1, 4, T, 8, dtype=dtype, requires_grad=training), T, dropout_p)

    assert pick(256) == "materialized"
    assert pick(MATERIALIZED_MAX_KEYS) == "materialized"
    assert pick(MATERIALIZED_MAX_KEYS + 1) == "sdpa"  # longer: the fused kernel's O(T) memory and speed win
    assert pick(256, dtype=torch.float32) == "materialized"  # faster in fp32 too, by less
    assert pick(256, training=False) == "sdpa"  # inference: no backward to gain on
    assert pick(256, dropout_p=0.1) == "sdpa"  # it has no dropout
    for fixed in ("explicit", "sdpa", "materialized"):
        assert (
            CausalSelfAttention(GPTConfig(d_model=32, n_head=4, attn_backend=fixed)).kernel(
                torch.zeros(1, 4, 9999, 8), 9999, 0.0
            )
            == fixed
        )


def test_a_module_in_training_on_cpu_takes_the_materialized_path_and_agrees_with_sdpa(monkeypatch):
    torch.manual_seed(0)
    auto = CausalSelfAttention(GPTConfig(d_model=32, n_head=4, attn_backend="auto"))
    fused = CausalSelfAttention(GPTConfig(d_model=32, n_head=4, attn_backend="sdpa"))
    fused.load_state_dict(auto.state_dict())
    x = torch.randn(2, 20, 32)
    calls = []
    original = materialized._CausalMaterializedAttention.apply
    monkeypatch.setattr(materialized._CausalMaterializedAttention, "apply", lambda *a: calls.append(1) or original(*a))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_auto, out_fused = auto(x), fused(x)
        assert len(calls) == 1, "auto did not take the materialized kernel in training on a CPU"
        with torch.no_grad():
            auto(x)
        assert len(calls) == 1, "auto took the materialized kernel without a backward to follow"
    assert (out_auto.float() - out_fused.float()).abs().max().item() < 2e-2


def test_materialized_module_rejects_dropout():
    with pytest.raises(ValueError, match="attn_backend='materialized' has no attention dropout"):
        GPTConfig(d_model=32, n_head=4, dropout=0.1, attn_backend="materialized").validate()


def test_residual_dropout_without_attention_dropout_keeps_the_materialized_kernel(monkeypatch):
    config = GPTConfig(d_model=32, n_head=4, dropout=0.1, attn_dropout=0.0)
    config.validate()
    assert config.attention_dropout == 0.0 and GPTConfig(dropout=0.1).attention_dropout == 0.1
    GPTConfig(d_model=32, n_head=4, dropout=0.1, attn_dropout=0.0, attn_backend="materialized").validate()
    attn = CausalSelfAttention(config).train()
    calls = []
    original = materialized._CausalMaterializedAttention.apply
    monkeypatch.setattr(materialized._CausalMaterializedAttention, "apply", lambda *a: calls.append(1) or original(*a))
    x = torch.randn(2, 20, 32)
    torch.manual_seed(0)
    first = attn(x)
    torch.manual_seed(1)
    second = attn(x)
    assert len(calls) == 2  # no attention dropout: the fast kernel
    assert not torch.equal(first, second)  # the output's dropout still draws
    with torch.no_grad():
        assert torch.equal(attn.eval()(x), attn(x))
