"""Exact weight conversion between our GPT and Hugging Face transformers' `GPT2LMHeadModel`.

GPTConfig's own defaults (and `model=gpt2`) are GPT-2's architecture with other names: learned positions,
pre-LayerNorm blocks (eps 1e-5), fused Q|K|V projection, GELU in its tanh form ("gelu_new"), tied LM head.
The default run's model (configs/model/small.yaml: RoPE, QK-norm, gated attention, an untied head) is not,
and its export is refused with the settings that differ. For a GPT-2-shaped model only
two things differ in the tensors: the names, and GPT-2's `Conv1D` stores its weight as
(in, out), the transpose of `nn.Linear`'s (out, in). A model without biases exports with zero
biases, which computes the same function. An export proves itself rather than trusting a list of knobs:
every tensor of ours must have a GPT-2 place, and the GPT-2 model's logits must equal ours on a probe batch.

`transformers` is an optional dependency: it is imported only when a conversion runs.
"""

import dataclasses
import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from model.config import GPTConfig
from model.gpt import GPT

if TYPE_CHECKING:
    from transformers import GPT2Config, GPT2LMHeadModel

LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which our blocks use; GPT-2's layer_norm_epsilon too
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")  # transformers' names for GELU's tanh approximation
NOT_GPT2 = "the model cannot be exported to GPT-2"
# Of the logits' scale (at least 1): float32 conversions agree to ~1e-7 of it; a different function misses by far more.
LOGITS_TOLERANCE = 1e-4


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


def gpt2_shapes(hf: "GPT2Config") -> dict[str, tuple[int, ...]]:
    """The shape of every tensor weight_map names, from a GPT-2 config alone (Conv1D weights are (in, out))."""
    d = hf.n_embd
    f = 4 * d if hf.n_inner is None else hf.n_inner  # as GPT2Block reads it (0 is 0)
    block = {"ln_1": (d,), "attn.c_attn": (d, 3 * d), "attn.c_proj": (d, d), "ln_2": (d,), "mlp.c_fc": (d, f)}
    block["mlp.c_proj"] = (f, d)
    shapes = {"transformer.wte.weight": (hf.vocab_size, d), "transformer.wpe.weight": (hf.n_positions, d)}
    for i in range(hf.n_layer):
        for module, shape in block.items():
            shapes[f"transformer.h.{i}.{module}.weight"] = shape
            shapes[f"transformer.h.{i}.{module}.bias"] = shape[-1:]
    return shapes | {"transformer.ln_f.weight": (d,), "transformer.ln_f.bias": (d,)}


def check_weights_fit(hf: "GPT2Config", stored: dict[str, tuple[int, ...]]) -> None:
    """ValueError (one line) unless the weights' shapes (read from their header) are the ones `hf` describes.
    Checked before any model is built: a config.json claiming 20000 layers took 90 s and 2.3 GB to refuse."""
    stored = {name.removeprefix("transformer."): shape for name, shape in stored.items()}  # the hub's gpt2 has none
    layers = len({m[1] for name in stored if (m := re.match(r"h\.(\d+)\.", name))})
    if hf.n_layer != layers:  # before listing thousands of missing tensors
        raise ValueError(f"its config.json gives n_layer={clip(hf.n_layer)}, its weights hold {layers} layers")
    missing = []
    for name, shape in gpt2_shapes(hf).items():
        have = stored.get(name.removeprefix("transformer."))
        if have is None:
            missing.append(name)
        elif have != shape:
            raise ValueError(
                f"its weights do not fit its config.json: {name} has shape {have}, the config gives {clip(shape)}"
            )
    if missing:
        raise ValueError(f"its weights lack {listing(missing)}, which the model needs")


def clip(value: object, width: int = 40) -> str:
    """str(value), cut to `width` characters: a config.json can hold a 10**40 or a list of a million."""
    text = str(value)
    return text if len(text) <= width else text[:width] + "..."


# GPTConfig's defaults are GPT-2's architecture, so every other field must keep its default to export, except these:
# GPT2Config's own sizes, what acts only in training or at init, the kernel, and what is read only when another
# field turns its variant on. A new variant's field, off by default, is refused by name with no line here.
FREE_IN_GPT2 = {
    *("vocab_size", "block_size", "n_layer", "n_head", "d_model", "d_ff", "bias", "dropout", "attn_dropout"),
    *("zero_init_proj", "attn_backend"),
    *("rope_base", "window_size", "long_window_size", "pointer_scale"),
}


def gpt2_fixed() -> dict[str, object]:
    """Every GPTConfig field GPT-2 fixes, at its value there (the field's default)."""
    return {f.name: f.default for f in dataclasses.fields(GPTConfig) if f.name not in FREE_IN_GPT2}


def in_gpt2_layout(config: GPTConfig) -> GPTConfig:
    """`config`'s sizes with GPT-2's architecture: every field GPT-2 fixes at its default (bench_train's GPT-2 row)."""
    return dataclasses.replace(config, **gpt2_fixed())


def check_gpt2_compatible(config: GPTConfig) -> None:
    """Raise ValueError naming every setting GPT2LMHeadModel cannot represent, and the overrides that
    train a model it can (all at once: a user fixing them one at a time would retrain once each)."""
    gpt2 = gpt2_fixed()
    why = {"pos_encoding": "learned positions", "n_kv_head": f"one key/value head per query head ({config.n_head})"}
    why |= {"qk_norm": "no QK-norm", "d_k": f"heads of d_model / n_head = {config.d_model / config.n_head:g} dims"}
    why |= {"pointer_weight": "no continuous cache", "train_block_size": "learned positions, trained at every one"}
    wrong = {name: want for name, want in gpt2.items() if getattr(config, name) != want}
    if config.kv_heads == config.n_head:  # n_kv_head / d_k set to what GPT-2 has anyway
        wrong.pop("n_kv_head", None)
    if config.head_dim * config.n_head == config.d_model:
        wrong.pop("d_k", None)
    if config.train_length == config.block_size:  # GPT-2's learned positions train on whole block_size sequences
        wrong.pop("train_block_size", None)
    if wrong:
        found = ", ".join(
            f"model.{name}={hydra_text(getattr(config, name))} (GPT-2 has {why.get(name, hydra_text(want))})"
            for name, want in wrong.items()
        )
        fix = " ".join(f"model.{name}={hydra_text(want)}" for name, want in wrong.items())
        raise ValueError(f"{NOT_GPT2}: {found}; a model that exports trains with {fix}")


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
        attn_pdrop=config.attention_dropout,
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
    if dropout != hf.embd_pdrop:  # one knob covers both; fine-tuning is rare here
        dropout = 0.0
    attn_dropout = None if hf.attn_pdrop == dropout else float(hf.attn_pdrop)
    return GPTConfig(
        vocab_size=hf.vocab_size,
        block_size=hf.n_positions,
        n_layer=hf.n_layer,
        n_head=hf.n_head,
        d_model=hf.n_embd,
        d_ff=hf.n_inner,
        dropout=dropout,
        attn_dropout=attn_dropout,
        bias=True,
    )


@torch.no_grad()
def to_hf_gpt2(model: GPT, eos_token_id: int | None = None) -> "GPT2LMHeadModel":
    """A GPT2LMHeadModel (float32, eval mode) that computes the same logits as `model`. ValueError (one line)
    where it cannot, derived rather than listed: a tensor of ours GPT-2 has no place for, a GPT-2 tensor we
    lack or hold in another shape, or logits that differ on a probe batch (a knob check_gpt2_compatible does
    not know, such as a new attention variant, exported silently wrong before)."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel(to_hf_config(model.config, eos_token_id)).float().eval()
    ours = model.state_dict(keep_vars=True)  # keep_vars: the tensors themselves, so ties show as identity
    pairs = list(weight_map(model.config.n_layer))
    mapped = {id(ours[name]) for _, name, _ in pairs if name in ours}  # a tied lm_head is tok_emb's tensor
    unmapped = [name for name, tensor in ours.items() if id(tensor) not in mapped]
    if unmapped:
        raise ValueError(f"{NOT_GPT2}: GPT-2 has no tensor for {listing(unmapped)}")
    theirs = dict(hf.named_parameters())
    for hf_name, our_name, transposed in pairs:
        target, source = theirs.pop(hf_name), ours.get(our_name)
        if source is None and hf_name.endswith(".bias"):  # bias=False: a zero bias is the same function
            target.zero_()
            continue
        if source is None:
            raise ValueError(f"{NOT_GPT2}: GPT-2's {hf_name} has no counterpart in our model ({our_name})")
        want = target.T.shape if transposed else target.shape
        if source.shape != want:  # copy_ would broadcast some mismatches silently
            shape, want = tuple(source.shape), tuple(want)
            raise ValueError(f"{NOT_GPT2}: our {our_name} has shape {shape}, GPT-2's {hf_name} needs {want}")
        target.copy_(source.T if transposed else source)
    assert not theirs, f"GPT-2 parameters left unset: {sorted(theirs)}"
    check_same_logits(model, hf)
    return hf


def listing(names: list[str]) -> str:
    """names, comma-separated, a tensor of every layer once (blocks.N.attn.sinks): every one named, in one line."""
    return ", ".join(dict.fromkeys(re.sub(r"^blocks\.\d+\.", "blocks.N.", name) for name in names))


def probe_batches(config: GPTConfig) -> list[Tensor]:
    """Fixed token sequences: a batch of short ones, and one that uses every learned position."""
    g = torch.Generator().manual_seed(0)
    shapes = ((2, min(config.block_size, 16)), (1, config.block_size))
    return [torch.randint(0, config.vocab_size, shape, generator=g) for shape in shapes]


@torch.no_grad()
def check_same_logits(model: GPT, hf: "GPT2LMHeadModel") -> None:
    """ValueError unless hf's logits equal model's (fp32, within LOGITS_TOLERANCE) on the probe batches."""
    was_training, device = model.training, next(model.parameters()).device
    model.eval()
    try:
        for idx in probe_batches(model.config):
            ours = model(idx.to(device))[0].float().cpu()
            err = (ours - hf(input_ids=idx).logits).abs().max().item()
            allowed = LOGITS_TOLERANCE * max(1.0, ours.abs().max().item())
            if not err <= allowed:  # NaN fails too
                raise ValueError(
                    f"{NOT_GPT2}: its tensors map to GPT-2's, but the GPT-2 model's logits differ from ours by "
                    f"{err:.3g} on a probe batch (at most {allowed:.3g} allowed)"
                )
    finally:
        model.train(was_training)


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
