"""Train a GPT: `python train.py [group=option ...] [key=value ...]` (Hydra).

Examples:
    python train.py                                   # the default: a small GPT on Shakespeare, 5 minutes
    python train.py model.n_head=8 model.d_k=32       # heads and d_k are independent
    python train.py data=shakespeare_gpt2 max_steps=500
    python train.py +debug=tiny                        # a seconds-long smoke run
    python train.py +experiment=ablate_heads_dk        # a multirun sweep over n_head x d_k
    torchrun --standalone --nproc_per_node=4 train.py  # DDP on 4 GPUs (or CPU processes), same results
"""

import logging
import os
import signal
import sys
from pathlib import Path

import training.threads  # noqa: F401  (before torch: OpenMP reads its wait policy once)
from cli.errors import LAUNCHER_PID, die_with, exit_quietly_on_ctrl_c, exit_with_error, stop_outside_the_loop

with exit_quietly_on_ctrl_c():  # torch and Hydra take seconds to import
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf import DictConfig
    from omegaconf.errors import OmegaConfBaseException
    from torch.distributed.elastic.multiprocessing.errors import record

    from cli import continue_commands as commands
    from cli.argv import hydra_argv
    from cli.config import composition_error, override_key, register_configs, to_train_config
    from cli.console import ConsoleStream, console_logging
    from cli.run_dirs import OUTPUTS, new_run_dir, point_latest, train_in_new_dir
    from cli.train_help import help_text
    from rundir.records import log_to_file
    from studies.fairness import resolve_budget
    from training import distributed
    from training.runtime import RunInterrupted
    from training.setup import train

log = logging.getLogger("train")
USER_ERRORS = (ValueError, OSError, FloatingPointError, distributed.RankFailed)
register_configs()


@hydra.main(version_base=None, config_path="configs", config_name="config")
@record  # under torchrun: the failing rank's exception becomes the job's reported root cause
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    overrides = commands.run_overrides(hydra_cfg.overrides.task, sys.argv[1:], multirun)
    console_logging()
    info = distributed.env_info()
    distributed.quiet_unless_main(info)
    if multirun:  # Hydra made the job's directory: it is the run's, and a failure is logged into it
        cfg.out_dir = hydra_cfg.runtime.output_dir
        log_to_file(Path(cfg.out_dir) / "train.log")
        if cfg.logger.group is None:
            cfg.logger.group = "/".join(Path(hydra_cfg.sweep.dir).parts[-2:])  # one wandb group per sweep
    auto_named, train_cfg = cfg.out_dir is None, None
    try:
        if auto_named:
            cfg.out_dir = str(new_run_dir())  # under torchrun, train() gives every rank rank 0's
        train_cfg = to_train_config(cfg)
        if auto_named and train_cfg.resume == "auto":
            raise commands.nothing_to_resume(Path(train_cfg.out_dir), overrides, train_cfg)
        given = train_cfg.max_steps
        resolve_budget(train_cfg)  # a study's iso_flop / iso_time budget becomes max_steps, before the run
        if train_cfg.max_steps != given and any(override_key(o) == "max_steps" for o in overrides):
            log.warning(  # `+experiment=ablate_heads_iso_flop max_steps=3` trained 31,999 steps without a word
                "fairness.mode=%s sets max_steps=%d from its budget, in place of the max_steps=%d given "
                "(fairness.mode=fixed_d_model keeps yours)", train_cfg.fairness.mode, train_cfg.max_steps, given,
            )  # fmt: skip
        metrics = train_in_new_dir(train_cfg, train) if auto_named and not info.enabled else train(train_cfg)
    except RunInterrupted as e:
        if info.is_main:  # every rank stopped at the same step: one says so
            again = "" if e.finished else f"; continue with: {commands.continue_command(Path(e.out_dir), overrides)}"
            log.warning("%s%s", e, again)
        if multirun:  # that continues this job alone: the jobs after it never started
            sweep_dir = str(Path(hydra_cfg.sweep.dir).absolute())
            log.warning("continue the whole sweep: %s", commands.sweep_continue_command(sweep_dir, sys.argv[1:]))
        if auto_named and info.is_main:
            point_latest(OUTPUTS, Path(train_cfg.out_dir))
        sys.exit(e.exit_code)
    except KeyboardInterrupt:  # a second Ctrl-C: the step in progress is not saved, an earlier one may be
        run_dir = Path(train_cfg.out_dir) if train_cfg else None  # train_in_new_dir may have moved on
        if info.is_main and run_dir and (hint := commands.insisted_hint(run_dir, overrides)):
            log.warning("%s", hint)
            if auto_named:
                point_latest(OUTPUTS, run_dir)
        raise
    except USER_ERRORS as e:  # one line, no traceback
        if multirun:
            log.error("%s", e)
            raise  # Hydra records the failed job and goes on with the rest of the sweep
        exit_with_error(commands.with_continue_command(e, train_cfg, overrides))
    except Exception:
        log.exception("training failed")  # into the run's train.log, where the ablation report finds it
        raise
    if info.is_main and not multirun:  # a sweep ends with its own hint (cli/sweep_hint.py)
        if auto_named:
            point_latest(OUTPUTS, Path(train_cfg.out_dir))
        print(commands.closing_lines(Path(train_cfg.out_dir), metrics, overrides), file=sys.stderr)
    return metrics.get("val/loss")  # lets Hydra sweepers optimise it


def start_process() -> None:
    """What every train.py process does before Hydra starts, a sweep's job (cli/sweep_job.py) too."""
    sys.stdout, sys.stderr = ConsoleStream(sys.stdout), ConsoleStream(sys.stderr)
    signal.signal(signal.SIGTERM, stop_outside_the_loop)  # the loop's own StopSignals save a step first
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")  # Hydra raises instead of printing several lines...
    if launcher := os.environ.pop(LAUNCHER_PID, None):  # a sweep's job, a benchmark's run: not left running alone
        die_with(int(launcher))


if __name__ == "__main__":
    if {"--help", "-h"} & set(sys.argv[1:]):  # Hydra's own help stays under --hydra-help
        print(help_text(Path(__file__).parent / "configs"))
        sys.exit(0)
    start_process()
    try:
        sys.argv = hydra_argv(sys.argv, distributed.env_info())
        main()
    except (HydraException, OmegaConfBaseException) as e:  # ...so a config it cannot compose gets one
        exit_with_error(composition_error(e))
    except USER_ERRORS as e:  # a sweep's failed job too (its hint printed by then, its error logged in full)
        exit_with_error(e)
    except KeyboardInterrupt:  # during start-up (a run dir made for it is gone again) or a second Ctrl-C
        print("interrupted", file=sys.stderr)
        sys.exit(130)
