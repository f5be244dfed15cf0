//! Grid sampling (F.grid_sample over 2-D images): grid_sampler_2d and its
//! backward, bilinear and nearest, with zeros, border and reflection
//! padding, as torch's kernels compute them.
//!
//! A grid point (x, y) in [-1, 1] maps to input column and row
//! ((v + 1) / 2) * (size - 1) with align_corners, else
//! ((v + 1) * size - 1) / 2. Border padding clips the position to the
//! image; reflection reflects it about the image's edges (its corner
//! pixels' centres with align_corners, else their outer edges), then
//! clips. Bilinear reads the four pixels around the position, nearest the
//! one at the position rounded half to even; a pixel outside the image
//! reads zero.

use super::attrs::Attrs;
use super::emit::Emitter;
use super::support::float_compute_dtype;
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, Prim, ReduceOp, ScatterCombiner, UnaryOp, ValueId};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

/// The sampling: input [N, C, H, W], grid [N, Ho, Wo, 2].
struct Sampling {
    n: u64,
    c: u64,
    h: u64,
    w: u64,
    ho: u64,
    wo: u64,
    bilinear: bool,
    padding: Padding,
    align_corners: bool,
    /// The compute dtype (f32 for bf16 and f16).
    cd: DType,
}

impl Sampling {
    fn of(e: &Emitter, input: ValueId, grid: ValueId, a: &Attrs) -> Result<Self> {
        let (it, gt) = (e.ty(input), e.ty(grid));
        if it.rank() != 4 || gt.rank() != 4 || gt.dims[3] != 2 || gt.dims[0] != it.dims[0] {
            return Err(Error::invalid(format!(
                "expected input [N, C, H, W] and grid [N, H_out, W_out, 2] of one batch, got \
                 {it} and {gt}"
            )));
        }
        if it.dtype != gt.dtype {
            return Err(Error::invalid(format!(
                "expected input and grid to have the same dtype, got {} and {}",
                it.dtype, gt.dtype
            )));
        }
        let cd = float_compute_dtype(e, input, "grid sampling")?;
        let bilinear = match a.int_or("interpolation_mode", 0)? {
            0 => true,
            1 => false,
            2 => {
                return Err(Error::Unimplemented(
                    "bicubic interpolation has no kernel here".into(),
                ))
            }
            m => {
                return Err(Error::invalid(format!(
                    "interpolation_mode {m}: use 0 (bilinear), 1 (nearest) or 2 (bicubic)"
                )))
            }
        };
        let padding = match a.int_or("padding_mode", 0)? {
            0 => Padding::Zeros,
            1 => Padding::Border,
            2 => Padding::Reflection,
            m => {
                return Err(Error::invalid(format!(
                    "padding_mode {m}: use 0 (zeros), 1 (border) or 2 (reflection)"
                )))
            }
        };
        Ok(Sampling {
            n: it.dims[0],
            c: it.dims[1],
            h: it.dims[2],
            w: it.dims[3],
            ho: gt.dims[1],
            wo: gt.dims[2],
            bilinear,
            padding,
            align_corners: a.bool_or("align_corners", false)?,
            cd,
        })
    }

    /// Grid points per image.
    fn points(&self) -> u64 {
        self.ho * self.wo
    }

    /// One grid coordinate (`axis` 0: x, 1: y) of every point as [N, L],
    /// mapped to the input's pixel positions along a dim of `size`, and
    /// the derivative of that map (the padding's included).
    fn position(
        &self,
        e: &mut Emitter,
        grid: ValueId,
        axis: u64,
        size: u64,
    ) -> Result<(ValueId, ValueId)> {
        let l = self.points();
        let g = e.op(
            Prim::Slice {
                start: vec![0, 0, 0, axis],
                limit: vec![self.n, self.ho, self.wo, axis + 1],
                stride: vec![1; 4],
            },
            &[grid],
        )?;
        let g = e.reshape(g, &[self.n, l])?;
        let g = e.convert(g, self.cd)?;
        let s = size as f64;
        // Unnormalize: align_corners ((g + 1) / 2) (s - 1), else ((g + 1) s - 1) / 2.
        let one = e.binary_scalar(BinaryOp::Add, g, 1.0)?;
        let (pos, scale) = if self.align_corners {
            let half = e.binary_scalar(BinaryOp::Div, one, 2.0)?;
            (
                e.binary_scalar(BinaryOp::Mul, half, s - 1.0)?,
                (s - 1.0) / 2.0,
            )
        } else {
            let t = e.binary_scalar(BinaryOp::Mul, one, s)?;
            let t = e.binary_scalar(BinaryOp::Sub, t, 1.0)?;
            (e.binary_scalar(BinaryOp::Div, t, 2.0)?, s / 2.0)
        };
        let mut grad = e.full(self.cd, &[self.n, l], scale)?;
        let pos = match self.padding {
            Padding::Zeros => pos,
            Padding::Border => self.clip(e, pos, size, &mut grad)?,
            Padding::Reflection => {
                let r = if self.align_corners {
                    self.reflect(e, pos, 0, 2 * size as i64 - 2, &mut grad)?
                } else {
                    self.reflect(e, pos, -1, 2 * size as i64 - 1, &mut grad)?
                };
                self.clip(e, r, size, &mut grad)?
            }
        };
        Ok((pos, grad))
    }

    /// min(size - 1, max(v, 0)); the derivative is 0 at or past either end.
    fn clip(&self, e: &mut Emitter, v: ValueId, size: u64, grad: &mut ValueId) -> Result<ValueId> {
        let top = (size - 1) as f64;
        let lo = e.full_like(v, 0.0)?;
        let hi = e.full_like(v, top)?;
        let above = e.compare(CompareOp::Gt, v, lo)?;
        let below = e.compare(CompareOp::Lt, v, hi)?;
        let inside = e.binary(BinaryOp::And, above, below)?;
        let zero = e.full_like(v, 0.0)?;
        *grad = e.select(inside, *grad, zero)?;
        let v = e.max(v, lo)?;
        e.min(v, hi)
    }

    /// v reflected into [low / 2, high / 2] (torch's reflect_coordinates),
    /// and the derivative's sign.
    fn reflect(
        &self,
        e: &mut Emitter,
        v: ValueId,
        low: i64,
        high: i64,
        grad: &mut ValueId,
    ) -> Result<ValueId> {
        if low == high {
            *grad = e.full_like(v, 0.0)?;
            return e.full_like(v, 0.0);
        }
        let min = low as f64 / 2.0;
        let span = (high - low) as f64 / 2.0;
        let d = e.binary_scalar(BinaryOp::Sub, v, min)?;
        let zero = e.full_like(d, 0.0)?;
        let neg = e.compare(CompareOp::Lt, d, zero)?;
        let a = e.unary(UnaryOp::Abs, d)?;
        let extra = e.binary_scalar(BinaryOp::Rem, a, span)?;
        let q = e.binary_scalar(BinaryOp::Div, a, span)?;
        let flips = e.unary(UnaryOp::Floor, q)?;
        let half = e.binary_scalar(BinaryOp::Mul, flips, 0.5)?;
        let half_floor = e.unary(UnaryOp::Floor, half)?;
        let odd = e.compare(CompareOp::Ne, half, half_floor)?;
        let straight = e.binary_scalar(BinaryOp::Add, extra, min)?;
        let back = e.binary_scalar(BinaryOp::Sub, extra, span + min)?;
        let back = e.unary(UnaryOp::Neg, back)?;
        // The sign: -1 when below min, flipped again on an odd flip count.
        let flip = e.binary(BinaryOp::Xor, neg, odd)?;
        let minus = e.unary(UnaryOp::Neg, *grad)?;
        *grad = e.select(flip, minus, *grad)?;
        e.select(odd, back, straight)
    }
}

/// The input's pixels at integer positions (x, y) ([N, L] in the compute
/// dtype) as [N, C, L], zero outside the image; with the flat index
/// ([N, C, L], clamped into the image) and the in-image mask ([N, L]).
fn pixels(
    e: &mut Emitter,
    s: &Sampling,
    flat_input: ValueId,
    x: ValueId,
    y: ValueId,
) -> Result<(ValueId, ValueId, ValueId)> {
    let l = s.points();
    let inside_dim = |e: &mut Emitter, v: ValueId, size: u64| -> Result<ValueId> {
        let lo = e.full_like(v, 0.0)?;
        let hi = e.full_like(v, (size - 1) as f64)?;
        let a = e.compare(CompareOp::Ge, v, lo)?;
        let b = e.compare(CompareOp::Le, v, hi)?;
        e.binary(BinaryOp::And, a, b)
    };
    let ix = inside_dim(e, x, s.w)?;
    let iy = inside_dim(e, y, s.h)?;
    let inside = e.binary(BinaryOp::And, ix, iy)?;
    let xi = e.convert(x, DType::I64)?;
    let yi = e.convert(y, DType::I64)?;
    let row = e.binary_scalar(BinaryOp::Mul, yi, s.w as f64)?;
    let at = e.add(row, xi)?;
    let zero = e.full(DType::I64, &[s.n, l], 0.0)?;
    let at = e.select(inside, at, zero)?;
    let at = e.reshape(at, &[s.n, 1, l])?;
    let at = e.broadcast_to(at, &[s.n, s.c, l])?;
    let v = e.op(Prim::Gather { axis: 2 }, &[flat_input, at])?;
    let m = e.reshape(inside, &[s.n, 1, l])?;
    let zeros = e.full(s.cd, &[s.n, s.c, l], 0.0)?;
    let v = e.select(m, v, zeros)?;
    Ok((v, at, inside))
}

/// The bilinear corners of positions (x, y): the floors, and the weights
/// of the four pixels nw, ne, sw, se with the distances they come from.
struct Corners {
    x0: ValueId,
    y0: ValueId,
    x1: ValueId,
    y1: ValueId,
    /// x - x0, x1 - x, y - y0, y1 - y.
    dx0: ValueId,
    dx1: ValueId,
    dy0: ValueId,
    dy1: ValueId,
}

fn corners(e: &mut Emitter, x: ValueId, y: ValueId) -> Result<Corners> {
    let x0 = e.unary(UnaryOp::Floor, x)?;
    let y0 = e.unary(UnaryOp::Floor, y)?;
    let x1 = e.binary_scalar(BinaryOp::Add, x0, 1.0)?;
    let y1 = e.binary_scalar(BinaryOp::Add, y0, 1.0)?;
    Ok(Corners {
        dx0: e.sub(x, x0)?,
        dx1: e.sub(x1, x)?,
        dy0: e.sub(y, y0)?,
        dy1: e.sub(y1, y)?,
        x0,
        y0,
        x1,
        y1,
    })
}

/// [N, L] weights as [N, C, L].
fn per_channel(e: &mut Emitter, s: &Sampling, v: ValueId) -> Result<ValueId> {
    let v = e.reshape(v, &[s.n, 1, s.points()])?;
    e.broadcast_to(v, &[s.n, s.c, s.points()])
}

/// The four taps (x, y, weight) of bilinear sampling in torch's order.
fn taps(e: &mut Emitter, k: &Corners) -> Result<[(ValueId, ValueId, ValueId); 4]> {
    Ok([
        (k.x0, k.y0, e.mul(k.dx1, k.dy1)?),
        (k.x1, k.y0, e.mul(k.dx0, k.dy1)?),
        (k.x0, k.y1, e.mul(k.dx1, k.dy0)?),
        (k.x1, k.y1, e.mul(k.dx0, k.dy0)?),
    ])
}

/// grid_sampler_2d(input [N, C, H, W], grid [N, Ho, Wo, 2];
/// interpolation_mode = 0 (bilinear) | 1 (nearest), padding_mode = 0
/// (zeros) | 1 (border) | 2 (reflection), align_corners) -> [N, C, Ho, Wo].
fn grid_sampler_2d(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let s = Sampling::of(e, x[0], x[1], a)?;
    let dt = e.dtype(x[0]);
    let out = [s.n, s.c, s.ho, s.wo];
    if out.contains(&0) || s.h * s.w == 0 {
        return Ok(vec![e.full(dt, &out, 0.0)?]);
    }
    let flat = e.convert(x[0], s.cd)?;
    let flat = e.reshape(flat, &[s.n, s.c, s.h * s.w])?;
    let (px, _) = s.position(e, x[1], 0, s.w)?;
    let (py, _) = s.position(e, x[1], 1, s.h)?;
    let r = if s.bilinear {
        let k = corners(e, px, py)?;
        let mut acc: Option<ValueId> = None;
        for (tx, ty, w) in taps(e, &k)? {
            let (v, _, _) = pixels(e, &s, flat, tx, ty)?;
            let w = per_channel(e, &s, w)?;
            let term = e.mul(v, w)?;
            acc = Some(match acc {
                None => term,
                Some(p) => e.add(p, term)?,
            });
        }
        acc.expect("four taps")
    } else {
        let rx = e.unary(UnaryOp::Round, px)?;
        let ry = e.unary(UnaryOp::Round, py)?;
        pixels(e, &s, flat, rx, ry)?.0
    };
    let r = e.reshape(r, &out)?;
    Ok(vec![e.convert(r, dt)?])
}

/// grid_sampler_2d_backward(grad [N, C, Ho, Wo], input, grid; the
/// forward's attributes) -> (input's gradient, grid's gradient): each
/// output's grad added into the pixels it read with their weights, and
/// per grid point the weights' derivatives against the pixels read,
/// summed over channels, through the position map (nearest: zero).
fn grid_sampler_2d_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (grad, input, grid) = (x[0], x[1], x[2]);
    let s = Sampling::of(e, input, grid, a)?;
    let (dt, gdt) = (e.dtype(input), e.dtype(grid));
    let out = vec![s.n, s.c, s.ho, s.wo];
    if e.dims(grad) != out {
        return Err(Error::invalid(format!(
            "grad {} must have the sampled shape {out:?}",
            e.ty(grad)
        )));
    }
    let in_dims = e.dims(input);
    let grid_dims = e.dims(grid);
    if out.contains(&0) || s.h * s.w == 0 {
        return Ok(vec![
            e.full(dt, &in_dims, 0.0)?,
            e.full(gdt, &grid_dims, 0.0)?,
        ]);
    }
    let l = s.points();
    let hw = s.h * s.w;
    let flat = e.convert(input, s.cd)?;
    let flat = e.reshape(flat, &[s.n, s.c, hw])?;
    let g = e.convert(grad, s.cd)?;
    let g = e.reshape(g, &[s.n, s.c, l])?;
    let (px, mx) = s.position(e, grid, 0, s.w)?;
    let (py, my) = s.position(e, grid, 1, s.h)?;
    let zeros = e.full(s.cd, &[s.n, s.c, hw], 0.0)?;
    let scatter = |e: &mut Emitter, acc: ValueId, at: ValueId, upd: ValueId| {
        e.op(
            Prim::Scatter {
                axis: 2,
                combiner: ScatterCombiner::Add,
            },
            &[acc, at, upd],
        )
    };
    let mut gin = zeros;
    let grid_grad = if s.bilinear {
        let k = corners(e, px, py)?;
        let mut gx: Option<ValueId> = None;
        let mut gy: Option<ValueId> = None;
        // d weight / dx and / dy of each tap: nw (-dy1, -dx1), ne (dy1,
        // -dx0), sw (-dy0, dx1), se (dy0, dx0).
        let signs = [(-1.0, -1.0), (1.0, -1.0), (-1.0, 1.0), (1.0, 1.0)];
        let ddx = [k.dy1, k.dy1, k.dy0, k.dy0];
        let ddy = [k.dx1, k.dx0, k.dx1, k.dx0];
        for (t, (tx, ty, w)) in taps(e, &k)?.into_iter().enumerate() {
            let (v, at, inside) = pixels(e, &s, flat, tx, ty)?;
            let wz = e.full_like(w, 0.0)?;
            let w = e.select(inside, w, wz)?;
            let wc = per_channel(e, &s, w)?;
            let upd = e.mul(g, wc)?;
            gin = scatter(e, gin, at, upd)?;
            // Sum over channels of v * grad, then the weight's slopes.
            let vg = e.mul(v, g)?;
            let vg = e.reduce(ReduceOp::Sum, vg, &[1], false)?;
            let sx = e.mul(vg, ddx[t])?;
            let sy = e.mul(vg, ddy[t])?;
            let sx = e.binary_scalar(BinaryOp::Mul, sx, signs[t].0)?;
            let sy = e.binary_scalar(BinaryOp::Mul, sy, signs[t].1)?;
            gx = Some(match gx {
                None => sx,
                Some(p) => e.add(p, sx)?,
            });
            gy = Some(match gy {
                None => sy,
                Some(p) => e.add(p, sy)?,
            });
        }
        let gx = e.mul(gx.expect("taps"), mx)?;
        let gy = e.mul(gy.expect("taps"), my)?;
        let gx = e.reshape(gx, &[s.n, s.ho, s.wo, 1])?;
        let gy = e.reshape(gy, &[s.n, s.ho, s.wo, 1])?;
        e.op(Prim::Concatenate { dimension: 3 }, &[gx, gy])?
    } else {
        let rx = e.unary(UnaryOp::Round, px)?;
        let ry = e.unary(UnaryOp::Round, py)?;
        let (_, at, inside) = pixels(e, &s, flat, rx, ry)?;
        let m = per_channel(e, &s, inside)?;
        let gz = e.full_like(g, 0.0)?;
        let upd = e.select(m, g, gz)?;
        gin = scatter(e, gin, at, upd)?;
        e.full(s.cd, &grid_dims, 0.0)?
    };
    let gin = e.reshape(gin, &in_dims)?;
    Ok(vec![e.convert(gin, dt)?, e.convert(grid_grad, gdt)?])
}

pub(super) const OPS: &[OpDef] = &[
    def!("grid_sampler_2d", Arity::Exactly(2), grid_sampler_2d),
    def!(
        "grid_sampler_2d_backward",
        Arity::Exactly(3),
        grid_sampler_2d_backward
    ),
];
