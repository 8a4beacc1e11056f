"""Sweep reports from fake run directories: grouping by every swept key, intervals in the table, paired
comparisons in words, and runs whose records are bad or cut short."""

import json
import os
from pathlib import Path

import pytest

from analysis.sweep import (
    COMPLETED,
    CRASHED,
    FAILED_AT_START,
    INTERRUPTED,
    NO_VAL_LOSS,
    NONFINITE,
    RUNNING,
    UNREADABLE,
    find_runs,
    group_cells,
    varying_keys,
)
from scripts.ablation_report import write_report
from tests.helpers import failing_reads, write_fake_run


def config(seed: int, out: str, lr: float = 1e-3, n_head: int = 2, d_k: int | None = 8) -> dict:
    """A resolved config as run_info.json holds it, with the bookkeeping that differs run to run."""
    model = {"n_head": n_head, "d_k": d_k}
    fixed = {"max_steps": 20, "optim": {"lr": lr, "betas": [0.9, 0.95]}, "fairness": {"mode": "fixed_d_model"}}
    return {"seed": seed, "out_dir": out, "model": model, "logger": {"name": out}, **fixed}


def lr_sweep(root: Path) -> Path:
    """`optim.lr=1e-3,1e-2` x seeds 0, 1, 2: losses chosen so the paired difference is hand-checkable."""
    losses = {1e-3: [2.0, 2.5, 3.0], 1e-2: [1.70, 2.18, 2.69]}
    for lr, values in losses.items():
        for seed, loss in enumerate(values):
            write_fake_run(root / f"lr{lr}_s{seed}", config(seed, f"out/{lr}/{seed}", lr=lr), loss)
    return root


def test_an_lr_sweep_is_two_rows_named_by_the_swept_key(tmp_path):
    runs = find_runs(lr_sweep(tmp_path / "sweep"))
    assert varying_keys(runs) == ["optim.lr"]  # seed, out_dir and logger.name vary too, but are not compared
    cells = group_cells(runs, ["optim.lr"])
    assert [(c.values, sorted(c.metric("val/loss"))) for c in cells] == [
        ({"optim.lr": 1e-3}, [0, 1, 2]),
        ({"optim.lr": 1e-2}, [0, 1, 2]),
    ]
    report = write_report(tmp_path / "sweep", tmp_path / "out").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| 0.0")]
    assert len(rows) == 2 and report.count("| optim.lr | d_k |") == 1
    # mean 2.5, s 0.5, n 3: 2.5 ± 4.3027 * 0.5 / sqrt(3) = [1.2579, 3.7421]
    assert rows[0].startswith("| 0.001 | 8 | 1.00k | 6.00k | 128 | 20 | 100 | 2.5000 [1.2579, 3.7421] | reference |")
    assert "| -0.3100 [-0.3348, -0.2852] |" in rows[1]
    assert "- optim.lr=0.01 vs optim.lr=0.001: val loss -0.3100 nats, resolved: lower by 0.3100 nats" in report
    for name in ("val_loss_intervals.png", "val_loss_differences.png", "val_loss_curves.png"):
        assert (tmp_path / "out" / name).read_bytes().startswith(b"\x89PNG") and f"]({name})" in report
    raw = [json.loads(line) for line in (tmp_path / "out" / "runs.jsonl").read_text().splitlines()]
    assert [(r["run"], r["optim.lr"], r["seed"], r["status"]) for r in raw] == [
        (f"lr{lr}_s{seed}", lr, seed, COMPLETED) for lr in (0.001, 0.01) for seed in (0, 1, 2)
    ]
    assert [r["summary"]["val/loss"] for r in raw] == [2.0, 2.5, 3.0, 1.70, 2.18, 2.69]


def test_kv_bytes_follow_the_models_own_cache_layout_for_mla(tmp_path):
    # MHA: 2 layers x 2 heads x (K 8 + V 8) x 2 bytes = 128; MLA keeps one latent of 16 a layer: 2 x 16 x 2 = 64
    for latent in (None, 16):
        run = config(0, f"out/{latent}")
        run["model"] |= {"mla_latent": latent, "pos_encoding": "learned"}  # learned: no rope key beside the latent
        write_fake_run(tmp_path / "sweep" / f"mla{latent}", run, 2.0)
    report = write_report(tmp_path / "sweep", tmp_path / "out").read_text()
    assert "| null | 8 | 1.00k | 6.00k | 128 |" in report and "| 16 | 8 | 1.00k | 6.00k | 64 |" in report


def test_a_grid_of_two_keys_gets_a_cell_per_pair_and_a_heatmap(tmp_path):
    for n_head in (1, 2):
        for d_k in (8, 16):
            for seed in (0, 1):
                cfg = config(seed, f"o{n_head}{d_k}{seed}", n_head=n_head, d_k=d_k)
                loss = 2.0 + n_head + seed / 10
                write_fake_run(tmp_path / f"h{n_head}_dk{d_k}_s{seed}", cfg, loss, n_head=n_head, d_k=d_k)
    runs = find_runs(tmp_path)
    assert varying_keys(runs) == ["model.d_k", "model.n_head"]
    cells = group_cells(runs, varying_keys(runs))
    assert [tuple(c.values.values()) for c in cells] == [(8, 1), (8, 2), (16, 1), (16, 2)]
    report = write_report(tmp_path, tmp_path / "out", reference="model.n_head=2,model.d_k=16").read_text()
    assert "Δ is the paired difference against the reference (model.d_k=16, model.n_head=2)" in report
    assert "- model.d_k=8, model.n_head=1 vs model.d_k=16, model.n_head=2: val loss -1.0000 nats" in report
    assert (tmp_path / "out" / "val_loss_heatmap.png").is_file()
    header = next(line for line in report.splitlines() if line.startswith("| model.d_k |"))
    assert header.count("d_k") == 1, header  # the swept model.d_k is the effective d_k: one column


def test_bad_reference_is_refused_before_anything_is_written(tmp_path):
    lr_sweep(tmp_path / "sweep")
    unknown = r"--reference key\(s\) \['model.n_head'\] are not swept; swept keys: optim.lr"
    with pytest.raises(ValueError, match=unknown):
        write_report(tmp_path / "sweep", tmp_path / "out", reference="model.n_head=4")
    # the cells there are named (it gave a count alone); a key given twice is refused (the last value won)
    named = r"--reference optim.lr=0.5 matches 0 cells; it must match exactly one of: optim.lr=0.001; optim.lr=0.01$"
    with pytest.raises(ValueError, match=named):
        write_report(tmp_path / "sweep", tmp_path / "out", reference="optim.lr=0.5")
    with pytest.raises(ValueError, match=r"gives optim.lr twice; give each key once$"):
        write_report(tmp_path / "sweep", tmp_path / "out", reference="optim.lr=0.001,optim.lr=0.003")
    assert not (tmp_path / "out").exists()


def test_one_runs_directory_is_refused_rather_than_reported_as_a_sweep_of_no_keys(tmp_path):
    # `ablation_report.py outputs/latest` wrote "1 runs in 1 cells over []" and four files into the run
    run = write_fake_run(tmp_path / "run", config(0, "a"), 1.4)
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(ValueError, match=r"'.*run' is one run's directory; .* give the folder that holds the runs"):
        write_report(run)
    assert sorted(p.name for p in run.iterdir()) == before


def test_seeds_of_one_cell_that_differ_in_size_are_refused(tmp_path):
    write_fake_run(tmp_path / "a", config(0, "a"), 1.4, params=1000)
    write_fake_run(tmp_path / "b", config(1, "b"), 1.6, params=2000)
    with pytest.raises(ValueError, match=r"runs of all runs differ in params"):
        write_report(tmp_path, tmp_path / "out")


def test_unfinished_unreadable_and_failed_runs_are_listed_with_the_swept_values(tmp_path):
    lr_sweep(tmp_path)
    write_fake_run(tmp_path / "crashed", config(3, "c", lr=1e-2), None)
    cut = write_fake_run(tmp_path / "cut", config(4, "d", lr=1e-2), 1.0)
    (cut / "summary.json").write_text('{"status": "compl')
    job = tmp_path / "bad"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "config.yaml").write_text("optim:\n  lr: 0.1\nseed: 5\n")
    (job / "train.log").write_text("[2026-01-01 00:00:00,000][train][ERROR] - optim.lr=0.1 is invalid\n")
    runs = {r.path.name: r.status for r in find_runs(tmp_path)}
    assert (runs["crashed"], runs["cut"], runs["bad"]) == (CRASHED, UNREADABLE, FAILED_AT_START)
    report = write_report(tmp_path, tmp_path / "out").read_text()
    assert "3 of 9 runs did not complete" in report
    assert f"| bad | 0.1 | 5 | {FAILED_AT_START} | — | optim.lr=0.1 is invalid |" in report
    assert f"| crashed | 0.01 | 3 | {CRASHED} | 10 |" in report
    assert f"| cut | 0.01 | 4 | {UNREADABLE} | 10 | summary.json is not valid JSON" in report


def test_a_run_stopped_by_a_signal_at_a_saved_step_is_interrupted_not_crashed(tmp_path):
    # Defect: a sweep's job stopped cleanly by Ctrl-C (its checkpoint saved) was listed as "crashed or unfinished"
    lr_sweep(tmp_path)
    stopped = write_fake_run(tmp_path / "stopped", config(3, "c", lr=1e-2), None)
    (stopped / "train.log").write_text(
        "[2026-01-01 00:00:00,000][training.trainer][INFO] - step 10: val loss 3.0\n"
        "[2026-01-01 00:00:01,000][__main__][WARNING] - stopped by SIGINT after step 12; saved RUN/step_12; "
        "continue with: python train.py out_dir=RUN resume=auto\n"
        "[2026-01-01 00:00:01,000][__main__][WARNING] - continue the whole sweep: python train.py -m ... resume=auto\n"
    )
    crashed = write_fake_run(tmp_path / "crashed", config(4, "d", lr=1e-2), None)
    (crashed / "train.log").write_text(
        "[2026-01-01 00:00:00,000][__main__][WARNING] - stopped by SIGINT after step 1; saved X\n"
        "[2026-01-01 00:00:09,000][train][ERROR] - training failed\n"
    )
    runs = {r.path.name: r for r in find_runs(tmp_path)}
    stop = "stopped by SIGINT after step 12; saved RUN/step_12"
    assert (runs["stopped"].status, runs["stopped"].error) == (INTERRUPTED, stop)
    assert runs["crashed"].status == CRASHED  # a stop that was not the last thing logged
    report = write_report(tmp_path, tmp_path / "out").read_text()
    assert f"| stopped | 0.01 | 3 | {INTERRUPTED} | 10 | stopped by SIGINT after step 12; saved RUN/step_12 |" in report


def test_a_run_still_training_is_listed_as_running_not_crashed(tmp_path):
    # Defect: the report of a sweep under way called its live jobs "crashed or unfinished"
    from rundir.files import RunLock

    lr_sweep(tmp_path)
    live = write_fake_run(tmp_path / "live", config(3, "c", lr=1e-2), None)
    lock = RunLock(live).acquire()
    try:
        runs = {r.path.name: r for r in find_runs(tmp_path)}
        assert runs["live"].status == RUNNING and runs["live"].error.startswith(f"(pid {os.getpid()}: ")
        report = write_report(tmp_path, tmp_path / "out").read_text()
        assert f"| live | 0.01 | 3 | {RUNNING} | 10 | (pid {os.getpid()}: " in report
    finally:
        lock.release()
    assert {r.path.name: r.status for r in find_runs(tmp_path)}["live"] == CRASHED  # its process gone


def test_a_summary_without_val_loss_takes_the_last_logged_evaluation(tmp_path):
    lr_sweep(tmp_path)
    resumed = write_fake_run(tmp_path / "resumed", config(3, "r", lr=1e-2), 1.0)
    (resumed / "summary.json").write_text(json.dumps({"status": COMPLETED, "step": 20, "elapsed_s": 0}))
    lines = [{"step": 10, "val/loss": 3.0}, {"step": 20, "val/loss": 2.25, "val/bpb": 1.0}]
    (resumed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    lost = write_fake_run(tmp_path / "lost", config(4, "l", lr=1e-2), 1.0)
    (lost / "summary.json").write_text(json.dumps({"status": COMPLETED, "step": 30}))
    runs = {r.path.name: r for r in find_runs(tmp_path)}
    assert runs["resumed"].status == COMPLETED and runs["resumed"].final("val/loss") == 2.25
    assert runs["lost"].status == NO_VAL_LOSS
    report = write_report(tmp_path, tmp_path / "out").read_text()
    assert "| 0, 1, 2, 3 |" in report and f"| lost | 0.01 | 4 | {NO_VAL_LOSS} |" in report


def test_two_runs_of_one_cell_and_seed_are_refused(tmp_path):
    write_fake_run(tmp_path / "a", config(0, "a"), 1.4)
    write_fake_run(tmp_path / "rerun", config(0, "b"), 1.5)
    with pytest.raises(ValueError, match=r"/a and .*/rerun are both all runs with seed 0; keep one of them"):
        write_report(tmp_path, tmp_path / "out")


def test_fixed_runs_of_different_max_steps_stay_apart_beside_an_iso_sweep(tmp_path):
    # max_steps is derived (not a setting) only for the iso runs; a (10) and b (40) are two configs
    runs = {"a": (10, 0, "fixed_d_model"), "b": (40, 1, "fixed_d_model"), "c": (33, 0, "iso_flop")}
    for name, (steps, seed, mode) in runs.items():
        cfg = {**config(seed, name), "max_steps": steps, "fairness": {"mode": mode}}
        write_fake_run(tmp_path / name, cfg, 2.0 + seed)
    found = find_runs(tmp_path)
    assert varying_keys(found) == ["fairness.mode", "max_steps"]
    cells = group_cells(found, varying_keys(found))
    assert [(c.values["max_steps"], [r.path.name for r in c.runs]) for c in cells] == [
        (10, ["a"]),
        (40, ["b"]),
        ("derived by iso_flop", ["c"]),
    ]


def test_iso_runs_of_one_mode_differ_in_max_steps_only_as_an_outcome(tmp_path):
    for seed, steps in enumerate((31, 35)):  # iso_time: each run measured its own step time
        cfg = {**config(seed, f"o{seed}"), "max_steps": steps, "fairness": {"mode": "iso_time"}}
        write_fake_run(tmp_path / f"s{seed}", cfg, 2.0 + seed)
    found = find_runs(tmp_path)
    assert varying_keys(found) == []
    assert [sorted(c.metric("val/loss")) for c in group_cells(found, [])] == [[0, 1]]


def test_a_run_that_ended_with_a_nan_val_loss_is_listed_and_kept_out_of_the_means(tmp_path):
    lr_sweep(tmp_path)
    nan = write_fake_run(tmp_path / "nan", config(3, "n", lr=1e-3), 1.0)
    summary = {"status": COMPLETED, "step": 20, "val/loss": float("nan"), "val/bpb": float("nan")}
    (nan / "summary.json").write_text(json.dumps(summary))  # json writes the NaN literal, as the trainer's would
    runs = {r.path.name: r.status for r in find_runs(tmp_path)}
    assert runs["nan"] == NONFINITE
    report = write_report(tmp_path, tmp_path / "out").read_text()
    assert "| 2.5000 [1.2579, 3.7421] | reference |" in report  # seeds 0-2 only, as without the NaN run
    assert f"| nan | 0.001 | 3 | {NONFINITE} | 10 | final val/loss is nan |" in report
    assert "1 of 7 runs did not complete with a finite val/loss (not in the table above)" in report


def failed_job(job: Path, n_head: int, seed: int) -> Path:
    """A Hydra job that failed before training: .hydra/ as Hydra wrote it, the error in train.log."""
    (job / ".hydra").mkdir(parents=True)
    model = f"model:\n  vocab_size: null\n  n_head: {n_head}\n  d_k: null\n"  # vocab_size unresolved
    (job / ".hydra" / "config.yaml").write_text(f"{model}optim:\n  lr: 0.001\nseed: {seed}\n")
    (job / ".hydra" / "overrides.yaml").write_text(f"- +debug=tiny\n- model.n_head={n_head}\n- seed={seed}\n")
    error = "[2026-01-01 00:00:00,000][train][ERROR] - model.d_model (32) must be divisible by model.n_head (3)\n"
    (job / "train.log").write_text(error)
    return job


def write_multirun_plan(root: Path, *task: str) -> None:
    """The sweep's multirun.yaml as Hydra writes it, reduced to the command line's overrides."""
    lines = "".join(f"    - {t}\n" for t in task)
    (root / "multirun.yaml").write_text(f"hydra:\n  sweeper:\n    params: null\n  overrides:\n    task:\n{lines}")


def test_a_failed_jobs_swept_value_comes_from_its_hydra_overrides(tmp_path):
    # train.py -m +debug=tiny model.n_head=1,3 seed=0,1: the n_head=3 jobs fail before training
    for seed in (0, 1):
        cfg = {**config(seed, f"o{seed}", n_head=1, d_k=None), "model": {"vocab_size": 65, "n_head": 1, "d_k": None}}
        write_fake_run(tmp_path / str(seed), cfg, 2.0 + seed / 10, n_head=1, d_k=32)
        failed_job(tmp_path / str(2 + seed), 3, seed)
    write_multirun_plan(tmp_path, "+debug=tiny", "model.n_head=1,3", "seed=0,1")
    runs = find_runs(tmp_path)
    assert varying_keys(runs) == ["model.n_head"]  # not model.vocab_size, which Hydra leaves unresolved
    report = write_report(tmp_path, tmp_path / "out").read_text()
    assert "Swept keys (every config value that differs across the runs): model.n_head." in report
    assert f"| 2 | 3 | 0 | {FAILED_AT_START} | — | model.d_model (32) must be divisible" in report
    assert "never started" not in report


def test_a_sweep_whose_every_job_failed_still_names_its_swept_key(tmp_path):
    """train.py -m +debug=tiny model.n_head=3,5: no cell completes, and the report's columns came from the
    cells, so it said 'Swept keys: none' and listed both failures without their n_head."""
    for job, n_head in enumerate((3, 5)):
        failed_job(tmp_path / str(job), n_head, 0)
    report = write_report(tmp_path, tmp_path / "out").read_text()
    assert "Swept keys (every config value that differs across the runs): model.n_head." in report
    assert "| run | model.n_head | seed | status |" in report
    assert f"| 0 | 3 | 0 | {FAILED_AT_START} |" in report and f"| 1 | 5 | 0 | {FAILED_AT_START} |" in report


def test_jobs_a_killed_sweep_never_started_are_counted_from_its_plan(tmp_path):
    write_fake_run(tmp_path / "0", config(0, "o0"), 2.0)
    write_multirun_plan(tmp_path, "+debug=tiny", "model.n_head=1,3", "seed=0,1")
    report = write_report(tmp_path, tmp_path / "out").read_text()
    assert "The one run completed." in report and "runs): none (one run)." in report
    assert "multirun.yaml plans 4 jobs and 1 has a job directory: 3 never started" in report


def test_a_plan_from_the_sweepers_params_counts_the_recipes_jobs(tmp_path):
    write_fake_run(tmp_path / "h1_s0", config(0, "o0"), 2.0)
    params = "    params:\n      model.n_head: 1,2,4\n      seed: 1337,1338\n"
    task = "  overrides:\n    task:\n    - +experiment=x\n"
    (tmp_path / "multirun.yaml").write_text(f"hydra:\n  sweeper:\n{params}{task}")
    report = write_report(tmp_path, tmp_path / "out").read_text()
    assert "multirun.yaml plans 6 jobs and 1 has a job directory: 5 never started" in report


def test_a_record_file_that_cannot_be_read_makes_an_unreadable_run_not_a_traceback(tmp_path, monkeypatch):
    """A permission or I/O error on one run's files (another user's run, a flaky mount) lists that run,
    naming the file, and the report and the lab's Runs view go on (it was an OSError traceback / a 500)."""
    from lab import runs as lab_runs

    lr_sweep(tmp_path / "sweep")
    locked = write_fake_run(tmp_path / "sweep" / "locked", config(3, "x", lr=1e-2), 1.0)
    failing_reads(monkeypatch, PermissionError(13, "Permission denied"), under=locked)
    runs = {r.path.name: r for r in find_runs(tmp_path / "sweep")}
    assert runs["locked"].status == UNREADABLE
    assert runs["locked"].error.startswith("metrics.jsonl cannot be read (Permission denied)")
    report = write_report(tmp_path / "sweep", tmp_path / "out").read_text()
    assert f"| locked | null | null | {UNREADABLE} | — | metrics.jsonl cannot be read (Permission denied);" in report
    view = lab_runs.view(tmp_path / "sweep")
    assert {r["name"]: r["curves"] for r in view["runs"]}["locked"] == {}
    with pytest.raises(ValueError, match=r"^metrics.jsonl of .*locked' cannot be read \(Permission denied\)$"):
        lab_runs.view(locked)


def test_a_jobs_error_is_its_own_record_not_a_later_lines_text(tmp_path):
    """The error column reads the ERROR record and, for a logged traceback, its last line; the lines of
    records logged after it (a multi-line INFO of a later job in the same log) are not that error."""
    from analysis.sweep import last_error, log_lines

    stamp = "[2026-01-01 00:00:00,000]"
    log = tmp_path / "train.log"
    log.write_text(
        f"{stamp}[train][ERROR] - out_dir holds another run's files\n"
        f"{stamp}[training.trainer][INFO] - model 0.16M params\nrun directory sweep/3 (full config: config.yaml)\n"
    )
    assert last_error(log_lines(log)) == "out_dir holds another run's files"
    log.write_text(
        f"{stamp}[train][ERROR] - training failed\nTraceback (most recent call last):\n  File x\nRuntimeError: boom\n"
        f"{stamp}[train][INFO] - shutting down\nsecond line\n"
    )
    assert last_error(log_lines(log)) == "RuntimeError: boom"


def test_a_crashed_run_with_one_evaluation_is_drawn_with_a_marker(tmp_path, monkeypatch):
    """A crashed run's partial curve of one point was a dashed line without markers: nothing was drawn."""
    from matplotlib.axes import Axes

    lr_sweep(tmp_path)
    write_fake_run(tmp_path / "crashed", config(3, "c", lr=1e-2), None)  # one val/loss record, no summary
    drawn, plot = [], Axes.plot
    monkeypatch.setattr(
        Axes, "plot", lambda ax, x, y, **kw: drawn.append((len(x), kw.get("marker"))) or plot(ax, x, y, **kw)
    )
    write_report(tmp_path, tmp_path / "out")
    assert all(marker for _, marker in drawn) and (1, ".") in drawn, drawn


def test_steps_and_seeds_are_listed_in_numeric_order(tmp_path):
    """By their text, seeds 2 and 10 read '10, 2' and step counts 100 and 20 read '100/20'."""
    for seed, steps in ((2, 20), (10, 100), (9, 20)):
        run = write_fake_run(tmp_path / f"s{seed}", config(seed, f"o{seed}"), 1.5)
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps(summary | {"step": steps}))
    report = write_report(tmp_path, tmp_path / "out").read_text()
    assert "| 20/100 |" in report and "| 2, 9, 10 |" in report
    assert "differs across the runs): none (the runs differ in seed alone)." in report


def test_a_run_folder_named_with_a_bar_keeps_the_unfinished_table_whole(tmp_path):
    """A '|' in a run's folder name split its row into an extra column (values are escaped, the name was not)."""
    from lab.runs import split_table

    lr_sweep(tmp_path)
    write_fake_run(tmp_path / "lr=0.01|s3", config(3, "c", lr=1e-2), None)
    report = write_report(tmp_path, tmp_path / "out").read_text()
    assert f"| lr=0.01\\|s3 | 0.01 | 3 | {CRASHED} | 10 | — |" in report
    unfinished = report[report.index("1 of 7 runs") :]
    assert split_table(unfinished)["rows"] == [["lr=0.01|s3", "0.01", "3", CRASHED, "10", "—"]]


def test_a_cell_with_no_seed_in_common_with_the_reference_has_no_nan_difference(tmp_path):
    # two sweeps into one folder, each with a job refused: n_head=1 has seed 2 only, n_head=2 seed 1 only
    for n_head, seed in ((1, 2), (2, 1)):
        write_fake_run(tmp_path / "sweep" / f"h{n_head}", config(seed, f"out/{n_head}", n_head=n_head), 2.0 + n_head)
    report = write_report(tmp_path / "sweep", tmp_path / "out").read_text()
    assert "nan" not in report.lower()
    assert "- model.n_head=2 vs model.n_head=1: no paired difference, they share no seed (seeds 1 against 2)." in report


def test_a_folder_of_two_sweeps_counts_the_jobs_each_plan_never_started(tmp_path):
    # multirun/ablate/<date>/ twice: the first sweep complete, the second killed after its first job
    for day, seeds in (("day1", (0, 1)), ("day2", (2,))):
        for seed in seeds:
            write_fake_run(tmp_path / day / str(seed), config(seed, f"o{day}{seed}"), 2.0 + seed)
        write_multirun_plan(tmp_path / day, "+debug=tiny", "seed=0,1" if day == "day1" else "seed=2,3")
    report = write_report(tmp_path, tmp_path / "out").read_text()
    assert "day2/multirun.yaml plans 2 jobs and 1 has a job directory: 1 never started" in report
    assert "day1/multirun.yaml" not in report


def test_a_paper_claim_between_cells_with_no_seed_in_common_shows_no_nan(tmp_path):
    for n_head, seed in ((1, 2), (2, 1)):
        run = config(seed, f"out/{n_head}", n_head=n_head)
        write_fake_run(tmp_path / "sweep" / f"h{n_head}", run, 2.0 + n_head, d_k=32 // n_head)  # d_model 32
    report = write_report(tmp_path / "sweep", tmp_path / "out", paper="vaswani_a").read_text()
    assert "nan" not in report.lower()
    assert "| model.n_head=1 − model.n_head=2: — | cannot tell: 0 paired seed(s) |" in report


def test_runs_written_before_a_key_existed_read_it_as_its_default(tmp_path):
    # Defect: the noise floor's runs (written before model.attn_diff existed) and a study's runs of the same
    # settings made model.attn_diff a swept key, null against false, so they could not share a reference cell.
    for seed in (0, 1):
        old = config(seed, f"out/old/{seed}")
        write_fake_run(tmp_path / "sweep" / f"old_s{seed}", old, 2.0 + seed)
        new = config(seed, f"out/new/{seed}", n_head=4)
        new["model"] |= {"attn_diff": False, "mla_latent": None}
        write_fake_run(tmp_path / "sweep" / f"new_s{seed}", new, 2.5 + seed)
    runs = find_runs(tmp_path / "sweep")
    assert varying_keys(runs) == ["model.n_head"]
    assert {r.path.name: sorted(r.predates) for r in runs} == {
        "new_s0": [], "new_s1": [], "old_s0": ["model.attn_diff", "model.mla_latent"],
        "old_s1": ["model.attn_diff", "model.mla_latent"],
    }  # fmt: skip
    report = write_report(tmp_path / "sweep", tmp_path / "out").read_text()
    assert "2 of 4 runs were written before model.attn_diff, model.mla_latent existed" in report
    # A value the older runs could not have had is still a difference: attn_diff true is another cell.
    for seed in (0, 1):
        diff = config(seed, f"out/diff/{seed}", n_head=4)
        diff["model"] |= {"attn_diff": True, "mla_latent": None}
        write_fake_run(tmp_path / "sweep" / f"diff_s{seed}", diff, 2.2 + seed)
    assert varying_keys(find_runs(tmp_path / "sweep")) == ["model.attn_diff", "model.n_head"]


def two_tokenizers(sweep: Path) -> None:
    """A sweep over data.tokenizer=char,bpe, 3 seeds: BPE's loss per token higher (4.0 against 1.5 nats), its
    bits/byte lower by 0.3 (1.9 against 2.2, each seed + seed/100)."""
    for seed in (0, 1, 2):
        for tokenizer, loss, bpb in (("char", 1.5, 2.2 + seed / 100), ("bpe", 4.0, 1.9 + seed / 100)):
            run = {**config(seed, f"out/{tokenizer}/{seed}"), "data": {"tokenizer": tokenizer}}
            path = write_fake_run(sweep / f"{tokenizer}_s{seed}", run, loss)
            summary = json.loads((path / "summary.json").read_text())
            (path / "summary.json").write_text(json.dumps(summary | {"val/bpb": bpb}))


def test_runs_on_two_tokenizers_are_compared_in_bits_per_byte(tmp_path):
    # Defect: a BPE run's loss per token (a token of ~3 bytes) read as 'higher by 3.84 nats' than a char run's,
    # while its bits/byte were the better ones.
    two_tokenizers(tmp_path / "sweep")
    report = write_report(tmp_path / "sweep", tmp_path / "out", reference="data.tokenizer=char").read_text()
    assert "with its t-interval, in bits/byte: the runs differ in their data" in report
    assert "| Δ bits/byte vs reference |" in report
    assert (
        "- data.tokenizer=bpe vs data.tokenizer=char: val bits/byte -0.3000, resolved: lower by 0.3000 bits/byte"
        in report
    )


def test_the_interval_plot_of_two_tokenizers_draws_bits_per_byte(tmp_path, monkeypatch):
    # Defect: the report's Δ was in bits/byte while its interval plot still ranked the cells in nats per token.
    two_tokenizers(tmp_path / "sweep")
    import analysis.plots

    drawn = {}
    save = analysis.plots.save
    monkeypatch.setattr(
        analysis.plots, "save", lambda fig, path: drawn.setdefault(path.name, fig.axes[0]) and save(fig, path)
    )
    write_report(tmp_path / "sweep", tmp_path / "out", reference="data.tokenizer=char")
    axes = drawn["val_loss_intervals.png"]
    assert axes.get_ylabel() == "final val/bpb (bits/byte)"
    means = sorted(round(float(line.get_ydata()[0]), 4) for line in axes.get_lines() if line.get_marker() == "o")
    assert means == [1.91, 2.21]  # bits/byte of bpe and char, not their losses 4.0 and 1.5


def test_a_difference_over_fewer_seeds_than_a_cell_has_names_them(tmp_path):
    # two sweeps in one folder: n_head=1 over seeds 1, 2, 3 and n_head=4 over 2, 3, 4; the row's mean is over
    # its own three, its Δ over the two both have, and nothing said so
    for n_head, seeds in ((1, (1, 2, 3)), (4, (2, 3, 4))):
        for seed in seeds:
            run = config(seed, f"out/{n_head}/{seed}", n_head=n_head, d_k=None)
            write_fake_run(tmp_path / "sweep" / f"h{n_head}_s{seed}", run, 2.0 + n_head / 10 + seed / 100, d_k=8)
    report = write_report(tmp_path / "sweep", tmp_path / "out", reference="model.n_head=1").read_text()
    assert "- model.n_head=4 vs model.n_head=1: val loss +0.3000 nats, " in report
    assert "(over the 2 seeds both have: 2, 3)." in report


@pytest.mark.parametrize("damage", ["deleted", "a folder"])
def test_a_finished_run_without_its_run_info_is_listed_unreadable(tmp_path, damage):
    # Defect: read as completed, then an AttributeError traceback where the table read its size
    lr_sweep(tmp_path / "sweep")
    info = tmp_path / "sweep" / "lr0.001_s1" / "run_info.json"
    (info.parent / ".hydra").mkdir()  # a sweep job's: how the report finds the run without its run_info
    (info.parent / ".hydra" / "config.yaml").write_text("seed: 1\noptim:\n  lr: 0.001\n")
    info.unlink()
    if damage == "a folder":
        info.mkdir()
    report = write_report(tmp_path / "sweep", tmp_path / "out").read_text()
    assert f"| {UNREADABLE} |" in report and "run_info.json is missing or not a file" in report
