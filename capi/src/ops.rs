//! Ops, eager modes, whole graphs and the compile cache.

use std::ffi::c_char;
use std::sync::Arc;

use tpurt_core::compile::options as compile_options;
use tpurt_core::compile::BucketPolicy;
use tpurt_core::eager::{self, EagerMode};
use tpurt_core::ir::{DType, Graph, TensorType};
use tpurt_core::ops::{self, Attr, Attrs, OpId};
use tpurt_core::platform::Executable;
use tpurt_core::precision;
use tpurt_core::{DeviceTensor, Error, Result, Runtime};

use crate::buffer::{buffer_of, tpurt_buffer, TPURT_MAX_DIMS};
use crate::handles::{HandleTable, Kind};
use crate::runtime::{
    c_str, check_struct_size, out_ptr, runtime_of, tpurt_runtime, write_versioned, BUFFERS,
    RUNTIMES,
};
use crate::status::{guard, tpurt_status};
use crate::stream::{stream_or_default, tpurt_stream};

pub(crate) static EXECUTABLES: HandleTable<Arc<dyn Executable>> =
    HandleTable::new(Kind::Executable);

pub const TPURT_DTYPE_BOOL: u32 = 0;
pub const TPURT_DTYPE_U8: u32 = 1;
pub const TPURT_DTYPE_I8: u32 = 2;
pub const TPURT_DTYPE_I32: u32 = 3;
pub const TPURT_DTYPE_I64: u32 = 4;
pub const TPURT_DTYPE_F16: u32 = 5;
pub const TPURT_DTYPE_BF16: u32 = 6;
pub const TPURT_DTYPE_F32: u32 = 7;
pub const TPURT_DTYPE_F64: u32 = 8;

pub const TPURT_EAGER_DEFER_NEVER: u32 = 0;
pub const TPURT_EAGER_DEFER_NEVER_AND_LAUNCH_BLOCKING: u32 = 1;
pub const TPURT_EAGER_DEFER_AND_FUSE: u32 = 2;

/// The precision of f32 products (matmul, linear, attention, convolution):
/// DEFAULT multiplies operands rounded to bf16 (a TPU matrix unit's one
/// pass), HIGH three bf16 products (bf16_3x), HIGHEST full f32 (the
/// default, torch's). The host emulates the TPU's rounding; on xla it is
/// XLA's precision config.
pub const TPURT_PRECISION_DEFAULT: u32 = 0;
pub const TPURT_PRECISION_HIGH: u32 = 1;
pub const TPURT_PRECISION_HIGHEST: u32 = 2;

pub const TPURT_BUCKETS_EXACT: u32 = 0;
pub const TPURT_BUCKETS_POWERS_OF_TWO: u32 = 1;
pub const TPURT_BUCKETS_SIZES: u32 = 2;

pub const TPURT_ATTR_NONE: u32 = 0;
pub const TPURT_ATTR_BOOL: u32 = 1;
pub const TPURT_ATTR_INT: u32 = 2;
pub const TPURT_ATTR_FLOAT: u32 = 3;
pub const TPURT_ATTR_INTS: u32 = 4;
pub const TPURT_ATTR_FLOATS: u32 = 5;
pub const TPURT_ATTR_DTYPE: u32 = 6;
pub const TPURT_ATTR_STRING: u32 = 7;

/// A tensor on a device: a buffer and where the elements sit in it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tpurt_tensor {
    pub struct_size: usize,
    pub buffer: tpurt_buffer,
    /// TPURT_DTYPE_*.
    pub dtype: u32,
    pub ndim: u32,
    /// Byte offset of element [0, ...] in the buffer (a multiple of the element size).
    pub offset_bytes: u64,
    /// `ndim` sizes. Borrowed for the call.
    pub sizes: *const u64,
    /// `ndim` strides in elements, or NULL for row-major. Borrowed for the call.
    pub strides: *const u64,
}

/// A tensor's type: what `tpurt_op_infer` reports per output.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tpurt_tensor_type {
    pub dtype: u32,
    pub ndim: u32,
    pub sizes: [u64; 16],
}

/// One op attribute. Set `kind`, then the matching field(s).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tpurt_attr {
    /// NUL-terminated name, borrowed for the call.
    pub name: *const c_char,
    /// TPURT_ATTR_*.
    pub kind: u32,
    /// TPURT_ATTR_BOOL (0 or 1), TPURT_ATTR_INT, TPURT_ATTR_DTYPE (a TPURT_DTYPE_*).
    pub int_value: i64,
    /// TPURT_ATTR_FLOAT.
    pub float_value: f64,
    /// TPURT_ATTR_INTS: `count` values, borrowed for the call.
    pub ints: *const i64,
    /// TPURT_ATTR_FLOATS: `count` values, borrowed for the call.
    pub floats: *const f64,
    pub count: usize,
    /// TPURT_ATTR_STRING: NUL-terminated, borrowed for the call.
    pub string: *const c_char,
}

/// A compiled graph from `tpurt_graph_compile`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct tpurt_executable {
    pub handle: u64,
}

/// Compile-cache counters. Set `struct_size` before the call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct tpurt_compile_cache_stats {
    pub struct_size: usize,
    pub requests: u64,
    pub memory_hits: u64,
    pub disk_hits: u64,
    pub misses: u64,
    pub compile_seconds: f64,
    pub corrupt_entries: u64,
    pub foreign_entries: u64,
    pub evictions: u64,
}

fn dtype_of(code: u32) -> Result<DType> {
    DType::from_code(code)
}

/// `what` names the array in an error; built only when there is one (this
/// is every op launch's path).
fn u64s<'a>(ptr: *const u64, n: usize, what: impl Fn() -> String) -> Result<&'a [u64]> {
    if n == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::invalid(format!(
            "{} is NULL but ndim is {n}",
            what()
        )));
    }
    // SAFETY: non-null and holding n values for the call (caller's contract; n is bounded).
    Ok(unsafe { std::slice::from_raw_parts(ptr, n) })
}

fn slice_of<'a, T>(ptr: *const T, n: usize, what: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::invalid(format!(
            "{what} is NULL but its count is {n}"
        )));
    }
    if n > 1 << 20 {
        return Err(Error::invalid(format!("{what}: count {n} is too large")));
    }
    // SAFETY: non-null, n elements readable for the call (caller's contract).
    Ok(unsafe { std::slice::from_raw_parts(ptr, n) })
}

/// Prefix an argument error with where it was found, once.
fn within(what: &str) -> impl Fn(Error) -> Error + '_ {
    within_lazy(move || what.to_string())
}

/// Prefix an argument error with where it was found (named lazily).
fn within_lazy(what: impl Fn() -> String) -> impl Fn(Error) -> Error {
    move |e| match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{}: {m}", what())),
        Error::InvalidHandle(m) => Error::InvalidHandle(format!("{}: {m}", what())),
        other => other,
    }
}

fn tensor_of(t: &tpurt_tensor, owner: u64, list: &str, i: usize) -> Result<DeviceTensor> {
    let what = || format!("{list}[{i}]");
    check_struct_size(t.struct_size, "tpurt_tensor")?;
    if t.ndim > TPURT_MAX_DIMS {
        return Err(Error::invalid(format!(
            "{}: ndim {} exceeds {TPURT_MAX_DIMS}",
            what(),
            t.ndim
        )));
    }
    let (buffer, b_owner) = buffer_of(t.buffer).map_err(within_lazy(what))?;
    if b_owner != owner {
        return Err(Error::invalid(format!(
            "{}: the buffer belongs to a different runtime",
            what()
        )));
    }
    let dtype = dtype_of(t.dtype).map_err(within_lazy(what))?;
    let sizes = u64s(t.sizes, t.ndim as usize, || format!("{}.sizes", what()))?;
    let strides = if t.strides.is_null() {
        None
    } else {
        Some(u64s(t.strides, t.ndim as usize, || {
            format!("{}.strides", what())
        })?)
    };
    DeviceTensor::new(buffer, dtype, t.offset_bytes, sizes, strides).map_err(within_lazy(what))
}

fn tensors_of(
    ptr: *const tpurt_tensor,
    n: usize,
    owner: u64,
    what: &str,
) -> Result<Vec<DeviceTensor>> {
    slice_of(ptr, n, what)?
        .iter()
        .enumerate()
        .map(|(i, t)| tensor_of(t, owner, what, i))
        .collect()
}

fn attrs_of(ptr: *const tpurt_attr, n: usize) -> Result<Attrs> {
    let mut attrs = Attrs::new();
    for (i, a) in slice_of(ptr, n, "attrs")?.iter().enumerate() {
        let name = c_str(a.name, &format!("attrs[{i}].name"))?
            .ok_or_else(|| Error::invalid(format!("attrs[{i}].name is NULL")))?;
        let value = match a.kind {
            TPURT_ATTR_NONE => Attr::None,
            TPURT_ATTR_BOOL => Attr::Bool(a.int_value != 0),
            TPURT_ATTR_INT => Attr::Int(a.int_value),
            TPURT_ATTR_FLOAT => Attr::Float(a.float_value),
            TPURT_ATTR_INTS => Attr::Ints(
                slice_of(a.ints, a.count, &format!("attrs[{i}] ({name}).ints"))?.to_vec(),
            ),
            TPURT_ATTR_FLOATS => Attr::Floats(
                slice_of(a.floats, a.count, &format!("attrs[{i}] ({name}).floats"))?.to_vec(),
            ),
            TPURT_ATTR_DTYPE => Attr::DType(
                u32::try_from(a.int_value)
                    .map_err(|_| {
                        Error::invalid(format!("attrs[{i}] ({name}): dtype {}", a.int_value))
                    })
                    .and_then(dtype_of)?,
            ),
            TPURT_ATTR_STRING => Attr::Str(
                c_str(a.string, &format!("attrs[{i}] ({name}).string"))?
                    .ok_or_else(|| Error::invalid(format!("attrs[{i}] ({name}).string is NULL")))?,
            ),
            other => {
                return Err(Error::invalid(format!(
                    "attrs[{i}] ({name}): unknown kind {other}"
                )))
            }
        };
        attrs.set(&name, value);
    }
    Ok(attrs)
}

/// The id of the op named `name` (for example "add", "softmax").
#[no_mangle]
pub extern "C" fn tpurt_op_lookup(name: *const c_char, op_id: *mut u32) -> *mut tpurt_status {
    guard(|| {
        let out = out_ptr(op_id, "op_id")?;
        let name = c_str(name, "name")?.ok_or_else(|| Error::invalid("name is NULL"))?;
        *out = ops::lookup(&name)?.0;
        Ok(())
    })
}

/// Whether op `op` (an id) reads the precision of f32 products in force when it
/// is called (`tpurt_matmul_precision_set`): its graphs may hold products.
/// A frontend that follows its framework's precision setting need only pass
/// it on before these ops.
#[no_mangle]
pub extern "C" fn tpurt_op_reads_precision(op: u32, reads: *mut bool) -> *mut tpurt_status {
    guard(|| {
        let out = out_ptr(reads, "reads")?;
        *out = ops::reads_precision(op_id(op)?);
        Ok(())
    })
}

fn op_id(id: u32) -> Result<OpId> {
    let n = ops::op_count() as u32;
    if id >= n {
        return Err(Error::NotFound(format!("op id {id} (there are {n} ops)")));
    }
    Ok(OpId(id))
}

/// The output types of an op for inputs of these types (so a frontend can
/// allocate outputs). `inputs` carry types only: their buffers are ignored.
#[no_mangle]
pub extern "C" fn tpurt_op_infer(
    op: u32,
    inputs: *const tpurt_tensor_type,
    num_inputs: usize,
    attrs: *const tpurt_attr,
    num_attrs: usize,
    outputs: *mut tpurt_tensor_type,
    capacity: usize,
    num_outputs: *mut usize,
) -> *mut tpurt_status {
    guard(|| {
        let op = op_id(op)?;
        let count = out_ptr(num_outputs, "num_outputs")?;
        let types = slice_of(inputs, num_inputs, "inputs")?
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if t.ndim > TPURT_MAX_DIMS {
                    return Err(Error::invalid(format!(
                        "inputs[{i}]: ndim {} exceeds {TPURT_MAX_DIMS}",
                        t.ndim
                    )));
                }
                Ok(TensorType::new(
                    dtype_of(t.dtype)?,
                    &t.sizes[..t.ndim as usize],
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let outs = ops::infer_outputs(op, &types, &attrs_of(attrs, num_attrs)?)?;
        *count = outs.len();
        if capacity < outs.len() || (outputs.is_null() && !outs.is_empty()) {
            return Err(Error::invalid(format!(
                "outputs holds {capacity} entries; {} needs {}",
                ops::op_name(op),
                outs.len()
            )));
        }
        for (i, t) in outs.iter().enumerate() {
            if t.rank() > TPURT_MAX_DIMS as usize {
                return Err(Error::invalid(format!(
                    "output {i} has rank {} > {TPURT_MAX_DIMS}",
                    t.rank()
                )));
            }
            let mut c = tpurt_tensor_type {
                dtype: t.dtype as u32,
                ndim: t.rank() as u32,
                sizes: [0; 16],
            };
            c.sizes[..t.rank()].copy_from_slice(&t.dims);
            // SAFETY: outputs holds `capacity` >= outs.len() entries (checked above).
            unsafe { *outputs.add(i) = c };
        }
        Ok(())
    })
}

/// Run op `op` on `stream` (zero: the default stream of the first
/// tensor's device), writing `outputs`, whose types must be the op's
/// result types. Strict mode returns once queued; debug mode waits.
#[no_mangle]
pub extern "C" fn tpurt_op_launch(
    rt: tpurt_runtime,
    op: u32,
    inputs: *const tpurt_tensor,
    num_inputs: usize,
    outputs: *const tpurt_tensor,
    num_outputs: usize,
    attrs: *const tpurt_attr,
    num_attrs: usize,
    stream: tpurt_stream,
) -> *mut tpurt_status {
    guard(|| {
        let runtime = runtime_of(rt)?;
        let op = op_id(op)?;
        let name = ops::op_name(op);
        let ins = tensors_of(inputs, num_inputs, rt.handle, "inputs").map_err(within(name))?;
        let outs = tensors_of(outputs, num_outputs, rt.handle, "outputs").map_err(within(name))?;
        let attrs = attrs_of(attrs, num_attrs).map_err(within(name))?;
        let device = outs.first().or(ins.first()).map_or(0, |t| t.buffer.chip());
        let s = stream_or_default(stream, &runtime, rt.handle, device)?;
        runtime.call_op(op, &ins, &outs, &attrs, &s)
    })
}

/// Run op `op` with its outputs allocated (contiguous) from the pool of
/// `device` (the inputs' device), on `stream` (zero: that device's default
/// stream): one call instead of infer, allocate and launch. The outputs
/// come back as new buffers in `out_buffers` (each the caller's, freed with
/// `tpurt_buffer_free`), their types in `out_types` and their device
/// addresses (see `tpurt_buffer_get_address`) in `out_addresses` (may be
/// NULL), each of `capacity` entries; `*num_outputs` gets the count. Too
/// small a capacity is an error before anything runs.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn tpurt_op_call(
    rt: tpurt_runtime,
    op: u32,
    inputs: *const tpurt_tensor,
    num_inputs: usize,
    attrs: *const tpurt_attr,
    num_attrs: usize,
    device: u32,
    stream: tpurt_stream,
    out_buffers: *mut tpurt_buffer,
    out_types: *mut tpurt_tensor_type,
    out_addresses: *mut u64,
    capacity: usize,
    num_outputs: *mut usize,
) -> *mut tpurt_status {
    guard(|| {
        let runtime = runtime_of(rt)?;
        let op = op_id(op)?;
        let name = ops::op_name(op);
        let count = out_ptr(num_outputs, "num_outputs")?;
        let ins = tensors_of(inputs, num_inputs, rt.handle, "inputs").map_err(within(name))?;
        let attrs = attrs_of(attrs, num_attrs).map_err(within(name))?;
        let device = device as usize;
        runtime.device(device)?;
        let s = stream_or_default(stream, &runtime, rt.handle, device)?;
        let room = if out_buffers.is_null() || out_types.is_null() {
            0
        } else {
            capacity
        };
        let outs = runtime.call_op_alloc_at_most(op, &ins, &attrs, &s, room)?;
        *count = outs.len();
        for (i, t) in outs.into_iter().enumerate() {
            let rank = t.dims().len();
            if rank > TPURT_MAX_DIMS as usize {
                return Err(Error::invalid(format!(
                    "{name}: output {i} has rank {rank} > {TPURT_MAX_DIMS}"
                )));
            }
            let mut ty = tpurt_tensor_type {
                dtype: t.dtype as u32,
                ndim: rank as u32,
                sizes: [0; 16],
            };
            ty.sizes[..rank].copy_from_slice(t.dims());
            let address = t.buffer.address();
            let handle = BUFFERS.insert(rt.handle, t.buffer);
            // SAFETY: the arrays hold `capacity` >= the output count entries
            // (call_op_alloc_at_most checked it); out_addresses may be NULL.
            unsafe {
                *out_types.add(i) = ty;
                *out_buffers.add(i) = tpurt_buffer { handle };
                if !out_addresses.is_null() {
                    *out_addresses.add(i) = address;
                }
            }
        }
        Ok(())
    })
}

/// Compile a whole graph given in its canonical JSON form (see
/// runtime/src/ir/graph.rs), through the compile cache.
#[no_mangle]
pub extern "C" fn tpurt_graph_compile(
    rt: tpurt_runtime,
    canonical_json: *const c_char,
    out: *mut tpurt_executable,
) -> *mut tpurt_status {
    guard(|| {
        let runtime = runtime_of(rt)?;
        let out = out_ptr(out, "out")?;
        let text = c_str(canonical_json, "canonical_json")?
            .ok_or_else(|| Error::invalid("canonical_json is NULL"))?;
        let graph = Graph::from_canonical(&text)?;
        let exe = runtime.compile(&graph)?;
        out.handle = EXECUTABLES.insert(rt.handle, exe);
        Ok(())
    })
}

/// Run a compiled graph on `stream` (zero: the default stream of the first
/// tensor's device).
#[no_mangle]
pub extern "C" fn tpurt_executable_run(
    exe: tpurt_executable,
    inputs: *const tpurt_tensor,
    num_inputs: usize,
    outputs: *const tpurt_tensor,
    num_outputs: usize,
    stream: tpurt_stream,
) -> *mut tpurt_status {
    guard(|| {
        let (exe, owner) = EXECUTABLES.get(exe.handle)?;
        let runtime: Arc<Runtime> = RUNTIMES.get(owner)?.0;
        let ins = tensors_of(inputs, num_inputs, owner, "inputs")?;
        let outs = tensors_of(outputs, num_outputs, owner, "outputs")?;
        let device = outs.first().or(ins.first()).map_or(0, |t| t.buffer.chip());
        let s = stream_or_default(stream, &runtime, owner, device)?;
        runtime.launch(exe, &ins, &outs, &s, "graph")
    })
}

#[no_mangle]
pub extern "C" fn tpurt_executable_destroy(exe: tpurt_executable) -> *mut tpurt_status {
    guard(|| EXECUTABLES.remove(exe.handle).map(drop))
}

/// The eager mode in force on the calling thread (TPURT_EAGER_*).
#[no_mangle]
pub extern "C" fn tpurt_eager_mode_get(mode: *mut u32) -> *mut tpurt_status {
    guard(|| {
        *out_ptr(mode, "mode")? = eager::current_mode() as u32;
        Ok(())
    })
}

/// Set the process-wide eager mode.
#[no_mangle]
pub extern "C" fn tpurt_eager_mode_set(mode: u32) -> *mut tpurt_status {
    guard(|| eager::set_global_mode(EagerMode::from_code(mode)?))
}

/// Push a mode for the calling thread; pop it with `tpurt_eager_mode_pop`.
#[no_mangle]
pub extern "C" fn tpurt_eager_mode_push(mode: u32) -> *mut tpurt_status {
    guard(|| eager::push_mode(EagerMode::from_code(mode)?))
}

/// Pop the calling thread's innermost pushed mode; `*popped` (may be NULL) gets it.
#[no_mangle]
pub extern "C" fn tpurt_eager_mode_pop(popped: *mut u32) -> *mut tpurt_status {
    guard(|| {
        let m = eager::pop_mode()?;
        if !popped.is_null() {
            *out_ptr(popped, "popped")? = m as u32;
        }
        Ok(())
    })
}

/// The precision of f32 products in force on the calling thread
/// (TPURT_PRECISION_*); an op takes the one in force when it is called.
#[no_mangle]
pub extern "C" fn tpurt_matmul_precision_get(precision: *mut u32) -> *mut tpurt_status {
    guard(|| {
        *out_ptr(precision, "precision")? = precision::current() as u32;
        Ok(())
    })
}

/// Set the process-wide precision of f32 products.
#[no_mangle]
pub extern "C" fn tpurt_matmul_precision_set(precision: u32) -> *mut tpurt_status {
    guard(|| {
        precision::set_global(precision::from_code(precision)?);
        Ok(())
    })
}

/// Push a precision for the calling thread; pop it with
/// `tpurt_matmul_precision_pop`.
#[no_mangle]
pub extern "C" fn tpurt_matmul_precision_push(precision: u32) -> *mut tpurt_status {
    guard(|| {
        precision::push(precision::from_code(precision)?);
        Ok(())
    })
}

/// Pop the calling thread's innermost pushed precision; `*popped` (may be
/// NULL) gets it.
#[no_mangle]
pub extern "C" fn tpurt_matmul_precision_pop(popped: *mut u32) -> *mut tpurt_status {
    guard(|| {
        let p = precision::pop()?;
        if !popped.is_null() {
            *out_ptr(popped, "popped")? = p as u32;
        }
        Ok(())
    })
}

/// Set the compiler options of every program compiled from now on, process
/// wide: a JSON object of names to booleans, numbers or strings (on xla,
/// XLA debug options by name, such as `xla_allow_excess_precision`; the
/// host ignores them). NULL, "" or "{}" clears them. They join every
/// compile-cache key. Ops recorded under defer-and-fuse compile when their
/// stream flushes: flush first (`tpurt_stream_flush`) for the options in
/// force when they were recorded.
#[no_mangle]
pub extern "C" fn tpurt_compiler_options_set(json: *const c_char) -> *mut tpurt_status {
    guard(|| {
        let text = c_str(json, "json")?.unwrap_or_default();
        let options = if text.trim().is_empty() {
            Default::default()
        } else {
            compile_options::parse_json(&text)?
        };
        compile_options::set(options);
        Ok(())
    })
}

/// The compiler options set now, as a JSON object ("{}" for none); free
/// `*json` with `tpurt_string_free`.
#[no_mangle]
pub extern "C" fn tpurt_compiler_options_get(json: *mut *mut c_char) -> *mut tpurt_status {
    guard(|| {
        let out = out_ptr(json, "json")?;
        let text = match compile_options::canonical() {
            t if t.is_empty() => "{}".to_string(),
            t => t,
        };
        *out = std::ffi::CString::new(text).unwrap_or_default().into_raw();
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn tpurt_compile_cache_get_stats(
    rt: tpurt_runtime,
    out: *mut tpurt_compile_cache_stats,
) -> *mut tpurt_status {
    guard(|| {
        let s = runtime_of(rt)?.compile_cache_stats();
        let c = tpurt_compile_cache_stats {
            struct_size: std::mem::size_of::<tpurt_compile_cache_stats>(),
            requests: s.requests,
            memory_hits: s.memory_hits,
            disk_hits: s.disk_hits,
            misses: s.misses,
            compile_seconds: s.compile_seconds,
            corrupt_entries: s.corrupt_entries,
            foreign_entries: s.foreign_entries,
            evictions: s.evictions,
        };
        write_versioned(out, &c, "tpurt_compile_cache_stats")
    })
}

/// Empty the in-memory and/or on-disk compile cache.
#[no_mangle]
pub extern "C" fn tpurt_compile_cache_clear(
    rt: tpurt_runtime,
    memory: bool,
    disk: bool,
) -> *mut tpurt_status {
    guard(|| runtime_of(rt)?.compile_cache().clear(memory, disk))
}

/// When on, a compile-cache miss is an error that names the graph.
#[no_mangle]
pub extern "C" fn tpurt_compile_cache_set_cache_only(
    rt: tpurt_runtime,
    on: bool,
) -> *mut tpurt_status {
    guard(|| {
        runtime_of(rt)?.compile_cache().set_cache_only(on);
        Ok(())
    })
}

/// Write each missed graph's text into `dir` (NULL: stop).
#[no_mangle]
pub extern "C" fn tpurt_compile_cache_set_dump_on_miss(
    rt: tpurt_runtime,
    dir: *const c_char,
) -> *mut tpurt_status {
    guard(|| {
        let dir = c_str(dir, "dir")?.map(std::path::PathBuf::from);
        runtime_of(rt)?.compile_cache().set_dump_on_miss(dir);
        Ok(())
    })
}

/// Set the shape-bucket policy that dynamic dimensions are padded by:
/// `TPURT_BUCKETS_EXACT` (no padding; `sizes` unused),
/// `TPURT_BUCKETS_POWERS_OF_TWO` (powers of two from `sizes[0]`, or from 8
/// when `count` is 0) or `TPURT_BUCKETS_SIZES` (the `count` sizes in
/// `sizes`, beyond the largest its multiples).
#[no_mangle]
pub extern "C" fn tpurt_compile_cache_set_buckets(
    rt: tpurt_runtime,
    kind: u32,
    sizes: *const u64,
    count: usize,
) -> *mut tpurt_status {
    guard(|| {
        let sizes = slice_of(sizes, count, "sizes")?;
        let policy = match kind {
            TPURT_BUCKETS_EXACT => BucketPolicy::Exact,
            TPURT_BUCKETS_POWERS_OF_TWO => match sizes {
                [] => BucketPolicy::default(),
                [0] => return Err(Error::invalid("bucket minimum must be at least 1")),
                [min] => BucketPolicy::powers_of_two(*min),
                _ => {
                    return Err(Error::invalid(format!(
                        "powers-of-two buckets take one size (the minimum), not {count}"
                    )))
                }
            },
            TPURT_BUCKETS_SIZES => BucketPolicy::sizes(sizes.to_vec())?,
            other => {
                return Err(Error::invalid(format!(
                    "bucket kind {other}; the kinds are TPURT_BUCKETS_EXACT (0), \
                     TPURT_BUCKETS_POWERS_OF_TWO (1) and TPURT_BUCKETS_SIZES (2)"
                )))
            }
        };
        runtime_of(rt)?.compile_cache().set_bucket_policy(policy);
        Ok(())
    })
}

/// The bucket a dynamic dimension of size `n` is padded up to under the
/// current policy (`n` itself when the policy is exact; 0 for 0).
#[no_mangle]
pub extern "C" fn tpurt_compile_cache_bucket(
    rt: tpurt_runtime,
    n: u64,
    out: *mut u64,
) -> *mut tpurt_status {
    guard(|| {
        let b = runtime_of(rt)?.compile_cache().bucket(n);
        *out_ptr(out, "out")? = b;
        Ok(())
    })
}
