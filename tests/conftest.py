"""Shared fixtures (helpers are in tests/helpers.py). Markers come from the folder: tests/e2e/ runs the
real CLIs end to end (`e2e`); tests/unit/ is fast and in-process."""

import os
import sys
from pathlib import Path

import pytest
import torch

import model.materialized_attention
from tests.helpers import write_corpus


@pytest.fixture(autouse=True, scope="session")
def small_query_blocks():
    """Test sequences are ~16 tokens, shorter than one query block of the materialized kernel; with
    blocks of 5 queries (the last one ragged) every test that runs it also runs its block skipping.
    Session-wide, so module-scoped reference runs see the same blocks as the tests comparing to them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model.materialized_attention, "QUERY_BLOCK", 5)
        yield


@pytest.fixture(autouse=True, scope="session")
def venv_on_path():
    """Tests run as a user who ran `source .venv/bin/activate` (the README's advice): `python` on PATH is this
    interpreter, so printed commands read `python ...`; tests of the other case take the venv off PATH."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        yield


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> list[str]:
    return write_corpus(tmp_path / "corpus")


@pytest.fixture
def tiny_run_overrides(tmp_path: Path, tiny_corpus: list[str]) -> list[str]:
    """Overrides for a seconds-long run on the generated corpus, writing only under tmp_path."""
    return [
        "+debug=tiny",
        "data.source=files",
        "data.tokenizer=char",  # ~25 symbols of the generated corpus; tests of the BPE name it
        f"data.files=[{','.join(tiny_corpus)}]",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"out_dir={tmp_path / 'run'}",
        "progress=false",
    ]


@pytest.fixture(scope="module")
def shared_corpus_overrides(tmp_path_factory) -> list[str]:
    """tiny_run_overrides without out_dir, built once per module: one corpus and one data cache
    shared by its tests, each of which adds its own `out_dir=`."""
    base = tmp_path_factory.mktemp("shared")
    files = write_corpus(base / "corpus")
    return [
        "+debug=tiny",
        "data.source=files",
        "data.tokenizer=char",  # ~25 symbols of the generated corpus; tests of the BPE name it
        f"data.files=[{','.join(files)}]",
        f"data.cache_dir={base / 'cache'}",
        "progress=false",
    ]


@pytest.fixture(autouse=True, scope="session")
def session_cache(tmp_path_factory):
    """Caches a test does not name itself (the measured matmul peak, say) live in a per-session folder."""
    patch = pytest.MonkeyPatch()
    patch.setenv("ATTNLAB_CACHE", str(tmp_path_factory.mktemp("attnlab_cache")))
    yield
    patch.undo()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors gain nothing from threads, and on a busy 2-core machine OpenMP spin-waits made
    modules of many tiny forward passes 10-50x slower with two; one thread keeps them at seconds.
    Use per module: `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_configure(config):
    """Under pytest-xdist (pyproject's addopts), the workers share the cores: each worker's torch, and the
    CLIs its tests start (they inherit OMP_NUM_THREADS), get cores // workers threads. With every worker
    taking every core, OpenMP threads of 2 workers on 2 cores fought over them. An OMP_NUM_THREADS the
    caller set is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // workers))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "e2e" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.e2e)
