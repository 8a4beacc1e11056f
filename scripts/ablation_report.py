"""Turn a sweep directory into a Markdown table and PNG plots.

    python scripts/ablation_report.py multirun/ablate_heads_dk/2026-11-29_10-00-00 [--out DIR]

Writes `ablation.md`, `val_loss_curves.png` and `val_loss_heatmap.png` to --out (default: the
sweep directory). Runs that crashed or never started are listed in the report, not dropped.
"""

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from analysis.plots import plot_loss_heatmap, plot_val_curves
from analysis.report import markdown_report
from analysis.sweep import COMPLETED, aggregate, find_runs

log = logging.getLogger("ablation_report")


def write_report(sweep_dir: Path, out_dir: Path | None = None) -> Path:
    """Read every run under `sweep_dir`, write the report and plots to `out_dir`; returns the .md path."""
    sweep_dir = Path(sweep_dir)
    out_dir = Path(out_dir or sweep_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = find_runs(sweep_dir)
    rows = aggregate(runs)
    plots = {}
    if rows:
        plot_val_curves(rows, runs, out_dir / "val_loss_curves.png")
        plot_loss_heatmap(rows, out_dir / "val_loss_heatmap.png")
        plots = {"final validation loss over n_head x d_k": "val_loss_heatmap.png"}
        plots["validation loss curves"] = "val_loss_curves.png"
    report = out_dir / "ablation.md"
    report.write_text(markdown_report(sweep_dir, runs, rows, plots))
    done = sum(r.status == COMPLETED for r in runs)
    log.info("%d runs (%d completed) -> %s", len(runs), done, report)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir", type=Path, help="a Hydra multirun directory (or any folder of run dirs)")
    parser.add_argument("--out", type=Path, default=None, help="where to write the report (default: sweep_dir)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        write_report(args.sweep_dir, args.out)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
