"""Weight averaging (training/average.py): the power-function EMA's weights, the swap in and out, and the
run's checkpoints: the average is what inference loads, the own weights what training continues from."""

import math

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


def averaged_over(weights: list[torch.Tensor], window: float, start: float = 0.0) -> torch.Tensor:
    """The average after stepping through `weights` as a run of len(weights) steps (step k at progress k/n)."""
    model = nn.Linear(4, 3, bias=False)
    average = WeightAverage(start, window)
    for i, w in enumerate(weights):
        with torch.no_grad():
            model.weight.copy_(w)
        average.update(model, progress=i / len(weights))
    with average.swapped_in(model):
        inside = model.weight.detach().clone()
    assert torch.equal(model.weight, weights[-1])  # its own weights again after the block
    return inside


def test_the_average_is_an_ema_of_the_steps_from_the_start_on():
    weights, window = snapshots(40), 0.1
    decay = math.exp(-1 / (40 * window))  # a step moves progress by 1/40
    expected = weights[20].double()  # the first step at progress >= 0.5 starts it
    for w in weights[21:]:
        expected = decay * expected + (1 - decay) * w.double()
    assert torch.allclose(averaged_over(weights, window, start=0.5).double(), expected, atol=1e-6)


def test_the_window_is_a_fraction_of_the_run_whatever_its_length():
    # A weight that grows with progress: the average lags it by the window (less a step's discreteness) in
    # runs of any length; a fixed decay a step would lag 60x more in progress in the 50-step run than in the 3000.
    for window in (0.05, 0.1):
        for steps in (50, 400, 3000):
            ramp = [torch.full((3, 4), i / steps) for i in range(steps)]
            lag = ramp[-1][0, 0].item() - averaged_over(ramp, window, start=0.3)[0, 0].item()
            assert abs(lag - window) < 1 / steps + 0.01 * window, (window, steps, lag)


def test_nothing_is_averaged_before_the_start_or_when_off():
    model = nn.Linear(4, 3)
    for start in (None, 0.9):
        average = WeightAverage(start, 0.1)
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
    assert ckpt.meta["average_progress"] == 0.9 and averaged.keys() == own.keys()  # steps 6-10 averaged
    assert any(not torch.equal(averaged[k], own[k]) for k in own)
    model, _ = load_model(out / "checkpoints" / "step_0000010.safetensors")  # what sample.py and the lab read
    assert all(torch.equal(v, averaged[k]) for k, v in model.state_dict().items() if k in averaged)
    first = load_checkpoint(out / "checkpoints" / "step_0000005.safetensors")
    assert first.meta["average_progress"] is None and not first.section("train.")  # before the average: as ever


def test_a_finished_run_continued_for_longer_averages_afresh_where_its_schedule_went_back(
    averaged_run, tiny_run_overrides
):
    continued = ["max_steps=30", "eval_interval=5", "optim.average_from=0.5", "resume=auto", "keep_last=null"]
    run_train([*tiny_run_overrides, *continued])
    back = load_checkpoint(averaged_run / "checkpoints" / "step_0000015.safetensors")  # progress 0.5 of 30
    assert back.meta["average_progress"] is None and not back.section("train.")
    end = load_checkpoint(averaged_run / "checkpoints" / "step_0000030.safetensors")
    assert end.meta["average_progress"] == pytest.approx(29 / 30) and end.section("train.")


def test_a_run_without_averaging_keeps_its_checkpoints_as_they_were(tiny_run_overrides, tmp_path):
    run_train([*tiny_run_overrides, "max_steps=4", "optim.average_from=null"])
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints" / "step_0000004.safetensors")
    assert not ckpt.section("train.") and ckpt.meta["average_progress"] is None
