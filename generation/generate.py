"""Autoregressive generation from a GPT: what to sample (`SamplingParams`; greedy, temperature, top-k and
nucleus sampling of the next token), and how: prefill the prompt once, then decode one token at a time.

`SamplingParams` is the one description of a sampling request, validated when it is built, and used by
`generate`, scripts/sample.py (whose --help is generated from its comments), the lab and the end-of-run
sample. The sampling functions are pure; randomness comes only from the `torch.Generator` passed in, so
a seed reproduces a sample exactly. Top-p is from Holtzman et al. 2020, "The Curious Case of Neural
Text Degeneration".

With `use_cache=True` the keys and values of every token are kept in a KVCache, so each new token
costs one forward pass over one token; with `use_cache=False` every step recomputes the whole
context (the reference the cache is tested against, token for token).

Batches of prompts of different lengths are padded on the left (`pad_prompts`); positions count
from each row's first real token, so every row gets exactly the tokens it would get alone.

The engine is `stream_tokens(model, idx, params)`, one `SamplingParams` per request. `encode_prompt`
and `stream_text` are the text ends of it that scripts/sample.py and the trainer share.

Past the context: the model only ever conditions on the last `context_length` tokens (default
block_size), at positions 0..context_length-1, as if that window were the whole text (nanoGPT's
cropping). Both paths compute the same tokens. Where the model's last token provably reads nothing
before that window (`rolls`: rotary positions, every layer windowed, the layers' reach within the
window, no pointer), the cache rolls (model/kv_cache.py): each further token drops the oldest slot and
costs what a token before the context did. Elsewhere, once the cache is full, each further step
re-prefills the window of the last context_length tokens, which costs as much as uncached decoding:
- a full-context layer reads the whole window, and cropping changes the keys of the window's first
  tokens (they lose their history), so no rolled cache holds what the recompute reads;
- learned and sinusoidal positions are absolute: a recompute puts the window at positions 0..T-1;
- the pointer (model/pointer.py) reads the states of every position in the window, whose first ones
  a recompute computes with a cropped history.
Learned positions end at block_size, so that is also their limit;
sinusoidal and rotary positions are defined everywhere, so those models may take a context_length
beyond the block_size they were trained on. That runs, and the cache is sized for it, but a model
has never seen those positions (RoPE: those rotation angles) in training, and its loss there is
usually worse than with the cropped window: measure before relying on it.

Threads: decoding one token of a small model is a few million FLOPs, too little to split. On a CPU that
anything else is using, torch's OpenMP threads then spin at their barriers waiting for each other (2 cores
beside another job: 10 tokens/s with 2 threads, 132 with 1). `decode_threads` picks the count for the
work, and `torch_threads` sets it for a block and restores it; scripts/sample.py, its REPL and the lab
sample inside `with torch_threads(decode_threads(model, requested)):`.
"""

import math
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

if TYPE_CHECKING:
    from model.gpt import GPT


MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes a 64-bit unsigned seed


@dataclass(frozen=True)
class SamplingParams:
    # tokens to generate after the prompt (>= 1); past context_length the cache rolls at the same cost per token
    # where the model reads no further back (rotary positions, every layer windowed, no pointer: the default's);
    # elsewhere each further token re-reads the whole window, hundreds of times slower for a 4,096-token window
    max_new_tokens: int = 200
    temperature: float = 0.8  # divides the logits; 0 = greedy (argmax, deterministic)
    top_k: int | None = 200  # sample among the k most likely tokens only; none = no limit
    top_p: float | None = None  # nucleus: most likely tokens up to probability p, in (0, 1]; none = all
    seed: int | None = 1337  # the sampler's torch.Generator seed: same seed, same text; none = random
    stop_token: int | None = None  # end a row when it produces this token id; none = never stop early
    use_cache: bool = True  # KV cache; false recomputes the context for every token (same tokens, slower)
    context_length: int | None = None  # tokens each step sees; none = block_size (rope/sinusoidal may exceed)
    # mix in the model's continuous cache (model/pointer.py), as its full-val score does; off by default: fed its own
    # samples it repeats them (4-grams repeated 0.116 against held-out text's 0.085: docs/evidence/recipe/round23.md)
    pointer: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting and what is allowed."""
        check_int("max_new_tokens", self.max_new_tokens, low=1)
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise ValueError(f"temperature={self.temperature!r} is invalid; it must be a number >= 0 (0 = greedy)")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} is invalid; it must be finite and >= 0 (0 = greedy)")
        if self.top_k is not None:
            check_int("top_k", self.top_k, low=1, rule="it must be >= 1 (or none for no limit)")
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p={self.top_p} is invalid; it must be in (0, 1] (or none for no limit)")
        if self.seed is not None:
            check_int("seed", self.seed, low=0, high=MAX_SEED)
        if self.stop_token is not None:
            check_int("stop_token", self.stop_token, low=0)
        if self.context_length is not None:
            check_int("context_length", self.context_length, low=1)

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """A generator seeded with `seed` (or from the OS's entropy when seed is none)."""
        generator = torch.Generator(device=device)
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed)
        return generator


MAX_THREADS_PER_CORE = 8  # a --threads bound: far past any gain (one per core helps most), short of OpenMP's crash


def max_threads() -> int:
    """The most torch threads a tool takes (--threads): MAX_THREADS_PER_CORE per core of this machine."""
    return MAX_THREADS_PER_CORE * (os.cpu_count() or 1)


def check_int(name: str, value: object, low: int, high: int | None = None, rule: str = "") -> None:
    """Raise ValueError unless `value` is an int in [low, high]."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)
    if not ok:
        rule = rule or (f"it must be an integer in [{low}, {high}]" if high is not None else f"it must be >= {low}")
        raise ValueError(f"{name}={value} is invalid; {rule}")


def keep_top_k(logits: Tensor, k: int) -> Tensor:
    """Logits (B, V) with all but the k largest per row set to -inf (exactly k kept, ties broken by index)."""
    top = torch.topk(logits, min(k, logits.shape[-1]), dim=-1)
    return torch.full_like(logits, float("-inf")).scatter(-1, top.indices, top.values)


def keep_top_p(logits: Tensor, p: float) -> Tensor:
    """Logits (B, V) restricted to the smallest set of most likely tokens whose probability reaches p."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above each one
    cut = mass_before >= p
    cut[..., 0] = False  # the top token always stays (a p below float32's range, 1e-300, reads as 0 >= 0)
    sorted_logits = sorted_logits.masked_fill(cut, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def scale_by_temperature(logits: Tensor, temperature: float) -> Tensor:
    """logits / temperature, each row's largest logit first subtracted: a tiny temperature then sends the
    others toward -inf (the argmax's probability toward 1) instead of every logit to inf and the softmax
    to NaN. Below float32's smallest normal number the temperature would round to 0 (0 / 0 at the max),
    so it is clamped there, where the others are -inf already."""
    shifted = logits - logits.amax(dim=-1, keepdim=True)
    return shifted / max(temperature, torch.finfo(logits.dtype).tiny)


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Next token ids (B,) from last-position logits (B, V); greedy (argmax) when temperature == 0.
    ValueError when the logits hold NaN or inf (a diverged model), before any draw."""
    logits = logits.float()
    if not bool(torch.isfinite(logits).all()):
        raise ValueError("the model's output is not finite (NaN or inf logits): its weights have diverged")
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = scale_by_temperature(logits, temperature)
    if top_k is not None:
        logits = keep_top_k(logits, top_k)
    if top_p is not None and top_p < 1.0:
        logits = keep_top_p(logits, top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


# -- threads ---------------------------------------------------------------------------------------------

# Forward FLOPs of one decoded token (at a full context) below which one thread decodes fastest: the
# default model needs ~3M, GPT-2 small ~285M; 1e8 is a GPT-2-shaped model of ~45M parameters.
ONE_THREAD_DECODE_FLOPS = 1e8


def decode_threads(model: "GPT", requested: int | None = None, environ: Mapping[str, str] = os.environ) -> int | None:
    """The torch threads to sample `model` with: `requested` when given; None (leave torch's count as it
    is) when OMP_NUM_THREADS is set, the model is not on the CPU, or a decode step is big enough to split;
    else 1."""
    if requested is not None:
        check_int("threads", requested, low=1)
        return requested
    if "OMP_NUM_THREADS" in environ or model.tok_emb.weight.device.type != "cpu":
        return None
    return 1 if model.flops_per_token() / 3 < ONE_THREAD_DECODE_FLOPS else None


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to `threads` inside the block (None: unchanged), then restored.
    The count is process-wide: callers that share a model across threads hold its lock around this."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# -- generation -----------------------------------------------------------------------------------------


class TextTokenizer(Protocol):
    """What the text helpers need of a tokenizer (data.tokenizer's classes, say)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...


def pad_prompts(
    prompts: list[list[int]], pad_id: int = 0, device: torch.device | str | None = None
) -> tuple[Tensor, Tensor]:
    """Left-pad token lists to one (B, T) batch; returns (idx, padding_mask) with True = real token."""
    if not prompts or not all(prompts):
        raise ValueError("every prompt needs at least one token")
    T = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    padding_mask = torch.zeros(len(prompts), T, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        idx[row, T - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        padding_mask[row, T - len(prompt) :] = True
    return idx.to(device), padding_mask.to(device)


def check_context_length(model: "GPT", context_length: int | None) -> int:
    """The context to generate with: block_size by default; learned positions allow no more."""
    if context_length is None:
        return model.config.block_size
    limit = model.max_context()
    if context_length < 1 or (limit is not None and context_length > limit):
        raise ValueError(
            f"context_length={context_length} is invalid; it must be >= 1 and, with learned positions, "
            f"<= block_size ({model.config.block_size})"
        )
    return context_length


def reach(model: "GPT") -> int | None:
    """How many tokens back the last token's logits can depend on, itself included: 1 + the sum of each
    layer's window - 1 (each layer reads window - 1 earlier states of the layer below), plus one more for
    a bigram table (a token's embedding reads the token before it). None where a layer sees every key."""
    c = model.config
    windows = [c.layer_window(layer) for layer in range(c.n_layer)]
    if None in windows:
        return None
    return 1 + sum(w - 1 for w in windows) + (1 if c.bigram_embeds else 0)


def rolls(model: "GPT", context: int, pointer: bool) -> bool:
    """Whether a rolling cache computes exactly what re-prefilling the last `context` tokens computes:
    rotary positions (a score depends on the distance between query and key alone, so a window's keys
    rotated at their absolute positions score as one recomputed at 0..context - 1), the whole reach within
    the window, and no pointer in use (it reads every position's state in the window)."""
    if model.config.pos_encoding != "rope" or (pointer and model.config.pointer_weight > 0):
        return False
    needed = reach(model)
    return needed is not None and needed <= context


def check_prompt(model: "GPT", idx: Tensor) -> None:
    """ValueError unless idx is a (B, T >= 1) batch of ids the embedding holds: caught here in one line,
    not as an IndexError deep in the model (on CUDA, a device-side assert). One host sync per call."""
    if idx.ndim != 2 or idx.shape[1] == 0:
        raise ValueError(f"the prompt idx has shape {tuple(idx.shape)}; it must be (B, T) with T >= 1")
    vocab = model.config.vocab_size
    for bad in torch.stack([idx.min(), idx.max()]).tolist():  # one read back
        if not 0 <= bad < vocab:
            raise ValueError(f"the prompt holds token id {bad}; ids must be in [0, {vocab})")


@torch.no_grad()
def stream_tokens(
    model: "GPT",
    idx: Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    padding_mask: Tensor | None = None,
) -> Iterator[Tensor]:
    """Yield the next token of every row, (B,), for up to params.max_new_tokens steps.

    Stops early once every row has produced `params.stop_token`; a row that stopped before the
    others keeps yielding it. The model should be in eval mode (dropout would differ per call).
    generator: overrides params.seed; with neither, torch's global generator is used.
    """
    context = check_context_length(model, params.context_length)
    check_prompt(model, idx)
    if generator is None and params.seed is not None:
        generator = params.make_generator(idx.device)
    max_new_tokens, stop_token = params.max_new_tokens, params.stop_token
    B, T = idx.shape
    # The model only ever sees the last `context` tokens, so only those are kept (for a full cache's
    # re-prefill), in a buffer that slides back when full: nothing is sized to max_new_tokens, which
    # may be any size (10**20 overflowed torch's int64; 10**12 asked for 8 TB).
    kept = min(T, context)
    capacity = min(2 * context, kept + max_new_tokens)
    tokens = torch.empty(B, capacity, dtype=torch.long, device=idx.device)
    tokens[:, :kept] = idx[:, T - kept :]
    real = None
    if padding_mask is not None:
        real = torch.ones(B, capacity, dtype=torch.bool, device=idx.device)
        real[:, :kept] = padding_mask[:, T - kept :]
    cache = None
    if params.use_cache:
        cache = model.new_cache(B, min(context, T + max_new_tokens), rolling=rolls(model, context, params.pointer))
    done = torch.zeros(B, dtype=torch.bool, device=idx.device)
    length = kept
    for step in range(max_new_tokens):
        if cache is not None and step > 0 and (cache.rolling or cache.length < cache.max_length):
            logits, _ = model(tokens[:, length - 1 : length], cache=cache, last_only=True, pointer=params.pointer)
        else:  # (re-)prefill the window of the last `context` tokens
            start = max(0, length - context)
            window_mask = real[:, start:length] if real is not None else None
            if cache is not None:
                cache.reset()
            logits, _ = model(
                tokens[:, start:length], padding_mask=window_mask, cache=cache, last_only=True, pointer=params.pointer
            )
        next_id = sample_next(logits[:, -1], params.temperature, params.top_k, params.top_p, generator)  # (B,)
        if stop_token is not None:
            next_id = next_id.masked_fill(done, stop_token)
            done |= next_id == stop_token
        if length == capacity:  # full: the last `context` tokens go to the front
            length = slide_back(tokens, real, context)
        tokens[:, length] = next_id
        length += 1
        yield next_id
        if stop_token is not None and bool(done.all()):
            return


def slide_back(tokens: Tensor, real: Tensor | None, context: int) -> int:
    """Move the last `context` columns of a full buffer (and its mask) to its front; the new length."""
    tokens[:, :context] = tokens[:, -context:].clone()
    if real is not None:
        real[:, :context] = real[:, -context:].clone()
    return context


def generate(
    model: "GPT",
    idx: Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    padding_mask: Tensor | None = None,
) -> Tensor:
    """The prompt (B, T) followed by the new tokens (B, n), n <= params.max_new_tokens (fewer after stop_token)."""
    new = list(stream_tokens(model, idx, params, generator, padding_mask))
    return torch.cat([idx, torch.stack(new, dim=1)], dim=1)


def encode_prompt(tokenizer: TextTokenizer, text: str, vocab_size: int) -> list[int]:
    """The prompt's token ids; ValueError in one line (naming unknown characters) if it has none or
    cannot be encoded. Call it before printing anything, so a bad prompt costs nothing."""
    if not text:
        raise ValueError("the prompt is empty; give at least one character")
    check_utf8_prompt(text)
    try:
        ids = tokenizer.encode(text)
    except ValueError as e:  # the char tokenizer names the characters it does not know
        raise ValueError(f"the prompt cannot be encoded: {e}") from None
    if not ids:
        raise ValueError("the prompt encodes to no tokens; give a longer prompt")
    if max(ids) >= vocab_size:
        raise ValueError(f"the prompt has token id {max(ids)}, beyond the model's vocabulary of {vocab_size}")
    return ids


def check_utf8_prompt(text: str) -> None:
    """Refuse a lone surrogate in one line: Python reads bytes that are not UTF-8 (a Latin-1 file in argv or
    on stdin) as U+DC80..U+DCFF, and JSON can carry any; the byte-level tokenizers fail on them at length."""
    bad = next((i for i, ch in enumerate(text) if "\ud800" <= ch <= "\udfff"), None)
    if bad is None:
        return
    code = ord(text[bad])
    what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"a lone surrogate U+{code:04X}"
    raise ValueError(f"the prompt is not UTF-8 text ({what} at character {bad + 1}); give UTF-8 text")


def stream_text(
    model: "GPT",
    tokenizer: TextTokenizer,
    ids: list[int],
    params: SamplingParams,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> Iterator[str]:
    """The continuation of one prompt as text pieces, in order, joining to decode(new ids).

    A byte-level BPE token may end inside a UTF-8 character; such a piece is held back until the
    character is whole (and flushed at the end, whatever it is). generator: as in stream_tokens.
    """
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    pending: list[int] = []  # ids since the last whole piece: only they are decoded again, so a long
    for next_id in stream_tokens(model, idx, params, generator):  # sample costs linear, not quadratic, time
        pending.append(int(next_id[0]))
        text = tokenizer.decode(pending)
        if text and not text.endswith("\ufffd"):
            yield text
            pending = []
    if pending and (text := tokenizer.decode(pending)):
        yield text
