"""Writing a split corpus as flat token files: train.bin and val.bin, each the concatenation of its
segments' token ids, each segment followed by the EOT id.

Text is tokenized in batches of about ENCODE_BATCH_BYTES, or more on a machine whose cores it would not keep
busy (`encode_batch_bytes`: at least two pieces a core): the learned BPE's `encode_batch` spreads a batch's
pieces over every core, and the batch is small enough that Ctrl-C, which Python sees only between batches,
lands within a second or two. With BPE-dropout, train.bin holds `copies` random segmentations of each
chunk of train segments (up to CHUNK_DOCUMENTS segments and CHUNK_BYTES bytes), one after another.
"""

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from data.bpe_dropout import BPEDropout
from data.documents import PIECE_CHARS, DatasetDocuments, Documents, pieces
from data.split import Segment
from data.tokenizer import Tokenizer

SPLITS = ("train", "val")
CHUNK_DOCUMENTS = 1024
CHUNK_BYTES = 64 << 20
ENCODE_BATCH_BYTES = 1 << 20


def encode_batch_bytes() -> int:
    """Bytes of text a batch takes: ENCODE_BATCH_BYTES, or two pieces (PIECE_CHARS) for each core if that is more."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(ENCODE_BATCH_BYTES, 2 * cores * PIECE_CHARS)


def write_splits(
    tmp: Path,
    docs: Documents | DatasetDocuments,
    segments: list[Segment],
    tokenizer: Tokenizer,
    segmenter: tuple[BPEDropout, int] | None,
    dtype: np.dtype,
    on_bytes: Callable[[int], None],
) -> dict:
    """Tokenize each split's segments into tmp/{train,val}.bin; each split's token, byte and document counts.
    `segmenter`: (BPE-dropout, copies) for train, or None; `on_bytes(n)` after each n bytes tokenized."""
    counts = {split: {"tokens": 0, "bytes": 0, "documents": 0} for split in SPLITS}
    with open(tmp / "train.bin", "wb") as train_f, open(tmp / "val.bin", "wb") as val_f:
        files = {"train": train_f, "val": val_f}
        for chunk in chunks(segments):
            for split in SPLITS:
                chosen = [s for s in chunk if s.split == split]
                counts[split]["documents"] += len(chosen)
                counts[split]["bytes"] += sum(s.end - s.start for s in chosen)
                if split == "train" and segmenter:
                    write = _write_segmentations(files[split], docs, chosen, tokenizer.eot_id, dtype, *segmenter)
                else:
                    write = _write_tokens(files[split], docs, chosen, tokenizer, dtype)
                for tokens, size in write:
                    counts[split]["tokens"] += tokens
                    on_bytes(size)
    return counts


def chunks(segments: list[Segment]) -> Iterator[list[Segment]]:
    chunk: list[Segment] = []
    size = 0
    for segment in segments:
        if chunk and (len(chunk) == CHUNK_DOCUMENTS or size + segment.end - segment.start > CHUNK_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(segment)
        size += segment.end - segment.start
    if chunk:
        yield chunk


def _pieces(docs: Documents | DatasetDocuments, segment: Segment) -> Iterator[tuple[str, bool]]:
    """(text, ends the segment): an empty segment (an empty file) is one empty piece, so it still gets its EOT."""
    previous = None
    for piece in pieces(docs, segment.doc, segment.start, segment.end):
        if previous is not None:
            yield previous, False
        previous = piece
    yield previous or "", True


def _write_tokens(
    f: BinaryIO, docs: Documents | DatasetDocuments, segments: list[Segment], tokenizer: Tokenizer, dtype: np.dtype
) -> Iterator[tuple[int, int]]:
    """(tokens, bytes) written per batch."""
    batch: list[tuple[str, bool]] = []
    size, limit = 0, encode_batch_bytes()
    for segment in segments:
        for text, last in _pieces(docs, segment):
            batch.append((text, last))
            size += len(text.encode("utf-8"))
            if size >= limit:
                yield _write_batch(f, tokenizer, batch, dtype), size
                batch, size = [], 0
    if batch:
        yield _write_batch(f, tokenizer, batch, dtype), size


def _write_batch(f: BinaryIO, tokenizer: Tokenizer, batch: list[tuple[str, bool]], dtype: np.dtype) -> int:
    ids: list[int] = []
    for piece_ids, (_, last) in zip(tokenizer.encode_batch([text for text, _ in batch]), batch, strict=True):
        ids.extend(piece_ids)
        if last:
            ids.append(tokenizer.eot_id)
    return _write_ids(f, ids, dtype)


def _write_segmentations(
    f: BinaryIO,
    docs: Documents | DatasetDocuments,
    segments: list[Segment],
    eot_id: int,
    dtype: np.dtype,
    segmenter: BPEDropout,
    copies: int,
) -> Iterator[tuple[int, int]]:
    """`copies` random segmentations of the train segments, one after another (data/bpe_dropout.py)."""
    for _ in range(copies):
        for segment in segments:
            for text, last in _pieces(docs, segment):
                ids = segmenter.encode(text) + ([eot_id] if last else [])
                yield _write_ids(f, ids, dtype), len(text.encode("utf-8"))


def _write_ids(f: BinaryIO, ids: list[int], dtype: np.dtype) -> int:
    f.write(np.array(ids, dtype=dtype).tobytes())
    return len(ids)
