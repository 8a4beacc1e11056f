"""The lab's HTTP server: the page's static files, the JSON API, and the sample as a chunked stream.

Standard library only (http.server), so the page works offline and the core install gains nothing.
Every error is answered as JSON {"error": "one line"}: a problem the user can fix as 400, anything
else as 500 with the traceback in the server's log, never on the page; the server keeps serving.
Every request's body is read whole, whatever the method and path, so its bytes are never taken for the
next request. A body it will not read (a bad or too large Content-Length) is refused at once, what the
client still sends of it is read away, and the connection closed; a client that hangs up is no error.

Only the lab's own page may use it, as Jupyter guards its server: a Host that is no name of this lab is a
403 (a foreign site's name rebound to 127.0.0.1, DNS rebinding), so is an Origin other than the page's
own; every /api/ request must carry the per-launch token of the printed URL (header X-Lab-Token or
?token=), so no other site, user or process on the machine can drive it; a POST body must be
application/json (415), which a foreign page cannot send without a CORS preflight, and the lab approves
none. The page's static files need no token.

A connection that sends or reads nothing for IDLE_S is closed, and at most MAX_CONNECTIONS are served at
once (each holds a thread; 800 stalled clients held 804 threads): the next is answered 503 and closed. A
request that waits too long for the model (lab.session.MODEL_WAIT_S) is a 503 saying what holds it.
"""

import contextlib
import ipaddress
import json
import logging
import math
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from data.text_file import NotJSON, loads_json, read_bytes
from lab import api
from lab.session import LabSession, ModelBusy

log = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
MAX_BODY = 1 << 20  # prompts and settings; nothing the page sends comes near a megabyte
LINGER_S = 10.0  # how long a refused body is read away before its connection closes regardless
IDLE_S = 10.0  # a connection silent this long (between requests, or mid-request) is closed
MAX_CONNECTIONS = 64  # open at once, each a thread; past it a connection is answered 503 and closed


def error_text(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


class RefusedBody(ValueError):
    """A request body the lab will not read. Its bytes stay on the connection and are no request, so the
    answer closes it."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def json_object(body: bytes) -> dict:
    """A request body as a JSON object ({} when empty); ValueError for anything else."""
    try:
        value = loads_json(body or b"{}", "the request body")
    except NotJSON:  # not JSON, not UTF-8, a 5000-digit integer, or [[[[... nested past MAX_DEPTH
        raise ValueError("the request body is not JSON") from None
    if not isinstance(value, dict):
        raise ValueError("the request body must be a JSON object")
    return value


def ip_address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`name` (a host, [v6] in brackets or not) as an IP address; None for a name."""
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(name.removeprefix("[").removesuffix("]"))
    return None


def is_loopback(host: str) -> bool:
    address = ip_address(host)
    return address.is_loopback if address else host.lower() == "localhost"


def strict_json(payload: Any) -> str:
    """JSON a browser parses: a NaN or infinity (a diverged run's loss, in any record read from disk) becomes
    null, where Python's json.dumps writes the bare words NaN and Infinity that JSON.parse refuses."""

    def finite(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(v) for v in value]
        return value

    return json.dumps(finite(payload), allow_nan=False)


class LabServer(ThreadingHTTPServer):
    """The HTTP server of one lab: its session, the host names it answers to and its per-launch token."""

    daemon_threads = True
    request_queue_size = 128  # socketserver's 5 reset connections under a burst of requests

    def __init__(self, session: LabSession, host: str, port: int) -> None:
        super().__init__((host, port), LabHandler)
        self.session = session
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.token = secrets.token_urlsafe(32)
        # An IP address cannot be rebound (DNS rebinding needs a name), so any is taken; of names, those a
        # user may type: localhost, the --host given and, when it listens beyond this machine, its own name.
        names = {"localhost", host} | (set() if is_loopback(host) else {socket.gethostname()})
        self.names = {name.lower() for name in names if name}

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        """A thread for the connection while one of MAX_CONNECTIONS is free; else a 503 at once, and closed."""
        if not self.slots.acquire(blocking=False):
            body = strict_json({"error": f"the lab is serving {MAX_CONNECTIONS} connections; try again"}).encode()
            head = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\n"
            head += f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
            with contextlib.suppress(OSError):
                request.settimeout(1.0)
                request.sendall(head.encode() + body)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def answers_to(self, host: str) -> bool:
        """Whether a request's Host header names this lab. Its port is not compared: an ssh tunnel
        (ssh -L 9000:127.0.0.1:PORT) reaches the lab as localhost:9000, and a port rebinds nothing."""
        name = re.sub(r":[0-9]*$", "", host).lower()  # [::1]:8000 -> [::1]; a bare [::1] ends in ]
        return ip_address(name) is not None or name in self.names


class LabHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked transfer for the streamed sample
    timeout = IDLE_S  # every read and write of the connection: a stalled client is closed, not waited on
    server: LabServer

    @property
    def session(self) -> LabSession:
        return self.server.session

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionError, TimeoutError):  # the client hung up (closed the page) or stalled past IDLE_S:
            self.close_connection = True  # no one to answer, nothing to report

    def send_bytes(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", f"{content_type}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Frame-Options", "DENY")  # no foreign page may frame the lab and steer its clicks
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":  # a HEAD answer is the headers alone
            self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a method the lab has no handler for, a request line too long) as
        JSON, like every other answer; the connection closes, as http.server's does."""
        self.log_error("code %d, message %s", code, message)
        self.close_connection = True
        self.send_json(code, {"error": message or HTTPStatus(code).phrase})

    def send_json(self, status: int, payload: dict) -> None:
        self.send_bytes(status, strict_json(payload).encode(), "application/json")

    def do_HEAD(self) -> None:  # a GET's headers alone (send_bytes leaves the body out); it was a 501
        self.do_GET()

    def do_GET(self) -> None:
        if self.take_body() is None or self.refused():
            return
        path = self.path.split("?", 1)[0]
        if path == "/api/info":
            return self.answer(lambda: self.session.info())
        name = "index.html" if path == "/" else path.removeprefix("/static/")
        file = STATIC / name
        # Only files directly in static/ by their plain name: no '..', no sub-folders, no other paths.
        if "/" in name or file.suffix not in CONTENT_TYPES or not file.is_file():
            return self.send_json(HTTPStatus.NOT_FOUND, {"error": f"no page at {path}"})
        self.answer_file(file)

    def answer_file(self, file: Path) -> None:
        try:
            body = read_bytes(file)
        except (ValueError, OSError) as e:  # the lab's own files: a broken install, not the page's fault
            return self.send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {error_text(e)}"})
        self.send_bytes(HTTPStatus.OK, body, CONTENT_TYPES[file.suffix])

    def do_POST(self) -> None:
        body = self.take_body()
        if body is None or self.refused():
            return
        path = self.path.split("?", 1)[0]
        if path == "/api/sample":
            return self.answer(lambda: api.sample(self.session, api.checked_keys(path, json_object(body))), stream=True)
        route = api.ROUTES.get(path)
        if route is None:
            return self.send_json(HTTPStatus.NOT_FOUND, {"error": f"no API at {path}"})
        self.answer(lambda: route(self.session, api.checked_keys(path, json_object(body))))

    def refused(self) -> bool:
        """Answer a request not from the lab's own page with its 403 or 415 (see the module's docstring)."""
        refusal = self.refusal()
        if refusal:
            self.send_json(*refusal)
        return refusal is not None

    def refusal(self) -> tuple[HTTPStatus, dict] | None:
        host, origin = self.headers.get("Host", ""), self.headers.get("Origin")
        if not self.server.answers_to(host):
            return HTTPStatus.FORBIDDEN, {"error": f"Host {host!r} is not this lab; open the URL the lab printed"}
        if origin is not None and origin.lower() != f"http://{host}".lower():
            return HTTPStatus.FORBIDDEN, {"error": f"Origin {origin!r} is not this lab's page; it answers only its own"}
        path, _, query = self.path.partition("?")
        if not path.startswith("/api/"):
            return None
        token = self.headers.get("X-Lab-Token") or parse_qs(query).get("token", [""])[0]
        # compare_digest: its time tells nothing of how much of a guess was right (as bytes: a str must be ASCII)
        if not secrets.compare_digest(token.encode(), self.server.token.encode()):
            error = "the lab's API needs its token: open the URL the lab printed, with its ?token="
            return HTTPStatus.FORBIDDEN, {"error": error}
        kind = self.headers.get_content_type()  # text/plain when there is none
        if self.command == "POST" and kind != "application/json":
            error = f"the request's Content-Type is {kind}; the API takes application/json only"
            return HTTPStatus.UNSUPPORTED_MEDIA_TYPE, {"error": error}
        return None

    def body_length(self) -> int:
        """The Content-Length to read, refused (RefusedBody) unless a byte count of at most MAX_BODY."""
        declared = self.headers.get("Content-Length") or "0"
        if "Transfer-Encoding" in self.headers:
            raise RefusedBody(HTTPStatus.LENGTH_REQUIRED, "send the request body with a Content-Length")
        if not (declared.isascii() and declared.isdigit()):  # int() would take -1, +5 and 1_0
            raise RefusedBody(
                HTTPStatus.BAD_REQUEST, f"Content-Length {declared!r} is invalid; it must be a byte count"
            )
        if len(declared) > len(str(MAX_BODY)) or int(declared) > MAX_BODY:  # length first: int() caps digits
            raise RefusedBody(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"the request has {declared} bytes; the lab takes at most {MAX_BODY}",
            )
        return int(declared)

    def take_body(self) -> bytes | None:
        """The request's body, read whole; None when it is refused (answered, and the connection closed)."""
        try:
            return self.rfile.read(self.body_length())
        except RefusedBody as e:
            self.close_connection = True
            self.send_json(e.status, {"error": error_text(e)})
            self.linger()
            return None

    def linger(self) -> None:
        """Read away what the client still sends after a refusal: closing a socket with unread bytes resets
        the connection, and a client that sends its whole body before reading (urllib, requests) then gets
        the reset instead of the answer."""
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_WR)  # the answer is whole: the client may read it now
            self.connection.settimeout(1.0)
            deadline = time.monotonic() + LINGER_S
            while time.monotonic() < deadline and self.connection.recv(1 << 16):
                pass

    def answer(self, compute, stream: bool = False) -> None:
        """Run `compute`; send its result, or its error as JSON (400 for the user's, 500 for ours)."""
        try:
            result = compute()
        except ModelBusy as e:
            return self.send_json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": error_text(e), "busy": True})
        except (ValueError, OSError) as e:  # OSError: a path the OS refuses (too long, unreadable), the user's
            return self.send_json(HTTPStatus.BAD_REQUEST, {"error": error_text(e)})
        except Exception as e:
            log.exception("request %s failed", self.path)
            return self.send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {error_text(e)}"})
        if not stream:
            return self.send_json(HTTPStatus.OK, result)
        head, records = result
        self.send_stream(head, records)

    def send_stream(self, head: dict, records: Iterator[dict]) -> None:
        """Newline-delimited JSON in HTTP chunks: `head`, then each record, then {"done": true}."""
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/x-ndjson; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        try:
            self.send_chunk(head)
            try:
                for record in records:
                    self.send_chunk(record)
                self.send_chunk({"done": True})
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                raise
            except (ValueError, OSError, ModelBusy) as e:
                self.send_chunk({"error": error_text(e)})
            except Exception as e:
                log.exception("stream %s failed", self.path)
                self.send_chunk({"error": f"internal error: {error_text(e)}"})
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, TimeoutError):  # the page stopped reading (Stop, or closed)
            self.close_connection = True
        finally:
            records.close()

    def send_chunk(self, record: dict) -> None:
        data = (strict_json(record) + "\n").encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def make_server(session: LabSession, host: str = "127.0.0.1", port: int = 0) -> LabServer:
    """A server bound to (host, port); port 0 picks a free one (read it from server.server_address)."""
    return LabServer(session, host, port)


def url_of(server: LabServer) -> str:
    """The page's URL with the token, as the lab prints it."""
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/?token={server.token}"
