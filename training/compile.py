"""torch.compile as a switch that can never break a run: compile now, fall back to eager on failure."""

import logging
from collections.abc import Callable

import torch
from torch import nn

log = logging.getLogger(__name__)


def compile_or_eager(model: nn.Module, trial_step: Callable[[nn.Module], None]) -> nn.Module:
    """`torch.compile(model)`, or `model` itself if compiling fails.

    Compilation is lazy, so a broken toolchain (no C++ compiler, an unsupported op) would only
    surface mid-run. `trial_step` runs one forward/backward through the compiled model here, where
    a failure can still fall back; its gradients are discarded and the RNG state is restored, so the
    run is the same as if the trial never happened.
    """
    rng_state = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        compiled = torch.compile(model)
        trial_step(compiled)
    except Exception as e:  # any compiler failure: the eager model is always a correct answer
        log.warning("torch.compile failed (%s: %s); training in eager mode", type(e).__name__, str(e)[:300])
        compiled = model
    finally:
        model.zero_grad(set_to_none=True)
        torch.set_rng_state(rng_state)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    return compiled
