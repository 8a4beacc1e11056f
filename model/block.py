"""Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)) (GPT-2 layout)."""

from torch import Tensor, nn

from model.attention import CausalSelfAttention
from model.config import GPTConfig
from model.kv_cache import LayerCache
from model.mlp import MLP


def build_norm(config: GPTConfig) -> nn.Module:
    """The block's and the final norm: GPT-2's LayerNorm (bias as config.bias) or RMSNorm (no bias)."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.d_model, eps=1e-5)
    return nn.LayerNorm(config.d_model, bias=config.bias)


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = build_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = build_norm(config)
        self.mlp = MLP(config)

    def forward(
        self,
        x: Tensor,
        padding_mask: Tensor | None = None,
        cache: LayerCache | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        x = x + self.attn(self.ln_1(x), padding_mask, cache, rotary)
        return x + self.mlp(self.ln_2(x))
