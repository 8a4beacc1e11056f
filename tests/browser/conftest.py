"""Fixtures for driving the lab page in headless Chromium: a tiny trained run, a lab server on it, a browser.

Debian's chromium at /usr/bin/chromium, driven by playwright (never `playwright install`: browser
downloads are not available everywhere). Without it every test here skips, saying why.
"""

import threading
from pathlib import Path

import pytest

from cli.config import to_train_config
from lab.server import make_server, url_of
from lab.session import LabSession
from tests.helpers import compose_config, write_corpus
from training.setup import train

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="package")
def sweep_dir(tmp_path_factory) -> Path:
    """A sweep directory holding one real tiny run (+debug=tiny: 2 layers, 2 heads, 20 steps)."""
    base = tmp_path_factory.mktemp("lab_browser")
    files = write_corpus(base / "corpus")
    overrides = [
        "+debug=tiny",
        "data.source=files",
        "data.tokenizer=char",
        f"data.files=[{','.join(files)}]",
        f"data.cache_dir={base / 'cache'}",
        f"out_dir={base / 'sweep' / 'h2'}",
        "progress=false",
    ]
    train(to_train_config(compose_config(overrides)))  # in-process: the page is under test, not train.py
    return base / "sweep"


@pytest.fixture(scope="package")
def session(sweep_dir: Path) -> LabSession:
    # Rooted one folder above the sweep, so the tests' own runs and files (lab_tmp) are in the page's reach.
    return LabSession(sweep_dir / "h2", root=sweep_dir.parent)


@pytest.fixture
def lab_tmp(sweep_dir: Path, request) -> Path:
    """A fresh folder for one test's files, under the lab's root: the page opens nothing outside it."""
    folder = sweep_dir.parent / "tests" / request.node.name
    folder.mkdir(parents=True)
    return folder


@pytest.fixture(scope="package")
def lab_url(session: LabSession):
    """The URL the lab prints, with its token."""
    server = make_server(session)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield url_of(server)
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="package")
def browser():
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (apt-get install -y chromium) for the page tests")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (requirements-dev.txt)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, lab_url):
    """A fresh page on the lab, loaded; fails the test on any JavaScript error."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(lab_url)
    page.wait_for_selector("#model-info b")
    yield page
    page.close()
    assert not errors, f"JavaScript errors on the page: {errors}"
