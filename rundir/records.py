"""What a run records: `metrics.jsonl` always and Weights & Biases unless turned off, `run_info.json`
when training starts and `summary.json` when it ends, the resolved `config.yaml`, `train.log`, and
`plots.png` drawn from metrics.jsonl (`plot_runs`, also scripts/plot_run.py's).

A run directory with run_info.json but no summary.json crashed or is still running; the ablation
report (analysis/sweep.py) lists such runs instead of dropping them. The tools that read these files
(the report, run plots, the lab) import their names from here, without importing torch.
"""

import contextlib
import io
import json
import logging
import math
import netrc
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from data.text_file import json_records
from rundir.files import METRICS, RUN_INFO, SUMMARY, atomic_write_bytes, file_above, missing_target, open_for_append

log = logging.getLogger(__name__)

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


# wandb's own modes, as WANDB_MODE may name them (dryrun: its older word for offline)
WANDB_RUN_MODES = ("online", "offline", "dryrun", "disabled", "run", "shared")


def start_wandb(out_dir: Path, cfg: LoggerConfig, config: dict[str, Any], run_id: str | None = None) -> Any:
    """The run's wandb run, or None with cfg.wandb off; ValueError in one line when wandb cannot start (no API
    key online, no network, a WANDB_MODE it does not know). A run calls it before it replaces anything."""
    if not cfg.wandb:
        return None
    import wandb

    mode = resolve_wandb_mode(cfg.mode)
    if mode not in WANDB_RUN_MODES:  # wandb's answer was "1 validation error for Settings"
        raise ValueError(f"WANDB_MODE={mode!r} is unknown to wandb; use one of: {', '.join(WANDB_RUN_MODES)}")
    quiet = mode in ("offline", "dryrun")
    try:
        # Offline, wandb's banner, history sparklines and sync hints were 30 of a run's 78 lines and pushed the
        # closing lines off the screen: silent, and one line of ours says where the run's files are.
        run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            group=cfg.group,
            name=cfg.name,
            tags=cfg.tags,
            config=config,
            dir=str(out_dir),
            mode=mode,
            id=run_id,
            resume="allow" if run_id else None,
            settings=wandb.Settings(silent=True) if quiet else None,
        )
    except Exception as e:  # its UsageError, CommError, ...: a hundred lines of traceback, twice
        first = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(
            f"wandb could not start its {mode} run ({type(e).__name__}: {first}); run `wandb login` or set "
            "WANDB_API_KEY, or give logger.mode=offline (logger=none: no wandb)"
        ) from None
    if quiet:
        folder = Path(run.dir).parent
        log.info("wandb: offline run in %s (upload it with: wandb sync %s)", folder, folder)
    return run


class MetricsLogger:
    """Writes each record as one JSON line to `metrics.jsonl` and mirrors it to `run` (wandb's, or None)."""

    def __init__(self, out_dir: Path, run: Any = None):
        self.path = Path(out_dir) / METRICS
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open_for_append(self.path)  # a link there is made the run's own file first
        self.run = run

    def log(self, metrics: dict[str, Any], step: int) -> None:
        try:
            self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        except OSError as e:  # a full disk: the write's own error names no file
            raise OSError(e.errno, f"cannot append to {self.path} ({e.strerror})") from None
        if self.run is not None:
            self.run.log(metrics, step=step)

    def close(self) -> None:
        # Lines are flushed as written, so what close could still fail to flush is a line whose write already
        # raised; raising again here would replace that error, which names the file, with one that does not.
        with contextlib.suppress(OSError):
            self._file.close()
        if self.run is not None:
            self.run.finish()


def mfu(flops_per_token: float, tokens_per_s: float, peak: float) -> float:
    """Fraction of the measured peak the model's useful FLOPs reach, at most 1: a rate above the peak proves the
    peak stale (measured under load, or on a slower day), so the rate itself is the better bound on the peak."""
    rate = flops_per_token * tokens_per_s
    return rate / max(peak, rate) if rate > 0 else 0.0


def write_json(path: Path, record: dict[str, Any]) -> None:
    atomic_write_bytes(path, (json.dumps(record, indent=2) + "\n").encode())


def write_run_info(out_dir: Path, shape: dict[str, Any], config: dict[str, Any]) -> None:
    """Shape, size and cost of the run (`shape`: the model's sizes, params, FLOPs and tokens per step), with
    its resolved config; clears an older summary. A study's settings (fairness) are in the config."""
    record = shape | {"max_steps": config["max_steps"], "seed": config["seed"]}
    if "fairness" in config:  # a study's config (studies.fairness.StudyRunConfig): what it held fixed
        record["fairness"] = config["fairness"]["mode"]
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
    """The handler that writes a run's train.log: opened at its first record (a start refused before any
    leaves no train.log, so its lock can be discarded), never through a link (`open_for_append`)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8", delay=True)
        self.failed = False

    def _open(self) -> TextIO:
        return open_for_append(Path(self.baseFilename))

    def handleError(self, record: logging.LogRecord) -> None:
        """One line, once, where logging printed its '--- Logging error ---' traceback for every record (35 lines
        on a full disk before the run's own error); the console still shows each record."""
        if not self.failed:
            self.failed = True
            error = sys.exc_info()[1]
            reason = getattr(error, "strerror", None) or error
            sys.stderr.write(f"warning: {self.baseFilename} cannot be written ({reason}); it stops here\n")


def log_to_file(path: Path) -> None:
    """Send every log record of this process to the run's `train.log` too, and to no earlier run's: a
    sweep runs its jobs one after another in one process. The records `held_records` kept go in first."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, RunLogHandler)]:
        if old.baseFilename == os.path.abspath(path):  # as FileHandler names it: not through a symlink
            return
        root.removeHandler(old)
        old.close()
    handler = RunLogHandler(path)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    for held in [h for h in root.handlers if isinstance(h, HeldRecords)]:
        root.removeHandler(held)  # from here on they go to the file as they come
        for record in held.records:
            handler.handle(record)
    root.addHandler(handler)


class HeldRecords(logging.Handler):
    """The log records of a run's set-up, kept until its train.log opens (nothing is written before every check has
    passed): 'resuming with a different ['data']' reached the console and never the run's own log."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def held_records() -> Iterator[None]:
    """Within the block, log records wait for log_to_file (not where a train.log already takes them: a sweep's job)."""
    root = logging.getLogger()
    if any(isinstance(h, RunLogHandler) for h in root.handlers):
        yield
        return
    held = HeldRecords()
    root.addHandler(held)
    try:
        yield
    finally:
        root.removeHandler(held)


# -- plots.png ----------------------------------------------------------------------------------------------
# One PNG for one or more runs: train/val loss, learning rate and tokens/s, against step and wall time.
#
# Reads only what every run writes, `RUN/metrics.jsonl` (one JSON record per line: `step`,
# `train/loss`, `val/loss`, `lr`, `throughput/tokens_per_s`, `time/elapsed_s`). Records are read
# leniently: a line that is not a JSON object is skipped (a run killed mid-write leaves half a line),
# a record without `time/elapsed_s` (older runs) appears in the step panels only, and where a step
# was logged twice (a resumed run) the later record wins. Runs are overlaid, one colour each.

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
    from matplotlib.backends.backend_agg import FigureCanvasAgg

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
    if target := missing_target(Path(run_dir)):  # outputs/latest after its run went
        raise FileNotFoundError(f"{str(run_dir)!r} is a symlink to {target}, which is missing")
    if not Path(run_dir).exists():  # as sample.py and the lab say it (it read "not a run directory")
        raise FileNotFoundError(f"{str(run_dir)!r} does not exist; give a run directory")
    if not path.exists():
        raise FileNotFoundError(f"{str(run_dir)!r} is not a run directory (it has no {METRICS})")
    by_step: dict[int, dict] = {}
    for _, record in json_records(path):  # a bounded line at a time; a torn or crafted line is skipped
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
    if not any(runs):  # an empty figure and 'wrote ...' said nothing was wrong
        names = ", ".join(str(p) for p in run_dirs)
        raise ValueError(f"no metrics to plot: {METRICS} of {names} holds no record with a step (yet)")
    path = image_path(Path(out_path))  # after: a file given as the run is named as such, not as its RUN/plots.png
    labels = run_labels(run_dirs)
    plt = pyplot()
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
    image = io.BytesIO()  # then written atomically: a symlinked RUN/plots.png is replaced, not written through
    fig.savefig(image, format=path.suffix[1:].lower(), dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, image.getvalue())
    return path


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display), imported when a plot is drawn: it takes
    a second, which neither a run's start nor the tools that only read records should pay."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
