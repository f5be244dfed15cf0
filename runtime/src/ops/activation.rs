//! Activations beyond relu, gelu and silu, each with the backward op that
//! torch's autograd calls for it: elu (and so celu and selu, which torch
//! builds from it), leaky_relu, hardtanh (relu6), softplus, hardswish,
//! hardsigmoid, mish, threshold, softshrink, hardshrink, glu and prelu.
//! Each follows torch's CPU kernel formula and its branch points (which
//! side of a boundary takes which branch), computes at f32 for bf16 and
//! f16 and rounds once; integer inputs are refused, as torch refuses them.

use super::attrs::Attrs;
use super::backward::float_pair;
use super::emit::wrap_dim;
use super::emit::Emitter;
use super::support::float_compute_dtype;
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{CompareOp, DType, Prim, UnaryOp, ValueId};

/// The input widened to its compute dtype, with the dtype to round back
/// to; `what` names the op in the error for a non-float input.
fn widen(e: &mut Emitter, x: ValueId, what: &str) -> Result<(ValueId, DType)> {
    let ct = float_compute_dtype(e, x, what)?;
    let dt = e.dtype(x);
    Ok((e.convert(x, ct)?, dt))
}

fn mul_s(e: &mut Emitter, v: ValueId, s: f64) -> Result<ValueId> {
    e.binary_scalar(crate::ir::BinaryOp::Mul, v, s)
}

fn done(e: &mut Emitter, r: ValueId, dt: DType) -> Result<Vec<ValueId>> {
    Ok(vec![e.convert(r, dt)?])
}

/// elu(x; alpha, scale, input_scale): x · scale where x > 0, else
/// alpha · scale · expm1(x · input_scale).
fn elu(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let alpha = a.float_or("alpha", 1.0)?;
    let scale = a.float_or("scale", 1.0)?;
    let input_scale = a.float_or("input_scale", 1.0)?;
    let (v, dt) = widen(e, x[0], "elu")?;
    let pos = mul_s(e, v, scale)?;
    let t = mul_s(e, v, input_scale)?;
    let t = e.unary(UnaryOp::Expm1, t)?;
    let neg = mul_s(e, t, alpha * scale)?;
    let le = e.compare_scalar(CompareOp::Le, v, 0.0)?;
    let r = e.select(le, neg, pos)?;
    done(e, r, dt)
}

/// elu_backward(grad, x or the result; alpha, scale, input_scale,
/// is_result): grad · scale where positive, else grad · input_scale ·
/// (result + alpha · scale) from the result, or grad · input_scale ·
/// alpha · scale · e^(x · input_scale) from the input.
fn elu_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let alpha = a.float_or("alpha", 1.0)?;
    let scale = a.float_or("scale", 1.0)?;
    let input_scale = a.float_or("input_scale", 1.0)?;
    let is_result = a.bool_or("is_result", false)?;
    let (g, v, dt) = float_pair(e, x[0], x[1])?;
    let pos = mul_s(e, g, scale)?;
    let neg = if is_result {
        let c = e.binary_scalar(crate::ir::BinaryOp::Add, v, alpha * scale)?;
        let gi = mul_s(e, g, input_scale)?;
        e.mul(gi, c)?
    } else {
        let t = mul_s(e, v, input_scale)?;
        let t = e.unary(UnaryOp::Exp, t)?;
        let gi = mul_s(e, g, input_scale * alpha * scale)?;
        e.mul(gi, t)?
    };
    let le = e.compare_scalar(CompareOp::Le, v, 0.0)?;
    let r = e.select(le, neg, pos)?;
    done(e, r, dt)
}

/// leaky_relu(x; negative_slope = 0.01): x where x > 0, else x · slope.
fn leaky_relu(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let slope = a.float_or("negative_slope", 0.01)?;
    let (v, dt) = widen(e, x[0], "leaky_relu")?;
    let neg = mul_s(e, v, slope)?;
    let gt = e.compare_scalar(CompareOp::Gt, v, 0.0)?;
    let r = e.select(gt, v, neg)?;
    done(e, r, dt)
}

/// leaky_relu_backward(grad, x; negative_slope): grad where x > 0, else
/// grad · slope.
fn leaky_relu_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let slope = a.float_or("negative_slope", 0.01)?;
    let (g, v, dt) = float_pair(e, x[0], x[1])?;
    let neg = mul_s(e, g, slope)?;
    let gt = e.compare_scalar(CompareOp::Gt, v, 0.0)?;
    let r = e.select(gt, g, neg)?;
    done(e, r, dt)
}

/// hardtanh(x; min_val = -1, max_val = 1): x clamped (NaN stays NaN).
fn hardtanh(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let lo = a.float_or("min_val", -1.0)?;
    let hi = a.float_or("max_val", 1.0)?;
    let (v, dt) = widen(e, x[0], "hardtanh")?;
    let l = e.scalar(e.dtype(v), lo)?;
    let h = e.scalar(e.dtype(v), hi)?;
    let r = e.max(v, l)?;
    let r = e.min(r, h)?;
    done(e, r, dt)
}

/// hardtanh_backward(grad, x; min_val, max_val): 0 where x <= min_val or
/// x >= max_val, else grad.
fn hardtanh_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let lo = a.float_or("min_val", -1.0)?;
    let hi = a.float_or("max_val", 1.0)?;
    let (g, v, dt) = float_pair(e, x[0], x[1])?;
    let below = e.compare_scalar(CompareOp::Le, v, lo)?;
    let above = e.compare_scalar(CompareOp::Ge, v, hi)?;
    let out = e.binary(crate::ir::BinaryOp::Or, below, above)?;
    let zero = e.full_like(g, 0.0)?;
    let r = e.select(out, zero, g)?;
    done(e, r, dt)
}

/// softplus(x; beta = 1, threshold = 20): x where x · beta > threshold,
/// else log1p(e^(x · beta)) / beta.
fn softplus(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let beta = a.float_or("beta", 1.0)?;
    let threshold = a.float_or("threshold", 20.0)?;
    let (v, dt) = widen(e, x[0], "softplus")?;
    let xb = mul_s(e, v, beta)?;
    let t = e.unary(UnaryOp::Exp, xb)?;
    let t = e.unary(UnaryOp::Log1p, t)?;
    let soft = mul_s(e, t, 1.0 / beta)?;
    let lin = e.compare_scalar(CompareOp::Gt, xb, threshold)?;
    let r = e.select(lin, v, soft)?;
    done(e, r, dt)
}

/// softplus_backward(grad, x; beta, threshold): grad where x · beta >
/// threshold, else grad · z / (z + 1) with z = e^(x · beta).
fn softplus_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let beta = a.float_or("beta", 1.0)?;
    let threshold = a.float_or("threshold", 20.0)?;
    let (g, v, dt) = float_pair(e, x[0], x[1])?;
    let xb = mul_s(e, v, beta)?;
    let z = e.unary(UnaryOp::Exp, xb)?;
    let z1 = e.binary_scalar(crate::ir::BinaryOp::Add, z, 1.0)?;
    let gz = e.mul(g, z)?;
    let soft = e.div(gz, z1)?;
    let lin = e.compare_scalar(CompareOp::Gt, xb, threshold)?;
    let r = e.select(lin, g, soft)?;
    done(e, r, dt)
}

/// min(max(x + 3, 0), 6), hardswish's and hardsigmoid's ramp.
fn relu6_of_plus3(e: &mut Emitter, v: ValueId) -> Result<ValueId> {
    let t = e.binary_scalar(crate::ir::BinaryOp::Add, v, 3.0)?;
    let zero = e.scalar(e.dtype(v), 0.0)?;
    let six = e.scalar(e.dtype(v), 6.0)?;
    let t = e.max(t, zero)?;
    e.min(t, six)
}

/// hardswish(x) = x · min(max(x + 3, 0), 6) / 6.
fn hardswish(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let (v, dt) = widen(e, x[0], "hardswish")?;
    let t = relu6_of_plus3(e, v)?;
    let p = e.mul(v, t)?;
    let six = e.scalar(e.dtype(v), 6.0)?;
    let r = e.div(p, six)?;
    done(e, r, dt)
}

/// hardswish_backward(grad, x): 0 up to -3, grad · (x / 3 + 1/2) below 3,
/// grad from 3 (torch's ends: 0 at -3, grad at 3).
fn hardswish_backward(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let (g, v, dt) = float_pair(e, x[0], x[1])?;
    let three = e.scalar(e.dtype(v), 3.0)?;
    let t = e.div(v, three)?;
    let t = e.binary_scalar(crate::ir::BinaryOp::Add, t, 0.5)?;
    let mid = e.mul(g, t)?;
    let lt3 = e.compare_scalar(CompareOp::Lt, v, 3.0)?;
    let r = e.select(lt3, mid, g)?;
    let below = e.compare_scalar(CompareOp::Le, v, -3.0)?;
    let zero = e.full_like(r, 0.0)?;
    let r = e.select(below, zero, r)?;
    done(e, r, dt)
}

/// hardsigmoid(x) = min(max(x + 3, 0), 6) / 6.
fn hardsigmoid(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let (v, dt) = widen(e, x[0], "hardsigmoid")?;
    let t = relu6_of_plus3(e, v)?;
    let six = e.scalar(e.dtype(v), 6.0)?;
    let r = e.div(t, six)?;
    done(e, r, dt)
}

/// hardsigmoid_backward(grad, x): grad · 1/6 strictly between -3 and 3,
/// else 0, with 1/6 rounded to f32 in every dtype, as torch's CPU kernel
/// writes it (`1.0f / 6.0f`): its f64 gradient is 5e-9 off 1/6.
fn hardsigmoid_backward(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let (g, v, dt) = float_pair(e, x[0], x[1])?;
    let gt = e.compare_scalar(CompareOp::Gt, v, -3.0)?;
    let lt = e.compare_scalar(CompareOp::Lt, v, 3.0)?;
    let inside = e.binary(crate::ir::BinaryOp::And, gt, lt)?;
    let d = mul_s(e, g, (1.0f32 / 6.0) as f64)?;
    let zero = e.full_like(d, 0.0)?;
    let r = e.select(inside, d, zero)?;
    done(e, r, dt)
}

/// mish(x) = x · tanh(log1p(e^x)) (torch's form: no softplus threshold).
fn mish(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let (v, dt) = widen(e, x[0], "mish")?;
    let t = e.unary(UnaryOp::Exp, v)?;
    let t = e.unary(UnaryOp::Log1p, t)?;
    let t = e.unary(UnaryOp::Tanh, t)?;
    let r = e.mul(v, t)?;
    done(e, r, dt)
}

/// threshold(x; threshold, value): value where x <= threshold, else x.
fn threshold(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let th = a.float("threshold")?;
    let value = a.float("value")?;
    let v = x[0];
    if e.dtype(v) == DType::Bool {
        return Err(Error::invalid(
            "threshold of a bool tensor is not supported",
        ));
    }
    let le = e.compare_scalar(CompareOp::Le, v, th)?;
    let fill = e.full_like(v, value)?;
    Ok(vec![e.select(le, fill, v)?])
}

/// Where |x| <= lambd (both ends in, NaN out): softshrink's and
/// hardshrink's dead zone.
fn dead_zone(e: &mut Emitter, v: ValueId, lambd: f64) -> Result<ValueId> {
    let ge = e.compare_scalar(CompareOp::Ge, v, -lambd)?;
    let le = e.compare_scalar(CompareOp::Le, v, lambd)?;
    e.binary(crate::ir::BinaryOp::And, ge, le)
}

/// softshrink(x; lambd = 0.5): x - lambd above lambd, x + lambd below
/// -lambd, 0 between (NaN stays NaN).
fn softshrink(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let lambd = a.float_or("lambd", 0.5)?;
    if lambd < 0.0 {
        return Err(Error::invalid(format!(
            "lambda must be greater or equal to 0, but found to be {lambd}."
        )));
    }
    let (v, dt) = widen(e, x[0], "softshrink")?;
    let dn = e.binary_scalar(crate::ir::BinaryOp::Sub, v, lambd)?;
    let up = e.binary_scalar(crate::ir::BinaryOp::Add, v, lambd)?;
    let above = e.compare_scalar(CompareOp::Gt, v, lambd)?;
    let below = e.compare_scalar(CompareOp::Lt, v, -lambd)?;
    let zero = e.full_like(v, 0.0)?;
    let r = e.select(below, up, v)?;
    let r = e.select(above, dn, r)?;
    let zone = dead_zone(e, v, lambd)?;
    let r = e.select(zone, zero, r)?;
    done(e, r, dt)
}

/// hardshrink(x; lambd = 0.5): 0 where |x| <= lambd, else x.
fn hardshrink(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let lambd = a.float_or("lambd", 0.5)?;
    let (v, dt) = widen(e, x[0], "hardshrink")?;
    let zone = dead_zone(e, v, lambd)?;
    let zero = e.full_like(v, 0.0)?;
    let r = e.select(zone, zero, v)?;
    done(e, r, dt)
}

/// softshrink_backward and hardshrink_backward(grad, x; lambd): 0 in the
/// dead zone, else grad.
fn shrink_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let lambd = a.float_or("lambd", 0.5)?;
    let (g, v, dt) = float_pair(e, x[0], x[1])?;
    let zone = dead_zone(e, v, lambd)?;
    let zero = e.full_like(g, 0.0)?;
    let r = e.select(zone, zero, g)?;
    done(e, r, dt)
}

/// Elements `lo..hi` of `v` along dimension `d`.
fn slice_dim(e: &mut Emitter, v: ValueId, d: usize, lo: u64, hi: u64) -> Result<ValueId> {
    let dims = e.dims(v);
    let mut start = vec![0; dims.len()];
    let mut limit = dims.clone();
    start[d] = lo;
    limit[d] = hi;
    e.op(
        Prim::Slice {
            start,
            limit,
            stride: vec![1; dims.len()],
        },
        &[v],
    )
}

/// The two halves of `v` along `dim` (glu's), checked even.
fn halves(e: &mut Emitter, v: ValueId, a: &Attrs, what: &str) -> Result<(ValueId, ValueId, usize)> {
    let rank = e.rank(v);
    if rank == 0 {
        return Err(Error::invalid(format!(
            "{what} does not support 0-dimensional tensors"
        )));
    }
    let d = wrap_dim(a.int_or("dim", -1)?, rank)?;
    let n = e.dims(v)[d];
    if !n.is_multiple_of(2) {
        return Err(Error::invalid(format!(
            "{what}: halving dimension must be even, but dimension {d} is size {n}"
        )));
    }
    let h = n / 2;
    let first = slice_dim(e, v, d, 0, h)?;
    let second = slice_dim(e, v, d, h, n)?;
    Ok((first, second, d))
}

/// glu(x; dim = -1) = a · sigmoid(b), a and b the halves of x along dim.
fn glu(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (v, dt) = widen(e, x[0], "glu")?;
    let (p, q, _) = halves(e, v, a, "glu")?;
    let s = e.unary(UnaryOp::Logistic, q)?;
    let r = e.mul(p, s)?;
    done(e, r, dt)
}

/// glu_backward(grad, x; dim): the halves' gradients side by side,
/// grad · σ(b) and grad · a · σ(b) · (1 - σ(b)).
fn glu_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dt = super::promote::promote_types(e.dtype(x[0]), e.dtype(x[1]));
    let (v, _) = widen(e, x[1], "glu_backward")?;
    let g = e.convert(x[0], e.dtype(v))?;
    let (p, q, d) = halves(e, v, a, "glu_backward")?;
    if e.dims(g) != e.dims(p) {
        return Err(Error::invalid(format!(
            "glu_backward: grad of shape {:?} for halves of shape {:?}",
            e.dims(g),
            e.dims(p)
        )));
    }
    let s = e.unary(UnaryOp::Logistic, q)?;
    let ga = e.mul(g, s)?;
    let one = e.full_like(s, 1.0)?;
    let oms = e.sub(one, s)?;
    let t = e.mul(ga, p)?;
    let gb = e.mul(t, oms)?;
    let r = e.op(Prim::Concatenate { dimension: d }, &[ga, gb])?;
    done(e, r, dt)
}

/// _prelu_kernel(x, weight) (weight already shaped to broadcast): x where
/// x > 0, else weight · x.
fn prelu(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let (v, w, dt) = float_pair(e, x[0], x[1])?;
    let wx = e.mul(w, v)?;
    let gt = e.compare_scalar(CompareOp::Gt, v, 0.0)?;
    let r = e.select(gt, v, wx)?;
    done(e, r, dt)
}

/// _prelu_kernel_backward(grad, x, weight): (grad where x > 0 else weight ·
/// grad, 0 where x > 0 else x · grad), both of the broadcast shape (autograd
/// sums the second to the weight's).
fn prelu_backward(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let dt = super::promote::promote_types(e.dtype(x[1]), e.dtype(x[2]));
    let (g, v, _) = float_pair(e, x[0], x[1])?;
    let w = e.convert(x[2], e.dtype(v))?;
    let (v, w) = e.broadcast_pair(v, w)?;
    let (g, v) = e.broadcast_pair(g, v)?;
    let w = e.broadcast_to(w, &e.dims(v))?;
    let gt = e.compare_scalar(CompareOp::Gt, v, 0.0)?;
    let wg = e.mul(w, g)?;
    let gx = e.select(gt, g, wg)?;
    let xg = e.mul(v, g)?;
    let zero = e.full_like(xg, 0.0)?;
    let gw = e.select(gt, zero, xg)?;
    Ok(vec![e.convert(gx, dt)?, e.convert(gw, dt)?])
}

pub(super) const OPS: &[OpDef] = &[
    def!("elu", Arity::Exactly(1), elu),
    def!("elu_backward", Arity::Exactly(2), elu_backward),
    def!("leaky_relu", Arity::Exactly(1), leaky_relu),
    def!(
        "leaky_relu_backward",
        Arity::Exactly(2),
        leaky_relu_backward
    ),
    def!("hardtanh", Arity::Exactly(1), hardtanh),
    def!("hardtanh_backward", Arity::Exactly(2), hardtanh_backward),
    def!("softplus", Arity::Exactly(1), softplus),
    def!("softplus_backward", Arity::Exactly(2), softplus_backward),
    def!("hardswish", Arity::Exactly(1), hardswish),
    def!("hardswish_backward", Arity::Exactly(2), hardswish_backward),
    def!("hardsigmoid", Arity::Exactly(1), hardsigmoid),
    def!(
        "hardsigmoid_backward",
        Arity::Exactly(2),
        hardsigmoid_backward
    ),
    def!("mish", Arity::Exactly(1), mish),
    def!("threshold", Arity::Exactly(1), threshold),
    def!("softshrink", Arity::Exactly(1), softshrink),
    def!("softshrink_backward", Arity::Exactly(2), shrink_backward),
    def!("hardshrink", Arity::Exactly(1), hardshrink),
    def!("hardshrink_backward", Arity::Exactly(2), shrink_backward),
    def!("glu", Arity::Exactly(1), glu),
    def!("glu_backward", Arity::Exactly(2), glu_backward),
    def!("prelu", Arity::Exactly(2), prelu),
    def!("prelu_backward", Arity::Exactly(3), prelu_backward),
];

#[cfg(test)]
mod tests {
    use super::super::tests::{close, run, run1, t};
    use crate::ir::DType;
    use crate::ops::attrs::{Attr, Attrs};

    fn f64s(v: &[f64]) -> crate::platform::host::kernels::HostTensor {
        t(DType::F64, &[v.len() as u64], v)
    }

    /// Points away from every activation's kinks (0, ±lambd, ±3, ±1,
    /// softplus's threshold).
    const XS: [f64; 10] = [-7.3, -2.9, -1.3, -0.7, -0.2, 0.15, 0.6, 1.7, 2.2, 4.1];

    /// (forward, backward, attrs, formula): the backward at grad 1 equals
    /// the forward's central difference, and the forward its formula.
    type Pair = (&'static str, &'static str, Attrs, fn(f64) -> f64);

    fn pairs() -> Vec<Pair> {
        let elu_attrs = Attrs::new()
            .with("alpha", Attr::Float(1.3))
            .with("scale", Attr::Float(1.05))
            .with("input_scale", Attr::Float(0.8));
        vec![
            ("elu", "elu_backward", elu_attrs, |v| {
                if v > 0.0 {
                    1.05 * v
                } else {
                    1.3 * 1.05 * (0.8 * v).exp_m1()
                }
            }),
            (
                "leaky_relu",
                "leaky_relu_backward",
                Attrs::new().with("negative_slope", Attr::Float(0.2)),
                |v| if v > 0.0 { v } else { 0.2 * v },
            ),
            (
                "hardtanh",
                "hardtanh_backward",
                Attrs::new()
                    .with("min_val", Attr::Float(-2.0))
                    .with("max_val", Attr::Float(2.0)),
                |v| v.clamp(-2.0, 2.0),
            ),
            (
                "softplus",
                "softplus_backward",
                Attrs::new()
                    .with("beta", Attr::Float(2.0))
                    .with("threshold", Attr::Float(5.0)),
                |v| {
                    if 2.0 * v > 5.0 {
                        v
                    } else {
                        (2.0 * v).exp().ln_1p() / 2.0
                    }
                },
            ),
            ("hardswish", "hardswish_backward", Attrs::new(), |v| {
                v * (v + 3.0).clamp(0.0, 6.0) / 6.0
            }),
            ("hardsigmoid", "hardsigmoid_backward", Attrs::new(), |v| {
                (v + 3.0).clamp(0.0, 6.0) / 6.0
            }),
            ("softshrink", "softshrink_backward", Attrs::new(), |v| {
                if v > 0.5 {
                    v - 0.5
                } else if v < -0.5 {
                    v + 0.5
                } else {
                    0.0
                }
            }),
            ("hardshrink", "hardshrink_backward", Attrs::new(), |v| {
                if v.abs() <= 0.5 {
                    0.0
                } else {
                    v
                }
            }),
        ]
    }

    #[test]
    fn forwards_match_formulas_and_backwards_their_slopes() {
        let x = f64s(&XS);
        let ones = f64s(&[1.0; XS.len()]);
        let h = 1e-6;
        for (fwd, bwd, attrs, f) in pairs() {
            let want: Vec<f64> = XS.iter().map(|&v| f(v)).collect();
            close(&run1(fwd, &[&x], attrs.clone()), &want, 1e-15);
            let up = f64s(&XS.map(|v| v + h));
            let dn = f64s(&XS.map(|v| v - h));
            let fu = run1(fwd, &[&up], attrs.clone()).to_f64_vec();
            let fd = run1(fwd, &[&dn], attrs.clone()).to_f64_vec();
            let slope: Vec<f64> = fu
                .iter()
                .zip(&fd)
                .map(|(a, b)| (a - b) / (2.0 * h))
                .collect();
            let got = run1(bwd, &[&ones, &x], attrs.clone());
            close(&got, &slope, 1e-7);
            // f32 and bf16 compute at f32 and round once.
            for dt in [DType::F32, DType::BF16] {
                let xl = t(dt, &[XS.len() as u64], &XS);
                let r = run1(fwd, &[&xl], attrs.clone());
                assert_eq!(r.ty.dtype, dt, "{fwd}");
            }
        }
        // elu's backward from its result (is_result, as selu and celu
        // call it in place).
        let attrs = Attrs::new()
            .with("alpha", Attr::Float(1.3))
            .with("scale", Attr::Float(1.05))
            .with("input_scale", Attr::Float(0.8));
        let y = run1("elu", &[&x], attrs.clone());
        let from_x = run1("elu_backward", &[&ones, &x], attrs.clone());
        let from_y = run1(
            "elu_backward",
            &[&ones, &y],
            attrs.with("is_result", Attr::Bool(true)),
        );
        close(&from_y, &from_x.to_f64_vec(), 1e-14);
    }

    #[test]
    fn boundaries_fall_on_torchs_side() {
        let g = f64s(&[1.0; 5]);
        // (torch's CPU values) hardtanh's backward is 0 at both ends;
        // hardswish's 0 at -3 and grad at 3; hardsigmoid's 0 at both; the
        // shrinks' 0 at ±lambd.
        let x = f64s(&[-1.0, 1.0, -3.0, 3.0, 0.5]);
        close(
            &run1("hardtanh_backward", &[&g, &x], Attrs::new()),
            &[0.0, 0.0, 0.0, 0.0, 1.0],
            0.0,
        );
        close(
            &run1("hardswish_backward", &[&g, &x], Attrs::new()),
            &[1.0 / 6.0, 5.0 / 6.0, 0.0, 1.0, 1.0 / 6.0 + 0.5],
            1e-15,
        );
        close(
            &run1("hardsigmoid_backward", &[&g, &x], Attrs::new()),
            &[1.0 / 6.0, 1.0 / 6.0, 0.0, 0.0, 1.0 / 6.0],
            1e-8,
        );
        close(
            &run1("softshrink_backward", &[&g, &x], Attrs::new()),
            &[1.0, 1.0, 1.0, 1.0, 0.0],
            0.0,
        );
        // leaky_relu at 0 takes the negative side; threshold replaces x <= t.
        let z = f64s(&[0.0, -0.0, f64::NAN]);
        let l = run1("leaky_relu_backward", &[&f64s(&[1.0; 3]), &z], Attrs::new());
        close(&l, &[0.01, 0.01, 0.01], 1e-15);
        let th = Attrs::new()
            .with("threshold", Attr::Float(0.5))
            .with("value", Attr::Float(-9.0));
        close(
            &run1("threshold", &[&f64s(&[0.5, 0.6, f64::NAN])], th),
            &[-9.0, 0.6, f64::NAN],
            0.0,
        );
        // NaN passes through the forwards.
        for op in [
            "elu",
            "leaky_relu",
            "hardtanh",
            "softplus",
            "hardswish",
            "mish",
            "softshrink",
            "hardshrink",
        ] {
            let r = run1(op, &[&f64s(&[f64::NAN])], Attrs::new());
            assert!(r.to_f64_vec()[0].is_nan(), "{op}");
        }
    }

    #[test]
    fn mish_glu_and_prelu() {
        let x = f64s(&XS);
        let mish: Vec<f64> = XS.iter().map(|&v| v * v.exp().ln_1p().tanh()).collect();
        close(&run1("mish", &[&x], Attrs::new()), &mish, 1e-15);
        // glu over the last dimension of [2, 4] and its backward.
        let v = [0.3, -1.0, 2.0, 0.5, 1.5, -0.25, -3.0, 0.0];
        let xg = t(DType::F64, &[2, 4], &v);
        let sig = |z: f64| 1.0 / (1.0 + (-z).exp());
        let want: Vec<f64> = (0..2)
            .flat_map(|r| (0..2).map(move |c| (r, c)))
            .map(|(r, c)| v[r * 4 + c] * sig(v[r * 4 + 2 + c]))
            .collect();
        close(&run1("glu", &[&xg], Attrs::new()), &want, 1e-15);
        let g = t(DType::F64, &[2, 2], &[1.0, 2.0, -1.0, 0.5]);
        let gr = run1("glu_backward", &[&g, &xg], Attrs::new());
        assert_eq!(gr.ty.dims, vec![2, 4]);
        let gv = g.to_f64_vec();
        let mut want = vec![0.0; 8];
        for r in 0..2 {
            for c in 0..2 {
                let (a, b, gg) = (v[r * 4 + c], v[r * 4 + 2 + c], gv[r * 2 + c]);
                want[r * 4 + c] = gg * sig(b);
                want[r * 4 + 2 + c] = gg * a * sig(b) * (1.0 - sig(b));
            }
        }
        close(&gr, &want, 1e-15);
        // glu along dim 0, and its errors.
        let d0 = run1("glu", &[&xg], Attrs::new().with("dim", Attr::Int(0)));
        assert_eq!(d0.ty.dims, vec![1, 4]);
        let e = run("glu", &[&t(DType::F64, &[2, 3], &[0.0; 6])], Attrs::new())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("glu") && e.contains("even") && e.contains("size 3"),
            "{e}"
        );
        let e = run(
            "softshrink",
            &[&xg],
            Attrs::new().with("lambd", Attr::Float(-1.0)),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("softshrink: lambda must be greater or equal to 0"),
            "{e}"
        );
        let e = run("elu", &[&t(DType::I64, &[1], &[1.0])], Attrs::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("elu"), "{e}");
        // prelu: one weight per channel of [2, 3] (shaped [1, 3]).
        let xp = t(DType::F64, &[2, 3], &[-1.0, 2.0, -3.0, 0.0, -0.5, 4.0]);
        let w = t(DType::F64, &[1, 3], &[0.1, 0.2, 0.3]);
        close(
            &run1("prelu", &[&xp, &w], Attrs::new()),
            &[-0.1, 2.0, -0.9, 0.0, -0.1, 4.0],
            1e-15,
        );
        let gp = t(DType::F64, &[2, 3], &[1.0, 1.0, 2.0, 1.0, 1.0, 1.0]);
        let r = run("prelu_backward", &[&gp, &xp, &w], Attrs::new()).unwrap();
        close(&r[0], &[0.1, 1.0, 0.6, 0.1, 0.2, 1.0], 1e-15);
        close(&r[1], &[-1.0, 0.0, -6.0, 0.0, -0.5, 0.0], 1e-15);
    }
}
