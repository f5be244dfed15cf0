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
import math
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

    # torch names a group through the backends registered under it; this
    # group is its own backend, so it keeps its name (a DeviceMesh's
    # subgroups are looked up by it: "ProcessGroup name not set" before).
    def _set_group_name(self, name: str) -> None:
        self._tpurt_group_name = name

    @property
    def group_name(self) -> str:
        name = getattr(self, "_tpurt_group_name", None)
        if name is None:
            raise RuntimeError("tpurt backend: the process group's name is not set yet")
        return name

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

    # torch 2.14 reaches the two above under these names
    # (all_gather_into_tensor, reduce_scatter_tensor; FSDP2 uses both).
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts=None):
        return self._allgather_base(output, input, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts=None):
        return self._reduce_scatter_base(output, input, opts)

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


# --- topology-aware device meshes ---------------------------------------------


def _snake(index: int, sizes: Sequence[int]) -> List[int]:
    """The digits (fastest first) of the `index`-th point of a
    boustrophedon walk over a grid of `sizes` (fastest first): each digit
    runs backwards where the digits above it sum to an odd number, so
    consecutive points differ by one step in one digit."""
    digits = []
    for s in sizes:
        digits.append(index % s)
        index //= s
    for k in range(len(sizes) - 1, -1, -1):
        if sum(digits[k + 1:]) % 2 == 1:
            digits[k] = sizes[k] - 1 - digits[k]
    return digits


def _mesh_ranks(coords: Sequence[Sequence[int]], mesh_shape: Sequence[int]) -> List[int]:
    """The ranks of a device mesh of `mesh_shape`, in row-major order, given
    each rank's chip coordinates (x first). The chips must fill a box of
    the slice. Mesh axes are laid over the box's axes from the last mesh
    axis (the fastest, where tensor parallelism puts the most traffic) and
    the box's x axis: a mesh axis takes whole box axes, or a run of
    neighbours along one, and walks a box it spans in snake order, so
    ranks next to each other along a mesh axis are chips next to each
    other on the interconnect. A shape that does not split the box that
    way gets the box's snake order, cut into the shape."""
    n = len(coords)
    if n == 0 or any(len(c) != len(coords[0]) for c in coords):
        raise ValueError("topology_aware_mesh: every rank needs chip coordinates of the same rank")
    lo = [min(c[a] for c in coords) for a in range(len(coords[0]))]
    box = [max(c[a] for c in coords) - lo[a] + 1 for a in range(len(lo))]
    where = {tuple(x - o for x, o in zip(c, lo)): r for r, c in enumerate(coords)}
    if len(where) != n or math.prod(box) != n:
        raise ValueError(
            f"topology_aware_mesh: the ranks' chips {sorted(map(tuple, coords))} do not fill a box of the "
            "slice (each rank one chip, no chip twice)"
        )
    # Box axes to cover, fastest first, each (axis, size, stride).
    free = [(a, s, 1) for a, s in enumerate(box) if s > 1]
    layout: List[List[tuple]] = []
    for size in reversed(list(mesh_shape)):
        pieces, need = [], size
        while need > 1 and free:
            a, s, stride = free[0]
            if need % s == 0:
                pieces.append((a, s, stride))
                free.pop(0)
                need //= s
            elif s % need == 0:
                pieces.append((a, need, stride))
                free[0] = (a, s // need, stride * need)
                need = 1
            else:
                break
        if need != 1:
            layout = []
            break
        layout.insert(0, pieces)
    ranks = []
    for flat in range(n):
        if not layout:
            ranks.append(where[tuple(_snake(flat, box))])
            continue
        point = [0] * len(box)
        rest = flat
        idx = []
        for size in reversed(list(mesh_shape)):
            idx.insert(0, rest % size)
            rest //= size
        for i, pieces in zip(idx, layout):
            for (a, _, stride), d in zip(pieces, _snake(i, [p[1] for p in pieces])):
                point[a] += d * stride
        ranks.append(where[tuple(point)])
    return ranks


def topology_aware_mesh(mesh_shape: Sequence[int], mesh_dim_names: Sequence[str] | None = None):
    """A ``DeviceMesh`` over the ranks of the default process group (one
    tpu device each, the current one) whose ranks are laid out by where
    their chips sit in the slice: ranks next to each other along a mesh
    axis, the last one first, are chips next to each other on the
    interconnect (see ``_mesh_ranks``). The chips are each device's
    ``get_device_properties().coords``, exchanged once over the default
    group."""
    from torch.distributed.device_mesh import DeviceMesh

    shape = [int(s) for s in mesh_shape]
    if not dist.is_initialized():
        raise RuntimeError(
            "topology_aware_mesh: torch.distributed is not initialized; call "
            "torch.distributed.init_process_group('tpurt', ...) first (one rank per tpu device)"
        )
    world = dist.get_world_size()
    if not shape or any(s < 1 for s in shape) or math.prod(shape) != world:
        raise ValueError(f"topology_aware_mesh: mesh shape {shape} does not hold the {world} ranks")
    from . import tpu

    mine = list(tpu.get_device_properties(tpu.current_device()).coords)
    coords: List[List[int]] = [None] * world  # type: ignore[list-item]
    dist.all_gather_object(coords, mine)
    ranks = torch.tensor(_mesh_ranks(coords, shape), dtype=torch.int64).reshape(shape)
    names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
    return DeviceMesh("tpu", ranks, mesh_dim_names=names)
