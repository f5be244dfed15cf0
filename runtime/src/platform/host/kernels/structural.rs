//! Structural kernels: broadcast, transpose, slices, pad, concatenate and
//! reverse. They only move elements, so each is written once over the
//! element size (1, 2, 4 or 8 bytes), never per dtype.
//!
//! Every op is phrased as one [`StridedCopy`]: a walk over an index space
//! with a source and a destination stride per dimension. The copy merges
//! dimensions that are contiguous in both, copies whole rows at once when
//! the innermost run is contiguous, and tiles the walk when a transpose
//! moves the contiguous dimension.

use super::{contiguous_strides, HostTensor};
use crate::error::{Error, Result};
use crate::ir::TensorType;

/// Side of the square tiles a transpose is copied in (elements).
const TRANSPOSE_TILE: usize = 32;

/// A strided copy in element units: for every multi-index `i` below
/// `dims`, `dst[dst_offset + i·dst_strides] = src[src_offset + i·src_strides]`.
#[derive(Clone, Debug)]
pub(crate) struct StridedCopy {
    /// Merged dimensions, none of size 1; `empty` when one was 0.
    dims: Vec<usize>,
    src_strides: Vec<isize>,
    dst_strides: Vec<isize>,
    src_offset: isize,
    dst_offset: isize,
    empty: bool,
}

impl StridedCopy {
    pub(crate) fn new(
        dims: &[usize],
        src_strides: &[isize],
        dst_strides: &[isize],
        src_offset: isize,
        dst_offset: isize,
    ) -> Self {
        let mut copy = StridedCopy {
            dims: Vec::with_capacity(dims.len()),
            src_strides: Vec::with_capacity(dims.len()),
            dst_strides: Vec::with_capacity(dims.len()),
            src_offset,
            dst_offset,
            empty: dims.contains(&0),
        };
        for ((&n, &s), &d) in dims.iter().zip(src_strides).zip(dst_strides) {
            if n == 1 {
                continue;
            }
            if let (Some(pn), Some(ps), Some(pd)) = (
                copy.dims.last_mut(),
                copy.src_strides.last_mut(),
                copy.dst_strides.last_mut(),
            ) {
                // The previous (outer) dimension steps over exactly one run
                // of this one in both tensors: fold them into one.
                if *ps == s * n as isize && *pd == d * n as isize {
                    *pn *= n;
                    *ps = s;
                    *pd = d;
                    continue;
                }
            }
            copy.dims.push(n);
            copy.src_strides.push(s);
            copy.dst_strides.push(d);
        }
        copy
    }

    /// Smallest and largest element position the walk touches.
    fn span(&self, offset: isize, strides: &[isize]) -> (isize, isize) {
        let (mut lo, mut hi) = (offset, offset);
        for (&n, &s) in self.dims.iter().zip(strides) {
            let reach = (n as isize - 1) * s;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
        (lo, hi)
    }

    /// Run over little-endian element bytes of `elem_size` bytes each. The
    /// whole walk is checked against both buffers first, so the copy
    /// itself cannot go out of bounds.
    pub(crate) fn run_bytes(&self, elem_size: usize, src: &[u8], dst: &mut [u8]) -> Result<()> {
        if self.empty {
            return Ok(());
        }
        let (slo, shi) = self.span(self.src_offset, &self.src_strides);
        let (dlo, dhi) = self.span(self.dst_offset, &self.dst_strides);
        let fits = |lo: isize, hi: isize, len: usize| lo >= 0 && (hi as usize) < len / elem_size;
        if elem_size == 0 || !fits(slo, shi, src.len()) || !fits(dlo, dhi, dst.len()) {
            return Err(Error::Internal(format!(
                "strided copy of {:?} reaches outside its buffers",
                self.dims
            )));
        }
        match elem_size {
            1 => self.run(src, dst),
            2 => self.run::<u16>(bytemuck::cast_slice(src), bytemuck::cast_slice_mut(dst)),
            4 => self.run::<u32>(bytemuck::cast_slice(src), bytemuck::cast_slice_mut(dst)),
            8 => self.run::<u64>(bytemuck::cast_slice(src), bytemuck::cast_slice_mut(dst)),
            _ => {
                return Err(Error::Internal(format!(
                    "no strided copy for {elem_size}-byte elements"
                )))
            }
        }
        Ok(())
    }

    /// Run over typed elements (the caller checked the span).
    fn run<T: Copy>(&self, src: &[T], dst: &mut [T]) {
        if self.empty {
            return;
        }
        let Some(last) = self.dims.len().checked_sub(1) else {
            dst[self.dst_offset as usize] = src[self.src_offset as usize];
            return;
        };
        let (n, ss, ds) = (
            self.dims[last],
            self.src_strides[last],
            self.dst_strides[last],
        );
        if ds == 1 && !matches!(ss, -1..=1) {
            // A transpose: the destination runs along a dimension the
            // source strides over. Tile it with the source's contiguous
            // dimension, if there is one, so both sides stay in cache.
            if let Some(k) = (0..last).rev().find(|&k| self.src_strides[k] == 1) {
                self.run_tiled(k, src, dst);
                return;
            }
        }
        for_each_offset(
            &self.dims[..last],
            &self.src_strides[..last],
            &self.dst_strides[..last],
            self.src_offset,
            self.dst_offset,
            |s, d| copy_run(src, s, ss, dst, d, ds, n),
        );
    }

    /// Copy dimension `k` (source-contiguous) against the last dimension
    /// (destination-contiguous) tile by tile. Each tile is read as
    /// contiguous source runs into a small buffer and written out as
    /// contiguous destination rows, so no cache line is revisited: with
    /// power-of-two strides the lines of a tile share one cache set, and a
    /// direct tiled loop thrashes it.
    fn run_tiled<T: Copy>(&self, k: usize, src: &[T], dst: &mut [T]) {
        const TILE: usize = TRANSPOSE_TILE;
        let last = self.dims.len() - 1;
        let outer: Vec<usize> = (0..last).filter(|&d| d != k).collect();
        let pick = |v: &[isize]| outer.iter().map(|&d| v[d]).collect::<Vec<isize>>();
        let outer_dims: Vec<usize> = outer.iter().map(|&d| self.dims[d]).collect();
        let (rows, dst_row_stride) = (self.dims[k], self.dst_strides[k]);
        let (cols, src_col_stride) = (self.dims[last], self.src_strides[last]);
        let mut tile = [src[self.src_offset as usize]; TILE * TILE];
        for_each_offset(
            &outer_dims,
            &pick(&self.src_strides),
            &pick(&self.dst_strides),
            self.src_offset,
            self.dst_offset,
            |s, d| {
                for r0 in (0..rows).step_by(TILE) {
                    let h = TILE.min(rows - r0);
                    for c0 in (0..cols).step_by(TILE) {
                        let w = TILE.min(cols - c0);
                        for c in 0..w {
                            let start =
                                (s + r0 as isize + (c0 + c) as isize * src_col_stride) as usize;
                            for (r, &v) in src[start..start + h].iter().enumerate() {
                                tile[r * TILE + c] = v;
                            }
                        }
                        for r in 0..h {
                            let start = (d + (r0 + r) as isize * dst_row_stride) as usize + c0;
                            dst[start..start + w].copy_from_slice(&tile[r * TILE..r * TILE + w]);
                        }
                    }
                }
            },
        );
    }
}

/// One innermost run of `n` elements.
fn copy_run<T: Copy>(src: &[T], s: isize, ss: isize, dst: &mut [T], d: isize, ds: isize, n: usize) {
    let (s0, d0) = (s as usize, d as usize);
    match (ss, ds) {
        (1, 1) => dst[d0..d0 + n].copy_from_slice(&src[s0..s0 + n]),
        (0, 1) => dst[d0..d0 + n].fill(src[s0]),
        (-1, 1) => {
            let out = &mut dst[d0..d0 + n];
            out.copy_from_slice(&src[s0 + 1 - n..=s0]);
            out.reverse();
        }
        (_, 1) => {
            for (j, o) in dst[d0..d0 + n].iter_mut().enumerate() {
                *o = src[(s + j as isize * ss) as usize];
            }
        }
        _ => {
            for j in 0..n as isize {
                dst[(d + j * ds) as usize] = src[(s + j * ss) as usize];
            }
        }
    }
}

/// Call `f(a, b)` for every multi-index `i` below `dims` in row-major
/// order, with `a = a0 + i·a_strides` and `b = b0 + i·b_strides`.
pub(super) fn for_each_offset(
    dims: &[usize],
    a_strides: &[isize],
    b_strides: &[isize],
    a0: isize,
    b0: isize,
    mut f: impl FnMut(isize, isize),
) {
    if dims.contains(&0) {
        return;
    }
    let mut index = vec![0usize; dims.len()];
    let (mut a, mut b) = (a0, b0);
    loop {
        f(a, b);
        let mut k = dims.len();
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            index[k] += 1;
            a += a_strides[k];
            b += b_strides[k];
            if index[k] < dims[k] {
                break;
            }
            index[k] = 0;
            a -= a_strides[k] * dims[k] as isize;
            b -= b_strides[k] * dims[k] as isize;
        }
    }
}

pub(super) fn to_usize(dims: &[u64]) -> Vec<usize> {
    dims.iter().map(|&d| d as usize).collect()
}

pub(super) fn signed_strides(dims: &[u64]) -> Vec<isize> {
    contiguous_strides(dims)
        .into_iter()
        .map(|s| s as isize)
        .collect()
}

/// The value of an i64 scalar operand (a start index).
fn scalar_i64(t: &HostTensor, what: &str) -> Result<i64> {
    match (t.dtype(), t.numel()) {
        (crate::ir::DType::I64, 1) => Ok(t.as_slice::<i64>()[0]),
        _ => Err(Error::invalid(format!(
            "{what} must be an i64 scalar, got {}",
            t.ty
        ))),
    }
}

/// Start indices clamped so a window of `window` fits into `dims`.
fn clamped_starts(starts: &[&HostTensor], dims: &[u64], window: &[u64]) -> Result<Vec<isize>> {
    if starts.len() != dims.len() || window.len() != dims.len() {
        return Err(Error::invalid(format!(
            "{} start indices for rank {}",
            starts.len(),
            dims.len()
        )));
    }
    starts
        .iter()
        .enumerate()
        .map(|(d, t)| {
            let v = scalar_i64(t, &format!("start index {d}"))?;
            let max = dims[d].saturating_sub(window[d]) as i64;
            Ok(v.clamp(0, max) as isize)
        })
        .collect()
}

/// `out` filled with the scalar `value`'s bytes.
fn filled(out: &TensorType, value: &[u8]) -> Result<HostTensor> {
    let mut t = HostTensor::zeros(out.clone());
    if value.len() != out.dtype.size() {
        return Err(Error::invalid(format!(
            "a fill value of {} bytes for {}",
            value.len(),
            out.dtype
        )));
    }
    if value.iter().all(|&b| b == 0) {
        return Ok(t);
    }
    let bytes = t.bytes_mut();
    match value.len() {
        1 => bytes.fill(value[0]),
        2 => bytemuck::cast_slice_mut::<u8, u16>(bytes)
            .fill(u16::from_le_bytes([value[0], value[1]])),
        4 => bytemuck::cast_slice_mut::<u8, u32>(bytes)
            .fill(u32::from_le_bytes(value.try_into().expect("4 bytes"))),
        _ => bytemuck::cast_slice_mut::<u8, u64>(bytes)
            .fill(u64::from_le_bytes(value.try_into().expect("8 bytes"))),
    }
    Ok(t)
}

pub fn broadcast_in_dim(x: &HostTensor, mapping: &[usize], out: &TensorType) -> Result<HostTensor> {
    let mut result = HostTensor::zeros(out.clone());
    let x_strides = signed_strides(x.dims());
    let mut src_strides = vec![0isize; out.rank()];
    for (i, &m) in mapping.iter().enumerate() {
        // A size-1 operand dimension repeats: stride 0.
        if x.dims()[i] != 1 {
            src_strides[m] = x_strides[i];
        }
    }
    StridedCopy::new(
        &to_usize(&out.dims),
        &src_strides,
        &signed_strides(&out.dims),
        0,
        0,
    )
    .run_bytes(x.dtype().size(), x.bytes(), result.bytes_mut())?;
    Ok(result)
}

pub fn transpose(x: &HostTensor, perm: &[usize], out: &TensorType) -> Result<HostTensor> {
    let mut result = HostTensor::zeros(out.clone());
    let x_strides = signed_strides(x.dims());
    let src_strides: Vec<isize> = perm.iter().map(|&p| x_strides[p]).collect();
    StridedCopy::new(
        &to_usize(&out.dims),
        &src_strides,
        &signed_strides(&out.dims),
        0,
        0,
    )
    .run_bytes(x.dtype().size(), x.bytes(), result.bytes_mut())?;
    Ok(result)
}

pub fn slice(
    x: &HostTensor,
    start: &[u64],
    stride: &[u64],
    out: &TensorType,
) -> Result<HostTensor> {
    let mut result = HostTensor::zeros(out.clone());
    let x_strides = signed_strides(x.dims());
    let offset: isize = start
        .iter()
        .zip(&x_strides)
        .map(|(&s, &xs)| s as isize * xs)
        .sum();
    let src_strides: Vec<isize> = stride
        .iter()
        .zip(&x_strides)
        .map(|(&s, &xs)| s as isize * xs)
        .collect();
    StridedCopy::new(
        &to_usize(&out.dims),
        &src_strides,
        &signed_strides(&out.dims),
        offset,
        0,
    )
    .run_bytes(x.dtype().size(), x.bytes(), result.bytes_mut())?;
    Ok(result)
}

pub fn dynamic_slice(
    x: &HostTensor,
    starts: &[&HostTensor],
    out: &TensorType,
) -> Result<HostTensor> {
    let mut result = HostTensor::zeros(out.clone());
    let starts = clamped_starts(starts, x.dims(), &out.dims)?;
    let x_strides = signed_strides(x.dims());
    let offset: isize = starts.iter().zip(&x_strides).map(|(&s, &xs)| s * xs).sum();
    StridedCopy::new(
        &to_usize(&out.dims),
        &x_strides,
        &signed_strides(&out.dims),
        offset,
        0,
    )
    .run_bytes(x.dtype().size(), x.bytes(), result.bytes_mut())?;
    Ok(result)
}

pub fn dynamic_update_slice(
    x: &HostTensor,
    update: &HostTensor,
    starts: &[&HostTensor],
) -> Result<HostTensor> {
    let mut result = x.clone();
    let starts = clamped_starts(starts, x.dims(), update.dims())?;
    let x_strides = signed_strides(x.dims());
    let offset: isize = starts.iter().zip(&x_strides).map(|(&s, &xs)| s * xs).sum();
    StridedCopy::new(
        &to_usize(update.dims()),
        &signed_strides(update.dims()),
        &x_strides,
        0,
        offset,
    )
    .run_bytes(x.dtype().size(), update.bytes(), result.bytes_mut())?;
    Ok(result)
}

pub fn pad(
    x: &HostTensor,
    value: &HostTensor,
    low: &[i64],
    interior: &[u64],
    out: &TensorType,
) -> Result<HostTensor> {
    let mut result = filled(out, value.bytes())?;
    let x_strides = signed_strides(x.dims());
    let out_strides = signed_strides(&out.dims);
    let (mut src_offset, mut dst_offset) = (0isize, 0isize);
    let mut counts = Vec::with_capacity(x.ty.rank());
    let mut dst_strides = Vec::with_capacity(x.ty.rank());
    for d in 0..x.ty.rank() {
        // Input element i lands at low + i·step; keep those inside the
        // output. In i128, so no low or interior can overflow.
        let step = interior[d] as i128 + 1;
        let (n_in, n_out, lo) = (x.dims()[d] as i128, out.dims[d] as i128, low[d] as i128);
        let first = if lo < 0 { (-lo + step - 1) / step } else { 0 };
        let end = if n_out > lo {
            ((n_out - lo + step - 1) / step).min(n_in)
        } else {
            0
        };
        if end <= first {
            return Ok(result);
        }
        counts.push((end - first) as usize);
        src_offset += first as isize * x_strides[d];
        dst_offset += (lo + first * step) as isize * out_strides[d];
        dst_strides.push(step as isize * out_strides[d]);
    }
    StridedCopy::new(&counts, &x_strides, &dst_strides, src_offset, dst_offset).run_bytes(
        x.dtype().size(),
        x.bytes(),
        result.bytes_mut(),
    )?;
    Ok(result)
}

pub fn concatenate(xs: &[&HostTensor], dimension: usize, out: &TensorType) -> Result<HostTensor> {
    let mut result = HostTensor::zeros(out.clone());
    let out_strides = signed_strides(&out.dims);
    let mut offset = 0isize;
    for x in xs {
        StridedCopy::new(
            &to_usize(x.dims()),
            &signed_strides(x.dims()),
            &out_strides,
            0,
            offset * out_strides[dimension],
        )
        .run_bytes(out.dtype.size(), x.bytes(), result.bytes_mut())?;
        offset += x.dims()[dimension] as isize;
    }
    Ok(result)
}

pub fn reverse(x: &HostTensor, dimensions: &[usize]) -> Result<HostTensor> {
    let mut result = HostTensor::zeros(x.ty.clone());
    let x_strides = signed_strides(x.dims());
    let mut src_strides = x_strides.clone();
    let mut offset = 0isize;
    for &d in dimensions {
        src_strides[d] = -x_strides[d];
        offset += (x.dims()[d] as isize - 1).max(0) * x_strides[d];
    }
    StridedCopy::new(&to_usize(x.dims()), &src_strides, &x_strides, offset, 0).run_bytes(
        x.dtype().size(),
        x.bytes(),
        result.bytes_mut(),
    )?;
    Ok(result)
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::{eval, HostTensor};
    use crate::ir::{DType, Prim};

    /// A reshape shares its operand's bytes; a write to either copies
    /// first, so the other never changes.
    #[test]
    fn a_reshape_shares_bytes_until_one_side_writes() {
        let x = HostTensor::from_slice(DType::F32, &[4], &[1f32, 2., 3., 4.]).unwrap();
        let reshape = Prim::Reshape { dims: vec![2, 2] };
        let mut y = eval(&reshape, &[&x]).unwrap().remove(0);
        assert_eq!(y.ty.dims, vec![2, 2]);
        assert_eq!(y.bytes().as_ptr(), x.bytes().as_ptr(), "shared, not copied");
        y.bytes_mut()[..4].copy_from_slice(&9f32.to_le_bytes());
        assert_eq!(x.as_slice::<f32>(), &[1., 2., 3., 4.]);
        assert_eq!(y.as_slice::<f32>(), &[9., 2., 3., 4.]);
        let mut x = x;
        let z = eval(&reshape, &[&x]).unwrap().remove(0);
        x.bytes_mut()[..4].copy_from_slice(&7f32.to_le_bytes());
        assert_eq!(z.as_slice::<f32>(), &[1., 2., 3., 4.]);
        assert_eq!(x.as_slice::<f32>(), &[7., 2., 3., 4.]);
    }

    /// Element sizes 1, 2, 4 and 8, with a float and an integer type.
    pub(in super::super) const LAYOUT_DTYPES: [DType; 6] = [
        DType::Bool,
        DType::U8,
        DType::BF16,
        DType::F32,
        DType::I32,
        DType::I64,
    ];

    /// Deterministic values that every dtype holds exactly (0/1 for bool).
    pub(in super::super) fn values(dtype: DType, n: usize, seed: u64) -> Vec<f64> {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let v = (state >> 33) % 100;
                if dtype == DType::Bool {
                    (v % 2) as f64
                } else {
                    v as f64
                }
            })
            .collect()
    }

    pub(in super::super) fn tensor(dtype: DType, dims: &[u64], seed: u64) -> HostTensor {
        let n = dims.iter().product::<u64>() as usize;
        HostTensor::from_f64(dtype, dims, &values(dtype, n, seed)).unwrap()
    }

    pub(in super::super) fn scalar(dtype: DType, v: f64) -> HostTensor {
        HostTensor::from_f64(dtype, &[], &[v]).unwrap()
    }

    pub(in super::super) fn unravel(mut flat: usize, dims: &[u64]) -> Vec<usize> {
        let mut index = vec![0; dims.len()];
        for d in (0..dims.len()).rev() {
            index[d] = flat % dims[d] as usize;
            flat /= dims[d] as usize;
        }
        index
    }

    pub(in super::super) fn ravel(index: &[usize], dims: &[u64]) -> usize {
        index
            .iter()
            .zip(dims)
            .fold(0, |acc, (&i, &d)| acc * d as usize + i)
    }

    /// Run `prim` through `eval` (so through type inference too) and check
    /// every element of the first result against `expected(out_index)`.
    pub(in super::super) fn check(
        prim: Prim,
        inputs: &[&HostTensor],
        expected: impl Fn(&[usize]) -> f64,
    ) {
        let out = eval(&prim, inputs).unwrap_or_else(|e| panic!("{prim:?}: {e}"));
        let out = &out[0];
        for i in 0..out.numel() {
            let index = unravel(i, out.dims());
            assert_eq!(
                out.get_f64(i),
                expected(&index),
                "{prim:?} at {index:?} of {}",
                out.ty
            );
        }
    }

    #[test]
    fn broadcast_in_dim_matches_reference() {
        let cases: &[(&[u64], &[u64], &[usize])] = &[
            (&[], &[], &[]),
            (&[], &[3, 4], &[]),
            (&[4], &[3, 4], &[1]),
            (&[3], &[3, 4], &[0]),
            (&[3, 1], &[3, 5], &[0, 1]),
            (&[1, 5], &[2, 3, 5], &[1, 2]),
            (&[2, 1, 4], &[2, 3, 6, 4], &[0, 2, 3]),
            (&[0, 1], &[0, 4], &[0, 1]),
            (&[1], &[2, 0], &[0]),
        ];
        for &dtype in &LAYOUT_DTYPES {
            for (seed, &(xd, od, mapping)) in cases.iter().enumerate() {
                let x = tensor(dtype, xd, seed as u64);
                let prim = Prim::BroadcastInDim {
                    dims: od.to_vec(),
                    mapping: mapping.to_vec(),
                };
                check(prim, &[&x], |i| {
                    let j: Vec<usize> = (0..xd.len())
                        .map(|k| if xd[k] == 1 { 0 } else { i[mapping[k]] })
                        .collect();
                    x.get_f64(ravel(&j, xd))
                });
            }
        }
    }

    #[test]
    fn transpose_matches_reference() {
        let cases: &[(&[u64], &[usize])] = &[
            (&[], &[]),
            (&[5], &[0]),
            (&[3, 4], &[1, 0]),
            (&[70, 45], &[1, 0]),
            (&[3, 70, 45], &[0, 2, 1]),
            (&[2, 3, 4, 5], &[3, 1, 0, 2]),
            (&[2, 3, 4, 5], &[0, 1, 3, 2]),
            (&[2, 3, 4, 5], &[1, 0, 2, 3]),
            (&[2, 1, 4, 1], &[3, 2, 1, 0]),
            (&[33, 1, 40], &[2, 1, 0]),
            (&[0, 3], &[1, 0]),
        ];
        for &dtype in &LAYOUT_DTYPES {
            for (seed, &(xd, perm)) in cases.iter().enumerate() {
                let x = tensor(dtype, xd, seed as u64);
                check(
                    Prim::Transpose {
                        perm: perm.to_vec(),
                    },
                    &[&x],
                    |i| {
                        let mut j = vec![0; xd.len()];
                        for (k, &p) in perm.iter().enumerate() {
                            j[p] = i[k];
                        }
                        x.get_f64(ravel(&j, xd))
                    },
                );
            }
        }
    }

    /// Operand dims, start, limit, stride.
    type SliceCase = (
        &'static [u64],
        &'static [u64],
        &'static [u64],
        &'static [u64],
    );
    /// Operand dims, low, high, interior.
    type PadCase = (
        &'static [u64],
        &'static [i64],
        &'static [i64],
        &'static [u64],
    );

    #[test]
    fn slice_matches_reference() {
        let cases: &[SliceCase] = &[
            (&[], &[], &[], &[]),
            (&[10], &[2], &[9], &[3]),
            (&[6, 7], &[1, 0], &[5, 7], &[1, 1]),
            (&[6, 7], &[0, 6], &[6, 7], &[2, 1]),
            (&[6, 7], &[3, 3], &[3, 3], &[1, 1]),
            (&[4, 5, 6], &[1, 1, 1], &[4, 5, 6], &[2, 3, 2]),
            (&[4, 0, 6], &[0, 0, 0], &[4, 0, 6], &[1, 1, 1]),
        ];
        for &dtype in &LAYOUT_DTYPES {
            for (seed, &(xd, start, limit, stride)) in cases.iter().enumerate() {
                let x = tensor(dtype, xd, seed as u64);
                let prim = Prim::Slice {
                    start: start.to_vec(),
                    limit: limit.to_vec(),
                    stride: stride.to_vec(),
                };
                check(prim, &[&x], |i| {
                    let j: Vec<usize> = (0..xd.len())
                        .map(|d| start[d] as usize + i[d] * stride[d] as usize)
                        .collect();
                    x.get_f64(ravel(&j, xd))
                });
            }
        }
    }

    #[test]
    fn dynamic_slice_clamps_starts() {
        let cases: &[(&[u64], &[u64], &[i64])] = &[
            (&[], &[], &[]),
            (&[10], &[3], &[4]),
            (&[10], &[3], &[9]),
            (&[10], &[3], &[-5]),
            (&[5, 6], &[2, 6], &[1, 3]),
            (&[5, 6], &[5, 1], &[i64::MAX, i64::MIN]),
            (&[4, 5, 6], &[2, 0, 3], &[3, 2, 1]),
        ];
        for &dtype in &LAYOUT_DTYPES {
            for (seed, &(xd, sizes, starts)) in cases.iter().enumerate() {
                let x = tensor(dtype, xd, seed as u64);
                let starts_t: Vec<HostTensor> = starts
                    .iter()
                    .map(|&s| scalar(DType::I64, s as f64))
                    .collect();
                let mut inputs = vec![&x];
                inputs.extend(starts_t.iter());
                check(
                    Prim::DynamicSlice {
                        sizes: sizes.to_vec(),
                    },
                    &inputs,
                    |i| {
                        let j: Vec<usize> = (0..xd.len())
                            .map(|d| starts[d].clamp(0, (xd[d] - sizes[d]) as i64) as usize + i[d])
                            .collect();
                        x.get_f64(ravel(&j, xd))
                    },
                );
            }
        }
    }

    #[test]
    fn dynamic_update_slice_clamps_starts() {
        let cases: &[(&[u64], &[u64], &[i64])] = &[
            (&[], &[], &[]),
            (&[10], &[3], &[4]),
            (&[10], &[3], &[100]),
            (&[5, 6], &[2, 6], &[-1, 3]),
            (&[4, 5, 6], &[2, 1, 3], &[3, 2, 1]),
            (&[4, 5, 6], &[2, 0, 3], &[1, 1, 1]),
        ];
        for &dtype in &LAYOUT_DTYPES {
            for (seed, &(xd, ud, starts)) in cases.iter().enumerate() {
                let x = tensor(dtype, xd, seed as u64);
                let u = tensor(dtype, ud, seed as u64 + 100);
                let starts_t: Vec<HostTensor> = starts
                    .iter()
                    .map(|&s| scalar(DType::I64, s as f64))
                    .collect();
                let mut inputs = vec![&x, &u];
                inputs.extend(starts_t.iter());
                let clamped: Vec<usize> = (0..xd.len())
                    .map(|d| starts[d].clamp(0, (xd[d] - ud[d]) as i64) as usize)
                    .collect();
                check(Prim::DynamicUpdateSlice, &inputs, |i| {
                    let inside = (0..xd.len())
                        .all(|d| i[d] >= clamped[d] && i[d] < clamped[d] + ud[d] as usize);
                    if inside {
                        let j: Vec<usize> = (0..xd.len()).map(|d| i[d] - clamped[d]).collect();
                        u.get_f64(ravel(&j, ud))
                    } else {
                        x.get_f64(ravel(i, xd))
                    }
                });
            }
        }
    }

    #[test]
    fn pad_matches_reference() {
        let cases: &[PadCase] = &[
            (&[], &[], &[], &[]),
            (&[5], &[2], &[3], &[0]),
            (&[5], &[-2], &[-1], &[0]),
            (&[5], &[-3], &[2], &[2]),
            (&[5], &[1], &[-4], &[1]),
            (&[5], &[-20], &[18], &[3]),
            (&[3, 4], &[1, -1], &[2, 0], &[1, 2]),
            (&[3, 4, 2], &[0, 2, -1], &[-1, 0, 1], &[0, 1, 0]),
            (&[0, 3], &[1, 1], &[1, 1], &[2, 0]),
            (&[2, 3], &[0, 0], &[0, -3], &[0, 0]),
        ];
        for &dtype in &LAYOUT_DTYPES {
            for (seed, &(xd, low, high, interior)) in cases.iter().enumerate() {
                let x = tensor(dtype, xd, seed as u64);
                let value = scalar(dtype, 1.0);
                let prim = Prim::Pad {
                    low: low.to_vec(),
                    high: high.to_vec(),
                    interior: interior.to_vec(),
                };
                check(prim, &[&x, &value], |i| {
                    let mut j = Vec::new();
                    for d in 0..xd.len() {
                        let p = i[d] as i64 - low[d];
                        let step = interior[d] as i64 + 1;
                        if p < 0 || p % step != 0 || p / step >= xd[d] as i64 {
                            return 1.0;
                        }
                        j.push((p / step) as usize);
                    }
                    x.get_f64(ravel(&j, xd))
                });
            }
        }
        // A zero pad value takes the zero-fill path.
        let x = tensor(DType::F32, &[2, 2], 7);
        let zero = scalar(DType::F32, 0.0);
        let prim = Prim::Pad {
            low: vec![1, 0],
            high: vec![0, 1],
            interior: vec![0, 0],
        };
        check(prim, &[&x, &zero], |i| {
            if i[0] == 0 || i[1] == 2 {
                0.0
            } else {
                x.get_f64(ravel(&[i[0] - 1, i[1]], &[2, 2]))
            }
        });
    }

    #[test]
    fn concatenate_matches_reference() {
        let cases: &[(&[&[u64]], usize)] = &[
            (&[&[3], &[0], &[4]], 0),
            (&[&[2, 3], &[2, 1], &[2, 4]], 1),
            (&[&[2, 3], &[1, 3]], 0),
            (&[&[2, 3, 4], &[2, 2, 4], &[2, 0, 4]], 1),
            (&[&[0, 3]], 1),
        ];
        for &dtype in &LAYOUT_DTYPES {
            for (seed, &(shapes, dim)) in cases.iter().enumerate() {
                let xs: Vec<HostTensor> = shapes
                    .iter()
                    .enumerate()
                    .map(|(k, d)| tensor(dtype, d, (seed * 10 + k) as u64))
                    .collect();
                let inputs: Vec<&HostTensor> = xs.iter().collect();
                check(Prim::Concatenate { dimension: dim }, &inputs, |i| {
                    let mut j = i.to_vec();
                    for x in &xs {
                        if j[dim] < x.dims()[dim] as usize {
                            return x.get_f64(ravel(&j, x.dims()));
                        }
                        j[dim] -= x.dims()[dim] as usize;
                    }
                    unreachable!()
                });
            }
        }
    }

    #[test]
    fn reverse_matches_reference() {
        let cases: &[(&[u64], &[usize])] = &[
            (&[], &[]),
            (&[7], &[0]),
            (&[7], &[]),
            (&[3, 4], &[1]),
            (&[3, 4], &[0]),
            (&[3, 4, 5], &[0, 2]),
            (&[3, 0, 5], &[1]),
        ];
        for &dtype in &LAYOUT_DTYPES {
            for (seed, &(xd, dims)) in cases.iter().enumerate() {
                let x = tensor(dtype, xd, seed as u64);
                check(
                    Prim::Reverse {
                        dimensions: dims.to_vec(),
                    },
                    &[&x],
                    |i| {
                        let j: Vec<usize> = (0..xd.len())
                            .map(|d| {
                                if dims.contains(&d) {
                                    xd[d] as usize - 1 - i[d]
                                } else {
                                    i[d]
                                }
                            })
                            .collect();
                        x.get_f64(ravel(&j, xd))
                    },
                );
            }
        }
    }
}
