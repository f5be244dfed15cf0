//! Convolutions: conv1d/conv2d/conv3d, aten's `convolution` (also
//! transposed) and `convolution_backward`, all from the Convolution
//! primitive.
//!
//! For y = conv(x, w) with stride s, padding p, dilation d and g groups:
//! - dx is a stride-1 convolution, dilation d, of dy with s - 1 zeros
//!   between elements and padded by d (k - 1) - p, by w with its spatial
//!   dims flipped and its in/out channels swapped within each group;
//! - dw is a convolution of x (channels and batch swapped, groups moved
//!   into the channels) by dy (likewise), with stride d and dilation s,
//!   cut to the kernel size;
//! - a transposed convolution is the dx of the convolution it transposes.

use super::attrs::{Attr, Attrs};
use super::emit::Emitter;
use super::support::{bool_mask, not_computed, spatial_list};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{Prim, ReduceOp, ValueId};

#[derive(Clone, Debug)]
struct Geometry {
    stride: Vec<u64>,
    padding: Vec<(u64, u64)>,
    dilation: Vec<u64>,
    groups: u64,
}

/// Stride, padding (ints, or "valid" / "same" where `allow_str`),
/// dilation and groups for `n` spatial dims of a kernel `kernel`.
fn geometry(a: &Attrs, n: usize, kernel: &[u64], allow_str: bool) -> Result<Geometry> {
    let stride = spatial_list(a, "stride", n, 1)?;
    let dilation = spatial_list(a, "dilation", n, 1)?;
    if stride.contains(&0) || dilation.contains(&0) {
        return Err(Error::invalid(format!(
            "stride {stride:?} and dilation {dilation:?} must be positive"
        )));
    }
    let groups = a.int_or("groups", 1)?;
    if groups < 1 {
        return Err(Error::invalid(format!(
            "groups must be positive, got {groups}"
        )));
    }
    let padding = match a.get("padding") {
        Some(Attr::Str(s)) if allow_str => match s.as_str() {
            "valid" => vec![(0, 0); n],
            "same" => {
                if stride.iter().any(|&s| s != 1) {
                    return Err(Error::invalid(
                        "padding='same' is not supported for strided convolutions",
                    ));
                }
                kernel
                    .iter()
                    .zip(&dilation)
                    .map(|(&k, &d)| {
                        let total = d * k.saturating_sub(1);
                        (total / 2, total - total / 2)
                    })
                    .collect()
            }
            other => {
                return Err(Error::invalid(format!(
                    "padding {other:?}; use \"valid\", \"same\" or a list of ints"
                )))
            }
        },
        _ => spatial_list(a, "padding", n, 0)?
            .into_iter()
            .map(|p| (p, p))
            .collect(),
    };
    Ok(Geometry {
        stride,
        padding,
        dilation,
        groups: groups as u64,
    })
}

/// Input and weight: float, one dtype, weight of the input's rank.
fn check_operands(e: &Emitter, x: ValueId, w: ValueId) -> Result<()> {
    let (xt, wt) = (e.ty(x), e.ty(w));
    if !xt.dtype.is_float() || xt.dtype != wt.dtype {
        return Err(Error::invalid(format!(
            "input type ({}) and weight type ({}) should be the same floating-point type",
            xt.dtype, wt.dtype
        )));
    }
    if xt.rank() < 3 || wt.rank() != xt.rank() {
        return Err(Error::invalid(format!(
            "expected a batched input [N, C, spatial...] and a weight of the same rank, got \
             input {:?} and weight {:?}",
            xt.dims, wt.dims
        )));
    }
    Ok(())
}

fn convolution_prim(e: &mut Emitter, x: ValueId, w: ValueId, g: &Geometry) -> Result<ValueId> {
    let (xd, wd) = (e.dims(x), e.dims(w));
    if xd[1] != wd[1] * g.groups || !wd[0].is_multiple_of(g.groups) {
        return Err(Error::invalid(format!(
            "weight of size {wd:?} with groups={} expects {} input channels and an output \
             channel count divisible by the groups, but the input {xd:?} has {} channels",
            g.groups,
            wd[1] * g.groups,
            xd[1]
        )));
    }
    for i in 0..xd.len() - 2 {
        let reach = g.dilation[i] * (wd[2 + i].max(1) - 1) + 1;
        if xd[2 + i] + g.padding[i].0 + g.padding[i].1 < reach {
            return Err(Error::invalid(format!(
                "kernel size {:?} (dilated) is larger than the padded input {xd:?} in spatial \
                 dimension {i}",
                &wd[2..]
            )));
        }
    }
    let precision = e.product_precision(e.dtype(x));
    e.op(
        Prim::Convolution {
            stride: g.stride.clone(),
            padding: g.padding.clone(),
            dilation: g.dilation.clone(),
            groups: g.groups,
            precision,
        },
        &[x, w],
    )
}

fn add_bias(e: &mut Emitter, y: ValueId, bias: Option<ValueId>) -> Result<ValueId> {
    let Some(b) = bias else { return Ok(y) };
    let yd = e.dims(y);
    if e.dims(b) != [yd[1]] {
        return Err(Error::invalid(format!(
            "bias of shape {:?} does not match {} output channels",
            e.dims(b),
            yd[1]
        )));
    }
    let mut shape = vec![1u64; yd.len()];
    shape[1] = yd[1];
    let b = e.convert(b, e.dtype(y))?;
    let b = e.reshape(b, &shape)?;
    e.add(y, b)
}

/// dx of y = conv(x, w): dy [N, O, Lo...], w [O, C/g, k...] -> [N, C, in...].
fn input_grad(
    e: &mut Emitter,
    dy: ValueId,
    w: ValueId,
    in_sizes: &[u64],
    g: &Geometry,
) -> Result<ValueId> {
    let (yd, wd) = (e.dims(dy), e.dims(w));
    let n = wd.len() - 2;
    let (o, cg) = (wd[0], wd[1]);
    if yd[1] != o || !o.is_multiple_of(g.groups) {
        return Err(Error::invalid(format!(
            "gradient {yd:?} and weight {wd:?} do not agree on {o} output channels in {} groups",
            g.groups
        )));
    }
    let og = o / g.groups;
    // w [g, Og, Cg, k...] -> [g, Cg, Og, k...] -> [g * Cg, Og, k...], flipped.
    let mut split = vec![g.groups, og, cg];
    split.extend(&wd[2..]);
    let wv = e.reshape(w, &split)?;
    let perm: Vec<usize> = [0, 2, 1].into_iter().chain(3..3 + n).collect();
    let wv = e.transpose(wv, &perm)?;
    let mut merged = vec![g.groups * cg, og];
    merged.extend(&wd[2..]);
    let wv = e.reshape(wv, &merged)?;
    let wv = e.op(
        Prim::Reverse {
            dimensions: (2..2 + n).collect(),
        },
        &[wv],
    )?;
    let (mut low, mut high, mut interior) = (vec![0i64; 2], vec![0i64; 2], vec![0u64; 2]);
    for i in 0..n {
        let reach = (g.dilation[i] * wd[2 + i].saturating_sub(1)) as i64;
        let lo = yd[2 + i];
        let dilated = if lo == 0 {
            0
        } else {
            ((lo - 1) * g.stride[i] + 1) as i64
        };
        let l = reach - g.padding[i].0 as i64;
        low.push(l);
        high.push(in_sizes[i] as i64 + reach - l - dilated);
        interior.push(g.stride[i] - 1);
    }
    let zero = e.scalar(e.dtype(dy), 0.0)?;
    let padded = e.op(
        Prim::Pad {
            low,
            high,
            interior,
        },
        &[dy, zero],
    )?;
    let unit = Geometry {
        stride: vec![1; n],
        padding: vec![(0, 0); n],
        dilation: g.dilation.clone(),
        groups: g.groups,
    };
    convolution_prim(e, padded, wv, &unit)
}

/// dw of y = conv(x, w): x [N, C, in...], dy [N, O, Lo...] -> [O, C/g, k...].
fn weight_grad(
    e: &mut Emitter,
    x: ValueId,
    dy: ValueId,
    kernel: &[u64],
    g: &Geometry,
) -> Result<ValueId> {
    let (xd, yd) = (e.dims(x), e.dims(dy));
    let n = xd.len() - 2;
    let (batch, c, o) = (xd[0], xd[1], yd[1]);
    let groups = g.groups;
    if !c.is_multiple_of(groups) || !o.is_multiple_of(groups) {
        return Err(Error::invalid(format!(
            "channels of input {xd:?} and gradient {yd:?} do not split into {groups} groups"
        )));
    }
    let (cg, og) = (c / groups, o / groups);
    let tail: Vec<usize> = (3..3 + n).collect();
    // x [N, g, Cg, in...] -> [Cg, g, N, in...] -> [Cg, g * N, in...]
    let mut split = vec![batch, groups, cg];
    split.extend(&xd[2..]);
    let xv = e.reshape(x, &split)?;
    let perm: Vec<usize> = [2, 1, 0].into_iter().chain(tail.iter().copied()).collect();
    let xv = e.transpose(xv, &perm)?;
    let mut merged = vec![cg, groups * batch];
    merged.extend(&xd[2..]);
    let xv = e.reshape(xv, &merged)?;
    // dy [N, g, Og, Lo...] -> [g, Og, N, Lo...] -> [g * Og, N, Lo...]
    let mut split = vec![batch, groups, og];
    split.extend(&yd[2..]);
    let yv = e.reshape(dy, &split)?;
    let perm: Vec<usize> = [1, 2, 0].into_iter().chain(tail).collect();
    let yv = e.transpose(yv, &perm)?;
    let mut merged = vec![groups * og, batch];
    merged.extend(&yd[2..]);
    let yv = e.reshape(yv, &merged)?;
    let swapped = Geometry {
        stride: g.dilation.clone(),
        padding: g.padding.clone(),
        dilation: g.stride.clone(),
        groups,
    };
    let r = convolution_prim(e, xv, yv, &swapped)?;
    // [Cg, O, K'...] cut to the kernel, then [O, Cg, k...].
    let rd = e.dims(r);
    let mut limit = rd.clone();
    limit[2..].copy_from_slice(kernel);
    let r = if rd[2..] != *kernel {
        e.op(
            Prim::Slice {
                start: vec![0; rd.len()],
                limit,
                stride: vec![1; rd.len()],
            },
            &[r],
        )?
    } else {
        r
    };
    let perm: Vec<usize> = [1, 0].into_iter().chain(2..2 + n).collect();
    e.transpose(r, &perm)
}

/// Output sizes of a transposed convolution of spatial sizes `input`.
fn transposed_sizes(
    input: &[u64],
    kernel: &[u64],
    g: &Geometry,
    output_padding: &[u64],
) -> Result<Vec<u64>> {
    (0..input.len())
        .map(|i| {
            if output_padding[i] >= g.stride[i].max(g.dilation[i]) {
                return Err(Error::invalid(format!(
                    "output_padding {output_padding:?} must be smaller than the stride or the \
                     dilation"
                )));
            }
            let size = (input[i].saturating_sub(1) * g.stride[i]) as i64
                - (g.padding[i].0 + g.padding[i].1) as i64
                + (g.dilation[i] * kernel[i].saturating_sub(1)) as i64
                + output_padding[i] as i64
                + 1;
            u64::try_from(size)
                .ok()
                .filter(|&s| s > 0 && input[i] > 0)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "transposed convolution of spatial sizes {input:?} gives a non-positive \
                         output size in dimension {i}"
                    ))
                })
        })
        .collect()
}

/// Shared forward: unbatched inputs get a batch dim of 1 and lose it again.
fn forward(
    e: &mut Emitter,
    x: &[ValueId],
    a: &Attrs,
    spatial: Option<usize>,
    allow_str: bool,
) -> Result<Vec<ValueId>> {
    let (input, w) = (x[0], x[1]);
    let n = match spatial {
        Some(n) => n,
        None => e.rank(w).checked_sub(2).filter(|&n| n > 0).ok_or_else(|| {
            Error::invalid(format!("weight needs rank 3 or more, got {:?}", e.dims(w)))
        })?,
    };
    if e.rank(w) != n + 2 {
        return Err(Error::invalid(format!(
            "weight must be [out, in/groups, {n} kernel dims], got {:?}",
            e.dims(w)
        )));
    }
    let unbatched = e.rank(input) == n + 1;
    let input = if unbatched {
        super::support::unsqueeze(e, input, 0)?
    } else {
        input
    };
    if e.rank(input) != n + 2 {
        return Err(Error::invalid(format!(
            "expected a {}-D (unbatched) or {}-D (batched) input, got {:?}",
            n + 1,
            n + 2,
            e.dims(input)
        )));
    }
    check_operands(e, input, w)?;
    let wd = e.dims(w);
    let g = geometry(a, n, &wd[2..], allow_str)?;
    let y = if a.bool_or("transposed", false)? {
        let op = spatial_list(a, "output_padding", n, 0)?;
        if !wd[0].is_multiple_of(g.groups) {
            return Err(Error::invalid(format!(
                "weight {wd:?} of a transposed convolution needs input channels divisible by \
                 groups={}",
                g.groups
            )));
        }
        let sizes = transposed_sizes(&e.dims(input)[2..], &wd[2..], &g, &op)?;
        let y = input_grad(e, input, w, &sizes, &g)?;
        let yd = e.dims(y);
        let out_channels = yd[1];
        let mut y = y;
        if let Some(&b) = x.get(2) {
            if e.dims(b) != [out_channels] {
                return Err(Error::invalid(format!(
                    "bias of shape {:?} does not match {out_channels} output channels",
                    e.dims(b)
                )));
            }
            y = add_bias(e, y, Some(b))?;
        }
        y
    } else {
        let y = convolution_prim(e, input, w, &g)?;
        add_bias(e, y, x.get(2).copied())?
    };
    if unbatched {
        let mut d = e.dims(y);
        d.remove(0);
        return Ok(vec![e.reshape(y, &d)?]);
    }
    Ok(vec![y])
}

/// conv1d(input [N, C, L] or [C, L], weight [O, C/groups, k], bias? [O];
/// stride, padding (ints, "valid" or "same"), dilation, groups).
fn conv1d(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    forward(e, x, &no_transpose(a)?, Some(1), true)
}
fn conv2d(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    forward(e, x, &no_transpose(a)?, Some(2), true)
}
fn conv3d(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    forward(e, x, &no_transpose(a)?, Some(3), true)
}

fn no_transpose(a: &Attrs) -> Result<Attrs> {
    if a.bool_or("transposed", false)? {
        return Err(Error::invalid(
            "use convolution with transposed=true for a transposed convolution",
        ));
    }
    Ok(a.clone())
}

/// aten convolution(input, weight, bias?; stride, padding, dilation,
/// transposed=false, output_padding, groups): the rank of weight gives the
/// spatial dims; a transposed weight is [in, out/groups, k...].
fn convolution(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    forward(e, x, a, None, false)
}

/// convolution_backward(grad_out, input, weight; stride, padding,
/// dilation, transposed=false, output_padding, groups, output_mask=[true;3])
/// -> (dinput, dweight, dbias [O]); masked-off outputs are zero-element.
fn convolution_backward(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (dy, input, w) = (x[0], x[1], x[2]);
    check_operands(e, input, w)?;
    let dt = e.dtype(input);
    let dy = e.convert(dy, dt)?;
    let (xd, wd, yd) = (e.dims(input), e.dims(w), e.dims(dy));
    let n = xd.len() - 2;
    let g = geometry(a, n, &wd[2..], false)?;
    let mask = bool_mask(a, "output_mask", 3)?;
    let transposed = a.bool_or("transposed", false)?;
    // Check grad_out's shape against the forward's output.
    let want = if transposed {
        let op = spatial_list(a, "output_padding", n, 0)?;
        let mut d = vec![xd[0], wd[1] * g.groups];
        d.extend(transposed_sizes(&xd[2..], &wd[2..], &g, &op)?);
        d
    } else {
        let mut d = vec![xd[0], wd[0]];
        for i in 0..n {
            let reach = g.dilation[i] * (wd[2 + i].max(1) - 1) + 1;
            let padded = xd[2 + i] + g.padding[i].0 + g.padding[i].1;
            d.push(padded.saturating_sub(reach) / g.stride[i] + 1);
        }
        d
    };
    if yd != want {
        return Err(Error::invalid(format!(
            "grad_output of shape {yd:?} does not match the convolution's output {want:?}"
        )));
    }
    let dx = if !mask[0] {
        not_computed(e, dt)?
    } else if transposed {
        convolution_prim(e, dy, w, &g)?
    } else {
        input_grad(e, dy, w, &xd[2..], &g)?
    };
    let dw = if !mask[1] {
        not_computed(e, dt)?
    } else if transposed {
        weight_grad(e, dy, input, &wd[2..], &g)?
    } else {
        weight_grad(e, input, dy, &wd[2..], &g)?
    };
    let db = if mask[2] {
        let dims: Vec<usize> = (0..yd.len()).filter(|&d| d != 1).collect();
        e.reduce(ReduceOp::Sum, dy, &dims, false)?
    } else {
        not_computed(e, dt)?
    };
    Ok(vec![dx, dw, db])
}

pub(super) const OPS: &[OpDef] = &[
    def!("conv1d", Arity::Between(2, 3), conv1d),
    def!("conv2d", Arity::Between(2, 3), conv2d),
    def!("conv3d", Arity::Between(2, 3), conv3d),
    def!("convolution", Arity::Between(2, 3), convolution),
    def!(
        "convolution_backward",
        Arity::Exactly(3),
        convolution_backward
    ),
];
