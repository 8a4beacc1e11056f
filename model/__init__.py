"""The model: attention from the equation, transformer blocks and the GPT around them."""

from model.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
