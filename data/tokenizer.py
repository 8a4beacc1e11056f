"""Tokenizers: characters (vocabulary from the corpus), a small byte-level BPE learned from the
train split (via Hugging Face `tokenizers`), and GPT-2's byte-level BPE (via tiktoken).

All reserve one end-of-text id (EOT) that prepare.py puts after every document, so the model
learns where documents end and never reads one document as the continuation of another.
"""

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path

import tiktoken
import tiktoken.load

from data import sources
from data.config import TOKENIZERS, resolve_cache_dir
from data.learn_bpe import EOT_TEXT, learn_spec  # the trainer's settings, where its child process finds them

log = logging.getLogger(__name__)

# GPT-2's pre-tokenizer (Radford et al. 2019, encoder.py): English contractions, optional space plus
# a run of letters / digits / other symbols, then whitespace. BPE merges never cross these pieces.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_VOCAB_SIZE = 50257
TIKTOKEN_TIMEOUT_S = 20.0


class Tokenizer(ABC):
    name: str
    vocab_size: int
    eot_id: int

    @abstractmethod
    def encode(self, text: str) -> list[int]: ...

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str: ...

    @abstractmethod
    def to_meta(self) -> dict:
        """A JSON-serialisable identity that tokenizer_from_meta turns back into this tokenizer."""

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for: a byte-level BPE token may hold part of a character only."""
        return self.decode([token_id]).encode()


class CharTokenizer(Tokenizer):
    """One id per character of `chars` (sorted), then the EOT id = len(chars)."""

    def __init__(self, chars: str):
        if list(chars) != sorted(set(chars)):  # a checkpoint's header may hold anything
            raise ValueError("a char tokenizer's chars must be sorted and unique")
        self.name = "char"
        self.chars = chars
        self.eot_id = len(chars)
        self.vocab_size = len(chars) + 1
        self._stoi = {c: i for i, c in enumerate(chars)}

    def encode(self, text: str) -> list[int]:
        try:
            return [self._stoi[c] for c in text]
        except KeyError:
            unknown = ", ".join(repr(c) for c in sorted(set(text) - self._stoi.keys()))
            raise ValueError(
                f"characters {unknown} are not in the char vocabulary ({len(self.chars)} characters)"
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        pieces = []
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the char vocabulary [0, {self.vocab_size})")
            pieces.append(EOT_TEXT if i == self.eot_id else self.chars[i])
        return "".join(pieces)

    def to_meta(self) -> dict:
        return {"name": self.name, "chars": self.chars}


class GPT2Tokenizer(Tokenizer):
    """GPT-2's 50,257-token BPE; its own <|endoftext|> (50256) is the EOT."""

    def __init__(self, encoding: tiktoken.Encoding):
        assert encoding.n_vocab == GPT2_VOCAB_SIZE, f"expected {GPT2_VOCAB_SIZE} tokens, got {encoding.n_vocab}"
        self.name = "gpt2"
        self.encoding = encoding
        self.eot_id = encoding.eot_token
        self.vocab_size = encoding.n_vocab

    # encode_ordinary: a corpus that contains the text "<|endoftext|>" is data, not a separator.
    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.encoding.encode_ordinary_batch(texts)

    def decode(self, ids: Iterable[int]) -> str:
        return self.encoding.decode(list(ids))

    def token_bytes(self, token_id: int) -> bytes:
        return self.encoding.decode_single_token_bytes(token_id)

    def to_meta(self) -> dict:
        return {"name": self.name}


class BPETokenizer(Tokenizer):
    """A byte-level BPE of `vocab_size` ids learned from a corpus: EOT is id 0, the 256 bytes follow,
    then the merges in the order they were learned. Any text encodes (every byte is a token).

    Why it exists: a char model spends a position on each character, and GPT-2's 50k-row head costs
    a small model more than its blocks. A few thousand merges let each position cover ~3 bytes
    of Shakespeare for a head that stays small (docs/evidence/recipe/search.md, "the tokenizer")."""

    def __init__(self, spec: str):
        from tokenizers import Tokenizer as HFTokenizer  # Rust BPE; imported only when one is used

        self.name = "bpe"
        self.spec = spec  # tokenizers' JSON: the whole identity (vocabulary, merges, pre-tokenizer)
        self._tok = HFTokenizer.from_str(spec)
        self._tok.encode_special_tokens = True  # text that spells "<|endoftext|>" is data, not the EOT
        self.eot_id = self._tok.token_to_id(EOT_TEXT)
        self.vocab_size = self._tok.get_vocab_size()
        assert self.eot_id == 0, "a learned BPE keeps its EOT at id 0"

    @classmethod
    def learn(cls, texts: Iterable[str], vocab_size: int, show_progress: bool = False) -> "BPETokenizer":
        return cls(learn_spec(texts, vocab_size, show_progress))

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def pieces(self, text: str) -> list[str]:
        """The pre-tokenizer's pieces of `text` (GPT-2's split, each byte drawn as one symbol): no merge crosses one."""
        return [piece for piece, _ in self._tok.pre_tokenizer.pre_tokenize_str(text)]

    def decode(self, ids: Iterable[int]) -> str:
        ids = list(ids)
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the bpe vocabulary [0, {self.vocab_size})")
        return self._tok.decode(ids, skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        self.decode([token_id])  # refuses an id outside the vocabulary
        if token_id == self.eot_id:
            return EOT_TEXT.encode()
        return bytes(BYTE_OF_SYMBOL[symbol] for symbol in self._tok.id_to_token(token_id))

    def to_meta(self) -> dict:
        return {"name": self.name, "spec": self.spec}


def byte_level_symbols() -> dict[str, int]:
    """The byte-level pre-tokenizer's alphabet (GPT-2's): each byte drawn as one printable character,
    itself where it is printable, else the next unused code point from 256 up; symbol -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(others)}


BYTE_OF_SYMBOL = byte_level_symbols()


def gpt2_encoding_from_file(path: Path) -> tiktoken.Encoding:
    ranks = tiktoken.load.load_tiktoken_bpe(str(path), expected_hash=sources.GPT2_RANKS_SHA256)
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={EOT_TEXT: GPT2_VOCAB_SIZE - 1},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )


def _tiktoken_gpt2(timeout_s: float) -> tiktoken.Encoding | None:
    """tiktoken's own gpt2 encoding, or None if it cannot be had within `timeout_s`.

    Without a cached copy tiktoken downloads it with requests.get and no timeout: where DNS fails
    that errors in milliseconds, but behind a firewall that drops packets it would wait forever.
    A daemon thread bounds the wait and cannot keep the interpreter alive at exit.
    """
    result: list[tiktoken.Encoding] = []

    def load() -> None:
        try:
            result.append(tiktoken.get_encoding("gpt2"))
        except Exception as e:  # any failure just means "use the fallback"
            log.info("tiktoken.get_encoding('gpt2') failed (%s); using the openai-whisper sdist", e)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        log.info("tiktoken.get_encoding('gpt2') did not finish in %.0fs; using the openai-whisper sdist", timeout_s)
    return result[0] if result else None


def gpt2_tokenizer(cache_dir: Path) -> GPT2Tokenizer:
    # A ranks file we already verified is the one source that needs no network at all.
    path = sources.gpt2_ranks_file(cache_dir, download=False)
    encoding = None if path else _tiktoken_gpt2(TIKTOKEN_TIMEOUT_S)
    if encoding is None:
        encoding = gpt2_encoding_from_file(path or sources.gpt2_ranks_file(cache_dir))
    return GPT2Tokenizer(encoding)


def build_tokenizer(
    name: str, texts: Iterable[str] | None, cache_dir: str | Path, bpe_vocab_size: int = 0
) -> Tokenizer:
    """A tokenizer by name; `char` takes its vocabulary from `texts`, `bpe` learns its merges from
    them, `gpt2` ignores them."""
    if name == "char":
        if texts is None:
            raise ValueError("the char tokenizer needs the corpus texts to build its vocabulary")
        chars: set[str] = set()
        for text in texts:
            chars.update(text)
        return CharTokenizer("".join(sorted(chars)))
    if name == "bpe":
        if texts is None:
            raise ValueError("the bpe tokenizer needs the corpus texts to learn its merges")
        return BPETokenizer.learn(texts, bpe_vocab_size)
    if name == "gpt2":
        return gpt2_tokenizer(resolve_cache_dir(cache_dir))
    raise ValueError(f"tokenizer {name!r} is unknown; choose one of: {', '.join(TOKENIZERS)}")


def tokenizer_from_meta(meta: dict, cache_dir: str | Path = "") -> Tokenizer:
    """Rebuild the tokenizer that `to_meta()` described (e.g. from a checkpoint or meta.json); `cache_dir`:
    where GPT-2's ranks are (resolve_cache_dir's default if empty)."""
    if meta.get("name") == "char":
        return CharTokenizer(meta["chars"])
    if meta.get("name") == "bpe":
        return BPETokenizer(meta["spec"])
    if meta.get("name") == "gpt2":
        return gpt2_tokenizer(resolve_cache_dir(cache_dir))
    raise ValueError(f"tokenizer meta names {meta.get('name')!r}; expected one of: {', '.join(TOKENIZERS)}")
