use std::borrow::Cow;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use super::clock::Fence;
use super::executor::TaskKind;
use super::stream::Stream;
use crate::error::{Error, Result};

/// A point in a stream's work. Record it on a stream, then query it, wait
/// for it on the host, make other streams wait for it, or time between two.
#[derive(Clone, Debug)]
pub struct Event {
    inner: Arc<Mutex<Recorded>>,
    timing: bool,
}

#[derive(Debug, Default)]
struct Recorded {
    fence: Option<Fence>,
    stamp: Option<Arc<OnceLock<Instant>>>,
}

impl Event {
    /// `timing`: the event also stamps the time its stream reached it,
    /// at the cost of a task on the stream.
    pub fn new(timing: bool) -> Event {
        Event {
            inner: Arc::new(Mutex::new(Recorded::default())),
            timing,
        }
    }

    pub fn has_timing(&self) -> bool {
        self.timing
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Capture all work submitted to `stream` so far (re-recording replaces
    /// the earlier capture).
    pub fn record(&self, stream: &Stream) -> Result<()> {
        let stamp = if self.timing {
            let cell = Arc::new(OnceLock::new());
            stream.push(
                Cow::Borrowed("event_record"),
                TaskKind::Stamp(Arc::clone(&cell)),
            )?;
            Some(cell)
        } else {
            None
        };
        let mut st = self.state();
        st.fence = Some(stream.fence());
        st.stamp = stamp;
        Ok(())
    }

    pub fn fence(&self) -> Option<Fence> {
        self.state().fence.clone()
    }

    pub fn is_recorded(&self) -> bool {
        self.state().fence.is_some()
    }

    /// Whether the captured work finished (true if never recorded); the
    /// error of a failed task it covers.
    pub fn query(&self) -> Result<bool> {
        match self.fence() {
            Some(f) => f.query(),
            None => Ok(true),
        }
    }

    /// Block until the captured work finished; the error of a failed task it covers.
    pub fn synchronize(&self) -> Result<()> {
        match self.fence() {
            Some(f) => f.wait(),
            None => Ok(()),
        }
    }

    /// Milliseconds from `self` to `end`; both need timing, both must have
    /// completed.
    pub fn elapsed_time(&self, end: &Event) -> Result<f64> {
        let stamp = |e: &Event, which: &str| -> Result<Instant> {
            if !e.timing {
                return Err(Error::FailedPrecondition(format!(
                    "the {which} event was created without timing"
                )));
            }
            let st = e.state();
            let cell = st.stamp.as_ref().ok_or_else(|| {
                Error::FailedPrecondition(format!("the {which} event has not been recorded"))
            })?;
            cell.get().copied().ok_or_else(|| {
                Error::FailedPrecondition(format!(
                    "the {which} event has not completed yet (synchronize it first)"
                ))
            })
        };
        let a = stamp(self, "start")?;
        let b = stamp(end, "end")?;
        Ok(if b >= a {
            (b - a).as_secs_f64() * 1e3
        } else {
            -((a - b).as_secs_f64() * 1e3)
        })
    }
}
