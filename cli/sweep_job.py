"""One job of a sweep that the `parallel` launcher runs (cli/sweep_jobs.py), in a process of its own:

    python -P -m cli.sweep_job TRAIN_PY ARGS...     (ATTNLAB_SWEEP_JOB naming the job's YAML config)

It runs the sweep's own train.py (its `main`, after the process set-up every train.py process does) on that
one composed config, as Hydra's basic launcher would, with the sweep's command line as its own: the job's lock
and continue lines read `train.py ARGS...`, as the sweep was typed. The job's outcome goes beside the file."""

import json
import os
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import training.threads  # noqa: F401  # isort: skip  (before torch: OpenMP reads its count and wait once)
from hydra.conf import HydraConf
from hydra.core.utils import JobRuntime, JobStatus, run_job, setup_globals
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict

from cli.errors import error_line
from data.text_file import read_yaml_text

JOB_FILE = "ATTNLAB_SWEEP_JOB"  # set in a job's environment: the YAML config it runs


def run_job_file(job_file: Path, task_function: Callable[[DictConfig], Any]) -> int:
    """Run the job `job_file` holds, as Hydra's basic launcher would in its own process (the job's folder, its
    .hydra/ files, then the task), and write the outcome beside the file; the exit code (0: completed).
    The launcher's process calls the sweep's callbacks, so none run here."""
    from hydra._internal.callbacks import Callbacks

    # plain YAML: train.py's to_train_config types the task against its schema
    config = OmegaConf.create(read_yaml_text(job_file, "job file"))
    assert isinstance(config, DictConfig)
    with open_dict(config):  # and Hydra's own node against Hydra's (HydraConfig.set_config insists on it)
        schema = OmegaConf.structured(HydraConf)
        OmegaConf.set_struct(schema, False)  # keys Hydra's runtime adds beyond the dataclass (hydra.env, ...)
        config.hydra = OmegaConf.merge(schema, config.hydra)
    setup_globals()  # the ${now:} and ${hydra:} resolvers (the file holds the sweep's folder already resolved)
    JobRuntime.instance().set("name", config.hydra.job.name)
    context = HydraContext(config_loader=None, callbacks=Callbacks())  # type: ignore[arg-type]
    ret = run_job(task_function, config, "hydra.sweep.dir", "hydra.sweep.subdir", hydra_context=context)
    failed = ret.status == JobStatus.FAILED
    value = ret._return_value
    outcome = {"error": error_line(value) if failed else None, "value": None if failed else value}
    tmp = job_file.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(outcome))
    tmp.replace(job_file.with_suffix(".json"))  # whole or absent: a job killed mid-write failed
    return 1 if failed else 0


def main() -> None:
    sys.argv = sys.argv[1:]  # the sweep's own command line, train.py first
    entry = runpy.run_path(sys.argv[0], run_name="sweep_job")  # its main, without its command-line branch
    entry["start_process"]()
    try:
        sys.exit(run_job_file(Path(os.environ.pop(JOB_FILE)), entry["main"]))
    except KeyboardInterrupt:  # a second Ctrl-C, which Hydra's run_job passes on: ended as train.py ends a run
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
