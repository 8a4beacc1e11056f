"""Ctrl-C in the seconds an entry point takes to import torch: a quiet exit 130, not a traceback from
deep inside an import. Nothing is written while the imports run, so nothing can be lost."""

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager


def _exit_now(*_) -> None:
    # No unwinding: an exception raised mid-import can be swallowed by a library's bare `except:` and leave
    # a half-imported module behind (numpy then recurses without end, as a CI run once showed).
    os.write(2, b"interrupted\n")
    os._exit(130)


@contextmanager
def exit_quietly_on_ctrl_c() -> Iterator[None]:
    """Inside the block Ctrl-C exits at once; after it, the handler before (Python's, or an inherited
    ignore, which is kept throughout) is back."""
    before = signal.getsignal(signal.SIGINT)
    if before is signal.default_int_handler:
        signal.signal(signal.SIGINT, _exit_now)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
