"""embedding_bag on tpu against the CPU, forward and backward (the weight's
gradient and the per-sample weights'), natively, in every eager mode."""

import pytest
import torch
import torch.nn.functional as F

CASES = [
    # mode, per-sample weights, padding_idx, include_last_offset, scale_grad_by_freq
    ("sum", False, None, False, False),
    ("mean", False, None, False, False),
    ("max", False, None, False, False),
    ("sum", True, None, False, False),
    ("sum", True, 3, False, False),
    ("mean", False, 3, True, False),
    ("sum", False, None, False, True),
    ("max", False, 2, True, False),
]


def _run(device, weight, idx, offsets, psw, mode, padding_idx, last, scale):
    w = weight.detach().to(device).requires_grad_()
    p = psw.detach().to(device).requires_grad_() if psw is not None else None
    out = F.embedding_bag(
        idx.to(device), w, offsets.to(device), mode=mode, per_sample_weights=p,
        padding_idx=padding_idx, include_last_offset=last, scale_grad_by_freq=scale,
    )
    g = torch.linspace(-1.0, 1.0, out.numel()).reshape(out.shape).to(device)
    (out * g).sum().backward()
    return out.cpu(), w.grad.cpu(), (p.grad.cpu() if p is not None else None)


@pytest.mark.parametrize("mode_,psw_,pad,last,scale", CASES)
def test_embedding_bag_matches_cpu(mode, no_fallback, mode_, psw_, pad, last, scale):
    torch.manual_seed(0)
    weight = torch.randn(10, 6)
    idx = torch.tensor([1, 3, 3, 7, 0, 9, 3, 2, 5])
    # Bags: [1 3] [] [3 7 0] [9 3 2 5]; with include_last_offset the last
    # offset closes the last bag.
    offsets = torch.tensor([0, 2, 2, 5, 9]) if last else torch.tensor([0, 2, 2, 5])
    psw = torch.rand(idx.numel()) if psw_ else None
    got = _run("tpu", weight, idx, offsets, psw, mode_, pad, last, scale)
    want = _run("cpu", weight, idx, offsets, psw, mode_, pad, last, scale)
    for g, w_, what in zip(got, want, ("output", "weight grad", "per_sample_weights grad")):
        if w_ is None:
            assert g is None
            continue
        torch.testing.assert_close(g, w_, rtol=1e-5, atol=1e-6, msg=what)


def test_embedding_bag_module_2d_input_and_sparse_refusal(no_fallback):
    torch.manual_seed(1)
    cpu = torch.nn.EmbeddingBag(12, 4, mode="mean")
    tpu = torch.nn.EmbeddingBag(12, 4, mode="mean").to("tpu")
    tpu.load_state_dict(cpu.state_dict())
    x = torch.tensor([[1, 2, 4], [4, 3, 11]])
    torch.testing.assert_close(tpu(x.to("tpu")).cpu(), cpu(x))
    sparse = torch.nn.EmbeddingBag(12, 4, mode="sum", sparse=True).to("tpu")
    with pytest.raises(RuntimeError, match="sparse=True"):
        sparse(x.to("tpu")).sum().backward()
