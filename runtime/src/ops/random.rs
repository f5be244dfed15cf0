//! Random ops: uniform, normal, bernoulli, dropout, randperm. Every draw comes from
//! the counter-based `Rng` primitive at a (seed, offset) the frontend
//! supplies, so a seed gives the same numbers in every mode and on every
//! platform; element i of a draw uses counter offset + i, so the frontend
//! advances the offset by the element count after each call. Draws are
//! f32 for f16/bf16/f32 results and f64 for f64 (uniform and normal with
//! default parameters draw in the result dtype itself).
//!
//! Seed and offset are attributes, or (with the `seed` attribute left out)
//! two trailing i64 scalar inputs, which keeps one compiled graph for every
//! call (see `support`).

use super::attrs::Attrs;
use super::emit::Emitter;
use super::support::{compute_dtype, need_float, rng_draw, rng_keys, sizes_attr};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, Prim, RngDistribution, ValueId};

fn float_dtype_attr(a: &Attrs) -> Result<DType> {
    let dt = a.dtype_opt("dtype")?.unwrap_or(DType::F32);
    if !dt.is_float() {
        return Err(Error::invalid(format!(
            "dtype must be a floating-point type, got {dt}"
        )));
    }
    Ok(dt)
}

/// Factories take no tensor inputs besides the optional (seed, offset).
fn factory_keys(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<(ValueId, ValueId)> {
    if x.len() == 1 {
        return Err(Error::invalid(
            "takes no inputs, or seed and offset as two scalar inputs",
        ));
    }
    rng_keys(e, a, x)
}

/// uniform(size, low=0, high=1, dtype=f32, seed, offset): values in
/// [low, high). Scaled draws are computed in f32 (f64 for f64) and rounded
/// once; a value that rounds up to `high` becomes `low`, as torch's CUDA
/// kernel does, so the range stays half-open.
fn uniform(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dims = sizes_attr(a, "size")?;
    let dt = float_dtype_attr(a)?;
    let low = a.float_or("low", 0.0)?;
    let high = a.float_or("high", 1.0)?;
    if !(low.is_finite() && high.is_finite()) || low > high {
        return Err(Error::invalid(format!(
            "expects a finite range low <= high, got low={low} high={high}"
        )));
    }
    let keys = factory_keys(e, x, a)?;
    if low == 0.0 && high == 1.0 {
        return Ok(vec![rng_draw(
            e,
            keys,
            RngDistribution::Uniform,
            dt,
            &dims,
        )?]);
    }
    let cd = compute_dtype(dt)?;
    let u = rng_draw(e, keys, RngDistribution::Uniform, cd, &dims)?;
    let range = e.scalar(cd, high - low)?;
    let lo = e.scalar(cd, low)?;
    let v = e.mul(u, range)?;
    let v = e.add(v, lo)?;
    let r = e.convert(v, dt)?;
    let hi = e.scalar(dt, high)?;
    let lo = e.scalar(dt, low)?;
    let at_high = e.compare(CompareOp::Ge, r, hi)?;
    Ok(vec![e.select(at_high, lo, r)?])
}

/// normal(size, mean=0, std=1, dtype=f32, seed, offset).
fn normal(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dims = sizes_attr(a, "size")?;
    let dt = float_dtype_attr(a)?;
    let mean = a.float_or("mean", 0.0)?;
    let std = a.float_or("std", 1.0)?;
    if std.is_nan() || std < 0.0 {
        return Err(Error::invalid(format!("std must be >= 0, got {std}")));
    }
    let keys = factory_keys(e, x, a)?;
    if mean == 0.0 && std == 1.0 {
        return Ok(vec![rng_draw(e, keys, RngDistribution::Normal, dt, &dims)?]);
    }
    let cd = compute_dtype(dt)?;
    let z = rng_draw(e, keys, RngDistribution::Normal, cd, &dims)?;
    let z = e.binary_scalar(BinaryOp::Mul, z, std)?;
    let z = e.binary_scalar(BinaryOp::Add, z, mean)?;
    Ok(vec![e.convert(z, dt)?])
}

/// bernoulli(p, seed, offset): 1 where a uniform draw is below p, else 0,
/// in p's dtype. With a `p` attribute the input only gives the shape and
/// dtype (torch.bernoulli(x, p)).
fn bernoulli(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let input = x[0];
    let dt = need_float(e, input, "input")?;
    let cd = compute_dtype(dt)?;
    let dims = e.dims(input);
    let p = match a.float_opt("p")? {
        Some(p) => {
            if !(0.0..=1.0).contains(&p) {
                return Err(Error::invalid(format!("p must be in [0, 1], got {p}")));
            }
            e.scalar(cd, p)?
        }
        None => e.convert(input, cd)?,
    };
    if x.len() == 2 {
        return Err(Error::invalid(
            "takes p, or p with seed and offset as two scalar inputs",
        ));
    }
    let keys = rng_keys(e, a, &x[1..])?;
    let u = rng_draw(e, keys, RngDistribution::Uniform, cd, &dims)?;
    let hit = e.compare(CompareOp::Lt, u, p)?;
    Ok(vec![e.convert(hit, dt)?])
}

/// randperm(n, dtype = i64, seed, offset): a uniformly random permutation
/// of 0..n, as the order that sorts 2n uniform f32 draws read as n keys of
/// 48 bits (a stable sort by the second half, then by the first): two
/// positions tie, and keep their index order, with probability 2^-48 (f32
/// keys alone, 2^-24, would tie about once among 6000 positions). The
/// frontend advances the offset by 2n.
fn randperm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let n = a.int("n")?;
    let n =
        u64::try_from(n).map_err(|_| Error::invalid(format!("n must be non-negative, got {n}")))?;
    let dt = a.dtype_opt("dtype")?.unwrap_or(DType::I64);
    // The largest index each dtype holds exactly.
    let top: u64 = match dt {
        DType::Bool => 1,
        DType::U8 => 255,
        DType::I8 => 127,
        DType::I32 => (1 << 31) - 1,
        DType::BF16 => 1 << 8,
        DType::F16 => 1 << 11,
        DType::F32 => 1 << 24,
        DType::F64 => 1 << 53,
        _ => u64::MAX,
    };
    if dt == DType::Bool || n.saturating_sub(1) > top {
        return Err(Error::invalid(format!("n = {n} does not fit dtype {dt}")));
    }
    let keys = factory_keys(e, x, a)?;
    let u = rng_draw(e, keys, RngDistribution::Uniform, DType::F32, &[2, n])?;
    let hi = e.op(
        Prim::Slice {
            start: vec![0, 0],
            limit: vec![1, n],
            stride: vec![1, 1],
        },
        &[u],
    )?;
    let lo = e.op(
        Prim::Slice {
            start: vec![1, 0],
            limit: vec![2, n],
            stride: vec![1, 1],
        },
        &[u],
    )?;
    let hi = e.reshape(hi, &[n])?;
    let lo = e.reshape(lo, &[n])?;
    let sort = Prim::Sort {
        dimension: 0,
        descending: false,
        stable: true,
    };
    let by_lo = e.g.node(sort.clone(), &[lo])?[1];
    let hi = e.op(Prim::Take { axis: 0 }, &[hi, by_lo])?;
    let by_hi = e.g.node(sort, &[hi])?[1];
    let perm = e.op(Prim::Take { axis: 0 }, &[by_lo, by_hi])?;
    Ok(vec![e.convert(perm, dt)?])
}

/// native_dropout(x, p=0.5, train=true, seed, offset) -> (y, mask): an
/// element is kept where a uniform draw is below 1 - p, and kept elements
/// are scaled by 1 / (1 - p) (computed in f32 for half inputs). p = 0 or
/// train = false is the identity with an all-true mask; p = 1 gives zeros.
fn dropout(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let input = x[0];
    let dt = need_float(e, input, "input")?;
    let p = a.float_or("p", 0.5)?;
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::invalid(format!(
            "dropout probability has to be between 0 and 1, but got {p}"
        )));
    }
    if x.len() == 2 {
        return Err(Error::invalid(
            "takes x, or x with seed and offset as two scalar inputs",
        ));
    }
    let dims = e.dims(input);
    if p == 0.0 || !a.bool_or("train", true)? {
        let y = super::pointwise_copy(e, input)?[0];
        let mask = e.full(DType::Bool, &dims, 1.0)?;
        return Ok(vec![y, mask]);
    }
    if p == 1.0 {
        let y = e.full(dt, &dims, 0.0)?;
        let mask = e.full(DType::Bool, &dims, 0.0)?;
        return Ok(vec![y, mask]);
    }
    let cd = compute_dtype(dt)?;
    let keys = rng_keys(e, a, &x[1..])?;
    let keep = keep_mask(e, keys, cd, &dims, p)?;
    let v = e.convert(input, cd)?;
    let m = e.convert(keep, cd)?;
    let y = e.mul(v, m)?;
    let y = e.binary_scalar(BinaryOp::Mul, y, 1.0 / (1.0 - p))?;
    Ok(vec![e.convert(y, dt)?, keep])
}

/// The dropout keep mask: uniform draws (in `cd`) below 1 - p.
pub(super) fn keep_mask(
    e: &mut Emitter,
    keys: (ValueId, ValueId),
    cd: DType,
    dims: &[u64],
    p: f64,
) -> Result<ValueId> {
    let u = rng_draw(e, keys, RngDistribution::Uniform, cd, dims)?;
    let keep_p = e.scalar(cd, 1.0 - p)?;
    e.compare(CompareOp::Lt, u, keep_p)
}

pub(super) const OPS: &[OpDef] = &[
    def!("uniform", Arity::Between(0, 2), uniform),
    def!("normal", Arity::Between(0, 2), normal),
    def!("bernoulli", Arity::Between(1, 3), bernoulli),
    def!("dropout", Arity::Between(1, 3), dropout),
    def!("randperm", Arity::Between(0, 2), randperm),
];
