//! A core's executor: one worker thread that runs the tasks of every stream
//! attached to one core (a chip's TensorCore or SparseCore).
//!
//! Promises:
//! - Tasks of one stream run in submission order, one at a time.
//! - Across streams, order exists only through wait tasks (events): a
//!   stream whose next task waits on an incomplete fence is skipped, never
//!   blocks the worker, so other streams keep running and nothing deadlocks.
//! - Priority is strict: lower numbers first (as torch: -1 beats 0); streams
//!   of equal priority take turns.
//! - A task that fails (or panics) poisons its stream: later tasks on it are
//!   skipped but still counted as finished, so waiters never hang.
//! - On shutdown the worker finishes every queued task, then exits.

use std::borrow::Cow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use crossbeam_utils::sync::{Parker, Unparker};

/// How long an idle worker polls for new work before parking.
const SPIN: Duration = Duration::from_micros(40);

use super::clock::{Failure, Fence, StreamClock};
use crate::compile::Compiler;
use crate::error::{Error, Result};
use crate::lazy::{self, Deferred, LazyQueue};

pub type TaskFn = Box<dyn FnOnce() -> Result<()> + Send>;

// A launch stays inline in its queue slot: boxing it is the allocation
// across threads that `Launch` exists to avoid.
pub(crate) enum TaskKind {
    Run(TaskFn),
    /// Run a compiled program: the common task, kept inline in the queue
    /// with no allocation of its own (see [`Launch`]).
    Launch(Launch),
    /// Wait until the fence completes; fail if the awaited work failed.
    Wait(Fence),
    /// Stamp the time the stream reached this point (timing events).
    Stamp(Arc<std::sync::OnceLock<Instant>>),
}

/// An executable with the work references to its inputs then outputs.
///
/// A launch is the task every eager op makes, so it allocates nothing of
/// its own: it lives inline in the task rather than in a boxed closure;
/// its list of tensors is one the stream used before (see
/// [`StreamQueue::spare_io`]); and a buffer whose last handle it holds when
/// it finishes (an output the frontend already dropped) goes back to the
/// stream's thread to be freed there. Memory the caller's thread allocates
/// and the worker frees is what glibc's allocator serializes on (each such
/// free takes the caller's arena lock while the caller allocates under
/// it), and at a tiny op per microsecond that lock decided the op's cost.
pub(crate) struct Launch {
    pub exe: Arc<dyn crate::platform::Executable>,
    pub io: Vec<crate::tensor::DeviceTensor>,
    pub inputs: usize,
}

impl Launch {
    /// The work references of `inputs` and `outputs` for `exe`, to be
    /// queued on `stream`.
    pub fn new(
        exe: Arc<dyn crate::platform::Executable>,
        inputs: &[crate::tensor::DeviceTensor],
        outputs: &[crate::tensor::DeviceTensor],
        stream: &StreamQueue,
    ) -> Self {
        let mut io = stream.spare_io.pop().unwrap_or_default();
        io.extend(
            inputs
                .iter()
                .chain(outputs)
                .map(|t| t.for_work(&stream.clock)),
        );
        Launch {
            exe,
            io,
            inputs: inputs.len(),
        }
    }

    /// Run it; the buffers it held last go to the stream's graveyard, and
    /// its emptied list to the stream's spares.
    fn run(self, stream: &StreamQueue) -> Result<()> {
        let Launch {
            exe,
            mut io,
            inputs,
        } = self;
        let (ins, outs) = io.split_at(inputs);
        let r = exe.execute(ins, outs);
        for t in io.drain(..) {
            // The count cannot rise under us at 1: no other handle is left
            // to clone from.
            if t.buffer.handle_count() == 1 {
                stream.graveyard.push(t.buffer);
            }
        }
        // Beyond the caps (rare: a deep queue, a flush of many tensors),
        // this one is freed here.
        if io.capacity() <= SPARE_IO_TENSORS && stream.spare_io.len() < SPARE_IO_LISTS {
            stream.spare_io.push(io);
        }
        r
    }
}

/// Free what finished launches handed back to the stream's thread.
pub(crate) fn bury(stream: &StreamQueue) {
    while let Some(b) = stream.graveyard.pop() {
        drop(b);
    }
}

pub(crate) struct Task {
    pub seq: u64,
    pub name: Cow<'static, str>,
    pub kind: TaskKind,
}

// The task queue allocates and zeroes its slots 31 at a time, and copies a
// task in and out: a task keeps what it holds behind pointers. (Tensors
// inline made it about 680 bytes, and that zeroing a fifth of a tiny op's
// instructions on the calling thread.)
const _: () = assert!(std::mem::size_of::<Task>() <= 80);

/// The part of a stream the executor sees.
pub(crate) struct StreamQueue {
    pub clock: Arc<StreamClock>,
    pub priority: i32,
    pub queue: SegQueue<Task>,
    /// Set when the stream's owner let go; the executor drops it once empty.
    pub closed: AtomicBool,
    /// Makes "take a number, enqueue" one step, so queue order is seq order.
    pub submit_lock: Mutex<()>,
    /// Ops recorded under DEFER_AND_FUSE, launched at the next flush.
    pub lazy: Mutex<LazyQueue>,
    pub has_lazy: AtomicBool,
    /// Flushes at the op limit since the stream was last observed
    /// (`lazy::flush_limit`).
    pub ramp: AtomicU32,
    /// Buffers whose last handle a finished launch held: the worker hands
    /// them back here and the stream's own thread frees them at its next
    /// launch or synchronize (see [`Launch`]).
    pub graveyard: SegQueue<crate::buffer::Buffer>,
    /// Emptied tensor lists of finished launches, for the next ones: a
    /// list's memory stays with the stream's threads, and a task holds
    /// a list's pointer rather than the tensors, so a slot is small (the
    /// task queue allocates and zeroes its slots 31 at a time).
    pub spare_io: SegQueue<Vec<crate::tensor::DeviceTensor>>,
}

/// Something observes `stream` (it flushes for a reason other than the op
/// limit or a view conflict): its next recording's limit ramps up from
/// the start again (`lazy::flush_limit`).
fn observed(stream: &StreamQueue) {
    // Read first: a strict-mode launch passes here every time, and a
    // store would take the cache line from the thread that recorded.
    if stream.ramp.load(Ordering::Relaxed) != 0 {
        stream.ramp.store(0, Ordering::Relaxed);
    }
}

/// How many emptied tensor lists a stream keeps at most (see
/// [`StreamQueue::spare_io`]): as many as launches a frontend that runs
/// ahead of the device keeps in flight, within reason. It keeps as many as
/// it had in flight at once, so a deep queue is paid for once.
const SPARE_IO_LISTS: usize = 4096;

/// The longest list kept: a spare serves any later launch, so one a flush
/// of hundreds of tensors grew would hold their room for tiny ones. (The
/// spares then hold at most 4096 x 16 descriptors, about 10 MiB.)
const SPARE_IO_TENSORS: usize = 16;

impl StreamQueue {
    pub fn new(clock: Arc<StreamClock>, priority: i32) -> Self {
        StreamQueue {
            clock,
            priority,
            queue: SegQueue::new(),
            closed: AtomicBool::new(false),
            submit_lock: Mutex::new(()),
            lazy: Mutex::new(LazyQueue::default()),
            has_lazy: AtomicBool::new(false),
            ramp: AtomicU32::new(0),
            graveyard: SegQueue::new(),
            spare_io: SegQueue::new(),
        }
    }
}

struct Registry {
    streams: Vec<Arc<StreamQueue>>,
    generation: u64,
}

pub(crate) struct Executor {
    name: String,
    token: u64,
    registry: RwLock<Registry>,
    generation: AtomicU64,
    unparker: Unparker,
    parker: Mutex<Option<Parker>>,
    shutdown: AtomicBool,
    worker: Mutex<Option<JoinHandle<()>>>,
}

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

impl Executor {
    pub fn new(name: String) -> Arc<Self> {
        let parker = Parker::new();
        let unparker = parker.unparker().clone();
        Arc::new(Executor {
            name,
            token: NEXT_TOKEN.fetch_add(1, Ordering::Relaxed),
            registry: RwLock::new(Registry {
                streams: Vec::new(),
                generation: 0,
            }),
            generation: AtomicU64::new(0),
            unparker,
            parker: Mutex::new(Some(parker)),
            shutdown: AtomicBool::new(false),
            worker: Mutex::new(None),
        })
    }

    /// Attach a stream; the worker thread starts with the first stream.
    pub fn attach(self: &Arc<Self>, stream: Arc<StreamQueue>) -> Result<()> {
        if self.shutdown.load(Ordering::SeqCst) {
            return Err(Error::FailedPrecondition(format!(
                "executor {} is shutting down",
                self.name
            )));
        }
        {
            let mut reg = self.registry.write().unwrap_or_else(|e| e.into_inner());
            reg.streams.push(stream);
            // Stable sort keeps creation order among equal priorities.
            reg.streams.sort_by_key(|s| s.priority);
            reg.generation += 1;
            self.generation.store(reg.generation, Ordering::SeqCst);
        }
        self.start_worker()
    }

    fn start_worker(self: &Arc<Self>) -> Result<()> {
        let mut worker = self.worker.lock().unwrap_or_else(|e| e.into_inner());
        if worker.is_some() {
            return Ok(());
        }
        let parker = self
            .parker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| Error::Internal(format!("executor {} lost its parker", self.name)))?;
        let me = Arc::clone(self);
        let handle = std::thread::Builder::new()
            .name(self.name.clone())
            .spawn(move || me.run(parker))
            .map_err(|e| {
                Error::Unavailable(format!("could not start worker thread {}: {e}", self.name))
            })?;
        *worker = Some(handle);
        Ok(())
    }

    /// Wake the worker: new work, or a stream it waits on made progress.
    pub fn notify(&self) {
        self.unparker.unpark();
    }

    /// Enqueue a task on `stream` (attached to this executor) after its
    /// deferred ops, and wake the worker.
    pub fn push(
        &self,
        stream: &StreamQueue,
        name: Cow<'static, str>,
        kind: TaskKind,
    ) -> Result<()> {
        self.flush(stream)?;
        self.push_raw(stream, name, kind)
    }

    /// As [`Self::push`], for a task that touches only `buffers` (by id):
    /// the stream's deferred ops stay recorded when none of them touches
    /// those buffers, since running the task first is then unobservable.
    /// (A host-to-device copy of a scalar between deferred ops would
    /// otherwise split the recording in two.)
    pub fn push_touching(
        &self,
        stream: &StreamQueue,
        buffers: &[usize],
        name: Cow<'static, str>,
        kind: TaskKind,
    ) -> Result<()> {
        if stream.has_lazy.load(Ordering::SeqCst) {
            let mut q = stream.lazy.lock().unwrap_or_else(|e| e.into_inner());
            if q.touches(buffers) {
                observed(stream);
                self.flush_locked(stream, &mut q)?;
            }
        }
        self.push_raw(stream, name, kind)
    }

    /// Launch `stream`'s deferred ops as one fused program, if it has any;
    /// returns how many there were.
    pub fn flush(&self, stream: &StreamQueue) -> Result<usize> {
        observed(stream);
        if !stream.has_lazy.load(Ordering::SeqCst) {
            return Ok(0);
        }
        let mut q = stream.lazy.lock().unwrap_or_else(|e| e.into_inner());
        let n = q.len();
        self.flush_locked(stream, &mut q).map(|()| n)
    }

    fn flush_locked(&self, stream: &StreamQueue, q: &mut LazyQueue) -> Result<()> {
        // What finished launches handed back is freed here as on a strict
        // launch (`Stream::launch`): a thread that only ever records would
        // otherwise keep every buffer a flush held last (about 150 bytes
        // each, their memory long back in the pool) until a synchronize.
        bury(stream);
        let ops = q.take();
        stream.has_lazy.store(false, Ordering::SeqCst);
        if ops.is_empty() {
            return Ok(());
        }
        let Some(compiler) = q.compiler.clone() else {
            return Err(Error::Internal("deferred ops without a compiler".into()));
        };
        match lazy::prepare(&ops, &compiler, &mut q.memo) {
            Ok(Some(f)) => {
                // Work references: the recording's owners go at the end
                // of this call, after the task is queued.
                let launch = Launch::new(f.exe, &f.inputs, &f.outputs, stream);
                self.push_raw(stream, Cow::Owned(f.name), TaskKind::Launch(launch))
            }
            Ok(None) => Ok(()),
            // Surfaces, in order, at the stream's next synchronize.
            Err(e) => self.push_raw(
                stream,
                Cow::Borrowed("deferred ops"),
                TaskKind::Run(Box::new(move || Err(e))),
            ),
        }
    }

    /// Launch `stream`'s deferred ops as the op limit does (not an
    /// observation of the stream: the frontend goes on recording) and let
    /// the next recording run up to the whole limit; returns how many ops
    /// there were. A frontend marks a step's boundary so (an optimizer
    /// step's start): the ops on either side are never cut apart, and the
    /// step that follows is not cut into the short first flushes the ramp
    /// gives after an observation, since the device has the work before
    /// it queued (under strict mode, every launch before it, which resets
    /// the ramp, left it at its start).
    pub fn mark_step(&self, stream: &StreamQueue) -> Result<usize> {
        let mut n = 0;
        if stream.has_lazy.load(Ordering::SeqCst) {
            let mut q = stream.lazy.lock().unwrap_or_else(|e| e.into_inner());
            n = q.len();
            if n > 0 {
                self.flush_locked(stream, &mut q)?;
            }
        }
        stream.ramp.store(lazy::FULL_RAMP, Ordering::Relaxed);
        Ok(n)
    }

    /// Launch the recording as the op-count limit does: the limit's ramp
    /// goes one step up (a flush for any other reason resets it).
    fn flush_ramping(&self, stream: &StreamQueue, q: &mut LazyQueue) -> Result<()> {
        self.flush_locked(stream, q)?;
        let ramp = stream.ramp.load(Ordering::Relaxed);
        stream.ramp.store(ramp.saturating_add(1), Ordering::Relaxed);
        Ok(())
    }

    /// Record `op` on `stream` for a later flush (DEFER_AND_FUSE).
    pub fn defer(
        &self,
        stream: &StreamQueue,
        op: Deferred,
        compiler: &Arc<Compiler>,
    ) -> Result<()> {
        let mut q = stream.lazy.lock().unwrap_or_else(|e| e.into_inner());
        if q.conflicts(&op) {
            self.flush_locked(stream, &mut q)?;
        }
        if q.compiler.is_none() {
            q.compiler = Some(Arc::clone(compiler));
        }
        q.push(op);
        stream.has_lazy.store(true, Ordering::SeqCst);
        let max = lazy::max_ops(compiler.platform().defer_max_ops());
        if q.len() >= lazy::flush_limit(max, stream.ramp.load(Ordering::Relaxed)) {
            self.flush_ramping(stream, &mut q)?;
        }
        Ok(())
    }

    /// Whether any attached stream holds deferred ops.
    pub fn has_deferred(&self) -> bool {
        let reg = self.registry.read().unwrap_or_else(|e| e.into_inner());
        reg.streams
            .iter()
            .any(|s| s.has_lazy.load(Ordering::SeqCst))
    }

    /// Flush every attached stream.
    pub fn flush_all(&self) -> Result<()> {
        let streams: Vec<Arc<StreamQueue>> = {
            let reg = self.registry.read().unwrap_or_else(|e| e.into_inner());
            reg.streams.clone()
        };
        let mut first = Ok(());
        for s in &streams {
            let r = self.flush(s).map(|_| ());
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Enqueue without flushing deferred ops first.
    fn push_raw(
        &self,
        stream: &StreamQueue,
        name: Cow<'static, str>,
        kind: TaskKind,
    ) -> Result<()> {
        {
            let _order = stream.submit_lock.lock().unwrap_or_else(|e| e.into_inner());
            if self.shutdown.load(Ordering::SeqCst) {
                return Err(Error::FailedPrecondition(format!(
                    "cannot run '{name}': the runtime is shutting down"
                )));
            }
            let seq = stream.clock.submit();
            stream.queue.push(Task { seq, name, kind });
        }
        self.unparker.unpark();
        Ok(())
    }

    /// Free what finished launches handed back to every attached stream.
    pub fn bury_all(&self) {
        let reg = self.registry.read().unwrap_or_else(|e| e.into_inner());
        for s in &reg.streams {
            bury(s);
        }
    }

    /// Fences covering all work submitted so far to each attached stream
    /// (deferred ops are flushed first).
    pub fn fences(&self) -> Vec<Fence> {
        let _ = self.flush_all();
        let reg = self.registry.read().unwrap_or_else(|e| e.into_inner());
        reg.streams.iter().map(|s| s.clock.fence()).collect()
    }

    /// Finish all queued (and deferred) work and stop the worker.
    pub fn shutdown(&self) {
        let _ = self.flush_all();
        self.shutdown.store(true, Ordering::SeqCst);
        {
            // Barrier: a push that read "not shut down" has enqueued by now.
            let reg = self.registry.read().unwrap_or_else(|e| e.into_inner());
            for s in &reg.streams {
                drop(s.submit_lock.lock().unwrap_or_else(|e| e.into_inner()));
            }
        }
        self.unparker.unpark();
        let handle = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    fn snapshot(&self, seen: &mut u64, streams: &mut Vec<Slot>) {
        let generation = self.generation.load(Ordering::SeqCst);
        if generation == *seen {
            return;
        }
        let reg = self.registry.read().unwrap_or_else(|e| e.into_inner());
        let mut old = std::mem::take(streams);
        for s in &reg.streams {
            let held = old
                .iter()
                .position(|slot| Arc::ptr_eq(&slot.stream, s))
                .and_then(|i| old.swap_remove(i).held);
            streams.push(Slot {
                stream: Arc::clone(s),
                held,
            });
        }
        *seen = reg.generation;
    }

    /// Forget closed streams that have no work left.
    fn prune(&self, streams: &[Slot]) {
        let mut reg = self.registry.write().unwrap_or_else(|e| e.into_inner());
        let before = reg.streams.len();
        reg.streams.retain(|s| {
            let done = s.closed.load(Ordering::SeqCst) && s.queue.is_empty() && s.clock.is_idle();
            let held = streams
                .iter()
                .any(|slot| Arc::ptr_eq(&slot.stream, s) && slot.held.is_some());
            !done || held
        });
        if reg.streams.len() != before {
            reg.generation += 1;
            self.generation.store(reg.generation, Ordering::SeqCst);
        }
    }

    fn run(self: Arc<Self>, parker: Parker) {
        let mut seen = u64::MAX;
        let mut streams: Vec<Slot> = Vec::new();
        let mut idle_passes = 0u32;
        loop {
            self.snapshot(&mut seen, &mut streams);
            let ran = self.pass(&mut streams);
            if ran {
                idle_passes = 0;
                continue;
            }
            let pending = streams
                .iter()
                .any(|s| s.held.is_some() || !s.stream.queue.is_empty());
            if !pending && self.shutdown.load(Ordering::SeqCst) {
                // Re-check after observing shutdown: a racing submit is rejected
                // by the stream once shutdown is set, so an empty queue stays empty.
                self.snapshot(&mut seen, &mut streams);
                if streams
                    .iter()
                    .all(|s| s.held.is_none() && s.stream.queue.is_empty())
                {
                    return;
                }
                continue;
            }
            idle_passes += 1;
            if idle_passes.is_multiple_of(64) {
                self.prune(&streams);
            }
            if self.spin_for_work(&streams, seen) {
                continue;
            }
            // Completions and submissions unpark us; the timeout is a safety net.
            parker.park_timeout(Duration::from_millis(100));
        }
    }

    /// Poll briefly for new work before parking. Eager dispatch submits small
    /// ops a few microseconds apart; a worker that is still awake takes the
    /// next one without the submitter paying a wake-up system call (which
    /// costs more than a tiny op). Bounded by [`SPIN`], so an idle worker
    /// parks soon after its last task.
    fn spin_for_work(&self, streams: &[Slot], seen: u64) -> bool {
        let deadline = Instant::now() + SPIN;
        let mut polls = 0u32;
        loop {
            if self.generation.load(Ordering::SeqCst) != seen
                || streams.iter().any(|s| !s.stream.queue.is_empty())
            {
                return true;
            }
            polls += 1;
            if polls.is_multiple_of(32) && Instant::now() >= deadline {
                return false;
            }
            std::hint::spin_loop();
        }
    }

    /// One scheduling pass: the highest priority level with runnable work
    /// runs one task from each of its runnable streams.
    fn pass(&self, streams: &mut [Slot]) -> bool {
        let mut i = 0;
        while i < streams.len() {
            let level = streams[i].stream.priority;
            let mut j = i;
            let mut ran = false;
            while j < streams.len() && streams[j].stream.priority == level {
                ran |= self.step(&mut streams[j]);
                j += 1;
            }
            if ran {
                return true;
            }
            i = j;
        }
        false
    }

    /// Run the stream's next task if it can run now.
    fn step(&self, slot: &mut Slot) -> bool {
        let task = match slot.held.take().or_else(|| slot.stream.queue.pop()) {
            Some(t) => t,
            None => return false,
        };
        if let TaskKind::Wait(fence) = &task.kind {
            if !fence.is_complete() {
                fence
                    .clock()
                    .add_waiter(self.token, fence.seq(), &self.unparker);
                if !fence.is_complete() {
                    slot.held = Some(task);
                    return false;
                }
            }
        }
        execute(&slot.stream, task);
        true
    }
}

struct Slot {
    stream: Arc<StreamQueue>,
    /// A wait task taken from the queue whose fence is not complete yet.
    held: Option<Task>,
}

/// Run `f`, turning a panic into the task's error.
fn guarded(f: impl FnOnce() -> Result<()>) -> Result<()> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        Err(Error::Internal(format!(
            "task panicked: {}",
            panic_message(&panic)
        )))
    })
}

fn execute(stream: &StreamQueue, task: Task) {
    let clock = &stream.clock;
    let Task { seq, name, kind } = task;
    if clock.is_poisoned() {
        // Skipped: the stream already failed. Dropping the closure releases
        // whatever it captured (buffers, staging memory).
        drop(kind);
        clock.complete(seq);
        return;
    }
    let began = crate::profile::recording().then(Instant::now);
    let outcome = match kind {
        TaskKind::Run(f) => guarded(f),
        TaskKind::Launch(l) => guarded(|| l.run(stream)),
        TaskKind::Wait(fence) => fence.clock().error_up_to(fence.seq()).map_err(|e| {
            Error::FailedPrecondition(format!(
                "waited on work of stream {} that failed: {e}",
                fence.stream()
            ))
        }),
        TaskKind::Stamp(cell) => {
            let _ = cell.set(Instant::now());
            Ok(())
        }
    };
    if let Some(t0) = began {
        let took = t0.elapsed();
        let name = &name;
        crate::profile::record(
            crate::profile::EventKind::Task,
            || name.to_string(),
            clock.id().0,
            t0,
            took,
        );
    }
    if let Err(e) = outcome {
        let message = match e {
            Error::StreamPoisoned { message, .. } => message,
            other => other.to_string(),
        };
        clock.poison(Failure {
            seq,
            task: name.into_owned(),
            message,
        });
    }
    clock.complete(seq);
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}
