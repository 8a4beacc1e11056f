"""Attention-weight heatmaps of a checkpoint for a prompt: one panel per layer (rows) and head (columns).

    python scripts/attention_map.py outputs/latest --prompt "ROMEO: But soft" --out attention.png

CHECKPOINT is a checkpoint file or a run directory (its best checkpoint). Row i of a panel is query
token i's softmax over the keys it sees (columns), from the explicit attention equation; above the
diagonal is masked (zero). --out without a suffix gets .png; the path written is the one printed; an
existing file is replaced only with --force. A bad input prints one line `error: ...` and writes nothing.
"""

import argparse
import logging
import re
import sys
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from analysis.attention import MAX_MAP_TOKENS, attention_maps, token_label, token_text
from analysis.outputs import check_replaceable
from analysis.trained import load_trained
from cli.errors import exit_with_error
from cli.schema_help import OneLineParser, check_device_option
from generation.generate import encode_prompt
from rundir.records import image_path
from training.runtime import resolve_device

log = logging.getLogger("attention_map")


def plot_attention(maps: torch.Tensor, labels: list[str], path: Path, title: str = "") -> Path:
    """maps (n_layer, n_head, T, T) -> a PNG grid with the token labels on both axes."""
    with matplotlib.rc_context({"text.parse_math": False}), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # a prompt's "$...$" is text (above), a glyph the font lacks a note (below)
        drawn = draw_attention(maps, labels, path, title)
    missing = sorted({chr(int(m[1])) for w in caught if (m := re.match(r"Glyph (\d+) ", str(w.message)))})
    if missing:  # matplotlib warned once per glyph, with its own source line: one line instead
        log.info("note: the font has no glyph for %s; drawn as boxes", ", ".join(repr(c) for c in missing))
    for other in (w for w in caught if not str(w.message).startswith("Glyph ")):
        warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    return drawn


def draw_attention(maps: torch.Tensor, labels: list[str], path: Path, title: str) -> Path:
    L, H, T, _ = maps.shape
    panel = min(max(2.2, 0.16 * T + 0.8), 8.0)
    fig, axes = plt.subplots(L, H, figsize=(panel * H + 1.0, panel * L + 0.6), squeeze=False, layout="constrained")
    every = max(1, T // 48)  # thin the labels of long prompts so they stay readable
    ticks = list(range(0, T, every))
    fontsize = max(4, min(8, int(300 / max(T, 1))))
    for layer in range(L):
        for head in range(H):
            ax = axes[layer][head]
            image = ax.imshow(maps[layer, head].float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {layer}, head {head}", fontsize=8)
            ax.set_xticks(ticks, [labels[i] for i in ticks], rotation=90, fontsize=fontsize)
            ax.set_yticks(ticks, [labels[i] for i in ticks], fontsize=fontsize)
            if layer == L - 1:
                ax.set_xlabel("key", fontsize=8)
            if head == 0:
                ax.set_ylabel("query", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_attention_map(
    checkpoint: Path, prompt: str, out: Path, cache_dir: str = "", device: str = "cpu", force: bool = False
) -> Path:
    """Write the attention maps of `prompt` to an image (an existing one only with `force`); returns the
    path written (see image_path)."""
    path = image_path(Path(out))  # refused before the model is loaded
    check_replaceable(path, force)
    trained = load_trained(checkpoint, resolve_device(device), cache_dir)
    model, tokenizer = trained.model, trained.tokenizer
    ids = encode_prompt(tokenizer, prompt, model.config.vocab_size)
    block_size = model.config.block_size
    keep = min(block_size, MAX_MAP_TOKENS)
    if len(ids) > keep:
        why = f"block_size={block_size}" if keep == block_size else f"a map draws at most {MAX_MAP_TOKENS}"
        log.warning("prompt has %d tokens; keeping the last %d (%s)", len(ids), keep, why)
        ids = ids[-keep:]
    maps, _ = attention_maps(model, torch.tensor(ids))
    labels = [token_label(token_text(tokenizer, i)) for i in ids]
    c = model.config
    shape = f"n_layer={c.n_layer}, n_head={c.n_head}, d_k={c.head_dim}"
    title = f"{Path(checkpoint).name} (step {trained.meta.get('step')}): {shape}, prompt {prompt!r}"
    path.parent.mkdir(parents=True, exist_ok=True)
    return plot_attention(maps, labels, path, title)


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a checkpoint written by train.py, or a run directory")
    parser.add_argument("--prompt", default="ROMEO: But soft, what light", help="text to attend over")
    parser.add_argument("--out", type=Path, default=Path("attention.png"), help="image to write (.png if no suffix)")
    parser.add_argument("--cache-dir", default="", help="data cache (for the gpt2 tokenizer's ranks file)")
    parser.add_argument("--device", default="cpu", help="auto | cpu | cuda | cuda:N | mps")
    parser.add_argument("--force", action="store_true", help="replace the --out image if it exists")
    args = parser.parse_args(argv)
    check_device_option(parser, args.device)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        path = write_attention_map(args.checkpoint, args.prompt, args.out, args.cache_dir, args.device, args.force)
    except (ValueError, OSError) as e:  # FileNotFoundError is an OSError
        exit_with_error(e)
    log.info("wrote %s", path)


if __name__ == "__main__":
    main()
