//! Compile cache: every executable the runtime runs (one op, a fused group,
//! a whole graph) comes from here, for every platform.
//!
//! # What the cache promises
//!
//! 1. **Key.** An executable is identified by a [`CacheKey`]: the graph's
//!    canonical fingerprint, the platform name, the platform version (for
//!    XLA: plugin version and build) and the compile options as one
//!    canonical string. Equal keys mean interchangeable executables; any
//!    field that differs means a different entry. [`CacheKey::digest`] is
//!    stable across processes and machines and names the entry on disk.
//! 2. **Lookup order.** [`CompileCache::get_or_compile`] returns the
//!    executable from memory, else from disk (the platform's `load` turns
//!    the stored bytes back into an executable), else from `compile`, and
//!    then keeps it in memory, and on disk when `compile` returned bytes.
//! 3. **Once per key.** Threads of one process that ask for the same key at
//!    the same time share one load or compile: the first does the work, the
//!    others wait for its result (an error included). If the first panics,
//!    one of the waiters takes over. Separate processes may both compile a
//!    key; the last rename wins and both files are whole.
//! 4. **Bounded memory.** At most `memory_entries` executables stay in
//!    memory; the least recently used goes first, and each such eviction is
//!    counted. Callers holding an evicted `Arc` keep a working executable.
//!    The runtime's memos in front of the cache (eager ops' entries,
//!    defer-and-fuse's compiled recordings) hold executables weakly, so
//!    this is also the bound on what the runtime keeps loaded; they report
//!    their hits through a [`UseMark`], so what they use counts as used. A platform
//!    whose programs strain a resource the count does not see (XLA CPU's
//!    JIT code takes 3 to 60 memory mappings a program, and the process
//!    has `vm.max_map_count` of them) says so after a compile or load, and
//!    the least recently used half is evicted ([`Compiler`]).
//! 5. **Shared, untrusted disk.** Several processes may share one directory.
//!    An entry is written to a uniquely named temp file in that directory
//!    and renamed into place, so a reader sees a whole old file or a whole
//!    new one. A file is used only if its magic, format version, key,
//!    lengths and checksums all match (layout below); otherwise it is
//!    counted as corrupt or foreign, never used, and replaced by the entry
//!    rebuilt for the request. A payload that `load` rejects counts as
//!    corrupt too.
//! 6. **Disk is best effort.** A failed write is counted and otherwise
//!    ignored: the caller still gets its executable. An unreadable entry is
//!    counted and treated as absent.
//! 7. **Switches.** In cache-only mode a request that neither memory nor
//!    disk can serve fails with [`Error::FailedPrecondition`] naming the
//!    graph (fingerprint and first lines of its text); nothing compiles.
//!    Dump-on-miss writes the graph text of every miss to
//!    `<dump dir>/<digest>.txt`. `describe`, which renders the graph text,
//!    runs only for those two (never on a hit).
//!
//! # Where the disk cache lives
//!
//! [`CacheConfig::from_env`]: `TPURT_CACHE_DIR` (`off` disables the disk
//! cache), else `$XDG_CACHE_HOME/tpurt`, else `$HOME/.cache/tpurt`. A
//! config with `disk_dir: None` has no disk cache.
//!
//! # Entry file `<dir>/<digest>.entry` (all integers little-endian)
//!
//! | offset | bytes | field                                                   |
//! |--------|-------|---------------------------------------------------------|
//! | 0      | 8     | magic `TPURTEXE`                                        |
//! | 8      | 4     | format version, u32 ([`FORMAT_VERSION`])                |
//! | 12     | 4     | header length `H`, u32                                  |
//! | 16     | H     | header, compact JSON: `{"key":{"graph","platform","platform_version","options"},"payload_len","payload_checksum"}` |
//! | 16+H   | 32    | header checksum: FNV-1a 128 of magic, version and header, 32 hex digits |
//! | 48+H   | N     | payload (the serialized executable), `N = payload_len`, FNV-1a 128 = `payload_checksum` |
//!
//! The file is exactly `48 + H + N` bytes. Another magic, another format
//! version or another key is *foreign*; anything else that does not check
//! out (short file, extra bytes, checksum mismatch) is *corrupt*. The
//! format version is also part of the digest, so builds that write other
//! formats use other file names and never overwrite each other's entries.
//!
//! Shape buckets ([`BucketPolicy`]) keep the number of distinct keys small
//! when a dimension varies from call to call.

pub mod buckets;
mod compiler;
mod disk;
mod key;
mod lru;
pub mod options;
mod stats;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

pub use buckets::BucketPolicy;
pub use compiler::Compiler;
pub use disk::{ENTRY_SUFFIX, FORMAT_VERSION, MAGIC};
pub use key::{canonical_options, CacheKey};
pub use lru::UseMark;
pub use stats::CacheStats;

use crate::error::{Error, Result};
use disk::Rejection;
use lru::Lru;
use stats::{add_time, bump, Counters};

/// How many lines of the graph text a cache-only error quotes.
const ERROR_GRAPH_LINES: usize = 12;

/// How a [`CompileCache`] is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Executables kept in memory; 0 keeps none.
    pub memory_entries: usize,
    /// The shared disk directory, or `None` for no disk cache.
    pub disk_dir: Option<PathBuf>,
}

impl CacheConfig {
    pub const DEFAULT_MEMORY_ENTRIES: usize = 4096;

    /// The default memory bound and the disk directory from the
    /// environment (see the module comment).
    pub fn from_env() -> Self {
        CacheConfig {
            memory_entries: Self::DEFAULT_MEMORY_ENTRIES,
            disk_dir: disk::resolve_dir(|name| std::env::var(name).ok()),
        }
    }

    /// No disk cache; at most `entries` executables in memory.
    pub fn memory_only(entries: usize) -> Self {
        CacheConfig {
            memory_entries: entries,
            disk_dir: None,
        }
    }

    pub fn with_disk_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.disk_dir = Some(dir.into());
        self
    }
}

impl Default for CacheConfig {
    /// The default memory bound, no disk cache.
    fn default() -> Self {
        Self::memory_only(Self::DEFAULT_MEMORY_ENTRIES)
    }
}

/// The disk directory the environment names, if any: `TPURT_CACHE_DIR`
/// (`off` for none), else `$XDG_CACHE_HOME/tpurt`, else
/// `$HOME/.cache/tpurt`.
pub fn default_disk_dir() -> Option<PathBuf> {
    disk::resolve_dir(|name| std::env::var(name).ok())
}

enum FlightState<E: ?Sized> {
    Running,
    Done(Result<Arc<E>>),
    /// The building thread panicked; a waiter takes over.
    Abandoned,
}

/// One key being loaded or compiled; other requests for it wait here.
struct Flight<E: ?Sized> {
    state: Mutex<FlightState<E>>,
    changed: Condvar,
}

impl<E: ?Sized> Flight<E> {
    fn new() -> Self {
        Flight {
            state: Mutex::new(FlightState::Running),
            changed: Condvar::new(),
        }
    }

    fn settle(&self, state: FlightState<E>) {
        *lock(&self.state) = state;
        self.changed.notify_all();
    }

    /// The builder's result, or `None` if it panicked.
    fn wait(&self) -> Option<Result<Arc<E>>> {
        let mut state = lock(&self.state);
        loop {
            match &*state {
                FlightState::Running => {
                    state = self
                        .changed
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner)
                }
                FlightState::Done(result) => return Some(result.clone()),
                FlightState::Abandoned => return None,
            }
        }
    }
}

struct Memory<E: ?Sized> {
    entries: Lru<CacheKey, Arc<E>>,
    in_flight: HashMap<CacheKey, Arc<Flight<E>>>,
}

/// Locks a mutex whose data stays consistent even if a holder panicked
/// (no closure of the caller ever runs under these locks).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A cache of executables of type `E` (for example `dyn Executable`),
/// shared by reference between threads. See the module comment for what
/// it promises.
pub struct CompileCache<E: ?Sized + Send + Sync> {
    memory: Mutex<Memory<E>>,
    disk_dir: Option<PathBuf>,
    cache_only: AtomicBool,
    dump_dir: Mutex<Option<PathBuf>>,
    buckets: Mutex<BucketPolicy>,
    counters: Counters,
}

impl<E: ?Sized + Send + Sync> fmt::Debug for CompileCache<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompileCache")
            .field("memory_capacity", &self.memory_capacity())
            .field("disk_dir", &self.disk_dir)
            .field("cache_only", &self.cache_only())
            .field("dump_on_miss", &self.dump_on_miss())
            .field("stats", &self.stats())
            .finish()
    }
}

/// Removes an unfinished flight if its builder unwinds, so waiters retry
/// instead of waiting forever.
struct FlightGuard<'a, E: ?Sized + Send + Sync> {
    cache: &'a CompileCache<E>,
    key: &'a CacheKey,
    flight: Arc<Flight<E>>,
    finished: bool,
}

impl<E: ?Sized + Send + Sync> FlightGuard<'_, E> {
    fn finish(mut self, result: &Result<Arc<E>>) {
        {
            let mut memory = lock(&self.cache.memory);
            if let Ok(exe) = result {
                let evicted = memory.entries.insert(self.key.clone(), exe.clone());
                self.cache
                    .counters
                    .evictions
                    .fetch_add(evicted, Ordering::Relaxed);
            }
            memory.in_flight.remove(self.key);
        }
        self.flight.settle(FlightState::Done(result.clone()));
        self.finished = true;
    }
}

impl<E: ?Sized + Send + Sync> Drop for FlightGuard<'_, E> {
    fn drop(&mut self) {
        if !self.finished {
            lock(&self.cache.memory).in_flight.remove(self.key);
            self.flight.settle(FlightState::Abandoned);
        }
    }
}

/// What the disk had for a key.
enum DiskLookup<E: ?Sized> {
    Hit(Arc<E>),
    Absent,
    /// A file was there but not usable; it was counted.
    Rejected,
}

/// The graph text, rendered at most once and only when asked for.
struct GraphText<D> {
    describe: Option<D>,
    text: Option<String>,
}

impl<D: FnOnce() -> String> GraphText<D> {
    fn get(&mut self) -> &str {
        if self.text.is_none() {
            let describe = self.describe.take();
            self.text = Some(describe.map(|d| d()).unwrap_or_default());
        }
        self.text.as_deref().unwrap_or_default()
    }
}

impl<E: ?Sized + Send + Sync> CompileCache<E> {
    pub fn new(config: CacheConfig) -> Self {
        if let Some(dir) = &config.disk_dir {
            // Temp files of processes killed mid-write (never read).
            disk::sweep_dead_writers(dir);
        }
        CompileCache {
            memory: Mutex::new(Memory {
                entries: Lru::new(config.memory_entries),
                in_flight: HashMap::new(),
            }),
            disk_dir: config.disk_dir,
            cache_only: AtomicBool::new(false),
            dump_dir: Mutex::new(None),
            buckets: Mutex::new(BucketPolicy::default()),
            counters: Counters::default(),
        }
    }

    /// A cache set up by [`CacheConfig::from_env`].
    pub fn from_env() -> Self {
        Self::new(CacheConfig::from_env())
    }

    /// The executable for `key`: from memory, else from disk through
    /// `load`, else from `compile` (which may also return the bytes to
    /// store on disk). `describe` renders the graph text; it runs only for
    /// a cache-only error or a dump on miss.
    ///
    /// Errors: the error of `compile`, or [`Error::FailedPrecondition`] in
    /// cache-only mode. Errors are not cached: the next request tries again.
    pub fn get_or_compile<D, C, L>(
        &self,
        key: &CacheKey,
        describe: D,
        compile: C,
        load: L,
    ) -> Result<Arc<E>>
    where
        D: FnOnce() -> String,
        C: FnOnce() -> Result<(Arc<E>, Option<Vec<u8>>)>,
        L: FnOnce(&[u8]) -> Result<Arc<E>>,
    {
        bump(&self.counters.requests);
        let flight = loop {
            let mut memory = lock(&self.memory);
            if let Some(exe) = memory.entries.get(key) {
                bump(&self.counters.memory_hits);
                return Ok(exe);
            }
            if let Some(flight) = memory.in_flight.get(key).cloned() {
                drop(memory);
                if let Some(result) = flight.wait() {
                    bump(&self.counters.coalesced);
                    return result;
                }
                // The builder panicked; try again, perhaps as the builder.
                continue;
            }
            let flight = Arc::new(Flight::new());
            memory.in_flight.insert(key.clone(), flight.clone());
            break flight;
        };
        let guard = FlightGuard {
            cache: self,
            key,
            flight,
            finished: false,
        };
        let result = self.build(key, describe, compile, load);
        guard.finish(&result);
        result
    }

    /// The miss path, run by one thread per key at a time.
    fn build<D, C, L>(&self, key: &CacheKey, describe: D, compile: C, load: L) -> Result<Arc<E>>
    where
        D: FnOnce() -> String,
        C: FnOnce() -> Result<(Arc<E>, Option<Vec<u8>>)>,
        L: FnOnce(&[u8]) -> Result<Arc<E>>,
    {
        let digest = key.digest();
        let mut rejected = false;
        if let Some(dir) = &self.disk_dir {
            let start = Instant::now();
            let lookup = self.read_disk(dir, &digest, key, load);
            add_time(&self.counters.disk_load_nanos, start.elapsed());
            match lookup {
                DiskLookup::Hit(exe) => {
                    bump(&self.counters.disk_hits);
                    return Ok(exe);
                }
                DiskLookup::Absent => {}
                DiskLookup::Rejected => rejected = true,
            }
        }

        let mut text = GraphText {
            describe: Some(describe),
            text: None,
        };
        if let Some(dump_dir) = self.dump_on_miss() {
            let path = dump_dir.join(format!("{digest}.txt"));
            let body = format!("// {key}\n// digest {digest}\n{}\n", text.get());
            let written = fs::create_dir_all(&dump_dir).and_then(|()| fs::write(&path, body));
            if written.is_err() {
                bump(&self.counters.dump_errors);
            }
        }
        if self.cache_only() {
            bump(&self.counters.cache_only_refusals);
            return Err(cache_only_error(key, &digest, text.get()));
        }

        bump(&self.counters.misses);
        let start = Instant::now();
        let compiled = compile();
        add_time(&self.counters.compile_nanos, start.elapsed());
        let (exe, bytes) = compiled?;

        if let Some(dir) = &self.disk_dir {
            match bytes {
                Some(payload) => {
                    let file = disk::encode(key, &payload);
                    if disk::write_atomic(dir, &digest, &file).is_err() {
                        bump(&self.counters.disk_write_errors);
                    }
                }
                // Nothing to replace a bad file with: at least stop
                // counting it on every request.
                None if rejected => {
                    let _ = fs::remove_file(disk::entry_path(dir, &digest));
                }
                None => {}
            }
        }
        Ok(exe)
    }

    fn read_disk<L>(&self, dir: &Path, digest: &str, key: &CacheKey, load: L) -> DiskLookup<E>
    where
        L: FnOnce(&[u8]) -> Result<Arc<E>>,
    {
        let file = match fs::read(disk::entry_path(dir, digest)) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return DiskLookup::Absent,
            Err(_) => {
                bump(&self.counters.disk_read_errors);
                return DiskLookup::Absent;
            }
        };
        match disk::decode(key, &file) {
            Ok(payload) => match load(&file[payload]) {
                Ok(exe) => DiskLookup::Hit(exe),
                Err(_) => {
                    bump(&self.counters.corrupt_entries);
                    DiskLookup::Rejected
                }
            },
            Err(Rejection::Corrupt(_)) => {
                bump(&self.counters.corrupt_entries);
                DiskLookup::Rejected
            }
            Err(Rejection::Foreign(_)) => {
                bump(&self.counters.foreign_entries);
                DiskLookup::Rejected
            }
        }
    }

    /// The counters, and the number of entries in memory now.
    pub fn stats(&self) -> CacheStats {
        let entries = lock(&self.memory).entries.len();
        self.counters.snapshot(entries)
    }

    /// Sets every counter to zero (the memory gauge stays).
    pub fn reset_stats(&self) {
        self.counters.reset();
    }

    /// In cache-only mode a miss is an error instead of a compile.
    pub fn set_cache_only(&self, on: bool) {
        self.cache_only.store(on, Ordering::Relaxed);
    }

    pub fn cache_only(&self) -> bool {
        self.cache_only.load(Ordering::Relaxed)
    }

    /// `Some(dir)`: every miss writes its graph text to
    /// `<dir>/<digest>.txt` (the directory is created if needed).
    pub fn set_dump_on_miss(&self, dir: Option<PathBuf>) {
        *lock(&self.dump_dir) = dir;
    }

    pub fn dump_on_miss(&self) -> Option<PathBuf> {
        lock(&self.dump_dir).clone()
    }

    /// The shape-bucket policy that frontends pad dynamic dimensions by
    /// (the torch binding's compiled graphs do), so that many sizes share
    /// a few executables.
    pub fn bucket_policy(&self) -> BucketPolicy {
        lock(&self.buckets).clone()
    }

    pub fn set_bucket_policy(&self, policy: BucketPolicy) {
        *lock(&self.buckets) = policy;
    }

    /// The bucket a dynamic dimension of size `n` is padded up to.
    pub fn bucket(&self, n: u64) -> u64 {
        lock(&self.buckets).bucket(n)
    }

    /// The disk directory, if this cache has one.
    pub fn disk_dir(&self) -> Option<&Path> {
        self.disk_dir.as_deref()
    }

    pub fn memory_capacity(&self) -> usize {
        lock(&self.memory).entries.capacity()
    }

    /// Changes the memory bound; entries beyond it are evicted (and
    /// counted) at once.
    pub fn set_memory_capacity(&self, entries: usize) {
        let evicted = lock(&self.memory).entries.set_capacity(entries);
        self.counters
            .evictions
            .fetch_add(evicted, Ordering::Relaxed);
    }

    /// A mark through which a memo in front of the cache reports its hits
    /// on `key`'s entry, so that a program used only through the memo is
    /// not the first evicted; detached (marking nothing) when the entry is
    /// not in memory.
    pub fn use_mark(&self, key: &CacheKey) -> UseMark {
        lock(&self.memory)
            .entries
            .use_mark(key)
            .unwrap_or_else(UseMark::detached)
    }

    /// Evicts the least recently used half of the entries in memory
    /// (counted as evictions), for a platform short of room for loaded
    /// programs ([`crate::platform::Platform::loaded_code_pressure`]);
    /// returns how many it evicted.
    pub fn evict_older_half(&self) -> u64 {
        let mut memory = lock(&self.memory);
        let half = memory.entries.len().div_ceil(2);
        let evicted = memory.entries.evict_oldest(half);
        drop(memory);
        self.counters
            .evictions
            .fetch_add(evicted, Ordering::Relaxed);
        evicted
    }

    /// Drops the entries in memory and/or on disk. Only entry and temp
    /// files are removed from the directory, never other files. Not counted
    /// as evictions; loads and compiles in flight still store their result.
    pub fn clear(&self, memory: bool, disk: bool) -> Result<()> {
        if memory {
            lock(&self.memory).entries.clear();
        }
        if let (true, Some(dir)) = (disk, &self.disk_dir) {
            disk::clear_dir(dir).map_err(|e| {
                Error::Unavailable(format!(
                    "could not clear the compile cache directory {}: {e}",
                    dir.display()
                ))
            })?;
        }
        Ok(())
    }
}

fn cache_only_error(key: &CacheKey, digest: &str, text: &str) -> Error {
    let total = text.lines().count();
    let mut quoted: Vec<&str> = text.lines().take(ERROR_GRAPH_LINES).collect();
    let more = format!(
        "... ({} more lines)",
        total.saturating_sub(ERROR_GRAPH_LINES)
    );
    if total > ERROR_GRAPH_LINES {
        quoted.push(&more);
    }
    Error::FailedPrecondition(format!(
        "the compile cache is cache-only and has no executable for graph {} \
         (platform {} {}, options {}, entry {digest}); turn cache-only off to \
         compile it. The graph:\n{}",
        key.graph,
        key.platform,
        key.platform_version,
        key.options,
        quoted.join("\n")
    ))
}
