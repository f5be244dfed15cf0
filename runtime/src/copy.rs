//! Strided layouts and the copies between host and device memory.
//!
//! A [`Layout`] says where a tensor's elements sit in a buffer: a byte
//! offset, sizes and strides (in elements, as PyTorch counts them). Copies
//! walk both sides' layouts together and move the longest runs of bytes
//! that are contiguous on both sides, so a contiguous copy is one move.

use crate::error::{Error, Result};

/// A layout's sizes or strides: inline up to six dimensions (the heap
/// beyond), so making or cloning a tensor descriptor allocates nothing.
pub type Dims = smallvec::SmallVec<[u64; 6]>;

#[derive(Debug, PartialEq, Eq)]
pub struct Layout {
    /// Byte offset of element [0, 0, ...] in the buffer.
    pub offset: u64,
    pub sizes: Dims,
    /// In elements, one per dimension.
    pub strides: Dims,
    /// Bytes per element.
    pub elem_size: u64,
}

// Every op's tensors are cloned a few times on their way to a launch.
// SmallVec's own Clone pushes element by element; dims are Copy, so a
// slice copy does (`Launch::new`, three work references: 1.26K -> 0.93K
// instructions under callgrind).
impl Clone for Layout {
    fn clone(&self) -> Self {
        Layout {
            offset: self.offset,
            sizes: Dims::from_slice(&self.sizes),
            strides: Dims::from_slice(&self.strides),
            elem_size: self.elem_size,
        }
    }
}

impl Layout {
    /// Row-major contiguous layout.
    pub fn contiguous(sizes: &[u64], elem_size: u64) -> Layout {
        // Inline up to six dimensions, so no heap: a `vec![0; n]` is a
        // calloc, which glibc serves from its arena under a lock instead of
        // the thread's cache, and a layout is made for every tensor of
        // every op.
        let mut strides: Dims = smallvec::smallvec![0; sizes.len()];
        let mut acc = 1u64;
        for (st, &s) in strides.iter_mut().zip(sizes).rev() {
            *st = acc;
            acc = acc.saturating_mul(s);
        }
        Layout {
            offset: 0,
            sizes: Dims::from_slice(sizes),
            strides,
            elem_size,
        }
    }

    /// Row-major contiguous from its offset: each dimension of more than
    /// one element has the stride a contiguous layout gives it. Walks the
    /// strides from the last dimension back without building them (every
    /// op's launch and run asks this).
    pub fn is_contiguous(&self) -> bool {
        let mut want = 1u64;
        for (&n, &s) in self.sizes.iter().zip(&self.strides).rev() {
            if n > 1 && s != want {
                return false;
            }
            want = want.saturating_mul(n);
        }
        true
    }

    /// A flat run of `bytes` bytes at offset 0.
    pub fn bytes(bytes: u64) -> Layout {
        Layout::contiguous(&[bytes], 1)
    }

    pub fn numel(&self) -> u64 {
        self.sizes.iter().product()
    }

    /// Bytes the elements amount to (as if contiguous).
    pub fn nbytes(&self) -> u64 {
        self.numel() * self.elem_size
    }

    /// The bytes the layout reaches: [first, end) relative to the buffer,
    /// or None when it has no element. Assumes a checked layout.
    pub fn byte_span(&self) -> Option<(u64, u64)> {
        if self.sizes.contains(&0) {
            return None;
        }
        let last: u64 = self
            .sizes
            .iter()
            .zip(&self.strides)
            .map(|(&n, &s)| (n - 1) * s)
            .sum();
        Some((self.offset, self.offset + (last + 1) * self.elem_size))
    }

    /// Check the layout is well formed and every byte it reaches lies in a
    /// buffer of `len` bytes. `what` names the side for the error.
    pub fn check_within(&self, len: u64, what: &str) -> Result<()> {
        if self.sizes.len() != self.strides.len() {
            return Err(Error::invalid(format!(
                "{what}: {} sizes but {} strides",
                self.sizes.len(),
                self.strides.len()
            )));
        }
        if self.elem_size == 0 || self.elem_size > 64 {
            return Err(Error::invalid(format!(
                "{what}: element size {} is not between 1 and 64 bytes",
                self.elem_size
            )));
        }
        if self.sizes.contains(&0) {
            return Ok(()); // no element is touched
        }
        let mut last = 0u64; // index of the furthest element, in elements
        for (&size, &stride) in self.sizes.iter().zip(&self.strides) {
            last = (size - 1)
                .checked_mul(stride)
                .and_then(|x| last.checked_add(x))
                .ok_or_else(|| Error::invalid(format!("{what}: sizes and strides overflow")))?;
        }
        let end = last
            .checked_add(1)
            .and_then(|n| n.checked_mul(self.elem_size))
            .and_then(|b| b.checked_add(self.offset))
            .ok_or_else(|| Error::invalid(format!("{what}: sizes and strides overflow")))?;
        if end > len {
            return Err(Error::invalid(format!(
                "{what}: layout (offset {}, sizes {:?}, strides {:?}, {} bytes each) reaches byte {end} of a {len}-byte buffer",
                self.offset, self.sizes, self.strides, self.elem_size
            )));
        }
        Ok(())
    }
}

/// Call `each(src_byte, dst_byte, bytes)` for runs that are contiguous in
/// both layouts, in row-major element order. The layouts must have the same
/// sizes and element size (checked).
pub fn for_each_run(
    src: &Layout,
    dst: &Layout,
    mut each: impl FnMut(u64, u64, u64) -> Result<()>,
) -> Result<()> {
    if src.sizes != dst.sizes || src.elem_size != dst.elem_size {
        return Err(Error::invalid(format!(
            "copy between layouts of different shapes: sizes {:?} x {} bytes into sizes {:?} x {} bytes",
            src.sizes, src.elem_size, dst.sizes, dst.elem_size
        )));
    }
    if src.numel() == 0 {
        return Ok(());
    }
    // Drop size-1 dimensions, then merge dimensions contiguous in both.
    let mut dims: Vec<(u64, u64, u64)> = src
        .sizes
        .iter()
        .zip(&src.strides)
        .zip(&dst.strides)
        .filter(|((&n, _), _)| n != 1)
        .map(|((&n, &a), &b)| (n, a, b))
        .collect();
    let mut merged: Vec<(u64, u64, u64)> = Vec::with_capacity(dims.len());
    for d in dims.drain(..) {
        if let Some(last) = merged.last_mut() {
            // `last` is outer, `d` inner: mergeable when outer stride = inner extent.
            if last.1 == d.0 * d.1 && last.2 == d.0 * d.2 {
                *last = (last.0 * d.0, d.1, d.2);
                continue;
            }
        }
        merged.push(d);
    }
    let e = src.elem_size;
    // Innermost run: contiguous in both when both inner strides are 1.
    let (run_elems, outer) = match merged.last() {
        Some(&(n, 1, 1)) => (n, &merged[..merged.len() - 1]),
        Some(_) => (1, &merged[..]),
        None => (1, &merged[..]),
    };
    let run_bytes = run_elems * e;
    let mut index = vec![0u64; outer.len()];
    loop {
        let (mut s, mut d) = (src.offset, dst.offset);
        for (i, &(_, a, b)) in index.iter().zip(outer) {
            s += i * a * e;
            d += i * b * e;
        }
        each(s, d, run_bytes)?;
        // Advance the odometer, innermost outer dimension first.
        let mut k = outer.len();
        loop {
            if k == 0 {
                return Ok(());
            }
            k -= 1;
            index[k] += 1;
            if index[k] < outer[k].0 {
                break;
            }
            index[k] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(src: &Layout, dst: &Layout) -> Vec<(u64, u64, u64)> {
        let mut v = Vec::new();
        for_each_run(src, dst, |s, d, n| {
            v.push((s, d, n));
            Ok(())
        })
        .unwrap();
        v
    }

    /// `is_contiguous` agrees with comparing against the strides
    /// `Layout::contiguous` builds, over sizes with ones and zeros.
    #[test]
    fn is_contiguous_matches_the_built_strides() {
        let built = |l: &Layout| {
            let c = Layout::contiguous(&l.sizes, l.elem_size);
            l.sizes
                .iter()
                .zip(l.strides.iter().zip(&c.strides))
                .all(|(&n, (&a, &b))| n <= 1 || a == b)
        };
        let sizes: [&[u64]; 6] = [&[], &[5], &[2, 3], &[2, 1, 3], &[4, 0, 3], &[1, 7, 1]];
        for sz in sizes {
            let c = Layout::contiguous(sz, 4);
            assert!(c.is_contiguous(), "{sz:?}");
            // Every single stride changed by one, and a transpose.
            for d in 0..sz.len() {
                let mut l = c.clone();
                l.strides[d] += 1;
                assert_eq!(l.is_contiguous(), built(&l), "{sz:?} stride {d} + 1");
            }
            if sz.len() >= 2 {
                let mut l = c.clone();
                l.sizes.swap(0, 1);
                l.strides.swap(0, 1);
                assert_eq!(l.is_contiguous(), built(&l), "{sz:?} transposed");
            }
        }
        let t = Layout {
            offset: 0,
            sizes: smallvec::smallvec![3, 2],
            strides: smallvec::smallvec![1, 3],
            elem_size: 4,
        };
        assert!(!t.is_contiguous());
    }

    #[test]
    fn contiguous_is_one_run() {
        let a = Layout::contiguous(&[4, 5, 6], 4);
        assert_eq!(runs(&a, &a), vec![(0, 0, 480)]);
    }

    #[test]
    fn transposed_destination_moves_single_elements() {
        let src = Layout::contiguous(&[2, 3], 4);
        let dst = Layout {
            offset: 8,
            sizes: smallvec::smallvec![2, 3],
            strides: smallvec::smallvec![1, 2],
            elem_size: 4,
        };
        let r = runs(&src, &dst);
        assert_eq!(r.len(), 6);
        assert_eq!(r[1], (4, 8 + 8, 4)); // element [0,1] -> dst index 2
        assert_eq!(r[3], (12, 8 + 4, 4)); // element [1,0] -> dst index 1
    }

    #[test]
    fn row_slices_keep_rows_whole() {
        // Columns 1..3 of a 4x4 matrix: rows of 2 elements, 4 apart.
        let src = Layout {
            offset: 4,
            sizes: smallvec::smallvec![4, 2],
            strides: smallvec::smallvec![4, 1],
            elem_size: 4,
        };
        let dst = Layout::contiguous(&[4, 2], 4);
        assert_eq!(
            runs(&src, &dst),
            vec![(4, 0, 8), (20, 8, 8), (36, 16, 8), (52, 24, 8)]
        );
    }

    #[test]
    fn bounds_and_shapes_are_checked() {
        let l = Layout::contiguous(&[4, 4], 4);
        assert!(l.check_within(64, "dst").is_ok());
        let e = l.check_within(63, "dst").unwrap_err().to_string();
        assert!(e.contains("reaches byte 64 of a 63-byte buffer"), "{e}");
        let bad = Layout {
            offset: 0,
            sizes: smallvec::smallvec![2],
            strides: smallvec::smallvec![u64::MAX],
            elem_size: 4,
        };
        assert!(bad
            .check_within(u64::MAX, "src")
            .unwrap_err()
            .to_string()
            .contains("overflow"));
        let empty = Layout::contiguous(&[0, 5], 4);
        assert!(empty.check_within(0, "src").is_ok());
        assert!(for_each_run(&l, &Layout::contiguous(&[16], 4), |_, _, _| Ok(())).is_err());
    }
}
