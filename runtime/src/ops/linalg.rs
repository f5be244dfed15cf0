//! Matrix products: matmul (torch semantics), mm, bmm, addmm, baddbmm,
//! linear, dot, outer, and JAX's ragged_dot (grouped products); and the
//! small matrix and vector functions trace, linalg_cross, cdist and pdist
//! (each with its backward).

use super::attrs::Attrs;
use super::emit::{broadcast_shapes, Emitter};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, Prim, ReduceOp, ScatterCombiner, UnaryOp, ValueId};

fn check_numeric(e: &Emitter, x: ValueId) -> Result<()> {
    if e.dtype(x) == DType::Bool {
        return Err(Error::invalid(
            "matrix products of bool tensors are not supported",
        ));
    }
    Ok(())
}

/// [..., M, K] x [..., K, N] with broadcast batch dims (both rank >= 2).
fn batched(e: &mut Emitter, a: ValueId, b: ValueId) -> Result<ValueId> {
    let (ad, bd) = (e.dims(a), e.dims(b));
    let (ar, br) = (ad.len(), bd.len());
    if ad[ar - 1] != bd[br - 2] {
        return Err(Error::invalid(format!(
            "shapes {ad:?} and {bd:?} cannot be multiplied ({}x{} and {}x{})",
            ad[ar - 2],
            ad[ar - 1],
            bd[br - 2],
            bd[br - 1]
        )));
    }
    let batch = broadcast_shapes(&ad[..ar - 2], &bd[..br - 2])?;
    let nb = batch.len();
    let mut at = batch.clone();
    at.extend(&ad[ar - 2..]);
    let mut bt = batch.clone();
    bt.extend(&bd[br - 2..]);
    let a = e.broadcast_to(a, &at)?;
    let b = e.broadcast_to(b, &bt)?;
    let bdims: Vec<usize> = (0..nb).collect();
    let precision = e.product_precision(e.dtype(a));
    e.op(
        Prim::DotGeneral {
            lhs_batch: bdims.clone(),
            rhs_batch: bdims,
            lhs_contract: vec![nb + 1],
            rhs_contract: vec![nb],
            precision,
        },
        &[a, b],
    )
}

/// torch.matmul: 1-D operands are vectors; batch dims broadcast.
pub(super) fn matmul_values(e: &mut Emitter, a: ValueId, b: ValueId) -> Result<ValueId> {
    check_numeric(e, a)?;
    check_numeric(e, b)?;
    let (a, b) = {
        let (xs, _) = super::pointwise::promote(e, &[a, b], &Attrs::new())?;
        (xs[0], xs[1])
    };
    let (ar, br) = (e.rank(a), e.rank(b));
    if ar == 0 || br == 0 {
        return Err(Error::invalid(
            "both arguments to matmul need at least 1 dimension",
        ));
    }
    let a2 = if ar == 1 {
        e.reshape(a, &[1, e.dims(a)[0]])?
    } else {
        a
    };
    let b2 = if br == 1 {
        e.reshape(b, &[e.dims(b)[0], 1])?
    } else {
        b
    };
    let r = batched(e, a2, b2)?;
    let mut out = e.dims(r);
    if br == 1 {
        out.pop();
    }
    if ar == 1 {
        let n = out.len();
        out.remove(n - if br == 1 { 1 } else { 2 });
    }
    e.reshape(r, &out)
}

fn matmul(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    Ok(vec![matmul_values(e, x[0], x[1])?])
}

fn need_rank(e: &Emitter, x: ValueId, r: usize, what: &str) -> Result<()> {
    if e.rank(x) != r {
        return Err(Error::invalid(format!(
            "{what} must be {r}-D, got {:?}",
            e.dims(x)
        )));
    }
    Ok(())
}

fn mm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    need_rank(e, x[0], 2, "self")?;
    need_rank(e, x[1], 2, "mat2")?;
    matmul(e, x, a)
}

fn bmm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    need_rank(e, x[0], 3, "self")?;
    need_rank(e, x[1], 3, "mat2")?;
    if e.dims(x[0])[0] != e.dims(x[1])[0] {
        return Err(Error::invalid(format!(
            "batch sizes differ: {:?} and {:?}",
            e.dims(x[0]),
            e.dims(x[1])
        )));
    }
    matmul(e, x, a)
}

/// beta * input + alpha * (m1 @ m2); beta = 0 ignores input (even NaN).
fn add_scaled(e: &mut Emitter, input: ValueId, prod: ValueId, a: &Attrs) -> Result<ValueId> {
    let beta = a.float_or("beta", 1.0)?;
    let alpha = a.float_or("alpha", 1.0)?;
    let prod = if alpha != 1.0 {
        e.binary_scalar(BinaryOp::Mul, prod, alpha)?
    } else {
        prod
    };
    let input = e.convert(input, e.dtype(prod))?;
    if beta == 0.0 {
        let dims = broadcast_shapes(&e.dims(input), &e.dims(prod))?;
        return e.broadcast_to(prod, &dims);
    }
    let input = if beta != 1.0 {
        e.binary_scalar(BinaryOp::Mul, input, beta)?
    } else {
        input
    };
    e.add(input, prod)
}

/// Whether products of these operands round to a half type (bf16, f16).
/// (Matrix operands have dimensions, so both promote at one priority.)
fn half_product(e: &Emitter, m1: ValueId, m2: ValueId) -> Option<DType> {
    use super::promote::{result_type, Priority};
    let dt = result_type(&[
        (e.dtype(m1), Priority::Dimensioned),
        (e.dtype(m2), Priority::Dimensioned),
    ]);
    matches!(dt, DType::BF16 | DType::F16).then_some(dt)
}

/// `beta * input + alpha * product(m1, m2)`, rounded once. In a half type
/// the product, its scaling and the sum are computed in f32 and rounded to
/// the half type at the end, as torch's CPU and CUDA kernels do (the
/// product rounded before the input was added made a bf16 Linear with a
/// bias differ from torch's in about a quarter of its elements, by one
/// unit in the last place). The f32 product of half values is exact
/// element by element, so it is the half product before its rounding.
fn add_product(
    e: &mut Emitter,
    x: &[ValueId],
    a: &Attrs,
    product: fn(&mut Emitter, &[ValueId], &Attrs) -> Result<Vec<ValueId>>,
) -> Result<Vec<ValueId>> {
    let plain = a.float_or("beta", 1.0)? == 0.0 && a.float_or("alpha", 1.0)? == 1.0;
    match half_product(e, x[1], x[2]) {
        Some(half) if !plain => {
            let wide = [
                x[0],
                e.convert(x[1], DType::F32)?,
                e.convert(x[2], DType::F32)?,
            ];
            let p = product(e, &wide[1..], a)?[0];
            let sum = add_scaled(e, wide[0], p, a)?;
            Ok(vec![e.convert(sum, half)?])
        }
        _ => {
            let p = product(e, &x[1..], a)?[0];
            Ok(vec![add_scaled(e, x[0], p, a)?])
        }
    }
}

fn addmm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    add_product(e, x, a, mm)
}

fn baddbmm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    add_product(e, x, a, bmm)
}

/// linear(x, weight[out, in], bias?) = x @ weight^T + bias (with a bias
/// in a half type, rounded once as addmm is).
fn linear(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let w = x[1];
    let wt = match e.rank(w) {
        1 => w,
        2 => e.transpose(w, &[1, 0])?,
        _ => {
            return Err(Error::invalid(format!(
                "weight must be 1-D or 2-D, got {:?}",
                e.dims(w)
            )))
        }
    };
    match x.get(2) {
        // As addmm: the bias added to the f32 product, rounded once.
        Some(&b) if half_product(e, x[0], wt).is_some() => {
            add_product(e, &[b, x[0], wt], &Attrs::new(), matmul)
        }
        Some(&b) => {
            let y = matmul_values(e, x[0], wt)?;
            let b = e.convert(b, e.dtype(y))?;
            Ok(vec![e.add(y, b)?])
        }
        None => Ok(vec![matmul_values(e, x[0], wt)?]),
    }
}

fn dot(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    need_rank(e, x[0], 1, "self")?;
    need_rank(e, x[1], 1, "tensor")?;
    matmul(e, x, a)
}

fn outer(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    need_rank(e, x[0], 1, "self")?;
    need_rank(e, x[1], 1, "vec2")?;
    let (n, m) = (e.dims(x[0])[0], e.dims(x[1])[0]);
    let a = e.reshape(x[0], &[n, 1])?;
    let b = e.reshape(x[1], &[1, m])?;
    let (xs, _) = super::pointwise::promote(e, &[a, b], &Attrs::new())?;
    Ok(vec![e.mul(xs[0], xs[1])?])
}

/// Which of `m` rows each of the `g` groups holds: bool [m, g], row `r`
/// in group `j` when `sizes[0..j].sum() <= r < sizes[0..=j].sum()`. The
/// groups take consecutive rows from the first; rows past their total
/// belong to none, and a group with a negative size holds no row (nor
/// moves the groups after it back).
fn group_membership(e: &mut Emitter, sizes: ValueId, m: u64) -> Result<ValueId> {
    let g = e.dims(sizes)[0];
    let sizes = e.convert(sizes, DType::I64)?;
    let zero = e.full(DType::I64, &[g], 0.0)?;
    let sizes = e.max(sizes, zero)?;
    let ends = e.op(
        Prim::Cumulative {
            op: ReduceOp::Sum,
            dimension: 0,
            reverse: false,
        },
        &[sizes],
    )?;
    let starts = e.sub(ends, sizes)?;
    let rows = super::support::iota(e, &[m, g], 0)?;
    let starts = e.broadcast_to(starts, &[m, g])?;
    let ends = e.broadcast_to(ends, &[m, g])?;
    let after_start = e.compare(CompareOp::Ge, rows, starts)?;
    let before_end = e.compare(CompareOp::Lt, rows, ends)?;
    e.binary(BinaryOp::And, after_start, before_end)
}

/// The operands of a ragged product checked (`what` names the one the
/// rows of `lhs` meet): `sizes` a 1-D integer tensor of `groups` entries.
fn check_group_sizes(e: &Emitter, sizes: ValueId, groups: u64) -> Result<()> {
    need_rank(e, sizes, 1, "group_sizes")?;
    if !e.dtype(sizes).is_integer() {
        return Err(Error::invalid(format!(
            "group_sizes must be an integer tensor, got {:?}",
            e.dtype(sizes)
        )));
    }
    if e.dims(sizes)[0] != groups {
        return Err(Error::invalid(format!(
            "group_sizes has {} entries for {groups} groups",
            e.dims(sizes)[0]
        )));
    }
    Ok(())
}

/// `lhs` [m, k] as [m, g, k]: row r's values in its group's slot, zeros in
/// the others.
fn rows_by_group(e: &mut Emitter, lhs: ValueId, sizes: ValueId, g: u64) -> Result<ValueId> {
    let (m, k) = (e.dims(lhs)[0], e.dims(lhs)[1]);
    let member = group_membership(e, sizes, m)?;
    let member = e.reshape(member, &[m, g, 1])?;
    let member = e.broadcast_to(member, &[m, g, k])?;
    let wide = e.reshape(lhs, &[m, 1, k])?;
    let wide = e.broadcast_to(wide, &[m, g, k])?;
    let zero = e.full(e.dtype(lhs), &[m, g, k], 0.0)?;
    e.select(member, wide, zero)
}

/// JAX's `ragged_dot`, the grouped product of mixture-of-experts layers:
/// `lhs` [m, k], `rhs` [g, k, n], `group_sizes` [g] integers; the rows of
/// `lhs` fall into consecutive groups of those sizes and group j's rows
/// are multiplied by `rhs[j]`, giving [m, n]; rows past the groups' total
/// give zeros. One product over (group, k): each row's values sit in its
/// group's slot of an [m, g·k] operand, zeros elsewhere (g times the work
/// of a kernel that skips the zeros, exact: a zero times a finite weight
/// adds nothing).
fn ragged_dot(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    need_rank(e, x[0], 2, "lhs")?;
    need_rank(e, x[1], 3, "rhs")?;
    check_numeric(e, x[0])?;
    check_numeric(e, x[1])?;
    let (ld, rd) = (e.dims(x[0]), e.dims(x[1]));
    if ld[1] != rd[1] {
        return Err(Error::invalid(format!(
            "lhs {ld:?} and rhs {rd:?} cannot be multiplied: lhs has {} columns, each group of rhs {} rows",
            ld[1], rd[1]
        )));
    }
    check_group_sizes(e, x[2], rd[0])?;
    // [m, g, k] · [g, k, n] over (g, k).
    grouped_product(e, x, rd[0], (vec![1, 2], vec![0, 1]))
}

/// `x` = (lhs [m, k], other, group sizes [g]): lhs's rows spread over
/// their groups' slots ([m, g, k]) times `other`, promoted to one dtype,
/// contracting `contract` (lhs dims, other's dims).
fn grouped_product(
    e: &mut Emitter,
    x: &[ValueId],
    groups: u64,
    (lhs_contract, rhs_contract): (Vec<usize>, Vec<usize>),
) -> Result<Vec<ValueId>> {
    let (xs, _) = super::pointwise::promote(e, &x[..2], &Attrs::new())?;
    let masked = rows_by_group(e, xs[0], x[2], groups)?;
    let precision = e.product_precision(e.dtype(xs[0]));
    Ok(vec![e.op(
        Prim::DotGeneral {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract,
            rhs_contract,
            precision,
        },
        &[masked, xs[1]],
    )?])
}

/// The gradient of `ragged_dot` with respect to `rhs`: `lhs` [m, k],
/// `grad` [m, n], `group_sizes` [g] give [g, k, n], group j's rows of
/// `lhs` transposed times the same rows of `grad`. (With respect to `lhs`
/// it is `ragged_dot(grad, rhs transposed to [g, n, k], group_sizes)`.)
fn ragged_dot_rhs_grad(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    need_rank(e, x[0], 2, "lhs")?;
    need_rank(e, x[1], 2, "grad")?;
    check_numeric(e, x[0])?;
    check_numeric(e, x[1])?;
    let (ld, gd) = (e.dims(x[0]), e.dims(x[1]));
    if ld[0] != gd[0] {
        return Err(Error::invalid(format!(
            "lhs {ld:?} and grad {gd:?} have different numbers of rows"
        )));
    }
    need_rank(e, x[2], 1, "group_sizes")?;
    let g = e.dims(x[2])[0];
    check_group_sizes(e, x[2], g)?;
    // [m, g, k] · [m, n] over m.
    grouped_product(e, x, g, (vec![0], vec![0]))
}

/// trace(x) -> the sum of a matrix's diagonal: f32 summed in f64 and
/// bf16/f16 in f32 (torch's CPU accumulation), rounded once; integers
/// sum to i64.
fn trace(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let t = e.ty(x[0]);
    if t.rank() != 2 {
        return Err(Error::invalid(format!(
            "expected a matrix, but got tensor with dim {}",
            t.rank()
        )));
    }
    if t.dtype == DType::Bool {
        return Err(Error::invalid("not implemented for bool tensors"));
    }
    let (n, m) = (t.dims[0], t.dims[1]);
    let k = n.min(m);
    let (out, acc) = match t.dtype {
        DType::F64 | DType::F32 => (t.dtype, DType::F64),
        DType::BF16 | DType::F16 => (t.dtype, DType::F32),
        _ => (DType::I64, DType::I64),
    };
    if k == 0 {
        return Ok(vec![e.full(out, &[], 0.0)?]);
    }
    // The diagonal of the row-major matrix: every (m + 1)-th element.
    let flat = e.reshape(x[0], &[n * m])?;
    let diag = e.op(
        Prim::Slice {
            start: vec![0],
            limit: vec![(k - 1) * (m + 1) + 1],
            stride: vec![m + 1],
        },
        &[flat],
    )?;
    let diag = e.convert(diag, acc)?;
    let s = e.reduce(ReduceOp::Sum, diag, &[0], false)?;
    Ok(vec![e.convert(s, out)?])
}

/// linalg_cross(a, b; dim=-1): the cross product of 3-vectors along dim;
/// a and b have one dtype and rank and broadcast. Per element as torch:
/// r0 = a1 b2 - a2 b1, r1 = a2 b0 - a0 b2, r2 = a0 b1 - a1 b0.
fn linalg_cross(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (at, bt) = (e.ty(x[0]), e.ty(x[1]));
    if at.rank() != bt.rank() {
        return Err(Error::invalid(
            "inputs must have the same number of dimensions",
        ));
    }
    if at.dtype != bt.dtype {
        return Err(Error::invalid(format!(
            "inputs must have the same dtype, got {} and {}",
            at.dtype, bt.dtype
        )));
    }
    if at.dtype == DType::Bool {
        return Err(Error::invalid("not implemented for bool tensors"));
    }
    let dim = a.int_or("dim", -1)?;
    let d = super::emit::existing_dim(dim, at.rank())?;
    if at.dims[d] != 3 || bt.dims[d] != 3 {
        return Err(Error::invalid(format!(
            "inputs dimension {dim} must have length 3. Got {} and {}",
            at.dims[d], bt.dims[d]
        )));
    }
    let dims = broadcast_shapes(&at.dims, &bt.dims)?;
    let (a, b) = (e.broadcast_to(x[0], &dims)?, e.broadcast_to(x[1], &dims)?);
    // v shifted by `s` along d: element i is v[(i + s) % 3].
    let rot = |e: &mut Emitter, v: ValueId, s: u64| -> Result<ValueId> {
        let parts = [s, 0].map(|from| {
            let mut start = vec![0; dims.len()];
            let mut limit = dims.clone();
            start[d] = from;
            limit[d] = if from == s { 3 } else { s };
            (start, limit)
        });
        let mut pieces = Vec::new();
        for (start, limit) in parts {
            pieces.push(e.op(
                Prim::Slice {
                    start,
                    limit,
                    stride: vec![1; dims.len()],
                },
                &[v],
            )?);
        }
        e.op(Prim::Concatenate { dimension: d }, &pieces)
    };
    let (a1, a2) = (rot(e, a, 1)?, rot(e, a, 2)?);
    let (b1, b2) = (rot(e, b, 1)?, rot(e, b, 2)?);
    let p = e.mul(a1, b2)?;
    let q = e.mul(a2, b1)?;
    Ok(vec![e.sub(p, q)?])
}

/// The pairwise differences of cdist: x1 [..., P, M] and x2 [..., R, M]
/// (batch dims broadcast) as [..., P, R, M].
fn pair_differences(e: &mut Emitter, x1: ValueId, x2: ValueId) -> Result<ValueId> {
    let (at, bt) = (e.ty(x1), e.ty(x2));
    if at.rank() < 2 || bt.rank() < 2 {
        return Err(Error::invalid(format!(
            "only supports at least 2-D tensors, got {at} and {bt}"
        )));
    }
    if !at.dtype.is_float() || at.dtype != bt.dtype {
        return Err(Error::invalid(format!(
            "only supports floating-point inputs of one dtype, got {at} and {bt}"
        )));
    }
    let (ar, br) = (at.rank(), bt.rank());
    let m = at.dims[ar - 1];
    if bt.dims[br - 1] != m {
        return Err(Error::invalid(format!(
            "x1 and x2 must have the same number of columns, got {m} and {}",
            bt.dims[br - 1]
        )));
    }
    let (p, r) = (at.dims[ar - 2], bt.dims[br - 2]);
    let mut dims = broadcast_shapes(&at.dims[..ar - 2], &bt.dims[..br - 2])?;
    dims.extend([p, r, m]);
    let mut ad = at.dims[..ar - 1].to_vec();
    ad.extend([1, m]);
    let mut bd = bt.dims[..br - 2].to_vec();
    bd.extend([1, r, m]);
    let a = e.reshape(x1, &ad)?;
    let b = e.reshape(x2, &bd)?;
    let (a, b) = (e.broadcast_to(a, &dims)?, e.broadcast_to(b, &dims)?);
    e.sub(a, b)
}

fn norm_order(a: &Attrs) -> Result<f64> {
    let p = a.float_or("p", 2.0)?;
    if p.is_nan() || p < 0.0 {
        return Err(Error::invalid(format!(
            "only supports non-negative p values, got {p}"
        )));
    }
    Ok(p)
}

/// cdist(x1 [..., P, M], x2 [..., R, M]; p=2) -> [..., P, R]: the p-norm
/// distance of every row pair, as torch's direct kernel (aten's
/// _cdist_forward): p = 0 counts differing elements, p = inf takes the
/// largest difference, 1 and 2 their own formulas, others
/// (sum |d|^p)^(1/p). The product form for large p = 2 inputs is aten's
/// _euclidean_dist, which needs no op here.
fn cdist(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let p = norm_order(a)?;
    let d = pair_differences(e, x[0], x[1])?;
    let last = e.rank(d) - 1;
    let dt = e.dtype(d);
    let ab = e.unary(UnaryOp::Abs, d)?;
    let r = if p == 0.0 {
        let zero = e.full_like(d, 0.0)?;
        let ne = e.compare(CompareOp::Ne, d, zero)?;
        let ne = e.convert(ne, dt)?;
        e.reduce(ReduceOp::Sum, ne, &[last], false)?
    } else if p == f64::INFINITY {
        e.reduce(ReduceOp::Max, ab, &[last], false)?
    } else if p == 1.0 {
        e.reduce(ReduceOp::Sum, ab, &[last], false)?
    } else if p == 2.0 {
        let sq = e.mul(d, d)?;
        let s = e.reduce(ReduceOp::Sum, sq, &[last], false)?;
        e.unary(UnaryOp::Sqrt, s)?
    } else {
        let pw = e.binary_scalar(BinaryOp::Pow, ab, p)?;
        let s = e.reduce(ReduceOp::Sum, pw, &[last], false)?;
        e.binary_scalar(BinaryOp::Pow, s, 1.0 / p)?
    };
    Ok(vec![r])
}

/// cdist_backward(grad [..., P, R], x1, x2, dist [..., P, R]; p) -> x1's
/// gradient [..., P, M] (x2's is this with the operands swapped and grad
/// and dist transposed), by torch's per-pair formulas: 0 for p = 0;
/// sign(d) g for p = 1; d g / dist for p = 2; sign(d) |d|^(p-1) g /
/// dist^(p-1) below 2 (0 where d = 0 for p < 1); d |d|^(p-2) g /
/// dist^(p-1) above; sign(d) g where |d| is the distance for p = inf; 0
/// where the distance is 0. Summed over x2's rows.
fn cdist_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let p = norm_order(a)?;
    let (grad, x1, x2, dist) = (x[0], x[1], x[2], x[3]);
    let d = pair_differences(e, x1, x2)?;
    let dd = e.dims(d);
    let pair = dd[..dd.len() - 1].to_vec();
    for (what, v) in [("grad", grad), ("dist", dist)] {
        if e.dims(v) != pair {
            return Err(Error::invalid(format!(
                "{what} {} must have the distances' shape {pair:?}",
                e.ty(v)
            )));
        }
    }
    let last = dd.len() - 1;
    let mut col = pair.clone();
    col.push(1);
    let g = e.reshape(grad, &col)?;
    let g = e.broadcast_to(g, &dd)?;
    let dist = e.reshape(dist, &col)?;
    let dist = e.broadcast_to(dist, &dd)?;
    let zero = e.full_like(d, 0.0)?;
    let sign = e.unary(UnaryOp::Sign, d)?;
    let ab = e.unary(UnaryOp::Abs, d)?;
    let per_pair = if p == 0.0 {
        zero
    } else if p == 1.0 {
        e.mul(sign, g)?
    } else if p == f64::INFINITY {
        let at = e.compare(CompareOp::Eq, ab, dist)?;
        let sg = e.mul(sign, g)?;
        e.select(at, sg, zero)?
    } else {
        let r = if p == 2.0 {
            let dg = e.mul(d, g)?;
            e.div(dg, dist)?
        } else {
            let lead = if p < 2.0 {
                let pw = e.binary_scalar(BinaryOp::Pow, ab, p - 1.0)?;
                e.mul(sign, pw)?
            } else {
                let pw = e.binary_scalar(BinaryOp::Pow, ab, p - 2.0)?;
                e.mul(d, pw)?
            };
            let lg = e.mul(lead, g)?;
            let den = e.binary_scalar(BinaryOp::Pow, dist, p - 1.0)?;
            e.div(lg, den)?
        };
        let mut none = e.compare(CompareOp::Eq, dist, zero)?;
        if p < 1.0 {
            let flat = e.compare(CompareOp::Eq, d, zero)?;
            none = e.binary(BinaryOp::Or, none, flat)?;
        }
        e.select(none, zero, r)?
    };
    // Sum over x2's rows (axis -2 of [..., P, R, M]), then to x1's batch
    // shape where x1's batch dims were broadcast.
    let s = e.reduce(ReduceOp::Sum, per_pair, &[last - 1], false)?;
    Ok(vec![super::support::sum_to(e, s, &e.dims(x1))?])
}

/// The flat positions in an n x n matrix of its upper triangle, diagonal
/// excluded, row by row (pdist's order).
fn upper_positions(e: &mut Emitter, n: u64) -> Result<ValueId> {
    let n = n as i64;
    let lin: Vec<i64> = (0..n)
        .flat_map(|i| (i + 1..n).map(move |j| i * n + j))
        .collect();
    super::support::i64_vector(e, &lin)
}

fn check_pdist_input(e: &Emitter, x: ValueId) -> Result<u64> {
    let t = e.ty(x);
    if t.rank() != 2 {
        return Err(Error::invalid(format!(
            "pdist only supports 2D tensors, got: {}D",
            t.rank()
        )));
    }
    Ok(t.dims[0])
}

/// pdist(x [N, M]; p=2) -> [N (N - 1) / 2]: cdist(x, x)'s upper triangle
/// (diagonal excluded) row by row, computed directly as torch's pdist is.
fn pdist(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let n = check_pdist_input(e, x[0])?;
    let d = cdist(e, &[x[0], x[0]], a)?[0];
    let flat = e.reshape(d, &[n * n])?;
    let at = upper_positions(e, n)?;
    Ok(vec![e.op(Prim::Take { axis: 0 }, &[flat, at])?])
}

/// pdist_backward(grad [K], x [N, M], pdist [K]; p) -> x's gradient: the
/// triangle's gradient G and distances D placed in n x n matrices; x is
/// both of cdist's operands, so its gradient is cdist's first operand's
/// for G + Gᵀ (with D + Dᵀ).
fn pdist_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (grad, v, dist) = (x[0], x[1], x[2]);
    let n = check_pdist_input(e, v)?;
    let k = n * n.saturating_sub(1) / 2;
    for (what, t) in [("grad", grad), ("pdist", dist)] {
        if e.dims(t) != [k] {
            return Err(Error::invalid(format!(
                "{what} {} must have the distances' shape [{k}]",
                e.ty(t)
            )));
        }
    }
    let dt = e.dtype(v);
    let at = upper_positions(e, n)?;
    let square = |e: &mut Emitter, t: ValueId| -> Result<ValueId> {
        let t = e.convert(t, dt)?;
        let zeros = e.full(dt, &[n * n], 0.0)?;
        let placed = e.op(
            Prim::Scatter {
                axis: 0,
                combiner: ScatterCombiner::Replace,
            },
            &[zeros, at, t],
        )?;
        let m = e.reshape(placed, &[n, n])?;
        let mt = e.transpose(m, &[1, 0])?;
        e.add(m, mt)
    };
    let g = square(e, grad)?;
    let d = square(e, dist)?;
    cdist_backward(e, &[g, v, v, d], a)
}

pub(super) const OPS: &[OpDef] = &[
    def!("matmul", Arity::Exactly(2), matmul),
    def!("mm", Arity::Exactly(2), mm),
    def!("bmm", Arity::Exactly(2), bmm),
    def!("addmm", Arity::Exactly(3), addmm),
    def!("baddbmm", Arity::Exactly(3), baddbmm),
    def!("linear", Arity::Between(2, 3), linear),
    def!("dot", Arity::Exactly(2), dot),
    def!("outer", Arity::Exactly(2), outer),
    def!("ragged_dot", Arity::Exactly(3), ragged_dot),
    def!(
        "ragged_dot_rhs_grad",
        Arity::Exactly(3),
        ragged_dot_rhs_grad
    ),
    def!("trace", Arity::Exactly(1), trace),
    def!("linalg_cross", Arity::Exactly(2), linalg_cross),
    def!("cdist", Arity::Exactly(2), cdist),
    def!("cdist_backward", Arity::Exactly(4), cdist_backward),
    def!("pdist", Arity::Exactly(1), pdist),
    def!("pdist_backward", Arity::Exactly(3), pdist_backward),
];
