"""The command a stopped or finished run prints to continue it: pasted into a shell, it gives train.py the
run's own overrides again, with the run directory and resume=auto in front."""

import shlex

import pytest

from cli.train_output import END_KEYS, continue_command, run_overrides

OVERRIDES = [
    "model.n_head=8",
    "+experiment=nanogpt_baby",
    "sample_prompt='ROMEO: hi, there'",  # Hydra's quotes, kept as typed
    "data.files=[/tmp/my corpus.txt]",
    "budget_s=60",
]


@pytest.mark.parametrize("out_dir", ["outputs/2026-12-01/16-43-27", "/tmp/a run's dir"])
def test_the_shell_gives_train_py_the_runs_overrides_again(out_dir):
    argv = shlex.split(continue_command(out_dir, [f"out_dir={out_dir}", *OVERRIDES, "overwrite=true"]))
    assert argv == ["python", "train.py", f"out_dir={out_dir}", "resume=auto", *OVERRIDES]


def test_a_prompt_in_hydra_quotes_reads_as_typed():
    assert (
        continue_command("run", OVERRIDES[2:3])
        == "python train.py out_dir=run resume=auto \"sample_prompt='ROMEO: hi, there'\""
    )


def test_the_closing_lines_leave_the_end_to_choose():
    argv = shlex.split(continue_command("run", [*OVERRIDES, "max_steps=10", "++resume=x"], drop=END_KEYS))
    assert argv[4:] == OVERRIDES[:-1]


def test_a_sweep_job_continues_as_the_one_run_it_is():
    job = ["+experiment=ablate_heads_dk_cpu", "model.n_head=2", "seed=1"]
    assert run_overrides(job, ["-m", *job], multirun=True) == [*job, "hydra.mode=RUN"]
    assert run_overrides(job, [*job, "hydra.mode=RUN"], multirun=False) == [*job, "hydra.mode=RUN"]
    assert run_overrides(job, job, multirun=False) == job  # a plain run: no mode in its command
