//! Stream clocks and fences: the cheapest form of an event.
//!
//! Every stream counts the tasks submitted to it and the tasks it has
//! finished (run, failed or skipped). A [`Fence`] is a stream plus a
//! submission count; it is complete once the stream has finished that many
//! tasks. Because tasks on a stream finish in order, a fence taken after a
//! task was submitted completes only after that task. Fences cost two atomic
//! loads, which is why the HBM pool uses them for stream-ordered reuse.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_utils::sync::{Parker, Unparker};

use crate::error::{Error, Result};

/// Process-wide unique stream id (never reused, so a stale id can't alias).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct StreamId(pub u64);

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

/// Tokens of threads blocked in [`StreamClock::wait_for`]: the high half of
/// the range, apart from the executors' (which count up from 1).
static NEXT_WAIT_TOKEN: AtomicU64 = AtomicU64::new(1 << 63);

impl StreamId {
    pub fn fresh() -> Self {
        StreamId(NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed))
    }
}

/// The first task that failed on a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Submission number of the failed task.
    pub seq: u64,
    pub task: String,
    pub message: String,
}

#[derive(Debug)]
pub struct StreamClock {
    id: StreamId,
    submitted: AtomicU64,
    completed: AtomicU64,
    /// Threads (workers or hosts) to wake, each once the stream has
    /// finished the number of tasks it waits for: (token, until, thread).
    waiters: Mutex<Vec<(u64, u64, Unparker)>>,
    /// The smallest `until` among the waiters (`u64::MAX`: none). A
    /// completion below it takes no lock and wakes no one, so a thread
    /// waiting for the end of a long queue sleeps until then instead of
    /// waking (and stealing a core from the worker) at every task.
    wake_at: AtomicU64,
    poisoned: AtomicBool,
    failure: Mutex<Option<Failure>>,
}

impl StreamClock {
    pub fn new(id: StreamId) -> Arc<Self> {
        Arc::new(StreamClock {
            id,
            submitted: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            waiters: Mutex::new(Vec::new()),
            wake_at: AtomicU64::new(u64::MAX),
            poisoned: AtomicBool::new(false),
            failure: Mutex::new(None),
        })
    }

    pub fn id(&self) -> StreamId {
        self.id
    }

    /// A fence covering every task submitted so far.
    pub fn fence(self: &Arc<Self>) -> Fence {
        Fence {
            clock: Arc::clone(self),
            seq: self.submitted.load(Ordering::SeqCst),
        }
    }

    /// Reserve the next submission number (called when a task is enqueued).
    pub fn submit(&self) -> u64 {
        self.submitted.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Mark task `seq` finished. Tasks finish in order, so this is a store;
    /// the waiters whose count it reaches are woken.
    pub fn complete(&self, seq: u64) {
        self.completed.store(seq, Ordering::SeqCst);
        if seq >= self.wake_at.load(Ordering::SeqCst) {
            let due: Vec<Unparker> = {
                let mut w = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
                let mut due = Vec::new();
                w.retain(|(_, until, u)| {
                    if *until <= seq {
                        due.push(u.clone());
                        false
                    } else {
                        true
                    }
                });
                let next = w.iter().map(|(_, until, _)| *until).min();
                self.wake_at
                    .store(next.unwrap_or(u64::MAX), Ordering::SeqCst);
                due
            };
            for u in due {
                u.unpark();
            }
        }
    }

    /// Ask to be woken once the stream has finished its first `until`
    /// tasks. Register first, then check the condition, then park: a
    /// completion in between is never lost. A waiter that registers again
    /// under the same nonzero `token` before being woken is kept once, for
    /// the earlier of its two counts.
    pub fn add_waiter(&self, token: u64, until: u64, waiter: &Unparker) {
        let mut w = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        match w.iter_mut().find(|(t, _, _)| token != 0 && *t == token) {
            Some(entry) => entry.1 = entry.1.min(until),
            None => w.push((token, until, waiter.clone())),
        }
        self.wake_at.fetch_min(until, Ordering::SeqCst);
    }

    /// Waiters registered and not yet woken (for tests).
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Block the calling thread until the first `seq` tasks have finished.
    pub fn wait_for(&self, seq: u64) {
        if self.completed() >= seq {
            return;
        }
        let parker = Parker::new();
        // One entry for the whole wait, removed on the way out: the count
        // may be reached between registering and the first check, and
        // then no completion takes the entry away.
        let token = NEXT_WAIT_TOKEN.fetch_add(1, Ordering::Relaxed);
        self.add_waiter(token, seq, parker.unparker());
        while self.completed() < seq {
            // The timeout is only a safety net; completions unpark us.
            parker.park_timeout(Duration::from_millis(50));
        }
        self.remove_waiter(token);
    }

    /// Drop `token`'s entry, if it is still there.
    fn remove_waiter(&self, token: u64) {
        let mut w = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        w.retain(|(t, _, _)| *t != token);
    }

    /// Record the first failure; later ones are consequences of it.
    pub fn poison(&self, failure: Failure) {
        let mut f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_none() {
            *f = Some(failure);
            self.poisoned.store(true, Ordering::SeqCst);
        }
    }

    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::SeqCst)
    }

    pub fn failure(&self) -> Option<Failure> {
        if !self.is_poisoned() {
            return None;
        }
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The error to report for work up to submission `seq`, if any failed.
    pub fn error_up_to(&self, seq: u64) -> Result<()> {
        match self.failure() {
            Some(f) if f.seq <= seq => Err(Error::StreamPoisoned {
                stream: self.id.0,
                task: f.task,
                message: f.message,
            }),
            _ => Ok(()),
        }
    }

    /// Forget the failure (the caller has drained the stream first).
    pub fn clear_failure(&self) {
        let mut f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        *f = None;
        self.poisoned.store(false, Ordering::SeqCst);
    }

    pub fn submitted(&self) -> u64 {
        self.submitted.load(Ordering::SeqCst)
    }

    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::SeqCst)
    }

    pub fn is_idle(&self) -> bool {
        self.completed() >= self.submitted()
    }
}

/// "Everything submitted to stream X up to now": complete once X has
/// finished its first `seq` tasks.
#[derive(Clone, Debug)]
pub struct Fence {
    clock: Arc<StreamClock>,
    seq: u64,
}

impl Fence {
    pub fn is_complete(&self) -> bool {
        self.clock.completed() >= self.seq
    }

    pub fn stream(&self) -> StreamId {
        self.clock.id
    }

    pub fn seq(&self) -> u64 {
        self.seq
    }

    pub fn clock(&self) -> &Arc<StreamClock> {
        &self.clock
    }

    /// Block until complete; then report whether the covered work failed.
    pub fn wait(&self) -> Result<()> {
        self.clock.wait_for(self.seq);
        self.clock.error_up_to(self.seq)
    }

    /// Complete, and if so, whether the covered work failed.
    pub fn query(&self) -> Result<bool> {
        if !self.is_complete() {
            return Ok(false);
        }
        self.clock.error_up_to(self.seq).map(|_| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_completes_in_order() {
        let c = StreamClock::new(StreamId::fresh());
        let empty = c.fence();
        assert!(empty.is_complete(), "a fence on an idle stream is complete");
        let s1 = c.submit();
        let f1 = c.fence();
        let s2 = c.submit();
        let f2 = c.fence();
        assert!(!f1.is_complete() && !f2.is_complete());
        c.complete(s1);
        assert!(f1.is_complete() && !f2.is_complete());
        c.complete(s2);
        assert!(f2.is_complete());
        assert!(c.is_idle());
    }

    #[test]
    fn wait_for_wakes_on_completion_from_another_thread() {
        let c = StreamClock::new(StreamId::fresh());
        let seq = c.submit();
        let f = c.fence();
        let c2 = Arc::clone(&c);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            c2.complete(seq);
        });
        f.wait().unwrap();
        t.join().unwrap();
    }

    #[test]
    fn a_waiter_is_woken_only_when_its_count_is_reached() {
        let c = StreamClock::new(StreamId::fresh());
        let seqs: Vec<u64> = (0..3).map(|_| c.submit()).collect();
        let parker = Parker::new();
        c.add_waiter(0, seqs[2], parker.unparker());
        c.complete(seqs[0]);
        c.complete(seqs[1]);
        assert_eq!(
            c.waiting(),
            1,
            "completions before the count leave the waiter asleep"
        );
        assert_eq!(c.wake_at.load(Ordering::SeqCst), seqs[2]);
        c.complete(seqs[2]);
        assert_eq!(c.waiting(), 0);
        assert_eq!(c.wake_at.load(Ordering::SeqCst), u64::MAX);

        // One token registered twice keeps one entry, for the earlier count.
        let more: Vec<u64> = (0..2).map(|_| c.submit()).collect();
        c.add_waiter(7, more[1], parker.unparker());
        c.add_waiter(7, more[0], parker.unparker());
        assert_eq!(c.waiting(), 1);
        c.complete(more[0]);
        assert_eq!(c.waiting(), 0);
    }

    /// A thread in `wait_for` keeps one entry however often its safety
    /// timeout fires, and leaves none behind, also when the count was
    /// reached just as it registered. (It registered afresh at every
    /// timeout, and an early return left its entry until the next
    /// completion.)
    #[test]
    fn a_waiting_thread_keeps_one_entry_and_leaves_none() {
        let c = Arc::new(StreamClock::new(StreamId::fresh()));
        let s = c.submit();
        let waiter = {
            let c = Arc::clone(&c);
            std::thread::spawn(move || c.wait_for(s))
        };
        let registered = std::time::Instant::now() + Duration::from_secs(10);
        while c.waiting() == 0 && std::time::Instant::now() < registered {
            std::thread::yield_now();
        }
        // Three safety timeouts (50 ms each) pass while nothing completes.
        std::thread::sleep(Duration::from_millis(180));
        assert_eq!(c.waiting(), 1);
        c.complete(s);
        waiter.join().unwrap();
        assert_eq!(c.waiting(), 0);
        // Reached already: no entry is made or kept.
        c.wait_for(s);
        assert_eq!(c.waiting(), 0);
        // Reached between registering and the first check (simulated by a
        // registration under the same count): the entry goes on return.
        let s2 = c.submit();
        c.complete(s2);
        let token = NEXT_WAIT_TOKEN.fetch_add(1, Ordering::Relaxed);
        c.add_waiter(token, s2, Parker::new().unparker());
        c.remove_waiter(token);
        assert_eq!(c.waiting(), 0);
    }

    #[test]
    fn failure_is_reported_for_covered_work_only() {
        let c = StreamClock::new(StreamId::fresh());
        let s1 = c.submit();
        let before = c.fence();
        let s2 = c.submit();
        c.complete(s1);
        c.poison(Failure {
            seq: s2,
            task: "copy".into(),
            message: "boom".into(),
        });
        c.complete(s2);
        let after = c.fence();
        assert_eq!(before.query(), Ok(true));
        let e = after.wait().unwrap_err();
        assert!(e.to_string().contains("task 'copy' failed: boom"), "{e}");
        c.clear_failure();
        assert!(after.wait().is_ok());
    }
}
