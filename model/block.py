"""Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x)) (GPT-2 layout)."""

from torch import Tensor, nn

from model.attention import CausalSelfAttention
from model.kv_cache import LayerCache
from model.mlp import MLP


class Block(nn.Module):
    def __init__(
        self,
        d_model: int,
        n_head: int,
        d_k: int,
        d_ff: int,
        dropout: float,
        bias: bool,
        attn_backend: str,
        n_kv_head: int | None = None,
        qk_norm: bool = False,
    ) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, bias=bias)
        self.attn = CausalSelfAttention(d_model, n_head, d_k, dropout, bias, attn_backend, n_kv_head, qk_norm)
        self.ln_2 = nn.LayerNorm(d_model, bias=bias)
        self.mlp = MLP(d_model, d_ff, dropout, bias)

    def forward(
        self,
        x: Tensor,
        padding_mask: Tensor | None = None,
        cache: LayerCache | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        x = x + self.attn(self.ln_1(x), padding_mask, cache, rotary)
        return x + self.mlp(self.ln_2(x))
