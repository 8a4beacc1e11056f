"""Head importance over training (analysis/importance_over_training.py) and the lab's view of it, on fake
runs of random tiny char models measured on a text file: no training, no data preparation."""

import csv
import io
import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from analysis.fixed_windows import val_windows
from analysis.head_importance import head_scores
from analysis.importance_over_training import (
    OUTPUTS,
    read_importance_over_training,
    score_run,
    step_checkpoints,
    write_importance_over_training,
)
from analysis.trained import load_trained
from data.tokenizer import CharTokenizer
from lab import api, runs
from lab.session import LabSession
from model import GPT, GPTConfig
from rundir.checkpoint import save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")
CHARS = "\n abcdefghijklmnopqrstuvwxyz"
CPU = torch.device("cpu")


def save_step(run: Path, step: int, n_head: int = 2, name: str | None = None) -> Path:
    """A random char model (its seed is its step) saved as a run saves a step checkpoint."""
    torch.manual_seed(step)
    config = GPTConfig(vocab_size=len(CHARS) + 1, block_size=16, n_layer=2, n_head=n_head, d_model=16)
    meta = {"step": step, "config": {"model": asdict(config), "data": {}}, "tokenizer": CharTokenizer(CHARS).to_meta()}
    path = run / "checkpoints" / (name or f"step_{step:07d}.safetensors")
    return save_checkpoint(path, GPT(config), None, meta)


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "t.txt"
    path.write_text("the king is not what the queen is\nthou art fair\n" * 4)
    return path


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    for step in (12, 3, 7):  # saved out of order: listed by step
        save_step(run, step)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 12, "val/loss": 3.0}) + "\n")
    return run


def test_a_checkpoint_the_live_run_rotated_away_meanwhile_is_skipped_not_blamed_on_the_path(run, text):
    # Defect: listed, then deleted by the run's keep_last before it was read: "'.../step_0000022.safetensors' does
    # not exist; give a checkpoint file or a run directory", though the user had given the run directory.
    listed = step_checkpoints(run)
    listed[1][1].unlink()
    results = score_run(run, listed, tokens=64, device=CPU, text=text)
    assert results["steps"] == [3, 12]
    for _, path in listed:
        path.unlink(missing_ok=True)
    with pytest.raises(FileNotFoundError, match=r"every step checkpoint of .* was removed while it was read"):
        score_run(run, listed, tokens=64, device=CPU, text=text)


def test_every_step_checkpoint_is_scored_on_the_same_windows_oldest_first(run, text):
    results = score_run(run, step_checkpoints(run), tokens=64, device=CPU, text=text)
    assert results["steps"] == [3, 7, 12] and results["tokens"] == 4 * 16
    assert results["checkpoints"] == [f"step_{s:07d}.safetensors" for s in (3, 7, 12)]
    for i, name in enumerate(results["checkpoints"]):
        trained = load_trained(run / "checkpoints" / name)
        expected = head_scores(trained.model, val_windows(trained, 64, text))
        assert {k: results[k][i] for k in expected} == expected
    assert len(set(results["base_loss"])) == 3  # three models, three losses: each row is its own checkpoint


def test_the_files_hold_a_row_per_checkpoint_and_read_back(run, text, tmp_path):
    paths = write_importance_over_training(run, tmp_path / "out", tokens=64, device=CPU, text=text)
    assert [p.name for p in paths] == list(OUTPUTS)
    written = json.loads(paths[0].read_text())
    rows = list(csv.DictReader(io.StringIO(paths[1].read_text())))
    assert [int(r["step"]) for r in rows] == [3, 7, 12]
    assert [float(r["delta_loss_l1_h0"]) for r in rows] == [grid[1][0] for grid in written["delta_loss"]]
    assert [float(r["importance_l0_h1"]) for r in rows] == [grid[0][1] for grid in written["importance"]]
    report = paths[2].read_text()
    assert report.count("| head \\ step | 3 | 7 | 12 |") == 2 and report.count("\n| 1.1 | ") == 2
    assert paths[3].read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ValueError, match=re.escape(f"{str(paths[0])!r} already exists; pass --force")):
        write_importance_over_training(run, tmp_path / "out", tokens=64, device=CPU, text=text)
    (run / OUTPUTS[0]).write_text(paths[0].read_text())
    assert read_importance_over_training(run) == written


def test_a_run_of_one_checkpoint_is_a_table_of_one_row(tmp_path, text):
    save_step(tmp_path / "one", 5)
    results = score_run(tmp_path / "one", step_checkpoints(tmp_path / "one"), tokens=64, device=CPU, text=text)
    assert results["steps"] == [5] and len(results["importance"]) == 1


def test_bad_runs_are_one_line_each(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "file.txt").write_text("x")
    save_step(tmp_path / "best_only", 4, name="best.safetensors")
    cases = {
        "missing": "run directory '.*missing' does not exist; --over-training takes a run directory",
        "file.txt": "run directory '.*file.txt' is a file; --over-training takes a run directory",
        "plain": "'.*plain' is not a run directory \\(it has no checkpoints/\\); give a run directory",
        "best_only": "checkpoints' holds no step checkpoint .*keeps every one with keep_last=null",
    }
    for name, message in cases.items():
        with pytest.raises(FileNotFoundError, match=message):
            step_checkpoints(tmp_path / name)


def test_a_checkpoint_of_another_model_shape_is_refused(run, text):
    save_step(run, 9, n_head=4)
    message = r"step_0000009.safetensors has \(n_layer, n_head, block_size\) \(2, 4, 16\), step_0000003"
    with pytest.raises(ValueError, match=message):
        score_run(run, step_checkpoints(run), tokens=64, device=CPU, text=text)


def test_the_lab_reads_them_or_names_the_command_that_writes_them(run, text, tmp_path):
    session = LabSession(run)
    with pytest.raises(FileNotFoundError, match=r"has no head_importance_over_training.json yet; write it with: "
                       r"python scripts/head_importance.py .*run --over-training$"):  # fmt: skip
        api.run_head_importance(session, {"path": str(run)})
    write_importance_over_training(run, run, tokens=64, device=CPU, text=text)
    written = json.loads((run / OUTPUTS[0]).read_text())
    shown = api.run_head_importance(session, {})  # no path: the loaded model's run
    assert shown["steps"] == [3, 7, 12] and shown["path"] == str(run)
    assert shown["delta_loss"] == written["delta_loss"] and shown["importance"] == written["importance"]
    assert set(shown["measures"]) == {"delta_loss", "importance"}
    with pytest.raises(ValueError, match="is outside"):
        api.run_head_importance(session, {"path": "/"})


@pytest.mark.parametrize(
    "damage,problem",
    [
        (lambda text: text[: len(text) // 2], "is not valid JSON"),
        (lambda text: json.dumps({**json.loads(text), "importance": [[[1.0]]] * 3}), "importance does not hold"),
        (lambda text: json.dumps({**json.loads(text), "base_loss": ["x"] * 3}), "base_loss does not hold"),
        (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "steps"}), "no steps"),
        (lambda text: "[1, 2]", "no run, steps"),
    ],
)
def test_a_damaged_file_is_one_line_saying_how_to_write_it_again(run, text, damage, problem):
    write_importance_over_training(run, run, tokens=64, device=CPU, text=text)
    path = run / OUTPUTS[0]
    path.write_text(damage(path.read_text()))
    with pytest.raises(ValueError, match=rf"cannot be read \(.*{problem}.*\); write it again with: .* --force$"):
        runs.head_importance(run)
