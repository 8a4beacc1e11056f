"""A corpus's documents, read on demand in bounded pieces: files straight from disk (no second copy of the
text anywhere), or the rows of a `datasets.Dataset` (Hub corpora).

Each document is known by its size in UTF-8 bytes, and read as a range of those bytes, in pieces of at
most PIECE_CHARS characters. A piece ends where GPT-2's pre-tokenizer has a boundary anyway (a printable
ASCII character followed by a space or a newline: every pattern of that split stops there and none looks
past it), so tokenizing the pieces one by one gives the ids of tokenizing the whole text at once, and a
gigabyte file never sits in memory whole.
"""

import codecs
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import datasets

BLOCK = 1 << 18
PIECE_CHARS = 1 << 17
UTF8_BOM = codecs.BOM_UTF8
_BOUNDARY = re.compile(r"[!-~](?=[ \n])")


class Documents:
    """Files, one document each, read exactly as written (newlines too), a leading byte-order mark dropped."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self._starts = [len(UTF8_BOM) if _has_bom(p) else 0 for p in paths]
        self.sizes = [p.stat().st_size - start for p, start in zip(paths, self._starts, strict=True)]

    def __len__(self) -> int:
        return len(self.sizes)

    def blocks(self, i: int, start: int, end: int) -> Iterator[bytes]:
        with open(self.paths[i], "rb") as f:
            f.seek(self._starts[i] + start)
            left = end - start
            while left > 0:
                block = f.read(min(BLOCK, left))
                if not block:  # the file shrank while read: its stamp no longer matches, the next run re-reads
                    raise ValueError(f"data.files entry {str(self.paths[i])!r} changed while it was read; run again")
                left -= len(block)
                yield block


class DatasetDocuments:
    """The "text" column of a `datasets.Dataset`, one row a document."""

    def __init__(self, ds: "datasets.Dataset"):
        self._ds = ds
        self.sizes = [len(text.encode("utf-8")) for batch in ds.iter(batch_size=1024) for text in batch["text"]]

    def __len__(self) -> int:
        return len(self.sizes)

    def blocks(self, i: int, start: int, end: int) -> Iterator[bytes]:
        data = self._ds[i]["text"].encode("utf-8")
        for offset in range(start, end, BLOCK):
            yield data[offset : min(offset + BLOCK, end)]


def _has_bom(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(len(UTF8_BOM)) == UTF8_BOM


def char_boundary(docs: Documents | DatasetDocuments, i: int, offset: int) -> int:
    """`offset` moved forward to the start of a character (past UTF-8 continuation bytes) of document `i`."""
    ahead = b"".join(docs.blocks(i, offset, min(offset + 4, docs.sizes[i])))
    return offset + next((n for n, byte in enumerate(ahead) if byte & 0xC0 != 0x80), len(ahead))


def pieces(docs: Documents | DatasetDocuments, i: int, start: int = 0, end: int | None = None) -> Iterator[str]:
    """The text of bytes [start, end) of document `i`, in pieces cut only at pre-token boundaries."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    text = ""
    for block in docs.blocks(i, start, docs.sizes[i] if end is None else end):
        text += decoder.decode(block)
        while len(text) > PIECE_CHARS:
            cut = safe_cut(text, PIECE_CHARS)
            if cut is None:
                break
            yield text[:cut]
            text = text[cut:]
    text += decoder.decode(b"", final=True)
    if text:
        yield text


def safe_cut(text: str, limit: int) -> int | None:
    """The last position p <= limit (from limit // 2) where a printable ASCII character is followed by a space or a
    newline, else the first past it; None if there is none (a run without a space is one pre-token anyway)."""
    before = [m.end() for m in _BOUNDARY.finditer(text, limit // 2, limit + 1)]
    if before:
        return before[-1]
    after = _BOUNDARY.search(text, limit)
    return after.end() if after else None
