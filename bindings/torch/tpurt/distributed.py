"""The torch.distributed backend for device ``tpu``: ``"tpurt"``.

    dist.init_process_group("cpu:gloo,tpu:tpurt", ...)   # or just "tpurt"
    model = DistributedDataParallel(model.to("tpu"))

Collectives on tpu tensors. Where one process passes several tensors (on
several of its chips), the runtime combines them on the device first (on
the first tensor's chip); across processes the result travels through host
memory over gloo, and comes back to every tensor. CPU tensors go to gloo
directly. Every collective completes before it returns (its Work is
already done), so ``async_op=True`` gives a finished Work.

The backend registers itself at ``import tpurt``.
"""

from __future__ import annotations

import datetime
from typing import List, Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

BACKEND = "tpurt"

_R = dist.ReduceOp.RedOpType


def _done(result) -> "dist.Work":
    fut: Future = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _op_of(opts) -> "dist.ReduceOp.RedOpType":
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    return getattr(op, "op", op)


def _combine(tensors: Sequence[torch.Tensor], op) -> torch.Tensor:
    """One tensor from this process's tensors, on the first one's device."""
    first = tensors[0]
    acc = first.clone()
    for t in tensors[1:]:
        t = t.to(first.device)
        if op in (_R.SUM, _R.AVG):
            acc.add_(t)
        elif op == _R.PRODUCT:
            acc.mul_(t)
        elif op == _R.MIN:
            acc = torch.minimum(acc, t)
        elif op == _R.MAX:
            acc = torch.maximum(acc, t)
        else:
            raise ValueError(f"tpurt backend: reduce op {op} is not supported (SUM, AVG, PRODUCT, MIN, MAX are)")
    return acc


class TpuProcessGroup(dist.ProcessGroup):
    """A process group whose collectives accept tpu tensors."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)

    def getBackendName(self) -> str:
        return BACKEND

    def _check(self, tensors: Sequence[torch.Tensor], what: str) -> None:
        if not tensors:
            raise ValueError(f"tpurt backend: {what} got no tensors")
        shape, dtype = tensors[0].shape, tensors[0].dtype
        for t in tensors:
            if t.shape != shape or t.dtype != dtype:
                raise ValueError(
                    f"tpurt backend: {what} takes tensors of one shape and dtype, "
                    f"got {tuple(shape)} {dtype} and {tuple(t.shape)} {t.dtype}"
                )

    # --- reductions ------------------------------------------------------------

    def allreduce(self, tensors: List[torch.Tensor], opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        self._check(tensors, "allreduce")
        op = _op_of(opts) if opts is not None else _R.SUM
        local = _combine(tensors, op)
        host = local.cpu()
        gloo_op = dist.ReduceOp.SUM if op == _R.AVG else dist.ReduceOp(op)
        o = dist.AllreduceOptions()
        o.reduceOp = gloo_op
        self._gloo.allreduce([host], o).wait()
        if op == _R.AVG:
            host = host / (self.size() * len(tensors)) if host.is_floating_point() else host // (self.size() * len(tensors))
        for t in tensors:
            t.copy_(host)
        return _done(tensors)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts=None):
        for t in tensors:
            o = dist.AllreduceOptions()
            if opts is not None:
                o.reduceOp = opts.reduceOp
            self.allreduce([t], o)
        return _done(tensors)

    def reduce(self, tensors: List[torch.Tensor], opts=None):
        # Every rank gets the result: simpler than routing, and correct for
        # the root (the others' contents are unspecified after a reduce).
        o = dist.AllreduceOptions()
        if opts is not None:
            o.reduceOp = opts.reduceOp
        return self.allreduce(tensors, o)

    # --- data movement -----------------------------------------------------------

    def broadcast(self, tensors: List[torch.Tensor], opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        self._check(tensors, "broadcast")
        root_rank = getattr(opts, "rootRank", 0) if opts is not None else 0
        root_tensor = getattr(opts, "rootTensor", 0) if opts is not None else 0
        host = tensors[root_tensor].cpu()
        o = dist.BroadcastOptions()
        o.rootRank = root_rank
        o.rootTensor = 0
        self._gloo.broadcast([host], o).wait()
        for t in tensors:
            t.copy_(host)
        return _done(tensors)

    def allgather(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts=None):
        if len(inputs) != 1 or len(output_lists) != 1:
            raise ValueError("tpurt backend: allgather takes one input tensor per process")
        out = [torch.empty_like(inputs[0], device="cpu") for _ in output_lists[0]]
        self._gloo.allgather([out], [inputs[0].cpu()]).wait()
        for dst, src in zip(output_lists[0], out):
            dst.copy_(src)
        return _done(output_lists)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts=None):
        host = torch.empty_like(output, device="cpu")
        self._gloo._allgather_base(host, input.cpu()).wait()
        output.copy_(host)
        return _done(output)

    def reduce_scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts=None):
        if len(outputs) != 1 or len(input_lists) != 1:
            raise ValueError("tpurt backend: reduce_scatter takes one output tensor per process")
        op = _op_of(opts) if opts is not None else _R.SUM
        chunks = input_lists[0]
        flat = torch.stack([c.cpu() for c in chunks])
        o = dist.AllreduceOptions()
        o.reduceOp = dist.ReduceOp.SUM if op == _R.AVG else dist.ReduceOp(op)
        self._gloo.allreduce([flat], o).wait()
        mine = flat[self.rank()]
        if op == _R.AVG:
            mine = mine / self.size()
        outputs[0].copy_(mine)
        return _done(outputs)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts=None):
        chunks = list(input.reshape(self.size(), *output.shape).unbind(0))
        return self.reduce_scatter([output], [chunks], opts)

    def barrier(self, opts=None):
        self._gloo.barrier().wait()
        return _done(None)

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0):
        self._gloo.send([t.cpu() for t in tensors], dst, tag).wait()
        return _done(tensors)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0):
        host = [torch.empty_like(t, device="cpu") for t in tensors]
        self._gloo.recv(host, src, tag).wait()
        for t, h in zip(tensors, host):
            t.copy_(h)
        return _done(tensors)


def _create(store, rank: int, size: int, timeout: datetime.timedelta) -> TpuProcessGroup:
    return TpuProcessGroup(store, rank, size, timeout)


def register() -> None:
    """Register the ``tpurt`` backend for device ``tpu`` (idempotent)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, devices=["tpu"])
