"""Preparing a big corpus: the BPE learned from a bounded sample, the UTF-8 check once per file version, the learner
gone on every way out (an interrupt, its parent killed), and batches that keep every core busy."""

import importlib
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data import learn_bpe, write_tokens
from data.config import DataConfig
from data.documents import PIECE_CHARS
from data.utf8_check import check_utf8_files
from tests.helpers import write_corpus

prepare_mod = importlib.import_module("data.prepare")  # data.prepare is also the package's function
ROOT = Path(__file__).resolve().parents[2]


def test_evenly_keeps_all_text_within_the_budget_and_about_the_budget_spread_through_a_bigger_one():
    pieces = [f"{i:04d}" * 25 for i in range(1000)]  # 100 bytes each, 100,000 in all
    assert list(learn_bpe.evenly(pieces, 100_000, budget=100_000)) == pieces
    kept = list(learn_bpe.evenly(pieces, 100_000, budget=10_000))
    # Defect: a piece was kept when it crossed a multiple of total / budget bytes (10 here), which every piece of
    # more than 10 bytes does: a 1 GB corpus sent all of itself to the learner, not 64 MiB
    assert kept == pieces[::10]  # one piece in ten, through to the end
    gigabyte = ("x" * PIECE_CHARS for _ in range(8000))  # ~1 GB in the preparation's pieces: count what is kept
    assert (
        64 << 20 <= sum(map(len, learn_bpe.evenly(gigabyte, 8000 * PIECE_CHARS, 64 << 20))) <= (64 << 20) + PIECE_CHARS
    )


def test_the_bpe_learns_from_a_bounded_sample_and_the_preparation_says_how_much(tmp_path, monkeypatch, caplog):
    paths = write_corpus(tmp_path / "docs", documents=40, lines=50)  # ~2.6 KB a document, each one piece
    cfg = DataConfig(source="files", files=paths, tokenizer="bpe", bpe_vocab_size=300, cache_dir=str(tmp_path / "c"))
    sent = []
    real = prepare_mod.learn_in_child

    def counting(texts, *args, **kwargs):
        texts = list(texts)
        sent.append(sum(len(t.encode()) for t in texts))
        return real(texts, *args, **kwargs)

    monkeypatch.setattr(prepare_mod, "learn_in_child", counting)
    monkeypatch.setattr(prepare_mod, "BPE_SAMPLE_BYTES", 20_000)
    with caplog.at_level(logging.INFO, logger="data.prepare"):
        prepared = prepare_mod.prepare(cfg, progress=False)
    train_bytes = prepared.meta["train_bytes"]
    assert train_bytes > 60_000 and 20_000 <= sent[0] < 20_000 + 3_000  # at most one piece over the bound
    assert f"learning the BPE from about 20,000 of the {train_bytes:,} bytes of train text" in caplog.text
    assert prepared.vocab_size == 300  # learned from the sample, it tokenizes all of the text
    caplog.clear()
    monkeypatch.setattr(prepare_mod, "BPE_SAMPLE_BYTES", 10**9)
    with caplog.at_level(logging.INFO, logger="data.prepare"):
        prepare_mod.prepare(DataConfig(**{**cfg.__dict__, "bpe_vocab_size": 290}), progress=False)
    assert sent[1] == train_bytes and f"from all {train_bytes:,} bytes of train text" in caplog.text


def test_the_utf8_check_reads_each_file_version_once(tmp_path, monkeypatch):
    paths = [Path(p) for p in write_corpus(tmp_path / "docs", documents=3, lines=20)]
    reads = []
    real = importlib.import_module("data.utf8_check")._check_utf8_bytes

    def counting(path, on_bytes):
        reads.append(path.name)
        return real(path, on_bytes)

    monkeypatch.setattr("data.utf8_check._check_utf8_bytes", counting)
    seen = []
    check_utf8_files(paths, tmp_path, seen.append)
    check_utf8_files(paths, tmp_path, seen.append)
    assert reads == ["doc0.txt", "doc1.txt", "doc2.txt"]  # the second check read nothing
    assert sum(seen) == 2 * sum(p.stat().st_size for p in paths)  # yet its progress still counts every byte
    stat = paths[1].stat()
    paths[1].write_text(paths[1].read_text().upper())  # same size; mtime set back: the change time still differs
    os.utime(paths[1], ns=(stat.st_atime_ns, stat.st_mtime_ns))
    paths[2].write_bytes(b"\xff not UTF-8 any more")
    with pytest.raises(ValueError, match=r"doc2.txt' is not UTF-8 text \(byte 0\)"):
        check_utf8_files(paths, tmp_path)
    assert reads[3:] == ["doc1.txt", "doc2.txt"]


def test_an_interrupt_while_the_bpe_learns_ends_its_child_process(monkeypatch):
    started = []
    real_popen = subprocess.Popen

    def recording(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    def texts():
        yield "some text to learn from " * 100
        raise KeyboardInterrupt  # Ctrl-C while the parent streams the sample

    monkeypatch.setattr(subprocess, "Popen", recording)
    with pytest.raises(KeyboardInterrupt):
        learn_bpe.learn_in_child(texts(), 300, show_progress=False)
    assert len(started) == 1 and started[0].poll() is not None  # killed and reaped, not left learning


PARENT = """
import runpy, subprocess, sys, time
learn = runpy.run_path(sys.argv[1])
real = subprocess.Popen
def popen(*args, **kwargs):
    child = real(*args, **kwargs)
    print(child.pid, flush=True)
    return child
learn["subprocess"].Popen = popen
def texts():
    while True:
        yield "text " * 1000
        time.sleep(0.05)
learn["learn_in_child"](texts(), 300, False)
"""


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting for init to reap it is gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_the_bpe_learner_dies_with_its_parent_even_when_the_parent_is_killed():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(Path(learn_bpe.__file__))], stdout=subprocess.PIPE, text=True
    )
    try:
        learner = int(parent.stdout.readline())
        time.sleep(0.5)  # the learner is up and has read some text
        parent.kill()  # SIGKILL: no finally runs in the parent; the kernel's death signal ends the learner
        parent.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and running(learner):
            time.sleep(0.05)
        assert not running(learner), "the BPE learner outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.parametrize("cores,pieces", [(2, 8), (16, 32)])
def test_a_tokenizing_batch_holds_at_least_two_pieces_for_each_core(monkeypatch, cores, pieces):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert write_tokens.encode_batch_bytes() == max(write_tokens.ENCODE_BATCH_BYTES, 2 * cores * PIECE_CHARS)
    assert write_tokens.encode_batch_bytes() // PIECE_CHARS == pieces


def test_the_tokens_of_a_corpus_do_not_depend_on_the_batch_size(tmp_path, monkeypatch):
    paths = write_corpus(tmp_path / "docs", documents=4, lines=400)
    cfg = DataConfig(source="files", files=paths, tokenizer="bpe", bpe_vocab_size=300, cache_dir=str(tmp_path / "a"))
    batches: list[int] = []
    real = write_tokens._write_batch

    def counting(f, tokenizer, batch, dtype):
        batches.append(len(batch))
        return real(f, tokenizer, batch, dtype)

    monkeypatch.setattr(write_tokens, "_write_batch", counting)
    monkeypatch.setattr(write_tokens, "encode_batch_bytes", lambda: 1)  # one piece a batch
    one = prepare_mod.prepare(cfg, progress=False)
    assert len(batches) >= 4 and set(batches) == {1}
    batches.clear()
    monkeypatch.setattr(write_tokens, "encode_batch_bytes", lambda: 1 << 30)  # a split's pieces in one batch
    whole = prepare_mod.prepare(DataConfig(**{**cfg.__dict__, "cache_dir": str(tmp_path / "b")}), progress=False)
    assert len(batches) == 2 and sum(batches) > 2
    for split in ("train", "val"):
        assert (one.directory / f"{split}.bin").read_bytes() == (whole.directory / f"{split}.bin").read_bytes()
