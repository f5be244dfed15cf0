"""Linear algebra on tpu (the op library's solve.rs, qr.rs and
spectral.rs, matrix_exp.rs): solve, inv, det, slogdet, LU factors and solves with them,
triangular solves, Cholesky factors, solves and inverses, Householder QR
(geqrf, householder_product, ormqr, linalg.qr), least squares (lstsq,
gels), eigh and the SVD (and what torch builds on them: pinv,
matrix_rank, cond, the 2- and nuclear norms), the matrix exponential;
values and
gradients against torch on CPU in every eager mode with the CPU fallback
off, in f32 and f64, and torch.distributions' multivariate normal built on
them."""

import pytest
import torch
from tpu_check import close_to_cpu

TOL = {torch.float32: 2e-4, torch.float64: 1e-10}
DTYPES = (torch.float32, torch.float64)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def matrices(*shape, dtype=torch.float64, seed=0, boost=3.0):
    """Random square matrices with `boost` added on the diagonal: invertible
    and well enough conditioned for f32 comparisons, still pivoting."""
    a = torch.randn(*shape, generator=gen(seed), dtype=torch.float64)
    a = a + boost * torch.eye(shape[-1], dtype=torch.float64)
    return a.to(dtype)


def rand(*shape, dtype=torch.float64, seed=1):
    return torch.randn(*shape, generator=gen(seed), dtype=torch.float64).to(dtype)


def both(*ts):
    """Each tensor as a CPU leaf and a tpu leaf needing gradients."""
    return [(t.clone().requires_grad_(), t.to("tpu").requires_grad_()) for t in ts]


def check_grads(f, inputs, dtype):
    """f's value and its gradients at `inputs` on tpu match CPU's."""
    pairs = both(*inputs)
    cpu = f(*[p[0] for p in pairs])
    tpu = f(*[p[1] for p in pairs])
    cpu = cpu if isinstance(cpu, tuple) else (cpu,)
    tpu = tpu if isinstance(tpu, tuple) else (tpu,)
    for a, b in zip(cpu, tpu):
        close_to_cpu(b.detach(), a.detach(), TOL[dtype])
    ws = [torch.randn(a.shape, generator=gen(7), dtype=a.dtype) for a in cpu]
    ga = torch.autograd.grad(cpu, [p[0] for p in pairs], ws)
    gb = torch.autograd.grad(tpu, [p[1] for p in pairs], [w.to("tpu") for w in ws])
    for a, b in zip(ga, gb):
        close_to_cpu(b, a, TOL[dtype] * 10)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_solve_inv_det_values_and_gradients(dtype, mode, no_fallback):
    A = matrices(2, 5, 5, dtype=dtype)
    B = rand(2, 5, 3, dtype=dtype)
    check_grads(torch.linalg.solve, (A, B), dtype)
    # A vector right-hand side and a batch broadcast against one matrix.
    check_grads(torch.linalg.solve, (A, rand(5, dtype=dtype, seed=2)), dtype)
    check_grads(torch.linalg.solve, (A[0], rand(3, 5, 2, dtype=dtype, seed=3)), dtype)
    check_grads(lambda a, b: torch.linalg.solve(a, b, left=False), (A, rand(2, 4, 5, dtype=dtype)), dtype)
    check_grads(torch.linalg.inv, (A,), dtype)
    check_grads(torch.inverse, (A[1],), dtype)
    check_grads(torch.linalg.det, (A,), dtype)
    # A transposed view (torch factors a row-major A's transpose for the
    # determinant, and its backward counts on which).
    check_grads(lambda a: torch.linalg.det(a.mT), (A,), dtype)
    check_grads(lambda a: torch.linalg.slogdet(a), (rand(3, 4, 4, dtype=dtype),), dtype)
    check_grads(torch.logdet, (A @ A.mT,), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matrix_exp_values_and_gradients(dtype, mode, no_fallback):
    """Small norms (no squarings), a batch whose largest norm needs
    several (skew-symmetric, so exp is a rotation and f32 compares
    absolutely), a diagonal one whose entries span exp(-40) to exp(8);
    the gradient is torch's block-matrix formula on tpu's exponential."""
    check_grads(torch.linalg.matrix_exp, (0.3 * rand(2, 4, 4, dtype=dtype),), dtype)
    m = 6.0 * rand(3, 5, 5, dtype=torch.float64, seed=4)
    check_grads(torch.linalg.matrix_exp, ((m - m.mT).to(dtype),), dtype)
    check_grads(torch.matrix_exp, (rand(3, 3, dtype=dtype, seed=5),), dtype)
    d = torch.diag(torch.tensor([-40.0, 0.5, 8.0], dtype=dtype))
    got = torch.linalg.matrix_exp(d.to("tpu")).cpu()
    torch.testing.assert_close(got, torch.linalg.matrix_exp(d), rtol=TOL[dtype], atol=0)
    out = torch.empty(0, dtype=dtype, device="tpu")
    torch.ops.aten.linalg_matrix_exp.out(d.to("tpu"), out=out)
    assert torch.equal(out.cpu(), got)
    # An empty batch and a 0 x 0 matrix.
    for shape in ((0, 3, 3), (2, 0, 0)):
        close_to_cpu(torch.linalg.matrix_exp(torch.zeros(shape, dtype=dtype, device="tpu")),
                     torch.linalg.matrix_exp(torch.zeros(shape, dtype=dtype)), 0)


def test_matrix_exp_half_types_and_errors(mode, no_fallback):
    """bf16 and f16 are computed in f32 and rounded once (torch's CPU
    kernel gives garbage for them, so the reference is f32's); integers
    and non-square matrices are torch's errors."""
    a = 0.5 * rand(2, 3, 3, seed=6)
    for dt in (torch.bfloat16, torch.float16):
        got = torch.linalg.matrix_exp(a.to(dt).to("tpu"))
        want = torch.linalg.matrix_exp(a.to(dt).float()).to(dt)
        assert got.dtype == dt
        torch.testing.assert_close(got.cpu(), want, atol=1e-2, rtol=1e-2)
    with pytest.raises(RuntimeError, match="floating point"):
        torch.linalg.matrix_exp(torch.ones(2, 2, dtype=torch.long, device="tpu"))
    with pytest.raises(RuntimeError, match="square"):
        torch.linalg.matrix_exp(torch.ones(2, 3, device="tpu"))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lu_factors_match_lapack(dtype, mode, no_fallback):
    """The same pivots as LAPACK's (ties aside, random matrices have
    none), so the same packed factors; square and rectangular."""
    for shape in ((3, 4, 4), (5, 3), (3, 6)):
        A = rand(*shape, dtype=dtype, seed=len(shape))
        LU, piv = torch.linalg.lu_factor(A.to("tpu"))
        LUc, pivc = torch.linalg.lu_factor(A)
        assert piv.dtype == torch.int32 and torch.equal(piv.cpu(), pivc)
        close_to_cpu(LU, LUc, TOL[dtype])
        for got, want in zip(torch.linalg.lu(A.to("tpu")), torch.linalg.lu(A)):
            close_to_cpu(got, want, TOL[dtype])
        for got, want in zip(torch.lu_unpack(LU, piv), torch.lu_unpack(LUc, pivc)):
            close_to_cpu(got, want, TOL[dtype])
    # The factors' gradient (torch's lu_factor_ex backward, on tpu ops).
    check_grads(lambda a: torch.linalg.lu_factor(a)[0], (matrices(2, 4, 4, dtype=dtype),), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lu_solve_every_side(dtype, mode, no_fallback):
    A = matrices(2, 4, 4, dtype=dtype)
    LU, piv = torch.linalg.lu_factor(A)
    for left in (True, False):
        for adjoint in (False, True):
            B = rand(2, 4, 3, dtype=dtype) if left else rand(2, 3, 4, dtype=dtype)
            f = lambda lu, b: torch.linalg.lu_solve(lu, piv.to(lu.device), b, left=left, adjoint=adjoint)
            check_grads(f, (LU, B), dtype)


@pytest.mark.filterwarnings("ignore:torch.triangular_solve is deprecated")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_triangular_solves(dtype, mode, no_fallback):
    A = matrices(2, 4, 4, dtype=dtype)
    for upper in (True, False):
        for left in (True, False):
            for unit in (False, True):
                B = rand(2, 4, 3, dtype=dtype) if left else rand(3, 4, dtype=dtype)
                f = lambda a, b: torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit)
                check_grads(f, (A, B), dtype)
    # The old API, transposed or not: the solution and A broadcast.
    B = rand(3, 2, 4, 2, dtype=dtype)
    for transpose in (False, True):
        got = torch.triangular_solve(B.to("tpu"), A.to("tpu"), upper=False, transpose=transpose)
        want = torch.triangular_solve(B, A, upper=False, transpose=transpose)
        for g, w in zip(got, want):
            close_to_cpu(g, w, TOL[dtype])


def spd(*shape, dtype=torch.float64, seed=0):
    m = torch.randn(*shape, generator=gen(seed), dtype=torch.float64)
    return (m @ m.mT + shape[-1] * torch.eye(shape[-1], dtype=torch.float64)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cholesky_solve_and_inverse(dtype, mode, no_fallback):
    A = spd(2, 5, 5, dtype=dtype)
    for upper in (False, True):
        # The gradient through a symmetric use of A (torch's formula
        # assumes a symmetric perturbation).
        check_grads(lambda a: torch.linalg.cholesky(a + a.mT, upper=upper), (A,), dtype)
        L = torch.linalg.cholesky(A, upper=upper)
        check_grads(lambda b, l: torch.cholesky_solve(b, l, upper=upper), (rand(3, 2, 5, 2, dtype=dtype), L), dtype)
        check_grads(lambda l: torch.cholesky_inverse(l, upper=upper), (L[0],), dtype)
    bad = A.clone()
    bad[1, 3, 3] = -100.0
    L, info = torch.linalg.cholesky_ex(bad.to("tpu"))
    assert info.cpu().tolist() == torch.linalg.cholesky_ex(bad).info.tolist() == [0, 4]
    assert torch.isfinite(L.cpu()).all()


def test_multivariate_normal_log_prob(mode, no_fallback):
    """torch.distributions' multivariate normal: Cholesky, triangular
    solves and the log-determinant, all on tpu."""
    cov = spd(3, 3)
    loc = rand(3)
    x = rand(5, 3, seed=5)
    want = torch.distributions.MultivariateNormal(loc, covariance_matrix=cov).log_prob(x)
    dist = torch.distributions.MultivariateNormal(loc.to("tpu"), covariance_matrix=cov.to("tpu"))
    close_to_cpu(dist.log_prob(x.to("tpu")), want, 1e-10)
    close_to_cpu(dist.entropy(), torch.distributions.MultivariateNormal(loc, cov).entropy(), 1e-10)


@pytest.mark.filterwarnings("ignore:torch.triangular_solve is deprecated")
def test_out_forms_and_zero_size(no_fallback):
    A = matrices(3, 3)
    out = torch.empty(0, device="tpu", dtype=torch.float64)
    torch.linalg.inv(A.to("tpu"), out=out)
    close_to_cpu(out, torch.linalg.inv(A), 1e-12)
    out = torch.empty(0, device="tpu", dtype=torch.float64)
    torch.linalg.solve(A.to("tpu"), rand(3, 2).to("tpu"), out=out)
    close_to_cpu(out, torch.linalg.solve(A, rand(3, 2)), 1e-12)
    sign, logabs = torch.empty(0, device="tpu", dtype=torch.float64), torch.empty(0, device="tpu", dtype=torch.float64)
    torch.linalg.slogdet(A.to("tpu"), out=(sign, logabs))
    close_to_cpu(logabs, torch.linalg.slogdet(A).logabsdet, 1e-12)
    # The multi-output out= forms, each against its functional form on CPU.
    f64, i32 = (lambda: torch.empty(0, device="tpu", dtype=torch.float64)), (
        lambda: torch.empty(0, device="tpu", dtype=torch.int32))
    At, S = A.to("tpu"), spd(3, 3)
    LU, piv, info = f64(), i32(), i32()
    torch.linalg.lu_factor_ex(At, out=(LU, piv, info))
    for got, want in zip((LU, piv, info), torch.linalg.lu_factor_ex(A)):
        close_to_cpu(got, want, 1e-12)
    plu = (f64(), f64(), f64())
    torch.linalg.lu(At, out=plu)
    for got, want in zip(plu, torch.linalg.lu(A)):
        close_to_cpu(got, want, 1e-12)
    plu = (f64(), f64(), f64())
    torch.lu_unpack(LU, piv, out=plu)
    for got, want in zip(plu, torch.linalg.lu(A)):
        close_to_cpu(got, want, 1e-12)
    det = f64()
    torch.linalg.det(At, out=det)
    close_to_cpu(det, torch.linalg.det(A), 1e-12)
    inv, info = f64(), i32()
    torch.linalg.inv_ex(At, out=(inv, info))
    close_to_cpu(inv, torch.linalg.inv(A), 1e-12)
    L, info = f64(), i32()
    torch.linalg.cholesky_ex(S.to("tpu"), out=(L, info))
    close_to_cpu(L, torch.linalg.cholesky(S), 1e-12)
    X, M = f64(), f64()
    torch.triangular_solve(rand(3, 2).to("tpu"), At, out=(X, M))
    for got, want in zip((X, M), torch.triangular_solve(rand(3, 2), A)):
        close_to_cpu(got, want, 1e-12)
    # Empty matrices: det 1, inverse and solution empty.
    e = torch.zeros(2, 0, 0, device="tpu")
    assert torch.linalg.det(e).cpu().tolist() == [1.0, 1.0]
    assert torch.linalg.inv(e).shape == (2, 0, 0)
    assert torch.linalg.solve(e, torch.zeros(2, 0, 3, device="tpu")).shape == (2, 0, 3)
    assert torch.linalg.det(torch.zeros(0, 3, 3, device="tpu")).shape == (0,)


def test_singular_and_bad_inputs_raise_torchs_errors():
    sing = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    for f in (torch.linalg.inv, lambda a: torch.linalg.solve(a, torch.ones(2, 1, device=a.device))):
        with pytest.raises(torch.linalg.LinAlgError) as cpu:
            f(sing)
        with pytest.raises(torch.linalg.LinAlgError) as tpu:
            f(sing.to("tpu"))
        assert str(tpu.value) == str(cpu.value)
    inv, info = torch.linalg.inv_ex(sing.to("tpu"))
    assert info.item() == torch.linalg.inv_ex(sing).info.item() == 2
    assert torch.linalg.det(sing.to("tpu")).item() == 0.0
    sign, logabs = torch.linalg.slogdet(sing.to("tpu"))
    assert sign.item() == 0.0 and logabs.item() == float("-inf")
    with pytest.raises(RuntimeError, match="float32 or float64"):
        torch.linalg.det(torch.ones(2, 2, dtype=torch.int64, device="tpu"))
    with pytest.raises(RuntimeError, match="square"):
        torch.linalg.inv(torch.ones(2, 3, device="tpu"))
    with pytest.raises(RuntimeError, match="incompatible"):
        torch.linalg.solve(torch.eye(3, device="tpu"), torch.ones(2, 1, device="tpu"))
    with pytest.raises(RuntimeError, match="without pivoting"):
        torch.linalg.lu_factor(torch.eye(3, device="tpu"), pivot=False)


def test_pivots_out_of_range_are_an_error(no_fallback):
    """Pivots index rows: one outside 1..n is refused (on the xla platform
    too, where the loop itself could not tell)."""
    LU, piv = torch.linalg.lu_factor(matrices(3, 3).to("tpu"))
    bad = piv.clone()
    bad[1] = 7
    B = torch.ones(3, 1, device="tpu", dtype=torch.float64)
    # On a stream of its own, which the error poisons until reset.
    s = torch.tpu.Stream()
    s.wait_stream(torch.tpu.current_stream())
    with torch.tpu.stream(s):
        x = torch.linalg.lu_solve(LU, bad, B)
    with pytest.raises(RuntimeError, match=r"lu_solve.*index 6 at position \[0, 1\] is out of range"):
        s.synchronize()
    s.reset()
    del x


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_householder_qr_matches_lapack(dtype, mode, no_fallback):
    """LAPACK's reflectors (signs included), so the same packed geqrf, Q
    and R as torch on CPU; tall, square, wide and batched."""
    for shape in ((3, 5, 3), (4, 4), (3, 6), (2, 1, 4, 2)):
        A = rand(*shape, dtype=dtype, seed=len(shape) + shape[-1])
        a, tau = torch.geqrf(A.to("tpu"))
        ac, tauc = torch.geqrf(A)
        close_to_cpu(a, ac, TOL[dtype])
        close_to_cpu(tau, tauc, TOL[dtype])
        k = min(shape[-2:])
        close_to_cpu(torch.linalg.householder_product(a[..., :k], tau),
                     torch.linalg.householder_product(ac[..., :k], tauc), TOL[dtype])
        for m in ("reduced", "complete", "r"):
            Q, R = torch.linalg.qr(A.to("tpu"), mode=m)
            Qc, Rc = torch.linalg.qr(A, mode=m)
            assert Q.shape == Qc.shape and R.shape == Rc.shape, m
            close_to_cpu(Q, Qc, TOL[dtype])
            close_to_cpu(R, Rc, TOL[dtype])
        C = rand(*shape[:-1], 2, dtype=dtype, seed=9)
        for left, transpose in ((True, False), (True, True)):
            close_to_cpu(torch.ormqr(a, tau, C.to("tpu"), left, transpose), torch.ormqr(ac, tauc, C, left, transpose),
                         TOL[dtype])
        D = rand(*shape[:-2], 3, shape[-2], dtype=dtype, seed=10)
        close_to_cpu(torch.ormqr(a, tau, D.to("tpu"), left=False), torch.ormqr(ac, tauc, D, left=False), TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_qr_gradients(dtype, mode, no_fallback):
    """torch's backward formulas for qr, householder_product and ormqr run
    on tpu ops."""
    check_grads(torch.linalg.qr, (rand(2, 5, 3, dtype=dtype),), dtype)
    check_grads(torch.linalg.qr, (rand(3, 5, dtype=dtype, seed=2),), dtype)
    check_grads(lambda a: torch.linalg.qr(a, mode="complete"), (rand(4, 4, dtype=dtype, seed=3),), dtype)
    a, tau = torch.geqrf(rand(5, 3, dtype=dtype, seed=4))
    check_grads(torch.linalg.householder_product, (a, tau), dtype)
    check_grads(lambda a, t, c: torch.ormqr(a, t, c, transpose=True), (a, tau, rand(5, 2, dtype=dtype, seed=5)),
                dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lstsq_matches_gels(dtype, mode, no_fallback):
    """Least squares as torch's gels driver: tall (residuals too), wide
    (the minimum-norm solution), a vector right-hand side, broadcast
    batches; gels is the default off the CPU."""
    cases = (
        (rand(2, 6, 3, dtype=dtype), rand(2, 6, 2, dtype=dtype, seed=2)),
        (rand(3, 5, dtype=dtype, seed=3), rand(3, 2, dtype=dtype, seed=4)),
        (rand(2, 6, 3, dtype=dtype, seed=5), rand(2, 6, dtype=dtype, seed=6)),
        (rand(3, 1, 5, 2, dtype=dtype, seed=7), rand(1, 4, 5, 3, dtype=dtype, seed=8)),
    )
    for A, B in cases:
        got = torch.linalg.lstsq(A.to("tpu"), B.to("tpu"))
        want = torch.linalg.lstsq(A, B, driver="gels")
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            close_to_cpu(g, w, TOL[dtype] * 10)
    X = torch.empty(0, device="tpu", dtype=dtype)
    outs = (X, torch.empty(0, device="tpu", dtype=dtype), torch.empty(0, device="tpu", dtype=torch.int64),
            torch.empty(0, device="tpu", dtype=dtype))
    A, B = cases[0]
    torch.linalg.lstsq(A.to("tpu"), B.to("tpu"), driver="gels", out=outs)
    close_to_cpu(X, torch.linalg.lstsq(A, B, driver="gels").solution, TOL[dtype] * 10)


def test_qr_out_forms_zero_size_and_errors(no_fallback):
    A = rand(4, 3)
    f64 = lambda: torch.empty(0, device="tpu", dtype=torch.float64)  # noqa: E731
    Q, R = f64(), f64()
    torch.linalg.qr(A.to("tpu"), mode="complete", out=(Q, R))
    for got, want in zip((Q, R), torch.linalg.qr(A, mode="complete")):
        close_to_cpu(got, want, 1e-12)
    a, tau = f64(), f64()
    torch.geqrf(A.to("tpu"), out=(a, tau))
    close_to_cpu(tau, torch.geqrf(A).tau, 1e-12)
    out = f64()
    torch.linalg.householder_product(a, tau, out=out)
    close_to_cpu(out, torch.linalg.qr(A).Q, 1e-12)
    out = f64()
    torch.ormqr(a, tau, rand(4, 2).to("tpu"), out=out)
    close_to_cpu(out, torch.ormqr(*torch.geqrf(A), rand(4, 2)), 1e-12)
    for shape in ((0, 3, 2), (3, 0), (2, 0, 0)):
        Q, R = torch.linalg.qr(torch.zeros(shape, device="tpu"))
        Qc, Rc = torch.linalg.qr(torch.zeros(shape))
        assert Q.shape == Qc.shape and R.shape == Rc.shape
    with pytest.raises(RuntimeError, match="unrecognized mode 'full'"):
        torch.linalg.qr(A.to("tpu"), mode="full")
    with pytest.raises(RuntimeError, match='driver must be one of gels, gelsy, gelsd or gelss, got "gelsx"'):
        torch.linalg.lstsq(A.to("tpu"), rand(4, 1).to("tpu"), driver="gelsx")
    # A rank-deficient matrix: torch's gels error, word for word.
    D = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]], dtype=torch.float64)
    with pytest.raises(torch.linalg.LinAlgError) as cpu:
        torch.linalg.lstsq(D, torch.ones(3, 1, dtype=torch.float64), driver="gels")
    with pytest.raises(torch.linalg.LinAlgError) as tpu:
        torch.linalg.lstsq(D.to("tpu"), torch.ones(3, 1, dtype=torch.float64, device="tpu"))
    assert str(tpu.value) == str(cpu.value)


def aligned(got, want):
    """`got`'s columns with the signs of `want`'s (eigenvectors and singular
    vectors are determined up to sign, which LAPACK and Jacobi choose
    differently)."""
    dots = (got * want.to(got.device)).sum(-2, keepdim=True)
    return got * torch.where(dots < 0, -1.0, 1.0).to(got.dtype)


def symmetric(*shape, dtype=torch.float64, seed=0):
    a = rand(*shape, dtype=torch.float64, seed=seed)
    return (a + a.mT).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_eigh_matches_lapack(dtype, mode, no_fallback):
    """Eigenvalues ascending as LAPACK's, eigenvectors up to sign; the
    triangle UPLO names is the one read; eigvalsh."""
    for shape in ((3, 6, 6), (5, 5), (1, 1)):
        A = symmetric(*shape, dtype=dtype, seed=shape[-1])
        for uplo in ("L", "U"):
            junk = A.triu(1) * 7 if uplo == "L" else A.tril(-1) * 7
            w, V = torch.linalg.eigh((A + junk).to("tpu"), UPLO=uplo)
            wc, Vc = torch.linalg.eigh(A)
            close_to_cpu(w, wc, TOL[dtype] * 10)
            close_to_cpu(aligned(V, Vc), Vc, TOL[dtype] * 10)
        close_to_cpu(torch.linalg.eigvalsh(A.to("tpu")), torch.linalg.eigvalsh(A), TOL[dtype] * 10)
    A = symmetric(4, 4, dtype=dtype)
    check_grads(lambda a: (lambda w, v: (w, v * v))(*torch.linalg.eigh(a)), (A,), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_svd_matches_lapack(dtype, mode, no_fallback):
    """Singular values as LAPACK's, vectors up to sign, reduced and full,
    tall, wide and batched; and what torch builds on the SVD."""
    for shape in ((2, 5, 3), (3, 6), (4, 4), (2, 1, 3, 5)):
        A = rand(*shape, dtype=dtype, seed=shape[-1])
        for full in (False, True):
            U, S, Vh = torch.linalg.svd(A.to("tpu"), full_matrices=full)
            Uc, Sc, Vhc = torch.linalg.svd(A, full_matrices=full)
            assert U.shape == Uc.shape and Vh.shape == Vhc.shape
            close_to_cpu(S, Sc, TOL[dtype] * 10)
            k = S.shape[-1]
            close_to_cpu(aligned(U[..., :k], Uc[..., :k]), Uc[..., :k], TOL[dtype] * 100)
            close_to_cpu(aligned(Vh[..., :k, :].mT, Vhc[..., :k, :].mT), Vhc[..., :k, :].mT, TOL[dtype] * 100)
            eye = torch.eye(U.shape[-1], dtype=dtype)
            close_to_cpu(U.mT @ U, eye.expand(U.mT.shape[:-1] + (U.shape[-1],)), TOL[dtype] * 10)
        close_to_cpu(torch.linalg.svdvals(A.to("tpu")), torch.linalg.svdvals(A), TOL[dtype] * 10)
        close_to_cpu(torch.linalg.pinv(A.to("tpu")), torch.linalg.pinv(A), TOL[dtype] * 100)
        assert torch.equal(torch.linalg.matrix_rank(A.to("tpu")).cpu(), torch.linalg.matrix_rank(A))
        for ord in (2, -2, "nuc"):
            close_to_cpu(torch.linalg.matrix_norm(A.to("tpu"), ord=ord), torch.linalg.matrix_norm(A, ord=ord),
                         TOL[dtype] * 10)
    close_to_cpu(torch.linalg.cond(A.to("tpu")), torch.linalg.cond(A), TOL[dtype] * 100)
    # Rank-deficient: the rank and the pseudo-inverse see the zero.
    R = rand(4, 1, dtype=dtype) @ rand(1, 3, dtype=dtype, seed=2)
    assert torch.linalg.matrix_rank(R.to("tpu")).item() == 1
    close_to_cpu(torch.linalg.pinv(R.to("tpu")), torch.linalg.pinv(R), TOL[dtype] * 100)
    # Gradients of what the signs do not change: S, and u_0 v_0^T.
    check_grads(torch.linalg.svdvals, (rand(2, 5, 3, dtype=dtype),), dtype)
    check_grads(lambda a: (lambda u, s, vh: (s, u[..., :1] * vh[..., :1, :]))(*torch.linalg.svd(a, False)),
                (rand(4, 3, dtype=dtype, seed=3),), dtype)
    # lstsq's backward goes through pinv.
    check_grads(lambda a, b: torch.linalg.lstsq(a, b, driver="gels").solution,
                (rand(6, 3, dtype=dtype, seed=4), rand(6, 2, dtype=dtype, seed=5)), dtype)


@pytest.mark.parametrize("driver", ("gelsy", "gelsd", "gelss"))
def test_lstsq_rank_revealing_drivers(driver, mode, no_fallback):
    """The drivers that find the rank, as on CPU: solution, residuals (empty
    for gelsy, and where an A is rank-deficient), rank and singular values
    (gelsd and gelss); a rank-deficient A's minimum-norm solution and
    rank, alone and in a batch with a full-rank one; rcond."""
    deficient = torch.tensor([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]], dtype=torch.float64)
    cases = (
        (rand(2, 6, 3), rand(1, 6, 2, seed=2)),
        (rand(3, 5, seed=3), rand(3, seed=4)),
        (deficient, rand(3, 1, seed=5)),
        (torch.stack((deficient, rand(3, 2, seed=6))), rand(2, 3, 2, seed=7)),
        (deficient.T.contiguous(), rand(2, 2, seed=8)),
    )
    for A, B in cases:
        got = torch.linalg.lstsq(A.to("tpu"), B.to("tpu"), driver=driver)
        want = torch.linalg.lstsq(A, B, driver=driver)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            if g.dtype == torch.int64:
                assert torch.equal(g.cpu(), w)
            else:
                close_to_cpu(g, w, 1e-9)
    A = rand(5, 3)
    A[:, 2] = A[:, 0] * 1e-9 + A[:, 1]
    assert torch.linalg.lstsq(A.to("tpu"), rand(5, 1).to("tpu"), rcond=1e-6, driver=driver).rank.item() == 2


def test_spectral_out_forms_zero_size_and_errors(no_fallback):
    A = rand(4, 3)
    f64 = lambda: torch.empty(0, device="tpu", dtype=torch.float64)  # noqa: E731
    U, S, Vh = f64(), f64(), f64()
    torch.linalg.svd(A.to("tpu"), out=(U, S, Vh))
    assert U.shape == (4, 4) and Vh.shape == (3, 3)
    close_to_cpu(S, torch.linalg.svdvals(A), 1e-12)
    w, V = f64(), f64()
    torch.linalg.eigh(symmetric(3, 3).to("tpu"), out=(w, V))
    close_to_cpu(w, torch.linalg.eigvalsh(symmetric(3, 3)), 1e-12)
    for shape in ((0, 3, 2), (3, 0), (2, 0, 0)):
        got = torch.linalg.svd(torch.zeros(shape, device="tpu"))
        want = torch.linalg.svd(torch.zeros(shape))
        assert [t.shape for t in got] == [t.shape for t in want]
    assert torch.linalg.eigh(torch.zeros(2, 0, 0, device="tpu")).eigenvectors.shape == (2, 0, 0)
    # A NaN gives NaN (as LAPACK's eigh does; torch's CPU SVD raises
    # instead), after a sweep or two rather than all 40.
    N = symmetric(4, 4)
    N[0, 1] = N[1, 0] = float("nan")
    assert torch.linalg.eigvalsh(N.to("tpu")).isnan().any()
    assert torch.linalg.svdvals(N.to("tpu")).isnan().any()
    with pytest.raises(RuntimeError, match="UPLO"):
        torch.linalg.eigh(torch.eye(2, device="tpu"), UPLO="X")
    with pytest.raises(RuntimeError, match="driver"):
        torch.linalg.svd(torch.eye(2, device="tpu"), driver="gesvd")
