//! Orthogonal factorizations: Householder QR packed as LAPACK's geqrf
//! packs it (torch.geqrf), the product of its reflectors (LAPACK's orgqr,
//! torch.linalg.householder_product), products with Q (ormqr),
//! torch.linalg.qr in its three modes, and least squares as LAPACK's gels
//! solves them (QR for a tall matrix, LQ, the QR of Aᵀ, for a wide one:
//! the minimum-norm solution) or, for a rank-deficient matrix, over its
//! singular values as gelsd does. Each batched over leading dims, f32 or
//! f64.
//!
//! The factorization and the product are two primitives
//! (`Prim::HouseholderQr`, `Prim::HouseholderProduct`) that the xla
//! platform lowers to while loops.

use super::attrs::Attrs;
use super::emit::Emitter;
use super::solve::{
    as_matrix, batch_of, common_batch, diagonal, first_failure, flat_batch, matrix_dims, need_real,
    same_dtype, slice, triangular, unflatten,
};
use super::spectral::lstsq_by_svd;
use super::support::iota;
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, Prim, ReduceOp, ValueId};

/// The packed factorization of [B, m, n] matrices: (QR, tau [B, k]).
fn factor(e: &mut Emitter, a: ValueId) -> Result<(ValueId, ValueId)> {
    let outs = e.g.node(Prim::HouseholderQr, &[a])?;
    Ok((outs[0], outs[1]))
}

/// `v` [B, p, q] with zeros below its diagonal.
fn upper(e: &mut Emitter, v: ValueId) -> Result<ValueId> {
    let d = e.dims(v);
    let rows = iota(e, &d, 1)?;
    let cols = iota(e, &d, 2)?;
    let keep = e.compare(CompareOp::Le, rows, cols)?;
    let zero = e.scalar(e.dtype(v), 0.0)?;
    e.select(keep, v, zero)
}

/// The first `c` columns of `v` [B, m, n]: a slice, or zero columns added.
fn columns(e: &mut Emitter, v: ValueId, c: u64) -> Result<ValueId> {
    let d = e.dims(v);
    if c <= d[2] {
        return slice(e, v, &[0, 0, 0], &[d[0], d[1], c]);
    }
    let zero = e.scalar(e.dtype(v), 0.0)?;
    e.op(
        Prim::Pad {
            low: vec![0; 3],
            high: vec![0, 0, (c - d[2]) as i64],
            interior: vec![0; 3],
        },
        &[v, zero],
    )
}

/// op(a) op(b) for [B, .., ..] operands, op the transpose where asked.
pub(super) fn product(
    e: &mut Emitter,
    a: ValueId,
    ta: bool,
    b: ValueId,
    tb: bool,
) -> Result<ValueId> {
    let precision = e.product_precision(e.dtype(a));
    e.op(
        Prim::DotGeneral {
            lhs_batch: vec![0],
            rhs_batch: vec![0],
            lhs_contract: vec![if ta { 1 } else { 2 }],
            rhs_contract: vec![if tb { 2 } else { 1 }],
            precision,
        },
        &[a, b],
    )
}

/// The full m x m Q of reflectors packed in `qr` [B, m, c] with `tau`
/// [B, t] (t <= min(m, c)).
fn full_q(e: &mut Emitter, qr: ValueId, tau: ValueId) -> Result<ValueId> {
    let m = e.dims(qr)[1];
    let square = columns(e, qr, m)?;
    e.op(Prim::HouseholderProduct, &[square, tau])
}

/// geqrf(A [.., m, n]) -> (QR, tau [.., min(m, n)]): torch.geqrf.
fn geqrf(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    need_real(e, x[0], "A")?;
    let (m, n) = matrix_dims(e, x[0], "A", false)?;
    let d = e.dims(x[0]);
    let flat = flat_batch(e, x[0], 2)?;
    let (qr, tau) = factor(e, flat)?;
    let mut td = batch_of(e, x[0]);
    td.push(m.min(n));
    Ok(vec![e.reshape(qr, &d)?, e.reshape(tau, &td)?])
}

/// `tau` [.., t] fits `a` [.., mn, c]: a's batch, t <= c and t <= mn.
fn check_tau(e: &Emitter, a: ValueId, tau: ValueId, what: &str) -> Result<()> {
    let (ad, td) = (e.dims(a), e.dims(tau));
    let r = ad.len();
    if td.len() + 1 != r || td[..r - 2] != ad[..r - 2] {
        return Err(Error::invalid(format!(
            "tau must have the batch dimensions of {what} ({:?}) and one more, got shape {td:?}",
            &ad[..r - 2]
        )));
    }
    let t = td[r - 2];
    if t > ad[r - 1] || t > ad[r - 2] {
        return Err(Error::invalid(format!(
            "tau has {t} reflectors but {what} (shape {ad:?}) holds at most {}",
            ad[r - 1].min(ad[r - 2])
        )));
    }
    Ok(())
}

/// householder_product(A [.., m, n], tau [.., k]) -> Q [.., m, n], the
/// first n columns of H_0 .. H_{k-1}, m >= n >= k:
/// torch.linalg.householder_product (and torch.orgqr).
fn householder_product(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let dt = need_real(e, x[0], "input")?;
    same_dtype(e, x[1], dt, "tau", "input")?;
    let (m, n) = matrix_dims(e, x[0], "input", false)?;
    if m < n {
        return Err(Error::invalid(format!(
            "input.shape[-2] must be greater than or equal to input.shape[-1], got {m} by {n}"
        )));
    }
    check_tau(e, x[0], x[1], "input")?;
    let d = e.dims(x[0]);
    let a = flat_batch(e, x[0], 2)?;
    let tau = flat_batch(e, x[1], 1)?;
    let q = e.op(Prim::HouseholderProduct, &[a, tau])?;
    Ok(vec![e.reshape(q, &d)?])
}

/// ormqr(A [.., mn, c], tau [.., t], C [.., p, q]; left = true,
/// transpose = false) -> Q C (Qᵀ C with `transpose`; C Q or C Qᵀ on the
/// right) for the mn x mn Q of A's reflectors: torch.ormqr. C's rows (on
/// the left) or columns (on the right) are mn; the batch dims all equal.
fn ormqr(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let left = a.bool_or("left", true)?;
    let transpose = a.bool_or("transpose", false)?;
    let dt = need_real(e, x[0], "input")?;
    same_dtype(e, x[1], dt, "tau", "input")?;
    same_dtype(e, x[2], dt, "other", "input")?;
    let (mn, _) = matrix_dims(e, x[0], "input", false)?;
    let (p, q) = matrix_dims(e, x[2], "other", false)?;
    check_tau(e, x[0], x[1], "input")?;
    let (ad, cd) = (e.dims(x[0]), e.dims(x[2]));
    if cd.len() != ad.len() || cd[..cd.len() - 2] != ad[..ad.len() - 2] {
        return Err(Error::invalid(format!(
            "other must have the batch dimensions of input ({:?}), got shape {cd:?}",
            &ad[..ad.len() - 2]
        )));
    }
    let along = if left { p } else { q };
    if along != mn {
        return Err(Error::invalid(format!(
            "other.shape[{}] must be input.shape[-2] ({mn}), got {along}",
            if left { -2 } else { -1 }
        )));
    }
    let qr = flat_batch(e, x[0], 2)?;
    let tau = flat_batch(e, x[1], 1)?;
    let c = flat_batch(e, x[2], 2)?;
    let full = full_q(e, qr, tau)?;
    let out = if left {
        product(e, full, transpose, c, false)?
    } else {
        product(e, c, false, full, transpose)?
    };
    Ok(vec![e.reshape(out, &cd)?])
}

/// linalg_qr(A [.., m, n]; mode = "reduced") -> (Q, R): torch.linalg.qr.
/// reduced: Q [.., m, k], R [.., k, n] (k = min(m, n)); complete: Q
/// [.., m, m], R [.., m, n]; r: R [.., k, n] and an empty Q.
fn linalg_qr(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let mode = a.str_or("mode", "reduced")?;
    let dt = need_real(e, x[0], "A")?;
    let (m, n) = matrix_dims(e, x[0], "A", false)?;
    if !matches!(mode, "reduced" | "complete" | "r") {
        return Err(Error::invalid(format!(
            "qr received unrecognized mode '{mode}' but expected one of 'reduced' \
             (default), 'r', or 'complete'"
        )));
    }
    let batch = batch_of(e, x[0]);
    let k = m.min(n);
    let flat = flat_batch(e, x[0], 2)?;
    let b = e.dims(flat)[0];
    let (qr, tau) = factor(e, flat)?;
    let r_rows = if mode == "complete" { m } else { k };
    let r = slice(e, qr, &[0, 0, 0], &[b, r_rows, n])?;
    let r = upper(e, r)?;
    let q = match mode {
        "r" => e.full(dt, &[0], 0.0)?,
        "complete" => {
            let q = full_q(e, qr, tau)?;
            unflatten(e, q, &batch)?
        }
        _ => {
            let packed = columns(e, qr, k)?;
            let q = e.op(Prim::HouseholderProduct, &[packed, tau])?;
            unflatten(e, q, &batch)?
        }
    };
    Ok(vec![q, unflatten(e, r, &batch)?])
}

/// linalg_lstsq(A [.., m, n], B [.., m, k] or a vector [.., m] (one dim
/// fewer than A); driver = "gels", rcond) -> (X [.., n, k] (or [.., n]),
/// residuals, info [..] i32, rank [..] i64, singular values [.., min(m,
/// n)]): torch.linalg.lstsq's solutions, batch dims broadcast.
///
/// - "gels" (the default, as torch's on CUDA): A of full rank, solved as
///   LAPACK's gels solves it, by the QR of A (tall) or of Aᵀ (wide, the
///   minimum-norm solution). info is the 1-based position of the first
///   zero on R's diagonal (A is rank-deficient), 0 when there is none;
///   rank and singular values are empty.
/// - "gelsd", "gelss" (LAPACK's SVD drivers) and "gelsy": the minimum-norm
///   solution over the singular values above rcond times the largest,
///   with the rank (`spectral::lstsq_by_svd`); singular values for gelsd
///   and gelss only (empty for gelsy, as torch returns them); info 0.
///   rcond is by default the dtype's epsilon times max(m, n); a negative
///   rcond means the epsilon, as LAPACK reads it.
///
/// Where m > n the residuals are the squared norms of each column of
/// A X - B ([.., k], k = 1 for a vector; empty otherwise, and always empty
/// for gelsy, as torch returns them). torch also returns them empty where
/// gelsd's or gelss's A is rank-deficient, a rule on values that a
/// frontend applies from the rank.
fn linalg_lstsq(e: &mut Emitter, x: &[ValueId], at: &Attrs) -> Result<Vec<ValueId>> {
    let driver = at.str_or("driver", "gels")?;
    let svd = match driver {
        "gels" => false,
        "gelsd" | "gelss" | "gelsy" => true,
        other => {
            return Err(Error::invalid(format!(
                "driver must be one of gels, gelsy, gelsd or gelss, got {other:?}"
            )))
        }
    };
    let dt = need_real(e, x[0], "input")?;
    same_dtype(e, x[1], dt, "other", "input")?;
    let (m, n) = matrix_dims(e, x[0], "input", false)?;
    let (ad, bd) = (e.dims(x[0]), e.dims(x[1]));
    if bd.len() > ad.len() || ad.len() - bd.len() > 1 {
        return Err(Error::invalid(format!(
            "input.dim() must be greater or equal to other.dim() and (input.dim() - \
             other.dim()) <= 1, got shapes {ad:?} and {bd:?}"
        )));
    }
    // One dim fewer: a vector (or a batch of vectors), a column of one.
    let vector = bd.len() + 1 == ad.len();
    let rhs = as_matrix(e, x[1], vector)?;
    let (rows, k) = matrix_dims(e, rhs, "other", false)?;
    if rows != m {
        return Err(Error::invalid(format!(
            "input.size(-2) should match other.size(-2): input is {m} by {n}, \
             other has {rows} rows"
        )));
    }
    let (a, rhs, batch) = common_batch(e, x[0], rhs)?;
    let b = e.dims(a)[0];
    let p = m.min(n);
    let (sol, info, rank, values) = if svd {
        let eps = if dt == DType::F64 {
            f64::EPSILON
        } else {
            f32::EPSILON as f64
        };
        let rcond = match at.float_opt("rcond")? {
            None => eps * m.max(n) as f64,
            Some(r) if r < 0.0 => eps,
            Some(r) => r,
        };
        let (sol, rank, values) = lstsq_by_svd(e, a, rhs, rcond)?;
        let info = e.full(DType::I32, &[b], 0.0)?;
        let rank = e.reshape(rank, &batch)?;
        let values = if driver == "gelsy" {
            e.full(dt, &[0], 0.0)?
        } else {
            let mut vd = batch.clone();
            vd.push(p);
            e.reshape(values, &vd)?
        };
        (sol, info, rank, values)
    } else {
        let (sol, info) = lstsq_by_qr(e, a, rhs)?;
        let rank = e.full(DType::I64, &[0], 0.0)?;
        let values = e.full(dt, &[0], 0.0)?;
        (sol, info, rank, values)
    };
    let residuals = if m > n && driver != "gelsy" {
        let fit = product(e, a, false, sol, false)?;
        let diff = e.binary(BinaryOp::Sub, fit, rhs)?;
        let sq = e.binary(BinaryOp::Mul, diff, diff)?;
        let res = e.reduce(ReduceOp::Sum, sq, &[1], false)?;
        let mut rd = batch.clone();
        rd.push(k);
        e.reshape(res, &rd)?
    } else {
        e.full(dt, &[0], 0.0)?
    };
    let mut sol = unflatten(e, sol, &batch)?;
    if vector {
        let mut d = e.dims(sol);
        d.pop();
        sol = e.reshape(sol, &d)?;
    }
    Ok(vec![sol, residuals, e.reshape(info, &batch)?, rank, values])
}

/// gels on `a` [B, m, n] and `rhs` [B, m, k] -> (X [B, n, k], info [B]).
fn lstsq_by_qr(e: &mut Emitter, a: ValueId, rhs: ValueId) -> Result<(ValueId, ValueId)> {
    let d = e.dims(a);
    let (b, m, n) = (d[0], d[1], d[2]);
    let p = m.min(n);
    // Tall: A = Q R, X = R⁻¹ Qᵀ B. Wide: Aᵀ = Q R, so A = Rᵀ Qᵀ and the
    // minimum-norm X = Q R⁻ᵀ B.
    let tall = m >= n;
    let factored = if tall { a } else { e.transpose(a, &[0, 2, 1])? };
    let (qr, tau) = factor(e, factored)?;
    let packed = columns(e, qr, p)?;
    let q = e.op(Prim::HouseholderProduct, &[packed, tau])?;
    let r = slice(e, qr, &[0, 0, 0], &[b, p, p])?;
    let sol = if tall {
        let y = product(e, q, true, rhs, false)?;
        triangular(e, r, y, false, false, false)?
    } else {
        let y = triangular(e, r, rhs, false, false, true)?;
        product(e, q, false, y, false)?
    };
    let zero_pivot = diagonal(e, r)?;
    let zero_pivot = e.compare_scalar(CompareOp::Eq, zero_pivot, 0.0)?;
    Ok((sol, first_failure(e, zero_pivot)?))
}

pub(super) const OPS: &[OpDef] = &[
    def!("geqrf", Arity::Exactly(1), geqrf),
    def!(
        "householder_product",
        Arity::Exactly(2),
        householder_product
    ),
    def!("ormqr", Arity::Exactly(3), ormqr),
    def!("linalg_qr", Arity::Exactly(1), linalg_qr),
    def!("linalg_lstsq", Arity::Exactly(2), linalg_lstsq),
];

#[cfg(test)]
mod tests {
    use super::super::tests::{close, naive_mm as matmul, run, run1, t};
    use crate::ir::DType::{F32, F64};
    use crate::ops::attrs::{Attr, Attrs};

    fn mode(m: &str) -> Attrs {
        let mut a = Attrs::new();
        a.set("mode", Attr::Str(m.into()));
        a
    }

    /// A deterministic m x n matrix with entries in [-2, 2] (of full rank
    /// for the sizes used here).
    fn matrix(m: usize, n: usize, seed: usize) -> Vec<f64> {
        (0..m * n)
            .map(|i| 2.0 * (((i * i * 7 + i * 3 + seed * 5) as f64) * 0.7).sin())
            .collect()
    }

    fn transpose(a: &[f64], m: usize, n: usize) -> Vec<f64> {
        (0..n * m).map(|i| a[(i % m) * n + i / m]).collect()
    }

    /// torch.geqrf of [[3, 1], [4, 2]] (LAPACK's): R = [[-5, -2.2], [., 0.4]],
    /// v = 0.5 below the diagonal, tau (1.6, 0).
    #[test]
    fn geqrf_matches_lapack_by_hand() {
        for dt in [F64, F32] {
            let a = t(dt, &[2, 2], &[3.0, 1.0, 4.0, 2.0]);
            let out = run("geqrf", &[&a], Attrs::new()).unwrap();
            close(&out[0], &[-5.0, -2.2, 0.5, 0.4], 1e-6);
            close(&out[1], &[1.6, 0.0], 1e-6);
        }
    }

    /// Every mode on tall, square and wide batches: Q R = A, Qᵀ Q = I, R
    /// upper triangular, the shapes torch gives.
    #[test]
    fn qr_in_every_mode_reconstructs_a() {
        for (m, n) in [(5usize, 3usize), (4, 4), (3, 5)] {
            let am: Vec<f64> = matrix(m, n, 1).into_iter().chain(matrix(m, n, 2)).collect();
            let a = t(F64, &[2, m as u64, n as u64], &am);
            let k = m.min(n);
            for (md, qc, rr) in [("reduced", k, k), ("complete", m, m)] {
                let out = run("linalg_qr", &[&a], mode(md)).unwrap();
                assert_eq!(out[0].dims(), &[2, m as u64, qc as u64], "{md}");
                assert_eq!(out[1].dims(), &[2, rr as u64, n as u64], "{md}");
                let (q, r) = (out[0].to_f64_vec(), out[1].to_f64_vec());
                for b in 0..2 {
                    let (q, r) = (
                        &q[b * m * qc..(b + 1) * m * qc],
                        &r[b * rr * n..(b + 1) * rr * n],
                    );
                    for i in 0..rr {
                        for j in 0..i.min(n) {
                            assert_eq!(r[i * n + j], 0.0, "{md}: R[{i}][{j}]");
                        }
                    }
                    let back = matmul(q, r, m, qc, n);
                    close(
                        &t(F64, &[m as u64, n as u64], &back),
                        &am[b * m * n..(b + 1) * m * n],
                        1e-12,
                    );
                    let qtq = matmul(&transpose(q, m, qc), q, qc, m, qc);
                    let eye: Vec<f64> = (0..qc * qc)
                        .map(|i| if i % (qc + 1) == 0 { 1.0 } else { 0.0 })
                        .collect();
                    close(&t(F64, &[qc as u64, qc as u64], &qtq), &eye, 1e-12);
                }
            }
            let r_only = run("linalg_qr", &[&a], mode("r")).unwrap();
            assert_eq!(r_only[0].dims(), &[0]);
            let reduced = run("linalg_qr", &[&a], Attrs::new()).unwrap();
            close(&r_only[1], &reduced[1].to_f64_vec(), 0.0);
        }
        let e = run("linalg_qr", &[&t(F64, &[2, 2], &[1.0; 4])], mode("full")).unwrap_err();
        assert!(e.to_string().contains("unrecognized mode 'full'"), "{e}");
    }

    /// ormqr against the complete Q multiplied out, on both sides, with
    /// and without the transpose; householder_product is reduced Q.
    #[test]
    fn ormqr_multiplies_by_q() {
        let (m, n) = (5usize, 3usize);
        let a = t(F64, &[5, 3], &matrix(m, n, 3));
        let f = run("geqrf", &[&a], Attrs::new()).unwrap();
        let q = run1("linalg_qr", &[&a], mode("complete")).to_f64_vec();
        let qt = transpose(&q, m, m);
        let c = matrix(m, 2, 4);
        let ct = t(F64, &[5, 2], &c);
        let mut tr = Attrs::new();
        tr.set("transpose", Attr::Bool(true));
        close(
            &run1("ormqr", &[&f[0], &f[1], &ct], Attrs::new()),
            &matmul(&q, &c, m, m, 2),
            1e-12,
        );
        close(
            &run1("ormqr", &[&f[0], &f[1], &ct], tr.clone()),
            &matmul(&qt, &c, m, m, 2),
            1e-12,
        );
        let d = matrix(2, m, 5);
        let dt = t(F64, &[2, 5], &d);
        tr.set("left", Attr::Bool(false));
        close(
            &run1("ormqr", &[&f[0], &f[1], &dt], tr),
            &matmul(&d, &qt, 2, m, m),
            1e-12,
        );
        let reduced = run1("linalg_qr", &[&a], Attrs::new());
        let hp = run1("householder_product", &[&f[0], &f[1]], Attrs::new());
        close(&hp, &reduced.to_f64_vec(), 1e-15);
        let bad = run(
            "ormqr",
            &[&f[0], &f[1], &t(F64, &[4, 2], &[0.0; 8])],
            Attrs::new(),
        );
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("other.shape[-2] must be input.shape[-2] (5)"));
        let wide = run(
            "householder_product",
            &[&t(F64, &[2, 3], &[0.0; 6]), &t(F64, &[2], &[0.0; 2])],
            Attrs::new(),
        );
        assert!(wide
            .unwrap_err()
            .to_string()
            .contains("greater than or equal"));
    }

    /// Tall: the normal equations Aᵀ A X = Aᵀ B hold and the residuals
    /// are ‖A X - B‖² per column. Wide: A X = B exactly and X = Aᵀ Y (the
    /// minimum-norm solution lies in A's row space). A vector B; a
    /// rank-deficient A reports info.
    #[test]
    fn lstsq_solves_tall_and_wide_systems() {
        let (m, n) = (6usize, 3usize);
        let am = matrix(m, n, 6);
        let bm = matrix(m, 2, 7);
        let a = t(F64, &[6, 3], &am);
        let out = run("linalg_lstsq", &[&a, &t(F64, &[6, 2], &bm)], Attrs::new()).unwrap();
        let x = out[0].to_f64_vec();
        let at = transpose(&am, m, n);
        let lhs = matmul(&matmul(&at, &am, n, m, n), &x, n, n, 2);
        let rhs = matmul(&at, &bm, n, m, 2);
        close(&t(F64, &[n as u64, 2], &lhs), &rhs, 1e-11);
        let fit = matmul(&am, &x, m, n, 2);
        let res: Vec<f64> = (0..2)
            .map(|c| {
                (0..m)
                    .map(|i| (fit[i * 2 + c] - bm[i * 2 + c]).powi(2))
                    .sum()
            })
            .collect();
        close(&out[1], &res, 1e-11);
        assert_eq!(out[2].to_f64_vec(), vec![0.0]);
        // Wide, f32.
        let wm = matrix(3, 5, 8);
        let w = t(F32, &[3, 5], &wm);
        let v = [1.0, -2.0, 0.5];
        let out = run("linalg_lstsq", &[&w, &t(F32, &[3], &v)], Attrs::new()).unwrap();
        assert_eq!(out[0].dims(), &[5]);
        assert_eq!(out[1].dims(), &[0]);
        let x = out[0].to_f64_vec();
        close(&t(F64, &[3], &matmul(&wm, &x, 3, 5, 1)), &v, 1e-5);
        // X = Wᵀ y for the y with W Wᵀ y = v.
        let wwt = t(F64, &[3, 3], &matmul(&wm, &transpose(&wm, 3, 5), 3, 5, 3));
        let y = run1("linalg_solve", &[&wwt, &t(F64, &[3], &v)], Attrs::new()).to_f64_vec();
        close(&out[0], &matmul(&transpose(&wm, 3, 5), &y, 5, 3, 1), 1e-5);
        // Rank-deficient: a zero column (R's diagonal exactly 0 there).
        let d = t(F64, &[3, 2], &[1.0, 0.0, 2.0, 0.0, 3.0, 0.0]);
        let out = run(
            "linalg_lstsq",
            &[&d, &t(F64, &[3, 1], &[1.0; 3])],
            Attrs::new(),
        )
        .unwrap();
        assert_eq!(out[2].to_f64_vec(), vec![2.0]);
        let e = run(
            "linalg_lstsq",
            &[&d, &t(F64, &[2, 1], &[1.0; 2])],
            Attrs::new(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("should match other.size(-2)"), "{e}");
    }

    fn driver(d: &str) -> Attrs {
        Attrs::new().with("driver", Attr::Str(d.into()))
    }

    /// The SVD drivers: on a full-rank A the gels solution, rank min(m, n)
    /// and the singular values; on a rank-one A = u vᵀ the minimum-norm
    /// solution A⁺ B = v uᵀ B / (|u|² |v|²), rank 1; rcond drops a small
    /// singular value; gelsy returns no singular values.
    #[test]
    fn lstsq_svd_drivers_give_the_minimum_norm_solution() {
        for (m, n) in [(6usize, 3usize), (3, 5)] {
            let a = t(F64, &[m as u64, n as u64], &matrix(m, n, 9));
            let b = t(F64, &[m as u64, 2], &matrix(m, 2, 10));
            let gels = run("linalg_lstsq", &[&a, &b], Attrs::new()).unwrap();
            assert_eq!(gels[3].dims(), &[0]);
            assert_eq!(gels[4].dims(), &[0]);
            let no_uv = Attrs::new().with("compute_uv", Attr::Bool(false));
            let svd = run("linalg_svd", &[&a], no_uv).unwrap().remove(1);
            for d in ["gelsd", "gelss"] {
                let out = run("linalg_lstsq", &[&a, &b], driver(d)).unwrap();
                close(&out[0], &gels[0].to_f64_vec(), 1e-10);
                close(&out[1], &gels[1].to_f64_vec(), 1e-10);
                assert_eq!(out[3].to_f64_vec(), vec![m.min(n) as f64]);
                close(&out[4], &svd.to_f64_vec(), 1e-12);
            }
        }
        let (u, v) = ([1.0, 2.0, 3.0, -1.0], [2.0, -1.0, 1.0]);
        let am: Vec<f64> = u
            .iter()
            .flat_map(|ui| v.iter().map(move |vj| ui * vj))
            .collect();
        let bm = matrix(4, 2, 11);
        let scale = 15.0 * 6.0;
        let utb = matmul(&u, &bm, 1, 4, 2);
        let want: Vec<f64> = v
            .iter()
            .flat_map(|vi| utb.iter().map(move |c| vi * c / scale))
            .collect();
        for d in ["gelsd", "gelsy"] {
            let out = run(
                "linalg_lstsq",
                &[&t(F64, &[4, 3], &am), &t(F64, &[4, 2], &bm)],
                driver(d),
            )
            .unwrap();
            close(&out[0], &want, 1e-12);
            assert_eq!(out[3].to_f64_vec(), vec![1.0]);
            assert_eq!(out[2].to_f64_vec(), vec![0.0]);
            if d == "gelsy" {
                assert_eq!(out[4].dims(), &[0]);
            } else {
                close(&out[4], &[(15.0f64 * 6.0).sqrt(), 0.0, 0.0], 1e-12);
            }
        }
        // rcond: 1e-3 / 1 is below 1e-2, so that direction is dropped.
        let diag = t(F32, &[2, 2], &[1.0, 0.0, 0.0, 1e-3]);
        let rhs = t(F32, &[2], &[1.0, 1.0]);
        let at = driver("gelsd").with("rcond", Attr::Float(1e-2));
        let out = run("linalg_lstsq", &[&diag, &rhs], at).unwrap();
        assert_eq!(out[0].to_f64_vec(), vec![1.0, 0.0]);
        assert_eq!(out[3].to_f64_vec(), vec![1.0]);
        let out = run("linalg_lstsq", &[&diag, &rhs], driver("gelss")).unwrap();
        close(&out[0], &[1.0, 1e3], 1e-3);
        let e = run("linalg_lstsq", &[&diag, &rhs], driver("gelsx")).unwrap_err();
        assert!(e.to_string().contains("got \"gelsx\""), "{e}");
    }
}
