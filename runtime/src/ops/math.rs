//! Elementwise math written from the primitives: tangent, the inverse
//! trigonometric and hyperbolic functions, log2, log10, exp2, erfinv, frac,
//! logit, sinc, signbit, nan_to_num, and the binary xlogy, logaddexp, logaddexp2, hypot,
//! heaviside, fmax, fmin and copysign, and the integer gcd and lcm. Each promotes as torch does
//! (integers to the default float), computes at f32 for bf16 and f16 and
//! rounds once, as torch's CPU kernels do. Where the textbook formula loses accuracy (cancellation
//! near 0 or 1, overflow of an intermediate) the one used here says why.

use super::attrs::Attrs;
use super::emit::Emitter;
use super::pointwise::{promote, promote_float, trunc};
use super::support::{compute_dtype, polynomial};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, UnaryOp, ValueId};

use std::f64::consts::{LN_10, LN_2, PI};

/// Where the asinh and acosh formulas switch to log(2|x|): past it their
/// x² term is no longer needed (its relative effect is below f64's
/// epsilon) and would overflow f32 further on.
const HUGE: f64 = 67_108_864.0; // 2^26

/// `f` over the input promoted to a float dtype and widened to its
/// compute dtype; the result rounded back once.
pub(super) fn unary_in(
    e: &mut Emitter,
    x: ValueId,
    a: &Attrs,
    f: impl FnOnce(&mut Emitter, ValueId, DType) -> Result<ValueId>,
) -> Result<Vec<ValueId>> {
    let (xs, dt) = promote_float(e, &[x], a)?;
    let ct = compute_dtype(dt)?;
    let v = e.convert(xs[0], ct)?;
    let r = f(e, v, ct)?;
    Ok(vec![e.convert(r, dt)?])
}

/// As `unary_in` for two inputs, promoted together and broadcast.
pub(super) fn binary_in(
    e: &mut Emitter,
    x: &[ValueId],
    a: &Attrs,
    f: impl FnOnce(&mut Emitter, ValueId, ValueId, DType) -> Result<ValueId>,
) -> Result<Vec<ValueId>> {
    let (xs, dt) = promote_float(e, x, a)?;
    let ct = compute_dtype(dt)?;
    let p = e.convert(xs[0], ct)?;
    let q = e.convert(xs[1], ct)?;
    let (p, q) = e.broadcast_pair(p, q)?;
    let r = f(e, p, q, ct)?;
    Ok(vec![e.convert(r, dt)?])
}

/// `-r` where v < 0, `r` elsewhere: an odd function computed on |v|.
fn with_sign_of(e: &mut Emitter, v: ValueId, r: ValueId) -> Result<ValueId> {
    let neg = e.compare_scalar(CompareOp::Lt, v, 0.0)?;
    let nr = e.unary(UnaryOp::Neg, r)?;
    e.select(neg, nr, r)
}

/// 1 - v² as (1 - v)(1 + v): exact factors near |v| = 1, where 1 - v·v
/// cancels. Negative past |v| > 1.
fn one_minus_sq(e: &mut Emitter, v: ValueId) -> Result<ValueId> {
    let one = e.scalar(e.dtype(v), 1.0)?;
    let a = e.sub(one, v)?;
    let b = e.add(one, v)?;
    e.mul(a, b)
}

/// sqrt(1 - v²) from `one_minus_sq`; NaN past |v| > 1.
fn sqrt_one_minus_sq(e: &mut Emitter, v: ValueId) -> Result<ValueId> {
    let p = one_minus_sq(e, v)?;
    e.unary(UnaryOp::Sqrt, p)
}

fn tan(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, _| {
        let s = e.unary(UnaryOp::Sin, v)?;
        let c = e.unary(UnaryOp::Cos, v)?;
        e.div(s, c)
    })
}

fn asin(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, _| {
        let c = sqrt_one_minus_sq(e, v)?;
        e.binary(BinaryOp::Atan2, v, c)
    })
}

fn acos(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, _| {
        let s = sqrt_one_minus_sq(e, v)?;
        e.binary(BinaryOp::Atan2, s, v)
    })
}

fn atan(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, _| {
        let one = e.full_like(v, 1.0)?;
        e.binary(BinaryOp::Atan2, v, one)
    })
}

/// e^|v| / 2 as h · (h / 2) with h = e^(|v|/2): finite up to where the
/// result is (sinh and cosh of 89 fit f32; e^89 does not).
fn half_exp_abs(e: &mut Emitter, v: ValueId) -> Result<ValueId> {
    let av = e.unary(UnaryOp::Abs, v)?;
    let hv = e.binary_scalar(BinaryOp::Mul, av, 0.5)?;
    let h = e.unary(UnaryOp::Exp, hv)?;
    let hh = e.binary_scalar(BinaryOp::Mul, h, 0.5)?;
    e.mul(h, hh)
}

/// sinh: (expm1(v) - expm1(-v)) / 2 below |v| = 1 (no cancellation near
/// 0), else ±(E - 1/(4E)) with E = e^|v| / 2.
fn sinh(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, _| {
        let p = e.unary(UnaryOp::Expm1, v)?;
        let nv = e.unary(UnaryOp::Neg, v)?;
        let m = e.unary(UnaryOp::Expm1, nv)?;
        let d = e.sub(p, m)?;
        let small = e.binary_scalar(BinaryOp::Mul, d, 0.5)?;
        let big = half_exp_abs(e, v)?;
        let quarter = e.full_like(big, 0.25)?;
        let inv = e.div(quarter, big)?;
        let large = e.sub(big, inv)?;
        let large = with_sign_of(e, v, large)?;
        let av = e.unary(UnaryOp::Abs, v)?;
        let near = e.compare_scalar(CompareOp::Lt, av, 1.0)?;
        e.select(near, small, large)
    })
}

/// cosh: E + 1/(4E) with E = e^|v| / 2 (a sum: nothing cancels).
fn cosh(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, _| {
        let big = half_exp_abs(e, v)?;
        let quarter = e.full_like(big, 0.25)?;
        let inv = e.div(quarter, big)?;
        e.add(big, inv)
    })
}

/// asinh: ±log1p(|v| + v²/(1 + sqrt(1 + v²))) (log1p keeps small |v|
/// exact), ±(log|v| + ln 2) past 2^26.
fn asinh(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, _| {
        let av = e.unary(UnaryOp::Abs, v)?;
        let sq = e.mul(av, av)?;
        let one = e.full_like(av, 1.0)?;
        let s = e.add(one, sq)?;
        let s = e.unary(UnaryOp::Sqrt, s)?;
        let s = e.add(one, s)?;
        let t = e.div(sq, s)?;
        let t = e.add(av, t)?;
        let near = e.unary(UnaryOp::Log1p, t)?;
        let far = e.unary(UnaryOp::Log, av)?;
        let far = e.binary_scalar(BinaryOp::Add, far, LN_2)?;
        let big = e.scalar(e.dtype(av), HUGE)?;
        let is_far = e.compare(CompareOp::Gt, av, big)?;
        let r = e.select(is_far, far, near)?;
        with_sign_of(e, v, r)
    })
}

/// acosh: log1p((v - 1) + sqrt((v - 1)(v + 1))) (exact factors near 1),
/// log v + ln 2 past 2^26; NaN below 1.
fn acosh(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, _| {
        let one = e.full_like(v, 1.0)?;
        let vm = e.sub(v, one)?;
        let vp = e.add(v, one)?;
        let p = e.mul(vm, vp)?;
        let s = e.unary(UnaryOp::Sqrt, p)?;
        let t = e.add(vm, s)?;
        let near = e.unary(UnaryOp::Log1p, t)?;
        let far = e.unary(UnaryOp::Log, v)?;
        let far = e.binary_scalar(BinaryOp::Add, far, LN_2)?;
        let big = e.scalar(e.dtype(v), HUGE)?;
        let is_far = e.compare(CompareOp::Gt, v, big)?;
        e.select(is_far, far, near)
    })
}

/// atanh: ±log1p(2|v| / (1 - |v|)) / 2, on |v| so that v near -1 does not
/// take log1p of a value near -1 (which cancels).
fn atanh(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, _| {
        let av = e.unary(UnaryOp::Abs, v)?;
        let one = e.full_like(av, 1.0)?;
        let den = e.sub(one, av)?;
        let num = e.add(av, av)?;
        let q = e.div(num, den)?;
        let l = e.unary(UnaryOp::Log1p, q)?;
        let r = e.binary_scalar(BinaryOp::Mul, l, 0.5)?;
        with_sign_of(e, v, r)
    })
}

/// log_base(v) as log(v) / ln(base), then the integer k nearest it where
/// base^k is v exactly (log2(8) is 3, log10(1000) is 3, not a unit off).
fn log_base(e: &mut Emitter, v: ValueId, base: f64, ln_base: f64) -> Result<ValueId> {
    let l = e.unary(UnaryOp::Log, v)?;
    let r = e.binary_scalar(BinaryOp::Mul, l, 1.0 / ln_base)?;
    let k = e.unary(UnaryOp::Round, r)?;
    let b = e.full_like(k, base)?;
    let p = e.binary(BinaryOp::Pow, b, k)?;
    let exact = e.compare(CompareOp::Eq, p, v)?;
    e.select(exact, k, r)
}

fn log2(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, _| log_base(e, v, 2.0, LN_2))
}

fn log10(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, _| log_base(e, v, 10.0, LN_10))
}

fn exp2(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, _| {
        let two = e.full_like(v, 2.0)?;
        e.binary(BinaryOp::Pow, two, v)
    })
}

/// erfinv: Giles' single-precision approximation ("Approximating the
/// erfinv function", GPU Computing Gems, 2011: a polynomial in
/// w = -log((1 - x)(1 + x)), one for w < 5 and one in sqrt(w) beyond),
/// then Newton steps on erf(y) = x (two at f64, one at f32, each roughly
/// doubling the correct digits), ±inf at ±1 and NaN past them.
fn erfinv(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    const CENTRAL: [f64; 9] = [
        2.810_226_36e-08,
        3.432_739_39e-07,
        -3.523_387_7e-06,
        -4.391_506_54e-06,
        0.000_218_580_87,
        -0.001_253_725_03,
        -0.004_177_681_64,
        0.246_640_727,
        1.501_409_41,
    ];
    const TAIL: [f64; 9] = [
        -0.000_200_214_257,
        0.000_100_950_558,
        0.001_349_343_22,
        -0.003_673_428_44,
        0.005_739_507_73,
        -0.007_622_461_3,
        0.009_438_870_47,
        1.001_674_06,
        2.832_976_82,
    ];
    unary_in(e, x[0], a, |e, v, ct| {
        // The tables list the highest power first.
        let horner = |e: &mut Emitter, w: ValueId, c: &[f64; 9]| -> Result<ValueId> {
            let lowest_first: Vec<f64> = c.iter().rev().copied().collect();
            polynomial(e, w, &lowest_first)
        };
        let q = one_minus_sq(e, v)?;
        let l = e.unary(UnaryOp::Log, q)?;
        let w = e.unary(UnaryOp::Neg, l)?;
        let wc = e.binary_scalar(BinaryOp::Sub, w, 2.5)?;
        let pc = horner(e, wc, &CENTRAL)?;
        let ws = e.unary(UnaryOp::Sqrt, w)?;
        let ws = e.binary_scalar(BinaryOp::Sub, ws, 3.0)?;
        let pt = horner(e, ws, &TAIL)?;
        let five = e.scalar(ct, 5.0)?;
        let central = e.compare(CompareOp::Lt, w, five)?;
        let p = e.select(central, pc, pt)?;
        let mut y = e.mul(p, v)?;
        // y -= (erf(y) - x) / (2/sqrt(pi) e^(-y^2))
        let steps = if ct == DType::F64 { 2 } else { 1 };
        for _ in 0..steps {
            let f = e.unary(UnaryOp::Erf, y)?;
            let r = e.sub(f, v)?;
            let yy = e.mul(y, y)?;
            let nyy = e.unary(UnaryOp::Neg, yy)?;
            let d = e.unary(UnaryOp::Exp, nyy)?;
            let d = e.binary_scalar(BinaryOp::Mul, d, 2.0 / PI.sqrt())?;
            let step = e.div(r, d)?;
            y = e.sub(y, step)?;
        }
        // ±1: the infinities (Newton's step there is 0/0).
        let av = e.unary(UnaryOp::Abs, v)?;
        let edge = e.compare_scalar(CompareOp::Eq, av, 1.0)?;
        let inf = e.full_like(v, f64::INFINITY)?;
        let inf = e.mul(inf, v)?;
        e.select(edge, inf, y)
    })
}

/// frac(x) = x - trunc(x), with x's sign; floats only, as torch's.
fn frac(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let v = x[0];
    if !e.dtype(v).is_float() {
        return Err(crate::error::Error::invalid(format!(
            "frac needs a floating-point input, got {}",
            e.dtype(v)
        )));
    }
    let ct = compute_dtype(e.dtype(v))?;
    let dt = e.dtype(v);
    let w = e.convert(v, ct)?;
    let t = trunc(e, w)?;
    let r = e.sub(w, t)?;
    Ok(vec![e.convert(r, dt)?])
}

/// logit(x; eps?) = log(x / (1 - x)), x clamped to [eps, 1 - eps] first
/// when eps is given (torch's).
fn logit(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let eps = a.float_opt("eps")?;
    unary_in(e, x[0], a, |e, v, ct| {
        let v = match eps {
            Some(eps) => {
                let lo = e.scalar(ct, eps)?;
                let hi = e.scalar(ct, 1.0 - eps)?;
                let v = e.max(v, lo)?;
                e.min(v, hi)?
            }
            None => v,
        };
        let one = e.full_like(v, 1.0)?;
        let d = e.sub(one, v)?;
        let q = e.div(v, d)?;
        e.unary(UnaryOp::Log, q)
    })
}

/// logit_backward(grad, x; eps?): grad / (x (1 - x)); 0 outside
/// [eps, 1 - eps] with eps, NaN outside [0, 1] without (torch's).
fn logit_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let eps = a.float_opt("eps")?;
    binary_in(e, x, a, |e, g, v, ct| {
        let one = e.full_like(v, 1.0)?;
        let d = e.sub(one, v)?;
        let den = e.mul(v, d)?;
        let r = e.div(g, den)?;
        let (lo, hi, fill) = match eps {
            Some(eps) => (eps, 1.0 - eps, 0.0),
            None => (0.0, 1.0, f64::NAN),
        };
        let lo = e.scalar(ct, lo)?;
        let hi = e.scalar(ct, hi)?;
        let below = e.compare(CompareOp::Lt, v, lo)?;
        let above = e.compare(CompareOp::Gt, v, hi)?;
        let out = e.binary(BinaryOp::Or, below, above)?;
        let fill = e.full_like(r, fill)?;
        e.select(out, fill, r)
    })
}

/// sinc(x) = sin(πx) / (πx), 1 at 0.
fn sinc(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, _| {
        let p = e.binary_scalar(BinaryOp::Mul, v, PI)?;
        let s = e.unary(UnaryOp::Sin, p)?;
        let r = e.div(s, p)?;
        let zero = e.compare_scalar(CompareOp::Eq, v, 0.0)?;
        let one = e.full_like(r, 1.0)?;
        e.select(zero, one, r)
    })
}

/// xlogy(x, y) = x · log(y), 0 where x is 0, NaN where y is NaN.
fn xlogy(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    xlog_in(e, x, a, UnaryOp::Log)
}

/// xlog1py(x, y) = x · log1p(y) (torch.special.xlog1py), 0 where x is 0,
/// NaN where y is NaN.
fn xlog1py(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    xlog_in(e, x, a, UnaryOp::Log1p)
}

fn xlog_in(e: &mut Emitter, x: &[ValueId], a: &Attrs, log: UnaryOp) -> Result<Vec<ValueId>> {
    binary_in(e, x, a, |e, p, q, _| {
        let l = e.unary(log, q)?;
        let r = e.mul(p, l)?;
        let zero = e.full_like(r, 0.0)?;
        let pz = e.compare_scalar(CompareOp::Eq, p, 0.0)?;
        let r = e.select(pz, zero, r)?;
        let nan = e.compare(CompareOp::Ne, q, q)?;
        let nans = e.full_like(r, f64::NAN)?;
        e.select(nan, nans, r)
    })
}

/// entr(x) = -x · ln x (torch.special.entr): 0 at 0, -inf below 0, NaN
/// for NaN.
fn entr(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    unary_in(e, x[0], a, |e, v, _| {
        let positive = e.compare_scalar(CompareOp::Gt, v, 0.0)?;
        let one = e.full_like(v, 1.0)?;
        let safe = e.select(positive, v, one)?;
        let l = e.unary(UnaryOp::Log, safe)?;
        let r = e.mul(v, l)?;
        let r = e.unary(UnaryOp::Neg, r)?;
        let zero = e.compare_scalar(CompareOp::Eq, v, 0.0)?;
        let zeros = e.full_like(v, 0.0)?;
        let r = e.select(zero, zeros, r)?;
        let negative = e.compare_scalar(CompareOp::Lt, v, 0.0)?;
        let ninf = e.full_like(v, f64::NEG_INFINITY)?;
        e.select(negative, ninf, r)
    })
}

/// logaddexp(a, b) = max + log1p(e^-|a - b|) (base e) or
/// max + log1p(2^-|a - b|) / ln 2 (base 2); a where both are the same
/// infinity (where a - b would be NaN).
fn logaddexp_in(e: &mut Emitter, x: &[ValueId], a: &Attrs, base2: bool) -> Result<Vec<ValueId>> {
    binary_in(e, x, a, |e, p, q, _| {
        let m = e.max(p, q)?;
        let d = e.sub(p, q)?;
        let d = e.unary(UnaryOp::Abs, d)?;
        let nd = e.unary(UnaryOp::Neg, d)?;
        let t = if base2 {
            let two = e.full_like(nd, 2.0)?;
            e.binary(BinaryOp::Pow, two, nd)?
        } else {
            e.unary(UnaryOp::Exp, nd)?
        };
        let l = e.unary(UnaryOp::Log1p, t)?;
        let l = if base2 {
            e.binary_scalar(BinaryOp::Mul, l, 1.0 / LN_2)?
        } else {
            l
        };
        let r = e.add(m, l)?;
        let ap = e.unary(UnaryOp::Abs, p)?;
        let inf = e.compare_scalar(CompareOp::Eq, ap, f64::INFINITY)?;
        let same = e.compare(CompareOp::Eq, p, q)?;
        let both = e.binary(BinaryOp::And, inf, same)?;
        e.select(both, p, r)
    })
}

fn logaddexp(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    logaddexp_in(e, x, a, false)
}

fn logaddexp2(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    logaddexp_in(e, x, a, true)
}

/// hypot(a, b) = m · sqrt(1 + (n/m)²) with m, n the larger and smaller of
/// |a|, |b| (no overflow of a², b²); 0 where both are 0, inf where either
/// is infinite (even with the other NaN, as C's hypot).
fn hypot(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    binary_in(e, x, a, |e, p, q, _| {
        let ap = e.unary(UnaryOp::Abs, p)?;
        let aq = e.unary(UnaryOp::Abs, q)?;
        let m = e.max(ap, aq)?;
        let n = e.min(ap, aq)?;
        let r = e.div(n, m)?;
        let r2 = e.mul(r, r)?;
        let one = e.full_like(r2, 1.0)?;
        let s = e.add(one, r2)?;
        let s = e.unary(UnaryOp::Sqrt, s)?;
        let h = e.mul(m, s)?;
        let zero = e.compare_scalar(CompareOp::Eq, m, 0.0)?;
        let zeros = e.full_like(h, 0.0)?;
        let h = e.select(zero, zeros, h)?;
        let pi = e.compare_scalar(CompareOp::Eq, ap, f64::INFINITY)?;
        let qi = e.compare_scalar(CompareOp::Eq, aq, f64::INFINITY)?;
        let inf = e.binary(BinaryOp::Or, pi, qi)?;
        let infs = e.full_like(h, f64::INFINITY)?;
        e.select(inf, infs, h)
    })
}

/// heaviside(x, values): values where x is 0, else 1 where x > 0 and 0
/// elsewhere (NaN gives 0, as torch's). Computed in the promoted dtype.
fn heaviside(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (xs, _) = super::pointwise::promote(e, x, a)?;
    let (v, w) = e.broadcast_pair(xs[0], xs[1])?;
    let z = e.compare_scalar(CompareOp::Eq, v, 0.0)?;
    let zero = e.scalar(e.dtype(v), 0.0)?;
    let pos = e.compare(CompareOp::Gt, v, zero)?;
    let step = e.convert(pos, e.dtype(v))?;
    Ok(vec![e.select(z, w, step)?])
}

/// fmax / fmin: the max or min, ignoring a NaN when the other is a number.
fn fmax_fmin(e: &mut Emitter, x: &[ValueId], a: &Attrs, max: bool) -> Result<Vec<ValueId>> {
    let (xs, _) = super::pointwise::promote(e, x, a)?;
    let (p, q) = e.broadcast_pair(xs[0], xs[1])?;
    let m = if max { e.max(p, q)? } else { e.min(p, q)? };
    if !e.dtype(p).is_float() {
        return Ok(vec![m]);
    }
    let pn = e.compare(CompareOp::Ne, p, p)?;
    let qn = e.compare(CompareOp::Ne, q, q)?;
    let m = e.select(qn, p, m)?;
    Ok(vec![e.select(pn, q, m)?])
}

fn fmax(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    fmax_fmin(e, x, a, true)
}

fn fmin(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    fmax_fmin(e, x, a, false)
}

/// Whether v's sign bit is set: v < 0, or v a zero whose reciprocal is
/// -inf (-0). A NaN counts as positive whatever its sign bit (torch reads
/// the bit).
fn sign_bit(e: &mut Emitter, v: ValueId) -> Result<ValueId> {
    let neg = e.compare_scalar(CompareOp::Lt, v, 0.0)?;
    let zero = e.compare_scalar(CompareOp::Eq, v, 0.0)?;
    let one = e.full_like(v, 1.0)?;
    let inv = e.div(one, v)?;
    let neg_inf = e.compare_scalar(CompareOp::Lt, inv, 0.0)?;
    let neg_zero = e.binary(BinaryOp::And, zero, neg_inf)?;
    e.binary(BinaryOp::Or, neg, neg_zero)
}

/// signbit(x): bool, true where the sign bit is set (-0 included); never
/// for bools; x < 0 for integers.
fn signbit(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let v = x[0];
    let dt = e.dtype(v);
    if dt == DType::Bool {
        let f = e.full_like(v, 0.0)?;
        return Ok(vec![f]);
    }
    if !dt.is_float() {
        return Ok(vec![e.compare_scalar(CompareOp::Lt, v, 0.0)?]);
    }
    let v = e.convert(v, compute_dtype(dt)?)?;
    Ok(vec![sign_bit(e, v)?])
}

/// copysign(a, b): |a| with b's sign bit (so -0 in b gives -|a|).
fn copysign(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    binary_in(e, x, a, |e, p, q, _| {
        let m = e.unary(UnaryOp::Abs, p)?;
        let nm = e.unary(UnaryOp::Neg, m)?;
        let neg = sign_bit(e, q)?;
        e.select(neg, nm, m)
    })
}

/// nan_to_num(x; nan = 0, posinf, neginf): NaN, +inf and -inf replaced,
/// the infinities by default with the dtype's largest and lowest finite
/// values; the replacements are rounded to the dtype as torch casts them.
/// Integers and bools come back unchanged.
fn nan_to_num(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let v = x[0];
    let dt = e.dtype(v);
    if !dt.is_float() {
        return Ok(vec![e.identity(v)?]);
    }
    let (max, lowest) = match dt {
        DType::F64 => (f64::MAX, f64::MIN),
        DType::F32 => (f64::from(f32::MAX), f64::from(f32::MIN)),
        DType::BF16 => (half::bf16::MAX.to_f64(), half::bf16::MIN.to_f64()),
        _ => (half::f16::MAX.to_f64(), half::f16::MIN.to_f64()),
    };
    let nan = a.float_or("nan", 0.0)?;
    let posinf = a.float_opt("posinf")?.unwrap_or(max);
    let neginf = a.float_opt("neginf")?.unwrap_or(lowest);
    let is_nan = e.compare(CompareOp::Ne, v, v)?;
    let is_pos = e.compare_scalar(CompareOp::Eq, v, f64::INFINITY)?;
    let is_neg = e.compare_scalar(CompareOp::Eq, v, f64::NEG_INFINITY)?;
    let mut y = v;
    for (mask, value) in [(is_nan, nan), (is_pos, posinf), (is_neg, neginf)] {
        let r = e.full_like(v, value)?;
        y = e.select(mask, r, y)?;
    }
    Ok(vec![y])
}

/// How many of Euclid's steps (torch's loop: while a != 0, (a, b) =
/// (b mod a, a)) integers up to `max` can take: the slowest pair is two
/// consecutive Fibonacci numbers, and one more step swaps a pair given
/// larger first.
fn euclid_steps(max: u64) -> u32 {
    let (mut x, mut y) = (1u64, 2u64);
    while let Some(z) = x.checked_add(y).filter(|&z| z <= max) {
        (x, y) = (y, z);
    }
    let (mut a, mut b, mut n) = (x, y, 1);
    while a != 0 {
        (a, b) = (b % a, a);
        n += 1;
    }
    n
}

/// The two operands promoted to their integer dtype and broadcast, with
/// the dtype's largest value; floats and bools are errors (torch has no
/// kernel).
fn integer_pair(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<(ValueId, ValueId, u64)> {
    let (xs, dt) = promote(e, x, a)?;
    let max = match dt {
        DType::U8 => u64::from(u8::MAX),
        DType::I8 => i8::MAX as u64,
        DType::I32 => i32::MAX as u64,
        DType::I64 => i64::MAX as u64,
        other => return Err(Error::invalid(format!("needs integer inputs, got {other}"))),
    };
    let (p, q) = e.broadcast_pair(xs[0], xs[1])?;
    Ok((p, q, max))
}

/// gcd(|p|, |q|) by Euclid's steps, as many as the dtype can need, each a
/// no-op once a is 0; gcd(0, 0) = 0. The absolute value of the dtype's
/// most negative number wraps, as torch's.
fn gcd_of(e: &mut Emitter, p: ValueId, q: ValueId, max: u64) -> Result<ValueId> {
    let mut a = e.unary(UnaryOp::Abs, p)?;
    let mut b = e.unary(UnaryOp::Abs, q)?;
    let zero = e.full_like(a, 0.0)?;
    let one = e.full_like(a, 1.0)?;
    for _ in 0..euclid_steps(max) {
        let live = e.compare(CompareOp::Ne, a, zero)?;
        let divisor = e.select(live, a, one)?;
        let r = e.binary(BinaryOp::Rem, b, divisor)?;
        let next_a = e.select(live, r, a)?;
        b = e.select(live, a, b)?;
        a = next_a;
    }
    Ok(b)
}

/// gcd(x, y): the greatest common divisor of |x| and |y| (torch.gcd),
/// integers only.
fn gcd(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (p, q, max) = integer_pair(e, x, a)?;
    Ok(vec![gcd_of(e, p, q, max)?])
}

/// lcm(x, y) = |x / gcd(x, y) * y|, 0 where the gcd is (torch.lcm).
fn lcm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (p, q, max) = integer_pair(e, x, a)?;
    let g = gcd_of(e, p, q, max)?;
    let zero = e.full_like(g, 0.0)?;
    let none = e.compare(CompareOp::Eq, g, zero)?;
    let one = e.full_like(g, 1.0)?;
    let divisor = e.select(none, one, g)?;
    let part = e.binary(BinaryOp::Div, p, divisor)?;
    let m = e.mul(part, q)?;
    let m = e.unary(UnaryOp::Abs, m)?;
    Ok(vec![e.select(none, zero, m)?])
}

pub(super) const OPS: &[OpDef] = &[
    def!("gcd", Arity::Exactly(2), gcd),
    def!("lcm", Arity::Exactly(2), lcm),
    def!("tan", Arity::Exactly(1), tan),
    def!("asin", Arity::Exactly(1), asin),
    def!("acos", Arity::Exactly(1), acos),
    def!("atan", Arity::Exactly(1), atan),
    def!("sinh", Arity::Exactly(1), sinh),
    def!("cosh", Arity::Exactly(1), cosh),
    def!("asinh", Arity::Exactly(1), asinh),
    def!("acosh", Arity::Exactly(1), acosh),
    def!("atanh", Arity::Exactly(1), atanh),
    def!("log2", Arity::Exactly(1), log2),
    def!("log10", Arity::Exactly(1), log10),
    def!("exp2", Arity::Exactly(1), exp2),
    def!("frac", Arity::Exactly(1), frac),
    def!("erfinv", Arity::Exactly(1), erfinv),
    def!("logit", Arity::Exactly(1), logit),
    def!("logit_backward", Arity::Exactly(2), logit_backward),
    def!("sinc", Arity::Exactly(1), sinc),
    def!("xlogy", Arity::Exactly(2), xlogy),
    def!("xlog1py", Arity::Exactly(2), xlog1py),
    def!("entr", Arity::Exactly(1), entr),
    def!("logaddexp", Arity::Exactly(2), logaddexp),
    def!("logaddexp2", Arity::Exactly(2), logaddexp2),
    def!("hypot", Arity::Exactly(2), hypot),
    def!("heaviside", Arity::Exactly(2), heaviside),
    def!("fmax", Arity::Exactly(2), fmax),
    def!("fmin", Arity::Exactly(2), fmin),
    def!("signbit", Arity::Exactly(1), signbit),
    def!("copysign", Arity::Exactly(2), copysign),
    def!("nan_to_num", Arity::Exactly(1), nan_to_num),
];

#[cfg(test)]
mod tests {
    use super::super::tests::{close, run, run1, t};
    use crate::ir::DType;
    use crate::ops::attrs::{Attr, Attrs};

    /// `op` over `xs` in f64 and f32 against `f` computed in f64.
    fn unary_matches(op: &str, xs: &[f64], f: impl Fn(f64) -> f64, tol32: f64) {
        let want: Vec<f64> = xs.iter().map(|&v| f(v)).collect();
        let n = [xs.len() as u64];
        let got = run1(op, &[&t(DType::F64, &n, xs)], Attrs::new());
        assert_eq!(got.ty.dtype, DType::F64);
        close(&got, &want, 1e-14);
        let x32: Vec<f64> = xs.iter().map(|&v| v as f32 as f64).collect();
        let want32: Vec<f64> = x32.iter().map(|&v| f(v)).collect();
        let got = run1(op, &[&t(DType::F32, &n, &x32)], Attrs::new());
        assert_eq!(got.ty.dtype, DType::F32);
        close(&got, &want32, tol32);
    }

    #[test]
    fn trigonometric_and_hyperbolic_functions_match_f64() {
        let unit = [-1.0, -0.999_999, -0.7, -1e-7, 0.0, 1e-9, 0.3, 0.999_99, 1.0];
        unary_matches("asin", &unit, f64::asin, 2e-7);
        unary_matches("acos", &unit, f64::acos, 2e-7);
        let wide = [
            -1e30, -80.0, -3.0, -1.0, -0.5, -1e-8, 0.0, 1e-6, 0.9, 1.0, 2.5, 20.0, 88.0, 1e20,
        ];
        unary_matches("atan", &wide, f64::atan, 2e-7);
        unary_matches("asinh", &wide, f64::asinh, 2e-7);
        let hyp = [
            -89.0, -20.0, -1.5, -1.0, -0.99, -1e-5, 0.0, 3e-8, 0.5, 1.0, 7.0, 89.0,
        ];
        unary_matches("sinh", &hyp, f64::sinh, 4e-7);
        unary_matches("cosh", &hyp, f64::cosh, 4e-7);
        unary_matches(
            "tan",
            &[-1.5, -0.5, 0.0, 1e-8, 0.7, 1.2, 10.0],
            f64::tan,
            4e-7,
        );
        unary_matches(
            "acosh",
            &[1.0, 1.000_001, 1.5, 2.0, 1e4, 3e7, 1e30],
            f64::acosh,
            2e-7,
        );
        unary_matches(
            "atanh",
            &[-0.999_999, -0.5, -1e-9, 0.0, 0.25, 0.9, 0.999_9],
            // On |v|: Rust's f64::atanh of a v near -1 takes log1p of a
            // value near -1 and is 5e-12 off (C's atanh agrees with ours).
            |v: f64| v.signum() * v.abs().atanh(),
            2e-7,
        );
        // The edges: poles and the ends of the domains.
        let e = run1(
            "atanh",
            &[&t(DType::F32, &[4], &[1.0, -1.0, 2.0, f64::NAN])],
            Attrs::new(),
        );
        close(
            &e,
            &[f64::INFINITY, f64::NEG_INFINITY, f64::NAN, f64::NAN],
            0.0,
        );
        let e = run1(
            "acosh",
            &[&t(DType::F32, &[2], &[0.5, f64::INFINITY])],
            Attrs::new(),
        );
        close(&e, &[f64::NAN, f64::INFINITY], 0.0);
        let e = run1(
            "sinh",
            &[&t(DType::F32, &[3], &[90.0, f64::NEG_INFINITY, f64::NAN])],
            Attrs::new(),
        );
        close(&e, &[f64::INFINITY, f64::NEG_INFINITY, f64::NAN], 0.0);
        let e = run1("asin", &[&t(DType::F32, &[1], &[1.5])], Attrs::new());
        close(&e, &[f64::NAN], 0.0);
    }

    #[test]
    fn signbit_and_copysign_read_the_sign_of_zero() {
        let v = [
            -0.0,
            0.0,
            -2.5,
            3.0,
            f64::NEG_INFINITY,
            f64::INFINITY,
            f64::NAN,
        ];
        for dt in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            let s = run1("signbit", &[&t(dt, &[7], &v)], Attrs::new());
            assert_eq!(s.ty.dtype, DType::Bool);
            close(&s, &[1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0], 0.0);
        }
        let i = run1(
            "signbit",
            &[&t(DType::I32, &[3], &[-1.0, 0.0, 5.0])],
            Attrs::new(),
        );
        close(&i, &[1.0, 0.0, 0.0], 0.0);
        let b = run1(
            "signbit",
            &[&t(DType::Bool, &[2], &[1.0, 0.0])],
            Attrs::new(),
        );
        close(&b, &[0.0, 0.0], 0.0);
        let mag = t(
            DType::F32,
            &[7],
            &[1.0, 2.0, -3.0, 4.0, 5.0, -0.0, f64::INFINITY],
        );
        let c = run1("copysign", &[&mag, &t(DType::F32, &[7], &v)], Attrs::new());
        assert_eq!(c.ty.dtype, DType::F32);
        close(&c, &[-1.0, 2.0, -3.0, 4.0, -5.0, 0.0, f64::INFINITY], 0.0);
        // -0 from a -0 sign: its reciprocal shows it.
        let z = run1(
            "copysign",
            &[&t(DType::F64, &[1], &[0.0]), &t(DType::F64, &[1], &[-1.0])],
            Attrs::new(),
        );
        assert_eq!(1.0 / z.to_f64_vec()[0], f64::NEG_INFINITY);
        // Integers promote to the default float; a scalar sign broadcasts.
        let p = run1(
            "copysign",
            &[
                &t(DType::I64, &[3], &[1.0, -2.0, 3.0]),
                &t(DType::F64, &[], &[-1.0]),
            ],
            Attrs::new(),
        );
        assert_eq!(p.ty.dtype, DType::F64);
        close(&p, &[-1.0, -2.0, -3.0], 0.0);
    }

    #[test]
    fn nan_to_num_replaces_nan_and_the_infinities() {
        let v = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.5, 0.0];
        let d = run1("nan_to_num", &[&t(DType::F32, &[5], &v)], Attrs::new());
        close(
            &d,
            &[0.0, f64::from(f32::MAX), f64::from(f32::MIN), -1.5, 0.0],
            0.0,
        );
        let attrs = Attrs::new()
            .with("nan", Attr::Float(7.0))
            .with("posinf", Attr::Float(1e300))
            .with("neginf", Attr::Float(-2.0));
        // 1e300 rounds to inf in f32 (torch casts it so); f64 keeps it.
        let c = run1("nan_to_num", &[&t(DType::F32, &[5], &v)], attrs.clone());
        close(&c, &[7.0, f64::INFINITY, -2.0, -1.5, 0.0], 0.0);
        let c = run1("nan_to_num", &[&t(DType::F64, &[5], &v)], attrs);
        close(&c, &[7.0, 1e300, -2.0, -1.5, 0.0], 0.0);
        let h = run1("nan_to_num", &[&t(DType::BF16, &[5], &v)], Attrs::new());
        let m = half::bf16::MAX.to_f64();
        close(&h, &[0.0, m, -m, -1.5, 0.0], 0.0);
        let i = run1(
            "nan_to_num",
            &[&t(DType::I32, &[2], &[3.0, -4.0])],
            Attrs::new(),
        );
        assert_eq!(i.ty.dtype, DType::I32);
        close(&i, &[3.0, -4.0], 0.0);
    }

    #[test]
    fn logs_and_powers_of_two_and_ten() {
        let pos = [1e-30, 0.001, 0.3, 1.0, 3.0, 1000.0, 1e30];
        unary_matches("log2", &pos, f64::log2, 2e-7);
        unary_matches("log10", &pos, f64::log10, 2e-7);
        unary_matches(
            "exp2",
            &[-130.0, -3.5, 0.0, 0.1, 10.0, 100.0],
            f64::exp2,
            2e-7,
        );
        // Exact powers give exact logs, in every float dtype.
        for dt in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            let p2 = run1(
                "log2",
                &[&t(dt, &[4], &[1.0, 8.0, 1024.0, 0.125])],
                Attrs::new(),
            );
            close(&p2, &[0.0, 3.0, 10.0, -3.0], 0.0);
            let p10 = run1("log10", &[&t(dt, &[3], &[1.0, 10.0, 1000.0])], Attrs::new());
            close(&p10, &[0.0, 1.0, 3.0], 0.0);
        }
        let e = run1(
            "log2",
            &[&t(DType::F32, &[3], &[0.0, -1.0, f64::INFINITY])],
            Attrs::new(),
        );
        close(&e, &[f64::NEG_INFINITY, f64::NAN, f64::INFINITY], 0.0);
        // Integers promote to the default float.
        let i = run1("log2", &[&t(DType::I64, &[2], &[4.0, 32.0])], Attrs::new());
        assert_eq!(i.ty.dtype, DType::F32);
        close(&i, &[2.0, 5.0], 0.0);
    }

    #[test]
    fn erfinv_matches_known_values_and_inverts_erf() {
        // torch's f64 erfinv (erf of each within 6e-17 of its argument).
        // Near ±1 erfinv magnifies its argument's rounding (its slope at
        // -0.999999 is 1.4e5, so one unit of x is 1.6e-11 of y): the
        // tolerance there is that, and at 1 - 1e-10 (slope 1e9) the check
        // is erf's round trip alone.
        let xs = [
            0.0,
            1e-5,
            0.3,
            0.5,
            0.9,
            -0.97,
            0.999,
            -0.999_999,
            0.999_999_999_9,
        ];
        let want = [
            0.0,
            8.862_269_254_759_594e-6,
            0.272_462_714_726_754_3,
            0.476_936_276_204_469_9,
            1.163_087_153_676_674_3,
            -1.534_485_621_777_717_9,
            2.326_753_765_513_524_6,
            -3.458_910_737_275_499,
            4.572_824_958_544_925,
        ];
        let got = run1("erfinv", &[&t(DType::F64, &[9], &xs)], Attrs::new());
        let y = got.to_f64_vec();
        close(&t(DType::F64, &[6], &y[..6]), &want[..6], 2e-15);
        close(&t(DType::F64, &[2], &y[6..8]), &want[6..8], 1e-11);
        close(&run1("erf", &[&got], Attrs::new()), &xs, 2e-16);
        let x32: Vec<f64> = xs[..8].iter().map(|&v| v as f32 as f64).collect();
        let got = run1("erfinv", &[&t(DType::F32, &[8], &x32)], Attrs::new()).to_f64_vec();
        let back = run1("erf", &[&t(DType::F64, &[8], &got)], Attrs::new()).to_f64_vec();
        for (i, (b, x)) in back.iter().zip(&x32).enumerate() {
            // Within a few f32 units of the argument, scaled by erf's slope.
            assert!(
                (b - x).abs() <= 4e-7 * (1.0 + x.abs()),
                "{i}: erf(erfinv({x})) = {b}"
            );
        }
        let e = run1(
            "erfinv",
            &[&t(DType::F32, &[5], &[1.0, -1.0, 1.5, f64::NAN, -0.0])],
            Attrs::new(),
        );
        close(
            &e,
            &[f64::INFINITY, f64::NEG_INFINITY, f64::NAN, f64::NAN, 0.0],
            0.0,
        );
    }

    #[test]
    fn frac_logit_and_sinc() {
        let x = t(DType::F32, &[5], &[-2.75, -0.5, 0.0, 1.25, 3.0]);
        close(
            &run1("frac", &[&x], Attrs::new()),
            &[-0.75, -0.5, 0.0, 0.25, 0.0],
            0.0,
        );
        let e = run("frac", &[&t(DType::I64, &[1], &[2.0])], Attrs::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("frac") && e.contains("floating-point"), "{e}");
        let p = [0.0, 1e-6, 0.25, 0.5, 0.9, 1.0];
        let logit = |v: f64| (v / (1.0 - v)).ln();
        unary_matches("logit", &p, logit, 2e-7);
        let eps = Attrs::new().with("eps", Attr::Float(0.1));
        let got = run1(
            "logit",
            &[&t(DType::F64, &[3], &[0.0, 0.5, 1.0])],
            eps.clone(),
        );
        close(&got, &[logit(0.1), 0.0, logit(0.9)], 1e-15);
        let g = t(DType::F64, &[4], &[1.0; 4]);
        let xs = t(DType::F64, &[4], &[0.05, 0.5, 0.95, 1.5]);
        let d = run1("logit_backward", &[&g, &xs], eps);
        close(&d, &[0.0, 4.0, 0.0, 0.0], 1e-15);
        let d = run1("logit_backward", &[&g, &xs], Attrs::new());
        close(
            &d,
            &[1.0 / (0.05 * 0.95), 4.0, 1.0 / (0.95 * 0.05), f64::NAN],
            1e-14,
        );
        let sinc = |v: f64| {
            if v == 0.0 {
                1.0
            } else {
                (std::f64::consts::PI * v).sin() / (std::f64::consts::PI * v)
            }
        };
        unary_matches("sinc", &[-2.5, -1.0, 0.0, 1e-5, 0.5, 3.0], sinc, 3e-7);
    }

    fn binary(op: &str, a: &[f64], b: &[f64]) -> Vec<f64> {
        let n = [a.len() as u64];
        run1(
            op,
            &[&t(DType::F64, &n, a), &t(DType::F64, &n, b)],
            Attrs::new(),
        )
        .to_f64_vec()
    }

    #[test]
    fn binary_math_matches_c_semantics() {
        let nan = f64::NAN;
        let inf = f64::INFINITY;
        let got = binary(
            "xlogy",
            &[0.0, 0.0, 2.0, 3.0, 0.0],
            &[0.0, nan, 0.5, -1.0, inf],
        );
        let want = [0.0, nan, 2.0 * 0.5f64.ln(), nan, 0.0];
        close(&t(DType::F64, &[5], &got), &want, 1e-15);
        let a = [1.0, -1e300, inf, -inf, 1000.0, nan];
        let b = [2.0, 5.0, inf, -inf, -1000.0, 1.0];
        let lae = |p: f64, q: f64| {
            if p.is_infinite() && p == q {
                p
            } else {
                p.max(q) + (-(p - q).abs()).exp().ln_1p()
            }
        };
        let want: Vec<f64> = a
            .iter()
            .zip(&b)
            .map(|(&p, &q)| if p.is_nan() { nan } else { lae(p, q) })
            .collect();
        close(
            &t(DType::F64, &[6], &binary("logaddexp", &a, &b)),
            &want,
            1e-15,
        );
        let lae2 = |p: f64, q: f64| {
            if p.is_infinite() && p == q {
                p
            } else {
                p.max(q) + (-(p - q).abs()).exp2().ln_1p() / std::f64::consts::LN_2
            }
        };
        let want: Vec<f64> = a
            .iter()
            .zip(&b)
            .map(|(&p, &q)| if p.is_nan() { nan } else { lae2(p, q) })
            .collect();
        close(
            &t(DType::F64, &[6], &binary("logaddexp2", &a, &b)),
            &want,
            1e-15,
        );
        let ha = [3.0, 0.0, 1e300, -5.0, inf, nan, 0.0];
        let hb = [4.0, 0.0, 1e300, 12.0, nan, 1.0, -2.0];
        let want: Vec<f64> = ha
            .iter()
            .zip(&hb)
            .map(|(&p, &q): (&f64, &f64)| p.hypot(q))
            .collect();
        close(
            &t(DType::F64, &[7], &binary("hypot", &ha, &hb)),
            &want,
            1e-15,
        );
        // f32: no overflow of the squares.
        let h = run1(
            "hypot",
            &[&t(DType::F32, &[1], &[3e30]), &t(DType::F32, &[1], &[4e30])],
            Attrs::new(),
        );
        close(&h, &[5e30], 1e-7);
        close(
            &t(
                DType::F64,
                &[4],
                &binary("heaviside", &[-1.0, 0.0, 2.0, nan], &[0.5, 0.5, 0.5, 0.5]),
            ),
            &[0.0, 0.5, 1.0, 0.0],
            0.0,
        );
        close(
            &t(
                DType::F64,
                &[4],
                &binary("fmax", &[nan, 1.0, nan, -0.5], &[2.0, nan, nan, 3.0]),
            ),
            &[2.0, 1.0, nan, 3.0],
            0.0,
        );
        close(
            &t(
                DType::F64,
                &[4],
                &binary("fmin", &[nan, 1.0, nan, -0.5], &[2.0, nan, nan, 3.0]),
            ),
            &[2.0, 1.0, nan, -0.5],
            0.0,
        );
        let i = run1(
            "fmax",
            &[
                &t(DType::I64, &[2], &[1.0, 7.0]),
                &t(DType::I32, &[2], &[3.0, 2.0]),
            ],
            Attrs::new(),
        );
        assert_eq!(i.ty.dtype, DType::I64);
        close(&i, &[3.0, 7.0], 0.0);
    }
}
