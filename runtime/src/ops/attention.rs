//! Scaled dot-product attention and its backward, as torch's math path
//! defines them, with the logsumexp of each query row as a second output
//! so the backward recomputes the probabilities instead of storing them.
//!
//! Shapes: q [..., Hq, L, E], k [..., Hk, S, E], v [..., Hk, S, Ev]; batch
//! dimensions broadcast. With enable_gqa, Hq may be a multiple of Hk and
//! query head h uses key/value head h / (Hq / Hk) (repeat_interleave).
//! Scores, softmax and both products are computed in f32 for half inputs
//! (f64 for f64); the output rounds once to q's dtype.
//!
//! Masks: a bool mask is true where a query may attend; a float mask is
//! added to the scores; is_causal keeps key j <= query i (top left
//! aligned) and excludes an explicit mask. A query row with nothing to
//! attend to gives 0 (torch's _safe_softmax) and a logsumexp of -inf.
//!
//! Dropout (dropout_p > 0) keeps a probability where a uniform draw at
//! (seed, offset) is below 1 - dropout_p, one draw per element of the
//! broadcast [..., Hq, L, S] scores in row-major order (f32 draws, f64 for
//! f64 inputs), and scales kept ones by 1 / (1 - dropout_p); the frontend
//! advances the offset by that element count. The backward, given the same
//! seed and offset, regenerates the same mask.
//!
//! Inputs: (q, k, v), then the mask if any, then (seed, offset) when
//! dropout_p > 0 and the `seed` attribute is left out; the count tells them
//! apart. The backward takes (grad_out, q, k, v, out, logsumexp) and the
//! same optional trailing inputs.

use super::attrs::{Attr, Attrs};
use super::emit::{broadcast_shapes, Emitter};
use super::support::{compute_dtype, need_float, rng_keys, sum_to};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{
    BinaryOp, CompareOp, DType, Precision, Prim, ReduceOp, TensorType, UnaryOp, ValueId,
};

/// q, k, v prepared: in the compute dtype, k and v repeated for GQA, all
/// broadcast to the common batch dimensions.
struct Prepared {
    q: ValueId,
    k: ValueId,
    v: ValueId,
    batch: Vec<u64>,
    l: u64,
    s: u64,
    scale: f64,
    cd: DType,
    /// Heads per key/value head when GQA repeats k and v (else 1).
    groups: u64,
}

fn split_last2(d: &[u64]) -> (&[u64], u64, u64) {
    let r = d.len();
    (&d[..r - 2], d[r - 2], d[r - 1])
}

/// x [..., Hk, S, E] -> [..., Hk * groups, S, E], head h from h / groups.
fn repeat_heads(e: &mut Emitter, x: ValueId, groups: u64) -> Result<ValueId> {
    if groups == 1 {
        return Ok(x);
    }
    let d = e.dims(x);
    let r = d.len();
    let mut expanded = d[..r - 2].to_vec();
    expanded.push(groups);
    expanded.extend(&d[r - 2..]);
    let mapping: Vec<usize> = (0..r - 2).chain([r - 1, r]).collect();
    let b = e.op(
        Prim::BroadcastInDim {
            dims: expanded,
            mapping,
        },
        &[x],
    )?;
    let mut out = d.clone();
    out[r - 3] *= groups;
    e.reshape(b, &out)
}

/// Sum a GQA-repeated gradient [..., Hk * groups, S, E] back to Hk heads.
fn unrepeat_heads(e: &mut Emitter, x: ValueId, groups: u64) -> Result<ValueId> {
    if groups == 1 {
        return Ok(x);
    }
    let d = e.dims(x);
    let r = d.len();
    let mut split = d[..r - 3].to_vec();
    split.extend([d[r - 3] / groups, groups]);
    split.extend(&d[r - 2..]);
    let v = e.reshape(x, &split)?;
    e.reduce(ReduceOp::Sum, v, &[r - 2], false)
}

fn prepare(
    e: &mut Emitter,
    q: ValueId,
    k: ValueId,
    v: ValueId,
    mask: Option<ValueId>,
    a: &Attrs,
) -> Result<Prepared> {
    let dt = need_float(e, q, "query")?;
    need_float(e, k, "key")?;
    need_float(e, v, "value")?;
    if e.dtype(k) != dt || e.dtype(v) != dt {
        return Err(Error::invalid(format!(
            "query, key and value must have one dtype, got {}, {} and {}",
            dt,
            e.dtype(k),
            e.dtype(v)
        )));
    }
    let (qd, kd, vd) = (e.dims(q), e.dims(k), e.dims(v));
    if qd.len() < 2 || kd.len() < 2 || vd.len() < 2 {
        return Err(Error::invalid(format!(
            "query, key and value need at least 2 dimensions, got {qd:?}, {kd:?} and {vd:?}"
        )));
    }
    let (_, l, eq) = split_last2(&qd);
    let (_, s, ek) = split_last2(&kd);
    let (_, sv, _) = split_last2(&vd);
    if eq != ek || s != sv {
        return Err(Error::invalid(format!(
            "query {qd:?}, key {kd:?} and value {vd:?} do not fit: key must be [..., S, E] \
             with query's E and value [..., S, Ev] with key's S"
        )));
    }
    let mut groups = 1;
    if a.bool_or("enable_gqa", false)? && qd.len() >= 3 {
        let (hq, hk, hv) = (
            qd[qd.len() - 3],
            kd.get(kd.len().wrapping_sub(3)).copied().unwrap_or(1),
            vd.get(vd.len().wrapping_sub(3)).copied().unwrap_or(1),
        );
        if kd.len() != qd.len() || vd.len() != qd.len() || hk != hv {
            return Err(Error::invalid(format!(
                "enable_gqa needs query, key and value of one rank and key and value with one \
                 head count, got {qd:?}, {kd:?} and {vd:?}"
            )));
        }
        if hq != hk {
            if hk == 0 || !hq.is_multiple_of(hk) {
                return Err(Error::invalid(format!(
                    "enable_gqa: the number of query heads ({hq}) must be a multiple of the \
                     number of key/value heads ({hk})"
                )));
            }
            groups = hq / hk;
        }
    }
    let cd = compute_dtype(dt)?;
    let q = e.convert(q, cd)?;
    let k = e.convert(k, cd)?;
    let v = e.convert(v, cd)?;
    let k = repeat_heads(e, k, groups)?;
    let v = repeat_heads(e, v, groups)?;
    let batch_of = |e: &Emitter, x: ValueId| split_last2(&e.dims(x)).0.to_vec();
    let mut batch = broadcast_shapes(&batch_of(e, q), &batch_of(e, k))
        .and_then(|b| broadcast_shapes(&b, &batch_of(e, v)))
        .map_err(|_| {
            Error::invalid(format!(
                "batch dimensions of query {qd:?}, key {kd:?} and value {vd:?} do not broadcast \
                 (for fewer key/value heads than query heads, set enable_gqa)"
            ))
        })?;
    if let Some(m) = mask {
        let md = e.dims(m);
        let mb = if md.len() >= 2 {
            md[..md.len() - 2].to_vec()
        } else {
            vec![]
        };
        batch = broadcast_shapes(&batch, &mb)?;
        let tail = &md[md.len().saturating_sub(2)..];
        let fits = tail
            .iter()
            .rev()
            .zip([s, l])
            .all(|(&m, want)| m == 1 || m == want);
        if !fits {
            return Err(Error::invalid(format!(
                "attn_mask of shape {md:?} does not broadcast to [..., {l}, {s}]"
            )));
        }
    }
    let with = |b: &[u64], x: u64, y: u64| {
        let mut d = b.to_vec();
        d.extend([x, y]);
        d
    };
    let ev = e.dims(v)[e.rank(v) - 1];
    let q = e.broadcast_to(q, &with(&batch, l, eq))?;
    let k = e.broadcast_to(k, &with(&batch, s, eq))?;
    let v = e.broadcast_to(v, &with(&batch, s, ev))?;
    let scale = a.float_opt("scale")?.unwrap_or(1.0 / (eq as f64).sqrt());
    Ok(Prepared {
        q,
        k,
        v,
        batch,
        l,
        s,
        scale,
        cd,
        groups,
    })
}

/// Batched product over the shared leading nb batch dimensions of two
/// rank nb + 2 values: contracts x's dimension nb + ca with y's nb + cb.
fn bdot(e: &mut Emitter, x: ValueId, y: ValueId, ca: usize, cb: usize) -> Result<ValueId> {
    let nb = e.rank(x) - 2;
    let batch: Vec<usize> = (0..nb).collect();
    let precision = e.product_precision(e.dtype(x));
    e.op(
        Prim::DotGeneral {
            lhs_batch: batch.clone(),
            rhs_batch: batch,
            lhs_contract: vec![nb + ca],
            rhs_contract: vec![nb + cb],
            precision,
        },
        &[x, y],
    )
}

/// Scaled scores with the mask and causality applied, [batch, L, S] in cd.
fn masked_scores(
    e: &mut Emitter,
    p: &Prepared,
    mask: Option<ValueId>,
    causal: bool,
) -> Result<ValueId> {
    let scores = bdot(e, p.q, p.k, 1, 1)?;
    let mut s = e.binary_scalar(BinaryOp::Mul, scores, p.scale)?;
    let neg_inf = e.scalar(p.cd, f64::NEG_INFINITY)?;
    if causal {
        let rows = super::support::iota(e, &[p.l, p.s], 0)?;
        let cols = super::support::iota(e, &[p.l, p.s], 1)?;
        let keep = e.compare(CompareOp::Le, cols, rows)?;
        s = e.select(keep, s, neg_inf)?;
    }
    if let Some(m) = mask {
        s = match e.dtype(m) {
            DType::Bool => e.select(m, s, neg_inf)?,
            d if d.is_float() => {
                let m = e.convert(m, p.cd)?;
                e.add(s, m)?
            }
            d => {
                return Err(Error::invalid(format!(
                    "attn_mask must be bool or floating-point, got {d}"
                )))
            }
        };
    }
    Ok(s)
}

/// Split inputs after the fixed ones into (mask, seed/offset inputs).
fn optional_inputs(rest: &[ValueId]) -> (Option<ValueId>, &[ValueId]) {
    match rest.len() {
        1 | 3 => (Some(rest[0]), &rest[1..]),
        _ => (None, rest),
    }
}

struct Options {
    causal: bool,
    dropout_p: f64,
}

fn options(a: &Attrs, mask: Option<ValueId>) -> Result<Options> {
    let causal = a.bool_or("is_causal", false)?;
    if causal && mask.is_some() {
        return Err(Error::invalid(
            "explicit attn_mask should not be set when is_causal=True",
        ));
    }
    let dropout_p = a.float_or("dropout_p", 0.0)?;
    if !(0.0..=1.0).contains(&dropout_p) {
        return Err(Error::invalid(format!(
            "dropout_p must be in [0, 1], got {dropout_p}"
        )));
    }
    Ok(Options { causal, dropout_p })
}

/// The dropout factor keep / (1 - p) over [batch, L, S], or None.
fn dropout_factor(
    e: &mut Emitter,
    p: &Prepared,
    o: &Options,
    a: &Attrs,
    keys: &[ValueId],
) -> Result<Option<ValueId>> {
    if o.dropout_p == 0.0 {
        return Ok(None);
    }
    let mut dims = p.batch.clone();
    dims.extend([p.l, p.s]);
    if o.dropout_p == 1.0 {
        return Ok(Some(e.full(p.cd, &dims, 0.0)?));
    }
    let keys = rng_keys(e, a, keys)?;
    let keep = super::random::keep_mask(e, keys, p.cd, &dims, o.dropout_p)?;
    let keep = e.convert(keep, p.cd)?;
    Ok(Some(e.binary_scalar(
        BinaryOp::Mul,
        keep,
        1.0 / (1.0 - o.dropout_p),
    )?))
}

/// `x` where `cond` holds, else 0.
fn where_finite(e: &mut Emitter, x: ValueId) -> Result<ValueId> {
    let finite = e.unary(UnaryOp::IsFinite, x)?;
    let zero = e.full_like(x, 0.0)?;
    e.select(finite, x, zero)
}

/// The scale of `Prim::Attention` when (q, k, v) with these options is
/// its plain case: f32, no mask and no dropout, one batch shape (no
/// broadcasting), and key/value heads equal to the query's or, under
/// enable_gqa, dividing them. Otherwise None: the math below runs.
fn composite_case(
    e: &Emitter,
    (q, k, v): (ValueId, ValueId, ValueId),
    mask: Option<ValueId>,
    o: &Options,
    a: &Attrs,
) -> Result<Option<f64>> {
    // The primitive's products are full f32: reduced precision (on f32,
    // the only dtype it takes) runs the math below, whose products carry it.
    if mask.is_some() || o.dropout_p != 0.0 || e.precision != Precision::Highest {
        return Ok(None);
    }
    let (qd, kd) = (e.dims(q), e.dims(k));
    let r = qd.len();
    // Fewer key/value heads only when asked for (the primitive takes any
    // divisor); the primitive's own checks settle the rest.
    if r >= 3 && kd.len() == r && qd[r - 3] != kd[r - 3] && !a.bool_or("enable_gqa", false)? {
        return Ok(None);
    }
    let scale = match a.float_opt("scale")? {
        Some(s) => s,
        None if r > 0 => 1.0 / (qd[r - 1] as f64).sqrt(),
        None => return Ok(None),
    };
    let prim = Prim::Attention {
        scale,
        causal: o.causal,
    };
    Ok(takes(e, &prim, &[q, k, v]).then_some(scale))
}

/// Whether `prim` takes these operands (its own type checks pass).
fn takes(e: &Emitter, prim: &Prim, operands: &[ValueId]) -> bool {
    let types: Vec<TensorType> = operands.iter().map(|&t| e.ty(t)).collect();
    crate::ir::graph::infer_types(prim, &types).is_ok()
}

/// scaled_dot_product_attention(q, k, v, mask?, seed?, offset?; is_causal,
/// scale, dropout_p, seed, offset, enable_gqa) -> (out [..., L, Ev],
/// logsumexp [..., L] in f32 (f64 for f64 inputs)). The plain case is one
/// `Prim::Attention`; the rest is the math decomposition.
fn sdpa(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (mask, _) = optional_inputs(&x[3..]);
    let o = options(a, mask)?;
    if let Some(scale) = composite_case(e, (x[0], x[1], x[2]), mask, &o, a)? {
        let causal = o.causal;
        return e.g.node(Prim::Attention { scale, causal }, &x[..3]);
    }
    sdpa_math(e, x, a)
}

fn sdpa_math(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (mask, keys) = optional_inputs(&x[3..]);
    let o = options(a, mask)?;
    let p = prepare(e, x[0], x[1], x[2], mask, a)?;
    let s = masked_scores(e, &p, mask, o.causal)?;
    let m = e.reduce(ReduceOp::Max, s, &[p.batch.len() + 1], true)?;
    let m = where_finite(e, m)?;
    let sh = e.sub(s, m)?;
    let ex = e.unary(UnaryOp::Exp, sh)?;
    let sum = e.reduce(ReduceOp::Sum, ex, &[p.batch.len() + 1], true)?;
    let log_sum = e.unary(UnaryOp::Log, sum)?;
    let lse = e.add(log_sum, m)?;
    let zero = e.scalar(p.cd, 0.0)?;
    let any = e.compare(CompareOp::Gt, sum, zero)?;
    let probs = e.div(ex, sum)?;
    let probs = e.select(any, probs, zero)?;
    let probs = match dropout_factor(e, &p, &o, a, keys)? {
        Some(z) => e.mul(probs, z)?,
        None => probs,
    };
    let out = bdot(e, probs, p.v, 1, 0)?;
    let out = e.convert(out, e.dtype(x[0]))?;
    let mut lse_dims = p.batch.clone();
    lse_dims.push(p.l);
    let lse = e.reshape(lse, &lse_dims)?;
    Ok(vec![out, lse])
}

/// scaled_dot_product_attention_backward(grad_out, q, k, v, out, logsumexp,
/// mask?, seed?, offset?; the forward's attributes) -> (dq, dk, dv), each
/// of its input's shape and dtype. P = exp(S - logsumexp) is recomputed;
/// with Z the dropout factor: dV = (P Z)^T dO, dP = (dO V^T) Z,
/// dS = P (dP - rowsum(P dP)), dQ = scale dS K, dK = scale dS^T Q; GQA
/// sums dK and dV over each group, broadcast batch dims are summed back.
/// `out` is checked for shape only: rowsum(P dP) equals rowsum(dO out)
/// and is computed without out's rounding.
fn sdpa_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (g, q, k, v, out, lse) = (x[0], x[1], x[2], x[3], x[4], x[5]);
    let (mask, _) = optional_inputs(&x[6..]);
    let o = options(a, mask)?;
    if let Some(scale) = composite_case(e, (q, k, v), mask, &o, a)? {
        // The composite takes grad_out and out of the output's exact type
        // and an f32 logsumexp of the rows (its own checks); anything else
        // (a broadcast grad_out, say) goes through the math below.
        let prim = Prim::AttentionBackward {
            scale,
            causal: o.causal,
        };
        if takes(e, &prim, &[g, q, k, v, out, lse]) {
            return e.g.node(prim, &x[..6]);
        }
    }
    sdpa_backward_math(e, x, a)
}

fn sdpa_backward_math(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (g, q, k, v, out, lse) = (x[0], x[1], x[2], x[3], x[4], x[5]);
    let (mask, keys) = optional_inputs(&x[6..]);
    let o = options(a, mask)?;
    let p = prepare(e, q, k, v, mask, a)?;
    let nb = p.batch.len();
    let ev = e.dims(p.v)[nb + 1];
    let mut out_dims = p.batch.clone();
    out_dims.extend([p.l, ev]);
    for (val, what) in [(g, "grad_out"), (out, "out")] {
        if broadcast_shapes(&e.dims(val), &out_dims).ok().as_deref() != Some(&out_dims[..]) {
            return Err(Error::invalid(format!(
                "{what} of shape {:?} does not match the attention output {out_dims:?}",
                e.dims(val)
            )));
        }
    }
    let mut lse_dims = p.batch.clone();
    lse_dims.extend([p.l, 1]);
    if e.ty(lse).numel() != lse_dims.iter().product::<u64>() {
        return Err(Error::invalid(format!(
            "logsumexp of shape {:?} does not match the attention rows {:?}",
            e.dims(lse),
            &lse_dims[..nb + 1]
        )));
    }
    need_float(e, lse, "logsumexp")?;
    let lse = e.convert(lse, p.cd)?;
    let lse = e.reshape(lse, &lse_dims)?;
    let lse = where_finite(e, lse)?;
    let s = masked_scores(e, &p, mask, o.causal)?;
    let sh = e.sub(s, lse)?;
    let probs = e.unary(UnaryOp::Exp, sh)?;
    let z = dropout_factor(e, &p, &o, a, keys)?;
    let dout = e.convert(g, p.cd)?;
    let dout = e.broadcast_to(dout, &out_dims)?;
    let dropped = match z {
        Some(z) => e.mul(probs, z)?,
        None => probs,
    };
    let dv = bdot(e, dropped, dout, 0, 0)?;
    let dp = bdot(e, dout, p.v, 1, 1)?;
    let dp = match z {
        Some(z) => e.mul(dp, z)?,
        None => dp,
    };
    let pdp = e.mul(probs, dp)?;
    let rowsum = e.reduce(ReduceOp::Sum, pdp, &[nb + 1], true)?;
    let centered = e.sub(dp, rowsum)?;
    let ds = e.mul(probs, centered)?;
    let ds = e.binary_scalar(BinaryOp::Mul, ds, p.scale)?;
    let dq = bdot(e, ds, p.k, 1, 0)?;
    let dk = bdot(e, ds, p.q, 0, 0)?;
    let mut grads = Vec::new();
    for (grad, orig, repeated) in [(dq, q, false), (dk, k, true), (dv, v, true)] {
        let od = e.dims(orig);
        // Sum broadcast batch dims first (to the repeated head count), then groups.
        let mut at_heads = od.clone();
        let r = od.len();
        if repeated && p.groups > 1 {
            at_heads[r - 3] *= p.groups;
        }
        let gsum = sum_to(e, grad, &at_heads)?;
        let gsum = if repeated {
            unrepeat_heads(e, gsum, p.groups)?
        } else {
            gsum
        };
        grads.push(e.convert(gsum, e.dtype(orig))?);
    }
    Ok(grads)
}

/// `Prim::Attention` or `Prim::AttentionBackward` as the math
/// decomposition, for `ops::expand_composites`.
pub(super) fn expand(e: &mut Emitter, prim: &Prim, x: &[ValueId]) -> Result<Vec<ValueId>> {
    let attrs = |scale: f64, causal: bool| {
        Attrs::new()
            .with("scale", Attr::Float(scale))
            .with("is_causal", Attr::Bool(causal))
            .with("enable_gqa", Attr::Bool(true))
    };
    match *prim {
        // A runtime scale scales q (softmax((q c) kᵀ s) is softmax(q kᵀ c s)).
        Prim::Attention { scale, causal } if x.len() == 4 => {
            let q = e.mul(x[0], x[3])?;
            sdpa_math(e, &[q, x[1], x[2]], &attrs(scale, causal))
        }
        Prim::Attention { scale, causal } => sdpa_math(e, x, &attrs(scale, causal)),
        Prim::AttentionBackward { scale, causal } => {
            sdpa_backward_math(e, x, &attrs(scale, causal))
        }
        _ => Err(Error::Internal(format!(
            "{} is not a composite",
            prim.name()
        ))),
    }
}

pub(super) const OPS: &[OpDef] = &[
    def!("scaled_dot_product_attention", Arity::Between(3, 6), sdpa),
    def!(
        "scaled_dot_product_attention_backward",
        Arity::Between(6, 9),
        sdpa_backward
    ),
];
