"""Each leave-one-out recipe is today's default less exactly the mechanism it names, and docs/default.md says so."""

import re

import pytest
from omegaconf import OmegaConf

from bench.leave_one_out import LEAVE_ONE_OUT
from tests.helpers import ROOT, compose_config


def flat(cfg) -> dict:
    out = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return out


@pytest.fixture(scope="module")
def default():
    return flat(compose_config([]))


@pytest.mark.parametrize("name", sorted(LEAVE_ONE_OUT))
def test_each_recipe_changes_what_it_names_and_the_default_holds_it(default, name):
    overrides = LEAVE_ONE_OUT[name]
    changed = flat(compose_config(overrides))
    differs = {k for k in default.keys() | changed.keys() if default.get(k) != changed.get(k)}
    assert differs, f"{name}: {overrides} leave the default as it is, so the default lacks that mechanism"
    for override in overrides:
        key, value = override.split("=", 1)
        if key in default:  # a group choice (data=, optim=) swaps many keys; a plain key swaps its own
            assert str(default[key]) != value, f"{name}: the default already has {override}"


def test_docs_default_table_names_the_same_overrides_in_the_same_order():
    page = (ROOT / "docs" / "default.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| ") and "`" in line.split("|")[3]]
    written = [re.findall(r"`([^`]+)`", row.split("|")[3])[0].split() for row in rows]
    assert written == list(LEAVE_ONE_OUT.values())


def test_bench_quality_expands_leave_one_out_into_the_default_and_every_removal(monkeypatch):
    import bench.bench_quality as bq

    seen = []
    monkeypatch.setattr(bq, "load_config", lambda overrides: seen.append(overrides) or object())
    args = bq.build_parser().parse_args(["--recipes", "leave_one_out", "--reference", "default"])
    configs = bq.checked_configs(bq.build_parser(), args)
    assert list(configs) == ["default", *LEAVE_ONE_OUT]
    assert seen[1][: len(LEAVE_ONE_OUT["no_rope"])] == LEAVE_ONE_OUT["no_rope"]
