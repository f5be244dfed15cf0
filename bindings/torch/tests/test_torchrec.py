"""TorchRec's EmbeddingBagCollection with a KeyedJaggedTensor on tpu,
natively (the CPU fallback off), against the same module on the CPU
(TorchRec over fbgemm's CPU build): forward, gradients, and parameters
after a few SGD steps; plain and weighted features."""

import pytest
import torch

import torchrec  # installed by scripts/setup
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor


def _tables(pooling):
    return [
        EmbeddingBagConfig(name="t_user", embedding_dim=8, num_embeddings=40, feature_names=["user"],
                           pooling=pooling),
        EmbeddingBagConfig(name="t_item", embedding_dim=8, num_embeddings=25, feature_names=["item", "ctx"],
                           pooling=pooling),
    ]


def _kjt(step, device, weighted):
    g = torch.Generator().manual_seed(step)
    batch = 4
    lengths = torch.randint(0, 4, (3 * batch,), generator=g)
    lengths[1] = 0  # an empty bag
    n = int(lengths.sum())
    caps = torch.tensor([40] * batch + [25] * (2 * batch)).repeat_interleave(lengths)
    values = (torch.rand(n, generator=g) * caps).long()
    weights = torch.rand(n, generator=g) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["user", "item", "ctx"],
        values=values.to(device),
        lengths=lengths.to(device),
        weights=weights.to(device) if weighted else None,
    )


# Per-sample weights (weighted features) go with sum pooling.
@pytest.mark.parametrize("pooling,weighted", [("SUM", False), ("MEAN", False), ("SUM", True)],
                         ids=["sum", "mean", "weighted-sum"])
def test_ebc_trains_on_tpu_like_on_cpu(no_fallback, pooling, weighted):
    pool = getattr(torchrec.PoolingType, pooling)
    torch.manual_seed(0)
    cpu = EmbeddingBagCollection(tables=_tables(pool), is_weighted=weighted, device=torch.device("cpu"))
    tpu = EmbeddingBagCollection(tables=_tables(pool), is_weighted=weighted, device=torch.device("tpu"))
    tpu.load_state_dict(cpu.state_dict())
    head_c = torch.nn.Linear(24, 1)
    head_t = torch.nn.Linear(24, 1).to("tpu")
    head_t.load_state_dict(head_c.state_dict())
    opt_c = torch.optim.SGD([*cpu.parameters(), *head_c.parameters()], lr=0.5)
    opt_t = torch.optim.SGD([*tpu.parameters(), *head_t.parameters()], lr=0.5)
    for step in range(4):
        kc, kt = _kjt(step, "cpu", weighted), _kjt(step, "tpu", weighted)
        out_c, out_t = cpu(kc), tpu(kt)
        assert out_t.keys() == out_c.keys()
        torch.testing.assert_close(out_t.values().cpu(), out_c.values(), rtol=1e-5, atol=1e-6)
        y = torch.linspace(0, 1, 4).reshape(4, 1)
        loss_c = torch.nn.functional.mse_loss(head_c(out_c.values()), y)
        loss_t = torch.nn.functional.mse_loss(head_t(out_t.values()), y.to("tpu"))
        for o, loss in ((opt_c, loss_c), (opt_t, loss_t)):
            o.zero_grad()
            loss.backward()
            o.step()
        torch.testing.assert_close(loss_t.cpu(), loss_c, rtol=1e-5, atol=1e-6)
    for (name, a), (_, b) in zip(tpu.state_dict().items(), cpu.state_dict().items()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-6, msg=name)
