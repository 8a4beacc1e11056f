"""A run's checkpoint directory: naming, rotation, `resume=auto`, and refusing to clobber a run."""

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.checkpoint import atomic_write_bytes, load_checkpoint, save_checkpoint

log = logging.getLogger(__name__)


class CheckpointDir:
    """`step_0000500.safetensors`, ... (the newest `keep_last`) and `best.safetensors`."""

    def __init__(self, directory: Path, keep_last: int = 2) -> None:
        self.directory = Path(directory)
        self.keep_last = keep_last

    def step_checkpoints(self) -> list[Path]:
        """Step checkpoints, oldest first."""
        return sorted(self.directory.glob("step_*.safetensors"))

    def resume_path(self, resume: str | None, overwrite: bool) -> Path | None:
        """Which checkpoint to resume from, or None for a fresh run (refused over another run)."""
        existing = self.step_checkpoints()
        if resume is None:
            if existing and not overwrite:
                raise ValueError(
                    f"{self.directory} already holds another run's checkpoints; "
                    "pass resume=auto to continue it or overwrite=true to start over"
                )
            return None
        if resume != "auto":
            return Path(resume)
        for path in reversed(existing):  # newest valid one
            try:
                load_checkpoint(path)
                return path
            except ValueError as e:
                log.warning("skipping unreadable checkpoint %s: %s", path, e)
        log.info("resume=auto: no checkpoint in %s, starting fresh", self.directory)
        return None

    def save(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        meta: dict[str, Any],
        step: int,
        is_best: bool,
    ) -> Path:
        path = save_checkpoint(self.directory / f"step_{step:07d}.safetensors", model, optimizer, meta)
        if is_best:
            atomic_write_bytes(self.directory / "best.safetensors", path.read_bytes())
        for old in self.step_checkpoints()[: -self.keep_last]:
            old.unlink()
        return path
