"""The continuous cache (model/pointer.py): Grave et al.'s mixture computed position by position, the plain model in
training, and a real gain where the text repeats. No-leak, KV-cache and padding guarantees run over it as the
`pointer` variant of tests/variants.py."""

import math

import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig

VOCAB, WEIGHT, SCALE = 30, 0.3, 4.0


def model_with(**overrides) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=VOCAB, block_size=40, n_layer=2, n_head=2, d_model=32, pos_encoding="rope")
    for key, value in {"pointer_weight": WEIGHT, "pointer_scale": SCALE, **overrides}.items():
        setattr(cfg, key, value)
    return GPT(cfg)


def hidden_states(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """The final norm's output at every position (what the head reads), caught by a hook."""
    seen = []
    handle = model.ln_f.register_forward_hook(lambda module, args, out: seen.append(out))
    with torch.no_grad():
        model.train()(idx)  # training mode: no pointer, the same states
    handle.remove()
    return seen[0][0]


def test_log_probs_are_the_papers_mixture_position_by_position():
    model = model_with()
    idx = torch.randint(0, VOCAB, (1, 25), generator=torch.Generator().manual_seed(1))
    h = hidden_states(model, idx)
    with torch.no_grad():
        plain = F.softmax(model.lm_head(h), dim=-1)
        got = model.eval()(idx)[0][0]
    for i in range(idx.shape[1]):
        expected = plain[i].clone()
        if i > 0:  # keys j < i, each holding the token that followed it
            cosines = torch.stack([F.cosine_similarity(h[i], h[j], dim=0) for j in range(i)])
            weights = torch.softmax(SCALE * cosines, dim=0)
            pointer = torch.zeros(VOCAB)
            for j in range(i):
                pointer[idx[0, j + 1]] += weights[j]
            expected = (1 - WEIGHT) * plain[i] + WEIGHT * pointer
        torch.testing.assert_close(got[i], expected.log(), atol=1e-5, rtol=1e-5)


def test_its_distributions_sum_to_one_and_training_sees_the_plain_model():
    pointing, plain = model_with(), model_with(pointer_weight=0.0)
    idx = torch.randint(0, VOCAB, (3, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        log_probs = pointing.eval()(idx)[0]
        torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(3, 20))
        assert not torch.allclose(log_probs, F.log_softmax(plain.eval()(idx)[0], -1), atol=1e-3)
        torch.testing.assert_close(pointing.train()(idx, idx)[1], plain.train()(idx, idx)[1])


def test_where_the_text_repeats_the_pointer_predicts_the_repeat():
    """An untrained model knows nothing, but its states at a repeated stretch match those of the first copy."""
    torch.manual_seed(3)
    first = torch.randint(0, VOCAB, (18,))
    idx = torch.cat([first, first])[None]  # the second copy's tokens each follow the same context as the first's
    second = slice(19, 35)  # targets inside the second copy, each after two tokens of repeated context
    with torch.no_grad():
        with_pointer = F.cross_entropy(model_with(pointer_scale=30.0).eval()(idx)[0][0, second], idx[0, 20:36])
        without = F.cross_entropy(model_with(pointer_weight=0.0).eval()(idx)[0][0, second], idx[0, 20:36])
    assert without > math.log(VOCAB) - 0.5  # the plain model is near uniform
    assert with_pointer < without - 0.3


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"pointer_weight": 1.0}, r"model.pointer_weight=1.0 is invalid; it must be in \[0, 1\)"),
        ({"pointer_weight": -0.1}, r"model.pointer_weight=-0.1 is invalid"),
        ({"pointer_weight": float("nan")}, r"model.pointer_weight=nan is invalid"),
        ({"pointer_scale": 0.0}, r"model.pointer_scale=0.0 is invalid; it must be a finite number > 0"),
        ({"pointer_scale": float("inf")}, r"model.pointer_scale=inf is invalid"),
    ],
)
def test_bad_pointer_settings_are_refused_in_one_line(overrides, message):
    with pytest.raises(ValueError, match=message):
        model_with(**overrides)
