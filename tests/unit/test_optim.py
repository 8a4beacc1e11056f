"""Optimizers and schedules: lr at known points of each shape, parameter groups by role, and the
Muon + AdamW pair acting as one optimizer (GradScaler, checkpoints)."""

import math

import pytest
import torch
from torch import nn

from model import GPT, GPTConfig
from rundir.checkpoint import load_checkpoint, restore_optimizer, save_checkpoint
from training import optim
from training.optim import (
    NS_COEFFICIENTS,
    MuonAdamW,
    OptimConfig,
    build_optimizer,
    fusable,
    lr_at,
    param_groups,
    set_lr,
)

TINY = GPTConfig(vocab_size=17, block_size=8, n_layer=2, n_head=2, d_model=16)


def cfg(**overrides) -> OptimConfig:
    return OptimConfig(**{"lr": 1.0, "min_lr": 0.1, "warmup_steps": 10, **overrides})


def test_warmup_is_linear_in_steps_whatever_the_progress():
    c = cfg(schedule="wsd")
    assert lr_at(0, 0.0, c) == pytest.approx(0.1)
    assert lr_at(4, 0.9, c) == pytest.approx(0.5)
    assert lr_at(9, 0.0, c) == pytest.approx(1.0)


def test_cosine_runs_from_lr_to_min_lr_over_progress():
    c = cfg()
    assert lr_at(10, 0.0, c) == pytest.approx(1.0)
    assert lr_at(10, 0.5, c) == pytest.approx(0.55)  # halfway down
    assert lr_at(10, 0.25, c) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_at(10, 1.0, c) == pytest.approx(0.1)
    assert lr_at(10, 1.7, c) == pytest.approx(0.1)  # past the end: the floor


@pytest.mark.parametrize(
    "cooldown,expected_mid",
    [("linear", 0.1 + 0.9 * 0.5), ("1-sqrt", 0.1 + 0.9 * (1 - math.sqrt(0.5)))],
)
def test_wsd_is_flat_then_cools_down_over_the_last_fraction(cooldown, expected_mid):
    c = cfg(schedule="wsd", cooldown_frac=0.2, cooldown=cooldown)
    assert lr_at(50, 0.3, c) == lr_at(50, 0.8, c) == pytest.approx(1.0)  # stable until 1 - cooldown_frac
    assert lr_at(50, 0.9, c) == pytest.approx(expected_mid)  # half-way through the cooldown
    assert lr_at(50, 1.0, c) == pytest.approx(0.1)
    assert lr_at(50, 0.85, c) > lr_at(50, 0.95, c)


def test_unknown_schedule_choices_are_refused():
    with pytest.raises(ValueError, match=r"optim.schedule='step' is unknown; choose one of: cosine, wsd"):
        OptimConfig(schedule="step").validate()
    with pytest.raises(ValueError, match=r"optim.cooldown='cosine' is unknown; choose one of: linear, 1-sqrt"):
        OptimConfig(cooldown="cosine").validate()
    with pytest.raises(ValueError, match=r"optim.cooldown_frac=0 is invalid; it must be in \(0, 1\]"):
        OptimConfig(cooldown_frac=0).validate()


@pytest.mark.parametrize("tie", [True, False])
def test_groups_by_role_cover_every_parameter_once(tie):
    model = GPT(GPTConfig(**{**TINY.__dict__, "tie_embeddings": tie, "bias": True}))
    groups = param_groups(model)
    ids = [id(p) for ps in groups.values() for p in ps]
    assert sorted(ids) == sorted(id(p) for p in model.parameters()) and len(ids) == len(set(ids))
    assert all(p.dim() == 2 for p in groups["hidden"]) and len(groups["hidden"]) == 4 * 2  # qkv, W_O, up, down
    assert all(p.dim() == 1 for p in groups["gain"])
    assert len(groups["embedding"]) == 2  # token and position tables (a tied head is the token table)
    assert [p is model.lm_head.weight for p in groups["head"]] == ([] if tie else [True])


@pytest.mark.parametrize("tie,head_lr", [(True, None), (True, 0.002), (False, None)])
def test_a_tied_head_takes_the_heads_lr_not_the_embeddings(tie, head_lr):
    # Defect: a tied GPT-2 (+debug=tiny model=gpt2) trained its table, which is also the output layer, at the
    # embeddings' 0.3: the val loss rose above uniform (7.7 -> 9.3 nats, ln 4096 = 8.3) and stayed there.
    model = GPT(GPTConfig(**{**TINY.__dict__, "tie_embeddings": tie}))
    cfg = OptimConfig(optimizer="muon", lr=0.003, embedding_lr=0.3, head_lr=head_lr)
    scales = {g["role"]: g["lr_scale"] for g in build_optimizer(model, cfg, "cpu").param_groups}
    expected = (head_lr or cfg.lr) / cfg.lr if tie else 0.3 / cfg.lr
    assert scales["embedding"] == pytest.approx(expected)


def test_a_bare_matrix_parameter_is_adamws_without_decay_not_muons():
    # A variant's own (H, H) mix of heads, a bare 2-D parameter starting as the identity, went to Muon, whose
    # weight decay pulled it towards zero: only nn.Linear weights are Muon's.
    model = GPT(GPTConfig(**TINY.__dict__))
    model.blocks[0].attn.mix = nn.Parameter(torch.eye(TINY.n_head))
    groups = param_groups(model)
    assert any(p is model.blocks[0].attn.mix for p in groups["gain"])
    assert all(any(p is m.weight for m in model.modules() if isinstance(m, nn.Linear)) for p in groups["hidden"])
    roles = {g["role"]: g for g in build_optimizer(model, OptimConfig(optimizer="muon"), "cpu").param_groups}
    assert any(p is model.blocks[0].attn.mix for p in roles["gain"]["params"]) and roles["gain"]["weight_decay"] == 0


def test_adamw_decays_matrices_but_not_embeddings_gains_or_biases():
    model = GPT(GPTConfig(**{**TINY.__dict__, "bias": True}))
    opt = build_optimizer(model, OptimConfig(weight_decay=0.1), "cpu")
    decay = {g["role"]: g["weight_decay"] for g in opt.param_groups}
    assert decay == {"hidden": 0.1, "embedding": 0.0, "gain": 0.0}
    opt = build_optimizer(model, OptimConfig(embedding_weight_decay=0.05), "cpu")
    assert {g["role"]: g["weight_decay"] for g in opt.param_groups}["embedding"] == 0.05


@pytest.mark.parametrize(
    "native_bf16, precision, ns_dtype",
    [(True, "bf16", torch.bfloat16), (True, "fp32", torch.float32), (False, "bf16", torch.float32)],
)
def test_newton_schulz_runs_in_bf16_only_in_a_bf16_run_on_a_cpu_that_has_it(
    monkeypatch, native_bf16, precision, ns_dtype
):
    # An AVX2-only CPU emulates bf16: its Newton-Schulz would take ~50x fp32's time. An fp32 run stays exact.
    monkeypatch.setattr(optim, "cpu_supports_bf16", lambda: native_bf16)
    model = GPT(GPTConfig(**TINY.__dict__))
    assert build_optimizer(model, OptimConfig(optimizer="muon"), "cpu", precision).ns_dtype == ns_dtype


def test_muon_takes_the_block_matrices_and_adamw_the_rest():
    model = GPT(GPTConfig(**{**TINY.__dict__, "tie_embeddings": False}))
    opt = build_optimizer(model, OptimConfig(optimizer="muon", lr=0.004, muon_lr=0.02), "cpu")
    assert isinstance(opt, MuonAdamW)
    hidden = [p for g in opt.param_groups if g["role"] == "hidden" for p in g["params"]]
    assert {id(p) for p in hidden} == {
        id(p) for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2
    }
    assert any(model.lm_head.weight is p for g in opt.param_groups if g["role"] == "head" for p in g["params"])
    set_lr(opt, 0.002)  # the schedule at half its peak: every group at half its own peak
    assert {g["role"]: g["lr"] for g in opt.param_groups} == pytest.approx(
        {"hidden": 0.01, "head": 0.002, "embedding": 0.002, "gain": 0.002}
    )


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_embedding_and_head_lrs_set_their_groups_peaks_and_the_gains_take_optim_lr(optimizer):
    model = GPT(GPTConfig(**{**TINY.__dict__, "tie_embeddings": False, "x0_mix": True}))
    cfg = OptimConfig(optimizer=optimizer, lr=0.004, muon_lr=0.02, embedding_lr=0.3, head_lr=0.008)
    opt = build_optimizer(model, cfg, "cpu")
    set_lr(opt, 0.002)  # half the peak: each group at half its own
    lrs = {g["role"]: g["lr"] for g in opt.param_groups}
    assert lrs["embedding"] == pytest.approx(0.15) and lrs["head"] == pytest.approx(0.004)
    assert lrs["gain"] == pytest.approx(0.002)
    gains = {id(p) for g in opt.param_groups if g["role"] == "gain" for p in g["params"]}
    assert id(model.x0_scales) in gains and id(model.resid_scales) in gains  # the residual mix's scalars
    assert lrs["hidden"] == pytest.approx(0.01 if optimizer == "muon" else 0.002)


@pytest.mark.parametrize("name", ["embedding_lr", "head_lr", "bigram_lr"])
@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), 1e6])
def test_embedding_head_and_bigram_lrs_refuse_bad_values(name, value):
    with pytest.raises(ValueError, match=rf"optim.{name}={value} is invalid"):
        OptimConfig(**{name: value}).validate()


def step(model: GPT, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler, seed: int) -> None:
    x = torch.randint(0, 17, (4, 8), generator=torch.Generator().manual_seed(seed))
    scaler.scale(model(x, x)[1]).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)


def muon_pair(seed: int) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = GPT(TINY)
    return model, build_optimizer(model, OptimConfig(optimizer="muon", lr=1e-2), "cpu")


def test_muon_adamw_trains():
    model, opt = muon_pair(0)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randint(0, 17, (4, 8), generator=torch.Generator().manual_seed(9))
    first = model(x, x)[1].item()
    for _ in range(20):
        step(model, opt, scaler, seed=9)
    assert all(not p.equal(b) for p, b in zip(model.parameters(), before, strict=True)), "a parameter never moved"
    assert model(x, x)[1].item() < first - 0.5


def test_grad_scaler_unscales_every_group_of_muon_adamw():
    (plain, plain_opt), (scaled, scaled_opt) = muon_pair(0), muon_pair(0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)  # a power of two: unscaling is exact
    x = torch.randint(0, 17, (4, 8), generator=torch.Generator().manual_seed(9))
    plain(x, x)[1].backward()
    scaler.scale(scaled(x, x)[1]).backward()
    scaler.unscale_(scaled_opt)
    for a, b in zip(scaled.parameters(), plain.parameters(), strict=True):
        assert a.grad.equal(b.grad)
    scaler.step(scaled_opt)
    plain_opt.step()
    for a, b in zip(scaled.parameters(), plain.parameters(), strict=True):
        assert a.equal(b)


def test_muon_adamw_round_trips_through_a_checkpoint(tmp_path):
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    model, opt = muon_pair(0)
    for i in range(3):
        step(model, opt, scaler, seed=i)
    path = save_checkpoint(tmp_path / "c.safetensors", model, opt, {"step": 3})
    fresh, fresh_opt = muon_pair(1)
    ckpt = load_checkpoint(path)
    fresh.load_state_dict(model.state_dict())
    restore_optimizer(fresh_opt, ckpt)
    assert fresh_opt.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    step(model, opt, scaler, seed=3)
    step(fresh, fresh_opt, scaler, seed=3)
    for a, b in zip(fresh.parameters(), model.parameters(), strict=True):
        assert a.equal(b)


def two_matrices_and_a_gain() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(*shape)) for shape in ((24, 8), (8, 24), (8,))]


def take_steps(params: list[torch.nn.Parameter], opt: torch.optim.Optimizer, steps: int = 3) -> None:
    for i in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(i * 10 + p.dim()))
        opt.step()


def test_muon_adamw_takes_torchs_muon_step_on_matrices_up_to_bf16_rounding():
    ours, theirs = two_matrices_and_a_gain()[:2], two_matrices_and_a_gain()[:2]
    muon = {"lr_scale": 1.0, "weight_decay": 0.1, "eps": 1e-7, "momentum": 0.95, "nesterov": True}
    muon |= {"ns_coefficients": NS_COEFFICIENTS, "ns_steps": 5, "role": "hidden"}
    take_steps(ours, MuonAdamW([{"params": ours, **muon}], lr=0.1, ns_dtype=torch.float32))
    take_steps(theirs, torch.optim.Muon(theirs, lr=0.1, weight_decay=0.1))  # Newton-Schulz in bf16
    for w, c, start in zip(ours, theirs, two_matrices_and_a_gain()[:2], strict=True):
        moved = (c - start).abs().max().item()
        assert moved > 0.1 and (w - c).abs().max().item() < 0.05 * moved


def test_muon_adamw_takes_torchs_adamw_step_on_the_other_groups():
    ours, theirs = two_matrices_and_a_gain(), two_matrices_and_a_gain()
    group = {"params": ours, "role": "gain", "lr_scale": 1.0, "weight_decay": 0.1, "betas": (0.9, 0.99), "eps": 1e-8}
    take_steps(ours, MuonAdamW([group], lr=0.01, ns_dtype=torch.float32))
    take_steps(theirs, torch.optim.AdamW(theirs, lr=0.01, betas=(0.9, 0.99), weight_decay=0.1, foreach=False))
    for w, c, start in zip(ours, theirs, two_matrices_and_a_gain(), strict=True):
        assert not c.equal(start)
        torch.testing.assert_close(w, c, rtol=0, atol=1e-7)


def test_adamw_updates_take_the_fused_kernel_for_plain_tensors_and_foreach_for_shards():
    class Shard:  # what marks FSDP's DTensors: a full_tensor() that gathers the shards
        device = torch.device("cpu")

        def full_tensor(self) -> None: ...

    params = two_matrices_and_a_gain()
    assert fusable(params) and not fusable([*params, Shard()])
    assert not fusable([torch.nn.Parameter(torch.zeros(2, device="meta"))])
    adamw = build_optimizer(GPT(GPTConfig(**TINY.__dict__)), cfg(optimizer="adamw"), "cpu")
    assert (adamw.defaults["fused"], adamw.defaults["foreach"]) == (True, None)


def test_matrices_of_one_shape_or_its_transpose_orthogonalised_as_a_batch_step_as_each_would_alone():
    def muon(params):
        group = {"params": params, "role": "hidden", "lr_scale": 1.0, "weight_decay": 0.1, "eps": 1e-7}
        group |= {"momentum": 0.95, "nesterov": True, "ns_coefficients": NS_COEFFICIENTS, "ns_steps": 5}
        return MuonAdamW([group], lr=0.1, ns_dtype=torch.float32)

    def matrices():  # two tall and one wide of the transposed shape (one batch), one of another shape
        torch.manual_seed(0)
        return [torch.nn.Parameter(torch.randn(*shape)) for shape in ((24, 8), (8, 24), (24, 8), (8, 16))]

    def grad(i, step, shape):  # each matrix its own gradients, so a mixed-up batch would show
        return torch.randn(shape, generator=torch.Generator().manual_seed(100 * i + step))

    together = matrices()
    opt = muon(together)
    for step in range(3):
        for i, p in enumerate(together):
            p.grad = grad(i, step, p.shape)
        opt.step()
    for i, start in enumerate(matrices()):
        opt = muon([start])
        for step in range(3):
            start.grad = grad(i, step, start.shape)
            opt.step()
        assert not start.equal(matrices()[i])
        torch.testing.assert_close(together[i], start, rtol=0, atol=1e-5)


def test_the_removed_muon_and_gain_knobs_are_refused_as_unknown_keys():
    from hydra.errors import ConfigCompositionException

    from tests.helpers import compose_config

    for override in ("optim.normuon_beta2=0.95", "optim.gain_lr=0.05"):
        with pytest.raises(ConfigCompositionException, match=f"Could not override '{override.split('=')[0]}'"):
            compose_config([override])
