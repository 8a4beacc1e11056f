"""scripts/sample.py: sampling from a checkpoint, its config, and its one-line errors."""

import io
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from data.tokenizer import CharTokenizer
from model import GPT, GPTConfig
from scripts.sample import SampleConfig, register_configs, sample, write_new_text
from training.checkpoint import save_checkpoint

ROOT = Path(__file__).resolve().parents[2]
CHARS = "\n !,.:?abcdefghijklmnopqrstuvwxyz"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny untrained GPT saved the way the trainer saves one."""
    tok = CharTokenizer(CHARS)
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=2, n_head=2, d_model=32)
    torch.manual_seed(0)
    meta = {
        "step": 0,
        "config": {"model": asdict(cfg), "data": {"source": "files", "tokenizer": "char", "cache_dir": ""}},
        "tokenizer": tok.to_meta(),
    }
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt.safetensors", GPT(cfg), None, meta)


def run(checkpoint: Path, **overrides) -> tuple[list[str], str]:
    cfg = SampleConfig(checkpoint=str(checkpoint), device="cpu", max_new_tokens=20, **overrides)
    out = io.StringIO()
    return sample(cfg, out), out.getvalue()


def test_samples_continue_the_prompt_and_are_printed(checkpoint):
    samples, printed = run(checkpoint, prompt="to be", num_samples=3)
    assert len(samples) == 3
    for text in samples:
        assert text.startswith("to be") and len(text) >= len("to be") + 20  # EOT decodes to 13 characters
        assert text in printed
    assert printed.count("---------------") == 2


def test_same_seed_same_text_and_streaming_prints_the_same(checkpoint):
    a, printed = run(checkpoint, prompt="why", seed=3, num_samples=2)
    b, streamed = run(checkpoint, prompt="why", seed=3, num_samples=2, stream=True)
    c, _ = run(checkpoint, prompt="why", seed=4, num_samples=2)
    assert a == b and printed == streamed
    assert a != c


def test_uncached_sampling_gives_the_same_text(checkpoint):
    assert run(checkpoint, seed=5, top_p=0.9)[0] == run(checkpoint, seed=5, top_p=0.9, use_cache=False)[0]


def test_prompt_file_and_greedy(checkpoint, tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text("what is\n", encoding="utf-8")
    from_file, _ = run(checkpoint, prompt_file=str(path), temperature=0.0)
    from_cli, _ = run(checkpoint, prompt="what is\n", temperature=0.0, seed=99)
    assert from_file == from_cli  # greedy: the seed does not matter


def test_the_real_config_composes_to_a_sample_config():
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose(config_name="sample", overrides=["checkpoint=x.safetensors", "top_p=0.9", "num_samples=2"])
    typed = OmegaConf.to_object(cfg)
    assert isinstance(typed, SampleConfig)
    assert (typed.checkpoint, typed.top_p, typed.num_samples, typed.top_k) == ("x.safetensors", 0.9, 2, 200)


@pytest.mark.parametrize(
    "overrides,error,message",
    [
        ({"checkpoint": ""}, ValueError, "checkpoint is not set"),
        ({"checkpoint": "missing.safetensors"}, FileNotFoundError, "checkpoint 'missing.safetensors' does not exist"),
        ({"prompt": ""}, ValueError, "the prompt is empty"),
        ({"prompt_file": "nope.txt"}, FileNotFoundError, "prompt_file 'nope.txt' does not exist"),
        ({"prompt": "Caps"}, ValueError, "the prompt cannot be encoded: characters 'C' are not in the char vocabulary"),
        ({"temperature": -0.5}, ValueError, r"temperature=-0.5 is invalid; it must be >= 0"),
        ({"top_p": 0.0}, ValueError, r"top_p=0.0 is invalid; it must be in \(0, 1\]"),
        ({"top_p": 1.01}, ValueError, r"top_p=1.01 is invalid; it must be in \(0, 1\]"),
        ({"num_samples": 0}, ValueError, "num_samples=0 is invalid"),
        ({"context_length": 10_000}, ValueError, r"context_length=10000 is invalid; .* <= block_size"),
    ],
)
def test_bad_input_is_refused_with_a_message(checkpoint, overrides, error, message):
    cfg = {"checkpoint": str(checkpoint), **overrides}
    with pytest.raises(error, match=message):
        run(**cfg)


def test_corrupt_checkpoint_is_refused(checkpoint, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(checkpoint.read_bytes()[:100])
    with pytest.raises(ValueError, match="is corrupt or not a safetensors file"):
        run(bad)


def test_streaming_holds_back_a_half_decoded_character():
    class Bytes:  # decodes ids as UTF-8 bytes, like a byte-level BPE
        def decode(self, ids):
            return bytes(ids).decode("utf-8", errors="replace")

    out = io.StringIO()
    printed = write_new_text(out, Bytes(), [104, 0xC3], "")  # "h" + the first byte of "é"
    assert printed == "" and out.getvalue() == ""
    printed = write_new_text(out, Bytes(), [104, 0xC3, 0xA9], printed)
    assert printed == "hé" and out.getvalue() == "hé"


@pytest.mark.slow
def test_cli_prints_text_and_exits_nonzero_with_one_line_errors(checkpoint, tmp_path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": ""}  # the script must find the repo by itself
        command = [sys.executable, str(ROOT / "scripts" / "sample.py"), f"checkpoint={checkpoint}", *args]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    ok = cli("prompt=hello", "max_new_tokens=10", "stream=true", "device=cpu")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ok.stdout.startswith("hello") and len(ok.stdout) >= len("hello") + 10
    assert list(tmp_path.iterdir()) == [], "sampling must not write a run directory"
    bad = cli("top_p=2", "device=cpu")
    assert bad.returncode != 0
    expected = "error: top_p=2.0 is invalid; it must be in (0, 1] (or null for no limit)"
    assert bad.stderr.strip().splitlines() == [expected]
