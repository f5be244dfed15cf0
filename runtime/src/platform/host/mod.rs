//! The `host` platform: an emulated TPU built from host memory and threads.
//!
//! It presents N chips (`TPURT_HOST_CHIPS`, default 4) in a mesh
//! (`TPURT_HOST_TOPOLOGY`, default 2x2), each with its own HBM capacity
//! (`TPURT_HOST_HBM`, default 16 GiB). HBM segments are zeroed host
//! allocations: the OS backs their pages only when they are touched, so a
//! large capacity costs nothing until it is used. Each chip has one
//! TensorCore and one SparseCore queue; the runtime's executors model them.

mod cpu;
pub(crate) mod executable;
pub mod fused;
pub mod kernels;
mod memory;
mod vmath;

pub use executable::HostExecutable;
pub use memory::HostSegment;

use std::sync::Arc;

use super::slice::SliceLayout;
use super::{DeviceInfo, Executable, Platform, Segment};
use crate::error::{Error, Result};
use crate::ir::Graph;

pub const DEFAULT_CHIPS: u32 = 4;
pub const DEFAULT_HBM_BYTES: u64 = 16 << 30;

/// How the emulated TPU looks. `from_env` reads the `TPURT_HOST_*` variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConfig {
    pub chips: u32,
    pub topology: Vec<u32>,
    pub hbm_bytes: u64,
    /// The slice the `TPU_*` variables describe: then `chips` are the
    /// visible ones and `topology` is the slice's.
    pub slice: Option<SliceLayout>,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            chips: DEFAULT_CHIPS,
            topology: vec![2, 2],
            hbm_bytes: DEFAULT_HBM_BYTES,
            slice: None,
        }
    }
}

impl HostConfig {
    /// Build from explicit values, where `None` falls back to the
    /// environment and then to the defaults.
    pub fn resolve(chips: Option<u32>, topology: Option<&str>, hbm: Option<u64>) -> Result<Self> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let chips = match chips {
            Some(c) => Some(c),
            None => env("TPURT_HOST_CHIPS")
                .map(|v| {
                    v.trim().parse::<u32>().map_err(|_| {
                        Error::invalid(format!(
                            "TPURT_HOST_CHIPS={v:?} is not a whole number of chips"
                        ))
                    })
                })
                .transpose()?,
        };
        let topology = match topology {
            Some(t) => Some(parse_topology(t)?),
            None => env("TPURT_HOST_TOPOLOGY")
                .map(|v| parse_topology(&v))
                .transpose()?,
        };
        let hbm_bytes = match hbm {
            Some(b) => b,
            None => match env("TPURT_HOST_HBM") {
                Some(v) => {
                    parse_bytes(&v).map_err(|e| Error::invalid(format!("TPURT_HOST_HBM: {e}")))?
                }
                None => DEFAULT_HBM_BYTES,
            },
        };
        // Read when a big pass first runs; refused here, where it can be.
        fused::host_threads(env("TPURT_HOST_THREADS").as_deref(), 1)?;
        let given = chips.is_some() || topology.is_some();
        let (chips, topology) = match (chips, topology) {
            (None, None) => (DEFAULT_CHIPS, vec![2, 2]),
            (Some(c), None) => (c, default_topology(c)),
            (None, Some(t)) => (t.iter().product(), t),
            (Some(c), Some(t)) => {
                let n: u32 = t.iter().product();
                if n != c {
                    return Err(Error::invalid(format!(
                        "host topology {} has {n} chips but {c} chips were asked for",
                        format_topology(&t)
                    )));
                }
                (c, t)
            }
        };
        // A TPU slice in the environment (TPU_VISIBLE_CHIPS, TPU_TOPOLOGY,
        // ...): the emulated host is one host of it, with `chips` chips
        // when they were given, and this process sees the visible ones.
        let slice = SliceLayout::from_env(given.then_some(chips))?;
        let (chips, topology) = match &slice {
            Some(s) => (s.chips.len() as u32, s.topology.clone()),
            None => (chips, topology),
        };
        if chips == 0 || chips > 1024 {
            return Err(Error::invalid(format!(
                "the host platform takes 1 to 1024 chips, not {chips}"
            )));
        }
        if hbm_bytes < (1 << 20) {
            return Err(Error::invalid(format!(
                "HBM capacity of {hbm_bytes} bytes is below the 1 MiB minimum"
            )));
        }
        Ok(HostConfig {
            chips,
            topology,
            hbm_bytes,
            slice,
        })
    }

    pub fn from_env() -> Result<Self> {
        Self::resolve(None, None, None)
    }
}

/// "2x2", "2x2x1", "4" -> dimensions.
pub fn parse_topology(text: &str) -> Result<Vec<u32>> {
    let dims: Option<Vec<u32>> = text
        .trim()
        .split(['x', 'X'])
        .map(|d| d.trim().parse::<u32>().ok().filter(|&d| d > 0))
        .collect();
    match dims {
        Some(d) if !d.is_empty() && d.len() <= 4 => Ok(d),
        _ => Err(Error::invalid(format!(
            "topology {text:?} is not of the form AxB or AxBxC with positive whole numbers"
        ))),
    }
}

pub fn format_topology(dims: &[u32]) -> String {
    dims.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join("x")
}

/// The most square two-dimensional mesh for `chips` chips: 8 -> 2x4.
pub(crate) fn default_topology(chips: u32) -> Vec<u32> {
    let mut a = (chips as f64).sqrt() as u32;
    while a > 1 && !chips.is_multiple_of(a) {
        a -= 1;
    }
    vec![a.max(1), chips / a.max(1)]
}

/// "16GiB", "16G", "512MiB", "1048576" -> bytes (binary units).
pub fn parse_bytes(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{text:?} is not a size such as 16GiB, 512MiB or 1048576"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => {
            return Err(format!(
                "unknown unit {u:?} in {text:?} (use B, KiB, MiB, GiB or TiB)"
            ))
        }
    };
    let bytes = value * scale as f64;
    if !(0.0..=(u64::MAX as f64)).contains(&bytes) {
        return Err(format!("{text:?} is out of range"));
    }
    Ok(bytes as u64)
}

#[derive(Debug)]
pub struct HostPlatform {
    config: HostConfig,
    devices: Vec<DeviceInfo>,
}

impl HostPlatform {
    pub fn new(config: HostConfig) -> Arc<Self> {
        let devices = (0..config.chips as usize)
            .map(|index| {
                let (coords, host_chip) = match &config.slice {
                    Some(s) => (s.chips[index].coords.clone(), s.chips[index].host_chip),
                    None => (mesh_coords(index as u32, &config.topology), index as u32),
                };
                DeviceInfo {
                    index,
                    name: "tpurt emulated TPU (host)".to_string(),
                    kind: "host-tpu".to_string(),
                    hbm_capacity: config.hbm_bytes,
                    tensor_cores: 1,
                    sparse_cores: 1,
                    coords,
                    host_chip,
                }
            })
            .collect();
        Arc::new(HostPlatform { config, devices })
    }

    pub fn config(&self) -> &HostConfig {
        &self.config
    }
}

/// Row-major coordinates of chip `index` in the mesh, first dimension fastest
/// (as TPU topologies count chips: x, then y, then z).
pub(crate) fn mesh_coords(mut index: u32, dims: &[u32]) -> Vec<u32> {
    dims.iter()
        .map(|&d| {
            let c = index % d;
            index /= d;
            c
        })
        .collect()
}

impl Platform for HostPlatform {
    fn name(&self) -> &str {
        "host"
    }

    fn version(&self) -> String {
        format!("host-{}", env!("CARGO_PKG_VERSION"))
    }

    fn topology(&self) -> &[u32] {
        &self.config.topology
    }

    fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    fn slice(&self) -> Option<&SliceLayout> {
        self.config.slice.as_ref()
    }

    fn allocate_segment(&self, chip: usize, bytes: u64) -> Result<Segment> {
        if chip >= self.devices.len() {
            return Err(Error::NotFound(format!(
                "chip {chip} (the host platform has {} chips)",
                self.devices.len()
            )));
        }
        Ok(Arc::new(HostSegment::allocate(bytes)?))
    }

    fn compile(&self, graph: &Graph) -> Result<Arc<dyn Executable>> {
        // No matrix unit here: reduced-precision products are emulated.
        Ok(Arc::new(HostExecutable::new(crate::ops::expand_precision(
            graph,
        )?)))
    }

    fn load_executable(&self, bytes: &[u8]) -> Result<Arc<dyn Executable>> {
        Ok(Arc::new(HostExecutable::deserialize(
            bytes,
            &self.version(),
        )?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_and_sizes_parse() {
        assert_eq!(parse_topology("2x2").unwrap(), vec![2, 2]);
        assert_eq!(parse_topology("2x4x1").unwrap(), vec![2, 4, 1]);
        assert!(parse_topology("2x0").is_err());
        assert!(parse_topology("two").is_err());
        assert_eq!(parse_bytes("16GiB").unwrap(), 16 << 30);
        assert_eq!(parse_bytes("512m").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("1.5KiB").unwrap(), 1536);
        assert!(parse_bytes("12 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
    }

    #[test]
    fn resolve_checks_chips_against_topology() {
        let c = HostConfig::resolve(Some(8), None, Some(1 << 30)).unwrap();
        assert_eq!(c.topology, vec![2, 4]);
        let c = HostConfig::resolve(None, Some("2x4x1"), Some(1 << 30)).unwrap();
        assert_eq!(c.chips, 8);
        let e = HostConfig::resolve(Some(3), Some("2x2"), Some(1 << 30)).unwrap_err();
        assert!(e.to_string().contains("has 4 chips but 3"), "{e}");
        assert!(HostConfig::resolve(Some(0), None, Some(1 << 30)).is_err());
        assert!(HostConfig::resolve(Some(1), None, Some(10)).is_err());
    }

    #[test]
    fn devices_have_mesh_coordinates() {
        let p = HostPlatform::new(HostConfig::default());
        let coords: Vec<_> = p.devices().iter().map(|d| d.coords.clone()).collect();
        assert_eq!(coords, vec![vec![0, 0], vec![1, 0], vec![0, 1], vec![1, 1]]);
        assert_eq!(p.devices()[3].hbm_capacity, DEFAULT_HBM_BYTES);
    }

    #[test]
    fn a_slice_host_shows_its_visible_chips_with_slice_coordinates() {
        let vars = [
            ("TPU_ACCELERATOR_TYPE", "v4-16"),
            ("TPU_TOPOLOGY", "2x2x2"),
            ("TPU_WORKER_ID", "1"),
            ("TPU_VISIBLE_CHIPS", "1,2"),
        ];
        let slice = SliceLayout::from_pairs(&vars, None).unwrap().unwrap();
        let p = HostPlatform::new(HostConfig {
            chips: slice.chips.len() as u32,
            topology: slice.topology.clone(),
            hbm_bytes: 1 << 30,
            slice: Some(slice),
        });
        assert_eq!(p.topology(), &[2, 2, 2]);
        let d = p.devices();
        assert_eq!(d.len(), 2);
        assert_eq!(
            (d[0].index, d[0].host_chip, d[0].coords.clone()),
            (0, 1, vec![1, 0, 1])
        );
        assert_eq!(
            (d[1].index, d[1].host_chip, d[1].coords.clone()),
            (1, 2, vec![0, 1, 1])
        );
        assert_eq!(p.slice().unwrap().worker_id, 1);
        // Each visible chip is a device with its own HBM.
        assert!(p.allocate_segment(1, 4096).is_ok());
        assert!(p.allocate_segment(2, 4096).is_err());
    }

    #[test]
    fn default_device_list_snapshot() {
        let p = HostPlatform::new(HostConfig::default());
        let json = serde_json::to_string_pretty(p.devices()).unwrap();
        insta::assert_snapshot!("default_host_devices", json);
    }

    #[test]
    fn segments_read_write_copy_and_check_bounds() {
        let p = HostPlatform::new(HostConfig::default());
        let a = p.allocate_segment(0, 4096).unwrap();
        let b = p.allocate_segment(1, 4096).unwrap();
        a.write(100, &[1, 2, 3, 4]).unwrap();
        a.copy_to(100, b.as_ref(), 8, 4).unwrap();
        let mut out = [0u8; 6];
        b.read(7, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3, 4, 0]);
        // Overlapping copy within one segment behaves like memmove.
        a.copy_to(100, a.as_ref(), 102, 4).unwrap();
        let mut out = [0u8; 6];
        a.read(100, &mut out).unwrap();
        assert_eq!(out, [1, 2, 1, 2, 3, 4]);
        a.fill(0, 8, 7).unwrap();
        let mut out = [0u8; 9];
        a.read(0, &mut out).unwrap();
        assert_eq!(out, [7, 7, 7, 7, 7, 7, 7, 7, 0]);
        assert!(a.write(4094, &[0; 3]).is_err());
        assert!(a.read(u64::MAX, &mut [0; 1]).is_err());
        assert!(a.copy_to(0, b.as_ref(), 4000, 200).is_err());
        assert!(p.allocate_segment(9, 4096).is_err());
    }
}
