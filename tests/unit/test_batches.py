"""Batch sampling: shapes, the one-token target shift, bounds, and determinism by key."""

import numpy as np
import pytest
import torch

from data import check_block_size, eval_batches, sample_batch

# With tokens = arange(N), every window is its own start offset plus 0..T, which makes shifts and bounds visible.
N = 1000
TOKENS = np.arange(N, dtype=np.uint16)


def test_shapes_dtype_and_target_shift():
    x, y = sample_batch(TOKENS, batch_size=4, block_size=16, seed=0, step=0)
    assert x.shape == y.shape == (4, 16)
    assert x.dtype == y.dtype == torch.int64
    starts = x[:, :1]
    assert torch.equal(x, starts + torch.arange(16))  # contiguous windows of the token array
    assert torch.equal(y, x + 1)  # y[:, t] is the token after x[:, t]


def test_windows_stay_in_bounds_and_reach_both_ends():
    tokens = np.arange(11, dtype=np.uint16)  # block_size 8 leaves starts 0, 1, 2
    starts = set()
    for step in range(50):
        x, y = sample_batch(tokens, batch_size=4, block_size=8, seed=0, step=step)
        assert int(y.max()) <= 10
        starts.update(x[:, 0].tolist())
    assert starts == {0, 1, 2}


def test_batches_are_those_every_earlier_run_drew():
    # the generator's key once had a rank slot; resuming a saved run needs the very same windows
    x, _ = sample_batch(TOKENS, 4, 16, seed=1, step=2, micro_step=3)
    expected = np.random.default_rng([1, 2, 3, 0]).integers(0, len(TOKENS) - 16, size=4)
    assert x[:, 0].tolist() == TOKENS[expected].tolist()


def test_the_smallest_corpus_that_fits_gives_the_one_window():
    x, y = sample_batch(np.arange(9, dtype=np.uint16), batch_size=3, block_size=8, seed=5, step=7)
    assert torch.equal(x, torch.arange(8).expand(3, 8))
    assert torch.equal(y, torch.arange(1, 9).expand(3, 8))


def test_same_key_same_batch_and_every_key_part_matters():
    kwargs = dict(seed=1, step=2, micro_step=3)
    x, y = sample_batch(TOKENS, 8, 16, **kwargs)
    x2, y2 = sample_batch(TOKENS, 8, 16, **kwargs)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    for part in kwargs:
        other, _ = sample_batch(TOKENS, 8, 16, **{**kwargs, part: kwargs[part] + 1})
        assert not torch.equal(x, other), f"changing {part} did not change the batch"


def test_reads_from_a_memmap(tmp_path):
    path = tmp_path / "tokens.bin"
    TOKENS.tofile(path)
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    x, _ = sample_batch(tokens, 2, 16, seed=0, step=0)
    x_ref, _ = sample_batch(TOKENS, 2, 16, seed=0, step=0)
    assert torch.equal(x, x_ref)


def test_too_small_corpus_is_a_clear_error():
    with pytest.raises(ValueError, match="val split has 8 tokens; it needs more than block_size=8"):
        sample_batch(np.arange(8), 2, 8, seed=0, step=0, split="val")
    with pytest.raises(ValueError, match="train split has 100 tokens; it needs more than block_size=256"):
        check_block_size(np.arange(100), 256)
    with pytest.raises(ValueError, match="batch_size=0 must be >= 1"):
        sample_batch(TOKENS, 0, 8, seed=0, step=0)


def test_eval_batches_are_fixed():
    first = eval_batches(TOKENS, batch_size=4, block_size=16, num_batches=3, seed=7)
    again = eval_batches(TOKENS, batch_size=4, block_size=16, num_batches=3, seed=7)
    assert len(first) == 3
    for (x, y), (x2, y2) in zip(first, again, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)
        assert torch.equal(y, x + 1)
    assert not torch.equal(first[0][0], first[1][0])
    other = eval_batches(TOKENS, batch_size=4, block_size=16, num_batches=1, seed=8)
    assert not torch.equal(first[0][0], other[0][0])
    with pytest.raises(ValueError, match="val split has 16 tokens"):
        eval_batches(TOKENS[:16], batch_size=4, block_size=16, num_batches=1, seed=7)
