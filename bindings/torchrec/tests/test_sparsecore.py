"""TorchRec's SparseCore path on tpu: SparseCoreInputPreprocessor (with
tpurt's backend) and SparseCoreFusedEmbeddingBagCollection, whose
torchrec_torch_tpu::sparse_dense_matmul_* ops run torch.tpu.ops.

- the forward equals TorchRec's EmbeddingBagCollection on CPU (fbgemm) for
  sum and mean pooling, with the module's own unstacked weights;
- the tables after N training steps equal a CPU run of the same optimizer
  on the rows looked up (SGD and Adagrad as torch.optim's; Adam lazy,
  without bias correction, as the fused op defines it);
- the preprocessing's layout for 2 SparseCores (rotated shards, interleaved
  activations) matches TorchRec's stack_and_shard_tables and unstacking;
- bad input is an error naming the table stack, the feature and the
  position; capacity overflow drops and counts, or raises.
"""

import pytest
import torch

import tpurt_torchrec  # noqa: F401  (installs the backend; registers tpu)
from torchrec.experimental.torch_tpu.datasets.input_preprocessing import SparseCoreInputPreprocessor
from torchrec.experimental.torch_tpu.modules import SparseCoreFusedEmbeddingBagCollection
from torchrec.experimental.torch_tpu.modules import table_stacking
from torchrec.experimental.torch_tpu.modules.embedding_configs import SparseCoreEmbeddingConfig
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from tpurt_torchrec import preprocessing

B = 8
TPU = torch.device("tpu")



def _configs(pooling=PoolingType.SUM):
    return [
        EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=50, feature_names=["f0", "f1"], pooling=pooling),
        EmbeddingBagConfig(name="t1", embedding_dim=8, num_embeddings=30, feature_names=["f2"], pooling=pooling),
    ]


ROWS = {"f0": 50, "f1": 50, "f2": 30}


def _kjt(seed: int, max_len: int = 4) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    keys = list(ROWS)
    lengths = torch.randint(0, max_len, (len(keys) * B,), generator=g)
    vals = [
        torch.randint(0, ROWS[k], (int(lengths[i * B : (i + 1) * B].sum()),), generator=g)
        for i, k in enumerate(keys)
    ]
    return KeyedJaggedTensor(keys=keys, values=torch.cat(vals), lengths=lengths)


def _module(cfgs, opt, kwargs, nsc=1):
    sc = [SparseCoreEmbeddingConfig(config=c) for c in cfgs]
    m = SparseCoreFusedEmbeddingBagCollection(sc, opt, kwargs, batch_size=B, num_sc_per_device=nsc)
    return m, SparseCoreInputPreprocessor(sc, batch_size=B, num_sc_per_device=nsc)


def _cpu_ebc(cfgs, weights):
    ebc = EmbeddingBagCollection(cfgs)
    with torch.no_grad():
        for name, w in weights.items():
            ebc.embedding_bags[name].weight.copy_(w.cpu())
    return ebc


@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
def test_forward_equals_torchrec_on_cpu(pooling):
    torch.manual_seed(0)
    cfgs = _configs(pooling)
    m, pre = _module(cfgs, torch.optim.SGD, {"lr": 0.1})
    ebc = _cpu_ebc(cfgs, m.get_unstacked_table_weights())
    for seed in range(3):
        kjt = _kjt(seed)
        out = m(pre(kjt).to(TPU))
        ref = ebc(kjt)
        assert out.keys() == ref.keys()
        torch.testing.assert_close(out.values().detach().cpu(), ref.values().detach(), rtol=1e-5, atol=1e-6)


def _lazy_adam(w, m, v, g, rows, lr, b1, b2, eps):
    m[rows] = b1 * m[rows] + (1 - b1) * g[rows]
    v[rows] = b2 * v[rows] + (1 - b2) * g[rows] ** 2
    w[rows] -= lr * m[rows] / (v[rows].sqrt() + eps)


@pytest.mark.parametrize("opt", ["sgd", "adagrad", "adam"])
def test_training_steps_match_a_cpu_run(opt):
    torch.manual_seed(1)
    cfgs = _configs(PoolingType.MEAN)
    lr, eps, b1, b2 = 0.05, 1e-8, 0.8, 0.95
    cls, kwargs = {
        "sgd": (torch.optim.SGD, {"lr": lr}),
        "adagrad": (torch.optim.Adagrad, {"lr": lr, "eps": eps}),
        "adam": (torch.optim.Adam, {"lr": lr, "eps": eps, "betas": (b1, b2)}),
    }[opt]
    m, pre = _module(cfgs, cls, kwargs)
    ebc = _cpu_ebc(cfgs, m.get_unstacked_table_weights())
    params = {n: ebc.embedding_bags[n].weight for n in ("t0", "t1")}
    cpu_opt = None
    if opt in ("sgd", "adagrad"):
        cpu_opt = cls(list(params.values()), **kwargs)
    state = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in params.items()}
    target = torch.randn(B, 24)
    for step in range(4):
        kjt = _kjt(10 + step)
        out = m(pre(kjt).to(TPU))
        loss = ((out.values() - target.to(TPU)) ** 2).sum()
        loss.backward()
        # CPU reference.
        ref = ebc(kjt)
        ref_loss = ((ref.values() - target) ** 2).sum()
        torch.testing.assert_close(loss.detach().cpu(), ref_loss.detach(), rtol=1e-4, atol=1e-5)
        if cpu_opt is not None:
            cpu_opt.zero_grad()
            ref_loss.backward()
            cpu_opt.step()
        else:
            grads = torch.autograd.grad(ref_loss, list(params.values()))
            d = kjt.to_dict()
            with torch.no_grad():
                for (n, p), g in zip(params.items(), grads):
                    feats = ["f0", "f1"] if n == "t0" else ["f2"]
                    rows = torch.unique(torch.cat([d[f].values() for f in feats]))
                    _lazy_adam(p, *state[n], g, rows, lr, b1, b2, eps)
    got = m.get_unstacked_table_weights()
    for n, p in params.items():
        torch.testing.assert_close(got[n].detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5)


def test_two_sparse_cores_layout_matches_torchrec_stacking(monkeypatch):
    """With 2 SparseCores (rotated shards, interleaved activations): the
    device op on the preprocessed input and the stacked table gives, after
    TorchRec's own unstacking, the CPU EmbeddingBagCollection's output."""
    torch.manual_seed(2)
    cfgs = _configs(PoolingType.SUM)
    sc = [SparseCoreEmbeddingConfig(config=c) for c in cfgs]
    stacked = table_stacking.prepare_tables_for_stacking(sc, global_device_count=1, num_sc_per_device=2)
    weights = {c.name: torch.randn(c.num_embeddings, c.embedding_dim) for c in cfgs}
    tables = table_stacking.stack_and_shard_tables(weights, stacked, global_device_count=1, num_sc_per_device=2)

    class Backend(preprocessing.SparseCorePreprocessorBackend):
        check_device = False  # this device has 1 SparseCore

    monkeypatch.setattr(preprocessing, "SparseCorePreprocessorBackend", Backend)
    pre = SparseCoreInputPreprocessor(sc, batch_size=B, num_sc_per_device=2)
    ebc = _cpu_ebc(cfgs, weights)
    kjt = _kjt(5)
    ref = ebc(kjt).to_dict()
    inputs = pre(kjt)
    for s in stacked:
        t = inputs.table_tensors[s.stack_name]
        nf = s.total_features
        out = torch.tpu.ops.sparse_dense_matmul(
            t.row_pointers.to(TPU), t.embedding_ids.to(TPU), t.sample_ids.to(TPU), t.gains.to(TPU),
            tables[s.stack_name].to(TPU), B * nf,
        ).cpu()
        per_feat = out.view(2, nf, B // 2, -1).transpose(0, 1).reshape(nf, B, -1)
        for i, f in enumerate(s.feature_names):
            torch.testing.assert_close(per_feat[i], ref[f], rtol=1e-5, atol=1e-6)
        assert t.row_pointers.numel() == 4  # (sample SparseCore, row SparseCore) pairs


def test_bad_input_names_the_stack_feature_and_position():
    m, pre = _module(_configs(), torch.optim.SGD, {"lr": 0.1})
    kjt = _kjt(0)
    d = kjt.to_dict()
    vals = d["f2"].values().clone()
    vals[1] = 30
    bad = KeyedJaggedTensor.from_jt_dict({"f0": d["f0"], "f1": d["f1"], "f2": type(d["f2"])(values=vals, lengths=d["f2"].lengths())})
    with pytest.raises(ValueError, match=r"table stack 't1', feature 'f2': id 30 at position 1 is outside the table's 30 rows"):
        pre(bad)
    backend = pre._backend
    stack = backend.stacks["t0"]
    ids = [torch.tensor([1, 2, 3]), torch.tensor([4])]
    with pytest.raises(ValueError, match=r"feature 'f0': bag 1 has a negative length"):
        backend.preprocess({"t0": ids, "t1": [torch.tensor([0])]},
                           {"t0": [torch.tensor([0, 2, 1, 3]), torch.tensor([0, 1])], "t1": [torch.tensor([0, 1])]})
    with pytest.raises(ValueError, match=r"feature 'f1': the last offset \(2\) runs past the 1 ids"):
        backend.preprocess({"t0": ids, "t1": [torch.tensor([0])]},
                           {"t0": [torch.tensor([0, 3]), torch.tensor([0, 2])], "t1": [torch.tensor([0, 1])]})
    with pytest.raises(ValueError, match=r"feature 'f0': offsets must start at 0"):
        backend.preprocess({"t0": ids, "t1": [torch.tensor([0])]},
                           {"t0": [torch.tensor([1, 3]), torch.tensor([0, 1])], "t1": [torch.tensor([0, 1])]})
    assert stack.size == 256  # one partition of max_ids_per_partition, padded
    # The device op refuses the same id, checked on the device.
    t = pre(kjt).table_tensors["t1"]
    ids_dev = t.embedding_ids.clone()
    ids_dev[0] = 10_000
    with pytest.raises(ValueError, match=r"embedding id 10000 at position 0 is outside the table's 32 rows"):
        torch.tpu.ops.sparse_dense_matmul(
            t.row_pointers.to(TPU), ids_dev.to(TPU), t.sample_ids.to(TPU), t.gains.to(TPU),
            m.table_weights["t1"].detach(), B,
        )


def test_capacity_overflow_drops_and_counts_or_raises():
    cfg = [EmbeddingBagConfig(name="t", embedding_dim=8, num_embeddings=100, feature_names=["f"])]
    sc = [SparseCoreEmbeddingConfig(config=cfg[0], max_ids_per_partition=8, max_unique_ids_per_partition=4)]
    kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor([1, 2, 1, 3, 4, 5, 1, 6, 7, 8]),
                            lengths=torch.tensor([3, 3, 4, 0, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match=r"partition 0 has 10 ids \(8 distinct\)"):
        SparseCoreInputPreprocessor(sc, batch_size=B, num_sc_per_device=1)(kjt)
    pre = SparseCoreInputPreprocessor(sc, batch_size=B, num_sc_per_device=1, allow_id_dropping=True)
    t = pre(kjt).table_tensors["t"]
    # Kept: the first 8 ids, of which those among the first 4 distinct (1, 2, 3, 4).
    assert t.row_pointers.tolist() == [6]
    assert t.embedding_ids[:6].tolist() == [1, 2, 1, 3, 4, 1]
    assert t.stats.dropped_count == 4
    assert t.stats.observed_max_ids == 10 and t.stats.observed_max_unique_ids == 8


def test_a_device_with_other_sparse_core_counts_is_refused():
    with pytest.raises(ValueError, match=r"num_sc_per_device=2, but this tpu device has 1 SparseCore"):
        _module(_configs(), torch.optim.SGD, {"lr": 0.1}, nsc=2)[1]
