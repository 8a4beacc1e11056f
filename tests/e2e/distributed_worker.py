"""A 2-process worker for tests/test_distributed.py, in its own small module so that each spawned
process imports torch and training.distributed only (not the trainer and the data stack)."""

import json
import os
import pickle
import socket
import time
from pathlib import Path

import torch
from torch.distributed import distributed_c10d

from training import distributed
from training.distributed import DistributedConfig, RankFailed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NoUnpickling:
    """Stands in for pickle's unpickler in a worker: a collective that sends Python objects fails loudly."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("a collective unpickled what another rank sent")


def json_worker(rank: int, world_size: int, port: int, out: str) -> None:
    """The object collectives the trainer uses, with every way torch.distributed unpickles taken away."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    os.environ["LOCAL_RANK"] = str(rank)
    pickle.Unpickler = pickle.loads = distributed_c10d._unpickler = NoUnpickling
    result = {}
    with distributed.process_group(DistributedConfig(timeout_s=20), torch.device("cpu")) as (info, _):
        result["out_dir"] = distributed.broadcast_object(f"outputs/run-{rank} ünïcode", info)
        result["max_steps"] = distributed.broadcast_object(100 + rank, info)
        result["saved"] = distributed.on_main(lambda: "checkpoints/step_0000004.safetensors", info)
        distributed.check_same("same path", "the checkpoint", "hint", info)
        try:
            distributed.check_same(f"path on rank {rank}", "the checkpoint to resume", "use a shared disk", info)
        except ValueError as e:
            result["differ"] = str(e)
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))


def failing_worker(rank: int, world_size: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    os.environ["LOCAL_RANK"] = str(rank)
    result = {}
    with distributed.process_group(DistributedConfig(timeout_s=2), torch.device("cpu")) as (info, _):
        # A stop signal seen by rank 1 only still stops both, at the same step.
        result["stop"] = distributed.max_over_ranks([15 if info.rank == 1 else 0], info)[0]

        def save() -> None:
            raise OSError("no space left to write the checkpoint")

        try:
            distributed.on_main(save, info)
        except (OSError, RankFailed) as e:
            result["on_main"] = f"{type(e).__name__}: {e}"
        # Rank 1 now hangs (it never joins the all-reduce); rank 0 must give up after the timeout.
        if info.rank == 1:
            time.sleep(6)
        else:
            start = time.perf_counter()
            try:
                distributed.mean_over_ranks(torch.ones(1), info)
                result["timeout"] = "returned"
            except RuntimeError as e:
                result["timeout"] = f"raised after {time.perf_counter() - start:.1f}s: {str(e).splitlines()[0]}"
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
        raise SystemExit(0)  # leave as a failed run does: the group is broken, so no closing barrier
