"""What `python train.py` writes to the terminal: streams that outlive their reader, and log lines written
above the progress bar as plain messages (train.log keeps timestamps and names)."""

import contextlib
import logging
import sys
from typing import Any

from tqdm import tqdm

from cli.errors import replace_unencodable


class ConsoleStream:
    """sys.stdout / sys.stderr of a run: what it cannot write once the console's reader is gone is dropped,
    not raised. `python train.py 2>&1 | tee log` then Ctrl-C kills tee too, and the progress bar's next
    write (EPIPE) would end the run before its save; train.log and metrics.jsonl keep the record."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        replace_unencodable(stream)

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(BrokenPipeError):
            self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ... as the stream has them
        return getattr(self.stream, name)


class TqdmHandler(logging.Handler):
    """Console log lines written above the progress bar (tqdm.write), never glued onto it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


def console_logging(level: int = logging.INFO) -> None:
    """INFO and above to the terminal as plain messages (train.log keeps timestamps and names)."""
    root = logging.getLogger()
    root.setLevel(level)
    if not any(isinstance(h, TqdmHandler) for h in root.handlers):
        handler = TqdmHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    for noisy in ("httpx", "huggingface_hub", "datasets", "filelock", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
