"""The prepared data as a run reads it (`PreparedData`: token memmaps, their tokenizer, the val text's
bytes; data/prepare.py makes it), batches of (input, target) windows cut from it as pure functions of
their keys, and how an optimizer step's batch is dealt out to ranks and micro-steps.

Offsets come from a generator seeded with (seed, step, micro_step), so a batch depends on nothing but
those numbers: a resumed run sees exactly the batches it would have seen.

The global batch does not depend on the number of processes: its sequences are the micro-batches a
one-process run would draw, dealt out to the ranks in turn (`BatchLayout`), so W processes train on
exactly a one-process run's windows and, up to float rounding, produce its losses
(tests/e2e/test_distributed.py).
"""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from data.tokenizer import Tokenizer


@dataclass
class PreparedData:
    directory: Path
    train: np.ndarray  # np.memmap of token ids, read-only
    val: np.ndarray
    meta: dict  # meta.json as written (source, counts, split rules); the fields below are what code reads
    tokenizer: Tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def fingerprint(self) -> str:
        return self.meta["fingerprint"]

    @property
    def tokenizer_meta(self) -> dict:
        return self.meta["tokenizer"]

    @property
    def val_tokens(self) -> int:
        return len(self.val)

    @property
    def val_bytes(self) -> int:
        """UTF-8 bytes of the val text, to turn loss per token into bits per byte."""
        return self.meta["val_bytes"]

    def bits_per_byte(self, val_loss: float) -> float:
        """A val loss in nats per token as bits per UTF-8 byte of the val text: comparable across tokenizers."""
        return val_loss / math.log(2) * self.val_tokens / self.val_bytes


def check_block_size(tokens: np.ndarray, block_size: int, split: str = "train") -> None:
    """Raise ValueError unless `tokens` holds at least one window of block_size + 1 tokens."""
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be >= 1")
    if len(tokens) <= block_size:
        raise ValueError(f"{split} split has {len(tokens)} tokens; it needs more than block_size={block_size}")


def sample_batch(
    tokens: np.ndarray,
    batch_size: int,
    block_size: int,
    *,
    seed: int,
    step: int,
    micro_step: int = 0,
    split: str = "train",
) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 (x, y), both (batch_size, block_size), where y[:, t] is the token after x[:, t]."""
    check_block_size(tokens, block_size, split)
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    # The trailing 0 once named a rank, which ranks no longer need (BatchLayout deals out one process's
    # batches); it stays so that every batch, and every saved run's resume, is the one it was.
    rng = np.random.default_rng([seed, step, micro_step, 0])
    # The window [start, start + block_size] must fit, hence the exclusive high end.
    starts = rng.integers(0, len(tokens) - block_size, size=batch_size)
    windows = np.stack([tokens[s : s + block_size + 1] for s in starts]).astype(np.int64)  # (B, T+1)
    x = torch.from_numpy(windows[:, :-1].copy())  # (B, T)
    y = torch.from_numpy(windows[:, 1:].copy())  # (B, T)
    return x, y


def eval_batches(
    tokens: np.ndarray, batch_size: int, block_size: int, num_batches: int, seed: int, split: str = "val"
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same `num_batches` batches on every call, so evaluations are comparable across steps."""
    return [sample_batch(tokens, batch_size, block_size, seed=seed, step=i, split=split) for i in range(num_batches)]


class RankInfo(Protocol):
    """What the layout needs of a process's place in the job (training.distributed.DistInfo)."""

    rank: int
    world_size: int


@dataclass(frozen=True)
class BatchLayout:
    """The step's `global_batch_size / batch_size` reference micro-batches (those a one-process run draws)
    are each cut into `split` equal parts (1 unless there are too few to give every rank whole ones);
    rank r's micro-step m runs part `m * world_size + r`."""

    micro_batch: int  # sequences per forward on each rank
    accum_steps: int  # micro-steps per rank per optimizer step
    split: int  # parts each reference micro-batch is cut into

    def locate(self, micro: int, info: RankInfo) -> tuple[int, slice]:
        """This rank's micro-step `micro`: the reference micro-batch to draw (its `micro_step` for
        data.batches.sample_batch, drawn as rank 0 would, so the data is a one-process run's) and its rows."""
        part = micro * info.world_size + info.rank
        lo = (part % self.split) * self.micro_batch
        return part // self.split, slice(lo, lo + self.micro_batch)


def batch_layout(batch_size: int, grad_accum_steps: int, global_batch_size: int | None, world_size: int) -> BatchLayout:
    """Per-rank micro-batch and accumulation steps; `global_batch_size=None` means batch_size *
    grad_accum_steps, so a config trains on the same sequences under any world size that divides it."""
    total = global_batch_size if global_batch_size is not None else batch_size * grad_accum_steps
    if total % batch_size:
        raise ValueError(f"global_batch_size ({total}) must be a multiple of batch_size ({batch_size})")
    references = total // batch_size
    for split in range(1, batch_size + 1):
        if batch_size % split == 0 and (references * split) % world_size == 0:
            return BatchLayout(batch_size // split, references * split // world_size, split)
    raise ValueError(
        f"a global batch of {total} sequences cannot be shared evenly by {world_size} processes "
        f"(in micro-batches dividing batch_size={batch_size}); use a number of processes that divides {total}"
    )
