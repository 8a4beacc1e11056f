"""Convert between our checkpoints and Hugging Face GPT-2 directories (needs `pip install transformers`).

    python scripts/convert_hf.py export CHECKPOINT_OR_RUN_DIR OUT_DIR [--force]   # -> OUT_DIR, a GPT-2 model
    python scripts/convert_hf.py import HF_DIR CHECKPOINT [--force]               # GPT-2 weights on disk -> ours

Export takes a GPT-2-compatible checkpoint (learned positions, n_kv_head = n_head, no QK-norm,
d_k = d_model / n_head) and writes a `GPT2LMHeadModel` (config.json, model.safetensors) that
computes the same logits, and the checkpoint's tokenizer (tokenizer.json: char, learned BPE or GPT-2 BPE), so
`transformers.pipeline("text-generation", model=OUT_DIR)` generates what scripts/sample.py does; a model
with a tensor GPT-2 has no place for, or whose GPT-2 logits differ from ours on a probe batch, is refused.
Import reads a local directory's safetensors weights only (a pickle `pytorch_model.bin` is refused,
never loaded), checks config.json's sizes against their header before building anything, and writes a
checkpoint that scripts/sample.py reads, with the GPT-2 tokenizer in its header (or its own char or
learned BPE, for a directory this script exported). Neither replaces an existing
target without --force, and then the new one is written beside it first and renamed into place, so
a failure leaves the old one. --force replaces only an earlier export (its attnlab_export.json lists what it
wrote) or an earlier import, never a directory holding the checkpoint being exported, a run's checkpoint, nor an
imported directory's own file.
A problem the user can fix exits non-zero with one line `error: ...`, touching nothing.
"""

import contextlib
import json
import math
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import safetensors

if __package__ in (None, ""):  # run as a file (python scripts/convert_hf.py): make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.trained import find_checkpoint, load_model, saved_cache_dir
from cli.errors import error_line, exit_with_error
from cli.schema_help import OneLineParser
from data.config import DataConfig
from data.text_file import NotJSON, Refused, read_json
from data.tokenizer import GPT2_VOCAB_SIZE, tokenizer_from_meta
from interop.hf_model import (
    check_gpt2_compatible,
    check_weights_fit,
    clip,
    from_hf_gpt2,
    gpt2_shapes,
    listing,
    to_hf_gpt2,
)
from interop.hf_tokenizer import read_own_tokenizer, save_hf_tokenizer
from model import GPT
from rundir.checkpoint import looks_like_pickle, read_header, save_checkpoint

if TYPE_CHECKING:
    from transformers import GPT2Config, GPT2LMHeadModel

GPT2_TOKENIZER_META = {"name": "gpt2"}  # what data.tokenizer.GPT2Tokenizer.to_meta() writes
EXPORT_MARKER = "attnlab_export.json"  # in every export: its source and the files it wrote


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


def check_replaceable_export(out_dir: Path, sources: list[Path]) -> None:
    """Refuse to replace a directory that is not an earlier export, or that holds the checkpoint being exported
    (`export outputs/run1 outputs --force` deleted run1 and every other run under outputs)."""
    if out_dir.is_symlink() or not out_dir.is_dir() or not any(out_dir.iterdir()):
        return  # nothing to lose: a link goes, what it points at stays
    where = f"export directory {str(out_dir)!r}"
    for source in sources:
        if out_dir.resolve() in (source.resolve(), *source.resolve().parents):
            raise ValueError(f"{where} holds the checkpoint being exported ({str(source)!r}); --force would delete it")
    try:
        files = read_json(out_dir / EXPORT_MARKER)["files"]
    except (OSError, ValueError, KeyError, TypeError):
        files = None
    if not isinstance(files, list):
        raise ValueError(
            f"{where} is not an earlier export (it has no {EXPORT_MARKER}); --force replaces only those: "
            "remove it yourself or choose another directory"
        )
    others = [p.name for p in sorted(out_dir.iterdir()) if p.name not in [*files, EXPORT_MARKER] or p.is_dir()]
    if others:
        them = "it" if len(others) == 1 else "them"
        raise ValueError(
            f"{where} holds {listing(others)}, which no export wrote; --force would delete {them}: "
            f"move {them} away or choose another directory"
        )


def replace_dir(staged: Path, target: Path) -> None:
    """Move a fully written directory into place; an existing target is renamed away first, then removed."""
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists() or target.is_symlink():
        os.rename(target, old)
    try:
        os.rename(staged, target)
    except OSError:
        if old.exists() or old.is_symlink():
            os.rename(old, target)  # the earlier one back in place
        raise
    if old.is_symlink():  # a link given as the target: it goes, what it pointed at stays (rmtree refuses links)
        old.unlink()
    shutil.rmtree(old, ignore_errors=True)


def gpt2_ranks(tokenizer_meta: dict, cache_dir: str) -> dict[bytes, int] | None:
    """tiktoken's GPT-2 ranks for a gpt2 checkpoint (cached, or fetched once as training does)."""
    if tokenizer_meta.get("name") != "gpt2":
        return None
    return tokenizer_from_meta(tokenizer_meta, cache_dir).encoding._mergeable_ranks


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No "Writing model shards" bar above the one line the export ends with (or its error)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path, force: bool = False) -> Path:
    """Our checkpoint (or run directory) -> a GPT2LMHeadModel directory with its tokenizer."""
    out_dir = Path(out_dir)
    check_writable_target(out_dir, "export directory", force, is_dir=True)
    source = find_checkpoint(checkpoint)
    check_replaceable_export(out_dir, [Path(checkpoint), source])
    model, ckpt = load_model(source)
    check_gpt2_compatible(model.config)  # before asking for transformers: an install would not help
    require_transformers()
    tokenizer_meta = ckpt.meta.get("tokenizer")
    if not isinstance(tokenizer_meta, dict):
        raise ValueError(f"checkpoint {str(checkpoint)!r} has no tokenizer in its header")
    ranks = gpt2_ranks(tokenizer_meta, saved_cache_dir(ckpt.meta))
    hf = to_hf_gpt2(model, eos_token_id=eot_id(tokenizer_meta))  # refuses a model GPT-2 does not compute
    target = Path(os.path.abspath(out_dir))  # "." has no name to stage beside
    staged = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        staged.parent.mkdir(parents=True, exist_ok=True)
        with quiet_transformers():
            hf.save_pretrained(staged)
        save_hf_tokenizer(tokenizer_meta, staged, ranks)
        written = sorted(p.name for p in staged.iterdir())
        marker = {"source": str(source.resolve()), "step": ckpt.meta.get("step"), "files": written}
        (staged / EXPORT_MARKER).write_text(json.dumps(marker, indent=1) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        for file in staged.iterdir():  # transformers writes the weights 0600: others could not load them
            file.chmod(0o666 & ~umask)
        replace_dir(staged, target)
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
        shards = read_json(index)["weight_map"].values()
    except Refused as e:
        raise ValueError(f"{e}; a safetensors index is a JSON object with a weight_map") from None
    except (KeyError, TypeError, AttributeError):
        raise ValueError(f"{str(index)!r} is not a safetensors index (a JSON object with a weight_map)") from None
    return [hf_dir / name for name in sorted(set(map(str, shards)))]


def read_safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """A weights file's tensor shapes, from its header only; a damaged or pickle file is named in one line."""
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118 (no __iter__)
    except Exception as e:  # safetensors raises several types for truncated or foreign files
        with open(path, "rb") as f:
            if looks_like_pickle(f.read(9)):
                raise ValueError(
                    f"{str(path)!r} is a pickle/torch.save file, not safetensors; only safetensors weights are read, "
                    "never pickles"
                ) from None
        raise ValueError(f"{str(path)!r} is not a readable safetensors file ({error_line(e)})") from None


def read_weight_shapes(hf_dir: Path) -> dict[str, tuple[int, ...]]:
    """The shapes of hf_dir's safetensors weights (all shards), from their headers. Refuses a directory whose
    weights are only pickles (transformers would torch.load them), or whose safetensors weights are damaged."""
    files = weight_files(hf_dir)
    if files:
        shapes = {}
        for path in files:
            if not path.is_file():
                raise FileNotFoundError(f"{str(path)!r}, a shard the safetensors index names, does not exist")
            shapes |= read_safetensors_shapes(path)
        return shapes
    pickles = sorted(p.name for p in hf_dir.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
    found = f"it has {', '.join(pickles)}, a pickle" if pickles else "it has no weights"
    raise ValueError(
        f"{str(hf_dir)!r} has no model.safetensors ({found}); only safetensors weights are read, never pickles"
    )


def as_gpt2(hf_dir: Path, load: Callable[..., Any], **kwargs) -> Any:
    """load(hf_dir, **kwargs), with anything transformers raises (a field of the wrong type or value:
    TypeError, ValueError, huggingface_hub's own) as one line naming hf_dir."""
    try:
        return load(hf_dir, local_files_only=True, **kwargs)
    except Exception as e:
        msg = " ".join(line.strip() for line in str(e).splitlines()) or type(e).__name__  # its cause on line 2
        raise ValueError(f"{str(hf_dir)!r} does not load as a GPT-2 model ({clip(msg, 300)})") from None


def check_config_fits(hf_dir: Path, hf_config: "GPT2Config", shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse, before any model is built, a config.json whose sizes the weights' header does not have, or a
    model this machine cannot hold (each float32 copy: the loaded tensors, the GPT-2 model and ours)."""
    try:
        check_weights_fit(hf_config, shapes)
    except ValueError as e:
        raise ValueError(f"{str(hf_dir)!r}: {e}") from None
    params = sum(math.prod(shape) for shape in gpt2_shapes(hf_config).values())
    need, have = 3 * 4 * params, memory_bytes()
    if have is not None and need > have:
        raise ValueError(
            f"{str(hf_dir)!r}: its {params / 1e6:.1f}M parameters need {need / 1e9:.1f} GB to convert in float32; "
            f"this machine has {have / 1e9:.1f} GB"
        )


def memory_bytes() -> int | None:
    """This machine's physical memory; None where the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def load_hf_gpt2(hf_dir: Path, shapes: dict[str, tuple[int, ...]]) -> "GPT2LMHeadModel":
    """hf_dir's GPT2LMHeadModel in float32; ValueError (one line) for a config.json that does not build one
    or whose sizes its weights (`shapes`, from their header) do not have, before any model is built.
    transformers' own load report is kept quiet: this names the problem."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    try:
        config = read_json(hf_dir / "config.json")  # bounded, and before transformers reads it again
    except NotJSON as e:
        raise ValueError(f"{str(hf_dir)!r}: its config.json {e.reason}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{str(hf_dir)!r}: its config.json is not a JSON object")
    if config.get("model_type", "gpt2") != "gpt2":  # a llama read as GPT-2 was "its weights hold 0 layers"
        raise ValueError(
            f"{str(hf_dir)!r}: its config.json is model_type {config['model_type']!r}; this import reads GPT-2 "
            "models (model_type 'gpt2'), the architecture attnlab exports"
        )
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        hf_config = as_gpt2(hf_dir, GPT2Config.from_pretrained)
        check_config_fits(hf_dir, hf_config, shapes)
        # the loading info lists missing weights, which would otherwise start from random values with a warning
        hf, info = as_gpt2(
            hf_dir, GPT2LMHeadModel.from_pretrained, config=hf_config, use_safetensors=True, output_loading_info=True
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    assert not info["missing_keys"], f"weights missing after check_weights_fit: {sorted(info['missing_keys'])}"
    return hf.float()


def import_hf(hf_dir: str | Path, checkpoint: str | Path, force: bool = False) -> tuple[GPT, Path]:
    """A local GPT-2 directory -> our GPT and a checkpoint file with the GPT-2 tokenizer in its header."""
    hf_dir, checkpoint = Path(hf_dir), Path(checkpoint)
    check_writable_target(checkpoint, "checkpoint", force, is_dir=False)
    if not (hf_dir / "config.json").is_file():
        raise FileNotFoundError(f"{str(hf_dir)!r} is not a Hugging Face model directory (it has no config.json)")
    if checkpoint.exists() and hf_dir.resolve() in checkpoint.resolve().parents:  # only with --force, here
        raise ValueError(
            f"checkpoint {str(checkpoint)!r} is a file of {str(hf_dir)!r}, the directory being imported; "
            "--force would replace it"
        )
    if checkpoint.is_file():  # only with --force, here
        check_replaceable_import(checkpoint)
    shapes = read_weight_shapes(hf_dir)
    require_transformers()
    model = from_hf_gpt2(load_hf_gpt2(hf_dir, shapes))
    tokenizer = read_own_tokenizer(hf_dir) or GPT2_TOKENIZER_META  # our own exports come back as they left
    if tokenizer is GPT2_TOKENIZER_META and model.config.vocab_size != GPT2_VOCAB_SIZE:
        # GPT-2's 50,257 ids read a model of another vocabulary as other tokens: sampling printed garbage
        raise ValueError(
            f"{str(hf_dir)!r} holds no tokenizer this import reads (an attnlab export's tokenizer.json) and its "
            f"model has {model.config.vocab_size} ids, not GPT-2's {GPT2_VOCAB_SIZE}: its ids cannot be read as "
            "GPT-2's; put back the tokenizer.json it was exported with"
        )
    meta = {
        "step": 0,
        "config": {"model": asdict(model.config), "data": asdict(DataConfig(tokenizer=tokenizer["name"]))},
        "tokenizer": tokenizer,
        "source": {"hf_dir": str(hf_dir.resolve())},
    }
    return model, save_checkpoint(checkpoint, model, None, meta)  # written beside, then renamed


def check_replaceable_import(checkpoint: Path) -> None:
    """Refuse to replace a file that is not an earlier import: `import HF RUN/checkpoints/step_N.safetensors --force`
    replaced a run's checkpoint, its optimizer state with it, so the run could no longer resume."""
    try:
        meta, names = read_header(checkpoint)
        imported = "hf_dir" in (meta.get("source") or {}) and not any(name.startswith("optim.") for name in names)
    except Exception:  # not a safetensors file, or not ours: it is no import either
        imported = False
    if not imported:
        raise ValueError(
            f"checkpoint {str(checkpoint)!r} is not an earlier import (a run's checkpoint, or another file); "
            "--force replaces only those: choose another path"
        )


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    export = commands.add_parser("export", help="our checkpoint -> HF GPT-2 directory with its tokenizer")
    export.add_argument("checkpoint", help="a checkpoint file or a run directory (its best checkpoint)")
    export.add_argument("out_dir", help="the directory to write (refused if it exists and is not empty)")
    imp = commands.add_parser("import", help="HF GPT-2 directory (safetensors) -> our checkpoint")
    imp.add_argument("hf_dir")
    imp.add_argument("checkpoint", help="the .safetensors file to write (refused if it exists)")
    written = "written beside, then renamed"
    export.add_argument(
        "--force", action="store_true", help=f"replace an earlier export only (a folder this script wrote); {written}"
    )
    imp.add_argument(
        "--force", action="store_true", help=f"replace an earlier import only, not a run's checkpoint; {written}"
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
        exit_with_error(e)


if __name__ == "__main__":
    main()
