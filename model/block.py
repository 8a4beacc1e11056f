"""Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)) (GPT-2 layout), and its
position-wise feed-forward network (the MLP), with a choice of activation."""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.attention import CausalSelfAttention
from model.config import GPTConfig
from model.kv_cache import LayerCache
from model.latent_attention import MultiHeadLatentAttention

GELU_TANH_SCALE = math.sqrt(2 / math.pi)  # GELU's tanh approximation: tanh(sqrt(2/pi) (x + 0.044715 x^3))


def relu2(x: Tensor) -> Tensor:
    """ReLU(x)^2 (So et al. 2021, "Primer"): sparse like ReLU, smooth at 0 like GELU, and cheap."""
    return F.relu(x).square()


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU's tanh approximation, as GPT-2 uses (so its weights interoperate): x (1 + tanh(u)) / 2 with
    u = sqrt(2/pi) (x + 0.044715 x^3). Compiled, it is written x sigmoid(2u), the same function (1 + tanh(u) =
    2 sigmoid(2u)): inductor's CPU kernels spend about twice as long on a vector tanh as on the sigmoid's exp, and
    the default's step took 0.92x the time on an AMX Xeon (docs/evidence/recipe/round13.md). Eager: the fused op."""
    if torch.compiler.is_compiling():
        return x * torch.sigmoid(2 * GELU_TANH_SCALE * (x + 0.044715 * x * x * x))
    return F.gelu(x, approximate="tanh")


ACTIVATION_FNS = {"gelu_tanh": gelu_tanh, "gelu": F.gelu, "relu2": relu2}


class MLP(nn.Module):
    """d_model -> ff_dim -> d_model: down(act(x W_up))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        d, f = config.d_model, config.ff_dim
        self.up_proj = nn.Linear(d, f, bias=config.bias)
        self.act = ACTIVATION_FNS[config.activation]
        self.down_proj = nn.Linear(f, d, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.down_proj(self.act(self.up_proj(x))))  # (B, T, f) inside


def build_norm(config: GPTConfig) -> nn.Module:
    """The block's and the final norm: GPT-2's LayerNorm (bias as config.bias) or RMSNorm (no bias)."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.d_model, eps=1e-5)
    return nn.LayerNorm(config.d_model, bias=config.bias)


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer: int = 0) -> None:
        super().__init__()
        self.ln_1 = build_norm(config)
        attention = CausalSelfAttention if config.mla_latent is None else MultiHeadLatentAttention
        self.attn = attention(config, layer)  # the layer picks its attention window (and differential lambda)
        self.ln_2 = build_norm(config)
        self.mlp = MLP(config)

    def forward(
        self,
        x: Tensor,
        padding_mask: Tensor | None = None,
        cache: LayerCache | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
        tokens: Tensor | None = None,
    ) -> Tensor:
        x = x + self.attn(self.ln_1(x), padding_mask, cache, rotary, tokens)  # tokens: for value embeddings
        return x + self.mlp(self.ln_2(x))
