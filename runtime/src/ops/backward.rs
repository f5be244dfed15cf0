//! Backward ops that PyTorch does not decompose for a backend, with aten's
//! formulas: softmax/log_softmax, the activations, layer_norm and rms_norm,
//! embedding, index_select, gather and cumsum. Half inputs compute in f32
//! and round once.
//!
//! Ops with an `output_mask` return every output; one whose mask entry is
//! false is a zero-element tensor (aten leaves it undefined).

use super::attrs::Attrs;
use super::emit::{wrap_dim, Emitter};
use super::support::{bool_mask, compute_dtype, not_computed, sizes_attr, sum_keep, unsqueeze};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, Prim, ReduceOp, ScatterCombiner, UnaryOp, ValueId};

/// (grad, other) promoted and converted to the compute dtype, broadcast to
/// one shape; returns them with the result dtype.
pub(super) fn float_pair(
    e: &mut Emitter,
    g: ValueId,
    x: ValueId,
) -> Result<(ValueId, ValueId, DType)> {
    let dt = super::promote::promote_types(e.dtype(g), e.dtype(x));
    let cd = compute_dtype(dt)?;
    let g = e.convert(g, cd)?;
    let x = e.convert(x, cd)?;
    let (g, x) = e.broadcast_pair(g, x)?;
    Ok((g, x, dt))
}

fn softmax_dim(e: &Emitter, x: ValueId, a: &Attrs) -> Result<Option<usize>> {
    let rank = e.rank(x);
    let d = wrap_dim(a.int("dim")?, rank)?;
    Ok(if rank == 0 { None } else { Some(d) })
}

/// _softmax_backward_data(grad_output, output; dim, input_dtype?):
/// output * (grad - sum(grad * output, dim)).
fn softmax_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (g, y, dt) = float_pair(e, x[0], x[1])?;
    let out_dt = a.dtype_opt("input_dtype")?.unwrap_or(dt);
    let r = match softmax_dim(e, g, a)? {
        None => e.full_like(g, 0.0)?,
        Some(d) => {
            let gy = e.mul(g, y)?;
            let s = sum_keep(e, gy, &[d])?;
            let c = e.sub(g, s)?;
            e.mul(y, c)?
        }
    };
    Ok(vec![e.convert(r, out_dt)?])
}

/// _log_softmax_backward_data(grad_output, output; dim, input_dtype?):
/// grad - exp(output) * sum(grad, dim).
fn log_softmax_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (g, y, dt) = float_pair(e, x[0], x[1])?;
    let out_dt = a.dtype_opt("input_dtype")?.unwrap_or(dt);
    let r = match softmax_dim(e, g, a)? {
        None => e.full_like(g, 0.0)?,
        Some(d) => {
            let s = sum_keep(e, g, &[d])?;
            let p = e.unary(UnaryOp::Exp, y)?;
            let ps = e.mul(p, s)?;
            e.sub(g, ps)?
        }
    };
    Ok(vec![e.convert(r, out_dt)?])
}

/// gelu_backward(grad, x; approximate="none" | "tanh").
fn gelu_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (g, v, dt) = float_pair(e, x[0], x[1])?;
    let approx = a.str_or("approximate", "none")?.to_string();
    let d = match approx.as_str() {
        "none" => {
            // cdf(x) + x * pdf(x)
            let s = e.binary_scalar(BinaryOp::Mul, v, std::f64::consts::FRAC_1_SQRT_2)?;
            let erf = e.unary(UnaryOp::Erf, s)?;
            let cdf = e.binary_scalar(BinaryOp::Add, erf, 1.0)?;
            let cdf = e.binary_scalar(BinaryOp::Mul, cdf, 0.5)?;
            let x2 = e.mul(v, v)?;
            let x2 = e.binary_scalar(BinaryOp::Mul, x2, -0.5)?;
            let pdf = e.unary(UnaryOp::Exp, x2)?;
            let beta = 0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2;
            let pdf = e.binary_scalar(BinaryOp::Mul, pdf, beta)?;
            let xp = e.mul(v, pdf)?;
            e.add(cdf, xp)?
        }
        "tanh" => {
            let beta = std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5;
            let kappa = 0.044715;
            let x2 = e.mul(v, v)?;
            let x3 = e.mul(x2, v)?;
            let k3 = e.binary_scalar(BinaryOp::Mul, x3, kappa)?;
            let inner = e.add(v, k3)?;
            let inner = e.binary_scalar(BinaryOp::Mul, inner, beta)?;
            let t = e.unary(UnaryOp::Tanh, inner)?;
            let left = e.binary_scalar(BinaryOp::Mul, v, 0.5)?;
            let right = e.binary_scalar(BinaryOp::Add, t, 1.0)?;
            let left_d = e.binary_scalar(BinaryOp::Mul, right, 0.5)?;
            let t2 = e.mul(t, t)?;
            let one = e.full_like(t2, 1.0)?;
            let sech2 = e.sub(one, t2)?;
            let poly = e.binary_scalar(BinaryOp::Mul, x2, 3.0 * kappa)?;
            let poly = e.binary_scalar(BinaryOp::Add, poly, 1.0)?;
            let poly = e.binary_scalar(BinaryOp::Mul, poly, beta)?;
            let right_d = e.mul(left, sech2)?;
            let right_d = e.mul(right_d, poly)?;
            e.add(left_d, right_d)?
        }
        other => {
            return Err(Error::invalid(format!(
                "approximate {other:?}; use \"none\" or \"tanh\""
            )))
        }
    };
    let r = e.mul(g, d)?;
    Ok(vec![e.convert(r, dt)?])
}

/// silu_backward(grad, x): grad * s * (1 + x * (1 - s)), s = sigmoid(x).
fn silu_backward(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let (g, v, dt) = float_pair(e, x[0], x[1])?;
    let s = e.unary(UnaryOp::Logistic, v)?;
    let one = e.full_like(s, 1.0)?;
    let oms = e.sub(one, s)?;
    let t = e.mul(v, oms)?;
    let t = e.add(one, t)?;
    let gs = e.mul(g, s)?;
    let r = e.mul(gs, t)?;
    Ok(vec![e.convert(r, dt)?])
}

/// sigmoid_backward(grad, output): grad * (1 - output) * output.
fn sigmoid_backward(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let (g, y, dt) = float_pair(e, x[0], x[1])?;
    let one = e.full_like(y, 1.0)?;
    let omy = e.sub(one, y)?;
    let r = e.mul(g, omy)?;
    let r = e.mul(r, y)?;
    Ok(vec![e.convert(r, dt)?])
}

/// tanh_backward(grad, output): grad * (1 - output^2).
fn tanh_backward(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let (g, y, dt) = float_pair(e, x[0], x[1])?;
    let y2 = e.mul(y, y)?;
    let one = e.full_like(y2, 1.0)?;
    let d = e.sub(one, y2)?;
    let r = e.mul(g, d)?;
    Ok(vec![e.convert(r, dt)?])
}

/// threshold_backward(grad, x; threshold): 0 where x <= threshold, else grad
/// (relu's backward with threshold 0).
fn threshold_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let th = a.float_or("threshold", 0.0)?;
    let (g, v) = (x[0], x[1]);
    let dims = super::emit::broadcast_shapes(&e.dims(g), &e.dims(v))?;
    let t = e.scalar(e.dtype(v), th)?;
    let below = e.compare(CompareOp::Le, v, t)?;
    let zero = e.scalar(e.dtype(g), 0.0)?;
    let g = e.broadcast_to(g, &dims)?;
    Ok(vec![e.select(below, zero, g)?])
}

/// The trailing dimensions `normalized_shape` names, checked against x.
fn normalized_dims(e: &Emitter, x: ValueId, a: &Attrs) -> Result<Vec<usize>> {
    let shape = a.ints("normalized_shape")?;
    let d = e.dims(x);
    if shape.is_empty() || shape.len() > d.len() {
        return Err(Error::invalid(format!(
            "normalized_shape {shape:?} does not fit input {d:?}"
        )));
    }
    let off = d.len() - shape.len();
    if shape
        .iter()
        .zip(&d[off..])
        .any(|(&s, &n)| s < 0 || s as u64 != n)
    {
        return Err(Error::invalid(format!(
            "normalized_shape {shape:?} does not match the input's trailing dimensions {:?}",
            &d[off..]
        )));
    }
    Ok((off..d.len()).collect())
}

/// A per-row statistic (mean, rstd) as x's shape with the normalized dims
/// set to 1; accepts that shape or any with the same element count.
fn row_stat(
    e: &mut Emitter,
    s: ValueId,
    x: ValueId,
    dims: &[usize],
    what: &str,
) -> Result<ValueId> {
    let mut kept = e.dims(x);
    for &d in dims {
        kept[d] = 1;
    }
    let want: u64 = kept.iter().product();
    if e.ty(s).numel() != want {
        return Err(Error::invalid(format!(
            "{what} of shape {:?} does not match the input's rows {kept:?}",
            e.dims(s)
        )));
    }
    need_float_value(e, s, what)?;
    let cd = compute_dtype(e.dtype(x))?;
    let s = e.convert(s, cd)?;
    e.reshape(s, &kept)
}

fn need_float_value(e: &Emitter, v: ValueId, what: &str) -> Result<()> {
    super::support::need_float(e, v, what).map(|_| ())
}

/// A normalized-shape parameter (weight) in cd, checked.
fn norm_param(
    e: &mut Emitter,
    w: ValueId,
    x: ValueId,
    dims: &[usize],
    what: &str,
) -> Result<ValueId> {
    let xd = e.dims(x);
    let want: Vec<u64> = dims.iter().map(|&d| xd[d]).collect();
    if e.dims(w) != want {
        return Err(Error::invalid(format!(
            "{what} of shape {:?} does not match normalized_shape {want:?}",
            e.dims(w)
        )));
    }
    need_float_value(e, w, what)?;
    let cd = compute_dtype(e.dtype(x))?;
    e.convert(w, cd)
}

/// sum over the batch (non-normalized) dimensions.
fn sum_batch(e: &mut Emitter, v: ValueId, dims: &[usize]) -> Result<ValueId> {
    let batch: Vec<usize> = (0..dims[0]).collect();
    e.reduce(ReduceOp::Sum, v, &batch, false)
}

/// native_layer_norm_backward(grad_out, x, mean, rstd, weight?, bias?;
/// normalized_shape, output_mask=[true; 3]) -> (dx, dweight, dbias):
/// xhat = (x - mean) * rstd, g = grad_out * weight,
/// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
/// dweight = sum_batch(grad_out * xhat), dbias = sum_batch(grad_out).
/// The bias input only gives dbias its dtype.
fn layer_norm_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let input = x[1];
    let dt = e.dtype(input);
    let cd = compute_dtype(dt)?;
    let dims = normalized_dims(e, input, a)?;
    let mask = bool_mask(a, "output_mask", 3)?;
    if e.dims(x[0]) != e.dims(input) {
        return Err(Error::invalid(format!(
            "grad_out of shape {:?} does not match the input {:?}",
            e.dims(x[0]),
            e.dims(input)
        )));
    }
    let mean = row_stat(e, x[2], input, &dims, "mean")?;
    let rstd = row_stat(e, x[3], input, &dims, "rstd")?;
    let weight = match x.get(4) {
        Some(&w) => Some(norm_param(e, w, input, &dims, "weight")?),
        None => None,
    };
    let w_dt = x.get(4).map_or(dt, |&w| e.dtype(w));
    let b_dt = x.get(5).map_or(w_dt, |&b| e.dtype(b));
    let v = e.convert(input, cd)?;
    let dy = e.convert(x[0], cd)?;
    let c = e.sub(v, mean)?;
    let xhat = e.mul(c, rstd)?;
    let dx = if mask[0] {
        let g = match weight {
            Some(w) => e.mul(dy, w)?,
            None => dy,
        };
        let mg = super::reduction::mean_of(e, g, &dims, true)?;
        let gx = e.mul(g, xhat)?;
        let mgx = super::reduction::mean_of(e, gx, &dims, true)?;
        let t = e.sub(g, mg)?;
        let u = e.mul(xhat, mgx)?;
        let t = e.sub(t, u)?;
        let r = e.mul(rstd, t)?;
        e.convert(r, dt)?
    } else {
        not_computed(e, dt)?
    };
    let dw = if mask[1] {
        let p = e.mul(dy, xhat)?;
        let s = sum_batch(e, p, &dims)?;
        e.convert(s, w_dt)?
    } else {
        not_computed(e, w_dt)?
    };
    let db = if mask[2] {
        let s = sum_batch(e, dy, &dims)?;
        e.convert(s, b_dt)?
    } else {
        not_computed(e, b_dt)?
    };
    Ok(vec![dx, dw, db])
}

/// rms_norm_backward(grad_out, x, weight?; normalized_shape, eps,
/// output_mask=[true; 2]) -> (dx, dweight), with rstd recomputed as
/// rms_norm does (eps defaults to the dtype's machine epsilon):
/// xhat = x * rstd, g = grad_out * weight,
/// dx = rstd * (g - xhat * mean(g * xhat)), dweight = sum_batch(grad_out * xhat).
fn rms_norm_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let input = x[1];
    let dt = e.dtype(input);
    let dims = normalized_dims(e, input, a)?;
    let v = e.convert(input, compute_dtype(dt)?)?;
    let rstd = super::nn::rms_rstd(e, v, &dims, dt, a)?;
    rms_norm_grads(e, x[0], input, v, rstd, x.get(2).copied(), &dims, a)
}

/// fused_rms_norm_backward(grad_out, x, rstd, weight?; normalized_shape,
/// output_mask=[true; 2]) -> (dx, dweight): as rms_norm_backward, with the
/// rstd that fused_rms_norm returned (torch's `_fused_rms_norm_backward`).
fn fused_rms_norm_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let input = x[1];
    let dims = normalized_dims(e, input, a)?;
    let cd = compute_dtype(e.dtype(input))?;
    let xd = e.dims(input);
    let want: Vec<u64> = (0..xd.len())
        .map(|d| if dims.contains(&d) { 1 } else { xd[d] })
        .collect();
    if e.dims(x[2]) != want {
        return Err(Error::invalid(format!(
            "rstd of shape {:?} does not match the input {xd:?} reduced over normalized_shape (want {want:?})",
            e.dims(x[2])
        )));
    }
    need_float_value(e, x[2], "rstd")?;
    let rstd = e.convert(x[2], cd)?;
    let v = e.convert(input, cd)?;
    rms_norm_grads(e, x[0], input, v, rstd, x.get(3).copied(), &dims, a)
}

/// dx and dweight of rms_norm at `input` (`v`: it in the compute dtype)
/// given its rstd (keepdim, in the compute dtype).
#[allow(clippy::too_many_arguments)]
fn rms_norm_grads(
    e: &mut Emitter,
    grad_out: ValueId,
    input: ValueId,
    v: ValueId,
    rstd: ValueId,
    weight: Option<ValueId>,
    dims: &[usize],
    a: &Attrs,
) -> Result<Vec<ValueId>> {
    let dt = e.dtype(input);
    let cd = e.dtype(v);
    let mask = bool_mask(a, "output_mask", 2)?;
    if e.dims(grad_out) != e.dims(input) {
        return Err(Error::invalid(format!(
            "grad_out of shape {:?} does not match the input {:?}",
            e.dims(grad_out),
            e.dims(input)
        )));
    }
    let w_dt = weight.map_or(dt, |w| e.dtype(w));
    let weight = match weight {
        Some(w) => Some(norm_param(e, w, input, dims, "weight")?),
        None => None,
    };
    let dy = e.convert(grad_out, cd)?;
    let xhat = e.mul(v, rstd)?;
    let dx = if mask[0] {
        let g = match weight {
            Some(w) => e.mul(dy, w)?,
            None => dy,
        };
        let gx = e.mul(g, xhat)?;
        let mgx = super::reduction::mean_of(e, gx, dims, true)?;
        let u = e.mul(xhat, mgx)?;
        let t = e.sub(g, u)?;
        let r = e.mul(rstd, t)?;
        e.convert(r, dt)?
    } else {
        not_computed(e, dt)?
    };
    let dw = if mask[1] {
        let p = e.mul(dy, xhat)?;
        let s = sum_batch(e, p, dims)?;
        e.convert(s, w_dt)?
    } else {
        not_computed(e, w_dt)?
    };
    Ok(vec![dx, dw])
}

/// Integer indices as i32/i64.
fn index_values(e: &mut Emitter, idx: ValueId) -> Result<ValueId> {
    match e.dtype(idx) {
        DType::I32 | DType::I64 => Ok(idx),
        DType::U8 | DType::I8 => e.convert(idx, DType::I64),
        _ => Err(Error::invalid(format!(
            "indices must be an integer tensor, got {}",
            e.ty(idx)
        ))),
    }
}

/// `idx` [M] broadcast along a trailing dimension of size d: [M, d].
fn rows_index(e: &mut Emitter, idx: ValueId, d: u64) -> Result<ValueId> {
    let m = e.dims(idx)[0];
    e.op(
        Prim::BroadcastInDim {
            dims: vec![m, d],
            mapping: vec![0],
        },
        &[idx],
    )
}

/// embedding_dense_backward(grad [..., D], indices [...]; num_weights,
/// padding_idx=-1, scale_grad_by_freq=false) -> [num_weights, D]: grad rows
/// scatter-added at their indices; rows for padding_idx get nothing. With
/// scale_grad_by_freq each row is divided by its index's count.
fn embedding_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (g, idx) = (x[0], index_values(e, x[1])?);
    super::support::need_float(e, g, "grad")?;
    let num_weights = u64::try_from(a.int("num_weights")?)
        .map_err(|_| Error::invalid("num_weights must be >= 0"))?;
    let padding_idx = a.int_or("padding_idx", -1)?;
    let gd = e.dims(g);
    let id = e.dims(idx);
    if gd.len() != id.len() + 1 || gd[..id.len()] != id[..] {
        return Err(Error::invalid(format!(
            "grad of shape {gd:?} must be the indices' shape {id:?} plus one embedding dimension"
        )));
    }
    let d = gd[gd.len() - 1];
    let m = e.ty(idx).numel();
    let idx = e.reshape(idx, &[m])?;
    let mut rows = e.reshape(g, &[m, d])?;
    if padding_idx >= 0 {
        let p = e.scalar(e.dtype(idx), padding_idx as f64)?;
        let keep = e.compare(CompareOp::Ne, idx, p)?;
        let keep = rows_index(e, keep, d)?;
        let zero = e.scalar(e.dtype(rows), 0.0)?;
        rows = e.select(keep, rows, zero)?;
    }
    if a.bool_or("scale_grad_by_freq", false)? {
        let ones = e.full(e.dtype(rows), &[m], 1.0)?;
        let zeros = e.full(e.dtype(rows), &[num_weights], 0.0)?;
        let counts = e.op(
            Prim::Scatter {
                axis: 0,
                combiner: ScatterCombiner::Add,
            },
            &[zeros, idx, ones],
        )?;
        let c = e.op(Prim::Take { axis: 0 }, &[counts, idx])?;
        let c = e.reshape(c, &[m, 1])?;
        rows = e.div(rows, c)?;
    }
    let zeros = e.full(e.dtype(rows), &[num_weights, d], 0.0)?;
    let idx_b = rows_index(e, idx, d)?;
    Ok(vec![e.op(
        Prim::Scatter {
            axis: 0,
            combiner: ScatterCombiner::Add,
        },
        &[zeros, idx_b, rows],
    )?])
}

/// index_select_backward(grad, index; dim, self_sizes): zeros of
/// self_sizes with grad slices added at `index` along dim.
fn index_select_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let sizes = sizes_attr(a, "self_sizes")?;
    let rank = sizes.len();
    let dim = wrap_dim(a.int("dim")?, rank)?;
    let mut g = x[0];
    let idx = index_values(e, x[1])?;
    if e.rank(idx) > 1 {
        return Err(Error::invalid("index must be 0-D or 1-D"));
    }
    let k = e.ty(idx).numel();
    let idx = e.reshape(idx, &[k])?;
    if rank == 0 {
        let gs = e.reshape(g, &[k])?;
        let z = e.full(e.dtype(g), &[1], 0.0)?;
        let r = e.op(
            Prim::Scatter {
                axis: 0,
                combiner: ScatterCombiner::Add,
            },
            &[z, idx, gs],
        )?;
        return Ok(vec![e.reshape(r, &[])?]);
    }
    if e.rank(g) + 1 == rank {
        g = unsqueeze(e, g, dim)?;
    }
    let mut want = sizes.clone();
    want[dim] = k;
    if e.dims(g) != want {
        return Err(Error::invalid(format!(
            "grad of shape {:?} does not fit self_sizes {sizes:?} with {k} indices along {dim}",
            e.dims(g)
        )));
    }
    let idx_b = e.op(
        Prim::BroadcastInDim {
            dims: want,
            mapping: vec![dim],
        },
        &[idx],
    )?;
    let zeros = e.full(e.dtype(g), &sizes, 0.0)?;
    Ok(vec![e.op(
        Prim::Scatter {
            axis: dim,
            combiner: ScatterCombiner::Add,
        },
        &[zeros, idx_b, g],
    )?])
}

/// gather_backward(grad, index; dim, self_sizes): zeros of self_sizes
/// scatter-added with grad at index along dim.
fn gather_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let sizes = sizes_attr(a, "self_sizes")?;
    let dim = wrap_dim(a.int("dim")?, sizes.len())?;
    let idx = index_values(e, x[1])?;
    if e.dims(idx) != e.dims(x[0]) {
        return Err(Error::invalid(format!(
            "grad of shape {:?} must have the index's shape {:?}",
            e.dims(x[0]),
            e.dims(idx)
        )));
    }
    if sizes.is_empty() {
        return Ok(vec![super::pointwise_copy(e, x[0])?[0]]);
    }
    let zeros = e.full(e.dtype(x[0]), &sizes, 0.0)?;
    Ok(vec![e.op(
        Prim::Scatter {
            axis: dim,
            combiner: ScatterCombiner::Add,
        },
        &[zeros, idx, x[0]],
    )?])
}

/// cumsum_backward(grad; dim): the reverse cumulative sum.
fn cumsum_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let rank = e.rank(x[0]);
    let dim = wrap_dim(a.int("dim")?, rank)?;
    if rank == 0 {
        return super::pointwise_copy(e, x[0]);
    }
    Ok(vec![e.op(
        Prim::Cumulative {
            op: ReduceOp::Sum,
            dimension: dim,
            reverse: true,
        },
        &[x[0]],
    )?])
}

/// batch_norm_backward(grad_out, x, weight, mean, invstd; training,
/// output_mask = [true; 3]) -> (dx, dweight, dbias), channels at dim 1:
/// `mean` and `invstd` are the forward's save_mean and save_invstd when
/// training, else the running mean and 1 / sqrt(running_var + eps) (the
/// binding passes them so). xhat = (x - mean) * invstd,
/// dbias = sum(grad_out), dweight = sum(grad_out * xhat) over all dims
/// but channels; dx = weight * invstd * (grad_out - (dbias + xhat *
/// dweight) / M) when training (M elements a channel), else weight *
/// invstd * grad_out.
fn batch_norm_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (g, input) = (x[0], x[1]);
    let dt = e.dtype(input);
    let cd = compute_dtype(dt)?;
    if e.dims(g) != e.dims(input) {
        return Err(Error::invalid(format!(
            "grad_out of shape {:?} does not match the input {:?}",
            e.dims(g),
            e.dims(input)
        )));
    }
    let (per, reduced) = super::nn::channel_layout(e, input)?;
    let training = a.bool_or("training", true)?;
    let mask = bool_mask(a, "output_mask", 3)?;
    let w_dt = e.dtype(x[2]);
    let w = super::nn::channel_param(e, x[2], &per, cd, "weight")?;
    let mean = super::nn::channel_param(e, x[3], &per, cd, "mean")?;
    let invstd = super::nn::channel_param(e, x[4], &per, cd, "invstd")?;
    let v = e.convert(input, cd)?;
    let dy = e.convert(g, cd)?;
    let c = per[1];
    let centred = e.sub(v, mean)?;
    let xhat = e.mul(centred, invstd)?;
    let db = e.reduce(ReduceOp::Sum, dy, &reduced, true)?;
    let gx = e.mul(dy, xhat)?;
    let dw = e.reduce(ReduceOp::Sum, gx, &reduced, true)?;
    let dx = if mask[0] {
        let scale = e.mul(w, invstd)?;
        let r = if training {
            let m: u64 = reduced.iter().map(|&k| e.dims(input)[k]).product();
            let t = e.mul(xhat, dw)?;
            let t = e.add(db, t)?;
            let t = e.binary_scalar(BinaryOp::Div, t, m.max(1) as f64)?;
            let t = e.sub(dy, t)?;
            e.mul(scale, t)?
        } else {
            e.mul(scale, dy)?
        };
        e.convert(r, dt)?
    } else {
        not_computed(e, dt)?
    };
    let dw = if mask[1] {
        let s = e.reshape(dw, &[c])?;
        e.convert(s, w_dt)?
    } else {
        not_computed(e, w_dt)?
    };
    let db = if mask[2] {
        let s = e.reshape(db, &[c])?;
        e.convert(s, w_dt)?
    } else {
        not_computed(e, w_dt)?
    };
    Ok(vec![dx, dw, db])
}

/// group_norm_backward(grad_out, x, mean, rstd, weight; groups,
/// output_mask = [true; 3]) -> (dx, dweight, dbias): torch's
/// native_group_norm_backward. x is [N, C, ...] with C in `groups` groups;
/// mean and rstd are the forward's, [N, groups]; weight is [C] (ones when
/// the norm has none). Per (sample, group) of D elements, with
/// xhat = (x - mean) * rstd and g = grad_out * weight (per channel):
/// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); per channel,
/// dweight = sum(grad_out * xhat), dbias = sum(grad_out) over samples and
/// the spatial dims.
fn group_norm_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (g, input) = (x[0], x[1]);
    let dt = e.dtype(input);
    let cd = compute_dtype(dt)?;
    let dims = e.dims(input);
    if e.dims(g) != dims || dims.len() < 2 {
        return Err(Error::invalid(format!(
            "grad_out {:?} and input {dims:?} must have one shape of at least 2 dims (N, C, ...)",
            e.dims(g)
        )));
    }
    let groups = a.int("groups")?;
    let (n, c) = (dims[0], dims[1]);
    if groups <= 0 || c % groups as u64 != 0 {
        return Err(Error::invalid(format!(
            "groups {groups} must be positive and divide the {c} channels"
        )));
    }
    let groups = groups as u64;
    let spatial: u64 = dims[2..].iter().product();
    let per_group = c / groups * spatial;
    let mask = bool_mask(a, "output_mask", 3)?;
    for (what, v) in [("mean", x[2]), ("rstd", x[3])] {
        if e.ty(v).numel() != n * groups {
            return Err(Error::invalid(format!(
                "{what} {:?} must have one entry per sample and group ({n} x {groups})",
                e.dims(v)
            )));
        }
    }
    if e.dims(x[4]) != [c] {
        return Err(Error::invalid(format!(
            "weight {:?} must have one entry per channel ({c})",
            e.dims(x[4])
        )));
    }
    let w_dt = e.dtype(x[4]);
    // [N, G, C/G, spatial] views; stats and weight broadcast over them.
    let shape = [n, groups, c / groups, spatial];
    let v = e.convert(input, cd)?;
    let v = e.reshape(v, &shape)?;
    let dy = e.convert(g, cd)?;
    let dy = e.reshape(dy, &shape)?;
    let stat = |e: &mut Emitter, s: ValueId| -> Result<ValueId> {
        let s = e.convert(s, cd)?;
        let s = e.reshape(s, &[n, groups, 1, 1])?;
        e.broadcast_to(s, &shape)
    };
    let mean = stat(e, x[2])?;
    let rstd = stat(e, x[3])?;
    let w = e.convert(x[4], cd)?;
    let w = e.reshape(w, &[1, groups, c / groups, 1])?;
    let w = e.broadcast_to(w, &shape)?;
    let centred = e.sub(v, mean)?;
    let xhat = e.mul(centred, rstd)?;
    let dx = if mask[0] && per_group > 0 {
        let gw = e.mul(dy, w)?;
        let mg = super::reduction::mean_of(e, gw, &[2, 3], true)?;
        let gx = e.mul(gw, xhat)?;
        let mgx = super::reduction::mean_of(e, gx, &[2, 3], true)?;
        let t = e.sub(gw, mg)?;
        let u = e.mul(xhat, mgx)?;
        let t = e.sub(t, u)?;
        let r = e.mul(rstd, t)?;
        let r = e.reshape(r, &dims)?;
        e.convert(r, dt)?
    } else if mask[0] {
        e.full(dt, &dims, 0.0)?
    } else {
        not_computed(e, dt)?
    };
    let per_channel = |e: &mut Emitter, v: ValueId| -> Result<ValueId> {
        let s = e.reduce(ReduceOp::Sum, v, &[0, 3], false)?;
        let s = e.reshape(s, &[c])?;
        e.convert(s, w_dt)
    };
    let dw = if mask[1] {
        let p = e.mul(dy, xhat)?;
        per_channel(e, p)?
    } else {
        not_computed(e, w_dt)?
    };
    let db = if mask[2] {
        per_channel(e, dy)?
    } else {
        not_computed(e, w_dt)?
    };
    Ok(vec![dx, dw, db])
}

pub(super) const OPS: &[OpDef] = &[
    def!("softmax_backward", Arity::Exactly(2), softmax_backward),
    def!(
        "log_softmax_backward",
        Arity::Exactly(2),
        log_softmax_backward
    ),
    def!("gelu_backward", Arity::Exactly(2), gelu_backward),
    def!("silu_backward", Arity::Exactly(2), silu_backward),
    def!("sigmoid_backward", Arity::Exactly(2), sigmoid_backward),
    def!("tanh_backward", Arity::Exactly(2), tanh_backward),
    def!("threshold_backward", Arity::Exactly(2), threshold_backward),
    def!(
        "layer_norm_backward",
        Arity::Between(4, 6),
        layer_norm_backward
    ),
    def!("rms_norm_backward", Arity::Between(2, 3), rms_norm_backward),
    def!(
        "batch_norm_backward",
        Arity::Exactly(5),
        batch_norm_backward
    ),
    def!(
        "group_norm_backward",
        Arity::Exactly(5),
        group_norm_backward
    ),
    def!(
        "fused_rms_norm_backward",
        Arity::Between(3, 4),
        fused_rms_norm_backward
    ),
    def!("embedding_backward", Arity::Exactly(2), embedding_backward),
    def!(
        "index_select_backward",
        Arity::Exactly(2),
        index_select_backward
    ),
    def!("gather_backward", Arity::Exactly(2), gather_backward),
    def!("cumsum_backward", Arity::Exactly(1), cumsum_backward),
];
