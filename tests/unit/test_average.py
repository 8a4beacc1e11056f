"""Weight averaging (training/average.py): the power-function EMA's weights, the swap in and out, and the
run's checkpoints: the average is what inference loads, the own weights what training continues from."""

import pytest
import torch
from torch import nn

from analysis.trained import load_model
from rundir.checkpoint import load_checkpoint
from tests.helpers import run_train
from training.average import WeightAverage


def snapshots(n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 4, generator=g) for _ in range(n)]


def averaged_over(weights: list[torch.Tensor], power: float, start: float = 0.0) -> torch.Tensor:
    model = nn.Linear(4, 3, bias=False)
    average = WeightAverage(start, power)
    for i, w in enumerate(weights):
        with torch.no_grad():
            model.weight.copy_(w)
        average.update(model, progress=i / len(weights))
    with average.swapped_in(model):
        inside = model.weight.detach().clone()
    assert torch.equal(model.weight, weights[-1])  # its own weights again after the block
    return inside


def test_power_zero_is_the_plain_mean_of_the_averaged_steps():
    weights = snapshots(10)
    assert torch.allclose(averaged_over(weights, 0.0), torch.stack(weights).mean(0), atol=1e-6)
    assert torch.allclose(averaged_over(weights, 0.0, start=0.5), torch.stack(weights[5:]).mean(0), atol=1e-6)


def test_the_average_weighs_later_steps_by_about_t_to_the_power():
    weights, power = snapshots(400), 5.0
    t = torch.arange(1, 401, dtype=torch.float64) ** power
    expected = (t[:, None, None] * torch.stack(weights).double()).sum(0) / t.sum()
    assert torch.allclose(averaged_over(weights, power).double(), expected, atol=2e-3)
    assert not torch.allclose(averaged_over(weights, 0.0), averaged_over(weights, power), atol=1e-2)


def test_nothing_is_averaged_before_the_start_or_when_off():
    model = nn.Linear(4, 3)
    for start in (None, 0.9):
        average = WeightAverage(start, 5.0)
        average.update(model, progress=0.5)
        assert not average.active
        before = model.weight.detach().clone()
        with average.swapped_in(model):
            assert torch.equal(model.weight, before)


@pytest.fixture
def averaged_run(tiny_run_overrides, tmp_path):
    out = tmp_path / "run"
    run_train([*tiny_run_overrides, "max_steps=10", "eval_interval=5", "optim.average_from=0.5", f"out_dir={out}"])
    return out


def test_a_checkpoint_holds_the_average_as_its_model_and_its_own_weights_to_continue(averaged_run):
    out = averaged_run
    ckpt = load_checkpoint(out / "checkpoints" / "step_0000010.safetensors")
    averaged, own = ckpt.section("model."), ckpt.section("train.")
    assert ckpt.meta["averaged_steps"] == 5 and averaged.keys() == own.keys()
    assert any(not torch.equal(averaged[k], own[k]) for k in own)
    model, _ = load_model(out / "checkpoints" / "step_0000010.safetensors")  # what sample.py and the lab read
    assert all(torch.equal(v, averaged[k]) for k, v in model.state_dict().items() if k in averaged)
    first = load_checkpoint(out / "checkpoints" / "step_0000005.safetensors")
    assert first.meta["averaged_steps"] == 0 and not first.section("train.")  # before the average: as ever


def test_a_run_without_averaging_keeps_its_checkpoints_as_they_were(tiny_run_overrides, tmp_path):
    run_train([*tiny_run_overrides, "max_steps=4", "optim.average_from=null"])
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints" / "step_0000004.safetensors")
    assert not ckpt.section("train.") and ckpt.meta["averaged_steps"] == 0
