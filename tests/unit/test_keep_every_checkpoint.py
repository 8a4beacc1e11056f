"""keep_last=null keeps every step checkpoint (head importance over training reads them all); a number keeps
the newest ones, and anything below 1 is refused in one line."""

import pytest
import torch

from model import GPT, GPTConfig
from rundir.checkpoints import CheckpointDir
from tests.helpers import tiny_config


def save_steps(checkpoints: CheckpointDir, steps: list[int]) -> list[str]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, d_model=8))
    for step in steps:
        checkpoints.save(model, None, {"step": step}, step, is_best=step == steps[0])
    return sorted(p.name for p in checkpoints.directory.iterdir())


@pytest.mark.parametrize(
    "keep_last,kept",
    [
        (None, [10, 20, 30, 40]),
        (2, [30, 40]),
        (1, [40]),
    ],
)
def test_keep_last_none_keeps_every_step_checkpoint_and_a_number_the_newest(tmp_path, keep_last, kept):
    names = save_steps(CheckpointDir(tmp_path, keep_last=keep_last), [10, 20, 30, 40])
    assert names == ["best.safetensors", *(f"step_{s:07d}.safetensors" for s in kept)]


def test_keep_last_null_composes_and_validates(tmp_path):
    assert tiny_config(tmp_path, "keep_last=null").keep_last is None  # tiny_config validates
    assert tiny_config(tmp_path, "keep_last=3").keep_last == 3


@pytest.mark.parametrize("value", ["0", "-2"])
def test_keep_last_below_one_is_one_line_naming_null(tmp_path, value):
    message = f"keep_last={value} is invalid; it must be >= 1, or null to keep every step checkpoint"
    with pytest.raises(ValueError, match=f"^{message}$"):
        tiny_config(tmp_path, f"keep_last={value}")
