//! Device buffers: a pool block that returns itself to its pool when the
//! last *owner* goes.
//!
//! Owners are the handles frontends, deferred ops and the runtime's own
//! code hold. Work queued on a stream holds a *work reference* instead
//! ([`Buffer::for_work`]): it keeps the memory readable and writable by that
//! work, but not the block. When the last owner goes, the block goes back
//! to the pool at once, stream-ordered, as in PyTorch's CUDA caching
//! allocator: its own stream may reuse it at once (work there runs in
//! order after the queued work), and every other stream that queued work
//! on it was recorded on the block, so the pool keeps it from them until
//! that work is done (the memory module's rules 6 and 7). A frontend that
//! launches ahead of the device therefore reuses memory instead of growing
//! the pool by one block per queued op.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::memory::{Block, HbmPool};
use crate::platform::Segment;
use crate::stream::{Stream, StreamClock};

pub struct Buffer {
    inner: Arc<BufferInner>,
    /// Whether this handle counts in `owners` (false: a work reference).
    owner: bool,
}

struct BufferInner {
    pool: Arc<HbmPool>,
    /// The pool's block until the last owner goes.
    block: Mutex<Option<Block>>,
    owners: AtomicUsize,
    segment: Segment,
    offset: u64,
    address: u64,
    len: u64,
}

impl BufferInner {
    fn release(&self) {
        let block = self.block.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(block) = block {
            self.pool.free(block);
        }
    }
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        // Every handle is gone, work references included: no work will
        // read these values again.
        let me = self as *const BufferInner as usize;
        self.segment.forget(self.offset, self.len, me);
        self.release();
    }
}

impl Clone for Buffer {
    fn clone(&self) -> Self {
        if self.owner {
            self.inner.owners.fetch_add(1, Ordering::SeqCst);
        }
        Buffer {
            inner: Arc::clone(&self.inner),
            owner: self.owner,
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.owner && self.inner.owners.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.inner.release();
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("chip", &self.chip())
            .field("len", &self.inner.len)
            .field("offset", &self.inner.offset)
            .field("owner", &self.owner)
            .finish()
    }
}

impl Buffer {
    pub(crate) fn new(pool: Arc<HbmPool>, block: Block, len: u64) -> Buffer {
        Buffer {
            inner: Arc::new(BufferInner {
                pool,
                segment: Arc::clone(block.segment()),
                offset: block.offset(),
                address: block.address(),
                block: Mutex::new(Some(block)),
                owners: AtomicUsize::new(1),
                len,
            }),
            owner: true,
        }
    }

    /// A work reference for work queued on `stream` (see the module
    /// comment): it does not keep the block from the pool once the owners
    /// are gone. A stream other than the block's own is recorded on the
    /// block, so the pool hands the memory to no other stream before the
    /// work queued there by the last owner's free has finished.
    pub fn for_work(&self, stream: &Arc<StreamClock>) -> Buffer {
        if let Some(block) = self
            .inner
            .block
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            self.inner.pool.record_stream(block, stream);
        }
        Buffer {
            inner: Arc::clone(&self.inner),
            owner: false,
        }
    }

    /// Bytes asked for (the block may be larger).
    pub fn len(&self) -> u64 {
        self.inner.len
    }
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }
    pub fn chip(&self) -> usize {
        self.inner.pool.chip()
    }
    /// The pool of the buffer's chip.
    pub fn pool(&self) -> &HbmPool {
        &self.inner.pool
    }
    /// The pool, held weakly (what outlives the buffer but must not keep
    /// its pool alive).
    // Used by the xla platform only.
    #[cfg_attr(not(feature = "xla"), allow(dead_code))]
    pub(crate) fn pool_weak(&self) -> std::sync::Weak<HbmPool> {
        Arc::downgrade(&self.inner.pool)
    }
    pub fn segment(&self) -> &Segment {
        &self.inner.segment
    }
    /// Offset of this buffer's first byte inside its segment.
    pub fn segment_offset(&self) -> u64 {
        self.inner.offset
    }
    /// The buffer's device address (rule 15 of the memory module): unique
    /// among buffers that have owners, ranges disjoint (a work reference
    /// may share its address with a newer buffer that took over its memory
    /// in stream order); a name, never a pointer.
    pub fn address(&self) -> u64 {
        self.inner.address
    }
    /// Tells this buffer (its owners and work references) from every other
    /// buffer alive: what [`crate::platform::DeviceMemory::forget`] names.
    // Used by the xla platform only.
    #[cfg_attr(not(feature = "xla"), allow(dead_code))]
    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }
    pub fn same_buffer(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// How many handles to this buffer exist (this one included): clones
    /// held by frontends, by queued work and by deferred ops.
    pub fn handle_count(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// How many owners the buffer has (see the module comment): the
    /// handles of `handle_count` less the work references of queued work.
    /// Unlike that count, it does not depend on how far the device lags.
    pub fn owner_count(&self) -> usize {
        self.inner.owners.load(Ordering::SeqCst)
    }

    /// Identity for maps (stable while the buffer lives).
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The buffer is also used by work on `stream`: when freed, its memory
    /// is reused only after that work finished (torch's `record_stream`).
    pub fn record_stream(&self, stream: &Stream) {
        let block = self.inner.block.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(block) = block.as_ref() {
            self.inner.pool.record_stream(block, stream.clock());
        }
    }
}
