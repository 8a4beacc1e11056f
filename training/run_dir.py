"""A run's directory: checkpoint naming and rotation, `resume=auto`, refusing to clobber a run,
and trimming `metrics.jsonl` back to the step a resumed run continues from."""

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.checkpoint import atomic_write_bytes, load_checkpoint, save_checkpoint

log = logging.getLogger(__name__)

STEP_NAME = re.compile(r"step_(\d+)\.safetensors")


def checkpoint_step(path: Path) -> int | None:
    match = STEP_NAME.fullmatch(path.name)
    return int(match.group(1)) if match else None


class CheckpointDir:
    """`step_0000500.safetensors`, ... (the newest `keep_last`) and `best.safetensors`."""

    def __init__(self, directory: Path, keep_last: int = 2) -> None:
        self.directory = Path(directory)
        self.keep_last = keep_last

    def step_checkpoints(self) -> list[Path]:
        """Step checkpoints, oldest first."""
        return sorted(self.directory.glob("step_*.safetensors"), key=lambda p: checkpoint_step(p) or -1)

    def latest(self) -> Path | None:
        existing = self.step_checkpoints()
        return existing[-1] if existing else None

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
            path = Path(resume).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"resume={resume!r} is not a file; give resume=auto or a checkpoint path")
            self._refuse_clash(path, existing, overwrite)
            return path
        errors = []
        for path in reversed(existing):  # newest valid one
            try:
                load_checkpoint(path)
                return path
            except ValueError as e:
                log.warning("skipping unreadable checkpoint: %s", e)
                errors.append(str(e))
        if errors:
            raise ValueError(
                f"resume=auto found no valid checkpoint in {self.directory}: {errors[0]}; "
                "pass overwrite=true (and no resume) to start over"
            )
        log.info("resume=auto: no checkpoint in %s, starting fresh", self.directory)
        return None

    def _refuse_clash(self, path: Path, existing: list[Path], overwrite: bool) -> None:
        """Resuming an older or a foreign checkpoint here would interleave two histories."""
        step = checkpoint_step(path) if self._holds(path) else -1
        clash = [p.name for p in existing if (checkpoint_step(p) or -1) > step]
        if clash and not overwrite:
            raise ValueError(
                f"{self.directory} holds checkpoints that {path.name} does not continue ({', '.join(clash)}); "
                "pass overwrite=true to discard them, or resume=auto for the newest"
            )

    def _holds(self, path: Path) -> bool:
        return path.resolve().parent == self.directory.resolve()

    def start(self, resume_from: Path | None, step: int) -> None:
        """Before the first step: drop temp files of killed saves and any checkpoint this run replaces.

        Only reached once `resume_path` allowed it: the directory was empty, or overwrite=true.
        """
        for tmp in self.directory.glob(".*.tmp-*"):
            log.info("removing %s, left by an interrupted save", tmp)
            tmp.unlink(missing_ok=True)
        keep_up_to = step if resume_from is not None and self._holds(resume_from) else -1
        for path in self.step_checkpoints():
            if (checkpoint_step(path) or -1) > keep_up_to:
                log.warning("overwrite=true: removing %s", path)
                path.unlink()
        if keep_up_to < 0:
            (self.directory / "best.safetensors").unlink(missing_ok=True)

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
            link_or_copy(path, self.directory / "best.safetensors")
        for old in self.step_checkpoints()[: -self.keep_last]:
            old.unlink()
        return path


def link_or_copy(src: Path, dst: Path) -> None:
    """Atomically make `dst` a hard link to `src` (no extra disk space), or a copy where links fail."""
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
        os.replace(tmp, dst)
    except OSError:
        tmp.unlink(missing_ok=True)
        atomic_write_bytes(dst, src.read_bytes())


def trim_metrics(path: Path, step: int) -> None:
    """Keep only records up to `step` (and no torn last line), so a resumed run logs each step once."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by a kill
        if isinstance(record, dict) and record.get("step", 0) <= step:
            kept.append(line + "\n")
    atomic_write_bytes(path, "".join(kept).encode())
