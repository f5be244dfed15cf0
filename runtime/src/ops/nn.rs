//! Neural-network ops: softmax, log_softmax, layer_norm, rms_norm,
//! batch_norm, and the norm rescalings renorm, nn.Embedding's max_norm
//! (embedding_renorm) and weight normalization (with its backward).
//! Half-precision inputs compute in f32 and round once at the end, as
//! PyTorch's kernels accumulate.

use super::attrs::Attrs;
use super::emit::{wrap_dim, Emitter};
use super::support::compute_dtype;
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, ReduceOp, UnaryOp, ValueId};

fn softmax_impl(e: &mut Emitter, x: ValueId, a: &Attrs, log: bool) -> Result<ValueId> {
    let out_dt = a.dtype_opt("dtype")?.unwrap_or(e.dtype(x));
    let v = e.convert(x, compute_dtype(out_dt)?)?;
    let rank = e.rank(v);
    if rank == 0 {
        let r = if log {
            e.full_like(v, 0.0)?
        } else {
            e.full_like(v, 1.0)?
        };
        return e.convert(r, out_dt);
    }
    let dim = wrap_dim(a.int("dim")?, rank)?;
    let m = e.reduce(ReduceOp::Max, v, &[dim], true)?;
    // Rows that are all -inf give nan in torch too; keep that, but avoid
    // inf - inf for +inf maxima by the same subtraction torch does.
    let sh = e.sub(v, m)?;
    let ex = e.unary(UnaryOp::Exp, sh)?;
    let s = e.reduce(ReduceOp::Sum, ex, &[dim], true)?;
    let r = if log {
        let ls = e.unary(UnaryOp::Log, s)?;
        e.sub(sh, ls)?
    } else {
        e.div(ex, s)?
    };
    e.convert(r, out_dt)
}

fn softmax(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    Ok(vec![softmax_impl(e, x[0], a, false)?])
}
fn log_softmax(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    Ok(vec![softmax_impl(e, x[0], a, true)?])
}

/// The trailing dimensions `normalized_shape` covers, checked.
fn normalized_dims(e: &Emitter, x: ValueId, a: &Attrs) -> Result<Vec<usize>> {
    let shape = a.ints("normalized_shape")?;
    let d = e.dims(x);
    if shape.len() > d.len() || shape.is_empty() {
        return Err(Error::invalid(format!(
            "normalized_shape {shape:?} does not fit input {d:?}"
        )));
    }
    let off = d.len() - shape.len();
    for (i, &s) in shape.iter().enumerate() {
        if s < 0 || d[off + i] != s as u64 {
            return Err(Error::invalid(format!(
                "normalized_shape {shape:?} does not match the input's trailing dimensions {:?}",
                &d[off..]
            )));
        }
    }
    Ok((off..d.len()).collect())
}

/// native_layer_norm(x, weight?, bias?, normalized_shape, eps) -> (y, mean, rstd)
/// with mean and rstd shaped like x with the normalized dims set to 1.
fn layer_norm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let out_dt = e.dtype(x[0]);
    let cd = compute_dtype(out_dt)?;
    let v = e.convert(x[0], cd)?;
    let dims = normalized_dims(e, v, a)?;
    let eps = a.float_or("eps", 1e-5)?;
    let (mean, c, _, rstd) = moments(e, v, &dims, eps)?;
    let mut y = e.mul(c, rstd)?;
    if let Some(&w) = x.get(1) {
        let w = e.convert(w, cd)?;
        y = e.mul(y, w)?;
    }
    if let Some(&b) = x.get(2) {
        let b = e.convert(b, cd)?;
        y = e.add(y, b)?;
    }
    Ok(vec![e.convert(y, out_dt)?, mean, rstd])
}

/// The mean of `v` over `dims` (kept as 1), `v - mean`, the biased
/// variance and 1 / sqrt(variance + eps): what layer norm, and batch norm
/// in training, normalize by.
fn moments(
    e: &mut Emitter,
    v: ValueId,
    dims: &[usize],
    eps: f64,
) -> Result<(ValueId, ValueId, ValueId, ValueId)> {
    let mean = super::reduction::mean_of(e, v, dims, true)?;
    let centred = e.sub(v, mean)?;
    let sq = e.mul(centred, centred)?;
    let var = super::reduction::mean_of(e, sq, dims, true)?;
    let rstd = rsqrt_plus(e, var, eps)?;
    Ok((mean, centred, var, rstd))
}

/// 1 / sqrt(var + eps), in var's dtype.
fn rsqrt_plus(e: &mut Emitter, var: ValueId, eps: f64) -> Result<ValueId> {
    let epsv = e.scalar(e.dtype(var), eps)?;
    let ve = e.add(var, epsv)?;
    e.unary(UnaryOp::Rsqrt, ve)
}

/// rms_norm(x, weight?, normalized_shape, eps): x / sqrt(mean(x^2) + eps) * weight.
/// eps defaults to the dtype's machine epsilon, as torch.
fn rms_norm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    Ok(vec![rms_norm_and_rstd(e, x, a)?.0])
}

/// fused_rms_norm(x, weight?, normalized_shape, eps) -> (y, rstd): as
/// rms_norm, with 1/sqrt(mean(x^2) + eps) kept (normalized dims as 1, in
/// the compute dtype: f32, or f64 for f64), as torch's `_fused_rms_norm`
/// returns it for its backward.
fn fused_rms_norm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (y, rstd) = rms_norm_and_rstd(e, x, a)?;
    Ok(vec![y, rstd])
}

fn rms_norm_and_rstd(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<(ValueId, ValueId)> {
    let out_dt = e.dtype(x[0]);
    let cd = compute_dtype(out_dt)?;
    let v = e.convert(x[0], cd)?;
    let dims = normalized_dims(e, v, a)?;
    let r = rms_rstd(e, v, &dims, out_dt, a)?;
    let mut y = e.mul(v, r)?;
    if let Some(&w) = x.get(1) {
        let w = e.convert(w, cd)?;
        y = e.mul(y, w)?;
    }
    Ok((e.convert(y, out_dt)?, r))
}

/// rms_norm's 1/sqrt(mean(v²) + eps) over `dims` (kept as 1), for `v`, an
/// input of dtype `dt` already in its compute dtype; eps (attribute `eps`)
/// defaults to `dt`'s machine epsilon, as torch. Shared with the backward,
/// which recomputes it.
pub(super) fn rms_rstd(
    e: &mut Emitter,
    v: ValueId,
    dims: &[usize],
    dt: DType,
    a: &Attrs,
) -> Result<ValueId> {
    let default_eps = match dt {
        DType::F16 => 9.765625e-4,
        DType::BF16 => 7.8125e-3,
        DType::F64 => f64::EPSILON,
        _ => f32::EPSILON as f64,
    };
    let eps = a.float_opt("eps")?.unwrap_or(default_eps);
    let sq = e.mul(v, v)?;
    let ms = super::reduction::mean_of(e, sq, dims, true)?;
    let epsv = e.scalar(e.dtype(v), eps)?;
    let ms = e.add(ms, epsv)?;
    e.unary(UnaryOp::Rsqrt, ms)
}

/// The per-channel shape of batch norm's statistics broadcast over x:
/// [1, C, 1, ...] (channels are dim 1), and the reduced dims (all others).
pub(super) fn channel_layout(e: &Emitter, x: ValueId) -> Result<(Vec<u64>, Vec<usize>)> {
    let d = e.dims(x);
    if d.len() < 2 {
        return Err(Error::invalid(format!(
            "batch norm needs an input of at least 2 dims (batch, channels, ...), got {:?}",
            d
        )));
    }
    let mut per = vec![1u64; d.len()];
    per[1] = d[1];
    let reduced = (0..d.len()).filter(|&k| k != 1).collect();
    Ok((per, reduced))
}

/// A per-channel input ([C]) of batch norm, checked and shaped to
/// broadcast over x, in dtype `cd`.
pub(super) fn channel_param(
    e: &mut Emitter,
    v: ValueId,
    per: &[u64],
    cd: DType,
    what: &str,
) -> Result<ValueId> {
    if e.dims(v) != [per[1]] {
        return Err(Error::invalid(format!(
            "{what} {:?} must have one entry per channel ({})",
            e.dims(v),
            per[1]
        )));
    }
    let v = e.convert(v, cd)?;
    e.reshape(v, per)
}

/// batch_norm(x, weight, bias, running_mean?, running_var?; training,
/// momentum = 0.1, eps = 1e-5) -> (y, save_mean, save_invstd[,
/// new_running_mean, new_running_var]): torch's native_batch_norm over
/// channels (dim 1). Training normalizes by the batch's mean and biased
/// variance over every other dim and, given running stats, returns them
/// moved by `momentum` toward the batch's (unbiased variance), as torch
/// updates them in place; evaluation normalizes by the running stats and
/// returns empty save_mean and save_invstd, as torch's CPU kernel. Stats
/// are in the compute dtype (f32 for bf16 and f16).
fn batch_norm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dt = e.dtype(x[0]);
    let cd = compute_dtype(dt)?;
    let (per, reduced) = channel_layout(e, x[0])?;
    let training = a.bool_or("training", true)?;
    let momentum = a.float_or("momentum", 0.1)?;
    let eps = a.float_or("eps", 1e-5)?;
    let running = match x.get(3..5) {
        Some(&[m, v]) => Some((m, v)),
        _ if x.len() == 3 => None,
        _ => {
            return Err(Error::invalid(
                "batch_norm takes x, weight, bias and optionally running_mean and running_var",
            ))
        }
    };
    let w = channel_param(e, x[1], &per, cd, "weight")?;
    let b = channel_param(e, x[2], &per, cd, "bias")?;
    let v = e.convert(x[0], cd)?;
    let c = e.dims(x[0])[1];
    let (mean, centred, invstd, batch_var) = if training {
        let (mean, centred, var, invstd) = moments(e, v, &reduced, eps)?;
        (mean, centred, invstd, Some(var))
    } else {
        let Some((rm, rv)) = running else {
            return Err(Error::invalid(
                "batch_norm in evaluation mode needs running_mean and running_var",
            ));
        };
        let mean = channel_param(e, rm, &per, cd, "running_mean")?;
        let var = channel_param(e, rv, &per, cd, "running_var")?;
        (mean, e.sub(v, mean)?, rsqrt_plus(e, var, eps)?, None)
    };
    let y = e.mul(centred, invstd)?;
    let y = e.mul(y, w)?;
    let y = e.add(y, b)?;
    let mut out = vec![e.convert(y, dt)?];
    match batch_var {
        Some(var) => {
            out.push(e.reshape(mean, &[c])?);
            out.push(e.reshape(invstd, &[c])?);
            if let Some((rm, rv)) = running {
                let n: u64 = reduced.iter().map(|&k| e.dims(x[0])[k]).product();
                let unbiased = e.binary_scalar(
                    crate::ir::BinaryOp::Mul,
                    var,
                    n as f64 / (n.max(2) - 1) as f64,
                )?;
                for (old, batch) in [(rm, mean), (rv, unbiased)] {
                    let od = e.dtype(old);
                    let o = channel_param(e, old, &per, cd, "running stats")?;
                    let kept = e.binary_scalar(crate::ir::BinaryOp::Mul, o, 1.0 - momentum)?;
                    let moved = e.binary_scalar(crate::ir::BinaryOp::Mul, batch, momentum)?;
                    let new = e.add(kept, moved)?;
                    let new = e.reshape(new, &[c])?;
                    out.push(e.convert(new, od)?);
                }
            }
        }
        None => {
            out.push(e.full(cd, &[0], 0.0)?);
            out.push(e.full(cd, &[0], 0.0)?);
        }
    }
    Ok(out)
}

/// Every dimension of a rank-`rank` value but `dim`.
fn dims_except(rank: usize, dim: usize) -> Vec<usize> {
    (0..rank).filter(|&d| d != dim).collect()
}

/// `v` with each slice whose norm (`norm`, kept dims) exceeds `max`
/// scaled by max / (norm + 1e-7), as torch's renorm and embedding_renorm_
/// scale them.
fn capped(e: &mut Emitter, v: ValueId, norm: ValueId, max: f64) -> Result<ValueId> {
    let over = e.compare_scalar(CompareOp::Gt, norm, max)?;
    let guarded = e.binary_scalar(BinaryOp::Add, norm, 1e-7)?;
    let top = e.full_like(norm, max)?;
    let scale = e.div(top, guarded)?;
    let one = e.full_like(norm, 1.0)?;
    let factor = e.select(over, scale, one)?;
    let factor = e.broadcast_to(factor, &e.dims(v))?;
    e.mul(v, factor)
}

/// renorm(x; p, dim, maxnorm) -> x with each slice along `dim` whose
/// p-norm exceeds maxnorm scaled by maxnorm / (norm + 1e-7), as torch's
/// kernel scales it.
fn renorm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let p = a.float("p")?;
    let maxnorm = a.float("maxnorm")?;
    if p.is_nan() || p <= 0.0 {
        return Err(Error::invalid(format!(
            "non-positive-norm not supported, got p = {p}"
        )));
    }
    if maxnorm.is_nan() || maxnorm < 0.0 {
        return Err(Error::invalid(format!(
            "expected maxnorm to be >= 0 but got {maxnorm}"
        )));
    }
    let rank = e.rank(x[0]);
    if rank < 2 {
        return Err(Error::invalid(format!(
            "input needs at least 2 dimensions, got {rank} dimensions"
        )));
    }
    let dim = wrap_dim(a.int("dim")?, rank)?;
    let dt = e.dtype(x[0]);
    let v = e.convert(x[0], compute_dtype(dt)?)?;
    let norm = super::reduction::p_norm(e, v, p, &dims_except(rank, dim), true)?;
    let out = capped(e, v, norm, maxnorm)?;
    Ok(vec![e.convert(out, dt)?])
}

/// embedding_renorm(weight [V, D], indices (int); max_norm, norm_type =
/// 2) -> rows [K, D] (K = indices' element count, weight's dtype): the
/// rows `indices` names, each whose norm exceeds max_norm scaled by
/// max_norm / (norm + 1e-7), as nn.Embedding's max_norm rescales them in
/// place. The frontend writes them back (a row named twice gets the same
/// values twice), so a large table is not copied.
fn embedding_renorm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (w, idx) = (x[0], x[1]);
    if e.rank(w) != 2 {
        return Err(Error::invalid(format!(
            "expected a 2-D weight, got {}",
            e.ty(w)
        )));
    }
    if !matches!(e.dtype(idx), DType::I32 | DType::I64) {
        return Err(Error::invalid(format!(
            "expected indices to have type int or long, got {}",
            e.dtype(idx)
        )));
    }
    let max_norm = a.float("max_norm")?;
    let p = a.float_or("norm_type", 2.0)?;
    let dt = e.dtype(w);
    let k = e.ty(idx).numel();
    let flat = e.reshape(idx, &[k])?;
    let flat = e.convert(flat, DType::I64)?;
    // An index outside 0..V is the take's error when the graph runs.
    let rows = e.op(crate::ir::Prim::Take { axis: 0 }, &[w, flat])?;
    let rows = e.convert(rows, compute_dtype(dt)?)?;
    let norm = super::reduction::p_norm(e, rows, p, &[1], true)?;
    let out = capped(e, rows, norm, max_norm)?;
    Ok(vec![e.convert(out, dt)?])
}

/// The dimensions weight normalization reduces over (every one but `dim`,
/// which must lie within v's rank) and the shape its norms keep (g's: v's
/// with 1 in those dimensions).
fn weight_norm_dims(e: &Emitter, v: ValueId, a: &Attrs) -> Result<(Vec<usize>, Vec<u64>)> {
    let rank = e.rank(v);
    let dim = a.int("dim")?;
    if dim < 0 || dim as usize >= rank.max(1) {
        return Err(Error::invalid(format!(
            "dim {dim} out of range for a {rank}-d tensor"
        )));
    }
    let others = dims_except(rank, dim as usize);
    let mut kept = e.dims(v);
    for &d in &others {
        kept[d] = 1;
    }
    Ok((others, kept))
}

/// `t` (named `what`) has the norms' shape `kept`.
fn check_kept(e: &Emitter, t: ValueId, kept: &[u64], what: &str) -> Result<()> {
    if e.dims(t) != kept {
        return Err(Error::invalid(format!(
            "{what} must have shape {kept:?} (v's, 1 but along dim), got {:?}",
            e.dims(t)
        )));
    }
    Ok(())
}

/// weight_norm(v, g; dim) -> (w, norms): w = v g / ||v|| with the norm
/// over every dimension but `dim` (torch's _weight_norm_interface), the
/// norms in f32 for half v as torch's kernel keeps them.
fn weight_norm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (others, kept) = weight_norm_dims(e, x[0], a)?;
    check_kept(e, x[1], &kept, "g")?;
    let v = e.convert(x[0], compute_dtype(e.dtype(x[0]))?)?;
    let norms = super::reduction::p_norm(e, v, 2.0, &others, true)?;
    let g = e.convert(x[1], e.dtype(norms))?;
    let ratio = e.div(g, norms)?;
    let ratio = e.broadcast_to(ratio, &e.dims(v))?;
    let w = e.mul(v, ratio)?;
    Ok(vec![e.convert(w, e.dtype(x[0]))?, norms])
}

/// weight_norm_backward(grad_w, v, g, norms; dim) -> (grad_v, grad_g):
/// with s = Σ grad_w v per slice, grad_g = s / n and grad_v = g / n
/// (grad_w - v s / n²).
fn weight_norm_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (gw, v, g, norms) = (x[0], x[1], x[2], x[3]);
    if e.dims(gw) != e.dims(v) {
        return Err(Error::invalid(format!(
            "grad_w must have v's shape {:?}, got {:?}",
            e.dims(v),
            e.dims(gw)
        )));
    }
    let (others, kept) = weight_norm_dims(e, v, a)?;
    check_kept(e, g, &kept, "g")?;
    check_kept(e, norms, &kept, "norms")?;
    let cd = compute_dtype(e.dtype(v))?;
    let vc = e.convert(v, cd)?;
    let full = e.dims(v);
    let gwc = e.convert(gw, cd)?;
    let n = e.convert(norms, cd)?;
    let gc = e.convert(g, cd)?;
    let prod = e.mul(gwc, vc)?;
    let s = e.reduce(ReduceOp::Sum, prod, &others, true)?;
    let grad_g = e.div(s, n)?;
    let nn = e.mul(n, n)?;
    let k = e.div(s, nn)?;
    let k = e.broadcast_to(k, &full)?;
    let vk = e.mul(vc, k)?;
    let diff = e.sub(gwc, vk)?;
    let scale = e.div(gc, n)?;
    let scale = e.broadcast_to(scale, &full)?;
    let grad_v = e.mul(scale, diff)?;
    Ok(vec![
        e.convert(grad_v, e.dtype(v))?,
        e.convert(grad_g, e.dtype(g))?,
    ])
}

pub(super) const OPS: &[OpDef] = &[
    def!("softmax", Arity::Exactly(1), softmax),
    def!("log_softmax", Arity::Exactly(1), log_softmax),
    def!("layer_norm", Arity::Between(1, 3), layer_norm),
    def!("rms_norm", Arity::Between(1, 2), rms_norm),
    def!("fused_rms_norm", Arity::Between(1, 2), fused_rms_norm),
    def!("batch_norm", Arity::Between(3, 5), batch_norm),
    def!("renorm", Arity::Exactly(1), renorm),
    def!("embedding_renorm", Arity::Exactly(2), embedding_renorm),
    def!("weight_norm", Arity::Exactly(2), weight_norm),
    def!(
        "weight_norm_backward",
        Arity::Exactly(4),
        weight_norm_backward
    ),
];
