"""No position ever sees a future token: proofs by perturbation, by gradient and by the weights,
for every attention/position variant (tests/variants.py)."""

import pytest
import torch

from model import GPT
from model.kv_cache import token_positions
from tests.variants import BACKENDS, variant_cases, variant_model

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, T = 50, 16
# (n_head, d_k) over d_model 48, including d_k != d_model / n_head.
HEAD_GRID = [(1, None), (4, None), (3, 10), (6, 24), (2, 5)]
CASES = variant_cases(HEAD_GRID)
BACKEND_CASES = variant_cases(HEAD_GRID, BACKENDS)  # each variant on every backend that computes it


def make_model(backend: str, n_head: int, d_k: int | None, variant: str = "learned") -> GPT:
    return variant_model(backend, n_head, d_k, variant, VOCAB, T)


def logits_through_cache(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """Every position's logits the way generation computes them: prefill 3 tokens, then one at a time."""
    cache = model.new_cache(idx.shape[0], idx.shape[1])
    pieces = [model(idx[:, :3], cache=cache)[0]]
    pieces += [model(idx[:, t : t + 1], cache=cache)[0] for t in range(3, idx.shape[1])]
    return torch.cat(pieces, dim=1)


@pytest.mark.parametrize("through_cache", [False, True])
@pytest.mark.parametrize("backend,variant,n_head,d_k", BACKEND_CASES)
def test_changing_a_future_token_leaves_the_past_unchanged(backend, variant, n_head, d_k, through_cache):
    model = make_model(backend, n_head, d_k, variant)
    run = (lambda idx: logits_through_cache(model, idx)) if through_cache else (lambda idx: model(idx)[0])
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base = run(idx)
        for j in (1, T // 2, T - 1):
            changed = idx.clone()
            changed[:, j] = (changed[:, j] + 7) % VOCAB
            logits = run(changed)
            assert (logits[:, :j] - base[:, :j]).abs().max().item() <= 1e-6, f"position < {j} saw token {j}"
            # ...and the change is visible from j on, so this test can fail.
            assert (logits[:, j:] - base[:, j:]).abs().max().item() > 1e-4


@pytest.mark.parametrize("through_cache", [False, True])
@pytest.mark.parametrize("backend,variant,n_head,d_k", BACKEND_CASES)
def test_gradient_from_the_future_is_exactly_zero(backend, variant, n_head, d_k, through_cache):
    model = make_model(backend, n_head, d_k, variant)
    captured = {}

    def keep_embedding(_module, _inputs, output):
        output.retain_grad()
        captured["emb"] = output

    model.tok_emb.register_forward_hook(keep_embedding)
    idx = torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(2))
    for i in (0, 5, T - 2):
        model.zero_grad()
        logits, _ = model(idx, cache=model.new_cache(1, T) if through_cache else None)
        logits[0, i].sum().backward()
        grad = captured["emb"].grad[0]  # (T, d_model)
        assert torch.count_nonzero(grad[i + 1 :]) == 0, f"output {i} has a gradient from a later input"
        # A stack of windows reads back sum(window - 1) positions (one more for the bigram table's previous token):
        # when every layer is windowed, no further, unless the continuous cache points back over the whole context.
        c = model.config
        reach = sum((c.layer_window(layer) or T) - 1 for layer in range(c.n_layer)) + (c.bigram_embeds > 0)
        reach = T if c.pointer_weight > 0 else reach
        first = max(0, i - reach)
        assert grad[first : i + 1].abs().sum(-1).gt(0).all(), "every input in reach should influence output i"
        assert torch.count_nonzero(grad[:first]) == 0, f"output {i} has a gradient from beyond its windows' reach"


@pytest.mark.parametrize("variant,n_head,d_k", CASES)
def test_model_attention_weights_are_causal_distributions(variant, n_head, d_k):
    model = make_model("explicit", n_head, d_k, variant)
    idx = torch.randint(0, VOCAB, (2, T))
    x, rotary = model.embed(idx, token_positions(T))
    for layer, block in enumerate(model.blocks):
        w = block.attn.weights(block.ln_1(x), rotary)  # (B, H, T, T), every variant of the scores applied
        assert w.shape == (2, n_head, T, T)
        window = model.config.layer_window(layer) or T
        seen = w[0, 0] != 0  # differential attention's weights (a difference of two maps) may be negative
        assert not seen.triu(1).any(), "a query saw a later key"
        assert torch.equal(seen.sum(-1), torch.arange(1, T + 1).clamp(max=window)), "not the last `window` keys"
        if model.config.attn_sinks:  # the sink takes a share of every row
            assert (w.sum(-1) < 1).all()
        elif model.config.attn_diff:  # softmax(S1) - lambda softmax(S2): each row sums to 1 - lambda
            torch.testing.assert_close(w.sum(-1), (1 - block.attn.differential()).expand(2, n_head, T))
        else:
            torch.testing.assert_close(w.sum(-1), torch.ones(2, n_head, T))
        x = block(x, rotary=rotary, tokens=idx)
