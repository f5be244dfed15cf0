use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::clock::{Fence, StreamClock, StreamId};
use super::event::Event;
use super::executor::{Executor, Launch, StreamQueue, TaskKind};
use crate::error::{Error, Result};
use crate::platform::CoreKind;

/// An in-order queue of work on one core of one chip. Cheap to clone; the
/// stream lives while any clone does (and until its queued work finished).
#[derive(Clone)]
pub struct Stream {
    inner: Arc<StreamInner>,
}

struct StreamInner {
    queue: Arc<StreamQueue>,
    executor: Arc<Executor>,
    chip: usize,
    core: CoreKind,
    is_default: bool,
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        self.queue.closed.store(true, Ordering::SeqCst);
        self.executor.notify();
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("id", &self.id().0)
            .field("chip", &self.inner.chip)
            .field("core", &self.inner.core)
            .field("priority", &self.priority())
            .finish()
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner.queue, &other.inner.queue)
    }
}
impl Eq for Stream {}

impl Stream {
    pub(crate) fn new(
        executor: &Arc<Executor>,
        chip: usize,
        core: CoreKind,
        priority: i32,
        is_default: bool,
    ) -> Result<Stream> {
        let queue = Arc::new(StreamQueue::new(
            StreamClock::new(StreamId::fresh()),
            priority,
        ));
        executor.attach(Arc::clone(&queue))?;
        Ok(Stream {
            inner: Arc::new(StreamInner {
                queue,
                executor: Arc::clone(executor),
                chip,
                core,
                is_default,
            }),
        })
    }

    pub fn id(&self) -> StreamId {
        self.inner.queue.clock.id()
    }
    pub fn chip(&self) -> usize {
        self.inner.chip
    }
    pub fn core(&self) -> CoreKind {
        self.inner.core
    }
    pub fn priority(&self) -> i32 {
        self.inner.queue.priority
    }
    pub fn is_default(&self) -> bool {
        self.inner.is_default
    }
    pub fn clock(&self) -> &Arc<StreamClock> {
        &self.inner.queue.clock
    }

    /// Enqueue `work`; it runs after everything submitted before it. If an
    /// earlier task failed, this returns that error instead.
    pub fn submit(
        &self,
        name: impl Into<Cow<'static, str>>,
        work: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> Result<()> {
        self.clock().error_up_to(u64::MAX)?;
        self.push(name.into(), TaskKind::Run(Box::new(work)))
    }

    /// Queue `exe` over `inputs` then `outputs` (see [`Launch`]): as
    /// [`Self::submit`], with no allocation.
    pub(crate) fn launch(
        &self,
        name: &'static str,
        exe: Arc<dyn crate::platform::Executable>,
        inputs: &[crate::tensor::DeviceTensor],
        outputs: &[crate::tensor::DeviceTensor],
    ) -> Result<()> {
        super::executor::bury(&self.inner.queue);
        self.clock().error_up_to(u64::MAX)?;
        let launch = Launch::new(exe, inputs, outputs, &self.inner.queue);
        self.push(Cow::Borrowed(name), TaskKind::Launch(launch))
    }

    /// As [`Self::submit`], for work that touches only `buffers`: deferred
    /// ops that touch none of them stay recorded (see
    /// `Executor::push_touching`).
    pub fn submit_touching(
        &self,
        buffers: &[&crate::buffer::Buffer],
        name: impl Into<Cow<'static, str>>,
        work: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> Result<()> {
        self.clock().error_up_to(u64::MAX)?;
        let ids: Vec<usize> = buffers.iter().map(|b| b.id()).collect();
        self.inner.executor.push_touching(
            &self.inner.queue,
            &ids,
            name.into(),
            TaskKind::Run(Box::new(work)),
        )
    }

    pub(crate) fn push(&self, name: Cow<'static, str>, kind: TaskKind) -> Result<()> {
        self.inner.executor.push(&self.inner.queue, name, kind)
    }

    /// A fence over everything submitted so far (deferred ops are flushed
    /// first, so the fence covers them).
    pub fn fence(&self) -> Fence {
        let _ = self.flush();
        self.clock().fence()
    }

    /// Launch this stream's deferred ops now (DEFER_AND_FUSE), as one
    /// program; returns how many there were. The work runs
    /// asynchronously, as any launch.
    pub fn flush(&self) -> Result<usize> {
        self.inner.executor.flush(&self.inner.queue)
    }

    /// Launch this stream's deferred ops now, as the op-count limit would
    /// (see `lazy`): a step boundary the frontend knows of, such as an
    /// optimizer step's start. Unlike [`Self::flush`] it does not observe
    /// the stream, and the next recording runs up to the whole limit
    /// rather than the ramp's short first flushes. Returns how many ops
    /// there were.
    pub fn mark_step(&self) -> Result<usize> {
        self.inner.executor.mark_step(&self.inner.queue)
    }

    /// Record an op for the next flush.
    pub(crate) fn defer(
        &self,
        op: crate::lazy::Deferred,
        compiler: &Arc<crate::compile::Compiler>,
    ) -> Result<()> {
        self.clock().error_up_to(u64::MAX)?;
        self.inner.executor.defer(&self.inner.queue, op, compiler)
    }

    /// How many ops wait for the next flush.
    pub fn deferred_ops(&self) -> usize {
        self.inner
            .queue
            .lazy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Buffers finished launches handed back, not yet freed (tests).
    #[cfg(test)]
    pub(crate) fn graveyard_len(&self) -> usize {
        self.inner.queue.graveyard.len()
    }

    /// Emptied tensor lists kept for the next launches (tests).
    #[cfg(test)]
    pub(crate) fn spare_lists(&self) -> usize {
        self.inner.queue.spare_io.len()
    }

    /// Block until all submitted work finished; report the first failure.
    pub fn synchronize(&self) -> Result<()> {
        let r = self.fence().wait();
        super::executor::bury(&self.inner.queue);
        r
    }

    /// True when all submitted work finished; the first failure if one did.
    pub fn query(&self) -> Result<bool> {
        self.fence().query()
    }

    /// Later work on this stream waits until `fence` completes.
    pub fn wait_fence(&self, fence: Fence) -> Result<()> {
        if fence.stream() == self.id() {
            return Ok(()); // already ordered
        }
        self.push(Cow::Borrowed("wait_event"), TaskKind::Wait(fence))
    }

    /// Later work on this stream waits for the work `event` captured. An
    /// event never recorded is complete, so this is then a no-op (as CUDA).
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        match event.fence() {
            Some(f) => self.wait_fence(f),
            None => Ok(()),
        }
    }

    /// Later work on this stream waits for all work submitted to `other` so far.
    pub fn wait_stream(&self, other: &Stream) -> Result<()> {
        self.wait_fence(other.fence())
    }

    /// Drain the stream (skipping what the failure left queued) and clear
    /// its failure, so it can be used again. Returns the cleared error, if any.
    pub fn reset(&self) -> Option<Error> {
        let fence = self.fence();
        fence.clock().wait_for(fence.seq());
        let err = self.clock().error_up_to(u64::MAX).err();
        self.clock().clear_failure();
        err
    }
}
