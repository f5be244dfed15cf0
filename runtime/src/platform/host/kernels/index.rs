//! Indexed kernels: gather (torch.gather), take (torch.index_select /
//! embedding) and scatter (torch.scatter / scatter_reduce).
//!
//! Every index is checked before anything is read or written: a negative
//! or too large index is an `InvalidArgument` error naming its position in
//! `index`, its value and the valid range (the op library wraps negative
//! indices before it gets here). Gather, take and scatter-replace move
//! bytes, so they are written once per element size; the reducing
//! combiners work per dtype, with bf16 and f16 accumulated in f32 and
//! rounded once at the end.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::structural::{for_each_offset, signed_strides, to_usize};
use super::HostTensor;
use crate::error::{Error, Result};
use crate::ir::{DType, ScatterCombiner, TensorType};

/// A typed view of an integer index tensor.
enum Indices<'a> {
    I32(&'a [i32]),
    I64(&'a [i64]),
}

impl<'a> Indices<'a> {
    fn new(index: &'a HostTensor) -> Result<Self> {
        match index.dtype() {
            DType::I32 => Ok(Indices::I32(index.as_slice())),
            DType::I64 => Ok(Indices::I64(index.as_slice())),
            _ => Err(Error::invalid(format!(
                "indices must be i32 or i64, got {}",
                index.ty
            ))),
        }
    }

    fn len(&self) -> usize {
        match self {
            Indices::I32(v) => v.len(),
            Indices::I64(v) => v.len(),
        }
    }

    fn get(&self, i: usize) -> i64 {
        match self {
            Indices::I32(v) => v[i] as i64,
            Indices::I64(v) => v[i],
        }
    }

    /// Every index as usize, after checking each is in 0..bound.
    fn checked(&self, dims: &[u64], bound: u64, axis: usize) -> Result<Vec<usize>> {
        (0..self.len())
            .map(|i| {
                let v = self.get(i);
                if v < 0 || v as u64 >= bound {
                    return Err(Error::invalid(format!(
                        "index {v} at position {:?} is out of range: axis {axis} has size {bound}, \
                         so indices must lie in 0..{bound}",
                        unravel(i, dims)
                    )));
                }
                Ok(v as usize)
            })
            .collect()
    }
}

/// The multi-index of row-major position `flat` in `dims`.
fn unravel(mut flat: usize, dims: &[u64]) -> Vec<u64> {
    let mut index = vec![0u64; dims.len()];
    for (i, &d) in dims.iter().enumerate().rev() {
        if d > 0 {
            index[i] = flat as u64 % d;
            flat /= d as usize;
        }
    }
    index
}

/// Checks that `index` (of `x`'s rank) fits into `x` outside `axis`.
fn check_fits(x: &HostTensor, index: &HostTensor, axis: usize) -> Result<()> {
    let rank = x.ty.rank();
    let fits = axis < rank
        && index.ty.rank() == rank
        && (0..rank).all(|d| d == axis || index.dims()[d] <= x.dims()[d]);
    if !fits {
        return Err(Error::invalid(format!(
            "index {} needs the rank of {} and must fit into it outside axis {axis}",
            index.ty, x.ty
        )));
    }
    Ok(())
}

/// Offsets into `x` of every position of `index` with the axis coordinate
/// left at 0, in row-major order of `index`.
fn base_offsets(x: &HostTensor, index_dims: &[u64], axis: usize) -> Vec<usize> {
    let mut x_strides = signed_strides(x.dims());
    x_strides[axis] = 0;
    let mut offsets = Vec::with_capacity(index_dims.iter().product::<u64>() as usize);
    let zeros = vec![0isize; index_dims.len()];
    for_each_offset(&to_usize(index_dims), &x_strides, &zeros, 0, 0, |a, _| {
        offsets.push(a as usize)
    });
    offsets
}

/// Run `f` over `bytes` viewed as elements of `size` bytes.
macro_rules! by_elem_size {
    ($size:expr, |$t:ident| $body:expr) => {
        match $size {
            1 => {
                type $t = u8;
                $body
            }
            2 => {
                type $t = u16;
                $body
            }
            4 => {
                type $t = u32;
                $body
            }
            _ => {
                type $t = u64;
                $body
            }
        }
    };
}

pub fn gather(x: &HostTensor, index: &HostTensor, axis: usize) -> Result<HostTensor> {
    check_fits(x, index, axis)?;
    let positions = Indices::new(index)?.checked(index.dims(), x.dims()[axis], axis)?;
    let bases = base_offsets(x, index.dims(), axis);
    let axis_stride = signed_strides(x.dims())[axis] as usize;
    let mut result = HostTensor::zeros(TensorType::new(x.dtype(), index.dims()));
    by_elem_size!(x.dtype().size(), |T| {
        let src: &[T] = bytemuck::cast_slice(x.bytes());
        let dst: &mut [T] = bytemuck::cast_slice_mut(result.bytes_mut());
        for ((o, &b), &p) in dst.iter_mut().zip(&bases).zip(&positions) {
            *o = src[b + p * axis_stride];
        }
    });
    Ok(result)
}

pub fn take(
    x: &HostTensor,
    index: &HostTensor,
    axis: usize,
    out: &TensorType,
) -> Result<HostTensor> {
    if axis >= x.ty.rank() {
        return Err(Error::invalid(format!(
            "axis {axis} is not below the rank of {}",
            x.ty
        )));
    }
    let positions = Indices::new(index)?.checked(index.dims(), x.dims()[axis], axis)?;
    let dims = to_usize(x.dims());
    let outer: usize = dims[..axis].iter().product();
    let (n, m) = (dims[axis], positions.len());
    let row: usize = dims[axis + 1..].iter().product();
    let mut result = HostTensor::zeros(out.clone());
    if outer * m * row != result.numel() {
        return Err(Error::invalid(format!(
            "take of {} by {} cannot give {out}",
            x.ty, index.ty
        )));
    }
    if result.numel() == 0 {
        return Ok(result);
    }
    by_elem_size!(x.dtype().size(), |T| {
        let src: &[T] = bytemuck::cast_slice(x.bytes());
        let dst: &mut [T] = bytemuck::cast_slice_mut(result.bytes_mut());
        for (o, block) in dst.chunks_exact_mut(m * row).enumerate() {
            for (out_row, &p) in block.chunks_exact_mut(row).zip(&positions) {
                let start = (o * n + p) * row;
                out_row.copy_from_slice(&src[start..start + row]);
            }
        }
    });
    Ok(result)
}

/// Element arithmetic for the reducing scatter combiners.
trait Combine: Copy {
    fn combine(self, other: Self, op: ScatterCombiner) -> Self;
}

macro_rules! combine_int {
    ($($t:ty),*) => {$(
        impl Combine for $t {
            fn combine(self, u: Self, op: ScatterCombiner) -> Self {
                match op {
                    ScatterCombiner::Replace => u,
                    ScatterCombiner::Add => self.wrapping_add(u),
                    ScatterCombiner::Mul => self.wrapping_mul(u),
                    ScatterCombiner::Max => self.max(u),
                    ScatterCombiner::Min => self.min(u),
                }
            }
        }
    )*};
}
combine_int!(u8, i8, i32, i64);

macro_rules! combine_float {
    ($($t:ty),*) => {$(
        impl Combine for $t {
            /// Max and min propagate NaN, as torch's scatter_reduce does.
            fn combine(self, u: Self, op: ScatterCombiner) -> Self {
                match op {
                    ScatterCombiner::Replace => u,
                    ScatterCombiner::Add => self + u,
                    ScatterCombiner::Mul => self * u,
                    ScatterCombiner::Max if self.is_nan() || u.is_nan() => <$t>::NAN,
                    ScatterCombiner::Min if self.is_nan() || u.is_nan() => <$t>::NAN,
                    ScatterCombiner::Max => self.max(u),
                    ScatterCombiner::Min => self.min(u),
                }
            }
        }
    )*};
}
combine_float!(f32, f64);

/// Bool as u8 0/1: add is or, mul is and (torch's bool arithmetic).
#[derive(Clone, Copy)]
struct Bool(u8);

impl Combine for Bool {
    fn combine(self, u: Self, op: ScatterCombiner) -> Self {
        let (a, b) = (self.0 != 0, u.0 != 0);
        Bool(match op {
            ScatterCombiner::Replace => b,
            ScatterCombiner::Add | ScatterCombiner::Max => a || b,
            ScatterCombiner::Mul | ScatterCombiner::Min => a && b,
        } as u8)
    }
}

/// Combine `updates[i]` into `dst[targets[i]]` in row-major order of `index`.
fn scatter_into<T: Combine>(dst: &mut [T], targets: &[usize], updates: &[T], op: ScatterCombiner) {
    for (&t, &u) in targets.iter().zip(updates) {
        dst[t] = dst[t].combine(u, op);
    }
}

/// The target row of each update row of a scatter along axis 0 whose
/// index covers whole rows of `x` and is the same across each row (a row
/// index broadcast over the row, as embedding backward, index_add and the
/// sparse ops build it); None when the index is not of that form. Checks
/// each row's index as the element path would.
fn row_positions(
    x: &HostTensor,
    index: &HostTensor,
    axis: usize,
) -> Result<Option<(Vec<usize>, usize)>> {
    let (idims, xdims) = (index.dims(), x.dims());
    if axis != 0 || idims.len() < 2 || idims[1..] != xdims[1..] {
        return Ok(None);
    }
    let row = idims[1..].iter().product::<u64>() as usize;
    if row < 2 {
        return Ok(None);
    }
    fn uniform<T: Copy + PartialEq + Into<i64>>(v: &[T], row: usize) -> Option<Vec<i64>> {
        v.chunks_exact(row)
            .map(|r| r.iter().all(|&e| e == r[0]).then(|| r[0].into()))
            .collect()
    }
    let firsts = match Indices::new(index)? {
        Indices::I32(v) => uniform(v, row),
        Indices::I64(v) => uniform(v, row),
    };
    let Some(firsts) = firsts else {
        return Ok(None);
    };
    let bound = xdims[0];
    firsts
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            if v < 0 || v as u64 >= bound {
                return Err(Error::invalid(format!(
                    "index {v} at position {:?} is out of range: axis {axis} has size {bound}, \
                     so indices must lie in 0..{bound}",
                    unravel(i * row, idims)
                )));
            }
            Ok(v as usize)
        })
        .collect::<Result<Vec<_>>>()
        .map(|p| Some((p, row)))
}

/// Combine each update row into its target row, with `f` (the combiner,
/// fixed, so each row's loop is a plain vector loop).
fn scatter_rows_with<T: Copy>(
    dst: &mut [T],
    positions: &[usize],
    updates: &[T],
    row: usize,
    f: impl Fn(T, T) -> T,
) {
    for (&p, u) in positions.iter().zip(updates.chunks_exact(row)) {
        for (a, &b) in dst[p * row..(p + 1) * row].iter_mut().zip(u) {
            *a = f(*a, b);
        }
    }
}

fn scatter_rows_into<T: Combine>(
    dst: &mut [T],
    positions: &[usize],
    updates: &[T],
    row: usize,
    op: ScatterCombiner,
) {
    match op {
        ScatterCombiner::Replace => {
            for (&p, u) in positions.iter().zip(updates.chunks_exact(row)) {
                dst[p * row..(p + 1) * row].copy_from_slice(u);
            }
        }
        ScatterCombiner::Add => scatter_rows_with(dst, positions, updates, row, |a, b| {
            a.combine(b, ScatterCombiner::Add)
        }),
        ScatterCombiner::Mul => scatter_rows_with(dst, positions, updates, row, |a, b| {
            a.combine(b, ScatterCombiner::Mul)
        }),
        ScatterCombiner::Max => scatter_rows_with(dst, positions, updates, row, |a, b| {
            a.combine(b, ScatterCombiner::Max)
        }),
        ScatterCombiner::Min => scatter_rows_with(dst, positions, updates, row, |a, b| {
            a.combine(b, ScatterCombiner::Min)
        }),
    }
}

/// The row path of `scatter`, for the dtypes it combines in place.
fn scatter_rows(
    result: &mut HostTensor,
    positions: &[usize],
    updates: &HostTensor,
    row: usize,
    combiner: ScatterCombiner,
) -> bool {
    macro_rules! rows {
        ($t:ty) => {
            scatter_rows_into(
                result.as_slice_mut::<$t>(),
                positions,
                updates.as_slice::<$t>(),
                row,
                combiner,
            )
        };
    }
    match result.dtype() {
        DType::U8 => rows!(u8),
        DType::I8 => rows!(i8),
        DType::I32 => rows!(i32),
        DType::I64 => rows!(i64),
        DType::F32 => rows!(f32),
        DType::F64 => rows!(f64),
        _ => return false,
    }
    true
}

pub fn scatter(
    x: &HostTensor,
    index: &HostTensor,
    updates: &HostTensor,
    axis: usize,
    combiner: ScatterCombiner,
) -> Result<HostTensor> {
    check_fits(x, index, axis)?;
    if updates.dims() != index.dims() || updates.dtype() != x.dtype() {
        return Err(Error::invalid(format!(
            "updates {} must have the dims of index {} and the dtype of x {}",
            updates.ty, index.ty, x.ty
        )));
    }
    if let Some((positions, row)) = row_positions(x, index, axis)? {
        let mut result = x.clone();
        if scatter_rows(&mut result, &positions, updates, row, combiner) {
            return Ok(result);
        }
    }
    let positions = Indices::new(index)?.checked(index.dims(), x.dims()[axis], axis)?;
    let axis_stride = signed_strides(x.dims())[axis] as usize;
    let targets: Vec<usize> = base_offsets(x, index.dims(), axis)
        .into_iter()
        .zip(&positions)
        .map(|(b, &p)| b + p * axis_stride)
        .collect();
    let mut result = x.clone();
    match (combiner, x.dtype()) {
        (ScatterCombiner::Replace, _) => by_elem_size!(x.dtype().size(), |T| {
            let dst: &mut [T] = bytemuck::cast_slice_mut(result.bytes_mut());
            let src: &[T] = bytemuck::cast_slice(updates.bytes());
            for (&t, &u) in targets.iter().zip(src) {
                dst[t] = u;
            }
        }),
        (_, DType::Bool) => {
            let mut acc: Vec<Bool> = result.bytes().iter().map(|&b| Bool(b)).collect();
            let src: Vec<Bool> = updates.bytes().iter().map(|&b| Bool(b)).collect();
            scatter_into(&mut acc, &targets, &src, combiner);
            for (o, b) in result.bytes_mut().iter_mut().zip(&acc) {
                *o = b.0;
            }
        }
        (_, DType::U8) => scatter_into(
            result.as_slice_mut::<u8>(),
            &targets,
            updates.as_slice(),
            combiner,
        ),
        (_, DType::I8) => scatter_into(
            result.as_slice_mut::<i8>(),
            &targets,
            updates.as_slice(),
            combiner,
        ),
        (_, DType::I32) => scatter_into(
            result.as_slice_mut::<i32>(),
            &targets,
            updates.as_slice(),
            combiner,
        ),
        (_, DType::I64) => scatter_into(
            result.as_slice_mut::<i64>(),
            &targets,
            updates.as_slice(),
            combiner,
        ),
        (_, DType::F32) => scatter_into(
            result.as_slice_mut::<f32>(),
            &targets,
            updates.as_slice(),
            combiner,
        ),
        (_, DType::F64) => scatter_into(
            result.as_slice_mut::<f64>(),
            &targets,
            updates.as_slice(),
            combiner,
        ),
        (_, DType::F16) => {
            let mut acc = result.as_slice::<f16>().to_f32_vec();
            scatter_into(
                &mut acc,
                &targets,
                &updates.as_slice::<f16>().to_f32_vec(),
                combiner,
            );
            result.as_slice_mut::<f16>().convert_from_f32_slice(&acc);
        }
        (_, DType::BF16) => {
            let mut acc = result.as_slice::<bf16>().to_f32_vec();
            scatter_into(
                &mut acc,
                &targets,
                &updates.as_slice::<bf16>().to_f32_vec(),
                combiner,
            );
            result.as_slice_mut::<bf16>().convert_from_f32_slice(&acc);
        }
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::super::structural::tests::{check, ravel, tensor, values, LAYOUT_DTYPES};
    use super::super::{eval, HostTensor};
    use crate::error::Error;
    use crate::ir::{DType, Prim, ScatterCombiner};

    fn indices(dtype: DType, dims: &[u64], bound: u64, seed: u64) -> HostTensor {
        let n = dims.iter().product::<u64>() as usize;
        let v: Vec<f64> = values(DType::I64, n, seed)
            .iter()
            .map(|v| (*v as u64 % bound.max(1)) as f64)
            .collect();
        HostTensor::from_f64(dtype, dims, &v).unwrap()
    }

    #[test]
    fn gather_matches_reference() {
        let cases: &[(&[u64], &[u64], usize)] = &[
            (&[5], &[3], 0),
            (&[5], &[0], 0),
            (&[4, 6], &[4, 9], 1),
            (&[4, 6], &[2, 3], 0),
            (&[4, 6], &[3, 2], 1),
            (&[3, 4, 5], &[2, 7, 5], 1),
            (&[3, 0, 5], &[3, 0, 5], 2),
        ];
        for &dtype in &LAYOUT_DTYPES {
            for index_dtype in [DType::I32, DType::I64] {
                for (seed, &(xd, id, axis)) in cases.iter().enumerate() {
                    let x = tensor(dtype, xd, seed as u64);
                    let index = indices(index_dtype, id, xd[axis], seed as u64 + 50);
                    check(Prim::Gather { axis }, &[&x, &index], |i| {
                        let mut j = i.to_vec();
                        j[axis] = index.get_f64(ravel(i, id)) as usize;
                        x.get_f64(ravel(&j, xd))
                    });
                }
            }
        }
    }

    #[test]
    fn take_matches_reference() {
        let cases: &[(&[u64], &[u64], usize)] = &[
            (&[5], &[], 0),
            (&[5], &[3], 0),
            (&[10, 4], &[2, 3], 0),
            (&[4, 6, 3], &[5], 1),
            (&[4, 6, 3], &[2, 2], 2),
            (&[4, 6, 3], &[0], 1),
            (&[0, 6], &[3], 1),
        ];
        for &dtype in &LAYOUT_DTYPES {
            for index_dtype in [DType::I32, DType::I64] {
                for (seed, &(xd, id, axis)) in cases.iter().enumerate() {
                    let x = tensor(dtype, xd, seed as u64);
                    let index = indices(index_dtype, id, xd[axis], seed as u64 + 50);
                    check(Prim::Take { axis }, &[&x, &index], |i| {
                        let k = id.len();
                        let position = ravel(&i[axis..axis + k], id);
                        let mut j = i[..axis].to_vec();
                        j.push(index.get_f64(position) as usize);
                        j.extend(&i[axis + k..]);
                        x.get_f64(ravel(&j, xd))
                    });
                }
            }
        }
    }

    /// torch.scatter / scatter_reduce(include_self=True), in f64.
    fn scatter_reference(
        x: &HostTensor,
        index: &HostTensor,
        updates: &HostTensor,
        axis: usize,
        op: ScatterCombiner,
    ) -> Vec<f64> {
        let mut out = x.to_f64_vec();
        for p in 0..index.numel() {
            let mut j = super::super::structural::tests::unravel(p, index.dims());
            j[axis] = index.get_f64(p) as usize;
            let t = ravel(&j, x.dims());
            let (a, u) = (out[t], updates.get_f64(p));
            let v = match op {
                ScatterCombiner::Replace => u,
                ScatterCombiner::Add => a + u,
                ScatterCombiner::Mul => a * u,
                ScatterCombiner::Max => a.max(u),
                ScatterCombiner::Min => a.min(u),
            };
            // Integers wrap.
            out[t] = match x.dtype() {
                DType::U8 => (v as i64).rem_euclid(256) as f64,
                DType::I8 => ((v as i64 + 128).rem_euclid(256) - 128) as f64,
                _ => v,
            };
        }
        out
    }

    #[test]
    fn scatter_matches_reference() {
        let cases: &[(&[u64], &[u64], usize)] = &[
            (&[5], &[8], 0),
            (&[4, 6], &[4, 9], 1),
            (&[4, 6], &[7, 3], 0),
            (&[3, 4, 5], &[2, 7, 5], 1),
            (&[3, 4, 5], &[3, 0, 5], 1),
        ];
        let ops = [
            ScatterCombiner::Replace,
            ScatterCombiner::Add,
            ScatterCombiner::Mul,
            ScatterCombiner::Max,
            ScatterCombiner::Min,
        ];
        for dtype in [
            DType::U8,
            DType::I8,
            DType::I32,
            DType::I64,
            DType::F16,
            DType::BF16,
            DType::F32,
            DType::F64,
        ] {
            for op in ops {
                for (seed, &(xd, id, axis)) in cases.iter().enumerate() {
                    // Small values so sums and products stay exact in every dtype.
                    let small = |dims: &[u64], s: u64| {
                        let n = dims.iter().product::<u64>() as usize;
                        let v: Vec<f64> = values(dtype, n, s).iter().map(|v| v % 3.0).collect();
                        HostTensor::from_f64(dtype, dims, &v).unwrap()
                    };
                    let x = small(xd, seed as u64);
                    let index = indices(DType::I64, id, xd[axis], seed as u64 + 50);
                    let updates = small(id, seed as u64 + 99);
                    let out = eval(
                        &Prim::Scatter { axis, combiner: op },
                        &[&x, &index, &updates],
                    )
                    .unwrap();
                    let expected = scatter_reference(&x, &index, &updates, axis, op);
                    assert_eq!(
                        out[0].to_f64_vec(),
                        expected,
                        "{dtype} {op:?} {xd:?} {id:?}"
                    );
                }
            }
        }
    }

    /// An index that repeats one row of `x` across each update row (the
    /// row path), with duplicate rows: the same results as the reference,
    /// in every dtype and combiner, including a zero-row index; a bad row
    /// index names its position.
    #[test]
    fn scatter_of_whole_rows_matches_reference() {
        let rows_of = |dtype: DType, picks: &[i64], width: &[u64]| {
            let row = width.iter().product::<u64>() as usize;
            let v: Vec<f64> = picks
                .iter()
                .flat_map(|&p| std::iter::repeat_n(p as f64, row))
                .collect();
            let mut dims = vec![picks.len() as u64];
            dims.extend_from_slice(width);
            HostTensor::from_f64(dtype, &dims, &v).unwrap()
        };
        let ops = [
            ScatterCombiner::Replace,
            ScatterCombiner::Add,
            ScatterCombiner::Mul,
            ScatterCombiner::Max,
            ScatterCombiner::Min,
        ];
        let cases: &[(&[i64], &[u64])] =
            &[(&[2, 0, 2, 4, 2], &[3]), (&[1, 1, 0], &[2, 3]), (&[], &[3])];
        for dtype in [
            DType::U8,
            DType::I32,
            DType::I64,
            DType::BF16,
            DType::F32,
            DType::F64,
        ] {
            for op in ops {
                for (seed, &(picks, width)) in cases.iter().enumerate() {
                    let small = |dims: &[u64], s: u64| {
                        let n = dims.iter().product::<u64>() as usize;
                        let v: Vec<f64> = values(dtype, n, s).iter().map(|v| v % 3.0).collect();
                        HostTensor::from_f64(dtype, dims, &v).unwrap()
                    };
                    let mut xd = vec![5u64];
                    xd.extend_from_slice(width);
                    let x = small(&xd, seed as u64);
                    for idt in [DType::I32, DType::I64] {
                        let index = rows_of(idt, picks, width);
                        let updates = small(index.dims(), seed as u64 + 7);
                        let out = eval(
                            &Prim::Scatter {
                                axis: 0,
                                combiner: op,
                            },
                            &[&x, &index, &updates],
                        )
                        .unwrap();
                        let expected = scatter_reference(&x, &index, &updates, 0, op);
                        assert_eq!(out[0].to_f64_vec(), expected, "{dtype} {op:?} {picks:?}");
                    }
                }
            }
        }
        let x = HostTensor::from_f64(DType::F32, &[3, 2], &[0.0; 6]).unwrap();
        let index = rows_of(DType::I64, &[0, 3], &[2]);
        let updates = HostTensor::from_f64(DType::F32, &[2, 2], &[1.0; 4]).unwrap();
        let e = eval(
            &Prim::Scatter {
                axis: 0,
                combiner: ScatterCombiner::Add,
            },
            &[&x, &index, &updates],
        )
        .unwrap_err();
        assert!(e.to_string().contains("index 3 at position [1, 0]"), "{e}");
    }

    #[test]
    fn scatter_replace_last_write_wins_and_bool_combines() {
        let x = HostTensor::from_f64(DType::F32, &[3], &[0.0, 0.0, 0.0]).unwrap();
        let index = HostTensor::from_slice::<i32>(DType::I32, &[4], &[1, 1, 2, 1]).unwrap();
        let updates = HostTensor::from_f64(DType::F32, &[4], &[5.0, 6.0, 7.0, 8.0]).unwrap();
        let out = eval(
            &Prim::Scatter {
                axis: 0,
                combiner: ScatterCombiner::Replace,
            },
            &[&x, &index, &updates],
        )
        .unwrap();
        assert_eq!(out[0].to_f64_vec(), vec![0.0, 8.0, 7.0]);

        let b = HostTensor::from_f64(DType::Bool, &[3], &[0.0, 1.0, 1.0]).unwrap();
        let index = HostTensor::from_slice::<i64>(DType::I64, &[3], &[0, 1, 2]).unwrap();
        let u = HostTensor::from_f64(DType::Bool, &[3], &[1.0, 0.0, 1.0]).unwrap();
        let add = eval(
            &Prim::Scatter {
                axis: 0,
                combiner: ScatterCombiner::Add,
            },
            &[&b, &index, &u],
        )
        .unwrap();
        assert_eq!(add[0].bytes(), &[1, 1, 1]);
        let mul = eval(
            &Prim::Scatter {
                axis: 0,
                combiner: ScatterCombiner::Mul,
            },
            &[&b, &index, &u],
        )
        .unwrap();
        assert_eq!(mul[0].bytes(), &[0, 0, 1]);

        let f = HostTensor::from_f64(DType::F32, &[2], &[f64::NAN, 1.0]).unwrap();
        let index = HostTensor::from_slice::<i64>(DType::I64, &[2], &[0, 1]).unwrap();
        let u = HostTensor::from_f64(DType::F32, &[2], &[3.0, f64::NAN]).unwrap();
        let max = eval(
            &Prim::Scatter {
                axis: 0,
                combiner: ScatterCombiner::Max,
            },
            &[&f, &index, &u],
        )
        .unwrap();
        assert!(max[0].to_f64_vec().iter().all(|v| v.is_nan()));
    }

    #[test]
    fn scatter_add_rounds_half_types_once() {
        // 256 + 1 + 1 in bf16: step by step each +1 rounds away; once, it is 258.
        let x = HostTensor::from_f64(DType::BF16, &[1], &[256.0]).unwrap();
        let index = HostTensor::from_slice::<i64>(DType::I64, &[2], &[0, 0]).unwrap();
        let u = HostTensor::from_f64(DType::BF16, &[2], &[1.0, 1.0]).unwrap();
        let out = eval(
            &Prim::Scatter {
                axis: 0,
                combiner: ScatterCombiner::Add,
            },
            &[&x, &index, &u],
        )
        .unwrap();
        assert_eq!(out[0].to_f64_vec(), vec![258.0]);
    }

    fn invalid_message(e: Error) -> String {
        match e {
            Error::InvalidArgument(m) => m,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn bad_indices_are_errors_that_name_the_position() {
        let x = tensor(DType::F32, &[3, 4], 1);
        let mut raw = vec![0i64; 6];
        raw[4] = 4; // position [1, 1] of a [2, 3] index, along axis 1 of size 4
        let index = HostTensor::from_slice::<i64>(DType::I64, &[2, 3], &raw).unwrap();
        let msg = invalid_message(eval(&Prim::Gather { axis: 1 }, &[&x, &index]).unwrap_err());
        assert!(
            msg.starts_with("gather: ")
                && msg.contains("[1, 1]")
                && msg.contains("index 4")
                && msg.contains("0..4"),
            "{msg}"
        );

        let index = HostTensor::from_slice::<i32>(DType::I32, &[3], &[0, -1, 2]).unwrap();
        let msg = invalid_message(eval(&Prim::Take { axis: 0 }, &[&x, &index]).unwrap_err());
        assert!(
            msg.contains("[1]") && msg.contains("index -1") && msg.contains("0..3"),
            "{msg}"
        );

        let index = HostTensor::from_slice::<i64>(DType::I64, &[1, 2], &[0, i64::MAX]).unwrap();
        let updates = tensor(DType::F32, &[1, 2], 2);
        for combiner in [ScatterCombiner::Replace, ScatterCombiner::Add] {
            let err = eval(
                &Prim::Scatter { axis: 0, combiner },
                &[&x, &index, &updates],
            )
            .unwrap_err();
            let msg = invalid_message(err);
            assert!(
                msg.contains("[0, 1]") && msg.contains(&i64::MAX.to_string()),
                "{msg}"
            );
        }

        // Any index into an empty axis is out of range.
        let empty = tensor(DType::F32, &[0, 2], 1);
        let index = HostTensor::from_slice::<i64>(DType::I64, &[1], &[0]).unwrap();
        let msg = invalid_message(eval(&Prim::Take { axis: 0 }, &[&empty, &index]).unwrap_err());
        assert!(msg.contains("0..0"), "{msg}");
    }
}
