//! Buffers in HBM and the copies between host and device.

use std::ffi::c_void;

use std::sync::Arc;

use tpurt_core::{Buffer, Error, HostDestination, Layout, Result, Runtime, Stream};

use crate::runtime::{
    check_struct_size, out_ptr, runtime_of, tpurt_runtime, versioned_field, BUFFERS, RUNTIMES,
};
use crate::status::{guard, tpurt_status};
use crate::stream::{stream_or_default, tpurt_stream};

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct tpurt_buffer {
    pub handle: u64,
}

/// Where a tensor's elements sit in a buffer. NULL in a copy means "the
/// whole buffer as bytes".
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tpurt_layout {
    pub struct_size: usize,
    /// Byte offset of the first element in the buffer.
    pub offset_bytes: u64,
    /// Number of dimensions, at most TPURT_MAX_DIMS.
    pub ndim: u32,
    /// Bytes per element, 1 to 64.
    pub elem_size: u32,
    /// `ndim` sizes. Borrowed for the call.
    pub sizes: *const u64,
    /// `ndim` strides in elements, or NULL for row-major contiguous. Borrowed for the call.
    pub strides: *const u64,
}

pub const TPURT_MAX_DIMS: u32 = 16;

/// Flag for copies: return at once; the copy runs in stream order. A
/// host-to-device copy stages the source, so it may be reused at once; a
/// device-to-host copy writes `dst` later: keep it valid until the stream
/// (or an event recorded after the copy) is synchronized.
pub const TPURT_COPY_ASYNC: u32 = 1;

pub(crate) fn buffer_of(b: tpurt_buffer) -> Result<(Buffer, u64)> {
    BUFFERS.get(b.handle)
}

/// The buffer, its runtime, and `stream` (zero: the default stream of the
/// buffer's device), checked to belong together.
fn buffer_and_stream(
    b: tpurt_buffer,
    stream: tpurt_stream,
) -> Result<(Buffer, Arc<Runtime>, Stream)> {
    let (buf, owner) = buffer_of(b)?;
    let runtime = RUNTIMES.get(owner)?.0;
    let s = stream_or_default(stream, &runtime, owner, buf.chip())?;
    Ok((buf, runtime, s))
}

fn layout_of(layout: *const tpurt_layout, buffer_len: u64, what: &str) -> Result<Layout> {
    if layout.is_null() {
        return Ok(Layout::bytes(buffer_len));
    }
    // SAFETY: non-null layout is readable for struct_size bytes; its arrays
    // hold `ndim` entries (caller's contract; ndim is bounded first).
    unsafe {
        check_struct_size((*layout).struct_size, "tpurt_layout")?;
        let offset = versioned_field!(layout, tpurt_layout, offset_bytes, 0);
        let ndim = versioned_field!(layout, tpurt_layout, ndim, 0);
        let elem = versioned_field!(layout, tpurt_layout, elem_size, 1);
        let sizes = versioned_field!(layout, tpurt_layout, sizes, std::ptr::null());
        let strides = versioned_field!(layout, tpurt_layout, strides, std::ptr::null());
        if ndim > TPURT_MAX_DIMS {
            return Err(Error::invalid(format!(
                "{what}.ndim is {ndim}; at most {TPURT_MAX_DIMS} dimensions"
            )));
        }
        if ndim > 0 && sizes.is_null() {
            return Err(Error::invalid(format!(
                "{what}.sizes is NULL but ndim is {ndim}"
            )));
        }
        let sizes: Vec<u64> = if ndim == 0 {
            Vec::new()
        } else {
            std::slice::from_raw_parts(sizes, ndim as usize).to_vec()
        };
        let mut l = Layout::contiguous(&sizes, elem as u64);
        l.offset = offset;
        if !strides.is_null() && ndim > 0 {
            l.strides = std::slice::from_raw_parts(strides, ndim as usize).into();
        }
        Ok(l)
    }
}

/// Allocate `size` bytes on `device` from its HBM pool, for use on `stream`
/// (zero handle: the device's default stream).
#[no_mangle]
pub extern "C" fn tpurt_buffer_allocate(
    rt: tpurt_runtime,
    device: u32,
    size: u64,
    stream: tpurt_stream,
    out: *mut tpurt_buffer,
) -> *mut tpurt_status {
    guard(|| {
        let runtime = runtime_of(rt)?;
        let out = out_ptr(out, "out")?;
        let stream = stream_or_default(stream, &runtime, rt.handle, device as usize)?;
        let buffer = runtime.allocate(device as usize, size, &stream)?;
        out.handle = BUFFERS.insert(rt.handle, buffer);
        Ok(())
    })
}

/// Free a buffer. Its memory returns to the pool once queued work that
/// uses it finished (stream-ordered).
#[no_mangle]
pub extern "C" fn tpurt_buffer_free(buffer: tpurt_buffer) -> *mut tpurt_status {
    guard(|| BUFFERS.remove(buffer.handle).map(drop))
}

/// The buffer's size in bytes and its device.
#[no_mangle]
pub extern "C" fn tpurt_buffer_get_info(
    buffer: tpurt_buffer,
    size: *mut u64,
    device: *mut u32,
) -> *mut tpurt_status {
    guard(|| {
        let (b, _) = buffer_of(buffer)?;
        *out_ptr(size, "size")? = b.len();
        *out_ptr(device, "device")? = b.chip() as u32;
        Ok(())
    })
}

/// The buffer's device address: unique among the live buffers of the
/// process, with disjoint ranges, stable for the buffer's life. It names
/// the memory (a frontend may use it as a data pointer, to compare and to
/// offset) and must never be dereferenced.
#[no_mangle]
pub extern "C" fn tpurt_buffer_get_address(
    buffer: tpurt_buffer,
    address: *mut u64,
) -> *mut tpurt_status {
    guard(|| {
        let (b, _) = buffer_of(buffer)?;
        *out_ptr(address, "address")? = b.address();
        Ok(())
    })
}

/// The buffer is also used on `stream`: when freed, its memory is reused
/// only after the work queued there so far finished.
#[no_mangle]
pub extern "C" fn tpurt_buffer_record_stream(
    buffer: tpurt_buffer,
    stream: tpurt_stream,
) -> *mut tpurt_status {
    guard(|| {
        let (b, owner) = buffer_of(buffer)?;
        let runtime = RUNTIMES.get(owner)?.0;
        let s = stream_or_default(stream, &runtime, owner, b.chip())?;
        b.record_stream(&s);
        Ok(())
    })
}

fn check_flags(flags: u32) -> Result<bool> {
    if flags & !TPURT_COPY_ASYNC != 0 {
        return Err(Error::invalid(format!(
            "unknown copy flags {:#x}",
            flags & !TPURT_COPY_ASYNC
        )));
    }
    Ok(flags & TPURT_COPY_ASYNC != 0)
}

fn host_slice<'a>(ptr: *const c_void, len: usize, name: &str) -> Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::invalid(format!(
            "{name} is NULL but its size is {len}"
        )));
    }
    // SAFETY: non-null ptr is readable for len bytes for the call (caller's contract).
    Ok(unsafe { std::slice::from_raw_parts(ptr as *const u8, len) })
}

/// Copy `src_size` host bytes into `dst` at `dst_layout` (NULL: the whole
/// buffer), in order on `stream` (zero: the buffer's device's default stream).
#[no_mangle]
pub extern "C" fn tpurt_copy_host_to_device(
    src: *const c_void,
    src_size: usize,
    dst: tpurt_buffer,
    dst_layout: *const tpurt_layout,
    stream: tpurt_stream,
    flags: u32,
) -> *mut tpurt_status {
    guard(|| {
        let is_async = check_flags(flags)?;
        let (buf, runtime, s) = buffer_and_stream(dst, stream)?;
        let layout = layout_of(dst_layout, buf.len(), "dst_layout")?;
        let bytes = host_slice(src, src_size, "src")?;
        if is_async {
            runtime.copy_host_to_device_async(bytes.to_vec(), &buf, &layout, &s)
        } else {
            runtime.copy_host_to_device(bytes, &buf, &layout, &s)
        }
    })
}

/// Host memory that an asynchronous device-to-host copy fills later.
struct CallerMemory {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the caller promised (TPURT_COPY_ASYNC contract) that the memory
// stays valid and untouched until the stream reaches the copy; only the
// worker thread then writes it.
unsafe impl Send for CallerMemory {}

impl HostDestination for CallerMemory {
    fn len(&self) -> usize {
        self.len
    }
    fn write_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> Result<()>) -> Result<()> {
        if self.len == 0 {
            return fill(&mut []);
        }
        // SAFETY: see `unsafe impl Send`: valid for len bytes, exclusively ours now.
        fill(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }
}

/// Copy `src` at `src_layout` (NULL: the whole buffer) into `dst_size` host
/// bytes. With TPURT_COPY_ASYNC, `dst` is written when the stream gets there.
#[no_mangle]
pub extern "C" fn tpurt_copy_device_to_host(
    src: tpurt_buffer,
    src_layout: *const tpurt_layout,
    dst: *mut c_void,
    dst_size: usize,
    stream: tpurt_stream,
    flags: u32,
) -> *mut tpurt_status {
    guard(|| {
        let is_async = check_flags(flags)?;
        let (buf, runtime, s) = buffer_and_stream(src, stream)?;
        let layout = layout_of(src_layout, buf.len(), "src_layout")?;
        if dst.is_null() && dst_size > 0 {
            return Err(Error::invalid(format!(
                "dst is NULL but its size is {dst_size}"
            )));
        }
        if is_async {
            let memory = Box::new(CallerMemory {
                ptr: dst as *mut u8,
                len: dst_size,
            });
            runtime.copy_device_to_host_async(&buf, &layout, memory, &s)
        } else {
            let out: &mut [u8] = if dst_size == 0 {
                &mut []
            } else {
                // SAFETY: non-null dst is writable for dst_size bytes for the call.
                unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, dst_size) }
            };
            runtime.copy_device_to_host(&buf, &layout, out, &s)
        }
    })
}

/// Copy between buffers, also across devices; the layouts must have the
/// same sizes and element size. A NULL layout on one side means "contiguous
/// from the buffer's start, shaped like the other side"; on both sides, the
/// whole source buffer as bytes. Always queued on `stream` (zero: the
/// destination device's default stream); without TPURT_COPY_ASYNC the call
/// also waits for it.
#[no_mangle]
pub extern "C" fn tpurt_copy_device_to_device(
    src: tpurt_buffer,
    src_layout: *const tpurt_layout,
    dst: tpurt_buffer,
    dst_layout: *const tpurt_layout,
    stream: tpurt_stream,
    flags: u32,
) -> *mut tpurt_status {
    guard(|| {
        let is_async = check_flags(flags)?;
        let (from, owner) = buffer_of(src)?;
        let (to, dst_owner) = buffer_of(dst)?;
        if owner != dst_owner {
            return Err(Error::invalid(
                "the two buffers belong to different runtimes",
            ));
        }
        let runtime = RUNTIMES.get(owner)?.0;
        let s = stream_or_default(stream, &runtime, owner, to.chip())?;
        let (sl, dl) = match (src_layout.is_null(), dst_layout.is_null()) {
            (false, true) => {
                let sl = layout_of(src_layout, from.len(), "src_layout")?;
                let dl = Layout::contiguous(&sl.sizes, sl.elem_size);
                (sl, dl)
            }
            (true, false) => {
                let dl = layout_of(dst_layout, to.len(), "dst_layout")?;
                (Layout::contiguous(&dl.sizes, dl.elem_size), dl)
            }
            _ => (
                layout_of(src_layout, from.len(), "src_layout")?,
                layout_of(dst_layout, to.len(), "dst_layout")?,
            ),
        };
        runtime.copy_device_to_device(&from, &sl, &to, &dl, &s)?;
        if !is_async {
            s.synchronize()?;
        }
        Ok(())
    })
}

/// Set `size` bytes of `buffer` from `offset` to `value`, queued on `stream`.
#[no_mangle]
pub extern "C" fn tpurt_buffer_fill(
    buffer: tpurt_buffer,
    offset: u64,
    size: u64,
    value: u8,
    stream: tpurt_stream,
    flags: u32,
) -> *mut tpurt_status {
    guard(|| {
        let is_async = check_flags(flags)?;
        let (buf, runtime, s) = buffer_and_stream(buffer, stream)?;
        runtime.fill_async(&buf, offset, size, value, &s)?;
        if !is_async {
            s.synchronize()?;
        }
        Ok(())
    })
}
