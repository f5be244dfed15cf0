//! The tpurt C ABI. This crate only translates: it checks what a frontend
//! passes, turns handles into runtime objects and runtime errors into
//! status objects. No logic lives here.
//!
//! Rules (as the PJRT C API):
//! - Every call returns a `tpurt_status*`: NULL on success, otherwise an
//!   object with a code and a message that the caller destroys with
//!   `tpurt_status_destroy`.
//! - Handles are opaque 64-bit values checked on every use: null, stale,
//!   freed twice, of the wrong kind or of another runtime is an error, never
//!   a crash. Destroying a runtime invalidates every handle made from it.
//! - Structs passed in start with `struct_size`; fields past the caller's
//!   size take their defaults, so old callers keep working.
//! - A panic inside tpurt is caught and returned as TPURT_CODE_INTERNAL.
#![allow(non_camel_case_types)]
// These are C entry points: their pointer contract (valid for the call, or
// as the function's comment says) is stated in the header. Marking them
// `unsafe fn` would change nothing for C callers; every dereference still
// sits in an `unsafe` block with its SAFETY line.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

mod buffer;
mod device;
mod event;
mod handles;
mod memory;
mod ops;
mod profile;
mod runtime;
mod status;
mod stream;

pub use buffer::*;
pub use device::*;
pub use event::*;
pub use memory::*;
pub use ops::*;
pub use profile::*;
pub use runtime::*;
pub use status::*;
pub use stream::*;

/// Version of this C ABI. A change that breaks old callers raises it.
pub const TPURT_ABI_VERSION: u32 = 1;
