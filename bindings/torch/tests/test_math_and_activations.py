"""Elementwise math beyond the basics and the activations (the op library's
math.rs and activation.rs): values and gradients against torch on CPU, in
every eager mode and in f32, f64 and bf16, with the CPU fallback off."""

import math

import pytest
import torch
import torch.nn.functional as F
from tpu_check import close_to_cpu

torch.manual_seed(0)
X = torch.rand(6, 8) * 4 - 2  # (-2, 2); the kinks' own points are checked in the op library's tests

# Inputs chosen so every result and gradient is finite (debug mode rejects
# NaN and Inf made from finite values).
UNARY = {
    "tan": torch.tan,
    "asin": lambda x: torch.asin(x / 2.1),
    "acos": lambda x: torch.acos(x / 2.1),
    "atan": torch.atan,
    "sinh": torch.sinh,
    "cosh": torch.cosh,
    "asinh": lambda x: torch.asinh(x * 50),
    "acosh": lambda x: torch.acosh(x.abs() + 1.01),
    "atanh": lambda x: torch.atanh(x / 2.1),
    "log2": lambda x: torch.log2(x.abs() + 0.01),
    "log10": lambda x: torch.log10(x.abs() + 0.01),
    "exp2": torch.exp2,
    "erfinv": lambda x: torch.erfinv(x / 2.1),
    "frac": lambda x: torch.frac(x * 3),
    "sinc": torch.sinc,
    "logit": lambda x: torch.logit(x.abs() / 2.1 + 0.01),
    "logit_eps": lambda x: torch.logit(x, eps=0.1),
    "elu": F.elu,
    "selu": F.selu,
    "celu": lambda x: F.celu(x, alpha=0.7),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "relu6": F.relu6,
    "hardtanh": lambda x: F.hardtanh(x, -0.5, 1.5),
    "softplus": F.softplus,
    "softplus_beta": lambda x: F.softplus(x * 4, beta=2, threshold=3),
    "hardswish": lambda x: F.hardswish(x * 2),
    "hardsigmoid": lambda x: F.hardsigmoid(x * 2),
    "mish": F.mish,
    "threshold": lambda x: F.threshold(x, 0.3, -1.0),
    "softshrink": F.softshrink,
    "hardshrink": lambda x: F.hardshrink(x, 0.7),
    "glu": lambda x: F.glu(x),
    "glu_dim0": lambda x: F.glu(x, dim=0),
    "prelu": lambda x: F.prelu(x, torch.linspace(0.1, 0.4, 8, dtype=x.dtype, device=x.device)),
    "prelu_one": lambda x: F.prelu(x, torch.tensor([0.25], dtype=x.dtype, device=x.device)),
}

BINARY = {
    "xlogy": lambda a, b: torch.xlogy(a, b.abs() + 0.1),
    "xlogy_number": lambda a, b: torch.xlogy(2.0, b.abs() + 0.1),
    "logaddexp": torch.logaddexp,
    "logaddexp2": torch.logaddexp2,
    "hypot": torch.hypot,
    "fmax": torch.fmax,
    "fmin": torch.fmin,
}

TOL = {torch.float32: 2e-6, torch.float64: 1e-12, torch.bfloat16: 1e-2}


# torch's own gradient formula for sinc cancels near 0 ((πx cos πx - sin πx)
# / πx²): a unit in the last place of sin or cos moves it by 1e-5.
GRAD_TOL = {"sinc": {torch.float32: 1e-4}}


def check(out, ref, dtype, tol=None):
    close_to_cpu(out, ref, tol or TOL[dtype])


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_values_and_gradients(name, mode, no_fallback):
    f = UNARY[name]
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        a = X.to(dtype, copy=True).requires_grad_()
        b = X.to(dtype).to("tpu").requires_grad_()
        ya, yb = f(a), f(b)
        check(yb, ya, dtype)
        # Its own generator: the weights do not depend on the tests run before.
        w = torch.randn(ya.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
        (ga,) = torch.autograd.grad(ya, a, w)
        (gb,) = torch.autograd.grad(yb, b, w.to("tpu"))
        check(gb, ga, dtype, GRAD_TOL.get(name, {}).get(dtype))


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_values_and_gradients(name, mode, no_fallback):
    f = BINARY[name]
    y = torch.randn(6, 8)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        a, c = X.to(dtype, copy=True).requires_grad_(), y.to(dtype, copy=True).requires_grad_()
        b, d = (t.detach().to("tpu").requires_grad_() for t in (a, c))
        ya, yb = f(a, c), f(b, d)
        check(yb, ya, dtype)
        grads_a = torch.autograd.grad(ya.sum(), [a, c], allow_unused=True)
        grads_b = torch.autograd.grad(yb.sum(), [b, d], allow_unused=True)
        for ga, gb in zip(grads_a, grads_b):
            assert (ga is None) == (gb is None)
            if ga is not None:
                check(gb, ga, dtype)


def test_in_place_and_out_forms(mode, no_fallback):
    for op in ("tan", "asin", "sinh", "log2", "exp2", "frac", "sinc"):
        x = X.abs() / 2.1 + 0.01
        t = x.to("tpu")
        getattr(t, op + "_")()
        check(t, getattr(x.clone(), op + "_")(), torch.float32)
        out = torch.empty(0, device="tpu")
        getattr(torch, op)(x.to("tpu"), out=out)
        check(out, getattr(torch, op)(x), torch.float32)
    t = X.to("tpu")
    F.elu_(t, 0.5)
    check(t, F.elu(X, 0.5), torch.float32)
    t = X.to("tpu")
    F.leaky_relu_(t, 0.1)
    check(t, F.leaky_relu(X, 0.1), torch.float32)
    t = X.to("tpu")
    F.hardtanh_(t, -1.0, 0.5)
    check(t, F.hardtanh(X, -1.0, 0.5), torch.float32)
    t = X.to("tpu")
    F.threshold_(t, 0.1, 20.0)
    check(t, F.threshold(X, 0.1, 20.0), torch.float32)
    out = torch.empty(0, device="tpu")
    torch.logaddexp(X.to("tpu"), X.to("tpu") * 2, out=out)
    check(out, torch.logaddexp(X, X * 2), torch.float32)
    # nn modules: in-place activations keep autograd right (elu_ and
    # leaky_relu_ differentiate from their result).
    for m in (torch.nn.ELU(inplace=True), torch.nn.LeakyReLU(0.3, inplace=True), torch.nn.SELU(inplace=True)):
        a = X.clone().requires_grad_()
        b = X.to("tpu").requires_grad_()
        ya, yb = m(a * 1.0), m(b * 1.0)
        check(yb, ya, torch.float32)
        (ga,) = torch.autograd.grad(ya.sum(), a)
        (gb,) = torch.autograd.grad(yb.sum(), b)
        check(gb, ga, torch.float32)


def test_edges_match_cpu():
    """Poles, domain ends, infinities and NaN (strict mode: debug mode
    refuses the infinities these make from finite values)."""
    inf, nan = math.inf, math.nan
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER):
        x = torch.tensor([-1.0, 1.0, 2.0, 0.0, -0.0, inf, -inf, nan, 1e30, 89.0, 8.0, 1000.0])
        for f in (torch.atanh, torch.asin, torch.acos, torch.acosh, torch.asinh, torch.sinh, torch.cosh,
                  torch.log2, torch.log10, torch.logit, torch.exp2, torch.sinc, torch.frac, F.softplus,
                  F.elu, F.mish, F.hardswish, F.softshrink, F.leaky_relu, torch.atan):
            torch.testing.assert_close(f(x.to("tpu")).cpu(), f(x), equal_nan=True, atol=1e-6, rtol=2e-6)
        # Exact powers give exact logs.
        p = torch.tensor([1.0, 8.0, 1024.0, 0.125, 1e10])
        assert torch.equal(torch.log2(p.to("tpu")).cpu()[:4], torch.tensor([0.0, 3.0, 10.0, -3.0]))
        assert torch.equal(torch.log10(p.to("tpu")).cpu()[4:], torch.tensor([10.0]))
        a = torch.tensor([0.0, 0.0, 2.0, inf, -inf, nan, 3e30])
        b = torch.tensor([0.0, nan, 0.0, inf, -inf, 1.0, 4e30])
        for f in (torch.xlogy, torch.logaddexp, torch.logaddexp2, torch.hypot, torch.fmax, torch.fmin):
            torch.testing.assert_close(f(a.to("tpu"), b.to("tpu")).cpu(), f(a, b), equal_nan=True)
        v = torch.tensor([-2.0, 0.0, 3.0, nan])
        torch.testing.assert_close(torch.heaviside(v.to("tpu"), torch.tensor(0.5, device="tpu")).cpu(),
                                   torch.heaviside(v, torch.tensor(0.5)))
        # Integer inputs promote to the default float.
        i = torch.tensor([1, 4, 16])
        assert torch.equal(torch.log2(i.to("tpu")).cpu(), torch.log2(i))
        assert torch.equal(torch.fmax(i.to("tpu"), i.flip(0).to("tpu")).cpu(), torch.fmax(i, i.flip(0)))


def test_errors_name_the_problem(no_fallback):
    with pytest.raises(RuntimeError, match="halving dimension must be even"):
        F.glu(torch.zeros(3, 5, device="tpu"))
    with pytest.raises(RuntimeError, match="frac"):
        torch.frac(torch.tensor([1, 2], device="tpu"))
    with pytest.raises(RuntimeError, match="lambda must be greater or equal to 0"):
        F.softshrink(torch.zeros(3, device="tpu"), -1.0)


def test_trunc_normal_init_runs_natively(mode, no_fallback):
    """nn.init.trunc_normal_ (ViT's and timm's weight init) draws uniforms
    and maps them through erfinv_ in place."""
    w = torch.empty(200, 50, device="tpu")
    torch.nn.init.trunc_normal_(w, mean=0.0, std=1.0, a=-2.0, b=2.0)
    v = w.cpu()
    assert v.min() >= -2.0 and v.max() <= 2.0
    # The standard normal truncated to [-2, 2]: mean 0, std 0.880.
    assert abs(v.mean().item()) < 0.05 and abs(v.std().item() - 0.880) < 0.03
