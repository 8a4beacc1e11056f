"""Head importance of a checkpoint (Michel et al. 2019): a Markdown table and PNG plots; or of every step
checkpoint of a run, against the step (--over-training).

    python scripts/head_importance.py outputs/DATE/TIME [--out DIR] [--tokens 16384] [--device cpu]
    python scripts/head_importance.py path/to/best.safetensors --text some.txt
    python scripts/head_importance.py outputs/DATE/TIME --over-training [--out DIR]

A run directory means its checkpoints/best.safetensors. The loss is measured on fixed windows as long as
the sequences the model trained on (model.train_block_size, else block_size): about --tokens of the
checkpoint's own validation split (its data config, prepared or reused from the cache) in windows drawn at
random positions with a fixed seed; or consecutive windows of --text. Writes head_importance.md,
head_importance.json, head_heatmaps.png and pruning_curve.png (an existing one is replaced only with --force).

--over-training measures the two importances (the loss change with a head alone masked, and the
paper's |dL/dgate|) at every RUN/checkpoints/step_*.safetensors on the same windows, and writes
head_importance_over_training.{json,csv,md,png} into RUN (or --out), where the lab's Runs tab finds
them. A run keeps only its newest 2 step checkpoints unless trained with keep_last=null (every one).
"""

import argparse
import json
import logging
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from analysis.fixed_windows import BATCH_SIZE, check_tokens_asked, val_windows, window_length
from analysis.head_importance import attention_stats, head_scores, pruning_curve, uniform_entropy
from analysis.importance_over_training import write_importance_over_training
from analysis.outputs import check_out_dir, check_replaceable
from analysis.trained import load_trained
from cli.errors import exit_with_error
from cli.schema_help import OneLineParser, check_device_option
from training.runtime import resolve_device

log = logging.getLogger("head_importance")
STATS_WINDOWS = 32  # attention statistics walk one window at a time: the first 32 windows are plenty
OUTPUTS = ("head_importance.json", "head_heatmaps.png", "pruning_curve.png", "head_importance.md")
PANELS = {  # key in the results -> heatmap title
    "delta_loss": "loss change, head alone masked (nats)",
    "importance": "importance |dL/dgate|, per-layer normalised",
    "entropy": "attention entropy (nats)",
    "first_position": "attention mass on position 0",
    "previous_token": "attention on the previous token",
}


def analyse(target: Path, tokens: int, device: torch.device, text: Path | None) -> dict:
    """Every measurement, as plain lists (layer-major), with what was measured on."""
    trained = load_trained(target, device)
    model, c = trained.model, trained.model.config
    batches = val_windows(trained, tokens, text)
    scores = head_scores(model, batches)
    stats = attention_stats(model, [row for x, _ in batches for row in x][:STATS_WINDOWS])
    curve = pruning_curve(model, batches, torch.tensor(scores["importance"]))
    window = window_length(trained)
    return {
        "checkpoint": str(trained.path),
        "step": trained.meta.get("step"),
        "shape": {"n_layer": c.n_layer, "n_head": c.n_head, "d_k": c.head_dim, "n_kv_head": c.kv_heads},
        "tokens": sum(x.numel() for x, _ in batches),
        "window": window,
        "uniform_entropy": [uniform_entropy(window, c.layer_window(i)) for i in range(c.n_layer)],
        "data": str(text) if text else "validation split",
        **scores,  # base_loss, delta_loss, importance, importance_raw
        "entropy": stats.entropy.tolist(),
        "first_position": stats.first_position.tolist(),
        "previous_token": stats.previous_token.tolist(),
        "pruning_curve": curve,
    }


def plot_heatmaps(results: dict, path: Path) -> Path:
    L, H = results["shape"]["n_layer"], results["shape"]["n_head"]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(len(PANELS) * (0.55 * H + 1.8), 0.5 * L + 2.2), squeeze=False)
    for ax, (key, title) in zip(axes[0], PANELS.items(), strict=True):
        grid = np.array(results[key])
        image = ax.imshow(grid, cmap="magma" if key == "delta_loss" else "viridis", aspect="auto")
        middle = (grid.min() + grid.max()) / 2  # both colour maps are bright at the top: dark text there
        for (i, j), value in np.ndenumerate(grid):
            color = "black" if value > middle else "white"
            ax.text(j, i, f"{value:.3f}", ha="center", va="center", fontsize=7, color=color)
        ax.set_xticks(range(H))
        ax.set_yticks(range(L))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(title, fontsize=8)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_pruning(results: dict, path: Path) -> Path:
    fractions, losses = zip(*results["pruning_curve"], strict=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(fractions, losses, marker="o")
    ax.axhline(results["base_loss"], color="grey", ls="--", lw=1, label="all heads on")
    ax.set_xlabel("fraction of heads removed (least important first)")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title("Greedy head pruning (Michel et al. 2019)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def head_table(results: dict) -> list[str]:
    lines = ["| layer | head | Δ loss masked | importance (norm.) | importance (raw) | entropy | mass on pos 0 "
             "| previous token |", "|" + "---:|" * 8]  # fmt: skip
    for layer, row in enumerate(results["delta_loss"]):
        for head, delta in enumerate(row):
            values = [results[k][layer][head] for k in ("importance", "importance_raw", "entropy")]
            values += [results[k][layer][head] for k in ("first_position", "previous_token")]
            lines.append(f"| {layer} | {head} | {delta:+.4f} | " + " | ".join(f"{v:.4f}" for v in values) + " |")
    return lines


def findings(results: dict) -> list[str]:
    """Sentences from the numbers: the heads that matter, the cheap ones, the pruning cost."""
    delta = np.array(results["delta_loss"])
    worst, best = np.unravel_index(delta.argmax(), delta.shape), np.unravel_index(delta.argmin(), delta.shape)
    curve = results["pruning_curve"]
    half = min(curve, key=lambda p: abs(p[0] - 0.5))
    prev = np.array(results["previous_token"])
    out = [
        f"- All heads on: {results['base_loss']:.4f} nats/token on {results['tokens']} tokens.",
        f"- Masking head (layer {worst[0]}, head {worst[1]}) alone costs the most: {delta.max():+.4f} nats; "
        f"the cheapest, (layer {best[0]}, head {best[1]}), changes the loss by {delta.min():+.4f}.",
        f"- {int((delta < 0.01).sum())} of {delta.size} heads cost under 0.01 nats each when masked alone.",
        f"- Removing {half[0]:.0%} of the heads in importance order: {half[1]:.4f} nats "
        f"({half[1] - results['base_loss']:+.4f}); all heads off: {curve[-1][1]:.4f}.",
    ]
    heads = [f"(layer {i}, head {j}): {prev[i, j]:.2f}" for i, j in zip(*np.nonzero(prev > 0.5), strict=True)]
    out.append(f"- Previous-token heads (mean weight on t - 1 above 0.5): {', '.join(heads) or 'none'}.")
    return out


def uniform_text(per_layer: list[float]) -> str:
    """The most diffuse a head can be: one figure, or one per layer where sliding windows make them differ."""
    if len(set(per_layer)) == 1:
        return f"{per_layer[0]:.3f} nats"
    return "by layer (its window of keys) " + ", ".join(f"{value:.3f}" for value in per_layer) + " nats"


def markdown(results: dict) -> str:
    s = results["shape"]
    delta = results["delta_loss"]
    grid = ["| layer \\ head | " + " | ".join(str(h) for h in range(s["n_head"])) + " |"]
    grid += ["|---:|" + "---:|" * s["n_head"]]
    grid += [f"| {i} | " + " | ".join(f"{v:+.4f}" for v in row) + " |" for i, row in enumerate(delta)]
    parts = [
        f"# Head importance: {results['checkpoint']} (step {results['step']})",
        "",
        f"n_layer={s['n_layer']}, n_head={s['n_head']}, d_k={s['d_k']}, n_kv_head={s['n_kv_head']}; "
        f"{results['tokens']} tokens of the {results['data']} in windows of {results['window']}. "
        f"Entropy of uniform attention over these windows: {uniform_text(results['uniform_entropy'])}.",
        "",
        *findings(results),
        "",
        "Loss change when each head alone is masked (nats/token):",
        "",
        *grid,
        "",
        *head_table(results),
        "",
        "![per-head heatmaps](head_heatmaps.png)",
        "",
        "![pruning curve](pruning_curve.png)",
    ]
    return "\n".join(parts) + "\n"


def write_head_importance(
    target: Path, out: Path, tokens: int, device: str, text: Path | None = None, force: bool = False
) -> Path:
    check_tokens_asked(tokens)
    check_out_dir(out)
    for name in OUTPUTS:  # before measuring: a second run must not replace the first's report unasked
        check_replaceable(out / name, force)
    results = analyse(target, tokens, resolve_device(device), text)
    out.mkdir(parents=True, exist_ok=True)
    (out / OUTPUTS[0]).write_text(json.dumps(results, indent=1) + "\n")
    plot_heatmaps(results, out / OUTPUTS[1])
    plot_pruning(results, out / OUTPUTS[2])
    (out / OUTPUTS[3]).write_text(markdown(results))
    return out / OUTPUTS[3]


def main() -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", type=Path, help="a .safetensors checkpoint, or a run directory")
    parser.add_argument(
        "--out", type=Path, default=None, help="directory to write to (head_importance; RUN with --over-training)"
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=16384,
        help=f"tokens to measure on: validation windows in whole batches of {BATCH_SIZE} (rounded up), or at most "
        "this many of --text in whole windows; at least one batch (one window with --text)",
    )
    parser.add_argument("--device", default="cpu", help="auto | cpu | cuda | cuda:N | mps")
    parser.add_argument("--text", type=Path, default=None, help="measure on this text file instead of val data")
    parser.add_argument("--force", action="store_true", help="replace the report files if --out holds them")
    parser.add_argument(
        "--over-training",
        action="store_true",
        help="target is a run directory: measure every step checkpoint and plot importance against the step",
    )
    args = parser.parse_args()
    check_device_option(parser, args.device)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.over_training:
            out, device = args.out or args.target, resolve_device(args.device)
            paths = write_importance_over_training(args.target, out, args.tokens, device, args.text, args.force)
        else:
            out = args.out or Path("head_importance")
            paths = [write_head_importance(args.target, out, args.tokens, args.device, args.text, args.force)]
    except (ValueError, OSError) as e:  # OSError: an --out the system refuses (read-only, a name too long)
        exit_with_error(e)
    for path in paths:
        log.info("wrote %s", path)


if __name__ == "__main__":
    main()
