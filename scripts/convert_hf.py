"""Convert between our checkpoints and Hugging Face GPT-2 directories (needs `pip install transformers`).

    python scripts/convert_hf.py export CHECKPOINT_OR_RUN_DIR OUT_DIR [--force]   # -> OUT_DIR, a GPT-2 model
    python scripts/convert_hf.py import HF_DIR CHECKPOINT [--force]               # GPT-2 weights on disk -> ours

Export takes a GPT-2-compatible checkpoint (learned positions, n_kv_head = n_head, no QK-norm,
d_k = d_model / n_head) and writes a `GPT2LMHeadModel` (config.json, model.safetensors) that
computes the same logits, and the checkpoint's tokenizer (tokenizer.json: char, learned BPE or GPT-2 BPE), so
`transformers.pipeline("text-generation", model=OUT_DIR)` generates what scripts/sample.py does.
Import reads a local directory's safetensors weights only (a pickle `pytorch_model.bin` is refused,
never loaded) and writes a checkpoint that scripts/sample.py reads, with the GPT-2 tokenizer in its
header (or its own char or learned BPE, for a directory this script exported). Neither replaces an existing
target without --force, and then the new one is written beside it first and renamed into place, so
a failure leaves the old one. A problem the user can fix exits non-zero with one line `error: ...`,
touching nothing.
"""

import json
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import safetensors

if __package__ in (None, ""):  # run as a file (python scripts/convert_hf.py): make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.trained import find_checkpoint, load_model, saved_cache_dir
from cli.schema_help import OneLineParser
from data.config import DataConfig
from data.tokenizer import GPT2_VOCAB_SIZE, tokenizer_from_meta
from interop.hf_model import check_gpt2_compatible, from_hf_gpt2, to_hf_gpt2
from interop.hf_tokenizer import read_own_tokenizer, save_hf_tokenizer
from model import GPT
from rundir.checkpoint import looks_like_pickle, save_checkpoint

if TYPE_CHECKING:
    from transformers import GPT2LMHeadModel

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
    if tokenizer_meta.get("name") == "bpe":
        return 0  # BPETokenizer puts EOT first
    return None


def check_writable_target(path: Path, what: str, force: bool, is_dir: bool) -> None:
    """Refuse a target that exists (without --force), is the wrong kind, or sits under a file."""
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"cannot write {what} {str(path)!r}: {str(parent)!r} is a file, not a directory")
    if not path.exists() and not path.is_symlink():
        return
    if is_dir and not path.is_dir():
        raise ValueError(f"{what} {str(path)!r} is an existing file; give a directory to write the model into")
    if not is_dir and path.is_dir():
        raise ValueError(f"{what} {str(path)!r} is a directory; give a .safetensors file path")
    if is_dir and not any(path.iterdir()):
        return  # an empty directory holds nothing to lose
    if not force:
        raise ValueError(f"{what} {str(path)!r} already exists; pass --force to replace it")


def replace_dir(staged: Path, target: Path) -> None:
    """Move a fully written directory into place; an existing target is renamed away first, then removed."""
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists() or target.is_symlink():
        os.rename(target, old)
    os.rename(staged, target)
    if old.is_symlink():  # a link given as the target: it goes, what it pointed at stays (rmtree refuses links)
        old.unlink()
    shutil.rmtree(old, ignore_errors=True)


def gpt2_ranks(tokenizer_meta: dict, cache_dir: str) -> dict[bytes, int] | None:
    """tiktoken's GPT-2 ranks for a gpt2 checkpoint (cached, or fetched once as training does)."""
    if tokenizer_meta.get("name") != "gpt2":
        return None
    return tokenizer_from_meta(tokenizer_meta, cache_dir).encoding._mergeable_ranks


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path, force: bool = False) -> Path:
    """Our checkpoint (or run directory) -> a GPT2LMHeadModel directory with its tokenizer."""
    out_dir = Path(out_dir)
    check_writable_target(out_dir, "export directory", force, is_dir=True)
    model, ckpt = load_model(find_checkpoint(checkpoint))
    check_gpt2_compatible(model.config)  # before asking for transformers: an install would not help
    require_transformers()
    tokenizer_meta = ckpt.meta.get("tokenizer")
    if not isinstance(tokenizer_meta, dict):
        raise ValueError(f"checkpoint {str(checkpoint)!r} has no tokenizer in its header")
    ranks = gpt2_ranks(tokenizer_meta, saved_cache_dir(ckpt.meta))
    hf = to_hf_gpt2(model, eos_token_id=eot_id(tokenizer_meta))
    staged = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    try:
        staged.parent.mkdir(parents=True, exist_ok=True)
        hf.save_pretrained(staged)
        save_hf_tokenizer(tokenizer_meta, staged, ranks)
        umask = os.umask(0)
        os.umask(umask)
        for file in staged.iterdir():  # transformers writes the weights 0600: others could not load them
            file.chmod(0o666 & ~umask)
        replace_dir(staged, out_dir)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return out_dir


def weight_files(hf_dir: Path) -> list[Path]:
    """model.safetensors, or the shards model.safetensors.index.json names; [] where there are neither."""
    if (hf_dir / "model.safetensors").is_file():
        return [hf_dir / "model.safetensors"]
    index = hf_dir / "model.safetensors.index.json"
    if not index.is_file():
        return []
    try:
        shards = json.loads(index.read_text(errors="replace"))["weight_map"].values()
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise ValueError(f"{str(index)!r} is not a safetensors index (a JSON object with a weight_map)") from None
    return [hf_dir / name for name in sorted(set(map(str, shards)))]


def check_safetensors_header(path: Path) -> None:
    """Read a weights file's header, as transformers will, so a damaged one is named here in one line."""
    try:
        with safetensors.safe_open(str(path), framework="pt"):
            pass
    except Exception as e:  # safetensors raises several types for truncated or foreign files
        with open(path, "rb") as f:
            if looks_like_pickle(f.read(9)):
                raise ValueError(
                    f"{str(path)!r} is a pickle/torch.save file, not safetensors; only safetensors weights are read, "
                    "never pickles"
                ) from None
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{str(path)!r} is not a readable safetensors file ({msg})") from None


def check_safetensors_weights(hf_dir: Path) -> None:
    """Refuse a directory whose weights are only pickles (transformers would torch.load them), or whose
    safetensors weights are damaged."""
    files = weight_files(hf_dir)
    if files:
        for path in files:
            if not path.is_file():
                raise FileNotFoundError(f"{str(path)!r}, a shard the safetensors index names, does not exist")
            check_safetensors_header(path)
        return
    pickles = sorted(p.name for p in hf_dir.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
    found = f"it has {', '.join(pickles)}, a pickle" if pickles else "it has no weights"
    raise ValueError(
        f"{str(hf_dir)!r} has no model.safetensors ({found}); only safetensors weights are read, never pickles"
    )


def load_hf_gpt2(hf_dir: Path) -> "GPT2LMHeadModel":
    """hf_dir's GPT2LMHeadModel in float32; ValueError (one line) for a config.json that does not build one
    or weights that do not fit it. transformers' own load report is kept quiet: this names the problem."""
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    try:
        config = json.loads((hf_dir / "config.json").read_bytes())
    except ValueError:  # not JSON, or not UTF-8
        config = None
    if not isinstance(config, dict):
        raise ValueError(f"{str(hf_dir)!r}: its config.json is not a JSON object")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        # mismatched sizes come back in the loading info (named below) instead of a RuntimeError that points
        # at the report; missing weights would otherwise start from random values, with a warning only
        hf, info = GPT2LMHeadModel.from_pretrained(
            hf_dir, local_files_only=True, use_safetensors=True, output_loading_info=True, ignore_mismatched_sizes=True
        )
    except Exception as e:  # a field of the wrong type or value: TypeError, ValueError, huggingface_hub's own
        msg = " ".join(line.strip() for line in str(e).splitlines()) or type(e).__name__  # its cause on line 2
        raise ValueError(f"{str(hf_dir)!r} does not load as a GPT-2 model ({msg})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if info["mismatched_keys"]:
        name, stored, wanted = sorted(info["mismatched_keys"])[0]
        raise ValueError(
            f"{str(hf_dir)!r}: its weights do not fit its config.json: {name} has shape {tuple(stored)}, "
            f"the config gives {tuple(wanted)}"
        )
    if info["missing_keys"]:
        missing = ", ".join(sorted(info["missing_keys"]))
        raise ValueError(f"{str(hf_dir)!r}: its weights lack {missing}, which the model needs")
    return hf.float()


def import_hf(hf_dir: str | Path, checkpoint: str | Path, force: bool = False) -> tuple[GPT, Path]:
    """A local GPT-2 directory -> our GPT and a checkpoint file with the GPT-2 tokenizer in its header."""
    hf_dir, checkpoint = Path(hf_dir), Path(checkpoint)
    check_writable_target(checkpoint, "checkpoint", force, is_dir=False)
    if not (hf_dir / "config.json").is_file():
        raise FileNotFoundError(f"{str(hf_dir)!r} is not a Hugging Face model directory (it has no config.json)")
    check_safetensors_weights(hf_dir)
    require_transformers()
    model = from_hf_gpt2(load_hf_gpt2(hf_dir))
    tokenizer = read_own_tokenizer(hf_dir) or GPT2_TOKENIZER_META  # our own exports come back as they left
    meta = {
        "step": 0,
        "config": {"model": asdict(model.config), "data": asdict(DataConfig(tokenizer=tokenizer["name"]))},
        "tokenizer": tokenizer,
        "source": {"hf_dir": str(hf_dir.resolve())},
    }
    return model, save_checkpoint(checkpoint, model, None, meta)  # written beside, then renamed


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    export = commands.add_parser("export", help="our checkpoint -> HF GPT-2 directory with its tokenizer")
    export.add_argument("checkpoint", help="a checkpoint file or a run directory (its best checkpoint)")
    export.add_argument("out_dir", help="the directory to write (refused if it exists and is not empty)")
    imp = commands.add_parser("import", help="HF GPT-2 directory (safetensors) -> our checkpoint")
    imp.add_argument("hf_dir")
    imp.add_argument("checkpoint", help="the .safetensors file to write (refused if it exists)")
    for sub in (export, imp):
        sub.add_argument(
            "--force", action="store_true", help="replace an existing target (written beside, then renamed)"
        )
    args = parser.parse_args(argv)
    try:
        if args.command == "export":
            out = export_checkpoint(args.checkpoint, args.out_dir, args.force)
            print(f"wrote {out}/ ({', '.join(sorted(p.name for p in out.iterdir()))})")
        else:
            model, path = import_hf(args.hf_dir, args.checkpoint, args.force)
            print(f"wrote {path} ({model.num_params() / 1e6:.2f}M parameters)")  # as the training header
    except (ValueError, OSError) as e:  # FileNotFoundError is an OSError
        sys.exit(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


if __name__ == "__main__":
    main()
