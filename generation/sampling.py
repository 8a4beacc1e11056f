"""Choosing the next token from logits: greedy, temperature, top-k and nucleus (top-p) sampling.

`SamplingParams` is the one description of a sampling request, validated when it is built, and used
by `GPT.generate`/`GPT.stream`, scripts/sample.py (whose --help is generated from the comments
below) and the trainer's end-of-run sample. The functions are pure; randomness comes only from the
`torch.Generator` passed in, so a seed reproduces a sample exactly. Top-p is from Holtzman et al.
2020, "The Curious Case of Neural Text Degeneration".
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor

MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes a 64-bit unsigned seed


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 500  # tokens to generate after the prompt (>= 1)
    temperature: float = 0.8  # divides the logits; 0 = greedy (argmax, deterministic)
    top_k: int | None = 200  # sample among the k most likely tokens only; none = no limit
    top_p: float | None = None  # nucleus: most likely tokens up to probability p, in (0, 1]; none = all
    seed: int | None = 1337  # the sampler's torch.Generator seed: same seed, same text; none = random
    stop_token: int | None = None  # end a row when it produces this token id; none = never stop early
    use_cache: bool = True  # KV cache; false recomputes the context for every token (same tokens, slower)
    context_length: int | None = None  # tokens each step sees; none = block_size (rope/sinusoidal may exceed)

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
