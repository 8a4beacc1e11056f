"""Multi-process training under `torchrun`: process group, rank info, DDP / FSDP2 wrapping, and the
few collectives the trainer needs. Launched by plain `python`, every helper is a no-op, so a
single-process run is exactly what it was. NCCL on CUDA, gloo on CPU; which sequences each rank
trains on is data/batches.py."""

import contextlib
import gc
import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from data.text_file import error_text

STRATEGIES = ("ddp", "fsdp")
JOIN_S = 30.0  # how long the processes wait for each other to join: torchrun starts them together
BACKENDS = ("auto", "nccl", "gloo")
T = TypeVar("T")


@dataclass
class DistributedConfig:
    # fsdp's user: a model whose weights and optimizer state outgrow one GPU's memory (docs/guide.md's torchrun line).
    strategy: str = "ddp"  # ddp | fsdp (FSDP2 fully_shard); used only when torchrun starts > 1 process
    backend: str = "auto"  # auto (nccl on CUDA, gloo on CPU) | nccl | gloo
    timeout_s: float = 600.0  # a collective waiting this long (a rank died or hung) ends the job

    def validate(self) -> None:
        for name, allowed in (("strategy", STRATEGIES), ("backend", BACKENDS)):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"distributed.{name}={getattr(self, name)!r} is unknown; choose one of: {', '.join(allowed)}"
                )
        if not 0 < self.timeout_s < math.inf:  # NaN fails both comparisons
            raise ValueError(f"distributed.timeout_s={self.timeout_s} is invalid; it must be a finite number > 0")


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
    """Raised on the other ranks when rank 0 failed in work only it does (saving, sampling), or on every rank
    that finds another gone (`lost_peer`)."""

    explains_a_stop = True  # torchrun's SIGTERM while it unwinds prints it (cli.errors.stop_outside_the_loop)


# What gloo and NCCL say when another rank's process died mid-collective (the OOM killer, a kill -9)
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "NCCL communicator was aborted")


def lost_peer(e: BaseException, info: DistInfo) -> RankFailed | None:
    """The one-line error for a collective that failed because another process of the run died, else None (the
    gloo error came as a traceback, twice, and without what to do)."""
    if info.world_size == 1 or not isinstance(e, RuntimeError) or isinstance(e, RankFailed):
        return None
    signs = [sign for sign in PEER_LOST if sign in str(e)]
    if not signs:
        return None
    return RankFailed(
        f"rank {info.rank}: another process of this run stopped mid-step ({signs[0]}); every step up to the newest "
        "checkpoint is kept: continue with resume=auto"
    )


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
    """Join torchrun's process group for the block; yields (info, this rank's device). Its timeout bounds
    every collective, so a rank that died or hung ends the job instead of blocking the others forever."""
    info = env_info()
    device = local_device(device, info)
    created = False
    if info.enabled and not dist.is_initialized():
        backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        if backend == "nccl" and device.type != "cuda":  # it ended in torch's 'NCCL built in' traceback per rank
            raise ValueError(
                f"distributed.backend=nccl needs CUDA, and this run is on {device.type}: use distributed.backend=gloo "
                "(or auto)"
            )
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL and the object collectives use the current device
        store = join(info, min(JOIN_S, cfg.timeout_s))
        store.set_timeout(timedelta(seconds=cfg.timeout_s))  # what torch's env:// rendezvous does after joining
        dist.init_process_group(
            backend,
            store=store,
            rank=info.rank,
            world_size=info.world_size,
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
            # Free what the block left (FSDP2's async collectives hold tensors) while the group and the
            # interpreter are whole: freed at exit instead, gloo's work takes the GIL mid-teardown and aborts.
            gc.collect()
            dist.destroy_process_group()


def join(info: DistInfo, wait_s: float) -> dist.Store:
    """The store every process of the run meets at (MASTER_ADDR:MASTER_PORT, as torchrun sets them), waited for
    at most `wait_s`. RANK and WORLD_SIZE left in a plain shell's environment made a lone process wait the whole
    collective timeout (600 s) and end in a DistStoreError traceback; it is one line naming the variables."""
    where = f"RANK={info.rank} and WORLD_SIZE={info.world_size} are set"
    alone = "or unset RANK, WORLD_SIZE and LOCAL_RANK to train in one process"
    launch = f"start every process with torchrun (torchrun --nproc_per_node={info.world_size} train.py ...), {alone}"
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise ValueError(f"{where}, but {' and '.join(missing)} {verb} not (torchrun sets all of them): {launch}")
    host, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    address = f"{host}:{port}"
    try:
        if not os.environ.get("TORCHELASTIC_USE_AGENT_STORE") and info.rank != 0:
            reachable(host, int(port), wait_s)  # torch's own wait prints C++ stack frames at each retry
        store, _, _ = next(dist.rendezvous("env://", info.rank, info.world_size, timeout=timedelta(seconds=wait_s)))
    except (dist.DistError, RuntimeError, ValueError, OSError) as e:  # DistStoreError, DistNetworkError; a bad port
        others = info.world_size - 1
        raise ValueError(
            f"{where}, but this process did not meet the other {others} of the run at MASTER_ADDR:MASTER_PORT="
            f"{address} within {wait_s:g} s ({error_text(e)}): {launch}"
        ) from None
    return store


def reachable(host: str, port: int, wait_s: float) -> None:
    """Return once something listens at host:port, or raise TimeoutError after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic())).close()
            return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"nothing listens at {host}:{port}") from e
            time.sleep(0.2)


def quiet_unless_main(info: DistInfo) -> None:
    """Only rank 0 logs progress; warnings and errors come from every rank."""
    if not info.is_main:
        logging.getLogger().setLevel(logging.WARNING)


def all_gather_json(value: Any, info: DistInfo) -> list[Any]:
    """Every rank's `value` (anything JSON holds), in rank order. Sent as JSON bytes in plain tensors:
    torch's object collectives unpickle what another process sent, and this project loads no pickle."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    data = torch.tensor(list(json.dumps(value).encode()), dtype=torch.uint8, device=device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(info.world_size)]
    dist.all_gather(sizes, torch.tensor([len(data)], device=device))
    longest = max(int(size) for size in sizes)
    parts = [torch.zeros(longest, dtype=torch.uint8, device=device) for _ in sizes]
    dist.all_gather(parts, nn.functional.pad(data, (0, longest - len(data))))
    return [json.loads(bytes(part[: int(size)].tolist())) for part, size in zip(parts, sizes, strict=True)]


def broadcast_object(obj: T, info: DistInfo) -> T:
    """Rank 0's `obj` (a small JSON value that rank 0 computed) on every rank."""
    return all_gather_json(obj if info.is_main else None, info)[0] if info.enabled else obj


def check_same(value: Any, what: str, hint: str, info: DistInfo) -> None:
    """Raise ValueError on every rank unless all ranks hold the same `value`."""
    if not info.enabled:
        return
    values = all_gather_json(value, info)
    for rank, other in enumerate(values):
        if other != values[0]:
            raise ValueError(f"ranks disagree on {what}: rank 0 has {values[0]!r}, rank {rank} has {other!r}; {hint}")


def on_main(fn: Callable[[], T], info: DistInfo) -> T | None:
    """Run `fn` on rank 0 only; every rank then learns whether it failed (the others raise RankFailed
    with its message), so none waits forever. Also a barrier: no rank runs ahead of a file it may read."""
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
    """Run `fn` on rank 0, then on the others: work with a shared result on disk (the data cache) done once."""
    result = on_main(fn, info)
    return result if info.is_main else fn()


def wrap(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    build_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    cfg: DistributedConfig,
    info: DistInfo,
    device: torch.device,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """(training module, optimizer) for the strategy. DDP keeps the parameters (and broadcasts rank 0's),
    so both stay valid. FSDP2 shards every Block, then the root (a tied embedding and head stay one
    parameter), into DTensors: the optimizer is rebuilt and any resumed state sharded into it."""
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


def reshard(model: nn.Module) -> None:
    """Under FSDP2, every module's parameters back to their shards (the root's stay gathered after a
    forward without backward, an evaluation's); without FSDP nothing."""
    for module in model.modules():
        if hasattr(module, "set_requires_gradient_sync") and hasattr(module, "reshard"):  # an FSDPModule
            module.reshard()


def grad_sync(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """Context for one micro-step's backward: gradients are reduced across ranks only when `enabled` (the
    last accumulation step; DDP `no_sync`, FSDP2 `set_requires_gradient_sync` for the others)."""
    model = getattr(model, "_orig_mod", model)  # under torch.compile
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext() if enabled else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # an FSDP2 module
        model.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


def mean_over_ranks(value: Tensor, info: DistInfo) -> Tensor:
    if not info.enabled:
        return value
    out = value.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / info.world_size


def max_over_ranks(values: list[float], info: DistInfo) -> list[float]:
    """Each number's largest value across ranks, in one all-reduce."""
    if not info.enabled:
        return values
    out = torch.tensor(values, dtype=torch.float64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return out.tolist()


def full_tensor(value: Tensor) -> Tensor:
    """A DTensor (FSDP2 parameters, gradients, norms) gathered into a plain tensor; others unchanged."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def sharded_mean_loss(
    mean_loss: Callable[[list], float], batches: list[tuple[Tensor, Tensor]], info: DistInfo, device: torch.device
) -> float:
    """`mean_loss` over `batches`, each rank evaluating its share. Every rank runs as many forwards (FSDP2
    all-gathers weights in each), so the last share is padded with batches whose losses are dropped."""
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
    """A plain (model, optimizer) with the whole state on rank 0, for one-file checkpoints and sampling.
    Without FSDP, the pair itself; under FSDP (every rank calls it) the shards gathered into a fresh
    model and optimizer in rank 0's CPU memory, and (None, None) on the others."""
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
