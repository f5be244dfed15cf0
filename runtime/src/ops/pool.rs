//! Max pooling over 1, 2 or 3 spatial dims (aten's max_pool{1,2,3}d and
//! their `_with_indices` forms) and its backward, from slices, selects and
//! a scatter.
//!
//! The window at output position o along a spatial dim starts at
//! `o * stride - padding` and takes `kernel` elements `dilation` apart;
//! positions in the padding take no part. As torch's kernels do, a window
//! keeps its first element, then an element replaces the maximum when it
//! is greater or NaN (so NaN propagates, and the index is the first
//! maximum's, or the last NaN's). The index is the element's flat position
//! in the input's spatial dims.

use super::attrs::Attrs;
use super::emit::Emitter;
use super::support::{iota, spatial_list};
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
                "max pooling is over 1, 2 or 3 spatial dims, got {n}"
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
    let n = w.kernel.len();
    let lead = w.lead.len();
    let out_dims = w.out_dims();
    if out_dims.contains(&0) {
        return Ok(vec![
            e.full(dt, &out_dims, 0.0)?,
            e.full(DType::I64, &out_dims, 0.0)?,
        ]);
    }
    // Padded on the high side too, so every window's slice is in range.
    let mut low = vec![0i64; lead];
    let mut high = vec![0i64; lead];
    for d in 0..n {
        let reach = (w.output[d] - 1) * w.stride[d] + w.dilation[d] * (w.kernel[d] - 1) + 1;
        low.push(w.padding[d] as i64);
        high.push(reach.saturating_sub(w.input[d] + w.padding[d]) as i64);
    }
    let zero = e.scalar(dt, 0.0)?;
    let padded = e.op(
        Prim::Pad {
            low,
            high,
            interior: vec![0; lead + n],
        },
        &[v, zero],
    )?;
    let starts = w.starts(e)?;
    let mut best: Option<(ValueId, ValueId, ValueId)> = None;
    for flat in 0..w.kernel.iter().product::<u64>() {
        let offset = w.offset(flat);
        let mut start = vec![0u64; lead];
        let mut limit = w.lead.clone();
        let mut stride = vec![1u64; lead];
        for (d, &off) in offset.iter().enumerate() {
            let s = off * w.dilation[d];
            start.push(s);
            limit.push(s + (w.output[d] - 1) * w.stride[d] + 1);
            stride.push(w.stride[d]);
        }
        let val = e.op(
            Prim::Slice {
                start,
                limit,
                stride,
            },
            &[padded],
        )?;
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
    let g = e.reshape(grad, &[rows, o])?;
    let idx = e.reshape(idx, &[rows, o])?;
    let zeros = e.full(dt, &[rows, i], 0.0)?;
    let r = e.op(
        Prim::Scatter {
            axis: 1,
            combiner: ScatterCombiner::Add,
        },
        &[zeros, idx, g],
    )?;
    Ok(vec![e.reshape(r, &e.dims(input))?])
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
    let lead = w.lead.len();
    let out_dims = w.out_dims();
    let in_dims: Vec<u64> = w.lead.iter().chain(&w.input).copied().collect();
    let dt = e.dtype(grad);
    let starts = w.starts(e)?;
    let zero = e.scalar(dt, 0.0)?;
    let mut acc = e.full(dt, &in_dims, 0.0)?;
    for flat in (0..w.kernel.iter().product::<u64>()).rev() {
        let offset = w.offset(flat);
        let (valid, index) = w.positions(e, &starts, &offset)?;
        let mine = e.compare(CompareOp::Eq, idx, index)?;
        let hit = e.binary(BinaryOp::And, valid, mine)?;
        let zeros = e.full(dt, &out_dims, 0.0)?;
        let g = e.select(hit, grad, zeros)?;
        let mut low = vec![0i64; lead];
        let mut high = vec![0i64; lead];
        let mut interior = vec![0u64; lead];
        for (d, &off) in offset.iter().enumerate() {
            let first = (off * w.dilation[d]) as i64 - w.padding[d] as i64;
            let span = ((w.output[d] - 1) * w.stride[d] + 1) as i64;
            low.push(first);
            high.push(w.input[d] as i64 - first - span);
            interior.push(w.stride[d] - 1);
        }
        let placed = e.op(
            Prim::Pad {
                low,
                high,
                interior,
            },
            &[g, zero],
        )?;
        acc = e.add(acc, placed)?;
    }
    Ok(acc)
}

pub(super) const OPS: &[OpDef] = &[
    def!("max_pool", Arity::Exactly(1), max_pool),
    def!("max_pool_backward", Arity::Exactly(3), max_pool_backward),
];
