//! Cache counters: lock-free to bump, read together as [`CacheStats`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

/// What the cache has done since it was made or since `reset_stats`.
///
/// Every request ends as exactly one of: a memory hit, a disk hit, a miss
/// (a compile, successful or not), a coalesced wait (another thread was
/// already building the same key; this one took its result) or a
/// cache-only refusal. So `requests` is their sum once no request is in
/// flight.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CacheStats {
    pub requests: u64,
    pub memory_hits: u64,
    pub disk_hits: u64,
    /// Compiles run (the compile closure was called).
    pub misses: u64,
    /// Requests that waited for another thread's load or compile of the
    /// same key and shared its result.
    pub coalesced: u64,
    /// Misses refused because the cache is in cache-only mode.
    pub cache_only_refusals: u64,
    /// Time in the compile closure.
    pub compile_seconds: f64,
    /// Time reading, checking and loading disk entries (hits and rejects).
    pub disk_load_seconds: f64,
    /// Disk entries that were damaged (torn, truncated, bit flips) or whose
    /// payload the platform failed to load.
    pub corrupt_entries: u64,
    /// Disk entries that were intact but not ours: another magic, another
    /// format version, another key.
    pub foreign_entries: u64,
    /// Entries pushed out of memory by the entry limit.
    pub evictions: u64,
    /// Entries not written to disk because of an I/O error.
    pub disk_write_errors: u64,
    /// Disk entries that exist but could not be read (not counting absent).
    pub disk_read_errors: u64,
    /// Dumps on miss that could not be written.
    pub dump_errors: u64,
    /// Entries in memory now (a gauge, not reset).
    pub memory_entries: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub requests: AtomicU64,
    pub memory_hits: AtomicU64,
    pub disk_hits: AtomicU64,
    pub misses: AtomicU64,
    pub coalesced: AtomicU64,
    pub cache_only_refusals: AtomicU64,
    pub compile_nanos: AtomicU64,
    pub disk_load_nanos: AtomicU64,
    pub corrupt_entries: AtomicU64,
    pub foreign_entries: AtomicU64,
    pub evictions: AtomicU64,
    pub disk_write_errors: AtomicU64,
    pub disk_read_errors: AtomicU64,
    pub dump_errors: AtomicU64,
}

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn add_time(counter: &AtomicU64, d: Duration) {
    counter.fetch_add(
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

impl Counters {
    fn all(&self) -> [&AtomicU64; 14] {
        [
            &self.requests,
            &self.memory_hits,
            &self.disk_hits,
            &self.misses,
            &self.coalesced,
            &self.cache_only_refusals,
            &self.compile_nanos,
            &self.disk_load_nanos,
            &self.corrupt_entries,
            &self.foreign_entries,
            &self.evictions,
            &self.disk_write_errors,
            &self.disk_read_errors,
            &self.dump_errors,
        ]
    }

    pub fn reset(&self) {
        for c in self.all() {
            c.store(0, Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self, memory_entries: usize) -> CacheStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let seconds = |c: &AtomicU64| get(c) as f64 * 1e-9;
        CacheStats {
            requests: get(&self.requests),
            memory_hits: get(&self.memory_hits),
            disk_hits: get(&self.disk_hits),
            misses: get(&self.misses),
            coalesced: get(&self.coalesced),
            cache_only_refusals: get(&self.cache_only_refusals),
            compile_seconds: seconds(&self.compile_nanos),
            disk_load_seconds: seconds(&self.disk_load_nanos),
            corrupt_entries: get(&self.corrupt_entries),
            foreign_entries: get(&self.foreign_entries),
            evictions: get(&self.evictions),
            disk_write_errors: get(&self.disk_write_errors),
            disk_read_errors: get(&self.disk_read_errors),
            dump_errors: get(&self.dump_errors),
            memory_entries: memory_entries as u64,
        }
    }
}
