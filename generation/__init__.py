"""Generation as functions over a model: sampling settings, prefill + KV-cached decoding, text in and out."""
