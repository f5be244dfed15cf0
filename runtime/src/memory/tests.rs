//! Unit tests: one rule of the module comment at a time.

use std::sync::Arc;

use super::test_platform::TestPlatform;
use super::*;
use crate::error::Error;
use crate::stream::{StreamClock, StreamId};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

fn pool(capacity: u64) -> (HbmPool, Arc<TestPlatform>) {
    let platform = TestPlatform::new();
    (HbmPool::new(0, capacity, platform.clone()), platform)
}

fn clock() -> Arc<StreamClock> {
    StreamClock::new(StreamId::fresh())
}

/// A stream with one unfinished task; returns its sequence number.
fn busy(clock: &StreamClock) -> u64 {
    clock.submit()
}

fn segment_addr(block: &Block) -> usize {
    Arc::as_ptr(block.segment()) as *const () as usize
}

fn ok(pool: &HbmPool) {
    if let Err(e) = pool.check_invariants() {
        panic!("invariant broken: {e}");
    }
}

#[test]
fn pool_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<HbmPool>();
    assert_send_sync::<Block>();
}

#[test]
fn rounding_and_pool_choice() {
    assert_eq!(round_size(0), Some(512));
    assert_eq!(round_size(1), Some(512));
    assert_eq!(round_size(512), Some(512));
    assert_eq!(round_size(513), Some(1024));
    assert_eq!(round_size(u64::MAX), None);
    assert_eq!(pool_for(MIB), PoolKind::Small);
    assert_eq!(pool_for(MIB + 512), PoolKind::Large);
    assert_eq!(segment_size_for(4 * KIB), Some(2 * MIB));
    assert_eq!(segment_size_for(3 * MIB), Some(20 * MIB));
    assert_eq!(segment_size_for(10 * MIB), Some(10 * MIB));
    assert_eq!(segment_size_for(11 * MIB + 512), Some(12 * MIB));

    let (pool, _) = pool(1 << 30);
    let s = clock();
    let zero = pool.allocate(0, &s).unwrap();
    assert_eq!((zero.size(), zero.requested()), (512, 0));
    let huge = pool.allocate(11 * MIB + 1, &s).unwrap();
    assert_eq!(
        huge.size(),
        12 * MIB,
        "remainder of 1 MiB - 512 does not split"
    );
    let big = pool.allocate(3 * MIB, &s).unwrap();
    let snap = pool.snapshot();
    let layout: Vec<(PoolKind, u64)> = snap.segments.iter().map(|s| (s.pool, s.size)).collect();
    assert_eq!(
        layout,
        vec![
            (PoolKind::Small, 2 * MIB),
            (PoolKind::Large, 12 * MIB),
            (PoolKind::Large, 20 * MIB)
        ]
    );
    ok(&pool);
    for b in [zero, big, huge] {
        pool.free(b);
    }
    ok(&pool);
}

#[test]
fn small_blocks_split_and_merge_back() {
    let (pool, _) = pool(1 << 30);
    let s = clock();
    busy(&s); // merging on one stream must not wait for the stream
    let a = pool.allocate(1000, &s).unwrap();
    let b = pool.allocate(1000, &s).unwrap();
    assert_eq!((a.offset(), a.size()), (0, 1024));
    assert_eq!((b.offset(), b.size()), (1024, 1024));
    assert_eq!(segment_addr(&a), segment_addr(&b));
    let sizes: Vec<u64> = pool.snapshot().segments[0]
        .blocks
        .iter()
        .map(|b| b.size)
        .collect();
    assert_eq!(sizes, vec![1024, 1024, 2 * MIB - 2048]);
    pool.free(a);
    ok(&pool);
    assert_eq!(
        pool.snapshot().segments[0].blocks.len(),
        3,
        "a's right neighbour is b"
    );
    pool.free(b);
    ok(&pool);
    let snap = pool.snapshot();
    assert_eq!(snap.segments[0].blocks.len(), 1);
    assert_eq!(snap.segments[0].blocks[0].size, 2 * MIB);
}

#[test]
fn large_blocks_split_only_above_one_mib() {
    let (pool, _) = pool(1 << 30);
    let s = clock();
    let a = pool.allocate(19 * MIB + MIB / 2, &s).unwrap();
    assert_eq!(
        a.size(),
        20 * MIB,
        "a remainder of 512 KiB stays with the block"
    );
    let b = pool.allocate(2 * MIB, &s).unwrap();
    assert_eq!(b.size(), 2 * MIB, "a remainder of 18 MiB splits");
    let c = pool.allocate(17 * MIB, &s).unwrap();
    assert_eq!(c.size(), 18 * MIB, "the 1 MiB left over does not split");
    assert_eq!(pool.stats().num_segments.current, 2);
    ok(&pool);
    for x in [a, b, c] {
        pool.free(x);
    }
    ok(&pool);
}

#[test]
fn best_fit_takes_the_smallest_block_that_fits() {
    let (pool, _) = pool(1 << 30);
    let s = clock();
    let x = pool.allocate(4 * KIB, &s).unwrap();
    let keep1 = pool.allocate(512, &s).unwrap();
    let y = pool.allocate(2 * KIB, &s).unwrap();
    let keep2 = pool.allocate(512, &s).unwrap();
    let y_offset = y.offset();
    pool.free(x);
    pool.free(y);
    let z = pool.allocate(2 * KIB, &s).unwrap();
    assert_eq!(
        z.offset(),
        y_offset,
        "2 KiB hole beats 4 KiB hole and the tail"
    );
    for b in [keep1, keep2, z] {
        pool.free(b);
    }
    ok(&pool);
}

#[test]
fn reuse_on_the_same_stream_is_immediate() {
    let (pool, _) = pool(1 << 30);
    let s = clock();
    busy(&s);
    let a = pool.allocate(5 * MIB, &s).unwrap();
    let (seg, offset) = (segment_addr(&a), a.offset());
    pool.free(a);
    let b = pool.allocate(5 * MIB, &s).unwrap();
    assert_eq!((segment_addr(&b), b.offset()), (seg, offset));
    assert_eq!(pool.stats().num_segment_allocs, 1);
    pool.free(b);
    ok(&pool);
}

#[test]
fn other_stream_waits_for_the_free_fence() {
    // Capacity for one segment only, so "cannot reuse" shows as OOM.
    let (pool, _) = pool(2 * MIB);
    let (s1, s2) = (clock(), clock());
    let task = busy(&s1);
    let a = pool.allocate(MIB, &s1).unwrap();
    let b = pool.allocate(MIB, &s1).unwrap();
    pool.free(a);
    pool.free(b);
    let err = pool.allocate(MIB, &s2).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory(_)), "{err}");
    assert_eq!(pool.empty_cache(), 0, "unsettled memory stays");
    ok(&pool);
    // The owner stream may reuse it while its work still runs.
    let c = pool.allocate(MIB, &s1).unwrap();
    pool.free(c);
    s1.complete(task);
    let d = pool.allocate(MIB, &s2).unwrap();
    assert_eq!((d.offset(), d.stream()), (0, s2.id()));
    assert_eq!(pool.stats().num_segment_allocs, 1);
    pool.free(d);
    ok(&pool);
}

#[test]
fn record_stream_delays_reuse_and_counts_as_active() {
    let (pool, _) = pool(2 * MIB);
    let (s1, s2) = (clock(), clock());
    let a = pool.allocate(MIB, &s1).unwrap();
    pool.record_stream(&a, &s2);
    pool.record_stream(&a, &s2); // twice is once
    pool.record_stream(&a, &s1); // own stream: no-op
    let task = busy(&s2);
    pool.free(a);
    let stats = pool.stats();
    assert_eq!(stats.allocated_bytes.current, 0);
    assert_eq!(stats.active_bytes.current, MIB);
    assert_eq!(stats.requested_bytes.current, MIB);
    let snap = pool.snapshot();
    assert_eq!(
        snap.segments[0].blocks[0].state,
        BlockState::ActivePendingFree
    );
    ok(&pool);

    // Not even its own stream may reuse it yet.
    let b = pool.allocate(MIB, &s1).unwrap();
    assert_eq!(b.offset(), MIB);
    assert!(matches!(
        pool.allocate(MIB, &s1),
        Err(Error::OutOfMemory(_))
    ));
    ok(&pool);

    s2.complete(task);
    let c = pool.allocate(MIB, &s1).unwrap();
    assert_eq!(c.offset(), 0);
    assert_eq!(pool.stats().active_bytes.current, 2 * MIB);
    pool.free(b);
    pool.free(c);
    ok(&pool);
}

#[test]
fn record_stream_on_an_idle_stream_frees_at_once() {
    let (pool, _) = pool(1 << 30);
    let (s1, s2) = (clock(), clock());
    let a = pool.allocate(4 * KIB, &s1).unwrap();
    pool.record_stream(&a, &s2);
    pool.free(a);
    let stats = pool.stats();
    assert_eq!(stats.active_bytes.current, 0);
    assert!(pool.snapshot().segments[0]
        .blocks
        .iter()
        .all(|b| b.state == BlockState::Inactive));
    ok(&pool);
}

#[test]
fn oom_message_says_what_was_asked_held_and_cached() {
    let (pool, _) = pool(16 * MIB);
    let s = clock();
    let a = pool.allocate(10 * MIB, &s).unwrap();
    // 2 MiB cached but not releasable: freed on a stream that still runs.
    let other = clock();
    busy(&other);
    pool.free(pool.allocate(KIB, &other).unwrap());
    let err = pool.allocate(8 * MIB, &s).unwrap_err();
    let Error::OutOfMemory(msg) = &err else {
        panic!("expected OOM, got {err}")
    };
    assert_eq!(
        msg,
        "chip 0: tried to allocate 8.00 MiB (8388608 bytes); capacity 16.00 MiB, \
         10.00 MiB allocated, 12.00 MiB reserved, 2.00 MiB free in the cache"
    );
    let stats = pool.stats();
    assert_eq!((stats.num_ooms, stats.num_alloc_retries), (1, 1));

    // Larger than the capacity: fails at once, no retry.
    let err = pool.allocate(17 * MIB, &s).unwrap_err();
    assert!(
        err.to_string().contains("17.00 MiB (17825792 bytes)"),
        "{err}"
    );
    assert!(err.to_string().contains("more than the capacity"), "{err}");
    assert!(pool.allocate(u64::MAX, &s).is_err());
    let stats = pool.stats();
    assert_eq!((stats.num_ooms, stats.num_alloc_retries), (3, 1));
    pool.free(a);
    ok(&pool);
}

#[test]
fn format_bytes_uses_binary_units() {
    assert_eq!(format_bytes(0), "0 bytes");
    assert_eq!(format_bytes(1023), "1023 bytes");
    assert_eq!(format_bytes(1 << 30), "1.00 GiB");
    assert_eq!(format_bytes(100 * MIB), "100.00 MiB");
    assert_eq!(format_bytes(15 * (1 << 30) + (1 << 29)), "15.50 GiB");
}

#[test]
fn retry_after_releasing_the_cache_succeeds() {
    // A naive allocator keeping its 2 MiB cache would fail the 19 MiB request.
    let (pool, platform) = pool(20 * MIB);
    let s = clock();
    let a = pool.allocate(4 * KIB, &s).unwrap();
    pool.free(a);
    assert_eq!(pool.stats().reserved_bytes.current, 2 * MIB);
    let big = pool.allocate(19 * MIB, &s).unwrap();
    assert_eq!(big.size(), 20 * MIB);
    let stats = pool.stats();
    assert_eq!(stats.num_alloc_retries, 1);
    assert_eq!(stats.num_segment_frees, 1);
    assert_eq!(stats.num_ooms, 0);
    assert_eq!(platform.live_bytes(), 20 * MIB);
    pool.free(big);
    ok(&pool);
}

#[test]
fn a_twenty_mib_segment_shrinks_to_fit_the_capacity() {
    let (pool, _) = pool(16 * MIB);
    let s = clock();
    let a = pool.allocate(3 * MIB, &s).unwrap();
    assert_eq!(pool.stats().reserved_bytes.current, 4 * MIB);
    assert_eq!(pool.stats().num_alloc_retries, 0);
    pool.free(a);
    ok(&pool);
}

#[test]
fn retry_covers_platform_failures() {
    let (pool, platform) = pool(1 << 30);
    let s = clock();
    let cached = pool.allocate(4 * KIB, &s).unwrap();
    pool.free(cached);
    platform.fail_next(1);
    let a = pool.allocate(5 * MIB, &s).unwrap();
    assert_eq!(pool.stats().num_alloc_retries, 1);
    assert_eq!(
        pool.stats().num_segment_frees,
        1,
        "the retry released the cache"
    );

    platform.fail_next(2);
    let err = pool.allocate(30 * MIB, &s).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory(_)));
    assert!(err.to_string().contains("platform failed"), "{err}");
    assert_eq!(pool.stats().num_ooms, 1);
    pool.free(a);
    ok(&pool);
}

#[test]
fn empty_cache_releases_only_settled_wholly_free_segments() {
    let (pool, platform) = pool(1 << 30);
    let (s1, s2, s3) = (clock(), clock(), clock());
    // 10 MiB requests get exact 10 MiB segments, one block each.
    let c = pool.allocate(10 * MIB, &s3).unwrap();
    let task = busy(&s1);
    let a = pool.allocate(10 * MIB, &s1).unwrap();
    pool.free(a); // unsettled: s1 still runs
    let b = pool.allocate(10 * MIB, &s2).unwrap();
    assert_eq!(
        pool.stats().num_segments.current,
        3,
        "s2 may not reuse a yet"
    );
    pool.free(b); // settled: s2 is idle
    assert_eq!(pool.empty_cache(), 10 * MIB);
    ok(&pool);
    assert_eq!(pool.empty_cache(), 0);
    s1.complete(task);
    assert_eq!(pool.empty_cache(), 10 * MIB);
    let stats = pool.stats();
    assert_eq!(stats.reserved_bytes.current, 10 * MIB);
    assert_eq!(stats.num_segment_frees, 2);
    assert_eq!(platform.live_bytes(), 10 * MIB);
    pool.free(c);
    assert_eq!(pool.empty_cache(), 10 * MIB);
    assert_eq!(platform.live_bytes(), 0);
    ok(&pool);
}

#[test]
fn empty_cache_waits_for_the_fresh_tail_of_a_busy_stream() {
    let (pool, _) = pool(1 << 30);
    let (s1, s2) = (clock(), clock());
    let task = busy(&s1);
    let a = pool.allocate(4 * KIB, &s1).unwrap();
    // The rest of a's segment counts as freed on s1, which still runs.
    let b = pool.allocate(4 * KIB, &s2).unwrap();
    assert_ne!(segment_addr(&a), segment_addr(&b));
    pool.free(a);
    pool.free(b);
    assert_eq!(pool.empty_cache(), 2 * MIB, "only b's segment is settled");
    s1.complete(task);
    assert_eq!(pool.empty_cache(), 2 * MIB);
    assert_eq!(pool.stats().num_segments.current, 0);
    ok(&pool);
}

#[test]
fn settled_blocks_of_different_streams_merge_on_free() {
    let (pool, _) = pool(1 << 30);
    let (s1, s2) = (clock(), clock());
    let a = pool.allocate(4 * KIB, &s1).unwrap();
    let b = pool.allocate(4 * KIB, &s2).unwrap(); // s1 idle: reuses the settled tail
    assert_eq!(segment_addr(&a), segment_addr(&b));
    pool.free(a);
    pool.free(b);
    let snap = pool.snapshot();
    assert_eq!(snap.segments.len(), 1);
    assert_eq!(snap.segments[0].blocks.len(), 1);
    ok(&pool);
}

#[test]
fn peak_stats_reset_to_current() {
    let (pool, _) = pool(1 << 30);
    let s = clock();
    let a = pool.allocate(10 * MIB, &s).unwrap();
    let b = pool.allocate(10 * MIB, &s).unwrap();
    pool.free(a);
    let before = pool.stats();
    assert_eq!(before.allocated_bytes.current, 10 * MIB);
    assert_eq!(before.allocated_bytes.peak, 20 * MIB);
    assert_eq!(before.allocated_bytes.allocated, 20 * MIB);
    assert_eq!(before.allocated_bytes.freed, 10 * MIB);
    assert_eq!((before.num_alloc, before.num_free), (2, 1));
    assert_eq!(pool.empty_cache(), 10 * MIB);
    pool.reset_peak_stats();
    let after = pool.stats();
    for stat in [
        after.allocated_bytes,
        after.reserved_bytes,
        after.active_bytes,
        after.requested_bytes,
    ] {
        assert_eq!(stat.peak, stat.current);
    }
    assert_eq!(after.reserved_bytes.peak, 10 * MIB);
    assert_eq!(after.num_segments.peak, 1);
    assert_eq!(
        after.allocated_bytes.allocated,
        20 * MIB,
        "totals survive a reset"
    );
    pool.free(b);
    ok(&pool);
}

/// Platform memory held for a while counts in `plugin_bytes` while its
/// guard lives, peaks and resets like the other statistics, and stays out
/// of the pool's own figures.
#[test]
fn plugin_bytes_count_while_held() {
    let (pool, _) = pool(1 << 30);
    let s = clock();
    let a = pool.allocate(MIB, &s).unwrap();
    {
        let _x = pool.hold_plugin_bytes(3 * MIB);
        let _empty = pool.hold_plugin_bytes(0);
        {
            let _y = pool.hold_plugin_bytes(MIB);
            let st = pool.stats();
            assert_eq!(
                (st.plugin_bytes.current, st.plugin_bytes.peak),
                (4 * MIB, 4 * MIB)
            );
        }
        let st = pool.stats();
        assert_eq!(
            (st.plugin_bytes.current, st.plugin_bytes.peak),
            (3 * MIB, 4 * MIB)
        );
        assert_eq!(
            st.allocated_bytes.current, MIB,
            "plugin bytes are not the pool's"
        );
        ok(&pool);
        pool.reset_peak_stats();
        assert_eq!(pool.stats().plugin_bytes.peak, 3 * MIB);
    }
    let st = pool.stats().plugin_bytes;
    assert_eq!(
        (st.current, st.peak, st.allocated, st.freed),
        (0, 3 * MIB, 4 * MIB, 4 * MIB)
    );
    assert_eq!(pool.stats().reserved_bytes.current, 2 * MIB);
    pool.free(a);
    ok(&pool);
}

#[test]
fn snapshot_json_shape() {
    let (pool, _) = pool(64 * MIB);
    let s = clock();
    let a = pool.allocate(1000, &s).unwrap();
    let json: serde_json::Value = serde_json::from_str(&pool.snapshot().to_json()).unwrap();
    assert_eq!(json["capacity"], 64 * MIB);
    assert_eq!(json["chip"], 0);
    let segment = &json["segments"][0];
    assert_eq!(segment["pool"], "small");
    assert_eq!(segment["size"], 2 * MIB);
    assert_eq!(segment["allocated_bytes"], 1024);
    assert!(segment["segment_id"].is_u64());
    let blocks = segment["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0]["state"], "active_allocated");
    assert_eq!(blocks[0]["requested"], 1000);
    assert_eq!(blocks[0]["stream"], s.id().0);
    assert_eq!(blocks[1]["state"], "inactive");
    assert_eq!(blocks[1]["offset"], 1024);

    let stats = serde_json::to_value(pool.stats()).unwrap();
    assert_eq!(stats["allocated_bytes"]["current"], 1024);
    assert_eq!(stats["num_segments"]["peak"], 1);
    pool.free(a);
}

#[test]
fn foreign_blocks_are_refused() {
    let (p1, _) = pool(1 << 30);
    let (p2, _) = pool(1 << 30);
    let s = clock();
    let a = p1.allocate(KIB, &s).unwrap();
    assert!(matches!(
        p2.try_record_stream(&a, &clock()),
        Err(Error::InvalidArgument(_))
    ));
    let b = p1.allocate(KIB, &s).unwrap();
    assert!(matches!(p2.try_free(b), Err(Error::InvalidArgument(_))));
    assert_eq!(p2.stats().num_free, 0);
    p1.free(a);
    ok(&p1);
    ok(&p2);
}

#[test]
fn concurrent_allocate_and_free() {
    let (pool, _) = pool(1 << 30);
    let pool = Arc::new(pool);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                let s = clock();
                for i in 0..300u64 {
                    let a = pool.allocate((i * 7919 + t) % (3 * MIB), &s).unwrap();
                    let b = pool.allocate(512 * (i % 5), &s).unwrap();
                    pool.free(a);
                    pool.free(b);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    ok(&pool);
    let stats = pool.stats();
    assert_eq!(stats.allocated_bytes.current, 0);
    assert_eq!(stats.num_alloc, 2400);
    pool.empty_cache();
    assert_eq!(pool.stats().reserved_bytes.current, 0);
}

#[test]
fn empty_cache_coalesces_blocks_that_settled_after_their_free() {
    let (pool, _) = pool(1 << 30);
    let (s1, s2) = (clock(), clock());
    let a = pool.allocate(4 * KIB, &s1).unwrap();
    let task = busy(&s2);
    let b = pool.allocate(4 * KIB, &s2).unwrap(); // s1 is idle: its tail is settled
    assert_eq!((segment_addr(&a), b.offset()), (segment_addr(&b), 4 * KIB));
    pool.free(b); // unsettled on s2: merges with nothing
    pool.free(a); // settled on s1, but its neighbour b is not
    assert_eq!(pool.snapshot().segments[0].blocks.len(), 3);
    ok(&pool);
    s2.complete(task);
    assert_eq!(pool.empty_cache(), 2 * MIB);
    assert_eq!(pool.stats().num_segments.current, 0);
    ok(&pool);
}

fn quick(pool: &HbmPool) -> Vec<(PoolKind, StreamId, u64)> {
    pool.quick_blocks()
}

#[test]
fn exact_size_reuse_takes_the_quick_block() {
    let (pool, _) = pool(1 << 30);
    let s = clock();
    busy(&s); // same-stream reuse must not wait for the stream
    let a = pool.allocate(4000, &s).unwrap();
    let keep = pool.allocate(KIB, &s).unwrap();
    let (seg, offset) = (segment_addr(&a), a.offset());
    pool.free(a);
    assert_eq!(quick(&pool), vec![(PoolKind::Small, s.id(), 4 * KIB)]);
    let stats = pool.stats();
    assert_eq!(
        (stats.active_bytes.current, stats.requested_bytes.current),
        (KIB, KIB),
        "a quick block is in the cache, not active"
    );
    ok(&pool);

    // Another rounded size does not take it; the same rounded size does.
    let other = pool.allocate(2 * KIB, &s).unwrap();
    assert_ne!(other.offset(), offset);
    let b = pool.allocate(4 * KIB - 100, &s).unwrap();
    assert_eq!(
        (segment_addr(&b), b.offset(), b.size()),
        (seg, offset, 4 * KIB)
    );
    assert_eq!((b.requested(), b.stream()), (4 * KIB - 100, s.id()));
    assert!(quick(&pool).is_empty());
    assert_eq!(pool.stats().num_alloc, 4);
    ok(&pool);
    for block in [b, other, keep] {
        pool.free(block);
    }
    assert_eq!(quick(&pool).len(), 3);
    ok(&pool);
}

#[test]
fn quick_reuse_keys_on_the_rounded_request_not_the_block_size() {
    let (pool, _) = pool(1 << 30);
    let s = clock();
    // 19.5 MiB leaves 512 KiB of its 20 MiB segment: too little to split.
    let a = pool.allocate(19 * MIB + MIB / 2, &s).unwrap();
    assert_eq!(a.size(), 20 * MIB);
    pool.free(a);
    assert_eq!(
        quick(&pool),
        vec![(PoolKind::Large, s.id(), 19 * MIB + MIB / 2)]
    );
    ok(&pool);
    let b = pool.allocate(19 * MIB + MIB / 2 - 1, &s).unwrap();
    assert_eq!(b.size(), 20 * MIB, "handed out as it is");
    pool.free(b);
    // 19 MiB rounds differently: best fit, after flushing, takes the block.
    let c = pool.allocate(19 * MIB, &s).unwrap();
    assert_eq!((c.offset(), c.size()), (0, 20 * MIB));
    assert!(quick(&pool).is_empty());
    assert_eq!(pool.stats().num_segment_allocs, 1);
    pool.free(c);
    ok(&pool);
}

#[test]
fn another_stream_takes_a_quick_block_only_once_settled() {
    let (pool, _) = pool(1 << 30);
    let (s1, s2) = (clock(), clock());
    let x = pool.allocate(4 * KIB, &s2).unwrap(); // the rest stays free on s2
    let task = busy(&s1);
    let a = pool.allocate(4 * KIB, &s1).unwrap(); // s2 is idle: its rest is settled
    let (seg, offset) = (segment_addr(&a), a.offset());
    pool.free(a); // quick, and s1 still runs
    assert_eq!(quick(&pool), vec![(PoolKind::Small, s1.id(), 4 * KIB)]);
    let b = pool.allocate(4 * KIB, &s2).unwrap();
    assert_ne!(
        (segment_addr(&b), b.offset()),
        (seg, offset),
        "s1's work may still use a's memory"
    );
    assert_eq!(quick(&pool).len(), 1, "the quick block waits for s1");
    ok(&pool);

    s1.complete(task);
    let c = pool.allocate(4 * KIB, &s2).unwrap();
    assert_eq!(
        (segment_addr(&c), c.offset(), c.stream()),
        (seg, offset, s2.id())
    );
    assert!(quick(&pool).is_empty());
    assert_eq!(pool.stats().num_segment_allocs, 1);
    ok(&pool);
    for block in [x, b, c] {
        pool.free(block);
    }
    ok(&pool);
}

#[test]
fn quick_blocks_are_flushed_before_a_new_segment() {
    let (pool, _) = pool(1 << 30);
    let s = clock();
    let quarters: Vec<Block> = (0..4)
        .map(|_| pool.allocate(MIB / 2, &s).unwrap())
        .collect();
    let seg = segment_addr(&quarters[0]);
    assert_eq!(
        pool.stats().num_segments.current,
        1,
        "four quarters fill it"
    );
    for block in quarters {
        pool.free(block);
    }
    assert_eq!(quick(&pool).len(), 4);
    // No quick block is 1 MiB and no free block fits: flushing merges the
    // quarters, and the segment serves the request.
    let whole = pool.allocate(MIB, &s).unwrap();
    assert_eq!((segment_addr(&whole), whole.offset()), (seg, 0));
    assert!(quick(&pool).is_empty());
    let stats = pool.stats();
    assert_eq!(stats.reserved_bytes.current, 2 * MIB);
    assert_eq!((stats.num_segment_allocs, stats.num_alloc_retries), (1, 0));
    pool.free(whole);
    ok(&pool);
}

#[test]
fn an_allocation_retry_flushes_every_quick_list() {
    let (pool, platform) = pool(20 * MIB);
    let s = clock();
    pool.free(pool.allocate(4 * KIB, &s).unwrap());
    assert_eq!(quick(&pool), vec![(PoolKind::Small, s.id(), 4 * KIB)]);
    // The large pool's own flush finds nothing; only the retry releases the
    // small segment that a quick block held.
    let big = pool.allocate(19 * MIB, &s).unwrap();
    assert!(quick(&pool).is_empty());
    let stats = pool.stats();
    assert_eq!((stats.num_alloc_retries, stats.num_segment_frees), (1, 1));
    assert_eq!(platform.live_bytes(), 20 * MIB);
    pool.free(big);
    ok(&pool);
}

#[test]
fn empty_cache_releases_segments_held_only_by_quick_blocks() {
    let (pool, platform) = pool(1 << 30);
    let (s1, s2) = (clock(), clock());
    let a = pool.allocate(10 * MIB, &s1).unwrap(); // a whole 10 MiB segment
    let b = pool.allocate(4 * KIB, &s2).unwrap();
    pool.free(a);
    pool.free(b);
    assert_eq!(quick(&pool).len(), 2);
    ok(&pool);
    assert_eq!(pool.empty_cache(), 12 * MIB);
    assert!(quick(&pool).is_empty());
    assert_eq!(pool.stats().num_segments.current, 0);
    assert_eq!(platform.live_bytes(), 0);
    ok(&pool);
}

#[test]
fn the_quick_list_is_bounded_and_flushes_oldest_first() {
    let (pool, _) = pool(1 << 30);
    let s = clock();
    // Distinct sizes, so no block could stand in for another.
    let blocks: Vec<Block> = (1..=QUICK_LIST_LEN as u64 + 1)
        .map(|i| pool.allocate(512 * i, &s).unwrap())
        .collect();
    let first_offset = blocks[0].offset();
    for block in blocks {
        pool.free(block);
        ok(&pool);
    }
    let listed = quick(&pool);
    assert_eq!(listed.len(), QUICK_LIST_LEN);
    assert_eq!(listed[0].2, 1024, "the 512-byte block was flushed");
    // The flushed block is an ordinary free block again: best fit finds it.
    let again = pool.allocate(512, &s).unwrap();
    assert_eq!(again.offset(), first_offset);
    assert_eq!(quick(&pool).len(), QUICK_LIST_LEN);
    pool.free(again);
    assert_eq!(quick(&pool).len(), QUICK_LIST_LEN);
    ok(&pool);
}

#[test]
fn blocks_waiting_for_recorded_streams_skip_the_quick_list() {
    let (pool, _) = pool(1 << 30);
    let (s1, s2) = (clock(), clock());
    let a = pool.allocate(4 * KIB, &s1).unwrap();
    pool.record_stream(&a, &s2);
    let task = busy(&s2);
    pool.free(a);
    assert!(quick(&pool).is_empty(), "pending, not quick");
    s2.complete(task);
    pool.stats(); // polls the pending list
    assert!(quick(&pool).is_empty(), "a pending block becomes free");
    let snap = pool.snapshot();
    assert_eq!(snap.segments[0].blocks.len(), 1, "and merged");
    ok(&pool);

    // Recorded on a stream that is already idle: freed at once, so quick.
    let b = pool.allocate(4 * KIB, &s1).unwrap();
    pool.record_stream(&b, &s2);
    pool.free(b);
    assert_eq!(quick(&pool), vec![(PoolKind::Small, s1.id(), 4 * KIB)]);
    ok(&pool);
}

#[test]
fn a_snapshot_flushes_the_quick_lists() {
    let (pool, _) = pool(1 << 30);
    let s = clock();
    let a = pool.allocate(4 * KIB, &s).unwrap();
    pool.free(a);
    assert_eq!(quick(&pool).len(), 1);
    let snap = pool.snapshot();
    assert!(quick(&pool).is_empty());
    let blocks = &snap.segments[0].blocks;
    assert_eq!(blocks.len(), 1);
    assert_eq!(
        (blocks[0].size, blocks[0].state, blocks[0].stream),
        (2 * MIB, BlockState::Inactive, s.id())
    );
    ok(&pool);
}

#[test]
fn device_addresses_are_unique_disjoint_and_follow_offsets() {
    let (pool, _) = pool(1 << 30);
    let (other, _) = self::pool(1 << 30);
    let s = clock();
    let mut live: Vec<Block> = Vec::new();
    let mut others: Vec<Block> = Vec::new();
    for bytes in [512, 4 * KIB, 600 * KIB, 3 * MIB, 512, 64 * MIB] {
        live.push(pool.allocate(bytes, &s).unwrap());
        others.push(other.allocate(bytes, &s).unwrap());
    }
    // A block freed and taken back (the quick list) keeps its address.
    let back = live.remove(1);
    let (addr, size) = (back.address(), back.size());
    pool.free(back);
    let again = pool.allocate(size, &s).unwrap();
    assert_eq!(again.address(), addr);
    live.push(again);
    // Blocks of one segment sit at the segment's address plus their offset.
    for b in live.iter().chain(&others) {
        assert_eq!(b.address() % 512, 0);
        assert!(b.address() >= 1 << 40);
        for c in &live {
            if Arc::ptr_eq(b.segment(), c.segment()) {
                assert_eq!(b.address() - b.offset(), c.address() - c.offset());
            }
        }
    }
    let mut ranges: Vec<(u64, u64)> = live
        .iter()
        .chain(&others)
        .map(|b| (b.address(), b.size()))
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "ranges overlap: {w:?}");
    }
    live.into_iter().for_each(|b| pool.free(b));
    others.into_iter().for_each(|b| other.free(b));
    ok(&pool);
    ok(&other);
}
