"""Hydra at the edge: the schema registered for `configs/` (a run's TrainConfig with a study's settings on
top: studies.fairness.StudyRunConfig), Hydra's DictConfig turned into that validated dataclass (refusing
keys no field reads), and a config Hydra cannot compose said in one line. training/ never imports Hydra."""

import contextlib
import dataclasses
import difflib
import os
import re
import shlex
import typing
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from rundir.records import flatten
from studies.fairness import StudyRunConfig
from training.config import TrainConfig

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def register_configs() -> None:
    ConfigStore.instance().store(name="train_schema", node=StudyRunConfig)
    # A sweep job keeps Hydra's .hydra/ (the ablation report finds a job that failed at start-up by it);
    # a single run writes only its own RUN/config.yaml, and nothing before its checks pass.
    if not OmegaConf.has_resolver("job_subdir"):
        OmegaConf.register_new_resolver("job_subdir", lambda mode: ".hydra" if "MULTIRUN" in str(mode) else None)


def compose_configs(overrides: list[str], config_dir: Path = CONFIG_DIR) -> DictConfig:
    """configs/ composed through Hydra's compose API, as train.py sees it (for tests, benchmarks, --help)."""
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="config", overrides=overrides)


def default_run_values(config_dir: Path = CONFIG_DIR) -> dict[str, object]:
    """{dotted key: value} of the config a bare `python train.py` runs (configs/*.yaml over the schema)."""
    composed = OmegaConf.to_container(compose_configs([], config_dir), resolve=True, throw_on_missing=False)
    return flatten(composed)


def unknown_keys(cfg: DictConfig, schema: type, prefix: str = "") -> list[str]:
    """Keys that `+key=value` added but no schema field reads (OmegaConf would drop them silently)."""
    hints = typing.get_type_hints(schema)
    unknown = []
    for key in cfg:
        if key not in hints:
            unknown.append(with_suggestion(prefix, str(key), hints))
        elif dataclasses.is_dataclass(hints[key]) and isinstance(cfg[key], DictConfig):
            unknown += unknown_keys(cfg[key], hints[key], f"{prefix}{key}.")
    return unknown


def with_suggestion(prefix: str, key: str, hints: dict[str, typing.Any]) -> str:
    """`prefix.key`, with the key meant: a near name in its own group, else the same (or a near) name in another
    (`lr` -> optim.lr, `model.lr` -> optim.lr, `n_head` -> model.n_head)."""
    near = [prefix + name for name in difflib.get_close_matches(key, list(hints), n=1)]
    if not near:
        by_name: dict[str, list[str]] = {}
        for full in flatten(dataclasses.asdict(StudyRunConfig())):
            by_name.setdefault(full.rsplit(".", 1)[-1], []).append(full)
        names = difflib.get_close_matches(key, list(by_name), n=1, cutoff=0.8)
        near = by_name[names[0]] if names else []
    return f"{prefix}{key}" + (f" (did you mean {' or '.join(near)}?)" if near else "")


# Hydra's own options (`python train.py --hydra-help`), and those of them whose value is the next word
HYDRA_FLAGS = {"--help", "-h", "--hydra-help", "--version", "--cfg", "-c", "--resolve", "--package", "-p", "--run",
               "-r", "--multirun", "-m", "--shell-completion", "-sc", "--config-path", "-cp", "--config-name", "-cn",
               "--config-dir", "-cd", "--experimental-rerun", "--info", "-i"}  # fmt: skip
TAKES_A_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir",
                 "-cd", "--experimental-rerun", "--info", "-i"}  # fmt: skip


def check_override_words(args: list[str]) -> None:
    """One line for an option written as the scripts take theirs (`--max_steps 10`, `--max_steps=10`) or a key
    and value apart (`max_steps 10`): Hydra answered with its whole usage, or "cannot parse override '10'"."""
    for i, arg in enumerate(args):
        after_flag = i > 0 and args[i - 1] in TAKES_A_VALUE
        name, has_value, value = arg.partition("=")
        following = args[i + 1] if i + 1 < len(args) and "=" not in args[i + 1] else ""
        if arg.startswith("--") and name not in HYDRA_FLAGS:
            key = name[2:].replace("-", "_")
            written = f"{key}={value if has_value else following or 'VALUE'}"
            raise ValueError(f"{arg}: train.py takes key=value overrides, not options; write {written}")
        if not arg.startswith(("-", "+", "~")) and not has_value and not after_flag:
            if arg == "help":
                raise ValueError("help: did you mean --help?")
            if following:
                raise ValueError(f"{arg} {following}: write {arg}={following} (key=value, one word)")
            raise ValueError(f"{arg!r} is not an override: train.py takes key=value (`python train.py --help`)")


def unknown_key_error(names: list[str]) -> str:
    return f"unknown config key {', '.join(names)}; `python train.py --help` lists every key"


def composition_error(e: Exception) -> str:
    """What Hydra says over several lines (`batch_size=abc`, `model=huge`, `foo=1`), in one."""
    cause = e.__cause__
    # A recipe's sweep list (`hydra.sweeper.params.model.n_head`) cannot be addressed: its key holds a dot.
    if swept := re.search(r"hydra\.sweeper\.params\.([\w.]+)", str(e) + str(cause or "")):
        return (
            f"hydra.sweeper.params.{swept[1]} cannot be set from the command line; give the sweep as "
            f"{swept[1]}=VALUE[,VALUE...], which replaces the recipe's values of {swept[1]}"
        )
    if isinstance(cause, ConfigKeyError | ConfigAttributeError) and getattr(cause, "full_key", None):
        *parents, key = str(cause.full_key).split(".")
        schema: type | None = StudyRunConfig
        for parent in parents:  # the dataclass that lacks `key`; none where a parent is not the schema's
            schema = typing.get_type_hints(schema).get(parent) if schema else None
            schema = schema if dataclasses.is_dataclass(schema) else None
        prefix = "".join(f"{p}." for p in parents)
        return unknown_key_error([with_suggestion(prefix, key, typing.get_type_hints(schema) if schema else {})])
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if isinstance(e, OverrideParseException):  # the grammar's complaint, without its link
        key, _, value = e.override.partition("=")
        # a string with a character the grammar does not take bare (non-ASCII, brackets, a quote); not a
        # broken list or quoted string
        quotable = value and value[0] not in "[{'\""
        hint = f"; put the value in Hydra's quotes: {shell_quote(f'{key}={hydra_value(value)}')}" if quotable else ""
        return f"cannot parse override {e.override!r}: {lines[0]}{hint}"
    if isinstance(cause, OmegaConfBaseException):  # a value of the wrong type: the override, then why
        override = lines[0].removeprefix("Error merging override ")
        why = str(cause).splitlines()[0]
        key, _, value = override.partition("=")
        if "is not a valid bool" in why:
            why += "; give true or false"
        elif value.lower() in ("none", "nil") and "could not be converted" in why:  # sample.py's REPL says none
            why += "; Hydra's none is null: give null"
        elif "is not a ListConfig, list or tuple" in why:  # data.files=/my/file.txt
            why = f"{why.rstrip('.')}; give a list: {shell_quote(f'{key}=[{value}]')}"
        return f"{override}: {why}"
    if len(lines) > 2 and lines[1].startswith("Available options"):  # an unknown group option
        return f"{lines[0]}; {lines[1].lower()} {', '.join(group_options(str(e)))}"
    return " ".join(lines)


def override_key(override: str) -> str:
    """The key a Hydra override sets: '+model.n_head=8' -> 'model.n_head', '~seed' -> 'seed'."""
    return override.split("=", 1)[0].lstrip("+~")


def hydra_value(text: str) -> str:
    """`text` as an override value Hydra reads back as `text`: bare where its grammar takes it so, else in
    Hydra's quotes (a path with a non-ASCII letter, a comma, which would start a sweep, or brackets)."""
    with contextlib.suppress(HydraException):
        if OverridesParser.create().parse_override(f"key={text}").value() == text:
            return text
    # Inside Hydra's quotes only a quote, and the backslashes before one or before the closing quote, escape.
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m[1] * 2 + ("\\'" if m[2] else ""), text) + "'"


def shell_quote(arg: str) -> str:
    """shlex.quote, but an argument holding Hydra's single quotes (sample_prompt='a, b', 'it\\'s') in
    double quotes, as a person types it, where nothing in it is special inside double quotes (there a
    backslash escapes only another, a quote, $ or `, so Hydra's \\' passes as typed)."""
    if "'" in arg and not set(arg) & set('"$`!') and not re.search(r"\\(\\|$)", arg):
        return f'"{arg}"'
    return shlex.quote(arg)


def config_options(group: Path) -> list[str]:
    """A config group's options: the YAML files of its folder (configs/model/ -> gpt2, small, ...)."""
    return sorted(f.stem for f in group.glob("*.yaml"))


def group_options(message: str) -> list[str]:
    """The options Hydra lists, one indented line each, under "Available options" (its search path
    follows, indented the same way, under a heading of its own)."""
    after = str(message).split("Available options", 1)[1].splitlines()[1:]
    options = []
    for line in after:
        if not line[:1].isspace():
            break
        options.append(line.strip())
    return options


def to_train_config(cfg: DictConfig | TrainConfig) -> TrainConfig:
    """Hydra's DictConfig (typed by the schema) -> the plain dataclass (a StudyRunConfig), validated."""
    if not isinstance(cfg, TrainConfig):
        unknown = unknown_keys(cfg, StudyRunConfig)
        if unknown:
            raise ValueError(unknown_key_error(unknown))
        if OmegaConf.get_type(cfg) is not StudyRunConfig:  # a sweep job's YAML (cli/sweep_jobs.py): typed again here
            cfg = OmegaConf.merge(OmegaConf.structured(StudyRunConfig), cfg)
        cfg = OmegaConf.to_object(cfg)
    if cfg.out_dir is not None:  # '~/runs' is the home folder's, as data.files and resume read it: not ./~/runs
        cfg.out_dir = os.path.expanduser(cfg.out_dir)
    cfg.validate()
    return cfg
