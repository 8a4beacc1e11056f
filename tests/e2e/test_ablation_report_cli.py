"""scripts/ablation_report.py on bad input: one `error:` line on stderr, exit 1 (2 for a bad command line),
nothing written; and
on runs whose records are cut short or lack a final loss: those runs listed, the report written."""

import json
import re
from pathlib import Path

import pytest

from scripts.ablation_report import write_report
from tests.helpers import ROOT, run_cli, write_fake_run


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"" for p in sorted(root.rglob("*"))}


def sweep_of_two(root: Path) -> Path:
    for seed in (0, 1):
        write_fake_run(root / "sweep" / f"s{seed}", {"seed": seed, "model": {"n_head": 2}}, 1.5 + seed / 10)
    return root / "sweep"


def metrics_line_5(root: Path) -> list[str]:
    sweep = sweep_of_two(root)
    (sweep / "s1" / "metrics.jsonl").write_text('{"step": 10, "val/loss": 3.0}\n5\n')
    return [str(sweep)]


def run_info_list(root: Path) -> list[str]:
    sweep = sweep_of_two(root)
    (sweep / "s0" / "run_info.json").write_text("[]")
    return [str(sweep)]


def a_regular_file(root: Path) -> list[str]:
    (root / "notes.txt").write_text("not a sweep\n")
    return [str(root / "notes.txt")]


def existing_report(root: Path) -> list[str]:
    (root / "mine").mkdir()
    (root / "mine" / "ablation.md").write_text("my notes")
    return [str(sweep_of_two(root)), "--out", str(root / "mine")]


BAD = {
    "a regular file": (a_regular_file, r"notes.txt' is a file; give a sweep directory"),
    "a missing path": (
        lambda root: [str(root / "missing" / "sweep")],
        r"sweep directory .*missing/sweep' does not exist",
    ),
    "a bad --reference": (lambda root: [str(sweep_of_two(root)), "--reference", "n_head"], r"--reference 'n_head'"),
    "an unknown --paper": (
        lambda root: [str(sweep_of_two(root)), "--paper", "vaswani"],
        r"argument --paper: invalid choice: 'vaswani' \(choose from 'vaswani_a', 'vaswani_b', 'bhojanapalli', 'gqa'\)",
    ),
    "an unknown flag": (lambda root: [str(sweep_of_two(root)), "--outt", "x"], r"unrecognized arguments: --outt x"),
    "an --out the OS refuses": (
        lambda root: [str(sweep_of_two(root)), "--out", str(root / ("x" * 300))],
        r"^error: .*File name too long: '.*xxx'$",
    ),
    "an empty --out": (  # --out "$DIR" with DIR unset: Path("") is the current directory
        lambda root: [str(sweep_of_two(root)), "--out", ""],
        r"^error: argument --out: is empty; give a directory \('\.' for the current one\)",
    ),
    "an --out holding a report": (
        existing_report,
        r"^error: --out '.*/mine/ablation.md' already exists; pass --force to replace it$",
    ),
}
# A bad command line exits 2 (argparse's status), bad input it reads or writes 1.
COMMAND_LINE = {"a bad --reference", "an unknown --paper", "an unknown flag", "an empty --out"}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path, case):
    make, message = BAD[case]
    args = make(tmp_path)
    before = snapshot(tmp_path)
    done = run_cli([str(ROOT / "scripts" / "ablation_report.py"), *args], cwd=tmp_path)  # what lands in cwd counts
    assert done.returncode == (2 if case in COMMAND_LINE else 1), done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in done.stderr, done.stderr
    assert re.search(message, lines[0]), lines[0]
    assert snapshot(tmp_path) == before  # nothing created, nothing changed (the missing path stays missing)


@pytest.mark.parametrize(
    ("make", "reason"),
    [(metrics_line_5, "line 2 is '5'; each line must be a JSON object"), (run_info_list, "run_info.json")],
    ids=["a metrics line 5", "a run_info.json of []"],
)
def test_a_run_whose_record_is_not_json_objects_is_listed_as_unreadable(tmp_path, make, reason):
    """One damaged run of a sweep is listed with what is wrong with it; the report covers the others."""
    args = make(tmp_path)
    done = run_cli([str(ROOT / "scripts" / "ablation_report.py"), *args], cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    report = (Path(args[0]) / "ablation.md").read_text()
    assert reason in report and "(1 completed)" in done.stdout + done.stderr


def test_cut_short_and_metric_less_summaries_are_listed_and_the_report_goes_on(tmp_path):
    sweep = sweep_of_two(tmp_path)
    write_fake_run(sweep / "cut", {"seed": 2, "model": {"n_head": 2}}, 1.0)
    (sweep / "cut" / "summary.json").write_text('{"status": "completed", "st')
    write_fake_run(sweep / "resumed", {"seed": 3, "model": {"n_head": 2}}, 1.0)
    (sweep / "resumed" / "summary.json").write_text(json.dumps({"status": "completed", "step": 99}))
    # The report, not the command line, is under test here: in-process (the bad-input table runs the CLI).
    report = write_report(sweep, tmp_path / "out").read_text()
    assert "| cut | 2 | unreadable | 10 | summary.json is not valid JSON" in report
    assert "| resumed | 3 | completed without a final val/loss | 10 |" in report
    assert "| 1.5500 [0.9147, 2.1853] | reference |" in report  # the two good seeds: 1.55 ± 12.706 * 0.0707 / √2


def test_an_earlier_report_is_replaced_only_in_its_own_sweep_or_with_force(tmp_path):
    """The README's rule for every tool: an existing target is replaced only with --force, except the
    sweep's own report, which a later report of the same sweep redraws (it overwrote any --out's files)."""
    sweep = sweep_of_two(tmp_path)
    write_report(sweep)
    write_report(sweep, sweep)  # its own report again, by either spelling
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "val_loss_curves.png").write_text("my figure")
    with pytest.raises(ValueError, match=r"--out '.*mine/val_loss_curves.png' already exists; pass --force"):
        write_report(sweep, tmp_path / "mine")
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["val_loss_curves.png"]
    write_report(sweep, tmp_path / "mine", force=True)
    assert (tmp_path / "mine" / "val_loss_curves.png").read_bytes().startswith(b"\x89PNG")
