//! The `xla` platform: real XLA through a PJRT plugin loaded at run time
//! (the XLA CPU plugin from the xla-cpu-pjrt wheel here, libtpu on TPU VMs,
//! the CUDA plugin on GPUs).
//!
//! This first slice loads a plugin, checks its PJRT API version and the
//! size of its function table, initializes it, creates a client (with
//! full options) and lists its devices. Lowering primitives to StableHLO,
//! compiling and executing come next: until then `compile` says so.
//! Memory is host memory, which the CPU plugin can read in place.
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

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::host::HostSegment;
use super::{DeviceInfo, Executable, Platform, Segment};
use crate::error::{Error, Result};
use crate::ir::Graph;

/// The plugin library's file in a package's install directory.
const KNOWN_PLUGINS: &[&str] = &[
    "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so",
    "libtpu/libtpu.so",
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
        "no PJRT plugin found: set TPURT_PJRT_PLUGIN, or install xla-cpu-pjrt (or libtpu) into the active \
         virtual environment"
            .into(),
    ))
}

pub struct XlaPlatform {
    plugin: PathBuf,
    api: *const sys::PJRT_Api,
    client: *mut sys::PJRT_Client,
    name: String,
    version: (i32, i32),
    topology: Vec<u32>,
    devices: Vec<DeviceInfo>,
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

impl XlaPlatform {
    /// Load `plugin` and create a client with `devices` CPU devices (the
    /// CPU plugin's option; other plugins ignore it).
    pub fn load(plugin: &Path, devices: u32) -> Result<Arc<XlaPlatform>> {
        let shown = plugin.display().to_string();
        let is_libtpu = plugin.to_string_lossy().contains("libtpu");
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
            plugin: plugin.to_path_buf(),
            api,
            client: std::ptr::null_mut(),
            name: String::new(),
            version,
            topology: Vec::new(),
            devices: Vec::new(),
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
        // they do not know (libtpu: "Unexpected option name").
        let is_cpu = plugin
            .file_name()
            .is_some_and(|f| f.to_string_lossy().contains("cpu"));
        let option_name = CString::new("cpu_device_count").unwrap_or_default();
        let mut option = sys::PJRT_NamedValue {
            struct_size: std::mem::size_of::<sys::PJRT_NamedValue>(),
            name: option_name.as_ptr(),
            name_size: option_name.as_bytes().len(),
            type_: sys::PJRT_NamedValue_Type_PJRT_NamedValue_kInt64,
            value_size: 1,
            ..Default::default()
        };
        option.__bindgen_anon_1.int64_value = devices as i64;
        let mut create = args!(PJRT_Client_Create_Args {
            create_options: if is_cpu { &option } else { std::ptr::null() },
            num_options: is_cpu as usize,
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
            })
            .collect();
        Ok(Arc::new(platform))
    }

    pub fn plugin(&self) -> &Path {
        &self.plugin
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
        format!(
            "xla-{}-pjrt{}.{}-{}",
            self.name,
            self.version.0,
            self.version.1,
            self.plugin
                .file_name()
                .map_or(String::new(), |f| f.to_string_lossy().into_owned())
        )
    }

    fn topology(&self) -> &[u32] {
        &self.topology
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn allocate_segment(&self, chip: usize, bytes: u64) -> Result<Segment> {
        if chip >= self.devices.len() {
            return Err(Error::NotFound(format!(
                "chip {chip} (the xla platform has {})",
                self.devices.len()
            )));
        }
        Ok(Arc::new(HostSegment::allocate(bytes)?))
    }

    fn compile(&self, graph: &Graph) -> Result<Arc<dyn Executable>> {
        let _ = graph;
        Err(Error::Unimplemented(
            "the xla platform loads plugins and lists devices; lowering to StableHLO and execution come next".into(),
        ))
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
        let add = crate::ops::lookup("add").unwrap();
        let t = crate::DeviceTensor::contiguous(b, crate::ir::DType::F32, &[4]).unwrap();
        let e = r
            .call_op_alloc(add, &[t.clone(), t], &crate::ops::Attrs::new(), &s)
            .unwrap_err();
        assert!(e.to_string().contains("lowering to StableHLO"), "{e}");
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
