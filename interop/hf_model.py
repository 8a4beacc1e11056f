"""Exact weight conversion between our GPT and Hugging Face transformers' `GPT2LMHeadModel`.

Our default GPT is GPT-2's architecture with other names: learned positions, pre-LayerNorm
blocks (eps 1e-5), fused Q|K|V projection, GELU in its tanh form ("gelu_new"), tied LM head. Only
two things differ in the tensors: the names, and GPT-2's `Conv1D` stores its weight as
(in, out), the transpose of `nn.Linear`'s (out, in). A model without biases exports with zero
biases, which computes the same function.

`transformers` is an optional dependency: it is imported only when a conversion runs.
"""

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from model.gpt import GPT, GPTConfig

if TYPE_CHECKING:
    from transformers import GPT2Config, GPT2LMHeadModel

LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which our blocks use; GPT-2's layer_norm_epsilon too
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")  # transformers' names for GELU's tanh approximation


def weight_map(n_layer: int) -> Iterator[tuple[str, str, bool]]:
    """(HF name, our name, transposed) for every GPT-2 parameter; the tied lm_head is wte."""
    yield "transformer.wte.weight", "tok_emb.weight", False
    yield "transformer.wpe.weight", "pos_emb.weight", False
    modules = {  # HF module -> (ours, is a Conv1D)
        "ln_1": ("ln_1", False),
        "attn.c_attn": ("attn.qkv_proj", True),
        "attn.c_proj": ("attn.out_proj", True),
        "ln_2": ("ln_2", False),
        "mlp.c_fc": ("mlp.up_proj", True),
        "mlp.c_proj": ("mlp.down_proj", True),
    }
    for i in range(n_layer):
        for hf, (ours, conv1d) in modules.items():
            yield f"transformer.h.{i}.{hf}.weight", f"blocks.{i}.{ours}.weight", conv1d
            yield f"transformer.h.{i}.{hf}.bias", f"blocks.{i}.{ours}.bias", False
    yield "transformer.ln_f.weight", "ln_f.weight", False
    yield "transformer.ln_f.bias", "ln_f.bias", False


def check_gpt2_compatible(config: GPTConfig) -> None:
    """Raise ValueError naming every setting GPT2LMHeadModel cannot represent, and the overrides that
    train a model it can (all at once: a user fixing them one at a time would retrain once each)."""
    gpt2 = {"pos_encoding": "learned", "n_kv_head": None, "qk_norm": False, "activation": "gelu_tanh"}
    gpt2 |= {"norm": "layernorm", "tie_embeddings": True, "logit_softcap": None, "d_k": None}
    why = {"pos_encoding": "learned positions", "n_kv_head": f"one key/value head per query head ({config.n_head})"}
    why |= {"qk_norm": "no QK-norm", "d_k": f"heads of d_model / n_head = {config.d_model / config.n_head:g} dims"}
    wrong = {name: want for name, want in gpt2.items() if getattr(config, name) != want}
    if config.kv_heads == config.n_head:  # n_kv_head / d_k set to what GPT-2 has anyway
        wrong.pop("n_kv_head", None)
    if config.head_dim * config.n_head == config.d_model:
        wrong.pop("d_k", None)
    if wrong:
        found = ", ".join(
            f"model.{name}={hydra_text(getattr(config, name))} (GPT-2 has {why.get(name, hydra_text(want))})"
            for name, want in wrong.items()
        )
        fix = " ".join(f"model.{name}={hydra_text(want)}" for name, want in wrong.items())
        raise ValueError(f"the model cannot be exported to GPT-2: {found}; a model that exports trains with {fix}")


def hydra_text(value: object) -> str:
    """A config value as an override writes it: true, null, rope."""
    return json.dumps(value) if value is None or isinstance(value, bool) else str(value)


def to_hf_config(config: GPTConfig, eos_token_id: int | None = None) -> "GPT2Config":
    from transformers import GPT2Config

    check_gpt2_compatible(config)
    return GPT2Config(
        vocab_size=config.vocab_size,
        n_positions=config.block_size,
        n_embd=config.d_model,
        n_layer=config.n_layer,
        n_head=config.n_head,
        n_inner=None if config.ff_dim == 4 * config.d_model else config.ff_dim,  # None: GPT-2's 4 * n_embd
        activation_function="gelu_new",
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.dropout,
        layer_norm_epsilon=LAYER_NORM_EPS,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        tie_word_embeddings=True,
    )


def from_hf_config(hf: "GPT2Config") -> GPTConfig:
    """Our config for a GPT-2 config; ValueError naming the first setting we do not implement."""
    refusals = {
        "activation_function": (hf.activation_function not in TANH_GELUS, f"must be one of {', '.join(TANH_GELUS)}"),
        "layer_norm_epsilon": (hf.layer_norm_epsilon != LAYER_NORM_EPS, f"must be {LAYER_NORM_EPS}"),
        "scale_attn_weights": (not hf.scale_attn_weights, "must be true (scores / sqrt(d_k))"),
        "scale_attn_by_inverse_layer_idx": (hf.scale_attn_by_inverse_layer_idx, "must be false"),
        "add_cross_attention": (hf.add_cross_attention, "must be false (decoder-only)"),
        "tie_word_embeddings": (not hf.tie_word_embeddings, "must be true (tied LM head)"),
    }
    for name, (refused, rule) in refusals.items():
        if refused:
            raise ValueError(f"GPT-2 config {name}={getattr(hf, name)!r} is not supported: it {rule}")
    dropout = float(hf.resid_pdrop)
    if not dropout == hf.embd_pdrop == hf.attn_pdrop:  # we have one dropout knob; fine-tuning is rare here
        dropout = 0.0
    return GPTConfig(
        vocab_size=hf.vocab_size,
        block_size=hf.n_positions,
        n_layer=hf.n_layer,
        n_head=hf.n_head,
        d_model=hf.n_embd,
        d_ff=hf.n_inner,
        dropout=dropout,
        bias=True,
    )


@torch.no_grad()
def to_hf_gpt2(model: GPT, eos_token_id: int | None = None) -> "GPT2LMHeadModel":
    """A GPT2LMHeadModel (float32, eval mode) that computes the same logits as `model`."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel(to_hf_config(model.config, eos_token_id)).float().eval()
    ours = {name: p for name, p in model.named_parameters()}
    theirs = dict(hf.named_parameters())
    for hf_name, our_name, transposed in weight_map(model.config.n_layer):
        target = theirs.pop(hf_name)
        source = ours.get(our_name)
        if source is None:  # bias=False: a zero bias is the same function
            assert hf_name.endswith(".bias"), f"{our_name} is missing from our model"
            target.zero_()
        else:
            target.copy_(source.T if transposed else source)
    assert not theirs, f"GPT-2 parameters left unset: {sorted(theirs)}"
    return hf


@torch.no_grad()
def from_hf_gpt2(hf: "GPT2LMHeadModel") -> GPT:
    """Our GPT (float32, eval mode) with the weights of a GPT2LMHeadModel, computing the same logits."""
    model = GPT(from_hf_config(hf.config)).eval()
    ours = dict(model.named_parameters())
    theirs = {name: p.float() for name, p in hf.named_parameters()}
    for hf_name, our_name, transposed in weight_map(model.config.n_layer):
        source = theirs.pop(hf_name)
        ours.pop(our_name).copy_(source.T if transposed else source)
    assert not ours, f"our parameters left unset: {sorted(ours)}"
    assert not theirs, f"GPT-2 parameters not converted: {sorted(theirs)}"
    return model
