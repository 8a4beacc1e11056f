"""A sweep refused before any job runs, and its folder held while it runs (`SweepGuard`, a Hydra callback, runs
as the sweep starts: after Hydra composes the sweep's config, before its sweeper writes multirun.yaml):

- every job composed and checked: a bad value in the third job of `model.n_head=2,3,5` stopped the sweep after
  two jobs' training, and a key Hydra could not place left a sweep folder holding only its multirun.yaml. The
  jobs are the ones Hydra's basic sweeper will run (the recipe's hydra.sweeper.params, then the command line:
  analysis.sweep.planned_sweep), each composed through Hydra's compose API and read by the schema's checks;
- a folder whose jobs are still training, or hold a finished sweep's runs, is refused (Hydra rewrote the live
  job's .hydra/ files and multirun.yaml before that job's own lock refused it);
- the folder is then this sweep's, by a run's lock on the folder itself, until the sweep ends.

Hydra builds every callback for a single run too, and calls a callback's errors warnings: the guard refuses with
`exit_with_error`, and the sweep planner is imported only when a sweep starts."""

from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from cli.config import CONFIG_DIR, composition_error, override_key, register_configs, to_train_config
from cli.errors import exit_with_error
from rundir.checkpoints import run_files
from rundir.files import RunDirInUse, RunLock, live_run_in
from training.distributed import env_info


class SweepGuard(Callback):
    """Refuses a sweep that cannot run as asked (`check`), then holds its folder from before Hydra writes
    multirun.yaml to the sweep's end: two sweeps started into one folder within the seconds a job takes to lock
    its own split its jobs between them and mixed their records, which the report then compared."""

    def __init__(self) -> None:
        self.lock: RunLock | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            self.check(config)
        except ValueError as e:
            exit_with_error(e)

    def check(self, config: DictConfig) -> None:
        """ValueError for a sweep whose folder is live or holds runs, or one of whose jobs is refused; else the
        folder is locked for this sweep."""
        sweep_dir, task = Path(str(config.hydra.sweep.dir)), list(config.hydra.overrides.task)
        check_no_live_job(sweep_dir)
        check_no_finished_jobs(sweep_dir, task)
        if env_info().is_main:
            check_every_job(task)
        try:
            self.lock = RunLock(sweep_dir).acquire()
        except RunDirInUse as e:
            raise live_sweep(sweep_dir, str(e)) from None

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.lock is not None:
            self.lock.release()


def check_every_job(task: list[str]) -> None:
    """ValueError naming the first job of the sweep `task` (a command line's overrides) that Hydra cannot compose
    or the schema refuses; nothing for a sweeper that chooses its jobs as it goes (optuna, ...). Inside a running
    sweep the jobs compose in its own Hydra (whose config search path is the sweep's)."""
    from analysis.sweep import planned_sweep

    parser = OverridesParser.create()
    fixed = [o for o in task if not parser.parse_override(o).is_sweep_override()]
    register_configs()
    inside = GlobalHydra.instance().is_initialized()
    with nullcontext() if inside else initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        try:
            plan = compose(config_name="config", overrides=fixed, return_hydra_config=True).hydra.sweeper
        except (HydraException, OmegaConfBaseException) as e:
            raise ValueError(composition_error(e)) from None
        jobs = planned_sweep(plan, task)
        if jobs is None:
            return
        shared = set.intersection(*map(set, jobs)) if len(jobs) > 1 else set()
        folders: dict[str, str] = {}  # a job's folder -> the first job that writes it
        for number, overrides in enumerate(jobs, start=1):  # counted as the sweep's "job i of N" lines count
            own = [o for o in overrides if o not in shared] or overrides  # what sets this job apart from the others
            where = f"sweep job {number} of {len(jobs)} ({' '.join(own)})"
            try:
                job = compose(config_name="config", overrides=overrides, return_hydra_config=True)
                folder, pattern = job_folder(job)
                with open_dict(job):
                    job.pop("hydra")
                    job.out_dir = job.out_dir or f"job-{number}"  # Hydra names the job's folder when it runs
                to_train_config(job)
            except (HydraException, OmegaConfBaseException) as e:
                raise ValueError(f"{where}, checked before any job runs: {composition_error(e)}") from None
            except ValueError as e:
                raise ValueError(f"{where}, checked before any job runs: {e}") from None
            if folder is not None and folder in folders:
                # the second job found the first's folder in use (or finished) and failed, after Hydra had
                # rewritten the first's .hydra/ record with its own overrides
                raise ValueError(
                    f"{folders[folder]} and {where} would both write to the job folder {folder!r}: the recipe names "
                    f"its jobs' folders {pattern}, which leaves out what sets them apart; give "
                    "hydra.sweep.subdir=<a pattern naming every swept key> or sweep one value at a time"
                )
            if folder is not None:
                folders[folder] = where


def job_folder(job: DictConfig) -> tuple[str | None, str]:
    """(the job's folder under the sweep's, the pattern that named it); None for a folder Hydra names as the
    job runs (its number, the default)."""
    pattern = str(OmegaConf.to_container(job.hydra.sweep, resolve=False).get("subdir"))
    try:
        return str(job.hydra.sweep.subdir), pattern
    except OmegaConfBaseException:  # hydra.job.num and the like are set by the launcher
        return None, pattern


def live_sweep(sweep_dir: Path, refusal: str) -> ValueError:
    """The refusal of a sweep into a folder a live process holds (`refusal`: its lock's, naming the process)."""
    held = refusal.partition("; wait for it")[0]
    return ValueError(f"hydra.sweep.dir={sweep_dir} holds a live sweep ({held}); wait for it or give another")


def check_no_live_job(sweep_dir: Path) -> None:
    """A second sweep into a folder whose jobs are still training is refused before Hydra writes anything
    (it rewrote the live job's .hydra/ files and multirun.yaml before that job's own lock refused it)."""
    if not sweep_dir.is_dir():
        return
    for job in [sweep_dir, *sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.is_symlink())]:
        if live := live_run_in(job):
            raise live_sweep(sweep_dir, live)


def check_no_finished_jobs(sweep_dir: Path, args: Sequence[str]) -> None:
    """A sweep into a folder whose jobs hold runs is refused before Hydra writes anything, unless it continues
    them (resume=) or replaces them (overwrite=true): each job refused itself, but only after Hydra had rewritten
    the finished sweep's multirun.yaml and every job's .hydra/ files with the new command's."""
    given = {override_key(a): a.partition("=")[2] for a in args}
    if given.get("resume", "null") != "null" or given.get("overwrite", "false").lower() == "true":
        return
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and run_files(p)) if sweep_dir.is_dir() else []
    if jobs:
        held = f"{jobs[0].name}/: {', '.join(run_files(jobs[0]))}"
        raise ValueError(
            f"hydra.sweep.dir={sweep_dir} already holds a sweep's runs ({held}); "
            "continue it with resume=auto, replace its runs with overwrite=true, or give another folder"
        )
