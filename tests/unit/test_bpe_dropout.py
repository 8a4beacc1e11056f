"""BPE-dropout (data/bpe_dropout.py): p = 0 is the tokenizer's own BPE, p > 0 cuts text into finer pieces that
still spell it exactly, a seed fixes the pieces, and the prepared train split holds the asked copies."""

from dataclasses import replace

import numpy as np
import pytest

from data import prepare
from data.bpe_dropout import LONGEST_PIECE, BPEDropout
from data.tokenizer import BPETokenizer, CharTokenizer
from tests.unit.test_data import files_cfg, split_by_eot, write_docs

TEXTS = ["the king and the queen and the prince\n" * 20, "to be or not to be, the question\n" * 20]
UNSEEN = "The prince: Ünïcödé, 日本語 — to be, or the king?\n\n  indented\tlines "


@pytest.fixture(scope="module")
def bpe():
    return BPETokenizer.learn(TEXTS, vocab_size=300)


def test_no_dropout_is_the_tokenizers_own_bpe(bpe):
    segmenter = BPEDropout(bpe, 0.0, seed=0)
    for text in [*TEXTS, UNSEEN]:
        assert segmenter.encode(text) == bpe.encode(text)


def test_dropout_spells_the_same_text_in_more_pieces(bpe):
    segmenter = BPEDropout(bpe, 0.3, seed=0)
    text = TEXTS[0]
    pieces = [segmenter.encode(text) for _ in range(3)]
    assert all(bpe.decode(ids) == text for ids in pieces), "a segmentation never changes the text"
    assert all(len(ids) > len(bpe.encode(text)) for ids in pieces)
    assert len({tuple(ids) for ids in pieces}) == 3, "each call draws a new segmentation"
    assert bpe.decode(segmenter.encode(UNSEEN)) == UNSEEN


def test_a_piece_with_no_space_in_it_costs_its_length_not_its_square(bpe):
    # Defect: a 300 KB line of letters (one pre-tokenizer piece) took hours: each merge step rescanned the piece
    longest = max(len(piece) for text in TEXTS for piece in bpe.pieces(text))
    assert longest <= LONGEST_PIECE  # pieces of ordinary text are segmented whole
    line = "theking" * 3000  # 21,000 symbols in one piece
    segmenter, merged = BPEDropout(bpe, 0.1, seed=0), []
    encode_part = segmenter._encode_piece
    segmenter._encode_piece = lambda ids: merged.append(len(ids)) or encode_part(ids)
    assert bpe.decode(segmenter.encode(line)) == line
    assert max(merged) == LONGEST_PIECE and sum(merged) == len(line)  # in parts, each merged at a part's cost


def test_the_seed_fixes_the_segmentation(bpe):
    assert BPEDropout(bpe, 0.2, seed=7).encode(TEXTS[1]) == BPEDropout(bpe, 0.2, seed=7).encode(TEXTS[1])
    assert BPEDropout(bpe, 0.2, seed=7).encode(TEXTS[1]) != BPEDropout(bpe, 0.2, seed=8).encode(TEXTS[1])


def test_bad_arguments_are_named(bpe):
    with pytest.raises(ValueError, match=r"p=1.0 must be in \[0, 1\)"):
        BPEDropout(bpe, 1.0, seed=0)
    with pytest.raises(ValueError, match=r"needs data.tokenizer=bpe, not 'char'"):
        BPEDropout(CharTokenizer("abc"), 0.1, seed=0)


DOCS = [f"the common words of document {i}, the common words again\n" * 4 for i in range(8)]


def test_prepared_train_holds_the_copies_and_val_stays_deterministic(tmp_path):
    write_docs(tmp_path / "docs", DOCS)
    cfg = files_cfg(tmp_path, tokenizer="bpe", bpe_vocab_size=290, val_fraction=0.25, split_seed=3)
    plain = prepare(cfg, progress=False)
    dropped = prepare(replace(cfg, bpe_dropout=0.2, bpe_dropout_copies=3), progress=False)
    assert dropped.fingerprint != plain.fingerprint
    train = split_by_eot(plain, "train")
    assert split_by_eot(dropped, "train") == train * 3, "three copies of each train document, in order"
    assert len(dropped.train) > 3 * len(plain.train), "in finer pieces"
    assert np.array_equal(dropped.val, plain.val), "val is scored on the one deterministic segmentation"
    assert dropped.meta["train_bytes"] == plain.meta["train_bytes"]
    again = prepare(replace(cfg, bpe_dropout=0.2, bpe_dropout_copies=3, cache_dir=str(tmp_path / "c2")), progress=False)
    assert np.array_equal(again.train, dropped.train), "the same config prepares the same tokens anywhere"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tokenizer": "bpe", "bpe_dropout": 1.0}, r"data.bpe_dropout=1.0 must be in \[0, 1\)"),
        ({"tokenizer": "bpe", "bpe_dropout": -0.1}, r"data.bpe_dropout=-0.1 must be in \[0, 1\)"),
        ({"tokenizer": "bpe", "bpe_dropout_copies": 0}, "data.bpe_dropout_copies=0 must be >= 1"),
    ],
)
def test_bad_configs_name_the_value(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        replace(files_cfg(tmp_path), **overrides).validate()


def test_other_tokenizers_ignore_it_as_they_ignore_the_bpe_size(tmp_path):
    # A `data.tokenizer=char` override on the default BPE config keeps working, and prepares plain chars.
    write_docs(tmp_path / "docs", DOCS)
    plain = prepare(files_cfg(tmp_path), progress=False)
    with_dropout = prepare(files_cfg(tmp_path, bpe_dropout=0.2, bpe_dropout_copies=3), progress=False)
    assert with_dropout.fingerprint == plain.fingerprint and np.array_equal(with_dropout.train, plain.train)
