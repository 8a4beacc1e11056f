"""Attention and position variants: GQA/MQA semantics and cache size, QK-norm, the sinusoid table,
mixed precision, old checkpoints, and the variant config through a real training run."""

import dataclasses
import math
from dataclasses import asdict, replace

import pytest
import torch
from omegaconf import OmegaConf

from analysis.trained import load_model
from cli.config import to_train_config
from generation.generate import SamplingParams, generate
from model import GPT, GPTConfig
from model import config as config_module
from model.attention import CausalSelfAttention
from model.kv_cache import kv_bytes_per_token, token_positions
from model.position import SinusoidalPositions, apply_rotary
from rundir.checkpoint import save_checkpoint
from rundir.run import check_same_model
from tests.helpers import ROOT, compose_config
from tests.variants import (
    BACKENDS,
    DEFAULT_RUN_SCALED,
    NOT_VARIANTS,
    VARIANT_HEADS,
    VARIANTS,
    refusal,
    variant_model,
    variant_pairs,
)
from training.setup import train

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 50


def make_model(backend: str = "sdpa", n_head: int = 6, d_k: int | None = 10, bias: bool = True, **variant) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=VOCAB, block_size=24, n_layer=2, n_head=n_head, d_model=48, d_k=d_k, bias=bias, attn_backend=backend
    )
    for key, value in variant.items():
        setattr(cfg, key, value)
    return GPT(cfg).eval()


def tokens(B: int = 2, T: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def test_n_kv_head_equal_to_n_head_is_plain_multi_head_attention():
    mha = make_model()
    gqa = make_model(n_kv_head=6)
    assert mha.state_dict().keys() == gqa.state_dict().keys()
    gqa.load_state_dict(mha.state_dict())  # same layout: Q | K | V, 6 heads each
    with torch.no_grad():
        assert torch.equal(gqa(tokens())[0], mha(tokens())[0])


def mha_equivalent_of(gqa: GPT) -> GPT:
    """An MHA model whose key/value head h is GQA's key/value head h // group: the same function."""
    mha = make_model(gqa.config.attn_backend)
    state = gqa.state_dict()
    H, H_kv, dk = gqa.config.n_head, gqa.config.kv_heads, gqa.config.head_dim
    group = H // H_kv
    for i in range(gqa.config.n_layer):
        for kind in ("weight", "bias"):
            name = f"blocks.{i}.attn.qkv_proj.{kind}"
            q, k, v = state[name].split([H * dk, H_kv * dk, H_kv * dk])
            k, v = (t.unflatten(0, (H_kv, dk)).repeat_interleave(group, 0).flatten(0, 1) for t in (k, v))
            state[name] = torch.cat([q, k, v])
    mha.load_state_dict(state)
    return mha


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "materialized"])
@pytest.mark.parametrize("n_kv_head", [3, 2, 1])
def test_grouped_query_attention_is_mha_with_shared_key_value_heads(backend, n_kv_head):
    gqa = make_model(backend, n_kv_head=n_kv_head)
    mha = mha_equivalent_of(gqa)
    with torch.no_grad():
        torch.testing.assert_close(gqa(tokens())[0], mha(tokens())[0], atol=1e-5, rtol=0)
        # the duplicated heads do carry different keys: dropping the sharing changes the output
        other = make_model(backend)
        assert (other(tokens())[0] - mha(tokens())[0]).abs().max() > 1e-3


@pytest.mark.parametrize("n_kv_head", [8, 4, 2, 1])
def test_kv_cache_bytes_shrink_by_n_head_over_n_kv_head(n_kv_head):
    model = make_model(n_head=8, d_k=6, n_kv_head=n_kv_head)
    cache = model.new_cache(batch_size=3, max_length=20)
    full = 2 * 2 * 3 * 8 * 20 * 6 * 4  # K and V, 2 layers, B 3, 8 heads, 20 slots, d_k 6, float32
    assert cache.nbytes == full * n_kv_head // 8
    assert cache.layers[0].keys.shape == (3, n_kv_head, 20, 6)
    with torch.no_grad():  # and the smaller cache is the one decoding fills
        model(tokens(3, 5), cache=cache)
    assert cache.layers[1].values[:, :, :5].abs().sum() > 0


@pytest.mark.parametrize("qk_norm", [True, False])
def test_qk_norm_makes_attention_blind_to_the_scale_of_queries_and_keys(qk_norm):
    model = make_model(qk_norm=qk_norm)
    with torch.no_grad():
        base = model(tokens())[0]
        for block in model.blocks:  # scale W_Q and W_K (and their biases) by 10
            q_and_k = 2 * model.config.n_head * model.config.head_dim
            block.attn.qkv_proj.weight[:q_and_k] *= 10
            block.attn.qkv_proj.bias[:q_and_k] *= 10
        change = (model(tokens())[0] - base).abs().max().item()
    if qk_norm:
        assert change < 1e-4
    else:
        assert change > 1e-2


def test_qk_norm_gives_unit_rms_heads_at_init():
    model = make_model(qk_norm=True)
    x = torch.randn(2, 5, 48) * 3
    q, k, _ = model.blocks[0].attn.project_qkv(x)
    for t in (q, k):
        rms = t.pow(2).mean(-1).sqrt()  # per head and position
        torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-3, rtol=0)


def test_sinusoid_table_is_the_papers_formula_for_any_position():
    table = SinusoidalPositions(6)(torch.tensor([[0, 1, 7, 1000]]))[0]  # (4, 6)
    assert table.dtype == torch.float32 and not list(SinusoidalPositions(6).parameters())
    for row, pos in enumerate((0, 1, 7, 1000)):
        for i in range(3):
            angle = pos / 10000 ** (2 * i / 6)
            assert table[row, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[row, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)
    odd = SinusoidalPositions(5)(torch.tensor([[3]]))
    assert odd.shape == (1, 1, 5) and odd[0, 0, 4].item() == pytest.approx(math.sin(3 / 10000 ** (4 / 5)), abs=1e-5)


def test_sinusoidal_model_adds_the_table_to_sqrt_d_model_scaled_token_embeddings():
    model = make_model(pos_encoding="sinusoidal")
    idx, positions = tokens(1, 5), torch.arange(5)[None]
    x, rotary = model.embed(idx, positions)
    expected = model.tok_emb(idx) * math.sqrt(48) + SinusoidalPositions(48)(positions)
    torch.testing.assert_close(x, expected)
    assert rotary is None and model.rotary is None


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_bf16_autocast_and_bf16_weights_run_every_variant(variant):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=VOCAB, block_size=24, n_layer=2, n_head=VARIANT_HEADS[0], d_model=48)
    for key, value in {"d_k": VARIANT_HEADS[1], **VARIANTS[variant]}.items():
        setattr(cfg, key, value)
    model = GPT(cfg).eval()
    idx = tokens()
    with torch.no_grad():
        _, fp32_loss = model(idx, idx)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, bf16_loss = model(idx, idx)
        assert bf16_loss.item() == pytest.approx(fp32_loss.item(), abs=0.05)
        weight, cfg.pointer_weight = cfg.pointer_weight, 0.0  # training has no continuous cache (model/pointer.py)
        _, plain_loss = model(idx, idx)
        cfg.pointer_weight = weight
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a training step: auto takes the materialized kernel
        _, train_loss = model.train()(idx, idx)
    train_loss.backward()
    assert train_loss.item() == pytest.approx(plain_loss.item(), abs=0.05)
    with torch.no_grad():
        model.eval().to(torch.bfloat16)  # the KV cache takes the weights' dtype
        out = generate(model, idx[:, :4], SamplingParams(8, temperature=0, top_k=None, seed=None))
    assert out.shape == (2, 12) and model.new_cache(1).layers[0].keys.dtype == torch.bfloat16


def test_checkpoint_without_the_new_fields_loads_as_gpt2(tmp_path):
    old_fields = {"vocab_size", "block_size", "n_layer", "n_head", "d_model", "d_k", "d_ff", "dropout", "bias"}
    model = make_model()
    old_config = {k: v for k, v in asdict(model.config).items() if k in old_fields | {"attn_backend"}}
    path = save_checkpoint(tmp_path / "old.safetensors", model, None, {"config": {"model": old_config}})
    loaded, _ = load_model(path)
    c = loaded.config
    assert (c.pos_encoding, c.n_kv_head, c.qk_norm) == ("learned", None, False)
    with torch.no_grad():
        assert torch.equal(loaded(tokens())[0], model(tokens())[0])


def test_variant_model_config_trains_and_its_checkpoint_reloads(tiny_run_overrides, tmp_path):
    # model=small_rope_gqa, shrunk to the tiny debug size (keeping its variant keys)
    overrides = ["model=small_rope_gqa", *tiny_run_overrides, "model.n_head=4", "model.d_model=32"]
    cfg = to_train_config(compose_config(overrides))
    assert (cfg.model.pos_encoding, cfg.model.n_kv_head, cfg.model.qk_norm) == ("rope", 2, True)
    metrics = train(cfg)
    assert math.isfinite(metrics["val/loss"])
    model, ckpt = load_model(tmp_path / "run" / "checkpoints" / "best.safetensors")
    assert model.config.pos_encoding == "rope" and model.blocks[0].attn.n_kv_head == 2
    assert ckpt.meta["config"]["model"]["qk_norm"] is True


def test_every_config_field_is_a_variant_the_proofs_run_over_or_said_not_to_be_one():
    # A new GPTConfig field with no line in tests/variants.py was proved by nothing: no test failed without it.
    in_variants = {key for overrides in VARIANTS.values() for key in overrides}
    missing = sorted({f.name for f in dataclasses.fields(GPTConfig)} - in_variants - NOT_VARIANTS)
    assert not missing, (
        f"GPTConfig.{', '.join(missing)} in no VARIANTS entry: add a line to tests/variants.py (docs/variants.md)"
    )
    assert not in_variants & NOT_VARIANTS


def test_the_default_run_variant_is_the_default_models_architecture():
    small = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "model" / "small.yaml"))
    shape = ("block_size", "train_block_size", "d_model")
    architecture = {key: value for key, value in small.items() if key not in shape}
    tested = VARIANTS["default_run"]
    assert set(tested) == set(architecture)
    assert {k: v for k, v in tested.items() if k not in DEFAULT_RUN_SCALED} == {
        k: v for k, v in architecture.items() if k not in DEFAULT_RUN_SCALED
    }
    assert all(architecture[k] not in (None, False, 0) for k in DEFAULT_RUN_SCALED)  # on in both, at another size


@pytest.mark.parametrize("backend,variant", [(b, v) for b in BACKENDS for v in VARIANTS])
def test_a_backend_that_cannot_compute_a_variant_refuses_naming_those_that_can(backend, variant):
    message = refusal(backend, variant)
    if backend == "explicit":  # the reference computes every variant
        assert message is None
    if message is None:
        return
    assert "\n" not in message and f"attn_backend={backend!r}" in message
    able = [b for b in BACKENDS if b in message.split("use ")[-1]]
    assert able and all(refusal(b, variant) is None for b in able), message


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_auto_picks_only_a_backend_that_computes_the_variant(variant):
    attn = CausalSelfAttention(GPTConfig(vocab_size=VOCAB, d_model=48, n_head=6, d_k=10, **VARIANTS[variant]))
    for length, training, dropout_p in [(16, True, 0.0), (16, False, 0.0), (9999, False, 0.0), (16, True, 0.1)]:
        picked = attn.kernel(torch.zeros(1, 6, length, 10, requires_grad=training), length, dropout_p)
        assert refusal(picked, variant) is None, f"auto picked {picked}, which refuses {variant}"
        assert dropout_p == 0.0 or picked != "materialized"  # it has no dropout


def test_a_new_score_change_that_only_the_equation_computes_runs_on_it_and_no_kernel(monkeypatch):
    # A variant that changes the scores, added to kernel()'s condition as the docs said, made `auto` pick the
    # materialized kernel, which ran without it: every kernel now takes a change only where SCORE_CHANGES says so.
    monkeypatch.setitem(config_module.SCORE_CHANGES, "attn_sinks", ("explicit",))  # as a new change would start
    for backend in ("sdpa", "materialized"):
        with pytest.raises(ValueError, match=rf"attn_backend='{backend}' \(the .*\) cannot; use explicit or auto$"):
            GPTConfig(attn_sinks=True, attn_backend=backend).validate()
    attn = CausalSelfAttention(GPTConfig(vocab_size=VOCAB, d_model=48, n_head=6, d_k=10, attn_sinks=True))
    for length, training in [(16, True), (16, False), (9999, False)]:
        assert attn.kernel(torch.zeros(1, 6, length, 10, requires_grad=training), length, 0.0) == "explicit"


def capture_heads(attn: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """The concatenated heads (B, T, H * d_k) that reach W_O in a forward pass of attn on x."""
    seen = []
    handle = attn.out_proj.register_forward_pre_hook(lambda _module, inputs: seen.append(inputs[0]))
    attn(x)
    handle.remove()
    return seen[0]


@pytest.mark.parametrize("gate,width", [("headwise", 6), ("elementwise", 6 * 10)])
def test_gated_attention_multiplies_each_head_by_a_sigmoid_of_the_input(gate, width):
    torch.manual_seed(0)
    shape = dict(d_model=48, n_head=6, d_k=10, attn_backend="explicit")
    gated, plain = CausalSelfAttention(GPTConfig(**shape, attn_gate=gate)), CausalSelfAttention(GPTConfig(**shape))
    plain.load_state_dict(gated.state_dict(), strict=False)  # the same W_Q, W_K, W_V, W_O
    assert gated.gate_proj.weight.shape == (width, 48)
    x = torch.randn(2, 7, 48)
    heads = capture_heads(plain, x).view(2, 7, 6, 10)
    gates = torch.sigmoid(gated.gate_proj(x)).view(2, 7, 6, -1)  # (B, T, H, 1 or d_k)
    torch.testing.assert_close(capture_heads(gated, x), (heads * gates).flatten(2))
    torch.testing.assert_close(gated(x), gated.out_proj((heads * gates).flatten(2)))
    assert (gated(x) - plain(x)).abs().max() > 1e-3  # the gate does change the output


def test_window_pattern_repeats_over_the_layers():
    cfg = GPTConfig(n_layer=6, window_pattern="SSSL", window_size=32)
    assert [cfg.layer_window(i) for i in range(6)] == [32, 32, 32, None, 32, 32]
    assert GPTConfig(n_layer=2).layer_window(1) is None  # off: every layer sees the whole context
    model = GPT(GPTConfig(vocab_size=VOCAB, n_layer=6, n_head=2, d_model=16, window_pattern="SSSL", window_size=32))
    assert [block.attn.window for block in model.blocks] == [32, 32, 32, None, 32, 32]
    capped = GPTConfig(n_layer=4, window_pattern="SSSL", window_size=32, long_window_size=48)
    assert [capped.layer_window(i) for i in range(4)] == [32, 32, 32, 48]  # an L layer sees long_window_size keys
    assert GPTConfig(n_layer=2, long_window_size=48).layer_window(1) is None  # no pattern, no window at all


def test_a_sliding_window_hides_keys_before_it_and_nothing_else():
    model = make_model("explicit", window_pattern="S", window_size=5)
    idx = tokens(1)
    with torch.no_grad():
        base = model(idx)[0]
        changed = idx.clone()
        changed[0, 0] = (changed[0, 0] + 1) % VOCAB
        logits = model(changed)[0]
    # two layers of 5 keys: position t reads back to t - 8, so token 0 reaches positions 0-8 only
    assert (logits[0, :9] - base[0, :9]).abs().max() > 1e-4
    assert torch.equal(logits[0, 9:], base[0, 9:])


def test_attention_sinks_start_at_zero_and_learn():
    model = make_model("materialized", attn_sinks=True).train()
    sinks = [block.attn.sinks for block in model.blocks]
    assert all(s.shape == (6,) and not s.any() for s in sinks)
    assert model.num_params() == make_model().num_params() + 2 * 6  # one logit per head and layer
    model(tokens(), tokens())[1].backward()
    assert all(s.grad.abs().min() > 0 for s in sinks)


def test_value_embeddings_add_a_gated_token_embedding_of_their_own_to_the_values():
    model = make_model("explicit", value_embeds=True, n_kv_head=2)
    attn = model.blocks[0].attn
    assert attn.value_embed.weight.shape == (VOCAB, 2 * 10) and attn.value_gate.weight.shape == (2, 48)
    per_layer = VOCAB * 2 * 10 + 2 * 48 + 2  # the table, the gate's weight and bias
    assert model.num_params() == make_model(n_kv_head=2).num_params() + 2 * per_layer
    assert model.num_params(exclude_embeddings=True) == make_model(n_kv_head=2).num_params(True) + 2 * (2 * 48 + 2)
    idx = tokens(2, 8)
    cache = model.new_cache(2, 8)
    with torch.no_grad():
        model(idx, cache=cache)  # the cache keeps the values the queries read
        x = model.blocks[0].ln_1(model.embed(idx, token_positions(8))[0])
        _, _, v = attn.project_qkv(x)  # (B, H_kv, T, d_k)
        gate = 2 * torch.sigmoid(attn.value_gate(x))  # (B, T, H_kv)
        ve = attn.value_embed(idx).view(2, 8, 2, 10)  # (B, T, H_kv, d_k)
    torch.testing.assert_close(cache.layers[0].values[:, :, :8], v + (gate[..., None] * ve).transpose(1, 2))
    assert (gate - 1).abs().max() < 0.2  # the gate starts near 1


def test_the_new_attention_variants_train_together_and_their_checkpoint_reloads(tiny_run_overrides, tmp_path):
    knobs = {"attn_gate": "elementwise", "attn_softcap": 30.0, "attn_sinks": True, "window_pattern": "SL"}
    knobs |= {"window_size": 8, "value_embeds": True}
    overrides = [
        *tiny_run_overrides,
        "model.n_head=4",
        "model.d_model=32",
        *(f"model.{k}={v}" for k, v in knobs.items()),
    ]
    metrics = train(to_train_config(compose_config(overrides)))
    assert math.isfinite(metrics["val/loss"])
    model, ckpt = load_model(tmp_path / "run" / "checkpoints" / "best.safetensors")
    assert {k: getattr(model.config, k) for k in knobs} == knobs == {k: ckpt.meta["config"]["model"][k] for k in knobs}
    assert model.blocks[0].attn.sinks.abs().sum() > 0  # trained away from 0


def test_differential_attention_reads_the_difference_of_two_maps_through_a_normed_head():
    torch.manual_seed(0)
    config = GPTConfig(d_model=16, n_head=2, d_k=8, attn_diff=True, attn_backend="explicit")
    attn = CausalSelfAttention(config, layer=2)
    diff = attn.differential
    assert diff.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * 2))  # the paper's schedule
    assert CausalSelfAttention(config, layer=0).differential.lambda_init == pytest.approx(0.2)
    with torch.no_grad():
        for vector, value in zip((diff.lq1, diff.lk1, diff.lq2, diff.lk2), (0.3, 0.2, -0.1, 0.4), strict=True):
            vector.fill_(value)
        diff.head_norm.weight.uniform_(0.5, 1.5)
    lam = math.exp(4 * 0.3 * 0.2) - math.exp(4 * -0.1 * 0.4) + diff.lambda_init  # vectors of d_k / 2 = 4
    torch.testing.assert_close(diff().item(), lam)
    x = torch.randn(2, 6, 16)
    q, k, v = attn.project_qkv(x)  # (B, H, T, 8)
    hidden = torch.full((6, 6), float("-inf")).triu(1)
    first = (q[..., :4] @ k[..., :4].transpose(-2, -1) / 2 + hidden).softmax(-1)  # scaled by sqrt(d_k / 2)
    second = (q[..., 4:] @ k[..., 4:].transpose(-2, -1) / 2 + hidden).softmax(-1)
    heads = (first - lam * second) @ v
    heads = heads / heads.square().mean(-1, keepdim=True).add(1e-5).sqrt() * diff.head_norm.weight  # RMSNorm
    want = attn.out_proj((heads * (1 - diff.lambda_init)).transpose(1, 2).flatten(2))
    torch.testing.assert_close(attn(x), want)
    for backend in ("sdpa", "materialized"):  # the kernels: two maps as 2H heads, outputs subtracted
        other = CausalSelfAttention(replace(config, attn_backend=backend), layer=2)
        other.load_state_dict(attn.state_dict())
        torch.testing.assert_close(other(x), want)


def test_differential_lambda_starts_near_lambda_init_and_learns():
    model = make_model("materialized", d_k=12, attn_diff=True).train()
    for layer, block in enumerate(model.blocks):
        diff = block.attn.differential
        assert diff.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * layer))
        vectors = torch.cat([diff.lq1, diff.lk1, diff.lq2, diff.lk2])
        assert 0.05 < vectors.std().item() < 0.2  # N(0, 0.1), drawn in GPT.reset_parameters
        assert abs(diff().item() - diff.lambda_init) < 0.1
    per_layer = 4 * 6 + 12  # four lambda vectors of d_k / 2, the head norm's gains
    assert model.num_params() == make_model(d_k=12).num_params() + 2 * per_layer
    model(tokens(), tokens())[1].backward()
    assert all(block.attn.differential.lq1.grad.abs().min() > 0 for block in model.blocks)


def test_latent_attention_reads_keys_and_values_up_projected_from_the_cached_latent():
    """DeepSeek-V2 on a tiny layer: c = x W_DKV, K = c W_UK, V = c W_UV, and a rope key shared by the heads."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=VOCAB, block_size=8, n_layer=1, n_head=2, d_model=16, d_k=8, attn_backend="explicit")
    model = GPT(replace(cfg, mla_latent=5, pos_encoding="rope", n_kv_head=1)).eval()  # d_R = d_k / 2 = 4
    attn, T = model.blocks[0].attn, 6
    idx = tokens(2, T)
    x, rotary = model.embed(idx, token_positions(T))
    x = model.blocks[0].ln_1(x)
    w_q, w_dkv, w_kr = attn.qkv_proj.weight.split([2 * 12, 5, 4])  # W_Q | W_QR per head, W_DKV, W_KR
    w_uk, w_uv = attn.kv_up_proj.weight.split([8, 8])
    c = x @ w_dkv.T  # (B, T, 5): the latent
    k_rope = apply_rotary((x @ w_kr.T)[:, None], rotary)[:, 0]  # (B, T, 4)
    k, v = c @ w_uk.T, c @ w_uv.T  # (B, T, 8): one key/value head for both query heads
    heads = []
    for q in (x @ w_q.T).split(12, dim=-1):  # each head: 8 content channels, then 4 rope ones
        q_rope = apply_rotary(q[:, None, :, 8:], rotary)[:, 0]
        scores = (q[..., :8] @ k.transpose(-2, -1) + q_rope @ k_rope.transpose(-2, -1)) / math.sqrt(8 + 4)
        heads.append((scores + torch.full((T, T), float("-inf")).triu(1)).softmax(-1) @ v)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, rotary=rotary), attn.out_proj(torch.cat(heads, dim=-1)))
        cache = model.new_cache(2, 8)
        model(idx, cache=cache)
    layer = cache.layers[0]
    assert layer.keys.shape == (2, 1, 8, 5 + 4) and layer.values.numel() == 0  # the latent and rope key, no V
    torch.testing.assert_close(layer.keys[:, 0, :T], torch.cat([c, k_rope], dim=-1))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_kv_bytes_per_token_is_what_the_cache_holds_for_a_token(variant):
    cfg = GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=VARIANT_HEADS[0], d_model=48, d_k=VARIANT_HEADS[1])
    cfg = replace(cfg, **VARIANTS[variant])
    assert kv_bytes_per_token(cfg, torch.float32) == GPT(cfg).new_cache(1, 1).nbytes
    assert kv_bytes_per_token(cfg, torch.bfloat16) == GPT(cfg).to(torch.bfloat16).new_cache(1, 1).nbytes


def test_latent_cache_is_smaller_than_gqa_at_the_default_shape():
    default = GPTConfig()  # d_model 256, 4 heads of 64, 4 layers
    per_layer = {
        "mha": (default, 2 * 4 * 64),
        "gqa 2": (replace(default, n_kv_head=2), 2 * 2 * 64),
        "mla 64": (replace(default, mla_latent=64), 64),
        "mla 64 + rope key": (replace(default, mla_latent=64, pos_encoding="rope"), 64 + 32),
    }
    for name, (cfg, numbers) in per_layer.items():
        assert kv_bytes_per_token(cfg, torch.bfloat16) == 4 * numbers * 2, name


@pytest.mark.parametrize("knobs", [{"attn_diff": True}, {"mla_latent": 16}])
def test_gpt2_export_refuses_differential_and_latent_attention_in_one_line(knobs):
    pytest.importorskip("transformers")
    from interop.hf_model import to_hf_gpt2

    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=24, n_layer=2, n_head=4, d_model=48, bias=True, **knobs))
    ((name, value),) = knobs.items()
    shown = str(value).lower()  # as a Hydra override writes it
    with pytest.raises(ValueError, match=rf"^the model cannot be exported to GPT-2: model.{name}={shown} .*{name}="):
        to_hf_gpt2(model)  # the knob, named with the value that exports


@pytest.mark.parametrize("field,value", [("attn_diff", True), ("mla_latent", 16)])
def test_resume_refuses_a_checkpoint_without_the_same_attention(field, value):
    saved = asdict(GPTConfig())
    with pytest.raises(ValueError, match=rf"has model\.{field}=.* but this run has model\.{field}={value!r}; resume"):
        check_same_model(saved, {**saved, field: value}, "checkpoint 'x'")


@pytest.mark.parametrize("knobs,refused", variant_pairs())
def test_every_parameter_of_every_variant_and_pair_of_variants_gets_a_gradient(knobs, refused):
    """One backward on random tokens reaches every parameter: a variant whose code a path skips (a subclass that
    replaces the step applying it) keeps parameters that train to nothing. variant_model moves every parameter
    away from its start, so a gate or a sink at zero, which passes no gradient on to what feeds it, cannot hide
    a parameter behind it. A pair the config refuses says so in one line."""
    if refused is not None:
        assert "\n" not in refused and refused.startswith("model."), refused
        return
    model = variant_model("explicit", *VARIANT_HEADS, knobs, VOCAB, block_size=16).train()
    idx = tokens(2, 16)
    _, loss = model(idx, targets=idx.roll(-1, dims=1))
    loss.backward()
    no_gradient = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    not_finite = [name for name, p in model.named_parameters() if p.grad is not None and not p.grad.isfinite().all()]
    assert not no_gradient, f"no gradient reaches {no_gradient}"
    assert not not_finite, f"non-finite gradients in {not_finite}"


def test_a_subclass_of_the_attention_replaces_only_its_hooks():
    """The path from x to what the heads attend (`project_qkv`, `forward`, `weights`) is written once, so a variant
    written in it runs under every attention class; a subclass that replaced it would skip the variant."""
    import model.latent_attention  # noqa: F401  (registers MultiHeadLatentAttention as a subclass)

    subclasses = CausalSelfAttention.__subclasses__()
    assert subclasses, "MultiHeadLatentAttention is a subclass of CausalSelfAttention"
    for subclass in subclasses:
        replaced = {name for name in vars(subclass) if callable(getattr(CausalSelfAttention, name, None))}
        assert replaced - {"__init__"} <= set(CausalSelfAttention.HOOKS), f"{subclass.__name__} replaces {replaced}"
