"""Round 17's look at where the default's step goes: one compiled trainer (as `python train.py` runs it) in the
cooldown, the parts outside the compiled graph timed alone (clipping, the optimizer and its Newton-Schulz, the weight
average), then 10 steps under torch.profiler with inductor's per-kernel records, the top kernels by their own time.

    python docs/recipe/round17/step_profile.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
import torch._inductor.config as inductor_config

inductor_config.cpp.enable_kernel_profile = True  # before compiling: each generated kernel gets a profiler record

from ns_batches import timed  # noqa: E402  (this folder's: the script's own directory leads sys.path)

from bench.bench_train import load_config  # noqa: E402
from data.prepare import prepare  # noqa: E402
from training.optim import clip_grad_norm_  # noqa: E402
from training.runtime import device_name, resolve_device  # noqa: E402
from training.trainer import Trainer  # noqa: E402


@torch.no_grad()
def parts(trainer: Trainer) -> dict[str, float]:
    optimizer, params = trainer.optimizer, list(trainer.model.parameters())
    hidden = next(group for group in optimizer.param_groups if group["role"] == "hidden")
    updates = [p.grad for p in hidden["params"]]
    return {
        "gradient norm and clipping": timed(lambda: clip_grad_norm_(params, 1.0)),
        "optimizer step (Muon and AdamW)": timed(optimizer.step),
        "Muon's Newton-Schulz alone": timed(lambda: optimizer._orthogonalized(updates, hidden)),
        "weight average": timed(lambda: trainer.average.update(trainer.model, 0.8)),
    }


def main() -> None:
    cfg = load_config(sys.argv[1:])
    device = resolve_device(cfg.device)
    trainer = Trainer(cfg, prepare(cfg.data, progress=False), device)
    trainer.prepare()
    for _ in range(20):
        trainer.advance(0.8)
    step_ms = timed(lambda: trainer.advance(0.8), 60)
    trainer.forward_backward(trainer.state.step)  # gradients for the parts timed alone
    print(f"{device_name(device)}; torch {torch.__version__}; the step: {step_ms:.1f} ms (median of 60)")
    for name, ms in parts(trainer).items():
        print(f"  {name}: {ms:.2f} ms")
    trainer.optimizer.zero_grad(set_to_none=True)
    with torch.profiler.profile(record_shapes=True) as prof:
        for _ in range(10):
            trainer.advance(0.8)
    table = prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60, max_shapes_column_width=50
    )
    print("10 steps under torch.profiler (its own overhead included):")
    print(table)


if __name__ == "__main__":
    main()
