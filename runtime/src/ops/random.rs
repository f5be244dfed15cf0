//! Random ops: uniform, normal, bernoulli, dropout, rrelu's training
//! form, randperm, and the samplers standard_gamma, poisson and binomial. Every draw
//! comes from the counter-based `Rng` primitive at a (seed, offset) the
//! frontend supplies, so a seed gives the same numbers in every mode and on every
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
use super::solve::slice;
use super::special::lgamma_half_up;
use super::support::{compute_dtype, i64_constant, need_float, rng_draw, rng_keys, sizes_attr};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, Prim, RngDistribution, UnaryOp, ValueId};

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
    let (_, by_lo) = e.sort(lo, 0, false)?;
    let hi = e.op(Prim::Take { axis: 0 }, &[hi, by_lo])?;
    let (_, by_hi) = e.sort(hi, 0, false)?;
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

/// rrelu_with_noise(x[, seed, offset]; lower = 1/8, upper = 1/3) -> (y,
/// noise), rrelu in training: each element at most 0 times a slope drawn
/// from U(lower, upper), that slope kept in `noise` (1 for the others) for
/// the backward (grad · noise). In eval torch's rrelu is leaky_relu with
/// the mean slope, which needs no draw and no op of its own.
fn rrelu_with_noise(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dt = need_float(e, x[0], "input")?;
    let lower = a.float_or("lower", 1.0 / 8.0)?;
    let upper = a.float_or("upper", 1.0 / 3.0)?;
    if !(lower.is_finite() && upper.is_finite()) || lower > upper {
        return Err(Error::invalid(format!(
            "Lower bound should be less than or equal to the upper bound, got lower={lower} upper={upper}"
        )));
    }
    if x.len() == 2 {
        return Err(Error::invalid(
            "takes x, or x with seed and offset as two scalar inputs",
        ));
    }
    let cd = compute_dtype(dt)?;
    let dims = e.dims(x[0]);
    let keys = rng_keys(e, a, &x[1..])?;
    let u = rng_draw(e, keys, RngDistribution::Uniform, cd, &dims)?;
    let u = e.binary_scalar(BinaryOp::Mul, u, upper - lower)?;
    let slope = e.binary_scalar(BinaryOp::Add, u, lower)?;
    let v = e.convert(x[0], cd)?;
    let negative = e.compare_scalar(CompareOp::Le, v, 0.0)?;
    let one = e.full(cd, &dims, 1.0)?;
    let noise = e.select(negative, slope, one)?;
    let y = e.mul(v, noise)?;
    Ok(vec![e.convert(y, dt)?, e.convert(noise, dt)?])
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

/// Rounds of Marsaglia and Tsang's rejection per gamma draw: each round
/// accepts with probability above 0.95, so all of them fail with
/// probability below 1e-20 (the candidate d, near the mode, is then
/// returned).
const GAMMA_ROUNDS: u64 = 16;
/// Counters one standard_gamma element uses: a normal and a uniform per
/// round, and one uniform for shapes below 1.
pub(super) const GAMMA_COUNTERS: u64 = 2 * GAMMA_ROUNDS + 1;
/// Uniforms in Knuth's product for rates below 10: the count exceeds 47
/// with probability below 1e-17.
const POISSON_PRODUCTS: u64 = 48;
/// Rounds of Hörmann's PTRS for rates from 10: each accepts with
/// probability above 0.89, so all fail with probability below 1e-22.
const POISSON_ROUNDS: u64 = 24;
/// Counters one poisson element uses (every element draws for both
/// methods, so the count does not depend on the rates).
pub(super) const POISSON_COUNTERS: u64 = POISSON_PRODUCTS + 2 * POISSON_ROUNDS;

/// `rows` draws per element of `dims`, [rows, ..dims], at the keys' offset
/// advanced by `skip` counters.
fn draw_rows(
    e: &mut Emitter,
    keys: (ValueId, ValueId),
    skip: u64,
    distribution: RngDistribution,
    cd: DType,
    rows: u64,
    dims: &[u64],
) -> Result<ValueId> {
    let offset = if skip == 0 {
        keys.1
    } else {
        let s = i64_constant(e, skip as i64)?;
        e.binary(BinaryOp::Add, keys.1, s)?
    };
    let mut d = vec![rows];
    d.extend_from_slice(dims);
    rng_draw(e, (keys.0, offset), distribution, cd, &d)
}

/// Row `k` of a [rows, ..dims] draw, shaped `dims`.
fn draw_row(e: &mut Emitter, v: ValueId, k: u64) -> Result<ValueId> {
    let d = e.dims(v);
    let mut start = vec![0; d.len()];
    start[0] = k;
    let mut limit = d.clone();
    limit[0] = k + 1;
    let r = slice(e, v, &start, &limit)?;
    e.reshape(r, &d[1..])
}

/// A sampler's per-element parameter and keys.
struct Sampler {
    /// The parameter in the compute dtype.
    param: ValueId,
    /// The parameter's (and the result's) dtype.
    dtype: DType,
    dims: Vec<u64>,
    count: u64,
    keys: (ValueId, ValueId),
}

fn sampler_input(e: &mut Emitter, x: &[ValueId], a: &Attrs, name: &str) -> Result<Sampler> {
    let dt = need_float(e, x[0], name)?;
    if x.len() == 2 {
        return Err(Error::invalid(format!(
            "takes {name}, or {name} with seed and offset as two scalar inputs"
        )));
    }
    let keys = rng_keys(e, a, &x[1..])?;
    let dims = e.dims(x[0]);
    let n = dims.iter().product();
    let param = e.convert(x[0], compute_dtype(dt)?)?;
    Ok(Sampler {
        param,
        dtype: dt,
        dims,
        count: n,
        keys,
    })
}

/// The smallest positive normal number of `dt`.
fn tiny(dt: DType) -> f64 {
    match dt {
        DType::F16 => 6.103_515_625e-5,
        DType::F64 => f64::MIN_POSITIVE,
        _ => f64::from(f32::MIN_POSITIVE),
    }
}

/// standard_gamma(alpha, seed, offset): Gamma(alpha, 1) draws
/// (torch._standard_gamma, under torch.distributions' Gamma, Chi2,
/// StudentT, Beta and Dirichlet), by Marsaglia and Tsang's method ("A
/// simple method for generating gamma variables", 2000): with d = α - 1/3
/// and c = 1 / sqrt(9d), a normal x and v = (1 + c x)³ give d v where
/// v > 0 and ln u < x²/2 + d - d v + d ln v; below 1, Gamma(α + 1) times
/// u^(1/α). The first accepted of GAMMA_ROUNDS candidates is taken, so a
/// draw has a fixed cost; each element uses GAMMA_COUNTERS counters (the
/// frontend advances the offset by that times the element count).
/// Results below the dtype's smallest normal number, and those of a
/// shape that is not positive, are that number, as torch's CPU kernel
/// returns them.
fn standard_gamma(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let Sampler {
        param: alpha,
        dtype: dt,
        dims,
        count: n,
        keys,
    } = sampler_input(e, x, a, "alpha")?;
    let cd = e.dtype(alpha);
    let z = draw_rows(e, keys, 0, RngDistribution::Normal, cd, GAMMA_ROUNDS, &dims)?;
    let u = draw_rows(
        e,
        keys,
        GAMMA_ROUNDS * n,
        RngDistribution::Uniform,
        cd,
        GAMMA_COUNTERS - GAMMA_ROUNDS,
        &dims,
    )?;
    let boost = e.compare_scalar(CompareOp::Lt, alpha, 1.0)?;
    let raised = e.binary_scalar(BinaryOp::Add, alpha, 1.0)?;
    let a1 = e.select(boost, raised, alpha)?;
    let d = e.binary_scalar(BinaryOp::Sub, a1, 1.0 / 3.0)?;
    let d9 = e.binary_scalar(BinaryOp::Mul, d, 9.0)?;
    let c = e.unary(UnaryOp::Rsqrt, d9)?;
    let one = e.full_like(alpha, 1.0)?;
    // The first accepted candidate: rounds applied last to first.
    let mut out = d;
    for k in (0..GAMMA_ROUNDS).rev() {
        let zk = draw_row(e, z, k)?;
        let uk = draw_row(e, u, k)?;
        let t = e.mul(c, zk)?;
        let t = e.binary_scalar(BinaryOp::Add, t, 1.0)?;
        let v = e.mul(t, t)?;
        let v = e.mul(v, t)?;
        let positive = e.compare_scalar(CompareOp::Gt, v, 0.0)?;
        let safe = e.select(positive, v, one)?;
        let lv = e.unary(UnaryOp::Log, safe)?;
        let zz = e.mul(zk, zk)?;
        let half = e.binary_scalar(BinaryOp::Mul, zz, 0.5)?;
        let dv = e.mul(d, v)?;
        let dlv = e.mul(d, lv)?;
        let rhs = e.add(half, d)?;
        let rhs = e.sub(rhs, dv)?;
        let rhs = e.add(rhs, dlv)?;
        let lu = e.unary(UnaryOp::Log, uk)?;
        let below = e.compare(CompareOp::Lt, lu, rhs)?;
        let accept = e.binary(BinaryOp::And, positive, below)?;
        out = e.select(accept, dv, out)?;
    }
    // Below 1: times (1 - u)^(1/α), u in [0, 1).
    let ub = draw_row(e, u, GAMMA_ROUNDS)?;
    let w = e.sub(one, ub)?;
    let lw = e.unary(UnaryOp::Log, w)?;
    let p = e.div(lw, alpha)?;
    let p = e.unary(UnaryOp::Exp, p)?;
    let boosted = e.mul(out, p)?;
    let out = e.select(boost, boosted, out)?;
    let out = e.convert(out, dt)?;
    // Not at least the smallest normal (NaN included): that number.
    let floor = e.full_like(out, tiny(dt))?;
    let enough = e.compare(CompareOp::Ge, out, floor)?;
    Ok(vec![e.select(enough, out, floor)?])
}

/// One candidate of Hörmann's transformed rejection (PTRS for Poisson,
/// BTRS for binomial) from rows `row` and `row + 1` of the uniforms `u`:
/// U = u - 1/2, us = 1/2 - |U|, k = ⌊(2a / us + b) U + shift⌋; the quick
/// acceptance us ≥ 0.07 and V ≤ v_r; and ln(V α / (a / us² + b)), which the
/// full test holds against the method's bound.
struct Candidate {
    k: ValueId,
    us: ValueId,
    v: ValueId,
    quick: ValueId,
    log_ratio: ValueId,
}

/// The per-element constants of a transformed rejection.
struct Transformed {
    a: ValueId,
    two_a: ValueId,
    b: ValueId,
    shift: ValueId,
    vr: ValueId,
    log_alpha: ValueId,
}

fn candidate(e: &mut Emitter, u: ValueId, row: u64, t: &Transformed) -> Result<Candidate> {
    let u1 = draw_row(e, u, row)?;
    let v = draw_row(e, u, row + 1)?;
    let uu = e.binary_scalar(BinaryOp::Sub, u1, 0.5)?;
    let au = e.unary(UnaryOp::Abs, uu)?;
    let us = e.full_like(t.a, 0.5)?;
    let us = e.sub(us, au)?;
    let k = e.div(t.two_a, us)?;
    let k = e.add(k, t.b)?;
    let k = e.mul(k, uu)?;
    let k = e.add(k, t.shift)?;
    let k = e.unary(UnaryOp::Floor, k)?;
    let wide = e.compare_scalar(CompareOp::Ge, us, 0.07)?;
    let low_v = e.compare(CompareOp::Le, v, t.vr)?;
    let quick = e.binary(BinaryOp::And, wide, low_v)?;
    let lv = e.unary(UnaryOp::Log, v)?;
    let us2 = e.mul(us, us)?;
    let h = e.div(t.a, us2)?;
    let h = e.add(h, t.b)?;
    let lh = e.unary(UnaryOp::Log, h)?;
    let log_ratio = e.add(lv, t.log_alpha)?;
    let log_ratio = e.sub(log_ratio, lh)?;
    Ok(Candidate {
        k,
        us,
        v,
        quick,
        log_ratio,
    })
}

/// poisson(rate, seed, offset): Poisson(rate) counts in rate's dtype
/// (torch.poisson). Below 10, Knuth's count of the uniforms' prefix
/// products above e^-rate (POISSON_PRODUCTS of them); from 10, Hörmann's
/// transformed rejection with squeeze, PTRS ("The transformed rejection
/// method for generating Poisson random variables", 1993), the first
/// accepted of POISSON_ROUNDS candidates. Each element uses
/// POISSON_COUNTERS counters. A negative rate is the frontend's check.
fn poisson(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let Sampler {
        param: lam,
        dtype: dt,
        dims,
        keys,
        ..
    } = sampler_input(e, x, a, "rate")?;
    let u = draw_rows(
        e,
        keys,
        0,
        RngDistribution::Uniform,
        e.dtype(lam),
        POISSON_COUNTERS,
        &dims,
    )?;
    let neg = e.unary(UnaryOp::Neg, lam)?;
    let mut sum = e.full_like(lam, 0.0)?;
    let mut count = e.full_like(lam, 0.0)?;
    for i in 0..POISSON_PRODUCTS {
        let ui = draw_row(e, u, i)?;
        let l = e.unary(UnaryOp::Log, ui)?;
        sum = e.add(sum, l)?;
        let above = e.compare(CompareOp::Gt, sum, neg)?;
        let above = e.convert(above, e.dtype(lam))?;
        count = e.add(count, above)?;
    }
    // PTRS's constants, from the rate.
    let slam = e.unary(UnaryOp::Sqrt, lam)?;
    let loglam = e.unary(UnaryOp::Log, lam)?;
    let b = e.binary_scalar(BinaryOp::Mul, slam, 2.53)?;
    let b = e.binary_scalar(BinaryOp::Add, b, 0.931)?;
    let aa = e.binary_scalar(BinaryOp::Mul, b, 0.02483)?;
    let aa = e.binary_scalar(BinaryOp::Sub, aa, 0.059)?;
    let b34 = e.binary_scalar(BinaryOp::Sub, b, 3.4)?;
    let inv_alpha = e.full_like(lam, 1.1328)?;
    let inv_alpha = e.div(inv_alpha, b34)?;
    let inv_alpha = e.binary_scalar(BinaryOp::Add, inv_alpha, 1.1239)?;
    let log_inv_alpha = e.unary(UnaryOp::Log, inv_alpha)?;
    let b2 = e.binary_scalar(BinaryOp::Sub, b, 2.0)?;
    let vr = e.full_like(lam, 3.6224)?;
    let vr = e.div(vr, b2)?;
    let vr = e.binary_scalar(BinaryOp::Sub, vr, 0.9277)?;
    let vr = e.unary(UnaryOp::Neg, vr)?;
    let zero = e.full_like(lam, 0.0)?;
    let lam43 = e.binary_scalar(BinaryOp::Add, lam, 0.43)?;
    let rounded = e.binary_scalar(BinaryOp::Add, lam, 0.5)?;
    let mut out = e.unary(UnaryOp::Floor, rounded)?;
    let two_a = e.binary_scalar(BinaryOp::Mul, aa, 2.0)?;
    let t = Transformed {
        a: aa,
        two_a,
        b,
        shift: lam43,
        vr,
        log_alpha: log_inv_alpha,
    };
    for r in (0..POISSON_ROUNDS).rev() {
        let Candidate {
            k,
            us,
            v,
            quick,
            log_ratio,
        } = candidate(e, u, POISSON_PRODUCTS + 2 * r, &t)?;
        let negative = e.compare_scalar(CompareOp::Lt, k, 0.0)?;
        let narrow = e.compare_scalar(CompareOp::Lt, us, 0.013)?;
        let high_v = e.compare(CompareOp::Gt, v, us)?;
        let squeeze = e.binary(BinaryOp::And, narrow, high_v)?;
        let reject = e.binary(BinaryOp::Or, negative, squeeze)?;
        // ln V + ln(1/α) - ln(a / us² + b) <= -λ + k ln λ - ln Γ(k + 1)
        let k0 = e.max(k, zero)?;
        let k1 = e.binary_scalar(BinaryOp::Add, k0, 1.0)?;
        let lg = lgamma_half_up(e, k1, e.dtype(lam))?;
        let kl = e.mul(k, loglam)?;
        let rhs = e.add(neg, kl)?;
        let rhs = e.sub(rhs, lg)?;
        let full = e.compare(CompareOp::Le, log_ratio, rhs)?;
        let keep = e.unary(UnaryOp::Not, reject)?;
        let full = e.binary(BinaryOp::And, keep, full)?;
        let accept = e.binary(BinaryOp::Or, quick, full)?;
        out = e.select(accept, k, out)?;
    }
    let small = e.compare_scalar(CompareOp::Lt, lam, 10.0)?;
    let out = e.select(small, count, out)?;
    Ok(vec![e.convert(out, dt)?])
}

/// Geometric waits in binomial's inversion, used where count·p is below
/// 10: the count exceeds 47 with probability below 1e-17, as for Poisson.
const BINOMIAL_WAITS: u64 = 48;
/// Rounds of Hörmann's BTRS, where count·p is at least 10: each accepts
/// with probability above 0.85 (a candidate outside [0, count] included),
/// so all fail with probability below 1e-19.
const BINOMIAL_ROUNDS: u64 = 24;
/// Counters one binomial element uses (each draws for both methods).
pub(super) const BINOMIAL_COUNTERS: u64 = BINOMIAL_WAITS + 2 * BINOMIAL_ROUNDS;

/// ln k! less Stirling's form, (k + 1/2) ln(k + 1) - (k + 1) + ln √(2π),
/// for a count k: exact at 0 and 1, where the series is not, else the
/// series in 1/(k+1) to its fourth term (below 1e-7 off from k = 2).
fn stirling_tail(e: &mut Emitter, k: ValueId) -> Result<ValueId> {
    let half_ln_2pi = 0.5 * (2.0 * std::f64::consts::PI).ln();
    let exact = |j: u32| {
        let ln_fact: f64 = (1..=j).map(|i| f64::from(i).ln()).sum();
        let x = f64::from(j) + 1.0;
        ln_fact - (x - 0.5) * x.ln() + x - half_ln_2pi
    };
    let x = e.binary_scalar(BinaryOp::Add, k, 1.0)?;
    let x2 = e.mul(x, x)?;
    let inv2 = e.full_like(x2, 1.0)?;
    let inv2 = e.div(inv2, x2)?;
    // 1/12 - 1/(360 x²) + 1/(1260 x⁴) - 1/(1680 x⁶), over x.
    let mut t = e.binary_scalar(BinaryOp::Mul, inv2, -1.0 / 1680.0)?;
    t = e.binary_scalar(BinaryOp::Add, t, 1.0 / 1260.0)?;
    t = e.mul(t, inv2)?;
    t = e.binary_scalar(BinaryOp::Sub, t, 1.0 / 360.0)?;
    t = e.mul(t, inv2)?;
    t = e.binary_scalar(BinaryOp::Add, t, 1.0 / 12.0)?;
    let mut t = e.div(t, x)?;
    for j in [1, 0] {
        let at = e.compare_scalar(CompareOp::Eq, k, f64::from(j))?;
        let v = e.full_like(k, exact(j))?;
        t = e.select(at, v, t)?;
    }
    Ok(t)
}

/// binomial(count, prob, seed, offset): Binomial(count, prob) draws in
/// count's dtype and shape (prob broadcast to it; torch.binomial, under
/// torch.distributions' Binomial), by torch's choice of method: on the
/// smaller of prob and 1 - prob (p; the count of the other outcome is
/// count less the draw), where count·p is below 10 the inversion that
/// counts geometric waits, ⌈ln U / ln(1 - p)⌉, until they pass count
/// (BINOMIAL_WAITS of them); from 10, Hörmann's transformed rejection,
/// BTRS ("The generation of binomial random variates", 1993), the first
/// accepted of BINOMIAL_ROUNDS candidates, whose acceptance bound is
/// written with ln(1 + x) around the mode so that its terms do not cancel
/// in f32. A count or prob not above 0 gives 0, prob from 1 gives count,
/// NaN gives NaN. Each element uses BINOMIAL_COUNTERS counters.
fn binomial(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    if x.len() == 3 {
        return Err(Error::invalid(
            "takes count and prob, or those with seed and offset as two scalar inputs",
        ));
    }
    let dt = need_float(e, x[0], "count")?;
    let dp = need_float(e, x[1], "prob")?;
    if dt != dp {
        return Err(Error::invalid(format!(
            "count and prob must have the same dtype, got {dt} and {dp}"
        )));
    }
    let keys = rng_keys(e, a, &x[2..])?;
    let dims = e.dims(x[0]);
    let prob = e.broadcast_to(x[1], &dims).map_err(|_| {
        Error::invalid(format!(
            "prob of shape {:?} does not broadcast to count's shape {dims:?}",
            e.dims(x[1])
        ))
    })?;
    let cd = compute_dtype(dt)?;
    let n = e.convert(x[0], cd)?;
    let prob = e.convert(prob, cd)?;
    let u = draw_rows(
        e,
        keys,
        0,
        RngDistribution::Uniform,
        cd,
        BINOMIAL_COUNTERS,
        &dims,
    )?;
    let flip = e.compare_scalar(CompareOp::Gt, prob, 0.5)?;
    let one = e.full_like(prob, 1.0)?;
    let other = e.sub(one, prob)?;
    let p = e.select(flip, other, prob)?;
    let q = e.sub(one, p)?;
    let zero = e.full_like(p, 0.0)?;

    // Inversion: how many geometric waits' running sums stay within n.
    let neg_p = e.unary(UnaryOp::Neg, p)?;
    let log_q = e.unary(UnaryOp::Log1p, neg_p)?;
    let mut sum = zero;
    let mut waited = zero;
    for i in 0..BINOMIAL_WAITS {
        let ui = draw_row(e, u, i)?;
        let lu = e.unary(UnaryOp::Log, ui)?;
        let g = e.div(lu, log_q)?;
        let g = e.unary(UnaryOp::Ceil, g)?;
        sum = e.add(sum, g)?;
        let within = e.compare(CompareOp::Le, sum, n)?;
        let within = e.convert(within, cd)?;
        waited = e.add(waited, within)?;
    }

    // BTRS's constants.
    let np = e.mul(n, p)?;
    let var = e.mul(np, q)?;
    let sd = e.unary(UnaryOp::Sqrt, var)?;
    let b = e.binary_scalar(BinaryOp::Mul, sd, 2.53)?;
    let b = e.binary_scalar(BinaryOp::Add, b, 1.15)?;
    let aa = e.binary_scalar(BinaryOp::Mul, b, 0.0248)?;
    let p100 = e.binary_scalar(BinaryOp::Mul, p, 0.01)?;
    let aa = e.add(aa, p100)?;
    let aa = e.binary_scalar(BinaryOp::Sub, aa, 0.0873)?;
    let two_a = e.binary_scalar(BinaryOp::Mul, aa, 2.0)?;
    let c = e.binary_scalar(BinaryOp::Add, np, 0.5)?;
    let inv_b = e.div(one, b)?;
    let vr = e.binary_scalar(BinaryOp::Mul, inv_b, -4.2)?;
    let vr = e.binary_scalar(BinaryOp::Add, vr, 0.92)?;
    let alpha = e.binary_scalar(BinaryOp::Mul, inv_b, 5.1)?;
    let alpha = e.binary_scalar(BinaryOp::Add, alpha, 2.83)?;
    let alpha = e.mul(alpha, sd)?;
    let log_alpha = e.unary(UnaryOp::Log, alpha)?;
    let n1 = e.binary_scalar(BinaryOp::Add, n, 1.0)?;
    let m = e.mul(n1, p)?;
    let m = e.unary(UnaryOp::Floor, m)?;
    // p (n + 2), shared by the mode's term and each candidate's, so that
    // its rounding moves both alike (a shift of the mean) and cancels.
    let n2 = e.binary_scalar(BinaryOp::Add, n, 2.0)?;
    let pn2 = e.mul(p, n2)?;
    // (m + 1/2) ln((m + 1) q / (p (n - m + 1))), the ratio less 1 being
    // (m + 1 - p (n + 2)) / (p (n - m + 1)); and the mode's tails.
    let nm1 = e.sub(n1, m)?;
    let m1 = e.binary_scalar(BinaryOp::Add, m, 1.0)?;
    let num = e.sub(m1, pn2)?;
    let den = e.mul(p, nm1)?;
    let r = e.div(num, den)?;
    let r = e.unary(UnaryOp::Log1p, r)?;
    let mh = e.binary_scalar(BinaryOp::Add, m, 0.5)?;
    let mode_term = e.mul(mh, r)?;
    let nm = e.sub(n, m)?;
    let tm = stirling_tail(e, m)?;
    let tnm = stirling_tail(e, nm)?;
    let mode_term = e.add(mode_term, tm)?;
    let mode_term = e.add(mode_term, tnm)?;

    let t = Transformed {
        a: aa,
        two_a,
        b,
        shift: c,
        vr,
        log_alpha,
    };
    let mut out = m;
    for r in (0..BINOMIAL_ROUNDS).rev() {
        let Candidate {
            k,
            quick,
            log_ratio,
            ..
        } = candidate(e, u, BINOMIAL_WAITS + 2 * r, &t)?;
        let below = e.compare_scalar(CompareOp::Lt, k, 0.0)?;
        let above = e.compare(CompareOp::Gt, k, n)?;
        let outside = e.binary(BinaryOp::Or, below, above)?;
        // (n + 1) ln((n - m + 1) / (n - k + 1)) = (n + 1) ln(1 + (k - m) / (n - k + 1))
        let nk1 = e.sub(n1, k)?;
        let km = e.sub(k, m)?;
        let t1 = e.div(km, nk1)?;
        let t1 = e.unary(UnaryOp::Log1p, t1)?;
        let t1 = e.mul(n1, t1)?;
        // (k + 1/2) ln(p (n - k + 1) / (q (k + 1))), the ratio less 1 being
        // (p (n + 2) - k - 1) / (q (k + 1))
        let k1 = e.binary_scalar(BinaryOp::Add, k, 1.0)?;
        let num = e.sub(pn2, k1)?;
        let den = e.mul(q, k1)?;
        let t2 = e.div(num, den)?;
        let t2 = e.unary(UnaryOp::Log1p, t2)?;
        let kh = e.binary_scalar(BinaryOp::Add, k, 0.5)?;
        let t2 = e.mul(kh, t2)?;
        let nk = e.sub(n, k)?;
        let tk = stirling_tail(e, k)?;
        let tnk = stirling_tail(e, nk)?;
        let bound = e.add(mode_term, t1)?;
        let bound = e.add(bound, t2)?;
        let bound = e.sub(bound, tk)?;
        let bound = e.sub(bound, tnk)?;
        let full = e.compare(CompareOp::Le, log_ratio, bound)?;
        let accept = e.binary(BinaryOp::Or, quick, full)?;
        let inside = e.unary(UnaryOp::Not, outside)?;
        let accept = e.binary(BinaryOp::And, inside, accept)?;
        out = e.select(accept, k, out)?;
    }
    let small = e.compare_scalar(CompareOp::Lt, np, 10.0)?;
    let draw = e.select(small, waited, out)?;
    let rest = e.sub(n, draw)?;
    let draw = e.select(flip, rest, draw)?;
    // The edges, in torch's order, and NaN.
    let none = e.compare_scalar(CompareOp::Le, n, 0.0)?;
    let never = e.compare_scalar(CompareOp::Le, prob, 0.0)?;
    let none = e.binary(BinaryOp::Or, none, never)?;
    let all = e.compare_scalar(CompareOp::Ge, prob, 1.0)?;
    let draw = e.select(all, n, draw)?;
    let draw = e.select(none, zero, draw)?;
    let nan_n = e.compare(CompareOp::Ne, n, n)?;
    let nan_p = e.compare(CompareOp::Ne, prob, prob)?;
    let nan = e.binary(BinaryOp::Or, nan_n, nan_p)?;
    let nans = e.full_like(n, f64::NAN)?;
    let draw = e.select(nan, nans, draw)?;
    Ok(vec![e.convert(draw, dt)?])
}

pub(super) const OPS: &[OpDef] = &[
    def!("uniform", Arity::Between(0, 2), uniform),
    def!("normal", Arity::Between(0, 2), normal),
    def!("bernoulli", Arity::Between(1, 3), bernoulli),
    def!("dropout", Arity::Between(1, 3), dropout),
    def!("rrelu_with_noise", Arity::Between(1, 3), rrelu_with_noise),
    def!("randperm", Arity::Between(0, 2), randperm),
    def!("standard_gamma", Arity::Between(1, 3), standard_gamma),
    def!("poisson", Arity::Between(1, 3), poisson),
    def!("binomial", Arity::Between(2, 4), binomial),
];
