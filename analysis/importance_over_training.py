"""Head importance over training: Michel et al.'s two measures for every step checkpoint of a run.

For each RUN/checkpoints/step_NNNNNNN.safetensors, oldest first, on the same fixed windows
(analysis/fixed_windows.py): the loss change when each head alone is masked, and the paper's
per-layer normalised |dL/dgate| (analysis/head_importance.head_scores: the numbers the one-checkpoint
report gives for that checkpoint). A run keeps only its newest `keep_last` step checkpoints; one trained
with keep_last=null keeps every one. Written as JSON (the lab's Runs tab reads it from RUN/), CSV (a row
per checkpoint), Markdown (heads as rows, steps as columns) and a PNG (a line per head against the step,
a panel per measure).
"""

import csv
import io
import json
import logging
import shlex
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt
import torch

from analysis.fixed_windows import check_tokens_asked, val_windows, window_length
from analysis.head_importance import head_scores
from analysis.outputs import check_out_dir, check_replaceable
from analysis.trained import Trained, load_trained
from data.text_file import Refused, read_json
from rundir.checkpoints import checkpoint_step

log = logging.getLogger(__name__)
STEM = "head_importance_over_training"
OUTPUTS = tuple(f"{STEM}.{ext}" for ext in ("json", "csv", "md", "png"))
MEASURES = {  # key in the results -> what it is (a panel of the plot, a table of the report)
    "delta_loss": "loss change, head alone masked (nats)",
    "importance": "importance |dL/dgate|, per-layer normalised",
}
PER_HEAD = (*MEASURES, "importance_raw")  # the (L, H) grids kept for every step


def command(run: Path) -> str:
    return f"python scripts/head_importance.py {shlex.quote(str(run))} --over-training"


def step_checkpoints(run: Path) -> list[tuple[int, Path]]:
    """(step, path) of every RUN/checkpoints/step_NNNNNNN.safetensors, oldest first."""
    if not run.is_dir():
        what = "is a file" if run.exists() else "does not exist"
        raise FileNotFoundError(f"run directory {str(run)!r} {what}; --over-training takes a run directory")
    folder = run / "checkpoints"
    if not folder.is_dir():
        raise FileNotFoundError(f"{str(run)!r} is not a run directory (it has no checkpoints/); give a run directory")
    found = sorted((step, p) for p in folder.glob("step_*.safetensors") if (step := checkpoint_step(p)) is not None)
    if not found:
        raise FileNotFoundError(
            f"{str(folder)!r} holds no step checkpoint (step_NNNNNNN.safetensors); a run saves one every "
            "eval_interval steps, and keeps every one with keep_last=null"
        )
    return found


def check_same_model(first: Trained, other: Trained) -> None:
    """Every checkpoint is measured on the first one's windows: its heads and token ids must mean the same."""
    a, b = first.model.config, other.model.config
    shape_a, shape_b = (a.n_layer, a.n_head, a.block_size), (b.n_layer, b.n_head, b.block_size)
    if shape_a != shape_b:
        raise ValueError(
            f"{other.path.name} has (n_layer, n_head, block_size) {shape_b}, {first.path.name} {shape_a}; "
            "the checkpoints of one run share one model shape"
        )
    if other.meta.get("tokenizer") != first.meta.get("tokenizer"):
        raise ValueError(f"{other.path.name} has another tokenizer than {first.path.name}; give one run's checkpoints")


def score_run(
    run: Path, checkpoints: list[tuple[int, Path]], tokens: int, device: torch.device, text: Path | None = None
) -> dict[str, Any]:
    """Both measures of every head at each (step, path) of `run`'s `checkpoints`, as plain lists by step."""
    results: dict[str, Any] = {"run": str(run), "steps": [], "checkpoints": [], "base_loss": []}
    results |= {key: [] for key in PER_HEAD}
    first, batches = None, []
    for step, path in checkpoints:
        try:
            trained = load_trained(path, device)
        except FileNotFoundError:
            if path.exists() or path.is_symlink():
                raise
            # listed, then rotated away by the live run (it keeps its newest keep_last): "does not exist; give
            # a checkpoint file or a run directory" blamed the path the user gave
            log.warning("%s was removed by the run while this measured its checkpoints; skipped", path.name)
            continue
        if first is None:  # the windows are the first checkpoint's, and every other is checked against it
            first, batches = trained, val_windows(trained, tokens, text)
        check_same_model(first, trained)
        scores = head_scores(trained.model, batches)
        results["steps"].append(step)
        results["checkpoints"].append(path.name)
        for key in ("base_loss", *PER_HEAD):
            results[key].append(scores[key])
        log.info("%s: %.4f nats with every head on", path.name, scores["base_loss"])
    if first is None:
        raise FileNotFoundError(f"every step checkpoint of {run} was removed while it was read; try again")
    c = first.model.config
    results["shape"] = {"n_layer": c.n_layer, "n_head": c.n_head}
    results["tokens"] = sum(x.numel() for x, _ in batches)
    results["window"] = window_length(first)
    results["data"] = str(text) if text else "validation split"
    return results


def head_names(results: dict[str, Any]) -> list[tuple[int, int]]:
    return [(layer, head) for layer in range(results["shape"]["n_layer"]) for head in range(results["shape"]["n_head"])]


def csv_text(results: dict[str, Any]) -> str:
    """A row per checkpoint: step, checkpoint, base_loss, then each measure of each head (`delta_loss_l0_h1`)."""
    heads = head_names(results)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["step", "checkpoint", "base_loss", *(f"{k}_l{i}_h{j}" for k in PER_HEAD for i, j in heads)])
    for s, step in enumerate(results["steps"]):
        values = [results[k][s][i][j] for k in PER_HEAD for i, j in heads]
        writer.writerow([step, results["checkpoints"][s], results["base_loss"][s], *values])
    return out.getvalue()


def markdown(results: dict[str, Any]) -> str:
    steps = results["steps"]
    parts = [
        f"# Head importance over training: {results['run']}",
        "",
        f"{len(steps)} step checkpoints, each measured on the same {results['tokens']} tokens of the "
        f"{results['data']} in windows of {results['window']}. Rows are heads (layer.head), columns steps.",
        "",
    ]
    for key, title in MEASURES.items():
        parts += [f"{title[0].upper()}{title[1:]}:", "", "| head \\ step | " + " | ".join(map(str, steps)) + " |"]
        parts += ["|---:|" + "---:|" * len(steps)]
        if key == "delta_loss":  # what each change is a change of
            parts += ["| all heads on (loss) | " + " | ".join(f"{v:.4f}" for v in results["base_loss"]) + " |"]
        sign = "+" if key == "delta_loss" else ""  # a change has a sign; the paper's score is >= 0
        for i, j in head_names(results):
            cells = [f"{grid[i][j]:{sign}.4f}" for grid in results[key]]
            parts += [f"| {i}.{j} | " + " | ".join(cells) + " |"]
        parts += [""]
    parts += [f"![importance against step]({OUTPUTS[3]})"]
    return "\n".join(parts) + "\n"


def plot(results: dict[str, Any], path: Path) -> Path:
    """A panel per measure, a line per head against the step; with markers, so a run of one checkpoint
    still shows its points."""
    heads = head_names(results)
    fig, axes = plt.subplots(1, len(MEASURES), figsize=(6 * len(MEASURES) + 1.5, 4.2), squeeze=False)
    colours = plt.cm.tab20([k % 20 / 19 for k in range(len(heads))])
    for ax, (key, title) in zip(axes[0], MEASURES.items(), strict=True):
        for colour, (i, j) in zip(colours, heads, strict=True):
            values = [grid[i][j] for grid in results[key]]
            ax.plot(results["steps"], values, marker="o", ms=3, lw=1.3, color=colour, label=f"layer {i} head {j}")
        ax.set_xlabel("step")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.suptitle(f"Head importance over training (Michel et al. 2019): {results['run']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_importance_over_training(
    run: Path, out: Path, tokens: int, device: torch.device, text: Path | None = None, force: bool = False
) -> list[Path]:
    """Score every step checkpoint of `run` and write the four files into `out`; their paths."""
    check_tokens_asked(tokens)
    checkpoints = step_checkpoints(run)  # first: a target that is no run is named as that, not as a bad --out
    check_out_dir(out)
    for name in OUTPUTS:  # before measuring: a second call must not replace the first's files unasked
        check_replaceable(out / name, force)
    results = score_run(run, checkpoints, tokens, device, text)
    out.mkdir(parents=True, exist_ok=True)
    (out / OUTPUTS[0]).write_text(json.dumps(results, indent=1) + "\n")
    (out / OUTPUTS[1]).write_text(csv_text(results))
    (out / OUTPUTS[2]).write_text(markdown(results))
    plot(results, out / OUTPUTS[3])
    return [out / name for name in OUTPUTS]


def check_results(results: Any) -> None:
    """ValueError unless `results` has the shape score_run gives: a grid of (n_layer, n_head) numbers per step."""
    keys = ("run", "steps", "checkpoints", "shape", "tokens", "data", "base_loss", *PER_HEAD)
    if missing := [key for key in keys if key not in results]:
        raise ValueError(f"no {', '.join(missing)}")
    L, H = results["shape"]["n_layer"], results["shape"]["n_head"]
    n = len(results["steps"])
    if len(results["base_loss"]) != n or not all(map(is_number, results["base_loss"])):
        raise ValueError("base_loss does not hold one number per step")
    for key in PER_HEAD:
        grids = results[key]
        if len(grids) != n or not all(
            len(g) == L and all(len(r) == H and all(map(is_number, r)) for r in g) for g in grids
        ):
            raise ValueError(f"{key} does not hold one ({L}, {H}) grid of numbers per step")


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_importance_over_training(run: Path) -> dict[str, Any]:
    """What `--over-training` wrote into RUN; FileNotFoundError naming the command that writes it."""
    path = run / OUTPUTS[0]
    if not path.is_file():
        raise FileNotFoundError(f"{str(run)!r} has no {OUTPUTS[0]} yet; write it with: {command(run)}")
    try:
        results = read_json(path)
        check_results(results)
    except (OSError, ValueError, KeyError, TypeError) as e:  # ValueError: bad JSON or UTF-8, or a wrong shape
        problem = e.reason if isinstance(e, Refused) else f"{type(e).__name__}: {e}"
        raise ValueError(
            f"{str(path)!r} cannot be read ({problem}); write it again with: {command(run)} --force"
        ) from None
    return results
