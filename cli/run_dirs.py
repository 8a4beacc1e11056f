"""Where `python train.py` puts a run it names itself: `outputs/DATE/TIME`, the next free name when a run of
the same second holds it, and `outputs/latest` pointing at the newest."""

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from rundir.files import RunDirInUse
from training.config import TrainConfig

OUTPUTS = Path("outputs")
log = logging.getLogger(__name__)


def new_run_dir(root: Path = OUTPUTS) -> Path:
    """`outputs/DATE/TIME`, not yet created; `-2`, `-3`, ... when a run of the same second has it."""
    base = root / time.strftime("%Y-%m-%d") / time.strftime("%H-%M-%S")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def newest_run(root: Path) -> Path | None:
    """The most recently written run under `root` that holds a step checkpoint (for error hints)."""
    runs = [p.parent.parent for p in Path(root).glob("**/checkpoints/step_*.safetensors")]
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None


def point_latest(root: Path, run: Path) -> None:
    """`root/latest` -> `run`, replaced atomically (a symlink, relative, so the tree can move)."""
    link = Path(root) / "latest"
    if link.exists() and not link.is_symlink():  # someone's own file or folder named latest: not ours to replace
        log.warning(
            "%s is not the link train.py keeps (a %s of its own): left as it is",
            link,
            "folder" if link.is_dir() else "file",
        )
        return
    tmp = link.with_name(f".latest.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(os.path.relpath(run.resolve(), link.parent.resolve()), tmp)
    os.replace(tmp, link)


def train_in_new_dir(cfg: TrainConfig, train: Callable[[TrainConfig], dict], root: Path = OUTPUTS) -> dict:
    """`train(cfg)` in the new run directory cfg.out_dir or, where a run started in the same second took that
    name first (`... &` in a loop: its lock is held), in the next free one."""
    while True:
        try:
            return train(cfg)
        except RunDirInUse:
            cfg.out_dir = str(new_run_dir(root))
