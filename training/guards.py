"""Non-finite guards: a NaN/inf loss or gradient norm stops the run naming the step, or (with
`on_nonfinite=skip`) the step's update is dropped and counted; weights are checked before a save."""

import torch
from torch import Tensor, nn

NONFINITE_POLICIES = ("stop", "skip")


def grad_norm_(params: list[nn.Parameter], max_norm: float) -> Tensor:
    """Global L2 norm of the gradients (on the device, no sync); clips them to `max_norm` when > 0."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def read_step(loss: Tensor, norm: Tensor) -> tuple[float, float]:
    """Loss and grad norm on the host: the loop's one device sync per step, paid to name a bad step."""
    loss_value, norm_value = torch.stack([loss.float(), norm.float()]).tolist()
    return loss_value, norm_value


def is_finite(*values: float) -> bool:
    return all(v == v and abs(v) != float("inf") for v in values)


def nonfinite_error(step: int, loss: float, norm: float, last_good: str | None) -> FloatingPointError:
    kept = f"last good checkpoint: {last_good}" if last_good else "no checkpoint was saved yet"
    return FloatingPointError(
        f"step {step}: loss {loss} / gradient norm {norm} is not finite; stopped without saving ({kept}); "
        "lower optim.lr or set on_nonfinite=skip to skip such steps"
    )


def check_weights_finite(model: nn.Module, step: int) -> None:
    """Refuse to save weights an update made non-finite, so the last checkpoint stays a good one."""
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise FloatingPointError(f"step {step}: weights {', '.join(bad[:3])} are not finite; not saving them")
