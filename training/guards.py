"""What stops a run, and how it stops cleanly: data checks before any work (vocabulary, one batch per
split, token ids in range), non-finite guards (a NaN/inf step stops the run naming it, or with
on_nonfinite=skip is dropped and counted; weights are checked before a save), and SIGTERM/SIGINT,
whose handler only sets a flag: the loop finishes its step, saves and exits with 128 + signal (a
second Ctrl-C interrupts at once)."""

import os
import signal
import threading
from types import FrameType, TracebackType

import numpy as np
import torch
from torch import Tensor, nn

from data.prepare import PreparedData
from model.gpt import GPTConfig

SCAN_CHUNK = 1 << 24  # tokens per pass; keeps the scan of a huge memmap out of memory


def check_data_fits(data: PreparedData, model: GPTConfig, batch_size: int) -> None:
    vocab = data.vocab_size
    if model.vocab_size is not None and model.vocab_size < vocab:
        raise ValueError(f"model.vocab_size={model.vocab_size} is smaller than the tokenizer's vocabulary ({vocab})")
    need = batch_size * model.block_size + 1
    for split in ("train", "val"):
        tokens = getattr(data, split)
        if len(tokens) < need:
            raise ValueError(
                f"the {split} split has {len(tokens)} tokens, fewer than one batch needs "
                f"(batch_size={batch_size} x model.block_size={model.block_size} + 1 = {need}); "
                "use more data or a smaller batch_size / model.block_size"
            )
        top = max_token(tokens)
        if top >= vocab:
            raise ValueError(
                f"the {split} split holds token id {top}, outside the vocabulary [0, {vocab}); "
                f"the prepared data in {data.directory} is corrupt: delete it to prepare again"
            )


def check_prompt(data: PreparedData, prompt: str, sample_tokens: int) -> list[int]:
    """The end-of-run sample's prompt ids, checked now rather than after training ([] when no sample)."""
    from model.generate import encode_prompt

    if sample_tokens == 0:
        return []
    if not prompt:
        return [data.tokenizer.eot_id]  # the default: start the sample as a new document starts
    try:
        return encode_prompt(data.tokenizer, prompt, data.vocab_size)
    except ValueError as e:
        raise ValueError(f"sample_prompt={prompt!r}: {e}") from None


def check_fits_in_memory(model: GPTConfig, device: torch.device) -> None:
    """Refuse a model whose weights, gradients and AdamW state (16 bytes/parameter) exceed the memory."""
    from model import GPT

    with torch.device("meta"):
        params = GPT(model).num_params()
    need = 16 * params
    if device.type == "cuda":
        have = torch.cuda.get_device_properties(device).total_memory
    else:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > have:
        raise ValueError(
            f"the model has {params / 1e6:,.0f}M parameters and needs about {need / 2**30:,.1f} GiB to train; "
            f"this {device.type} has {have / 2**30:,.1f} GiB: make model.d_model / model.n_layer smaller"
        )


def max_token(tokens: np.ndarray) -> int:
    return max(int(tokens[i : i + SCAN_CHUNK].max()) for i in range(0, len(tokens), SCAN_CHUNK))


NONFINITE_POLICIES = ("stop", "skip")


def grad_norm_(params: list[nn.Parameter], max_norm: float) -> Tensor:
    """Global L2 norm of the gradients (on the device, no sync); clips them to `max_norm` when > 0."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def read_step(loss: Tensor, norm: Tensor) -> tuple[float, float]:
    """Loss and grad norm on the host: the loop's one device sync per step, paid to name a bad step."""
    loss_value, norm_value = torch.stack([loss.float(), norm.float()]).tolist()
    return loss_value, norm_value


def is_finite(*values: float) -> bool:
    return all(v == v and abs(v) != float("inf") for v in values)


def nonfinite_error(step: int, loss: float, norm: float, last_good: str | None) -> FloatingPointError:
    kept = f"last good checkpoint: {last_good}" if last_good else "no checkpoint was saved yet"
    return FloatingPointError(
        f"step {step}: loss {loss} / gradient norm {norm} is not finite; stopped without saving ({kept}); "
        "lower optim.lr or set on_nonfinite=skip to skip such steps"
    )


def check_weights_finite(model: nn.Module, step: int) -> None:
    """Refuse to save weights an update made non-finite, so the last checkpoint stays a good one."""
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise FloatingPointError(f"step {step}: weights {', '.join(bad[:3])} are not finite; not saving them")


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunInterrupted(Exception):
    """Raised by `train` after a signal-triggered save; `exit_code` is the shell's 128 + signum (the
    command that continues the run is the CLI's to say: it knows the overrides the run was started with)."""

    def __init__(self, signum: int, step: int, path: str, out_dir: str) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}; saved {path}")
        self.signum, self.out_dir = signum, out_dir
        self.exit_code = 128 + signum


class StopSignals:
    """Context manager; `requested` is the first stop signal received, or None."""

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS) -> None:
        self.signals = signals
        self.requested: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = signum

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
