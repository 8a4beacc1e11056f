"""The architecture knobs of GPTConfig: each changes what it says, keeps the parameter and FLOP
counts right, and GPT-2 export refuses the ones GPT-2 cannot express."""

import math

import pytest
import torch

from cli.config import to_train_config
from interop.hf_model import check_gpt2_compatible
from model import GPT, GPTConfig
from model.block import MLP, gelu_tanh
from tests.helpers import compose_config, hand_count

V, T, L, H, D = 64, 16, 2, 2, 32


def tiny(**overrides) -> GPTConfig:
    return GPTConfig(**{"vocab_size": V, "block_size": T, "n_layer": L, "n_head": H, "d_model": D, **overrides})


def gpt2_count(F: int = 4 * D) -> int:
    return hand_count(V, T, L, H, D // H, D, F, bias=False)


@pytest.mark.parametrize(
    "activation,expected",
    [
        ("gelu_tanh", lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
        ("gelu", torch.nn.functional.gelu),
        ("relu2", lambda x: torch.relu(x) ** 2),
    ],
)
def test_activation_is_the_named_function(activation, expected):
    torch.manual_seed(0)
    mlp = MLP(tiny(activation=activation))
    x = torch.randn(2, 3, D)
    torch.testing.assert_close(mlp(x), mlp.down_proj(expected(mlp.up_proj(x))))


def test_gelu_tanh_is_the_same_function_in_its_compiled_form(monkeypatch):
    """Compiled, gelu_tanh is written x sigmoid(2u) (model/block.py): in float64 its values and gradients are
    PyTorch's tanh-form op's to 1e-12, over the range an activation takes."""
    x = torch.linspace(-12, 12, 4001, dtype=torch.float64).requires_grad_()
    eager = gelu_tanh(x)
    (eager_grad,) = torch.autograd.grad(eager.sum(), x)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    written = gelu_tanh(x)
    (written_grad,) = torch.autograd.grad(written.sum(), x)
    assert not torch.equal(written, eager)  # the other expression ran (it rounds differently)
    torch.testing.assert_close(written, eager, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(written_grad, eager_grad, rtol=1e-12, atol=1e-12)


def test_relu2_trains_a_different_model_than_gelu():
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    a = GPT(tiny())(idx)[0]
    torch.manual_seed(0)
    b = GPT(tiny(activation="relu2"))(idx)[0]
    assert not torch.allclose(a, b)


@pytest.mark.parametrize(
    "overrides,expected",
    [
        ({}, gpt2_count()),
        ({"tie_embeddings": False}, gpt2_count() + V * D),  # the head's own (vocab, d_model) matrix
        ({"d_ff": 40}, gpt2_count(F=40)),
        ({"norm": "rmsnorm"}, gpt2_count()),  # a gain each, like LayerNorm without bias
        ({"zero_init_proj": True, "logit_softcap": 30.0}, gpt2_count()),
    ],
)
def test_parameter_count_for_each_knob(overrides, expected):
    assert GPT(tiny(**overrides)).num_params() == expected


def test_untied_head_is_its_own_parameter_and_initialised_like_a_linear():
    torch.manual_seed(0)
    model = GPT(tiny(tie_embeddings=False, d_model=128))
    assert model.lm_head.weight is not model.tok_emb.weight
    assert model.lm_head.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_zero_init_proj_starts_every_block_as_the_identity():
    torch.manual_seed(0)
    model = GPT(tiny(zero_init_proj=True))
    for block in model.blocks:
        assert not block.attn.out_proj.weight.any() and not block.mlp.down_proj.weight.any()
        assert block.attn.qkv_proj.weight.std().item() == pytest.approx(0.02, rel=0.2)
        x = torch.randn(2, 5, D)
        torch.testing.assert_close(block(x), x)


def test_rmsnorm_replaces_every_layernorm():
    model = GPT(tiny(norm="rmsnorm", bias=True))
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    assert sum(isinstance(m, torch.nn.RMSNorm) for m in model.modules()) == 2 * L + 1


def test_logit_softcap_bounds_the_logits():
    torch.manual_seed(0)
    model = GPT(tiny(logit_softcap=2.0))
    with torch.no_grad():
        model.lm_head.weight.mul_(100)  # logits far beyond the cap
        logits, _ = model(torch.randint(0, V, (2, T)))
    assert logits.abs().max().item() <= 2.0
    assert logits.abs().max().item() > 1.9  # and the cap is reached, so the tanh did the bounding


def test_logit_softcap_is_computed_in_fp32_under_bf16_autocast():
    # Defect: under autocast the head's bf16 logits were capped in bf16, each capped logit rounded to 8 bits
    # of mantissa (steps of 0.06 near a cap of 15) before the loss; torch.compile computed it in fp32, so
    # the compiled and the eager run trained different models (docs/evidence/recipe/round9.md).
    torch.manual_seed(0)
    model = GPT(tiny(logit_softcap=15.0))
    with torch.no_grad():
        model.lm_head.weight.mul_(50)  # logits near the cap, where bf16's steps are coarsest
    heads = []
    model.lm_head.register_forward_hook(lambda module, args, out: heads.append(out))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits, _ = model(torch.randint(0, V, (2, T)))
    (raw,) = heads
    assert raw.dtype == torch.bfloat16 and logits.dtype == torch.float32
    assert torch.equal(logits, 15.0 * torch.tanh(raw.float() / 15.0))


@pytest.mark.parametrize(
    "name,value",
    [("activation", "gelu"), ("activation", "relu2"), ("norm", "rmsnorm"), ("norm", "batch")],
)
def test_unknown_and_known_choices(name, value):
    cfg = tiny(**{name: value})
    if value == "batch":
        with pytest.raises(ValueError, match=r"model.norm='batch' is unknown; choose one of: layernorm, rmsnorm"):
            cfg.validate()
    else:
        cfg.validate()


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"activation": "relu2"}, r"model.activation=relu2 \(GPT-2 has gelu_tanh\)"),
        ({"norm": "rmsnorm"}, r"model.norm=rmsnorm \(GPT-2 has layernorm\)"),
        ({"tie_embeddings": False}, r"model.tie_embeddings=false \(GPT-2 has true\)"),
        ({"logit_softcap": 30.0}, r"model.logit_softcap=30.0 \(GPT-2 has null\)"),
    ],
)
def test_gpt2_export_refuses_what_gpt2_cannot_express(overrides, message):
    with pytest.raises(ValueError, match=message):
        check_gpt2_compatible(tiny(**overrides))
    check_gpt2_compatible(tiny(zero_init_proj=True))  # an init-only knob exports fine


def test_gpt2_model_config_is_gpt2_and_exports():
    cfg = compose_config(["model=gpt2"]).model
    assert (cfg.pos_encoding, cfg.activation, cfg.norm, cfg.tie_embeddings, cfg.bias) == (
        "learned",
        "gelu_tanh",
        "layernorm",
        True,
        True,
    )
    check_gpt2_compatible(GPTConfig(**{**cfg, "vocab_size": 65}))
    small = compose_config(["model=gpt2_small"]).model
    assert (small.n_layer, small.d_model, small.block_size, small.bias) == (12, 768, 1024, True)


def test_nanogpt_baby_is_nanogpts_cpu_recipe():
    cfg = compose_config(["+experiment=nanogpt_baby"])
    m, o = cfg.model, cfg.optim
    assert (m.n_layer, m.n_head, m.d_model, m.block_size, m.dropout, m.bias) == (4, 4, 128, 64, 0.0, False)
    assert (m.pos_encoding, m.activation, m.tie_embeddings, m.norm) == ("learned", "gelu_tanh", True, "layernorm")
    assert (o.optimizer, o.lr, o.min_lr, o.warmup_steps, o.schedule, o.beta2) == (
        "adamw",
        1e-3,
        1e-4,
        100,
        "cosine",
        0.99,
    )
    assert (cfg.batch_size, cfg.precision, cfg.compile) == (12, "fp32", False)  # its command line: --compile=False
    assert math.isclose(o.embedding_weight_decay, o.weight_decay)  # nanoGPT decays every 2-D tensor


def test_the_default_run_is_the_measured_recipe():
    cfg = compose_config([])
    m, o = cfg.model, cfg.optim
    assert (m.n_layer, m.n_head, m.d_model, m.train_block_size, cfg.batch_size) == (4, 4, 128, 128, 12)
    assert (o.optimizer, o.lr, o.muon_lr, o.schedule, o.cooldown, o.cooldown_frac) == (
        "muon",
        3e-3,
        0.02,
        "wsd",
        "1-sqrt",
        0.6,  # docs/evidence/recipe/round18.md
    )
    assert (cfg.data.source, cfg.data.tokenizer, cfg.data.bpe_vocab_size) == ("shakespeare", "bpe", 4096)
    assert (cfg.data.bpe_dropout, cfg.data.bpe_dropout_copies) == (0.03, 8)  # docs/evidence/recipe/round8.md
    assert (m.pos_encoding, m.qk_norm, m.activation, m.tie_embeddings) == ("rope", True, "gelu_tanh", False)
    assert (m.attn_gate, o.embedding_lr) == ("elementwise", 0.3)  # docs/evidence/recipe/round3.md
    assert (o.muon_weight_decay, o.embedding_weight_decay) == (0.1, 0.01)  # docs/evidence/recipe/round4.md
    assert (o.average_from, o.average_window) == (0.7, 0.08)  # docs/evidence/recipe/round5.md
    assert cfg.compile is True  # docs/evidence/recipe/round9.md, its compilation inside budget_s
    assert (m.x0_mix, m.window_pattern, m.window_size) == (True, "SSSL", 64)  # docs/evidence/recipe/round10.md
    assert (m.long_window_size, m.train_block_size) == (128, 128)  # round14.md: trains on 128, reads more
    assert m.block_size == 4096  # docs/evidence/recipe/round20.md: scored in windows of 4,096, not 1,024
    assert (m.bigram_embeds, o.bigram_lr) == (8192, 3e-3)  # docs/evidence/recipe/round15.md
    assert (m.pointer_weight, m.pointer_scale) == (0.2, 15.0)  # docs/evidence/recipe/round23.md
    from bench.bench_quality import STARTUP_S

    # The README's figure is bench_quality's 300 s comparison: its recipes train 300 - STARTUP_S seconds, which
    # must be the default's own budget, so that figure is what `python train.py` does.
    assert cfg.budget_s == 300 - STARTUP_S == 280
    with pytest.raises(ValueError, match="pos_encoding"):  # so it does not export; model=gpt2 does
        check_gpt2_compatible(GPTConfig(**{**m, "vocab_size": 4096}))
    check_gpt2_compatible(GPTConfig(**{**compose_config(["model=gpt2"]).model, "vocab_size": 4096}))


@pytest.mark.parametrize(
    "experiment",
    ["noise_floor", "vaswani_a_default", "vaswani_b_default", "bottleneck_default", "bpe_budget", "nanochat_cpu"],
)
def test_recipes_measured_before_round_4_keep_muon_and_the_token_table_undecayed_and_unaveraged(experiment):
    # The default decays both (docs/evidence/recipe/round4.md) and averages the weights (round5.md); these recipes'
    # committed results were measured without, and with 4 layers, which they pin should the default's depth change.
    cfg = compose_config([f"+experiment={experiment}"])
    o = cfg.optim
    assert (o.muon_weight_decay, o.embedding_weight_decay, o.average_from) == (0.0, 0.0, None)
    assert cfg.model.n_layer == 4
    assert cfg.data.bpe_dropout == 0.0 or cfg.data.tokenizer != "bpe"  # the default trains on random segmentations
    assert cfg.compile is False  # the default compiles its step
    assert (cfg.model.x0_mix, cfg.model.window_pattern) == (False, None)  # the default's residual mix and windows
    assert cfg.model.bigram_embeds == 0  # the default's bigram table
    assert cfg.model.pointer_weight == 0.0  # the default's continuous cache
    # the default evaluates every 250 steps; nanochat's rebuild evaluates as the default does, so the two recipes of
    # bench_quality's headline comparison pay the same evaluations
    assert cfg.eval_interval == (250 if experiment == "nanochat_cpu" else 100)


def test_round_10s_default_is_round_17s_evaluating_every_100_steps():
    from bench.bench_quality import RECIPES

    round10, round17 = compose_config(RECIPES["round10"]), compose_config(RECIPES["round17"])
    assert (round10.eval_interval, round17.eval_interval) == (100, 250)
    assert {**round10, "eval_interval": 250, "model": round17.model} == {**round17}
    assert round10.model == compose_config(RECIPES["round13"]).model  # and scored in windows of 128


def test_round_13s_default_is_round_17s_with_a_context_of_128():
    from bench.bench_quality import RECIPES

    round13, round17 = compose_config(RECIPES["round13"]), compose_config(RECIPES["round17"])
    assert (round13.model.block_size, round13.model.train_block_size, round13.model.long_window_size) == (
        128,
        None,
        None,
    )
    round14 = {"block_size": 1024, "train_block_size": 128, "long_window_size": 128, "bigram_embeds": 8192}
    assert {**round13.model, **round14} == {**round17.model}
    assert {**round13, "model": round17.model} == {**round17}


def models_that_train_alike(new, old) -> list[GPT]:
    """Both model configs built from one seed, checked to give the same loss and every gradient to the last bit on
    a batch of `new`'s training sequences; returns the two models."""
    models = []
    for m in (new, old):
        torch.manual_seed(0)
        models.append(GPT(GPTConfig(**{**m, "vocab_size": V})))
    idx = torch.randint(0, V, (2, new.train_block_size + 1), generator=torch.Generator().manual_seed(1))
    losses = [model(idx[:, :-1], idx[:, 1:])[1] for model in models]
    for loss in losses:
        loss.backward()
    assert losses[0].item() == losses[1].item()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    return models


def test_round_14_trains_exactly_as_round_13_did():
    # docs/evidence/recipe/round14.md changes where the model is scored (windows of 1,024), not what it learns: on
    # its 128-token training sequences layer 3's window of 128 hides nothing and the longer RoPE table starts with
    # the same angles.
    from bench.bench_quality import RECIPES

    new, old = compose_config(RECIPES["round14"]).model, compose_config(RECIPES["round13"]).model
    models = models_that_train_alike(new, old)
    # past 128 tokens they part: layer 3 of the new one still sees 128 keys, the old one's every earlier key
    long = torch.randint(0, V, (1, 300), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        new_logits, old_logits = (model(long)[0] for model in models)
    torch.testing.assert_close(new_logits[:, :128], old_logits[:, :128], rtol=0, atol=1e-6)
    assert (new_logits[:, 200:] - old_logits[:, 200:]).abs().amax(-1).min() > 1e-4


def test_round_23_trains_what_round_22_did_and_only_predicts_with_the_continuous_cache():
    from bench.bench_quality import RECIPES

    new, old = compose_config(RECIPES["default"]).model, compose_config(RECIPES["round22"]).model
    assert {**new, "pointer_weight": 0.0} == {**old} and new.pointer_weight > 0
    models = models_that_train_alike(new, old)  # the same loss and gradients in training
    idx = torch.randint(0, V, (2, 64), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        scored = [model.eval()(idx[:, :-1], idx[:, 1:])[1] for model in models]
    assert scored[0] != scored[1]


def test_round_20_computes_what_round_19_did_on_any_length():
    # docs/evidence/recipe/round20.md only lengthens the context (the score's windows): every layer is windowed to at
    # most 128 keys and RoPE's angles depend on the position alone, so the two models are one function, trained
    # alike and reading alike.
    from bench.bench_quality import RECIPES

    new, old = compose_config(RECIPES["round22"]).model, compose_config(RECIPES["round19"]).model
    assert (new.block_size, old.block_size) == (4096, 1024)
    assert {**new, "block_size": 1024} == {**old}
    models = models_that_train_alike(new, old)
    long = torch.randint(0, V, (1, 1500), generator=torch.Generator().manual_seed(2))  # past the old context too
    with torch.no_grad():
        new_logits, old_logits = (model(long)[0] for model in models)
    torch.testing.assert_close(new_logits, old_logits, rtol=0, atol=1e-5)


def test_round_9s_default_is_round_17s_without_the_residual_mix_and_windows():
    from bench.bench_quality import RECIPES

    round9, round17 = compose_config(RECIPES["round9"]), compose_config(RECIPES["round17"])
    assert (round9.model.x0_mix, round9.model.window_pattern) == (False, None)
    round14 = {"block_size": 1024, "train_block_size": 128, "long_window_size": 128, "bigram_embeds": 8192}
    assert {**round9.model, "x0_mix": True, "window_pattern": "SSSL", **round14} == {**round17.model}
    assert (round9.optim, round9.data, round9.batch_size, round9.compile) == (
        round17.optim,
        round17.data,
        round17.batch_size,
        round17.compile,
    )


def test_round_8s_default_is_round_9s_eager():
    from bench.bench_quality import RECIPES

    round8, round9 = compose_config(RECIPES["round8"]), compose_config(RECIPES["round9"])
    assert (round8.compile, round9.compile) == (False, True)
    assert (round8.model, round8.optim, round8.data, round8.batch_size) == (
        round9.model,
        round9.optim,
        round9.data,
        round9.batch_size,
    )


def test_round_7s_default_is_round_9s_on_the_one_deterministic_segmentation():
    from bench.bench_quality import RECIPES

    round7, round9 = compose_config(RECIPES["round7"]), compose_config(RECIPES["round9"])
    assert (round7.data.bpe_dropout, round9.data.bpe_dropout) == (0.0, 0.03)
    assert not round7.compile
    assert (round7.model, round7.optim, round7.batch_size) == (round9.model, round9.optim, round9.batch_size)


def test_the_muon_rope_bpe_stack_is_spelled_once_and_is_what_the_noise_floor_trains():
    from bench.bench_quality import RECIPES

    # configs/recipe/muon_rope_bpe.yaml: the plain GPT with RoPE + QK-norm, Muon + WSD and the learned BPE;
    # bench_quality's round2 recipe is the same file
    round2, default = compose_config(RECIPES["round2"]), compose_config([])
    m, o = round2.model, round2.optim
    assert round2.data.bpe_dropout == 0.0
    undone = {**default.data, "bpe_dropout": 0.0}
    assert (m.n_layer, m.block_size, m.attn_gate, m.tie_embeddings, round2.batch_size) == (4, 64, None, True, 24)
    assert (o.embedding_lr, o.muon_weight_decay, o.embedding_weight_decay, o.average_from) == (None, 0.0, 0.0, None)
    assert (m.d_model, m.n_head, m.pos_encoding, o.muon_lr, round2.data) == (
        default.model.d_model,
        default.model.n_head,
        default.model.pos_encoding,
        default.optim.muon_lr,
        undone,
    )
    floor = compose_config(["+experiment=noise_floor"])
    assert (floor.model, floor.optim, floor.data, floor.batch_size) == (m, o, round2.data, round2.batch_size)


def test_the_baseline_and_the_committed_char_studies_stay_on_characters_and_learned_positions():
    for experiment in ("nanogpt_baby", "ablate_heads_dk_cpu", "gqa_cpu", "vaswani_a_cpu", "bpe_budget"):
        cfg = compose_config([f"+experiment={experiment}"])
        assert cfg.data.tokenizer == ("gpt2" if experiment == "bpe_budget" else "char"), experiment
        assert (cfg.model.pos_encoding, cfg.model.qk_norm) == ("learned", False), experiment
        assert cfg.compile is False, experiment  # as measured: each sweep job would compile a shape of its own
        assert (cfg.model.x0_mix, cfg.model.window_pattern) == (False, None), experiment
        assert cfg.model.pointer_weight == 0.0, experiment  # the default's continuous cache


def test_the_smoke_run_does_not_compile():
    # compiling the tiny model takes longer than its 20 steps
    assert compose_config(["+debug=tiny"]).compile is False


def test_bpe_budget_is_the_default_recipe_on_gpt2_bpe():
    cfg = compose_config(["+experiment=bpe_budget"])
    assert (cfg.data.tokenizer, cfg.batch_size, cfg.optim.warmup_steps, cfg.optim.optimizer) == ("gpt2", 12, 20, "muon")
    assert cfg.model.tie_embeddings and cfg.model.block_size == 64


@pytest.mark.parametrize("recipe", ["nanogpt_baby", "bpe_budget"])
def test_recipes_validate_as_single_runs(recipe, tmp_path):
    cfg = to_train_config(compose_config([f"+experiment={recipe}", f"out_dir={tmp_path}"]))
    assert cfg.model.block_size == 64


def test_every_bench_quality_recipe_composes_to_a_valid_run(tmp_path):
    from bench.bench_quality import RECIPES

    for overrides in RECIPES.values():  # a mistyped override would be refused here, not an hour into a run
        to_train_config(compose_config([*overrides, f"out_dir={tmp_path}"]))
    learned = compose_config(RECIPES["learned_positions"]).model
    assert (learned.pos_encoding, learned.qk_norm) == ("learned", False)


def test_bench_quality_with_no_recipes_named_runs_the_headline_pair_only():
    from bench.bench_quality import build_parser

    # the docstring's first command: the default against nanoGPT's recipe, not all 16 recipes for 80 minutes
    args = build_parser().parse_args([])
    assert (args.recipes, args.reference, args.budget) == (["default", "nanogpt_baby"], "nanogpt_baby", 300.0)


def test_round_15s_default_is_round_14s_with_the_bigram_table():
    from bench.bench_quality import RECIPES

    round14, round17 = compose_config(RECIPES["round14"]), compose_config(RECIPES["round17"])
    assert (round14.model.bigram_embeds, round17.model.bigram_embeds) == (0, 8192)
    assert {**round14.model, "bigram_embeds": 8192} == {**round17.model}
    assert {**round14, "model": round17.model} == {**round17}


def test_round_18s_default_is_round_17s_cooling_down_over_60_percent():
    from bench.bench_quality import RECIPES

    # bench_quality's round19 recipe cools down over 60%; round20 lengthened the context since
    round17, round19 = compose_config(RECIPES["round17"]), compose_config(RECIPES["round19"])
    assert (round17.optim.cooldown_frac, round19.optim.cooldown_frac) == (0.3, 0.6)
    assert {**round17, "optim": {**round17.optim, "cooldown_frac": 0.6}} == {**round19}


def test_an_activation_no_config_used_is_refused_by_name():
    # swiglu went (no config, study or benchmark chose it); a run or header that names it is told what is left
    allowed = r"choose one of: gelu_tanh, gelu, relu2$"
    with pytest.raises(ValueError, match=rf"model.activation='swiglu' is unknown; {allowed}"):
        GPTConfig(activation="swiglu").validate()
