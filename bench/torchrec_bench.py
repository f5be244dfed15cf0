"""TorchRec binding benchmarks (bindings/torchrec), each against its peer in
the same run: one JSON object per line (name, ours, peer, peer_name, unit,
ratio = peer / ours; above 1 means ours is faster).

    .venv/bin/python bench/torchrec_bench.py [NAME...] [--list]

The tables are those of examples/dlrm_train.py (8 tables, 9300 rows of 16,
1 to 4 ids per bag, mean pooling), batch 1024; ours runs on tpu (the
platform TPURT_PLATFORM names, host by default) with the tables stacked on
the SparseCores, the peer on the CPU with TorchRec's fbgemm tables
(FusedEmbeddingBagCollection). The inputs are made (and, for ours,
preprocessed into the CSR layout, on the CPU) before the clock starts, as
an input pipeline would have them ready; ours moves each batch's CSR to
the device inside the timed step, where the ops check it (the defaults).

- torchrec_lookup_fwd: the pooled lookups of a batch (ns per id looked up).
- torchrec_lookup_train: the lookups with their backward and fused Adagrad
  update (ns per id).
- torchrec_dlrm_step: a DLRM training step (examples/dlrm_train.py: dense
  arch, interaction, over arch, Adagrad), ms per step, batch 256.
- torchrec_sparse_dense_overlap: a batch's lookups on the SparseCore queue
  beside dense matmuls on the TensorCore (two streams, joined at the end),
  against the same work on one stream (ms per round).
"""

from __future__ import annotations

import os
import pathlib
import statistics
import sys
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import torch  # noqa: E402

import rows  # noqa: E402
from rows import chosen, row  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
import dlrm_train  # noqa: E402

FUSED_PEER = "TorchRec FusedEmbeddingBagCollection (fbgemm) on CPU"


def _median_time(fn, warmup: int = 5, reps: int = 30, rounds: int = 5) -> float:
    """Seconds per call: the median over rounds of reps calls each."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        out.append((time.perf_counter() - t0) / reps)
    return statistics.median(out)


def _lookup_setup(batch: int = 1024):
    cfg = dlrm_train.Config(batch=batch, batches=4)
    data = dlrm_train.ClickData(cfg)
    ours = dlrm_train.Trainer(cfg, data)
    peer = dlrm_train.Trainer(cfg, data, peer=True)
    ids = sum(int(b[1].values().numel()) for b in data.train) / len(data.train)
    return ours, peer, ids


def _fresh(tr, k: int):
    """Batch k's preprocessed input, moved to the device now (as a loader
    would each step; new tensors, so the ops check them)."""
    return tr._to_device(*tr.inputs[k % len(tr.inputs)])[1]


def _ebc(tr):
    return tr.model.sparse_arch.embedding_bag_collection


def _lookups(name: str, peer_name: str, train: bool) -> None:
    """ns per id of a batch's pooled lookups, with (train) their backward
    and fused Adagrad update (a sum of the pooled values as the loss)."""
    ours, peer, ids = _lookup_setup()
    p_in = [i[1] for i in peer.inputs]
    o_ebc, p_ebc = _ebc(ours), _ebc(peer)
    k = [0]

    def step(ebc, features):
        with torch.set_grad_enabled(train):
            out = ebc(features).values()
        if train:
            out.sum().backward()  # the fused update runs in the backward
        return out

    def run_ours():
        k[0] += 1
        step(o_ebc, _fresh(ours, k[0]))
        torch.tpu.synchronize()

    def run_peer():
        k[0] += 1
        step(p_ebc, p_in[k[0] % len(p_in)])

    row(name, _median_time(run_ours) / ids * 1e9, _median_time(run_peer) / ids * 1e9, peer_name, "ns/id")


def lookup_fwd() -> None:
    _lookups("torchrec_lookup_fwd", FUSED_PEER, train=False)


def lookup_train() -> None:
    _lookups("torchrec_lookup_train", FUSED_PEER + ", fused Adagrad", train=True)


def dlrm_step() -> None:
    cfg = dlrm_train.Config(batch=256, batches=16)
    data = dlrm_train.ClickData(cfg)
    ours = dlrm_train.Trainer(cfg, data)
    peer = dlrm_train.Trainer(cfg, data, peer=True)
    k = [0]

    def step(tr):
        k[0] += 1
        float(tr.step(k[0]))  # the loss read back: the step is done

    row("torchrec_dlrm_step", _median_time(lambda: step(ours), reps=10) * 1e3,
        _median_time(lambda: step(peer), reps=10) * 1e3,
        "the same DLRM on CPU (fbgemm tables, torch CPU eager)", "ms/step")


def sparse_dense_overlap() -> None:
    ours, _, _ = _lookup_setup()
    ebc = _ebc(ours)
    stack = ebc.stacked_configs[0]
    t = ours._to_device(*ours.inputs[0])[1].table_tensors[stack.stack_name]
    table = ebc.table_weights[stack.stack_name].detach()
    batch = ours.cfg.batch * stack.total_features
    dev = table.device
    x = torch.randn(256, 256, device=dev)
    w = torch.randn(256, 256, device=dev)
    sc = torch.tpu.Stream(dev, core="sparse")
    tc = torch.tpu.current_stream(dev)

    def lookups():
        for _ in range(4):
            torch.tpu.ops.sparse_dense_matmul(t.row_pointers, t.embedding_ids, t.sample_ids, t.gains, table, batch)

    def dense():
        y = x
        for _ in range(12):
            y = torch.tanh(y @ w)
        return y

    def serial():
        lookups()
        dense()
        torch.tpu.synchronize(dev)

    def overlapped():
        sc.wait_stream(tc)
        with torch.tpu.stream(sc):
            lookups()
        dense()
        tc.wait_stream(sc)
        torch.tpu.synchronize(dev)

    row("torchrec_sparse_dense_overlap", _median_time(overlapped, reps=10) * 1e3,
        _median_time(serial, reps=10) * 1e3, "the same work on one stream", "ms/round")


BENCHES = {
    "torchrec_lookup_fwd": lookup_fwd,
    "torchrec_lookup_train": lookup_train,
    "torchrec_dlrm_step": dlrm_step,
    "torchrec_sparse_dense_overlap": sparse_dense_overlap,
}


def main() -> None:
    names = chosen(BENCHES, sys.argv[1:])
    if names is None:
        return
    assert rows.row is row
    for name in names:
        BENCHES[name]()


if __name__ == "__main__":
    main()
