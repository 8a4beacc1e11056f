"""One loaded model and its tokenizer, shared by every request of a lab server.

The model is loaded once and used under a lock: head gates are hooks on the shared model, so two
requests running at once would see each other's gates. A lab serves one person; serialising is
cheaper than a model copy per request.

Samples decode under `session.sampling_threads()`: one thread for a small model unless the lab was
started with a count (`threads`) or OMP_NUM_THREADS (generation.generate.decode_threads).

The page may open runs and checkpoints under one folder only, `root` (by default the folder that holds
the run the lab was started on): the API takes paths from a browser, and must not list or load the
whole machine for whoever reaches it.
"""

import threading
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from analysis.attention import token_text
from analysis.trained import find_checkpoint, load_trained
from data import Tokenizer
from generation.generate import decode_threads, encode_prompt, torch_threads
from model import GPT
from rundir.files import METRICS
from training.runtime import resolve_device


def run_dir_of(source: Path, checkpoint: Path) -> Path | None:
    """The run directory a checkpoint came from, when it sits in RUN/checkpoints/ beside metrics.jsonl."""
    if source.is_dir():  # RUN/checkpoints/ is the run's, as a checkpoint file in it is
        return source.parent if source.name == "checkpoints" and (source.parent / METRICS).is_file() else source
    run = checkpoint.parent.parent
    return run if checkpoint.parent.name == "checkpoints" and (run / METRICS).is_file() else None


def default_root(source: Path) -> Path:
    """The folder holding the run of `source` (a run directory or RUN/checkpoints/FILE), else the checkpoint
    file's own folder: the run's siblings (a sweep's other runs) stay in reach. Taken before symlinks are
    followed, so outputs/latest gives outputs/."""
    source = source.expanduser().absolute()
    run = run_dir_of(source, source)
    return (run or source).parent


class LabSession:
    """The model, tokenizer and checkpoint a lab server works with; use `with session.lock:` around the model."""

    def __init__(
        self, source: str | Path, device: str = "cpu", root: str | Path | None = None, threads: int | None = None
    ) -> None:
        self.lock = threading.Lock()
        self.device = resolve_device(device)
        self.threads = threads  # torch threads for sampling; None: decode_threads' choice for the model
        if root is None and not Path(source).expanduser().exists():  # its folder was blamed as "--root 'None'"
            find_checkpoint(Path(source).expanduser())  # names what is missing, or the dangling link
        self.root = Path(root or default_root(Path(source))).expanduser().resolve()
        if not self.root.is_dir():  # else every path was "outside" a folder that is not there
            raise FileNotFoundError(f"--root {str(root)!r} is not a folder; give the folder that holds your runs")
        self.load(source)

    def inside_root(self, path: str | Path) -> Path:
        """`path` as given, refused (ValueError) unless it lies under `root` once symlinks and '..' are resolved."""
        path = Path(path).expanduser()
        if not path.resolve().is_relative_to(self.root):
            raise ValueError(
                f"{str(path)!r} is outside {str(self.root)!r}, the folder this lab opens runs and checkpoints from "
                "(scripts/lab.py --root sets it)"
            )
        return path

    def load(self, source: str | Path) -> None:
        """Load a checkpoint or run directory under `root`; on any error the previous model stays."""
        source = self.inside_root(source)
        # the file a run directory means (its best.safetensors) too: a symlink there to a file outside was loaded
        trained = load_trained(self.inside_root(find_checkpoint(source)), self.device)
        with self.lock:
            self.model: GPT = trained.model
            self.tokenizer: Tokenizer = trained.tokenizer
            self.checkpoint = trained.path
            self.step = trained.meta.get("step")
            self.run_dir = run_dir_of(source, trained.path)

    def sampling_threads(self) -> AbstractContextManager[None]:
        """torch's thread count for sampling the loaded model, restored after; use inside `with self.lock:`
        (the count is process-wide, and another request may be using the model)."""
        return torch_threads(decode_threads(self.model, self.threads))

    def encode(self, prompt: str) -> torch.Tensor:
        """The prompt's token ids (T,) on the model's device; ValueError names unknown characters."""
        if not prompt:
            raise ValueError("the prompt is empty; type some text first")
        ids = encode_prompt(self.tokenizer, prompt, self.model.config.vocab_size)
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    def token_texts(self, idx: torch.Tensor) -> list[str]:
        return [token_text(self.tokenizer, int(i)) for i in idx]

    def info(self) -> dict[str, Any]:
        c = self.model.config
        return {
            "checkpoint": str(self.checkpoint),
            "run_dir": str(self.run_dir) if self.run_dir else None,
            "step": self.step,
            "tokenizer": self.tokenizer.name,
            "vocab_size": c.vocab_size,
            "n_layer": c.n_layer,
            "n_head": c.n_head,
            "d_model": c.d_model,
            "d_k": c.head_dim,
            "block_size": c.block_size,
            "params": self.model.num_params(),
            "windows": [c.layer_window(layer) for layer in range(c.n_layer)],  # sliding window per layer, None: all
        }
