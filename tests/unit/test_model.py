"""The GPT: shapes, init, accounting of parameters and FLOPs, config validation, learning."""

import math

import pytest
import torch

from model import GPT, GPTConfig
from tests.helpers import hand_count


def tiny(**overrides) -> GPTConfig:
    base = dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, d_model=32)
    return GPTConfig(**{**base, **overrides})


def test_forward_shapes_and_loss():
    model = GPT(tiny())
    idx = torch.randint(0, 64, (3, 16))
    logits, loss = model(idx)
    assert logits.shape == (3, 16, 64) and loss is None
    _, loss = model(idx, idx)
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_loss_at_init_is_near_uniform():
    torch.manual_seed(0)
    model = GPT(tiny(vocab_size=500, d_model=64))
    g = torch.Generator().manual_seed(0)
    idx, targets = torch.randint(0, 500, (8, 16), generator=g), torch.randint(0, 500, (8, 16), generator=g)
    _, loss = model(idx, targets)
    assert abs(loss.item() - math.log(500)) < 0.05


def test_ignore_index_excludes_targets():
    model = GPT(tiny())
    idx = torch.randint(0, 64, (2, 16))
    targets = idx.clone()
    targets[:, 8:] = -1
    logits, loss = model(idx, targets)
    expected = torch.nn.functional.cross_entropy(logits[:, :8].reshape(-1, 64), idx[:, :8].reshape(-1))
    torch.testing.assert_close(loss, expected)


def test_sequence_longer_than_block_size_is_refused():
    with pytest.raises(ValueError, match="sequence length 17 exceeds the model's block_size 16"):
        GPT(tiny())(torch.zeros(1, 17, dtype=torch.long))


def test_head_is_tied_to_token_embedding():
    model = GPT(tiny())
    assert model.lm_head.weight is model.tok_emb.weight


def test_residual_projections_get_scaled_init():
    torch.manual_seed(0)
    model = GPT(tiny(n_layer=8, d_model=128))
    expected = 0.02 / math.sqrt(2 * 8)
    for block in model.blocks:
        for layer in (block.attn.out_proj, block.mlp.down_proj):
            assert layer.weight.std().item() == pytest.approx(expected, rel=0.1)
        assert block.attn.qkv_proj.weight.std().item() == pytest.approx(0.02, rel=0.1)


@pytest.mark.parametrize(
    "n_head,d_k,bias,variant",
    [
        (4, None, False, {}),
        (3, 10, False, {}),
        (8, 32, True, {}),
        (2, 7, True, {}),
        (8, 32, True, {"n_kv_head": 2}),
        (6, 10, False, {"n_kv_head": 1, "qk_norm": True}),
        (4, None, True, {"pos_encoding": "rope", "n_kv_head": 2}),
        (3, 10, False, {"pos_encoding": "sinusoidal", "qk_norm": True}),
    ],
)
def test_parameter_count_matches_hand_computation(n_head, d_k, bias, variant):
    cfg = tiny(n_head=n_head, d_k=d_k, bias=bias, d_model=48, n_layer=3, **variant)
    model = GPT(cfg)
    dk = d_k or 48 // n_head
    learned = variant.get("pos_encoding", "learned") == "learned"
    expected = hand_count(
        64, 16, 3, n_head, dk, 48, 4 * 48, bias, variant.get("n_kv_head"), variant.get("qk_norm", False), learned
    )
    assert model.num_params() == expected
    position_table = 16 * 48 if learned else 0
    assert model.num_params(exclude_embeddings=True) == model.num_params() - 64 * 48 - position_table


@pytest.mark.parametrize("n_head,d_k,n_kv_head", [(4, None, None), (3, 10, None), (8, 32, None), (8, 32, 2), (6, 8, 1)])
def test_flops_per_token_matches_hand_computation(n_head, d_k, n_kv_head):
    cfg = tiny(n_head=n_head, d_k=d_k, d_model=48, n_layer=3, block_size=20, n_kv_head=n_kv_head)
    dk = d_k or 48 // n_head
    HD = n_head * dk
    QKV = (n_head + 2 * (n_kv_head or n_head)) * dk  # GQA: fewer key/value heads to project
    # forward per token: QKV, W_O, MLP up+down, QK^T and AV over 20 positions, then the LM head
    forward = 3 * (2 * 48 * QKV + 2 * HD * 48 + 2 * 2 * 48 * 192 + 2 * 2 * 20 * HD) + 2 * 48 * 64
    assert GPT(cfg).flops_per_token() == 3 * forward
    assert GPT(cfg).flops_per_token(seq_len=10) < 3 * forward


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"n_head": 0}, r"model.n_head=0 is invalid; it must be >= 1"),
        ({"n_layer": -1}, r"model.n_layer=-1 is invalid"),
        ({"d_k": 0}, r"model.d_k=0 is invalid"),
        ({"d_model": 384, "n_head": 5}, r"model.d_model \(384\) must be divisible by model.n_head \(5\)"),
        ({"dropout": 1.0}, r"model.dropout=1.0 is invalid; it must be in \[0, 1\)"),
        ({"attn_backend": "flash"}, r"'flash' is unknown; choose one of: auto, explicit, sdpa, materialized"),
        ({"attn_backend": "materialized", "dropout": 0.1}, r"'materialized' has no attention dropout"),
        ({"block_size": 0}, r"model.block_size=0 is invalid"),
        ({"pos_encoding": "alibi"}, r"model.pos_encoding='alibi' is unknown; choose one of: learned, sinusoidal, rope"),
        ({"pos_encoding": "rope", "n_head": 2, "d_k": 5}, r"the head dim \(5\) must be even"),
        ({"pos_encoding": "rope", "d_model": 30, "n_head": 2}, r"the head dim \(15\) must be even"),
        ({"rope_base": 1.0}, r"model.rope_base=1.0 is invalid; it must be > 1"),
        ({"n_kv_head": 0}, r"model.n_kv_head=0 is invalid; it must be >= 1"),
        ({"n_head": 8, "n_kv_head": 3}, r"model.n_kv_head \(3\) must divide model.n_head \(8\)"),
        ({"n_head": 2, "n_kv_head": 4}, r"model.n_kv_head \(4\) must divide model.n_head \(2\)"),
        ({"attn_gate": "channel"}, r"model.attn_gate='channel' is unknown; choose one of: headwise, elementwise"),
        ({"attn_softcap": 0.0}, r"model.attn_softcap=0.0 is invalid; it must be a finite number > 0"),
        ({"attn_softcap": 30.0, "attn_backend": "sdpa"}, r"attn_backend='sdpa' .* use explicit, materialized or auto"),
        ({"attn_sinks": True, "attn_backend": "sdpa"}, r"model.attn_sinks=True changes the attention scores"),
        ({"window_pattern": "SXL"}, r"model.window_pattern='SXL' is invalid; it must be letters S .* and L"),
        ({"window_pattern": ""}, r"model.window_pattern='' is invalid"),
        ({"window_pattern": "SL", "window_size": 0}, r"model.window_size=0 is invalid; it must be >= 1"),
        (
            {"attn_diff": True, "d_k": 5},
            r"model.attn_diff=True splits each query and key head into two halves; .*\(5\)",
        ),
        (
            {"attn_diff": True, "pos_encoding": "rope", "d_k": 6},
            r"of each half of a head; the head dim \(6\) must be a",
        ),
        ({"mla_latent": 0}, r"model.mla_latent=0 is invalid; it must be >= 1 \(or null for off\)"),
        (
            {"mla_latent": 8, "pos_encoding": "rope", "d_k": 6},
            r"of MLA's rope key .* head dim \(6\) must be a multiple",
        ),
        ({"mla_latent": 8, "attn_diff": True}, r"model.attn_diff=True cannot be combined with model.mla_latent=8"),
        ({"mla_latent": 8, "value_embeds": True}, r"model.value_embeds=True cannot be combined with model.mla_latent"),
    ],
)
def test_invalid_config_is_refused_with_a_message(overrides, message):
    with pytest.raises(ValueError, match=message):
        GPT(tiny(**overrides))


def test_d_k_lifts_the_divisibility_rule():
    model = GPT(tiny(d_model=384, n_head=5, d_k=64, block_size=8, n_layer=1))
    assert model.blocks[0].attn.d_k == 64


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "materialized"])
def test_overfits_a_single_batch(backend):
    torch.manual_seed(0)
    model = GPT(tiny(attn_backend=backend))
    idx = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))
    x, y = idx[:, :-1], idx[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1


def test_same_seed_same_model_and_loss():
    def run():
        torch.manual_seed(123)
        model = GPT(tiny())
        idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(5))
        return model(idx, idx)[1]

    assert torch.equal(run(), run())


def test_x0_mix_starts_as_the_plain_model_and_mixes_the_embeddings_into_every_block_causally():
    torch.manual_seed(0)
    mixed = GPT(tiny(pos_encoding="rope", x0_mix=True)).eval()
    plain = GPT(tiny(pos_encoding="rope")).eval()
    assert mixed.num_params() == plain.num_params() + 2 * 2  # two scalars a layer
    plain.load_state_dict({k: v for k, v in mixed.state_dict().items() if not k.endswith("_scales")})
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(mixed(idx)[0], plain(idx)[0])  # scales 1 and 0: the plain residual stream
        mixed.resid_scales.copy_(torch.tensor([0.7, 1.3]))
        mixed.x0_scales.copy_(torch.tensor([0.5, -0.4]))
        logits = mixed(idx)[0]
        assert not torch.allclose(logits, plain(idx)[0], atol=1e-3)
        changed = idx.clone()
        changed[:, 10:] = (changed[:, 10:] + 1) % 64  # later tokens change: earlier logits may not
        assert torch.equal(mixed(changed)[0][:, :10], logits[:, :10])
        cache = mixed.new_cache(2)
        first, _ = mixed(idx[:, :9], cache=cache)
        rest, _ = mixed(idx[:, 9:], cache=cache)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), logits, rtol=1e-5, atol=1e-5)
