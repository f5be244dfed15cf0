//! The matrix exponential (torch.linalg.matrix_exp), by scaling and
//! squaring with the [13/13] Padé approximant (Higham, "The scaling and
//! squaring method for the matrix exponential revisited", 2005):
//! exp(A) = r(A / 2^s)^(2^s), with s the fewest squarings that bring the
//! 1-norm of A / 2^s to θ13 or below, where r's backward error is below
//! f64's unit roundoff.
//!
//! s depends on A's values, and a graph's size on s (one product per
//! squaring), so the exponential is two ops: `matrix_exp_squarings(A)`
//! gives s (an i64 scalar, the most any matrix of a batch needs); the
//! frontend reads it back and runs `matrix_exp(A; squarings = s)`. torch
//! reads its norms back the same way on CUDA. The gradient needs no op of
//! its own: torch's formula is the exponential of the block matrix
//! [[Aᵀ, G], [0, Aᵀ]], whose top right block it keeps.

use super::attrs::Attrs;
use super::emit::Emitter;
use super::solve::{flat_batch, identity, lu_solve_left, lu_steps, matrix_dims};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, Prim, ReduceOp, UnaryOp, ValueId};

/// The Padé approximant's degree, and the largest 1-norm it takes
/// unscaled (Higham 2005, table 2.3).
const DEGREE: usize = 13;
const THETA_13: f64 = 5.371920351148152;

/// The dtype the exponential is computed in (`support::compute_dtype`:
/// f32 for the half types, whose results torch's own CPU kernel garbles;
/// f32 and f64 as they are); anything else is torch's error.
fn compute_dtype(e: &Emitter, x: ValueId) -> Result<DType> {
    super::support::compute_dtype(e.dtype(x)).map_err(|_| {
        Error::invalid(format!(
            "A must be a floating point tensor, got {}",
            e.dtype(x)
        ))
    })
}

/// The most squarings a finite matrix can need in `dt`: enough to bring
/// the largest finite 1-norm to θ13, with 2^-s still a normal number (so
/// the scaling stays exact where subnormals flush to zero).
fn max_squarings(dt: DType) -> i64 {
    if dt == DType::F64 {
        1022
    } else {
        126
    }
}

/// The [13/13] Padé coefficients of exp, b_k = (2m-k)! m! / ((2m)! k!
/// (m-k)!) with m = 13, so b_0 = 1.
fn pade_coefficients() -> [f64; DEGREE + 1] {
    let m = DEGREE as f64;
    let mut b = [1.0; DEGREE + 1];
    for k in 1..=DEGREE {
        let k_f = k as f64;
        b[k] = b[k - 1] * (m - k_f + 1.0) / (k_f * (2.0 * m - k_f + 1.0));
    }
    b
}

/// x y for [B, n, n] batches.
fn product(e: &mut Emitter, x: ValueId, y: ValueId) -> Result<ValueId> {
    let precision = e.product_precision(e.dtype(x));
    e.op(
        Prim::DotGeneral {
            lhs_batch: vec![0],
            rhs_batch: vec![0],
            lhs_contract: vec![2],
            rhs_contract: vec![1],
            precision,
        },
        &[x, y],
    )
}

/// Σ c_i M_i over one or more terms.
fn combination(e: &mut Emitter, terms: &[(f64, ValueId)]) -> Result<ValueId> {
    let (c, m) = terms[0];
    let mut sum = e.binary_scalar(BinaryOp::Mul, m, c)?;
    for &(c, m) in &terms[1..] {
        let t = e.binary_scalar(BinaryOp::Mul, m, c)?;
        sum = e.add(sum, t)?;
    }
    Ok(sum)
}

/// matrix_exp_squarings(A [.., n, n]) -> s (i64 scalar): the squarings
/// `matrix_exp` needs for every matrix of A, ceil(log2(‖A‖₁ / θ13)) at
/// least 0. A NaN or infinite norm gives 0 (the exponential is not finite
/// either way, and needs no squarings to say so); so does an empty batch.
fn matrix_exp_squarings(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let dt = compute_dtype(e, x[0])?;
    matrix_dims(e, x[0], "A", true)?;
    let r = e.rank(x[0]);
    let a = e.convert(x[0], DType::F64)?;
    let abs = e.unary(UnaryOp::Abs, a)?;
    let columns = e.reduce(ReduceOp::Sum, abs, &[r - 2], false)?;
    let all: Vec<usize> = (0..r - 1).collect();
    let norm = e.reduce(ReduceOp::Max, columns, &all, false)?;
    let ratio = e.binary_scalar(BinaryOp::Div, norm, THETA_13)?;
    let ln = e.unary(UnaryOp::Log, ratio)?;
    let log2 = e.binary_scalar(BinaryOp::Div, ln, std::f64::consts::LN_2)?;
    let s = e.unary(UnaryOp::Ceil, log2)?;
    let positive = e.compare_scalar(CompareOp::Gt, s, 0.0)?;
    let bounded = e.compare_scalar(CompareOp::Le, s, max_squarings(dt) as f64)?;
    let keep = e.binary(BinaryOp::And, positive, bounded)?;
    let zero = e.full_like(s, 0.0)?;
    let s = e.select(keep, s, zero)?;
    Ok(vec![e.convert(s, DType::I64)?])
}

/// matrix_exp(A [.., n, n]; squarings) -> exp(A), A's dtype: the Padé
/// approximant of A / 2^squarings squared `squarings` times. `squarings`
/// is what `matrix_exp_squarings(A)` gives; fewer lose accuracy for
/// matrices of large norm, more cost a product each.
fn matrix_exp(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dt = compute_dtype(e, x[0])?;
    matrix_dims(e, x[0], "A", true)?;
    let squarings = match a.int_opt("squarings")? {
        Some(s) => s,
        None => {
            return Err(Error::invalid(
                "the attribute squarings (an int, from matrix_exp_squarings) is required",
            ))
        }
    };
    if !(0..=max_squarings(dt)).contains(&squarings) {
        return Err(Error::invalid(format!(
            "squarings must be in 0..={} for {dt}, got {squarings}",
            max_squarings(dt)
        )));
    }
    let d = e.dims(x[0]);
    let wide = e.convert(x[0], dt)?;
    let flat = flat_batch(e, wide, 2)?;
    let scaled = e.binary_scalar(BinaryOp::Mul, flat, (-squarings as f64).exp2())?;
    let fd = e.dims(flat);
    let eye = identity(e, fd[0], fd[1], dt)?;
    let b = pade_coefficients();
    let a1 = scaled;
    let a2 = product(e, a1, a1)?;
    let a4 = product(e, a2, a2)?;
    let a6 = product(e, a4, a2)?;
    // U = A (A6 (b13 A6 + b11 A4 + b9 A2) + b7 A6 + b5 A4 + b3 A2 + b1 I),
    // V = A6 (b12 A6 + b10 A4 + b8 A2) + b6 A6 + b4 A4 + b2 A2 + b0 I.
    let inner = combination(e, &[(b[13], a6), (b[11], a4), (b[9], a2)])?;
    let high = product(e, a6, inner)?;
    let low = combination(e, &[(b[7], a6), (b[5], a4), (b[3], a2), (b[1], eye)])?;
    let odd = e.add(high, low)?;
    let u = product(e, a1, odd)?;
    let inner = combination(e, &[(b[12], a6), (b[10], a4), (b[8], a2)])?;
    let high = product(e, a6, inner)?;
    let low = combination(e, &[(b[6], a6), (b[4], a4), (b[2], a2), (b[0], eye)])?;
    let v = e.add(high, low)?;
    // r = (V - U)⁻¹ (V + U); V - U is nonsingular for norms up to θ13.
    let p = e.add(v, u)?;
    let q = e.sub(v, u)?;
    let [lu, _, perm, _] = lu_steps(e, q)?;
    let mut r = lu_solve_left(e, lu, perm, p, false)?;
    for _ in 0..squarings {
        r = product(e, r, r)?;
    }
    let r = e.reshape(r, &d)?;
    Ok(vec![e.convert(r, e.dtype(x[0]))?])
}

pub(super) const OPS: &[OpDef] = &[
    def!(
        "matrix_exp_squarings",
        Arity::Exactly(1),
        matrix_exp_squarings
    ),
    def!("matrix_exp", Arity::Exactly(1), matrix_exp),
];

#[cfg(test)]
mod tests {
    use super::super::tests::{close, naive_mm as matmul, run, run1, t};
    use super::*;
    use crate::ops::attrs::Attr;
    use crate::platform::host::kernels::HostTensor;

    fn squarings(s: i64) -> Attrs {
        Attrs::new().with("squarings", Attr::Int(s))
    }

    /// exp(A) as a frontend computes it: the squarings, then the
    /// exponential.
    fn expm(a: &HostTensor) -> HostTensor {
        let s = run1("matrix_exp_squarings", &[a], Attrs::new());
        assert_eq!(s.dtype(), DType::I64);
        run1("matrix_exp", &[a], squarings(s.to_f64_vec()[0] as i64))
    }

    /// Σ A^k / k! in f64, to convergence (for matrices of small norm).
    fn taylor(a: &[f64], n: usize) -> Vec<f64> {
        let mut sum: Vec<f64> = (0..n * n)
            .map(|i| if i % (n + 1) == 0 { 1.0 } else { 0.0 })
            .collect();
        let mut term = sum.clone();
        for k in 1..40 {
            term = matmul(&term, a, n, n, n)
                .into_iter()
                .map(|v| v / k as f64)
                .collect();
            for (s, t) in sum.iter_mut().zip(&term) {
                *s += t;
            }
        }
        sum
    }

    fn matrix(n: usize, seed: usize, scale: f64) -> Vec<f64> {
        (0..n * n)
            .map(|i| (((i * 29 + seed * 13) % 17) as f64 / 8.0 - 1.0) * scale)
            .collect()
    }

    #[test]
    fn the_coefficients_are_highams() {
        // Higham's b_k for m = 13 are b_0 = 64764752532480000 times ours.
        let b = pade_coefficients();
        let scale = 64764752532480000.0;
        close(
            &t(
                DType::F64,
                &[3],
                &[b[1] * scale, b[4] * scale, b[13] * scale],
            ),
            &[32382376266240000.0, 129060195264000.0, 1.0],
            1e-15,
        );
    }

    /// The squarings bring ‖A‖₁ (the largest column sum of |a|) to θ13;
    /// a batch takes its largest; zero, NaN, infinite and empty matrices
    /// take none.
    #[test]
    fn squarings_follow_the_largest_one_norm() {
        let s = |dt: DType, dims: &[u64], v: &[f64]| {
            run1("matrix_exp_squarings", &[&t(dt, dims, v)], Attrs::new()).to_f64_vec()[0]
        };
        assert_eq!(s(DType::F64, &[2, 2], &[1.0, 0.0, 0.0, 1.0]), 0.0);
        assert_eq!(s(DType::F64, &[2, 2], &[5.0, 0.0, -0.37, 1.0]), 0.0);
        assert_eq!(s(DType::F64, &[2, 2], &[5.0, 0.0, -0.38, 1.0]), 1.0);
        assert_eq!(s(DType::F32, &[2, 2], &[0.0, 10.0, 0.0, 0.0]), 1.0);
        assert_eq!(s(DType::F64, &[1, 1], &[1000.0]), 8.0);
        assert_eq!(
            s(DType::F32, &[2, 1, 1], &[1.0, -THETA_13 * 1024.0 * 1.5]),
            11.0
        );
        assert_eq!(s(DType::F64, &[1, 1], &[0.0]), 0.0);
        assert_eq!(s(DType::F64, &[1, 1], &[f64::NAN]), 0.0);
        assert_eq!(s(DType::F64, &[1, 1], &[f64::INFINITY]), 0.0);
        assert_eq!(s(DType::F64, &[0, 0], &[]), 0.0);
        assert_eq!(s(DType::F32, &[0, 3, 3], &[]), 0.0);
        assert_eq!(s(DType::F64, &[1, 1], &[f64::MAX]), 1022.0);
    }

    /// Known exponentials: a rotation generator gives the rotation, a
    /// nilpotent matrix its finite series, a diagonal matrix the
    /// exponentials of its entries (with squarings: exp(-30) and exp(20)).
    #[test]
    fn known_exponentials() {
        let th = 2.5_f64;
        let r = expm(&t(DType::F64, &[2, 2], &[0.0, th, -th, 0.0]));
        close(&r, &[th.cos(), th.sin(), -th.sin(), th.cos()], 1e-14);
        let n = expm(&t(
            DType::F64,
            &[3, 3],
            &[0.0, 1.0, 2.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0],
        ));
        // I + N + N²/2, N² = [[0, 0, 3], [0, 0, 0], [0, 0, 0]].
        close(&n, &[1.0, 1.0, 3.5, 0.0, 1.0, 3.0, 0.0, 0.0, 1.0], 1e-15);
        let d = expm(&t(DType::F64, &[2, 2], &[-30.0, 0.0, 0.0, 20.0]));
        let got = d.to_f64_vec();
        assert!((got[0] / (-30.0f64).exp() - 1.0).abs() < 1e-12, "{got:?}");
        assert!((got[3] / 20.0f64.exp() - 1.0).abs() < 1e-12, "{got:?}");
        assert_eq!((got[1], got[2]), (0.0, 0.0));
        let f = expm(&t(DType::F32, &[2, 2], &[0.0, th, -th, 0.0]));
        assert_eq!(f.dtype(), DType::F32);
        close(&f, &[th.cos(), th.sin(), -th.sin(), th.cos()], 1e-6);
    }

    /// A batch of general matrices against the Taylor series (small
    /// norms), and exp(A) exp(-A) = I where the norm needs squarings.
    #[test]
    fn batches_match_the_series_and_invert() {
        let n = 4;
        let (m0, m1) = (matrix(n, 1, 0.4), matrix(n, 2, 0.9));
        let a = t(DType::F64, &[2, 4, 4], &[m0.clone(), m1.clone()].concat());
        let mut want = taylor(&m0, n);
        want.extend(taylor(&m1, n));
        close(&expm(&a), &want, 1e-13);
        // A skew-symmetric A of norm above 2 θ13 (squarings): exp(A) is
        // orthogonal and exp(-A) = exp(A)ᵀ is its inverse.
        for dt in [DType::F64, DType::F32] {
            let m = matrix(n, 3, 20.0);
            let skew: Vec<f64> = (0..n * n).map(|i| m[i] - m[(i % n) * n + i / n]).collect();
            let neg: Vec<f64> = skew.iter().map(|v| -v).collect();
            let a = t(dt, &[4, 4], &skew);
            let s = run1("matrix_exp_squarings", &[&a], Attrs::new());
            assert!(s.to_f64_vec()[0] >= 2.0, "{s:?}");
            let e1 = expm(&a).to_f64_vec();
            let e2 = expm(&t(dt, &[4, 4], &neg)).to_f64_vec();
            let eye: Vec<f64> = (0..n * n)
                .map(|i| if i % (n + 1) == 0 { 1.0 } else { 0.0 })
                .collect();
            let tol = if dt == DType::F64 { 1e-13 } else { 1e-5 };
            let prod = matmul(&e1, &e2, n, n, n);
            close(&t(DType::F64, &[4, 4], &prod), &eye, tol);
        }
    }

    /// bf16 and f16 are computed in f32 and rounded once; ints, a
    /// non-square A and a missing or out-of-range squarings are errors.
    #[test]
    fn half_types_and_bad_input() {
        let a = t(DType::BF16, &[2, 2], &[0.0, 1.0, 0.0, 0.0]);
        let r = expm(&a);
        assert_eq!(r.dtype(), DType::BF16);
        assert_eq!(r.to_f64_vec(), vec![1.0, 1.0, 0.0, 1.0]);
        let i = t(DType::I64, &[2, 2], &[0.0; 4]);
        let err = run("matrix_exp", &[&i], squarings(0)).unwrap_err();
        assert!(err.to_string().contains("floating point"), "{err}");
        let wide = t(DType::F32, &[2, 3], &[0.0; 6]);
        let err = run("matrix_exp_squarings", &[&wide], Attrs::new()).unwrap_err();
        assert!(err.to_string().contains("square"), "{err}");
        let f = t(DType::F32, &[2, 2], &[0.0; 4]);
        let err = run("matrix_exp", &[&f], Attrs::new()).unwrap_err();
        assert!(err.to_string().contains("squarings"), "{err}");
        let err = run("matrix_exp", &[&f], squarings(127)).unwrap_err();
        assert!(err.to_string().contains("0..=126"), "{err}");
        let err = run("matrix_exp", &[&f], squarings(-1)).unwrap_err();
        assert!(err.to_string().contains("got -1"), "{err}");
    }
}
