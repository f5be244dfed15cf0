//! The platform boundary. A platform speaks primitives only: it lists its
//! chips, hands out memory segments and moves bytes. Everything above
//! (pools, streams, ops) is written once, in the runtime.

pub mod faults;
pub mod host;
pub mod slice;
#[cfg(feature = "xla")]
pub mod xla;

use std::any::Any;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ir::{Graph, TensorType};
use crate::tensor::DeviceTensor;

/// One core of a chip that runs work: dense math or sparse lookups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[repr(u32)]
pub enum CoreKind {
    TensorCore = 0,
    SparseCore = 1,
}

/// What a frontend may learn about one chip.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    /// Index among this runtime's visible chips, 0-based.
    pub index: usize,
    /// For example "tpurt emulated TPU (host)".
    pub name: String,
    /// Kind of chip, for example "host-tpu".
    pub kind: String,
    /// Bytes of HBM this chip offers.
    pub hbm_capacity: u64,
    pub tensor_cores: u32,
    pub sparse_cores: u32,
    /// Coordinates in the mesh; as many entries as the mesh has dimensions.
    /// In a slice ([`slice::SliceLayout`]), in the whole slice's mesh.
    pub coords: Vec<u32>,
    /// The chip's index on its host (what `TPU_VISIBLE_CHIPS` lists); the
    /// same as `index` when every chip of the host is visible.
    pub host_chip: u32,
}

/// A contiguous range of device memory handed out by a platform. Dropping
/// the last reference returns it to the platform.
pub trait DeviceMemory: Send + Sync + std::fmt::Debug {
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copy `src` into this segment at `offset`.
    fn write(&self, offset: u64, src: &[u8]) -> Result<()>;
    /// Copy from this segment at `offset` into `dst`.
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()>;
    /// Copy `len` bytes to another segment of the same platform.
    fn copy_to(&self, offset: u64, dst: &dyn DeviceMemory, dst_offset: u64, len: u64)
        -> Result<()>;
    /// Set `len` bytes at `offset` to `value`.
    fn fill(&self, offset: u64, len: u64, value: u8) -> Result<()>;
    /// The buffer `owner` ([`crate::buffer::Buffer::identity`]) over these
    /// bytes is gone, with every handle and all the work that used it:
    /// what a platform kept of its values may go (the xla platform's
    /// resident values). Nothing by default.
    fn forget(&self, _offset: u64, _len: u64, _owner: usize) {}
    fn as_any(&self) -> &dyn Any;
}

pub type Segment = Arc<dyn DeviceMemory>;

/// A compiled program: one op, a fused group, or a whole graph.
pub trait Executable: Send + Sync {
    fn param_types(&self) -> &[TensorType];
    fn output_types(&self) -> &[TensorType];
    /// Run now, on the calling thread (a stream's worker): read `inputs`,
    /// write `outputs`. Outputs may alias inputs (in-place ops): every
    /// input is read before any output is written.
    fn execute(&self, inputs: &[DeviceTensor], outputs: &[DeviceTensor]) -> Result<()>;
    /// Bytes for the persistent compile cache, if the platform can reload them.
    fn serialize(&self) -> Option<Vec<u8>>;
}

/// [`Platform::defer_max_ops`] unless a platform says otherwise: on the
/// Llama step of `bench/` (host), 600 ops gave a step 6% faster than 4096
/// (see `lazy`).
pub const DEFER_MAX_OPS: usize = 600;

pub trait Platform: Send + Sync + std::fmt::Debug {
    /// "host" or "xla".
    fn name(&self) -> &str;
    /// Version of the platform (for the compile cache key).
    fn version(&self) -> String;
    /// Settings outside the graph that change what [`Platform::compile`]
    /// builds (for the compile cache key, so an executable built under
    /// other settings is never reused). Empty when there are none.
    fn compile_options(&self) -> String {
        String::new()
    }
    /// Ops a defer-and-fuse recording holds before it is flushed, unless
    /// `TPURT_DEFER_MAX_OPS` says otherwise (see `lazy`): a longer
    /// recording fuses more, a shorter one starts running sooner and makes
    /// smaller programs.
    fn defer_max_ops(&self) -> usize {
        DEFER_MAX_OPS
    }
    /// The mesh shape, for example [2, 2].
    fn topology(&self) -> &[u32];
    fn devices(&self) -> &[DeviceInfo];
    /// The TPU slice this process is part of, when the environment
    /// describes one (`TPU_*` variables; see [`slice`]).
    fn slice(&self) -> Option<&slice::SliceLayout> {
        None
    }
    /// A fresh segment of exactly `bytes` on chip `chip`. The pool decides
    /// sizes and enforces capacity; the platform may still fail.
    fn allocate_segment(&self, chip: usize, bytes: u64) -> Result<Segment>;
    /// Compile a checked graph into something `execute` can run. (A
    /// platform that only provides memory, as in tests, need not.)
    fn compile(&self, graph: &Graph) -> Result<Arc<dyn Executable>> {
        let _ = graph;
        Err(Error::Unimplemented(format!(
            "platform {} does not compile programs",
            self.name()
        )))
    }
    /// Rebuild an executable from `Executable::serialize` bytes of this
    /// platform and version; anything else is an error.
    fn load_executable(&self, bytes: &[u8]) -> Result<Arc<dyn Executable>> {
        let _ = bytes;
        Err(Error::Unimplemented(format!(
            "platform {} does not load programs",
            self.name()
        )))
    }
    /// Whether the programs loaded now strain a process resource that the
    /// compile cache's entry count does not see, so that it should unload
    /// some. Asked after each compile or load; the compiler then evicts the
    /// cache's least recently used half. (On xla: memory mappings, see
    /// `xla::mappings`.)
    fn loaded_code_pressure(&self) -> bool {
        false
    }
}

/// Check that tensors fit an executable's parameter and result types.
pub fn check_io(
    name: &str,
    exe: &dyn Executable,
    inputs: &[DeviceTensor],
    outputs: &[DeviceTensor],
) -> Result<()> {
    check_types(name, "input", inputs, exe.param_types())?;
    check_types(name, "output", outputs, exe.output_types())
}

/// Check the count and types of tensors (`what`: "input" or "output");
/// errors name `name` and the tensor's index.
pub fn check_types(
    name: &str,
    what: &str,
    given: &[DeviceTensor],
    want: &[TensorType],
) -> Result<()> {
    if given.len() != want.len() {
        return Err(Error::invalid(format!(
            "{name}: {} {what}s given, it takes {}",
            given.len(),
            want.len()
        )));
    }
    for (i, (g, w)) in given.iter().zip(want).enumerate() {
        if g.dtype != w.dtype || g.dims() != &w.dims[..] {
            return Err(Error::invalid(format!(
                "{name}: {what} {i} is {} but must be {w}",
                g.ty()
            )));
        }
    }
    Ok(())
}

/// Test platforms built over real ones.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A platform (the host's, in tests) with some settings changed:
    /// compile options named `options`, a recording limit of
    /// `defer_max_ops`; everything else is the inner platform's. The
    /// graphs it compiles are kept in `compiled`.
    #[derive(Debug)]
    pub struct Tweaked {
        pub inner: Arc<dyn Platform>,
        pub options: Option<&'static str>,
        pub defer_max_ops: Option<usize>,
        pub compiled: std::sync::Mutex<Vec<Graph>>,
        /// What `loaded_code_pressure` answers.
        pub pressed: std::sync::atomic::AtomicBool,
    }

    impl Tweaked {
        pub fn over(inner: Arc<dyn Platform>) -> Tweaked {
            Tweaked {
                inner,
                options: None,
                defer_max_ops: None,
                compiled: Default::default(),
                pressed: Default::default(),
            }
        }
    }

    impl Platform for Tweaked {
        fn name(&self) -> &str {
            self.inner.name()
        }
        fn version(&self) -> String {
            self.inner.version()
        }
        fn compile_options(&self) -> String {
            self.options
                .map_or_else(|| self.inner.compile_options(), String::from)
        }
        fn defer_max_ops(&self) -> usize {
            self.defer_max_ops
                .unwrap_or_else(|| self.inner.defer_max_ops())
        }
        fn topology(&self) -> &[u32] {
            self.inner.topology()
        }
        fn devices(&self) -> &[DeviceInfo] {
            self.inner.devices()
        }
        fn allocate_segment(&self, chip: usize, bytes: u64) -> Result<Segment> {
            self.inner.allocate_segment(chip, bytes)
        }
        fn compile(&self, graph: &Graph) -> Result<Arc<dyn Executable>> {
            self.compiled
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(graph.clone());
            self.inner.compile(graph)
        }
        fn load_executable(&self, bytes: &[u8]) -> Result<Arc<dyn Executable>> {
            self.inner.load_executable(bytes)
        }
        fn loaded_code_pressure(&self) -> bool {
            self.pressed.load(std::sync::atomic::Ordering::Relaxed)
        }
    }
}
