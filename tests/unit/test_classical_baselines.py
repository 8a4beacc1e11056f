"""The classical floor (bench/classical.py): the held-out formula, the per-document sum, the val split's own
documents and bytes, and the cache."""

import random
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
    assert [r["compressor"] for r in result["rows"]] == list(classical.COMPRESSORS)
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
