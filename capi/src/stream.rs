//! Streams: creation, synchronization and cross-stream ordering.

use std::sync::Arc;

use tpurt_core::{CoreKind, Error, Result, Runtime, Stream};

use crate::event::{event_of, tpurt_event};
use crate::runtime::{
    check_struct_size, out_ptr, runtime_of, tpurt_runtime, versioned_field, RUNTIMES, STREAMS,
};
use crate::status::{guard, tpurt_status};

/// A stream. The zero handle means "the device's default stream" wherever
/// a stream is optional.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct tpurt_stream {
    pub handle: u64,
}

pub const TPURT_CORE_TENSOR: u32 = 0;
pub const TPURT_CORE_SPARSE: u32 = 1;

/// Options for `tpurt_stream_create`; NULL means priority 0 on the TensorCore.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tpurt_stream_options {
    pub struct_size: usize,
    /// Lower runs first (as torch: -1 is higher than 0).
    pub priority: i32,
    /// TPURT_CORE_TENSOR or TPURT_CORE_SPARSE.
    pub core: u32,
}

/// The stream and the runtime handle it belongs to.
pub(crate) fn stream_of(s: tpurt_stream) -> Result<(Stream, u64)> {
    STREAMS.get(s.handle)
}

/// `s`, or when it is the zero handle, the default stream of `device`.
pub(crate) fn stream_or_default(
    s: tpurt_stream,
    runtime: &Runtime,
    owner: u64,
    device: usize,
) -> Result<Stream> {
    if s.handle == 0 {
        return runtime.default_stream(device);
    }
    let (stream, stream_owner) = stream_of(s)?;
    if stream_owner != owner {
        return Err(Error::invalid("the stream belongs to a different runtime"));
    }
    Ok(stream)
}

fn runtime_of_owner(owner: u64) -> Result<Arc<Runtime>> {
    RUNTIMES.get(owner).map(|(r, _)| r)
}

#[no_mangle]
pub extern "C" fn tpurt_stream_create(
    rt: tpurt_runtime,
    device: u32,
    options: *const tpurt_stream_options,
    out: *mut tpurt_stream,
) -> *mut tpurt_status {
    guard(|| {
        let runtime = runtime_of(rt)?;
        let out = out_ptr(out, "out")?;
        let (priority, core) = if options.is_null() {
            (0, TPURT_CORE_TENSOR)
        } else {
            // SAFETY: non-null options are readable for struct_size bytes.
            unsafe {
                check_struct_size((*options).struct_size, "tpurt_stream_options")?;
                (
                    versioned_field!(options, tpurt_stream_options, priority, 0),
                    versioned_field!(options, tpurt_stream_options, core, TPURT_CORE_TENSOR),
                )
            }
        };
        let core = match core {
            TPURT_CORE_TENSOR => CoreKind::TensorCore,
            TPURT_CORE_SPARSE => CoreKind::SparseCore,
            other => {
                return Err(Error::invalid(format!(
                    "options.core is {other}; use TPURT_CORE_TENSOR (0) or TPURT_CORE_SPARSE (1)"
                )))
            }
        };
        let stream = runtime.create_stream(device as usize, core, priority)?;
        out.handle = STREAMS.insert(rt.handle, stream);
        Ok(())
    })
}

/// A handle to the default stream of `device` (destroying the handle leaves
/// the default stream in place).
#[no_mangle]
pub extern "C" fn tpurt_stream_get_default(
    rt: tpurt_runtime,
    device: u32,
    out: *mut tpurt_stream,
) -> *mut tpurt_status {
    guard(|| {
        let runtime = runtime_of(rt)?;
        let out = out_ptr(out, "out")?;
        let stream = runtime.default_stream(device as usize)?;
        out.handle = STREAMS.insert(rt.handle, stream);
        Ok(())
    })
}

/// Release the handle; queued work still runs.
#[no_mangle]
pub extern "C" fn tpurt_stream_destroy(stream: tpurt_stream) -> *mut tpurt_status {
    guard(|| STREAMS.remove(stream.handle).map(drop))
}

/// Launch the ops `stream` holds for defer-and-fuse now, as one program,
/// without waiting for them; `*launched` = how many there were (0 when
/// none). `launched` may be NULL.
#[no_mangle]
pub extern "C" fn tpurt_stream_flush(
    stream: tpurt_stream,
    launched: *mut usize,
) -> *mut tpurt_status {
    guard(|| {
        let n = stream_of(stream)?.0.flush()?;
        if !launched.is_null() {
            *out_ptr(launched, "launched")? = n;
        }
        Ok(())
    })
}

/// Launch the ops `stream` holds for defer-and-fuse now, as the op-count
/// limit would, at a step boundary the frontend knows of (an optimizer
/// step's start): unlike `tpurt_stream_flush` this does not observe the
/// stream, and the next recording runs up to the whole op-count limit
/// instead of starting small (also when nothing was held).
/// `*launched` = how many ops there were; `launched` may be NULL.
#[no_mangle]
pub extern "C" fn tpurt_stream_mark_step(
    stream: tpurt_stream,
    launched: *mut usize,
) -> *mut tpurt_status {
    guard(|| {
        let n = stream_of(stream)?.0.mark_step()?;
        if !launched.is_null() {
            *out_ptr(launched, "launched")? = n;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn tpurt_stream_synchronize(stream: tpurt_stream) -> *mut tpurt_status {
    guard(|| stream_of(stream)?.0.synchronize())
}

/// `*done` = whether all submitted work finished. A failure is returned as
/// the status.
#[no_mangle]
pub extern "C" fn tpurt_stream_query(stream: tpurt_stream, done: *mut bool) -> *mut tpurt_status {
    guard(|| {
        let done = out_ptr(done, "done")?;
        *done = stream_of(stream)?.0.query()?;
        Ok(())
    })
}

/// Later work on `stream` waits for the work `event` captured.
#[no_mangle]
pub extern "C" fn tpurt_stream_wait_event(
    stream: tpurt_stream,
    event: tpurt_event,
) -> *mut tpurt_status {
    guard(|| {
        let (s, owner) = stream_of(stream)?;
        let (e, event_owner) = event_of(event)?;
        if owner != event_owner {
            return Err(Error::invalid(
                "the event belongs to a different runtime than the stream",
            ));
        }
        s.wait_event(&e)
    })
}

/// Later work on `stream` waits for all work submitted to `other` so far.
#[no_mangle]
pub extern "C" fn tpurt_stream_wait_stream(
    stream: tpurt_stream,
    other: tpurt_stream,
) -> *mut tpurt_status {
    guard(|| {
        let (s, owner) = stream_of(stream)?;
        let (o, other_owner) = stream_of(other)?;
        if owner != other_owner {
            return Err(Error::invalid(
                "the two streams belong to different runtimes",
            ));
        }
        s.wait_stream(&o)
    })
}

/// Drain a failed stream and clear its error so it can be used again. The
/// error that was cleared is not reported; query first to see it.
#[no_mangle]
pub extern "C" fn tpurt_stream_reset(stream: tpurt_stream) -> *mut tpurt_status {
    guard(|| {
        let (s, owner) = stream_of(stream)?;
        runtime_of_owner(owner)?;
        s.reset();
        Ok(())
    })
}

/// The stream's device, priority and core.
#[no_mangle]
pub extern "C" fn tpurt_stream_get_info(
    stream: tpurt_stream,
    device: *mut u32,
    priority: *mut i32,
    core: *mut u32,
) -> *mut tpurt_status {
    guard(|| {
        let (s, _) = stream_of(stream)?;
        *out_ptr(device, "device")? = s.chip() as u32;
        *out_ptr(priority, "priority")? = s.priority();
        *out_ptr(core, "core")? = s.core() as u32;
        Ok(())
    })
}
