"""How an entry point fails: a problem the user can fix is one line `error: ...` on stderr and a non-zero
exit (the only place that turns an exception into that line), and Ctrl-C in the seconds an entry point
takes to import torch is a quiet exit 130, not a traceback from deep inside an import (nothing is
written while the imports run, so nothing can be lost). A run stops, saving first, on SIGTERM, and when the
process that started it (a sweep's launcher, a benchmark) dies."""

import contextlib
import ctypes
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

LAUNCHER_PID = "ATTNLAB_LAUNCHER_PID"  # the process that started train.py (a sweep, bench_quality): it dies with it
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


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


def error_line(e: BaseException) -> str:
    """An exception as the one line a user reads: its message's first line, or its type's name."""
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def exit_with_error(e: BaseException | str, code: int = 1) -> NoReturn:
    """Exit `code` with `error: ...`. Under torchrun the line goes into this rank's error file too (the
    format of torch's own `@record`), so the failure summary torchrun prints after it names this line as
    the root cause rather than a link to its docs."""
    message = f"error: {e if isinstance(e, str) else error_line(e)}"
    if error_file := os.environ.get("TORCHELASTIC_ERROR_FILE"):
        extra = {"py_callstack": message, "timestamp": str(int(time.time()))}
        with contextlib.suppress(OSError):
            Path(error_file).write_text(json.dumps({"message": {"message": message, "extraInfo": extra}}))
    sys.stderr.write(message + "\n")
    sys.exit(code)


def replace_unencodable(stream: object) -> None:
    """Characters the console's encoding lacks (PYTHONIOENCODING=ascii, a cp1252 terminal) shown as '?': a
    sample holding one ended a finished run with exit 1, and sample.py with nothing usable. stderr already
    escapes them (Python's backslashreplace)."""
    with contextlib.suppress(AttributeError, ValueError, OSError):  # a stream that is not a text file's
        stream.reconfigure(errors="replace")


def stop_outside_the_loop(signum: int, frame: object) -> NoReturn:
    """SIGTERM before the training loop (preparing data, compiling) or after it: a one-line exit that unwinds
    (a directory made for the run and a half-written data cache are removed on the way), where the default
    handler ended the process silently and left both behind."""
    failing = sys.exc_info()[1]  # a lost rank's error on its way out: torchrun stops the others once a rank dies
    if getattr(failing, "explains_a_stop", False):  # not any library's error it handles at that moment
        print(f"error: {error_line(failing)}", file=sys.stderr)
    else:
        print(f"stopped by {signal.Signals(signum).name} outside the training loop (in it, a stop saves a step first)",
              file=sys.stderr)  # fmt: skip
    raise SystemExit(128 + signum)


def die_with(launcher_pid: int) -> None:
    """SIGTERM to this run when the process that started it dies (Linux; train.py calls it where LAUNCHER_PID is
    set): the run saves and stops, as after any SIGTERM, instead of training on with no one to read it."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != launcher_pid:  # it died before the line above could take effect
        os.kill(os.getpid(), signal.SIGTERM)
