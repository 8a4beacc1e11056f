"""What a run records: `metrics.jsonl` always and Weights & Biases unless turned off, `run_info.json`
when training starts and `summary.json` when it ends, the resolved `config.yaml` and `train.log`.

A run directory with run_info.json but no summary.json crashed or is still running; the ablation
report (analysis/sweep.py) lists such runs instead of dropping them. The tools that read these files
(the report, run plots, the lab) import their names from here, without importing torch.
"""

import json
import logging
import netrc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rundir.files import METRICS, RUN_INFO, SUMMARY, atomic_write_bytes

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


def resolve_wandb_mode(mode: str) -> str:
    """auto: online where credentials are configured (WANDB_API_KEY or ~/.netrc), else offline."""
    if mode != "auto":
        return mode
    try:
        netrc_login = netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        netrc_login = False
    return os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") or netrc_login else "offline")


class MetricsLogger:
    """Writes each record as one JSON line to `metrics.jsonl` and mirrors it to wandb."""

    def __init__(self, out_dir: Path, cfg: LoggerConfig, config: dict[str, Any], run_id: str | None = None):
        self.path = Path(out_dir) / METRICS
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

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.run is not None:
            self.run.log(metrics, step=step)

    def close(self) -> None:
        self._file.close()
        if self.run is not None:
            self.run.finish()


def write_json(path: Path, record: dict[str, Any]) -> None:
    atomic_write_bytes(path, (json.dumps(record, indent=2) + "\n").encode())


def write_run_info(out_dir: Path, shape: dict[str, Any], config: dict[str, Any]) -> None:
    """Shape, size and cost of the run (`shape`: the model's sizes, params, FLOPs and tokens per step), with
    its resolved config; clears an older summary. A study's settings (fairness) are in the config."""
    record = shape | {"max_steps": config["max_steps"], "seed": config["seed"]}
    record |= {"fairness": config.get("fairness", {}).get("mode", "fixed_d_model")}
    (Path(out_dir) / SUMMARY).unlink(missing_ok=True)  # a resumed run is unfinished until it ends again
    write_json(Path(out_dir) / RUN_INFO, record | {"config": config})


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A run's config as dotted keys: {"model": {"n_head": 4}} -> {"model.n_head": 4}; lists become tuples
    so values can be compared (the report groups runs by them, --help shows them)."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
    return flat


def write_config(path: Path, config: dict[str, Any]) -> None:
    """The run's whole resolved config, as YAML a person reads (the terminal shows only a header)."""
    from omegaconf import OmegaConf

    atomic_write_bytes(path, OmegaConf.to_yaml(OmegaConf.create(config)).encode())


class RunLogHandler(logging.FileHandler):
    """The handler that writes a run's train.log."""


def log_to_file(path: Path) -> None:
    """Send every log record of this process to the run's `train.log` too, and to no earlier run's: a
    sweep runs its jobs one after another in one process."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, RunLogHandler)]:
        if Path(old.baseFilename) == path.resolve():
            return
        root.removeHandler(old)
        old.close()
    handler = RunLogHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    root.addHandler(handler)
