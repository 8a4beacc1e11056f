"""Graceful stop on SIGTERM / SIGINT: the loop finishes its step, saves, and exits with 128 + signal.

A handler only sets a flag (no I/O inside a signal handler); the loop polls it between steps.
A second Ctrl-C interrupts at once, for when the user really means it. Handlers are installed
only around the loop, and only from the main thread (Python's rule for `signal.signal`).
"""

import signal
import threading
from types import FrameType, TracebackType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunInterrupted(Exception):
    """Raised by `train` after a signal-triggered save; `exit_code` is the shell's 128 + signum."""

    def __init__(self, signum: int, step: int, path: str) -> None:
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name} after step {step}; saved {path}; continue with resume=auto")
        self.signum = signum
        self.exit_code = 128 + signum


class StopSignals:
    """Context manager; `requested` is the first stop signal received, or None."""

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS) -> None:
        self.signals = signals
        self.requested: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = signum

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
