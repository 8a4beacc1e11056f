"""Tokenize a corpus once into flat train/val token files, cached under a fingerprint of its inputs.

Layout: `<cache>/prepared/<fingerprint>/{train.bin, val.bin, meta.json}`. Each .bin is the
concatenation of its documents' token ids, each document followed by the EOT id, so batches can
be cut anywhere (batches.py) and the model sees where documents end.

The split is by document: a seeded shuffle picks ceil(val_fraction * n) documents for val (at
least 1, leaving at least 1 for train). A corpus of a single document (e.g. tiny_shakespeare's
one-row train split) is instead cut at the character (1 - val_fraction) * len(text): the head is
train, the tail is val, and each half counts as one document.
"""

import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
from tqdm import tqdm

from data.batches import PreparedData
from data.bpe_dropout import BPEDropout
from data.config import DataConfig, resolve_cache_dir
from data.sources import load_documents, publish_dir, source_identity
from data.tokenizer import Tokenizer, build_tokenizer, tokenizer_from_meta

if TYPE_CHECKING:  # imported only when a corpus is actually prepared: a cache hit does not pay for it
    import datasets

log = logging.getLogger(__name__)

# Bump when the on-disk layout or the split/tokenization rules change, so old caches are not reused.
FORMAT_VERSION = 1
SPLITS = ("train", "val")
CHUNK_DOCUMENTS = 1024


def cache_key(cfg: DataConfig) -> dict:
    """Everything that determines the prepared tokens (and nothing about where they are cached)."""
    return {
        "format": FORMAT_VERSION,
        "source": source_identity(cfg),
        "tokenizer": cfg.tokenizer,
        **({"bpe_vocab_size": cfg.bpe_vocab_size} if cfg.tokenizer == "bpe" else {}),
        **(
            {"bpe_dropout": cfg.bpe_dropout, "bpe_dropout_copies": cfg.bpe_dropout_copies}
            if cfg.segments_with_dropout
            else {}
        ),
        "val_fraction": cfg.val_fraction,
        "split_seed": cfg.split_seed,
    }


def fingerprint(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def split_documents(num_documents: int, val_fraction: float, seed: int) -> np.ndarray:
    """Boolean mask, True for the documents that go to val; needs at least two documents."""
    assert num_documents >= 2, f"need two documents to split by document, got {num_documents}"
    num_val = min(max(math.ceil(val_fraction * num_documents), 1), num_documents - 1)
    order = np.random.default_rng(seed).permutation(num_documents)
    is_val = np.zeros(num_documents, dtype=bool)
    is_val[order[:num_val]] = True
    return is_val


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def prepare(cfg: DataConfig, progress: bool = True) -> PreparedData:
    """Tokenize and split the corpus `cfg` names, or reuse the cached result of an earlier call."""
    cfg.validate()
    cache_dir = resolve_cache_dir(cfg.cache_dir)
    key = cache_key(cfg)
    fp = fingerprint(key)
    directory = cache_dir / "prepared" / fp
    if directory.is_dir():
        log.info("using prepared data in %s", directory)
        return load_prepared(directory, cache_dir)

    start = time.perf_counter()
    check_writable(cache_dir)
    docs = load_documents(cfg, progress)
    if docs.num_rows == 0:
        raise ValueError(f"data.source={cfg.source!r} gave no documents to prepare")
    # BPE learns its merges from the train split alone, so no merge is fitted to the val text it is
    # scored on; char takes every character (its vocabulary must cover val).
    texts = _train_texts(docs, cfg) if cfg.tokenizer == "bpe" else _texts(docs)
    tokenizer = build_tokenizer(cfg.tokenizer, texts, cache_dir, cfg.bpe_vocab_size)
    dtype = token_dtype(tokenizer.vocab_size)
    segmenter = BPEDropout(tokenizer, cfg.bpe_dropout, seed=cfg.split_seed) if cfg.segments_with_dropout else None
    directory.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_builds(directory.parent)
    # Written into a temp dir and renamed into place only when complete: a crash leaves no `directory`.
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{fp}-"))
    builder = hold_build_lock(tmp)
    try:
        counts = _write_splits(tmp, docs, cfg, tokenizer, segmenter, dtype, progress)
        check_splits_hold_text(counts, cfg)
        meta = _meta(cfg, key, fp, tokenizer, dtype, counts, docs.num_rows)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(builder)
        raise
    publish_dir(tmp, directory)  # still locked while renamed, so no other process takes it for abandoned
    (directory / BUILD_LOCK).unlink(missing_ok=True)
    os.close(builder)
    log.info(
        "prepared %s in %.1fs: %d train / %d val tokens",
        directory,
        time.perf_counter() - start,
        meta["train_tokens"],
        meta["val_tokens"],
    )
    return load_prepared(directory, cache_dir)


def _write_splits(
    tmp: Path,
    docs: "datasets.Dataset",
    cfg: DataConfig,
    tokenizer: Tokenizer,
    segmenter: BPEDropout | None,
    dtype: np.dtype,
    progress: bool,
) -> dict:
    """Tokenize each split's documents into tmp/{train,val}.bin; each split's token, byte and document counts."""
    counts = {split: {"tokens": 0, "bytes": 0, "documents": 0} for split in SPLITS}
    with open(tmp / "train.bin", "wb") as train_f, open(tmp / "val.bin", "wb") as val_f:
        files = {"train": train_f, "val": val_f}
        # A single document is written as two pieces (see the module docstring).
        pieces = docs.num_rows + (docs.num_rows == 1)
        bar = tqdm(total=pieces, desc="tokenizing", unit="doc", disable=not progress)
        for split, texts in split_chunks(docs, cfg):
            counts[split]["documents"] += len(texts)
            counts[split]["bytes"] += sum(len(t.encode("utf-8")) for t in texts)
            if split == "train" and segmenter:
                counts[split]["tokens"] += _write_segmentations(
                    files[split], segmenter, texts, cfg.bpe_dropout_copies, tokenizer.eot_id, dtype
                )
            else:
                counts[split]["tokens"] += _write_tokens(files[split], tokenizer, texts, dtype)
            bar.update(len(texts))
        bar.close()
    return counts


def check_splits_hold_text(counts: dict, cfg: DataConfig) -> None:
    """Both splits hold some text, refused before the cache entry exists: empty files held out left a val split
    of no bytes, which every later load refused as a damaged cache however often it was prepared again."""
    for split in SPLITS:
        if counts[split]["bytes"] == 0:
            n = counts[split]["documents"]
            raise ValueError(
                f"the {split} split's {n} document{' holds' if n == 1 else 's hold'} no text (data.split_seed="
                f"{cfg.split_seed} chose them, data.val_fraction={cfg.val_fraction}): remove empty files from "
                "data.files, or choose another data.split_seed"
            )


def _meta(
    cfg: DataConfig, key: dict, fp: str, tokenizer: Tokenizer, dtype: np.dtype, counts: dict, documents: int
) -> dict:
    """meta.json: what a prepared directory holds, read back by load_prepared."""
    return {
        "format": FORMAT_VERSION,
        "fingerprint": fp,
        "source": key["source"],
        "tokenizer": tokenizer.to_meta(),
        "vocab_size": tokenizer.vocab_size,
        "eot_id": tokenizer.eot_id,
        "dtype": dtype.name,
        "val_fraction": cfg.val_fraction,
        "split_seed": cfg.split_seed,
        **{name: key[name] for name in ("bpe_dropout", "bpe_dropout_copies") if name in key},
        "num_documents": {split: counts[split]["documents"] for split in SPLITS},
        "split_by": "text" if documents == 1 else "document",  # one document is cut at val_fraction of its text
        **{f"{split}_tokens": counts[split]["tokens"] for split in SPLITS},
        **{f"{split}_bytes": counts[split]["bytes"] for split in SPLITS},
    }


BUILD_LOCK = ".building"  # flocked by the process writing a temp dir, for as long as it writes


def hold_build_lock(tmp: Path) -> int:
    fd = os.open(tmp / BUILD_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def remove_abandoned_builds(prepared: Path) -> None:
    """Delete the temp dirs of preparations whose process died (SIGKILL, a crash): their lock is free.
    A corpus's partial token files can be gigabytes, in a hidden directory no one would find."""
    for tmp in prepared.glob(".*-*"):
        try:
            fd = os.open(tmp / BUILD_LOCK, os.O_RDWR)
        except OSError:  # no lock file: not a build of ours (or one a moment old), left alone
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live preparation, in another process
        finally:
            os.close(fd)
        log.info("removing %s, left by a preparation that was killed", tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def check_writable(cache_dir: Path) -> None:
    """Refuse a cache that cannot be written in one line, before the sdist, `datasets` or the tokens do
    with a bare errno: e.g. a read-only or another user's $ATTNLAB_CACHE."""
    try:
        (cache_dir / "prepared").mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=cache_dir / "prepared").close()
    except OSError as e:
        raise ValueError(
            f"the data cache {cache_dir} cannot be written ({e.strerror}: {e.filename}); "
            "set ATTNLAB_CACHE or data.cache_dir to a writable directory"
        ) from None


def _texts(docs: "datasets.Dataset") -> Iterator[str]:
    for batch in docs.iter(batch_size=CHUNK_DOCUMENTS):
        yield from batch["text"]


def _train_texts(docs: "datasets.Dataset", cfg: DataConfig) -> Iterator[str]:
    for split, texts in split_chunks(docs, cfg):
        if split == "train":
            yield from texts


def split_chunks(docs: "datasets.Dataset", cfg: DataConfig) -> Iterator[tuple[str, list[str]]]:
    """(split, texts) chunks in corpus order; every document lands in exactly one split."""
    if docs.num_rows == 1:
        text = docs[0]["text"]
        cut = int((1 - cfg.val_fraction) * len(text))
        yield "train", [text[:cut]]
        yield "val", [text[cut:]]
        return
    is_val = split_documents(docs.num_rows, cfg.val_fraction, cfg.split_seed)
    first = 0
    for batch in docs.iter(batch_size=CHUNK_DOCUMENTS):
        texts = batch["text"]
        chunk_is_val = is_val[first : first + len(texts)]
        first += len(texts)
        for split, want_val in (("train", False), ("val", True)):
            chosen = [t for t, v in zip(texts, chunk_is_val, strict=True) if v == want_val]
            if chosen:
                yield split, chosen


def _write_tokens(f: BinaryIO, tokenizer: Tokenizer, texts: list[str], dtype: np.dtype) -> int:
    return _write_ids(f, tokenizer.encode_batch(texts), tokenizer.eot_id, dtype)


def _write_ids(f: BinaryIO, documents: list[list[int]], eot_id: int, dtype: np.dtype) -> int:
    ids: list[int] = []
    for doc_ids in documents:
        ids.extend(doc_ids)
        ids.append(eot_id)
    f.write(np.array(ids, dtype=dtype).tobytes())
    return len(ids)


def _write_segmentations(
    f: BinaryIO, segmenter: BPEDropout, texts: list[str], copies: int, eot_id: int, dtype: np.dtype
) -> int:
    """`copies` random segmentations of the train texts, one after another (data/bpe_dropout.py)."""
    return sum(_write_ids(f, [segmenter.encode(text) for text in texts], eot_id, dtype) for _ in range(copies))


def load_prepared(directory: str | Path, cache_dir: str | Path = "") -> PreparedData:
    """Open a prepared directory; `cache_dir` is where a gpt2 tokenizer finds its ranks file.

    A damaged cache (meta.json unreadable, a .bin cut short) is refused in one line naming the
    directory, so the fix (delete it, it is prepared again) is obvious.
    """
    directory = Path(directory)
    meta_path = directory / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{directory} is not prepared data: it has no meta.json")
    damaged = f"prepared data in {directory} is damaged"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        dtype = np.dtype(meta["dtype"])
        counts = {split: int(meta[f"{split}_tokens"]) for split in SPLITS}
        if not isinstance(meta["tokenizer"], dict) or not isinstance(meta["val_bytes"], int):
            raise TypeError("tokenizer must be an object, val_bytes an integer")
        if dtype not in (np.dtype(np.uint16), np.dtype(np.uint32)) or meta["val_bytes"] < 1:
            raise ValueError("dtype must be uint16 or uint32, val_bytes > 0")  # floats read as ids; bits/byte / 0
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{damaged}: {meta_path} is not valid ({type(e).__name__}); delete the directory") from None
    tokens = {}
    for split in SPLITS:
        path = directory / f"{split}.bin"
        size = path.stat().st_size if path.is_file() else -1
        if size != counts[split] * dtype.itemsize:
            raise ValueError(
                f"{damaged}: {path} holds {max(size, 0)} bytes, meta.json says {counts[split]} tokens "
                f"of {dtype.itemsize} bytes; delete the directory to prepare it again"
            )
        tokens[split] = np.memmap(path, dtype=dtype, mode="r") if size else np.zeros(0, dtype)
    try:
        tokenizer = tokenizer_from_meta(meta["tokenizer"], cache_dir)
    except OSError:
        raise  # gpt2's ranks file: a message of its own
    except Exception as e:  # a missing field, or the tokenizers library's bare Exception for a bad spec
        raise ValueError(
            f"{damaged}: the tokenizer in {meta_path} cannot be rebuilt ({type(e).__name__}: {e}); delete the directory"
        ) from None
    return PreparedData(directory, tokens["train"], tokens["val"], meta, tokenizer)
