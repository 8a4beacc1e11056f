"""Train a GPT: `python train.py [group=option ...] [key=value ...]` (Hydra).

Examples:
    python train.py                                   # default model on Shakespeare (char)
    python train.py model.n_head=8 model.d_k=32       # heads and d_k are independent
    python train.py data=shakespeare_gpt2 max_steps=500
    python train.py +debug=tiny                        # a seconds-long smoke run
    torchrun --standalone --nproc_per_node=4 train.py  # DDP on 4 GPUs (or CPU processes), same results
"""

import logging
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.errors import record

from training import distributed
from training.config import register_configs, to_train_config
from training.trainer import train

log = logging.getLogger("train")
register_configs()


@hydra.main(version_base=None, config_path="configs", config_name="config")
@record  # under torchrun: the failing rank's exception becomes the job's reported root cause
def main(cfg: DictConfig) -> float | None:
    if cfg.out_dir is None:
        cfg.out_dir = HydraConfig.get().runtime.output_dir  # rank 0's is given to all ranks in train()
    distributed.quiet_unless_main(distributed.env_info())
    log.info("resolved config:\n%s", OmegaConf.to_yaml(cfg))
    try:
        metrics = train(to_train_config(cfg))
    except (ValueError, FileNotFoundError, distributed.RankFailed) as e:
        log.error("%s", e)
        sys.exit(f"error: {e}")
    return metrics.get("val/loss")  # lets Hydra sweepers optimise it


if __name__ == "__main__":
    sys.argv = distributed.hydra_argv(sys.argv, distributed.env_info())
    main()
