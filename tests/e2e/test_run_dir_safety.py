"""A run writes only its own files (issue #34 §4): never through a symlink or a hard link it finds in its
directory (the lock file, the records, the plot), not into the original of a `cp -as` / `cp -al` copy of a
run it resumes, not beside a live run whose lock file was deleted by hand, and a full disk is reported
with advice that is true. Each test names the defect it pins down."""

import errno
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import rundir.files
from rundir.files import RunLock, atomic_write_bytes
from rundir.records import RunLogHandler, log_to_file, write_config
from tests.e2e.test_nothing_lost import checksums, one_error_line, wait_for_a_logged_step
from tests.helpers import ROOT, run_cli, run_train

RECORDS = ("config.yaml", "train.log", "metrics.jsonl", "run_info.json", "summary.json", "plots.png")


@pytest.fixture(scope="module")
def args(shared_corpus_overrides) -> list[str]:
    return [*shared_corpus_overrides, "max_steps=10", "eval_interval=5", "sample_tokens=0"]


def new_process() -> None:
    """Drop the train.log handler a run in this process left (as a new CLI process starts without it): the
    next run's set-up warnings would go to the last run's train.log, in the original of a copy."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, RunLogHandler)]:
        root.removeHandler(handler)
        handler.close()


def refused(overrides: list[str], match: str) -> str:
    with pytest.raises(ValueError, match=match) as info:
        run_train(overrides)
    assert "\n" not in str(info.value)
    return str(info.value)


# -- the lock file ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "hard link", "fifo", "directory", "foreign file"])
def test_a_lock_path_that_is_not_a_run_lock_is_refused_and_nothing_is_written(args, tmp_path, kind):
    # Defect: `ln -s ~/precious.txt RUN/.lock` and a start in RUN truncated precious.txt and wrote a pid into it.
    out, precious = tmp_path / "run", tmp_path / "precious.txt"
    out.mkdir()
    precious.write_text("my precious\n")
    lock = out / ".lock"
    if kind == "symlink":
        lock.symlink_to(precious)
    elif kind == "dangling symlink":
        lock.symlink_to(tmp_path / "created-through-the-link")
    elif kind == "hard link":
        os.link(precious, lock)
    elif kind == "fifo":
        os.mkfifo(lock)
    elif kind == "directory":
        lock.mkdir()
    else:
        lock.write_text("held by my own tool\n")
    (out / "config.yaml").write_text("x: 1\n")
    before = checksums(out, with_lock=True)
    refused([*args, f"out_dir={out}"], rf"{re.escape(str(lock))} is .*, not a run's lock file; move it away")
    assert checksums(out, with_lock=True) == before and precious.read_text() == "my precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.txt", "run"]  # no link's target made


def test_a_live_run_whose_lock_file_was_deleted_still_holds_its_directory(args, tmp_path):
    # Defect: after `rm RUN/.lock` a second run in RUN took a new lock file and trained beside the first;
    # both exited 0, interleaving their checkpoints and records.
    out = tmp_path / "run"
    cli = ["train.py", *args, f"out_dir={out}", "max_steps=1000000", "eval_interval=1000000"]
    first = subprocess.Popen([sys.executable, *cli], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_a_logged_step(out)
        (out / ".lock").unlink()
        second = run_cli([*cli, "overwrite=true", "max_steps=2"])  # before the fix: trained, and exited 0
        assert f"{out} is in use by a live run" in one_error_line(second)
        assert not (out / ".lock").exists()  # the refused run made none
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM


# -- the records --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dangling", [False, True], ids=["to a file", "dangling"])
def test_no_record_is_written_through_a_symlink(args, tmp_path, caplog, dangling):
    # Defect: a symlinked train.log was appended to and a symlinked plots.png written through (their
    # targets outside the run changed); a dangling metrics.jsonl link created its target.
    out, outside = tmp_path / "run", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    for name in RECORDS:
        if not dangling:
            (outside / name).write_text(f"the user's {name}\n")
        (out / name).symlink_to(outside / name)
    before = checksums(outside)
    caplog.set_level(logging.INFO)  # as train.py logs: train.log gets lines
    run_train([*args, f"out_dir={out}", "overwrite=true"])
    assert checksums(outside) == before
    for name in RECORDS:  # each link replaced by the run's own file
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0, name


@pytest.mark.parametrize("farm", ["-as", "-al"], ids=["symlink farm", "hard-link farm"])
def test_resuming_a_linked_copy_of_a_run_leaves_the_original_as_it_was(args, tmp_path, caplog, farm):
    # Defect: `cp -as SRC COPY; python train.py out_dir=COPY resume=auto` truncated SRC/.lock, appended to
    # SRC/train.log and wrote SRC/plots.png (with `cp -al`: the .lock and train.log that SRC shares).
    src, copy = tmp_path / "src", tmp_path / "copy"
    caplog.set_level(logging.INFO)  # as train.py logs: train.log gets lines
    run_train([*args, f"out_dir={src}"])
    new_process()
    subprocess.run(["cp", farm, str(src), str(copy)], check=True)
    before = checksums(src, with_lock=True)
    message = refused([*args, f"out_dir={copy}", "resume=auto", "max_steps=20"], r"\.lock is a (symlink|hard link)")
    assert "move it away" in message and checksums(src, with_lock=True) == before
    (copy / ".lock").unlink()  # as the message says
    new_process()
    run_train([*args, f"out_dir={copy}", "resume=auto", "max_steps=20"])
    assert checksums(src, with_lock=True) == before
    steps = [line for line in (copy / "metrics.jsonl").read_text().splitlines() if '"step": 20' in line]
    assert steps and (copy / "checkpoints" / "step_0000020.safetensors").is_file()
    assert (copy / "train.log").read_text().startswith((src / "train.log").read_text())  # continued, as a copy


def test_an_atomic_write_replaces_a_planted_temp_link_rather_than_writing_through_it(tmp_path):
    # Defect: a symlink at the temp file's name was opened and written through, then renamed into place.
    target, path = tmp_path / "target.txt", tmp_path / "run" / "config.yaml"
    target.write_text("mine\n")
    path.parent.mkdir()
    (path.parent / f".config.yaml.tmp-{os.getpid()}").symlink_to(target)
    atomic_write_bytes(path, b"x: 1\n")
    assert target.read_text() == "mine\n" and not path.is_symlink() and path.read_bytes() == b"x: 1\n"


# -- a full disk --------------------------------------------------------------------------------------------


def fill_the_disk(monkeypatch, under: Path) -> None:
    """Every new file under `under` fails as on a full disk."""
    real_open = open

    def full(path, mode="r", *a, **kw):
        if str(path).startswith(str(under)) and mode[0] in "wxa":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *a, **kw)

    monkeypatch.setattr(rundir.files, "open", full, raising=False)


def test_a_fresh_run_on_a_full_disk_names_the_file_and_claims_no_checkpoint(args, tmp_path, monkeypatch):
    # Defect: it said "earlier checkpoints are intact; ... continue with resume=auto": there were none,
    # and that command was refused.
    out = tmp_path / "run"
    fill_the_disk(monkeypatch, out)
    with pytest.raises(OSError, match=rf"no space to write {out / 'config.yaml'} .*it was not written") as info:
        run_train([*args, f"out_dir={out}"])
    assert "\n" not in str(info.value) and "resume=auto" not in str(info.value)
    assert "checkpoints are intact" not in str(info.value)


def test_a_fresh_run_on_a_full_disk_leaves_no_lock_file(args, tmp_path, monkeypatch):
    out = tmp_path / "run"
    fill_the_disk(monkeypatch, out)
    with pytest.raises(OSError, match="no space to write"):
        run_train([*args, f"out_dir={out}"])
    assert not out.exists()


def test_a_start_that_writes_nothing_on_a_full_disk_can_discard_its_lock(tmp_path, monkeypatch):
    # Defect: log_to_file created an empty train.log before anything was logged, so a start whose first
    # record could not be written still left train.log and .lock (discard saw a file it had not found).
    out = tmp_path / "run"
    lock = RunLock(out).acquire()
    fill_the_disk(monkeypatch, out)
    try:
        log_to_file(out / "train.log")
        with pytest.raises(OSError, match=rf"no space to write {out / 'config.yaml'}"):
            write_config(out / "config.yaml", {"seed": 1})
    finally:
        lock.release(discard=True)
        new_process()
    assert not out.exists()


def test_a_first_checkpoint_that_does_not_fit_advises_a_command_that_works(args, tmp_path, monkeypatch):
    # Defect: "earlier checkpoints are intact; free space, then continue with resume=auto" for the first
    # checkpoint of a fresh run: there was none, and resume=auto was refused.
    out = tmp_path / "run"
    real_open = open

    def full(path, mode="r", *a, **kw):
        if "step_0000005" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *a, **kw)

    monkeypatch.setattr(rundir.files, "open", full, raising=False)
    with pytest.raises(OSError, match=r"step_0000005.safetensors .*no checkpoint of this run is saved.*overwrite=tr"):
        run_train([*args, f"out_dir={out}"])
    monkeypatch.undo()
    run_train([*args, f"out_dir={out}", "overwrite=true"])  # the advice holds
    assert (out / "checkpoints" / "step_0000010.safetensors").is_file()


def test_a_run_continued_through_a_symlink_stays_in_the_directory_it_locked(args, tmp_path, monkeypatch):
    # Defect: `out_dir=outputs/latest resume=auto` (the README's "continue for longer") followed the link at every
    # write; when the next run moved latest on, it wrote its checkpoints into that run's directory and its
    # rotation deleted that run's own.
    import training.trainer

    first, other, latest = tmp_path / "first", tmp_path / "other", tmp_path / "latest"
    run_train([*args, f"out_dir={first}", "max_steps=10"])
    other.mkdir()
    (other / "kept.txt").write_text("another run's file")
    latest.symlink_to(first)
    real_lr_at = training.trainer.lr_at

    def lr_at_moving_the_link(step, *a):
        if step == 12:  # the next run started: latest points at it now
            latest.unlink()
            latest.symlink_to(other)
        return real_lr_at(step, *a)

    monkeypatch.setattr(training.trainer, "lr_at", lr_at_moving_the_link)
    run_train([*args, f"out_dir={latest}", "resume=auto", "max_steps=20"])
    assert [p.name for p in other.iterdir()] == ["kept.txt"]
    assert (first / "checkpoints" / "step_0000020.safetensors").is_file()
