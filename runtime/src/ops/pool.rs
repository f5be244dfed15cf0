//! Pooling over 1, 2 or 3 spatial dims, forward and backward, from slices,
//! selects, pads and scatters: max pooling (aten's max_pool{1,2,3}d and
//! their `_with_indices` forms), average pooling (avg_pool{1,2,3}d),
//! adaptive average and max pooling (adaptive_{avg,max}_pool{1,2,3}d), and
//! the sliding blocks of F.unfold and F.fold (im2col, col2im), and max
//! unpooling (max_unpool{2,3}d) from max pooling's indices.
//!
//! The window at output position o along a spatial dim starts at
//! `o * stride - padding` and takes `kernel` elements `dilation` apart;
//! positions in the padding take no part. As torch's kernels do, a max
//! pooling window keeps its first element, then an element replaces the
//! maximum when it is greater or NaN (so NaN propagates, and the index is
//! the first maximum's, or the last NaN's). The index is the element's flat
//! position in the input's spatial dims.
//!
//! Averages add a window's elements in torch's order (last spatial dim
//! fastest) at f32 for bf16 and f16 (f64 stays f64) and divide once, as
//! torch's CPU kernels do, so f32 results are torch's bit for bit; their
//! backward adds each output's share into the input in output order,
//! rounding every sum to the dtype as torch does.

use super::attrs::{Attr, Attrs};
use super::emit::Emitter;
use super::support::{
    float_compute_dtype, i64_vector, iota, scatter_add_rows, sizes_attr, spatial_list,
    spatial_output_size,
};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, Prim, ScatterCombiner, UnaryOp, ValueId};

/// The pooling's shape: per spatial dim, input and output sizes, kernel,
/// stride, padding and dilation.
struct Window {
    lead: Vec<u64>,
    input: Vec<u64>,
    output: Vec<u64>,
    kernel: Vec<u64>,
    stride: Vec<u64>,
    padding: Vec<u64>,
    dilation: Vec<u64>,
}

impl Window {
    fn of(dims: &[u64], a: &Attrs) -> Result<Self> {
        // The spatial dims: `spatial_dims`, or one per kernel_size entry.
        let given = a.ints("kernel_size")?.len() as i64;
        let n = a.int_or("spatial_dims", given)?;
        if !(1..=3).contains(&n) {
            return Err(Error::invalid(format!(
                "pooling is over 1, 2 or 3 spatial dims, got {n}"
            )));
        }
        let n = n as usize;
        let kernel = spatial_list(a, "kernel_size", n, 0)?;
        if dims.len() != n + 1 && dims.len() != n + 2 {
            return Err(Error::invalid(format!(
                "input {dims:?} must be {}-D or {}-D for a kernel of {n} dims",
                n + 1,
                n + 2
            )));
        }
        let stride = match a.ints_opt("stride")? {
            Some(s) if !s.is_empty() => spatial_list(a, "stride", n, 1)?,
            _ => kernel.clone(),
        };
        let padding = spatial_list(a, "padding", n, 0)?;
        let dilation = spatial_list(a, "dilation", n, 1)?;
        let ceil = a.bool_or("ceil_mode", false)?;
        if kernel.contains(&0) || stride.contains(&0) || dilation.contains(&0) {
            return Err(Error::invalid(format!(
                "kernel_size {kernel:?}, stride {stride:?} and dilation {dilation:?} must be positive"
            )));
        }
        let (lead, input) = dims.split_at(dims.len() - n);
        let mut output = Vec::with_capacity(n);
        for d in 0..n {
            let (i, k, s, p, dl) = (input[d], kernel[d], stride[d], padding[d], dilation[d]);
            let span = dl * (k - 1) + 1;
            if 2 * p > span {
                return Err(Error::invalid(format!(
                    "padding {padding:?} must be at most half of the effective kernel size \
                     ({span} along spatial dim {d})"
                )));
            }
            let room = (i + 2 * p) as i64 - span as i64;
            let mut o = if ceil {
                room.div_euclid(s as i64) + (room.rem_euclid(s as i64) != 0) as i64 + 1
            } else {
                room.div_euclid(s as i64) + 1
            };
            // A last window that would start in the right padding is dropped.
            if ceil && o > 0 && ((o - 1) * s as i64) >= (i + p) as i64 {
                o -= 1;
            }
            if o < 1 {
                return Err(Error::invalid(format!(
                    "input {dims:?} is too small for kernel_size {kernel:?} with padding \
                     {padding:?} and dilation {dilation:?}: output size along spatial dim {d} \
                     would be {o}"
                )));
            }
            output.push(o as u64);
        }
        Ok(Window {
            lead: lead.to_vec(),
            input: input.to_vec(),
            output,
            kernel,
            stride,
            padding,
            dilation,
        })
    }

    fn out_dims(&self) -> Vec<u64> {
        self.lead.iter().chain(&self.output).copied().collect()
    }

    fn in_dims(&self) -> Vec<u64> {
        self.lead.iter().chain(&self.input).copied().collect()
    }

    /// The kernel offset of window element `flat`, last spatial dim fastest.
    fn offset(&self, flat: u64) -> Vec<u64> {
        let mut rest = flat;
        let mut offset = vec![0u64; self.kernel.len()];
        for d in (0..self.kernel.len()).rev() {
            offset[d] = rest % self.kernel[d];
            rest /= self.kernel[d];
        }
        offset
    }

    /// Per spatial dim, each output position's first input position (i64
    /// over the output's spatial dims; negative in the padding).
    fn starts(&self, e: &mut Emitter) -> Result<Vec<ValueId>> {
        (0..self.kernel.len())
            .map(|d| {
                let i = iota(e, &self.output, d)?;
                let s = e.binary_scalar(BinaryOp::Mul, i, self.stride[d] as f64)?;
                e.binary_scalar(BinaryOp::Sub, s, self.padding[d] as f64)
            })
            .collect()
    }

    /// `v` padded by `padding` in front and by enough of `value` behind
    /// for every window's slice to lie in range.
    fn padded(&self, e: &mut Emitter, v: ValueId, value: f64) -> Result<ValueId> {
        let lead = self.lead.len();
        let mut low = vec![0i64; lead];
        let mut high = vec![0i64; lead];
        for d in 0..self.kernel.len() {
            let reach =
                (self.output[d] - 1) * self.stride[d] + self.dilation[d] * (self.kernel[d] - 1) + 1;
            low.push(self.padding[d] as i64);
            high.push(reach.saturating_sub(self.input[d] + self.padding[d]) as i64);
        }
        let fill = e.scalar(e.dtype(v), value)?;
        e.op(
            Prim::Pad {
                low,
                high,
                interior: vec![0; lead + self.kernel.len()],
            },
            &[v, fill],
        )
    }

    /// Window element `offset` of every window: a strided slice of
    /// `padded` (see `padded`) of the pooled shape.
    fn slice(&self, e: &mut Emitter, padded: ValueId, offset: &[u64]) -> Result<ValueId> {
        let lead = self.lead.len();
        let mut start = vec![0u64; lead];
        let mut limit = self.lead.clone();
        let mut stride = vec![1u64; lead];
        for (d, &off) in offset.iter().enumerate() {
            let s = off * self.dilation[d];
            start.push(s);
            limit.push(s + (self.output[d] - 1) * self.stride[d] + 1);
            stride.push(self.stride[d]);
        }
        e.op(
            Prim::Slice {
                start,
                limit,
                stride,
            },
            &[padded],
        )
    }

    /// `g`, of the pooled shape, spread back over the input at window
    /// element `offset` of every window: each value where that element
    /// lies (a pad with stride - 1 zeros between values, cropped to the
    /// input), zeros elsewhere.
    fn place(&self, e: &mut Emitter, g: ValueId, offset: &[u64]) -> Result<ValueId> {
        let lead = self.lead.len();
        let mut low = vec![0i64; lead];
        let mut high = vec![0i64; lead];
        let mut interior = vec![0u64; lead];
        for (d, &off) in offset.iter().enumerate() {
            let first = (off * self.dilation[d]) as i64 - self.padding[d] as i64;
            let span = ((self.output[d] - 1) * self.stride[d] + 1) as i64;
            low.push(first);
            high.push(self.input[d] as i64 - first - span);
            interior.push(self.stride[d] - 1);
        }
        let zero = e.scalar(e.dtype(g), 0.0)?;
        e.op(
            Prim::Pad {
                low,
                high,
                interior,
            },
            &[g, zero],
        )
    }

    /// For window element `offset`, over the pooled shape: whether it lies
    /// inside the input (bool), and its flat input position (i64).
    fn positions(
        &self,
        e: &mut Emitter,
        starts: &[ValueId],
        offset: &[u64],
    ) -> Result<(ValueId, ValueId)> {
        let mut valid: Option<ValueId> = None;
        let mut index: Option<ValueId> = None;
        for d in 0..self.kernel.len() {
            let step = (offset[d] * self.dilation[d]) as f64;
            let pos = e.binary_scalar(BinaryOp::Add, starts[d], step)?;
            let lo = e.full(DType::I64, &self.output, 0.0)?;
            let hi = e.full(DType::I64, &self.output, self.input[d] as f64)?;
            let ge = e.compare(CompareOp::Ge, pos, lo)?;
            let lt = e.compare(CompareOp::Lt, pos, hi)?;
            let inside = e.binary(BinaryOp::And, ge, lt)?;
            valid = Some(match valid {
                None => inside,
                Some(v) => e.binary(BinaryOp::And, v, inside)?,
            });
            index = Some(match index {
                None => pos,
                Some(i) => {
                    let scaled = e.binary_scalar(BinaryOp::Mul, i, self.input[d] as f64)?;
                    e.add(scaled, pos)?
                }
            });
        }
        let out_dims = self.out_dims();
        Ok((
            e.broadcast_to(valid.expect("1 to 3 dims"), &out_dims)?,
            e.broadcast_to(index.expect("1 to 3 dims"), &out_dims)?,
        ))
    }
}

/// max_pool(x; kernel_size, stride = kernel_size, padding = 0,
/// dilation = 1, ceil_mode = false, spatial_dims = kernel_size's length)
/// -> (values, i64 indices). The last `spatial_dims` (1 to 3) dims of x are
/// spatial, and x has one or two more (channels, or batch and channels);
/// a list attribute of one entry applies to every spatial dim.
fn max_pool(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let v = x[0];
    let dt = e.dtype(v);
    if dt == DType::Bool {
        return Err(Error::invalid(
            "max pooling of bool tensors is not supported",
        ));
    }
    let w = Window::of(&e.dims(v), a)?;
    let out_dims = w.out_dims();
    if out_dims.contains(&0) {
        return Ok(vec![
            e.full(dt, &out_dims, 0.0)?,
            e.full(DType::I64, &out_dims, 0.0)?,
        ]);
    }
    let padded = w.padded(e, v, 0.0)?;
    let starts = w.starts(e)?;
    let mut best: Option<(ValueId, ValueId, ValueId)> = None;
    for flat in 0..w.kernel.iter().product::<u64>() {
        let offset = w.offset(flat);
        let val = w.slice(e, padded, &offset)?;
        let (valid, index) = w.positions(e, &starts, &offset)?;
        best = Some(match best {
            // The first slice's padded positions are replaced by the
            // window's first real element (`seen` false there).
            None => (val, index, valid),
            Some((bv, bi, seen)) => {
                let greater = e.compare(CompareOp::Gt, val, bv)?;
                let nan = if dt.is_float() {
                    let finite_or_inf = e.compare(CompareOp::Eq, val, val)?;
                    e.unary(UnaryOp::Not, finite_or_inf)?
                } else {
                    e.full(DType::Bool, &out_dims, 0.0)?
                };
                let unseen = e.unary(UnaryOp::Not, seen)?;
                let better = e.binary(BinaryOp::Or, greater, nan)?;
                let better = e.binary(BinaryOp::Or, better, unseen)?;
                let take = e.binary(BinaryOp::And, valid, better)?;
                (
                    e.select(take, val, bv)?,
                    e.select(take, index, bi)?,
                    e.binary(BinaryOp::Or, seen, valid)?,
                )
            }
        });
    }
    let (values, indices, _) = best.expect("a kernel has at least one element");
    Ok(vec![values, indices])
}

/// max_pool_backward(grad, self, indices; the forward's attributes) ->
/// zeros of self's shape with each grad element added at its index.
fn max_pool_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (grad, input, indices) = (x[0], x[1], x[2]);
    let w = Window::of(&e.dims(input), a)?;
    let out_dims = w.out_dims();
    for (what, v) in [("grad", grad), ("indices", indices)] {
        if e.dims(v) != out_dims {
            return Err(Error::invalid(format!(
                "{what} {:?} must have the pooled shape {out_dims:?}",
                e.dims(v)
            )));
        }
    }
    if !e.dtype(indices).is_integer() {
        return Err(Error::invalid(format!(
            "indices must be an integer tensor, got {:?}",
            e.dtype(indices)
        )));
    }
    let rows: u64 = w.lead.iter().product();
    let (o, i): (u64, u64) = (w.output.iter().product(), w.input.iter().product());
    let dt = e.dtype(grad);
    if rows * o * i == 0 {
        return Ok(vec![e.full(dt, &e.dims(input), 0.0)?]);
    }
    let idx = e.convert(indices, DType::I64)?;
    if matches!(dt, DType::BF16 | DType::F16) {
        return Ok(vec![overlapping_half_grads(e, &w, grad, idx)?]);
    }
    Ok(vec![add_at_indices(
        e,
        grad,
        idx,
        (rows, o, i),
        &e.dims(input),
    )?])
}

/// Zeros of `in_dims` with each element of `grad` (`rows` x `o`) added at
/// its i64 index in its row's `i` elements.
fn add_at_indices(
    e: &mut Emitter,
    grad: ValueId,
    idx: ValueId,
    (rows, o, i): (u64, u64, u64),
    in_dims: &[u64],
) -> Result<ValueId> {
    let g = e.reshape(grad, &[rows, o])?;
    let idx = e.reshape(idx, &[rows, o])?;
    let zeros = e.full(e.dtype(grad), &[rows, i], 0.0)?;
    let r = scatter_add_rows(e, zeros, idx, g)?;
    e.reshape(r, in_dims)
}

/// The backward in bf16 or f16, where overlapping windows add several
/// grads into one element: torch's CPU kernel adds them in output order,
/// rounding each sum to the dtype (the scatter primitive sums at f32 and
/// rounds once on the host, which differed in about one element in 400 of
/// a 3x3, stride 2 pooling). So per window element, last first (which
/// visits each input element's outputs in ascending order), the grads
/// whose index is that element are spread back over the input (a pad
/// with stride - 1 zeros between them, cropped to the input) and added.
fn overlapping_half_grads(
    e: &mut Emitter,
    w: &Window,
    grad: ValueId,
    idx: ValueId,
) -> Result<ValueId> {
    let out_dims = w.out_dims();
    let dt = e.dtype(grad);
    let starts = w.starts(e)?;
    let mut acc = e.full(dt, &w.in_dims(), 0.0)?;
    for flat in (0..w.kernel.iter().product::<u64>()).rev() {
        let offset = w.offset(flat);
        let (valid, index) = w.positions(e, &starts, &offset)?;
        let mine = e.compare(CompareOp::Eq, idx, index)?;
        let hit = e.binary(BinaryOp::And, valid, mine)?;
        let zeros = e.full(dt, &out_dims, 0.0)?;
        let g = e.select(hit, grad, zeros)?;
        let placed = w.place(e, g, &offset)?;
        acc = e.add(acc, placed)?;
    }
    Ok(acc)
}

/// The float dtype an average is computed in (f32 for bf16 and f16), or an
/// An average pooling's windows (as max pooling's, without dilation).
fn average_window(dims: &[u64], a: &Attrs) -> Result<Window> {
    if let Some(d) = a.ints_opt("dilation")? {
        if d.iter().any(|&v| v != 1) {
            return Err(Error::invalid(format!(
                "average pooling takes no dilation, got {d:?}"
            )));
        }
    }
    Window::of(dims, a)
}

/// `per_output`, one value per output position along spatial dim `d` of
/// `n`, as `dtype` broadcast to `out_dims` (the pooled shape).
fn along(
    e: &mut Emitter,
    per_output: &[i64],
    d: usize,
    n: usize,
    out_dims: &[u64],
    dtype: DType,
) -> Result<ValueId> {
    let v = i64_vector(e, per_output)?;
    let mut dims = vec![per_output.len() as u64];
    dims.extend(std::iter::repeat_n(1, n - d - 1));
    let v = e.reshape(v, &dims)?;
    let v = e.convert(v, dtype)?;
    e.broadcast_to(v, out_dims)
}

/// Average pooling's divisor of every output, as `dtype` over the pooled
/// shape, and (when some window lies wholly in the padding, possible with
/// ceil_mode) where a window has no input element: torch's CPU kernel
/// divides a window's sum by `divisor_override`, else by its size clipped
/// to the padded input (count_include_pad) or to the input.
fn average_divisor(
    e: &mut Emitter,
    w: &Window,
    a: &Attrs,
    dtype: DType,
) -> Result<(ValueId, Option<ValueId>)> {
    let n = w.kernel.len();
    let out_dims = w.out_dims();
    let include_pad = a.bool_or("count_include_pad", true)?;
    let divisor_override = a.int_opt("divisor_override")?;
    if divisor_override == Some(0) {
        return Err(Error::invalid("divisor_override must not be zero"));
    }
    let mut divisor: Option<ValueId> = None;
    let mut empty: Option<ValueId> = None;
    for d in 0..n {
        let (i, k, s, p) = (
            w.input[d] as i64,
            w.kernel[d] as i64,
            w.stride[d] as i64,
            w.padding[d] as i64,
        );
        let (mut sizes, mut counts) = (Vec::new(), Vec::new());
        for o in 0..w.output[d] as i64 {
            let start = o * s - p;
            let end = (start + k).min(i + p);
            sizes.push(end - start);
            counts.push((end.min(i) - start.max(0)).max(0));
        }
        if counts.contains(&0) {
            let c = along(e, &counts, d, n, &out_dims, DType::I64)?;
            let zero = e.full(DType::I64, &out_dims, 0.0)?;
            let none = e.compare(CompareOp::Eq, c, zero)?;
            empty = Some(match empty {
                None => none,
                Some(m) => e.binary(BinaryOp::Or, m, none)?,
            });
        }
        if divisor_override.is_none() {
            let f = along(
                e,
                if include_pad { &sizes } else { &counts },
                d,
                n,
                &out_dims,
                DType::I64,
            )?;
            divisor = Some(match divisor {
                None => f,
                Some(v) => e.mul(v, f)?,
            });
        }
    }
    let divisor = match (divisor_override, divisor) {
        (Some(v), _) => e.full(dtype, &out_dims, v as f64)?,
        (None, Some(v)) => e.convert(v, dtype)?,
        (None, None) => return Err(Error::Internal("a pooling without spatial dims".into())),
    };
    Ok((divisor, empty))
}

/// avg_pool(x; kernel_size, stride = kernel_size, padding = 0,
/// ceil_mode = false, count_include_pad = true, divisor_override = none,
/// spatial_dims = kernel_size's length) -> the windows' averages. Shapes
/// and list attributes as max_pool's (no dilation).
fn avg_pool(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let v = x[0];
    let dt = e.dtype(v);
    let cd = float_compute_dtype(e, v, "average pooling")?;
    let w = average_window(&e.dims(v), a)?;
    let out_dims = w.out_dims();
    if out_dims.contains(&0) {
        return Ok(vec![e.full(dt, &out_dims, 0.0)?]);
    }
    let (divisor, empty) = average_divisor(e, &w, a, cd)?;
    let xs = e.convert(v, cd)?;
    let padded = w.padded(e, xs, 0.0)?;
    // Padded positions add zeros, which leaves torch's sums as they are.
    let mut sum: Option<ValueId> = None;
    for flat in 0..w.kernel.iter().product::<u64>() {
        let val = w.slice(e, padded, &w.offset(flat))?;
        sum = Some(match sum {
            None => val,
            Some(acc) => e.add(acc, val)?,
        });
    }
    let mut avg = e.div(sum.expect("a kernel has at least one element"), divisor)?;
    if let Some(empty) = empty {
        let zeros = e.full(cd, &out_dims, 0.0)?;
        avg = e.select(empty, zeros, avg)?;
    }
    Ok(vec![e.convert(avg, dt)?])
}

/// grad and the pooled shape must agree.
fn check_grad(e: &Emitter, grad: ValueId, out_dims: &[u64]) -> Result<()> {
    if e.dims(grad) != out_dims {
        return Err(Error::invalid(format!(
            "grad {:?} must have the pooled shape {out_dims:?}",
            e.dims(grad)
        )));
    }
    Ok(())
}

/// avg_pool_backward(grad, self; the forward's attributes) -> each
/// output's grad over its divisor (rounded to the dtype, as torch's),
/// added into every input element of its window in output order.
fn avg_pool_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (grad, input) = (x[0], x[1]);
    let dt = e.dtype(grad);
    let cd = float_compute_dtype(e, grad, "average pooling")?;
    let w = average_window(&e.dims(input), a)?;
    let out_dims = w.out_dims();
    check_grad(e, grad, &out_dims)?;
    if out_dims.contains(&0) || w.input.contains(&0) {
        return Ok(vec![e.full(dt, &w.in_dims(), 0.0)?]);
    }
    // A window with no input element places nothing (its positions are
    // all cropped), whatever its divisor.
    let (divisor, _) = average_divisor(e, &w, a, cd)?;
    let g = e.convert(grad, cd)?;
    let share = e.div(g, divisor)?;
    let share = e.convert(share, dt)?;
    Ok(vec![spread(e, &w, share)?])
}

/// `share` (pooled shape) added into every element of each window, last
/// window element first: an input element's windows then come in output
/// order, the order torch's kernels add them in (each sum rounded to the
/// dtype).
fn spread(e: &mut Emitter, w: &Window, share: ValueId) -> Result<ValueId> {
    let mut acc = e.full(e.dtype(share), &w.in_dims(), 0.0)?;
    for flat in (0..w.kernel.iter().product::<u64>()).rev() {
        let placed = w.place(e, share, &w.offset(flat))?;
        acc = e.add(acc, placed)?;
    }
    Ok(acc)
}

/// Adaptive pooling's windows along one spatial dim: output o averages
/// input positions [floor(o * I / O), ceil((o + 1) * I / O)).
struct Bins {
    input: u64,
    starts: Vec<i64>,
    sizes: Vec<i64>,
}

impl Bins {
    fn new(input: u64, output: u64) -> Self {
        let (i, o) = (input as i64, output as i64);
        let starts: Vec<i64> = (0..o).map(|k| k * i / o).collect();
        let sizes = (0..o)
            .map(|k| ((k + 1) * i + o - 1) / o - starts[k as usize])
            .collect();
        Bins {
            input,
            starts,
            sizes,
        }
    }

    /// Bins of one size, one after another (input a multiple of output).
    fn even(&self) -> bool {
        self.input.is_multiple_of(self.starts.len() as u64)
    }

    fn widest(&self) -> i64 {
        self.sizes.iter().copied().max().unwrap_or(0)
    }
}

/// The adaptive pooling's shape from `output_size` (1 to 3 entries, the
/// spatial dims): the leading dims and each spatial dim's bins.
fn adaptive_bins(dims: &[u64], a: &Attrs) -> Result<(Vec<u64>, Vec<Bins>)> {
    let (lead, input, output) = spatial_output_size(dims, a, "adaptive pooling")?;
    let bins = input
        .iter()
        .zip(output)
        .map(|(&i, o)| Bins::new(i, o))
        .collect();
    Ok((lead, bins))
}

/// The pooled shape: leading dims, then each dim's bin count.
fn bins_shape(lead: &[u64], bins: &[Bins]) -> Vec<u64> {
    lead.iter()
        .copied()
        .chain(bins.iter().map(|b| b.starts.len() as u64))
        .collect()
}

/// Even bins as a window (kernel = stride = input / output, no padding).
fn even_window(lead: &[u64], bins: &[Bins]) -> Window {
    let kernel: Vec<u64> = bins.iter().map(|b| b.sizes[0] as u64).collect();
    Window {
        lead: lead.to_vec(),
        input: bins.iter().map(|b| b.input).collect(),
        output: bins.iter().map(|b| b.starts.len() as u64).collect(),
        stride: kernel.clone(),
        padding: vec![0; bins.len()],
        dilation: vec![1; bins.len()],
        kernel,
    }
}

/// `v` divided by each spatial dim's bin sizes in turn (torch divides a
/// bin's sum by its height, then its width, ...).
fn divide_by_sizes(e: &mut Emitter, mut v: ValueId, bins: &[Bins]) -> Result<ValueId> {
    let out_dims = e.dims(v);
    let dt = e.dtype(v);
    for (d, b) in bins.iter().enumerate() {
        let size = along(e, &b.sizes, d, bins.len(), &out_dims, dt)?;
        v = e.div(v, size)?;
    }
    Ok(v)
}

/// Element `j` of every bin along spatial dim `d` (axis `axis` of `v`):
/// a strided slice for even bins, else a gather (positions past a bin's
/// end read its last element; `adaptive_avg_pool` masks them).
fn bin_element(e: &mut Emitter, v: ValueId, axis: usize, b: &Bins, j: i64) -> Result<ValueId> {
    let dims = e.dims(v);
    if b.even() {
        let step = b.sizes[0] as u64;
        let mut start = vec![0u64; dims.len()];
        let mut stride = vec![1u64; dims.len()];
        let mut limit = dims.clone();
        start[axis] = j as u64;
        stride[axis] = step;
        limit[axis] = j as u64 + (b.starts.len() as u64 - 1) * step + 1;
        return e.op(
            Prim::Slice {
                start,
                limit,
                stride,
            },
            &[v],
        );
    }
    let at: Vec<i64> = b
        .starts
        .iter()
        .map(|&s| (s + j).min(b.input as i64 - 1))
        .collect();
    let at = i64_vector(e, &at)?;
    e.op(Prim::Take { axis }, &[v, at])
}

/// Where element `j` lies inside its bin along spatial dim `d`, over the
/// pooled shape; none when it does in every bin.
fn inside_bins(
    e: &mut Emitter,
    bins: &[Bins],
    j: &[i64],
    out_dims: &[u64],
) -> Result<Option<ValueId>> {
    let mut inside: Option<ValueId> = None;
    for (d, b) in bins.iter().enumerate() {
        if b.sizes.iter().all(|&s| j[d] < s) {
            continue;
        }
        let size = along(e, &b.sizes, d, bins.len(), out_dims, DType::I64)?;
        let jd = e.full(DType::I64, out_dims, j[d] as f64)?;
        let m = e.compare(CompareOp::Lt, jd, size)?;
        inside = Some(match inside {
            None => m,
            Some(p) => e.binary(BinaryOp::And, p, m)?,
        });
    }
    Ok(inside)
}

/// Every offset within the widest bins, last spatial dim fastest.
fn bin_offsets(bins: &[Bins]) -> Vec<Vec<i64>> {
    let mut all = vec![vec![]];
    for b in bins {
        all = all
            .into_iter()
            .flat_map(|p: Vec<i64>| {
                (0..b.widest()).map(move |j| {
                    let mut q = p.clone();
                    q.push(j);
                    q
                })
            })
            .collect();
    }
    all
}

/// adaptive_avg_pool(x; output_size) -> each bin's average: the last
/// `output_size.len()` (1 to 3) dims of x are spatial, with one or two
/// more before them; output o along a dim averages input positions
/// [floor(o * I / O), ceil((o + 1) * I / O)), as torch's kernels.
fn adaptive_avg_pool(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let v = x[0];
    let dt = e.dtype(v);
    let cd = float_compute_dtype(e, v, "average pooling")?;
    let (lead, bins) = adaptive_bins(&e.dims(v), a)?;
    let out_dims = bins_shape(&lead, &bins);
    if out_dims.contains(&0) {
        return Ok(vec![e.full(dt, &out_dims, 0.0)?]);
    }
    let xs = e.convert(v, cd)?;
    let first = lead.len();
    let mut sum: Option<ValueId> = None;
    // Element (j0, j1, ...) of every bin, in torch's order; an element past
    // a bin's end adds zero.
    for j in bin_offsets(&bins) {
        let mut val = xs;
        for (d, b) in bins.iter().enumerate() {
            val = bin_element(e, val, first + d, b, j[d])?;
        }
        if let Some(inside) = inside_bins(e, &bins, &j, &out_dims)? {
            let zeros = e.full(cd, &out_dims, 0.0)?;
            val = e.select(inside, val, zeros)?;
        }
        sum = Some(match sum {
            None => val,
            Some(acc) => e.add(acc, val)?,
        });
    }
    let avg = divide_by_sizes(e, sum.expect("every bin has an element"), &bins)?;
    Ok(vec![e.convert(avg, dt)?])
}

/// adaptive_avg_pool_backward(grad, self) -> each output's grad over its
/// bin's sizes (divided in the dtype one dim at a time, as torch's),
/// added into every input element of its bin in output order.
fn adaptive_avg_pool_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (grad, input) = (x[0], x[1]);
    let dt = e.dtype(grad);
    float_compute_dtype(e, grad, "average pooling")?;
    let in_dims = e.dims(input);
    let given = e.dims(grad);
    // The spatial dims: `spatial_dims`, or output_size's length.
    let spatial = match (a.int_opt("spatial_dims")?, a.ints_opt("output_size")?) {
        (Some(n), _) => n,
        (None, Some(o)) => o.len() as i64,
        (None, None) => {
            return Err(Error::invalid(
                "attribute spatial_dims (int) or output_size (ints) is required",
            ))
        }
    };
    if !(1..=3).contains(&spatial)
        || given.len() != in_dims.len()
        || given.len() <= spatial as usize
    {
        return Err(Error::invalid(format!(
            "grad {given:?} and input {in_dims:?} must have one rank, with 1 to 3 spatial dims \
             after one or two others (spatial_dims {spatial})"
        )));
    }
    let out_size = given[given.len() - spatial as usize..]
        .iter()
        .map(|&o| o as i64)
        .collect();
    let attrs = Attrs::new().with("output_size", Attr::Ints(out_size));
    let (lead, bins) = adaptive_bins(&in_dims, &attrs)?;
    let out_dims = bins_shape(&lead, &bins);
    check_grad(e, grad, &out_dims)?;
    if out_dims.contains(&0) {
        return Ok(vec![e.full(dt, &in_dims, 0.0)?]);
    }
    let share = divide_by_sizes(e, grad, &bins)?;
    if bins.iter().all(Bins::even) {
        return Ok(vec![spread(e, &even_window(&lead, &bins), share)?]);
    }
    let rows: u64 = lead.iter().product();
    let outs: u64 = bins.iter().map(|b| b.starts.len() as u64).product();
    let ins: u64 = bins.iter().map(|b| b.input).product();
    let share = e.reshape(share, &[rows, outs])?;
    let mut acc = e.full(dt, &[rows, ins], 0.0)?;
    // Each bin element's flat spatial position over the pooled shape (one
    // past a bin's end reads as its last element; masked below).
    let offsets = bin_offsets(&bins);
    let position = |j: &[i64]| -> Vec<i64> {
        let mut flat = vec![0i64];
        for (b, &jd) in bins.iter().zip(j) {
            let last = b.input as i64 - 1;
            flat = flat
                .iter()
                .flat_map(|&f| {
                    b.starts
                        .iter()
                        .map(move |&s| f * b.input as i64 + (s + jd).min(last))
                })
                .collect();
        }
        flat
    };
    if bins.iter().any(|b| b.starts.len() as u64 > b.input) {
        // Bins that start together (more outputs than inputs): one scatter
        // of every (output, bin element) in output order, torch's order.
        let k = offsets.len() as u64;
        let by_j: Vec<Vec<i64>> = offsets.iter().map(|j| position(j)).collect();
        let at: Vec<i64> = (0..outs as usize)
            .flat_map(|o| by_j.iter().map(move |p| p[o]))
            .collect();
        let at = i64_vector(e, &at)?;
        let at = e.broadcast_to(at, &[rows, outs * k])?;
        let mut parts = Vec::with_capacity(offsets.len());
        for j in &offsets {
            let part = match inside_bins(e, &bins, j, &out_dims)? {
                Some(inside) => {
                    let inside = e.reshape(inside, &[rows, outs])?;
                    let zeros = e.full(dt, &[rows, outs], 0.0)?;
                    e.select(inside, share, zeros)?
                }
                None => share,
            };
            parts.push(e.reshape(part, &[rows, outs, 1])?);
        }
        let upd = e.op(Prim::Concatenate { dimension: 2 }, &parts)?;
        let upd = e.reshape(upd, &[rows, outs * k])?;
        acc = scatter_add_rows(e, acc, at, upd)?;
        return Ok(vec![e.reshape(acc, &in_dims)?]);
    }
    // Otherwise bins overlap by at most one element along a dim: per bin
    // element, last first, the shares are scattered (added) at that
    // element's position, so an input element's bins come in output order
    // and every sum is rounded to the dtype, as torch's.
    for j in offsets.into_iter().rev() {
        let at = i64_vector(e, &position(&j))?;
        let at = e.broadcast_to(at, &[rows, outs])?;
        let mut upd = share;
        if let Some(inside) = inside_bins(e, &bins, &j, &out_dims)? {
            let inside = e.reshape(inside, &[rows, outs])?;
            let zeros = e.full(dt, &[rows, outs], 0.0)?;
            upd = e.select(inside, share, zeros)?;
        }
        acc = scatter_add_rows(e, acc, at, upd)?;
    }
    Ok(vec![e.reshape(acc, &in_dims)?])
}

/// adaptive_max_pool(x; output_size) -> (values, i64 indices): each bin's
/// maximum (bins as `adaptive_avg_pool`'s) and its flat position in the
/// input's spatial dims. As torch's kernels: the bin's first element, then
/// an element replaces the maximum when greater or NaN.
fn adaptive_max_pool(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let v = x[0];
    let dt = e.dtype(v);
    if dt == DType::Bool {
        return Err(Error::invalid(
            "max pooling of bool tensors is not supported",
        ));
    }
    let (lead, bins) = adaptive_bins(&e.dims(v), a)?;
    let out_dims = bins_shape(&lead, &bins);
    if out_dims.contains(&0) {
        return Ok(vec![
            e.full(dt, &out_dims, 0.0)?,
            e.full(DType::I64, &out_dims, 0.0)?,
        ]);
    }
    let (first, n) = (lead.len(), bins.len());
    let mut best: Option<(ValueId, ValueId)> = None;
    for j in bin_offsets(&bins) {
        let mut val = v;
        let mut index: Option<ValueId> = None;
        for (d, b) in bins.iter().enumerate() {
            val = bin_element(e, val, first + d, b, j[d])?;
            let last = b.input as i64 - 1;
            let at: Vec<i64> = b.starts.iter().map(|&s| (s + j[d]).min(last)).collect();
            let pos = along(e, &at, d, n, &out_dims, DType::I64)?;
            index = Some(match index {
                None => pos,
                Some(i) => {
                    let scaled = e.binary_scalar(BinaryOp::Mul, i, b.input as f64)?;
                    e.add(scaled, pos)?
                }
            });
        }
        let index = index.expect("1 to 3 spatial dims");
        best = Some(match best {
            None => (val, index),
            Some((bv, bi)) => {
                let mut take = e.compare(CompareOp::Gt, val, bv)?;
                if dt.is_float() {
                    let number = e.compare(CompareOp::Eq, val, val)?;
                    let nan = e.unary(UnaryOp::Not, number)?;
                    take = e.binary(BinaryOp::Or, take, nan)?;
                }
                if let Some(inside) = inside_bins(e, &bins, &j, &out_dims)? {
                    take = e.binary(BinaryOp::And, take, inside)?;
                }
                (e.select(take, val, bv)?, e.select(take, index, bi)?)
            }
        });
    }
    let (values, indices) = best.expect("every bin has an element");
    Ok(vec![values, indices])
}

/// adaptive_max_pool_backward(grad, self, indices; spatial_dims) -> zeros
/// of self's shape with each grad element added at its index (in the
/// input's last `spatial_dims` dims, per leading row).
fn adaptive_max_pool_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (grad, input, indices) = (x[0], x[1], x[2]);
    let (gd, in_dims) = (e.dims(grad), e.dims(input));
    if e.dims(indices) != gd || gd.len() != in_dims.len() || gd.len() < 2 {
        return Err(Error::invalid(format!(
            "grad {gd:?}, input {in_dims:?} and indices {:?} must have one rank, grad and \
             indices one shape",
            e.dims(indices)
        )));
    }
    if !e.dtype(indices).is_integer() {
        return Err(Error::invalid(format!(
            "indices must be an integer tensor, got {:?}",
            e.dtype(indices)
        )));
    }
    let spatial = a.int("spatial_dims")?;
    if !(1..=3).contains(&spatial)
        || gd.len() <= spatial as usize
        || gd.len() > spatial as usize + 2
    {
        return Err(Error::invalid(format!(
            "spatial_dims {spatial} must be 1 to 3, after one or two leading dims of grad {gd:?}"
        )));
    }
    let spatial = spatial as usize;
    if gd[..gd.len() - spatial] != in_dims[..in_dims.len() - spatial] {
        return Err(Error::invalid(format!(
            "grad {gd:?} and input {in_dims:?} must share their leading (batch, channel) dims"
        )));
    }
    let rows: u64 = gd[..gd.len() - spatial].iter().product();
    let o: u64 = gd[gd.len() - spatial..].iter().product();
    let i: u64 = in_dims[in_dims.len() - spatial..].iter().product();
    let dt = e.dtype(grad);
    if rows * o * i == 0 {
        return Ok(vec![e.full(dt, &in_dims, 0.0)?]);
    }
    let idx = e.convert(indices, DType::I64)?;
    Ok(vec![add_at_indices(e, grad, idx, (rows, o, i), &in_dims)?])
}

/// The sliding blocks of im2col / col2im over a 2-D image of `image`
/// (height, width): a window with aten's arguments, any padding.
fn blocks(lead: &[u64], image: &[u64], a: &Attrs) -> Result<Window> {
    let kernel = spatial_list(a, "kernel_size", 2, 0)?;
    let dilation = spatial_list(a, "dilation", 2, 1)?;
    let padding = spatial_list(a, "padding", 2, 0)?;
    let stride = spatial_list(a, "stride", 2, 1)?;
    if kernel.contains(&0) || stride.contains(&0) || dilation.contains(&0) {
        return Err(Error::invalid(format!(
            "kernel_size {kernel:?}, stride {stride:?} and dilation {dilation:?} must be positive"
        )));
    }
    let output: Vec<i64> = (0..2)
        .map(|d| {
            let span = dilation[d] * (kernel[d] - 1) + 1;
            (image[d] + 2 * padding[d]) as i64 - span as i64
        })
        .zip(&stride)
        .map(|(room, &s)| room.div_euclid(s as i64) + 1)
        .collect();
    if output.iter().any(|&o| o < 1) {
        return Err(Error::invalid(format!(
            "given spatial size {image:?}, kernel_size {kernel:?}, dilation {dilation:?}, padding \
             {padding:?} and stride {stride:?}, the array of sliding blocks would be {output:?}, \
             but its sizes must be at least one"
        )));
    }
    Ok(Window {
        lead: lead.to_vec(),
        input: image.to_vec(),
        output: output.iter().map(|&o| o as u64).collect(),
        kernel,
        stride,
        padding,
        dilation,
    })
}

/// im2col(x [N, C, H, W] or [C, H, W]; kernel_size, dilation, padding,
/// stride) -> [N, C * kh * kw, L] (or without N): torch's F.unfold, each
/// column one sliding block (L of them, row-major), rows channel-major then
/// the kernel's offsets row-major; positions in the padding read zero.
fn im2col(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let v = x[0];
    let dims = e.dims(v);
    if dims.len() != 3 && dims.len() != 4 {
        return Err(Error::invalid(format!(
            "expected a 3-D or 4-D input, got {}",
            e.ty(v)
        )));
    }
    let (lead, image) = dims.split_at(dims.len() - 2);
    let w = blocks(lead, image, a)?;
    let k: u64 = w.kernel.iter().product();
    let l: u64 = w.output.iter().product();
    let mut out = lead.to_vec();
    let c = out.pop().expect("channels");
    out.extend([c * k, l]);
    if out.contains(&0) {
        return Ok(vec![e.full(e.dtype(v), &out, 0.0)?]);
    }
    let padded = w.padded(e, v, 0.0)?;
    let mut parts = Vec::with_capacity(k as usize);
    let mut one = lead.to_vec();
    one.extend([1, l]);
    for flat in 0..k {
        let s = w.slice(e, padded, &w.offset(flat))?;
        parts.push(e.reshape(s, &one)?);
    }
    let cols = e.op(
        Prim::Concatenate {
            dimension: lead.len(),
        },
        &parts,
    )?;
    Ok(vec![e.reshape(cols, &out)?])
}

/// col2im(cols [N, C * kh * kw, L] or [C * kh * kw, L]; output_size,
/// kernel_size, dilation, padding, stride) -> [N, C, H, W]: torch's
/// F.fold, each column's values added back where im2col read them
/// (positions in the padding dropped); bf16 and f16 add at f32.
fn col2im(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let v = x[0];
    let dims = e.dims(v);
    let dt = e.dtype(v);
    if dims.len() != 2 && dims.len() != 3 {
        return Err(Error::invalid(format!(
            "expected a 2-D or 3-D input, got {}",
            e.ty(v)
        )));
    }
    let image = sizes_attr(a, "output_size")?;
    if image.len() != 2 {
        return Err(Error::invalid(format!(
            "output_size must have 2 entries, got {image:?}"
        )));
    }
    let batch = &dims[..dims.len() - 2];
    let (rows, l) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let probe = blocks(&[], &image, a)?;
    let k: u64 = probe.kernel.iter().product();
    if rows % k != 0 {
        return Err(Error::invalid(format!(
            "expected size of input's dimension {} to be divisible by the product of kernel_size \
             {k}, but got {rows}",
            dims.len() - 2
        )));
    }
    let blocks_count: u64 = probe.output.iter().product();
    if l != blocks_count {
        return Err(Error::invalid(format!(
            "expected size of input's dimension {} to match the calculated number of sliding \
             blocks {:?} = {blocks_count}, but got {l}",
            dims.len() - 1,
            probe.output
        )));
    }
    let mut lead = batch.to_vec();
    lead.push(rows / k);
    let w = blocks(&lead, &image, a)?;
    let mut out = lead.clone();
    out.extend(&image);
    if out.contains(&0) {
        return Ok(vec![e.full(dt, &out, 0.0)?]);
    }
    let cd = float_compute_dtype(e, v, "col2im")?;
    let mut split = lead.clone();
    split.push(k);
    split.extend(&w.output);
    let cols = e.convert(v, cd)?;
    let cols = e.reshape(cols, &split)?;
    let axis = lead.len();
    let mut acc: Option<ValueId> = None;
    for flat in 0..k {
        let mut start = vec![0u64; split.len()];
        let mut limit = split.clone();
        start[axis] = flat;
        limit[axis] = flat + 1;
        let part = e.op(
            Prim::Slice {
                start,
                limit,
                stride: vec![1; split.len()],
            },
            &[cols],
        )?;
        let part = e.reshape(part, &w.out_dims())?;
        let placed = w.place(e, part, &w.offset(flat))?;
        acc = Some(match acc {
            None => placed,
            Some(s) => e.add(s, placed)?,
        });
    }
    Ok(vec![e.convert(acc.expect("a kernel has an element"), dt)?])
}

/// max_unpool(x [N?, C, in..], indices (x's shape, i64); output_size
/// [spatial..]) -> [N?, C, output_size..]: each value written at its flat
/// position within its plane, zeros elsewhere (a later duplicate wins, as
/// in torch's serial loop); an index outside the plane is the scatter's
/// error when the graph runs.
fn max_unpool(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let size = sizes_attr(a, "output_size")?;
    let spatial = size.len();
    if !(1..=3).contains(&spatial) {
        return Err(Error::invalid(format!(
            "output_size must list 1 to 3 spatial sizes, got {size:?}"
        )));
    }
    let (v, idx) = (x[0], x[1]);
    if e.dtype(idx) != DType::I64 {
        return Err(Error::invalid(format!(
            "elements in indices should be type int64 but got: {}",
            e.dtype(idx)
        )));
    }
    let d = e.dims(v);
    if d.len() != spatial + 1 && d.len() != spatial + 2 {
        return Err(Error::invalid(format!(
            "input to max_unpooling{spatial}d should be a {}d or {}d tensor, but got a tensor with {} dimensions",
            spatial + 1,
            spatial + 2,
            d.len()
        )));
    }
    if e.dims(idx) != d {
        return Err(Error::invalid(format!(
            "expected shape of indices to be same as that of the input tensor ({d:?}) but got indices tensor with shape: {:?}",
            e.dims(idx)
        )));
    }
    let lead = d.len() - spatial;
    let mut flat_in = d[..lead].to_vec();
    flat_in.push(d[lead..].iter().product());
    let mut flat_out = d[..lead].to_vec();
    flat_out.push(size.iter().product());
    let mut out = d[..lead].to_vec();
    out.extend(&size);
    let zeros = e.full(e.dtype(v), &flat_out, 0.0)?;
    let vf = e.reshape(v, &flat_in)?;
    let idf = e.reshape(idx, &flat_in)?;
    let placed = e.op(
        Prim::Scatter {
            axis: lead,
            combiner: ScatterCombiner::Replace,
        },
        &[zeros, idf, vf],
    )?;
    Ok(vec![e.reshape(placed, &out)?])
}

pub(super) const OPS: &[OpDef] = &[
    def!("max_pool", Arity::Exactly(1), max_pool),
    def!("max_pool_backward", Arity::Exactly(3), max_pool_backward),
    def!("max_unpool", Arity::Exactly(2), max_unpool),
    def!("avg_pool", Arity::Exactly(1), avg_pool),
    def!("avg_pool_backward", Arity::Exactly(2), avg_pool_backward),
    def!("adaptive_avg_pool", Arity::Exactly(1), adaptive_avg_pool),
    def!(
        "adaptive_avg_pool_backward",
        Arity::Exactly(2),
        adaptive_avg_pool_backward
    ),
    def!("adaptive_max_pool", Arity::Exactly(1), adaptive_max_pool),
    def!(
        "adaptive_max_pool_backward",
        Arity::Exactly(3),
        adaptive_max_pool_backward
    ),
    def!("im2col", Arity::Exactly(1), im2col),
    def!("col2im", Arity::Exactly(1), col2im),
];
