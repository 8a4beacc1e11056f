"""How many torch threads sampling uses: decode_threads' choice, torch_threads' set-and-restore, and the lab."""

import pytest
import torch

from generation import generate as generation
from generation.generate import decode_threads, torch_threads
from lab import api
from lab.session import LabSession
from model import GPT, GPTConfig
from tests.unit.test_lab import tiny_checkpoint


@pytest.fixture(scope="module")
def tiny() -> GPT:
    return GPT(GPTConfig(vocab_size=40, block_size=32, n_layer=2, n_head=2, d_model=32)).eval()


@pytest.fixture
def set_calls(monkeypatch) -> list[int]:
    """torch.set_num_threads recorded instead of done (so tests on a shared machine change nothing)."""
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    return calls


def test_a_small_model_decodes_on_one_thread_unless_told_otherwise(tiny):
    assert decode_threads(tiny, environ={}) == 1
    assert decode_threads(tiny, 3, environ={}) == 3  # --threads 3
    assert decode_threads(tiny, 2, environ={"OMP_NUM_THREADS": "4"}) == 2  # the explicit count wins
    assert decode_threads(tiny, environ={"OMP_NUM_THREADS": "4"}) is None  # the user's OMP_NUM_THREADS stays


def test_a_model_whose_decode_step_is_big_enough_keeps_torchs_threads(tiny, monkeypatch):
    step = tiny.flops_per_token() / 3  # forward FLOPs of one decoded token
    monkeypatch.setattr(generation, "ONE_THREAD_DECODE_FLOPS", step)
    assert decode_threads(tiny, environ={}) is None
    monkeypatch.setattr(generation, "ONE_THREAD_DECODE_FLOPS", step + 1)
    assert decode_threads(tiny, environ={}) == 1


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_a_bad_thread_count_is_refused_in_one_line(tiny, bad):
    with pytest.raises(ValueError, match=rf"^threads={bad} is invalid; it must be >= 1$"):
        decode_threads(tiny, bad, environ={})


def test_torch_threads_sets_the_count_and_restores_it_even_after_an_error(set_calls):
    before = torch.get_num_threads()
    with torch_threads(3):
        assert set_calls == [3]
    assert set_calls == [3, before]
    with pytest.raises(KeyboardInterrupt), torch_threads(2):
        raise KeyboardInterrupt
    assert set_calls == [3, before, 2, before]
    with torch_threads(None):  # decode_threads' "leave it": no call at all
        pass
    assert set_calls == [3, before, 2, before]


@pytest.mark.parametrize("threads,expected", [(None, 1), (2, 2)])
def test_the_labs_samples_decode_on_its_thread_count_and_restore_it(
    tmp_path, monkeypatch, set_calls, threads, expected
):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # pytest-xdist sets it for its workers
    session = LabSession(tiny_checkpoint(tmp_path / "tiny.safetensors"), threads=threads)
    before = torch.get_num_threads()
    _, records = api.sample(session, {"prompt": "ab", "max_tokens": 3})
    assert sum(r["tokens"] for r in records) == 3
    # a sample holds the model (and the thread count) a token at a time, so another tab's request runs between
    pairs = len(set_calls) // 2
    assert pairs >= 3 and set_calls == [expected, before] * pairs
    set_calls.clear()
    api.intervene(session, {"prompt": "ab", "max_tokens": 3, "heads_off": [[0, 0]]})
    pairs = len(set_calls) // 2
    assert pairs >= 2 and set_calls == [expected, before] * pairs  # the full model's sample, then the ablated one's
