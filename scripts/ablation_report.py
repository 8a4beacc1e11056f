"""Turn a sweep directory into a Markdown report and PNG plots.

    python scripts/ablation_report.py multirun/ablate_heads_dk/2026-11-29_10-00-00 [--out DIR]
        [--reference model.n_head=4] [--paper vaswani_a|vaswani_b|bhojanapalli|gqa] [--force] [--full-val]

Rows are the cells of every config key that differs across the runs (seeds aggregated), with 95%
t-intervals and paired differences against the reference cell (default: the first row). Writes
`ablation.md`, `runs.jsonl` (a line per run: swept values, seed, status, summary, full-val score) and the
plots `val_loss_curves.png`, `val_loss_intervals.png`, `val_loss_differences.png` (and
`val_loss_heatmap.png` when two keys are swept) to --out (default: the sweep directory, whose own
report is redrawn; elsewhere an existing file of those names is replaced only with --force); --paper
adds the published results beside ours, with a verdict per claim, for a sweep over the paper's keys
and no other (see --help). Runs that crashed, never started or
whose records are cut short are listed in the report, not dropped. Nothing is written if the input is bad.
--full-val scores each completed run's best checkpoint on every held-out token (analysis/full_val.py,
kept as RUN/full_val.json) and compares those, whose seed spread is 4.5 times smaller.
"""

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from analysis.outputs import check_out_dir, check_replaceable
from analysis.papers import PAPERS, paper_section
from analysis.plots import plot_differences, plot_intervals, plot_loss_heatmap, plot_val_curves
from analysis.report import choose_reference, differences, markdown_report, raw_rows
from analysis.sweep import COMPLETED, find_runs, group_cells, sweep_plans, varying_keys
from cli.errors import exit_with_error
from cli.schema_help import OneLineParser
from rundir.files import RUN_INFO

log = logging.getLogger("ablation_report")
REPORT, INTERVALS, DIFFERENCES = "ablation.md", "val_loss_intervals.png", "val_loss_differences.png"
HEATMAP, CURVES, RAW = "val_loss_heatmap.png", "val_loss_curves.png", "runs.jsonl"


def parse_reference(text: str | None) -> dict[str, str] | None:
    """'model.n_head=4,optim.lr=1e-3' -> {'model.n_head': '4', 'optim.lr': '1e-3'}."""
    if not text:
        return None
    pairs = [p.partition("=") for p in text.split(",")]
    if any(not k or not sep or not v for k, sep, v in pairs):
        raise ValueError(f"--reference {text!r} is invalid; give KEY=VALUE[,KEY=VALUE...], e.g. model.n_head=4")
    keys = [k.strip() for k, _, _ in pairs]
    if repeated := sorted({k for k in keys if keys.count(k) > 1}):  # the last value won without a word
        raise ValueError(f"--reference {text!r} gives {', '.join(repeated)} twice; give each key once")
    return {k.strip(): v.strip() for k, _, v in pairs}


def out_dir_arg(text: str) -> Path:
    """--out as a directory; empty is refused: --out "$DIR" with DIR unset would write into the current one."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give a directory ('.' for the current one)")
    return Path(text)


def write_report(
    sweep_dir: Path,
    out_dir: Path | None = None,
    reference: str | None = None,
    paper: str | None = None,
    force: bool = False,
    full_val: bool = False,
) -> Path:
    """Read every run under `sweep_dir`, write the report and plots to `out_dir`; returns the .md path.
    Files of an earlier report in another `out_dir` are replaced only with `force`."""
    sweep_dir = Path(sweep_dir)
    out_dir = Path(out_dir or sweep_dir)
    # Everything is read and checked before the first file is written.
    if (sweep_dir / RUN_INFO).is_file() or (sweep_dir / ".hydra" / "config.yaml").is_file():
        raise ValueError(
            f"{str(sweep_dir)!r} is one run's directory; the report compares runs: give the folder that holds "
            "the runs (a sweep's multirun/DATE/TIME, or a folder of run directories)"
        )
    runs = find_runs(sweep_dir)
    check_out_dir(out_dir)
    if full_val:  # every completed run's best checkpoint on every held-out token (saved beside the run)
        from analysis.full_val import full_val as full_val_score  # torch: only when scoring, not to read records

        for run in runs:
            if run.status == COMPLETED:
                run.full_val = full_val_score(run.path)
    keys = varying_keys(runs)
    cells = group_cells(runs, keys)
    ref = choose_reference(cells, parse_reference(reference))
    for cell in cells:  # a cell whose seeds differ in size is a sweep this report cannot compare
        cell.info("params"), cell.info("flops_per_token")
    published = paper_section(paper, cells) if paper else ""
    plots = {}  # caption -> file, in the report's order
    if cells:
        plots["final validation loss per cell"] = INTERVALS
        plots["paired difference from the reference"] = DIFFERENCES
        if len(keys) == 2:
            plots[f"final validation loss over {' x '.join(keys)}"] = HEATMAP
        plots["validation loss curves"] = CURVES
    # The sweep's own report is its to redraw (as plot_run redraws RUN/plots.png); elsewhere a file of that
    # name may be anyone's.
    if not (out_dir.exists() and out_dir.resolve() == sweep_dir.resolve()):
        for name in [REPORT, RAW, *plots.values()]:
            check_replaceable(out_dir / name, force)
    out_dir.mkdir(parents=True, exist_ok=True)
    if cells:
        plot_intervals(cells, out_dir / INTERVALS)
        plot_differences(cells, differences(cells, ref), ref, out_dir / DIFFERENCES)
        if len(keys) == 2:
            plot_loss_heatmap(cells, out_dir / HEATMAP)
        plot_val_curves(cells, runs, out_dir / CURVES)
    report = out_dir / REPORT
    (out_dir / RAW).write_text("".join(json.dumps(row, default=str) + "\n" for row in raw_rows(runs, keys, sweep_dir)))
    text = markdown_report(sweep_dir, runs, cells, ref, plots, published, sweep_plans(sweep_dir), full_val)
    report.write_text(text)
    done = sum(r.status == COMPLETED for r in runs)
    log.info("%d runs (%d completed) in %d cells over %s -> %s", len(runs), done, len(cells), keys, report)
    return report


def main() -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir", type=Path, help="a Hydra multirun directory (or any folder of run dirs)")
    parser.add_argument("--out", type=out_dir_arg, default=None, help="where to write the report (default: sweep_dir)")
    parser.add_argument("--reference", default=None, help="the cell others are compared with, KEY=VALUE[,...]")
    needs = "; ".join(f"{name}: {' x '.join(keys)}" for name, (_, keys, _) in PAPERS.items())
    paper_help = (
        f"put a paper's results beside ours. The sweep must vary exactly the paper's keys ({needs}); one that "
        "lacks them or also varies another key is refused, naming it (report a folder with one value of it)"
    )
    parser.add_argument("--paper", default=None, choices=list(PAPERS), help=paper_help)
    parser.add_argument("--force", action="store_true", help="replace an earlier report's files in --out")
    full_help = (
        "compare every held-out token's score of each run's best checkpoint (saved as RUN/full_val.json) "
        "instead of the run's own final val/loss on 10 batches drawn with its seed"
    )
    parser.add_argument("--full-val", action="store_true", help=full_help)
    args = parser.parse_args()
    try:
        parse_reference(args.reference)
    except ValueError as e:  # a bad command line: argparse's one line and status 2
        parser.error(str(e))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        write_report(args.sweep_dir, args.out, args.reference, args.paper, args.force, args.full_val)
    except (ValueError, OSError) as e:  # OSError: an --out the system refuses (read-only, name too long)
        exit_with_error(e)


if __name__ == "__main__":
    main()
