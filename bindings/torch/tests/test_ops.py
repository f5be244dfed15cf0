"""Native kernels against torch on CPU, in every eager mode."""

import pytest
import torch
import torch.nn.functional as F

torch.manual_seed(0)
X = torch.randn(4, 8)
Y = torch.randn(4, 8)
P = torch.rand(4, 8) + 0.1

UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": lambda x: torch.log(x.abs() + 0.1),
    "sqrt": lambda x: torch.sqrt(x.abs()), "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.5),
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "sin": torch.sin, "cos": torch.cos, "erf": torch.erf,
    "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "floor": torch.floor, "round": torch.round, "reciprocal": lambda x: 1 / (x.abs() + 1),
    "clamp": lambda x: x.clamp(-0.5, 0.5), "pow": lambda x: x.abs() ** 1.5, "square": torch.square,
}

BINARY = {
    "add": lambda a, b: a + b, "add_alpha": lambda a, b: torch.add(a, b, alpha=0.5), "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b, "div": lambda a, b: a / (b.abs() + 1), "max": torch.maximum,
    "min": torch.minimum, "where": lambda a, b: torch.where(a > b, a, b), "lt": lambda a, b: a < b,
    "eq": lambda a, b: a == a, "masked_fill": lambda a, b: a.masked_fill(b > 0, -1e9),
    "lerp": lambda a, b: torch.lerp(a, b, 0.3), "broadcast": lambda a, b: a + b[0],
}

REDUCE = {
    "sum": lambda x: x.sum(), "sum_dim": lambda x: x.sum(1), "mean": lambda x: x.mean(0, keepdim=True),
    "amax": lambda x: x.amax(1), "max_dim": lambda x: x.max(1).values, "argmax": lambda x: x.argmax(1),
    "var": lambda x: x.var(1), "std": lambda x: x.std(), "logsumexp": lambda x: x.logsumexp(1),
    "softmax": lambda x: x.softmax(-1), "log_softmax": lambda x: x.log_softmax(1),
    "cumsum": lambda x: x.cumsum(1), "norm": lambda x: torch.linalg.vector_norm(x),
    "layer_norm": lambda x: F.layer_norm(x, (8,)), "any": lambda x: (x > 2).any(1),
    "sort": lambda x: x.sort(1).values, "topk": lambda x: x.topk(3).values, "tril": torch.tril,
}


def close(out, ref, tol=1e-5):
    out = out.cpu()
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if ref.dtype.is_floating_point:
        torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    else:
        assert torch.equal(out, ref)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name, mode, no_fallback):
    close(UNARY[name](X.to("tpu")), UNARY[name](X))


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(name, mode, no_fallback):
    close(BINARY[name](X.to("tpu"), Y.to("tpu")), BINARY[name](X, Y))


@pytest.mark.parametrize("name", sorted(REDUCE))
def test_reductions(name, mode, no_fallback):
    close(REDUCE[name](X.to("tpu")), REDUCE[name](X))


def test_in_place_and_out(mode, no_fallback):
    a = X.clone().to("tpu")
    a.mul_(2).add_(1).clamp_(max=1.0)
    close(a, (X * 2 + 1).clamp(max=1.0))
    out = torch.empty(0, device="tpu")
    torch.add(X.to("tpu"), Y.to("tpu"), out=out)
    close(out, X + Y)
    i = torch.arange(4, device="tpu")
    with pytest.raises(RuntimeError, match="can't be cast"):
        i.add_(0.5)


def test_in_place_arithmetic_writes_its_target(mode, no_fallback):
    """In-place add, sub, mul, div, remainder and fmod write a contiguous
    floating target directly when the result has its type and shape (one
    task, not the op and a copy); every case gives torch's results: a
    broadcast operand, the target as its own operand, a Python number,
    alpha, a wider operand, a non-contiguous target, a comparison, a row
    view."""
    a0, b0 = torch.randn(4, 6), torch.randn(6)
    cases = [
        (lambda a, b: a.add_(b), "broadcast"),
        (lambda a, b: a.sub_(a), "itself"),
        (lambda a, b: a.mul_(2.5), "number"),
        (lambda a, b: a.div_(b.expand(4, 6).contiguous()), "same shape"),
        (lambda a, b: a.remainder_(b), "remainder"),
        (lambda a, b: a.fmod_(0.75), "fmod"),
        (lambda a, b: a.add_(b, alpha=-0.5), "alpha"),
        (lambda a, b: a.add_(b.double()), "wider operand"),
        (lambda a, b: a.t().mul_(3.0), "non-contiguous target"),
        (lambda a, b: a.lt_(b), "comparison"),
        (lambda a, b: a[1:].add_(b), "a row view"),
    ]
    for f, what in cases:
        a, b = a0.clone().to("tpu"), b0.to("tpu")
        f(a, b)
        want = a0.clone()
        f(want, b0)
        torch.testing.assert_close(a.cpu(), want, atol=1e-5, rtol=1e-5, msg=lambda m: f"{what}: {m}")
    # Integer tensors still refuse a float alpha, even 1.0.
    i = torch.arange(4, device="tpu")
    with pytest.raises(RuntimeError, match="alpha must not be a floating point"):
        i.add_(i, alpha=1.0)
    # One task in strict mode: the op writes the target.
    if mode == torch.tpu.EagerMode.DEFER_NEVER:
        a, b = a0.clone().to("tpu"), b0.to("tpu")
        torch.tpu.synchronize()
        with torch.tpu.set_eager_mode(mode), torch.tpu.profiler.profile() as prof:
            a.add_(b)
            torch.tpu.synchronize()
        tasks = [e.name for e in prof.events() if e.kind == "task"]
        assert tasks == ["add"], tasks
        close(a, a0 + b0)


def _uploads(prof):
    return sum(1 for e in prof.events() if e.kind == "task" and e.name == "copy_host_to_device")


def test_a_foreach_op_uploads_each_scalar_once(no_fallback):
    """A foreach op's scalar serves every tensor of its list: one upload, not
    one per tensor (equal values of a scalar list share one too); a plain
    op after it uploads its own."""
    xs = [torch.randn(n, device="tpu") for n in (3, 5, 7)]
    ref = [x.cpu() for x in xs]
    torch.tpu.synchronize()
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER):
        with torch.tpu.profiler.profile() as prof:
            torch._foreach_mul_(xs, 0.75)
            torch.tpu.synchronize()
        assert _uploads(prof) == 1
        with torch.tpu.profiler.profile() as prof:
            torch._foreach_div_(xs, [2.0, -0.5, 2.0])
            torch.tpu.synchronize()
        assert _uploads(prof) == 2
        with torch.tpu.profiler.profile() as prof:
            y = xs[0] * 0.75
            z = xs[1] * 0.75
            torch.tpu.synchronize()
        assert _uploads(prof) == 2
    torch._foreach_mul_(ref, 0.75)
    torch._foreach_div_(ref, [2.0, -0.5, 2.0])
    for x, r in zip(xs, ref):
        close(x, r)
    close(y, ref[0] * 0.75)
    close(z, ref[1] * 0.75)


def test_foreach_scalars_keep_their_values(mode, no_fallback):
    """Within one foreach op, -0.0 and 0.0 stay apart, and each tensor of a
    scalar list gets its own value: -0.0 + s * 1 / 1 keeps the sign of s
    when s is a zero."""
    fs = [torch.tensor([-0.0, 1.0], device="tpu") for _ in range(4)]
    ones = [torch.ones(2, device="tpu") for _ in range(4)]
    torch._foreach_addcdiv_(fs, ones, ones, [-0.0, 0.0, -0.0, 0.5])
    got = [(torch.signbit(f.cpu()[0]).item(), f.cpu()[1].item()) for f in fs]
    assert got == [(True, 1.0), (False, 1.0), (True, 1.0), (False, 1.5)], got


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.bool])
def test_casts(dtype, mode, no_fallback):
    close(X.to("tpu").to(dtype), X.to(dtype))
    close((X * 10).to(dtype).to("tpu").float(), (X * 10).to(dtype).float())


def test_matmul_family(mode, no_fallback):
    a, b = torch.randn(3, 5), torch.randn(5, 2)
    close(a.to("tpu") @ b.to("tpu"), a @ b)
    lin = torch.nn.Linear(5, 2)
    close(F.linear(a.to("tpu"), lin.weight.to("tpu"), lin.bias.to("tpu")), F.linear(a, lin.weight, lin.bias))
    q, k = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    close(torch.bmm(q.to("tpu"), k.to("tpu")), torch.bmm(q, k))
    close(torch.matmul(q.to("tpu"), k.to("tpu")), torch.matmul(q, k))


HALF_WITH_NUMBERS = {
    "mul": lambda x, y: x * 0.7071, "mul_0d": lambda x, y: x * torch.tensor(0.7071), "div": lambda x, y: x / 3.3,
    "rdiv": lambda x, y: 3.3 / (x.abs() + 0.1), "floordiv": lambda x, y: x // 0.7071, "add": lambda x, y: x + 0.3137,
    "add_alpha": lambda x, y: torch.add(x, y, alpha=0.7071), "sub_alpha": lambda x, y: torch.sub(x, y, alpha=1.37),
    "add_scalar_alpha": lambda x, y: torch.add(x, 0.3137, alpha=3.3), "lerp_low": lambda x, y: torch.lerp(x, y, 0.3137),
    "lerp_high": lambda x, y: torch.lerp(x, y, 0.7071), "lerp_tensor": lambda x, y: torch.lerp(x, y, y.sigmoid()),
    "addcdiv": lambda x, y: torch.addcdiv(x, x, y.abs() + 0.5, value=0.7071),
    "chain": lambda x, y: ((x * 1.0013 + 0.3137) * 0.7071 / 1.7).exp(),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(HALF_WITH_NUMBERS))
def test_arithmetic_with_numbers_equals_cpu_bit_for_bit(name, dtype, mode, no_fallback):
    # torch's CPU kernels compute bf16 and f16 at f32 ("opmath"): a Python
    # number (or a 0-dim tensor) enters at f32, not rounded to the tensor's
    # dtype, and a compound op (add with alpha, lerp, addcdiv) rounds once.
    # Rounding the number first made up to a third of the elements differ.
    # (lerp's f32 is a fused multiply-add in torch, which the op library
    # has not: an f16 element in thousands may round the other way. f32
    # results of the fused ops differ so too, in the last place.)
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(4096, generator=g) * 3).to(dtype)
    y = torch.randn(4096, generator=g).to(dtype)
    f = HALF_WITH_NUMBERS[name]
    got, want = f(x.to("tpu"), y.to("tpu")).cpu(), f(x, y)
    fused = name.startswith("lerp") and dtype == torch.float16
    assert (got != want).sum().item() <= (2 if fused else 0), f"{(got != want).sum().item()} of {want.numel()} differ"
    torch.testing.assert_close(got, want)


def test_addcmul_rounds_once_at_f32(mode, no_fallback):
    # torch fuses its last multiply-add: one element in thousands may be a
    # unit in the last place off; rounding at every step made most differ.
    g = torch.Generator().manual_seed(2)
    for dtype in (torch.bfloat16, torch.float16):
        x, y = (torch.randn(4096, generator=g) * 3).to(dtype), torch.randn(4096, generator=g).to(dtype)
        got, want = torch.addcmul(x.to("tpu"), x.to("tpu"), y.to("tpu"), value=0.7071).cpu(), torch.addcmul(
            x, x, y, value=0.7071)
        assert (got != want).sum() <= 4
        torch.testing.assert_close(got, want)


def _bf16(x):
    """x rounded to bf16, as f32."""
    return x.to(torch.bfloat16).float()


def test_f32_products_take_the_precision_in_force_when_called(mode, no_fallback):
    P = torch.tpu.Precision
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(16, 96, generator=g), torch.randn(96, 24, generator=g)
    w, bias = torch.randn(24, 96, generator=g), torch.randn(24, generator=g)
    t = lambda v: v.to("tpu")  # noqa: E731
    assert torch.tpu.get_precision() == P.HIGHEST
    with torch.tpu.precision(P.DEFAULT):
        low = t(a) @ t(b)  # deferred in DEFER_AND_FUSE: runs after the exit
        low_linear = F.linear(t(a), t(w), t(bias))
    with torch.tpu.precision("high"):
        high = t(a) @ t(b)
    full = t(a) @ t(b)
    assert torch.tpu.get_precision() == P.HIGHEST
    torch.testing.assert_close(full.cpu(), a @ b)
    if torch.tpu.platform() != "host":
        # The XLA CPU plugin computes f32 products in full whatever their
        # precision says (a TPU would not).
        torch.testing.assert_close(low.cpu(), a @ b)
        return
    # The host rounds the operands as a TPU's matrix unit does.
    ha, hb = _bf16(a), _bf16(b)
    la, lb = _bf16(a - ha), _bf16(b - hb)
    torch.testing.assert_close(low.cpu(), ha @ hb, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(low_linear.cpu(), F.linear(ha, _bf16(w), bias), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(high.cpu(), (la @ hb + ha @ lb) + ha @ hb, rtol=1e-5, atol=1e-5)
    exact = a.double() @ b.double()
    err = {k: (v.cpu().double() - exact).abs().max().item() for k, v in [("low", low), ("high", high)]}
    assert err["low"] > 1e-2 and err["high"] < err["low"] / 50, err


def test_precision_names_and_bad_values():
    P = torch.tpu.Precision
    assert [p.name for p in P] == ["DEFAULT", "HIGH", "HIGHEST"]
    for name, want in [("medium", P.DEFAULT), ("HIGH", P.HIGH), ("highest", P.HIGHEST), (0, P.DEFAULT)]:
        with torch.tpu.precision(name) as p:
            assert p.value == want and torch.tpu.get_precision() == want
        assert torch.tpu.get_precision() == P.HIGHEST
    with pytest.raises(ValueError, match="precision 'fast'"):
        torch.tpu.precision("fast")
    with pytest.raises(ValueError, match="precision 7"):
        torch.tpu.precision(7)
    with pytest.raises(TypeError, match="not float"):
        torch.tpu.precision(1.5)
    # As a statement it stays until changed.
    torch.tpu.precision(P.HIGH)
    try:
        assert torch.tpu.get_precision() == P.HIGH
    finally:
        torch.tpu.precision(None)


def test_precision_follows_torch_set_float32_matmul_precision_until_set(no_fallback):
    """torch.set_float32_matmul_precision chooses the precision of f32
    products on tpu ("medium" rounds the operands to bf16) until
    torch.tpu.precision sets one; precision(None) follows torch again."""
    P = torch.tpu.Precision
    a = torch.full((1, 1), 1 + 2**-10, device="tpu")
    exact, rounded = (1 + 2**-10) ** 2, 1.0
    host = torch.tpu.platform() == "host"  # the XLA CPU plugin computes f32 in full
    was = torch.get_float32_matmul_precision()
    torch.tpu.precision(None)
    try:
        assert torch.tpu.get_precision() == P.HIGHEST and (a @ a).item() == exact
        for name, want in [("medium", P.DEFAULT), ("high", P.HIGH), ("highest", P.HIGHEST)]:
            torch.set_float32_matmul_precision(name)
            assert torch.tpu.get_precision() == want
        torch.set_float32_matmul_precision("medium")
        assert (a @ a).item() == (rounded if host else exact)
        with torch.tpu.precision("highest"):
            assert (a @ a).item() == exact
            torch.set_float32_matmul_precision("medium")
            assert torch.tpu.get_precision() == P.HIGHEST and (a @ a).item() == exact
        assert torch.tpu.get_precision() == P.DEFAULT  # following torch's again
        torch.tpu.precision(P.HIGH)
        torch.set_float32_matmul_precision("highest")
        assert torch.tpu.get_precision() == P.HIGH
        torch.tpu.precision(None)
        assert torch.tpu.get_precision() == P.HIGHEST
    finally:
        torch.set_float32_matmul_precision(was)
        torch.tpu.precision(None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_products_with_a_bias_equal_cpu_bit_for_bit(dtype, mode, no_fallback):
    # torch's CPU kernels add the bias to the f32 product and round once; a
    # product rounded before the bias made a quarter of a bf16 Linear's
    # elements one unit off.
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 64, generator=g).to(dtype)
    w = torch.randn(48, 64, generator=g).to(dtype)
    b = torch.randn(48, generator=g).to(dtype)
    t = lambda v: v.to("tpu")  # noqa: E731
    assert torch.equal(F.linear(t(x), t(w), t(b)).cpu(), F.linear(x, w, b))
    x3 = x.view(2, 8, 64)  # contiguous 3-D: torch flattens it into addmm
    assert torch.equal(F.linear(t(x3), t(w), t(b)).cpu(), F.linear(x3, w, b))
    c = torch.randn(16, 48, generator=g).to(dtype)
    got = torch.addmm(t(c), t(x), t(w).t(), beta=0.5, alpha=2.0).cpu()
    assert torch.equal(got, torch.addmm(c, x, w.t(), beta=0.5, alpha=2.0))
    cb, xb, wb = c.view(2, 8, 48), x3, w.t().expand(2, 64, 48)
    assert torch.equal(torch.baddbmm(t(cb), t(xb), t(wb)).cpu(), torch.baddbmm(cb, xb, wb))


def test_indexing(mode, no_fallback):
    w = torch.randn(10, 3)
    idx = torch.tensor([[1, 4], [9, 0]])
    close(F.embedding(idx.to("tpu"), w.to("tpu")), F.embedding(idx, w))
    close(torch.index_select(w.to("tpu"), 0, idx[0].to("tpu")), torch.index_select(w, 0, idx[0]))
    g = torch.tensor([[0, 2, 1]] * 10)
    close(torch.gather(w.to("tpu"), 1, g.to("tpu")), torch.gather(w, 1, g))
    close(torch.cat([w.to("tpu"), w.to("tpu") * 2], 1), torch.cat([w, w * 2], 1))
    close(torch.stack([w.to("tpu"), w.to("tpu")]), torch.stack([w, w]))
    z = torch.zeros(3, 5)
    src = torch.ones(2, 5)
    si = torch.tensor([[0, 1, 2, 0, 0], [2, 0, 0, 1, 2]])
    close(z.to("tpu").scatter_add(0, si.to("tpu"), src.to("tpu")), z.scatter_add(0, si, src))


def test_losses(mode, no_fallback):
    logits = torch.randn(6, 5)
    target = torch.tensor([0, 4, 2, 2, 1, -100])
    close(F.cross_entropy(logits.to("tpu"), target.to("tpu")), F.cross_entropy(logits, target))
    close(F.mse_loss(X.to("tpu"), Y.to("tpu")), F.mse_loss(X, Y))


def test_floor_divide_and_masked_select(mode, no_fallback):
    a = torch.tensor([7, -7, 9, -1])
    b = torch.tensor([2, 2, -4, 3])
    close(torch.floor_divide(a.to("tpu"), b.to("tpu")), torch.floor_divide(a, b))
    close(X.to("tpu") // 0.3, X // 0.3)
    t = a.to("tpu")
    t //= 3
    close(t, a // 3)
    mask = X > 0.2
    close(X.to("tpu").masked_select(mask.to("tpu")), X.masked_select(mask))
    row = torch.tensor([True, False] * 4)
    close(torch.masked_select(X.to("tpu"), row.to("tpu")), torch.masked_select(X, row))


def test_random_integers(mode, no_fallback):
    torch.manual_seed(3)
    x = torch.empty(20000, dtype=torch.long, device="tpu").random_(3, 7).cpu()
    assert int(x.min()) == 3 and int(x.max()) == 6
    counts = torch.bincount(x)[3:].double() / x.numel()
    assert torch.all((counts - 0.25).abs() < 0.02), counts
    y = torch.randint(0, 10, (1000,), device="tpu").cpu()
    assert 0 <= int(y.min()) and int(y.max()) <= 9 and len(y.unique()) == 10
    f = torch.empty(100, device="tpu").random_(5).cpu()
    assert torch.equal(f, f.floor()) and 0 <= float(f.min()) and float(f.max()) <= 4
    torch.manual_seed(11)
    first = torch.randint(0, 1000, (50,), device="tpu").cpu()
    torch.manual_seed(11)
    assert torch.equal(torch.randint(0, 1000, (50,), device="tpu").cpu(), first)
    with pytest.raises(RuntimeError, match="'from' to be less than 'to'"):
        torch.empty(3, dtype=torch.long, device="tpu").random_(5, 5)


def test_multinomial(mode, no_fallback):
    torch.manual_seed(5)
    p = torch.tensor([[0.1, 0.0, 0.9], [0.5, 0.5, 0.0]])
    draws = torch.multinomial(p.to("tpu"), 4000, replacement=True).cpu()
    assert draws.shape == (2, 4000) and draws.dtype == torch.long
    for row, probs in zip(draws, p):
        freq = torch.bincount(row, minlength=3).double() / row.numel()
        assert torch.all((freq - probs.double()).abs() < 0.03), freq
    no_repl = torch.multinomial(p.to("tpu"), 2).cpu()
    for row in no_repl:
        assert len(set(row.tolist())) == 2
    assert set(no_repl[0].tolist()) == {0, 2} and set(no_repl[1].tolist()) == {0, 1}
    one = torch.multinomial(torch.tensor([0.0, 0.0, 1.0], device="tpu"), 1).cpu()
    assert one.tolist() == [2]
    with pytest.raises(RuntimeError, match="element < 0"):
        torch.multinomial(torch.tensor([-1.0, 1.0], device="tpu"), 1)
    with pytest.raises(RuntimeError, match="sum of probabilities"):
        torch.multinomial(torch.zeros(3, device="tpu"), 1)
    with pytest.raises(RuntimeError, match="without replacement"):
        torch.multinomial(torch.ones(3, device="tpu"), 4)


def test_bincount(mode, no_fallback):
    x = torch.tensor([0, 2, 2, 5, 2, 0, 9])
    for kw in ({}, {"minlength": 14}, {"minlength": 3}):
        got, want = torch.bincount(x.to("tpu"), **kw), torch.bincount(x, **kw)
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
    for w in (torch.rand(7), torch.rand(7, dtype=torch.float64), torch.arange(7), torch.rand(7).bfloat16()):
        got, want = torch.bincount(x.to("tpu"), w.to("tpu")), torch.bincount(x, w)
        assert got.dtype == want.dtype
        close(got, want)
    u8 = torch.tensor([3, 3, 1], dtype=torch.uint8)
    assert torch.equal(torch.bincount(u8.to("tpu")).cpu(), torch.bincount(u8))
    e = torch.tensor([], dtype=torch.long)
    assert torch.equal(torch.bincount(e.to("tpu"), minlength=4).cpu(), torch.bincount(e, minlength=4))
    assert torch.bincount(e.to("tpu")).shape == (0,)
    # MoE routing: tokens per expert from top-k expert ids.
    ids = torch.randint(0, 8, (64, 2))
    assert torch.equal(torch.bincount(ids.flatten().to("tpu"), minlength=8).cpu(),
                       torch.bincount(ids.flatten(), minlength=8))
    for bad in (torch.tensor([-1, 2]), torch.tensor([[1]]), torch.tensor([1.0])):
        with pytest.raises(RuntimeError, match="1-d non-negative integral"):
            torch.bincount(bad.to("tpu"))
    with pytest.raises(RuntimeError, match="same length as input"):
        torch.bincount(x.to("tpu"), torch.ones(3, device="tpu"))
    with pytest.raises(RuntimeError, match="minlength should be >= 0"):
        torch.bincount(x.to("tpu"), minlength=-1)


def test_take_and_put(mode, no_fallback):
    idx = torch.tensor([[0, 5], [-1, 3], [7, -12]])
    got = X.to("tpu").take(idx.to("tpu"))
    close(got, X.take(idx))
    assert got.shape == (3, 2)
    xt = X.t()  # not contiguous
    close(xt.to("tpu").take(idx.to("tpu")), xt.take(idx))
    # The gradient of take is put_ with accumulation (a repeated index adds).
    rep = torch.tensor([1, 1, 4, -1])
    a = X.clone().requires_grad_()
    b = X.to("tpu").requires_grad_()
    a.take(rep).square().sum().backward()
    b.take(rep.to("tpu")).square().sum().backward()
    close(b.grad, a.grad)
    for acc in (False, True):
        src = torch.tensor([1.0, 2.0, 3.0])
        i = torch.tensor([2, -1, 9])
        for base in (X.clone(), X.t().clone().t()):
            want = base.clone().put_(i, src, accumulate=acc)
            t = base.to("tpu")
            t.put_(i.to("tpu"), src.to("tpu"), accumulate=acc)
            close(t, want)
        close(torch.put(X.to("tpu"), i.to("tpu"), src.to("tpu"), acc), torch.put(X, i, src, acc))
    out = torch.empty(0, device="tpu")
    torch.take(X.to("tpu"), idx.to("tpu"), out=out)
    close(out, X.take(idx))
    assert X.to("tpu").take(torch.zeros(0, 2, dtype=torch.long, device="tpu")).shape == (0, 2)
    with pytest.raises(RuntimeError, match="Expected a long tensor for index"):
        X.to("tpu").take(torch.tensor([1], dtype=torch.int32, device="tpu"))
    with pytest.raises(RuntimeError, match="same number of elements"):
        X.to("tpu").put_(torch.tensor([1, 2], device="tpu"), torch.tensor([1.0], device="tpu"))
    with pytest.raises(RuntimeError, match="empty tensor"):
        torch.empty(0, device="tpu").take(torch.tensor([0], device="tpu"))


def test_eye_clamp_by_tensors_nan_to_num_and_aminmax(mode, no_fallback):
    for args in ((3,), (2, 5), (4, 1), (0,)):
        for dt in (torch.float32, torch.bool, torch.int64, torch.bfloat16):
            got = torch.eye(*args, dtype=dt, device="tpu")
            assert got.device.type == "tpu" and torch.equal(got.cpu(), torch.eye(*args, dtype=dt))
    with pytest.raises(RuntimeError, match="must be greater or equal to 0"):
        torch.eye(-1, device="tpu")
    # clamp with tensor bounds (F.cosine_similarity clamps its norms so),
    # in every form, with gradients.
    lo, hi = torch.full((8,), -0.5), torch.rand(4, 1)
    for f in (lambda x, l, h: torch.clamp(x, l, h), lambda x, l, h: torch.clamp(x, min=l),
              lambda x, l, h: torch.clamp_min(x, l), lambda x, l, h: torch.clamp_max(x, h)):
        a, b = X.clone().requires_grad_(), X.to("tpu").requires_grad_()
        ya, yb = f(a, lo, hi), f(b, lo.to("tpu"), hi.to("tpu"))
        close(yb, ya.detach())
        ya.sum().backward()
        yb.sum().backward()
        close(b.grad, a.grad)
    t = X.to("tpu")
    t.clamp_(lo.to("tpu"), hi.to("tpu"))
    close(t, X.clamp(lo, hi))
    t = X.to("tpu")
    t.clamp_min_(lo.to("tpu"))
    close(t, X.clamp_min(lo))
    out = torch.empty(0, device="tpu")
    torch.clamp(X.to("tpu"), max=hi.to("tpu"), out=out)
    close(out, X.clamp(max=hi))
    u, v = torch.randn(5, 16), torch.randn(5, 16)
    close(torch.nn.functional.cosine_similarity(u.to("tpu"), v.to("tpu")), torch.nn.functional.cosine_similarity(u, v))
    inf, nan = float("inf"), float("nan")
    z = torch.tensor([nan, inf, -inf, 1.5, -0.0])
    for kw in ({}, {"nan": 2.0, "posinf": 9.0}, {"neginf": -1e300}):
        for dt in (torch.float32, torch.float64, torch.bfloat16):
            got, want = torch.nan_to_num(z.to(dt).to("tpu"), **kw), torch.nan_to_num(z.to(dt), **kw)
            assert torch.equal(got.cpu(), want)
    t = z.to("tpu")
    t.nan_to_num_(nan=-7.0)
    assert torch.equal(t.cpu(), z.nan_to_num(nan=-7.0))
    i = torch.tensor([1, -2, 3])
    assert torch.equal(torch.nan_to_num(i.to("tpu")).cpu(), i)
    for kw in ({}, {"dim": 1}, {"dim": 0, "keepdim": True}, {"keepdim": True}):
        got, want = torch.aminmax(X.to("tpu"), **kw), torch.aminmax(X, **kw)
        close(got.min, want.min)
        close(got.max, want.max)
    s = torch.tensor(2.5)
    got = torch.aminmax(s.to("tpu"), dim=0)
    assert got.min.item() == 2.5 and got.max.item() == 2.5
    with pytest.raises(RuntimeError, match="empty"):
        torch.aminmax(torch.zeros(0, device="tpu"))


def test_exponential_geometric_log_normal_and_cauchy(mode, no_fallback):
    torch.manual_seed(4)
    n = 40000
    e = torch.empty(n, device="tpu").exponential_(2.0).cpu()
    assert e.min() > 0 and abs(e.mean().item() - 0.5) < 0.02 and abs(e.std().item() - 0.5) < 0.02
    g = torch.empty(n, device="tpu").geometric_(0.25).cpu()
    assert g.min() >= 1 and torch.equal(g, g.floor()) and abs(g.mean().item() - 4.0) < 0.1
    gi = torch.empty(1000, dtype=torch.long, device="tpu").geometric_(0.5).cpu()
    assert gi.dtype == torch.long and gi.min() >= 1
    ln = torch.empty(n, dtype=torch.float64, device="tpu").log_normal_(0.5, 0.3).cpu()
    assert ln.min() > 0 and abs(ln.log().mean().item() - 0.5) < 0.01 and abs(ln.log().std().item() - 0.3) < 0.01
    c = torch.empty(n, device="tpu").cauchy_(1.0, 2.0).cpu()
    assert abs(c.median().item() - 1.0) < 0.1
    # The quartiles of Cauchy(1, 2) are 1 -+ 2.
    q = torch.quantile(c, torch.tensor([0.25, 0.75]))
    assert torch.allclose(q, torch.tensor([-1.0, 3.0]), atol=0.15), q
    # torch.distributions draw through them.
    assert torch.distributions.Exponential(torch.tensor([3.0], device="tpu")).sample((5,)).device.type == "tpu"
    torch.manual_seed(9)
    a = torch.empty(8, device="tpu").exponential_().cpu()
    torch.manual_seed(9)
    assert torch.equal(torch.empty(8, device="tpu").exponential_().cpu(), a)
    with pytest.raises(RuntimeError, match="lambda > 0.0"):
        torch.empty(3, device="tpu").exponential_(0.0)
    with pytest.raises(RuntimeError, match=r"p to be in \(0, 1\)"):
        torch.empty(3, device="tpu").geometric_(1.0)
    with pytest.raises(RuntimeError, match="std > 0.0"):
        torch.empty(3, device="tpu").log_normal_(0.0, 0.0)


def test_randperm(mode, no_fallback):
    torch.manual_seed(7)
    for n in (1, 5, 1000):
        p = torch.randperm(n, device="tpu")
        assert p.device.type == "tpu" and p.dtype == torch.long
        assert torch.equal(p.cpu().sort().values, torch.arange(n))
    assert torch.randperm(0, device="tpu").shape == (0,)
    p = torch.randperm(40, dtype=torch.int32, device="tpu").cpu()
    assert p.dtype == torch.int32 and torch.equal(p.sort().values, torch.arange(40, dtype=torch.int32))
    # The generator's state gives the permutation; each call advances it.
    torch.manual_seed(11)
    a, b = torch.randperm(30, device="tpu").cpu(), torch.randperm(30, device="tpu").cpu()
    torch.manual_seed(11)
    assert torch.equal(torch.randperm(30, device="tpu").cpu(), a)
    assert not torch.equal(a, b)
    g = torch.Generator(device="tpu").manual_seed(3)
    out = torch.empty(0, dtype=torch.long, device="tpu")
    torch.randperm(12, generator=g, out=out)
    g.manual_seed(3)
    assert torch.equal(torch.randperm(12, generator=g, device="tpu").cpu(), out.cpu())
    # Shuffling a batch on the device: every position of 6 takes each
    # value about equally often over 1200 draws (0.055 is 5.7 standard
    # deviations). Read back 100 at a time: deferred, each read is one
    # program of 100 draws, compiled once (1200 in one would compile for
    # seconds on xla).
    first = torch.cat([torch.stack([torch.randperm(6, device="tpu") for _ in range(100)]).cpu() for _ in range(12)])
    freq = torch.stack([torch.bincount(first[:, i], minlength=6) for i in range(6)]).double() / 1200
    assert torch.all((freq - 1 / 6).abs() < 0.055), freq
    with pytest.raises(RuntimeError, match="negative dimension -1"):
        torch.randperm(-1, device="tpu")


def test_cholesky_equal_and_log_sigmoid(mode, no_fallback):
    torch.manual_seed(2)
    m = torch.randn(3, 5, 5, dtype=torch.float64)
    spd = m @ m.transpose(-1, -2) + 5 * torch.eye(5, dtype=torch.float64)
    close(torch.linalg.cholesky(spd.to("tpu")), torch.linalg.cholesky(spd), tol=1e-10)
    close(torch.linalg.cholesky(spd[0].float().to("tpu"), upper=True), torch.linalg.cholesky(spd[0].float(), upper=True))
    bad = spd.clone()
    bad[1, 2, 2] = -100.0
    L, info = torch.linalg.cholesky_ex(bad.to("tpu"))
    assert info.cpu().tolist() == torch.linalg.cholesky_ex(bad).info.tolist() == [0, 3, 0]
    with pytest.raises(RuntimeError, match="leading minor of order 3 is not positive-definite"):
        torch.linalg.cholesky(bad.to("tpu"))
    with pytest.raises(RuntimeError, match="square matrices"):
        torch.linalg.cholesky(torch.ones(2, 3, device="tpu"))
    # What resize_token_embeddings draws new rows with.
    dist = torch.distributions.MultivariateNormal(torch.zeros(5, device="tpu"),
                                                  covariance_matrix=spd[0].float().to("tpu"))
    assert dist.sample((4,)).shape == (4, 5)

    assert torch.equal(X.to("tpu"), X.to("tpu").clone())
    assert not torch.equal(X.to("tpu"), (X + 1e-3).to("tpu"))
    assert not torch.equal(X.to("tpu"), X[:2].to("tpu"))
    assert torch.equal(torch.empty(0, device="tpu"), torch.empty(0, device="tpu"))

    x = (X * 30).requires_grad_()
    xt = x.detach().to("tpu").requires_grad_()
    close(F.logsigmoid(xt), F.logsigmoid(x))
    F.logsigmoid(xt).sum().backward()
    F.logsigmoid(x).sum().backward()
    close(xt.grad, x.grad)
    target = (Y > 0).float()
    close(F.binary_cross_entropy_with_logits(X.to("tpu"), target.to("tpu")),
          F.binary_cross_entropy_with_logits(X, target))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_index_add_with_repeated_rows_equals_cpu_bit_for_bit(dtype, mode, no_fallback):
    """Sums into one row are computed at f32 and rounded once, as torch's
    CPU kernel does (XLA's scatter rounded after every add: 113 of 128
    elements differed in bf16 on xla)."""
    g = torch.Generator().manual_seed(3)
    src = torch.randn(4096, 8, generator=g).to(dtype)
    idx = torch.randint(0, 16, (4096,), generator=g)
    want = torch.zeros(16, 8, dtype=dtype).index_add_(0, idx, src)
    got = torch.zeros(16, 8, dtype=dtype, device="tpu").index_add_(0, idx.to("tpu"), src.to("tpu"))
    assert torch.equal(got.cpu(), want)


def test_nonzero_histc_index_add_and_cumsum_dtype(mode, no_fallback):
    # What MoE routing uses (transformers' grouped experts path).
    for t in (X > 0.3, torch.zeros(3, 4), torch.tensor(2.0), (torch.randn(2, 3, 4) > 0).int(), torch.empty(0, 3)):
        close(torch.nonzero(t.to("tpu")), torch.nonzero(t))
    close(torch.histc(X.to("tpu"), bins=5, min=-1, max=1), torch.histc(X, bins=5, min=-1, max=1))
    close(torch.histc(X.to("tpu"), bins=7), torch.histc(X, bins=7))
    ids = torch.tensor([0, 3, 3, 1, 7, 3, 0], dtype=torch.int32)
    got = torch.histc(ids.to("tpu"), bins=8, min=0, max=7)
    assert got.dtype == torch.int32
    close(got, torch.histc(ids.float(), bins=8, min=0, max=7).int())
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(X.to("tpu"), bins=0)
    base = torch.zeros(5, 3)
    idx = torch.tensor([4, 0, 4, 2])
    src = torch.arange(12.0).view(4, 3)
    close(base.to("tpu").index_add(0, idx.to("tpu"), src.to("tpu"), alpha=2),
          base.index_add(0, idx, src, alpha=2))
    col = torch.zeros(3, 4)
    t = col.to("tpu")
    t.index_add_(1, torch.tensor([1, 1]).to("tpu"), torch.ones(3, 2).to("tpu"))
    close(t, col.index_add(1, torch.tensor([1, 1]), torch.ones(3, 2)))
    counts = torch.tensor([3, 0, 2], dtype=torch.int64)
    got = torch.cumsum(counts.to("tpu"), 0, dtype=torch.int32)
    assert got.dtype == torch.int32
    close(got, torch.cumsum(counts, 0, dtype=torch.int32))
    close(torch.cumprod(counts.to("tpu") + 1, 0, dtype=torch.int32), torch.cumprod(counts + 1, 0, dtype=torch.int32))


def test_roll_and_unique_consecutive(mode, no_fallback):
    close(torch.roll(X.to("tpu"), 3, 1), torch.roll(X, 3, 1))
    close(torch.roll(X.to("tpu"), (-1, 10), (0, 1)), torch.roll(X, (-1, 10), (0, 1)))
    close(torch.roll(X.to("tpu"), 5), torch.roll(X, 5))
    close(torch.roll(X.to("tpu"), 0, 1), torch.roll(X, 0, 1))
    t = torch.tensor([[1, 1, 2], [2, 2, 3], [1, 1, 1]])
    for out, ref in zip(torch.unique_consecutive(t.to("tpu"), return_inverse=True, return_counts=True),
                        torch.unique_consecutive(t, return_inverse=True, return_counts=True)):
        close(out, ref)
    # The check transformers' sequence classification heads make on EOS counts.
    close(torch.unique_consecutive(torch.tensor([1, 1, 1]).to("tpu")), torch.tensor([1]))
    close(torch.unique_consecutive(torch.empty(0).to("tpu")), torch.empty(0))


@pytest.mark.parametrize("align_corners", [False, True])
def test_bicubic_upsampling_and_sgn(align_corners, mode, no_fallback):
    # ViT's and CLIP's interpolate_pos_encoding; sgn is in L1 loss's backward.
    img = torch.randn(2, 3, 5, 7, dtype=torch.float64)
    for kw in ({"size": (9, 4)}, {"scale_factor": (1.5, 0.75)}):
        x = img.clone().requires_grad_()
        xt = img.to("tpu").requires_grad_()
        ref = F.interpolate(x, mode="bicubic", align_corners=align_corners, **kw)
        out = F.interpolate(xt, mode="bicubic", align_corners=align_corners, **kw)
        close(out, ref, tol=1e-10)
        g = torch.randn(ref.shape, dtype=torch.float64)
        ref.backward(g)
        out.backward(g.to("tpu"))
        close(xt.grad, x.grad, tol=1e-10)
    close(torch.sgn(X.to("tpu")), torch.sgn(X))
    y = X.clone().requires_grad_()
    yt = X.to("tpu").requires_grad_()
    F.l1_loss(yt, Y.to("tpu")).backward()
    F.l1_loss(y, Y).backward()
    close(yt.grad, y.grad)


@pytest.mark.parametrize("interp", ["bilinear", "bicubic"])
def test_antialiased_resizing(interp, mode, no_fallback):
    # torchvision's resize(antialias=True), which transformers' fast image
    # processors run on the model's device; downscaling stretches the
    # filter over every source under the output.
    img = torch.randn(2, 3, 23, 17, dtype=torch.float64)
    for align in (False, True):
        for kw in ({"size": (7, 5)}, {"size": (9, 40)}, {"scale_factor": (0.3, 1.0)}):
            x = img.clone().requires_grad_()
            xt = img.to("tpu").requires_grad_()
            ref = F.interpolate(x, mode=interp, antialias=True, align_corners=align, **kw)
            out = F.interpolate(xt, mode=interp, antialias=True, align_corners=align, **kw)
            close(out, ref, tol=1e-10)
            g = torch.randn(ref.shape, dtype=torch.float64)
            ref.backward(g)
            out.backward(g.to("tpu"))
            close(xt.grad, x.grad, tol=1e-10)
    x32 = img.float()
    ref = F.interpolate(x32, size=(6, 11), mode=interp, antialias=True)
    close(F.interpolate(x32.to("tpu"), size=(6, 11), mode=interp, antialias=True), ref, tol=1e-6)


def test_ndtri_and_zeta(mode, no_fallback):
    # Debug mode refuses an inf or NaN made from finite inputs.
    nan_ok = mode != torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    p = torch.tensor([1e-300, 1e-20, 0.01, 0.3, 0.5, 0.5 + 1e-12, 0.9, 1.0 - 1e-12], dtype=torch.float64)
    if nan_ok:
        p = torch.cat([p, torch.tensor([0.0, 1.0, -0.5, 1.5], dtype=torch.float64)])
    close_nan(torch.special.ndtri(p.to("tpu")), torch.special.ndtri(p), tol=1e-13)
    p32 = torch.rand(200) * (1.2 if nan_ok else 1.0) - (0.1 if nan_ok else 0.0)
    close_nan(torch.special.ndtri(p32.to("tpu")), torch.special.ndtri(p32), tol=2e-6)
    if nan_ok:
        pi = torch.tensor([0, 1])
        close(torch.special.ndtri(pi.to("tpu")), torch.special.ndtri(pi))
    pg = torch.rand(7, dtype=torch.float64).requires_grad_()
    pgt = pg.detach().to("tpu").requires_grad_()
    torch.special.ndtri(pg).sum().backward()
    torch.special.ndtri(pgt).sum().backward()
    close(pgt.grad, pg.grad, tol=1e-10)
    x = torch.rand(6, 9, dtype=torch.float64) * 30 + 1.01
    q = torch.rand(6, 9, dtype=torch.float64) * 50 + 0.01
    close(torch.special.zeta(x.to("tpu"), q.to("tpu")), torch.special.zeta(x, q), tol=1e-12)
    close(torch.special.zeta(x.float().to("tpu"), 2.0), torch.special.zeta(x.float(), 2.0), tol=2e-6)
    edge_x = torch.tensor([2.0] + ([1.0, 2.0, 3.0, 0.5, 2.5] if nan_ok else []))
    edge_q = torch.tensor([-2.5] + ([3.0, -4.0, 0.0, 3.0, -1.5] if nan_ok else []))
    close_nan(torch.special.zeta(edge_x.to("tpu"), edge_q.to("tpu")), torch.special.zeta(edge_x, edge_q), tol=1e-5)


def test_gcd_and_lcm(mode, no_fallback):
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-10**6, 10**6, (40,), generator=g)
    b = torch.randint(-3000, 3000, (40,), generator=g)
    b[:3] = 0
    a[1] = 0
    fib = torch.tensor([7540113804746346429, 4660046610375530309])
    close(torch.gcd(a.to("tpu"), b.to("tpu")), torch.gcd(a, b))
    close(torch.gcd(fib.to("tpu"), fib.flip(0).to("tpu")), torch.gcd(fib, fib.flip(0)))
    close(torch.lcm(a.to("tpu"), b.to("tpu")), torch.lcm(a, b))
    close(torch.gcd(a.int().to("tpu"), torch.tensor(12, dtype=torch.int32).to("tpu")), torch.gcd(a.int(), torch.tensor(12, dtype=torch.int32)))
    u = torch.randint(0, 256, (30,), generator=g, dtype=torch.uint8)
    close(torch.gcd(u.to("tpu"), u.flip(0).to("tpu")), torch.gcd(u, u.flip(0)))
    # (StableHLO's abs and sign take signed integers only: uint8's were
    # refused on xla.)
    close(torch.abs(u.to("tpu")), torch.abs(u))
    close(torch.sign(u.to("tpu")), torch.sign(u))
    x = a.clone().to("tpu")
    x.gcd_(b.to("tpu"))
    close(x, torch.gcd(a, b))


def test_unsupported_op_with_the_fallback_off_names_the_op(no_fallback):
    with pytest.raises(NotImplementedError, match="airy_ai"):
        torch.special.airy_ai(torch.zeros(3, device="tpu"))


def test_fallback_on_runs_on_cpu_and_is_counted():
    torch.tpu.enable_cpu_fallback(True)
    torch.tpu.reset_fallback_stats()
    x = torch.tensor([0.0, 0.5, -0.5])
    out = torch.special.airy_ai(x.to("tpu"))
    assert out.device.type == "tpu"
    close(out, torch.special.airy_ai(x))
    assert torch.tpu.fallback_stats() == {"special_airy_ai.out": 1}


def test_convolution_forward_and_backward(mode, no_fallback):
    torch.manual_seed(4)
    for conv in (torch.nn.Conv2d(3, 6, 3, stride=2, padding=1, groups=3), torch.nn.Conv1d(4, 2, 5, dilation=2)):
        x = torch.randn(2, conv.in_channels, *([11] * (conv.weight.dim() - 2)), requires_grad=True)
        dev = type(conv)(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                         padding=conv.padding, dilation=conv.dilation, groups=conv.groups).to("tpu")
        dev.load_state_dict(conv.state_dict())
        xt = x.detach().to("tpu").requires_grad_()
        ref, out = conv(x), dev(xt)
        close(out, ref.detach(), tol=1e-5)
        ref.square().sum().backward()
        out.square().sum().backward()
        close(xt.grad, x.grad, tol=1e-4)
        close(dev.weight.grad, conv.weight.grad, tol=1e-4)
        close(dev.bias.grad, conv.bias.grad, tol=1e-4)


@pytest.mark.parametrize(
    "shape,kwargs",
    [
        ((2, 3, 9, 8), dict(kernel_size=3, stride=2, padding=1)),
        ((2, 3, 9, 8), dict(kernel_size=(2, 3), stride=(1, 2), dilation=(2, 1), ceil_mode=True)),
        ((3, 7, 6), dict(kernel_size=2)),  # unbatched 2-D
        ((2, 4, 11), dict(kernel_size=(3,), stride=(2,), padding=(1,))),  # 1-D
        ((1, 2, 5, 6, 7), dict(kernel_size=(2, 2, 3), stride=(1, 2, 2), ceil_mode=True)),  # 3-D
    ],
)
def test_max_pool_forward_indices_and_backward(mode, no_fallback, shape, kwargs):
    """nn.functional.max_pool{1,2,3}d (and torch.tpu.ops.max_pool) run the
    runtime's op: CPU's values, indices and gradients bit for bit (NaN and
    -inf included; bf16 grads of overlapping windows rounded sum by sum in
    torch's order), in f32 and bf16."""
    g = torch.Generator().manual_seed(len(shape))
    x = torch.randn(*shape, generator=g)
    x.view(-1)[3] = float("nan")
    x.view(-1)[7] = float("-inf")
    for dt in (torch.float32, torch.bfloat16):
        xc = x.to(dt).clone().requires_grad_()
        xt = x.to(dt).to("tpu").requires_grad_()
        ref, ref_i = torch.tpu.ops.max_pool(xc, return_indices=True, **kwargs)
        out, out_i = torch.tpu.ops.max_pool(xt, return_indices=True, **kwargs)
        assert out.dtype == dt and out.shape == ref.shape
        torch.testing.assert_close(out.cpu(), ref.detach(), rtol=0, atol=0, equal_nan=True)
        assert torch.equal(out_i.cpu(), ref_i)
        grad = torch.randn(ref.shape, generator=g).to(dt)
        ref.backward(grad)
        out.backward(grad.to("tpu"))
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=0, atol=0)


@pytest.mark.parametrize(
    "n,shape,kwargs",
    [
        (2, (2, 3, 9, 8), dict(kernel_size=3, stride=2, padding=1)),
        (2, (2, 3, 9, 8), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
        (2, (2, 3, 9, 8), dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0), divisor_override=5)),
        (2, (3, 7, 6), dict(kernel_size=2)),  # unbatched
        (1, (2, 4, 11), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
        (3, (1, 2, 5, 6, 7), dict(kernel_size=(2, 2, 3), stride=(1, 2, 2), ceil_mode=True)),
        (2, (2, 3, 10, 10), dict(kernel_size=2, stride=3, padding=1, ceil_mode=True, count_include_pad=False)),
    ],
)
def test_avg_pool_forward_and_backward(mode, no_fallback, n, shape, kwargs):
    """nn.functional.avg_pool{1,2,3}d run the runtime's op: CPU's values and
    gradients bit for bit in f32 and bf16 (sums in torch's order, the bf16
    shares of overlapping windows added and rounded in output order),
    count_include_pad, divisor_override and ceil_mode's windows that lie
    in the padding included."""
    pool = getattr(torch.nn.functional, f"avg_pool{n}d")
    _check_average_pooling(lambda x: pool(x, **kwargs), n, shape, seed=len(shape) + len(kwargs))


def _check_average_pooling(pool, n, shape, seed, global_mean=False, upsampled=False):
    """`pool` on tpu against CPU in f32 and bf16, values and gradients, bit
    for bit except where said. torch's CPU has no bf16 avg_pool3d and adds
    adaptive_avg_pool3d's bf16 sums in bf16 (its CUDA kernels add at f32,
    as the runtime does), so 3-D bf16 is checked against the f32 results
    rounded (values) or within bf16's precision (gradients). A 1 x 1
    adaptive pooling is aten's mean (the runtime's mean sums more
    precisely than torch's: within f32's rounding). XLA turns a division
    by a constant into a product with its reciprocal, so on xla averages
    are within an f32 rounding of torch's (sums are exact)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    host = torch.tpu.platform() == "host"
    exact = dict(rtol=0, atol=0) if host else dict(rtol=2.4e-7, atol=1e-7)
    for dt in (torch.float32, torch.bfloat16):
        via_f32 = n == 3 and dt == torch.bfloat16
        xc = x.to(dt).clone()
        if via_f32:
            xc = xc.float()
        xc.requires_grad_()
        xt = x.to(dt).to("tpu").requires_grad_()
        ref, out = pool(xc), pool(xt)
        assert out.dtype == dt and out.shape == ref.shape
        near = dict(rtol=1.6e-2, atol=1e-2)
        ulps = near if dt == torch.bfloat16 and not host else exact
        value_tol = (near if dt == torch.bfloat16 else dict(rtol=2e-6, atol=1e-7)) if global_mean else ulps
        torch.testing.assert_close(out.cpu(), ref.detach().to(dt), **value_tol)
        grad = torch.randn(ref.shape, generator=g).to(dt)
        ref.backward(grad.to(ref.dtype))
        out.backward(grad.to("tpu"))
        grad_tol = near if via_f32 or (dt == torch.bfloat16 and upsampled) else ulps
        torch.testing.assert_close(xt.grad.cpu(), xc.grad.to(dt), **grad_tol)


@pytest.mark.parametrize(
    "n,shape,size",
    [
        (2, (2, 3, 9, 8), (4, 3)),  # uneven bins, overlapping by one
        (2, (2, 3, 9, 8), (3, 4)),  # even bins
        (2, (3, 9, 8), (5, 7)),  # unbatched
        (1, (2, 4, 11), 4),
        (3, (1, 2, 5, 6, 7), (3, 4, 2)),
        (2, (2, 3, 6, 5), (9, 8)),  # more outputs than inputs
        (2, (2, 3, 9, 8), 1),  # global: aten takes the mean
    ],
)
def test_adaptive_avg_pool_forward_and_backward(mode, no_fallback, n, shape, size):
    """nn.functional.adaptive_avg_pool{1,2,3}d run the runtime's op: CPU's
    values and gradients bit for bit in f32 and bf16 (bf16 grads of bins
    that start together, with more outputs than inputs, within bf16's
    rounding: torch rounds each sum, one scatter adds them at f32)."""
    pool = getattr(torch.nn.functional, f"adaptive_avg_pool{n}d")
    outs = (size,) * n if isinstance(size, int) else size
    _check_average_pooling(lambda x: pool(x, size), n, shape, seed=len(shape) * 7,
                           global_mean=set(outs) == {1},
                           upsampled=any(o > i for o, i in zip(outs, shape[-n:])))


@pytest.mark.parametrize(
    "shape,kwargs",
    [
        ((2, 3, 5, 7), dict(size=(9, 4), mode="nearest")),
        ((2, 3, 5, 7), dict(scale_factor=2.3, mode="nearest")),
        ((2, 3, 5, 7), dict(size=(10, 14), mode="nearest")),  # twice: aten's shift
        ((2, 3, 5, 7), dict(scale_factor=(2.3, 0.6), mode="nearest-exact")),
        ((2, 4, 11), dict(size=17, mode="nearest")),
        ((1, 2, 3, 4, 5), dict(size=(6, 8, 3), mode="nearest-exact")),
        ((2, 3, 5, 7), dict(size=(9, 11), mode="bilinear")),
        ((2, 3, 5, 7), dict(size=(9, 11), mode="bilinear", align_corners=True)),
        ((2, 3, 5, 7), dict(scale_factor=(2.3, 2.4), mode="bilinear")),
        ((2, 3, 8, 8), dict(size=(3, 5), mode="bilinear")),  # down
        ((2, 4, 11), dict(size=17, mode="linear", align_corners=True)),
        ((1, 2, 3, 4, 5), dict(size=(6, 8, 3), mode="trilinear")),
    ],
)
def test_interpolate_forward_and_backward(mode, no_fallback, shape, kwargs):
    """nn.functional.interpolate's nearest, nearest-exact, linear, bilinear
    and trilinear run the runtime's upsample ops (they went to the CPU
    fallback), sizes and scale factors, up and down: nearest picks CPU's
    elements and its gradients add as CPU's, bit for bit; linear modes
    are within f32's rounding of CPU's (the weights are torch's formulas
    in f32, but torch's kernels round some steps differently), in f32 and
    bf16, forward and backward."""
    g = torch.Generator().manual_seed(len(shape) + len(kwargs))
    x = torch.randn(*shape, generator=g)
    nearest = kwargs["mode"].startswith("nearest")
    for dt in (torch.float32, torch.bfloat16):
        xc = x.to(dt).clone().requires_grad_()
        xt = x.to(dt).to("tpu").requires_grad_()
        ref = torch.nn.functional.interpolate(xc, **kwargs)
        out = torch.nn.functional.interpolate(xt, **kwargs)
        assert out.dtype == dt and out.shape == ref.shape
        grad = torch.randn(ref.shape, generator=g).to(dt)
        ref.backward(grad)
        out.backward(grad.to("tpu"))
        if nearest:
            tol = dict(rtol=0, atol=0)
        elif dt == torch.float32:
            tol = dict(rtol=1e-5, atol=3e-6)
        else:
            tol = dict(rtol=1.6e-2, atol=1.6e-2)
        torch.testing.assert_close(out.cpu(), ref.detach(), **tol)
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, **tol)


def test_interpolate_nearest_keeps_integers_and_errors_name_the_problem(no_fallback):
    x = torch.arange(2 * 3 * 4, dtype=torch.uint8).view(1, 2, 3, 4)
    out = torch.nn.functional.interpolate(x.to("tpu"), size=(5, 7), mode="nearest")
    assert torch.equal(out.cpu(), torch.nn.functional.interpolate(x, size=(5, 7), mode="nearest"))
    with pytest.raises(RuntimeError, match="floating-point"):
        torch.ops.aten.upsample_bilinear2d(torch.ones(1, 1, 2, 2, dtype=torch.long, device="tpu"), [4, 4], False)
    with pytest.raises(RuntimeError, match="positive"):
        torch.ops.aten.upsample_nearest2d(torch.ones(1, 1, 2, 2, device="tpu"), [0, 4])


@pytest.mark.parametrize(
    "shape,pad,pad_mode",
    [
        ((2, 3, 10), (3, 2), "reflect"),
        ((2, 3, 5, 6), (2, 4, 3, 0), "reflect"),
        ((1, 2, 3, 4, 5), (1, 2, 2, 1, 0, 2), "reflect"),
        ((2, 3, 10), (0, 5), "replicate"),
        ((2, 3, 5, 6), (2, 4, 3, 1), "replicate"),
        ((3, 5, 6), (1, 1, 7, 2), "replicate"),  # unbatched
        ((1, 2, 3, 4, 5), (1, 2, 2, 1, 0, 2), "replicate"),
        ((2, 3, 5, 6), (2, 4, 3, 1), "circular"),
    ],
)
def test_reflect_replicate_and_circular_pads_forward_and_backward(mode, no_fallback, shape, pad, pad_mode):
    """F.pad's reflect and replicate modes run the runtime's pad (aten's
    reflection_pad{1,2,3}d and replication_pad{1,2,3}d went to the CPU
    fallback), circular through aten's slices: CPU's values bit for bit and
    its gradients in f32 bit for bit; bf16 gradients are CPU's f32 ones
    rounded, bit for bit (the runtime adds a position's grads at f32 and
    rounds once; torch's bf16 kernel rounds every sum; circular is aten's
    slices and adds, op by op as on CPU)."""
    g = torch.Generator().manual_seed(len(shape) + sum(pad))
    x = torch.randn(*shape, generator=g)
    for dt in (torch.float32, torch.bfloat16):
        xc = x.to(dt).clone().requires_grad_()
        xt = x.to(dt).to("tpu").requires_grad_()
        ref = torch.nn.functional.pad(xc, pad, mode=pad_mode)
        out = torch.nn.functional.pad(xt, pad, mode=pad_mode)
        assert out.dtype == dt and out.shape == ref.shape
        torch.testing.assert_close(out.cpu(), ref.detach(), rtol=0, atol=0)
        grad = torch.randn(ref.shape, generator=g).to(dt)
        ref.backward(grad)
        out.backward(grad.to("tpu"))
        want = xc.grad
        if dt == torch.bfloat16 and pad_mode != "circular":
            wide = xc.detach().float().requires_grad_()
            torch.nn.functional.pad(wide, pad, mode=pad_mode).backward(grad.float())
            want = wide.grad.to(dt)
        torch.testing.assert_close(xt.grad.cpu(), want, rtol=0, atol=0)


def test_pad_modes_errors_name_the_problem(no_fallback):
    x = torch.randn(1, 2, 4, device="tpu")
    with pytest.raises(RuntimeError, match="less than the dim's size"):
        torch.nn.functional.pad(x, (4, 0), mode="reflect")
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.ops.aten.replication_pad1d(x, [-1, 0])


@pytest.mark.parametrize(
    "make,shape",
    [
        (lambda: torch.nn.BatchNorm2d(3, momentum=0.2), (4, 3, 5, 6)),
        (lambda: torch.nn.BatchNorm1d(4), (8, 4)),
        (lambda: torch.nn.BatchNorm1d(4), (8, 4, 3)),
        (lambda: torch.nn.BatchNorm3d(2, affine=False), (2, 2, 3, 4, 5)),
        (lambda: torch.nn.BatchNorm2d(3, track_running_stats=False), (4, 3, 5, 6)),
    ],
)
@pytest.mark.parametrize("train", [True, False])
def test_batch_norm_forward_backward_and_running_stats(mode, no_fallback, make, shape, train):
    """BatchNorm{1,2,3}d run the runtime's batch_norm (native_batch_norm
    and its backward went to the CPU fallback): outputs, input, weight and
    bias gradients and the running stats moved in place (training) within
    f32's rounding of CPU's, in training and evaluation, affine or not,
    with and without running stats; bf16 inputs within bf16's."""
    torch.manual_seed(len(shape))
    for dt in (torch.float32, torch.bfloat16):
        ref = make()
        with torch.no_grad():
            if ref.running_var is not None:
                ref.running_mean.uniform_(-1, 1)
                ref.running_var.uniform_(0.5, 2)
            if ref.weight is not None:
                ref.weight.uniform_(0.5, 1.5)
                ref.bias.uniform_(-0.5, 0.5)
        dev = make().to("tpu")
        dev.load_state_dict(ref.state_dict())
        ref.train(train)
        dev.train(train)
        x = (torch.randn(*shape) * 2 + 0.5).to(dt)
        xc = x.clone().requires_grad_()
        xt = x.to("tpu").requires_grad_()
        with torch.autocast("cpu", enabled=False):
            r = ref(xc.float()).to(dt) if dt != torch.float32 else ref(xc)
        o = dev(xt)
        assert o.dtype == dt and o.shape == r.shape
        tol = dict(rtol=1e-5, atol=2e-6) if dt == torch.float32 else dict(rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(o.cpu(), r.detach(), **tol)
        g = torch.randn(r.shape).to(dt)
        r.backward(g)
        o.backward(g.to("tpu"))
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, **tol)
        if ref.weight is not None:
            torch.testing.assert_close(dev.weight.grad.cpu(), ref.weight.grad, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(dev.bias.grad.cpu(), ref.bias.grad, rtol=1e-4, atol=1e-4)
        if ref.running_var is not None:
            torch.testing.assert_close(dev.running_mean.cpu(), ref.running_mean, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(dev.running_var.cpu(), ref.running_var, rtol=1e-5, atol=1e-6)
            assert int(dev.num_batches_tracked) == int(ref.num_batches_tracked)


@pytest.mark.parametrize(
    "make,shape",
    [
        (lambda: torch.nn.GroupNorm(3, 6), (4, 6, 5, 3)),
        (lambda: torch.nn.GroupNorm(2, 4, affine=False), (3, 4, 7)),
        (lambda: torch.nn.GroupNorm(1, 8), (2, 8)),
    ],
)
def test_group_norm_forward_and_backward(mode, no_fallback, make, shape):
    """GroupNorm runs natively forward (aten's composite over var_mean)
    and backward (native_group_norm_backward went to the CPU fallback):
    CPU's outputs and input, weight and bias gradients within f32's
    rounding; bf16 inputs within bf16's."""
    torch.manual_seed(len(shape))
    for dt in (torch.float32, torch.bfloat16):
        ref = make()
        with torch.no_grad():
            if ref.weight is not None:
                ref.weight.uniform_(0.5, 1.5)
                ref.bias.uniform_(-0.5, 0.5)
        dev = make().to("tpu")
        dev.load_state_dict(ref.state_dict())
        ref, dev = ref.to(dt), dev.to(dt)
        x = (torch.randn(*shape) * 2 + 0.5).to(dt)
        xc = x.clone().requires_grad_()
        xt = x.to("tpu").requires_grad_()
        r, o = ref(xc), dev(xt)
        tol = dict(rtol=1e-5, atol=3e-6) if dt == torch.float32 else dict(rtol=2e-2, atol=3e-2)
        torch.testing.assert_close(o.cpu(), r.detach(), **tol)
        g = torch.randn(r.shape).to(dt)
        r.backward(g)
        o.backward(g.to("tpu"))
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, **tol)
        if ref.weight is not None:
            wtol = dict(rtol=1e-4, atol=1e-4) if dt == torch.float32 else dict(rtol=3e-2, atol=1e-1)
            torch.testing.assert_close(dev.weight.grad.cpu(), ref.weight.grad, **wtol)
            torch.testing.assert_close(dev.bias.grad.cpu(), ref.bias.grad, **wtol)


def test_var_mean_is_native(no_fallback):
    x = torch.randn(4, 5, 6)
    for kw in (dict(dim=1), dict(dim=(0, 2), correction=0, keepdim=True), dict()):
        v, m = torch.var_mean(x.to("tpu"), **kw)
        rv, rm = torch.var_mean(x, **kw)
        torch.testing.assert_close(v.cpu(), rv, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(m.cpu(), rm, rtol=1e-5, atol=1e-6)


def test_avg_pool_errors_name_the_problem(no_fallback):
    x = torch.randn(1, 2, 5, 5, device="tpu")
    with pytest.raises(RuntimeError, match="at most half"):
        torch.nn.functional.avg_pool2d(x, 2, padding=2)
    with pytest.raises(RuntimeError, match="divisor_override"):
        torch.nn.functional.avg_pool2d(x, 2, divisor_override=0)
    with pytest.raises(RuntimeError, match="floating-point"):
        torch.nn.functional.avg_pool2d(torch.ones(1, 4, 4, dtype=torch.long, device="tpu"), 2)


def test_max_pool_errors_name_the_problem(no_fallback):
    x = torch.randn(1, 2, 5, 5, device="tpu")
    with pytest.raises(RuntimeError, match="at most half"):
        torch.nn.functional.max_pool2d(x, 2, padding=2)
    with pytest.raises(RuntimeError, match="too small"):
        torch.nn.functional.max_pool2d(x, 6)
    with pytest.raises(ValueError, match="1, 2 or 3 spatial dims"):
        torch.tpu.ops.max_pool(x, (2, 2, 2, 2))


def test_rms_norm_forward_and_backward(mode, no_fallback):
    """torch's rms_norm (F.rms_norm, nn.RMSNorm) runs `_fused_rms_norm` and
    its backward natively: CPU's values and gradients, with and without a
    weight, over one and two dims, default and given eps, a strided input,
    bf16."""
    torch.manual_seed(5)
    cases = [
        (torch.randn(4, 6, 16), (16,), torch.randn(16), 1e-6),
        (torch.randn(3, 5, 8), (5, 8), None, None),
        (torch.randn(16, 6).t(), (16,), torch.randn(16), 1e-5),
    ]
    for x, shape, w, eps in cases:
        xr = x.clone().requires_grad_()
        wr = w.clone().requires_grad_() if w is not None else None
        xt = x.to("tpu").requires_grad_()
        if not x.is_contiguous():
            xt = x.t().contiguous().to("tpu").t().detach().requires_grad_()
        wt = w.to("tpu").requires_grad_() if w is not None else None
        ref, out = F.rms_norm(xr, shape, wr, eps), F.rms_norm(xt, shape, wt, eps)
        close(out, ref.detach())
        g = torch.randn_like(ref)
        ref.backward(g)
        out.backward(g.to("tpu"))
        close(xt.grad, xr.grad, tol=1e-4)
        if w is not None:
            close(wt.grad, wr.grad, tol=1e-4)
    m = torch.nn.RMSNorm(32)
    x = torch.randn(2, 7, 32, dtype=torch.bfloat16)
    out = m.to("tpu", torch.bfloat16)(x.to("tpu"))
    ref = F.rms_norm(x.float(), (32,), m.weight.detach().float().cpu()).bfloat16()
    close(out.detach(), ref, tol=2e-2)


def test_rms_norm_is_one_op_each_way():
    """Strict mode launches one task forward and one backward, where torch's
    composite would launch six forward."""
    x = torch.randn(8, 64, device="tpu", requires_grad=True)
    w = torch.randn(64, device="tpu", requires_grad=True)
    torch.tpu.synchronize()
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER):
        with torch.tpu.profiler.profile() as prof:
            y = F.rms_norm(x, (64,), w, 1e-6)
            y.backward(torch.ones_like(y))
            torch.tpu.synchronize()
    names = [a.key for a in prof.key_averages("task")]
    assert names.count("fused_rms_norm") == 1 and names.count("fused_rms_norm_backward") == 1, names
    assert not {"pow", "rsqrt", "mean"} & set(names), names


ADVANCED_READS = {
    "rows": lambda a: a[torch.tensor([2, 0])],
    "inner_2d_index": lambda a: a[:, torch.tensor([[1, 3], [0, 0]])],
    "split_dims": lambda a: a[torch.tensor([0, 2]), :, torch.tensor([4, -1])],
    "adjacent_inner_dims": lambda a: a[:, torch.tensor([1]), torch.tensor([2, 3])],
    "bool_mask": lambda a: a[a > 30],
    "bool_rows": lambda a: a[torch.tensor([True, False, True])],
}


@pytest.mark.parametrize("name", sorted(ADVANCED_READS))
def test_advanced_indexing_reads(name, mode, no_fallback):
    x = torch.arange(60.0).reshape(3, 4, 5)
    close(ADVANCED_READS[name](x.to("tpu")), ADVANCED_READS[name](x))


def test_advanced_indexing_writes(mode, no_fallback):
    x = torch.arange(60.0).reshape(3, 4, 5)
    outs = []
    for a in (x.clone(), x.to("tpu")):
        a[torch.tensor([0, 2]), :, torch.tensor([1, 1])] = -1.0  # split indexed dims
        a[:, torch.tensor([1, 3]), torch.tensor([0, 4])] = torch.tensor([7.0, 8.0])  # adjacent, moved
        a[a > 50] = 0  # a bool mask
        a.index_put_((torch.tensor([1, 1]),), torch.ones(4, 5), accumulate=True)
        a.index_copy_(1, torch.tensor([2]), torch.full((3, 1, 5), 9.0))
        outs.append(a.cpu())
    assert torch.equal(outs[1], outs[0])


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32,
     torch.int8, torch.uint8, torch.bool],
    ids=str,
)
def test_zero_writes_only_its_view(mode, no_fallback, dtype):
    # zero_ records the runtime's `full` (a constant) into the tensor it is
    # given: a transposed view, a strided slice and a whole tensor, every
    # dtype, and the elements outside the view keep their values.
    base = (torch.arange(1, 49).reshape(4, 12) % 7 + 1).to(dtype)
    t = base.to("tpu")
    t.t()[2:9:3].zero_()
    t[1, ::5].zero_()
    z = torch.zeros_like(t)
    want = base.clone()
    want.t()[2:9:3].zero_()
    want[1, ::5].zero_()
    assert torch.equal(t.cpu(), want)
    assert z.dtype == dtype and not z.cpu().any()


def test_gradient_of_a_tensor_sliced_in_two(mode, no_fallback):
    # rotate_half's backward: zeros updated in each half (slice_backward),
    # then summed; under DEFER_AND_FUSE one concatenation of the halves'
    # gradients. Every element's gradient arrives once.
    x = torch.arange(-6.0, 6.0).reshape(2, 6).to("tpu").requires_grad_()
    w = torch.arange(1.0, 13.0).reshape(2, 6)
    rot = torch.cat((-x[:, 3:], x[:, :3]), dim=1)
    (rot * w.to("tpu")).sum().backward()
    assert torch.equal(x.grad.cpu(), torch.cat((w[:, 3:], -w[:, :3]), dim=1))


NAN = float("nan")


def close_nan(out, ref, tol=1e-5):
    """close, NaN equal to NaN."""
    out = out.cpu()
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol, equal_nan=True)


def _pair(out, ref, tol=1e-5):
    assert len(out) == len(ref)
    for o, r in zip(out, ref):
        close_nan(o, r, tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_kthvalue_median_and_nanmedian(dtype, mode, no_fallback):
    """Values and indices as CPU's (the inputs have no ties, where torch's
    index is unspecified), NaN rows included."""
    g = torch.Generator().manual_seed(11)
    x = torch.randperm(35, generator=g).view(5, 7).to(dtype)
    if dtype.is_floating_point:
        x[1, 2] = NAN
        x[3, 0] = NAN
        x[3, 5] = NAN
        x[4, :] = NAN
    xt = x.to("tpu")

    def picks(x, dim, keep, out, ref):
        """Values as torch's; the index points at the value (among NaNs,
        as among equal values, torch's index is unspecified)."""
        v, i = out
        close_nan(v, ref.values)
        picked = torch.gather(x, dim, i.cpu() if keep else i.cpu().unsqueeze(dim))
        close_nan(picked if keep else picked.squeeze(dim), v.cpu())

    for k, dim, keep in ((1, 1, False), (4, -1, True), (3, 0, False), (7, 1, False)):
        picks(x, dim, keep, torch.kthvalue(xt, k, dim, keep), torch.kthvalue(x, k, dim, keep))
    for dim, keep in ((1, False), (0, True)):
        _pair(torch.median(xt, dim, keep), torch.median(x, dim, keep))  # a row's first NaN, as torch
        picks(x, dim, keep, torch.nanmedian(xt, dim, keep), torch.nanmedian(x, dim, keep))
    close_nan(torch.median(xt), torch.median(x))
    close_nan(torch.nanmedian(xt), torch.nanmedian(x))
    close_nan(torch.median(xt[0]), torch.median(x[0]))
    v, i = torch.median(xt[0, :6], 0)  # even: the lower of the two middle values
    _pair((v, i), torch.median(x[0, :6], 0))
    # Ties: the index is one of the equal elements'.
    t = torch.tensor([[2, 1, 2, 1, 2], [5, 5, 5, 5, 5]]).to(dtype)
    v, i = torch.median(t.to("tpu"), 1)
    close(v, torch.median(t, 1).values)
    close(torch.gather(t, 1, i.cpu().unsqueeze(1)).squeeze(1), v.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_mode_matches_cpu(dtype, mode, no_fallback):
    """torch.mode: the smallest of the most frequent values and the index
    of its last occurrence, as torch's CPU kernel (many ties here); its
    gradient flows to that index. (No NaN: torch's kernel sorts with <,
    so what it answers for a NaN depends on where the NaN stood; ours
    counts each NaN once, NaN sorting last: the op library's tests.)"""
    g = torch.Generator().manual_seed(12)
    x = torch.randint(0, 4, (6, 9), generator=g).to(dtype)
    xt = x.to("tpu")
    for dim, keep in ((1, False), (0, True), (-1, True)):
        _pair(torch.mode(xt, dim, keep), torch.mode(x, dim, keep))
    _pair(torch.mode(xt[0, 0]), torch.mode(x[0, 0]))
    if dtype == torch.float32:
        a, b = x.clone().requires_grad_(), xt.clone().requires_grad_()
        torch.mode(a, 1).values.sum().backward()
        torch.mode(b, 1).values.sum().backward()
        close(b.grad, a.grad)
    with pytest.raises(RuntimeError, match="non-zero size"):
        torch.mode(torch.empty(3, 0, device="tpu"), 1)


def test_kthvalue_median_errors_and_gradients(mode, no_fallback):
    x = torch.randn(4, 6, dtype=torch.float64)
    for f in (lambda t: torch.kthvalue(t, 2, 1).values, lambda t: torch.median(t, 0).values,
              lambda t: torch.nanmedian(t, 1, True).values, torch.median):
        a = x.clone().requires_grad_()
        b = x.to("tpu").requires_grad_()
        f(a).sum().backward()
        f(b).sum().backward()
        close(b.grad, a.grad)
    with pytest.raises(RuntimeError, match="out of range"):
        torch.kthvalue(x.to("tpu"), 7, 1)
    with pytest.raises(RuntimeError, match="non-zero size"):
        torch.median(torch.empty(0, 3, device="tpu"), 0)
    if mode != torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING:  # debug mode refuses a NaN made from nothing
        close_nan(torch.median(torch.empty(0, device="tpu")), torch.median(torch.empty(0)))


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_and_bucketize(right, mode, no_fallback):
    g = torch.Generator().manual_seed(5)
    seq = torch.sort(torch.randint(-8, 8, (13,), generator=g).float()).values  # with repeats
    v = torch.randint(-10, 10, (3, 4), generator=g).float() / 1.0
    st = seq.to("tpu")
    close(torch.searchsorted(st, v.to("tpu"), right=right), torch.searchsorted(seq, v, right=right))
    close(torch.searchsorted(st, v.to("tpu"), side="right" if right else "left", out_int32=True),
          torch.searchsorted(seq, v, side="right" if right else "left", out_int32=True))
    close(torch.bucketize(v.to("tpu"), st, right=right), torch.bucketize(v, seq, right=right))
    close(torch.bucketize(2.5, st, right=right), torch.bucketize(2.5, seq, right=right))
    close(torch.searchsorted(st, 3, right=right), torch.searchsorted(seq, 3, right=right))
    # Per-row sequences, unsorted and read through a sorter; mixed dtypes
    # promote; NaN as torch's search meets it.
    rows = torch.randn(2, 3, 6, generator=g, dtype=torch.float64)
    rows[1, 2, 4] = NAN
    sorter = torch.argsort(rows, -1)
    vals = torch.randn(2, 3, 5, generator=g)
    vals[0, 1, 1] = NAN
    close(torch.searchsorted(rows.to("tpu"), vals.to("tpu"), sorter=sorter.to("tpu"), right=right),
          torch.searchsorted(rows, vals, sorter=sorter, right=right))
    close(torch.searchsorted(torch.sort(rows).values.to("tpu"), vals.to("tpu"), right=right),
          torch.searchsorted(torch.sort(rows).values, vals, right=right))
    ints = torch.tensor([-3, 0, 0, 4, 9])
    close(torch.searchsorted(ints.to("tpu"), torch.tensor([0.5, -3.0, 9.5]).to("tpu"), right=right),
          torch.searchsorted(ints, torch.tensor([0.5, -3.0, 9.5]), right=right))
    close(torch.searchsorted(torch.empty(0).to("tpu"), v.to("tpu")), torch.searchsorted(torch.empty(0), v))


def test_searchsorted_errors_name_the_problem(no_fallback):
    seq = torch.arange(5.0, device="tpu")
    with pytest.raises(RuntimeError, match="opposites"):
        torch.searchsorted(seq, seq, side="left", right=True)
    with pytest.raises(RuntimeError, match="first N-1 dimensions"):
        torch.searchsorted(seq.view(1, 5).expand(2, 5), torch.zeros(3, 2, device="tpu"))
    with pytest.raises(RuntimeError, match="sorter index out of range"):
        torch.searchsorted(seq, seq, sorter=torch.tensor([0, 1, 2, 3, 5], device="tpu"))
    with pytest.raises(RuntimeError, match="long dtype"):
        torch.searchsorted(seq, seq, sorter=torch.arange(5, dtype=torch.int32, device="tpu"))
    with pytest.raises(RuntimeError, match="1 dimension"):
        torch.bucketize(seq, seq.view(5, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool], ids=str)
def test_cummax_cummin(dtype, mode, no_fallback):
    g = torch.Generator().manual_seed(9)
    x = torch.randint(-3, 3, (4, 9), generator=g).to(dtype)  # many ties: the later index wins
    if dtype.is_floating_point:
        x[1, 3] = NAN
        x[2, 0] = NAN
        x[2, 6] = NAN
    for dim in (1, 0, -1):
        _pair(torch.cummax(x.to("tpu"), dim), torch.cummax(x, dim))
        _pair(torch.cummin(x.to("tpu"), dim), torch.cummin(x, dim))
    _pair(torch.cummax(x[0, 0].to("tpu"), 0), torch.cummax(x[0, 0], 0))
    if dtype == torch.float32:
        y = torch.randn(4, 9, dtype=torch.float64)
        a = y.clone().requires_grad_()
        b = y.to("tpu").requires_grad_()
        torch.cummax(a, 1).values.sum().backward()
        torch.cummax(b, 1).values.sum().backward()
        close(b.grad, a.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_logcumsumexp(dtype, mode, no_fallback):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(3, 37, generator=g) * 30).to(dtype)
    x[0, 0] = -1000.0  # exp underflows: a plain log(cumsum(exp)) gives -inf
    x[1, 5] = float("inf")
    x[2, :4] = -float("inf")
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
    for dim in (1, 0):
        close_nan(torch.logcumsumexp(x.to("tpu"), dim), torch.logcumsumexp(x, dim), tol)
    y = torch.randn(4, 10, dtype=torch.float64)
    a = y.clone().requires_grad_()
    b = y.to("tpu").requires_grad_()
    torch.logcumsumexp(a, 1).sum().backward()
    torch.logcumsumexp(b, 1).sum().backward()
    close(b.grad, a.grad, 1e-10)


def test_trace_and_cross(mode, no_fallback):
    for m in (torch.randn(5, 3), torch.randn(3, 6, dtype=torch.float64), torch.arange(12).view(3, 4),
              torch.randn(0, 4)):
        close(torch.trace(m.to("tpu")), torch.trace(m))
    a, b = torch.randn(4, 1, 3), torch.randn(1, 5, 3)
    close(torch.linalg.cross(a.to("tpu"), b.to("tpu")), torch.linalg.cross(a, b))
    c, d = torch.randint(-5, 5, (3, 2)), torch.randint(-5, 5, (3, 2))
    close(torch.cross(c.to("tpu"), d.to("tpu"), dim=0), torch.cross(c, d, dim=0))
    for f in (lambda t: torch.trace(t[:, :4]) * 2, lambda t: torch.linalg.cross(t[:, :3], t[:, 3:6]).pow(2).sum()):
        y = torch.randn(4, 7, dtype=torch.float64)
        p = y.clone().requires_grad_()
        q = y.to("tpu").requires_grad_()
        f(p).backward()
        f(q).backward()
        close(q.grad, p.grad)
    with pytest.raises(RuntimeError, match="expected a matrix"):
        torch.trace(torch.ones(3, device="tpu"))
    with pytest.raises(RuntimeError, match="must have length 3"):
        torch.linalg.cross(torch.ones(2, 4, device="tpu"), torch.ones(2, 4, device="tpu"))


def test_masked_scatter_forward_backward_and_errors(mode, no_fallback):
    """What vision-language models do to put image features into the text
    embeddings: inputs_embeds.masked_scatter(mask, features)."""
    g = torch.Generator().manual_seed(4)
    emb = torch.randn(2, 6, 4, generator=g, dtype=torch.float64)
    mask = torch.zeros(2, 6, 1, dtype=torch.bool)
    mask[0, 1:3] = True
    mask[1, 4] = True
    feats = torch.randn(3, 4, generator=g, dtype=torch.float64)
    mask = mask.expand(2, 6, 4)
    close(emb.to("tpu").masked_scatter(mask.to("tpu"), feats.to("tpu")), emb.masked_scatter(mask, feats))
    t = emb.to("tpu")
    t.masked_scatter_(mask.to("tpu"), feats.to("tpu"))
    close(t, emb.masked_scatter(mask, feats))
    row = torch.tensor([True, False, True, True])
    src = torch.arange(60.0, dtype=torch.float64)  # more than the 36 it needs
    close(emb.to("tpu").masked_scatter(row.to("tpu"), src.to("tpu")), emb.masked_scatter(row, src))
    a = emb.clone().requires_grad_()
    b = emb.to("tpu").requires_grad_()
    fa = feats.clone().requires_grad_()
    fb = feats.to("tpu").requires_grad_()
    w = torch.randn(2, 6, 4, dtype=torch.float64)
    (a.masked_scatter(mask, fa) * w).sum().backward()
    (b.masked_scatter(mask.to("tpu"), fb) * w.to("tpu")).sum().backward()
    close(b.grad, a.grad)
    close(fb.grad, fa.grad)
    with pytest.raises(RuntimeError, match="source < number of ones"):
        emb.to("tpu").masked_scatter_(mask.to("tpu"), feats[:2].to("tpu"))
    with pytest.raises(RuntimeError, match="boolean masks"):
        emb.to("tpu").masked_scatter_(mask.to("tpu").byte(), feats.to("tpu"))
    with pytest.raises(RuntimeError, match="same dtypes"):
        emb.to("tpu").masked_scatter_(mask.to("tpu"), feats.float().to("tpu"))


def test_unique_and_index_fill(mode, no_fallback):
    g = torch.Generator().manual_seed(6)
    for x in (torch.randint(-4, 4, (5, 7), generator=g), torch.randint(0, 2, (9,), generator=g).bool(),
              torch.tensor([2.0, NAN, 1.0, 2.0, NAN]), torch.empty(0)):
        for inv in (False, True):
            for counts in (False, True):
                out = torch.unique(x.to("tpu"), return_inverse=inv, return_counts=counts)
                ref = torch.unique(x, return_inverse=inv, return_counts=counts)
                _pair(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,))
    x = torch.randn(3, 5)
    idx = torch.tensor([-1, 2, 2])
    close(x.to("tpu").index_fill(1, idx.to("tpu"), -2.0), x.index_fill(1, idx, -2.0))
    close(x.to("tpu").index_fill(0, torch.tensor(1).to("tpu"), torch.tensor(7.0)), x.index_fill(0, torch.tensor(1), torch.tensor(7.0)))
    t = torch.arange(6).view(2, 3).to("tpu")
    t.index_fill_(1, torch.tensor([0]).to("tpu"), 2.7)
    close(t, torch.arange(6).view(2, 3).index_fill(1, torch.tensor([0]), 2.7))
    with pytest.raises(RuntimeError, match="int64 for index"):
        x.to("tpu").index_fill(1, torch.tensor([1.0]).to("tpu"), 0.0)


def test_unique_along_a_dim(mode, no_fallback):
    """torch.unique(dim=) and unique_consecutive(dim=): slices sorted
    lexicographically (repeated rows, columns, a 3-D middle dim, bool),
    inverse and counts as on CPU; torch's error for an empty unselected
    dimension."""
    g = torch.Generator().manual_seed(8)
    rows = torch.randint(0, 3, (9, 2), generator=g)
    cases = ((rows, 0), (rows.T.contiguous(), 1), (torch.randint(0, 2, (2, 7, 3), generator=g), 1),
             (torch.randint(0, 2, (6, 3), generator=g).bool(), 0), (torch.randn(4, 3, generator=g)[[0, 2, 0, 1]], 0),
             (torch.empty(0, 3), 0), (torch.tensor([[5, 1]]), 0))
    for x, d in cases:
        for f in (lambda t: torch.unique(t, dim=d, return_inverse=True, return_counts=True),
                  lambda t: torch.unique_consecutive(t, dim=d, return_inverse=True, return_counts=True),
                  lambda t: (torch.unique(t, dim=d),)):
            _pair(f(x.to("tpu")), f(x))
    with pytest.raises(RuntimeError, match="0 sized dimensions"):
        torch.unique(torch.empty(3, 0, device="tpu"), dim=0)


@pytest.mark.parametrize(
    "kw",
    [{"kernel_size": (2, 3)}, {"kernel_size": 3, "dilation": 2, "padding": 2, "stride": (2, 1)},
     {"kernel_size": 1, "stride": 3}],
    ids=["plain", "dilated_padded_strided", "strided_1x1"],
)
def test_unfold_and_fold_forward_and_backward(mode, no_fallback, kw):
    """F.unfold (im2col) and F.fold (col2im), each the other's backward."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, 9, 7, generator=g, dtype=torch.float64)
    a = x.clone().requires_grad_()
    b = x.to("tpu").requires_grad_()
    ua, ub = F.unfold(a, **kw), F.unfold(b, **kw)
    close(ub, ua, 1e-12)
    gu = torch.randn(ua.shape, generator=g, dtype=torch.float64)
    ua.backward(gu)
    ub.backward(gu.to("tpu"))
    close(b.grad, a.grad, 1e-12)
    c = gu.clone().requires_grad_()
    d = gu.to("tpu").requires_grad_()
    fa, fb = F.fold(c, (9, 7), **kw), F.fold(d, (9, 7), **kw)
    close(fb, fa, 1e-12)
    fa.pow(2).sum().backward()
    fb.pow(2).sum().backward()
    close(d.grad, c.grad, 1e-12)
    # Unbatched, and bf16 (fold adds at f32).
    close(F.unfold(x[0].to("tpu"), **kw), F.unfold(x[0], **kw))
    xb = x.bfloat16()
    close(F.fold(F.unfold(xb.to("tpu"), **kw), (9, 7), **kw), F.fold(F.unfold(xb, **kw), (9, 7), **kw), 1e-2)


def test_unfold_and_fold_errors_name_the_problem(no_fallback):
    x = torch.ones(1, 2, 3, 3, device="tpu")
    with pytest.raises(RuntimeError, match="sliding blocks"):
        F.unfold(x, kernel_size=4)
    with pytest.raises(RuntimeError, match="sliding blocks"):
        F.fold(torch.ones(1, 8, 5, device="tpu"), (3, 3), kernel_size=2)


@pytest.mark.parametrize("size", [(3, 2), (4, 4), (11, 9), 1], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_adaptive_max_pool_forward_indices_and_backward(mode, no_fallback, size, dtype):
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 3, 9, 7, generator=g).to(dtype)
    x[0, 1, 4, 2] = NAN
    x[1, 0, :3, :3] = -float("inf")
    a = x.clone().requires_grad_()
    b = x.to("tpu").requires_grad_()
    ra, ia = F.adaptive_max_pool2d(a, size, return_indices=True)
    rb, ib = F.adaptive_max_pool2d(b, size, return_indices=True)
    close_nan(rb, ra, 0)
    close(ib, ia)
    gr = torch.randn(ra.shape, generator=g).to(dtype)
    ra.backward(gr)
    rb.backward(gr.to("tpu"))
    close(b.grad, a.grad, 1e-2 if dtype == torch.bfloat16 else 0)
    x3 = torch.randn(2, 2, 5, 6, 7, generator=g)
    for fn, t, s in ((F.adaptive_max_pool3d, x3, (2, 3, 4)), (F.adaptive_max_pool1d, x3[0, 0], 3)):
        _pair(fn(t.to("tpu"), s, return_indices=True), fn(t, s, return_indices=True), 0)


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")], ids=str)
def test_cdist_forward_and_backward(mode, no_fallback, p):
    g = torch.Generator().manual_seed(10)
    for s1, s2 in (((4, 3), (5, 3)), ((2, 1, 4, 3), (3, 6, 3)), ((30, 3), (28, 3))):
        x1 = torch.randn(*s1, generator=g, dtype=torch.float64)
        x2 = torch.randn(*s2, generator=g, dtype=torch.float64)
        if s1 == (4, 3):
            # A zero distance: its gradient is 0 (in torch's product form
            # for more than 25 rows, p = 2, the gradient is infinite, as on
            # CPU, which debug mode refuses).
            x2[0] = x1[0]
        a1, a2 = x1.clone().requires_grad_(), x2.clone().requires_grad_()
        b1, b2 = x1.to("tpu").requires_grad_(), x2.to("tpu").requires_grad_()
        ra, rb = torch.cdist(a1, a2, p), torch.cdist(b1, b2, p)
        close(rb, ra, 1e-10)
        gr = torch.randn(ra.shape, generator=g, dtype=torch.float64)
        ra.backward(gr)
        rb.backward(gr.to("tpu"))
        close(b1.grad, a1.grad, 1e-8)
        close(b2.grad, a2.grad, 1e-8)


@pytest.mark.parametrize("interp", ["bilinear", "nearest"])
@pytest.mark.parametrize("pad", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_forward_and_backward(mode, no_fallback, interp, pad, align_corners):
    """F.grid_sample (spatial transformers, deformable attention): the
    input's and the grid's gradients as CPU's; grid points outside the
    image exercise the padding."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(2, 3, 5, 6, generator=g, dtype=torch.float64)
    grid = torch.rand(2, 4, 7, 2, generator=g, dtype=torch.float64) * 2.8 - 1.4
    kw = {"mode": interp, "padding_mode": pad, "align_corners": align_corners}
    a, ga = x.clone().requires_grad_(), grid.clone().requires_grad_()
    b, gb = x.to("tpu").requires_grad_(), grid.to("tpu").requires_grad_()
    ra, rb = F.grid_sample(a, ga, **kw), F.grid_sample(b, gb, **kw)
    close(rb, ra, 1e-12)
    w = torch.randn(ra.shape, generator=g, dtype=torch.float64)
    (ra * w).sum().backward()
    (rb * w.to("tpu")).sum().backward()
    close(b.grad, a.grad, 1e-12)
    close(gb.grad, ga.grad, 1e-10)
    xf, gf = x.float(), grid.float()
    close(F.grid_sample(xf.to("tpu"), gf.to("tpu"), **kw), F.grid_sample(xf, gf, **kw), 1e-5)
    # bf16 computes at f32 and rounds once (torch's CPU kernel rounds the
    # positions and weights to bf16 on the way, which moves some points):
    # CPU's f32 result on the same bf16 values, rounded.
    xh, gh = x.bfloat16(), grid.bfloat16()
    close(F.grid_sample(xh.to("tpu"), gh.to("tpu"), **kw), F.grid_sample(xh.float(), gh.float(), **kw).bfloat16(), 1e-2)


def test_grid_sample_bicubic_runs_on_the_counted_cpu_fallback():
    x = torch.randn(1, 2, 4, 5)
    grid = torch.rand(1, 3, 3, 2) * 2 - 1
    was = torch.tpu.cpu_fallback_enabled()
    try:
        torch.tpu.enable_cpu_fallback(False)
        with pytest.raises(NotImplementedError, match="grid_sampler_2d \\(bicubic\\)"):
            F.grid_sample(x.to("tpu"), grid.to("tpu"), mode="bicubic", align_corners=False)
        torch.tpu.enable_cpu_fallback(True)
        before = torch.tpu.fallback_stats().get("grid_sampler_2d (bicubic)", 0)
        close(F.grid_sample(x.to("tpu"), grid.to("tpu"), mode="bicubic", align_corners=False),
              F.grid_sample(x, grid, mode="bicubic", align_corners=False))
        assert torch.tpu.fallback_stats()["grid_sampler_2d (bicubic)"] == before + 1
    finally:
        torch.tpu.enable_cpu_fallback(was)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_bce_smooth_l1_and_huber_losses(reduction, mode, no_fallback):
    """Values and gradients of both inputs (where torch has them) against
    CPU, with and without BCE's weight, beta and delta at their defaults
    and not."""
    p = torch.rand(5, 6) * 0.96 + 0.02
    t = torch.rand(5, 6)
    w = torch.rand(5, 6) + 0.5
    cases = [
        (lambda a, b, c: F.binary_cross_entropy(a, b, reduction=reduction), (p, t, w)),
        (lambda a, b, c: F.binary_cross_entropy(a, b, weight=c, reduction=reduction), (p, t, w)),
        (lambda a, b, c: F.smooth_l1_loss(a, b, reduction=reduction), (X[:, :6] * 2, Y[:, :6], w)),
        (lambda a, b, c: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.3), (X * 2, Y, w)),
        (lambda a, b, c: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.0), (X, Y, w)),
        (lambda a, b, c: F.huber_loss(a, b, reduction=reduction), (X * 2, Y, w)),
        (lambda a, b, c: F.huber_loss(a, b, reduction=reduction, delta=0.4), (X * 2, Y, w)),
    ]
    for f, (a, b, c) in cases:
        for dtype in (torch.float32, torch.float64):
            ca = a.to(dtype, copy=True).requires_grad_()
            cb = b.to(dtype, copy=True).requires_grad_()
            ta = ca.detach().to("tpu").requires_grad_()
            tb = cb.detach().to("tpu").requires_grad_()
            ref, out = f(ca, cb, c.to(dtype)), f(ta, tb, c.to(dtype).to("tpu"))
            tol = 1e-5 if dtype == torch.float32 else 1e-12
            close(out, ref.detach(), tol)
            go = torch.rand(ref.shape, dtype=dtype)
            need = [ca] if f is cases[0][0] or f is cases[1][0] else [ca, cb]
            want = torch.autograd.grad(ref, need, go)
            got = torch.autograd.grad(out, [ta] if len(need) == 1 else [ta, tb], go.to("tpu"))
            for g1, g2 in zip(got, want):
                close(g1, g2, tol)


def test_nansum_std_mean_and_linspace(mode, no_fallback):
    x = X.clone()
    x[0, 1] = x[2, 3] = x[2, 5] = float("nan")
    close(torch.nansum(x.to("tpu")), torch.nansum(x))
    close(torch.nansum(x.to("tpu"), dim=1, keepdim=True), torch.nansum(x, dim=1, keepdim=True))
    i = torch.arange(12, dtype=torch.int32).view(3, 4)
    close(torch.nansum(i.to("tpu"), 0), torch.nansum(i, 0))
    for kw in ({}, {"dim": 1}, {"dim": (0, 1), "correction": 0, "keepdim": True}):
        s, m = torch.std_mean(X.to("tpu"), **kw)
        rs, rm = torch.std_mean(X, **kw)
        close(s, rs)
        close(m, rm)
    for start, end, steps in ((0.0, 1.0, 5), (-3.5, 2.25, 17), (2.0, -7.0, 1), (0.0, 1.0, 0), (1e-3, 1e3, 100)):
        close(torch.linspace(start, end, steps, device="tpu"), torch.linspace(start, end, steps), 1e-6)
        close(torch.linspace(start, end, steps, device="tpu", dtype=torch.float64),
              torch.linspace(start, end, steps, dtype=torch.float64), 1e-15)
    close(torch.linspace(0, 10, 4, device="tpu", dtype=torch.int64), torch.linspace(0, 10, 4, dtype=torch.int64))
    close(torch.linspace(-1, 1, 9, device="tpu", dtype=torch.bfloat16),
          torch.linspace(-1, 1, 9, dtype=torch.bfloat16), 1e-2)
    with pytest.raises(RuntimeError, match="number of steps must be non-negative"):
        torch.linspace(0, 1, -1, device="tpu")


def test_loss_errors_name_the_problem(no_fallback):
    # (F.binary_cross_entropy checks sizes in Python; the aten op is ours.)
    with pytest.raises(RuntimeError, match="target size"):
        torch.ops.aten.binary_cross_entropy(torch.rand(3, device="tpu"), torch.rand(2, device="tpu"))
    with pytest.raises(RuntimeError, match="delta"):
        F.huber_loss(torch.rand(3, device="tpu"), torch.rand(3, device="tpu"), delta=-1.0)


def test_triangle_indices_match_cpu(mode, no_fallback):
    for r, c, o in ((4, 4, 0), (4, 4, -1), (3, 5, 2), (6, 2, -3), (5, 5, 9), (5, 5, -9), (0, 3, 0), (37, 29, 4)):
        for f in (torch.tril_indices, torch.triu_indices):
            got = f(r, c, o, device="tpu")
            assert got.device.type == "tpu"
            assert torch.equal(got.cpu(), f(r, c, o))
            got = f(r, c, o, dtype=torch.int32, device="tpu").cpu()
            assert got.dtype == torch.int32 and torch.equal(got, f(r, c, o, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="row must be non-negative, got -1"):
        torch.tril_indices(-1, 3, device="tpu")
    with pytest.raises(RuntimeError, match="not implemented for 'Float'"):
        torch.triu_indices(3, 3, dtype=torch.float32, device="tpu")


def test_dlrm_interaction_with_tril_indices(mode, no_fallback):
    """DLRM's feature interaction (TorchRec's InteractionArch): pairwise
    dot products of the embeddings, the strict lower triangle gathered
    by tril_indices, gradients through it."""
    torch.manual_seed(2)
    emb = torch.randn(5, 7, 16)
    li, lj = torch.tril_indices(7, 7, offset=-1)
    a = emb.clone().requires_grad_()
    b = emb.to("tpu").requires_grad_()
    bi, bj = torch.tril_indices(7, 7, offset=-1, device="tpu")
    za = torch.bmm(a, a.transpose(1, 2))[:, li, lj]
    zb = torch.bmm(b, b.transpose(1, 2))[:, bi, bj]
    close(zb, za.detach(), 1e-4)
    za.square().sum().backward()
    zb.square().sum().backward()
    close(b.grad, a.grad, 1e-4)


def test_repeat_interleave_with_tensor_repeats(mode, no_fallback):
    reps = torch.tensor([2, 0, 3, 1])
    for r in (reps, reps.to(torch.int32), torch.zeros(0, dtype=torch.long)):
        got = torch.repeat_interleave(r.to("tpu"))
        want = torch.repeat_interleave(r)
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
    # With output_size nothing is read back; the same result.
    assert torch.equal(torch.repeat_interleave(reps.to("tpu"), output_size=6).cpu(), torch.repeat_interleave(reps))
    # A tensor repeated along a dim (index_select), with its gradient.
    x = X.clone().requires_grad_()
    xt = X.to("tpu").requires_grad_()
    ya = x.repeat_interleave(reps, dim=0)
    yb = xt.repeat_interleave(reps.to("tpu"), dim=0)
    close(yb, ya.detach())
    ya.square().sum().backward()
    yb.square().sum().backward()
    close(xt.grad, x.grad)
    r8 = torch.tensor([1, 2, 0, 1, 3, 0, 0, 1])
    close(X.to("tpu").repeat_interleave(r8.to("tpu"), dim=1), X.repeat_interleave(r8, dim=1))
    # TorchRec's jagged lengths to segment ids.
    lengths = torch.tensor([3, 0, 2, 5, 1], device="tpu")
    ids = torch.arange(5, device="tpu").repeat_interleave(lengths)
    assert torch.equal(ids.cpu(), torch.arange(5).repeat_interleave(lengths.cpu()))
    with pytest.raises(RuntimeError, match="repeats can not be negative"):
        torch.repeat_interleave(torch.tensor([1, -1], device="tpu"))
    for bad in (torch.ones(2, 2, dtype=torch.long), torch.tensor(3)):
        with pytest.raises(RuntimeError, match="1D vector"):
            torch.repeat_interleave(bad.to("tpu"))
    with pytest.raises(RuntimeError, match="Long or Int"):
        torch.repeat_interleave(torch.ones(2, device="tpu"))


@pytest.mark.parametrize("reduce", ("sum", "prod", "mean", "amax", "amin"))
def test_scatter_reduce_and_index_reduce(reduce, mode, no_fallback):
    """torch.scatter_reduce with and without self (positions no index
    names keep self's value), float and integer (an integer mean rounds
    down), in place and out=; index_reduce along a dim; the errors."""
    torch.manual_seed(5)
    x = torch.randn(3, 6)
    idx = torch.tensor([[0, 5, 0, 2], [1, 1, 1, 1], [4, 3, 4, 3]])
    src = torch.randn(3, 4)
    xi, srci = torch.randint(-9, 9, (3, 6)), torch.randint(-9, 9, (3, 4))
    for include_self in (True, False):
        for a, s in ((x, src), (xi, srci)):
            want = a.scatter_reduce(1, idx, s, reduce, include_self=include_self)
            close(a.to("tpu").scatter_reduce(1, idx.to("tpu"), s.to("tpu"), reduce, include_self=include_self), want)
        t = x.to("tpu")
        t.scatter_reduce_(0, idx[:, :3].remainder(3).to("tpu"), src.to("tpu"), reduce, include_self=include_self)
        close(t, x.clone().scatter_reduce_(0, idx[:, :3].remainder(3), src, reduce, include_self=include_self))
        if reduce != "sum":
            i = torch.tensor([2, 0, 2, 5])
            close(x.to("tpu").index_reduce(1, i.to("tpu"), src.to("tpu"), reduce, include_self=include_self),
                  x.index_reduce(1, i, src, reduce, include_self=include_self))
    out = torch.empty(0, device="tpu")
    torch.scatter_reduce(x.to("tpu"), 1, idx.to("tpu"), src.to("tpu"), reduce, out=out)
    close(out, x.scatter_reduce(1, idx, src, reduce))
    with pytest.raises(RuntimeError, match="dtype"):
        x.to("tpu").scatter_reduce(1, idx.to("tpu"), srci.to("tpu"), reduce)
    with pytest.raises(RuntimeError, match="must be either sum, prod, mean, amax or amin, got median"):
        x.to("tpu").scatter_reduce(1, idx.to("tpu"), src.to("tpu"), "median")
    with pytest.raises(RuntimeError, match="Expected reduce to be one of prod, mean, amax or amin but got sum"):
        x.to("tpu").index_reduce(1, torch.tensor([0, 1, 2, 3], device="tpu"), src.to("tpu"), "sum")


def test_spatial_nll_norm_count_nonzero_angle_channel_shuffle(mode, no_fallback):
    """What segmentation and metric-learning code reaches: cross_entropy on
    [N, C, H, W] (nll_loss2d) with weights and an ignored class, forward
    and backward; the legacy torch.norm (pairwise_distance, triplet
    loss); count_nonzero; angle of a real tensor; channel_shuffle."""
    torch.manual_seed(6)
    logits = torch.randn(2, 4, 3, 5, requires_grad=True)
    target = torch.randint(0, 4, (2, 3, 5))
    target[0, 0, 0] = -100
    w = torch.rand(4) + 0.5
    lt = logits.detach().to("tpu").requires_grad_()
    for reduction in ("mean", "sum", "none"):
        got = F.cross_entropy(lt, target.to("tpu"), weight=w.to("tpu"), reduction=reduction)
        want = F.cross_entropy(logits, target, weight=w, reduction=reduction)
        close(got, want)
        got.sum().backward()
        want.sum().backward()
        close(lt.grad, logits.grad)
        lt.grad, logits.grad = None, None
    with pytest.raises(RuntimeError, match="only batches of spatial targets supported"):
        torch.ops.aten.nll_loss2d_forward(lt.detach(), target[0].to("tpu"), None, 1, -100)
    a, p, n = torch.randn(4, 6), torch.randn(4, 6), torch.randn(4, 6)
    close(F.triplet_margin_loss(a.to("tpu"), p.to("tpu"), n.to("tpu")), F.triplet_margin_loss(a, p, n))
    close(F.pairwise_distance(a.to("tpu"), p.to("tpu"), p=1.5), F.pairwise_distance(a, p, p=1.5))
    close(torch.norm(a.to("tpu"), dim=1), torch.norm(a, dim=1))
    close(torch.norm(a.to("tpu"), 3, dim=(0, 1), keepdim=True), torch.norm(a, 3, dim=(0, 1), keepdim=True))
    close(torch.norm(a.to("tpu"), float("inf")), torch.norm(a, float("inf")))
    close(torch.norm(a.to("tpu"), 2, dim=0, dtype=torch.float64), torch.norm(a, 2, dim=0, dtype=torch.float64))
    c = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]])
    close(torch.count_nonzero(c.to("tpu")), torch.count_nonzero(c))
    close(torch.count_nonzero(c.to("tpu"), dim=1), torch.count_nonzero(c, dim=1))
    close(torch.count_nonzero(c.to("tpu"), dim=(0, 1)), torch.count_nonzero(c, dim=(0, 1)))
    r = torch.tensor([1.0, -2.0, 0.0, -0.0, float("inf"), -float("inf"), float("nan")])
    torch.testing.assert_close(torch.angle(r.to("tpu")).cpu(), torch.angle(r), equal_nan=True)
    close(torch.angle(torch.tensor([3, -1, 0], device="tpu")), torch.angle(torch.tensor([3, -1, 0])))
    x = torch.arange(2 * 6 * 2 * 2, dtype=torch.float32).reshape(2, 6, 2, 2)
    close(F.channel_shuffle(x.to("tpu"), 3), F.channel_shuffle(x, 3))
    close(torch.nn.ChannelShuffle(2)(x.to("tpu")), torch.nn.ChannelShuffle(2)(x))
    with pytest.raises(RuntimeError, match="Number of channels must be divisible by groups. Got 6 channels and 4"):
        F.channel_shuffle(x.to("tpu"), 4)


def test_normal_with_tensor_mean_or_std(mode, no_fallback):
    """torch.normal with a tensor mean, std or both: the broadcast shape,
    the moments, a generator's repeatability, and a negative std's error."""
    n = 20000
    mean = torch.linspace(-2, 2, 5).repeat(n // 5).to("tpu")
    std = torch.tensor([0.5, 1.0, 2.0, 0.1, 3.0]).repeat(n // 5).to("tpu")
    for draw, sd, mu in (
        (lambda: torch.normal(mean, 2.0), torch.full((5,), 2.0), torch.linspace(-2, 2, 5)),
        (lambda: torch.normal(1.5, std), torch.tensor([0.5, 1.0, 2.0, 0.1, 3.0]), torch.full((5,), 1.5)),
        (lambda: torch.normal(mean, std), torch.tensor([0.5, 1.0, 2.0, 0.1, 3.0]), torch.linspace(-2, 2, 5)),
    ):
        z = draw()
        assert z.device.type == "tpu" and z.shape == (n,)
        z = z.cpu().reshape(-1, 5)
        assert torch.allclose(z.mean(0), mu, atol=0.15), z.mean(0)
        assert torch.allclose(z.std(0), sd, rtol=0.1), z.std(0)
    assert torch.normal(torch.zeros(3, 1, device="tpu"), torch.ones(4, device="tpu")).shape == (3, 4)
    g = torch.Generator(device="tpu").manual_seed(8)
    a = torch.normal(mean[:10], std[:10], generator=g).cpu()
    g.manual_seed(8)
    out = torch.empty(0, device="tpu")
    torch.normal(mean[:10], std[:10], generator=g, out=out)
    assert torch.equal(out.cpu(), a)
    with pytest.raises(RuntimeError, match="normal expects all elements of std >= 0.0"):
        torch.normal(mean[:3], torch.tensor([1.0, -1.0, 1.0], device="tpu"))


def fwd_bwd(f, *args, tol=1e-5):
    """f on tpu against f on the CPU: the value and the first argument's
    gradient (for a backward through the sum of squares of the result)."""
    outs = []
    for device in ("cpu", "tpu"):
        a = [x.detach().to(device).requires_grad_(i == 0 and x.is_floating_point()) if isinstance(x, torch.Tensor)
             else x for i, x in enumerate(args)]
        y = f(*a)
        (y.square().sum()).backward()
        outs.append((y.detach().cpu(), a[0].grad.cpu()))
    (y_cpu, g_cpu), (y_tpu, g_tpu) = outs
    torch.testing.assert_close(y_tpu, y_cpu, atol=tol, rtol=tol)
    torch.testing.assert_close(g_tpu, g_cpu, atol=tol, rtol=tol)


def test_nonzero_static_embedding_max_norm_and_renorm(mode, no_fallback):
    """nonzero_static (no read back: its shape is static) cut short, padded
    and on a 0-d tensor; nn.Embedding's max_norm renormalizing the rows
    it reads, in place; renorm with its gradient."""
    x = torch.tensor([[0, 3, 0], [1, 0, 2]])
    for size, fill in ((2, -1), (3, -1), (6, -9), (0, 5)):
        close(torch.nonzero_static(x.to("tpu"), size=size, fill_value=fill),
              torch.nonzero_static(x, size=size, fill_value=fill))
    close(torch.nonzero_static(torch.tensor(2.0, device="tpu"), size=3), torch.nonzero_static(torch.tensor(2.0), size=3))
    # A bool mask of three dims, more rows than elements, a fill past f64's
    # exact integers, and an empty tensor.
    m = torch.rand(2, 3, 4, generator=torch.Generator().manual_seed(3)) > 0.6
    for size, fill in ((5, -1), (30, 2**60 + 1)):
        got = torch.nonzero_static(m.to("tpu"), size=size, fill_value=fill)
        assert torch.equal(got.cpu(), torch.nonzero_static(m, size=size, fill_value=fill))
    close(torch.nonzero_static(torch.zeros(0, 2, device="tpu"), size=2), torch.nonzero_static(torch.zeros(0, 2), size=2))
    with pytest.raises(RuntimeError, match="'size' must be an non-negative integer"):
        torch.nonzero_static(x.to("tpu"), size=-1)
    torch.manual_seed(7)
    w = torch.randn(6, 4) * 2
    idx = torch.tensor([[0, 2, 2], [5, 0, 1]])
    wt = w.to("tpu")
    for norm_type in (2.0, 1.0):
        got = F.embedding(idx.to("tpu"), wt, max_norm=1.5, norm_type=norm_type)
        want = F.embedding(idx, w, max_norm=1.5, norm_type=norm_type)
        close(got, want)
        close(wt, w)
    # int32 indices, and a bf16 table.
    got = F.embedding(idx.int().to("tpu"), wt, max_norm=1.0)
    close(got, F.embedding(idx.int(), w, max_norm=1.0))
    close(wt, w)
    wh = (torch.randn(6, 4) * 2).bfloat16()
    wht = wh.to("tpu")
    close(F.embedding(idx.to("tpu"), wht, max_norm=1.5), F.embedding(idx, wh, max_norm=1.5), tol=1e-2)
    close(wht, wh, tol=1e-2)
    a = torch.randn(3, 4, 2) * 3
    for p, dim, maxnorm in ((2, 0, 2.0), (1, 1, 1.0), (3, -1, 0.5)):
        fwd_bwd(lambda t: torch.renorm(t, p, dim, maxnorm), a)
    with pytest.raises(RuntimeError, match="renorm: non-positive-norm not supported"):
        torch.renorm(a.to("tpu"), 0, 0, 1.0)


def test_pdist_and_max_unpool(mode, no_fallback):
    """pdist for several p with its gradient (two equal rows: a zero
    distance); max_unpool2d and 3d after max_pool with return_indices, and
    their gradients."""
    torch.manual_seed(8)
    x = torch.randn(5, 3)
    x[3] = x[1]
    for p in (2.0, 1.0, 3.0, float("inf")):
        close(F.pdist(x.to("tpu"), p), F.pdist(x, p))
    y = torch.randn(5, 3)
    for p in (2.0, 1.0, 3.0):
        fwd_bwd(lambda t: F.pdist(t, p), y)
    assert F.pdist(torch.randn(1, 3, device="tpu")).shape == (0,)
    img = torch.randn(2, 3, 6, 6)
    pooled, ind = F.max_pool2d(img, 2, return_indices=True)
    close(F.max_unpool2d(pooled.to("tpu"), ind.to("tpu"), 2), F.max_unpool2d(pooled, ind, 2))
    close(F.max_unpool2d(pooled[0].to("tpu"), ind[0].to("tpu"), 2, output_size=(7, 7)),
          F.max_unpool2d(pooled[0], ind[0], 2, output_size=(7, 7)))
    fwd_bwd(lambda t, i: F.max_unpool2d(t, i, 2), pooled, ind)
    vol = torch.randn(1, 2, 4, 4, 4)
    pooled3, ind3 = F.max_pool3d(vol, 2, return_indices=True)
    close(F.max_unpool3d(pooled3.to("tpu"), ind3.to("tpu"), 2), F.max_unpool3d(pooled3, ind3, 2))
    with pytest.raises(RuntimeError, match="indices should be type int64"):
        F.max_unpool2d(pooled.to("tpu"), ind.int().to("tpu"), 2)


def test_rrelu_and_margin_losses(mode, no_fallback):
    """rrelu in training (each negative element's slope drawn in [lower,
    upper], the gradient that slope) and in eval; multi_margin_loss (p 1
    and 2, margin, class weights, a single sample) and
    multilabel_margin_loss (targets ending at -1), every reduction, with
    gradients."""
    torch.manual_seed(9)
    x = torch.randn(200, device="tpu", requires_grad=True)
    y = F.rrelu(x, 0.1, 0.3, training=True)
    slope = (y / x).detach().cpu()
    neg = x.detach().cpu() < 0
    assert torch.all(slope[~neg] == 1) and torch.all((slope[neg] >= 0.1) & (slope[neg] <= 0.3))
    assert slope[neg].std() > 0.02
    y.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), slope)
    close(F.rrelu(x.detach(), 0.1, 0.3, training=False), F.rrelu(x.detach().cpu(), 0.1, 0.3, training=False))
    logits = torch.randn(4, 5)
    target = torch.tensor([0, 4, 2, 2])
    w = torch.rand(5) + 0.5
    for reduction in ("mean", "sum", "none"):
        for p in (1, 2):
            fwd_bwd(lambda t, y: F.multi_margin_loss(t, y, p=p, margin=0.7, reduction=reduction), logits, target)
            fwd_bwd(lambda t, y, w: F.multi_margin_loss(t, y, p=p, weight=w, reduction=reduction), logits, target, w)
        fwd_bwd(lambda t, y: F.multi_margin_loss(t, y, reduction=reduction), logits[1], target[1])
        labels = torch.tensor([[3, 0, -1, 1, 2], [1, 2, 3, 4, 0], [-1, 0, 0, 0, 0], [4, -1, 2, 2, 2]])
        fwd_bwd(lambda t, y: F.multilabel_margin_loss(t, y, reduction=reduction), logits, labels)
        fwd_bwd(lambda t, y: F.multilabel_margin_loss(t, y, reduction=reduction), logits[0], labels[0])
    with pytest.raises(RuntimeError, match="only p == 1 and p == 2 supported"):
        torch.ops.aten.multi_margin_loss(logits.to("tpu"), target.to("tpu"), 3, 1.0, None, 1)


def test_gamma_family_and_poisson_samplers(mode, no_fallback):
    """torch.distributions' Gamma, Beta, Dirichlet, Chi2 and StudentT
    sample on tpu (through _standard_gamma and _sample_dirichlet), and
    torch.poisson: their means and variances over 20000 draws, a
    generator's repeatability, and the errors torch's CPU gives."""
    D = torch.distributions
    n = 20000
    torch.manual_seed(12)
    conc = torch.tensor([0.4, 1.0, 3.0, 25.0], device="tpu")
    rate = torch.tensor([1.0, 2.0, 0.5, 5.0], device="tpu")
    g = D.Gamma(conc, rate).sample((n,))
    assert g.device.type == "tpu" and g.shape == (n, 4) and bool((g > 0).all())
    mean, var = conc.cpu() / rate.cpu(), conc.cpu() / rate.cpu() ** 2
    assert torch.allclose(g.mean(0).cpu(), mean, rtol=0.05), g.mean(0)
    assert torch.allclose(g.var(0).cpu(), var, rtol=0.1), g.var(0)
    b = D.Beta(torch.tensor([2.0, 0.5], device="tpu"), torch.tensor([3.0, 0.5], device="tpu")).sample((n,)).cpu()
    assert torch.allclose(b.mean(0), torch.tensor([0.4, 0.5]), atol=0.01), b.mean(0)
    d = D.Dirichlet(torch.tensor([1.0, 2.0, 7.0], device="tpu")).sample((n,)).cpu()
    assert torch.allclose(d.sum(1), torch.ones(n)) and torch.allclose(d.mean(0), torch.tensor([0.1, 0.2, 0.7]), atol=0.01)
    c = D.Chi2(torch.tensor(4.0, device="tpu")).sample((n,)).cpu()
    assert abs(c.mean().item() - 4.0) < 0.15 and abs(c.var().item() - 8.0) < 0.6
    assert D.StudentT(torch.tensor(5.0, device="tpu")).sample((10,)).device.type == "tpu"
    lam = torch.tensor([0.0, 0.7, 6.0, 10.0, 80.0], device="tpu")
    p = torch.poisson(lam.expand(n, 5)).cpu()
    assert torch.equal(p, p.floor()) and torch.equal(p[:, 0], torch.zeros(n))
    assert torch.allclose(p.mean(0), lam.cpu(), rtol=0.05, atol=0.02), p.mean(0)
    assert torch.allclose(p.var(0), lam.cpu(), rtol=0.1, atol=0.02), p.var(0)
    gen = torch.Generator(device="tpu").manual_seed(4)
    first = torch.poisson(lam, gen).cpu(), torch._standard_gamma(conc, gen).cpu()
    gen.manual_seed(4)
    assert torch.equal(torch.poisson(lam, gen).cpu(), first[0])
    assert torch.equal(torch._standard_gamma(conc, gen).cpu(), first[1])
    # Two draws in a row differ: the generator moved past every counter.
    assert not torch.equal(torch._standard_gamma(conc, gen).cpu(), first[1])
    with pytest.raises(RuntimeError, match="invalid Poisson rate, expected rate to be non-negative"):
        torch.poisson(torch.tensor([1.0, -1.0], device="tpu"))


def test_binomial_sampler(mode, no_fallback):
    """torch.binomial, and torch.distributions' Binomial through it, on
    tpu: means and variances over 20000 draws on both sides of the method
    switch (count times the smaller of p and 1 - p at 10), whole draws in
    [0, count], torch's CPU at the edges, a generator's repeatability and
    a move past every counter."""
    n = 20000
    torch.manual_seed(7)
    count = torch.tensor([4.0, 15.0, 40.0, 200.0, 3000.0], device="tpu")
    prob = torch.tensor([0.3, 0.9, 0.5, 0.1, 0.75], device="tpu")
    b = torch.binomial(count.expand(n, 5), prob)
    assert b.device.type == "tpu" and b.dtype == torch.float32 and b.shape == (n, 5)
    b = b.cpu()
    assert torch.equal(b, b.floor()) and bool((b >= 0).all()) and bool((b <= count.cpu()).all())
    mean, var = count.cpu() * prob.cpu(), count.cpu() * prob.cpu() * (1 - prob.cpu())
    assert torch.allclose(b.mean(0), mean, rtol=0.03), b.mean(0)
    assert torch.allclose(b.var(0), var, rtol=0.1), b.var(0)
    d = torch.distributions.Binomial(torch.tensor(25.0, device="tpu"), torch.tensor(0.2, device="tpu"))
    s = d.sample((n,)).cpu()
    assert abs(s.mean().item() - 5.0) < 0.1 and abs(s.var().item() - 4.0) < 0.3
    edges_c = torch.tensor([0.0, 7.0, 7.0, -2.0, 3.0], dtype=torch.float64)
    edges_p = torch.tensor([0.5, 0.0, 1.0, 0.5, 1.5], dtype=torch.float64)
    want = torch.binomial(edges_c, edges_p)
    got = torch.binomial(edges_c.to("tpu"), edges_p.to("tpu"))
    assert got.dtype == torch.float64 and torch.equal(got.cpu(), want), (got, want)
    gen = torch.Generator(device="tpu").manual_seed(4)
    first = torch.binomial(count, prob, gen).cpu()
    gen.manual_seed(4)
    assert torch.equal(torch.binomial(count, prob, gen).cpu(), first)
    assert not torch.equal(torch.binomial(count.expand(8, 5), prob, gen).cpu()[0], first)
    assert torch.binomial(count[:0], prob[:0]).shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_nextafter_and_frexp_bit_for_bit(mode, no_fallback, dtype):
    """torch.nextafter and torch.frexp as torch's CPU, bit for bit, over
    zeros of both signs, subnormals, the largest finite numbers,
    infinities and NaN; frexp's out form and its i32 exponent."""
    vals = [0.0, -0.0, 1.0, -1.0, 0.75, 3.0, -1e-3, 6e-5, 1e-40, -1e-41, 5e-324, 6e-8,
            65504.0, 3.0e38, 1e300, float("inf"), float("-inf"), float("nan"), 2.0, -0.25]
    dirs = [1.0, -1.0, 0.0, -0.0, float("inf"), float("-inf"), float("nan")]
    x = torch.tensor(vals, dtype=torch.float64).to(dtype)
    xs, ys = x.repeat_interleave(len(dirs)), torch.tensor(dirs, dtype=torch.float64).to(dtype).repeat(len(vals))
    want = torch.nextafter(xs, ys)
    got = torch.nextafter(xs.to("tpu"), ys.to("tpu")).cpu()
    assert got.dtype == dtype
    assert torch.equal(got.view(-1).double().isnan(), want.double().isnan())
    fin = ~want.isnan()
    assert torch.equal(torch.signbit(got[fin]), torch.signbit(want[fin])) and torch.equal(got[fin], want[fin])
    m, e = torch.frexp(x.to("tpu"))
    wm, we = torch.frexp(x)
    assert m.dtype == dtype and e.dtype == torch.int32
    m, e = m.cpu(), e.cpu()
    assert torch.equal(m.isnan(), wm.isnan()) and torch.equal(e, we)
    fin = ~wm.isnan()
    assert torch.equal(m[fin], wm[fin]) and torch.equal(torch.signbit(m[fin]), torch.signbit(wm[fin]))
    om, oe = torch.empty_like(x, device="tpu"), torch.empty(x.shape, dtype=torch.int32, device="tpu")
    torch.frexp(x.to("tpu"), out=(om, oe))
    assert torch.equal(oe.cpu(), we)
    y = x.to("tpu").clone()
    y.nextafter_(torch.ones_like(y))
    w = torch.nextafter(x, torch.ones_like(x))
    assert torch.equal(y.cpu().isnan(), w.isnan()) and torch.equal(y.cpu()[~w.isnan()], w[~w.isnan()])


def test_bessel_i_and_kaiser_window(mode, no_fallback):
    """i0, i0e, i1 and i1e against torch's CPU on both sides of the
    asymptotic switch, f32 and f64, with gradients (each one's is built
    from the others); kaiser_window (torch's stub, filled on tpu)."""
    for dtype, tol in ((torch.float32, 2e-6), (torch.float64, 1e-13)):
        x = torch.linspace(-45, 45, 91, dtype=dtype)
        for f in (torch.i0, torch.special.i0e, torch.special.i1, torch.special.i1e):
            got, want = f(x.to("tpu")).cpu(), f(x)
            torch.testing.assert_close(got, want, rtol=tol, atol=0)
    xs = torch.tensor([-25.0, -3.0, 0.5, 4.0, 30.0], dtype=torch.float64)
    for f in (torch.i0, torch.special.i0e, torch.special.i1, torch.special.i1e):
        fwd_bwd(f, xs, tol=1e-10)
    for args in ((5,), (8, False), (9, True, 5.0), (1,), (0,)):
        torch.testing.assert_close(torch.kaiser_window(*args, device="tpu").cpu(), torch.kaiser_window(*args))
    torch.testing.assert_close(torch.kaiser_window(12, dtype=torch.float64, device="tpu").cpu(),
                               torch.kaiser_window(12, dtype=torch.float64), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_weight_norm(dtype, mode, no_fallback):
    """torch._weight_norm's fused pair (dim 0 and the last dim), through
    nn.utils.weight_norm and the parametrization: the weight, the norms
    and the gradients of g and v, against torch's CPU; dim None (the whole
    tensor) takes torch's composite path."""
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.manual_seed(13)
    for dim in (0, 2, None):
        conv = torch.nn.Conv1d(3, 4, 5).to(dtype)
        ref = torch.nn.utils.parametrizations.weight_norm(conv, dim=dim)
        dev = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(3, 4, 5).to(dtype), dim=dim).to("tpu")
        dev.load_state_dict(ref.state_dict())
        x = torch.randn(2, 3, 9, dtype=dtype)
        y_ref, y = ref(x), dev(x.to("tpu"))
        torch.testing.assert_close(y.cpu(), y_ref, rtol=tol, atol=tol)
        y_ref.square().sum().backward()
        y.square().sum().backward()
        for p_ref, p in zip(ref.parameters(), dev.parameters()):
            torch.testing.assert_close(p.grad.cpu(), p_ref.grad, rtol=tol * 10, atol=tol * 10)
    v, g = torch.randn(4, 3, dtype=dtype), torch.rand(4, 1, dtype=dtype) + 0.5
    w, n = torch._weight_norm_interface(v.to("tpu"), g.to("tpu"), 0)
    w_ref, n_ref = torch._weight_norm_interface(v, g, 0)
    assert n.dtype == n_ref.dtype and n.shape == n_ref.shape
    torch.testing.assert_close(w.cpu(), w_ref, rtol=tol, atol=tol)


def test_erfcx_log_ndtr_entr_and_xlog1py(no_fallback):
    """torch.special's erfcx and log_ndtr through both tails (where the
    unscaled products over- and underflow), entr (0 at 0, -inf below),
    and xlog1py (0 where x is 0), f32 and f64, against torch's CPU; with
    gradients (torch builds them from these and exp/log)."""
    for dtype, tol in ((torch.float32, 4e-6), (torch.float64, 1e-12)):
        x = torch.cat([torch.linspace(-8, 8, 33, dtype=dtype), torch.tensor([-26.0, 30.0, 1e3], dtype=dtype)])
        for f in (torch.special.erfcx, torch.special.log_ndtr):
            torch.testing.assert_close(f(x.to("tpu")).cpu(), f(x), rtol=tol, atol=0)
        p = torch.tensor([0.0, 1e-30, 0.25, 1.0, 3.0, -1.0], dtype=dtype)
        torch.testing.assert_close(torch.special.entr(p.to("tpu")).cpu(), torch.special.entr(p), rtol=tol, atol=0)
        a = torch.tensor([0.0, 0.0, 2.0, -1.5, 3.0], dtype=dtype)
        b = torch.tensor([-1.0, float("nan"), 1e-9, 2.0, -0.5], dtype=dtype)
        torch.testing.assert_close(torch.special.xlog1py(a.to("tpu"), b.to("tpu")).cpu(), torch.special.xlog1py(a, b),
                                   rtol=tol, atol=0, equal_nan=True)
    xs = torch.tensor([-4.0, -0.2, 0.7, 5.0], dtype=torch.float64)
    for f in (torch.special.erfcx, torch.special.log_ndtr, lambda t: torch.special.entr(t.abs())):
        fwd_bwd(f, xs, tol=1e-10)
