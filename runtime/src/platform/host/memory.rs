//! Host memory that stands in for HBM. This is the one place where the host
//! platform touches raw memory; every access is bounds-checked first.

use std::alloc::{self, Layout};
use std::any::Any;
use std::ptr::NonNull;

use crate::error::{Error, Result};
use crate::platform::DeviceMemory;

/// Alignment of every segment: a page, which also satisfies XLA's 64-byte
/// rule for zero-copy views.
pub const SEGMENT_ALIGN: usize = 4096;

/// A zero-filled, page-aligned host allocation. Pages are backed lazily by
/// the OS, so reserving a large segment is cheap until it is written: it
/// is a `calloc` of a page more than asked (the allocator maps large
/// requests fresh from the OS, already zero, and clears nothing), aligned
/// inside. (`alloc_zeroed` with page alignment would write zeros over
/// every page at once: the standard library clears aligned allocations
/// itself.)
pub struct HostSegment {
    /// The aligned start, inside `base`'s allocation.
    ptr: NonNull<u8>,
    len: usize,
    /// What the allocator returned, freed with `base_layout(len)`.
    base: NonNull<u8>,
}

/// The layout of a segment's allocation: `len` plus a page to align in,
/// at the allocator's own alignment (so `alloc_zeroed` is a `calloc`).
fn base_layout(len: usize) -> Option<Layout> {
    Layout::from_size_align(len.checked_add(SEGMENT_ALIGN)?, 16).ok()
}

// SAFETY: HostSegment owns its allocation outright; all access goes through
// bounds-checked methods that copy bytes. Ordering between concurrent users
// is the stream contract (as for device memory), and no Rust reference to
// the memory outlives a method call.
unsafe impl Send for HostSegment {}
// SAFETY: as above; methods take &self and only copy bytes in or out.
unsafe impl Sync for HostSegment {}

impl std::fmt::Debug for HostSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostSegment({:p}, {} bytes)", self.ptr, self.len)
    }
}

impl HostSegment {
    pub fn allocate(bytes: u64) -> Result<Self> {
        let len = usize::try_from(bytes.max(1))
            .map_err(|_| Error::OutOfMemory(format!("{bytes} bytes do not fit in host memory")))?;
        let layout = base_layout(len).ok_or_else(|| {
            Error::OutOfMemory(format!("{bytes} bytes do not fit in host memory"))
        })?;
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let base = NonNull::new(raw).ok_or_else(|| {
            Error::OutOfMemory(format!(
                "the host could not provide a segment of {bytes} bytes"
            ))
        })?;
        // SAFETY: the allocation holds len + SEGMENT_ALIGN bytes, and the
        // offset to the next page boundary is below SEGMENT_ALIGN.
        let ptr = unsafe { raw.add(raw.align_offset(SEGMENT_ALIGN)) };
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::Internal("a null segment".into()))?;
        Ok(HostSegment { ptr, len, base })
    }

    /// Base address, for kernels that work on raw memory.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// An error naming `what` unless `[offset, offset+len)` lies inside.
    // Used by the xla platform only.
    #[cfg_attr(not(feature = "xla"), allow(dead_code))]
    pub(crate) fn check_range(&self, what: &str, offset: u64, len: u64) -> Result<()> {
        self.check(what, offset, len).map(|_| ())
    }

    fn check(&self, what: &str, offset: u64, len: u64) -> Result<usize> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len as u64 => Ok(offset as usize),
            _ => Err(Error::invalid(format!(
                "{what} of {len} bytes at offset {offset} is outside a segment of {} bytes",
                self.len
            ))),
        }
    }
}

impl Drop for HostSegment {
    fn drop(&mut self) {
        let layout = base_layout(self.len).expect("layout was valid at allocation");
        // SAFETY: base came from alloc_zeroed with this exact layout and is
        // freed once.
        unsafe { alloc::dealloc(self.base.as_ptr(), layout) }
    }
}

impl DeviceMemory for HostSegment {
    fn len(&self) -> u64 {
        self.len as u64
    }

    fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        let at = self.check("write", offset, src.len() as u64)?;
        // SAFETY: [at, at+len) is inside the allocation (checked above); src is
        // a distinct Rust slice, so the ranges cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(at), src.len())
        };
        Ok(())
    }

    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let at = self.check("read", offset, dst.len() as u64)?;
        // SAFETY: [at, at+len) is inside the allocation (checked above); dst is
        // an exclusive Rust slice, so the ranges cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(at), dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }

    fn copy_to(
        &self,
        offset: u64,
        dst: &dyn DeviceMemory,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let dst = dst.as_any().downcast_ref::<HostSegment>().ok_or_else(|| {
            Error::invalid("device-to-device copy between segments of different platforms")
        })?;
        let from = self.check("copy source", offset, len)?;
        let to = dst.check("copy destination", dst_offset, len)?;
        // SAFETY: both ranges are inside their allocations (checked above);
        // `copy` allows them to overlap when both are the same segment.
        unsafe {
            std::ptr::copy(
                self.ptr.as_ptr().add(from),
                dst.ptr.as_ptr().add(to),
                len as usize,
            )
        };
        Ok(())
    }

    fn fill(&self, offset: u64, len: u64, value: u8) -> Result<()> {
        let at = self.check("fill", offset, len)?;
        // SAFETY: [at, at+len) is inside the allocation (checked above).
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(at), value, len as usize) };
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident memory of this process, from /proc (Linux).
    #[cfg(target_os = "linux")]
    fn resident_bytes() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4096
    }

    /// A segment is page-aligned and zero, and its pages are backed only
    /// when written: a 2 GiB segment costs no resident memory until used
    /// (the page-aligned `alloc_zeroed` it was before wrote all 2 GiB).
    #[cfg(target_os = "linux")]
    #[test]
    fn segments_are_aligned_zero_and_backed_lazily() {
        let before = resident_bytes();
        let seg = HostSegment::allocate(2 << 30).unwrap();
        let grown = resident_bytes().saturating_sub(before);
        assert!(
            grown < 256 << 20,
            "a fresh 2 GiB segment took {grown} resident bytes"
        );
        assert_eq!(seg.as_ptr() as usize % SEGMENT_ALIGN, 0);
        for at in [0u64, 4095, 1 << 20, (2 << 30) - 8] {
            let mut b = [1u8; 8];
            seg.read(at.min((2 << 30) - 8), &mut b).unwrap();
            assert_eq!(b, [0; 8]);
        }
        seg.write(1 << 30, &[7; 4]).unwrap();
        let mut b = [0u8; 4];
        seg.read(1 << 30, &mut b).unwrap();
        assert_eq!(b, [7; 4]);
    }
}
