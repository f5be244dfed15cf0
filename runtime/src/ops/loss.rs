//! Losses and their backward ops: nll_loss (aten nll_loss_forward, any
//! number of trailing dimensions), nll_loss_backward, cross_entropy
//! (log_softmax + nll, label smoothing, class-probability targets),
//! mse_loss and mse_loss_backward. Half inputs compute in f32 and round
//! the result once.

use super::attrs::Attrs;
use super::emit::Emitter;
use super::support::{compute_dtype, iota_of, need_float, reduction, unsqueeze, Reduction};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, Prim, ReduceOp, UnaryOp, ValueId};

/// Class indices as i32/i64 (narrower integers widen; others are errors).
fn class_target(e: &mut Emitter, t: ValueId) -> Result<ValueId> {
    match e.dtype(t) {
        DType::I32 | DType::I64 => Ok(t),
        DType::U8 | DType::I8 => e.convert(t, DType::I64),
        _ => Err(Error::invalid(format!(
            "target must hold class indices (an integer tensor), got {}",
            e.ty(t)
        ))),
    }
}

/// The class dimension: 0 for an unbatched [C] input, else 1.
fn class_dim(e: &Emitter, x: ValueId) -> Result<usize> {
    match e.rank(x) {
        0 => Err(Error::invalid(
            "input needs at least 1 dimension, got a scalar",
        )),
        1 => Ok(0),
        _ => Ok(1),
    }
}

/// Checks target's shape: x's without the class dimension.
fn check_target_shape(e: &Emitter, x: ValueId, t: ValueId) -> Result<()> {
    let mut want = e.dims(x);
    want.remove(class_dim(e, x)?);
    if e.dims(t) != want {
        return Err(Error::invalid(format!(
            "expected target size {want:?} for input {:?}, got {:?}",
            e.dims(x),
            e.dims(t)
        )));
    }
    Ok(())
}

/// The class weight vector in `cd`, checked against the class count.
fn class_weight(e: &mut Emitter, w: ValueId, classes: u64, cd: DType) -> Result<ValueId> {
    need_float(e, w, "weight")?;
    if e.dims(w) != [classes] {
        return Err(Error::invalid(format!(
            "weight tensor should be defined either for all {classes} classes or no classes \
             but got weight tensor of shape: {:?}",
            e.dims(w)
        )));
    }
    e.convert(w, cd)
}

/// Per-sample pieces of nll: (valid, per-sample weight, per-sample loss),
/// each of target's shape, the last two in `cd`. Ignored samples have
/// weight 0 and loss 0; a target outside 0..C that is not ignored is an
/// error when the graph runs (from the gather).
struct NllParts {
    valid: ValueId,
    weight: ValueId,
    loss: ValueId,
}

fn nll_parts(
    e: &mut Emitter,
    x: ValueId,
    target: ValueId,
    weight: Option<ValueId>,
    ignore_index: i64,
) -> Result<NllParts> {
    let cd = e.dtype(x);
    let cdim = class_dim(e, x)?;
    let classes = e.dims(x)[cdim];
    let tdims = e.dims(target);
    let ignore = e.scalar(e.dtype(target), ignore_index as f64)?;
    let valid = e.compare(CompareOp::Ne, target, ignore)?;
    let zero_index = e.full(e.dtype(target), &tdims, 0.0)?;
    let safe = e.select(valid, target, zero_index)?;
    // Gather along the class dimension with an index of x's rank.
    let (xg, idx) = if cdim == 0 {
        (e.reshape(x, &[1, classes])?, e.reshape(safe, &[1, 1])?)
    } else {
        (x, unsqueeze(e, safe, 1)?)
    };
    let picked = e.op(Prim::Gather { axis: 1 }, &[xg, idx])?;
    let picked = e.reshape(picked, &tdims)?;
    let zero = e.full(cd, &tdims, 0.0)?;
    let w = match weight {
        Some(w) => {
            let w = class_weight(e, w, classes, cd)?;
            e.op(Prim::Take { axis: 0 }, &[w, safe])?
        }
        None => e.full(cd, &tdims, 1.0)?,
    };
    let w = e.select(valid, w, zero)?;
    let l = e.mul(picked, w)?;
    let l = e.unary(UnaryOp::Neg, l)?;
    let loss = e.select(valid, l, zero)?;
    Ok(NllParts {
        valid,
        weight: w,
        loss,
    })
}

fn sum_all(e: &mut Emitter, x: ValueId) -> Result<ValueId> {
    let dims: Vec<usize> = (0..e.rank(x)).collect();
    e.reduce(ReduceOp::Sum, x, &dims, false)
}

/// Reduced nll and the total weight (sum of the weights of non-ignored
/// samples; 0 for reduction none, as aten leaves it).
fn reduce_nll(e: &mut Emitter, parts: &NllParts, r: Reduction) -> Result<(ValueId, ValueId)> {
    let cd = e.dtype(parts.loss);
    match r {
        Reduction::None => Ok((parts.loss, e.scalar(cd, 0.0)?)),
        Reduction::Sum => Ok((sum_all(e, parts.loss)?, sum_all(e, parts.weight)?)),
        Reduction::Mean => {
            let s = sum_all(e, parts.loss)?;
            let tw = sum_all(e, parts.weight)?;
            // All samples ignored gives 0 / 0 = nan, as torch.
            Ok((e.div(s, tw)?, tw))
        }
    }
}

/// nll_loss(log_probs [N, C, d...] or [C], target [N, d...] or [],
/// weight? [C]; reduction=mean, ignore_index=-100) -> (loss, total_weight).
fn nll_loss(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dt = need_float(e, x[0], "input")?;
    let cd = compute_dtype(dt)?;
    let target = class_target(e, x[1])?;
    check_target_shape(e, x[0], target)?;
    let r = reduction(a)?;
    let ignore_index = a.int_or("ignore_index", -100)?;
    let v = e.convert(x[0], cd)?;
    let parts = nll_parts(e, v, target, x.get(2).copied(), ignore_index)?;
    let (loss, tw) = reduce_nll(e, &parts, r)?;
    Ok(vec![e.convert(loss, dt)?, e.convert(tw, dt)?])
}

/// nll_loss_backward(grad_output, log_probs, target, weight?, total_weight;
/// reduction, ignore_index) -> grad_input: at [i, target_i] the value
/// -w_i * g (divided by total_weight for mean), 0 elsewhere and for
/// ignored samples.
fn nll_loss_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (g, input, target) = (x[0], x[1], x[2]);
    let (weight, total_weight) = match x.len() {
        4 => (None, x[3]),
        _ => (Some(x[3]), x[4]),
    };
    let dt = need_float(e, input, "input")?;
    let cd = compute_dtype(dt)?;
    let target = class_target(e, target)?;
    check_target_shape(e, input, target)?;
    let r = reduction(a)?;
    let ignore_index = a.int_or("ignore_index", -100)?;
    let tdims = e.dims(target);
    let want_g: &[u64] = if r == Reduction::None { &tdims } else { &[] };
    if e.dims(g) != want_g {
        return Err(Error::invalid(format!(
            "grad_output must have shape {want_g:?} for reduction {r:?}, got {:?}",
            e.dims(g)
        )));
    }
    if e.rank(total_weight) != 0 {
        return Err(Error::invalid(format!(
            "total_weight must be a scalar, got {:?}",
            e.dims(total_weight)
        )));
    }
    let cdim = class_dim(e, input)?;
    let xdims = e.dims(input);
    let classes = xdims[cdim];
    let ignore = e.scalar(e.dtype(target), ignore_index as f64)?;
    let valid = e.compare(CompareOp::Ne, target, ignore)?;
    let gc = e.convert(g, cd)?;
    // Ignored samples point at class 0 with a coefficient of 0.
    let zero_index = e.full(e.dtype(target), &tdims, 0.0)?;
    let safe = e.select(valid, target, zero_index)?;
    // The sample's class weight (1 without one), read at its target: the
    // gather checks every target lies in 0..classes, as the forward does.
    let w = match weight {
        Some(w) => class_weight(e, w, classes, cd)?,
        None => e.full(cd, &[classes], 1.0)?,
    };
    let w = e.op(Prim::Take { axis: 0 }, &[w, safe])?;
    let mut coef = e.mul(w, gc)?;
    coef = e.unary(UnaryOp::Neg, coef)?;
    if r == Reduction::Mean {
        let tw = e.convert(total_weight, cd)?;
        coef = e.div(coef, tw)?;
    }
    let zero_coef = e.full(cd, &tdims, 0.0)?;
    let coef = e.select(valid, coef, zero_coef)?;
    // Each sample's coefficient at its target class and 0 elsewhere: the
    // classes' positions compared with the target. Deferred, this fuses
    // into the pass that reads the gradient (log_softmax's backward),
    // where a scatter into a zero-filled N x C tensor ran as a fill and a
    // scatter of their own. Positions compare in f32, which loops hold
    // (exact below 2^24 classes); more classes compare as integers.
    let pos_dtype = if classes <= 1 << 24 {
        DType::F32
    } else {
        e.dtype(target)
    };
    let positions = iota_of(e, pos_dtype, &[classes], 0)?;
    let mut along = vec![1; xdims.len()];
    along[cdim] = classes;
    let positions = e.reshape(positions, &along)?;
    let t = e.convert(safe, pos_dtype)?;
    let t = unsqueeze(e, t, cdim)?;
    let hit = e.compare(CompareOp::Eq, positions, t)?;
    let coef = unsqueeze(e, coef, cdim)?;
    let zero = e.scalar(cd, 0.0)?;
    let grad = e.select(hit, coef, zero)?;
    Ok(vec![e.convert(grad, dt)?])
}

/// log_softmax along `dim` in the value's dtype.
fn log_softmax(e: &mut Emitter, v: ValueId, dim: usize) -> Result<ValueId> {
    let m = e.reduce(ReduceOp::Max, v, &[dim], true)?;
    let finite = e.unary(UnaryOp::IsFinite, m)?;
    let zero = e.full_like(m, 0.0)?;
    let m = e.select(finite, m, zero)?;
    let sh = e.sub(v, m)?;
    let ex = e.unary(UnaryOp::Exp, sh)?;
    let s = e.reduce(ReduceOp::Sum, ex, &[dim], true)?;
    let ls = e.unary(UnaryOp::Log, s)?;
    e.sub(sh, ls)
}

/// The class weight shaped to broadcast against x along the class dim.
fn weight_along(e: &mut Emitter, w: ValueId, x: ValueId, cdim: usize) -> Result<ValueId> {
    let mut d = vec![1u64; e.rank(x)];
    d[cdim] = e.dims(x)[cdim];
    e.reshape(w, &d)
}

/// cross_entropy(logits, target, weight?; reduction=mean, ignore_index=-100,
/// label_smoothing=0) -> loss. Class-index targets go through nll; a float
/// target of the logits' shape holds class probabilities (torch's rule).
fn cross_entropy(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dt = need_float(e, x[0], "input")?;
    let cd = compute_dtype(dt)?;
    let r = reduction(a)?;
    let ignore_index = a.int_or("ignore_index", -100)?;
    let ls = a.float_or("label_smoothing", 0.0)?;
    if !(0.0..=1.0).contains(&ls) {
        return Err(Error::invalid(format!(
            "label_smoothing must be between 0.0 and 1.0. Got: {ls}"
        )));
    }
    let cdim = class_dim(e, x[0])?;
    let classes = e.dims(x[0])[cdim];
    let v = e.convert(x[0], cd)?;
    let lp = log_softmax(e, v, cdim)?;
    let weight = match x.get(2) {
        Some(&w) => Some(class_weight(e, w, classes, cd)?),
        None => None,
    };
    if e.dtype(x[1]).is_float() && e.dims(x[1]) == e.dims(x[0]) {
        if ignore_index >= 0 {
            return Err(Error::invalid(
                "ignore_index is not supported for floating point target",
            ));
        }
        let mut t = e.convert(x[1], cd)?;
        if ls > 0.0 {
            t = e.binary_scalar(BinaryOp::Mul, t, 1.0 - ls)?;
            t = e.binary_scalar(BinaryOp::Add, t, ls / classes as f64)?;
        }
        let mut prod = e.mul(lp, t)?;
        if let Some(w) = weight {
            let wb = weight_along(e, w, lp, cdim)?;
            prod = e.mul(prod, wb)?;
        }
        let loss = match r {
            Reduction::None => e.reduce(ReduceOp::Sum, prod, &[cdim], false)?,
            Reduction::Sum => sum_all(e, prod)?,
            Reduction::Mean => {
                let s = sum_all(e, prod)?;
                let n = e.ty(x[0]).numel() / classes.max(1);
                let n = if e.ty(x[0]).numel() == 0 { 0 } else { n };
                let nv = e.scalar(cd, n as f64)?;
                e.div(s, nv)?
            }
        };
        let loss = e.unary(UnaryOp::Neg, loss)?;
        return Ok(vec![e.convert(loss, dt)?]);
    }
    let target = class_target(e, x[1])?;
    check_target_shape(e, x[0], target)?;
    let parts = nll_parts(e, lp, target, weight, ignore_index)?;
    let (nll, tw) = reduce_nll(e, &parts, r)?;
    if ls == 0.0 {
        return Ok(vec![e.convert(nll, dt)?]);
    }
    // Label smoothing: (1 - ls) * nll + ls / C * smooth, where smooth is
    // -sum_c(w_c * lp_c) per sample (0 for ignored samples), normalized as
    // nll is (by the total weight for mean).
    let weighted = match weight {
        Some(w) => {
            let wb = weight_along(e, w, lp, cdim)?;
            e.mul(lp, wb)?
        }
        None => lp,
    };
    let smooth = e.reduce(ReduceOp::Sum, weighted, &[cdim], false)?;
    let smooth = e.unary(UnaryOp::Neg, smooth)?;
    let zero = e.full_like(smooth, 0.0)?;
    let smooth = e.select(parts.valid, smooth, zero)?;
    let smooth = match r {
        Reduction::None => smooth,
        Reduction::Sum => sum_all(e, smooth)?,
        Reduction::Mean => {
            let s = sum_all(e, smooth)?;
            e.div(s, tw)?
        }
    };
    let a_part = e.binary_scalar(BinaryOp::Mul, nll, 1.0 - ls)?;
    let b_part = e.binary_scalar(BinaryOp::Mul, smooth, ls / classes as f64)?;
    let loss = e.add(a_part, b_part)?;
    Ok(vec![e.convert(loss, dt)?])
}

/// Promoted float operands of mse_loss and their dtype.
fn mse_operands(e: &mut Emitter, xs: &[ValueId]) -> Result<(Vec<ValueId>, DType)> {
    let (xs, dt) = super::pointwise::promote(e, xs, &Attrs::new())?;
    if !dt.is_float() {
        return Err(Error::invalid(format!(
            "needs floating-point inputs, got {dt}"
        )));
    }
    let cd = compute_dtype(dt)?;
    let xs = xs
        .iter()
        .map(|&v| e.convert(v, cd))
        .collect::<Result<Vec<_>>>()?;
    Ok((xs, dt))
}

/// mse_loss(input, target; reduction=mean): (input - target)^2, broadcast.
fn mse_loss(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let r = reduction(a)?;
    let (xs, dt) = mse_operands(e, x)?;
    let d = e.sub(xs[0], xs[1])?;
    let sq = e.mul(d, d)?;
    let loss = reduce_loss(e, sq, r)?;
    Ok(vec![e.convert(loss, dt)?])
}

/// mse_loss_backward(grad_output, input, target; reduction) -> grad_input
/// = norm * (input - target) * grad_output with norm 2 (2 / numel for
/// mean, numel of the broadcast shape), in the broadcast shape.
fn mse_loss_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let r = reduction(a)?;
    let (xs, dt) = mse_operands(e, &x[1..])?;
    let cd = e.dtype(xs[0]);
    let d = e.sub(xs[0], xs[1])?;
    let numel = e.ty(d).numel();
    check_grad_output(e, x[0], r)?;
    let norm = if r == Reduction::Mean {
        2.0 / numel as f64
    } else {
        2.0
    };
    let normv = e.scalar(cd, norm)?;
    let g = e.convert(x[0], cd)?;
    let scaled = e.mul(normv, d)?;
    let grad = e.mul(scaled, g)?;
    Ok(vec![e.convert(grad, dt)?])
}

/// `loss` reduced as `r` asks: as it is, summed, or averaged over all of
/// its elements.
fn reduce_loss(e: &mut Emitter, loss: ValueId, r: Reduction) -> Result<ValueId> {
    match r {
        Reduction::None => Ok(loss),
        Reduction::Sum => sum_all(e, loss),
        Reduction::Mean => {
            let dims: Vec<usize> = (0..e.rank(loss)).collect();
            super::reduction::mean_of(e, loss, &dims, false)
        }
    }
}

/// A reduced loss's backward takes a scalar grad_output.
fn check_grad_output(e: &Emitter, g: ValueId, r: Reduction) -> Result<()> {
    if r != Reduction::None && e.rank(g) != 0 {
        return Err(Error::invalid(format!(
            "grad_output must be a scalar for reduction {r:?}, got {:?}",
            e.dims(g)
        )));
    }
    Ok(())
}

/// The backward's scale of each element: 1/numel for mean, else 1; and
/// the grad (`check_grad_output`) in `like`'s dtype.
fn loss_grad(e: &mut Emitter, g: ValueId, like: ValueId, r: Reduction) -> Result<(ValueId, f64)> {
    check_grad_output(e, g, r)?;
    let numel = e.ty(like).numel().max(1);
    let norm = if r == Reduction::Mean {
        1.0 / numel as f64
    } else {
        1.0
    };
    let g = e.convert(g, e.dtype(like))?;
    Ok((g, norm))
}

/// binary_cross_entropy(input, target[, weight]; reduction): -w (t ·
/// max(log x, -100) + (1 - t) · max(log(1 - x), -100)), the logs clamped
/// at -100 as torch's (so x = 0 or 1 gives a finite loss). torch's CPU
/// kernel also refuses inputs outside [0, 1]; here they give NaN (the
/// check would need a read back).
fn binary_cross_entropy(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let r = reduction(a)?;
    let (xs, dt) = mse_operands(e, &x[..2])?;
    if e.dims(x[0]) != e.dims(x[1]) {
        return Err(Error::invalid(format!(
            "target size {:?} differs from input size {:?}",
            e.dims(x[1]),
            e.dims(x[0])
        )));
    }
    let (p, t) = (xs[0], xs[1]);
    let floor = e.full_like(p, -100.0)?;
    let lp = e.unary(UnaryOp::Log, p)?;
    let lp = e.max(lp, floor)?;
    let np = e.unary(UnaryOp::Neg, p)?;
    let lq = e.unary(UnaryOp::Log1p, np)?;
    let lq = e.max(lq, floor)?;
    // (t - 1) · log(1 - x) - t · log x, torch's order.
    let tm1 = e.binary_scalar(BinaryOp::Sub, t, 1.0)?;
    let a1 = e.mul(tm1, lq)?;
    let a2 = e.mul(t, lp)?;
    let mut loss = e.sub(a1, a2)?;
    if let Some(&w) = x.get(2) {
        let w = e.convert(w, e.dtype(p))?;
        loss = e.mul(loss, w)?;
    }
    let loss = reduce_loss(e, loss, r)?;
    Ok(vec![e.convert(loss, dt)?])
}

/// binary_cross_entropy_backward(grad, input, target[, weight];
/// reduction): w · grad · (x - t) / max((1 - x) x, 1e-12), over numel for
/// mean.
fn binary_cross_entropy_backward(
    e: &mut Emitter,
    x: &[ValueId],
    a: &Attrs,
) -> Result<Vec<ValueId>> {
    let r = reduction(a)?;
    let (xs, dt) = mse_operands(e, &x[1..3])?;
    let (p, t) = (xs[0], xs[1]);
    let (g, norm) = loss_grad(e, x[0], p, r)?;
    let one = e.full_like(p, 1.0)?;
    let q = e.sub(one, p)?;
    let den = e.mul(q, p)?;
    let eps = e.full_like(den, 1e-12)?;
    let den = e.max(den, eps)?;
    let d = e.sub(p, t)?;
    let gd = e.mul(g, d)?;
    let mut grad = e.div(gd, den)?;
    if norm != 1.0 {
        grad = e.binary_scalar(BinaryOp::Mul, grad, norm)?;
    }
    if let Some(&w) = x.get(3) {
        let w = e.convert(w, e.dtype(p))?;
        grad = e.mul(grad, w)?;
    }
    Ok(vec![e.convert(grad, dt)?])
}

/// smooth_l1_loss(input, target; reduction, beta = 1): 0.5 z² / beta
/// where z = |x - t| < beta, else z - beta / 2 (beta 0: z, the L1 loss).
/// huber_loss(input, target; reduction, delta = 1): 0.5 z² where z <
/// delta, else delta (z - delta / 2).
fn smooth_or_huber(e: &mut Emitter, x: &[ValueId], a: &Attrs, huber: bool) -> Result<Vec<ValueId>> {
    let r = reduction(a)?;
    let k = if huber {
        a.float_or("delta", 1.0)?
    } else {
        a.float_or("beta", 1.0)?
    };
    if k < 0.0 || (huber && k == 0.0) {
        return Err(Error::invalid(format!(
            "{} must be {}, got {k}",
            if huber { "delta" } else { "beta" },
            if huber { "positive" } else { "non-negative" }
        )));
    }
    let (xs, dt) = mse_operands(e, x)?;
    let d = e.sub(xs[0], xs[1])?;
    let z = e.unary(UnaryOp::Abs, d)?;
    let sq = e.mul(z, z)?;
    let (inner, outer) = if huber {
        let inner = e.binary_scalar(BinaryOp::Mul, sq, 0.5)?;
        let o = e.binary_scalar(BinaryOp::Sub, z, 0.5 * k)?;
        (inner, e.binary_scalar(BinaryOp::Mul, o, k)?)
    } else if k == 0.0 {
        (z, z)
    } else {
        let h = e.binary_scalar(BinaryOp::Mul, sq, 0.5)?;
        let inner = e.binary_scalar(BinaryOp::Div, h, k)?;
        (inner, e.binary_scalar(BinaryOp::Sub, z, 0.5 * k)?)
    };
    let small = e.compare_scalar(CompareOp::Lt, z, k)?;
    let loss = e.select(small, inner, outer)?;
    let loss = reduce_loss(e, loss, r)?;
    Ok(vec![e.convert(loss, dt)?])
}

fn smooth_l1_loss(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    smooth_or_huber(e, x, a, false)
}

fn huber_loss(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    smooth_or_huber(e, x, a, true)
}

/// smooth_l1_loss_backward and huber_loss_backward(grad, input, target;
/// reduction, beta or delta): with d = x - t, -s where d <= -k, s where
/// d >= k, else d · grad / beta (smooth L1) or d · grad (Huber); s is
/// grad (smooth L1) or grad · delta (Huber); over numel for mean.
fn smooth_or_huber_backward(
    e: &mut Emitter,
    x: &[ValueId],
    a: &Attrs,
    huber: bool,
) -> Result<Vec<ValueId>> {
    let r = reduction(a)?;
    let k = if huber {
        a.float_or("delta", 1.0)?
    } else {
        a.float_or("beta", 1.0)?
    };
    let (xs, dt) = mse_operands(e, &x[1..])?;
    let d = e.sub(xs[0], xs[1])?;
    let (g, norm) = loss_grad(e, x[0], d, r)?;
    let g = e.binary_scalar(BinaryOp::Mul, g, norm)?;
    let side = if huber {
        e.binary_scalar(BinaryOp::Mul, g, k)?
    } else {
        g
    };
    let mid = e.mul(d, g)?;
    let mid = if huber || k == 0.0 {
        mid
    } else {
        e.binary_scalar(BinaryOp::Div, mid, k)?
    };
    let (side, mid) = (
        e.broadcast_to(side, &e.dims(d))?,
        e.broadcast_to(mid, &e.dims(d))?,
    );
    let neg = e.unary(UnaryOp::Neg, side)?;
    let hi = e.compare_scalar(CompareOp::Ge, d, k)?;
    let lo = e.compare_scalar(CompareOp::Le, d, -k)?;
    let grad = e.select(hi, side, mid)?;
    let grad = e.select(lo, neg, grad)?;
    Ok(vec![e.convert(grad, dt)?])
}

fn smooth_l1_loss_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    smooth_or_huber_backward(e, x, a, false)
}

fn huber_loss_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    smooth_or_huber_backward(e, x, a, true)
}

/// A margin loss's input as [N, C] in its compute dtype (a [C] input is
/// one sample, a scalar one sample of one class), with N and C. torch's
/// rule: a non-empty vector or matrix, N may be 0.
fn margin_input(e: &mut Emitter, x: ValueId) -> Result<(ValueId, u64, u64)> {
    need_float(e, x, "input")?;
    let d = e.dims(x);
    let (n, c) = match d[..] {
        [] => (1, 1),
        [c] => (1, c),
        [n, c] => (n, c),
        _ => (0, 0),
    };
    if c == 0 {
        return Err(Error::invalid(format!(
            "expected a non-empty vector or matrix with optional 0-dim batch size, but got: {d:?}"
        )));
    }
    let cd = compute_dtype(e.dtype(x))?;
    let x2 = e.reshape(x, &[n, c])?;
    Ok((e.convert(x2, cd)?, n, c))
}

/// The per-sample grad of a margin loss as [N, 1] in `cd`, over N for
/// mean: grad_output's shape is the loss's (`loss_dims` for none).
fn margin_grad(
    e: &mut Emitter,
    g: ValueId,
    n: u64,
    loss_dims: &[u64],
    r: Reduction,
    cd: DType,
) -> Result<ValueId> {
    check_grad_output(e, g, r)?;
    if r == Reduction::None && e.dims(g) != loss_dims {
        return Err(Error::invalid(format!(
            "grad_output must have the loss's shape {loss_dims:?}, got {:?}",
            e.dims(g)
        )));
    }
    let g = e.convert(g, cd)?;
    let g = if r == Reduction::Mean {
        e.binary_scalar(BinaryOp::Div, g, n as f64)?
    } else {
        g
    };
    let g = e.reshape(g, &[e.ty(g).numel(), 1])?;
    e.broadcast_to(g, &[n, 1])
}

/// What multi_margin_loss and its backward share: the input [N, C],
/// z = margin - x[y] + x[j] [N, C], the mask of j = y, the class weight
/// of each sample's target [N, 1] (if any), and p (1 or 2).
struct MultiMargin {
    x: ValueId,
    z: ValueId,
    is_y: ValueId,
    weight: Option<ValueId>,
    p: f64,
    n: u64,
    c: u64,
}

fn multi_margin(
    e: &mut Emitter,
    x: &[ValueId],
    weight: Option<ValueId>,
    a: &Attrs,
) -> Result<MultiMargin> {
    let p = a.float_or("p", 1.0)?;
    if p != 1.0 && p != 2.0 {
        return Err(Error::invalid(format!(
            "only p == 1 and p == 2 supported, got p = {p}"
        )));
    }
    let margin = a.float_or("margin", 1.0)?;
    let (xs, n, c) = margin_input(e, x[0])?;
    let cd = e.dtype(xs);
    let t = class_target(e, x[1])?;
    if e.rank(t) > 1 || e.ty(t).numel() != n {
        return Err(Error::invalid(format!(
            "inconsistent target size, expected {n} but got {:?}",
            e.dims(t)
        )));
    }
    let t = e.convert(t, DType::I64)?;
    let t = e.reshape(t, &[n, 1])?;
    // A target outside 0..C is the gather's error when the graph runs.
    let xy = e.op(Prim::Gather { axis: 1 }, &[xs, t])?;
    let xy = e.broadcast_to(xy, &[n, c])?;
    let diff = e.sub(xs, xy)?;
    let z = e.binary_scalar(BinaryOp::Add, diff, margin)?;
    let classes = iota_of(e, DType::I64, &[n, c], 1)?;
    let tb = e.broadcast_to(t, &[n, c])?;
    let is_y = e.compare(CompareOp::Eq, classes, tb)?;
    let weight = match weight {
        Some(w) => {
            let w = class_weight(e, w, c, cd)?;
            let flat = e.reshape(t, &[n])?;
            let wy = e.op(Prim::Take { axis: 0 }, &[w, flat])?;
            let wy = e.reshape(wy, &[n, 1])?;
            Some(e.broadcast_to(wy, &[n, c])?)
        }
        None => None,
    };
    Ok(MultiMargin {
        x: xs,
        z,
        is_y,
        weight,
        p,
        n,
        c,
    })
}

/// multi_margin_loss(input [N, C] or [C], target [N] or [], weight? [C];
/// p = 1 | 2, margin = 1, reduction) -> per sample Σ_{j ≠ y} w[y] max(0,
/// margin - x[y] + x[j])^p / C, reduced.
fn multi_margin_loss(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let r = reduction(a)?;
    let m = multi_margin(e, x, x.get(2).copied(), a)?;
    let zero = e.full_like(m.z, 0.0)?;
    let mut h = e.max(m.z, zero)?;
    if m.p == 2.0 {
        h = e.mul(h, h)?;
    }
    if let Some(w) = m.weight {
        h = e.mul(h, w)?;
    }
    let h = e.select(m.is_y, zero, h)?;
    let sum = e.reduce(ReduceOp::Sum, h, &[1], false)?;
    let loss = e.binary_scalar(BinaryOp::Div, sum, m.c as f64)?;
    let loss = e.reshape(loss, &e.dims(x[1]))?;
    let loss = reduce_loss(e, loss, r)?;
    Ok(vec![e.convert(loss, e.dtype(x[0]))?])
}

/// multi_margin_loss_backward(grad, input, target, weight?; p, margin,
/// reduction) -> grad_input: where z > 0 and j ≠ y, w[y] (1 or 2 z) g / C
/// at j, and minus their sum at y.
fn multi_margin_loss_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let r = reduction(a)?;
    let m = multi_margin(e, &x[1..3], x.get(3).copied(), a)?;
    let cd = e.dtype(m.x);
    let g = margin_grad(e, x[0], m.n, &e.dims(x[2]), r, cd)?;
    let zero = e.full_like(m.z, 0.0)?;
    let positive = e.compare_scalar(CompareOp::Gt, m.z, 0.0)?;
    let other = e.unary(UnaryOp::Not, m.is_y)?;
    let active = e.binary(BinaryOp::And, positive, other)?;
    let slope = if m.p == 2.0 {
        e.binary_scalar(BinaryOp::Mul, m.z, 2.0)?
    } else {
        e.full_like(m.z, 1.0)?
    };
    let mut dz = e.select(active, slope, zero)?;
    if let Some(w) = m.weight {
        dz = e.mul(dz, w)?;
    }
    let g = e.broadcast_to(g, &[m.n, m.c])?;
    let dz = e.mul(dz, g)?;
    let dz = e.binary_scalar(BinaryOp::Div, dz, m.c as f64)?;
    let total = e.reduce(ReduceOp::Sum, dz, &[1], true)?;
    let total = e.broadcast_to(total, &[m.n, m.c])?;
    let at_y = e.select(m.is_y, total, zero)?;
    let dx = e.sub(dz, at_y)?;
    let dx = e.reshape(dx, &e.dims(x[1]))?;
    Ok(vec![e.convert(dx, e.dtype(x[1]))?])
}

/// What multilabel_margin_loss and its backward share. A target row lists
/// classes up to its first -1: `listed` [N, C(j)] marks those entries,
/// `idx` holds them (0 past the list), `pairs` [N, C(j), C(k)] the listed
/// j with classes k not in the list, `z` = 1 - x[t_j] + x[k] on them.
struct MultiLabel {
    x: ValueId,
    listed: ValueId,
    idx: ValueId,
    pairs: ValueId,
    z: ValueId,
    n: u64,
    c: u64,
}

/// The shared part; `is_target` [N, C] (0 or 1, x's compute dtype) is
/// computed from the target when not given.
fn multilabel(
    e: &mut Emitter,
    input: ValueId,
    target: ValueId,
    is_target: Option<ValueId>,
) -> Result<(MultiLabel, ValueId)> {
    let (xs, n, c) = margin_input(e, input)?;
    let cd = e.dtype(xs);
    if e.dims(target) != e.dims(input) {
        return Err(Error::invalid(format!(
            "inconsistent target size: {:?} for input of size: {:?}",
            e.dims(target),
            e.dims(input)
        )));
    }
    let t = class_target(e, target)?;
    let t = e.convert(t, DType::I64)?;
    let t = e.reshape(t, &[n, c])?;
    // Listed: before the row's first -1.
    let position = iota_of(e, DType::I64, &[n, c], 1)?;
    let end = e.compare_scalar(CompareOp::Eq, t, -1.0)?;
    let beyond = e.full(DType::I64, &[n, c], c as f64)?;
    let at = e.select(end, position, beyond)?;
    let first = e.reduce(ReduceOp::Min, at, &[1], true)?;
    let first = e.broadcast_to(first, &[n, c])?;
    let listed = e.compare(CompareOp::Lt, position, first)?;
    let zero_index = e.full(DType::I64, &[n, c], 0.0)?;
    let idx = e.select(listed, t, zero_index)?;
    let jk = [n, c, c];
    let listed3 = e.reshape(listed, &[n, c, 1])?;
    let listed3 = e.broadcast_to(listed3, &jk)?;
    let is_target = match is_target {
        Some(it) => {
            if e.dims(it) != e.dims(input) {
                return Err(Error::invalid(format!(
                    "is_target must have the input's shape {:?}, got {:?}",
                    e.dims(input),
                    e.dims(it)
                )));
            }
            let it = e.reshape(it, &[n, c])?;
            e.convert(it, cd)?
        }
        None => {
            // Any listed j naming class k: a one-hot [N, j, k] reduced.
            let idx3 = e.reshape(idx, &[n, c, 1])?;
            let idx3 = e.broadcast_to(idx3, &jk)?;
            let k = iota_of(e, DType::I64, &jk, 2)?;
            let hit = e.compare(CompareOp::Eq, idx3, k)?;
            let hit = e.binary(BinaryOp::And, hit, listed3)?;
            let any = e.reduce(ReduceOp::Or, hit, &[1], false)?;
            e.convert(any, cd)?
        }
    };
    let unlisted = e.compare_scalar(CompareOp::Eq, is_target, 0.0)?;
    let unlisted = e.reshape(unlisted, &[n, 1, c])?;
    let unlisted = e.broadcast_to(unlisted, &jk)?;
    let pairs = e.binary(BinaryOp::And, listed3, unlisted)?;
    // A listed class outside 0..C is the gather's error when it runs.
    let xt = e.op(Prim::Gather { axis: 1 }, &[xs, idx])?;
    let xt = e.reshape(xt, &[n, c, 1])?;
    let xt = e.broadcast_to(xt, &jk)?;
    let xk = e.reshape(xs, &[n, 1, c])?;
    let xk = e.broadcast_to(xk, &jk)?;
    let diff = e.sub(xk, xt)?;
    let z = e.binary_scalar(BinaryOp::Add, diff, 1.0)?;
    let ml = MultiLabel {
        x: xs,
        listed,
        idx,
        pairs,
        z,
        n,
        c,
    };
    Ok((ml, is_target))
}

/// The loss's shape for reduction none: [N], or [] for a [C] or scalar
/// input.
fn multilabel_loss_dims(e: &Emitter, input: ValueId) -> Vec<u64> {
    let d = e.dims(input);
    if d.len() == 2 {
        vec![d[0]]
    } else {
        vec![]
    }
}

/// multilabel_margin_loss(input [N, C] or [C], target (its shape, class
/// lists ended by -1); reduction) -> (loss, is_target): per sample Σ over
/// listed classes j and unlisted classes k of max(0, 1 - (x[t_j] - x[k]))
/// / C, reduced; is_target (input's shape and dtype) marks listed classes.
fn multilabel_margin_loss(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let r = reduction(a)?;
    let (ml, is_target) = multilabel(e, x[0], x[1], None)?;
    let zero = e.full_like(ml.z, 0.0)?;
    let h = e.max(ml.z, zero)?;
    let h = e.select(ml.pairs, h, zero)?;
    let sum = e.reduce(ReduceOp::Sum, h, &[1, 2], false)?;
    let loss = e.binary_scalar(BinaryOp::Div, sum, ml.c as f64)?;
    let loss = e.reshape(loss, &multilabel_loss_dims(e, x[0]))?;
    let loss = reduce_loss(e, loss, r)?;
    let dt = e.dtype(x[0]);
    let is_target = e.reshape(is_target, &e.dims(x[0]))?;
    Ok(vec![e.convert(loss, dt)?, e.convert(is_target, dt)?])
}

/// multilabel_margin_loss_backward(grad, input, target, is_target;
/// reduction) -> grad_input: each active pair (j, k) (z > 0) adds g / C at
/// k and takes it at the listed class t_j.
fn multilabel_margin_loss_backward(
    e: &mut Emitter,
    x: &[ValueId],
    a: &Attrs,
) -> Result<Vec<ValueId>> {
    let r = reduction(a)?;
    let (ml, _) = multilabel(e, x[1], x[2], Some(x[3]))?;
    let cd = e.dtype(ml.x);
    let g = margin_grad(e, x[0], ml.n, &multilabel_loss_dims(e, x[1]), r, cd)?;
    let positive = e.compare_scalar(CompareOp::Gt, ml.z, 0.0)?;
    let active = e.binary(BinaryOp::And, ml.pairs, positive)?;
    let active = e.convert(active, cd)?;
    let (n, c) = (ml.n, ml.c);
    // +1 at k per active pair; -(the active pairs of j) at t_j.
    let dk = e.reduce(ReduceOp::Sum, active, &[1], false)?;
    let per_j = e.reduce(ReduceOp::Sum, active, &[2], false)?;
    let listed = e.convert(ml.listed, cd)?;
    let per_j = e.mul(per_j, listed)?;
    let zeros = e.full(cd, &[n, c], 0.0)?;
    let dj = e.op(
        Prim::Scatter {
            axis: 1,
            combiner: crate::ir::ScatterCombiner::Add,
        },
        &[zeros, ml.idx, per_j],
    )?;
    let d = e.sub(dk, dj)?;
    let g = e.broadcast_to(g, &[n, c])?;
    let d = e.mul(d, g)?;
    let d = e.binary_scalar(BinaryOp::Div, d, c as f64)?;
    let d = e.reshape(d, &e.dims(x[1]))?;
    Ok(vec![e.convert(d, e.dtype(x[1]))?])
}

pub(super) const OPS: &[OpDef] = &[
    def!(
        "binary_cross_entropy",
        Arity::Between(2, 3),
        binary_cross_entropy
    ),
    def!(
        "binary_cross_entropy_backward",
        Arity::Between(3, 4),
        binary_cross_entropy_backward
    ),
    def!("smooth_l1_loss", Arity::Exactly(2), smooth_l1_loss),
    def!(
        "smooth_l1_loss_backward",
        Arity::Exactly(3),
        smooth_l1_loss_backward
    ),
    def!("huber_loss", Arity::Exactly(2), huber_loss),
    def!(
        "huber_loss_backward",
        Arity::Exactly(3),
        huber_loss_backward
    ),
    def!("nll_loss", Arity::Between(2, 3), nll_loss),
    def!("nll_loss_backward", Arity::Between(4, 5), nll_loss_backward),
    def!("cross_entropy", Arity::Between(2, 3), cross_entropy),
    def!("mse_loss", Arity::Exactly(2), mse_loss),
    def!("mse_loss_backward", Arity::Exactly(3), mse_loss_backward),
    def!("multi_margin_loss", Arity::Between(2, 3), multi_margin_loss),
    def!(
        "multi_margin_loss_backward",
        Arity::Between(3, 4),
        multi_margin_loss_backward
    ),
    def!(
        "multilabel_margin_loss",
        Arity::Exactly(2),
        multilabel_margin_loss
    ),
    def!(
        "multilabel_margin_loss_backward",
        Arity::Exactly(4),
        multilabel_margin_loss_backward
    ),
];
