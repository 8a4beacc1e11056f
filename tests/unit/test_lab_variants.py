"""The lab on the attention variants of tests/variants.py (docs/variants.md): each loads, a head switched off
loses exactly what zeroing its columns of W_O by hand loses, and the attention API reads what the variant
changes (the sink's share of each row, the window, the gates' means), checked against the equations by hand."""

import copy
import math
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from analysis.attention import attention_walk
from data.tokenizer import CharTokenizer
from lab import api
from lab.session import LabSession
from model import GPT, GPTConfig
from rundir.checkpoint import save_checkpoint
from tests.unit.test_lab import CHARS
from tests.variants import VARIANT_HEADS, VARIANTS

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = "the king is not what thou art"
SINKS_AND_WINDOW = {"attn_sinks": True, "window_pattern": "SL", "window_size": 4}


def variant_checkpoint(path: Path, **overrides) -> Path:
    """A random char model of the tests' variant shape (2 layers, 6 heads of d_k 10, d_model 48) with
    `overrides`, saved as a run saves it. Sinks and gates are drawn away from their init (sinks 0, gates
    near 0.5 or 1), so each head's reading differs and a wrong head or layer shows; W_O too (its init is
    scaled down), so that switching a head off changes the loss by more than rounding."""
    torch.manual_seed(0)
    n_head, d_k = VARIANT_HEADS
    sizes = {"block_size": 32, "n_layer": 2, "n_head": n_head, "d_model": 48, "d_k": d_k}
    config = GPTConfig(vocab_size=len(CHARS) + 1, **(sizes | overrides))
    model = GPT(config)
    with torch.no_grad():
        for block in model.blocks:
            attn = block.attn
            attn.out_proj.weight.normal_(std=0.3)
            if attn.sinks is not None:
                attn.sinks.normal_(std=1.5)
            for gate in (attn.gate_proj, attn.value_gate):
                if gate is not None:
                    gate.weight.normal_(std=0.3)
    meta = {"step": 3, "config": {"model": asdict(config), "data": {}}, "tokenizer": CharTokenizer(CHARS).to_meta()}
    return save_checkpoint(path, model, None, meta)


def lab_on(tmp_path: Path, **overrides) -> LabSession:
    return LabSession(variant_checkpoint(tmp_path / "model.safetensors", **overrides))


def loss_of(model: GPT, idx: torch.Tensor) -> float:
    logits, _ = model(idx[None])
    return float(F.cross_entropy(logits[0, :-1], idx[1:]))


@torch.no_grad()
def loss_without_by_hand(model: GPT, idx: torch.Tensor, heads: list[tuple[int, int]]) -> float:
    """The loss of a copy of the model in which each (layer, head)'s input columns of W_O are set to zero."""
    model = copy.deepcopy(model)
    for layer, head in heads:
        out_proj = model.blocks[layer].attn.out_proj
        width = out_proj.in_features // model.config.n_head  # one head's slice of W_O's input
        out_proj.weight[:, head * width : (head + 1) * width] = 0.0
    return loss_of(model, idx)


def layer_inputs(model: GPT, idx: torch.Tensor) -> list[torch.Tensor]:
    """Each block's normed input ln_1(x) (1, T, d_model), x the residual stream the model's own blocks make."""
    x, rotary = model.embed(idx[None], torch.arange(idx.shape[0])[None])
    normed = []
    for block in model.blocks:
        normed.append(block.ln_1(x))
        x = block(x, rotary=rotary, tokens=idx[None])
    return normed


@pytest.mark.parametrize("variant", list(VARIANTS))
@torch.no_grad()
def test_each_variant_loads_and_a_head_off_loses_what_zeroing_its_w_o_columns_loses(tmp_path, variant):
    session = lab_on(tmp_path, **VARIANTS[variant])
    model, idx = session.model, session.encode(PROMPT)
    assert {k: getattr(model.config, k) for k in VARIANTS[variant]} == VARIANTS[variant], "loaded as saved"
    full = loss_of(model, idx)
    scored = api.importance(session, {"prompt": PROMPT})
    assert scored["loss"] == pytest.approx(full, abs=1e-6)
    by_hand = [
        [loss_without_by_hand(model, idx, [(layer, head)]) - full for head in range(model.config.n_head)]
        for layer in range(model.config.n_layer)
    ]
    assert torch.tensor(scored["delta"]) == pytest.approx(torch.tensor(by_hand), abs=1e-5)
    assert max(abs(d) for row in by_hand for d in row) > 1e-3, "the heads matter, or the test shows nothing"
    answer = api.intervene(session, {"prompt": PROMPT, "heads_off": [[1, 2], [0, 5]], "max_tokens": 2})
    assert answer["ablated"]["loss"] == pytest.approx(loss_without_by_hand(model, idx, [(1, 2), (0, 5)]), abs=1e-6)
    assert answer["full"]["loss"] == pytest.approx(full, abs=1e-6)


@torch.no_grad()
def test_the_sink_share_is_what_the_sink_logit_takes_from_each_row_within_the_window(tmp_path):
    session = lab_on(tmp_path, **SINKS_AND_WINDOW)
    model, idx = session.model, session.encode(PROMPT)
    T, d_k = idx.shape[0], model.config.head_dim
    assert session.info()["windows"] == [4, None]
    for layer, normed in enumerate(layer_inputs(model, idx)):
        attn = model.blocks[layer].attn
        q, k, _ = attn.project_qkv(normed)  # (1, H, T, d_k)
        scores = (q @ k.transpose(-2, -1))[0] / math.sqrt(d_k)  # (H, T, T)
        query, key = torch.arange(T)[:, None], torch.arange(T)[None, :]
        seen = (key <= query) & (key > query - 4 if layer == 0 else True)
        # The sink is one more logit in the denominator: its share is e^s / (e^s + sum_j e^S_ij).
        logsumexp = scores.masked_fill(~seen, float("-inf")).logsumexp(-1)  # (H, T)
        expected = torch.sigmoid(attn.sinks[:, None] - logsumexp)
        answer = api.attention(session, {"prompt": PROMPT, "layer": layer})
        assert answer["window"] == (4 if layer == 0 else None)
        assert torch.tensor(answer["sink_share"]) == pytest.approx(expected, abs=1e-5)
        assert expected.std() > 0.05, "heads with one share would not tell a head from another"
        weights = attention_walk(model, idx).weights[layer]  # (H, T, T)
        assert (weights[:, ~seen] == 0).all(), "a key before the window takes no weight"
    assert answer["gate"] is None and answer["gate_mean"] is None and answer["value_gate_mean"] is None


@pytest.mark.parametrize(
    "variant",
    [{"attn_gate": "headwise"}, {"attn_gate": "elementwise", "value_embeds": True, "n_kv_head": 2}],
    ids=["headwise", "elementwise-value_embeds"],
)
@torch.no_grad()
def test_the_gate_means_are_the_sigmoid_of_the_blocks_input_by_hand(tmp_path, variant):
    session = lab_on(tmp_path, **variant)
    model, idx = session.model, session.encode(PROMPT)
    H, T = model.config.n_head, idx.shape[0]
    for layer, normed in enumerate(layer_inputs(model, idx)):
        attn = model.blocks[layer].attn
        gate = torch.sigmoid(normed[0] @ attn.gate_proj.weight.T)  # (T, H or H * d_k): x W_gate, bias off
        per_token = gate.view(T, H, -1).mean(-1).T  # (H, T): a head's channels averaged
        answer = api.attention(session, {"prompt": PROMPT, "layer": layer})
        assert torch.tensor(answer["gate"]) == pytest.approx(per_token, abs=1e-6)
        assert torch.tensor(answer["gate_mean"]) == pytest.approx(per_token.mean(-1), abs=1e-6)
        assert per_token.mean(-1).std() > 0.01, "heads with one mean would not tell a head from another"
        if model.config.value_embeds:
            value_gate = 2 * torch.sigmoid(normed[0] @ attn.value_gate.weight.T)  # (T, H_kv)
            assert torch.tensor(answer["value_gate_mean"]) == pytest.approx(value_gate.mean(0), abs=1e-6)
        else:
            assert answer["value_gate_mean"] is None
        assert answer["sink_share"] is None and answer["window"] is None


def test_a_model_without_these_variants_reads_none_of_them(tmp_path):
    session = lab_on(tmp_path, attn_softcap=2.0)
    answer = api.attention(session, {"prompt": PROMPT, "layer": 1})
    readings = ("window", "sink_share", "gate", "gate_mean", "value_gate_mean")
    assert {key: answer[key] for key in readings} == dict.fromkeys(readings)
    assert answer["softcap"] == 2.0 and session.info()["windows"] == [None, None]
