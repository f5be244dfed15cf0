//! Device enumeration, properties and synchronization.

use std::ffi::c_char;

use crate::runtime::{out_ptr, runtime_of, tpurt_runtime, write_versioned};
use crate::status::{guard, tpurt_status};

/// Properties of one device. Set `struct_size` before the call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tpurt_device_properties {
    pub struct_size: usize,
    pub index: u32,
    /// NUL-terminated, truncated to fit.
    pub name: [c_char; 64],
    /// NUL-terminated, for example "host-tpu".
    pub kind: [c_char; 32],
    pub hbm_capacity_bytes: u64,
    pub tensor_cores: u32,
    pub sparse_cores: u32,
    /// How many entries of `coords` are used (the mesh's dimensions).
    /// In a TPU slice (`tpurt_runtime_slice_info`), the chip's place in
    /// the whole slice.
    pub num_coords: u32,
    pub coords: [u32; 4],
    /// The chip's index on its host (what `TPU_VISIBLE_CHIPS` lists);
    /// `index` when every chip of the host is visible. Since 0.2.
    pub host_chip: u32,
}

/// The TPU slice this process is part of, as the `TPU_*` variables
/// describe it (`TPU_NAME`, `TPU_ACCELERATOR_TYPE`, `TPU_TOPOLOGY`,
/// `TPU_CHIPS_PER_HOST_BOUNDS`, `TPU_HOST_BOUNDS`, `TPU_WORKER_ID`,
/// `TPU_VISIBLE_CHIPS`). Set `struct_size` before the call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tpurt_slice_info {
    pub struct_size: usize,
    /// 1 when the environment describes a slice; 0 when it sets none of the
    /// variables (every other field is then 0 or empty).
    pub in_slice: u32,
    /// This host's index among the slice's hosts (`TPU_WORKER_ID`).
    pub worker_id: u32,
    pub num_hosts: u32,
    /// Chips on this host, visible to this process or not.
    pub host_chips: u32,
    /// Chips this process sees (the runtime's devices).
    pub visible_chips: u32,
    /// How many entries of `topology` are used.
    pub num_dims: u32,
    /// The slice's mesh of chips.
    pub topology: [u32; 4],
    /// Chips per host, x, y, z.
    pub chips_per_host_bounds: [u32; 3],
    /// Hosts in the slice, x, y, z.
    pub host_bounds: [u32; 3],
    /// `TPU_NAME`, NUL-terminated, truncated to fit; empty when unset.
    pub name: [c_char; 64],
    /// `TPU_ACCELERATOR_TYPE` (for example "v4-16"); empty when unset.
    pub accelerator_type: [c_char; 32],
}

fn fill_text<const N: usize>(dst: &mut [c_char; N], text: &str) {
    let n = text.len().min(N - 1);
    for (d, s) in dst.iter_mut().zip(text.as_bytes()[..n].iter()) {
        *d = *s as c_char;
    }
    dst[n] = 0;
}

/// The number of devices.
#[no_mangle]
pub extern "C" fn tpurt_device_count(rt: tpurt_runtime, out: *mut u32) -> *mut tpurt_status {
    guard(|| {
        let runtime = runtime_of(rt)?;
        *out_ptr(out, "out")? = runtime.device_count() as u32;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn tpurt_device_get_properties(
    rt: tpurt_runtime,
    device: u32,
    out: *mut tpurt_device_properties,
) -> *mut tpurt_status {
    guard(|| {
        let runtime = runtime_of(rt)?;
        let info = runtime.device(device as usize)?;
        let mut p = tpurt_device_properties {
            struct_size: std::mem::size_of::<tpurt_device_properties>(),
            index: info.index as u32,
            name: [0; 64],
            kind: [0; 32],
            hbm_capacity_bytes: info.hbm_capacity,
            tensor_cores: info.tensor_cores,
            sparse_cores: info.sparse_cores,
            num_coords: info.coords.len().min(4) as u32,
            coords: [0; 4],
            host_chip: info.host_chip,
        };
        fill_text(&mut p.name, &info.name);
        fill_text(&mut p.kind, &info.kind);
        for (d, s) in p.coords.iter_mut().zip(&info.coords) {
            *d = *s;
        }
        write_versioned(out, &p, "tpurt_device_properties")
    })
}

/// Where this process sits in its TPU slice; `in_slice` is 0 when the
/// environment describes none.
#[no_mangle]
pub extern "C" fn tpurt_runtime_slice_info(
    rt: tpurt_runtime,
    out: *mut tpurt_slice_info,
) -> *mut tpurt_status {
    guard(|| {
        let runtime = runtime_of(rt)?;
        let mut info = tpurt_slice_info {
            struct_size: std::mem::size_of::<tpurt_slice_info>(),
            in_slice: 0,
            worker_id: 0,
            num_hosts: 0,
            host_chips: 0,
            visible_chips: 0,
            num_dims: 0,
            topology: [0; 4],
            chips_per_host_bounds: [0; 3],
            host_bounds: [0; 3],
            name: [0; 64],
            accelerator_type: [0; 32],
        };
        if let Some(s) = runtime.slice() {
            info.in_slice = 1;
            info.worker_id = s.worker_id;
            info.num_hosts = s.num_hosts();
            info.host_chips = s.host_chips;
            info.visible_chips = s.chips.len() as u32;
            info.num_dims = s.topology.len().min(4) as u32;
            for (d, v) in info.topology.iter_mut().zip(&s.topology) {
                *d = *v;
            }
            info.chips_per_host_bounds = s.chips_per_host_bounds;
            info.host_bounds = s.host_bounds;
            fill_text(&mut info.name, s.name.as_deref().unwrap_or(""));
            fill_text(
                &mut info.accelerator_type,
                s.accelerator_type.as_deref().unwrap_or(""),
            );
        }
        write_versioned(out, &info, "tpurt_slice_info")
    })
}

/// Wait for all work on every stream of `device`; the first failure.
#[no_mangle]
pub extern "C" fn tpurt_device_synchronize(rt: tpurt_runtime, device: u32) -> *mut tpurt_status {
    guard(|| {
        let runtime = runtime_of(rt)?;
        runtime.synchronize_device(device as usize)
    })
}
