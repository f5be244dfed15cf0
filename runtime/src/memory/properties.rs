//! Property tests: random sequences of pool operations and stream progress;
//! the stated invariants must hold after every step.

use std::collections::VecDeque;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::sample::Index;

use super::test_platform::TestPlatform;
use super::*;
use crate::error::Error;
use crate::stream::{Fence, StreamClock, StreamId};

const MIB: u64 = 1 << 20;
const STREAMS: usize = 3;

#[derive(Clone, Debug)]
enum Op {
    Allocate {
        bytes: u64,
        stream: usize,
    },
    Free {
        index: Index,
    },
    /// Free a live block, then allocate its size again on `stream`: the
    /// pattern quick blocks (rule 9) serve, on the same or another stream.
    FreeAndAllocate {
        index: Index,
        stream: usize,
    },
    /// Free every live block, newest first (the end of a step): enough
    /// frees at once to overflow a quick list.
    FreeAll,
    /// Free the newest live block (what `FreeAll` expands to).
    FreeLast,
    RecordStream {
        index: Index,
        stream: usize,
    },
    Submit {
        stream: usize,
    },
    CompleteOne {
        stream: usize,
    },
    CompleteAll {
        stream: usize,
    },
    EmptyCache,
    FailNextSegment,
}

/// A few sizes, so that the same rounded request comes back often.
const COMMON_SIZES: [u64; 6] = [0, 4000, 4096, 256 << 10, 3 * MIB, 12 * MIB + 1];

fn request_size() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => proptest::sample::select(&COMMON_SIZES[..]),
        3 => 0u64..=8192,
        2 => 0u64..=MIB,
        2 => MIB + 1..=12 * MIB,
        1 => 10 * MIB..=40 * MIB,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (request_size(), 0..STREAMS).prop_map(|(bytes, stream)| Op::Allocate { bytes, stream }),
        5 => any::<Index>().prop_map(|index| Op::Free { index }),
        3 => (any::<Index>(), 0..STREAMS).prop_map(|(index, stream)| Op::FreeAndAllocate { index, stream }),
        1 => Just(Op::FreeAll),
        2 => (any::<Index>(), 0..STREAMS).prop_map(|(index, stream)| Op::RecordStream { index, stream }),
        3 => (0..STREAMS).prop_map(|stream| Op::Submit { stream }),
        2 => (0..STREAMS).prop_map(|stream| Op::CompleteOne { stream }),
        1 => (0..STREAMS).prop_map(|stream| Op::CompleteAll { stream }),
        1 => Just(Op::EmptyCache),
        1 => Just(Op::FailNextSegment),
    ]
}

/// Steps of many small allocations, each followed by freeing everything
/// and a few random operations: enough frees at once to overflow the quick
/// lists (rule 9).
fn steps() -> impl Strategy<Value = Vec<Op>> {
    let small = (
        prop_oneof![Just(512u64), Just(4000), Just(4096), 0u64..=64 << 10],
        0..STREAMS,
    )
        .prop_map(|(bytes, stream)| Op::Allocate { bytes, stream });
    let step = (
        proptest::collection::vec(small, 20..60),
        proptest::collection::vec(op(), 0..12),
    );
    proptest::collection::vec(step, 1..4).prop_map(|steps| {
        steps
            .into_iter()
            .flat_map(|(allocations, others)| {
                allocations.into_iter().chain([Op::FreeAll]).chain(others)
            })
            .collect()
    })
}

fn segment_addr(block: &Block) -> usize {
    Arc::as_ptr(block.segment()) as *const () as usize
}

/// The per-step checks: invariants, no overlap, stats agree with live blocks.
fn check_step(pool: &HbmPool, live: &[Block]) -> std::result::Result<(), TestCaseError> {
    pool.check_invariants().map_err(TestCaseError::fail)?;
    let mut ranges: Vec<(usize, u64, u64)> = live
        .iter()
        .map(|b| (segment_addr(b), b.offset(), b.offset() + b.size()))
        .collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        prop_assert!(
            pair[0].0 != pair[1].0 || pair[0].2 <= pair[1].1,
            "live blocks overlap: {:?} and {:?}",
            pair[0],
            pair[1]
        );
    }
    for b in live {
        prop_assert!(is_aligned(b.size(), MIN_BLOCK_SIZE) && b.size() >= b.requested());
        prop_assert!(b.offset() + b.size() <= b.segment().len());
    }
    let stats = pool.stats();
    prop_assert_eq!(
        stats.allocated_bytes.current,
        live.iter().map(Block::size).sum::<u64>()
    );
    for stat in [
        stats.allocated_bytes,
        stats.reserved_bytes,
        stats.active_bytes,
        stats.requested_bytes,
    ] {
        prop_assert!(stat.peak >= stat.current, "{:?}", stat);
    }
    prop_assert!(stats.num_segments.peak >= stats.num_segments.current);
    prop_assert!(stats.reserved_bytes.current >= stats.allocated_bytes.current);
    prop_assert!(stats.active_bytes.current >= stats.allocated_bytes.current);
    prop_assert!(stats.reserved_bytes.current <= pool.capacity());
    Ok(())
}

/// A freed range and what must finish before another stream (`fence`) or
/// any stream (`waits`, from record_stream) may use it: rules 6 and 7,
/// checked from outside the pool.
struct FreedRange {
    segment: usize,
    start: u64,
    end: u64,
    fence: Fence,
    waits: Vec<Fence>,
}

impl FreedRange {
    fn settled(&self) -> bool {
        self.fence.is_complete() && self.waits.iter().all(Fence::is_complete)
    }

    fn reusable_by(&self, stream: StreamId) -> bool {
        (self.fence.stream() == stream || self.fence.is_complete())
            && self.waits.iter().all(Fence::is_complete)
    }
}

fn run_ops(capacity: u64, ops: Vec<Op>) -> std::result::Result<(), TestCaseError> {
    let platform = TestPlatform::new();
    let pool = HbmPool::new(0, capacity, platform.clone());
    let clocks: Vec<Arc<StreamClock>> = (0..STREAMS)
        .map(|_| StreamClock::new(StreamId::fresh()))
        .collect();
    let mut live: Vec<Block> = Vec::new();
    // Streams named by record_stream, per live block (same index as `live`).
    let mut recorded: Vec<Vec<usize>> = Vec::new();
    let mut freed: Vec<FreedRange> = Vec::new();

    let mut ops: VecDeque<Op> = ops.into();
    while let Some(op) = ops.pop_front() {
        match op {
            Op::Allocate { bytes, stream } => {
                let ooms = pool.stats().num_ooms;
                match pool.allocate(bytes, &clocks[stream]) {
                    Ok(block) => {
                        prop_assert_eq!(block.stream(), clocks[stream].id());
                        prop_assert_eq!(block.requested(), bytes);
                        let (segment, start) = (segment_addr(&block), block.offset());
                        let end = start + block.size();
                        for range in &freed {
                            let overlaps =
                                range.segment == segment && range.start < end && start < range.end;
                            prop_assert!(
                                !overlaps || range.reusable_by(block.stream()),
                                "stream {} got [{}, {}) while work of stream {} may still use it",
                                block.stream(),
                                start,
                                end,
                                range.fence.stream()
                            );
                        }
                        live.push(block);
                        recorded.push(Vec::new());
                    }
                    Err(Error::OutOfMemory(msg)) => {
                        prop_assert!(msg.starts_with("chip 0: tried to allocate"), "{}", msg);
                        prop_assert!(msg.contains(&format!("({bytes} bytes)")), "{}", msg);
                        prop_assert_eq!(pool.stats().num_ooms, ooms + 1);
                        // Unless the platform failed, an OOM means no segment for
                        // the request fits next to what is still reserved.
                        if !msg.contains("platform") {
                            let rounded = round_size(bytes).unwrap();
                            let needed = min_segment_size_for(rounded).unwrap();
                            prop_assert!(
                                pool.stats().reserved_bytes.current + needed > capacity,
                                "OOM although {} fits: {}",
                                needed,
                                msg
                            );
                        }
                    }
                    Err(other) => prop_assert!(false, "unexpected error {}", other),
                }
            }
            Op::Free { .. } | Op::FreeLast => {
                if !live.is_empty() {
                    let i = match op {
                        Op::Free { index } => index.index(live.len()),
                        _ => live.len() - 1,
                    };
                    let block = live.swap_remove(i);
                    let streams = recorded.swap_remove(i);
                    let owner = clocks.iter().find(|c| c.id() == block.stream()).unwrap();
                    freed.push(FreedRange {
                        segment: segment_addr(&block),
                        start: block.offset(),
                        end: block.offset() + block.size(),
                        fence: owner.fence(),
                        waits: streams.iter().map(|s| clocks[*s].fence()).collect(),
                    });
                    pool.free(block);
                }
            }
            Op::FreeAndAllocate { index, stream } => {
                if !live.is_empty() {
                    let bytes = live[index.index(live.len())].requested();
                    ops.push_front(Op::Allocate { bytes, stream });
                    ops.push_front(Op::Free { index });
                }
                continue;
            }
            Op::FreeAll => {
                for _ in 0..live.len() {
                    ops.push_front(Op::FreeLast);
                }
                continue;
            }
            Op::RecordStream { index, stream } => {
                if !live.is_empty() {
                    let i = index.index(live.len());
                    pool.record_stream(&live[i], &clocks[stream]);
                    // Naming the block's own stream changes nothing (rule 7).
                    if clocks[stream].id() != live[i].stream() {
                        recorded[i].push(stream);
                    }
                }
            }
            Op::Submit { stream } => {
                clocks[stream].submit();
            }
            Op::CompleteOne { stream } => {
                let clock = &clocks[stream];
                if clock.completed() < clock.submitted() {
                    clock.complete(clock.completed() + 1);
                }
            }
            Op::CompleteAll { stream } => {
                let clock = &clocks[stream];
                clock.complete(clock.submitted());
            }
            Op::EmptyCache => {
                let before = pool.stats().reserved_bytes.current;
                let released = pool.empty_cache();
                prop_assert_eq!(pool.stats().reserved_bytes.current, before - released);
            }
            Op::FailNextSegment => platform.fail_next(1),
        }
        check_step(&pool, &live)?;
        freed.retain(|range| !range.settled());
    }

    for clock in &clocks {
        clock.complete(clock.submitted());
    }
    for block in live.drain(..) {
        pool.free(block);
    }
    pool.empty_cache();
    pool.check_invariants().map_err(TestCaseError::fail)?;
    let stats = pool.stats();
    prop_assert_eq!(stats.reserved_bytes.current, 0);
    prop_assert_eq!(stats.active_bytes.current, 0);
    prop_assert_eq!(stats.requested_bytes.current, 0);
    prop_assert_eq!(stats.num_segments.current, 0);
    prop_assert_eq!(platform.live_bytes(), 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_after_every_step(
        capacity in 24 * MIB..=160 * MIB,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        run_ops(capacity, ops)?;
    }

    #[test]
    fn invariants_hold_when_quick_lists_overflow(
        capacity in 24 * MIB..=160 * MIB,
        ops in steps(),
    ) {
        run_ops(capacity, ops)?;
    }

    /// From any state: allocate n, free it, allocate n again on the same
    /// stream: the same block comes back (rule 9), and reserved memory does
    /// not grow.
    #[test]
    fn freed_memory_is_reused_on_the_same_stream(
        setup in proptest::collection::vec((request_size(), 0..STREAMS, any::<bool>(), any::<bool>()), 0..40),
        n in request_size(),
        stream in 0..STREAMS,
    ) {
        let platform = TestPlatform::new();
        let pool = HbmPool::new(0, 1 << 40, platform);
        let clocks: Vec<Arc<StreamClock>> = (0..STREAMS)
            .map(|_| StreamClock::new(StreamId::fresh()))
            .collect();
        let mut live = Vec::new();
        for (bytes, s, free_it, busy) in setup {
            if busy {
                clocks[s].submit();
            }
            let block = pool.allocate(bytes, &clocks[s]).unwrap();
            if free_it {
                pool.free(block);
            } else {
                live.push(block);
            }
        }
        let first = pool.allocate(n, &clocks[stream]).unwrap();
        let place = (segment_addr(&first), first.offset(), first.size());
        let reserved = pool.stats().reserved_bytes.current;
        pool.free(first);
        pool.check_invariants().map_err(TestCaseError::fail)?;
        let second = pool.allocate(n, &clocks[stream]).unwrap();
        prop_assert_eq!((segment_addr(&second), second.offset(), second.size()), place);
        let stats = pool.stats();
        prop_assert_eq!(stats.reserved_bytes.current, reserved);
        pool.free(second);
        for block in live {
            pool.free(block);
        }
        pool.check_invariants().map_err(TestCaseError::fail)?;
    }

    /// A batch of equal-size blocks, freed and allocated again on the same
    /// stream, fits in the segments of the first batch.
    #[test]
    fn a_freed_batch_is_reused(
        n in request_size(),
        count in 1usize..24,
        busy in any::<bool>(),
    ) {
        let pool = HbmPool::new(0, 1 << 40, TestPlatform::new());
        let clock = StreamClock::new(StreamId::fresh());
        if busy {
            clock.submit();
        }
        let batch: Vec<Block> = (0..count).map(|_| pool.allocate(n, &clock).unwrap()).collect();
        let reserved = pool.stats().reserved_bytes.current;
        for block in batch {
            pool.free(block);
        }
        let batch: Vec<Block> = (0..count).map(|_| pool.allocate(n, &clock).unwrap()).collect();
        prop_assert_eq!(pool.stats().reserved_bytes.current, reserved);
        for block in batch {
            pool.free(block);
        }
        pool.check_invariants().map_err(TestCaseError::fail)?;
    }
}
