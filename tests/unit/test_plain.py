"""The plain GPT (`+recipe=plain`: model=plain, optim=adamw, characters, eager) has every mechanism of the default
off, and every study either builds on it or names in its first comment line the stack it ablates."""

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from cli.config import to_train_config
from model import GPTConfig
from tests.helpers import CONFIG_DIR, ROOT, compose_config
from training.optim import OptimConfig

# docs/default.md's mechanisms, in its order, each as the test that it is off in a resolved TrainConfig.
OFF = {
    "rotary positions (RoPE)": lambda c: c.model.pos_encoding in ("learned", "sinusoidal"),
    "QK-norm": lambda c: not c.model.qk_norm,
    "element-wise attention gate": lambda c: c.model.attn_gate is None,
    "untied LM head": lambda c: c.model.tie_embeddings,
    "the embedded tokens mixed into every block (x0)": lambda c: not c.model.x0_mix,
    "sliding windows": lambda c: c.model.window_pattern is None,
    "training sequences shorter than the context": lambda c: c.model.train_length == c.model.block_size,
    "hashed bigram table at the input": lambda c: c.model.bigram_embeds == 0,
    "continuous cache at prediction": lambda c: c.model.pointer_weight == 0.0,
    "a BPE learned from the train split": lambda c: c.data.tokenizer != "bpe",  # characters or GPT-2's fixed BPE
    "BPE-dropout": lambda c: c.data.bpe_dropout == 0.0,
    "Muon for the block matrices": lambda c: c.optim.optimizer == "adamw",
    "the embeddings' own lr": lambda c: c.optim.embedding_lr is None,
    "warmup-stable-decay": lambda c: c.optim.schedule == "cosine",
    "a moving average of the weights (EMA)": lambda c: c.optim.average_from is None,
    "the step compiled": lambda c: not c.compile,
}
SIZES = ("vocab_size", "block_size", "n_layer", "n_head", "d_model")  # what model=plain chooses


def plain(*overrides: str):
    return to_train_config(compose_config(["+recipe=plain", "out_dir=x", *overrides]))


def test_docs_default_lists_the_mechanisms_this_test_checks():
    text = (ROOT / "docs" / "default.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line.split("|")[2]]
    assert len(rows) == len(OFF) == 16, rows


def test_the_plain_stack_has_every_mechanism_of_the_default_off():
    cfg, default = plain(), to_train_config(compose_config(["out_dir=x"]))
    assert [name for name, off in OFF.items() if not off(cfg)] == []
    assert [name for name, off in OFF.items() if off(default)] == []  # each test can fail: the default has it on
    # Nothing else either: every model knob but the sizes is GPTConfig's default (the GPT-2 block, each variant
    # off), and the optimizer is OptimConfig's (AdamW for every parameter, linear warmup, cosine, no average).
    sizes = {name: getattr(GPTConfig(), name) for name in SIZES}
    assert dataclasses.replace(cfg.model, **sizes) == GPTConfig()
    assert cfg.optim == OptimConfig()
    assert (cfg.model.activation, cfg.model.norm, cfg.model.dropout) == ("gelu_tanh", "layernorm", 0.0)


def test_model_plain_with_optim_adamw_is_the_plain_gpt_on_the_defaults_data():
    cfg = to_train_config(compose_config(["model=plain", "optim=adamw", "out_dir=x"]))
    assert (cfg.model, cfg.optim) == (plain().model, plain().optim)
    # The recipe's other two switches: the default's data is the learned BPE with BPE-dropout, and it compiles.
    assert not OFF["BPE-dropout"](cfg) and not OFF["the step compiled"](cfg)


STUDIES = sorted((Path(CONFIG_DIR) / "experiment").glob("*.yaml"))
# What a plain study turns back on, each said in its header: a GPU run compiles (it pays for itself within the run),
# GQA is measured as the models that share key/value heads have it, with RoPE, and GPT-2's BPE is trained with
# the default's optimizer.
GPU = {"the step compiled"}
KEPT = {"vaswani_a": GPU, "vaswani_b": GPU, "bhojanapalli": GPU, "gqa": {*GPU, "rotary positions (RoPE)"}}
KEPT["bpe_budget"] = {"Muon for the block matrices", "warmup-stable-decay"}
PLAIN_BASES = ({"/recipe": "plain"}, {"/study": "plain_cpu"}, {"override /model": "plain"})


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_every_study_builds_on_the_plain_gpt_or_says_which_stack_it_ablates(path):
    text = path.read_text()
    first = text.splitlines()[1]
    defaults = yaml.safe_load(text).get("defaults", [])
    if any(base in defaults for base in PLAIN_BASES):
        assert "the plain GPT" in first, first
        cfg = to_train_config(compose_config([f"+experiment={path.stem}", "out_dir=x"]))
        assert {name for name, off in OFF.items() if not off(cfg)} == KEPT.get(path.stem, set())
    else:
        named = r"on the default stack|(?:ablates|noise floor of) \+recipe=(\w+)|a baseline, not a study"
        stack = re.search(named, first)
        assert stack, f"{path.stem}: its first comment line names no stack: {first}"
        if stack.group(1):
            assert (Path(CONFIG_DIR) / "recipe" / f"{stack.group(1)}.yaml").exists()


def flat(node: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


CPU_STUDIES = [p for p in STUDIES if p.stem.endswith("_cpu") and p.stem != "nanochat_cpu"]  # nanochat's: a baseline


@pytest.mark.parametrize("path", CPU_STUDIES, ids=lambda p: p.stem)
def test_the_cpu_studies_share_one_base_and_repeat_none_of_it(path):
    study = yaml.safe_load(path.read_text())
    base = flat(yaml.safe_load((Path(CONFIG_DIR) / "study" / "plain_cpu.yaml").read_text()))
    assert {"/study": "plain_cpu"} in study["defaults"]
    here = flat({k: v for k, v in study.items() if k != "defaults"})
    assert [key for key, value in here.items() if base.get(key, object()) == value] == []
