"""Train a GPT: `python train.py [group=option ...] [key=value ...]` (Hydra).

Examples:
    python train.py                                   # default model on Shakespeare (char)
    python train.py model.n_head=8 model.d_k=32       # heads and d_k are independent
    python train.py data=shakespeare_gpt2 max_steps=500
    python train.py +debug=tiny                        # a seconds-long smoke run
    python train.py +experiment=ablate_heads_dk        # a multirun sweep over n_head x d_k
    torchrun --standalone --nproc_per_node=4 train.py  # DDP on 4 GPUs (or CPU processes), same results
"""

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.errors import record

from training import distributed
from training.config import register_configs, to_train_config
from training.signals import RunInterrupted
from training.trainer import train

log = logging.getLogger("train")
register_configs()


@hydra.main(version_base=None, config_path="configs", config_name="config")
@record  # under torchrun: the failing rank's exception becomes the job's reported root cause
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    if cfg.out_dir is None:
        cfg.out_dir = hydra_cfg.runtime.output_dir  # rank 0's is given to all ranks in train()
    if hydra_cfg.mode == RunMode.MULTIRUN and cfg.logger.group is None:
        cfg.logger.group = "/".join(Path(hydra_cfg.sweep.dir).parts[-2:])  # wandb runs of one sweep share a group
    distributed.quiet_unless_main(distributed.env_info())
    log.info("resolved config:\n%s", OmegaConf.to_yaml(cfg))
    try:
        metrics = train(to_train_config(cfg))
    except RunInterrupted as e:
        log.warning("%s", e)
        print(e, file=sys.stderr)
        sys.exit(e.exit_code)
    except (ValueError, OSError, FloatingPointError, distributed.RankFailed) as e:  # one line, no traceback
        log.error("%s", e)
        if hydra_cfg.mode == RunMode.MULTIRUN:
            raise  # Hydra records the failed job and goes on with the rest of the sweep
        sys.exit(f"error: {e}")
    except Exception:
        log.exception("training failed")  # into the run's train.log, where the ablation report finds it
        raise
    return metrics.get("val/loss")  # lets Hydra sweepers optimise it


if __name__ == "__main__":
    sys.argv = distributed.hydra_argv(sys.argv, distributed.env_info())
    main()
