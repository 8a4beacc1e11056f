"""The claims that only a GPU can check: fused kernels, bf16 and the KV cache on CUDA.

Skipped without CUDA (CI has none). On a GPU machine: `python -m pytest tests/test_cuda.py`.
"""

import json

import pytest
import torch

from cli.config import to_train_config
from generation.generate import SamplingParams, generate, pad_prompts
from model import GPT, GPTConfig
from model.attention import fused_attention, scaled_dot_product_attention
from model.causal_mask import build_causal_mask
from model.materialized_attention import causal_materialized_attention
from tests.helpers import compose_config
from tests.variants import VARIANTS
from training.setup import train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")
VOCAB = 64


def make_model(backend: str = "sdpa", variant: str = "learned") -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=VOCAB,
        block_size=128,
        n_layer=2,
        n_head=6,
        d_model=48,
        d_k=10,
        attn_backend=backend,
        **VARIANTS[variant],
    )
    return GPT(cfg).to(CUDA).eval()


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_fused_kernels_match_the_equation(dtype, tolerance):
    # bf16 tolerance: inputs carry 8 bits of mantissa, and the kernels accumulate in different orders.
    g = torch.Generator(device=CUDA).manual_seed(0)
    q, k, v = (torch.randn(2, 8, 256, 64, device=CUDA, generator=g).to(dtype) for _ in range(3))
    reference = scaled_dot_product_attention(q.double(), k.double(), v.double(), build_causal_mask(256, CUDA))
    fused = fused_attention(q, k, v, is_causal=True)  # flash-eligible in bf16
    assert (fused.double() - reference).abs().max().item() < tolerance
    materialized = causal_materialized_attention(q, k, v)
    assert (materialized.double() - reference).abs().max().item() < tolerance


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_no_future_leak_on_cuda(variant):
    model = make_model("auto", variant)  # the fused kernel where the variant allows it
    idx = torch.randint(0, VOCAB, (2, 64), device=CUDA)
    with torch.no_grad():
        base, _ = model(idx)
        changed = idx.clone()
        changed[:, 40] = (changed[:, 40] + 1) % VOCAB
        logits, _ = model(changed)
    assert (logits[:, :40] - base[:, :40]).abs().max().item() <= 1e-5
    assert (logits[:, 40:] - base[:, 40:]).abs().max().item() > 1e-4


@pytest.mark.parametrize("backend", ["explicit", "sdpa", "materialized"])
def test_cached_generation_equals_uncached_on_cuda(backend):
    model = make_model(backend)
    idx = torch.randint(0, VOCAB, (1, 16), device=CUDA)
    cached = generate(model, idx, SamplingParams(100, temperature=0, use_cache=True, top_k=None, seed=None))
    uncached = generate(model, idx, SamplingParams(100, temperature=0, use_cache=False, top_k=None, seed=None))
    assert torch.equal(cached, uncached)


def test_padded_rows_stay_finite_in_bf16():
    # Fully padded query rows are where some fused CUDA kernels return NaN; ours must not.
    model = make_model("sdpa")
    idx, mask = pad_prompts([[1, 2, 3], list(range(1, 20))], device=CUDA)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        logits, _ = model(idx, padding_mask=mask)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("compile_model", [False, True])
def test_tiny_run_trains_in_bf16_on_cuda(tiny_run_overrides, tmp_path, compile_model):
    overrides = [*tiny_run_overrides, "device=cuda", "precision=auto", f"compile={str(compile_model).lower()}"]
    metrics = train(to_train_config(compose_config(overrides)))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert torch.isfinite(torch.tensor(metrics["val/loss"]))
    assert all(0 < r["throughput/mfu"] < 1 for r in records if "throughput/mfu" in r)
