"""Interoperability with Hugging Face transformers: GPT-2 weights and tokenizers in and out."""
