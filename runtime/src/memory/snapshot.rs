//! The memory snapshot (rule 13 of the module comment): every segment and
//! block of one pool, for debugging fragmentation and leaks.

use super::PoolKind;
use crate::stream::StreamId;

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PoolSnapshot {
    pub chip: usize,
    pub capacity: u64,
    /// Sum of segment sizes.
    pub reserved_bytes: u64,
    /// Sum of allocated block sizes.
    pub allocated_bytes: u64,
    /// In order of creation.
    pub segments: Vec<SegmentSnapshot>,
}

impl PoolSnapshot {
    pub fn to_json(&self) -> String {
        // Serializing plain structs of numbers and strings cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SegmentSnapshot {
    pub segment_id: u64,
    pub size: u64,
    /// Sum of the sizes of its allocated blocks.
    pub allocated_bytes: u64,
    pub pool: PoolKind,
    /// In address order; they tile the segment.
    pub blocks: Vec<BlockSnapshot>,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BlockSnapshot {
    pub offset: u64,
    pub size: u64,
    /// Bytes the caller asked for; 0 for inactive blocks.
    pub requested: u64,
    pub state: BlockState,
    /// Allocated: the stream it was allocated for; otherwise the stream it was freed on.
    pub stream: StreamId,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Held by a caller.
    ActiveAllocated,
    /// Freed, but waiting for streams named by record_stream.
    ActivePendingFree,
    /// In the cache.
    Inactive,
}
