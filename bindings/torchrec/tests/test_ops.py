"""TorchRec's torchrec:: embedding ops on tpu against their CPU kernels
(TorchRec's own), forward and backward, natively; TorchRec's unfused TPU
embedding modules on tpu; bad input named."""

import pytest
import torch

import tpurt_torchrec  # also registers tpu (it imports torch's tpurt binding)
from torchrec.experimental.torch_tpu.modules.embedding_modules import (
    PooledLookupKernel,
    TPUEmbeddingBagUnfused,
    TPUEmbeddingUnfused,
)

ops = torch.ops.torchrec



def _both(fn, *tensors, grad_of=()):
    """fn on CPU and on tpu; outputs and the gradients of the inputs at
    `grad_of` (a fixed linear loss of the output)."""
    out = []
    for dev in ("cpu", "tpu"):
        ts = [t.detach().to(dev) for t in tensors]
        for i in grad_of:
            ts[i].requires_grad_()
        y = fn(*ts)
        w = torch.linspace(-1, 1, y.numel()).reshape(y.shape).to(dev)
        grads = ()
        if grad_of:
            grads = torch.autograd.grad((y * w).sum(), [ts[i] for i in grad_of])
        out.append((y.detach().cpu(), [g.cpu() for g in grads]))
    (yc, gc), (yt, gt) = out
    torch.testing.assert_close(yt, yc, rtol=1e-5, atol=1e-6)
    for a, b in zip(gt, gc):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    return yt


def test_every_torchrec_op_has_a_tpu_kernel():
    assert sorted(tpurt_torchrec.registered_ops()) == sorted(
        [
            "embedding_lookup", "embedding_lookup_backward",
            "embedding_pooled_lookup", "embedding_pooled_lookup_backward",
            "embedding_pooled_lookup_offset", "embedding_pooled_lookup_offset_backward",
            "embedding_pooled_batched_lookup_offset", "embedding_pooled_batched_lookup_offset_backward",
            "permute_pooled_embs", "permute_pooled_embs_backward",
        ]
    )


def test_lookups_and_gradients_match_cpu():
    torch.manual_seed(0)
    table = torch.randn(20, 8)
    idx = torch.tensor([3, 0, 19, 3, 7, 7, 1, 2], dtype=torch.int32)
    _both(lambda i, t: ops.embedding_lookup(i, t, 8), idx, table, grad_of=(1,))
    _both(lambda i, t: ops.embedding_pooled_lookup(i, t, 4), idx, table, grad_of=(1,))
    # Bags [3 0] [] [19 3 7] [7 1 2].
    offsets = torch.tensor([0, 2, 2, 5, 8], dtype=torch.int32)
    _both(lambda i, o, t: ops.embedding_pooled_lookup_offset(i, o, t, 8), idx, offsets, table, grad_of=(2,))
    # Tables stacked by rows: bag b reads from row_offsets[b] on; the last
    # two ids pad the batch (as TorchRec pads to bucket sizes) and must not
    # count.
    row_offsets = torch.tensor([0, 0, 5, 10])
    stacked_ids = torch.tensor([3, 0, 9, 3, 7, 7, 1, 2, 5, 5], dtype=torch.int32)
    _both(
        lambda i, o, t, r: ops.embedding_pooled_batched_lookup_offset(i, o, t, r, 8),
        stacked_ids, offsets, table, row_offsets, grad_of=(2,),
    )


def test_permute_pooled_embs_matches_cpu():
    torch.manual_seed(1)
    embs = torch.randn(3, 10)
    dims = torch.tensor([0, 2, 6, 10])
    perm = torch.tensor([2, 0, 1])
    _both(lambda e, d, p: ops.permute_pooled_embs(e, d, p), embs, dims, perm, grad_of=(0,))


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("kernel", [PooledLookupKernel.OFFSET, PooledLookupKernel.PADDED])
def test_torchrecs_unfused_tpu_modules_run_on_tpu(mode, kernel):
    torch.manual_seed(2)
    cpu = TPUEmbeddingBagUnfused(30, 16, torch.device("cpu"), torch.float32, mode=mode, kernel=kernel)
    tpu = TPUEmbeddingBagUnfused(30, 16, torch.device("tpu"), torch.float32, mode=mode, kernel=kernel)
    tpu.load_state_dict(cpu.state_dict())
    ids = torch.tensor([4, 9, 29, 0, 0, 13, 2])
    offsets = torch.tensor([0, 3, 3, 5, 7])
    want = cpu(ids, offsets)
    got = tpu(ids.to("tpu"), offsets.to("tpu"))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    want.sum().backward()
    got.sum().backward()
    (wc,), (wt,) = [list(m.parameters()) for m in (cpu, tpu)]
    torch.testing.assert_close(wt.grad.cpu(), wc.grad, rtol=1e-5, atol=1e-6)
    plain_c = TPUEmbeddingUnfused(30, 16, torch.device("cpu"), torch.float32)
    plain_t = TPUEmbeddingUnfused(30, 16, torch.device("tpu"), torch.float32)
    plain_t.load_state_dict(plain_c.state_dict())
    torch.testing.assert_close(plain_t(ids.to("tpu")).cpu(), plain_c(ids))


def test_bad_input_is_an_error_naming_what_is_wrong():
    table = torch.randn(20, 8, device="tpu")
    ids = torch.tensor([1, 2, 3], device="tpu")
    with pytest.raises(ValueError, match="must start at 0"):
        ops.embedding_pooled_lookup_offset(ids, torch.tensor([1, 3], device="tpu"), table, 8)
    with pytest.raises(ValueError, match=r"last offset \(4\) must lie in 0..3"):
        ops.embedding_pooled_lookup_offset(ids, torch.tensor([0, 4], device="tpu"), table, 8)
    with pytest.raises(ValueError, match="must not decrease"):
        ops.embedding_pooled_lookup_offset(ids, torch.tensor([0, 2, 1, 3], device="tpu"), table, 8)
    # A bag start past the ids (and decreasing after it): reported as such,
    # never an index out of range while finding the bags.
    with pytest.raises(ValueError, match="must not decrease"):
        ops.embedding_pooled_lookup_offset(ids, torch.tensor([0, 9, 3], device="tpu"), table, 8)
    torch.tpu.synchronize()
    with pytest.raises(ValueError, match="bags of 2"):
        ops.embedding_pooled_lookup(ids, table, 2)
    # An id past its table, or negative: refused and named, on both platforms.
    with pytest.raises(IndexError, match=r"embedding_pooled_lookup_offset: id 25 at position 1 is outside"):
        ops.embedding_pooled_lookup_offset(torch.tensor([1, 25, 3], device="tpu"),
                                           torch.tensor([0, 3], device="tpu"), table, 8)
    with pytest.raises(IndexError, match=r"embedding_lookup: id -1 at position 2"):
        ops.embedding_lookup(torch.tensor([1, 2, -1], device="tpu"), table, 8)
    # Stacked tables: the id plus its bag's row offset must stay inside.
    with pytest.raises(IndexError, match="embedding_pooled_batched_lookup_offset: id 21 at position 1"):
        ops.embedding_pooled_batched_lookup_offset(torch.tensor([1, 11], device="tpu"),
                                                   torch.tensor([0, 1, 2], device="tpu"), table,
                                                   torch.tensor([0, 10], device="tpu"), 8)
    # And the table is unharmed: a good lookup after the refusals.
    got = ops.embedding_pooled_lookup_offset(ids, torch.tensor([0, 3], device="tpu"), table, 8)
    torch.testing.assert_close(got.cpu(), table[1:4].sum(0, keepdim=True).cpu())
