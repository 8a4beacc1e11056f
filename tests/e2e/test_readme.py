"""The README's commands work as pasted: the short ones are taken from its code blocks and run, in a
fresh working directory, in the order a newcomer would (the smoke run first, then the tools on
`outputs/latest`)."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli

pytestmark = [pytest.mark.corpus, pytest.mark.slow]


def readme_commands() -> list[str]:
    """Every `python ...` line of the bash blocks of the README and the docs pages it links, without its
    trailing comment."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    blocks = [b for page in pages for b in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.DOTALL)]
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


@pytest.fixture(scope="module")
def pasted(tmp_path_factory) -> tuple[Path, dict[str, subprocess.CompletedProcess]]:
    """The README's short commands run once, as pasted, in one fresh working directory, in the order a
    newcomer would (the smoke run first: it makes outputs/latest); the tests below read their results."""
    cwd = tmp_path_factory.mktemp("readme")
    commands = [c for c in readme_commands() if is_short(c)]
    smoke = [c for c in commands if "+debug=tiny" in c]
    done = {}
    for command in smoke + [c for c in commands if c not in smoke]:
        stdin = ":quit\n" if " -i" in command else ""
        done[command] = run_cli(as_argv(command), cwd=cwd, input=stdin, timeout=600)
    return cwd, done


def the_run(done: dict[str, subprocess.CompletedProcess], tool: str, word: str) -> subprocess.CompletedProcess:
    """The result of the README's `python TOOL ...` command that contains `word`."""
    found = [done[c] for c in done if shlex.split(c)[1] == tool and word in shlex.split(c)]
    assert len(found) == 1, f"the README should have one short `python {tool} ... {word}` command"
    return found[0]


def test_the_readmes_short_commands_work_as_pasted(pasted):
    cwd, done = pasted
    commands = list(done)
    assert any("+debug=tiny" in c for c in commands) and any("sample.py outputs/latest" in c for c in commands)
    assert any("--help" in c for c in commands)
    for command, result in done.items():
        assert result.returncode == 0, f"{command}\n{result.stderr[-2000:]}"
        assert "Traceback" not in result.stderr, command
    assert (cwd / "outputs" / "latest" / "checkpoints" / "best.safetensors").is_file()
    assert sys.executable  # the commands ran with this interpreter (the project's venv)


def test_help_lists_every_schema_key(pasted):
    from cli.schema_help import schema_fields
    from training.config import TrainConfig

    done = the_run(pasted[1], "train.py", "--help")  # the README's `python train.py --help`
    assert done.returncode == 0
    missing = [f.name for f in schema_fields(TrainConfig) if f"  {f.name} " not in done.stdout]
    assert missing == []


def test_a_short_runs_terminal_has_a_header_and_no_config_dump_or_glued_lines(pasted):
    cwd, done = pasted
    smoke = the_run(done, "train.py", "+debug=tiny")  # progress=true is the default: the bar is on
    assert smoke.returncode == 0, smoke.stderr[-2000:]
    lines = re.split(r"[\r\n]+", smoke.stderr)
    assert any(line.startswith("model ") and " params (" in line for line in lines)
    assert not any("out_dir:" in line or "optim:" in line for line in lines)  # no resolved-config dump
    logged = [line for line in lines if "val loss" in line]
    assert len(logged) >= 2 and all(line.startswith(("step ", "done: ")) for line in logged), logged  # not glued
    assert any(line.startswith("train:") for line in lines)  # the bar has a label
    assert Path(cwd / "outputs" / "latest" / "config.yaml").is_file()
