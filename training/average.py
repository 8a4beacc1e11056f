"""Weight averaging over the last phase of training: the weights a run evaluates, saves and samples are a
running average of its recent steps' weights, while the optimizer keeps stepping its own.

The average is a power-function EMA (Karras et al. 2024, "Analyzing and improving the training dynamics of
diffusion models"): at the n-th averaged step, avg = beta_n avg + (1 - beta_n) w with
beta_n = (1 - 1/n)^(power + 1), which weighs the step taken at t of the n so far by about t^power. Its window
grows with the run (about 1 / (power + 2) of the averaged steps), so one setting fits a 20-step smoke run and
a 5-minute one alike, where a fixed decay such as 0.995 would barely move from its first copy in the first.
Measured in docs/recipe/round5.md.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from training.distributed import reshard


class WeightAverage:
    """The average of `model`'s parameters from progress `start` on (None: never). `count` is the number of
    steps averaged so far; a checkpoint keeps it and the averaged weights, so a resumed run continues it."""

    def __init__(self, start: float | None, power: float) -> None:
        self.start, self.power = start, power
        self.count = 0
        self.weights: list[Tensor] | None = None
        self.saved: dict[str, Tensor] | None = None  # from a checkpoint, until the (wrapped) model is known

    @property
    def active(self) -> bool:
        return self.count > 0

    def load(self, weights: dict[str, Tensor], count: int) -> None:
        """A checkpoint's averaged weights (by parameter name) and step count; dropped where this run does
        not average (it continues from the checkpoint's own weights)."""
        keep = count > 0 and self.start is not None
        self.saved, self.count, self.weights = (weights, count, None) if keep else (None, 0, None)

    @torch.no_grad()
    def update(self, model: nn.Module, progress: float) -> None:
        """Fold the weights of the step just taken in, once training is `start` of the way through."""
        if self.start is None or progress < self.start:
            return
        self.count += 1
        params = parameters(model)
        if self.count == 1:
            self.weights = [p.clone() for p in params]
            return
        weight = 1 - (1 - 1 / self.count) ** (self.power + 1)
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
