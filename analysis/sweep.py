"""Read a sweep directory (Hydra multirun) into runs, and aggregate them over seeds.

Each run directory holds `run_info.json` (written when training starts), `summary.json` (when it
ends) and `metrics.jsonl`; Hydra adds `.hydra/` and `train.log`. A run that has no summary is
reported as crashed (or still running), one that never wrote run_info as failed at start-up, so
no run silently drops out of a table.
"""

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from training.loggers import RUN_INFO, SUMMARY

COMPLETED, CRASHED, FAILED_AT_START = "completed", "crashed or unfinished", "failed before training"


@dataclass
class Run:
    path: Path
    status: str
    n_head: int | None
    d_k: int | None
    seed: int | None
    info: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    val_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, val/loss)
    last_step: int | None = None
    error: str | None = None


@dataclass
class Row:
    """One (n_head, d_k) configuration over its completed seeds."""

    n_head: int
    d_k: int
    params: int
    flops_per_token: int
    steps: list[int]
    tokens_per_s: list[float]
    val_loss: list[float]
    val_bpb: list[float]
    runs: list[Run]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a crash
                break
    return records


def last_error(log_path: Path) -> str | None:
    """The last ERROR message in Hydra's job log; for a logged traceback, its final line."""
    if not log_path.is_file():
        return None
    lines = log_path.read_text(errors="replace").splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if "][ERROR] - " in lines[i]:
            tail = [line for line in lines[i + 1 :] if line.strip() and not line.startswith("[")]
            return tail[-1].strip() if tail else lines[i].split("][ERROR] - ", 1)[1]
    return None


def hydra_job_values(run_dir: Path) -> dict[str, Any]:
    """n_head, d_k and seed of a Hydra job from its saved config, for runs that never started."""
    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        return {}
    cfg = OmegaConf.load(path)
    return {
        "n_head": OmegaConf.select(cfg, "model.n_head"),
        "d_k": OmegaConf.select(cfg, "model.d_k"),
        "seed": OmegaConf.select(cfg, "seed"),
    }


def read_run(run_dir: Path) -> Run:
    info_path, summary_path = run_dir / RUN_INFO, run_dir / SUMMARY
    info = json.loads(info_path.read_text()) if info_path.is_file() else None
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    records = read_jsonl(run_dir / "metrics.jsonl")
    curve = [(r["step"], r["val/loss"]) for r in records if "val/loss" in r]
    values = info if info is not None else hydra_job_values(run_dir)
    if summary is not None and summary.get("status") == COMPLETED:
        status = COMPLETED
    elif info is not None:
        status = CRASHED
    else:
        status = FAILED_AT_START
    return Run(
        path=run_dir,
        status=status,
        n_head=values.get("n_head"),
        d_k=values.get("d_k"),
        seed=values.get("seed"),
        info=info,
        summary=summary,
        val_curve=curve,
        last_step=records[-1]["step"] if records else None,
        error=None if status == COMPLETED else last_error(run_dir / "train.log"),
    )


def find_runs(sweep_dir: str | Path) -> list[Run]:
    """Every run under `sweep_dir`: directories with run_info.json or a Hydra job's .hydra/."""
    root = Path(sweep_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"sweep directory {str(root)!r} does not exist")
    dirs = {p.parent for p in root.rglob(RUN_INFO)} | {p.parent.parent for p in root.rglob(".hydra/config.yaml")}
    if not dirs:
        raise FileNotFoundError(f"no runs under {str(root)!r} (no {RUN_INFO} and no .hydra/config.yaml)")
    return [read_run(d) for d in sorted(dirs)]


def aggregate(runs: list[Run]) -> list[Row]:
    """Completed runs grouped by (n_head, d_k), sorted; a group must differ only in its seeds."""
    groups: dict[tuple[int, int], list[Run]] = {}
    for run in runs:
        if run.status == COMPLETED:
            groups.setdefault((run.n_head, run.d_k), []).append(run)
    rows = []
    for (n_head, d_k), members in sorted(groups.items()):
        sizes = {(r.info["params"], r.info["flops_per_token"]) for r in members}
        if len(sizes) > 1:
            raise ValueError(
                f"runs with n_head={n_head}, d_k={d_k} differ in size {sorted(sizes)}; "
                "a sweep report compares configurations that differ only in n_head, d_k and seed"
            )
        ((params, flops),) = sizes
        rows.append(
            Row(
                n_head=n_head,
                d_k=d_k,
                params=params,
                flops_per_token=flops,
                steps=[r.summary["step"] for r in members],
                tokens_per_s=[r.summary["tokens_per_s"] for r in members if r.summary.get("tokens_per_s")],
                val_loss=[r.summary["val/loss"] for r in members],
                val_bpb=[r.summary["val/bpb"] for r in members],
                runs=members,
            )
        )
    return rows


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single value)."""
    if not values:
        return math.nan, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None
