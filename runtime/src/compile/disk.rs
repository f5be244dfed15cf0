//! The on-disk entry format, atomic writes, and where the cache directory
//! is. Nothing here trusts a file: [`decode`] checks every byte of an
//! entry before it hands back a payload.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::key::CacheKey;
use crate::ir::fingerprint_bytes;

/// First bytes of every entry file.
pub const MAGIC: [u8; 8] = *b"TPURTEXE";
/// Version of the entry layout; a file of another version is foreign.
pub const FORMAT_VERSION: u32 = 1;
/// File name suffix of entries (`<digest>.entry`).
pub const ENTRY_SUFFIX: &str = ".entry";
const TEMP_SUFFIX: &str = ".tmp";

/// Bytes before the header: magic, format version, header length.
const PREFIX_LEN: usize = 16;
/// The header checksum: 32 ASCII hex digits.
const CHECKSUM_LEN: usize = 32;

#[derive(Serialize, Deserialize)]
struct Header {
    key: CacheKey,
    payload_len: u64,
    payload_checksum: String,
}

/// Why a file was not used. Corrupt: damaged on the way (torn, truncated,
/// bit flips, a payload the platform could not load). Foreign: intact, but
/// not ours to use (another magic, another format version, another key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    Corrupt(String),
    Foreign(String),
}

pub fn entry_path(dir: &Path, digest: &str) -> PathBuf {
    dir.join(format!("{digest}{ENTRY_SUFFIX}"))
}

fn checksum(parts: &[&[u8]]) -> String {
    fingerprint_bytes(parts)
}

/// The complete file for `key` holding `payload`.
pub fn encode(key: &CacheKey, payload: &[u8]) -> Vec<u8> {
    let header = Header {
        key: key.clone(),
        payload_len: payload.len() as u64,
        payload_checksum: checksum(&[payload]),
    };
    let header = serde_json::to_vec(&header).unwrap_or_default();
    let version = FORMAT_VERSION.to_le_bytes();
    let header_sum = checksum(&[&MAGIC, &version, &header]);
    let mut out = Vec::with_capacity(PREFIX_LEN + header.len() + CHECKSUM_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version);
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(header_sum.as_bytes());
    out.extend_from_slice(payload);
    out
}

/// Checks `file` as the entry of `key`; on success, the payload's byte
/// range within `file`.
pub fn decode(key: &CacheKey, file: &[u8]) -> Result<std::ops::Range<usize>, Rejection> {
    let corrupt = |why: &str| Rejection::Corrupt(why.to_string());
    if file.len() < MAGIC.len() {
        // A prefix of our magic is one of ours cut short.
        return Err(if MAGIC.starts_with(file) {
            corrupt("truncated before the magic")
        } else {
            Rejection::Foreign("not a tpurt cache entry (magic)".into())
        });
    }
    if file[..MAGIC.len()] != MAGIC {
        return Err(Rejection::Foreign("not a tpurt cache entry (magic)".into()));
    }
    if file.len() < PREFIX_LEN {
        return Err(corrupt("truncated before the header"));
    }
    let version = u32::from_le_bytes([file[8], file[9], file[10], file[11]]);
    if version != FORMAT_VERSION {
        return Err(Rejection::Foreign(format!(
            "entry format version {version}, this build reads {FORMAT_VERSION}"
        )));
    }
    let header_len = u32::from_le_bytes([file[12], file[13], file[14], file[15]]) as usize;
    let header_end = PREFIX_LEN + header_len;
    let payload_start = header_end + CHECKSUM_LEN;
    if file.len() < payload_start {
        return Err(corrupt("truncated in the header"));
    }
    let header = &file[PREFIX_LEN..header_end];
    let stored_sum = &file[header_end..payload_start];
    if checksum(&[&MAGIC, &file[8..12], header]).as_bytes() != stored_sum {
        return Err(corrupt("header checksum mismatch"));
    }
    let header: Header =
        serde_json::from_slice(header).map_err(|e| corrupt(&format!("bad header: {e}")))?;
    if header.key != *key {
        return Err(Rejection::Foreign(format!(
            "entry written for another key ({})",
            header.key
        )));
    }
    let payload_len =
        usize::try_from(header.payload_len).map_err(|_| corrupt("payload length out of range"))?;
    if file.len() - payload_start != payload_len {
        return Err(corrupt(&format!(
            "payload is {} bytes, header says {payload_len}",
            file.len() - payload_start
        )));
    }
    let payload = payload_start..file.len();
    if checksum(&[&file[payload.clone()]]) != header.payload_checksum {
        return Err(corrupt("payload checksum mismatch"));
    }
    Ok(payload)
}

/// Writes `bytes` as `<dir>/<digest>.entry` so that a reader sees either
/// the old file or the complete new one: the bytes go to a temp file with a
/// name no other writer uses, in the same directory, which is then renamed
/// over the entry. There is no fsync: a file torn by a crash is caught by
/// [`decode`] and rebuilt, which costs less than syncing every entry.
pub fn write_atomic(dir: &Path, digest: &str, bytes: &[u8]) -> io::Result<()> {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    fs::create_dir_all(dir)?;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let temp = dir.join(format!(
        ".{digest}.{}.{}.{nanos}{TEMP_SUFFIX}",
        std::process::id(),
        SEQUENCE.fetch_add(1, Ordering::Relaxed)
    ));
    let written = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp)
        .and_then(|mut f| write_bytes(&mut f, bytes, &temp))
        .and_then(|()| fs::rename(&temp, entry_path(dir, digest)));
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written
}

/// Writes `bytes`; with the test hook `TPURT_CACHE_WRITE_PAUSE_MS` set, it
/// stops halfway for that many milliseconds after saying so on stderr, so a
/// test can kill the process in the middle of a write.
fn write_bytes(f: &mut fs::File, bytes: &[u8], temp: &Path) -> io::Result<()> {
    static PAUSE: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let pause = *PAUSE.get_or_init(|| {
        std::env::var("TPURT_CACHE_WRITE_PAUSE_MS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
    });
    match pause {
        None => f.write_all(bytes),
        Some(ms) => {
            let (head, tail) = bytes.split_at(bytes.len() / 2);
            f.write_all(head)?;
            f.flush()?;
            eprintln!("tpurt-cache: paused mid-write of {}", temp.display());
            std::thread::sleep(std::time::Duration::from_millis(ms));
            f.write_all(tail)
        }
    }
}

/// Removes the temp files of writers that died mid-write (killed, say):
/// a temp file's name carries its writer's pid, and on Linux a pid without
/// a `/proc` entry is not running. Elsewhere nothing is removed (a stray
/// temp file is never read, only wasted space). Returns the count removed.
pub fn sweep_dead_writers(dir: &Path) -> usize {
    if !Path::new("/proc/self").exists() {
        return 0;
    }
    let Ok(listing) = fs::read_dir(dir) else {
        return 0;
    };
    let me = std::process::id().to_string();
    let mut removed = 0;
    for item in listing.flatten() {
        let name = item.file_name();
        let Some(name) = name
            .to_str()
            .filter(|n| is_ours(n) && n.ends_with(TEMP_SUFFIX))
        else {
            continue;
        };
        // .<digest>.<pid>.<sequence>.<nanos>.tmp
        let Some(pid) = name
            .split('.')
            .nth(2)
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if pid != me
            && !Path::new("/proc").join(pid).exists()
            && fs::remove_file(item.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

fn is_digest(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `name` is an entry or a temp file this module writes; `clear`
/// removes only those, so a directory shared with other files is safe.
fn is_ours(name: &str) -> bool {
    if let Some(digest) = name.strip_suffix(ENTRY_SUFFIX) {
        return is_digest(digest);
    }
    name.ends_with(TEMP_SUFFIX) && name.starts_with('.') && name.get(1..33).is_some_and(is_digest)
}

/// Removes every entry and temp file in `dir`; a missing directory is
/// already clear.
pub fn clear_dir(dir: &Path) -> io::Result<()> {
    let listing = match fs::read_dir(dir) {
        Ok(l) => l,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut first_error = None;
    for item in listing {
        let item = item?;
        let name = item.file_name();
        if name.to_str().is_some_and(is_ours) {
            if let Err(e) = fs::remove_file(item.path()) {
                if e.kind() != io::ErrorKind::NotFound {
                    first_error.get_or_insert(e);
                }
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The disk directory named by the environment, or `None` for no disk
/// cache: `TPURT_CACHE_DIR` (`off` disables), else
/// `$XDG_CACHE_HOME/tpurt`, else `$HOME/.cache/tpurt`. Empty or relative
/// XDG and HOME values are ignored, as the XDG spec asks.
pub fn resolve_dir(var: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |name: &str| var(name).filter(|v| !v.is_empty());
    if let Some(dir) = set("TPURT_CACHE_DIR") {
        return if dir.eq_ignore_ascii_case("off") {
            None
        } else {
            Some(PathBuf::from(dir))
        };
    }
    let absolute = |name: &str| set(name).map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(xdg) = absolute("XDG_CACHE_HOME") {
        return Some(xdg.join("tpurt"));
    }
    absolute("HOME").map(|home| home.join(".cache").join("tpurt"))
}
