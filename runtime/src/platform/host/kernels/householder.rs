//! Householder QR (`Prim::HouseholderQr`, LAPACK's geqr2 reflector by
//! reflector) and the product of its reflectors (`Prim::HouseholderProduct`,
//! LAPACK's org2r), batched, computed in f64 (f32 results rounded once).

use super::HostTensor;
use crate::error::Result;

/// The reflector that maps x = col[0..] to (beta, 0, ..): LAPACK's larfg.
/// Returns (beta, tau) and scales col[1..] into the vector v (v[0] = 1
/// implied). A column already zero below its first element gets tau 0.
fn reflector(col: &mut [f64]) -> (f64, f64) {
    let alpha = col[0];
    let below: f64 = col[1..].iter().map(|v| v * v).sum();
    if below == 0.0 {
        return (alpha, 0.0);
    }
    let norm = (alpha * alpha + below).sqrt();
    let beta = if alpha < 0.0 { norm } else { -norm };
    let scale = 1.0 / (alpha - beta);
    col[1..].iter_mut().for_each(|v| *v *= scale);
    (beta, (beta - alpha) / beta)
}

/// Apply H = I - tau v vᵀ (v = [1, below..]) from the left to the rows
/// `from..m` of the columns `cols` of the row-major m x n matrix `a`.
fn apply_left(
    a: &mut [f64],
    n: usize,
    from: usize,
    below: &[f64],
    tau: f64,
    cols: std::ops::Range<usize>,
) {
    if tau == 0.0 {
        return;
    }
    for c in cols {
        let w = a[from * n + c]
            + below
                .iter()
                .enumerate()
                .map(|(i, v)| v * a[(from + 1 + i) * n + c])
                .sum::<f64>();
        let t = tau * w;
        a[from * n + c] -= t;
        for (i, v) in below.iter().enumerate() {
            a[(from + 1 + i) * n + c] -= t * v;
        }
    }
}

pub fn householder_qr(a: &HostTensor) -> Result<Vec<HostTensor>> {
    let d = a.dims();
    let r = d.len();
    let (m, n) = (d[r - 2] as usize, d[r - 1] as usize);
    let k = m.min(n);
    let mut qr = a.to_f64_vec();
    let batch = qr.len().checked_div(m * n).unwrap_or(0);
    let mut tau = vec![0.0; d[..r - 2].iter().product::<u64>() as usize * k];
    let mut col = Vec::with_capacity(m);
    for b in 0..batch {
        let a = &mut qr[b * m * n..(b + 1) * m * n];
        for j in 0..k {
            col.clear();
            col.extend((j..m).map(|i| a[i * n + j]));
            let (beta, t) = reflector(&mut col);
            a[j * n + j] = beta;
            for (i, v) in col.iter().enumerate().skip(1) {
                a[(j + i) * n + j] = *v;
            }
            apply_left(a, n, j, &col[1..], t, j + 1..n);
            tau[b * k + j] = t;
        }
    }
    let mut tau_dims = d[..r - 2].to_vec();
    tau_dims.push(k as u64);
    Ok(vec![
        HostTensor::from_f64(a.dtype(), d, &qr)?,
        HostTensor::from_f64(a.dtype(), &tau_dims, &tau)?,
    ])
}

pub fn householder_product(a: &HostTensor, tau: &HostTensor) -> Result<HostTensor> {
    let d = a.dims();
    let r = d.len();
    let (m, n) = (d[r - 2] as usize, d[r - 1] as usize);
    let k = *tau.dims().last().unwrap_or(&0) as usize;
    let av = a.to_f64_vec();
    let tv = tau.to_f64_vec();
    let batch = d[..r - 2].iter().product::<u64>() as usize;
    let mut q = vec![0.0; batch * m * n];
    let mut below = Vec::with_capacity(m);
    for b in 0..batch {
        let (am, qm) = (&av[b * m * n..], &mut q[b * m * n..(b + 1) * m * n]);
        (0..n).for_each(|i| qm[i * n + i] = 1.0);
        // H_0 (H_1 (.. (H_{k-1} I))): the last reflector first.
        for j in (0..k).rev() {
            below.clear();
            below.extend((j + 1..m).map(|i| am[i * n + j]));
            apply_left(qm, n, j, &below, tv[b * k + j], 0..n);
        }
    }
    HostTensor::from_f64(a.dtype(), d, &q)
}

#[cfg(test)]
mod tests {
    use super::super::{eval, HostTensor};
    use crate::ir::{DType, Prim};

    fn t(dims: &[u64], v: &[f64]) -> HostTensor {
        HostTensor::from_f64(DType::F64, dims, v).unwrap()
    }

    /// [[3, 1], [4, 2]]: the reflector maps (3, 4) to (-5, 0), tau =
    /// (-5 - 3) / -5 = 1.6, v = (1, 4 / 8); the second column becomes
    /// H (1, 2) = (1, 2) - 1.6 (1 + 1) (1, 0.5) = (-2.2, 0.4); the last
    /// step (one element) is tau 0. Q = H_0 = I - 1.6 v vᵀ.
    #[test]
    fn a_two_by_two_by_hand() {
        let out = eval(&Prim::HouseholderQr, &[&t(&[2, 2], &[3.0, 1.0, 4.0, 2.0])]).unwrap();
        let qr = out[0].to_f64_vec();
        let want = [-5.0, -2.2, 0.5, 0.4];
        for (g, w) in qr.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{qr:?}");
        }
        assert_eq!(out[1].to_f64_vec(), vec![1.6, 0.0]);
        // Q = H_0: its columns are orthonormal and Q R = A.
        let q = eval(&Prim::HouseholderProduct, &[&out[0], &out[1]]).unwrap()[0].to_f64_vec();
        let want_q = [-0.6, -0.8, -0.8, 0.6];
        for (g, w) in q.iter().zip(want_q) {
            assert!((g - w).abs() < 1e-12, "{q:?}");
        }
    }

    /// Tall and wide batches: Q (from the product) times R gives A back,
    /// Qᵀ Q = I; a zero column's reflector is the identity.
    #[test]
    fn q_times_r_is_a() {
        for (m, n) in [(5usize, 3usize), (3, 5), (4, 4)] {
            let vals: Vec<f64> = (0..2 * m * n)
                .map(|i| ((i * 37 % 17) as f64 - 8.0) / 3.0)
                .collect();
            let mut vals = vals;
            // Batch 1's first column zero.
            (0..m).for_each(|i| vals[m * n + i * n] = 0.0);
            let a = t(&[2, m as u64, n as u64], &vals);
            let out = eval(&Prim::HouseholderQr, &[&a]).unwrap();
            let k = m.min(n);
            let tau = out[1].to_f64_vec();
            assert_eq!(tau[k], 0.0);
            // The product needs m >= n: use the first k columns.
            let qr = out[0].to_f64_vec();
            let sq: Vec<f64> = (0..2)
                .flat_map(|b| {
                    let qr = &qr;
                    (0..m).flat_map(move |i| (0..k).map(move |j| qr[b * m * n + i * n + j]))
                })
                .collect();
            let sq = t(&[2, m as u64, k as u64], &sq);
            let q = eval(&Prim::HouseholderProduct, &[&sq, &out[1]]).unwrap()[0].to_f64_vec();
            for b in 0..2 {
                let q = &q[b * m * k..];
                let r = |i: usize, j: usize| {
                    if i <= j {
                        qr[b * m * n + i * n + j]
                    } else {
                        0.0
                    }
                };
                for i in 0..m {
                    for j in 0..n {
                        let back: f64 = (0..k).map(|p| q[i * k + p] * r(p, j)).sum();
                        let want = vals[b * m * n + i * n + j];
                        assert!((back - want).abs() < 1e-12, "{m}x{n}: {back} vs {want}");
                    }
                }
                for i in 0..k {
                    for j in 0..k {
                        let dot: f64 = (0..m).map(|p| q[p * k + i] * q[p * k + j]).sum();
                        let want = if i == j { 1.0 } else { 0.0 };
                        assert!((dot - want).abs() < 1e-12);
                    }
                }
            }
        }
    }

    #[test]
    fn empty_and_bad_operands() {
        let e = t(&[3, 0], &[]);
        let out = eval(&Prim::HouseholderQr, &[&e]).unwrap();
        assert_eq!(out[1].dims(), &[0]);
        let q = eval(&Prim::HouseholderProduct, &[&e, &out[1]]).unwrap();
        assert_eq!(q[0].dims(), &[3, 0]);
        let wide = t(&[2, 3], &[0.0; 6]);
        let tau = t(&[2], &[0.0; 2]);
        let err = eval(&Prim::HouseholderProduct, &[&wide, &tau]).unwrap_err();
        assert!(err.to_string().contains("m >= n"), "{err}");
        let i = HostTensor::from_f64(DType::I64, &[2, 2], &[1.0; 4]).unwrap();
        let err = eval(&Prim::HouseholderQr, &[&i]).unwrap_err();
        assert!(err.to_string().contains("f32 or f64"), "{err}");
    }
}
