"""Multi-process training under `torchrun`: process group, rank info, DDP / FSDP2 wrapping, and the
few collectives the trainer needs (one run directory, rank-0-only work, errors that end the job).

Launched by plain `python`, nothing here starts a process group and every helper is a no-op, so a
single-process run is exactly what it was. Under `torchrun --nproc_per_node=N` each process reads
RANK / LOCAL_RANK / WORLD_SIZE from its environment; NCCL is used on CUDA, gloo on CPU.

Which sequences each rank trains on is training/batch_layout.py.
"""

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

STRATEGIES = ("ddp", "fsdp")
BACKENDS = ("auto", "nccl", "gloo")
T = TypeVar("T")


@dataclass
class DistributedConfig:
    strategy: str = "ddp"  # ddp | fsdp (FSDP2 fully_shard); used only when torchrun starts > 1 process
    backend: str = "auto"  # auto (nccl on CUDA, gloo on CPU) | nccl | gloo
    timeout_s: float = 600.0  # a collective waiting this long (a rank died or hung) ends the job

    def validate(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"distributed.strategy={self.strategy!r} is unknown; choose one of: {', '.join(STRATEGIES)}"
            )
        if self.backend not in BACKENDS:
            raise ValueError(f"distributed.backend={self.backend!r} is unknown; choose one of: {', '.join(BACKENDS)}")
        if not self.timeout_s > 0:
            raise ValueError(f"distributed.timeout_s={self.timeout_s} is invalid; it must be > 0")


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0  # global rank, 0 .. world_size - 1
    local_rank: int = 0  # rank on this node: the GPU index
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


class RankFailed(RuntimeError):
    """Raised on the other ranks when rank 0 failed in work only it does (saving, sampling)."""


def env_info() -> DistInfo:
    """Rank and world size as torchrun sets them; a plain `python` launch is rank 0 of 1."""
    values = {}
    for key, default in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1)):
        raw = os.environ.get(key, str(default))
        try:
            values[key] = int(raw)
        except ValueError:
            raise ValueError(f"environment variable {key}={raw!r} is invalid; it must be an integer") from None
    info = DistInfo(values["RANK"], values["LOCAL_RANK"], values["WORLD_SIZE"])
    if info.world_size < 1 or not 0 <= info.rank < info.world_size:
        raise ValueError(f"RANK={info.rank} / WORLD_SIZE={info.world_size} is invalid; launch with torchrun")
    return info


def local_device(device: torch.device, info: DistInfo) -> torch.device:
    """The device this rank trains on: its own GPU (LOCAL_RANK) on CUDA, the CPU otherwise."""
    if not info.enabled or device.type == "cpu":
        return device
    if device.type == "cuda":
        if device.index is not None:
            raise ValueError(
                f"device={device} names one GPU, but torchrun gives each process its own; use device=auto or cuda"
            )
        if info.local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"LOCAL_RANK={info.local_rank} has no GPU (this node has {torch.cuda.device_count()}); "
                "start at most that many processes per node"
            )
        return torch.device("cuda", info.local_rank)
    raise ValueError(f"device={device.type} is not supported with torchrun; use cuda or cpu")


@contextlib.contextmanager
def process_group(cfg: DistributedConfig, device: torch.device) -> Iterator[tuple[DistInfo, torch.device]]:
    """Join torchrun's process group for the block (no-op in one process); yields (info, this rank's device).

    The group's timeout bounds every collective, so a rank that died or hung ends the job with an
    error on the others instead of leaving them blocked forever.
    """
    info = env_info()
    device = local_device(device, info)
    created = False
    if info.enabled and not dist.is_initialized():
        backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL and the object collectives use the current device
        dist.init_process_group(
            backend,
            timeout=timedelta(seconds=cfg.timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
        created = True
    quiet_unless_main(info)
    try:
        yield info, device
        if created:  # a clean exit: no rank tears down while a peer still has a collective in flight
            dist.barrier()
    finally:
        if created:
            dist.destroy_process_group()


def quiet_unless_main(info: DistInfo) -> None:
    """Only rank 0 logs progress; warnings and errors still come from every rank."""
    if not info.is_main:
        logging.getLogger().setLevel(logging.WARNING)


def hydra_argv(argv: list[str], info: DistInfo) -> list[str]:
    """Command line for Hydra on this rank: ranks other than 0 write nothing (no run directory of their
    own, no .hydra/, no log file); `train` then gives them rank 0's run directory.

    Each rank would otherwise make its own `outputs/DATE/TIME`, and their clocks need not agree.
    """
    if info.is_main:
        return argv
    ours = {"hydra.run.dir": ".", "hydra.output_subdir": "null", "hydra/job_logging": "stdout"}
    kept = [arg for arg in argv if arg.split("=", 1)[0].lstrip("+~") not in ours]
    return [*kept, *(f"{key}={value}" for key, value in ours.items())]


def broadcast_object(obj: T, info: DistInfo) -> T:
    """Rank 0's `obj` on every rank (pickled; only for small values that rank 0 computed)."""
    if not info.enabled:
        return obj
    box = [obj if info.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def check_same(value: Any, what: str, hint: str, info: DistInfo) -> None:
    """Raise ValueError on every rank unless all ranks hold the same `value`."""
    if not info.enabled:
        return
    values: list[Any] = [None] * info.world_size
    dist.all_gather_object(values, value)
    for rank, other in enumerate(values):
        if other != values[0]:
            raise ValueError(f"ranks disagree on {what}: rank 0 has {values[0]!r}, rank {rank} has {other!r}; {hint}")


def on_main(fn: Callable[[], T], info: DistInfo) -> T | None:
    """Run `fn` on rank 0 only; every rank then learns whether it failed, so none waits forever.

    Rank 0 re-raises its own exception; the others raise RankFailed with its message. Also a
    barrier: no rank runs ahead of, say, a checkpoint it may read next.
    """
    if not info.enabled:
        return fn()
    result, error = None, None
    if info.is_main:
        try:
            result = fn()
        except Exception as e:
            error = e
    message = broadcast_object(None if error is None else f"{type(error).__name__}: {error}", info)
    if error is not None:
        raise error
    if message is not None:
        raise RankFailed(f"rank 0 failed, so rank {info.rank} stops too: {message}")
    return result


def main_first(fn: Callable[[], T], info: DistInfo) -> T:
    """Run `fn` on rank 0, then on the others: for work with a shared result on disk (preparing the
    data cache), done once rather than by every rank at the same time."""
    result = on_main(fn, info)
    if info.is_main:
        return result
    return fn()


def wrap(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    build_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    cfg: DistributedConfig,
    info: DistInfo,
    device: torch.device,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """(training module, optimizer) for the strategy; the model and optimizer as they are in one process.

    DDP keeps the model's parameters, so `model` and `optimizer` stay valid (DDP also broadcasts
    rank 0's weights). FSDP2 shards every Block and then the root in place (the tied embedding and
    LM head stay one parameter of the root) and replaces the parameters with DTensors, so the
    optimizer is rebuilt and any state it held (from a resumed checkpoint) is sharded into it.
    """
    if not info.enabled:
        return model, optimizer
    if cfg.strategy == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids), optimizer
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    state = get_optimizer_state_dict(model, optimizer) if optimizer.state else None  # keyed by name, full
    mesh = init_device_mesh(device.type, (info.world_size,))
    for block in getattr(model, "blocks", []):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = build_optimizer(model)
    if state is not None:
        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
    return model, optimizer


def grad_sync(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """Context for one micro-step's backward: gradients are reduced across ranks only when `enabled`.

    Accumulation steps other than the last skip the all-reduce (DDP `no_sync`, FSDP2
    `set_requires_gradient_sync`); the last one reduces the accumulated sum once.
    """
    model = getattr(model, "_orig_mod", model)  # under torch.compile
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext() if enabled else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # an FSDP2 module
        model.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


def mean_over_ranks(value: Tensor, info: DistInfo) -> Tensor:
    """The mean of a tensor across ranks (a copy; the input is untouched)."""
    if not info.enabled:
        return value
    out = value.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / info.world_size


def max_over_ranks(value: float, info: DistInfo) -> float:
    """The largest of a number across ranks: a stop signal seen by any rank, or a budget's elapsed time,
    so every rank stops at the same step."""
    if not info.enabled:
        return value
    out = torch.tensor([value], dtype=torch.float64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return out.item()


def full_tensor(value: Tensor) -> Tensor:
    """A DTensor (FSDP2 parameters, gradients, norms) gathered into a plain tensor; others unchanged."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def sharded_mean_loss(
    mean_loss: Callable[[list], float], batches: list[tuple[Tensor, Tensor]], info: DistInfo, device: torch.device
) -> float:
    """`mean_loss` over all `batches` with each rank evaluating its own share, combined across ranks.

    Every rank runs the same number of forwards (FSDP2 all-gathers weights in each), so the last
    share is padded with batches whose losses are dropped.
    """
    if not info.enabled:
        return mean_loss(batches)
    per_rank = math.ceil(len(batches) / info.world_size)
    mine = batches[info.rank * per_rank : (info.rank + 1) * per_rank]
    total = mean_loss(mine) * len(mine) if mine else 0.0
    if len(mine) < per_rank:
        mean_loss(batches[: per_rank - len(mine)])
    summed = torch.tensor([total], dtype=torch.float64, device=device)
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    return summed.item() / len(batches)


def gather_for_save(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    build_model: Callable[[], nn.Module],
    build_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    info: DistInfo,
) -> tuple[nn.Module | None, torch.optim.Optimizer | None]:
    """A plain (model, optimizer) holding the whole training state on rank 0, for one-file checkpoints
    and sampling (optimizer=None: the model only).

    Without FSDP that is the pair itself (DDP's prefix is stripped on save). Under FSDP every rank
    must call this: the shards are gathered into rank 0's CPU memory, into a fresh plain model and
    optimizer; other ranks get (None, None).
    """
    if not hasattr(model, "set_requires_gradient_sync"):
        return model, optimizer
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optim_state = get_state_dict(model, optimizer or [], options=full)
    if not info.is_main:
        return None, None
    plain = build_model()
    plain_optimizer = build_optimizer(plain) if optimizer is not None else None
    set_state_dict(plain, plain_optimizer or [], model_state_dict=model_state, optim_state_dict=optim_state)
    return plain, plain_optimizer
