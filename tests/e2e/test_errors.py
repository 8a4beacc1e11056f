"""Every bad input is refused with one line naming the value and what is allowed, and leaves the
run directory as it was: config values, data, checkpoints that do not fit, another run's
directory, a full disk, and non-finite steps."""

import errno
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import rundir.files
import training.runtime
from analysis.trained import load_model
from model.gpt import GPT
from rundir.checkpoint import load_checkpoint, save_checkpoint
from tests.helpers import run_train

ROOT = Path(__file__).resolve().parents[2]


def one_line(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


@pytest.fixture(scope="module")
def finished(shared_corpus_overrides, tmp_path_factory) -> Path:
    """A finished 10-step run's checkpoint directory (steps 5 and 10)."""
    out_dir = tmp_path_factory.mktemp("finished")
    run_train([*shared_corpus_overrides, "max_steps=10", "eval_interval=5", f"out_dir={out_dir}"])
    return out_dir / "checkpoints"


@pytest.fixture
def run(shared_corpus_overrides, tmp_path) -> list[str]:
    return [*shared_corpus_overrides, "max_steps=10", "eval_interval=5", f"out_dir={tmp_path / 'run'}"]


@pytest.mark.parametrize(
    "override,message",
    [
        ("model.d_model=-4", r"model.d_model=-4 is invalid; it must be >= 1"),
        ("model.dropout=-0.1", r"model.dropout=-0.1 is invalid; it must be in \[0, 1\)"),
        ("optim.lr=-1", r"optim.lr=-1.0 is invalid; it must be a finite number > 0"),
        ("max_steps=0", r"max_steps=0 is invalid; it must be >= 1"),
        ("grad_accum_steps=0", r"grad_accum_steps=0 is invalid; it must be >= 1"),
        ("keep_last=0", r"keep_last=0 is invalid; it must be >= 1"),
        ("on_nonfinite=ignore", r"on_nonfinite='ignore' is unknown; choose one of: stop, skip"),
        ("data.source=web", r"data.source='web' is unknown; choose one of: shakespeare, hub, files"),
        ("model.n_head=0", r"model.n_head=0 is invalid"),
        ("model.d_k=0", r"model.d_k=0 is invalid"),
        ("model.dropout=1.5", r"model.dropout=1.5 is invalid"),
        ("optim.lr=0", r"optim.lr=0.0 is invalid; it must be a finite number > 0"),
        ("data.tokenizer=wordpiece", r"data.tokenizer='wordpiece' is unknown; choose one of: char, bpe, gpt2"),
        ("model.attn_backend=flash", r"model.attn_backend='flash' is unknown"),
        (
            "model.block_size=100000 model.train_block_size=null",
            r"the train split has \d+ tokens \(split by bytes: data.val_fraction=0.1 of the text held out\)",
        ),
        ("model.train_block_size=0", r"model.train_block_size=0 is invalid; it must be >= 1 or null"),
        ("model.long_window_size=0", r"model.long_window_size=0 is invalid; it must be >= 1 or null"),
        ("model.bigram_embeds=1", r"model.bigram_embeds=1 is invalid; it must be 0 \(off\) or >= 2"),
        # trained on 32 of 64 tokens: no layer may look further back, or meet a position, than training showed
        (
            "model.block_size=64 model.train_block_size=32",
            r"train_block_size=32 is shorter than model.block_size=64, "
            r"but layer 0 sees 64 keys: it would meet distances it never trained on",
        ),
        (
            "model.block_size=64 model.train_block_size=32 model.pos_encoding=learned",
            r"pos_encoding=learned gives "
            r"positions past 32 that training never showed",
        ),
        ("batch_size=0", r"batch_size=0 is invalid"),
        ("precision=fp8", r"precision='fp8' is unknown"),
        # a CPU has no fp16 kernels: the matmul peak probe alone took 11 minutes, then a step ~20 s
        ("device=cpu precision=fp16", r"precision=fp16 has no fast kernels on a CPU; .*: use auto \("),
        ("+model.nhead=4", r"unknown config key model.nhead \(did you mean model.n_head\?\)"),
        ("+lr=3e-4", r"unknown config key lr \(did you mean optim.lr\?\)"),  # the key in another group
        ("+model.lr=3e-4", r"unknown config key model.lr \(did you mean optim.lr\?\)"),
        ("seed=-1", r"seed=-1 is invalid; it must be an integer in \[0, 2\*\*63\)"),
        ("optim.lr=inf", r"optim.lr=inf is invalid; it must be a finite number > 0"),
        ("optim.grad_clip=nan", r"optim.grad_clip=nan is invalid"),
        # these three passed validation, then crashed after writing config.yaml, metrics.jsonl and run_info.json
        ("optim.lr=1e308", r"optim.lr=1e\+308 is invalid; it must be a finite number > 0 and <= 1000 \(a step"),
        ("optim.muon_lr=1e300", r"optim.muon_lr=1e\+300 is invalid; it must be a finite number > 0 and <= 1000"),
        ("device=meta", r"device='meta' is invalid; use auto, cpu, cuda, cuda:N or mps"),
        ("budget_s=-5", r"budget_s=-5.0 is invalid"),
        ("max_steps=null", r"max_steps and budget_s are both null"),
        ("sample_prompt=ZZ@", r"sample_prompt='ZZ@': the prompt cannot be encoded"),
        ("model.d_model=1000000", r"needs about [\d,.]+ GiB to train"),
        ("model.rope_base=inf", r"model.rope_base=inf is invalid; it must be > 1 and finite"),
        ("model.logit_softcap=inf", r"model.logit_softcap=inf is invalid; it must be a finite number > 0"),
        ("model.dropout=nan", r"model.dropout=nan is invalid"),
        ("distributed.timeout_s=inf", r"distributed.timeout_s=inf is invalid; it must be a finite number > 0"),
        ("data.val_fraction=nan", r"data.val_fraction=nan must be strictly between 0 and 1"),
        (
            "fairness.mode=iso_time fairness.time_budget_s=600 budget_s=270",
            r"budget_s=270.0 and fairness.time_budget_s=600.0 both set the run's length .*; pass budget_s=null",
        ),
        ("fairness.mode=iso_flop fairness.flop_budget=inf", r"fairness.flop_budget=inf is invalid; .* finite"),
        ("fairness.mode=iso_time fairness.time_budget_s=inf", r"fairness.time_budget_s=inf is invalid; .* finite"),
        ("fairness.mode=iso_time fairness.time_budget_s=nan", r"fairness.time_budget_s=nan is invalid"),
        ("fairness.mode=iso_flop fairness.flop_budget=1e300", r"fairness.flop_budget=1e\+300 buys [\d.e+]+ steps, "),
    ],
)
def test_bad_config_values(run, tmp_path, override, message):
    # The one table of bad values (a row may give several overrides, space-separated);
    # tests/e2e/test_nothing_lost.py runs a few through the CLI.
    with pytest.raises(ValueError, match=message) as info:
        run_train([*run, *override.split()])
    one_line(info)
    assert not (tmp_path / "run").exists()


def test_bf16_on_a_cpu_that_emulates_it_is_refused_before_any_work(run, tmp_path, monkeypatch):
    # Defect: on an AVX2-only CPU the MFU probe ran at 0.001 TFLOP/s for minutes, then each step took ~60x
    # fp32's, with nothing to say why.
    monkeypatch.setattr(training.runtime, "cpu_supports_bf16", lambda: False)
    with pytest.raises(ValueError, match=r"precision=bf16 has no fast kernels on this CPU .*use auto \(fp32"):
        run_train([*run, "device=cpu", "precision=bf16"])
    assert not (tmp_path / "run").exists()


def test_a_cuda_device_this_machine_lacks_is_refused_before_any_work(monkeypatch):
    # Defect: device=cuda:N past the last GPU passed, then failed with torch's traceback at model.to(device).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert training.runtime.resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ValueError, match=r"^device='cuda:2' is not here: this machine has 2 CUDA devices \(cuda:0 to"):
        training.runtime.resolve_device("cuda:2")


def test_missing_data_file(run, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data.files entry '.*nowhere.txt' is not a file"):
        run_train([*run, f"data.files=[{tmp_path / 'nowhere.txt'}]"])


def test_empty_data(run, tmp_path):
    for i in range(2):
        (tmp_path / f"empty{i}.txt").write_text("")
    with pytest.raises(ValueError, match=r"all 2 files named by data\.files are empty"):
        run_train([*run, f"data.files=[{tmp_path / 'empty0.txt'},{tmp_path / 'empty1.txt'}]"])


def test_corpus_smaller_than_one_batch(run, tmp_path):
    files = []
    for i in range(3):
        files.append(tmp_path / f"small{i}.txt")
        files[-1].write_text("to be or not to be\n" * 10)  # ~190 tokens a split; a batch needs 8 x 32 + 1
    too_few = (
        r"the \w+ split has \d+ tokens \(split by bytes: data.val_fraction=[\d.]+ of the text held out\), "
        r"fewer than one batch needs"
    )
    with pytest.raises(ValueError, match=too_few + r" \(batch_size=8"):
        run_train([*run, f"data.files=[{','.join(map(str, files))}]"])
    # Defect: one file, cut at val_fraction of its text, was also said to be "split by document: 1 train, 1 val"
    one = r"the train split has \d+ tokens \(split by bytes: data.val_fraction=0.1 of the text held out\), fewer than"
    with pytest.raises(ValueError, match=one):
        run_train([*run, f"data.files=[{files[0]}]"])


def test_token_ids_outside_the_vocabulary(tiny_run_overrides, tmp_path):
    run_train([*tiny_run_overrides, "max_steps=1", "sample_tokens=0"])
    (prepared,) = (tmp_path / "cache" / "prepared").iterdir()  # now damage the cached tokens
    tokens = np.memmap(prepared / "train.bin", dtype=np.uint16, mode="r+")
    tokens[100] = 500
    tokens.flush()
    with pytest.raises(ValueError, match=r"the train split holds token id 500, outside the vocabulary \[0, \d+\)"):
        run_train([*tiny_run_overrides, "max_steps=2", "resume=auto"])


def corpus_with_other_characters(tmp_path: Path) -> str:
    for i in range(3):
        (tmp_path / f"other{i}.txt").write_text("".join(chr(65 + (j * 7 + i) % 50) for j in range(3000)))
    return f"data.files=[{','.join(str(tmp_path / f'other{i}.txt') for i in range(3))}]"


def test_checkpoint_with_another_tokenizer(run, tmp_path, finished):
    with pytest.raises(ValueError, match=r"tokenizer char \(\d+ characters\), which does not match .*char \(50 char"):
        run_train([*run, corpus_with_other_characters(tmp_path), f"resume={finished / 'step_0000010.safetensors'}"])
    assert not (tmp_path / "run").exists()


def test_checkpoint_with_another_vocab_size(run, tmp_path, finished):
    with pytest.raises(ValueError, match=r"has model.vocab_size=\d+ but this run has model.vocab_size=64"):
        run_train([*run, "model.vocab_size=64", f"resume={finished / 'step_0000010.safetensors'}"])


def test_checkpoint_with_another_architecture(run, finished):
    with pytest.raises(ValueError, match=r"has model.n_layer=2 but this run has model.n_layer=3; resume with the"):
        run_train([*run, "model.n_layer=3", f"resume={finished / 'step_0000010.safetensors'}"])


@pytest.mark.parametrize(("trained", "resumed"), [("adamw", "muon"), ("muon", "adamw")])
def test_resuming_with_another_optimizer_is_refused_before_the_run_is_touched(run, tmp_path, trained, resumed):
    # Defect: the header printed, the first step died in a KeyError ('momentum', or 'step' in torch's Adam), and by
    # then config.yaml said the other optimizer, run_info.json was rewritten and summary.json deleted.
    run_train([*run, f"optim={trained}", "max_steps=4", "eval_interval=2"])
    out_dir = tmp_path / "run"
    before = {p: p.read_bytes() for p in sorted(out_dir.rglob("*")) if p.is_file()}
    with pytest.raises(ValueError) as refused:
        run_train([*run, f"optim={resumed}", "max_steps=8", "eval_interval=2", "resume=auto"])
    assert one_line(refused).endswith(
        f"was trained with optim.optimizer={trained}, this run has {resumed}; an optimizer's state does not carry "
        f"over to another: resume with optim={trained}"
    )
    assert {p: p.read_bytes() for p in sorted(out_dir.rglob("*")) if p.is_file()} == before


def test_weights_only_checkpoint_cannot_be_resumed(run, tmp_path, finished):
    model, ckpt = load_model(finished / "step_0000010.safetensors")
    path = save_checkpoint(tmp_path / "weights.safetensors", model, None, {"config": ckpt.meta["config"]})
    with pytest.raises(ValueError, match="holds no optimizer state"):
        run_train([*run, f"resume={path}"])


def test_resume_path_that_does_not_exist(run, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"resume='.*gone.safetensors' is not a file; give resume=auto"):
        run_train([*run, f"resume={tmp_path / 'gone.safetensors'}"])


def test_resume_auto_refuses_a_damaged_newest_and_an_older_one_resumes_by_path(run, tmp_path, finished):
    shutil.copytree(finished, tmp_path / "run" / "checkpoints")
    newest = tmp_path / "run" / "checkpoints" / "step_0000010.safetensors"
    newest.write_bytes(newest.read_bytes()[:1000])
    damaged = newest.read_bytes()
    with pytest.raises(ValueError, match=r"resume=auto: the newest checkpoint cannot be read \(checkpoint .*"):
        run_train([*run, "max_steps=12", "resume=auto"])  # never back to step 5, overwriting step 10
    assert newest.read_bytes() == damaged
    older = tmp_path / "run" / "checkpoints" / "step_0000005.safetensors"
    with pytest.raises(ValueError, match=r"holds checkpoints that step_0000005.safetensors does not continue"):
        run_train([*run, "max_steps=12", f"resume={older}"])


def test_foreign_checkpoint_into_a_directory_of_another_run(run, tmp_path, finished):
    shutil.copytree(finished, tmp_path / "run" / "checkpoints")
    with pytest.raises(ValueError, match=r"holds checkpoints that other.safetensors does not continue"):
        run_train(
            [*run, f"resume={shutil.copy(finished / 'step_0000005.safetensors', tmp_path / 'other.safetensors')}"]
        )


def test_disk_full_while_saving_keeps_the_last_checkpoint(run, tmp_path, monkeypatch):
    # Defect: this patched rundir.checkpoint's open after the writes moved to rundir.files: nothing failed.
    real_open = open

    def open_filling_the_disk(path, mode):
        if "step_0000010" in str(path):  # the first checkpoint fits, the second does not
            raise OSError(28, "No space left on device")
        return real_open(path, mode)

    monkeypatch.setattr(rundir.files, "open", open_filling_the_disk, raising=False)
    with pytest.raises(OSError, match=r"no space to write .*step_0000010.safetensors .*; step_0000005.safetensors is "
                       r"intact: free space, then continue with resume=auto$"):  # fmt: skip
        run_train(run)
    monkeypatch.undo()
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == ["best.safetensors", "step_0000005.safetensors"]
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "step_0000005.safetensors").meta["step"] == 5
    run_train([*run, "resume=auto"])  # the advice holds
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "step_0000010.safetensors").meta["step"] == 10


def poison_loss(monkeypatch, bad_steps: set[int]) -> None:
    """Training forward number s (= step s, no accumulation) returns a NaN loss for s in bad_steps."""
    real_forward = GPT.forward
    calls = [0]

    def forward(self, *args, **kwargs):
        logits, loss = real_forward(self, *args, **kwargs)
        if self.training:
            calls[0] += 1
            if calls[0] in bad_steps:
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)


def test_nonfinite_loss_stops_naming_the_step(run, tmp_path, monkeypatch):
    poison_loss(monkeypatch, {7})
    with pytest.raises(FloatingPointError, match=r"step 7: loss nan / gradient norm nan is not finite; stopped") as e:
        run_train(run)
    assert "last good checkpoint: " in one_line(e) and "step_0000005.safetensors" in str(e.value)
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*")) == ["step_0000005.safetensors"]


def test_nonfinite_steps_are_skipped_and_counted(run, tmp_path, monkeypatch):
    poison_loss(monkeypatch, {7, 8})
    metrics = run_train([*run, "on_nonfinite=skip"])
    assert np.isfinite(metrics["val/loss"])
    meta = load_checkpoint(tmp_path / "run" / "checkpoints" / "step_0000010.safetensors").meta
    assert meta["skipped_steps"] == 2
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["skipped_steps"] == 2  # said where read


@pytest.mark.slow
def test_cli_refuses_another_runs_directory_in_one_line(run, tmp_path):
    run_train(run)
    before = {p.name: p.read_bytes() for p in (tmp_path / "run" / "checkpoints").iterdir()}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    cmd = [sys.executable, "train.py", *run]
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 1
    assert (
        again.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: {tmp_path / 'run'} already holds another run's files (checkpoints, config.yaml, ")
    )
    assert (
        again.stderr.strip()
        .splitlines()[-1]
        .endswith("pass resume=auto to continue it, overwrite=true to replace it, or another out_dir")
    )
    assert {p.name: p.read_bytes() for p in (tmp_path / "run" / "checkpoints").iterdir()} == before


def test_out_dir_under_a_file(shared_corpus_overrides, tmp_path):
    # Defect: it said only "[Errno 20] Not a directory", naming no key.
    (tmp_path / "afile").write_text("mine")
    out = tmp_path / "afile" / "sub"
    with pytest.raises(ValueError, match=rf"out_dir='{out}' is under a file \({tmp_path / 'afile'}\), not a dir") as e:
        run_train([*shared_corpus_overrides, f"out_dir={out}"])
    one_line(e)
    assert (tmp_path / "afile").read_text() == "mine"


def test_out_dir_under_the_home_folder_is_there_not_in_a_folder_named_tilde(run, tmp_path, monkeypatch):
    # Defect: "out_dir='~/x'" (Hydra's quotes, as its error advised) made ./~/x, and the closing lines said ~/x
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    run_train([*run[:-1], "out_dir='~/x'", "max_steps=2"])
    assert (tmp_path / "home" / "x" / "checkpoints" / "best.safetensors").is_file()
    assert not (tmp_path / "~").exists()


def test_out_dir_that_is_a_dangling_symlink(shared_corpus_overrides, tmp_path):
    # Defect: it said only "[Errno 17] File exists: '...'" for a symlink whose target is gone.
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    for out in (tmp_path / "link", tmp_path / "link" / "run"):
        with pytest.raises(
            ValueError, match=rf"out_dir='{out}' is (under )?a symlink (\(.*\) )?to {tmp_path / 'gone'}, which"
        ):
            run_train([*shared_corpus_overrides, f"out_dir={out}"])
    assert (tmp_path / "link").is_symlink() and not (tmp_path / "gone").exists()


def test_out_dir_that_cannot_be_written(shared_corpus_overrides, tmp_path, monkeypatch):
    # Defect: a permission-denied out_dir said only "[Errno 13] Permission denied: '...'", naming no key.
    # Root writes anywhere, so the denial is simulated where the run makes its directory.
    out = tmp_path / "read-only" / "run"
    real_mkdir = Path.mkdir

    def denied(self, *args, **kwargs):
        if self == out:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    (tmp_path / "read-only").mkdir()
    monkeypatch.setattr(Path, "mkdir", denied)
    with pytest.raises(ValueError, match=rf"out_dir='{out}' cannot be written \(Permission denied: {out}\)") as e:
        run_train([*shared_corpus_overrides, f"out_dir={out}"])
    one_line(e)
    assert list((tmp_path / "read-only").iterdir()) == []


def test_a_run_ending_with_a_nonfinite_val_loss_skips_the_sample(run, caplog, capsys, monkeypatch):
    # Defect: the end-of-run sample crashed on the NaN logits ("probability tensor contains either inf, nan").
    # A diverged model's outputs, out of training (the sample's too); optim.lr=1e30 diverged, but lr is now
    # capped at 1000, where the tiny run's loss stays finite.
    real_forward = GPT.forward

    def diverged(self, *args, **kwargs):
        logits, loss = real_forward(self, *args, **kwargs)
        if self.training:
            return logits, loss
        return logits * math.nan, None if loss is None else loss * math.nan

    monkeypatch.setattr(GPT, "forward", diverged)
    metrics = run_train([*run, "sample_tokens=20"])
    assert not math.isfinite(metrics["val/loss"])
    assert "no end-of-run sample: the final val loss is nan" in caplog.text
    assert "--- sample ---" not in capsys.readouterr().out


def test_data_files_without_the_files_source_is_refused_not_dropped(tmp_path):
    # Defect: `train.py data.files=[mine.txt]` trained on Shakespeare, the header's "data shakespeare/bpe" the only clue
    with pytest.raises(ValueError) as refused:
        run_train(["+debug=tiny", f"data.files=[{tmp_path / 'mine.txt'}]", f"out_dir={tmp_path / 'run'}"])
    assert one_line(refused) == (
        "data.files is read only with data.source=files, and this run's data.source is 'shakespeare': add "
        "data.source=files (or data=files)"
    )
    assert not (tmp_path / "run").exists()
