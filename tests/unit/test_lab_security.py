"""Who may drive the lab, over real HTTP: only its own page, with the printed URL's token, on runs under its
root. A foreign Host (DNS rebinding) or Origin is a 403, a body not sent as JSON a 415, a missing or wrong
token a 403, and a run or checkpoint outside the root is refused naming the root."""

import json
import re
import signal
import socket
import threading
from pathlib import Path
from urllib.parse import quote

import pytest

from lab.server import make_server, url_of
from lab.session import LabSession
from tests.unit.test_lab import address_and_token, get, post, raw_exchange, start_lab, tiny_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """base/root/run, the lab's run (so base/root is its root), and base/elsewhere/run outside it."""
    base = tmp_path_factory.mktemp("lab_security")
    for run in (base / "root" / "run", base / "elsewhere" / "run"):
        tiny_checkpoint(run / "checkpoints" / "step_0000007.safetensors")
        (run / "metrics.jsonl").write_text(json.dumps({"step": 5, "train/loss": 3.3}) + "\n")
    return base / "root"


@pytest.fixture(scope="module")
def url(root: Path):
    server = make_server(LabSession(root / "run"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield url_of(server)
    server.shutdown()
    server.server_close()


def port_of(url: str) -> int:
    return int(re.match(r"http://[^/]+:(\d+)/", url).group(1))


def refusal(answer: tuple[int, bytes]) -> tuple[int, str]:
    status, body = answer
    return status, json.loads(body)["error"]


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example:{port}", ""])
def test_a_host_that_is_not_the_labs_is_refused_page_and_api_alike(url, host):
    """DNS rebinding: a foreign site's name made to resolve to 127.0.0.1 reaches the lab with that name as Host."""
    host = host.format(port=port_of(url))
    for answer in (get(url, "/", {"Host": host}), get(url, "/api/info", {"Host": host})):
        assert refusal(answer) == (403, f"Host {host!r} is not this lab; open the URL the lab printed")


@pytest.mark.parametrize(
    "host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "LocalHost", "localhost:9000"]
)
def test_the_labs_own_names_are_answered_on_any_port_as_an_ssh_tunnel_brings_them(url, host):
    assert get(url, "/api/info", {"Host": host.format(port=port_of(url))})[0] == 200


@pytest.mark.parametrize(
    "origin", ["http://evil.example", "null", "http://localhost:{port}", "https://127.0.0.1:{port}"]
)
def test_a_request_from_another_origin_is_refused(url, origin):
    """A foreign page's fetch carries its Origin; so does one from the lab's own port under another name."""
    origin = origin.format(port=port_of(url))
    answer = post(url, "/api/attention", {"prompt": "the"}, {"Origin": origin})
    assert refusal(answer) == (403, f"Origin {origin!r} is not this lab's page; it answers only its own")
    own = {"Origin": f"http://127.0.0.1:{port_of(url)}"}
    assert post(url, "/api/attention", {"prompt": "the"}, own)[0] == 200


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None])
def test_a_body_not_sent_as_json_is_a_415(url, kind):
    """What a foreign page can send without a preflight (a form, text/plain) is never taken as a request."""
    answer = post(url, "/api/attention", {"prompt": "the"}, {"Content-Type": kind})
    sent = kind or "application/x-www-form-urlencoded"  # urllib's own, for a body without a type
    assert refusal(answer) == (415, f"the request's Content-Type is {sent}; the API takes application/json only")
    json_utf8 = {"Content-Type": "application/json; charset=utf-8"}
    assert post(url, "/api/attention", {"prompt": "the"}, json_utf8)[0] == 200


def test_a_preflight_is_never_approved(url):
    """A foreign page that asks to send JSON (a CORS preflight) is given no Access-Control-Allow-* header."""
    host = f"127.0.0.1:{port_of(url)}"
    answer = raw_exchange(
        url,
        f"OPTIONS /api/load HTTP/1.1\r\nHost: {host}\r\nOrigin: http://evil.example\r\n"
        "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type\r\n\r\n".encode(),
    )
    head = answer.split(b"\r\n\r\n", 1)[0]
    assert not head.startswith(b"HTTP/1.1 2") and b"access-control-allow" not in head.lower(), head


@pytest.mark.parametrize("token", [None, "", "wrong", "é", "{token}x"])
def test_the_api_refuses_a_missing_or_wrong_token(url, token):
    token = token and token.format(token=address_and_token(url)[1])
    message = "the lab's API needs its token: open the URL the lab printed, with its ?token="
    assert refusal(get(url, "/api/info", {"X-Lab-Token": token})) == (403, message)
    assert refusal(post(url, "/api/attention", {"prompt": "the"}, {"X-Lab-Token": token})) == (403, message)
    assert refusal(get(url, f"/api/info?token={quote(token or '')}", {"X-Lab-Token": None})) == (403, message)


def test_the_api_answers_its_token_in_a_header_or_the_query_and_the_page_needs_none(url):
    token = address_and_token(url)[1]
    assert get(url, "/api/info")[0] == 200
    assert get(url, f"/api/info?token={token}", {"X-Lab-Token": None})[0] == 200
    assert post(url, "/api/attention", {"prompt": "the"})[0] == 200
    for path in ("/", "/static/app.js", "/static/style.css"):
        assert get(url, path, {"X-Lab-Token": None})[0] == 200, path


def test_each_launch_has_its_own_token(root):
    session = LabSession(root / "run")
    tokens = set()
    for _ in range(2):
        server = make_server(session)
        tokens.add(address_and_token(url_of(server))[1])
        server.server_close()
    assert len(tokens) == 2 and all(len(token) >= 40 for token in tokens)


def test_runs_and_checkpoints_outside_the_root_are_refused_naming_the_root(url, root):
    """`/api/runs {"path": "/"}` listed every run on the machine; `/api/load` opened any file."""
    outside = root.parent / "elsewhere" / "run"
    (root / "link").symlink_to(outside)
    named = (
        f"is outside {str(root)!r}, the folder this lab opens runs and checkpoints from (scripts/lab.py --root sets it)"
    )
    for path in ("/", str(outside), str(root / "run" / ".." / ".." / "elsewhere"), str(root / "link")):
        for api in ("/api/runs", "/api/load"):
            assert refusal(post(url, api, {"path": path})) == (400, f"{path!r} {named}"), (api, path)
    status, body = post(url, "/api/runs", {"path": str(root / "run")})
    assert status == 200 and json.loads(body)["kind"] == "run"
    assert post(url, "/api/load", {"path": str(root / "run")})[0] == 200


def test_a_runs_checkpoint_that_links_outside_the_root_is_refused(url, root):
    # Defect: the run folder was inside the root, so its best.safetensors, a symlink to a file outside, was loaded
    run = root / "linked_run"
    (run / "checkpoints").mkdir(parents=True)
    outside = root.parent / "elsewhere" / "run" / "checkpoints" / "step_0000007.safetensors"
    (run / "checkpoints" / "best.safetensors").symlink_to(outside)
    status, body = post(url, "/api/load", {"path": str(run)})
    assert status == 400 and "best.safetensors' is outside" in json.loads(body)["error"], body


def test_a_run_outside_an_explicit_root_is_refused_at_start(root):
    with pytest.raises(ValueError, match=r"^'.*elsewhere/run' is outside '.*/root', the folder this lab opens"):
        LabSession(root.parent / "elsewhere" / "run", root=root)
    assert LabSession(root / "run", root=root.parent).root == root.parent.resolve()
    # Defect: a root that does not exist said every run was outside it
    with pytest.raises(FileNotFoundError, match=r"^--root '.*nowhere' is not a folder; give the folder that holds"):
        LabSession(root / "run", root=root / "nowhere")
    # Defect: a run that does not exist, in a folder that does not either, blamed a --root never given ('None')
    with pytest.raises(FileNotFoundError, match=r"^'.*nowhere/run' does not exist; give a checkpoint file or a run"):
        LabSession(root / "nowhere" / "run")


def test_the_lab_script_on_the_network_warns_and_still_guards_the_api(root):
    """`--host 0.0.0.0` says on stderr that the page is reachable from the network; the printed URL carries
    the token, which the API still requires; the machine's own name is a Host it answers."""
    process = start_lab(str(root / "run"), "--host", "0.0.0.0", "--port", "0")
    try:
        warning = process.stderr.readline()
        assert warning == (
            "warning: --host 0.0.0.0 makes the page reachable from the network; only the token in its URL guards "
            "the API\n"
        )
        printed = re.search(r"http://0\.0\.0\.0:(\d+)/\?token=\S+", process.stdout.readline()).group(0)
        url = printed.replace("0.0.0.0", "127.0.0.1")
        assert get(url, "/api/info")[0] == 200
        assert get(url, "/api/info", {"X-Lab-Token": None})[0] == 403
        assert get(url, "/api/info", {"Host": f"{socket.gethostname()}:{port_of(url)}"})[0] == 200
        assert get(url, "/api/info", {"Host": "evil.example"})[0] == 403
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 0
    finally:
        process.kill()
        process.wait()
