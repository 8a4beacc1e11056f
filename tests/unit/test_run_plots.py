"""rundir/records.py and scripts/plot_run.py: metrics.jsonl read leniently, several runs in one PNG."""

import json
import math
import re
from pathlib import Path

import pytest

from rundir.records import plot_runs, read_metrics, run_labels, series
from scripts.plot_run import main
from tests.helpers import failing_reads


def write_run(directory: Path, steps: int = 6, with_time: bool = True, scale: float = 1.0) -> Path:
    directory.mkdir(parents=True)
    lines = []
    for step in range(1, steps + 1):
        record = {"step": step * 10, "train/loss": scale * 4.0 / step, "lr": 1e-3 * step / steps}
        record["throughput/tokens_per_s"] = 12000.0 + 100 * step
        if with_time:
            record["time/elapsed_s"] = 1.5 * step
        lines.append(json.dumps(record))
        if step % 2 == 0:
            lines.append(json.dumps({"step": step * 10, "val/loss": scale * 4.2 / step, "val/bpb": 1.0}))
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def snapshot(directory: Path) -> dict:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(directory.rglob("*"))}


def test_records_merge_by_step_and_bad_lines_are_skipped(tmp_path):
    run = write_run(tmp_path / "a", steps=4)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('5\n[]\n{"step": 40, "train/loss": 0.5, "time/elapsed_s": 9.0}\n{"step": 50, "train/lo')  # resumed, cut
    records = read_metrics(run)
    assert sorted(records) == [10, 20, 30, 40]
    assert records[20]["val/loss"] == pytest.approx(2.1) and records[20]["time/elapsed_s"] == 3.0
    assert series(records, "train/loss", None) == ([10, 20, 30, 40], [4.0, 2.0, 4.0 / 3, 0.5])  # the later 40 wins
    assert series(records, "val/loss", "time/elapsed_s") == ([3.0, 9.0], [2.1, 1.05])  # val shares its step's time


def test_a_record_without_elapsed_time_is_left_out_of_the_wall_time_panels_only(tmp_path):
    records = read_metrics(write_run(tmp_path / "old", with_time=False))
    assert len(series(records, "lr", None)[0]) == 6
    assert series(records, "lr", "time/elapsed_s") == ([], [])
    records[10]["train/loss"] = math.nan
    assert 10 not in series(records, "train/loss", None)[0]


def test_several_runs_are_overlaid_in_one_png(tmp_path):
    runs = [write_run(tmp_path / "h4_dk8"), write_run(tmp_path / "h1_dk32", scale=1.2, with_time=False)]
    one = plot_runs(runs[:1], tmp_path / "one.png")
    both = plot_runs(runs, tmp_path / "both.png")
    for png in (one, both):
        assert png.read_bytes().startswith(b"\x89PNG")
    assert both.stat().st_size > one.stat().st_size  # the second run's lines are drawn
    assert run_labels([tmp_path / "x" / "run", tmp_path / "y" / "run", tmp_path / "z"]) == ["x/run", "y/run", "z"]


def test_cli_writes_into_the_run_by_default_and_says_where(tmp_path, capsys):
    run = write_run(tmp_path / "run")
    main([str(run)])
    assert capsys.readouterr().out == f"wrote {run / 'plots.png'}\n"
    main([str(run), str(write_run(tmp_path / "other")), "--out", str(tmp_path / "cmp")])
    assert capsys.readouterr().out == f"wrote {tmp_path / 'cmp.png'}\n" and (tmp_path / "cmp.png").is_file()


@pytest.mark.parametrize(
    "args,message",
    [
        (["TMP/empty"], r"^error: '.*empty' is not a run directory \(it has no metrics.jsonl\)$"),
        (["TMP/run", "TMP/nowhere"], r"^error: '.*nowhere' does not exist; give a run directory$"),
        # was "--out 'TMP/notes.txt/plots.png' cannot be written", an --out never given
        (["TMP/notes.txt"], r"^error: '.*notes.txt' is a file; give the run directory that holds metrics.jsonl$"),
        (["TMP/run", "--out", "TMP/empty"], r"^error: --out '.*empty' is a directory; give a file path"),
        (["TMP/run", "--out", "TMP/notes.txt/p.png"], r"^error: --out '.*p.png' cannot be written: '.*notes.txt' is a"),
        (["TMP/run", "--out", "TMP/p.docx"], r"^error: --out '.*p.docx' has suffix '.docx'"),
        ([], r"^error: the following arguments are required: RUN_DIR"),
    ],
)
def test_cli_bad_inputs_are_one_line_and_write_nothing(tmp_path, capsys, args, message):
    write_run(tmp_path / "run")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as e:
        main([a.replace("TMP", str(tmp_path)) for a in args])
    text = e.value.code if isinstance(e.value.code, str) else capsys.readouterr().err
    assert e.value.code not in (0, None) and len(text.strip().splitlines()) == 1
    assert re.search(message, text.strip()), text
    assert snapshot(tmp_path) == before


def test_an_existing_out_is_replaced_only_with_force_but_the_runs_own_plot_is_redrawn(tmp_path, capsys):
    run = write_run(tmp_path / "run")
    keep = tmp_path / "plots_keep.png"
    keep.write_text("precious\n")
    with pytest.raises(SystemExit) as e:
        main([str(run), "--out", str(keep)])
    assert e.value.code == 1
    assert capsys.readouterr().err == f"error: --out {str(keep)!r} already exists; pass --force to replace it\n"
    assert keep.read_text() == "precious\n"
    main([str(run), "--out", str(keep), "--force"])
    assert keep.read_bytes().startswith(b"\x89PNG") and capsys.readouterr().out == f"wrote {keep}\n"
    for _ in range(2):  # RUN/plots.png is the run's own figure (the trainer draws it too): redrawn freely
        main([str(run)])
        assert capsys.readouterr().out == f"wrote {run / 'plots.png'}\n"


def test_a_run_with_a_single_record_is_drawn_with_markers(tmp_path, monkeypatch):
    """One point of a line without a marker draws nothing: a run killed after its first log showed six empty
    panels with a legend. Every series of one point gets a marker."""
    from matplotlib.axes import Axes

    run = tmp_path / "one"
    run.mkdir()
    record = {"step": 5, "train/loss": 8.3, "lr": 1e-3, "throughput/tokens_per_s": 100.0, "time/elapsed_s": 1.0}
    (run / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    drawn, plot = [], Axes.plot
    monkeypatch.setattr(
        Axes, "plot", lambda ax, xs, *a, **kw: drawn.append((len(xs), kw.get("marker"))) or plot(ax, xs, *a, **kw)
    )
    plot_runs([run], tmp_path / "one.png")
    assert len(drawn) == 6 and all(n == 1 and marker for n, marker in drawn), drawn


def test_a_metrics_file_that_cannot_be_read_is_named(tmp_path, monkeypatch, capsys):
    """An I/O error reading metrics.jsonl said only 'error: [Errno 5] Input/output error'."""
    run = write_run(tmp_path / "run")
    failing_reads(monkeypatch, OSError(5, "Input/output error"))
    with pytest.raises(SystemExit) as e:
        main([str(run), "--out", str(tmp_path / "p.png")])
    assert e.value.code == 1
    assert capsys.readouterr().err == f"error: {str(run / 'metrics.jsonl')!r} cannot be read (Input/output error)\n"
    assert not (tmp_path / "p.png").exists()
