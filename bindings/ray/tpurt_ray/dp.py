"""Data parallel training over every chip of a slice.

One model replica per chip. After each backward the gradients are averaged
over all chips of the slice: first over the chips of a host, on the device
(the runtime copies them to the host's first chip and sums there), then
across hosts through host memory with gloo (the group
:meth:`tpurt_ray.TpuSlice.init_collectives` forms). Every replica then
takes the same optimizer step, so the replicas stay equal.

Used inside functions run on a slice (``TpuSlice.run`` / ``train``): build
it in ``setup``, call :meth:`SliceDataParallel.step` in ``step``, and
:meth:`state_dict` in ``save``.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Optional


def _to(obj: Any, device) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(v, device) for v in obj)
    return obj


class SliceDataParallel:
    """``make_model()`` builds the model on the CPU (seed it inside for equal
    replicas); ``make_optimizer(params)`` an optimizer for one replica."""

    def __init__(
        self,
        ctx,
        make_model: Callable[[], Any],
        make_optimizer: Callable[[Any], Any],
        checkpoint: Optional[Dict[str, Any]] = None,
        cross_host: bool = True,
    ):
        """``cross_host=False`` keeps the averaging within this host's chips."""
        import torch.distributed as dist

        self.ctx = ctx
        self.cross_host = cross_host and dist.is_initialized() and dist.get_world_size() > 1
        base = make_model()
        if checkpoint is not None:
            base.load_state_dict(checkpoint["model"])
        self.replicas = [copy.deepcopy(base).to(dev) for dev in ctx.devices]
        self.optimizers = [make_optimizer(r.parameters()) for r in self.replicas]
        if checkpoint is not None:
            for opt in self.optimizers:
                # A copy each: load_state_dict keeps CPU tensors (AdamW's
                # step count) as they are, and replicas sharing one would
                # each advance it.
                opt.load_state_dict(copy.deepcopy(checkpoint["optimizer"]))
        self.world_chips = len(ctx.devices) * (dist.get_world_size() if self.cross_host else 1)

    def step(self, loss_fn: Callable[[Any, int], Any]) -> float:
        """``loss_fn(replica, chip_rank)`` computes one chip's loss on its
        share of the batch (``chip_rank``: the chip's rank in the slice).
        Returns the loss averaged over every chip of the slice."""
        import torch
        import torch.distributed as dist

        losses = []
        for replica, opt, rank in zip(self.replicas, self.optimizers, self.ctx.global_chip_ids):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(replica, rank)
            loss.backward()
            losses.append(loss.detach())
        dev0 = self.ctx.devices[0]
        params = [list(r.parameters()) for r in self.replicas]
        # Within the host: sum every chip's gradients on the first chip.
        flat = torch.cat(
            [
                torch.stack([p[i].grad.to(dev0) for p in params]).sum(0).reshape(-1)
                for i in range(len(params[0]))
            ]
        )
        loss_sum = torch.stack([x.to(dev0) for x in losses]).sum()
        # Across hosts: through host memory.
        host = torch.cat([flat, loss_sum.reshape(1)]).cpu()
        if self.cross_host:
            dist.all_reduce(host)
        host /= self.world_chips
        avg, loss = host[:-1], float(host[-1])
        for replica, opt, dev in zip(self.replicas, self.optimizers, self.ctx.devices):
            g = avg.to(dev)
            offset = 0
            for p in replica.parameters():
                n = p.numel()
                p.grad = g[offset : offset + n].view_as(p).clone()
                offset += n
            opt.step()
        return loss

    def state_dict(self) -> Dict[str, Any]:
        """Replica 0's parameters and optimizer state, on the CPU."""
        return {
            "model": _to(self.replicas[0].state_dict(), "cpu"),
            "optimizer": _to(self.optimizers[0].state_dict(), "cpu"),
        }

    def replicas_equal(self) -> bool:
        ref = [p.detach().cpu() for p in self.replicas[0].parameters()]
        for r in self.replicas[1:]:
            for a, b in zip(ref, r.parameters()):
                if not bool((a == b.detach().cpu()).all()):
                    return False
        return True
