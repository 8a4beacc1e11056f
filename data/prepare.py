"""Tokenize a corpus once into flat train/val token files, cached under a fingerprint of its inputs.

Layout: `<cache>/prepared/<fingerprint>/{train.bin, val.bin, meta.json}`. Each .bin is the
concatenation of its documents' token ids, each document followed by the EOT id, so batches can
be cut anywhere (batches.py) and the model sees where documents end. Which text is held out is
data/split.py's rule; how the files are written, data/write_tokens.py's.

A preparation is built in a hidden temp dir and renamed into place whole, so a cache entry is
complete or absent; what a killed one leaves is cleared by the next preparation of any corpus, and
a full disk is one line naming the cache.
"""

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data.batches import PreparedData
from data.bpe_dropout import BPEDropout
from data.cache_dir import (
    BUILD_LOCK,
    check_writable,
    full_disk,
    full_disk_cause,
    hold_build_lock,
    remove_abandoned_builds,
    remove_unfinished,
)
from data.config import DataConfig, resolve_cache_dir
from data.documents import DatasetDocuments, Documents, pieces
from data.learn_bpe import BPE_SAMPLE_BYTES, evenly, learn_in_child
from data.sources import load_documents, publish_dir, source_identity
from data.split import Segment, split_rule, split_segments
from data.tokenizer import BPETokenizer, Tokenizer, build_tokenizer, tokenizer_from_meta
from data.write_tokens import SPLITS, write_splits

log = logging.getLogger(__name__)

# Bump when the on-disk layout or the tokenization rules change, so old caches are not reused (a source's
# split rule is part of its source_identity).
FORMAT_VERSION = 1


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


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def prepare(cfg: DataConfig, progress: bool = True) -> PreparedData:
    """Tokenize and split the corpus `cfg` names, or reuse the cached result of an earlier call."""
    cfg.validate()
    cache_dir = resolve_cache_dir(cfg.cache_dir)
    key = cache_key(cfg)
    directory = cache_dir / "prepared" / fingerprint(key)
    if directory.parent.is_dir():
        remove_abandoned_builds(directory.parent)
    if directory.is_dir():
        if (directory / "meta.json").is_file():
            log.info("using prepared data in %s", directory)
            return load_prepared(directory, cache_dir)
        remove_unfinished(directory)
    try:
        return _prepare(cfg, key, directory, cache_dir, progress)
    except Exception as e:
        if cause := full_disk_cause(e):  # however deep a library wrapped it
            raise full_disk(cache_dir, cause) from None
        raise


def _prepare(cfg: DataConfig, key: dict, directory: Path, cache_dir: Path, progress: bool) -> PreparedData:
    start = time.perf_counter()
    check_writable(cache_dir)
    docs = load_documents(cfg, progress)
    if len(docs) == 0:
        raise ValueError(f"data.source={cfg.source!r} gave no documents to prepare")
    segments = split_segments(docs, cfg)
    tokenizer = _tokenizer(cfg, docs, segments, cache_dir, progress)
    dtype = token_dtype(tokenizer.vocab_size)
    dropout = BPEDropout(tokenizer, cfg.bpe_dropout, seed=cfg.split_seed) if cfg.segments_with_dropout else None
    segmenter = (dropout, cfg.bpe_dropout_copies) if dropout else None
    # Written into a temp dir and renamed into place only when complete: a crash leaves no `directory`.
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}-"))
    builder = hold_build_lock(tmp)
    try:
        copies = cfg.bpe_dropout_copies if segmenter else 1
        total = sum((copies if s.split == "train" else 1) * (s.end - s.start) for s in segments)
        with tqdm(total=total, desc="tokenizing", unit="B", unit_scale=True, disable=not progress) as bar:
            counts = write_splits(tmp, docs, segments, tokenizer, segmenter, dtype, bar.update)
        check_splits_hold_text(counts, cfg)
        meta = _meta(cfg, key, directory.name, tokenizer, dtype, counts)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(builder)
        raise
    publish_dir(tmp, directory)  # still locked while renamed, so no other process takes it for abandoned
    (directory / BUILD_LOCK).unlink(missing_ok=True)
    os.close(builder)
    log.info("prepared %s in %.1fs: %s", directory, time.perf_counter() - start, split_line(meta))
    return load_prepared(directory, cache_dir)


def split_line(meta: dict) -> str:
    """What the split holds, held-out share in bytes included: e.g. '4,403,141 bytes (37 documents) -> 12,060,974
    train tokens; 654,057 bytes (5 documents, 12.9% of the text) held out -> 218,296 val tokens'."""
    n = meta["num_documents"]
    share = meta["val_bytes"] / (meta["train_bytes"] + meta["val_bytes"])
    return (
        f"{meta['train_bytes']:,} bytes ({n['train']} documents) -> {meta['train_tokens']:,} train tokens; "
        f"{meta['val_bytes']:,} bytes ({n['val']} documents, {share:.1%} of the text, data.val_fraction="
        f"{meta['val_fraction']}) held out -> {meta['val_tokens']:,} val tokens"
    )


def _tokenizer(
    cfg: DataConfig, docs: Documents | DatasetDocuments, segments: list[Segment], cache_dir: Path, progress: bool
) -> Tokenizer:
    """BPE learns its merges from (a sample of) the train split alone, so no merge is fitted to the val text it
    is scored on; char takes every character (its vocabulary must cover val); gpt2 is fixed."""
    if cfg.tokenizer == "gpt2":
        return build_tokenizer("gpt2", None, cache_dir)
    chosen = [s for s in segments if s.split == "train" or cfg.tokenizer == "char"]
    total = sum(s.end - s.start for s in chosen)
    texts = (piece for s in chosen for piece in pieces(docs, s.doc, s.start, s.end))
    if cfg.tokenizer == "char":
        with tqdm(total=total, desc="reading characters", unit="B", unit_scale=True, disable=not progress) as bar:
            return build_tokenizer("char", _counted(texts, bar.update), cache_dir)
    sample = evenly(texts, total, BPE_SAMPLE_BYTES)
    bound, size = f"{BPE_SAMPLE_BYTES:,}", f"{total:,}"
    if total <= BPE_SAMPLE_BYTES:  # the bound: data/learn_bpe.py says why and what it costs
        log.info("learning the BPE from all %s bytes of train text (the sample's bound: %s bytes)", size, bound)
    else:
        log.info("learning the BPE from about %s of the %s bytes of train text, in pieces spread evenly", bound, size)
    bar = tqdm(total=min(total, BPE_SAMPLE_BYTES), desc="learning BPE", unit="B", unit_scale=True, disable=not progress)
    with bar:
        return BPETokenizer(learn_in_child(sample, cfg.bpe_vocab_size, progress, bar.update))


def _counted(texts: Iterator[str], on_bytes) -> Iterator[str]:
    for text in texts:
        on_bytes(len(text.encode("utf-8")))
        yield text


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


def _meta(cfg: DataConfig, key: dict, fp: str, tokenizer: Tokenizer, dtype: np.dtype, counts: dict) -> dict:
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
        "split_by": "document" if split_rule(cfg) == "documents" else "bytes",  # data/split.py
        **{f"{split}_tokens": counts[split]["tokens"] for split in SPLITS},
        **{f"{split}_bytes": counts[split]["bytes"] for split in SPLITS},
    }


def split_chunks(docs: Documents | DatasetDocuments, cfg: DataConfig) -> Iterator[tuple[str, list[str]]]:
    """(split, [text]) for each segment in corpus order, whole: the text prepare() tokenizes, by its split rule."""
    for s in split_segments(docs, cfg):
        yield s.split, ["".join(pieces(docs, s.doc, s.start, s.end))]


def load_prepared(directory: str | Path, cache_dir: str | Path = "") -> PreparedData:
    """Open a prepared directory; `cache_dir` is where a gpt2 tokenizer finds its ranks file.

    A damaged cache (meta.json unreadable, a .bin cut short) is refused in one line naming the
    directory, so the fix (delete it, it is prepared again) is obvious.
    """
    directory = Path(directory)
    meta_path = directory / "meta.json"
    if not meta_path.is_file():  # prepare() clears such an entry of its cache and prepares it again
        raise FileNotFoundError(
            f"{directory} is not prepared data: it has no meta.json; delete it (prepare makes it again)"
        )
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
