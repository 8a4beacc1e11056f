"""The lab under load, over real HTTP: a request waits a bounded time for the model (then a 503 naming what
holds it), a long streamed sample lets another tab's request run between two of its tokens, a connection
that stalls is closed, and past MAX_CONNECTIONS a connection is answered 503 at once."""

import contextlib
import json
import re
import socket
import threading
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import server as lab_server
from lab.server import make_server, url_of
from lab.session import LabSession
from tests.unit.test_lab import address_and_token, post, tiny_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("lab_load") / "run" / "checkpoints" / "step_0000007.safetensors")


@pytest.fixture
def lab(checkpoint: Path) -> Iterator[tuple[LabSession, str]]:
    """(session, URL) of a lab of its own: a test may slow its model or change its limits."""
    session = LabSession(checkpoint)
    server = make_server(session)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield session, url_of(server)
    server.shutdown()
    server.server_close()


def host_port(url: str) -> tuple[str, int]:
    host, port = re.match(r"http://(.+):(\d+)/", url).groups()
    return host, int(port)


def slow_model(session: LabSession, seconds: float) -> None:
    """Each forward of the lab's model takes at least `seconds` (a big model on a slow machine)."""
    session.model.register_forward_pre_hook(lambda *_: time.sleep(seconds))


def test_a_request_waits_a_bounded_time_for_the_model_then_is_a_503_naming_what_holds_it(lab):
    """Without the bound the request waited for as long as the model was held (a browser gives up at 30 s)."""
    session, url = lab
    session.wait_s = 0.3
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with session.using_model("a sample of 5000 tokens"):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        started = time.monotonic()
        status, answer = post(url, "/api/attention", {"prompt": "the king"})
        waited = time.monotonic() - started
    finally:
        release.set()
        holder.join(10)
    assert status == 503, answer
    body = json.loads(answer)
    assert body["busy"] is True
    assert re.fullmatch(
        r"the model is busy with a sample of 5000 tokens \(for \d+ s\); try again when it finishes", body["error"]
    ), body
    assert waited < 5, f"answered after {waited:.1f} s"
    assert post(url, "/api/attention", {"prompt": "the king"})[0] == 200, "and once it is free, the model answers"


def test_a_long_streamed_sample_lets_another_tabs_request_run_between_two_of_its_tokens(lab):
    """One tab streams 400 tokens (at 20 ms a token, 8 s); a second tab's attention map is answered while the
    sample still streams, not after it (before, the sample held the model for its whole length)."""
    session, url = lab
    slow_model(session, 0.02)
    token = address_and_token(url)[1]
    host, port = host_port(url)
    body = json.dumps({"prompt": "the king", "max_tokens": 400}).encode()
    stream = socket.create_connection((host, port), timeout=30)
    head = (
        f"POST /api/sample HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Lab-Token: {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    stream.sendall(head.encode() + body)
    received = b""
    while b'"text"' not in received:  # the sample has started: it takes the model a token at a time
        received += stream.recv(65536)
    started = time.monotonic()
    status, answer = post(url, "/api/attention", {"prompt": "the king"})
    waited = time.monotonic() - started
    stream.settimeout(0.5)
    with contextlib.suppress(TimeoutError):
        received += stream.recv(65536)
    still_streaming = b'"done"' not in received
    stream.close()
    assert status == 200, answer
    assert still_streaming, "the sample ended before the other request was answered"
    assert waited < 4, f"the other tab waited {waited:.1f} s for the model"


@pytest.mark.parametrize("sent", [b"", b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n"], ids=["silent", "mid-request"])
def test_a_stalled_connection_is_closed_after_the_idle_limit(lab, monkeypatch, capfd, sent):
    """A client that connects and sends nothing, or half a request, is closed after IDLE_S (800 such clients
    held 804 threads, none ever closed), with nothing on the terminal."""
    assert lab_server.LabHandler.timeout == lab_server.IDLE_S <= 30
    monkeypatch.setattr(lab_server.LabHandler, "timeout", 0.5)  # the same limit, sooner
    _, url = lab
    before = threading.active_count()
    connections = [socket.create_connection(host_port(url), timeout=10) for _ in range(20)]
    for connection in connections:
        connection.sendall(sent)
    started = time.monotonic()
    for connection in connections:
        assert connection.recv(65536) == b"", "the server sent an answer instead of closing"  # closed: EOF
        connection.close()
    assert time.monotonic() - started < 5
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before, "the stalled connections' threads outlived them"
    assert capfd.readouterr().err == ""


def status_of(url: str) -> int | None:
    """An attention request's status; None where a refused connection closed while the request was sent."""
    try:
        return post(url, "/api/attention", {"prompt": "the"})[0]
    except urllib.error.URLError:
        return None


def test_past_max_connections_a_connection_is_a_503_at_once_and_the_lab_serves_again_after(checkpoint, monkeypatch):
    monkeypatch.setattr(lab_server, "MAX_CONNECTIONS", 3)
    monkeypatch.setattr(lab_server.LabHandler, "timeout", 30.0)  # the stalled ones stay until closed here
    session = LabSession(checkpoint)
    server = make_server(session)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = url_of(server)
    try:
        stalled = [socket.create_connection(host_port(url), timeout=10) for _ in range(3)]
        time.sleep(0.2)  # accepted, each holding its thread
        with socket.create_connection(host_port(url), timeout=10) as extra:
            answer = b""
            while chunk := extra.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"error": "the lab is serving 3 connections; try again"}
        for connection in stalled:
            connection.close()
        deadline = time.monotonic() + 10
        while (status := status_of(url)) in (503, None) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status == 200, "a closed connection gives its slot back"
    finally:
        server.shutdown()
        server.server_close()
