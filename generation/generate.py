"""Autoregressive generation from a GPT: prefill the prompt once, then decode one token at a time.

With `use_cache=True` the keys and values of every token are kept in a KVCache, so each new token
costs one forward pass over one token; with `use_cache=False` every step recomputes the whole
context (the reference the cache is tested against, token for token).

Batches of prompts of different lengths are padded on the left (`pad_prompts`); positions count
from each row's first real token, so every row gets exactly the tokens it would get alone.

The engine is `stream_tokens(model, idx, params)`, one `SamplingParams` (generation/sampling.py) per
request; `GPT.generate`/`GPT.stream` keep their keyword signatures and build one. `encode_prompt`
and `stream_text` are the text ends of it that scripts/sample.py and the trainer share.

Past the context: the model only ever conditions on the last `context_length` tokens (default
block_size), at positions 0..context_length-1, as if that window were the whole text (nanoGPT's
cropping). Both paths do the same: once the cache is full, each further step re-prefills the window
of the last context_length tokens, so tokens beyond it cost as much as uncached decoding but are
exactly the same tokens. Learned positions end at block_size, so that is also their limit;
sinusoidal and rotary positions are defined everywhere, so those models may take a context_length
beyond the block_size they were trained on. That runs, and the cache is sized for it, but a model
has never seen those positions (RoPE: those rotation angles) in training, and its loss there is
usually worse than with the cropped window: measure before relying on it.
"""

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from generation.sampling import SamplingParams, sample_next

if TYPE_CHECKING:
    from model.gpt import GPT


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
    cache = model.new_cache(B, min(context, T + max_new_tokens)) if params.use_cache else None
    done = torch.zeros(B, dtype=torch.bool, device=idx.device)
    length = kept
    for step in range(max_new_tokens):
        if cache is not None and step > 0 and cache.length < cache.max_length:
            logits, _ = model(tokens[:, length - 1 : length], cache=cache, last_only=True)  # decode one token
        else:  # (re-)prefill the window of the last `context` tokens
            start = max(0, length - context)
            window_mask = real[:, start:length] if real is not None else None
            if cache is not None:
                cache.reset()
            logits, _ = model(tokens[:, start:length], padding_mask=window_mask, cache=cache, last_only=True)
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
    try:
        ids = tokenizer.encode(text)
    except ValueError as e:  # the char tokenizer names the characters it does not know
        raise ValueError(f"the prompt cannot be encoded: {e}") from None
    if not ids:
        raise ValueError("the prompt encodes to no tokens; give a longer prompt")
    if max(ids) >= vocab_size:
        raise ValueError(f"the prompt has token id {max(ids)}, beyond the model's vocabulary of {vocab_size}")
    return ids


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
