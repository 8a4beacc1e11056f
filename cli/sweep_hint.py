"""What a sweep prints of itself (`SweepHint`, a Hydra callback): `job i of N` as each job starts, with one
estimate of the time left each time a job has finished, and at the end the sweep folder and the report
command to paste, which scores on every held-out token (`--full-val`: its seed spread is 4.5 times smaller
than the loop's fixed batches', so it resolves more of the comparisons) and names a paper recipe's report
section and reference cell (`hydra.callbacks.sweep_hint.paper`, `.reference`).

Hydra builds every callback for a single run too: the sweep planner is imported only when a sweep starts."""

import shlex
import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from cli.continue_commands import python_command, sweep_continue_command


class SweepHint(Callback):
    """Hydra calls `on_multirun_end` only when every job succeeded; when one failed it raises that job's error
    once all have run, so the last job's end prints the failed sweep's hint, before train.py's `error:` line."""

    def __init__(self, paper: str | None = None, reference: str | None = None, full_val: bool = True) -> None:
        self.paper, self.reference, self.full_val = paper, reference, full_val
        self.hint: dict[str, Any] = {}  # sweep_hint's arguments, set when a multirun starts
        self.jobs = 0  # the planned jobs; none for a single run, or a sweeper that chooses its jobs as it goes
        self.started_at, self.started, self.ended, self.estimated_at = 0.0, 0, 0, 0
        self.failed: list[JobReturn] = []

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from analysis.sweep import planned_sweep

        jobs = planned_sweep(config.hydra.sweeper, list(config.hydra.overrides.task))
        # part of a recipe (model.n_head=1,2 of vaswani_a's five) may leave out its reference cell
        reference = self.reference if jobs is None or reference_in_plan(self.reference, jobs) else None
        self.hint = {"sweep_dir": str(config.hydra.sweep.dir), "paper": self.paper, "reference": reference}
        self.hint["full_val"] = self.full_val
        self.jobs, self.started_at = len(jobs or []), time.perf_counter()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """`job i of N`, and on the first job to start after another has finished, the time the rest will take
        at the pace so far (jobs that start together share one estimate). Jobs still running count as half
        done: with two at a time, one finished and one running is 1.5 jobs' work."""
        if not self.jobs:  # a single run: Hydra calls this too, without a job number
            return
        eta = ""
        if self.ended > self.estimated_at:
            done = self.ended + (self.started - self.ended) / 2
            left = (time.perf_counter() - self.started_at) / done * (self.jobs - done)
            eta = f", about {left / 60:.0f} min left" if left >= 60 else f", about {left:.0f} s left"
            self.estimated_at = self.ended
        self.started += 1
        own = " ".join(config.hydra.overrides.task) or "defaults"  # as typed: override_dirname joins them with commas
        print(f"job {int(config.hydra.job.num) + 1} of {self.jobs}: {own}{eta}", file=sys.stderr)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if not self.jobs:
            return
        self.ended += 1
        if job_return.status == JobStatus.FAILED:
            self.failed.append(job_return)
        if self.failed and self.ended == self.jobs:
            print(sweep_hint(**self.hint, failed=True), file=sys.stderr)
            if any(getattr(r._return_value, "stopped", False) for r in self.failed):  # killed: its checkpoints
                sweep_dir = str(Path(self.hint["sweep_dir"]).absolute())  # continue it
                print(f"  continue the whole sweep: {sweep_continue_command(sweep_dir, sys.argv[1:])}", file=sys.stderr)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        print(sweep_hint(**self.hint), file=sys.stderr)


def reference_in_plan(reference: str | None, jobs: list[list[str]]) -> bool:
    """Whether some job of the sweep has the `--reference` cell's values ('model.n_head=4,model.d_k=null'); a key
    no job's overrides set is taken to match (the recipe fixed it)."""
    from analysis.sweep import matches

    if not reference:
        return True
    wanted = [part.partition("=")[::2] for part in reference.split(",")]
    for job in jobs:
        values = dict(o.partition("=")[::2] for o in job)
        if all(key not in values or matches(values[key], value) for key, value in wanted):
            return True
    return False


def sweep_hint(
    sweep_dir: str, paper: str | None = None, reference: str | None = None, failed: bool = False, full_val: bool = True
) -> str:
    """The folder and the report command, with the `--paper` section and the `--reference` cell a recipe names,
    scored on every held-out token (`--full-val`) unless the recipe's hint says full_val: false."""
    done = "sweep done, with failed jobs (the report lists them)" if failed else "sweep done"
    report = f"{python_command()} scripts/ablation_report.py {shlex.quote(sweep_dir)}"
    if paper:
        report += f" --paper {paper}"
    if reference:
        report += f" --reference {shlex.quote(reference)}"
    if full_val:
        report += " --full-val"
    return f"{done}: {sweep_dir}\n  report: {report}"
