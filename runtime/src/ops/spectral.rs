//! Spectral decompositions by Jacobi's method (`Prim::Jacobi`): the
//! symmetric eigendecomposition (torch.linalg.eigh; eigenvalues
//! ascending) and the singular value decomposition (torch.linalg.svd;
//! singular values descending), batched, f32 or f64.
//!
//! The SVD is one-sided Jacobi on A (on Aᵀ when A is wide): A V has
//! orthogonal columns whose norms are the singular values; sorted, those
//! columns are U Σ, and U is read off their Householder QR (Q's columns,
//! signed by R's diagonal), which also completes U where a singular value
//! is 0 and for `full_matrices`. Jacobi's rotations give singular values
//! and eigenvalues to high relative accuracy.

use super::attrs::Attrs;
use super::emit::Emitter;
use super::qr::product;
use super::solve::{batch_of, diagonal, flat_batch, matrix_dims, need_real, slice, unflatten};
use super::support::iota;
use super::{Arity, OpDef};
use crate::error::Result;
use crate::ir::{BinaryOp, CompareOp, DType, Prim, ReduceOp, UnaryOp, ValueId};

/// `values` [B, k] sorted along dim 1 (`descending` or not), with the
/// columns of each of `mats` ([B, r, k]) put in the same order.
fn sort_columns(
    e: &mut Emitter,
    values: ValueId,
    mats: &[ValueId],
    descending: bool,
) -> Result<(ValueId, Vec<ValueId>)> {
    let (vals, idx) = e.sort(values, 1, descending)?;
    let d = e.dims(idx);
    let mut out = Vec::new();
    for &m in mats {
        let md = e.dims(m);
        let i3 = e.reshape(idx, &[d[0], 1, d[1]])?;
        let i3 = e.broadcast_to(i3, &md)?;
        out.push(e.op(Prim::Gather { axis: 2 }, &[m, i3])?);
    }
    Ok((vals, out))
}

/// eigh(A [.., n, n]; upper = false, compute_v = true) -> (eigenvalues
/// [..] ascending, eigenvectors [.., n, n] in columns; an empty tensor
/// without compute_v): torch's _linalg_eigh. Only the lower triangle of
/// A is read (the upper with `upper`).
fn linalg_eigh(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let upper = a.bool_or("upper", false)?;
    let compute_v = a.bool_or("compute_v", true)?;
    let dt = need_real(e, x[0], "A")?;
    let (n, _) = matrix_dims(e, x[0], "A", true)?;
    let batch = batch_of(e, x[0]);
    let flat = flat_batch(e, x[0], 2)?;
    let b = e.dims(flat)[0];
    // The symmetric matrix of the triangle read.
    let rows = iota(e, &[b, n, n], 1)?;
    let cols = iota(e, &[b, n, n], 2)?;
    let keep = e.compare(
        if upper { CompareOp::Le } else { CompareOp::Ge },
        rows,
        cols,
    )?;
    let mirror = e.transpose(flat, &[0, 2, 1])?;
    let sym = e.select(keep, flat, mirror)?;
    let outs = e.g.node(Prim::Jacobi { two_sided: true }, &[sym])?;
    let (w, vecs) = sort_columns(e, outs[0], &[outs[1]], false)?;
    let mut wd = batch.clone();
    wd.push(n);
    let w = e.reshape(w, &wd)?;
    let v = if compute_v {
        unflatten(e, vecs[0], &batch)?
    } else {
        e.full(dt, &[0], 0.0)?
    };
    Ok(vec![w, v])
}

/// One-sided Jacobi on [B, m, n] matrices, on their transposes where wide
/// (m < n): (wide, W = X V, V, the norms of W's columns [B, min(m, n)]),
/// X the matrix or its transpose; the norms are the singular values,
/// unsorted.
fn one_sided(e: &mut Emitter, a: ValueId) -> Result<(bool, ValueId, ValueId, ValueId)> {
    let d = e.dims(a);
    let wide = d[1] < d[2];
    let x = if wide { e.transpose(a, &[0, 2, 1])? } else { a };
    let outs = e.g.node(Prim::Jacobi { two_sided: false }, &[x])?;
    let sq = e.binary(BinaryOp::Mul, outs[0], outs[0])?;
    let norms = e.reduce(ReduceOp::Sum, sq, &[1], false)?;
    let norms = e.unary(UnaryOp::Sqrt, norms)?;
    Ok((wide, outs[0], outs[1], norms))
}

/// svd(A [.., m, n]; full_matrices = false, compute_uv = true) -> (U
/// [.., m, k] ([.., m, m] full), S [.., k] descending, Vh [.., k, n]
/// ([.., n, n] full)), k = min(m, n): torch's _linalg_svd. U and Vh are
/// empty tensors without compute_uv.
fn linalg_svd(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let full = a.bool_or("full_matrices", false)?;
    let compute_uv = a.bool_or("compute_uv", true)?;
    let dt = need_real(e, x[0], "A")?;
    let (m, n) = matrix_dims(e, x[0], "A", false)?;
    let batch = batch_of(e, x[0]);
    let flat = flat_batch(e, x[0], 2)?;
    let b = e.dims(flat)[0];
    // X (p x q, p >= q) = A, or Aᵀ when A is wide.
    let (wide, w, v, norms) = one_sided(e, flat)?;
    let (p, q) = if wide { (n, m) } else { (m, n) };
    let (s, cols) = sort_columns(e, norms, &[w, v], true)?;
    let mut sd = batch.clone();
    sd.push(q);
    let s_out = e.reshape(s, &sd)?;
    if !compute_uv {
        let none = e.full(dt, &[0], 0.0)?;
        return Ok(vec![none, s_out, none]);
    }
    let (us, vs) = (cols[0], cols[1]);
    // U Σ = Q R: U's first q columns are Q's signed by R's diagonal.
    let f = e.g.node(Prim::HouseholderQr, &[us])?;
    let (qr, tau) = (f[0], f[1]);
    let q_cols = if full { p } else { q };
    let packed = if q_cols <= q {
        qr
    } else {
        let zero = e.scalar(dt, 0.0)?;
        e.op(
            Prim::Pad {
                low: vec![0; 3],
                high: vec![0, 0, (q_cols - q) as i64],
                interior: vec![0; 3],
            },
            &[qr, zero],
        )?
    };
    let qm = e.op(Prim::HouseholderProduct, &[packed, tau])?;
    let r = slice(e, qr, &[0, 0, 0], &[b, q, q])?;
    let diag = diagonal(e, r)?;
    let neg = e.compare_scalar(CompareOp::Lt, diag, 0.0)?;
    let minus = e.scalar(dt, -1.0)?;
    let plus = e.scalar(dt, 1.0)?;
    let sign = e.select(neg, minus, plus)?;
    // Columns past q (full matrices) keep their sign.
    let sign = if q_cols > q {
        e.op(
            Prim::Pad {
                low: vec![0; 2],
                high: vec![0, (q_cols - q) as i64],
                interior: vec![0; 2],
            },
            &[sign, plus],
        )?
    } else {
        sign
    };
    let sign = e.reshape(sign, &[b, 1, q_cols])?;
    let u = e.binary(BinaryOp::Mul, qm, sign)?;
    // A = U Σ Vᵀ, or for a wide A: Aᵀ = U' Σ Vᵀ, so A = V Σ U'ᵀ.
    let (u, vh) = if wide {
        let vh = e.transpose(u, &[0, 2, 1])?;
        (vs, vh)
    } else {
        let vh = e.transpose(vs, &[0, 2, 1])?;
        (u, vh)
    };
    Ok(vec![
        unflatten(e, u, &batch)?,
        s_out,
        unflatten(e, vh, &batch)?,
    ])
}

/// The minimum-norm least-squares solution of A X = B over A's singular
/// values above `rcond` times the largest, the others taken as 0: LAPACK's
/// gelsd and gelss (gelsy's answer too, whose rank test reads a pivoted
/// QR's R instead of the singular values: the same rank wherever the
/// singular values have a gap at `rcond`). `a` [B, m, n], `rhs` [B, m, k]
/// -> (X [B, n, k], rank [B] i64, singular values [B, min(m, n)]
/// descending).
///
/// One-sided Jacobi on A (Aᵀ when wide) gives A V = W, W's columns of
/// norms s: A⁺ = V S⁻² Wᵀ (W S⁻² Vᵀ for the transposed factorization),
/// with 1/s applied twice so that no s² underflows.
pub(super) fn lstsq_by_svd(
    e: &mut Emitter,
    a: ValueId,
    rhs: ValueId,
    rcond: f64,
) -> Result<(ValueId, ValueId, ValueId)> {
    let dt = e.dtype(a);
    let (wide, w, v, s) = one_sided(e, a)?;
    let sd = e.dims(s);
    let largest = e.reduce(ReduceOp::Max, s, &[1], true)?;
    let cut = e.binary_scalar(BinaryOp::Mul, largest, rcond)?;
    let cut = e.broadcast_to(cut, &sd)?;
    let keep = e.compare(CompareOp::Gt, s, cut)?;
    // 1/s where kept (s replaced by 1 elsewhere, so nothing divides by 0).
    let one = e.scalar(dt, 1.0)?;
    let zero = e.scalar(dt, 0.0)?;
    let safe = e.select(keep, s, one)?;
    let inv = e.binary(BinaryOp::Div, one, safe)?;
    let inv = e.select(keep, inv, zero)?;
    let inv = e.reshape(inv, &[sd[0], sd[1], 1])?;
    // The factor applied to B first: Wᵀ (tall) or Vᵀ (wide); then the other.
    let (first, second) = if wide { (v, w) } else { (w, v) };
    let y = product(e, first, true, rhs, false)?;
    let yd = e.dims(y);
    let inv = e.broadcast_to(inv, &yd)?;
    let y = e.binary(BinaryOp::Mul, y, inv)?;
    let y = e.binary(BinaryOp::Mul, y, inv)?;
    let x = product(e, second, false, y, false)?;
    let rank = e.convert(keep, DType::I64)?;
    let rank = e.reduce(ReduceOp::Sum, rank, &[1], false)?;
    let (sorted, _) = e.sort(s, 1, true)?;
    Ok((x, rank, sorted))
}

pub(super) const OPS: &[OpDef] = &[
    def!("linalg_eigh", Arity::Exactly(1), linalg_eigh),
    def!("linalg_svd", Arity::Exactly(1), linalg_svd),
];

#[cfg(test)]
mod tests {
    use super::super::tests::{close, naive_mm as matmul, run, t};
    use crate::ir::DType::{F32, F64};
    use crate::ops::attrs::{Attr, Attrs};

    fn flag(name: &str, v: bool) -> Attrs {
        let mut a = Attrs::new();
        a.set(name, Attr::Bool(v));
        a
    }

    fn transpose(a: &[f64], m: usize, n: usize) -> Vec<f64> {
        (0..n * m).map(|i| a[(i % m) * n + i / m]).collect()
    }

    /// A deterministic m x n matrix with entries in [-2, 2].
    fn matrix(m: usize, n: usize, seed: usize) -> Vec<f64> {
        (0..m * n)
            .map(|i| 2.0 * (((i * i * 7 + i * 3 + seed * 5) as f64) * 0.7).sin())
            .collect()
    }

    /// Eigenvalues ascending with A v = λ v, Vᵀ V = I; the triangle not
    /// named is not read; a known spectrum (diag(3, 1, 2) rotated).
    #[test]
    fn eigh_decomposes_symmetric_matrices() {
        for (n, dt, tol) in [(5usize, F64, 1e-12), (6, F32, 1e-4), (1, F64, 0.0)] {
            let m = matrix(n, n, n);
            let sym: Vec<f64> = (0..n * n).map(|i| m[i] + m[(i % n) * n + i / n]).collect();
            // Junk above the diagonal: only the lower triangle is read.
            let junk: Vec<f64> = (0..n * n)
                .map(|i| if i % n > i / n { 99.0 } else { sym[i] })
                .collect();
            let out = run(
                "linalg_eigh",
                &[&t(dt, &[n as u64, n as u64], &junk)],
                Attrs::new(),
            )
            .unwrap();
            let (w, v) = (out[0].to_f64_vec(), out[1].to_f64_vec());
            assert!(w.windows(2).all(|p| p[0] <= p[1]), "{w:?}");
            let av = matmul(&sym, &v, n, n, n);
            for i in 0..n {
                for j in 0..n {
                    let want = v[i * n + j] * w[j];
                    assert!(
                        (av[i * n + j] - want).abs() < tol * 10.0 + 1e-15,
                        "{dt} n={n}"
                    );
                }
            }
            let vtv = matmul(&transpose(&v, n, n), &v, n, n, n);
            let eye: Vec<f64> = (0..n * n)
                .map(|i| if i % (n + 1) == 0 { 1.0 } else { 0.0 })
                .collect();
            close(&t(F64, &[(n * n) as u64], &vtv), &eye, tol.max(1e-15));
        }
        // Q diag(3, 1, 2) Qᵀ for a rotation Q, given by its upper triangle.
        let (c, s) = (0.6, 0.8);
        let q = [c, -s, 0.0, s, c, 0.0, 0.0, 0.0, 1.0];
        let d = [3.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 2.0];
        let a = matmul(&matmul(&q, &d, 3, 3, 3), &transpose(&q, 3, 3), 3, 3, 3);
        let out = run("linalg_eigh", &[&t(F64, &[3, 3], &a)], flag("upper", true)).unwrap();
        close(&out[0], &[1.0, 2.0, 3.0], 1e-14);
        let no_v = run(
            "linalg_eigh",
            &[&t(F64, &[3, 3], &a)],
            flag("compute_v", false),
        )
        .unwrap();
        assert_eq!(no_v[1].dims(), &[0]);
    }

    /// U S Vh = A with orthonormal U and V and descending S, tall, wide
    /// and square, reduced and full; a rank-deficient matrix gets a zero
    /// singular value and still an orthogonal U.
    #[test]
    fn svd_reconstructs_its_matrix() {
        for (m, n) in [(5usize, 3usize), (3, 5), (4, 4)] {
            let a = matrix(m, n, 2);
            let at = t(F64, &[m as u64, n as u64], &a);
            for full in [false, true] {
                let out = run("linalg_svd", &[&at], flag("full_matrices", full)).unwrap();
                let k = m.min(n);
                let (uc, vr) = if full { (m, n) } else { (k, k) };
                assert_eq!(out[0].dims(), &[m as u64, uc as u64]);
                assert_eq!(out[2].dims(), &[vr as u64, n as u64]);
                let (u, s, vh) = (
                    out[0].to_f64_vec(),
                    out[1].to_f64_vec(),
                    out[2].to_f64_vec(),
                );
                assert!(s.windows(2).all(|p| p[0] >= p[1]) && s.iter().all(|&x| x >= 0.0));
                let us: Vec<f64> = (0..m * k)
                    .map(|i| u[(i / k) * uc + i % k] * s[i % k])
                    .collect();
                let back = matmul(&us, &vh[..k * n], m, k, n);
                close(&t(F64, &[(m * n) as u64], &back), &a, 1e-12);
                let utu = matmul(&transpose(&u, m, uc), &u, uc, m, uc);
                let eye: Vec<f64> = (0..uc * uc)
                    .map(|i| if i % (uc + 1) == 0 { 1.0 } else { 0.0 })
                    .collect();
                close(&t(F64, &[(uc * uc) as u64], &utu), &eye, 1e-12);
            }
        }
        // Rank 1: one nonzero singular value.
        let r1: Vec<f64> = (0..12)
            .map(|i| ((i / 3 + 1) * (i % 3 + 1)) as f64)
            .collect();
        let out = run("linalg_svd", &[&t(F32, &[4, 3], &r1)], Attrs::new()).unwrap();
        let s = out[1].to_f64_vec();
        assert!(s[1].abs() < 1e-5 && s[2].abs() < 1e-5, "{s:?}");
        let u = out[0].to_f64_vec();
        let utu = matmul(&transpose(&u, 4, 3), &u, 3, 4, 3);
        close(
            &t(F64, &[9], &utu),
            &[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0],
            1e-5,
        );
    }
}
