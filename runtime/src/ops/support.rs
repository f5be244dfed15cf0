//! Helpers the training ops share: the dtype to compute in, torch's
//! `reduction` argument, per-call scalars (seed, offset, step, lr) that come
//! as attributes or as trailing rank-0 inputs, random draws, and sums back
//! to the shape of an operand that was broadcast.
//!
//! Per-call scalars: an attribute is baked into the graph, so a value that
//! changes every call (the Philox offset, the optimizer step, a scheduled
//! learning rate) would make every call a new graph to compile. Leaving the
//! attribute out and passing the value as a rank-0 input keeps one graph.

use super::attrs::{Attr, Attrs};
use super::emit::Emitter;
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, DType, Prim, ReduceOp, RngDistribution, ScatterCombiner, ValueId};

/// The dtype to compute in: f32 for f16/bf16, else the (float) dtype.
pub(super) fn compute_dtype(d: DType) -> Result<DType> {
    match d {
        DType::F16 | DType::BF16 => Ok(DType::F32),
        DType::F32 | DType::F64 => Ok(d),
        other => Err(Error::invalid(format!(
            "needs a floating-point input, got {other}"
        ))),
    }
}

/// The dtype `x` is computed in (`compute_dtype`), or an error saying
/// that `what` needs a floating-point tensor.
pub(super) fn float_compute_dtype(e: &Emitter, x: ValueId, what: &str) -> Result<DType> {
    compute_dtype(e.dtype(x)).map_err(|_| {
        Error::invalid(format!(
            "{what} needs a floating-point tensor, got {}",
            e.ty(x)
        ))
    })
}

/// `what` must be a float tensor; returns its dtype.
pub(super) fn need_float(e: &Emitter, x: ValueId, what: &str) -> Result<DType> {
    let d = e.dtype(x);
    if !d.is_float() {
        return Err(Error::invalid(format!(
            "{what} must be a floating-point tensor, got {}",
            e.ty(x)
        )));
    }
    Ok(d)
}

/// torch's loss reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reduction {
    None,
    Mean,
    Sum,
}

/// The `reduction` attribute: "none" | "mean" | "sum", or aten's 0 | 1 | 2.
/// Default mean.
pub(super) fn reduction(a: &Attrs) -> Result<Reduction> {
    match a.get("reduction") {
        None | Some(Attr::None) => Ok(Reduction::Mean),
        Some(Attr::Str(s)) => match s.as_str() {
            "none" => Ok(Reduction::None),
            "mean" | "elementwise_mean" => Ok(Reduction::Mean),
            "sum" => Ok(Reduction::Sum),
            other => Err(Error::invalid(format!(
                "reduction {other:?}; use \"none\", \"mean\" or \"sum\""
            ))),
        },
        Some(Attr::Int(0)) => Ok(Reduction::None),
        Some(Attr::Int(1)) => Ok(Reduction::Mean),
        Some(Attr::Int(2)) => Ok(Reduction::Sum),
        Some(other) => Err(Error::invalid(format!(
            "reduction {other:?}; use \"none\", \"mean\" or \"sum\" (or 0, 1, 2)"
        ))),
    }
}

/// A list attribute of `n` non-negative entries; a single entry (or int)
/// repeats, as torch's `_single`/`_pair` do. `default` when absent.
pub(super) fn spatial_list(a: &Attrs, name: &str, n: usize, default: u64) -> Result<Vec<u64>> {
    let v = match a.ints_opt(name)? {
        None => return Ok(vec![default; n]),
        Some(v) => v,
    };
    let v = match v.len() {
        1 => vec![v[0]; n],
        k if k == n => v,
        k => {
            return Err(Error::invalid(format!(
                "{name} needs 1 or {n} entries, got {k} ({v:?})"
            )))
        }
    };
    v.iter()
        .map(|&x| {
            u64::try_from(x)
                .map_err(|_| Error::invalid(format!("{name} {v:?} has a negative entry")))
        })
        .collect()
}

/// Non-negative sizes from an int list attribute.
pub(super) fn sizes_attr(a: &Attrs, name: &str) -> Result<Vec<u64>> {
    let v = a.ints(name)?;
    v.iter()
        .map(|&s| {
            u64::try_from(s)
                .map_err(|_| Error::invalid(format!("{name} {v:?} has a negative size")))
        })
        .collect()
}

/// A bool list attribute (`output_mask`) of `n` entries, all true by default.
pub(super) fn bool_mask(a: &Attrs, name: &str, n: usize) -> Result<Vec<bool>> {
    match a.ints_opt(name)? {
        None => Ok(vec![true; n]),
        Some(v) if v.len() == n => Ok(v.iter().map(|&b| b != 0).collect()),
        Some(v) => Err(Error::invalid(format!(
            "{name} needs {n} entries, got {v:?}"
        ))),
    }
}

/// A rank-0 i64 value from an integer scalar input.
fn i64_scalar_input(e: &mut Emitter, v: ValueId, what: &str) -> Result<ValueId> {
    let t = e.ty(v);
    if t.rank() != 0 || !t.dtype.is_integer() {
        return Err(Error::invalid(format!(
            "{what} input must be an integer scalar (rank 0), got {t}"
        )));
    }
    e.convert(v, DType::I64)
}

/// The Philox (seed, offset) as i64 scalars: from the `seed` and `offset`
/// attributes (offset defaults to 0), or, when `seed` is absent, from the
/// two trailing inputs `extra`.
pub(super) fn rng_keys(
    e: &mut Emitter,
    a: &Attrs,
    extra: &[ValueId],
) -> Result<(ValueId, ValueId)> {
    match a.int_opt("seed")? {
        Some(seed) => {
            if !extra.is_empty() {
                return Err(Error::invalid(
                    "seed is given both as an attribute and as an input",
                ));
            }
            let offset = a.int_or("offset", 0)?;
            Ok((i64_constant(e, seed)?, i64_constant(e, offset)?))
        }
        None => match extra {
            [s, o] => Ok((
                i64_scalar_input(e, *s, "seed")?,
                i64_scalar_input(e, *o, "offset")?,
            )),
            _ => Err(Error::invalid(
                "attribute seed (int) is required, or seed and offset as two trailing i64 \
                 scalar inputs",
            )),
        },
    }
}

/// An exact i64 scalar constant (`Emitter::scalar` goes through f64, exact
/// only below 2^53; seeds use all 64 bits).
pub(super) fn i64_constant(e: &mut Emitter, v: i64) -> Result<ValueId> {
    e.op(
        Prim::Constant {
            dtype: DType::I64,
            dims: vec![],
            bytes: v.to_le_bytes().to_vec(),
        },
        &[],
    )
}

/// (-1)^k: a series' alternating sign.
pub(super) fn sign(k: usize) -> f64 {
    if k.is_multiple_of(2) {
        1.0
    } else {
        -1.0
    }
}

/// Σ c[k] x^k by Horner's rule (coefficients lowest power first), each
/// step a multiply and an add in x's dtype.
pub(super) fn polynomial(e: &mut Emitter, x: ValueId, c: &[f64]) -> Result<ValueId> {
    let (&top, rest) = c
        .split_last()
        .ok_or_else(|| Error::invalid("a polynomial needs a coefficient"))?;
    let mut p = e.full_like(x, top)?;
    for &k in rest.iter().rev() {
        p = e.mul(p, x)?;
        p = e.binary_scalar(BinaryOp::Add, p, k)?;
    }
    Ok(p)
}

/// An i64 vector constant (index lists made when the graph is built).
pub(super) fn i64_vector(e: &mut Emitter, v: &[i64]) -> Result<ValueId> {
    e.op(
        Prim::Constant {
            dtype: DType::I64,
            dims: vec![v.len() as u64],
            bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        },
        &[],
    )
}

/// `updates` ([rows, n]) added into `acc` ([rows, m]) at positions `at`
/// ([rows, n]) along the last dim, in update order (gradients of ops that
/// gather, one scatter).
pub(super) fn scatter_add_rows(
    e: &mut Emitter,
    acc: ValueId,
    at: ValueId,
    updates: ValueId,
) -> Result<ValueId> {
    e.op(
        Prim::Scatter {
            axis: 1,
            combiner: ScatterCombiner::Add,
        },
        &[acc, at, updates],
    )
}

/// The spatial split of `dims` for an op over the last `output_size`
/// dims (1 to 3 entries; `what` names the op family in errors): the
/// leading dims (one or two), the input's spatial sizes (not empty) and
/// the output sizes (non-negative).
pub(super) fn spatial_output_size(
    dims: &[u64],
    a: &Attrs,
    what: &str,
) -> Result<(Vec<u64>, Vec<u64>, Vec<u64>)> {
    let out = a.ints("output_size")?;
    let n = out.len();
    if !(1..=3).contains(&n) {
        return Err(Error::invalid(format!(
            "{what} is over 1, 2 or 3 spatial dims, got output_size {out:?}"
        )));
    }
    if dims.len() != n + 1 && dims.len() != n + 2 {
        return Err(Error::invalid(format!(
            "input {dims:?} must be {}-D or {}-D for an output_size of {n} dims",
            n + 1,
            n + 2
        )));
    }
    let (lead, input) = dims.split_at(dims.len() - n);
    if input.contains(&0) {
        return Err(Error::invalid(format!(
            "input {dims:?} has an empty spatial dim"
        )));
    }
    let output = out
        .iter()
        .map(|&o| {
            u64::try_from(o)
                .map_err(|_| Error::invalid(format!("output_size {out:?} has a negative entry")))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((lead.to_vec(), input.to_vec(), output))
}

/// Draw from the counter-based generator at (seed, offset).
pub(super) fn rng_draw(
    e: &mut Emitter,
    keys: (ValueId, ValueId),
    distribution: RngDistribution,
    dtype: DType,
    dims: &[u64],
) -> Result<ValueId> {
    e.op(
        Prim::Rng {
            distribution,
            dtype,
            dims: dims.to_vec(),
        },
        &[keys.0, keys.1],
    )
}

/// A scalar that is an attribute, or else the next unused trailing input
/// (`extra[*next]`), converted to `dtype`.
pub(super) fn scalar_attr_or_input(
    e: &mut Emitter,
    a: &Attrs,
    name: &str,
    extra: &[ValueId],
    next: &mut usize,
    dtype: DType,
) -> Result<ValueId> {
    if let Some(v) = a.float_opt(name)? {
        return e.scalar(dtype, v);
    }
    let v = *extra.get(*next).ok_or_else(|| {
        Error::invalid(format!(
            "attribute {name} is required, or {name} as a trailing scalar input"
        ))
    })?;
    *next += 1;
    let t = e.ty(v);
    if t.rank() != 0 || t.dtype == DType::Bool {
        return Err(Error::invalid(format!(
            "{name} input must be a numeric scalar (rank 0), got {t}"
        )));
    }
    e.convert(v, dtype)
}

/// Sum `v` down to `dims` (the shape of an operand that was broadcast to
/// v's shape): leading dimensions and dimensions that were 1 are summed.
pub(super) fn sum_to(e: &mut Emitter, v: ValueId, dims: &[u64]) -> Result<ValueId> {
    let vd = e.dims(v);
    if vd == dims {
        return Ok(v);
    }
    if dims.len() > vd.len() {
        return Err(Error::invalid(format!(
            "cannot sum shape {vd:?} down to {dims:?}"
        )));
    }
    let off = vd.len() - dims.len();
    let mut reduce: Vec<usize> = (0..off).collect();
    for (i, &d) in dims.iter().enumerate() {
        if d != vd[off + i] {
            if d != 1 {
                return Err(Error::invalid(format!(
                    "cannot sum shape {vd:?} down to {dims:?}"
                )));
            }
            reduce.push(off + i);
        }
    }
    let r = e.reduce(ReduceOp::Sum, v, &reduce, false)?;
    e.reshape(r, dims)
}

/// An i64 iota of `dims` along `dimension`.
pub(super) fn iota(e: &mut Emitter, dims: &[u64], dimension: usize) -> Result<ValueId> {
    iota_of(e, DType::I64, dims, dimension)
}

/// An iota of `dtype` over `dims` along `dimension`.
pub(super) fn iota_of(
    e: &mut Emitter,
    dtype: DType,
    dims: &[u64],
    dimension: usize,
) -> Result<ValueId> {
    e.op(
        Prim::Iota {
            dtype,
            dims: dims.to_vec(),
            dimension,
        },
        &[],
    )
}

/// A zero-element tensor: what an output whose `output_mask` entry is false
/// holds (aten leaves it undefined).
pub(super) fn not_computed(e: &mut Emitter, dtype: DType) -> Result<ValueId> {
    e.full(dtype, &[0], 0.0)
}

/// `x` with a dimension of size 1 inserted at `at`.
pub(super) fn unsqueeze(e: &mut Emitter, x: ValueId, at: usize) -> Result<ValueId> {
    let mut d = e.dims(x);
    d.insert(at, 1);
    e.reshape(x, &d)
}

/// Sum over `dims` of a value (keepdim), in its dtype.
pub(super) fn sum_keep(e: &mut Emitter, x: ValueId, dims: &[usize]) -> Result<ValueId> {
    e.reduce(ReduceOp::Sum, x, dims, true)
}

/// Index values wrapped as torch wraps negative indices: i < 0 -> i + n.
pub(super) fn wrap_indices(e: &mut Emitter, idx: ValueId, n: u64) -> Result<ValueId> {
    let idx = match e.dtype(idx) {
        DType::I32 | DType::I64 => idx,
        d if d.is_integer() => e.convert(idx, DType::I64)?,
        _ => {
            return Err(Error::invalid(format!(
                "indices must be an integer tensor, got {}",
                e.ty(idx)
            )))
        }
    };
    let zero = e.scalar(e.dtype(idx), 0.0)?;
    let neg = e.compare(crate::ir::CompareOp::Lt, idx, zero)?;
    let nn = e.scalar(e.dtype(idx), n as f64)?;
    let shifted = e.add(idx, nn)?;
    e.select(neg, shifted, idx)
}
