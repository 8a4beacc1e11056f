"""Weight averaging over the last phase of training: the weights a run evaluates, saves and samples are an
exponential moving average of its steps' weights, while the optimizer keeps stepping its own.

The average's time constant is a fraction of the run (`window`), not a number of steps: a step that moves
progress (the fraction of training done) by d folds its weights in with weight 1 - exp(-d / window). A
5-minute run of 2,500 steps with window 0.08 is an EMA of decay 0.995 a step, and a 20-step smoke run or a
budget run that turns out longer gets the same shape. Measured in docs/evidence/recipe/round5.md.
"""

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from training.distributed import reshard


class WeightAverage:
    """The EMA of `model`'s parameters from progress `start` on (None: never), time constant `window` of the
    run. `progress` is that of the last step folded in (None: none yet); a checkpoint keeps it and the
    averaged weights, so a resumed run continues the same average."""

    def __init__(self, start: float | None, window: float) -> None:
        self.start, self.window = start, window
        self.progress: float | None = None
        self.weights: list[Tensor] | None = None
        self.saved: dict[str, Tensor] | None = None  # from a checkpoint, until the (wrapped) model is known

    @property
    def active(self) -> bool:
        return self.progress is not None

    def load(self, weights: dict[str, Tensor], progress: float | None) -> None:
        """A checkpoint's averaged weights (by parameter name) and progress; dropped where this run does not
        average (it continues from the checkpoint's own weights)."""
        self.clear()
        if progress is not None and self.start is not None:
            self.saved, self.progress = weights, progress

    def clear(self) -> None:
        """No average yet: the next step from `start` on begins one."""
        self.progress, self.weights, self.saved = None, None, None

    @torch.no_grad()
    def update(self, model: nn.Module, progress: float) -> None:
        """Fold in the weights of the step taken at `progress`, once training is `start` of the way through."""
        if self.progress is not None and progress < self.progress:  # resumed with a longer run: its schedule
            self.clear()  # went back, so the average starts again
        if self.start is None or progress < self.start:
            return
        params = parameters(model)
        if self.progress is None:
            self.weights, self.progress = [p.clone() for p in params], progress
            return
        weight = 1 - math.exp(-(progress - self.progress) / self.window)
        self.progress = progress
        for avg, p in zip(self.averaged(model), params, strict=True):
            avg.lerp_(p, weight)

    def averaged(self, model: nn.Module) -> list[Tensor]:
        """The averaged weights, one per parameter of `model`, laid out (and sharded) as its parameters are."""
        if self.weights is None:
            assert self.saved is not None, "no average yet"
            self.weights = [like(p.detach(), self.saved[name]) for name, p in model.named_parameters()]
            self.saved = None
        return self.weights

    @contextmanager
    @torch.no_grad()
    def swapped_in(self, model: nn.Module) -> Iterator[None]:
        """`model` holds the averaged weights inside the block and its own again after it (a no-op before the
        first averaged step)."""
        if not self.active:
            yield
            return
        params = parameters(model)
        own = [p.clone() for p in params]
        for p, avg in zip(params, self.averaged(model), strict=True):
            p.copy_(avg)
        try:
            yield
        finally:
            for p, mine in zip(params, own, strict=True):
                p.copy_(mine)

    @torch.no_grad()
    def install(self, model: nn.Module) -> None:
        """Leave the averaged weights in `model` for good (the end of a run: what it samples and returns)."""
        if self.active:
            for p, avg in zip(parameters(model), self.averaged(model), strict=True):
                p.copy_(avg)


def parameters(model: nn.Module) -> list[Tensor]:
    """`model`'s parameters as the optimizer steps them: under FSDP2 its shards, also after an evaluation."""
    reshard(model)
    return [p.detach() for p in model.parameters()]


def like(param: Tensor, full: Tensor) -> Tensor:
    """A saved (whole, CPU) tensor laid out as `param`: sharded as it is under FSDP2, on its device."""
    if hasattr(param, "device_mesh"):  # an FSDP2 shard (DTensor)
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full.to(param.dtype), param.device_mesh, param.placements)
    return full.to(device=param.device, dtype=param.dtype).clone()
