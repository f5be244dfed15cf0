//! Reductions: reduce over any set of dimensions, arg-max/min along one
//! dimension, and running (cumulative) reductions along one dimension.
//!
//! Accumulation: float sums and products accumulate in f64 (f32, f16 and
//! bf16 are widened) and round once to the element type; contiguous runs
//! are summed in 8 interleaved lanes and halved pairwise beyond 1024
//! elements, so long f64 rows stay accurate too. Integer sums and products
//! wrap. Max and min propagate NaN. On bool, sum, max and or are logical
//! or; prod, min and and are logical and. Reducing nothing gives the
//! identity: sum 0, prod 1, max -inf (integers: MIN), min +inf (MAX), and
//! all ones (bool: true), or 0.
//!
//! Reduce walks the operand in memory order as blocks of merged dimensions
//! (adjacent dimensions that are all reduced or all kept), so reducing the
//! last dimensions folds contiguous rows and reducing leading dimensions
//! folds whole rows into a vector of accumulators; any other set of
//! dimensions is a mix of the two under an odometer.

use half::{bf16, f16};

use super::elementwise::{typed, typed_mut, widen_all, Cast, Int, Real};
use super::HostTensor;
use crate::error::{Error, Result};
use crate::ir::{DType, ReduceOp, TensorType};

/// Interleaved accumulators for a contiguous run.
const LANES: usize = 8;
/// Runs longer than this are split in halves (pairwise summation).
const PAIRWISE_BLOCK: usize = 1024;

/// Reduces a contiguous run: `fold` adds an element to an accumulator,
/// `merge` joins two accumulators.
#[inline(always)]
fn reduce_run<T: Copy, A: Copy>(
    x: &[T],
    id: A,
    fold: &impl Fn(A, T) -> A,
    merge: &impl Fn(A, A) -> A,
) -> A {
    if x.len() > PAIRWISE_BLOCK {
        let half = x.len() / 2;
        return merge(
            reduce_run_outlined(&x[..half], id, fold, merge),
            reduce_run_outlined(&x[half..], id, fold, merge),
        );
    }
    let mut lanes = [id; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for k in 0..LANES {
            lanes[k] = fold(lanes[k], c[k]);
        }
    }
    let mut rest = id;
    for &v in chunks.remainder() {
        rest = fold(rest, v);
    }
    let [a, b, c, d, e, f, g, h] = lanes;
    merge(
        merge(merge(a, b), merge(c, d)),
        merge(merge(merge(e, f), merge(g, h)), rest),
    )
}

#[inline(never)]
fn reduce_run_outlined<T: Copy, A: Copy>(
    x: &[T],
    id: A,
    fold: &impl Fn(A, T) -> A,
    merge: &impl Fn(A, A) -> A,
) -> A {
    reduce_run(x, id, fold, merge)
}

/// The operand as blocks: merged groups of adjacent dimensions that are all
/// reduced or all kept, outermost first, size-1 dimensions dropped.
struct Blocks {
    sizes: Vec<usize>,
    reduced: Vec<bool>,
}

impl Blocks {
    fn new(dims: &[u64], reduced_dims: &[bool]) -> Blocks {
        let mut b = Blocks {
            sizes: vec![],
            reduced: vec![],
        };
        for (&d, &r) in dims.iter().zip(reduced_dims) {
            if d == 1 {
                continue;
            }
            match b.reduced.last() {
                Some(&last) if last == r => {
                    *b.sizes
                        .last_mut()
                        .expect("sizes and reduced have one length") *= d as usize
                }
                _ => {
                    b.sizes.push(d as usize);
                    b.reduced.push(r);
                }
            }
        }
        b
    }
}

/// Folds every element of `x` into `acc`, one accumulator per output
/// element (in output order, already set to the identity `id`).
fn fold_blocks<T: Copy, A: Copy>(
    x: &[T],
    blocks: &Blocks,
    acc: &mut [A],
    id: A,
    fold: impl Fn(A, T) -> A,
    merge: impl Fn(A, A) -> A,
) {
    if x.is_empty() {
        return;
    }
    let m = blocks.sizes.len();
    if m == 0 {
        acc[0] = fold(acc[0], x[0]);
        return;
    }
    let n = blocks.sizes[m - 1];
    let inner_reduced = blocks.reduced[m - 1];
    // Output offset contributed by one step of each outer block.
    let mut out_stride = vec![0usize; m - 1];
    let mut s = if inner_reduced { 1 } else { n };
    for g in (0..m - 1).rev() {
        if !blocks.reduced[g] {
            out_stride[g] = s;
            s *= blocks.sizes[g];
        }
    }
    let mut index = vec![0usize; m - 1];
    let mut o = 0usize;
    for run in x.chunks_exact(n) {
        if inner_reduced {
            acc[o] = merge(acc[o], reduce_run(run, id, &fold, &merge));
        } else {
            for (a, &v) in acc[o..o + n].iter_mut().zip(run) {
                *a = fold(*a, v);
            }
        }
        for g in (0..m - 1).rev() {
            index[g] += 1;
            o += out_stride[g];
            if index[g] < blocks.sizes[g] {
                break;
            }
            index[g] = 0;
            o -= out_stride[g] * blocks.sizes[g];
        }
    }
}

pub fn reduce(
    op: ReduceOp,
    dimensions: &[usize],
    x: &HostTensor,
    out: &TensorType,
) -> Result<HostTensor> {
    let rank = x.ty.rank();
    let mut reduced = vec![false; rank];
    for &d in dimensions {
        if d >= rank || std::mem::replace(&mut reduced[d], true) {
            return Err(Error::invalid(format!(
                "dimensions {dimensions:?} must be distinct and below rank {rank}"
            )));
        }
    }
    let kept: Vec<u64> = (0..rank)
        .filter(|&i| !reduced[i])
        .map(|i| x.dims()[i])
        .collect();
    let want = TensorType::new(x.dtype(), &kept);
    if *out != want {
        return Err(Error::invalid(format!(
            "reducing {} gives {want}, not {out}",
            x.ty
        )));
    }
    let blocks = Blocks::new(x.dims(), &reduced);
    let mut r = HostTensor::zeros(want);
    match x.dtype() {
        DType::F32 => reduce_float::<f32, f32>(op, typed(x)?, &blocks, typed_mut(&mut r)?)?,
        DType::F64 => reduce_float::<f64, f64>(op, typed(x)?, &blocks, typed_mut(&mut r)?)?,
        DType::F16 => reduce_float::<f32, f16>(
            op,
            &widen_all::<f16>(typed(x)?),
            &blocks,
            typed_mut(&mut r)?,
        )?,
        DType::BF16 => reduce_float::<f32, bf16>(
            op,
            &widen_all::<bf16>(typed(x)?),
            &blocks,
            typed_mut(&mut r)?,
        )?,
        DType::U8 => reduce_int::<u8>(op, typed(x)?, &blocks, typed_mut(&mut r)?),
        DType::I8 => reduce_int::<i8>(op, typed(x)?, &blocks, typed_mut(&mut r)?),
        DType::I32 => reduce_int::<i32>(op, typed(x)?, &blocks, typed_mut(&mut r)?),
        DType::I64 => reduce_int::<i64>(op, typed(x)?, &blocks, typed_mut(&mut r)?),
        DType::Bool => {
            let (x, o) = (typed::<u8>(x)?, typed_mut::<u8>(&mut r)?);
            if is_logical_or(op) {
                o.fill(0);
                fold_blocks(x, &blocks, o, 0, |a, v| a | v, |a, b| a | b);
            } else {
                o.fill(1);
                fold_blocks(x, &blocks, o, 1, |a, v| a & v, |a, b| a & b);
            }
        }
    }
    Ok(r)
}

fn is_logical_or(op: ReduceOp) -> bool {
    matches!(op, ReduceOp::Sum | ReduceOp::Max | ReduceOp::Or)
}

/// Reduces `x` (f32 or f64; f16 and bf16 arrive widened) into `out` of
/// element type `O`.
fn reduce_float<F: Real, O: Cast>(
    op: ReduceOp,
    x: &[F],
    blocks: &Blocks,
    out: &mut [O],
) -> Result<()> {
    match op {
        ReduceOp::Sum | ReduceOp::Prod => {
            let sum = op == ReduceOp::Sum;
            let id = if sum { 0.0 } else { 1.0 };
            let mut acc = vec![id; out.len()];
            if sum {
                fold_blocks(x, blocks, &mut acc, id, |a, v| a + v.to_f64(), |a, b| a + b);
            } else {
                fold_blocks(x, blocks, &mut acc, id, |a, v| a * v.to_f64(), |a, b| a * b);
            }
            for (o, &a) in out.iter_mut().zip(&acc) {
                *o = O::from_f64(a);
            }
        }
        ReduceOp::Max | ReduceOp::Min => {
            let max = op == ReduceOp::Max;
            let id = if max { F::NEG_INFINITY } else { F::INFINITY };
            let mut acc = vec![id; out.len()];
            if max {
                fold_blocks(x, blocks, &mut acc, id, F::max_nan, F::max_nan);
            } else {
                fold_blocks(x, blocks, &mut acc, id, F::min_nan, F::min_nan);
            }
            for (o, &a) in out.iter_mut().zip(&acc) {
                *o = a.cast::<O>();
            }
        }
        ReduceOp::And | ReduceOp::Or => {
            return Err(Error::invalid(format!(
                "{op:?} needs bool or integer elements"
            )))
        }
    }
    Ok(())
}

fn reduce_int<I: Int>(op: ReduceOp, x: &[I], blocks: &Blocks, out: &mut [I]) {
    let id = match op {
        ReduceOp::Sum | ReduceOp::Or => I::ZERO,
        ReduceOp::Prod => I::ONE,
        ReduceOp::Max => I::MIN,
        ReduceOp::Min => I::MAX,
        ReduceOp::And => !I::ZERO,
    };
    out.fill(id);
    match op {
        ReduceOp::Sum => fold_blocks(x, blocks, out, id, I::add_wrap, I::add_wrap),
        ReduceOp::Prod => fold_blocks(x, blocks, out, id, I::mul_wrap, I::mul_wrap),
        ReduceOp::Max => fold_blocks(x, blocks, out, id, Ord::max, Ord::max),
        ReduceOp::Min => fold_blocks(x, blocks, out, id, Ord::min, Ord::min),
        ReduceOp::And => fold_blocks(x, blocks, out, id, |a, b| a & b, |a, b| a & b),
        ReduceOp::Or => fold_blocks(x, blocks, out, id, |a, b| a | b, |a, b| a | b),
    }
}

/// `dims` as (outer, n, inner) around `dimension`.
fn split_at(dims: &[u64], dimension: usize) -> Result<(usize, usize, usize)> {
    if dimension >= dims.len() {
        return Err(Error::invalid(format!(
            "dimension {dimension} is not below rank {}",
            dims.len()
        )));
    }
    let outer: u64 = dims[..dimension].iter().product();
    let inner: u64 = dims[dimension + 1..].iter().product();
    Ok((outer as usize, dims[dimension] as usize, inner as usize))
}

// ---------------------------------------------------------------------------
// ArgReduce.

pub fn arg_reduce(
    max: bool,
    dimension: usize,
    x: &HostTensor,
    out: &TensorType,
) -> Result<HostTensor> {
    let (_, n, inner) = split_at(x.dims(), dimension)?;
    if n == 0 {
        return Err(Error::invalid(format!(
            "dimension {dimension} of {} is empty",
            x.ty
        )));
    }
    let mut dims = x.dims().to_vec();
    dims.remove(dimension);
    let want = TensorType::new(DType::I64, &dims);
    if *out != want {
        return Err(Error::invalid(format!("{} gives {want}, not {out}", x.ty)));
    }
    let mut r = HostTensor::zeros(want);
    let o = typed_mut::<i64>(&mut r)?;
    match x.dtype() {
        DType::F32 => arg_float::<f32>(max, typed(x)?, n, inner, o),
        DType::F64 => arg_float::<f64>(max, typed(x)?, n, inner, o),
        DType::F16 => arg_float::<f32>(max, &widen_all::<f16>(typed(x)?), n, inner, o),
        DType::BF16 => arg_float::<f32>(max, &widen_all::<bf16>(typed(x)?), n, inner, o),
        DType::U8 | DType::Bool => arg_ord::<u8>(max, typed(x)?, n, inner, o),
        DType::I8 => arg_ord::<i8>(max, typed(x)?, n, inner, o),
        DType::I32 => arg_ord::<i32>(max, typed(x)?, n, inner, o),
        DType::I64 => arg_ord::<i64>(max, typed(x)?, n, inner, o),
    }
    Ok(r)
}

/// NaN counts as larger and as smaller than everything (torch.argmax).
fn arg_float<F: Real>(max: bool, x: &[F], n: usize, inner: usize, out: &mut [i64]) {
    if max {
        arg_scan(x, n, inner, out, |v: F, best: F| {
            !best.is_nan() && (v > best || v.is_nan())
        });
    } else {
        arg_scan(x, n, inner, out, |v: F, best: F| {
            !best.is_nan() && (v < best || v.is_nan())
        });
    }
}

fn arg_ord<T: Ord + Copy>(max: bool, x: &[T], n: usize, inner: usize, out: &mut [i64]) {
    if max {
        arg_scan(x, n, inner, out, |v: T, best: T| v > best);
    } else {
        arg_scan(x, n, inner, out, |v: T, best: T| v < best);
    }
}

/// The index of the first element along the `n` axis that no later one is
/// `better` than; `n` is at least 1.
fn arg_scan<T: Copy>(
    x: &[T],
    n: usize,
    inner: usize,
    out: &mut [i64],
    better: impl Fn(T, T) -> bool,
) {
    if out.is_empty() {
        return;
    }
    if inner == 1 {
        for (row, o) in x.chunks_exact(n).zip(out.iter_mut()) {
            let (mut best, mut at) = (row[0], 0);
            for (i, &v) in row.iter().enumerate().skip(1) {
                if better(v, best) {
                    best = v;
                    at = i;
                }
            }
            *o = at as i64;
        }
        return;
    }
    let mut best = x[..inner].to_vec();
    for (block, ob) in x.chunks_exact(n * inner).zip(out.chunks_exact_mut(inner)) {
        best.copy_from_slice(&block[..inner]);
        ob.fill(0);
        for (i, run) in block.chunks_exact(inner).enumerate().skip(1) {
            for ((b, o), &v) in best.iter_mut().zip(ob.iter_mut()).zip(run) {
                if better(v, *b) {
                    *b = v;
                    *o = i as i64;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Cumulative.

pub fn cumulative(
    op: ReduceOp,
    dimension: usize,
    reverse: bool,
    x: &HostTensor,
) -> Result<HostTensor> {
    let (_, n, inner) = split_at(x.dims(), dimension)?;
    if matches!(op, ReduceOp::And | ReduceOp::Or) {
        return Err(Error::invalid("and/or are not cumulative ops"));
    }
    let mut r = HostTensor::zeros(x.ty.clone());
    let shape = Scan { n, inner, reverse };
    match x.dtype() {
        DType::F32 => scan_float::<f32, f32>(op, typed(x)?, shape, typed_mut(&mut r)?),
        DType::F64 => scan_float::<f64, f64>(op, typed(x)?, shape, typed_mut(&mut r)?),
        DType::F16 => {
            scan_float::<f32, f16>(op, &widen_all::<f16>(typed(x)?), shape, typed_mut(&mut r)?)
        }
        DType::BF16 => {
            scan_float::<f32, bf16>(op, &widen_all::<bf16>(typed(x)?), shape, typed_mut(&mut r)?)
        }
        DType::U8 => scan_int::<u8>(op, typed(x)?, shape, typed_mut(&mut r)?),
        DType::I8 => scan_int::<i8>(op, typed(x)?, shape, typed_mut(&mut r)?),
        DType::I32 => scan_int::<i32>(op, typed(x)?, shape, typed_mut(&mut r)?),
        DType::I64 => scan_int::<i64>(op, typed(x)?, shape, typed_mut(&mut r)?),
        DType::Bool => {
            let (x, o) = (typed::<u8>(x)?, typed_mut::<u8>(&mut r)?);
            if is_logical_or(op) {
                scan(x, shape, o, 0u8, |a, v| a | v, |a| a);
            } else {
                scan(x, shape, o, 1u8, |a, v| a & v, |a| a);
            }
        }
    }
    Ok(r)
}

#[derive(Clone, Copy)]
struct Scan {
    n: usize,
    inner: usize,
    reverse: bool,
}

/// out[.., i, ..] = store(fold of x[.., 0..=i, ..]) along the scanned
/// axis (from the end when reversed).
fn scan<T: Copy, A: Copy, O>(
    x: &[T],
    s: Scan,
    out: &mut [O],
    id: A,
    fold: impl Fn(A, T) -> A,
    store: impl Fn(A) -> O,
) {
    let Scan { n, inner, reverse } = s;
    if x.is_empty() {
        return;
    }
    if inner == 1 {
        for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
            let mut a = id;
            if reverse {
                for (o, &v) in or.iter_mut().zip(xr).rev() {
                    a = fold(a, v);
                    *o = store(a);
                }
            } else {
                for (o, &v) in or.iter_mut().zip(xr) {
                    a = fold(a, v);
                    *o = store(a);
                }
            }
        }
        return;
    }
    let mut acc = vec![id; inner];
    for (xb, ob) in x
        .chunks_exact(n * inner)
        .zip(out.chunks_exact_mut(n * inner))
    {
        acc.fill(id);
        for step in 0..n {
            let i = if reverse { n - 1 - step } else { step };
            let range = i * inner..(i + 1) * inner;
            for ((a, &v), o) in acc.iter_mut().zip(&xb[range.clone()]).zip(&mut ob[range]) {
                *a = fold(*a, v);
                *o = store(*a);
            }
        }
    }
}

fn scan_float<F: Real, O: Cast>(op: ReduceOp, x: &[F], s: Scan, out: &mut [O]) {
    match op {
        ReduceOp::Sum => scan(x, s, out, 0.0, |a, v| a + v.to_f64(), O::from_f64),
        ReduceOp::Prod => scan(x, s, out, 1.0, |a, v| a * v.to_f64(), O::from_f64),
        ReduceOp::Max => scan(x, s, out, F::NEG_INFINITY, F::max_nan, F::cast::<O>),
        // And and Or were refused by the caller.
        _ => scan(x, s, out, F::INFINITY, F::min_nan, F::cast::<O>),
    }
}

fn scan_int<I: Int>(op: ReduceOp, x: &[I], s: Scan, out: &mut [I]) {
    let keep = |a: I| a;
    match op {
        ReduceOp::Sum => scan(x, s, out, I::ZERO, I::add_wrap, keep),
        ReduceOp::Prod => scan(x, s, out, I::ONE, I::mul_wrap, keep),
        ReduceOp::Max => scan(x, s, out, I::MIN, Ord::max, keep),
        _ => scan(x, s, out, I::MAX, Ord::min, keep),
    }
}

#[cfg(test)]
mod tests {
    //! Reduce, arg-reduce and cumulative against straightforward f64 (or
    //! exact integer) loops over the multi-index.

    use super::super::contiguous_strides;
    use super::super::elementwise::tests::*;
    use super::*;

    /// The output index of input element `i` when `reduced` dims go away.
    fn out_index(i: usize, dims: &[u64], reduced: &[bool]) -> usize {
        let strides = contiguous_strides(dims);
        let mut o = 0;
        for (d, (&n, &s)) in dims.iter().zip(&strides).enumerate() {
            if !reduced[d] {
                o = o * n as usize + (i / s as usize) % n as usize;
            }
        }
        o
    }

    fn all_subsets(rank: usize) -> Vec<Vec<usize>> {
        (0..1usize << rank)
            .map(|m| (0..rank).filter(|d| m >> d & 1 == 1).collect())
            .collect()
    }

    const CASES: &[&[u64]] = &[
        &[],
        &[0],
        &[6],
        &[2, 3, 4],
        &[3, 1, 5],
        &[0, 3],
        &[3, 0],
        &[4, 1, 3, 5],
        &[3, 2500],
        &[2500, 3],
    ];

    fn float_identity(op: ReduceOp) -> f64 {
        match op {
            ReduceOp::Sum => 0.0,
            ReduceOp::Prod => 1.0,
            ReduceOp::Max => f64::NEG_INFINITY,
            _ => f64::INFINITY,
        }
    }

    #[test]
    fn float_reduce_matches_f64_loops() {
        for d in FLOATS {
            for (k, dims) in CASES.iter().enumerate() {
                let n = numel(dims);
                for dimensions in all_subsets(dims.len()) {
                    let reduced: Vec<bool> =
                        (0..dims.len()).map(|i| dimensions.contains(&i)).collect();
                    let kept: Vec<u64> = (0..dims.len())
                        .filter(|&i| !reduced[i])
                        .map(|i| dims[i])
                        .collect();
                    let out_ty = TensorType::new(d, &kept);
                    for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                        // Products of values near 1 stay in range for long rows.
                        let (lo, hi) = if op == ReduceOp::Prod {
                            (0.999, 1.001)
                        } else {
                            (-4.0, 4.0)
                        };
                        let x = tensor(d, dims, &values(n, k as u64, lo, hi));
                        let got = reduce(op, &dimensions, &x, &out_ty).unwrap();
                        let mut want = vec![float_identity(op); numel(&kept)];
                        let mut magnitude = vec![0.0; numel(&kept)];
                        for (i, v) in x.to_f64_vec().into_iter().enumerate() {
                            let o = out_index(i, dims, &reduced);
                            want[o] = match op {
                                ReduceOp::Sum => want[o] + v,
                                ReduceOp::Prod => want[o] * v,
                                ReduceOp::Max => want[o].max(v),
                                _ => want[o].min(v),
                            };
                            magnitude[o] += v.abs();
                        }
                        let what = format!("{op:?} of {} over {dimensions:?}", x.ty);
                        let got_v = got.to_f64_vec();
                        assert_eq!(got.ty, out_ty, "{what}");
                        for (o, (&g, &w)) in got_v.iter().zip(&want).enumerate() {
                            let (rel, abs) = tol(d, 2.0);
                            // Sums: error relative to the sum of magnitudes (cancellation).
                            let bound = match op {
                                ReduceOp::Sum => rel * w.abs() + abs + 1e-14 * magnitude[o],
                                ReduceOp::Prod => rel * w.abs() + abs + 1e-13,
                                _ => 0.0,
                            };
                            let w_rounded = round_to(d, w);
                            assert!(
                                g == w_rounded || (g - w).abs() <= bound,
                                "{what}: output {o}: got {g:e}, want {w:e}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn integer_and_bool_reduce_wrap_exactly() {
        for d in INTS.into_iter().chain([DType::Bool]) {
            for (k, dims) in CASES.iter().enumerate() {
                let n = numel(dims);
                let xv = int_values(d, n, k as u64 + 1);
                let x = int_tensor(d, dims, &xv);
                let xs = ints(&x);
                for dimensions in all_subsets(dims.len()) {
                    let reduced: Vec<bool> =
                        (0..dims.len()).map(|i| dimensions.contains(&i)).collect();
                    let kept: Vec<u64> = (0..dims.len())
                        .filter(|&i| !reduced[i])
                        .map(|i| dims[i])
                        .collect();
                    for op in [
                        ReduceOp::Sum,
                        ReduceOp::Prod,
                        ReduceOp::Max,
                        ReduceOp::Min,
                        ReduceOp::And,
                        ReduceOp::Or,
                    ] {
                        let got = reduce(op, &dimensions, &x, &TensorType::new(d, &kept)).unwrap();
                        let (min, max) = match d {
                            DType::Bool => (0, 1),
                            DType::U8 => (0, 255),
                            DType::I8 => (-128, 127),
                            DType::I32 => (i32::MIN as i64, i32::MAX as i64),
                            _ => (i64::MIN, i64::MAX),
                        };
                        let logical = d == DType::Bool;
                        let id: i128 = match op {
                            ReduceOp::Sum | ReduceOp::Or => 0,
                            ReduceOp::Prod => 1,
                            ReduceOp::Max => min as i128,
                            ReduceOp::Min => max as i128,
                            ReduceOp::And => {
                                if logical {
                                    1
                                } else {
                                    -1
                                }
                            }
                        };
                        let mut want = vec![id; numel(&kept)];
                        for (i, &v) in xs.iter().enumerate() {
                            let (o, v) = (out_index(i, dims, &reduced), v as i128);
                            let w = &mut want[o];
                            *w = match (op, logical) {
                                (ReduceOp::Sum | ReduceOp::Max | ReduceOp::Or, true) => *w | v,
                                (_, true) => *w & v,
                                (ReduceOp::Sum, _) => wrap(d, *w + v) as i128,
                                (ReduceOp::Prod, _) => wrap(d, *w * v) as i128,
                                (ReduceOp::Max, _) => (*w).max(v),
                                (ReduceOp::Min, _) => (*w).min(v),
                                (ReduceOp::And, _) => *w & v,
                                (ReduceOp::Or, _) => *w | v,
                            };
                        }
                        let want: Vec<i64> = want.iter().map(|&w| wrap(d, w)).collect();
                        assert_eq!(ints(&got), want, "{op:?} of {} over {dimensions:?}", x.ty);
                    }
                }
            }
        }
    }

    #[test]
    fn reduce_identities_nan_and_errors() {
        for d in FLOATS {
            let empty = tensor(d, &[0, 2], &[]);
            for (op, want) in [
                (ReduceOp::Sum, 0.0),
                (ReduceOp::Prod, 1.0),
                (ReduceOp::Max, f64::NEG_INFINITY),
                (ReduceOp::Min, f64::INFINITY),
            ] {
                let got = reduce(op, &[0], &empty, &TensorType::new(d, &[2])).unwrap();
                assert_eq!(got.to_f64_vec(), [want, want], "{op:?} {d}");
            }
            let x = tensor(d, &[2, 3], &[1.0, f64::NAN, 3.0, 4.0, 5.0, 6.0]);
            for op in [ReduceOp::Max, ReduceOp::Min, ReduceOp::Sum] {
                let got = reduce(op, &[1], &x, &TensorType::new(d, &[2]))
                    .unwrap()
                    .to_f64_vec();
                assert!(got[0].is_nan() && !got[1].is_nan(), "{op:?} {d}: {got:?}");
                let got = reduce(op, &[0], &x, &TensorType::new(d, &[3]))
                    .unwrap()
                    .to_f64_vec();
                assert!(got[1].is_nan() && !got[0].is_nan(), "{op:?} {d}: {got:?}");
            }
            assert!(reduce(ReduceOp::And, &[0], &x, &TensorType::new(d, &[3])).is_err());
        }
        let empty = int_tensor(DType::I8, &[3, 0], &[]);
        let got = |op| ints(&reduce(op, &[1], &empty, &TensorType::new(DType::I8, &[3])).unwrap());
        assert_eq!(got(ReduceOp::Max), [-128; 3]);
        assert_eq!(got(ReduceOp::Min), [127; 3]);
        assert_eq!(got(ReduceOp::And), [-1; 3]);
        let b = int_tensor(DType::Bool, &[0], &[]);
        assert_eq!(
            ints(&reduce(ReduceOp::And, &[0], &b, &TensorType::scalar(DType::Bool)).unwrap()),
            [1]
        );
        let x = tensor(DType::F32, &[2, 3], &[0.0; 6]);
        assert!(reduce(
            ReduceOp::Sum,
            &[0, 0],
            &x,
            &TensorType::new(DType::F32, &[3])
        )
        .is_err());
        assert!(reduce(
            ReduceOp::Sum,
            &[2],
            &x,
            &TensorType::new(DType::F32, &[2, 3])
        )
        .is_err());
        assert!(reduce(ReduceOp::Sum, &[0], &x, &TensorType::new(DType::F32, &[2])).is_err());
    }

    #[test]
    fn long_f32_sums_stay_accurate() {
        // 1e6 copies of 0.1f32: a running f32 sum drifts by ~1%.
        let n = 1_000_000;
        let x = HostTensor::from_slice(DType::F32, &[n as u64], &vec![0.1f32; n]).unwrap();
        let want = 0.1f32 as f64 * n as f64;
        for dims in [[n as u64, 1], [1, n as u64]] {
            let x = HostTensor::from_bytes(TensorType::new(DType::F32, &dims), x.bytes()).unwrap();
            let got = reduce(ReduceOp::Sum, &[0, 1], &x, &TensorType::scalar(DType::F32))
                .unwrap()
                .get_f64(0);
            assert_eq!(got, want as f32 as f64);
        }
        // Leading-dimension sums go through the vector accumulators.
        let x = HostTensor::from_slice(DType::F32, &[n as u64 / 4, 4], &vec![0.1f32; n]).unwrap();
        let got = reduce(ReduceOp::Sum, &[0], &x, &TensorType::new(DType::F32, &[4])).unwrap();
        assert_eq!(got.to_f64_vec(), vec![(want / 4.0) as f32 as f64; 4]);
    }

    #[test]
    fn arg_reduce_finds_the_first_extreme_and_nan() {
        let shapes: &[(&[u64], usize)] = &[
            (&[5], 0),
            (&[3, 4], 0),
            (&[3, 4], 1),
            (&[2, 3, 4], 1),
            (&[2, 3, 4], 2),
            (&[0, 3], 1),
            (&[4, 1], 0),
            (&[2, 700], 1),
        ];
        for d in ALL {
            for (k, &(dims, dim)) in shapes.iter().enumerate() {
                let n = numel(dims);
                // Few distinct values, so the first of equal extremes matters.
                let v: Vec<f64> =
                    values(n, k as u64, 0.0, if d == DType::Bool { 2.0 } else { 5.0 })
                        .iter()
                        .map(|v| v.floor())
                        .collect();
                let mut v = v;
                if d.is_float() && n > 7 {
                    v[7] = f64::NAN;
                }
                let x = tensor(d, dims, &v);
                let xs = x.to_f64_vec();
                let mut out_dims = dims.to_vec();
                out_dims.remove(dim);
                let strides = contiguous_strides(dims);
                let len = dims[dim] as usize;
                let step = strides[dim] as usize;
                for max in [true, false] {
                    let got =
                        arg_reduce(max, dim, &x, &TensorType::new(DType::I64, &out_dims)).unwrap();
                    let mut want = vec![];
                    for i in 0..n {
                        if !(i / step).is_multiple_of(len) {
                            continue; // one start per output, in output order
                        }
                        let mut best = 0;
                        for j in 1..len {
                            let (b, c) = (xs[i + best * step], xs[i + j * step]);
                            let better =
                                !b.is_nan() && (c.is_nan() || if max { c > b } else { c < b });
                            if better {
                                best = j;
                            }
                        }
                        want.push(best as i64);
                    }
                    assert_eq!(
                        ints(&got),
                        want,
                        "arg{} of {} along {dim}",
                        if max { "max" } else { "min" },
                        x.ty
                    );
                }
            }
        }
        let x = tensor(DType::F32, &[3, 0], &[]);
        assert!(arg_reduce(true, 1, &x, &TensorType::new(DType::I64, &[3])).is_err());
        assert!(arg_reduce(true, 2, &x, &TensorType::new(DType::I64, &[3])).is_err());
        let s = tensor(DType::F32, &[], &[1.0]);
        assert!(arg_reduce(true, 0, &s, &TensorType::scalar(DType::I64)).is_err());
    }

    #[test]
    fn cumulative_matches_running_loops() {
        let shapes: &[(&[u64], usize)] = &[
            (&[5], 0),
            (&[3, 4], 0),
            (&[3, 4], 1),
            (&[2, 3, 4], 1),
            (&[0, 3], 1),
            (&[3, 0], 0),
            (&[1], 0),
            (&[2, 300], 1),
        ];
        for d in ALL {
            for (k, &(dims, dim)) in shapes.iter().enumerate() {
                let n = numel(dims);
                let x = if d.is_float() {
                    tensor(d, dims, &values(n, k as u64, 0.5, 1.5))
                } else {
                    int_tensor(d, dims, &int_values(d, n, k as u64))
                };
                let xs = x.to_f64_vec();
                let strides = contiguous_strides(dims);
                let (len, step) = (dims[dim] as usize, strides[dim] as usize);
                for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                    for reverse in [false, true] {
                        let got = cumulative(op, dim, reverse, &x).unwrap();
                        let what = format!(
                            "cumulative {op:?} of {} along {dim}, reverse {reverse}",
                            x.ty
                        );
                        let mut want = vec![0.0; n];
                        let mut want_i = vec![0i64; n];
                        for i in 0..n {
                            if !(i / step).is_multiple_of(len) {
                                continue;
                            }
                            let (mut a, mut ai) = (float_identity(op), None::<i128>);
                            for s in 0..len {
                                let j = i + step * if reverse { len - 1 - s } else { s };
                                let v = xs[j];
                                a = match op {
                                    ReduceOp::Sum => a + v,
                                    ReduceOp::Prod => a * v,
                                    ReduceOp::Max => a.max(v),
                                    _ => a.min(v),
                                };
                                want[j] = a;
                                if !d.is_float() {
                                    let v = ints(&x)[j] as i128;
                                    let b = match (ai, d == DType::Bool) {
                                        (None, _) => v,
                                        (Some(p), true) => {
                                            if matches!(op, ReduceOp::Sum | ReduceOp::Max) {
                                                p | v
                                            } else {
                                                p & v
                                            }
                                        }
                                        (Some(p), false) => match op {
                                            ReduceOp::Sum => wrap(d, p + v) as i128,
                                            ReduceOp::Prod => wrap(d, p * v) as i128,
                                            ReduceOp::Max => p.max(v),
                                            _ => p.min(v),
                                        },
                                    };
                                    ai = Some(b);
                                    want_i[j] = b as i64;
                                }
                            }
                        }
                        if d.is_float() {
                            assert_close(&got, &want, tol(d, 2.0), &what);
                        } else {
                            assert_eq!(ints(&got), want_i, "{what}");
                        }
                    }
                }
            }
        }
        let x = tensor(DType::F32, &[4], &[1.0, f64::NAN, 3.0, 0.0]);
        let got = cumulative(ReduceOp::Max, 0, false, &x)
            .unwrap()
            .to_f64_vec();
        assert!(got[0] == 1.0 && got[1..].iter().all(|v| v.is_nan()));
        let got = cumulative(ReduceOp::Sum, 0, true, &x).unwrap().to_f64_vec();
        assert!(got[0].is_nan() && got[1].is_nan() && got[2] == 3.0 && got[3] == 0.0);
        assert!(cumulative(ReduceOp::And, 0, false, &x).is_err());
        assert!(cumulative(ReduceOp::Sum, 1, false, &x).is_err());
    }
}
