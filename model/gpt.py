"""A GPT-style decoder-only language model (Radford et al. 2019, "Language Models are Unsupervised
Multitask Learners"): token + learned position embeddings, pre-LayerNorm blocks, tied LM head.

The defaults are GPT-2's; the config (model/config.py) can swap the positions (sinusoidal, RoPE:
model/position.py), share key/value heads (GQA/MQA), normalise queries and keys and add the attention
variants of 2025-26 (gates, soft-capped scores, sinks, sliding windows, value embeddings:
model/attention.py; differential attention: model/differential.py; multi-head latent attention:
model/latent_attention.py; docs/variants.md), change the MLP's activation (model/block.py) and the norm,
untie the head, zero-init the residual projections, and soft-cap the logits or add a z-loss.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.attention import CausalSelfAttention
from model.bigram import BigramEmbedding, previous_tokens, tokens_before
from model.block import Block, build_norm
from model.config import GPTConfig
from model.differential import DifferentialLambda
from model.kv_cache import KVCache, cache_layout, token_positions
from model.pointer import mix_pointer, pointer_states
from model.position import RotaryEmbedding, SinusoidalPositions


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        config.validate()
        if config.vocab_size is None:
            raise ValueError("model.vocab_size is not set; it comes from the tokenizer of the data")
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.bigram_emb = BigramEmbedding(config.bigram_embeds, config.d_model) if config.bigram_embeds else None
        # Added to the token embeddings (learned, sinusoidal), or rotating Q and K in every layer (rope).
        self.pos_emb: nn.Module | None = None
        self.rotary: RotaryEmbedding | None = None
        if config.pos_encoding == "learned":
            self.pos_emb = nn.Embedding(config.block_size, config.d_model)
        elif config.pos_encoding == "sinusoidal":
            self.pos_emb = SinusoidalPositions(config.d_model)
        else:
            self.rotary = RotaryEmbedding(config.rotary_dim, config.rope_base, table_length=config.block_size)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, layer) for layer in range(config.n_layer))
        self.resid_scales = nn.Parameter(torch.ones(config.n_layer)) if config.x0_mix else None
        self.x0_scales = nn.Parameter(torch.zeros(config.n_layer)) if config.x0_mix else None
        self.ln_f = build_norm(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight  # one matrix reads tokens in and writes them out
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """All of the model's initialisation, in one place (GPT-2's, plus the zero-init knob).

        Linear and embedding weights ~ N(0, 0.02), biases 0, norm gains 1 and LayerNorm biases 0,
        the RMSNorm gains of QK-norm 1 (so it starts as a pure normalisation), attention sink logits
        0 (as one more key that scores 0), differential attention's lambda vectors N(0, 0.1) (as its
        paper), the residual mix's scalars 1 and 0. An untied LM head is a Linear like the others, and
        so are the gates of gated attention and value embeddings, and MLA's projections. The two
        projections that write into the residual stream (attention W_O, MLP down) get std
        0.02 / sqrt(2 * n_layer): each block adds two such terms, so this keeps the variance of the
        residual stream from growing with depth. With zero_init_proj they start at 0 instead: each block
        is then the identity at step 0 and its first update moves only the projection, a gentler start
        that short runs can afford.
        """
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                if name.endswith(("attn.out_proj", "mlp.down_proj")):
                    nn.init.normal_(module.weight, mean=0.0, std=residual_std)
                    if self.config.zero_init_proj:
                        nn.init.zeros_(module.weight)
                else:  # a tied lm_head draws the shared matrix again (same law; seeds stay as before)
                    nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                module.reset_parameters()
            elif isinstance(module, CausalSelfAttention) and module.sinks is not None:
                nn.init.zeros_(module.sinks)
            elif isinstance(module, DifferentialLambda):  # as the paper: lambda starts near lambda_init
                for vector in (module.lq1, module.lk1, module.lq2, module.lk2):
                    nn.init.normal_(vector, mean=0.0, std=0.1)
        if self.x0_scales is not None:  # the residual mix's scalars: the plain residual stream at first
            nn.init.ones_(self.resid_scales)
            nn.init.zeros_(self.x0_scales)
        if self.bigram_emb is not None:  # the model starts as it would without the table
            nn.init.zeros_(self.bigram_emb.table.weight)

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        padding_mask: Tensor | None = None,
        cache: KVCache | None = None,
        last_only: bool = False,
        pointer: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """idx: (B, T) token ids -> logits (B, T, vocab); loss when targets (B, T) are given (-1 = ignore).

        padding_mask: (B, T) bool, True for real tokens; pad on the left, so every row ends with a real
        token. Positions count from each row's first real token. cache: a KVCache from new_cache();
        idx then continues the cached tokens, whose keys/values are reused and extended. last_only:
        logits for the last position only, (B, 1, vocab), which is all sampling needs. pointer: False leaves
        out the continuous cache even in eval mode (sampling's default: generation/generate.py).

        Learned positions end at block_size; sinusoidal and rotary ones take any length (how well a
        model does past the context it was trained on is another matter: see generation/generate.py).
        """
        T, new_padding = idx.shape[1], padding_mask
        cached = cache.length if cache is not None else 0
        if cached + T > self.config.block_size and self.config.pos_encoding == "learned":
            what = f"{cached} cached + {T} new tokens" if cache is not None else f"sequence length {T}"
            raise ValueError(f"{what} exceeds the model's block_size {self.config.block_size}")
        if cache is None:
            positions = token_positions(T, padding_mask, device=idx.device)
            layer_caches = [None] * len(self.blocks)
        else:  # the cache owns positions and the padding of every cached slot
            positions, padding_mask = cache.reserve(T, padding_mask)
            layer_caches = cache.layers
        previous = None
        if self.bigram_emb is not None:  # each token's previous one, and the cache's last token for the next call
            before = tokens_before(idx, new_padding, cache.last_token if cache is not None else None)
            previous = before[:, :-1]
            if cache is not None:
                cache.last_token = before[:, -1]
        x, rotary = self.embed(idx, positions, leading=cache is None and padding_mask is None, previous=previous)
        x0 = x
        for layer, (block, layer_cache) in enumerate(zip(self.blocks, layer_caches, strict=True)):
            x = block(self.block_input(layer, x, x0), padding_mask, layer_cache, rotary, idx)
        assert targets is None or not last_only, "last_only is for sampling; a loss needs every position"
        logits = self.head(x, idx, padding_mask, cache, last_only, pointer)
        loss = None
        if targets is not None:
            loss = self.loss(logits, targets)
        return logits, loss

    def block_input(self, layer: int, x: Tensor, x0: Tensor) -> Tensor:
        """What block `layer` reads: the residual stream, under x0_mix mixed with the embedded tokens x0."""
        if self.x0_scales is None:
            return x
        return self.resid_scales[layer] * x + self.x0_scales[layer] * x0

    def head(
        self,
        x: Tensor,
        idx: Tensor,
        padding_mask: Tensor | None = None,
        cache: KVCache | None = None,
        last_only: bool = False,
        pointer: bool = True,
    ) -> Tensor:
        """The last block's output (B, T, d_model) -> logits (B, T or 1, vocab): the norm, the LM head, the soft
        cap, and in eval mode the continuous cache, whose log-probabilities are the logits (model/pointer.py).
        padding_mask: every position's so far (with a KV cache, the cache's own)."""
        pointing = pointer and self.config.pointer_weight > 0 and not self.training
        if last_only and not pointing:  # the norm acts per position: only the last is needed
            x = x[:, -1:]
        hidden = self.ln_f(x)
        if pointing:  # every position's state, before last_only drops all but the last
            states, tokens, real = self.pointer_context(hidden, idx, padding_mask, cache)
            hidden = hidden[:, -1:] if last_only else hidden
        logits = self.lm_head(hidden)  # (B, T or 1, vocab)
        if self.config.logit_softcap is not None:  # smooth clamp to (-cap, cap): no logit runs away
            cap = self.config.logit_softcap  # in fp32: under bf16 autocast the cap would round every logit
            logits = cap * torch.tanh(logits.float() / cap)
        if pointing:
            logits = mix_pointer(logits, states, tokens, self.config.pointer_weight, self.config.pointer_scale, real)
        return logits

    def pointer_context(
        self, hidden: Tensor, idx: Tensor, padding_mask: Tensor | None, cache: KVCache | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """What the continuous cache points into (model/pointer.py): the states, tokens and padding mask of every
        position so far; with a KV cache, the new ones are kept there first (padding_mask is then the cache's)."""
        states = pointer_states(hidden)
        if cache is None:
            return states, idx, padding_mask
        cache.pointer_states[:, cache.start : cache.length] = states
        cache.tokens[:, cache.start : cache.length] = idx
        return cache.pointer_states[:, : cache.length], cache.tokens[:, : cache.length], padding_mask

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy over targets != -1."""
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)

    def embed(
        self, idx: Tensor, positions: Tensor, leading: bool = False, previous: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """Token embeddings plus additive positions (B, T, d_model), and RoPE's (cos, sin) or None.
        leading: the positions are 0..T - 1 (no cache, no padding), whose cos/sin RoPE keeps in a table.
        previous: each token's previous one, which a bigram table pairs it with (model/bigram.py; None: the
        token before it in idx, none for the first)."""
        x = self.tok_emb(idx)
        if self.bigram_emb is not None:
            x = x + self.bigram_emb(previous_tokens(idx) if previous is None else previous, idx)
        if isinstance(self.pos_emb, SinusoidalPositions):
            # The paper scales token embeddings by sqrt(d_model) (section 3.4); without it the fixed
            # table (amplitude 1) would drown GPT-2-initialised ones (std 0.02) and slow learning.
            x = x * math.sqrt(self.config.d_model) + self.pos_emb(positions).to(x.dtype)  # table is float32
        elif self.pos_emb is not None:
            x = x + self.pos_emb(positions)
        rotary = None
        if self.rotary is not None:
            rotary = self.rotary.leading(idx.shape[1], idx.device) if leading else self.rotary(positions)
        return self.drop(x), rotary

    def max_context(self) -> int | None:
        """The longest sequence this model can take: block_size for learned positions, else None (any)."""
        return self.config.block_size if self.config.pos_encoding == "learned" else None

    def new_cache(self, batch_size: int, max_length: int | None = None, rolling: bool = False) -> KVCache:
        """An empty KV cache: batch_size rows of up to max_length tokens (default block_size; learned
        positions allow no more), keeping n_kv_head heads per layer and only the window of a windowed one.
        rolling: once full, each further token drops the oldest (model/kv_cache.py; rotary positions only)."""
        c = self.config
        max_length = max_length or c.block_size
        limit = self.max_context()
        if max_length < 1 or (limit is not None and max_length > limit):
            raise ValueError(f"KV cache length {max_length} must be in [1, block_size={c.block_size}]")
        if rolling and c.pos_encoding != "rope":
            raise ValueError(f"a rolling KV cache needs rotary positions; model.pos_encoding={c.pos_encoding!r}")
        weight = self.tok_emb.weight
        windows = [c.layer_window(layer) for layer in range(c.n_layer)]
        heads, key_width, value_width = cache_layout(c)  # MLA: its latent (model/latent_attention.py)
        pointer_width = c.d_model if c.pointer_weight > 0 else 0  # the continuous cache's states (model/pointer.py)
        return KVCache(
            c.n_layer,
            batch_size,
            heads,
            max_length,
            key_width,
            weight.device,
            weight.dtype,
            windows,
            value_width,
            pointer_width,
            rolling,
        )

    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Parameter count (the tied head counted once); optionally without the embedding tables (token,
        learned position, value embeddings: every nn.Embedding, so a new table is left out too)."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Embedding))
        return n

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token (forward + backward = 3x forward), counting matmuls only.

        Derived from the modules, so a variant's new Linear is counted without anyone listing it:
        forward = 2 * in * out for every nn.Linear (each runs once per token: Q|K|V, W_O, a gate, the
        MLP's matrices, the LM head), plus each attention layer's QK^T and AV over a context of T
        (`CausalSelfAttention.score_flops`). Attention counts the full T x T like the PaLM paper's
        MFU, although a causal kernel may skip the masked half. Norms, RoPE, softmax and embedding
        lookups are not matmuls. tests/unit/test_flops.py holds this to torch's FLOP counter for
        every variant.
        """
        T = seq_len or self.config.train_length  # a token is trained in a sequence of train_length
        linears = sum(2 * m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        attention = sum(m.score_flops(T) for m in self.modules() if isinstance(m, CausalSelfAttention))
        return 3 * (linears + attention)
