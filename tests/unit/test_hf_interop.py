"""Exact interoperability with transformers' GPT2LMHeadModel, both ways, and scripts/convert_hf.py.

Random-initialised models only (no download): equal logits within 1e-4 in float32 on random
batches, identical greedy generations, and refusals that name the setting GPT-2 cannot hold.
"""

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from data import tokenizer as tokenizer_mod  # noqa: E402
from data.tokenizer import CharTokenizer  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from model.hf_interop import check_gpt2_compatible, from_hf_config, from_hf_gpt2, to_hf_gpt2  # noqa: E402
from scripts.convert_hf import export_checkpoint, import_hf  # noqa: E402
from scripts.convert_hf import main as convert_main  # noqa: E402
from training.checkpoint import load_model, save_checkpoint  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 97


def decisive(model: torch.nn.Module) -> torch.nn.Module:
    """Wider random weights: GPT-2's init gives near-uniform logits, where greedy decoding would test
    the tie-breaking of nearly equal logits instead of the conversion."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.15) if p.dim() > 1 else p.normal_(0.0, 0.05)
    return model


def random_hf(n_inner: int | None = None, activation: str = "gelu_new"):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=32,
        n_embd=48,
        n_layer=2,
        n_head=4,
        n_inner=n_inner,
        activation_function=activation,
        bos_token_id=None,
        eos_token_id=None,
    )
    return decisive(transformers.GPT2LMHeadModel(config)).eval()


def batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, shape, generator=g) for shape in ((3, 32), (1, 7), (5, 19))]


def assert_same_logits(ours: GPT, hf) -> None:
    with torch.no_grad():
        for idx in batches():
            err = (ours(idx)[0] - hf(input_ids=idx).logits).abs().max().item()
            assert err < 1e-4, f"logits differ by {err} on a {tuple(idx.shape)} batch"


def assert_same_greedy_tokens(ours: GPT, hf) -> None:
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))
    theirs = hf.generate(prompt, max_new_tokens=25, do_sample=False, pad_token_id=0)
    mine = ours.generate(prompt, 25, temperature=0)
    assert theirs.shape == (2, 30)
    assert torch.equal(mine, theirs)
    assert len(set(mine[:, 5:].flatten().tolist())) > 1, "a greedy loop of one token would prove little"


@pytest.mark.parametrize("n_inner,activation", [(None, "gelu_new"), (80, "gelu_pytorch_tanh")])
def test_imported_gpt2_gives_hf_logits_and_greedy_tokens(n_inner, activation):
    hf = random_hf(n_inner, activation)
    ours = from_hf_gpt2(hf)
    assert ours.config.ff_dim == (n_inner or 4 * 48) and ours.config.bias
    assert ours.num_params() == hf.num_parameters()
    assert_same_logits(ours, hf)
    assert_same_greedy_tokens(ours, hf)


@pytest.mark.parametrize("bias", [True, False])
def test_exported_model_gives_our_logits_and_greedy_tokens(bias):
    torch.manual_seed(0)
    ours = decisive(GPT(GPTConfig(vocab_size=VOCAB, block_size=32, n_layer=2, n_head=4, d_model=48, bias=bias)))
    ours.eval()
    hf = to_hf_gpt2(ours)
    assert_same_logits(ours, hf)
    assert_same_greedy_tokens(ours, hf)
    if not bias:  # a bias-free model exports with zero biases
        assert hf.transformer.h[0].attn.c_attn.bias.abs().sum() == 0
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr(), "the head stays tied"


def test_round_trip_through_hf_is_exact():
    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=VOCAB, block_size=32, n_layer=2, n_head=4, d_model=48, bias=True)).eval()
    back = from_hf_gpt2(to_hf_gpt2(ours))
    assert back.config == ours.config
    for (name, a), (_, b) in zip(ours.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"pos_encoding": "rope"}, r"model.pos_encoding='rope' cannot be exported to GPT-2"),
        ({"pos_encoding": "sinusoidal"}, r"model.pos_encoding='sinusoidal' cannot be exported"),
        ({"n_kv_head": 2}, r"model.n_kv_head \(2\) cannot be exported to GPT-2"),
        ({"qk_norm": True}, r"model.qk_norm=true cannot be exported to GPT-2"),
        ({"d_k": 16}, r"model.d_k \(16\) cannot be exported to GPT-2, whose heads have d_model / n_head = 12 dims"),
    ],
)
def test_export_refuses_what_gpt2_cannot_hold(overrides, message):
    cfg = GPTConfig(vocab_size=VOCAB, block_size=32, n_layer=1, n_head=4, d_model=48, **overrides)
    with pytest.raises(ValueError, match=message):
        check_gpt2_compatible(cfg)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("activation_function", "gelu", r"activation_function='gelu' is not supported: it must be one of gelu_new"),
        ("scale_attn_by_inverse_layer_idx", True, r"scale_attn_by_inverse_layer_idx=True is not supported"),
        ("layer_norm_epsilon", 1e-6, r"layer_norm_epsilon=1e-06 is not supported: it must be 1e-05"),
        ("scale_attn_weights", False, r"scale_attn_weights=False is not supported"),
    ],
)
def test_import_refuses_gpt2_settings_we_do_not_implement(field, value, message):
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=48, n_layer=1, n_head=4)
    setattr(config, field, value)
    with pytest.raises(ValueError, match=message):
        from_hf_config(config)


def test_convert_script_exports_and_imports_checkpoints(tmp_path, monkeypatch):
    tok = CharTokenizer("\n abcdefghijklmnopqrstuvwxyz")
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=VOCAB, block_size=32, n_layer=2, n_head=4, d_model=48)  # >= the tokenizer's
    model = decisive(GPT(cfg)).eval()
    meta = {"step": 7, "config": {"model": asdict(cfg)}, "tokenizer": tok.to_meta()}
    ckpt = save_checkpoint(tmp_path / "ours.safetensors", model, None, meta)

    hf_dir = export_checkpoint(ckpt, tmp_path / "hf")
    assert {"config.json", "model.safetensors"} <= {p.name for p in hf_dir.iterdir()}
    assert json.loads((hf_dir / "config.json").read_text())["eos_token_id"] == tok.eot_id
    hf = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, local_files_only=True).eval()
    assert_same_logits(model, hf)

    imported, path = import_hf(hf_dir, tmp_path / "back.safetensors")
    assert_same_logits(imported, hf)
    loaded, back = load_model(path)  # what scripts/sample.py does
    assert_same_logits(loaded, hf)
    assert back.meta["config"]["model"] == asdict(loaded.config)
    assert back.meta["config"]["data"]["tokenizer"] == "gpt2"
    # the header names the tokenizer the way the data package reads it back
    monkeypatch.setattr(tokenizer_mod, "gpt2_tokenizer", lambda cache_dir: "the gpt2 tokenizer")
    assert tokenizer_mod.tokenizer_from_meta(back.meta["tokenizer"]) == "the gpt2 tokenizer"


def test_convert_script_errors_are_one_line(tmp_path):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=VOCAB, block_size=16, n_layer=1, n_head=2, d_model=16, pos_encoding="rope")
    ckpt = save_checkpoint(tmp_path / "rope.safetensors", GPT(cfg), None, {"config": {"model": asdict(cfg)}})
    with pytest.raises(SystemExit, match=r"^error: model.pos_encoding='rope' cannot be exported to GPT-2"):
        convert_main(["export", str(ckpt), str(tmp_path / "out")])
    with pytest.raises(SystemExit, match=r"^error: '.*nowhere' is not a Hugging Face model directory"):
        convert_main(["import", str(tmp_path / "nowhere"), str(tmp_path / "x.safetensors")])
    assert not (tmp_path / "out").exists() and not (tmp_path / "x.safetensors").exists()
    # and as a file, the way the README runs it
    result = subprocess.run(
        [sys.executable, "scripts/convert_hf.py", "export", str(ckpt), str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: model.pos_encoding='rope' cannot be exported to GPT-2, which has learned positions"
    ]
