//! [`HbmPool`] and [`Block`]: the rules of the module comment, in code.
//!
//! Layout: blocks live in an arena (`nodes`, indexed by slot) and are linked
//! to their neighbours in address order; each pool kind has an ordered set of
//! its free blocks keyed by (size, slot), so best fit is one range lookup,
//! and a short quick list of parked blocks (rule 9), scanned newest first.
//!
//! The hot path is a free followed by an allocation of the same size on the
//! same stream: the block is parked and taken back without touching the free
//! sets, and the handles it owns (the stream's clock, the segment) move
//! between its states instead of being cloned, so a cycle costs the two lock
//! round trips and little else.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::snapshot::{BlockSnapshot, BlockState, PoolSnapshot, SegmentSnapshot};
use super::stats::{MemoryStats, Stat};
use super::{
    format_bytes, is_aligned, min_segment_size_for, pool_for, round_size, segment_size_for, splits,
    PoolKind, MIN_BLOCK_SIZE, QUICK_LIST_LEN, SEGMENT_GRANULE, SMALL_SEGMENT_SIZE,
};
use crate::error::{Error, Result};
use crate::platform::{Platform, Segment};
use crate::stream::{Fence, StreamClock, StreamId};

static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

/// Rule 15: device addresses. Every segment of every pool takes a fresh
/// range of a process-wide address space, never handed out again, with a
/// gap after it, so block addresses are unique and their ranges disjoint
/// (frontends compare them for aliasing). They are names, never pointers:
/// nothing dereferences them. The space starts high (1 TiB) and is 2^63
/// bytes wide, which no process exhausts.
static NEXT_ADDRESS: AtomicU64 = AtomicU64::new(1 << 40);

/// Alignment of segment addresses and the gap after each segment.
const ADDRESS_ALIGN: u64 = 2 << 20;

fn reserve_addresses(size: u64) -> u64 {
    let span = size.div_ceil(ADDRESS_ALIGN).saturating_add(1) * ADDRESS_ALIGN;
    NEXT_ADDRESS.fetch_add(span, Ordering::Relaxed)
}

/// Platform memory counted in a pool's `plugin_bytes` while it lives
/// ([`HbmPool::hold_plugin_bytes`]).
#[must_use = "the bytes are counted only while the guard lives"]
pub struct PluginBytes<'a> {
    pool: &'a HbmPool,
    bytes: u64,
}

impl PluginBytes<'_> {
    /// Stop counting `bytes` of these (at most all of them): memory the
    /// guard held that is now counted elsewhere or gone.
    // Used by the xla platform only.
    #[cfg_attr(not(feature = "xla"), allow(dead_code))]
    pub(crate) fn shrink(&mut self, bytes: u64) {
        let bytes = bytes.min(self.bytes);
        if bytes > 0 {
            self.pool.plugin_stat().sub(bytes);
            self.bytes -= bytes;
        }
    }
}

impl Drop for PluginBytes<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.pool.plugin_stat().sub(self.bytes);
        }
    }
}

/// A per-chip caching sub-allocator; see the module comment for its rules.
pub struct HbmPool {
    /// Tells this pool's blocks from another pool's.
    id: u64,
    chip: usize,
    capacity: u64,
    platform: Arc<dyn Platform>,
    state: Mutex<PoolState>,
    /// Rule 12's `plugin_bytes`, under a lock of its own: counted by a
    /// stream's worker around each execution, which need not wait for
    /// allocations.
    plugin_bytes: Mutex<Stat>,
}

impl std::fmt::Debug for HbmPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HbmPool")
            .field("chip", &self.chip)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// A live allocation. A plain value: the caller returns it with
/// [`HbmPool::free`]; it is neither `Clone` nor `Copy` (rule 14).
pub struct Block {
    pool: u64,
    slot: usize,
    id: u64,
    segment: Segment,
    offset: u64,
    /// The segment's device address plus `offset`.
    address: u64,
    size: u64,
    requested: u64,
    stream: StreamId,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the segment itself: its Debug may print its contents.
        f.debug_struct("Block")
            .field("id", &self.id)
            .field("segment_len", &self.segment.len())
            .field("offset", &self.offset)
            .field("size", &self.size)
            .field("requested", &self.requested)
            .field("stream", &self.stream)
            .finish()
    }
}

impl Block {
    /// Unique among the blocks one pool ever handed out.
    pub fn id(&self) -> u64 {
        self.id
    }
    pub fn segment(&self) -> &Segment {
        &self.segment
    }
    /// Offset of the first byte inside the segment.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// The block's device address (rule 15): unique among the live blocks
    /// of every pool of the process, with ranges that never overlap.
    pub fn address(&self) -> u64 {
        self.address
    }
    /// Rounded size (rules 1 and 5): at least `requested`.
    pub fn size(&self) -> u64 {
        self.size
    }
    /// Bytes asked for.
    pub fn requested(&self) -> u64 {
        self.requested
    }
    /// The stream the block was allocated for.
    pub fn stream(&self) -> StreamId {
        self.stream
    }
}

impl HbmPool {
    pub fn new(chip: usize, capacity: u64, platform: Arc<dyn Platform>) -> Self {
        HbmPool {
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            chip,
            capacity,
            platform,
            state: Mutex::new(PoolState::default()),
            plugin_bytes: Mutex::new(Stat::default()),
        }
    }

    pub fn chip(&self) -> usize {
        self.chip
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// A block of at least `bytes` (rounded up, rule 1) for use on `stream`.
    /// Fails with [`Error::OutOfMemory`] as rule 10 says; never panics.
    pub fn allocate(&self, bytes: u64, stream: &Arc<StreamClock>) -> Result<Block> {
        let mut guard = self.lock();
        let state = &mut *guard;
        state.process_pending();

        let Some((rounded, min_segment)) =
            round_size(bytes).and_then(|r| Some((r, min_segment_size_for(r)?)))
        else {
            return Err(self.out_of_memory(
                state,
                bytes,
                "; the request is larger than the capacity",
            ));
        };
        if min_segment > self.capacity {
            let detail = format!(
                "; the request needs a segment of {}, more than the capacity",
                format_bytes(min_segment)
            );
            return Err(self.out_of_memory(state, bytes, &detail));
        }

        if let Some(block) = state.take_quick(self.id, rounded, bytes, stream) {
            return Ok(block);
        }
        if let Some(slot) = state.find_free(rounded, stream.id()) {
            return Ok(state.take_free(self.id, slot, rounded, bytes, stream));
        }
        // Rules 4 and 9: merge the parked blocks before growing.
        if state.flush_quick(pool_for(rounded)) {
            if let Some(slot) = state.find_free(rounded, stream.id()) {
                return Ok(state.take_free(self.id, slot, rounded, bytes, stream));
            }
        }
        if let Ok(slot) = self.new_segment(state, rounded, stream) {
            return Ok(state.take(self.id, slot, rounded, bytes, stream));
        }

        // Rule 10: release the cache and try once more.
        state.stats.num_alloc_retries += 1;
        state.release_cached();
        if let Some(slot) = state.find_free(rounded, stream.id()) {
            return Ok(state.take_free(self.id, slot, rounded, bytes, stream));
        }
        match self.new_segment(state, rounded, stream) {
            Ok(slot) => Ok(state.take(self.id, slot, rounded, bytes, stream)),
            Err(detail) => Err(self.out_of_memory(state, bytes, &detail)),
        }
    }

    /// Return a block (rules 6, 7 and 9). A block of another pool is ignored;
    /// use [`HbmPool::try_free`] to learn about that.
    pub fn free(&self, block: Block) {
        let _ = self.try_free(block);
    }

    /// As [`HbmPool::free`], but a block this pool did not hand out is an
    /// [`Error::InvalidArgument`] (the block is dropped; its memory stays
    /// allocated in the pool that made it).
    pub fn try_free(&self, block: Block) -> Result<()> {
        self.check_owner(&block)?;
        let mut guard = self.lock();
        let state = &mut *guard;
        let slot = state.allocated_slot(&block)?;
        let taken = std::mem::replace(&mut state.nodes[slot].state, NodeState::Vacant);
        let NodeState::Allocated {
            requested,
            clock,
            recorded,
            ..
        } = taken
        else {
            // allocated_slot checked the state; put it back unchanged.
            state.nodes[slot].state = taken;
            return Err(Error::Internal("block state changed under the lock".into()));
        };
        state.stats.num_free += 1;
        state.stats.allocated_bytes.sub(block.size);
        let fence = BlockFence::now(clock);
        if recorded.is_empty() {
            state.park(slot, fence, requested, block.segment);
            return Ok(());
        }
        let waits: Vec<Fence> = recorded.iter().map(|c| c.fence()).collect();
        if waits.iter().all(Fence::is_complete) {
            state.park(slot, fence, requested, block.segment);
        } else {
            state.nodes[slot].state = NodeState::PendingFree {
                requested,
                fence,
                waits,
            };
            state.pending.push(slot);
        }
        Ok(())
    }

    /// The block is also used by work on `stream` (torch's
    /// `Tensor.record_stream`): when freed, it is reused only after the work
    /// submitted to `stream` by then has finished (rule 7). Naming the block's
    /// own stream, or a stream twice, changes nothing. A block of another
    /// pool is ignored.
    pub fn record_stream(&self, block: &Block, stream: &Arc<StreamClock>) {
        let _ = self.try_record_stream(block, stream);
    }

    /// As [`HbmPool::record_stream`], but a foreign block is an error.
    pub fn try_record_stream(&self, block: &Block, stream: &Arc<StreamClock>) -> Result<()> {
        self.check_owner(block)?;
        if stream.id() == block.stream {
            return Ok(());
        }
        let mut state = self.lock();
        let slot = state.allocated_slot(block)?;
        if let NodeState::Allocated { recorded, .. } = &mut state.nodes[slot].state {
            if !recorded.iter().any(|c| c.id() == stream.id()) {
                recorded.push(Arc::clone(stream));
            }
        }
        Ok(())
    }

    /// Release every cached segment that is wholly free and settled
    /// (rule 11). Returns the bytes released.
    pub fn empty_cache(&self) -> u64 {
        self.lock().release_cached()
    }

    pub fn stats(&self) -> MemoryStats {
        let mut state = self.lock();
        state.process_pending();
        let mut stats = state.stats;
        drop(state);
        stats.plugin_bytes = *self.plugin_stat();
        stats
    }

    fn plugin_stat(&self) -> MutexGuard<'_, Stat> {
        self.plugin_bytes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count `bytes` of the platform's own memory that holds this chip's
    /// data (rule 12's `plugin_bytes`) until the returned guard drops.
    pub fn hold_plugin_bytes(&self, bytes: u64) -> PluginBytes<'_> {
        if bytes > 0 {
            self.plugin_stat().add(bytes);
        }
        PluginBytes { pool: self, bytes }
    }

    /// Count `bytes` of the platform's own memory in `plugin_bytes` (`held`)
    /// or stop counting them, for memory whose life is not one scope (the
    /// xla platform's resident buffers, see `platform::xla::resident`).
    // Used by the xla platform only.
    #[cfg_attr(not(feature = "xla"), allow(dead_code))]
    pub(crate) fn count_plugin_bytes(&self, bytes: u64, held: bool) {
        if bytes > 0 {
            let mut stat = self.plugin_stat();
            if held {
                stat.add(bytes)
            } else {
                stat.sub(bytes)
            }
        }
    }

    /// Set every peak to its current value.
    pub fn reset_peak_stats(&self) {
        self.lock().stats.reset_peaks();
        self.plugin_stat().reset_peak();
    }

    /// Rule 13; flushes the quick lists first.
    pub fn snapshot(&self) -> PoolSnapshot {
        let mut state = self.lock();
        state.process_pending();
        state.flush_quick(PoolKind::Small);
        state.flush_quick(PoolKind::Large);
        let mut segments: Vec<SegmentSnapshot> = state
            .segments
            .iter()
            .flatten()
            .map(|record| {
                let blocks: Vec<BlockSnapshot> = state
                    .segment_blocks(record)
                    .map(|slot| state.nodes[slot].describe())
                    .collect();
                let allocated_bytes = blocks
                    .iter()
                    .filter(|b| b.state == BlockState::ActiveAllocated)
                    .map(|b| b.size)
                    .sum();
                SegmentSnapshot {
                    segment_id: record.id,
                    size: record.size,
                    allocated_bytes,
                    pool: record.pool,
                    blocks,
                }
            })
            .collect();
        segments.sort_by_key(|s| s.segment_id);
        PoolSnapshot {
            chip: self.chip,
            capacity: self.capacity,
            reserved_bytes: state.stats.reserved_bytes.current,
            allocated_bytes: state.stats.allocated_bytes.current,
            segments,
        }
    }

    /// Check the invariants I1-I6 of the module comment. Never panics.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.lock().check(self.capacity)?;
        let p = *self.plugin_stat();
        if p.peak < p.current || p.allocated.checked_sub(p.freed) != Some(p.current) {
            return Err(format!("I6: plugin_bytes is inconsistent: {p:?}"));
        }
        Ok(())
    }

    /// The quick lists, oldest first: (pool, stream, rounded request).
    #[cfg(test)]
    pub(super) fn quick_blocks(&self) -> Vec<(PoolKind, StreamId, u64)> {
        let state = self.lock();
        [PoolKind::Small, PoolKind::Large]
            .into_iter()
            .flat_map(|pool| {
                state.quick[pool as usize]
                    .iter()
                    .map(move |e| (pool, e.stream, e.rounded))
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // Nothing panics while holding the lock; if something did, the state
        // is still consistent enough to keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check_owner(&self, block: &Block) -> Result<()> {
        if block.pool == self.id {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "block {} was not allocated by the pool of chip {}",
                block.id, self.chip
            )))
        }
    }

    /// Rules 3 and 10: a new segment for `rounded`, as one free block on
    /// `stream` that is not in the free set: the caller takes it at once. On
    /// failure, the reason as a message suffix.
    fn new_segment(
        &self,
        state: &mut PoolState,
        rounded: u64,
        stream: &Arc<StreamClock>,
    ) -> std::result::Result<usize, String> {
        let room = self
            .capacity
            .saturating_sub(state.stats.reserved_bytes.current);
        let preferred = segment_size_for(rounded).unwrap_or(u64::MAX);
        let minimal = min_segment_size_for(rounded).unwrap_or(u64::MAX);
        let size = if preferred <= room {
            preferred
        } else if minimal <= room {
            minimal
        } else {
            return Err(String::new());
        };
        let memory = self
            .platform
            .allocate_segment(self.chip, size)
            .map_err(|e| format!("; the platform failed to allocate a segment: {e}"))?;
        if memory.len() < size {
            return Err(format!(
                "; the platform returned {} bytes for a segment of {size} bytes",
                memory.len()
            ));
        }
        let fence = BlockFence::now(Arc::clone(stream));
        Ok(state.add_segment(memory, size, pool_for(rounded), fence))
    }

    fn out_of_memory(&self, state: &mut PoolState, bytes: u64, detail: &str) -> Error {
        state.stats.num_ooms += 1;
        let allocated = state.stats.allocated_bytes.current;
        let reserved = state.stats.reserved_bytes.current;
        Error::OutOfMemory(format!(
            "chip {}: tried to allocate {} ({} bytes); capacity {}, {} allocated, {} reserved, {} free in the cache{}",
            self.chip,
            format_bytes(bytes),
            bytes,
            format_bytes(self.capacity),
            format_bytes(allocated),
            format_bytes(reserved),
            format_bytes(reserved.saturating_sub(allocated)),
            detail,
        ))
    }
}

/// One segment held from the platform.
struct SegmentRecord {
    id: u64,
    memory: Segment,
    /// Device address of its first byte (rule 15).
    address: u64,
    size: u64,
    pool: PoolKind,
    /// Slot of the block at offset 0.
    first: usize,
}

/// A fence on a block's own stream: like [`Fence`], but it owns the
/// stream's clock handle, so the handle moves from an allocated block into
/// the cache and back instead of being cloned and dropped on every cycle.
struct BlockFence {
    clock: Arc<StreamClock>,
    /// Complete once the stream has finished this many tasks.
    seq: u64,
}

impl BlockFence {
    /// Everything submitted to the stream so far, as [`StreamClock::fence`].
    fn now(clock: Arc<StreamClock>) -> Self {
        let seq = clock.submitted();
        BlockFence { clock, seq }
    }

    fn is_complete(&self) -> bool {
        self.clock.completed() >= self.seq
    }

    fn stream(&self) -> StreamId {
        self.clock.id()
    }
}

enum NodeState {
    /// An unused arena slot.
    Vacant,
    Allocated {
        /// The public block id, to refuse stale or foreign blocks.
        id: u64,
        requested: u64,
        clock: Arc<StreamClock>,
        /// Other streams named by record_stream.
        recorded: Vec<Arc<StreamClock>>,
    },
    PendingFree {
        requested: u64,
        /// On the block's own stream, taken at free time.
        fence: BlockFence,
        /// On each recorded stream, taken at free time.
        waits: Vec<Fence>,
    },
    /// Parked unmerged in its pool's quick list (rule 9).
    Quick {
        /// The rounded request it served, and the only one it serves again.
        rounded: u64,
        /// On the block's stream, taken at free time.
        fence: BlockFence,
        /// The returned [`Block`]'s segment handle, to hand out again.
        memory: Segment,
    },
    Free {
        /// On the block's stream; the block's stream is `fence.stream()`.
        fence: BlockFence,
        /// Cached "fence is complete" (it never goes back to incomplete).
        settled: bool,
    },
}

/// One block, linked to its neighbours in its segment.
struct Node {
    segment: usize,
    pool: PoolKind,
    offset: u64,
    size: u64,
    prev: Option<usize>,
    next: Option<usize>,
    state: NodeState,
}

impl Node {
    /// Give a slot that was just emptied (`mem::replace` with `Vacant`) its
    /// next state, sparing the hot path a call to the drop glue of a state
    /// that owns nothing.
    fn fill(&mut self, state: NodeState) {
        let old = std::mem::replace(&mut self.state, state);
        if matches!(old, NodeState::Vacant) {
            // Nothing to release, so forgetting it leaks nothing.
            std::mem::forget(old);
        } else {
            drop(old);
        }
    }

    fn free_stream(&self) -> Option<StreamId> {
        match &self.state {
            NodeState::Free { fence, .. } => Some(fence.stream()),
            _ => None,
        }
    }

    fn describe(&self) -> BlockSnapshot {
        let (state, requested, stream) = match &self.state {
            NodeState::Allocated {
                requested, clock, ..
            } => (BlockState::ActiveAllocated, *requested, clock.id()),
            NodeState::PendingFree {
                requested, fence, ..
            } => (BlockState::ActivePendingFree, *requested, fence.stream()),
            NodeState::Quick { fence, .. } | NodeState::Free { fence, .. } => {
                (BlockState::Inactive, 0, fence.stream())
            }
            NodeState::Vacant => (BlockState::Inactive, 0, StreamId(0)),
        };
        BlockSnapshot {
            offset: self.offset,
            size: self.size,
            requested,
            state,
            stream,
        }
    }
}

/// A quick block's entry in its pool's quick list (rule 9): what the scan
/// compares, without touching the block.
struct QuickEntry {
    stream: StreamId,
    rounded: u64,
    slot: usize,
}

#[derive(Default)]
struct PoolState {
    nodes: Vec<Node>,
    vacant_nodes: Vec<usize>,
    segments: Vec<Option<SegmentRecord>>,
    vacant_segments: Vec<usize>,
    /// Free blocks per pool kind, keyed by (size, slot).
    free: [BTreeSet<(u64, usize)>; 2],
    /// Quick blocks per pool kind, oldest first. A plain vector: hits are
    /// near the back, and only an overflow removes from the front.
    quick: [Vec<QuickEntry>; 2],
    /// Slots of pending-free blocks.
    pending: Vec<usize>,
    next_block_id: u64,
    next_segment_id: u64,
    stats: MemoryStats,
}

impl PoolState {
    /// Rule 9: the most recently parked quick block for `rounded` that
    /// `clock`'s stream may reuse, handed out as it is.
    fn take_quick(
        &mut self,
        pool_id: u64,
        rounded: u64,
        requested: u64,
        clock: &Arc<StreamClock>,
    ) -> Option<Block> {
        let stream = clock.id();
        let nodes = &self.nodes;
        let list = &mut self.quick[pool_for(rounded) as usize];
        let position = list.iter().rposition(|entry| {
            entry.rounded == rounded
                && (entry.stream == stream
                    || matches!(&nodes[entry.slot].state,
                        NodeState::Quick { fence, .. } if fence.is_complete()))
        })?;
        let slot = list.remove(position).slot;
        let address = self.segment(self.nodes[slot].segment).address + self.nodes[slot].offset;
        let node = &mut self.nodes[slot];
        let taken = std::mem::replace(&mut node.state, NodeState::Vacant);
        let NodeState::Quick { fence, memory, .. } = taken else {
            // The scan saw a quick block; put it back unchanged.
            node.state = taken;
            return None;
        };
        let clock = if fence.stream() == stream {
            fence.clock
        } else {
            Arc::clone(clock)
        };
        let id = self.next_block_id;
        self.next_block_id += 1;
        node.fill(NodeState::Allocated {
            id,
            requested,
            clock,
            recorded: Vec::new(),
        });
        self.stats.count_allocation(node.size, requested);
        Some(Block {
            pool: pool_id,
            slot,
            id,
            segment: memory,
            offset: node.offset,
            address,
            size: node.size,
            requested,
            stream,
        })
    }

    /// Rule 4: the smallest free block of at least `rounded` bytes that
    /// `stream` may reuse.
    fn find_free(&mut self, rounded: u64, stream: StreamId) -> Option<usize> {
        let nodes = &mut self.nodes;
        for &(_, slot) in self.free[pool_for(rounded) as usize].range((rounded, 0)..) {
            if let NodeState::Free { fence, settled } = &mut nodes[slot].state {
                if fence.stream() == stream {
                    return Some(slot);
                }
                if !*settled && fence.is_complete() {
                    *settled = true;
                }
                if *settled {
                    return Some(slot);
                }
            }
        }
        None
    }

    /// [`PoolState::take`] for a block that is in its free set.
    fn take_free(
        &mut self,
        pool_id: u64,
        slot: usize,
        rounded: u64,
        requested: u64,
        clock: &Arc<StreamClock>,
    ) -> Block {
        let (pool, size) = (self.nodes[slot].pool, self.nodes[slot].size);
        self.free[pool as usize].remove(&(size, slot));
        self.take(pool_id, slot, rounded, requested, clock)
    }

    /// Rules 5 and 12: turn free block `slot`, not in its free set, into an
    /// allocation of `rounded` bytes, splitting off the remainder.
    fn take(
        &mut self,
        pool_id: u64,
        slot: usize,
        rounded: u64,
        requested: u64,
        clock: &Arc<StreamClock>,
    ) -> Block {
        let (pool, size) = (self.nodes[slot].pool, self.nodes[slot].size);
        let id = self.next_block_id;
        self.next_block_id += 1;
        let previous = std::mem::replace(
            &mut self.nodes[slot].state,
            NodeState::Allocated {
                id,
                requested,
                clock: Arc::clone(clock),
                recorded: Vec::new(),
            },
        );
        let remainder = size - rounded;
        if splits(pool, remainder) {
            let node = &self.nodes[slot];
            let rest = Node {
                segment: node.segment,
                pool,
                offset: node.offset + rounded,
                size: remainder,
                prev: Some(slot),
                next: node.next,
                // The remainder keeps the stream and fence of its block.
                state: previous,
            };
            let rest_slot = self.insert_node(rest);
            if let Some(next) = self.nodes[slot].next {
                self.nodes[next].prev = Some(rest_slot);
            }
            self.nodes[slot].next = Some(rest_slot);
            self.nodes[slot].size = rounded;
            self.free[pool as usize].insert((remainder, rest_slot));
        }
        let node = &self.nodes[slot];
        self.stats.count_allocation(node.size, requested);
        let record = self.segment(node.segment);
        Block {
            pool: pool_id,
            slot,
            id,
            segment: record.memory.clone(),
            offset: node.offset,
            address: record.address + node.offset,
            size: node.size,
            requested,
            stream: clock.id(),
        }
    }

    /// The slot of an allocated block of this pool, or an error.
    fn allocated_slot(&self, block: &Block) -> Result<usize> {
        match self.nodes.get(block.slot).map(|n| &n.state) {
            Some(NodeState::Allocated { id, .. }) if *id == block.id => Ok(block.slot),
            _ => Err(Error::invalid(format!(
                "block {} is not allocated in this pool",
                block.id
            ))),
        }
    }

    /// Rules 9 and 12: a block freed at once leaves the active set and is
    /// parked; a list that grows past its bound flushes its oldest block.
    fn park(&mut self, slot: usize, fence: BlockFence, requested: u64, memory: Segment) {
        let (pool, size) = (self.nodes[slot].pool, self.nodes[slot].size);
        self.stats.active_bytes.sub(size);
        self.stats.requested_bytes.sub(requested);
        // The request was served, so it rounds.
        let rounded = round_size(requested).unwrap_or(size);
        let entry = QuickEntry {
            stream: fence.stream(),
            rounded,
            slot,
        };
        self.nodes[slot].fill(NodeState::Quick {
            rounded,
            fence,
            memory,
        });
        if self.quick[pool as usize].len() >= QUICK_LIST_LEN {
            let oldest = self.quick[pool as usize].remove(0);
            self.flush_one(oldest.slot);
        }
        self.quick[pool as usize].push(entry);
    }

    /// Rule 9: flush a pool's quick list, oldest first. Whether it held any.
    fn flush_quick(&mut self, pool: PoolKind) -> bool {
        let mut list = std::mem::take(&mut self.quick[pool as usize]);
        let flushed = !list.is_empty();
        for entry in list.drain(..) {
            self.flush_one(entry.slot);
        }
        // Keep the list's buffer.
        self.quick[pool as usize] = list;
        flushed
    }

    /// Rule 9: quick block `slot`, already off its list, becomes free.
    fn flush_one(&mut self, slot: usize) {
        let taken = std::mem::replace(&mut self.nodes[slot].state, NodeState::Vacant);
        match taken {
            // Dropping `memory` drops the parked handle to the segment.
            NodeState::Quick { fence, .. } => self.insert_free(slot, fence),
            other => self.nodes[slot].state = other,
        }
    }

    /// Rule 8: block `slot` becomes free, merges, and enters its free set.
    fn insert_free(&mut self, slot: usize, fence: BlockFence) {
        let settled = fence.is_complete();
        self.nodes[slot].state = NodeState::Free { fence, settled };
        self.merge_neighbours(slot);
        let node = &self.nodes[slot];
        self.free[node.pool as usize].insert((node.size, slot));
    }

    /// Rule 7: pending blocks whose fences all completed become free.
    #[inline]
    fn process_pending(&mut self) {
        if !self.pending.is_empty() {
            self.settle_pending();
        }
    }

    #[cold]
    fn settle_pending(&mut self) {
        let mut pending = std::mem::take(&mut self.pending);
        let mut i = 0;
        while i < pending.len() {
            let slot = pending[i];
            let done = match &self.nodes[slot].state {
                NodeState::PendingFree { waits, .. } => waits.iter().all(Fence::is_complete),
                _ => false,
            };
            if !done {
                i += 1;
                continue;
            }
            pending.swap_remove(i);
            let state = std::mem::replace(&mut self.nodes[slot].state, NodeState::Vacant);
            if let NodeState::PendingFree {
                requested, fence, ..
            } = state
            {
                self.stats.active_bytes.sub(self.nodes[slot].size);
                self.stats.requested_bytes.sub(requested);
                self.insert_free(slot, fence);
            }
        }
        self.pending = pending;
    }

    /// Whether free block `slot` is settled, refreshing the cached flag.
    fn settled(&mut self, slot: usize) -> bool {
        match &mut self.nodes[slot].state {
            NodeState::Free { fence, settled } => {
                if !*settled && fence.is_complete() {
                    *settled = true;
                }
                *settled
            }
            _ => false,
        }
    }

    /// Rule 8 for the two free blocks `keep` and `other`.
    fn mergeable(&mut self, keep: usize, other: usize) -> bool {
        match (
            self.nodes[keep].free_stream(),
            self.nodes[other].free_stream(),
        ) {
            (Some(a), Some(b)) if a == b => true,
            (Some(_), Some(_)) => self.settled(keep) && self.settled(other),
            _ => false,
        }
    }

    /// Whether free block `slot` would merge with a neighbour (rule 8).
    fn has_mergeable_neighbour(&mut self, slot: usize) -> bool {
        let (prev, next) = (self.nodes[slot].prev, self.nodes[slot].next);
        prev.is_some_and(|p| self.mergeable(slot, p))
            || next.is_some_and(|n| self.mergeable(slot, n))
    }

    /// Rule 8: merge free block `keep` (not in a free set) with its
    /// qualifying free neighbours until none qualifies. `keep` survives.
    fn merge_neighbours(&mut self, keep: usize) {
        loop {
            if let Some(left) = self.nodes[keep].prev {
                if self.mergeable(keep, left) {
                    self.absorb(keep, left);
                    continue;
                }
            }
            if let Some(right) = self.nodes[keep].next {
                if self.mergeable(keep, right) {
                    self.absorb(keep, right);
                    continue;
                }
            }
            break;
        }
    }

    /// Fold the free neighbour `other` (in a free set) into free block `keep`.
    fn absorb(&mut self, keep: usize, other: usize) {
        let (other_pool, other_size) = (self.nodes[other].pool, self.nodes[other].size);
        self.free[other_pool as usize].remove(&(other_size, other));
        let other_node_state = std::mem::replace(&mut self.nodes[other].state, NodeState::Vacant);
        if let (
            NodeState::Free {
                fence: keep_fence,
                settled: keep_settled,
            },
            NodeState::Free {
                fence: other_fence,
                settled: other_settled,
            },
        ) = (&mut self.nodes[keep].state, other_node_state)
        {
            // Same stream: keep the later fence. Different streams: both are
            // settled, and `keep`'s stream and fence stay.
            if other_fence.stream() == keep_fence.stream() && other_fence.seq > keep_fence.seq {
                *keep_fence = other_fence;
                *keep_settled = other_settled;
            }
        }
        let other_node = &self.nodes[other];
        let (prev, next, offset) = (other_node.prev, other_node.next, other_node.offset);
        if prev.is_none() && next == Some(keep) {
            // `other` was first in its segment.
            let segment = self.nodes[keep].segment;
            if let Some(record) = self.segments[segment].as_mut() {
                record.first = keep;
            }
        }
        if next == Some(keep) {
            // `other` is left of `keep`.
            self.nodes[keep].prev = prev;
            self.nodes[keep].offset = offset;
            if let Some(p) = prev {
                self.nodes[p].next = Some(keep);
            }
        } else {
            self.nodes[keep].next = next;
            if let Some(n) = next {
                self.nodes[n].prev = Some(keep);
            }
        }
        self.nodes[keep].size += other_size;
        self.nodes[other].prev = None;
        self.nodes[other].next = None;
        self.vacant_nodes.push(other);
    }

    /// Rules 10 and 11: flush the quick lists, coalesce settled free blocks,
    /// then return every settled wholly free segment to the platform.
    /// Returns bytes released.
    fn release_cached(&mut self) -> u64 {
        self.process_pending();
        self.flush_quick(PoolKind::Small);
        self.flush_quick(PoolKind::Large);
        let mut released = 0;
        for segment in 0..self.segments.len() {
            let Some(record) = &self.segments[segment] else {
                continue;
            };
            let mut cursor = Some(record.first);
            while let Some(slot) = cursor {
                // Only a block that merges leaves and re-enters its free set.
                if self.settled(slot) && self.has_mergeable_neighbour(slot) {
                    let (pool, size) = (self.nodes[slot].pool, self.nodes[slot].size);
                    self.free[pool as usize].remove(&(size, slot));
                    self.merge_neighbours(slot);
                    self.free[pool as usize].insert((self.nodes[slot].size, slot));
                }
                cursor = self.nodes[slot].next;
            }
            let (first, segment_size) = match &self.segments[segment] {
                Some(record) => (record.first, record.size),
                None => continue,
            };
            if self.nodes[first].size == segment_size && self.settled(first) {
                let pool = self.nodes[first].pool;
                self.free[pool as usize].remove(&(segment_size, first));
                self.release_node(first);
                // Dropping the record drops the pool's reference to the memory.
                self.segments[segment] = None;
                self.vacant_segments.push(segment);
                self.stats.reserved_bytes.sub(segment_size);
                self.stats.num_segments.decrement();
                self.stats.num_segment_frees += 1;
                released += segment_size;
            }
        }
        released
    }

    /// Record a new segment as one free block, not in its free set; returns
    /// its slot.
    fn add_segment(
        &mut self,
        memory: Segment,
        size: u64,
        pool: PoolKind,
        fence: BlockFence,
    ) -> usize {
        let segment = match self.vacant_segments.pop() {
            Some(s) => s,
            None => {
                self.segments.push(None);
                self.segments.len() - 1
            }
        };
        let settled = fence.is_complete();
        let slot = self.insert_node(Node {
            segment,
            pool,
            offset: 0,
            size,
            prev: None,
            next: None,
            state: NodeState::Free { fence, settled },
        });
        let id = self.next_segment_id;
        self.next_segment_id += 1;
        self.segments[segment] = Some(SegmentRecord {
            id,
            memory,
            address: reserve_addresses(size),
            size,
            pool,
            first: slot,
        });
        self.stats.reserved_bytes.add(size);
        self.stats.num_segments.increment();
        self.stats.num_segment_allocs += 1;
        slot
    }

    fn insert_node(&mut self, node: Node) -> usize {
        match self.vacant_nodes.pop() {
            Some(slot) => {
                self.nodes[slot] = node;
                slot
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    fn release_node(&mut self, slot: usize) {
        let node = &mut self.nodes[slot];
        node.state = NodeState::Vacant;
        node.prev = None;
        node.next = None;
        self.vacant_nodes.push(slot);
    }

    fn segment(&self, segment: usize) -> &SegmentRecord {
        // A live block always points at a live segment (invariant I1).
        self.segments[segment]
            .as_ref()
            .expect("a live block's segment is held")
    }

    /// Slots of a segment's blocks in address order (bounded, so a broken
    /// link cannot loop forever).
    fn segment_blocks<'a>(&'a self, record: &SegmentRecord) -> impl Iterator<Item = usize> + 'a {
        let mut cursor = Some(record.first);
        std::iter::from_fn(move || {
            let slot = cursor?;
            cursor = self.nodes.get(slot).and_then(|n| n.next);
            Some(slot)
        })
        .take(self.nodes.len())
    }

    /// Invariants I1-I6 of the module comment.
    fn check(&self, capacity: u64) -> std::result::Result<(), String> {
        let mut seen = vec![false; self.nodes.len()];
        let (mut reserved, mut segments) = (0u64, 0u64);
        let (mut allocated, mut pending_bytes, mut requested_sum) = (0u64, 0u64, 0u64);
        let (mut free_count, mut pending_count) = ([0usize; 2], 0usize);
        let mut quick_count = [0usize; 2];

        for (index, record) in self.segments.iter().enumerate() {
            let Some(record) = record else { continue };
            let seg = record.id;
            segments += 1;
            reserved += record.size;
            if record.size == 0 || !is_aligned(record.size, SEGMENT_GRANULE) {
                return Err(format!("I2: segment {seg} has size {}", record.size));
            }
            if record.pool == PoolKind::Small && record.size != SMALL_SEGMENT_SIZE {
                return Err(format!("I2: small segment {seg} has size {}", record.size));
            }
            if record.memory.len() < record.size {
                return Err(format!("I1: segment {seg} memory is shorter than its size"));
            }
            let mut offset = 0u64;
            let mut prev: Option<usize> = None;
            let mut cursor = Some(record.first);
            while let Some(slot) = cursor {
                let Some(node) = self.nodes.get(slot) else {
                    return Err(format!("I1: segment {seg} links to missing slot {slot}"));
                };
                if seen[slot] {
                    return Err(format!("I1: slot {slot} reached twice (segment {seg})"));
                }
                seen[slot] = true;
                let at = format!("segment {seg} offset {}", node.offset);
                if node.segment != index || node.pool != record.pool {
                    return Err(format!("I1: block at {at} names another segment or pool"));
                }
                if node.prev != prev {
                    return Err(format!("I1: block at {at} has a wrong prev link"));
                }
                if node.offset != offset {
                    return Err(format!("I1: block at {at} expected at offset {offset}"));
                }
                if node.size == 0
                    || !is_aligned(node.size, MIN_BLOCK_SIZE)
                    || !is_aligned(node.offset, MIN_BLOCK_SIZE)
                {
                    return Err(format!("I2: block at {at} has size {}", node.size));
                }
                match &node.state {
                    NodeState::Vacant => return Err(format!("I1: vacant slot linked at {at}")),
                    NodeState::Allocated { requested, .. }
                    | NodeState::PendingFree { requested, .. } => {
                        let rounded = round_size(*requested).unwrap_or(u64::MAX);
                        if node.size < rounded {
                            return Err(format!("I3: block at {at} smaller than its request"));
                        }
                        if pool_for(rounded) != node.pool {
                            return Err(format!("I3: block at {at} is in the wrong pool"));
                        }
                        if splits(node.pool, node.size - rounded) {
                            return Err(format!(
                                "I3: block at {at} of {} bytes for {requested} should have split",
                                node.size
                            ));
                        }
                        requested_sum += requested;
                        if matches!(node.state, NodeState::Allocated { .. }) {
                            allocated += node.size;
                        } else {
                            pending_bytes += node.size;
                            pending_count += 1;
                            if !self.pending.contains(&slot) {
                                return Err(format!("I4: pending block at {at} not listed"));
                            }
                        }
                    }
                    NodeState::Quick {
                        rounded,
                        fence,
                        memory,
                    } => {
                        quick_count[node.pool as usize] += 1;
                        if round_size(*rounded) != Some(*rounded)
                            || node.size < *rounded
                            || pool_for(*rounded) != node.pool
                            || splits(node.pool, node.size - rounded)
                        {
                            return Err(format!(
                                "I3: quick block at {at} of {} bytes cannot serve {rounded}",
                                node.size
                            ));
                        }
                        let listed: Vec<&QuickEntry> = self.quick[node.pool as usize]
                            .iter()
                            .filter(|e| e.slot == slot)
                            .collect();
                        match listed[..] {
                            [entry]
                                if entry.stream == fence.stream() && entry.rounded == *rounded => {}
                            [_] => {
                                return Err(format!(
                                    "I4: quick block at {at} listed under another stream or size"
                                ))
                            }
                            _ => {
                                return Err(format!(
                                    "I4: quick block at {at} listed {} times",
                                    listed.len()
                                ))
                            }
                        }
                        if !Arc::ptr_eq(memory, &record.memory) {
                            return Err(format!(
                                "I4: quick block at {at} holds another segment's handle"
                            ));
                        }
                    }
                    NodeState::Free { fence, settled } => {
                        free_count[node.pool as usize] += 1;
                        if !self.free[node.pool as usize].contains(&(node.size, slot)) {
                            return Err(format!("I4: free block at {at} not in its free set"));
                        }
                        if *settled && !fence.is_complete() {
                            return Err(format!("I5: block at {at} settled before its fence"));
                        }
                        let prev_stream = prev.and_then(|p| self.nodes[p].free_stream());
                        if prev_stream == Some(fence.stream()) {
                            return Err(format!(
                                "I5: free block at {at} and its left neighbour share stream {} unmerged",
                                fence.stream()
                            ));
                        }
                    }
                }
                offset += node.size;
                prev = Some(slot);
                cursor = node.next;
            }
            if offset != record.size {
                return Err(format!(
                    "I1: blocks of segment {seg} cover {offset} of {} bytes",
                    record.size
                ));
            }
        }

        for kind in [PoolKind::Small, PoolKind::Large] {
            if self.free[kind as usize].len() != free_count[kind as usize] {
                return Err(format!(
                    "I4: {} free set holds {} entries for {} free blocks",
                    kind.as_str(),
                    self.free[kind as usize].len(),
                    free_count[kind as usize]
                ));
            }
        }
        for kind in [PoolKind::Small, PoolKind::Large] {
            let listed = self.quick[kind as usize].len();
            if listed != quick_count[kind as usize] || listed > QUICK_LIST_LEN {
                return Err(format!(
                    "I4: {} quick list holds {listed} entries for {} quick blocks (at most {QUICK_LIST_LEN})",
                    kind.as_str(),
                    quick_count[kind as usize]
                ));
            }
        }
        if self.pending.len() != pending_count {
            return Err(format!(
                "I4: pending list holds {} entries for {pending_count} pending blocks",
                self.pending.len()
            ));
        }
        let vacant = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(slot, node)| !seen[*slot] && matches!(node.state, NodeState::Vacant))
            .count();
        let unseen = seen.iter().filter(|s| !**s).count();
        if vacant != unseen || vacant != self.vacant_nodes.len() {
            return Err(format!(
                "I1: {unseen} slots unlinked, {vacant} of them vacant, {} listed vacant",
                self.vacant_nodes.len()
            ));
        }

        let s = &self.stats;
        let expect = [
            ("allocated_bytes", s.allocated_bytes.current, allocated),
            (
                "active_bytes",
                s.active_bytes.current,
                allocated + pending_bytes,
            ),
            ("requested_bytes", s.requested_bytes.current, requested_sum),
            ("reserved_bytes", s.reserved_bytes.current, reserved),
            ("num_segments", s.num_segments.current, segments),
            (
                "num_segment_allocs - num_segment_frees",
                s.num_segment_allocs.saturating_sub(s.num_segment_frees),
                segments,
            ),
        ];
        for (name, stat, actual) in expect {
            if stat != actual {
                return Err(format!("I6: {name} is {stat}, blocks say {actual}"));
            }
        }
        for (name, stat) in [
            ("allocated_bytes", s.allocated_bytes),
            ("reserved_bytes", s.reserved_bytes),
            ("active_bytes", s.active_bytes),
            ("requested_bytes", s.requested_bytes),
        ] {
            if stat.peak < stat.current
                || stat.allocated.checked_sub(stat.freed) != Some(stat.current)
            {
                return Err(format!("I6: {name} is inconsistent: {stat:?}"));
            }
        }
        if s.num_segments.peak < s.num_segments.current {
            return Err("I6: num_segments peak below current".into());
        }
        if reserved > capacity {
            return Err(format!(
                "I6: reserved {reserved} exceeds capacity {capacity}"
            ));
        }
        Ok(())
    }
}
