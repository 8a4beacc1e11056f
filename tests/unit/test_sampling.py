"""Sampling helpers: the allowed set of top-k / top-p, greedy, seeds, and refused settings."""

import math

import pytest
import torch

from generation.generate import SamplingParams, keep_top_k, keep_top_p, sample_next

N = 4000  # draws per distribution; rows of one batch, so one multinomial call


def draws(logits: torch.Tensor, seed: int = 0, **kwargs) -> set[int]:
    batch = logits.expand(N, -1)
    return set(sample_next(batch, generator=torch.Generator().manual_seed(seed), **kwargs).tolist())


def test_top_k_never_picks_outside_the_k_largest():
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(0)) * 0.1  # near-flat: all tokens likely
    allowed = set(logits[0].topk(5).indices.tolist())
    assert draws(logits, top_k=5) == allowed  # only the allowed, and every one of them
    assert len(draws(logits)) > 40  # without top_k the same draws range widely, so the test can fail


def test_top_k_keeps_exactly_k_even_with_ties():
    logits = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.0]])
    kept = keep_top_k(logits, 2).isfinite()
    assert kept.sum().item() == 2 and kept[0, 1:4].sum().item() == 2
    assert keep_top_k(logits, 100).isfinite().all()  # k above the vocabulary keeps everything


@pytest.mark.parametrize(
    "p,allowed",
    [(0.4, {0}), (0.6, {0, 1}), (0.85, {0, 1, 2}), (1.0, {0, 1, 2, 3, 4})],
)
def test_top_p_keeps_the_smallest_set_reaching_p(p, allowed):
    probs = torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04]])
    order = torch.tensor([3, 0, 4, 1, 2])  # shuffle the vocabulary so sorting is exercised
    logits = probs.log()[:, order]
    allowed_ids = {order.tolist().index(i) for i in allowed}
    assert draws(logits, top_p=p) == allowed_ids
    assert set(keep_top_p(logits, p).isfinite().nonzero()[:, 1].tolist()) == allowed_ids


@pytest.mark.parametrize("p", [1e-300, 1e-46, 1e-9])
def test_a_top_p_too_small_for_float32_keeps_the_top_token(p):
    """1e-300 rounds to 0 in float32, where `mass before the top token >= p` (0 >= 0) used to drop it
    too, and multinomial was handed NaN probabilities."""
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log()[:, [2, 0, 1]]
    assert draws(logits, top_p=p) == {1}
    assert keep_top_p(logits, p).isfinite().sum().item() == 1


def test_top_k_and_top_p_together_take_the_intersection():
    logits = torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04]]).log()
    # top_k=2 renormalises to (0.625, 0.375); top_p=0.9 then keeps both.
    assert draws(logits, top_k=2, top_p=0.9) == {0, 1}
    assert draws(logits, top_k=3, top_p=0.6) == {0, 1}


def test_greedy_is_argmax_and_needs_no_generator():
    logits = torch.randn(8, 30, generator=torch.Generator().manual_seed(1))
    assert torch.equal(sample_next(logits, temperature=0), logits.argmax(-1))


def test_low_temperature_approaches_greedy_and_high_flattens():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    assert draws(logits, temperature=0.05) == {0}
    picks = sample_next(logits.expand(N, -1), temperature=100.0, generator=torch.Generator().manual_seed(0))
    assert math.isclose((picks == 2).float().mean().item(), 1 / 3, abs_tol=0.05)


def test_same_seed_same_sample_different_seed_different_sample():
    logits = torch.randn(64, 100, generator=torch.Generator().manual_seed(2))

    def run(seed: int) -> torch.Tensor:
        return sample_next(logits, 0.9, top_k=50, top_p=0.95, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(run(7), run(7))
    assert not torch.equal(run(7), run(8))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"temperature": -0.1}, r"^temperature=-0.1 is invalid; it must be finite and >= 0"),
        ({"temperature": float("nan")}, r"^temperature=nan is invalid; it must be finite and >= 0"),
        ({"temperature": float("inf")}, r"^temperature=inf is invalid; it must be finite and >= 0"),
        ({"temperature": "hot"}, r"^temperature='hot' is invalid; it must be a number"),
        ({"top_k": 0}, r"^top_k=0 is invalid; it must be >= 1"),
        ({"top_p": 0.0}, r"^top_p=0.0 is invalid; it must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"^top_p=1.5 is invalid; it must be in \(0, 1\]"),
        ({"top_p": float("nan")}, r"^top_p=nan is invalid; it must be in \(0, 1\]"),
        ({"max_new_tokens": 0}, r"^max_new_tokens=0 is invalid; it must be >= 1"),
        ({"seed": -1}, r"^seed=-1 is invalid; it must be an integer in \[0, 18446744073709551615\]"),
        ({"seed": 99999999999999999999}, r"^seed=99999999999999999999 is invalid"),
        ({"context_length": 0}, r"^context_length=0 is invalid; it must be >= 1"),
        ({"stop_token": -3}, r"^stop_token=-3 is invalid; it must be >= 0"),
    ],
)
def test_bad_settings_are_refused_with_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as caught:
        SamplingParams(**kwargs)
    assert "\n" not in str(caught.value)


def test_changed_settings_are_validated_again():
    import dataclasses

    params = SamplingParams()
    assert dataclasses.replace(params, temperature=0).temperature == 0
    with pytest.raises(ValueError, match="temperature=-1 is invalid"):
        dataclasses.replace(params, temperature=-1)


def test_a_seed_makes_the_same_generator_and_none_a_fresh_one():
    def draw(seed):
        return torch.rand(4, generator=SamplingParams(seed=seed).make_generator())

    assert torch.equal(draw(3), draw(3)) and not torch.equal(draw(3), draw(4))
    assert not torch.equal(draw(None), draw(None))


@pytest.mark.parametrize("temperature", [1e-40, 1e-45, 1e-300, 5e-324])
def test_a_tiny_positive_temperature_samples_the_argmax(temperature):
    # logits / 1e-40 was inf everywhere, and softmax NaN: torch.multinomial refused the row
    logits = torch.randn(8, 30, generator=torch.Generator().manual_seed(2)) * 5
    picks = sample_next(logits, temperature=temperature, top_k=10, generator=torch.Generator().manual_seed(0))
    assert torch.equal(picks, logits.argmax(-1))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("temperature", [0, 0.8])
def test_logits_that_are_not_finite_are_refused_as_the_models_output(bad, temperature):
    logits = torch.zeros(2, 5)
    logits[1, 3] = bad
    with pytest.raises(ValueError, match=r"^the model's output is not finite \(NaN or inf logits\)"):
        sample_next(logits, temperature=temperature, generator=torch.Generator().manual_seed(0))
