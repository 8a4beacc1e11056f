"""PNG plots of a sweep: validation-loss curves per configuration and a heatmap of final loss."""

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt

from analysis.sweep import CRASHED, Row, Run, mean_std


def plot_val_curves(rows: list[Row], runs: list[Run], path: Path) -> Path:
    """One colour per (n_head, d_k), one line per seed; crashed runs' partial curves dashed."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.cm.viridis([i / max(1, len(rows) - 1) for i in range(len(rows))])
    for color, row in zip(colors, rows, strict=True):
        for i, run in enumerate(row.runs):
            steps, losses = zip(*run.val_curve, strict=True) if run.val_curve else ((), ())
            label = f"n_head={row.n_head}, d_k={row.d_k}" if i == 0 else None
            ax.plot(steps, losses, color=color, lw=1.2, alpha=0.9, label=label, marker=".")
    for run in runs:
        if run.status == CRASHED and run.val_curve:
            steps, losses = zip(*run.val_curve, strict=True)
            ax.plot(steps, losses, color="red", ls="--", lw=1, label=f"crashed: n_head={run.n_head}, d_k={run.d_k}")
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title("Validation loss per configuration")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_loss_heatmap(rows: list[Row], path: Path) -> Path:
    """Final validation loss (mean over seeds) over n_head (rows) x d_k (columns); blank = no result."""
    heads = sorted({r.n_head for r in rows})
    dks = sorted({r.d_k for r in rows})
    grid = [[math.nan] * len(dks) for _ in heads]
    for r in rows:
        grid[heads.index(r.n_head)][dks.index(r.d_k)] = mean_std(r.val_loss)[0]
    fig, ax = plt.subplots(figsize=(1.4 * len(dks) + 2.5, 1.0 * len(heads) + 1.8))
    image = ax.imshow(grid, cmap="viridis_r", aspect="auto")
    finite = [v for line in grid for v in line if not math.isnan(v)]
    middle = (min(finite) + max(finite)) / 2 if finite else 0.0
    for i, line in enumerate(grid):
        for j, value in enumerate(line):
            text = "n/a" if math.isnan(value) else f"{value:.3f}"
            color = "white" if not math.isnan(value) and value > middle else "black"
            ax.text(j, i, text, ha="center", va="center", color=color, fontsize=9)
    ax.set_xticks(range(len(dks)), [str(d) for d in dks])
    ax.set_yticks(range(len(heads)), [str(h) for h in heads])
    ax.set_xlabel("d_k (per-head dimension)")
    ax.set_ylabel("n_head")
    ax.set_title("Final validation loss (lower is better)")
    fig.colorbar(image, ax=ax, label="nats/token")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
