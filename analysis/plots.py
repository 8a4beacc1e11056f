"""PNG plots of a sweep: validation-loss curves per cell, final loss per cell with its 95% interval,
the paired differences from the reference cell, and a heatmap of final loss when two keys are swept.
Each title says how its values were scored (full val or the loop's val batches) and is wrapped to fit."""

import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt

from analysis.report import compared_metric
from analysis.stats import CONFIDENCE, Interval, t_interval
from analysis.sweep import CRASHED, INTERRUPTED, RUNNING, Cell, Run, sort_key

FULL_VAL = "full val: each run's best checkpoint on every held-out token"
LOOP_VAL = "loop val: each run's eval_batches val batches"


def scoring(cells: list[Cell]) -> str:
    """How the cells' final values were scored: on every held-out token where the report took full-val
    scores (`Run.full_val`, which `Run.final` then reads), else on the training loop's val batches."""
    return FULL_VAL if any(run.full_val for cell in cells for run in cell.runs) else LOOP_VAL


def set_title(ax, text: str, fontsize: float = 10) -> None:
    """The title wrapped to the figure's width: a line wider than the figure is cut off in the PNG."""
    width_pt = ax.figure.get_figwidth() * 72
    ax.set_title(textwrap.fill(text, width=int(width_pt / (0.6 * fontsize))), fontsize=fontsize)


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_val_curves(cells: list[Cell], runs: list[Run], path: Path) -> Path:
    """One colour per cell, one line per seed; crashed runs' partial curves dashed red. Every line has
    markers: a run killed after its first evaluation has one point, which a bare line does not draw."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.cm.viridis([i / max(1, len(cells) - 1) for i in range(len(cells))])
    for color, cell in zip(colors, cells, strict=True):
        for i, run in enumerate(cell.runs):
            steps, losses = zip(*run.val_curve, strict=True) if run.val_curve else ((), ())
            ax.plot(steps, losses, color=color, lw=1.2, alpha=0.9, label=cell.label() if i == 0 else None, marker=".")
    for run in runs:
        if run.status in (CRASHED, INTERRUPTED, RUNNING) and run.val_curve:
            steps, losses = zip(*run.val_curve, strict=True)
            how = {INTERRUPTED: "interrupted", RUNNING: "running"}.get(run.status, "crashed")
            ax.plot(steps, losses, color="red", ls="--", lw=1, marker=".", label=f"{how}: {run.path.name}")
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats/token)")
    # The curves are the loop's own evaluations whatever scored the final values (full val scores one checkpoint).
    set_title(ax, f"Validation loss per configuration ({LOOP_VAL})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save(fig, path)


def plot_intervals(cells: list[Cell], path: Path) -> Path:
    """The final metric the cells are compared in (`compared_metric`) per cell: each seed a dot, the mean a bar
    with its t-interval as error bar."""
    metric, _, unit = compared_metric(cells)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(cells) + 2), 4.2))
    for x, cell in enumerate(cells):
        values = list(cell.metric(metric).values())
        ci = t_interval(values)
        err = [[ci.mean - ci.low], [ci.high - ci.mean]] if ci.n > 1 else None
        ax.errorbar([x], [ci.mean], yerr=err, fmt="o", color="black", capsize=5, ms=6)
        ax.scatter([x + 0.12] * len(values), values, color="tab:blue", s=12, alpha=0.7)
    ax.set_xticks(range(len(cells)), [c.label().replace(", ", "\n") for c in cells], fontsize=7)
    ax.set_ylabel(f"final {metric} ({unit})")
    set_title(ax, f"Final {metric}: mean with {CONFIDENCE:.0%} t-interval (dots: seeds); {scoring(cells)}")
    ax.grid(alpha=0.3, axis="y")
    return save(fig, path)


def plot_loss_heatmap(cells: list[Cell], path: Path) -> Path:
    """Mean final validation loss (bits/byte where the data differ: `compared_metric`) over the two swept keys
    (rows x columns); blank = no result."""
    metric, name, unit = compared_metric(cells)
    (row_key, col_key) = list(cells[0].values)
    rows = sorted({c.values[row_key] for c in cells}, key=lambda v: sort_key((v,)))
    cols = sorted({c.values[col_key] for c in cells}, key=lambda v: sort_key((v,)))
    grid = [[math.nan] * len(cols) for _ in rows]
    for c in cells:
        grid[rows.index(c.values[row_key])][cols.index(c.values[col_key])] = t_interval(
            list(c.metric(metric).values())
        ).mean
    fig, ax = plt.subplots(figsize=(1.4 * len(cols) + 2.5, 1.0 * len(rows) + 1.8))
    image = ax.imshow(grid, cmap="viridis_r", aspect="auto")
    finite = [v for line in grid for v in line if not math.isnan(v)]
    middle = (min(finite) + max(finite)) / 2 if finite else 0.0
    for i, line in enumerate(grid):
        for j, value in enumerate(line):
            text = "n/a" if math.isnan(value) else f"{value:.3f}"
            color = "white" if not math.isnan(value) and value > middle else "black"
            ax.text(j, i, text, ha="center", va="center", color=color, fontsize=9)
    ax.set_xticks(range(len(cols)), [str(v) for v in cols])
    ax.set_yticks(range(len(rows)), [str(v) for v in rows])
    ax.set_xlabel(col_key)
    ax.set_ylabel(row_key)
    set_title(ax, f"Final validation {name} (lower is better); {scoring(cells)}")
    fig.colorbar(image, ax=ax, label="nats/token" if unit == "nats" else unit)
    return save(fig, path)


def plot_differences(cells: list[Cell], diffs: list[Interval | None], reference: Cell, path: Path) -> Path:
    """Paired differences from the reference with their t-intervals: an interval off the 0 line is resolved."""
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(cells) + 2), 4.2))
    for x, diff in enumerate(diffs):
        if diff is None or diff.n == 0:
            continue
        err = [[diff.mean - diff.low], [diff.high - diff.mean]] if diff.n > 1 else None
        color = "tab:red" if diff.excludes_zero else "tab:grey"
        ax.errorbar([x], [diff.mean], yerr=err, fmt="o", color=color, capsize=5, ms=6)
    ax.axhline(0.0, color="black", lw=1)
    ax.set_xticks(range(len(cells)), [c.label().replace(", ", "\n") for c in cells], fontsize=7)
    _, name, unit = compared_metric(cells)
    ax.set_ylabel(f"val {name} − reference, same seeds" + (" (nats)" if unit == "nats" else ""))
    interval = f"{CONFIDENCE:.0%} t-interval; red = resolved"
    set_title(ax, f"Paired difference from {reference.label()} ({interval}); {scoring(cells)}", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    return save(fig, path)
