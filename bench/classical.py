"""Classical compressors as the floor under the models' bits per byte: each held-out document is compressed
after the train text and charged only for the bytes it adds,

    bits/byte = 8 * sum over val documents of (size(C(train + doc)) - size(C(train))) / sum of bytes(doc),

so a compressor, like the model, has seen the train split and no other val document. The documents are the val
split's own (data/prepare.py's split rule), so the figure sits beside the model's val bits/byte; the model is
also charged for each document's end (its EOT token), a compressor only for the document's bytes.

PPMd is variant H, the one 7-Zip writes into .7z files (pyppmd). zpaq's strongest method (`zpaq a ARC FILE -m5`,
context mixing; Debian's zpaq package) runs as the zpaq program on a file of train + doc and is charged the size
of the archive it writes, so the archive's fixed header and journal cancel in the difference; where zpaq is not
installed its row is skipped and the reason says so. None of these compressors can be copied once
primed with the train text, so every document costs one compression of train + doc: (documents + 1)
compressions of the train text per compressor, run in parallel over the compressors and cached per split
under <cache>/classical/.
"""

if __name__ == "__main__":  # a module: run as a file, its first import of its own package would fail
    raise SystemExit("error: bench/classical.py is a module of bench/bench_quality.py; run it with --help")

import bz2
import json
import lzma
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import pyppmd
import zstandard

from data.config import DataConfig, resolve_cache_dir
from data.prepare import FORMAT_VERSION, fingerprint, split_chunks
from data.sources import load_documents, source_identity
from data.text_file import read_json_object
from rundir.files import atomic_write_bytes

PPMD_ORDERS = range(6, 17)
# Room for every context of the 4.4 MB Shakespeare train text: with 16 MiB, order 16 runs out, restarts its
# model and compresses the train text 7% worse; 256 MiB and 1 GiB score alike.
PPMD_MEM = 256 << 20
# Bytes one compressor may be asked to compress, (val documents + 1) x the train text: Shakespeare's split is
# 28 MB (PPMd order 16 takes ~25 s of one core for it); a corpus far past this would take hours.
MAX_WORK_BYTES = 200_000_000


def ppmd(data: bytes, order: int) -> bytes:
    return pyppmd.compress(data, max_order=order, mem_size=PPMD_MEM, variant="H")


def xz(data: bytes) -> bytes:
    return lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)


def bzip2(data: bytes) -> bytes:
    return bz2.compress(data, 9)


def zstd(data: bytes) -> bytes:
    # The whole input's size is known, so the window covers train + doc: the document can refer to the train text.
    return zstandard.ZstdCompressor(level=22).compress(data)


ZPAQ = "zpaq"  # the program; a test points it at a stand-in


def zpaq(data: bytes) -> bytes:
    """The archive `zpaq a arc.zpaq data -m5` writes (one thread: a 4 MB text is one block anyway)."""
    program = ZPAQ
    with tempfile.TemporaryDirectory(prefix="attnlab-zpaq-") as tmp:
        (Path(tmp) / "data").write_bytes(data)
        done = subprocess.run(
            [program, "a", "arc.zpaq", "data", "-m5", "-threads", "1"], cwd=tmp, capture_output=True, text=True
        )
        archive = Path(tmp) / "arc.zpaq"
        if done.returncode != 0 or not archive.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"{program} a ... -m5 failed (exit {done.returncode}): {tail[0]}")
        return archive.read_bytes()


COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    **{f"PPMd H o{order}": partial(ppmd, order=order) for order in PPMD_ORDERS},
    "xz -9e": xz,
    "bzip2 -9": bzip2,
    "zstd --ultra -22": zstd,
    "zpaq -m5": zpaq,
}


def program_version(path: str) -> str:
    """The first line a program prints with no arguments (zpaq: 'zpaq v7.15 journaling archiver, ...')."""
    done = subprocess.run([path], capture_output=True, text=True)
    return ((done.stdout or done.stderr).strip().splitlines() or ["unknown version"])[0]


def measured_compressors() -> tuple[list[str], dict[str, str]]:
    """The compressors this machine can run, in COMPRESSORS' order, and {name: why not} for the others: zpaq is a
    program, not a Python package, and may not be installed."""
    missing = {} if shutil.which(ZPAQ) else {"zpaq -m5": f"{ZPAQ} is not installed (Debian: apt-get install zpaq)"}
    return [name for name in COMPRESSORS if name not in missing], missing


def held_out_bits(compress: Callable[[bytes], bytes], train: bytes, docs: list[bytes]) -> float:
    """Bits each document adds to the compressed train text, summed over the documents (each primed with the
    train text alone, never with another document)."""
    base = len(compress(train))
    return 8.0 * sum(len(compress(train + doc)) - base for doc in docs)


def split_texts(cfg: DataConfig) -> tuple[bytes, list[bytes]]:
    """The train split's text (its documents in corpus order, joined) and the val split's documents, as UTF-8:
    the same documents and bytes prepare() tokenizes, by its own split rule."""
    train, val = [], []
    for split, texts in split_chunks(load_documents(cfg), cfg):
        (val if split == "val" else train).extend(t.encode("utf-8") for t in texts)
    return b"".join(train), val


def too_big(meta: dict) -> str | None:
    """Why the prepared split `meta` describes is too big to compress once per val document, or None."""
    docs, train = meta["num_documents"]["val"], meta["train_bytes"]
    work = (docs + 1) * train + meta["val_bytes"]
    if work <= MAX_WORK_BYTES:
        return None
    return (
        f"{docs} val documents x {train:,} train bytes is {work / 1e6:,.0f} MB to compress per compressor, "
        f"over the {MAX_WORK_BYTES / 1e6:,.0f} MB limit"
    )


def cache_path(cfg: DataConfig) -> Path:
    """Where the baselines of `cfg`'s split are kept: keyed on the split (not the tokenizer) and the compressors
    measured (a program installed later is a new entry, measured with it)."""
    names, _ = measured_compressors()
    key = {
        "format": FORMAT_VERSION,  # prepare's split rule
        "source": source_identity(cfg),
        "val_fraction": cfg.val_fraction,
        "split_seed": cfg.split_seed,
        "compressors": names,
        "ppmd_mem": PPMD_MEM,
        "versions": [platform.python_version(), pyppmd.__version__, zstandard.__version__],
        **({"zpaq": program_version(shutil.which(ZPAQ))} if "zpaq -m5" in names else {}),
    }
    return resolve_cache_dir(cfg.cache_dir) / "classical" / f"{fingerprint(key)}.json"


def _measure(name: str, train: bytes, docs: list[bytes]) -> tuple[float, float]:
    start = time.perf_counter()
    bits = held_out_bits(COMPRESSORS[name], train, docs)
    return bits, time.perf_counter() - start


def baselines(cfg: DataConfig, meta: dict, cpu: str) -> dict:
    """Each compressor's bits/byte on the val split of `cfg` (prepared, with `meta`), measured once on `cpu` and
    then read from the cache; {"skipped": why} where the split is too big; "not_measured" says why a program
    compressor has no row (not installed)."""
    if reason := too_big(meta):
        return {"skipped": reason}
    path = cache_path(cfg)
    if path.is_file():
        return read_json_object(path, "compressor baselines cache")
    train, docs = split_texts(cfg)
    val_bytes = sum(map(len, docs))
    assert (len(docs), val_bytes) == (meta["num_documents"]["val"], meta["val_bytes"]), (
        f"val split of {len(docs)} documents, {val_bytes} bytes; prepared: {meta['num_documents']['val']}, "
        f"{meta['val_bytes']}"
    )
    available, missing = measured_compressors()
    names = sorted(available, key=lambda n: n not in ("zpaq -m5", "xz -9e"))  # the slowest first, for the packing
    with ProcessPoolExecutor(min(len(names), os.cpu_count() or 1)) as pool:
        measured = dict(zip(names, pool.map(_measure, names, [train] * len(names), [docs] * len(names)), strict=True))
    rows = [
        {"compressor": name, "bits_per_byte": measured[name][0] / val_bytes, "seconds": measured[name][1]}
        for name in available
    ]
    result = {
        "cpu": cpu,
        "date": time.strftime("%Y-%m-%d"),
        "train_bytes": len(train),
        "val_bytes": val_bytes,
        "val_documents": len(docs),
        "rows": rows,
        "not_measured": missing,
    }
    atomic_write_bytes(path, (json.dumps(result, indent=2) + "\n").encode())  # a concurrent scorer: none or whole
    return result


def floor(result: dict) -> dict | None:
    """The best (lowest bits/byte) row of a baselines() result, None if it was skipped."""
    return min(result.get("rows", []), key=lambda r: r["bits_per_byte"], default=None)
