"""What a run records: `metrics.jsonl` always and Weights & Biases unless turned off, `run_info.json`
when training starts and `summary.json` when it ends, and the progress bar and throughput (`Meter`).

A run directory with run_info.json but no summary.json crashed or is still running; the ablation
report (analysis/sweep.py) lists such runs instead of dropping them.
"""

import json
import logging
import netrc
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from model import GPT
from training.checkpoint import atomic_write_bytes
from training.run_files import METRICS, RUN_INFO, SUMMARY
from training.runtime import mfu, peak_flops

if TYPE_CHECKING:
    from training.trainer import StepResult, Trainer

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


def write_run_info(out_dir: Path, model: GPT, config: dict[str, Any], tokens_per_step: int) -> None:
    """Shape, size and cost of the run, with its resolved config; clears an older summary."""
    c = model.config
    record = {"n_head": c.n_head, "d_k": c.head_dim, "d_model": c.d_model, "n_layer": c.n_layer}
    record |= {"block_size": c.block_size, "params": model.num_params()}
    record |= {"params_non_embedding": model.num_params(exclude_embeddings=True)}
    record |= {"flops_per_token": model.flops_per_token(), "tokens_per_step": tokens_per_step}
    record |= {"max_steps": config["max_steps"], "seed": config["seed"], "fairness": config["fairness"]["mode"]}
    (Path(out_dir) / SUMMARY).unlink(missing_ok=True)  # a resumed run is unfinished until it ends again
    write_json(Path(out_dir) / RUN_INFO, record | {"config": config})


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


class Meter:
    """Logging around the loop: the progress bar, metrics.jsonl/wandb records, tokens/s and MFU."""

    def __init__(self, trainer: "Trainer", logger: MetricsLogger | None) -> None:
        cfg = trainer.cfg
        self.logger, self.log_interval = logger, cfg.log_interval
        self.tokens_per_step, self.flops_per_token = trainer.tokens_per_step, trainer.model.flops_per_token()
        self.peak = peak_flops(trainer.device, trainer.precision) * trainer.dist.world_size
        self.throughputs: list[float] = []
        self.train_seconds = 0.0
        self.saved_step = self.step = trainer.state.step
        self.by_time = bool(cfg.budget_s)  # under a budget the bar counts seconds: steps are not known
        self.bar = tqdm(
            initial=int(trainer.state.elapsed_s) if self.by_time else self.step,
            total=int(cfg.budget_s) if self.by_time else cfg.max_steps,
            unit="s" if self.by_time else "step",
            # under a budget the rate would read "1.00s/s": show seconds done of the budget instead
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n}/{total} s [{elapsed}<{remaining}{postfix}]"
            if self.by_time
            else None,
            disable=not cfg.progress or not trainer.dist.is_main,
            dynamic_ncols=True,
            desc="train",
        )
        self.interval_start, self.interval_step = time.perf_counter(), self.step
        self.val_loss: float | None = None
        self.postfix: dict[str, str | int] = {}

    def step_done(self, result: "StepResult", elapsed_s: float, last: bool) -> None:
        self.step = step = self.step + 1
        # capped at the budget: tqdm drops a total that n passes (a first eval or the one step past it)
        self.bar.update(min(int(elapsed_s), self.bar.total) - self.bar.n if self.by_time else 1)
        if step % self.log_interval and not last:
            return
        now = time.perf_counter()
        seconds, self.interval_start = now - self.interval_start, now
        tok_s = self.tokens_per_step * (step - self.interval_step) / seconds
        self.interval_step = step
        self.throughputs.append(tok_s)
        self.train_seconds += seconds
        record = {"train/loss": result.loss, "train/grad_norm": result.grad_norm, "lr": result.lr}
        record |= {"throughput/tokens_per_s": tok_s, "throughput/mfu": mfu(self.flops_per_token, tok_s, self.peak)}
        if self.logger:
            self.logger.log(record | {"time/elapsed_s": elapsed_s}, step)
        self.postfix = {"step": step, "loss": f"{result.loss:.3f}", "lr": f"{result.lr:.1e}", "tok_s": f"{tok_s:,.0f}"}
        self.show_postfix()

    def show_postfix(self) -> None:
        if self.val_loss is not None:
            self.postfix["val"] = f"{self.val_loss:.3f}"
        self.bar.set_postfix(self.postfix, refresh=False)

    def eval_done(self, metrics: dict[str, float], elapsed_s: float) -> None:
        self.val_loss = metrics["val/loss"]
        self.show_postfix()  # now, not at the next logged step: the bar never shows a stale evaluation
        if self.logger:
            self.logger.log({**metrics, "time/elapsed_s": elapsed_s}, self.step)
        self.interval_start, self.interval_step = time.perf_counter(), self.step  # eval time is not throughput

    def finish(self, trainer: "Trainer") -> None:
        """summary.json: final metrics and speed of a finished run (tokens/s: the median over log intervals)."""
        if not trainer.dist.is_main:
            return
        state = trainer.state
        record = {"status": "completed", "step": state.step, "best_val_loss": state.best_val_loss}
        record |= {"tokens_per_s": statistics.median(self.throughputs) if self.throughputs else None}
        record |= {"train_seconds": self.train_seconds}
        record |= {"train_flops": self.flops_per_token * self.tokens_per_step * state.step, **trainer.metrics}
        write_json(Path(trainer.cfg.out_dir) / SUMMARY, record)

    def __enter__(self) -> "Meter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()
        if self.logger:
            self.logger.close()
