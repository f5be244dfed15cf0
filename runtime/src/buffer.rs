//! Device buffers: a pool block that returns itself to its pool when the
//! last reference goes. Work queued on a stream holds a reference to the
//! buffers it touches, so dropping a buffer early never frees memory that
//! queued work will still read or write.

use std::sync::Arc;

use crate::memory::{Block, HbmPool};
use crate::platform::Segment;
use crate::stream::Stream;

#[derive(Clone)]
pub struct Buffer {
    inner: Arc<BufferInner>,
}

struct BufferInner {
    pool: Arc<HbmPool>,
    /// Taken in Drop to hand back to the pool.
    block: Option<Block>,
    len: u64,
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            self.pool.free(block);
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("chip", &self.chip())
            .field("len", &self.inner.len)
            .field("offset", &self.block().offset())
            .finish()
    }
}

impl Buffer {
    pub(crate) fn new(pool: Arc<HbmPool>, block: Block, len: u64) -> Buffer {
        Buffer {
            inner: Arc::new(BufferInner {
                pool,
                block: Some(block),
                len,
            }),
        }
    }

    fn block(&self) -> &Block {
        self.inner
            .block
            .as_ref()
            .expect("a live buffer holds its block")
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
    pub fn segment(&self) -> &Segment {
        self.block().segment()
    }
    /// Offset of this buffer's first byte inside its segment.
    pub fn segment_offset(&self) -> u64 {
        self.block().offset()
    }
    /// The buffer's device address (rule 15 of the memory module): unique
    /// among live buffers, ranges disjoint; a name, never a pointer.
    pub fn address(&self) -> u64 {
        self.block().address()
    }
    pub fn same_buffer(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// How many handles to this buffer exist (this one included): clones
    /// held by frontends, by queued work and by deferred ops.
    pub fn handle_count(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// Identity for maps (stable while the buffer lives).
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The buffer is also used by work on `stream`: when freed, its memory
    /// is reused only after that work finished (torch's `record_stream`).
    pub fn record_stream(&self, stream: &Stream) {
        self.inner.pool.record_stream(self.block(), stream.clock());
    }
}
