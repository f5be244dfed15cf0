//! Shape ops: reshape, permute, expand, cat/stack/split, slicing,
//! padding, repeat, triangular masks, index_select/gather/scatter,
//! embedding, and the factories (arange, full).

use super::attrs::{Attr, Attrs};
use super::emit::{existing_dim, wrap_dim, Emitter};
use super::support::{i64_vector, iota, iota_of, scatter_add_rows};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, Prim, ScatterCombiner, UnaryOp, ValueId};

fn to_u64(v: i64, what: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| Error::invalid(format!("{what} {v} is negative")))
}

/// Sizes with at most one -1 inferred from the element count.
fn infer_shape(sizes: &[i64], numel: u64) -> Result<Vec<u64>> {
    let mut unknown = None;
    let mut known = 1u64;
    for (i, &s) in sizes.iter().enumerate() {
        if s == -1 {
            if unknown.replace(i).is_some() {
                return Err(Error::invalid(format!(
                    "shape {sizes:?} has more than one -1"
                )));
            }
        } else {
            known = known.saturating_mul(to_u64(s, "size")?);
        }
    }
    let mut dims: Vec<u64> = sizes.iter().map(|&s| s.max(0) as u64).collect();
    if let Some(i) = unknown {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(Error::invalid(format!(
                "shape {sizes:?} is invalid for input of size {numel}"
            )));
        }
        dims[i] = numel / known;
    } else if known != numel {
        return Err(Error::invalid(format!(
            "shape {sizes:?} is invalid for input of size {numel}"
        )));
    }
    Ok(dims)
}

fn reshape(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dims = infer_shape(&a.ints("shape")?, e.ty(x[0]).numel())?;
    Ok(vec![e.reshape(x[0], &dims)?])
}

fn flatten(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let d = e.dims(x[0]);
    if d.is_empty() {
        return Ok(vec![e.reshape(x[0], &[1])?]);
    }
    let s = wrap_dim(a.int_or("start_dim", 0)?, d.len())?;
    let t = wrap_dim(a.int_or("end_dim", -1)?, d.len())?;
    if s > t {
        return Err(Error::invalid(format!(
            "start_dim {s} is after end_dim {t}"
        )));
    }
    let mut out = d[..s].to_vec();
    out.push(d[s..=t].iter().product());
    out.extend(&d[t + 1..]);
    Ok(vec![e.reshape(x[0], &out)?])
}

fn permute(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let rank = e.rank(x[0]);
    let perm = a
        .ints("dims")?
        .iter()
        .map(|&d| wrap_dim(d, rank))
        .collect::<Result<Vec<_>>>()?;
    if rank == 0 {
        return Ok(vec![x[0]]);
    }
    Ok(vec![e.transpose(x[0], &perm)?])
}

fn transpose(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let rank = e.rank(x[0]);
    if rank < 2 {
        return Ok(vec![x[0]]);
    }
    let d0 = wrap_dim(a.int("dim0")?, rank)?;
    let d1 = wrap_dim(a.int("dim1")?, rank)?;
    let mut perm: Vec<usize> = (0..rank).collect();
    perm.swap(d0, d1);
    Ok(vec![e.transpose(x[0], &perm)?])
}

/// expand(size): -1 keeps a dimension; new leading dimensions allowed.
fn expand(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let sizes = a.ints("size")?;
    let d = e.dims(x[0]);
    if sizes.len() < d.len() {
        return Err(Error::invalid(format!(
            "size {sizes:?} has fewer dimensions than the input {d:?}"
        )));
    }
    let off = sizes.len() - d.len();
    let mut dims = Vec::new();
    for (i, &s) in sizes.iter().enumerate() {
        dims.push(if s == -1 {
            if i < off {
                return Err(Error::invalid(
                    "-1 is not allowed for a new leading dimension",
                ));
            }
            d[i - off]
        } else {
            to_u64(s, "size")?
        });
    }
    Ok(vec![e.broadcast_to(x[0], &dims)?])
}

fn squeeze(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let d = e.dims(x[0]);
    let which: Vec<usize> = match a.ints_opt("dim")? {
        None => (0..d.len()).collect(),
        Some(ds) => ds
            .iter()
            .map(|&i| wrap_dim(i, d.len()))
            .collect::<Result<_>>()?,
    };
    let out: Vec<u64> = d
        .iter()
        .enumerate()
        .filter(|(i, &n)| !(n == 1 && which.contains(i)))
        .map(|(_, &n)| n)
        .collect();
    Ok(vec![e.reshape(x[0], &out)?])
}

fn unsqueeze(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let mut d = e.dims(x[0]);
    let dim = wrap_dim(a.int("dim")?, d.len() + 1)?;
    d.insert(dim, 1);
    Ok(vec![e.reshape(x[0], &d)?])
}

/// cat(tensors, dim): dtypes promote; empty 1-D tensors are skipped (torch).
fn cat(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (xs, _) = super::pointwise::promote(e, x, a)?;
    let parts: Vec<ValueId> = xs
        .iter()
        .copied()
        .filter(|&v| !(e.rank(v) == 1 && e.dims(v)[0] == 0))
        .collect();
    let Some(&first) = parts.first() else {
        return Ok(vec![xs[0]]);
    };
    let dim = wrap_dim(a.int_or("dim", 0)?, e.rank(first))?;
    if parts.len() == 1 {
        return super::pointwise_copy(e, first);
    }
    Ok(vec![e.op(Prim::Concatenate { dimension: dim }, &parts)?])
}

fn stack(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (xs, _) = super::pointwise::promote(e, x, a)?;
    let d = e.dims(xs[0]);
    let dim = wrap_dim(a.int_or("dim", 0)?, d.len() + 1)?;
    let mut nd = d.clone();
    nd.insert(dim, 1);
    let parts = xs
        .iter()
        .map(|&v| {
            if e.dims(v) != d {
                return Err(Error::invalid(format!(
                    "stack expects each tensor to be equal size, but got {:?} and {d:?}",
                    e.dims(v)
                )));
            }
            e.reshape(v, &nd)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(vec![e.op(Prim::Concatenate { dimension: dim }, &parts)?])
}

/// slice(dim, start, end, step) with torch's clamping of start and end.
fn slice_value(
    e: &mut Emitter,
    x: ValueId,
    dim: i64,
    start: i64,
    end: i64,
    step: i64,
) -> Result<ValueId> {
    let d = e.dims(x);
    let dim = existing_dim(dim, d.len())?;
    if step <= 0 {
        return Err(Error::invalid(format!(
            "slice step must be positive, got {step}"
        )));
    }
    let n = d[dim] as i64;
    let clampi = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
    let (s, t) = (clampi(start), clampi(end).max(clampi(start)));
    let mut start_v = vec![0u64; d.len()];
    let mut limit = d.clone();
    let mut stride = vec![1u64; d.len()];
    start_v[dim] = s as u64;
    limit[dim] = t as u64;
    stride[dim] = step as u64;
    e.op(
        Prim::Slice {
            start: start_v,
            limit,
            stride,
        },
        &[x],
    )
}
fn slice(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    Ok(vec![slice_value(
        e,
        x[0],
        a.int_or("dim", 0)?,
        a.int_or("start", 0)?,
        a.int_or("end", i64::MAX)?,
        a.int_or("step", 1)?,
    )?])
}
fn narrow(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let start = a.int("start")?;
    let len = a.int("length")?;
    let dim = a.int("dim")?;
    let n = e.dims(x[0])[existing_dim(dim, e.rank(x[0]))?] as i64;
    let s = if start < 0 { start + n } else { start };
    if s < 0 || len < 0 || s + len > n {
        return Err(Error::invalid(format!(
            "start {start} and length {len} exceed dimension size {n}"
        )));
    }
    Ok(vec![slice_value(e, x[0], dim, s, s + len, 1)?])
}

/// split(split_size or sizes, dim) -> several outputs.
fn split(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let d = e.dims(x[0]);
    let dim = existing_dim(a.int_or("dim", 0)?, d.len())?;
    let n = d[dim];
    let sizes: Vec<u64> = match a.ints_opt("sizes")? {
        Some(s) => s
            .iter()
            .map(|&v| to_u64(v, "split size"))
            .collect::<Result<_>>()?,
        None => {
            let k = to_u64(a.int("split_size")?, "split_size")?;
            if k == 0 {
                return Err(Error::invalid("split_size must be positive"));
            }
            let mut v = vec![k; (n / k) as usize];
            if !n.is_multiple_of(k) || n == 0 {
                v.push(n % k);
            }
            v
        }
    };
    if sizes.iter().sum::<u64>() != n {
        return Err(Error::invalid(format!(
            "split sizes {sizes:?} do not add up to {n}"
        )));
    }
    let mut at = 0i64;
    sizes
        .iter()
        .map(|&s| {
            let v = slice_value(e, x[0], dim as i64, at, at + s as i64, 1);
            at += s as i64;
            v
        })
        .collect()
}

/// pad(x; pad, mode = "constant", value = 0) -> x padded as torch's
/// F.pad: `pad` holds (before, after) pairs from the last dim backwards.
/// "constant" fills with `value` (negative pads crop); "reflect" mirrors
/// about the edge elements, "replicate" repeats them and "circular" wraps
/// around (pads at most the dim's size, less one for reflect; not
/// negative).
fn pad(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let d = e.dims(x[0]);
    let (low, high) = pad_pairs(a, &d)?;
    let mode = a.str_or("mode", "constant")?;
    if mode == "constant" {
        let value = e.scalar(e.dtype(x[0]), a.float_or("value", 0.0)?)?;
        return Ok(vec![e.op(
            Prim::Pad {
                low,
                high,
                interior: vec![0; d.len()],
            },
            &[x[0], value],
        )?]);
    }
    let sources = pad_sources(mode, &d, &low, &high)?;
    let mut v = x[0];
    for (dim, at) in sources {
        let at = i64_vector(e, &at)?;
        v = e.op(Prim::Take { axis: dim }, &[v, at])?;
    }
    Ok(vec![v])
}

/// The (low, high) pads per dim of `dims` from torch's `pad` list.
fn pad_pairs(a: &Attrs, d: &[u64]) -> Result<(Vec<i64>, Vec<i64>)> {
    let pads = a.ints("pad")?;
    if pads.len() % 2 != 0 || pads.len() / 2 > d.len() {
        return Err(Error::invalid(format!(
            "pad {pads:?} needs pairs for at most {} dimensions",
            d.len()
        )));
    }
    let mut low = vec![0i64; d.len()];
    let mut high = vec![0i64; d.len()];
    for (k, pair) in pads.chunks(2).enumerate() {
        let dim = d.len() - 1 - k;
        low[dim] = pair[0];
        high[dim] = pair[1];
    }
    Ok((low, high))
}

/// For a reflect, replicate or circular pad: per padded dim, the source
/// position of every output position along it.
fn pad_sources(mode: &str, d: &[u64], low: &[i64], high: &[i64]) -> Result<Vec<(usize, Vec<i64>)>> {
    let mut out = Vec::new();
    for dim in 0..d.len() {
        let (l, h, n) = (low[dim], high[dim], d[dim] as i64);
        if l == 0 && h == 0 {
            continue;
        }
        let limit = match mode {
            "reflect" => n - 1,
            "replicate" => i64::MAX,
            "circular" => n,
            other => {
                return Err(Error::invalid(format!(
                    "pad mode {other:?} is not one of constant, reflect, replicate, circular"
                )))
            }
        };
        if l < 0 || h < 0 || l > limit || h > limit || n == 0 {
            return Err(Error::invalid(format!(
                "{mode} padding of ({l}, {h}) along dim {dim} of size {n}: pads must be \
                 non-negative and {}",
                match mode {
                    "reflect" => "less than the dim's size",
                    "circular" => "at most the dim's size",
                    _ => "the dim not empty",
                }
            )));
        }
        let at = (-l..n + h)
            .map(|p| match mode {
                "reflect" => {
                    let p = p.abs();
                    if p >= n {
                        2 * (n - 1) - p
                    } else {
                        p
                    }
                }
                "replicate" => p.clamp(0, n - 1),
                _ => p.rem_euclid(n),
            })
            .collect();
        out.push((dim, at));
    }
    Ok(out)
}

/// pad_backward(grad; input_size, pad, mode) -> the grad of a reflect,
/// replicate or circular pad: every output's grad added into its source,
/// in output order (one scatter over the padded dims).
fn pad_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let grad = x[0];
    let input: Vec<u64> = a
        .ints("input_size")?
        .iter()
        .map(|&v| to_u64(v, "input_size"))
        .collect::<Result<_>>()?;
    let (low, high) = pad_pairs(a, &input)?;
    let mode = a.str_or("mode", "constant")?;
    if mode == "constant" {
        return Err(Error::invalid(
            "pad_backward is for reflect, replicate and circular pads (a constant pad's \
             grad is a slice)",
        ));
    }
    let want: Vec<u64> = input
        .iter()
        .zip(low.iter().zip(&high))
        .map(|(&n, (&l, &h))| (n as i64 + l + h).max(0) as u64)
        .collect();
    if e.dims(grad) != want {
        return Err(Error::invalid(format!(
            "grad {:?} must have the padded shape {want:?}",
            e.dims(grad)
        )));
    }
    let sources = pad_sources(mode, &input, &low, &high)?;
    let dt = e.dtype(grad);
    let Some(&(first, _)) = sources.first() else {
        return Ok(vec![grad]);
    };
    if input.contains(&0) {
        return Ok(vec![e.full(dt, &input, 0.0)?]);
    }
    // Flat positions over dims first.. of every output position there
    // (dims between padded ones map to themselves).
    let mut flat = vec![0i64];
    for (dim, &n) in input.iter().enumerate().skip(first) {
        let n = n as i64;
        let at: Vec<i64> = match sources.iter().find(|(d, _)| *d == dim) {
            Some((_, at)) => at.clone(),
            None => (0..n).collect(),
        };
        flat = flat
            .iter()
            .flat_map(|&f| at.iter().map(move |&p| f * n + p))
            .collect();
    }
    let rows: u64 = input[..first].iter().product();
    let ins: u64 = input[first..].iter().product();
    let outs = flat.len() as u64;
    let at = i64_vector(e, &flat)?;
    let at = e.broadcast_to(at, &[rows, outs])?;
    let g = e.reshape(grad, &[rows, outs])?;
    let zeros = e.full(dt, &[rows, ins], 0.0)?;
    let acc = scatter_add_rows(e, zeros, at, g)?;
    Ok(vec![e.reshape(acc, &input)?])
}

/// repeat(repeats): tile the input.
fn repeat(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let reps: Vec<u64> = a
        .ints("repeats")?
        .iter()
        .map(|&r| to_u64(r, "repeat"))
        .collect::<Result<_>>()?;
    let mut d = e.dims(x[0]);
    if reps.len() < d.len() {
        return Err(Error::invalid(
            "repeats must have at least as many entries as the input has dimensions",
        ));
    }
    while d.len() < reps.len() {
        d.insert(0, 1);
    }
    let v = e.reshape(x[0], &d)?;
    // [r0, d0, r1, d1, ...] broadcast, then merge each pair.
    let mut inter = Vec::new();
    let mut mapped = Vec::new();
    for (i, (&r, &n)) in reps.iter().zip(&d).enumerate() {
        inter.push(r);
        inter.push(n);
        mapped.push(2 * i + 1);
    }
    let b = e.op(
        Prim::BroadcastInDim {
            dims: inter,
            mapping: mapped,
        },
        &[v],
    )?;
    let out: Vec<u64> = reps.iter().zip(&d).map(|(r, n)| r * n).collect();
    Ok(vec![e.reshape(b, &out)?])
}

fn flip(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let rank = e.rank(x[0]);
    let dims = a
        .ints("dims")?
        .iter()
        .map(|&d| wrap_dim(d, rank))
        .collect::<Result<Vec<_>>>()?;
    if rank == 0 {
        return Ok(vec![x[0]]);
    }
    Ok(vec![e.op(Prim::Reverse { dimensions: dims }, &[x[0]])?])
}

/// tril/triu(diagonal): keep the lower (upper) triangle of the last two dims.
fn triangle(e: &mut Emitter, x: &[ValueId], a: &Attrs, lower: bool) -> Result<Vec<ValueId>> {
    let d = e.dims(x[0]);
    if d.len() < 2 {
        return Err(Error::invalid("needs at least 2 dimensions"));
    }
    let k = a.int_or("diagonal", 0)?;
    let (r, c) = (d[d.len() - 2], d[d.len() - 1]);
    let rows = iota(e, &[r, c], 0)?;
    let cols = iota(e, &[r, c], 1)?;
    let kk = e.full(DType::I64, &[r, c], k as f64)?;
    let rk = e.add(rows, kk)?;
    // lower: col <= row + k; upper: col >= row + k
    let keep = e.compare(if lower { CompareOp::Le } else { CompareOp::Ge }, cols, rk)?;
    let zero = e.full(e.dtype(x[0]), &[], 0.0)?;
    Ok(vec![e.select(keep, x[0], zero)?])
}
fn tril(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    triangle(e, x, a, true)
}
fn triu(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    triangle(e, x, a, false)
}

/// eye(n, m = n, dtype = f32): ones on the diagonal of an n × m matrix.
fn eye(e: &mut Emitter, _: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let n = a.int("n")?;
    let m = a.int_or("m", n)?;
    for (what, v) in [("n", n), ("m", m)] {
        if v < 0 {
            return Err(Error::invalid(format!(
                "{what} must be greater or equal to 0, got {v}"
            )));
        }
    }
    let dt = a.dtype_opt("dtype")?.unwrap_or(DType::F32);
    let dims = [n as u64, m as u64];
    let rows = iota(e, &dims, 0)?;
    let cols = iota(e, &dims, 1)?;
    let diag = e.compare(CompareOp::Eq, rows, cols)?;
    Ok(vec![e.convert(diag, dt)?])
}

fn tril_indices(e: &mut Emitter, _: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    triangle_indices(e, a, true)
}
fn triu_indices(e: &mut Emitter, _: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    triangle_indices(e, a, false)
}

/// tril_indices / triu_indices(row, col, offset = 0, dtype = i64): the
/// [2, N] (row, column) coordinates of a row × col matrix's lower triangle
/// (column ≤ row + offset) or upper one (column ≥ row + offset), in
/// row-major order, as torch's. No table is built: each output position k
/// finds its row in the graph. The triangle's rows are in three runs: rows
/// without elements, rows of the full width, and between them a trapezoid
/// whose widths step by one (up for the lower triangle, down for the upper),
/// where row d starts at d·p + s·d(d-1)/2 (p the first width, s the step):
/// the quadratic's root, taken in f32 and then corrected by whole steps in
/// i64, gives d exactly.
fn triangle_indices(e: &mut Emitter, a: &Attrs, lower: bool) -> Result<Vec<ValueId>> {
    let rows = a.int("row")?;
    let cols = a.int("col")?;
    let offset = a.int_or("offset", 0)?;
    for (what, v) in [("row", rows), ("col", cols)] {
        if v < 0 {
            return Err(Error::invalid(format!(
                "{what} must be non-negative, got {v}"
            )));
        }
    }
    let dt = a.dtype_opt("dtype")?.unwrap_or(DType::I64);
    if !matches!(dt, DType::I64 | DType::I32) {
        return Err(Error::invalid(format!(
            "dtype must be int64 or int32, got {dt}"
        )));
    }
    let (r, c, o) = (i128::from(rows), i128::from(cols), i128::from(offset));
    // (first trapezoid row, trapezoid rows, first width, step, full rows
    // before it, full rows after it)
    let (t0, tn, p, step, full_before, full_after) = if lower {
        let t0 = (-o).clamp(0, r);
        let t1 = (c - o - 1).clamp(t0, r);
        (t0, t1 - t0, t0 + o + 1, 1, 0, r - t1)
    } else {
        let f = (1 - o).clamp(0, r);
        let t1 = (c - o).clamp(f, r);
        (f, t1 - f, c - f - o, -1, f, 0)
    };
    let trapezoid = tn * p + step * tn * (tn - 1) / 2;
    let n = trapezoid + (full_before + full_after) * c;
    let n = u64::try_from(n)
        .ok()
        .filter(|&n| n < 1 << 40)
        .ok_or_else(|| Error::invalid(format!("{n} indices are too many")))?;
    let k = iota(e, &[n], 0)?;
    let width = c.max(1) as f64;
    // The trapezoid's positions, counted from its first element.
    let before = (full_before * c) as f64;
    let kt = e.binary_scalar(BinaryOp::Sub, k, before)?;
    let zero = e.scalar(DType::I64, 0.0)?;
    let kt_max = e.scalar(DType::I64, (trapezoid - 1).max(0) as f64)?;
    let kt = e.op(Prim::Clamp, &[zero, kt, kt_max])?;
    // d = (-h + sqrt(h² + 2 s k)) / s with h = p - s/2.
    let (pf, sf) = (p as f64, step as f64);
    let h = pf - sf / 2.0;
    let kf = e.convert(kt, DType::F32)?;
    let disc = e.binary_scalar(BinaryOp::Mul, kf, 2.0 * sf)?;
    let disc = e.binary_scalar(BinaryOp::Add, disc, h * h)?;
    let disc = e.binary_scalar(BinaryOp::Max, disc, 0.0)?;
    let root = e.unary(UnaryOp::Sqrt, disc)?;
    let d = e.binary_scalar(BinaryOp::Sub, root, h)?;
    let d = e.binary_scalar(BinaryOp::Mul, d, sf)?;
    let d = e.unary(UnaryOp::Floor, d)?;
    let d_max = e.scalar(DType::I64, (tn - 1).max(0) as f64)?;
    let clamp_d = |e: &mut Emitter, d: ValueId| e.op(Prim::Clamp, &[zero, d, d_max]);
    let d = e.convert(d, DType::I64)?;
    let mut d = clamp_d(e, d)?;
    let start = |e: &mut Emitter, d: ValueId| -> Result<ValueId> {
        // d·p + s·d(d-1)/2
        let dp = e.binary_scalar(BinaryOp::Mul, d, pf)?;
        let dm = e.binary_scalar(BinaryOp::Sub, d, 1.0)?;
        let tri = e.mul(d, dm)?;
        let tri = e.binary_scalar(BinaryOp::Div, tri, 2.0)?;
        let tri = e.binary_scalar(BinaryOp::Mul, tri, sf)?;
        e.add(dp, tri)
    };
    for _ in 0..2 {
        let up = e.binary_scalar(BinaryOp::Add, d, 1.0)?;
        let s_up = start(e, up)?;
        let fits = e.compare(CompareOp::Le, s_up, kt)?;
        let next = e.select(fits, up, d)?;
        d = clamp_d(e, next)?;
    }
    for _ in 0..2 {
        let s_d = start(e, d)?;
        let past = e.compare(CompareOp::Gt, s_d, kt)?;
        let down = e.binary_scalar(BinaryOp::Sub, d, 1.0)?;
        let next = e.select(past, down, d)?;
        d = clamp_d(e, next)?;
    }
    let trap_row = e.binary_scalar(BinaryOp::Add, d, t0 as f64)?;
    let s_d = start(e, d)?;
    let trap_col = e.sub(kt, s_d)?;
    let trap_col = if lower {
        trap_col
    } else {
        // Row t0 + d of the upper trapezoid starts at column row + offset.
        let first = e.binary_scalar(BinaryOp::Add, trap_row, o as f64)?;
        e.add(trap_col, first)?
    };
    // The full rows: before the trapezoid from row 0 (upper), after it
    // from row t0 + tn (lower).
    let (kf, first_full) = if lower {
        (
            e.binary_scalar(BinaryOp::Sub, k, trapezoid as f64)?,
            (t0 + tn) as f64,
        )
    } else {
        (k, 0.0)
    };
    let full_row = e.binary_scalar(BinaryOp::Div, kf, width)?;
    let full_row = e.binary_scalar(BinaryOp::Add, full_row, first_full)?;
    let full_col = e.binary_scalar(BinaryOp::Rem, kf, width)?;
    let in_full = if lower {
        e.compare_scalar(CompareOp::Ge, k, trapezoid as f64)?
    } else {
        e.compare_scalar(CompareOp::Lt, k, before)?
    };
    let row = e.select(in_full, full_row, trap_row)?;
    let col = e.select(in_full, full_col, trap_col)?;
    let row = e.reshape(row, &[1, n])?;
    let col = e.reshape(col, &[1, n])?;
    let rc = e.op(Prim::Concatenate { dimension: 0 }, &[row, col])?;
    Ok(vec![e.convert(rc, dt)?])
}

/// arange(start, end, step, dtype): no inputs.
fn arange(e: &mut Emitter, _: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let start = a.float_or("start", 0.0)?;
    let end = a.float("end")?;
    let step = a.float_or("step", 1.0)?;
    if step == 0.0 || !step.is_finite() {
        return Err(Error::invalid(format!(
            "step {step} must be nonzero and finite"
        )));
    }
    let n = ((end - start) / step).ceil().max(0.0) as u64;
    let all_int = [start, end, step].iter().all(|v| v.fract() == 0.0);
    let dt = a
        .dtype_opt("dtype")?
        .unwrap_or(if all_int { DType::I64 } else { DType::F32 });
    // Compute in f64 (or i64) then cast, so f32 output matches torch's values.
    let work = if dt.is_float() {
        DType::F64
    } else {
        DType::I64
    };
    let i = iota_of(e, work, &[n], 0)?;
    let st = e.full(work, &[n], step)?;
    let s0 = e.full(work, &[n], start)?;
    let v = e.mul(i, st)?;
    let v = e.add(v, s0)?;
    Ok(vec![e.convert(v, dt)?])
}

/// linspace(start, end, steps, dtype = f32): torch's two-sided form, the
/// first half start + step · i and the rest end - step · (steps - 1 - i),
/// so both ends are exact. step is (end - start) / (steps - 1) in the
/// dtype's compute type (f32 for f32, bf16 and f16; f64 for f64 and for
/// integer results, which truncate toward zero, as torch's).
fn linspace(e: &mut Emitter, _: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (v, dt) = linspace_in(e, a)?;
    Ok(vec![e.convert(v, dt)?])
}

/// logspace(start, end, steps, base = 10, dtype = f32): base raised to
/// linspace's values in its compute type (torch's kernel takes the same
/// two-sided exponents), rounded once to the dtype.
fn logspace(e: &mut Emitter, _: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let base = a.float_or("base", 10.0)?;
    let (v, dt) = linspace_in(e, a)?;
    let b = e.full_like(v, base)?;
    let p = e.binary(BinaryOp::Pow, b, v)?;
    Ok(vec![e.convert(p, dt)?])
}

/// linspace's values in its compute type, and the result dtype.
fn linspace_in(e: &mut Emitter, a: &Attrs) -> Result<(ValueId, DType)> {
    let start = a.float("start")?;
    let end = a.float("end")?;
    let steps = a.int("steps")?;
    if steps < 0 {
        return Err(Error::invalid(format!(
            "number of steps must be non-negative, got {steps}"
        )));
    }
    let dt = a.dtype_opt("dtype")?.unwrap_or(DType::F32);
    if dt == DType::Bool {
        return Err(Error::invalid("a bool result is not supported"));
    }
    let n = steps as u64;
    let ct = match dt {
        DType::F32 | DType::BF16 | DType::F16 => DType::F32,
        _ => DType::F64,
    };
    // The ends in the result's dtype (torch reads them as it), and the
    // step computed as the compute type rounds it.
    let in_dtype = |v: f64| match dt {
        DType::F32 => v as f32 as f64,
        DType::BF16 => half::bf16::from_f64(v).to_f64(),
        DType::F16 => half::f16::from_f64(v).to_f64(),
        DType::F64 => v,
        _ => v.trunc(),
    };
    let (start, end) = (in_dtype(start), in_dtype(end));
    let step = if steps > 1 {
        if ct == DType::F32 {
            ((end as f32 - start as f32) / (steps - 1) as f32) as f64
        } else {
            (end - start) / (steps - 1) as f64
        }
    } else {
        0.0
    };
    let i = iota_of(e, ct, &[n], 0)?;
    let st = e.full(ct, &[n], step)?;
    let lo = e.mul(st, i)?;
    let s0 = e.full(ct, &[n], start)?;
    let lo = e.add(s0, lo)?;
    let last = e.full(ct, &[n], (steps - 1).max(0) as f64)?;
    let back = e.sub(last, i)?;
    let hi = e.mul(st, back)?;
    let e0 = e.full(ct, &[n], end)?;
    let hi = e.sub(e0, hi)?;
    // One step is the start (torch fills it), where the split would give
    // the end.
    let split = if steps == 1 { 1 } else { steps / 2 };
    let half = e.full(ct, &[n], split as f64)?;
    let first = e.compare(CompareOp::Lt, i, half)?;
    Ok((e.select(first, lo, hi)?, dt))
}

/// full(size, value, dtype): no inputs.
fn full(e: &mut Emitter, _: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dims: Vec<u64> = a
        .ints("size")?
        .iter()
        .map(|&s| to_u64(s, "size"))
        .collect::<Result<_>>()?;
    let value = a.float_or("value", 0.0)?;
    let dt = a.dtype_opt("dtype")?.unwrap_or(DType::F32);
    Ok(vec![e.full(dt, &dims, value)?])
}

fn index_select(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let rank = e.rank(x[0]);
    let dim = wrap_dim(a.int_or("dim", 0)?, rank)?;
    if e.rank(x[1]) > 1 {
        return Err(Error::invalid("index must be 0-D or 1-D"));
    }
    if rank == 0 {
        let v = e.reshape(x[0], &[1])?;
        let r = e.op(Prim::Take { axis: 0 }, &[v, x[1]])?;
        let out = e.dims(x[1]);
        return Ok(vec![e.reshape(r, &out)?]);
    }
    Ok(vec![e.op(Prim::Take { axis: dim }, &[x[0], x[1]])?])
}

/// embedding(weight, indices): weight rows picked by indices of any rank.
fn embedding(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    if e.rank(x[0]) != 2 {
        return Err(Error::invalid(format!(
            "weight must be 2-D, got {:?}",
            e.dims(x[0])
        )));
    }
    Ok(vec![e.op(Prim::Take { axis: 0 }, &[x[0], x[1]])?])
}

fn gather(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dim = wrap_dim(a.int_or("dim", 0)?, e.rank(x[0]))?;
    Ok(vec![e.op(Prim::Gather { axis: dim }, &[x[0], x[1]])?])
}

/// scatter(x, index, src, dim, reduce=none|add|multiply|amax|amin)
fn scatter(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dim = wrap_dim(a.int_or("dim", 0)?, e.rank(x[0]))?;
    let combiner = match a.str_or("reduce", "none")? {
        "none" => ScatterCombiner::Replace,
        "add" | "sum" => ScatterCombiner::Add,
        "multiply" | "prod" => ScatterCombiner::Mul,
        "amax" => ScatterCombiner::Max,
        "amin" => ScatterCombiner::Min,
        other => {
            return Err(Error::invalid(format!(
                "reduce {other:?}; use none, add, multiply, amax or amin"
            )))
        }
    };
    let src = e.convert(x[2], e.dtype(x[0]))?;
    // src may be larger than index (torch uses its leading part).
    let idims = e.dims(x[1]);
    let src = if e.dims(src) != idims {
        let limit = idims.clone();
        e.op(
            Prim::Slice {
                start: vec![0; idims.len()],
                limit,
                stride: vec![1; idims.len()],
            },
            &[src],
        )?
    } else {
        src
    };
    Ok(vec![e.op(
        Prim::Scatter {
            axis: dim,
            combiner,
        },
        &[x[0], x[1], src],
    )?])
}
fn scatter_add(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    scatter(e, x, &a.clone().with("reduce", Attr::Str("add".into())))
}

/// scatter_reduce(x, index, src; dim, reduce = sum|prod|mean|amax|amin,
/// include_self = true): torch.scatter_reduce. Each position of x that
/// index names along `dim` combines the src values sent there, and x's
/// own value with include_self; without it x's value is left out there
/// (positions no index names keep it either way). mean divides by the
/// number of values combined, rounding down for integers. src has x's
/// dtype and may be larger than index (its leading part is read).
fn scatter_reduce(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let reduce = a.str_or("reduce", "sum")?.to_string();
    let combiner = match reduce.as_str() {
        "sum" | "mean" => ScatterCombiner::Add,
        "prod" => ScatterCombiner::Mul,
        "amax" => ScatterCombiner::Max,
        "amin" => ScatterCombiner::Min,
        other => {
            return Err(Error::invalid(format!(
                "reduce argument must be either sum, prod, mean, amax or amin, got {other}"
            )))
        }
    };
    let include_self = a.bool_or("include_self", true)?;
    let dt = e.dtype(x[0]);
    if e.dtype(x[2]) != dt {
        return Err(Error::invalid(format!(
            "expected src of self's dtype {dt}, got {}",
            e.dtype(x[2])
        )));
    }
    let dim_attr = Attrs::new().with("dim", Attr::Int(a.int_or("dim", 0)?));
    let with = |r: &str| dim_attr.clone().with("reduce", Attr::Str(r.into()));
    // How many src values each position receives.
    let none = e.full(DType::I32, &e.dims(x[0]), 0.0)?;
    let ones = e.full(DType::I32, &e.dims(x[1]), 1.0)?;
    let count = scatter(e, &[none, x[1], ones], &with("add"))?[0];
    let hit = e.compare_scalar(CompareOp::Gt, count, 0.0)?;
    let base = if include_self {
        x[0]
    } else {
        // Where hit, a value that leaves the combination to src alone: 0
        // for a sum, 1 for a product, any src value sent there for max and
        // min.
        let start = match combiner {
            ScatterCombiner::Add => e.full_like(x[0], 0.0)?,
            ScatterCombiner::Mul => e.full_like(x[0], 1.0)?,
            _ => scatter(e, &[x[0], x[1], x[2]], &with("none"))?[0],
        };
        e.select(hit, start, x[0])?
    };
    let r = scatter(
        e,
        &[base, x[1], x[2]],
        &with(&reduce.replace("mean", "add")),
    )?[0];
    if reduce != "mean" {
        return Ok(vec![r]);
    }
    let count = e.convert(count, dt)?;
    let count = if include_self {
        e.binary_scalar(BinaryOp::Add, count, 1.0)?
    } else {
        let one = e.full_like(count, 1.0)?;
        e.select(hit, count, one)?
    };
    let mode = if dt.is_float() { "none" } else { "floor" };
    let q = super::pointwise::div(
        e,
        &[r, count],
        &Attrs::new().with("rounding_mode", Attr::Str(mode.into())),
    )?;
    Ok(vec![e.convert(q[0], dt)?])
}

pub(super) const OPS: &[OpDef] = &[
    def!("reshape", Arity::Exactly(1), reshape),
    def!("flatten", Arity::Exactly(1), flatten),
    def!("permute", Arity::Exactly(1), permute),
    def!("transpose", Arity::Exactly(1), transpose),
    def!("expand", Arity::Exactly(1), expand),
    def!("squeeze", Arity::Exactly(1), squeeze),
    def!("unsqueeze", Arity::Exactly(1), unsqueeze),
    def!("cat", Arity::AtLeast(1), cat),
    def!("stack", Arity::AtLeast(1), stack),
    def!("slice", Arity::Exactly(1), slice),
    def!("narrow", Arity::Exactly(1), narrow),
    def!("split", Arity::Exactly(1), split),
    def!("pad", Arity::Exactly(1), pad),
    def!("pad_backward", Arity::Exactly(1), pad_backward),
    def!("repeat", Arity::Exactly(1), repeat),
    def!("flip", Arity::Exactly(1), flip),
    def!("tril", Arity::Exactly(1), tril),
    def!("triu", Arity::Exactly(1), triu),
    def!("arange", Arity::Exactly(0), arange),
    def!("eye", Arity::Exactly(0), eye),
    def!("tril_indices", Arity::Exactly(0), tril_indices),
    def!("triu_indices", Arity::Exactly(0), triu_indices),
    def!("linspace", Arity::Exactly(0), linspace),
    def!("logspace", Arity::Exactly(0), logspace),
    def!("full", Arity::Exactly(0), full),
    def!("index_select", Arity::Exactly(2), index_select),
    def!("embedding", Arity::Exactly(2), embedding),
    def!("gather", Arity::Exactly(2), gather),
    def!("scatter", Arity::Exactly(3), scatter),
    def!("scatter_add", Arity::Exactly(3), scatter_add),
    def!("scatter_reduce", Arity::Exactly(3), scatter_reduce),
];
