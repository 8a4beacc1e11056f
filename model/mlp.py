"""Position-wise feed-forward network of the transformer block."""

from torch import Tensor, nn


class MLP(nn.Module):
    """d_model -> d_ff -> d_model with GELU (tanh form, as GPT-2 uses, so weights interoperate)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, bias: bool = False) -> None:
        super().__init__()
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.act = nn.GELU(approximate="tanh")
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.down_proj(self.act(self.up_proj(x))))
