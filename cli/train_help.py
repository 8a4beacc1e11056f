"""`python train.py --help`: the config groups and their options, then every key of the schema with its type,
meaning and the value the default run gives it."""

from pathlib import Path

from cli.config import config_options, default_run_values
from cli.schema_help import render_help
from studies.fairness import StudyRunConfig


def help_text(config_dir: Path) -> str:
    """`python train.py --help`: the config groups and their options, then every key of the schema with
    its type, meaning (from the dataclasses, so it cannot drift from them) and the value the default run
    gives it (configs/*.yaml composed over the schema, as `--cfg job` shows: budget_s 280, not null)."""
    groups = sorted(d for d in config_dir.iterdir() if d.is_dir())
    lines = [
        "usage: python train.py [GROUP=OPTION ...] [KEY=VALUE ...]   (Hydra overrides; -m sweeps comma lists)",
        "",
        "config groups (GROUP=OPTION; +GROUP=OPTION for experiment and debug):",
        *[f"  {g.name:<12}{', '.join(config_options(g))}" for g in groups],
        "",
        "keys (KEY=VALUE), with the default run's values (configs/config.yaml):",
        render_help(StudyRunConfig, defaults=default_run_values(config_dir)),
        "",
        "examples:",
        "  python train.py                             # the default model on Shakespeare, a few minutes on a CPU",
        "  python train.py model.n_head=8 model.d_k=16 budget_s=120",
        "  python train.py out_dir=runs/a resume=auto  # start, or continue, the run in runs/a",
        "  python train.py --cfg job                   # print the resolved config and exit",
        "  python train.py --hydra-help                # Hydra's own flags, and tab completion for your shell:",
        '  eval "$(python train.py -sc install=bash)"  # completes keys and options (model.n_h<TAB>)',
    ]
    return "\n".join(lines)
