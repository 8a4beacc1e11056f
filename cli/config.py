"""Hydra at the edge: the schema registered for `configs/`, and Hydra's DictConfig turned into a validated
TrainConfig, refusing keys no field reads. training/ itself never imports Hydra."""

import dataclasses
import difflib
import typing

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from training.config import TrainConfig


def register_configs() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    # A sweep job keeps Hydra's .hydra/ (the ablation report finds a job that failed at start-up by it);
    # a single run writes only its own RUN/config.yaml, and nothing before its checks pass.
    if not OmegaConf.has_resolver("job_subdir"):
        OmegaConf.register_new_resolver("job_subdir", lambda mode: ".hydra" if "MULTIRUN" in str(mode) else None)


def unknown_keys(cfg: DictConfig, schema: type, prefix: str = "") -> list[str]:
    """Keys that `+key=value` added but no schema field reads (OmegaConf would drop them silently)."""
    hints = typing.get_type_hints(schema)
    unknown = []
    for key in cfg:
        name = f"{prefix}{key}"
        if key not in hints:
            near = difflib.get_close_matches(str(key), list(hints), n=1)
            unknown.append(name + (f" (did you mean {prefix}{near[0]}?)" if near else ""))
        elif dataclasses.is_dataclass(hints[key]) and isinstance(cfg[key], DictConfig):
            unknown += unknown_keys(cfg[key], hints[key], f"{name}.")
    return unknown


def to_train_config(cfg: DictConfig | TrainConfig) -> TrainConfig:
    """Hydra's DictConfig (typed by the schema) -> the plain dataclass, validated."""
    if not isinstance(cfg, TrainConfig):
        unknown = unknown_keys(cfg, TrainConfig)
        if unknown:
            raise ValueError(f"unknown config key {', '.join(unknown)}; `python train.py --help` lists every key")
        cfg = OmegaConf.to_object(cfg)
    cfg.validate()
    return cfg
