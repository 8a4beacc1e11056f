"""The README's commands work as pasted: the short ones are taken from its code blocks and run, in a
fresh working directory, in the order a newcomer would (the smoke run first, then the tools on
`outputs/latest`)."""

import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli

pytestmark = [pytest.mark.corpus, pytest.mark.slow]


def readme_commands() -> list[str]:
    """Every `python ...` line of the README's bash blocks, without its trailing comment."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("python ")]


def is_short(command: str) -> bool:
    """Seconds to run: help, the smoke run, and the tools that only read a run."""
    tool = shlex.split(command)[1]
    reads_a_run = "outputs/latest" in command and tool in ("scripts/sample.py", "scripts/plot_run.py")
    return "--help" in command or "+debug=tiny" in command or reads_a_run


def as_argv(command: str) -> list[str]:
    words = shlex.split(command)[1:]
    return [str(ROOT / words[0]), *words[1:]]


def test_the_readmes_short_commands_work_as_pasted(tmp_path):
    commands = [c for c in readme_commands() if is_short(c)]
    smoke = [c for c in commands if "+debug=tiny" in c]
    assert smoke and any("sample.py outputs/latest" in c for c in commands) and any("--help" in c for c in commands)
    for command in smoke + [c for c in commands if c not in smoke]:  # the smoke run makes outputs/latest
        stdin = ":quit\n" if " -i" in command else ""
        done = run_cli(as_argv(command), cwd=tmp_path, input=stdin, timeout=600)
        assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr, command
    assert (tmp_path / "outputs" / "latest" / "checkpoints" / "best.safetensors").is_file()
    assert sys.executable  # the commands ran with this interpreter (the project's venv)


def test_help_lists_every_schema_key():
    from cli.schema_help import schema_fields
    from training.config import TrainConfig

    done = run_cli([str(ROOT / "train.py"), "--help"])
    assert done.returncode == 0
    missing = [f.name for f in schema_fields(TrainConfig) if f"  {f.name} " not in done.stdout]
    assert missing == []


def test_a_short_runs_terminal_has_a_header_and_no_config_dump_or_glued_lines(tmp_path):
    done = run_cli([str(ROOT / "train.py"), "+debug=tiny", "progress=true", "max_steps=40"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = re.split(r"[\r\n]+", done.stderr)
    assert any(line.startswith("model ") and " params (" in line for line in lines)
    assert not any("out_dir:" in line or "optim:" in line for line in lines)  # no resolved-config dump
    logged = [line for line in lines if "val loss" in line]
    assert logged and all(line.startswith(("step ", "done: ")) for line in logged), logged  # not glued to the bar
    assert any(line.startswith("train:") for line in lines)  # the bar has a label
    assert Path(tmp_path / "outputs" / "latest" / "config.yaml").is_file()
