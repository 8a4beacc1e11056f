"""The start-up Ctrl-C guard swaps Python's handler only inside its block and never overrides an ignore."""

import signal

import pytest

from cli.errors import exit_quietly_on_ctrl_c


@pytest.fixture
def sigint_restored():
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


def test_the_guard_replaces_pythons_handler_inside_the_block_and_puts_it_back(sigint_restored):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with exit_quietly_on_ctrl_c():
        inside = signal.getsignal(signal.SIGINT)
    assert inside is not signal.default_int_handler and callable(inside)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_guard_keeps_an_inherited_ignore(sigint_restored):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # e.g. `nohup` or a background job: Ctrl-C is not for us
    with exit_quietly_on_ctrl_c():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
