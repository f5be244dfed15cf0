//! Fused optimizer steps with torch.optim's single-tensor update formulas:
//! sgd_step (SGD with momentum, dampening, weight decay, nesterov,
//! maximize) and adamw_step (AdamW: decoupled weight decay, bias
//! corrections, amsgrad, maximize). Half tensors compute in f32 and round
//! once, as torch's fused kernels do; each output keeps its input's dtype.
//!
//! `lr` (and AdamW's `step`) may be left out of the attributes and passed
//! as trailing rank-0 inputs instead (step first), so a learning-rate
//! schedule or the step count does not make a new graph per step.

use super::attrs::Attrs;
use super::emit::Emitter;
use super::support::{compute_dtype, not_computed, scalar_attr_or_input};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, DType, UnaryOp, ValueId};

/// `v` converted to cd after checking it has `like`'s shape.
fn state(e: &mut Emitter, v: ValueId, like: ValueId, cd: DType, what: &str) -> Result<ValueId> {
    if e.dims(v) != e.dims(like) || !e.dtype(v).is_float() {
        return Err(Error::invalid(format!(
            "{what} must be a float tensor of the param's shape {:?}, got {}",
            e.dims(like),
            e.ty(v)
        )));
    }
    e.convert(v, cd)
}

/// sgd_step(param, grad, momentum_buffer?, lr?; lr, momentum=0,
/// dampening=0, weight_decay=0, nesterov=false, maximize=false,
/// first_step=false) -> (param, momentum_buffer). The buffer starts as the
/// gradient when first_step is set or no buffer is given; with momentum 0
/// a given buffer comes back unchanged, else the second output is empty.
fn sgd_step(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let lr_input = usize::from(a.float_opt("lr")?.is_none());
    let buffers = x
        .len()
        .checked_sub(2 + lr_input)
        .filter(|&n| n <= 1)
        .ok_or_else(|| {
            Error::invalid(format!(
                "takes param, grad, an optional momentum_buffer{}; got {} inputs",
                if lr_input == 1 {
                    " and lr as a scalar input (no lr attribute)"
                } else {
                    ""
                },
                x.len()
            ))
        })?;
    let (param, grad) = (x[0], x[1]);
    let buffer = (buffers == 1).then(|| x[2]);
    let pdt = e.dtype(param);
    let cd = compute_dtype(pdt)?;
    let momentum = a.float_or("momentum", 0.0)?;
    let dampening = a.float_or("dampening", 0.0)?;
    let weight_decay = a.float_or("weight_decay", 0.0)?;
    let nesterov = a.bool_or("nesterov", false)?;
    if nesterov && (momentum <= 0.0 || dampening != 0.0) {
        return Err(Error::invalid(
            "nesterov momentum requires a momentum and zero dampening",
        ));
    }
    let mut next = 0;
    let lr = scalar_attr_or_input(e, a, "lr", &x[2 + buffers..], &mut next, cd)?;
    let p = e.convert(param, cd)?;
    let mut g = state(e, grad, param, cd, "grad")?;
    if a.bool_or("maximize", false)? {
        g = e.unary(UnaryOp::Neg, g)?;
    }
    if weight_decay != 0.0 {
        let wp = e.binary_scalar(BinaryOp::Mul, p, weight_decay)?;
        g = e.add(g, wp)?;
    }
    let mut new_buffer = None;
    if momentum != 0.0 {
        let buf = match buffer {
            Some(b) if !a.bool_or("first_step", false)? => {
                let b = state(e, b, param, cd, "momentum_buffer")?;
                let b = e.binary_scalar(BinaryOp::Mul, b, momentum)?;
                let dg = e.binary_scalar(BinaryOp::Mul, g, 1.0 - dampening)?;
                e.add(b, dg)?
            }
            _ => g,
        };
        g = if nesterov {
            let mb = e.binary_scalar(BinaryOp::Mul, buf, momentum)?;
            e.add(g, mb)?
        } else {
            buf
        };
        new_buffer = Some(buf);
    }
    let step = e.mul(g, lr)?;
    let p = e.sub(p, step)?;
    let buf_dt = buffer.map_or(pdt, |b| e.dtype(b));
    let buf_out = match (new_buffer, buffer) {
        (Some(b), _) => e.convert(b, buf_dt)?,
        (None, Some(b)) => super::pointwise_copy(e, b)?[0],
        (None, None) => not_computed(e, pdt)?,
    };
    Ok(vec![e.convert(p, pdt)?, buf_out])
}

/// torch.lerp's formula for a weight known when building.
fn lerp(e: &mut Emitter, start: ValueId, end: ValueId, w: f64) -> Result<ValueId> {
    let diff = e.sub(end, start)?;
    if w < 0.5 {
        let t = e.binary_scalar(BinaryOp::Mul, diff, w)?;
        e.add(start, t)
    } else {
        let t = e.binary_scalar(BinaryOp::Mul, diff, 1.0 - w)?;
        e.sub(end, t)
    }
}

/// adamw_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq?, step?,
/// lr?; lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2, step,
/// amsgrad=false, maximize=false) -> (param, exp_avg, exp_avg_sq,
/// max_exp_avg_sq if amsgrad). `step` counts this step (1 on the first):
/// param *= 1 - lr * wd; exp_avg = lerp(exp_avg, g, 1 - beta1);
/// exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * g * g;
/// denom = sqrt(exp_avg_sq) / sqrt(1 - beta2^step) + eps;
/// param += -(lr / (1 - beta1^step)) * exp_avg / denom.
fn adamw_step(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let amsgrad = a.bool_or("amsgrad", false)?;
    let fixed = 4 + usize::from(amsgrad);
    let step_attr = a.float_opt("step")?;
    let lr_attr = a.float_opt("lr")?;
    let want = fixed + usize::from(step_attr.is_none()) + usize::from(lr_attr.is_none());
    if x.len() != want {
        return Err(Error::invalid(format!(
            "takes param, grad, exp_avg, exp_avg_sq{}{}{}: {want} inputs, got {}",
            if amsgrad { ", max_exp_avg_sq" } else { "" },
            if step_attr.is_none() {
                ", step (no step attribute)"
            } else {
                ""
            },
            if lr_attr.is_none() {
                ", lr (no lr attribute)"
            } else {
                ""
            },
            x.len()
        )));
    }
    let beta1 = a.float_or("beta1", 0.9)?;
    let beta2 = a.float_or("beta2", 0.999)?;
    let eps = a.float_or("eps", 1e-8)?;
    let weight_decay = a.float_or("weight_decay", 1e-2)?;
    for (name, b) in [("beta1", beta1), ("beta2", beta2)] {
        if !(0.0..1.0).contains(&b) {
            return Err(Error::invalid(format!("{name} must be in [0, 1), got {b}")));
        }
    }
    let param = x[0];
    let pdt = e.dtype(param);
    let cd = compute_dtype(pdt)?;
    let mut p = e.convert(param, cd)?;
    let mut g = state(e, x[1], param, cd, "grad")?;
    let m = state(e, x[2], param, cd, "exp_avg")?;
    let v = state(e, x[3], param, cd, "exp_avg_sq")?;
    if a.bool_or("maximize", false)? {
        g = e.unary(UnaryOp::Neg, g)?;
    }
    // Per-step scalars: on the host in f64 when both are attributes (as
    // torch computes them in Python floats), else in the graph in f64.
    let (decay, step_size, bc2_sqrt) = match (step_attr, lr_attr) {
        (Some(step), Some(lr)) => {
            if step < 1.0 {
                return Err(Error::invalid(format!(
                    "step counts the update being made and must be >= 1, got {step}"
                )));
            }
            let bc1 = 1.0 - beta1.powf(step);
            let bc2 = 1.0 - beta2.powf(step);
            (
                e.scalar(cd, 1.0 - lr * weight_decay)?,
                e.scalar(cd, lr / bc1)?,
                e.scalar(cd, bc2.sqrt())?,
            )
        }
        _ => {
            let mut next = 0;
            let extra = &x[fixed..];
            let step = scalar_attr_or_input(e, a, "step", extra, &mut next, DType::F64)?;
            let lr = scalar_attr_or_input(e, a, "lr", extra, &mut next, DType::F64)?;
            let one = e.scalar(DType::F64, 1.0)?;
            let b1 = e.scalar(DType::F64, beta1)?;
            let b2 = e.scalar(DType::F64, beta2)?;
            let p1 = e.binary(BinaryOp::Pow, b1, step)?;
            let p2 = e.binary(BinaryOp::Pow, b2, step)?;
            let bc1 = e.sub(one, p1)?;
            let bc2 = e.sub(one, p2)?;
            let lwd = e.binary_scalar(BinaryOp::Mul, lr, weight_decay)?;
            let decay = e.sub(one, lwd)?;
            let step_size = e.div(lr, bc1)?;
            let bc2_sqrt = e.unary(UnaryOp::Sqrt, bc2)?;
            (
                e.convert(decay, cd)?,
                e.convert(step_size, cd)?,
                e.convert(bc2_sqrt, cd)?,
            )
        }
    };
    if weight_decay != 0.0 {
        p = e.mul(p, decay)?;
    }
    let m = lerp(e, m, g, 1.0 - beta1)?;
    let vb = e.binary_scalar(BinaryOp::Mul, v, beta2)?;
    let gs = e.binary_scalar(BinaryOp::Mul, g, 1.0 - beta2)?;
    let gg = e.mul(gs, g)?;
    let v = e.add(vb, gg)?;
    let mut outs_extra = Vec::new();
    let second = if amsgrad {
        let mx = state(e, x[4], param, cd, "max_exp_avg_sq")?;
        let mx = e.max(mx, v)?;
        outs_extra.push((mx, e.dtype(x[4])));
        mx
    } else {
        v
    };
    let root = e.unary(UnaryOp::Sqrt, second)?;
    let denom = e.div(root, bc2_sqrt)?;
    let denom = e.binary_scalar(BinaryOp::Add, denom, eps)?;
    let neg_step = e.unary(UnaryOp::Neg, step_size)?;
    let upd = e.mul(neg_step, m)?;
    let upd = e.div(upd, denom)?;
    let p = e.add(p, upd)?;
    let mut outs = vec![
        e.convert(p, pdt)?,
        e.convert(m, e.dtype(x[2]))?,
        e.convert(v, e.dtype(x[3]))?,
    ];
    for (val, dt) in outs_extra {
        outs.push(e.convert(val, dt)?);
    }
    Ok(outs)
}

pub(super) const OPS: &[OpDef] = &[
    def!("sgd_step", Arity::Between(2, 4), sgd_step),
    def!("adamw_step", Arity::Between(4, 7), adamw_step),
];
