//! Bessel functions of order 0 and 1: of the first and second kind, J and
//! Y (bessel_j0, bessel_j1, bessel_y0, bessel_y1); the modified ones, I
//! and K, plain and scaled (i0, i0e, i1, i1e, modified_bessel_k0,
//! modified_bessel_k1, scaled_modified_bessel_k0, scaled_modified_bessel_k1);
//! and the spherical j₀ (spherical_bessel_j0). Each promotes as torch does
//! (integers to the default float) and computes at f32 for bf16 and f16,
//! rounding once. I's gradients are built from the others; torch gives the
//! rest none.
//!
//! Every function splits its argument's range in three, each piece a fixed
//! graph, and selects: a power series near 0, a method for the middle, and
//! from a threshold T (9 at f32, 18 at f64; 12 and 20 for I) the large-
//! argument expansions, whose coefficients are Hankel's
//! a_k(ν) = Π_{j ≤ k} (4ν² - (2j - 1)²) / (k! 8^k). Each piece runs at its
//! argument clamped into its range, so the pieces not taken stay finite.
//! The series' lengths, the middle methods' sizes and T are chosen per
//! compute dtype so that each piece is within a few roundings over its
//! range (the tests measure it against mpmath). J and Y are accurate
//! absolutely near their zeros, as torch's are.

use super::attrs::Attrs;
use super::emit::Emitter;
use super::math::unary_in;
use super::support::{polynomial, sign};
use super::{Arity, OpDef};
use crate::error::Result;
use crate::ir::{BinaryOp, CompareOp, DType, UnaryOp, ValueId};

use std::f64::consts::PI;

/// Euler's constant γ.
const EULER_GAMMA: f64 = 0.577_215_664_901_532_9;

/// Hankel's a_k(ν), k < n: the large-argument expansions' coefficients.
fn hankel_coefficients(nu: u32, n: usize) -> Vec<f64> {
    let nu2 = 4.0 * f64::from(nu * nu);
    let mut out = Vec::with_capacity(n);
    let mut a = 1.0;
    for k in 0..n {
        out.push(a);
        let j = (k + 1) as f64;
        a *= (nu2 - (2.0 * j - 1.0).powi(2)) / (j * 8.0);
    }
    out
}

/// k! for k < n, and the harmonic numbers H_k = Σ_{j ≤ k} 1/j for k ≤ n.
fn factorials_and_harmonics(n: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut f, mut h) = (vec![1.0], vec![0.0]);
    for k in 1..=n {
        f.push(f[k - 1] * k as f64);
        h.push(h[k - 1] + 1.0 / k as f64);
    }
    (f, h)
}

/// c_k times (-1)^k.
fn alternating<'a>(c: impl Iterator<Item = &'a f64>) -> Vec<f64> {
    c.enumerate().map(|(k, c)| sign(k) * c).collect()
}

/// The power series of order ν (0 or 1) in q = x²/4, n terms, alternating
/// for J and Y and not for I and K (J_ν(x) is I_ν's series at -q):
/// (1 / (k! (k + ν)!), and the logarithmic solutions' H_k / k!² for ν = 0
/// or (H_k + H_(k+1) - 2γ) / (k! (k + 1)!) for ν = 1), each times (-1)^k
/// when `alternate`.
fn series_coefficients(nu: u32, n: usize, alternate: bool) -> (Vec<f64>, Vec<f64>) {
    let (f, h) = factorials_and_harmonics(n + 1);
    let s = |k: usize| if alternate { sign(k) } else { 1.0 };
    let nu = nu as usize;
    let plain = (0..n).map(|k| s(k) / (f[k] * f[k + nu])).collect();
    let logarithmic = (0..n)
        .map(|k| {
            let top = if nu == 0 {
                h[k]
            } else {
                h[k] + h[k + 1] - 2.0 * EULER_GAMMA
            };
            s(k) * top / (f[k] * f[k + nu])
        })
        .collect();
    (plain, logarithmic)
}

/// Where the series for J, Y and K stop (J's and Y's at 2, K's at 1).
const JY_SERIES_TO: f64 = 2.0;
const K_SERIES_TO: f64 = 1.0;

/// The per-dtype sizes: T, the power series' terms (J and Y, K), the
/// large-argument expansions' terms, the backward recurrence's start (an
/// even order) and the trapezoidal rule's step and points.
struct Sizes {
    t: f64,
    jy_series: usize,
    k_series: usize,
    hankel: usize,
    miller_from: u32,
    step: f64,
    points: u32,
}

fn sizes(ct: DType) -> Sizes {
    if ct == DType::F64 {
        Sizes {
            t: 18.0,
            jy_series: 14,
            k_series: 12,
            hankel: 24,
            miller_from: 50,
            step: 0.15,
            points: 30,
        }
    } else {
        Sizes {
            t: 9.0,
            jy_series: 9,
            k_series: 7,
            hankel: 10,
            miller_from: 24,
            step: 0.3,
            points: 14,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    J0,
    J1,
    Y0,
    Y1,
}

impl Kind {
    fn order(self) -> u32 {
        match self {
            Kind::J0 | Kind::Y0 => 0,
            Kind::J1 | Kind::Y1 => 1,
        }
    }
    fn second(self) -> bool {
        matches!(self, Kind::Y0 | Kind::Y1)
    }
}

/// J or Y at w in [0, 2] by the power series in q = w²/4:
/// J₀ = Σ (-q)^k / k!², J₁ = (w/2) Σ (-q)^k / (k! (k + 1)!),
/// Y₀ = (2/π) ((ln(w/2) + γ) J₀ - Σ_{k ≥ 1} H_k (-q)^k / k!²),
/// Y₁ = -2/(πw) + (2/π) ln(w/2) J₁ - (w/2π) Σ (H_k + H_{k+1} - 2γ) (-q)^k / (k! (k + 1)!).
/// Nothing cancels much: the terms are below 1 in size and the functions
/// above 0.2 in size where they are not near a zero.
fn jy_series(e: &mut Emitter, w: ValueId, n: usize, kind: Kind) -> Result<ValueId> {
    let (plain, logarithmic) = series_coefficients(kind.order(), n, true);
    let q = e.mul(w, w)?;
    let q = e.binary_scalar(BinaryOp::Mul, q, 0.25)?;
    let half = e.binary_scalar(BinaryOp::Mul, w, 0.5)?;
    let mut j = polynomial(e, q, &plain)?;
    if kind.order() == 1 {
        j = e.mul(j, half)?;
    }
    if !kind.second() {
        return Ok(j);
    }
    let log = e.unary(UnaryOp::Log, half)?;
    Ok(if kind == Kind::Y0 {
        // The sum is subtracted: added with its coefficients negated.
        let minus: Vec<f64> = logarithmic.iter().map(|c| -c).collect();
        let s = polynomial(e, q, &minus)?;
        let l = e.binary_scalar(BinaryOp::Add, log, EULER_GAMMA)?;
        let lj = e.mul(l, j)?;
        let y = e.add(lj, s)?;
        e.binary_scalar(BinaryOp::Mul, y, 2.0 / PI)?
    } else {
        let s = polynomial(e, q, &logarithmic)?;
        let s = e.mul(s, w)?;
        let s = e.binary_scalar(BinaryOp::Mul, s, 1.0 / (2.0 * PI))?;
        let lj = e.mul(log, j)?;
        let lj = e.binary_scalar(BinaryOp::Mul, lj, 2.0 / PI)?;
        let pole = e.full_like(w, -2.0 / PI)?;
        let pole = e.div(pole, w)?;
        let y = e.add(pole, lj)?;
        e.sub(y, s)?
    })
}

/// J or Y at m in [2, T] by Miller's backward recurrence: from J_N = 1 and
/// J_(N+1) = 0 (N = 50 at f64, 24 at f32), J_(k-1) = (2k/m) J_k - J_(k+1)
/// down to J₀, which gives the true values times one unknown factor (the
/// dominant solution swamps the error of the start); dividing by
/// J₀ + 2 Σ_{k ≥ 1} J_2k, which is 1, removes it. Y comes from Neumann's
/// series in the same values:
/// Y₀ = (2/π) ((ln(m/2) + γ) J₀ - 2 Σ_{k ≥ 1} (-1)^k J_2k / k),
/// Y₁ = (2/π) (-J₀/m + (ln(m/2) + γ - 1) J₁ - Σ_{k ≥ 1} (-1)^k (2k + 1) J_(2k+1) / (k (k + 1))).
/// Every eighth step rescales the running values by 1/(|J_k| + |J_(k+1)|),
/// so they grow no more than (2N/2)^8 between rescalings.
fn jy_recurrence(e: &mut Emitter, m: ValueId, top: u32, kind: Kind) -> Result<ValueId> {
    let one = e.full_like(m, 1.0)?;
    let two = e.full_like(m, 2.0)?;
    let inv = e.div(two, m)?;
    let mut above = e.full_like(m, 0.0)?; // J_(k+1)
    let mut at = e.full_like(m, 1.0)?; // J_k
    let mut evens = e.full_like(m, 0.0)?; // Σ_{k ≥ 1} J_2k
    let mut neumann = e.full_like(m, 0.0)?; // Y's sum
    for k in (1..=top).rev() {
        // Add J_k where it belongs.
        if k.is_multiple_of(2) {
            evens = e.add(evens, at)?;
        }
        let half = f64::from(k / 2);
        let coefficient = match kind {
            Kind::Y0 if k.is_multiple_of(2) => Some(-2.0 / half),
            Kind::Y1 if k % 2 == 1 && k >= 3 => Some((2.0 * half + 1.0) / (half * (half + 1.0))),
            _ => None,
        };
        if let Some(c) = coefficient {
            let c = if (k / 2).is_multiple_of(2) { c } else { -c };
            let term = e.binary_scalar(BinaryOp::Mul, at, c)?;
            neumann = e.add(neumann, term)?;
        }
        let factor = e.binary_scalar(BinaryOp::Mul, inv, f64::from(k))?;
        let grown = e.mul(factor, at)?;
        let below = e.sub(grown, above)?;
        above = at;
        at = below;
        if k % 8 == 1 && k > 1 {
            let a = e.unary(UnaryOp::Abs, at)?;
            let b = e.unary(UnaryOp::Abs, above)?;
            let size = e.add(a, b)?;
            let r = e.div(one, size)?;
            at = e.mul(at, r)?;
            above = e.mul(above, r)?;
            evens = e.mul(evens, r)?;
            neumann = e.mul(neumann, r)?;
        }
    }
    // at = J₀ and above = J₁, both times the unknown factor.
    let twice = e.binary_scalar(BinaryOp::Mul, evens, 2.0)?;
    let norm = e.add(at, twice)?;
    let scale = e.div(one, norm)?;
    let j0 = e.mul(at, scale)?;
    if kind == Kind::J0 {
        return Ok(j0);
    }
    let j1 = e.mul(above, scale)?;
    if kind == Kind::J1 {
        return Ok(j1);
    }
    let sum = e.mul(neumann, scale)?;
    let half = e.binary_scalar(BinaryOp::Mul, m, 0.5)?;
    let log = e.unary(UnaryOp::Log, half)?;
    let l = e.binary_scalar(BinaryOp::Add, log, EULER_GAMMA)?;
    let y = if kind == Kind::Y0 {
        let lj = e.mul(l, j0)?;
        e.add(lj, sum)?
    } else {
        let l1 = e.binary_scalar(BinaryOp::Sub, l, 1.0)?;
        let lj = e.mul(l1, j1)?;
        let pole = e.div(j0, m)?;
        let y = e.sub(lj, pole)?;
        e.sub(y, sum)?
    };
    e.binary_scalar(BinaryOp::Mul, y, 2.0 / PI)
}

/// J or Y at h ≥ T by Hankel's expansions: with χ = h - (2ν + 1)π/4,
/// J_ν = √(2/(πh)) (P cos χ - Q sin χ) and Y_ν = √(2/(πh)) (P sin χ + Q cos χ),
/// P = Σ (-1)^k a_2k(ν) / h^2k, Q = Σ (-1)^k a_(2k+1)(ν) / h^(2k+1).
/// cos χ and sin χ are taken from cos h and sin h (χ rounded would lose
/// h's low digits): for ν = 0, cos χ = (cos h + sin h)/√2 and
/// sin χ = (sin h - cos h)/√2; for ν = 1, cos χ = (sin h - cos h)/√2 and
/// sin χ = -(sin h + cos h)/√2.
fn jy_hankel(e: &mut Emitter, h: ValueId, n: usize, kind: Kind) -> Result<ValueId> {
    let a = hankel_coefficients(kind.order(), n);
    let even = alternating(a.iter().step_by(2));
    let odd = alternating(a.iter().skip(1).step_by(2));
    let one = e.full_like(h, 1.0)?;
    let inv = e.div(one, h)?;
    let inv2 = e.mul(inv, inv)?;
    let p = polynomial(e, inv2, &even)?;
    let q = polynomial(e, inv2, &odd)?;
    let q = e.mul(q, inv)?;
    let c = e.unary(UnaryOp::Cos, h)?;
    let s = e.unary(UnaryOp::Sin, h)?;
    let plus = e.add(s, c)?;
    let minus = e.sub(s, c)?;
    // (cos χ, sin χ) times √2.
    let (cos_chi, sin_chi) = if kind.order() == 0 {
        (plus, minus)
    } else {
        (minus, e.unary(UnaryOp::Neg, plus)?)
    };
    let (first, second) = if kind.second() {
        (sin_chi, cos_chi)
    } else {
        (cos_chi, e.unary(UnaryOp::Neg, sin_chi)?)
    };
    let pf = e.mul(p, first)?;
    let qs = e.mul(q, second)?;
    let sum = e.add(pf, qs)?;
    // √(2/(πh)) / √2 = √(1/(πh)).
    let amp = e.binary_scalar(BinaryOp::Mul, inv, 1.0 / PI)?;
    let amp = e.unary(UnaryOp::Sqrt, amp)?;
    e.mul(sum, amp)
}

/// J₀, J₁, Y₀ or Y₁ at v: the series below 2, the recurrence up to T,
/// Hankel's expansions from T. J₀ is even and J₁ odd; Y is NaN below 0 and
/// -inf at ±0 (as torch's); NaN stays NaN.
fn bessel_jy(e: &mut Emitter, v: ValueId, ct: DType, kind: Kind) -> Result<ValueId> {
    let sz = sizes(ct);
    let av = e.unary(UnaryOp::Abs, v)?;
    let w = e.binary_scalar(BinaryOp::Min, av, JY_SERIES_TO)?;
    let near = jy_series(e, w, sz.jy_series, kind)?;
    let m = e.binary_scalar(BinaryOp::Min, av, sz.t)?;
    let m = e.binary_scalar(BinaryOp::Max, m, JY_SERIES_TO)?;
    let middle = jy_recurrence(e, m, sz.miller_from, kind)?;
    let h = e.binary_scalar(BinaryOp::Max, av, sz.t)?;
    let far = jy_hankel(e, h, sz.hankel, kind)?;
    let in_middle = e.compare_scalar(CompareOp::Lt, av, sz.t)?;
    let y = e.select(in_middle, middle, far)?;
    let is_near = e.compare_scalar(CompareOp::Lt, av, JY_SERIES_TO)?;
    let mut y = e.select(is_near, near, y)?;
    let negative = e.compare_scalar(CompareOp::Lt, v, 0.0)?;
    if kind == Kind::J1 {
        let ny = e.unary(UnaryOp::Neg, y)?;
        y = e.select(negative, ny, y)?;
    }
    if kind.second() {
        return half_line_edges(e, v, y, f64::NEG_INFINITY);
    }
    keep_nan(e, v, y)
}

/// y, with v where v is NaN (the clamps may not carry NaN through).
fn keep_nan(e: &mut Emitter, v: ValueId, y: ValueId) -> Result<ValueId> {
    let nan = e.compare(CompareOp::Ne, v, v)?;
    e.select(nan, v, y)
}

/// The edges of a function of x > 0 (Y and K): `at_zero` at ±0, NaN
/// below 0, NaN kept.
fn half_line_edges(e: &mut Emitter, v: ValueId, y: ValueId, at_zero: f64) -> Result<ValueId> {
    let zero = e.compare_scalar(CompareOp::Eq, v, 0.0)?;
    let pole = e.full_like(v, at_zero)?;
    let y = e.select(zero, pole, y)?;
    let negative = e.compare_scalar(CompareOp::Lt, v, 0.0)?;
    let nan = e.full_like(v, f64::NAN)?;
    let y = e.select(negative, nan, y)?;
    keep_nan(e, v, y)
}

/// K_ν(w) for w in [0, 1] by the power series in q = w²/4:
/// K₀ = -(ln(w/2) + γ) I₀ + Σ H_k q^k / k!²,
/// K₁ = 1/w + ln(w/2) I₁ - (w/4) Σ (H_k + H_(k+1) - 2γ) q^k / (k! (k + 1)!).
fn k_series(e: &mut Emitter, w: ValueId, n: usize, nu: u32) -> Result<ValueId> {
    let (plain, logarithmic) = series_coefficients(nu, n, false);
    let q = e.mul(w, w)?;
    let q = e.binary_scalar(BinaryOp::Mul, q, 0.25)?;
    let half = e.binary_scalar(BinaryOp::Mul, w, 0.5)?;
    let log = e.unary(UnaryOp::Log, half)?;
    let i = polynomial(e, q, &plain)?;
    let s = polynomial(e, q, &logarithmic)?;
    let k = if nu == 0 {
        let l = e.binary_scalar(BinaryOp::Add, log, EULER_GAMMA)?;
        let li = e.mul(l, i)?;
        e.sub(s, li)?
    } else {
        let i1 = e.mul(i, half)?;
        let s = e.mul(s, w)?;
        let s = e.binary_scalar(BinaryOp::Mul, s, 0.25)?;
        let one = e.full_like(w, 1.0)?;
        let pole = e.div(one, w)?;
        let li = e.mul(log, i1)?;
        let k = e.add(pole, li)?;
        e.sub(k, s)?
    };
    Ok(k)
}

/// e^m K_ν(m) for m in [1, T] by the trapezoidal rule on
/// e^m K_ν(m) = ∫_0^∞ e^(-m (cosh t - 1)) cosh(νt) dt with step s and n
/// points: s (1/2 + Σ_{0<k<n} cosh(νks) e^(-m (cosh(ks) - 1))). The
/// integrand is analytic and decays double-exponentially, so the rule's
/// error falls like e^(-2π²/(s² m)) and the cut where the terms reach the
/// rounding at m = 1.
fn k_trapezoid(e: &mut Emitter, m: ValueId, step: f64, points: u32, nu: u32) -> Result<ValueId> {
    let mut sum = e.full_like(m, 0.5)?;
    for k in 1..points {
        let t = f64::from(k) * step;
        let decay = e.binary_scalar(BinaryOp::Mul, m, -(t.cosh() - 1.0))?;
        let term = e.unary(UnaryOp::Exp, decay)?;
        let term = if nu == 0 {
            term
        } else {
            e.binary_scalar(BinaryOp::Mul, term, (f64::from(nu) * t).cosh())?
        };
        sum = e.add(sum, term)?;
    }
    e.binary_scalar(BinaryOp::Mul, sum, step)
}

/// e^g K_ν(g) for g ≥ T: √(π/(2g)) Σ a_k(ν) / g^k.
fn k_asymptotic(e: &mut Emitter, g: ValueId, n: usize, nu: u32) -> Result<ValueId> {
    let a = hankel_coefficients(nu, n);
    let one = e.full_like(g, 1.0)?;
    let inv = e.div(one, g)?;
    let s = polynomial(e, inv, &a)?;
    let amp = e.binary_scalar(BinaryOp::Mul, inv, PI / 2.0)?;
    let amp = e.unary(UnaryOp::Sqrt, amp)?;
    e.mul(s, amp)
}

/// K_ν(v), or e^v K_ν(v) when `scaled`: the series below 1 (for K), the
/// trapezoidal rule up to T and the asymptotic series from T (for e^v K;
/// K is it times e^-v, which underflows only where K does). As torch's:
/// +inf at ±0, NaN below 0; NaN stays NaN.
fn bessel_k(e: &mut Emitter, v: ValueId, ct: DType, nu: u32, scaled: bool) -> Result<ValueId> {
    let sz = sizes(ct);
    // The plain value times e^w, the scaled ones times e^-m and e^-g.
    let rescale = |e: &mut Emitter, y: ValueId, at: ValueId, up: bool| -> Result<ValueId> {
        let at = if up { at } else { e.unary(UnaryOp::Neg, at)? };
        let f = e.unary(UnaryOp::Exp, at)?;
        e.mul(y, f)
    };
    let w = e.binary_scalar(BinaryOp::Min, v, K_SERIES_TO)?;
    let mut near = k_series(e, w, sz.k_series, nu)?;
    let m = e.binary_scalar(BinaryOp::Min, v, sz.t)?;
    let m = e.binary_scalar(BinaryOp::Max, m, K_SERIES_TO)?;
    let mut middle = k_trapezoid(e, m, sz.step, sz.points, nu)?;
    let g = e.binary_scalar(BinaryOp::Max, v, sz.t)?;
    let mut far = k_asymptotic(e, g, sz.hankel, nu)?;
    if scaled {
        near = rescale(e, near, w, true)?;
    } else {
        middle = rescale(e, middle, m, false)?;
        far = rescale(e, far, g, false)?;
    }
    let in_middle = e.compare_scalar(CompareOp::Lt, v, sz.t)?;
    let y = e.select(in_middle, middle, far)?;
    let is_near = e.compare_scalar(CompareOp::Lt, v, K_SERIES_TO)?;
    let y = e.select(is_near, near, y)?;
    half_line_edges(e, v, y, f64::INFINITY)
}

/// j₀(x) = sin(x)/x, by its series Σ (-x²)^k / (2k + 1)! below |x| = 1/2
/// (so 1 at 0); 0 at ±inf, as torch's.
fn spherical_j0(e: &mut Emitter, v: ValueId, ct: DType) -> Result<ValueId> {
    let n = if ct == DType::F64 { 9 } else { 5 };
    let mut c = Vec::with_capacity(n);
    let mut f = 1.0;
    for k in 0..n {
        c.push(sign(k) / f);
        f *= ((2 * k + 2) * (2 * k + 3)) as f64;
    }
    let x2 = e.mul(v, v)?;
    let near = polynomial(e, x2, &c)?;
    let s = e.unary(UnaryOp::Sin, v)?;
    let far = e.div(s, v)?;
    let av = e.unary(UnaryOp::Abs, v)?;
    let small = e.compare_scalar(CompareOp::Lt, av, 0.5)?;
    let y = e.select(small, near, far)?;
    let infinite = e.compare_scalar(CompareOp::Eq, av, f64::INFINITY)?;
    let zero = e.full_like(v, 0.0)?;
    e.select(infinite, zero, y)
}

/// The modified Bessel function of the first kind of order `nu` (0 or
/// 1), I_ν(x), or e^-|x| I_ν(x) when `scaled`. Below T (12 at f32, 20 at
/// f64) the power series I_ν(x) = (x/2)^ν Σ_k (x²/4)^k / (k! (k + ν)!),
/// whose terms are all positive (nothing cancels), summed until the first
/// omitted term at T is below the dtype's rounding; from T the asymptotic
/// series e^|x| / sqrt(2π|x|) Σ_k (-1)^k a_k / |x|^k with
/// Hankel's a_k, cut where its terms at T
/// are below the rounding (the series diverges past its smallest term,
/// near k = 2|x|, which T keeps small enough). The exponential is taken as
/// one e^(|x| - ln(2π|x|)/2), so I overflows only where it should. I₁ is
/// odd.
fn bessel_i(e: &mut Emitter, v: ValueId, ct: DType, nu: u32, scaled: bool) -> Result<ValueId> {
    let (t, k_series, k_asym) = if ct == DType::F64 {
        (20.0, 36, 28)
    } else {
        (12.0, 19, 9)
    };
    let nu_f = f64::from(nu);
    // 1 / (k! (k + ν)!), and (-1)^k a_k.
    let mut series = Vec::with_capacity(k_series);
    let mut c = 1.0;
    for k in 0..k_series {
        series.push(c);
        let k1 = (k + 1) as f64;
        c /= k1 * (k1 + nu_f);
    }
    let asym = alternating(hankel_coefficients(nu, k_asym).iter());
    let av = e.unary(UnaryOp::Abs, v)?;
    let small = e.compare_scalar(CompareOp::Lt, av, t)?;
    // The series at min(|x|, T), the asymptotic one at max(|x|, T), so the
    // branch not taken stays finite.
    let ws = e.binary_scalar(BinaryOp::Min, av, t)?;
    let q = e.mul(ws, ws)?;
    let q = e.binary_scalar(BinaryOp::Mul, q, 0.25)?;
    let mut near = polynomial(e, q, &series)?;
    if nu == 1 {
        let half = e.binary_scalar(BinaryOp::Mul, ws, 0.5)?;
        near = e.mul(near, half)?;
    }
    if scaled {
        let m = e.unary(UnaryOp::Neg, ws)?;
        let decay = e.unary(UnaryOp::Exp, m)?;
        near = e.mul(near, decay)?;
    }
    let wa = e.binary_scalar(BinaryOp::Max, av, t)?;
    let inv = e.full_like(wa, 1.0)?;
    let inv = e.div(inv, wa)?;
    let sum = polynomial(e, inv, &asym)?;
    let two_pi_w = e.binary_scalar(BinaryOp::Mul, wa, 2.0 * PI)?;
    let far = if scaled {
        let r = e.unary(UnaryOp::Rsqrt, two_pi_w)?;
        e.mul(sum, r)?
    } else {
        let l = e.unary(UnaryOp::Log, two_pi_w)?;
        let l = e.binary_scalar(BinaryOp::Mul, l, 0.5)?;
        let p = e.sub(wa, l)?;
        let g = e.unary(UnaryOp::Exp, p)?;
        let far = e.mul(sum, g)?;
        // At infinity that exponent is inf - inf.
        let infinite = e.compare_scalar(CompareOp::Eq, av, f64::INFINITY)?;
        let inf = e.full_like(av, f64::INFINITY)?;
        e.select(infinite, inf, far)?
    };
    let y = e.select(small, near, far)?;
    if nu == 0 {
        return Ok(y);
    }
    let negative = e.compare_scalar(CompareOp::Lt, v, 0.0)?;
    let ny = e.unary(UnaryOp::Neg, y)?;
    e.select(negative, ny, y)
}

fn i0(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, ct| bessel_i(e, v, ct, 0, false))
}
fn i0e(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, ct| bessel_i(e, v, ct, 0, true))
}
fn i1(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, ct| bessel_i(e, v, ct, 1, false))
}
fn i1e(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, ct| bessel_i(e, v, ct, 1, true))
}

fn bessel_j0(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, ct| bessel_jy(e, v, ct, Kind::J0))
}
fn bessel_j1(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, ct| bessel_jy(e, v, ct, Kind::J1))
}
fn bessel_y0(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, ct| bessel_jy(e, v, ct, Kind::Y0))
}
fn bessel_y1(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, ct| bessel_jy(e, v, ct, Kind::Y1))
}
fn modified_bessel_k0(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, ct| bessel_k(e, v, ct, 0, false))
}
fn modified_bessel_k1(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, ct| bessel_k(e, v, ct, 1, false))
}
fn scaled_modified_bessel_k0(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, ct| bessel_k(e, v, ct, 0, true))
}
fn scaled_modified_bessel_k1(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, ct| bessel_k(e, v, ct, 1, true))
}
fn spherical_bessel_j0(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, spherical_j0)
}

pub(super) const OPS: &[OpDef] = &[
    def!("i0", Arity::Exactly(1), i0),
    def!("i0e", Arity::Exactly(1), i0e),
    def!("i1", Arity::Exactly(1), i1),
    def!("i1e", Arity::Exactly(1), i1e),
    def!("bessel_j0", Arity::Exactly(1), bessel_j0),
    def!("bessel_j1", Arity::Exactly(1), bessel_j1),
    def!("bessel_y0", Arity::Exactly(1), bessel_y0),
    def!("bessel_y1", Arity::Exactly(1), bessel_y1),
    def!("modified_bessel_k0", Arity::Exactly(1), modified_bessel_k0),
    def!("modified_bessel_k1", Arity::Exactly(1), modified_bessel_k1),
    def!(
        "scaled_modified_bessel_k0",
        Arity::Exactly(1),
        scaled_modified_bessel_k0
    ),
    def!(
        "scaled_modified_bessel_k1",
        Arity::Exactly(1),
        scaled_modified_bessel_k1
    ),
    def!(
        "spherical_bessel_j0",
        Arity::Exactly(1),
        spherical_bessel_j0
    ),
];

#[cfg(test)]
mod tests {
    use super::super::tests::{matches, run1, t};
    use crate::ir::DType;
    use crate::ops::attrs::Attrs;

    /// I₀ and I₁, plain and scaled, on both sides of the switch to the
    /// asymptotic series (12 at f32, 20 at f64) and far past it, against
    /// the power series summed to 400 terms in f64 (all terms positive, so
    /// accurate to a few roundings up to |x| = 60); the plain ones overflow
    /// to infinity only past f32's and f64's range; NaN stays NaN.
    #[test]
    fn bessel_i_matches_its_series() {
        let xs = [
            -45.0, -19.9, -3.0, -1e-3, 0.0, 0.5, 1.0, 5.0, 11.9, 12.1, 19.99, 20.01, 33.0, 60.0,
        ];
        let series = |x: f64, nu: i32| {
            let q = x * x / 4.0;
            let (mut term, mut sum) = (if nu == 1 { x / 2.0 } else { 1.0 }, 0.0);
            for k in 0..400 {
                sum += term;
                let k1 = f64::from(k + 1);
                term *= q / (k1 * (k1 + f64::from(nu)));
            }
            sum
        };
        for (op, nu, scaled) in [
            ("i0", 0, false),
            ("i0e", 0, true),
            ("i1", 1, false),
            ("i1e", 1, true),
        ] {
            let want: Vec<f64> = xs
                .iter()
                .map(|&x| series(x, nu) * if scaled { (-x.abs()).exp() } else { 1.0 })
                .collect();
            matches(
                op,
                Attrs::new(),
                &xs[..13],
                &want[..13],
                1e-300,
                [1e-14, 2e-6],
            );
            // x = 60: I is 5.8e24, within f32's range.
            matches(
                op,
                Attrs::new(),
                &xs[13..],
                &want[13..],
                1e-300,
                [1e-14, 2e-6],
            );
        }
        let big = t(DType::F32, &[4], &[100.0, -100.0, f64::INFINITY, f64::NAN]);
        let i1 = run1("i1", &[&big], Attrs::new()).to_f64_vec();
        assert!(i1[0] == f64::INFINITY && i1[1] == f64::NEG_INFINITY && i1[2] == f64::INFINITY);
        assert!(i1[3].is_nan());
        let i0e = run1("i0e", &[&big], Attrs::new()).to_f64_vec();
        assert!(
            (i0e[0] - 0.039_944_379_299_096_68).abs() < 1e-8 && i0e[2] == 0.0,
            "{i0e:?}"
        );
        let f64_big = t(DType::F64, &[2], &[700.0, 713.0]);
        let i0 = run1("i0", &[&f64_big], Attrs::new()).to_f64_vec();
        assert!(i0.iter().all(|v| v.is_finite()), "{i0:?}");
    }

    /// J₀, J₁, Y₀ and Y₁ against mpmath (40 digits) in each of the three
    /// ranges and on both sides of each switch (2, and T: 9 at f32, 18 at
    /// f64), absolutely (they are accurate absolutely near their zeros);
    /// J₀ is even and J₁ odd.
    #[test]
    fn bessel_j_and_y_match_mpmath() {
        let xs = [
            7.62939453125e-06,
            0.3125,
            1.0,
            1.9921875,
            2.0078125,
            2.5,
            5.0,
            8.875,
            9.125,
            12.0,
            17.875,
            18.125,
            30.0,
            100.0,
            1000.5,
        ];
        let j0 = [
            0.9999999999854481,
            0.9757345455082597,
            0.7651976865579666,
            0.2283983773924619,
            0.21938711589831547,
            -0.048383776468198,
            -0.1775967713143383,
            -0.058826942986442685,
            -0.12000576435426509,
            0.047689310796833535,
            -0.03677133046521732,
            0.01010536512820763,
            -0.08636798358104021,
            0.019985850304223122,
            0.01948655998713014,
        ];
        let j1 = [
            3.8146972655972444e-06,
            0.15435039661806307,
            0.4400505857449335,
            0.5772162689403747,
            0.5762089138241774,
            0.49709410246427405,
            -0.32757913759146523,
            0.25817656640734954,
            0.22886967889107687,
            -0.2234471044906276,
            -0.18616494955277527,
            -0.18689771069256828,
            -0.11875106261662294,
            -0.07714535201411216,
            0.016027715373203338,
        ];
        let y0 = [
            -7.575414700179341,
            -0.7791293535383431,
            0.08825696421567696,
            0.509522257160029,
            0.5111946709578596,
            0.4980703596152319,
            -0.30851762524903376,
            0.2610740401002152,
            0.23507963768608373,
            -0.22523731263436145,
            -0.18506512531146987,
            -0.1871054090546883,
            -0.11729573168666403,
            -0.07724431336508315,
            0.016017974964604328,
        ];
        let y1 = [
            -83443.02683387579,
            -2.2110954318911276,
            -0.7812128213002887,
            -0.11144397923426975,
            -0.10263319301062042,
            0.1459181379667858,
            0.14786314339122683,
            0.07358203344038453,
            0.1330265199451248,
            -0.05709921826089652,
            0.03161301013940446,
            -0.015266830783491728,
            0.08442557066174723,
            -0.020372312002759792,
            -0.019478557437521776,
        ];
        for (op, want) in [
            ("bessel_j0", j0),
            ("bessel_j1", j1),
            ("bessel_y0", y0),
            ("bessel_y1", y1),
        ] {
            // Y₁ and Y₀ are large near 0: relative there.
            matches(op, Attrs::new(), &xs, &want, 1.0, [1e-15, 4e-7]);
        }
        let neg: Vec<f64> = xs.iter().map(|x| -x).collect();
        matches("bessel_j0", Attrs::new(), &neg, &j0, 1.0, [1e-15, 4e-7]);
        let minus_j1: Vec<f64> = j1.iter().map(|x| -x).collect();
        matches(
            "bessel_j1",
            Attrs::new(),
            &neg,
            &minus_j1,
            1.0,
            [1e-15, 4e-7],
        );
    }

    /// e^x K₀(x) and e^x K₁(x) against mpmath (40 digits), relatively, in
    /// each range (the series below 1, the trapezoidal rule to T, the
    /// asymptotic series) and from 1e-30 to 1e5; the plain K is e^-x times
    /// them.
    #[test]
    fn bessel_k_matches_mpmath() {
        let xs = [
            7.888609052210118e-31,
            7.62939453125e-06,
            0.3125,
            0.9921875,
            1.0078125,
            3.0,
            8.875,
            9.125,
            17.875,
            18.125,
            50.0,
            700.0,
            100000.0,
        ];
        let k0e = [
            69.43064957165295,
            11.899524371185036,
            1.8249191333381414,
            1.1483244501169352,
            1.1406415530501919,
            0.6977615980438517,
            0.4151154633648521,
            0.40953239744119274,
            0.29442879286137735,
            0.2924179581195275,
            0.17680715585742934,
            0.04736236945461357,
            0.003963322343474756,
        ];
        let k1e = [
            1.2676506002282294e+30,
            131072.99995651425,
            3.9873008671566423,
            1.6451600384005494,
            1.6272768150298282,
            0.8065634801287869,
            0.4379070227523859,
            0.43141563725128,
            0.30255531580572875,
            0.30037905841809986,
            0.17856655855881556,
            0.04739618765349454,
            0.003963342160036932,
        ];
        matches(
            "scaled_modified_bessel_k0",
            Attrs::new(),
            &xs,
            &k0e,
            0.0,
            [2e-15, 4e-7],
        );
        matches(
            "scaled_modified_bessel_k1",
            Attrs::new(),
            &xs,
            &k1e,
            0.0,
            [2e-15, 4e-7],
        );
        // The plain ones where e^-x stays normal in f32.
        let k0: Vec<f64> = xs.iter().zip(&k0e).map(|(x, k)| k * (-x).exp()).collect();
        let k1: Vec<f64> = xs.iter().zip(&k1e).map(|(x, k)| k * (-x).exp()).collect();
        matches(
            "modified_bessel_k0",
            Attrs::new(),
            &xs[..11],
            &k0[..11],
            0.0,
            [2e-15, 4e-7],
        );
        matches(
            "modified_bessel_k1",
            Attrs::new(),
            &xs[..11],
            &k1[..11],
            0.0,
            [2e-15, 4e-7],
        );
    }

    /// The edges, as torch's: Y is -inf at ±0 and NaN below 0, K +inf at
    /// ±0 and NaN below 0, J and Y NaN at ±inf, K 0 at +inf, the spherical
    /// j₀ 1 at 0 and 0 at ±inf; NaN stays NaN everywhere.
    #[test]
    fn bessel_edges_are_torchs() {
        let inf = f64::INFINITY;
        let xs = [0.0, -0.0, -1.0, inf, -inf, f64::NAN];
        let nan = f64::NAN;
        for dt in [DType::F64, DType::F32] {
            let x = t(dt, &[6], &xs);
            for (op, want) in [
                (
                    "bessel_j0",
                    [1.0, 1.0, 0.765_197_686_557_966_6, nan, nan, nan],
                ),
                (
                    "bessel_j1",
                    [0.0, 0.0, -0.440_050_585_744_933_5, nan, nan, nan],
                ),
                ("bessel_y0", [-inf, -inf, nan, nan, nan, nan]),
                ("bessel_y1", [-inf, -inf, nan, nan, nan, nan]),
                ("modified_bessel_k0", [inf, inf, nan, 0.0, nan, nan]),
                ("scaled_modified_bessel_k1", [inf, inf, nan, 0.0, nan, nan]),
                (
                    "spherical_bessel_j0",
                    [1.0, 1.0, 0.841_470_984_807_896_5, 0.0, 0.0, nan],
                ),
            ] {
                let got = run1(op, &[&x], Attrs::new()).to_f64_vec();
                for (i, (g, w)) in got.iter().zip(want).enumerate() {
                    let ok = (g.is_nan() && w.is_nan())
                        || (g - w).abs() <= 1e-6 * w.abs().max(1e-300)
                        || *g == w;
                    assert!(ok, "{op} {dt:?} at {}: got {g}, want {w}", xs[i]);
                }
            }
        }
    }

    /// sin(x)/x against its own quotient in f64 where that is accurate, and
    /// near 0 against the series.
    #[test]
    fn spherical_j0_matches_sin_over_x() {
        let xs = [1e-20, 1e-4, 0.1, 0.49, 0.51, 1.0, 3.0, 100.0, -7.5];
        let want: Vec<f64> = xs
            .iter()
            .map(|&x: &f64| {
                if x.abs() < 1e-3 {
                    1.0 - x * x / 6.0
                } else {
                    x.sin() / x
                }
            })
            .collect();
        matches(
            "spherical_bessel_j0",
            Attrs::new(),
            &xs,
            &want,
            1e-3,
            [4e-16, 2e-7],
        );
    }
}
