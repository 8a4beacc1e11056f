"""The analysis tools on bad input a new user met: one `error:` line naming the bad value, a non-zero
exit, no traceback, nothing written or replaced (the README's "Nothing lost" table)."""

import re
from pathlib import Path

from tests.helpers import ROOT, run_cli, write_fake_run


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"" for p in sorted(root.rglob("*"))}


def assert_one_error_line(tmp_path: Path, args: list[str], message: str) -> None:
    """Run a script from tmp_path; it must exit non-zero with one matching `error:` line, touching nothing."""
    before = snapshot(tmp_path)
    done = run_cli([str(ROOT / args[0]), *args[1:]], cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("error: ") and re.search(message, lines[0]), lines[0]
    assert snapshot(tmp_path) == before


def head_sweep(root: Path) -> Path:
    """model.n_head 1, 4 x seeds 0, 1: no model.d_k swept."""
    for n_head in (1, 4):
        for seed in (0, 1):
            cfg = {"seed": seed, "model": {"n_head": n_head}}
            write_fake_run(root / "sweep" / f"h{n_head}_s{seed}", cfg, 2.0 + n_head / 10 + seed / 100, n_head=n_head)
    return root / "sweep"


def test_a_paper_whose_key_the_sweep_lacks_is_one_line(tmp_path):
    sweep = head_sweep(tmp_path)
    message = r"--paper vaswani_b needs a sweep over model.d_k; this sweep varies model.n_head$"
    assert_one_error_line(tmp_path, ["scripts/ablation_report.py", str(sweep), "--paper", "vaswani_b"], message)


def test_an_out_directory_under_a_regular_file_is_one_line(tmp_path):
    sweep = head_sweep(tmp_path)
    (tmp_path / "afile").write_text("a file\n")
    message = r"--out 'afile/sub' cannot be written: 'afile' is a file, not a directory"
    assert_one_error_line(tmp_path, ["scripts/ablation_report.py", str(sweep), "--out", "afile/sub"], message)
    assert_one_error_line(tmp_path, ["scripts/head_importance.py", "nowhere", "--out", "afile/sub"], message)
