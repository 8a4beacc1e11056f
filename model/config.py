"""The model's configuration: every architecture knob, its default, its rule, and the derived sizes.

Defaults are GPT-2's architecture (learned positions, GELU in its tanh form, LayerNorm with biases
off, tied head); `configs/model/*.yaml` choose the recipe a run trains. Derived values (head dim,
key/value heads, MLP hidden size) are resolved here and only here, as properties, so every module
reads the same number.

The fixed choices are strings checked by `validate()` rather than `Literal[...]` types: OmegaConf
2.3 cannot type a field as a Literal, and an Enum would reach the checkpoint's JSON as an object.
"""

import math
from dataclasses import dataclass

KERNELS = {"explicit": "the equation", "sdpa": "the fused kernel", "materialized": "the materialized kernel"}
BACKENDS = ("auto", *KERNELS)  # model/attention.py: CausalSelfAttention.kernel ("auto": the fastest that computes it)
POS_ENCODINGS = ("learned", "sinusoidal", "rope")  # model/position.py
ACTIVATIONS = ("gelu_tanh", "gelu", "relu2")  # model/block.py
NORMS = ("layernorm", "rmsnorm")
ATTN_GATES = ("headwise", "elementwise")  # model/attention.py: CausalSelfAttention.gate_proj
# The variants that change the attention scores, and the kernels that compute each. PyTorch's fused kernel (sdpa)
# computes softmax(QK^T / sqrt(d_k) + mask) V and nothing else; the materialized kernel computes the changes its
# forward and hand-written backward implement (model/materialized_attention.py); the explicit one, the equation,
# takes every change. A new change names "explicit" alone until a kernel implements it: `auto` then runs the
# equation, and a kernel that would compute something else is refused in one line.
SCORE_CHANGES = {
    "attn_softcap": ("explicit", "materialized"),
    "attn_sinks": ("explicit", "materialized"),
}


@dataclass
class GPTConfig:
    vocab_size: int | None = None  # None: taken from the tokenizer of the data
    block_size: int = 256  # context: the longest sequence the model takes, the full-val score's window
    # Tokens in a training sequence, at most block_size; null: block_size. Shorter only where every layer is windowed to
    # at most this many keys, so no layer meets a distance it never trained on ("train short, score long").
    train_block_size: int | None = None
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    d_k: int | None = None  # per-head dim; None: d_model // n_head
    d_ff: int | None = None  # MLP hidden size; None: 4 * d_model
    dropout: float = 0.0  # on the embeddings' sum and each block's two outputs (and the attention weights)
    # Dropout on the attention weights alone; None: model.dropout. 0 with dropout > 0 keeps a CPU run on the
    # materialized kernel, which has no attention dropout (the explicit kernel costs ~30% of a step).
    attn_dropout: float | None = None
    bias: bool = False  # biases in every Linear and norm (GPT-2 has them; they buy little)
    attn_backend: str = "auto"  # "explicit" (the equation), "sdpa" (fused), "materialized" or "auto" (fastest)
    pos_encoding: str = "learned"  # "learned" (GPT-2), "sinusoidal" (fixed table) or "rope" (rotary)
    rope_base: float = 10000.0  # RoPE's base: angle of channel pair i is pos * rope_base^(-2i/d_k)
    n_kv_head: int | None = None  # key/value heads (GQA; 1 = MQA); None: n_head (plain multi-head)
    qk_norm: bool = False  # RMSNorm each query and key head before QK^T
    # "gelu_tanh" (GPT-2's tanh approximation), "gelu" (exact erf) or "relu2" (ReLU(x)^2, So et al. 2021 "Primer")
    activation: str = "gelu_tanh"
    norm: str = "layernorm"  # "layernorm" (GPT-2) or "rmsnorm" (no mean subtraction, no bias)
    tie_embeddings: bool = True  # the LM head reuses the token embedding (GPT-2); False: its own matrix
    # Start W_O and the MLP's down projection at zero, so every block begins as the identity (modded-nanogpt);
    # False: GPT-2's N(0, 0.02 / sqrt(2 n_layer)).
    zero_init_proj: bool = False
    # Per-layer scalars (nanochat): block i reads resid_scales[i] * x + x0_scales[i] * x0, x0 the embedded tokens,
    # so a deep block can take the tokens back unmixed; learned, from 1 and 0 (the plain residual stream).
    x0_mix: bool = False
    logit_softcap: float | None = None  # logits = c * tanh(logits / c) (Gemma 2); None: off
    # Gated attention (Qiu et al. 2025): each head's output times sigmoid(x W_gate) before W_O, x the block's
    # normed input; "headwise" (one gate per head) or "elementwise" (one per channel of a head). None: off.
    attn_gate: str | None = None
    attn_softcap: float | None = None  # attention scores = c * tanh(scores / c) before the mask (Gemma 2); None: off
    # Attention sinks (gpt-oss): a learned logit per head added to every softmax's denominator, with no value
    # behind it, so a head can attend to nothing; starts at 0.
    attn_sinks: bool = False
    # Sliding-window attention per layer (Gemma 2, gpt-oss, nanochat): "SSSL" gives layers 0-2 a window of
    # window_size keys (S) and layer 3 long_window_size keys or, null, the full context (L), the pattern repeated
    # over the layers. None: all full.
    window_pattern: str | None = None
    window_size: int = 128  # keys an S layer's query sees, its own included
    long_window_size: int | None = None  # keys an L layer's query sees, its own included; null: the whole context
    # Value embeddings (modded-nanogpt, nanochat): each layer's values get a second token embedding of their own,
    # v + 2 sigmoid(x W_ve_gate) * ve[token], gated per key/value head from the block's normed input.
    value_embeds: bool = False
    # Hashed bigram embeddings (model/bigram.py): rows of a second token table indexed by a hash of the pair (previous
    # token, this token), added to the token's embedding; 0: off.
    bigram_embeds: int = 0
    # Differential attention (Ye et al. 2024): each head's weights are softmax(Q1 K1^T / sqrt(d)) - lambda
    # softmax(Q2 K2^T / sqrt(d)), Q1, Q2 (and K1, K2) the two halves of its d_k query (key) channels, d = d_k / 2;
    # lambda is learned per layer (model/differential.py). V stays d_k wide.
    attn_diff: bool = False
    # Multi-head latent attention (DeepSeek-V2): keys and values up-projected from a latent c = x W_DKV of this
    # width, which is all the KV cache keeps (plus a rotated rope key under RoPE: model/latent_attention.py). None: off.
    mla_latent: int | None = None
    # The continuous cache (model/pointer.py; Grave et al. 2017): in eval mode the prediction mixes in, with this
    # weight, a pointer to the tokens that followed the earlier positions whose final states match this one's
    # (softmax(pointer_scale * cosine)). 0: off. No parameters; training is unchanged.
    pointer_weight: float = 0.0
    pointer_scale: float = 15.0

    @property
    def attention_dropout(self) -> float:
        return self.dropout if self.attn_dropout is None else self.attn_dropout

    @property
    def head_dim(self) -> int:
        return self.d_k if self.d_k is not None else self.d_model // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head if self.n_kv_head is not None else self.n_head

    @property
    def ff_dim(self) -> int:
        """The MLP's hidden size: d_ff, or GPT-2's 4 * d_model."""
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def rotary_dim(self) -> int:
        """Channels RoPE rotates in a query or key: the head dim; under differential attention each half of it
        (the query or key of a map of its own); under MLA its decoupled rope key, d_k / 2 (DeepSeek-V2's d_h^R)."""
        return self.head_dim // 2 if self.attn_diff or self.mla_latent is not None else self.head_dim

    @property
    def mla_rope_dim(self) -> int:
        """Width of MLA's decoupled rope key and of each head's rope query part: rotary_dim under RoPE, else 0."""
        return self.rotary_dim if self.mla_latent is not None and self.pos_encoding == "rope" else 0

    @property
    def train_length(self) -> int:
        """Tokens in one training sequence: train_block_size, at most block_size (null: block_size)."""
        return min(self.train_block_size or self.block_size, self.block_size)

    def layer_window(self, layer: int) -> int | None:
        """Keys a query of layer `layer` sees: window_size where window_pattern has an S, long_window_size
        where it has an L (None: all), and None everywhere without a pattern."""
        if self.window_pattern is None:
            return None
        short = self.window_pattern[layer % len(self.window_pattern)] == "S"
        return self.window_size if short else self.long_window_size

    def score_changes(self) -> list[str]:
        """The variants this model turns on that change the attention scores (SCORE_CHANGES)."""
        return [name for name in SCORE_CHANGES if getattr(self, name) not in (None, False, 0)]

    def score_kernels(self) -> tuple[str, ...]:
        """The kernels that compute this model's scores: every one, or those that take each of its changes."""
        return tuple(k for k in KERNELS if all(k in SCORE_CHANGES[name] for name in self.score_changes()))

    def check_train_block_size(self) -> None:
        """A model trained on sequences shorter than its block_size must never look further back than it trained."""
        if self.train_block_size is not None and self.train_block_size < 1:
            raise ValueError(
                f"model.train_block_size={self.train_block_size} is invalid; it must be >= 1 or null (block_size)"
            )
        short = self.train_length
        if short == self.block_size:
            return
        if self.pos_encoding != "rope":
            raise ValueError(
                f"model.train_block_size={short} is shorter than model.block_size={self.block_size}, but "
                f"model.pos_encoding={self.pos_encoding} gives positions past {short} that training never showed; "
                "use model.pos_encoding=rope (relative) or model.train_block_size=null"
            )
        wide = [layer for layer in range(self.n_layer) if (self.layer_window(layer) or self.block_size) > short]
        if wide:
            seen = self.layer_window(wide[0]) or f"all {self.block_size}"
            raise ValueError(
                f"model.train_block_size={short} is shorter than model.block_size={self.block_size}, but layer "
                f"{wide[0]} sees {seen} keys: it would meet distances it never trained on; set "
                f"model.train_block_size=null, or window every layer to at most {short} keys "
                "(model.window_pattern, window_size, long_window_size)"
            )

    def validate(self) -> None:
        """Checks only: raises ValueError naming the first bad value and the rule it breaks."""
        self.check_sizes()
        self.check_choices()
        self.check_head_layout()
        self.check_variant_values()

    def check_sizes(self) -> None:
        """Every size is a positive count (d_k, d_ff, vocab_size: or null for their defaults)."""
        sizes = {"block_size": self.block_size, "n_layer": self.n_layer, "n_head": self.n_head, "d_model": self.d_model}
        for name, value in sizes.items():
            if value < 1:
                raise ValueError(f"model.{name}={value} is invalid; it must be >= 1")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"model.vocab_size={self.vocab_size} is invalid; it must be >= 1")
        if self.d_k is not None and self.d_k < 1:
            raise ValueError(f"model.d_k={self.d_k} is invalid; it must be >= 1 (or null for d_model // n_head)")
        if self.d_k is None and self.d_model % self.n_head:
            raise ValueError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_head ({self.n_head}) "
                "when model.d_k is not set"
            )
        if self.d_ff is not None and self.d_ff < 1:
            raise ValueError(f"model.d_ff={self.d_ff} is invalid; it must be >= 1 (or null for 4 * d_model)")
        for name, p in (("dropout", self.dropout), ("attn_dropout", self.attention_dropout)):
            if not 0.0 <= p < 1.0:
                raise ValueError(f"model.{name}={p} is invalid; it must be in [0, 1)")

    def check_choices(self) -> None:
        """Each named choice is one the code has, and the kernel can run it."""
        choices = {
            "attn_backend": (self.attn_backend, BACKENDS),
            "pos_encoding": (self.pos_encoding, POS_ENCODINGS),
            "activation": (self.activation, ACTIVATIONS),
            "norm": (self.norm, NORMS),
        }
        for name, (value, allowed) in choices.items():
            if value not in allowed:
                raise ValueError(f"model.{name}={value!r} is unknown; choose one of: {', '.join(allowed)}")
        if self.attn_backend == "materialized" and self.attention_dropout > 0:
            raise ValueError(
                f"model.attn_backend='materialized' has no attention dropout ({self.attention_dropout}); "
                "use auto or sdpa, or set model.attn_dropout=0"
            )

    def check_head_layout(self) -> None:
        """The heads: what their dim must divide into for RoPE, differential attention and MLA, the MLA latent,
        the RoPE base and GQA's groups."""
        if self.pos_encoding == "rope" and self.head_dim % 2:
            raise ValueError(
                f"model.pos_encoding='rope' rotates pairs of channels; the head dim ({self.head_dim}) must be even"
            )
        if self.attn_diff and self.head_dim % 2:
            raise ValueError(
                f"model.attn_diff=True splits each query and key head into two halves; the head dim ({self.head_dim}) "
                "must be even"
            )
        if self.mla_latent is not None and self.mla_latent < 1:
            raise ValueError(f"model.mla_latent={self.mla_latent} is invalid; it must be >= 1 (or null for off)")
        if self.pos_encoding == "rope" and self.rotary_dim % 2:
            what = "each half of a head" if self.attn_diff else "MLA's rope key of head_dim / 2 channels"
            raise ValueError(
                f"model.pos_encoding='rope' rotates pairs of channels of {what}; the head dim ({self.head_dim}) "
                "must be a multiple of 4"
            )
        # Not with MLA: value embeddings add to values that the cached latent cannot hold, and differential
        # attention's halves would cut across MLA's content and rope channels.
        for name in ("attn_diff", "value_embeds"):
            if self.mla_latent is not None and getattr(self, name):
                raise ValueError(
                    f"model.{name}=True cannot be combined with model.mla_latent={self.mla_latent}; choose one of them"
                )
        if not 1.0 < self.rope_base < math.inf:  # NaN fails both comparisons, here and below
            raise ValueError(f"model.rope_base={self.rope_base} is invalid; it must be > 1 and finite")
        if self.n_kv_head is not None and self.n_kv_head < 1:
            raise ValueError(f"model.n_kv_head={self.n_kv_head} is invalid; it must be >= 1 (or null for n_head)")
        if self.n_head % self.kv_heads:
            raise ValueError(f"model.n_kv_head ({self.n_kv_head}) must divide model.n_head ({self.n_head})")

    def check_variant_values(self) -> None:
        """The 2025-26 variants' values (docs/variants.md), and what the fused kernel cannot compute."""
        if self.logit_softcap is not None and not 0 < self.logit_softcap < math.inf:
            raise ValueError(
                f"model.logit_softcap={self.logit_softcap} is invalid; it must be a finite number > 0 (or null for off)"
            )
        if self.attn_gate is not None and self.attn_gate not in ATTN_GATES:
            allowed = ", ".join(ATTN_GATES)
            raise ValueError(f"model.attn_gate={self.attn_gate!r} is unknown; choose one of: {allowed} (or null: off)")
        if self.attn_softcap is not None and not 0 < self.attn_softcap < math.inf:
            raise ValueError(
                f"model.attn_softcap={self.attn_softcap} is invalid; it must be a finite number > 0 (or null for off)"
            )
        if self.window_pattern is not None and not (self.window_pattern and set(self.window_pattern) <= {"S", "L"}):
            raise ValueError(
                f"model.window_pattern={self.window_pattern!r} is invalid; it must be letters S (window) and "
                "L (long_window_size keys, or the whole context), e.g. SSSL (or null for off)"
            )
        if self.window_size < 1:
            raise ValueError(f"model.window_size={self.window_size} is invalid; it must be >= 1")
        if self.bigram_embeds == 1 or self.bigram_embeds < 0:
            raise ValueError(
                f"model.bigram_embeds={self.bigram_embeds} is invalid; it must be 0 (off) or >= 2 (row 0 is a "
                "sequence's first token, the others the hashed pairs)"
            )
        if self.long_window_size is not None and self.long_window_size < 1:
            raise ValueError(
                f"model.long_window_size={self.long_window_size} is invalid; it must be >= 1 or null (all the context)"
            )
        if not 0 <= self.pointer_weight < 1:
            raise ValueError(f"model.pointer_weight={self.pointer_weight} is invalid; it must be in [0, 1) (0 for off)")
        if not 0 < self.pointer_scale < math.inf:
            raise ValueError(f"model.pointer_scale={self.pointer_scale} is invalid; it must be a finite number > 0")
        self.check_train_block_size()
        for name in self.score_changes():
            if self.attn_backend not in ("auto", *SCORE_CHANGES[name]):
                can = ", ".join(SCORE_CHANGES[name])
                raise ValueError(
                    f"model.{name}={getattr(self, name)} changes the attention scores, which "
                    f"model.attn_backend={self.attn_backend!r} ({KERNELS[self.attn_backend]}) cannot; use {can} or auto"
                )
