//! The classical orthogonal polynomials of torch.special, each an op of
//! (x, n) with n an integer degree (a float n is truncated toward zero, as
//! torch's; a degree below 0, or a NaN n, gives 0): the Chebyshev
//! polynomials of the four kinds T, U, V and W (chebyshev_polynomial_t,
//! _u, _v, _w), their shifted forms on [0, 1]
//! (shifted_chebyshev_polynomial_t, ...: T*_n(x) = T_n(2x - 1)), Hermite's
//! physicists' H and probabilists' He (hermite_polynomial_h,
//! hermite_polynomial_he), Laguerre's L (laguerre_polynomial_l) and
//! Legendre's P (legendre_polynomial_p). x and n promote together as
//! torch's (integers to the default float), broadcast, and compute at f32
//! for bf16 and f16. torch gives them no gradient.
//!
//! The Chebyshev ones need no loop over the degree: with x = cos θ inside
//! [-1, 1] and |x| = cosh t outside,
//! T_n = cos nθ = cosh nt, U_n = sin (n+1)θ / sin θ = sinh (n+1)t / sinh t,
//! V_n = cos (n+½)θ / cos ½θ = cosh (n+½)t / cosh ½t and
//! W_n = sin (n+½)θ / sin ½θ = sinh (n+½)t / sinh ½t, with the parity
//! T_n(-x) = (-1)^n T_n(x) (so U) and V_n(-x) = (-1)^n W_n(x) below -1; the
//! hyperbolic ratios are taken as e^((a-b)t) times ratios of 1 ± e^(-2at),
//! so they overflow only where the polynomial does (torch's recurrence
//! gives NaN there, inf - inf). Any degree costs the same graph. Degrees
//! up to 8 take the recurrence instead (torch does the same below 7 or
//! 9), exact polynomial arithmetic where the closed forms round nθ.
//!
//! The other four run their three-term recurrence for a fixed number of
//! steps, the attribute `steps`, and each element keeps the value at its
//! own degree; an element whose degree is past `steps` gives NaN. The
//! frontend passes the largest degree rounded up to a power of two (read
//! back when n is a tensor), so the graph is one of a few sizes; degrees
//! up to MAX_STEPS (256).

use super::attrs::Attrs;
use super::emit::Emitter;
use super::math::binary_in;
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, UnaryOp, ValueId};

use std::f64::consts::LN_2;

/// The most recurrence steps a graph may unroll: XLA's compile of the
/// unrolled chain grows faster than its length (0.3 s at 128 steps, 3.7 s
/// at 256, out of memory at 4096 on the CPU plugin).
pub const MAX_STEPS: i64 = 256;

/// The Chebyshev degrees computed by their recurrence, not the closed forms.
const LOW_DEGREE: u32 = 8;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Chebyshev {
    T,
    U,
    V,
    W,
}

/// (degree, valid): n truncated toward zero, and whether that is ≥ 0, that
/// is n > -1 (false for NaN; the degree is 0 where it is not).
fn degree(e: &mut Emitter, n: ValueId) -> Result<(ValueId, ValueId)> {
    let valid = e.compare_scalar(CompareOp::Gt, n, -1.0)?;
    let m = e.binary_scalar(BinaryOp::Max, n, 0.0)?;
    let d = e.unary(UnaryOp::Floor, m)?;
    let zero = e.full_like(d, 0.0)?;
    let d = e.select(valid, d, zero)?;
    Ok((d, valid))
}

/// (-1)^d for an integer-valued d ≥ 0.
fn parity(e: &mut Emitter, d: ValueId) -> Result<ValueId> {
    let half = e.binary_scalar(BinaryOp::Mul, d, 0.5)?;
    let whole = e.unary(UnaryOp::Floor, half)?;
    let twice = e.binary_scalar(BinaryOp::Mul, whole, 2.0)?;
    let odd = e.sub(d, twice)?; // 0 or 1
    let odd2 = e.binary_scalar(BinaryOp::Mul, odd, -2.0)?;
    e.binary_scalar(BinaryOp::Add, odd2, 1.0)
}

/// sinh(at) / sinh(bt) (`hyperbolic_sine`) or cosh(at) / cosh(bt), for
/// t ≥ 0 and a ≥ b > 0 (a a value, b a constant), as
/// e^((a-b)t) (1 ∓ e^(-2at)) / (1 ∓ e^(-2bt)); `a_t` is at.
fn hyperbolic_ratio(
    e: &mut Emitter,
    a_t: ValueId,
    t: ValueId,
    b: f64,
    hyperbolic_sine: bool,
) -> Result<ValueId> {
    let b_t = e.binary_scalar(BinaryOp::Mul, t, b)?;
    let diff = e.sub(a_t, b_t)?;
    let lead = e.unary(UnaryOp::Exp, diff)?;
    let term = |e: &mut Emitter, y: ValueId| -> Result<ValueId> {
        let m = e.binary_scalar(BinaryOp::Mul, y, -2.0)?;
        if hyperbolic_sine {
            let v = e.unary(UnaryOp::Expm1, m)?;
            e.unary(UnaryOp::Neg, v)
        } else {
            let v = e.unary(UnaryOp::Exp, m)?;
            e.binary_scalar(BinaryOp::Add, v, 1.0)
        }
    };
    let top = term(e, a_t)?;
    let bottom = term(e, b_t)?;
    let r = e.div(top, bottom)?;
    e.mul(lead, r)
}

/// The Chebyshev polynomial of `kind` at x, degree d (integer-valued ≥ 0).
fn chebyshev(e: &mut Emitter, x: ValueId, d: ValueId, kind: Chebyshev) -> Result<ValueId> {
    let ax = e.unary(UnaryOp::Abs, x)?;
    let sign = parity(e, d)?;
    // Inside: θ = atan2(√((1 - x)(1 + x)), x) at x clamped into [-1, 1].
    let xi = e.binary_scalar(BinaryOp::Min, x, 1.0)?;
    let xi = e.binary_scalar(BinaryOp::Max, xi, -1.0)?;
    let one_minus = e.unary(UnaryOp::Neg, xi)?;
    let one_minus = e.binary_scalar(BinaryOp::Add, one_minus, 1.0)?;
    let one_plus = e.binary_scalar(BinaryOp::Add, xi, 1.0)?;
    let s2 = e.mul(one_minus, one_plus)?;
    let s = e.unary(UnaryOp::Sqrt, s2)?;
    let theta = e.binary(BinaryOp::Atan2, s, xi)?;
    // Outside: t = acosh|x| = ln(|x| + √(|x| - 1) √(|x| + 1)) at |x| ≥ 1.
    let ao = e.binary_scalar(BinaryOp::Max, ax, 1.0)?;
    let below = e.binary_scalar(BinaryOp::Sub, ao, 1.0)?;
    let above = e.binary_scalar(BinaryOp::Add, ao, 1.0)?;
    let below = e.unary(UnaryOp::Sqrt, below)?;
    let above = e.unary(UnaryOp::Sqrt, above)?;
    let root = e.mul(below, above)?;
    let sum = e.add(ao, root)?;
    let t = e.unary(UnaryOp::Log, sum)?;
    // The multiple a of θ (and t) on top, and b below.
    let (shift, b) = match kind {
        Chebyshev::T => (0.0, 0.0),
        Chebyshev::U => (1.0, 1.0),
        Chebyshev::V | Chebyshev::W => (0.5, 0.5),
    };
    let a = e.binary_scalar(BinaryOp::Add, d, shift)?;
    let a_theta = e.mul(a, theta)?;
    let a_t = e.mul(a, t)?;
    let inside = match kind {
        Chebyshev::T => e.unary(UnaryOp::Cos, a_theta)?,
        Chebyshev::U | Chebyshev::W => {
            let top = e.unary(UnaryOp::Sin, a_theta)?;
            let bt = e.binary_scalar(BinaryOp::Mul, theta, b)?;
            let bottom = e.unary(UnaryOp::Sin, bt)?;
            e.div(top, bottom)?
        }
        Chebyshev::V => {
            let top = e.unary(UnaryOp::Cos, a_theta)?;
            let bt = e.binary_scalar(BinaryOp::Mul, theta, b)?;
            let bottom = e.unary(UnaryOp::Cos, bt)?;
            e.div(top, bottom)?
        }
    };
    // Right of 1 and left of -1 (the latter before the parity factor).
    let (right, left) = match kind {
        Chebyshev::T => {
            // cosh(dt) = e^(dt - ln 2) (1 + e^(-2dt)).
            let l = e.binary_scalar(BinaryOp::Sub, a_t, LN_2)?;
            let lead = e.unary(UnaryOp::Exp, l)?;
            let m = e.binary_scalar(BinaryOp::Mul, a_t, -2.0)?;
            let tail = e.unary(UnaryOp::Exp, m)?;
            let tail = e.binary_scalar(BinaryOp::Add, tail, 1.0)?;
            let c = e.mul(lead, tail)?;
            (c, c)
        }
        Chebyshev::U => {
            let r = hyperbolic_ratio(e, a_t, t, b, true)?;
            (r, r)
        }
        Chebyshev::V => (
            hyperbolic_ratio(e, a_t, t, b, false)?,
            hyperbolic_ratio(e, a_t, t, b, true)?,
        ),
        Chebyshev::W => (
            hyperbolic_ratio(e, a_t, t, b, true)?,
            hyperbolic_ratio(e, a_t, t, b, false)?,
        ),
    };
    let left = e.mul(left, sign)?;
    // At ±1 (where the ratios are 0/0): T ±1, U ±(d + 1), V 1 and
    // (-1)^d (2d + 1), W 2d + 1 and (-1)^d.
    let two_d1 = e.binary_scalar(BinaryOp::Mul, d, 2.0)?;
    let two_d1 = e.binary_scalar(BinaryOp::Add, two_d1, 1.0)?;
    let one = e.full_like(x, 1.0)?;
    let (at_one, at_minus_one) = match kind {
        Chebyshev::T => (one, sign),
        Chebyshev::U => {
            let d1 = e.binary_scalar(BinaryOp::Add, d, 1.0)?;
            (d1, e.mul(d1, sign)?)
        }
        Chebyshev::V => (one, e.mul(two_d1, sign)?),
        Chebyshev::W => (two_d1, sign),
    };
    let is_inside = e.compare_scalar(CompareOp::Lt, ax, 1.0)?;
    let is_left = e.compare_scalar(CompareOp::Lt, x, 0.0)?;
    let outside = e.select(is_left, left, right)?;
    let edge = e.select(is_left, at_minus_one, at_one)?;
    let is_edge = e.compare_scalar(CompareOp::Eq, ax, 1.0)?;
    let y = e.select(is_edge, edge, outside)?;
    let y = e.select(is_inside, inside, y)?;
    // NaN x stays NaN (the clamps may drop it).
    let nan = e.compare(CompareOp::Ne, x, x)?;
    let y = e.select(nan, x, y)?;
    // Degrees 0 and 1 exactly, as torch's (whose degree 0 is 1 even at a
    // NaN x): 1, and T₁ = x, U₁ = 2x, V₁ = 2x - 1, W₁ = 2x + 1; the
    // recurrence from them.
    let twice = e.binary_scalar(BinaryOp::Mul, x, 2.0)?;
    let first = match kind {
        Chebyshev::T => x,
        Chebyshev::U => twice,
        Chebyshev::V => e.binary_scalar(BinaryOp::Sub, twice, 1.0)?,
        Chebyshev::W => e.binary_scalar(BinaryOp::Add, twice, 1.0)?,
    };
    let is1 = e.compare_scalar(CompareOp::Eq, d, 1.0)?;
    let mut y = e.select(is1, first, y)?;
    // Up to LOW_DEGREE the recurrence P_(k+1) = 2x P_k - P_(k-1), as
    // torch's: exact polynomial arithmetic where the closed forms round
    // nθ (T₃(0) comes out 0, not 1e-8 in f32).
    let (mut before, mut at) = (one, first);
    for k in 2..=LOW_DEGREE {
        let grown = e.mul(twice, at)?;
        let next = e.sub(grown, before)?;
        before = at;
        at = next;
        let here = e.compare_scalar(CompareOp::Eq, d, f64::from(k))?;
        y = e.select(here, at, y)?;
    }
    let is0 = e.compare_scalar(CompareOp::Eq, d, 0.0)?;
    e.select(is0, one, y)
}

fn chebyshev_op(
    e: &mut Emitter,
    x: &[ValueId],
    a: &Attrs,
    kind: Chebyshev,
    shifted: bool,
) -> Result<Vec<ValueId>> {
    binary_in(e, x, a, |e, v, n, _| {
        let v = if shifted {
            let twice = e.binary_scalar(BinaryOp::Mul, v, 2.0)?;
            e.binary_scalar(BinaryOp::Sub, twice, 1.0)?
        } else {
            v
        };
        let (d, valid) = degree(e, n)?;
        let y = chebyshev(e, v, d, kind)?;
        let zero = e.full_like(y, 0.0)?;
        e.select(valid, y, zero)
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Recurrence {
    /// H_(k+1) = 2x H_k - 2k H_(k-1), H_1 = 2x.
    HermiteH,
    /// He_(k+1) = x He_k - k He_(k-1), He_1 = x.
    HermiteHe,
    /// L_(k+1) = ((2k + 1 - x) L_k - k L_(k-1)) / (k + 1), L_1 = 1 - x.
    Laguerre,
    /// P_(k+1) = ((2k + 1) x P_k - k P_(k-1)) / (k + 1), P_1 = x.
    Legendre,
}

/// The `steps` attribute: required, in 1..=MAX_STEPS.
fn steps(a: &Attrs) -> Result<i64> {
    let s = a.int_opt("steps")?.ok_or_else(|| {
        Error::invalid("the attribute steps (an int at least the largest degree n) is required")
    })?;
    if !(1..=MAX_STEPS).contains(&s) {
        return Err(Error::invalid(format!(
            "steps must be in 1..={MAX_STEPS} (the largest degree these polynomials take), got {s}"
        )));
    }
    Ok(s)
}

fn recurrence_op(
    e: &mut Emitter,
    x: &[ValueId],
    a: &Attrs,
    kind: Recurrence,
) -> Result<Vec<ValueId>> {
    let top = steps(a)?;
    binary_in(e, x, a, |e, v, n, _| {
        let (d, valid) = degree(e, n)?;
        let mut before = e.full_like(v, 1.0)?;
        // What every step multiplies by (-x for Laguerre, to which it adds
        // 2k + 1), built once: the first degree's value but for Laguerre.
        let twice = e.binary_scalar(BinaryOp::Mul, v, 2.0)?;
        let minus = e.unary(UnaryOp::Neg, v)?;
        let mut at = match kind {
            Recurrence::HermiteH => twice,
            Recurrence::HermiteHe | Recurrence::Legendre => v,
            Recurrence::Laguerre => e.binary_scalar(BinaryOp::Add, minus, 1.0)?,
        };
        // Degrees past `steps` stay NaN.
        let mut y = e.full_like(v, f64::NAN)?;
        let is0 = e.compare_scalar(CompareOp::Eq, d, 0.0)?;
        y = e.select(is0, before, y)?;
        let is1 = e.compare_scalar(CompareOp::Eq, d, 1.0)?;
        y = e.select(is1, at, y)?;
        for k in 1..top {
            let kf = k as f64;
            let next = match kind {
                Recurrence::HermiteH | Recurrence::HermiteHe => {
                    let (xv, c) = if kind == Recurrence::HermiteH {
                        (twice, 2.0 * kf)
                    } else {
                        (v, kf)
                    };
                    let grown = e.mul(xv, at)?;
                    let back = e.binary_scalar(BinaryOp::Mul, before, c)?;
                    e.sub(grown, back)?
                }
                Recurrence::Laguerre => {
                    let f = e.binary_scalar(BinaryOp::Add, minus, 2.0 * kf + 1.0)?;
                    let grown = e.mul(f, at)?;
                    let back = e.binary_scalar(BinaryOp::Mul, before, kf)?;
                    let s = e.sub(grown, back)?;
                    e.binary_scalar(BinaryOp::Div, s, kf + 1.0)?
                }
                Recurrence::Legendre => {
                    let xv = e.binary_scalar(BinaryOp::Mul, v, 2.0 * kf + 1.0)?;
                    let grown = e.mul(xv, at)?;
                    let back = e.binary_scalar(BinaryOp::Mul, before, kf)?;
                    let s = e.sub(grown, back)?;
                    e.binary_scalar(BinaryOp::Div, s, kf + 1.0)?
                }
            };
            before = at;
            at = next;
            let here = e.compare_scalar(CompareOp::Eq, d, kf + 1.0)?;
            y = e.select(here, at, y)?;
        }
        let zero = e.full_like(y, 0.0)?;
        e.select(valid, y, zero)
    })
}

macro_rules! chebyshev_ops {
    ($($name:ident: $kind:expr, $shifted:expr;)*) => {
        $(fn $name(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
            chebyshev_op(e, x, a, $kind, $shifted)
        })*
    };
}
chebyshev_ops! {
    chebyshev_polynomial_t: Chebyshev::T, false;
    chebyshev_polynomial_u: Chebyshev::U, false;
    chebyshev_polynomial_v: Chebyshev::V, false;
    chebyshev_polynomial_w: Chebyshev::W, false;
    shifted_chebyshev_polynomial_t: Chebyshev::T, true;
    shifted_chebyshev_polynomial_u: Chebyshev::U, true;
    shifted_chebyshev_polynomial_v: Chebyshev::V, true;
    shifted_chebyshev_polynomial_w: Chebyshev::W, true;
}

fn hermite_polynomial_h(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    recurrence_op(e, x, a, Recurrence::HermiteH)
}
fn hermite_polynomial_he(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    recurrence_op(e, x, a, Recurrence::HermiteHe)
}
fn laguerre_polynomial_l(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    recurrence_op(e, x, a, Recurrence::Laguerre)
}
fn legendre_polynomial_p(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    recurrence_op(e, x, a, Recurrence::Legendre)
}

pub(super) const OPS: &[OpDef] = &[
    def!(
        "chebyshev_polynomial_t",
        Arity::Exactly(2),
        chebyshev_polynomial_t
    ),
    def!(
        "chebyshev_polynomial_u",
        Arity::Exactly(2),
        chebyshev_polynomial_u
    ),
    def!(
        "chebyshev_polynomial_v",
        Arity::Exactly(2),
        chebyshev_polynomial_v
    ),
    def!(
        "chebyshev_polynomial_w",
        Arity::Exactly(2),
        chebyshev_polynomial_w
    ),
    def!(
        "shifted_chebyshev_polynomial_t",
        Arity::Exactly(2),
        shifted_chebyshev_polynomial_t
    ),
    def!(
        "shifted_chebyshev_polynomial_u",
        Arity::Exactly(2),
        shifted_chebyshev_polynomial_u
    ),
    def!(
        "shifted_chebyshev_polynomial_v",
        Arity::Exactly(2),
        shifted_chebyshev_polynomial_v
    ),
    def!(
        "shifted_chebyshev_polynomial_w",
        Arity::Exactly(2),
        shifted_chebyshev_polynomial_w
    ),
    def!(
        "hermite_polynomial_h",
        Arity::Exactly(2),
        hermite_polynomial_h
    ),
    def!(
        "hermite_polynomial_he",
        Arity::Exactly(2),
        hermite_polynomial_he
    ),
    def!(
        "laguerre_polynomial_l",
        Arity::Exactly(2),
        laguerre_polynomial_l
    ),
    def!(
        "legendre_polynomial_p",
        Arity::Exactly(2),
        legendre_polynomial_p
    ),
];

#[cfg(test)]
mod tests {
    use super::super::tests::{run, run1, t};
    use crate::ir::DType;
    use crate::ops::attrs::{Attr, Attrs};

    /// Each family's value at (x, n) by its recurrence in f64, written out
    /// here: the reference for every degree.
    fn reference(op: &str, x: f64, n: i64) -> f64 {
        if n < 0 {
            return 0.0;
        }
        let shifted = op.starts_with("shifted_");
        let x = if shifted { 2.0 * x - 1.0 } else { x };
        let name = op.trim_start_matches("shifted_");
        let (mut p, mut q) = match name {
            "chebyshev_polynomial_t" | "legendre_polynomial_p" | "hermite_polynomial_he" => {
                (1.0, x)
            }
            "chebyshev_polynomial_u" | "hermite_polynomial_h" => (1.0, 2.0 * x),
            "chebyshev_polynomial_v" => (1.0, 2.0 * x - 1.0),
            "chebyshev_polynomial_w" => (1.0, 2.0 * x + 1.0),
            "laguerre_polynomial_l" => (1.0, 1.0 - x),
            _ => unreachable!("{op}"),
        };
        if n == 0 {
            return p;
        }
        for k in 1..n {
            let kf = k as f64;
            let r = match name {
                "hermite_polynomial_h" => 2.0 * x * q - 2.0 * kf * p,
                "hermite_polynomial_he" => x * q - kf * p,
                "laguerre_polynomial_l" => ((2.0 * kf + 1.0 - x) * q - kf * p) / (kf + 1.0),
                "legendre_polynomial_p" => ((2.0 * kf + 1.0) * x * q - kf * p) / (kf + 1.0),
                _ => 2.0 * x * q - p,
            };
            p = q;
            q = r;
        }
        q
    }

    const CHEBYSHEV: [&str; 8] = [
        "chebyshev_polynomial_t",
        "chebyshev_polynomial_u",
        "chebyshev_polynomial_v",
        "chebyshev_polynomial_w",
        "shifted_chebyshev_polynomial_t",
        "shifted_chebyshev_polynomial_u",
        "shifted_chebyshev_polynomial_v",
        "shifted_chebyshev_polynomial_w",
    ];
    const RECURRENCES: [&str; 4] = [
        "hermite_polynomial_h",
        "hermite_polynomial_he",
        "laguerre_polynomial_l",
        "legendre_polynomial_p",
    ];

    fn steps(s: i64) -> Attrs {
        let mut a = Attrs::new();
        a.set("steps", Attr::Int(s));
        a
    }

    /// Every pair of x (inside, on and outside [-1, 1], and for the shifted
    /// ones [0, 1]) and n (0 to 40, fractional and negative, truncated
    /// toward zero as torch's: -0.5 is degree 0) against the f64
    /// recurrence, relatively where the value is large and absolutely near
    /// zero, each scaled by the degree (the closed forms take cos nθ and
    /// e^(nt), whose arguments' rounding grows with it); f64 and f32.
    #[test]
    fn every_family_matches_its_recurrence() {
        let xs = [
            -3.0, -1.5, -1.0, -0.999, -0.7, -0.2, 0.0, 0.1, 0.5, 0.75, 0.999, 1.0, 1.001, 2.5,
        ];
        let ns = [
            0.0, 1.0, 2.0, 3.0, 5.0, 6.9, 9.0, 17.0, 40.0, -1.0, -0.5, -1.5,
        ];
        let (mut gx, mut gn) = (Vec::new(), Vec::new());
        for &x in &xs {
            for &n in &ns {
                gx.push(x);
                gn.push(n);
            }
        }
        let len = [gx.len() as u64];
        for op in CHEBYSHEV.iter().chain(&RECURRENCES) {
            let attrs = if op.contains("chebyshev") {
                Attrs::new()
            } else {
                steps(64)
            };
            for (dt, tol) in [(DType::F64, 4e-15), (DType::F32, 2e-6)] {
                let got = run1(op, &[&t(dt, &len, &gx), &t(dt, &len, &gn)], attrs.clone());
                assert_eq!(got.ty.dtype, dt);
                for (i, g) in got.to_f64_vec().iter().enumerate() {
                    // The argument as the dtype holds it.
                    let x = t(dt, &[1], &[gx[i]]).to_f64_vec()[0];
                    let n = gn[i].trunc() as i64;
                    let want = reference(op, x, n);
                    let scale = want.abs().max(1.0) * (1.0 + n.max(0) as f64);
                    if dt == DType::F32 && want.abs() > f64::from(f32::MAX) {
                        assert_eq!(*g, want.signum() * f64::INFINITY, "{op} at {x}, {n}");
                        continue;
                    }
                    assert!(
                        (g - want).abs() <= tol * scale,
                        "{op} {dt:?} at x = {x}, n = {}: got {g}, want {want}",
                        gn[i]
                    );
                }
            }
        }
    }

    /// The Chebyshev closed forms at degrees past any recurrence's reach:
    /// T_n(cos θ) = cos nθ for n = 10⁶, and outside [-1, 1] where the
    /// polynomials overflow they give ±inf (torch's recurrence gives NaN);
    /// the spot values U_2(x) = 4x² - 1, V_3, W_3 written out.
    #[test]
    fn chebyshev_closed_forms_reach_any_degree() {
        let theta: f64 = 0.3;
        let x = t(DType::F64, &[3], &[theta.cos(), 2.0, -2.0]);
        let n = t(DType::F64, &[3], &[1e6, 2000.0, 2001.0]);
        let got = run1("chebyshev_polynomial_t", &[&x, &n], Attrs::new()).to_f64_vec();
        assert!((got[0] - (1e6 * theta).cos()).abs() < 1e-9, "{got:?}");
        assert_eq!(got[1..], [f64::INFINITY, f64::NEG_INFINITY]);
        let xs = [-0.6, 0.3, 1.7, -2.2];
        let x = t(DType::F64, &[4], &xs);
        let n2 = t(DType::F64, &[4], &[2.0; 4]);
        let n3 = t(DType::F64, &[4], &[3.0; 4]);
        for (op, n, f) in [
            (
                "chebyshev_polynomial_u",
                &n2,
                (|x: f64| 4.0 * x * x - 1.0) as fn(f64) -> f64,
            ),
            ("chebyshev_polynomial_v", &n3, |x| {
                8.0 * x.powi(3) - 4.0 * x * x - 4.0 * x + 1.0
            }),
            ("chebyshev_polynomial_w", &n3, |x| {
                8.0 * x.powi(3) + 4.0 * x * x - 4.0 * x - 1.0
            }),
        ] {
            let got = run1(op, &[&x, n], Attrs::new()).to_f64_vec();
            for (g, &x) in got.iter().zip(&xs) {
                assert!(
                    (g - f(x)).abs() < 1e-13 * f(x).abs().max(1.0),
                    "{op} at {x}: {g}"
                );
            }
        }
    }

    /// The written-out H₃, He₃, L₃ and P₃; a degree past `steps` gives NaN;
    /// degree 0 is 1 even at a NaN x (as torch's); `steps` is required and
    /// bounded, named in the error.
    #[test]
    fn recurrences_and_their_steps() {
        let xs = [-1.3, 0.0, 0.4, 2.0];
        let x = t(DType::F64, &[4], &xs);
        let n = t(DType::F64, &[4], &[3.0; 4]);
        for (op, f) in [
            (
                "hermite_polynomial_h",
                (|x: f64| 8.0 * x.powi(3) - 12.0 * x) as fn(f64) -> f64,
            ),
            ("hermite_polynomial_he", |x| x.powi(3) - 3.0 * x),
            ("laguerre_polynomial_l", |x| {
                (-x.powi(3) + 9.0 * x * x - 18.0 * x + 6.0) / 6.0
            }),
            ("legendre_polynomial_p", |x| {
                (5.0 * x.powi(3) - 3.0 * x) / 2.0
            }),
        ] {
            let got = run1(op, &[&x, &n], steps(4)).to_f64_vec();
            for (g, &x) in got.iter().zip(&xs) {
                assert!(
                    (g - f(x)).abs() < 1e-14 * f(x).abs().max(1.0),
                    "{op} at {x}: {g}"
                );
            }
            let past = run1(op, &[&x, &t(DType::F64, &[4], &[5.0; 4])], steps(4)).to_f64_vec();
            assert!(past.iter().all(|v| v.is_nan()), "{op}: {past:?}");
            let nan = t(DType::F32, &[2], &[f64::NAN; 2]);
            let got = run1(op, &[&nan, &t(DType::F32, &[2], &[0.0, 2.0])], steps(2)).to_f64_vec();
            assert!(got[0] == 1.0 && got[1].is_nan(), "{op}: {got:?}");
            for bad in [Attrs::new(), steps(0), steps(super::MAX_STEPS + 1)] {
                let err = run(op, &[&x, &n], bad).unwrap_err().to_string();
                assert!(err.contains("steps"), "{op}: {err}");
            }
        }
    }
}
