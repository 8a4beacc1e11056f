"""fairness.mode=iso_param holds the parameter count fixed, so it refuses a model whose size depends on n_head."""

import pytest

from model.config import GPTConfig
from model.gpt import GPT
from studies.fairness import FairnessConfig


def iso_param_sizes(**model) -> set[int]:
    sizes = set()
    for n_head in (1, 4):
        config = GPTConfig(vocab_size=16, block_size=8, n_layer=1, d_model=16, n_head=n_head, **model)
        FairnessConfig(mode="iso_param").validate(config)
        sizes.add(sum(p.numel() for p in GPT(config).parameters()))
    return sizes


def test_iso_param_models_have_one_parameter_count():
    assert len(iso_param_sizes()) == 1


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"qk_norm": True}, r"fairness.mode=iso_param needs model.qk_norm=false: .* d_k gains"),
        ({"n_kv_head": 1}, r"needs model.n_kv_head unset \(= n_head\), not 1 with model.n_head=4"),
    ],
)
def test_iso_param_refuses_a_model_whose_size_follows_n_head(model, message):
    with pytest.raises(ValueError, match=message):
        iso_param_sizes(**model)
