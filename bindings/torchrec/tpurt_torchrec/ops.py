"""tpu kernels for the ``torchrec::`` embedding ops of TorchRec's TPU path.

TorchRec defines these ops (``torchrec/experimental/torch_tpu/pallas/ops.py``)
with CPU kernels and their autograd; on TorchTPU, Pallas kernels serve them.
Here each is written once from tpu ops with native kernels (index_select,
index_add, cumsum), so the lookups and their gradients stay on the device:

- bags from offsets: a position's bag is the number of bag starts at or
  before it, less one (a cumulative sum of start marks), so no
  ``repeat_interleave`` with host-side lengths is needed;
- a forward lookup by offsets reads its checks back to the host once: that
  the offsets start at 0, do not run past the ids and never decrease, that
  every active id lies in its table, and how many ids are active (TorchRec
  pads ids to bucket sizes); a backward reads the offsets' ends once.

An id outside its table is an error naming the op, the id and its
position, on every platform, never a read out of bounds.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

import tpurt

# TorchRec's definitions (torch only; the Pallas kernels need jax, which
# an OSS install lacks and which is not used here).
from torchrec.experimental.torch_tpu.pallas import ops as _torchrec_ops

assert _torchrec_ops.lib is not None and tpurt.tpu is not None

_lib = torch.library.Library("torchrec", "IMPL")
_REGISTERED: List[str] = []


def _impl(name: str):
    def wrap(fn):
        _lib.impl(name, fn, "PrivateUse1")
        _REGISTERED.append(name)
        return fn

    return wrap


def registered_ops() -> List[str]:
    """The ``torchrec::`` ops with a tpu kernel from this package."""
    return list(_REGISTERED)


def _active(op: str, indices: torch.Tensor, offsets: torch.Tensor) -> int:
    """How many ids the bags cover; checks the offsets against the ids."""
    if offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError(f"torchrec::{op}: offsets must be 1-D with at least one entry, got {tuple(offsets.shape)}")
    first, last = offsets[[0, -1]].tolist()
    if first != 0:
        raise ValueError(f"torchrec::{op}: offsets must start at 0, got {first}")
    if not 0 <= last <= indices.numel():
        raise ValueError(
            f"torchrec::{op}: the last offset ({last}) must lie in 0..{indices.numel()} (the number of ids)"
        )
    return int(last)


def _bag_of(offsets: torch.Tensor, n: int) -> torch.Tensor:
    """The bag of each of the first `n` ids (int64, on the offsets' device).
    Bag starts are clamped into 0..n and bags into 0..bags-1, so offsets not
    yet checked cannot index out of range (for checked ones it changes
    nothing)."""
    bags = offsets.numel() - 1
    marks = torch.zeros(n + 1, dtype=torch.int64, device=offsets.device)
    if bags > 1:
        starts = offsets[1:bags].long().clamp(0, n)
        marks.index_add_(0, starts, torch.ones_like(starts))
    return marks[:n].cumsum(0).clamp(max=max(bags - 1, 0))


def _check_ids(op: str, ids: torch.Tensor, rows: int) -> None:
    """Every id inside its table, else an error naming the first bad one and
    its position. (The host platform's kernels check too; XLA's gather
    clamps an index instead, so the check is made here, on every platform.)"""
    if ids.numel() == 0:
        return
    ids = ids.reshape(-1)
    bad = (ids < 0) | (ids >= rows)
    if bool(bad.any()):
        pos = int(bad.nonzero()[0, 0])
        raise IndexError(
            f"torchrec::{op}: id {int(ids[pos])} at position {pos} is outside the table's {rows} rows"
        )


def _checked_bags(op: str, indices: torch.Tensor, offsets: torch.Tensor, rows: int,
                  row_offsets: Optional[torch.Tensor] = None) -> Tuple[int, torch.Tensor, torch.Tensor]:
    """(n, the bag of each of the first n ids, each one's table row) after
    checking, with one read back to the host: that the offsets start at 0,
    end within the ids and never decrease, and that every active id's row
    (the id, plus its bag's row offset when given) lies inside the table."""
    if offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError(f"torchrec::{op}: offsets must be 1-D with at least one entry, got {tuple(offsets.shape)}")
    dev = offsets.device
    m, bags = indices.numel(), offsets.numel() - 1
    offs = offsets.long()
    bag = _bag_of(offsets, m)  # every position's bag, then its row
    row = indices.reshape(-1).long()
    if row_offsets is not None and bags > 0:
        row = row + row_offsets.long().index_select(0, bag)
    pos = torch.arange(m, device=dev)
    active = pos < offs[-1].clamp(0, m)
    bad = active & ((row < 0) | (row >= rows))
    first_bad = torch.where(bad, pos, m).amin() if m else torch.tensor(0, device=dev)
    value = row.index_select(0, first_bad.clamp(max=max(m - 1, 0)).reshape(1)).reshape(()) if m else first_bad
    decreasing = (offs[1:] < offs[:-1]).any() if bags > 0 else torch.tensor(False, device=dev)
    first, last, dec, at, v = torch.stack([offs[0], offs[-1], decreasing.long(), first_bad, value]).tolist()
    if first != 0:
        raise ValueError(f"torchrec::{op}: offsets must start at 0, got {first}")
    if not 0 <= last <= m:
        raise ValueError(f"torchrec::{op}: the last offset ({last}) must lie in 0..{m} (the number of ids)")
    if dec:
        raise ValueError(f"torchrec::{op}: offsets must not decrease (a bag of negative length)")
    if at < m:
        raise IndexError(f"torchrec::{op}: id {v} at position {at} is outside the table's {rows} rows")
    return last, bag[:last], row[:last]


@_impl("embedding_lookup")
def embedding_lookup(indices: torch.Tensor, weights: torch.Tensor, emb_dim: int) -> torch.Tensor:
    _check_ids("embedding_lookup", indices, weights.shape[0])
    return weights.index_select(0, indices.reshape(-1).long()).reshape(*indices.shape, weights.shape[1])


@_impl("embedding_lookup_backward")
def embedding_lookup_backward(grad_out: torch.Tensor, indices: torch.Tensor, num_rows: int, emb_dim: int):
    g = grad_out.reshape(-1, emb_dim)
    return g.new_zeros((num_rows, emb_dim)).index_add_(0, indices.reshape(-1).long(), g)


@_impl("embedding_pooled_lookup")
def embedding_pooled_lookup(idx: torch.Tensor, table: torch.Tensor, pool: int) -> torch.Tensor:
    if pool <= 0 or idx.numel() % pool:
        raise ValueError(f"torchrec::embedding_pooled_lookup: {idx.numel()} ids do not split into bags of {pool}")
    _check_ids("embedding_pooled_lookup", idx, table.shape[0])
    rows = table.index_select(0, idx.reshape(-1).long())
    return rows.reshape(-1, pool, table.shape[1]).sum(dim=1)


@_impl("embedding_pooled_lookup_backward")
def embedding_pooled_lookup_backward(grad_out, idx, pool: int, num_rows: int, emb_dim: int):
    g = grad_out.unsqueeze(1).expand(-1, pool, emb_dim).reshape(-1, emb_dim)
    return grad_out.new_zeros((num_rows, emb_dim)).index_add_(0, idx.reshape(-1).long(), g)


@_impl("embedding_pooled_lookup_offset")
def embedding_pooled_lookup_offset(indices, offsets, weights, emb_dim: int) -> torch.Tensor:
    _, bag, row = _checked_bags("embedding_pooled_lookup_offset", indices, offsets, weights.shape[0])
    rows = weights.index_select(0, row)
    return weights.new_zeros((offsets.numel() - 1, emb_dim)).index_add_(0, bag, rows)


@_impl("embedding_pooled_lookup_offset_backward")
def embedding_pooled_lookup_offset_backward(grad_out, indices, offsets, num_rows: int, emb_dim: int):
    n = _active("embedding_pooled_lookup_offset_backward", indices, offsets)
    bag = _bag_of(offsets, n)
    return grad_out.new_zeros((num_rows, emb_dim)).index_add_(0, indices[:n].long(), grad_out.index_select(0, bag))


@_impl("embedding_pooled_batched_lookup_offset")
def embedding_pooled_batched_lookup_offset(indices, offsets, weights, row_offsets, emb_dim: int):
    _, bag, rows = _checked_bags(
        "embedding_pooled_batched_lookup_offset", indices, offsets, weights.shape[0], row_offsets
    )
    return weights.new_zeros((offsets.numel() - 1, emb_dim)).index_add_(0, bag, weights.index_select(0, rows))


@_impl("embedding_pooled_batched_lookup_offset_backward")
def embedding_pooled_batched_lookup_offset_backward(grad_out, indices, offsets, row_offsets, num_rows: int,
                                                    emb_dim: int):
    n = _active("embedding_pooled_batched_lookup_offset_backward", indices, offsets)
    bag = _bag_of(offsets, n)
    rows = indices[:n].long() + row_offsets.long().index_select(0, bag)
    return grad_out.new_zeros((num_rows, emb_dim)).index_add_(0, rows, grad_out.index_select(0, bag))


def _permute_columns(offset_dim_list: torch.Tensor, permute_list: torch.Tensor, width: int) -> torch.Tensor:
    """The source column of each output column (computed on the host: the
    lists are a few entries of metadata)."""
    dims = offset_dim_list.cpu().long()
    perm = permute_list.cpu().long()
    sizes = dims[1:] - dims[:-1]
    if perm.numel() and (int(perm.min()) < 0 or int(perm.max()) >= sizes.numel()):
        raise ValueError(f"torchrec::permute_pooled_embs: permute_list names a block outside 0..{sizes.numel() - 1}")
    cols = [torch.arange(int(dims[p]), int(dims[p]) + int(sizes[p])) for p in perm.tolist()]
    out = torch.cat(cols) if cols else torch.zeros(0, dtype=torch.long)
    if out.numel() != width:
        raise ValueError(
            f"torchrec::permute_pooled_embs: the permuted blocks have {out.numel()} columns, the embeddings {width}"
        )
    return out


@_impl("permute_pooled_embs")
def permute_pooled_embs(pooled_embs, offset_dim_list, permute_list):
    cols = _permute_columns(offset_dim_list, permute_list, pooled_embs.shape[1]).to(pooled_embs.device)
    return pooled_embs.index_select(1, cols)


@_impl("permute_pooled_embs_backward")
def permute_pooled_embs_backward(grad_out, offset_dim_list, permute_list):
    cols = _permute_columns(offset_dim_list, permute_list, grad_out.shape[1]).to(grad_out.device)
    return grad_out.new_zeros(grad_out.shape).index_add_(1, cols, grad_out)
