//! HBM pool: a per-chip caching sub-allocator over platform segments,
//! modelled on PyTorch's CUDA caching allocator.
//!
//! The pool asks the platform for large *segments* and carves them into
//! *blocks*. A freed block goes back to the pool's cache, not to the
//! platform. The next allocation of the same rounded size that may reuse it
//! takes it back from a short list without splitting or merging anything
//! (one mutex lock and a scan of a few entries); any other allocation costs
//! a lookup in an ordered set.
//! Memory goes back to the platform only in [`HbmPool::empty_cache`] and
//! when an allocation would otherwise fail.
//!
//! Every rule below is stated so that it can be checked:
//! [`HbmPool::check_invariants`] verifies the invariants at the end of this
//! comment, and the property tests in this folder drive random sequences of
//! allocate / free / record_stream / stream progress / empty_cache and call
//! it after every step.
//!
//! # Terms
//!
//! - A **segment** is one allocation from the platform. Its blocks tile it
//!   exactly: they are contiguous, do not overlap and cover every byte.
//! - A **block** is *allocated* (held by a caller as a [`Block`]), *pending
//!   free* (returned by the caller but still in use by another stream),
//!   *quick* (returned, and parked unmerged for reuse at the same size, rule
//!   9) or *free* (in its pool's free set). Quick and free blocks make up
//!   the *cache*.
//! - Every block belongs to one **stream**: an allocated block to the stream
//!   it was allocated for; a quick or free block to the stream it was freed
//!   on.
//! - A quick or free block carries a **fence** on its own stream, taken when
//!   it was freed. It is **settled** once that fence is complete: no work of
//!   any stream can still touch it.
//!
//! # Rules
//!
//! 1. **Rounding.** A request of `n` bytes becomes a block of `n` rounded up
//!    to a multiple of 512 bytes ([`MIN_BLOCK_SIZE`]); 0 bytes become 512, so
//!    zero-size tensors still get a distinct address. Block offsets and
//!    sizes are therefore always multiples of 512.
//! 2. **Two pools.** A rounded request of at most 1 MiB
//!    ([`SMALL_REQUEST_MAX`]) is served from the *small* pool, anything
//!    larger from the *large* pool. A block never moves between pools.
//! 3. **Segment sizes.** A small-pool segment is 2 MiB. A large-pool
//!    segment is 20 MiB for rounded requests under 10 MiB, otherwise the
//!    rounded request rounded up to a multiple of 2 MiB. Only the capacity
//!    (rule 10) may shrink a 20 MiB segment to the request rounded up to
//!    2 MiB. Every segment size is a multiple of 2 MiB.
//! 4. **Best fit.** An allocation that no quick block serves (rule 9) takes
//!    the smallest free block of its pool that is large enough and
//!    *reusable* by the requesting stream, ties broken by the lowest internal
//!    slot. A quick or free block is reusable by its own stream at once, and
//!    by any other stream once it is settled. Only when no free block fits,
//!    even after the quick list of its pool was flushed (rule 9), does the
//!    pool allocate a new segment.
//! 5. **Splitting.** The chosen block splits when the remainder (block size
//!    minus rounded request) is at least 512 bytes in the small pool, or
//!    more than 1 MiB in the large pool. The allocation keeps the low part;
//!    the remainder stays free with the stream and fence of the block it
//!    came from. So an allocated small block is exactly the rounded request,
//!    and an allocated large block exceeds it by at most 1 MiB. The unused
//!    rest of a new segment counts as freed on the requesting stream at the
//!    moment the segment was made.
//! 6. **Stream-ordered free.** [`HbmPool::free`] takes a fence on the
//!    block's stream. The block is then reusable at once by its own stream
//!    (work there runs in order after the caller's work) and by other
//!    streams once that fence is complete, whether it is quick, free, or
//!    merged into a larger free block.
//! 7. **Pending frees.** If [`HbmPool::record_stream`] named other streams,
//!    `free` also takes a fence on each of them. Until all of those are
//!    complete the block stays *active, pending free*: not in the cache,
//!    not reusable by anyone, not mergeable. Every `allocate`, `stats`,
//!    `snapshot` and `empty_cache` first polls the pending list and turns
//!    blocks whose fences completed into free (not quick) blocks (rule 6
//!    then applies, with the fence on the block's own stream taken at free
//!    time). If all of those fences are already complete at `free`, the
//!    block is freed at once, like a block no stream was recorded on.
//! 8. **Merging.** When a block becomes free (a pending block whose fences
//!    completed, or a quick block being flushed) it merges with each free
//!    neighbour in its segment if the two are on the same stream or both
//!    are settled; merging repeats until no neighbour qualifies. Two blocks
//!    of one stream merge into a block of that stream that keeps the later
//!    of the two fences; two settled blocks of different streams merge into
//!    a settled block with the stream and fence of the block being freed (in
//!    a coalescing pass, of the block the pass is visiting). Hence no two
//!    adjacent free blocks ever share a stream. Settled blocks of different
//!    streams that were not settled at free time merge later, when
//!    `empty_cache` or an allocation retry coalesces the cache. Quick blocks
//!    are not free blocks: nothing merges with them until they are flushed.
//! 9. **Quick blocks (deferred merging).** A block that `free` frees at once
//!    neither merges nor enters a free set: it becomes *quick*, parked at
//!    the back of its pool's quick list with its stream, its fence (rule 6)
//!    and the rounded request it served. An allocation first takes the most
//!    recently parked quick block of its pool that was parked for the same
//!    rounded request and is reusable by the requesting stream (rule 4:
//!    its own stream at once, another once settled). That block is handed
//!    out as it is, so rules 1 and 5 hold for it as they did when it was
//!    first allocated. Best fit runs only when no quick block qualifies, and
//!    never sees quick blocks. *Flushing* a quick block makes it free with
//!    the fence taken at its free, merging as rule 8 says; a list is flushed
//!    oldest first. The pool flushes the oldest block of a list that would
//!    hold more than [`QUICK_LIST_LEN`] blocks; the whole list of the
//!    request's pool when best fit finds nothing, before it tries best fit
//!    once more and only then allocates a segment; and every list when it
//!    releases its cache (rules 10 and 11) and before a snapshot (rule 13).
//!    So a parked block never stands between a request and the memory it
//!    could use: the pool grows only when no free block fits with every
//!    quick block of its pool merged back.
//! 10. **Capacity, retry and OOM.** Reserved bytes (the sum of segment
//!     sizes) never exceed the pool's capacity. If the 20 MiB segment of
//!     rule 3 would exceed it, the pool uses the smallest segment that fits
//!     the request instead. If that still exceeds the capacity, or the
//!     platform fails to allocate, the pool *releases its cache* (flushes
//!     every quick list, coalesces settled free blocks and returns every
//!     settled wholly free segment to the platform), counts a retry and
//!     tries once more: best fit, then a new segment. If that fails too,
//!     `allocate` returns [`Error::OutOfMemory`](crate::Error::OutOfMemory)
//!     whose message names the chip, the requested size (human units and
//!     bytes), the capacity, the allocated bytes, the reserved bytes and the
//!     bytes free in the cache (reserved minus allocated). A request whose
//!     smallest possible segment is larger than the capacity fails at once,
//!     without touching the cache. Every failed allocation counts as an
//!     OOM. The pool never panics or aborts on a failed allocation.
//! 11. **empty_cache.** Releases to the platform every segment that is
//!     wholly free and settled (after flushing and coalescing as in rule 10)
//!     and returns the bytes released. Segments holding an allocated,
//!     pending or unsettled block stay.
//! 12. **Statistics** ([`MemoryStats`], named after `torch.cuda.memory_stats`).
//!     Byte statistics are a [`Stat`]: `current`, `peak` (highest `current`
//!     since creation or the last [`HbmPool::reset_peak_stats`]), `allocated`
//!     (total ever added) and `freed` (total ever removed); always
//!     `current == allocated - freed` and `peak >= current`.
//!     - `allocated_bytes`: sizes (rounded) of blocks held by callers; drops
//!       at `free`, even when the block goes pending.
//!     - `active_bytes`: allocated plus pending-free blocks; drops when a
//!       block enters the cache (becomes quick or free).
//!     - `requested_bytes`: the unrounded requests of active blocks.
//!     - `reserved_bytes`: sizes of segments held from the platform.
//!     - `num_alloc` / `num_free`: successful allocations / calls to free;
//!       `num_ooms`: failed allocations; `num_alloc_retries`: times an
//!       allocation released the cache and tried again; `num_segments`:
//!       segments held (current and peak); `num_segment_allocs` /
//!       `num_segment_frees`: segments obtained from / returned to the
//!       platform.
//!     - `plugin_bytes`: memory of the platform's own that holds the chip's
//!       data outside the pool for a while (what a PJRT plugin holds
//!       during an execution: copies of inputs, results before they are
//!       copied out, the program's temporaries), counted
//!       while a guard from [`HbmPool::hold_plugin_bytes`] lives. It is
//!       not part of the reserved bytes and not limited by the capacity.
//! 13. **Snapshot** ([`PoolSnapshot`]): the capacity and every segment
//!     (id, size, allocated bytes, pool `"small"`/`"large"`) with its blocks
//!     in address order (offset, size, requested, state
//!     `"active_allocated"` / `"active_pending_free"` / `"inactive"`, stream).
//!     The quick lists are flushed first, so every cached block shows as a
//!     coalesced `"inactive"` block.
//! 14. **Blocks are plain values.** [`Block`] is neither `Clone` nor `Copy`
//!     and `free` consumes it, so a block cannot be freed twice. A block
//!     handed to a pool that did not make it is refused ([`HbmPool::try_free`]
//!     returns an error; `free` ignores it).
//! 15. **Device addresses.** Each segment takes a fresh 2 MiB-aligned
//!     range of one process-wide address space, with a gap after it, and a
//!     block's address is its segment's plus its offset: unique among live
//!     blocks of all pools, ranges disjoint, stable for the block's life.
//!     They are names for frontends (torch compares data pointers to find
//!     aliases), never pointers.
//!
//! # Invariants checked by `check_invariants`
//!
//! - I1: the blocks of every segment tile it (linked in address order,
//!   offsets contiguous from 0, sizes sum to the segment size), and every
//!   block of a segment is in that segment's pool.
//! - I2: block sizes and offsets are multiples of 512; small-pool segments
//!   are 2 MiB; every segment size is a multiple of 2 MiB.
//! - I3: an allocated or pending block has `size >= round(requested)`, is
//!   in the pool rule 2 picks for its request, and is not splittable by
//!   rule 5; so does a quick block for the rounded request it is parked
//!   under.
//! - I4: the free sets hold exactly the free blocks (keyed by size), the
//!   pending list exactly the pending blocks, and each pool's quick list
//!   exactly that pool's quick blocks, each once, under the block's own
//!   stream and rounded request, and never more than [`QUICK_LIST_LEN`]
//!   of them; a quick block holds a handle to its own segment.
//! - I5: no two adjacent free blocks share a stream; a block marked settled
//!   has a complete fence.
//! - I6: the statistics agree with the blocks and segments (allocated,
//!   active, requested, reserved, segment count; quick blocks count as
//!   neither allocated nor active), every `peak >= current`,
//!   `current == allocated - freed`, and reserved never exceeds capacity.

mod pool;
mod snapshot;
mod stats;

#[cfg(test)]
mod properties;
#[cfg(test)]
mod test_platform;
#[cfg(test)]
mod tests;

pub use pool::{Block, HbmPool, PluginBytes};
pub use snapshot::{BlockSnapshot, BlockState, PoolSnapshot, SegmentSnapshot};
pub use stats::{Gauge, MemoryStats, Stat};

/// Every block is a multiple of this many bytes (rule 1).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest rounded request served by the small pool (rule 2).
pub const SMALL_REQUEST_MAX: u64 = 1 << 20;
/// Size of every small-pool segment (rule 3).
pub const SMALL_SEGMENT_SIZE: u64 = 2 << 20;
/// Size of a shared large-pool segment (rule 3).
pub const LARGE_SEGMENT_SIZE: u64 = 20 << 20;
/// Rounded requests below this share 20 MiB segments; larger ones get their own (rule 3).
pub const LARGE_SEGMENT_CUTOFF: u64 = 10 << 20;
/// Every segment size is a multiple of this (rule 3).
pub const SEGMENT_GRANULE: u64 = 2 << 20;
/// A large-pool block splits only if the remainder is larger than this (rule 5).
pub const LARGE_SPLIT_THRESHOLD: u64 = 1 << 20;
/// Most quick blocks a pool kind keeps parked unmerged (rule 9). Small, so
/// that an allocation that finds no quick block loses little to the scan.
pub const QUICK_LIST_LEN: usize = 32;

/// Which of the two pools of rule 2 a block lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolKind {
    Small = 0,
    Large = 1,
}

impl PoolKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolKind::Small => "small",
            PoolKind::Large => "large",
        }
    }
}

/// Rule 1: `bytes` rounded up to a multiple of 512, at least 512. `None`
/// when the rounding overflows (such a request can never be served).
pub fn round_size(bytes: u64) -> Option<u64> {
    if bytes == 0 {
        return Some(MIN_BLOCK_SIZE);
    }
    round_up(bytes, MIN_BLOCK_SIZE)
}

/// Rule 2: the pool a rounded request is served from.
pub fn pool_for(rounded: u64) -> PoolKind {
    if rounded <= SMALL_REQUEST_MAX {
        PoolKind::Small
    } else {
        PoolKind::Large
    }
}

/// Rule 3: the segment the pool asks for when nothing cached fits.
pub fn segment_size_for(rounded: u64) -> Option<u64> {
    match pool_for(rounded) {
        PoolKind::Small => Some(SMALL_SEGMENT_SIZE),
        PoolKind::Large if rounded < LARGE_SEGMENT_CUTOFF => Some(LARGE_SEGMENT_SIZE),
        PoolKind::Large => round_up(rounded, SEGMENT_GRANULE),
    }
}

/// Rules 3 and 9: the smallest segment that can hold the rounded request.
pub fn min_segment_size_for(rounded: u64) -> Option<u64> {
    round_up(rounded, SEGMENT_GRANULE)
}

/// Rule 5: whether a free block with `remainder` bytes left over splits.
pub fn splits(pool: PoolKind, remainder: u64) -> bool {
    match pool {
        PoolKind::Small => remainder >= MIN_BLOCK_SIZE,
        PoolKind::Large => remainder > LARGE_SPLIT_THRESHOLD,
    }
}

/// `1.50 GiB`, `100.00 MiB`, `512 bytes`: for messages.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// Whether `value` is a multiple of `alignment`, a power of two.
pub(crate) fn is_aligned(value: u64, alignment: u64) -> bool {
    value & (alignment - 1) == 0
}

fn round_up(value: u64, multiple: u64) -> Option<u64> {
    Some(value.checked_add(multiple - 1)? / multiple * multiple)
}
