//! Upsampling (any output size, so downsampling too) over 1, 2 or 3
//! spatial dims: nearest (aten's upsample_nearest{1,2,3}d and
//! `_upsample_nearest_exact{1,2,3}d`), linear (upsample_linear1d,
//! upsample_bilinear2d, upsample_trilinear3d), cubic (upsample_bicubic2d)
//! and antialiased linear or cubic (`_upsample_bilinear2d_aa`,
//! `_upsample_bicubic2d_aa`), forward and backward.
//!
//! Source positions come from torch's formulas, evaluated when the graph
//! is built in the arithmetic torch's CPU kernels use (f32 scales; f64 for
//! f64 tensors' linear weights), so nearest picks torch's elements and
//! linear mixes torch's pair of neighbours with torch's weights. The
//! forward gathers along each spatial dim; a linear output is
//! `t0 * w0 + t1 * w1` per dim, the first spatial dim outermost, as
//! torch's kernel nests them. The backward adds every output's grad (times
//! its weight) into its sources in output order, in one scatter. Cubic
//! is linear with four taps per dim (Keys' kernel, a = -0.75, the sources
//! clamped at the border), as torch's kernel computes it.
//!
//! Antialiasing (PIL's resampling, which torch's `antialias=True` copies)
//! widens the filter by the downscaling factor, so every source under the
//! output's footprint counts: per dim, an output reads the sources from
//! `xmin` to `xmin + xsize` with the filter's weights (the triangle, or
//! Keys' kernel with a = -0.5) normalised to sum to 1. It runs one dim at
//! a time, the last first and then the others from the last but one back
//! (a dim whose size does not change is left alone), each pass summing its
//! taps in order, as torch's separable kernel does. Its backward is the
//! passes' transposes in reverse order, each a scatter.

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

    /// Nearest's source index of each output along dim `d` (torch's
    /// `nearest_idx`, or `nearest_neighbor_exact_compute_source_index`).
    fn nearest(&self, d: usize, exact: bool) -> Vec<i64> {
        let (i, o) = (self.input[d], self.output[d]);
        let last = i as i64 - 1;
        let scale = self.scale(d, false, Arith::F32) as f32;
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
    /// `compute_indices_weights_linear`), in `ar`'s precision.
    fn linear(&self, d: usize, align_corners: bool, ar: Arith) -> Taps {
        let i = self.input[d] as i64;
        let scale = self.scale(d, align_corners, ar);
        (0..self.output[d])
            .map(|k| {
                let src = source(scale, k, align_corners, ar).max(0.0);
                let i0 = src as i64;
                let i1 = if i0 < i - 1 { i0 + 1 } else { i0 };
                let l = ar.r(src - i0 as f64).clamp(0.0, 1.0);
                vec![(i0, ar.r(1.0 - l)), (i1, l)]
            })
            .collect()
    }

    /// torch's `area_pixel_compute_scale` (and, without align_corners,
    /// `compute_scales_value`: 1 / scale when one was given, else input /
    /// output) in `ar`'s precision.
    fn scale(&self, d: usize, align_corners: bool, ar: Arith) -> f64 {
        let (i, o) = (self.input[d] as f64, self.output[d] as f64);
        if align_corners {
            if o > 1.0 {
                ar.r((i - 1.0) / (o - 1.0))
            } else {
                0.0
            }
        } else {
            ar.r(self.scales[d].map_or(i / o, |s| 1.0 / s))
        }
    }

    /// Cubic's four sources and weights for each output along dim `d`
    /// (torch's `HelperInterpCubic::compute_indices_weights`): the source
    /// position's floor less 1 to plus 2, clamped into the input, with
    /// Keys' weights (a = -0.75) at the fraction, in `ar`'s precision.
    fn cubic(&self, d: usize, align_corners: bool, ar: Arith) -> Taps {
        const A: f64 = -0.75;
        let (i, o) = (self.input[d] as i64, self.output[d]);
        let scale = self.scale(d, align_corners, ar);
        (0..o)
            .map(|k| {
                let src = source(scale, k, align_corners, ar);
                let at = (src.floor() as i64).min(i - 1);
                let t = ar.r(src - at as f64).clamp(0.0, 1.0);
                let u = ar.r(1.0 - t);
                let w = [
                    keys_far(ar.r(t + 1.0), A, ar),
                    keys_near(t, A, ar),
                    keys_near(u, A, ar),
                    keys_far(ar.r(u + 1.0), A, ar),
                ];
                (0..4)
                    .map(|j| ((at - 1 + j as i64).clamp(0, i - 1), w[j]))
                    .collect()
            })
            .collect()
    }

    /// Antialiased sources and weights for each output along dim `d`
    /// (torch's `_compute_indices_min_size_weights_aa`, in `ar`'s
    /// precision): the filter stretched by the scale where it is above 1,
    /// centred on the output's centre, over the sources it covers, its
    /// weights normalised to sum to 1. Every output gets the same count of
    /// taps, the widest footprint's (2 ceil(support) + 1); the ones past an
    /// output's own sources weigh 0 and read its last source.
    fn antialias(&self, d: usize, filter: Filter, align_corners: bool, ar: Arith) -> Taps {
        let (i, o) = (self.input[d] as i64, self.output[d]);
        let scale = self.scale(d, align_corners, ar);
        let half = filter.half_width();
        let (support, inv) = if scale >= 1.0 {
            (ar.r(half * scale), ar.r(1.0 / scale))
        } else {
            (half, 1.0)
        };
        let width = support.ceil() as i64 * 2 + 1;
        (0..o)
            .map(|k| {
                let center = ar.r(scale * (k as f64 + 0.5));
                let xmin = ((ar.r(center - support) + 0.5) as i64).max(0);
                let xsize = (((ar.r(center + support) + 0.5) as i64).min(i) - xmin).clamp(0, width);
                let mut w: Vec<f64> = (0..xsize)
                    .map(|j| {
                        let x = ar.r(ar.r((xmin + j) as f64 - center) + 0.5);
                        filter.antialias_weight(ar.r(x * inv), ar)
                    })
                    .collect();
                let total = w.iter().fold(0.0, |t, &v| ar.r(t + v));
                if total != 0.0 {
                    for v in &mut w {
                        *v = ar.r(*v / total);
                    }
                }
                let last = (xmin + xsize - 1).clamp(0, i - 1);
                (0..width)
                    .map(|j| match w.get(j as usize) {
                        Some(&v) => (xmin + j, v),
                        None => (last, 0.0),
                    })
                    .collect()
            })
            .collect()
    }
}

/// Per output along one dim, its (source, weight) taps, as many for every
/// output.
type Taps = Vec<Vec<(i64, f64)>>;

/// Output `k`'s position in the input (torch's
/// `area_pixel_compute_source_index`, before linear's clamp at 0), in
/// `ar`'s precision.
fn source(scale: f64, k: u64, align_corners: bool, ar: Arith) -> f64 {
    if align_corners {
        ar.r(scale * k as f64)
    } else {
        ar.r(ar.r(scale * (k as f64 + 0.5)) - 0.5)
    }
}

/// The precision torch computes sources and weights in: f32 (rounding
/// after every operation, which f64 arithmetic followed by a rounding to
/// f32 gives exactly) unless the tensor is f64.
#[derive(Clone, Copy)]
struct Arith {
    wide: bool,
}

impl Arith {
    const F32: Arith = Arith { wide: false };

    /// Arithmetic at the compute dtype `cd` (f32 or f64).
    fn of(cd: DType) -> Self {
        Arith {
            wide: cd == DType::F64,
        }
    }

    fn r(self, v: f64) -> f64 {
        if self.wide {
            v
        } else {
            v as f32 as f64
        }
    }
}

/// Keys' cubic convolution kernel with parameter `a` on [0, 1).
fn keys_near(x: f64, a: f64, ar: Arith) -> f64 {
    let p = ar.r(ar.r(ar.r(a + 2.0) * x) - ar.r(a + 3.0));
    ar.r(ar.r(ar.r(p * x) * x) + 1.0)
}

/// Keys' cubic convolution kernel with parameter `a` on [1, 2).
fn keys_far(x: f64, a: f64, ar: Arith) -> f64 {
    let p = ar.r(ar.r(a * x) - 5.0 * a);
    let p = ar.r(ar.r(p * x) + 8.0 * a);
    ar.r(ar.r(p * x) - 4.0 * a)
}

/// The antialiasing filters.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Filter {
    /// The triangle 1 - |x| on (-1, 1).
    Linear,
    /// Keys' cubic kernel with a = -0.5 on (-2, 2), as PIL's.
    Cubic,
}

impl Filter {
    fn of(a: &Attrs) -> Result<Self> {
        match a.str_or("mode", "linear")? {
            "linear" => Ok(Filter::Linear),
            "cubic" => Ok(Filter::Cubic),
            other => Err(Error::invalid(format!(
                "mode must be \"linear\" or \"cubic\", got {other:?}"
            ))),
        }
    }

    /// Half the filter's width at scale 1 (torch's interp_size / 2).
    fn half_width(self) -> f64 {
        match self {
            Filter::Linear => 1.0,
            Filter::Cubic => 2.0,
        }
    }

    fn antialias_weight(self, x: f64, ar: Arith) -> f64 {
        let x = x.abs();
        match self {
            Filter::Linear if x < 1.0 => ar.r(1.0 - x),
            Filter::Cubic if x < 1.0 => keys_near(x, -0.5, ar),
            Filter::Cubic if x < 2.0 => keys_far(x, -0.5, ar),
            _ => 0.0,
        }
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

/// Dim `d`'s weights for tap `j`, shaped to multiply a tensor of `dims`
/// whose axis `axis` holds that dim's outputs.
fn tap_weights(
    e: &mut Emitter,
    dt: DType,
    taps: &Taps,
    j: usize,
    axis: usize,
    dims: &[u64],
) -> Result<ValueId> {
    let w: Vec<f64> = taps.iter().map(|t| t[j].1).collect();
    let c = float_vector(e, dt, &w)?;
    let mut shape = vec![w.len() as u64];
    shape.extend(std::iter::repeat_n(1, dims.len() - axis - 1));
    let c = e.reshape(c, &shape)?;
    e.broadcast_to(c, dims)
}

/// `v` interpolated along spatial dims `d..` (axis `first + d` onward):
/// `t0 * w0 + t1 * w1 + ...` with t_j the interpolation of tap j's source
/// slice, as torch's kernel nests them (the first dim outermost).
fn interpolate(
    e: &mut Emitter,
    v: ValueId,
    first: usize,
    d: usize,
    taps: &[Taps],
) -> Result<ValueId> {
    if d == taps.len() {
        return Ok(v);
    }
    let axis = first + d;
    let dt = e.dtype(v);
    let mut acc: Option<ValueId> = None;
    for j in 0..taps[d][0].len() {
        let at: Vec<i64> = taps[d].iter().map(|t| t[j].0).collect();
        let s = gather(e, v, axis, &at)?;
        let t = interpolate(e, s, first, d + 1, taps)?;
        let dims = e.dims(t);
        let w = tap_weights(e, dt, &taps[d], j, axis, &dims)?;
        let term = e.mul(t, w)?;
        acc = Some(match acc {
            None => term,
            Some(a) => e.add(a, term)?,
        });
    }
    acc.ok_or_else(|| Error::Internal("an upsampling dim without taps".into()))
}

/// One antialiasing pass: `v` resampled along `axis` by `taps`, its taps
/// summed in order.
fn resample_along(e: &mut Emitter, v: ValueId, axis: usize, taps: &Taps) -> Result<ValueId> {
    interpolate(e, v, axis, 0, std::slice::from_ref(taps))
}

/// The transpose of `resample_along`: every output's grad times each tap's
/// weight added into the tap's source (`input` of them along `axis`), in
/// output order and, per output, tap order, one scatter.
fn spread_along(
    e: &mut Emitter,
    g: ValueId,
    axis: usize,
    taps: &Taps,
    input: u64,
) -> Result<ValueId> {
    let dims = e.dims(g);
    let dt = e.dtype(g);
    let rank = dims.len();
    let mut perm: Vec<usize> = (0..rank).filter(|&k| k != axis).collect();
    perm.push(axis);
    let moved = e.transpose(g, &perm)?;
    let outs = dims[axis];
    let rows: u64 = dims.iter().product::<u64>() / outs.max(1);
    let n = taps.first().map_or(0, Vec::len) as u64;
    let flat = e.reshape(moved, &[rows, outs, 1])?;
    let flat = e.broadcast_to(flat, &[rows, outs, n])?;
    let w: Vec<f64> = taps.iter().flat_map(|t| t.iter().map(|p| p.1)).collect();
    let w = float_vector(e, dt, &w)?;
    let w = e.reshape(w, &[outs, n])?;
    let w = e.broadcast_to(w, &[rows, outs, n])?;
    let upd = e.mul(flat, w)?;
    let upd = e.reshape(upd, &[rows, outs * n])?;
    let at: Vec<i64> = taps.iter().flat_map(|t| t.iter().map(|p| p.0)).collect();
    let idx = i64_vector(e, &at)?;
    let idx = e.broadcast_to(idx, &[rows, outs * n])?;
    let zeros = e.full(dt, &[rows, input], 0.0)?;
    let acc = scatter_add_rows(e, zeros, idx, upd)?;
    let mut moved_dims: Vec<u64> = perm.iter().map(|&k| dims[k]).collect();
    moved_dims[rank - 1] = input;
    let acc = e.reshape(acc, &moved_dims)?;
    let mut back = vec![0; rank];
    for (k, &p) in perm.iter().enumerate() {
        back[p] = k;
    }
    e.transpose(acc, &back)
}

/// The interpolations that read a fixed count of taps per dim.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Interp {
    Linear,
    Cubic,
}

impl Interp {
    fn name(self) -> &'static str {
        match self {
            Interp::Linear => "linear upsampling",
            Interp::Cubic => "cubic upsampling",
        }
    }

    /// Dim `d`'s taps for a tensor of `dt` computed at `cd`. torch keeps
    /// the weights in the tensor's dtype, so bf16 and f16 ones are rounded
    /// to it.
    fn taps(self, r: &Resize, d: usize, align: bool, cd: DType, dt: DType) -> Taps {
        let ar = Arith::of(cd);
        let mut taps = match self {
            Interp::Linear => r.linear(d, align, ar),
            Interp::Cubic => r.cubic(d, align, ar),
        };
        let round: fn(f64) -> f64 = match dt {
            DType::BF16 => |w| half::bf16::from_f64(w).to_f64(),
            DType::F16 => |w| half::f16::from_f64(w).to_f64(),
            _ => return taps,
        };
        for p in taps.iter_mut().flatten() {
            p.1 = round(p.1);
        }
        taps
    }
}

/// Linear or cubic upsampling's forward, computed at f32 for bf16 and f16.
fn interpolated(e: &mut Emitter, x: ValueId, a: &Attrs, kind: Interp) -> Result<Vec<ValueId>> {
    let dt = e.dtype(x);
    let cd = float_compute_dtype(e, x, kind.name())?;
    let r = Resize::of(&e.dims(x), a)?;
    let align = a.bool_or("align_corners", false)?;
    if r.lead.contains(&0) {
        return Ok(vec![e.full(dt, &r.out_dims(), 0.0)?]);
    }
    let taps: Vec<Taps> = (0..r.input.len())
        .map(|d| kind.taps(&r, d, align, cd, dt))
        .collect();
    let v = e.convert(x, cd)?;
    let y = interpolate(e, v, r.lead.len(), 0, &taps)?;
    Ok(vec![e.convert(y, dt)?])
}

/// upsample_linear(x; output_size, align_corners = false, scales = none)
/// -> linear (bilinear, trilinear) interpolation over the last
/// `output_size.len()` dims, computed at f32 for bf16 and f16.
fn upsample_linear(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    interpolated(e, x[0], a, Interp::Linear)
}

/// upsample_cubic(x; output_size, align_corners = false, scales = none)
/// -> cubic (bicubic, tricubic) interpolation over the last
/// `output_size.len()` dims: per dim the four sources around the source
/// position (clamped into the input) with Keys' weights, a = -0.75.
fn upsample_cubic(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    interpolated(e, x[0], a, Interp::Cubic)
}

/// Linear or cubic upsampling's backward: every output's grad times each
/// of its sources' weights (their product over the dims) added into that
/// source, in output order and, per output, its sources' order (at f32 for
/// bf16 and f16, rounded once).
fn interpolated_backward(
    e: &mut Emitter,
    grad: ValueId,
    a: &Attrs,
    kind: Interp,
) -> Result<Vec<ValueId>> {
    let dt = e.dtype(grad);
    let cd = float_compute_dtype(e, grad, kind.name())?;
    let r = Resize::of_backward(&e.dims(grad), a)?;
    let align = a.bool_or("align_corners", false)?;
    if r.lead.contains(&0) {
        return Ok(vec![e.full(dt, &r.in_dims(), 0.0)?]);
    }
    let per_dim: Vec<Taps> = (0..r.input.len())
        .map(|d| kind.taps(&r, d, align, cd, dt))
        .collect();
    let outputs: Vec<Vec<usize>> = per_dim.iter().map(|t| (0..t.len()).collect()).collect();
    let (mut at, mut weights) = (Vec::new(), Vec::new());
    let ar = Arith::of(cd);
    combine(&outputs, |ks| {
        // The corners of this output: one tap per dim, the last fastest.
        let corners: Vec<Vec<(i64, f64)>> = ks
            .iter()
            .enumerate()
            .map(|(d, &k)| per_dim[d][k].clone())
            .collect();
        combine(&corners, |c| {
            let pos: Vec<i64> = c.iter().map(|t| t.0).collect();
            at.push(flat_position(&r, &pos));
            weights.push(c.iter().fold(1.0, |p, t| ar.r(p * t.1)));
        });
    });
    let rows: u64 = r.lead.iter().product();
    let outs: u64 = r.output.iter().product();
    let corners: u64 = per_dim.iter().map(|t| t[0].len() as u64).product();
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

/// upsample_linear_backward(grad; input_size, output_size, align_corners,
/// scales) -> the grad of upsample_linear's input.
fn upsample_linear_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    interpolated_backward(e, x[0], a, Interp::Linear)
}

/// upsample_cubic_backward(grad; input_size, output_size, align_corners,
/// scales) -> the grad of upsample_cubic's input.
fn upsample_cubic_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    interpolated_backward(e, x[0], a, Interp::Cubic)
}

/// upsample_antialias(x; output_size, mode = "linear" | "cubic",
/// align_corners = false, scales = none) -> x resampled over the last
/// `output_size.len()` dims with the antialiasing filter, one dim at a
/// time (the last first, then from the last but one back; a dim whose
/// size does not change is left alone), at f32 for bf16 and f16.
fn upsample_antialias(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let filter = Filter::of(a)?;
    let dt = e.dtype(x[0]);
    let cd = float_compute_dtype(e, x[0], "antialiased upsampling")?;
    let r = Resize::of(&e.dims(x[0]), a)?;
    let align = a.bool_or("align_corners", false)?;
    if r.lead.contains(&0) {
        return Ok(vec![e.full(dt, &r.out_dims(), 0.0)?]);
    }
    let ar = Arith::of(cd);
    let mut v = e.convert(x[0], cd)?;
    for d in (0..r.input.len()).rev() {
        if r.input[d] != r.output[d] {
            let taps = r.antialias(d, filter, align, ar);
            v = resample_along(e, v, r.lead.len() + d, &taps)?;
        }
    }
    Ok(vec![e.convert(v, dt)?])
}

/// upsample_antialias_backward(grad; input_size, output_size, mode,
/// align_corners, scales) -> the grad of upsample_antialias's input: the
/// forward's passes transposed, in reverse order.
fn upsample_antialias_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let filter = Filter::of(a)?;
    let grad = x[0];
    let dt = e.dtype(grad);
    let cd = float_compute_dtype(e, grad, "antialiased upsampling")?;
    let r = Resize::of_backward(&e.dims(grad), a)?;
    let align = a.bool_or("align_corners", false)?;
    if r.lead.contains(&0) {
        return Ok(vec![e.full(dt, &r.in_dims(), 0.0)?]);
    }
    let ar = Arith::of(cd);
    let mut g = e.convert(grad, cd)?;
    for d in 0..r.input.len() {
        if r.input[d] != r.output[d] {
            let taps = r.antialias(d, filter, align, ar);
            g = spread_along(e, g, r.lead.len() + d, &taps, r.input[d])?;
        }
    }
    Ok(vec![e.convert(g, dt)?])
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
    def!("upsample_cubic", Arity::Exactly(1), upsample_cubic),
    def!(
        "upsample_cubic_backward",
        Arity::Exactly(1),
        upsample_cubic_backward
    ),
    def!("upsample_antialias", Arity::Exactly(1), upsample_antialias),
    def!(
        "upsample_antialias_backward",
        Arity::Exactly(1),
        upsample_antialias_backward
    ),
];
