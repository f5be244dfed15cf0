"""torch.tpu.optimizers: TorchTPU's optimizers (``AdamW``, ``Sgd``, ``Muon``),
torch.optim's own with each step one device program in every eager mode.

torch.optim's classes run on tpu as they are (their ``fused=True`` AdamW,
Adam and SGD as the op library's fused steps). These differ in two ways:

- ``AdamW`` and ``Sgd`` are fused unless asked otherwise (``fused=True``: one
  runtime op updates a whole list of parameters);
- every step is recorded under DEFER_AND_FUSE on the calling thread and
  launched at its end as one program (``torch.tpu.mark_step``), whatever
  eager mode is in force: Muon's Newton-Schulz iterations (five rounds of
  three products for each matrix) and its momentum become one program
  instead of a launch per op. The step does not wait for it.

A step whose parameters are on no tpu device runs as torch.optim's. A
closure runs first, in the eager mode in force, as torch.optim runs it.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from . import _C
from . import tpu as _tpu

__all__ = ["AdamW", "Sgd", "Muon"]


class _OneProgramStep:
    """A step recorded under DEFER_AND_FUSE and launched as one program
    per tpu device it touched."""

    def step(self, closure: Optional[Callable[[], torch.Tensor]] = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        devices = sorted(
            {
                p.device.index or 0
                for group in self.param_groups
                for p in group["params"]
                if p.device.type == "tpu"
            }
        )
        if not devices:
            super().step()
            return loss
        _C.push_eager_mode(int(_tpu.EagerMode.DEFER_AND_FUSE))
        try:
            super().step()
            self.last_step_ops = sum(_tpu.mark_step(d) for d in devices)
        finally:
            _C.pop_eager_mode()
        return loss


class AdamW(_OneProgramStep, torch.optim.AdamW):
    """torch.optim.AdamW, fused by default, each step one program."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, fused: Optional[bool] = True, **kwargs):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         maximize=maximize, fused=fused, **kwargs)


class Sgd(_OneProgramStep, torch.optim.SGD):
    """torch.optim.SGD, fused by default, each step one program."""

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 maximize=False, fused: Optional[bool] = True, **kwargs):
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov, maximize=maximize, fused=fused, **kwargs)


class Muon(_OneProgramStep, torch.optim.Muon):
    """torch.optim.Muon (matrices only, as torch's), each step one program."""
