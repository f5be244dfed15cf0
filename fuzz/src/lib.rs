//! What the fuzz targets share: the byte format of an op-call input (so
//! seeds can be written from real calls), its decoder, and the runner that
//! makes the calls through the C ABI against real buffers.
//!
//! An op-call input is a mode byte, then records until the bytes run out:
//!
//! ```text
//! op:      u8 n, then n name bytes (n = 0: u8 index into the op list)
//! inputs:  u8 count (at most 6), each
//!          u8 buffer (index into the runner's buffers; out of range: a
//!             stale handle), u8 dtype, u8 ndim (at most 5), ndim u8 sizes,
//!          u16 byte offset, u8 strided, and if strided ndim i8 strides
//! attrs:   u8 count (at most 6), each
//!          u8 n + n name bytes, u8 kind, then by kind
//!          int/bool/dtype: i64; float: f64; ints: u8 n + n i64;
//!          floats: u8 n + n f64; string: u8 n + n bytes
//! ```
//!
//! Integers are little-endian. Attribute integers are folded into -16..=64
//! so that sizes stay small: the targets look for logic errors, not for
//! what a huge allocation does (the pool refuses those with an error).

use std::ffi::CString;

use tpurt::*;

pub struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data }
    }
    pub fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.data.split_first()?;
        self.data = rest;
        Some(b)
    }
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.data.len() < n {
            return None;
        }
        let (a, b) = self.data.split_at(n);
        self.data = b;
        Some(a)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.bytes(N).map(|b| b.try_into().unwrap_or([0; N]))
    }
    pub fn i64(&mut self) -> Option<i64> {
        self.array::<8>().map(i64::from_le_bytes)
    }
    pub fn f64(&mut self) -> Option<f64> {
        self.array::<8>().map(f64::from_le_bytes)
    }
    pub fn u16(&mut self) -> Option<u16> {
        self.array::<2>().map(u16::from_le_bytes)
    }
}

#[derive(Clone, Debug)]
pub enum OpName {
    Name(String),
    Index(u8),
}

#[derive(Clone, Debug)]
pub struct Input {
    pub buffer: u8,
    pub dtype: u8,
    pub sizes: Vec<u8>,
    pub offset: u16,
    pub strides: Option<Vec<i8>>,
}

#[derive(Clone, Debug)]
pub enum Value {
    Int(u32, i64),
    Float(f64),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    Str(String),
    /// Any other kind byte: passed through as is.
    Other(u32),
}

#[derive(Clone, Debug)]
pub struct Attr {
    pub name: String,
    pub value: Value,
}

#[derive(Clone, Debug)]
pub struct Call {
    pub op: OpName,
    pub inputs: Vec<Input>,
    pub attrs: Vec<Attr>,
}

fn fold(v: i64) -> i64 {
    v.rem_euclid(81) - 16
}

fn string(r: &mut Reader) -> Option<String> {
    let n = r.u8()? as usize;
    Some(String::from_utf8_lossy(r.bytes(n)?).into_owned())
}

pub fn decode(data: &[u8]) -> (u8, Vec<Call>) {
    let mut r = Reader::new(data);
    let mode = r.u8().unwrap_or(0);
    let mut calls = Vec::new();
    while let Some(c) = decode_call(&mut r) {
        calls.push(c);
        if calls.len() >= 8 {
            break;
        }
    }
    (mode, calls)
}

fn decode_call(r: &mut Reader) -> Option<Call> {
    let n = r.u8()? as usize;
    let op = if n == 0 {
        OpName::Index(r.u8()?)
    } else {
        OpName::Name(String::from_utf8_lossy(r.bytes(n)?).into_owned())
    };
    let mut inputs = Vec::new();
    for _ in 0..(r.u8()? % 7) {
        let buffer = r.u8()?;
        let dtype = r.u8()?;
        let ndim = (r.u8()? % 6) as usize;
        let sizes = r.bytes(ndim)?.to_vec();
        let offset = r.u16()?;
        let strides = if r.u8()? & 1 == 1 {
            Some(r.bytes(ndim)?.iter().map(|&b| b as i8).collect())
        } else {
            None
        };
        inputs.push(Input {
            buffer,
            dtype,
            sizes,
            offset,
            strides,
        });
    }
    let mut attrs = Vec::new();
    for _ in 0..(r.u8()? % 7) {
        let name = string(r)?;
        let kind = r.u8()? as u32;
        let value = match kind {
            TPURT_ATTR_BOOL | TPURT_ATTR_INT | TPURT_ATTR_DTYPE => Value::Int(kind, fold(r.i64()?)),
            TPURT_ATTR_FLOAT => Value::Float(r.f64()?),
            TPURT_ATTR_INTS => {
                let n = (r.u8()? % 9) as usize;
                Value::Ints((0..n).map(|_| r.i64().map(fold)).collect::<Option<_>>()?)
            }
            TPURT_ATTR_FLOATS => {
                let n = (r.u8()? % 9) as usize;
                Value::Floats((0..n).map(|_| r.f64()).collect::<Option<_>>()?)
            }
            TPURT_ATTR_STRING => Value::Str(string(r)?),
            other => Value::Other(other),
        };
        attrs.push(Attr { name, value });
    }
    Some(Call { op, inputs, attrs })
}

/// The inverse of `decode` (for seeds).
pub fn encode(mode: u8, calls: &[Call]) -> Vec<u8> {
    let mut out = vec![mode];
    let s = |out: &mut Vec<u8>, v: &str| {
        out.push(v.len() as u8);
        out.extend_from_slice(v.as_bytes());
    };
    for c in calls {
        match &c.op {
            OpName::Name(n) => s(&mut out, n),
            OpName::Index(i) => out.extend_from_slice(&[0, *i]),
        }
        out.push(c.inputs.len() as u8);
        for i in &c.inputs {
            out.extend_from_slice(&[i.buffer, i.dtype, i.sizes.len() as u8]);
            out.extend_from_slice(&i.sizes);
            out.extend_from_slice(&i.offset.to_le_bytes());
            match &i.strides {
                None => out.push(0),
                Some(st) => {
                    out.push(1);
                    out.extend(st.iter().map(|&v| v as u8));
                }
            }
        }
        out.push(c.attrs.len() as u8);
        for a in &c.attrs {
            s(&mut out, &a.name);
            match &a.value {
                Value::Int(kind, v) => {
                    out.push(*kind as u8);
                    out.extend_from_slice(&(v + 16).to_le_bytes());
                }
                Value::Float(v) => {
                    out.push(TPURT_ATTR_FLOAT as u8);
                    out.extend_from_slice(&v.to_le_bytes());
                }
                Value::Ints(v) => {
                    out.push(TPURT_ATTR_INTS as u8);
                    out.push(v.len() as u8);
                    for x in v {
                        out.extend_from_slice(&(x + 16).to_le_bytes());
                    }
                }
                Value::Floats(v) => {
                    out.push(TPURT_ATTR_FLOATS as u8);
                    out.push(v.len() as u8);
                    for x in v {
                        out.extend_from_slice(&x.to_le_bytes());
                    }
                }
                Value::Str(v) => {
                    out.push(TPURT_ATTR_STRING as u8);
                    s(&mut out, v);
                }
                Value::Other(k) => out.push(*k as u8),
            }
        }
    }
    out
}

/// A status: true when OK; an error status is destroyed.
pub fn ok(s: *mut tpurt_status) -> bool {
    if s.is_null() {
        return true;
    }
    tpurt_status_destroy(s);
    false
}

/// One host runtime, a stream and real buffers, kept for the whole run.
pub struct Runner {
    pub rt: tpurt_runtime,
    pub stream: tpurt_stream,
    pub buffers: Vec<tpurt_buffer>,
    pub names: Vec<&'static str>,
}

pub const BUFFER_BYTES: [u64; 4] = [0, 64, 4096, 65536];

impl Runner {
    pub fn new() -> Runner {
        let platform = CString::new("host").unwrap();
        let off = CString::new("off").unwrap();
        let opts = tpurt_runtime_options {
            struct_size: std::mem::size_of::<tpurt_runtime_options>(),
            platform: platform.as_ptr(),
            host_chips: 1,
            host_topology: std::ptr::null(),
            host_hbm_bytes: 256 << 20,
            compile_cache_dir: off.as_ptr(),
        };
        let mut rt = tpurt_runtime { handle: 0 };
        assert!(ok(tpurt_runtime_create(&opts, &mut rt)));
        let mut stream = tpurt_stream { handle: 0 };
        assert!(ok(tpurt_stream_create(
            rt,
            0,
            std::ptr::null(),
            &mut stream
        )));
        let mut buffers = Vec::new();
        for (k, &bytes) in BUFFER_BYTES.iter().enumerate() {
            let mut b = tpurt_buffer { handle: 0 };
            assert!(ok(tpurt_buffer_allocate(rt, 0, bytes, stream, &mut b)));
            // Zeros (valid indices in every dtype), then ordinary floats,
            // then NaN and -1 in every integer dtype.
            let fill = [0u8, 0, 0x3F, 0xFF][k];
            assert!(ok(tpurt_buffer_fill(b, 0, bytes, fill, stream, 0)));
            buffers.push(b);
        }
        Runner {
            rt,
            stream,
            buffers,
            names: tpurt_core_op_names(),
        }
    }

    /// Runs the calls in `mode`; every error is reported and dropped, a
    /// failed stream is reset. Panics (the fuzzer's finding) only if the
    /// runtime breaks a promise: a status that is neither OK nor an error.
    pub fn run(&self, mode: u8, calls: &[Call]) {
        let modes = [0u32, 1, 2];
        let mode = modes[(mode % 3) as usize];
        if !ok(tpurt_eager_mode_push(mode)) {
            return;
        }
        let mut outputs: Vec<tpurt_buffer> = Vec::new();
        for c in calls {
            self.call(c, &mut outputs);
        }
        if !ok(tpurt_stream_synchronize(self.stream)) {
            ok(tpurt_stream_reset(self.stream));
        }
        for b in outputs {
            ok(tpurt_buffer_free(b));
        }
        ok(tpurt_eager_mode_pop(std::ptr::null_mut()));
    }

    fn call(&self, c: &Call, outputs: &mut Vec<tpurt_buffer>) {
        let name = match &c.op {
            OpName::Name(n) => n.clone(),
            OpName::Index(i) => self.names[*i as usize % self.names.len()].to_string(),
        };
        let Ok(cname) = CString::new(name) else {
            return;
        };
        let mut id = 0u32;
        if !ok(tpurt_op_lookup(cname.as_ptr(), &mut id)) {
            return;
        }
        let sizes: Vec<Vec<u64>> = c
            .inputs
            .iter()
            .map(|i| i.sizes.iter().map(|&s| s as u64 % 17).collect())
            .collect();
        let strides: Vec<Option<Vec<u64>>> = c
            .inputs
            .iter()
            .map(|i| {
                i.strides
                    .as_ref()
                    .map(|s| s.iter().map(|&v| v as i64 as u64).collect())
            })
            .collect();
        let descs: Vec<tpurt_tensor> = c
            .inputs
            .iter()
            .enumerate()
            .map(|(k, i)| {
                let buffer = self
                    .buffers
                    .get(i.buffer as usize)
                    .copied()
                    // A handle that was never made.
                    .unwrap_or(tpurt_buffer {
                        handle: 0xDEAD_0000 + i.buffer as u64,
                    });
                tpurt_tensor {
                    struct_size: std::mem::size_of::<tpurt_tensor>(),
                    buffer,
                    dtype: i.dtype as u32 % 10,
                    ndim: i.sizes.len() as u32,
                    offset_bytes: i.offset as u64,
                    sizes: sizes[k].as_ptr(),
                    strides: strides[k].as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
                }
            })
            .collect();
        let names: Vec<CString> = c
            .attrs
            .iter()
            .map(|a| CString::new(a.name.replace('\0', "")).unwrap_or_default())
            .collect();
        let strings: Vec<CString> = c
            .attrs
            .iter()
            .map(|a| match &a.value {
                Value::Str(s) => CString::new(s.replace('\0', "")).unwrap_or_default(),
                _ => CString::default(),
            })
            .collect();
        let attrs: Vec<tpurt_attr> = c
            .attrs
            .iter()
            .enumerate()
            .map(|(k, a)| {
                let mut t = tpurt_attr {
                    name: names[k].as_ptr(),
                    kind: TPURT_ATTR_NONE,
                    int_value: 0,
                    float_value: 0.0,
                    ints: std::ptr::null(),
                    floats: std::ptr::null(),
                    count: 0,
                    string: std::ptr::null(),
                };
                match &a.value {
                    Value::Int(kind, v) => {
                        t.kind = *kind;
                        t.int_value = *v;
                    }
                    Value::Float(v) => {
                        t.kind = TPURT_ATTR_FLOAT;
                        t.float_value = *v;
                    }
                    Value::Ints(v) => {
                        t.kind = TPURT_ATTR_INTS;
                        t.ints = v.as_ptr();
                        t.count = v.len();
                    }
                    Value::Floats(v) => {
                        t.kind = TPURT_ATTR_FLOATS;
                        t.floats = v.as_ptr();
                        t.count = v.len();
                    }
                    Value::Str(_) => {
                        t.kind = TPURT_ATTR_STRING;
                        t.string = strings[k].as_ptr();
                    }
                    Value::Other(k) => t.kind = *k,
                }
                t
            })
            .collect();
        let mut bufs = [tpurt_buffer { handle: 0 }; 8];
        let mut types: [tpurt_tensor_type; 8] = std::array::from_fn(|_| tpurt_tensor_type {
            dtype: 0,
            ndim: 0,
            sizes: [0; 16],
        });
        let mut addrs = [0u64; 8];
        let mut n = 0usize;
        let s = tpurt_op_call(
            self.rt,
            id,
            descs.as_ptr(),
            descs.len(),
            attrs.as_ptr(),
            attrs.len(),
            0,
            self.stream,
            bufs.as_mut_ptr(),
            types.as_mut_ptr(),
            addrs.as_mut_ptr(),
            bufs.len(),
            &mut n,
        );
        if ok(s) {
            outputs.extend_from_slice(&bufs[..n.min(bufs.len())]);
        }
    }
}

impl Default for Runner {
    fn default() -> Self {
        Runner::new()
    }
}

/// The op library's names.
#[doc(hidden)]
fn tpurt_core_op_names() -> Vec<&'static str> {
    ::tpurt_runtime::ops::op_names()
}

#[cfg(test)]
mod seeds {
    //! `TPURT_FUZZ_WRITE_SEEDS=1 cargo test` (in fuzz/) writes the seed
    //! corpora under corpus/: op calls and graphs the test suite makes,
    //! and a real compile-cache entry. Without the variable it only checks
    //! that the seeds decode and run.
    use super::*;
    use ::tpurt_runtime::ir::{DType, TensorType};
    use ::tpurt_runtime::ops::{self, Attr as A, Attrs};
    use std::path::PathBuf;

    fn input(buffer: u8, dtype: u32, sizes: &[u8]) -> Input {
        Input {
            buffer,
            dtype: dtype as u8,
            sizes: sizes.to_vec(),
            offset: 0,
            strides: None,
        }
    }
    fn call(op: &str, inputs: Vec<Input>, attrs: Vec<(&str, Value)>) -> Call {
        Call {
            op: OpName::Name(op.into()),
            inputs,
            attrs: attrs
                .into_iter()
                .map(|(n, value)| Attr {
                    name: n.into(),
                    value,
                })
                .collect(),
        }
    }
    fn int(v: i64) -> Value {
        Value::Int(TPURT_ATTR_INT, v)
    }

    fn op_calls() -> Vec<(u8, Vec<Call>)> {
        let f = TPURT_DTYPE_F32;
        let i = TPURT_DTYPE_I64;
        let mut strided = input(2, f, &[4, 3]);
        strided.strides = Some(vec![1, 4]);
        strided.offset = 8;
        vec![
            (
                0,
                vec![call(
                    "add",
                    vec![input(2, f, &[4]), input(2, f, &[4])],
                    vec![],
                )],
            ),
            (
                1,
                vec![call(
                    "softmax",
                    vec![input(2, f, &[3, 5])],
                    vec![("dim", int(-1))],
                )],
            ),
            (
                0,
                vec![call(
                    "matmul",
                    vec![input(2, f, &[4, 8]), input(3, f, &[8, 2])],
                    vec![],
                )],
            ),
            (
                2,
                vec![
                    call("mul", vec![strided.clone(), input(2, f, &[4, 3])], vec![]),
                    call("exp", vec![input(2, f, &[4, 3])], vec![]),
                    call(
                        "sum",
                        vec![input(2, f, &[4, 3])],
                        vec![("dim", Value::Ints(vec![0]))],
                    ),
                ],
            ),
            (
                0,
                vec![call(
                    "embedding_bag",
                    vec![input(2, f, &[10, 4]), input(1, i, &[6]), input(1, i, &[3])],
                    vec![("mode", Value::Str("sum".into()))],
                )],
            ),
            (
                0,
                vec![call(
                    "sparse_dense_matmul",
                    vec![
                        input(1, TPURT_DTYPE_I32, &[1]),
                        input(1, TPURT_DTYPE_I32, &[8]),
                        input(1, TPURT_DTYPE_I32, &[8]),
                        input(2, f, &[8]),
                        input(2, f, &[6, 4]),
                    ],
                    vec![("batch_size", int(4))],
                )],
            ),
            (
                1,
                vec![call(
                    "index_select",
                    vec![input(2, f, &[5, 3]), input(3, i, &[2])],
                    vec![("dim", int(0))],
                )],
            ),
            (
                0,
                vec![call(
                    "layer_norm",
                    vec![input(2, f, &[2, 8])],
                    vec![("normalized_shape", Value::Ints(vec![8]))],
                )],
            ),
            (
                0,
                vec![call(
                    "conv2d",
                    vec![input(2, f, &[1, 2, 5, 5]), input(2, f, &[3, 2, 3, 3])],
                    vec![("padding", Value::Ints(vec![1, 1]))],
                )],
            ),
            (
                0,
                vec![call(
                    "topk",
                    vec![input(3, f, &[4, 6])],
                    vec![("k", int(2))],
                )],
            ),
            (0, vec![call("no_such_op", vec![], vec![])]),
            (
                0,
                vec![call(
                    "add",
                    vec![input(9, f, &[4]), input(2, f, &[4])],
                    vec![],
                )],
            ),
        ]
    }

    fn graphs() -> Vec<String> {
        let f = |d: &[u64]| TensorType::new(DType::F32, d);
        let i = |d: &[u64]| TensorType::new(DType::I64, d);
        let cases: Vec<(&str, Vec<TensorType>, Attrs)> = vec![
            (
                "softmax",
                vec![f(&[2, 8])],
                Attrs::new().with("dim", A::Int(-1)),
            ),
            (
                "layer_norm",
                vec![f(&[4, 8])],
                Attrs::new().with("normalized_shape", A::Ints(vec![8])),
            ),
            ("matmul", vec![f(&[4, 8]), f(&[8, 3])], Attrs::new()),
            (
                "scatter_add",
                vec![f(&[3, 4]), i(&[2, 4]), f(&[2, 4])],
                Attrs::new().with("dim", A::Int(0)),
            ),
            ("sort", vec![f(&[3, 5])], Attrs::new()),
            (
                "cumsum",
                vec![f(&[3, 5])],
                Attrs::new().with("dim", A::Int(1)),
            ),
            (
                "conv2d",
                vec![f(&[1, 2, 5, 5]), f(&[4, 2, 3, 3])],
                Attrs::new(),
            ),
            (
                "embedding_bag",
                vec![f(&[10, 4]), i(&[6]), i(&[3])],
                Attrs::new(),
            ),
        ];
        cases
            .into_iter()
            .map(|(op, types, attrs)| {
                ops::build_graph(ops::lookup(op).unwrap(), &types, &attrs)
                    .unwrap()
                    .canonical()
            })
            .collect()
    }

    fn corpus(target: &str) -> Option<PathBuf> {
        std::env::var_os("TPURT_FUZZ_WRITE_SEEDS")?;
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(target);
        std::fs::create_dir_all(&d).unwrap();
        Some(d)
    }

    #[test]
    fn seeds_decode_run_and_are_written_on_request() {
        let runner = Runner::new();
        let out = corpus("op_call");
        for (k, (mode, calls)) in op_calls().into_iter().enumerate() {
            let bytes = encode(mode, &calls);
            let (m, back) = decode(&bytes);
            assert_eq!((m, back.len()), (mode, calls.len()), "seed {k}");
            runner.run(m, &back);
            if let Some(d) = &out {
                std::fs::write(d.join(format!("seed-{k:02}")), bytes).unwrap();
            }
        }
        let out = corpus("graph");
        for (k, text) in graphs().into_iter().enumerate() {
            ::tpurt_runtime::ir::Graph::from_canonical(&text).unwrap();
            if let Some(d) = &out {
                std::fs::write(d.join(format!("seed-{k:02}")), text).unwrap();
            }
        }
    }
}
