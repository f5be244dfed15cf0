//! Upsampling (any output size, so downsampling too) over 1, 2 or 3
//! spatial dims: nearest (aten's upsample_nearest{1,2,3}d and
//! `_upsample_nearest_exact{1,2,3}d`) and linear (upsample_linear1d,
//! upsample_bilinear2d, upsample_trilinear3d), forward and backward.
//!
//! Source positions come from torch's formulas, evaluated when the graph
//! is built in the arithmetic torch's CPU kernels use (f32 scales; f64 for
//! f64 tensors' linear weights), so nearest picks torch's elements and
//! linear mixes torch's pair of neighbours with torch's weights. The
//! forward gathers along each spatial dim; a linear output is
//! `t0 * w0 + t1 * w1` per dim, the first spatial dim outermost, as
//! torch's kernel nests them. The backward adds every output's grad (times
//! its weight) into its sources in output order, in one scatter.

use super::attrs::Attrs;
use super::emit::Emitter;
use super::support::{float_compute_dtype, i64_vector, scatter_add_rows, spatial_output_size};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{DType, Prim, ValueId};

/// The resize's shape: the leading dims, and per spatial dim the input
/// size, output size and the scale torch was given (None: input / output).
struct Resize {
    lead: Vec<u64>,
    input: Vec<u64>,
    output: Vec<u64>,
    scales: Vec<Option<f64>>,
}

impl Resize {
    /// From the input's dims (`dims`), `output_size` (1 to 3 entries) and
    /// `scales` (as many; a scale that is not positive counts as none).
    fn of(dims: &[u64], a: &Attrs) -> Result<Self> {
        let (lead, input, output) = spatial_output_size(dims, a, "upsampling")?;
        let n = output.len();
        if output.contains(&0) {
            return Err(Error::invalid(format!(
                "output_size {output:?} must have positive entries"
            )));
        }
        let scales = match a.get("scales") {
            None | Some(super::attrs::Attr::None) => vec![None; n],
            Some(super::attrs::Attr::Floats(s)) if s.len() == n => {
                s.iter().map(|&v| (v > 0.0).then_some(v)).collect()
            }
            Some(other) => {
                return Err(Error::invalid(format!(
                    "scales must be a list of {n} floats (one per spatial dim), got {other:?}"
                )))
            }
        };
        Ok(Resize {
            lead,
            input,
            output,
            scales,
        })
    }

    /// From a backward's `input_size` (the forward input's dims).
    fn of_backward(grad: &[u64], a: &Attrs) -> Result<Self> {
        let input = a.ints("input_size")?;
        let dims = input
            .iter()
            .map(|&d| {
                u64::try_from(d).map_err(|_| {
                    Error::invalid(format!("input_size {input:?} has a negative entry"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let r = Resize::of(&dims, a)?;
        if grad != r.out_dims() {
            return Err(Error::invalid(format!(
                "grad {grad:?} must have the upsampled shape {:?}",
                r.out_dims()
            )));
        }
        Ok(r)
    }

    fn out_dims(&self) -> Vec<u64> {
        self.lead.iter().chain(&self.output).copied().collect()
    }

    fn in_dims(&self) -> Vec<u64> {
        self.lead.iter().chain(&self.input).copied().collect()
    }

    /// torch's `compute_scales_value`: 1 / scale when one was given, else
    /// input / output, as an f32.
    fn scale_f32(&self, d: usize) -> f32 {
        match self.scales[d] {
            Some(s) => (1.0 / s) as f32,
            None => self.input[d] as f32 / self.output[d] as f32,
        }
    }

    /// Nearest's source index of each output along dim `d` (torch's
    /// `nearest_idx`, or `nearest_neighbor_exact_compute_source_index`).
    fn nearest(&self, d: usize, exact: bool) -> Vec<i64> {
        let (i, o) = (self.input[d], self.output[d]);
        let last = i as i64 - 1;
        let scale = self.scale_f32(d);
        (0..o)
            .map(|k| {
                if exact {
                    (((k as f64 + 0.5) * scale as f64).floor() as i64).min(last)
                } else if o == i {
                    k as i64
                } else if o == 2 * i {
                    (k >> 1) as i64
                } else {
                    ((k as f32 * scale).floor() as i64).min(last)
                }
            })
            .collect()
    }

    /// Linear's two sources and their weights for each output along dim
    /// `d` (torch's `area_pixel_compute_source_index` and
    /// `compute_indices_weights_linear`), in f32 or, for f64, in f64.
    fn linear(&self, d: usize, align_corners: bool, wide: bool) -> Vec<(i64, i64, f64, f64)> {
        let (i, o) = (self.input[d], self.output[d]);
        (0..o)
            .map(|k| {
                let src = if wide {
                    let scale = if align_corners {
                        if o > 1 {
                            (i - 1) as f64 / (o - 1) as f64
                        } else {
                            0.0
                        }
                    } else {
                        self.scales[d].map_or(i as f64 / o as f64, |s| 1.0 / s)
                    };
                    if align_corners {
                        scale * k as f64
                    } else {
                        (scale * (k as f64 + 0.5) - 0.5).max(0.0)
                    }
                } else {
                    let scale = if align_corners {
                        if o > 1 {
                            (i - 1) as f32 / (o - 1) as f32
                        } else {
                            0.0
                        }
                    } else {
                        self.scale_f32(d)
                    };
                    (if align_corners {
                        scale * k as f32
                    } else {
                        (scale * (k as f32 + 0.5) - 0.5).max(0.0)
                    }) as f64
                };
                let i0 = src as i64;
                let i1 = if i0 < i as i64 - 1 { i0 + 1 } else { i0 };
                let (w0, w1) = if wide {
                    let l = (src - i0 as f64).clamp(0.0, 1.0);
                    (1.0 - l, l)
                } else {
                    let l = (src as f32 - i0 as f32).clamp(0.0, 1.0);
                    ((1.0 - l) as f64, l as f64)
                };
                (i0, i1, w0, w1)
            })
            .collect()
    }
}

/// A float vector constant of `dtype` (f32 or f64; the weights).
fn float_vector(e: &mut Emitter, dtype: DType, v: &[f64]) -> Result<ValueId> {
    let bytes = match dtype {
        DType::F32 => v.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
        DType::F64 => v.iter().flat_map(|&x| x.to_le_bytes()).collect(),
        other => {
            return Err(Error::Internal(format!(
                "no {other} weights for upsampling"
            )))
        }
    };
    e.op(
        Prim::Constant {
            dtype,
            dims: vec![v.len() as u64],
            bytes,
        },
        &[],
    )
}

/// `v`'s elements at `at` along `axis` (skipped when `at` is every
/// position in order).
fn gather(e: &mut Emitter, v: ValueId, axis: usize, at: &[i64]) -> Result<ValueId> {
    let same =
        e.dims(v)[axis] == at.len() as u64 && at.iter().enumerate().all(|(k, &i)| i == k as i64);
    if same {
        return Ok(v);
    }
    let idx = i64_vector(e, at)?;
    e.op(Prim::Take { axis }, &[v, idx])
}

/// Every combination of one entry per spatial dim, the last dim fastest:
/// `per_dim[d][k]` is dim d's entry for output (or corner) k.
fn combine<T: Copy>(per_dim: &[Vec<T>], mut f: impl FnMut(&[T])) {
    fn go<T: Copy>(per_dim: &[Vec<T>], picked: &mut Vec<T>, f: &mut dyn FnMut(&[T])) {
        match per_dim.split_first() {
            None => f(picked),
            Some((first, rest)) => {
                for &x in first {
                    picked.push(x);
                    go(rest, picked, f);
                    picked.pop();
                }
            }
        }
    }
    go(per_dim, &mut Vec::new(), &mut f);
}

/// upsample_nearest(x; output_size, scales = none, exact = false) -> each
/// output the input element torch's nearest (or nearest-exact) picks. The
/// last `output_size.len()` (1 to 3) dims of x are spatial, after one or
/// two others; any dtype.
fn upsample_nearest(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let r = Resize::of(&e.dims(x[0]), a)?;
    let exact = a.bool_or("exact", false)?;
    let first = r.lead.len();
    let mut v = x[0];
    for d in 0..r.input.len() {
        v = gather(e, v, first + d, &r.nearest(d, exact))?;
    }
    Ok(vec![v])
}

/// Adds `updates` ([rows, outputs × k], in output order) into zeros of the
/// input's shape at flat spatial positions `at` (as long), one scatter, so
/// an input element's grads add in output order.
fn scatter_into_input(
    e: &mut Emitter,
    r: &Resize,
    updates: ValueId,
    at: &[i64],
) -> Result<ValueId> {
    let rows: u64 = r.lead.iter().product();
    let ins: u64 = r.input.iter().product();
    let n = at.len() as u64;
    let idx = i64_vector(e, at)?;
    let idx = e.broadcast_to(idx, &[rows, n])?;
    let zeros = e.full(e.dtype(updates), &[rows, ins], 0.0)?;
    let acc = scatter_add_rows(e, zeros, idx, updates)?;
    e.reshape(acc, &r.in_dims())
}

/// Flat spatial position of per-dim input positions.
fn flat_position(r: &Resize, pos: &[i64]) -> i64 {
    pos.iter()
        .zip(&r.input)
        .fold(0i64, |f, (&p, &i)| f * i as i64 + p)
}

/// upsample_nearest_backward(grad; input_size, output_size, scales, exact)
/// -> every output's grad added into the element it was taken from.
fn upsample_nearest_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let grad = x[0];
    let r = Resize::of_backward(&e.dims(grad), a)?;
    let exact = a.bool_or("exact", false)?;
    let dt = e.dtype(grad);
    if r.lead.contains(&0) {
        return Ok(vec![e.full(dt, &r.in_dims(), 0.0)?]);
    }
    let per_dim: Vec<Vec<i64>> = (0..r.input.len()).map(|d| r.nearest(d, exact)).collect();
    let mut at = Vec::new();
    combine(&per_dim, |p| at.push(flat_position(&r, p)));
    let rows: u64 = r.lead.iter().product();
    let g = e.reshape(grad, &[rows, at.len() as u64])?;
    Ok(vec![scatter_into_input(e, &r, g, &at)?])
}

/// `v` interpolated along spatial dims `d..` (axis `first + d` onward):
/// `t0 * w0 + t1 * w1` with t0, t1 the interpolations of the two source
/// slices, as torch's kernel nests them.
fn interpolate(
    e: &mut Emitter,
    v: ValueId,
    first: usize,
    d: usize,
    taps: &[Vec<(i64, i64, f64, f64)>],
) -> Result<ValueId> {
    if d == taps.len() {
        return Ok(v);
    }
    let axis = first + d;
    let dt = e.dtype(v);
    let i0: Vec<i64> = taps[d].iter().map(|t| t.0).collect();
    let i1: Vec<i64> = taps[d].iter().map(|t| t.1).collect();
    let s0 = gather(e, v, axis, &i0)?;
    let t0 = interpolate(e, s0, first, d + 1, taps)?;
    let s1 = gather(e, v, axis, &i1)?;
    let t1 = interpolate(e, s1, first, d + 1, taps)?;
    let out_dims = e.dims(t0);
    let weight = |e: &mut Emitter, w: Vec<f64>| -> Result<ValueId> {
        let c = float_vector(e, dt, &w)?;
        let mut dims = vec![w.len() as u64];
        dims.extend(std::iter::repeat_n(1, taps.len() - d - 1));
        let c = e.reshape(c, &dims)?;
        e.broadcast_to(c, &out_dims)
    };
    let w0 = weight(e, taps[d].iter().map(|t| t.2).collect())?;
    let w1 = weight(e, taps[d].iter().map(|t| t.3).collect())?;
    let a = e.mul(t0, w0)?;
    let b = e.mul(t1, w1)?;
    e.add(a, b)
}

/// upsample_linear(x; output_size, align_corners = false, scales = none)
/// -> linear (bilinear, trilinear) interpolation over the last
/// `output_size.len()` dims, computed at f32 for bf16 and f16.
fn upsample_linear(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let dt = e.dtype(x[0]);
    let cd = float_compute_dtype(e, x[0], "linear upsampling")?;
    let r = Resize::of(&e.dims(x[0]), a)?;
    let align = a.bool_or("align_corners", false)?;
    if r.lead.contains(&0) {
        return Ok(vec![e.full(dt, &r.out_dims(), 0.0)?]);
    }
    let taps: Vec<_> = (0..r.input.len())
        .map(|d| r.linear(d, align, cd == DType::F64))
        .collect();
    let v = e.convert(x[0], cd)?;
    let y = interpolate(e, v, r.lead.len(), 0, &taps)?;
    Ok(vec![e.convert(y, dt)?])
}

/// upsample_linear_backward(grad; input_size, output_size, align_corners,
/// scales) -> every output's grad times each of its sources' weights
/// (their product over the dims) added into that source, in output order
/// and, per output, its sources' order (at f32 for bf16 and f16, rounded
/// once).
fn upsample_linear_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let grad = x[0];
    let dt = e.dtype(grad);
    let cd = float_compute_dtype(e, grad, "linear upsampling")?;
    let r = Resize::of_backward(&e.dims(grad), a)?;
    let align = a.bool_or("align_corners", false)?;
    if r.lead.contains(&0) {
        return Ok(vec![e.full(dt, &r.in_dims(), 0.0)?]);
    }
    let n = r.input.len();
    // Per dim, each output's two (source, weight) taps.
    let per_dim: Vec<Vec<[(i64, f64); 2]>> = (0..n)
        .map(|d| {
            r.linear(d, align, cd == DType::F64)
                .into_iter()
                .map(|(i0, i1, w0, w1)| [(i0, w0), (i1, w1)])
                .collect()
        })
        .collect();
    let (mut at, mut weights) = (Vec::new(), Vec::new());
    let wide = cd == DType::F64;
    combine(&per_dim, |taps| {
        // The corners of this output: one tap per dim, the last fastest.
        let corners: Vec<Vec<(i64, f64)>> = taps.iter().map(|t| t.to_vec()).collect();
        combine(&corners, |c| {
            let pos: Vec<i64> = c.iter().map(|t| t.0).collect();
            at.push(flat_position(&r, &pos));
            let w = c.iter().fold(1.0f64, |p, t| {
                if wide {
                    p * t.1
                } else {
                    (p as f32 * t.1 as f32) as f64
                }
            });
            weights.push(w);
        });
    });
    let rows: u64 = r.lead.iter().product();
    let outs: u64 = r.output.iter().product();
    let corners = 1u64 << n;
    let g = e.convert(grad, cd)?;
    let g = e.reshape(g, &[rows, outs, 1])?;
    let g = e.broadcast_to(g, &[rows, outs, corners])?;
    let w = float_vector(e, cd, &weights)?;
    let w = e.reshape(w, &[outs, corners])?;
    let w = e.broadcast_to(w, &[rows, outs, corners])?;
    let upd = e.mul(w, g)?;
    let upd = e.reshape(upd, &[rows, outs * corners])?;
    let acc = scatter_into_input(e, &r, upd, &at)?;
    Ok(vec![e.convert(acc, dt)?])
}

pub(super) const OPS: &[OpDef] = &[
    def!("upsample_nearest", Arity::Exactly(1), upsample_nearest),
    def!(
        "upsample_nearest_backward",
        Arity::Exactly(1),
        upsample_nearest_backward
    ),
    def!("upsample_linear", Arity::Exactly(1), upsample_linear),
    def!(
        "upsample_linear_backward",
        Arity::Exactly(1),
        upsample_linear_backward
    ),
];
