"""Hashed bigram embeddings (model/bigram.py): which token each one pairs with, where its rows land, and that a
cache, padding or a second call computes what one pass over the whole sequence does. The model-level guarantees
(no leak, KV cache = full forward, kernels equal) run over the `bigram` variant in tests/variants.py."""

import pytest
import torch

from model import GPT, GPTConfig
from model.bigram import NO_TOKEN, bigram_rows, previous_tokens

N = NO_TOKEN


def test_previous_token_is_the_one_before_and_none_for_the_first():
    idx = torch.tensor([[5, 6, 7], [1, 2, 3]])
    assert previous_tokens(idx).tolist() == [[N, 5, 6], [N, 1, 2]]


def test_previous_token_skips_padding_and_continues_from_the_cache():
    idx = torch.tensor([[0, 0, 7, 8], [4, 0, 9, 3]])
    real = torch.tensor([[False, False, True, True], [True, False, True, True]])
    assert previous_tokens(idx, real).tolist() == [[N, N, N, 7], [N, 4, 4, 9]]
    last = torch.tensor([2, N])  # row 0 saw token 2 before; row 1 saw nothing yet
    assert previous_tokens(idx, real, last).tolist() == [[2, 2, 2, 7], [N, 4, 4, 9]]
    assert previous_tokens(idx[:, 2:], None, last).tolist() == [[2, 7], [N, 9]]


def test_rows_are_in_range_row_zero_only_without_a_previous_token_and_pairs_spread():
    vocab, rows = 64, 257
    prev, cur = torch.meshgrid(torch.arange(vocab), torch.arange(vocab), indexing="ij")
    r = bigram_rows(prev.flatten(), cur.flatten(), rows)
    assert r.min() >= 1 and r.max() <= rows - 1
    assert len(r.unique()) == rows - 1  # 4,096 pairs reach every one of the 256 rows
    assert torch.bincount(r).max() < 3 * vocab * vocab / (rows - 1)  # and none takes far more than its share
    assert bigram_rows(torch.tensor([N, N]), torch.tensor([3, 4]), rows).tolist() == [0, 0]
    pair, swapped = bigram_rows(torch.tensor([3, 4]), torch.tensor([4, 3]), rows).tolist()
    assert pair != swapped  # the order of the two tokens matters


def test_the_cache_remembers_each_rows_last_real_token_and_reset_forgets_it():
    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, d_model=16, bigram_embeds=5))
    cache = model.new_cache(2, 8)
    model(torch.tensor([[3, 4], [0, 6]]), padding_mask=torch.tensor([[True, True], [False, True]]), cache=cache)
    assert cache.last_token.tolist() == [4, 6]
    model(torch.tensor([[9], [0]]), padding_mask=torch.tensor([[True], [False]]), cache=cache)
    assert cache.last_token.tolist() == [9, 6]  # a padding slot keeps the row's last real token
    cache.reset()
    assert cache.last_token.tolist() == [N, N]


def test_a_table_starts_at_zero_and_learns_at_its_own_lr():
    from training.optim import OptimConfig, build_optimizer, set_lr

    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, d_model=16, bigram_embeds=5))
    assert torch.count_nonzero(model.bigram_emb.table.weight) == 0  # the model starts as it would without it
    for bigram_lr, expected in ((None, 0.002), (0.01, 0.005)):  # null: optim.lr, not the token table's
        cfg = OptimConfig(optimizer="muon", lr=0.004, embedding_lr=0.3, bigram_lr=bigram_lr)
        opt = build_optimizer(model, cfg, "cpu")
        set_lr(opt, 0.002)  # half the peak: each group at half its own
        (group,) = [g for g in opt.param_groups if any(p is model.bigram_emb.table.weight for p in g["params"])]
        assert (group["role"], len(group["params"]), group["lr"]) == ("bigram", 1, pytest.approx(expected))
    _, loss = model(torch.randint(0, 20, (2, 8)), torch.randint(0, 20, (2, 8)))
    loss.backward()
    grad = model.bigram_emb.table.weight.grad
    assert grad[0].abs().sum() > 0 and grad.abs().sum() > grad[0].abs().sum()  # first tokens and pairs both learn
