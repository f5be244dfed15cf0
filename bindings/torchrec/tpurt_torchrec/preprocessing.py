"""SparseCore input preprocessing for tpurt: the backend that TorchRec's
``SparseCoreInputPreprocessor`` drives
(``torchrec.experimental.torch_tpu.datasets.pybind_input_preprocessing``).

TorchRec ships the Python side of its SparseCore path; the preprocessing
backend is a C++ extension that is not in the open-source package. This is
ours, written for the CSR layout that tpurt's ``torch.tpu.ops`` read (see
``tpurt.ops``), and installed under TorchRec's module name by
``import tpurt_torchrec``. It runs on the CPU, in the input pipeline, with
torch's vectorized CPU ops.

For each stacked table it turns the features' ids and offsets into four
tensors:

- each id becomes an entry with its row in the stacked, sharded table on the
  device (the layout of TorchRec's ``stack_and_shard_tables``: each table
  padded to a multiple of ``8 * sparse_cores`` rows and split into one
  contiguous chunk per SparseCore, rotated by the table's shard rotation,
  the tables' chunks side by side in each SparseCore's part);
- its sample is the row of the stacked activations that TorchRec unstacks
  (``[sparse_cores, features, batch / sparse_cores, dim]``);
- its gain is 1 for sum pooling and 1 / (bag length) for mean;
- entries are grouped into partitions (the sample's SparseCore by the
  row's SparseCore), in input order within each, and ``row_pointers``
  holds each partition's end. A partition keeps at most
  ``max_ids_per_partition`` ids and ``max_unique_ids_per_partition``
  distinct ids: beyond those, ids are dropped and counted when
  ``allow_id_dropping`` is set, and are an error otherwise;
- the arrays are padded to a fixed size per stack (the suggested COO buffer
  size, or partitions x max_ids_per_partition, rounded up to 8), so a
  training loop compiles each device op once.

Bad input (an id outside its table, a negative bag length, offsets that do
not start at 0 or run past the ids, more bags than the batch) raises
ValueError naming the stacked table, the feature and the position, before
anything reaches the device.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch

__all__ = ["SparseCorePreprocessorBackend"]


def _round_up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


def _device_sparse_cores() -> int:
    """The current tpu device's SparseCores per chip (tpurt.ops.sparse_cores)."""
    if not torch.tpu.is_available():
        return 1
    return torch.tpu.ops.sparse_cores(torch.tpu.current_device())


class _Feature:
    def __init__(self, stack: str, index: int, meta: Dict[str, Any], nsc: int) -> None:
        self.stack = stack
        self.index = index
        self.name = str(meta["name"])
        self.batch = int(meta["batch_size"])
        self.combiner = str(meta["combiner"])
        if self.combiner not in ("sum", "mean"):
            raise ValueError(
                f"SparseCore preprocessing: feature {self.name!r} of table stack {stack!r}: "
                f"combiner {self.combiner!r}; use 'sum' or 'mean'"
            )
        self.rows = int(meta["max_col_id"])
        self.chunk = _round_up(self.rows, 8 * nsc) // nsc
        col_offset = int(meta["col_offset"])
        if col_offset % nsc:
            raise ValueError(
                f"SparseCore preprocessing: feature {self.name!r}: col_offset {col_offset} "
                f"is not a multiple of the {nsc} SparseCores"
            )
        self.offset_in_shard = col_offset // nsc
        self.rotation = int(meta["col_shift"]) % nsc
        if self.batch % nsc:
            raise ValueError(
                f"SparseCore preprocessing: feature {self.name!r}: batch size {self.batch} "
                f"is not divisible by the {nsc} SparseCores"
            )

    def where(self, msg: str) -> str:
        return f"SparseCore preprocessing: table stack {self.stack!r}, feature {self.name!r}: {msg}"


class _Stack:
    def __init__(self, meta: Dict[str, Any], nsc: int) -> None:
        self.name = str(meta["name"])
        self.max_ids = int(meta["max_ids_per_partition"])
        self.max_unique = int(meta["max_unique_ids_per_partition"])
        if self.max_ids <= 0 or self.max_unique <= 0:
            raise ValueError(
                f"SparseCore preprocessing: table stack {self.name!r}: max_ids_per_partition "
                f"({self.max_ids}) and max_unique_ids_per_partition ({self.max_unique}) must be positive"
            )
        self.features = [_Feature(self.name, i, f, nsc) for i, f in enumerate(meta["features"])]
        if not self.features:
            raise ValueError(f"SparseCore preprocessing: table stack {self.name!r} has no features")
        if len({f.batch for f in self.features}) != 1:
            raise ValueError(
                f"SparseCore preprocessing: table stack {self.name!r}: its features have different "
                f"batch sizes {sorted({f.batch for f in self.features})}"
            )
        self.batch = self.features[0].batch
        # Rows of each SparseCore's part of the stacked table.
        self.rows_per_sc = max(f.offset_in_shard + f.chunk for f in self.features)
        self.partitions = nsc * nsc
        coo = int(meta.get("suggested_coo_buffer_size_per_device") or 0)
        self.size = _round_up(coo if coo > 0 else self.partitions * self.max_ids, 8)


class SparseCorePreprocessorBackend:
    """What TorchRec's ``SparseCoreInputPreprocessor`` constructs and calls:
    ``SparseCorePreprocessorBackend(tables_metadata, batch_size,
    local_device_count, global_device_count, num_sc_per_device,
    allow_id_dropping)`` and ``preprocess(input_indices, input_offsets)``.
    """

    #: Check that num_sc_per_device is the device's SparseCore count (the
    #: activations' layout depends on it; torch.tpu.ops unstacks by the
    #: device's count). Tests of other counts turn it off.
    check_device = True

    def __init__(
        self,
        tables_metadata: List[Dict[str, Any]],
        batch_size: int,
        local_device_count: int,
        global_device_count: int,
        num_sc_per_device: int,
        allow_id_dropping: bool,
    ) -> None:
        if local_device_count != 1 or global_device_count != 1:
            raise ValueError(
                "SparseCore preprocessing on tpurt: one device per process "
                f"(got local_device_count={local_device_count}, global_device_count={global_device_count}); "
                "tables sharded over several devices are not supported yet"
            )
        nsc = int(num_sc_per_device)
        if nsc <= 0:
            raise ValueError(f"SparseCore preprocessing: num_sc_per_device must be positive, got {nsc}")
        if self.check_device:
            have = _device_sparse_cores()
            if nsc != have:
                raise ValueError(
                    f"SparseCore preprocessing: num_sc_per_device={nsc}, but this tpu device has {have} "
                    f"SparseCore(s) per chip (torch.tpu.get_device_properties().sparse_cores); "
                    f"pass num_sc_per_device={have} to the preprocessor and the embedding module"
                )
        self.nsc = nsc
        self.batch_size = int(batch_size)
        self.allow_id_dropping = bool(allow_id_dropping)
        self.stacks = {s.name: s for s in (_Stack(m, nsc) for m in tables_metadata)}

    def preprocess(
        self,
        input_indices: Dict[str, List[torch.Tensor]],
        input_offsets: Dict[str, List[torch.Tensor]],
    ) -> Dict[str, Dict[str, torch.Tensor]]:
        out = {}
        for name, stack in self.stacks.items():
            if name not in input_indices or name not in input_offsets:
                raise ValueError(f"SparseCore preprocessing: no input for table stack {name!r}")
            ids, offs = input_indices[name], input_offsets[name]
            if len(ids) != len(stack.features) or len(offs) != len(stack.features):
                raise ValueError(
                    f"SparseCore preprocessing: table stack {name!r} has {len(stack.features)} features, "
                    f"got ids for {len(ids)} and offsets for {len(offs)}"
                )
            out[name] = self._stack(stack, ids, offs)
        return out

    def _entries(self, stack: _Stack, f: _Feature, ids: torch.Tensor, offsets: torch.Tensor):
        """(row, sample, gain, partition) of each of a feature's ids."""
        nsc = self.nsc
        ids = ids.reshape(-1).to(torch.int64)
        offsets = offsets.reshape(-1).to(torch.int64)
        bags = offsets.numel() - 1
        if bags < 0:
            raise ValueError(f.where("offsets must have at least one entry"))
        if bags > f.batch:
            raise ValueError(f.where(f"{bags} bags, more than the batch size {f.batch}"))
        if int(offsets[0]) != 0:
            raise ValueError(f.where(f"offsets must start at 0, got {int(offsets[0])}"))
        lengths = offsets[1:] - offsets[:-1]
        if bags and bool((lengths < 0).any()):
            b = int((lengths < 0).nonzero()[0, 0])
            raise ValueError(f.where(f"bag {b} has a negative length ({int(lengths[b])}): offsets decrease"))
        n = int(offsets[-1])
        if n > ids.numel():
            raise ValueError(f.where(f"the last offset ({n}) runs past the {ids.numel()} ids"))
        ids = ids[:n]
        bad = (ids < 0) | (ids >= f.rows)
        if bool(bad.any()):
            pos = int(bad.nonzero()[0, 0])
            raise ValueError(f.where(f"id {int(ids[pos])} at position {pos} is outside the table's {f.rows} rows"))
        sample = torch.repeat_interleave(torch.arange(bags, dtype=torch.int64), lengths)
        if f.combiner == "mean":
            gain = (1.0 / lengths.clamp(min=1).to(torch.float32))[sample]
        else:
            gain = torch.ones(n, dtype=torch.float32)
        per_sc = f.batch // nsc
        sc_sample = sample // per_sc
        act_row = sc_sample * (len(stack.features) * per_sc) + f.index * per_sc + sample % per_sc
        sc_row = (ids // f.chunk + f.rotation) % nsc
        row = sc_row * stack.rows_per_sc + f.offset_in_shard + ids % f.chunk
        return row, act_row, gain, sc_sample * nsc + sc_row

    def _stack(self, stack: _Stack, ids: List[torch.Tensor], offs: List[torch.Tensor]) -> Dict[str, torch.Tensor]:
        parts = [self._entries(stack, f, i, o) for f, i, o in zip(stack.features, ids, offs)]
        row = torch.cat([p[0] for p in parts])
        sample = torch.cat([p[1] for p in parts])
        gain = torch.cat([p[2] for p in parts])
        part = torch.cat([p[3] for p in parts])
        # Group by partition, input order kept within each.
        part, order = torch.sort(part, stable=True)
        row, sample, gain = row[order], sample[order], gain[order]
        counts = torch.bincount(part, minlength=stack.partitions)
        starts = torch.cumsum(counts, 0) - counts
        pos = torch.arange(part.numel()) - starts[part]
        keep = pos < stack.max_ids
        # Distinct ids per partition, by first appearance.
        unique_counts = torch.zeros(stack.partitions, dtype=torch.int64)
        for p in torch.unique(part).tolist():
            sel = (part == p).nonzero().reshape(-1)
            uniq, inverse = torch.unique(row[sel], return_inverse=True)
            unique_counts[p] = uniq.numel()
            if uniq.numel() > stack.max_unique:
                first = torch.full((uniq.numel(),), sel.numel(), dtype=torch.int64)
                first.scatter_reduce_(0, inverse, torch.arange(sel.numel()), reduce="amin")
                rank = torch.empty_like(first)
                rank[torch.argsort(first)] = torch.arange(uniq.numel())
                keep[sel] &= rank[inverse] < stack.max_unique
        dropped = int((~keep).sum())
        if dropped and not self.allow_id_dropping:
            p = int(part[~keep][0])
            raise ValueError(
                f"SparseCore preprocessing: table stack {stack.name!r}: partition {p} has "
                f"{int(counts[p])} ids ({int(unique_counts[p])} distinct), more than "
                f"max_ids_per_partition={stack.max_ids} or max_unique_ids_per_partition={stack.max_unique}; "
                "raise them or pass allow_id_dropping=True"
            )
        row, sample, gain, part = row[keep], sample[keep], gain[keep], part[keep]
        kept = row.numel()
        if kept > stack.size:
            raise ValueError(
                f"SparseCore preprocessing: table stack {stack.name!r}: {kept} ids do not fit the COO buffer "
                f"of {stack.size} (suggested_coo_buffer_size_per_device); raise it"
            )
        ends = torch.cumsum(torch.bincount(part, minlength=stack.partitions), 0)
        pad = stack.size - kept
        z = torch.zeros(pad, dtype=torch.int64)
        return {
            "row_pointers": ends.to(torch.int32),
            "embedding_ids": torch.cat([row, z]).to(torch.int32),
            "sample_ids": torch.cat([sample, z]).to(torch.int32),
            "gains": torch.cat([gain, torch.zeros(pad, dtype=torch.float32)]),
            "dropped_count": torch.tensor(dropped),
            "observed_max_ids": torch.tensor(int(counts.max()) if counts.numel() else 0),
            "observed_max_unique_ids": torch.tensor(int(unique_counts.max()) if unique_counts.numel() else 0),
        }
