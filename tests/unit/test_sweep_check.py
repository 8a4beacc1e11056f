"""cli/sweep_check.py and the sweep's closing hint, without training: what is refused before any job runs."""

import pytest
from omegaconf import OmegaConf

from cli.sweep_check import SweepGuard, check_every_job
from cli.sweep_hint import reference_in_plan
from rundir.files import live_run_in


def test_two_jobs_the_recipe_would_put_in_one_folder_are_refused_before_any_runs():
    # Defect: vaswani_b names its jobs dk${model.d_k}_s${seed}; sweeping n_head too gave both jobs dk8_s1, and
    # the second rewrote the first's .hydra/ record (n_head=4 beside a run trained with 2) before failing.
    task = ["+experiment=vaswani_b_cpu", "model.n_head=2,4", "model.d_k=8", "seed=1"]
    with pytest.raises(
        ValueError,
        match=r"^sweep job 1 of 2 \(model.n_head=2\) and sweep job 2 of 2 \(model.n_head=4\) "
        r"would both write to the job folder 'dk8_s1': the recipe names its jobs' folders "
        r"dk\$\{model.d_k\}_s\$\{seed\}",
    ):
        check_every_job(task)
    check_every_job([*task, "hydra.sweep.subdir=h${model.n_head}_dk${model.d_k}_s${seed}"])  # its own advice
    check_every_job(["+debug=tiny", "model.n_head=1,2", "seed=1,1"])  # numbered folders (Hydra's default) never meet


def test_the_report_command_keeps_a_reference_cell_only_where_the_sweep_has_it():
    # Defect: part of vaswani_a (n_head=1,2 of its five) printed `--reference model.n_head=4`, which the report
    # then refused: it matches no cell.
    jobs = [["+experiment=vaswani_a_cpu", f"model.n_head={h}", "seed=1"] for h in (1, 2)]
    assert not reference_in_plan("model.n_head=4", jobs)
    assert reference_in_plan("model.n_head=2", jobs) and reference_in_plan(None, jobs)
    assert reference_in_plan("model.n_head=2,model.d_k=null", jobs)  # a key no job sets is the recipe's fixed value
    assert reference_in_plan("optim.lr=1e-3", [["optim.lr=0.001"]])  # the same number, spelled otherwise


def test_a_recipe_sweeps_job_continued_with_hydra_mode_run_is_one_run():
    # Defect: the continue line printed for one job of a recipe sweep (+experiment=... hydra.mode=RUN) was
    # refused as "out_dir does not apply to a sweep"; the recipe's YAML turns multirun on, the line turns it off.
    from cli.argv import sweeping_recipe

    assert sweeping_recipe(["+experiment=ablate_heads_dk_cpu", "seed=1"]) == "+experiment=ablate_heads_dk_cpu"
    assert sweeping_recipe(["+experiment=ablate_heads_dk_cpu", "seed=1", "hydra.mode=RUN"]) is None


@pytest.mark.parametrize("flags", [["--cfg", "job"], ["--info"], ["-cd", "/elsewhere"]])
def test_hydras_own_flags_on_a_sweep_are_hydras_to_read(flags):
    # Defect: `train.py +experiment=vaswani_a_cpu --cfg job` (and --info, -cd) was "error: token recognition
    # error at: '-'": the check before the jobs read the flag as an override
    from cli.argv import hydra_argv
    from training.distributed import DistInfo

    argv = ["train.py", "+experiment=vaswani_a_cpu", *flags]
    assert hydra_argv(argv, DistInfo()) == argv


def test_a_sweep_holds_its_folder_so_a_second_one_started_at_once_is_refused(tmp_path):
    # Defect: two sweeps into one folder within ~2 s (before any job had locked its own folder) both ran, split the
    # jobs and mixed the records: a job's .hydra/ named the other sweep's overrides, and the report compared them.
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}})
    config.hydra.overrides = {"task": []}
    first, second = SweepGuard(), SweepGuard()
    first.check(config)
    assert live_run_in(tmp_path / "sweep")  # what the check of a sweep's folder reads
    with pytest.raises(ValueError, match=rf"^hydra.sweep.dir={tmp_path / 'sweep'} holds a live sweep \(.*pid "):
        second.check(config)
    first.on_multirun_end(config)
    second.check(config)  # the first sweep is over
    second.on_multirun_end(config)


def test_the_guard_refuses_in_one_line_where_hydra_would_only_warn(tmp_path, capsys):
    # Hydra turns a callback's exception into a UserWarning and runs the sweep anyway: the guard exits instead.
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}, "overrides": {"task": []}}})
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(SystemExit) as refused:
        SweepGuard().on_multirun_start(config)
    assert refused.value.code == 1
    assert capsys.readouterr().err.startswith(f"error: hydra.sweep.dir={tmp_path} already holds a sweep's runs (0/: ")
