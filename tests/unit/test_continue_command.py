"""The command a stopped or finished run prints to continue it: pasted into a shell, it gives train.py the
run's own overrides again, with the run directory and resume=auto in front."""

import json
import re
import shlex
from pathlib import Path

import pytest
import safetensors.torch
import torch

from cli.argv import hydra_argv
from cli.continue_commands import END_KEYS, closing_lines, continue_command, run_overrides, sweep_continue_command
from tests.helpers import ROOT, readme_sample_run, run_cli
from training.distributed import DistInfo

OVERRIDES = [
    "model.n_head=8",
    "+experiment=nanogpt_baby",
    "sample_prompt='ROMEO: hi, there'",  # Hydra's quotes, kept as typed
    "data.files=[/tmp/my corpus.txt]",
    "budget_s=60",
]


@pytest.mark.parametrize("out_dir", ["outputs/2026-12-01/16-43-27", "/tmp/a run dir"])
def test_the_shell_gives_train_py_the_runs_overrides_again(out_dir):
    argv = shlex.split(continue_command(out_dir, [f"out_dir={out_dir}", *OVERRIDES, "overwrite=true"]))
    assert argv == ["python", "train.py", f"out_dir={out_dir}", "resume=auto", *OVERRIDES]


@pytest.mark.parametrize("out_dir", ["/tmp/a run's dir", "/tmp/über", "/tmp/runs,2", "/tmp/run (2)", "/tmp/a\\'b\\"])
def test_hydra_reads_the_pasted_out_dir_back_as_the_path(out_dir):
    # Defect: out_dir was shell-quoted only, so a path Hydra's grammar does not take bare (non-ASCII,
    # a comma, brackets) made a continue command that failed when pasted ("cannot parse override").
    from hydra.core.override_parser.overrides_parser import OverridesParser

    argv = shlex.split(continue_command(out_dir, ["model.n_head=8"]))
    assert OverridesParser.create().parse_override(argv[2]).value() == out_dir
    assert argv[3:] == ["resume=auto", "model.n_head=8"]


def test_an_interrupted_sweep_continues_as_a_whole_in_its_folder():
    # Defect: a sweep stopped by Ctrl-C printed only its running job's command; the jobs after it never
    # started, and typing the sweep again began a new one in a new folder.
    argv = ["-m", "+experiment=vaswani_a_cpu", "seed=1,2", "resume=auto", "hydra.sweep.dir=old"]
    command = sweep_continue_command("multirun/vaswani_a_cpu/05-30-58", argv)
    assert shlex.split(command) == [
        "python",
        "train.py",
        "-m",
        "+experiment=vaswani_a_cpu",
        "seed=1,2",
        "hydra.sweep.dir=multirun/vaswani_a_cpu/05-30-58",
        "resume=auto",
    ]


def test_a_sweep_flag_typed_among_the_overrides_goes_before_them():
    # Defect: `python train.py +debug=tiny -m seed=1,2` was refused by Hydra's parser with its whole usage
    # ("unrecognized arguments: seed=1,2"), for overrides on both sides of -m.
    assert hydra_argv(["train.py", "+debug=tiny", "-m", "seed=1,2"], DistInfo()) == [
        "train.py",
        "-m",
        "+debug=tiny",
        "seed=1,2",
    ]
    assert hydra_argv(["train.py", "seed=1"], DistInfo()) == ["train.py", "seed=1"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--max_steps", "10"], "--max_steps: train.py takes key=value overrides, not options; write max_steps=10"),
        (["--max-steps=10"], "--max-steps=10: train.py takes key=value overrides, not options; write max_steps=10"),
        (["max_steps", "10"], "max_steps 10: write max_steps=10 (key=value, one word)"),
        (["10"], "'10' is not an override: train.py takes key=value (`python train.py --help`)"),
        (["help"], "help: did you mean --help?"),
    ],
)
def test_an_option_or_a_key_apart_from_its_value_is_one_line(args, message):
    # Defect: `--max_steps 10` got Hydra's whole usage text, `max_steps 10` "cannot parse override '10'".
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        hydra_argv(["train.py", *args], DistInfo())


def test_hydras_own_options_and_their_values_pass():
    for args in (["--cfg", "job", "max_steps=2"], ["-cd", "configs", "--info", "plugins"], ["~logger", "-m", "seed=1"]):
        assert set(hydra_argv(["train.py", *args], DistInfo())) == {"train.py", *args}


def test_the_lines_for_a_run_reached_through_outputs_latest_name_the_run_itself(tmp_path):
    # Defect: `out_dir=outputs/latest resume=auto` (the README's way to continue) ended with a continue
    # command for outputs/latest, which the next run repoints: pasted later, it continued another run.
    run = finished_run(
        tmp_path / "outputs" / "2026-12-01" / "20-43-56", step=20, elapsed_s=4.0, max_steps=20, budget_s=None
    )
    (tmp_path / "outputs" / "latest").symlink_to(run.relative_to(tmp_path / "outputs"))
    latest = tmp_path / "outputs" / "latest"
    assert shlex.split(continue_command(latest, []))[2] == f"out_dir={run}"
    lines = closing_lines(latest, {}, [])
    assert str(latest) not in lines and f"run directory {run}" in lines and f"out_dir={run} " in lines


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


def finished_run(
    run: Path,
    step: int,
    elapsed_s: float,
    max_steps: int | None,
    budget_s: float | None,
    chars: str | None = None,
    source: str = "shakespeare",
) -> Path:
    """A run directory whose newest step checkpoint says how far it got (a header is all the line reads);
    a BPE tokenizer, or with `chars` a char vocabulary of those characters; trained on data.source `source`."""
    config = {"max_steps": max_steps, "budget_s": budget_s, "data": {"source": source}}
    meta = {"step": step, "elapsed_s": elapsed_s, "config": config}
    meta["tokenizer"] = {"name": "char", "chars": chars} if chars is not None else {"name": "bpe", "spec": "{}"}
    path = run / "checkpoints" / f"step_{step:07d}.safetensors"
    path.parent.mkdir(parents=True)
    safetensors.torch.save_file({"w": torch.zeros(1)}, str(path), metadata={"attnlab": json.dumps(meta)})
    return run


def continue_line(run: Path, overrides: list[str]) -> str:
    (line,) = [line for line in closing_lines(run, {}, overrides).splitlines() if "continue:" in line]
    return line.split("continue: ", 1)[1]


def test_a_run_that_ended_on_its_budget_is_continued_with_a_larger_total(tmp_path):
    # The default run: budget_s 280 from configs/, max_steps null. Dropping budget_s alone would
    # compose the 280 s again, already spent: the run would train one step and stop.
    run = finished_run(tmp_path / "run", step=1234, elapsed_s=262.4, max_steps=None, budget_s=280.0)
    line = continue_line(run, ["model.n_head=8", "budget_s=280"])
    command, hint = line.split("  (")
    assert shlex.split(command)[4:] == ["model.n_head=8", "budget_s=SECONDS"]
    assert "more than the 262.4 s trained" in hint and "budget_s=null max_steps=N" in hint


def test_a_budget_run_that_reached_its_steps_first_keeps_its_budget(tmp_path):
    run = finished_run(tmp_path / "run", step=20, elapsed_s=4.0, max_steps=20, budget_s=6.0)
    command, hint = continue_line(run, ["+debug=tiny", "budget_s=6"]).split("  (")
    assert shlex.split(command)[4:] == ["+debug=tiny", "budget_s=6", "max_steps=N"]
    assert "more than the 20 steps trained; its budget_s=6 still applies" in hint


def test_without_a_readable_checkpoint_the_line_leaves_both_ends_to_choose(tmp_path):
    line = continue_line(tmp_path, ["model.n_head=8", "budget_s=60"])
    assert (
        line
        == "python train.py out_dir=" + str(tmp_path) + " resume=auto model.n_head=8 max_steps=N  (or budget_s=SECONDS)"
    )


def test_the_closing_lines_name_the_checkpoint_there_is(tmp_path):
    # Defect: a run that never saved a best (a NaN val loss at every evaluation) was pointed at a
    # best.safetensors that did not exist.
    run = finished_run(tmp_path / "run", step=20, elapsed_s=4.0, max_steps=20, budget_s=None)
    (line,) = [
        line for line in closing_lines(run, {}, []).splitlines() if "checkpoint" in line and "continue" not in line
    ]
    assert line == f"  checkpoint (no best: no finite val loss): {run / 'checkpoints' / 'step_0000020.safetensors'}"
    (run / "checkpoints" / "best.safetensors").write_bytes(b"")
    assert f"  best checkpoint: {run / 'checkpoints' / 'best.safetensors'}" in closing_lines(run, {}, []).splitlines()


def newest_step(run: Path) -> int:
    return max(int(p.stem.split("_")[1]) for p in (run / "checkpoints").glob("step_*.safetensors"))


@pytest.mark.slow
def test_the_printed_command_pasted_with_a_number_trains_further(tiny_run_overrides, tmp_path):
    """A real budget run: the closing line's command, with SECONDS a total over what it trained, trains
    more steps. (max_steps=null: +debug=tiny's 20 steps can come first on an idle machine.)"""
    train = str(ROOT / "train.py")
    first = run_cli([train, *tiny_run_overrides, "budget_s=4", "max_steps=null", "sample_tokens=0"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    steps_before = newest_step(tmp_path / "run")
    line = next(line for line in first.stderr.splitlines() if "continue: " in line).split("continue: ", 1)[1]
    command, hint = line.split("  (")
    trained = float(re.search(r"more than the ([\d.]+) s trained", hint).group(1))
    argv = shlex.split(command.replace("budget_s=SECONDS", f"budget_s={trained + 4:.0f}"))
    assert argv[:2] == ["python", "train.py"]
    second = run_cli([train, *argv[2:]], cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    assert newest_step(tmp_path / "run") > steps_before + 1, second.stderr[-2000:]


def test_the_readmes_closing_lines_are_what_the_default_run_prints(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    (shown,) = [line for line in readme.splitlines() if line.startswith("  continue: python train.py out_dir=")]
    monkeypatch.chdir(tmp_path)
    run = finished_run(readme_sample_run(), step=4362, elapsed_s=279.9, max_steps=None, budget_s=280)
    assert f"  continue: {continue_line(run, [])}" == shown


@pytest.mark.parametrize(
    "chars,source,prompt",
    [
        (None, "shakespeare", ' "ROMEO:"'),
        ("ROMEO: abc", "shakespeare", ' "ROMEO:"'),
        ("the king", "shakespeare", ""),
        (None, "files", ""),  # Defect: a BPE run on one's own data was offered "ROMEO:" (it encodes anything)
    ],
)
def test_the_sample_command_gives_a_prompt_the_model_can_encode(tmp_path, chars, source, prompt):
    # Defect: it always said "ROMEO:", which sample.py refused for a char model of another corpus
    # ("characters ':', 'E', 'M', 'O', 'R' are not in the char vocabulary"); without a prompt it samples.
    run = finished_run(
        tmp_path / "run", step=20, elapsed_s=4.0, max_steps=20, budget_s=None, chars=chars, source=source
    )
    (line,) = [line for line in closing_lines(run, {}, []).splitlines() if "sample:" in line]
    assert line == f"  sample:   python scripts/sample.py {run}{prompt}"


def test_a_sweep_says_job_i_of_n_and_the_time_left(capsys, monkeypatch):
    # Defect: a sweep never said "job i of N" or how long the rest would take.
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf

    from analysis.sweep import sweep_jobs
    from cli import sweep_hint
    from cli.sweep_hint import SweepHint

    assert len(sweep_jobs([], ["model.n_head=1,2,4", "seed=1337,1338", "+debug=tiny", "x=range(3)"])) == 18
    # Defect: a recipe sweeping model.n_head over 5 values and seeds over 5, run with model.n_head=1,2,8,16
    # on the command line, said "job 1 of 100"; Hydra runs 4 x 5 (the command line's values replace the recipe's).
    recipe, line = ["model.n_head=1,2,4,8,16", "seed=1,2,3,4,5"], ["+experiment=x", "model.n_head=1,2,8,16"]
    assert len(sweep_jobs(recipe, line)) == 20
    hint = SweepHint()
    start = OmegaConf.create(
        {
            "hydra": {
                "sweep": {"dir": "multirun/x"},
                "sweeper": {"params": {"seed": "1,2"}},
                "overrides": {"task": ["a=1,2,3"]},
            }
        }
    )
    clock = iter([100.0, 130.0])
    monkeypatch.setattr(sweep_hint.time, "perf_counter", lambda: next(clock))
    hint.on_multirun_start(start)
    for num in (0, 1):  # as typed, space-separated (override_dirname's commas could not be pasted back)
        job = {
            "job": {"num": num, "override_dirname": f"a={num + 1},seed=1"},
            "overrides": {"task": [f"a={num + 1}", "seed=1"]},
        }
        hint.on_job_start(OmegaConf.create({"hydra": job}))
        hint.on_job_end(OmegaConf.create({"hydra": job}), JobReturn(status=JobStatus.COMPLETED))
    assert capsys.readouterr().err.splitlines() == [
        "job 1 of 6: a=1 seed=1",
        "job 2 of 6: a=2 seed=1, about 2 min left",
    ]


def test_a_single_runs_job_start_says_nothing():
    # Hydra calls on_job_start for a single run too, whose config has no job number: it must not raise (Hydra
    # would print the error as a UserWarning above the run's header).
    from omegaconf import OmegaConf

    from cli.sweep_hint import SweepHint

    SweepHint().on_job_start(OmegaConf.create({"hydra": {"job": {"num": "???"}}}))
