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
    pub num_coords: u32,
    pub coords: [u32; 4],
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
        };
        fill_text(&mut p.name, &info.name);
        fill_text(&mut p.kind, &info.kind);
        for (d, s) in p.coords.iter_mut().zip(&info.coords) {
            *d = *s;
        }
        write_versioned(out, &p, "tpurt_device_properties")
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
