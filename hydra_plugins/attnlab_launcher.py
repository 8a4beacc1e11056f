"""attnlab's Hydra launcher `parallel`: a sweep's jobs N at a time (default two), each in its own process with
its share of the cores as torch threads (one each on two cores, unless OMP_NUM_THREADS or threads says); the
study recipes choose it (`override /hydra/launcher: parallel`), and any sweep can:

    python train.py -m hydra/launcher=parallel [hydra.launcher.jobs=2] [hydra.launcher.threads=1] seed=1,2,3

Hydra takes launchers only from the hydra_plugins package, so the class is here; the processes are
cli/sweep_jobs.py's, imported when a sweep sets the launcher up (Hydra's plugin scan imports this module in
every run, a single one too). Each job's config is composed as Hydra's basic launcher composes it."""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict


@dataclass
class ParallelLauncherConf:
    _target_: str = "hydra_plugins.attnlab_launcher.ParallelLauncher"
    jobs: int | None = None  # jobs at a time; null: two, or one where this process may use a single core
    # torch (OpenMP) threads each job computes with; null: your OMP_NUM_THREADS, else the cores // jobs at once
    threads: int | None = None


ConfigStore.instance().store(group="hydra/launcher", name="parallel", node=ParallelLauncherConf, provider="attnlab")


class ParallelLauncher(Launcher):
    def __init__(self, jobs: int | None = None, threads: int | None = None) -> None:
        self.jobs, self.threads = jobs, threads
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from cli.sweep_jobs import check_launcher_values

        check_launcher_values(self.jobs, self.threads)  # before the sweep folder is made
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from cli.sweep_jobs import jobs_at_a_time, run_jobs

        assert self.config is not None and self.hydra_context is not None and self.task_function, "launch before setup"
        setup_globals()
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        configs = self.job_configs(job_overrides, initial_job_idx)
        at_a_time, callbacks = jobs_at_a_time(self.jobs), self.hydra_context.callbacks
        return run_jobs(configs, at_a_time, self.threads, callbacks, self.task_function)  # each job runs train.py's

    def job_configs(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Iterator[DictConfig]:
        """Each job's config, composed when the job starts (the master config's resolved ${now:} kept)."""
        assert self.config is not None and self.hydra_context is not None
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(config):
                config.hydra.job.id = idx
                config.hydra.job.num = idx
            yield config
