//! Pool segments of a plugin with memory of its own (a GPU, a TPU, or the
//! CPU plugin under `TPURT_XLA_ZERO_COPY=0`), where XLA cannot read or
//! write the pool's bytes in place.
//!
//! The pool's bytes are host memory. A tensor an execution writes stays in
//! the plugin's result buffer ("resident"), and the next execution that
//! reads the same bytes as the same array takes that buffer as its
//! argument: a chain of ops moves nothing between host and device. The
//! pool's bytes are brought up to date only when something else reads them
//! (a host read, a copy, a strided view, the same bytes as another shape):
//! every [`DeviceMemory`] access goes through [`DeviceSegment`], which
//! copies resident values back first and drops those a write replaces.
//! An input copied to the plugin is kept the same way, so a weight crosses
//! once. Ranges never overlap; the plugin's buffers count in the pool's
//! `plugin_bytes` while they live.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use smallvec::SmallVec;

use super::{sys, XlaPlatform};
use crate::error::{Error, Result};
use crate::ir::DType;
use crate::memory::HbmPool;
use crate::platform::host::HostSegment;
use crate::platform::DeviceMemory;

/// A buffer of the plugin's holding a tensor's value; destroyed when the
/// last holder (the segment's map, an execution using it) lets go.
pub(super) struct ResidentBuffer {
    platform: Arc<XlaPlatform>,
    buffer: *mut sys::PJRT_Buffer,
    bytes: u64,
    pool: Weak<HbmPool>,
}

// SAFETY: a PJRT buffer may be used and destroyed from any thread (the
// PJRT C API's contract); it is destroyed once, by `Drop`, or handed over
// whole by `release`.
unsafe impl Send for ResidentBuffer {}
// SAFETY: as above; holders only read the pointer.
unsafe impl Sync for ResidentBuffer {}

impl ResidentBuffer {
    /// Take ownership of `buffer` (`bytes` on the device), counted in
    /// `pool`'s `plugin_bytes` while it lives.
    pub(super) fn new(
        platform: &Arc<XlaPlatform>,
        buffer: *mut sys::PJRT_Buffer,
        bytes: u64,
        pool: Weak<HbmPool>,
    ) -> ResidentBuffer {
        if let Some(p) = pool.upgrade() {
            p.count_plugin_bytes(bytes, true);
        }
        ResidentBuffer {
            platform: Arc::clone(platform),
            buffer,
            bytes,
            pool,
        }
    }

    pub(super) fn buffer(&self) -> *mut sys::PJRT_Buffer {
        self.buffer
    }

    /// Hand the PJRT buffer over (to be donated to an execution, which
    /// destroys it); it no longer counts here.
    fn release(mut self) -> *mut sys::PJRT_Buffer {
        self.uncount();
        std::mem::replace(&mut self.buffer, std::ptr::null_mut())
    }

    fn uncount(&mut self) {
        if let Some(p) = self.pool.upgrade() {
            p.count_plugin_bytes(std::mem::take(&mut self.bytes), false);
        }
    }
}

impl Drop for ResidentBuffer {
    fn drop(&mut self) {
        self.uncount();
        self.platform.destroy_buffer(self.buffer);
    }
}

/// A value held in a plugin buffer: bytes `[start, end)` of the segment
/// as an array of `dtype` and `dims`, dense.
struct Resident {
    end: u64,
    /// The buffer whose value this is (`Buffer::identity`).
    owner: usize,
    dtype: DType,
    dims: SmallVec<[i64; 6]>,
    buffer: Arc<ResidentBuffer>,
    /// The buffer holds a newer value than the pool's bytes.
    newer: bool,
}

impl Resident {
    /// Whether this value, which starts at `offset`, covers exactly the
    /// `len` bytes from there as `dtype` (whatever its dims).
    fn spans(&self, offset: u64, len: u64, dtype: DType) -> bool {
        self.end == offset + len && self.dtype == dtype
    }

    /// Whether this value, which starts at `a.offset`, is `a`.
    fn is(&self, a: &Array) -> bool {
        self.spans(a.offset, a.len, a.dtype) && self.dims == a.dims
    }
}

/// What an execution's argument is: which bytes, as which array.
pub(super) struct Array {
    /// The tensor's buffer (`Buffer::identity`).
    pub owner: usize,
    pub offset: u64,
    pub len: u64,
    pub dtype: DType,
    pub dims: SmallVec<[i64; 6]>,
}

/// A pool segment whose values may live in the plugin's buffers (see the
/// module comment).
pub(super) struct DeviceSegment {
    host: HostSegment,
    platform: Weak<XlaPlatform>,
    /// By first byte; ranges never overlap.
    resident: Mutex<BTreeMap<u64, Resident>>,
}

impl std::fmt::Debug for DeviceSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceSegment({:?}, {} resident)",
            self.host,
            self.lock().len()
        )
    }
}

impl DeviceSegment {
    pub(super) fn allocate(platform: Weak<XlaPlatform>, bytes: u64) -> Result<DeviceSegment> {
        Ok(DeviceSegment {
            host: HostSegment::allocate(bytes)?,
            platform,
            resident: Mutex::new(BTreeMap::new()),
        })
    }

    /// The host bytes. Read or write them only after [`Self::sync_host`]
    /// or [`Self::discard`] over the range.
    pub(super) fn host(&self) -> &HostSegment {
        &self.host
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Resident>> {
        self.resident.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The first bytes of the entries overlapping `[start, end)`.
    fn overlapping(map: &BTreeMap<u64, Resident>, start: u64, end: u64) -> SmallVec<[u64; 4]> {
        // Disjoint ranges sorted by start have sorted ends too.
        map.range(..end)
            .rev()
            .take_while(|(_, r)| r.end > start)
            .map(|(&s, _)| s)
            .collect()
    }

    /// Copy the value of the entry at `start` back into the pool's bytes.
    fn copy_back(&self, start: u64, r: &mut Resident) -> Result<()> {
        if !r.newer {
            return Ok(());
        }
        let platform = self
            .platform
            .upgrade()
            .ok_or_else(|| Error::Internal("the xla platform is being dropped".into()))?;
        let len = r.end - start;
        self.host.check_range("resident copy back", start, len)?;
        // SAFETY: [start, start+len) lies inside the host allocation
        // (checked above); the buffer is alive (held by the entry) and
        // defined (its execution was awaited before it was stored); the
        // pool's bytes there are this value's and no one else writes them
        // meanwhile (the stream contract).
        unsafe {
            platform.to_host(
                r.buffer.buffer(),
                self.host.as_ptr().add(start as usize),
                len as usize,
                "resident copy back",
            )
        }?;
        platform
            .transfers
            .copies_back
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        r.newer = false;
        Ok(())
    }

    /// Bring the pool's bytes in `[offset, offset+len)` up to date: a
    /// resident value newer than them is copied back (and stays resident).
    pub(super) fn sync_host(&self, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let mut map = self.lock();
        for s in Self::overlapping(&map, offset, offset + len) {
            if let Some(r) = map.get_mut(&s) {
                self.copy_back(s, r)?;
            }
        }
        Ok(())
    }

    /// Forget the resident values in `[offset, offset+len)`, which are
    /// about to be overwritten: one reaching outside the range is copied
    /// back first (its bytes outside stay its own).
    pub(super) fn discard(&self, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let end = offset + len;
        let mut map = self.lock();
        for s in Self::overlapping(&map, offset, end) {
            if let Some(mut r) = map.remove(&s) {
                if s < offset || r.end > end {
                    if let Err(e) = self.copy_back(s, &mut r) {
                        map.insert(s, r);
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    /// The buffer holding exactly `a`, if any.
    pub(super) fn find(&self, a: &Array) -> Option<Arc<ResidentBuffer>> {
        let map = self.lock();
        let r = map.get(&a.offset)?;
        r.is(a).then(|| Arc::clone(&r.buffer))
    }

    /// The buffer and dims of the value of `dtype` over exactly the bytes
    /// `[offset, offset+len)`, whatever its shape.
    pub(super) fn find_span(
        &self,
        offset: u64,
        len: u64,
        dtype: DType,
    ) -> Option<(Arc<ResidentBuffer>, SmallVec<[i64; 6]>)> {
        let map = self.lock();
        let r = map.get(&offset)?;
        r.spans(offset, len, dtype)
            .then(|| (Arc::clone(&r.buffer), r.dims.clone()))
    }

    /// The buffer holding exactly `a`, taken out to be donated to an
    /// execution that overwrites `a` with its output: None where there is
    /// none or someone else holds it. `keep_host` copies the value back
    /// first (an execution that may fail with nothing written).
    pub(super) fn take(&self, a: &Array, keep_host: bool) -> Result<Option<*mut sys::PJRT_Buffer>> {
        let mut map = self.lock();
        let exact = map
            .get(&a.offset)
            .is_some_and(|r| r.is(a) && Arc::strong_count(&r.buffer) == 1);
        if !exact {
            return Ok(None);
        }
        if keep_host {
            if let Some(r) = map.get_mut(&a.offset) {
                self.copy_back(a.offset, r)?;
            }
        }
        let Some(r) = map.remove(&a.offset) else {
            return Ok(None);
        };
        // Unique: checked under the lock, and only the map hands out clones.
        Ok(Arc::try_unwrap(r.buffer).ok().map(ResidentBuffer::release))
    }

    /// Store `buffer` as the value of `a`: newer than the pool's bytes
    /// (`newer`, an execution's output) or equal to them (an input copied
    /// from them). Values it overlaps are discarded first.
    pub(super) fn store(&self, a: &Array, buffer: Arc<ResidentBuffer>, newer: bool) -> Result<()> {
        if a.len == 0 {
            return Ok(());
        }
        self.host.check_range("resident value", a.offset, a.len)?;
        self.discard(a.offset, a.len)?;
        let mut map = self.lock();
        // Another thread may have stored over the range meanwhile: the
        // later store wins.
        for s in Self::overlapping(&map, a.offset, a.offset + a.len) {
            map.remove(&s);
        }
        map.insert(
            a.offset,
            Resident {
                end: a.offset + a.len,
                owner: a.owner,
                dtype: a.dtype,
                dims: a.dims.clone(),
                buffer,
                newer,
            },
        );
        Ok(())
    }

    /// How many values are resident, and how many of them are newer than
    /// the pool's bytes.
    #[cfg(test)]
    pub(super) fn resident_counts(&self) -> (usize, usize) {
        let map = self.lock();
        (map.len(), map.values().filter(|r| r.newer).count())
    }
}

impl DeviceMemory for DeviceSegment {
    fn len(&self) -> u64 {
        self.host.len()
    }

    fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        self.discard(offset, src.len() as u64)?;
        self.host.write(offset, src)
    }

    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.sync_host(offset, dst.len() as u64)?;
        self.host.read(offset, dst)
    }

    fn copy_to(
        &self,
        offset: u64,
        dst: &dyn DeviceMemory,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let dst = dst
            .as_any()
            .downcast_ref::<DeviceSegment>()
            .ok_or_else(|| {
                Error::invalid("device-to-device copy between segments of different platforms")
            })?;
        self.sync_host(offset, len)?;
        dst.discard(dst_offset, len)?;
        self.host.copy_to(offset, &dst.host, dst_offset, len)
    }

    fn fill(&self, offset: u64, len: u64, value: u8) -> Result<()> {
        self.discard(offset, len)?;
        self.host.fill(offset, len, value)
    }

    fn forget(&self, offset: u64, len: u64, owner: usize) {
        // Another buffer may have taken these bytes over already (stream
        // order lets its work run first): its values stay.
        let mut map = self.lock();
        for s in Self::overlapping(&map, offset, offset + len) {
            if map.get(&s).is_some_and(|r| r.owner == owner) {
                map.remove(&s);
            }
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
