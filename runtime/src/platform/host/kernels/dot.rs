//! Matrix products: dot_general and convolution.
//!
//! dot_general views each operand as a batch of matrices, lhs [batch, M, K]
//! and rhs [batch, K, N], and runs one GEMM per batch. When an operand's
//! row dimensions and column dimensions each collapse to a single stride
//! (any plain or transposed layout does) the GEMM reads it in place;
//! otherwise the operand is first copied into [batch, rows, cols] order.
//! f32 and f64 use the `gemm` crate, which takes arbitrary strides, called
//! single-threaded: a large product is cut into one block of its output
//! per thread, and many small batched products are dealt out to the
//! threads whole. bf16 and f16 are multiplied in f32 and
//! rounded once. Integers use a plain loop with wrapping arithmetic.
//!
//! Convolution is im2col plus one GEMM per (image, group), in f32 or f64.

use std::borrow::Cow;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::structural::{for_each_offset, signed_strides, to_usize, transpose};
use super::HostTensor;
use crate::error::{Error, Result};
use crate::ir::{DType, TensorType};

/// Batched products with fewer multiply-adds than this in all run on one
/// thread: starting threads would cost more than they save.
const MIN_PARALLEL_WORK: usize = 1 << 22;

/// A batch of matrices inside a slice: matrix `b` starts at `offsets[b]`
/// and its element (r, c) is at `offsets[b] + r·row_stride + c·col_stride`.
#[derive(Clone, Debug)]
struct Matrices {
    offsets: Vec<usize>,
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl Matrices {
    /// One contiguous row-major matrix.
    fn single(rows: usize, cols: usize) -> Self {
        Matrices {
            offsets: vec![0],
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// Checks that every element of every matrix lies inside `len`.
    fn check(&self, len: usize, what: &str) -> Result<()> {
        let last = self.offsets.iter().max().copied().unwrap_or(0)
            + self.rows.saturating_sub(1) * self.row_stride
            + self.cols.saturating_sub(1) * self.col_stride;
        if self.rows > 0 && self.cols > 0 && !self.offsets.is_empty() && last >= len {
            return Err(Error::Internal(format!(
                "{what} matrices {self:?} reach past {len} elements"
            )));
        }
        Ok(())
    }
}

/// Size and stride of the dimensions `group` taken together, if they
/// step through memory with one stride (size-1 dimensions never matter).
fn collapse(dims: &[u64], strides: &[isize], group: &[usize]) -> Option<(usize, usize)> {
    let mut size = 1usize;
    let mut stride: Option<isize> = None;
    for &d in group {
        let n = dims[d] as usize;
        if n == 1 {
            continue;
        }
        if stride.is_some_and(|outer| outer != strides[d] * n as isize) {
            return None;
        }
        stride = Some(strides[d]);
        size *= n;
    }
    Some((size, stride.unwrap_or(1) as usize))
}

/// `t` as a batch of matrices with rows `rows` and columns `cols`, in
/// place when their dimensions collapse, else from a copy.
fn matrices<'a>(
    t: &'a HostTensor,
    batch: &[usize],
    rows: &[usize],
    cols: &[usize],
) -> Result<(Cow<'a, HostTensor>, Matrices)> {
    let strides = signed_strides(t.dims());
    let (source, strides, batch, rows, cols) = match (
        collapse(t.dims(), &strides, rows),
        collapse(t.dims(), &strides, cols),
    ) {
        (Some(_), Some(_)) => (
            Cow::Borrowed(t),
            strides,
            batch.to_vec(),
            rows.to_vec(),
            cols.to_vec(),
        ),
        _ => {
            let perm: Vec<usize> = batch.iter().chain(rows).chain(cols).copied().collect();
            let dims: Vec<u64> = perm.iter().map(|&p| t.dims()[p]).collect();
            let copy = transpose(t, &perm, &TensorType::new(t.dtype(), &dims))?;
            let strides = signed_strides(&dims);
            let (b, r) = (batch.len(), rows.len());
            let range = |from: usize, to: usize| (from..to).collect::<Vec<usize>>();
            (
                Cow::Owned(copy),
                strides,
                range(0, b),
                range(b, b + r),
                range(b + r, perm.len()),
            )
        }
    };
    let dims = source.dims();
    let not_collapsed = || Error::Internal("a copied operand does not collapse".into());
    let (n_rows, mut row_stride) = collapse(dims, &strides, &rows).ok_or_else(not_collapsed)?;
    let (n_cols, mut col_stride) = collapse(dims, &strides, &cols).ok_or_else(not_collapsed)?;
    if n_cols == 1 {
        col_stride = 1;
    }
    if n_rows == 1 {
        row_stride = if col_stride == 1 { n_cols } else { 1 };
    }
    let batch_dims: Vec<usize> = batch.iter().map(|&d| dims[d] as usize).collect();
    let batch_strides: Vec<isize> = batch.iter().map(|&d| strides[d]).collect();
    let mut offsets = Vec::new();
    for_each_offset(&batch_dims, &batch_strides, &batch_strides, 0, 0, |a, _| {
        offsets.push(a as usize)
    });
    let m = Matrices {
        offsets,
        rows: n_rows,
        cols: n_cols,
        row_stride,
        col_stride,
    };
    m.check(source.numel(), "operand")?;
    Ok((source, m))
}

/// The element types the GEMM crate multiplies.
trait GemmFloat: Copy + Send + Sync + 'static {
    const ZERO: Self;
    const ONE: Self;
}
impl GemmFloat for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
}
impl GemmFloat for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
}

/// The output block rows × cols of `dst = lhs[batch] · rhs[batch]`,
/// on this thread; `dst` points at the whole row-major m × n matrix.
///
/// # Safety
/// `batched_gemm` checked that every matrix of `lm` and `rm` lies inside
/// `lhs` and `rhs`; `dst` must be valid for m × n elements, the block in
/// range, and no other thread may touch the block meanwhile.
unsafe fn gemm_block<T: GemmFloat>(
    lhs: &[T],
    lm: &Matrices,
    rhs: &[T],
    rm: &Matrices,
    batch: usize,
    dst: *mut T,
    (rows, cols): (std::ops::Range<usize>, std::ops::Range<usize>),
) {
    let (k, n) = (lm.cols, rm.cols);
    let lhs_at = lm.offsets[batch] + rows.start * lm.row_stride;
    let rhs_at = rm.offsets[batch] + cols.start * rm.col_stride;
    // SAFETY: the caller's contract: the block's rows of lhs, its columns
    // of rhs and its part of dst are in range, and the block is ours.
    unsafe {
        gemm::gemm(
            rows.len(),
            cols.len(),
            k,
            dst.add(rows.start * n + cols.start),
            1,
            n as isize,
            false,
            lhs.as_ptr().add(lhs_at),
            lm.col_stride as isize,
            lm.row_stride as isize,
            rhs.as_ptr().add(rhs_at),
            rm.col_stride as isize,
            rm.row_stride as isize,
            T::ZERO,
            T::ONE,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// A matrix's pointer handed to the threads of one split product.
struct SharedDst<T>(*mut T);
// SAFETY: the threads of a split product write disjoint blocks of the
// matrix (see `gemm_split`), which outlives them.
unsafe impl<T: Send> Sync for SharedDst<T> {}

/// `dst = lhs[batch] · rhs[batch]` on `threads` threads: the output is cut
/// into that many blocks of whole rows (or of whole columns when it has
/// more columns than rows), each computed single-threaded. The GEMM
/// crate's own threading of one product scaled worse here: on two cores,
/// the Llama step's products (1024x256x688 and the like, plain and with a
/// transposed left operand) took 10-30% longer through it.
fn gemm_split<T: GemmFloat>(
    lhs: &[T],
    lm: &Matrices,
    rhs: &[T],
    rm: &Matrices,
    batch: usize,
    dst: &mut [T],
    threads: usize,
) {
    let (m, n) = (lm.rows, rm.cols);
    debug_assert_eq!(dst.len(), m * n);
    // Blocks of whole micro-tiles (a multiple of 16 rows or columns).
    let along = m.max(n);
    let per = along.div_ceil(threads).next_multiple_of(16);
    let blocks = along.div_ceil(per);
    let out = SharedDst(dst.as_mut_ptr());
    let out = &out;
    let block = |b: usize| {
        let cut = b * per..((b + 1) * per).min(along);
        let (rows, cols) = if m >= n { (cut, 0..n) } else { (0..m, cut) };
        // SAFETY: `dst` holds m × n elements (asserted by the caller) and
        // is borrowed uniquely for this call; the blocks are disjoint.
        unsafe { gemm_block(lhs, lm, rhs, rm, batch, out.0, (rows, cols)) }
    };
    // The calling thread (a stream's executor) computes the first block
    // and the pool the others: handing every block to the pool left the
    // caller asleep until the last one finished, one more thread to wake
    // on each side of a product.
    rayon::in_place_scope(|s| {
        for b in 1..blocks {
            s.spawn(move |_| block(b));
        }
        block(0);
    });
}

/// The cores this process may use, asked once: on Linux the standard
/// library reads the cgroup's CPU quota from files on every call, which
/// cost 50-70 us a product (8-20% of a 1024x256x256 one).
fn available_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `dst[b] = lhs[b] · rhs[b]` for every batch b; `dst` is row-major
/// [batch, m, n].
fn batched_gemm<T: GemmFloat>(
    lhs: &[T],
    lm: &Matrices,
    rhs: &[T],
    rm: &Matrices,
    dst: &mut [T],
) -> Result<()> {
    let (m, k, n) = (lm.rows, lm.cols, rm.cols);
    let batches = lm.offsets.len();
    if rm.rows != k || rm.offsets.len() != batches || dst.len() != batches * m * n {
        return Err(Error::Internal(format!(
            "batched product of {lm:?} and {rm:?} into {} elements",
            dst.len()
        )));
    }
    lm.check(lhs.len(), "lhs")?;
    rm.check(rhs.len(), "rhs")?;
    if dst.is_empty() {
        return Ok(());
    }
    if k == 0 {
        dst.fill(T::ZERO);
        return Ok(());
    }
    let work = m * n * k;
    let threads = available_threads().min(batches);
    // One product above the GEMM crate's threading threshold is cut into
    // blocks, one per thread (`gemm_split`); many products below it are
    // dealt out to the threads whole.
    if threads > 1 && work < gemm::get_threading_threshold() && work * batches >= MIN_PARALLEL_WORK
    {
        // Many small products: give each thread a run of whole batches.
        use rayon::prelude::*;
        let per_thread = batches.div_ceil(threads);
        dst.par_chunks_mut(per_thread * m * n)
            .enumerate()
            .for_each(|(t, chunk)| {
                for (i, out) in chunk.chunks_exact_mut(m * n).enumerate() {
                    let b = t * per_thread + i;
                    // SAFETY: `out` is matrix b's own m × n chunk.
                    unsafe { gemm_block(lhs, lm, rhs, rm, b, out.as_mut_ptr(), (0..m, 0..n)) }
                }
            });
    } else {
        let threads = if work >= gemm::get_threading_threshold() {
            available_threads().min(rayon::current_num_threads())
        } else {
            1
        };
        for (b, out) in dst.chunks_exact_mut(m * n).enumerate() {
            if threads > 1 {
                gemm_split(lhs, lm, rhs, rm, b, out, threads);
            } else {
                // SAFETY: `out` is matrix b's own m × n chunk.
                unsafe { gemm_block(lhs, lm, rhs, rm, b, out.as_mut_ptr(), (0..m, 0..n)) }
            }
        }
    }
    Ok(())
}

/// Integer arithmetic for the plain product loop.
trait WrappingInt: Copy + PartialEq {
    const ZERO: Self;
    fn mul_add(self, a: Self, b: Self) -> Self;
}
macro_rules! wrapping_int {
    ($($t:ty),*) => {$(
        impl WrappingInt for $t {
            const ZERO: Self = 0;
            fn mul_add(self, a: Self, b: Self) -> Self {
                self.wrapping_add(a.wrapping_mul(b))
            }
        }
    )*};
}
wrapping_int!(u8, i8, i32, i64);

fn batched_int_product<T: WrappingInt>(
    lhs: &[T],
    lm: &Matrices,
    rhs: &[T],
    rm: &Matrices,
    dst: &mut [T],
) -> Result<()> {
    let (m, k, n) = (lm.rows, lm.cols, rm.cols);
    if rm.rows != k || rm.offsets.len() != lm.offsets.len() || dst.len() != lm.offsets.len() * m * n
    {
        return Err(Error::Internal(format!(
            "batched product of {lm:?} and {rm:?} into {} elements",
            dst.len()
        )));
    }
    lm.check(lhs.len(), "lhs")?;
    rm.check(rhs.len(), "rhs")?;
    if m * n == 0 {
        return Ok(());
    }
    for (b, out) in dst.chunks_exact_mut(m * n).enumerate() {
        let (lo, ro) = (lm.offsets[b], rm.offsets[b]);
        for (i, out_row) in out.chunks_exact_mut(n).enumerate() {
            for p in 0..k {
                let a = lhs[lo + i * lm.row_stride + p * lm.col_stride];
                if a == T::ZERO {
                    continue;
                }
                let base = ro + p * rm.row_stride;
                if rm.col_stride == 1 {
                    for (o, &v) in out_row.iter_mut().zip(&rhs[base..base + n]) {
                        *o = o.mul_add(a, v);
                    }
                } else {
                    for (j, o) in out_row.iter_mut().enumerate() {
                        *o = o.mul_add(a, rhs[base + j * rm.col_stride]);
                    }
                }
            }
        }
    }
    Ok(())
}

fn to_f32(t: &HostTensor) -> Result<HostTensor> {
    let values = match t.dtype() {
        DType::F16 => t.as_slice::<f16>().to_f32_vec(),
        DType::BF16 => t.as_slice::<bf16>().to_f32_vec(),
        _ => return Err(Error::Internal(format!("{} is not a half type", t.ty))),
    };
    HostTensor::from_slice(DType::F32, t.dims(), &values)
}

/// `wide` (f32) rounded once into `out`'s half dtype.
fn round_into(wide: &[f32], out: &mut HostTensor) {
    match out.dtype() {
        DType::F16 => out.as_slice_mut::<f16>().convert_from_f32_slice(wide),
        _ => out.as_slice_mut::<bf16>().convert_from_f32_slice(wide),
    }
}

/// The dimension lists of a `Prim::DotGeneral`.
#[derive(Clone, Copy, Debug)]
pub struct DotDims<'a> {
    pub lhs_batch: &'a [usize],
    pub rhs_batch: &'a [usize],
    pub lhs_contract: &'a [usize],
    pub rhs_contract: &'a [usize],
}

impl<'a> DotDims<'a> {
    /// A product's dimension lists; None for another primitive. (Its
    /// precision was emulated before it got here: `ops::expand_precision`.)
    pub fn of(prim: &'a crate::ir::Prim) -> Option<Self> {
        match prim {
            crate::ir::Prim::DotGeneral {
                lhs_batch,
                rhs_batch,
                lhs_contract,
                rhs_contract,
                ..
            } => Some(DotDims {
                lhs_batch,
                rhs_batch,
                lhs_contract,
                rhs_contract,
            }),
            _ => None,
        }
    }
}

/// Both operands as batches of matrices: lhs [batch, free, contract] and
/// rhs [batch, contract, free], in place where their layouts allow.
type MatrixOperand<'a> = (Cow<'a, HostTensor>, Matrices);

fn operands<'a>(
    lhs: &'a HostTensor,
    rhs: &'a HostTensor,
    dims: DotDims,
) -> Result<(MatrixOperand<'a>, MatrixOperand<'a>)> {
    let DotDims {
        lhs_batch,
        rhs_batch,
        lhs_contract,
        rhs_contract,
    } = dims;
    let free = |rank: usize, batch: &[usize], contract: &[usize]| -> Vec<usize> {
        (0..rank)
            .filter(|d| !batch.contains(d) && !contract.contains(d))
            .collect()
    };
    let lhs_free = free(lhs.ty.rank(), lhs_batch, lhs_contract);
    let rhs_free = free(rhs.ty.rank(), rhs_batch, rhs_contract);
    Ok((
        matrices(lhs, lhs_batch, &lhs_free, lhs_contract)?,
        matrices(rhs, rhs_batch, rhs_contract, &rhs_free)?,
    ))
}

/// dot_general of f32 or f64 operands written straight into `dst`, the
/// bytes of a row-major result of type `out` (device memory, say).
pub fn dot_general_into(
    lhs: &HostTensor,
    rhs: &HostTensor,
    dims: DotDims,
    out: &TensorType,
    dst: &mut [u8],
) -> Result<()> {
    if lhs.dtype() != rhs.dtype() || out.dtype != lhs.dtype() || dst.len() as u64 != out.nbytes() {
        return Err(Error::Internal(format!(
            "a product of {} and {} into {} bytes of {out}",
            lhs.ty,
            rhs.ty,
            dst.len()
        )));
    }
    let ((l, lm), (r, rm)) = operands(lhs, rhs, dims)?;
    let misaligned = || Error::Internal(format!("{} result bytes are not aligned", out.dtype));
    match out.dtype {
        DType::F32 => batched_gemm::<f32>(
            l.as_slice(),
            &lm,
            r.as_slice(),
            &rm,
            bytemuck::try_cast_slice_mut(dst).map_err(|_| misaligned())?,
        ),
        DType::F64 => batched_gemm::<f64>(
            l.as_slice(),
            &lm,
            r.as_slice(),
            &rm,
            bytemuck::try_cast_slice_mut(dst).map_err(|_| misaligned())?,
        ),
        other => Err(Error::Internal(format!(
            "no product of {other} straight into memory"
        ))),
    }
}

pub fn dot_general(
    lhs: &HostTensor,
    rhs: &HostTensor,
    dims: DotDims,
    out: &TensorType,
) -> Result<HostTensor> {
    if lhs.dtype() != rhs.dtype() || out.dtype != lhs.dtype() {
        return Err(Error::invalid(format!(
            "operands {} and {} and result {out} need one dtype",
            lhs.ty, rhs.ty
        )));
    }
    // The float products write every element (an empty contraction
    // fills zeros); the integer loop accumulates into a zeroed result.
    let mut result = match out.dtype {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => {
            HostTensor::for_overwrite(out.clone())
        }
        _ => HostTensor::zeros(out.clone()),
    };
    if result.numel() == 0 {
        return Ok(result);
    }
    match lhs.dtype() {
        DType::F16 | DType::BF16 => {
            let wide_out = TensorType::new(DType::F32, &out.dims);
            let mut wide = HostTensor::for_overwrite(wide_out.clone());
            let (l, r) = (to_f32(lhs)?, to_f32(rhs)?);
            dot_general_into(&l, &r, dims, &wide_out, wide.bytes_mut())?;
            round_into(wide.as_slice(), &mut result);
        }
        DType::F32 | DType::F64 => {
            dot_general_into(lhs, rhs, dims, out, result.bytes_mut())?;
        }
        dtype => {
            let ((l, lm), (r, rm)) = operands(lhs, rhs, dims)?;
            let dst = &mut result;
            match dtype {
                DType::I32 => batched_int_product::<i32>(
                    l.as_slice(),
                    &lm,
                    r.as_slice(),
                    &rm,
                    dst.as_slice_mut(),
                )?,
                DType::I64 => batched_int_product::<i64>(
                    l.as_slice(),
                    &lm,
                    r.as_slice(),
                    &rm,
                    dst.as_slice_mut(),
                )?,
                DType::I8 => batched_int_product::<i8>(
                    l.as_slice(),
                    &lm,
                    r.as_slice(),
                    &rm,
                    dst.as_slice_mut(),
                )?,
                DType::U8 => batched_int_product::<u8>(
                    l.as_slice(),
                    &lm,
                    r.as_slice(),
                    &rm,
                    dst.as_slice_mut(),
                )?,
                other => return Err(Error::invalid(format!("no product of {other} operands"))),
            }
        }
    }
    Ok(result)
}

/// Sizes of one convolution, spatial dimensions in order.
struct ConvGeometry {
    batch: usize,
    in_channels: usize,
    out_channels: usize,
    groups: usize,
    input: Vec<usize>,
    kernel: Vec<usize>,
    output: Vec<usize>,
    stride: Vec<usize>,
    pad_low: Vec<usize>,
    dilation: Vec<usize>,
}

impl ConvGeometry {
    fn new(
        x: &TensorType,
        w: &TensorType,
        stride: &[u64],
        padding: &[(u64, u64)],
        dilation: &[u64],
        groups: u64,
        out: &TensorType,
    ) -> Result<Self> {
        let spatial = x.rank().saturating_sub(2);
        let valid = x.rank() >= 3
            && w.dtype == x.dtype
            && out.dtype == x.dtype
            && w.rank() == x.rank()
            && out.rank() == x.rank()
            && stride.len() == spatial
            && padding.len() == spatial
            && dilation.len() == spatial
            && groups > 0
            && x.dims[1] == w.dims[1] * groups
            && w.dims[0].is_multiple_of(groups)
            && out.dims[0] == x.dims[0]
            && out.dims[1] == w.dims[0]
            && stride.iter().chain(dilation).all(|&s| s > 0);
        if !valid {
            return Err(Error::invalid(format!(
                "convolution of {x} by {w} into {out} with stride {stride:?}, padding {padding:?}, \
                 dilation {dilation:?} and {groups} groups does not fit"
            )));
        }
        let g = ConvGeometry {
            batch: x.dims[0] as usize,
            in_channels: x.dims[1] as usize,
            out_channels: w.dims[0] as usize,
            groups: groups as usize,
            input: to_usize(&x.dims[2..]),
            kernel: to_usize(&w.dims[2..]),
            output: to_usize(&out.dims[2..]),
            stride: to_usize(stride),
            pad_low: padding.iter().map(|p| p.0 as usize).collect(),
            dilation: to_usize(dilation),
        };
        for (d, &(low, high)) in padding.iter().enumerate() {
            let reach = g.dilation[d] * (g.kernel[d].max(1) - 1) + 1;
            let padded = g.input[d] + (low + high) as usize;
            if padded < reach || g.output[d] != (padded - reach) / g.stride[d] + 1 {
                return Err(Error::invalid(format!(
                    "spatial dimension {d}: output size {} does not match the input, kernel and padding",
                    g.output[d]
                )));
            }
        }
        Ok(g)
    }

    /// A 1×…×1 kernel with stride 1 and no padding reads the input as it is.
    fn is_pointwise(&self) -> bool {
        self.kernel.iter().all(|&k| k == 1)
            && self.stride.iter().all(|&s| s == 1)
            && self.pad_low.iter().all(|&p| p == 0)
            && self.input == self.output
    }
}

/// Fill `col` (rows: channel × kernel position, columns: output position)
/// with the input values each kernel tap sees, 0 where it sees padding.
fn im2col<T: GemmFloat>(x_group: &[T], g: &ConvGeometry, channels: usize, col: &mut [T]) {
    let last = g.input.len() - 1;
    let in_size: usize = g.input.iter().product();
    let out_size: usize = g.output.iter().product();
    let kernel_size: usize = g.kernel.iter().product();
    let in_strides = signed_strides(&g.input.iter().map(|&d| d as u64).collect::<Vec<_>>());
    let (in_last, out_last, stride_last) = (
        g.input[last] as isize,
        g.output[last],
        g.stride[last] as isize,
    );
    let mut tap = vec![0usize; g.kernel.len()];
    for c in 0..channels {
        let x_channel = &x_group[c * in_size..(c + 1) * in_size];
        for k in 0..kernel_size {
            let mut rest = k;
            for d in (0..=last).rev() {
                tap[d] = rest % g.kernel[d];
                rest /= g.kernel[d];
            }
            let row = &mut col[(c * kernel_size + k) * out_size..][..out_size];
            // Along the last dimension, output o reads input o·stride + shift;
            // [lo, hi) are the outputs that land inside the input.
            let shift = (tap[last] * g.dilation[last]) as isize - g.pad_low[last] as isize;
            let lo = if shift < 0 {
                (-shift + stride_last - 1) / stride_last
            } else {
                0
            };
            let hi = if in_last > shift {
                (in_last - shift + stride_last - 1) / stride_last
            } else {
                0
            };
            let lo = (lo as usize).min(out_last);
            let hi = (hi as usize).clamp(lo, out_last);
            for (q, segment) in row.chunks_exact_mut(out_last).enumerate() {
                let mut rest = q;
                let mut base = 0isize;
                let mut inside = true;
                for d in (0..last).rev() {
                    let o = rest % g.output[d];
                    rest /= g.output[d];
                    let i =
                        (o * g.stride[d] + tap[d] * g.dilation[d]) as isize - g.pad_low[d] as isize;
                    if i < 0 || i >= g.input[d] as isize {
                        inside = false;
                        break;
                    }
                    base += i * in_strides[d];
                }
                if !inside || lo == hi {
                    segment.fill(T::ZERO);
                    continue;
                }
                segment[..lo].fill(T::ZERO);
                segment[hi..].fill(T::ZERO);
                let start = (base + lo as isize * stride_last + shift) as usize;
                let step = stride_last as usize;
                if step == 1 {
                    segment[lo..hi].copy_from_slice(&x_channel[start..start + (hi - lo)]);
                } else {
                    for (j, o) in segment[lo..hi].iter_mut().enumerate() {
                        *o = x_channel[start + j * step];
                    }
                }
            }
        }
    }
}

fn convolve<T: GemmFloat>(x: &[T], w: &[T], g: &ConvGeometry, out: &mut [T]) -> Result<()> {
    let (cg, og) = (g.in_channels / g.groups, g.out_channels / g.groups);
    let kernel_size: usize = g.kernel.iter().product();
    let (in_size, out_size) = (
        g.input.iter().product::<usize>(),
        g.output.iter().product::<usize>(),
    );
    let depth = cg * kernel_size;
    if out.is_empty() || depth == 0 {
        return Ok(());
    }
    let pointwise = g.is_pointwise();
    let mut col = if pointwise {
        Vec::new()
    } else {
        vec![T::ZERO; depth * out_size]
    };
    let weights = Matrices::single(og, depth);
    let columns = Matrices::single(depth, out_size);
    for n in 0..g.batch {
        for group in 0..g.groups {
            let x_group = &x[(n * g.in_channels + group * cg) * in_size..][..cg * in_size];
            let cols: &[T] = if pointwise {
                x_group
            } else {
                im2col(x_group, g, cg, &mut col);
                &col
            };
            let w_group = &w[group * og * depth..][..og * depth];
            let out_group =
                &mut out[(n * g.out_channels + group * og) * out_size..][..og * out_size];
            batched_gemm(w_group, &weights, cols, &columns, out_group)?;
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub fn convolution(
    x: &HostTensor,
    w: &HostTensor,
    stride: &[u64],
    padding: &[(u64, u64)],
    dilation: &[u64],
    groups: u64,
    out: &TensorType,
) -> Result<HostTensor> {
    let g = ConvGeometry::new(&x.ty, &w.ty, stride, padding, dilation, groups, out)?;
    let mut result = HostTensor::zeros(out.clone());
    match x.dtype() {
        DType::F32 => convolve::<f32>(x.as_slice(), w.as_slice(), &g, result.as_slice_mut())?,
        DType::F64 => convolve::<f64>(x.as_slice(), w.as_slice(), &g, result.as_slice_mut())?,
        DType::F16 | DType::BF16 => {
            let mut wide = vec![0f32; result.numel()];
            convolve::<f32>(to_f32(x)?.as_slice(), to_f32(w)?.as_slice(), &g, &mut wide)?;
            round_into(&wide, &mut result);
        }
        other => {
            return Err(Error::invalid(format!(
                "convolution needs floating-point operands, got {other}"
            )))
        }
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::super::structural::tests::{ravel, unravel, values};
    use super::super::{eval, HostTensor};
    use crate::ir::{DType, Prim};

    /// Values in -2..2 in steps of 1/4: exact in every float dtype, so
    /// the f32 sums are exact and only the final rounding differs.
    fn operand(dtype: DType, dims: &[u64], seed: u64) -> HostTensor {
        let n = dims.iter().product::<u64>() as usize;
        let v: Vec<f64> = values(DType::I64, n, seed)
            .iter()
            .map(|v| {
                if dtype.is_float() {
                    (v % 17.0 - 8.0) / 4.0
                } else {
                    v % 5.0 - 2.0
                }
            })
            .collect();
        HostTensor::from_f64(dtype, dims, &v).unwrap()
    }

    /// Relative error allowed after the one rounding to `dtype`.
    fn tolerance(dtype: DType) -> f64 {
        match dtype {
            DType::BF16 => 1.0 / 256.0,
            DType::F16 => 1.0 / 2048.0,
            DType::F32 => 1e-6,
            DType::F64 => 1e-12,
            _ => 0.0,
        }
    }

    fn assert_close(got: &HostTensor, expected: &[f64], magnitude: &[f64], what: &str) {
        let tol = tolerance(got.dtype());
        assert_eq!(got.numel(), expected.len(), "{what}");
        for (i, (&e, &m)) in expected.iter().zip(magnitude).enumerate() {
            let g = got.get_f64(i);
            assert!(
                (g - e).abs() <= tol * m.max(e.abs()) + 1e-9,
                "{what}: element {i} is {g}, expected {e}"
            );
        }
    }

    struct DotCase {
        lhs: &'static [u64],
        rhs: &'static [u64],
        lhs_batch: &'static [usize],
        rhs_batch: &'static [usize],
        lhs_contract: &'static [usize],
        rhs_contract: &'static [usize],
    }

    const DOT_CASES: &[DotCase] = &[
        // Plain, lhs transposed, rhs transposed, both transposed.
        DotCase {
            lhs: &[3, 4],
            rhs: &[4, 5],
            lhs_batch: &[],
            rhs_batch: &[],
            lhs_contract: &[1],
            rhs_contract: &[0],
        },
        DotCase {
            lhs: &[4, 3],
            rhs: &[4, 5],
            lhs_batch: &[],
            rhs_batch: &[],
            lhs_contract: &[0],
            rhs_contract: &[0],
        },
        DotCase {
            lhs: &[3, 4],
            rhs: &[5, 4],
            lhs_batch: &[],
            rhs_batch: &[],
            lhs_contract: &[1],
            rhs_contract: &[1],
        },
        DotCase {
            lhs: &[4, 3],
            rhs: &[5, 4],
            lhs_batch: &[],
            rhs_batch: &[],
            lhs_contract: &[0],
            rhs_contract: &[1],
        },
        // Vector products, outer product (no contraction).
        DotCase {
            lhs: &[7],
            rhs: &[7],
            lhs_batch: &[],
            rhs_batch: &[],
            lhs_contract: &[0],
            rhs_contract: &[0],
        },
        DotCase {
            lhs: &[3],
            rhs: &[4],
            lhs_batch: &[],
            rhs_batch: &[],
            lhs_contract: &[],
            rhs_contract: &[],
        },
        DotCase {
            lhs: &[6],
            rhs: &[6, 2],
            lhs_batch: &[],
            rhs_batch: &[],
            lhs_contract: &[0],
            rhs_contract: &[0],
        },
        // Batched, batch dims elsewhere, two batch dims.
        DotCase {
            lhs: &[2, 3, 4],
            rhs: &[2, 4, 5],
            lhs_batch: &[0],
            rhs_batch: &[0],
            lhs_contract: &[2],
            rhs_contract: &[1],
        },
        DotCase {
            lhs: &[3, 2, 4],
            rhs: &[4, 5, 2],
            lhs_batch: &[1],
            rhs_batch: &[2],
            lhs_contract: &[2],
            rhs_contract: &[0],
        },
        DotCase {
            lhs: &[2, 3, 4, 5],
            rhs: &[2, 3, 5, 6],
            lhs_batch: &[0, 1],
            rhs_batch: &[0, 1],
            lhs_contract: &[3],
            rhs_contract: &[2],
        },
        DotCase {
            lhs: &[2, 3, 4, 5],
            rhs: &[3, 5, 2],
            lhs_batch: &[1, 0],
            rhs_batch: &[0, 2],
            lhs_contract: &[3],
            rhs_contract: &[1],
        },
        // Two contracting dims in a scattered order (forces the copy path),
        // free dims that do not collapse, size-1 dims.
        DotCase {
            lhs: &[2, 3, 4, 5],
            rhs: &[3, 6, 5],
            lhs_batch: &[],
            rhs_batch: &[],
            lhs_contract: &[1, 3],
            rhs_contract: &[0, 2],
        },
        DotCase {
            lhs: &[2, 3, 4],
            rhs: &[3, 2],
            lhs_batch: &[],
            rhs_batch: &[],
            lhs_contract: &[1],
            rhs_contract: &[0],
        },
        DotCase {
            lhs: &[1, 3, 1, 4],
            rhs: &[4, 1, 2],
            lhs_batch: &[],
            rhs_batch: &[],
            lhs_contract: &[3],
            rhs_contract: &[0],
        },
        // Zero sizes: empty result, empty contraction, empty batch.
        DotCase {
            lhs: &[0, 4],
            rhs: &[4, 3],
            lhs_batch: &[],
            rhs_batch: &[],
            lhs_contract: &[1],
            rhs_contract: &[0],
        },
        DotCase {
            lhs: &[3, 0],
            rhs: &[0, 4],
            lhs_batch: &[],
            rhs_batch: &[],
            lhs_contract: &[1],
            rhs_contract: &[0],
        },
        DotCase {
            lhs: &[0, 2, 3],
            rhs: &[0, 3, 2],
            lhs_batch: &[0],
            rhs_batch: &[0],
            lhs_contract: &[2],
            rhs_contract: &[1],
        },
        // Large enough for the GEMM's threads, and many small batches for ours.
        DotCase {
            lhs: &[96, 80],
            rhs: &[80, 96],
            lhs_batch: &[],
            rhs_batch: &[],
            lhs_contract: &[1],
            rhs_contract: &[0],
        },
        DotCase {
            lhs: &[64, 32, 64],
            rhs: &[64, 32, 64],
            lhs_batch: &[0],
            rhs_batch: &[0],
            lhs_contract: &[2],
            rhs_contract: &[2],
        },
    ];

    /// The naive product in f64: values and the sum of |terms| per element.
    fn dot_reference(
        lhs: &HostTensor,
        rhs: &HostTensor,
        c: &DotCase,
        out_dims: &[u64],
    ) -> (Vec<f64>, Vec<f64>) {
        let free = |rank: usize, b: &[usize], k: &[usize]| -> Vec<usize> {
            (0..rank)
                .filter(|d| !b.contains(d) && !k.contains(d))
                .collect()
        };
        let (lf, rf) = (
            free(c.lhs.len(), c.lhs_batch, c.lhs_contract),
            free(c.rhs.len(), c.rhs_batch, c.rhs_contract),
        );
        let contract_dims: Vec<u64> = c.lhs_contract.iter().map(|&d| c.lhs[d]).collect();
        let k = contract_dims.iter().product::<u64>() as usize;
        // Element offsets of each contraction step in lhs and rhs.
        let steps: Vec<(usize, usize)> = (0..k)
            .map(|q| {
                let t = unravel(q, &contract_dims);
                let (mut li, mut ri) = (vec![0; c.lhs.len()], vec![0; c.rhs.len()]);
                for (i, (&a, &b)) in c.lhs_contract.iter().zip(c.rhs_contract).enumerate() {
                    li[a] = t[i];
                    ri[b] = t[i];
                }
                (ravel(&li, c.lhs), ravel(&ri, c.rhs))
            })
            .collect();
        let (l, r) = (lhs.to_f64_vec(), rhs.to_f64_vec());
        let n = out_dims.iter().product::<u64>() as usize;
        let (mut value, mut magnitude) = (vec![0.0; n], vec![0.0; n]);
        for p in 0..n {
            let o = unravel(p, out_dims);
            let nb = c.lhs_batch.len();
            let (mut li, mut ri) = (vec![0; c.lhs.len()], vec![0; c.rhs.len()]);
            for (i, (&a, &b)) in c.lhs_batch.iter().zip(c.rhs_batch).enumerate() {
                li[a] = o[i];
                ri[b] = o[i];
            }
            for (i, &d) in lf.iter().enumerate() {
                li[d] = o[nb + i];
            }
            for (i, &d) in rf.iter().enumerate() {
                ri[d] = o[nb + lf.len() + i];
            }
            let (lb, rb) = (ravel(&li, c.lhs), ravel(&ri, c.rhs));
            for &(ls, rs) in &steps {
                let term = l[lb + ls] * r[rb + rs];
                value[p] += term;
                magnitude[p] += term.abs();
            }
        }
        (value, magnitude)
    }

    /// `c` in `dtype` (operands from `seed`) against the naive product.
    fn check_case(dtype: DType, c: &DotCase, seed: u64, what: &str) {
        let lhs = operand(dtype, c.lhs, seed);
        let rhs = operand(dtype, c.rhs, seed + 1000);
        let prim = Prim::DotGeneral {
            lhs_batch: c.lhs_batch.to_vec(),
            rhs_batch: c.rhs_batch.to_vec(),
            lhs_contract: c.lhs_contract.to_vec(),
            rhs_contract: c.rhs_contract.to_vec(),
            precision: Default::default(),
        };
        let out = eval(&prim, &[&lhs, &rhs]).unwrap_or_else(|e| panic!("{what}: {e}"));
        let (expected, magnitude) = dot_reference(&lhs, &rhs, c, out[0].dims());
        assert_close(&out[0], &expected, &magnitude, what);
    }

    #[test]
    fn dot_general_matches_a_naive_loop() {
        for dtype in [
            DType::F32,
            DType::F64,
            DType::BF16,
            DType::F16,
            DType::I32,
            DType::I64,
        ] {
            for (seed, c) in DOT_CASES.iter().enumerate() {
                // The largest case (the threaded batches) is slow to check
                // in a debug build; its path is the same for every float.
                if c.lhs.iter().product::<u64>() > 100_000 && dtype != DType::F32 {
                    continue;
                }
                check_case(dtype, c, seed as u64, &format!("{dtype} case {seed}"));
            }
        }
    }

    /// Products above the GEMM crate's threading threshold are cut into one
    /// block of output rows or columns per thread (`gemm_split`): blocks
    /// that are not whole micro-tiles, a transposed left operand, columns
    /// cut rather than rows, and a batch of such products.
    #[test]
    fn products_cut_into_blocks_match_a_naive_loop() {
        let cases = [
            // 100 rows cut as 64 + 36.
            DotCase {
                lhs: &[100, 200],
                rhs: &[200, 37],
                lhs_batch: &[],
                rhs_batch: &[],
                lhs_contract: &[1],
                rhs_contract: &[0],
            },
            // lhs read transposed; 300 columns cut as 160 + 140.
            DotCase {
                lhs: &[200, 37],
                rhs: &[200, 300],
                lhs_batch: &[],
                rhs_batch: &[],
                lhs_contract: &[0],
                rhs_contract: &[0],
            },
            DotCase {
                lhs: &[2, 90, 80],
                rhs: &[2, 80, 90],
                lhs_batch: &[0],
                rhs_batch: &[0],
                lhs_contract: &[2],
                rhs_contract: &[1],
            },
        ];
        for (seed, c) in cases.iter().enumerate() {
            // Each matrix's m·k·n is above the threshold.
            let size = |dims: &[u64], of: &[usize]| of.iter().map(|&d| dims[d]).product::<u64>();
            let batch = size(c.lhs, c.lhs_batch);
            let n = c.rhs.iter().product::<u64>() / batch / size(c.rhs, c.rhs_contract);
            let work = c.lhs.iter().product::<u64>() / batch * n;
            assert!(work >= gemm::get_threading_threshold() as u64, "{work}");
            for dtype in [DType::F32, DType::F64] {
                let what = format!("{dtype} {:?} x {:?}", c.lhs, c.rhs);
                check_case(dtype, c, seed as u64, &what);
            }
        }
    }

    /// Float results start from a reused scratch buffer without clearing
    /// it: none of its old bytes may show, for empty, short and normal
    /// contractions; the integer loop, which accumulates, still starts
    /// from zeros.
    #[test]
    fn a_reused_buffers_old_bytes_never_show_in_a_product() {
        for dtype in [DType::F32, DType::I32] {
            let shapes: [(&'static [u64], &'static [u64]); 3] = [
                (&[512, 0], &[0, 512]),
                (&[512, 1], &[1, 512]),
                (&[512, 3], &[3, 512]),
            ];
            for (lhs_dims, rhs_dims) in shapes {
                // 1 MiB of garbage, dropped into the thread's scratch list.
                let junk_type = crate::ir::TensorType::new(dtype, &[512, 512]);
                let mut junk = HostTensor::zeros(junk_type);
                junk.bytes_mut().fill(0x7f);
                drop(junk);
                let c = DotCase {
                    lhs: lhs_dims,
                    rhs: rhs_dims,
                    lhs_batch: &[],
                    rhs_batch: &[],
                    lhs_contract: &[1],
                    rhs_contract: &[0],
                };
                let lhs = operand(dtype, lhs_dims, 1);
                let rhs = operand(dtype, rhs_dims, 2);
                let prim = Prim::DotGeneral {
                    lhs_batch: vec![],
                    rhs_batch: vec![],
                    lhs_contract: vec![1],
                    rhs_contract: vec![0],
                    precision: Default::default(),
                };
                let out = eval(&prim, &[&lhs, &rhs]).unwrap();
                let (expected, magnitude) = dot_reference(&lhs, &rhs, &c, out[0].dims());
                let what = format!("{dtype} {lhs_dims:?}");
                assert_close(&out[0], &expected, &magnitude, &what);
            }
        }
    }

    #[test]
    fn integer_products_wrap() {
        let lhs = HostTensor::from_slice::<i8>(DType::I8, &[1, 2], &[100, 100]).unwrap();
        let rhs = HostTensor::from_slice::<i8>(DType::I8, &[2, 1], &[2, 1]).unwrap();
        let prim = Prim::DotGeneral {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract: vec![1],
            rhs_contract: vec![0],
            precision: Default::default(),
        };
        let out = eval(&prim, &[&lhs, &rhs]).unwrap();
        assert_eq!(out[0].as_slice::<i8>(), &[(300i32 as i8)]);
        let lhs = HostTensor::from_slice::<u8>(DType::U8, &[2], &[200, 3]).unwrap();
        let rhs = HostTensor::from_slice::<u8>(DType::U8, &[2], &[2, 5]).unwrap();
        let prim = Prim::DotGeneral {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract: vec![0],
            rhs_contract: vec![0],
            precision: Default::default(),
        };
        assert_eq!(
            eval(&prim, &[&lhs, &rhs]).unwrap()[0].as_slice::<u8>(),
            &[(415 % 256) as u8]
        );
    }

    struct ConvCase {
        x: &'static [u64],
        w: &'static [u64],
        stride: &'static [u64],
        padding: &'static [(u64, u64)],
        dilation: &'static [u64],
        groups: u64,
    }

    const CONV_CASES: &[ConvCase] = &[
        ConvCase {
            x: &[1, 1, 5],
            w: &[1, 1, 1],
            stride: &[1],
            padding: &[(0, 0)],
            dilation: &[1],
            groups: 1,
        },
        ConvCase {
            x: &[2, 3, 9],
            w: &[4, 3, 3],
            stride: &[1],
            padding: &[(0, 0)],
            dilation: &[1],
            groups: 1,
        },
        ConvCase {
            x: &[2, 4, 10],
            w: &[6, 2, 3],
            stride: &[2],
            padding: &[(1, 2)],
            dilation: &[2],
            groups: 2,
        },
        ConvCase {
            x: &[1, 2, 4],
            w: &[3, 2, 2],
            stride: &[3],
            padding: &[(3, 3)],
            dilation: &[1],
            groups: 1,
        },
        ConvCase {
            x: &[2, 3, 7, 6],
            w: &[4, 3, 3, 2],
            stride: &[2, 1],
            padding: &[(1, 1), (0, 2)],
            dilation: &[1, 2],
            groups: 1,
        },
        ConvCase {
            x: &[1, 4, 5, 5],
            w: &[4, 1, 3, 3],
            stride: &[1, 1],
            padding: &[(1, 1), (1, 1)],
            dilation: &[1, 1],
            groups: 4,
        },
        ConvCase {
            x: &[2, 6, 4, 3],
            w: &[4, 3, 1, 1],
            stride: &[1, 1],
            padding: &[(0, 0), (0, 0)],
            dilation: &[1, 1],
            groups: 2,
        },
        ConvCase {
            x: &[1, 2, 6, 5],
            w: &[2, 2, 1, 1],
            stride: &[2, 2],
            padding: &[(0, 1), (1, 0)],
            dilation: &[1, 1],
            groups: 1,
        },
        ConvCase {
            x: &[1, 2, 4, 4, 3],
            w: &[2, 2, 2, 2, 2],
            stride: &[1, 2, 1],
            padding: &[(1, 0), (0, 1), (1, 1)],
            dilation: &[1, 1, 2],
            groups: 1,
        },
        // Zero sizes: no images, no channels, an empty kernel.
        ConvCase {
            x: &[0, 2, 5],
            w: &[3, 2, 2],
            stride: &[1],
            padding: &[(0, 0)],
            dilation: &[1],
            groups: 1,
        },
        ConvCase {
            x: &[1, 0, 5],
            w: &[3, 0, 2],
            stride: &[1],
            padding: &[(0, 0)],
            dilation: &[1],
            groups: 1,
        },
        ConvCase {
            x: &[1, 2, 5],
            w: &[3, 2, 0],
            stride: &[1],
            padding: &[(0, 0)],
            dilation: &[1],
            groups: 1,
        },
        ConvCase {
            x: &[1, 2, 5, 4],
            w: &[0, 2, 2, 2],
            stride: &[1, 1],
            padding: &[(0, 0), (0, 0)],
            dilation: &[1, 1],
            groups: 1,
        },
    ];

    fn conv_reference(
        x: &HostTensor,
        w: &HostTensor,
        c: &ConvCase,
        out_dims: &[u64],
    ) -> (Vec<f64>, Vec<f64>) {
        let n = out_dims.iter().product::<u64>() as usize;
        let (mut value, mut magnitude) = (vec![0.0; n], vec![0.0; n]);
        let cg = c.w[1] as usize;
        let og = (c.w[0] / c.groups) as usize;
        let kernel = &c.w[2..];
        let taps = kernel.iter().product::<u64>() as usize;
        for p in 0..n {
            let o = unravel(p, out_dims);
            let group = o[1] / og;
            for ci in 0..cg {
                'tap: for t in 0..taps {
                    let k = unravel(t, kernel);
                    let mut xi = vec![o[0], group * cg + ci];
                    for d in 0..kernel.len() {
                        let pos = (o[2 + d] as u64 * c.stride[d] + k[d] as u64 * c.dilation[d])
                            as i64
                            - c.padding[d].0 as i64;
                        if pos < 0 || pos >= c.x[2 + d] as i64 {
                            continue 'tap;
                        }
                        xi.push(pos as usize);
                    }
                    let mut wi = vec![o[1], ci];
                    wi.extend(&k);
                    let term = x.get_f64(ravel(&xi, c.x)) * w.get_f64(ravel(&wi, c.w));
                    value[p] += term;
                    magnitude[p] += term.abs();
                }
            }
        }
        (value, magnitude)
    }

    #[test]
    fn convolution_matches_a_naive_loop() {
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            for (seed, c) in CONV_CASES.iter().enumerate() {
                let x = operand(dtype, c.x, seed as u64);
                let w = operand(dtype, c.w, seed as u64 + 1000);
                let prim = Prim::Convolution {
                    stride: c.stride.to_vec(),
                    padding: c.padding.to_vec(),
                    dilation: c.dilation.to_vec(),
                    groups: c.groups,
                    precision: Default::default(),
                };
                let out =
                    eval(&prim, &[&x, &w]).unwrap_or_else(|e| panic!("{dtype} case {seed}: {e}"));
                let (expected, magnitude) = conv_reference(&x, &w, c, out[0].dims());
                assert_close(
                    &out[0],
                    &expected,
                    &magnitude,
                    &format!("{dtype} conv case {seed}"),
                );
            }
        }
    }
}

#[cfg(test)]
mod throughput {
    //! Timings, ignored by default. Run with
    //! `cargo test --release -p tpurt-runtime throughput -- --ignored --nocapture --test-threads 1`.

    use std::time::Instant;

    use super::super::HostTensor;
    use crate::ir::{DType, TensorType};

    /// Best seconds per call of each function, over rounds that take turns
    /// so that load from elsewhere hits them alike.
    fn best_of(rounds: usize, fs: &mut [&mut dyn FnMut()]) -> Vec<f64> {
        let mut best = vec![f64::INFINITY; fs.len()];
        for f in fs.iter_mut() {
            f();
        }
        for _ in 0..rounds {
            for (f, b) in fs.iter_mut().zip(&mut best) {
                let start = Instant::now();
                f();
                *b = b.min(start.elapsed().as_secs_f64());
            }
        }
        best
    }

    /// A 2-D transpose (tiled) against a plain copy of the same bytes.
    #[test]
    #[ignore]
    fn transpose_throughput() {
        let n = 2048usize;
        let dims = [n as u64, n as u64];
        let values: Vec<f32> = (0..n * n).map(|i| i as f32).collect();
        let x = HostTensor::from_slice(DType::F32, &dims, &values).unwrap();
        let out = TensorType::new(DType::F32, &dims);
        let times = best_of(
            10,
            &mut [
                &mut || {
                    super::super::structural::transpose(&x, &[1, 0], &out).unwrap();
                },
                &mut || {
                    std::hint::black_box(x.clone());
                },
            ],
        );
        let gbs = |s: f64| 2.0 * (n * n * 4) as f64 / s / 1e9;
        println!(
            "f32 {n}x{n}: transpose {:.1} GB/s, plain copy {:.1} GB/s",
            gbs(times[0]),
            gbs(times[1])
        );
    }

    /// `c = a · b` by the GEMM crate called directly, the way dot_general
    /// calls it, into `c`.
    fn gemm_directly(n: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
        assert!(a.len() >= n * n && b.len() >= n * n && c.len() >= n * n);
        // SAFETY: all three are n × n row-major matrices (checked above).
        unsafe {
            gemm::gemm(
                n,
                n,
                n,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                n as isize,
                b.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(0),
            )
        }
    }

    /// f32 matmul through dot_general against the GEMM crate called
    /// directly, into a new tensor (as dot_general must) and into a reused
    /// buffer.
    #[test]
    #[ignore]
    fn matmul_throughput() {
        for n in [512usize, 1024, 2048] {
            let dims = [n as u64, n as u64];
            let values: Vec<f32> = (0..n * n).map(|i| (i % 13) as f32 * 0.25 - 1.5).collect();
            let a = HostTensor::from_slice(DType::F32, &dims, &values).unwrap();
            let b = HostTensor::from_slice(DType::F32, &dims, &values).unwrap();
            let out = TensorType::new(DType::F32, &dims);
            let mut reused = vec![0f32; n * n];
            let rounds = if n <= 1024 { 10 } else { 4 };
            let times = best_of(
                rounds,
                &mut [
                    &mut || {
                        let dims = super::DotDims {
                            lhs_batch: &[],
                            rhs_batch: &[],
                            lhs_contract: &[1],
                            rhs_contract: &[0],
                        };
                        super::dot_general(&a, &b, dims, &out).unwrap();
                    },
                    &mut || {
                        let mut c = HostTensor::zeros(out.clone());
                        gemm_directly(n, a.as_slice(), b.as_slice(), c.as_slice_mut());
                    },
                    &mut || gemm_directly(n, a.as_slice(), b.as_slice(), &mut reused),
                ],
            );
            let gflops = |s: f64| 2.0 * (n as f64).powi(3) / s / 1e9;
            println!(
                "f32 {n}x{n}x{n}: dot_general {:.1} GFLOP/s; gemm directly: into a new tensor {:.1}, into a reused buffer {:.1}",
                gflops(times[0]),
                gflops(times[1]),
                gflops(times[2]),
            );
        }
    }
}
