"""The classical floor (bench/classical.py): the held-out formula, the per-document sum, the val split's own
documents and bytes, and the cache."""

import random
import shutil
from pathlib import Path

import pytest

from bench import classical
from data.config import DataConfig
from data.prepare import prepare
from tests.helpers import write_corpus

PPMD = classical.COMPRESSORS["PPMd H o16"]


def letters(rng: random.Random, n: int) -> bytes:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz \n") for _ in range(n)).encode()


def corpus_config(tmp_path: Path, documents: int) -> DataConfig:
    files = write_corpus(tmp_path / "corpus", documents=documents)
    return DataConfig(source="files", files=files, cache_dir=str(tmp_path / "cache"))


def test_the_formula_charges_each_document_the_bytes_it_adds_to_the_compressed_train_text():
    def stored(data: bytes) -> bytes:  # a "compressor" that stores: every byte costs 8 bits exactly
        return data

    assert classical.held_out_bits(stored, b"train text", [b"abc", b"de"]) == 8 * 5
    rng = random.Random(0)
    train = letters(rng, 20_000)
    assert classical.held_out_bits(PPMD, train, [train]) / len(train) < 0.05  # measured 0.016 bits/byte
    noise = rng.randbytes(20_000)
    assert 8.0 <= classical.held_out_bits(PPMD, train, [noise]) / len(noise) < 8.6  # measured 8.50


def test_each_document_is_primed_with_the_train_text_alone_and_their_bits_are_summed():
    rng = random.Random(1)
    train, a, b = letters(rng, 20_000), letters(rng, 5_000), letters(rng, 5_000)
    alone = {doc: classical.held_out_bits(PPMD, train, [doc]) for doc in (a, b)}
    assert classical.held_out_bits(PPMD, train, [a, b]) == alone[a] + alone[b]
    # A second copy of a costs what the first did (~5 bits/byte of random letters): compressed after
    # train + a, as one stream of the val split would, it cost 0.04 bits/byte.
    assert classical.held_out_bits(PPMD, train, [a, a]) == 2 * alone[a] > 2 * 4 * len(a)


@pytest.mark.parametrize("documents", [1, 6])  # one document is cut by characters, six are split by document
def test_the_documents_and_bytes_are_the_val_splits_own(tmp_path, documents):
    cfg = corpus_config(tmp_path, documents)
    meta = prepare(cfg, progress=False).meta
    train, docs = classical.split_texts(cfg)
    assert len(docs) == meta["num_documents"]["val"] and sum(map(len, docs)) == meta["val_bytes"]
    assert len(train) == meta["train_bytes"] and not any(doc in train for doc in docs)


def test_every_compressor_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    cfg = corpus_config(tmp_path, 6)
    meta = prepare(cfg, progress=False).meta
    result = classical.baselines(cfg, meta, "a CPU")
    assert [r["compressor"] for r in result["rows"]] == classical.measured_compressors()[0]
    assert result["cpu"] == "a CPU" and result["val_bytes"] == meta["val_bytes"]
    assert all(0 < r["bits_per_byte"] < 8 for r in result["rows"])  # 20 words of letters: well under 8
    best = classical.floor(result)
    assert best["bits_per_byte"] == min(r["bits_per_byte"] for r in result["rows"])

    def unread(cfg: DataConfig) -> None:
        raise AssertionError("the split was read again")

    monkeypatch.setattr(classical, "split_texts", unread)
    assert classical.baselines(cfg, meta, "another CPU") == result


def test_a_split_too_big_to_compress_once_per_document_is_skipped_with_the_reason():
    meta = {"num_documents": {"val": 1000}, "train_bytes": 1_000_000, "val_bytes": 500_000}
    result = classical.baselines(DataConfig(), meta, "a CPU")  # before reading a document
    assert result == {"skipped": classical.too_big(meta)} and classical.floor(result) is None
    assert result["skipped"].startswith("1000 val documents x 1,000,000 train bytes is 1,002 MB")
    assert result["skipped"].endswith("over the 200 MB limit")


def stand_in_zpaq(tmp_path: Path) -> Path:
    """A program that takes zpaq's command line and 'archives' by storing: a 100-byte header, then the file."""
    program = tmp_path / "bin" / "zpaq"
    program.parent.mkdir()
    program.write_text(
        '#!/bin/sh\n[ $# -eq 0 ] && { echo "zpaq v0 stand-in"; exit 1; }\n'
        f'echo "$@" >> {tmp_path / "calls"}\n'
        '{ printf "%0100d" 0; cat "$3"; } > "$2"\n'
    )
    program.chmod(0o755)
    return program


def test_zpaq_is_primed_with_the_train_text_and_charged_the_archives_extra_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(classical, "ZPAQ", str(stand_in_zpaq(tmp_path)))
    assert classical.held_out_bits(classical.zpaq, b"train text", [b"abc", b"de"]) == 8 * 5  # the header cancels
    assert (tmp_path / "calls").read_text().splitlines() == ["a arc.zpaq data -m5 -threads 1"] * 3
    assert classical.measured_compressors() == (list(classical.COMPRESSORS), {})
    cfg = corpus_config(tmp_path, 6)
    result = classical.baselines(cfg, prepare(cfg, progress=False).meta, "a CPU")
    (row,) = [r for r in result["rows"] if r["compressor"] == "zpaq -m5"]
    assert row["bits_per_byte"] == 8.0 and result["not_measured"] == {}


def test_without_zpaq_its_row_is_skipped_with_a_one_line_reason_and_the_rest_measured(tmp_path, monkeypatch, capsys):
    from bench.bench_quality import print_baselines

    cfg = corpus_config(tmp_path, 6)
    meta = prepare(cfg, progress=False).meta
    monkeypatch.setattr(classical, "ZPAQ", str(tmp_path / "nowhere" / "zpaq"))
    without = classical.cache_path(cfg)
    result = classical.baselines(cfg, meta, "a CPU")
    assert "zpaq -m5" not in [r["compressor"] for r in result["rows"]] and len(result["rows"]) == 14
    why = f"{tmp_path / 'nowhere' / 'zpaq'} is not installed (Debian: apt-get install zpaq)"
    assert result["not_measured"] == {"zpaq -m5": why}
    print_baselines(result)
    assert capsys.readouterr().out.splitlines()[-1] == f"  zpaq -m5          skipped: {why}"
    monkeypatch.setattr(classical, "ZPAQ", str(stand_in_zpaq(tmp_path)))
    assert classical.cache_path(cfg) != without, "zpaq installed later: measured with it, not read from the cache"


def test_a_zpaq_that_fails_is_one_line_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(classical, "ZPAQ", "false")
    with pytest.raises(RuntimeError, match=r"^false a \.\.\. -m5 failed \(exit 1\): no output$"):
        classical.zpaq(b"text")


@pytest.mark.skipif(shutil.which("zpaq") is None, reason="zpaq is not installed (Debian: apt-get install zpaq)")
def test_the_real_zpaq_m5_charges_a_repeat_of_the_train_text_almost_nothing_and_noise_8_bits():
    rng = random.Random(2)
    train = letters(rng, 20_000)
    assert classical.held_out_bits(classical.zpaq, train, [train]) / len(train) < 0.1
    noise = rng.randbytes(5_000)
    assert 7.9 <= classical.held_out_bits(classical.zpaq, train, [noise]) / len(noise) < 8.6
