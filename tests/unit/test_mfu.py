"""MFU: measured peak, cached per device and dtype; the ratio uses the model's own FLOP count."""

import json

import pytest
import torch

from model import GPT, GPTConfig
from rundir.records import mfu
from training import runtime as mfu_mod


def test_peak_is_measured_once_then_cached(tmp_path, monkeypatch):
    calls = []

    def fake_measure(device, precision):
        calls.append(precision)
        return 1.5e12

    monkeypatch.setattr(mfu_mod, "measure_matmul_peak", fake_measure)
    cache = tmp_path / "peak.json"
    cpu = torch.device("cpu")
    assert mfu_mod.peak_flops(cpu, "bf16", cache) == 1.5e12
    assert mfu_mod.peak_flops(cpu, "bf16", cache) == 1.5e12
    assert calls == ["bf16"]
    assert [entry["flops"] for entry in json.loads(cache.read_text()).values()] == [
        1.5e12
    ]  # with when and beside what load
    mfu_mod.peak_flops(cpu, "bf16", cache, remeasure=True)
    assert calls == ["bf16", "bf16"]


def test_measured_peak_is_a_plausible_rate():
    peak = mfu_mod.measure_matmul_peak(torch.device("cpu"), "fp32", shapes=((256, 128, 64),), repeats=3)
    assert 1e8 < peak < 1e14  # between 0.1 GFLOP/s and 100 TFLOP/s on any CPU


def test_mfu_uses_the_models_flops_per_token():
    model = GPT(GPTConfig(vocab_size=100, block_size=64, n_layer=2, n_head=3, d_model=48, d_k=20))
    flops = model.flops_per_token()
    assert mfu(flops, tokens_per_s=1000.0, peak=flops * 4000.0) == pytest.approx(0.25)


@pytest.mark.parametrize("native_bf16", [False, True])
def test_a_precision_without_fast_cpu_kernels_is_refused_naming_the_fast_ones(monkeypatch, native_bf16):
    monkeypatch.setattr(mfu_mod, "cpu_supports_bf16", lambda: native_bf16)
    cpu = torch.device("cpu")
    fast = r"auto \(bf16 on this CPU\), bf16 or fp32" if native_bf16 else r"auto \(fp32 on this CPU\) or fp32"
    with pytest.raises(ValueError, match=rf"^precision=fp16 has no fast kernels on a CPU; .*: use {fast}$"):
        mfu_mod.check_precision_runs("fp16", cpu)
    if native_bf16:
        mfu_mod.check_precision_runs("bf16", cpu)
    else:  # an AVX2-only CPU emulates bf16: ~60x fp32's step
        with pytest.raises(
            ValueError, match=rf"^precision=bf16 has no fast kernels on this CPU \(no AVX512-BF16.*{fast}$"
        ):
            mfu_mod.check_precision_runs("bf16", cpu)
    for precision in ("auto", "fp32"):
        mfu_mod.check_precision_runs(precision, cpu)
