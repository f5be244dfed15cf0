//! The `xla` platform: real XLA through a PJRT plugin loaded at run time
//! (the XLA CPU plugin from the xla-cpu-pjrt wheel here, libtpu on TPU VMs,
//! the CUDA plugin on GPUs).
//!
//! It loads a plugin, checks its PJRT API version and the size of its
//! function table, creates a client (with full options), lowers graphs to
//! StableHLO (`lower`), compiles, serializes and executes them. The pool's
//! memory is host memory: the CPU plugin reads and writes it in place
//! (views and donated zero-copy buffers); on a plugin with memory of its
//! own (GPU, TPU) tensors' values live in the plugin's buffers between
//! executions and the pool's bytes are brought up to date when read
//! (`resident`).
//!
//! Rules kept here (see ANCHORS): every args struct carries its
//! `struct_size`; a function pointer is called only if it lies inside the
//! plugin's `PJRT_Api.struct_size`; the library is never unloaded.

#[allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    clippy::all
)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/pjrt.rs"));
}

pub mod lower;
mod mappings;
pub mod options;
mod resident;

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::host::HostSegment;
use super::slice::SliceLayout;
use super::{DeviceInfo, Executable, Platform, Segment};
use crate::error::{Error, Result};
use crate::ir::Graph;
use crate::tensor::DeviceTensor;
use smallvec::SmallVec;

/// The plugin library's file in a package's install directory.
const KNOWN_PLUGINS: &[&str] = &[
    "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so",
    "libtpu/libtpu.so",
    "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
    "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
];

/// The libtpu wheel's library in the active venv or the workspace's `.venv`.
pub fn find_libtpu() -> Option<PathBuf> {
    venv_roots().into_iter().find_map(|root| {
        std::fs::read_dir(root).ok()?.flatten().find_map(|e| {
            let p = e.path().join("site-packages/libtpu/libtpu.so");
            p.exists().then_some(p)
        })
    })
}

fn venv_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        roots.push(PathBuf::from(v).join("lib"));
    }
    roots.push(PathBuf::from(".venv/lib"));
    roots.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/lib"));
    roots
}

/// `TPURT_PJRT_PLUGIN`, else the first known plugin in the site-packages of
/// the active virtual environment or the workspace's `.venv`.
pub fn find_plugin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("TPURT_PJRT_PLUGIN") {
        let p = PathBuf::from(p);
        if !p.exists() {
            return Err(Error::Unavailable(format!(
                "TPURT_PJRT_PLUGIN={} does not exist",
                p.display()
            )));
        }
        return Ok(p);
    }
    for root in &venv_roots() {
        let Ok(entries) = std::fs::read_dir(root) else {
            continue;
        };
        for entry in entries.flatten() {
            for known in KNOWN_PLUGINS {
                let p = entry.path().join("site-packages").join(known);
                if p.exists() {
                    return Ok(p);
                }
            }
        }
    }
    Err(Error::Unavailable(
        "no PJRT plugin found: set TPURT_PJRT_PLUGIN, or install xla-cpu-pjrt (or libtpu, or \
         jax-cuda12-pjrt) into the active virtual environment"
            .into(),
    ))
}

pub struct XlaPlatform {
    /// Itself, for executables that must keep the client alive.
    me: std::sync::Weak<XlaPlatform>,
    plugin: PathBuf,
    /// The client's addressable devices.
    device_ptrs: Vec<*mut sys::PJRT_Device>,
    api: *const sys::PJRT_Api,
    client: *mut sys::PJRT_Client,
    name: String,
    version: (i32, i32),
    topology: Vec<u32>,
    devices: Vec<DeviceInfo>,
    slice: Option<SliceLayout>,
    /// The plugin's devices address host memory (the CPU plugin).
    host_memory: bool,
    /// A tensor in the pool is handed to XLA as a view, with no copy, and
    /// results are read from their buffers' addresses: where the memory
    /// is host memory, unless `TPURT_XLA_ZERO_COPY=0` (see [`zero_copy_setting`]).
    zero_copy: bool,
    transfers: TransferCounters,
    /// Input views kept across executions (see [`ViewCache`]).
    views: std::sync::Mutex<ViewCache>,
    /// [`compile_settings`] when the plugin was loaded.
    settings: String,
    /// Programs that give a resident value another shape or order on the
    /// device (`relayout`), by what they do; None for a relayout seen once
    /// (compiled when seen again).
    relayouts: std::sync::Mutex<std::collections::HashMap<RelayoutKey, Option<usize>>>,
    /// The process's memory mappings, which loaded programs use up.
    mappings: mappings::MapWatch,
}

/// What a relayout program does: a value of `dtype` and `from` dims read
/// as `sizes` with `strides` (elements) from its first element.
#[derive(PartialEq, Eq, Hash)]
struct RelayoutKey {
    dtype: crate::ir::DType,
    from: SmallVec<[i64; 6]>,
    sizes: SmallVec<[u64; 6]>,
    strides: SmallVec<[u64; 6]>,
}

/// At most this many relayouts are remembered, seen or compiled (a model
/// has a few dozen); past it, new ones are copied in from the pool.
const MAX_RELAYOUTS: usize = 1024;

/// How inputs and outputs crossed between the pool and XLA: counters for
/// tests and for anyone checking that the copies they expect are gone.
#[derive(Debug, Default)]
struct TransferCounters {
    input_views: std::sync::atomic::AtomicU64,
    views_created: std::sync::atomic::AtomicU64,
    staged_inputs: std::sync::atomic::AtomicU64,
    staged_input_bytes: std::sync::atomic::AtomicU64,
    in_place_outputs: std::sync::atomic::AtomicU64,
    direct_outputs: std::sync::atomic::AtomicU64,
    staged_outputs: std::sync::atomic::AtomicU64,
    plugin_reads: std::sync::atomic::AtomicU64,
    resident_inputs: std::sync::atomic::AtomicU64,
    resident_outputs: std::sync::atomic::AtomicU64,
    copies_back: std::sync::atomic::AtomicU64,
    relayouts: std::sync::atomic::AtomicU64,
}

/// A snapshot of [`XlaPlatform::transfer_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Inputs XLA read in place, through a view of the pool's memory.
    pub input_views: u64,
    /// The PJRT views made for them: fewer than `input_views` when views
    /// were reused (see [`ViewCache`]).
    pub views_created: u64,
    /// Inputs copied into a plugin-owned buffer first, and their bytes
    /// (strided, misaligned or empty inputs, and every input on a plugin
    /// with memory of its own).
    pub staged_inputs: u64,
    pub staged_input_bytes: u64,
    /// Outputs XLA wrote in place, into their pool bytes (a donated
    /// zero-copy buffer aliased to the result; counted once the result's
    /// address is checked to be those bytes).
    pub in_place_outputs: u64,
    /// Outputs XLA wrote into a buffer of its own, then copied straight
    /// into their place in the pool (those that overlap an input or
    /// another output, or are misaligned), and those that went through a
    /// host tensor (strided outputs).
    pub direct_outputs: u64,
    pub staged_outputs: u64,
    /// Copies out of XLA's buffers (outputs, index checks) made by the
    /// plugin (`PJRT_Buffer_ToHostBuffer`), not read from the buffer's
    /// address: none on a plugin whose buffers are host memory.
    pub plugin_reads: u64,
    /// On a plugin with memory of its own ([`resident`]): inputs whose
    /// value was already in a buffer of the plugin's, outputs left in the
    /// plugin's buffer (not copied to the pool), and such values copied
    /// back to the pool because something else read or partly overwrote
    /// their bytes.
    pub resident_inputs: u64,
    pub resident_outputs: u64,
    pub copies_back: u64,
    /// Inputs made on the device from a resident value over the same
    /// bytes, in another shape or order (a reshaped or transposed view).
    pub relayouts: u64,
}

impl TransferStats {
    /// The counts since `before` (an earlier snapshot).
    pub fn since(&self, before: &TransferStats) -> TransferStats {
        TransferStats {
            input_views: self.input_views - before.input_views,
            views_created: self.views_created - before.views_created,
            staged_inputs: self.staged_inputs - before.staged_inputs,
            staged_input_bytes: self.staged_input_bytes - before.staged_input_bytes,
            in_place_outputs: self.in_place_outputs - before.in_place_outputs,
            direct_outputs: self.direct_outputs - before.direct_outputs,
            plugin_reads: self.plugin_reads - before.plugin_reads,
            staged_outputs: self.staged_outputs - before.staged_outputs,
            resident_inputs: self.resident_inputs - before.resident_inputs,
            resident_outputs: self.resident_outputs - before.resident_outputs,
            copies_back: self.copies_back - before.copies_back,
            relayouts: self.relayouts - before.relayouts,
        }
    }
}

/// Views need this alignment (a misaligned view is refused by the plugin).
const VIEW_ALIGN: usize = 64;

/// A view's delete callback: the memory is the pool's, so nothing to do
/// (the plugin requires a callback; a null one crashes at destroy).
unsafe extern "C" fn view_released(_ptr: *mut std::ffi::c_void, _arg: *mut std::ffi::c_void) {}

/// How many input views [`ViewCache`] keeps before it starts over.
const VIEW_CACHE_ENTRIES: usize = 4096;

/// How many times [`ViewCache`] hands out its views before it starts over.
///
/// A plugin lists on each buffer an event for every execution that read
/// it, and an event lives while any buffer lists it. The XLA CPU plugin
/// prunes a buffer's list only once it holds 1024 events, and then only
/// of the events that fired, so a view kept for good keeps the events of
/// executions long done: in a training loop, each step's (about 5 KiB a
/// step of heap in `test_soak.py`'s loop, growing for thousands of
/// steps). Starting over destroys the views, and their lists with them:
/// the events listed are at most this many. Each start-over makes every
/// view again: at 8192 the xla Llama step of `bench/` took about 7%
/// longer (four interleaved rounds); at this budget the difference was
/// within the noise, and the soak loop's heap in use moves within about
/// 3 MiB.
const VIEW_CACHE_USES: usize = 1 << 15;

/// A PJRT view over pool bytes, shared by the executions that read it.
struct CachedView {
    buffer: *mut sys::PJRT_Buffer,
    /// The segment the bytes lie in. Held weakly, it keeps the segment's
    /// allocation, so no other segment can take its identity: a view
    /// whose segment is gone is never found again (only destroyed).
    segment: std::sync::Weak<dyn super::DeviceMemory>,
}

// SAFETY: a PJRT buffer may be used and destroyed from any thread (the
// PJRT C API's contract); `ViewCache` destroys it only once no execution
// holds it.
unsafe impl Send for CachedView {}
// SAFETY: as above; executions only read the pointer.
unsafe impl Sync for CachedView {}

/// What identifies a view: its first byte's address, element type, dims
/// and device.
#[derive(PartialEq, Eq, Hash)]
struct ViewKey {
    address: usize,
    dtype: crate::ir::DType,
    dims: SmallVec<[i64; 6]>,
    device: usize,
}

/// Input views kept across executions. A view of pool bytes is only an
/// address and a shape: it stays valid for as long as its segment does,
/// whichever tensor lies there now, and XLA reads the bytes when it runs.
/// A training loop reads the same pool addresses step after step, so
/// keeping views saves two PJRT calls an input an execution (making the
/// view, destroying it): on a tiny op, much of the launch.
///
/// Executions hold an `Arc` to each view they use. When the map is full
/// its views are retired, and a retired view is destroyed once no
/// execution holds it.
struct ViewCache {
    map: crate::fxhash::FxHashMap<ViewKey, Arc<CachedView>>,
    retired: Vec<Arc<CachedView>>,
    /// How many views the map holds before it starts over.
    cap: usize,
    /// Views handed out since the map last started over.
    uses: usize,
    /// How many hand-outs the map allows before it starts over.
    max_uses: usize,
}

impl ViewCache {
    /// Retire every view in the map: each is destroyed once no execution
    /// holds it.
    fn start_over(&mut self) {
        self.retired.extend(self.map.drain().map(|(_, v)| v));
        self.uses = 0;
    }
}

impl Default for ViewCache {
    fn default() -> Self {
        ViewCache {
            map: Default::default(),
            retired: Vec::new(),
            cap: VIEW_CACHE_ENTRIES,
            uses: 0,
            max_uses: VIEW_CACHE_USES,
        }
    }
}

// SAFETY: a PJRT client is thread-safe by the PJRT C API's contract; the
// api table is immutable and the library stays loaded for the process.
unsafe impl Send for XlaPlatform {}
// SAFETY: as above.
unsafe impl Sync for XlaPlatform {}

impl std::fmt::Debug for XlaPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XlaPlatform")
            .field("plugin", &self.plugin)
            .field("platform", &self.name)
            .field("devices", &self.devices.len())
            .finish()
    }
}

macro_rules! args {
    ($ty:ident { $($field:ident : $value:expr),* $(,)? }) => {{
        let mut a: sys::$ty = Default::default();
        a.struct_size = std::mem::size_of::<sys::$ty>();
        $(a.$field = $value;)*
        a
    }};
}

/// The environment variables a plugin reads that change what it compiles:
/// Ops a deferred recording holds on a plugin whose memory is host memory
/// (see `defer_max_ops`).
const HOST_MEMORY_DEFER_MAX_OPS: usize = 200;

/// XLA's debug options (every XLA plugin parses `XLA_FLAGS`, once, when it
/// first needs them) and libtpu's arguments.
const COMPILE_SETTINGS: [&str; 2] = ["XLA_FLAGS", "LIBTPU_INIT_ARGS"];

/// The [`COMPILE_SETTINGS`] that are set, with their values, canonical:
/// part of every compile-cache key on this platform, so an executable
/// compiled under other flags (fast math, another ISA, a dump directory)
/// is compiled again rather than loaded from the disk cache.
fn compile_settings(get: impl Fn(&str) -> Option<std::ffi::OsString>) -> String {
    let set: Vec<(&str, String)> = COMPILE_SETTINGS
        .iter()
        .filter_map(|&name| get(name).map(|v| (name, v.to_string_lossy().into_owned())))
        .collect();
    if set.is_empty() {
        return String::new();
    }
    crate::compile::canonical_options(set.iter().map(|(n, v)| (*n, v.as_str())))
}

/// `TPURT_XLA_ZERO_COPY`: unset or `1`, XLA reads and writes tensors in
/// the pool's memory where the plugin's memory is host memory; `0`, every
/// input is copied into a buffer of the plugin's and every output copied
/// out, as on a plugin with memory of its own (a GPU or a TPU), so that
/// path can be run, and compared, on the CPU plugin.
fn zero_copy_setting(get: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<bool> {
    const NAME: &str = "TPURT_XLA_ZERO_COPY";
    match get(NAME).as_deref().map(|v| v.to_str()) {
        None => Ok(true),
        Some(Some("1")) => Ok(true),
        Some(Some("0")) => Ok(false),
        Some(v) => Err(Error::InvalidArgument(format!(
            "{NAME}={}: expected 0 or 1",
            v.unwrap_or("(not UTF-8)")
        ))),
    }
}

impl XlaPlatform {
    /// Load `plugin` and create a client with `devices` CPU devices (the
    /// CPU plugin's option; other plugins ignore it).
    pub fn load(plugin: &Path, devices: u32) -> Result<Arc<XlaPlatform>> {
        Self::load_in_slice(plugin, devices, None)
    }

    /// As [`XlaPlatform::load`], as one host of a TPU slice: the XLA CPU
    /// plugin, standing in for a TPU host, gets one device per visible
    /// chip, with the slice's coordinates. libtpu reads the `TPU_*`
    /// variables itself and other plugins are not TPUs, so for them
    /// `slice` is ignored.
    pub fn load_in_slice(
        plugin: &Path,
        devices: u32,
        slice: Option<SliceLayout>,
    ) -> Result<Arc<XlaPlatform>> {
        let allow_zero_copy = zero_copy_setting(|n| std::env::var_os(n))?;
        Self::load_with(plugin, devices, slice, allow_zero_copy)
    }

    /// As [`XlaPlatform::load_in_slice`]; `allow_zero_copy` false copies
    /// every input and output, as `TPURT_XLA_ZERO_COPY=0` does.
    fn load_with(
        plugin: &Path,
        devices: u32,
        slice: Option<SliceLayout>,
        allow_zero_copy: bool,
    ) -> Result<Arc<XlaPlatform>> {
        let is_libtpu = plugin.to_string_lossy().contains("libtpu");
        let is_cpu = plugin
            .file_name()
            .is_some_and(|f| f.to_string_lossy().contains("cpu"));
        // The CUDA plugins of jax-cuda12-pjrt and jax-cuda13-pjrt.
        let is_gpu = plugin
            .file_name()
            .is_some_and(|f| f.to_string_lossy().contains("cuda"));
        // Only the CPU plugin takes a device count, so only it can stand in
        // for a host's chips; a GPU is not part of a TPU slice.
        let slice = slice.filter(|_| is_cpu);
        let devices = slice.as_ref().map_or(devices, |s| s.chips.len() as u32);
        let shown = plugin.display().to_string();
        if is_libtpu && std::env::var_os("TPU_SKIP_MDS_QUERY").is_none() && !tpu_device_present() {
            // libtpu would wait minutes for a cloud metadata server here.
            return Err(Error::Unavailable(format!(
                "PJRT plugin {shown}: no TPU device on this machine (no /dev/accel* or /dev/vfio devices); \
                 not loading libtpu, which would wait for a cloud metadata server (set TPU_SKIP_MDS_QUERY=1 \
                 to let it fail at once)"
            )));
        }
        // SAFETY: loading a PJRT plugin runs its initializers; that is what
        // the user asked for by naming it. It is never unloaded (unloading
        // after an error crashes at exit, see ANCHORS).
        let lib = unsafe { libloading::Library::new(plugin) }
            .map_err(|e| Error::Unavailable(format!("PJRT plugin {shown}: cannot load: {e}")))?;
        let lib: &'static libloading::Library = Box::leak(Box::new(lib));
        // SAFETY: GetPjrtApi is the plugin's documented entry point, with
        // this signature in pjrt_c_api.h.
        let get_api: libloading::Symbol<unsafe extern "C" fn() -> *const sys::PJRT_Api> = unsafe {
            lib.get(b"GetPjrtApi\0")
        }
        .map_err(|e| Error::Unavailable(format!("PJRT plugin {shown}: no GetPjrtApi: {e}")))?;
        // SAFETY: calling the entry point; it returns a static table or null.
        let api = unsafe { get_api() };
        if api.is_null() {
            return Err(Error::Unavailable(format!(
                "PJRT plugin {shown}: GetPjrtApi returned null"
            )));
        }
        // SAFETY: api points to the plugin's static PJRT_Api, whose first
        // fields (size, version) every PJRT version has.
        let version = unsafe {
            (
                (*api).pjrt_api_version.major_version,
                (*api).pjrt_api_version.minor_version,
            )
        };
        if version.0 != sys::PJRT_API_MAJOR as i32 {
            return Err(Error::Unavailable(format!(
                "PJRT plugin {shown}: API version {}.{}, tpurt speaks {}.x",
                version.0,
                version.1,
                sys::PJRT_API_MAJOR
            )));
        }
        let mut platform = XlaPlatform {
            me: std::sync::Weak::new(),
            device_ptrs: Vec::new(),
            plugin: plugin.to_path_buf(),
            api,
            client: std::ptr::null_mut(),
            name: String::new(),
            version,
            topology: Vec::new(),
            devices: Vec::new(),
            slice: None,
            host_memory: false,
            zero_copy: false,
            transfers: TransferCounters::default(),
            views: std::sync::Mutex::new(ViewCache::default()),
            settings: compile_settings(|name| std::env::var_os(name)),
            relayouts: Default::default(),
            mappings: mappings::MapWatch::from_system(),
        };
        let mut init = args!(PJRT_Plugin_Initialize_Args {});
        platform.call(
            "PJRT_Plugin_Initialize",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Plugin_Initialize),
            |api| {
                // SAFETY: the pointer lies inside the table (checked by `call`); args is a full struct.
                unsafe { api.PJRT_Plugin_Initialize.map(|f| f(&mut init)) }
            },
        )?;
        // Only the CPU plugin takes a device count; others reject options
        // they do not know (libtpu: "Unexpected option name"). The GPU
        // plugins would take 75% of the GPU's memory up front for XLA's
        // own allocator; tensors live in the runtime's pool and XLA holds
        // only staged copies and temporaries, so it allocates as it needs
        // (and a second client in the process, or torch beside it, still
        // finds memory).
        let (option_name, option_type) = if is_cpu {
            (
                "cpu_device_count",
                sys::PJRT_NamedValue_Type_PJRT_NamedValue_kInt64,
            )
        } else {
            (
                "preallocate",
                sys::PJRT_NamedValue_Type_PJRT_NamedValue_kBool,
            )
        };
        let option_name = CString::new(option_name).unwrap_or_default();
        let mut option = sys::PJRT_NamedValue {
            struct_size: std::mem::size_of::<sys::PJRT_NamedValue>(),
            name: option_name.as_ptr(),
            name_size: option_name.as_bytes().len(),
            type_: option_type,
            value_size: 1,
            ..Default::default()
        };
        if is_cpu {
            option.__bindgen_anon_1.int64_value = devices as i64;
        } else {
            option.__bindgen_anon_1.bool_value = false;
        }
        let takes_option = is_cpu || is_gpu;
        let mut create = args!(PJRT_Client_Create_Args {
            create_options: if takes_option {
                &option
            } else {
                std::ptr::null()
            },
            num_options: takes_option as usize,
        });
        platform
            .call(
                "PJRT_Client_Create",
                std::mem::offset_of!(sys::PJRT_Api, PJRT_Client_Create),
                |api| {
                    // SAFETY: as above; `option` and its name outlive the call.
                    unsafe { api.PJRT_Client_Create.map(|f| f(&mut create)) }
                },
            )
            .map_err(|e| match e {
                Error::Unavailable(m) if is_libtpu => {
                    Error::Unavailable(format!("{m} (libtpu found no TPU device on this machine)"))
                }
                other => other,
            })?;
        platform.client = create.client;
        let mut name = args!(PJRT_Client_PlatformName_Args {
            client: platform.client
        });
        platform.call(
            "PJRT_Client_PlatformName",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Client_PlatformName),
            |api| {
                // SAFETY: as above; the client was just created.
                unsafe { api.PJRT_Client_PlatformName.map(|f| f(&mut name)) }
            },
        )?;
        // SAFETY: the plugin returns platform_name_size bytes it owns for the client's life.
        platform.name = unsafe { bytes_to_string(name.platform_name, name.platform_name_size) };
        platform.host_memory = platform.name == "cpu";
        platform.zero_copy = platform.host_memory && allow_zero_copy;
        let mut devs = args!(PJRT_Client_AddressableDevices_Args {
            client: platform.client
        });
        platform.call(
            "PJRT_Client_AddressableDevices",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Client_AddressableDevices),
            |api| {
                // SAFETY: as above.
                unsafe { api.PJRT_Client_AddressableDevices.map(|f| f(&mut devs)) }
            },
        )?;
        let n = devs.num_addressable_devices;
        if n == 0 {
            return Err(Error::Unavailable(format!(
                "PJRT plugin {shown}: no device found"
            )));
        }
        // SAFETY: the plugin returned `n` device pointers, valid for the client's life.
        platform.device_ptrs =
            unsafe { std::slice::from_raw_parts(devs.addressable_devices, n) }.to_vec();
        platform.topology = vec![n as u32];
        platform.devices = (0..n)
            .map(|index| DeviceInfo {
                index,
                name: format!(
                    "XLA {} device (PJRT {}.{})",
                    platform.name, version.0, version.1
                ),
                kind: format!("xla-{}", platform.name),
                hbm_capacity: super::host::DEFAULT_HBM_BYTES,
                tensor_cores: 1,
                sparse_cores: 0,
                coords: vec![index as u32],
                host_chip: index as u32,
            })
            .collect();
        if let Some(layout) = &slice {
            if layout.chips.len() != n {
                return Err(Error::Unavailable(format!(
                    "PJRT plugin {shown} made {n} devices but the slice shows this process {} chips",
                    layout.chips.len()
                )));
            }
            for (d, c) in platform.devices.iter_mut().zip(&layout.chips) {
                d.coords = c.coords.clone();
                d.host_chip = c.host_chip;
            }
            platform.topology = layout.topology.clone();
        }
        platform.slice = slice;
        Ok(Arc::new_cyclic(|me| {
            platform.me = me.clone();
            platform
        }))
    }

    pub fn plugin(&self) -> &Path {
        &self.plugin
    }

    /// The plugin's platform as its client names it: `cpu`, `cuda`, `tpu`.
    pub fn plugin_platform(&self) -> &str {
        &self.name
    }

    /// Counts of inputs read in place and of copies made, since load.
    /// How many memory mappings the process may hold before the compile
    /// cache is asked to let programs go (see `mappings`); 0 never asks.
    /// The default is half of `vm.max_map_count`.
    pub fn set_mapping_budget(&self, mappings: usize) {
        self.mappings.set_budget(mappings);
    }

    pub fn transfer_stats(&self) -> TransferStats {
        use std::sync::atomic::Ordering::Relaxed;
        let c = &self.transfers;
        TransferStats {
            input_views: c.input_views.load(Relaxed),
            views_created: c.views_created.load(Relaxed),
            staged_inputs: c.staged_inputs.load(Relaxed),
            staged_input_bytes: c.staged_input_bytes.load(Relaxed),
            in_place_outputs: c.in_place_outputs.load(Relaxed),
            direct_outputs: c.direct_outputs.load(Relaxed),
            plugin_reads: c.plugin_reads.load(Relaxed),
            staged_outputs: c.staged_outputs.load(Relaxed),
            resident_inputs: c.resident_inputs.load(Relaxed),
            resident_outputs: c.resident_outputs.load(Relaxed),
            copies_back: c.copies_back.load(Relaxed),
            relayouts: c.relayouts.load(Relaxed),
        }
    }

    pub fn api_version(&self) -> (i32, i32) {
        self.version
    }

    /// Call one PJRT function (by its offset in the table), turning a
    /// PJRT_Error into ours.
    fn call(
        &self,
        what: &str,
        offset: usize,
        f: impl FnOnce(&sys::PJRT_Api) -> Option<*mut sys::PJRT_Error>,
    ) -> Result<()> {
        // SAFETY: api points to the plugin's static table (checked non-null at load).
        let api = unsafe { &*self.api };
        if offset + std::mem::size_of::<usize>() > api.struct_size {
            return Err(Error::Unimplemented(format!(
                "PJRT plugin {}: {what} is beyond its API table (version {}.{})",
                self.plugin.display(),
                self.version.0,
                self.version.1
            )));
        }
        match f(api) {
            None => Err(Error::Unimplemented(format!(
                "PJRT plugin {}: {what} is not provided",
                self.plugin.display()
            ))),
            Some(e) if e.is_null() => Ok(()),
            Some(e) => Err(Error::Unavailable(format!(
                "PJRT plugin {}: {what}: {}",
                self.plugin.display(),
                self.take_error(e)
            ))),
        }
    }

    /// The error's message; the error is destroyed.
    fn take_error(&self, e: *mut sys::PJRT_Error) -> String {
        // SAFETY: the table is valid; these two functions are at the start of
        // every PJRT_Api; `e` is an error the plugin just returned.
        unsafe {
            let api = &*self.api;
            let mut m = args!(PJRT_Error_Message_Args { error: e });
            let text = match api.PJRT_Error_Message {
                Some(f) => {
                    f(&mut m);
                    bytes_to_string(m.message, m.message_size)
                }
                None => "(no message)".to_string(),
            };
            if let Some(f) = api.PJRT_Error_Destroy {
                let mut d = args!(PJRT_Error_Destroy_Args { error: e });
                f(&mut d);
            }
            text
        }
    }
}

impl XlaPlatform {
    /// Compile a StableHLO module with full options, its operations
    /// located nowhere (`lower::without_locations`: smaller executables,
    /// faster to load from the disk cache). When that fails, the module as
    /// written is compiled: its error's locations name lines of the text
    /// the error carries. (Should the written module compile where the
    /// bare one did not, that one runs; the crate's tests, which compile
    /// every op, fail then instead.)
    fn compile_text(&self, text: &str) -> Result<*mut sys::PJRT_LoadedExecutable> {
        self.compile_located(&lower::without_locations(text), text)
            .or_else(|bare| {
                let written = self.compile_located(text, text);
                assert!(
                    !cfg!(test) || written.is_err(),
                    "the module compiled only with its locations: {bare}"
                );
                written
            })
    }

    /// Compile `code`; a failure's message carries `text`.
    fn compile_located(&self, code: &str, text: &str) -> Result<*mut sys::PJRT_LoadedExecutable> {
        let mut code = code.as_bytes().to_vec();
        let format = "mlir";
        let program = sys::PJRT_Program {
            struct_size: std::mem::size_of::<sys::PJRT_Program>(),
            code: code.as_mut_ptr() as *mut std::os::raw::c_char,
            code_size: code.len(),
            format: format.as_ptr() as *const std::os::raw::c_char,
            format_size: format.len(),
            ..Default::default()
        };
        // Full build options (empty ones abort the plugin, ANCHORS) and the
        // debug options every program gets (`options.rs`).
        let options = options::compile_options_proto(&options::in_force());
        let mut args = args!(PJRT_Client_Compile_Args {
            client: self.client,
            program: &program,
            compile_options: options.as_ptr() as *const std::os::raw::c_char,
            compile_options_size: options.len(),
        });
        self.call(
            "PJRT_Client_Compile",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Client_Compile),
            |api| {
                // SAFETY: `program`, `code` and `options` outlive the call.
                unsafe { api.PJRT_Client_Compile.map(|f| f(&mut args)) }
            },
        )
        .map_err(|e| match e {
            Error::Unavailable(m) => Error::Internal(format!("{m}\n{text}")),
            other => other,
        })?;
        Ok(args.executable)
    }

    /// `graph` compiled as a plain module (no aliased outputs) with its
    /// inputs uploaded once: a program run straight through PJRT, with no
    /// runtime around it, as the launch-cost benchmark's peer.
    pub fn bare_program(
        self: &Arc<Self>,
        graph: &Graph,
        inputs: &[crate::platform::host::kernels::HostTensor],
    ) -> Result<BareProgram> {
        let (text, _) = lower::lower_with_checks(graph)?;
        let device = *self
            .device_ptrs
            .first()
            .ok_or_else(|| Error::Internal("no xla device".into()))?;
        let mut bare = BareProgram {
            platform: Arc::clone(self),
            exe: self.compile_text(&text)?,
            inputs: Vec::new(),
            outputs: graph.outputs().len(),
        };
        for h in inputs {
            let dims: Vec<i64> = h.dims().iter().map(|&d| d as i64).collect();
            // SAFETY: `h` holds the dense elements and outlives the call.
            let (buffer, _) = unsafe {
                self.buffer_from_host(h.bytes().as_ptr(), h.dtype(), &dims, &[], false, device)
            }?;
            bare.inputs.push(buffer);
        }
        Ok(bare)
    }
}

/// See [`XlaPlatform::bare_program`].
pub struct BareProgram {
    platform: Arc<XlaPlatform>,
    exe: *mut sys::PJRT_LoadedExecutable,
    inputs: Vec<*mut sys::PJRT_Buffer>,
    outputs: usize,
}

impl BareProgram {
    /// Execute once, wait for the outputs and destroy them.
    pub fn run(&self) -> Result<()> {
        let p = &self.platform;
        let mut outs: SmallVec<[*mut sys::PJRT_Buffer; 8]> =
            smallvec::smallvec![std::ptr::null_mut(); self.outputs];
        let result = p.execute_and_wait(self.exe, &self.inputs, &mut outs);
        for b in outs {
            p.destroy_buffer(b);
        }
        result
    }
}

impl Drop for BareProgram {
    fn drop(&mut self) {
        for b in self.inputs.drain(..) {
            self.platform.destroy_buffer(b);
        }
        self.platform.destroy_executable(self.exe);
    }
}

/// Outputs of at most this many bytes are copied out of a buffer XLA
/// allocates instead of written in place: their program has no aliased
/// parameter for them (see `XlaExecutable::execute`). A 16-float add took
/// 4.9-5.2 us a launch that way against 5.7-6.1 us with an in-place
/// target (`tpurt-bench xla_tiny_add`); copying 4 KiB costs a fraction of
/// that difference.
const COPY_OUT_BYTES: u64 = 4 << 10;

/// Where XLA writes each output of `graph` (`lower::lower_aliased`):
/// above [`COPY_OUT_BYTES`], over the parameter the graph stores it over
/// (`ir::Alias`), else into one more parameter; at most that, into a
/// buffer of its own.
fn output_slots(graph: &Graph) -> Vec<lower::OutputSlot> {
    use lower::OutputSlot;
    (0..graph.outputs().len())
        .map(|i| {
            if graph.value_type(graph.outputs()[i]).nbytes() <= COPY_OUT_BYTES {
                OutputSlot::Own
            } else {
                graph
                    .aliased_param(i)
                    .map_or(OutputSlot::Extra, OutputSlot::Param)
            }
        })
        .collect()
}

/// Bytes of `t`'s elements, dense.
fn tensor_bytes(t: &DeviceTensor) -> u64 {
    t.numel() * t.layout.elem_size
}

/// Where `t`'s bytes lie in host memory: the xla platform's pool segments
/// are host memory. None when the segment is not one, or when the view
/// reaches past it (never for a checked tensor).
fn pool_bytes(t: &DeviceTensor) -> Option<*mut u8> {
    use super::DeviceMemory;
    let seg = host_segment(t)?;
    let (lo, hi) = t.byte_range();
    let base = t.buffer.segment_offset();
    let end = base.checked_add(hi)?;
    if end > seg.len() || hi > t.buffer.len() {
        return None;
    }
    Some(seg.as_ptr().wrapping_add((base + lo) as usize))
}

/// The host memory behind `t`'s segment: the segment itself (a plugin
/// that reads host memory in place), or the pool bytes of a
/// [`resident::DeviceSegment`], current only after its `sync_host` (for
/// reading) or `discard` (for writing) over the bytes.
fn host_segment(t: &DeviceTensor) -> Option<&HostSegment> {
    let any = t.buffer.segment().as_any();
    any.downcast_ref::<HostSegment>().or_else(|| {
        any.downcast_ref::<resident::DeviceSegment>()
            .map(|d| d.host())
    })
}

/// What `t` is as an argument where values may be resident: its buffer,
/// bytes, dtype and dims.
fn resident_array(t: &DeviceTensor) -> resident::Array {
    let (offset, len) = segment_range(t);
    resident::Array {
        owner: t.buffer.identity(),
        offset,
        len,
        dtype: t.dtype,
        dims: t.dims().iter().map(|&d| d as i64).collect(),
    }
}

/// `t`'s segment when values may be resident in the plugin's buffers.
fn device_segment(t: &DeviceTensor) -> Option<&resident::DeviceSegment> {
    t.buffer
        .segment()
        .as_any()
        .downcast_ref::<resident::DeviceSegment>()
}

/// `t`'s bytes in its segment (from its first to one past its last), for a
/// [`resident::DeviceSegment`].
fn segment_range(t: &DeviceTensor) -> (u64, u64) {
    let (lo, hi) = t.byte_range();
    let base = t.buffer.segment_offset();
    (base + lo, if t.numel() == 0 { 0 } else { hi - lo })
}

/// Whether this machine has TPU device nodes (a TPU VM).
fn tpu_device_present() -> bool {
    let any = |dir: &str, prefix: &str| {
        std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with(prefix))
            })
            .unwrap_or(false)
    };
    any("/dev", "accel") || any("/dev/vfio", "")
}

/// Copy `len` bytes at `ptr` into a String (lossy).
///
/// # Safety
/// `ptr` must point to `len` readable bytes (or be null).
unsafe fn bytes_to_string(ptr: *const std::os::raw::c_char, len: usize) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: the caller's contract.
    let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
    String::from_utf8_lossy(bytes).into_owned()
}

impl Drop for XlaPlatform {
    fn drop(&mut self) {
        if self.client.is_null() {
            return;
        }
        // Every executable holds the platform, so none runs now: each view
        // is the cache's alone, and goes before the client.
        let cache = std::mem::take(self.views.get_mut().unwrap_or_else(|e| e.into_inner()));
        for v in cache.map.into_values().chain(cache.retired) {
            self.destroy_buffer(v.buffer);
        }
        let relayouts = std::mem::take(self.relayouts.get_mut().unwrap_or_else(|e| e.into_inner()));
        for exe in relayouts.into_values().flatten() {
            self.destroy_executable(exe as *mut sys::PJRT_LoadedExecutable);
        }
        let mut d = args!(PJRT_Client_Destroy_Args {
            client: self.client
        });
        let _ = self.call(
            "PJRT_Client_Destroy",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Client_Destroy),
            |api| {
                // SAFETY: the client is ours and destroyed once.
                unsafe { api.PJRT_Client_Destroy.map(|f| f(&mut d)) }
            },
        );
    }
}

impl Platform for XlaPlatform {
    fn name(&self) -> &str {
        "xla"
    }

    fn version(&self) -> String {
        // The plugin's build stands in as its file's size and modification
        // time: a reinstalled or other plugin gives another key, so a
        // serialized executable is only ever loaded by the build that wrote it.
        let stamp = std::fs::metadata(&self.plugin)
            .ok()
            .map(|m| {
                let mtime = m
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos());
                format!("{}-{mtime}", m.len())
            })
            .unwrap_or_default();
        format!(
            "xla-{}-pjrt{}.{}-{}-{stamp}-lowering{}",
            self.name,
            self.version.0,
            self.version.1,
            self.plugin
                .file_name()
                .map_or(String::new(), |f| f.to_string_lossy().into_owned()),
            lower::LOWERING_VERSION
        )
    }

    fn compile_options(&self) -> String {
        self.settings.clone()
    }

    /// On a plugin whose memory is host memory (the CPU plugin), XLA takes
    /// each execution's temporaries from malloc, which maps fresh pages
    /// for a block above glibc's mmap threshold (32 MiB at most) and
    /// faults them in on every execution: the Llama step of `bench/`,
    /// recorded 600 ops at a time, mapped a 118 MiB block per execution
    /// (strace) and took about 35,000 page faults a step. Shorter
    /// recordings keep each program's temporaries below the threshold,
    /// where malloc reuses them. Other plugins allocate device memory.
    fn defer_max_ops(&self) -> usize {
        if self.host_memory {
            HOST_MEMORY_DEFER_MAX_OPS
        } else {
            super::DEFER_MAX_OPS
        }
    }

    fn topology(&self) -> &[u32] {
        &self.topology
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn slice(&self) -> Option<&SliceLayout> {
        self.slice.as_ref()
    }

    fn allocate_segment(&self, chip: usize, bytes: u64) -> Result<Segment> {
        if chip >= self.devices.len() {
            return Err(Error::NotFound(format!(
                "chip {chip} (the xla platform has {})",
                self.devices.len()
            )));
        }
        if self.zero_copy {
            Ok(Arc::new(HostSegment::allocate(bytes)?))
        } else {
            Ok(Arc::new(resident::DeviceSegment::allocate(
                self.me.clone(),
                bytes,
            )?))
        }
    }

    fn compile(&self, graph: &Graph) -> Result<Arc<dyn Executable>> {
        let slots = output_slots(graph);
        let (text, checks) = lower::lower_aliased(graph, &slots)?;
        let me = self
            .me
            .upgrade()
            .ok_or_else(|| Error::Internal("the xla platform is being dropped".into()))?;
        let exe = self.compile_text(&text)?;
        Ok(Arc::new(XlaExecutable::new(
            me,
            exe,
            graph.param_types(),
            graph.output_types(),
            checks,
            slots,
        )))
    }

    fn loaded_code_pressure(&self) -> bool {
        self.mappings.pressed()
    }

    fn load_executable(&self, bytes: &[u8]) -> Result<Arc<dyn Executable>> {
        let (params, outputs, checks, slots, blob) = split_serialized(bytes)?;
        let me = self
            .me
            .upgrade()
            .ok_or_else(|| Error::Internal("the xla platform is being dropped".into()))?;
        let mut args = args!(PJRT_Executable_DeserializeAndLoad_Args {
            client: self.client,
            serialized_executable: blob.as_ptr() as *const std::os::raw::c_char,
            serialized_executable_size: blob.len(),
        });
        self.call(
            "PJRT_Executable_DeserializeAndLoad",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Executable_DeserializeAndLoad),
            |api| {
                // SAFETY: `blob` outlives the call; null overridden options
                // mean the options stored in the blob.
                unsafe { api.PJRT_Executable_DeserializeAndLoad.map(|f| f(&mut args)) }
            },
        )?;
        Ok(Arc::new(XlaExecutable::new(
            me,
            args.loaded_executable,
            params,
            outputs,
            checks,
            slots,
        )))
    }
}

/// Our framing of a PJRT blob: magic, then the JSON of the parameter and
/// result types, the index checks and the output slots (length-prefixed),
/// then the plugin's bytes. (Version 1 had no checks, version 2 no
/// aliased output parameters, version 3 one for every output and no
/// slots: such files are refused, and the cache rebuilds them.)
const SERIALIZED_MAGIC: &[u8] = b"TPURT-XLA-EXE-4\n";

type Types = Vec<crate::ir::TensorType>;
type Checks = Vec<lower::IndexCheck>;
type Slots = Vec<lower::OutputSlot>;

fn join_serialized(
    params: &[crate::ir::TensorType],
    outputs: &[crate::ir::TensorType],
    checks: &[lower::IndexCheck],
    slots: &[lower::OutputSlot],
    blob: &[u8],
) -> Vec<u8> {
    let types = serde_json::to_vec(&(params, outputs, checks, slots)).unwrap_or_default();
    let mut out = Vec::with_capacity(SERIALIZED_MAGIC.len() + 8 + types.len() + blob.len());
    out.extend_from_slice(SERIALIZED_MAGIC);
    out.extend_from_slice(&(types.len() as u64).to_le_bytes());
    out.extend_from_slice(&types);
    out.extend_from_slice(blob);
    out
}

fn split_serialized(bytes: &[u8]) -> Result<(Types, Types, Checks, Slots, &[u8])> {
    let bad = |what: &str| Error::invalid(format!("not a serialized xla executable: {what}"));
    let rest = bytes
        .strip_prefix(SERIALIZED_MAGIC)
        .ok_or_else(|| bad("no magic"))?;
    if rest.len() < 8 {
        return Err(bad("truncated header"));
    }
    let n = u64::from_le_bytes(rest[..8].try_into().unwrap_or_default()) as usize;
    let rest = &rest[8..];
    if n > rest.len() {
        return Err(bad("truncated types"));
    }
    let (params, outputs, checks, slots): (Types, Types, Checks, Slots) =
        serde_json::from_slice(&rest[..n]).map_err(|e| bad(&format!("types: {e}")))?;
    if rest.len() == n {
        return Err(bad("no program"));
    }
    let mut taken = vec![false; params.len()];
    let bad_slot = slots.len() != outputs.len()
        || slots.iter().enumerate().any(|(i, s)| match *s {
            // Each parameter is stored over by one output at most, of
            // its type.
            lower::OutputSlot::Param(p) => {
                params.get(p) != outputs.get(i) || std::mem::replace(&mut taken[p], true)
            }
            _ => false,
        });
    if bad_slot {
        return Err(bad("output slots"));
    }
    Ok((params, outputs, checks, slots, &rest[n..]))
}

/// The arguments of one execution, in parameter order, and what to let
/// go of after it: buffers of ours (destroyed), cached views (only
/// released) and the in-place targets' "done with host buffer" events.
#[derive(Default)]
struct ExecArgs {
    args: SmallVec<[*mut sys::PJRT_Buffer; 8]>,
    bufs: SmallVec<[*mut sys::PJRT_Buffer; 8]>,
    views: SmallVec<[Arc<CachedView>; 4]>,
    /// Resident values read as they are (`resident`), held until done.
    resident: SmallVec<[Arc<resident::ResidentBuffer>; 4]>,
    targets: SmallVec<[*mut sys::PJRT_Event; 4]>,
    /// Bytes of the plugin's own buffers among `bufs`.
    plugin_bytes: u64,
}

impl ExecArgs {
    fn own(&mut self, buffer: *mut sys::PJRT_Buffer, bytes: u64) {
        self.bufs.push(buffer);
        self.args.push(buffer);
        self.plugin_bytes += bytes;
    }

    fn view(&mut self, view: Arc<CachedView>) {
        self.args.push(view.buffer);
        self.views.push(view);
    }

    fn resident(&mut self, value: Arc<resident::ResidentBuffer>) {
        self.args.push(value.buffer());
        self.resident.push(value);
    }

    /// A donated argument (`XlaPlatform::donated`) of `bytes`; true when
    /// it is an in-place target (pool bytes, not the plugin's).
    fn donated(
        &mut self,
        (buffer, done): (*mut sys::PJRT_Buffer, Option<*mut sys::PJRT_Event>),
        bytes: u64,
    ) -> bool {
        self.own(buffer, if done.is_some() { 0 } else { bytes });
        self.targets.extend(done);
        done.is_some()
    }
}

/// Whether nothing an execution reads or writes overlaps output `i` but
/// the output itself and input `k`, when given (the one it is stored over).
fn nothing_else_overlaps(
    inputs: &[DeviceTensor],
    outputs: &[DeviceTensor],
    i: usize,
    k: Option<usize>,
) -> bool {
    let out = &outputs[i];
    !inputs
        .iter()
        .enumerate()
        .any(|(j, x)| Some(j) != k && x.may_overlap(out))
        && !outputs
            .iter()
            .enumerate()
            .any(|(j, o)| j != i && o.may_overlap(out))
}

/// An input's buffer where values live in the plugin's buffers.
enum Relayout {
    /// The resident value itself.
    Same(Arc<resident::ResidentBuffer>),
    /// A buffer made from it on the device (another shape or order), the
    /// execution's to destroy.
    Made(*mut sys::PJRT_Buffer),
}

/// A program compiled by a PJRT plugin.
struct XlaExecutable {
    platform: Arc<XlaPlatform>,
    exe: *mut sys::PJRT_LoadedExecutable,
    params: Vec<crate::ir::TensorType>,
    outputs: Vec<crate::ir::TensorType>,
    /// The index checks, whose i64[2] results follow the outputs.
    checks: Vec<lower::IndexCheck>,
    /// Where XLA writes each output (`output_slots`).
    slots: Vec<lower::OutputSlot>,
    /// For each parameter, the output stored over it, if any (from
    /// `slots`, so an execution need not search them for each input).
    stored_over: Vec<Option<usize>>,
    /// Bytes of the results XLA writes into buffers of its own: outputs
    /// aliased to no argument (`OutputSlot::Own`) and the index checks'.
    own_result_bytes: u64,
    /// Bytes of the temporaries an execution takes (`XlaPlatform::temp_bytes`;
    /// 0 where the plugin does not say).
    temp_bytes: u64,
}

impl XlaExecutable {
    fn new(
        platform: Arc<XlaPlatform>,
        exe: *mut sys::PJRT_LoadedExecutable,
        params: Vec<crate::ir::TensorType>,
        outputs: Vec<crate::ir::TensorType>,
        checks: Vec<lower::IndexCheck>,
        slots: Vec<lower::OutputSlot>,
    ) -> XlaExecutable {
        let own_result_bytes = outputs
            .iter()
            .zip(&slots)
            .filter(|(_, s)| **s == lower::OutputSlot::Own)
            .map(|(ty, _)| ty.nbytes())
            .sum::<u64>()
            + CHECK_RESULT_BYTES * checks.len() as u64;
        let temp_bytes = platform.temp_bytes(exe).unwrap_or(0);
        XlaExecutable {
            platform,
            exe,
            temp_bytes,
            stored_over: stored_over(&slots, params.len()),
            params,
            outputs,
            checks,
            slots,
            own_result_bytes,
        }
    }
}

/// An index check's result: two i64.
const CHECK_RESULT_BYTES: u64 = 16;

/// For each of `params` parameters, the output whose slot is that
/// parameter (`OutputSlot::Param`), if any.
fn stored_over(slots: &[lower::OutputSlot], params: usize) -> Vec<Option<usize>> {
    let mut over = vec![None; params];
    for (i, s) in slots.iter().enumerate() {
        if let lower::OutputSlot::Param(p) = *s {
            if let Some(o) = over.get_mut(p) {
                *o = Some(i);
            }
        }
    }
    over
}

// SAFETY: PJRT executables may be executed from any thread (PJRT C API).
unsafe impl Send for XlaExecutable {}
// SAFETY: as above.
unsafe impl Sync for XlaExecutable {}

fn buffer_type(d: crate::ir::DType) -> sys::PJRT_Buffer_Type {
    use crate::ir::DType::*;
    match d {
        Bool => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_PRED,
        U8 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_U8,
        I8 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S8,
        I32 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S32,
        I64 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S64,
        F16 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F16,
        BF16 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_BF16,
        F32 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F32,
        F64 => sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F64,
    }
}

impl XlaPlatform {
    /// Copy an execution's output buffer, once the execution is done, into
    /// the `len` bytes at `dst` (its size exactly) and wait for it; `what`
    /// names the copy in errors. On a plugin whose buffers are host memory
    /// the bytes are copied straight from the buffer's address, which
    /// skips the plugin's copy (`PJRT_Buffer_ToHostBuffer`) and its event:
    /// a tiny in-place add through the binding took 7.7-12.0 us with it
    /// and 6.9-8.7 us without (with small outputs copied out as well; in
    /// one experiment, tiny outputs in donated scratch buffers took 46-60
    /// us a launch through the plugin's copy and 5.7-6.3 us without).
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes until this returns,
    /// and `src` must be defined: the execution that makes it awaited.
    unsafe fn to_host(
        &self,
        src: *mut sys::PJRT_Buffer,
        dst: *mut u8,
        len: usize,
        what: &str,
    ) -> Result<()> {
        if self.zero_copy && self.on_device_size(src) == Some(len) {
            if let Some(at) = self.address_of(src).filter(|&a| a != 0) {
                // SAFETY: the plugin's buffers are host memory (zero_copy),
                // this one holds `len` bytes at `at` (its size on the
                // device, dense, as the CPU plugin lays out every array),
                // and it is defined and alive (the caller's contract);
                // `dst` takes `len` bytes and is not plugin memory.
                unsafe { std::ptr::copy_nonoverlapping(at as *const u8, dst, len) };
                return Ok(());
            }
        }
        self.transfers
            .plugin_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut a = args!(PJRT_Buffer_ToHostBuffer_Args {
            src: src,
            dst: dst as *mut std::ffi::c_void,
            dst_size: len,
        });
        self.call(
            "PJRT_Buffer_ToHostBuffer",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Buffer_ToHostBuffer),
            |api| {
                // SAFETY: dst holds dst_size bytes until the event completes
                // (awaited below), as the caller promised.
                unsafe { api.PJRT_Buffer_ToHostBuffer.map(|f| f(&mut a)) }
            },
        )?;
        self.await_event(a.event, &format!("PJRT_Event_Await ({what})"))
    }

    /// Wait until `buffer` (an execution's output) is ready.
    fn await_ready(&self, buffer: *mut sys::PJRT_Buffer) -> Result<()> {
        if buffer.is_null() {
            return Ok(());
        }
        let mut a = args!(PJRT_Buffer_ReadyEvent_Args { buffer: buffer });
        self.call(
            "PJRT_Buffer_ReadyEvent",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Buffer_ReadyEvent),
            |api| {
                // SAFETY: a live output buffer of ours.
                unsafe { api.PJRT_Buffer_ReadyEvent.map(|f| f(&mut a)) }
            },
        )?;
        self.await_event(a.event, "PJRT_Event_Await (output ready)")
    }

    /// `t`'s pool bytes, where XLA may use them in place (a view of an
    /// input, a zero-copy target for an output): the plugin addresses host
    /// memory, and `t` is contiguous, non-empty and 64-byte aligned (the
    /// plugin refuses a misaligned view and silently copies a misaligned
    /// zero-copy buffer).
    fn shareable_bytes(&self, t: &DeviceTensor) -> Option<*mut u8> {
        if !self.zero_copy || !t.is_contiguous() || t.numel() == 0 {
            return None;
        }
        pool_bytes(t).filter(|&ptr| (ptr as usize).is_multiple_of(VIEW_ALIGN))
    }

    /// A view of `t`'s bytes in the pool as a PJRT buffer on `device`, when
    /// the plugin addresses host memory and `t` is contiguous, non-empty
    /// and 64-byte aligned; None otherwise.
    ///
    /// Views are kept in [`ViewCache`]: the one for the same bytes, type
    /// and dims is reused.
    fn view_of(
        &self,
        t: &DeviceTensor,
        device: *mut sys::PJRT_Device,
    ) -> Result<Option<Arc<CachedView>>> {
        let view = self.cached_view(t, device)?;
        if view.is_some() {
            self.transfers
                .input_views
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(view)
    }

    /// [`Self::view_of`] without counting an input view.
    fn cached_view(
        &self,
        t: &DeviceTensor,
        device: *mut sys::PJRT_Device,
    ) -> Result<Option<Arc<CachedView>>> {
        let Some(ptr) = self.shareable_bytes(t) else {
            return Ok(None);
        };
        let segment = t.buffer.segment();
        let key = ViewKey {
            address: ptr as usize,
            dtype: t.dtype,
            dims: t.dims().iter().map(|&d| d as i64).collect(),
            device: device as usize,
        };
        let mut cache = self.views.lock().unwrap_or_else(|e| e.into_inner());
        if cache.uses >= cache.max_uses {
            cache.start_over();
        }
        cache.uses += 1;
        if let Some(v) = cache.map.get(&key) {
            if std::ptr::addr_eq(v.segment.as_ptr(), Arc::as_ptr(segment)) {
                return Ok(Some(Arc::clone(v)));
            }
        }
        let buffer = self.make_view(ptr, t.dtype, &key.dims, device)?;
        let view = Arc::new(CachedView {
            buffer,
            segment: Arc::downgrade(segment),
        });
        if cache.map.len() >= cache.cap {
            cache.start_over();
        }
        if let Some(old) = cache.map.insert(key, Arc::clone(&view)) {
            cache.retired.push(old);
        }
        self.destroy_unused(&mut cache.retired);
        Ok(Some(view))
    }

    /// Destroy the views in `retired` that no execution holds any more.
    fn destroy_unused(&self, retired: &mut Vec<Arc<CachedView>>) {
        retired.retain(|v| {
            // Only the cache hands out clones, under its lock, and not of
            // a retired view: a count of one cannot rise again.
            let unused = Arc::strong_count(v) == 1;
            if unused {
                self.destroy_buffer(v.buffer);
            }
            !unused
        });
    }

    /// `PJRT_Client_CreateViewOfDeviceBuffer` over the bytes at `ptr`.
    fn make_view(
        &self,
        ptr: *mut u8,
        dtype: crate::ir::DType,
        dims: &[i64],
        device: *mut sys::PJRT_Device,
    ) -> Result<*mut sys::PJRT_Buffer> {
        let mut a = args!(PJRT_Client_CreateViewOfDeviceBuffer_Args {
            client: self.client,
            device_buffer_ptr: ptr as *mut std::ffi::c_void,
            dims: dims.as_ptr(),
            num_dims: dims.len(),
            element_type: buffer_type(dtype),
            device: device,
            on_delete_callback: Some(view_released),
        });
        self.call(
            "PJRT_Client_CreateViewOfDeviceBuffer",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Client_CreateViewOfDeviceBuffer),
            |api| {
                // SAFETY: ptr addresses the tensor's bytes in a live pool
                // segment; the view is only read by executions whose task
                // holds a buffer over those bytes, and it is never found
                // again once the segment is gone (see `CachedView`); dims
                // outlive the call; the callback is a valid no-op.
                unsafe { api.PJRT_Client_CreateViewOfDeviceBuffer.map(|f| f(&mut a)) }
            },
        )?;
        self.transfers
            .views_created
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(a.buffer)
    }

    /// `PJRT_Client_BufferFromHostBuffer` of `dims` elements of `dtype` at
    /// `data` (dense, or by `byte_strides` when there are any), on
    /// `device`. A copy (`zero_copy` false) is complete when this returns;
    /// a zero-copy buffer uses `data` in place, and the event returned
    /// with it fires once the plugin lets go of the bytes (null for a
    /// copy).
    ///
    /// # Safety
    /// `data` must address every element `dims` and `byte_strides` reach,
    /// valid until this returns for a copy, and until the returned event
    /// fires for a zero-copy buffer.
    unsafe fn buffer_from_host(
        &self,
        data: *const u8,
        dtype: crate::ir::DType,
        dims: &[i64],
        byte_strides: &[i64],
        zero_copy: bool,
        device: *mut sys::PJRT_Device,
    ) -> Result<(*mut sys::PJRT_Buffer, *mut sys::PJRT_Event)> {
        let mut a = args!(PJRT_Client_BufferFromHostBuffer_Args {
            client: self.client,
            data: data as *const std::ffi::c_void,
            type_: buffer_type(dtype),
            dims: dims.as_ptr(),
            num_dims: dims.len(),
            byte_strides: if byte_strides.is_empty() {
                std::ptr::null()
            } else {
                byte_strides.as_ptr()
            },
            num_byte_strides: byte_strides.len(),
            host_buffer_semantics: if zero_copy {
                sys::PJRT_HostBufferSemantics_PJRT_HostBufferSemantics_kMutableZeroCopy
            } else {
                sys::PJRT_HostBufferSemantics_PJRT_HostBufferSemantics_kImmutableOnlyDuringCall
            },
            device: device,
        });
        self.call(
            "PJRT_Client_BufferFromHostBuffer",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Client_BufferFromHostBuffer),
            |api| {
                // SAFETY: the caller vouches for `data` (see above); dims
                // and strides outlive the call.
                unsafe { api.PJRT_Client_BufferFromHostBuffer.map(|f| f(&mut a)) }
            },
        )?;
        if zero_copy {
            return Ok((a.buffer, a.done_with_host_buffer));
        }
        if let Err(e) = self.await_event(a.done_with_host_buffer, "PJRT_Event_Await (input copy)") {
            self.destroy_buffer(a.buffer);
            return Err(e);
        }
        Ok((a.buffer, std::ptr::null_mut()))
    }

    /// A plugin-owned copy of `t` on `device`. The plugin copies straight
    /// from the pool, gathering a strided view by its byte strides (one
    /// copy); a view with broadcast (zero) strides is gathered on the host
    /// first.
    fn stage(
        &self,
        t: &DeviceTensor,
        device: *mut sys::PJRT_Device,
    ) -> Result<*mut sys::PJRT_Buffer> {
        use crate::platform::host::executable::read_tensor;
        let dims: SmallVec<[i64; 6]> = t.dims().iter().map(|&d| d as i64).collect();
        let es = t.layout.elem_size;
        let strided = t.numel() > 0
            && t.layout
                .sizes
                .iter()
                .zip(&t.layout.strides)
                .all(|(&n, &s)| n <= 1 || s > 0);
        if let Some(d) = device_segment(t) {
            let (at, len) = segment_range(t);
            d.sync_host(at, len)?;
        }
        let in_pool = if strided { pool_bytes(t) } else { None };
        let gathered;
        let (data, strides, bytes): (*const u8, SmallVec<[i64; 6]>, u64) = match in_pool {
            Some(ptr) => {
                // A size-1 dimension's stride is never stepped; give it a
                // dense one so the plugin's checks see a valid layout.
                let strides = t
                    .layout
                    .sizes
                    .iter()
                    .zip(&t.layout.strides)
                    .map(|(&n, &s)| (if n <= 1 && s == 0 { 1 } else { s } * es) as i64)
                    .collect();
                (ptr as *const u8, strides, tensor_bytes(t))
            }
            None => {
                gathered = read_tensor(t)?;
                let b = gathered.bytes();
                (b.as_ptr(), SmallVec::new(), b.len() as u64)
            }
        };
        // SAFETY: `data` addresses every element the dims and byte strides
        // reach: inside the tensor's live pool segment (see `pool_bytes`),
        // or a gathered copy that outlives the call.
        let (buffer, _) =
            unsafe { self.buffer_from_host(data, t.dtype, &dims, &strides, false, device) }?;
        let c = &self.transfers;
        c.staged_inputs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        c.staged_input_bytes
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        Ok(buffer)
    }

    /// Where values live in the plugin's buffers ([`resident`]), the
    /// buffer holding contiguous, non-empty `t` as an argument: the one
    /// already there, else a copy of the pool's bytes, kept there for the
    /// next execution. None for a strided or empty `t`.
    fn resident_input(
        self: &Arc<Self>,
        d: &resident::DeviceSegment,
        t: &DeviceTensor,
        device: *mut sys::PJRT_Device,
    ) -> Result<Option<Relayout>> {
        use std::sync::atomic::Ordering::Relaxed;
        if t.numel() == 0 {
            return Ok(None);
        }
        let array = resident_array(t);
        let len = array.len;
        if t.is_contiguous() {
            if let Some(b) = d.find(&array) {
                self.transfers.resident_inputs.fetch_add(1, Relaxed);
                return Ok(Some(Relayout::Same(b)));
            }
        }
        // The same bytes as another shape, or in another order (a
        // transposed weight): made on the device from the resident value.
        if let Some((b, from)) = d.find_span(array.offset, len, t.dtype) {
            if let Some(made) = self.relayout(&b, &from, t)? {
                self.transfers.relayouts.fetch_add(1, Relaxed);
                return Ok(Some(Relayout::Made(made)));
            }
        }
        if !t.is_contiguous() {
            return Ok(None);
        }
        let staged = self.stage(t, device)?;
        let value = Arc::new(resident::ResidentBuffer::new(
            self,
            staged,
            len,
            t.buffer.pool_weak(),
        ));
        d.store(&array, Arc::clone(&value), false)?;
        Ok(Some(Relayout::Same(value)))
    }

    /// `t`, whose bytes are exactly those of the resident value `b` (of
    /// `from` dims), as a new buffer made on the device by a program that
    /// reshapes and transposes: where `t` is that value in another shape,
    /// or a permutation of its dims (each dim's stride the product of the
    /// sizes of the dims laid out after it). None for any other view, and
    /// the first time a view is seen (see `relayouts`).
    fn relayout(
        &self,
        b: &resident::ResidentBuffer,
        from: &[i64],
        t: &DeviceTensor,
    ) -> Result<Option<*mut sys::PJRT_Buffer>> {
        use crate::ir::{GraphBuilder, Prim, TensorType};
        let (sizes, strides) = (&t.layout.sizes, &t.layout.strides);
        // The dims in memory order (largest stride first), which must
        // tile the bytes densely; a dim of size 1 may have any stride.
        let mut order: SmallVec<[usize; 6]> = (0..sizes.len()).collect();
        order.sort_by_key(|&i| {
            (
                std::cmp::Reverse(if sizes[i] == 1 { u64::MAX } else { strides[i] }),
                i,
            )
        });
        let mut dense = 1u64;
        for &i in order.iter().rev() {
            if sizes[i] != 1 && strides[i] != dense {
                return Ok(None);
            }
            dense *= sizes[i];
        }
        let key = RelayoutKey {
            dtype: t.dtype,
            from: from.iter().copied().collect(),
            sizes: sizes.iter().copied().collect(),
            strides: strides.iter().copied().collect(),
        };
        let mut programs = self.relayouts.lock().unwrap_or_else(|e| e.into_inner());
        let exe = match programs.get(&key) {
            Some(&Some(exe)) => exe as *mut sys::PJRT_LoadedExecutable,
            // A shape seen once (a growing cache's, a new length's) is
            // copied through the pool, as it costs less than a compile;
            // one seen again (a training step's) gets its program.
            None if programs.len() < MAX_RELAYOUTS => {
                programs.insert(key, None);
                return Ok(None);
            }
            None => return Ok(None),
            Some(None) => {
                let mut g = GraphBuilder::new();
                let from_dims: Vec<u64> = from.iter().map(|&d| d as u64).collect();
                let x = g.param(TensorType::new(t.dtype, &from_dims));
                let laid: Vec<u64> = order.iter().map(|&i| sizes[i]).collect();
                let mut y = g.op(Prim::Reshape { dims: laid }, &[x])?;
                // perm[i]: where dim i of `t` lies in memory order.
                let mut perm = vec![0usize; order.len()];
                for (j, &i) in order.iter().enumerate() {
                    perm[i] = j;
                }
                if perm.iter().enumerate().any(|(i, &p)| i != p) {
                    y = g.op(Prim::Transpose { perm }, &[y])?;
                }
                let graph = g.build(&[y])?;
                let exe = self.compile_text(&lower::lower(&graph)?)?;
                programs.insert(key, Some(exe as usize));
                exe
            }
        };
        drop(programs);
        let mut outs = [std::ptr::null_mut(); 1];
        let done = self.execute_and_wait(exe, &[b.buffer()], &mut outs);
        match done {
            Ok(()) => Ok(Some(outs[0])),
            Err(e) => {
                self.destroy_buffer(outs[0]);
                Err(e)
            }
        }
    }

    /// A zero-copy buffer over `t`'s pool bytes, for XLA to write an
    /// output into in place (donated as that output's aliased argument),
    /// and the event that fires when the plugin lets go of the bytes; None
    /// where the plugin has memory of its own, or `t` is strided, empty or
    /// misaligned (the plugin would silently copy a misaligned one).
    fn zero_copy_target(
        &self,
        t: &DeviceTensor,
        device: *mut sys::PJRT_Device,
    ) -> Result<Option<(*mut sys::PJRT_Buffer, *mut sys::PJRT_Event)>> {
        let Some(ptr) = self.shareable_bytes(t) else {
            return Ok(None);
        };
        let dims: SmallVec<[i64; 6]> = t.dims().iter().map(|&d| d as i64).collect();
        // SAFETY: `ptr` addresses the tensor's bytes in its live pool
        // segment (see `pool_bytes`); the task holds the buffer until the
        // returned event fires, which `execute` awaits after destroying
        // every PJRT buffer over these bytes; no input or other output of
        // the call overlaps them.
        let made = unsafe { self.buffer_from_host(ptr, t.dtype, &dims, &[], true, device) }?;
        Ok(Some(made))
    }

    /// The donated argument of an output's aliased parameter: a zero-copy
    /// target over `out` and its release event when `alone` (nothing else
    /// the execution reads or writes overlaps it) and the plugin allows
    /// one, else `fallback`'s plugin-owned buffer and no event.
    fn donated(
        &self,
        out: &DeviceTensor,
        alone: bool,
        device: *mut sys::PJRT_Device,
        fallback: impl FnOnce() -> Result<*mut sys::PJRT_Buffer>,
    ) -> Result<(*mut sys::PJRT_Buffer, Option<*mut sys::PJRT_Event>)> {
        let target = if alone {
            self.zero_copy_target(out, device)?
        } else {
            None
        };
        match target {
            Some((buf, done)) => Ok((buf, Some(done))),
            None => Ok((fallback()?, None)),
        }
    }

    /// A buffer of the plugin's for an output's aliased argument, whose
    /// contents do not matter (XLA overwrites it).
    fn scratch(
        &self,
        ty: &crate::ir::TensorType,
        device: *mut sys::PJRT_Device,
    ) -> Result<*mut sys::PJRT_Buffer> {
        let dims: SmallVec<[i64; 6]> = ty.dims.iter().map(|&d| d as i64).collect();
        let mut a = args!(PJRT_Client_CreateUninitializedBuffer_Args {
            client: self.client,
            shape_dims: dims.as_ptr(),
            shape_num_dims: dims.len(),
            shape_element_type: buffer_type(ty.dtype),
            device: device,
        });
        let made = self.call(
            "PJRT_Client_CreateUninitializedBuffer",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Client_CreateUninitializedBuffer),
            |api| {
                // SAFETY: dims outlive the call; the plugin owns the buffer.
                unsafe { api.PJRT_Client_CreateUninitializedBuffer.map(|f| f(&mut a)) }
            },
        );
        match made {
            Ok(()) => Ok(a.buffer),
            // A plugin without it: a copy of zeros serves as well.
            Err(Error::Unimplemented(_)) => {
                use crate::platform::host::kernels::HostTensor;
                let zeros = HostTensor::zeros(ty.clone());
                // SAFETY: `zeros` holds the dense elements and outlives the call.
                let (buffer, _) = unsafe {
                    self.buffer_from_host(
                        zeros.bytes().as_ptr(),
                        ty.dtype,
                        &dims,
                        &[],
                        false,
                        device,
                    )
                }?;
                Ok(buffer)
            }
            Err(e) => Err(e),
        }
    }

    /// A buffer's size on its device (`PJRT_Buffer_OnDeviceSizeInBytes`),
    /// if the plugin says.
    fn on_device_size(&self, buffer: *mut sys::PJRT_Buffer) -> Option<usize> {
        let mut a = args!(PJRT_Buffer_OnDeviceSizeInBytes_Args { buffer: buffer });
        self.call(
            "PJRT_Buffer_OnDeviceSizeInBytes",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Buffer_OnDeviceSizeInBytes),
            |api| {
                // SAFETY: a live buffer of ours; the call only reads its size.
                unsafe { api.PJRT_Buffer_OnDeviceSizeInBytes.map(|f| f(&mut a)) }
            },
        )
        .ok()
        .map(|()| a.on_device_size_in_bytes)
    }

    /// Where a buffer's bytes lie (`PJRT_Buffer_UnsafePointer`), if the
    /// plugin says.
    fn address_of(&self, buffer: *mut sys::PJRT_Buffer) -> Option<usize> {
        let mut a = args!(PJRT_Buffer_UnsafePointer_Args { buffer: buffer });
        self.call(
            "PJRT_Buffer_UnsafePointer",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Buffer_UnsafePointer),
            |api| {
                // SAFETY: a live buffer of ours; the call only reads its address.
                unsafe { api.PJRT_Buffer_UnsafePointer.map(|f| f(&mut a)) }
            },
        )
        .ok()
        .map(|()| a.buffer_pointer)
    }

    /// Copy an execution's output into `t`: straight into the pool when
    /// `t` is contiguous, else through a host tensor.
    fn write_output(
        &self,
        src: *mut sys::PJRT_Buffer,
        ty: &crate::ir::TensorType,
        t: &DeviceTensor,
    ) -> Result<()> {
        use crate::platform::host::executable::write_tensor;
        use crate::platform::host::kernels::HostTensor;
        use std::sync::atomic::Ordering::Relaxed;
        let bytes = ty.nbytes() as usize;
        if t.is_contiguous() && bytes > 0 {
            if let Some(ptr) = pool_bytes(t) {
                if let Some(d) = device_segment(t) {
                    let (at, len) = segment_range(t);
                    d.discard(at, len)?;
                }
                self.transfers.direct_outputs.fetch_add(1, Relaxed);
                // SAFETY: `pool_bytes` bounds the tensor's `bytes` bytes
                // inside its live segment; the stream orders this task's
                // writes there before any later reader.
                return unsafe { self.to_host(src, ptr, bytes, "output copy") };
            }
        }
        self.transfers.staged_outputs.fetch_add(1, Relaxed);
        let mut host = HostTensor::zeros(ty.clone());
        let dst = host.bytes_mut();
        // SAFETY: `dst` is a live slice of exactly its length.
        unsafe { self.to_host(src, dst.as_mut_ptr(), dst.len(), "output copy") }?;
        write_tensor(&host, t)
    }

    /// Wait for a PJRT event, then destroy it.
    fn await_event(&self, event: *mut sys::PJRT_Event, what: &str) -> Result<()> {
        if event.is_null() {
            return Ok(());
        }
        let mut a = args!(PJRT_Event_Await_Args { event: event });
        let r = self.call(
            what,
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Event_Await),
            |api| {
                // SAFETY: the event came from the plugin and is awaited once.
                unsafe { api.PJRT_Event_Await.map(|f| f(&mut a)) }
            },
        );
        let mut d = args!(PJRT_Event_Destroy_Args { event: event });
        let _ = self.call(
            "PJRT_Event_Destroy",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Event_Destroy),
            |api| {
                // SAFETY: destroyed once, after the wait.
                unsafe { api.PJRT_Event_Destroy.map(|f| f(&mut d)) }
            },
        );
        r
    }

    /// Execute `exe` on `args` into `outs` (room for every result), then
    /// wait for every output, whatever failed: arguments that are views or
    /// in-place targets must outlive the execution. The first error wins.
    fn execute_and_wait(
        &self,
        exe: *mut sys::PJRT_LoadedExecutable,
        args: &[*mut sys::PJRT_Buffer],
        outs: &mut [*mut sys::PJRT_Buffer],
    ) -> Result<()> {
        let arg_list: *const *mut sys::PJRT_Buffer = args.as_ptr();
        let out_list: *mut *mut sys::PJRT_Buffer = outs.as_mut_ptr();
        // Every argument whose parameter is aliased is donated. (Denying
        // one its donation, `non_donatable_input_indices`, is not used:
        // with the CPU plugin of ../shared/ANCHORS.md, every aliased
        // argument after a denied one lost its donation too, and XLA
        // copied it into a buffer of its own.)
        let mut opts = sys::PJRT_ExecuteOptions {
            struct_size: std::mem::size_of::<sys::PJRT_ExecuteOptions>(),
            ..Default::default()
        };
        // The execution's own completion event: one wait, where waiting
        // for each output costs three calls an output.
        let mut done: *mut sys::PJRT_Event = std::ptr::null_mut();
        let mut x = args!(PJRT_LoadedExecutable_Execute_Args {
            executable: exe,
            options: &mut opts,
            argument_lists: &arg_list,
            num_devices: 1,
            num_args: args.len(),
            output_lists: &out_list,
            device_complete_events: &mut done,
        });
        let mut result = self.call(
            "PJRT_LoadedExecutable_Execute",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_LoadedExecutable_Execute),
            |api| {
                // SAFETY: the lists point to `args.len()` arguments and to
                // room for every result (the caller sized `outs`); `done`
                // has room for the one device's event.
                unsafe { api.PJRT_LoadedExecutable_Execute.map(|f| f(&mut x)) }
            },
        );
        if !done.is_null() {
            let finished = self.await_event(done, "PJRT_Event_Await (execution done)");
            if result.is_ok() {
                result = finished;
            }
            // Done means every output is defined; a failed execution
            // reports here, and its outputs are awaited below for it.
            if result.is_ok() {
                return result;
            }
        }
        // A plugin that gives no completion event, or a failure: wait for
        // each output, so nothing still runs when the caller lets go.
        for b in outs.iter() {
            let ready = self.await_ready(*b);
            if result.is_ok() {
                result = ready;
            }
        }
        result
    }

    /// `f` of the compiled executable behind `loaded`
    /// (`PJRT_LoadedExecutable_GetExecutable`), destroyed after; None
    /// where the plugin does not give it.
    fn with_executable<T>(
        &self,
        loaded: *mut sys::PJRT_LoadedExecutable,
        f: impl FnOnce(*mut sys::PJRT_Executable) -> Option<T>,
    ) -> Option<T> {
        let mut g = args!(PJRT_LoadedExecutable_GetExecutable_Args {
            loaded_executable: loaded
        });
        self.call(
            "PJRT_LoadedExecutable_GetExecutable",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_LoadedExecutable_GetExecutable),
            |api| {
                // SAFETY: a live loaded executable of ours; the result is
                // destroyed below.
                unsafe { api.PJRT_LoadedExecutable_GetExecutable.map(|f| f(&mut g)) }
            },
        )
        .ok()?;
        let out = f(g.executable);
        let mut d = args!(PJRT_Executable_Destroy_Args {
            executable: g.executable
        });
        let _ = self.call(
            "PJRT_Executable_Destroy",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Executable_Destroy),
            |api| {
                // SAFETY: the executable GetExecutable gave us, destroyed once.
                unsafe { api.PJRT_Executable_Destroy.map(|f| f(&mut d)) }
            },
        );
        out
    }

    /// The bytes of temporaries an execution of `loaded` takes on the
    /// device (`PJRT_Executable_GetCompiledMemoryStats`), if the plugin
    /// says.
    fn temp_bytes(&self, loaded: *mut sys::PJRT_LoadedExecutable) -> Option<u64> {
        self.with_executable(loaded, |exe| {
            let mut a = args!(PJRT_Executable_GetCompiledMemoryStats_Args { executable: exe });
            self.call(
                "PJRT_Executable_GetCompiledMemoryStats",
                std::mem::offset_of!(sys::PJRT_Api, PJRT_Executable_GetCompiledMemoryStats),
                |api| {
                    // SAFETY: a live executable; the call only fills `a`.
                    unsafe {
                        api.PJRT_Executable_GetCompiledMemoryStats
                            .map(|f| f(&mut a))
                    }
                },
            )
            .ok()?;
            Some(a.temp_size_in_bytes.max(0) as u64)
        })
    }

    fn destroy_executable(&self, exe: *mut sys::PJRT_LoadedExecutable) {
        let mut d = args!(PJRT_LoadedExecutable_Destroy_Args { executable: exe });
        let _ = self.call(
            "PJRT_LoadedExecutable_Destroy",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_LoadedExecutable_Destroy),
            |api| {
                // SAFETY: an executable of ours, destroyed once.
                unsafe { api.PJRT_LoadedExecutable_Destroy.map(|f| f(&mut d)) }
            },
        );
    }

    fn destroy_buffer(&self, buffer: *mut sys::PJRT_Buffer) {
        if buffer.is_null() {
            return;
        }
        let mut d = args!(PJRT_Buffer_Destroy_Args { buffer: buffer });
        let _ = self.call(
            "PJRT_Buffer_Destroy",
            std::mem::offset_of!(sys::PJRT_Api, PJRT_Buffer_Destroy),
            |api| {
                // SAFETY: a buffer of ours, destroyed once.
                unsafe { api.PJRT_Buffer_Destroy.map(|f| f(&mut d)) }
            },
        );
    }
}

impl Executable for XlaExecutable {
    fn param_types(&self) -> &[crate::ir::TensorType] {
        &self.params
    }

    fn output_types(&self) -> &[crate::ir::TensorType] {
        &self.outputs
    }

    fn execute(&self, inputs: &[DeviceTensor], outputs: &[DeviceTensor]) -> Result<()> {
        crate::platform::check_io("xla executable", self, inputs, outputs)?;
        let p = &self.platform;
        let device = *p
            .device_ptrs
            .first()
            .ok_or_else(|| Error::Internal("no xla device".into()))?;
        let mut a = ExecArgs::default();
        // Which outputs have an in-place target.
        let mut in_place: SmallVec<[bool; 4]> = smallvec::smallvec![false; outputs.len()];
        let mut held = None;
        let result = (|| -> Result<()> {
            // Inputs: read in place through a view where the plugin allows
            // it, else copied into a plugin-owned buffer. An input that an
            // output overwrites may be a view too: XLA writes every output
            // into a buffer of its own (a result never aliases an argument
            // that was not donated), and outputs are copied into the pool
            // only once the whole execution is done (awaited below).
            //
            // An input an output is stored over (`OutputSlot::Param`) is
            // donated: where the output is that very tensor and no other
            // input or output overlaps it, a zero-copy buffer over its
            // bytes, which XLA reads and then writes the output into (it
            // orders the two, as for any aliased parameter); elsewhere a
            // plugin-owned copy of the input, whose result is copied out.
            //
            // Where values live in the plugin's buffers ([`resident`]), an
            // input's buffer there is the argument; the one of an input an
            // output is stored over is taken out and donated (the output
            // replaces it), copied back first when the program has index
            // checks, so a failed op leaves the tensor as it was.
            for (k, t) in inputs.iter().enumerate() {
                if let Some(i) = self.stored_over[k] {
                    let out = &outputs[i];
                    let alone = out.buffer.same_buffer(&t.buffer)
                        && out.layout == t.layout
                        && out.dtype == t.dtype
                        && nothing_else_overlaps(inputs, outputs, i, Some(k));
                    if let Some(d) =
                        device_segment(t).filter(|_| alone && t.is_contiguous() && t.numel() > 0)
                    {
                        let array = resident_array(t);
                        let len = array.len;
                        if let Some(b) = d.take(&array, !self.checks.is_empty())? {
                            p.transfers
                                .resident_inputs
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            a.own(b, len);
                            continue;
                        }
                    }
                    in_place[i] = a.donated(
                        p.donated(out, alone, device, || p.stage(t, device))?,
                        tensor_bytes(t),
                    );
                    continue;
                }
                if let Some(d) = device_segment(t) {
                    match p.resident_input(d, t, device)? {
                        Some(Relayout::Same(value)) => {
                            a.resident(value);
                            continue;
                        }
                        Some(Relayout::Made(buffer)) => {
                            a.own(buffer, tensor_bytes(t));
                            continue;
                        }
                        None => {}
                    }
                }
                match p.view_of(t, device)? {
                    Some(view) => a.view(view),
                    None => a.own(p.stage(t, device)?, tensor_bytes(t)),
                }
            }
            // Outputs above `COPY_OUT_BYTES` that are stored over no input
            // have one more parameter, aliased (`OutputSlot::Extra`).
            // Where XLA may write the output in place, its argument is a
            // zero-copy buffer over its pool bytes, donated; elsewhere a
            // buffer of the plugin's, copied out after. XLA writes a small
            // output into a buffer of its own, copied out too (a donated
            // target costs more than the copy: making it, destroying it,
            // and awaiting and destroying its release event).
            for (i, (t, ty)) in outputs.iter().zip(&self.outputs).enumerate() {
                if self.slots[i] != lower::OutputSlot::Extra {
                    continue;
                }
                let alone = nothing_else_overlaps(inputs, outputs, i, None);
                in_place[i] = a.donated(
                    p.donated(t, alone, device, || p.scratch(ty, device))?,
                    ty.nbytes(),
                );
            }
            // The plugin's own buffers count in the chip's pool statistics
            // (`plugin_bytes`) until they are destroyed: the copies and
            // scratch made above, and the results and temporaries of the
            // execution about to run.
            if let Some(t) = outputs.first().or(inputs.first()) {
                held =
                    Some(t.buffer.pool().hold_plugin_bytes(
                        a.plugin_bytes + self.own_result_bytes + self.temp_bytes,
                    ));
            }
            let mut outs: SmallVec<[*mut sys::PJRT_Buffer; 8]> =
                smallvec::smallvec![std::ptr::null_mut(); self.outputs.len() + self.checks.len()];
            // Views and in-place targets must outlive the execution that
            // uses them, and no output may be copied into the pool while
            // XLA still reads a view: `execute_and_wait` waits for every
            // output, whatever fails.
            let mut result = p.execute_and_wait(self.exe, &a.args, &mut outs);
            // The index checks first: a bad index fails the op before any
            // output is written (as on the host platform).
            let n_out = self.outputs.len();
            for (c, b) in self.checks.iter().zip(&outs[n_out..]) {
                if result.is_ok() {
                    let mut found = [0u8; 16];
                    // SAFETY: `found` is a live array of exactly this length.
                    result =
                        unsafe { p.to_host(*b, found.as_mut_ptr(), found.len(), "index check") };
                    if result.is_ok() {
                        let v = |k: usize| {
                            i64::from_le_bytes(
                                found[k * 8..k * 8 + 8].try_into().unwrap_or_default(),
                            )
                        };
                        if let Some(e) = c.error([v(0), v(1)]) {
                            result = Err(e);
                        }
                    }
                }
                p.destroy_buffer(*b);
            }
            for (i, ((b, t), ty)) in outs[..n_out]
                .iter_mut()
                .zip(outputs)
                .zip(&self.outputs)
                .enumerate()
            {
                if result.is_ok() {
                    // XLA may decline an alias (it does for a donated
                    // view): then the result is in a buffer of its own
                    // and is copied in like any other.
                    let written = in_place[i]
                        && pool_bytes(t).is_some_and(|ptr| p.address_of(*b) == Some(ptr as usize));
                    let stays = device_segment(t).filter(|_| t.is_contiguous() && t.numel() > 0);
                    result = if written {
                        p.transfers
                            .in_place_outputs
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        Ok(())
                    } else if let Some(d) = stays {
                        // The result stays in the plugin's buffer, as the
                        // tensor's value (`resident`).
                        let array = resident_array(t);
                        let len = array.len;
                        // Counted from here on as a resident value, no
                        // longer as this execution's.
                        if let Some(h) = held.as_mut() {
                            h.shrink(len);
                        }
                        let value = Arc::new(resident::ResidentBuffer::new(
                            p,
                            std::mem::replace(b, std::ptr::null_mut()),
                            len,
                            t.buffer.pool_weak(),
                        ));
                        p.transfers
                            .resident_outputs
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        d.store(&array, value, true)
                    } else {
                        p.write_output(*b, ty, t)
                    };
                }
                p.destroy_buffer(*b);
            }
            result
        })();
        for b in a.bufs {
            p.destroy_buffer(b);
        }
        drop(a.views);
        drop(a.resident);
        // An in-place target's memory is ours again once the plugin has
        // let go of it: after both the donated argument and the output
        // that took it over are destroyed (awaiting it before deadlocks).
        for e in a.targets {
            let _ = p.await_event(e, "PJRT_Event_Await (in-place output released)");
        }
        drop(held);
        result
    }

    fn serialize(&self) -> Option<Vec<u8>> {
        let p = &self.platform;
        let blob = p.with_executable(self.exe, |exe| {
            let mut a = args!(PJRT_Executable_Serialize_Args { executable: exe });
            p.call(
                "PJRT_Executable_Serialize",
                std::mem::offset_of!(sys::PJRT_Api, PJRT_Executable_Serialize),
                |api| {
                    // SAFETY: a live executable; the bytes are copied below
                    // before their backing is freed.
                    unsafe { api.PJRT_Executable_Serialize.map(|f| f(&mut a)) }
                },
            )
            .ok()
            .map(|_| {
                let bytes = if a.serialized_bytes.is_null() {
                    Vec::new()
                } else {
                    // SAFETY: the plugin returned this many bytes, alive until
                    // the deleter runs.
                    unsafe {
                        std::slice::from_raw_parts(
                            a.serialized_bytes as *const u8,
                            a.serialized_bytes_size,
                        )
                    }
                    .to_vec()
                };
                if let Some(del) = a.serialized_executable_deleter {
                    // SAFETY: called once, on the object the plugin returned.
                    unsafe { del(a.serialized_executable) };
                }
                bytes
            })
        });
        let blob = blob.filter(|b| !b.is_empty())?;
        Some(join_serialized(
            &self.params,
            &self.outputs,
            &self.checks,
            &self.slots,
            &blob,
        ))
    }
}

impl Drop for XlaExecutable {
    fn drop(&mut self) {
        self.platform.destroy_executable(self.exe);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_plugin_loads_and_lists_its_devices() {
        let plugin = match find_plugin() {
            Ok(p) => p,
            Err(e) => panic!("feature xla is on but {e}"),
        };
        let p = XlaPlatform::load(&plugin, 3).unwrap();
        assert_eq!(p.devices().len(), 3, "{p:?}");
        assert_eq!(p.api_version().0, 0);
        assert!(p.api_version().1 >= 81);
        assert!(p.version().starts_with("xla-cpu-pjrt0."), "{}", p.version());
        assert!(p
            .compile(&crate::ir::GraphBuilder::new().build(&[]).unwrap())
            .is_err());
    }

    /// The plugin in use says what it is, and an op runs on it. Where
    /// `TPURT_EXPECT_PJRT_PLATFORM` is set (bench/gpu-check sets `cuda`),
    /// its platform must be that one: a check meant for a GPU cannot pass
    /// on the CPU plugin.
    #[test]
    fn the_plugin_in_use_is_the_platform_expected() {
        let plugin = find_plugin().unwrap();
        let p = XlaPlatform::load(&plugin, 1).unwrap();
        eprintln!(
            "plugin {}: platform {:?}, PJRT {}.{}, {} device(s), cache version {}",
            plugin.display(),
            p.name,
            p.version.0,
            p.version.1,
            p.devices().len(),
            p.version()
        );
        match std::env::var("TPURT_EXPECT_PJRT_PLATFORM") {
            Ok(want) => assert_eq!(p.name, want, "{}", plugin.display()),
            Err(_) => assert!(!p.name.is_empty()),
        }
        let r = crate::runtime::Runtime::with_platform_and_cache(
            p.clone(),
            crate::compile::CacheConfig::memory_only(4),
        )
        .unwrap();
        let s = r.default_stream(0).unwrap();
        let x = f32_tensor(&r, &s, &[1.5, -2.0, 3.25]);
        let add = crate::ops::lookup("add").unwrap();
        let out = r
            .call_op_alloc(add, &[x.clone(), x], &crate::ops::Attrs::new(), &s)
            .unwrap();
        assert_eq!(read_f32s(&r, &s, &out[0]), vec![3.0, -4.0, 6.5]);
        // Only host memory is shared in place; a GPU's tensors are staged.
        assert!(p.name == "cpu" || !p.zero_copy, "{:?}", p.transfer_stats());
    }

    /// Programs the compile cache evicts are unloaded: the process's
    /// memory mappings (each XLA CPU executable maps about three regions of
    /// JIT code and data) stay bounded however many programs compile. They
    /// did not while the op memo held every executable it had seen: a long
    /// run reached `vm.max_map_count`, and XLA, failing to map its next
    /// program, left unwind tables registered over unmapped memory, which
    /// the next C++ exception walked into (SIGSEGV).
    /// Compiles (through `r`'s cache) neg over f32[n] for each n: one
    /// program each.
    fn neg_programs(r: &crate::runtime::Runtime, ns: std::ops::RangeInclusive<u64>) {
        let neg = crate::ops::lookup("neg").unwrap();
        let none = crate::ops::Attrs::new();
        for n in ns {
            let f32s = [crate::ir::TensorType::new(crate::ir::DType::F32, &[n])];
            r.op_executable(neg, &f32s, &none).unwrap();
        }
    }

    #[test]
    fn evicted_programs_are_unloaded() {
        let p = XlaPlatform::load(&find_plugin().unwrap(), 1).unwrap();
        let r = crate::runtime::Runtime::with_platform_and_cache(
            p,
            crate::compile::CacheConfig::memory_only(4),
        )
        .unwrap();
        neg_programs(&r, 1..=1);
        let Some(before) = mappings::count() else {
            return; // no /proc: nothing to count
        };
        const PROGRAMS: u64 = 150;
        neg_programs(&r, 2..=PROGRAMS + 1);
        assert_eq!(r.compile_cache_stats().misses, PROGRAMS + 1);
        let grown = mappings::count().unwrap().saturating_sub(before);
        assert!(
            grown < PROGRAMS as usize,
            "{grown} more mappings after {PROGRAMS} programs through a cache of 4"
        );
    }

    /// Short of memory mappings, the platform has the compile cache let
    /// its older half go, whatever its entry bound: programs keep
    /// compiling, and the mappings stay near the budget.
    #[test]
    fn programs_are_let_go_when_mappings_run_short() {
        if mappings::count().is_none() {
            return; // no /proc: nothing to count
        }
        let p = XlaPlatform::load(&find_plugin().unwrap(), 1).unwrap();
        let r = crate::runtime::Runtime::with_platform_and_cache(
            p.clone(),
            crate::compile::CacheConfig::memory_only(4096),
        )
        .unwrap();
        const HEADROOM: usize = 240;
        let before = mappings::count().unwrap();
        p.set_mapping_budget(before + HEADROOM);
        const PROGRAMS: u64 = 200;
        neg_programs(&r, 1..=PROGRAMS);
        let stats = r.compile_cache_stats();
        assert_eq!(stats.misses, PROGRAMS);
        assert!(stats.evictions > 0, "{stats:?}");
        assert!(stats.memory_entries < PROGRAMS, "{stats:?}");
        let grown = mappings::count().unwrap().saturating_sub(before);
        assert!(grown < 2 * HEADROOM, "{grown} more mappings");
    }

    #[test]
    fn the_cpu_plugin_stands_in_for_one_host_of_a_slice() {
        let plugin = find_plugin().unwrap();
        let vars = [
            ("TPU_ACCELERATOR_TYPE", "v5litepod-8"),
            ("TPU_TOPOLOGY", "2x4"),
            ("TPU_CHIPS_PER_HOST_BOUNDS", "2,2,1"),
            ("TPU_HOST_BOUNDS", "1,2,1"),
            ("TPU_WORKER_ID", "1"),
            ("TPU_VISIBLE_CHIPS", "0,3"),
        ];
        let slice = SliceLayout::from_pairs(&vars, None).unwrap();
        // The device count asked for is replaced by the visible chips.
        let p = XlaPlatform::load_in_slice(&plugin, 4, slice).unwrap();
        assert_eq!(p.topology(), &[2, 4]);
        let d: Vec<_> = p
            .devices()
            .iter()
            .map(|d| (d.host_chip, d.coords.clone()))
            .collect();
        assert_eq!(d, vec![(0, vec![0, 2]), (3, vec![1, 3])]);
        assert_eq!(p.slice().unwrap().num_hosts(), 2);
    }

    /// A runtime on the XLA CPU plugin (one device), its platform and its
    /// default stream.
    fn cpu_runtime() -> (Arc<XlaPlatform>, crate::runtime::Runtime, crate::Stream) {
        let p = XlaPlatform::load(&find_plugin().unwrap(), 1).unwrap();
        let r = crate::runtime::Runtime::with_platform_and_cache(
            p.clone(),
            crate::compile::CacheConfig::memory_only(16),
        )
        .unwrap();
        let s = r.default_stream(0).unwrap();
        (p, r, s)
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// A new f32 tensor of `v`'s elements, one dimension.
    fn f32_tensor(r: &crate::runtime::Runtime, s: &crate::Stream, v: &[f32]) -> DeviceTensor {
        let buf = r.allocate(0, (v.len() * 4) as u64, s).unwrap();
        let t = DeviceTensor::contiguous(buf, crate::ir::DType::F32, &[v.len() as u64]).unwrap();
        r.copy_host_to_device(&f32_bytes(v), &t.buffer, &t.layout, s)
            .unwrap();
        t
    }

    /// A new tensor holding `h`'s elements.
    fn upload(
        r: &crate::runtime::Runtime,
        s: &crate::Stream,
        h: &crate::platform::host::kernels::HostTensor,
    ) -> DeviceTensor {
        let b = r.allocate(0, h.bytes().len() as u64, s).unwrap();
        r.copy_host_to_device(h.bytes(), &b, &crate::Layout::bytes(b.len()), s)
            .unwrap();
        DeviceTensor::contiguous(b, h.dtype(), h.dims()).unwrap()
    }

    /// `t`'s elements, as a host tensor.
    fn download(
        r: &crate::runtime::Runtime,
        s: &crate::Stream,
        t: &DeviceTensor,
    ) -> crate::platform::host::kernels::HostTensor {
        let mut bytes = vec![0u8; t.ty().nbytes() as usize];
        r.copy_device_to_host(&t.buffer, &t.layout, &mut bytes, s)
            .unwrap();
        crate::platform::host::kernels::HostTensor::from_bytes(t.ty(), &bytes).unwrap()
    }

    /// `t`'s elements (f32).
    fn read_f32s(r: &crate::runtime::Runtime, s: &crate::Stream, t: &DeviceTensor) -> Vec<f32> {
        let mut out = vec![0u8; (t.numel() * 4) as usize];
        r.copy_device_to_host(&t.buffer, &t.layout, &mut out, s)
            .unwrap();
        out.chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// On a plugin with memory of its own (the CPU plugin under
    /// `TPURT_XLA_ZERO_COPY=0`), values stay in the plugin's buffers from
    /// one execution to the next: an input crosses once, an output is not
    /// copied out until something reads its bytes; a host write, a fill,
    /// a strided view and an in-place update all see and leave the right
    /// values; the buffers count in `plugin_bytes`.
    #[test]
    fn values_stay_in_the_plugins_buffers_between_executions() {
        use crate::ir::DType;
        use crate::ops::{self, Attrs};
        let p = XlaPlatform::load_with(&find_plugin().unwrap(), 1, None, false).unwrap();
        let r = crate::runtime::Runtime::with_platform_and_cache(
            p.clone(),
            crate::compile::CacheConfig::memory_only(16),
        )
        .unwrap();
        let s = r.default_stream(0).unwrap();
        let (add, mul) = (ops::lookup("add").unwrap(), ops::lookup("mul").unwrap());
        let run = |op, ins: &[&DeviceTensor]| -> DeviceTensor {
            let ins: Vec<DeviceTensor> = ins.iter().map(|t| (*t).clone()).collect();
            let mut out = r.call_op_alloc(op, &ins, &Attrs::new(), &s).unwrap();
            s.synchronize().unwrap();
            out.remove(0)
        };
        let counts = |t: &DeviceTensor| device_segment(t).unwrap().resident_counts();
        let xs: Vec<f32> = (0..64).map(|i| i as f32 * 0.25).collect();
        let x = f32_tensor(&r, &s, &xs);
        let before = p.transfer_stats();
        let plugin_bytes = || r.memory_stats(0).unwrap().plugin_bytes.current;
        assert_eq!(plugin_bytes(), 0);

        // A chain: x crosses once, y and z never leave the plugin.
        let y = run(add, &[&x, &x]);
        let z = run(mul, &[&y, &x]);
        let d = p.transfer_stats().since(&before);
        assert_eq!((d.staged_inputs, d.resident_inputs), (1, 3), "{d:?}");
        assert_eq!((d.resident_outputs, d.plugin_reads), (2, 0), "{d:?}");
        assert_eq!(plugin_bytes(), 3 * 256, "x, y and z, 256 bytes each");
        assert_eq!(counts(&z), (3, 2), "y and z newer than the pool's bytes");
        let want: Vec<f32> = xs.iter().map(|v| (v + v) * v).collect();
        assert_eq!(read_f32s(&r, &s, &z), want);
        let d = p.transfer_stats().since(&before);
        assert_eq!((d.copies_back, d.plugin_reads), (1, 1), "{d:?}");
        assert_eq!(read_f32s(&r, &s, &z), want, "read again: no copy");
        assert_eq!(p.transfer_stats().since(&before).copies_back, 1);
        // A tensor gone takes its plugin buffer along.
        drop((y, z));
        assert_eq!(plugin_bytes(), 256, "x's alone");

        // A host write replaces x's value: the next op copies it in again.
        let x2: Vec<f32> = xs.iter().map(|v| v - 3.0).collect();
        r.copy_host_to_device(&f32_bytes(&x2), &x.buffer, &x.layout, &s)
            .unwrap();
        let before = p.transfer_stats();
        let w = run(add, &[&x, &x]);
        assert_eq!(p.transfer_stats().since(&before).staged_inputs, 1);
        assert_eq!(
            read_f32s(&r, &s, &w),
            x2.iter().map(|v| v + v).collect::<Vec<_>>()
        );

        // A fill over part of a newer value: the rest is copied back
        // first and keeps the op's result.
        {
            let q = run(mul, &[&x, &x]);
            r.fill_async(&q.buffer, 0, 16, 0, &s).unwrap();
            let mut want: Vec<f32> = x2.iter().map(|v| v * v).collect();
            want[..4].fill(0.0);
            assert_eq!(read_f32s(&r, &s, &q), want);
        }
        // A strided view (every other element) of a newer value, and the
        // same bytes as another shape: both see the op's result.
        {
            let q = run(mul, &[&x, &x]);
            let every_other =
                DeviceTensor::new(q.buffer.clone(), DType::F32, 0, &[32], Some(&[2])).unwrap();
            let sq: Vec<f32> = x2.iter().map(|v| v * v).collect();
            let e = run(add, &[&every_other, &every_other]);
            let want: Vec<f32> = (0..32).map(|i| 2.0 * sq[2 * i]).collect();
            assert_eq!(read_f32s(&r, &s, &e), want);
            // The third time round, the same shapes run as compiled
            // programs (a shape seen once is copied through the pool).
            for round in 0..3 {
                let q = run(mul, &[&x, &x]);
                let before = p.transfer_stats();
                let square =
                    DeviceTensor::new(q.buffer.clone(), DType::F32, 0, &[8, 8], None).unwrap();
                let e = run(add, &[&square, &square]);
                assert_eq!(
                    read_f32s(&r, &s, &e),
                    sq.iter().map(|v| 2.0 * v).collect::<Vec<_>>()
                );
                // ... and its transpose.
                let transposed =
                    DeviceTensor::new(q.buffer.clone(), DType::F32, 0, &[8, 8], Some(&[1, 8]))
                        .unwrap();
                let e = run(add, &[&transposed, &square]);
                let want: Vec<f32> = (0..64).map(|k| sq[(k % 8) * 8 + k / 8] + sq[k]).collect();
                assert_eq!(read_f32s(&r, &s, &e), want);
                let d = p.transfer_stats().since(&before);
                if round == 2 {
                    assert_eq!(
                        (d.relayouts, d.staged_inputs),
                        (4, 0),
                        "made on the device, one an argument: {d:?}"
                    );
                    assert_eq!(d.copies_back, 2, "the two results, read: {d:?}");
                }
            }
        }

        // An in-place update under defer-and-fuse: the flushed program
        // stores x + x over x, whose value is donated; x holds the sums,
        // and x's old buffer is gone.
        let before = p.transfer_stats();
        crate::eager::push_mode(crate::eager::EagerMode::DeferAndFuse).unwrap();
        r.call_op(
            add,
            &[x.clone(), x.clone()],
            std::slice::from_ref(&x),
            &Attrs::new(),
            &s,
        )
        .unwrap();
        r.call_op(
            mul,
            &[x.clone(), w.clone()],
            std::slice::from_ref(&x),
            &Attrs::new(),
            &s,
        )
        .unwrap();
        crate::eager::pop_mode().unwrap();
        s.synchronize().unwrap();
        let d = p.transfer_stats().since(&before);
        assert_eq!(d.staged_inputs, 0, "{d:?}");
        assert_eq!((d.resident_inputs, d.resident_outputs), (2, 1), "{d:?}");
        assert_eq!(
            read_f32s(&r, &s, &x),
            x2.iter().map(|v| (v + v) * (v + v)).collect::<Vec<_>>()
        );
        assert_eq!(counts(&x).1, 0, "every value read is current in the pool");
        drop((x, w));
        assert_eq!(plugin_bytes(), 0);
    }

    /// Input views are kept across executions: the same bytes, type and
    /// dims reuse one view, which reads the bytes as they are when the
    /// execution runs; other bytes make another; a full cache starts over
    /// and destroys what no execution holds; a released segment's views
    /// are never used again.
    #[test]
    fn input_views_are_kept_and_read_the_bytes_of_the_moment() {
        use crate::ir::DType;
        use crate::ops::{self, Attrs};
        let (p, r, s) = cpu_runtime();
        // Outputs above `COPY_OUT_BYTES`, written in place: only inputs
        // have views here.
        const N: usize = 4096;
        assert!((N / 2 * 4) as u64 > COPY_OUT_BYTES);
        let write = |t: &DeviceTensor, v: &[f32]| {
            r.copy_host_to_device(&f32_bytes(v), &t.buffer, &t.layout, &s)
                .unwrap();
        };
        let put = |dims: &[u64], v: &[f32]| {
            let b = r.allocate(0, (v.len() * 4) as u64, &s).unwrap();
            let t = DeviceTensor::contiguous(b, DType::F32, dims).unwrap();
            write(&t, v);
            t
        };
        let get = |t: &DeviceTensor| read_f32s(&r, &s, t);
        let add = ops::lookup("add").unwrap();
        let add_into = |a: &DeviceTensor, b: &DeviceTensor, out: &DeviceTensor| {
            let before = p.transfer_stats();
            r.call_op(
                add,
                &[a.clone(), b.clone()],
                std::slice::from_ref(out),
                &Attrs::new(),
                &s,
            )
            .unwrap();
            s.synchronize().unwrap();
            let d = p.transfer_stats().since(&before);
            (d.input_views, d.views_created)
        };
        let xs: Vec<f32> = (0..N).map(|i| i as f32).collect();
        let ys: Vec<f32> = (0..N).map(|i| 100.0 - i as f32).collect();
        let (x, y, out) = (
            put(&[N as u64], &xs),
            put(&[N as u64], &ys),
            put(&[N as u64], &[0.0; N]),
        );
        let sum = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| p + q).collect::<Vec<_>>();
        assert_eq!(add_into(&x, &y, &out), (2, 2));
        assert_eq!(get(&out), sum(&xs, &ys));
        // Again: both views reused.
        assert_eq!(add_into(&x, &y, &out), (2, 0));
        // New bytes in x: the kept view reads them.
        let xs2: Vec<f32> = xs.iter().map(|v| v * 3.0 + 0.5).collect();
        write(&x, &xs2);
        assert_eq!(add_into(&x, &y, &out), (2, 0));
        assert_eq!(get(&out), sum(&xs2, &ys));
        // x + x: one view, twice.
        assert_eq!(add_into(&x, &x, &out), (2, 0));
        assert_eq!(get(&out), sum(&xs2, &xs2));
        // Their second halves (still aligned): other views.
        let half = |t: &DeviceTensor| {
            DeviceTensor::new(
                t.buffer.clone(),
                DType::F32,
                (N / 2 * 4) as u64,
                &[N as u64 / 2],
                None,
            )
            .unwrap()
        };
        assert_eq!(add_into(&half(&x), &half(&y), &half(&out)), (2, 2));
        assert_eq!(get(&half(&out)), sum(&xs2[N / 2..], &ys[N / 2..]));
        // A full cache starts over; the views no execution holds go.
        let (z, w) = (put(&[N as u64], &ys), put(&[N as u64], &xs));
        p.views.lock().unwrap().cap = 2;
        assert_eq!(add_into(&z, &w, &out), (2, 2));
        assert_eq!(get(&out), sum(&ys, &xs));
        assert_eq!(add_into(&x, &y, &out), (2, 2));
        assert_eq!(get(&out), sum(&xs2, &ys));
        {
            let cache = p.views.lock().unwrap();
            assert_eq!((cache.map.len(), cache.retired.len()), (2, 0));
        }
        // One view of room: x's view, which the execution holds when y's
        // comes, is retired but kept until a later start-over.
        p.views.lock().unwrap().cap = 1;
        assert_eq!(add_into(&z, &w, &out), (2, 2));
        {
            let cache = p.views.lock().unwrap();
            assert_eq!((cache.map.len(), cache.retired.len()), (1, 1));
        }
        assert_eq!(add_into(&x, &z, &out), (2, 2));
        assert_eq!(get(&out), sum(&xs2, &ys));
        p.views.lock().unwrap().cap = VIEW_CACHE_ENTRIES;
        // Every buffer gone and its segment released: the next tensors,
        // even at the same addresses, get views of their own.
        drop((x, y, z, w, out));
        s.synchronize().unwrap();
        assert!(r.empty_cache(0).unwrap() > 0, "the segment was released");
        let (x, y, out) = (
            put(&[N as u64], &ys),
            put(&[N as u64], &xs),
            put(&[N as u64], &[0.0; N]),
        );
        assert_eq!(add_into(&x, &y, &out), (2, 2));
        assert_eq!(get(&out), sum(&ys, &xs));
    }

    /// Views are handed out [`VIEW_CACHE_USES`] times, then the cache
    /// starts over: the plugin's list of the executions that read a view
    /// (each one's event kept alive by it) goes with the view, instead of
    /// growing for as long as the view is kept.
    #[test]
    fn views_start_over_after_their_uses() {
        use crate::ir::DType;
        use crate::ops::{self, Attrs};
        let (p, r, s) = cpu_runtime();
        const N: usize = 4096;
        let put = |v: &[f32]| {
            let b = r.allocate(0, (v.len() * 4) as u64, &s).unwrap();
            let t = DeviceTensor::contiguous(b, DType::F32, &[v.len() as u64]).unwrap();
            r.copy_host_to_device(&f32_bytes(v), &t.buffer, &t.layout, &s)
                .unwrap();
            t
        };
        let xs: Vec<f32> = (0..N).map(|i| i as f32).collect();
        let (x, y, out) = (put(&xs), put(&xs), put(&[0.0; N]));
        let add = ops::lookup("add").unwrap();
        let run = || {
            let before = p.transfer_stats();
            r.call_op(
                add,
                &[x.clone(), y.clone()],
                std::slice::from_ref(&out),
                &Attrs::new(),
                &s,
            )
            .unwrap();
            s.synchronize().unwrap();
            let cache = p.views.lock().unwrap();
            let d = p.transfer_stats().since(&before);
            (d.views_created, cache.map.len(), cache.retired.len())
        };
        assert_eq!(VIEW_CACHE_USES, p.views.lock().unwrap().max_uses);
        // Four hand-outs: two executions of two inputs each.
        p.views.lock().unwrap().max_uses = 4;
        assert_eq!(run(), (2, 2, 0));
        assert_eq!(run(), (0, 2, 0));
        // The third starts over: new views, and the old two, which no
        // execution holds any more, are destroyed.
        assert_eq!(run(), (2, 2, 0));
        assert_eq!(run(), (0, 2, 0));
        let before = p.transfer_stats();
        for _ in 0..10 {
            run();
        }
        // 20 hand-outs, a start-over every 4: five times two new views.
        assert_eq!(p.transfer_stats().since(&before).views_created, 10);
        assert_eq!(read_f32s(&r, &s, &out)[N - 1], 2.0 * (N - 1) as f32);
    }

    #[test]
    fn a_runtime_on_xla_has_devices_memory_and_streams() {
        use crate::runtime::{Runtime, RuntimeOptions};
        let r = Runtime::new(&RuntimeOptions {
            platform: Some("xla".into()),
            host_chips: Some(2),
            cache: Some(crate::compile::CacheConfig::memory_only(8)),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(r.device_count(), 2);
        assert_eq!(r.platform().name(), "xla");
        let s = r.default_stream(1).unwrap();
        let b = r.allocate(1, 16, &s).unwrap();
        r.copy_host_to_device(&[7u8; 16], &b, &crate::Layout::bytes(16), &s)
            .unwrap();
        let mut back = [0u8; 16];
        r.copy_device_to_host(&b, &crate::Layout::bytes(16), &mut back, &s)
            .unwrap();
        assert_eq!(back, [7u8; 16]);
        // 7-bytes as f32: whatever they are, x + x must be exactly 2x.
        let add = crate::ops::lookup("add").unwrap();
        let t = crate::DeviceTensor::contiguous(b, crate::ir::DType::F32, &[4]).unwrap();
        let out = r
            .call_op_alloc(add, &[t.clone(), t], &crate::ops::Attrs::new(), &s)
            .unwrap();
        let mut got = [0u8; 16];
        r.copy_device_to_host(&out[0].buffer, &crate::Layout::bytes(16), &mut got, &s)
            .unwrap();
        let x = f32::from_le_bytes([7, 7, 7, 7]);
        assert_eq!(f32::from_le_bytes(got[..4].try_into().unwrap()), x + x);
    }

    /// An output stored over a parameter (`ir::Alias`, an in-place
    /// update) is written into that tensor's own bytes, with the old value
    /// still read where the program reads it; handed another tensor, the
    /// same executable copies the input and leaves it alone; and a
    /// serialized executable keeps its slots.
    #[test]
    fn outputs_stored_over_their_parameters_are_written_in_place() {
        use crate::ir::{Alias, BinaryOp, DType, GraphBuilder, TensorType};
        let (p, r, s) = cpu_runtime();
        const N: u64 = 2048;
        const { assert!(N * 4 > COPY_OUT_BYTES) };
        // x' = x * y + y, stored over x; z = x + x, from the old x.
        let mut b = GraphBuilder::new();
        let x = b.param(TensorType::new(DType::F32, &[N]));
        let y = b.param(TensorType::new(DType::F32, &[N]));
        let xy = b.binary(BinaryOp::Mul, x, y).unwrap();
        let x2 = b.binary(BinaryOp::Add, xy, y).unwrap();
        let z = b.binary(BinaryOp::Add, x, x).unwrap();
        let graph = b
            .build(&[x2, z])
            .unwrap()
            .with_aliases(vec![Alias {
                output: 0,
                param: 0,
            }])
            .unwrap();
        assert_eq!(
            output_slots(&graph),
            vec![lower::OutputSlot::Param(0), lower::OutputSlot::Extra]
        );
        let exe = p.compile(&graph).unwrap();
        let tensor = |v: &[f32]| f32_tensor(&r, &s, v);
        let xs: Vec<f32> = (0..N).map(|i| (i % 13) as f32 - 6.0).collect();
        let ys: Vec<f32> = (0..N).map(|i| (i % 5) as f32 * 0.5).collect();
        let updated: Vec<f32> = xs.iter().zip(&ys).map(|(a, b)| a * b + b).collect();
        let doubled: Vec<f32> = xs.iter().map(|a| a + a).collect();
        let run = |exe: &Arc<dyn Executable>, ins: &[DeviceTensor], outs: &[DeviceTensor]| {
            s.synchronize().unwrap();
            let before = p.transfer_stats();
            exe.execute(ins, outs).unwrap();
            p.transfer_stats().since(&before)
        };
        // In place: both outputs written where they belong, no copies.
        let (xt, yt, zt) = (tensor(&xs), tensor(&ys), tensor(&[0.0; N as usize]));
        let d = run(&exe, &[xt.clone(), yt.clone()], &[xt.clone(), zt.clone()]);
        assert_eq!((d.in_place_outputs, d.direct_outputs), (2, 0), "{d:?}");
        assert_eq!((d.staged_inputs, d.input_views), (0, 1), "{d:?}");
        assert_eq!(read_f32s(&r, &s, &xt), updated);
        assert_eq!(read_f32s(&r, &s, &zt), doubled);
        // Another tensor for the output: x is copied for XLA, the result
        // copied out, x left as it was.
        let (xt, other) = (tensor(&xs), tensor(&[0.0; N as usize]));
        let d = run(
            &exe,
            &[xt.clone(), yt.clone()],
            &[other.clone(), zt.clone()],
        );
        assert_eq!((d.in_place_outputs, d.direct_outputs), (1, 1), "{d:?}");
        assert_eq!(d.staged_inputs, 1, "{d:?}");
        assert_eq!(read_f32s(&r, &s, &other), updated);
        assert_eq!(read_f32s(&r, &s, &xt), xs);
        // Serialized and loaded back: still in place.
        let back = p.load_executable(&exe.serialize().unwrap()).unwrap();
        let xt = tensor(&xs);
        let d = run(&back, &[xt.clone(), yt.clone()], &[xt.clone(), zt.clone()]);
        assert_eq!((d.in_place_outputs, d.direct_outputs), (2, 0), "{d:?}");
        assert_eq!(read_f32s(&r, &s, &xt), updated);
        // A framing that stores both outputs over one parameter, or one
        // over a parameter it lacks, is refused.
        let bytes = exe.serialize().unwrap();
        let (params, outputs, checks, _, blob) = split_serialized(&bytes).unwrap();
        for slots in [
            [lower::OutputSlot::Param(0), lower::OutputSlot::Param(0)],
            [lower::OutputSlot::Param(0), lower::OutputSlot::Param(2)],
        ] {
            let framed = join_serialized(&params, &outputs, &checks, &slots, blob);
            let e = p.load_executable(&framed).err().unwrap();
            assert!(e.to_string().contains("output slots"), "{e}");
        }
    }

    /// A small output before large ones does not cost them their place:
    /// each large output is written in place, however the outputs are
    /// ordered. (With a kept view standing in for the small output's
    /// aliased argument, not donated, the CPU plugin donated none of the
    /// arguments after it, and copied every later output.)
    #[test]
    fn small_outputs_do_not_stop_later_outputs_being_written_in_place() {
        use crate::ir::{BinaryOp, DType, GraphBuilder, TensorType};
        let (p, r, s) = cpu_runtime();
        const SMALL: u64 = 16;
        const LARGE: u64 = 2048;
        const { assert!(SMALL * 4 <= COPY_OUT_BYTES && LARGE * 4 > COPY_OUT_BYTES) };
        // Outputs: large, small, large, large.
        let mut b = GraphBuilder::new();
        let x = b.param(TensorType::new(DType::F32, &[SMALL]));
        let y = b.param(TensorType::new(DType::F32, &[LARGE]));
        let small = b.binary(BinaryOp::Add, x, x).unwrap();
        let twice = b.binary(BinaryOp::Add, y, y).unwrap();
        let square = b.binary(BinaryOp::Mul, y, y).unwrap();
        let cube = b.binary(BinaryOp::Mul, square, y).unwrap();
        let graph = b.build(&[twice, small, square, cube]).unwrap();
        let exe = p.compile(&graph).unwrap();
        let tensor = |v: &[f32]| f32_tensor(&r, &s, v);
        let xs: Vec<f32> = (0..SMALL).map(|i| i as f32).collect();
        let ys: Vec<f32> = (0..LARGE).map(|i| (i % 7) as f32 - 3.0).collect();
        let ins = [tensor(&xs), tensor(&ys)];
        let outs = [
            tensor(&[0.0; LARGE as usize]),
            tensor(&[0.0; SMALL as usize]),
            tensor(&[0.0; LARGE as usize]),
            tensor(&[0.0; LARGE as usize]),
        ];
        s.synchronize().unwrap();
        let before = p.transfer_stats();
        exe.execute(&ins, &outs).unwrap();
        let d = p.transfer_stats().since(&before);
        assert_eq!((d.in_place_outputs, d.direct_outputs), (3, 1), "{d:?}");
        let map = |f: fn(f32) -> f32, v: &[f32]| v.iter().map(|&a| f(a)).collect::<Vec<_>>();
        assert_eq!(read_f32s(&r, &s, &outs[0]), map(|a| a + a, &ys));
        assert_eq!(read_f32s(&r, &s, &outs[1]), map(|a| a + a, &xs));
        assert_eq!(read_f32s(&r, &s, &outs[2]), map(|a| a * a, &ys));
        assert_eq!(read_f32s(&r, &s, &outs[3]), map(|a| a * a * a, &ys));
    }

    /// On the CPU plugin, aligned contiguous inputs are read in place
    /// (views of the pool) and aligned contiguous outputs written in place;
    /// strided and misaligned inputs are staged, outputs that overlap an
    /// input or are misaligned are copied straight into the pool, strided
    /// outputs go through a host tensor; every case computes the same
    /// values and writes nothing else.
    #[test]
    fn inputs_are_read_in_place_and_outputs_land_in_the_pool() {
        use crate::buffer::Buffer;
        use crate::ir::DType;
        use crate::ops::{self, Attrs};
        let (p, r, s) = cpu_runtime();
        let put = |v: &[f32]| {
            let b = r.allocate(0, (v.len() * 4) as u64, &s).unwrap();
            let bytes = f32_bytes(v);
            r.copy_host_to_device(&bytes, &b, &crate::Layout::bytes(bytes.len() as u64), &s)
                .unwrap();
            b
        };
        let get = |t: &DeviceTensor| read_f32s(&r, &s, t);
        let add = ops::lookup("add").unwrap();
        let xs: Vec<f32> = (0..32).map(|i| i as f32).collect();
        let ys: Vec<f32> = (0..32).map(|i| 100.0 + 2.0 * i as f32).collect();
        let (xb, yb) = (put(&xs), put(&ys));
        assert_eq!(
            xb.address() % VIEW_ALIGN as u64,
            0,
            "pool blocks are 64-byte aligned"
        );
        let f = |b: &Buffer, offset: u64, dims: &[u64], strides: Option<&[u64]>| {
            DeviceTensor::new(b.clone(), DType::F32, offset, dims, strides).unwrap()
        };
        // The counters' change over one add into `out`, run to the end.
        let add_into = |ins: [&DeviceTensor; 2], out: &DeviceTensor| -> TransferStats {
            let before = p.transfer_stats();
            let ins = [ins[0].clone(), ins[1].clone()];
            r.call_op(add, &ins, std::slice::from_ref(out), &Attrs::new(), &s)
                .unwrap();
            s.synchronize().unwrap();
            p.transfer_stats().since(&before)
        };
        let x = f(&xb, 0, &[32], None);
        let y = f(&yb, 0, &[32], None);

        // Aligned and contiguous: two views; the output, of at most
        // `COPY_OUT_BYTES`, is copied out of XLA's buffer (its aliased
        // argument is a kept view of its bytes, made once).
        let out = f(&put(&[0.0; 32]), 0, &[32], None);
        let d = add_into([&x, &y], &out);
        assert_eq!((d.input_views, d.staged_inputs), (2, 0));
        assert_eq!((d.in_place_outputs, d.direct_outputs), (0, 1));
        assert_eq!(d.plugin_reads, 0, "read from the buffer's address");
        let want: Vec<f32> = xs.iter().zip(&ys).map(|(a, b)| a + b).collect();
        assert_eq!(get(&out), want);
        let d = add_into([&y, &x], &out);
        assert_eq!((d.views_created, d.direct_outputs), (0, 1));
        assert_eq!(get(&out), want);

        // A larger one is written in place: no copy at all.
        let big: Vec<f32> = (0..2048).map(|i| i as f32 * 0.5).collect();
        let bx = f(&put(&big), 0, &[2048], None);
        let out = f(&put(&[0.0; 2048]), 0, &[2048], None);
        let d = add_into([&bx, &bx], &out);
        assert_eq!((d.input_views, d.staged_inputs), (2, 0));
        assert_eq!((d.in_place_outputs, d.direct_outputs), (1, 0));
        assert_eq!(get(&out), big.iter().map(|v| v + v).collect::<Vec<_>>());

        // Misaligned (4 bytes in) and strided inputs are staged.
        let out = f(&put(&[0.0; 16]), 0, &[16], None);
        let d = add_into(
            [&f(&xb, 4, &[16], None), &f(&yb, 0, &[16], Some(&[2]))],
            &out,
        );
        assert_eq!((d.input_views, d.staged_inputs), (0, 2));
        assert_eq!(d.staged_input_bytes, 2 * 16 * 4);
        let want: Vec<f32> = (0..16).map(|i| xs[i + 1] + ys[2 * i]).collect();
        assert_eq!(get(&out), want);

        // In place, x = x + y reversed into x: both inputs are views; the
        // output, which overlaps an input, is copied in after the
        // execution; x holds the sums.
        let y_rev: Vec<f32> = ys.iter().rev().copied().collect();
        let d = add_into([&x, &f(&put(&y_rev), 0, &[32], None)], &x);
        assert_eq!((d.input_views, d.staged_inputs), (2, 0));
        assert_eq!((d.in_place_outputs, d.direct_outputs), (0, 1));
        assert_eq!(d.plugin_reads, 0, "read from the buffer's address");
        let want: Vec<f32> = xs.iter().zip(&y_rev).map(|(a, b)| a + b).collect();
        assert_eq!(get(&x), want);

        // A strided output (every other element of a fresh buffer) goes
        // through a host tensor, and a misaligned one (elements 1..17) is
        // copied straight in; their neighbours keep their values.
        let a = f(&yb, 0, &[16], None);
        for (offset, strides, hit) in [(0, Some(&[2u64][..]), 0..32), (4, None, 1..17)] {
            let ob = put(&[-1.0; 32]);
            let d = add_into([&a, &a], &f(&ob, offset, &[16], strides));
            assert_eq!(d.in_place_outputs, 0);
            assert_eq!(
                (d.direct_outputs, d.staged_outputs),
                if strides.is_some() { (0, 1) } else { (1, 0) }
            );
            let want: Vec<f32> = (0..32usize)
                .map(|i| match strides {
                    Some(_) if i % 2 == 0 => 2.0 * ys[i / 2],
                    None if hit.contains(&i) => 2.0 * ys[i - 1],
                    _ => -1.0,
                })
                .collect();
            assert_eq!(get(&f(&ob, 0, &[32], None)), want);
        }
    }

    /// Ops on the XLA CPU plugin give the host platform's results, with
    /// tensors read and written in place and, as on a plugin with memory
    /// of its own, copied in and out (`TPURT_XLA_ZERO_COPY=0`); the
    /// plugin's buffers count in the pool's `plugin_bytes` while they live.
    #[test]
    fn ops_on_xla_match_the_host_platform() {
        let plugin = find_plugin().unwrap();
        let sharing =
            ops_match_the_host_platform(XlaPlatform::load_with(&plugin, 1, None, true).unwrap());
        let copying = XlaPlatform::load_with(&plugin, 1, None, false).unwrap();
        let copied = ops_match_the_host_platform(copying.clone());
        // The cases' tensors are small: XLA makes every output in a buffer
        // of its own either way, and takes the temporaries the plugin
        // states; copying, the inputs' copies count as well, and the
        // inputs and outputs stay in the plugin's buffers after (resident),
        // where they count until those are gone.
        for (c, copy) in sharing.iter().zip(&copied) {
            let name = c.name;
            assert_eq!(
                c.held.allocated,
                c.out_bytes + c.temp_bytes,
                "{name}: {c:?}"
            );
            assert_eq!(
                copy.held.peak,
                c.held.allocated + c.in_bytes,
                "{name}: {copy:?}"
            );
            assert_eq!(
                copy.held.current,
                c.in_bytes + c.out_bytes,
                "{name}: {copy:?}"
            );
        }
        let with_temps: Vec<&str> = sharing
            .iter()
            .filter(|c| c.temp_bytes > 0)
            .map(|c| c.name)
            .collect();
        assert!(with_temps.contains(&"matmul"), "{with_temps:?}");
        let d = copying.transfer_stats();
        // Every input copied in; every output left in the plugin's buffer,
        // and copied out by the plugin once read.
        assert_eq!((d.input_views, d.in_place_outputs), (0, 0), "{d:?}");
        assert_eq!(d.staged_inputs, 16, "{d:?}");
        assert_eq!((d.direct_outputs, d.staged_outputs), (0, 0), "{d:?}");
        assert_eq!((d.resident_outputs, d.copies_back), (12, 12), "{d:?}");
        assert_eq!(d.plugin_reads, 12, "{d:?}");
    }

    /// One case of `ops_match_the_host_platform`: its plugin memory.
    #[derive(Debug)]
    struct PluginMemory {
        name: &'static str,
        in_bytes: u64,
        out_bytes: u64,
        /// Temporaries of the case's executable, as the plugin states them.
        temp_bytes: u64,
        /// `plugin_bytes` after the case's one execution.
        held: crate::memory::Stat,
    }

    /// Runs the op table's cases on `p` against the host kernels.
    fn ops_match_the_host_platform(p: Arc<XlaPlatform>) -> Vec<PluginMemory> {
        let mut held_by_case = Vec::new();
        use crate::ir::{DType, TensorType};
        use crate::ops::{self, Attr, Attrs};
        use crate::platform::host::kernels::{eval_graph, HostTensor};
        let f = |d: &[u64]| TensorType::new(DType::F32, d);
        let cases: Vec<(&'static str, Vec<TensorType>, Attrs)> = vec![
            ("add", vec![f(&[3, 4]), f(&[4])], Attrs::new()),
            ("gelu", vec![f(&[5, 7])], Attrs::new()),
            (
                "softmax",
                vec![f(&[6, 9])],
                Attrs::new().with("dim", Attr::Int(-1)),
            ),
            (
                "layer_norm",
                vec![f(&[4, 16]), f(&[16]), f(&[16])],
                Attrs::new().with("normalized_shape", Attr::Ints(vec![16])),
            ),
            ("matmul", vec![f(&[2, 3, 8]), f(&[8, 5])], Attrs::new()),
            (
                "sum",
                vec![f(&[3, 5])],
                Attrs::new().with("dim", Attr::Ints(vec![0])),
            ),
            // A 0-d tensor reduced over no dimensions: an empty dimension
            // list in the module (it was `array<i64: >`, which XLA refused).
            ("sum", vec![f(&[])], Attrs::new()),
            ("all", vec![TensorType::new(DType::Bool, &[])], Attrs::new()),
            (
                "where",
                vec![TensorType::new(DType::Bool, &[4]), f(&[4]), f(&[4])],
                Attrs::new(),
            ),
            (
                "cast",
                vec![f(&[6])],
                Attrs::new().with("dtype", Attr::DType(DType::BF16)),
            ),
        ];
        for (name, types, attrs) in cases {
            let g = ops::build_graph(ops::lookup(name).unwrap(), &types, &attrs).unwrap();
            let inputs: Vec<HostTensor> = types
                .iter()
                .enumerate()
                .map(|(k, t)| {
                    let n = t.numel() as usize;
                    let v: Vec<f64> = (0..n)
                        .map(|i| ((i * 7 + k * 3) % 11) as f64 * 0.3 - 1.4)
                        .collect();
                    HostTensor::from_f64(t.dtype, &t.dims, &v).unwrap()
                })
                .collect();
            let want = eval_graph(&g, &inputs).unwrap();
            // Run on xla through device tensors in host memory.
            let rt = crate::runtime::Runtime::with_platform_and_cache(
                p.clone(),
                crate::compile::CacheConfig::memory_only(8),
            )
            .unwrap();
            let s = rt.default_stream(0).unwrap();
            let dev_in: Vec<DeviceTensor> = inputs.iter().map(|h| upload(&rt, &s, h)).collect();
            let outs = rt
                .call_op_alloc(ops::lookup(name).unwrap(), &dev_in, &attrs, &s)
                .unwrap();
            s.synchronize().unwrap();
            let held = rt.memory_stats(0).unwrap().plugin_bytes;
            let in_bytes: u64 = inputs.iter().map(|h| h.bytes().len() as u64).sum();
            let out_bytes: u64 = want.iter().map(|h| h.bytes().len() as u64).sum();
            if p.zero_copy {
                // One execution: all of it held at once, nothing after.
                assert_eq!(held.current, 0, "{name}: {held:?}");
                assert_eq!(held.peak, held.allocated, "{name}: {held:?}");
            }
            let (text, _) = lower::lower_aliased(&g, &output_slots(&g)).unwrap();
            let exe = p.compile_text(&text).unwrap();
            let temp_bytes = p.temp_bytes(exe).unwrap();
            p.destroy_executable(exe);
            held_by_case.push(PluginMemory {
                name,
                in_bytes,
                out_bytes,
                temp_bytes,
                held,
            });
            for (o, w) in outs.iter().zip(&want) {
                let got = download(&rt, &s, o);
                let tol = if w.dtype() == DType::BF16 { 1e-2 } else { 1e-5 };
                for (a, b) in got.to_f64_vec().iter().zip(w.to_f64_vec()) {
                    assert!(
                        (a - b).abs() <= tol * (1.0 + b.abs()),
                        "{name}: xla {a} vs host {b}"
                    );
                }
            }
        }
        held_by_case
    }

    /// A runtime over the plugin (one chip, a small memory-only cache)
    /// and its default stream.
    fn plugin_runtime() -> (crate::runtime::Runtime, crate::Stream) {
        let p = XlaPlatform::load_with(&find_plugin().unwrap(), 1, None, true).unwrap();
        let rt = crate::runtime::Runtime::with_platform_and_cache(
            p,
            crate::compile::CacheConfig::memory_only(8),
        )
        .unwrap();
        let s = rt.default_stream(0).unwrap();
        (rt, s)
    }

    /// Float max and min reductions and running max and min propagate
    /// NaN as the host and torch do (the plugin's reductions with a bare
    /// maximum dropped it: amax of a row with NaN gave its largest number).
    #[test]
    fn max_and_min_reductions_propagate_nan() {
        use crate::ir::{DType, TensorType};
        use crate::ops::{self, Attr, Attrs};
        use crate::platform::host::kernels::{eval_graph, HostTensor};
        let (rt, s) = plugin_runtime();
        let nan = f64::NAN;
        let v = [1.0, nan, 2.0, 0.0, nan, 5.0, 3.0, -1.0, 4.0, 2.0, 2.0, 0.5];
        for dt in [DType::F32, DType::BF16] {
            let x = HostTensor::from_f64(dt, &[2, 6], &v).unwrap();
            let row = || Attrs::new().with("dim", Attr::Ints(vec![1]));
            let one = || Attrs::new().with("dim", Attr::Int(1));
            for (name, attrs) in [
                ("amax", row()),
                ("amin", row()),
                ("amax", Attrs::new()),
                ("max_dim", one()),
                ("min_dim", one()),
                ("cummax", one()),
                ("cummin", one()),
            ] {
                let op = ops::lookup(name).unwrap();
                let g = ops::build_graph(op, &[TensorType::new(dt, &[2, 6])], &attrs).unwrap();
                let want = eval_graph(&g, std::slice::from_ref(&x)).unwrap();
                let outs = rt
                    .call_op_alloc(op, &[upload(&rt, &s, &x)], &attrs, &s)
                    .unwrap();
                for (o, w) in outs.iter().zip(&want) {
                    let (got, w) = (download(&rt, &s, o).to_f64_vec(), w.to_f64_vec());
                    let same = got
                        .iter()
                        .zip(&w)
                        .all(|(a, b)| a == b || (a.is_nan() && b.is_nan()));
                    assert!(same, "{name} {dt}: xla {got:?}, host {w:?}");
                    assert!(w.iter().any(|b| b.is_nan()) || o.ty().dtype == DType::I64);
                }
            }
        }
    }

    /// Elementwise float maximum and minimum propagate a NaN from either
    /// operand (the XLA CPU plugin's maximum(0, NaN) gave 0), and the ops
    /// built on them (hypot, clamp) follow; fmax and fmin still skip NaN.
    #[test]
    fn elementwise_max_and_min_propagate_nan_from_either_side() {
        use crate::ir::{DType, TensorType};
        use crate::ops::{self, Attrs};
        use crate::platform::host::kernels::{eval_graph, HostTensor};
        let (rt, s) = plugin_runtime();
        let nan = f64::NAN;
        let a = [0.0, 1.0, nan, 2.0, nan, -3.0];
        let b = [nan, nan, 0.0, 1.0, nan, 4.0];
        for dt in [DType::F32, DType::BF16, DType::F64] {
            let (x, y) = (
                HostTensor::from_f64(dt, &[6], &a).unwrap(),
                HostTensor::from_f64(dt, &[6], &b).unwrap(),
            );
            for name in ["maximum", "minimum", "hypot", "fmax", "fmin"] {
                let op = ops::lookup(name).unwrap();
                let ty = TensorType::new(dt, &[6]);
                let g = ops::build_graph(op, &[ty.clone(), ty], &Attrs::new()).unwrap();
                let want = eval_graph(&g, &[x.clone(), y.clone()]).unwrap();
                let outs = rt
                    .call_op_alloc(
                        op,
                        &[upload(&rt, &s, &x), upload(&rt, &s, &y)],
                        &Attrs::new(),
                        &s,
                    )
                    .unwrap();
                let (got, w) = (
                    download(&rt, &s, &outs[0]).to_f64_vec(),
                    want[0].to_f64_vec(),
                );
                let same = got
                    .iter()
                    .zip(&w)
                    .all(|(p, q)| p == q || (p.is_nan() && q.is_nan()));
                assert!(same, "{name} {dt}: xla {got:?}, host {w:?}");
            }
        }
    }

    /// TPURT_XLA_ZERO_COPY: unset or 1 allows zero copy, 0 turns it off,
    /// anything else is an error naming the variable and the value.
    #[test]
    fn the_zero_copy_setting_is_0_or_1() {
        let with = |v: Option<&str>| {
            let v = v.map(std::ffi::OsString::from);
            zero_copy_setting(move |n| {
                assert_eq!(n, "TPURT_XLA_ZERO_COPY");
                v.clone()
            })
        };
        assert!(with(None).unwrap());
        assert!(with(Some("1")).unwrap());
        assert!(!with(Some("0")).unwrap());
        for bad in ["", "yes", " 0"] {
            let e = with(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains(&format!("TPURT_XLA_ZERO_COPY={bad}: expected 0 or 1")),
                "{e}"
            );
        }
    }

    /// XLA_FLAGS and LIBTPU_INIT_ARGS, when set, are the platform's compile
    /// options (and so part of every cache key); unset, the options are
    /// empty and keys stay as they were.
    #[test]
    fn compile_settings_name_the_flags_that_change_compiles() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        assert_eq!(compile_settings(env(&[("PATH", "/bin")])), "");
        let fast = compile_settings(env(&[("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")]));
        assert_eq!(fast, r#"{"XLA_FLAGS":"--xla_cpu_enable_fast_math=true"}"#);
        let dump = compile_settings(env(&[("XLA_FLAGS", "--xla_dump_to=/tmp/d")]));
        assert_ne!(fast, dump);
        let both = compile_settings(env(&[
            ("LIBTPU_INIT_ARGS", "--xla_tpu_megacore=1"),
            ("XLA_FLAGS", "--a"),
        ]));
        assert_eq!(
            both,
            r#"{"LIBTPU_INIT_ARGS":"--xla_tpu_megacore=1","XLA_FLAGS":"--a"}"#
        );
        // What a loaded platform reports is what this process's environment says.
        let p = XlaPlatform::load(&find_plugin().unwrap(), 1).unwrap();
        assert_eq!(
            p.compile_options(),
            compile_settings(|n| std::env::var_os(n))
        );
    }

    /// bf16 and f16 addmm, baddbmm and linear with a bias on xla: one
    /// product of the half operands with an f32 result (not widened to f32
    /// operands at HIGHEST, which a TPU's or GPU's half matrix units would
    /// not take), the bias added in f32 and rounded once: bit for bit the
    /// values `ops::tests` works out.
    #[test]
    fn half_products_take_half_operands_and_round_once() {
        use crate::ops;
        let (_p, rt, s) = cpu_runtime();
        for (name, inputs, attrs, want) in ops::tests::half_products_cases() {
            let types: Vec<_> = inputs.iter().map(|h| h.ty.clone()).collect();
            let g = ops::build_graph(ops::lookup(name).unwrap(), &types, &attrs).unwrap();
            let text = lower::lower(&g).unwrap();
            let half = format!("x{}>", lower::elem(inputs[1].dtype()));
            let dots: Vec<&str> = text.lines().filter(|l| l.contains("dot_general")).collect();
            assert_eq!(dots.len(), 1, "{name}: {text}");
            let (operands, result) = dots[0].rsplit_once("->").unwrap();
            assert!(
                operands.matches(half.as_str()).count() == 2
                    && result.contains("xf32>")
                    && !dots[0].contains("HIGHEST"),
                "{name}: {}",
                dots[0]
            );
            let dev: Vec<DeviceTensor> = inputs.iter().map(|h| upload(&rt, &s, h)).collect();
            let out = rt
                .call_op_alloc(ops::lookup(name).unwrap(), &dev, &attrs, &s)
                .unwrap()
                .remove(0);
            let got = download(&rt, &s, &out);
            assert_eq!(got.to_f64_vec(), want, "{name} {}", inputs[0].ty);
        }
    }

    /// The persistent cache on xla: a second runtime on the same directory
    /// loads the serialized executable (PJRT DeserializeAndLoad) instead of
    /// compiling, and it computes the same result; a damaged entry is
    /// counted and rebuilt; foreign bytes are refused with a clear error.
    #[test]
    fn serialized_executables_come_back_from_the_disk_cache() {
        use crate::compile::CacheConfig;
        use crate::ir::DType;
        use crate::ops::{self, Attr, Attrs};
        let dir = std::env::temp_dir().join(format!(
            "tpurt-xla-cache-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let plugin = find_plugin().unwrap();
        let p = XlaPlatform::load(&plugin, 1).unwrap();
        let softmax = ops::lookup("softmax").unwrap();
        let attrs = Attrs::new().with("dim", Attr::Int(-1));
        let x: Vec<f32> = (0..24).map(|i| (i as f32 * 0.7).sin()).collect();
        let run = |rt: &crate::runtime::Runtime| -> Vec<f32> {
            let s = rt.default_stream(0).unwrap();
            let b = rt.allocate(0, 96, &s).unwrap();
            rt.copy_host_to_device(bytemuck::cast_slice(&x), &b, &crate::Layout::bytes(96), &s)
                .unwrap();
            let t = crate::DeviceTensor::contiguous(b, DType::F32, &[4, 6]).unwrap();
            let out = rt.call_op_alloc(softmax, &[t], &attrs, &s).unwrap();
            let mut y = vec![0u8; 96];
            rt.copy_device_to_host(&out[0].buffer, &crate::Layout::bytes(96), &mut y, &s)
                .unwrap();
            bytemuck::cast_slice(&y).to_vec()
        };
        let fresh = || {
            crate::runtime::Runtime::with_platform_and_cache(
                p.clone(),
                CacheConfig::memory_only(8).with_disk_dir(&dir),
            )
            .unwrap()
        };
        let first = fresh();
        let want = run(&first);
        let st = first.compile_cache_stats();
        assert_eq!((st.misses, st.disk_hits), (1, 0), "{st:?}");
        let entries: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        assert_eq!(entries.len(), 1, "{entries:?}");
        let second = fresh();
        assert_eq!(run(&second), want);
        let st = second.compile_cache_stats();
        assert_eq!((st.misses, st.disk_hits), (0, 1), "{st:?}");
        // Flip a byte inside the plugin's blob: counted, rebuilt, still right.
        let mut bytes = std::fs::read(&entries[0]).unwrap();
        let k = bytes.len() - 100;
        bytes[k] ^= 0x55;
        std::fs::write(&entries[0], &bytes).unwrap();
        let third = fresh();
        assert_eq!(run(&third), want);
        let st = third.compile_cache_stats();
        assert_eq!((st.misses, st.corrupt_entries), (1, 1), "{st:?}");
        // Not ours: a clear error, no call into the plugin.
        let e = p.load_executable(b"junk").err().unwrap().to_string();
        assert!(e.contains("not a serialized xla executable"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A serialized executable carries its index checks (so a program
    /// from the disk cache still refuses out-of-range indices); one framed
    /// before checks existed (version 1) is refused, so the cache rebuilds.
    #[test]
    fn index_checks_survive_serialization() {
        use crate::ir::{DType, TensorType};
        use crate::ops::{self, Attr, Attrs};
        let plugin = find_plugin().unwrap();
        let p = XlaPlatform::load(&plugin, 1).unwrap();
        let g = ops::build_graph(
            ops::lookup("index_select").unwrap(),
            &[
                TensorType::new(DType::F32, &[4, 3]),
                TensorType::new(DType::I64, &[2]),
            ],
            &Attrs::new().with("dim", Attr::Int(0)),
        )
        .unwrap();
        let bytes = p.compile(&g).unwrap().serialize().unwrap();
        let (_, _, checks, _, _) = split_serialized(&bytes).unwrap();
        let want = lower::IndexCheck {
            prim: "take".into(),
            axis: 0,
            bound: 4,
            index_dims: vec![2],
        };
        assert_eq!(checks, vec![want.clone()]);
        assert!(p.load_executable(&bytes).is_ok());
        let mut old = bytes.clone();
        old[..SERIALIZED_MAGIC.len()].copy_from_slice(b"TPURT-XLA-EXE-1\n");
        let e = p.load_executable(&old).err().unwrap().to_string();
        assert!(e.contains("no magic"), "{e}");
        // The check's result read back: in range, or the host's wording.
        assert!(want.error([2, 0]).is_none());
        let e = want.error([1, -7]).unwrap().to_string();
        assert!(
            e.contains("take: index -7 at position [1] is out of range"),
            "{e}"
        );
    }

    /// Modules are compiled with their operations located nowhere: the
    /// executable keeps no line and column of the text as instruction
    /// metadata, so its serialized form is smaller than the same module's
    /// compiled as written, and it loads back. (That it computes the same
    /// is the differential tests' part: every op compiles this way.)
    #[test]
    fn executables_carry_no_source_locations() {
        use crate::ir::{DType, TensorType};
        use crate::ops::{self, Attr, Attrs};
        let plugin = find_plugin().unwrap();
        let p = XlaPlatform::load(&plugin, 1).unwrap();
        let g = ops::build_graph(
            ops::lookup("layer_norm").unwrap(),
            &[TensorType::new(DType::F32, &[16, 64])],
            &Attrs::new().with("normalized_shape", Attr::Ints(vec![64])),
        )
        .unwrap();
        let bare = p.compile(&g).unwrap().serialize().unwrap();
        let slots = output_slots(&g);
        let (text, checks) = lower::lower_aliased(&g, &slots).unwrap();
        let exe = p.compile_located(&text, &text).unwrap();
        let written = XlaExecutable::new(
            p.clone(),
            exe,
            g.param_types(),
            g.output_types(),
            checks,
            slots,
        )
        .serialize()
        .unwrap();
        assert!(
            bare.len() < written.len(),
            "compiled bare: {} bytes, as written: {} bytes",
            bare.len(),
            written.len()
        );
        assert!(p.load_executable(&bare).is_ok());
    }

    /// The child side of `libtpu_fails_cleanly_without_a_tpu`.
    #[test]
    fn libtpu_child_entry() {
        let Some(plugin) = std::env::var_os("TPURT_LIBTPU_CHILD") else {
            return;
        };
        let started = std::time::Instant::now();
        let e = XlaPlatform::load(Path::new(&plugin), 1)
            .unwrap_err()
            .to_string();
        println!("LIBTPU-ERROR ({:?}): {e}", started.elapsed());
    }

    /// libtpu on a machine without a TPU: with TPU_SKIP_MDS_QUERY=1 it fails
    /// at once with a clear error; without it tpurt refuses to load it.
    /// Each runs in a child process killed after 60 s, so a hang fails.
    #[test]
    fn libtpu_fails_cleanly_without_a_tpu() {
        if tpu_device_present() {
            return; // a TPU VM: this test is about machines without one
        }
        let libtpu =
            find_libtpu().expect("libtpu is not in .venv: run scripts/setup (it installs libtpu)");
        let run = |skip_mds: bool| -> String {
            let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
            cmd.args([
                "--exact",
                "platform::xla::tests::libtpu_child_entry",
                "--nocapture",
            ])
            .env("TPURT_LIBTPU_CHILD", &libtpu)
            .env("TPU_NAME", "tpurt-test")
            .env("TPU_WORKER_ID", "0")
            .env("TPU_ACCELERATOR_TYPE", "v5litepod-1")
            .env("TPU_TOPOLOGY", "1x1")
            .env_remove("TPU_SKIP_MDS_QUERY")
            .stdout(std::process::Stdio::piped());
            if skip_mds {
                cmd.env("TPU_SKIP_MDS_QUERY", "1");
            }
            let mut child = cmd.spawn().unwrap();
            let started = std::time::Instant::now();
            loop {
                if let Some(status) = child.try_wait().unwrap() {
                    assert!(status.success(), "the libtpu child failed: {status}");
                    break;
                }
                if started.elapsed() > std::time::Duration::from_secs(60) {
                    let _ = child.kill();
                    panic!("loading libtpu hung for 60 s (skip_mds={skip_mds})");
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let mut out = String::new();
            std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
            out.lines()
                .find(|l| l.starts_with("LIBTPU-ERROR"))
                .unwrap_or_default()
                .to_string()
        };
        let fast = run(true);
        assert!(
            fast.contains("libtpu") && fast.contains("no TPU device"),
            "{fast}"
        );
        let refused = run(false);
        assert!(refused.contains("not loading libtpu"), "{refused}");
    }

    #[test]
    fn a_missing_or_foreign_plugin_is_a_clear_error() {
        let e = XlaPlatform::load(Path::new("/nonexistent/libpjrt.so"), 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot load"), "{e}");
        let e = XlaPlatform::load(Path::new("/lib/x86_64-linux-gnu/libm.so.6"), 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no GetPjrtApi"), "{e}");
    }
}
