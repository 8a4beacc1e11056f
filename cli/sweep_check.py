"""Every job of a sweep composed and checked before the first one starts: a bad value in the third job of
`model.n_head=2,3,5` stopped the sweep after two jobs' training, and a key Hydra could not place left a sweep
folder holding only its multirun.yaml. The jobs are the ones Hydra's basic sweeper will run (the recipe's
hydra.sweeper.params, then the command line: analysis.sweep.planned_sweep), each composed through Hydra's compose
API and read by the schema's checks (cli.config.to_train_config), before Hydra itself starts."""

from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from analysis.sweep import planned_sweep
from cli.config import CONFIG_DIR, composition_error, register_configs, to_train_config
from rundir.files import RunDirInUse, RunLock


def check_every_job(task: list[str]) -> None:
    """ValueError naming the first job of the sweep `task` (a command line's overrides) that Hydra cannot compose
    or the schema refuses; nothing for a sweeper that chooses its jobs as it goes (optuna, ...)."""
    parser = OverridesParser.create()
    fixed = [o for o in task if not parser.parse_override(o).is_sweep_override()]
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
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


class SweepLock(Callback):
    """The sweep folder is one sweep's while it runs: the launching process holds its lock (a run's lock, on the
    folder itself) from before Hydra writes multirun.yaml to the sweep's end. Two sweeps started into one folder
    within the seconds a job takes to lock its own folder split its jobs between them and mixed their records
    (one job's .hydra/ named the other sweep's overrides), which the report then compared."""

    def __init__(self) -> None:
        self.lock: RunLock | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            self.lock = RunLock(sweep_dir).acquire()
        except RunDirInUse as e:
            raise live_sweep(sweep_dir, str(e)) from None

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.lock is not None:
            self.lock.release()
