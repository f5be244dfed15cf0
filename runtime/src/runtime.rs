//! The [`Runtime`]: a platform, and per chip an HBM pool, a TensorCore and
//! a SparseCore executor, and a default stream. Everything a frontend does
//! goes through here.

use std::sync::{Arc, Mutex, Weak};

use std::collections::HashMap;

use crate::buffer::Buffer;
use crate::compile::{CacheConfig, CacheStats, CompileCache, Compiler, UseMark};
use crate::copy::{for_each_run, Layout};
use crate::eager::{current_mode, EagerMode};
use crate::error::{Error, Result};
use crate::ir::{DType, Graph, Precision, TensorType};
use crate::memory::{HbmPool, MemoryStats, PoolSnapshot};
use crate::ops::{self, Attrs, OpId};
use crate::platform::host::{HostConfig, HostPlatform};
use crate::platform::{CoreKind, DeviceInfo, Executable, Platform};
use crate::stream::{Event, Executor, Stream};
use crate::tensor::DeviceTensor;

/// How to build a runtime. `None` fields fall back to the environment
/// (`TPURT_PLATFORM`, `TPURT_HOST_CHIPS`, `TPURT_HOST_TOPOLOGY`,
/// `TPURT_HOST_HBM`) and then to the defaults.
#[derive(Clone, Debug, Default)]
pub struct RuntimeOptions {
    /// "host" (default) or "xla".
    pub platform: Option<String>,
    pub host_chips: Option<u32>,
    /// For example "2x2".
    pub host_topology: Option<String>,
    pub host_hbm_bytes: Option<u64>,
    /// The compile cache; `None`: from the environment (`TPURT_CACHE_DIR`).
    pub cache: Option<CacheConfig>,
}

/// Host memory an asynchronous copy reads from. The task owns it until the
/// copy ran.
pub trait HostSource: Send + 'static {
    fn bytes(&self) -> &[u8];
}
impl HostSource for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}
impl HostSource for Box<[u8]> {
    fn bytes(&self) -> &[u8] {
        self
    }
}
impl HostSource for Arc<[u8]> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// Host memory an asynchronous copy writes into. The task owns it until
/// the copy ran.
pub trait HostDestination: Send + 'static {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn write_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Result<()>) -> Result<()>;
}

/// A host vector an asynchronous device-to-host copy fills; read it after
/// synchronizing the stream (or an event recorded after the copy).
#[derive(Clone, Debug)]
pub struct HostReadback(Arc<Mutex<Vec<u8>>>);

impl HostReadback {
    pub fn new(len: usize) -> Self {
        HostReadback(Arc::new(Mutex::new(vec![0; len])))
    }
    pub fn to_vec(&self) -> Vec<u8> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl HostDestination for HostReadback {
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
    fn write_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Result<()>) -> Result<()> {
        fill(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

struct Chip {
    info: DeviceInfo,
    pool: Arc<HbmPool>,
    tensor_core: Arc<Executor>,
    sparse_core: Arc<Executor>,
    default_stream: Stream,
}

/// An op's graph for one signature (op, input types, attributes), and its
/// executable once compiled.
#[derive(Clone)]
struct OpEntry {
    /// Its key in the memo ([`signature_hash`]).
    key: u64,
    op: OpId,
    inputs: Vec<TensorType>,
    attrs: Attrs,
    /// Of its f32 products: the caller's when it was built.
    precision: Precision,
    /// The compiler options' generation it was built under (its
    /// executable was compiled with them).
    options: u64,
    graph: Arc<Graph>,
    /// The graph's result types.
    outputs: Vec<TensorType>,
    /// Its executable while the compile cache (or a launch) keeps it: the
    /// memo must not, or executables the cache evicted would stay loaded
    /// past its bound (on xla each holds JIT-mapped code; unbounded, they
    /// ran the process out of memory mappings). Set once, so a hit is a
    /// load and an upgrade; once the program is gone a fresh entry takes
    /// this one's place in the memo (`renew_entry`). Its mark tells the
    /// cache of each hit, so the cache lets go of it last.
    exe: std::sync::OnceLock<(Weak<dyn Executable>, UseMark)>,
}

/// The fast front of the compile cache for eager ops: skips building and
/// fingerprinting the op's graph on a repeat call. Bounded; cleared when full.
const OP_MEMO_ENTRIES: usize = 8192;

pub struct Runtime {
    platform: Arc<dyn Platform>,
    chips: Vec<Chip>,
    compiler: Arc<Compiler>,
    /// Entries by the hash of their signature ([`signature_hash`]); a list
    /// holds the entries whose signatures collide.
    op_memo: Mutex<HashMap<u64, Vec<Arc<OpEntry>>>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("platform", &self.platform.name())
            .field("chips", &self.chips.len())
            .finish()
    }
}

impl Runtime {
    pub fn new(options: &RuntimeOptions) -> Result<Runtime> {
        let name = match &options.platform {
            Some(p) => p.clone(),
            None => std::env::var("TPURT_PLATFORM")
                .ok()
                .filter(|v| !v.trim().is_empty())
                .unwrap_or_else(|| "host".to_string()),
        };
        let buckets = match std::env::var("TPURT_SHAPE_BUCKETS") {
            Ok(v) if !v.trim().is_empty() => Some(crate::compile::BucketPolicy::parse(&v)?),
            _ => None,
        };
        let runtime = match name.trim() {
            "host" => {
                let config = HostConfig::resolve(
                    options.host_chips,
                    options.host_topology.as_deref(),
                    options.host_hbm_bytes,
                )?;
                Runtime::with_platform_and_cache(
                    HostPlatform::new(config),
                    options.cache.clone().unwrap_or_else(CacheConfig::from_env),
                )
            }
            #[cfg(feature = "xla")]
            "xla" => {
                // The CPU plugin's device count: as many as the host platform's chips.
                let asked = options.host_chips.or_else(|| {
                    std::env::var("TPURT_HOST_CHIPS")
                        .ok()
                        .and_then(|v| v.trim().parse().ok())
                });
                let devices = asked.unwrap_or(crate::platform::host::DEFAULT_CHIPS);
                let plugin = crate::platform::xla::find_plugin()?;
                let slice = crate::platform::slice::SliceLayout::from_env(asked)?;
                Runtime::with_platform_and_cache(
                    crate::platform::xla::XlaPlatform::load_in_slice(&plugin, devices, slice)?,
                    options.cache.clone().unwrap_or_else(CacheConfig::from_env),
                )
            }
            #[cfg(not(feature = "xla"))]
            "xla" => Err(Error::Unimplemented(
                "platform 'xla' (PJRT plugins) is not in this build: build with `--features xla`"
                    .to_string(),
            )),
            other => Err(Error::NotFound(format!(
                "platform {other:?}; the platforms are 'host' and 'xla'"
            ))),
        }?;
        if let Some(policy) = buckets {
            runtime.compile_cache().set_bucket_policy(policy);
        }
        Ok(runtime)
    }

    pub fn with_platform(platform: Arc<dyn Platform>) -> Result<Runtime> {
        Self::with_platform_and_cache(platform, CacheConfig::from_env())
    }

    pub fn with_platform_and_cache(
        platform: Arc<dyn Platform>,
        cache: CacheConfig,
    ) -> Result<Runtime> {
        let mut chips = Vec::new();
        for info in platform.devices() {
            let i = info.index;
            let pool = Arc::new(HbmPool::new(i, info.hbm_capacity, Arc::clone(&platform)));
            let tensor_core = Executor::new(format!("tpurt-chip{i}-tc"));
            let sparse_core = Executor::new(format!("tpurt-chip{i}-sc"));
            let default_stream = Stream::new(&tensor_core, i, CoreKind::TensorCore, 0, true)?;
            chips.push(Chip {
                info: info.clone(),
                pool,
                tensor_core,
                sparse_core,
                default_stream,
            });
        }
        Ok(Runtime {
            compiler: Arc::new(Compiler::new(Arc::clone(&platform), cache)),
            platform,
            chips,
            op_memo: Mutex::new(HashMap::new()),
        })
    }

    pub fn platform(&self) -> &Arc<dyn Platform> {
        &self.platform
    }

    /// The TPU slice this process is part of, when the environment
    /// describes one (the `TPU_*` variables; see [`crate::platform::slice`]).
    pub fn slice(&self) -> Option<&crate::platform::slice::SliceLayout> {
        self.platform.slice()
    }

    pub fn device_count(&self) -> usize {
        self.chips.len()
    }

    fn chip(&self, index: usize) -> Result<&Chip> {
        self.chips.get(index).ok_or_else(|| {
            Error::NotFound(format!(
                "device {index}: this runtime has {} devices (0 to {})",
                self.chips.len(),
                self.chips.len().saturating_sub(1)
            ))
        })
    }

    pub fn device(&self, index: usize) -> Result<&DeviceInfo> {
        Ok(&self.chip(index)?.info)
    }

    pub fn default_stream(&self, device: usize) -> Result<Stream> {
        Ok(self.chip(device)?.default_stream.clone())
    }

    /// A new stream on one core of `device`. Lower priority numbers run first.
    pub fn create_stream(&self, device: usize, core: CoreKind, priority: i32) -> Result<Stream> {
        let chip = self.chip(device)?;
        let executor = match core {
            CoreKind::TensorCore => &chip.tensor_core,
            CoreKind::SparseCore => &chip.sparse_core,
        };
        Stream::new(executor, device, core, priority, false)
    }

    /// Wait for all work on every stream of `device`; the first failure.
    pub fn synchronize_device(&self, device: usize) -> Result<()> {
        let chip = self.chip(device)?;
        let mut first = Ok(());
        for f in chip
            .tensor_core
            .fences()
            .into_iter()
            .chain(chip.sparse_core.fences())
        {
            let r = f.wait();
            if first.is_ok() {
                first = r;
            }
        }
        // As `Stream::synchronize` does for its stream.
        chip.tensor_core.bury_all();
        chip.sparse_core.bury_all();
        first
    }

    pub fn synchronize(&self) -> Result<()> {
        let mut first = Ok(());
        for d in 0..self.chips.len() {
            let r = self.synchronize_device(d);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    pub fn pool(&self, device: usize) -> Result<&Arc<HbmPool>> {
        Ok(&self.chip(device)?.pool)
    }

    /// `bytes` of HBM on `device`, for use on `stream` (stream-ordered reuse).
    pub fn allocate(&self, device: usize, bytes: u64, stream: &Stream) -> Result<Buffer> {
        let chip = self.chip(device)?;
        if stream.chip() != device {
            return Err(Error::invalid(format!(
                "allocation on device {device} with a stream of device {}",
                stream.chip()
            )));
        }
        let block = match chip.pool.allocate(bytes, stream.clock()) {
            Ok(b) => b,
            Err(Error::OutOfMemory(_))
                if chip.tensor_core.has_deferred() || chip.sparse_core.has_deferred() =>
            {
                // Deferred ops may hold dead intermediates: flush, then retry.
                let _ = chip.tensor_core.flush_all();
                let _ = chip.sparse_core.flush_all();
                chip.pool.allocate(bytes, stream.clock())?
            }
            Err(e) => return Err(e),
        };
        Ok(Buffer::new(Arc::clone(&chip.pool), block, bytes))
    }

    pub fn memory_stats(&self, device: usize) -> Result<MemoryStats> {
        Ok(self.chip(device)?.pool.stats())
    }

    pub fn memory_snapshot(&self, device: usize) -> Result<PoolSnapshot> {
        Ok(self.chip(device)?.pool.snapshot())
    }

    pub fn reset_peak_memory_stats(&self, device: usize) -> Result<()> {
        self.chip(device)?.pool.reset_peak_stats();
        Ok(())
    }

    /// Wait for the device's work, then give every wholly free cached
    /// segment back to the platform. Returns the bytes released.
    pub fn empty_cache(&self, device: usize) -> Result<u64> {
        let chip = self.chip(device)?;
        // Failures belong to the streams that had them; the cache empties anyway.
        let _ = self.synchronize_device(device);
        Ok(chip.pool.empty_cache())
    }

    /// Copy host bytes into `dst` at `layout`, after the stream's earlier
    /// work; returns when the copy is done.
    pub fn copy_host_to_device(
        &self,
        src: &[u8],
        dst: &Buffer,
        layout: &Layout,
        stream: &Stream,
    ) -> Result<()> {
        check_host_side(src.len(), layout, "host source")?;
        layout.check_within(dst.len(), "device destination")?;
        stream.synchronize()?;
        write_runs(src, dst, layout)
    }

    /// As [`Self::copy_host_to_device`], but queued: `src` is owned by the copy.
    pub fn copy_host_to_device_async(
        &self,
        src: impl HostSource,
        dst: &Buffer,
        layout: &Layout,
        stream: &Stream,
    ) -> Result<()> {
        check_host_side(src.bytes().len(), layout, "host source")?;
        layout.check_within(dst.len(), "device destination")?;
        let touched = [dst];
        let (dst, layout) = (dst.for_work(stream.clock()), layout.clone());
        stream.submit_touching(&touched, "copy_host_to_device", move || {
            write_runs(src.bytes(), &dst, &layout)
        })
    }

    /// Copy the elements of `src` at `layout` into host bytes, after the
    /// stream's earlier work; returns when the copy is done.
    pub fn copy_device_to_host(
        &self,
        src: &Buffer,
        layout: &Layout,
        dst: &mut [u8],
        stream: &Stream,
    ) -> Result<()> {
        layout.check_within(src.len(), "device source")?;
        check_host_side(dst.len(), layout, "host destination")?;
        stream.synchronize()?;
        read_runs(src, layout, dst)
    }

    /// As [`Self::copy_device_to_host`], but queued; `dst` is filled when
    /// the stream reaches the copy.
    pub fn copy_device_to_host_async(
        &self,
        src: &Buffer,
        layout: &Layout,
        mut dst: Box<dyn HostDestination>,
        stream: &Stream,
    ) -> Result<()> {
        layout.check_within(src.len(), "device source")?;
        check_host_side(dst.len(), layout, "host destination")?;
        let (src, layout) = (src.for_work(stream.clock()), layout.clone());
        stream.submit("copy_device_to_host", move || {
            dst.write_with(&mut |out| read_runs(&src, &layout, out))
        })
    }

    /// Queue a copy of `src` at `src_layout` into `dst` at `dst_layout`
    /// (same sizes and element size); the buffers may sit on different chips.
    pub fn copy_device_to_device(
        &self,
        src: &Buffer,
        src_layout: &Layout,
        dst: &Buffer,
        dst_layout: &Layout,
        stream: &Stream,
    ) -> Result<()> {
        src_layout.check_within(src.len(), "device source")?;
        dst_layout.check_within(dst.len(), "device destination")?;
        // Check shapes now, so the error reaches the caller, not the stream.
        for_each_run(src_layout, dst_layout, |_, _, _| Ok(()))?;
        let (src, dst) = (src.for_work(stream.clock()), dst.for_work(stream.clock()));
        let (sl, dl) = (src_layout.clone(), dst_layout.clone());
        stream.submit("copy_device_to_device", move || {
            for_each_run(&sl, &dl, |s, d, n| {
                src.segment().copy_to(
                    src.segment_offset() + s,
                    dst.segment().as_ref(),
                    dst.segment_offset() + d,
                    n,
                )
            })
        })
    }

    /// Queue setting `len` bytes of `dst` from `offset` to `value`.
    pub fn fill_async(
        &self,
        dst: &Buffer,
        offset: u64,
        len: u64,
        value: u8,
        stream: &Stream,
    ) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > dst.len()) {
            return Err(Error::invalid(format!(
                "fill of {len} bytes at offset {offset} is outside a {}-byte buffer",
                dst.len()
            )));
        }
        let dst = dst.for_work(stream.clock());
        stream.submit("fill", move || {
            dst.segment()
                .fill(dst.segment_offset() + offset, len, value)
        })
    }

    /// The compile cache (counters, switches, clear).
    pub fn compile_cache(&self) -> &CompileCache<dyn Executable> {
        self.compiler.cache()
    }

    pub fn compile_cache_stats(&self) -> CacheStats {
        self.compiler.cache().stats()
    }

    /// An executable for `graph`, from the compile cache (built on a miss).
    pub fn compile(&self, graph: &Graph) -> Result<Arc<dyn Executable>> {
        self.compiler.compile(graph)
    }

    fn op_entry(&self, op: OpId, inputs: &[TensorType], attrs: &Attrs) -> Result<Arc<OpEntry>> {
        self.op_entry_of(op, inputs.iter().map(|t| (t.dtype, &t.dims[..])), attrs)
    }

    /// The memo's entry for `op` over inputs of these (dtype, dims). A hit
    /// allocates nothing: the signature is hashed and compared in place,
    /// which is what keeps an eager op's dispatch cheap.
    fn op_entry_of<'a, I>(&self, op: OpId, inputs: I, attrs: &Attrs) -> Result<Arc<OpEntry>>
    where
        I: Iterator<Item = (DType, &'a [u64])> + Clone,
    {
        let precision = crate::precision::current();
        let options = crate::compile::options::generation();
        let key = signature_hash(op, inputs.clone(), attrs, precision, options);
        let matches = |e: &OpEntry| {
            e.op == op
                && e.precision == precision
                && e.options == options
                && e.inputs.len() == inputs.clone().count()
                && e.inputs
                    .iter()
                    .zip(inputs.clone())
                    .all(|(t, (d, dims))| t.dtype == d && t.dims == dims)
                && e.attrs.same_bits(attrs)
        };
        {
            let memo = self.op_memo.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = memo.get(&key).and_then(|l| l.iter().find(|e| matches(e))) {
                return Ok(Arc::clone(e));
            }
        }
        let types: Vec<TensorType> = inputs.map(|(d, dims)| TensorType::new(d, dims)).collect();
        let graph = ops::build_graph_at(op, &types, attrs, precision)?;
        let entry = Arc::new(OpEntry {
            key,
            op,
            precision,
            options,
            outputs: graph.output_types(),
            graph: Arc::new(graph),
            inputs: types,
            attrs: attrs.clone(),
            exe: std::sync::OnceLock::new(),
        });
        let mut memo = self.op_memo.lock().unwrap_or_else(|e| e.into_inner());
        if memo.len() >= OP_MEMO_ENTRIES {
            memo.clear();
        }
        memo.entry(key).or_default().push(Arc::clone(&entry));
        Ok(entry)
    }

    fn entry_executable(&self, entry: &OpEntry) -> Result<Arc<dyn Executable>> {
        if let Some((weak, mark)) = entry.exe.get() {
            if let Some(exe) = weak.upgrade() {
                mark.mark();
                return Ok(exe);
            }
        }
        let (exe, mark) = self.compiler.compile_marked(&entry.graph)?;
        if let Err((_, mark)) = entry.exe.set((Arc::downgrade(&exe), mark)) {
            self.renew_entry(entry, &exe, mark);
        }
        Ok(exe)
    }

    /// Puts a fresh entry holding `exe` in the memo in place of `old`,
    /// whose executable the compile cache let go.
    fn renew_entry(&self, old: &OpEntry, exe: &Arc<dyn Executable>, mark: UseMark) {
        let fresh = Arc::new(OpEntry {
            exe: (Arc::downgrade(exe), mark).into(),
            ..old.clone()
        });
        let mut memo = self.op_memo.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = memo
            .get_mut(&old.key)
            .and_then(|l| l.iter_mut().find(|e| std::ptr::eq(Arc::as_ptr(e), old)))
        {
            *slot = fresh;
        }
    }

    /// The result types of `op` for these input types and attributes.
    pub fn op_output_types(
        &self,
        op: OpId,
        inputs: &[TensorType],
        attrs: &Attrs,
    ) -> Result<Vec<TensorType>> {
        Ok(self.op_entry(op, inputs, attrs)?.outputs.clone())
    }

    /// The executable of `op` for these input types and attributes.
    pub fn op_executable(
        &self,
        op: OpId,
        inputs: &[TensorType],
        attrs: &Attrs,
    ) -> Result<Arc<dyn Executable>> {
        let entry = self.op_entry(op, inputs, attrs)?;
        self.entry_executable(&entry)
    }

    /// Queue `exe` on `stream` over these tensors. `name` names the task
    /// (and so the error if it fails). Inputs and outputs must live on the
    /// stream's device.
    pub fn launch(
        &self,
        exe: Arc<dyn Executable>,
        inputs: &[DeviceTensor],
        outputs: &[DeviceTensor],
        stream: &Stream,
        name: &'static str,
    ) -> Result<()> {
        check_devices(name, inputs, outputs, stream)?;
        crate::platform::check_io(name, exe.as_ref(), inputs, outputs)?;
        stream.launch(name, exe, inputs, outputs)
    }

    /// Run one op of the op library on `stream`, writing `outputs` (whose
    /// types must be the op's result types; see `ops::infer_outputs`).
    /// Strict mode returns once queued; debug mode waits and checks;
    /// defer-and-fuse records the op for the stream's next flush.
    pub fn call_op(
        &self,
        op: OpId,
        inputs: &[DeviceTensor],
        outputs: &[DeviceTensor],
        attrs: &Attrs,
        stream: &Stream,
    ) -> Result<()> {
        let entry = self.op_entry_of(op, dtypes_and_dims(inputs), attrs)?;
        self.call_entry(op, &entry, inputs, outputs, stream)
    }

    /// `call_op` for an op whose entry is at hand.
    fn call_entry(
        &self,
        op: OpId,
        entry: &OpEntry,
        inputs: &[DeviceTensor],
        outputs: &[DeviceTensor],
        stream: &Stream,
    ) -> Result<()> {
        let name = ops::op_name(op);
        let mode = current_mode();
        if mode == EagerMode::DeferAndFuse {
            check_devices(name, inputs, outputs, stream)?;
            crate::platform::check_types(name, "output", outputs, &entry.outputs)?;
            let op = crate::lazy::Deferred {
                name,
                graph: Arc::clone(&entry.graph),
                inputs: inputs.to_vec(),
                outputs: outputs.to_vec(),
            };
            return stream.defer(op, &self.compiler);
        }
        let exe = self.entry_executable(entry)?;
        let debug = mode == EagerMode::DeferNeverAndLaunchBlocking;
        // Debug mode flags NaN and Inf an op makes from finite inputs;
        // non-finite inputs (an attention mask's -inf) excuse its outputs.
        let carried = if debug && outputs.iter().any(|o| o.dtype.is_float()) {
            stream.synchronize()?;
            let mut seen = NonFinite::default();
            for t in inputs {
                seen = seen.union(non_finite(t)?.0);
            }
            seen
        } else {
            NonFinite::default()
        };
        self.launch(exe, inputs, outputs, stream, name)?;
        if debug {
            stream.synchronize()?;
            for (i, out) in outputs.iter().enumerate() {
                check_finite(name, i, out, carried)?;
            }
        }
        Ok(())
    }

    /// As `call_op`, allocating contiguous outputs on the stream's device.
    pub fn call_op_alloc(
        &self,
        op: OpId,
        inputs: &[DeviceTensor],
        attrs: &Attrs,
        stream: &Stream,
    ) -> Result<Vec<DeviceTensor>> {
        self.call_op_alloc_at_most(op, inputs, attrs, stream, usize::MAX)
    }

    /// As `call_op_alloc`, but an op with more than `max_outputs` outputs
    /// is an error before anything is allocated or run (a frontend's output
    /// array has room for that many).
    pub fn call_op_alloc_at_most(
        &self,
        op: OpId,
        inputs: &[DeviceTensor],
        attrs: &Attrs,
        stream: &Stream,
        max_outputs: usize,
    ) -> Result<Vec<DeviceTensor>> {
        let entry = self.op_entry_of(op, dtypes_and_dims(inputs), attrs)?;
        let out_types = &entry.outputs;
        if out_types.len() > max_outputs {
            return Err(Error::invalid(format!(
                "{}: the op has {} outputs, more than the {max_outputs} there is room for",
                ops::op_name(op),
                out_types.len()
            )));
        }
        let outputs = out_types
            .iter()
            .map(|t| {
                let buf = self.allocate(stream.chip(), t.nbytes(), stream)?;
                DeviceTensor::contiguous(buf, t.dtype, &t.dims)
            })
            .collect::<Result<Vec<_>>>()?;
        self.call_entry(op, &entry, inputs, &outputs, stream)?;
        Ok(outputs)
    }

    /// A new event; `timing` enables `elapsed_time`.
    pub fn create_event(&self, timing: bool) -> Event {
        Event::new(timing)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Finish queued work and stop the workers; buffers held by queued
        // tasks are released as those tasks finish.
        for chip in &self.chips {
            chip.tensor_core.shutdown();
            chip.sparse_core.shutdown();
        }
    }
}

/// The memo key of an op signature: op, each input's dtype and dims, the
/// attributes, the precision of products and the compiler options'
/// generation, hashed in place.
fn signature_hash<'a>(
    op: OpId,
    inputs: impl Iterator<Item = (DType, &'a [u64])>,
    attrs: &Attrs,
    precision: Precision,
    options: u64,
) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = crate::fxhash::FxHasher::default();
    op.0.hash(&mut h);
    precision.hash(&mut h);
    options.hash(&mut h);
    for (d, dims) in inputs {
        d.hash(&mut h);
        dims.hash(&mut h);
    }
    attrs.hash_bits(&mut h);
    h.finish()
}

/// Each tensor's (dtype, dims), as the op memo reads a signature.
fn dtypes_and_dims(ts: &[DeviceTensor]) -> impl Iterator<Item = (DType, &[u64])> + Clone {
    ts.iter().map(|t| (t.dtype, t.dims()))
}

fn check_devices(
    name: &str,
    inputs: &[DeviceTensor],
    outputs: &[DeviceTensor],
    stream: &Stream,
) -> Result<()> {
    for (what, list) in [("input", inputs), ("output", outputs)] {
        for (i, t) in list.iter().enumerate() {
            if t.buffer.chip() != stream.chip() {
                return Err(Error::invalid(format!(
                    "{name}: {what} {i} is on tpu:{} but the stream is on tpu:{} (all tensors of an op must be on one device)",
                    t.buffer.chip(),
                    stream.chip()
                )));
            }
        }
    }
    Ok(())
}

/// Which non-finite values a tensor holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct NonFinite {
    nan: bool,
    inf: bool,
}

impl NonFinite {
    fn union(self, o: NonFinite) -> NonFinite {
        NonFinite {
            nan: self.nan || o.nan,
            inf: self.inf || o.inf,
        }
    }
}

/// The non-finite values of a float tensor, and the position of the first
/// one of each kind (NaN, Inf) as a flat index.
fn non_finite(t: &DeviceTensor) -> Result<(NonFinite, [Option<usize>; 2])> {
    let mut seen = NonFinite::default();
    let mut first = [None, None];
    if !t.dtype.is_float() || t.numel() == 0 {
        return Ok((seen, first));
    }
    let host = crate::platform::host::kernels::read_device_tensor(t)?;
    for i in 0..host.numel() {
        let v = host.get_f64(i);
        if v.is_nan() && !seen.nan {
            seen.nan = true;
            first[0] = Some(i);
        } else if v.is_infinite() && !seen.inf {
            seen.inf = true;
            first[1] = Some(i);
        }
        if seen.nan && seen.inf {
            break;
        }
    }
    Ok((seen, first))
}

/// Debug mode: a float output holding NaN or Inf when every input was
/// finite is an error naming the op, the output and the first position.
/// Non-finite inputs (an attention mask's -inf) excuse what follows from
/// them (a fully masked row's NaN), as they would on any device.
fn check_finite(op: &str, index: usize, t: &DeviceTensor, carried: NonFinite) -> Result<()> {
    if carried.nan || carried.inf {
        return Ok(());
    }
    let (_, first) = non_finite(t)?;
    for (k, what) in ["NaN", "Inf"].into_iter().enumerate() {
        let Some(i) = first[k] else {
            continue;
        };
        let dims = t.dims().to_vec();
        let mut pos = vec![0u64; dims.len()];
        let mut rest = i as u64;
        for d in (0..dims.len()).rev() {
            pos[d] = rest % dims[d];
            rest /= dims[d];
        }
        return Err(Error::FailedPrecondition(format!(
            "{op}: output {index} holds {what} at position {pos:?}, from finite inputs \
             (debug mode checks every op's outputs)"
        )));
    }
    Ok(())
}

fn check_host_side(len: usize, layout: &Layout, what: &str) -> Result<()> {
    if len as u64 != layout.nbytes() {
        return Err(Error::invalid(format!(
            "{what} has {len} bytes but the layout (sizes {:?}, {} bytes each) needs {}",
            layout.sizes,
            layout.elem_size,
            layout.nbytes()
        )));
    }
    Ok(())
}

fn write_runs(src: &[u8], dst: &Buffer, layout: &Layout) -> Result<()> {
    let host = Layout::contiguous(&layout.sizes, layout.elem_size);
    let base = dst.segment_offset();
    for_each_run(&host, layout, |h, d, n| {
        dst.segment()
            .write(base + d, &src[h as usize..(h + n) as usize])
    })
}

fn read_runs(src: &Buffer, layout: &Layout, dst: &mut [u8]) -> Result<()> {
    let host = Layout::contiguous(&layout.sizes, layout.elem_size);
    let base = src.segment_offset();
    for_each_run(layout, &host, |d, h, n| {
        src.segment()
            .read(base + d, &mut dst[h as usize..(h + n) as usize])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    fn rt(chips: u32, hbm: u64) -> Runtime {
        rt_caching(chips, hbm, 64)
    }

    /// A host runtime whose compile cache keeps `entries` programs.
    fn rt_caching(chips: u32, hbm: u64, entries: usize) -> Runtime {
        Runtime::new(&RuntimeOptions {
            platform: Some("host".into()),
            host_chips: Some(chips),
            host_topology: None,
            host_hbm_bytes: Some(hbm),
            cache: Some(crate::compile::CacheConfig::memory_only(entries)),
        })
        .unwrap()
    }

    fn floats(v: &[f32]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    /// x += x on `s`: an add whose output is its input.
    fn double_in_place(r: &Runtime, s: &Stream, x: &DeviceTensor) {
        let add = ops::lookup("add").unwrap();
        r.call_op(
            add,
            &[x.clone(), x.clone()],
            std::slice::from_ref(x),
            &Attrs::new(),
            s,
        )
        .unwrap();
    }

    /// A stream held up until the returned sender is dropped or sent to.
    fn hold(stream: &Stream) -> std::sync::mpsc::Sender<()> {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        stream
            .submit("hold", move || {
                let _ = rx.recv();
                Ok(())
            })
            .unwrap();
        tx
    }

    /// A launch that holds the last handle of a buffer when it finishes
    /// (an output the caller dropped while the op was queued) hands it
    /// back to the stream, whose own thread frees it at the next launch or
    /// synchronize; the worker frees nothing the caller allocated, so the
    /// two threads never meet on the allocator's lock for it. The buffer's
    /// memory went back to the pool when its owner dropped it, as before.
    #[test]
    fn a_launch_hands_the_last_handle_back_to_the_stream() {
        let r = rt(1, 64 << 20);
        let s = r.default_stream(0).unwrap();
        let add = ops::lookup("add").unwrap();
        let x = r.allocate(0, 16, &s).unwrap();
        let x = DeviceTensor::contiguous(x, DType::F32, &[4]).unwrap();
        let gate = hold(&s);
        let out = r
            .call_op_alloc(add, &[x.clone(), x.clone()], &Attrs::new(), &s)
            .unwrap();
        let in_use = r.pool(0).unwrap().stats().allocated_bytes.current;
        drop(out);
        assert!(
            r.pool(0).unwrap().stats().allocated_bytes.current < in_use,
            "the dropped output's block is back in the pool while its op is queued"
        );
        drop(gate);
        s.fence().wait().unwrap();
        assert_eq!(s.graveyard_len(), 1, "the output's last handle came back");
        // x is still owned here: the launch dropped its handle to x.
        s.synchronize().unwrap();
        assert_eq!(s.graveyard_len(), 0, "freed on the stream's thread");
        // The next launch frees what came back too.
        let gate = hold(&s);
        drop(
            r.call_op_alloc(add, &[x.clone(), x.clone()], &Attrs::new(), &s)
                .unwrap(),
        );
        drop(gate);
        s.fence().wait().unwrap();
        assert_eq!(s.graveyard_len(), 1);
        let _keep = r
            .call_op_alloc(add, &[x.clone(), x], &Attrs::new(), &s)
            .unwrap();
        assert_eq!(s.graveyard_len(), 0);
    }

    /// A finished launch's tensor list is kept by its stream and taken by
    /// the next launch: a frontend that waits for each op uses one list
    /// over and over; one that queues ops ahead uses as many as it has in
    /// flight. (A queue slot holds the list's pointer, so slots stay small.)
    #[test]
    fn launches_reuse_the_tensor_lists_of_finished_ones() {
        let r = rt(1, 64 << 20);
        let s = r.default_stream(0).unwrap();
        let x = r.allocate(0, 16, &s).unwrap();
        let x = DeviceTensor::contiguous(x, DType::F32, &[4]).unwrap();
        let run = |n: usize| {
            for _ in 0..n {
                double_in_place(&r, &s, &x);
            }
        };
        run(1);
        s.synchronize().unwrap();
        assert_eq!(s.spare_lists(), 1);
        for _ in 0..50 {
            run(1);
            s.synchronize().unwrap();
        }
        assert_eq!(s.spare_lists(), 1, "one list, used 50 times");
        let gate = hold(&s);
        run(10);
        assert_eq!(s.spare_lists(), 0, "ten in flight, the spare one taken");
        drop(gate);
        s.synchronize().unwrap();
        assert_eq!(s.spare_lists(), 10);
        // A launch of 17 inputs grows its list past what a spare keeps.
        let cat = ops::lookup("cat").unwrap();
        let ins: Vec<DeviceTensor> = (0..17).map(|_| x.clone()).collect();
        let attrs = Attrs::new().with("dim", crate::ops::Attr::Int(0));
        let out = r.call_op_alloc(cat, &ins, &attrs, &s).unwrap();
        s.synchronize().unwrap();
        assert_eq!(out[0].dims(), &[68]);
        assert_eq!(s.spare_lists(), 9, "the long list was not kept");
    }

    /// Freeing a buffer that queued work still uses hands its memory back
    /// at once, stream-ordered: the same stream reuses it while the work
    /// is still queued (and its later work sees its own values, not the
    /// old ones), and another stream that queued work on it gets it only
    /// after that work is done. Before work references, every queued op
    /// kept its buffers from the pool, so a frontend running ahead of the
    /// device grew the pool by a block per queued op.
    #[test]
    fn the_op_memo_keeps_one_entry_per_signature() {
        use crate::ops::Attr;
        let r = rt(1, 64 << 20);
        let clamp = ops::lookup("clamp").unwrap();
        let f32s = |dims: &[u64]| vec![TensorType::new(DType::F32, dims)];
        let lo = |v: f64| Attrs::new().with("min", Attr::Float(v));
        let a = r.op_entry(clamp, &f32s(&[4]), &lo(0.0)).unwrap();
        let again = r.op_entry(clamp, &f32s(&[4]), &lo(0.0)).unwrap();
        assert!(Arc::ptr_eq(&a, &again), "a repeat signature is a hit");
        for (dims, attrs, what) in [
            (&[5][..], lo(0.0), "other dims"),
            (&[2, 2][..], lo(0.0), "other rank"),
            (&[4][..], lo(-0.0), "-0.0 is not 0.0"),
            (
                &[4][..],
                Attrs::new().with("max", Attr::Float(0.0)),
                "other name",
            ),
        ] {
            let e = r.op_entry(clamp, &f32s(dims), &attrs).unwrap();
            assert!(!Arc::ptr_eq(&a, &e), "{what}");
            assert_eq!(e.inputs, f32s(dims), "{what}");
            assert!(e.attrs.same_bits(&attrs), "{what}");
        }
        let as_f64 = r
            .op_entry(clamp, &[TensorType::new(DType::F64, &[4])], &lo(0.0))
            .unwrap();
        assert_eq!(as_f64.outputs, vec![TensorType::new(DType::F64, &[4])]);
        // The tensor form of the lookup finds the same entry.
        let x = r.allocate(0, 16, &r.default_stream(0).unwrap()).unwrap();
        let x = DeviceTensor::contiguous(x, DType::F32, &[4]).unwrap();
        let via_tensors = r
            .op_entry_of(clamp, dtypes_and_dims(std::slice::from_ref(&x)), &lo(0.0))
            .unwrap();
        assert!(Arc::ptr_eq(&a, &via_tensors));
    }

    /// The compile cache's bound is the bound on loaded executables: the op
    /// memo does not keep one the cache evicted or cleared. (It did: on
    /// xla, a long test run kept ~20,000 JIT-compiled programs loaded and
    /// ran the process out of memory mappings, and XLA's next compile left
    /// stale unwind tables behind that crashed the following exception.)
    #[test]
    fn the_op_memo_holds_no_executable_the_cache_let_go() {
        let r = rt_caching(1, 64 << 20, 2);
        let neg = ops::lookup("neg").unwrap();
        let f32s = |n: u64| vec![TensorType::new(DType::F32, &[n])];
        let none = Attrs::new();
        let first = r.op_executable(neg, &f32s(1), &none).unwrap();
        let again = r.op_executable(neg, &f32s(1), &none).unwrap();
        assert!(Arc::ptr_eq(&first, &again), "a live executable is reused");
        let weak = Arc::downgrade(&first);
        drop((first, again));
        // The memo's hit above counts as a use: it outlasts one more
        // eviction than the others.
        for n in 2..=5 {
            r.op_executable(neg, &f32s(n), &none).unwrap();
        }
        assert!(r.compile_cache_stats().evictions >= 1);
        assert!(weak.upgrade().is_none(), "evicted, so unloaded");
        // Asked again, the entry compiles it anew, and it runs.
        let s = r.default_stream(0).unwrap();
        let x = upload(&r, 0, &[1], &[2.5]);
        let y = r.call_op_alloc(neg, &[x], &none, &s).unwrap();
        assert_eq!(download(&r, &y[0]), vec![-2.5]);
        // The renewed entry holds the new one: a repeat asks no cache.
        let requests = r.compile_cache_stats().requests;
        let renewed = r.op_executable(neg, &f32s(1), &none).unwrap();
        assert_eq!(r.compile_cache_stats().requests, requests);
        drop(renewed);
        // Clearing the cache's memory unloads what only the memo knew.
        let kept = Arc::downgrade(&r.op_executable(neg, &f32s(4), &none).unwrap());
        r.compile_cache().clear(true, false).unwrap();
        assert!(kept.upgrade().is_none(), "cleared, so unloaded");
        // One a caller still holds is found again without the cache.
        let held = r.op_executable(neg, &f32s(3), &none).unwrap();
        r.compile_cache().clear(true, false).unwrap();
        let requests = r.compile_cache_stats().requests;
        let again = r.op_executable(neg, &f32s(3), &none).unwrap();
        assert!(Arc::ptr_eq(&held, &again));
        assert_eq!(r.compile_cache_stats().requests, requests);
    }

    /// An eager op run again and again through the memo stays in the
    /// cache while other programs come and go: its hits reach the cache
    /// as uses. Before, the cache saw only its first compile, so it was
    /// the first evicted and compiled (or loaded from disk) again.
    #[test]
    fn a_hot_eager_op_outlasts_the_programs_around_it() {
        let r = rt_caching(1, 64 << 20, 4);
        let neg = ops::lookup("neg").unwrap();
        let f32s = |n: u64| vec![TensorType::new(DType::F32, &[n])];
        let none = Attrs::new();
        let hot = Arc::downgrade(&r.op_executable(neg, &f32s(1), &none).unwrap());
        for n in 2..40 {
            r.op_executable(neg, &f32s(n), &none).unwrap();
            assert!(r.op_executable(neg, &f32s(1), &none).is_ok());
        }
        let stats = r.compile_cache_stats();
        assert!(stats.evictions >= 30, "{stats:?}");
        assert!(hot.upgrade().is_some(), "the hot op was never let go");
        assert_eq!(stats.misses, 39, "compiled once each: {stats:?}");
        // So too when the platform asks for half to go.
        r.compile_cache().evict_older_half();
        assert!(hot.upgrade().is_some());
    }

    /// As above for defer-and-fuse's memo of compiled recordings: a
    /// recording seen before is looked up in the cache again once the
    /// cache let its program go (before, the memo kept it loaded).
    #[test]
    fn the_flush_memo_holds_no_executable_the_cache_let_go() {
        let r = rt(1, 64 << 20);
        let s = r.default_stream(0).unwrap();
        let neg = ops::lookup("neg").unwrap();
        let x = upload(&r, 0, &[2], &[1., -2.]);
        let step = || {
            crate::eager::push_mode(EagerMode::DeferAndFuse).unwrap();
            let y = r.call_op_alloc(neg, std::slice::from_ref(&x), &Attrs::new(), &s);
            crate::eager::pop_mode().unwrap();
            let y = y.unwrap();
            s.flush().unwrap();
            download(&r, &y[0])
        };
        assert_eq!(step(), vec![-1., 2.]);
        let requests = r.compile_cache_stats().requests;
        assert_eq!(step(), vec![-1., 2.]);
        assert_eq!(
            r.compile_cache_stats().requests,
            requests,
            "a repeat recording is a memo hit"
        );
        let misses = r.compile_cache_stats().misses;
        r.compile_cache().clear(true, false).unwrap();
        assert_eq!(step(), vec![-1., 2.]);
        let stats = r.compile_cache_stats();
        assert_eq!(stats.requests, requests + 1, "the cache was asked again");
        assert_eq!(stats.misses, misses + 1, "and compiled it again");
    }

    /// As for eager ops: a recording flushed again and again through the
    /// memo is not the one the cache lets go while others come and go.
    #[test]
    fn a_hot_recording_outlasts_the_programs_around_it() {
        let r = rt_caching(1, 64 << 20, 4);
        let s = r.default_stream(0).unwrap();
        let neg = ops::lookup("neg").unwrap();
        let step = |n: u64| {
            let x = upload(&r, 0, &[n], &vec![1.0; n as usize]);
            crate::eager::push_mode(EagerMode::DeferAndFuse).unwrap();
            let y = r.call_op_alloc(neg, std::slice::from_ref(&x), &Attrs::new(), &s);
            crate::eager::pop_mode().unwrap();
            let y = y.unwrap();
            s.flush().unwrap();
            download(&r, &y[0])
        };
        assert_eq!(step(1), vec![-1.]);
        for n in 2..40 {
            assert_eq!(step(n)[0], -1.);
            assert_eq!(step(1), vec![-1.]);
        }
        let stats = r.compile_cache_stats();
        assert!(stats.evictions >= 30, "{stats:?}");
        assert_eq!(stats.misses, 39, "compiled once each: {stats:?}");
    }

    #[test]
    fn freed_buffers_are_reused_in_stream_order_while_work_is_queued() {
        let r = rt(1, 1 << 30);
        let s = r.default_stream(0).unwrap();
        let n = 64 * 1024u64; // bytes
        let layout = Layout::contiguous(&[n / 4], 4);
        let release = hold(&s);
        let a = r.allocate(0, n, &s).unwrap();
        let address = a.address();
        r.fill_async(&a, 0, n, 1, &s).unwrap();
        drop(a);
        // Same stream: the same memory, while the fill is still queued.
        let b = r.allocate(0, n, &s).unwrap();
        assert_eq!(b.address(), address);
        let segments = r.memory_stats(0).unwrap().num_segment_allocs;
        r.fill_async(&b, 0, n, 2, &s).unwrap();
        let out = HostReadback::new(n as usize);
        r.copy_device_to_host_async(&b, &layout, Box::new(out.clone()), &s)
            .unwrap();
        drop(release);
        s.synchronize().unwrap();
        assert!(out.to_vec().iter().all(|&x| x == 2));
        assert_eq!(r.memory_stats(0).unwrap().num_segment_allocs, segments);
        drop(b);

        // Another stream's queued work keeps the memory from other streams
        // (a SparseCore stream: its own worker, so holding it up leaves
        // the TensorCore streams running).
        let s2 = r.create_stream(0, CoreKind::SparseCore, 0).unwrap();
        let c = r.allocate(0, n, &s).unwrap();
        let c_address = c.address();
        let release2 = hold(&s2);
        let out2 = HostReadback::new(n as usize);
        r.fill_async(&c, 0, n, 3, &s).unwrap();
        s.synchronize().unwrap();
        r.copy_device_to_host_async(&c, &layout, Box::new(out2.clone()), &s2)
            .unwrap();
        drop(c);
        let d = r.allocate(0, n, &s).unwrap();
        assert_ne!(d.address(), c_address, "s2's queued copy still reads it");
        r.fill_async(&d, 0, n, 4, &s).unwrap();
        s.synchronize().unwrap();
        drop(release2);
        s2.synchronize().unwrap();
        assert!(out2.to_vec().iter().all(|&x| x == 3));
        // c was pending free until s2's copy finished; now nothing is active.
        drop(d);
        let stats = r.memory_stats(0).unwrap();
        assert_eq!(stats.active_bytes.current, 0, "{stats:?}");
        assert_eq!(stats.allocated_bytes.current, 0, "{stats:?}");
    }

    /// Contiguous inputs of primitive kernels are read in place on the host
    /// platform, so a parameter that a primitive kernel (here a transpose)
    /// read is a view of its device memory when the graph returns it. An
    /// output written over that parameter first must not change it: output
    /// 0 is -x written over x, output 1 is x itself, written after it.
    #[test]
    fn an_in_place_output_does_not_change_a_view_of_the_input() {
        use crate::ir::{DType, GraphBuilder, Prim, TensorType, UnaryOp};
        let r = rt(1, 1 << 30);
        let s = r.default_stream(0).unwrap();
        let mut g = GraphBuilder::new();
        let x = g.param(TensorType::new(DType::F32, &[2, 3]));
        let neg = g.unary(UnaryOp::Neg, x).unwrap();
        let xt = g.op(Prim::Transpose { perm: vec![1, 0] }, &[x]).unwrap();
        let exe = r.compile(&g.build(&[neg, x, xt]).unwrap()).unwrap();
        let xs = [1f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let six = Layout::contiguous(&[6], 4);
        let [xb, yb, zb] = [0; 3].map(|_| r.allocate(0, 24, &s).unwrap());
        r.copy_host_to_device(&floats(&xs), &xb, &six, &s).unwrap();
        let t = |b: &Buffer, dims: &[u64]| {
            DeviceTensor::contiguous(b.clone(), DType::F32, dims).unwrap()
        };
        r.launch(
            exe,
            &[t(&xb, &[2, 3])],
            &[t(&xb, &[2, 3]), t(&yb, &[2, 3]), t(&zb, &[3, 2])],
            &s,
            "graph",
        )
        .unwrap();
        let read = |b: &Buffer| {
            let mut out = vec![0u8; 24];
            r.copy_device_to_host(b, &six, &mut out, &s).unwrap();
            bytemuck::cast_slice::<u8, f32>(&out).to_vec()
        };
        assert_eq!(read(&xb), xs.iter().map(|v| -v).collect::<Vec<_>>());
        assert_eq!(read(&yb), xs.to_vec());
        assert_eq!(read(&zb), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    }

    /// A product whose operands are permuted views of device memory (a
    /// linear layer's `W.t()`, attention's batched key transpose, a
    /// transposed lhs at an offset with a size-1 dimension) reads them in
    /// place and equals the product of contiguous copies; views that cannot
    /// be read in place (a broadcast, free dimensions that would swap
    /// order) are gathered and equal it too. Small integers keep every sum
    /// exact, so the bytes must match.
    #[test]
    fn products_of_transposed_views_equal_the_contiguous_product() {
        use crate::ir::{DType, GraphBuilder, Prim, TensorType};
        use crate::platform::host::kernels::HostTensor;
        // Per operand: sizes, strides and offset in elements; then the
        // batch and contracting dimensions of each side, and the
        // permutation the lhs and rhs are read in place with, if they are.
        type View = (&'static [u64], &'static [u64], u64);
        type Case = (
            View,
            View,
            [&'static [usize]; 4],
            [Option<&'static [usize]>; 2],
        );
        let cases: [Case; 5] = [
            // x [3, 5] · W.t(), W [4, 5] contiguous.
            (
                (&[3, 5], &[5, 1], 0),
                (&[5, 4], &[1, 5], 0),
                [&[], &[], &[1], &[0]],
                [Some(&[0, 1]), Some(&[1, 0])],
            ),
            // q [2, 3, 4] · k.transpose(-2, -1), k [2, 6, 4] contiguous.
            (
                (&[2, 3, 4], &[12, 4, 1], 0),
                (&[2, 4, 6], &[24, 1, 4], 0),
                [&[0], &[0], &[2], &[1]],
                [Some(&[0, 1, 2]), Some(&[0, 2, 1])],
            ),
            // A transposed lhs [1, 4, 3] of [3, 4] memory at an offset.
            (
                (&[1, 4, 3], &[99, 1, 4], 7),
                (&[1, 3, 2], &[6, 2, 1], 0),
                [&[0], &[0], &[2], &[1]],
                [Some(&[0, 2, 1]), Some(&[0, 1, 2])],
            ),
            // A broadcast rhs (stride 0) is gathered.
            (
                (&[2, 3], &[3, 1], 0),
                (&[3, 5], &[1, 0], 0),
                [&[], &[], &[1], &[0]],
                [Some(&[0, 1]), None],
            ),
            // rhs [3, 2, 4] of [3, 4, 2] memory: its free dimensions would
            // swap order, so it is gathered.
            (
                (&[2, 3], &[3, 1], 0),
                (&[3, 2, 4], &[8, 1, 2], 0),
                [&[], &[], &[1], &[0]],
                [Some(&[0, 1]), Some(&[0, 2, 1])],
            ),
        ];
        let r = rt(1, 1 << 30);
        let s = r.default_stream(0).unwrap();
        for (lhs, rhs, [lb, rb, lc, rc], perms) in cases {
            let mut g = GraphBuilder::new();
            let views = [lhs, rhs];
            let mut tensors = Vec::new();
            let mut params = Vec::new();
            let mut values: Vec<Vec<f64>> = Vec::new();
            for (i, (sizes, strides, offset)) in views.iter().enumerate() {
                let reach = *offset
                    + sizes
                        .iter()
                        .zip(strides.iter())
                        .map(|(n, s)| (n - 1) * s)
                        .sum::<u64>()
                    + 1;
                let data: Vec<f32> = (0..reach)
                    .map(|e| ((e * 7 + i as u64 * 3) % 11) as f32 - 5.0)
                    .collect();
                let b = r.allocate(0, reach * 4, &s).unwrap();
                r.copy_host_to_device(&floats(&data), &b, &Layout::bytes(reach * 4), &s)
                    .unwrap();
                let t = DeviceTensor::new(b, DType::F32, offset * 4, sizes, Some(strides)).unwrap();
                // The view's elements in row-major order, for the reference.
                let mut logical = Vec::new();
                let n: u64 = sizes.iter().product();
                for flat in 0..n {
                    let (mut rest, mut at) = (flat, *offset);
                    for d in (0..sizes.len()).rev() {
                        at += (rest % sizes[d]) * strides[d];
                        rest /= sizes[d];
                    }
                    logical.push(data[at as usize] as f64);
                }
                values.push(logical);
                // SAFETY: nothing writes the buffer while the view lives.
                let read_in_place = unsafe { HostTensor::borrow_device_permuted(&t) };
                assert_eq!(
                    read_in_place.map(|(_, p)| p),
                    perms[i].map(|p| p.to_vec()),
                    "{sizes:?} {strides:?}"
                );
                tensors.push(t);
                params.push(g.param(TensorType::new(DType::F32, sizes)));
            }
            let prim = Prim::DotGeneral {
                lhs_batch: lb.to_vec(),
                rhs_batch: rb.to_vec(),
                lhs_contract: lc.to_vec(),
                rhs_contract: rc.to_vec(),
                precision: Default::default(),
            };
            let out = g.op(prim.clone(), &params).unwrap();
            let exe = r.compile(&g.build(&[out]).unwrap()).unwrap();
            let want = crate::platform::host::kernels::eval(
                &prim,
                &[
                    &HostTensor::from_f64(DType::F32, lhs.0, &values[0]).unwrap(),
                    &HostTensor::from_f64(DType::F32, rhs.0, &values[1]).unwrap(),
                ],
            )
            .unwrap()
            .remove(0);
            let ob = r.allocate(0, want.ty.nbytes().max(4), &s).unwrap();
            let ot = DeviceTensor::contiguous(ob.clone(), DType::F32, &want.ty.dims).unwrap();
            r.launch(exe, &tensors, &[ot], &s, "graph").unwrap();
            let mut got = vec![0u8; want.ty.nbytes() as usize];
            r.copy_device_to_host(&ob, &Layout::bytes(got.len() as u64), &mut got, &s)
                .unwrap();
            assert_eq!(got, want.data.as_bytes(), "{lhs:?} · {rhs:?}");
        }
    }

    /// A loop pass reads transposed and expanded f32 parameters in place
    /// with their own strides, and gathers those it cannot (a reshape that
    /// merges a transposed parameter's dimensions); all equal the result
    /// of contiguous copies.
    #[test]
    fn passes_over_strided_parameters_equal_contiguous_ones() {
        use crate::ir::{BinaryOp, DType, GraphBuilder, Prim, TensorType, UnaryOp};
        use crate::platform::host::kernels::{eval_graph, HostTensor};
        let r = rt(1, 1 << 30);
        let s = r.default_stream(0).unwrap();
        // A view of fresh memory: its elements in row-major order, and the
        // tensor itself.
        let view = |sizes: &[u64], strides: &[u64], offset: u64, seed: u64| {
            let reach = offset
                + sizes
                    .iter()
                    .zip(strides)
                    .map(|(n, s)| (n - 1) * s)
                    .sum::<u64>()
                + 1;
            let data: Vec<f32> = (0..reach)
                .map(|e| ((e * 7 + seed * 5) % 13) as f32 / 4.0 - 1.5)
                .collect();
            let b = r.allocate(0, reach * 4, &s).unwrap();
            r.copy_host_to_device(&floats(&data), &b, &Layout::bytes(reach * 4), &s)
                .unwrap();
            let t = DeviceTensor::new(b, DType::F32, offset * 4, sizes, Some(strides)).unwrap();
            let n: u64 = sizes.iter().product();
            let logical: Vec<f64> = (0..n)
                .map(|flat| {
                    let (mut rest, mut at) = (flat, offset);
                    for d in (0..sizes.len()).rev() {
                        at += (rest % sizes[d]) * strides[d];
                        rest /= sizes[d];
                    }
                    data[at as usize] as f64
                })
                .collect();
            (
                HostTensor::from_f64(DType::F32, sizes, &logical).unwrap(),
                t,
            )
        };
        // exp(x) * e + y, x transposed [8, 300] of [300, 8] memory at an
        // offset, e an expanded row, y a reshape of a transposed [8, 2, 150]
        // (its last two dimensions merge, so it is gathered).
        let (x, xt) = view(&[8, 300], &[1, 8], 5, 1);
        let (e, et) = view(&[8, 300], &[0, 1], 0, 2);
        let (y, yt) = view(&[8, 2, 150], &[1, 8, 16], 0, 3);
        let mut g = GraphBuilder::new();
        let f = |d: &[u64]| TensorType::new(DType::F32, d);
        let (px, pe, py) = (
            g.param(f(&[8, 300])),
            g.param(f(&[8, 300])),
            g.param(f(&[8, 2, 150])),
        );
        let ex = g.unary(UnaryOp::Exp, px).unwrap();
        let scaled = g.binary(BinaryOp::Mul, ex, pe).unwrap();
        let flat = g.op(Prim::Reshape { dims: vec![8, 300] }, &[py]).unwrap();
        let out = g.binary(BinaryOp::Add, scaled, flat).unwrap();
        let graph = g.build(&[out]).unwrap();
        let want = eval_graph(&graph, &[x, e, y]).unwrap().remove(0);
        let exe = r.compile(&graph).unwrap();
        let ob = r.allocate(0, want.ty.nbytes(), &s).unwrap();
        let ot = DeviceTensor::contiguous(ob.clone(), DType::F32, &[8, 300]).unwrap();
        r.launch(exe, &[xt, et, yt], &[ot], &s, "graph").unwrap();
        let mut got = vec![0u8; want.ty.nbytes() as usize];
        r.copy_device_to_host(&ob, &Layout::bytes(got.len() as u64), &mut got, &s)
            .unwrap();
        let got: &[f32] = bytemuck::cast_slice(&got);
        for (i, (a, b)) in got.iter().zip(want.as_slice::<f32>()).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                "element {i}: {a} vs {b}"
            );
        }
    }

    /// A product written straight into its output's device memory is
    /// still read by a later pass; a product whose output is a strided
    /// view, or overlaps its own operand, is written back the usual way.
    #[test]
    fn products_written_into_device_memory_equal_the_reference() {
        use crate::ir::{BinaryOp, DType, GraphBuilder, Prim, TensorType, UnaryOp};
        use crate::platform::host::kernels::{eval_graph, HostTensor};
        let r = rt(1, 1 << 30);
        let s = r.default_stream(0).unwrap();
        let f = |d: &[u64]| TensorType::new(DType::F32, d);
        let mut g = GraphBuilder::new();
        let (x, w) = (g.param(f(&[64, 48])), g.param(f(&[48, 48])));
        let mm = Prim::DotGeneral {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract: vec![1],
            rhs_contract: vec![0],
            precision: Default::default(),
        };
        let y = g.op(mm, &[x, w]).unwrap();
        let e = g.unary(UnaryOp::Tanh, y).unwrap();
        let z = g.binary(BinaryOp::Add, e, y).unwrap();
        let graph = g.build(&[y, z]).unwrap();
        let exe = r.compile(&graph).unwrap();
        let values = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 5 + seed) % 11) as f32 / 8.0 - 0.6)
                .collect()
        };
        let (xs, ws) = (values(64 * 48, 1), values(48 * 48, 2));
        let want = eval_graph(
            &graph,
            &[
                HostTensor::from_slice(DType::F32, &[64, 48], &xs).unwrap(),
                HostTensor::from_slice(DType::F32, &[48, 48], &ws).unwrap(),
            ],
        )
        .unwrap();
        let upload = |v: &[f32]| {
            let b = r.allocate(0, v.len() as u64 * 4, &s).unwrap();
            r.copy_host_to_device(&floats(v), &b, &Layout::bytes(v.len() as u64 * 4), &s)
                .unwrap();
            b
        };
        let read = |b: &Buffer, n: usize| {
            let mut out = vec![0u8; n * 4];
            r.copy_device_to_host(b, &Layout::bytes(n as u64 * 4), &mut out, &s)
                .unwrap();
            bytemuck::cast_slice::<u8, f32>(&out).to_vec()
        };
        let close = |got: &[f32], want: &HostTensor, what: &str| {
            for (i, (a, b)) in got.iter().zip(want.as_slice::<f32>()).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{what} {i}: {a} vs {b}"
                );
            }
        };
        // Contiguous outputs: the product goes straight to device memory.
        let (xb, wb) = (upload(&xs), upload(&ws));
        let (yb, zb) = (
            r.allocate(0, 64 * 48 * 4, &s).unwrap(),
            r.allocate(0, 64 * 48 * 4, &s).unwrap(),
        );
        let t = |b: &Buffer, d: &[u64]| DeviceTensor::contiguous(b.clone(), DType::F32, d).unwrap();
        r.launch(
            exe.clone(),
            &[t(&xb, &[64, 48]), t(&wb, &[48, 48])],
            &[t(&yb, &[64, 48]), t(&zb, &[64, 48])],
            &s,
            "graph",
        )
        .unwrap();
        close(&read(&yb, 64 * 48), &want[0], "y");
        close(&read(&zb, 64 * 48), &want[1], "z");
        // y into a transposed view: written back through its layout.
        let yt = DeviceTensor::new(yb.clone(), DType::F32, 0, &[64, 48], Some(&[1, 64])).unwrap();
        r.launch(
            exe.clone(),
            &[t(&xb, &[64, 48]), t(&wb, &[48, 48])],
            &[yt, t(&zb, &[64, 48])],
            &s,
            "graph",
        )
        .unwrap();
        let got = read(&yb, 64 * 48);
        let mut transposed = vec![0f32; 64 * 48];
        for i in 0..64 {
            for j in 0..48 {
                transposed[i * 48 + j] = got[j * 64 + i];
            }
        }
        close(&transposed, &want[0], "y transposed");
        // y written over x, its own operand: x is read whole first.
        r.launch(
            exe,
            &[t(&xb, &[64, 48]), t(&wb, &[48, 48])],
            &[t(&xb, &[64, 48]), t(&zb, &[64, 48])],
            &s,
            "graph",
        )
        .unwrap();
        close(&read(&xb, 64 * 48), &want[0], "y over x");
        close(&read(&zb, 64 * 48), &want[1], "z after y over x");
    }

    #[test]
    fn platform_choice_and_unknown_platforms() {
        let e = Runtime::new(&RuntimeOptions {
            platform: Some("tpu-v9".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e.code(), ErrorCode::NotFound);
        assert!(e.to_string().contains("'host' and 'xla'"), "{e}");
        let r = rt(4, 1 << 30);
        assert_eq!(r.device_count(), 4);
        assert_eq!(r.platform().topology(), &[2, 2]);
        assert!(r.device(4).unwrap_err().to_string().contains("0 to 3"));
    }

    #[test]
    fn host_device_round_trips_contiguous_and_strided() {
        let r = rt(2, 64 << 20);
        let s = r.default_stream(0).unwrap();
        let b = r.allocate(0, 24, &s).unwrap();
        let whole = Layout::bytes(24);
        r.copy_host_to_device(&floats(&[1., 2., 3., 4., 5., 6.]), &b, &whole, &s)
            .unwrap();
        // Read the 2x3 matrix transposed.
        let t = Layout {
            offset: 0,
            sizes: smallvec::smallvec![3, 2],
            strides: smallvec::smallvec![1, 3],
            elem_size: 4,
        };
        let mut out = vec![0u8; 24];
        r.copy_device_to_host(&b, &t, &mut out, &s).unwrap();
        assert_eq!(
            bytemuck::cast_slice::<u8, f32>(&out),
            &[1., 4., 2., 5., 3., 6.]
        );
        // Write one column (strided destination).
        let col = Layout {
            offset: 4,
            sizes: smallvec::smallvec![2],
            strides: smallvec::smallvec![3],
            elem_size: 4,
        };
        r.copy_host_to_device(&floats(&[20., 50.]), &b, &col, &s)
            .unwrap();
        r.copy_device_to_host(&b, &whole, &mut out, &s).unwrap();
        assert_eq!(
            bytemuck::cast_slice::<u8, f32>(&out),
            &[1., 20., 3., 4., 50., 6.]
        );
    }

    #[test]
    fn async_copies_follow_stream_order_across_chips() {
        let r = rt(2, 64 << 20);
        let s0 = r.create_stream(0, CoreKind::TensorCore, 0).unwrap();
        let s1 = r.create_stream(1, CoreKind::TensorCore, 0).unwrap();
        let a = r.allocate(0, 1 << 20, &s0).unwrap();
        let b = r.allocate(1, 1 << 20, &s1).unwrap();
        let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        r.copy_host_to_device_async(data.clone(), &a, &Layout::bytes(1 << 20), &s0)
            .unwrap();
        s1.wait_stream(&s0).unwrap();
        let whole = Layout::bytes(1 << 20);
        r.copy_device_to_device(&a, &whole, &b, &whole, &s1)
            .unwrap();
        let back = HostReadback::new(1 << 20);
        r.copy_device_to_host_async(&b, &whole, Box::new(back.clone()), &s1)
            .unwrap();
        // Dropping the buffers now is safe: queued work holds them.
        drop((a, b));
        s1.synchronize().unwrap();
        assert!(back.to_vec() == data);
        r.synchronize().unwrap();
        assert_eq!(r.memory_stats(0).unwrap().allocated_bytes.current, 0);
        assert_eq!(r.memory_stats(1).unwrap().allocated_bytes.current, 0);
    }

    #[test]
    fn bad_copies_are_errors_that_say_what_was_wrong() {
        let r = rt(1, 64 << 20);
        let s = r.default_stream(0).unwrap();
        let b = r.allocate(0, 16, &s).unwrap();
        let e = r
            .copy_host_to_device(&[0u8; 8], &b, &Layout::bytes(16), &s)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("host source has 8 bytes but the layout"),
            "{e}"
        );
        let e = r
            .copy_host_to_device(&[0u8; 32], &b, &Layout::bytes(32), &s)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("reaches byte 32 of a 16-byte buffer"),
            "{e}"
        );
        let e = r.fill_async(&b, 8, 16, 0, &s).unwrap_err();
        assert!(e.to_string().contains("outside a 16-byte buffer"), "{e}");
        let other = r.create_stream(0, CoreKind::SparseCore, 0).unwrap();
        let c = r.allocate(0, 8, &other).unwrap();
        let e = r
            .copy_device_to_device(&b, &Layout::bytes(16), &c, &Layout::bytes(8), &s)
            .unwrap_err();
        assert!(e.to_string().contains("different shapes"), "{e}");
    }

    #[test]
    fn memory_statistics_move_and_oom_is_an_error() {
        let r = rt(1, 32 << 20);
        let s = r.default_stream(0).unwrap();
        let a = r.allocate(0, 10 << 20, &s).unwrap();
        let st = r.memory_stats(0).unwrap();
        assert_eq!(st.allocated_bytes.current, 10 << 20);
        assert!(st.reserved_bytes.current >= 10 << 20);
        let e = r.allocate(0, 30 << 20, &s).unwrap_err();
        assert_eq!(e.code(), ErrorCode::OutOfMemory);
        assert!(e.to_string().contains("30.00 MiB"), "{e}");
        drop(a);
        assert!(r.empty_cache(0).unwrap() >= 10 << 20);
        let st = r.memory_stats(0).unwrap();
        assert_eq!(
            (
                st.allocated_bytes.current,
                st.reserved_bytes.current,
                st.num_ooms
            ),
            (0, 0, 1)
        );
        let snap = r.memory_snapshot(0).unwrap().to_json();
        assert!(snap.contains("\"segments\":[]"), "{snap}");
    }

    fn upload(r: &Runtime, chip: usize, dims: &[u64], v: &[f32]) -> DeviceTensor {
        let s = r.default_stream(chip).unwrap();
        let b = r.allocate(chip, (v.len() * 4) as u64, &s).unwrap();
        r.copy_host_to_device(bytemuck::cast_slice(v), &b, &Layout::bytes(b.len()), &s)
            .unwrap();
        DeviceTensor::contiguous(b, crate::ir::DType::F32, dims).unwrap()
    }

    fn download(r: &Runtime, t: &DeviceTensor) -> Vec<f32> {
        let s = r.default_stream(t.buffer.chip()).unwrap();
        let mut out = vec![0u8; (t.numel() * 4) as usize];
        r.copy_device_to_host(&t.buffer, &t.layout, &mut out, &s)
            .unwrap();
        bytemuck::cast_slice(&out).to_vec()
    }

    #[test]
    fn ops_run_on_device_tensors_views_and_in_place() {
        let r = rt(2, 64 << 20);
        let s = r.default_stream(0).unwrap();
        let x = upload(&r, 0, &[2, 3], &[1., 2., 3., 4., 5., 6.]);
        let add = ops::lookup("add").unwrap();
        let out = r
            .call_op_alloc(add, &[x.clone(), x.clone()], &Attrs::new(), &s)
            .unwrap();
        assert_eq!(download(&r, &out[0]), vec![2., 4., 6., 8., 10., 12.]);
        // A transposed view of x as an input.
        let xt = DeviceTensor::new(
            x.buffer.clone(),
            crate::ir::DType::F32,
            0,
            &[3, 2],
            Some(&[1, 3]),
        )
        .unwrap();
        let y = upload(&r, 0, &[3, 2], &[10., 10., 10., 10., 10., 10.]);
        let out = r.call_op_alloc(add, &[xt, y], &Attrs::new(), &s).unwrap();
        assert_eq!(download(&r, &out[0]), vec![11., 14., 12., 15., 13., 16.]);
        // In place: x += x, the output is the input itself.
        double_in_place(&r, &s, &x);
        assert_eq!(download(&r, &x), vec![2., 4., 6., 8., 10., 12.]);
        // The second call of the same signature hits the op memo, not the cache.
        let before = r.compile_cache_stats().requests;
        r.call_op_alloc(add, &[x.clone(), x.clone()], &Attrs::new(), &s)
            .unwrap();
        assert_eq!(r.compile_cache_stats().requests, before);
        // Tensors of two devices in one op: an error naming both.
        let z = upload(&r, 1, &[2, 3], &[0.; 6]);
        let e = r
            .call_op_alloc(add, &[x.clone(), z], &Attrs::new(), &s)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("input 1 is on tpu:1 but the stream is on tpu:0"),
            "{e}"
        );
    }

    #[test]
    fn a_kernel_error_poisons_the_stream_with_the_op_name() {
        let r = rt(1, 64 << 20);
        let s = r.create_stream(0, CoreKind::TensorCore, 0).unwrap();
        let w = upload(&r, 0, &[2, 2], &[1., 2., 3., 4.]);
        let b = r.allocate(0, 8, &s).unwrap();
        let bad = [5i32, 0];
        r.copy_host_to_device(bytemuck::cast_slice(&bad), &b, &Layout::bytes(8), &s)
            .unwrap();
        let idx = DeviceTensor::contiguous(b, crate::ir::DType::I32, &[2]).unwrap();
        let emb = ops::lookup("embedding").unwrap();
        r.call_op_alloc(emb, &[w, idx], &Attrs::new(), &s).unwrap();
        let e = s.synchronize().unwrap_err().to_string();
        assert!(e.contains("embedding") && e.contains('5'), "{e}");
    }

    #[test]
    fn debug_mode_flags_only_non_finite_values_the_op_introduced() {
        let r = rt(1, 64 << 20);
        let s = r.default_stream(0).unwrap();
        crate::eager::push_mode(EagerMode::DeferNeverAndLaunchBlocking).unwrap();
        let add = ops::lookup("add").unwrap();
        let div = ops::lookup("div").unwrap();
        // A mask's -inf passes through an op.
        let mask = upload(&r, 0, &[3], &[0., f32::NEG_INFINITY, 0.]);
        let x = upload(&r, 0, &[3], &[1., 2., 3.]);
        let out = r
            .call_op_alloc(add, &[x.clone(), mask], &Attrs::new(), &s)
            .unwrap();
        assert_eq!(download(&r, &out[0]), vec![1., f32::NEG_INFINITY, 3.]);
        // Inf made from finite inputs (a division by zero) is an error.
        let zero = upload(&r, 0, &[3], &[1., 0., 1.]);
        let e = r
            .call_op_alloc(div, &[x.clone(), zero], &Attrs::new(), &s)
            .unwrap_err()
            .to_string();
        assert!(e.contains("div: output 0 holds Inf at position [1]"), "{e}");
        // NaN from finite inputs (0 / 0) is an error too; from an input
        // holding Inf (inf - inf, a fully masked softmax row) it is not.
        let zeros = upload(&r, 0, &[2], &[0., 0.]);
        let e = r
            .call_op_alloc(div, &[zeros.clone(), zeros], &Attrs::new(), &s)
            .unwrap_err()
            .to_string();
        assert!(e.contains("holds NaN at position [0]"), "{e}");
        let inf = upload(&r, 0, &[2], &[f32::INFINITY, 1.]);
        let sub = ops::lookup("sub").unwrap();
        let out = r
            .call_op_alloc(sub, &[inf.clone(), inf], &Attrs::new(), &s)
            .unwrap();
        assert!(download(&r, &out[0])[0].is_nan());
        crate::eager::pop_mode().unwrap();
    }
}
