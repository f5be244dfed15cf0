//! Scaled dot-product attention (`Prim::Attention`) and its backward, in
//! blocks of query rows.
//!
//! A block's scores live in a scratch of rows × keys; the whole [l, s]
//! score matrix of a head is never built. Under `causal` a block reads
//! only the keys up to its last row, so about half the products of a
//! square causal head are skipped (torch's CPU flash kernel does the
//! same). Grouped-query heads read their key/value head in place. The
//! products go through the gemm crate, which takes any strides, so kᵀ and
//! the transposed probabilities are read where they lie.
//!
//! The forward keeps each row's logsumexp; the backward recomputes the
//! probabilities from it (P = exp(scale · q kᵀ - lse)) and uses
//! rowsum(dO · out) for rowsum(P · dP), as flash attention does.
//!
//! Threads: the forward splits over query heads, the backward over
//! key/value heads (each owns its dk and dv and the dq of its group).

use rayon::prelude::*;

use super::HostTensor;
use crate::error::Result;
use crate::ir::{DType, TensorType};
use crate::platform::host::cpu::dispatch;
use crate::platform::host::vmath;

/// Query rows per block under `causal`: a causal block reads the keys up
/// to its last row, so small blocks skip more of them.
const ROWS: usize = 64;

/// Scores a block holds at most without a mask (256 KiB, in L2): fewer
/// and larger blocks pack each head's keys and values fewer times.
const BLOCK_SCORES: usize = 1 << 16;

/// Query rows per block for `s` keys.
fn block_rows(s: usize, causal: bool) -> usize {
    if causal {
        ROWS
    } else {
        (BLOCK_SCORES / s.max(1)).clamp(ROWS, 8 * ROWS)
    }
}

/// A matrix inside a slice: element (r, c) is at `r * rs + c * cs`.
#[derive(Clone, Copy)]
struct Mat<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> Mat<'a> {
    /// Rows `r0..r0 + rows` of a row-major matrix `cols` wide.
    fn rows_of(data: &'a [f32], cols: usize, r0: usize, rows: usize) -> Self {
        Mat {
            data: &data[r0 * cols..(r0 + rows) * cols],
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    fn t(self) -> Self {
        Mat {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }
}

/// `dst (m × n, row-major, row stride ld) = [dst +] beta · a · b`.
fn mm(dst: &mut [f32], ld: usize, a: Mat, b: Mat, beta: f32, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "attention product: inner dimensions differ");
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        n <= ld && (m - 1) * ld + n <= dst.len(),
        "attention product: dst too small"
    );
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                dst[r * ld..r * ld + n].fill(0.0);
            }
        }
        return;
    }
    for x in [a, b] {
        assert!(
            (x.rows - 1) * x.rs + (x.cols - 1) * x.cs < x.data.len(),
            "attention product: operand reaches past its slice"
        );
    }
    // SAFETY: the asserts above bound every element gemm reads of `a` and
    // `b` and writes of `dst` (m rows of n at stride ld) inside their
    // slices; `dst` is a unique borrow, so it aliases neither operand.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            ld as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            if accumulate { 1.0 } else { 0.0 },
            beta,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// Split `buf` into `parts` consecutive pieces of `size` (any may be empty).
fn pieces(buf: &mut [f32], parts: usize, size: usize) -> Vec<&mut [f32]> {
    if size == 0 {
        return (0..parts).map(|_| <&mut [f32]>::default()).collect();
    }
    buf.chunks_mut(size).collect()
}

/// The shape of one attention: `heads` query heads in all (batch dims
/// folded in), `groups` query heads per key/value head.
#[derive(Clone, Copy, Debug)]
struct Shape {
    heads: usize,
    groups: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
}

impl Shape {
    fn of(q: &[u64], k: &[u64], v: &[u64]) -> Self {
        let r = q.len();
        let n = |d: &[u64]| d.iter().product::<u64>() as usize;
        let heads = n(&q[..r - 2]);
        let kv_heads = n(&k[..r - 2]);
        Shape {
            heads,
            groups: heads.checked_div(kv_heads).unwrap_or(1),
            l: q[r - 2] as usize,
            s: k[r - 2] as usize,
            e: q[r - 1] as usize,
            ev: v[r - 1] as usize,
        }
    }

    /// Keys a block of rows r0..r1 reads, and keys row `i` attends to.
    fn keys(&self, causal: bool, r1: usize) -> usize {
        if causal {
            r1.min(self.s)
        } else {
            self.s
        }
    }
    fn row_keys(&self, causal: bool, i: usize) -> usize {
        if causal {
            (i + 1).min(self.s)
        } else {
            self.s
        }
    }
}

/// A row of scores over its first `n` keys turned in place into
/// exp(score - max), the keys past `n` set to 0: the row's softmax times
/// its sum. Returns the logsumexp and 1/sum, the factor that normalizes
/// the row (1 where the sum is 0 or NaN: the row stays as it is). The
/// forward multiplies the product of the row and v by it, which is fewer
/// multiplications than the row (v is narrower than the keys are many).
/// Max, then exp and sum in one pass, each in 16 independent lanes, so
/// they vectorize (16 wide under AVX-512, see `cpu::dispatch`).
#[inline(always)]
fn exp_row(row: &mut [f32], n: usize) -> (f32, f32) {
    if n == 0 {
        row.fill(0.0);
        return (f32::NEG_INFINITY, 1.0);
    }
    // The keys past `n` up to whole vectors read as -inf (exp gives 0, the
    // max and the sum stay): under `causal` a row's n is any of 1..=keys,
    // and the remainder one by one took most of the softmax's time.
    let n = padded(row, n);
    let max = max_lanes(&row[..n]);
    // A row of -inf (or +inf) scores: subtracting would give NaN for
    // -inf; torch's math path gives NaN for +inf, and so does this.
    let shift = if max == f32::NEG_INFINITY { 0.0 } else { max };
    let sum = exp_sum_lanes(&mut row[..n], shift);
    row[n..].fill(0.0);
    if sum > 0.0 {
        (shift + sum.ln(), 1.0 / sum)
    } else {
        (f32::NEG_INFINITY, 1.0)
    }
}

const LANES: usize = 16;

/// `n` rounded up to whole vectors of LANES within the row, the elements
/// added set to -inf.
#[inline(always)]
fn padded(row: &mut [f32], n: usize) -> usize {
    let to = n.next_multiple_of(LANES).min(row.len());
    row[n..to].fill(f32::NEG_INFINITY);
    to
}

/// The largest element, NaN ignored (as `f32::max` does): four runs of
/// 16 lanes, so four vector maxima are in flight (one would wait on the
/// last one's latency), then 16 lanes, then one by one.
#[inline(always)]
fn max_lanes(x: &[f32]) -> f32 {
    let max16 = |l: &mut [f32; LANES], c: &[f32]| {
        for (l, &v) in l.iter_mut().zip(c) {
            *l = l.max(v);
        }
    };
    let mut m = [[f32::NEG_INFINITY; LANES]; 4];
    let mut chunks = x.chunks_exact(4 * LANES);
    for c in &mut chunks {
        let (a, b) = c.split_at(2 * LANES);
        max16(&mut m[0], &a[..LANES]);
        max16(&mut m[1], &a[LANES..]);
        max16(&mut m[2], &b[..LANES]);
        max16(&mut m[3], &b[LANES..]);
    }
    let [mut lanes, b, c, d] = m;
    for w in [b, c, d] {
        max16(&mut lanes, &w);
    }
    let mut rest = chunks.remainder().chunks_exact(LANES);
    for c in &mut rest {
        max16(&mut lanes, c);
    }
    let tail = rest
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    tail.max(halve(lanes, f32::max))
}

/// `x = exp(x - shift)` in place, returning the sum, in 16 lanes.
#[inline(always)]
fn exp_sum_lanes(x: &mut [f32], shift: f32) -> f32 {
    let mut lanes = [0f32; LANES];
    let mut chunks = x.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *v = vmath::exp_f32(*v - shift);
            *l += *v;
        }
    }
    let mut tail = 0f32;
    for v in chunks.into_remainder() {
        *v = vmath::exp_f32(*v - shift);
        tail += *v;
    }
    halve(lanes, |a, b| a + b) + tail
}

/// Lanes combined by halving (8 pairs, 4, 2, 1): four vector steps, where
/// one lane after another would be sixteen dependent ones (a row of 256
/// keys is only sixteen vectors).
#[inline(always)]
fn halve(mut lanes: [f32; LANES], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for k in 0..width {
            lanes[k] = f(lanes[k], lanes[k + width]);
        }
    }
    lanes[0]
}

/// Row `i` of a row-major block `width` wide.
fn row_mut(block: &mut [f32], width: usize, i: usize) -> &mut [f32] {
    &mut block[i * width..(i + 1) * width]
}

/// `Prim::Attention`: (out, logsumexp).
pub fn attention(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    scale: f64,
    causal: bool,
    out_types: &[TensorType],
) -> Result<Vec<HostTensor>> {
    let sh = Shape::of(q.dims(), k.dims(), v.dims());
    let mut out = HostTensor::for_overwrite(out_types[0].clone());
    let mut lse = HostTensor::for_overwrite(out_types[1].clone());
    let (qs, ks, vs) = (
        q.as_slice::<f32>(),
        k.as_slice::<f32>(),
        v.as_slice::<f32>(),
    );
    let scale = scale as f32;
    let outs = pieces(out.as_slice_mut::<f32>(), sh.heads, sh.l * sh.ev);
    let lses = pieces(lse.as_slice_mut::<f32>(), sh.heads, sh.l);
    let block = block_rows(sh.s, causal);
    // One block of scores per thread's run of heads, not per head: 256
    // KiB from the allocator is a fresh mapping, page-faulted anew.
    let scratch = block.min(sh.l) * sh.s;
    outs.into_par_iter().zip(lses).enumerate().for_each_init(
        || (vec![0f32; scratch], vec![0f32; block]),
        |(scores, norm), (h, (out, lse))| {
            let kv = h / sh.groups;
            let qh = &qs[h * sh.l * sh.e..(h + 1) * sh.l * sh.e];
            let kh = &ks[kv * sh.s * sh.e..(kv + 1) * sh.s * sh.e];
            let vh = &vs[kv * sh.s * sh.ev..(kv + 1) * sh.s * sh.ev];
            for r0 in (0..sh.l).step_by(block) {
                let rows = block.min(sh.l - r0);
                let keys = sh.keys(causal, r0 + rows);
                let sc = &mut scores[..rows * keys];
                mm(
                    sc,
                    keys,
                    Mat::rows_of(qh, sh.e, r0, rows),
                    Mat::rows_of(kh, sh.e, 0, keys).t(),
                    scale,
                    false,
                );
                dispatch!(for i in 0..rows {
                    let n = sh.row_keys(causal, r0 + i);
                    (lse[r0 + i], norm[i]) = exp_row(row_mut(sc, keys, i), n);
                });
                let out = &mut out[r0 * sh.ev..(r0 + rows) * sh.ev];
                mm(
                    out,
                    sh.ev,
                    Mat {
                        data: sc,
                        rows,
                        cols: keys,
                        rs: keys,
                        cs: 1,
                    },
                    Mat::rows_of(vh, sh.ev, 0, keys),
                    1.0,
                    false,
                );
                if sh.ev > 0 {
                    for (o, &f) in out.chunks_exact_mut(sh.ev).zip(&norm[..rows]) {
                        o.iter_mut().for_each(|x| *x *= f);
                    }
                }
            }
        },
    );
    Ok(vec![out, lse])
}

/// `Prim::AttentionBackward`: (dq, dk, dv) from (grad_out, q, k, v, out,
/// logsumexp).
pub fn attention_backward(
    inputs: &[&HostTensor],
    scale: f64,
    causal: bool,
    out_types: &[TensorType],
) -> Result<Vec<HostTensor>> {
    let [g, q, k, v, o, lse] = inputs else {
        return Err(crate::error::Error::Internal(format!(
            "attention_backward takes 6 inputs, got {}",
            inputs.len()
        )));
    };
    let sh = Shape::of(q.dims(), k.dims(), v.dims());
    let kv_heads = sh.heads / sh.groups.max(1);
    let zeros = |t: &TensorType| HostTensor::zeros(TensorType::new(DType::F32, &t.dims));
    let (mut dq, mut dk, mut dv) = (
        HostTensor::for_overwrite(out_types[0].clone()),
        zeros(&out_types[1]),
        zeros(&out_types[2]),
    );
    let (gs, qs, ks, vs, os, ls) = (
        g.as_slice::<f32>(),
        q.as_slice::<f32>(),
        k.as_slice::<f32>(),
        v.as_slice::<f32>(),
        o.as_slice::<f32>(),
        lse.as_slice::<f32>(),
    );
    let scale = scale as f32;
    let dqs = pieces(dq.as_slice_mut::<f32>(), kv_heads, sh.groups * sh.l * sh.e);
    let dks = pieces(dk.as_slice_mut::<f32>(), kv_heads, sh.s * sh.e);
    let dvs = pieces(dv.as_slice_mut::<f32>(), kv_heads, sh.s * sh.ev);
    let step = block_rows(sh.s, causal);
    let block = step.min(sh.l) * sh.s;
    dqs.into_par_iter()
        .zip(dks)
        .zip(dvs)
        .enumerate()
        .for_each_init(
            || (vec![0f32; block], vec![0f32; block]),
            |(p, dp), (kv, ((dq, dk), dv))| {
                let kh = &ks[kv * sh.s * sh.e..(kv + 1) * sh.s * sh.e];
                let vh = &vs[kv * sh.s * sh.ev..(kv + 1) * sh.s * sh.ev];
                for gi in 0..sh.groups {
                    let h = kv * sh.groups + gi;
                    let qh = &qs[h * sh.l * sh.e..(h + 1) * sh.l * sh.e];
                    let gh = &gs[h * sh.l * sh.ev..(h + 1) * sh.l * sh.ev];
                    let oh = &os[h * sh.l * sh.ev..(h + 1) * sh.l * sh.ev];
                    let lh = &ls[h * sh.l..(h + 1) * sh.l];
                    let dqh = &mut dq[gi * sh.l * sh.e..(gi + 1) * sh.l * sh.e];
                    for r0 in (0..sh.l).step_by(step) {
                        let rows = step.min(sh.l - r0);
                        let keys = sh.keys(causal, r0 + rows);
                        let (p, dp) = (&mut p[..rows * keys], &mut dp[..rows * keys]);
                        let q_blk = Mat::rows_of(qh, sh.e, r0, rows);
                        let g_blk = Mat::rows_of(gh, sh.ev, r0, rows);
                        let k_keys = Mat::rows_of(kh, sh.e, 0, keys);
                        // P = exp(scale · q kᵀ - lse), 0 past each row's keys.
                        mm(p, keys, q_blk, k_keys.t(), scale, false);
                        dispatch!(for i in 0..rows {
                            let row = row_mut(p, keys, i);
                            let n = sh.row_keys(causal, r0 + i);
                            let l = lh[r0 + i];
                            if l == f32::NEG_INFINITY {
                                row.fill(0.0);
                                continue;
                            }
                            // As in `exp_row`: -inf past n, whole vectors.
                            let n = padded(row, n);
                            for x in &mut row[..n] {
                                *x = vmath::exp_f32(*x - l);
                            }
                            row[n..].fill(0.0);
                        });
                        let p_blk = Mat {
                            data: p,
                            rows,
                            cols: keys,
                            rs: keys,
                            cs: 1,
                        };
                        // dV += Pᵀ dO
                        mm(dv, sh.ev, p_blk.t(), g_blk, 1.0, true);
                        // dP = dO vᵀ, then dS = scale · P (dP - rowsum(dO · out)).
                        mm(
                            dp,
                            keys,
                            g_blk,
                            Mat::rows_of(vh, sh.ev, 0, keys).t(),
                            1.0,
                            false,
                        );
                        dispatch!(for i in 0..rows {
                            let dprow = row_mut(dp, keys, i);
                            let prow = &p[i * keys..(i + 1) * keys];
                            let at = (r0 + i) * sh.ev;
                            let delta: f32 = gh[at..at + sh.ev]
                                .iter()
                                .zip(&oh[at..at + sh.ev])
                                .map(|(a, b)| a * b)
                                .sum();
                            for (d, &pv) in dprow.iter_mut().zip(prow) {
                                *d = scale * pv * (*d - delta);
                            }
                        });
                        let ds = Mat {
                            data: dp,
                            rows,
                            cols: keys,
                            rs: keys,
                            cs: 1,
                        };
                        // dQ = dS k, dK += dSᵀ q
                        mm(
                            &mut dqh[r0 * sh.e..(r0 + rows) * sh.e],
                            sh.e,
                            ds,
                            k_keys,
                            1.0,
                            false,
                        );
                        mm(dk, sh.e, ds.t(), q_blk, 1.0, true);
                    }
                }
            },
        );
    Ok(vec![dq, dk, dv])
}

#[cfg(test)]
mod tests {
    use crate::ir::{DType, GraphBuilder, Prim, TensorType};
    use crate::ops::expand_composites;
    use crate::platform::host::kernels::{eval_graph, HostTensor};

    fn tensor(dims: &[u64], seed: f64) -> HostTensor {
        let n: u64 = dims.iter().product();
        let vals: Vec<f64> = (0..n)
            .map(|i| ((i as f64 + 1.0) * 0.7311 + seed).sin() * 1.5)
            .collect();
        HostTensor::from_f64(DType::F32, dims, &vals).unwrap()
    }

    /// The composite's kernel and its expansion into primitives, both run
    /// by the host kernels, agree.
    fn kernel_and_expansion_agree(prim: Prim, inputs: &[HostTensor], what: &str) {
        let mut b = GraphBuilder::new();
        let params: Vec<_> = inputs
            .iter()
            .map(|t| b.param(TensorType::new(DType::F32, t.dims())))
            .collect();
        let outs = b.node(prim, &params).unwrap();
        let graph = b.build(&outs).unwrap();
        let expanded = expand_composites(&graph).unwrap();
        assert!(!expanded.nodes().iter().any(|n| n.prim.is_composite()));
        let got = eval_graph(&graph, inputs).unwrap();
        let want = eval_graph(&expanded, inputs).unwrap();
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.dims(), w.dims(), "{what}: output {k}");
            for (i, (x, y)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
                let close = (x - y).abs() <= 1e-4 * (1.0 + y.abs()) || (x == &y);
                assert!(close, "{what}: output {k} element {i}: {x} against {y}");
            }
        }
    }

    #[test]
    fn attention_equals_its_decomposition() {
        // (q dims, k dims, v dims): square and not, rows over one block,
        // grouped heads, and empty extents.
        let cases: &[(&[u64], &[u64], &[u64])] = &[
            (&[2, 3, 5, 4], &[2, 3, 5, 4], &[2, 3, 5, 6]),
            (&[1, 4, 130, 8], &[1, 2, 130, 8], &[1, 2, 130, 8]),
            (&[2, 3, 7], &[2, 9, 7], &[2, 9, 3]),
            (&[1, 2, 9, 4], &[1, 2, 3, 4], &[1, 2, 3, 4]),
            (&[1, 2, 70, 4], &[1, 1, 66, 4], &[1, 1, 66, 5]),
            // Unmasked rows over blocks of 327 rows (256K of scores).
            (&[1, 1, 700, 4], &[1, 1, 200, 4], &[1, 1, 200, 3]),
            (&[1, 2, 3, 4], &[1, 2, 0, 4], &[1, 2, 0, 4]),
            (&[1, 2, 0, 4], &[1, 2, 3, 4], &[1, 2, 3, 4]),
            (&[2, 2, 3, 0], &[2, 2, 3, 0], &[2, 2, 3, 2]),
            (&[2, 2, 3, 2], &[2, 2, 3, 2], &[2, 2, 3, 0]),
            (&[0, 2, 3, 2], &[0, 1, 3, 2], &[0, 1, 3, 2]),
        ];
        for (n, (qd, kd, vd)) in cases.iter().enumerate() {
            for causal in [false, true] {
                for scale in [0.5, -1.25] {
                    let (q, k, v) = (tensor(qd, 0.1), tensor(kd, 0.2), tensor(vd, 0.3));
                    let what = format!("case {n} causal {causal} scale {scale}");
                    let prim = Prim::Attention { scale, causal };
                    kernel_and_expansion_agree(
                        prim.clone(),
                        &[q.clone(), k.clone(), v.clone()],
                        &what,
                    );
                    // A runtime scale multiplies the attribute's.
                    let c = HostTensor::from_f64(DType::F32, &[], &[-0.75]).unwrap();
                    kernel_and_expansion_agree(
                        prim.clone(),
                        &[q.clone(), k.clone(), v.clone(), c],
                        &format!("{what} runtime scale"),
                    );
                    let fwd = crate::platform::host::kernels::eval(&prim, &[&q, &k, &v]).unwrap();
                    let g = tensor(fwd[0].dims(), 0.4);
                    kernel_and_expansion_agree(
                        Prim::AttentionBackward { scale, causal },
                        &[g, q, k, v, fwd[0].clone(), fwd[1].clone()],
                        &format!("{what} backward"),
                    );
                }
            }
        }
    }

    #[test]
    fn attention_checks_its_operands() {
        let f = |d: &[u64]| TensorType::new(DType::F32, d);
        let bad: &[(&[u64], &[u64], &[u64])] = &[
            (&[3, 4], &[3, 4], &[3, 4]),
            (&[1, 3, 2, 4], &[1, 2, 2, 4], &[1, 2, 2, 4]),
            (&[1, 2, 2, 4], &[1, 2, 2, 5], &[1, 2, 2, 4]),
            (&[1, 2, 2, 4], &[1, 2, 3, 4], &[1, 2, 2, 4]),
            (&[2, 2, 2, 4], &[1, 2, 2, 4], &[1, 2, 2, 4]),
        ];
        for (qd, kd, vd) in bad {
            let err = crate::ir::graph::infer_types(
                &Prim::Attention {
                    scale: 1.0,
                    causal: false,
                },
                &[f(qd), f(kd), f(vd)],
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains("q f32["), "{err}");
        }
        // The runtime scale: an f32 scalar, the fourth and last operand.
        let ok = f(&[1, 2, 2, 4]);
        let prim = Prim::Attention {
            scale: 1.0,
            causal: false,
        };
        for (extra, says) in [
            (vec![f(&[1])], "runtime scale (operand 3) f32[1]"),
            (vec![TensorType::scalar(DType::F64)], "is not an f32 scalar"),
            (vec![f(&[]), f(&[])], "takes 3 or 4 operands, got 5"),
        ] {
            let mut ins = vec![ok.clone(), ok.clone(), ok.clone()];
            ins.extend(extra);
            let err = crate::ir::graph::infer_types(&prim, &ins)
                .unwrap_err()
                .to_string();
            assert!(err.contains(says), "{err}");
        }
        let half = TensorType::new(DType::BF16, &[1, 2, 2, 4]);
        assert!(crate::ir::graph::infer_types(
            &Prim::Attention {
                scale: 1.0,
                causal: false
            },
            &[half.clone(), half.clone(), half]
        )
        .unwrap_err()
        .to_string()
        .contains("must be f32"));
    }
}
