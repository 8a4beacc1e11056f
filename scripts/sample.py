"""Sample text from a trained checkpoint: `python -m scripts.sample checkpoint=PATH [key=value ...]` (Hydra).

Examples:
    python -m scripts.sample checkpoint=outputs/run/ckpt_best.safetensors prompt="ROMEO:"
    python -m scripts.sample checkpoint=ckpt.safetensors prompt_file=start.txt num_samples=3 seed=7
    python -m scripts.sample checkpoint=ckpt.safetensors temperature=0 max_new_tokens=200   # greedy
    python -m scripts.sample checkpoint=ckpt.safetensors stream=true top_p=0.9

The text goes to stdout; a problem the user can fix exits non-zero with one line `error: ...`.
"""

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

if __package__ in (None, ""):  # run as a file (python scripts/sample.py): make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hydra
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from data import Tokenizer, tokenizer_from_meta
from model.sampling import check_sampling_args
from training.checkpoint import load_model
from training.runtime import resolve_device

SEPARATOR = "\n---------------\n"


@dataclass
class SampleConfig:
    checkpoint: str = ""  # path to a checkpoint written by train.py
    prompt: str = "\n"  # the text to continue
    prompt_file: str | None = None  # read the prompt from this file instead
    max_new_tokens: int = 500
    temperature: float = 0.8  # 0 = greedy
    top_k: int | None = 200  # null = no limit
    top_p: float | None = None  # nucleus sampling; null = no limit
    num_samples: int = 1
    seed: int = 1337
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    stream: bool = False  # print tokens as they are sampled
    stop_at_eot: bool = False  # end a sample at the tokenizer's end-of-text token
    use_cache: bool = True  # KV cache; false recomputes the context for every token (same tokens, slower)
    context_length: int | None = None  # tokens conditioned on; null = block_size (rope/sinusoidal may go past)
    cache_dir: str = ""  # tokenizer files (GPT-2 ranks); "" = the checkpoint's data.cache_dir

    def validate(self) -> None:
        """Checks only; the first bad value raises ValueError naming it and the rule."""
        if not self.checkpoint:
            raise ValueError("checkpoint is not set; give checkpoint=PATH to a file written by train.py")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} is invalid; it must be >= 0")
        if self.num_samples < 1:
            raise ValueError(f"num_samples={self.num_samples} is invalid; it must be >= 1")
        check_sampling_args(self.temperature, self.top_k, self.top_p)


def register_configs() -> None:
    ConfigStore.instance().store(name="sample_schema", node=SampleConfig)


def read_prompt(cfg: SampleConfig) -> str:
    if cfg.prompt_file:
        path = Path(cfg.prompt_file)
        if not path.is_file():
            raise FileNotFoundError(f"prompt_file {str(path)!r} does not exist")
        text = path.read_text(encoding="utf-8")
    else:
        text = cfg.prompt
    if not text:
        raise ValueError("the prompt is empty; give prompt=TEXT or prompt_file=PATH")
    return text


def encode_prompt(tokenizer: Tokenizer, text: str, vocab_size: int) -> list[int]:
    try:
        ids = tokenizer.encode(text)
    except ValueError as e:  # the char tokenizer names the characters it does not know
        raise ValueError(f"the prompt cannot be encoded: {e}") from None
    if not ids:
        raise ValueError("the prompt encodes to no tokens; give a longer prompt")
    if max(ids) >= vocab_size:
        raise ValueError(f"the prompt has token id {max(ids)}, beyond the model's vocabulary of {vocab_size}")
    return ids


def sample(cfg: SampleConfig, out: TextIO = sys.stdout) -> list[str]:
    """Write num_samples continuations of the prompt to `out`; return them (prompt included)."""
    cfg.validate()
    text = read_prompt(cfg)
    device = resolve_device(cfg.device)
    model, ckpt = load_model(cfg.checkpoint, device)
    data_cfg = ckpt.meta.get("config", {}).get("data", {})
    if "tokenizer" not in ckpt.meta:
        raise ValueError(f"checkpoint {cfg.checkpoint!r} has no tokenizer in its header")
    tokenizer = tokenizer_from_meta(ckpt.meta["tokenizer"], cfg.cache_dir or data_cfg.get("cache_dir", ""))
    ids = encode_prompt(tokenizer, text, model.config.vocab_size)
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    settings = {
        "temperature": cfg.temperature,
        "top_k": cfg.top_k,
        "top_p": cfg.top_p,
        "use_cache": cfg.use_cache,
        "generator": generator,
        "stop_token": tokenizer.eot_id if cfg.stop_at_eot else None,
        "context_length": cfg.context_length,
    }
    samples = []
    for i in range(cfg.num_samples):  # one at a time, so streamed and printed samples are the same
        if i:
            out.write(SEPARATOR)
        new_ids: list[int] = []
        printed = ""
        out.write(text)
        for next_id in model.stream(idx, cfg.max_new_tokens, **settings):
            new_ids.append(int(next_id[0]))
            if cfg.stream:
                printed = write_new_text(out, tokenizer, new_ids, printed)
        completion = tokenizer.decode(new_ids)
        out.write(completion[len(printed) :] + "\n")
        out.flush()
        samples.append(text + completion)
    return samples


def write_new_text(out: TextIO, tokenizer: Tokenizer, ids: list[int], printed: str) -> str:
    """Write what decoding `ids` adds to `printed`; hold back a half-decoded multi-byte character."""
    text = tokenizer.decode(ids)
    if text.endswith("\ufffd"):  # a BPE token may end inside a UTF-8 sequence; wait for the rest
        return printed
    out.write(text[len(printed) :])
    out.flush()
    return text


register_configs()


@hydra.main(version_base=None, config_path="../configs", config_name="sample")
def main(cfg: DictConfig) -> None:
    try:
        sample(OmegaConf.to_object(cfg))
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
