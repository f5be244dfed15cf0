"""The gamma family (lgamma, digamma, polygamma), erfc, signbit, copysign
and logspace (the op library's special.rs, math.rs and shape.rs): values and
gradients against torch on CPU in every eager mode and in f32, f64 and
bf16 with the CPU fallback off, and the torch.distributions log densities
built on them; torch.special's Bessel functions (bessel.rs) against
mpmath."""

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


# torch.special's Bessel functions (the op library's bessel.rs), against
# mpmath: torch's own are the wrong reference (its f64 J and Y are 3e-7 off
# near x = 5 and its f32 ones reduce large arguments badly: J₀(1e8) comes
# out -2.9e-5 for 3.2e-5). mpmath comes with torch (through sympy).
BESSEL = {
    # name: (mpmath function, sign of the domain, absolute near zeros)
    "bessel_j0": ("j0", 0, True),
    "bessel_j1": ("j1", 0, True),
    "bessel_y0": ("y0", 1, True),
    "bessel_y1": ("y1", 1, True),
    "modified_bessel_i0": ("i0", 0, False),
    "modified_bessel_i1": ("i1", 0, False),
    "modified_bessel_k0": ("k0", 1, False),
    "modified_bessel_k1": ("k1", 1, False),
    "scaled_modified_bessel_k0": ("k0e", 1, False),
    "scaled_modified_bessel_k1": ("k1e", 1, False),
    "spherical_bessel_j0": ("sj0", 0, True),
}


def bessel_reference(kind, x):
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 30
    v = mpmath.mpf(x)
    f = {
        "j0": lambda: mpmath.besselj(0, v),
        "j1": lambda: mpmath.besselj(1, v),
        "y0": lambda: mpmath.bessely(0, v),
        "y1": lambda: mpmath.bessely(1, v),
        "i0": lambda: mpmath.besseli(0, v),
        "i1": lambda: mpmath.besseli(1, v),
        "k0": lambda: mpmath.besselk(0, v),
        "k1": lambda: mpmath.besselk(1, v),
        "k0e": lambda: mpmath.besselk(0, v) * mpmath.exp(v),
        "k1e": lambda: mpmath.besselk(1, v) * mpmath.exp(v),
        "sj0": lambda: mpmath.sin(v) / v,
    }[kind]
    return float(f())


@pytest.mark.parametrize("name", sorted(BESSEL))
def test_bessel_functions_match_mpmath(name, mode, no_fallback):
    """Across the series, middle and large-argument ranges (switches at 1,
    2, 9 for f32 and 18 for f64), out to 1e4, in f32 and f64; J and Y
    absolutely where they are below 1 (near their zeros), the rest
    relatively; the out= form, integer promotion and bf16 (computed in
    f32; torch's CPU has no bf16 kernels for these); no gradient, as torch."""
    kind, sign, absolute = BESSEL[name]
    f = getattr(torch.special, name)
    g = torch.Generator().manual_seed(3)
    base = torch.cat([torch.rand(40, generator=g) * 40, torch.tensor([0.03, 0.99, 1.01, 1.99, 2.01, 8.99, 9.01,
                                                                       17.99, 18.01, 250.5, 9999.0])])
    x64 = base.double() + 0.01 if sign else torch.cat([base, -base]).double()
    # I overflows f32 past 88, and its e^x magnifies x's last digit there.
    growing = name.startswith("modified_bessel_i")
    if growing:
        x64 = x64.clamp(-80, 80)
    for dtype, tol in ((torch.float64, 2e-14 if growing else 4e-15), (torch.float32, 6e-6 if growing else 6e-7)):
        x = x64.to(dtype)
        want = torch.tensor([bessel_reference(kind, v) for v in x.double().tolist()], dtype=torch.float64)
        got = f(x.to("tpu"))
        assert got.dtype == dtype and not got.requires_grad
        got = got.cpu().double()
        scale = want.abs().clamp(min=1.0) if absolute else want.abs().clamp(min=1e-300)
        bad = ((got - want).abs() / scale > tol) & (want.abs() > torch.finfo(dtype).tiny)
        assert not bad.any(), (name, dtype, x[bad], got[bad], want[bad])
    out = torch.empty(0, device="tpu")
    f(x64.float().to("tpu"), out=out)
    torch.testing.assert_close(out.cpu(), f(x64.float().to("tpu")).cpu(), rtol=0, atol=0)
    i = torch.tensor([1, 2, 5, 10])
    got = f(i.to("tpu")).cpu()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, f(i.to("tpu").float()).cpu(), rtol=0, atol=0)
    b = f(x64.to(torch.bfloat16).to("tpu")).cpu()
    assert b.dtype == torch.bfloat16
    torch.testing.assert_close(b, f(x64.to(torch.bfloat16).float().to("tpu")).cpu().to(torch.bfloat16), rtol=0, atol=0)


def test_bessel_edges_match_cpu():
    """Signed zeros, negative arguments, infinities and NaN as torch's CPU
    (strict mode: debug mode refuses the infinities and NaN these make from
    finite values). torch's J(±inf) and Y(inf) are NaN, K(inf) 0."""
    inf, nan = math.inf, math.nan
    x = torch.tensor([0.0, -0.0, -1.0, -30.0, inf, -inf, nan, 1e-30, 1e30], dtype=torch.float64)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER):
        for name in sorted(BESSEL):
            f = getattr(torch.special, name)
            for dtype in (torch.float64, torch.float32):
                v = x.to(dtype)
                got, want = f(v.to("tpu")).cpu(), f(v)
                if name.startswith("modified_bessel_i"):
                    # The limits, where torch's I gives NaN (inf / inf
                    # inside its formula; so does its torch.i0).
                    assert got[4:6].tolist() == ([inf, inf] if name.endswith("0") else [inf, -inf]), got
                    got[4:6], want[4:6] = 0.0, 0.0
                # 1e30 and -30 are values, not edges: only whether finite.
                torch.testing.assert_close(got[:7], want[:7], equal_nan=True, rtol=1e-6, atol=1e-30, msg=name)
                assert torch.isfinite(got[7:]).tolist() == torch.isfinite(want[7:]).tolist(), (name, got, want)


# torch.special's orthogonal polynomials (the op library's orthogonal.rs).
POLYNOMIALS = [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_orthogonal_polynomials_match_cpu(name, mode, no_fallback):
    """Inside, on and outside [-1, 1] (the shifted ones' [0, 1]) for
    degrees -1 to 30, fractional ones truncated, against torch's CPU in f64
    (relatively where large, absolutely near zero, scaled by the degree: the
    Chebyshev closed forms round nθ); f32 against the same; the Scalar x and
    Scalar n overloads, out=, integer promotion; no gradient, as torch."""
    f = getattr(torch.special, name)
    g = torch.Generator().manual_seed(5)
    lo, hi = (-0.25, 1.25) if name.startswith("shifted") else (-1.5, 1.5)
    x = torch.cat([torch.rand(60, generator=g, dtype=torch.float64) * (hi - lo) + lo,
                   torch.tensor([-1.0, 1.0, 0.0, 0.5, -1.0, 1.0], dtype=torch.float64)])
    n = torch.cat([torch.randint(-1, 31, (60,), generator=g), torch.tensor([3, 4, 7, 30, 12, 11])]).double()
    n[::7] += 0.6  # truncated toward zero
    want = f(x, n)
    scale = want.abs().clamp(min=1.0) * (1.0 + n.clamp(min=0))
    for dtype, tol in ((torch.float64, 1e-13), (torch.float32, 2e-6)):
        got = f(x.to(dtype).to("tpu"), n.to(dtype).to("tpu"))
        assert got.dtype == dtype and not got.requires_grad
        # f32: against f64 at the argument f32 holds.
        ref = f(x.to(dtype).double(), n) if dtype == torch.float32 else want
        err = ((got.cpu().double() - ref) / scale).abs()
        assert err.max() < tol, (name, dtype, x[err.argmax()], n[err.argmax()], got.cpu()[err.argmax()], ref[err.argmax()])
    xt, nt = x.float().to("tpu"), n.to(torch.int64).to("tpu")
    torch.testing.assert_close(f(xt, 5).cpu(), f(x.float(), 5), rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(f(0.25, nt).cpu(), f(0.25, n.to(torch.int64)), rtol=2e-5, atol=2e-5)
    out = torch.empty(0, device="tpu")
    f(xt, nt, out=out)
    torch.testing.assert_close(out.cpu(), f(xt, nt).cpu(), rtol=0, atol=0)
    i = torch.tensor([0, 1, 2, 3])
    got = f(i.to("tpu"), i.to("tpu")).cpu()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, f(i, i))


def test_orthogonal_polynomials_at_high_degree(no_fallback):
    """The Chebyshev closed forms at any degree: T_n(cos θ) = cos nθ at
    n = 10⁵ (torch loops 10⁵ times per element), and outside [-1, 1] the
    overflow is ±inf where torch's recurrence gives NaN; the recurrences
    take degrees up to 256, and a larger one is an error naming the limit."""
    theta = torch.tensor([0.1, 0.7, 2.0], dtype=torch.float64)
    got = torch.special.chebyshev_polynomial_t(theta.cos().to("tpu"), 100000).cpu()
    torch.testing.assert_close(got, (1e5 * theta).cos(), rtol=0, atol=1e-10)
    got = torch.special.chebyshev_polynomial_t(torch.tensor([2.0, -2.0], device="tpu"), 2001).cpu()
    assert got.tolist() == [math.inf, -math.inf]
    x = torch.tensor([-0.9, 0.3, 0.99], dtype=torch.float64)
    got = torch.special.legendre_polynomial_p(x.to("tpu"), 250).cpu()
    torch.testing.assert_close(got, torch.special.legendre_polynomial_p(x, 250), rtol=1e-11, atol=1e-13)
    with pytest.raises(RuntimeError, match="degrees n up to 256"):
        torch.special.legendre_polynomial_p(x.to("tpu"), torch.tensor([300], device="tpu"))


def incomplete_gamma_reference(a, x):
    """(P, Q) from mpmath at 50 digits: P by its series where x < a + 1, Q
    by Legendre's continued fraction elsewhere, each to convergence."""
    mp = pytest.importorskip("mpmath")
    with mp.workdps(50):
        a, x = mp.mpf(a), mp.mpf(x)
        pre = mp.exp(a * mp.log(x) - x - mp.loggamma(a))
        eps = mp.mpf(10) ** -45
        if x < a + 1:
            term = s = 1 / a
            n = 0
            while term > s * eps:
                n += 1
                term = term * x / (a + n)
                s += term
            return float(pre * s), float(1 - pre * s)
        tiny = mp.mpf(10) ** -300
        b = x + 1 - a
        c, d = 1 / tiny, 1 / b
        h, i = d, 0
        while True:
            i += 1
            an = -i * (i - a)
            b += 2
            d = an * d + b or tiny
            c = b + an / c or tiny
            d = 1 / d
            h *= d * c
            if abs(d * c - 1) < eps:
                return float(1 - pre * h), float(pre * h)


def test_incomplete_gamma_matches_mpmath(mode, no_fallback):
    """torch.special.gammainc and gammaincc (igamma, igammac) in each of
    their pieces: Q's small-x series (a small), P's power series, the
    continued fraction, Temme's expansion (a > 20, x/a in [0.6, 1.4]) and
    large a outside it, and the seams between them; relatively, within
    8e-14 (f64) or 2e-5 (f32) plus 2aε, the conditioning a (λ - 1 - ln λ)
    inherits from the inputs' rounding. torch's own f64 kernel is 1e-9 off
    in places (3.5e-9 at a = 2e-8, x = 0.46)."""
    pairs = [(1e-3, 0.3), (1e-6, 1.05), (0.5, 0.2), (0.9, 0.5001), (1.2, 1.0999), (2.5, 1.7), (3.0, 12.0),
             (0.3, 30.0), (7.0, 0.01), (9.99, 11.0), (10.0, 11.0), (19.5, 21.0), (20.5, 18.0), (25.0, 14.9),
             (25.0, 15.1), (50.0, 45.0), (50.0, 56.0), (60.0, 84.1), (100.0, 40.0), (100.0, 180.0),
             (2e-8, 0.46), (1e4, 1.01e4), (1e4, 9.5e3), (3e3, 1.7e3)]
    a64 = torch.tensor([p[0] for p in pairs], dtype=torch.float64)
    x64 = torch.tensor([p[1] for p in pairs], dtype=torch.float64)
    for dtype, base in ((torch.float64, 8e-14), (torch.float32, 2e-5)):
        a, x = a64.to(dtype), x64.to(dtype)
        ref = [incomplete_gamma_reference(p, q) for p, q in zip(a.double().tolist(), x.double().tolist())]
        tol = base + 2 * a.double() * torch.finfo(dtype).eps
        for k, f in enumerate((torch.special.gammainc, torch.special.gammaincc)):
            got = f(a.to("tpu"), x.to("tpu"))
            assert got.dtype == dtype
            got = got.cpu().double()
            want = torch.tensor([r[k] for r in ref], dtype=torch.float64)
            err = (got - want).abs() / want.abs().clamp(min=torch.finfo(dtype).tiny)
            assert not (err > tol).any(), (f.__name__, dtype, a[err > tol], x[err > tol], got[err > tol], want[err > tol])


def near(out, ref, rtol, atol):
    """`out` is on tpu and matches `ref` (on CPU) in dtype, shape and values."""
    assert out.device.type == "tpu"
    out = out.cpu()
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)


def test_incomplete_gamma_forms_and_gradient(mode, no_fallback):
    """Broadcasting, a zero-dimensional operand, the in-place and out=
    forms, bf16 (computed at f32), agreement with torch's CPU on a grid (to
    1e-8: its own f64 kernel is that far off), and the gradient in x (torch
    gives none in a), through torch.distributions' Gamma and Chi2 cdf."""
    g = torch.Generator().manual_seed(11)
    a = torch.rand(6, 1, generator=g, dtype=torch.float64) * 40
    x = torch.rand(1, 7, generator=g, dtype=torch.float64) * 50
    for f in (torch.special.gammainc, torch.special.gammaincc):
        near(f(a.to("tpu"), x.to("tpu")), f(a, x), 1e-8, 1e-300)
        near(f(a.float().to("tpu"), torch.tensor(2.5, device="tpu")), f(a.float(), torch.tensor(2.5)), 2e-5, 1e-30)
        b = f(a.to(torch.bfloat16).to("tpu"), x.to(torch.bfloat16).to("tpu")).cpu()
        assert b.dtype == torch.bfloat16
        want = f(a.to(torch.bfloat16).float().to("tpu"), x.to(torch.bfloat16).float().to("tpu")).cpu()
        torch.testing.assert_close(b, want.to(torch.bfloat16), rtol=0, atol=0)
    t = a.expand(6, 7).contiguous().to("tpu")
    t.igamma_(x.to("tpu"))
    near(t, torch.igamma(a, x), 1e-8, 1e-300)
    out = torch.empty(0, dtype=torch.float64, device="tpu")
    torch.igammac(a.to("tpu"), x.to("tpu"), out=out)
    near(out, torch.igammac(a, x), 1e-8, 1e-300)

    D = torch.distributions
    v = torch.tensor([0.2, 0.5, 1.5, 3.0, 9.0])

    def make(dev):
        rate = torch.tensor([0.5, 2.0, 3.0, 6.5, 10.0], device=dev, requires_grad=True)
        conc = torch.tensor([0.7, 1.0, 2.5, 4.0, 30.0], device=dev)
        ys = [D.Gamma(conc, rate).cdf(v.to(dev)), D.Chi2(conc).cdf(v.to(dev) * rate)]
        return rate, ys

    ra, ya = make("cpu")
    rb, yb = make("tpu")
    for p, q in zip(ya, yb):
        near(q, p.detach(), 2e-5, 1e-7)
    ga = torch.autograd.grad(sum(y.sum() for y in ya), ra)[0]
    gb = torch.autograd.grad(sum(y.sum() for y in yb), rb)[0]
    near(gb, ga, 2e-5, 1e-7)


def test_incomplete_gamma_edges_match_cpu():
    """Zeros, negatives, infinities and NaN as torch's CPU (strict mode:
    debug mode refuses the NaN these make from finite values)."""
    inf, nan = math.inf, math.nan
    a = torch.tensor([0.0, 0.0, 1.0, -1.0, 1.0, inf, inf, 2.0, nan, 0.0, 5.0, 3.0, 5.0, 1e-30], dtype=torch.float64)
    x = torch.tensor([0.0, 1.0, 0.0, 1.0, -1.0, 1.0, inf, inf, 1.0, inf, -0.0, nan, 1e-300, 1e30], dtype=torch.float64)
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER):
        for f in (torch.special.gammainc, torch.special.gammaincc):
            for dtype in (torch.float64, torch.float32):
                p, q = a.to(dtype), x.to(dtype)
                torch.testing.assert_close(f(p.to("tpu"), q.to("tpu")).cpu(), f(p, q), equal_nan=True, msg=f.__name__)


def test_gamma_sample_gradient(mode, no_fallback):
    """torch._standard_gamma_grad (dx/da of a Gamma(a) sample at its
    quantile, the gradient of Gamma's rsample) against mpmath's derivative
    of P in a over ∂P/∂x, at samples drawn on tpu; within 4e-15 at f64 and
    2e-6 at f32, where torch's own kernel is 1e-5 to 3e-4 off. Then the
    gradient of Gamma(conc, rate).rsample() in both parameters, through
    autograd, against torch's CPU at the same samples (to its accuracy)."""
    mp = pytest.importorskip("mpmath")

    def reference(a, x):
        with mp.workdps(30):
            a, x = mp.mpf(a), mp.mpf(x)
            dp = mp.diff(lambda s: mp.gammainc(s, 0, x, regularized=True), a)
            return float(-dp / mp.exp((a - 1) * mp.log(x) - x - mp.loggamma(a)))

    torch.manual_seed(5)
    a64 = torch.tensor([0.02, 0.3, 0.9, 1.0, 2.5, 7.0, 9.9, 10.1, 19.0, 21.0, 35.0, 80.0, 300.0], dtype=torch.float64)
    x64 = torch._standard_gamma(a64.to("tpu")).cpu()
    for dtype, tol in ((torch.float64, 4e-15), (torch.float32, 2e-6)):
        a, x = a64.to(dtype), x64.to(dtype)
        keep = x.double() > 1e-30
        want = torch.tensor([reference(p, q) if k else 0.0 for p, q, k in
                             zip(a.double().tolist(), x.double().tolist(), keep.tolist())], dtype=torch.float64)
        got = torch._standard_gamma_grad(a.to("tpu"), x.to("tpu"))
        assert got.dtype == dtype
        err = torch.where(keep, (got.cpu().double() - want).abs() / want.abs(), 0.0)
        assert (err <= tol + 4 * torch.finfo(dtype).eps * a.double().sqrt()).all(), (dtype, a, x, err)

    conc = torch.tensor([0.4, 1.5, 3.0, 12.0, 40.0], device="tpu", requires_grad=True)
    rate = torch.tensor([0.5, 2.0, 1.0, 3.0, 0.25], device="tpu", requires_grad=True)
    y = torch.distributions.Gamma(conc, rate).rsample()
    gc, gr = torch.autograd.grad(y.sum(), [conc, rate])
    c, r, s = conc.detach().cpu(), rate.detach().cpu(), y.detach().cpu()
    near(gc, torch._standard_gamma_grad(c, s * r) / r, 1e-3, 1e-6)
    near(gr, -s / r, 1e-6, 1e-7)
