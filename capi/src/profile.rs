//! The profiler of the process (see tpurt-runtime's `profile`): what every
//! stream ran, and the kernels inside, between a start and a stop.

use std::ffi::{c_char, CString};

use crate::status::{guard, tpurt_status};

/// Start recording every task the process's streams run and every kernel
/// a host program runs. FAILED_PRECONDITION while a recording is under way.
/// Work queued before the call is recorded if it runs after it: synchronize
/// first for a clean start.
#[no_mangle]
pub extern "C" fn tpurt_profiler_start() -> *mut tpurt_status {
    guard(tpurt_core::profile::start)
}

/// Stop recording. `*json` (may be NULL: the recording is dropped) gets
/// the recording as JSON: `{"events": [{"kind": "task" | "kernel",
/// "name", "thread", "stream", "start_ns", "duration_ns"}, ...],
/// "dropped": n}`, NUL-terminated, owned by the caller, who frees it with
/// `tpurt_string_free`. Synchronize before stopping, or queued work is
/// missing. FAILED_PRECONDITION when nothing is recording.
#[no_mangle]
pub extern "C" fn tpurt_profiler_stop(json: *mut *mut c_char) -> *mut tpurt_status {
    guard(|| {
        let recording = tpurt_core::profile::stop()?;
        if !json.is_null() {
            let text = CString::new(recording.to_json()).unwrap_or_default();
            // SAFETY: a non-null out pointer points to writable memory for
            // one pointer (caller's contract).
            unsafe { *json = text.into_raw() };
        }
        Ok(())
    })
}
