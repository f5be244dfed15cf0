//! Stream clocks and fences: the cheapest form of an event.
//!
//! Every stream counts the tasks submitted to it and the tasks it has
//! finished (run, failed or skipped). A [`Fence`] is a stream plus a
//! submission count; it is complete once the stream has finished that many
//! tasks. Because tasks on a stream finish in order, a fence taken after a
//! task was submitted completes only after that task. Fences cost two atomic
//! loads, which is why the HBM pool uses them for stream-ordered reuse.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Process-wide unique stream id (never reused, so a stale id can't alias).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct StreamId(pub u64);

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

impl StreamId {
    pub fn fresh() -> Self {
        StreamId(NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed))
    }
}

#[derive(Debug)]
pub struct StreamClock {
    id: StreamId,
    submitted: AtomicU64,
    completed: AtomicU64,
}

impl StreamClock {
    pub fn new(id: StreamId) -> Arc<Self> {
        Arc::new(StreamClock {
            id,
            submitted: AtomicU64::new(0),
            completed: AtomicU64::new(0),
        })
    }

    pub fn id(&self) -> StreamId {
        self.id
    }

    /// A fence covering every task submitted so far.
    pub fn fence(self: &Arc<Self>) -> Fence {
        Fence {
            clock: Arc::clone(self),
            seq: self.submitted.load(Ordering::SeqCst),
        }
    }

    /// Reserve the next submission number (called when a task is enqueued).
    pub fn submit(&self) -> u64 {
        self.submitted.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Mark task `seq` finished. Tasks finish in order, so this is a store.
    pub fn complete(&self, seq: u64) {
        self.completed.store(seq, Ordering::SeqCst);
    }

    pub fn submitted(&self) -> u64 {
        self.submitted.load(Ordering::SeqCst)
    }

    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::SeqCst)
    }

    pub fn is_idle(&self) -> bool {
        self.completed() >= self.submitted()
    }
}

/// "Everything submitted to stream X up to now": complete once X has
/// finished its first `seq` tasks.
#[derive(Clone, Debug)]
pub struct Fence {
    clock: Arc<StreamClock>,
    seq: u64,
}

impl Fence {
    pub fn is_complete(&self) -> bool {
        self.clock.completed() >= self.seq
    }

    pub fn stream(&self) -> StreamId {
        self.clock.id
    }

    pub fn seq(&self) -> u64 {
        self.seq
    }

    pub fn clock(&self) -> &Arc<StreamClock> {
        &self.clock
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_completes_in_order() {
        let c = StreamClock::new(StreamId::fresh());
        let empty = c.fence();
        assert!(empty.is_complete(), "a fence on an idle stream is complete");
        let s1 = c.submit();
        let f1 = c.fence();
        let s2 = c.submit();
        let f2 = c.fence();
        assert!(!f1.is_complete() && !f2.is_complete());
        c.complete(s1);
        assert!(f1.is_complete() && !f2.is_complete());
        c.complete(s2);
        assert!(f2.is_complete());
        assert!(c.is_idle());
    }
}
