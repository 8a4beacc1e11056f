"""scripts/head_importance.py on a real tiny run: table, JSON and plots, for one checkpoint and over training
(every step checkpoint of a run trained with keep_last=null); bad targets are one error line."""

import json
import math
import re
import shutil

import pytest
import torch

from analysis.importance_over_training import OUTPUTS, write_importance_over_training
from analysis.trained import load_model
from lab import api
from lab.session import LabSession
from rundir.checkpoint import save_checkpoint
from scripts.head_importance import write_head_importance
from tests.helpers import ROOT, run_cli, run_train

STEPS = [5, 10, 15, 20]  # +debug=tiny's 20 steps, a checkpoint every 5


@pytest.fixture(scope="module")
def tiny_run(shared_corpus_overrides, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    run_train([*shared_corpus_overrides, f"out_dir={out}", "sample_tokens=0", "eval_interval=5", "keep_last=null"])
    return out


# The two reports are written in-process (the script's own function behind its flags); the bad targets
# below go through the command line.
def test_a_run_directory_gets_a_table_and_plots(tiny_run, tmp_path):
    write_head_importance(tiny_run, tmp_path / "hi", tokens=512, device="cpu")
    results = json.loads((tmp_path / "hi" / "head_importance.json").read_text())
    assert results["shape"] == {"n_layer": 2, "n_head": 2, "d_k": 16, "n_kv_head": 2}
    assert results["tokens"] == 2 * 8 * 32  # ceil(512 / (8 * 32)) = 2 batches of 8 windows of 32
    assert len(results["pruning_curve"]) == 5 and results["pruning_curve"][0][1] == results["base_loss"]
    report = (tmp_path / "hi" / "head_importance.md").read_text()
    assert "| layer \\ head | 0 | 1 |" in report and report.count("\n| 1 | 1 | ") == 1
    for name in ("head_heatmaps.png", "pruning_curve.png"):
        assert (tmp_path / "hi" / name).read_bytes().startswith(b"\x89PNG") and f"]({name})" in report


def test_tokens_beyond_the_validation_split_are_capped_at_it(tiny_run, monkeypatch):
    # Defect: --tokens 10^12 built batches of windows until memory ran out; drawn with replacement, more
    # windows than the split holds would only repeat its tokens.
    from analysis import fixed_windows
    from analysis.trained import load_trained

    trained = load_trained(tiny_run / "checkpoints" / "best.safetensors", device="cpu")
    asked = []
    monkeypatch.setattr(fixed_windows, "eval_batches", lambda tokens, b, t, n, seed: asked.append((len(tokens), n)))
    fixed_windows.val_windows(trained, 10**12, None)
    ((val_tokens, batches),) = asked
    assert batches == -(-val_tokens // (8 * 32))


def test_a_text_file_is_cut_into_consecutive_windows(tiny_run, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the king is not what the queen is\n" * 4)  # 140 characters: 4 windows of 32 + 1
    ckpt = tiny_run / "checkpoints" / "best.safetensors"
    write_head_importance(ckpt, tmp_path / "hi", tokens=16384, device="cpu", text=text)  # --tokens at its default
    results = json.loads((tmp_path / "hi" / "head_importance.json").read_text())
    assert results["tokens"] == 4 * 32 and results["data"] == str(text)


def test_windows_are_as_long_as_training_sequences_and_uniform_entropy_counts_a_layers_window(
    shared_corpus_overrides, tmp_path
):
    # Defect: windows were block_size long (4,096 in the default model, which trains on 128 tokens): the default
    # --tokens was refused, and the least allowed took minutes and gigabytes. And the uniform baseline counted every
    # earlier key where a windowed layer sees at most window_size of them.
    run = tmp_path / "run"
    shape = [
        "model.train_block_size=16",
        "model.window_pattern=SL",
        "model.window_size=4",
        "model.long_window_size=16",
    ]
    run_train([*shared_corpus_overrides, f"out_dir={run}", "sample_tokens=0", "max_steps=2", *shape])
    write_head_importance(run, tmp_path / "hi", tokens=256, device="cpu")
    results = json.loads((tmp_path / "hi" / "head_importance.json").read_text())
    assert results["window"] == 16 and results["tokens"] == 2 * 8 * 16  # 256 / (8 windows of 16) = 2 batches
    windowed = sum(math.log(min(t + 1, 4)) for t in range(1, 16)) / 15
    whole = sum(math.log(t + 1) for t in range(1, 16)) / 15
    assert results["uniform_entropy"] == pytest.approx([windowed, whole])
    report = (tmp_path / "hi" / "head_importance.md").read_text()
    assert f"by layer (its window of keys) {windowed:.3f}, {whole:.3f} nats" in report


@pytest.mark.parametrize(
    "args,message",
    [
        (["nowhere"], "error: run directory 'nowhere' holds no checkpoint (no checkpoints/best.safetensors"),
        (["RUN", "--tokens", "0"], "error: --tokens 0 is invalid; it must be >= 1"),
        (["RUN", "--text", "missing.txt"], "error: --text 'missing.txt' does not exist"),
        (["RUN", "--text", "."], "error: --text '.' is a directory; give a UTF-8 text file"),  # "does not exist"
        (["nowhere", "--over-training"], "error: 'nowhere' is not a run directory (it has no checkpoints/)"),
        (["BEST", "--over-training"], "error: run directory 'BEST' is a file; --over-training takes a run directory"),
    ],
)
def test_bad_targets_are_one_error_line_and_write_nothing(tiny_run, tmp_path, args, message):
    named = {"RUN": str(tiny_run), "BEST": str(tiny_run / "checkpoints" / "best.safetensors")}
    args, message = [named.get(a, a) for a in args], message.replace("BEST", named["BEST"])
    (tmp_path / "nowhere").mkdir()  # a directory without checkpoints
    done = run_cli([str(ROOT / "scripts" / "head_importance.py"), *args, "--out", "hi"], cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith(message), done.stderr
    assert not (tmp_path / "hi").exists()


def test_an_existing_report_is_replaced_only_with_force(tiny_run, tmp_path):
    # a second run into the same --out silently replaced the four files of the first
    out = tmp_path / "hi"
    out.mkdir()
    (out / "head_importance.md").write_text("precious\n")
    message = f"--out {str(out / 'head_importance.md')!r} already exists; pass --force to replace it"
    with pytest.raises(ValueError, match=re.escape(message)):
        write_head_importance(tiny_run, out, tokens=256, device="cpu")
    assert (out / "head_importance.md").read_text() == "precious\n" and sorted(out.iterdir()) == [
        out / "head_importance.md"
    ]
    write_head_importance(tiny_run, out, tokens=256, device="cpu", force=True)
    assert (out / "head_importance.md").read_text().startswith("# Head importance")


def test_a_checkpoint_whose_tokenizer_is_not_its_data_configs_is_refused(tiny_run, tmp_path):
    # the val split was read with the data config's tokenizer whatever the checkpoint's was: other
    # characters behind the same ids gave wrong numbers silently (a larger vocabulary, an IndexError)
    model, ckpt = load_model(tiny_run / "checkpoints" / "best.safetensors")
    chars = ckpt.meta["tokenizer"]["chars"]
    meta = {**ckpt.meta, "tokenizer": {**ckpt.meta["tokenizer"], "chars": chars[:-1] + "😀"}}  # still sorted
    other = save_checkpoint(tmp_path / "other.safetensors", model, None, meta)
    with pytest.raises(ValueError, match=r"tokenizer differs from the one its data config prepares .* give --text"):
        write_head_importance(other, tmp_path / "hi", tokens=256, device="cpu")
    assert not (tmp_path / "hi").exists()


@pytest.mark.parametrize("data", ["shakespeare", {"tokenizer": "char", "vocab": 7}])
def test_a_header_whose_data_config_does_not_build_is_one_line(tiny_run, tmp_path, data):
    # Defect: config.data as a string (or with a field DataConfig lacks) under a digest that holds was a
    # TypeError traceback
    model, ckpt = load_model(tiny_run / "checkpoints" / "best.safetensors")
    meta = {**ckpt.meta, "config": {**ckpt.meta["config"], "data": data}}
    odd = save_checkpoint(tmp_path / "odd.safetensors", model, None, meta)
    refusal = (  # a string is refused as the checkpoint loads; an unknown field when the data config is built
        r"odd.safetensors' has no usable data config in its header .* give --text"
        r"|odd.safetensors': header field config=.* is invalid; it must be an object whose model, data and optim"
    )
    with pytest.raises(ValueError, match=refusal):
        write_head_importance(odd, tmp_path / "hi", tokens=256, device="cpu")
    assert not (tmp_path / "hi").exists()


def test_keep_last_null_keeps_every_step_checkpoint(tiny_run):
    names = sorted(p.name for p in (tiny_run / "checkpoints").iterdir())
    assert names == ["best.safetensors", *(f"step_{s:07d}.safetensors" for s in STEPS)]


def test_over_training_gives_each_checkpoint_the_numbers_of_the_one_checkpoint_report(tiny_run, tmp_path):
    with pytest.raises(ValueError, match=r"^--tokens 0 is invalid; it must be >= 1$"):
        write_importance_over_training(tiny_run, tmp_path / "over", tokens=0, device=torch.device("cpu"))
    over = write_importance_over_training(tiny_run, tmp_path / "over", tokens=256, device=torch.device("cpu"))
    results = json.loads(over[0].read_text())
    assert results["steps"] == STEPS and over[1].read_text().count("\n") == 1 + len(STEPS)  # header + a row each
    for i, step in enumerate(STEPS):
        ckpt = tiny_run / "checkpoints" / f"step_{step:07d}.safetensors"
        report = write_head_importance(ckpt, tmp_path / f"one_{step}", tokens=256, device="cpu")
        single = json.loads((report.parent / "head_importance.json").read_text())
        assert single["step"] == step and single["tokens"] == results["tokens"]
        for key in ("base_loss", "delta_loss", "importance", "importance_raw"):
            assert results[key][i] == single[key], (step, key)
    assert len(set(results["base_loss"])) == len(STEPS)


def test_one_command_writes_into_the_run_and_the_lab_shows_it(tiny_run, tmp_path):
    run = shutil.copytree(tiny_run, tmp_path / "run")
    done = run_cli([str(ROOT / "scripts" / "head_importance.py"), str(run), "--over-training", "--tokens", "256"])
    assert done.returncode == 0, done.stderr
    for name in OUTPUTS:
        assert f"wrote {run / name}" in done.stderr
    written = json.loads((run / OUTPUTS[0]).read_text())
    shown = api.run_head_importance(LabSession(run), {"path": str(run)})
    assert shown["steps"] == STEPS and shown["checkpoints"] == written["checkpoints"]
    assert shown["delta_loss"] == written["delta_loss"] and shown["importance"] == written["importance"]
