"""The Runs tab's data: a run's loss curves from metrics.jsonl and its head importance over training (what
`scripts/head_importance.py RUN --over-training` wrote), and for a sweep its ablation table.

The sweep reading and the table are analysis/sweep.py's and analysis/report.py's (the same table
`scripts/ablation_report.py` writes), called here only, through their public functions: the page
shows the report's own Markdown table, split into cells.
"""

import math
import re
from pathlib import Path
from typing import Any

from analysis import importance_over_training, report, sweep
from data.text_file import Refused
from rundir.files import METRICS

CURVE_KEYS = ("train/loss", "val/loss")


def curves(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """(step, value) per metric key of CURVE_KEYS that the run logged; ValueError naming the file when it
    cannot be read (permissions, I/O, past the bounds of data.text_file)."""
    try:
        records = sweep.read_jsonl(run_dir / METRICS)
    except Refused as e:
        raise ValueError(f"{METRICS} of {str(run_dir)!r} {e.reason}") from None
    out = {key: [(r["step"], r[key]) for r in records if key in r and "step" in r] for key in CURVE_KEYS}
    # a diverged or skipped step's NaN/inf has no place on the chart (plot_run.py leaves it out too)
    out = {
        key: [(s, v) for s, v in points if isinstance(v, (int, float)) and math.isfinite(v)]
        for key, points in out.items()
    }
    return {key: points for key, points in out.items() if points}


def markdown_rows(text: str) -> list[list[str]]:
    """The cells of each row of the Markdown tables in `text` (separator lines dropped; \\| kept as |)."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("|") or re.fullmatch(r"\|[\s\-:|]+", line):
            continue
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        rows.append([cell.strip().replace("\\|", "|") for cell in cells])
    return rows


def split_table(text: str) -> dict[str, list]:
    """{"header": cells, "rows": [cells, ...]} of a Markdown table; empty when `text` has none."""
    rows = markdown_rows(text)
    return {"header": rows[0] if rows else [], "rows": rows[1:]}


def sweep_tables(root: Path, runs: list[sweep.Run]) -> dict[str, Any]:
    """The report's ablation table (cells grouped by every key the sweep varies, against the first cell)
    and its list of runs that did not complete, with its first line; where the report refuses the table,
    none, and the note says why."""
    keys = sweep.varying_keys(runs)
    unfinished = report.unfinished_table(runs, root, keys)
    try:
        cells = sweep.group_cells(runs, keys)
        table, note = report.table(cells, report.choose_reference(cells, None)), unfinished.splitlines()[0]
    except ValueError as e:  # runs the report will not put in one table (two of one cell and seed): curves still show
        table, note = "", f"no ablation table: {e}"
    return {"table": split_table(table), "unfinished": split_table(unfinished), "note": note}


def run_cells(runs: list[sweep.Run]) -> tuple[list[str], list[int | None]]:
    """The sweep's cells (labelled by the keys it varies, seed aside, in the report's order) and each run's index
    among them, so the chart draws a cell's seeds in one colour; an unreadable run has no config, so no cell."""
    readable = [r for r in runs if r.status != sweep.UNREADABLE]
    keys = sweep.varying_keys(readable)
    values = [tuple(sweep.setting(r.config, k) for k in keys) for r in readable]
    order = sorted(set(values), key=sweep.sort_key)
    labels = [sweep.Cell(dict(zip(keys, v, strict=True)), []).label() for v in order]
    index = iter(order.index(v) for v in values)
    return labels, [None if r.status == sweep.UNREADABLE else next(index) for r in runs]


def view(path: str | Path) -> dict[str, Any]:
    """A run directory (its curves) or a sweep directory (every run's curves and the ablation table)."""
    root = Path(path).expanduser()
    if root.exists() and not root.is_dir():
        raise FileNotFoundError(f"{str(root)!r} is a file; give a run or sweep directory")
    if not root.is_dir():
        raise FileNotFoundError(f"run or sweep directory {str(root)!r} does not exist")
    if (root / METRICS).is_file():
        return {"kind": "run", "path": str(root), "runs": [{"name": root.name, "curves": curves(root)}]}
    found = sweep.find_runs(root)  # FileNotFoundError when nothing under it is a run
    cells, cell_of = run_cells(found)
    return {
        "kind": "sweep",
        "path": str(root),
        "cells": cells,
        "runs": [
            # an unreadable run is listed with its error in the table below, and has no curves to draw
            {
                "name": str(r.path.relative_to(root)),
                "status": r.status,
                "cell": cell,
                "seed": r.seed,
                "curves": {} if r.status == sweep.UNREADABLE else curves(r.path),
            }
            for r, cell in zip(found, cell_of, strict=True)
        ],
        **sweep_tables(root, found),
    }


def head_importance(run_dir: Path) -> dict[str, Any]:
    """Each head's two importances at every step checkpoint of a run, with the measures' titles; a run
    without the file gets FileNotFoundError naming the command that writes it."""
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {str(run_dir)!r} does not exist")
    results = importance_over_training.read_importance_over_training(run_dir)
    shown = ("steps", "checkpoints", "shape", "tokens", "data", "base_loss", *importance_over_training.MEASURES)
    return {"path": str(run_dir), "measures": importance_over_training.MEASURES, **{k: results[k] for k in shown}}
