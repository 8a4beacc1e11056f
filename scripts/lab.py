"""The attnlab lab, a local web page: `python scripts/lab.py RUN_OR_CKPT [--host H] [--port P] [--device D]
[--root DIR]`.

Loads the checkpoint once (a run directory means its checkpoints/best.safetensors, else its newest
step_*.safetensors), prints the page's URL with its per-launch token and serves until Ctrl-C. --port 0
picks a free port. The page opens runs and checkpoints under --root only (default: the folder holding
the run). A problem the user can fix exits non-zero with one line `error: ...`.
"""

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

if __package__ in (None, ""):  # run as a file (python scripts/lab.py): make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import training.threads  # isort: skip  (before torch: OpenMP reads its wait policy once)
from cli.errors import exit_with_error
from cli.schema_help import OneLineParser, at_least, check_device_option
from generation.generate import MAX_THREADS_PER_CORE, max_threads
from lab.server import is_loopback, make_server, url_of
from lab.session import LabSession


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(description="A local web page to sample, look inside attention, switch heads off.")
    parser.add_argument("source", help="a checkpoint file or a run directory")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=0, help="port; 0 = pick a free one (default)")
    parser.add_argument("--device", default="cpu", help="auto | cpu | cuda | cuda:N | mps (default: cpu)")
    parser.add_argument("--root", help="the folder whose runs and checkpoints the page may open (default: the run's)")
    parser.add_argument(
        "--threads",
        type=at_least(1, max_threads(), f" ({MAX_THREADS_PER_CORE} per core)"),
        help="torch CPU threads for sampling (default: 1 for a small model, unless OMP_NUM_THREADS is set)",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port} is invalid; it must be 0 to 65535 (0 = a free one)")
    check_device_option(parser, args.device)
    return args


def exit_without_finalizing(status: int) -> NoReturn:
    """Exit at once, skipping the interpreter's shutdown: a request thread may still be inside torch (a
    streamed sample), and tearing the process down under it aborts ('terminate called without an active
    exception', status 134). Nothing else needs closing; the output is flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        session = LabSession(args.source, args.device, args.root, threads=args.threads)
    except (ValueError, OSError) as e:  # OSError: a path the OS refuses (too long, unreadable)
        exit_with_error(e)
    try:
        server = make_server(session, args.host, args.port)
    except OSError as e:  # port taken, unknown host, no permission
        exit_with_error(f"cannot listen on {args.host}:{args.port} ({e.strerror or e})")
    # Ctrl-C stops the server even when a shell started it in the background (which ignores SIGINT).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if not is_loopback(args.host):
        print(
            f"warning: --host {args.host} makes the page reachable from the network; only the token in its URL "
            "guards the API",
            file=sys.stderr,
            flush=True,
        )
    print(f"attnlab lab: {session.checkpoint} at {url_of(server)}  (Ctrl-C to stop)", flush=True)
    if session.device.type == "cpu":  # how its CPU threads wait, as a run's header says
        print(f"threads: {training.threads.summary()}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    exit_without_finalizing(0)


if __name__ == "__main__":
    main()
