"""One PNG for one or more runs: train/val loss, learning rate and tokens/s, against step and wall time.

Reads only what every run writes, `RUN/metrics.jsonl` (one JSON record per line: `step`,
`train/loss`, `val/loss`, `lr`, `throughput/tokens_per_s`, `time/elapsed_s`). Records are read
leniently: a line that is not a JSON object is skipped (a run killed mid-write leaves half a line),
a record without `time/elapsed_s` (older runs) appears in the step panels only, and where a step
was logged twice (a resumed run) the later record wins. Runs are overlaid, one colour each.
"""

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt
from matplotlib.backends.backend_agg import FigureCanvasAgg

from rundir.files import METRICS, file_above

ELAPSED = "time/elapsed_s"
PANELS = [  # (title, y label, [(metric key, line label, line style)])
    ("loss", "loss (nats/token)", [("train/loss", "train", "-"), ("val/loss", "val", "--")]),
    ("learning rate", "lr", [("lr", "lr", "-")]),
    ("throughput", "tokens/s", [("throughput/tokens_per_s", "tokens/s", "-")]),
]


def image_path(out: Path, flag: str = "--out") -> Path:
    """The file a figure goes to: `out`, with .png added when it has no suffix; ValueError where it
    cannot be written (a directory, a path under a file, a format matplotlib does not write)."""
    if out.is_dir():
        raise ValueError(f"{flag} {str(out)!r} is a directory; give a file path such as {str(out / 'plot.png')!r}")
    above = file_above(out)
    if above is not None:
        raise ValueError(f"{flag} {str(out)!r} cannot be written: {str(above)!r} is a file, not a directory")
    if not out.suffix:
        return out.with_name(out.name + ".png")
    formats = FigureCanvasAgg.get_supported_filetypes()
    if out.suffix[1:].lower() not in formats:
        raise ValueError(f"{flag} {str(out)!r} has suffix {out.suffix!r}; use one of .{', .'.join(sorted(formats))}")
    return out


def read_metrics(run_dir: Path) -> dict[int, dict]:
    """{step: merged record} from RUN/metrics.jsonl; FileNotFoundError if the run has none, ValueError
    naming it if it cannot be read."""
    path = Path(run_dir) / METRICS
    if Path(run_dir).is_file():  # a checkpoint or a metrics file given for its run
        raise FileNotFoundError(f"{str(run_dir)!r} is a file; give the run directory that holds {METRICS}")
    if not path.is_file():
        raise FileNotFoundError(f"{str(run_dir)!r} is not a run directory (it has no {METRICS})")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:  # a read's own error (EIO) does not name the file
        raise ValueError(f"{str(path)!r} cannot be read ({e.strerror or e})") from None
    by_step: dict[int, dict] = {}
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            by_step.setdefault(record["step"], {}).update(record)
    return by_step


def series(records: dict[int, dict], key: str, x_key: str | None) -> tuple[list[float], list[float]]:
    """(x, y) of one metric: x is the step, or the record's elapsed seconds when x_key is given."""
    points = []
    for step in sorted(records):
        record = records[step]
        y = record.get(key)
        x = step if x_key is None else record.get(x_key)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and math.isfinite(y):
            points.append((x, y))
    return [p[0] for p in points], [p[1] for p in points]


def run_labels(run_dirs: list[Path]) -> list[str]:
    """Short distinct names: the folder name, with its parent's where two runs share a name."""
    names = [p.resolve().name for p in run_dirs]
    return [
        f"{p.resolve().parent.name}/{n}" if names.count(n) > 1 or n in ("run", "latest") else n
        for p, n in zip(run_dirs, names, strict=True)
    ]


def plot_runs(run_dirs: list[str | Path], out_path: str | Path) -> Path:
    """Write the figure (rows: against step, against wall time; columns: loss, lr, tokens/s)."""
    run_dirs = [Path(p) for p in run_dirs]
    if not run_dirs:
        raise ValueError("no run directories given")
    runs = [read_metrics(p) for p in run_dirs]  # all read before anything is drawn or written
    path = image_path(Path(out_path))  # after: a file given as the run is named as such, not as its RUN/plots.png
    labels = run_labels(run_dirs)
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), squeeze=False, layout="constrained")
    colors = plt.cm.tab10.colors
    for row, x_key in enumerate((None, ELAPSED)):
        for col, (title, ylabel, lines) in enumerate(PANELS):
            ax = axes[row][col]
            drawn = 0
            for i, (records, label) in enumerate(zip(runs, labels, strict=True)):
                for key, line_label, style in lines:
                    xs, ys = series(records, key, x_key)
                    if not xs:
                        continue
                    name = f"{label} {line_label}" if len(lines) > 1 else label
                    marker = "o" if key == "val/loss" or len(xs) == 1 else None  # one point has no line to draw
                    color = colors[i % len(colors)]
                    ax.plot(xs, ys, style, color=color, marker=marker, ms=3, lw=1.3, alpha=0.9, label=name)
                    drawn += 1
            ax.set_title(f"{title} vs {'step' if x_key is None else 'wall time'}", fontsize=10)
            ax.set_xlabel("step" if x_key is None else "wall time (s)")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if drawn:
                ax.legend(fontsize=8)
            else:
                missing = f"no {ELAPSED} in {METRICS}" if x_key else "not logged"
                ax.text(0.5, 0.5, missing, ha="center", va="center", transform=ax.transAxes, color="gray")
                ax.set_xticks([])
                ax.set_yticks([])
            if col == 1:
                ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    fig.suptitle(", ".join(labels) if len(labels) <= 4 else f"{len(labels)} runs", fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
