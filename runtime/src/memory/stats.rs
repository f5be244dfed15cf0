//! Pool statistics (rule 12 of the module comment).

/// One byte statistic: how much now, the most since the last peak reset,
/// and the totals ever added and removed (`current == allocated - freed`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stat {
    pub current: u64,
    pub peak: u64,
    pub allocated: u64,
    pub freed: u64,
}

impl Stat {
    pub(crate) fn add(&mut self, bytes: u64) {
        self.current += bytes;
        self.allocated += bytes;
        self.peak = self.peak.max(self.current);
    }

    pub(crate) fn sub(&mut self, bytes: u64) {
        self.current -= bytes;
        self.freed += bytes;
    }

    pub(crate) fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// A count that goes up and down, with its peak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Gauge {
    pub current: u64,
    pub peak: u64,
}

impl Gauge {
    pub(crate) fn increment(&mut self) {
        self.current += 1;
        self.peak = self.peak.max(self.current);
    }

    pub(crate) fn decrement(&mut self) {
        self.current -= 1;
    }
}

/// What one pool has done, named after `torch.cuda.memory_stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryStats {
    /// Rounded sizes of blocks held by callers.
    pub allocated_bytes: Stat,
    /// Sizes of segments held from the platform.
    pub reserved_bytes: Stat,
    /// Allocated blocks plus blocks freed but pending on other streams.
    pub active_bytes: Stat,
    /// Unrounded request sizes of active blocks.
    pub requested_bytes: Stat,
    /// Successful allocations.
    pub num_alloc: u64,
    /// Calls to free.
    pub num_free: u64,
    /// Failed allocations.
    pub num_ooms: u64,
    /// Allocations that released the cache and tried again.
    pub num_alloc_retries: u64,
    /// Segments held from the platform.
    pub num_segments: Gauge,
    /// Segments obtained from the platform, ever.
    pub num_segment_allocs: u64,
    /// Segments returned to the platform, ever.
    pub num_segment_frees: u64,
    /// Memory of the platform's own that holds this chip's data for a
    /// while, outside the pool: on the xla platform, what a PJRT plugin
    /// holds during an execution (inputs copied in where XLA cannot read
    /// the pool's bytes in place, results before they are copied out, the
    /// program's temporaries). Counted by [`HbmPool::hold_plugin_bytes`](super::HbmPool::hold_plugin_bytes).
    pub plugin_bytes: Stat,
}

impl MemoryStats {
    pub(crate) fn reset_peaks(&mut self) {
        self.allocated_bytes.reset_peak();
        self.reserved_bytes.reset_peak();
        self.active_bytes.reset_peak();
        self.requested_bytes.reset_peak();
        self.num_segments.peak = self.num_segments.current;
    }

    /// A block of `size` bytes for a request of `requested` bytes was handed
    /// out.
    #[inline]
    pub(crate) fn count_allocation(&mut self, size: u64, requested: u64) {
        self.num_alloc += 1;
        self.allocated_bytes.add(size);
        self.active_bytes.add(size);
        self.requested_bytes.add(requested);
    }

    /// Bytes reserved but not allocated: the cache (including pending blocks).
    pub fn cached_bytes(&self) -> u64 {
        self.reserved_bytes.current - self.allocated_bytes.current
    }
}
