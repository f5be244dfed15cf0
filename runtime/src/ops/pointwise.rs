//! Elementwise ops: arithmetic, math functions, activations, comparisons,
//! logical ops, casts and selection.

use super::attrs::Attrs;
use super::emit::Emitter;
use super::promote::{result_type, Priority};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, UnaryOp, ValueId};

/// Promote inputs as torch does; returns them converted and the dtype.
pub(super) fn promote(
    e: &mut Emitter,
    xs: &[ValueId],
    attrs: &Attrs,
) -> Result<(Vec<ValueId>, DType)> {
    let dt = result_of(e, xs, attrs)?;
    let converted = xs
        .iter()
        .map(|&x| e.convert(x, dt))
        .collect::<Result<Vec<_>>>()?;
    Ok((converted, dt))
}

/// Promotion as torch's CPU kernels compute in "opmath": the inputs, the
/// dtype to compute in, and the result dtype. For a bf16 or f16 result the
/// computation is f32, rounded once at the end; a Python number or a 0-dim
/// tensor (a CPU scalar in torch) enters at f32 precision (torch reads its
/// original value, where a dimensioned tensor is cast to the result dtype
/// first). Other results compute in their own dtype, as `promote`.
pub(super) fn promote_opmath(
    e: &mut Emitter,
    xs: &[ValueId],
    attrs: &Attrs,
) -> Result<(Vec<ValueId>, DType, DType)> {
    let places = priorities(e, xs, attrs)?;
    let dt = result_type(&places);
    let ct = opmath(dt);
    let mut out = Vec::with_capacity(xs.len());
    for (&x, &(_, place)) in xs.iter().zip(&places) {
        let x = if place == Priority::Dimensioned || ct == dt {
            e.convert(x, dt)?
        } else {
            x
        };
        out.push(e.convert(x, ct)?);
    }
    Ok((out, ct, dt))
}

/// `promote_opmath`'s inputs and result dtype where a bf16 or f16 result
/// takes a Python number or a 0-dim tensor of another dtype (which torch's
/// CPU kernels read at f32); None elsewhere, for the op's usual path.
fn with_wide_number(
    e: &mut Emitter,
    xs: &[ValueId],
    attrs: &Attrs,
) -> Result<Option<(Vec<ValueId>, DType)>> {
    let places = priorities(e, xs, attrs)?;
    let dt = result_type(&places);
    let wide = opmath(dt) != dt
        && places
            .iter()
            .any(|&(d, place)| place != Priority::Dimensioned && d != dt);
    if !wide {
        return Ok(None);
    }
    let (xs, _, dt) = promote_opmath(e, xs, attrs)?;
    Ok(Some((xs, dt)))
}

/// The dtype torch's CPU kernels compute a `dt` result in: f32 for bf16
/// and f16, `dt` itself otherwise.
fn opmath(dt: DType) -> DType {
    match dt {
        DType::BF16 | DType::F16 => DType::F32,
        other => other,
    }
}

/// Promote, then move integer and bool results to the default float dtype
/// (for ops such as exp or true division that always give floats).
pub(super) fn promote_float(
    e: &mut Emitter,
    xs: &[ValueId],
    attrs: &Attrs,
) -> Result<(Vec<ValueId>, DType)> {
    let (xs, dt) = promote(e, xs, attrs)?;
    if dt.is_float() {
        return Ok((xs, dt));
    }
    let xs = xs
        .iter()
        .map(|&x| e.convert(x, DType::F32))
        .collect::<Result<Vec<_>>>()?;
    Ok((xs, DType::F32))
}

fn float_unary(e: &mut Emitter, x: ValueId, op: UnaryOp, attrs: &Attrs) -> Result<ValueId> {
    let (xs, _) = promote_float(e, &[x], attrs)?;
    e.unary(op, xs[0])
}

macro_rules! float_unary_ops {
    ($($fname:ident => $op:ident),* $(,)?) => {
        $(
            fn $fname(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
                Ok(vec![float_unary(e, x[0], UnaryOp::$op, a)?])
            }
        )*
    };
}
float_unary_ops!(
    exp => Exp, expm1 => Expm1, log => Log, log1p => Log1p, sqrt => Sqrt, rsqrt => Rsqrt,
    tanh => Tanh, sigmoid => Logistic, sin => Sin, cos => Cos, erf => Erf,
);

fn same_type_unary(e: &mut Emitter, x: &[ValueId], op: UnaryOp) -> Result<Vec<ValueId>> {
    Ok(vec![e.unary(op, x[0])?])
}
fn neg(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    if e.dtype(x[0]) == DType::Bool {
        return Err(Error::invalid(
            "negation of a bool tensor is not supported; use logical_not",
        ));
    }
    same_type_unary(e, x, UnaryOp::Neg)
}
fn abs(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    if e.dtype(x[0]) == DType::Bool {
        return Ok(vec![x[0]]);
    }
    same_type_unary(e, x, UnaryOp::Abs)
}
fn sign(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    if e.dtype(x[0]) == DType::Bool {
        return Ok(vec![x[0]]);
    }
    same_type_unary(e, x, UnaryOp::Sign)
}
/// floor/ceil/round are identities on integers (as torch).
fn rounding(e: &mut Emitter, x: &[ValueId], op: UnaryOp) -> Result<Vec<ValueId>> {
    if !e.dtype(x[0]).is_float() {
        return Ok(vec![x[0]]);
    }
    same_type_unary(e, x, op)
}
fn floor(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    rounding(e, x, UnaryOp::Floor)
}
fn ceil(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    rounding(e, x, UnaryOp::Ceil)
}
fn round(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    rounding(e, x, UnaryOp::Round)
}
fn reciprocal(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (xs, dt) = promote_float(e, x, a)?;
    let one = e.scalar(dt, 1.0)?;
    Ok(vec![e.div(one, xs[0])?])
}
fn square(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (xs, dt) = promote(e, x, a)?;
    let xs = if dt == DType::Bool {
        vec![e.convert(xs[0], DType::I64)?]
    } else {
        xs
    };
    Ok(vec![e.mul(xs[0], xs[0])?])
}
fn isfinite(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    if !e.dtype(x[0]).is_float() {
        let t = e.full(DType::Bool, &e.dims(x[0]), 1.0)?;
        return Ok(vec![t]);
    }
    Ok(vec![e.unary(UnaryOp::IsFinite, x[0])?])
}
fn isnan(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    Ok(vec![e.compare(CompareOp::Ne, x[0], x[0])?])
}

/// x + alpha * y (add), x - alpha * y (sub). alpha is the attribute, or a
/// third input (a Python number, so a new value compiles nothing), which
/// torch rounds to the result dtype and, for bf16 and f16, applies in f32
/// with the sum rounded once.
fn add_like(e: &mut Emitter, x: &[ValueId], a: &Attrs, op: BinaryOp) -> Result<Vec<ValueId>> {
    if x.len() == 3 {
        let (xs, dt) = promote(e, &x[..2], a)?;
        if dt == DType::Bool {
            return Err(Error::invalid("alpha is not supported for bool tensors"));
        }
        if !dt.is_float() && e.dtype(x[2]).is_float() {
            return Err(Error::invalid(
                "for integer input tensors, alpha must not be a floating point number",
            ));
        }
        let ct = opmath(dt);
        let alpha = e.convert(x[2], dt)?;
        let alpha = e.convert(alpha, ct)?;
        let (x0, x1) = (e.convert(xs[0], ct)?, e.convert(xs[1], ct)?);
        let y = e.mul(x1, alpha)?;
        let r = e.binary(op, x0, y)?;
        return Ok(vec![e.convert(r, dt)?]);
    }
    let (xs, dt) = promote(e, x, a)?;
    let alpha = a.float_or("alpha", 1.0)?;
    if dt == DType::Bool {
        if op == BinaryOp::Sub {
            return Err(Error::invalid(
                "subtraction of bool tensors is not supported; use logical_xor",
            ));
        }
        return Ok(vec![e.binary(BinaryOp::Or, xs[0], xs[1])?]);
    }
    if !dt.is_float() && alpha.fract() != 0.0 {
        return Err(Error::invalid(format!(
            "alpha {alpha} must be a whole number for integer inputs"
        )));
    }
    let y = if alpha != 1.0 {
        e.binary_scalar(BinaryOp::Mul, xs[1], alpha)?
    } else {
        xs[1]
    };
    Ok(vec![e.binary(op, xs[0], y)?])
}
fn add(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    add_like(e, x, a, BinaryOp::Add)
}
fn sub(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    add_like(e, x, a, BinaryOp::Sub)
}
/// `op` after promotion, or `on_bool` when the promoted dtype is bool (as
/// torch: bool * bool is and, max is or, min is and).
fn bool_aware(
    e: &mut Emitter,
    x: &[ValueId],
    a: &Attrs,
    op: BinaryOp,
    on_bool: BinaryOp,
) -> Result<Vec<ValueId>> {
    let (xs, dt) = promote(e, x, a)?;
    let op = if dt == DType::Bool { on_bool } else { op };
    Ok(vec![e.binary(op, xs[0], xs[1])?])
}

/// x * y; a bf16 or f16 tensor times a number multiplies at f32 (torch's
/// CPU kernel reads the number at f32, not rounded to the tensor's dtype).
fn mul(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    if let Some((xs, dt)) = with_wide_number(e, x, a)? {
        let r = e.mul(xs[0], xs[1])?;
        return Ok(vec![e.convert(r, dt)?]);
    }
    bool_aware(e, x, a, BinaryOp::Mul, BinaryOp::And)
}

/// Each input's dtype and its standing in torch's promotion: a Python
/// number (listed in `wrapped`), a 0-dim tensor, or a dimensioned one.
fn priorities(e: &Emitter, xs: &[ValueId], attrs: &Attrs) -> Result<Vec<(DType, Priority)>> {
    let wrapped = attrs.ints_opt("wrapped")?.unwrap_or_default();
    Ok(xs
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let p = if wrapped.contains(&(i as i64)) {
                Priority::WrappedNumber
            } else if e.rank(x) == 0 {
                Priority::ZeroDim
            } else {
                Priority::Dimensioned
            };
            (e.dtype(x), p)
        })
        .collect())
}

/// The dtype these inputs promote to (torch.result_type).
fn result_of(e: &Emitter, xs: &[ValueId], attrs: &Attrs) -> Result<DType> {
    Ok(result_type(&priorities(e, xs, attrs)?))
}

/// The C remainder `r` of x / y (sign of x), and where Python's floor
/// semantics differ from it: r is nonzero and its sign differs from y's
/// (there floor division is one less, and the Python remainder is r + y).
fn remainder_with_fix(e: &mut Emitter, x: ValueId, y: ValueId) -> Result<(ValueId, ValueId)> {
    let r = e.binary(BinaryOp::Rem, x, y)?;
    let zero = e.full_like(r, 0.0)?;
    let nonzero = e.compare(CompareOp::Ne, r, zero)?;
    let rneg = e.compare(CompareOp::Lt, r, zero)?;
    let yneg = e.compare(CompareOp::Lt, y, zero)?;
    let differ = e.binary(BinaryOp::Xor, rneg, yneg)?;
    Ok((r, e.binary(BinaryOp::And, nonzero, differ)?))
}

/// torch.div: true division, or rounding_mode "trunc" / "floor".
pub(super) fn div(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let mode = a.str_or("rounding_mode", "none")?.to_string();
    // A bf16 or f16 tensor and a number: the quotient (and its rounding
    // down) at f32, rounded to the dtype once, as torch's CPU kernel.
    let wide = if matches!(mode.as_str(), "none" | "" | "trunc" | "floor") {
        with_wide_number(e, x, a)?
    } else {
        None
    };
    if let Some((xs, dt)) = wide {
        let q = e.div(xs[0], xs[1])?;
        let q = match mode.as_str() {
            "trunc" => trunc(e, q)?,
            "floor" => e.unary(UnaryOp::Floor, q)?,
            _ => q,
        };
        return Ok(vec![e.convert(q, dt)?]);
    }
    match mode.as_str() {
        "none" | "" => {
            let (xs, _) = promote_float(e, x, a)?;
            Ok(vec![e.div(xs[0], xs[1])?])
        }
        "trunc" | "floor" => {
            let (xs, dt) = promote(e, x, a)?;
            if dt == DType::Bool {
                return Err(Error::invalid(
                    "integer division of bool tensors is not supported",
                ));
            }
            let q = e.div(xs[0], xs[1])?;
            if dt.is_float() {
                return Ok(vec![if mode == "trunc" {
                    trunc(e, q)?
                } else {
                    e.unary(UnaryOp::Floor, q)?
                }]);
            }
            if mode == "trunc" {
                return Ok(vec![q]);
            }
            // Integer floor division: truncated quotient minus one where the
            // remainder is nonzero and the signs differ.
            let (xb, yb) = e.broadcast_pair(xs[0], xs[1])?;
            let (_, fix) = remainder_with_fix(e, xb, yb)?;
            let one = e.full_like(q, 1.0)?;
            let qm1 = e.sub(q, one)?;
            Ok(vec![e.select(fix, qm1, q)?])
        }
        other => Err(Error::invalid(format!(
            "rounding_mode {other:?}; use none, \"trunc\" or \"floor\""
        ))),
    }
}

/// Round toward zero: floor for positive, ceil for negative.
pub(super) fn trunc(e: &mut Emitter, x: ValueId) -> Result<ValueId> {
    let f = e.unary(UnaryOp::Floor, x)?;
    let c = e.unary(UnaryOp::Ceil, x)?;
    let zero = e.full_like(x, 0.0)?;
    let neg = e.compare(CompareOp::Lt, x, zero)?;
    e.select(neg, c, f)
}
fn trunc_op(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    if !e.dtype(x[0]).is_float() {
        return Ok(vec![x[0]]);
    }
    Ok(vec![trunc(e, x[0])?])
}

/// Python-style remainder (sign of the divisor), as torch.remainder.
fn remainder(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (xs, _) = promote(e, x, a)?;
    let (xb, yb) = e.broadcast_pair(xs[0], xs[1])?;
    let (r, fix) = remainder_with_fix(e, xb, yb)?;
    let ry = e.add(r, yb)?;
    Ok(vec![e.select(fix, ry, r)?])
}
fn fmod(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (xs, _) = promote(e, x, a)?;
    Ok(vec![e.binary(BinaryOp::Rem, xs[0], xs[1])?])
}

fn pow(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (xs, dt) = promote(e, x, a)?;
    if dt.is_float() {
        return Ok(vec![e.binary(BinaryOp::Pow, xs[0], xs[1])?]);
    }
    // Integer powers through f64 (exact for the results that fit in 53 bits).
    let xf = e.convert(xs[0], DType::F64)?;
    let yf = e.convert(xs[1], DType::F64)?;
    let p = e.binary(BinaryOp::Pow, xf, yf)?;
    let r = e.unary(UnaryOp::Round, p)?;
    Ok(vec![e.convert(r, dt)?])
}

fn maximum(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    bool_aware(e, x, a, BinaryOp::Max, BinaryOp::Or)
}
fn minimum(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    bool_aware(e, x, a, BinaryOp::Min, BinaryOp::And)
}
fn atan2(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (xs, _) = promote_float(e, x, a)?;
    Ok(vec![e.binary(BinaryOp::Atan2, xs[0], xs[1])?])
}

fn compare(e: &mut Emitter, x: &[ValueId], a: &Attrs, op: CompareOp) -> Result<Vec<ValueId>> {
    let (xs, _) = promote(e, x, a)?;
    Ok(vec![e.compare(op, xs[0], xs[1])?])
}
macro_rules! compare_ops {
    ($($fname:ident => $op:ident),* $(,)?) => {
        $(
            fn $fname(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
                compare(e, x, a, CompareOp::$op)
            }
        )*
    };
}
compare_ops!(eq => Eq, ne => Ne, lt => Lt, le => Le, gt => Gt, ge => Ge);

fn to_bool(e: &mut Emitter, x: ValueId) -> Result<ValueId> {
    e.convert(x, DType::Bool)
}
fn logical(e: &mut Emitter, x: &[ValueId], op: BinaryOp) -> Result<Vec<ValueId>> {
    let a = to_bool(e, x[0])?;
    let b = to_bool(e, x[1])?;
    Ok(vec![e.binary(op, a, b)?])
}
fn logical_and(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    logical(e, x, BinaryOp::And)
}
fn logical_or(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    logical(e, x, BinaryOp::Or)
}
fn logical_xor(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    logical(e, x, BinaryOp::Xor)
}
fn logical_not(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let b = to_bool(e, x[0])?;
    Ok(vec![e.unary(UnaryOp::Not, b)?])
}
fn bitwise(e: &mut Emitter, x: &[ValueId], a: &Attrs, op: BinaryOp) -> Result<Vec<ValueId>> {
    let (xs, dt) = promote(e, x, a)?;
    if dt.is_float() {
        return Err(Error::invalid(format!(
            "needs integer or bool inputs, got {dt}"
        )));
    }
    Ok(vec![e.binary(op, xs[0], xs[1])?])
}
fn bitwise_and(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    bitwise(e, x, a, BinaryOp::And)
}
fn bitwise_or(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    bitwise(e, x, a, BinaryOp::Or)
}
fn bitwise_xor(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    bitwise(e, x, a, BinaryOp::Xor)
}
fn bitwise_not(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    if e.dtype(x[0]).is_float() {
        return Err(Error::invalid("needs an integer or bool input"));
    }
    Ok(vec![e.unary(UnaryOp::Not, x[0])?])
}

/// Cast to the `dtype` attribute.
fn cast(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let to = a
        .dtype_opt("dtype")?
        .ok_or_else(|| Error::invalid("attribute dtype is required"))?;
    Ok(vec![e.convert(x[0], to)?])
}

/// Copy (with cast and broadcast) of the input: the op behind copy_ and
/// expand-then-contiguous.
fn copy(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let mut v = x[0];
    if let Some(to) = a.dtype_opt("dtype")? {
        v = e.convert(v, to)?;
    }
    if let Some(sizes) = a.ints_opt("size")? {
        let dims = sizes
            .iter()
            .map(|&s| u64::try_from(s).map_err(|_| Error::invalid(format!("size {s} is negative"))))
            .collect::<Result<Vec<_>>>()?;
        v = e.broadcast_to(v, &dims)?;
    }
    // A node even for the identity, so the output is a fresh value.
    super::pointwise_copy(e, v)
}

/// where(cond, x, y)
fn where_(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let cond = to_bool(e, x[0])?;
    let (xs, _) = promote(e, &x[1..], &shift_wrapped(a, 1)?)?;
    Ok(vec![e.select(cond, xs[0], xs[1])?])
}

/// `wrapped` indices shifted down by `by` (for ops whose first inputs do
/// not take part in promotion).
fn shift_wrapped(a: &Attrs, by: i64) -> Result<Attrs> {
    let mut b = a.clone();
    if let Some(w) = a.ints_opt("wrapped")? {
        b.set(
            "wrapped",
            super::Attr::Ints(w.into_iter().map(|i| i - by).filter(|&i| i >= 0).collect()),
        );
    }
    Ok(b)
}

/// masked_fill(x, mask, value attribute)
fn masked_fill(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let value = a.float("value")?;
    let mask = to_bool(e, x[1])?;
    let dims = e.dims(x[0]);
    let v = e.full(e.dtype(x[0]), &dims, value)?;
    let mask = e.broadcast_to(mask, &dims).map_err(|_| {
        Error::invalid(format!(
            "mask of shape {:?} does not broadcast to {dims:?}",
            e.dims(x[1])
        ))
    })?;
    Ok(vec![e.select(mask, v, x[0])?])
}

/// clamp(x, min=, max=) with optional bounds (attributes or tensor inputs).
fn clamp(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let mut v = x[0];
    let dt = e.dtype(v);
    if let Some(lo) = a.float_opt("min")? {
        let s = e.scalar(dt, lo)?;
        v = e.max(v, s)?;
    }
    if let Some(hi) = a.float_opt("max")? {
        let s = e.scalar(dt, hi)?;
        v = e.min(v, s)?;
    }
    Ok(vec![v])
}

fn relu(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    if e.dtype(x[0]) == DType::Bool {
        return Ok(vec![x[0]]);
    }
    let zero = e.scalar(e.dtype(x[0]), 0.0)?;
    Ok(vec![e.max(x[0], zero)?])
}

/// gelu(x, approximate="none" | "tanh")
fn gelu(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (xs, dt) = promote_float(e, x, a)?;
    let x = xs[0];
    let approx = a.str_or("approximate", "none")?.to_string();
    let half = e.scalar(dt, 0.5)?;
    let one = e.scalar(dt, 1.0)?;
    let inner = match approx.as_str() {
        "none" => {
            let x2 = e.binary_scalar(BinaryOp::Mul, x, std::f64::consts::FRAC_1_SQRT_2)?;
            e.unary(UnaryOp::Erf, x2)?
        }
        "tanh" => {
            let x3 = e.mul(x, x)?;
            let x3 = e.mul(x3, x)?;
            let k = e.binary_scalar(BinaryOp::Mul, x3, 0.044715)?;
            let s = e.add(x, k)?;
            let s = e.binary_scalar(BinaryOp::Mul, s, (2.0 / std::f64::consts::PI).sqrt())?;
            e.unary(UnaryOp::Tanh, s)?
        }
        other => {
            return Err(Error::invalid(format!(
                "approximate {other:?}; use \"none\" or \"tanh\""
            )))
        }
    };
    let t = e.add(inner, one)?;
    let hx = e.mul(x, half)?;
    Ok(vec![e.mul(hx, t)?])
}

/// silu(x) = x * sigmoid(x)
fn silu(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (xs, _) = promote_float(e, x, a)?;
    let s = e.unary(UnaryOp::Logistic, xs[0])?;
    Ok(vec![e.mul(xs[0], s)?])
}

/// lerp(start, end, weight), as torch computes it: start + weight * (end -
/// start) where |weight| < 0.5, else end - (end - start) * (1 - weight);
/// for bf16 and f16 at f32, rounded once (the weight a number at f32).
fn lerp(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (xs, ct, dt) = promote_opmath(e, x, a)?;
    let (s, t, w) = (xs[0], xs[1], xs[2]);
    let d = e.sub(t, s)?;
    let wd = e.mul(w, d)?;
    let low = e.add(s, wd)?;
    let one = e.scalar(ct, 1.0)?;
    let rest = e.sub(one, w)?;
    let dr = e.mul(d, rest)?;
    let high = e.sub(t, dr)?;
    let aw = e.unary(UnaryOp::Abs, w)?;
    let half = e.scalar(ct, 0.5)?;
    let small = e.compare(CompareOp::Lt, aw, half)?;
    let r = e.select(small, low, high)?;
    Ok(vec![e.convert(r, dt)?])
}

/// addcmul(x, t1, t2[, value]): x + (value * t1) * t2; addcdiv likewise
/// with /. The value is the attribute or a fourth input (a Python
/// number); for bf16 and f16 all of it at f32, rounded once, as torch's
/// CPU kernels (which fuse the last multiply-add: one element in a few
/// thousand may differ by a unit in the last place).
fn addc(e: &mut Emitter, x: &[ValueId], a: &Attrs, op: BinaryOp) -> Result<Vec<ValueId>> {
    let (xs, ct, dt) = promote_opmath(e, &x[..3], a)?;
    let t1 = match x.get(3) {
        Some(&v) => {
            let v = e.convert(v, ct)?;
            e.mul(v, xs[1])?
        }
        None => {
            let value = a.float_or("value", 1.0)?;
            if value != 1.0 {
                e.binary_scalar(BinaryOp::Mul, xs[1], value)?
            } else {
                xs[1]
            }
        }
    };
    let p = e.binary(op, t1, xs[2])?;
    let r = e.add(xs[0], p)?;
    Ok(vec![e.convert(r, dt)?])
}
fn addcmul(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    addc(e, x, a, BinaryOp::Mul)
}
fn addcdiv(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dt = result_of(e, &x[..3], a)?;
    if !dt.is_float() {
        return Err(Error::invalid(format!(
            "integer division with addcdiv is not supported (inputs promote to {dt})"
        )));
    }
    addc(e, x, a, BinaryOp::Div)
}

pub(super) const OPS: &[OpDef] = &[
    def!("add", Arity::Between(2, 3), add),
    def!("sub", Arity::Between(2, 3), sub),
    def!("mul", Arity::Exactly(2), mul),
    def!("div", Arity::Exactly(2), div),
    def!("remainder", Arity::Exactly(2), remainder),
    def!("fmod", Arity::Exactly(2), fmod),
    def!("pow", Arity::Exactly(2), pow),
    def!("maximum", Arity::Exactly(2), maximum),
    def!("minimum", Arity::Exactly(2), minimum),
    def!("atan2", Arity::Exactly(2), atan2),
    def!("neg", Arity::Exactly(1), neg),
    def!("abs", Arity::Exactly(1), abs),
    def!("sign", Arity::Exactly(1), sign),
    def!("exp", Arity::Exactly(1), exp),
    def!("expm1", Arity::Exactly(1), expm1),
    def!("log", Arity::Exactly(1), log),
    def!("log1p", Arity::Exactly(1), log1p),
    def!("sqrt", Arity::Exactly(1), sqrt),
    def!("rsqrt", Arity::Exactly(1), rsqrt),
    def!("tanh", Arity::Exactly(1), tanh),
    def!("sigmoid", Arity::Exactly(1), sigmoid),
    def!("sin", Arity::Exactly(1), sin),
    def!("cos", Arity::Exactly(1), cos),
    def!("erf", Arity::Exactly(1), erf),
    def!("floor", Arity::Exactly(1), floor),
    def!("ceil", Arity::Exactly(1), ceil),
    def!("round", Arity::Exactly(1), round),
    def!("trunc", Arity::Exactly(1), trunc_op),
    def!("reciprocal", Arity::Exactly(1), reciprocal),
    def!("square", Arity::Exactly(1), square),
    def!("isfinite", Arity::Exactly(1), isfinite),
    def!("isnan", Arity::Exactly(1), isnan),
    def!("eq", Arity::Exactly(2), eq),
    def!("ne", Arity::Exactly(2), ne),
    def!("lt", Arity::Exactly(2), lt),
    def!("le", Arity::Exactly(2), le),
    def!("gt", Arity::Exactly(2), gt),
    def!("ge", Arity::Exactly(2), ge),
    def!("logical_and", Arity::Exactly(2), logical_and),
    def!("logical_or", Arity::Exactly(2), logical_or),
    def!("logical_xor", Arity::Exactly(2), logical_xor),
    def!("logical_not", Arity::Exactly(1), logical_not),
    def!("bitwise_and", Arity::Exactly(2), bitwise_and),
    def!("bitwise_or", Arity::Exactly(2), bitwise_or),
    def!("bitwise_xor", Arity::Exactly(2), bitwise_xor),
    def!("bitwise_not", Arity::Exactly(1), bitwise_not),
    def!("cast", Arity::Exactly(1), cast),
    def!("copy", Arity::Exactly(1), copy),
    def!("where", Arity::Exactly(3), where_),
    def!("masked_fill", Arity::Exactly(2), masked_fill),
    def!("clamp", Arity::Exactly(1), clamp),
    def!("relu", Arity::Exactly(1), relu),
    def!("gelu", Arity::Exactly(1), gelu),
    def!("silu", Arity::Exactly(1), silu),
    def!("lerp", Arity::Exactly(3), lerp),
    def!("addcmul", Arity::Between(3, 4), addcmul),
    def!("addcdiv", Arity::Between(3, 4), addcdiv),
];
