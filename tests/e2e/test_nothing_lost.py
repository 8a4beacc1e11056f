"""Nothing a user has is lost: one live run per directory, no deletion of what a run did not write or
could not read, no clobbering, no stray directory from a refused command, and the exact command that
continues a run. Each test names the defect it pins down."""

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cli.config import to_train_config
from cli.run_dirs import train_in_new_dir
from rundir.checkpoint import load_checkpoint
from rundir.files import RunLock
from tests.helpers import ROOT, compose_config, rewrite_checkpoint, run_cli, run_train
from training.setup import train


def checksums(directory: Path, with_lock: bool = False) -> dict[str, str]:
    """Every file under `directory` (symlinks as their target path), for before/after comparisons; the
    lock file is left out unless asked for: it names whichever process took the directory last."""
    out = {}
    for p in sorted(directory.rglob("*")):
        if p.name == ".lock" and not with_lock:
            continue
        if p.is_symlink():
            out[str(p.relative_to(directory))] = "-> " + os.readlink(p)
        elif p.is_file():
            out[str(p.relative_to(directory))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def corpus_args(shared_corpus_overrides) -> list[str]:
    """One corpus and data cache for the module; a test that damages the cache names its own."""
    return [*shared_corpus_overrides, "max_steps=10", "eval_interval=5"]


@pytest.fixture(scope="module")
def trained_once(corpus_args, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    run_train([*corpus_args, f"out_dir={out}"])
    return out


@pytest.fixture
def finished_run(trained_once, tmp_path) -> Path:
    """A finished 10-step run of the test's own: a copy of the one the module trained."""
    return Path(shutil.copytree(trained_once, tmp_path / "run", symlinks=True))


def wait_for_a_logged_step(out: Path, timeout: float = 120) -> None:
    """Until RUN/metrics.jsonl holds a record: the run is in its loop, where SIGTERM stops it with a save
    (the file itself is created before the loop's signal handlers are)."""
    metrics, deadline = out / "metrics.jsonl", time.time() + timeout
    while not (metrics.exists() and metrics.stat().st_size) and time.time() < deadline:
        time.sleep(0.2)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """A refusal: non-zero exit, no traceback, and one `error:` line, the last (progress lines of the
    data preparation may come before it)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr[-2000:]
    return errors[0]


@pytest.mark.parametrize("extra", [[], ["resume=auto"], ["overwrite=true"]])
def test_a_second_run_beside_a_live_one_is_refused_and_touches_nothing(corpus_args, finished_run, extra):
    # Defect: no lock; a resume=auto beside a live run deleted the live run's newer checkpoints.
    before = checksums(finished_run)
    lock = RunLock(finished_run).acquire()  # the live run holds the lock, as train() does
    try:
        proc = run_cli(["train.py", *corpus_args, f"out_dir={finished_run}", *extra])
    finally:
        lock.release()
    line = one_error_line(proc)
    assert "is in use by a live run (pid" in line and str(os.getpid()) in line
    assert checksums(finished_run) == before


def test_two_real_runs_at_once_exactly_one_runs(corpus_args, tmp_path):
    out = tmp_path / "both"
    args = ["train.py", *corpus_args, f"out_dir={out}", "max_steps=1000000", "eval_interval=1000000"]
    first = subprocess.Popen([sys.executable, *args], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_a_logged_step(out)  # the first run is in its loop: live, and stopped by SIGTERM below
        second = run_cli(args)
        assert "is in use by a live run" in one_error_line(second)
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM


def test_resume_auto_refuses_an_unreadable_newest_checkpoint_and_keeps_it(corpus_args, finished_run):
    # Defect: resume=auto went back to an older checkpoint, then deleted the newer one it could not read.
    newest = finished_run / "checkpoints" / "step_0000010.safetensors"
    newest.write_bytes(newest.read_bytes()[:-100])  # e.g. a newer format, or damaged
    before = checksums(finished_run)
    proc = run_cli(["train.py", *corpus_args, f"out_dir={finished_run}", "resume=auto", "max_steps=20"])
    assert "the newest checkpoint cannot be read" in one_error_line(proc)
    assert checksums(finished_run) == before


def test_a_symlinked_best_is_replaced_by_a_better_checkpoint_and_its_original_kept(corpus_args, finished_run, tmp_path):
    # Defect: a resumed `cp -as` copy kept best.safetensors linked to the original's old best, so sample.py, the
    # lab and --score read it, while summary.json named a better val loss.
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-as", str(finished_run), str(copy)], check=True)
    (copy / ".lock").unlink(missing_ok=True)
    original = (finished_run / "checkpoints" / "best.safetensors").read_bytes()
    run_train([*corpus_args, f"out_dir={copy}", "resume=auto", "max_steps=30", "eval_interval=10"])
    best = copy / "checkpoints" / "best.safetensors"
    summary = json.loads((copy / "summary.json").read_text())
    assert not best.is_symlink() and load_checkpoint(best).meta["metrics"]["val/loss"] == summary["best_val_loss"]
    assert (finished_run / "checkpoints" / "best.safetensors").read_bytes() == original


def test_a_symlinked_checkpoint_and_what_it_points_to_survive_a_resume(corpus_args, finished_run, tmp_path):
    # Defect: with a symlinked checkpoint in the directory, resume=auto deleted the real files.
    ckpts = finished_run / "checkpoints"
    elsewhere = tmp_path / "archive" / "step_0000010.safetensors"
    elsewhere.parent.mkdir()
    (ckpts / "step_0000010.safetensors").rename(elsewhere)
    (ckpts / "step_0000010.safetensors").symlink_to(elsewhere)
    kept = elsewhere.read_bytes()
    run_train([*corpus_args, f"out_dir={finished_run}", "resume=auto", "max_steps=30", "keep_last=1"])
    assert (ckpts / "step_0000010.safetensors").is_symlink() and elsewhere.read_bytes() == kept
    assert (ckpts / "step_0000030.safetensors").is_file() and (ckpts / "best.safetensors").is_file()
    steps = [json.loads(line)["step"] for line in (finished_run / "metrics.jsonl").read_text().splitlines()]
    assert steps[0] == 5 and steps[-1] == 30  # it continued the run's records, not a fresh run's


def test_a_fresh_run_refuses_a_directory_holding_only_best(corpus_args, finished_run):
    # Defect: the clobber check looked at step_* only, so best.safetensors and metrics.jsonl were replaced.
    for p in (finished_run / "checkpoints").glob("step_*"):
        p.unlink()
    before = checksums(finished_run)
    with pytest.raises(ValueError, match="already holds another run's files"):
        run_train([*corpus_args, f"out_dir={finished_run}"])
    assert checksums(finished_run) == before


def test_overwrite_refuses_what_it_cannot_verify(corpus_args, finished_run):
    (finished_run / "checkpoints" / "notes.txt").write_text("mine")
    before = checksums(finished_run)
    with pytest.raises(ValueError, match=r"notes\.txt is not a checkpoint this run can verify"):
        run_train([*corpus_args, f"out_dir={finished_run}", "overwrite=true"])
    assert checksums(finished_run) == before


def test_resume_auto_on_a_finished_run_changes_nothing(corpus_args, finished_run):
    # Defect: it rewrote summary.json without the val metrics, and the ablation report then crashed.
    before = checksums(finished_run)
    metrics = run_train([*corpus_args, f"out_dir={finished_run}", "resume=auto"])
    assert "val/loss" in metrics
    assert checksums(finished_run) == before


def test_the_stop_message_is_the_exact_command_that_continues(corpus_args, tmp_path):
    # Defects: it said "continue with resume=auto", which starts a new timestamped run from scratch; then
    # it left out the run's overrides, so for any non-default model the command it gave was refused.
    out = tmp_path / "stopped run"
    overrides = [*corpus_args, "model.n_head=4", "max_steps=2000", "eval_interval=2000"]
    proc = subprocess.Popen(
        [sys.executable, "train.py", *overrides, f"out_dir={out}"], cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    wait_for_a_logged_step(out)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    step = int(re.search(r"stopped by SIGTERM after step (\d+)", stderr).group(1))
    command = re.search(r"continue with: (.*)", stderr).group(1)
    assert command.startswith(f"python train.py out_dir='{out}' resume=auto ")
    argv = shlex.split(command)
    assert argv[4:] == overrides
    # The command as given continues the same model; only a nearer end is added, to keep the test short.
    resumed = run_cli([*argv[1:], f"max_steps={step + 2}", "sample_tokens=0"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from {out / 'checkpoints'}" in resumed.stderr
    assert json.loads((out / "summary.json").read_text())["step"] == step + 2


def test_resume_auto_without_out_dir_says_there_is_nothing_and_where_the_newest_run_is(corpus_args, tmp_path):
    work = tmp_path / "cwd"
    (work / "outputs" / "old" / "checkpoints").mkdir(parents=True)
    (work / "outputs" / "old" / "checkpoints" / "step_0000005.safetensors").write_bytes(b"x")
    before = checksums(work)
    proc = run_cli([str(ROOT / "train.py"), *corpus_args, "resume=auto"], cwd=work)
    line = one_error_line(proc)
    assert "is a new run directory, so there is nothing to resume" in line
    assert "outputs/old: python train.py out_dir=outputs/old resume=auto +debug=tiny data.source=files" in line
    assert checksums(work) == before and sorted(p.name for p in (work / "outputs").iterdir()) == ["old"]


def test_the_newest_run_that_resume_auto_points_at_continues_as_pasted(corpus_args, tmp_path):
    # Defect: the command it printed carried this command's overrides, not the newest run's, so pasted it was
    # refused: "has model.n_head=4 but this run has model.n_head=2".
    work = tmp_path / "cwd"
    work.mkdir()
    first = run_cli([str(ROOT / "train.py"), *corpus_args, "model.n_head=4", "out_dir=outputs/old"], cwd=work)
    assert first.returncode == 0, first.stderr[-2000:]
    # read from the checkpoint, as resume compares: a config.yaml edited by hand was an AttributeError traceback
    (work / "outputs" / "old" / "config.yaml").write_text("- a\n")
    line = one_error_line(run_cli([str(ROOT / "train.py"), *corpus_args, "resume=auto"], cwd=work))
    command = line.split("the newest run with checkpoints is outputs/old: ", 1)[1]
    assert "model.n_head=4" in shlex.split(command)
    pasted = subprocess.run(
        ["bash", "-c", command.replace("train.py", str(ROOT / "train.py"), 1) + " max_steps=12"],
        cwd=work, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert pasted.returncode == 0 and "resuming from outputs/old/checkpoints" in pasted.stderr, pasted.stderr[-2000:]


@pytest.mark.parametrize(
    "override,message",
    [
        ("model.n_head=5", r"model.d_model \(32\) must be divisible by model.n_head \(5\)"),
        ("+model.nhead=4", r"unknown config key model.nhead \(did you mean model.n_head\?\)"),
        ("+foo=1", r"unknown config key foo"),
        ("seed=-1", r"seed=-1 is invalid; it must be an integer in \[0, 2\*\*63\)"),
        ("seed=99999999999999999999", r"seed=99999999999999999999 is invalid"),
        ("sample_prompt=ZZ@", r"sample_prompt='ZZ@': the prompt cannot be encoded: characters '@', 'Z' are not in"),
        ("model.d_model=1000000", r"needs about [\d,.]+ GiB to train; this cpu has"),
        ("budget_s=0", r"budget_s=0.0 is invalid; it must be a finite number of seconds > 0"),
        ("optim.lr=inf", r"optim.lr=inf is invalid; it must be a finite number > 0"),
        ("optim.grad_clip=nan", r"optim.grad_clip=nan is invalid; it must be a finite number >= 0"),
        # these crashed with a traceback after writing config.yaml, metrics.jsonl, run_info.json (and .lock)
        ("optim.lr=1e308", r"optim.lr=1e\+308 is invalid; it must be a finite number > 0 and <= 1000"),
        ("optim.muon_lr=1e300", r"optim.muon_lr=1e\+300 is invalid; it must be a finite number > 0 and <= 1000"),
        ("device=meta", r"device='meta' is invalid; use auto, cpu, cuda, cuda:N or mps$"),
        # these named neither the key nor what it takes
        ("compile=maybe", r"compile=maybe: Value 'maybe' is not a valid bool \(type str\); give true or false$"),
        # sample.py's REPL writes none; Hydra's type error did not say null
        ("budget_s=none", r"budget_s=none: Value 'none' .* to Float; Hydra's none is null: give null$"),
        (
            "data.files=/x.txt",
            r"data.files=/x.txt: .* is not a ListConfig, list or tuple; give a list: 'data.files=\[/x.txt\]'$",
        ),
        ("model=null", r"^error: model=null: the config group model takes one of gpt2, .*small.*, not null$"),
    ],
)
def test_a_refused_command_leaves_no_directory_behind(corpus_args, tmp_path, override, message):
    # Defect: a config that failed validation still left outputs/DATE/TIME/ (.hydra/, train.log).
    work = tmp_path / "cwd"
    work.mkdir()
    proc = run_cli([str(ROOT / "train.py"), *corpus_args, override], cwd=work)
    line = one_error_line(proc)
    assert re.search(message, line), line
    assert list(work.iterdir()) == []


def test_bad_prepared_data_and_binary_files_are_one_line_errors(corpus_args, tmp_path):
    args = [*corpus_args, f"data.cache_dir={tmp_path / 'cache'}"]  # its own cache: damaged below
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    proc = run_cli(["train.py", *args, f"data.files=[{binary}]", f"out_dir={tmp_path / 'r1'}"])
    assert f"data.files entry '{binary}' is a binary file" in one_error_line(proc)
    run_train([*args, f"out_dir={tmp_path / 'r2'}", "max_steps=1"])
    prepared = next((tmp_path / "cache" / "prepared").iterdir())
    train_bin = prepared / "train.bin"
    train_bin.write_bytes(train_bin.read_bytes()[:-10])
    with pytest.raises(ValueError, match=rf"prepared data in {prepared} is damaged: .*train.bin holds"):
        run_train([*args, f"out_dir={tmp_path / 'r3'}"])
    (prepared / "meta.json").write_text("{not json")
    with pytest.raises(ValueError, match=rf"{prepared / 'meta.json'} is not valid"):
        run_train([*args, f"out_dir={tmp_path / 'r4'}"])
    assert not (tmp_path / "r3").exists() and not (tmp_path / "r4").exists()


def test_a_run_whose_new_directory_a_same_second_run_took_trains_in_the_next(corpus_args, tmp_path):
    # Defect: `for s in 1 2 3; do python train.py seed=$s & done` can name two runs outputs/DATE/TIME; the
    # second found the first's lock and failed with "in use by a live run" instead of taking TIME-2.
    taken = tmp_path / "outputs" / "2026-12-01" / "12-00-00"
    lock = RunLock(taken).acquire()  # the same-second run, live
    try:
        cfg = to_train_config(compose_config([*corpus_args, f"out_dir={taken}", "sample_tokens=0"]))
        metrics = train_in_new_dir(cfg, train, root=tmp_path / "outputs")
    finally:
        lock.release()
    ours = Path(cfg.out_dir)
    assert ours != taken and ours.parent.parent == tmp_path / "outputs" and "val/loss" in metrics
    assert (ours / "summary.json").is_file() and {p.name for p in taken.iterdir()} == {".lock"}


def test_a_run_ends_saying_where_it_is_and_points_latest_at_it(corpus_args, tmp_path):
    work = tmp_path / "cwd"
    work.mkdir()
    proc = run_cli([str(ROOT / "train.py"), *corpus_args, "sample_tokens=0"], cwd=work)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = [p for p in (work / "outputs").glob("20*/*") if p.is_dir()]
    rel = run.relative_to(work)
    assert (work / "outputs" / "latest").resolve() == run.resolve()
    assert "done: val loss" in proc.stderr and f"run directory {rel}" in proc.stderr
    assert f"sample:   python scripts/sample.py {rel}" in proc.stderr
    assert f"continue: python train.py out_dir={rel} resume=auto" in proc.stderr
    # One directory per run, holding everything; no Hydra folder beside it, no config dump on the terminal.
    assert {p.name for p in run.iterdir()} >= {"checkpoints", "config.yaml", "train.log", "metrics.jsonl"}
    assert not (run / ".hydra").exists() and "resolved config" not in proc.stderr
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"


def test_a_checkpoint_with_a_valid_digest_but_a_malformed_header_is_one_line(corpus_args, finished_run, tmp_path):
    from analysis.trained import load_model
    from rundir.checkpoint import load_checkpoint, save_checkpoint

    ckpt = load_checkpoint(finished_run / "checkpoints" / "step_0000010.safetensors")
    model, _ = load_model(finished_run / "checkpoints" / "step_0000010.safetensors")
    for name, meta in [("no_config", {"step": 3}), ("bad_model", {"config": {"model": {"n_heads": 2}}})]:
        optimizer = torch.optim.AdamW(model.parameters())
        path = save_checkpoint(tmp_path / f"{name}.safetensors", model, optimizer, meta)  # digest over the bad header
        with pytest.raises(ValueError, match=rf"checkpoint '{path}' has (no model config|a model config this code)"):
            load_model(path)
        refusal = r"was trained with tokenizer None|has no run config|a model config this code cannot build"
        with pytest.raises(ValueError, match=refusal) as refused:
            run_train([*corpus_args, f"out_dir={tmp_path / name}", f"resume={path}"])
        assert "\n" not in str(refused.value)
    assert ckpt.meta["step"] == 10


# Early and late in the imports; train.py's start-up goes on for seconds after them (config, data, model).
@pytest.mark.parametrize(("entry", "delay_s"), [("train.py", 0.3), ("train.py", 0.8), ("scripts/sample.py", 0.3)])
def test_ctrl_c_while_an_entry_point_starts_exits_130_without_a_traceback_or_a_run_dir(tmp_path, entry, delay_s):
    out = tmp_path / "run"
    train_args = ["+debug=tiny", "data.tokenizer=char", f"out_dir={out}", "logger=none"]
    args = [sys.executable, entry, *(train_args if entry == "train.py" else [str(out), "ROMEO:"])]
    # A shell's child gets Ctrl-C with its default disposition (a test runner's worker may ignore it).
    default_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    proc = subprocess.Popen(args, cwd=ROOT, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, "Traceback" in err, out.exists()) == (130, False, False), err[-2000:]


@pytest.mark.parametrize(
    "files",
    [
        {"config.yaml": "my precious config\n", "metrics.jsonl": '{"step": 3}\n'},  # a user's project
        {"config.yaml": "model: {}\n", "run_info.json": "{}", "train.log": "step 1\n"},  # SIGKILLed before a save
    ],
)
def test_resume_auto_refuses_run_files_without_a_checkpoint_and_keeps_them(corpus_args, tmp_path, files):
    # Defect: with no checkpoints/ resume=auto started a fresh run and overwrote config.yaml and metrics.jsonl.
    out = tmp_path / "proj"
    out.mkdir()
    for name, text in files.items():
        (out / name).write_text(text)
    before = checksums(out)
    with pytest.raises(ValueError, match=r"resume=auto: .*proj holds another run's files \(.*config\.yaml.*\) but no "
                       r"checkpoint to continue from; pass overwrite=true to start afresh"):  # fmt: skip
        run_train([*corpus_args, f"out_dir={out}", "resume=auto"])
    assert checksums(out) == before
    run_train([*corpus_args, f"out_dir={out}", "resume=auto", "overwrite=true", "max_steps=2", "sample_tokens=0"])
    assert (out / "checkpoints" / "step_0000002.safetensors").is_file()


def test_a_fresh_run_over_a_run_killed_before_its_first_save_does_not_offer_resume_auto(corpus_args, tmp_path):
    # Defect: it said "pass resume=auto to continue it", which was refused next for having no checkpoint.
    out = tmp_path / "killed"
    out.mkdir()
    (out / "config.yaml").write_text("model: {}\n")
    (out / "train.log").write_text("step 1\n")
    before = checksums(out)
    message = r"killed already holds another run's files \(config\.yaml\), with no checkpoint to continue; "
    with pytest.raises(ValueError, match=message + r"pass overwrite=true to replace them, or another out_dir$"):
        run_train([*corpus_args, f"out_dir={out}"])
    assert checksums(out) == before


def test_resume_auto_in_a_sweep_job_directory_or_an_empty_one_starts_afresh(corpus_args, tmp_path):
    job = tmp_path / "job"  # what Hydra writes into a sweep job's directory before the run starts
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (job / "train.log").write_text("")
    empty = tmp_path / "empty"
    empty.mkdir()
    for out in (job, empty, tmp_path / "new"):
        run_train([*corpus_args, f"out_dir={out}", "resume=auto", "max_steps=2", "sample_tokens=0"])
        assert (out / "checkpoints" / "step_0000002.safetensors").is_file()


def test_resume_path_from_another_directory_refuses_run_files_without_a_checkpoint(corpus_args, finished_run, tmp_path):
    # Defect: a foreign checkpoint resumed into a directory holding a run killed before its first save
    # overwrote its config.yaml and emptied its metrics.jsonl (no newer checkpoint stood in the way).
    out = tmp_path / "proj"
    out.mkdir()
    (out / "config.yaml").write_text("my precious config\n")
    (out / "metrics.jsonl").write_text('{"step": 3}\n')
    before = checksums(out)
    foreign = f"resume={finished_run / 'checkpoints' / 'step_0000010.safetensors'}"
    with pytest.raises(ValueError, match=r"proj already holds another run's files \(config\.yaml, metrics\.jsonl\), "
                       r"which step_0000010\.safetensors does not continue; pass overwrite=true"):  # fmt: skip
        run_train([*corpus_args, f"out_dir={out}", foreign])
    assert checksums(out) == before
    run_train([*corpus_args, f"out_dir={out}", foreign, "overwrite=true", "max_steps=12", "sample_tokens=0"])
    assert (out / "checkpoints" / "step_0000012.safetensors").is_file()


@pytest.mark.parametrize("bad", [b'{"step": null}\n', b'{"step": "x"}\n', b"\xff\xfe binary\n"])
def test_a_record_that_cannot_be_read_is_refused_before_the_run_changes(corpus_args, finished_run, bad):
    # Defect: a hand-edited step (null, "x") was a TypeError traceback; bytes that are not UTF-8 an error
    # naming no file
    with (finished_run / "metrics.jsonl").open("ab") as f:
        f.write(bad)
    before = checksums(finished_run)
    with pytest.raises(ValueError, match=r"metrics.jsonl (has a record with step|is not UTF-8 text)"):
        run_train([*corpus_args, f"out_dir={finished_run}", "resume=auto", "max_steps=20"])
    assert checksums(finished_run) == before


def test_wandb_that_cannot_start_is_one_line_before_anything_is_replaced(corpus_args, finished_run, monkeypatch):
    # Defect: no API key (or no network) was a hundred lines of traceback, after overwrite=true had deleted the
    # finished run's checkpoints and emptied its metrics.
    import wandb

    def no_key(**kwargs):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", no_key)
    before = checksums(finished_run)
    overrides = [*corpus_args, f"out_dir={finished_run}", "overwrite=true", "logger=wandb", "logger.mode=online"]
    with pytest.raises(ValueError, match=r"^wandb could not start its online run \(UsageError: No API key configured"):
        run_train(overrides)
    assert checksums(finished_run) == before


def test_overwrite_starts_metrics_afresh(corpus_args, finished_run):
    # Defect: trim_metrics(path, 0) kept the old run's step-0 record and any record without a step.
    (finished_run / "metrics.jsonl").write_text('{"step": 0, "val/loss": 99.0}\n{"note": "old"}\n')
    run_train([*corpus_args, f"out_dir={finished_run}", "overwrite=true", "max_steps=2", "sample_tokens=0"])
    records = [json.loads(line) for line in (finished_run / "metrics.jsonl").read_text().splitlines()]
    assert records and all(0 < record["step"] <= 2 for record in records)


def test_a_refused_start_in_an_existing_directory_leaves_no_lock_file(corpus_args, tmp_path):
    # Defect: the refused run's .lock stayed in the user's directory.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    # Defect too: it called notes.txt "another run's files" and offered overwrite=true (`out_dir=.` named .git)
    with pytest.raises(ValueError, match=r"mine holds files no run wrote \(notes.txt\); give a new or empty out_dir$"):
        run_train([*corpus_args, f"out_dir={mine}"])
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("options", [[], ["overwrite=true"], ["resume=auto", "overwrite=true"]])
def test_a_projects_own_config_yaml_is_no_run_to_replace(corpus_args, tmp_path, options):
    # Defect: `out_dir=configs` called configs/config.yaml "another run's files" and advised overwrite=true,
    # which then replaced the project's config.yaml.
    configs = tmp_path / "configs"
    (configs / "model").mkdir(parents=True)
    (configs / "config.yaml").write_text("defaults: [model: small]\n")
    with pytest.raises(ValueError, match=r"configs holds files no run wrote \(config.yaml, model\); give a new or"):
        run_train([*corpus_args, f"out_dir={configs}", *options])
    assert (configs / "config.yaml").read_text() == "defaults: [model: small]\n"
    assert sorted(p.name for p in configs.iterdir()) == ["config.yaml", "model"]


def test_a_discarded_lock_removes_only_a_lock_file_it_made_beside_nothing_new(tmp_path):
    kept = tmp_path / "kept"  # a former run's lock file is that run's
    kept.mkdir()
    (kept / ".lock").write_text("pid 1: train.py\n")
    RunLock(kept).acquire().release(discard=True)
    assert (kept / ".lock").exists()
    written = tmp_path / "written"  # the run wrote something: its lock stays with it
    written.mkdir()
    lock = RunLock(written).acquire()
    (written / "config.yaml").write_text("x")
    lock.release(discard=True)
    assert sorted(p.name for p in written.iterdir()) == [".lock", "config.yaml"]


def test_sigterm_before_the_loop_is_one_line_and_leaves_no_directory(corpus_args, tmp_path):
    # Defect: SIGTERM while compiling (or preparing data) ended the process silently, rc 143, leaving out_dir with
    # its .lock; the loop's own handler, which saves a step first, is installed only once training starts.
    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "train.py"), *corpus_args, "compile=true", f"out_dir={out}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:  # until it is compiling: set-up, before the loop
        lines.append(line)
        if line.startswith("compiling the step"):
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    assert (
        rest.strip().splitlines()[-1]
        == "stopped by SIGTERM outside the training loop (in it, a stop saves a step first)"
    )
    assert not out.exists()


@pytest.mark.parametrize("damage", ["checkpoints is a file", "best is a folder", "checkpoints is read-only"])
def test_what_the_first_save_needs_is_checked_before_the_run_changes_anything(
    corpus_args, finished_run, monkeypatch, damage
):
    # Defect: each failed only at the first save, after the run had trained and rewritten its records (a finished
    # run's summary.json deleted); root writes anywhere, so the read-only folder is simulated at its probe
    checkpoints = finished_run / "checkpoints"
    if damage == "checkpoints is a file":
        shutil.rmtree(checkpoints)
        checkpoints.write_text("not a folder")
        options, message = ["overwrite=true"], r"checkpoints is not a folder; a run saves its checkpoints there"
    elif damage == "best is a folder":
        (checkpoints / "best.safetensors").unlink()
        (checkpoints / "best.safetensors").mkdir()
        options, message = ["resume=auto", "max_steps=20"], r"best.safetensors is a folder; a run writes its best"
    else:
        real_touch = Path.touch

        def read_only(path, *args, **kwargs):
            if path.parent == checkpoints:
                raise PermissionError(13, "Permission denied", str(path))
            return real_touch(path, *args, **kwargs)

        monkeypatch.setattr(Path, "touch", read_only)
        options, message = ["resume=auto", "max_steps=20"], r"checkpoints cannot be written \(Permission denied\)"
    before = checksums(finished_run)
    with pytest.raises(ValueError, match=message):
        run_train([*corpus_args, f"out_dir={finished_run}", *options])
    assert checksums(finished_run) == before


def first_moment(tensors: dict) -> str:
    return next(name for name in sorted(tensors) if name.startswith("optim.") and name.endswith(".exp_avg"))


# Damage a crafted file can hold with its sha256 recomputed: each failed only after the resume had rewritten
# config.yaml, run_info.json and metrics.jsonl and deleted summary.json (the RNG at its restore, just before the
# first step; a step of -5 at the first batch; a wrong moment or a string lr_scale at the first optimizer step,
# which said "lower optim.lr"), or trained on from converted weights (F16, I32).
RESUME_DAMAGE = {
    "rng.torch of 16 bytes": (
        {"tensors": lambda t: t.update({"rng.torch": t["rng.torch"][:16].clone()})},
        r"tensor rng.torch is not a state its generator takes",
    ),
    "rng.python garbage": (
        {"meta": lambda m: m["rng"].update(python=[3, [1, 2, 3], None])},
        r"header field rng.python is not a state its generator takes \(state vector is the wrong size\)",
    ),
    "rng.numpy garbage": (
        {"meta": lambda m: m["rng"].update(numpy=["MT19937", [1, 2], 0, 0, 0.0])},
        r"header field rng.numpy is not a state its generator takes",
    ),
    'step "20"': ({"meta": lambda m: m.update(step="20")}, r"header field step='20' is invalid; it must be a non-neg"),
    "step -5": ({"meta": lambda m: m.update(step=-5)}, r"header field step=-5 is invalid"),
    "elapsed_s of inf": ({"meta": lambda m: m.update(elapsed_s=float("inf"))}, r"header field elapsed_s=inf"),
    "a moment of the wrong shape": (
        {"tensors": lambda t: t.update({first_moment(t): t[first_moment(t)][:1].clone()})},
        r"tensor optim\.\d+\.exp_avg has shape \(1, .*; its parameter .* has shape",
    ),
    "an lr_scale that is a string": (
        {"meta": lambda m: m["optim_param_groups"][0].update(lr_scale="20")},
        r"optim_param_groups\[0\] has lr_scale='20'; this run's optimizer keeps",
    ),
    "F16 weights": (
        {"tensors": lambda t: t.update({"train.tok_emb.weight": t["train.tok_emb.weight"].half()})},
        r"tensor train.tok_emb.weight is torch.float16; this format writes torch.float32 there",
    ),
    "I32 weights": (
        {"tensors": lambda t: t.update({"model.ln_f.weight": t["model.ln_f.weight"].int()})},
        r"tensor model.ln_f.weight is torch.int32",
    ),
    "NaN weights": (
        {"tensors": lambda t: t.update({"train.ln_f.weight": t["train.ln_f.weight"] * float("nan")})},
        r"tensor train.ln_f.weight holds NaN or inf values",
    ),
    "vocab_size=400000000": (
        {"meta": lambda m: m["config"]["model"].update(vocab_size=400_000_000)},
        r"tensor model\.\w+\.weight has shape \(\d+, 32\); its header's model config builds \(400000000, 32\)",
    ),
}


@pytest.mark.parametrize("damage", RESUME_DAMAGE)
def test_a_refused_resume_leaves_every_file_byte_identical(corpus_args, finished_run, damage):
    # Defect: a resume checked the RNG states, the step and the optimizer state only once its records had started
    changes, message = RESUME_DAMAGE[damage]
    newest = finished_run / "checkpoints" / "step_0000010.safetensors"
    os.replace(rewrite_checkpoint(newest, newest.with_name("crafted.tmp"), **changes), newest)
    before = checksums(finished_run)
    with pytest.raises(ValueError, match=message) as refused:
        run_train([*corpus_args, f"out_dir={finished_run}", "resume=auto", "max_steps=20"])
    assert str(newest) in str(refused.value) and "\n" not in str(refused.value)
    assert checksums(finished_run) == before


def test_a_refused_resume_from_a_given_path_is_one_line_and_changes_nothing(corpus_args, finished_run, tmp_path):
    crafted = rewrite_checkpoint(
        finished_run / "checkpoints" / "step_0000010.safetensors",
        tmp_path / "crafted.safetensors",
        tensors=lambda t: t.update({"rng.torch": t["rng.torch"][:16].clone()}),
    )
    before = checksums(finished_run)
    proc = run_cli(["train.py", *corpus_args, f"out_dir={finished_run}", f"resume={crafted}", "max_steps=20"])
    line = one_error_line(proc)
    assert str(crafted) in line and "tensor rng.torch is not a state its generator takes" in line
    assert checksums(finished_run) == before


def overflowing(tensors: dict) -> None:
    for name in ("model.ln_f.weight", "model.lm_head.weight"):
        if name in tensors:
            tensors[name] = tensors[name] * 1e30  # finite weights whose logits are not


# What the readers of a trained model (sampling, scoring) refuse of a crafted file, each before building it
READERS_REFUSE = {
    "vocab_size=400000000": (
        {"meta": lambda m: m["config"]["model"].update(vocab_size=400_000_000)},
        r"has shape \(\d+, 32\); its header's model config builds \(400000000, 32\)",
    ),
    "n_layer=3000": (
        {"meta": lambda m: m["config"]["model"].update(n_layer=3000)},
        r"header field config.model.n_layer=3000, but its weights hold 2 blocks",
    ),
    "NaN weights": (
        {"tensors": lambda t: t.update({"model.ln_f.weight": t["model.ln_f.weight"] * float("nan")})},
        r"tensor model.ln_f.weight holds NaN or inf values",
    ),
}


@pytest.mark.parametrize("damage", READERS_REFUSE)
@pytest.mark.parametrize("reader", [["scripts/sample.py"], ["bench/bench_quality.py", "--score"]])
def test_sampling_and_scoring_refuse_a_crafted_checkpoint_in_one_line(finished_run, tmp_path, reader, damage):
    # Defect: sample.py built a 400,000,000-token model and died in the allocator (a traceback), or spent a minute
    # building 3,000 layers; bench_quality --score printed "nan bits/byte" and exited 0
    changes, message = READERS_REFUSE[damage]
    path = rewrite_checkpoint(finished_run / "checkpoints" / "best.safetensors", tmp_path / "x.safetensors", **changes)
    line = one_error_line(run_cli([*reader, str(path), *(["the "] if reader[0].endswith("sample.py") else [])]))
    assert str(path) in line and re.search(message, line), line


def test_scoring_refuses_finite_weights_whose_output_is_not_finite(finished_run, tmp_path):
    # Defect: a score of nan bits/byte, exit 0, where sample.py refuses the same file
    path = rewrite_checkpoint(
        finished_run / "checkpoints" / "best.safetensors", tmp_path / "x.safetensors", tensors=overflowing
    )
    line = one_error_line(run_cli(["bench/bench_quality.py", "--score", str(path)]))
    said = rf"checkpoint {re.escape(repr(str(path)))} scores a val loss of (nan|inf): its weights have diverged"
    assert re.search(said, line), line
    sampled = one_error_line(run_cli(["scripts/sample.py", str(path), "the "]))
    assert "the model's output is not finite" in sampled
