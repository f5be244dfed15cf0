//! Host kernels: the emulated TPU's implementation of every primitive.
//!
//! A kernel takes contiguous row-major tensors ([`HostTensor`]) and returns
//! new ones. Types were checked when the graph was built; kernels still
//! check data (indices, sizes) and return errors, never panic or read out
//! of bounds. bf16 and f16 are computed in f32 and rounded once on store.

mod attention;
mod dot;
mod elementwise;
mod householder;
mod jacobi;
#[cfg(test)]
pub(crate) use elementwise::tests::IEEE_COMPARES;
// The xla platform's Jacobi loop stops where the host kernel's does.
#[cfg(feature = "xla")]
pub(crate) use jacobi::MAX_SWEEPS as JACOBI_MAX_SWEEPS;
mod index;
mod linalg;
mod reduce;
pub(crate) mod rng;
mod sort;
mod structural;
pub(crate) use structural::StridedCopy;
#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
use crate::ir::{DType, Graph, Prim, TensorType};

/// Bytes with 8-byte alignment, so typed views of any dtype are aligned.
/// Or, for an input read in place, a read-only view of device memory (see
/// [`HostTensor::borrow_device`]); writing to such a view copies it first.
/// Owned bytes are shared by clones (a reshape is a clone under new dims)
/// and copied on the first write to a shared one.
#[derive(Clone)]
pub struct AlignedBytes {
    /// None for a borrowed view.
    words: Option<std::sync::Arc<Vec<u64>>>,
    len: usize,
    /// Non-null: the bytes live there (borrowed, read-only), not in `words`.
    borrowed: *const u8,
}

// SAFETY: owned bytes are a plain Vec; a borrowed view is read-only and its
// creator (`HostTensor::borrow_device`) guarantees the memory stays valid
// and unwritten while any copy of the view exists.
unsafe impl Send for AlignedBytes {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for AlignedBytes {}

impl PartialEq for AlignedBytes {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

/// Large host buffers are kept after use and handed out again: a fresh
/// multi-megabyte allocation costs a page fault per 4 KiB on first touch,
/// which dominated big elementwise kernels. One cache for the process, not
/// one per thread: a plan runs on whichever pool worker picks it up, and
/// its values are dropped on the stream's executor thread, so per-thread
/// caches missed (four to six times the page faults of a deferred block).
/// From 64 KiB: smaller fresh buffers are zeroed by the allocator, and a
/// training step's weight-sized values (256 KiB in the Llama step) paid
/// that for every kernel; 128 buffers cover a step's live set.
const SCRATCH_MIN_BYTES: usize = 64 << 10;
const SCRATCH_MAX_BUFFERS: usize = 128;
const SCRATCH_MAX_BYTES: usize = 384 << 20;

static SCRATCH: std::sync::Mutex<Vec<Vec<u64>>> = std::sync::Mutex::new(Vec::new());

fn scratch() -> std::sync::MutexGuard<'static, Vec<Vec<u64>>> {
    // The cache holds plain buffers: one left by a panicking holder is fine.
    SCRATCH.lock().unwrap_or_else(|e| e.into_inner())
}

fn take_scratch(words: usize) -> Option<Vec<u64>> {
    let mut s = scratch();
    // Smallest cached buffer that fits without wasting more than half.
    let best = s
        .iter()
        .enumerate()
        .filter(|(_, v)| v.capacity() >= words && v.capacity() <= words * 2)
        .min_by_key(|(_, v)| v.capacity())
        .map(|(i, _)| i)?;
    Some(s.swap_remove(best))
}

impl Drop for AlignedBytes {
    fn drop(&mut self) {
        // The last holder of shared bytes hands them on.
        let Some(Ok(words)) = self.words.take().map(std::sync::Arc::try_unwrap) else {
            return;
        };
        let bytes = words.capacity() * 8;
        if bytes < SCRATCH_MIN_BYTES {
            return;
        }
        let mut s = scratch();
        let held: usize = s.iter().map(|v| v.capacity() * 8).sum();
        if s.len() < SCRATCH_MAX_BUFFERS && held + bytes <= SCRATCH_MAX_BYTES {
            s.push(words);
        }
    }
}

impl AlignedBytes {
    pub fn zeroed(len: usize) -> Self {
        Self::new(len, true)
    }

    /// `len` bytes for a kernel that writes every one of them: a reused
    /// buffer keeps its old bytes instead of being cleared first.
    pub fn for_overwrite(len: usize) -> Self {
        Self::new(len, false)
    }

    fn new(len: usize, zero: bool) -> Self {
        let n = len.div_ceil(8);
        let words = if n * 8 >= SCRATCH_MIN_BYTES {
            match take_scratch(n) {
                Some(mut v) => {
                    if zero {
                        v.clear();
                    }
                    v.resize(n, 0);
                    v
                }
                None => vec![0; n],
            }
        } else {
            vec![0; n]
        };
        AlignedBytes {
            words: Some(std::sync::Arc::new(words)),
            len,
            borrowed: std::ptr::null(),
        }
    }
    pub fn from_bytes(bytes: &[u8]) -> Self {
        let mut a = Self::for_overwrite(bytes.len());
        a.as_bytes_mut().copy_from_slice(bytes);
        a
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn as_bytes(&self) -> &[u8] {
        if !self.borrowed.is_null() {
            // SAFETY: a borrowed view points at `len` readable bytes for as
            // long as it exists (the contract of `HostTensor::borrow_device`).
            return unsafe { std::slice::from_raw_parts(self.borrowed, self.len) };
        }
        match &self.words {
            Some(w) => &bytemuck::cast_slice(w.as_slice())[..self.len],
            None => &[],
        }
    }
    /// Whether these bytes are a view of device memory (not owned).
    pub fn is_view(&self) -> bool {
        !self.borrowed.is_null()
    }
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        let shared = self
            .words
            .as_ref()
            .is_some_and(|w| std::sync::Arc::strong_count(w) > 1);
        if !self.borrowed.is_null() || shared || self.words.is_none() {
            // Never write through a view of device memory, or into bytes
            // another tensor holds: own a copy first.
            let copy = Self::from_bytes(self.as_bytes());
            *self = copy;
        }
        let len = self.len;
        match &mut self.words {
            // Unique here, so this never copies.
            Some(w) => {
                &mut bytemuck::cast_slice_mut(std::sync::Arc::make_mut(w).as_mut_slice())[..len]
            }
            None => &mut [],
        }
    }
}

/// A contiguous row-major tensor in host memory, little-endian elements.
#[derive(Clone, PartialEq)]
pub struct HostTensor {
    pub ty: TensorType,
    pub data: AlignedBytes,
}

impl std::fmt::Debug for HostTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostTensor({}", self.ty)?;
        let n = self.ty.numel().min(8) as usize;
        let vals: Vec<f64> = (0..n).map(|i| self.get_f64(i)).collect();
        write!(
            f,
            " {vals:?}{})",
            if self.ty.numel() > 8 { "..." } else { "" }
        )
    }
}

/// Element types as Rust types. `Bool` is stored as u8 0/1.
pub trait Element: bytemuck::Pod + Copy + Send + Sync + 'static {
    const DTYPE: DType;
}
macro_rules! element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    };
}
element!(u8, U8);
element!(i8, I8);
element!(i32, I32);
element!(i64, I64);
element!(half::f16, F16);
element!(half::bf16, BF16);
element!(f32, F32);
element!(f64, F64);

impl HostTensor {
    pub fn zeros(ty: TensorType) -> Self {
        let n = ty.nbytes() as usize;
        HostTensor {
            ty,
            data: AlignedBytes::zeroed(n),
        }
    }

    /// A tensor whose every element the caller writes before reading:
    /// its initial contents are unspecified (zeros or a reused buffer's
    /// old bytes), which saves clearing it.
    pub fn for_overwrite(ty: TensorType) -> Self {
        let n = ty.nbytes() as usize;
        HostTensor {
            ty,
            data: AlignedBytes::for_overwrite(n),
        }
    }

    /// A read-only view of a contiguous device tensor's memory, without a
    /// copy. None when the tensor is not contiguous, not in host memory, or
    /// not aligned for its dtype.
    ///
    /// # Safety
    /// The tensor's memory must stay allocated and unwritten while the view
    /// or any clone of it exists (an executable's inputs, during `execute`).
    pub unsafe fn borrow_device(t: &crate::tensor::DeviceTensor) -> Option<Self> {
        if !t.is_contiguous() {
            return None;
        }
        // SAFETY: the caller's contract.
        unsafe { Self::borrow_span(t, t.ty()) }
    }

    /// A dense permuted view of device memory (a transposed weight, the
    /// keys of attention as `k.transpose(-2, -1)`) read in place: the
    /// tensor in its memory order, and `perm` with the view equal to
    /// `transpose(tensor, perm)`. None for views with gaps or repeats
    /// (slices, broadcasts), and as [`Self::borrow_device`] does.
    ///
    /// # Safety
    /// As for [`Self::borrow_device`].
    pub unsafe fn borrow_device_permuted(
        t: &crate::tensor::DeviceTensor,
    ) -> Option<(Self, Vec<usize>)> {
        let (sizes, strides) = (&t.layout.sizes, &t.layout.strides);
        // Size-1 dimensions keep their places; the others are ordered by
        // stride, outermost first, and must then step densely.
        let mut moving: Vec<usize> = (0..sizes.len()).filter(|&d| sizes[d] != 1).collect();
        moving.sort_by_key(|&d| std::cmp::Reverse(strides[d]));
        let mut expected = 1u64;
        for &d in moving.iter().rev() {
            if strides[d] != expected {
                return None;
            }
            expected *= sizes[d];
        }
        let mut next = moving.into_iter();
        let order: Vec<usize> = (0..sizes.len())
            .map(|d| {
                if sizes[d] == 1 {
                    d
                } else {
                    next.next().unwrap_or(d)
                }
            })
            .collect();
        let mut perm = vec![0; order.len()];
        for (position, &d) in order.iter().enumerate() {
            perm[d] = position;
        }
        let dims: Vec<u64> = order.iter().map(|&d| sizes[d]).collect();
        // SAFETY: the caller's contract; the permuted dims cover exactly
        // the view's elements, densely from its offset.
        let view = unsafe { Self::borrow_span(t, TensorType::new(t.dtype, &dims)) }?;
        Some((view, perm))
    }

    /// A view of `ty.nbytes()` bytes of `t`'s memory from its offset.
    ///
    /// # Safety
    /// As for [`Self::borrow_device`], and those bytes are `t`'s elements.
    unsafe fn borrow_span(t: &crate::tensor::DeviceTensor, ty: TensorType) -> Option<Self> {
        let ptr = aligned_host_ptr(t)? as *const u8;
        let len = ty.nbytes() as usize;
        Some(HostTensor {
            ty,
            data: AlignedBytes {
                words: None,
                len,
                borrowed: ptr,
            },
        })
    }

    pub fn from_bytes(ty: TensorType, bytes: &[u8]) -> Result<Self> {
        if bytes.len() as u64 != ty.nbytes() {
            return Err(Error::invalid(format!(
                "{} bytes for a tensor of type {ty} ({} bytes)",
                bytes.len(),
                ty.nbytes()
            )));
        }
        Ok(HostTensor {
            ty,
            data: AlignedBytes::from_bytes(bytes),
        })
    }

    /// From typed values; `dtype` may be Bool for u8 data.
    pub fn from_slice<T: Element>(dtype: DType, dims: &[u64], values: &[T]) -> Result<Self> {
        if dtype.size() != std::mem::size_of::<T>() {
            return Err(Error::invalid(format!(
                "{dtype} elements are not {}",
                std::any::type_name::<T>()
            )));
        }
        Self::from_bytes(TensorType::new(dtype, dims), bytemuck::cast_slice(values))
    }

    /// From f64 values, each cast to `dtype`.
    pub fn from_f64(dtype: DType, dims: &[u64], values: &[f64]) -> Result<Self> {
        let bytes: Vec<u8> = values
            .iter()
            .flat_map(|&v| crate::ir::literal::encode_scalar(dtype, v))
            .collect();
        Self::from_bytes(TensorType::new(dtype, dims), &bytes)
    }

    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }
    pub fn dims(&self) -> &[u64] {
        &self.ty.dims
    }
    pub fn numel(&self) -> usize {
        self.ty.numel() as usize
    }
    pub fn bytes(&self) -> &[u8] {
        self.data.as_bytes()
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.data.as_bytes_mut()
    }

    /// Typed view; T must have the dtype's size (u8 for bool).
    pub fn as_slice<T: Element>(&self) -> &[T] {
        assert_eq!(
            std::mem::size_of::<T>(),
            self.ty.dtype.size(),
            "typed view of the wrong size"
        );
        bytemuck::cast_slice(self.data.as_bytes())
    }
    pub fn as_slice_mut<T: Element>(&mut self) -> &mut [T] {
        assert_eq!(
            std::mem::size_of::<T>(),
            self.ty.dtype.size(),
            "typed view of the wrong size"
        );
        bytemuck::cast_slice_mut(self.data.as_bytes_mut())
    }

    /// Element `i` as f64 (for tests and checks).
    pub fn get_f64(&self, i: usize) -> f64 {
        crate::ir::literal::decode(self.ty.dtype, self.data.as_bytes(), i)
    }
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.numel()).map(|i| self.get_f64(i)).collect()
    }
}

/// Read a device tensor (any layout) into a contiguous host tensor.
/// `t`'s first element, when its memory is host memory (the host
/// platform's device memory).
pub(crate) fn host_ptr(t: &crate::tensor::DeviceTensor) -> Option<*mut u8> {
    let seg = t
        .buffer
        .segment()
        .as_any()
        .downcast_ref::<super::HostSegment>()?;
    let offset = t.buffer.segment_offset() + t.layout.offset;
    // SAFETY: the offset lies inside the segment: the tensor's layout was
    // checked against its buffer, and the buffer against its segment.
    Some(unsafe { seg.as_ptr().add(offset as usize) })
}

/// As [`host_ptr`], when the pointer is aligned to the element type (a
/// typed slice may start there).
pub(crate) fn aligned_host_ptr(t: &crate::tensor::DeviceTensor) -> Option<*mut u8> {
    host_ptr(t).filter(|p| (*p as usize).is_multiple_of(t.dtype.size()))
}

pub fn read_device_tensor(t: &crate::tensor::DeviceTensor) -> Result<HostTensor> {
    super::executable::read_tensor(t)
}

/// erf in f64, accurate to a few ulps (the kernels' own).
pub fn erf(x: f64) -> f64 {
    elementwise::erf_f64(x)
}

/// Row-major strides (in elements) of `dims`.
pub fn contiguous_strides(dims: &[u64]) -> Vec<u64> {
    let mut s = vec![1u64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Run one primitive on host tensors. `inputs` have the types the graph
/// checked; the result types are the ones inference gives.
/// A float dot_general (f32 or f64) written straight into `dst`, the
/// bytes of its row-major result; other prims and dtypes are errors.
pub fn eval_dot_into(prim: &Prim, inputs: &[&HostTensor], dst: &mut [u8]) -> Result<()> {
    let types: Vec<TensorType> = inputs.iter().map(|t| t.ty.clone()).collect();
    let out = crate::ir::graph::infer_types(prim, &types)?;
    let dims = dot::DotDims::of(prim)
        .ok_or_else(|| Error::Internal(format!("{} is not a product", prim.name())))?;
    dot::dot_general_into(inputs[0], inputs[1], dims, &out[0], dst)
}

pub fn eval(prim: &Prim, inputs: &[&HostTensor]) -> Result<Vec<HostTensor>> {
    let types: Vec<TensorType> = inputs.iter().map(|t| t.ty.clone()).collect();
    let out_types = crate::ir::graph::infer_types(prim, &types)?;
    let one = |t: Result<HostTensor>| t.map(|t| vec![t]);
    let result = match prim {
        Prim::Constant { dtype, dims, bytes } => {
            one(HostTensor::from_bytes(TensorType::new(*dtype, dims), bytes))
        }
        Prim::Iota { .. } => one(elementwise::iota(prim, &out_types[0])),
        Prim::Unary(op) => one(elementwise::unary(*op, inputs[0], &out_types[0])),
        Prim::Binary(op) => one(elementwise::binary(*op, inputs[0], inputs[1])),
        Prim::Compare(op) => one(elementwise::compare(*op, inputs[0], inputs[1])),
        Prim::Select => one(elementwise::select(inputs[0], inputs[1], inputs[2])),
        Prim::Clamp => one(elementwise::clamp(inputs[0], inputs[1], inputs[2])),
        Prim::Convert { to } => one(elementwise::convert(inputs[0], *to)),
        Prim::BitcastConvert { .. } => one(HostTensor::from_bytes(
            out_types[0].clone(),
            inputs[0].bytes(),
        )),
        Prim::Reduce { op, dimensions } => {
            one(reduce::reduce(*op, dimensions, inputs[0], &out_types[0]))
        }
        Prim::ArgReduce { max, dimension } => one(reduce::arg_reduce(
            *max,
            *dimension,
            inputs[0],
            &out_types[0],
        )),
        Prim::Cumulative {
            op,
            dimension,
            reverse,
        } => one(reduce::cumulative(*op, *dimension, *reverse, inputs[0])),
        Prim::Rng { distribution, .. } => {
            one(rng::rng(*distribution, inputs[0], inputs[1], &out_types[0]))
        }
        Prim::BroadcastInDim { mapping, .. } => one(structural::broadcast_in_dim(
            inputs[0],
            mapping,
            &out_types[0],
        )),
        // The same bytes under new dims: shared, not copied.
        Prim::Reshape { .. } => one(Ok(HostTensor {
            ty: out_types[0].clone(),
            data: inputs[0].data.clone(),
        })),
        Prim::Transpose { perm } => one(structural::transpose(inputs[0], perm, &out_types[0])),
        Prim::Slice { start, stride, .. } => {
            one(structural::slice(inputs[0], start, stride, &out_types[0]))
        }
        Prim::DynamicSlice { .. } => one(structural::dynamic_slice(
            inputs[0],
            &inputs[1..],
            &out_types[0],
        )),
        Prim::DynamicUpdateSlice => one(structural::dynamic_update_slice(
            inputs[0],
            inputs[1],
            &inputs[2..],
        )),
        Prim::Pad { low, interior, .. } => one(structural::pad(
            inputs[0],
            inputs[1],
            low,
            interior,
            &out_types[0],
        )),
        Prim::Concatenate { dimension } => {
            one(structural::concatenate(inputs, *dimension, &out_types[0]))
        }
        Prim::Reverse { dimensions } => one(structural::reverse(inputs[0], dimensions)),
        Prim::DotGeneral { .. } => one(dot::DotDims::of(prim)
            .ok_or_else(|| Error::Internal("a product without dimensions".into()))
            .and_then(|dims| dot::dot_general(inputs[0], inputs[1], dims, &out_types[0]))),
        Prim::Convolution {
            stride,
            padding,
            dilation,
            groups,
            ..
        } => one(dot::convolution(
            inputs[0],
            inputs[1],
            stride,
            padding,
            dilation,
            *groups,
            &out_types[0],
        )),
        Prim::Gather { axis } => one(index::gather(inputs[0], inputs[1], *axis)),
        Prim::Take { axis } => one(index::take(inputs[0], inputs[1], *axis, &out_types[0])),
        Prim::Scatter { axis, combiner } => one(index::scatter(
            inputs[0], inputs[1], inputs[2], *axis, *combiner,
        )),
        Prim::Sort {
            dimension,
            descending,
            stable,
        } => sort::sort(inputs[0], *dimension, *descending, *stable),
        Prim::TriangularSolve {
            left_side,
            lower,
            unit_diagonal,
            transpose_a,
        } => one(linalg::triangular_solve(
            inputs[0],
            inputs[1],
            linalg::Triangle {
                left_side: *left_side,
                lower: *lower,
                unit_diagonal: *unit_diagonal,
                transpose_a: *transpose_a,
            },
            &out_types[0],
        )),
        Prim::Cholesky => one(linalg::cholesky(inputs[0])),
        Prim::LuFactor => linalg::lu_factor(inputs[0], &out_types),
        Prim::Jacobi { two_sided } => jacobi::jacobi(inputs[0], *two_sided),
        Prim::HouseholderQr => householder::householder_qr(inputs[0]),
        Prim::HouseholderProduct => one(householder::householder_product(inputs[0], inputs[1])),
        Prim::PivotsToPermutation { .. } => {
            one(linalg::pivots_to_permutation(inputs[0], &out_types[0]))
        }
        Prim::Attention { scale, causal } => {
            let scale = match inputs.get(3) {
                Some(s) => scale * f64::from(s.as_slice::<f32>()[0]),
                None => *scale,
            };
            attention::attention(inputs[0], inputs[1], inputs[2], scale, *causal, &out_types)
        }
        Prim::AttentionBackward { scale, causal } => {
            attention::attention_backward(inputs, *scale, *causal, &out_types)
        }
    };
    // The name only for an error: it is serialized through serde, which
    // every run of a node kernel paid for before.
    result.map_err(|e| match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{}: {m}", prim.name())),
        other => other,
    })
}

/// Evaluate a whole graph, node by node (the reference path).
pub fn eval_graph(graph: &Graph, inputs: &[HostTensor]) -> Result<Vec<HostTensor>> {
    if crate::ops::has_reduced_precision(graph) {
        return eval_graph(&crate::ops::expand_precision(graph)?, inputs);
    }
    if inputs.len() != graph.params().len() {
        return Err(Error::invalid(format!(
            "the graph takes {} inputs, got {}",
            graph.params().len(),
            inputs.len()
        )));
    }
    let mut values: Vec<Option<HostTensor>> = vec![None; graph.num_values()];
    for (i, (p, t)) in graph.params().iter().zip(inputs).enumerate() {
        if &t.ty != graph.value_type(*p) {
            return Err(Error::invalid(format!(
                "input {i} is {} but the graph wants {}",
                t.ty,
                graph.value_type(*p)
            )));
        }
        values[p.0 as usize] = Some(t.clone());
    }
    for node in graph.nodes() {
        let ins: Vec<&HostTensor> = node
            .inputs
            .iter()
            .map(|v| {
                values[v.0 as usize]
                    .as_ref()
                    .expect("checked graph: inputs come first")
            })
            .collect();
        let outs = eval(&node.prim, &ins)?;
        for (v, t) in node.outputs.iter().zip(outs) {
            values[v.0 as usize] = Some(t);
        }
    }
    Ok(graph
        .outputs()
        .iter()
        .map(|v| values[v.0 as usize].clone().expect("outputs are defined"))
        .collect())
}

#[cfg(test)]
mod scratch_tests {
    use super::AlignedBytes;

    #[test]
    fn a_buffer_dropped_on_one_thread_is_reused_on_another() {
        // A plan's values are made on a pool worker and dropped on the
        // stream's executor thread; the next plan may run on another
        // worker. An odd size, so no other test's buffer fits it; a marker,
        // since fresh memory comes zeroed and a reused buffer keeps it.
        let len = (5 << 20) + 24;
        let mark = *b"scratch!";
        let made = std::thread::spawn(move || {
            let mut b = AlignedBytes::for_overwrite(len);
            b.as_bytes_mut()[..8].copy_from_slice(&mark);
            b
        })
        .join()
        .unwrap();
        std::thread::spawn(move || drop(made)).join().unwrap();
        let head = std::thread::spawn(move || {
            let b = AlignedBytes::for_overwrite(len);
            b.as_bytes()[..8].to_vec()
        })
        .join()
        .unwrap();
        assert_eq!(head, mark, "the cached buffer was not handed out again");
    }
}
