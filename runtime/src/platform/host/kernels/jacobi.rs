//! Jacobi's method (`Prim::Jacobi`): the symmetric eigenproblem (two-sided)
//! and the orthogonalization of columns behind the SVD (one-sided,
//! Hestenes), in the operand's precision, batched.
//!
//! The arithmetic and its order are the xla platform's (its while loop in
//! `platform/xla/lower/jacobi.rs`), so both give the same vectors, signs
//! included: the indices sit in N slots (N = n, or n + 1 with a bye),
//! slot j paired with slot N - 1 - j; a round computes every pair's
//! rotation from the matrix as it stands, applies all of them to the rows
//! (two-sided), then to the columns; then slot 0 stays and the others
//! shift by one. A sweep is N - 1 rounds.

use std::ops::{Add, Div, Mul, Neg, Sub};

use super::{Element, HostTensor};
use crate::error::{Error, Result};
use crate::ir::DType;

/// Sweeps at most (Jacobi converges quadratically; 10 are plenty for any
/// matrix seen in practice).
pub const MAX_SWEEPS: u64 = 40;

/// f32 and f64, the element types of the linear-algebra kernels (this
/// file's and linalg.rs's).
pub trait Float:
    Copy
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const TWO: Self;
    /// The unit roundoff.
    const EPS: Self;
    const MIN_POSITIVE: Self;
    fn sqrt(self) -> Self;
    fn abs(self) -> Self;
    fn is_nan(self) -> bool;
}
macro_rules! float {
    ($($t:ty),*) => {$(
        impl Float for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const TWO: Self = 2.0;
            const EPS: Self = <$t>::EPSILON / 2.0;
            const MIN_POSITIVE: Self = <$t>::MIN_POSITIVE;
            fn sqrt(self) -> Self {
                self.sqrt()
            }
            fn abs(self) -> Self {
                self.abs()
            }
            fn is_nan(self) -> bool {
                self.is_nan()
            }
        }
    )*};
}
float!(f32, f64);

/// The rotation (c, s) that zeroes the off element `e` of the pair whose
/// diagonal elements are `dp` (the first slot's) and `dq`, or None where
/// `e` is already negligible: |e| <= eps · sqrt(|dp · dq|), or below the
/// smallest normal number. tau = (dq - dp) / 2e, t = sign(tau) / (|tau| +
/// sqrt(1 + tau²)) (the smaller angle; the square root taken as |tau|
/// sqrt(1 + 1/tau²) above 1, so it cannot overflow), c = 1 / sqrt(1 +
/// t²), s = t c: Golub and Van Loan's sym.schur2.
pub fn rotation<T: Float>(dp: T, dq: T, e: T) -> Option<(T, T)> {
    let mag = e.abs();
    if mag <= T::EPS * (dp * dq).abs().sqrt() || mag < T::MIN_POSITIVE {
        return None;
    }
    let tau = (dq - dp) / (T::TWO * e);
    let r = tau.abs();
    let h = if r > T::ONE {
        let inv = T::ONE / r;
        r * (T::ONE + inv * inv).sqrt()
    } else {
        (T::ONE + r * r).sqrt()
    };
    let t = if tau < T::ZERO {
        -(T::ONE / (r + h))
    } else {
        T::ONE / (r + h)
    };
    let c = T::ONE / (T::ONE + t * t).sqrt();
    Some((c, t * c))
}

/// One matrix: `a` (m x n row-major; square when two-sided) rotated in
/// place, `v` (n x n) receiving the accumulated rotations; returns the
/// number of sweeps run. A rotation of NaN (a NaN in the matrix) is
/// applied, so the NaN spreads as it would through LAPACK's, but does not
/// count as progress: a sweep that rotates only NaN is the last.
fn solve<T: Float>(a: &mut [T], v: &mut [T], m: usize, n: usize, two_sided: bool) -> u64 {
    v.iter_mut().for_each(|x| *x = T::ZERO);
    (0..n).for_each(|i| v[i * n + i] = T::ONE);
    if n < 2 {
        return 0;
    }
    let slots = n + n % 2;
    let mut order: Vec<usize> = (0..slots).collect();
    // Per index: (c, signed s) of its pair's rotation this round, and its
    // partner; an index in no rotated pair keeps (1, 0).
    let mut coef = vec![(T::ONE, T::ZERO); n];
    let mut partner: Vec<usize> = (0..n).collect();
    let rounds = slots as u64 - 1;
    let mut rotated = false;
    let mut sweeps = 0;
    for round in 0..MAX_SWEEPS * rounds {
        if round % rounds == 0 {
            if round > 0 && !rotated {
                break;
            }
            rotated = false;
            sweeps += 1;
        }
        coef.iter_mut().for_each(|c| *c = (T::ONE, T::ZERO));
        for j in 0..slots / 2 {
            let (p, q) = (order[j], order[slots - 1 - j]);
            if p >= n || q >= n {
                continue;
            }
            let (dp, dq, e) = if two_sided {
                (a[p * n + p], a[q * n + q], a[p * n + q])
            } else {
                let (mut dp, mut dq, mut e) = (T::ZERO, T::ZERO, T::ZERO);
                for r in 0..m {
                    let (x, y) = (a[r * n + p], a[r * n + q]);
                    dp = dp + x * x;
                    dq = dq + y * y;
                    e = e + x * y;
                }
                (dp, dq, e)
            };
            if let Some((c, s)) = rotation(dp, dq, e) {
                rotated |= !s.is_nan();
                coef[p] = (c, -s);
                coef[q] = (c, s);
                partner[p] = q;
                partner[q] = p;
            }
        }
        if two_sided {
            // Rows: row i = c row i + s row partner(i), all pairs at once.
            for p in 0..n {
                let q = partner[p];
                if q <= p || coef[p].1 == T::ZERO {
                    continue;
                }
                let ((cp, sp), (cq, sq)) = (coef[p], coef[q]);
                for k in 0..n {
                    let (x, y) = (a[p * n + k], a[q * n + k]);
                    a[p * n + k] = x * cp + y * sp;
                    a[q * n + k] = y * cq + x * sq;
                }
            }
        }
        // Columns of a (m rows) and of v.
        for p in 0..n {
            let q = partner[p];
            if q <= p || coef[p].1 == T::ZERO {
                continue;
            }
            let ((cp, sp), (cq, sq)) = (coef[p], coef[q]);
            for (mat, rows) in [(&mut *a, m), (&mut *v, n)] {
                for r in 0..rows {
                    let (x, y) = (mat[r * n + p], mat[r * n + q]);
                    mat[r * n + p] = x * cp + y * sp;
                    mat[r * n + q] = y * cq + x * sq;
                }
            }
        }
        // Reset the pairing for the next round; shift the slots.
        partner.iter_mut().enumerate().for_each(|(i, p)| *p = i);
        order[1..].rotate_right(1);
    }
    sweeps
}

fn run<T: Float + Element>(
    a: &HostTensor,
    two_sided: bool,
    m: usize,
    n: usize,
) -> Result<Vec<HostTensor>> {
    let d = a.dims();
    let r = d.len();
    let batch: usize = d[..r - 2].iter().product::<u64>() as usize;
    let mut work = a.clone();
    let mut vd = d[..r - 2].to_vec();
    vd.extend([n as u64, n as u64]);
    let mut v = HostTensor::zeros(crate::ir::TensorType::new(a.dtype(), &vd));
    {
        let (av, vv) = (work.as_slice_mut::<T>(), v.as_slice_mut::<T>());
        for b in 0..batch {
            let _sweeps = solve(
                &mut av[b * m * n..(b + 1) * m * n],
                &mut vv[b * n * n..(b + 1) * n * n],
                m,
                n,
                two_sided,
            );
        }
    }
    if !two_sided {
        return Ok(vec![work, v]);
    }
    // The eigenvalues: the rotated matrix's diagonal.
    let mut wd = d[..r - 2].to_vec();
    wd.push(n as u64);
    let mut w = HostTensor::zeros(crate::ir::TensorType::new(a.dtype(), &wd));
    {
        let (av, wv) = (work.as_slice::<T>(), w.as_slice_mut::<T>());
        for b in 0..batch {
            for i in 0..n {
                wv[b * n + i] = av[b * n * n + i * n + i];
            }
        }
    }
    Ok(vec![w, v])
}

pub fn jacobi(a: &HostTensor, two_sided: bool) -> Result<Vec<HostTensor>> {
    let d = a.dims();
    let r = d.len();
    let (m, n) = (d[r - 2] as usize, d[r - 1] as usize);
    match a.dtype() {
        DType::F32 => run::<f32>(a, two_sided, m, n),
        DType::F64 => run::<f64>(a, two_sided, m, n),
        other => Err(Error::invalid(format!("needs f32 or f64, got {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{eval, HostTensor};
    use crate::ir::{DType, Prim};

    fn t(dt: DType, dims: &[u64], v: &[f64]) -> HostTensor {
        HostTensor::from_f64(dt, dims, v).unwrap()
    }

    /// [[2, 1], [1, 2]]: eigenvalues 1 and 3, vectors (1, ∓1) / sqrt 2:
    /// one rotation by 45 degrees (tau = 0, t = 1).
    #[test]
    fn a_two_by_two_by_hand() {
        let a = t(DType::F64, &[2, 2], &[2.0, 1.0, 1.0, 2.0]);
        let out = eval(&Prim::Jacobi { two_sided: true }, &[&a]).unwrap();
        let w = out[0].to_f64_vec();
        assert!(
            (w[0] - 1.0).abs() < 1e-15 && (w[1] - 3.0).abs() < 1e-15,
            "{w:?}"
        );
        let h = 0.5f64.sqrt();
        let v = out[1].to_f64_vec();
        for (g, want) in v.iter().zip([h, h, -h, h]) {
            assert!((g - want).abs() < 1e-15, "{v:?}");
        }
    }

    /// A NaN spreads through the rotations (as through LAPACK's) and
    /// stops the sweeps once only NaN rotates, where it ran all 40 before;
    /// a finite matrix converges in a few.
    #[test]
    fn a_nan_ends_the_sweeps() {
        let n = 5;
        let sym = |i: usize, j: usize| ((i + j) % 4) as f64 - 1.5 + if i == j { 3.0 } else { 0.0 };
        let mut a: Vec<f64> = (0..n * n).map(|k| sym(k / n, k % n)).collect();
        let mut v = vec![0.0; n * n];
        let finite = super::solve(&mut a.clone(), &mut v, n, n, true);
        assert!((2..10).contains(&finite), "{finite} sweeps");
        a[1] = f64::NAN;
        a[n] = f64::NAN;
        for two_sided in [true, false] {
            let mut work = a.clone();
            let sweeps = super::solve(&mut work, &mut v, n, n, two_sided);
            assert!(sweeps <= 3, "{sweeps} sweeps");
            assert!(work.iter().any(|x| x.is_nan()) && v.iter().any(|x| x.is_nan()));
        }
    }

    /// Symmetric matrices of odd and even order, in both precisions:
    /// vᵀ a v is diagonal with w on it, vᵀ v = I. One-sided on tall and
    /// wide matrices: a v has orthogonal columns and v is orthogonal.
    #[test]
    fn rotations_diagonalize_and_orthogonalize() {
        for (dt, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-4)] {
            for n in [1usize, 2, 5, 6] {
                let mut a = vec![0.0; n * n];
                for i in 0..n {
                    for j in 0..=i {
                        let x = (((i * 7 + j * 3) % 11) as f64 - 5.0) / 3.0;
                        a[i * n + j] = x;
                        a[j * n + i] = x;
                    }
                }
                let at = t(dt, &[n as u64, n as u64], &a);
                let out = eval(&Prim::Jacobi { two_sided: true }, &[&at]).unwrap();
                let (w, v) = (out[0].to_f64_vec(), out[1].to_f64_vec());
                for i in 0..n {
                    for j in 0..n {
                        let vav: f64 = (0..n)
                            .flat_map(|p| (0..n).map(move |q| (p, q)))
                            .map(|(p, q)| v[p * n + i] * a[p * n + q] * v[q * n + j])
                            .sum();
                        let want = if i == j { w[i] } else { 0.0 };
                        assert!(
                            (vav - want).abs() < tol * 10.0,
                            "{dt} n={n}: {vav} vs {want}"
                        );
                        let vtv: f64 = (0..n).map(|p| v[p * n + i] * v[p * n + j]).sum();
                        let eye = if i == j { 1.0 } else { 0.0 };
                        assert!((vtv - eye).abs() < tol, "{dt} n={n}");
                    }
                }
            }
            for (m, n) in [(5usize, 3usize), (3, 5)] {
                let a: Vec<f64> = (0..m * n)
                    .map(|i| ((i * i * 7 + 3) % 13) as f64 - 6.0)
                    .collect();
                let at = t(dt, &[m as u64, n as u64], &a);
                let out = eval(&Prim::Jacobi { two_sided: false }, &[&at]).unwrap();
                let (av, v) = (out[0].to_f64_vec(), out[1].to_f64_vec());
                for i in 0..n {
                    for j in 0..n {
                        if i != j {
                            let dot: f64 = (0..m).map(|r| av[r * n + i] * av[r * n + j]).sum();
                            assert!(dot.abs() < tol * 100.0, "{dt} {m}x{n}: {dot}");
                        }
                        let vtv: f64 = (0..n).map(|p| v[p * n + i] * v[p * n + j]).sum();
                        let eye = if i == j { 1.0 } else { 0.0 };
                        assert!((vtv - eye).abs() < tol, "{dt} {m}x{n}");
                    }
                }
            }
        }
    }
}
