"""Start-up checks that need the prepared data: the model's vocabulary covers it, every split holds
at least one batch, and every token id is inside the vocabulary (a corrupt cache otherwise reaches
the embedding as an index error, or a device-side assert on CUDA)."""

import numpy as np

from data.prepare import PreparedData
from model.gpt import GPTConfig

SCAN_CHUNK = 1 << 24  # tokens per pass; keeps the scan of a huge memmap out of memory


def check_data_fits(data: PreparedData, model: GPTConfig, batch_size: int) -> None:
    vocab = data.meta["vocab_size"]
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


def max_token(tokens: np.ndarray) -> int:
    return max(int(tokens[i : i + SCAN_CHUNK].max()) for i in range(0, len(tokens), SCAN_CHUNK))
