//! The profiler: while it records, every task an executor runs (an op's
//! launch, a deferred recording's program, a copy, a wait) and every
//! kernel a host program runs inside it is kept as an event: what it was,
//! where it ran, when it started and how long it took. One per process,
//! as torch.profiler is, so it sees the work of every runtime and stream.
//!
//! Promises:
//! - Off (the default), it costs one relaxed atomic load per task and per
//!   host kernel; names are made only while recording.
//! - Events are kept in the order they finish, up to `MAX_EVENTS`; later
//!   ones are counted as dropped, never grow memory without bound.
//! - Times are nanoseconds from the start of the recording, on the
//!   monotonic clock; a task's kernels lie inside its span.
//! - Work still queued when recording stops is not recorded: synchronize
//!   first (the PyTorch binding's `torch.tpu.profiler.profile` does).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::{Error, Result};

/// Events kept per recording: about 100 MB of names at most.
pub const MAX_EVENTS: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A task of a stream, named as its errors name it (the op, `copy_*`,
    /// `wait_event`, a deferred recording's program).
    Task,
    /// A kernel of a host program: one loop pass, row kernel or primitive.
    Kernel,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Event {
    pub kind: EventKind,
    pub name: String,
    /// The thread it ran on (an executor is named after its chip and core,
    /// `tpurt-chip0-tc`; a host kernel may run on a pool thread).
    pub thread: String,
    /// The stream of a task; 0 for a kernel.
    pub stream: u64,
    pub start_ns: u64,
    pub duration_ns: u64,
}

/// What one recording holds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Recording {
    pub events: Vec<Event>,
    /// Events past `MAX_EVENTS`, not kept.
    pub dropped: u64,
}

impl Recording {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

static RECORDING: AtomicBool = AtomicBool::new(false);

struct State {
    epoch: Instant,
    recording: Recording,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn state() -> std::sync::MutexGuard<'static, Option<State>> {
    // A panic while holding the lock leaves plain data behind: keep it.
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Start a recording. An error while one is under way.
pub fn start() -> Result<()> {
    let mut s = state();
    if s.is_some() {
        return Err(Error::FailedPrecondition(
            "the profiler is already recording; stop it first".into(),
        ));
    }
    *s = Some(State {
        epoch: Instant::now(),
        recording: Recording::default(),
    });
    RECORDING.store(true, Ordering::SeqCst);
    Ok(())
}

/// Stop the recording and return what it holds. An error when none is
/// under way.
pub fn stop() -> Result<Recording> {
    let mut s = state();
    RECORDING.store(false, Ordering::SeqCst);
    s.take()
        .map(|st| st.recording)
        .ok_or_else(|| Error::FailedPrecondition("the profiler is not recording".into()))
}

/// Whether a recording is under way (cheap: for the callers' fast path).
#[inline]
pub fn recording() -> bool {
    RECORDING.load(Ordering::Relaxed)
}

/// Keep an event that started at `start` and took `duration`; `name` is
/// called only while recording.
pub fn record(
    kind: EventKind,
    name: impl FnOnce() -> String,
    stream: u64,
    start: Instant,
    duration: Duration,
) {
    if !recording() {
        return;
    }
    let name = name();
    let thread = std::thread::current().name().unwrap_or("").to_string();
    let mut s = state();
    let Some(st) = s.as_mut() else {
        return;
    };
    // Work that began before the recording counts from its start.
    let start_ns = start.saturating_duration_since(st.epoch).as_nanos() as u64;
    if st.recording.events.len() >= MAX_EVENTS {
        st.recording.dropped += 1;
        return;
    }
    st.recording.events.push(Event {
        kind,
        name,
        thread,
        stream,
        start_ns,
        duration_ns: duration.as_nanos() as u64,
    });
}

/// Tests that start and stop the process's one profiler take turns.
#[cfg(test)]
pub(crate) static TEST_LOCK: Mutex<()> = Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recording_keeps_events_between_start_and_stop_only() {
        let _turn = TEST_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let t = Instant::now();
        record(
            EventKind::Task,
            || "before".into(),
            1,
            t,
            Duration::from_micros(5),
        );
        assert!(stop().is_err(), "nothing is recording");
        start().unwrap();
        assert!(start().is_err(), "one recording at a time");
        record(
            EventKind::Task,
            || "add".into(),
            3,
            Instant::now(),
            Duration::from_micros(7),
        );
        record(
            EventKind::Kernel,
            || "loop".into(),
            0,
            Instant::now(),
            Duration::from_micros(2),
        );
        record(
            EventKind::Task,
            || "add".into(),
            3,
            Instant::now(),
            Duration::from_micros(3),
        );
        let r = stop().unwrap();
        record(
            EventKind::Task,
            || "after".into(),
            1,
            t,
            Duration::from_micros(5),
        );
        let names: Vec<&str> = r.events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["add", "loop", "add"]);
        assert_eq!(r.events[0].stream, 3);
        assert_eq!(r.events[0].duration_ns, 7_000);
        assert_eq!(r.events[1].kind, EventKind::Kernel);
        assert_eq!(r.events[2].duration_ns, 3_000);
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["events"][1]["kind"], "kernel");
        assert_eq!(json["dropped"], 0);
    }

    /// A strict op and a deferred recording on the host platform: each is
    /// a task of its stream, its kernels lie inside it, and the kernels
    /// say what they computed.
    #[test]
    fn tasks_and_their_host_kernels_are_recorded() {
        use crate::eager::{pop_mode, push_mode, EagerMode};
        use crate::ir::DType;
        use crate::ops::{self, Attr, Attrs};
        use crate::{DeviceTensor, Layout, Runtime, RuntimeOptions};
        let _turn = TEST_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let r = Runtime::new(&RuntimeOptions {
            platform: Some("host".into()),
            cache: Some(crate::compile::CacheConfig::memory_only(64)),
            ..Default::default()
        })
        .unwrap();
        let s = r.default_stream(0).unwrap();
        let vals: Vec<f32> = (0..64 * 300).map(|i| (i % 17) as f32 * 0.25).collect();
        let b = r.allocate(0, 64 * 300 * 4, &s).unwrap();
        r.copy_host_to_device(
            bytemuck::cast_slice(&vals),
            &b,
            &Layout::bytes(64 * 300 * 4),
            &s,
        )
        .unwrap();
        let x = DeviceTensor::contiguous(b, DType::F32, &[64, 300]).unwrap();
        let call = |name: &str, ins: &[DeviceTensor], attrs: Attrs| {
            r.call_op_alloc(ops::lookup(name).unwrap(), ins, &attrs, &s)
                .unwrap()
                .remove(0)
        };
        let last = Attrs::new().with("dim", Attr::Int(-1));
        start().unwrap();
        let y = call("softmax", std::slice::from_ref(&x), last.clone());
        push_mode(EagerMode::DeferAndFuse).unwrap();
        let e = call("exp", &[y], Attrs::new());
        let z = call("log_softmax", &[e], last);
        pop_mode().unwrap();
        s.synchronize().unwrap();
        let rec = stop().unwrap();
        drop(z);
        let tasks: Vec<&Event> = rec
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Task && e.stream == s.id().0)
            .collect();
        let names: Vec<&str> = tasks.iter().map(|e| e.name.as_str()).collect();
        assert!(names.contains(&"softmax"), "{names:?}");
        assert_eq!(
            tasks.len(),
            2,
            "the op, then one deferred program: {names:?}"
        );
        let kernels: Vec<&Event> = rec
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Kernel)
            .collect();
        let rows = |e: &&&Event| {
            e.name
                .starts_with("rows [64,300] (3 phases, by row blocks): ")
        };
        assert_eq!(kernels.iter().filter(rows).count(), 1, "{kernels:#?}");
        assert!(
            kernels.iter().any(|k| k.name.contains("exp")),
            "{kernels:#?}"
        );
        for k in &kernels {
            let inside = tasks.iter().any(|t| {
                t.start_ns <= k.start_ns && k.start_ns + k.duration_ns <= t.start_ns + t.duration_ns
            });
            assert!(inside, "{k:?} lies in no task: {tasks:?}");
        }
    }
}
