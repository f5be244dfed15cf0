//! Special functions: the complementary error function and its relatives
//! (erfc, erfcx, log_ndtr, the normal quantile ndtri), the Hurwitz zeta
//! function, and the gamma family: lgamma, digamma and polygamma (every
//! order), which torch's autograd chains (lgamma's gradient is digamma,
//! digamma's is polygamma(1), polygamma(n)'s is polygamma(n + 1)), so the
//! first brings the others. Each promotes as torch does (integers to the
//! default float) and computes at f32 for bf16 and f16, rounding once. The
//! Bessel functions are in bessel.rs.
//!
//! The gamma family works on arguments of at least 1/2: smaller ones go
//! through the reflection formulas, whose trigonometric factor takes its
//! argument reduced to r = x - round(x) in [-1/2, 1/2] (exact in floating
//! point), so large negative arguments keep their accuracy and the poles at
//! the non-positive integers come out exactly (r = 0). On [1/2, ∞) each shifts
//! its argument up by a fixed count with the recurrence and then sums an
//! asymptotic series: Stirling's for lgamma, its derivative for digamma,
//! and Euler–Maclaurin's for the Hurwitz zeta function behind polygamma.
//! The shift and the number of terms are chosen per compute dtype so the
//! series' first omitted term is below the dtype's rounding.

use super::attrs::Attrs;
use super::emit::Emitter;
use super::math::{binary_in, unary_in};
use super::support::polynomial;
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, UnaryOp, ValueId};

use std::f64::consts::PI;

/// Where Stirling's series for lgamma starts: below it the argument is
/// shifted up by this much (the product it divides by stays below 2^28).
const STIRLING_FROM: f64 = 8.0;

/// The largest polygamma order: its graph sums n + 11 powers (and n! is
/// past f64's range from n = 171).
const MAX_ORDER: u32 = 100;

/// B(2k) / (2k (2k - 1)): the coefficients of z^-(2k-1) in Stirling's
/// series, k = 1, 2, ... At z = 8 the eighth is 8e-16 of lgamma(8) = 8.5.
pub(super) const STIRLING: [f64; 8] = [
    1.0 / 12.0,
    -1.0 / 360.0,
    1.0 / 1260.0,
    -1.0 / 1680.0,
    1.0 / 1188.0,
    -691.0 / 360_360.0,
    1.0 / 156.0,
    -3617.0 / 122_400.0,
];

/// B(2k) / (2k): the coefficients of z^-2k in digamma's series (with a
/// minus sign), k = 1, 2, ...
pub(super) const DIGAMMA: [f64; 7] = [
    1.0 / 12.0,
    -1.0 / 120.0,
    1.0 / 252.0,
    -1.0 / 240.0,
    1.0 / 132.0,
    -691.0 / 32_760.0,
    1.0 / 12.0,
];

/// B(2k) / (2k)!: Euler–Maclaurin's coefficients, k = 1, 2, ...
pub(super) const EULER_MACLAURIN: [f64; 8] = [
    1.0 / 6.0 / 2.0,
    -1.0 / 30.0 / 24.0,
    1.0 / 42.0 / 720.0,
    -1.0 / 30.0 / 40_320.0,
    5.0 / 66.0 / 3_628_800.0,
    -691.0 / 2730.0 / 479_001_600.0,
    7.0 / 6.0 / 87_178_291_200.0,
    -3617.0 / 510.0 / 20_922_789_888_000.0,
];

/// How many of a series' terms the compute dtype needs.
fn terms(ct: DType, f32_terms: usize, f64_terms: usize) -> usize {
    if ct == DType::F64 {
        f64_terms
    } else {
        f32_terms
    }
}

/// Σ c[k] · z^-(first + step·k), by Horner in z^-step.
fn inverse_series(
    e: &mut Emitter,
    z: ValueId,
    c: &[f64],
    first: i32,
    step: i32,
) -> Result<ValueId> {
    let inv = e.binary_scalar(BinaryOp::Pow, z, -f64::from(step))?;
    let s = polynomial(e, inv, c)?;
    let lead = e.binary_scalar(BinaryOp::Pow, z, -f64::from(first))?;
    e.mul(s, lead)
}

/// The reflection set-up for v: (small, w, r) with small = v < 1/2,
/// w = 1 - v there and v elsewhere (so w ≥ 1/2 or NaN), and r = v - round(v).
fn reflect(e: &mut Emitter, v: ValueId) -> Result<(ValueId, ValueId, ValueId)> {
    let small = e.compare_scalar(CompareOp::Lt, v, 0.5)?;
    let one = e.full_like(v, 1.0)?;
    let mirrored = e.sub(one, v)?;
    let w = e.select(small, mirrored, v)?;
    let rounded = e.unary(UnaryOp::Round, v)?;
    let r = e.sub(v, rounded)?;
    Ok((small, w, r))
}

/// (sin πr, cos πr) for |r| ≤ 1/2, each to its own relative accuracy: the
/// cosine as sin(π(1/2 - |r|)), whose argument is exact, so cos πr is 0 at
/// r = ±1/2 (cos of π/2 rounded is 4e-8 in f32).
fn sin_cos_pi(e: &mut Emitter, r: ValueId) -> Result<(ValueId, ValueId)> {
    let pr = e.binary_scalar(BinaryOp::Mul, r, PI)?;
    let s = e.unary(UnaryOp::Sin, pr)?;
    let ar = e.unary(UnaryOp::Abs, r)?;
    let half = e.full_like(r, 0.5)?;
    let q = e.sub(half, ar)?;
    let pq = e.binary_scalar(BinaryOp::Mul, q, PI)?;
    Ok((s, e.unary(UnaryOp::Sin, pq)?))
}

/// ln Γ(w) for w ≥ 1/2: Stirling's series at z = w, or at z = w + 8 less
/// ln(w (w + 1) ... (w + 7)) below 8.
pub(super) fn lgamma_half_up(e: &mut Emitter, w: ValueId, ct: DType) -> Result<ValueId> {
    let low = e.compare_scalar(CompareOp::Lt, w, STIRLING_FROM)?;
    let shifted = e.binary_scalar(BinaryOp::Add, w, STIRLING_FROM)?;
    let z = e.select(low, shifted, w)?;
    let mut prod = w;
    for k in 1..STIRLING_FROM as i32 {
        let f = e.binary_scalar(BinaryOp::Add, w, f64::from(k))?;
        prod = e.mul(prod, f)?;
    }
    let one = e.full_like(w, 1.0)?;
    let prod = e.select(low, prod, one)?;
    // (z - 1/2) ln z - z + ln(2π)/2 + series(1/z) - ln(prod)
    let lz = e.unary(UnaryOp::Log, z)?;
    let zh = e.binary_scalar(BinaryOp::Sub, z, 0.5)?;
    let main = e.mul(zh, lz)?;
    let main = e.sub(main, z)?;
    let main = e.binary_scalar(BinaryOp::Add, main, 0.5 * (2.0 * PI).ln())?;
    let series = inverse_series(e, z, &STIRLING[..terms(ct, 3, 8)], 1, 2)?;
    let s = e.add(main, series)?;
    let lp = e.unary(UnaryOp::Log, prod)?;
    e.sub(s, lp)
}

/// lgamma(x) = ln|Γ(x)|: below 1/2 by ln(π / |sin πx|) - lgamma(1 - x);
/// +inf at the non-positive integers and at ±inf, as torch's.
fn lgamma(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, ct| {
        let (small, w, r) = reflect(e, v)?;
        let l = lgamma_half_up(e, w, ct)?;
        let (s, _) = sin_cos_pi(e, r)?;
        let s = e.unary(UnaryOp::Abs, s)?;
        let pi = e.full_like(v, PI)?;
        let q = e.div(pi, s)?;
        let lq = e.unary(UnaryOp::Log, q)?;
        let reflected = e.sub(lq, l)?;
        let y = e.select(small, reflected, l)?;
        let av = e.unary(UnaryOp::Abs, v)?;
        let infinite = e.compare_scalar(CompareOp::Eq, av, f64::INFINITY)?;
        let inf = e.full_like(v, f64::INFINITY)?;
        e.select(infinite, inf, y)
    })
}

/// ψ(w) for w ≥ 1/2: ψ(w + n) - Σ_{k<n} 1/(w + k) with n = 6 (f32) or
/// 10 (f64), and at z = w + n, ln z - 1/(2z) - Σ B(2k)/(2k z^2k).
pub(super) fn digamma_half_up(e: &mut Emitter, w: ValueId, ct: DType) -> Result<ValueId> {
    let n = terms(ct, 6, 10);
    let mut acc = e.full_like(w, 0.0)?;
    for k in 0..n {
        let wk = e.binary_scalar(BinaryOp::Add, w, k as f64)?;
        let one = e.full_like(w, 1.0)?;
        let inv = e.div(one, wk)?;
        acc = e.add(acc, inv)?;
    }
    let z = e.binary_scalar(BinaryOp::Add, w, n as f64)?;
    let lz = e.unary(UnaryOp::Log, z)?;
    let half = e.full_like(w, 0.5)?;
    let h = e.div(half, z)?;
    let series = inverse_series(e, z, &DIGAMMA[..terms(ct, 3, 7)], 2, 2)?;
    let y = e.sub(lz, h)?;
    let y = e.sub(y, series)?;
    e.sub(y, acc)
}

/// ψ(x): below 1/2 by ψ(1 - x) - π cot(πx). As torch's: ψ(±0) = ∓inf,
/// NaN at the negative integers and -inf.
fn digamma(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, ct| {
        let (small, w, r) = reflect(e, v)?;
        let d = digamma_half_up(e, w, ct)?;
        let (s, c) = sin_cos_pi(e, r)?;
        let pc = e.binary_scalar(BinaryOp::Mul, c, PI)?;
        let cot = e.div(pc, s)?;
        let reflected = e.sub(d, cot)?;
        let y = e.select(small, reflected, d)?;
        // -1/x keeps the sign of a zero: -inf at +0, +inf at -0.
        let zero = e.compare_scalar(CompareOp::Eq, v, 0.0)?;
        let m1 = e.full_like(v, -1.0)?;
        let at_zero = e.div(m1, v)?;
        let y = e.select(zero, at_zero, y)?;
        let pole = e.compare_scalar(CompareOp::Eq, r, 0.0)?;
        let neg = e.compare_scalar(CompareOp::Lt, v, 0.0)?;
        let neg_int = e.binary(BinaryOp::And, pole, neg)?;
        let nan = e.full_like(v, f64::NAN)?;
        e.select(neg_int, nan, y)
    })
}

/// The Hurwitz zeta function ζ(s, w) = Σ_k (w + k)^-s for w ≥ 0 and an
/// integer s ≥ 2: the first n = s + 10 terms summed, the rest by
/// Euler–Maclaurin at z = w + n (its k-th correction shrinks like
/// (s + 2k)^2k / (2πz)^2k, so n grows with s).
fn hurwitz_zeta(e: &mut Emitter, w: ValueId, s: u32, ct: DType) -> Result<ValueId> {
    let sf = f64::from(s);
    let n = s + 10;
    let mut acc = e.full_like(w, 0.0)?;
    for k in 0..n {
        let wk = e.binary_scalar(BinaryOp::Add, w, f64::from(k))?;
        let p = e.binary_scalar(BinaryOp::Pow, wk, -sf)?;
        acc = e.add(acc, p)?;
    }
    let z = e.binary_scalar(BinaryOp::Add, w, f64::from(n))?;
    // z^(1-s)/(s-1) + z^-s/2 + Σ_k B(2k)/(2k)! (s)_(2k-1) z^-(s+2k-1)
    let tail = e.binary_scalar(BinaryOp::Pow, z, 1.0 - sf)?;
    let tail = e.binary_scalar(BinaryOp::Mul, tail, 1.0 / (sf - 1.0))?;
    let zs = e.binary_scalar(BinaryOp::Pow, z, -sf)?;
    let half = e.binary_scalar(BinaryOp::Mul, zs, 0.5)?;
    let mut c = Vec::new();
    let mut rising = sf; // (s)_(2k-1) = s (s+1) ... (s+2k-2)
    for (k, b) in EULER_MACLAURIN[..terms(ct, 4, 8)].iter().enumerate() {
        if k > 0 {
            let j = 2.0 * k as f64;
            rising *= (sf + j - 1.0) * (sf + j);
        }
        c.push(b * rising);
    }
    let series = inverse_series(e, z, &c, s as i32 + 1, 2)?;
    let y = e.add(acc, tail)?;
    let y = e.add(y, half)?;
    e.add(y, series)
}

/// The polynomial P_n with dⁿ/dxⁿ cot(πx) = πⁿ P_n(cot πx), lowest
/// coefficient first: P_0 = c, P_(k+1) = -(1 + c²) P_k'(c).
fn cot_derivative(n: u32) -> Vec<f64> {
    let mut p = vec![0.0, 1.0];
    for _ in 0..n {
        let dp: Vec<f64> = (1..p.len()).map(|i| i as f64 * p[i]).collect();
        let mut next = vec![0.0; dp.len() + 2];
        for (i, &d) in dp.iter().enumerate() {
            next[i] -= d;
            next[i + 2] -= d;
        }
        p = next;
    }
    p
}

/// polygamma(x; n): ψ⁽ⁿ⁾(x). n = 0 is digamma; for n ≥ 1,
/// (-1)^(n+1) n! ζ(n + 1, x) on x ≥ 0, and below 0 the reflection
/// ψ⁽ⁿ⁾(x) = (-1)^(n+1) ((-1)ⁿ π dⁿ/dxⁿ cot(πx) - ψ⁽ⁿ⁾(1 - x)).
/// ±inf (the sign of (-1)^(n+1)) at the non-positive integers, as torch's.
fn polygamma(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let n = a.int("n")?;
    if n < 0 {
        return Err(Error::invalid(format!("n must be non-negative, got {n}")));
    }
    if n == 0 {
        return digamma(e, x, a);
    }
    let n = u32::try_from(n)
        .ok()
        .filter(|&n| n <= MAX_ORDER)
        .ok_or_else(|| {
            Error::invalid(format!(
                "n = {n} is past the largest order supported, {MAX_ORDER}"
            ))
        })?;
    let sign = if n % 2 == 1 { 1.0 } else { -1.0 };
    let factorial: f64 = (1..=n).map(f64::from).product();
    unary_in(e, x[0], a, |e, v, ct| {
        let neg = e.compare_scalar(CompareOp::Lt, v, 0.0)?;
        let one = e.full_like(v, 1.0)?;
        let mirrored = e.sub(one, v)?;
        let w = e.select(neg, mirrored, v)?;
        let zeta = hurwitz_zeta(e, w, n + 1, ct)?;
        let direct = e.binary_scalar(BinaryOp::Mul, zeta, sign * factorial)?;
        // The reflected value, from cot(πr) with r = x - round(x).
        let rounded = e.unary(UnaryOp::Round, v)?;
        let r = e.sub(v, rounded)?;
        let (s, c) = sin_cos_pi(e, r)?;
        let cot = e.div(c, s)?;
        let poly = polynomial(e, cot, &cot_derivative(n))?;
        // (-1)^(n+1) (-1)^n π^(n+1) P_n = -π^(n+1) P_n
        let trig = e.binary_scalar(BinaryOp::Mul, poly, -PI.powi(n as i32 + 1))?;
        let back = e.binary_scalar(BinaryOp::Mul, direct, -sign)?;
        let reflected = e.add(trig, back)?;
        let y = e.select(neg, reflected, direct)?;
        let pole = e.compare_scalar(CompareOp::Eq, r, 0.0)?;
        let nonpos = e.compare_scalar(CompareOp::Le, v, 0.0)?;
        let at_pole = e.binary(BinaryOp::And, pole, nonpos)?;
        let inf = e.full_like(v, sign * f64::INFINITY)?;
        e.select(at_pole, inf, y)
    })
}

/// e^(x²) erfc(x) on [1/2, 5/2] as a polynomial in x - 3/2, lowest power
/// first: our Chebyshev fit to mpmath's values, within 8e-10 relative
/// (f32's middle range).
const ERFCX_MID: [f64; 13] = [
    0.321_585_416_481_379_06,
    -0.163_622_915_251_165_7,
    0.076_151_037_218_275_92,
    -0.032_930_974_269_073_51,
    0.013_377_382_835_570_432,
    -0.005_145_411_429_583_433,
    0.001_885_886_176_875_011_2,
    -0.000_663_773_943_822_743_8,
    0.000_224_009_574_810_760_87,
    -6.966_326_539_128_393e-5,
    2.186_433_148_252_803_4e-5,
    -9.251_707_814_816_995e-6,
    2.757_480_557_096_812e-6,
];

/// e^(-v²) for v ≥ 0 without the rounding of v² (which alone is 6e-6 of
/// the result at v = 10 in f32): v = h + l with h on a grid coarse enough
/// that h² is exact, and e^(-v²) = e^(-h²) e^(-(v - h)(v + h)).
fn exp_neg_sq(e: &mut Emitter, v: ValueId, ct: DType) -> Result<ValueId> {
    // h has at most 12 (f32) or 26 (f64) significant bits where erfc is
    // not yet 0 (v < 16 or v < 32).
    let grid = if ct == DType::F64 {
        2f64.powi(21)
    } else {
        256.0
    };
    let scaled = e.binary_scalar(BinaryOp::Mul, v, grid)?;
    let h = e.unary(UnaryOp::Floor, scaled)?;
    let h = e.binary_scalar(BinaryOp::Div, h, grid)?;
    let hh = e.mul(h, h)?;
    let nhh = e.unary(UnaryOp::Neg, hh)?;
    let big = e.unary(UnaryOp::Exp, nhh)?;
    let lo = e.sub(v, h)?;
    let hi = e.add(v, h)?;
    let d = e.mul(lo, hi)?;
    let nd = e.unary(UnaryOp::Neg, d)?;
    let small = e.unary(UnaryOp::Exp, nd)?;
    e.mul(big, small)
}

/// erfc(x) = 1 - erf(x), without the cancellation of that difference:
/// 1 - erf(x) below |x| = 1/2 (where erf is under 0.53), and on
/// |x| ≥ 1/2, e^(-x²) times e^(x²) erfc(x), the latter from our fit on
/// [1/2, 5/2] (f32) and the continued fraction
/// 1/√π / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))) past it, 16 levels deep
/// (f32, within 3e-10 from 5/2 on) or 48 (f64, within 2e-15 from 2 on;
/// f64 takes 1 - erf on [1/2, 2), whose cancellation magnifies erf's
/// rounding to 1e-13 of the result near 2). Negative x by erfc(x) = 2 - erfc(-x).
fn erfc(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, erfc_of)
}

/// The continued fraction for e^(w²) erfc(w), w ≥ 1/2 (see erfc).
fn erfc_fraction(e: &mut Emitter, w: ValueId, ct: DType) -> Result<ValueId> {
    let depth = if ct == DType::F64 { 48 } else { 16 };
    let mut t = w;
    for k in (1..=depth).rev() {
        let q = e.full_like(w, f64::from(k) / 2.0)?;
        let q = e.div(q, t)?;
        t = e.add(w, q)?;
    }
    let root_pi = e.full_like(w, PI.sqrt())?;
    let den = e.mul(t, root_pi)?;
    let one = e.full_like(w, 1.0)?;
    e.div(one, den)
}

pub(super) fn erfc_of(e: &mut Emitter, v: ValueId, ct: DType) -> Result<ValueId> {
    {
        let f64_compute = ct == DType::F64;
        let av = e.unary(UnaryOp::Abs, v)?;
        let erf = e.unary(UnaryOp::Erf, v)?;
        let one = e.full_like(v, 1.0)?;
        let direct = e.sub(one, erf)?;
        // erfc(|x|) for |x| ≥ 1/2, computed at max(|x|, 1/2).
        let w = e.binary_scalar(BinaryOp::Max, av, 0.5)?;
        let cf = erfc_fraction(e, w, ct)?;
        let (mid, mid_end) = if f64_compute {
            let erf_w = e.unary(UnaryOp::Erf, w)?;
            (e.sub(one, erf_w)?, 2.0)
        } else {
            let u = e.binary_scalar(BinaryOp::Sub, w, 1.5)?;
            let p = polynomial(e, u, &ERFCX_MID)?;
            let g = exp_neg_sq(e, w, ct)?;
            (e.mul(g, p)?, 2.5)
        };
        let g = exp_neg_sq(e, w, ct)?;
        let tail = e.mul(g, cf)?;
        let in_mid = e.compare_scalar(CompareOp::Lt, w, mid_end)?;
        let pos = e.select(in_mid, mid, tail)?;
        let two = e.full_like(v, 2.0)?;
        let neg = e.sub(two, pos)?;
        let below = e.compare_scalar(CompareOp::Lt, v, 0.0)?;
        let big = e.select(below, neg, pos)?;
        let small = e.compare_scalar(CompareOp::Lt, av, 0.5)?;
        let y = e.select(small, direct, big)?;
        // ±inf: 0 and 2 (the split above is inf - inf there).
        at_infinities(e, v, y, 2.0)
    }
}

/// erfcx(x) = e^(x²) erfc(x) (torch.special.erfcx), without the
/// overflow and underflow of that product: below |x| = 1/2 the product
/// itself; from 1/2 erfc's own scaled pieces (the continued fraction, and
/// in between f32's fit or, at f64, e^(x²) (1 - erf x) below 2); below
/// -1/2, 2 e^(x²) - erfcx(-x), which overflows where it should.
fn erfcx_of(e: &mut Emitter, v: ValueId, ct: DType) -> Result<ValueId> {
    let av = e.unary(UnaryOp::Abs, v)?;
    let w = e.binary_scalar(BinaryOp::Max, av, 0.5)?;
    let cf = erfc_fraction(e, w, ct)?;
    let one = e.full_like(v, 1.0)?;
    let (mid, mid_end) = if ct == DType::F64 {
        let erf_w = e.unary(UnaryOp::Erf, w)?;
        let tail = e.sub(one, erf_w)?;
        let ww = e.mul(w, w)?;
        let grow = e.unary(UnaryOp::Exp, ww)?;
        (e.mul(grow, tail)?, 2.0)
    } else {
        let u = e.binary_scalar(BinaryOp::Sub, w, 1.5)?;
        (polynomial(e, u, &ERFCX_MID)?, 2.5)
    };
    let in_mid = e.compare_scalar(CompareOp::Lt, w, mid_end)?;
    let pos = e.select(in_mid, mid, cf)?;
    // 2 e^(x²) as 2 / e^(-x²), the latter without x²'s rounding.
    let decay = exp_neg_sq(e, w, ct)?;
    let two = e.full_like(v, 2.0)?;
    let twice = e.div(two, decay)?;
    let neg = e.sub(twice, pos)?;
    let below = e.compare_scalar(CompareOp::Lt, v, 0.0)?;
    let big = e.select(below, neg, pos)?;
    let vv = e.mul(v, v)?;
    let grow = e.unary(UnaryOp::Exp, vv)?;
    let erf = e.unary(UnaryOp::Erf, v)?;
    let tail = e.sub(one, erf)?;
    let direct = e.mul(grow, tail)?;
    let small = e.compare_scalar(CompareOp::Lt, av, 0.5)?;
    let y = e.select(small, direct, big)?;
    // ±inf: 0 and inf (e^(-x²)'s split is inf - inf there).
    at_infinities(e, v, y, f64::INFINITY)
}

/// `y`, with 0 where v is +inf and `at_minus` where it is -inf: erfc's and
/// erfcx's limits, which their splits compute as inf - inf.
fn at_infinities(e: &mut Emitter, v: ValueId, y: ValueId, at_minus: f64) -> Result<ValueId> {
    let pinf = e.compare_scalar(CompareOp::Eq, v, f64::INFINITY)?;
    let zero = e.full_like(v, 0.0)?;
    let y = e.select(pinf, zero, y)?;
    let ninf = e.compare_scalar(CompareOp::Eq, v, f64::NEG_INFINITY)?;
    let lim = e.full_like(v, at_minus)?;
    e.select(ninf, lim, y)
}

fn erfcx(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, erfcx_of)
}

/// log_ndtr(x) = ln Φ(x), Φ the standard normal CDF (torch.special.log_ndtr):
/// below -1, ln(erfcx(-x/√2) / 2) - x²/2, which does not underflow; from
/// -1, log1p(-erfc(x/√2) / 2).
fn log_ndtr(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, ct| {
        let s = e.binary_scalar(BinaryOp::Mul, v, std::f64::consts::FRAC_1_SQRT_2)?;
        let ns = e.unary(UnaryOp::Neg, s)?;
        let scaled = erfcx_of(e, ns, ct)?;
        let half = e.binary_scalar(BinaryOp::Mul, scaled, 0.5)?;
        let l = e.unary(UnaryOp::Log, half)?;
        let vv = e.mul(v, v)?;
        let vv = e.binary_scalar(BinaryOp::Mul, vv, 0.5)?;
        let low = e.sub(l, vv)?;
        let upper = erfc_of(e, s, ct)?;
        let upper = e.binary_scalar(BinaryOp::Mul, upper, -0.5)?;
        let high = e.unary(UnaryOp::Log1p, upper)?;
        let left = e.compare_scalar(CompareOp::Lt, v, -1.0)?;
        e.select(left, low, high)
    })
}

/// Abramowitz and Stegun's 26.2.23: the lower-tail normal quantile at
/// probability r ≤ 1/2 is -(t - N(t)/D(t)), t = √(-2 ln r), within 4.5e-4.
const QUANTILE_START_NUM: [f64; 3] = [2.515_517, 0.802_853, 0.010_328];
const QUANTILE_START_DEN: [f64; 4] = [1.0, 1.432_788, 0.189_269, 0.001_308];

/// ndtri(p) = Φ⁻¹(p), the standard normal quantile (torch.special.ndtri).
/// With r = min(p, 1 - p) (1 - p is exact from 1/2 up) the lower quantile
/// z starts at Abramowitz and Stegun's 26.2.23 and takes Newton steps on
/// Φ(z) = r (2 at f32, 3 at f64: its error squares, times |z|/2, each
/// step), with Φ(z) - r as ½ erf(z/√2) - (r - ½) from r = 1/4 (r - ½ is
/// exact, so a p near ½ keeps its relative accuracy) and the step below
/// as Mills' ratio Φ(z)/φ(z) less r/φ(z) (no tiny differences in the
/// tail). ndtri(p) = z below ½ and -z above;
/// ±inf at 1 and 0, NaN outside [0, 1]. Below the smallest normal number
/// the start and the steps lose precision.
fn ndtri(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, p, ct| {
        let (tiny, steps) = if ct == DType::F64 {
            (f64::MIN_POSITIVE, 3)
        } else {
            (f64::from(f32::MIN_POSITIVE), 2)
        };
        let one = e.full_like(p, 1.0)?;
        let q = e.sub(one, p)?;
        let upper = e.compare_scalar(CompareOp::Gt, p, 0.5)?;
        let r = e.select(upper, q, p)?;
        let rc = e.binary_scalar(BinaryOp::Max, r, tiny)?;
        let lr = e.unary(UnaryOp::Log, rc)?;
        let t = e.binary_scalar(BinaryOp::Mul, lr, -2.0)?;
        let t = e.unary(UnaryOp::Sqrt, t)?;
        let num = polynomial(e, t, &QUANTILE_START_NUM)?;
        let den = polynomial(e, t, &QUANTILE_START_DEN)?;
        let frac = e.div(num, den)?;
        let mut z = e.sub(frac, t)?;
        let central = e.compare_scalar(CompareOp::Ge, r, 0.25)?;
        let h = e.binary_scalar(BinaryOp::Sub, r, 0.5)?;
        for _ in 0..steps {
            let s = e.binary_scalar(BinaryOp::Mul, z, std::f64::consts::FRAC_1_SQRT_2)?;
            let erf = e.unary(UnaryOp::Erf, s)?;
            let half_erf = e.binary_scalar(BinaryOp::Mul, erf, 0.5)?;
            let f_central = e.sub(half_erf, h)?;
            // φ(z) = e^(-z²/2) / √(2π) = e^(-s²) / √(2π)
            let abs_s = e.unary(UnaryOp::Abs, s)?;
            let g = exp_neg_sq(e, abs_s, ct)?;
            let density = e.binary_scalar(BinaryOp::Mul, g, 1.0 / (2.0 * PI).sqrt())?;
            let central_step = e.div(f_central, density)?;
            // In the tail, (Φ(z) - r) / φ(z) as Mills' ratio Φ/φ =
            // √(π/2) erfcx(-s) less r/φ: Φ(z) - r itself is below the
            // smallest normal number for r under 1e-292, where a platform
            // that flushes those to 0 (XLA's CPU) would stop the steps.
            let ns = e.unary(UnaryOp::Neg, s)?;
            let scaled = erfcx_of(e, ns, ct)?;
            let mills = e.binary_scalar(BinaryOp::Mul, scaled, (PI / 2.0).sqrt())?;
            let r_over = e.div(r, density)?;
            let tail_step = e.sub(mills, r_over)?;
            let step = e.select(central, central_step, tail_step)?;
            z = e.sub(z, step)?;
        }
        // p = 1/2 is 0 exactly; r = 0 is -inf (the lower tail).
        let zero = e.full_like(p, 0.0)?;
        let mid = e.compare_scalar(CompareOp::Eq, h, 0.0)?;
        let z = e.select(mid, zero, z)?;
        let ninf = e.full_like(p, f64::NEG_INFINITY)?;
        let at_end = e.compare_scalar(CompareOp::Eq, r, 0.0)?;
        let z = e.select(at_end, ninf, z)?;
        let nz = e.unary(UnaryOp::Neg, z)?;
        let y = e.select(upper, nz, z)?;
        // Outside [0, 1]: NaN (NaN itself passes through the arithmetic).
        let below = e.compare_scalar(CompareOp::Lt, p, 0.0)?;
        let above = e.compare_scalar(CompareOp::Gt, p, 1.0)?;
        let outside = e.binary(BinaryOp::Or, below, above)?;
        let nan = e.full_like(p, f64::NAN)?;
        e.select(outside, nan, y)
    })
}

/// zeta(x, q) = Σ_k (q + k)^-x, the Hurwitz zeta function
/// (torch.special.zeta): the first n terms summed (16 at f64, 10 at f32)
/// and the rest by Euler–Maclaurin at z = q + n with 8 (f64) or 4 (f32)
/// corrections, whose k-th shrinks like (x / 2πz)^2k where the tail still
/// matters (where x is large against z the tail is below the sum's first
/// term's rounding). As torch's: inf at x = 1 and at the non-positive
/// integer q, NaN for x < 1 and for a negative q with a non-integer x.
/// For a negative non-integer q and an integer x torch sums terms until
/// q + k passes 9; here the n terms and the correction at q + n do the
/// same for q down to 6 - n, and past that the result is NaN.
fn zeta(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    binary_in(e, x, a, |e, s, q, ct| {
        let (n, k) = if ct == DType::F64 { (16, 8) } else { (10, 4) };
        let ns = e.unary(UnaryOp::Neg, s)?;
        let mut acc = e.full_like(q, 0.0)?;
        for j in 0..n {
            let qj = e.binary_scalar(BinaryOp::Add, q, f64::from(j))?;
            let p = e.binary(BinaryOp::Pow, qj, ns)?;
            acc = e.add(acc, p)?;
        }
        let z = e.binary_scalar(BinaryOp::Add, q, f64::from(n))?;
        // z^(1-s)/(s-1) + z^-s/2 + Σ_k B(2k)/(2k)! (s)_(2k-1) z^-(s+2k-1)
        let zs = e.binary(BinaryOp::Pow, z, ns)?;
        let s1 = e.binary_scalar(BinaryOp::Sub, s, 1.0)?;
        let tail = e.mul(zs, z)?;
        let tail = e.div(tail, s1)?;
        let half = e.binary_scalar(BinaryOp::Mul, zs, 0.5)?;
        let one = e.full_like(z, 1.0)?;
        let inv_z = e.div(one, z)?;
        let inv_z2 = e.mul(inv_z, inv_z)?;
        let mut power = e.mul(zs, inv_z)?; // z^-(s+1)
        let mut rising = s; // (s)_(2k-1)
        let mut series = e.full_like(z, 0.0)?;
        for (i, &b) in EULER_MACLAURIN[..k].iter().enumerate() {
            if i > 0 {
                let j = 2.0 * i as f64;
                let f1 = e.binary_scalar(BinaryOp::Add, s, j - 1.0)?;
                let f2 = e.binary_scalar(BinaryOp::Add, s, j)?;
                rising = e.mul(rising, f1)?;
                rising = e.mul(rising, f2)?;
                power = e.mul(power, inv_z2)?;
            }
            let term = e.mul(rising, power)?;
            let term = e.binary_scalar(BinaryOp::Mul, term, b)?;
            series = e.add(series, term)?;
        }
        // Where z^-s underflows the corrections are 0 (their rising
        // factorial may have overflowed).
        let gone = e.compare_scalar(CompareOp::Eq, zs, 0.0)?;
        let zero = e.full_like(z, 0.0)?;
        let series = e.select(gone, zero, series)?;
        let y = e.add(acc, tail)?;
        let y = e.add(y, half)?;
        let y = e.add(y, series)?;
        // x = inf: q^-inf alone (0, 1 or inf).
        let s_inf = e.compare_scalar(CompareOp::Eq, s, f64::INFINITY)?;
        let first = e.binary(BinaryOp::Pow, q, ns)?;
        let y = e.select(s_inf, first, y)?;
        // The domain, as torch's.
        let nan = e.full_like(q, f64::NAN)?;
        let inf = e.full_like(q, f64::INFINITY)?;
        let fq = e.unary(UnaryOp::Floor, q)?;
        let q_int = e.compare(CompareOp::Eq, q, fq)?;
        let fs = e.unary(UnaryOp::Floor, s)?;
        let s_frac = e.compare(CompareOp::Ne, s, fs)?;
        let q_neg = e.compare_scalar(CompareOp::Lt, q, 0.0)?;
        let neg_frac = e.binary(BinaryOp::And, q_neg, s_frac)?;
        let far = e.compare_scalar(CompareOp::Le, q, 6.0 - f64::from(n))?;
        let bad = e.binary(BinaryOp::Or, neg_frac, far)?;
        let y = e.select(bad, nan, y)?;
        let q_nonpos = e.compare_scalar(CompareOp::Le, q, 0.0)?;
        let pole = e.binary(BinaryOp::And, q_nonpos, q_int)?;
        let y = e.select(pole, inf, y)?;
        let below = e.compare_scalar(CompareOp::Lt, s, 1.0)?;
        let y = e.select(below, nan, y)?;
        let at_one = e.compare_scalar(CompareOp::Eq, s, 1.0)?;
        e.select(at_one, inf, y)
    })
}

pub(super) const OPS: &[OpDef] = &[
    def!("lgamma", Arity::Exactly(1), lgamma),
    def!("digamma", Arity::Exactly(1), digamma),
    def!("polygamma", Arity::Exactly(1), polygamma),
    def!("erfc", Arity::Exactly(1), erfc),
    def!("erfcx", Arity::Exactly(1), erfcx),
    def!("log_ndtr", Arity::Exactly(1), log_ndtr),
    def!("ndtri", Arity::Exactly(1), ndtri),
    def!("zeta", Arity::Exactly(2), zeta),
];

#[cfg(test)]
mod tests {
    use super::super::tests::{close, matches, run, run1, t};
    use crate::ir::DType;
    use crate::ops::attrs::{Attr, Attrs};

    /// The normal quantile against mpmath (30 digits) at probabilities
    /// f32 holds exactly, from 2^-100 to 1 - 2^-20, p = ½ ± small keeping
    /// its relative accuracy; 1e-300 at f64; the ends and outside [0, 1].
    #[test]
    fn ndtri_matches_mpmath() {
        let ps = [
            2f64.powi(-100),
            2f64.powi(-33),
            2f64.powi(-10),
            0.015625,
            0.1875,
            0.3125,
            0.484375,
            0.5 + 2f64.powi(-20),
            0.515625,
            0.75,
            0.90625,
            0.9921875,
            1.0 - 2f64.powi(-20),
        ];
        let want = [
            -11.484_540_434_973_038,
            -6.337_957_754_553_774,
            -3.097_269_078_198_784_6,
            -2.153_874_694_061_456_4,
            -0.887_146_559_018_876_1,
            -0.488_776_411_114_669_5,
            -0.039_176_085_503_097_63,
            2.390_507_006_295_574e-06,
            0.039_176_085_503_097_63,
            0.674_489_750_196_081_7,
            1.318_010_897_303_536_7,
            2.417_559_016_236_505_3,
            4.763_001_034_267_813_5,
        ];
        matches("ndtri", Attrs::new(), &ps, &want, 0.0, [4e-15, 4e-7]);
        let deep = run1("ndtri", &[&t(DType::F64, &[1], &[1e-300])], Attrs::new());
        close(&deep, &[-37.047_096_299_361_2], 1e-14);
        for dt in [DType::F64, DType::F32] {
            let ends = run1(
                "ndtri",
                &[&t(dt, &[6], &[0.0, 0.5, 1.0, -0.1, 1.5, f64::NAN])],
                Attrs::new(),
            )
            .to_f64_vec();
            assert_eq!(
                ends[..3],
                [f64::NEG_INFINITY, 0.0, f64::INFINITY],
                "{ends:?}"
            );
            assert!(ends[3..].iter().all(|v| v.is_nan()), "{ends:?}");
        }
    }

    /// The Hurwitz zeta function against mpmath (30 digits), q from
    /// negative to 1000 and x from near 1 to 60 (f32 holds the arguments
    /// exactly; it leaves out the negative q, which it takes from -4 up);
    /// the domain's edges as torch's.
    #[test]
    fn zeta_matches_mpmath() {
        let cases: [(f64, f64, f64); 12] = [
            (1.5, 1.0, 2.612_375_348_685_488),
            (2.0, 1.0, 1.644_934_066_848_226_4),
            (2.0, 0.5, 4.934_802_200_544_679),
            (3.75, 0.007_812_5, 79_806_339.620_276_12),
            (1.000_976_562_5, 2.0, 1_023.577_286_769_504_6),
            (10.0, 0.75, 17.761_481_181_337_004),
            (30.0, 1.5, 5.215_096_203_815_732e-06),
            (4.0, 100.0, 3.383_666_650_002_222e-07),
            (1.25, 1000.0, 0.711_400_696_509_812_6),
            (60.0, 0.875, 3_016.593_692_709_888),
            (2.0, -2.5, 9.539_246_644_989_124),
            (3.0, -5.5, 0.013_793_955_353_438_4),
        ];
        for (dt, tol, n) in [(DType::F64, 1e-13, 12), (DType::F32, 2e-6, 10)] {
            let n = if dt == DType::F64 { n } else { n - 2 };
            let xs: Vec<f64> = cases[..n].iter().map(|c| c.0).collect();
            let qs: Vec<f64> = cases[..n].iter().map(|c| c.1).collect();
            let len = [n as u64];
            let got = run1(
                "zeta",
                &[&t(dt, &len, &xs), &t(dt, &len, &qs)],
                Attrs::new(),
            );
            for (i, g) in got.to_f64_vec().iter().enumerate() {
                let w = cases[i].2;
                assert!(
                    (g - w).abs() <= tol * w.abs(),
                    "zeta {dt:?} at ({}, {}): got {g}, want {w}",
                    cases[i].0,
                    cases[i].1
                );
            }
            // x = 1 and q at a pole: inf; x < 1, or x fractional with q < 0: NaN.
            let xs = [1.0, 2.0, 2.0, 0.5, 2.5, f64::INFINITY, f64::INFINITY];
            let qs = [3.0, 0.0, -4.0, 3.0, -1.5, 2.0, 1.0];
            let got = run1(
                "zeta",
                &[&t(dt, &[7], &xs), &t(dt, &[7], &qs)],
                Attrs::new(),
            )
            .to_f64_vec();
            assert_eq!(got[..3], [f64::INFINITY; 3], "{got:?}");
            assert!(got[3].is_nan() && got[4].is_nan(), "{got:?}");
            assert_eq!(got[5..], [0.0, 1.0], "{got:?}");
        }
    }

    /// erfcx and log_ndtr against mpmath (30 digits; 80 for log_ndtr(10),
    /// whose 1 - 8e-24 took 24 of the 30), through both
    /// tails: erfcx overflows only where 2 e^(x²) does, log_ndtr stays
    /// finite where Φ underflows.
    #[test]
    fn erfcx_and_log_ndtr_match_reference_values() {
        let xs = [
            -5.0, -1.0, -0.3, 0.0, 0.3, 0.5, 1.0, 2.0, 2.4, 3.0, 10.0, 50.0, 1e4,
        ];
        let want = [
            144_009_798_674.661_04,
            5.008_980_080_762_283,
            1.453_749_232_842_765_5,
            1.0,
            0.734_599_334_567_655_1,
            0.615_690_344_192_925_9,
            0.427_583_576_155_807,
            0.255_395_676_310_505_75,
            0.218_498_734_537_033_4,
            0.179_001_151_181_389_96,
            0.056_140_992_743_822_59,
            0.011_281_536_265_323_773,
            5.641_895_807_268_084e-5,
        ];
        matches("erfcx", Attrs::new(), &xs, &want, 1e-300, [2e-13, 2e-6]);
        let ys = [-40.0, -10.0, -3.0, -1.0, -0.5, 0.0, 1.0, 3.0, 6.0, 10.0];
        let want = [
            -804.608_442_013_753_8,
            -53.231_285_150_510_47,
            -6.607_726_221_510_349,
            -1.841_021_645_009_263_6,
            -1.175_911_761_593_618_5,
            -std::f64::consts::LN_2,
            -0.172_753_779_023_449_88,
            -0.001_350_809_964_748_193_8,
            -9.865_876_455_243_758e-10,
            -7.619_853_024_160_526e-24,
        ];
        matches("log_ndtr", Attrs::new(), &ys, &want, 1e-300, [2e-13, 4e-6]);
        let edge = t(
            DType::F64,
            &[4],
            &[-30.0, f64::NEG_INFINITY, f64::INFINITY, f64::NAN],
        );
        let got = run1("erfcx", &[&edge], Attrs::new()).to_f64_vec();
        assert!(
            got[0] == f64::INFINITY && got[1] == f64::INFINITY && got[2] == 0.0 && got[3].is_nan(),
            "{got:?}"
        );
        let got = run1("log_ndtr", &[&edge], Attrs::new()).to_f64_vec();
        assert!(
            got[1] == f64::NEG_INFINITY && got[2] == 0.0 && got[3].is_nan(),
            "{got:?}"
        );
    }

    #[test]
    fn lgamma_matches_reference_values() {
        let xs = [
            -2.5, -1.5, -0.5, -1e-3, 1e-8, 0.1, 0.5, 1.0, 1.5, 2.0, 2.5, 3.7, 7.99, 8.0, 10.0,
            100.5, 1e5,
        ];
        let want = [
            -0.056_243_716_497_674_054,
            0.860_047_015_376_481,
            1.265_512_123_484_645_4,
            6.908_333_317_515_028,
            18.420_680_738_180_21,
            2.252_712_651_734_206,
            0.572_364_942_924_700_1,
            0.0,
            -0.120_782_237_635_245_22,
            0.0,
            0.284_682_870_472_919_2,
            1.428_072_326_665_388,
            8.505_011_606_088_48,
            8.525_161_361_065_415,
            12.801_827_480_081_469,
            361.435_540_467_777_6,
            1_051_287.708_973_656_9,
        ];
        // Below 8 the shifted series subtracts two logs of 10 to 28, so the
        // error is absolute: 4e-15 in f64, 3e-6 in f32 (torch's tests allow
        // 1e-5 there).
        matches("lgamma", Attrs::new(), &xs, &want, 1.0, [4e-15, 3e-6]);
        let big = run1("lgamma", &[&t(DType::F64, &[1], &[1e15])], Attrs::new());
        close(&big, &[3.353_877_639_491_066_8e16], 1e-15);
        // Poles, infinities and NaN, as torch's: +inf at 0, -0 and the
        // negative integers (also a large f32 one), and at ±inf.
        let e = run1(
            "lgamma",
            &[&t(
                DType::F32,
                &[7],
                &[
                    0.0,
                    -0.0,
                    -3.0,
                    -1e30,
                    f64::INFINITY,
                    f64::NEG_INFINITY,
                    f64::NAN,
                ],
            )],
            Attrs::new(),
        );
        let inf = f64::INFINITY;
        close(&e, &[inf, inf, inf, inf, inf, inf, f64::NAN], 0.0);
        // Integers promote to the default float; half dtypes round once.
        let i = run1(
            "lgamma",
            &[&t(DType::I64, &[3], &[1.0, 3.0, 5.0])],
            Attrs::new(),
        );
        assert_eq!(i.ty.dtype, DType::F32);
        close(&i, &[0.0, 2f64.ln(), 24f64.ln()], 1e-6);
        let b = run1("lgamma", &[&t(DType::BF16, &[1], &[5.0])], Attrs::new());
        assert_eq!(b.ty.dtype, DType::BF16);
        close(&b, &[half::bf16::from_f64(24f64.ln()).to_f64()], 0.0);
    }

    #[test]
    fn digamma_matches_reference_values() {
        let xs = [
            -2.5,
            -0.5,
            -1e-3,
            1e-6,
            0.3,
            1.0,
            1.461_632_144_968_362_2,
            2.0,
            6.5,
            30.0,
            1e6,
        ];
        let want = [
            1.103_156_640_645_243,
            0.036_489_973_978_576_52,
            999.421_138_197_891_3,
            -1_000_000.577_214_020_1,
            -3.502_524_222_200_133,
            -0.577_215_664_901_532_9,
            -9.241_265_521_729_427e-17,
            0.422_784_335_098_467_13,
            1.792_911_330_399_933,
            3.384_438_132_685_525,
            13.815_510_057_964_191,
        ];
        matches("digamma", Attrs::new(), &xs, &want, 1.0, [2e-15, 1e-6]);
        // torch's edges: -inf at +0, +inf at -0, NaN at the negative
        // integers and at -inf, +inf at +inf.
        let e = run1(
            "digamma",
            &[&t(
                DType::F32,
                &[6],
                &[0.0, -0.0, -2.0, f64::NEG_INFINITY, f64::INFINITY, f64::NAN],
            )],
            Attrs::new(),
        );
        close(
            &e,
            &[
                f64::NEG_INFINITY,
                f64::INFINITY,
                f64::NAN,
                f64::NAN,
                f64::INFINITY,
                f64::NAN,
            ],
            0.0,
        );
    }

    #[test]
    fn polygamma_matches_reference_values_for_several_orders() {
        let xs = [-2.3, -0.5, 0.01, 0.5, 1.0, 3.3, 25.0, 1e4];
        let want: [(i64, [f64; 8]); 4] = [
            (
                1,
                [
                    14.725_912_160_961_292,
                    8.934_802_200_544_679,
                    10_001.621_213_528_313,
                    4.934_802_200_544_679,
                    1.644_934_066_848_226_4,
                    0.353_501_541_841_061_8,
                    0.040_810_663_257_225_58,
                    0.000_100_005_000_166_666_66,
                ],
            ),
            (
                2,
                [
                    68.713_792_529_270_31,
                    -0.828_796_644_234_32,
                    -2_000_002.340_398_677,
                    -16.828_796_644_234_32,
                    -2.404_113_806_319_188_5,
                    -0.123_751_185_264_942_72,
                    -0.001_665_279_318_422_468,
                    -1.000_100_005e-08,
                ],
            ),
            (
                3,
                [
                    768.935_064_666_142_2,
                    193.409_091_034_002_44,
                    600_000_006.251_061_8,
                    97.409_091_034_002_44,
                    6.493_939_402_266_829,
                    0.085_849_667_336_884_94,
                    0.000_135_884_636_508_273_7,
                    2.000_300_02e-12,
                ],
            ),
            (
                6,
                [
                    3_283_536.884_909_281_5,
                    -43.457_923_803_023_284,
                    -7.200_000_000_000_066_4e16,
                    -92_203.457_923_803_03,
                    -726.011_479_714_984_5,
                    -0.204_556_023_133_347_48,
                    -5.532_496_491_858_543e-7,
                    -1.200_360_042e-22,
                ],
            ),
        ];
        for (n, want) in want {
            let attrs = Attrs::new().with("n", Attr::Int(n));
            matches("polygamma", attrs, &xs, &want, 0.0, [1e-13, 2e-6]);
        }
        // n = 0 is digamma.
        let d = run1(
            "polygamma",
            &[&t(DType::F64, &[1], &[1.0])],
            Attrs::new().with("n", Attr::Int(0)),
        );
        close(&d, &[-0.577_215_664_901_532_9], 1e-15);
        // Poles: (-1)^(n+1) inf at 0 and the negative integers.
        for (n, s) in [(1, 1.0), (2, -1.0)] {
            let p = run1(
                "polygamma",
                &[&t(DType::F32, &[3], &[0.0, -1.0, -4.0])],
                Attrs::new().with("n", Attr::Int(n)),
            );
            close(&p, &[s * f64::INFINITY; 3], 0.0);
        }
        let e = run(
            "polygamma",
            &[&t(DType::F32, &[1], &[1.0])],
            Attrs::new().with("n", Attr::Int(-1)),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("polygamma") && e.contains("non-negative, got -1"),
            "{e}"
        );
    }

    #[test]
    fn erfc_keeps_its_relative_accuracy_in_the_tail() {
        let xs = [
            -6.0, -2.0, -0.7, -0.3, 0.0, 1e-3, 0.3, 0.5, 0.7, 1.0, 1.5, 1.99, 2.0, 2.49, 2.5, 3.0,
            4.0, 5.5, 8.0, 9.0,
        ];
        let want = [
            2.0,
            1.995_322_265_018_952_8,
            1.677_801_193_837_418_4,
            1.328_626_759_459_127_4,
            1.0,
            0.998_871_621_209_030_7,
            0.671_373_240_540_872_6,
            0.479_500_122_186_953_5,
            0.322_198_806_162_581_56,
            0.157_299_207_050_285_13,
            0.033_894_853_524_689_274,
            0.004_888_586_800_383_003,
            0.004_677_734_981_047_266,
            0.000_429_287_867_733_912_9,
            0.000_406_952_017_444_958_9,
            2.209_049_699_858_544e-5,
            1.541_725_790_028_002e-8,
            7.357_847_917_974_398e-15,
            1.122_429_717_298_292_6e-29,
            4.137_031_746_513_81e-37,
        ];
        // Relative everywhere (1 - erf(x) would be 100% off from x = 4
        // in f32 and from 6 in f64).
        matches("erfc", Attrs::new(), &xs, &want, 0.0, [2e-13, 5e-7]);
        let far = run1("erfc", &[&t(DType::F64, &[2], &[15.0, 26.0])], Attrs::new());
        let f = far.to_f64_vec();
        for (g, w) in f
            .iter()
            .zip([7.212_994_172_451_207e-100, 5.663_192_408_856_143e-296])
        {
            assert!((g - w).abs() <= 2e-14 * w, "{g} vs {w}");
        }
        let e = run1(
            "erfc",
            &[&t(
                DType::F32,
                &[4],
                &[f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 30.0],
            )],
            Attrs::new(),
        );
        close(&e, &[0.0, 2.0, f64::NAN, 0.0], 0.0);
        let i = run1("erfc", &[&t(DType::I64, &[2], &[0.0, 1.0])], Attrs::new());
        assert_eq!(i.ty.dtype, DType::F32);
    }

    #[test]
    fn the_cot_derivative_polynomials_are_the_known_ones() {
        // d/dx cot = -(1 + c²); d²/dx² cot = 2c (1 + c²) = 2c + 2c³.
        assert_eq!(super::cot_derivative(0), vec![0.0, 1.0]);
        assert_eq!(super::cot_derivative(1), vec![-1.0, 0.0, -1.0]);
        assert_eq!(super::cot_derivative(2), vec![0.0, 2.0, 0.0, 2.0]);
    }
}
