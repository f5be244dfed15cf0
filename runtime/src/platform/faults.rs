//! Fault injection, for tests: a platform that wraps another and fails on
//! demand at the points where a real device fails: allocating a segment,
//! compiling (or loading) a program, launching one, and copying bytes in
//! or out of device memory.
//!
//! Each point has a plan: let the next `skip` calls through, then fail the
//! `fail` calls after them (a failure is an `Unavailable` error whose
//! message says "injected fault" and names the point and what it was
//! doing). A runtime built over a `FaultPlatform` is an ordinary runtime;
//! the plans belong to that platform alone, so tests in one process do not
//! disturb each other.
//!
//! Segments and executables are wrapped to count their calls; a wrapped
//! segment answers `as_any` with the inner one, so the wrapped platform's
//! kernels still find their own memory.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{DeviceInfo, DeviceMemory, Executable, Platform, Segment};
use crate::error::{Error, Result};
use crate::ir::{Graph, TensorType};
use crate::tensor::DeviceTensor;

/// Where a fault can be injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// `Platform::allocate_segment`.
    SegmentAllocation,
    /// `Platform::compile` and `Platform::load_executable`.
    Compile,
    /// `Executable::execute`.
    Launch,
    /// A segment's `write`, `read`, `copy_to` and `fill`.
    Copy,
}

impl FaultPoint {
    pub const ALL: [FaultPoint; 4] = [
        FaultPoint::SegmentAllocation,
        FaultPoint::Compile,
        FaultPoint::Launch,
        FaultPoint::Copy,
    ];

    fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            FaultPoint::SegmentAllocation => "segment allocation",
            FaultPoint::Compile => "compile",
            FaultPoint::Launch => "launch",
            FaultPoint::Copy => "copy",
        }
    }
}

#[derive(Default)]
struct Plan {
    skip: AtomicU64,
    fail: AtomicU64,
    calls: AtomicU64,
    injected: AtomicU64,
}

/// The plans of every point, shared by a platform and what it hands out.
#[derive(Default)]
pub struct Faults {
    plans: [Plan; 4],
}

impl Faults {
    /// Let the next `skip` calls at `point` through, then fail `fail`.
    pub fn arm(&self, point: FaultPoint, skip: u64, fail: u64) {
        let p = &self.plans[point.index()];
        p.skip.store(skip, Ordering::SeqCst);
        p.fail.store(fail, Ordering::SeqCst);
    }

    /// No more faults anywhere.
    pub fn disarm(&self) {
        for p in &self.plans {
            p.skip.store(0, Ordering::SeqCst);
            p.fail.store(0, Ordering::SeqCst);
        }
    }

    /// Calls seen at `point` (failed or not).
    pub fn calls(&self, point: FaultPoint) -> u64 {
        self.plans[point.index()].calls.load(Ordering::SeqCst)
    }

    /// Faults injected at `point` so far.
    pub fn injected(&self, point: FaultPoint) -> u64 {
        self.plans[point.index()].injected.load(Ordering::SeqCst)
    }

    /// One call at `point`, doing `what`: an error when the plan says so.
    fn hit(&self, point: FaultPoint, what: impl FnOnce() -> String) -> Result<()> {
        let p = &self.plans[point.index()];
        p.calls.fetch_add(1, Ordering::SeqCst);
        let take = |c: &AtomicU64| {
            c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
                .is_ok()
        };
        if take(&p.skip) || !take(&p.fail) {
            return Ok(());
        }
        p.injected.fetch_add(1, Ordering::SeqCst);
        Err(Error::Unavailable(format!(
            "injected fault at {}: {}",
            point.name(),
            what()
        )))
    }
}

/// A platform that fails on demand (see the module docs).
#[derive(Debug)]
pub struct FaultPlatform {
    inner: Arc<dyn Platform>,
    faults: Arc<Faults>,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Faults");
        for point in FaultPoint::ALL {
            d.field(point.name(), &self.injected(point));
        }
        d.finish()
    }
}

impl FaultPlatform {
    pub fn new(inner: Arc<dyn Platform>) -> Self {
        FaultPlatform {
            inner,
            faults: Arc::new(Faults::default()),
        }
    }

    pub fn faults(&self) -> &Arc<Faults> {
        &self.faults
    }

    fn wrap_exe(&self, exe: Arc<dyn Executable>) -> Arc<dyn Executable> {
        Arc::new(FaultExecutable {
            inner: exe,
            faults: Arc::clone(&self.faults),
        })
    }
}

impl Platform for FaultPlatform {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn version(&self) -> String {
        self.inner.version()
    }
    fn compile_options(&self) -> String {
        self.inner.compile_options()
    }
    fn defer_max_ops(&self) -> usize {
        self.inner.defer_max_ops()
    }
    fn topology(&self) -> &[u32] {
        self.inner.topology()
    }
    fn devices(&self) -> &[DeviceInfo] {
        self.inner.devices()
    }
    fn slice(&self) -> Option<&super::slice::SliceLayout> {
        self.inner.slice()
    }
    fn allocate_segment(&self, chip: usize, bytes: u64) -> Result<Segment> {
        self.faults.hit(FaultPoint::SegmentAllocation, || {
            format!("a segment of {bytes} bytes on chip {chip}")
        })?;
        let inner = self.inner.allocate_segment(chip, bytes)?;
        Ok(Arc::new(FaultSegment {
            inner,
            faults: Arc::clone(&self.faults),
        }))
    }
    fn compile(&self, graph: &Graph) -> Result<Arc<dyn Executable>> {
        self.faults.hit(FaultPoint::Compile, || {
            format!(
                "a program of {} nodes, {} inputs",
                graph.nodes().len(),
                graph.params().len()
            )
        })?;
        Ok(self.wrap_exe(self.inner.compile(graph)?))
    }
    fn load_executable(&self, bytes: &[u8]) -> Result<Arc<dyn Executable>> {
        self.faults.hit(FaultPoint::Compile, || {
            format!("loading a program of {} bytes", bytes.len())
        })?;
        Ok(self.wrap_exe(self.inner.load_executable(bytes)?))
    }
}

struct FaultExecutable {
    inner: Arc<dyn Executable>,
    faults: Arc<Faults>,
}

impl Executable for FaultExecutable {
    fn param_types(&self) -> &[TensorType] {
        self.inner.param_types()
    }
    fn output_types(&self) -> &[TensorType] {
        self.inner.output_types()
    }
    fn execute(&self, inputs: &[DeviceTensor], outputs: &[DeviceTensor]) -> Result<()> {
        self.faults.hit(FaultPoint::Launch, || {
            format!(
                "a program of {} inputs and {} outputs",
                inputs.len(),
                outputs.len()
            )
        })?;
        self.inner.execute(inputs, outputs)
    }
    fn serialize(&self) -> Option<Vec<u8>> {
        self.inner.serialize()
    }
}

#[derive(Debug)]
struct FaultSegment {
    inner: Segment,
    faults: Arc<Faults>,
}

impl std::fmt::Debug for FaultExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FaultExecutable")
    }
}

impl DeviceMemory for FaultSegment {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        self.faults.hit(FaultPoint::Copy, || {
            format!("writing {} bytes into device memory", src.len())
        })?;
        self.inner.write(offset, src)
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.faults.hit(FaultPoint::Copy, || {
            format!("reading {} bytes from device memory", dst.len())
        })?;
        self.inner.read(offset, dst)
    }
    fn copy_to(
        &self,
        offset: u64,
        dst: &dyn DeviceMemory,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        self.faults.hit(FaultPoint::Copy, || {
            format!("copying {len} bytes between device segments")
        })?;
        // `dst` answers as_any with its inner segment too.
        self.inner.copy_to(offset, dst, dst_offset, len)
    }
    fn fill(&self, offset: u64, len: u64, value: u8) -> Result<()> {
        self.faults.hit(FaultPoint::Copy, || {
            format!("filling {len} bytes of device memory")
        })?;
        self.inner.fill(offset, len, value)
    }
    fn as_any(&self) -> &dyn Any {
        // The inner platform's kernels look for their own segment type.
        self.inner.as_any()
    }
}
