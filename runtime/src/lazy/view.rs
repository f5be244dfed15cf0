//! Reading a view of a tensor the recording wrote, without a flush.
//!
//! Models read their activations through views all the time: a linear
//! layer's output seen as [batch, heads, seq, head_dim] and transposed,
//! rotary embedding's two halves, a row of logits. When the recording wrote
//! the whole tensor, such a view is a function of the written value: a
//! slice of a reshape, transposed and broadcast. [`derive`] finds those
//! primitives, so the reading op joins the recording instead of cutting it
//! in two. A view it cannot express (elements that wrap around a row, a
//! diagonal, a different dtype) still flushes.

use crate::copy::Layout;
use crate::ir::Prim;

/// Where a view sits in a dense tensor: the flat tensor (cut to whole rows
/// of the view's largest stride when that stride does not divide it)
/// factored so that each dimension of the view that moves through memory
/// is one factor, and the view a block of those factors.
struct Block {
    /// The flat tensor's length when it must be cut first.
    cut: Option<u64>,
    factors: Vec<u64>,
    start: Vec<u64>,
    limit: Vec<u64>,
    /// The view's dimensions that move through memory: (index in view,
    /// size, stride), outermost (largest stride) first.
    real: Vec<(usize, u64, u64)>,
}

impl Block {
    /// The view's moving dimensions, in the view's order: for each, its
    /// place among `real` (outermost first).
    fn order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.real.len()).collect();
        order.sort_by_key(|&j| self.real[j].0);
        order
    }
}

/// The block `view` is in `whole` (row-major contiguous), or None when the
/// view is not a slice, transpose and broadcast of it (or reaches outside
/// it). Both layouts address the same buffer.
fn block(whole: &Layout, view: &Layout) -> Option<Block> {
    let e = whole.elem_size;
    if e == 0 || view.elem_size != e || !whole.is_contiguous() {
        return None;
    }
    let rel = view.offset.checked_sub(whole.offset)?;
    if !rel.is_multiple_of(e) {
        return None;
    }
    let first = rel / e;
    let n = whole.numel();
    if view.numel() == 0 {
        return None;
    }
    let mut last = first;
    for (&s, &t) in view.sizes.iter().zip(&view.strides) {
        last = last.checked_add((s - 1).checked_mul(t)?)?;
    }
    if last >= n {
        return None;
    }
    // Each stride must divide the one before it, or the view is no
    // row-major block.
    let mut real: Vec<(usize, u64, u64)> = (0..view.sizes.len())
        .filter(|&k| view.sizes[k] > 1 && view.strides[k] > 0)
        .map(|k| (k, view.sizes[k], view.strides[k]))
        .collect();
    real.sort_by_key(|r| std::cmp::Reverse(r.2));
    if real
        .windows(2)
        .any(|p| p[0].2 == p[1].2 || !p[0].2.is_multiple_of(p[1].2))
    {
        return None;
    }
    if real.is_empty() {
        // One element (broadcast, when read).
        return Some(Block {
            cut: None,
            factors: vec![n],
            start: vec![first],
            limit: vec![first + 1],
            real,
        });
    }
    // [n / r0, r0 / r1, ..., r(m-2) / r(m-1), r(m-1)], r the strides; the
    // view is then a block of it, at `first`'s coordinates.
    let r0 = real[0].2;
    let rows = n / r0;
    let inner = real[real.len() - 1].2;
    let mut factors: Vec<u64> = vec![rows];
    factors.extend(real.windows(2).map(|p| p[0].2 / p[1].2));
    let mut start: Vec<u64> = Vec::with_capacity(real.len() + 1);
    let mut rem = first;
    for &(_, _, t) in &real {
        start.push(rem / t);
        rem %= t;
    }
    if inner > 1 {
        factors.push(inner);
        start.push(rem);
    }
    let mut limit: Vec<u64> = start.clone();
    for (j, &(_, s, _)) in real.iter().enumerate() {
        limit[j] += s;
        if limit[j] > factors[j] {
            return None; // the view wraps around a factor
        }
    }
    if inner > 1 {
        limit[real.len()] += 1;
    }
    Some(Block {
        cut: (rows * r0 < n).then_some(rows * r0),
        factors,
        start,
        limit,
        real,
    })
}

/// The primitives that turn the value of a tensor with layout `whole`
/// (row-major contiguous) into the value `view` reads, or None when the
/// view is not a slice, transpose and broadcast of it (or reaches outside
/// it). Both layouts address the same buffer.
pub(crate) fn derive(whole: &Layout, view: &Layout) -> Option<Vec<Prim>> {
    let b = block(whole, view)?;
    let mut steps = Steps::new(&whole.sizes);
    steps.reshape(&[whole.numel()]);
    if let Some(cut) = b.cut {
        steps.slice(&[0], &[cut]);
    }
    steps.reshape(&b.factors);
    steps.slice(&b.start, &b.limit);
    let sorted: Vec<u64> = b.real.iter().map(|r| r.1).collect();
    steps.reshape(&sorted);
    // Back to the view's order of dimensions.
    steps.transpose(&b.order());
    // Size-1 and stride-0 dimensions.
    let mut kept: Vec<usize> = b.real.iter().map(|r| r.0).collect();
    kept.sort_unstable();
    if broadcast(view) {
        steps.broadcast(&view.sizes, &kept);
    } else {
        steps.reshape(&view.sizes);
    }
    Some(steps.prims)
}

/// How a value written through a view lands in the value of the whole
/// tensor: `frame` turns the whole value into factors, `update` turns the
/// view's value into the block at `start` of them (a dynamic update slice),
/// and `back` turns the factors into the whole tensor's shape again.
#[derive(Debug, PartialEq)]
pub(crate) struct Placement {
    pub frame: Vec<Prim>,
    pub update: Vec<Prim>,
    pub start: Vec<u64>,
    pub back: Vec<Prim>,
}

/// Where a write through `view` lands in `whole`'s value, or None when the
/// view is no block of it, or writes one element twice (a broadcast view),
/// or its largest stride does not divide the whole tensor.
pub(crate) fn place(whole: &Layout, view: &Layout) -> Option<Placement> {
    let b = block(whole, view)?;
    if b.cut.is_some() || broadcast(view) {
        return None;
    }
    let mut frame = Steps::new(&whole.sizes);
    frame.reshape(&b.factors);
    // The view's moving dimensions, in its order, then outermost first,
    // then with the block's size-1 factors.
    let mut update = Steps::new(&view.sizes);
    let order = b.order();
    update.reshape(&order.iter().map(|&j| b.real[j].1).collect::<Vec<_>>());
    let mut inverse = vec![0; order.len()];
    for (i, &j) in order.iter().enumerate() {
        inverse[j] = i;
    }
    update.transpose(&inverse);
    let sizes: Vec<u64> = b.start.iter().zip(&b.limit).map(|(s, l)| l - s).collect();
    update.reshape(&sizes);
    let mut back = Steps::new(&b.factors);
    back.reshape(&whole.sizes);
    Some(Placement {
        frame: frame.prims,
        update: update.prims,
        start: b.start,
        back: back.prims,
    })
}

/// Whether a view reads one element more than once (a stride-0 dimension).
fn broadcast(view: &Layout) -> bool {
    view.sizes
        .iter()
        .zip(&view.strides)
        .any(|(&s, &t)| s > 1 && t == 0)
}

/// Primitives in order, each skipped when it would change nothing.
struct Steps {
    prims: Vec<Prim>,
    dims: Vec<u64>,
    /// The dims the chain starts from.
    start: Vec<u64>,
}

impl Steps {
    fn new(dims: &[u64]) -> Steps {
        Steps {
            prims: Vec::new(),
            dims: dims.to_vec(),
            start: dims.to_vec(),
        }
    }

    /// (Two reshapes in a row are one: each is a copy on some platforms.)
    fn reshape(&mut self, dims: &[u64]) {
        if self.dims == dims {
            return;
        }
        if let Some(Prim::Reshape { .. }) = self.prims.last() {
            self.prims.pop();
        }
        self.prims.push(Prim::Reshape {
            dims: dims.to_vec(),
        });
        self.dims = dims.to_vec();
        // A reshape back to where the chain started is no step at all.
        if self.prims.len() == 1 && self.dims == self.start {
            self.prims.clear();
        }
    }

    fn slice(&mut self, start: &[u64], limit: &[u64]) {
        if start.iter().any(|&s| s > 0) || limit != self.dims.as_slice() {
            self.prims.push(Prim::Slice {
                start: start.to_vec(),
                limit: limit.to_vec(),
                stride: vec![1; start.len()],
            });
            self.dims = start.iter().zip(limit).map(|(s, l)| l - s).collect();
        }
    }

    fn transpose(&mut self, perm: &[usize]) {
        if perm.iter().enumerate().any(|(i, &p)| i != p) {
            self.prims.push(Prim::Transpose {
                perm: perm.to_vec(),
            });
            self.dims = perm.iter().map(|&p| self.dims[p]).collect();
        }
    }

    fn broadcast(&mut self, dims: &[u64], mapping: &[usize]) {
        self.prims.push(Prim::BroadcastInDim {
            dims: dims.to_vec(),
            mapping: mapping.to_vec(),
        });
        self.dims = dims.to_vec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layout(offset: u64, sizes: &[u64], strides: &[u64]) -> Layout {
        let mut l = Layout::contiguous(sizes, 4);
        l.offset = offset * 4;
        l.strides = crate::copy::Dims::from_slice(strides);
        l
    }

    /// Runs `prims` on a tensor of element indices: (dims, values).
    fn apply(prims: &[Prim], mut dims: Vec<u64>, mut v: Vec<u64>) -> (Vec<u64>, Vec<u64>) {
        let strides = |d: &[u64]| Layout::contiguous(d, 1).strides.to_vec();
        // Every element of `out_dims`, with its index into the input.
        let gather = |v: &[u64], out: &[u64], src: &dyn Fn(&[u64]) -> u64| -> Vec<u64> {
            let total: u64 = out.iter().product();
            (0..total)
                .map(|mut i| {
                    let mut idx = vec![0; out.len()];
                    for k in (0..out.len()).rev() {
                        idx[k] = i % out[k];
                        i /= out[k];
                    }
                    v[src(&idx) as usize]
                })
                .collect()
        };
        for p in prims {
            let st = strides(&dims);
            match p {
                Prim::Reshape { dims: d } => {
                    assert_eq!(d.iter().product::<u64>(), v.len() as u64);
                    dims = d.clone();
                }
                Prim::Slice { start, limit, .. } => {
                    let out: Vec<u64> = start.iter().zip(limit).map(|(s, l)| l - s).collect();
                    v = gather(&v, &out, &|i| {
                        i.iter()
                            .zip(start)
                            .zip(&st)
                            .map(|((a, s), t)| (a + s) * t)
                            .sum()
                    });
                    dims = out;
                }
                Prim::Transpose { perm } => {
                    let out: Vec<u64> = perm.iter().map(|&p| dims[p]).collect();
                    v = gather(&v, &out, &|i| {
                        i.iter().zip(perm).map(|(a, &p)| a * st[p]).sum()
                    });
                    dims = out;
                }
                Prim::BroadcastInDim { dims: d, mapping } => {
                    v = gather(&v, d, &|i| {
                        mapping
                            .iter()
                            .enumerate()
                            .map(|(k, &m)| if dims[k] == 1 { 0 } else { i[m] * st[k] })
                            .sum()
                    });
                    dims = d.clone();
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        (dims, v)
    }

    /// What `view` reads, as indices of the whole tensor's elements.
    fn reads(first: u64, view: &Layout) -> Vec<u64> {
        let total = view.numel();
        (0..total)
            .map(|mut i| {
                let mut at = first;
                for k in (0..view.sizes.len()).rev() {
                    at += (i % view.sizes[k]) * view.strides[k];
                    i /= view.sizes[k];
                }
                at
            })
            .collect()
    }

    fn check(whole: &[u64], first: u64, sizes: &[u64], strides: &[u64]) -> bool {
        let w = Layout::contiguous(whole, 4);
        let v = layout(first, sizes, strides);
        let Some(prims) = derive(&w, &v) else {
            return false;
        };
        let n: u64 = whole.iter().product();
        let (dims, got) = apply(&prims, whole.to_vec(), (0..n).collect());
        assert_eq!(dims, sizes, "{prims:?}");
        assert_eq!(got, reads(first, &v), "{prims:?}");
        true
    }

    #[test]
    fn the_views_models_read_are_derived() {
        // [2, 4, 3] seen as [2, 3, 4] with dims 1 and 2 swapped.
        assert!(check(&[2, 4, 3], 0, &[2, 3, 4], &[12, 1, 3]));
        // Heads: a [2, 6, 8] projection as [2, 2, 6, 4], transposed.
        assert!(check(&[2, 6, 8], 0, &[2, 2, 6, 4], &[48, 4, 8, 1]));
        // Rotary halves: the second half of the last dimension.
        assert!(check(&[3, 8], 4, &[3, 4], &[8, 1]));
        // A row, a column, every other element, one element.
        assert!(check(&[4, 5], 10, &[5], &[1]));
        assert!(check(&[4, 5], 2, &[4], &[5]));
        assert!(check(&[12], 1, &[6], &[2]));
        assert!(check(&[4, 5], 7, &[], &[]));
        // Expanded: a row broadcast over 3 rows; size-1 dimensions.
        assert!(check(&[4, 5], 5, &[3, 5], &[0, 1]));
        assert!(check(&[4, 5], 0, &[4, 1, 5, 1], &[5, 7, 1, 9]));
        // The whole tensor under another shape.
        assert!(check(&[4, 6], 0, &[2, 12], &[12, 1]));
    }

    /// Reshapes in a row are merged, and a view equal to the whole tensor
    /// under its own shape needs nothing.
    #[test]
    fn derivations_take_few_steps() {
        let w = Layout::contiguous(&[2, 6, 8], 4);
        let heads = derive(&w, &layout(0, &[2, 2, 6, 4], &[48, 4, 8, 1])).unwrap();
        let names: Vec<String> = heads.iter().map(|p| p.name()).collect();
        assert_eq!(names, ["reshape", "transpose"], "{heads:?}");
        assert_eq!(
            derive(&w, &layout(0, &[2, 6, 8], &[48, 8, 1])),
            Some(vec![])
        );
        let flat = derive(&w, &layout(0, &[96], &[1])).unwrap();
        assert_eq!(flat, vec![Prim::Reshape { dims: vec![96] }]);
    }

    #[test]
    fn views_that_are_not_blocks_are_refused() {
        // The diagonal of 4x4: stride 5 does not fit a row-major block.
        assert!(!check(&[4, 4], 0, &[4], &[5]));
        // Rows of 3 from column 2 of 4-wide rows: each wraps into the next.
        assert!(!check(&[3, 4], 2, &[2, 3], &[4, 1]));
        // (Read flat, the same 3 elements from column 3 are a slice.)
        assert!(check(&[2, 4], 3, &[3], &[1]));
        // Past the end of the whole tensor.
        assert!(!check(&[2, 4], 4, &[2, 4], &[4, 1]));
        // Strides that do not divide each other.
        assert!(!check(&[24], 0, &[2, 3], &[6, 4]));
        // Another element size, or a whole tensor that is not dense.
        let w = Layout::contiguous(&[8], 4);
        let mut v = Layout::contiguous(&[4], 8);
        assert!(derive(&w, &v).is_none());
        v = layout(0, &[2, 2], &[1, 4]);
        assert!(derive(&v, &layout(0, &[2], &[1])).is_none());
        // Before the whole tensor's first element.
        let mut w = Layout::contiguous(&[8], 4);
        w.offset = 16;
        assert!(derive(&w, &layout(0, &[2], &[1])).is_none());
    }

    /// Writes `1000 + i` through the view (its elements in row-major
    /// order) with `place`'s primitives; checks the whole tensor's value
    /// against writing through the layout. False when refused.
    fn check_place(whole: &[u64], first: u64, sizes: &[u64], strides: &[u64]) -> bool {
        let w = Layout::contiguous(whole, 4);
        let v = layout(first, sizes, strides);
        let Some(p) = place(&w, &v) else {
            return false;
        };
        let n: u64 = whole.iter().product();
        let (fdims, mut frame) = apply(&p.frame, whole.to_vec(), (0..n).collect());
        let (udims, update) = apply(
            &p.update,
            sizes.to_vec(),
            (0..v.numel()).map(|i| 1000 + i).collect(),
        );
        assert_eq!(udims.len(), fdims.len(), "{p:?}");
        // The dynamic update slice, by hand.
        let fstrides = Layout::contiguous(&fdims, 1).strides.to_vec();
        for (j, &x) in update.iter().enumerate() {
            let mut rem = j as u64;
            let mut at = 0;
            for k in (0..udims.len()).rev() {
                at += (p.start[k] + rem % udims[k]) * fstrides[k];
                rem /= udims[k];
            }
            frame[at as usize] = x;
        }
        let (dims, got) = apply(&p.back, fdims, frame);
        assert_eq!(dims, whole, "{p:?}");
        let mut want: Vec<u64> = (0..n).collect();
        for (j, at) in reads(first, &v).into_iter().enumerate() {
            want[at as usize] = 1000 + j as u64;
        }
        assert_eq!(got, want, "{p:?}");
        true
    }

    #[test]
    fn writes_through_views_models_make_are_placed() {
        // The first half of the last dimension (rotary embedding's backward).
        assert!(check_place(&[3, 8], 0, &[3, 4], &[8, 1]));
        assert!(check_place(&[2, 3, 8], 4, &[2, 3, 4], &[24, 8, 1]));
        // A transposed view, a row, a column, one element, every other one.
        assert!(check_place(&[2, 4, 3], 0, &[2, 3, 4], &[12, 1, 3]));
        assert!(check_place(&[4, 5], 10, &[5], &[1]));
        assert!(check_place(&[4, 5], 2, &[4], &[5]));
        assert!(check_place(&[4, 5], 7, &[], &[]));
        assert!(check_place(&[12], 1, &[6], &[2]));
        // Heads written back through [2, 2, 6, 4] into [2, 6, 8].
        assert!(check_place(&[2, 6, 8], 0, &[2, 2, 6, 4], &[48, 4, 8, 1]));
        // A broadcast view writes an element twice: refused (torch refuses
        // such writes too); so is a stride that does not divide the tensor.
        assert!(!check_place(&[4, 5], 5, &[3, 5], &[0, 1]));
        assert!(!check_place(&[2, 5], 0, &[2], &[4]));
        let names = |p: Placement| -> Vec<Vec<String>> {
            [p.frame, p.update, p.back]
                .iter()
                .map(|c| c.iter().map(|x| x.name()).collect())
                .collect()
        };
        // The whole tensor's shape already frames a last-dim half.
        let w = Layout::contiguous(&[3, 8], 4);
        let half = place(&w, &layout(0, &[3, 4], &[8, 1])).unwrap();
        assert_eq!(half.start, [0, 0]);
        assert_eq!(names(half), [vec![], vec![], Vec::<String>::new()]);
    }

    proptest! {
        /// Any strided view of a small tensor: when derived, the primitives
        /// read exactly the view's elements.
        #[test]
        fn derived_views_read_what_the_view_reads(
            whole in prop::collection::vec(1u64..5, 1..4),
            first in 0u64..20,
            dims in prop::collection::vec((1u64..4, 0u64..13), 0..4),
        ) {
            let sizes: Vec<u64> = dims.iter().map(|d| d.0).collect();
            let strides: Vec<u64> = dims.iter().map(|d| d.1).collect();
            let derived = check(&whole, first, &sizes, &strides);
            let placed = check_place(&whole, first, &sizes, &strides);
            // A write is placed only where a read is derived.
            prop_assert!(derived || !placed);
        }
    }
}
