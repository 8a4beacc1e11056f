"""Our tokenizers as Hugging Face tokenizers, so an exported model generates text in transformers.

- char: a `tokenizers` BPE model with no merges over the character vocabulary splits any text into
  single characters, each its own id (as `CharTokenizer`); the end-of-text id is a special token
  after them. Decoding fuses the pieces back without spaces.
- gpt2: tiktoken keeps only ranks (token bytes -> id); a Hugging Face BPE wants a vocabulary
  (token -> id, bytes shown through GPT-2's byte-to-unicode table) and merges (the pair merged
  into each multi-byte token, in rank order), written into tokenizer.json. Each token's pair is recovered by
  running BPE on its bytes with only the lower-ranked merges, which stops at exactly two parts.

- bpe: the learned BPE is a `tokenizers` model already; its JSON is written as it is.

`read_own_tokenizer` recognises a char or learned-BPE tokenizer written here, so an exported model
imports back with its own vocabulary. `transformers` and `tokenizers` are optional: imported only when a
tokenizer is written.
"""

import json
from pathlib import Path
from typing import TYPE_CHECKING

from data.text_file import NotJSON, read_json

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

EOT_TEXT = "<|endoftext|>"  # data.tokenizer.EOT_TEXT; kept here so model/ does not import data/


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table: printable Latin-1 bytes stand for
    themselves, the other 68 (control bytes, space, ...) take the characters from U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def token_string(token: bytes, table: dict[int, str]) -> str:
    return "".join(table[b] for b in token)


def merge_parts(ranks: dict[bytes, int], token: bytes) -> tuple[bytes, bytes]:
    """The two tokens BPE merged into `token`: byte-level BPE on it using only lower-ranked merges."""
    rank = ranks[token]
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        pairs = [(ranks.get(parts[i] + parts[i + 1]), i) for i in range(len(parts) - 1)]
        pairs = [(r, i) for r, i in pairs if r is not None and r < rank]
        if not pairs:
            break
        _, i = min(pairs)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise ValueError(f"GPT-2 rank {rank} ({token!r}) is not a merge of two lower-ranked tokens")
    return parts[0], parts[1]


def gpt2_vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """tiktoken's mergeable ranks -> (vocab.json's mapping, merges.txt's pairs in rank order)."""
    table = bytes_to_unicode()
    vocab = {token_string(token, table): rank for token, rank in ranks.items()}
    merges = []
    for token, _ in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            left, right = merge_parts(ranks, token)
            merges.append((token_string(left, table), token_string(right, table)))
    return vocab, merges


def gpt2_hf_tokenizer(ranks: dict[bytes, int]) -> "PreTrainedTokenizerFast":
    """GPT-2's byte-level BPE (saved as tokenizer.json, vocab.json and merges.txt), EOT after the ranks."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab, merges = gpt2_vocab_and_merges(ranks)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's split pattern, then bytes
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOT_TEXT, special=True, normalized=False)])
    assert tok.token_to_id(EOT_TEXT) == len(ranks), "GPT-2's EOT is the id after its ranks"
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOT_TEXT, eos_token=EOT_TEXT, clean_up_tokenization_spaces=False
    )


def char_hf_tokenizer(chars: str) -> "PreTrainedTokenizerFast":
    """One token per character of `chars` (id = its index), EOT = len(chars) as a special token."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], ignore_merges=True))
    tok.decoder = decoders.Fuse()  # join the characters as they are (the default would add spaces)
    tok.add_special_tokens([AddedToken(EOT_TEXT, special=True, normalized=False)])  # gets id len(chars)
    assert tok.token_to_id(EOT_TEXT) == len(chars), "EOT must follow the characters, as in CharTokenizer"
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOT_TEXT,
        eos_token=EOT_TEXT,
        clean_up_tokenization_spaces=False,
    )


def bpe_hf_tokenizer(spec: str) -> "PreTrainedTokenizerFast":
    """A learned BPE (data.tokenizer.BPETokenizer): its `tokenizers` JSON is already what HF loads."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(spec)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOT_TEXT, eos_token=EOT_TEXT, clean_up_tokenization_spaces=False
    )


def save_hf_tokenizer(tokenizer_meta: dict, out_dir: Path, gpt2_ranks: dict[bytes, int] | None = None) -> None:
    """Write the tokenizer a checkpoint names (its `tokenizer` meta) into an HF model directory.

    gpt2_ranks: tiktoken's mergeable ranks for the gpt2 tokenizer (the caller loads them)."""
    name = tokenizer_meta.get("name")
    if name == "char":
        hf = char_hf_tokenizer(tokenizer_meta["chars"])
    elif name == "gpt2":
        if gpt2_ranks is None:
            raise ValueError("the gpt2 tokenizer needs its BPE ranks to be exported")
        hf = gpt2_hf_tokenizer(gpt2_ranks)
    elif name == "bpe":
        hf = bpe_hf_tokenizer(tokenizer_meta["spec"])
    else:
        raise ValueError(f"tokenizer {name!r} cannot be exported to Hugging Face; char, bpe and gpt2 can")
    hf.save_pretrained(str(out_dir))


def learned_bpe_spec(spec: dict) -> str:
    """A learned BPE's `tokenizers` JSON as BPETokenizer wrote it: transformers adds a post-processor
    that inserts nothing (no special tokens), which ours never had; dropped, the spec is the one that
    was exported, so the checkpoint's tokenizer meta matches the run it came from."""
    from tokenizers import Tokenizer

    post = spec.get("post_processor") or {}
    if post.get("type") == "TemplateProcessing" and not post.get("special_tokens"):
        spec = {**spec, "post_processor": None}
    return Tokenizer.from_str(json.dumps(spec)).to_str()


def read_own_tokenizer(hf_dir: Path) -> dict | None:
    """The tokenizer meta of a char or learned-BPE tokenizer that `save_hf_tokenizer` wrote into
    hf_dir, else None (no tokenizer.json, or one of another shape: GPT-2's BPE, say)."""
    path = Path(hf_dir) / "tokenizer.json"
    try:
        spec = read_json(path, "tokenizer")  # bounded; a FIFO or a file past the cap is refused in one line
        model, added = spec["model"], spec.get("added_tokens", [])
        vocab, decoder = model["vocab"], (spec.get("decoder") or {}).get("type")
        if model["type"] != "BPE":
            return None
    except (FileNotFoundError, NotJSON, KeyError, TypeError, AttributeError):
        return None
    eot = [t.get("id") for t in added if t.get("content") == EOT_TEXT]
    if decoder == "ByteLevel" and eot == [0]:  # ours: EOT first; GPT-2's own puts it last
        return {"name": "bpe", "spec": learned_bpe_spec(spec)}
    if decoder != "Fuse" or model["merges"]:
        return None
    chars = "".join(sorted(vocab, key=vocab.get)) if all(len(c) == 1 for c in vocab) else ""
    if (
        chars
        and sorted(vocab.values()) == list(range(len(vocab)))
        and list(chars) == sorted(chars)
        and eot == [len(chars)]
    ):
        return {"name": "char", "chars": chars}
    return None
