"""Convert between our checkpoints and Hugging Face GPT-2 directories (needs `pip install transformers`).

    python scripts/convert_hf.py export CHECKPOINT OUT_DIR    # -> OUT_DIR/config.json + model.safetensors
    python scripts/convert_hf.py import HF_DIR CHECKPOINT     # e.g. GPT-2 weights you have on disk

Export takes a GPT-2-compatible checkpoint (learned positions, n_kv_head = n_head, no QK-norm,
d_k = d_model / n_head) and writes a `GPT2LMHeadModel` that `from_pretrained(OUT_DIR)` loads and that
computes the same logits. Import reads a local directory only (no download) and writes a checkpoint
that scripts/sample.py and training.checkpoint.load_model read, with the GPT-2 tokenizer in its
header. A problem the user can fix exits non-zero with one line `error: ...`.
"""

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python scripts/convert_hf.py): make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data.config import DataConfig
from data.tokenizer import GPT2_VOCAB_SIZE
from model import GPT
from model.hf_interop import check_gpt2_compatible, from_hf_gpt2, to_hf_gpt2
from training.checkpoint import load_model, save_checkpoint

GPT2_TOKENIZER_META = {"name": "gpt2"}  # what data.tokenizer.GPT2Tokenizer.to_meta() writes


def require_transformers() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ValueError("this needs the optional package transformers: pip install transformers") from None


def eot_id(tokenizer_meta: dict) -> int | None:
    """The end-of-text id of a checkpoint's tokenizer, which becomes GPT-2's bos/eos token."""
    if tokenizer_meta.get("name") == "gpt2":
        return GPT2_VOCAB_SIZE - 1
    if tokenizer_meta.get("name") == "char":
        return len(tokenizer_meta["chars"])  # CharTokenizer puts EOT after its characters
    return None


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path) -> Path:
    """Our checkpoint -> a GPT2LMHeadModel directory (config.json + model.safetensors)."""
    model, ckpt = load_model(checkpoint)
    check_gpt2_compatible(model.config)  # before asking for transformers: an install would not help
    require_transformers()
    hf = to_hf_gpt2(model, eos_token_id=eot_id(ckpt.meta.get("tokenizer", {})))
    out_dir = Path(out_dir)
    hf.save_pretrained(out_dir)
    return out_dir


def import_hf(hf_dir: str | Path, checkpoint: str | Path) -> tuple[GPT, Path]:
    """A local GPT-2 directory -> our GPT and a checkpoint file with the GPT-2 tokenizer in its header."""
    require_transformers()
    from transformers import GPT2LMHeadModel

    hf_dir = Path(hf_dir)
    if not (hf_dir / "config.json").is_file():
        raise FileNotFoundError(f"{str(hf_dir)!r} is not a Hugging Face model directory (it has no config.json)")
    hf = GPT2LMHeadModel.from_pretrained(hf_dir, local_files_only=True).float()
    model = from_hf_gpt2(hf)
    meta = {
        "step": 0,
        "config": {"model": asdict(model.config), "data": asdict(DataConfig(tokenizer="gpt2"))},
        "tokenizer": GPT2_TOKENIZER_META,
        "source": {"hf_dir": str(hf_dir.resolve())},
    }
    return model, save_checkpoint(checkpoint, model, None, meta)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="our checkpoint -> HF GPT-2 directory")
    export.add_argument("checkpoint")
    export.add_argument("out_dir")
    imp = commands.add_parser("import", help="HF GPT-2 directory -> our checkpoint")
    imp.add_argument("hf_dir")
    imp.add_argument("checkpoint")
    args = parser.parse_args(argv)
    try:
        if args.command == "export":
            print(f"wrote {export_checkpoint(args.checkpoint, args.out_dir)}")
        else:
            model, path = import_hf(args.hf_dir, args.checkpoint)
            print(f"wrote {path} ({model.num_params() / 1e6:.1f}M parameters)")
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
