"""torch.tpu.ops: TorchTPU's SparseCore embedding ops, on the runtime's
``sparse_dense_matmul*`` ops; ``ragged_dot``, the grouped product of
mixture-of-experts layers; ``max_pool`` over 1 to 3 spatial dims; and ``all_gather_dim`` / ``reduce_scatter_dim``,
collectives along a tensor dimension. (TorchTPU publishes these names but
not their signatures; ours follow JAX's: ``lax.ragged_dot``, the splash
attention kernels' masks, ``lax.optimization_barrier``,
``lax.all_gather(..., axis=, tiled=True)`` / ``lax.psum_scatter(...,
scatter_dimension=, tiled=True)``.)

The sparse input is a matrix of samples by table rows in four tensors
(what TorchRec's SparseCore input preprocessing makes):

- ``row_pointers`` [P] int: the end of each partition's entries (one
  partition per SparseCore), non-decreasing; entries at or past
  ``row_pointers[-1]`` are padding;
- ``embedding_ids`` [N] int: the table row of each entry;
- ``sample_ids`` [N] int: the output row (sample) of each entry;
- ``gains`` [N] float: each entry's weight (1 for sum pooling, 1/len for
  mean, or a per-sample weight).

``sparse_dense_matmul`` computes ``out[sample_ids[i]] += gains[i] *
table[embedding_ids[i]]``; the ``sparse_dense_matmul_grad_with_*`` ops sum
the gradient per touched row and apply the optimizer to those rows only,
returning the new table (and optimizer state), as TorchTPU's do.

Each op runs on the device's SparseCore queue: ordered after the work
already queued on the current stream and before what is queued on it
next, so a caller sees stream order as usual, while TensorCore work on
other streams overlaps with it. (Called on a SparseCore stream, it runs
there directly.)

Inputs are checked on the device before the op runs (one read back per
distinct set of sparse inputs; a backward reuses its forward's check): an
id outside the table or the batch, row pointers that decrease or run past
the entries, or a gain that is not finite raise ValueError naming the op,
the input, the position and the value. The op itself never reads or writes
out of bounds, even unchecked (``set_validate_inputs(False)``): bad entries
take no part.
"""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from . import _C

__all__ = [
    "sparse_dense_matmul",
    "sparse_dense_matmul_grad",
    "sparse_dense_matmul_grad_with_sgd",
    "sparse_dense_matmul_grad_with_adagrad",
    "sparse_dense_matmul_grad_with_rowwise_adagrad",
    "sparse_dense_matmul_grad_with_adam",
    "sparse_dense_matmul_activation_unstack",
    "ragged_dot",
    "max_pool",
    "splash_sdpa",
    "sparse_gather",
    "optimization_barrier",
    "all_gather_dim",
    "reduce_scatter_dim",
    "set_validate_inputs",
    "sparse_cores",
    "validate_inputs_enabled",
]

_validate = True
_lock = threading.Lock()
# Sparse inputs already checked, most recent last (a forward's, then its
# backward's): the key (address, version and size of the four tensors, and
# the bounds) and the tensors themselves, held so that no other tensor can
# take their memory, and so their key, while they are listed.
_checked: List[Tuple[tuple, tuple]] = []
_CHECKED_KEEP = 8
_sparse_streams: Dict[int, torch.Stream] = {}


def set_validate_inputs(enabled: bool) -> None:
    """Check sparse inputs before each op (the default). Off, a bad entry
    is left out silently instead of raising; nothing is read back."""
    global _validate
    _validate = bool(enabled)


def validate_inputs_enabled() -> bool:
    return _validate


def sparse_cores(device=None) -> int:
    """The SparseCores per chip of a tpu device, as the SparseCore layouts
    count them: 1 on a device with none (the XLA CPU and GPU plugins),
    whose sparse queue stands in for one."""
    return max(1, int(torch.tpu.get_device_properties(device).sparse_cores))


def _tensor(op: str, name: str, t, device: Optional[torch.device] = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"torch.tpu.ops.{op}: {name} must be a tensor, got {type(t).__name__}")
    if device is not None and t.device != device:
        raise ValueError(f"torch.tpu.ops.{op}: {name} is on {t.device}, the embedding table on {device}")
    return t


_KINDS = {
    1: ("row_pointers", "row pointer {value} at position {pos} decreases or runs past the {n} entries"),
    2: ("embedding_ids", "embedding id {value} at position {pos} is outside the table's {rows} rows"),
    3: ("sample_ids", "sample id {value} at position {pos} is outside the batch of {batch}"),
    4: ("gains", "the gain at position {pos} is not finite"),
}


def _check(op: str, csr: Sequence[torch.Tensor], rows: int, batch: int) -> None:
    if not _validate:
        return
    key = tuple((t.data_ptr(), t._version, tuple(t.shape), t.dtype) for t in csr) + (rows, batch)
    with _lock:
        if any(k == key for k, _ in _checked):
            return
    (res,) = _C.call_op("sparse_csr_check", list(csr), {"num_rows": int(rows), "batch_size": int(batch)})
    kind, pos, value = res.tolist()
    if kind != 0:
        name, msg = _KINDS[kind]
        raise ValueError(
            f"torch.tpu.ops.{op}: {name}: "
            + msg.format(value=value, pos=pos, n=csr[1].numel(), rows=rows, batch=batch)
        )
    with _lock:
        _checked.append((key, tuple(csr)))
        del _checked[:-_CHECKED_KEEP]


def _sparse_stream(device_index: int) -> torch.Stream:
    s = _sparse_streams.get(device_index)
    if s is None:
        s = torch.tpu.Stream(device_index, core="sparse")
        _sparse_streams[device_index] = s
    return s


def _on_sparse_queue(dev: torch.device, inputs: Sequence[torch.Tensor], run) -> List[torch.Tensor]:
    """`run()` (which returns tensors) on the SparseCore queue of `dev`, in
    the current stream's order: after what is queued on it, before what is
    queued next; `inputs` are kept alive for the sparse queue."""
    cur = torch.tpu.current_stream(dev)
    if cur.core == "sparse":
        return run()
    sc = _sparse_stream(dev.index or 0)
    sc.wait_stream(cur)
    with torch.tpu.stream(sc):
        outs = run()
    for t in inputs:
        if t.device.type == "tpu":
            t.record_stream(sc)
    cur.wait_stream(sc)
    for o in outs:
        o.record_stream(cur)
    return outs


def _run(op: str, inputs: List[torch.Tensor], attrs: dict) -> List[torch.Tensor]:
    """The op on the SparseCore queue of the table's device, in the current
    stream's order."""
    dev = inputs[4].device
    if dev.type != "tpu":
        raise ValueError(f"torch.tpu.ops.{op}: the embedding table must be on a tpu device, got {dev}")
    return _on_sparse_queue(dev, inputs, lambda: _C.call_op(op, inputs, attrs))


def _csr(op: str, row_pointers, embedding_ids, sample_ids, gains, like: torch.Tensor):
    """The four CSR inputs, checked to be tensors on `like`'s device."""
    dev = like.device
    return [
        _tensor(op, "row_pointers", row_pointers, dev),
        _tensor(op, "embedding_ids", embedding_ids, dev),
        _tensor(op, "sample_ids", sample_ids, dev),
        _tensor(op, "gains", gains, dev),
    ]


def _lr(op: str, learning_rate, device: torch.device) -> torch.Tensor:
    if isinstance(learning_rate, torch.Tensor):
        lr = learning_rate.detach()
        if lr.numel() != 1:
            raise ValueError(f"torch.tpu.ops.{op}: learning_rate must have one element, got {tuple(lr.shape)}")
        return lr.reshape(()).to(device=device, dtype=torch.float32)
    return torch.tensor(float(learning_rate), dtype=torch.float32, device=device)


def sparse_dense_matmul(
    row_pointers: torch.Tensor,
    embedding_ids: torch.Tensor,
    sample_ids: torch.Tensor,
    gains: torch.Tensor,
    embedding_table: torch.Tensor,
    batch_size: int,
    max_ids_per_partition: int = 256,
    max_unique_ids_per_partition: int = 256,
) -> torch.Tensor:
    """The pooled activations [batch_size, dim]: the sparse matrix times
    the table. (The capacity arguments are TorchTPU's; the preprocessing
    applies them, so they are accepted and not needed here.)"""
    op = "sparse_dense_matmul"
    table = _tensor(op, "embedding_table", embedding_table)
    csr = _csr(op, row_pointers, embedding_ids, sample_ids, gains, table)
    if table.dim() != 2:
        raise ValueError(f"torch.tpu.ops.{op}: embedding_table must be 2-D, got {tuple(table.shape)}")
    _check(op, csr, table.shape[0], batch_size)
    (out,) = _run(op, csr + [table.detach()], {"batch_size": int(batch_size)})
    return out


def sparse_dense_matmul_grad(
    row_pointers: torch.Tensor,
    embedding_ids: torch.Tensor,
    sample_ids: torch.Tensor,
    gains: torch.Tensor,
    grad_output: torch.Tensor,
    num_rows: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The table's row-sparse gradient, coalesced: (rows [N] int64, values
    [N, dim]); the first k rows are the distinct rows touched, ascending,
    and the rest -1 with zero values."""
    op = "sparse_dense_matmul_grad"
    g = _tensor(op, "grad_output", grad_output)
    csr = _csr(op, row_pointers, embedding_ids, sample_ids, gains, g)
    if g.dim() != 2:
        raise ValueError(f"torch.tpu.ops.{op}: grad_output must be 2-D, got {tuple(g.shape)}")
    _check(op, csr, num_rows, g.shape[0])
    rows, values = _run(op, csr + [g], {"num_rows": int(num_rows)})
    return rows, values


def _fused(
    op: str,
    csr_in,
    table: torch.Tensor,
    states: List[Tuple[str, torch.Tensor]],
    grad: torch.Tensor,
    learning_rate,
    attrs: dict,
) -> List[torch.Tensor]:
    table = _tensor(op, "embedding_table", table)
    csr = _csr(op, *csr_in, table)
    grad = _tensor(op, "grad", grad, table.device)
    sts = [_tensor(op, n, s, table.device).detach() for n, s in states]
    if table.dim() != 2 or grad.dim() != 2:
        raise ValueError(
            f"torch.tpu.ops.{op}: embedding_table and the activation gradient must be 2-D, "
            f"got {tuple(table.shape)} and {tuple(grad.shape)}"
        )
    _check(op, csr, table.shape[0], grad.shape[0])
    lr = _lr(op, learning_rate, table.device)
    return _run(op, csr + [table.detach()] + sts + [grad.detach(), lr], attrs)


def sparse_dense_matmul_grad_with_sgd(
    row_pointers,
    embedding_ids,
    sample_ids,
    gains,
    embedding_table,
    grad,
    learning_rate,
    device_batch_size: Optional[int] = None,
    max_ids_per_partition: int = 256,
    max_unique_ids_per_partition: int = 256,
    computation_name: str = "sgd",
) -> torch.Tensor:
    """The table after SGD on the rows looked up: w -= lr * g."""
    (out,) = _fused(
        "sparse_dense_matmul_grad_with_sgd",
        (row_pointers, embedding_ids, sample_ids, gains),
        embedding_table,
        [],
        grad,
        learning_rate,
        {},
    )
    return out


def _with_accumulator(op: str, csr, table, accumulator, grad, learning_rate, epsilon):
    t, a = _fused(op, csr, table, [("accumulator", accumulator)], grad, learning_rate, {"eps": float(epsilon)})
    return t, a


def sparse_dense_matmul_grad_with_adagrad(
    row_pointers,
    embedding_ids,
    sample_ids,
    gains,
    embedding_table,
    accumulator,
    grad,
    learning_rate,
    epsilon: float = 1e-10,
    device_batch_size: Optional[int] = None,
    max_ids_per_partition: int = 256,
    max_unique_ids_per_partition: int = 256,
    computation_name: str = "adagrad",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(table, accumulator) after Adagrad on the rows looked up:
    a += g^2; w -= lr * g / (sqrt(a) + epsilon)."""
    return _with_accumulator(
        "sparse_dense_matmul_grad_with_adagrad", (row_pointers, embedding_ids, sample_ids, gains),
        embedding_table, accumulator, grad, learning_rate, epsilon,
    )


def sparse_dense_matmul_grad_with_rowwise_adagrad(
    row_pointers,
    embedding_ids,
    sample_ids,
    gains,
    embedding_table,
    accumulator,
    grad,
    learning_rate,
    epsilon: float = 1e-10,
    device_batch_size: Optional[int] = None,
    max_ids_per_partition: int = 256,
    max_unique_ids_per_partition: int = 256,
    computation_name: str = "rowwise_adagrad",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(table, accumulator [rows] or [rows, 1]) after row-wise Adagrad (one
    accumulator per row, as fbgemm's): a += mean(g^2); w -= lr * g /
    (sqrt(a) + epsilon)."""
    return _with_accumulator(
        "sparse_dense_matmul_grad_with_rowwise_adagrad", (row_pointers, embedding_ids, sample_ids, gains),
        embedding_table, accumulator, grad, learning_rate, epsilon,
    )


def sparse_dense_matmul_grad_with_adam(
    row_pointers,
    embedding_ids,
    sample_ids,
    gains,
    embedding_table,
    momentum,
    velocity,
    grad,
    learning_rate,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-10,
    device_batch_size: Optional[int] = None,
    max_ids_per_partition: int = 256,
    max_unique_ids_per_partition: int = 256,
    computation_name: str = "adam",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(table, momentum, velocity) after Adam on the rows looked up (lazy:
    other rows keep their moments; no bias correction, as the op takes no
    step count): m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
    w -= lr * m / (sqrt(v) + epsilon)."""
    t, m, v = _fused(
        "sparse_dense_matmul_grad_with_adam",
        (row_pointers, embedding_ids, sample_ids, gains),
        embedding_table,
        [("momentum", momentum), ("velocity", velocity)],
        grad,
        learning_rate,
        {"beta1": float(beta1), "beta2": float(beta2), "eps": float(epsilon)},
    )
    return t, m, v


def sparse_dense_matmul_activation_unstack(
    activations: torch.Tensor,
    per_feature_batch_sizes: Sequence[int],
    per_feature_dims: Sequence[int],
) -> List[torch.Tensor]:
    """Each feature's [batch, dim] out of a stacked table's activations.

    The activations of F features with batch B are laid out by SparseCore
    (the layout TorchRec's preprocessing makes): [sparse_cores, F,
    B / sparse_cores, D] with sparse_cores the device's count
    (`get_device_properties().sparse_cores`, or 1 on a device with none,
    whose sparse queue stands in for one)."""
    op = "sparse_dense_matmul_activation_unstack"
    sizes = list(per_feature_batch_sizes)
    dims = list(per_feature_dims)
    if len(sizes) != len(dims) or not sizes:
        raise ValueError(
            f"torch.tpu.ops.{op}: one batch size and one dim per feature, got {len(sizes)} and {len(dims)}"
        )
    if len(set(sizes)) != 1:
        raise ValueError(f"torch.tpu.ops.{op}: features of one stacked table share a batch size, got {sizes}")
    f, b = len(sizes), sizes[0]
    nsc = sparse_cores(activations.device) if activations.device.type == "tpu" else 1
    if activations.dim() != 2 or activations.shape[0] != f * b or b % nsc:
        raise ValueError(
            f"torch.tpu.ops.{op}: activations must be [{f} features x batch {b}, dim] with the batch "
            f"divisible by the {nsc} SparseCores, got {tuple(activations.shape)}"
        )
    d = activations.shape[1]
    if max(dims) > d:
        raise ValueError(f"torch.tpu.ops.{op}: a feature dim in {dims} exceeds the activations' {d}")
    x = activations.reshape(nsc, f, b // nsc, d).transpose(0, 1).reshape(f, b, d)
    return [x[i, :, : dims[i]] for i in range(f)]


class _RaggedDot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, lhs, rhs, group_sizes):
        ctx.save_for_backward(lhs, rhs, group_sizes)
        (out,) = _C.call_op("ragged_dot", [lhs, rhs, group_sizes], {})
        return out

    @staticmethod
    def backward(ctx, grad):
        lhs, rhs, group_sizes = ctx.saved_tensors
        d_lhs = d_rhs = None
        if ctx.needs_input_grad[0]:
            (d_lhs,) = _C.call_op("ragged_dot", [grad, rhs.transpose(1, 2), group_sizes], {})
            d_lhs = d_lhs.to(lhs.dtype)
        if ctx.needs_input_grad[1]:
            (d_rhs,) = _C.call_op("ragged_dot_rhs_grad", [lhs, grad, group_sizes], {})
            d_rhs = d_rhs.to(rhs.dtype)
        return d_lhs, d_rhs, None


def ragged_dot(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    group_sizes: torch.Tensor,
    *,
    preferred_element_type: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """The grouped product of a mixture-of-experts layer, as JAX's
    ``lax.ragged_dot``: ``lhs`` [m, k] holds rows sorted by group (expert),
    ``rhs`` [g, k, n] one matrix per group, ``group_sizes`` [g] (int32 or
    int64) how many consecutive rows each group has. Group j's rows are
    multiplied by ``rhs[j]``; the result is [m, n], zero in rows past the
    groups' total (a group with a negative size has no rows; sizes that run
    past m are cut at m). Differentiable in ``lhs`` and ``rhs``; one program
    on the device whatever the sizes (nothing is read back).

    ``preferred_element_type=torch.float32`` with bf16 or f16 operands
    returns the f32 sums unrounded. The product is computed over every
    (group, k) pair with the other groups' entries zero, g times the work
    of a kernel that skips them: exact, though a weight that is inf or NaN
    in one group makes every row NaN."""
    op = "ragged_dot"
    for name, t in (("lhs", lhs), ("rhs", rhs), ("group_sizes", group_sizes)):
        _tensor(op, name, t)
        if t.device.type != "tpu" or t.device != lhs.device:
            raise ValueError(
                f"torch.tpu.ops.{op}: {name} is on {t.device}; all three operands must be on one tpu device"
            )
    if group_sizes.dtype.is_floating_point or group_sizes.dtype.is_complex or group_sizes.dtype == torch.bool:
        raise ValueError(f"torch.tpu.ops.{op}: group_sizes must be an integer tensor, got {group_sizes.dtype}")
    if preferred_element_type is not None:
        lhs = lhs.to(preferred_element_type)
        rhs = rhs.to(preferred_element_type)
    try:
        return _RaggedDot.apply(lhs, rhs, group_sizes)
    except RuntimeError as e:
        raise ValueError(f"torch.tpu.ops.{op}: {e}") from None


def max_pool(
    x: torch.Tensor,
    kernel_size,
    stride=None,
    padding=0,
    dilation=1,
    ceil_mode: bool = False,
    return_indices: bool = False,
):
    """Max pooling over the last 1, 2 or 3 dims of ``x`` (as many as
    ``kernel_size`` has entries; an int kernel pools over all dims after
    batch and channels): ``torch.nn.functional.max_pool{1,2,3}d``'s
    arguments and results (indices flat in the input's spatial dims), run
    by the runtime's ``max_pool`` op, forward and backward, on any device
    torch's functions run on."""
    n = len(kernel_size) if isinstance(kernel_size, (list, tuple)) else x.dim() - 2
    if n not in (1, 2, 3):
        raise ValueError(
            f"torch.tpu.ops.max_pool: pools over 1, 2 or 3 spatial dims; kernel_size {kernel_size} "
            f"on a {x.dim()}-D input gives {n}"
        )
    f = (
        torch.nn.functional.max_pool1d,
        torch.nn.functional.max_pool2d,
        torch.nn.functional.max_pool3d,
    )[n - 1]
    return f(x, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode, return_indices=return_indices)


def _dim(op: str, t: torch.Tensor, dim: int) -> int:
    if not -t.dim() <= dim < max(t.dim(), 1):
        raise ValueError(f"torch.tpu.ops.{op}: dim {dim} is out of range for a {t.dim()}-D tensor")
    return dim % t.dim()


def _world(group) -> int:
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("torch.tpu.ops: collectives need torch.distributed.init_process_group first")
    return dist.get_world_size(group)


def _gather(t: torch.Tensor, dim: int, group) -> torch.Tensor:
    import torch.distributed as dist

    world = _world(group)
    moved = t.movedim(dim, 0).contiguous()
    out = moved.new_empty((world * moved.shape[0], *moved.shape[1:]))
    dist.all_gather_into_tensor(out, moved, group=group)
    return out.movedim(0, dim).contiguous()


def _scatter(t: torch.Tensor, dim: int, op, group) -> torch.Tensor:
    import torch.distributed as dist

    world = _world(group)
    if t.shape[dim] % world:
        raise ValueError(
            f"torch.tpu.ops.reduce_scatter_dim: dim {dim} of {tuple(t.shape)} does not split "
            f"into the group's {world} ranks"
        )
    moved = t.movedim(dim, 0).contiguous()
    out = moved.new_empty((moved.shape[0] // world, *moved.shape[1:]))
    dist.reduce_scatter_tensor(out, moved, op=op, group=group)
    return out.movedim(0, dim).contiguous()


class _AllGatherDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, dim, group):
        ctx.dim, ctx.group = dim, group
        return _gather(t, dim, group)

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed as dist

        return _scatter(grad, ctx.dim, dist.ReduceOp.SUM, ctx.group), None, None


class _ReduceScatterDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, dim, op, group):
        ctx.dim, ctx.group = dim, group
        return _scatter(t, dim, op, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.dim, ctx.group), None, None, None


def all_gather_dim(tensor: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along ``dim`` in rank order (as
    ``lax.all_gather(x, axis, axis=dim, tiled=True)``): from [.., s, ..] on
    each of W ranks, [.., W*s, ..] on all. Differentiable: the gradient is
    the sum over ranks of each rank's slice (``reduce_scatter_dim``)."""
    dim = _dim("all_gather_dim", tensor, dim)
    return _AllGatherDim.apply(tensor, dim, group)


def reduce_scatter_dim(tensor: torch.Tensor, dim: int, op=None, group=None) -> torch.Tensor:
    """``tensor`` reduced over the ranks (``op``: a ``torch.distributed.ReduceOp``,
    SUM by default) and split along ``dim``: rank r keeps the r-th of W
    equal slices (as ``lax.psum_scatter(x, axis, scatter_dimension=dim,
    tiled=True)``). ``dim``'s size must divide by W. Differentiable for SUM:
    the gradient is ``all_gather_dim`` of the output's."""
    import torch.distributed as dist

    dim = _dim("reduce_scatter_dim", tensor, dim)
    if op is None:
        op = dist.ReduceOp.SUM
    if op != dist.ReduceOp.SUM and torch.is_grad_enabled() and tensor.requires_grad:
        raise ValueError("torch.tpu.ops.reduce_scatter_dim: only a SUM reduction is differentiable")
    return _ReduceScatterDim.apply(tensor, dim, op, group)


def sparse_gather(table: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``table[indices]``: the rows of a 2-D table at integer ``indices`` of
    any shape (result: ``indices.shape + (table.shape[1],)``), gathered on
    the device's SparseCore queue in the current stream's order, as the
    embedding ops are. Differentiable in ``table`` (its gradient adds each
    row's grads, on the same queue). Indices are checked on the device
    first (one read back; ``set_validate_inputs(False)`` skips it): one
    outside the table raises ValueError naming its position and value."""
    op = "sparse_gather"
    _tensor(op, "table", table)
    _tensor(op, "indices", indices, table.device)
    if table.device.type != "tpu":
        raise ValueError(f"torch.tpu.ops.{op}: table must be on a tpu device, got {table.device}")
    if table.dim() != 2:
        raise ValueError(f"torch.tpu.ops.{op}: table must be 2-D, got {tuple(table.shape)}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"torch.tpu.ops.{op}: indices must be int32 or int64, got {indices.dtype}")
    rows = table.shape[0]
    if _validate and indices.numel():
        flat = indices.reshape(-1)
        bad = (flat < 0) | (flat >= rows)
        if bool(bad.any()):
            pos = int(bad.nonzero()[0, 0])
            value = int(flat[pos])
            raise ValueError(f"torch.tpu.ops.{op}: index {value} at position {pos} is outside the table's {rows} rows")
    (out,) = _on_sparse_queue(table.device, [table, indices], lambda: [torch.nn.functional.embedding(indices, table)])
    return out


def optimization_barrier(*tensors):
    """The tensors, unchanged (one tensor for one argument, else a tuple),
    with no op moved or fused across this point, as
    ``lax.optimization_barrier``: under DEFER_AND_FUSE what each of their
    devices' current streams has recorded so far is launched here as its
    own program (without waiting), so the ops before and after never share
    one; in the other modes every op is its own program already. Inside
    ``torch.compile`` it breaks the graph, with the same effect."""
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"torch.tpu.ops.optimization_barrier takes tensors, got {type(t).__name__}")
    for d in sorted({t.device.index or 0 for t in tensors if t.device.type == "tpu"}):
        torch.tpu.mark_step(d)
    return tensors[0] if len(tensors) == 1 else tensors


def _splash_mask(q_len, kv_len, causal, window_size, segment_ids, kv_segment_ids, device):
    """The allowed (query, key) pairs as a bool [B or 1, 1, S, T], or None
    when every pair is allowed."""
    mask = None
    i = torch.arange(q_len, device=device).reshape(-1, 1)
    j = torch.arange(kv_len, device=device).reshape(1, -1)

    def both(m, extra):
        return extra if m is None else m & extra

    if causal:
        mask = both(mask, j <= i)
    if window_size is not None:
        left, right = window_size
        if left is not None:
            mask = both(mask, j >= i - int(left))
        if right is not None:
            mask = both(mask, j <= i + int(right))
    if mask is not None:
        mask = mask.reshape(1, 1, q_len, kv_len)
    if segment_ids is not None:
        kv = segment_ids if kv_segment_ids is None else kv_segment_ids
        same = segment_ids.unsqueeze(-1) == kv.unsqueeze(-2)  # [B, S, T]
        mask = both(mask, same.unsqueeze(1))
    return mask


def splash_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    causal: bool = False,
    window_size=None,
    segment_ids: Optional[torch.Tensor] = None,
    kv_segment_ids: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    logits_soft_cap: Optional[float] = None,
) -> torch.Tensor:
    """Attention with the masks of JAX's splash attention kernels:
    ``query`` [B, H, S, D], ``key`` and ``value`` [B, Hkv, T, D] (H a
    multiple of Hkv: grouped-query attention). Query i may attend to key j
    when every given mask allows it: ``causal`` (j <= i, torch's
    ``is_causal`` alignment), a local ``window_size=(left, right)`` (i -
    left <= j <= i + right; None leaves that side open), and
    ``segment_ids`` [B, S] with ``kv_segment_ids`` [B, T] (the same ids
    unless given: packed sequences attend within their segment).
    ``logits_soft_cap`` c bounds the logits to c * tanh(logits / c) before
    the softmax (Gemma 2's). A query with no allowed key gets zeros.
    Runs ``scaled_dot_product_attention`` (the runtime's attention op with
    no mask; torch's math over native kernels with one), or, with a soft
    cap, the same math with the cap; differentiable; on any device."""
    op = "splash_sdpa"
    for name, t in (("query", query), ("key", key), ("value", value)):
        _tensor(op, name, t)
        if t.dim() != 4:
            raise ValueError(f"torch.tpu.ops.{op}: {name} must be [batch, heads, length, dim], got {tuple(t.shape)}")
    b, h, s, d = query.shape
    hkv, t_len = key.shape[1], key.shape[2]
    if value.shape[:3] != key.shape[:3] or key.shape[0] != b or key.shape[3] != d or h % hkv:
        raise ValueError(
            f"torch.tpu.ops.{op}: query {tuple(query.shape)}, key {tuple(key.shape)} and value "
            f"{tuple(value.shape)} do not fit [B, H, S, D], [B, Hkv, T, D] with H a multiple of Hkv"
        )
    if window_size is not None and (not isinstance(window_size, (tuple, list)) or len(window_size) != 2):
        raise ValueError(f"torch.tpu.ops.{op}: window_size must be (left, right), got {window_size!r}")
    for name, ids, length in (("segment_ids", segment_ids, s), ("kv_segment_ids", kv_segment_ids, t_len)):
        if ids is not None and (not isinstance(ids, torch.Tensor) or tuple(ids.shape) != (b, length)):
            raise ValueError(
                f"torch.tpu.ops.{op}: {name} must be a [{b}, {length}] tensor, got "
                f"{tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__}"
            )
    if kv_segment_ids is not None and segment_ids is None:
        raise ValueError(f"torch.tpu.ops.{op}: kv_segment_ids needs segment_ids")
    if segment_ids is not None and kv_segment_ids is None and s != t_len:
        raise ValueError(f"torch.tpu.ops.{op}: query and key lengths differ ({s}, {t_len}): give kv_segment_ids")
    mask = _splash_mask(s, t_len, causal, window_size, segment_ids, kv_segment_ids, query.device)
    scale = 1.0 / (d**0.5) if scale is None else float(scale)
    if logits_soft_cap is None:
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scale, enable_gqa=hkv != h
        )
    else:
        cap = float(logits_soft_cap)
        if hkv != h:
            key = key.repeat_interleave(h // hkv, dim=1)
            value = value.repeat_interleave(h // hkv, dim=1)
        logits = torch.matmul(query, key.transpose(-2, -1)) * scale
        logits = torch.tanh(logits / cap) * cap
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        out = torch.matmul(torch.softmax(logits, dim=-1), value)
    if mask is not None:
        # Rows with no allowed key: zeros (softmax over nothing).
        out = out.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    return out
