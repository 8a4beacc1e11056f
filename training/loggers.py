"""Metrics sinks: a local JSONL file always, and Weights & Biases unless turned off."""

import json
import netrc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WANDB_MODES = ("auto", "online", "offline", "disabled")


@dataclass
class LoggerConfig:
    wandb: bool = True
    mode: str = "auto"  # auto: online when credentials are configured, else offline (never a prompt)
    project: str = "attnlab"
    entity: str | None = None
    group: str | None = None  # runs of one sweep share a group
    name: str | None = None
    tags: list[str] | None = None

    def validate(self) -> None:
        if self.mode not in WANDB_MODES:
            raise ValueError(f"logger.mode={self.mode!r} is unknown; choose one of: {', '.join(WANDB_MODES)}")


def wandb_has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def resolve_wandb_mode(mode: str) -> str:
    if mode != "auto":
        return mode
    return os.environ.get("WANDB_MODE") or ("online" if wandb_has_credentials() else "offline")


class MetricsLogger:
    """Writes each record as one JSON line to `metrics.jsonl` and mirrors it to wandb."""

    def __init__(self, out_dir: Path, cfg: LoggerConfig, config: dict[str, Any], run_id: str | None = None):
        self.path = Path(out_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 (open for the run's lifetime)
        self.run = None
        if cfg.wandb:
            import wandb

            self.run = wandb.init(
                project=cfg.project,
                entity=cfg.entity,
                group=cfg.group,
                name=cfg.name,
                tags=cfg.tags,
                config=config,
                dir=str(out_dir),
                mode=resolve_wandb_mode(cfg.mode),
                id=run_id,
                resume="allow" if run_id else None,
            )

    @property
    def run_id(self) -> str | None:
        return self.run.id if self.run is not None else None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.run is not None:
            self.run.log(metrics, step=step)

    def close(self) -> None:
        self._file.close()
        if self.run is not None:
            self.run.finish()
