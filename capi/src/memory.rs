//! Memory statistics, snapshots and the cache of each device's HBM pool.

use std::ffi::{c_char, CString};

use tpurt_core::memory::{MemoryStats, Stat};

use crate::runtime::{out_ptr, runtime_of, tpurt_runtime, write_versioned};
use crate::status::{guard, tpurt_status};

/// One byte statistic, as torch.cuda.memory_stats counts it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct tpurt_memory_stat {
    pub current: u64,
    /// Highest `current` since the last peak reset.
    pub peak: u64,
    /// Total ever added.
    pub allocated: u64,
    /// Total ever removed.
    pub freed: u64,
}

/// A device's pool statistics. Set `struct_size` before the call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct tpurt_memory_stats {
    pub struct_size: usize,
    /// Rounded sizes of live buffers.
    pub allocated_bytes: tpurt_memory_stat,
    /// Segments held from the platform (allocated plus cached).
    pub reserved_bytes: tpurt_memory_stat,
    /// Allocated plus freed-but-pending on other streams.
    pub active_bytes: tpurt_memory_stat,
    /// Sizes as requested, before rounding.
    pub requested_bytes: tpurt_memory_stat,
    pub num_alloc: u64,
    pub num_free: u64,
    pub num_ooms: u64,
    pub num_alloc_retries: u64,
    pub num_segments: u64,
    pub peak_num_segments: u64,
    pub num_segment_allocs: u64,
    pub num_segment_frees: u64,
    /// The device's HBM capacity.
    pub capacity_bytes: u64,
    /// Memory of the platform's own holding the device's data outside the
    /// pool for a while: on the xla platform, what a PJRT plugin holds
    /// during an execution (inputs copied in where XLA cannot read the
    /// pool's memory, results before they are copied out, the program's
    /// temporaries). Not part of the reserved bytes. Present when `struct_size` reaches it.
    pub plugin_bytes: tpurt_memory_stat,
}

fn stat(s: &Stat) -> tpurt_memory_stat {
    tpurt_memory_stat {
        current: s.current,
        peak: s.peak,
        allocated: s.allocated,
        freed: s.freed,
    }
}

fn to_c(s: &MemoryStats, capacity: u64) -> tpurt_memory_stats {
    tpurt_memory_stats {
        struct_size: std::mem::size_of::<tpurt_memory_stats>(),
        allocated_bytes: stat(&s.allocated_bytes),
        reserved_bytes: stat(&s.reserved_bytes),
        active_bytes: stat(&s.active_bytes),
        requested_bytes: stat(&s.requested_bytes),
        num_alloc: s.num_alloc,
        num_free: s.num_free,
        num_ooms: s.num_ooms,
        num_alloc_retries: s.num_alloc_retries,
        num_segments: s.num_segments.current,
        peak_num_segments: s.num_segments.peak,
        num_segment_allocs: s.num_segment_allocs,
        num_segment_frees: s.num_segment_frees,
        capacity_bytes: capacity,
        plugin_bytes: stat(&s.plugin_bytes),
    }
}

#[no_mangle]
pub extern "C" fn tpurt_memory_get_stats(
    rt: tpurt_runtime,
    device: u32,
    out: *mut tpurt_memory_stats,
) -> *mut tpurt_status {
    guard(|| {
        let runtime = runtime_of(rt)?;
        let stats = runtime.memory_stats(device as usize)?;
        let capacity = runtime.pool(device as usize)?.capacity();
        write_versioned(out, &to_c(&stats, capacity), "tpurt_memory_stats")
    })
}

/// Set every peak to its current value.
#[no_mangle]
pub extern "C" fn tpurt_memory_reset_peak_stats(
    rt: tpurt_runtime,
    device: u32,
) -> *mut tpurt_status {
    guard(|| runtime_of(rt)?.reset_peak_memory_stats(device as usize))
}

/// Wait for the device's work, then return every wholly free cached
/// segment to the platform; `*released` (may be NULL) gets the bytes.
#[no_mangle]
pub extern "C" fn tpurt_memory_empty_cache(
    rt: tpurt_runtime,
    device: u32,
    released: *mut u64,
) -> *mut tpurt_status {
    guard(|| {
        let bytes = runtime_of(rt)?.empty_cache(device as usize)?;
        if !released.is_null() {
            *out_ptr(released, "released")? = bytes;
        }
        Ok(())
    })
}

/// The pool's segments and blocks as JSON. `*json` is NUL-terminated and
/// owned by the caller, who frees it with `tpurt_string_free`.
#[no_mangle]
pub extern "C" fn tpurt_memory_snapshot(
    rt: tpurt_runtime,
    device: u32,
    json: *mut *mut c_char,
) -> *mut tpurt_status {
    guard(|| {
        let out = out_ptr(json, "json")?;
        let text = runtime_of(rt)?.memory_snapshot(device as usize)?.to_json();
        *out = CString::new(text).unwrap_or_default().into_raw();
        Ok(())
    })
}

/// Free a string that tpurt returned. NULL is allowed.
#[no_mangle]
pub extern "C" fn tpurt_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: s came from CString::into_raw in this library and is freed once (caller's contract).
        drop(unsafe { CString::from_raw(s) });
    }
}
