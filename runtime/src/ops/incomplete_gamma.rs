//! The regularized incomplete gamma functions: igamma, the lower
//! P(a, x) = γ(a, x) / Γ(a) (torch.special.gammainc), and igammac, the upper
//! Q(a, x) = Γ(a, x) / Γ(a) = 1 - P (torch.special.gammaincc); and
//! standard_gamma_grad, dx/da of a Gamma(a) sample x (torch's
//! `_standard_gamma_grad`), from the same pieces carried in forward mode.
//! Each promotes as torch does and computes at f32 for bf16 and f16,
//! rounding once.
//!
//! Both come from one graph that splits the (a, x) quadrant in four pieces,
//! each a fixed number of steps, and selects per element:
//!
//! - a > 20 and 0.6 ≤ x/a ≤ 1.4, where the series and the fraction below
//!   would need O(√a) steps: Temme's uniform expansion,
//!   Q = erfc(η √(a/2)) / 2 + e^(-aη²/2) / √(2πa) Σ_k C_k(η) a^-k and
//!   P = erfc(-η √(a/2)) / 2 - the same sum, with η²/2 = λ - 1 - ln λ at
//!   λ = x/a (η of λ - 1's sign). The Taylor coefficients of C_k come from
//!   their recurrence when the graph is built, not from a table:
//!   λ - 1 as a series in η (from (λ - 1) dλ/dη = η λ), then
//!   C_0 = 1/(λ - 1) - 1/η and C_k = C'_(k-1) / η + (-1)^k γ_k / (λ - 1),
//!   with γ_k the coefficients of Γ*(a) = Γ(a) / (√(2π/a) (a/e)^a), the
//!   exponential of Stirling's series.
//! - x > 1.1 and x ≥ a + 1: Q by Legendre's continued fraction, evaluated
//!   from its tail; P = 1 - Q.
//! - elsewhere P by its power series,
//!   P = x^a e^-x / Γ(a + 1) Σ_n x^n / ((a + 1) ... (a + n)), and Q = 1 - P,
//!   except where x ≤ 1.1 and Q is small (a small): there
//!   Q = -expm1(a ln x - ln Γ(1 + a)) - x^a / Γ(a + 1) · a Σ_(n≥1) (-x)^n /
//!   (n! (a + n)), which keeps Q's relative accuracy, with ln Γ(1 + a) by its
//!   Taylor series (coefficients (-1)^k (ζ(k) - 1) / k, ζ computed at build).
//!
//! The factor x^a e^-x / Γ(a + 1) is taken from Stirling's form from a = 10,
//! e^(-a (λ - 1 - ln λ) - S(a)) / √(2πa), so it does not cancel large
//! logarithms, and λ - 1 - ln λ near λ = 1 from an atanh series in
//! s = (λ - 1)/(λ + 1) that keeps its relative accuracy.
//!
//! Edges as torch's: NaN for a < 0, x < 0, a = x = 0 and a = x = inf;
//! P(0, x > 0) = 1, P(a, 0) = 0, P(a, inf) = 1, P(inf, x) = 0.

use super::attrs::Attrs;
use super::emit::Emitter;
use super::math::binary_in;
use super::special::{
    digamma_half_up, erfc_of, lgamma_half_up, DIGAMMA, EULER_MACLAURIN, STIRLING,
};
use super::support::{polynomial, sign};
use super::{Arity, OpDef};
use crate::error::Result;
use crate::ir::{BinaryOp, CompareOp, DType, UnaryOp, ValueId};

use std::f64::consts::PI;

/// Euler's constant γ.
const EULER_GAMMA: f64 = 0.577_215_664_901_532_9;

/// Temme's expansion serves a above this, for x/a in `TEMME_BAND`.
const TEMME_FROM: f64 = 20.0;
const TEMME_BAND: (f64, f64) = (0.6, 1.4);

/// The continued fraction serves x above this (and x ≥ a + 1).
const FRACTION_FROM: f64 = 1.1;

/// Stirling's form of the factor x^a e^-x / Γ(a + 1) from this a.
const STIRLING_FACTOR_FROM: f64 = 10.0;

/// The pieces' sizes per compute dtype, each chosen so the piece is within
/// a few roundings over its region (measured against mpmath in the tests
/// and in the binding's).
struct Sizes {
    /// Terms of P's power series (a ≤ 20 and x < a + 1 is its worst case).
    series: usize,
    /// Steps of the continued fraction (x just above 1.1 with a small).
    fraction: usize,
    /// Temme's C_k kept, and the Taylor terms of each.
    temme_k: usize,
    temme_n: usize,
    /// Taylor terms of ln Γ(1 + b), |b| ≤ 1/2, and terms of Q's small-x
    /// series.
    lgamma1p: usize,
    small_x: usize,
    /// Terms of the atanh series for λ - 1 - ln λ.
    atanh: usize,
}

fn sizes(ct: DType) -> Sizes {
    if ct == DType::F64 {
        Sizes {
            series: 64,
            fraction: 60,
            temme_k: 10,
            temme_n: 25,
            lgamma1p: 26,
            small_x: 20,
            atanh: 14,
        }
    } else {
        Sizes {
            series: 36,
            fraction: 30,
            temme_k: 5,
            temme_n: 12,
            lgamma1p: 12,
            small_x: 11,
            atanh: 7,
        }
    }
}

/// γ_k, k < n: Γ*(a) ~ Σ γ_k a^-k, the exponential of Stirling's series
/// Σ_j B(2j) / (2j (2j - 1)) a^-(2j-1) (g' = s' g, term by term).
fn gamma_star_coefficients(n: usize) -> Vec<f64> {
    let mut s = vec![0.0; n];
    for (j, &c) in STIRLING.iter().enumerate() {
        if 2 * j + 1 < n {
            s[2 * j + 1] = c;
        }
    }
    let mut g = vec![0.0; n];
    g[0] = 1.0;
    for m in 1..n {
        g[m] = (1..=m).map(|k| k as f64 * s[k] * g[m - k]).sum::<f64>() / m as f64;
    }
    g
}

/// b_m, m ≤ n, with λ - 1 = Σ b_m η^m (b_0 = 0, b_1 = 1): from
/// (λ - 1) dλ/dη = η λ, whose η^m coefficient gives
/// (m + 1) b_m = b_(m-1) - Σ_(2 ≤ i < m) (m + 1 - i) b_i b_(m+1-i).
fn lambda_coefficients(n: usize) -> Vec<f64> {
    let mut b = vec![0.0; n + 1];
    b[1] = 1.0;
    for m in 2..=n {
        let cross: f64 = (2..m)
            .map(|i| (m + 1 - i) as f64 * b[i] * b[m + 1 - i])
            .sum();
        b[m] = (b[m - 1] - cross) / (m + 1) as f64;
    }
    b
}

/// The Taylor coefficients in η of C_k(η), k < kmax, n each.
fn temme_coefficients(kmax: usize, n: usize) -> Vec<Vec<f64>> {
    let m = n + 2 * kmax + 2;
    let b = lambda_coefficients(m + 1);
    // 1/(λ - 1) = (1/η) Σ r_j η^j, the reciprocal of Σ b_(j+1) η^j.
    let mut r = vec![0.0; m + 1];
    r[0] = 1.0;
    for j in 1..=m {
        r[j] = -(1..=j).map(|i| b[i + 1] * r[j - i]).sum::<f64>();
    }
    let g = gamma_star_coefficients(kmax + 1);
    // C_0 = 1/(λ - 1) - 1/η.
    let mut c: Vec<f64> = r[1..].to_vec();
    let mut out = vec![c[..n].to_vec()];
    for (k, gk) in g.iter().enumerate().take(kmax).skip(1) {
        // C'/η has η^j coefficient (j + 2) c_(j+2); its 1/η term, c_1,
        // cancels (-1)^k γ_k r_0 / η.
        c = (0..c.len() - 2)
            .map(|j| (j + 2) as f64 * c[j + 2] + sign(k) * gk * r[j + 1])
            .collect();
        out.push(c[..n].to_vec());
    }
    out
}

/// ζ(k) - 1 for k ≥ 2: the terms 2 .. 9 and Euler–Maclaurin at 10.
fn zeta_minus_one(k: usize) -> f64 {
    let s = k as f64;
    let n = 10.0_f64;
    let mut sum: f64 = (2..10).rev().map(|j| f64::from(j).powf(-s)).sum();
    sum += n.powf(1.0 - s) / (s - 1.0) + n.powf(-s) / 2.0;
    let mut rising = s;
    for (i, b) in EULER_MACLAURIN.iter().enumerate() {
        if i > 0 {
            let j = 2.0 * i as f64;
            rising *= (s + j - 1.0) * (s + j);
        }
        sum += b * rising * n.powf(-s - 2.0 * i as f64 - 1.0);
    }
    sum
}

/// λ - 1 - ln λ from μ = λ - 1 and λ: near λ = 1 (|μ| < 1/2) as
/// μ s - 2 Σ_(j≥1) s^(2j+1) / (2j + 1) with s = μ / (2 + μ) (ln λ =
/// 2 atanh s, and μ - 2s = μ s), elsewhere directly.
fn log_gap(e: &mut Emitter, mu: ValueId, lambda: ValueId, terms: usize) -> Result<ValueId> {
    let two_mu = e.binary_scalar(BinaryOp::Add, mu, 2.0)?;
    let s = e.div(mu, two_mu)?;
    let s2 = e.mul(s, s)?;
    let c: Vec<f64> = (1..=terms).map(|j| 2.0 / (2 * j + 1) as f64).collect();
    let tail = polynomial(e, s2, &c)?;
    let tail = e.mul(tail, s2)?;
    let tail = e.mul(tail, s)?;
    let head = e.mul(mu, s)?;
    let near = e.sub(head, tail)?;
    let ln = e.unary(UnaryOp::Log, lambda)?;
    let far = e.sub(mu, ln)?;
    let am = e.unary(UnaryOp::Abs, mu)?;
    let close = e.compare_scalar(CompareOp::Lt, am, 0.5)?;
    e.select(close, near, far)
}

/// Stirling's series S(a) = ln Γ*(a) for a ≥ 10.
fn stirling_series(e: &mut Emitter, inv: ValueId) -> Result<ValueId> {
    let inv2 = e.mul(inv, inv)?;
    let s = polynomial(e, inv2, &STIRLING)?;
    e.mul(s, inv)
}

/// ln Γ(1 + a) for 0 ≤ a ≤ 3/2 to its relative accuracy near a = 0: the
/// Taylor series T(b) = -log1p(b) + (1 - γ) b + Σ_(k≥2) (-1)^k
/// (ζ(k) - 1)/k b^k at b = a, or at b = a - 1 plus ln a above 1/2.
fn lgamma1p(e: &mut Emitter, a: ValueId, terms: usize) -> Result<ValueId> {
    let high = e.compare_scalar(CompareOp::Gt, a, 0.5)?;
    let shifted = e.binary_scalar(BinaryOp::Sub, a, 1.0)?;
    let b = e.select(high, shifted, a)?;
    let c: Vec<f64> = (2..terms + 2)
        .map(|k| sign(k) * zeta_minus_one(k) / k as f64)
        .collect();
    let series = polynomial(e, b, &c)?;
    let b2 = e.mul(b, b)?;
    let series = e.mul(series, b2)?;
    let lin = e.binary_scalar(BinaryOp::Mul, b, 1.0 - EULER_GAMMA)?;
    let l1p = e.unary(UnaryOp::Log1p, b)?;
    let t = e.sub(lin, l1p)?;
    let t = e.add(t, series)?;
    let la = e.unary(UnaryOp::Log, a)?;
    let zero = e.full_like(a, 0.0)?;
    let la = e.select(high, la, zero)?;
    e.add(t, la)
}

/// P's power series Σ_n x^n / ((a + 1) ... (a + n)), n < `terms`.
fn lower_series(e: &mut Emitter, a: ValueId, x: ValueId, terms: usize) -> Result<ValueId> {
    let mut term = e.full_like(a, 1.0)?;
    let mut sum = term;
    for k in 1..terms {
        let ak = e.binary_scalar(BinaryOp::Add, a, k as f64)?;
        let r = e.div(x, ak)?;
        term = e.mul(term, r)?;
        sum = e.add(sum, term)?;
    }
    Ok(sum)
}

/// Legendre's continued fraction for Γ(a, x) e^x x^-a,
/// 1 / (x + 1 - a - 1(1 - a) / (x + 3 - a - 2(2 - a) / (x + 5 - a - ...))),
/// evaluated from its `steps`-th level up.
fn upper_fraction(e: &mut Emitter, a: ValueId, x: ValueId, steps: usize) -> Result<ValueId> {
    let xma = e.sub(x, a)?;
    let mut t = e.full_like(a, 0.0)?;
    for k in (1..=steps).rev() {
        let kf = k as f64;
        let num = e.binary_scalar(BinaryOp::Mul, a, -kf)?;
        let num = e.binary_scalar(BinaryOp::Add, num, kf * kf)?;
        let den = e.binary_scalar(BinaryOp::Add, xma, 2.0 * kf + 1.0)?;
        let den = e.sub(den, t)?;
        t = e.div(num, den)?;
    }
    let den = e.binary_scalar(BinaryOp::Add, xma, 1.0)?;
    let den = e.sub(den, t)?;
    let one = e.full_like(a, 1.0)?;
    e.div(one, den)
}

/// Q for small x (≤ 1.1) to its relative accuracy where it is small:
/// -expm1(u) - e^u a Σ_(n≥1) (-x)^n / (n! (a + n)), u = a ln x - ln Γ(1 + a).
fn upper_small_x(e: &mut Emitter, a: ValueId, x: ValueId, s: &Sizes) -> Result<ValueId> {
    let lx = e.unary(UnaryOp::Log, x)?;
    let alx = e.mul(a, lx)?;
    let lg = lgamma1p(e, a, s.lgamma1p)?;
    let u = e.sub(alx, lg)?;
    let em1 = e.unary(UnaryOp::Expm1, u)?;
    let head = e.unary(UnaryOp::Neg, em1)?;
    let nx = e.unary(UnaryOp::Neg, x)?;
    let mut power = e.full_like(a, 1.0)?;
    let mut sum = e.full_like(a, 0.0)?;
    for k in 1..=s.small_x {
        power = e.mul(power, nx)?;
        power = e.binary_scalar(BinaryOp::Mul, power, 1.0 / k as f64)?;
        let ak = e.binary_scalar(BinaryOp::Add, a, k as f64)?;
        let term = e.div(power, ak)?;
        sum = e.add(sum, term)?;
    }
    let eu = e.unary(UnaryOp::Exp, u)?;
    let tail = e.mul(eu, a)?;
    let tail = e.mul(tail, sum)?;
    e.sub(head, tail)
}

/// Temme's (P, Q), given η and e^(-aη²/2) / √(2πa).
fn temme(
    e: &mut Emitter,
    a: ValueId,
    inv: ValueId,
    eta: ValueId,
    weight: ValueId,
    ct: DType,
    s: &Sizes,
) -> Result<(ValueId, ValueId)> {
    let coefficients = temme_coefficients(s.temme_k, s.temme_n);
    let mut sum = e.full_like(a, 0.0)?;
    for c in coefficients.iter().rev() {
        let ck = polynomial(e, eta, c)?;
        sum = e.mul(sum, inv)?;
        sum = e.add(sum, ck)?;
    }
    let r = e.mul(weight, sum)?;
    let half_a = e.binary_scalar(BinaryOp::Mul, a, 0.5)?;
    let root = e.unary(UnaryOp::Sqrt, half_a)?;
    let z = e.mul(eta, root)?;
    let nz = e.unary(UnaryOp::Neg, z)?;
    let ez = erfc_of(e, z, ct)?;
    let enz = erfc_of(e, nz, ct)?;
    let q = e.binary_scalar(BinaryOp::Mul, ez, 0.5)?;
    let q = e.add(q, r)?;
    let p = e.binary_scalar(BinaryOp::Mul, enz, 0.5)?;
    let p = e.sub(p, r)?;
    Ok((p, q))
}

/// η = sign(μ) √(2 gap): Temme's variable, with gap = λ - 1 - ln λ.
fn temme_eta(e: &mut Emitter, gap: ValueId, mu: ValueId) -> Result<ValueId> {
    let g2 = e.binary_scalar(BinaryOp::Mul, gap, 2.0)?;
    let g2 = e.binary_scalar(BinaryOp::Max, g2, 0.0)?;
    let eta = e.unary(UnaryOp::Sqrt, g2)?;
    let below = e.compare_scalar(CompareOp::Lt, mu, 0.0)?;
    let neta = e.unary(UnaryOp::Neg, eta)?;
    e.select(below, neta, eta)
}

/// Where Temme's expansion serves (a > 20, λ in its band), and where the
/// continued fraction does (x > 1.1 and x ≥ a + 1 = `a1`); the series
/// elsewhere.
fn regions(
    e: &mut Emitter,
    a: ValueId,
    x: ValueId,
    a1: ValueId,
    lambda: ValueId,
) -> Result<(ValueId, ValueId)> {
    let a_big = e.compare_scalar(CompareOp::Gt, a, TEMME_FROM)?;
    let lo = e.compare_scalar(CompareOp::Ge, lambda, TEMME_BAND.0)?;
    let hi = e.compare_scalar(CompareOp::Le, lambda, TEMME_BAND.1)?;
    let band = e.binary(BinaryOp::And, lo, hi)?;
    let in_temme = e.binary(BinaryOp::And, a_big, band)?;
    let past = e.compare_scalar(CompareOp::Gt, x, FRACTION_FROM)?;
    let a1x = e.compare(CompareOp::Ge, x, a1)?;
    let in_fraction = e.binary(BinaryOp::And, past, a1x)?;
    Ok((in_temme, in_fraction))
}

/// What the pieces of P, Q and the sample gradient all read.
struct Shared {
    /// 1/a.
    inv: ValueId,
    /// λ = x/a, x - a, μ = (x - a)/a and the gap λ - 1 - ln λ.
    lambda: ValueId,
    xma: ValueId,
    mu: ValueId,
    gap: ValueId,
}

fn shared(e: &mut Emitter, a: ValueId, x: ValueId, s: &Sizes) -> Result<Shared> {
    let one = e.full_like(a, 1.0)?;
    let inv = e.div(one, a)?;
    let lambda = e.div(x, a)?;
    let xma = e.sub(x, a)?;
    let mu = e.div(xma, a)?;
    let gap = log_gap(e, mu, lambda, s.atanh)?;
    Ok(Shared {
        inv,
        lambda,
        xma,
        mu,
        gap,
    })
}

/// P (or Q, `upper`) at compute dtype `ct`, a and x broadcast together.
fn incomplete_gamma(
    e: &mut Emitter,
    a: ValueId,
    x: ValueId,
    ct: DType,
    upper: bool,
) -> Result<ValueId> {
    let s = sizes(ct);
    let Shared {
        inv,
        lambda,
        mu,
        gap,
        ..
    } = shared(e, a, x, &s)?;
    // a (λ - 1 - ln λ) and Stirling's factor e^(-a gap - S(a)) / √(2πa).
    let agap = e.mul(a, gap)?;
    let st = stirling_series(e, inv)?;
    let expo = e.add(agap, st)?;
    let expo = e.unary(UnaryOp::Neg, expo)?;
    let big = e.unary(UnaryOp::Exp, expo)?;
    let two_pi_a = e.binary_scalar(BinaryOp::Mul, a, 2.0 * PI)?;
    let root = e.unary(UnaryOp::Rsqrt, two_pi_a)?;
    let big = e.mul(big, root)?;
    // Below 10: exp(a ln x - x - ln Γ(a + 1)).
    let lx = e.unary(UnaryOp::Log, x)?;
    let alx = e.mul(a, lx)?;
    let a1 = e.binary_scalar(BinaryOp::Add, a, 1.0)?;
    let lg = lgamma_half_up(e, a1, ct)?;
    let small = e.sub(alx, x)?;
    let small = e.sub(small, lg)?;
    let small = e.unary(UnaryOp::Exp, small)?;
    let use_small = e.compare_scalar(CompareOp::Lt, a, STIRLING_FACTOR_FROM)?;
    let factor = e.select(use_small, small, big)?;

    // The series (P), the fraction (Q) and the small-x Q.
    let series = lower_series(e, a, x, s.series)?;
    let p_series = e.mul(factor, series)?;
    let fraction = upper_fraction(e, a, x, s.fraction)?;
    let q_fraction = e.mul(factor, a)?;
    let q_fraction = e.mul(q_fraction, fraction)?;
    let q_small_x = upper_small_x(e, a, x, &s)?;

    // Temme: η, and the weight e^(-a gap) / √(2πa).
    let eta = temme_eta(e, gap, mu)?;
    let nag = e.unary(UnaryOp::Neg, agap)?;
    let weight = e.unary(UnaryOp::Exp, nag)?;
    let weight = e.mul(weight, root)?;
    let (p_temme, q_temme) = temme(e, a, inv, eta, weight, ct, &s)?;

    let (in_temme, in_fraction) = regions(e, a, x, a1, lambda)?;
    // Q small at small x: a (-ln x) ≤ 0.4 up to x = 1/2, a ≤ 1.1 x to 1.1.
    let nalx = e.unary(UnaryOp::Neg, alx)?;
    let low_a = e.compare_scalar(CompareOp::Le, nalx, 0.4)?;
    let half = e.compare_scalar(CompareOp::Le, x, 0.5)?;
    let first = e.binary(BinaryOp::And, half, low_a)?;
    let x11 = e.binary_scalar(BinaryOp::Mul, x, 1.1)?;
    let a_le = e.compare(CompareOp::Le, a, x11)?;
    let not_half = e.unary(UnaryOp::Not, half)?;
    let upto = e.compare_scalar(CompareOp::Le, x, FRACTION_FROM)?;
    let second = e.binary(BinaryOp::And, not_half, upto)?;
    let second = e.binary(BinaryOp::And, second, a_le)?;
    let in_small_x = e.binary(BinaryOp::Or, first, second)?;

    let one = e.full_like(a, 1.0)?;
    let y = if upper {
        let rest = e.sub(one, p_series)?;
        let y = e.select(in_small_x, q_small_x, rest)?;
        let y = e.select(in_fraction, q_fraction, y)?;
        e.select(in_temme, q_temme, y)?
    } else {
        let rest = e.sub(one, q_fraction)?;
        let y = e.select(in_fraction, rest, p_series)?;
        e.select(in_temme, p_temme, y)?
    };
    edges(e, a, x, y, upper)
}

/// The edges, as torch's (see the module's doc).
fn edges(e: &mut Emitter, a: ValueId, x: ValueId, y: ValueId, upper: bool) -> Result<ValueId> {
    let (one, zero) = if upper { (0.0, 1.0) } else { (1.0, 0.0) };
    let p_one = e.full_like(y, one)?;
    let p_zero = e.full_like(y, zero)?;
    let x_zero = e.compare_scalar(CompareOp::Eq, x, 0.0)?;
    let y = e.select(x_zero, p_zero, y)?;
    let a_zero = e.compare_scalar(CompareOp::Eq, a, 0.0)?;
    let y = e.select(a_zero, p_one, y)?;
    let x_inf = e.compare_scalar(CompareOp::Eq, x, f64::INFINITY)?;
    let y = e.select(x_inf, p_one, y)?;
    let a_inf = e.compare_scalar(CompareOp::Eq, a, f64::INFINITY)?;
    let y = e.select(a_inf, p_zero, y)?;
    // NaN: either NaN (the compares below are false for it), a < 0, x < 0,
    // both 0, both inf.
    let a_ok = e.compare_scalar(CompareOp::Ge, a, 0.0)?;
    let x_ok = e.compare_scalar(CompareOp::Ge, x, 0.0)?;
    let ok = e.binary(BinaryOp::And, a_ok, x_ok)?;
    let zeros = e.binary(BinaryOp::And, a_zero, x_zero)?;
    let infs = e.binary(BinaryOp::And, a_inf, x_inf)?;
    let bad = e.binary(BinaryOp::Or, zeros, infs)?;
    let not_bad = e.unary(UnaryOp::Not, bad)?;
    let ok = e.binary(BinaryOp::And, ok, not_bad)?;
    let nan = e.full_like(y, f64::NAN)?;
    e.select(ok, y, nan)
}

/// L = d/da ln(x^a e^-x / Γ(a + 1)) = ln x - ψ(a + 1): from a = 10 as
/// ln λ - (ψ(a + 1) - ln a), the bracket by its asymptotic series
/// 1/(2a) - Σ B(2k)/(2k a^2k), so large a does not cancel.
fn log_factor_slope(
    e: &mut Emitter,
    a: ValueId,
    x: ValueId,
    inv: ValueId,
    lambda: ValueId,
    ct: DType,
) -> Result<ValueId> {
    let inv2 = e.mul(inv, inv)?;
    let tail = polynomial(e, inv2, &DIGAMMA)?;
    let tail = e.mul(tail, inv2)?;
    let half = e.binary_scalar(BinaryOp::Mul, inv, 0.5)?;
    let bracket = e.sub(half, tail)?;
    let ll = e.unary(UnaryOp::Log, lambda)?;
    let big = e.sub(ll, bracket)?;
    let a1 = e.binary_scalar(BinaryOp::Add, a, 1.0)?;
    let psi = digamma_half_up(e, a1, ct)?;
    let lx = e.unary(UnaryOp::Log, x)?;
    let small = e.sub(lx, psi)?;
    let use_small = e.compare_scalar(CompareOp::Lt, a, STIRLING_FACTOR_FROM)?;
    e.select(use_small, small, big)
}

/// dx/da of a Gamma(a, 1) sample x held at its quantile
/// (torch._standard_gamma_grad, the reparameterized gradient of
/// torch.distributions' Gamma rsample): -(∂P/∂a) / (∂P/∂x), with
/// ∂P/∂x = x^(a-1) e^-x / Γ(a). ∂P/∂a comes from the pieces of P carried in
/// forward mode (each value with its derivative in a), and the factor
/// x^a e^-x / Γ(a + 1) they share cancels in the ratio, so nothing
/// underflows: the series gives -x (L S + S') / a, the continued fraction
/// x (F (L + 1/a) + F'), and Temme's expansion
/// -x e^S(a) (√(2a) z' - (w'/w) Σ - Σ') / a (see `incomplete_gamma`).
fn gamma_sample_grad(e: &mut Emitter, a: ValueId, x: ValueId, ct: DType) -> Result<ValueId> {
    let s = sizes(ct);
    let Shared {
        inv: inv_a,
        lambda,
        xma,
        mu,
        gap,
    } = shared(e, a, x, &s)?;
    let slope = log_factor_slope(e, a, x, inv_a, lambda, ct)?;
    let one = e.full_like(a, 1.0)?;
    let x_over_a = e.mul(x, inv_a)?;

    // The series: t_k = t_(k-1) x / (a + k), t_k' = t_(k-1)' x/(a + k) - t_k/(a + k).
    let mut t = one;
    let mut dt = e.full_like(a, 0.0)?;
    let mut sum = one;
    let mut dsum = dt;
    for k in 1..s.series {
        let ak = e.binary_scalar(BinaryOp::Add, a, k as f64)?;
        let inv_ak = e.div(one, ak)?;
        let r = e.mul(x, inv_ak)?;
        t = e.mul(t, r)?;
        dt = e.mul(dt, r)?;
        let tk = e.mul(t, inv_ak)?;
        dt = e.sub(dt, tk)?;
        sum = e.add(sum, t)?;
        dsum = e.add(dsum, dt)?;
    }
    let ls = e.mul(slope, sum)?;
    let ls = e.add(ls, dsum)?;
    let g_series = e.mul(ls, x_over_a)?;
    let g_series = e.unary(UnaryOp::Neg, g_series)?;

    // The continued fraction, each level with its derivative.
    let mut t = e.full_like(a, 0.0)?;
    let mut dt = t;
    for k in (1..=s.fraction).rev() {
        let kf = k as f64;
        let num = e.binary_scalar(BinaryOp::Mul, a, -kf)?;
        let num = e.binary_scalar(BinaryOp::Add, num, kf * kf)?;
        let den = e.binary_scalar(BinaryOp::Add, xma, 2.0 * kf + 1.0)?;
        let den = e.sub(den, t)?;
        // den' = -1 - t'; t = num / den; t' = (-k - t den') / den.
        let dden = e.binary_scalar(BinaryOp::Add, dt, 1.0)?;
        let dden = e.unary(UnaryOp::Neg, dden)?;
        t = e.div(num, den)?;
        let tdd = e.mul(t, dden)?;
        let dnum = e.binary_scalar(BinaryOp::Add, tdd, kf)?;
        let dnum = e.unary(UnaryOp::Neg, dnum)?;
        dt = e.div(dnum, den)?;
    }
    let den = e.binary_scalar(BinaryOp::Add, xma, 1.0)?;
    let den = e.sub(den, t)?;
    let f = e.div(one, den)?;
    // F' = -den' F² = (1 + t') F².
    let f2 = e.mul(f, f)?;
    let dden = e.binary_scalar(BinaryOp::Add, dt, 1.0)?;
    let df = e.mul(dden, f2)?;
    let la = e.add(slope, inv_a)?;
    let g_fraction = e.mul(f, la)?;
    let g_fraction = e.add(g_fraction, df)?;
    let g_fraction = e.mul(g_fraction, x)?;

    // Temme: η' = -(μ/η)/a, with μ/η = Σ b_(n+1) η^n (1 at λ = 1).
    let eta = temme_eta(e, gap, mu)?;
    let b = lambda_coefficients(s.temme_n + 1);
    let ratio = polynomial(e, eta, &b[1..])?;
    let deta = e.mul(ratio, inv_a)?;
    let deta = e.unary(UnaryOp::Neg, deta)?;
    let half_a = e.binary_scalar(BinaryOp::Mul, a, 0.5)?;
    let root = e.unary(UnaryOp::Sqrt, half_a)?;
    let z = e.mul(eta, root)?;
    // z' = η' √(a/2) + z / (2a)
    let dz = e.mul(deta, root)?;
    let z2a = e.mul(z, inv_a)?;
    let z2a = e.binary_scalar(BinaryOp::Mul, z2a, 0.5)?;
    let dz = e.add(dz, z2a)?;
    // Σ = Σ_k C_k a^-k, Σ_1 = Σ_k C_k' a^-k, Σ_2 = Σ_k k C_k a^-k.
    let coefficients = temme_coefficients(s.temme_k, s.temme_n);
    let mut sig = e.full_like(a, 0.0)?;
    let mut sig1 = sig;
    let mut sig2 = sig;
    for (k, c) in coefficients.iter().enumerate().rev() {
        let ck = polynomial(e, eta, c)?;
        let dc: Vec<f64> = c
            .iter()
            .enumerate()
            .skip(1)
            .map(|(n, v)| n as f64 * v)
            .collect();
        let dck = polynomial(e, eta, &dc)?;
        let kck = e.binary_scalar(BinaryOp::Mul, ck, k as f64)?;
        sig = e.mul(sig, inv_a)?;
        sig = e.add(sig, ck)?;
        sig1 = e.mul(sig1, inv_a)?;
        sig1 = e.add(sig1, dck)?;
        sig2 = e.mul(sig2, inv_a)?;
        sig2 = e.add(sig2, kck)?;
    }
    let dsig = e.mul(deta, sig1)?;
    let s2a = e.mul(sig2, inv_a)?;
    let dsig = e.sub(dsig, s2a)?;
    // w'/w = μ - φ - 1/(2a), φ = gap.
    let dw = e.sub(mu, gap)?;
    let h = e.binary_scalar(BinaryOp::Mul, inv_a, 0.5)?;
    let dw = e.sub(dw, h)?;
    let two_a = e.binary_scalar(BinaryOp::Mul, a, 2.0)?;
    let r2a = e.unary(UnaryOp::Sqrt, two_a)?;
    let bracket = e.mul(r2a, dz)?;
    let dws = e.mul(dw, sig)?;
    let bracket = e.sub(bracket, dws)?;
    let bracket = e.sub(bracket, dsig)?;
    let st = stirling_series(e, inv_a)?;
    let est = e.unary(UnaryOp::Exp, st)?;
    let g_temme = e.mul(bracket, est)?;
    let g_temme = e.mul(g_temme, x_over_a)?;
    let g_temme = e.unary(UnaryOp::Neg, g_temme)?;

    let a1 = e.binary_scalar(BinaryOp::Add, a, 1.0)?;
    let (in_temme, in_fraction) = regions(e, a, x, a1, lambda)?;
    let y = e.select(in_fraction, g_fraction, g_series)?;
    let y = e.select(in_temme, g_temme, y)?;
    // x = 0: 0 (a sample that underflowed); NaN outside a > 0, x ≥ 0
    // finite, as a sample can be.
    let zero = e.full_like(a, 0.0)?;
    let x_zero = e.compare_scalar(CompareOp::Eq, x, 0.0)?;
    let y = e.select(x_zero, zero, y)?;
    let a_ok = e.compare_scalar(CompareOp::Gt, a, 0.0)?;
    let a_fin = e.compare_scalar(CompareOp::Lt, a, f64::INFINITY)?;
    let x_ok = e.compare_scalar(CompareOp::Ge, x, 0.0)?;
    let x_fin = e.compare_scalar(CompareOp::Lt, x, f64::INFINITY)?;
    let ok = e.binary(BinaryOp::And, a_ok, a_fin)?;
    let ok = e.binary(BinaryOp::And, ok, x_ok)?;
    let ok = e.binary(BinaryOp::And, ok, x_fin)?;
    let nan = e.full_like(a, f64::NAN)?;
    e.select(ok, y, nan)
}

fn standard_gamma_grad(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    binary_in(e, x, a, gamma_sample_grad)
}

fn igamma(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    binary_in(e, x, a, |e, p, q, ct| incomplete_gamma(e, p, q, ct, false))
}

fn igammac(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    binary_in(e, x, a, |e, p, q, ct| incomplete_gamma(e, p, q, ct, true))
}

pub(super) const OPS: &[OpDef] = &[
    def!("igamma", Arity::Exactly(2), igamma),
    def!("igammac", Arity::Exactly(2), igammac),
    def!(
        "standard_gamma_grad",
        Arity::Exactly(2),
        standard_gamma_grad
    ),
];

#[cfg(test)]
mod tests {
    use super::super::tests::{run1, t};
    use super::{gamma_star_coefficients, temme_coefficients, zeta_minus_one};
    use crate::ir::DType;
    use crate::ops::attrs::Attrs;

    /// (a, x, P, Q) from mpmath at 50 digits (P by its series and Q by its
    /// continued fraction, each summed to convergence), one or more points
    /// in each piece: the small-x Q, the series, the fraction, Temme's band
    /// on both sides of λ = 1, and large a outside it.
    const REFERENCE: [(f64, f64, f64, f64); 15] = [
        (0.5, 0.2, 0.472_910_743_134_461_9, 0.527_089_256_865_538_1),
        (
            0.001,
            0.3,
            0.999_094_161_911_693_3,
            0.000_905_838_088_306_647,
        ),
        (
            1e-06,
            1.05,
            0.999_999_798_126_972_8,
            2.018_730_271_638_774e-07,
        ),
        (2.5, 1.7, 0.361_430_076_896_204_93, 0.638_569_923_103_795_1),
        (
            3.0,
            12.0,
            0.999_477_741_949_967_1,
            0.000_522_258_050_032_897_8,
        ),
        (19.5, 21.0, 0.657_794_136_883_913_5, 0.342_205_863_116_086_5),
        (20.5, 18.0, 0.307_879_508_649_623_05, 0.692_120_491_350_377),
        (
            50.0,
            45.0,
            0.246_802_034_400_170_26,
            0.753_197_965_599_829_8,
        ),
        (50.0, 56.0, 0.806_066_038_262_88, 0.193_933_961_737_12),
        (
            100.0,
            40.0,
            1.206_254_205_308_651_4e-15,
            0.999_999_999_999_998_8,
        ),
        (
            100.0,
            180.0,
            0.999_999_999_970_517,
            2.948_294_557_648_285e-11,
        ),
        (
            10000.0,
            10100.0,
            0.841_348_750_447_179_6,
            0.158_651_249_552_820_37,
        ),
        (
            10000.0,
            9500.0,
            1.862_454_651_795_155e-07,
            0.999_999_813_754_534_8,
        ),
        (
            0.3,
            30.0,
            0.999_999_999_999_997_2,
            2.828_579_384_894_010_6e-15,
        ),
        (7.0, 0.01, 1.966_842_802_553_35e-18, 1.0),
    ];

    fn both(dtype: DType, a: &[f64], x: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let n = a.len() as u64;
        let (ta, tx) = (t(dtype, &[n], a), t(dtype, &[n], x));
        let p = run1("igamma", &[&ta, &tx], Attrs::new()).to_f64_vec();
        let q = run1("igammac", &[&ta, &tx], Attrs::new()).to_f64_vec();
        (p, q)
    }

    /// Each within 8e-14 (f64) or 2e-6 (f32) of its own size, plus 2aε:
    /// the input's own rounding, and λ = x/a's, moves a (λ - 1 - ln λ) by
    /// about aε, which the result inherits (torch's does too).
    #[test]
    fn matches_mpmath_in_every_piece() {
        let a: Vec<f64> = REFERENCE.iter().map(|r| r.0).collect();
        let x: Vec<f64> = REFERENCE.iter().map(|r| r.1).collect();
        for (dtype, base, eps) in [
            (DType::F64, 8e-14, f64::EPSILON),
            (DType::F32, 2e-6, f64::from(f32::EPSILON)),
        ] {
            let (p, q) = both(dtype, &a, &x);
            for (i, r) in REFERENCE.iter().enumerate() {
                let tol = base + 2.0 * r.0 * eps;
                for (got, want) in [(p[i], r.2), (q[i], r.3)] {
                    // Below f32's smallest normal its absolute error counts.
                    let floor = if dtype == DType::F32 { 1e-37 } else { 1e-300 };
                    let err = (got - want).abs() / want.abs().max(floor);
                    assert!(
                        err <= tol || (dtype == DType::F32 && (got - want).abs() < 1e-38),
                        "{dtype:?} a = {} x = {}: got {got}, want {want} ({err:e})",
                        r.0,
                        r.1
                    );
                }
            }
        }
    }

    /// P + Q = 1 and both in [0, 1] over a grid spanning the pieces' seams.
    #[test]
    fn the_two_are_complements_across_the_seams() {
        let mut a = Vec::new();
        let mut x = Vec::new();
        for &ai in &[
            1e-8, 0.05, 0.9, 1.0, 1.21, 9.99, 10.0, 19.99, 20.01, 60.0, 3e3, 1e6,
        ] {
            for &l in &[
                1e-3, 0.1, 0.5, 0.599, 0.6, 0.9, 1.0, 1.1, 1.4, 1.401, 2.0, 10.0,
            ] {
                a.push(ai);
                x.push(ai * l);
            }
            for &xi in &[0.3, 0.5, 0.5001, 1.0999, 1.1, 1.1001, ai + 1.0] {
                a.push(ai);
                x.push(xi);
            }
        }
        let (p, q) = both(DType::F64, &a, &x);
        for i in 0..a.len() {
            assert!(
                (0.0..=1.0).contains(&p[i]) && (0.0..=1.0).contains(&q[i]),
                "a = {} x = {}: {} {}",
                a[i],
                x[i],
                p[i],
                q[i]
            );
            // 2e-12: the large-a points' conditioning (see above).
            assert!(
                (p[i] + q[i] - 1.0).abs() < 2e-12,
                "a = {} x = {}",
                a[i],
                x[i]
            );
        }
    }

    #[test]
    fn the_edges_are_torchs() {
        let nan = f64::NAN;
        let inf = f64::INFINITY;
        let a = [0.0, 0.0, 1.0, -1.0, 1.0, inf, inf, 2.0, nan, 0.0, 5.0, 3.0];
        let x = [0.0, 1.0, 0.0, 1.0, -1.0, 1.0, inf, inf, 1.0, inf, -0.0, nan];
        let p_want = [nan, 1.0, 0.0, nan, nan, 0.0, nan, 1.0, nan, 1.0, 0.0, nan];
        for dtype in [DType::F64, DType::F32] {
            let (p, q) = both(dtype, &a, &x);
            for i in 0..a.len() {
                let (w, g, h) = (p_want[i], p[i], q[i]);
                let ok = if w.is_nan() {
                    g.is_nan() && h.is_nan()
                } else {
                    g == w && h == 1.0 - w
                };
                assert!(ok, "{dtype:?} a = {} x = {}: {g} {h}", a[i], x[i]);
            }
        }
    }

    /// dx/da of a Gamma(a) sample x (torch._standard_gamma_grad) against
    /// mpmath's derivative of P in a over ∂P/∂x, in each piece: the series
    /// (small a and x, a < 10 and above), the continued fraction, Temme's
    /// band on both sides of λ = 1 and its edges; within 4e-15 (f64) and
    /// 2e-6 (f32). torch's own kernel is 1e-5 to 3e-4 off on these.
    #[test]
    fn the_sample_gradient_matches_mpmath() {
        let reference: [(f64, f64, f64); 12] = [
            (0.5, 0.2, 0.794_050_566_330_843_4),
            (1.0, 1.0, 1.173_563_027_224_726_8),
            (3.0, 2.0, 0.856_571_422_097_806_7),
            (30.0, 28.0, 0.971_282_368_474_091),
            (30.0, 35.0, 1.085_065_864_320_226_4),
            (200.0, 210.0, 1.025_447_643_692_686_7),
            (0.001, 1e-30, 6.850_198_085_801_108e-26),
            (5.0, 1e-05, 2.643_813_088_590_115e-05),
            (2.0, 0.5, 0.498_026_717_992_223_6),
            (8.5, 6.0, 0.852_402_839_730_007),
            (0.1, 2.0, 8.495_649_227_426_856),
            (12.0, 20.0, 1.294_822_850_349_533),
        ];
        let n = reference.len() as u64;
        let a: Vec<f64> = reference.iter().map(|r| r.0).collect();
        let x: Vec<f64> = reference.iter().map(|r| r.1).collect();
        for (dtype, tol) in [(DType::F64, 4e-15), (DType::F32, 2e-6)] {
            let (ta, tx) = (t(dtype, &[n], &a), t(dtype, &[n], &x));
            let g = run1("standard_gamma_grad", &[&ta, &tx], Attrs::new()).to_f64_vec();
            for (i, r) in reference.iter().enumerate() {
                let err = (g[i] - r.2).abs() / r.2;
                // f32's rounding of a and x moves the value by about that much.
                let tol = if dtype == DType::F32 {
                    tol + 4.0 * 6e-8 * r.0.max(1.0).sqrt()
                } else {
                    tol
                };
                assert!(
                    err <= tol,
                    "{dtype:?} a = {} x = {}: got {}, want {} ({err:e})",
                    r.0,
                    r.1,
                    g[i],
                    r.2
                );
            }
        }
        let nan = f64::NAN;
        let ta = t(DType::F64, &[5], &[2.0, 0.0, -1.0, 2.0, nan]);
        let tx = t(DType::F64, &[5], &[0.0, 1.0, 1.0, f64::INFINITY, 1.0]);
        let g = run1("standard_gamma_grad", &[&ta, &tx], Attrs::new()).to_f64_vec();
        assert!(g[0] == 0.0 && g[1..].iter().all(|v| v.is_nan()), "{g:?}");
    }

    /// The build-time coefficients against their known values: Γ*'s
    /// 1/12, 1/288, -139/51840, -571/2488320; C_0 = -1/3 + η/12 -
    /// 2η²/135 + η³/864, C_1(0) = -1/540, C_2(0) = 25/6048;
    /// ζ(2) - 1 = π²/6 - 1 and ζ(4) - 1 = π⁴/90 - 1.
    #[test]
    fn the_build_time_coefficients_are_the_known_ones() {
        let g = gamma_star_coefficients(5);
        let want = [
            1.0,
            1.0 / 12.0,
            1.0 / 288.0,
            -139.0 / 51840.0,
            -571.0 / 2_488_320.0,
        ];
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 1e-17, "{g:?}");
        }
        let c = temme_coefficients(3, 4);
        let c0 = [-1.0 / 3.0, 1.0 / 12.0, -2.0 / 135.0, 1.0 / 864.0];
        for (a, b) in c[0].iter().zip(c0) {
            assert!((a - b).abs() < 1e-16, "{:?}", c[0]);
        }
        assert!((c[1][0] + 1.0 / 540.0).abs() < 1e-17, "{:?}", c[1]);
        assert!((c[2][0] - 25.0 / 6048.0).abs() < 1e-17, "{:?}", c[2]);
        let pi2 = std::f64::consts::PI.powi(2);
        assert!((zeta_minus_one(2) - (pi2 / 6.0 - 1.0)).abs() < 1e-16);
        assert!((zeta_minus_one(4) - (pi2 * pi2 / 90.0 - 1.0)).abs() < 1e-16);
    }
}
