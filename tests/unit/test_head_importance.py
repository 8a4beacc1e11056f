"""Head masking and importance (analysis/head_mask.py, analysis/head_importance.py) on tiny random GPTs."""

import math

import pytest
import torch

from analysis.head_importance import (
    attention_stats,
    gradient_importance,
    masked_loss,
    pruning_curve,
    single_head_effects,
    uniform_entropy,
)
from analysis.head_mask import gates_without, head_gates, ones_gates
from model import GPT, GPTConfig

pytestmark = pytest.mark.usefixtures("one_thread")
VARIANTS = {
    "mha, d_k free": dict(n_head=3, d_k=5),
    "gqa + rope": dict(n_head=4, n_kv_head=2, pos_encoding="rope"),
    "explicit kernel": dict(n_head=2, attn_backend="explicit", bias=True),
}


def tiny_gpt(dtype=torch.float64, **overrides) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=13, block_size=12, n_layer=2, n_head=2, d_model=16) | overrides
    return GPT(GPTConfig(**cfg)).to(dtype).eval()


def tokens(B: int = 3, T: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 13, (B, T + 1), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_masking_a_head_equals_zeroing_its_columns_of_w_o(variant):
    model, idx = tiny_gpt(**VARIANTS[variant]), tokens()[:, :-1]
    layer, head, d_k = 1, 1, model.config.head_dim
    with torch.no_grad(), head_gates(model, gates_without(model, [(layer, head)])):
        masked, _ = model(idx)
    with torch.no_grad():
        plain, _ = model(idx)
        model.blocks[layer].attn.out_proj.weight[:, head * d_k : (head + 1) * d_k] = 0.0
        zeroed, _ = model(idx)
    assert (masked - plain).abs().max() > 1e-3  # the head did something
    torch.testing.assert_close(masked, zeroed, atol=1e-6, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gates_of_ones_change_nothing_and_hooks_are_removed(variant):
    model, idx = tiny_gpt(torch.float32, **VARIANTS[variant]), tokens()[:, :-1]
    with torch.no_grad():
        plain, _ = model(idx)
        with head_gates(model, ones_gates(model)):
            gated, _ = model(idx)
        with head_gates(model, torch.zeros(2, model.config.n_head)):
            pass
        after, _ = model(idx)
    assert torch.equal(plain, gated) and torch.equal(plain, after)


def test_masked_loss_takes_ids_or_batches_and_names_a_bad_head():
    model, idx = tiny_gpt(), tokens()
    batches = [(idx[:, :-1], idx[:, 1:])]
    _, plain = model(*batches[0])
    assert masked_loss(model, idx, []) == pytest.approx(plain.item(), abs=1e-12)
    assert masked_loss(model, idx, [(0, 1)]) == masked_loss(model, batches, [[0, 1]])
    assert masked_loss(model, idx[0], []) == pytest.approx(model(idx[:1, :-1], idx[:1, 1:])[1].item(), abs=1e-12)
    with pytest.raises(ValueError, match=r"head \(layer 2, head 0\) does not exist; the model has layers 0..1"):
        masked_loss(model, idx, [(2, 0)])
    with pytest.raises(ValueError, match=r"token ids have shape \(1,\)"):
        masked_loss(model, idx[0, :1], [])


def test_gradient_importance_is_the_slope_of_the_loss_in_each_gate():
    model, idx = tiny_gpt(n_head=3, d_k=4), tokens(seed=2)
    batches = [(idx[:, :-1], idx[:, 1:])]
    raw, normalised = gradient_importance(model, batches)

    def loss64(gates):  # the model casts its loss to fp32; finite differences need fp64
        with torch.no_grad(), head_gates(model, gates):
            logits, _ = model(batches[0][0])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batches[0][1].flatten()).item()

    eps = 1e-5
    for layer, head in ((0, 0), (1, 2)):
        up, down = ones_gates(model).double(), ones_gates(model).double()
        up[layer, head] += eps
        down[layer, head] -= eps
        slope = (loss64(up) - loss64(down)) / (2 * eps)
        assert raw[layer, head].item() == pytest.approx(abs(slope), rel=1e-3)
    torch.testing.assert_close(normalised.norm(dim=1), torch.ones(2, dtype=normalised.dtype))


def test_single_head_effects_and_the_pruning_curve_agree_with_masked_loss():
    model, idx = tiny_gpt(n_head=3, d_k=4), tokens(seed=3)
    batches = [(idx[:, :-1], idx[:, 1:])]
    base, effects = single_head_effects(model, batches)
    assert effects[1, 2].item() == pytest.approx(masked_loss(model, batches, [(1, 2)]) - base, abs=1e-12)
    curve = pruning_curve(model, batches, -effects)  # most harmful-to-lose first, so the order is known
    assert [f for f, _ in curve] == pytest.approx([i / 6 for i in range(7)])
    first = divmod(int(effects.flatten().argmax()), 3)
    assert curve[1][1] == pytest.approx(masked_loss(model, batches, [first]), abs=1e-12)
    everything = [(layer, head) for layer in range(2) for head in range(3)]
    assert curve[0][1] == base and curve[-1][1] == pytest.approx(masked_loss(model, batches, everything), abs=1e-12)


def test_attention_statistics_of_uniform_attention_are_the_hand_values():
    model, T = tiny_gpt(n_head=2), 6
    with torch.no_grad():  # W_Q = W_K = 0: every score is 0, so each row is uniform over the t + 1 keys
        model.blocks[0].attn.qkv_proj.weight[: 2 * 16] = 0.0
    stats = attention_stats(model, [tokens(1, T - 1)[0], tokens(1, T - 1, seed=5)[0]])
    uniform = sum(1 / (t + 1) for t in range(1, T)) / (T - 1)  # weight on any one key, mean over rows 1..T-1
    assert stats.entropy[0].tolist() == pytest.approx([uniform_entropy(T)] * 2, abs=1e-6)
    assert stats.first_position[0].tolist() == pytest.approx([uniform] * 2, abs=1e-6)
    assert stats.previous_token[0].tolist() == pytest.approx([uniform] * 2, abs=1e-6)
    assert uniform_entropy(3) == pytest.approx((math.log(2) + math.log(3)) / 2)
    # Layer 1 keeps its random W_Q, W_K: no row is more diffuse than uniform, and it is not uniform.
    assert (stats.entropy[1] < uniform_entropy(T)).all() and (stats.previous_token[1] != uniform).all()
