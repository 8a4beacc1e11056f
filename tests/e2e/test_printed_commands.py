"""The commands a run prints work as pasted, in a shell whose PATH does not hold the venv (README command 1
runs `.venv/bin/python train.py`; nothing activates the venv before the closing lines are read)."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT, run_cli


def without_this_venv() -> dict[str, str]:
    """The environment of a shell where `python` is not this interpreter (nor, if any, one with torch)."""
    venv_bin = str(Path(sys.executable).parent)
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and d != venv_bin]
    return {**os.environ, "PATH": os.pathsep.join(path)}


def test_the_closing_lines_name_the_interpreter_when_python_on_path_is_another(tmp_path, tiny_run_overrides):
    # Defect: the closing lines said `python scripts/sample.py ...`; pasted after README command 1 (the venv
    # not activated) they failed with "No module named 'torch'".
    env = without_this_venv()
    done = run_cli(["train.py", *tiny_run_overrides], cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in done.stderr.splitlines()
               if line.startswith(("  sample:", "  score:", "  continue:"))}  # fmt: skip
    python = shlex.quote(str(Path(sys.executable).relative_to(ROOT) if ROOT in Path(sys.executable).parents
                             else Path(sys.executable)))  # fmt: skip
    assert printed["sample"].startswith(f"{python} scripts/sample.py "), printed
    assert printed["continue"].startswith(f"{python} train.py "), printed
    assert printed["score"].startswith(f"{python} bench/bench_quality.py --score "), printed
    pasted = subprocess.run(  # exactly as printed, in a shell, from the repository root
        ["bash", "-c", printed["sample"] + " --max-new-tokens 5"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert pasted.returncode == 0 and "Traceback" not in pasted.stderr, pasted.stderr[-3000:]
    score = printed["score"].split("  (", 1)[0]  # the command, without its note
    scored = subprocess.run(["bash", "-c", score], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert scored.returncode == 0 and "bits/byte on every held-out token" in scored.stderr, scored.stderr[-3000:]


def test_with_the_venv_on_path_the_commands_say_python(tmp_path, monkeypatch):
    from cli.continue_commands import python_command

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    assert python_command() == "python"
    monkeypatch.setenv("PATH", without_this_venv()["PATH"])
    monkeypatch.chdir(tmp_path)
    assert python_command() == shlex.quote(str(Path(sys.executable).absolute()))
