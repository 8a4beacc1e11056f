"""scripts/convert_hf.py refuses what it cannot do faithfully or safely, before it writes or builds anything:
an export whose model GPT-2 cannot compute (derived from the tensors and the logits, not from a list of
knobs), an export --force onto a directory that is not an earlier export, and an import whose config.json
does not fit its weights' header."""

import json
import os
import re
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from interop import hf_model  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from model.attention import CausalSelfAttention  # noqa: E402
from model.block import MLP  # noqa: E402
from rundir.checkpoint import save_checkpoint  # noqa: E402
from scripts import convert_hf  # noqa: E402
from scripts.convert_hf import main as convert_main  # noqa: E402
from tests.unit.test_hf_interop import VOCAB, char_run, convert_error, decisive, random_hf, snapshot  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_checkpoint(tmp_path: Path, **overrides) -> Path:
    """A GPT-2-shaped char checkpoint (as far as the config says) with decisive weights."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=VOCAB, block_size=32, n_layer=2, n_head=4, d_model=48, **overrides)
    meta = {"step": 1, "config": {"model": asdict(cfg)}, "tokenizer": {"name": "char", "chars": "abc"}}
    return save_checkpoint(tmp_path / "ckpt.safetensors", decisive(GPT(cfg)).eval(), None, meta)


def test_export_refuses_a_parameter_gpt2_has_no_tensor_for(tmp_path, capsys, monkeypatch):
    # Defect: a knob the allow-list did not know (here a gated attention output, as a new variant would add)
    # exported silently: the gate was dropped and the GPT-2 model's logits differed from ours.
    init, forward = CausalSelfAttention.__init__, CausalSelfAttention.forward

    def gated_init(self, config: GPTConfig, *args, **kwargs) -> None:
        init(self, config, *args, **kwargs)
        self.gate = nn.Linear(config.d_model, config.d_model)

    def gated_forward(self, x, *args, **kwargs):
        return forward(self, x, *args, **kwargs) * torch.sigmoid(self.gate(x))

    monkeypatch.setattr(CausalSelfAttention, "__init__", gated_init)
    monkeypatch.setattr(CausalSelfAttention, "forward", gated_forward)
    ckpt = tiny_checkpoint(tmp_path)
    line = convert_error(["export", str(ckpt), str(tmp_path / "hf")], capsys)
    assert line == (
        "error: the model cannot be exported to GPT-2: GPT-2 has no tensor for blocks.N.attn.gate.weight, "
        "blocks.N.attn.gate.bias"
    )
    assert not (tmp_path / "hf").exists()


def test_export_refuses_a_model_whose_logits_gpt2_does_not_reproduce(tmp_path, capsys, monkeypatch):
    # every tensor maps to GPT-2's, but the model computes something else with them
    forward = MLP.forward
    monkeypatch.setattr(MLP, "forward", lambda self, x: 1.5 * forward(self, x))
    ckpt = tiny_checkpoint(tmp_path)
    line = convert_error(["export", str(ckpt), str(tmp_path / "hf")], capsys)
    assert re.fullmatch(
        r"error: the model cannot be exported to GPT-2: its tensors map to GPT-2's, but the GPT-2 model's logits "
        r"differ from ours by [0-9.e-]+ on a probe batch \(at most [0-9.e-]+ allowed\)",
        line,
    ), line
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize(
    "overrides",
    [
        {"pos_encoding": "rope"},
        {"pos_encoding": "sinusoidal"},
        {"n_kv_head": 2},
        {"qk_norm": True},
        {"d_k": 16},
        {"norm": "rmsnorm"},
        {"activation": "relu2"},
        {"tie_embeddings": False},
        {"logit_softcap": 5.0},
    ],
)
def test_the_derived_checks_alone_refuse_every_knob_the_list_knows(monkeypatch, overrides):
    # with the allow-list switched off, the tensors and the logits still tell: the next knob needs no entry.
    # (Not activation=gelu: exact GELU moves these logits by ~1e-5 of their scale, under the probe's 1e-4.)
    monkeypatch.setattr(hf_model, "check_gpt2_compatible", lambda config: None)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=VOCAB, block_size=32, n_layer=2, n_head=4, d_model=48, bias=True, **overrides)
    with pytest.raises(ValueError, match=r"^the model cannot be exported to GPT-2: "):
        hf_model.to_hf_gpt2(decisive(GPT(cfg)).eval())


def test_export_force_replaces_an_earlier_export_only(tmp_path, capsys):
    # Defect: `export outputs/run1 outputs --force` deleted outputs: run1 (the source) and every other run.
    run = char_run(tmp_path)  # tmp_path/run/checkpoints/best.safetensors
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    (tmp_path / "run" / "hf").mkdir()  # the source's own run directory may hold its export
    convert_main(["export", str(run), str(tmp_path / "run" / "hf")])
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")  # looks like an export; no marker says it is one
    cases = {
        str(tmp_path): "export directory '.*' holds the checkpoint being exported .*; --force would delete it",
        str(run): "export directory '.*run' holds the checkpoint being exported",
        str(run / "checkpoints"): "export directory '.*checkpoints' holds the checkpoint being exported",
        str(tmp_path / "notes"): "export directory '.*notes' is not an earlier export \\(it has no attnlab_export.json",
        str(tmp_path / "hf"): "export directory '.*hf' is not an earlier export",
    }
    for out, message in cases.items():
        before = snapshot(tmp_path)
        line = convert_error(["export", str(run), out, "--force"], capsys)
        assert re.fullmatch(f"error: {message}.*", line), line
        assert snapshot(tmp_path) == before, out

    earlier = tmp_path / "run" / "hf"
    (earlier / "README.md").write_text("my notes on this export")  # a file the export did not write
    line = convert_error(["export", str(run), str(earlier), "--force"], capsys)
    assert re.fullmatch(
        r"error: export directory '.*hf' holds README.md, which no export wrote; --force would delete it.*", line
    ), line
    (earlier / "README.md").unlink()
    marker = json.loads((earlier / "attnlab_export.json").read_text())
    assert marker["source"] == str((run / "checkpoints" / "best.safetensors").resolve())
    assert set(marker["files"]) == {p.name for p in earlier.iterdir()} - {"attnlab_export.json"}
    (earlier / "model.safetensors").write_bytes(b"stale")
    convert_main(["export", str(run), str(earlier), "--force"])  # an earlier export, replaced
    assert (earlier / "model.safetensors").stat().st_size > 1000
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoints", "hf"], "no staging left"


@pytest.mark.parametrize("step", ["writing", "swapping"])
def test_export_force_keeps_the_earlier_export_when_a_step_fails(tmp_path, capsys, monkeypatch, step):
    run = char_run(tmp_path)
    out = tmp_path / "hf"
    convert_main(["export", str(run), str(out)])
    before = snapshot(tmp_path)
    rename = os.rename

    def fail(*args, **kwargs):
        raise OSError("disk full")

    def fail_staged(src, dst):  # the staged export into place; the earlier one was renamed away
        fail() if ".tmp-" in str(src) else rename(src, dst)

    if step == "writing":
        monkeypatch.setattr(convert_hf, "save_hf_tokenizer", fail)
    else:
        monkeypatch.setattr(os, "rename", fail_staged)
    assert convert_error(["export", str(run), str(out), "--force"], capsys) == "error: disk full"
    assert snapshot(tmp_path) == before


def test_import_force_refuses_to_replace_a_file_it_reads(tmp_path, capsys):
    hf_dir = tmp_path / "hf"
    random_hf().save_pretrained(hf_dir)
    before = snapshot(tmp_path)
    line = convert_error(["import", str(hf_dir), str(hf_dir / "model.safetensors"), "--force"], capsys)
    assert re.fullmatch(r"error: checkpoint '.*model.safetensors' is a file of '.*hf', the directory being "
                        r"imported; --force would replace it", line), line  # fmt: skip
    assert snapshot(tmp_path) == before


def no_model_built(monkeypatch) -> None:
    """Fail the test if any GPT-2 or GPT model is constructed."""

    def refuse(*args, **kwargs):
        pytest.fail("a model was built")

    monkeypatch.setattr(transformers.GPT2LMHeadModel, "__init__", refuse)
    monkeypatch.setattr(convert_hf, "from_hf_gpt2", refuse)


@pytest.mark.parametrize(
    "change,named",
    [
        ({"n_layer": 20000}, r"its config.json gives n_layer=20000, its weights hold 2 layers"),
        ({"n_layer": 1}, r"its config.json gives n_layer=1, its weights hold 2 layers"),
        (
            {"n_embd": 64, "n_head": 4},
            r"its weights do not fit its config.json: transformer.wte.weight has shape \(97, 48\), "
            r"the config gives \(97, 64\)",
        ),
        (
            {"vocab_size": 10**40},
            r"its weights do not fit its config.json: transformer.wte.weight has shape \(97, 48\), "
            r"the config gives \(10{20,}\.\.\.",
        ),
        (
            {"n_inner": 100},
            r"its weights do not fit its config.json: transformer.h.0.mlp.c_fc.weight has shape \(48, 192\), "
            r"the config gives \(48, 100\)",
        ),
    ],
    ids=["20000 layers", "fewer layers", "wider", "a huge vocabulary", "another MLP width"],
)
def test_import_checks_config_json_against_the_weights_header_before_building(
    tmp_path, capsys, monkeypatch, change, named
):
    # Defect: a config.json claiming n_layer=20000 beside 2 layers of weights built the model first
    # (90 s, 2.3 GB), then printed an 8.5 MB error listing the missing tensors.
    hf_dir = tmp_path / "odd"
    random_hf().save_pretrained(hf_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps(config | change))
    no_model_built(monkeypatch)
    before = snapshot(tmp_path)
    line = convert_error(["import", str(hf_dir), str(tmp_path / "x.safetensors")], capsys)
    assert re.fullmatch(rf"error: '.*odd': {named}", line), line
    assert len(line) < 300 and snapshot(tmp_path) == before


def test_import_refuses_a_model_larger_than_memory_before_building(tmp_path, capsys, monkeypatch):
    hf_dir = tmp_path / "big"
    random_hf().save_pretrained(hf_dir)
    no_model_built(monkeypatch)
    monkeypatch.setattr(convert_hf, "memory_bytes", lambda: 10**5)  # a machine of 100 kB
    line = convert_error(["import", str(hf_dir), str(tmp_path / "x.safetensors")], capsys)
    assert re.fullmatch(
        r"error: '.*big': its 0.1M parameters need 0.0 GB to convert in float32; this machine has 0.0 GB", line
    ), line
    assert not (tmp_path / "x.safetensors").exists()


def test_import_reads_weights_saved_without_the_transformer_prefix(tmp_path):
    # the hub's own gpt2 model.safetensors names its tensors h.0.attn.c_attn.weight, wte.weight, ...
    import transformers
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)  # GPT-2's vocabulary: without a tokenizer of its own, the import reads it as GPT-2's
    config = transformers.GPT2Config(vocab_size=50257, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(tmp_path / "hf")
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    save_file({k.removeprefix("transformer."): v for k, v in weights.items()}, tmp_path / "hf" / "model.safetensors")
    model, _ = convert_hf.import_hf(tmp_path / "hf", tmp_path / "x.safetensors")
    idx = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(idx)[0] - hf(input_ids=idx).logits).abs().max() < 1e-4


@pytest.mark.parametrize("n_inner", [None, 80])
def test_the_shapes_checked_before_building_are_those_transformers_builds(n_inner):
    hf = random_hf(n_inner)
    assert hf_model.gpt2_shapes(hf.config) == {name: tuple(p.shape) for name, p in hf.named_parameters()}
