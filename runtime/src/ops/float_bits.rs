//! Ops that read a float's bits: nextafter and frexp. They work on the
//! bits as integers (the `BitcastConvert` primitive), not on float
//! arithmetic, so subnormal numbers come out right even where a platform
//! flushes them to zero in arithmetic (XLA's CPU plugin does). f16 and
//! bf16 go through f32, which holds each of their values exactly.

use super::attrs::Attrs;
use super::emit::Emitter;
use super::pointwise::promote;
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, Prim, UnaryOp, ValueId};

/// The bit layout of the float a computation runs in (f32 or f64).
#[derive(Clone, Copy)]
struct Layout {
    float: DType,
    /// The integer of the same width.
    int: DType,
    /// Explicit mantissa bits.
    mantissa: u32,
    bias: i64,
}

impl Layout {
    /// The sign bit as an integer of the layout's width.
    fn sign_mask(self) -> i64 {
        if self.int == DType::I32 {
            i64::from(i32::MIN)
        } else {
            i64::MIN
        }
    }
}

fn layout(float: DType) -> Layout {
    match float {
        DType::F64 => Layout {
            float,
            int: DType::I64,
            mantissa: 52,
            bias: 1023,
        },
        _ => Layout {
            float: DType::F32,
            int: DType::I32,
            mantissa: 23,
            bias: 127,
        },
    }
}

/// An integer constant of `dt` (i32 or i64) broadcast to `dims`, exact in
/// all 64 bits.
fn int_const(e: &mut Emitter, dt: DType, v: i64, dims: &[u64]) -> Result<ValueId> {
    let bytes = if dt == DType::I32 {
        (v as i32).to_le_bytes().to_vec()
    } else {
        v.to_le_bytes().to_vec()
    };
    let c = e.op(
        Prim::Constant {
            dtype: dt,
            dims: vec![],
            bytes,
        },
        &[],
    )?;
    e.broadcast_to(c, dims)
}

/// Integer helpers over one layout and shape.
struct Bits<'a> {
    e: &'a mut Emitter,
    l: Layout,
    dims: Vec<u64>,
}

impl Bits<'_> {
    fn c(&mut self, v: i64) -> Result<ValueId> {
        int_const(self.e, self.l.int, v, &self.dims)
    }
    fn bits(&mut self, x: ValueId) -> Result<ValueId> {
        self.e.op(Prim::BitcastConvert { to: self.l.int }, &[x])
    }
    fn float(&mut self, b: ValueId) -> Result<ValueId> {
        self.e.op(Prim::BitcastConvert { to: self.l.float }, &[b])
    }
    fn op(&mut self, op: BinaryOp, a: ValueId, v: i64) -> Result<ValueId> {
        let c = self.c(v)?;
        self.e.binary(op, a, c)
    }
    fn cmp(&mut self, op: CompareOp, a: ValueId, v: i64) -> Result<ValueId> {
        let c = self.c(v)?;
        self.e.compare(op, a, c)
    }
    /// The magnitude bits (sign cleared).
    fn magnitude(&mut self, b: ValueId) -> Result<ValueId> {
        self.op(BinaryOp::And, b, !self.l.sign_mask())
    }
    /// The sign bit alone.
    fn sign(&mut self, b: ValueId) -> Result<ValueId> {
        self.op(BinaryOp::And, b, self.l.sign_mask())
    }
    /// The biased exponent field of magnitude bits `a`.
    fn exponent_field(&mut self, a: ValueId) -> Result<ValueId> {
        self.op(BinaryOp::Div, a, 1i64 << self.l.mantissa)
    }
    fn mantissa_field(&mut self, a: ValueId) -> Result<ValueId> {
        self.op(BinaryOp::And, a, (1i64 << self.l.mantissa) - 1)
    }
}

/// The float's bits as an integer that orders as the floats do: the
/// magnitude, negated for a set sign bit (so ±0 are both 0).
fn ordered(b: &mut Bits, bits: ValueId) -> Result<ValueId> {
    let mag = b.magnitude(bits)?;
    let zero = b.c(0)?;
    let neg = b.e.compare(CompareOp::Lt, bits, zero)?;
    let minus = b.e.sub(zero, mag)?;
    b.e.select(neg, minus, mag)
}

/// nextafter on f32 or f64 (or bf16 held in f32, stepping `step` units of
/// the f32 bits): the ordered bits one step toward y; landing on zero
/// keeps x's sign, as C's nextafter.
fn step_bits(e: &mut Emitter, p: ValueId, q: ValueId, step: i64) -> Result<ValueId> {
    let l = layout(e.dtype(p));
    let dims = e.dims(p);
    let mut b = Bits { e, l, dims };
    let bp = b.bits(p)?;
    let bq = b.bits(q)?;
    let kx = ordered(&mut b, bp)?;
    let ky = ordered(&mut b, bq)?;
    let up = b.e.compare(CompareOp::Gt, ky, kx)?;
    let plus = b.c(step)?;
    let minus = b.c(-step)?;
    let delta = b.e.select(up, plus, minus)?;
    let kr = b.e.add(kx, delta)?;
    // Back from the ordered integer to sign and magnitude.
    let zero = b.c(0)?;
    let negative = b.e.compare(CompareOp::Lt, kr, zero)?;
    let mag = b.e.sub(zero, kr)?;
    let sign = b.c(l.sign_mask())?;
    let neg_bits = b.e.binary(BinaryOp::Or, mag, sign)?;
    let rb = b.e.select(negative, neg_bits, kr)?;
    let at_zero = b.e.compare(CompareOp::Eq, kr, zero)?;
    let x_sign = b.sign(bp)?;
    let rb = b.e.select(at_zero, x_sign, rb)?;
    let r = b.float(rb)?;
    let same = b.e.compare(CompareOp::Eq, kx, ky)?;
    finish(b.e, p, q, r, same)
}

/// y where x equals y (so ±0 toward ∓0 is y), NaN where either is.
fn finish(e: &mut Emitter, p: ValueId, q: ValueId, r: ValueId, same: ValueId) -> Result<ValueId> {
    let r = e.select(same, q, r)?;
    let nan_p = e.compare(CompareOp::Ne, p, p)?;
    let nan_q = e.compare(CompareOp::Ne, q, q)?;
    let nan = e.binary(BinaryOp::Or, nan_p, nan_q)?;
    let sum = e.add(p, q)?;
    e.select(nan, sum, r)
}

/// nextafter on f16 values held in f32 (every one of them a normal f32 or
/// zero): x plus or minus f16's spacing there, 2^(max(E, -14) - 10) for
/// x's exponent E, halved below a power of two that is a normal f16.
fn step_f16(e: &mut Emitter, v: ValueId, w: ValueId) -> Result<ValueId> {
    let l = layout(DType::F32);
    let dims = e.dims(v);
    let mut b = Bits { e, l, dims };
    let bv = b.bits(v)?;
    let a = b.magnitude(bv)?;
    let field = b.exponent_field(a)?;
    let exp = b.op(BinaryOp::Sub, field, 127)?;
    let mant = b.mantissa_field(a)?;
    let lowest = b.c(-14)?;
    let k = b.e.max(exp, lowest)?;
    // 2^(k - 10) from its exponent field.
    let k = b.op(BinaryOp::Add, k, 127 - 10)?;
    let ulp_bits = b.op(BinaryOp::Mul, k, 1 << 23)?;
    let ulp = b.float(ulp_bits)?;
    let whole = b.cmp(CompareOp::Eq, mant, 0)?;
    let normal = b.cmp(CompareOp::Gt, exp, -14)?;
    let power = b.e.binary(BinaryOp::And, whole, normal)?;
    let e = b.e;
    let half = e.binary_scalar(BinaryOp::Mul, ulp, 0.5)?;
    let down = e.select(power, half, ulp)?;
    let av = e.unary(UnaryOp::Abs, v)?;
    let up = e.compare(CompareOp::Gt, w, v)?;
    let pos = e.compare_scalar(CompareOp::Gt, v, 0.0)?;
    let toward = e.binary(BinaryOp::Xor, up, pos)?;
    let grown = e.add(av, ulp)?;
    let shrunk = e.sub(av, down)?;
    let mag = e.select(toward, shrunk, grown)?;
    let neg = e.compare_scalar(CompareOp::Lt, v, 0.0)?;
    let minus = e.unary(UnaryOp::Neg, mag)?;
    let r = e.select(neg, minus, mag)?;
    // From zero: the least subnormal toward y; from an infinity: the
    // largest finite f16 of its sign.
    let zero = e.compare_scalar(CompareOp::Eq, v, 0.0)?;
    let wpos = e.compare_scalar(CompareOp::Gt, w, 0.0)?;
    let tiny = e.full_like(v, 2f64.powi(-24))?;
    let ntiny = e.full_like(v, -(2f64.powi(-24)))?;
    let from_zero = e.select(wpos, tiny, ntiny)?;
    let r = e.select(zero, from_zero, r)?;
    let inf = e.compare_scalar(CompareOp::Eq, av, f64::INFINITY)?;
    let max = half::f16::MAX.to_f64();
    let big = e.full_like(v, max)?;
    let nbig = e.full_like(v, -max)?;
    let from_inf = e.select(pos, big, nbig)?;
    let r = e.select(inf, from_inf, r)?;
    let same = e.compare(CompareOp::Eq, v, w)?;
    finish(e, v, w, r, same)
}

fn float_inputs(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<(Vec<ValueId>, DType)> {
    let (xs, dt) = promote(e, x, a)?;
    if !dt.is_float() {
        return Err(Error::invalid(format!(
            "takes floating-point inputs, got {dt}"
        )));
    }
    Ok((xs, dt))
}

/// nextafter(x, y): the next number of the (promoted) dtype after x
/// toward y, as C's nextafter: y where x equals y, NaN where either is,
/// the least subnormal (with y's direction) from zero, and zero with x's
/// sign where the step lands on it.
fn nextafter(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (xs, dt) = float_inputs(e, x, a)?;
    let (p, q) = e.broadcast_pair(xs[0], xs[1])?;
    let r = match dt {
        DType::F32 | DType::F64 => step_bits(e, p, q, 1)?,
        DType::BF16 => {
            // A bf16's bits are the upper half of its f32's.
            let v = e.convert(p, DType::F32)?;
            let w = e.convert(q, DType::F32)?;
            let r = step_bits(e, v, w, 1 << 16)?;
            e.convert(r, DType::BF16)?
        }
        _ => {
            let v = e.convert(p, DType::F32)?;
            let w = e.convert(q, DType::F32)?;
            let r = step_f16(e, v, w)?;
            e.convert(r, dt)?
        }
    };
    Ok(vec![r])
}

/// frexp(x) -> (mantissa, exponent): x = mantissa · 2^exponent with
/// 0.5 <= |mantissa| < 1, the mantissa in x's dtype and the exponent i32;
/// zeros, infinities and NaN give themselves and exponent 0, as torch's.
/// Subnormals are normalized through their mantissa field converted to a
/// float (exact), whose exponent tells where the leading bit is.
fn frexp(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let dt = e.dtype(x[0]);
    if !dt.is_float() {
        return Err(Error::invalid(format!(
            "frexp takes a floating-point input, got {dt}"
        )));
    }
    let v = e.convert(x[0], if dt == DType::F64 { dt } else { DType::F32 })?;
    let l = layout(e.dtype(v));
    let dims = e.dims(v);
    let mb = l.mantissa;
    let mut b = Bits { e, l, dims };
    let bits = b.bits(v)?;
    let a = b.magnitude(bits)?;
    let field = b.exponent_field(a)?;
    let mant = b.mantissa_field(a)?;
    let sign = b.sign(bits)?;
    // The exponent field of a number in [0.5, 1), with x's sign.
    let half_field = b.c((l.bias - 1) << mb)?;
    let signed_half = b.e.binary(BinaryOp::Or, sign, half_field)?;
    // Normal numbers: the field's exponent less bias - 1.
    let not_zero = b.cmp(CompareOp::Ge, field, 1)?;
    let finite = b.cmp(CompareOp::Le, field, 2 * l.bias)?;
    let normal = b.e.binary(BinaryOp::And, not_zero, finite)?;
    let e_normal = b.op(BinaryOp::Sub, field, l.bias - 1)?;
    let m_normal = b.e.binary(BinaryOp::Or, signed_half, mant)?;
    // Subnormals: x = mant · 2^(1 - bias - mb), mant = 1.f · 2^E'.
    let field_zero = b.cmp(CompareOp::Eq, field, 0)?;
    let some = b.cmp(CompareOp::Ne, mant, 0)?;
    let subnormal = b.e.binary(BinaryOp::And, field_zero, some)?;
    let mf = b.e.convert(mant, l.float)?;
    let mfb = b.bits(mf)?;
    let mf_field = b.exponent_field(mfb)?;
    let e_sub = b.op(BinaryOp::Sub, mf_field, 2 * l.bias + i64::from(mb) - 2)?;
    let mf_mant = b.mantissa_field(mfb)?;
    let m_sub = b.e.binary(BinaryOp::Or, signed_half, mf_mant)?;
    let zero = b.c(0)?;
    let m_bits = b.e.select(subnormal, m_sub, bits)?;
    let m_bits = b.e.select(normal, m_normal, m_bits)?;
    let ex = b.e.select(subnormal, e_sub, zero)?;
    let ex = b.e.select(normal, e_normal, ex)?;
    let m = b.float(m_bits)?;
    let e = b.e;
    Ok(vec![e.convert(m, dt)?, e.convert(ex, DType::I32)?])
}

pub(super) const OPS: &[OpDef] = &[
    def!("nextafter", Arity::Exactly(2), nextafter),
    def!("frexp", Arity::Exactly(1), frexp),
];

#[cfg(test)]
mod tests {
    use super::super::tests::{run, t};
    use super::super::Attrs;
    use crate::ir::DType;

    fn next(dt: DType, x: &[f64], y: &[f64]) -> Vec<f64> {
        let n = x.len() as u64;
        let r = run(
            "nextafter",
            &[&t(dt, &[n], x), &t(dt, &[n], y)],
            Attrs::new(),
        )
        .unwrap();
        assert_eq!(r[0].ty.dtype, dt);
        r[0].to_f64_vec()
    }

    /// Against Rust's own bit steps (f32, f64) and half's (f16, bf16), over
    /// zeros of both signs, subnormals, powers of two, the largest finite
    /// numbers, infinities and NaN, in both directions.
    #[test]
    fn nextafter_steps_one_representable_number() {
        let xs = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.75,
            3.0,
            -1e-3,
            6e-5,
            1e-40,
            -1e-41,
            5e-324,
            65504.0,
            3.0e38,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            2.0,
            0.5,
            -0.25,
        ];
        let ys = [
            1.0,
            -1.0,
            0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -0.0,
        ];
        for dt in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            let (mut px, mut py) = (vec![], vec![]);
            for &x in &xs {
                for &y in &ys {
                    px.push(x);
                    py.push(y);
                }
            }
            let got = next(dt, &px, &py);
            for ((&x, &y), &g) in px.iter().zip(&py).zip(&got) {
                let want = reference(dt, x, y);
                let same = (g.is_nan() && want.is_nan())
                    || (g == want && g.is_sign_negative() == want.is_sign_negative());
                assert!(same, "{dt} nextafter({x}, {y}) = {g}, want {want}");
            }
        }
    }

    /// C's nextafter on `dt`'s bits, x and y rounded to `dt` first.
    fn reference(dt: DType, x: f64, y: f64) -> f64 {
        fn step<B>(
            x: f64,
            y: f64,
            to: impl Fn(f64) -> B,
            bits: impl Fn(B) -> i64,
            from: impl Fn(i64) -> f64,
        ) -> f64 {
            let (xv, yv) = (from(bits(to(x))), from(bits(to(y))));
            if xv.is_nan() || yv.is_nan() {
                return f64::NAN;
            }
            if xv == yv {
                return yv;
            }
            if xv == 0.0 {
                return if yv > 0.0 { from(1) } else { -from(1) };
            }
            let b = bits(to(xv));
            let away = (yv > xv) == (xv > 0.0);
            from(if away { b + 1 } else { b - 1 })
        }
        match dt {
            DType::F32 => step(
                x,
                y,
                |v| v as f32,
                |v| i64::from(v.to_bits()),
                |b| f64::from(f32::from_bits(b as u32)),
            ),
            DType::F64 => step(
                x,
                y,
                |v| v,
                |v| v.to_bits() as i64,
                |b| f64::from_bits(b as u64),
            ),
            DType::BF16 => step(
                x,
                y,
                half::bf16::from_f64,
                |v| i64::from(v.to_bits()),
                |b| half::bf16::from_bits(b as u16).to_f64(),
            ),
            _ => step(
                x,
                y,
                half::f16::from_f64,
                |v| i64::from(v.to_bits()),
                |b| half::f16::from_bits(b as u16).to_f64(),
            ),
        }
    }

    #[test]
    fn frexp_splits_mantissa_and_exponent() {
        let xs = [
            1.0,
            -5.0,
            0.0,
            -0.0,
            3.0,
            0.1,
            1e-40,
            -3e-42,
            5e-324,
            1e300,
            6e-8,
            65504.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        for dt in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            let x = t(dt, &[xs.len() as u64], &xs);
            let r = run("frexp", &[&x], Attrs::new()).unwrap();
            assert_eq!(r[0].ty.dtype, dt);
            assert_eq!(r[1].ty.dtype, DType::I32);
            let (m, ex) = (r[0].to_f64_vec(), r[1].to_f64_vec());
            for ((&v, &m), &ex) in x.to_f64_vec().iter().zip(&m).zip(&ex) {
                if v == 0.0 || !v.is_finite() {
                    assert!(
                        m.is_nan() && v.is_nan()
                            || (m == v && m.is_sign_negative() == v.is_sign_negative()),
                        "{dt} {v}: {m}"
                    );
                    assert_eq!(ex, 0.0, "{dt} {v}");
                    continue;
                }
                assert!(
                    (0.5..1.0).contains(&m.abs()),
                    "{dt} frexp({v}) mantissa {m}"
                );
                // m · 2^ex in two exact halves (2^-1073 alone is not a
                // power powi reaches).
                let (h, k) = (ex as i32 / 2, ex as i32 - ex as i32 / 2);
                assert_eq!(
                    m * 2f64.powi(h) * 2f64.powi(k),
                    v,
                    "{dt} frexp({v}) = ({m}, {ex})"
                );
            }
        }
        let err = run("frexp", &[&t(DType::I32, &[1], &[3.0])], Attrs::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains("floating-point"), "{err}");
    }
}
