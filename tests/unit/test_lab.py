"""The lab's server side without a browser: the prompt loss against head_gates, checkpoint resolution,
the Runs view, and the HTTP API's errors (JSON, one line, and the server keeps answering)."""

import http.client
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from analysis.head_mask import gates_without, head_gates
from analysis.trained import find_checkpoint, saved_cache_dir
from data.tokenizer import CharTokenizer
from generation.generate import SamplingParams, generate
from lab import api, runs
from lab.measures import next_token_top, prompt_loss
from lab.server import MAX_BODY, STATIC, make_server, strict_json, url_of
from lab.session import LabSession, run_dir_of
from model import GPT, GPTConfig
from rundir.checkpoint import save_checkpoint
from tests.helpers import ROOT

pytestmark = pytest.mark.usefixtures("one_thread")
CHARS = "\n abcdefghijklmnopqrstuvwxyz"


def tiny_checkpoint(path: Path, **sizes: int) -> Path:
    """A random char model (2 layers, 2 heads unless `sizes` say otherwise) saved with the header fields
    a real run writes."""
    torch.manual_seed(0)
    sizes = {"block_size": 32, "n_layer": 2, "n_head": 2, "d_model": 32} | sizes
    config = GPTConfig(vocab_size=len(CHARS) + 1, **sizes)
    meta = {"step": 7, "config": {"model": asdict(config), "data": {}}, "tokenizer": CharTokenizer(CHARS).to_meta()}
    return save_checkpoint(path, GPT(config), None, meta)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("lab") / "run"
    tiny_checkpoint(run / "checkpoints" / "step_0000007.safetensors")
    lines = [{"step": 5, "train/loss": 3.3}, {"step": 10, "train/loss": 3.1, "val/loss": 3.2}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run


@pytest.fixture(scope="module")
def session(run_dir: Path) -> LabSession:
    return LabSession(run_dir)


@pytest.fixture(scope="module")
def url(session: LabSession):
    """The URL the lab prints, with its token: http://127.0.0.1:PORT/?token=..."""
    server = make_server(session)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield url_of(server)
    server.shutdown()
    server.server_close()


def start_lab(*args: str) -> subprocess.Popen:
    """`python scripts/lab.py ARGS` as a user starts it, its stdout and stderr as text pipes."""
    command = [sys.executable, "scripts/lab.py", *args]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def address_and_token(url: str) -> tuple[str, str]:
    address, token = url.split("?token=")
    return address, token


def send(url: str, path: str, data: bytes | None, headers: dict[str, str | None]) -> tuple[int, bytes]:
    """`path` on the lab of `url` with its token, as the page sends it; a header given as None is left out."""
    address, token = address_and_token(url)
    sent = {name: value for name, value in ({"X-Lab-Token": token} | headers).items() if value is not None}
    try:
        request = urllib.request.Request(address + path.lstrip("/"), data=data, headers=sent)
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post(url: str, path: str, body: dict | bytes, headers: dict[str, str | None] | None = None) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return send(url, path, data, {"Content-Type": "application/json"} | (headers or {}))


def get(url: str, path: str, headers: dict[str, str | None] | None = None) -> tuple[int, bytes]:
    return send(url, path, None, headers or {})


@torch.no_grad()
def test_prompt_loss_is_the_mean_next_token_cross_entropy_with_and_without_gates(session):
    model, idx = session.model, session.encode("the king is not what thou art")
    logits, _ = model(idx[None])
    by_hand = F.cross_entropy(logits[0, :-1], idx[1:])
    assert prompt_loss(model, idx) == pytest.approx(float(by_hand), abs=1e-6)
    gates = gates_without(model, [(1, 0)])
    with head_gates(model, gates):
        logits, _ = model(idx[None])
    gated = float(F.cross_entropy(logits[0, :-1], idx[1:]))
    assert prompt_loss(model, idx, gates) == pytest.approx(gated, abs=1e-6)
    assert abs(gated - float(by_hand)) > 1e-5, "switching a head off should change the loss"
    assert prompt_loss(model, idx) == pytest.approx(float(by_hand), abs=1e-6), "the gates must not outlive the call"


def test_prompt_loss_and_top_tokens_check_their_input(session):
    model = session.model
    # one token, not '1 tokens'; and why a loss needs two
    with pytest.raises(ValueError, match=r"^the prompt has 1 token; a loss on it needs 2 to block_size=32 "):
        prompt_loss(model, session.encode("a"))
    top = next_token_top(model, session.encode("the"), k=5)
    assert len(top) == 5 and [p for _, p in top] == sorted((p for _, p in top), reverse=True)


@pytest.mark.parametrize(
    "meta,cache_dir",
    [({"config": {"data": {"cache_dir": "/c"}}}, "/c"), ({"config": {"data": "shakespeare"}}, ""), ({}, "")],
)
def test_the_saved_cache_dir_of_any_header(meta, cache_dir):
    assert saved_cache_dir(meta) == cache_dir  # a malformed header falls back to the default cache


def test_find_checkpoint_prefers_best_then_the_newest_step(tmp_path, run_dir):
    assert find_checkpoint(run_dir).name == "step_0000007.safetensors"
    run = tmp_path / "run"
    for name in ("step_0000010.safetensors", "step_0000020.safetensors"):
        tiny_checkpoint(run / "checkpoints" / name)
    assert find_checkpoint(run).name == "step_0000020.safetensors"
    tiny_checkpoint(run / "checkpoints" / "best.safetensors")
    assert find_checkpoint(run).name == "best.safetensors"
    assert find_checkpoint(run / "checkpoints" / "step_0000010.safetensors").name == "step_0000010.safetensors"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_checkpoint(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        find_checkpoint(tmp_path)


def test_runs_view_of_a_run_and_the_markdown_table_cells(run_dir):
    view = runs.view(run_dir)
    assert view["kind"] == "run"
    assert view["runs"][0]["curves"] == {"train/loss": [(5, 3.3), (10, 3.1)], "val/loss": [(10, 3.2)]}
    text = "| a | b |\n|---|---:|\n| x \\| y | 2 |"
    assert runs.markdown_rows(text) == [["a", "b"], ["x | y", "2"]]
    with pytest.raises(FileNotFoundError, match="no runs under"):
        runs.view(run_dir / "checkpoints")
    with pytest.raises(FileNotFoundError, match=r"^'.*metrics.jsonl' is a file; give a run or sweep directory$"):
        runs.view(run_dir / "metrics.jsonl")  # it said the file 'does not exist'


def test_a_diverged_runs_nan_and_infinity_reach_the_page_as_json_it_parses(tmp_path):
    """Python wrote the bare words NaN and Infinity, which JSON.parse refuses: the Runs tab said 'the server
    sent no JSON' and kept the last sweep's chart."""
    run = tmp_path / "diverged"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        '{"step": 5, "train/loss": 8.2}\n{"step": 10, "train/loss": NaN}\n{"step": 20, "val/loss": Infinity}\n'
    )
    assert runs.curves(run) == {"train/loss": [(5, 8.2)]}
    assert json.loads(strict_json({"a": [float("nan"), 1.0, {"b": float("-inf")}]})) == {"a": [None, 1.0, {"b": None}]}


def test_a_path_the_os_refuses_is_a_400_naming_it(url, run_dir):
    long = str(run_dir.parent / ("a" * 300))
    for path in ("/api/runs", "/api/load"):
        status, body = post(url, path, {"path": long})
        assert status == 400 and "File name too long" in json.loads(body)["error"], body


def test_a_runs_checkpoints_folder_opens_as_that_run(run_dir):
    assert run_dir_of(run_dir / "checkpoints", run_dir / "checkpoints") == run_dir  # it was the run, wrongly
    assert run_dir_of(run_dir, run_dir) == run_dir


def test_runs_path_is_read_as_open_reads_its_path_without_surrounding_spaces(session, run_dir):
    """A path pasted with a trailing newline or space: Open (/api/load) took it, Runs said 'does not exist'."""
    assert api.run_view(session, {"path": f"  {run_dir}\n"})["path"] == str(run_dir)
    with pytest.raises(ValueError, match="give a run directory or a sweep directory"):
        api.run_view(type("NoRun", (), {"run_dir": None})(), {"path": "  "})


def test_runs_view_of_a_folder_without_an_ablation_table_still_shows_every_runs_curves(tmp_path):
    """outputs/ after `python train.py` twice holds two runs of one config and seed: the report refuses to
    make them a table, but the Runs tab still draws both curves and says why there is no table (the whole
    view was a 400)."""
    from tests.helpers import write_fake_run

    for name in ("10-00-00", "11-00-00"):
        write_fake_run(tmp_path / "outputs" / "2026-12-02" / name, {"seed": 1337}, 2.0)
    view = runs.view(tmp_path / "outputs")
    assert [r["curves"] for r in view["runs"]] == [{"val/loss": [(10, 3.0)]}] * 2
    assert view["table"] == {"header": [], "rows": []}
    assert re.fullmatch(
        r"no ablation table: .*10-00-00 and .*11-00-00 are both all runs with seed 1337; keep one of them", view["note"]
    )


def twelve_cells_of_two_seeds(root: Path) -> list[tuple[int, int]]:
    """A sweep of 12 cells (n_head x d_k) x 2 seeds, each run with a three-point val curve; the cells' values."""
    from tests.helpers import write_fake_run

    shapes = [(h, k) for h in (1, 2, 4) for k in (8, 16, 32, 64)]
    for h, k in shapes:
        for seed in (1, 2):
            run = write_fake_run(root / f"h{h}_k{k}_s{seed}", {"model": {"n_head": h, "d_k": k}, "seed": seed}, 2.0)
            curve = [{"step": s, "val/loss": 3.0 - s / 100 - h / 10 - seed / 50} for s in (10, 20, 30)]
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve))
    return shapes


def test_a_sweeps_runs_are_grouped_by_cell_its_seeds_sharing_one(tmp_path):
    # Defect: a 12-run sweep was 12 lines whose colours repeated (two different cells both blue), not grouped by cell.
    shapes = twelve_cells_of_two_seeds(tmp_path / "sweep")
    (tmp_path / "sweep" / "broken").mkdir()
    (tmp_path / "sweep" / "broken" / "run_info.json").write_text("{not json")
    view = runs.view(tmp_path / "sweep")
    assert view["cells"] == [f"model.d_k={k}, model.n_head={h}" for k in (8, 16, 32, 64) for h in (1, 2, 4)]
    cell_of = {r["name"]: r["cell"] for r in view["runs"]}
    for h, k in shapes:
        seeds = {cell_of[f"h{h}_k{k}_s{seed}"] for seed in (1, 2)}
        assert seeds == {view["cells"].index(f"model.d_k={k}, model.n_head={h}")}, (h, k, seeds)
    assert cell_of["broken"] is None  # unreadable: no config, no cell, no curve
    assert sorted(c for c in cell_of.values() if c is not None) == sorted(list(range(12)) * 2)
    assert {r["seed"] for r in view["runs"] if r["cell"] is not None} == {1, 2}


def test_sampling_settings_are_checked_with_one_line_errors():
    assert api.sampling_settings({"top_k": "", "top_p": "0.9"}).top_k is None
    with pytest.raises(ValueError, match=r"top_p=1\.5 is invalid"):
        api.sampling_settings({"top_p": 1.5})
    with pytest.raises(ValueError, match="max_tokens=99999 is invalid"):
        api.sampling_settings({"max_tokens": 99999})
    with pytest.raises(ValueError, match="seed='x' is not an integer"):
        api.sampling_settings({"seed": "x"})


def test_an_emptied_max_tokens_field_is_named_as_empty_not_as_none():
    """The page sends a cleared field as ""; the message said 'max_tokens=None is invalid', a Python word."""
    for cleared in ("", None):
        with pytest.raises(ValueError, match=r"^max_tokens is empty; give 1 to 2000$"):
            api.sampling_settings({"max_tokens": cleared})


def test_a_cleared_layer_field_draws_the_first_layer_and_says_so(session):
    # Defect: "layer": null or "" computed layer 0 but answered "layer": null, and the page read "layer null"
    for cleared in (None, ""):
        assert api.attention(session, {"prompt": "the", "layer": cleared})["layer"] == 0


def test_the_attention_view_refuses_a_prompt_longer_than_a_map_draws(url, session, monkeypatch):
    # Defect: with the default's 4,096-token context a long prompt would have sent the page n_head x 4,096^2 float32
    # weights a layer (358 MB of base64); the view draws at most MAX_MAP_TOKENS (1,024), here made 8.
    import lab.measures

    monkeypatch.setattr(lab.measures, "MAX_MAP_TOKENS", 8)
    assert lab.measures.attention_layer(session.model, session.encode("the king"), 0)[0].shape[-1] == 8
    status, body = post(url, "/api/attention", {"prompt": "the king is"})
    assert (status, json.loads(body)) == (
        400,
        {
            "error": "the prompt has 11 tokens; the attention view draws at most 8 (its weights grow as the square of "
            "the prompt); give a shorter prompt"
        },
    )


def test_http_errors_are_json_and_the_server_keeps_serving(url, run_dir, monkeypatch):
    status, body = post(url, "/api/sample", {"prompt": "the KING"})
    assert status == 400 and json.loads(body) == {
        "error": "the prompt cannot be encoded: characters 'G', 'I', 'K', 'N' are not in the char vocabulary "
        f"({len(CHARS)} characters)"
    }
    assert post(url, "/api/attention", b"{not json")[0] == 400
    assert post(url, "/api/attention", b"[" * 100_000 + b"]" * 100_000) == (
        400,
        b'{"error": "the request body is not JSON"}',
    ), "nested too deep for the parser (RecursionError) is a bad body too, not a 500"
    assert post(url, "/api/attention", b'{"layer": ' + b"9" * 5000 + b"}") == (
        400,
        b'{"error": "the request body is not JSON"}',
    ), "an integer of more digits than Python converts (it answered: use sys.set_int_max_str_digits())"
    missing = str(run_dir.parent / "no-such-run")
    assert post(url, "/api/runs", {"path": missing}) == (
        400,
        json.dumps({"error": f"run or sweep directory {missing!r} does not exist"}).encode(),
    )
    monkeypatch.setitem(api.ROUTES, "/api/attention", lambda session, body: 1 / 0)
    status, body = post(url, "/api/attention", {})
    assert status == 500 and json.loads(body) == {"error": "internal error: division by zero"}
    status, body = post(url, "/api/nope", {})
    assert status == 404 and "no API" in json.loads(body)["error"]
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(address_and_token(url)[0] + "static/..%2Fsession.py", timeout=30)
    status, body = post(url, "/api/sample", {"prompt": "the king", "max_tokens": 12, "temperature": 0})
    records = [json.loads(line) for line in body.decode().splitlines()]
    assert status == 200 and records[0] == {"prompt_tokens": 8} and records[-1] == {"done": True}
    assert len("".join(r["text"] for r in records[1:-1])) == 12


BAD_PARAMETERS = [  # (path, raw JSON body: 1e400 is JSON for infinity, the start of the error)
    ("/api/intervene", '{"prompt": "the king", "heads_off": [[null, 0]]}', "heads_off layer=None is not an integer"),
    ("/api/intervene", '{"prompt": "the king", "heads_off": [[[0], 0]]}', "heads_off layer=[0] is not an integer"),
    ("/api/intervene", '{"prompt": "the king", "heads_off": [[1e400, 0]]}', "heads_off layer=inf is not an integer"),
    ("/api/intervene", '{"prompt": "the king", "heads_off": [[0.9, 1.9]]}', "heads_off layer=0.9 is not an integer"),
    ("/api/intervene", '{"prompt": "the king", "heads_off": [[0, 1.9]]}', "heads_off head=1.9 is not an integer"),
    ("/api/intervene", '{"prompt": "the king", "heads_off": ["a", 0]}', "heads_off=['a', 0] is invalid; it must be"),
    ("/api/runs", '{"path": 5}', "path=5 is not text"),
    ("/api/runs", '{"path": ["a"]}', "path=['a'] is not text"),
    ("/api/load", '{"path": 5}', "path=5 is not text"),
    ("/api/sample", '{"prompt": "the king", "max_tokens": 1e400}', "max_tokens=inf is not an integer"),
    ("/api/sample", '{"prompt": "the king", "max_tokens": 1.7}', "max_tokens=1.7 is not an integer"),
    ("/api/sample", '{"prompt": "the king", "max_tokens": true}', "max_tokens=True is not an integer"),
    ("/api/sample", '{"prompt": "the king", "temperature": true}', "temperature=True is not a number"),
    ("/api/attention", '{"prompt": "the king", "layer": 1e400}', "layer=inf is not an integer"),
    ("/api/attention", '{"prompt": 123}', "prompt=123 is not text"),
    # a key the API does not read was ignored: max_new_tokens (the command line's name) gave the default 200 tokens
    (
        "/api/sample",
        '{"prompt": "the king", "max_new_tokens": 5}',
        "'max_new_tokens' is not a key of /api/sample (did you mean 'max_tokens'?); it takes: prompt, temperature, ",
    ),
    ("/api/load", '{"run": "x"}', "'run' is not a key of /api/load; it takes: path"),
]


@pytest.mark.parametrize(("path", "body", "message"), BAD_PARAMETERS)
def test_malformed_parameters_are_a_400_naming_the_parameter(url, path, body, message):
    status, answer = post(url, path, body.encode())
    assert status == 400, answer
    assert json.loads(answer)["error"].startswith(message)


def test_integer_parameters_take_integers_or_their_text_and_refuse_the_rest():
    settings = api.sampling_settings({"max_tokens": "12", "seed": 3, "top_k": "5", "temperature": "0.5"})
    assert (settings.max_new_tokens, settings.seed, settings.top_k, settings.temperature) == (12, 3, 5, 0.5)
    assert api.heads_from({"heads_off": [[1, 0], ["0", "1"]]}) == [(1, 0), (0, 1)]
    for value in (2.0, "2.5", False, [2], {}, " 5 ", "1_0", "\u0663", "9" * 5000):  # \u0663: an Arabic-Indic 3
        with pytest.raises(ValueError, match=r"^max_tokens=.* is not an integer; give a whole number"):
            api.integer("max_tokens", value)
    assert [api.number("top_p", v) for v in (1, "0.5", ".5", "-2", "1e-3", "5.")] == [1.0, 0.5, 0.5, -2.0, 1e-3, 5.0]
    for value in (True, " 0.5", "1_0.5", "0x1p-2", "\u0660.5", "0.5.1", "e3"):
        with pytest.raises(ValueError, match=r"^top_p=.* is not a number; give one such as 0.8"):
            api.number("top_p", value)


def raw_exchange(url: str, request: bytes) -> bytes:
    """Send `request` as bytes on a fresh connection and read until the server closes it: every byte of
    every answer it sends (a server that keeps the connection open fails the read's timeout)."""
    host, port = re.match(r"http://(.+):(\d+)/", url).groups()
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(request)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    return received


NEXT_REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"  # bytes that must not be read as a request


@pytest.mark.parametrize(
    ("header", "status", "message"),
    [
        ("Content-Length: -1", 400, "Content-Length '-1' is invalid; it must be a byte count"),
        ("Content-Length: abc", 400, "Content-Length 'abc' is invalid; it must be a byte count"),
        (
            f"Content-Length: {MAX_BODY + 1}",
            413,
            f"the request has {MAX_BODY + 1} bytes; the lab takes at most {MAX_BODY}",
        ),
        (f"Content-Length: {'9' * 5000}", 413, f"the request has {'9' * 5000} bytes; the lab takes at most {MAX_BODY}"),
        ("Transfer-Encoding: chunked", 411, "send the request body with a Content-Length"),
    ],
)
def test_a_body_the_lab_will_not_read_is_refused_at_once_and_the_connection_closed(url, header, status, message):
    """Answered without waiting for the body, and nothing after the headers is taken for the next request
    (before: -1 hung in rfile.read(-1), and the unread body was parsed as a request, a 414)."""
    token = address_and_token(url)[1]
    head = f"POST /api/attention HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Lab-Token: {token}\r\n{header}\r\n\r\n".encode()
    answer = raw_exchange(url, head + NEXT_REQUEST)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()) and b"\r\nConnection: close\r\n" in answer, answer
    assert answer.count(b"HTTP/1.1 ") == 1, "one answer: the bytes after the headers were not parsed"
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"error": message}


def test_a_client_that_hangs_up_leaves_no_traceback(url, capfd):
    """A client reset (the page closed mid-request) is not an error of the lab: nothing on the terminal."""
    host, port = re.match(r"http://(.+):(\d+)/", url).groups()
    for _ in range(3):
        connection = socket.create_connection((host, int(port)), timeout=10)
        connection.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
        connection.close()
    # Connections are accepted in order, so once this answer is back the resets' threads have all started.
    assert post(url, "/api/attention", {"prompt": "the"})[0] == 200, "and the server keeps serving"
    for thread in threading.enumerate():
        if "process_request_thread" in thread.name:
            thread.join(timeout=10)
    assert capfd.readouterr().err == ""


def test_streamed_sample_equals_generate_with_the_same_seed(session):
    idx = session.encode("the king")
    settings = api.sampling_settings({"max_tokens": 20, "seed": 3})
    streamed = "".join(api.stream_text(session.model, session.tokenizer, idx.tolist(), settings, session.device))
    generator = torch.Generator().manual_seed(3)
    out = generate(
        session.model, idx[None], SamplingParams(20, temperature=0.8, top_k=200, seed=None), generator=generator
    )
    assert streamed == session.tokenizer.decode(out[0, idx.shape[0] :].tolist())


class HalfCharacters:
    """The char tokenizer, but every 'e' is half a character (as a byte-level BPE token ending inside a UTF-8
    character decodes to a trailing U+FFFD until the next token completes it)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids)
        return text + "\ufffd" if text.endswith("e") else text


def test_streamed_records_count_tokens_not_text_pieces(session, monkeypatch):
    """A piece held back until its character is whole holds several tokens: the page counted pieces, so a
    BPE sample of 20 tokens ended '18 tokens · done'. Each record now says how many tokens it holds."""
    monkeypatch.setattr(session, "tokenizer", HalfCharacters(session.tokenizer))
    _, records = api.sample(session, {"prompt": "the king", "max_tokens": 60, "seed": 3, "temperature": 2})
    pieces = list(records)
    assert len(pieces) < 60, "some pieces hold more than one token (the test's premise)"
    assert sum(r["tokens"] for r in pieces) == 60


def test_the_page_loads_nothing_from_outside():
    """Offline by construction: no URL in the static files, and every file index.html names is there."""
    for path in STATIC.iterdir():
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)|//cdn", path.read_text()), path.name
    named = re.findall(r'(?:src|href)="/static/([^"]+)"', (STATIC / "index.html").read_text())
    assert sorted(named) == sorted(p.name for p in STATIC.iterdir() if p.name != "index.html")


def test_lab_script_reports_a_bad_checkpoint_or_port_in_one_line(tmp_path, capsys):
    """A checkpoint it cannot load exits 1; a bad command line is argparse's status 2, in one `error:` line
    (it printed the usage too, and --port 99999 exited 1)."""
    from scripts.lab import main

    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "missing")])
    assert exit_.value.code == 1
    assert re.match(r"error: .*missing' does not exist; give a checkpoint file or a run", capsys.readouterr().err)
    bad = {
        ("--port", "99999"): "error: --port 99999 is invalid; it must be 0 to 65535 (0 = a free one) (see --help)",
        ("--port", "abc"): "error: argument --port: invalid int value: 'abc' (see --help)",
        ("--hots", "x"): "error: unrecognized arguments: --hots x (did you mean --host?) (see --help)",
        ("--device", "gpu"): "error: device='gpu' is invalid; use auto, cpu, cuda, cuda:N or mps (see --help)",
        # 10^5 threads crashed in OpenMP (segfault, no message)
        ("--threads", "100000"): f"error: argument --threads: 100000 is invalid; it must be an integer from 1 to "
        f"{8 * os.cpu_count()} (8 per core) (see --help)",
    }
    for args, message in bad.items():
        with pytest.raises(SystemExit) as exit_:
            main([str(tmp_path), *args])
        assert (exit_.value.code, capsys.readouterr().err) == (2, message + "\n")


def test_ctrl_c_while_a_sample_streams_exits_cleanly(tmp_path):
    """`scripts/lab.py` stopped by Ctrl-C in the middle of a long sample: exit 0 and nothing on stderr, not
    a C++ abort ('terminate called without an active exception', 134) from the thread still in torch."""
    # Wide enough that most of each step is in torch, and 2000 tokens take many seconds: the signal
    # arrives mid-generation (a 32-wide model let the thread be outside torch half the time).
    checkpoint = tiny_checkpoint(tmp_path / "wide.safetensors", block_size=128, n_head=4, d_model=512)
    process = start_lab(str(checkpoint))
    try:
        port, token = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=(\S+)", process.stdout.readline()).groups()
        connection = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
        body = json.dumps({"prompt": "the king", "max_tokens": 2000})
        connection.request("POST", "/api/sample", body, {"Content-Type": "application/json", "X-Lab-Token": token})
        response = connection.getresponse()
        assert json.loads(response.readline()) == {"prompt_tokens": 8}
        for _ in range(5):  # a few tokens out: generation is well under way (right after the first, it
            assert "text" in json.loads(response.readline())  # did not always abort before the fix)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
        process.wait()
    assert (process.returncode, stderr) == (0, "")


CLOSING_REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize("method,path", [("GET", "/api/info"), ("GET", "/"), ("POST", "/api/nope")])
def test_a_body_the_route_does_not_use_is_read_not_taken_for_the_next_request(url, method, path):
    """A GET (or a POST to no API) with a body: its bytes are read and dropped, so a body that looks like a
    request is not answered as one (it was: three answers for two requests)."""
    token = address_and_token(url)[1]
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Lab-Token: {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(NEXT_REQUEST)}\r\n\r\n"
    ).encode()
    answer = raw_exchange(url, head + NEXT_REQUEST + CLOSING_REQUEST)
    assert answer.count(b"HTTP/1.1 ") == 2, answer[:300]
    assert b" 403 " not in answer and b" 415 " not in answer, "the request itself was the lab's page's"


def test_a_too_large_body_sent_whole_still_gets_its_answer(url):
    """A client that sends the whole body before it reads (urllib, requests) reads the 413, instead of the
    connection reset that closing on the unread bytes gave (BrokenPipeError / ConnectionResetError)."""
    status, answer = post(url, "/api/attention", b"x" * (20 * MAX_BODY))
    assert (status, json.loads(answer)) == (
        413,
        {"error": f"the request has {20 * MAX_BODY} bytes; the lab takes at most {MAX_BODY}"},
    )
    assert post(url, "/api/attention", {"prompt": "the"})[0] == 200, "and the server keeps serving"


def test_what_http_server_refuses_itself_is_json_too(url):
    """An unsupported method or a request line too long came back as http.server's HTML page; the lab's
    errors are JSON {"error": ...}, and a HEAD answer has no body."""
    answer = raw_exchange(url, b"PUT /api/info HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n")
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 501 ") and b"Content-Type: application/json" in head, answer
    assert json.loads(body) == {"error": "Unsupported method ('PUT')"}
    answer = raw_exchange(url, b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 414 ") and json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"], answer
    answer = raw_exchange(url, b"HEAD / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")  # `curl -I`: a 501
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\n"), answer
    assert b"Content-Type: text/html" in answer and int(answer.split(b"Content-Length: ")[1].split(b"\r")[0]) > 0
