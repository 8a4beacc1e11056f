"""The fixed windows a checkpoint's heads are measured on (scripts/head_importance.py, one checkpoint or
every checkpoint of a run): about --tokens of the checkpoint's own validation split (its data config,
prepared or reused from the cache) in windows drawn at random positions with a fixed seed; or consecutive
windows of a text file. A window is as long as the sequences the model trained on (`window_length`). The
same call gives the same windows, so checkpoints of one run are compared on the same tokens."""

import math
from pathlib import Path

import torch
from torch import Tensor

from analysis.trained import Trained, check_checkpoint_data
from data.batches import eval_batches
from data.config import DataConfig
from data.prepare import prepare
from data.text_file import read_text_file

WINDOW_SEED = 0  # the windows are the same on every call, for every checkpoint of a run
BATCH_SIZE = 8


def check_tokens_asked(tokens: int) -> None:
    """Before anything is loaded: a count of tokens to measure on is at least 1."""
    if tokens < 1:
        raise ValueError(f"--tokens {tokens} is invalid; it must be >= 1")


def window_length(trained: Trained) -> int:
    """Tokens in one window: the model's training sequence (model.train_block_size, else block_size). The default
    model trains on 128 tokens and may attend over 4,096: windows of 4,096 refused the default --tokens and
    took minutes and gigabytes at the least allowed."""
    return trained.model.config.train_length


def check_tokens(tokens: int, block_size: int, text: Path | None) -> None:
    """--tokens must hold what one measurement is made of: a window of --text, a batch of validation windows
    (whole batches are measured, so a request between two is rounded up, and the report gives the count)."""
    unit = "one window" if text is not None else f"one batch of {BATCH_SIZE} windows"
    least = block_size if text is not None else BATCH_SIZE * block_size
    if tokens < least:
        raise ValueError(f"--tokens {tokens} is less than {unit} of {block_size} tokens; give at least {least}")


def val_windows(trained: Trained, tokens: int, text: Path | None) -> list[tuple[Tensor, Tensor]]:
    """Fixed (inputs, targets) batches of about `tokens` tokens: --text's consecutive windows or val windows."""
    block_size = window_length(trained)
    check_tokens(tokens, block_size, text)
    if text is not None:
        content = read_text_file(text, "--text")
        ids = torch.tensor(trained.tokenizer.encode(content))
        n = min(len(ids) - 1, tokens) // block_size
        if n < 1:
            raise ValueError(
                f"--text {str(text)!r} has {len(ids)} tokens; it needs more than one window of {block_size}"
            )
        windows = torch.stack([ids[i * block_size : (i + 1) * block_size + 1] for i in range(n)])  # (n, T+1)
        return [(w[:, :-1], w[:, 1:]) for w in windows.split(BATCH_SIZE)]
    try:
        data_cfg = DataConfig(**trained.meta["config"]["data"])
    except (TypeError, KeyError) as e:  # a header that parses but does not fit the schema
        raise ValueError(
            f"checkpoint {str(trained.path)!r} has no usable data config in its header ({type(e).__name__}: {e}); "
            "give --text FILE to measure on a text of your own"
        ) from None
    data = prepare(data_cfg, progress=False)
    check_checkpoint_data(trained.meta, data, "give --text FILE to measure on a text of your own")
    # capped at the split: windows are drawn with replacement, so more would repeat its tokens (and a typo's
    # 10^12 built batches until memory ran out)
    num_batches = max(1, math.ceil(min(tokens, len(data.val)) / (BATCH_SIZE * block_size)))
    return eval_batches(data.val, BATCH_SIZE, block_size, num_batches, seed=WINDOW_SEED)
