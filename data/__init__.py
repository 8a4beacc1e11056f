"""Data: fetch a corpus, tokenize and split it once into cached token files, and cut batches from them."""

from data.batches import BatchLayout, PreparedData, batch_layout, check_block_size, eval_batches, sample_batch
from data.config import DataConfig
from data.prepare import load_prepared, prepare
from data.tokenizer import Tokenizer, build_tokenizer, tokenizer_from_meta

__all__ = [
    "BatchLayout",
    "DataConfig",
    "PreparedData",
    "Tokenizer",
    "batch_layout",
    "build_tokenizer",
    "check_block_size",
    "eval_batches",
    "load_prepared",
    "prepare",
    "sample_batch",
    "tokenizer_from_meta",
]
