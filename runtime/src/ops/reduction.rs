//! Reductions: sum, mean, prod, amax/amin, max/min with indices,
//! argmax/argmin, var/std, logsumexp, any/all, cumulative ops (cumsum,
//! cumprod, cummax/cummin with indices, logcumsumexp).

use super::attrs::Attrs;
use super::emit::{wrap_dim, Emitter};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, Prim, ReduceOp, UnaryOp, ValueId};

/// torch.sum's result dtype: ints and bool go to i64 unless `dtype` says.
fn sum_dtype(e: &Emitter, x: ValueId, a: &Attrs) -> Result<DType> {
    Ok(match a.dtype_opt("dtype")? {
        Some(d) => d,
        None if !e.dtype(x).is_float() => DType::I64,
        None => e.dtype(x),
    })
}

fn dims_keep(e: &Emitter, x: ValueId, a: &Attrs) -> Result<(Vec<usize>, bool)> {
    let dims = a.ints_opt("dim")?;
    Ok((
        e.reduce_dims(x, dims.as_deref())?,
        a.bool_or("keepdim", false)?,
    ))
}

fn sum(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dt = sum_dtype(e, x[0], a)?;
    let v = e.convert(x[0], dt)?;
    let (dims, keep) = dims_keep(e, v, a)?;
    Ok(vec![e.reduce(ReduceOp::Sum, v, &dims, keep)?])
}

/// nansum: sum with NaN counted as 0 (integers: sum).
fn nansum(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dt = sum_dtype(e, x[0], a)?;
    let v = e.convert(x[0], dt)?;
    let v = if dt.is_float() {
        let nan = e.compare(crate::ir::CompareOp::Ne, v, v)?;
        let zero = e.full_like(v, 0.0)?;
        e.select(nan, zero, v)?
    } else {
        v
    };
    let (dims, keep) = dims_keep(e, v, a)?;
    Ok(vec![e.reduce(ReduceOp::Sum, v, &dims, keep)?])
}

fn prod(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dt = sum_dtype(e, x[0], a)?;
    let v = e.convert(x[0], dt)?;
    let (dims, keep) = dims_keep(e, v, a)?;
    Ok(vec![e.reduce(ReduceOp::Prod, v, &dims, keep)?])
}

/// mean = sum / count, in the float dtype (ints are an error, as torch).
pub(super) fn mean_of(e: &mut Emitter, x: ValueId, dims: &[usize], keep: bool) -> Result<ValueId> {
    let dt = e.dtype(x);
    let s = e.reduce(ReduceOp::Sum, x, dims, keep)?;
    let n = e.count(x, dims, dt)?;
    e.div(s, n)
}

fn mean(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let v = match a.dtype_opt("dtype")? {
        Some(d) => e.convert(x[0], d)?,
        None => x[0],
    };
    if !e.dtype(v).is_float() {
        return Err(Error::invalid(format!(
            "needs a floating-point input (or a float dtype attribute), got {}",
            e.dtype(v)
        )));
    }
    let (dims, keep) = dims_keep(e, v, a)?;
    Ok(vec![mean_of(e, v, &dims, keep)?])
}

fn extreme(e: &mut Emitter, x: &[ValueId], a: &Attrs, op: ReduceOp) -> Result<Vec<ValueId>> {
    let (dims, keep) = dims_keep(e, x[0], a)?;
    let d = e.dims(x[0]);
    if dims.iter().any(|&i| d[i] == 0) {
        return Err(Error::invalid(
            "cannot reduce an empty dimension (there is no identity)",
        ));
    }
    let op = match (op, e.dtype(x[0])) {
        (ReduceOp::Max, DType::Bool) => ReduceOp::Or,
        (ReduceOp::Min, DType::Bool) => ReduceOp::And,
        (op, _) => op,
    };
    Ok(vec![e.reduce(op, x[0], &dims, keep)?])
}
fn amax(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    extreme(e, x, a, ReduceOp::Max)
}
fn amin(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    extreme(e, x, a, ReduceOp::Min)
}

/// argmax/argmin(dim=None: over the flattened input, keepdim).
fn arg(e: &mut Emitter, x: &[ValueId], a: &Attrs, max: bool) -> Result<Vec<ValueId>> {
    let keep = a.bool_or("keepdim", false)?;
    match a.int_opt("dim")? {
        None => {
            let n = e.ty(x[0]).numel();
            let flat = e.reshape(x[0], &[n])?;
            let r = e.op(Prim::ArgReduce { max, dimension: 0 }, &[flat])?;
            if keep {
                let ones = vec![1; e.rank(x[0])];
                return Ok(vec![e.reshape(r, &ones)?]);
            }
            Ok(vec![r])
        }
        Some(d) => {
            let rank = e.rank(x[0]);
            let v = if rank == 0 {
                e.reshape(x[0], &[1])?
            } else {
                x[0]
            };
            let dim = wrap_dim(d, rank)?;
            let r = e.op(
                Prim::ArgReduce {
                    max,
                    dimension: dim,
                },
                &[v],
            )?;
            if keep && rank > 0 {
                let mut kd = e.dims(x[0]);
                kd[dim] = 1;
                return Ok(vec![e.reshape(r, &kd)?]);
            }
            Ok(vec![r])
        }
    }
}
fn argmax(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    arg(e, x, a, true)
}
fn argmin(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    arg(e, x, a, false)
}

/// max.dim / min.dim: (values, indices) along one dimension.
fn extreme_dim(e: &mut Emitter, x: &[ValueId], a: &Attrs, max: bool) -> Result<Vec<ValueId>> {
    let dim = a.int("dim")?;
    let keep = a.bool_or("keepdim", false)?;
    let attrs = Attrs::new()
        .with("dim", super::Attr::Ints(vec![dim]))
        .with("keepdim", super::Attr::Bool(keep));
    let v = extreme(
        e,
        x,
        &attrs,
        if max { ReduceOp::Max } else { ReduceOp::Min },
    )?[0];
    let i = arg(e, x, a, max)?[0];
    Ok(vec![v, i])
}
fn max_dim(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    extreme_dim(e, x, a, true)
}
fn min_dim(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    extreme_dim(e, x, a, false)
}

/// var/std(dim, correction=1, keepdim): two-pass (mean, then squares).
fn variance(e: &mut Emitter, x: ValueId, a: &Attrs) -> Result<ValueId> {
    if !e.dtype(x).is_float() {
        return Err(Error::invalid("needs a floating-point input"));
    }
    let (dims, keep) = dims_keep(e, x, a)?;
    let correction = a.float_or("correction", 1.0)?;
    let m = mean_of(e, x, &dims, true)?;
    let d = e.sub(x, m)?;
    let sq = e.mul(d, d)?;
    let s = e.reduce(ReduceOp::Sum, sq, &dims, keep)?;
    let n: u64 = dims.iter().map(|&i| e.dims(x)[i]).product();
    let denom = (n as f64 - correction).max(0.0);
    let dn = e.scalar(e.dtype(x), denom)?;
    e.div(s, dn)
}
fn var(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    Ok(vec![variance(e, x[0], a)?])
}
fn std(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let v = variance(e, x[0], a)?;
    Ok(vec![e.unary(UnaryOp::Sqrt, v)?])
}

/// logsumexp(dim, keepdim), stable: max + log(sum(exp(x - max))).
fn logsumexp(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let v = if e.dtype(x[0]).is_float() {
        x[0]
    } else {
        e.convert(x[0], DType::F32)?
    };
    let (dims, keep) = dims_keep(e, v, a)?;
    let m = e.reduce(ReduceOp::Max, v, &dims, true)?;
    // A row of -inf (or inf) must not give nan: use 0 where max is not finite.
    let finite = e.unary(UnaryOp::IsFinite, m)?;
    let zero = e.full_like(m, 0.0)?;
    let m = e.select(finite, m, zero)?;
    let sh = e.sub(v, m)?;
    let ex = e.unary(UnaryOp::Exp, sh)?;
    let s = e.reduce(ReduceOp::Sum, ex, &dims, keep)?;
    let l = e.unary(UnaryOp::Log, s)?;
    let m = if keep {
        m
    } else {
        let kept = e.dims(l);
        e.reshape(m, &kept)?
    };
    Ok(vec![e.add(l, m)?])
}

fn any_all(e: &mut Emitter, x: &[ValueId], a: &Attrs, op: ReduceOp) -> Result<Vec<ValueId>> {
    let b = e.convert(x[0], DType::Bool)?;
    let (dims, keep) = dims_keep(e, b, a)?;
    Ok(vec![e.reduce(op, b, &dims, keep)?])
}
fn any(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    any_all(e, x, a, ReduceOp::Or)
}
fn all(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    any_all(e, x, a, ReduceOp::And)
}

fn cumulative(e: &mut Emitter, x: &[ValueId], a: &Attrs, op: ReduceOp) -> Result<Vec<ValueId>> {
    let dt = if matches!(op, ReduceOp::Sum | ReduceOp::Prod) {
        sum_dtype(e, x[0], a)?
    } else {
        e.dtype(x[0])
    };
    let v = e.convert(x[0], dt)?;
    let rank = e.rank(v);
    let dim = wrap_dim(a.int("dim")?, rank)?;
    if rank == 0 {
        return Ok(vec![v]);
    }
    Ok(vec![e.op(
        Prim::Cumulative {
            op,
            dimension: dim,
            reverse: a.bool_or("reverse", false)?,
        },
        &[v],
    )?])
}
fn cumsum(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    cumulative(e, x, a, ReduceOp::Sum)
}
fn cumprod(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    cumulative(e, x, a, ReduceOp::Prod)
}

/// cummax / cummin(x; dim) -> (values, i64 indices): the running maximum
/// (minimum) along dim and where it was last taken: as torch, an equal
/// value takes over, and NaN propagates, each NaN taking over.
fn cum_extreme(e: &mut Emitter, x: &[ValueId], a: &Attrs, max: bool) -> Result<Vec<ValueId>> {
    let t = e.ty(x[0]);
    let dim = wrap_dim(a.int("dim")?, t.rank())?;
    if t.rank() == 0 {
        return Ok(vec![e.identity(x[0])?, e.full(DType::I64, &[], 0.0)?]);
    }
    // Bools run as u8 (0 and 1), as their running max and min.
    let v = if t.dtype == DType::Bool {
        e.convert(x[0], DType::U8)?
    } else {
        x[0]
    };
    let op = if max { ReduceOp::Max } else { ReduceOp::Min };
    let scan = |op| Prim::Cumulative {
        op,
        dimension: dim,
        reverse: false,
    };
    let run = e.op(scan(op), &[v])?;
    // Position j takes over where x[j] is the running value (the value
    // before it was not beyond x[j]) or NaN; the index at i is the last
    // such j up to i.
    let mut takes = e.compare(CompareOp::Eq, v, run)?;
    if t.dtype.is_float() {
        let nan = e.compare(CompareOp::Ne, v, v)?;
        takes = e.binary(BinaryOp::Or, takes, nan)?;
    }
    let pos = super::support::iota(e, &t.dims, dim)?;
    let none = e.full(DType::I64, &t.dims, -1.0)?;
    let at = e.select(takes, pos, none)?;
    let idx = e.op(scan(ReduceOp::Max), &[at])?;
    Ok(vec![e.convert(run, t.dtype)?, idx])
}
fn cummax(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    cum_extreme(e, x, a, true)
}
fn cummin(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    cum_extreme(e, x, a, false)
}

/// logcumsumexp(x; dim): log of the running sum of exp along dim, as a
/// scan of log-add-exp in log2(n) doubling steps (each position adds the
/// partial result `s` before it), in f64 for f32 and f64 (torch's CPU
/// accumulates f32 in f64) and f32 for bf16/f16, rounded once. Equal
/// infinities stay themselves; NaN propagates.
fn logcumsumexp(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let t = e.ty(x[0]);
    if !t.dtype.is_float() {
        return Err(Error::invalid(format!(
            "needs a floating-point input, got {t}"
        )));
    }
    let dim = wrap_dim(a.int("dim")?, t.rank())?;
    let cd = match t.dtype {
        DType::F32 | DType::F64 => DType::F64,
        _ => DType::F32,
    };
    let mut v = e.convert(x[0], cd)?;
    let n = if t.rank() == 0 { 1 } else { t.dims[dim] };
    let rank = t.rank();
    let ninf = e.scalar(cd, f64::NEG_INFINITY)?;
    let mut s = 1u64;
    while s < n {
        let (mut low, mut high) = (vec![0i64; rank], vec![0i64; rank]);
        low[dim] = s as i64;
        high[dim] = -(s as i64);
        let before = e.op(
            Prim::Pad {
                low,
                high,
                interior: vec![0; rank],
            },
            &[v, ninf],
        )?;
        v = log_add_exp(e, v, before)?;
        s *= 2;
    }
    Ok(vec![e.convert(v, t.dtype)?])
}

/// log(exp(a) + exp(b)) as max + log1p(exp(min - max)); a where both are
/// the same infinity.
fn log_add_exp(e: &mut Emitter, a: ValueId, b: ValueId) -> Result<ValueId> {
    let hi = e.max(a, b)?;
    let lo = e.min(a, b)?;
    let d = e.sub(lo, hi)?;
    let x = e.unary(UnaryOp::Exp, d)?;
    let l = e.unary(UnaryOp::Log1p, x)?;
    let r = e.add(l, hi)?;
    let same = e.compare(CompareOp::Eq, lo, hi)?;
    let fin = e.unary(UnaryOp::IsFinite, lo)?;
    let inf = e.unary(UnaryOp::Not, fin)?;
    let both = e.binary(BinaryOp::And, same, inf)?;
    e.select(both, a, r)
}

/// x / ||x||_p style norms are built by callers; here the p-norm itself.
fn norm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let p = a.float_or("p", 2.0)?;
    let v = if e.dtype(x[0]).is_float() {
        x[0]
    } else {
        e.convert(x[0], DType::F32)?
    };
    let (dims, keep) = dims_keep(e, v, a)?;
    Ok(vec![p_norm(e, v, p, &dims, keep)?])
}

/// (Σ |v|^p)^(1/p) over `dims` in v's dtype; p = inf is the largest |v|.
pub(super) fn p_norm(
    e: &mut Emitter,
    v: ValueId,
    p: f64,
    dims: &[usize],
    keep: bool,
) -> Result<ValueId> {
    let ab = e.unary(UnaryOp::Abs, v)?;
    if p == f64::INFINITY {
        return e.reduce(ReduceOp::Max, ab, dims, keep);
    }
    if p == 2.0 {
        let sq = e.mul(ab, ab)?;
        let s = e.reduce(ReduceOp::Sum, sq, dims, keep)?;
        return e.unary(UnaryOp::Sqrt, s);
    }
    if p == 1.0 {
        return e.reduce(ReduceOp::Sum, ab, dims, keep);
    }
    let pp = e.full_like(ab, p)?;
    let pw = e.binary(BinaryOp::Pow, ab, pp)?;
    let s = e.reduce(ReduceOp::Sum, pw, dims, keep)?;
    let inv = e.full_like(s, 1.0 / p)?;
    e.binary(BinaryOp::Pow, s, inv)
}

pub(super) const OPS: &[OpDef] = &[
    def!("sum", Arity::Exactly(1), sum),
    def!("nansum", Arity::Exactly(1), nansum),
    def!("prod", Arity::Exactly(1), prod),
    def!("mean", Arity::Exactly(1), mean),
    def!("amax", Arity::Exactly(1), amax),
    def!("amin", Arity::Exactly(1), amin),
    def!("argmax", Arity::Exactly(1), argmax),
    def!("argmin", Arity::Exactly(1), argmin),
    def!("max_dim", Arity::Exactly(1), max_dim),
    def!("min_dim", Arity::Exactly(1), min_dim),
    def!("var", Arity::Exactly(1), var),
    def!("std", Arity::Exactly(1), std),
    def!("logsumexp", Arity::Exactly(1), logsumexp),
    def!("any", Arity::Exactly(1), any),
    def!("all", Arity::Exactly(1), all),
    def!("cumsum", Arity::Exactly(1), cumsum),
    def!("cumprod", Arity::Exactly(1), cumprod),
    def!("cummax", Arity::Exactly(1), cummax),
    def!("cummin", Arity::Exactly(1), cummin),
    def!("logcumsumexp", Arity::Exactly(1), logcumsumexp),
    def!("norm", Arity::Exactly(1), norm),
];
