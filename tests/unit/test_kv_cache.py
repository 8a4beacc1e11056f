"""Cached decoding computes what full recomputation computes: logits at every step, tokens, padding,
for every attention/position variant (tests/variants.py); a sliding-window layer's cache keeps only
its window and still computes what a cache of every slot does."""

import dataclasses

import pytest
import torch

from generation.generate import SamplingParams, generate, pad_prompts, reach, rolls
from model import GPT, GPTConfig
from model.kv_cache import KVCache, token_positions
from tests.variants import BACKENDS, VARIANT_HEADS, VARIANTS, backend_variants, variant_cases, variant_model

VOCAB = 64
# (n_head, d_k) over d_model 48, including d_k != d_model / n_head.
HEAD_GRID = [(1, None), (4, None), (3, 10), (6, 24)]
ALL_VARIANTS = pytest.mark.parametrize("variant", list(VARIANTS))
# Each variant on every backend that computes it (a backend that cannot refuses: tests/variants.py).
ON_EVERY_BACKEND = pytest.mark.parametrize("backend,variant", backend_variants())
# Generation mixes in the `pointer` variant's continuous cache only when asked (sampling's default is off): asked here.
# GPT-2 runs the long checks (200+ positions); the variants share its code paths for length and run
# shorter ones, which keeps this module at seconds.
LONG, SHORT = 210, 60


pytestmark = pytest.mark.usefixtures("one_thread")


def make_model(
    backend: str = "sdpa", n_head: int = 4, d_k: int | None = None, block_size: int = 256, variant: str = "learned"
) -> GPT:
    return widen_weights(variant_model(backend, n_head, d_k, variant, VOCAB, block_size))


def widen_weights(model: GPT) -> GPT:
    """GPT-2's init gives near-uniform logits; wider weights make the argmax decisive, so a greedy
    comparison tests the cache rather than the tie-breaking of nearly equal logits."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    return model


def prompt(B: int, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("backend,variant,n_head,d_k", variant_cases(HEAD_GRID, BACKENDS))
def test_cached_logits_equal_recomputed_logits_at_every_step(backend, variant, n_head, d_k):
    model = make_model(backend, n_head, d_k, variant=variant)
    steps = LONG if variant == "learned" else SHORT
    tokens = prompt(2, 6)
    cache = model.new_cache(2, tokens.shape[1] + steps)
    sampler = torch.Generator().manual_seed(3)  # sampled, not greedy: a random model's argmax soon loops
    with torch.no_grad():
        logits, _ = model(tokens, cache=cache, last_only=True)  # prefill
        for step in range(steps):
            full, _ = model(tokens)  # recompute everything
            err = (logits[:, -1] - full[:, -1]).abs().max().item()
            assert err <= 1e-5, f"step {step}: cached logits differ by {err}"
            assert torch.equal(logits[:, -1].argmax(-1), full[:, -1].argmax(-1)), f"step {step}: greedy choice differs"
            next_id = torch.multinomial(logits[:, -1].softmax(-1), 1, generator=sampler)  # (B, 1)
            tokens = torch.cat([tokens, next_id], dim=1)
            logits, _ = model(next_id, cache=cache)  # decode one token
    assert cache.length == tokens.shape[1]
    assert len(set(tokens[0, 6:].tolist())) > min(VOCAB, steps) // 3, "the test should cover many different tokens"


@ON_EVERY_BACKEND
def test_generate_cached_equals_uncached_for_greedy_tokens(backend, variant):
    model = make_model(backend, *VARIANT_HEADS, variant=variant)
    idx = prompt(2, 5)
    n = LONG if variant == "learned" else SHORT
    cached = generate(model, idx, SamplingParams(n, temperature=0, use_cache=True, top_k=None, seed=None, pointer=True))
    uncached = generate(
        model, idx, SamplingParams(n, temperature=0, use_cache=False, top_k=None, seed=None, pointer=True)
    )
    assert cached.shape == (2, 5 + n)
    assert torch.equal(cached, uncached)


@ON_EVERY_BACKEND
def test_chunked_prefill_equals_one_shot_prefill(backend, variant):
    model = make_model(backend, *VARIANT_HEADS, variant=variant)
    tokens = prompt(2, 30)
    one_shot, chunked = model.new_cache(2, 40), model.new_cache(2, 40)
    with torch.no_grad():
        expected, _ = model(tokens, cache=one_shot)
        pieces, start = [], 0
        for size in (7, 1, 12, 10):
            logits, _ = model(tokens[:, start : start + size], cache=chunked)
            pieces.append(logits)
            start += size
    torch.testing.assert_close(torch.cat(pieces, dim=1), expected, atol=1e-5, rtol=0)
    for a, b in zip(one_shot.layers, chunked.layers, strict=True):
        torch.testing.assert_close(a.keys[:, :, :30], b.keys[:, :, :30], atol=1e-5, rtol=0)
        torch.testing.assert_close(a.values[:, :, :30], b.values[:, :, :30], atol=1e-5, rtol=0)


@pytest.mark.parametrize("use_cache", [True, False])
@ON_EVERY_BACKEND
def test_padded_batch_equals_each_prompt_alone(backend, use_cache, variant):
    model = make_model(backend, *VARIANT_HEADS, variant=variant)
    prompts = [prompt(1, n, seed=n)[0].tolist() for n in (3, 11, 6)]
    idx, padding_mask = pad_prompts(prompts, pad_id=VOCAB - 1)
    batched = generate(
        model,
        idx,
        SamplingParams(40, temperature=0, use_cache=use_cache, top_k=None, seed=None, pointer=True),
        padding_mask=padding_mask,
    )
    for row, p in enumerate(prompts):
        alone = generate(
            model,
            torch.tensor([p]),
            SamplingParams(40, temperature=0, use_cache=use_cache, top_k=None, seed=None, pointer=True),
        )
        assert torch.equal(batched[row, -40:], alone[0, -40:]), f"prompt {row} changed by batching"


@ON_EVERY_BACKEND
def test_padded_prefill_logits_equal_each_prompt_alone(backend, variant):
    model = make_model(backend, *VARIANT_HEADS, variant=variant)
    prompts = [prompt(1, n, seed=n)[0].tolist() for n in (2, 9)]
    idx, padding_mask = pad_prompts(prompts)
    with torch.no_grad():
        batched, _ = model(idx, padding_mask=padding_mask)
        for row, p in enumerate(prompts):
            alone, _ = model(torch.tensor([p]))
            torch.testing.assert_close(batched[row, -len(p) :], alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("use_cache", [True, False])
@ALL_VARIANTS
def test_past_block_size_conditions_on_the_last_block_size_tokens(use_cache, variant):
    model = make_model("auto", *VARIANT_HEADS, block_size=16, variant=variant)
    idx = prompt(1, 5)
    out = generate(
        model, idx, SamplingParams(40, temperature=0, use_cache=use_cache, top_k=None, seed=None, pointer=True)
    )
    assert out.shape == (1, 45)
    with torch.no_grad():
        for length in range(5, 45):  # reference: crop to the window, positions 0..block_size-1
            logits, _ = model(out[:, max(0, length - 16) : length])
            assert out[0, length].item() == logits[0, -1].argmax().item(), f"token {length} differs"


@ALL_VARIANTS
def test_prompt_longer_than_block_size_and_padded_batch_past_block_size(variant):
    model = make_model("explicit", *VARIANT_HEADS, block_size=16, variant=variant)
    prompts = [prompt(1, n, seed=n)[0].tolist() for n in (4, 21)]
    idx, padding_mask = pad_prompts(prompts)
    batched = generate(
        model, idx, SamplingParams(25, temperature=0, top_k=None, seed=None, pointer=True), padding_mask=padding_mask
    )
    for row, p in enumerate(prompts):
        alone = generate(
            model,
            torch.tensor([p]),
            SamplingParams(25, temperature=0, use_cache=False, top_k=None, seed=None, pointer=True),
        )
        assert torch.equal(batched[row, -25:], alone[0, -25:])


def test_running_past_block_size_through_the_cache_is_refused():
    model = make_model(block_size=16)
    cache = model.new_cache(1)
    with torch.no_grad():
        model(prompt(1, 10), cache=cache)
        with pytest.raises(ValueError, match="10 cached \\+ 7 new tokens exceeds the model's block_size 16"):
            model(prompt(1, 7), cache=cache)
    with pytest.raises(ValueError, match="KV cache length 17 must be in"):
        model.new_cache(1, 17)


def test_full_cache_is_refused_and_reset_empties_it():
    cache = KVCache(n_layer=1, batch_size=1, n_kv_head=2, max_length=4, d_k=3)
    cache.reserve(3)
    with pytest.raises(ValueError, match="KV cache is full: 3 \\+ 2 tokens exceed its 4 slots"):
        cache.reserve(2)
    cache.reset()
    positions, padding = cache.reserve(4)
    assert positions.tolist() == [[0, 1, 2, 3]] and padding is None


def test_cache_stores_keys_per_layer_in_preallocated_buffers():
    model = make_model("sdpa", 3, 10)
    cache = model.new_cache(2, 20)
    assert len(cache.layers) == 2
    assert cache.layers[0].keys.shape == (2, 3, 20, 10)  # (B, n_kv_head, T_max, d_k)
    buffer = cache.layers[0].keys.data_ptr()
    tokens = prompt(2, 8)
    with torch.no_grad():
        model(tokens, cache=cache)
        model(tokens[:, :1], cache=cache)
    assert cache.layers[0].keys.data_ptr() == buffer, "the cache must write in place, not reallocate"
    x = model.tok_emb(tokens) + model.pos_emb(torch.arange(8))
    _, k, v = model.blocks[0].attn.project_qkv(model.blocks[0].ln_1(x))
    torch.testing.assert_close(cache.layers[0].keys[:, :, :8], k)
    torch.testing.assert_close(cache.layers[0].values[:, :, :8], v)


def test_positions_count_from_each_rows_first_real_token():
    padding_mask = torch.tensor([[False, False, True, True], [True, True, True, True]])
    assert token_positions(4, padding_mask).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]
    assert token_positions(3, offset=5).tolist() == [[5, 6, 7]]
    cache = KVCache(n_layer=1, batch_size=2, n_kv_head=1, max_length=8, d_k=2)
    cache.reserve(4, padding_mask)
    positions, padding = cache.reserve(1)  # decoding continues each row's own count
    assert positions.tolist() == [[2], [4]]
    assert padding.tolist() == [[False, False, True, True, True], [True] * 5]


# -- sliding windows: a windowed layer's cache keeps only its window -----------------------------------


def windowed_model(backend: str, window: int, block_size: int = 64) -> GPT:
    """3 layers "SLS" (layers 0 and 2 windowed) with RoPE and GQA: positions run on past the window
    while the cache drops slots, and the kept keys are the grouped ones."""
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=VOCAB,
        block_size=block_size,
        n_layer=3,
        n_head=6,
        d_model=48,
        d_k=10,
        n_kv_head=2,
        pos_encoding="rope",
        attn_backend=backend,
        window_pattern="SLS",
        window_size=window,
    )
    return widen_weights(GPT(cfg).eval())


@pytest.mark.parametrize("window", [1, 3])
@pytest.mark.parametrize("backend", BACKENDS)
def test_windowed_cache_holds_only_the_window_and_computes_what_the_full_cache_does(backend, window):
    model = windowed_model(backend, window)
    c, B, length = model.config, 3, 60
    windowed = model.new_cache(B, length)
    full = KVCache(c.n_layer, B, c.kv_heads, length, c.head_dim)  # no windows: every layer keeps every slot
    slot_bytes = 2 * B * c.kv_heads * c.head_dim * 4  # K and V of one slot of every row, float32
    assert full.nbytes == 3 * length * slot_bytes
    assert windowed.nbytes == (length + 2 * (window - 1)) * slot_bytes  # one full layer, two of window - 1
    assert [layer.keys.shape[2] for layer in windowed.layers] == [window - 1, length, window - 1]

    # Left-padded prompts, prefilled in chunks longer than the window, then sampled decoding for
    # several times the window: the kept slots are overwritten again and again.
    prompts = [prompt(1, n, seed=n)[0].tolist() for n in (2, 13, 8)]
    tokens, real = pad_prompts(prompts)
    sampler = torch.Generator().manual_seed(5)
    with torch.no_grad():
        start = 0
        for size in (7, 1, 5):  # 13 prompt slots
            chunk, chunk_real = tokens[:, start : start + size], real[:, start : start + size]
            expected, _ = model(chunk, padding_mask=chunk_real, cache=full)
            logits, _ = model(chunk, padding_mask=chunk_real, cache=windowed)
            torch.testing.assert_close(logits[chunk_real], expected[chunk_real], atol=1e-5, rtol=0)
            start += size
        while tokens.shape[1] < length:
            next_id = torch.multinomial(logits[:, -1].softmax(-1), 1, generator=sampler)  # (B, 1)
            tokens = torch.cat([tokens, next_id], dim=1)
            expected, _ = model(next_id, cache=full)
            logits, _ = model(next_id, cache=windowed)
            torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
        uncached, _ = model(tokens, padding_mask=torch.cat([real, torch.ones(B, length - 13, dtype=torch.bool)], 1))
    torch.testing.assert_close(logits[:, -1], uncached[:, -1], atol=1e-5, rtol=0)
    assert windowed.length == full.length == length
    last = slice(length - window + 1, length)
    for layer in (0, 2):  # what the window keeps is the full cache's last window - 1 slots, in order
        torch.testing.assert_close(windowed.layers[layer].keys, full.layers[layer].keys[:, :, last])
        torch.testing.assert_close(windowed.layers[layer].values, full.layers[layer].values[:, :, last])


def test_windowed_generation_past_block_size_equals_uncached():
    # A padded batch decodes 20 tokens through a window of 3 (it wraps again and again), then runs past
    # block_size 32, where the generator re-prefills the last 32 tokens at every step.
    model = windowed_model("auto", window=3, block_size=32)
    prompts = [prompt(1, n, seed=n)[0].tolist() for n in (5, 12)]
    idx, padding_mask = pad_prompts(prompts)
    params = {"temperature": 0, "top_k": None, "seed": None}
    cached = generate(model, idx, SamplingParams(40, use_cache=True, **params), padding_mask=padding_mask)
    uncached = generate(model, idx, SamplingParams(40, use_cache=False, **params), padding_mask=padding_mask)
    assert torch.equal(cached, uncached)
    assert len(set(cached[0, -40:].tolist())) > 5, "the test should not sit on one repeated token"


def test_a_window_as_long_as_the_cache_keeps_every_slot_and_bad_windows_are_refused():
    cache = KVCache(n_layer=3, batch_size=1, n_kv_head=1, max_length=6, d_k=2, windows=[6, 9, 5])
    assert [layer.keys.shape[2] for layer in cache.layers] == [6, 6, 4]
    with pytest.raises(ValueError, match=r"KV cache windows \[4\] must give one window \(or None: full\) per layer"):
        KVCache(n_layer=2, batch_size=1, n_kv_head=1, max_length=6, d_k=2, windows=[4])
    with pytest.raises(ValueError, match=r"KV cache windows \[0, None\] are invalid; each must be >= 1"):
        KVCache(n_layer=2, batch_size=1, n_kv_head=1, max_length=6, d_k=2, windows=[0, None])


# -- rolling: past its length a cache drops its oldest slot, for models that read no further back -----------

CONTEXT = 16
# Tiny models of every position type and window setting, with context 16 and how the sampler decodes past it:
# "roll" where every layer is windowed within the window (reach <= 16) under rotary positions, else "recompute".
ROLLING_CASES = {
    "learned_windowed": ({"window_pattern": "S", "window_size": 4}, "recompute"),  # absolute positions
    "sinusoidal_windowed": ({"pos_encoding": "sinusoidal", "window_pattern": "S", "window_size": 4}, "recompute"),
    "rope_full": ({"pos_encoding": "rope"}, "recompute"),  # a layer reads the whole window
    "rope_window_then_full": ({"pos_encoding": "rope", "window_pattern": "SL", "window_size": 4}, "recompute"),
    "rope_reach_past_context": ({"pos_encoding": "rope", "window_pattern": "S", "window_size": 9}, "recompute"),
    "rope_windowed": (VARIANTS["window_long"] | {"pos_encoding": "rope"}, "roll"),  # reach 1 + 3 + 5 = 9
    "rope_window_8": ({"pos_encoding": "rope", "window_pattern": "S", "window_size": 8}, "roll"),  # reach 15
    # one layer whose window is the whole cache: a full layer's buffer, which rolling moves one slot to the front
    "rope_window_as_long_as_context": (
        {"pos_encoding": "rope", "window_pattern": "S", "window_size": CONTEXT, "n_layer": 1},
        "roll",
    ),
    "default_run": (VARIANTS["default_run"], "roll"),  # sampling's pointer off; reach 9 + 1 (bigram)
    "mla_windowed": ({"mla_latent": 16, "pos_encoding": "rope", "window_pattern": "S", "window_size": 5}, "roll"),
    "gqa_qk_norm_sinks": (
        {"pos_encoding": "rope", "n_kv_head": 2, "qk_norm": True, "attn_sinks": True, "window_pattern": "S"}
        | {"window_size": 5},
        "roll",
    ),
}


def rolling_case_config(name: str, backend: str = "auto") -> GPTConfig:
    overrides, _ = ROLLING_CASES[name]
    shape = {"n_layer": 2, "n_head": 6, "d_model": 48, "d_k": 12}
    return GPTConfig(vocab_size=VOCAB, block_size=CONTEXT, attn_backend=backend, **(shape | overrides))


def rolling_case_model(name: str, backend: str = "auto") -> GPT:
    torch.manual_seed(0)
    return widen_weights(GPT(rolling_case_config(name, backend)).eval())


@pytest.mark.parametrize("name", list(ROLLING_CASES))
def test_past_the_context_sampling_rolls_exactly_where_the_model_reads_no_further_back(name):
    """Decoding 3x past the context equals a recompute of the last 16 tokens at positions 0..15 (the window
    every layer type is defined on), token for token: greedy against the model on each cropped window, and
    sampled against the uncached path with the same seed. After the prefill every forward pass of a rolling
    model takes one token (its cost per token stays that of one cached step), while the others re-prefill the
    16-token window at every step past the context."""
    model = rolling_case_model(name)
    lengths: list[int] = []
    hook = model.register_forward_pre_hook(lambda _, args: lengths.append(args[0].shape[1]))
    try:
        greedy = generate(model, prompt(1, 5), SamplingParams(44, temperature=0, top_k=None, seed=None))
        sampled = generate(model, prompt(1, 5), SamplingParams(44, temperature=1.0, top_k=None, seed=7))
    finally:
        hook.remove()
    expected_roll = ROLLING_CASES[name][1] == "roll"
    assert rolls(model, CONTEXT, pointer=False) is expected_roll
    past = lengths[CONTEXT - 5 + 1 : 44] + lengths[44 + CONTEXT - 5 + 1 :]  # each run's steps once 16 are in
    assert set(past) == ({1} if expected_roll else {CONTEXT}), past
    with torch.no_grad():
        for length in range(5, greedy.shape[1]):
            logits, _ = model(greedy[:, max(0, length - CONTEXT) : length], pointer=False)
            assert greedy[0, length].item() == logits[0, -1].argmax().item(), f"token {length} differs"
    recomputed = generate(model, prompt(1, 5), SamplingParams(44, temperature=1.0, top_k=None, seed=7, use_cache=False))
    assert torch.equal(sampled, recomputed)
    assert len(set(sampled[0, 5:].tolist())) > 10, "the test should not sit on a few repeated tokens"


def computes(name: str, backend: str) -> bool:
    try:
        rolling_case_config(name, backend).validate()
    except ValueError:  # a kernel that cannot compute a variant (sinks on sdpa) refuses it
        return False
    return True


@pytest.mark.parametrize(
    "backend,name",
    [(b, n) for b in BACKENDS for n, (_, how) in ROLLING_CASES.items() if how == "roll" and computes(n, b)],
)
def test_a_rolled_cache_gives_the_logits_of_recomputing_the_last_max_length_tokens(backend, name):
    """Logits, not only the argmax: each of 40 single-token steps past a full 16-slot cache, under sampled
    tokens, against the model on the last 16 tokens recomputed at positions 0..15. Positions in the cache run
    on to 55, past block_size, and each kept key keeps the rotation of its own."""
    model = rolling_case_model(name, backend)
    cache = model.new_cache(2, CONTEXT, rolling=True)
    tokens = prompt(2, CONTEXT)
    sampler = torch.Generator().manual_seed(3)
    with torch.no_grad():
        logits, _ = model(tokens, cache=cache, pointer=False)
        for _ in range(40):
            next_id = torch.multinomial(logits[:, -1].softmax(-1), 1, generator=sampler)  # (B, 1)
            tokens = torch.cat([tokens, next_id], dim=1)
            logits, _ = model(next_id, cache=cache, pointer=False)
            expected, _ = model(tokens[:, -CONTEXT:], pointer=False)
            torch.testing.assert_close(logits[:, -1], expected[:, -1], atol=1e-4, rtol=0)
    assert cache.length == CONTEXT and cache.dropped == 40 and cache.n_real.tolist() == [56, 56]


def test_a_padded_batch_rolls_as_each_prompt_alone():
    """Left padding rolls off the front with the oldest slots: each row of a padded batch decoded 30 tokens past
    the context gets the tokens it gets alone (uncached, recomputing the window)."""
    model = rolling_case_model("default_run")
    prompts = [prompt(1, n, seed=n)[0].tolist() for n in (3, 11)]
    idx, padding_mask = pad_prompts(prompts)
    batched = generate(model, idx, SamplingParams(30, temperature=0, top_k=None, seed=None), padding_mask=padding_mask)
    for row, p in enumerate(prompts):
        alone = generate(model, torch.tensor([p]), SamplingParams(30, temperature=0, use_cache=False, seed=None))
        assert torch.equal(batched[row, -30:], alone[0, -30:])


def test_a_rolling_cache_drops_the_oldest_slot_and_refuses_chunks_once_full():
    cache = KVCache(n_layer=2, batch_size=1, n_kv_head=1, max_length=4, d_k=1, windows=[None, 3], rolling=True)
    full, windowed = cache.layers
    for position in range(7):
        positions, _ = cache.reserve(1)
        assert positions.tolist() == [[position]]  # positions run on past the 4 slots
        key = torch.full((1, 1, 1, 1), float(position))
        keys, _ = full.update(key, key)
        window_keys, _ = windowed.update(key, key)
        assert keys.flatten().tolist() == [float(p) for p in range(max(0, position - 3), position + 1)]
        assert window_keys.flatten().tolist() == [float(p) for p in range(max(0, position - 2), position + 1)]
    assert cache.length == 4 and cache.dropped == 3
    with pytest.raises(ValueError, match="a rolling KV cache takes one token at a time once full: 4 \\+ 2 tokens"):
        cache.reserve(2)
    cache.reset()
    assert cache.reserve(4)[0].tolist() == [[0, 1, 2, 3]] and cache.dropped == 0


@pytest.mark.parametrize("pos_encoding", ["learned", "sinusoidal"])
def test_absolute_positions_cannot_roll(pos_encoding):
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=8, n_layer=1, n_head=1, d_model=8, pos_encoding=pos_encoding))
    with pytest.raises(
        ValueError, match=f"a rolling KV cache needs rotary positions; model.pos_encoding='{pos_encoding}'"
    ):
        model.new_cache(1, rolling=True)


def test_the_default_models_reach_is_318_tokens_and_it_rolls_without_the_pointer():
    """The default (configs/model/small.yaml): three layers of 64 keys, one of 128 and a bigram table reach
    1 + 3 * 63 + 127 + 1 = 318 tokens, well within its 4,096; with --pointer it reads every state of the window."""
    from bench.bench_train import load_config

    cfg = load_config([])
    model = GPT(dataclasses.replace(cfg.model, vocab_size=cfg.data.bpe_vocab_size))
    assert reach(model) == 318
    assert rolls(model, model.config.block_size, pointer=False)
    assert not rolls(model, model.config.block_size, pointer=True)
    assert not rolls(model, 317, pointer=False)
