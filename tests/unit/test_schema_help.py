"""cli/schema_help.py: help generated from dataclass schemas (names, types, defaults, comments)."""

import dataclasses
import shlex
from dataclasses import dataclass, field

import pytest
from omegaconf import OmegaConf

from cli.schema_help import render_help, schema_fields, show_default
from tests.helpers import ROOT
from training.config import TrainConfig


@dataclass
class Inner:
    depth: int = 3  # how deep it goes
    # the comment above a field
    # spans two lines
    label: str | None = None


@dataclass
class Outer:
    inner: Inner = field(default_factory=Inner)
    rate: float = 0.5  # a rate, with a colon: and "quotes" # and a hash
    names: list[str] = field(default_factory=lambda: ["a"], metadata={"help": "from metadata"})
    bare: bool = True


def leaf_names(cls: type, prefix: str = "") -> list[str]:
    """Dotted leaf names by walking dataclasses.fields: the reference the help is held to."""
    names = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            names += leaf_names(type(default), f"{prefix}{f.name}.")
        else:
            names.append(f"{prefix}{f.name}")
    return names


def test_fields_carry_dotted_names_types_defaults_and_comments():
    docs = {d.name: d for d in schema_fields(Outer)}
    assert list(docs) == ["inner.depth", "inner.label", "rate", "names", "bare"]
    assert (docs["inner.depth"].type, docs["inner.depth"].default, docs["inner.depth"].help) == (
        "int",
        3,
        "how deep it goes",
    )
    assert docs["inner.label"].type == "str | None"
    assert docs["inner.label"].help == "the comment above a field spans two lines"
    assert docs["rate"].help == 'a rate, with a colon: and "quotes" # and a hash'
    assert docs["names"].help == "from metadata" and docs["names"].default == ["a"]
    assert docs["bare"].help == ""


def test_every_train_config_field_appears_in_its_help_with_its_default():
    text = render_help(TrainConfig)
    lines = text.splitlines()
    field_lines = {line.split()[0] for line in lines if not line.startswith("      ")}  # not the help lines
    names = leaf_names(TrainConfig)
    assert len(names) > 50
    assert set(names) <= field_lines, set(names) - field_lines
    d_model = next(line for line in lines if line.split()[0] == "model.d_model")
    assert d_model.split() == ["model.d_model", "int", "=", "256"]
    n_kv = lines.index(next(line for line in lines if line.split()[0] == "model.n_kv_head"))
    assert "GQA" in lines[n_kv + 1]  # the comment written beside the field


def test_train_help_shows_the_default_runs_values_with_the_schemas_meanings():
    """`python train.py --help` gives what a bare run uses (`--cfg job`: configs/*.yaml over the schema),
    not the dataclass defaults it overrides (max_steps 600, budget_s null, batch_size 32, ...)."""
    from omegaconf import OmegaConf

    from cli.config import CONFIG_DIR, compose_configs
    from cli.train_help import help_text

    composed = compose_configs([])
    lines = help_text(CONFIG_DIR).splitlines()
    shown = {line.split()[0]: line.split("= ", 1)[1] for line in lines if line.startswith("  ") and " = " in line}
    for name in leaf_names(TrainConfig):
        assert shown[name] == show_default(OmegaConf.select(composed, name)), name
    assert (shown["budget_s"], shown["max_steps"], shown["optim.optimizer"]) == ("280.0", "null", "'muon'")
    n_kv = lines.index(next(line for line in lines if line.split()[:1] == ["model.n_kv_head"]))
    assert "GQA" in lines[n_kv + 1]  # the meaning is still the dataclass comment


def test_an_unknown_group_option_lists_the_groups_options_only():
    from hydra.errors import MissingConfigException

    from cli.config import compose_configs, composition_error

    with pytest.raises(MissingConfigException) as e:
        compose_configs(["model=huge"])
    message = composition_error(e.value)
    options = sorted(p.stem for p in (ROOT / "configs" / "model").glob("*.yaml"))
    assert message == f"In 'config': Could not find 'model/huge'; available options in 'model': {', '.join(options)}"


QUOTED = [("sample_prompt=ROMEO☃", "\"sample_prompt='ROMEO☃'\""), ("out_dir=/tmp/über", "\"out_dir='/tmp/über'\"")]
QUOTED += [("sample_prompt=(aside)", "\"sample_prompt='(aside)'\"")]
# Defect: a value holding an apostrophe got no hint at all (the hint would have been Hydra-invalid).
QUOTED += [("sample_prompt=ROMEO: it's late", '''"sample_prompt='ROMEO: it\\'s late'"''')]
QUOTED += [('sample_prompt=it\'s "so"', None), ("sample_prompt=it's \\", None)]  # shlex's quoting, still exact


@pytest.mark.parametrize(("override", "shown"), QUOTED)
def test_an_override_hydra_cannot_read_bare_says_how_to_quote_it(override, shown):
    # Defect: it said only "LexerNoViableAltException: sample_prompt=ROMEO☃" (or "Error parsing override"),
    # not what is wrong with the value or what to type instead.
    from hydra.errors import OverrideParseException

    from cli.config import compose_configs, composition_error

    with pytest.raises(OverrideParseException) as e:
        compose_configs([override])
    key, value = override.split("=", 1)
    message = composition_error(e.value)
    assert message.startswith(f"cannot parse override {override!r}: ") and "\n" not in message
    hint = message.split("put the value in Hydra's quotes: ", 1)[1]
    assert shown is None or hint == shown
    (typed,) = shlex.split(hint)  # what the shell passes on when the hint is pasted
    assert OmegaConf.select(compose_configs([typed]), key) == value
