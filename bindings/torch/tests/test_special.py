"""The gamma family (lgamma, digamma, polygamma), erfc, signbit, copysign
and logspace (the op library's special.rs, math.rs and shape.rs): values and
gradients against torch on CPU in every eager mode and in f32, f64 and
bf16 with the CPU fallback off, and the torch.distributions log densities
built on them."""

import math

import pytest
import torch
from tpu_check import close_to_cpu

torch.manual_seed(0)
# Both sides of the reflection point 1/2 and of 0, away from the poles (the
# debug mode refuses the infinities made there from finite values).
X = torch.cat([torch.rand(24) * 12 + 0.05, -(torch.rand(24) * 4) - 0.03]).reshape(6, 8)
X = torch.where((X - X.round()).abs() < 0.03, X + 0.1, X)

# f64: torch's trigamma (polygamma(1), digamma's gradient) stops its
# asymptotic series at x^-7 after shifting to 6, 5e-10 off mpmath at x = 1.1
# (ours is within 1e-16 there: the op library's tests).
TOL = {torch.float32: 2e-5, torch.float64: 1e-9, torch.bfloat16: 2e-2}

UNARY = {
    "lgamma": torch.lgamma,
    "digamma": torch.digamma,
    "polygamma1": lambda x: torch.polygamma(1, x),
    "polygamma2": lambda x: torch.polygamma(2, x),
    "polygamma4": lambda x: torch.special.polygamma(4, x),
    "mvlgamma": lambda x: torch.mvlgamma(x.abs() + 2.0, p=3),
    "erfc": lambda x: torch.erfc(x - 3.0),
    "erfc_tail": lambda x: torch.special.erfc(x.abs() * 0.7),
}


def check(out, ref, dtype, tol=None):
    close_to_cpu(out, ref, tol or TOL[dtype])


@pytest.mark.parametrize("name", sorted(UNARY))
def test_gamma_family_values_and_gradients(name, mode, no_fallback):
    """The gradients chain through the family: lgamma's is digamma,
    digamma's polygamma(1), polygamma(n)'s polygamma(n + 1)."""
    f = UNARY[name]
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        a = X.to(dtype, copy=True).requires_grad_()
        b = X.to(dtype).to("tpu").requires_grad_()
        ya, yb = f(a), f(b)
        # polygamma grows like n!/x^(n+1) near the poles: relative there.
        scale = ya.detach().abs().clamp(min=1)
        check(yb / scale.to("tpu"), ya / scale, dtype)
        # Its own generator: the weights do not depend on the tests run before.
        w = torch.randn(ya.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
        (ga,) = torch.autograd.grad(ya, a, w)
        (gb,) = torch.autograd.grad(yb, b, w.to("tpu"))
        gs = ga.abs().clamp(min=1)
        check(gb / gs.to("tpu"), ga / gs, dtype)


def test_second_derivative_of_lgamma(mode, no_fallback):
    x = (X.abs() + 0.5).double()
    a, b = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    (ga,) = torch.autograd.grad(torch.lgamma(a).sum(), a, create_graph=True)
    (gb,) = torch.autograd.grad(torch.lgamma(b).sum(), b, create_graph=True)
    (ha,) = torch.autograd.grad(ga.sum(), a)
    (hb,) = torch.autograd.grad(gb.sum(), b)
    check(hb, ha, torch.float64)


def test_edges_match_cpu():
    """Poles, signed zeros, infinities and NaN (strict mode: debug mode
    refuses the infinities these make from finite values)."""
    inf, nan = math.inf, math.nan
    x = torch.tensor([0.0, -0.0, -1.0, -7.0, 1.0, 2.0, 0.5, -0.5, inf, -inf, nan, 1e30, -1e30, 1e-30])
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER):
        for f in (torch.lgamma, torch.digamma, torch.erfc):
            torch.testing.assert_close(f(x.to("tpu")).cpu(), f(x), equal_nan=True)
        # erfc's tail, relative: 1 - erf(x) is 0 from x = 4 in f32.
        t = torch.tensor([2.0, 3.0, 4.5, 6.0, 8.0, 9.0])
        got, want = torch.erfc(t.to("tpu")).cpu(), torch.erfc(t)
        assert torch.all(want > 0) and torch.all((got / want - 1).abs() < 1e-6), (got, want)
        # polygamma at its poles: (-1)^(n+1) inf, as torch's zeta gives
        # (torch's trigamma gives a large finite value at the negative
        # integers instead of inf: compared away from them).
        for n in (1, 2, 3):
            v = torch.tensor([0.0, 0.5, -0.5, -2.5, 3.0, 1e4], dtype=torch.float64)
            torch.testing.assert_close(torch.polygamma(n, v.to("tpu")).cpu(), torch.polygamma(n, v))
        assert torch.polygamma(2, torch.tensor([-3.0], device="tpu")).item() == -inf
        s = torch.tensor([-0.0, 0.0, -2.0, 3.0, -inf, inf, 1e-40, -1e-40])
        assert torch.equal(torch.signbit(s.to("tpu")).cpu(), torch.signbit(s))
        mag = torch.tensor([1.0, -2.0, 3.0, -4.0, 5.0, 6.0, 0.0, -0.0])
        got = torch.copysign(mag.to("tpu"), s.to("tpu")).cpu()
        want = torch.copysign(mag, s)
        assert torch.equal(got, want) and torch.equal(torch.signbit(got), torch.signbit(want))


def test_integer_inputs_promote(no_fallback):
    i = torch.tensor([1, 2, 5, 10])
    for f in (torch.lgamma, torch.digamma, lambda t: torch.polygamma(2, t), torch.signbit):
        got, want = f(i.to("tpu")).cpu(), f(i)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    got = torch.copysign(i.to("tpu"), torch.tensor([-1, 1, -1, 1], device="tpu")).cpu()
    assert got.dtype == torch.float32 and torch.equal(got, torch.tensor([-1.0, 2.0, -5.0, 10.0]))
    assert torch.equal(torch.signbit(torch.tensor([True, False], device="tpu")).cpu(), torch.tensor([False, False]))


def test_in_place_and_out_forms(mode, no_fallback):
    x = X.abs() + 0.1
    for op in ("lgamma", "digamma"):
        t = x.to("tpu")
        getattr(t, op + "_")()
        check(t, getattr(x.clone(), op + "_")(), torch.float32)
        out = torch.empty(0, device="tpu")
        getattr(torch, op)(x.to("tpu"), out=out)
        check(out, getattr(torch, op)(x), torch.float32)
    t = x.to("tpu")
    t.polygamma_(2)
    check(t, x.clone().polygamma_(2), torch.float32)
    out = torch.empty(0, device="tpu")
    torch.polygamma(3, x.to("tpu"), out=out)
    check(out, torch.polygamma(3, x), torch.float32)
    out = torch.empty(0, dtype=torch.bool, device="tpu")
    torch.signbit(X.to("tpu"), out=out)
    assert torch.equal(out.cpu(), torch.signbit(X))
    t = x.to("tpu")
    t.copysign_(X.to("tpu"))
    check(t, x.clone().copysign_(X), torch.float32)
    t = x.to("tpu")
    t.copysign_(-1.0)
    check(t, -x, torch.float32)
    out = torch.empty(0, device="tpu")
    torch.copysign(x.to("tpu"), X.to("tpu"), out=out)
    check(out, torch.copysign(x, X), torch.float32)


def test_copysign_gradients(mode, no_fallback):
    y = torch.randn(6, 8)
    for dtype in (torch.float32, torch.float64):
        a, c = X.to(dtype, copy=True).requires_grad_(), y.to(dtype, copy=True).requires_grad_()
        b, d = (t.detach().to("tpu").requires_grad_() for t in (a, c))
        ya, yb = torch.copysign(a, c), torch.copysign(b, d)
        check(yb, ya, dtype)
        (ga,) = torch.autograd.grad(ya.sum(), a)
        (gb,) = torch.autograd.grad(yb.sum(), b)
        check(gb, ga, dtype)


@pytest.mark.parametrize(
    "args",
    [
        dict(start=-3.0, end=2.5, steps=12),
        dict(start=0.0, end=10.0, steps=11, base=2.0),
        dict(start=1.0, end=-1.0, steps=7, base=math.e, dtype=torch.float64),
        dict(start=0.0, end=3.0, steps=4, base=2.0, dtype=torch.int64),
        dict(start=0.5, end=0.5, steps=1),
        dict(start=0.0, end=1.0, steps=0),
        dict(start=-1.0, end=1.0, steps=5, dtype=torch.bfloat16),
    ],
)
def test_logspace_matches_cpu(args, mode, no_fallback):
    got = torch.logspace(**args, device="tpu")
    want = torch.logspace(**args)
    assert got.device.type == "tpu" and got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want)


def test_distribution_log_densities(mode, no_fallback):
    """The log densities of torch.distributions that call lgamma and
    digamma, with their gradients in the parameters."""
    D = torch.distributions
    k = torch.tensor([0.0, 1.0, 3.0, 7.0, 12.0])
    v = torch.tensor([0.2, 0.5, 1.5, 3.0, 9.0])
    p = torch.tensor([0.1, 0.3, 0.5, 0.7, 0.95])

    def make(dev):
        rate = torch.tensor([0.5, 2.0, 3.0, 6.5, 10.0], device=dev, requires_grad=True)
        conc = torch.tensor([0.7, 1.0, 2.5, 4.0, 0.3], device=dev, requires_grad=True)
        return rate, conc, [
            D.Poisson(rate).log_prob(k.to(dev)),
            D.Gamma(conc, rate).log_prob(v.to(dev)),
            D.Beta(conc, rate).log_prob(p.to(dev)),
            D.StudentT(conc + 1.0).log_prob(v.to(dev) - 2.0),
            D.Dirichlet(torch.stack([conc, rate], -1)).entropy(),
            D.Gamma(conc, rate).entropy(),
        ]

    ra, ca, ya = make("cpu")
    rb, cb, yb = make("tpu")
    for a, b in zip(ya, yb):
        check(b, a.detach(), torch.float32)
    ga = torch.autograd.grad(sum(y.sum() for y in ya), [ra, ca])
    gb = torch.autograd.grad(sum(y.sum() for y in yb), [rb, cb])
    for a, b in zip(ga, gb):
        check(b, a, torch.float32)


def test_errors_name_the_problem(no_fallback):
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.polygamma(-1, torch.ones(3, device="tpu"))
    with pytest.raises(RuntimeError, match="largest order supported, 100"):
        torch.polygamma(101, torch.ones(3, device="tpu"))
    with pytest.raises(RuntimeError, match="result type Float can't be cast"):
        torch.tensor([1, 2], device="tpu").copysign_(torch.tensor([1.0, -1.0], device="tpu"))
