"""torch.compile is a switch: it matches eager numerically, and a failing compiler falls back."""

import logging

import pytest
import torch

from model import GPT, GPTConfig
from training.runtime import compile_or_eager


def tiny_model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, d_model=16))


def trial(batch):
    def step(m):
        m(batch, batch)[1].backward()

    return step


def test_compile_failure_falls_back_to_eager_with_a_warning(monkeypatch, caplog):
    def broken_compile(model, *args, **kwargs):
        def fail(*a, **k):
            raise RuntimeError("no C++ compiler found")

        return fail

    monkeypatch.setattr(torch, "compile", broken_compile)
    model = tiny_model()
    batch = torch.randint(0, 32, (2, 16))
    before = torch.get_rng_state()
    with caplog.at_level(logging.WARNING):
        result = compile_or_eager(model, trial(batch))
    assert result is model
    assert "torch.compile failed (RuntimeError: no C++ compiler found); training in eager mode" in caplog.text
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.slow
def test_compiled_model_matches_eager():
    model = tiny_model()
    batch = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(1))
    compiled = compile_or_eager(model, trial(batch))
    assert compiled is not model, "compilation should work on this machine (it has a C++ compiler)"
    assert all(p.grad is None for p in model.parameters())
    eager_loss = model(batch, batch)[1]
    compiled_loss = compiled(batch, batch)[1]
    assert abs(eager_loss.item() - compiled_loss.item()) < 1e-5


def test_a_compile_that_fails_trusting_the_cpu_isa_is_compiled_again_with_inductors_checks(monkeypatch):
    from torch._inductor import config as inductor

    monkeypatch.setattr(torch, "compile", lambda model: model)  # the trial step below plays the compiler
    tried = []

    def trial_step(model):
        tried.append(inductor.cpp.vec_isa_ok)
        if len(tried) == 1:
            raise RuntimeError("g++: error: unrecognized command-line option '-mamx-tile'")

    model = tiny_model()
    with inductor.patch({"cpp.vec_isa_ok": None}):  # as a run starts: nobody set TORCHINDUCTOR_VEC_ISA_OK
        assert compile_or_eager(model, trial_step) is model
        assert tried == [True, None]  # first the CPU's own ISA list, then inductor's checks, which the compile passed
        assert inductor.cpp.vec_isa_ok is None


def test_an_isa_choice_the_user_made_is_kept(monkeypatch):
    from torch._inductor import config as inductor

    monkeypatch.setattr(torch, "compile", lambda model: model)
    tried = []
    model = tiny_model()
    with inductor.patch({"cpp.vec_isa_ok": False}):  # TORCHINDUCTOR_VEC_ISA_OK=0: no vector ISA at all
        assert compile_or_eager(model, lambda m: tried.append(inductor.cpp.vec_isa_ok)) is model
        assert tried == [False] and inductor.cpp.vec_isa_ok is False


def test_a_cache_folder_inductor_cannot_write_is_one_line_and_not_compiled_twice(monkeypatch, caplog):
    # Defect: a read-only TORCHINDUCTOR_CACHE_DIR compiled twice (the second time with the ISA checks, which
    # cannot help) and each warning ran over several lines, cut mid-sentence
    from torch._inductor.exc import InductorError

    calls = []

    def read_only_cache(model, *args, **kwargs):
        def fail(*a, **k):
            calls.append(1)
            denied = PermissionError(13, "Permission denied", "/cache/5m")
            raise InductorError(denied, None)

        return fail

    monkeypatch.setattr(torch, "compile", read_only_cache)
    model, batch = tiny_model(), torch.randint(0, 32, (2, 16))
    with caplog.at_level(logging.INFO):
        assert compile_or_eager(model, trial(batch)) is model
    assert len(calls) == 1
    expected = "torch.compile failed (PermissionError: [Errno 13] Permission denied: '/cache/5m'); training in eager"
    expected += " mode"
    assert [r.getMessage() for r in caplog.records if "compil" in r.getMessage()] == [expected]
