"""How an optimizer step's global batch is dealt out to ranks and micro-steps. The global batch does not
depend on the number of processes: its sequences are the micro-batches a one-process run would draw,
dealt out to the ranks in turn, so W processes train on exactly a one-process run's windows and,
up to float rounding, produce its losses (tests/e2e/test_distributed.py)."""

from dataclasses import dataclass

from training.distributed import DistInfo


@dataclass(frozen=True)
class BatchLayout:
    """The step's `global_batch_size / batch_size` reference micro-batches (those a one-process run draws)
    are each cut into `split` equal parts (1 unless there are too few to give every rank whole ones);
    rank r's micro-step m runs part `m * world_size + r`."""

    micro_batch: int  # sequences per forward on each rank
    accum_steps: int  # micro-steps per rank per optimizer step
    split: int  # parts each reference micro-batch is cut into

    def locate(self, micro: int, info: DistInfo) -> tuple[int, slice]:
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
