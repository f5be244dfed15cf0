//! Triangular solves (`Prim::TriangularSolve`), batched: substitution row
//! by row. LU factorization with partial pivoting (`Prim::LuFactor`), and
//! the permutation of a list of pivots. Both in the operands' own
//! precision, as LAPACK's trsm and getf2 (and XLA) compute them. The
//! Cholesky factor in f64 (f32 results rounded once).

use super::jacobi::Float;
use super::HostTensor;
use crate::error::{Error, Result};
use crate::ir::{DType, TensorType};

/// Factor each m x n matrix of `a` in place, writing its pivots (k per
/// matrix) and permutation (m per matrix). The elimination is the
/// right-looking one: at step k the pivot row is swapped in, the column
/// below it divided by the pivot (unless 0) and the trailing block
/// reduced, each element a[i][j] -= l[i] · u[j].
fn factor_all<T: Float>(a: &mut [T], pivots: &mut [i64], perm: &mut [i64], m: usize, n: usize) {
    let k_steps = m.min(n);
    for ((a, piv), perm) in a
        .chunks_exact_mut(m * n)
        .zip(pivots.chunks_exact_mut(k_steps))
        .zip(perm.chunks_exact_mut(m))
    {
        perm.iter_mut().enumerate().for_each(|(i, p)| *p = i as i64);
        for k in 0..k_steps {
            // The first row of the largest magnitude; NaN wins only where
            // the column holds nothing else (then row k stays).
            let mut p = k;
            let mut best = a[k * n + k].abs();
            for i in k + 1..m {
                let v = a[i * n + k].abs();
                if v > best || (best.is_nan() && !v.is_nan()) {
                    best = v;
                    p = i;
                }
            }
            piv[k] = p as i64;
            if p != k {
                for j in 0..n {
                    a.swap(k * n + j, p * n + j);
                }
                perm.swap(k, p);
            }
            let pivot = a[k * n + k];
            let (top, rest) = a.split_at_mut((k + 1) * n);
            let row = &top[k * n..];
            for r in rest.chunks_exact_mut(n) {
                if pivot != T::ZERO {
                    r[k] = r[k] / pivot;
                }
                let l = r[k];
                for j in k + 1..n {
                    r[j] = r[j] - l * row[j];
                }
            }
        }
    }
}

pub fn lu_factor(a: &HostTensor, out: &[TensorType]) -> Result<Vec<HostTensor>> {
    let d = a.dims();
    let r = d.len();
    let (m, n) = (d[r - 2] as usize, d[r - 1] as usize);
    let mut lu = a.clone();
    let mut pivots = HostTensor::zeros(out[1].clone());
    let mut perm = HostTensor::zeros(out[2].clone());
    if m == 0 || n == 0 || a.numel() == 0 {
        let p = perm.as_slice_mut::<i64>();
        for (i, v) in p.iter_mut().enumerate() {
            *v = (i % m.max(1)) as i64;
        }
        return Ok(vec![lu, pivots, perm]);
    }
    let (pv, pm) = (pivots.as_slice_mut::<i64>(), perm.as_slice_mut::<i64>());
    match a.dtype() {
        DType::F32 => factor_all(lu.as_slice_mut::<f32>(), pv, pm, m, n),
        DType::F64 => factor_all(lu.as_slice_mut::<f64>(), pv, pm, m, n),
        other => return Err(Error::invalid(format!("needs f32 or f64, got {other}"))),
    }
    Ok(vec![lu, pivots, perm])
}

/// The lower Cholesky factor of each n x n matrix (its lower triangle
/// read), column by column in f64; zeros above the diagonal. A leading
/// minor that is not positive-definite (a pivot not above 0, or NaN) makes
/// that column and every later one NaN, as XLA's factor does.
pub fn cholesky(a: &HostTensor) -> Result<HostTensor> {
    let d = a.dims();
    let n = d[d.len() - 1] as usize;
    let av = a.to_f64_vec();
    let mut l = vec![0.0f64; av.len()];
    if n > 0 {
        for (am, lm) in av.chunks_exact(n * n).zip(l.chunks_exact_mut(n * n)) {
            let mut failed = false;
            for j in 0..n {
                if failed {
                    (j..n).for_each(|i| lm[i * n + j] = f64::NAN);
                    continue;
                }
                let dot = |p: usize, q: usize, lm: &[f64]| -> f64 {
                    (0..j).map(|k| lm[p * n + k] * lm[q * n + k]).sum()
                };
                let djj = am[j * n + j] - dot(j, j, lm);
                if djj <= 0.0 || djj.is_nan() {
                    failed = true;
                    (j..n).for_each(|i| lm[i * n + j] = f64::NAN);
                    continue;
                }
                let ljj = djj.sqrt();
                lm[j * n + j] = ljj;
                for i in j + 1..n {
                    lm[i * n + j] = (am[i * n + j] - dot(i, j, lm)) / ljj;
                }
            }
        }
    }
    HostTensor::from_f64(a.dtype(), d, &l)
}

/// The permutation `pivots` [b.., k] make over `rows` entries.
pub fn pivots_to_permutation(pivots: &HostTensor, out: &TensorType) -> Result<HostTensor> {
    let m = *out.dims.last().unwrap_or(&0) as usize;
    let k = *pivots.dims().last().unwrap_or(&0) as usize;
    let mut perm = HostTensor::zeros(out.clone());
    if m == 0 {
        return Ok(perm);
    }
    let p = pivots.as_slice::<i64>();
    let rank = pivots.dims().len();
    for (b, lane) in perm.as_slice_mut::<i64>().chunks_exact_mut(m).enumerate() {
        lane.iter_mut().enumerate().for_each(|(i, v)| *v = i as i64);
        for i in 0..k {
            let v = p[b * k + i];
            if v < 0 || v as usize >= m {
                let mut at: Vec<u64> = vec![0; rank];
                let mut flat = (b * k + i) as u64;
                for (slot, &dim) in at.iter_mut().zip(pivots.dims()).rev() {
                    *slot = flat % dim;
                    flat /= dim;
                }
                return Err(Error::invalid(format!(
                    "index {v} at position {at:?} is out of range: axis {} has size {m}, \
                     so indices must lie in 0..{m}",
                    rank - 1
                )));
            }
            lane.swap(i, v as usize);
        }
    }
    Ok(perm)
}

/// The flags of one solve.
#[derive(Clone, Copy, Debug)]
pub struct Triangle {
    pub left_side: bool,
    pub lower: bool,
    pub unit_diagonal: bool,
    pub transpose_a: bool,
}

/// op(a) x = b for one m x m matrix `a` and an m x n `b` (row-major),
/// overwriting `b` with x. op(a) is lower triangular when `lower` and
/// `transpose` differ, so rows are solved first to last; else last to
/// first. `row` is scratch of n elements.
fn solve_left<T: Float>(a: &[T], b: &mut [T], m: usize, n: usize, t: Triangle, row: &mut [T]) {
    let at = |i: usize, j: usize| {
        if t.transpose_a {
            a[j * m + i]
        } else {
            a[i * m + j]
        }
    };
    let forward = t.lower != t.transpose_a;
    for step in 0..m {
        let i = if forward { step } else { m - 1 - step };
        row.copy_from_slice(&b[i * n..(i + 1) * n]);
        let solved = if forward { 0..i } else { i + 1..m };
        for j in solved {
            let f = at(i, j);
            if f != T::ZERO {
                let xj = &b[j * n..(j + 1) * n];
                row.iter_mut().zip(xj).for_each(|(r, &x)| *r = *r - f * x);
            }
        }
        if !t.unit_diagonal {
            let d = at(i, i);
            row.iter_mut().for_each(|r| *r = *r / d);
        }
        b[i * n..(i + 1) * n].copy_from_slice(row);
    }
}

/// Every batch element's solve, `x` holding the right-hand sides
/// (rows x cols each) and receiving the solutions.
fn solve_all<T: Float>(a: &[T], x: &mut [T], m: usize, rows: usize, cols: usize, t: Triangle) {
    // On the right, x op(a) = b is op(a)ᵀ xᵀ = bᵀ: solve the transposed
    // system on bᵀ, whose triangle is the other one.
    let n = if t.left_side { cols } else { rows };
    let left = Triangle {
        transpose_a: t.transpose_a == t.left_side,
        ..t
    };
    let mut lane = vec![T::ZERO; m * n];
    let mut row = vec![T::ZERO; n];
    for (am, bm) in a.chunks_exact(m * m).zip(x.chunks_exact_mut(rows * cols)) {
        if t.left_side {
            solve_left(am, bm, m, n, left, &mut row);
        } else {
            for i in 0..n {
                for j in 0..m {
                    lane[j * n + i] = bm[i * m + j];
                }
            }
            solve_left(am, &mut lane, m, n, left, &mut row);
            for i in 0..n {
                for j in 0..m {
                    bm[i * m + j] = lane[j * n + i];
                }
            }
        }
    }
}

pub fn triangular_solve(
    a: &HostTensor,
    b: &HostTensor,
    t: Triangle,
    out: &TensorType,
) -> Result<HostTensor> {
    let r = out.dims.len();
    let m = a.dims()[r - 1] as usize;
    let (rows, cols) = (out.dims[r - 2] as usize, out.dims[r - 1] as usize);
    let mut x = b.clone();
    if x.numel() == 0 || m == 0 {
        return Ok(x);
    }
    match out.dtype {
        DType::F32 => solve_all(
            a.as_slice::<f32>(),
            x.as_slice_mut::<f32>(),
            m,
            rows,
            cols,
            t,
        ),
        DType::F64 => solve_all(
            a.as_slice::<f64>(),
            x.as_slice_mut::<f64>(),
            m,
            rows,
            cols,
            t,
        ),
        other => return Err(Error::invalid(format!("needs f32 or f64, got {other}"))),
    }
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::super::{eval, HostTensor};
    use crate::ir::{DType, Prim};

    fn prim(left_side: bool, lower: bool, unit_diagonal: bool, transpose_a: bool) -> Prim {
        Prim::TriangularSolve {
            left_side,
            lower,
            unit_diagonal,
            transpose_a,
        }
    }

    /// The dense op(a) the flags describe: the named triangle of `a`, ones
    /// on the diagonal if unit, transposed if asked.
    fn dense(a: &[f64], m: usize, lower: bool, unit: bool, transpose: bool) -> Vec<f64> {
        let mut d = vec![0.0; m * m];
        for i in 0..m {
            for j in 0..m {
                let keep = if lower { j <= i } else { j >= i };
                let v = if i == j && unit {
                    1.0
                } else if keep {
                    a[i * m + j]
                } else {
                    0.0
                };
                if transpose {
                    d[j * m + i] = v;
                } else {
                    d[i * m + j] = v;
                }
            }
        }
        d
    }

    fn matmul(x: &[f64], y: &[f64], p: usize, q: usize, r: usize) -> Vec<f64> {
        let mut o = vec![0.0; p * r];
        for i in 0..p {
            for k in 0..q {
                for j in 0..r {
                    o[i * r + j] += x[i * q + k] * y[k * r + j];
                }
            }
        }
        o
    }

    /// Every flag combination, two batches: the solution multiplied back
    /// gives the right-hand side; the unread triangle (filled with junk)
    /// changes nothing.
    #[test]
    fn every_flag_combination_solves_its_system() {
        let (m, n, batch) = (4usize, 3usize, 2usize);
        let a: Vec<f64> = (0..batch * m * m)
            .map(|i| {
                if i % (m + 1) == 0 {
                    3.0
                } else {
                    ((i * 7 % 11) as f64 - 5.0) / 4.0
                }
            })
            .collect();
        let b: Vec<f64> = (0..batch * m * n)
            .map(|i| (i * 5 % 9) as f64 - 4.0)
            .collect();
        for bits in 0..16 {
            let (left, lower, unit, trans) =
                (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0, bits & 8 != 0);
            let bdims: Vec<u64> = if left { vec![2, 4, 3] } else { vec![2, 3, 4] };
            let at = HostTensor::from_f64(DType::F64, &[2, 4, 4], &a).unwrap();
            let bt = HostTensor::from_f64(DType::F64, &bdims, &b).unwrap();
            let x = eval(&prim(left, lower, unit, trans), &[&at, &bt]).unwrap();
            let x = x[0].to_f64_vec();
            for k in 0..batch {
                let op = dense(&a[k * m * m..(k + 1) * m * m], m, lower, unit, trans);
                let xk = &x[k * m * n..(k + 1) * m * n];
                let back = if left {
                    matmul(&op, xk, m, m, n)
                } else {
                    matmul(xk, &op, n, m, m)
                };
                for (g, w) in back.iter().zip(&b[k * m * n..(k + 1) * m * n]) {
                    assert!((g - w).abs() < 1e-9, "flags {bits:04b}: {g} vs {w}");
                }
            }
        }
    }

    /// A matrix whose steps swap (pivots 2, 2, 2 of 0..3), the factors
    /// by hand; a zero column leaves its step unscaled.
    #[test]
    fn lu_factor_pivots_and_factors() {
        let a = HostTensor::from_f64(
            DType::F64,
            &[3, 3],
            &[1.0, 1.0, 1.0, 2.0, 2.0, 5.0, 4.0, 6.0, 8.0],
        )
        .unwrap();
        let out = eval(&Prim::LuFactor, &[&a]).unwrap();
        assert_eq!(
            out[0].to_f64_vec(),
            vec![4.0, 6.0, 8.0, 0.5, -1.0, 1.0, 0.25, 0.5, -1.5]
        );
        assert_eq!(out[1].to_f64_vec(), vec![2.0, 1.0, 2.0]);
        assert_eq!(out[2].to_f64_vec(), vec![2.0, 1.0, 0.0]);
        let z = HostTensor::from_f64(DType::F32, &[2, 2], &[0.0, 1.0, 0.0, 2.0]).unwrap();
        let out = eval(&Prim::LuFactor, &[&z]).unwrap();
        assert_eq!(out[0].to_f64_vec(), vec![0.0, 1.0, 0.0, 2.0]);
        assert_eq!(out[1].to_f64_vec(), vec![0.0, 1.0]);
        // Tall and empty.
        let t = HostTensor::from_f64(DType::F64, &[3, 1], &[1.0, -3.0, 2.0]).unwrap();
        let out = eval(&Prim::LuFactor, &[&t]).unwrap();
        assert_eq!(out[0].to_f64_vec(), vec![-3.0, -1.0 / 3.0, -2.0 / 3.0]);
        assert_eq!(out[2].to_f64_vec(), vec![1.0, 0.0, 2.0]);
        let e = HostTensor::from_f64(DType::F32, &[2, 0], &[]).unwrap();
        let out = eval(&Prim::LuFactor, &[&e]).unwrap();
        assert_eq!(out[1].dims(), &[0]);
        assert_eq!(out[2].to_f64_vec(), vec![0.0, 1.0]);
    }

    /// [[4, 2], [2, 5]] = L Lᵀ with L = [[2, 0], [1, 2]]; the upper
    /// triangle is not read; a matrix failing at its second minor is NaN
    /// from that column on.
    #[test]
    fn cholesky_by_hand_and_its_failure() {
        let a = HostTensor::from_f64(
            DType::F64,
            &[2, 2, 2],
            &[4.0, 99.0, 2.0, 5.0, 1.0, 0.0, 2.0, 1.0],
        )
        .unwrap();
        let l = eval(&Prim::Cholesky, &[&a]).unwrap()[0].to_f64_vec();
        assert_eq!(&l[..4], &[2.0, 0.0, 1.0, 2.0]);
        assert_eq!(&l[4..6], &[1.0, 0.0]);
        assert_eq!(l[6], 2.0);
        assert!(l[7].is_nan());
    }

    #[test]
    fn pivots_make_their_permutation() {
        let p = HostTensor::from_f64(DType::I64, &[2, 2], &[2.0, 2.0, 1.0, 1.0]).unwrap();
        let out = eval(&Prim::PivotsToPermutation { rows: 3 }, &[&p]).unwrap();
        // [0 1 2] -> swap 0,2 -> [2 1 0] -> swap 1,2 -> [2 0 1]; [1 0 2].
        assert_eq!(out[0].to_f64_vec(), vec![2.0, 0.0, 1.0, 1.0, 0.0, 2.0]);
        let bad = HostTensor::from_f64(DType::I64, &[2], &[0.0, 3.0]).unwrap();
        let e = eval(&Prim::PivotsToPermutation { rows: 3 }, &[&bad]).unwrap_err();
        assert!(e.to_string().contains("index 3 at position [1]"), "{e}");
    }

    #[test]
    fn f32_zero_size_and_bad_operands() {
        let a = HostTensor::from_f64(DType::F32, &[2, 2], &[2.0, 0.0, 1.0, 4.0]).unwrap();
        let b = HostTensor::from_f64(DType::F32, &[2, 1], &[2.0, 9.0]).unwrap();
        let x = eval(&prim(true, true, false, false), &[&a, &b]).unwrap();
        assert_eq!(x[0].to_f64_vec(), vec![1.0, 2.0]);
        let a0 = HostTensor::from_f64(DType::F32, &[0, 0], &[]).unwrap();
        let b0 = HostTensor::from_f64(DType::F32, &[0, 5], &[]).unwrap();
        let x = eval(&prim(true, false, false, false), &[&a0, &b0]).unwrap();
        assert_eq!(x[0].dims(), &[0, 5]);
        let bi = HostTensor::from_f64(DType::I64, &[2, 1], &[1.0, 1.0]).unwrap();
        let e = eval(&prim(true, true, false, false), &[&a, &bi]).unwrap_err();
        assert!(e.to_string().contains("f32 or f64"), "{e}");
        let wide = HostTensor::from_f64(DType::F32, &[3, 1], &[1.0; 3]).unwrap();
        let e = eval(&prim(true, true, false, false), &[&a, &wide]).unwrap_err();
        assert!(e.to_string().contains("do not agree"), "{e}");
    }
}
