//! Linear systems: LU factorization with partial pivoting (LAPACK getrf's,
//! so torch's pivots), solves with the factors, triangular solves, the
//! general solve, inverse, determinant and log-determinant, and the
//! Cholesky factor with its solve and inverse; each batched over leading
//! dims, f32 or f64.
//!
//! Triangular solves are one primitive (`Prim::TriangularSolve`, XLA's
//! own); the factorization and the permutation its pivots make are two
//! more (`Prim::LuFactor`, `Prim::PivotsToPermutation`), which the xla
//! platform lowers to while loops, so a graph's size does not grow with
//! the matrix.

use super::attrs::Attrs;
use super::emit::{broadcast_shapes, Emitter};
use super::support::iota;
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, Prim, ReduceOp, UnaryOp, ValueId};

/// f32 or f64 (what torch's CPU linear algebra takes), else an error.
pub(super) fn need_real(e: &Emitter, x: ValueId, what: &str) -> Result<DType> {
    match e.dtype(x) {
        d @ (DType::F32 | DType::F64) => Ok(d),
        d => Err(Error::invalid(format!(
            "{what} must be float32 or float64, got {d}"
        ))),
    }
}

/// `b` (named `what`) has `dt`, the dtype of the matrix named `of`.
pub(super) fn same_dtype(e: &Emitter, b: ValueId, dt: DType, what: &str, of: &str) -> Result<()> {
    if e.dtype(b) != dt {
        return Err(Error::invalid(format!(
            "{what} must have the dtype of {of} ({dt}), got {}",
            e.dtype(b)
        )));
    }
    Ok(())
}

/// `n` x `n` identity matrices, B of them, in `dt`.
pub(super) fn identity(e: &mut Emitter, b: u64, n: u64, dt: DType) -> Result<ValueId> {
    let rows = iota(e, &[b, n, n], 1)?;
    let cols = iota(e, &[b, n, n], 2)?;
    let on = e.compare(CompareOp::Eq, rows, cols)?;
    e.convert(on, dt)
}

/// At least 2-D, and square when `square`: the matrix dims (m, n).
pub(super) fn matrix_dims(e: &Emitter, x: ValueId, what: &str, square: bool) -> Result<(u64, u64)> {
    let d = e.dims(x);
    if d.len() < 2 {
        return Err(Error::invalid(format!(
            "{what} must have at least 2 dimensions, got shape {d:?}"
        )));
    }
    let (m, n) = (d[d.len() - 2], d[d.len() - 1]);
    if square && m != n {
        return Err(Error::invalid(format!(
            "{what} must be batches of square matrices, but they are {m} by {n} matrices"
        )));
    }
    Ok((m, n))
}

/// `v`'s elements start..limit, per dimension.
pub(super) fn slice(e: &mut Emitter, v: ValueId, start: &[u64], limit: &[u64]) -> Result<ValueId> {
    e.op(
        Prim::Slice {
            start: start.to_vec(),
            limit: limit.to_vec(),
            stride: vec![1; start.len()],
        },
        &[v],
    )
}

/// `v` [batch.., rest..] as [B, rest..] with B the batch's product.
pub(super) fn flat_batch(e: &mut Emitter, v: ValueId, rest: usize) -> Result<ValueId> {
    let d = e.dims(v);
    let split = d.len() - rest;
    let mut to = vec![d[..split].iter().product()];
    to.extend(&d[split..]);
    e.reshape(v, &to)
}

/// The factorization of [B, m, n] matrices (`Prim::LuFactor`): (LU
/// packed as LAPACK packs it, L's unit diagonal implied; 0-based i64
/// pivots [B, min(m, n)]; the permutation [B, m]; info [B] i32, the
/// 1-based step of the first zero pivot, 0 for none).
pub(super) fn lu_steps(e: &mut Emitter, a: ValueId) -> Result<[ValueId; 4]> {
    let outs = e.g.node(Prim::LuFactor, &[a])?;
    let (lu, pivots, perm) = (outs[0], outs[1], outs[2]);
    let dims = e.dims(a);
    let (b, k) = (dims[0], dims[1].min(dims[2]));
    // U's diagonal: the pivots themselves, stored unscaled.
    let square = slice(e, lu, &[0, 0, 0], &[b, k, k])?;
    let diag = diagonal(e, square)?;
    let zero = e.compare_scalar(CompareOp::Eq, diag, 0.0)?;
    let info = first_failure(e, zero)?;
    Ok([lu, pivots, perm, info])
}

/// LAPACK's info from `failed` [B, k] (bool, per step): the 1-based step
/// of each row's first failure, 0 for none, i32 [B].
pub(super) fn first_failure(e: &mut Emitter, failed: ValueId) -> Result<ValueId> {
    let d = e.dims(failed);
    let (b, k) = (d[0], d[1]);
    let step = iota(e, &[b, k], 1)?;
    let step = e.binary_scalar(BinaryOp::Add, step, 1.0)?;
    let never = e.full(DType::I64, &[b, k], (k + 1) as f64)?;
    let at = e.select(failed, step, never)?;
    let first = e.reduce(ReduceOp::Min, at, &[1], false)?;
    let none = e.compare_scalar(CompareOp::Gt, first, k as f64)?;
    let zero_info = e.full(DType::I64, &[b], 0.0)?;
    let info = e.select(none, zero_info, first)?;
    e.convert(info, DType::I32)
}

/// The row permutation LAPACK's pivots make, [B, m] i64: row i of the
/// factored matrix is row perm[i] of the original. `pivots` [B, k] are
/// 0-based; swap i exchanges entries i and pivots[i].
fn permutation(e: &mut Emitter, pivots: ValueId, m: u64) -> Result<ValueId> {
    e.op(Prim::PivotsToPermutation { rows: m }, &[pivots])
}

/// The parity of a permutation made by `pivots` [B, k] (0-based): 1 or -1
/// in `dt`, [B].
fn pivot_sign(e: &mut Emitter, pivots: ValueId, dt: DType) -> Result<ValueId> {
    let d = e.dims(pivots);
    let at = iota(e, &d, 1)?;
    let moved = e.compare(CompareOp::Ne, pivots, at)?;
    let moved = e.convert(moved, DType::I64)?;
    let swaps = e.reduce(ReduceOp::Sum, moved, &[1], false)?;
    let odd = e.binary_scalar(BinaryOp::Rem, swaps, 2.0)?;
    let odd = e.convert(odd, dt)?;
    let twice = e.binary_scalar(BinaryOp::Mul, odd, -2.0)?;
    e.binary_scalar(BinaryOp::Add, twice, 1.0)
}

/// Triangular solve on the left of [B, n, n] and [B, n, r].
pub(super) fn triangular(
    e: &mut Emitter,
    a: ValueId,
    rhs: ValueId,
    lower: bool,
    unit_diagonal: bool,
    transpose_a: bool,
) -> Result<ValueId> {
    e.op(
        Prim::TriangularSolve {
            left_side: true,
            lower,
            unit_diagonal,
            transpose_a,
        },
        &[a, rhs],
    )
}

/// A x = rhs (or Aᵀ x = rhs with `adjoint`) for A = P L U given as its
/// packed factors `lu` [B, n, n] and permutation `perm` [B, n]; rhs
/// [B, n, r].
pub(super) fn lu_solve_left(
    e: &mut Emitter,
    lu: ValueId,
    perm: ValueId,
    rhs: ValueId,
    adjoint: bool,
) -> Result<ValueId> {
    let d = e.dims(rhs);
    let (b, n, r) = (d[0], d[1], d[2]);
    let spread = |e: &mut Emitter, p: ValueId| -> Result<ValueId> {
        let p = e.reshape(p, &[b, n, 1])?;
        e.broadcast_to(p, &[b, n, r])
    };
    if !adjoint {
        // L U x = rhs[perm].
        let pr = spread(e, perm)?;
        let permuted = e.op(Prim::Gather { axis: 1 }, &[rhs, pr])?;
        let y = triangular(e, lu, permuted, true, true, false)?;
        triangular(e, lu, y, false, false, false)
    } else {
        // Uᵀ Lᵀ (x[perm]) = rhs: w = x[perm], so x = w[perm⁻¹].
        let z = triangular(e, lu, rhs, false, false, true)?;
        let w = triangular(e, lu, z, true, true, true)?;
        let (_, positions) = e.sort(perm, 1, false)?;
        let inverse = spread(e, positions)?;
        e.op(Prim::Gather { axis: 1 }, &[w, inverse])
    }
}

/// The solve on either side: left, A x = rhs; right, x A = rhs (so Aᵀ xᵀ
/// = rhsᵀ). `adjoint` solves with Aᵀ in place of A. `lu`, `perm` and
/// `rhs` share the batch B.
fn lu_solve_sided(
    e: &mut Emitter,
    lu: ValueId,
    perm: ValueId,
    rhs: ValueId,
    left: bool,
    adjoint: bool,
) -> Result<ValueId> {
    if left {
        return lu_solve_left(e, lu, perm, rhs, adjoint);
    }
    let t = e.transpose(rhs, &[0, 2, 1])?;
    let x = lu_solve_left(e, lu, perm, t, !adjoint)?;
    e.transpose(x, &[0, 2, 1])
}

/// The factors of `a` [batch.., m, n]: LU [batch.., m, n], pivots
/// [batch.., k] 0-based i64, permutation [batch.., m], info [batch..] i32,
/// and the flattened values LU [B, m, n], pivots [B, k] and permutation
/// [B, m].
struct Factored {
    lu: ValueId,
    pivots: ValueId,
    perm: ValueId,
    info: ValueId,
    flat_lu: ValueId,
    flat_pivots: ValueId,
    flat_perm: ValueId,
}

fn factor(e: &mut Emitter, a: ValueId) -> Result<Factored> {
    let d = e.dims(a);
    let r = d.len();
    let (m, n) = (d[r - 2], d[r - 1]);
    let flat = flat_batch(e, a, 2)?;
    let [flat_lu, flat_pivots, flat_perm, info] = lu_steps(e, flat)?;
    let lu = e.reshape(flat_lu, &d)?;
    let mut pd = d[..r - 2].to_vec();
    pd.push(m.min(n));
    let pivots = e.reshape(flat_pivots, &pd)?;
    let mut qd = d[..r - 2].to_vec();
    qd.push(m);
    let perm = e.reshape(flat_perm, &qd)?;
    let info = e.reshape(info, &d[..r - 2])?;
    Ok(Factored {
        lu,
        pivots,
        perm,
        info,
        flat_lu,
        flat_pivots,
        flat_perm,
    })
}

/// Pivots as torch returns them: 1-based i32.
fn lapack_pivots(e: &mut Emitter, pivots: ValueId) -> Result<ValueId> {
    let p = e.binary_scalar(BinaryOp::Add, pivots, 1.0)?;
    e.convert(p, DType::I32)
}

/// lu_factor(A [.., m, n]) -> (LU, pivots [.., min(m, n)] i32 1-based,
/// info [..] i32): torch.linalg.lu_factor_ex.
fn lu_factor(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    need_real(e, x[0], "A")?;
    matrix_dims(e, x[0], "A", false)?;
    let f = factor(e, x[0])?;
    let p = lapack_pivots(e, f.pivots)?;
    Ok(vec![f.lu, p, f.info])
}

/// The diagonal of [B, n, n] as [B, n].
pub(super) fn diagonal(e: &mut Emitter, v: ValueId) -> Result<ValueId> {
    let d = e.dims(v);
    let rows = iota(e, &d, 1)?;
    let cols = iota(e, &d, 2)?;
    let on = e.compare(CompareOp::Eq, rows, cols)?;
    let zero = e.scalar(e.dtype(v), 0.0)?;
    let kept = e.select(on, v, zero)?;
    e.reduce(ReduceOp::Sum, kept, &[2], false)
}

/// Batch dims [..] of a [.., m, n] value.
pub(super) fn batch_of(e: &Emitter, v: ValueId) -> Vec<u64> {
    let d = e.dims(v);
    d[..d.len() - 2].to_vec()
}

/// linalg_det(A [.., n, n]) -> (det [..], LU, pivots): the product of U's
/// diagonal and the pivots' sign.
fn linalg_det(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let dt = need_real(e, x[0], "A")?;
    matrix_dims(e, x[0], "A", true)?;
    let batch = batch_of(e, x[0]);
    let f = factor(e, x[0])?;
    let diag = diagonal(e, f.flat_lu)?;
    let prod = e.reduce(ReduceOp::Prod, diag, &[1], false)?;
    let sign = pivot_sign(e, f.flat_pivots, dt)?;
    let det = e.mul(prod, sign)?;
    let det = e.reshape(det, &batch)?;
    let p = lapack_pivots(e, f.pivots)?;
    Ok(vec![det, f.lu, p])
}

/// linalg_slogdet(A) -> (sign [..], log|det| [..], LU, pivots); a singular
/// matrix gives sign 0 and -inf.
fn linalg_slogdet(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let dt = need_real(e, x[0], "A")?;
    matrix_dims(e, x[0], "A", true)?;
    let batch = batch_of(e, x[0]);
    let f = factor(e, x[0])?;
    let diag = diagonal(e, f.flat_lu)?;
    let signs = e.unary(UnaryOp::Sign, diag)?;
    let sign = e.reduce(ReduceOp::Prod, signs, &[1], false)?;
    let psign = pivot_sign(e, f.flat_pivots, dt)?;
    let sign = e.mul(sign, psign)?;
    let mag = e.unary(UnaryOp::Abs, diag)?;
    let logs = e.unary(UnaryOp::Log, mag)?;
    let logdet = e.reduce(ReduceOp::Sum, logs, &[1], false)?;
    let sign = e.reshape(sign, &batch)?;
    let logdet = e.reshape(logdet, &batch)?;
    let p = lapack_pivots(e, f.pivots)?;
    Ok(vec![sign, logdet, f.lu, p])
}

/// The common batch of `a` [.., n, n] and `rhs` [.., p, q]; both broadcast
/// to it and flattened to one batch dim. Returns (a, rhs, batch).
pub(super) fn common_batch(
    e: &mut Emitter,
    a: ValueId,
    rhs: ValueId,
) -> Result<(ValueId, ValueId, Vec<u64>)> {
    let (ad, rd) = (e.dims(a), e.dims(rhs));
    let batch = broadcast_shapes(&ad[..ad.len() - 2], &rd[..rd.len() - 2]).map_err(|_| {
        Error::invalid(format!(
            "the batch dimensions of shapes {ad:?} and {rd:?} do not broadcast"
        ))
    })?;
    let mut at = batch.clone();
    at.extend(&ad[ad.len() - 2..]);
    let mut rt = batch.clone();
    rt.extend(&rd[rd.len() - 2..]);
    let a = e.broadcast_to(a, &at)?;
    let rhs = e.broadcast_to(rhs, &rt)?;
    Ok((flat_batch(e, a, 2)?, flat_batch(e, rhs, 2)?, batch))
}

/// A vector right-hand side `b` [.., n] as the column [.., n, 1] (where
/// `vector`; else `b` itself).
pub(super) fn as_matrix(e: &mut Emitter, b: ValueId, vector: bool) -> Result<ValueId> {
    if !vector {
        return Ok(b);
    }
    let mut d = e.dims(b);
    d.push(1);
    e.reshape(b, &d)
}

/// Checks that `rhs` [.., p, q] fits A's n on the side solved.
fn check_rhs(e: &Emitter, rhs: ValueId, n: u64, left: bool, what: &str) -> Result<()> {
    let (p, q) = matrix_dims(e, rhs, what, false)?;
    let along = if left { p } else { q };
    if along != n {
        return Err(Error::invalid(format!(
            "incompatible shapes of A and {what}: A is {n} by {n}, {what} is {p} by {q} ({} side)",
            if left { "left" } else { "right" }
        )));
    }
    Ok(())
}

/// A's permutations `perm` [.., n] (A's batch) for every matrix of the
/// common `batch`, flattened: [B, n].
fn perm_for_batch(e: &mut Emitter, perm: ValueId, batch: &[u64]) -> Result<ValueId> {
    let mut d = e.dims(perm);
    let n = d[d.len() - 1];
    d.push(1);
    let p = e.reshape(perm, &d)?;
    let mut to = batch.to_vec();
    to.extend([n, 1]);
    let p = e.broadcast_to(p, &to)?;
    e.reshape(p, &[batch.iter().product(), n])
}

/// `flat` [B, p, q] back to `batch` + [p, q].
pub(super) fn unflatten(e: &mut Emitter, flat: ValueId, batch: &[u64]) -> Result<ValueId> {
    let d = e.dims(flat);
    let mut to = batch.to_vec();
    to.extend(&d[1..]);
    e.reshape(flat, &to)
}

/// lu_solve(LU [.., n, n], pivots [.., n] (1-based, integer), B; left =
/// true, adjoint = false) -> X with A X = B (X A = B on the right; Aᵀ for
/// A with adjoint): torch.linalg.lu_solve. Batch dims broadcast.
fn lu_solve(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let left = a.bool_or("left", true)?;
    let adjoint = a.bool_or("adjoint", false)?;
    let dt = need_real(e, x[0], "LU")?;
    same_dtype(e, x[2], dt, "B", "LU")?;
    let (n, _) = matrix_dims(e, x[0], "LU", true)?;
    check_rhs(e, x[2], n, left, "B")?;
    let (pd, ld) = (e.dims(x[1]), e.dims(x[0]));
    if !matches!(e.dtype(x[1]), DType::I32 | DType::I64)
        || pd.len() + 1 != ld.len()
        || pd[..] != ld[..ld.len() - 1]
    {
        return Err(Error::invalid(format!(
            "pivots must be integers of shape {:?} (LU's without its last dim), got {}",
            &ld[..ld.len() - 1],
            e.ty(x[1])
        )));
    }
    // LU's permutations (at its own batch), then the common batch.
    let p = e.convert(x[1], DType::I64)?;
    let p = e.binary_scalar(BinaryOp::Sub, p, 1.0)?;
    let p = flat_batch(e, p, 1)?;
    let perm = permutation(e, p, n)?;
    let perm = e.reshape(perm, &pd)?;
    let (lu, rhs, batch) = common_batch(e, x[0], x[2])?;
    let perm = perm_for_batch(e, perm, &batch)?;
    let x = lu_solve_sided(e, lu, perm, rhs, left, adjoint)?;
    Ok(vec![unflatten(e, x, &batch)?])
}

/// linalg_solve(A [.., n, n], B; left = true) -> (X, LU, pivots, info):
/// torch's _linalg_solve_ex. B is a matrix [.., n, k] (on the right
/// [.., k, n]) or a vector: 1-D, or A's shape without its last dim. Batch
/// dims broadcast; LU, pivots and info are A's.
fn linalg_solve(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let left = a.bool_or("left", true)?;
    let dt = need_real(e, x[0], "A")?;
    same_dtype(e, x[1], dt, "B", "A")?;
    let (n, _) = matrix_dims(e, x[0], "A", true)?;
    let (ad, bd) = (e.dims(x[0]), e.dims(x[1]));
    let vector = bd.len() == 1 || (bd.len() + 1 == ad.len() && bd[..] == ad[..ad.len() - 1]);
    if vector && !left {
        return Err(Error::invalid(
            "vector broadcasting of the left hand side is not supported for left=False",
        ));
    }
    let rhs = as_matrix(e, x[1], vector)?;
    check_rhs(e, rhs, n, left, "B")?;
    let f = factor(e, x[0])?;
    let (lu, rhs, batch) = common_batch(e, f.lu, rhs)?;
    let perm = perm_for_batch(e, f.perm, &batch)?;
    let sol = lu_solve_sided(e, lu, perm, rhs, left, false)?;
    let mut sol = unflatten(e, sol, &batch)?;
    if vector {
        let mut d = e.dims(sol);
        d.pop();
        sol = e.reshape(sol, &d)?;
    }
    let piv = lapack_pivots(e, f.pivots)?;
    Ok(vec![sol, f.lu, piv, f.info])
}

/// linalg_inv(A [.., n, n]) -> (A⁻¹, info): the solve with the identity.
/// A singular A (info > 0) gives inf and NaN, as LAPACK.
fn linalg_inv(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let dt = need_real(e, x[0], "A")?;
    let (n, _) = matrix_dims(e, x[0], "A", true)?;
    let d = e.dims(x[0]);
    let f = factor(e, x[0])?;
    let b = e.dims(f.flat_lu)[0];
    let eye = identity(e, b, n, dt)?;
    let inv = lu_solve_left(e, f.flat_lu, f.flat_perm, eye, false)?;
    Ok(vec![e.reshape(inv, &d)?, f.info])
}

/// solve_triangular(A [.., n, n], B; upper, left = true, unitriangular =
/// false) -> X with A X = B (X A = B on the right), A's other triangle
/// unread: torch.linalg.solve_triangular. Batch dims broadcast.
fn solve_triangular(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let upper = match a.get("upper") {
        Some(_) => a.bool_or("upper", false)?,
        None => return Err(Error::invalid("the attribute upper (a bool) is required")),
    };
    let left = a.bool_or("left", true)?;
    let unit = a.bool_or("unitriangular", false)?;
    let dt = need_real(e, x[0], "A")?;
    same_dtype(e, x[1], dt, "B", "A")?;
    let (n, _) = matrix_dims(e, x[0], "A", true)?;
    check_rhs(e, x[1], n, left, "B")?;
    let (am, bm, batch) = common_batch(e, x[0], x[1])?;
    let sol = e.op(
        Prim::TriangularSolve {
            left_side: left,
            lower: !upper,
            unit_diagonal: unit,
            transpose_a: false,
        },
        &[am, bm],
    )?;
    Ok(vec![unflatten(e, sol, &batch)?])
}

/// lu_unpack(LU [.., m, n], pivots [.., k] (1-based)) -> (P [.., m, m],
/// L [.., m, k], U [.., k, n]) with A = P L U: torch.lu_unpack.
fn lu_unpack(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let dt = need_real(e, x[0], "LU")?;
    let (m, n) = matrix_dims(e, x[0], "LU", false)?;
    let k = m.min(n);
    let (ld, pd) = (e.dims(x[0]), e.dims(x[1]));
    let r = ld.len();
    let batch = ld[..r - 2].to_vec();
    let mut want = batch.clone();
    want.push(k);
    if !matches!(e.dtype(x[1]), DType::I32 | DType::I64) || pd != want {
        return Err(Error::invalid(format!(
            "pivots must be integers of shape {want:?}, got {}",
            e.ty(x[1])
        )));
    }
    let lu = flat_batch(e, x[0], 2)?;
    let b = e.dims(lu)[0];
    let zero = e.scalar(dt, 0.0)?;
    let one = e.scalar(dt, 1.0)?;
    // L: strictly below the diagonal of the first k columns, unit diagonal.
    let l = slice(e, lu, &[0, 0, 0], &[b, m, k])?;
    let rows = iota(e, &[b, m, k], 1)?;
    let cols = iota(e, &[b, m, k], 2)?;
    let below = e.compare(CompareOp::Gt, rows, cols)?;
    let on = e.compare(CompareOp::Eq, rows, cols)?;
    let l = e.select(below, l, zero)?;
    let l = e.select(on, one, l)?;
    // U: on and above the diagonal of the first k rows.
    let u = slice(e, lu, &[0, 0, 0], &[b, k, n])?;
    let rows = iota(e, &[b, k, n], 1)?;
    let cols = iota(e, &[b, k, n], 2)?;
    let above = e.compare(CompareOp::Le, rows, cols)?;
    let u = e.select(above, u, zero)?;
    // P: column i holds a one in row perm[i] (A = P L U, Pᵀ A = A[perm]).
    let p = e.convert(x[1], DType::I64)?;
    let p = e.binary_scalar(BinaryOp::Sub, p, 1.0)?;
    let p = e.reshape(p, &[b, k])?;
    let perm = permutation(e, p, m)?;
    let perm = e.reshape(perm, &[b, 1, m])?;
    let rows = iota(e, &[b, m, m], 1)?;
    let hit = e.compare(CompareOp::Eq, rows, perm)?;
    let pm = e.convert(hit, dt)?;
    let mut out = Vec::new();
    for (v, tail) in [(pm, [m, m]), (l, [m, k]), (u, [k, n])] {
        let mut d = batch.clone();
        d.extend(tail);
        out.push(e.reshape(v, &d)?);
    }
    Ok(out)
}

/// cholesky(A [.., n, n]; upper = false) -> (L, info [..] i32):
/// torch.linalg.cholesky_ex. L Lᵀ = A with L lower (U = Lᵀ, Uᵀ U = A, with
/// `upper`); A's lower triangle is read. info is the order of the first
/// leading minor that is not positive-definite (0 when none is); the
/// factor of such a matrix is finite but unspecified (zeros from the
/// failing column on).
fn cholesky(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let upper = a.bool_or("upper", false)?;
    need_real(e, x[0], "A")?;
    let (n, _) = matrix_dims(e, x[0], "A", true)?;
    let d = e.dims(x[0]);
    let flat = flat_batch(e, x[0], 2)?;
    let b = e.dims(flat)[0];
    let l = e.op(Prim::Cholesky, &[flat])?;
    // The order of the first failing minor: its diagonal is NaN.
    let diag = diagonal(e, l)?;
    let good = e.compare_scalar(CompareOp::Gt, diag, 0.0)?;
    let failed = e.unary(UnaryOp::Not, good)?;
    let info = first_failure(e, failed)?;
    // Zeros above the diagonal (StableHLO leaves them unspecified) and
    // from a failing column on.
    let rows = iota(e, &[b, n, n], 1)?;
    let cols = iota(e, &[b, n, n], 2)?;
    let lower = e.compare(CompareOp::Ge, rows, cols)?;
    let info3 = e.reshape(info, &[b, 1, 1])?;
    let info3 = e.convert(info3, DType::I64)?;
    let failed = e.compare_scalar(CompareOp::Gt, info3, 0.0)?;
    let from = e.binary_scalar(BinaryOp::Sub, info3, 1.0)?;
    let past = e.compare(CompareOp::Ge, cols, from)?;
    let drop = e.binary(BinaryOp::And, failed, past)?;
    let zero = e.scalar(e.dtype(l), 0.0)?;
    let kept = e.select(lower, l, zero)?;
    let mut l = e.select(drop, zero, kept)?;
    if upper {
        l = e.transpose(l, &[0, 2, 1])?;
    }
    Ok(vec![e.reshape(l, &d)?, e.reshape(info, &d[..d.len() - 2])?])
}

/// (L Lᵀ) X = rhs for L [B, n, n] lower (or U upper, A = Uᵀ U) and rhs
/// [B, n, k].
fn cholesky_solve_flat(e: &mut Emitter, l: ValueId, rhs: ValueId, upper: bool) -> Result<ValueId> {
    // Lower: L y = rhs, Lᵀ x = y. Upper: Uᵀ y = rhs, U x = y.
    let y = triangular(e, l, rhs, !upper, false, upper)?;
    triangular(e, l, y, !upper, false, !upper)
}

/// cholesky_solve(B [.., n, k], L [.., n, n]; upper = false) -> X with
/// L Lᵀ X = B (Uᵀ U X = B with `upper`): torch.cholesky_solve. Batch dims
/// broadcast.
fn cholesky_solve(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let upper = a.bool_or("upper", false)?;
    let dt = need_real(e, x[1], "L")?;
    same_dtype(e, x[0], dt, "B", "L")?;
    let (n, _) = matrix_dims(e, x[1], "L", true)?;
    check_rhs(e, x[0], n, true, "B")?;
    let (l, rhs, batch) = common_batch(e, x[1], x[0])?;
    let sol = cholesky_solve_flat(e, l, rhs, upper)?;
    Ok(vec![unflatten(e, sol, &batch)?])
}

/// cholesky_inverse(L [.., n, n]; upper = false) -> (L Lᵀ)⁻¹ (or
/// (Uᵀ U)⁻¹): torch.cholesky_inverse.
fn cholesky_inverse(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let upper = a.bool_or("upper", false)?;
    let dt = need_real(e, x[0], "L")?;
    let (n, _) = matrix_dims(e, x[0], "L", true)?;
    let d = e.dims(x[0]);
    let l = flat_batch(e, x[0], 2)?;
    let b = e.dims(l)[0];
    let eye = identity(e, b, n, dt)?;
    let inv = cholesky_solve_flat(e, l, eye, upper)?;
    Ok(vec![e.reshape(inv, &d)?])
}

pub(super) const OPS: &[OpDef] = &[
    def!("cholesky", Arity::Exactly(1), cholesky),
    def!("cholesky_solve", Arity::Exactly(2), cholesky_solve),
    def!("cholesky_inverse", Arity::Exactly(1), cholesky_inverse),
    def!("lu_factor", Arity::Exactly(1), lu_factor),
    def!("lu_solve", Arity::Exactly(3), lu_solve),
    def!("lu_unpack", Arity::Exactly(2), lu_unpack),
    def!("linalg_solve", Arity::Exactly(2), linalg_solve),
    def!("linalg_inv", Arity::Exactly(1), linalg_inv),
    def!("linalg_det", Arity::Exactly(1), linalg_det),
    def!("linalg_slogdet", Arity::Exactly(1), linalg_slogdet),
    def!("solve_triangular", Arity::Exactly(2), solve_triangular),
];

#[cfg(test)]
mod tests {
    use super::super::tests::{close, naive_mm as matmul, run, run1, t};
    use crate::ir::DType::{self, F32, F64};
    use crate::ops::attrs::{Attr, Attrs};

    fn attrs(v: &[(&str, bool)]) -> Attrs {
        let mut a = Attrs::new();
        for (k, b) in v {
            a.set(k, Attr::Bool(*b));
        }
        a
    }

    /// A deterministic n x n matrix with entries in [-2, 2], a few on the
    /// diagonal small so the pivoting has work to do.
    fn matrix(n: usize, seed: usize) -> Vec<f64> {
        (0..n * n)
            .map(|i| {
                let v = ((i * 37 + seed * 11) % 23) as f64 / 5.75 - 2.0;
                if i % (n + 1) == 0 && i % 2 == 0 {
                    v * 0.01
                } else {
                    v
                }
            })
            .collect()
    }

    /// LAPACK's factors of [[1, 2], [3, 4]]: rows swapped (pivots 2, 2),
    /// L = [[1, 0], [1/3, 1]], U = [[3, 4], [0, 2/3]]; and of a 3 x 3
    /// matrix whose first step swaps its first and last rows.
    #[test]
    fn lu_factor_matches_lapack_by_hand() {
        let a = t(F64, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let out = run("lu_factor", &[&a], Attrs::new()).unwrap();
        close(&out[0], &[3.0, 4.0, 1.0 / 3.0, 2.0 / 3.0], 1e-15);
        assert_eq!(out[1].dtype(), DType::I32);
        assert_eq!(out[1].to_f64_vec(), vec![2.0, 2.0]);
        assert_eq!(out[2].to_f64_vec(), vec![0.0]);
        let a = t(F64, &[3, 3], &[1.0, 1.0, 1.0, 2.0, 2.0, 5.0, 4.0, 6.0, 8.0]);
        let out = run("lu_factor", &[&a], Attrs::new()).unwrap();
        // After swapping rows 0 and 2: [4 6 8; 2 2 5; 1 1 1], l = 1/2, 1/4;
        // trailing: [2-3, 5-4] = [-1, 1], [1-1.5, 1-2] = [-0.5, -1]; the
        // larger pivot -1 (row 1) stays; l = 0.5; U22 = -1 - 0.5 = -1.5.
        close(
            &out[0],
            &[4.0, 6.0, 8.0, 0.5, -1.0, 1.0, 0.25, 0.5, -1.5],
            1e-15,
        );
        assert_eq!(out[1].to_f64_vec(), vec![3.0, 2.0, 3.0]);
    }

    /// A singular matrix: info is the step of the first zero pivot and
    /// nothing divides by it; det 0, slogdet (0, -inf).
    #[test]
    fn singular_matrices_report_info_and_zero_det() {
        let a = t(F64, &[3, 3], &[1.0, 2.0, 3.0, 2.0, 4.0, 6.0, 1.0, 0.0, 1.0]);
        let out = run("lu_factor", &[&a], Attrs::new()).unwrap();
        assert!(out[0].to_f64_vec().iter().all(|v| v.is_finite()));
        assert_eq!(out[2].to_f64_vec(), vec![3.0]);
        close(&run1("linalg_det", &[&a], Attrs::new()), &[0.0], 0.0);
        let s = run("linalg_slogdet", &[&a], Attrs::new()).unwrap();
        assert_eq!(s[0].to_f64_vec(), vec![0.0]);
        assert_eq!(s[1].to_f64_vec(), vec![f64::NEG_INFINITY]);
        let inv = run("linalg_inv", &[&a], Attrs::new()).unwrap();
        assert_eq!(inv[1].to_f64_vec(), vec![3.0]);
    }

    /// det and slogdet of a batch against the cofactor expansion of 3 x 3
    /// determinants; the sign follows the row swaps.
    #[test]
    fn det_and_slogdet_match_cofactor_expansion() {
        let (m0, m1) = (matrix(3, 1), matrix(3, 2));
        let det3 = |m: &[f64]| {
            m[0] * (m[4] * m[8] - m[5] * m[7]) - m[1] * (m[3] * m[8] - m[5] * m[6])
                + m[2] * (m[3] * m[7] - m[4] * m[6])
        };
        let want = [det3(&m0), det3(&m1)];
        let a: Vec<f64> = m0.iter().chain(&m1).copied().collect();
        for dt in [F64, F32] {
            let x = t(dt, &[2, 3, 3], &a);
            let tol = if dt == F64 { 1e-13 } else { 1e-5 };
            close(&run1("linalg_det", &[&x], Attrs::new()), &want, tol);
            let s = run("linalg_slogdet", &[&x], Attrs::new()).unwrap();
            close(&s[0], &want.map(f64::signum), 0.0);
            close(&s[1], &want.map(|d| d.abs().ln()), tol);
        }
        // Identity with two rows swapped: det -1.
        let p = t(F64, &[3, 3], &[0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
        close(&run1("linalg_det", &[&p], Attrs::new()), &[-1.0], 0.0);
    }

    /// linalg_solve on both sides, with a vector right-hand side and a
    /// broadcast batch: A X = B holds to rounding.
    #[test]
    fn solve_satisfies_its_system_on_both_sides() {
        let n = 5;
        let am: Vec<f64> = matrix(n, 3).iter().chain(&matrix(n, 4)).copied().collect();
        let a = t(F64, &[2, 5, 5], &am);
        let bm: Vec<f64> = (0..n * 2).map(|i| (i as f64) - 4.5).collect();
        let b = t(F64, &[5, 2], &bm);
        let out = run("linalg_solve", &[&a, &b], Attrs::new()).unwrap();
        assert_eq!(out[0].dims(), &[2, 5, 2]);
        let x = out[0].to_f64_vec();
        for k in 0..2 {
            let back = matmul(&am[k * 25..(k + 1) * 25], &x[k * 10..(k + 1) * 10], n, n, 2);
            close(&t(F64, &[10], &back), &bm, 1e-12);
        }
        // Vector: B [5] solves each batch.
        let v = t(F64, &[5], &[1.0, 0.0, -1.0, 2.0, 0.5]);
        let xv = run1("linalg_solve", &[&a, &v], Attrs::new());
        assert_eq!(xv.dims(), &[2, 5]);
        let xv = xv.to_f64_vec();
        for k in 0..2 {
            let back = matmul(&am[k * 25..(k + 1) * 25], &xv[k * 5..(k + 1) * 5], n, n, 1);
            close(&t(F64, &[5], &back), &v.to_f64_vec(), 1e-12);
        }
        // Right: X A = B with B [3, 5].
        let br: Vec<f64> = (0..15).map(|i| (i % 4) as f64 - 1.0).collect();
        let a0 = t(F64, &[5, 5], &am[..25]);
        let xr = run1(
            "linalg_solve",
            &[&a0, &t(F64, &[3, 5], &br)],
            attrs(&[("left", false)]),
        );
        let back = matmul(&xr.to_f64_vec(), &am[..25], 3, n, n);
        close(&t(F64, &[15], &back), &br, 1e-12);
        let e = run("linalg_solve", &[&a0, &v], attrs(&[("left", false)])).unwrap_err();
        assert!(e.to_string().contains("left=False"), "{e}");
    }

    /// lu_solve with the factors, every side and adjoint; inv times A is
    /// the identity; lu_unpack's P L U gives A back.
    #[test]
    fn lu_solve_inv_and_unpack_round_trip() {
        let n = 4;
        let am = matrix(n, 5);
        let a = t(F64, &[4, 4], &am);
        let at: Vec<f64> = (0..16).map(|i| am[(i % 4) * 4 + i / 4]).collect();
        let f = run("lu_factor", &[&a], Attrs::new()).unwrap();
        let bm: Vec<f64> = (0..8).map(|i| (i as f64) * 0.5 - 1.0).collect();
        for (left, adjoint) in [(true, false), (true, true), (false, false), (false, true)] {
            let bdims = if left { [4, 2] } else { [2, 4] };
            let x = run1(
                "lu_solve",
                &[&f[0], &f[1], &t(F64, &bdims, &bm)],
                attrs(&[("left", left), ("adjoint", adjoint)]),
            )
            .to_f64_vec();
            let op = if adjoint { &at } else { &am };
            let back = if left {
                matmul(op, &x, 4, 4, 2)
            } else {
                matmul(&x, op, 2, 4, 4)
            };
            close(&t(F64, &[8], &back), &bm, 1e-12);
        }
        let inv = run("linalg_inv", &[&a], Attrs::new()).unwrap();
        assert_eq!(inv[1].to_f64_vec(), vec![0.0]);
        let eye = matmul(&inv[0].to_f64_vec(), &am, 4, 4, 4);
        let want: Vec<f64> = (0..16).map(|i| (i % 5 == 0) as u8 as f64).collect();
        close(&t(F64, &[16], &eye), &want, 1e-12);
        let plu = run("lu_unpack", &[&f[0], &f[1]], Attrs::new()).unwrap();
        let lu = matmul(&plu[1].to_f64_vec(), &plu[2].to_f64_vec(), 4, 4, 4);
        let back = matmul(&plu[0].to_f64_vec(), &lu, 4, 4, 4);
        close(&t(F64, &[16], &back), &am, 1e-12);
        // Rectangular: [2, 3] gives P [2, 2], L [2, 2], U [2, 3].
        let r = t(F32, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let f = run("lu_factor", &[&r], Attrs::new()).unwrap();
        let plu = run("lu_unpack", &[&f[0], &f[1]], Attrs::new()).unwrap();
        let dims: Vec<&[u64]> = plu.iter().map(|v| v.dims()).collect();
        assert_eq!(dims, vec![&[2u64, 2][..], &[2, 2], &[2, 3]]);
        close(&plu[0], &[0.0, 1.0, 1.0, 0.0], 0.0);
    }

    #[test]
    fn solve_triangular_reads_one_triangle() {
        // Upper [[2, 1], [junk, 4]]: x = [ (5 - 1·2)/2, 8/4 ] = [1.5, 2].
        let a = t(F32, &[2, 2], &[2.0, 1.0, 99.0, 4.0]);
        let b = t(F32, &[2, 1], &[5.0, 8.0]);
        let x = run1("solve_triangular", &[&a, &b], attrs(&[("upper", true)]));
        close(&x, &[1.5, 2.0], 1e-7);
        // Lower, unit diagonal: [[1, 0], [99, 1]] x = b.
        let x = run1(
            "solve_triangular",
            &[&a, &b],
            attrs(&[("upper", false), ("unitriangular", true)]),
        );
        close(&x, &[5.0, 8.0 - 99.0 * 5.0], 1e-7);
        let e = run("solve_triangular", &[&a, &b], Attrs::new()).unwrap_err();
        assert!(e.to_string().contains("upper"), "{e}");
    }

    /// A = L Lᵀ for L = [[2, 0, 0], [1, 3, 0], [-1, 2, 1]]; upper gives
    /// Lᵀ; the solve and inverse give A's; a matrix failing at its second
    /// minor has info 2 and a finite factor.
    #[test]
    fn cholesky_factor_solve_and_inverse() {
        let l = [2.0, 0.0, 0.0, 1.0, 3.0, 0.0, -1.0, 2.0, 1.0];
        let lt: Vec<f64> = (0..9).map(|i| l[(i % 3) * 3 + i / 3]).collect();
        let a = matmul(&l, &lt, 3, 3, 3);
        let at = t(F64, &[3, 3], &a);
        let out = run("cholesky", &[&at], Attrs::new()).unwrap();
        close(&out[0], &l, 1e-15);
        assert_eq!(out[1].to_f64_vec(), vec![0.0]);
        let u = run1("cholesky", &[&at], attrs(&[("upper", true)]));
        close(&u, &lt, 1e-15);
        let bm = [1.0, -2.0, 0.5, 3.0, 0.0, 1.0];
        let x = run1(
            "cholesky_solve",
            &[&t(F64, &[3, 2], &bm), &out[0]],
            Attrs::new(),
        );
        close(
            &t(F64, &[6], &matmul(&a, &x.to_f64_vec(), 3, 3, 2)),
            &bm,
            1e-13,
        );
        let x = run1(
            "cholesky_solve",
            &[&t(F64, &[3, 2], &bm), &u],
            attrs(&[("upper", true)]),
        );
        close(
            &t(F64, &[6], &matmul(&a, &x.to_f64_vec(), 3, 3, 2)),
            &bm,
            1e-13,
        );
        let inv = run1("cholesky_inverse", &[&out[0]], Attrs::new());
        let eye: Vec<f64> = (0..9).map(|i| (i % 4 == 0) as u8 as f64).collect();
        close(
            &t(F64, &[9], &matmul(&a, &inv.to_f64_vec(), 3, 3, 3)),
            &eye,
            1e-13,
        );
        let bad = t(F32, &[2, 2], &[1.0, 0.0, 2.0, 1.0]);
        let out = run("cholesky", &[&bad], Attrs::new()).unwrap();
        assert_eq!(out[1].to_f64_vec(), vec![2.0]);
        assert_eq!(out[0].to_f64_vec(), vec![1.0, 0.0, 2.0, 0.0]);
    }

    #[test]
    fn bad_inputs_are_named() {
        let sq = t(F32, &[2, 2], &[1.0, 0.0, 0.0, 1.0]);
        let cases: Vec<(&str, Vec<crate::platform::host::kernels::HostTensor>, &str)> = vec![
            (
                "linalg_inv",
                vec![t(DType::I64, &[2, 2], &[1.0; 4])],
                "float32 or float64",
            ),
            ("linalg_inv", vec![t(F32, &[2, 3], &[1.0; 6])], "square"),
            (
                "linalg_det",
                vec![t(F32, &[3], &[1.0; 3])],
                "at least 2 dimensions",
            ),
            (
                "linalg_solve",
                vec![sq.clone(), t(F32, &[3, 1], &[1.0; 3])],
                "incompatible",
            ),
            (
                "linalg_solve",
                vec![sq.clone(), t(F64, &[2, 1], &[1.0; 2])],
                "dtype",
            ),
            (
                "lu_solve",
                vec![
                    sq.clone(),
                    t(F32, &[2], &[1.0, 2.0]),
                    t(F32, &[2, 1], &[1.0; 2]),
                ],
                "pivots must be integers",
            ),
            (
                "linalg_solve",
                vec![t(F32, &[2, 2, 2], &[1.0; 8]), t(F32, &[3, 2, 1], &[1.0; 6])],
                "do not broadcast",
            ),
        ];
        for (op, ins, want) in cases {
            let refs: Vec<_> = ins.iter().collect();
            let e = run(op, &refs, Attrs::new()).unwrap_err().to_string();
            assert!(
                e.contains(want) && e.contains(&format!("{op}: ")),
                "{op}: {e}"
            );
        }
    }
}
