"""torch.tpu.ops: the SparseCore embedding ops against CPU loops, in every
eager mode; their stream order (they run on the SparseCore queue); input
checks that name the input and position; _C.call_op's errors; ragged_dot
against per-group products, splash_sdpa's masks against loops,
sparse_gather, optimization_barrier (the collectives along a dim run
across processes in test_distributed.py)."""

import pytest
import torch

from tpurt import _C

TPU = torch.device("tpu")


def _csr(seed=0, n=40, pad=8, rows=20, batch=6):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, rows, (n + pad,), generator=g, dtype=torch.int32)
    samples = torch.randint(0, batch, (n + pad,), generator=g, dtype=torch.int32)
    gains = torch.rand(n + pad, generator=g)
    rp = torch.tensor([n // 2, n], dtype=torch.int32)
    return rp, ids, samples, gains


def _forward_ref(rp, ids, samples, gains, table, batch):
    out = torch.zeros(batch, table.shape[1], dtype=torch.float64)
    for i in range(int(rp[-1])):
        out[samples[i]] += gains[i].double() * table[ids[i]].double()
    return out


def _row_grads(rp, ids, samples, gains, grad, rows):
    g = torch.zeros(rows, grad.shape[1], dtype=torch.float64)
    for i in range(int(rp[-1])):
        g[ids[i]] += gains[i].double() * grad[samples[i]].double()
    touched = torch.zeros(rows, dtype=torch.bool)
    touched[ids[: int(rp[-1])].long()] = True
    return g, touched


def _dev(*ts):
    return [t.to(TPU) for t in ts]


def test_forward_and_gradient_match_loops(mode, no_fallback):
    rp, ids, samples, gains = _csr()
    table = torch.randn(20, 5)
    out = torch.tpu.ops.sparse_dense_matmul(*_dev(rp, ids, samples, gains, table), 6)
    torch.testing.assert_close(out.cpu().double(), _forward_ref(rp, ids, samples, gains, table, 6), rtol=1e-5, atol=1e-5)
    grad = torch.randn(6, 5)
    rows, values = torch.tpu.ops.sparse_dense_matmul_grad(*_dev(rp, ids, samples, gains, grad), 20)
    g, touched = _row_grads(rp, ids, samples, gains, grad, 20)
    want_rows = touched.nonzero().reshape(-1)
    k = want_rows.numel()
    assert rows[:k].cpu().tolist() == want_rows.tolist()
    assert (rows[k:].cpu() == -1).all()
    torch.testing.assert_close(values[:k].cpu().double(), g[want_rows], rtol=1e-5, atol=1e-5)
    assert (values[k:].cpu() == 0).all()


def test_fused_optimizers_match_loops(mode, no_fallback):
    rp, ids, samples, gains = _csr(1)
    table, grad = torch.randn(20, 4), torch.randn(6, 4)
    g, touched = _row_grads(rp, ids, samples, gains, grad, 20)
    lr, eps = 0.1, 1e-6
    t64 = table.double()
    csr = _dev(rp, ids, samples, gains)

    new = torch.tpu.ops.sparse_dense_matmul_grad_with_sgd(*csr, table.to(TPU), grad.to(TPU), torch.tensor(lr))
    torch.testing.assert_close(new.cpu().double(), t64 - lr * g, rtol=1e-5, atol=1e-5)

    acc = torch.rand(20, 4)
    new, nacc = torch.tpu.ops.sparse_dense_matmul_grad_with_adagrad(
        *csr, table.to(TPU), acc.to(TPU), grad.to(TPU), lr, eps
    )
    a = acc.double() + g * g
    w = torch.where(touched[:, None], t64 - lr * g / (a.sqrt() + eps), t64)
    torch.testing.assert_close(new.cpu().double(), w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nacc.cpu().double(), a, rtol=1e-5, atol=1e-5)

    racc = torch.rand(20, 1)
    new, nacc = torch.tpu.ops.sparse_dense_matmul_grad_with_rowwise_adagrad(
        *csr, table.to(TPU), racc.to(TPU), grad.to(TPU), lr, eps
    )
    a = racc.double() + torch.where(touched[:, None], (g * g).mean(1, keepdim=True), 0.0)
    w = torch.where(touched[:, None], t64 - lr * g / (a.sqrt() + eps), t64)
    assert nacc.shape == (20, 1)
    torch.testing.assert_close(new.cpu().double(), w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nacc.cpu().double(), a, rtol=1e-5, atol=1e-5)

    m, v = torch.randn(20, 4), torch.rand(20, 4)
    new, nm, nv = torch.tpu.ops.sparse_dense_matmul_grad_with_adam(
        *csr, table.to(TPU), m.to(TPU), v.to(TPU), grad.to(TPU), lr, 0.8, 0.9, eps
    )
    t = touched[:, None]
    m2 = torch.where(t, 0.8 * m.double() + 0.2 * g, m.double())
    v2 = torch.where(t, 0.9 * v.double() + 0.1 * g * g, v.double())
    w = torch.where(t, t64 - lr * m2 / (v2.sqrt() + eps), t64)
    for got, want in ((new, w), (nm, m2), (nv, v2)):
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-5)


def test_ops_run_on_the_sparse_queue_in_stream_order(no_fallback):
    """Each op is ordered after the current stream's queued work and before
    what follows on it: a table written just before and read just after."""
    rp, ids, samples, gains = _dev(*_csr(2))
    for step in range(20):
        table = torch.zeros(20, 3, device=TPU)
        table.fill_(float(step + 1))  # queued on the current stream
        out = torch.tpu.ops.sparse_dense_matmul(rp, ids, samples, gains, table, 6)
        new = torch.tpu.ops.sparse_dense_matmul_grad_with_sgd(
            rp, ids, samples, gains, table, torch.ones(6, 3, device=TPU), 0.0
        )
        new.add_(1.0)  # queued after the op, on the current stream
        ref = _forward_ref(*_csr(2), torch.full((20, 3), float(step + 1)), 6)
        torch.testing.assert_close(out.cpu().double(), ref, rtol=1e-5, atol=1e-5)
        assert (new.cpu() == step + 2).all()
    # On a SparseCore stream, the op runs there directly.
    sc = torch.tpu.Stream(core="sparse")
    sc.wait_stream(torch.tpu.current_stream())
    with torch.tpu.stream(sc):
        table = torch.ones(20, 3, device=TPU)
        out = torch.tpu.ops.sparse_dense_matmul(rp, ids, samples, gains, table, 6)
    torch.tpu.current_stream().wait_stream(sc)
    torch.testing.assert_close(out.cpu().double(), _forward_ref(*_csr(2), torch.ones(20, 3), 6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "field,pos,value,match",
    [
        ("ids", 3, 20, r"embedding_ids: embedding id 20 at position 3 is outside the table's 20 rows"),
        ("ids", 7, -2, r"embedding_ids: embedding id -2 at position 7"),
        ("samples", 5, 6, r"sample_ids: sample id 6 at position 5 is outside the batch of 6"),
        ("gains", 2, float("nan"), r"gains: the gain at position 2 is not finite"),
        ("rp", 1, 10, r"row_pointers: row pointer 10 at position 1 decreases"),
    ],
)
def test_bad_entries_are_errors_naming_input_and_position(mode, field, pos, value, match):
    rp, ids, samples, gains = _csr(3)
    t = {"ids": ids, "samples": samples, "gains": gains, "rp": rp}[field]
    t[pos] = value
    table = torch.randn(20, 3, device=TPU)
    with pytest.raises(ValueError, match=match):
        torch.tpu.ops.sparse_dense_matmul(*_dev(rp, ids, samples, gains), table, 6)
    with pytest.raises(ValueError, match=match):
        torch.tpu.ops.sparse_dense_matmul_grad_with_sgd(
            *_dev(rp, ids, samples, gains), table, torch.ones(6, 3, device=TPU), 0.1
        )
    # A bad entry in the padding is not an error.
    rp, ids, samples, gains = _csr(3)
    ids[-1] = 10_000
    torch.tpu.ops.sparse_dense_matmul(*_dev(rp, ids, samples, gains), table, 6).cpu()


def test_unchecked_bad_entries_take_no_part_and_a_changed_input_is_rechecked():
    rp, ids, samples, gains = _csr(4)
    table = torch.randn(20, 3)
    dev = _dev(rp, ids, samples, gains)
    torch.tpu.ops.sparse_dense_matmul(*dev, table.to(TPU), 6)
    # The same tensors written in place: checked again, not taken from the cache.
    dev[1][0] = 99
    with pytest.raises(ValueError, match="embedding id 99 at position 0"):
        torch.tpu.ops.sparse_dense_matmul(*dev, table.to(TPU), 6)
    torch.tpu.ops.set_validate_inputs(False)
    try:
        out = torch.tpu.ops.sparse_dense_matmul(*dev, table.to(TPU), 6).cpu()
        new = torch.tpu.ops.sparse_dense_matmul_grad_with_sgd(*dev, table.to(TPU), torch.ones(6, 3, device=TPU), 1.0)
    finally:
        torch.tpu.ops.set_validate_inputs(True)
    live = torch.ones(ids.numel(), dtype=torch.bool)
    live[0] = False
    ref = _forward_ref(rp, ids, samples, gains * live, table, 6)  # entry 0 dropped (its id reads row 0 * 0)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    assert new.shape == (20, 3) and torch.isfinite(new.cpu()).all()


def test_activation_unstack_inverts_the_stacked_layout():
    f, b, d = 3, 4, 8
    per = torch.randn(f, b, d)
    stacked = per.reshape(f * b, d).to(TPU)  # one SparseCore: feature-major
    outs = torch.tpu.ops.sparse_dense_matmul_activation_unstack(stacked, [b] * f, [8, 5, 3])
    for i, dim in enumerate([8, 5, 3]):
        torch.testing.assert_close(outs[i].cpu(), per[i, :, :dim])
    with pytest.raises(ValueError, match="share a batch size"):
        torch.tpu.ops.sparse_dense_matmul_activation_unstack(stacked, [4, 4, 2], [8, 8, 8])


def test_call_op_errors_name_the_op_and_the_attribute():
    x = torch.ones(2, device=TPU)
    with pytest.raises(RuntimeError, match="no_such_op"):
        _C.call_op("no_such_op", [x], {})
    with pytest.raises(TypeError, match="attribute batch_size has unsupported type"):
        _C.call_op("sparse_dense_matmul", [x], {"batch_size": object()})
    (y,) = _C.call_op("add", [x, x], {})
    assert y.cpu().tolist() == [2.0, 2.0]


def _ragged_ref(lhs, rhs, sizes):
    """ragged_dot by slices (differentiable): negative sizes are empty,
    groups are cut at the last row, rows past them are zero."""
    m = lhs.shape[0]
    parts, start = [], 0
    for j, s in enumerate(sizes):
        end = min(start + max(s, 0), m)
        if end > start:
            parts.append(lhs[start:end] @ rhs[j])
        start = max(start, end)
    rest = m - sum(p.shape[0] for p in parts)
    parts.append(lhs.new_zeros(rest, rhs.shape[2]))
    return torch.cat(parts)


@pytest.mark.parametrize("sizes", [[3, 0, 4, 1], [2, 2, 2, 2], [0, 0, 8, 0], [5, -1, 2, 9], [1, 1, 1]])
def test_ragged_dot_matches_per_group_products_and_gradients(mode, no_fallback, sizes):
    g = torch.Generator().manual_seed(len(sizes) + sum(sizes))
    m, k, n = 8, 5, 3
    lhs, rhs = torch.randn(m, k, generator=g), torch.randn(len(sizes), k, n, generator=g)
    grad = torch.randn(m, n, generator=g)
    lt, rt = lhs.to(TPU).requires_grad_(), rhs.to(TPU).requires_grad_()
    out = torch.tpu.ops.ragged_dot(lt, rt, torch.tensor(sizes, dtype=torch.int32, device=TPU))
    out.backward(grad.to(TPU))
    l64, r64 = lhs.double().requires_grad_(), rhs.double().requires_grad_()
    want = _ragged_ref(l64, r64, sizes)
    want.backward(grad.double())
    torch.testing.assert_close(out.detach().cpu().double(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lt.grad.cpu().double(), l64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rt.grad.cpu().double(), r64.grad, rtol=1e-5, atol=1e-5)


def test_ragged_dot_in_bf16_and_its_errors(no_fallback):
    g = torch.Generator().manual_seed(5)
    lhs = torch.randn(6, 4, generator=g).bfloat16()
    rhs = torch.randn(2, 4, 3, generator=g).bfloat16()
    sizes = torch.tensor([4, 2])
    want = _ragged_ref(lhs.float(), rhs.float(), [4, 2])
    wide = torch.tpu.ops.ragged_dot(lhs.to(TPU), rhs.to(TPU), sizes.to(TPU), preferred_element_type=torch.float32)
    assert wide.dtype == torch.float32
    torch.testing.assert_close(wide.cpu(), want, rtol=1e-6, atol=1e-6)
    half = torch.tpu.ops.ragged_dot(lhs.to(TPU), rhs.to(TPU), sizes.to(TPU))
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.cpu(), want.bfloat16(), rtol=0, atol=0)
    ops = torch.tpu.ops
    with pytest.raises(ValueError, match="group_sizes must be an integer tensor"):
        ops.ragged_dot(lhs.to(TPU), rhs.to(TPU), sizes.float().to(TPU))
    with pytest.raises(ValueError, match="rhs is on cpu"):
        ops.ragged_dot(lhs.to(TPU), rhs, sizes.to(TPU))
    with pytest.raises(ValueError, match="group_sizes has 3 entries for 2 groups"):
        ops.ragged_dot(lhs.to(TPU), rhs.to(TPU), torch.tensor([1, 2, 3], device=TPU))
    with pytest.raises(ValueError, match="cannot be multiplied"):
        ops.ragged_dot(lhs.to(TPU), rhs.to(TPU).transpose(1, 2), sizes.to(TPU))


def test_collectives_along_a_dim_check_their_arguments():
    import torch.distributed as dist

    x = torch.ones(2, 3, device=TPU)
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            torch.tpu.ops.all_gather_dim(x, 0)
    with pytest.raises(ValueError, match="dim 2 is out of range for a 2-D tensor"):
        torch.tpu.ops.reduce_scatter_dim(x, 2)


def _splash_ref(q, k, v, causal, window, seg, kv_seg, cap):
    """Attention by loops in f64 over the allowed (query, key) pairs."""
    b, h, s, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    out = torch.zeros(b, h, s, d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            kh = hi // (h // hkv)
            for i in range(s):
                allowed = []
                for j in range(t):
                    ok = (not causal or j <= i)
                    if window is not None:
                        ok = ok and (window[0] is None or j >= i - window[0]) and (window[1] is None or j <= i + window[1])
                    if seg is not None:
                        ok = ok and seg[bi, i] == (kv_seg if kv_seg is not None else seg)[bi, j]
                    if ok:
                        allowed.append(j)
                if not allowed:
                    continue
                logits = torch.stack([q[bi, hi, i].double() @ k[bi, kh, j].double() / d**0.5 for j in allowed])
                if cap is not None:
                    logits = cap * torch.tanh(logits / cap)
                p = torch.softmax(logits, 0)
                out[bi, hi, i] = sum(p[n] * v[bi, kh, j].double() for n, j in enumerate(allowed))
    return out


@pytest.mark.parametrize(
    "causal,window,segments,cap",
    [
        (True, None, False, None),
        (False, (2, 1), False, None),
        (True, (3, None), True, None),
        (False, None, True, 30.0),
        (True, (1, 0), False, 5.0),
    ],
)
def test_splash_sdpa_masks_and_soft_cap_match_loops(mode, no_fallback, causal, window, segments, cap):
    g = torch.Generator().manual_seed(11)
    b, h, hkv, s, d = 2, 4, 2, 7, 8
    q, k, v = (torch.randn(b, n, s, d, generator=g) for n in (h, hkv, hkv))
    seg = torch.tensor([[0, 0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 1, 1, 3]]) if segments else None
    kw = dict(causal=causal, window_size=window, segment_ids=None if seg is None else seg.to(TPU), logits_soft_cap=cap)
    qt, kt, vt = (x.to(TPU).requires_grad_() for x in (q, k, v))
    out = torch.tpu.ops.splash_sdpa(qt, kt, vt, **kw)
    want = _splash_ref(q, k, v, causal, window, seg, None, cap)
    torch.testing.assert_close(out.detach().cpu().double(), want, rtol=1e-4, atol=1e-5)
    # Gradients as the same function's on CPU.
    qc, kc, vc = (x.clone().requires_grad_() for x in (q, k, v))
    kw["segment_ids"] = seg
    ref = torch.tpu.ops.splash_sdpa(qc, kc, vc, **kw)
    grad = torch.randn(ref.shape, generator=g)
    ref.backward(grad)
    out.backward(grad.to(TPU))
    for dev_t, cpu_t in ((qt, qc), (kt, kc), (vt, vc)):
        torch.testing.assert_close(dev_t.grad.cpu(), cpu_t.grad, rtol=1e-4, atol=1e-5)


def test_splash_sdpa_errors_name_the_argument():
    q = torch.randn(1, 2, 4, 8, device=TPU)
    k = torch.randn(1, 3, 4, 8, device=TPU)
    with pytest.raises(ValueError, match="H a multiple of Hkv"):
        torch.tpu.ops.splash_sdpa(q, k, k)
    with pytest.raises(ValueError, match=r"window_size must be \(left, right\)"):
        torch.tpu.ops.splash_sdpa(q, q, q, window_size=3)
    with pytest.raises(ValueError, match=r"segment_ids must be a \[1, 4\] tensor"):
        torch.tpu.ops.splash_sdpa(q, q, q, segment_ids=torch.zeros(4, device=TPU))


def test_sparse_gather_rows_gradient_and_bad_index(mode, no_fallback):
    g = torch.Generator().manual_seed(12)
    table = torch.randn(10, 4, generator=g)
    idx = torch.tensor([[3, 0, 9], [3, 3, 1]], dtype=torch.int32)
    tt = table.to(TPU).requires_grad_()
    out = torch.tpu.ops.sparse_gather(tt, idx.to(TPU))
    assert out.shape == (2, 3, 4)
    torch.testing.assert_close(out.detach().cpu(), table[idx.long()], rtol=0, atol=0)
    grad = torch.randn(2, 3, 4, generator=g)
    out.backward(grad.to(TPU))
    want = torch.zeros(10, 4).index_add_(0, idx.reshape(-1).long(), grad.reshape(-1, 4))
    torch.testing.assert_close(tt.grad.cpu(), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="index 10 at position 4 is outside the table's 10 rows"):
        torch.tpu.ops.sparse_gather(tt, torch.tensor([0, 1, 2, 3, 10], device=TPU))
    with pytest.raises(ValueError, match="int32 or int64"):
        torch.tpu.ops.sparse_gather(tt, torch.zeros(2, device=TPU))


def test_optimization_barrier_launches_what_is_recorded():
    a = torch.randn(64, device=TPU)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        torch.tpu.mark_step()
        y = a * 2 + 1
        same = torch.tpu.ops.optimization_barrier(y)
        assert same is y
        assert torch.tpu.mark_step() == 0  # the barrier launched it
        z = y.exp()
        y2, z2 = torch.tpu.ops.optimization_barrier(y, z)
        assert y2 is y and z2 is z
        assert torch.tpu.mark_step() == 0
        w = z + 1
        assert torch.tpu.mark_step() > 0  # without a barrier it was still recorded
    torch.testing.assert_close(w.cpu(), (a.cpu() * 2 + 1).exp() + 1)
    with pytest.raises(TypeError, match="takes tensors"):
        torch.tpu.ops.optimization_barrier(a, 3)
