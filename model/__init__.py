"""The model: attention from the equation, transformer blocks and the GPT around them."""

from model.config import GPTConfig
from model.gpt import GPT

__all__ = ["GPT", "GPTConfig"]
