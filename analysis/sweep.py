"""Read a sweep directory (Hydra multirun) into runs, and group them into cells that differ only by seed.

Each run directory holds `run_info.json` (written when training starts), `summary.json` (when it
ends) and `metrics.jsonl`; Hydra adds `.hydra/` and `train.log`. A run that has no summary is
reported as crashed (or still running), one that never wrote run_info as failed at start-up, one
whose records are cut short as unreadable, one whose final val/loss is NaN or inf as non-finite, so
no run silently drops out of a table.

The cells are keyed by every config value that differs across the runs (derived from the configs,
not listed by hand), so a sweep over any key, not only n_head and d_k, gets one row per value.
"""

import dataclasses
import functools
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data.text_file import NotJSON, Refused, json_records, open_regular, read_json_object, read_yaml_text
from rundir.files import METRICS, RUN_INFO, SUMMARY, live_run_in
from rundir.records import flatten

COMPLETED, CRASHED, FAILED_AT_START = "completed", "crashed or unfinished", "failed before training"
INTERRUPTED = "interrupted at a saved step (resume=auto continues it)"  # Ctrl-C, SIGTERM: said in its train.log
RUNNING = "still running"  # a live process holds its lock: a report of a sweep under way
UNREADABLE, NO_VAL_LOSS = "unreadable", "completed without a final val/loss"
NONFINITE = "completed with a non-finite val/loss"  # a NaN or inf is no result: no mean or interval holds it

MAX_LOG_BYTES = 2**20  # of a train.log's end: its last error and how it stopped are there

# Keys that never make two runs different experiments: the seed is what a cell aggregates over; the
# rest say where a run writes or how it logs. A prefix ending in "." covers a whole group.
NOT_COMPARED = ("seed", "out_dir", "resume", "overwrite", "progress", "logger.", "data.cache_dir")
# fairness.mode iso_flop / iso_time replace max_steps with a value derived from the budget (and for
# iso_time from a measured step time, which differs run to run): an outcome, not a setting, for those
# runs only; a fixed run's max_steps beside them is still its own setting (see `setting`).
DERIVED_MAX_STEPS = ("iso_flop", "iso_time")


@dataclass
class Run:
    path: Path
    status: str
    config: dict[str, Any]  # flattened: {"model.n_head": 4, ...}; from .hydra/ when run_info is missing
    seed: int | None
    info: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    val_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, val/loss)
    last_step: int | None = None
    error: str | None = None
    logged_final: dict[str, float] = field(default_factory=dict)  # every value logged at the summary's step
    overridden: set[str] = field(default_factory=set)  # keys its command line set; read for runs that never started
    full_val: dict[str, float] | None = None  # its score on every held-out token, when the report asks for it
    predates: set[str] = field(default_factory=set)  # keys added to the config after it ran, read as defaults

    def final(self, metric: str) -> float | None:
        """A completed run's final `metric`: its full-val score where one was taken (analysis/full_val.py),
        else from summary.json, else the last logged value at its last step."""
        if self.full_val and self.full_val.get(metric) is not None:
            return self.full_val[metric]
        if self.summary and self.summary.get(metric) is not None:
            return self.summary[metric]
        return self.logged_final.get(metric)


@dataclass
class Cell:
    """One configuration (the values of the swept keys) over its completed seeds."""

    values: dict[str, Any]
    runs: list[Run]

    def metric(self, name: str) -> dict[int, float]:
        """{seed: final value}, for paired comparisons across cells."""
        return {r.seed: r.final(name) for r in self.runs if r.final(name) is not None}

    def info(self, key: str) -> Any:
        """A run_info value the seeds share (size, shape); ValueError if they do not share it."""
        found = {json.dumps(r.info.get(key)) for r in self.runs}
        if len(found) > 1:
            raise ValueError(f"runs of {self.label()} differ in {key} {sorted(found)}; a cell differs only in seed")
        return self.runs[0].info.get(key)

    def label(self) -> str:
        # null, as the table shows it and --reference takes it (the prose said None beside the table's null)
        return ", ".join(f"{k}={'null' if v is None else v}" for k, v in self.values.items()) or "all runs"


def read_object(path: Path) -> dict[str, Any] | None:
    """A JSON object file, None if absent; Refused naming it (bounded read, not JSON, not an object)."""
    if not path.exists() or path.is_dir():
        return None
    return read_json_object(path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of metrics.jsonl up to a line cut short by a crash, read a bounded line at a time; Refused
    naming it for a non-object line, a line or a file past the bounds, a file that is not a regular file."""
    records = []
    if path.exists() and not path.is_dir():
        for number, record in json_records(path):
            if isinstance(record, NotJSON):  # a line cut short by a crash
                break
            if not isinstance(record, dict):
                raise Refused(
                    repr(str(path)), f"line {number} is {json.dumps(record)[:40]!r}; each line must be a JSON object"
                )
            records.append(record)
    return records


def log_lines(log_path: Path) -> list[str]:
    """A run's train.log, line by line (its last MAX_LOG_BYTES); none where it is absent or unreadable (that
    only loses its messages)."""
    try:
        return log_tail(log_path).splitlines()
    except (OSError, ValueError):
        return []


def log_tail(path: Path) -> str:
    """The last MAX_LOG_BYTES of a log (where its last error is), read through a regular file only."""
    with open_regular(path) as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - MAX_LOG_BYTES))
        return f.read(MAX_LOG_BYTES).decode(errors="replace")


def last_error(lines: list[str]) -> str | None:
    """The last ERROR message in a job's log lines (log_lines); for a logged traceback, its final line."""
    for i in range(len(lines) - 1, -1, -1):
        if "][ERROR] - " in lines[i]:
            tail = []  # the record's own continuation lines (a traceback), up to the next record
            for line in lines[i + 1 :]:
                if line.startswith("["):
                    break
                tail += [line] if line.strip() else []
            return tail[-1].strip() if tail else lines[i].split("][ERROR] - ", 1)[1]
    return None


def hydra_config(run_dir: Path) -> dict[str, Any]:
    """The flattened config Hydra saved for a job, for runs that never wrote run_info.json."""
    tree = read_yaml(run_dir / ".hydra" / "config.yaml")
    return flatten(tree) if isinstance(tree, dict) else {}


def is_finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse_overrides(lines: list[str]) -> list:
    """Hydra's own reading of command-line overrides; ValueError for text Hydra cannot parse."""
    try:
        return OverridesParser.create().parse_overrides([str(line) for line in lines])
    except HydraException as e:
        raise ValueError(str(e)) from None


def read_yaml(path: Path) -> Any:
    """A YAML file as plain Python, None if absent or not YAML OmegaConf reads (bounded, alias bombs refused:
    data.text_file.read_yaml_text)."""
    if not path.is_file():
        return None
    try:
        return OmegaConf.to_container(OmegaConf.create(read_yaml_text(path)), resolve=False)
    except (OmegaConfBaseException, ValueError, OSError):
        return None


def hydra_overridden_keys(run_dir: Path) -> set[str]:
    """The config keys a Hydra job's command line set (.hydra/overrides.yaml); group choices such as
    +debug=tiny name no config value and drop out where the config has no such key."""
    lines = read_yaml(run_dir / ".hydra" / "overrides.yaml")
    if not isinstance(lines, list):
        return set()
    try:
        return {o.key_or_group for o in parse_overrides(lines)}
    except ValueError:
        return set()


def matches(value: Any, text: str) -> bool:
    """A cell's value equals a command-line value: 1e-3 matches 0.001, 'null' matches None."""
    if value is None:
        return text in ("null", "None")
    try:
        return float(value) == float(text)
    except (TypeError, ValueError):
        return str(value) == text


def sweep_jobs(params: list[str], task: list[str]) -> list[list[str]]:
    """Each job's overrides, as Hydra's basic sweeper expands a recipe's hydra.sweeper.params and a command line:
    the product of each key's values, where the command line's values for a key the recipe also sweeps replace
    the recipe's (`+experiment=vaswani_a_default model.n_head=1,2` is 2 x 5 seeds, not 5 x 2 x 5)."""
    return [list(job) for job in BasicSweeper.split_arguments(parse_overrides([*params, *task]), None)[0]]


def planned_sweep(sweeper: Mapping[str, Any], task: list[str]) -> list[list[str]] | None:
    """`sweep_jobs` of a composed hydra.sweeper section and the command line's overrides; None for a sweeper
    other than the basic one (optuna, ...), which chooses its jobs as it goes."""
    if not str(sweeper.get("_target_", "BasicSweeper")).endswith("BasicSweeper"):
        return None
    return sweep_jobs([f"{key}={value}" for key, value in (sweeper.get("params") or {}).items()], task)


def planned_jobs(sweep_dir: Path) -> int | None:
    """How many jobs the sweep's multirun.yaml plans, counted as Hydra's basic sweeper expands them (the
    recipe's hydra.sweeper.params, then the command line); None where there is no plan this can read."""
    plan = read_yaml(Path(sweep_dir) / "multirun.yaml")
    hydra = plan.get("hydra") if isinstance(plan, dict) else None
    if not isinstance(hydra, dict):
        return None
    task = (hydra.get("overrides") or {}).get("task") or []
    try:
        jobs = planned_sweep(hydra.get("sweeper") or {}, task)
    except (ValueError, HydraException, AttributeError, TypeError):
        return None
    return None if jobs is None else len(jobs)


def sweep_plans(root: Path) -> dict[Path, int]:
    """{sweep folder: jobs its multirun.yaml plans} for every readable plan at or under `root` (a folder may
    hold several sweeps, e.g. multirun/ablate_heads_dk/ with one per date)."""
    plans = {p.parent: planned_jobs(p.parent) for p in sorted(Path(root).rglob("multirun.yaml"))}
    return {folder: n for folder, n in plans.items() if n is not None}


def run_status(info: dict | None, summary: dict | None, final_loss: Any) -> str:
    if summary is not None and summary.get("status") == COMPLETED:
        if final_loss is None:
            return NO_VAL_LOSS
        return COMPLETED if is_finite_number(final_loss) else NONFINITE
    return CRASHED if info is not None else FAILED_AT_START


def read_run(run_dir: Path) -> Run:
    """One run directory; a record cut short, or one the OS will not let us read (permissions, I/O),
    makes an UNREADABLE run (listed, not an error)."""
    broken = []
    try:
        records = read_jsonl(run_dir / METRICS)
    except Refused as e:
        records = []
        broken.append(f"{METRICS} {e.reason}")
    objects = {}
    for name in (RUN_INFO, SUMMARY):
        try:
            objects[name] = read_object(run_dir / name)
        except Refused as e:
            objects[name] = None
            broken.append(f"{name} {e.reason}")
    info, summary = objects[RUN_INFO], objects[SUMMARY]
    if summary is not None and info is None and not any(b.startswith(RUN_INFO) for b in broken):
        # a finished run's size and shape: the table reads them (it was an AttributeError traceback)
        broken.append(f"{RUN_INFO} is missing or not a file")
    config = flatten(info["config"]) if info and isinstance(info.get("config"), dict) else hydra_config(run_dir)
    curve = [(r.get("step"), r["val/loss"]) for r in records if "val/loss" in r]
    last_step = records[-1].get("step") if records else None
    # A summary rewritten without final metrics (a finished run resumed): its last logged evaluation
    # stands in, if it was logged at the step the summary ends at.
    logged = {k: v for r in records if r.get("step") == (summary or {}).get("step") for k, v in r.items()}
    run = Run(run_dir, "", config, config.get("seed"), info, summary, curve, last_step, logged_final=logged)
    run.status = UNREADABLE if broken else run_status(info, summary, run.final("val/loss"))
    if info is None:
        run.overridden = hydra_overridden_keys(run_dir)
    run.error = "; ".join(broken) if broken else None
    if run.status == NONFINITE:
        run.error = f"final val/loss is {run.final('val/loss')}"
    elif run.status not in (COMPLETED, UNREADABLE):
        lines = log_lines(run_dir / "train.log")
        stop = stopped_by_signal(lines) if run.status == CRASHED else None  # a clean stop, not a crash
        run.status, run.error = (INTERRUPTED, stop) if stop else (run.status, last_error(lines))
        if run.status == CRASHED and (live := live_run_in(run_dir)):  # it read as crashed while it trained
            run.status, run.error = RUNNING, live.partition(" is in use by a live run ")[2].partition("; wait")[0]
    return run


def stopped_by_signal(lines: list[str]) -> str | None:
    """The run's own 'stopped by SIGINT after step N; saved PATH' line, if the last thing it logged was that."""
    records = [line for line in lines if line.startswith("[") and "] - continue the whole sweep: " not in line]
    if records and "] - stopped by SIG" in records[-1]:  # a sweep's job adds how to continue the sweep after it
        return records[-1].split("] - ", 1)[1].split("; continue with", 1)[0]
    return None


@functools.cache
def schema_defaults() -> dict[str, Any]:
    """{dotted key: default} of every key a run's config has today. A run written before a key existed ran
    as its default runs: a new key's default keeps the old behaviour (so a run of last week and one of
    today with the same settings are one cell, not two cells that differ in model.attn_diff null / false)."""
    from studies.fairness import StudyRunConfig  # torch: only for a run that predates a key

    return flatten(dataclasses.asdict(StudyRunConfig()))


def find_runs(sweep_dir: str | Path) -> list[Run]:
    """Every run under `sweep_dir`: directories with run_info.json or a Hydra job's .hydra/."""
    root = Path(sweep_dir)
    if root.exists() and not root.is_dir():
        raise FileNotFoundError(f"{str(root)!r} is a file; give a sweep directory (a Hydra multirun folder)")
    if not root.is_dir():
        raise FileNotFoundError(f"sweep directory {str(root)!r} does not exist")
    dirs = {p.parent for p in root.rglob(RUN_INFO)} | {p.parent.parent for p in root.rglob(".hydra/config.yaml")}
    if not dirs:
        raise FileNotFoundError(f"no runs under {str(root)!r} (no {RUN_INFO} and no .hydra/config.yaml)")
    runs = [read_run(d) for d in sorted(dirs)]
    fill_predated_keys(runs)
    return runs


def fill_predated_keys(runs: list[Run]) -> None:
    """A started run lacking a key that another started run has was written before the key existed: it
    reads that key as the schema's default (`schema_defaults`), and says so in `Run.predates`."""
    started = [r for r in runs if r.info is not None]
    keys = {k for r in started for k in r.config}
    for run in started:
        if missing := keys - run.config.keys():
            defaults = schema_defaults()
            run.predates = {k for k in missing if k in defaults}
            run.config |= {k: defaults[k] for k in run.predates}


def compared(key: str) -> bool:
    return not any(key == k or (k.endswith(".") and key.startswith(k)) for k in NOT_COMPARED)


def setting(config: dict[str, Any], key: str) -> Any:
    """The value of `key` that makes a run this experiment: the config's, except an iso run's max_steps,
    which its mode derives; iso runs of one mode share it, while fixed runs keep their own step counts."""
    mode = config.get("fairness.mode")
    if key == "max_steps" and mode in DERIVED_MAX_STEPS:
        return f"derived by {mode}"
    return config.get(key)


def known_keys(run: Run) -> set[str]:
    """The keys a run speaks for: all of a started run's resolved config; of a job that never started, only
    what its command line set (the rest of Hydra's config.yaml is unresolved, e.g. model.vocab_size null)."""
    return set(run.config) if run.info is not None else run.overridden & set(run.config)


def varying_keys(runs: list[Run]) -> list[str]:
    """The config keys whose values differ across the runs, sorted: a key a started run lacks counts as
    null there; a job that failed at start counts for the keys its command line set."""
    keys = sorted({k for r in runs for k in known_keys(r) if compared(k)})
    seen = {k: set() for k in keys}
    for run in runs:
        for k in keys if run.info is not None else known_keys(run) & set(keys):
            seen[k].add(json.dumps(setting(run.config, k), sort_keys=True, default=str))
    return [k for k in keys if len(seen[k]) > 1]


def sort_key(values: tuple) -> tuple:
    """Numbers in numeric order, None first, anything else by its text: mixed types never compare."""
    return tuple(
        (0, 0, "") if v is None else (1, v, "") if isinstance(v, int | float) else (2, 0, str(v)) for v in values
    )


def group_cells(runs: list[Run], keys: list[str]) -> list[Cell]:
    """Completed runs grouped by the values of `keys`, in sorted order; the seeds are a cell's members."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        if run.status == COMPLETED:
            groups.setdefault(tuple(setting(run.config, k) for k in keys), []).append(run)
    cells = [Cell(dict(zip(keys, v, strict=True)), groups[v]) for v in sorted(groups, key=sort_key)]
    for cell in cells:  # two runs of one cell and seed (a rerun left in the sweep) would count once
        seen: dict[Any, Path] = {}
        for run in cell.runs:
            if run.seed in seen:
                raise ValueError(
                    f"{seen[run.seed]} and {run.path} are both {cell.label()} with seed {run.seed}; keep one of them"
                )
            seen[run.seed] = run.path
    return cells
