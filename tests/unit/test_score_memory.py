"""Scoring in bounded memory: windows go as many at a time as SCORE_LOGIT_BYTES of logits allow, at least one."""

import importlib
from pathlib import Path

import pytest

from analysis.trained import load_model
from cli.config import to_train_config
from rundir.checkpoints import find_checkpoint
from tests.helpers import compose_config
from training.setup import train

full_val = importlib.import_module("analysis.full_val")


@pytest.mark.parametrize("windows", [1, 3])
def test_score_checkpoint_holds_the_logits_of_a_bounded_batch_of_windows(tiny_run_overrides, monkeypatch, windows):
    # Defect: every score took batches of 32K tokens: the default model (vocab 4096, windows of 4,096) peaked at 4.7 GB
    cfg = to_train_config(compose_config([*tiny_run_overrides, "max_steps=2", "sample_tokens=0"]))
    train(cfg)
    path = find_checkpoint(Path(cfg.out_dir))
    model = load_model(path)[0].config
    seen = []
    real = full_val.split_loss

    def recording(model, tokens, block_size, device, batch_tokens, precision_ctx=None):
        seen.append(batch_tokens // block_size)
        return real(model, tokens, block_size, device, batch_tokens, precision_ctx=precision_ctx)

    monkeypatch.setattr(full_val, "split_loss", recording)
    # fp32 logits of `windows` windows (one at the least, however small the bound)
    monkeypatch.setattr(full_val, "SCORE_LOGIT_BYTES", 4 * model.vocab_size * model.block_size * windows)
    scored = full_val.score_checkpoint(path)
    assert seen == [windows] and 0 < scored["val/bpb"] < 10
    monkeypatch.setattr(full_val, "SCORE_LOGIT_BYTES", 1)
    assert full_val.score_checkpoint(path)["val/loss"] == pytest.approx(scored["val/loss"], rel=1e-5)
    assert seen[-1] == 1
