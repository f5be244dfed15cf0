use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::error::ErrorCode;
use crate::ir::{BinaryOp, DType, Graph, GraphBuilder, TensorType};

/// A stand-in executable: its "serialized form" is its text.
#[derive(Debug, PartialEq)]
struct Exe(String);

type Cache = CompileCache<Exe>;

/// A directory under the system temp dir, removed when dropped (also when
/// a test fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        static SEQUENCE: AtomicUsize = AtomicUsize::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "tpurt-compile-test-{name}-{}-{nanos}-{}",
            std::process::id(),
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn key(name: &str) -> CacheKey {
    CacheKey::new(name, "host", "0.1.0", canonical_options([("opt", "2")]))
}

fn disk_cache(dir: &Path) -> Cache {
    Cache::new(CacheConfig::memory_only(16).with_disk_dir(dir))
}

fn no_describe() -> String {
    panic!("describe must not run on this path")
}

/// Compiles `text` into an executable with bytes; counts calls.
fn compile_counted<'a>(
    text: &str,
    calls: &'a AtomicUsize,
) -> impl FnOnce() -> Result<(Arc<Exe>, Option<Vec<u8>>)> + 'a {
    let text = text.to_string();
    move || {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok((Arc::new(Exe(text.clone())), Some(text.into_bytes())))
    }
}

fn load_text(bytes: &[u8]) -> Result<Arc<Exe>> {
    String::from_utf8(bytes.to_vec())
        .map(|t| Arc::new(Exe(t)))
        .map_err(|e| Error::invalid(e.to_string()))
}

fn no_load(_: &[u8]) -> Result<Arc<Exe>> {
    panic!("load must not run on this path")
}

fn no_compile() -> Result<(Arc<Exe>, Option<Vec<u8>>)> {
    panic!("compile must not run on this path")
}

/// Gets `key` from `cache`, compiling `text` if needed; returns the text.
fn get(cache: &Cache, key: &CacheKey, text: &str) -> String {
    let calls = AtomicUsize::new(0);
    let exe = cache
        .get_or_compile(key, no_describe, compile_counted(text, &calls), load_text)
        .unwrap();
    exe.0.clone()
}

fn sample_graph() -> Graph {
    let mut b = GraphBuilder::new();
    let x = b.param(TensorType::new(DType::F32, &[2, 3]));
    let y = b.binary(BinaryOp::Add, x, x).unwrap();
    let z = b.binary(BinaryOp::Mul, y, x).unwrap();
    b.build(&[z]).unwrap()
}

#[test]
fn key_digest_is_stable_and_options_are_canonical() {
    assert_eq!(
        canonical_options([("b", "1"), ("a", "x;y=z")]),
        canonical_options([("a", "x;y=z"), ("b", "1")])
    );
    assert_eq!(canonical_options([]), "{}");
    let k = CacheKey::new("00ff", "host", "0.1.0", "{}");
    // Pinned: a change here orphans every entry users have on disk.
    assert_eq!(k.digest(), "c828a7d154921cd2cf122920c85712a1");
    assert_eq!(k.digest().len(), 32);
    let differs = [
        CacheKey::new("00fe", "host", "0.1.0", "{}"),
        CacheKey::new("00ff", "xla", "0.1.0", "{}"),
        CacheKey::new("00ff", "host", "0.1.1", "{}"),
        CacheKey::new("00ff", "host", "0.1.0", "{\"a\":\"1\"}"),
    ];
    for other in differs {
        assert_ne!(other.digest(), k.digest(), "{other}");
    }
    let g = sample_graph();
    assert_eq!(
        CacheKey::for_graph(&g, "host", "1", "{}").graph,
        g.fingerprint()
    );
}

#[test]
fn disk_dir_comes_from_the_environment() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let all = &[
        ("TPURT_CACHE_DIR", "/tmp/c"),
        ("XDG_CACHE_HOME", "/x"),
        ("HOME", "/h"),
    ];
    assert_eq!(disk::resolve_dir(env(all)), Some(PathBuf::from("/tmp/c")));
    assert_eq!(
        disk::resolve_dir(env(&[("TPURT_CACHE_DIR", "off"), ("HOME", "/h")])),
        None
    );
    assert_eq!(
        disk::resolve_dir(env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])),
        Some(PathBuf::from("/x/tpurt"))
    );
    assert_eq!(
        disk::resolve_dir(env(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")])),
        Some(PathBuf::from("/h/.cache/tpurt"))
    );
    assert_eq!(
        disk::resolve_dir(env(&[("TPURT_CACHE_DIR", ""), ("HOME", "/h")])),
        Some(PathBuf::from("/h/.cache/tpurt"))
    );
    assert_eq!(disk::resolve_dir(env(&[])), None);
}

#[test]
fn memory_is_least_recently_used_out() {
    let cache = Cache::new(CacheConfig::memory_only(2));
    let (a, b, c) = (key("a"), key("b"), key("c"));
    let calls = AtomicUsize::new(0);
    let fetch = |k: &CacheKey| {
        cache
            .get_or_compile(k, no_describe, compile_counted(&k.graph, &calls), no_load)
            .unwrap()
    };
    fetch(&a);
    fetch(&b);
    fetch(&a); // a is now newer than b
    fetch(&c); // evicts b
    fetch(&a); // still there
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let before = fetch(&c);
    fetch(&b); // compiled again, evicts a
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    let s = cache.stats();
    assert_eq!(
        (s.requests, s.memory_hits, s.misses, s.evictions),
        (7, 3, 4, 2)
    );
    assert_eq!(s.memory_entries, 2);
    assert!(s.compile_seconds >= 0.0);
    // An evicted executable stays usable by whoever holds it.
    cache.set_memory_capacity(1);
    assert_eq!(cache.stats().evictions, 3);
    assert_eq!(before.0, "c");

    cache.reset_stats();
    let s = cache.stats();
    assert_eq!((s.requests, s.misses, s.evictions), (0, 0, 0));
    assert_eq!(s.memory_entries, 1);
    // Stats serialize for reports.
    let json = serde_json::to_string(&s).unwrap();
    assert!(json.contains("\"memory_hits\":0"), "{json}");

    cache.clear(true, false).unwrap();
    assert_eq!(cache.stats().memory_entries, 0);
    assert_eq!(cache.stats().evictions, 0);
}

/// A platform short of room has the older half let go, least recently
/// used first, counted as evictions.
#[test]
fn the_older_half_is_let_go_on_demand() {
    let cache = Cache::new(CacheConfig::memory_only(8));
    for k in ["a", "b", "c", "d", "e"] {
        get(&cache, &key(k), k);
    }
    get(&cache, &key("a"), "a"); // now the most recent
    assert_eq!(cache.evict_older_half(), 3);
    let s = cache.stats();
    assert_eq!((s.memory_entries, s.evictions), (2, 3));
    get(&cache, &key("a"), "a");
    get(&cache, &key("e"), "e");
    assert_eq!(cache.stats().memory_hits, 3, "a and e stayed");
    get(&cache, &key("b"), "b");
    assert_eq!(cache.stats().memory_hits, 3, "b went");
    cache.clear(true, false).unwrap();
    assert_eq!(cache.evict_older_half(), 0);
}

#[test]
fn zero_capacity_keeps_nothing_in_memory() {
    let cache = Cache::new(CacheConfig::memory_only(0));
    get(&cache, &key("a"), "a");
    get(&cache, &key("a"), "a");
    let s = cache.stats();
    assert_eq!((s.misses, s.memory_hits, s.evictions), (2, 0, 0));
}

#[test]
fn a_second_process_loads_instead_of_compiling() {
    let dir = TempDir::new("second");
    let first = disk_cache(dir.path());
    assert_eq!(get(&first, &key("a"), "exe a"), "exe a");
    assert_eq!(get(&first, &key("b"), "exe b"), "exe b");
    assert!(disk::entry_path(dir.path(), &key("a").digest()).is_file());

    let second = disk_cache(dir.path());
    for (k, text) in [(key("a"), "exe a"), (key("b"), "exe b")] {
        let exe = second
            .get_or_compile(&k, no_describe, no_compile, load_text)
            .unwrap();
        assert_eq!(exe.0, text);
    }
    // Now in the second's memory: neither load nor compile.
    second
        .get_or_compile(&key("a"), no_describe, no_compile, no_load)
        .unwrap();
    let s = second.stats();
    assert_eq!(
        (s.requests, s.disk_hits, s.memory_hits, s.misses),
        (3, 2, 1, 0)
    );
    assert_eq!((s.corrupt_entries, s.foreign_entries), (0, 0));
    // No temp files left behind.
    let names: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.iter().all(|n| n.ends_with(ENTRY_SUFFIX)));
}

#[test]
fn compile_without_bytes_stays_in_memory_only() {
    let dir = TempDir::new("nobytes");
    let cache = disk_cache(dir.path());
    let exe = cache
        .get_or_compile(
            &key("a"),
            no_describe,
            || Ok((Arc::new(Exe("a".into())), None)),
            no_load,
        )
        .unwrap();
    assert_eq!(exe.0, "a");
    assert!(!disk::entry_path(dir.path(), &key("a").digest()).exists());
    assert_eq!(cache.stats().disk_write_errors, 0);
}

/// Ways to damage the entry file of `key("victim")`, and the counter each
/// must land in.
#[derive(Clone, Copy, Debug)]
enum Damage {
    Empty,
    TruncatedInMagic,
    TruncatedInHeader,
    TruncatedInPayload,
    ExtraBytes,
    PayloadBitFlip,
    HeaderBitFlip,
    HeaderChecksumBitFlip,
    ForeignMagic,
    ForeignVersion,
    DifferentKey,
}

fn damage(file: &mut Vec<u8>, how: Damage, other_key_file: &[u8]) -> bool {
    let header_len = u32::from_le_bytes(file[12..16].try_into().unwrap()) as usize;
    let corrupt = !matches!(
        how,
        Damage::ForeignMagic | Damage::ForeignVersion | Damage::DifferentKey
    );
    match how {
        Damage::Empty => file.clear(),
        Damage::TruncatedInMagic => file.truncate(5),
        Damage::TruncatedInHeader => file.truncate(16 + header_len / 2),
        Damage::TruncatedInPayload => file.truncate(file.len() - 3),
        Damage::ExtraBytes => file.extend_from_slice(b"torn tail"),
        Damage::PayloadBitFlip => {
            let last = file.len() - 1;
            file[last] ^= 0x04;
        }
        Damage::HeaderBitFlip => file[16 + header_len / 2] ^= 0x01,
        Damage::HeaderChecksumBitFlip => file[16 + header_len + 3] ^= 0x10,
        Damage::ForeignMagic => file[..8].copy_from_slice(b"PK\x03\x04abcd"),
        Damage::ForeignVersion => file[8..12].copy_from_slice(&2u32.to_le_bytes()),
        Damage::DifferentKey => *file = other_key_file.to_vec(),
    }
    corrupt
}

#[test]
fn damaged_entries_are_counted_and_rebuilt() {
    let cases = [
        Damage::Empty,
        Damage::TruncatedInMagic,
        Damage::TruncatedInHeader,
        Damage::TruncatedInPayload,
        Damage::ExtraBytes,
        Damage::PayloadBitFlip,
        Damage::HeaderBitFlip,
        Damage::HeaderChecksumBitFlip,
        Damage::ForeignMagic,
        Damage::ForeignVersion,
        Damage::DifferentKey,
    ];
    let victim = key("victim");
    for how in cases {
        let dir = TempDir::new("damage");
        let writer = disk_cache(dir.path());
        get(&writer, &victim, "victim payload");
        get(&writer, &key("other"), "other payload");
        let path = disk::entry_path(dir.path(), &victim.digest());
        let other = fs::read(disk::entry_path(dir.path(), &key("other").digest())).unwrap();
        let mut file = fs::read(&path).unwrap();
        let corrupt = damage(&mut file, how, &other);
        fs::write(&path, &file).unwrap();

        // A fresh instance must not trust the file: it compiles.
        let reader = disk_cache(dir.path());
        let calls = AtomicUsize::new(0);
        let exe = reader
            .get_or_compile(
                &victim,
                no_describe,
                compile_counted("victim payload", &calls),
                load_text,
            )
            .unwrap();
        assert_eq!(exe.0, "victim payload", "{how:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{how:?}");
        let s = reader.stats();
        let expected = if corrupt { (1, 0) } else { (0, 1) };
        assert_eq!((s.corrupt_entries, s.foreign_entries), expected, "{how:?}");
        assert_eq!((s.disk_hits, s.misses), (0, 1), "{how:?}");

        // The rebuilt file is valid: a third instance loads it.
        let rebuilt = fs::read(&path).unwrap();
        assert!(disk::decode(&victim, &rebuilt).is_ok(), "{how:?}");
        let third = disk_cache(dir.path());
        let exe = third
            .get_or_compile(&victim, no_describe, no_compile, load_text)
            .unwrap();
        assert_eq!(exe.0, "victim payload", "{how:?}");
        let s = third.stats();
        assert_eq!(
            (s.disk_hits, s.corrupt_entries, s.foreign_entries),
            (1, 0, 0),
            "{how:?}"
        );
    }
}

#[test]
fn a_payload_that_fails_to_load_counts_as_corrupt() {
    let dir = TempDir::new("badload");
    get(&disk_cache(dir.path()), &key("a"), "a");
    let cache = disk_cache(dir.path());
    let calls = AtomicUsize::new(0);
    let exe = cache
        .get_or_compile(
            &key("a"),
            no_describe,
            compile_counted("a again", &calls),
            |_| Err(Error::invalid("plugin rejects this executable")),
        )
        .unwrap();
    assert_eq!(exe.0, "a again");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let s = cache.stats();
    assert_eq!((s.corrupt_entries, s.disk_hits, s.misses), (1, 0, 1));
    assert!(s.disk_load_seconds > 0.0);
}

#[test]
fn cache_only_miss_names_the_graph() {
    let dir = TempDir::new("cacheonly");
    let graph = sample_graph();
    let k = CacheKey::for_graph(&graph, "host", "0.1.0", "{}");
    let cache = disk_cache(dir.path());
    cache.set_cache_only(true);
    let described = AtomicUsize::new(0);
    let err = cache
        .get_or_compile(
            &k,
            || {
                described.fetch_add(1, Ordering::SeqCst);
                graph.to_string()
            },
            no_compile,
            no_load,
        )
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    let message = err.to_string();
    assert!(message.contains(&graph.fingerprint()), "{message}");
    let first_line = graph.to_string().lines().next().unwrap().to_string();
    assert!(message.contains(&first_line), "{message}");
    assert!(message.contains("add"), "{message}");
    assert_eq!(described.load(Ordering::SeqCst), 1);
    let s = cache.stats();
    assert_eq!((s.cache_only_refusals, s.misses), (1, 0));

    // Errors are not cached; once compiled, cache-only serves it.
    cache.set_cache_only(false);
    get(&cache, &k, "compiled");
    cache.set_cache_only(true);
    assert_eq!(get(&cache, &k, "unused"), "compiled");
    // From disk too, in another instance.
    let other = disk_cache(dir.path());
    other.set_cache_only(true);
    let exe = other
        .get_or_compile(&k, no_describe, no_compile, load_text)
        .unwrap();
    assert_eq!(exe.0, "compiled");
}

#[test]
fn cache_only_error_quotes_only_the_first_lines() {
    let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
    let err = cache_only_error(&key("g"), "d", &text).to_string();
    assert!(err.contains("line 0\n"), "{err}");
    assert!(!err.contains("line 50"), "{err}");
    assert!(err.contains("more lines"), "{err}");
}

#[test]
fn dump_on_miss_writes_the_graph_text() {
    let dumps = TempDir::new("dump");
    let dump_dir = dumps.path().join("nested");
    let graph = sample_graph();
    let k = CacheKey::for_graph(&graph, "host", "0.1.0", "{}");
    let cache = Cache::new(CacheConfig::memory_only(4));
    cache.set_dump_on_miss(Some(dump_dir.clone()));
    assert_eq!(cache.dump_on_miss(), Some(dump_dir.clone()));
    let calls = AtomicUsize::new(0);
    cache
        .get_or_compile(
            &k,
            || graph.to_string(),
            compile_counted("g", &calls),
            no_load,
        )
        .unwrap();
    let dumped = fs::read_to_string(dump_dir.join(format!("{}.txt", k.digest()))).unwrap();
    assert!(dumped.contains(&graph.to_string()), "{dumped}");
    assert!(dumped.contains(&graph.fingerprint()), "{dumped}");
    // A hit neither describes nor dumps.
    cache
        .get_or_compile(&k, no_describe, no_compile, no_load)
        .unwrap();
    assert_eq!(fs::read_dir(&dump_dir).unwrap().count(), 1);
    assert_eq!(cache.stats().dump_errors, 0);
}

#[test]
fn concurrent_requests_for_one_key_compile_once() {
    let cache = Cache::new(CacheConfig::memory_only(4));
    let calls = AtomicUsize::new(0);
    let threads = 8;
    let barrier = Barrier::new(threads);
    let results: Vec<Arc<Exe>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    cache
                        .get_or_compile(
                            &key("shared"),
                            no_describe,
                            || {
                                calls.fetch_add(1, Ordering::SeqCst);
                                std::thread::sleep(Duration::from_millis(50));
                                Ok((Arc::new(Exe("shared".into())), None))
                            },
                            no_load,
                        )
                        .unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(results.iter().all(|r| Arc::ptr_eq(r, &results[0])));
    let s = cache.stats();
    assert_eq!(s.requests, threads as u64);
    assert_eq!(s.misses, 1);
    assert_eq!(s.coalesced + s.memory_hits, threads as u64 - 1);
}

#[test]
fn a_panicking_compile_does_not_block_the_key() {
    let cache = Cache::new(CacheConfig::memory_only(4));
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cache.get_or_compile(
            &key("p"),
            no_describe,
            || -> Result<(Arc<Exe>, Option<Vec<u8>>)> { panic!("compiler crashed") },
            no_load,
        )
    }));
    assert!(unwound.is_err());
    assert_eq!(get(&cache, &key("p"), "ok"), "ok");
}

#[test]
fn compile_errors_are_returned_and_not_cached() {
    let cache = Cache::new(CacheConfig::memory_only(4));
    let err = cache
        .get_or_compile(
            &key("e"),
            no_describe,
            || Err(Error::Unimplemented("no kernel for fft".into())),
            no_load,
        )
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unimplemented);
    assert_eq!(get(&cache, &key("e"), "fixed"), "fixed");
    assert_eq!(cache.stats().misses, 2);
}

#[test]
fn unwritable_directory_counts_write_errors_and_goes_on() {
    let base = TempDir::new("unwritable");
    // A directory under a regular file cannot be created, even by root.
    let blocker = base.path().join("a-file");
    fs::write(&blocker, b"not a directory").unwrap();
    let cache = disk_cache(&blocker.join("cache"));
    assert_eq!(get(&cache, &key("a"), "a"), "a");
    assert_eq!(get(&cache, &key("b"), "b"), "b");
    assert_eq!(get(&cache, &key("a"), "a"), "a");
    let s = cache.stats();
    assert_eq!((s.disk_write_errors, s.misses, s.memory_hits), (2, 2, 1));
    assert_eq!(fs::read(&blocker).unwrap(), b"not a directory");
}

#[test]
fn clear_removes_only_cache_files() {
    let dir = TempDir::new("clear");
    let cache = disk_cache(dir.path());
    get(&cache, &key("a"), "a");
    let stale_temp = dir.path().join(format!(".{}.1.2.3.tmp", key("z").digest()));
    fs::write(&stale_temp, b"half").unwrap();
    let unrelated = dir.path().join("notes.txt");
    fs::write(&unrelated, b"keep me").unwrap();

    cache.clear(false, true).unwrap();
    assert!(!disk::entry_path(dir.path(), &key("a").digest()).exists());
    assert!(!stale_temp.exists());
    assert!(unrelated.exists());
    // Still in memory.
    cache
        .get_or_compile(&key("a"), no_describe, no_compile, no_load)
        .unwrap();
    cache.clear(true, true).unwrap();
    get(&cache, &key("a"), "a");
    assert_eq!(cache.stats().misses, 2);
    // A cache whose directory was never made clears without error.
    disk_cache(&dir.path().join("never"))
        .clear(true, true)
        .unwrap();
}

#[test]
fn config_from_env_and_defaults() {
    let config = CacheConfig::default();
    assert_eq!(config.disk_dir, None);
    assert_eq!(config.memory_entries, CacheConfig::DEFAULT_MEMORY_ENTRIES);
    let cache = Cache::new(CacheConfig::memory_only(3));
    assert_eq!(cache.memory_capacity(), 3);
    assert_eq!(cache.disk_dir(), None);
    assert!(format!("{cache:?}").contains("CompileCache"));
    assert_eq!(CacheConfig::from_env().disk_dir, default_disk_dir());
}

/// A cache opened on a directory removes the temp files of writers that
/// are no longer running (killed mid-write), and nothing else: not a live
/// writer's temp file, not an entry, not a file that is not ours.
#[test]
fn temp_files_of_dead_writers_are_swept_when_a_cache_opens() {
    if !Path::new("/proc/self").exists() {
        return; // the sweep needs /proc (Linux)
    }
    let dir = TempDir::new("sweep");
    let digest = "0123456789abcdef0123456789abcdef";
    // A pid that has exited: a child that ran `true`.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let names = [
        format!(".{digest}.{dead}.0.1.tmp"),
        format!(".{digest}.{}.0.1.tmp", std::process::id()),
        format!("{digest}{ENTRY_SUFFIX}"),
        format!(".{digest}.{dead}.0.1.keep"),
        "notes.txt".to_string(),
    ];
    for n in &names {
        fs::write(dir.path().join(n), b"x").unwrap();
    }
    let _cache = Cache::new(CacheConfig::memory_only(4).with_disk_dir(dir.path()));
    let left: Vec<bool> = names.iter().map(|n| dir.path().join(n).exists()).collect();
    assert_eq!(left, [false, true, true, true, true], "{names:?}");
}
