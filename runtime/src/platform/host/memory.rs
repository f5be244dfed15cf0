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
/// the OS, so reserving a large segment is cheap until it is written.
pub struct HostSegment {
    ptr: NonNull<u8>,
    len: usize,
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
        let layout = Layout::from_size_align(len, SEGMENT_ALIGN)
            .map_err(|_| Error::OutOfMemory(format!("{bytes} bytes do not fit in host memory")))?;
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            Error::OutOfMemory(format!(
                "the host could not provide a segment of {bytes} bytes"
            ))
        })?;
        Ok(HostSegment { ptr, len })
    }

    /// Base address, for kernels that work on raw memory.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
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
        let layout = Layout::from_size_align(self.len, SEGMENT_ALIGN)
            .expect("layout was valid at allocation");
        // SAFETY: ptr came from alloc_zeroed with this exact layout and is freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
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
