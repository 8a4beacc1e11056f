"""BPE-dropout (Provilkov et al. 2020, arXiv:1910.13267): random segmentations of a learned BPE, for training.

Deterministic BPE always cuts "Gloucester" the same way, so a small model that sees the train text five
times learns those exact token sequences by heart. With dropout, each merge step skips every applicable merge
with probability p, so the same text arrives as a few different, slightly finer segmentations; the model
learns how pieces spell words rather than one spelling each. Val keeps the deterministic segmentation.

Written here rather than taken from `tokenizers` (whose BPE has a `dropout`) because its random numbers
cannot be seeded: two machines would prepare different train tokens under the same fingerprint.
"""

import json
import random

from data.tokenizer import BPETokenizer, Tokenizer

# Each merge step rescans the piece, so a piece costs the square of its length: a 300 KB line without a space (a DNA
# sequence) took hours. Longer pieces are encoded in parts of this many symbols; Shakespeare's longest has 63, so
# its segmentations are those of the whole pieces.
LONGEST_PIECE = 64


class BPEDropout:
    """Encodes with `tokenizer`'s merges, skipping each candidate merge with probability `p` at each step,
    drawing from a `random.Random(seed)`: the same (tokenizer, p, seed, texts) give the same ids."""

    def __init__(self, tokenizer: Tokenizer, p: float, seed: int):
        if not isinstance(tokenizer, BPETokenizer):
            raise ValueError(f"BPE-dropout needs data.tokenizer=bpe, not {tokenizer.name!r}")
        if not 0.0 <= p < 1.0:
            raise ValueError(f"BPE-dropout p={p} must be in [0, 1)")
        spec = json.loads(tokenizer.spec)
        vocab = spec["model"]["vocab"]
        merges = [m.split(" ") if isinstance(m, str) else m for m in spec["model"]["merges"]]
        # (left id, right id) -> (rank, merged id): a lower rank was learned earlier and merges first
        self._merges = {(vocab[a], vocab[b]): (rank, vocab[a + b]) for rank, (a, b) in enumerate(merges)}
        self._vocab = vocab
        self._tokenizer = tokenizer
        self.p = p
        self._random = random.Random(seed).random

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in self._tokenizer.pieces(text):
            symbols = [self._vocab[symbol] for symbol in piece]
            for start in range(0, len(symbols), LONGEST_PIECE):
                ids.extend(self._encode_piece(symbols[start : start + LONGEST_PIECE]))
        return ids

    def _encode_piece(self, ids: list[int]) -> list[int]:
        # Each step merges the earliest-learned adjacent pair that survives its coin; none left: done.
        # With p = 0 this is plain BPE, the same ids as the tokenizer's own encoder (tests/unit/test_bpe_dropout.py).
        while len(ids) > 1:
            best = None
            for i in range(len(ids) - 1):
                merge = self._merges.get((ids[i], ids[i + 1]))
                if merge is not None and self._random() >= self.p and (best is None or merge[0] < best[0]):
                    best = (merge[0], merge[1], i)
            if best is None:
                break
            _, merged, i = best
            ids[i : i + 2] = [merged]
        return ids
