//! Events: record, query, wait and time.

use tpurt_core::{Error, Event, Result};

use crate::runtime::{out_ptr, runtime_of, tpurt_runtime, EVENTS};
use crate::status::{guard, tpurt_status};
use crate::stream::{stream_of, tpurt_stream};

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct tpurt_event {
    pub handle: u64,
}

/// Flag for `tpurt_event_create`: the event stamps time, for `tpurt_event_elapsed_time`.
pub const TPURT_EVENT_TIMING: u32 = 1;

pub(crate) fn event_of(e: tpurt_event) -> Result<(Event, u64)> {
    EVENTS.get(e.handle)
}

#[no_mangle]
pub extern "C" fn tpurt_event_create(
    rt: tpurt_runtime,
    flags: u32,
    out: *mut tpurt_event,
) -> *mut tpurt_status {
    guard(|| {
        let runtime = runtime_of(rt)?;
        let out = out_ptr(out, "out")?;
        if flags & !TPURT_EVENT_TIMING != 0 {
            return Err(Error::invalid(format!(
                "unknown event flags {:#x}",
                flags & !TPURT_EVENT_TIMING
            )));
        }
        let event = runtime.create_event(flags & TPURT_EVENT_TIMING != 0);
        out.handle = EVENTS.insert(rt.handle, event);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn tpurt_event_destroy(event: tpurt_event) -> *mut tpurt_status {
    guard(|| EVENTS.remove(event.handle).map(drop))
}

/// Capture all work submitted to `stream` so far.
#[no_mangle]
pub extern "C" fn tpurt_event_record(
    event: tpurt_event,
    stream: tpurt_stream,
) -> *mut tpurt_status {
    guard(|| {
        let (e, owner) = event_of(event)?;
        let (s, stream_owner) = stream_of(stream)?;
        if owner != stream_owner {
            return Err(Error::invalid(
                "the event belongs to a different runtime than the stream",
            ));
        }
        e.record(&s)
    })
}

/// `*done` = whether the captured work finished (true if never recorded).
#[no_mangle]
pub extern "C" fn tpurt_event_query(event: tpurt_event, done: *mut bool) -> *mut tpurt_status {
    guard(|| {
        let done = out_ptr(done, "done")?;
        *done = event_of(event)?.0.query()?;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn tpurt_event_synchronize(event: tpurt_event) -> *mut tpurt_status {
    guard(|| event_of(event)?.0.synchronize())
}

/// Milliseconds between two completed timing events.
#[no_mangle]
pub extern "C" fn tpurt_event_elapsed_time(
    start: tpurt_event,
    end: tpurt_event,
    ms: *mut f32,
) -> *mut tpurt_status {
    guard(|| {
        let ms = out_ptr(ms, "ms")?;
        let (a, _) = event_of(start)?;
        let (b, _) = event_of(end)?;
        *ms = a.elapsed_time(&b)? as f32;
        Ok(())
    })
}
