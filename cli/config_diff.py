"""The overrides that turn one config into another: what a continue command must add so that the config it
composes is the one a run was started with (its newest checkpoint's), which resume compares with."""

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cli.config import hydra_value
from rundir.checkpoint import read_header
from rundir.checkpoints import CheckpointDir
from training.config import TrainConfig


def config_differences(run: Path, cfg: TrainConfig, skip: Iterable[str] = ()) -> list[str]:
    """Overrides that turn `cfg` into the config `run` was started with (its newest checkpoint's, which resume
    compares with, not config.yaml, which anyone may edit), except the keys in `skip` (the run's place and ends,
    which a continue command sets itself); none where the run has no config to read."""
    try:
        saved = read_header(CheckpointDir(run / "checkpoints").latest())[0]["config"]
    except Exception:  # damaged or foreign: the plain command, as before
        return []
    if not isinstance(saved, dict):
        return []
    skipped = {*skip, "model.vocab_size"}  # vocab_size: the run filled it in
    differences: list[str] = []

    def walk(then: dict, now: dict, prefix: str) -> None:
        for key, value in then.items():
            name = prefix + str(key)
            if isinstance(value, dict) and isinstance(now.get(key), dict):
                walk(value, now[key], name + ".")
            elif name not in skipped and key in now and now[key] != value:
                differences.append(f"{name}={override_text(value)}")

    walk(saved, dataclasses.asdict(cfg), "")
    return differences


def override_text(value: Any) -> str:
    """A config value as an override writes it: null, true, 0.5, [a,b], a path in Hydra's quotes where needed."""
    if isinstance(value, list):
        return "[" + ",".join(override_text(v) for v in value) + "]"
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return str(value) if isinstance(value, int | float) else hydra_value(str(value))
