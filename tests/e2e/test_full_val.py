"""`ablation_report.py --full-val`: each run's best checkpoint scored on every held-out token, equal to a
plain loop over the val split written here, kept beside the run and scored again only when it changed."""

import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import analysis.full_val
from analysis.trained import load_model
from data.config import DataConfig
from data.prepare import prepare
from scripts.ablation_report import write_report
from tests.helpers import run_train


def every_token_loss(run) -> float:
    """The oracle: each val token after the first predicted once, from the block_size window it falls in."""
    model, ckpt = load_model(run / "checkpoints" / "best.safetensors")
    val = prepare(DataConfig(**ckpt.meta["config"]["data"]), progress=False).val
    ids = torch.from_numpy(np.array(val, dtype=np.int64))
    T, total, count = model.config.block_size, 0.0, 0
    for start in range(0, len(ids) - 1, T):
        x, y = ids[start : start + T], ids[start + 1 : start + 1 + T]
        x = x[: len(y)]
        with torch.no_grad():
            logits, _ = model(x[None])
        total += F.cross_entropy(logits[0].float(), y, reduction="sum").item()
        count += len(y)
    assert count == len(ids) - 1
    return total / count


@pytest.fixture
def sweep(tiny_run_overrides, tmp_path):
    base = [o for o in tiny_run_overrides if not o.startswith("out_dir=")]
    base += ["max_steps=6", "eval_interval=3", "sample_tokens=0", "precision=fp32"]
    for lr in ("1e-3", "1e-2"):
        for seed in (0, 1):
            run_train([*base, f"optim.lr={lr}", f"seed={seed}", f"out_dir={tmp_path / 'sweep' / f'lr{lr}_s{seed}'}"])
    return tmp_path / "sweep"


def row_losses(report: str) -> list[float]:
    rows = [line for line in report.splitlines() if line.startswith("| 0.0")]
    return [float(line.split("|")[8].split()[0]) for line in rows]


def test_full_val_rows_are_every_held_out_token_and_the_scores_are_kept(sweep, tmp_path, monkeypatch):
    loop = write_report(sweep, tmp_path / "loop").read_text()
    full = write_report(sweep, tmp_path / "full", full_val=True).read_text()
    assert "scored on every held-out token" in full and "scored on every held-out token" not in loop
    oracle = {}
    for run in sorted(sweep.iterdir()):
        saved = json.loads((run / "full_val.json").read_text())
        oracle[run.name] = every_token_loss(run)
        assert saved["score"]["val/loss"] == pytest.approx(oracle[run.name], rel=1e-5)
        assert saved["from"]["checkpoint"] == "best.safetensors"
    for lr, loss in zip(("1e-3", "1e-2"), row_losses(full), strict=True):
        mean = (oracle[f"lr{lr}_s0"] + oracle[f"lr{lr}_s1"]) / 2
        assert loss == pytest.approx(mean, abs=1.5e-4)  # the table prints 4 decimals
    assert row_losses(full) != row_losses(loop)  # 2 val batches are not the whole split
    raw = {r["run"]: r for r in map(json.loads, (tmp_path / "full" / "runs.jsonl").read_text().splitlines())}
    assert {name: r["full_val"]["val/loss"] for name, r in raw.items()} == pytest.approx(oracle, rel=1e-5)
    assert all("full_val" not in json.loads(r) for r in (tmp_path / "loop" / "runs.jsonl").read_text().splitlines())

    # A second report reads the kept scores; a checkpoint written since is scored again.
    def no_scoring(path):
        raise AssertionError(f"{path} was scored again")

    monkeypatch.setattr(analysis.full_val, "score_checkpoint", no_scoring)
    assert row_losses(write_report(sweep, tmp_path / "again", full_val=True).read_text()) == row_losses(full)
    best = sweep / "lr1e-2_s1" / "checkpoints" / "best.safetensors"
    os.utime(best, ns=(best.stat().st_atime_ns, best.stat().st_mtime_ns + 10**9))
    with pytest.raises(AssertionError, match=r"lr1e-2_s1.*was scored again"):
        write_report(sweep, tmp_path / "stale", full_val=True)
    assert all(math.isfinite(v) for v in row_losses(full))


def test_a_checkpoint_whose_tokenizer_is_not_its_datas_is_refused_not_scored(tiny_run_overrides, tmp_path):
    # Defect: an exported-and-imported checkpoint keeps its tokenizer but names the default split: it was scored
    # on that split's text through that split's tokenizer (3.95 bits/byte where its own run read 3.83)
    from rundir.checkpoint import load_checkpoint, save_checkpoint

    run = tmp_path / "run"
    run_train([*tiny_run_overrides, f"out_dir={run}", "max_steps=2", "sample_tokens=0"])
    model, _ = load_model(run / "checkpoints" / "best.safetensors")
    meta = load_checkpoint(run / "checkpoints" / "best.safetensors").meta
    other_chars = sorted({*meta["tokenizer"]["chars"], "é"} - {"e"})  # another vocabulary of the same size
    meta["tokenizer"] = {**meta["tokenizer"], "chars": "".join(other_chars)}
    other = save_checkpoint(tmp_path / "imported.safetensors", model, None, meta)
    with pytest.raises(ValueError, match=r"^the checkpoint's tokenizer differs from the one its data config prepares"):
        analysis.full_val.score_checkpoint(other)


def test_a_run_whose_files_changed_since_is_refused_not_scored_on_another_split(tmp_path):
    # Defect: a file added to data.files re-drew the held-out documents, and --score gave a number for a split that
    # held a copy of a train document, without a word.
    books = tmp_path / "books"
    books.mkdir()
    for i in range(6):
        (books / f"b{i}.txt").write_text(f"book {i}: " + "the cat sat on the mat. " * (20 + i) + "\n")
    run = tmp_path / "run"
    data = [
        "data=files",
        f"data.files=[{books}/*.txt]",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.tokenizer=char",
        "+debug=tiny",
    ]
    run_train([*data, f"out_dir={run}", "max_steps=2", "sample_tokens=0", "compile=false", "logger=none"])
    best = run / "checkpoints" / "best.safetensors"
    assert math.isfinite(analysis.full_val.score_checkpoint(best)["val/bpb"])
    (books / "b6.txt").write_text((books / "b0.txt").read_text())
    with pytest.raises(ValueError, match=r"^the data its config names has changed since the run trained .*: a file "):
        analysis.full_val.score_checkpoint(best)
