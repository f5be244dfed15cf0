//! Runtime create/destroy, version, and the helpers every call uses.

use std::ffi::{c_char, CStr};
use std::sync::Arc;

use tpurt_core::compile::CacheConfig;
use tpurt_core::{Buffer, Error, Event, Result, Runtime, RuntimeOptions, Stream};

use crate::handles::{HandleTable, Kind};
use crate::status::{guard, tpurt_status};
use crate::TPURT_ABI_VERSION;

pub(crate) static RUNTIMES: HandleTable<Arc<Runtime>> = HandleTable::new(Kind::Runtime);
pub(crate) static STREAMS: HandleTable<Stream> = HandleTable::new(Kind::Stream);
pub(crate) static EVENTS: HandleTable<Event> = HandleTable::new(Kind::Event);
pub(crate) static BUFFERS: HandleTable<Buffer> = HandleTable::new(Kind::Buffer);

/// A runtime: a platform and its devices. Destroy with `tpurt_runtime_destroy`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct tpurt_runtime {
    pub handle: u64,
}

/// Options for `tpurt_runtime_create`. Zero a struct, set `struct_size`
/// to `sizeof(tpurt_runtime_options)`, fill what you need.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tpurt_runtime_options {
    pub struct_size: usize,
    /// "host" or "xla"; NULL: `TPURT_PLATFORM`, else "host". Borrowed for the call.
    pub platform: *const c_char,
    /// Host platform: number of chips; 0: `TPURT_HOST_CHIPS`, else 4.
    pub host_chips: u32,
    /// Host platform: mesh such as "2x2"; NULL: `TPURT_HOST_TOPOLOGY`, else
    /// a mesh that fits the chips. Borrowed for the call.
    pub host_topology: *const c_char,
    /// Host platform: HBM bytes per chip; 0: `TPURT_HOST_HBM`, else 16 GiB.
    pub host_hbm_bytes: u64,
    /// Directory of the persistent compile cache; "off": none; NULL:
    /// `TPURT_CACHE_DIR`, else the user's cache directory. Borrowed for the call.
    pub compile_cache_dir: *const c_char,
}

/// The ABI version of the library (compare with `TPURT_ABI_VERSION`).
#[no_mangle]
pub extern "C" fn tpurt_abi_version() -> u32 {
    TPURT_ABI_VERSION
}

/// The library's version as text, static storage.
#[no_mangle]
pub extern "C" fn tpurt_version_string() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// Read field `$field` of a caller's versioned struct, or `$default` if the
/// caller's `struct_size` ends before it.
macro_rules! versioned_field {
    ($ptr:expr, $ty:ty, $field:ident, $default:expr) => {{
        let size = (*$ptr).struct_size;
        let end = std::mem::offset_of!($ty, $field) + std::mem::size_of_val(&(*$ptr).$field);
        if size >= end {
            (*$ptr).$field
        } else {
            $default
        }
    }};
}
pub(crate) use versioned_field;

/// Check a versioned struct's size field before reading any other field.
pub(crate) fn check_struct_size(size: usize, what: &str) -> Result<()> {
    if size < std::mem::size_of::<usize>() {
        return Err(Error::invalid(format!(
            "{what}.struct_size is {size}; set it to sizeof({what})"
        )));
    }
    Ok(())
}

pub(crate) fn out_ptr<'a, T>(ptr: *mut T, name: &str) -> Result<&'a mut T> {
    // SAFETY: a non-null out pointer points to writable memory for a T (caller's contract).
    unsafe { ptr.as_mut() }.ok_or_else(|| Error::invalid(format!("{name} is NULL")))
}

pub(crate) fn c_str(ptr: *const c_char, name: &str) -> Result<Option<String>> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: a non-null string is NUL-terminated and readable for the call (caller's contract).
    let s = unsafe { CStr::from_ptr(ptr) };
    s.to_str()
        .map(|s| Some(s.to_string()))
        .map_err(|_| Error::invalid(format!("{name} is not valid UTF-8")))
}

/// Copy `value` into a caller's versioned out-struct, at most its
/// `struct_size` bytes (so an older caller with a shorter struct is safe).
pub(crate) fn write_versioned<T: Copy>(out: *mut T, value: &T, what: &str) -> Result<()> {
    if out.is_null() {
        return Err(Error::invalid(format!("{what} is NULL")));
    }
    // SAFETY: out is non-null and, per the contract, points to at least
    // struct_size (its first field) writable bytes.
    let size = unsafe { *(out as *const usize) };
    check_struct_size(size, what)?;
    let n = size.min(std::mem::size_of::<T>());
    // SAFETY: we copy n bytes, no more than either side holds; the first
    // bytes (struct_size) are overwritten with the value the caller set.
    unsafe {
        std::ptr::copy_nonoverlapping(value as *const T as *const u8, out as *mut u8, n);
        *(out as *mut usize) = size;
    }
    Ok(())
}

pub(crate) fn runtime_of(rt: tpurt_runtime) -> Result<Arc<Runtime>> {
    RUNTIMES.get(rt.handle).map(|(r, _)| r)
}

/// Create a runtime. `options` may be NULL (all defaults). On success
/// `*out` holds the new runtime.
#[no_mangle]
pub extern "C" fn tpurt_runtime_create(
    options: *const tpurt_runtime_options,
    out: *mut tpurt_runtime,
) -> *mut tpurt_status {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let mut opts = RuntimeOptions::default();
        if !options.is_null() {
            // SAFETY: non-null options point to a readable struct of at least
            // struct_size bytes; fields past it are not read.
            unsafe {
                check_struct_size((*options).struct_size, "tpurt_runtime_options")?;
                opts.platform = c_str(
                    versioned_field!(options, tpurt_runtime_options, platform, std::ptr::null()),
                    "options.platform",
                )?;
                let chips = versioned_field!(options, tpurt_runtime_options, host_chips, 0);
                opts.host_chips = (chips != 0).then_some(chips);
                opts.host_topology = c_str(
                    versioned_field!(
                        options,
                        tpurt_runtime_options,
                        host_topology,
                        std::ptr::null()
                    ),
                    "options.host_topology",
                )?;
                let hbm = versioned_field!(options, tpurt_runtime_options, host_hbm_bytes, 0);
                opts.host_hbm_bytes = (hbm != 0).then_some(hbm);
                let dir = c_str(
                    versioned_field!(
                        options,
                        tpurt_runtime_options,
                        compile_cache_dir,
                        std::ptr::null()
                    ),
                    "options.compile_cache_dir",
                )?;
                opts.cache = dir.map(|d| {
                    let config = CacheConfig::memory_only(CacheConfig::DEFAULT_MEMORY_ENTRIES);
                    if d == "off" {
                        config
                    } else {
                        config.with_disk_dir(d)
                    }
                });
            }
        }
        let runtime = Runtime::new(&opts)?;
        out.handle = RUNTIMES.insert(0, Arc::new(runtime));
        Ok(())
    })
}

/// Destroy a runtime: queued work finishes first, then every handle made
/// from it (streams, events, buffers) becomes invalid.
#[no_mangle]
pub extern "C" fn tpurt_runtime_destroy(rt: tpurt_runtime) -> *mut tpurt_status {
    guard(|| {
        let runtime = RUNTIMES.remove(rt.handle)?;
        drop(crate::ops::EXECUTABLES.remove_owned_by(rt.handle));
        drop(BUFFERS.remove_owned_by(rt.handle));
        drop(EVENTS.remove_owned_by(rt.handle));
        drop(STREAMS.remove_owned_by(rt.handle));
        drop(runtime);
        Ok(())
    })
}

/// Live handles of each kind, in the whole process (every runtime): what a
/// long-running frontend checks for leaks. Set `struct_size` before the call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct tpurt_handle_counts {
    pub struct_size: usize,
    pub runtimes: u64,
    pub streams: u64,
    pub events: u64,
    pub buffers: u64,
    pub executables: u64,
}

/// The process's live handles of each kind into `*out`.
#[no_mangle]
pub extern "C" fn tpurt_handle_counts_get(out: *mut tpurt_handle_counts) -> *mut tpurt_status {
    guard(|| {
        let counts = tpurt_handle_counts {
            struct_size: std::mem::size_of::<tpurt_handle_counts>(),
            runtimes: RUNTIMES.len() as u64,
            streams: STREAMS.len() as u64,
            events: EVENTS.len() as u64,
            buffers: BUFFERS.len() as u64,
            executables: crate::ops::EXECUTABLES.len() as u64,
        };
        write_versioned(out, &counts, "tpurt_handle_counts")
    })
}

/// The mesh shape: up to `capacity` dimensions into `dims`, their count
/// into `*ndims` (the count is set even when `dims` is too short).
#[no_mangle]
pub extern "C" fn tpurt_runtime_topology(
    rt: tpurt_runtime,
    dims: *mut u32,
    capacity: usize,
    ndims: *mut usize,
) -> *mut tpurt_status {
    guard(|| {
        let runtime = runtime_of(rt)?;
        let ndims = out_ptr(ndims, "ndims")?;
        let topo = runtime.platform().topology();
        *ndims = topo.len();
        if capacity < topo.len() {
            return Err(Error::invalid(format!(
                "dims holds {capacity} entries but the topology has {}",
                topo.len()
            )));
        }
        if dims.is_null() {
            return Err(Error::invalid("dims is NULL"));
        }
        // SAFETY: dims is non-null and holds `capacity` >= topo.len() entries (caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(topo.as_ptr(), dims, topo.len()) };
        Ok(())
    })
}

/// The platform's name ("host" or "xla") into `buf` (NUL-terminated,
/// `capacity` bytes); `*length` gets the name's length without the NUL.
#[no_mangle]
pub extern "C" fn tpurt_runtime_platform_name(
    rt: tpurt_runtime,
    buf: *mut c_char,
    capacity: usize,
    length: *mut usize,
) -> *mut tpurt_status {
    guard(|| {
        let runtime = runtime_of(rt)?;
        let name = runtime.platform().name();
        *out_ptr(length, "length")? = name.len();
        if buf.is_null() || capacity <= name.len() {
            return Err(Error::invalid(format!(
                "buf must hold at least {} bytes for the platform name",
                name.len() + 1
            )));
        }
        // SAFETY: buf is non-null with `capacity` > name.len() writable bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(name.as_ptr(), buf as *mut u8, name.len());
            *buf.add(name.len()) = 0;
        }
        Ok(())
    })
}
