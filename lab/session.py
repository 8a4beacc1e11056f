"""One loaded model and its tokenizer, shared by every request of a lab server.

The model is loaded once and used under a lock: head gates are hooks on the shared model, so two
requests running at once would see each other's gates. A lab serves one person; serialising is
cheaper than a model copy per request. A request waits at most MODEL_WAIT_S for the model, then is told
it is busy (`ModelBusy`, a 503), and a streamed sample takes the lock a token at a time, letting a request
from another tab run between two of its tokens: one tab's long sample held the model for its whole length,
and the other tab's request waited past its timeout.

Samples decode under `session.sampling_threads()`: one thread for a small model unless the lab was
started with a count (`threads`) or OMP_NUM_THREADS (generation.generate.decode_threads).

The page may open runs and checkpoints under one folder only, `root` (by default the folder that holds
the run the lab was started on): the API takes paths from a browser, and must not list or load the
whole machine for whoever reaches it.
"""

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
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

MODEL_WAIT_S = 10.0  # a request's wait for the model; well inside a browser's or a client's own timeout


class ModelBusy(RuntimeError):
    """Another request kept the model past MODEL_WAIT_S; the server answers 503 with this line."""


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
    """The model, tokenizer and checkpoint a lab server works with; use `with session.using_model(WHAT):`
    around the model."""

    def __init__(
        self, source: str | Path, device: str = "cpu", root: str | Path | None = None, threads: int | None = None
    ) -> None:
        self.lock = threading.Lock()
        self.wait_s = MODEL_WAIT_S
        self.waiting = 0  # requests waiting for the model: a streamed sample lets them go first
        self.counting = threading.Lock()  # `waiting += 1` from two threads at once can lose one
        self.holder: tuple[str, float] | None = None  # (what holds the model, since when), for ModelBusy's line
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
        with self.using_model("loading a checkpoint"):
            self.model: GPT = trained.model
            self.tokenizer: Tokenizer = trained.tokenizer
            self.checkpoint = trained.path
            self.step = trained.meta.get("step")
            self.run_dir = run_dir_of(source, trained.path)

    @contextmanager
    def using_model(self, what: str) -> Iterator[None]:
        """The model, for this request alone inside the block; ModelBusy after waiting `wait_s` for it."""
        with self.counting:
            self.waiting += 1
        try:
            acquired = self.lock.acquire(timeout=self.wait_s)
        finally:
            with self.counting:
                self.waiting -= 1
        if not acquired:
            holder, since = self.holder or ("another request", time.monotonic())
            raise ModelBusy(
                f"the model is busy with {holder} (for {time.monotonic() - since:.0f} s); try again when it finishes"
            )
        self.holder = (what, time.monotonic())
        try:
            yield
        finally:
            self.holder = None
            self.lock.release()

    def let_others_in(self, patience_s: float = 1.0) -> None:
        """Between two pieces of a long job: a request waiting for the model takes it first (a Lock hands
        itself to no one, and the job would take it straight back)."""
        deadline = time.monotonic() + patience_s
        while self.waiting and time.monotonic() < deadline:
            time.sleep(0.002)

    def sampling_threads(self) -> AbstractContextManager[None]:
        """torch's thread count for sampling the loaded model, restored after; use inside `using_model`
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
