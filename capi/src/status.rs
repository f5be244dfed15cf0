//! Status objects: how every call reports failure.

use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use tpurt_core::Error;
#[cfg(test)]
use tpurt_core::ErrorCode;

pub const TPURT_CODE_OK: u32 = 0;
pub const TPURT_CODE_INVALID_ARGUMENT: u32 = 1;
pub const TPURT_CODE_NOT_FOUND: u32 = 2;
pub const TPURT_CODE_OUT_OF_MEMORY: u32 = 3;
pub const TPURT_CODE_INVALID_HANDLE: u32 = 4;
pub const TPURT_CODE_STREAM_POISONED: u32 = 5;
pub const TPURT_CODE_FAILED_PRECONDITION: u32 = 6;
pub const TPURT_CODE_UNIMPLEMENTED: u32 = 7;
pub const TPURT_CODE_UNAVAILABLE: u32 = 8;
pub const TPURT_CODE_INTERNAL: u32 = 9;

/// An error: a code (`TPURT_CODE_*`) and a message. Owned by the caller,
/// who destroys it with `tpurt_status_destroy`.
pub struct tpurt_status {
    code: u32,
    message: CString,
}

pub(crate) fn status_of(e: Error) -> *mut tpurt_status {
    let text = e.to_string().replace('\0', " ");
    Box::into_raw(Box::new(tpurt_status {
        code: e.code() as u32,
        message: CString::new(text).unwrap_or_default(),
    }))
}

/// Run a call's body: errors become statuses, panics become INTERNAL.
pub(crate) fn guard(body: impl FnOnce() -> Result<(), Error>) -> *mut tpurt_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(e)) => status_of(e),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            status_of(Error::Internal(format!("panic inside tpurt: {what}")))
        }
    }
}

/// The status's code, one of `TPURT_CODE_*`; TPURT_CODE_OK for NULL.
#[no_mangle]
pub extern "C" fn tpurt_status_code(status: *const tpurt_status) -> u32 {
    // SAFETY: a non-null status came from this library and is not yet destroyed (caller's contract).
    unsafe { status.as_ref() }.map_or(TPURT_CODE_OK, |s| s.code)
}

/// The status's message, NUL-terminated, owned by the status (valid until
/// it is destroyed). "" for NULL.
#[no_mangle]
pub extern "C" fn tpurt_status_message(status: *const tpurt_status) -> *const c_char {
    // SAFETY: as in tpurt_status_code.
    match unsafe { status.as_ref() } {
        Some(s) => s.message.as_ptr(),
        None => c"".as_ptr(),
    }
}

/// Destroy a status. NULL is allowed and does nothing.
#[no_mangle]
pub extern "C" fn tpurt_status_destroy(status: *mut tpurt_status) {
    if !status.is_null() {
        // SAFETY: a non-null status came from Box::into_raw in status_of and
        // is destroyed once (caller's contract).
        drop(unsafe { Box::from_raw(status) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_codes_are_the_runtime_codes() {
        let pairs = [
            (TPURT_CODE_INVALID_ARGUMENT, ErrorCode::InvalidArgument),
            (TPURT_CODE_NOT_FOUND, ErrorCode::NotFound),
            (TPURT_CODE_OUT_OF_MEMORY, ErrorCode::OutOfMemory),
            (TPURT_CODE_INVALID_HANDLE, ErrorCode::InvalidHandle),
            (TPURT_CODE_STREAM_POISONED, ErrorCode::StreamPoisoned),
            (
                TPURT_CODE_FAILED_PRECONDITION,
                ErrorCode::FailedPrecondition,
            ),
            (TPURT_CODE_UNIMPLEMENTED, ErrorCode::Unimplemented),
            (TPURT_CODE_UNAVAILABLE, ErrorCode::Unavailable),
            (TPURT_CODE_INTERNAL, ErrorCode::Internal),
        ];
        for (c, e) in pairs {
            assert_eq!(c, e as u32, "{e}");
        }
    }

    #[test]
    fn panics_become_internal_statuses() {
        let s = guard(|| panic!("oops"));
        assert_eq!(tpurt_status_code(s), TPURT_CODE_INTERNAL);
        // SAFETY: the message pointer is valid until the status is destroyed.
        let msg = unsafe { std::ffi::CStr::from_ptr(tpurt_status_message(s)) };
        assert!(msg.to_str().unwrap().contains("oops"));
        tpurt_status_destroy(s);
        assert!(guard(|| Ok(())).is_null());
    }
}
