//! Sorting and indexed ops: sort, topk (sort, then the first k),
//! kthvalue and median (sort, then one position), searchsorted (a binary
//! search in fixed steps) and repeat_interleave (one), bincount,
//! masked_scatter with its backward, embedding_bag
//! with its backward ops, index_put, and nonzero_static.

use super::attrs::{Attr, Attrs};
use super::emit::{broadcast_shapes, wrap_dim, Emitter};
use super::support::{compute_dtype, iota, sizes_attr, wrap_indices};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, Prim, ReduceOp, ScatterCombiner, UnaryOp, ValueId};

/// (values, indices) of a stable sort along `dim`; rank 0 sorts as [1].
fn sort_values(
    e: &mut Emitter,
    x: ValueId,
    dim: i64,
    descending: bool,
) -> Result<(ValueId, ValueId, usize)> {
    let rank = e.rank(x);
    let d = wrap_dim(dim, rank)?;
    let v = if rank == 0 { e.reshape(x, &[1])? } else { x };
    let (values, positions) = e.sort(v, if rank == 0 { 0 } else { d }, descending)?;
    Ok((values, positions, d))
}

/// sort(x; dim=-1, descending=false, stable=false) -> (values, indices i64).
/// The sort is always stable; NaN sorts above every number.
fn sort(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (v, i, _) = sort_values(
        e,
        x[0],
        a.int_or("dim", -1)?,
        a.bool_or("descending", false)?,
    )?;
    if e.rank(x[0]) == 0 {
        return Ok(vec![e.reshape(v, &[])?, e.reshape(i, &[])?]);
    }
    Ok(vec![v, i])
}

/// topk(x; k, dim=-1, largest=true, sorted=true) -> (values, indices):
/// the k largest (smallest) along dim, in sorted order, ties by position.
fn topk(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let k = a.int("k")?;
    let rank = e.rank(x[0]);
    let (v, i, d) = sort_values(e, x[0], a.int_or("dim", -1)?, a.bool_or("largest", true)?)?;
    let n = if rank == 0 { 1 } else { e.dims(x[0])[d] };
    if k < 0 || k as u64 > n {
        return Err(Error::invalid(format!(
            "selected index k={k} is out of range for a dimension of size {n}"
        )));
    }
    let vd = e.dims(v);
    let axis = if rank == 0 { 0 } else { d };
    let mut limit = vd.clone();
    limit[axis] = k as u64;
    let slice = Prim::Slice {
        start: vec![0; vd.len()],
        limit,
        stride: vec![1; vd.len()],
    };
    let v = e.op(slice.clone(), &[v])?;
    let i = e.op(slice, &[i])?;
    if rank == 0 && k == 1 {
        return Ok(vec![e.reshape(v, &[])?, e.reshape(i, &[])?]);
    }
    Ok(vec![v, i])
}

/// The `mode` attribute of embedding_bag: "sum" | "mean" | "max" or 0 | 1 | 2.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum BagMode {
    Sum,
    Mean,
    Max,
}

fn bag_mode(a: &Attrs) -> Result<BagMode> {
    match a.get("mode") {
        None | Some(Attr::None) => Ok(BagMode::Mean),
        Some(Attr::Str(s)) if s == "sum" => Ok(BagMode::Sum),
        Some(Attr::Str(s)) if s == "mean" => Ok(BagMode::Mean),
        Some(Attr::Str(s)) if s == "max" => Ok(BagMode::Max),
        Some(Attr::Int(0)) => Ok(BagMode::Sum),
        Some(Attr::Int(1)) => Ok(BagMode::Mean),
        Some(Attr::Int(2)) => Ok(BagMode::Max),
        Some(other) => Err(Error::invalid(format!(
            "mode {other:?}; use \"sum\", \"mean\" or \"max\""
        ))),
    }
}

fn int_index(e: &mut Emitter, v: ValueId, what: &str) -> Result<ValueId> {
    match e.dtype(v) {
        DType::I64 => Ok(v),
        d if d.is_integer() => e.convert(v, DType::I64),
        _ => Err(Error::invalid(format!(
            "{what} must be an integer tensor, got {}",
            e.ty(v)
        ))),
    }
}

/// `v` [M] broadcast to [M, d].
pub(super) fn per_row(e: &mut Emitter, v: ValueId, d: u64) -> Result<ValueId> {
    let m = e.dims(v)[0];
    e.op(
        Prim::BroadcastInDim {
            dims: vec![m, d],
            mapping: vec![0],
        },
        &[v],
    )
}

fn scatter(
    e: &mut Emitter,
    base: ValueId,
    idx: ValueId,
    upd: ValueId,
    c: ScatterCombiner,
) -> Result<ValueId> {
    e.op(
        Prim::Scatter {
            axis: 0,
            combiner: c,
        },
        &[base, idx, upd],
    )
}

/// embedding_bag(weight [W, D], indices, offsets?, per_sample_weights?;
/// mode=mean, include_last_offset=false, padding_idx=none) ->
/// (output [B, D], offset2bag [M] i64, bag_size [B] i64, max_indices).
///
/// 1-D indices [M] with offsets [B] (or [B + 1] with include_last_offset;
/// offsets[0] must be 0): bag b holds indices[offsets[b]..offsets[b+1]].
/// 2-D indices [B, F] are B bags of F and take no offsets (a third input
/// is then per_sample_weights). Entries equal to padding_idx are left out
/// (and not counted for mean). Empty bags give 0. per_sample_weights scale
/// the rows (mode sum only). max_indices is, for mode max, the weight row
/// of the first maximum per bag and column (-1 for empty bags), else a
/// zero-element tensor.
fn embedding_bag(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let weight = x[0];
    let dt = e.dtype(weight);
    let cd = compute_dtype(dt)?;
    if e.rank(weight) != 2 {
        return Err(Error::invalid(format!(
            "weight must be 2-D, got {:?}",
            e.dims(weight)
        )));
    }
    let d = e.dims(weight)[1];
    let mode = bag_mode(a)?;
    let indices = int_index(e, x[1], "indices")?;
    let (flat, bag_of, bags, psw) = match e.rank(indices) {
        2 => {
            let id = e.dims(indices);
            let (b, f) = (id[0], id[1]);
            if x.len() > 3 {
                return Err(Error::invalid(
                    "2-D indices take no offsets: pass (weight, indices, per_sample_weights?)",
                ));
            }
            let flat = e.reshape(indices, &[b * f])?;
            let bag = iota(e, &[b, f], 0)?;
            let bag = e.reshape(bag, &[b * f])?;
            (flat, bag, b, x.get(2).copied())
        }
        1 => {
            let m = e.dims(indices)[0];
            let offsets = x.get(2).copied().ok_or_else(|| {
                Error::invalid("1-D indices need offsets (the start of each bag)")
            })?;
            let offsets = int_index(e, offsets, "offsets")?;
            if e.rank(offsets) != 1 {
                return Err(Error::invalid(format!(
                    "offsets must be 1-D, got {:?}",
                    e.dims(offsets)
                )));
            }
            let mut b = e.dims(offsets)[0];
            let mut starts = offsets;
            if a.bool_or("include_last_offset", false)? {
                if b == 0 {
                    return Err(Error::invalid(
                        "include_last_offset needs at least one offset",
                    ));
                }
                b -= 1;
                starts = e.op(
                    Prim::Slice {
                        start: vec![0],
                        limit: vec![b],
                        stride: vec![1],
                    },
                    &[offsets],
                )?;
            }
            // bag of position i = (number of bag starts <= i) - 1.
            let marks = e.full(DType::I64, &[m + 1], 0.0)?;
            let ones = e.full(DType::I64, &[b], 1.0)?;
            let marks = scatter(e, marks, starts, ones, ScatterCombiner::Add)?;
            let marks = e.op(
                Prim::Slice {
                    start: vec![0],
                    limit: vec![m],
                    stride: vec![1],
                },
                &[marks],
            )?;
            let count = e.op(
                Prim::Cumulative {
                    op: ReduceOp::Sum,
                    dimension: 0,
                    reverse: false,
                },
                &[marks],
            )?;
            let bag = e.binary_scalar(BinaryOp::Sub, count, 1.0)?;
            (indices, bag, b, x.get(3).copied())
        }
        _ => {
            return Err(Error::invalid(format!(
                "indices must be 1-D or 2-D, got {:?}",
                e.dims(indices)
            )))
        }
    };
    let m = e.dims(flat)[0];
    let valid = match a.int_opt("padding_idx")? {
        Some(p) if p >= 0 => {
            let pv = e.scalar(DType::I64, p as f64)?;
            e.compare(CompareOp::Ne, flat, pv)?
        }
        _ => e.full(DType::Bool, &[m], 1.0)?,
    };
    let rows = e.op(Prim::Take { axis: 0 }, &[weight, flat])?;
    let mut rows = e.convert(rows, cd)?;
    if let Some(w) = psw {
        if mode != BagMode::Sum {
            return Err(Error::invalid(
                "per_sample_weights is only supported for mode='sum'",
            ));
        }
        if e.ty(w).numel() != m || !e.dtype(w).is_float() {
            return Err(Error::invalid(format!(
                "per_sample_weights must be a float tensor with one weight per index ({m}), \
                 got {}",
                e.ty(w)
            )));
        }
        let w = e.convert(w, cd)?;
        let w = e.reshape(w, &[m])?;
        let w = per_row(e, w, d)?;
        rows = e.mul(rows, w)?;
    }
    let valid_rows = per_row(e, valid, d)?;
    let bag_rows = per_row(e, bag_of, d)?;
    let ones = e.convert(valid, DType::I64)?;
    let zero_bags = e.full(DType::I64, &[bags], 0.0)?;
    let bag_size = scatter(e, zero_bags, bag_of, ones, ScatterCombiner::Add)?;
    let size_rows = per_row(e, bag_size, d)?;
    let zero_i = e.scalar(DType::I64, 0.0)?;
    let nonempty = e.compare(CompareOp::Gt, size_rows, zero_i)?;
    let (out, max_indices) = match mode {
        BagMode::Sum | BagMode::Mean => {
            let zero = e.scalar(cd, 0.0)?;
            let rows = e.select(valid_rows, rows, zero)?;
            let base = e.full(cd, &[bags, d], 0.0)?;
            let s = scatter(e, base, bag_rows, rows, ScatterCombiner::Add)?;
            let s = if mode == BagMode::Mean {
                let one = e.scalar(DType::I64, 1.0)?;
                let n = e.max(size_rows, one)?;
                let n = e.convert(n, cd)?;
                e.div(s, n)?
            } else {
                s
            };
            (s, e.full(DType::I64, &[0], 0.0)?)
        }
        BagMode::Max => {
            let neg_inf = e.scalar(cd, f64::NEG_INFINITY)?;
            let rows = e.select(valid_rows, rows, neg_inf)?;
            let base = e.full(cd, &[bags, d], f64::NEG_INFINITY)?;
            let mx = scatter(e, base, bag_rows, rows, ScatterCombiner::Max)?;
            // First position reaching the maximum, then its weight row.
            let back = e.op(Prim::Take { axis: 0 }, &[mx, bag_of])?;
            let hit = e.compare(CompareOp::Eq, rows, back)?;
            let hit = e.binary(BinaryOp::And, hit, valid_rows)?;
            let pos = iota(e, &[m, d], 0)?;
            let none = e.scalar(DType::I64, m as f64)?;
            let cand = e.select(hit, pos, none)?;
            let first = e.full(DType::I64, &[bags, d], m as f64)?;
            let first = scatter(e, first, bag_rows, cand, ScatterCombiner::Min)?;
            let sentinel = e.full(DType::I64, &[1], -1.0)?;
            let ext = e.op(Prim::Concatenate { dimension: 0 }, &[flat, sentinel])?;
            let max_idx = e.op(Prim::Take { axis: 0 }, &[ext, first])?;
            let zero = e.scalar(cd, 0.0)?;
            let mx = e.select(nonempty, mx, zero)?;
            (mx, max_idx)
        }
    };
    Ok(vec![e.convert(out, dt)?, bag_of, bag_size, max_indices])
}

/// The bag of each index, as `[M]` i64, checked against `m` indices.
fn bag_index(e: &mut Emitter, v: ValueId, m: u64, what: &str) -> Result<ValueId> {
    let v = int_index(e, v, what)?;
    if e.ty(v).numel() != m {
        return Err(Error::invalid(format!(
            "{what} must have one entry per index ({m}), got {}",
            e.ty(v)
        )));
    }
    e.reshape(v, &[m])
}

/// embedding_bag_backward(grad [B, D], indices, offset2bag [M], bag_size
/// [B], max_indices, per_sample_weights?; num_weights, mode=mean,
/// padding_idx=none, scale_grad_by_freq=false) -> grad_weight [W, D].
///
/// The dense gradient of embedding_bag's output with respect to its
/// weight; offset2bag, bag_size and max_indices are embedding_bag's own
/// outputs. Sum and mean send each bag's gradient to the rows of its
/// indices (mean divided by the bag's size, sum scaled by the per-sample
/// weights); max sends it, column by column, to the row that held the
/// maximum (empty bags, -1, to none). Padding indices get nothing;
/// scale_grad_by_freq divides by how often each index occurs.
fn embedding_bag_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let g = x[0];
    let gt = super::support::need_float(e, g, "grad")?;
    let gd = e.dims(g);
    if gd.len() != 2 {
        return Err(Error::invalid(format!(
            "grad must be [bags, dim], got {gd:?}"
        )));
    }
    let (bags, d) = (gd[0], gd[1]);
    let w = u64::try_from(a.int("num_weights")?)
        .map_err(|_| Error::invalid("num_weights must be >= 0"))?;
    let mode = bag_mode(a)?;
    let idx = int_index(e, x[1], "indices")?;
    let m = e.ty(idx).numel();
    let idx = e.reshape(idx, &[m])?;
    let bag_of = bag_index(e, x[2], m, "offset2bag")?;
    let bag_size = int_index(e, x[3], "bag_size")?;
    if e.dims(bag_size) != [bags] {
        return Err(Error::invalid(format!(
            "bag_size must be [{bags}] (one per bag), got {}",
            e.ty(bag_size)
        )));
    }
    let cd = compute_dtype(gt)?;
    let g = e.convert(g, cd)?;
    let valid = match a.int_opt("padding_idx")? {
        Some(p) if p >= 0 => {
            let pv = e.scalar(DType::I64, p as f64)?;
            e.compare(CompareOp::Ne, idx, pv)?
        }
        _ => e.full(DType::Bool, &[m], 1.0)?,
    };
    let out = match mode {
        BagMode::Sum | BagMode::Mean => {
            let mut rows = e.op(Prim::Take { axis: 0 }, &[g, bag_of])?;
            if mode == BagMode::Mean {
                let n = e.op(Prim::Take { axis: 0 }, &[bag_size, bag_of])?;
                let one = e.scalar(DType::I64, 1.0)?;
                let n = e.max(n, one)?;
                let n = e.convert(n, cd)?;
                let n = per_row(e, n, d)?;
                rows = e.div(rows, n)?;
            }
            if let Some(&psw) = x.get(5) {
                if mode != BagMode::Sum {
                    return Err(Error::invalid(
                        "per_sample_weights is only supported for mode='sum'",
                    ));
                }
                if e.ty(psw).numel() != m || !e.dtype(psw).is_float() {
                    return Err(Error::invalid(format!(
                        "per_sample_weights must be a float tensor with one weight per index \
                         ({m}), got {}",
                        e.ty(psw)
                    )));
                }
                let p = e.convert(psw, cd)?;
                let p = e.reshape(p, &[m])?;
                let p = per_row(e, p, d)?;
                rows = e.mul(rows, p)?;
            }
            if a.bool_or("scale_grad_by_freq", false)? {
                let ones = e.convert(valid, cd)?;
                let zeros = e.full(cd, &[w], 0.0)?;
                let counts = scatter(e, zeros, idx, ones, ScatterCombiner::Add)?;
                let c = e.op(Prim::Take { axis: 0 }, &[counts, idx])?;
                let one = e.scalar(cd, 1.0)?;
                let c = e.max(c, one)?;
                let c = per_row(e, c, d)?;
                rows = e.div(rows, c)?;
            }
            let keep = per_row(e, valid, d)?;
            let zero = e.scalar(cd, 0.0)?;
            let rows = e.select(keep, rows, zero)?;
            let base = e.full(cd, &[w, d], 0.0)?;
            let at = per_row(e, idx, d)?;
            scatter(e, base, at, rows, ScatterCombiner::Add)?
        }
        BagMode::Max => {
            let mi = int_index(e, x[4], "max_indices")?;
            if e.dims(mi) != [bags, d] {
                return Err(Error::invalid(format!(
                    "max_indices must be [{bags}, {d}] for mode max, got {}",
                    e.ty(mi)
                )));
            }
            // Flat position row * d + column; -1 (an empty bag) goes to a
            // slot past the end, dropped after.
            let col = iota(e, &[bags, d], 1)?;
            let dv = e.scalar(DType::I64, d as f64)?;
            let flat = e.mul(mi, dv)?;
            let flat = e.add(flat, col)?;
            let zero_i = e.scalar(DType::I64, 0.0)?;
            let hit = e.compare(CompareOp::Ge, mi, zero_i)?;
            let past = e.scalar(DType::I64, (w * d) as f64)?;
            let flat = e.select(hit, flat, past)?;
            let flat = e.reshape(flat, &[bags * d])?;
            let gv = e.reshape(g, &[bags * d])?;
            let base = e.full(cd, &[w * d + 1], 0.0)?;
            let s = scatter(e, base, flat, gv, ScatterCombiner::Add)?;
            let s = e.op(
                Prim::Slice {
                    start: vec![0],
                    limit: vec![w * d],
                    stride: vec![1],
                },
                &[s],
            )?;
            e.reshape(s, &[w, d])?
        }
    };
    Ok(vec![e.convert(out, gt)?])
}

/// embedding_bag_per_sample_weights_backward(grad [B, D], weight [W, D],
/// indices, offset2bag [M]; mode=sum, padding_idx=none) -> [M]: the
/// gradient of each per-sample weight, the dot product of its bag's
/// gradient with its weight row (0 for padding indices).
fn embedding_bag_psw_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (g, weight) = (x[0], x[1]);
    let gt = super::support::need_float(e, g, "grad")?;
    if bag_mode(a)? != BagMode::Sum {
        return Err(Error::invalid(
            "per_sample_weights is only supported for mode='sum'",
        ));
    }
    let (gd, wd) = (e.dims(g), e.dims(weight));
    if gd.len() != 2 || wd.len() != 2 || gd[1] != wd[1] {
        return Err(Error::invalid(format!(
            "grad [bags, dim] and weight [rows, dim] must share dim, got {gd:?} and {wd:?}"
        )));
    }
    let idx = int_index(e, x[2], "indices")?;
    let m = e.ty(idx).numel();
    let idx = e.reshape(idx, &[m])?;
    let bag_of = bag_index(e, x[3], m, "offset2bag")?;
    let cd = compute_dtype(gt)?;
    let g = e.convert(g, cd)?;
    let weight = e.convert(weight, cd)?;
    let gr = e.op(Prim::Take { axis: 0 }, &[g, bag_of])?;
    let wr = e.op(Prim::Take { axis: 0 }, &[weight, idx])?;
    let prod = e.mul(gr, wr)?;
    let dot = e.op(
        Prim::Reduce {
            op: ReduceOp::Sum,
            dimensions: vec![1],
        },
        &[prod],
    )?;
    let dot = match a.int_opt("padding_idx")? {
        Some(p) if p >= 0 => {
            let pv = e.scalar(DType::I64, p as f64)?;
            let keep = e.compare(CompareOp::Ne, idx, pv)?;
            let zero = e.scalar(cd, 0.0)?;
            e.select(keep, dot, zero)?
        }
        _ => dot,
    };
    Ok(vec![e.convert(dot, gt)?])
}

/// index_put(x, indices, values; accumulate=false): x with
/// x[indices[j]] = values[j] (or += with accumulate) along the first dim.
/// Integer indices of any shape (negative ones count from the end) take
/// values broadcastable to indices.shape + x.shape[1:]; duplicate indices
/// without accumulate keep the last write. A bool mask over x's leading
/// dims takes values broadcastable to the remaining dims.
fn index_put(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (base, idx, vals) = (x[0], x[1], x[2]);
    let accumulate = a.bool_or("accumulate", false)?;
    let xd = e.dims(base);
    if xd.is_empty() {
        return Err(Error::invalid("cannot index a 0-D tensor"));
    }
    let dt = e.dtype(base);
    let vals = e.convert(vals, dt)?;
    if e.dtype(idx) == DType::Bool {
        let md = e.dims(idx);
        if md.len() > xd.len() || md[..] != xd[..md.len()] {
            return Err(Error::invalid(format!(
                "the mask of shape {md:?} does not match the leading dimensions of {xd:?}"
            )));
        }
        let rest = &xd[md.len()..];
        if super::emit::broadcast_shapes(&e.dims(vals), rest)
            .ok()
            .as_deref()
            != Some(rest)
        {
            return Err(Error::invalid(format!(
                "values of shape {:?} must broadcast to {rest:?} for a mask index (a value per \
                 selected element depends on the data; use where)",
                e.dims(vals)
            )));
        }
        let mut shaped = md.clone();
        shaped.extend(vec![1; rest.len()]);
        let m = e.reshape(idx, &shaped)?;
        let v = e.broadcast_to(vals, &xd)?;
        if accumulate {
            let zero = e.scalar(dt, 0.0)?;
            let add = e.select(m, v, zero)?;
            let op = if dt == DType::Bool {
                BinaryOp::Or
            } else {
                BinaryOp::Add
            };
            return Ok(vec![e.binary(op, base, add)?]);
        }
        return Ok(vec![e.select(m, v, base)?]);
    }
    let idx = wrap_indices(e, idx, xd[0])?;
    let id = e.dims(idx);
    let k = e.ty(idx).numel();
    let mut target = id.clone();
    target.extend(&xd[1..]);
    let vals = e.broadcast_to(vals, &target).map_err(|_| {
        Error::invalid(format!(
            "values of shape {:?} do not broadcast to {target:?} (indices {id:?} then x's \
             trailing dims)",
            e.dims(vals)
        ))
    })?;
    let mut rows = vec![k];
    rows.extend(&xd[1..]);
    let vals = e.reshape(vals, &rows)?;
    let flat = e.reshape(idx, &[k])?;
    let idx_b = e.op(
        Prim::BroadcastInDim {
            dims: rows.clone(),
            mapping: vec![0],
        },
        &[flat],
    )?;
    let combiner = if accumulate {
        if dt == DType::Bool {
            return Err(Error::invalid(
                "accumulate is not supported for bool tensors",
            ));
        }
        ScatterCombiner::Add
    } else {
        ScatterCombiner::Replace
    };
    Ok(vec![e.op(
        Prim::Scatter { axis: 0, combiner },
        &[base, idx_b, vals],
    )?])
}

/// `v` with element `idx` (an i64 tensor of `v`'s shape with size 1 at
/// `axis`) taken along `axis`; the axis is kept.
fn take_along(e: &mut Emitter, v: ValueId, idx: ValueId, axis: usize) -> Result<ValueId> {
    e.op(Prim::Gather { axis }, &[v, idx])
}

/// A position along a sorted axis: the same for every row, or per row
/// (an i64 tensor with size 1 at the axis).
enum Rank {
    Every(u64),
    PerRow(ValueId),
}

/// The values and indices at position `k` of a sort along `axis`, the
/// axis removed unless `keep`.
fn pick_sorted(
    e: &mut Emitter,
    (v, i): (ValueId, ValueId),
    axis: usize,
    k: Rank,
    keep: bool,
) -> Result<Vec<ValueId>> {
    let mut one = e.dims(v);
    one[axis] = 1;
    let k = match k {
        Rank::PerRow(k) => k,
        Rank::Every(at) => e.full(DType::I64, &one, at as f64)?,
    };
    let (v, i) = (take_along(e, v, k, axis)?, take_along(e, i, k, axis)?);
    if keep {
        return Ok(vec![v, i]);
    }
    let mut out = one;
    out.remove(axis);
    Ok(vec![e.reshape(v, &out)?, e.reshape(i, &out)?])
}

/// kthvalue(x; k, dim=-1, keepdim=false) -> (values, indices): the k-th
/// smallest (k from 1) along dim, NaN above every number; among equal
/// values the index of one of them.
fn kthvalue(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let k = a.int("k")?;
    let keep = a.bool_or("keepdim", false)?;
    let rank = e.rank(x[0]);
    let d = wrap_dim(a.int_or("dim", -1)?, rank)?;
    let n = if rank == 0 { 1 } else { e.dims(x[0])[d] };
    if k < 1 || k as u64 > n {
        return Err(Error::invalid(format!(
            "selected number k={k} out of range for dimension {d} of size {n}"
        )));
    }
    let (v, i, _) = sort_values(e, x[0], d as i64, false)?;
    let axis = if rank == 0 { 0 } else { d };
    let r = pick_sorted(
        e,
        (v, i),
        axis,
        Rank::Every(k as u64 - 1),
        keep || rank == 0,
    )?;
    if rank == 0 {
        return Ok(vec![e.reshape(r[0], &[])?, e.reshape(r[1], &[])?]);
    }
    Ok(r)
}

/// median(x; dim, keepdim=false, ignore_nan=false) -> (values, indices):
/// the lower median along dim (the ((n - 1) / 2)-th smallest). A row with
/// a NaN gives its first NaN (torch.median); with ignore_nan the median of
/// the row's numbers, NaN where it has none (torch.nanmedian). Without
/// dim, over every element (of an empty tensor: NaN, index 0).
fn median(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let ignore_nan = a.bool_or("ignore_nan", false)?;
    let t = e.ty(x[0]);
    let (v, d, keep) = match a.get("dim") {
        None | Some(Attr::None) => {
            let n = t.dims.iter().product::<u64>();
            if n == 0 {
                if !t.dtype.is_float() {
                    return Err(Error::invalid(format!(
                        "the median of an empty {} tensor is undefined",
                        t.dtype
                    )));
                }
                return Ok(vec![
                    e.full(t.dtype, &[], f64::NAN)?,
                    e.full(DType::I64, &[], 0.0)?,
                ]);
            }
            (e.reshape(x[0], &[n])?, 0, false)
        }
        Some(_) => {
            let d = wrap_dim(a.int("dim")?, t.rank())?;
            let v = if t.rank() == 0 {
                e.reshape(x[0], &[1])?
            } else {
                x[0]
            };
            (v, d, a.bool_or("keepdim", false)? && t.rank() > 0)
        }
    };
    let n = e.dims(v)[d];
    if n == 0 {
        return Err(Error::invalid(format!(
            "expected reduction dim {d} to have non-zero size"
        )));
    }
    let (s, i, _) = sort_values(e, v, d as i64, false)?;
    let k = if t.dtype.is_float() {
        // NaNs sort last (in their order), so a row's first NaN is at
        // n - nans and its numbers at 0..n - nans.
        let nan = e.compare(CompareOp::Ne, v, v)?;
        let nan = e.convert(nan, DType::I64)?;
        let nans = e.reduce(ReduceOp::Sum, nan, &[d], true)?;
        let row = e.dims(nans);
        let nn = e.full(DType::I64, &row, n as f64)?;
        let numbers = e.sub(nn, nans)?;
        let two = e.scalar(DType::I64, 2.0)?;
        if ignore_nan {
            // (numbers - 1) / 2 rounded toward zero, 0 for a row of NaNs.
            let zero = e.scalar(DType::I64, 0.0)?;
            let m1 = e.binary_scalar(BinaryOp::Sub, numbers, 1.0)?;
            let m1 = e.max(m1, zero)?;
            Rank::PerRow(e.binary(BinaryOp::Div, m1, two)?)
        } else {
            let zero = e.scalar(DType::I64, 0.0)?;
            let any = e.compare(CompareOp::Gt, nans, zero)?;
            let mid = e.full(DType::I64, &row, ((n - 1) / 2) as f64)?;
            Rank::PerRow(e.select(any, numbers, mid)?)
        }
    } else {
        Rank::Every((n - 1) / 2)
    };
    let r = pick_sorted(e, (s, i), d, k, keep)?;
    if t.rank() == 0 {
        return Ok(vec![e.reshape(r[0], &[])?, e.reshape(r[1], &[])?]);
    }
    Ok(r)
}

/// mode(x; dim=-1, keepdim=false) -> (values, indices): the most frequent
/// value along dim, the smallest of those tied, and the index of its last
/// occurrence (torch's CPU kernel's choices). NaN never equals NaN, so
/// each NaN counts once (torch's kernel sorts with <, so its answer for a
/// row with NaN depends on where the NaN stands). From a stable sort: the
/// length of the run of
/// equal values ending at each sorted position, and the first position
/// of the longest (the last element of the smallest value's run).
fn mode(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let t = e.ty(x[0]);
    let d = wrap_dim(a.int_or("dim", -1)?, t.rank())?;
    let keep = a.bool_or("keepdim", false)? && t.rank() > 0;
    let v = if t.rank() == 0 {
        e.reshape(x[0], &[1])?
    } else {
        x[0]
    };
    let dims = e.dims(v);
    let n = dims[d];
    if n == 0 {
        return Err(Error::invalid(format!(
            "expected reduction dim {d} to have non-zero size"
        )));
    }
    let (s, i, _) = sort_values(e, v, d as i64, false)?;
    // prev[j] = s[j - 1] (s[0] at j = 0, where a run starts anyway).
    let mut head = dims.clone();
    head[d] = 1;
    let start = vec![0; dims.len()];
    let first = e.op(
        Prim::Slice {
            start: start.clone(),
            limit: head,
            stride: vec![1; dims.len()],
        },
        &[s],
    )?;
    let mut limit = dims.clone();
    limit[d] = n - 1;
    let before = e.op(
        Prim::Slice {
            start: start.clone(),
            limit,
            stride: vec![1; dims.len()],
        },
        &[s],
    )?;
    let prev = e.op(Prim::Concatenate { dimension: d }, &[first, before])?;
    let differs = e.compare(CompareOp::Ne, s, prev)?;
    let pos = iota(e, &dims, d)?;
    let at_zero = e.compare_scalar(CompareOp::Eq, pos, 0.0)?;
    let starts = e.binary(BinaryOp::Or, differs, at_zero)?;
    let zero = e.scalar(DType::I64, 0.0)?;
    let start_pos = e.select(starts, pos, zero)?;
    let run_start = e.op(
        Prim::Cumulative {
            op: ReduceOp::Max,
            dimension: d,
            reverse: false,
        },
        &[start_pos],
    )?;
    let run = e.sub(pos, run_start)?;
    let best = e.op(
        Prim::ArgReduce {
            max: true,
            dimension: d,
        },
        &[run],
    )?;
    let mut one = dims.clone();
    one[d] = 1;
    let best = e.reshape(best, &one)?;
    let r = pick_sorted(e, (s, i), d, Rank::PerRow(best), keep)?;
    if t.rank() == 0 {
        return Ok(vec![e.reshape(r[0], &[])?, e.reshape(r[1], &[])?]);
    }
    Ok(r)
}

/// searchsorted(sorted_sequence, values[, sorter]; right=false,
/// out_int32=false) -> i64 (i32) of values' shape: each value's insertion
/// point in its row of the sequence (1-D: the one row; N-D: the row of the
/// same leading indices), the first such point (right: the last), as
/// torch's binary search computes it, so NaN and unsorted rows give what
/// torch gives. `sorter` (the sequence's argsort) reads it in sorted order.
/// Both inputs are compared in their promoted dtype.
fn searchsorted(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let right = a.bool_or("right", false)?;
    let out = if a.bool_or("out_int32", false)? {
        DType::I32
    } else {
        DType::I64
    };
    let (bt, vt) = (e.ty(x[0]), e.ty(x[1]));
    if bt.dtype == DType::Bool || vt.dtype == DType::Bool {
        return Err(Error::invalid(format!(
            "not implemented for bool tensors (boundaries {bt}, values {vt})"
        )));
    }
    let br = bt.rank();
    if br == 0 {
        return Err(Error::invalid(
            "boundaries tensor should have positive dimension, but got 0 dimension",
        ));
    }
    if br > 1 && (vt.rank() != br || bt.dims[..br - 1] != vt.dims[..br - 1]) {
        return Err(Error::invalid(format!(
            "boundaries tensor should be 1 dimension or the first N-1 dimensions of boundaries \
             tensor and input value tensor must match, but got boundaries {bt} and values {vt}"
        )));
    }
    let m = bt.dims[br - 1];
    let mut bd = x[0];
    if let Some(&sorter) = x.get(2) {
        let st = e.ty(sorter);
        if st.dims != bt.dims || !st.dtype.is_integer() {
            return Err(Error::invalid(format!(
                "sorter {st} must be an integer tensor of the boundaries' shape {:?}",
                bt.dims
            )));
        }
        if m > 0 {
            let s = e.convert(sorter, DType::I64)?;
            let lo = e.scalar(DType::I64, 0.0)?;
            let hi = e.scalar(DType::I64, (m - 1) as f64)?;
            let s = e.op(Prim::Clamp, &[lo, s, hi])?;
            bd = take_along(e, bd, s, br - 1)?;
        }
    }
    let dt = super::promote::promote_types(bt.dtype, vt.dtype);
    let bd = e.convert(bd, dt)?;
    let v = e.convert(x[1], dt)?;
    let mut lo = e.full(DType::I64, &vt.dims, 0.0)?;
    let mut hi = e.full(DType::I64, &vt.dims, m as f64)?;
    let last = e.scalar(DType::I64, m.saturating_sub(1) as f64)?;
    let two = e.scalar(DType::I64, 2.0)?;
    // Each step halves every open interval [lo, hi): as many steps as m
    // has bits close them all.
    for _ in 0..(64 - m.leading_zeros()) {
        let open = e.compare(CompareOp::Lt, lo, hi)?;
        let span = e.sub(hi, lo)?;
        let half = e.binary(BinaryOp::Div, span, two)?;
        let mid = e.add(lo, half)?;
        let at = e.min(mid, last)?;
        let at = if br == 1 {
            e.op(Prim::Take { axis: 0 }, &[bd, at])?
        } else {
            take_along(e, bd, at, br - 1)?
        };
        // torch: start = mid + 1 unless boundary >= value (right: > value).
        let stays = e.compare(if right { CompareOp::Gt } else { CompareOp::Ge }, at, v)?;
        let moves = e.unary(UnaryOp::Not, stays)?;
        let up = e.binary(BinaryOp::And, open, moves)?;
        let down = e.binary(BinaryOp::And, open, stays)?;
        let next = e.binary_scalar(BinaryOp::Add, mid, 1.0)?;
        lo = e.select(up, next, lo)?;
        hi = e.select(down, mid, hi)?;
    }
    Ok(vec![e.convert(lo, out)?])
}

/// repeat_interleave(repeats; output_size): the indices 0..n, index i
/// repeated repeats[i] times, in repeats' dtype (i32 or i64), as
/// torch.repeat_interleave(repeats). The result's length is the sum of
/// the repeats, which the frontend reads (or its user gives, as torch's
/// output_size) and passes: the graph finds each output position's index
/// by a binary search in the repeats' running sum. Positions past the sum
/// (an output_size too large) take the last index, so every index the
/// result holds is in range.
fn repeat_interleave(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let rt = e.ty(x[0]);
    if rt.rank() > 1 || !matches!(rt.dtype, DType::I32 | DType::I64) {
        return Err(Error::invalid(format!(
            "repeats must be a 0-dim or 1-dim int32 or int64 tensor, got {rt}"
        )));
    }
    let size = a.int("output_size")?;
    let size = u64::try_from(size)
        .map_err(|_| Error::invalid(format!("output_size must be non-negative, got {size}")))?;
    let n = rt.dims.first().copied().unwrap_or(1);
    if n == 0 && size > 0 {
        return Err(Error::invalid(format!(
            "output_size {size} from no repeats"
        )));
    }
    let r = e.reshape(x[0], &[n])?;
    let r = e.convert(r, DType::I64)?;
    let ends = e.op(
        Prim::Cumulative {
            op: ReduceOp::Sum,
            dimension: 0,
            reverse: false,
        },
        &[r],
    )?;
    let k = iota(e, &[size], 0)?;
    let right = Attrs::new().with("right", Attr::Bool(true));
    let idx = searchsorted(e, &[ends, k], &right)?.remove(0);
    let lo = e.scalar(DType::I64, 0.0)?;
    let hi = e.scalar(DType::I64, n.saturating_sub(1) as f64)?;
    let idx = e.op(Prim::Clamp, &[lo, idx, hi])?;
    Ok(vec![e.convert(idx, rt.dtype)?])
}

/// bincount(x, weights?; length): how often each value 0..length occurs in
/// the 1-d integer x, or the sum of the weights at its positions; values
/// outside [0, length) are not counted (torch's frontend passes
/// max(x) + 1, or minlength if larger, after refusing negative values).
/// Counts are i64; weighted sums are f32 for f32 weights and f64 for every
/// other dtype, as torch's.
fn bincount(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let xt = e.ty(x[0]);
    if xt.rank() != 1 || !xt.dtype.is_integer() {
        return Err(Error::invalid(format!(
            "only supports 1-d integral inputs, got {xt}"
        )));
    }
    let length = a.int("length")?;
    let length = u64::try_from(length)
        .map_err(|_| Error::invalid(format!("length must be non-negative, got {length}")))?;
    let n = xt.dims[0];
    let (updates, dt) = match x.get(1) {
        Some(&w) => {
            let wt = e.ty(w);
            if wt.dims != xt.dims {
                return Err(Error::invalid(format!(
                    "weights should be 1-d and have the same length as input, got weights {wt} \
                     and input {xt}"
                )));
            }
            let dt = if wt.dtype == DType::F32 {
                DType::F32
            } else {
                DType::F64
            };
            (e.convert(w, dt)?, dt)
        }
        None => (e.full(DType::I64, &[n], 1.0)?, DType::I64),
    };
    // Values outside [0, length) go to a spare last bin, dropped after.
    let v = e.convert(x[0], DType::I64)?;
    let lo = e.compare_scalar(CompareOp::Ge, v, 0.0)?;
    let hi = e.compare_scalar(CompareOp::Lt, v, length as f64)?;
    let inside = e.binary(BinaryOp::And, lo, hi)?;
    let spare = e.full(DType::I64, &[n], length as f64)?;
    let at = e.select(inside, v, spare)?;
    let bins = e.full(dt, &[length + 1], 0.0)?;
    let counts = e.op(
        Prim::Scatter {
            axis: 0,
            combiner: ScatterCombiner::Add,
        },
        &[bins, at, updates],
    )?;
    Ok(vec![e.op(
        Prim::Slice {
            start: vec![0],
            limit: vec![length],
            stride: vec![1],
        },
        &[counts],
    )?])
}

/// Where each true element of `mask` (flattened) takes its value from
/// the flattened source: its count of earlier true elements, clamped to
/// `[0, s)` (i64 [n]).
fn mask_slots(e: &mut Emitter, mask: ValueId, s: u64) -> Result<ValueId> {
    let n = e.dims(mask).iter().product::<u64>();
    let flat = e.reshape(mask, &[n])?;
    let ones = e.convert(flat, DType::I64)?;
    let c = e.op(
        Prim::Cumulative {
            op: ReduceOp::Sum,
            dimension: 0,
            reverse: false,
        },
        &[ones],
    )?;
    let pos = e.binary_scalar(BinaryOp::Sub, c, 1.0)?;
    let lo = e.scalar(DType::I64, 0.0)?;
    let hi = e.scalar(DType::I64, s.saturating_sub(1) as f64)?;
    e.op(Prim::Clamp, &[lo, pos, hi])
}

fn bool_mask_of(e: &Emitter, mask: ValueId) -> Result<()> {
    if e.dtype(mask) != DType::Bool {
        return Err(Error::invalid(format!(
            "only supports boolean masks, but got mask {}",
            e.ty(mask)
        )));
    }
    Ok(())
}

/// masked_scatter(x, mask: bool, source) -> x where mask is false; where
/// it is true, source's elements in order (row-major) from its first. x
/// and mask broadcast together; source needs at least as many elements as
/// mask has true ones (the frontend checks; here a short source repeats
/// its last element).
fn masked_scatter(e: &mut Emitter, x: &[ValueId], _a: &Attrs) -> Result<Vec<ValueId>> {
    let (xt, st) = (e.ty(x[0]), e.ty(x[2]));
    bool_mask_of(e, x[1])?;
    if xt.dtype != st.dtype {
        return Err(Error::invalid(format!(
            "expected self and source to have the same dtype, but got {} and {}",
            xt.dtype, st.dtype
        )));
    }
    let dims = broadcast_shapes(&xt.dims, &e.dims(x[1]))?;
    let xb = e.broadcast_to(x[0], &dims)?;
    let mb = e.broadcast_to(x[1], &dims)?;
    let s = st.dims.iter().product::<u64>();
    let n = dims.iter().product::<u64>();
    if s == 0 || n == 0 {
        return Ok(vec![e.identity(xb)?]);
    }
    let slots = mask_slots(e, mb, s)?;
    let src = e.reshape(x[2], &[s])?;
    let g = e.op(Prim::Take { axis: 0 }, &[src, slots])?;
    let g = e.reshape(g, &dims)?;
    Ok(vec![e.select(mb, g, xb)?])
}

/// masked_scatter_backward(grad, mask; sizes) -> source's gradient: the
/// elements of grad where mask (broadcast to grad) is true, in order,
/// then zeros, shaped `sizes`.
fn masked_scatter_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    bool_mask_of(e, x[1])?;
    let sizes = sizes_attr(a, "sizes")?;
    let dims = e.dims(x[0]);
    let dt = e.dtype(x[0]);
    let mb = e.broadcast_to(x[1], &dims)?;
    let s = sizes.iter().product::<u64>();
    let n = dims.iter().product::<u64>();
    if s == 0 || n == 0 {
        return Ok(vec![e.full(dt, &sizes, 0.0)?]);
    }
    // False elements (and any beyond the source's size) land in a spare
    // slot s, cut off after; each other slot is written once.
    let slots = mask_slots(e, mb, s + 1)?;
    let flat_mask = e.reshape(mb, &[n])?;
    let spare = e.full(DType::I64, &[n], s as f64)?;
    let slots = e.select(flat_mask, slots, spare)?;
    let g = e.reshape(x[0], &[n])?;
    let zeros = e.full(dt, &[s + 1], 0.0)?;
    let r = e.op(
        Prim::Scatter {
            axis: 0,
            combiner: ScatterCombiner::Replace,
        },
        &[zeros, slots, g],
    )?;
    let r = e.op(
        Prim::Slice {
            start: vec![0],
            limit: vec![s],
            stride: vec![1],
        },
        &[r],
    )?;
    Ok(vec![e.reshape(r, &sizes)?])
}

/// nonzero_static(x; size, fill_value = -1) -> [size, rank] i64: the
/// coordinates of x's first `size` nonzero elements in row-major order,
/// the rows past their count filled with fill_value (torch.nonzero_static:
/// its shape is static, so nothing is read back). A stable sort puts the
/// nonzero positions first, in order.
fn nonzero_static(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let size = a.int("size")?;
    if size < 0 {
        return Err(Error::invalid(format!(
            "'size' must be an non-negative integer, got {size}"
        )));
    }
    let size = size as u64;
    let fill = a.int_or("fill_value", -1)?;
    let d = e.dims(x[0]);
    let r = d.len() as u64;
    if size == 0 || r == 0 {
        // No rows, or a 0-d tensor's rows of no coordinates.
        return Ok(vec![e.full(DType::I64, &[size, r], 0.0)?]);
    }
    let n: u64 = d.iter().product();
    let flat = e.reshape(x[0], &[n])?;
    let nonzero = if e.dtype(flat) == DType::Bool {
        flat
    } else {
        e.compare_scalar(CompareOp::Ne, flat, 0.0)?
    };
    let key = e.convert(nonzero, DType::I32)?;
    let key = e.unary(UnaryOp::Neg, key)?;
    let (_, positions) = e.sort(key, 0, false)?;
    let keep = size.min(n);
    let positions = e.op(
        Prim::Slice {
            start: vec![0],
            limit: vec![keep],
            stride: vec![1],
        },
        &[positions],
    )?;
    let positions = if size > n {
        let zero = e.scalar(DType::I64, 0.0)?;
        e.op(
            Prim::Pad {
                low: vec![0],
                high: vec![(size - n) as i64],
                interior: vec![0],
            },
            &[positions, zero],
        )?
    } else {
        positions
    };
    let ones = e.convert(nonzero, DType::I64)?;
    let count = e.reduce(ReduceOp::Sum, ones, &[0], false)?;
    let count = e.broadcast_to(count, &[size])?;
    let slot = super::support::iota_of(e, DType::I64, &[size], 0)?;
    let filled = e.compare(CompareOp::Lt, slot, count)?;
    // Row-major coordinates: (lin / stride_k) % dim_k.
    let strides: Vec<i64> = (0..d.len())
        .map(|k| d[k + 1..].iter().product::<u64>() as i64)
        .collect();
    let extents: Vec<i64> = d.iter().map(|&v| v as i64).collect();
    let grid = [size, r];
    let lin = e.reshape(positions, &[size, 1])?;
    let lin = e.broadcast_to(lin, &grid)?;
    let strides = super::support::i64_vector(e, &strides)?;
    let strides = e.broadcast_to(strides, &grid)?;
    let extents = super::support::i64_vector(e, &extents)?;
    let extents = e.broadcast_to(extents, &grid)?;
    let q = e.div(lin, strides)?;
    let coords = e.binary(BinaryOp::Rem, q, extents)?;
    let filled = e.reshape(filled, &[size, 1])?;
    let filled = e.broadcast_to(filled, &grid)?;
    let fill = super::support::i64_constant(e, fill)?;
    let fill = e.broadcast_to(fill, &grid)?;
    Ok(vec![e.select(filled, coords, fill)?])
}

pub(super) const OPS: &[OpDef] = &[
    def!("sort", Arity::Exactly(1), sort),
    def!("topk", Arity::Exactly(1), topk),
    def!("embedding_bag", Arity::Between(2, 4), embedding_bag),
    def!(
        "embedding_bag_backward",
        Arity::Between(5, 6),
        embedding_bag_backward
    ),
    def!(
        "embedding_bag_per_sample_weights_backward",
        Arity::Exactly(4),
        embedding_bag_psw_backward
    ),
    def!("index_put", Arity::Exactly(3), index_put),
    def!("nonzero_static", Arity::Exactly(1), nonzero_static),
    def!("kthvalue", Arity::Exactly(1), kthvalue),
    def!("median", Arity::Exactly(1), median),
    def!("mode", Arity::Exactly(1), mode),
    def!("searchsorted", Arity::Between(2, 3), searchsorted),
    def!("repeat_interleave", Arity::Exactly(1), repeat_interleave),
    def!("bincount", Arity::Between(1, 2), bincount),
    def!("masked_scatter", Arity::Exactly(3), masked_scatter),
    def!(
        "masked_scatter_backward",
        Arity::Exactly(2),
        masked_scatter_backward
    ),
];
