//! A second process running the same program compiles nothing: the
//! persistent compile cache serves every executable from disk. Damaged
//! entries are counted as corrupt, never used, and rebuilt.
//!
//! The parent test runs this test binary as a child process, filtered to
//! `cache_child_entry`, with `TPURT_CACHE_CHILD=1` and the cache directory
//! in `TPURT_CACHE_CHILD_DIR`. Without that variable the child entry
//! returns at once, so a plain `cargo test` runs only the parent. Each
//! child prints one line: its compile-cache counters and a checksum of the
//! program's results.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tpurt_runtime::compile::{CacheConfig, ENTRY_SUFFIX};
use tpurt_runtime::eager::{pop_mode, push_mode, EagerMode};
use tpurt_runtime::ir::DType;
use tpurt_runtime::ops::{self, Attr, Attrs};
use tpurt_runtime::{DeviceTensor, Layout, Runtime, RuntimeOptions, Stream};

const CHILD_ENV: &str = "TPURT_CACHE_CHILD";
const DIR_ENV: &str = "TPURT_CACHE_CHILD_DIR";
const VARIANT_ENV: &str = "TPURT_CACHE_CHILD_VARIANT";
const CHILD_TEST: &str = "cache_child_entry";
const RESULT_TAG: &str = "TPURT_CACHE_CHILD_RESULT";
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------- child

fn upload(r: &Runtime, s: &Stream, dims: &[u64], seed: u32) -> DeviceTensor {
    let n: u64 = dims.iter().product();
    let v: Vec<f32> = (0..n as u32)
        .map(|i| {
            ((i.wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) % 1000) as f32 / 250.0 - 2.0
        })
        .collect();
    let b = r.allocate(0, n * 4, s).unwrap();
    r.copy_host_to_device(bytemuck::cast_slice(&v), &b, &Layout::bytes(b.len()), s)
        .unwrap();
    DeviceTensor::contiguous(b, DType::F32, dims).unwrap()
}

fn download(r: &Runtime, s: &Stream, t: &DeviceTensor) -> Vec<u8> {
    let mut out = vec![0u8; (t.numel() * t.dtype.size() as u64) as usize];
    r.copy_device_to_host(&t.buffer, &t.layout, &mut out, s)
        .unwrap();
    out
}

fn op(
    r: &Runtime,
    s: &Stream,
    name: &str,
    ins: &[&DeviceTensor],
    attrs: Attrs,
) -> Vec<DeviceTensor> {
    let ins: Vec<DeviceTensor> = ins.iter().map(|t| (*t).clone()).collect();
    r.call_op_alloc(ops::lookup(name).unwrap(), &ins, &attrs, s)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// FNV-1a 64 over every result byte.
fn checksum(parts: &[Vec<u8>]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in parts.iter().flatten() {
        h = (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The fixed program: a block (bias, gelu, residual, layer_norm) deferred
/// and fused, then a matmul, softmax and a column sum in strict mode.
fn program(r: &Runtime) -> Vec<Vec<u8>> {
    let s = r.default_stream(0).unwrap();
    // Variants (TPURT_CACHE_CHILD_VARIANT) run other shapes: other programs.
    let rows = match std::env::var(VARIANT_ENV).as_deref() {
        Ok("b") => 12,
        Ok("c") => 8,
        _ => 16,
    };
    let x = upload(r, &s, &[rows, 32], 1);
    let bias = upload(r, &s, &[32], 2);
    let w = upload(r, &s, &[32, 24], 3);
    push_mode(EagerMode::DeferAndFuse).unwrap();
    let h = op(r, &s, "add", &[&x, &bias], Attrs::new()).remove(0);
    let g = op(r, &s, "gelu", &[&h], Attrs::new()).remove(0);
    let y = op(r, &s, "add", &[&g, &x], Attrs::new()).remove(0);
    let ln = op(
        r,
        &s,
        "layer_norm",
        &[&y],
        Attrs::new().with("normalized_shape", Attr::Ints(vec![32])),
    );
    assert_eq!(s.deferred_ops(), 4, "the block waits for a flush");
    let normed = download(r, &s, &ln[0]);
    pop_mode().unwrap();
    push_mode(EagerMode::DeferNever).unwrap();
    let m = op(r, &s, "matmul", &[&ln[0], &w], Attrs::new()).remove(0);
    let p = op(
        r,
        &s,
        "softmax",
        &[&m],
        Attrs::new().with("dim", Attr::Int(-1)),
    )
    .remove(0);
    let col = op(
        r,
        &s,
        "sum",
        &[&m],
        Attrs::new().with("dim", Attr::Ints(vec![0])),
    )
    .remove(0);
    let out = vec![
        normed,
        download(r, &s, &m),
        download(r, &s, &p),
        download(r, &s, &col),
    ];
    pop_mode().unwrap();
    out
}

/// The child process's entry: a normal test that does nothing unless the
/// parent set `TPURT_CACHE_CHILD=1`.
#[test]
fn cache_child_entry() {
    if std::env::var(CHILD_ENV).as_deref() != Ok("1") {
        return;
    }
    let dir = std::env::var_os(DIR_ENV).expect("TPURT_CACHE_CHILD_DIR");
    let r = Runtime::new(&RuntimeOptions {
        platform: Some("host".into()),
        host_chips: Some(1),
        host_topology: None,
        host_hbm_bytes: Some(64 << 20),
        cache: Some(CacheConfig::memory_only(64).with_disk_dir(PathBuf::from(dir))),
    })
    .unwrap();
    let results = program(&r);
    let st = r.compile_cache_stats();
    println!(
        "\n{RESULT_TAG} misses={} disk_hits={} corrupt={} foreign={} write_errors={} checksum={:016x}",
        st.misses,
        st.disk_hits,
        st.corrupt_entries,
        st.foreign_entries,
        st.disk_write_errors,
        checksum(&results)
    );
}

// ---------------------------------------------------------------- parent

#[derive(Debug)]
struct ChildResult {
    misses: u64,
    disk_hits: u64,
    corrupt: u64,
    foreign: u64,
    write_errors: u64,
    checksum: String,
}

/// Output of a reader thread, joined after the child exits or is killed.
fn drain(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = from.read_to_string(&mut s);
        s
    })
}

/// Runs the child entry over `dir`; kills it after `CHILD_TIMEOUT`.
fn run_child(dir: &Path, which: &str) -> ChildResult {
    run_child_with(dir, which, None)
}

/// As `run_child`, for a variant of the program (TPURT_CACHE_CHILD_VARIANT).
fn run_child_variant(dir: &Path, variant: &str) -> ChildResult {
    run_child_with(dir, variant, Some(variant))
}

fn run_child_with(dir: &Path, which: &str, variant: Option<&str>) -> ChildResult {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe);
    if let Some(v) = variant {
        child.env(VARIANT_ENV, v);
    }
    let mut child = child
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env(DIR_ENV, dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > CHILD_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    let status = status.unwrap_or_else(|| {
        panic!("{which} child ran over {CHILD_TIMEOUT:?} and was killed\nstdout:\n{out}\nstderr:\n{err}")
    });
    assert!(
        status.success(),
        "{which} child failed ({status})\nstdout:\n{out}\nstderr:\n{err}"
    );
    parse_result(&out, which)
}

/// The result line a child printed.
fn parse_result(out: &str, which: &str) -> ChildResult {
    let line = out
        .lines()
        .find_map(|l| l.split_once(RESULT_TAG).map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("{which} child printed no result line\nstdout:\n{out}"));
    let field = |name: &str| -> &str {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .unwrap_or_else(|| panic!("{which} child: no {name} in {line:?}"))
    };
    let num = |name: &str| -> u64 { field(name).parse().unwrap() };
    ChildResult {
        misses: num("misses"),
        disk_hits: num("disk_hits"),
        corrupt: num("corrupt"),
        foreign: num("foreign"),
        write_errors: num("write_errors"),
        checksum: field("checksum").to_string(),
    }
}

/// A fresh directory, removed when dropped (also when the test fails).
struct TempDir(PathBuf);
impl TempDir {
    fn new() -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let p = std::env::temp_dir().join(format!(
            "tpurt-cache-processes-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn entry_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(ENTRY_SUFFIX))
        .collect();
    v.sort();
    v
}

#[test]
fn a_second_process_compiles_nothing_and_corrupt_entries_are_rebuilt() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return; // never recurse from a child
    }
    let dir = TempDir::new();

    let first = run_child(&dir.0, "first");
    assert!(first.misses > 0, "the first process compiles: {first:?}");
    assert_eq!(
        (
            first.disk_hits,
            first.corrupt,
            first.foreign,
            first.write_errors
        ),
        (0, 0, 0, 0),
        "{first:?}"
    );
    let entries = entry_files(&dir.0);
    assert_eq!(
        entries.len() as u64,
        first.misses,
        "one entry per compile: {entries:?}"
    );

    let second = run_child(&dir.0, "second");
    assert_eq!(
        second.misses, 0,
        "the second process compiles nothing: {second:?}"
    );
    assert_eq!(
        second.disk_hits, first.misses,
        "every executable comes from disk: {second:?}"
    );
    assert_eq!(second.corrupt, 0, "{second:?}");
    assert_eq!(second.checksum, first.checksum, "same results");

    // Damage every entry: truncate half of them to half their length,
    // flip a payload byte of the others.
    for (k, path) in entries.iter().enumerate() {
        let mut bytes = std::fs::read(path).unwrap();
        if k % 2 == 0 {
            bytes.truncate(bytes.len() / 2);
        } else {
            let last = bytes.len() - 1;
            bytes[last] ^= 0x5A;
        }
        std::fs::write(path, &bytes).unwrap();
    }
    let third = run_child(&dir.0, "third");
    assert_eq!(third.checksum, first.checksum, "same results: {third:?}");
    assert_eq!(
        (third.misses, third.corrupt, third.disk_hits),
        (first.misses, entries.len() as u64, 0),
        "every damaged entry is counted and rebuilt: {third:?}"
    );

    // The rebuilt entries serve the next process.
    let fourth = run_child(&dir.0, "fourth");
    assert_eq!(
        (fourth.misses, fourth.disk_hits, fourth.corrupt),
        (0, first.misses, 0),
        "{fourth:?}"
    );
    assert_eq!(fourth.checksum, first.checksum);

    let path = dir.0.clone();
    drop(dir);
    assert!(!path.exists(), "the temp dir is removed");
}

/// Several processes compile the same and different programs into one
/// cache directory at once, and some are killed with SIGKILL in the middle
/// of writing an entry (the test hook TPURT_CACHE_WRITE_PAUSE_MS stops
/// their writers halfway). Afterwards every entry is whole: each program's
/// next process loads all of its executables from disk, none corrupt, with
/// the results of the processes that finished; and the killed writers'
/// temp files are swept.
#[test]
fn racing_processes_and_kills_mid_write_lose_no_entry() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return; // never recurse from a child
    }
    let dir = TempDir::new();
    let exe = std::env::current_exe().unwrap();
    let spawn = |variant: &str, pause: bool| {
        let mut c = Command::new(&exe);
        c.args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .env(DIR_ENV, &dir.0)
            .env(VARIANT_ENV, variant)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if pause {
            c.env("TPURT_CACHE_WRITE_PAUSE_MS", "30000");
        }
        c.spawn().unwrap()
    };
    // First the victims, one per program: each stops in its first write
    // (nothing is on disk yet). While they hang there, the racers start,
    // all at once; then each victim is killed (SIGKILL) mid-write.
    let mut victims: Vec<PathBuf> = Vec::new();
    let mut paused = Vec::new();
    for variant in ["a", "b", "c"] {
        let mut child = spawn(variant, true);
        let out = drain(child.stdout.take().unwrap());
        let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            let n = std::io::BufRead::read_line(&mut err, &mut line).unwrap();
            assert!(n > 0, "variant {variant}: the writer never paused");
            if let Some((_, path)) = line.trim_end().split_once("paused mid-write of ") {
                victims.push(PathBuf::from(path));
                break;
            }
        }
        paused.push((child, out, err));
    }
    let racers: Vec<_> = ["a", "b", "c", "a", "b"]
        .iter()
        .map(|&v| (v, spawn(v, false)))
        .collect();
    let mut killed = 0;
    for (mut child, out, _err) in paused {
        child.kill().unwrap(); // SIGKILL, while its temp file is half written
        assert!(!child.wait().unwrap().success());
        let _ = out.join();
        killed += 1;
    }
    let mut finished: Vec<(String, ChildResult)> = Vec::new();
    for (variant, mut child) in racers {
        let out = drain(child.stdout.take().unwrap());
        let err = drain(child.stderr.take().unwrap());
        let status = child.wait().unwrap();
        let (o, e) = (out.join().unwrap(), err.join().unwrap());
        assert!(status.success(), "variant {variant} failed\n{o}\n{e}");
        finished.push((variant.to_string(), parse_result(&o, variant)));
    }
    assert_eq!(killed, 3);
    // Entries are whole: nothing corrupt or foreign was seen by the racers.
    for (v, r) in &finished {
        assert_eq!(
            (r.corrupt, r.foreign, r.write_errors),
            (0, 0, 0),
            "{v}: {r:?}"
        );
    }
    // The killed writers left temp files; the next process sweeps them.
    let temps = |d: &Path| {
        std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .count()
    };
    assert_eq!(victims.len(), 3);
    for variant in ["a", "b", "c"] {
        let want = &finished
            .iter()
            .find(|(v, _)| v == variant)
            .unwrap()
            .1
            .checksum;
        for (v, r) in finished.iter().filter(|(v, _)| v == variant) {
            assert_eq!(
                &r.checksum, want,
                "variant {v}: same results in every process"
            );
        }
        let after = run_child_variant(&dir.0, variant);
        assert_eq!(
            (after.misses, after.corrupt, after.foreign),
            (0, 0, 0),
            "variant {variant}: every executable whole on disk: {after:?}"
        );
        assert_eq!(&after.checksum, want, "variant {variant}: same results");
    }
    assert_eq!(temps(&dir.0), 0, "the dead writers' temp files are swept");
    assert!(victims.iter().all(|v| !v.exists()), "{victims:?}");
    println!(
        "cache race: {} processes, {killed} killed mid-write, {} entries, 0 lost",
        killed + finished.len() + 3,
        entry_files(&dir.0).len()
    );
}
