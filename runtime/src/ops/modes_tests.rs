//! Every op gives the same result in all three eager modes (DEFER_NEVER,
//! DEFER_NEVER_AND_LAUNCH_BLOCKING, DEFER_AND_FUSE), and the same as the
//! node-by-node reference path (`eval_graph` of the op's graph).
//!
//! Each case is an op with concrete inputs (host tensors) and attributes.
//! Its inputs are uploaded twice: contiguous, and as strided views (each
//! input a transposed view with every other element skipped, at an offset
//! into a buffer whose other bytes are 0xFF, so a wrong read shows; large
//! matrices a column slice of a wider matrix instead). For
//! each layout the op runs through `Runtime::call_op_alloc` in each mode,
//! the outputs are downloaded, and they are compared with each other and
//! with the reference: f32/f64 within 1e-5 relative + 1e-6 absolute,
//! bf16/f16 within 1e-2, integers and bools exactly.
//!
//! Inputs keep every float output finite: the debug mode rejects NaN and
//! Inf in float outputs, by design.

use super::*;
use crate::compile::CacheConfig;
use crate::copy::Layout;
use crate::eager::{pop_mode, push_mode, EagerMode};
use crate::ir::DType;
use crate::platform::host::kernels::{eval_graph, HostTensor};
use crate::runtime::{Runtime, RuntimeOptions};
use crate::tensor::DeviceTensor;
use crate::Stream;

const MODES: [EagerMode; 3] = [
    EagerMode::DeferNever,
    EagerMode::DeferNeverAndLaunchBlocking,
    EagerMode::DeferAndFuse,
];

// ---------------------------------------------------------------- inputs

/// Deterministic values in [lo, hi).
fn vals(seed: u64, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            lo + (hi - lo) * u
        })
        .collect()
}

fn numel(dims: &[u64]) -> usize {
    dims.iter().product::<u64>() as usize
}

fn h(dt: DType, dims: &[u64], v: &[f64]) -> HostTensor {
    HostTensor::from_f64(dt, dims, v).unwrap()
}

/// Values in [-2, 2).
fn rnd(dt: DType, dims: &[u64], seed: u64) -> HostTensor {
    h(dt, dims, &vals(seed, numel(dims), -2.0, 2.0))
}

/// Values in [lo, hi).
fn range(dt: DType, dims: &[u64], seed: u64, lo: f64, hi: f64) -> HostTensor {
    h(dt, dims, &vals(seed, numel(dims), lo, hi))
}

fn f32s(dims: &[u64], seed: u64) -> HostTensor {
    rnd(DType::F32, dims, seed)
}

/// Whole numbers in [lo, hi).
fn whole(dt: DType, dims: &[u64], seed: u64, lo: i64, hi: i64) -> HostTensor {
    let v: Vec<f64> = vals(seed, numel(dims), lo as f64, hi as f64)
        .iter()
        .map(|x| x.floor())
        .collect();
    h(dt, dims, &v)
}

fn idx(dt: DType, dims: &[u64], v: &[i64]) -> HostTensor {
    let v: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    h(dt, dims, &v)
}

fn i64s(dims: &[u64], v: &[i64]) -> HostTensor {
    idx(DType::I64, dims, v)
}

fn bools(dims: &[u64], seed: u64) -> HostTensor {
    let v: Vec<f64> = vals(seed, numel(dims), 0.0, 1.0)
        .iter()
        .map(|&x| (x < 0.5) as u8 as f64)
        .collect();
    h(DType::Bool, dims, &v)
}

fn scalar(dt: DType, v: f64) -> HostTensor {
    h(dt, &[], &[v])
}

fn i(v: i64) -> Attr {
    Attr::Int(v)
}
fn is(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}
fn f(v: f64) -> Attr {
    Attr::Float(v)
}
fn b(v: bool) -> Attr {
    Attr::Bool(v)
}
fn s(v: &str) -> Attr {
    Attr::Str(v.into())
}
fn dt(v: DType) -> Attr {
    Attr::DType(v)
}

struct Case {
    op: &'static str,
    inputs: Vec<HostTensor>,
    attrs: Attrs,
}

fn c(op: &'static str, inputs: Vec<HostTensor>, attrs: &[(&str, Attr)]) -> Case {
    let mut a = Attrs::new();
    for (k, v) in attrs {
        a.set(k, v.clone());
    }
    Case {
        op,
        inputs,
        attrs: a,
    }
}

/// The reference result of an op (also used to make inputs of backward
/// ops from their forward).
fn reference(op: &str, inputs: &[HostTensor], attrs: &Attrs) -> Result<Vec<HostTensor>> {
    let types: Vec<TensorType> = inputs.iter().map(|t| t.ty.clone()).collect();
    let g = build_graph(lookup(op)?, &types, attrs)?;
    eval_graph(&g, inputs)
}

fn fwd(op: &'static str, inputs: &[HostTensor], attrs: &[(&str, Attr)]) -> Vec<HostTensor> {
    reference(op, inputs, &c(op, vec![], attrs).attrs)
        .unwrap_or_else(|e| panic!("forward {op}: {e}"))
}

// ---------------------------------------------------------------- device side

fn runtime() -> Runtime {
    Runtime::new(&RuntimeOptions {
        platform: Some("host".into()),
        host_chips: Some(1),
        host_topology: None,
        host_hbm_bytes: Some(512 << 20),
        cache: Some(CacheConfig::memory_only(4096)),
    })
    .unwrap()
}

/// Uploads `t`. Strided: a transposed view (strides of the reversed
/// shape), every other element, 3 elements into a buffer otherwise filled
/// with 0xFF bytes. Large matrices (2^16 elements or more) get a cheaper
/// view: a column slice of a wider matrix (rows 8 elements apart).
fn upload(r: &Runtime, st: &Stream, t: &HostTensor, strided: bool) -> Result<DeviceTensor> {
    let es = t.dtype().size() as u64;
    let dims = t.dims().to_vec();
    if !strided {
        let buf = r.allocate(0, t.bytes().len() as u64, st)?;
        r.copy_host_to_device(t.bytes(), &buf, &Layout::bytes(buf.len()), st)?;
        return DeviceTensor::contiguous(buf, t.dtype(), &dims);
    }
    let mut strides = vec![0u64; dims.len()];
    if t.numel() >= 1 << 16 && dims.len() >= 2 {
        let mut acc = 1u64;
        for k in (0..dims.len()).rev() {
            strides[k] = acc;
            acc *= dims[k] + if k + 1 == dims.len() { 8 } else { 0 };
        }
    } else {
        let mut acc = 2u64;
        for (k, &d) in dims.iter().enumerate() {
            strides[k] = acc;
            acc *= d.max(1);
        }
    }
    let offset = 3u64;
    let span: u64 = if dims.contains(&0) {
        0
    } else {
        dims.iter()
            .zip(&strides)
            .map(|(&d, &s)| (d - 1) * s)
            .sum::<u64>()
            + 1
    };
    let bytes = (offset + span + 1) * es;
    let buf = r.allocate(0, bytes, st)?;
    r.copy_host_to_device(&vec![0xFF; bytes as usize], &buf, &Layout::bytes(bytes), st)?;
    let layout = Layout {
        offset: offset * es,
        sizes: dims.as_slice().into(),
        strides: strides.as_slice().into(),
        elem_size: es,
    };
    r.copy_host_to_device(t.bytes(), &buf, &layout, st)?;
    DeviceTensor::new(buf, t.dtype(), offset * es, &dims, Some(&strides))
}

fn download(r: &Runtime, st: &Stream, t: &DeviceTensor) -> Result<HostTensor> {
    let mut out = vec![0u8; t.ty().nbytes() as usize];
    r.copy_device_to_host(&t.buffer, &t.layout, &mut out, st)?;
    HostTensor::from_bytes(t.ty(), &out)
}

/// Pops the pushed mode even when the body fails.
struct InMode;
impl InMode {
    fn push(mode: EagerMode) -> InMode {
        push_mode(mode).unwrap();
        InMode
    }
}
impl Drop for InMode {
    fn drop(&mut self) {
        let _ = pop_mode();
    }
}

fn run_in_mode(
    r: &Runtime,
    st: &Stream,
    mode: EagerMode,
    op: OpId,
    inputs: &[DeviceTensor],
    attrs: &Attrs,
) -> Result<Vec<HostTensor>> {
    let _mode = InMode::push(mode);
    let before = st.deferred_ops();
    let outs = r.call_op_alloc(op, inputs, attrs, st)?;
    if mode == EagerMode::DeferAndFuse && st.deferred_ops() != before + 1 {
        return Err(Error::Internal(format!(
            "the op was not deferred ({} deferred ops)",
            st.deferred_ops()
        )));
    }
    // Downloading synchronizes the stream, which flushes deferred work.
    let host = outs
        .iter()
        .map(|o| download(r, st, o))
        .collect::<Result<Vec<_>>>()?;
    if st.deferred_ops() != 0 {
        return Err(Error::Internal("deferred ops left after a download".into()));
    }
    Ok(host)
}

// ---------------------------------------------------------------- comparison

/// (relative, absolute) tolerance for a float dtype; None: exact.
fn tolerance(d: DType) -> Option<(f64, f64)> {
    match d {
        DType::F32 | DType::F64 => Some((1e-5, 1e-6)),
        DType::BF16 | DType::F16 => Some((1e-2, 1e-2)),
        _ => None,
    }
}

/// None when `got` matches `want`, else what differs.
fn mismatch(got: &HostTensor, want: &HostTensor) -> Option<String> {
    mismatch_within(got, want, tolerance(got.dtype()))
}

/// `mismatch` with the (relative, absolute) float tolerance given.
fn mismatch_within(got: &HostTensor, want: &HostTensor, tol: Option<(f64, f64)>) -> Option<String> {
    if got.ty != want.ty {
        return Some(format!("type {} vs {}", got.ty, want.ty));
    }
    let es = got.dtype().size();
    let mut bad = Vec::new();
    for k in 0..got.numel() {
        let (a, w) = (got.get_f64(k), want.get_f64(k));
        let ok = match tol {
            Some((rel, abs)) => {
                (a.is_nan() && w.is_nan()) || a == w || (a - w).abs() <= rel * w.abs() + abs
            }
            None => got.bytes()[k * es..(k + 1) * es] == want.bytes()[k * es..(k + 1) * es],
        };
        if !ok {
            bad.push(k);
        }
    }
    if bad.is_empty() {
        return None;
    }
    let show: Vec<String> = bad
        .iter()
        .take(6)
        .map(|&k| format!("[{k}] {} vs {}", got.get_f64(k), want.get_f64(k)))
        .collect();
    Some(format!(
        "{} of {} elements differ: {}",
        bad.len(),
        got.numel(),
        show.join(", ")
    ))
}

fn describe(c: &Case) -> String {
    let ins: Vec<String> = c.inputs.iter().map(|t| format!("{t:?}")).collect();
    format!("{}({}) {}", c.op, ins.join(", "), c.attrs.canonical())
}

/// Runs one case in both layouts and all modes; the problems found.
fn check_case(r: &Runtime, st: &Stream, case: &Case) -> Vec<String> {
    let id = lookup(case.op).unwrap();
    let want = reference(case.op, &case.inputs, &case.attrs)
        .unwrap_or_else(|e| panic!("reference of {}: {e}", describe(case)));
    let mut problems = Vec::new();
    for strided in [false, true] {
        if strided && case.inputs.is_empty() {
            continue;
        }
        let layout = if strided {
            "strided views"
        } else {
            "contiguous"
        };
        let dev = case
            .inputs
            .iter()
            .map(|t| upload(r, st, t, strided))
            .collect::<Result<Vec<_>>>()
            .unwrap_or_else(|e| panic!("upload for {}: {e}", describe(case)));
        if strided && case.inputs.iter().any(|t| t.numel() > 1) {
            assert!(
                dev.iter().any(|t| !t.is_contiguous()),
                "{}: no strided input",
                case.op
            );
        }
        let mut results: Vec<(EagerMode, Vec<HostTensor>)> = Vec::new();
        for mode in MODES {
            match run_in_mode(r, st, mode, id, &dev, &case.attrs) {
                Ok(v) => results.push((mode, v)),
                Err(e) => {
                    problems.push(format!(
                        "{} [{layout}, {}]: error: {e}",
                        describe(case),
                        mode.name()
                    ));
                    st.reset();
                }
            }
        }
        for (mode, outs) in &results {
            let against: Vec<(String, &Vec<HostTensor>)> =
                std::iter::once(("the reference".to_string(), &want))
                    .chain(
                        results
                            .iter()
                            .take_while(|(m, _)| m != mode)
                            .map(|(m, o)| (m.name().to_string(), o)),
                    )
                    .collect();
            for (what, other) in against {
                if outs.len() != other.len() {
                    problems.push(format!(
                        "{} [{layout}]: {} gives {} outputs, {what} {}",
                        describe(case),
                        mode.name(),
                        outs.len(),
                        other.len()
                    ));
                    continue;
                }
                for (k, (g, w)) in outs.iter().zip(other.iter()).enumerate() {
                    if let Some(m) = mismatch(g, w) {
                        problems.push(format!(
                            "{} [{layout}]: output {k}: {} vs {what}: {m}",
                            describe(case),
                            mode.name()
                        ));
                    }
                }
            }
        }
    }
    problems
}

fn check_all(cases: Vec<Case>) {
    let r = runtime();
    let st = r.default_stream(0).unwrap();
    let mut problems = Vec::new();
    for case in &cases {
        problems.extend(check_case(&r, &st, case));
    }
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

// ---------------------------------------------------------------- the table

fn pointwise_cases() -> Vec<Case> {
    use DType::*;
    let x = f32s(&[5, 7], 1);
    let y = f32s(&[5, 7], 2);
    // Big enough for the vectorized loop and its tail (1517 elements).
    let big = f32s(&[37, 41], 3);
    let pos = range(F32, &[37, 41], 4, 0.05, 4.0);
    let den = range(F32, &[5, 7], 5, 0.5, 2.0);
    let ia = whole(I64, &[3, 4], 6, -9, 10);
    let ib = idx(I64, &[4], &[2, -3, 5, -1]);
    let halves = h(F32, &[2, 4], &[0.5, 1.5, 2.5, -0.5, -1.5, 2.49, -2.51, 0.0]);
    let mut cases = vec![
        c("add", vec![x.clone(), y.clone()], &[("alpha", f(0.5))]),
        // Promotion: an i32 matrix plus an f32 row gives f32.
        c(
            "add",
            vec![whole(I32, &[3, 4], 7, -5, 5), f32s(&[4], 8)],
            &[],
        ),
        // A wrapped Python float does not widen bf16.
        c(
            "add",
            vec![rnd(BF16, &[4, 5], 9), scalar(F64, 0.75)],
            &[("wrapped", is(&[1]))],
        ),
        // A zero-dim f32 tensor with an f16 tensor stays f16.
        c("mul", vec![rnd(F16, &[3, 4], 10), scalar(F32, -1.25)], &[]),
        // A wrapped float with an int tensor gives f32.
        c(
            "mul",
            vec![ia.clone(), scalar(F64, 0.5)],
            &[("wrapped", is(&[1]))],
        ),
        c(
            "sub",
            vec![ia.clone(), whole(I64, &[3, 4], 13, -9, 10)],
            &[],
        ),
        c(
            "sub",
            vec![x.clone(), rnd(BF16, &[7], 14)],
            &[("alpha", f(2.0))],
        ),
        c("mul", vec![big.clone(), pos.clone()], &[]),
        c("div", vec![x.clone(), den.clone()], &[]),
        c(
            "div",
            vec![whole(I32, &[3, 4], 15, -9, 10), ib.clone()],
            &[],
        ),
        c(
            "div",
            vec![ia.clone(), ib.clone()],
            &[("rounding_mode", s("floor"))],
        ),
        c(
            "div",
            vec![ia.clone(), ib.clone()],
            &[("rounding_mode", s("trunc"))],
        ),
        c(
            "div",
            vec![x.clone(), den.clone()],
            &[("rounding_mode", s("floor"))],
        ),
        c("remainder", vec![ia.clone(), ib.clone()], &[]),
        c("remainder", vec![x.clone(), den.clone()], &[]),
        c("fmod", vec![ia.clone(), ib.clone()], &[]),
        c("fmod", vec![x.clone(), den.clone()], &[]),
        c(
            "pow",
            vec![range(F32, &[5, 7], 16, 0.1, 3.0), y.clone()],
            &[],
        ),
        c(
            "pow",
            vec![x.clone(), scalar(F64, 2.0)],
            &[("wrapped", is(&[1]))],
        ),
        c(
            "pow",
            vec![whole(I64, &[6], 17, -3, 4), i64s(&[6], &[0, 1, 2, 3, 2, 1])],
            &[],
        ),
        c("maximum", vec![x.clone(), whole(I32, &[7], 18, -2, 3)], &[]),
        c("minimum", vec![rnd(BF16, &[5, 7], 19), x.clone()], &[]),
        c("minimum", vec![ia.clone(), ib.clone()], &[]),
        c("atan2", vec![x.clone(), y.clone()], &[]),
        c("neg", vec![ia.clone()], &[]),
        c("neg", vec![rnd(BF16, &[5, 7], 20)], &[]),
        c("abs", vec![x.clone()], &[]),
        c("abs", vec![ia.clone()], &[]),
        c(
            "sign",
            vec![h(F32, &[5], &[-2.0, 0.0, 3.0, -0.0, 0.5])],
            &[],
        ),
        c("exp", vec![big.clone()], &[]),
        c("exp", vec![rnd(BF16, &[5, 7], 21)], &[]),
        c("expm1", vec![big.clone()], &[]),
        c("log", vec![pos.clone()], &[]),
        c("log", vec![range(F16, &[5, 7], 22, 0.1, 8.0)], &[]),
        c("log1p", vec![pos.clone()], &[]),
        c("sqrt", vec![pos.clone()], &[]),
        c("sqrt", vec![whole(I64, &[4], 23, 0, 50)], &[]),
        c("rsqrt", vec![pos.clone()], &[]),
        c("tanh", vec![big.clone()], &[]),
        c("sigmoid", vec![big.clone()], &[]),
        c("sigmoid", vec![rnd(BF16, &[37, 41], 24)], &[]),
        c("sin", vec![big.clone()], &[]),
        c("cos", vec![big.clone()], &[]),
        c("erf", vec![big.clone()], &[]),
        c("floor", vec![halves.clone()], &[]),
        c("ceil", vec![halves.clone()], &[]),
        c("round", vec![halves.clone()], &[]),
        c("trunc", vec![halves.clone()], &[]),
        c("reciprocal", vec![den.clone()], &[]),
        c("square", vec![whole(I32, &[3, 4], 25, -50, 50)], &[]),
        c("square", vec![x.clone()], &[]),
        c(
            "isfinite",
            vec![h(
                F32,
                &[2, 3],
                &[1.0, f64::INFINITY, f64::NAN, -2.0, f64::NEG_INFINITY, 0.0],
            )],
            &[],
        ),
        c(
            "isnan",
            vec![h(F32, &[2, 3], &[1.0, f64::NAN, 3.0, f64::NAN, 0.0, -1.0])],
            &[],
        ),
        c(
            "eq",
            vec![whole(F32, &[3, 4], 26, -2, 2), whole(I64, &[4], 27, -2, 2)],
            &[],
        ),
        c("ne", vec![ia.clone(), ib.clone()], &[]),
        c("lt", vec![x.clone(), y.clone()], &[]),
        c(
            "le",
            vec![x.clone(), scalar(F64, 0.25)],
            &[("wrapped", is(&[1]))],
        ),
        c("gt", vec![rnd(BF16, &[5, 7], 28), x.clone()], &[]),
        c("ge", vec![ia.clone(), scalar(I64, 0.0)], &[]),
        c(
            "logical_and",
            vec![bools(&[4, 6], 29), bools(&[4, 6], 30)],
            &[],
        ),
        c(
            "logical_or",
            vec![bools(&[4, 6], 31), whole(F32, &[6], 32, -1, 2)],
            &[],
        ),
        c(
            "logical_xor",
            vec![bools(&[4, 6], 33), bools(&[6], 34)],
            &[],
        ),
        c("logical_not", vec![whole(F32, &[4, 6], 35, -1, 2)], &[]),
        c(
            "bitwise_and",
            vec![
                whole(I64, &[3, 4], 36, -100, 100),
                whole(I64, &[3, 4], 37, -100, 100),
            ],
            &[],
        ),
        c(
            "bitwise_or",
            vec![
                whole(I32, &[3, 4], 38, -100, 100),
                whole(I32, &[4], 39, 0, 64),
            ],
            &[],
        ),
        c(
            "bitwise_xor",
            vec![bools(&[3, 4], 40), bools(&[3, 4], 41)],
            &[],
        ),
        c("bitwise_not", vec![whole(I64, &[3, 4], 42, -100, 100)], &[]),
        c("bitwise_not", vec![bools(&[3, 4], 43)], &[]),
        c(
            "cast",
            vec![range(F32, &[5, 7], 44, -100.0, 100.0)],
            &[("dtype", dt(I32))],
        ),
        c("cast", vec![x.clone()], &[("dtype", dt(BF16))]),
        c(
            "cast",
            vec![whole(I64, &[5], 45, -1000, 1000)],
            &[("dtype", dt(F16))],
        ),
        c("cast", vec![x.clone()], &[("dtype", dt(Bool))]),
        c("copy", vec![f32s(&[1, 7], 46)], &[("size", is(&[5, 7]))]),
        c("copy", vec![x.clone()], &[("dtype", dt(F64))]),
        c(
            "where",
            vec![bools(&[5, 7], 47), x.clone(), scalar(F64, -1.0)],
            &[("wrapped", is(&[2]))],
        ),
        c(
            "where",
            vec![
                bools(&[4, 1], 48),
                ia.clone().reshaped(&[4, 3]),
                f32s(&[3], 49),
            ],
            &[],
        ),
        c(
            "masked_fill",
            vec![x.clone(), bools(&[7], 50)],
            &[("value", f(3.5))],
        ),
        c(
            "clamp",
            vec![x.clone()],
            &[("min", f(-0.5)), ("max", f(1.0))],
        ),
        c("clamp", vec![ia.clone()], &[("min", f(-3.0))]),
        c("relu", vec![big.clone()], &[]),
        c("relu", vec![ia.clone()], &[]),
        c("gelu", vec![big.clone()], &[]),
        c("gelu", vec![big.clone()], &[("approximate", s("tanh"))]),
        c("gelu", vec![rnd(BF16, &[5, 7], 51)], &[]),
        c("silu", vec![big.clone()], &[]),
        c("silu", vec![rnd(F16, &[5, 7], 52)], &[]),
        c(
            "lerp",
            vec![x.clone(), y.clone(), range(F32, &[7], 53, 0.0, 1.0)],
            &[],
        ),
        c(
            "lerp",
            vec![x.clone(), y.clone(), scalar(F64, 0.3)],
            &[("wrapped", is(&[2]))],
        ),
        c(
            "addcmul",
            vec![x.clone(), y.clone(), f32s(&[7], 54)],
            &[("value", f(0.5))],
        ),
        c(
            "addcdiv",
            vec![x.clone(), y.clone(), den.clone()],
            &[("value", f(-1.5))],
        ),
        c(
            "addcdiv",
            vec![ia.clone(), ia.clone(), range(F32, &[4], 55, 1.0, 2.0)],
            &[],
        ),
        // Numbers as inputs (alpha, value, weight), and bf16 and f16 with
        // numbers: computed at f32, rounded once.
        c(
            "add",
            vec![
                rnd(BF16, &[5, 7], 56),
                rnd(BF16, &[5, 7], 57),
                scalar(F64, 0.7),
            ],
            &[("wrapped", is(&[2]))],
        ),
        c(
            "sub",
            vec![x.clone(), y.clone(), scalar(F64, -1.25)],
            &[("wrapped", is(&[2]))],
        ),
        c(
            "mul",
            vec![rnd(F16, &[5, 7], 58), scalar(F64, 0.7)],
            &[("wrapped", is(&[1]))],
        ),
        c(
            "div",
            vec![rnd(BF16, &[5, 7], 59), scalar(F64, 3.3)],
            &[("wrapped", is(&[1])), ("rounding_mode", s("floor"))],
        ),
        c(
            "lerp",
            vec![
                rnd(BF16, &[5, 7], 60),
                rnd(BF16, &[5, 7], 61),
                scalar(F64, 0.8),
            ],
            &[("wrapped", is(&[2]))],
        ),
        c(
            "addcmul",
            vec![
                rnd(F16, &[5, 7], 62),
                rnd(F16, &[5, 7], 63),
                rnd(F16, &[5, 7], 64),
                scalar(F64, 0.3),
            ],
            &[("wrapped", is(&[3]))],
        ),
    ];
    // Zero-size inputs, with the zero in the last dimension (a zero in
    // another dimension: `zero_rows_cases`).
    let z = f32s(&[3, 0], 56);
    for op in ["exp", "neg", "sigmoid", "gelu", "isnan", "logical_not"] {
        cases.push(c(op, vec![z.clone()], &[]));
    }
    cases.push(c("add", vec![z.clone(), f32s(&[0], 11)], &[]));
    cases.push(c(
        "where",
        vec![bools(&[3, 0], 57), z.clone(), f32s(&[0], 58)],
        &[],
    ));
    cases.push(c("clamp", vec![z.clone()], &[("min", f(0.0))]));
    cases
}

fn reduction_cases() -> Vec<Case> {
    use DType::*;
    let x = f32s(&[4, 5, 6], 100);
    let m = f32s(&[6, 9], 101);
    let ints = whole(I32, &[4, 6], 102, -20, 20);
    let near_one = range(F32, &[5, 4], 103, 0.8, 1.25);
    let ties = h(
        F32,
        &[3, 4],
        &[1., 3., 3., 0., 2., 2., 2., 2., -1., 5., 4., 5.],
    );
    let z = f32s(&[0, 4], 104);
    vec![
        c("sum", vec![m.clone()], &[]),
        c(
            "sum",
            vec![x.clone()],
            &[("dim", is(&[1])), ("keepdim", b(true))],
        ),
        c("sum", vec![x.clone()], &[("dim", is(&[0, 2]))]),
        c("sum", vec![ints.clone()], &[("dim", is(&[-1]))]),
        c(
            "nansum",
            vec![h(
                F32,
                &[2, 3],
                &[1.0, f64::NAN, 2.5, f64::NAN, f64::NAN, -1.0],
            )],
            &[("dim", is(&[1]))],
        ),
        c("nansum", vec![x.clone()], &[]),
        c(
            "nansum",
            vec![ints.clone()],
            &[("dim", is(&[-1])), ("keepdim", b(true))],
        ),
        c("nansum", vec![f32s(&[0, 3], 3201)], &[("dim", is(&[0]))]),
        c("sum", vec![rnd(BF16, &[6, 9], 105)], &[("dim", is(&[1]))]),
        c(
            "sum",
            vec![m.clone()],
            &[("dim", is(&[0])), ("dtype", dt(F64))],
        ),
        c("sum", vec![bools(&[4, 6], 106)], &[("dim", is(&[1]))]),
        c("sum", vec![z.clone()], &[("dim", is(&[0]))]),
        c(
            "sum",
            vec![f32s(&[4, 0], 113)],
            &[("dim", is(&[1])), ("keepdim", b(true))],
        ),
        c("prod", vec![near_one.clone()], &[("dim", is(&[1]))]),
        c("prod", vec![whole(I64, &[3, 4], 107, -3, 4)], &[]),
        c(
            "mean",
            vec![x.clone()],
            &[("dim", is(&[-1])), ("keepdim", b(true))],
        ),
        c("mean", vec![rnd(BF16, &[6, 9], 108)], &[("dim", is(&[0]))]),
        c("mean", vec![m.clone()], &[]),
        c("amax", vec![x.clone()], &[("dim", is(&[0, 1]))]),
        c("amax", vec![ints.clone()], &[("dim", is(&[0]))]),
        c(
            "amin",
            vec![m.clone()],
            &[("dim", is(&[1])), ("keepdim", b(true))],
        ),
        c("amax", vec![f32s(&[4, 0], 114)], &[("dim", is(&[0]))]),
        c(
            "argmax",
            vec![ties.clone()],
            &[("dim", i(1)), ("keepdim", b(true))],
        ),
        c("argmax", vec![m.clone()], &[("dim", i(0))]),
        c("argmin", vec![ties.clone()], &[]),
        c("argmin", vec![ints.clone()], &[("dim", i(-1))]),
        c("max_dim", vec![ties.clone()], &[("dim", i(0))]),
        c(
            "max_dim",
            vec![x.clone()],
            &[("dim", i(2)), ("keepdim", b(true))],
        ),
        c(
            "min_dim",
            vec![ints.clone()],
            &[("dim", i(-1)), ("keepdim", b(true))],
        ),
        c("var", vec![x.clone()], &[("dim", is(&[1]))]),
        c("var", vec![m.clone()], &[("correction", i(0))]),
        c(
            "std",
            vec![x.clone()],
            &[("dim", is(&[0, 2])), ("keepdim", b(true))],
        ),
        c("std", vec![rnd(BF16, &[6, 9], 109)], &[("dim", is(&[1]))]),
        c("logsumexp", vec![x.clone()], &[("dim", is(&[2]))]),
        c(
            "logsumexp",
            vec![m.clone()],
            &[("dim", is(&[0, 1])), ("keepdim", b(true))],
        ),
        c("any", vec![bools(&[4, 6], 110)], &[("dim", is(&[1]))]),
        c("any", vec![whole(F32, &[4, 6], 111, 0, 2)], &[]),
        c(
            "all",
            vec![bools(&[4, 6], 112)],
            &[("dim", is(&[0])), ("keepdim", b(true))],
        ),
        c("all", vec![h(Bool, &[0, 3], &[])], &[("dim", is(&[0]))]),
        c("cumsum", vec![x.clone()], &[("dim", i(1))]),
        c("cumsum", vec![ints.clone()], &[("dim", i(-1))]),
        c("cumsum", vec![z.clone()], &[("dim", i(0))]),
        c("cumprod", vec![near_one.clone()], &[("dim", i(0))]),
        c("cummax", vec![ties.clone()], &[("dim", i(1))]),
        c("cummax", vec![ints.clone()], &[("dim", i(0))]),
        c("cummin", vec![ties.clone()], &[("dim", i(-1))]),
        c("cummin", vec![bools(&[4, 6], 113)], &[("dim", i(1))]),
        c("logcumsumexp", vec![x.clone()], &[("dim", i(1))]),
        c(
            "logcumsumexp",
            vec![rnd(BF16, &[3, 9], 114)],
            &[("dim", i(-1))],
        ),
        c("norm", vec![m.clone()], &[]),
        c("norm", vec![x.clone()], &[("p", f(1.0)), ("dim", is(&[2]))]),
        c(
            "norm",
            vec![m.clone()],
            &[("p", f(3.0)), ("dim", is(&[0])), ("keepdim", b(true))],
        ),
    ]
}

/// A helper for cases that want an existing tensor in another shape.
trait Reshaped {
    fn reshaped(self, dims: &[u64]) -> HostTensor;
}
impl Reshaped for HostTensor {
    fn reshaped(self, dims: &[u64]) -> HostTensor {
        HostTensor::from_bytes(TensorType::new(self.dtype(), dims), self.bytes()).unwrap()
    }
}

fn shape_cases() -> Vec<Case> {
    use DType::*;
    let x = f32s(&[4, 6], 200);
    let x3 = f32s(&[2, 3, 4], 201);
    let ints = whole(I64, &[4, 6], 202, -50, 50);
    let w = f32s(&[7, 3], 203);
    let z = f32s(&[0, 3], 204);
    vec![
        c("reshape", vec![x.clone()], &[("shape", is(&[3, -1]))]),
        c("reshape", vec![z.clone()], &[("shape", is(&[3, 0]))]),
        c("flatten", vec![x3.clone()], &[("start_dim", i(1))]),
        c("flatten", vec![ints.clone()], &[]),
        c("permute", vec![x3.clone()], &[("dims", is(&[2, 0, 1]))]),
        c(
            "permute",
            vec![rnd(BF16, &[2, 3, 4], 205)],
            &[("dims", is(&[1, 2, 0]))],
        ),
        c(
            "transpose",
            vec![x3.clone()],
            &[("dim0", i(0)), ("dim1", i(-1))],
        ),
        c(
            "transpose",
            vec![z.clone()],
            &[("dim0", i(0)), ("dim1", i(1))],
        ),
        c(
            "expand",
            vec![f32s(&[4, 1], 206)],
            &[("size", is(&[2, 4, 5]))],
        ),
        c(
            "expand",
            vec![bools(&[1, 3], 207)],
            &[("size", is(&[0, 3]))],
        ),
        c("squeeze", vec![f32s(&[3, 1, 4, 1], 208)], &[]),
        c(
            "squeeze",
            vec![f32s(&[3, 1, 4, 1], 209)],
            &[("dim", is(&[-1]))],
        ),
        c("unsqueeze", vec![x.clone()], &[("dim", i(1))]),
        c(
            "cat",
            vec![x.clone(), f32s(&[4, 2], 210), f32s(&[4, 0], 211)],
            &[("dim", i(1))],
        ),
        c(
            "cat",
            vec![ints.clone(), whole(I64, &[2, 6], 212, 0, 9)],
            &[],
        ),
        c(
            "stack",
            vec![x.clone(), f32s(&[4, 6], 213)],
            &[("dim", i(1))],
        ),
        c(
            "stack",
            vec![z.clone(), f32s(&[0, 3], 214)],
            &[("dim", i(0))],
        ),
        c(
            "slice",
            vec![x.clone()],
            &[
                ("dim", i(1)),
                ("start", i(1)),
                ("end", i(6)),
                ("step", i(2)),
            ],
        ),
        c(
            "slice",
            vec![x3.clone()],
            &[("dim", i(-1)), ("start", i(-3)), ("end", i(100))],
        ),
        c(
            "slice",
            vec![x.clone()],
            &[("dim", i(0)), ("start", i(2)), ("end", i(2))],
        ),
        c(
            "narrow",
            vec![x3.clone()],
            &[("dim", i(1)), ("start", i(1)), ("length", i(2))],
        ),
        c(
            "split",
            vec![x.clone()],
            &[("split_size", i(4)), ("dim", i(1))],
        ),
        c(
            "split",
            vec![ints.clone()],
            &[("sizes", is(&[1, 3])), ("dim", i(0))],
        ),
        c(
            "pad",
            vec![x.clone()],
            &[("pad", is(&[1, 2, 0, 1])), ("value", f(9.5))],
        ),
        c(
            "pad",
            vec![whole(I32, &[3], 215, 0, 9)],
            &[("pad", is(&[2, 0]))],
        ),
        c("pad", vec![z.clone()], &[("pad", is(&[1, 1]))]),
        c(
            "pad",
            vec![f32s(&[2, 3, 4, 5], 371)],
            &[("pad", is(&[2, 4, 3, 0])), ("mode", s("reflect"))],
        ),
        c(
            "pad",
            vec![whole(I32, &[2, 3, 4], 372, -9, 9)],
            &[("pad", is(&[0, 6, 1, 1])), ("mode", s("replicate"))],
        ),
        c(
            "pad",
            vec![h(BF16, &[2, 2, 3, 4, 5], &vals(373, 240, -2.0, 2.0))],
            &[("pad", is(&[1, 5, 0, 2, 3, 1])), ("mode", s("circular"))],
        ),
        c(
            "pad_backward",
            vec![f32s(&[2, 3, 7, 11], 374)],
            &[
                ("pad", is(&[2, 4, 3, 0])),
                ("mode", s("reflect")),
                ("input_size", is(&[2, 3, 4, 5])),
            ],
        ),
        c(
            "pad_backward",
            vec![h(BF16, &[3, 9], &vals(375, 27, -1.0, 1.0))],
            &[
                ("pad", is(&[3, 2])),
                ("mode", s("replicate")),
                ("input_size", is(&[3, 4])),
            ],
        ),
        c(
            "pad_backward",
            vec![f32s(&[0, 3, 9], 376)],
            &[
                ("pad", is(&[3, 2])),
                ("mode", s("circular")),
                ("input_size", is(&[0, 3, 4])),
            ],
        ),
        c(
            "repeat",
            vec![f32s(&[2, 3], 216)],
            &[("repeats", is(&[2, 1, 2]))],
        ),
        c("flip", vec![x3.clone()], &[("dims", is(&[0, 2]))]),
        c("tril", vec![x.clone()], &[]),
        c("tril", vec![ints.clone()], &[("diagonal", i(-1))]),
        c("triu", vec![x3.clone()], &[("diagonal", i(1))]),
        c(
            "arange",
            vec![],
            &[("start", f(-1.0)), ("end", f(2.0)), ("step", f(0.25))],
        ),
        c("arange", vec![], &[("end", i(7))]),
        c(
            "linspace",
            vec![],
            &[("start", f(-2.0)), ("end", f(3.5)), ("steps", i(9))],
        ),
        c(
            "linspace",
            vec![],
            &[
                ("start", f(0.0)),
                ("end", f(1.0)),
                ("steps", i(0)),
                ("dtype", dt(DType::BF16)),
            ],
        ),
        c(
            "logspace",
            vec![],
            &[("start", f(-3.0)), ("end", f(2.5)), ("steps", i(12))],
        ),
        c(
            "logspace",
            vec![],
            &[
                ("start", f(0.0)),
                ("end", f(10.0)),
                ("steps", i(11)),
                ("base", f(2.0)),
                ("dtype", dt(DType::I64)),
            ],
        ),
        c(
            "logspace",
            vec![],
            &[("start", f(0.0)), ("end", f(1.0)), ("steps", i(0))],
        ),
        c(
            "tril_indices",
            vec![],
            &[("row", i(9)), ("col", i(6)), ("offset", i(-1))],
        ),
        c(
            "triu_indices",
            vec![],
            &[
                ("row", i(40)),
                ("col", i(70)),
                ("offset", i(3)),
                ("dtype", dt(DType::I32)),
            ],
        ),
        c("tril_indices", vec![], &[("row", i(0)), ("col", i(4))]),
        c("eye", vec![], &[("n", i(5)), ("m", i(7))]),
        c("eye", vec![], &[("n", i(4)), ("dtype", dt(DType::BF16))]),
        c("eye", vec![], &[("n", i(0)), ("m", i(3))]),
        c(
            "triu_indices",
            vec![],
            &[("row", i(5)), ("col", i(3)), ("offset", i(3))],
        ),
        c(
            "repeat_interleave",
            vec![whole(I64, &[9], 3038, 0, 4)],
            &[("output_size", i(13))],
        ),
        c(
            "repeat_interleave",
            vec![h(I32, &[4], &[2.0, 0.0, 1.0, 3.0])],
            &[("output_size", i(6))],
        ),
        c(
            "repeat_interleave",
            vec![h(I64, &[0], &[])],
            &[("output_size", i(0))],
        ),
        c(
            "bincount",
            vec![whole(I64, &[40], 3039, 0, 9)],
            &[("length", i(12))],
        ),
        c(
            "bincount",
            vec![whole(I32, &[40], 3040, -2, 9), f32s(&[40], 3041)],
            &[("length", i(6))],
        ),
        c("bincount", vec![h(I64, &[0], &[])], &[("length", i(0))]),
        c("arange", vec![], &[("start", i(3)), ("end", i(3))]),
        c("full", vec![], &[("size", is(&[2, 3])), ("value", f(-4.5))]),
        c(
            "full",
            vec![],
            &[("size", is(&[3])), ("value", f(7.0)), ("dtype", dt(I32))],
        ),
        c(
            "index_select",
            vec![x.clone(), i64s(&[4], &[5, 0, 5, 2])],
            &[("dim", i(1))],
        ),
        c(
            "index_select",
            vec![w.clone(), idx(I32, &[3], &[6, 0, 1])],
            &[],
        ),
        c(
            "index_select",
            vec![w.clone(), i64s(&[0], &[])],
            &[("dim", i(0))],
        ),
        c(
            "embedding",
            vec![w.clone(), i64s(&[2, 3], &[6, 0, 3, 3, 1, 5])],
            &[],
        ),
        c(
            "embedding",
            vec![rnd(BF16, &[7, 3], 217), idx(I32, &[4], &[1, 2, 0, 6])],
            &[],
        ),
        c("embedding", vec![w.clone(), i64s(&[0], &[])], &[]),
        c(
            "gather",
            vec![x.clone(), i64s(&[4, 2], &[0, 5, 1, 1, 2, 3, 5, 4])],
            &[("dim", i(1))],
        ),
        c(
            "gather",
            vec![x3.clone(), i64s(&[1, 2, 4], &[1, 0, 1, 1, 0, 0, 1, 0])],
            &[],
        ),
        c(
            "scatter",
            vec![
                f32s(&[3, 5], 218),
                i64s(&[2, 5], &[0, 1, 2, 0, 1, 2, 0, 1, 2, 0]),
                f32s(&[2, 5], 219),
            ],
            &[("dim", i(0))],
        ),
        c(
            "scatter",
            vec![
                f32s(&[3, 5], 220),
                i64s(&[3, 2], &[4, 0, 1, 1, 3, 2]),
                f32s(&[3, 3], 221),
            ],
            &[("dim", i(1)), ("reduce", s("multiply"))],
        ),
        c(
            "scatter",
            vec![
                whole(I64, &[3, 5], 222, -9, 9),
                i64s(&[3, 2], &[4, 4, 1, 1, 0, 2]),
                whole(I64, &[3, 2], 223, -9, 9),
            ],
            &[("dim", i(1)), ("reduce", s("amax"))],
        ),
        c(
            "scatter_add",
            vec![
                f32s(&[4], 224),
                i64s(&[6], &[0, 3, 0, 1, 3, 3]),
                f32s(&[6], 225),
            ],
            &[],
        ),
        c(
            "scatter_add",
            vec![z.clone(), i64s(&[0, 3], &[]), f32s(&[0, 3], 226)],
            &[],
        ),
        c(
            "scatter_reduce",
            vec![
                f32s(&[3, 5], 227),
                i64s(&[3, 2], &[4, 4, 1, 1, 0, 2]),
                f32s(&[3, 3], 228),
            ],
            &[
                ("dim", i(1)),
                ("reduce", s("mean")),
                ("include_self", b(false)),
            ],
        ),
        c(
            "scatter_reduce",
            vec![
                whole(I64, &[3, 5], 229, -9, 9),
                i64s(&[3, 2], &[4, 4, 1, 1, 0, 2]),
                whole(I64, &[3, 2], 230, -9, 9),
            ],
            &[("dim", i(1)), ("reduce", s("mean"))],
        ),
        c(
            "scatter_reduce",
            vec![
                f32s(&[4], 231),
                i64s(&[6], &[0, 3, 0, 1, 3, 3]),
                f32s(&[6], 232),
            ],
            &[("reduce", s("amin")), ("include_self", b(false))],
        ),
    ]
}

/// Square matrices [.., n, n] with values in [-2, 2) plus 6 on the
/// diagonal: well conditioned, so a solve's rounding stays small.
fn dominant(dt: DType, dims: &[u64], seed: u64) -> HostTensor {
    let n = dims[dims.len() - 1] as usize;
    let mut v = vals(seed, numel(dims), -2.0, 2.0);
    for (k, x) in v.iter_mut().enumerate() {
        if (k % (n * n)).is_multiple_of(n + 1) {
            *x += 6.0;
        }
    }
    h(dt, dims, &v)
}

fn solve_cases() -> Vec<Case> {
    use DType::*;
    let lu = |a: HostTensor| -> (HostTensor, HostTensor) {
        let f = fwd("lu_factor", &[a], &[]);
        (f[0].clone(), f[1].clone())
    };
    let (lu1, p1) = lu(dominant(F32, &[2, 4, 4], 360));
    let (lu2, p2) = lu(f32s(&[4, 4], 361));
    let (lu3, p3) = lu(range(F64, &[2, 4, 3], 362, -2.0, 2.0));
    let (lu4, p4) = lu(range(F64, &[3, 5], 363, -2.0, 2.0));
    let left = |v: bool| ("left", b(v));
    // Symmetric positive-definite: m mᵀ + 6 I; one of the batch not
    // (its last diagonal element made negative), which the factor reports.
    let spd = |dt: DType, batch: u64, n: u64, seed: u64| -> HostTensor {
        let m = vals(seed, (batch * n * n) as usize, -1.0, 1.0);
        let (bu, nu) = (batch as usize, n as usize);
        let mut v = vec![0.0; bu * nu * nu];
        for k in 0..bu {
            for i in 0..nu {
                for j in 0..nu {
                    let s: f64 = (0..nu)
                        .map(|q| m[k * nu * nu + i * nu + q] * m[k * nu * nu + j * nu + q])
                        .sum();
                    v[k * nu * nu + i * nu + j] = s + if i == j { 6.0 } else { 0.0 };
                }
            }
        }
        h(dt, &[batch, n, n], &v)
    };
    let mut not_pd = spd(F64, 2, 4, 390).to_f64_vec();
    not_pd[31] = -50.0;
    let not_pd = h(F64, &[2, 4, 4], &not_pd);
    let (chol, _) = {
        let f = fwd("cholesky", &[spd(F32, 2, 3, 391)], &[]);
        (f[0].clone(), f[1].clone())
    };
    vec![
        c("cholesky", vec![spd(F32, 2, 4, 392)], &[]),
        c("cholesky", vec![not_pd], &[("upper", b(true))]),
        c(
            "cholesky_solve",
            vec![f32s(&[2, 3, 2], 393), chol.clone()],
            &[],
        ),
        c(
            "cholesky_solve",
            vec![f32s(&[3, 1], 394), chol.clone()],
            &[("upper", b(true))],
        ),
        c("cholesky_inverse", vec![chol], &[]),
        c(
            "renorm",
            vec![range(F32, &[3, 4, 2], 1928, -2.0, 2.0)],
            &[("p", f(2.0)), ("dim", i(0)), ("maxnorm", f(1.0))],
        ),
        c(
            "renorm",
            vec![rnd(F16, &[3, 4], 1929)],
            &[("p", f(1.0)), ("dim", i(-1)), ("maxnorm", f(0.5))],
        ),
        c(
            "weight_norm",
            vec![f32s(&[4, 3, 2], 1930), f32s(&[4, 1, 1], 1931)],
            &[("dim", i(0))],
        ),
        c(
            "weight_norm",
            vec![rnd(BF16, &[3, 5], 1932), rnd(BF16, &[1, 5], 1933)],
            &[("dim", i(1))],
        ),
        c(
            "weight_norm_backward",
            vec![
                f32s(&[4, 3], 1934),
                range(F32, &[4, 3], 1935, 0.5, 2.0),
                f32s(&[4, 1], 1936),
                range(F32, &[4, 1], 1937, 1.0, 2.0),
            ],
            &[("dim", i(0))],
        ),
        c("lu_factor", vec![f32s(&[2, 4, 4], 364)], &[]),
        c("lu_factor", vec![range(F64, &[3, 5], 365, -2.0, 2.0)], &[]),
        c("lu_factor", vec![f32s(&[5, 3], 366)], &[]),
        c(
            "lu_solve",
            vec![lu1.clone(), p1.clone(), f32s(&[2, 4, 3], 367)],
            &[],
        ),
        c(
            "lu_solve",
            vec![lu1.clone(), p1.clone(), f32s(&[3, 4], 368)],
            &[left(false), ("adjoint", b(true))],
        ),
        c(
            "lu_solve",
            vec![lu1, p1, f32s(&[2, 4, 2], 369)],
            &[("adjoint", b(true))],
        ),
        c(
            "lu_solve",
            vec![lu2, p2, f32s(&[2, 1, 4], 370)],
            &[left(false)],
        ),
        c("lu_unpack", vec![lu3, p3], &[]),
        c("lu_unpack", vec![lu4, p4], &[]),
        c(
            "linalg_solve",
            vec![dominant(F32, &[2, 4, 4], 371), f32s(&[4], 372)],
            &[],
        ),
        c(
            "linalg_solve",
            vec![dominant(F32, &[2, 4, 4], 373), f32s(&[2, 4], 374)],
            &[],
        ),
        c(
            "linalg_solve",
            vec![
                dominant(F64, &[4, 4], 375),
                range(F64, &[2, 4, 3], 376, -2.0, 2.0),
            ],
            &[],
        ),
        c(
            "linalg_solve",
            vec![dominant(F32, &[3, 3], 377), f32s(&[2, 3], 378)],
            &[left(false)],
        ),
        c("linalg_inv", vec![dominant(F32, &[3, 3], 379)], &[]),
        c("linalg_inv", vec![dominant(F64, &[2, 4, 4], 380)], &[]),
        c(
            "matrix_exp_squarings",
            vec![range(F32, &[2, 3, 3], 1911, -9.0, 9.0)],
            &[],
        ),
        c(
            "matrix_exp",
            vec![f32s(&[2, 3, 3], 1912)],
            &[("squarings", i(0))],
        ),
        c(
            "matrix_exp",
            vec![range(F64, &[4, 4], 1913, -3.0, 3.0)],
            &[("squarings", i(2))],
        ),
        c(
            "matrix_exp",
            vec![range(BF16, &[3, 3], 1914, -1.0, 1.0)],
            &[("squarings", i(1))],
        ),
        c("linalg_det", vec![f32s(&[2, 3, 3], 381)], &[]),
        c("linalg_det", vec![range(F64, &[4, 4], 382, -2.0, 2.0)], &[]),
        c("linalg_slogdet", vec![f32s(&[2, 4, 4], 383)], &[]),
        c(
            "solve_triangular",
            vec![dominant(F32, &[2, 4, 4], 384), f32s(&[4, 3], 385)],
            &[("upper", b(true))],
        ),
        c(
            "solve_triangular",
            vec![
                dominant(F64, &[4, 4], 386),
                range(F64, &[2, 3, 4], 387, -2.0, 2.0),
            ],
            &[("upper", b(false)), left(false), ("unitriangular", b(true))],
        ),
    ]
}

fn qr_cases() -> Vec<Case> {
    use DType::*;
    let geqrf = |a: HostTensor| -> (HostTensor, HostTensor) {
        let f = fwd("geqrf", &[a], &[]);
        (f[0].clone(), f[1].clone())
    };
    let (qr1, tau1) = geqrf(f32s(&[2, 5, 3], 3300));
    let (qr2, tau2) = geqrf(range(F64, &[3, 4], 3301, -2.0, 2.0));
    let mode = |m: &str| ("mode", s(m));
    vec![
        c("geqrf", vec![f32s(&[2, 5, 3], 3302)], &[]),
        c("geqrf", vec![range(F64, &[3, 6], 3303, -2.0, 2.0)], &[]),
        c("householder_product", vec![qr1.clone(), tau1.clone()], &[]),
        c(
            "householder_product",
            vec![
                range(F64, &[4, 3], 3304, -1.0, 1.0),
                h(F64, &[2], &[1.2, 0.4]),
            ],
            &[],
        ),
        c(
            "ormqr",
            vec![qr1.clone(), tau1.clone(), f32s(&[2, 5, 2], 3305)],
            &[],
        ),
        c(
            "ormqr",
            vec![qr1, tau1, f32s(&[2, 4, 5], 3306)],
            &[("left", b(false)), ("transpose", b(true))],
        ),
        c(
            "ormqr",
            vec![qr2, tau2, range(F64, &[3, 2], 3307, -2.0, 2.0)],
            &[("transpose", b(true))],
        ),
        c("linalg_qr", vec![f32s(&[2, 5, 3], 3308)], &[]),
        c("linalg_qr", vec![f32s(&[3, 5], 3309)], &[mode("complete")]),
        c(
            "linalg_qr",
            vec![range(F64, &[2, 5, 3], 3310, -2.0, 2.0)],
            &[mode("complete")],
        ),
        c("linalg_qr", vec![f32s(&[4, 4], 3311)], &[mode("r")]),
        c(
            "linalg_lstsq",
            vec![f32s(&[2, 6, 3], 3312), f32s(&[1, 6, 2], 3313)],
            &[],
        ),
        c(
            "linalg_lstsq",
            vec![
                range(F64, &[3, 5], 3314, -2.0, 2.0),
                range(F64, &[3, 2], 3315, -1.0, 1.0),
            ],
            &[],
        ),
        c(
            "linalg_lstsq",
            vec![f32s(&[2, 5, 3], 3316), f32s(&[2, 5], 3317)],
            &[],
        ),
        c(
            "linalg_lstsq",
            vec![f32s(&[2, 6, 3], 3318), f32s(&[1, 6, 2], 3319)],
            &[("driver", s("gelsd"))],
        ),
        c(
            "linalg_lstsq",
            vec![
                range(F64, &[3, 5], 3340, -2.0, 2.0),
                range(F64, &[3], 3341, -1.0, 1.0),
            ],
            &[("driver", s("gelsy")), ("rcond", f(1e-3))],
        ),
    ]
}

fn spectral_cases() -> Vec<Case> {
    use DType::*;
    let upper = |v: bool| ("upper", b(v));
    vec![
        c("linalg_eigh", vec![f32s(&[2, 5, 5], 3400)], &[]),
        c(
            "linalg_eigh",
            vec![range(F64, &[4, 4], 3401, -2.0, 2.0)],
            &[upper(true)],
        ),
        c(
            "linalg_eigh",
            vec![f32s(&[3, 3], 3402)],
            &[("compute_v", b(false))],
        ),
        c("linalg_svd", vec![f32s(&[2, 5, 3], 3403)], &[]),
        c(
            "linalg_svd",
            vec![range(F64, &[3, 6], 3404, -2.0, 2.0)],
            &[("full_matrices", b(true))],
        ),
        c(
            "linalg_svd",
            vec![range(F64, &[2, 4, 3], 3405, -2.0, 2.0)],
            &[("full_matrices", b(true))],
        ),
        c(
            "linalg_svd",
            vec![f32s(&[4, 4], 3406)],
            &[("compute_uv", b(false))],
        ),
    ]
}

fn linalg_cases() -> Vec<Case> {
    use DType::*;
    let a = f32s(&[5, 7], 300);
    let bm = f32s(&[7, 6], 301);
    vec![
        c("trace", vec![a.clone()], &[]),
        c("trace", vec![whole(I32, &[4, 3], 330, -5, 5)], &[]),
        c(
            "linalg_cross",
            vec![f32s(&[4, 3], 331), f32s(&[1, 3], 332)],
            &[],
        ),
        c(
            "linalg_cross",
            vec![f32s(&[3, 2], 333), f32s(&[3, 2], 334)],
            &[("dim", i(0))],
        ),
        c("pdist", vec![f32s(&[5, 3], 1960)], &[("p", f(3.0))]),
        c("pdist", vec![rnd(F64, &[4, 2], 1961)], &[]),
        c(
            "pdist_backward",
            vec![
                f32s(&[6], 1962),
                f32s(&[4, 3], 1963),
                range(F32, &[6], 1964, 0.5, 2.0),
            ],
            &[("p", f(2.0))],
        ),
        c(
            "max_unpool",
            vec![
                f32s(&[2, 2, 2, 2], 1965),
                i64s(
                    &[2, 2, 2, 2],
                    &[0, 2, 7, 8, 1, 3, 5, 4, 8, 8, 0, 1, 2, 3, 4, 5],
                ),
            ],
            &[("output_size", is(&[3, 3]))],
        ),
        c(
            "embedding_renorm",
            vec![
                range(F32, &[6, 3], 1976, -2.0, 2.0),
                i64s(&[2, 2], &[0, 5, 5, 3]),
            ],
            &[("max_norm", f(1.0))],
        ),
        c(
            "embedding_renorm",
            vec![rnd(BF16, &[4, 3], 1977), idx(I32, &[3], &[1, 0, 3])],
            &[("max_norm", f(0.5)), ("norm_type", f(1.0))],
        ),
        c(
            "rrelu_with_noise",
            vec![f32s(&[4, 5], 1974)],
            &[
                ("lower", f(0.2)),
                ("upper", f(0.4)),
                ("seed", i(11)),
                ("offset", i(40)),
            ],
        ),
        c(
            "rrelu_with_noise",
            vec![rnd(BF16, &[6], 1975), i64s(&[], &[9]), i64s(&[], &[0])],
            &[],
        ),
        c(
            "nonzero_static",
            vec![h(F32, &[2, 3], &[0.0, 3.0, 0.0, 1.0, 0.0, 2.0])],
            &[("size", i(4)), ("fill_value", i(-7))],
        ),
        c(
            "cdist",
            vec![f32s(&[2, 4, 3], 335), f32s(&[5, 3], 336)],
            &[],
        ),
        c(
            "cdist",
            vec![f32s(&[4, 3], 337), f32s(&[6, 3], 338)],
            &[("p", f(1.5))],
        ),
        c(
            "cdist",
            vec![f32s(&[4, 3], 339), f32s(&[6, 3], 340)],
            &[("p", f(f64::INFINITY))],
        ),
        {
            let (x1, x2) = (f32s(&[4, 3], 341), f32s(&[5, 3], 342));
            let p3 = [("p", f(3.0))];
            let dist = fwd("cdist", &[x1.clone(), x2.clone()], &p3)[0].clone();
            c(
                "cdist_backward",
                vec![f32s(&[4, 5], 343), x1, x2, dist],
                &p3,
            )
        },
        {
            let (x1, x2) = (f32s(&[2, 4, 3], 344), f32s(&[2, 5, 3], 345));
            let dist = fwd("cdist", &[x1.clone(), x2.clone()], &[])[0].clone();
            c(
                "cdist_backward",
                vec![f32s(&[2, 4, 5], 346), x1, x2, dist],
                &[],
            )
        },
        c("matmul", vec![f32s(&[2, 3, 5, 7], 302), bm.clone()], &[]),
        c("matmul", vec![f32s(&[7], 303), bm.clone()], &[]),
        c("matmul", vec![a.clone(), f32s(&[7], 304)], &[]),
        c(
            "matmul",
            vec![f32s(&[3, 1, 4, 5], 305), f32s(&[2, 5, 2], 306)],
            &[],
        ),
        c(
            "matmul",
            vec![rnd(BF16, &[5, 7], 307), rnd(BF16, &[7, 6], 308)],
            &[],
        ),
        c("matmul", vec![f32s(&[0, 7], 309), bm.clone()], &[]),
        c("mm", vec![a.clone(), bm.clone()], &[]),
        c("mm", vec![f32s(&[3, 0], 310), f32s(&[0, 4], 311)], &[]),
        c(
            "mm",
            vec![rnd(F16, &[4, 9], 312), rnd(F16, &[9, 3], 313)],
            &[],
        ),
        c(
            "bmm",
            vec![f32s(&[3, 4, 5], 314), f32s(&[3, 5, 2], 315)],
            &[],
        ),
        c(
            "addmm",
            vec![f32s(&[6], 316), a.clone(), bm.clone()],
            &[("beta", f(0.5)), ("alpha", f(-2.0))],
        ),
        c(
            "baddbmm",
            vec![
                f32s(&[3, 4, 2], 317),
                f32s(&[3, 4, 5], 318),
                f32s(&[3, 5, 2], 319),
            ],
            &[("beta", f(0.25)), ("alpha", f(1.5))],
        ),
        c(
            "linear",
            vec![f32s(&[2, 3, 7], 320), f32s(&[4, 7], 321), f32s(&[4], 322)],
            &[],
        ),
        c("linear", vec![a.clone(), f32s(&[4, 7], 323)], &[]),
        c(
            "linear",
            vec![f32s(&[3, 0], 324), f32s(&[4, 0], 325), f32s(&[4], 326)],
            &[],
        ),
        c("dot", vec![f32s(&[9], 327), f32s(&[9], 328)], &[]),
        c("dot", vec![f32s(&[0], 329), f32s(&[0], 330)], &[]),
        c("outer", vec![f32s(&[4], 331), f32s(&[6], 332)], &[]),
        // Groups of 3, 0 and 4 rows of 9 (the last two rows in none), and
        // sizes that overrun the rows or go negative.
        c(
            "ragged_dot",
            vec![
                f32s(&[9, 5], 333),
                f32s(&[3, 5, 4], 334),
                i64s(&[3], &[3, 0, 4]),
            ],
            &[],
        ),
        c(
            "ragged_dot",
            vec![
                f32s(&[6, 5], 335),
                f32s(&[3, 5, 4], 336),
                idx(DType::I32, &[3], &[-2, 4, 9]),
            ],
            &[],
        ),
        c(
            "ragged_dot_rhs_grad",
            vec![
                f32s(&[9, 5], 337),
                f32s(&[9, 4], 338),
                i64s(&[3], &[3, 0, 4]),
            ],
            &[],
        ),
        c(
            "max_pool",
            vec![f32s(&[2, 3, 7, 6], 339)],
            &[
                ("kernel_size", is(&[3])),
                ("stride", is(&[2])),
                ("padding", is(&[1])),
                ("spatial_dims", i(2)),
            ],
        ),
        c(
            "max_pool",
            vec![h(DType::BF16, &[3, 9], &vals(340, 27, -3.0, 3.0))],
            &[
                ("kernel_size", is(&[2])),
                ("dilation", is(&[3])),
                ("ceil_mode", b(true)),
            ],
        ),
        c(
            "max_pool",
            vec![whole(DType::I32, &[1, 2, 4, 4, 5], 341, -50, 50)],
            &[("kernel_size", is(&[2, 2, 3])), ("stride", is(&[1, 2, 2]))],
        ),
        c(
            "max_pool_backward",
            vec![
                f32s(&[2, 2, 3], 342),
                f32s(&[2, 5, 6], 343),
                idx(
                    DType::I64,
                    &[2, 2, 3],
                    &[0, 3, 5, 12, 15, 17, 7, 8, 10, 19, 20, 29],
                ),
            ],
            &[("kernel_size", is(&[2])), ("spatial_dims", i(2))],
        ),
        c(
            "avg_pool",
            vec![f32s(&[2, 3, 7, 6], 346)],
            &[
                ("spatial_dims", i(2)),
                ("kernel_size", is(&[3])),
                ("stride", is(&[2])),
                ("padding", is(&[1])),
                ("ceil_mode", b(true)),
                ("count_include_pad", b(false)),
            ],
        ),
        c(
            "avg_pool",
            vec![h(DType::BF16, &[1, 3, 9], &vals(347, 27, -3.0, 3.0))],
            &[("kernel_size", is(&[2, 3])), ("divisor_override", i(4))],
        ),
        c(
            "avg_pool",
            vec![f32s(&[1, 2, 4, 5, 6], 348)],
            &[("kernel_size", is(&[2, 2, 3])), ("stride", is(&[1, 2, 2]))],
        ),
        c(
            "avg_pool_backward",
            vec![f32s(&[2, 4, 4], 349), f32s(&[2, 7, 6], 350)],
            &[
                ("kernel_size", is(&[3])),
                ("stride", is(&[2])),
                ("padding", is(&[1])),
                ("ceil_mode", b(true)),
                ("count_include_pad", b(false)),
                ("spatial_dims", i(2)),
            ],
        ),
        c(
            "avg_pool_backward",
            vec![
                h(DType::BF16, &[1, 3, 3], &vals(351, 9, -1.0, 1.0)),
                f32s(&[1, 5, 6], 352),
            ],
            &[
                ("kernel_size", is(&[3])),
                ("stride", is(&[2])),
                ("padding", is(&[1])),
                ("spatial_dims", i(2)),
            ],
        ),
        c(
            "adaptive_avg_pool",
            vec![f32s(&[2, 3, 9, 8], 353)],
            &[("output_size", is(&[4, 3]))],
        ),
        c(
            "adaptive_avg_pool",
            vec![h(DType::BF16, &[3, 8, 6], &vals(354, 144, -3.0, 3.0))],
            &[("output_size", is(&[4, 3]))],
        ),
        c(
            "adaptive_avg_pool",
            vec![f32s(&[2, 7, 5, 4], 355)],
            &[("output_size", is(&[3, 7, 4]))],
        ),
        c(
            "adaptive_avg_pool_backward",
            vec![f32s(&[2, 3, 4, 3], 356), f32s(&[2, 3, 9, 8], 357)],
            &[("spatial_dims", i(2))],
        ),
        c(
            "adaptive_avg_pool_backward",
            vec![
                h(DType::BF16, &[3, 4, 3], &vals(358, 36, -1.0, 1.0)),
                f32s(&[3, 8, 6], 359),
            ],
            &[("output_size", is(&[4, 3]))],
        ),
        c(
            "adaptive_avg_pool_backward",
            vec![f32s(&[1, 5, 7], 360), f32s(&[1, 2, 3], 361)],
            &[("spatial_dims", i(2))],
        ),
        c(
            "adaptive_max_pool",
            vec![f32s(&[2, 3, 9, 8], 370)],
            &[("output_size", is(&[4, 3]))],
        ),
        c(
            "adaptive_max_pool",
            vec![whole(DType::I32, &[2, 5, 4, 3], 371, -4, 4)],
            &[("output_size", is(&[3, 7, 2]))],
        ),
        {
            let x = f32s(&[2, 3, 7, 5], 372);
            let size = [("output_size", is(&[3, 4]))];
            let idx = fwd("adaptive_max_pool", std::slice::from_ref(&x), &size)[1].clone();
            c(
                "adaptive_max_pool_backward",
                vec![f32s(&[2, 3, 3, 4], 373), x, idx],
                &[("spatial_dims", i(2))],
            )
        },
        c(
            "im2col",
            vec![f32s(&[2, 3, 6, 7], 374)],
            &[
                ("kernel_size", is(&[2, 3])),
                ("dilation", is(&[1, 2])),
                ("padding", is(&[1, 2])),
                ("stride", is(&[2, 1])),
            ],
        ),
        c(
            "im2col",
            vec![rnd(DType::BF16, &[2, 5, 5], 375)],
            &[("kernel_size", is(&[3, 3]))],
        ),
        c(
            "col2im",
            vec![f32s(&[2, 18, 28], 376)],
            &[
                ("output_size", is(&[6, 7])),
                ("kernel_size", is(&[2, 3])),
                ("dilation", is(&[1, 2])),
                ("padding", is(&[1, 2])),
                ("stride", is(&[2, 1])),
            ],
        ),
        c(
            "col2im",
            vec![rnd(DType::BF16, &[9, 9], 377)],
            &[("output_size", is(&[5, 5])), ("kernel_size", is(&[3, 3]))],
        ),
        c(
            "grid_sampler_2d",
            vec![
                f32s(&[2, 3, 5, 6], 378),
                range(DType::F32, &[2, 4, 3, 2], 379, -1.3, 1.3),
            ],
            &[],
        ),
        c(
            "grid_sampler_2d",
            vec![
                f32s(&[1, 2, 4, 5], 380),
                range(DType::F32, &[1, 3, 3, 2], 381, -1.5, 1.5),
            ],
            &[
                ("interpolation_mode", i(1)),
                ("padding_mode", i(2)),
                ("align_corners", b(true)),
            ],
        ),
        c(
            "grid_sampler_2d_backward",
            vec![
                f32s(&[2, 3, 4, 3], 382),
                f32s(&[2, 3, 5, 6], 383),
                range(DType::F32, &[2, 4, 3, 2], 384, -1.3, 1.3),
            ],
            &[("padding_mode", i(1))],
        ),
        c(
            "grid_sampler_2d_backward",
            vec![
                f32s(&[1, 2, 3, 3], 385),
                f32s(&[1, 2, 4, 5], 386),
                range(DType::F32, &[1, 3, 3, 2], 387, -1.5, 1.5),
            ],
            &[("padding_mode", i(2))],
        ),
        c(
            "upsample_nearest",
            vec![f32s(&[2, 3, 5, 7], 362)],
            &[("output_size", is(&[9, 4]))],
        ),
        c(
            "upsample_nearest",
            vec![whole(DType::I32, &[2, 5], 363, -50, 50)],
            &[
                ("output_size", is(&[11])),
                ("scales", Attr::Floats(vec![2.3])),
                ("exact", b(true)),
            ],
        ),
        c(
            "upsample_nearest",
            vec![f32s(&[1, 2, 3, 4, 5], 364)],
            &[("output_size", is(&[6, 8, 3]))],
        ),
        c(
            "upsample_nearest_backward",
            vec![f32s(&[2, 3, 9, 4], 365)],
            &[
                ("output_size", is(&[9, 4])),
                ("input_size", is(&[2, 3, 5, 7])),
            ],
        ),
        c(
            "upsample_linear",
            vec![f32s(&[2, 3, 5, 7], 366)],
            &[("output_size", is(&[9, 11]))],
        ),
        c(
            "upsample_linear",
            vec![h(DType::BF16, &[1, 2, 5, 7], &vals(367, 70, -3.0, 3.0))],
            &[("output_size", is(&[3, 16])), ("align_corners", b(true))],
        ),
        c(
            "upsample_linear",
            vec![f32s(&[1, 2, 3, 4, 5], 368)],
            &[
                ("output_size", is(&[6, 9, 2])),
                ("scales", Attr::Floats(vec![2.0, 2.3, 0.5])),
            ],
        ),
        c(
            "upsample_linear_backward",
            vec![f32s(&[2, 3, 9, 11], 369)],
            &[
                ("output_size", is(&[9, 11])),
                ("input_size", is(&[2, 3, 5, 7])),
                ("align_corners", b(true)),
            ],
        ),
        c(
            "upsample_linear_backward",
            vec![h(DType::BF16, &[2, 3, 11], &vals(370, 66, -1.0, 1.0))],
            &[("output_size", is(&[11])), ("input_size", is(&[2, 3, 4]))],
        ),
        c(
            "upsample_cubic",
            vec![f32s(&[2, 3, 5, 7], 2411)],
            &[("output_size", is(&[9, 4]))],
        ),
        c(
            "upsample_cubic",
            vec![h(DType::BF16, &[1, 2, 5, 7], &vals(2412, 70, -3.0, 3.0))],
            &[("output_size", is(&[3, 16])), ("align_corners", b(true))],
        ),
        c(
            "upsample_cubic_backward",
            vec![f32s(&[2, 3, 9, 4], 2413)],
            &[
                ("output_size", is(&[9, 4])),
                ("input_size", is(&[2, 3, 5, 7])),
            ],
        ),
        c(
            "upsample_antialias",
            vec![f32s(&[2, 3, 17, 9], 2414)],
            &[("output_size", is(&[5, 20]))],
        ),
        c(
            "upsample_antialias",
            vec![f32s(&[1, 2, 16, 12], 2415)],
            &[
                ("output_size", is(&[7, 3])),
                ("mode", s("cubic")),
                ("align_corners", b(true)),
            ],
        ),
        c(
            "upsample_antialias_backward",
            vec![f32s(&[2, 3, 5, 20], 2416)],
            &[
                ("output_size", is(&[5, 20])),
                ("input_size", is(&[2, 3, 17, 9])),
                ("mode", s("cubic")),
            ],
        ),
        c(
            "batch_norm",
            vec![
                f32s(&[4, 3, 5, 2], 377),
                f32s(&[3], 378),
                f32s(&[3], 379),
                f32s(&[3], 380),
                range(DType::F32, &[3], 381, 0.5, 2.0),
            ],
            &[("training", b(true)), ("momentum", f(0.2))],
        ),
        c(
            "batch_norm",
            vec![
                h(DType::BF16, &[2, 3, 4], &vals(382, 24, -2.0, 2.0)),
                f32s(&[3], 383),
                f32s(&[3], 384),
                f32s(&[3], 385),
                range(DType::F32, &[3], 386, 0.5, 2.0),
            ],
            &[("training", b(false))],
        ),
        c(
            "batch_norm",
            vec![f32s(&[6, 4], 387), f32s(&[4], 388), f32s(&[4], 389)],
            &[("eps", f(1e-3))],
        ),
        c(
            "batch_norm_backward",
            vec![
                f32s(&[4, 3, 5, 2], 390),
                f32s(&[4, 3, 5, 2], 391),
                f32s(&[3], 392),
                f32s(&[3], 393),
                range(DType::F32, &[3], 394, 0.5, 2.0),
            ],
            &[("training", b(true))],
        ),
        c(
            "batch_norm_backward",
            vec![
                h(DType::BF16, &[2, 3, 4], &vals(395, 24, -2.0, 2.0)),
                h(DType::BF16, &[2, 3, 4], &vals(396, 24, -2.0, 2.0)),
                f32s(&[3], 397),
                f32s(&[3], 398),
                range(DType::F32, &[3], 399, 0.5, 2.0),
            ],
            &[("training", b(false)), ("output_mask", is(&[1, 0, 1]))],
        ),
        c(
            "group_norm_backward",
            vec![
                f32s(&[2, 6, 3, 2], 400),
                f32s(&[2, 6, 3, 2], 401),
                f32s(&[2, 3], 402),
                range(DType::F32, &[2, 3], 403, 0.5, 2.0),
                f32s(&[6], 404),
            ],
            &[("groups", i(3))],
        ),
        c(
            "group_norm_backward",
            vec![
                h(DType::BF16, &[2, 4, 5], &vals(405, 40, -2.0, 2.0)),
                h(DType::BF16, &[2, 4, 5], &vals(406, 40, -2.0, 2.0)),
                f32s(&[2, 2], 407),
                range(DType::F32, &[2, 2], 408, 0.5, 2.0),
                f32s(&[4], 409),
            ],
            &[("groups", i(2)), ("output_mask", is(&[1, 1, 0]))],
        ),
        // bf16 with overlapping windows (the grads added in output order).
        c(
            "max_pool_backward",
            vec![
                h(DType::BF16, &[1, 3, 3], &vals(344, 9, -1.0, 1.0)),
                f32s(&[1, 5, 6], 345),
                idx(DType::I64, &[1, 3, 3], &[7, 7, 10, 7, 7, 15, 25, 26, 27]),
            ],
            &[
                ("kernel_size", is(&[3])),
                ("stride", is(&[2])),
                ("padding", is(&[1])),
                ("spatial_dims", i(2)),
            ],
        ),
    ]
}

fn nn_cases() -> Vec<Case> {
    use DType::*;
    let x = range(F32, &[4, 5, 8], 400, -4.0, 4.0);
    let ln = |n: i64| ("normalized_shape", is(&[n]));
    vec![
        c("softmax", vec![x.clone()], &[("dim", i(-1))]),
        c("softmax", vec![x.clone()], &[("dim", i(0))]),
        c("softmax", vec![rnd(BF16, &[4, 8], 401)], &[("dim", i(1))]),
        c(
            "softmax",
            vec![rnd(BF16, &[4, 8], 402)],
            &[("dim", i(1)), ("dtype", dt(F32))],
        ),
        c("softmax", vec![f32s(&[5, 0], 403)], &[("dim", i(1))]),
        c("log_softmax", vec![x.clone()], &[("dim", i(1))]),
        c(
            "log_softmax",
            vec![rnd(F16, &[3, 9], 404)],
            &[("dim", i(-1))],
        ),
        c(
            "layer_norm",
            vec![x.clone(), f32s(&[8], 405), f32s(&[8], 406)],
            &[ln(8), ("eps", f(1e-5))],
        ),
        c(
            "layer_norm",
            vec![x.clone()],
            &[("normalized_shape", is(&[5, 8]))],
        ),
        c(
            "layer_norm",
            vec![
                rnd(BF16, &[3, 16], 407),
                rnd(BF16, &[16], 408),
                rnd(BF16, &[16], 409),
            ],
            &[ln(16)],
        ),
        c(
            "rms_norm",
            vec![x.clone(), f32s(&[8], 411)],
            &[ln(8), ("eps", f(1e-6))],
        ),
        c("rms_norm", vec![x.clone()], &[ln(8)]),
        c(
            "rms_norm",
            vec![rnd(BF16, &[3, 16], 412), rnd(BF16, &[16], 413)],
            &[ln(16)],
        ),
        c(
            "fused_rms_norm",
            vec![x.clone(), f32s(&[8], 414)],
            &[ln(8), ("eps", f(1e-6))],
        ),
        c("fused_rms_norm", vec![rnd(BF16, &[3, 16], 415)], &[ln(16)]),
    ]
}

fn random_cases() -> Vec<Case> {
    use DType::*;
    let x = f32s(&[6, 7], 500);
    vec![
        c(
            "uniform",
            vec![],
            &[("size", is(&[5, 6])), ("seed", i(42)), ("offset", i(7))],
        ),
        c(
            "uniform",
            vec![],
            &[
                ("size", is(&[40])),
                ("low", f(-2.0)),
                ("high", f(3.0)),
                ("dtype", dt(BF16)),
                ("seed", i(3)),
            ],
        ),
        c(
            "uniform",
            vec![scalar(I64, 42.0), scalar(I64, 7.0)],
            &[("size", is(&[5, 6]))],
        ),
        c("uniform", vec![], &[("size", is(&[0, 3])), ("seed", i(1))]),
        c("randperm", vec![], &[("n", i(300)), ("seed", i(8))]),
        c(
            "randperm",
            vec![scalar(I64, 4.0), scalar(I64, 90.0)],
            &[("n", i(17)), ("dtype", dt(I32))],
        ),
        c("randperm", vec![], &[("n", i(0)), ("seed", i(8))]),
        // Several groups of 64 counters, begun and ended inside one.
        c(
            "uniform",
            vec![],
            &[("size", is(&[3, 70])), ("seed", i(5)), ("offset", i(61))],
        ),
        c(
            "uniform",
            vec![scalar(I64, 6.0), scalar(I64, 127.0)],
            &[("size", is(&[129])), ("dtype", dt(F16))],
        ),
        // Offsets are u64 bits: counters 2^64 - 3 .. 2^64 + 4 carry into
        // the third Philox word.
        c(
            "uniform",
            vec![scalar(I64, -7.0), scalar(I64, -3.0)],
            &[("size", is(&[8]))],
        ),
        c(
            "normal",
            vec![],
            &[
                ("size", is(&[33])),
                ("mean", f(1.0)),
                ("std", f(2.0)),
                ("seed", i(9)),
                ("offset", i(100)),
            ],
        ),
        c(
            "normal",
            vec![scalar(I64, 11.0), scalar(I32, 5.0)],
            &[("size", is(&[4, 5])), ("dtype", dt(F64))],
        ),
        c(
            "bernoulli",
            vec![range(F32, &[6, 7], 501, 0.0, 1.0)],
            &[("seed", i(9)), ("offset", i(4))],
        ),
        c(
            "bernoulli",
            vec![x.clone()],
            &[("p", f(0.3)), ("seed", i(2))],
        ),
        // Shapes below and above 1 (0 and a negative one floor at the
        // smallest normal number); rates on both sides of 10.
        c(
            "standard_gamma",
            vec![h(F32, &[6], &[0.3, 1.0, 2.5, 40.0, 0.0, -1.0])],
            &[("seed", i(12)), ("offset", i(3))],
        ),
        c(
            "standard_gamma",
            vec![
                range(F64, &[3, 4], 506, 0.05, 6.0),
                scalar(I64, 2.0),
                scalar(I64, 9.0),
            ],
            &[],
        ),
        c(
            "poisson",
            vec![h(F32, &[7], &[0.0, 0.5, 3.0, 9.9, 10.0, 55.5, 1e4])],
            &[("seed", i(13))],
        ),
        c(
            "poisson",
            vec![
                range(F64, &[2, 5], 507, 0.0, 30.0),
                scalar(I64, 3.0),
                scalar(I64, 1.0),
            ],
            &[],
        ),
        c(
            "binomial",
            vec![
                h(F32, &[8], &[0.0, 1.0, 5.0, 20.0, 30.0, 50.0, 400.0, 1e5]),
                h(F32, &[8], &[0.5, 0.5, 0.9, 0.4, 0.95, 0.3, 0.7, 0.25]),
            ],
            &[("seed", i(14))],
        ),
        c(
            "binomial",
            vec![
                range(F64, &[2, 5], 508, 0.0, 80.0),
                range(F64, &[5], 509, 0.0, 1.0),
                scalar(I64, 4.0),
                scalar(I64, 2.0),
            ],
            &[],
        ),
        c(
            "bernoulli",
            vec![
                range(BF16, &[6, 7], 502, 0.0, 1.0),
                scalar(I64, 5.0),
                scalar(I64, 17.0),
            ],
            &[],
        ),
        c(
            "dropout",
            vec![x.clone()],
            &[("p", f(0.3)), ("seed", i(77)), ("offset", i(1000))],
        ),
        c(
            "dropout",
            vec![rnd(BF16, &[6, 7], 503), scalar(I64, 77.0), scalar(I64, 3.0)],
            &[("p", f(0.5))],
        ),
        c(
            "dropout",
            vec![x.clone()],
            &[("p", f(0.5)), ("train", b(false))],
        ),
        c(
            "dropout",
            vec![f32s(&[4, 0], 504)],
            &[("p", f(0.5)), ("seed", i(1))],
        ),
    ]
}

fn loss_cases() -> Vec<Case> {
    use DType::*;
    let logits = range(F32, &[5, 4], 600, -3.0, 3.0);
    let lp = fwd(
        "log_softmax",
        std::slice::from_ref(&logits),
        &[("dim", i(1))],
    )
    .remove(0);
    let target = i64s(&[5], &[2, -100, 0, 3, 1]);
    let w = range(F32, &[4], 601, 0.5, 2.0);
    let x4 = range(F32, &[2, 3, 2, 2], 602, -3.0, 3.0);
    let t4 = i64s(&[2, 2, 2], &[0, 2, 1, 1, 2, 0, 1, -100]);
    let red = |r: &str| ("reduction", s(r));
    let mut cases = Vec::new();
    for r in ["none", "mean", "sum"] {
        cases.push(c(
            "nll_loss",
            vec![lp.clone(), target.clone(), w.clone()],
            &[red(r)],
        ));
    }
    cases.push(c("nll_loss", vec![x4.clone(), t4.clone()], &[red("none")]));
    cases.push(c(
        "nll_loss",
        vec![f32s(&[0, 3], 603), i64s(&[0], &[])],
        &[red("sum")],
    ));
    for (r, gdims) in [("mean", vec![]), ("none", vec![5u64])] {
        let out = fwd(
            "nll_loss",
            &[lp.clone(), target.clone(), w.clone()],
            &[red(r)],
        );
        cases.push(c(
            "nll_loss_backward",
            vec![
                f32s(&gdims, 604),
                lp.clone(),
                target.clone(),
                w.clone(),
                out[1].clone(),
            ],
            &[red(r)],
        ));
    }
    let out = fwd("nll_loss", &[x4.clone(), t4.clone()], &[red("sum")]);
    cases.push(c(
        "nll_loss_backward",
        vec![scalar(F32, 0.5), x4.clone(), t4.clone(), out[1].clone()],
        &[red("sum")],
    ));
    cases.extend([
        c(
            "cross_entropy",
            vec![logits.clone(), target.clone(), w.clone()],
            &[("label_smoothing", f(0.2))],
        ),
        c(
            "cross_entropy",
            vec![x4.clone(), t4.clone()],
            &[red("none"), ("label_smoothing", f(0.1))],
        ),
        c(
            "cross_entropy",
            vec![logits.clone(), range(F32, &[5, 4], 605, 0.0, 1.0)],
            &[red("sum")],
        ),
        c(
            "cross_entropy",
            vec![rnd(BF16, &[5, 4], 606), idx(I32, &[5], &[0, 1, 2, 3, 0])],
            &[],
        ),
        c("mse_loss", vec![f32s(&[3, 4], 608), f32s(&[4], 609)], &[]),
        c(
            "multi_margin_loss",
            vec![
                f32s(&[4, 5], 1921),
                idx(I64, &[4], &[0, 4, 2, 2]),
                range(F32, &[5], 1922, 0.5, 1.5),
            ],
            &[("p", i(2)), ("margin", f(0.7)), red("sum")],
        ),
        c(
            "multi_margin_loss",
            vec![rnd(BF16, &[5], 1923), idx(I64, &[], &[3])],
            &[red("none")],
        ),
        c(
            "multi_margin_loss_backward",
            vec![
                f32s(&[4], 1924),
                f32s(&[4, 5], 1925),
                idx(I32, &[4], &[1, 0, 4, 3]),
            ],
            &[red("none")],
        ),
        c(
            "multilabel_margin_loss",
            vec![
                f32s(&[3, 4], 1926),
                idx(I64, &[3, 4], &[3, 0, -1, 1, 1, 2, 3, 0, -1, 0, 0, 0]),
            ],
            &[],
        ),
        c(
            "multilabel_margin_loss_backward",
            vec![
                scalar(F32, 0.5),
                f32s(&[3, 4], 1927),
                idx(I64, &[3, 4], &[3, 0, -1, 1, 1, 2, 3, 0, -1, 0, 0, 0]),
                h(
                    F32,
                    &[3, 4],
                    &[1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0],
                ),
            ],
            &[red("sum")],
        ),
        c(
            "mse_loss",
            vec![f32s(&[4, 0], 614), f32s(&[4, 0], 615)],
            &[red("sum")],
        ),
        c(
            "cross_entropy",
            vec![f32s(&[2, 3, 0], 607), i64s(&[2, 0], &[])],
            &[red("none")],
        ),
        c(
            "mse_loss",
            vec![f32s(&[3, 4], 610), f32s(&[3, 4], 611)],
            &[red("none")],
        ),
        c(
            "mse_loss",
            vec![rnd(F16, &[6], 612), rnd(F16, &[6], 613)],
            &[red("sum")],
        ),
        c(
            "mse_loss_backward",
            vec![scalar(F32, 1.5), f32s(&[3, 4], 616), f32s(&[4], 617)],
            &[],
        ),
        c(
            "mse_loss_backward",
            vec![f32s(&[3, 4], 618), f32s(&[3, 4], 619), f32s(&[3, 4], 620)],
            &[red("none")],
        ),
    ]);
    cases
}

fn attention_cases() -> Vec<Case> {
    use DType::*;
    let q = f32s(&[2, 4, 3, 4], 700);
    let k = f32s(&[2, 2, 5, 4], 701);
    let v = f32s(&[2, 2, 5, 3], 702);
    let gqa = || ("enable_gqa", b(true));
    // Bool mask [2, 1, 3, 5]: every row keeps at least one key.
    let mut mv = Vec::new();
    for bi in 0..2 {
        for r in 0..3 {
            for j in 0..5 {
                mv.push(((r + j + bi) % 3 != 0 || j == 0) as u8 as f64);
            }
        }
    }
    let mask = h(Bool, &[2, 1, 3, 5], &mv);
    let fmask = f32s(&[3, 5], 703);
    let drop = [("dropout_p", f(0.25)), ("seed", i(123)), ("offset", i(8))];
    let qkv = vec![q.clone(), k.clone(), v.clone()];
    let sdpa = "scaled_dot_product_attention";
    let mut cases = vec![
        c(sdpa, qkv.clone(), &[gqa()]),
        c(
            sdpa,
            qkv.clone(),
            &[gqa(), ("is_causal", b(true)), ("scale", f(0.4))],
        ),
        c(
            sdpa,
            vec![q.clone(), k.clone(), v.clone(), mask.clone()],
            &[gqa()],
        ),
        c(
            sdpa,
            vec![q.clone(), k.clone(), v.clone(), fmask.clone()],
            &[gqa()],
        ),
        c(
            sdpa,
            qkv.clone(),
            &[gqa(), drop[0].clone(), drop[1].clone(), drop[2].clone()],
        ),
        c(
            sdpa,
            vec![
                q.clone(),
                k.clone(),
                v.clone(),
                scalar(I64, 5.0),
                scalar(I64, 2.0),
            ],
            &[gqa(), ("dropout_p", f(0.5))],
        ),
        c(
            sdpa,
            vec![
                rnd(BF16, &[1, 2, 4, 8], 704),
                rnd(BF16, &[1, 2, 6, 8], 705),
                rnd(BF16, &[1, 2, 6, 8], 706),
            ],
            &[("is_causal", b(true))],
        ),
        // No queries.
    ];
    // Backward, with the forward's outputs as inputs.
    let bwd = "scaled_dot_product_attention_backward";
    let with = |extra: &[HostTensor], attrs: &[(&str, Attr)], seed: u64| -> Case {
        let mut ins = qkv.clone();
        ins.extend(extra.iter().cloned());
        let out = fwd(sdpa, &ins, attrs);
        let mut b_ins = vec![f32s(out[0].dims(), seed)];
        b_ins.extend(qkv.iter().cloned());
        b_ins.extend(out);
        b_ins.extend(extra.iter().cloned());
        c(bwd, b_ins, attrs)
    };
    cases.push(with(&[], &[gqa(), ("is_causal", b(true))], 710));
    cases.push(with(
        std::slice::from_ref(&mask),
        &[gqa(), ("scale", f(0.7))],
        711,
    ));
    cases.push(with(std::slice::from_ref(&fmask), &[gqa()], 712));
    cases.push(with(
        &[],
        &[gqa(), drop[0].clone(), drop[1].clone(), drop[2].clone()],
        713,
    ));
    cases
}

fn backward_cases() -> Vec<Case> {
    use DType::*;
    let x = range(F32, &[4, 6], 800, -3.0, 3.0);
    let g = f32s(&[4, 6], 801);
    let dim = || ("dim", i(1));
    let sm = fwd("softmax", std::slice::from_ref(&x), &[dim()]).remove(0);
    let lsm = fwd("log_softmax", std::slice::from_ref(&x), &[dim()]).remove(0);
    let sg = fwd("sigmoid", std::slice::from_ref(&x), &[]).remove(0);
    let th = fwd("tanh", std::slice::from_ref(&x), &[]).remove(0);
    let x3 = f32s(&[3, 2, 4], 802);
    let w = f32s(&[2, 4], 803);
    let bias = f32s(&[2, 4], 804);
    let ln = [("normalized_shape", is(&[2, 4])), ("eps", f(1e-5))];
    let lnf = fwd("layer_norm", &[x3.clone(), w.clone(), bias.clone()], &ln);
    let g3 = f32s(&[3, 2, 4], 805);
    let ids = i64s(&[2, 3], &[1, 3, 1, 0, 3, 3]);
    let zero_g = f32s(&[0, 6], 806);
    let zero_last = f32s(&[6, 0], 809);
    vec![
        c("softmax_backward", vec![g.clone(), sm.clone()], &[dim()]),
        c(
            "softmax_backward",
            vec![g.clone(), sm.clone()],
            &[dim(), ("input_dtype", dt(BF16))],
        ),
        c(
            "log_softmax_backward",
            vec![g.clone(), lsm.clone()],
            &[dim()],
        ),
        c("gelu_backward", vec![g.clone(), x.clone()], &[]),
        c(
            "gelu_backward",
            vec![g.clone(), x.clone()],
            &[("approximate", s("tanh"))],
        ),
        c(
            "gelu_backward",
            vec![rnd(BF16, &[4, 6], 807), rnd(BF16, &[4, 6], 808)],
            &[],
        ),
        c("silu_backward", vec![g.clone(), x.clone()], &[]),
        c("sigmoid_backward", vec![g.clone(), sg.clone()], &[]),
        c("tanh_backward", vec![g.clone(), th.clone()], &[]),
        c(
            "threshold_backward",
            vec![g.clone(), x.clone()],
            &[("threshold", f(0.5))],
        ),
        c(
            "layer_norm_backward",
            vec![
                g3.clone(),
                x3.clone(),
                lnf[1].clone(),
                lnf[2].clone(),
                w.clone(),
                bias.clone(),
            ],
            &ln,
        ),
        c(
            "layer_norm_backward",
            vec![
                g3.clone(),
                x3.clone(),
                lnf[1].clone(),
                lnf[2].clone(),
                w.clone(),
                bias.clone(),
            ],
            &[
                ln[0].clone(),
                ln[1].clone(),
                ("output_mask", is(&[1, 0, 1])),
            ],
        ),
        c(
            "rms_norm_backward",
            vec![g3.clone(), x3.clone(), f32s(&[4], 810)],
            &[("normalized_shape", is(&[4])), ("eps", f(1e-6))],
        ),
        c(
            "rms_norm_backward",
            vec![g3.clone(), x3.clone()],
            &[("normalized_shape", is(&[2, 4]))],
        ),
        c(
            "fused_rms_norm_backward",
            vec![
                g3.clone(),
                x3.clone(),
                range(F32, &[3, 2, 1], 812, 0.5, 2.0),
                f32s(&[4], 813),
            ],
            &[("normalized_shape", is(&[4])), ("output_mask", is(&[1, 1]))],
        ),
        c(
            "fused_rms_norm_backward",
            vec![
                g3.clone(),
                x3.clone(),
                range(F32, &[3, 1, 1], 814, 0.5, 2.0),
            ],
            &[("normalized_shape", is(&[2, 4]))],
        ),
        c(
            "embedding_backward",
            vec![f32s(&[2, 3, 2], 811), ids.clone()],
            &[("num_weights", i(5))],
        ),
        c(
            "embedding_backward",
            vec![f32s(&[2, 3, 2], 812), ids.clone()],
            &[
                ("num_weights", i(5)),
                ("padding_idx", i(3)),
                ("scale_grad_by_freq", b(true)),
            ],
        ),
        c(
            "embedding_backward",
            vec![f32s(&[0, 2], 813), i64s(&[0], &[])],
            &[("num_weights", i(3))],
        ),
        c(
            "index_select_backward",
            vec![f32s(&[3, 3], 814), i64s(&[3], &[2, 0, 2])],
            &[("dim", i(0)), ("self_sizes", is(&[4, 3]))],
        ),
        c(
            "gather_backward",
            vec![f32s(&[4, 2], 815), i64s(&[4, 2], &[0, 2, 1, 1, 2, 0, 0, 0])],
            &[("dim", i(1)), ("self_sizes", is(&[4, 3]))],
        ),
        c("cumsum_backward", vec![g.clone()], &[dim()]),
        c("cumsum_backward", vec![zero_g], &[("dim", i(0))]),
        c("tanh_backward", vec![zero_last.clone(), zero_last], &[]),
    ]
}

fn conv_cases() -> Vec<Case> {
    use DType::*;
    let x2 = f32s(&[2, 4, 5, 6], 900);
    let w2 = f32s(&[6, 2, 3, 2], 901);
    let b2 = f32s(&[6], 902);
    let geo = [
        ("stride", is(&[1, 2])),
        ("padding", is(&[1, 0])),
        ("dilation", is(&[1, 1])),
        ("groups", i(2)),
    ];
    let y2 = fwd("conv2d", &[x2.clone(), w2.clone()], &geo);
    let x1 = f32s(&[2, 3, 7], 903);
    let w1 = f32s(&[4, 3, 3], 904);
    let tgeo = [
        ("stride", is(&[2, 2])),
        ("padding", is(&[1, 1])),
        ("transposed", b(true)),
        ("output_padding", is(&[1, 0])),
    ];
    let xt = f32s(&[1, 3, 3, 4], 905);
    let wt = f32s(&[3, 2, 3, 3], 906);
    let yt = fwd("convolution", &[xt.clone(), wt.clone()], &tgeo);
    vec![
        c(
            "conv1d",
            vec![x1.clone(), w1.clone(), f32s(&[4], 907)],
            &[("stride", i(2))],
        ),
        c(
            "conv1d",
            vec![x1.clone(), w1.clone()],
            &[("padding", s("same")), ("dilation", i(2))],
        ),
        c(
            "conv1d",
            vec![rnd(BF16, &[2, 3, 7], 908), rnd(BF16, &[4, 3, 3], 909)],
            &[],
        ),
        c("conv1d", vec![f32s(&[0, 3, 7], 910), w1.clone()], &[]),
        c("conv2d", vec![x2.clone(), w2.clone(), b2.clone()], &geo),
        c(
            "conv2d",
            vec![f32s(&[3, 6, 6], 911), f32s(&[2, 3, 3, 3], 912)],
            &[("padding", i(1))],
        ),
        c(
            "conv3d",
            vec![
                f32s(&[1, 2, 3, 4, 4], 913),
                f32s(&[3, 2, 2, 2, 2], 914),
                f32s(&[3], 915),
            ],
            &[("stride", is(&[1, 2, 1]))],
        ),
        c(
            "convolution",
            vec![xt.clone(), wt.clone(), f32s(&[2], 916)],
            &tgeo,
        ),
        c("convolution", vec![x2.clone(), w2.clone()], &geo),
        c(
            "convolution_backward",
            vec![f32s(y2[0].dims(), 917), x2.clone(), w2.clone()],
            &geo,
        ),
        c(
            "convolution_backward",
            vec![f32s(yt[0].dims(), 918), xt.clone(), wt.clone()],
            &tgeo,
        ),
        c(
            "convolution_backward",
            vec![f32s(y2[0].dims(), 919), x2.clone(), w2.clone()],
            &[
                geo[0].clone(),
                geo[1].clone(),
                geo[3].clone(),
                ("output_mask", is(&[0, 1, 1])),
            ],
        ),
        c(
            "convolution_backward",
            vec![f32s(&[0, 4, 5], 920), f32s(&[0, 3, 7], 921), w1.clone()],
            &[],
        ),
    ]
}

fn index_cases() -> Vec<Case> {
    use DType::*;
    let x = h(
        F32,
        &[3, 5],
        &[3., 1., 4., 1., 5., -9., 2., 6., 5., 3., 5., 8., -9., 7., 9.],
    );
    let weight = f32s(&[5, 3], 1000);
    let indices = i64s(&[7], &[0, 2, 1, 3, 3, 1, 0]);
    let offsets = i64s(&[4], &[0, 2, 2, 5]);
    let bag = |m: &str| ("mode", s(m));
    vec![
        c("sort", vec![x.clone()], &[]),
        c(
            "sort",
            vec![x.clone()],
            &[("descending", b(true)), ("stable", b(true))],
        ),
        c("sort", vec![x.clone()], &[("dim", i(0))]),
        c(
            "sort",
            vec![whole(I64, &[9], 1001, -5, 5)],
            &[("stable", b(true))],
        ),
        c("sort", vec![rnd(BF16, &[4, 6], 1002)], &[("dim", i(1))]),
        c("sort", vec![f32s(&[0], 1003)], &[]),
        c("topk", vec![x.clone()], &[("k", i(2))]),
        c(
            "topk",
            vec![x.clone()],
            &[("k", i(1)), ("dim", i(0)), ("largest", b(false))],
        ),
        c("topk", vec![f32s(&[4, 9], 1004)], &[("k", i(0))]),
        c("kthvalue", vec![x.clone()], &[("k", i(2))]),
        c(
            "kthvalue",
            vec![whole(I64, &[4, 5], 1005, -3, 3)],
            &[("k", i(4)), ("dim", i(0)), ("keepdim", b(true))],
        ),
        c("median", vec![x.clone()], &[("dim", i(1))]),
        c("median", vec![x.clone()], &[]),
        c("mode", vec![whole(F32, &[4, 9], 1008, -2, 3)], &[]),
        c(
            "mode",
            vec![whole(I64, &[5, 3], 1009, 0, 3)],
            &[("dim", i(0)), ("keepdim", b(true))],
        ),
        c("mode", vec![h(F32, &[0, 3], &[])], &[("dim", i(1))]),
        c(
            "median",
            vec![whole(I32, &[6, 4], 1006, -9, 9)],
            &[("dim", i(0)), ("keepdim", b(true)), ("ignore_nan", b(true))],
        ),
        c(
            "searchsorted",
            vec![h(F32, &[5], &[-1., 0., 0., 2., 3.5]), f32s(&[3, 4], 1007)],
            &[],
        ),
        c(
            "searchsorted",
            vec![
                h(F32, &[2, 3], &[0., 1., 2., -1., -1., 0.5]),
                f32s(&[2, 5], 1008),
                i64s(&[2, 3], &[2, 0, 1, 0, 1, 2]),
            ],
            &[("right", b(true)), ("out_int32", b(true))],
        ),
        c(
            "searchsorted",
            vec![i64s(&[4], &[-2, 0, 0, 1]), whole(I64, &[7], 1009, -3, 3)],
            &[("right", b(true))],
        ),
        c(
            "masked_scatter",
            vec![x.clone(), bools(&[5], 1010), f32s(&[4, 4], 1011)],
            &[],
        ),
        c(
            "masked_scatter_backward",
            vec![f32s(&[3, 5], 1012), bools(&[3, 5], 1013)],
            &[("sizes", is(&[4, 5]))],
        ),
        c(
            "embedding_bag",
            vec![weight.clone(), indices.clone(), offsets.clone()],
            &[bag("sum")],
        ),
        c(
            "embedding_bag",
            vec![weight.clone(), indices.clone(), offsets.clone()],
            &[bag("mean")],
        ),
        c(
            "embedding_bag",
            vec![weight.clone(), indices.clone(), offsets.clone()],
            &[bag("max")],
        ),
        c(
            "embedding_bag",
            vec![
                weight.clone(),
                indices.clone(),
                i64s(&[5], &[0, 2, 2, 5, 7]),
            ],
            &[
                bag("mean"),
                ("include_last_offset", b(true)),
                ("padding_idx", i(3)),
            ],
        ),
        c(
            "embedding_bag",
            vec![
                weight.clone(),
                indices.clone(),
                offsets.clone(),
                f32s(&[7], 1005),
            ],
            &[bag("sum")],
        ),
        c(
            "embedding_bag",
            vec![weight.clone(), i64s(&[2, 3], &[0, 1, 2, 4, 4, 0])],
            &[("mode", i(1))],
        ),
        c(
            "embedding_bag_backward",
            vec![
                f32s(&[4, 3], 1011),
                indices.clone(),
                i64s(&[7], &[0, 0, 2, 2, 2, 3, 3]),
                i64s(&[4], &[2, 0, 3, 2]),
                i64s(&[0], &[]),
            ],
            &[bag("mean"), ("num_weights", i(5)), ("padding_idx", i(3))],
        ),
        c(
            "embedding_bag_backward",
            vec![
                f32s(&[4, 3], 1012),
                indices.clone(),
                i64s(&[7], &[0, 0, 2, 2, 2, 3, 3]),
                i64s(&[4], &[2, 0, 3, 2]),
                i64s(&[0], &[]),
                f32s(&[7], 1013),
            ],
            &[
                bag("sum"),
                ("num_weights", i(5)),
                ("scale_grad_by_freq", b(true)),
            ],
        ),
        c(
            "embedding_bag_backward",
            vec![
                f32s(&[4, 3], 1014),
                indices.clone(),
                i64s(&[7], &[0, 0, 2, 2, 2, 3, 3]),
                i64s(&[4], &[2, 0, 3, 2]),
                i64s(&[4, 3], &[0, 2, 0, -1, -1, -1, 1, 3, 3, 1, 0, 1]),
            ],
            &[bag("max"), ("num_weights", i(5))],
        ),
        c(
            "embedding_bag_per_sample_weights_backward",
            vec![
                f32s(&[4, 3], 1015),
                weight.clone(),
                indices.clone(),
                i64s(&[7], &[0, 0, 2, 2, 2, 3, 3]),
            ],
            &[bag("sum"), ("padding_idx", i(1))],
        ),
        c(
            "index_put",
            vec![
                f32s(&[4, 2], 1006),
                i64s(&[3], &[-1, 0, 2]),
                f32s(&[3, 2], 1007),
            ],
            &[],
        ),
        c(
            "index_put",
            vec![
                f32s(&[4, 2], 1008),
                i64s(&[4], &[3, 0, -1, 3]),
                f32s(&[4, 2], 1009),
            ],
            &[("accumulate", b(true))],
        ),
        c(
            "index_put",
            vec![
                f32s(&[4, 2], 1010),
                h(Bool, &[4], &[1., 0., 0., 1.]),
                f32s(&[2], 1011),
            ],
            &[],
        ),
        c(
            "index_put",
            vec![f32s(&[4, 2], 1012), i64s(&[0], &[]), f32s(&[], 1013)],
            &[],
        ),
    ]
}

fn optim_cases() -> Vec<Case> {
    use DType::*;
    let p = f32s(&[3, 4], 1100);
    let g = f32s(&[3, 4], 1101);
    let buf = f32s(&[3, 4], 1102);
    let m = f32s(&[3, 4], 1103);
    let v = range(F32, &[3, 4], 1104, 0.0, 0.5);
    let vmax = range(F32, &[3, 4], 1105, 0.5, 1.0);
    let adam = [
        ("lr", f(1e-2)),
        ("beta1", f(0.9)),
        ("beta2", f(0.99)),
        ("eps", f(1e-8)),
        ("weight_decay", f(0.1)),
        ("step", i(3)),
    ];
    vec![
        c("sgd_step", vec![p.clone(), g.clone()], &[("lr", f(0.1))]),
        c(
            "sgd_step",
            vec![p.clone(), g.clone(), buf.clone()],
            &[
                ("lr", f(0.1)),
                ("momentum", f(0.9)),
                ("dampening", f(0.1)),
                ("weight_decay", f(0.01)),
            ],
        ),
        c(
            "sgd_step",
            vec![p.clone(), g.clone(), buf.clone(), scalar(F32, 0.05)],
            &[
                ("momentum", f(0.9)),
                ("nesterov", b(true)),
                ("maximize", b(true)),
            ],
        ),
        c(
            "sgd_step",
            vec![p.clone(), g.clone()],
            &[
                ("lr", f(0.1)),
                ("momentum", f(0.5)),
                ("first_step", b(true)),
            ],
        ),
        c(
            "adamw_step",
            vec![p.clone(), g.clone(), m.clone(), v.clone()],
            &adam,
        ),
        c(
            "adamw_step",
            vec![
                f32s(&[4, 0], 1108),
                f32s(&[4, 0], 1109),
                f32s(&[4, 0], 1110),
                f32s(&[4, 0], 1111),
            ],
            &adam,
        ),
        c(
            "adamw_step",
            vec![p.clone(), g.clone(), m.clone(), v.clone(), vmax.clone()],
            &[
                adam[0].clone(),
                adam[4].clone(),
                adam[5].clone(),
                ("amsgrad", b(true)),
                ("maximize", b(true)),
            ],
        ),
        c(
            "adamw_step",
            vec![
                p.clone(),
                g.clone(),
                m.clone(),
                v.clone(),
                scalar(F32, 4.0),
                scalar(F32, 0.01),
            ],
            &[],
        ),
        c(
            "adamw_step",
            vec![
                rnd(BF16, &[3, 4], 1106),
                rnd(BF16, &[3, 4], 1107),
                m.clone(),
                v.clone(),
            ],
            &adam,
        ),
    ]
}

/// Zero-size tensors with the zero in a dimension other than the last:
/// the loop engine's iteration space has no rows (an in-progress version
/// of the threaded loop engine panicked on these, dividing by the zero).
fn zero_rows_cases() -> Vec<Case> {
    use DType::*;
    vec![
        c("exp", vec![f32s(&[0, 3], 1300)], &[]),
        c("neg", vec![f32s(&[2, 0, 3], 1301)], &[]),
        c("sigmoid", vec![f32s(&[0, 3], 1302)], &[]),
        c("gelu", vec![f32s(&[0, 3], 1303)], &[]),
        c("isnan", vec![f32s(&[0, 3], 1304)], &[]),
        c("logical_not", vec![f32s(&[0, 3], 1305)], &[]),
        c("add", vec![f32s(&[0, 4], 1306), f32s(&[4], 1307)], &[]),
        c(
            "where",
            vec![bools(&[0, 3], 1308), f32s(&[0, 3], 1309), f32s(&[3], 1310)],
            &[],
        ),
        c("clamp", vec![f32s(&[0, 3], 1311)], &[("min", f(0.0))]),
        c(
            "sum",
            vec![f32s(&[0, 4], 1312)],
            &[("dim", is(&[1])), ("keepdim", b(true))],
        ),
        c("amax", vec![f32s(&[0, 4], 1313)], &[("dim", is(&[1]))]),
        c(
            "linear",
            vec![f32s(&[0, 7], 1314), f32s(&[4, 7], 1315), f32s(&[4], 1316)],
            &[],
        ),
        c("softmax", vec![f32s(&[0, 5], 1317)], &[("dim", i(1))]),
        c(
            "layer_norm",
            vec![f32s(&[0, 8], 1318)],
            &[("normalized_shape", is(&[8]))],
        ),
        c(
            "rms_norm",
            vec![f32s(&[0, 8], 1319)],
            &[("normalized_shape", is(&[8]))],
        ),
        c(
            "fused_rms_norm",
            vec![f32s(&[0, 8], 1320)],
            &[("normalized_shape", is(&[8]))],
        ),
        c(
            "dropout",
            vec![f32s(&[0, 4], 1320)],
            &[("p", f(0.5)), ("seed", i(1))],
        ),
        c(
            "cross_entropy",
            vec![f32s(&[0, 3], 1321), i64s(&[0], &[])],
            &[("reduction", s("none"))],
        ),
        c(
            "mse_loss",
            vec![f32s(&[0, 4], 1322), f32s(&[0, 4], 1323)],
            &[("reduction", s("sum"))],
        ),
        c(
            "scaled_dot_product_attention",
            vec![
                f32s(&[1, 0, 2], 1324),
                f32s(&[1, 3, 2], 1325),
                f32s(&[1, 3, 2], 1326),
            ],
            &[],
        ),
        c(
            "tanh_backward",
            vec![f32s(&[0, 6], 1327), f32s(&[0, 6], 1328)],
            &[],
        ),
        c(
            "embedding_bag",
            vec![f32s(&[5, 3], 1329), i64s(&[0], &[]), i64s(&[2], &[0, 0])],
            &[("mode", s("max"))],
        ),
        c(
            "embedding_bag_backward",
            vec![
                f32s(&[0, 3], 1340),
                i64s(&[0], &[]),
                i64s(&[0], &[]),
                i64s(&[0], &[]),
                i64s(&[0], &[]),
            ],
            &[("mode", s("sum")), ("num_weights", i(5))],
        ),
        c(
            "embedding_bag_per_sample_weights_backward",
            vec![
                f32s(&[0, 3], 1341),
                f32s(&[5, 3], 1342),
                i64s(&[0], &[]),
                i64s(&[0], &[]),
            ],
            &[("mode", s("sum"))],
        ),
        c(
            "adamw_step",
            vec![
                f32s(&[0, 4], 1330),
                f32s(&[0, 4], 1331),
                f32s(&[0, 4], 1332),
                f32s(&[0, 4], 1333),
            ],
            &[("lr", f(1e-2)), ("step", i(3))],
        ),
        c("cast", vec![h(F32, &[0, 2], &[])], &[("dtype", dt(BF16))]),
    ]
}

/// A zero-size case for each op the other groups cover only with data
/// (reductions reduce a non-empty dimension of an empty tensor).
fn zero_size_cases() -> Vec<Case> {
    use DType::*;
    let z = f32s(&[0, 3], 1500);
    let zl = f32s(&[3, 0], 1501);
    let z4 = f32s(&[0, 4], 1502);
    let row = f32s(&[3], 1503);
    let mut cases = Vec::new();
    for (k, op) in [
        "abs",
        "ceil",
        "cos",
        "erf",
        "expm1",
        "floor",
        "isfinite",
        "log",
        "log1p",
        "reciprocal",
        "relu",
        "round",
        "rsqrt",
        "sign",
        "silu",
        "sin",
        "sqrt",
        "square",
        "tanh",
        "trunc",
    ]
    .into_iter()
    .enumerate()
    {
        let x = if k % 2 == 0 { z.clone() } else { zl.clone() };
        cases.push(c(op, vec![x], &[]));
    }
    for op in [
        "atan2",
        "div",
        "eq",
        "fmod",
        "ge",
        "gt",
        "le",
        "lt",
        "maximum",
        "minimum",
        "mul",
        "ne",
        "pow",
        "remainder",
        "sub",
    ] {
        cases.push(c(op, vec![z.clone(), row.clone()], &[]));
    }
    let zb = h(Bool, &[0, 3], &[]);
    let zi = h(I64, &[0, 3], &[]);
    for op in ["logical_and", "logical_or", "logical_xor"] {
        cases.push(c(op, vec![zb.clone(), zb.clone()], &[]));
    }
    for op in ["bitwise_and", "bitwise_or", "bitwise_xor"] {
        cases.push(c(op, vec![zi.clone(), idx(I64, &[3], &[1, 2, 3])], &[]));
    }
    let d1 = || ("dim", is(&[1]));
    cases.extend([
        c("bitwise_not", vec![h(I64, &[2, 0], &[])], &[]),
        c("addcdiv", vec![z.clone(), z.clone(), row.clone()], &[]),
        c("addcmul", vec![z.clone(), row.clone(), z.clone()], &[]),
        c("lerp", vec![z.clone(), z.clone(), row.clone()], &[]),
        c("copy", vec![z.clone()], &[("dtype", dt(F64))]),
        c(
            "masked_fill",
            vec![z.clone(), bools(&[3], 1504)],
            &[("value", f(2.0))],
        ),
        c("amin", vec![z4.clone()], &[d1()]),
        c("any", vec![h(Bool, &[0, 4], &[])], &[d1()]),
        c("argmax", vec![z4.clone()], &[("dim", i(1))]),
        c(
            "argmin",
            vec![z4.clone()],
            &[("dim", i(1)), ("keepdim", b(true))],
        ),
        c("max_dim", vec![z4.clone()], &[("dim", i(1))]),
        c("min_dim", vec![z4.clone()], &[("dim", i(-1))]),
        c("mean", vec![z4.clone()], &[d1()]),
        c("var", vec![z4.clone()], &[d1()]),
        c("std", vec![z4.clone()], &[d1(), ("keepdim", b(true))]),
        c("logsumexp", vec![z4.clone()], &[d1()]),
        c("norm", vec![z4.clone()], &[d1()]),
        c("prod", vec![z4.clone()], &[d1()]),
        c("cumprod", vec![z4.clone()], &[("dim", i(1))]),
        c("cummax", vec![z4.clone()], &[("dim", i(1))]),
        c("cummin", vec![z.clone()], &[("dim", i(0))]),
        c("logcumsumexp", vec![z4.clone()], &[("dim", i(1))]),
        c("kthvalue", vec![z.clone()], &[("k", i(1))]),
        c("median", vec![z.clone()], &[("dim", i(1))]),
        c("searchsorted", vec![h(F32, &[0], &[]), row.clone()], &[]),
        c(
            "masked_scatter",
            vec![z.clone(), bools(&[3], 1505), row.clone()],
            &[],
        ),
        c(
            "masked_scatter_backward",
            vec![z.clone(), bools(&[3], 1506)],
            &[("sizes", is(&[2, 0]))],
        ),
        c("trace", vec![f32s(&[0, 3], 1507)], &[]),
        c("cholesky", vec![f32s(&[0, 3, 3], 1552)], &[]),
        c(
            "cholesky_solve",
            vec![f32s(&[2, 0], 1553), f32s(&[2, 2], 1554)],
            &[],
        ),
        c("cholesky_inverse", vec![f32s(&[2, 0, 0], 1555)], &[]),
        c("linalg_eigh", vec![f32s(&[0, 3, 3], 3420)], &[]),
        c(
            "linalg_svd",
            vec![f32s(&[2, 0, 3], 3421)],
            &[("full_matrices", b(true))],
        ),
        c("geqrf", vec![f32s(&[2, 0, 3], 3320)], &[]),
        c(
            "householder_product",
            vec![f32s(&[3, 0], 3321), h(F32, &[0], &[])],
            &[],
        ),
        c(
            "ormqr",
            vec![
                f32s(&[0, 3, 2], 3322),
                f32s(&[0, 2], 3323),
                f32s(&[0, 3, 4], 3324),
            ],
            &[],
        ),
        c(
            "linalg_qr",
            vec![f32s(&[0, 4, 2], 3325)],
            &[("mode", s("complete"))],
        ),
        c("linalg_qr", vec![f32s(&[3, 0], 3326)], &[]),
        c(
            "linalg_lstsq",
            vec![f32s(&[4, 2], 3327), f32s(&[4, 0], 3328)],
            &[],
        ),
        c(
            "linalg_lstsq",
            vec![f32s(&[0, 4, 2], 3329), f32s(&[1, 4, 1], 3330)],
            &[("driver", s("gelss"))],
        ),
        c(
            "linalg_lstsq",
            vec![f32s(&[3, 0], 3331), f32s(&[3, 2], 3332)],
            &[("driver", s("gelsd"))],
        ),
        c(
            "scatter_reduce",
            vec![f32s(&[0, 3], 3333), i64s(&[0, 3], &[]), f32s(&[0, 3], 3334)],
            &[("reduce", s("mean")), ("include_self", b(false))],
        ),
        c("lu_factor", vec![f32s(&[0, 3, 3], 1540)], &[]),
        c("lu_factor", vec![f32s(&[2, 0, 3], 1541)], &[]),
        c(
            "lu_solve",
            vec![
                f32s(&[3, 3], 1542),
                i64s(&[3], &[1, 2, 3]),
                f32s(&[3, 0], 1543),
            ],
            &[],
        ),
        c(
            "lu_unpack",
            vec![f32s(&[0, 3, 2], 1544), h(I32, &[0, 2], &[])],
            &[],
        ),
        c(
            "linalg_solve",
            vec![f32s(&[0, 0], 1545), f32s(&[0, 2], 1546)],
            &[],
        ),
        c("linalg_inv", vec![f32s(&[2, 0, 0], 1547)], &[]),
        c("pdist", vec![f32s(&[0, 3], 1966)], &[]),
        c("pdist", vec![f32s(&[3, 0], 1967)], &[]),
        c(
            "pdist_backward",
            vec![f32s(&[0], 1968), f32s(&[1, 3], 1969), f32s(&[0], 1970)],
            &[],
        ),
        c(
            "max_unpool",
            vec![f32s(&[0, 2, 2, 2], 1971), i64s(&[0, 2, 2, 2], &[])],
            &[("output_size", is(&[3, 3]))],
        ),
        c(
            "nonzero_static",
            vec![f32s(&[0, 3], 1972)],
            &[("size", i(2))],
        ),
        c(
            "rrelu_with_noise",
            vec![f32s(&[0, 3], 1973)],
            &[("seed", i(3))],
        ),
        c(
            "embedding_renorm",
            vec![f32s(&[4, 0], 1978), i64s(&[2], &[1, 3])],
            &[("max_norm", f(1.0))],
        ),
        c(
            "multi_margin_loss",
            vec![f32s(&[0, 3], 1940), i64s(&[0], &[])],
            &[("reduction", s("sum"))],
        ),
        c(
            "multilabel_margin_loss",
            vec![f32s(&[0, 3], 1941), i64s(&[0, 3], &[])],
            &[("reduction", s("none"))],
        ),
        c(
            "multi_margin_loss_backward",
            vec![f32s(&[0], 1942), f32s(&[0, 3], 1943), i64s(&[0], &[])],
            &[("reduction", s("none"))],
        ),
        c(
            "renorm",
            vec![f32s(&[0, 3], 1944)],
            &[("p", f(2.0)), ("dim", i(1)), ("maxnorm", f(1.0))],
        ),
        c(
            "weight_norm",
            vec![f32s(&[0, 3], 1945), f32s(&[1, 3], 1946)],
            &[("dim", i(1))],
        ),
        c(
            "weight_norm_backward",
            vec![
                f32s(&[0, 3], 1947),
                f32s(&[0, 3], 1948),
                f32s(&[1, 3], 1949),
                f32s(&[1, 3], 1950),
            ],
            &[("dim", i(1))],
        ),
        c(
            "multilabel_margin_loss_backward",
            vec![
                f32s(&[0], 1951),
                f32s(&[0, 3], 1952),
                i64s(&[0, 3], &[]),
                f32s(&[0, 3], 1953),
            ],
            &[("reduction", s("none"))],
        ),
        c("matrix_exp_squarings", vec![f32s(&[0, 2, 2], 1915)], &[]),
        c(
            "matrix_exp",
            vec![f32s(&[2, 0, 0], 1916)],
            &[("squarings", i(0))],
        ),
        c(
            "matrix_exp",
            vec![f32s(&[0, 3, 3], 1917)],
            &[("squarings", i(1))],
        ),
        c("linalg_det", vec![f32s(&[2, 0, 0], 1548)], &[]),
        c("linalg_slogdet", vec![f32s(&[0, 2, 2], 1549)], &[]),
        c(
            "solve_triangular",
            vec![f32s(&[0, 3, 3], 1550), f32s(&[3, 2], 1551)],
            &[("upper", b(true))],
        ),
        c(
            "linalg_cross",
            vec![h(F32, &[0, 3], &[]), f32s(&[1, 3], 1508)],
            &[],
        ),
        c("cdist", vec![f32s(&[0, 3], 1509), f32s(&[4, 3], 1510)], &[]),
        c(
            "cdist_backward",
            vec![
                f32s(&[0, 4], 1511),
                f32s(&[0, 3], 1512),
                f32s(&[4, 3], 1513),
                f32s(&[0, 4], 1514),
            ],
            &[],
        ),
        c("flatten", vec![z.clone()], &[]),
        c("flip", vec![z.clone()], &[("dims", is(&[1]))]),
        c(
            "gather",
            vec![z.clone(), h(I64, &[0, 2], &[])],
            &[("dim", i(1))],
        ),
        c(
            "narrow",
            vec![z4.clone()],
            &[("dim", i(1)), ("start", i(1)), ("length", i(2))],
        ),
        c(
            "permute",
            vec![f32s(&[2, 0, 3], 1505)],
            &[("dims", is(&[2, 0, 1]))],
        ),
        c("repeat", vec![z.clone()], &[("repeats", is(&[2, 2]))]),
        c(
            "split",
            vec![z4.clone()],
            &[("split_size", i(2)), ("dim", i(1))],
        ),
        c("squeeze", vec![f32s(&[0, 1], 1506)], &[]),
        c("unsqueeze", vec![z.clone()], &[("dim", i(-1))]),
        c("tril", vec![z.clone()], &[]),
        c("triu", vec![zl.clone()], &[]),
        c(
            "scatter",
            vec![z.clone(), h(I64, &[0, 3], &[]), z.clone()],
            &[("dim", i(1))],
        ),
        c("full", vec![], &[("size", is(&[0, 3])), ("value", f(1.0))]),
        c("normal", vec![], &[("size", is(&[0])), ("seed", i(4))]),
        c("bernoulli", vec![z.clone()], &[("seed", i(4))]),
        c("standard_gamma", vec![z.clone()], &[("seed", i(4))]),
        c("poisson", vec![z.clone()], &[("seed", i(4))]),
        c("binomial", vec![z.clone(), z.clone()], &[("seed", i(4))]),
        c(
            "addmm",
            vec![f32s(&[4], 1507), f32s(&[0, 5], 1508), f32s(&[5, 4], 1509)],
            &[],
        ),
        c(
            "baddbmm",
            vec![
                f32s(&[0, 2, 3], 1510),
                f32s(&[0, 2, 5], 1511),
                f32s(&[0, 5, 3], 1512),
            ],
            &[],
        ),
        c(
            "bmm",
            vec![f32s(&[0, 2, 5], 1513), f32s(&[0, 5, 3], 1514)],
            &[],
        ),
        c("outer", vec![f32s(&[0], 1515), f32s(&[4], 1516)], &[]),
        c(
            "ragged_dot",
            vec![
                f32s(&[0, 5], 1530),
                f32s(&[2, 5, 3], 1531),
                i64s(&[2], &[0, 0]),
            ],
            &[],
        ),
        c(
            "ragged_dot_rhs_grad",
            vec![
                f32s(&[0, 5], 1532),
                f32s(&[0, 3], 1533),
                i64s(&[2], &[0, 0]),
            ],
            &[],
        ),
        c(
            "max_pool",
            vec![f32s(&[0, 3, 4, 4], 1534)],
            &[("kernel_size", is(&[2, 2]))],
        ),
        c(
            "max_pool_backward",
            vec![
                f32s(&[0, 3, 2, 2], 1535),
                f32s(&[0, 3, 4, 4], 1536),
                i64s(&[0, 3, 2, 2], &[]),
            ],
            &[("kernel_size", is(&[2, 2]))],
        ),
        c(
            "avg_pool",
            vec![f32s(&[0, 3, 4, 4], 1537)],
            &[("kernel_size", is(&[2, 2]))],
        ),
        c(
            "avg_pool_backward",
            vec![f32s(&[0, 3, 2, 2], 1538), f32s(&[0, 3, 4, 4], 1539)],
            &[("kernel_size", is(&[2, 2]))],
        ),
        c(
            "adaptive_avg_pool",
            vec![f32s(&[0, 3, 5, 4], 1540)],
            &[("output_size", is(&[2, 3]))],
        ),
        c(
            "adaptive_avg_pool_backward",
            vec![f32s(&[3, 0, 3], 1541), f32s(&[3, 5, 4], 1542)],
            &[("spatial_dims", i(2))],
        ),
        c(
            "adaptive_max_pool",
            vec![f32s(&[0, 3, 5, 4], 1544)],
            &[("output_size", is(&[2, 3]))],
        ),
        c(
            "adaptive_max_pool_backward",
            vec![
                f32s(&[0, 3, 2, 3], 1545),
                f32s(&[0, 3, 5, 4], 1546),
                h(DType::I64, &[0, 3, 2, 3], &[]),
            ],
            &[("spatial_dims", i(2))],
        ),
        c(
            "im2col",
            vec![f32s(&[0, 3, 4, 4], 1547)],
            &[("kernel_size", is(&[2, 2]))],
        ),
        c(
            "col2im",
            vec![f32s(&[0, 12, 9], 1548)],
            &[("output_size", is(&[4, 4])), ("kernel_size", is(&[2, 2]))],
        ),
        c(
            "grid_sampler_2d",
            vec![f32s(&[0, 3, 4, 4], 1549), f32s(&[0, 2, 2, 2], 1550)],
            &[],
        ),
        c(
            "grid_sampler_2d_backward",
            vec![
                f32s(&[1, 2, 0, 3], 1551),
                f32s(&[1, 2, 4, 4], 1552),
                f32s(&[1, 0, 3, 2], 1553),
            ],
            &[],
        ),
        c(
            "upsample_nearest",
            vec![f32s(&[0, 3, 4, 4], 1543)],
            &[("output_size", is(&[8, 5]))],
        ),
        c(
            "upsample_nearest_backward",
            vec![f32s(&[0, 3, 8, 5], 1544)],
            &[
                ("output_size", is(&[8, 5])),
                ("input_size", is(&[0, 3, 4, 4])),
            ],
        ),
        c(
            "upsample_linear",
            vec![f32s(&[3, 0, 4], 1545)],
            &[("output_size", is(&[7]))],
        ),
        c(
            "upsample_linear_backward",
            vec![f32s(&[3, 0, 7], 1546)],
            &[("output_size", is(&[7])), ("input_size", is(&[3, 0, 4]))],
        ),
        c(
            "upsample_cubic",
            vec![f32s(&[0, 2, 3, 4], 2417)],
            &[("output_size", is(&[5, 6]))],
        ),
        c(
            "upsample_cubic_backward",
            vec![f32s(&[0, 2, 5, 6], 2418)],
            &[
                ("output_size", is(&[5, 6])),
                ("input_size", is(&[0, 2, 3, 4])),
            ],
        ),
        c(
            "upsample_antialias",
            vec![f32s(&[3, 0, 8], 2419)],
            &[("output_size", is(&[3]))],
        ),
        c(
            "upsample_antialias_backward",
            vec![f32s(&[3, 0, 3], 2420)],
            &[("output_size", is(&[3])), ("input_size", is(&[3, 0, 8]))],
        ),
        c(
            "batch_norm",
            vec![
                f32s(&[0, 3, 4], 1547),
                f32s(&[3], 1548),
                f32s(&[3], 1549),
                f32s(&[3], 1555),
                range(DType::F32, &[3], 1556, 0.5, 2.0),
            ],
            &[("training", b(false))],
        ),
        c(
            "batch_norm_backward",
            vec![
                f32s(&[2, 0, 4], 1550),
                f32s(&[2, 0, 4], 1551),
                f32s(&[0], 1552),
                f32s(&[0], 1553),
                f32s(&[0], 1554),
            ],
            &[],
        ),
        c(
            "group_norm_backward",
            vec![
                f32s(&[0, 4, 3], 1557),
                f32s(&[0, 4, 3], 1558),
                f32s(&[0, 2], 1559),
                f32s(&[0, 2], 1560),
                f32s(&[4], 1561),
            ],
            &[("groups", i(2))],
        ),
        c("log_softmax", vec![f32s(&[0, 5], 1517)], &[("dim", i(1))]),
        c(
            "conv2d",
            vec![f32s(&[0, 2, 4, 4], 1518), f32s(&[3, 2, 2, 2], 1519)],
            &[],
        ),
        c(
            "conv3d",
            vec![f32s(&[0, 1, 3, 3, 3], 1520), f32s(&[2, 1, 2, 2, 2], 1521)],
            &[],
        ),
        c(
            "convolution",
            vec![
                f32s(&[0, 2, 5], 1522),
                f32s(&[3, 2, 2], 1523),
                f32s(&[3], 1524),
            ],
            &[],
        ),
        c(
            "softmax_backward",
            vec![z.clone(), z.clone()],
            &[("dim", i(1))],
        ),
        c(
            "log_softmax_backward",
            vec![z.clone(), z.clone()],
            &[("dim", i(1))],
        ),
        c("gelu_backward", vec![z.clone(), z.clone()], &[]),
        c("silu_backward", vec![zl.clone(), zl.clone()], &[]),
        c("sigmoid_backward", vec![z.clone(), z.clone()], &[]),
        c("threshold_backward", vec![z.clone(), z.clone()], &[]),
        c(
            "rms_norm_backward",
            vec![z4.clone(), z4.clone()],
            &[("normalized_shape", is(&[4]))],
        ),
        c(
            "fused_rms_norm_backward",
            vec![z4.clone(), z4.clone(), f32s(&[0, 1], 1503)],
            &[("normalized_shape", is(&[4]))],
        ),
        c(
            "mse_loss_backward",
            vec![z4.clone(), z4.clone(), z4.clone()],
            &[("reduction", s("none"))],
        ),
        c(
            "index_select_backward",
            vec![z.clone(), h(I64, &[0], &[])],
            &[("dim", i(0)), ("self_sizes", is(&[4, 3]))],
        ),
        c(
            "gather_backward",
            vec![h(F32, &[0, 2], &[]), h(I64, &[0, 2], &[])],
            &[("dim", i(1)), ("self_sizes", is(&[0, 3]))],
        ),
    ]);
    let sum = [("reduction", s("sum"))];
    let target = h(I64, &[0], &[]);
    let nll = fwd("nll_loss", &[z.clone(), target.clone()], &sum);
    cases.push(c(
        "nll_loss_backward",
        vec![scalar(F32, 1.0), z.clone(), target, nll[1].clone()],
        &sum,
    ));
    let qkv = vec![
        f32s(&[1, 0, 2], 1525),
        f32s(&[1, 3, 2], 1526),
        f32s(&[1, 3, 2], 1527),
    ];
    let out = fwd("scaled_dot_product_attention", &qkv, &[]);
    let mut ins = vec![f32s(&[1, 0, 2], 1528)];
    ins.extend(qkv);
    ins.extend(out);
    cases.push(c("scaled_dot_product_attention_backward", ins, &[]));
    cases
}

/// Loop passes of 2^18 elements or more split their rows across threads
/// (at reduction boundaries): a broadcast add, a row-wise softmax (many
/// reductions) and a column sum (one reduction) over 514 x 512 elements.
fn large_cases() -> Vec<Case> {
    let x = f32s(&[514, 512], 1400);
    vec![
        c(
            "add",
            vec![x.clone(), f32s(&[512], 1401)],
            &[("alpha", f(0.5))],
        ),
        c("softmax", vec![x.clone()], &[("dim", i(-1))]),
        c("sum", vec![x], &[("dim", is(&[0]))]),
    ]
}

// ---------------------------------------------------------------- tests

/// Half-precision addmm, baddbmm and linear with a bias round once after
/// the bias (`ops::tests::half_products_cases`) in every mode on the host
/// platform, contiguous and strided, through the fused planner as well as
/// op by op: bit for bit.
#[test]
fn half_products_round_once_in_every_mode() {
    let r = runtime();
    let st = r.default_stream(0).unwrap();
    for (name, inputs, attrs, want) in super::tests::half_products_cases() {
        for strided in [false, true] {
            let dev: Vec<DeviceTensor> = inputs
                .iter()
                .map(|t| upload(&r, &st, t, strided).unwrap())
                .collect();
            for mode in MODES {
                let got = run_in_mode(&r, &st, mode, lookup(name).unwrap(), &dev, &attrs)
                    .unwrap_or_else(|e| panic!("{name} {mode:?}: {e}"));
                assert_eq!(
                    got[0].to_f64_vec(),
                    want,
                    "{name} {} {mode:?} strided {strided}",
                    inputs[0].ty
                );
            }
        }
    }
}

#[test]
fn pointwise_ops_agree_in_all_modes() {
    check_all(pointwise_cases());
}

#[test]
fn reduction_ops_agree_in_all_modes() {
    check_all(reduction_cases());
}

#[test]
fn shape_ops_agree_in_all_modes() {
    check_all(shape_cases());
}

#[test]
fn linalg_and_nn_ops_agree_in_all_modes() {
    let mut cases = linalg_cases();
    cases.extend(nn_cases());
    check_all(cases);
}

#[test]
fn solve_ops_agree_in_all_modes() {
    check_all(solve_cases());
}

#[test]
fn qr_ops_agree_in_all_modes() {
    check_all(qr_cases());
}

#[test]
fn spectral_ops_agree_in_all_modes() {
    check_all(spectral_cases());
}

#[test]
fn random_ops_agree_in_all_modes() {
    check_all(random_cases());
}

#[test]
fn loss_and_attention_ops_agree_in_all_modes() {
    let mut cases = loss_cases();
    cases.extend(attention_cases());
    check_all(cases);
}

#[test]
fn backward_and_conv_ops_agree_in_all_modes() {
    let mut cases = backward_cases();
    cases.extend(conv_cases());
    check_all(cases);
}

#[test]
fn index_and_optimizer_ops_agree_in_all_modes() {
    let mut cases = index_cases();
    cases.extend(optim_cases());
    check_all(cases);
}

#[test]
fn zero_size_tensors_agree_in_all_modes() {
    let mut cases = zero_rows_cases();
    cases.extend(zero_size_cases());
    check_all(cases);
}

#[test]
fn passes_split_across_threads_agree_in_all_modes() {
    check_all(large_cases());
}

/// One device tensor passed as two inputs: the deferred graph has one
/// parameter for both.
#[test]
fn one_tensor_as_two_inputs_agrees_in_all_modes() {
    let r = runtime();
    let st = r.default_stream(0).unwrap();
    for strided in [false, true] {
        let x = f32s(&[5, 7], 1200);
        let dev = upload(&r, &st, &x, strided).unwrap();
        for (op, attrs) in [
            ("mul", Attrs::new()),
            ("sub", Attrs::new().with("alpha", f(0.5))),
            ("atan2", Attrs::new()),
        ] {
            let want = reference(op, &[x.clone(), x.clone()], &attrs).unwrap();
            for mode in MODES {
                let got = run_in_mode(
                    &r,
                    &st,
                    mode,
                    lookup(op).unwrap(),
                    &[dev.clone(), dev.clone()],
                    &attrs,
                )
                .unwrap_or_else(|e| panic!("{op} in {}: {e}", mode.name()));
                if let Some(m) = mismatch(&got[0], &want[0]) {
                    panic!(
                        "{op}({x:?}, same) in {}, strided {strided}: {m}",
                        mode.name()
                    );
                }
            }
        }
    }
}

/// The SparseCore ops on a CSR of 9 entries (the last 2 padding, one
/// embedding id out of range, rows 1 and 4 repeated) over a [6, 3] table
/// and a batch of 4; and an empty CSR.
fn sparse_cases() -> Vec<Case> {
    use DType::*;
    let rp = idx(I32, &[2], &[4, 7]);
    let ids = idx(I32, &[9], &[4, 1, 0, 1, 4, 9, 4, 2, 3]);
    let samples = idx(I32, &[9], &[0, 0, 1, 2, 3, 3, 2, 1, 0]);
    let gains = f32s(&[9], 1900);
    let table = f32s(&[6, 3], 1901);
    let grad = f32s(&[4, 3], 1902);
    let acc = range(F32, &[6, 3], 1903, 0.0, 1.0);
    let row_acc = range(F32, &[6], 1904, 0.0, 1.0);
    let vel = range(F32, &[6, 3], 1905, 0.0, 0.5);
    let lr = scalar(F32, 0.05);
    let csr = vec![rp.clone(), ids.clone(), samples.clone(), gains.clone()];
    let with = |more: &[&HostTensor]| {
        let mut v = csr.clone();
        v.extend(more.iter().map(|t| (*t).clone()));
        v
    };
    let empty = vec![
        idx(I32, &[1], &[0]),
        idx(I32, &[0], &[]),
        idx(I32, &[0], &[]),
        h(F32, &[0], &[]),
    ];
    let empty_with = |more: &[HostTensor]| {
        let mut v = empty.clone();
        v.extend(more.iter().cloned());
        v
    };
    vec![
        c(
            "sparse_dense_matmul",
            with(&[&table]),
            &[("batch_size", i(4))],
        ),
        c(
            "sparse_dense_matmul",
            with(&[&rnd(BF16, &[6, 3], 1906)]),
            &[("batch_size", i(5))],
        ),
        c(
            "sparse_dense_matmul_grad",
            with(&[&grad]),
            &[("num_rows", i(6))],
        ),
        c(
            "sparse_dense_matmul_grad_with_sgd",
            with(&[&table, &grad, &lr]),
            &[],
        ),
        c(
            "sparse_dense_matmul_grad_with_adagrad",
            with(&[&table, &acc, &grad, &lr]),
            &[("eps", f(1e-8))],
        ),
        c(
            "sparse_dense_matmul_grad_with_rowwise_adagrad",
            with(&[&table, &row_acc, &grad, &lr]),
            &[],
        ),
        c(
            "sparse_dense_matmul_grad_with_adam",
            with(&[&table, &f32s(&[6, 3], 1907), &vel, &grad, &lr]),
            &[("beta1", f(0.8)), ("beta2", f(0.95)), ("eps", f(1e-6))],
        ),
        c(
            "sparse_csr_check",
            csr.clone(),
            &[("num_rows", i(6)), ("batch_size", i(4))],
        ),
        c(
            "sparse_dense_matmul",
            empty_with(std::slice::from_ref(&table)),
            &[("batch_size", i(2))],
        ),
        c(
            "sparse_dense_matmul_grad",
            empty_with(std::slice::from_ref(&grad)),
            &[("num_rows", i(6))],
        ),
        c(
            "sparse_dense_matmul_grad_with_sgd",
            empty_with(&[table.clone(), grad.clone(), lr.clone()]),
            &[],
        ),
        c(
            "sparse_dense_matmul_grad_with_adagrad",
            empty_with(&[table.clone(), acc.clone(), grad.clone(), lr.clone()]),
            &[],
        ),
        c(
            "sparse_dense_matmul_grad_with_rowwise_adagrad",
            empty_with(&[table.clone(), row_acc.clone(), grad.clone(), lr.clone()]),
            &[],
        ),
        c(
            "sparse_dense_matmul_grad_with_adam",
            empty_with(&[
                table.clone(),
                vel.clone(),
                vel.clone(),
                grad.clone(),
                lr.clone(),
            ]),
            &[],
        ),
        c(
            "sparse_csr_check",
            empty.clone(),
            &[("num_rows", i(6)), ("batch_size", i(4))],
        ),
    ]
}

/// math.rs and activation.rs: each op on values inside its domain (every
/// result finite, as debug mode checks), bf16 and broadcast operands, and
/// a zero-size case each.
fn math_and_activation_cases() -> Vec<Case> {
    use DType::*;
    let x = f32s(&[5, 7], 3001);
    let unit = range(F32, &[5, 7], 3002, -0.95, 0.95);
    let pos = range(F32, &[5, 7], 3003, 0.05, 8.0);
    let prob = range(F32, &[5, 7], 3004, 0.05, 0.95);
    let g = f32s(&[5, 7], 3005);
    let wide = range(F32, &[5, 7], 3006, -6.0, 6.0);
    let row = range(F32, &[7], 3007, 0.5, 3.0);
    let mut cases = vec![
        c("tan", vec![range(F32, &[5, 7], 3010, -1.4, 1.4)], &[]),
        c("asin", vec![unit.clone()], &[]),
        c("acos", vec![unit.clone()], &[]),
        c("atan", vec![wide.clone()], &[]),
        c("atan", vec![whole(I64, &[6], 3011, -5, 5)], &[]),
        c("sinh", vec![wide.clone()], &[]),
        c("cosh", vec![wide.clone()], &[]),
        c("cosh", vec![rnd(BF16, &[5, 7], 3012)], &[]),
        c("asinh", vec![wide.clone()], &[]),
        c("acosh", vec![range(F32, &[5, 7], 3013, 1.0, 40.0)], &[]),
        c("atanh", vec![unit.clone()], &[]),
        c("log2", vec![pos.clone()], &[]),
        c("log2", vec![h(F32, &[4], &[1.0, 8.0, 0.25, 1024.0])], &[]),
        c("log10", vec![pos.clone()], &[]),
        c("log10", vec![range(F16, &[5, 7], 3014, 0.1, 100.0)], &[]),
        c("exp2", vec![wide.clone()], &[]),
        c("frac", vec![wide.clone()], &[]),
        c("erfinv", vec![unit.clone()], &[]),
        c("erfinv", vec![range(BF16, &[5, 7], 3030, -0.99, 0.99)], &[]),
        c("logit", vec![prob.clone()], &[]),
        c("logit", vec![x.clone()], &[("eps", f(0.01))]),
        c("logit_backward", vec![g.clone(), prob.clone()], &[]),
        c(
            "logit_backward",
            vec![g.clone(), x.clone()],
            &[("eps", f(0.1))],
        ),
        c("sinc", vec![h(F32, &[4], &[0.0, 0.5, -1.25, 3.0])], &[]),
        c("sinc", vec![x.clone()], &[]),
        c("xlogy", vec![x.clone(), pos.clone()], &[]),
        c(
            "xlogy",
            vec![
                h(F32, &[3], &[0.0, 2.0, -1.0]),
                row.clone().reshaped(&[7, 1]),
            ],
            &[],
        ),
        c("logaddexp", vec![wide.clone(), x.clone()], &[]),
        c("logaddexp2", vec![wide.clone(), row.clone()], &[]),
        c("hypot", vec![x.clone(), wide.clone()], &[]),
        c(
            "heaviside",
            vec![h(F32, &[4], &[-1.0, 0.0, 2.0, 0.0]), scalar(F32, 0.5)],
            &[],
        ),
        c("fmax", vec![x.clone(), row.clone()], &[]),
        c("fmin", vec![x.clone(), whole(I32, &[7], 3015, -2, 3)], &[]),
        c("elu", vec![wide.clone()], &[]),
        c(
            "elu",
            vec![rnd(BF16, &[5, 7], 3016)],
            &[("alpha", f(1.67)), ("scale", f(1.05))],
        ),
        c(
            "elu_backward",
            vec![g.clone(), wide.clone()],
            &[("alpha", f(1.3)), ("input_scale", f(0.5))],
        ),
        c(
            "elu_backward",
            vec![g.clone(), range(F32, &[5, 7], 3017, -0.9, 3.0)],
            &[("is_result", b(true))],
        ),
        c(
            "leaky_relu",
            vec![wide.clone()],
            &[("negative_slope", f(0.2))],
        ),
        c("leaky_relu_backward", vec![g.clone(), wide.clone()], &[]),
        c(
            "hardtanh",
            vec![wide.clone()],
            &[("min_val", f(0.0)), ("max_val", f(6.0))],
        ),
        c("hardtanh_backward", vec![g.clone(), wide.clone()], &[]),
        c(
            "softplus",
            vec![range(F32, &[5, 7], 3018, -30.0, 30.0)],
            &[],
        ),
        c(
            "softplus",
            vec![wide.clone()],
            &[("beta", f(2.0)), ("threshold", f(4.0))],
        ),
        c("softplus_backward", vec![g.clone(), wide.clone()], &[]),
        c("hardswish", vec![wide.clone()], &[]),
        c("hardswish_backward", vec![g.clone(), wide.clone()], &[]),
        c("hardsigmoid", vec![rnd(F16, &[5, 7], 3019)], &[]),
        c("hardsigmoid_backward", vec![g.clone(), wide.clone()], &[]),
        c("mish", vec![wide.clone()], &[]),
        c(
            "threshold",
            vec![x.clone()],
            &[("threshold", f(0.1)), ("value", f(-3.0))],
        ),
        c(
            "threshold",
            vec![whole(I64, &[8], 3020, -4, 4)],
            &[("threshold", f(0.0)), ("value", f(7.0))],
        ),
        c("softshrink", vec![x.clone()], &[("lambd", f(0.3))]),
        c("softshrink_backward", vec![g.clone(), x.clone()], &[]),
        c("hardshrink", vec![x.clone()], &[]),
        c(
            "hardshrink_backward",
            vec![g.clone(), x.clone()],
            &[("lambd", f(1.0))],
        ),
        c("glu", vec![f32s(&[5, 8], 3021)], &[]),
        c("glu", vec![f32s(&[6, 3], 3022)], &[("dim", i(0))]),
        c(
            "glu_backward",
            vec![f32s(&[5, 4], 3023), f32s(&[5, 8], 3024)],
            &[],
        ),
        c(
            "prelu",
            vec![
                f32s(&[4, 3, 5], 3025),
                range(F32, &[1, 3, 1], 3026, 0.0, 0.5),
            ],
            &[],
        ),
        c(
            "prelu_backward",
            vec![
                f32s(&[4, 3, 5], 3027),
                f32s(&[4, 3, 5], 3028),
                range(F32, &[1, 3, 1], 3029, 0.0, 0.5),
            ],
            &[],
        ),
        c("erfc", vec![range(F32, &[5, 7], 3042, -4.0, 9.0)], &[]),
        c("erfc", vec![range(F64, &[5, 7], 3043, -3.0, 20.0)], &[]),
        c("erfc", vec![rnd(BF16, &[5, 7], 3044)], &[]),
        c("lgamma", vec![range(F32, &[5, 7], 3031, -4.7, 12.0)], &[]),
        c("lgamma", vec![range(BF16, &[5, 7], 3032, 0.2, 30.0)], &[]),
        c("lgamma", vec![whole(I64, &[6], 3033, 1, 9)], &[]),
        c("digamma", vec![range(F32, &[5, 7], 3034, 0.05, 20.0)], &[]),
        c("digamma", vec![h(F64, &[4], &[-2.5, -0.3, 1e-3, 1e5])], &[]),
        c("polygamma", vec![pos.clone()], &[("n", i(1))]),
        c("polygamma", vec![pos.clone()], &[("n", i(0))]),
        c(
            "polygamma",
            vec![h(F32, &[5], &[-3.6, -0.4, 0.2, 2.0, 50.0])],
            &[("n", i(3))],
        ),
        c(
            "signbit",
            vec![h(F32, &[6], &[-0.0, 0.0, -1.5, 2.0, -1e-30, 1e30])],
            &[],
        ),
        c("signbit", vec![whole(I64, &[6], 3035, -3, 3)], &[]),
        c(
            "nextafter",
            vec![
                h(
                    F32,
                    &[8],
                    &[0.0, -0.0, 1.0, 1e-40, -1.4e-45, 3.0e38, f64::INFINITY, -2.0],
                ),
                h(
                    F32,
                    &[8],
                    &[-1.0, 1.0, 0.0, 1.0, 1.0, f64::INFINITY, 0.0, -3.0],
                ),
            ],
            &[],
        ),
        c(
            "nextafter",
            vec![rnd(F64, &[3, 4], 3037), rnd(F64, &[4], 3038)],
            &[],
        ),
        c(
            "nextafter",
            vec![
                h(BF16, &[6], &[0.0, 1.0, -0.5, 3.0e38, 2.0, -1.0]),
                h(BF16, &[6], &[1.0, 0.0, -1.0, f64::INFINITY, 2.0, 5.0]),
            ],
            &[],
        ),
        c(
            "nextafter",
            vec![
                h(
                    F16,
                    &[7],
                    &[
                        0.0,
                        1.0,
                        -6e-8,
                        65504.0,
                        6.103515625e-5,
                        f64::NEG_INFINITY,
                        0.25,
                    ],
                ),
                h(F16, &[7], &[-1.0, 0.0, 1.0, f64::INFINITY, 0.0, 0.0, -1.0]),
            ],
            &[],
        ),
        c(
            "frexp",
            vec![h(
                F32,
                &[8],
                &[1.0, -5.0, 0.0, -0.0, 1e-40, -3e-42, f64::INFINITY, 0.1],
            )],
            &[],
        ),
        c("frexp", vec![rnd(F64, &[3, 5], 3039)], &[]),
        c("frexp", vec![rnd(BF16, &[4, 4], 3040)], &[]),
        c(
            "frexp",
            vec![h(F16, &[5], &[6e-8, 1e-5, 65504.0, -3.0, f64::NAN])],
            &[],
        ),
        c("signbit", vec![rnd(F16, &[5, 7], 3036)], &[]),
        c(
            "copysign",
            vec![
                x.clone(),
                h(F32, &[7], &[-0.0, 0.0, -1.0, 1.0, -3.0, 2.0, 0.5]),
            ],
            &[],
        ),
        c(
            "copysign",
            vec![whole(I32, &[6], 3037, -4, 4), scalar(F32, -0.0)],
            &[],
        ),
        c("nan_to_num", vec![x.clone()], &[("nan", f(1.0))]),
        c("nan_to_num", vec![whole(I64, &[6], 3045, -3, 3)], &[]),
        // Both sides of the asymptotic switch (12 at f32, 20 at f64).
        c("i0", vec![range(F32, &[5, 7], 3046, -30.0, 30.0)], &[]),
        c("i0e", vec![range(F64, &[5, 7], 3047, -40.0, 40.0)], &[]),
        c("i1", vec![range(F64, &[5, 7], 3048, -40.0, 40.0)], &[]),
        c("i1e", vec![range(BF16, &[5, 7], 3049, -30.0, 30.0)], &[]),
        c("i1", vec![whole(I64, &[6], 3050, -20, 20)], &[]),
        // Every range of each (the switches at 2 and T = 9 at f32, 18 at
        // f64; at 1 for K); Y and K are NaN below 0, so positive there.
        c(
            "bessel_j0",
            vec![range(F32, &[5, 7], 3406, -30.0, 30.0)],
            &[],
        ),
        c(
            "bessel_j1",
            vec![range(F64, &[5, 7], 3407, -40.0, 40.0)],
            &[],
        ),
        c(
            "bessel_y0",
            vec![range(F64, &[5, 7], 3408, 0.01, 40.0)],
            &[],
        ),
        c(
            "bessel_y1",
            vec![range(F32, &[5, 7], 3409, 0.01, 30.0)],
            &[],
        ),
        c("bessel_j0", vec![whole(I64, &[6], 3410, -20, 20)], &[]),
        c(
            "modified_bessel_k0",
            vec![range(F32, &[5, 7], 3411, 0.01, 30.0)],
            &[],
        ),
        c(
            "modified_bessel_k1",
            vec![range(F64, &[5, 7], 3412, 0.01, 40.0)],
            &[],
        ),
        c(
            "scaled_modified_bessel_k0",
            vec![range(F64, &[5, 7], 3413, 0.01, 40.0)],
            &[],
        ),
        c(
            "scaled_modified_bessel_k1",
            vec![range(BF16, &[5, 7], 3414, 0.01, 30.0)],
            &[],
        ),
        c(
            "spherical_bessel_j0",
            vec![range(F32, &[5, 7], 3415, -20.0, 20.0)],
            &[],
        ),
        c("erfcx", vec![range(F32, &[5, 7], 3051, -6.0, 40.0)], &[]),
        c("erfcx", vec![range(F64, &[5, 7], 3052, -20.0, 60.0)], &[]),
        c("log_ndtr", vec![range(F32, &[5, 7], 3053, -30.0, 8.0)], &[]),
        c("log_ndtr", vec![range(F64, &[5, 7], 3054, -30.0, 8.0)], &[]),
        c("ndtri", vec![range(F32, &[5, 7], 3058, -0.1, 1.1)], &[]),
        c(
            "ndtri",
            vec![h(
                F64,
                &[8],
                &[0.0, 1e-300, 1e-20, 0.01, 0.3, 0.5, 0.5 + 1e-12, 1.0],
            )],
            &[],
        ),
        c(
            "zeta",
            vec![
                range(F64, &[5, 7], 3059, 0.5, 30.0),
                range(F64, &[5, 7], 3060, -3.0, 40.0),
            ],
            &[],
        ),
        c(
            "zeta",
            vec![range(F32, &[5, 7], 3061, 1.0, 12.0), scalar(F32, 2.5)],
            &[],
        ),
        // Every piece of the incomplete gamma functions: small x, the
        // series, the fraction and (a above 20) Temme's band.
        c(
            "igamma",
            vec![
                range(F64, &[5, 7], 3436, 0.01, 60.0),
                range(F64, &[5, 7], 3437, 0.0, 80.0),
            ],
            &[],
        ),
        c(
            "igammac",
            vec![
                range(F64, &[5, 7], 3438, 0.01, 60.0),
                range(F64, &[5, 7], 3439, 0.0, 80.0),
            ],
            &[],
        ),
        c(
            "igamma",
            vec![range(F32, &[5, 7], 3440, 0.0, 40.0), scalar(F32, 25.0)],
            &[],
        ),
        c(
            "igammac",
            vec![scalar(F32, 2.5), range(F32, &[5, 7], 3441, 0.0, 9.0)],
            &[],
        ),
        c(
            "standard_gamma_grad",
            vec![
                range(F64, &[5, 7], 3442, 0.05, 60.0),
                range(F64, &[5, 7], 3443, 0.01, 80.0),
            ],
            &[],
        ),
        c(
            "standard_gamma_grad",
            vec![
                range(F32, &[5, 7], 3444, 0.05, 60.0),
                range(F32, &[5, 7], 3445, 0.0, 80.0),
            ],
            &[],
        ),
        // Inside, on and outside [-1, 1] (the shifted ones [0, 1]), with
        // degrees to 12 and past them (NaN where the recurrence stops).
        c(
            "chebyshev_polynomial_t",
            vec![
                range(F32, &[5, 7], 3416, -1.5, 1.5),
                whole(I64, &[5, 7], 3417, -1, 12),
            ],
            &[],
        ),
        c(
            "chebyshev_polynomial_u",
            vec![
                range(F64, &[5, 7], 3418, -1.5, 1.5),
                whole(I64, &[1, 7], 3419, 0, 30),
            ],
            &[],
        ),
        c(
            "chebyshev_polynomial_v",
            vec![range(F64, &[5, 7], 3420, -1.5, 1.5), scalar(F64, 7.0)],
            &[],
        ),
        c(
            "chebyshev_polynomial_w",
            vec![
                range(F32, &[5, 7], 3421, -1.5, 1.5),
                whole(I64, &[5, 1], 3422, 0, 9),
            ],
            &[],
        ),
        c(
            "shifted_chebyshev_polynomial_t",
            vec![
                range(F64, &[5, 7], 3423, -0.2, 1.2),
                whole(I64, &[5, 7], 3424, 0, 12),
            ],
            &[],
        ),
        c(
            "shifted_chebyshev_polynomial_u",
            vec![range(F32, &[5, 7], 3425, -0.2, 1.2), scalar(F32, 5.0)],
            &[],
        ),
        c(
            "shifted_chebyshev_polynomial_v",
            vec![range(BF16, &[5, 7], 3426, 0.0, 1.0), scalar(BF16, 3.0)],
            &[],
        ),
        c(
            "shifted_chebyshev_polynomial_w",
            vec![
                range(F64, &[5, 7], 3427, -0.2, 1.2),
                whole(I64, &[5, 7], 3428, 0, 12),
            ],
            &[],
        ),
        c(
            "hermite_polynomial_h",
            vec![
                range(F64, &[5, 7], 3429, -3.0, 3.0),
                whole(I64, &[5, 7], 3430, -1, 9),
            ],
            &[("steps", i(8))],
        ),
        c(
            "hermite_polynomial_he",
            vec![
                range(F32, &[5, 7], 3431, -3.0, 3.0),
                whole(I64, &[5, 7], 3432, 0, 8),
            ],
            &[("steps", i(8))],
        ),
        c(
            "laguerre_polynomial_l",
            vec![range(F64, &[5, 7], 3433, -2.0, 8.0), scalar(F64, 6.0)],
            &[("steps", i(8))],
        ),
        c(
            "legendre_polynomial_p",
            vec![
                range(F32, &[5, 7], 3434, -1.2, 1.2),
                whole(I64, &[5, 7], 3435, 0, 16),
            ],
            &[("steps", i(16))],
        ),
        c(
            "gcd",
            vec![
                whole(I64, &[5, 7], 3062, -10_000, 10_000),
                whole(I64, &[5, 7], 3063, -500, 500),
            ],
            &[],
        ),
        c(
            "gcd",
            vec![
                idx(I64, &[4], &[7_540_113_804_746_346_429, 0, 0, -12]),
                idx(I64, &[4], &[4_660_046_610_375_530_309, 0, 9, 18]),
            ],
            &[],
        ),
        c(
            "gcd",
            vec![whole(U8, &[6], 3064, 0, 255), whole(U8, &[6], 3065, 0, 255)],
            &[],
        ),
        // StableHLO's abs and sign refuse unsigned integers.
        c("abs", vec![whole(U8, &[6], 3069, 0, 255)], &[]),
        c("sign", vec![whole(U8, &[6], 3070, 0, 3)], &[]),
        c(
            "lcm",
            vec![
                whole(I32, &[5, 7], 3066, -300, 300),
                whole(I32, &[7], 3067, -40, 40),
            ],
            &[],
        ),
        c("entr", vec![range(F32, &[5, 7], 3055, 0.0, 5.0)], &[]),
        c("entr", vec![whole(I64, &[6], 3056, 0, 9)], &[]),
        c(
            "xlog1py",
            vec![
                h(F32, &[6], &[0.0, 0.0, 1.5, -2.0, 3.0, 0.5]),
                h(F32, &[6], &[-1.0, 2.0, 0.25, 1e-8, 9.0, -0.5]),
            ],
            &[],
        ),
        c(
            "xlog1py",
            vec![range(F64, &[5, 7], 3057, -3.0, 3.0), scalar(F64, 0.5)],
            &[],
        ),
    ];
    let z = f32s(&[0, 3], 3040);
    cases.push(c("polygamma", vec![z.clone()], &[("n", i(2))]));
    let zi = whole(I64, &[0, 3], 3068, -9, 9);
    cases.push(c("gcd", vec![zi.clone(), zi.clone()], &[]));
    cases.push(c("lcm", vec![zi.clone(), zi], &[]));
    cases.push(c("signbit", vec![z.clone()], &[]));
    cases.push(c("frexp", vec![z.clone()], &[]));
    cases.push(c("nextafter", vec![z.clone(), z.clone()], &[]));
    for op in [
        "tan",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "asinh",
        "acosh",
        "atanh",
        "log2",
        "log10",
        "exp2",
        "frac",
        "erfinv",
        "logit",
        "sinc",
        "lgamma",
        "digamma",
        "erfc",
        "i0",
        "i0e",
        "i1",
        "i1e",
        "bessel_j0",
        "bessel_j1",
        "bessel_y0",
        "bessel_y1",
        "modified_bessel_k0",
        "modified_bessel_k1",
        "scaled_modified_bessel_k0",
        "scaled_modified_bessel_k1",
        "spherical_bessel_j0",
        "erfcx",
        "log_ndtr",
        "ndtri",
        "entr",
        "nan_to_num",
        "elu",
        "leaky_relu",
        "hardtanh",
        "softplus",
        "hardswish",
        "hardsigmoid",
        "mish",
        "softshrink",
        "hardshrink",
    ] {
        cases.push(c(op, vec![z.clone()], &[]));
    }
    cases.push(c(
        "threshold",
        vec![z.clone()],
        &[("threshold", f(0.0)), ("value", f(1.0))],
    ));
    for op in [
        "logit_backward",
        "xlogy",
        "xlog1py",
        "zeta",
        "igamma",
        "igammac",
        "standard_gamma_grad",
        "chebyshev_polynomial_t",
        "chebyshev_polynomial_u",
        "chebyshev_polynomial_v",
        "chebyshev_polynomial_w",
        "shifted_chebyshev_polynomial_t",
        "shifted_chebyshev_polynomial_u",
        "shifted_chebyshev_polynomial_v",
        "shifted_chebyshev_polynomial_w",
        "logaddexp",
        "logaddexp2",
        "hypot",
        "heaviside",
        "fmax",
        "fmin",
        "copysign",
        "elu_backward",
        "leaky_relu_backward",
        "hardtanh_backward",
        "softplus_backward",
        "hardswish_backward",
        "hardsigmoid_backward",
        "softshrink_backward",
        "hardshrink_backward",
    ] {
        cases.push(c(op, vec![z.clone(), z.clone()], &[]));
    }
    for op in [
        "hermite_polynomial_h",
        "hermite_polynomial_he",
        "laguerre_polynomial_l",
        "legendre_polynomial_p",
    ] {
        cases.push(c(op, vec![z.clone(), z.clone()], &[("steps", i(4))]));
    }
    cases.push(c("glu", vec![f32s(&[0, 4], 3041)], &[]));
    cases.push(c(
        "glu_backward",
        vec![f32s(&[0, 2], 3042), f32s(&[0, 4], 3043)],
        &[],
    ));
    cases.push(c(
        "prelu",
        vec![z.clone(), range(F32, &[1, 3], 3044, 0.0, 0.5)],
        &[],
    ));
    cases.push(c(
        "prelu_backward",
        vec![z.clone(), z.clone(), range(F32, &[1, 3], 3045, 0.0, 0.5)],
        &[],
    ));
    cases
}

/// The losses of loss.rs beyond cross entropy and MSE.
fn more_loss_cases() -> Vec<Case> {
    use DType::*;
    let p = range(F32, &[4, 5], 3101, 0.02, 0.98);
    let t = range(F32, &[4, 5], 3102, 0.0, 1.0);
    let w = range(F32, &[4, 5], 3103, 0.5, 2.0);
    let x = f32s(&[4, 5], 3104);
    let y = f32s(&[4, 5], 3105);
    let g = f32s(&[4, 5], 3106);
    let one = scalar(F32, 1.5);
    let z = f32s(&[0, 3], 3107);
    let zs = scalar(F32, 1.0);
    vec![
        c("binary_cross_entropy", vec![p.clone(), t.clone()], &[]),
        c(
            "binary_cross_entropy",
            vec![p.clone(), t.clone(), w.clone()],
            &[("reduction", i(0))],
        ),
        c(
            "binary_cross_entropy",
            vec![
                range(BF16, &[3, 4], 3108, 0.05, 0.95),
                h(BF16, &[3, 4], &[0.5; 12]),
            ],
            &[("reduction", i(2))],
        ),
        c(
            "binary_cross_entropy_backward",
            vec![one.clone(), p.clone(), t.clone()],
            &[],
        ),
        c(
            "binary_cross_entropy_backward",
            vec![g.clone(), p.clone(), t.clone(), w.clone()],
            &[("reduction", i(0))],
        ),
        c("smooth_l1_loss", vec![x.clone(), y.clone()], &[]),
        c(
            "smooth_l1_loss",
            vec![x.clone(), y.clone()],
            &[("reduction", i(0)), ("beta", f(0.0))],
        ),
        c(
            "smooth_l1_loss_backward",
            vec![one.clone(), x.clone(), y.clone()],
            &[("beta", f(0.5))],
        ),
        c(
            "smooth_l1_loss_backward",
            vec![g.clone(), x.clone(), y.clone()],
            &[("reduction", i(0))],
        ),
        c(
            "huber_loss",
            vec![x.clone(), y.clone()],
            &[("delta", f(0.7)), ("reduction", i(2))],
        ),
        c(
            "huber_loss_backward",
            vec![g.clone(), x.clone(), y.clone()],
            &[("reduction", i(0)), ("delta", f(2.0))],
        ),
        c(
            "binary_cross_entropy",
            vec![z.clone(), z.clone()],
            &[("reduction", i(0))],
        ),
        c(
            "binary_cross_entropy_backward",
            vec![z.clone(), z.clone(), z.clone()],
            &[("reduction", i(0))],
        ),
        c(
            "smooth_l1_loss",
            vec![z.clone(), z.clone()],
            &[("reduction", i(2))],
        ),
        c(
            "smooth_l1_loss_backward",
            vec![zs.clone(), z.clone(), z.clone()],
            &[("reduction", i(2))],
        ),
        c(
            "huber_loss",
            vec![z.clone(), z.clone()],
            &[("reduction", i(0))],
        ),
        c(
            "huber_loss_backward",
            vec![z.clone(), z.clone(), z.clone()],
            &[("reduction", i(0))],
        ),
    ]
}

fn all_cases() -> Vec<Case> {
    [
        pointwise_cases(),
        more_loss_cases(),
        math_and_activation_cases(),
        reduction_cases(),
        shape_cases(),
        linalg_cases(),
        solve_cases(),
        qr_cases(),
        spectral_cases(),
        nn_cases(),
        random_cases(),
        loss_cases(),
        attention_cases(),
        backward_cases(),
        conv_cases(),
        index_cases(),
        optim_cases(),
        sparse_cases(),
        zero_rows_cases(),
        zero_size_cases(),
        large_cases(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// An op whose graph holds a product (dot_general, convolution, attention)
/// says it reads the precision in force, so a frontend passes its
/// framework's setting on before it.
#[test]
fn ops_with_products_say_they_read_the_precision() {
    let mut wrong = Vec::new();
    for case in all_cases() {
        let id = lookup(case.op).unwrap();
        let types: Vec<TensorType> = case.inputs.iter().map(|t| t.ty.clone()).collect();
        let graph = build_graph(id, &types, &case.attrs).unwrap();
        let products = graph.nodes().iter().any(|n| {
            matches!(
                n.prim,
                Prim::DotGeneral { .. }
                    | Prim::Convolution { .. }
                    | Prim::Attention { .. }
                    | Prim::AttentionBackward { .. }
            )
        });
        if products && !reads_precision(id) {
            wrong.push(case.op);
        }
    }
    assert!(wrong.is_empty(), "ops with products not flagged: {wrong:?}");
    assert!(reads_precision(lookup("mm").unwrap()) && !reads_precision(lookup("add").unwrap()));
}

/// The table has a case for every registered op (so every op file), and
/// a zero-size case for every op.
#[test]
fn the_table_covers_every_registered_op() {
    let cases = all_cases();
    let mut names: Vec<&str> = cases.iter().map(|c| c.op).collect();
    names.sort_unstable();
    names.dedup();
    let missing: Vec<&str> = op_names()
        .into_iter()
        .filter(|n| !names.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "ops without a case in ops/modes_tests.rs (add one): {missing:?}"
    );
    assert!(names.len() >= 60, "{} ops", names.len());
    let zero = |c: &Case| -> bool {
        c.inputs.iter().any(|t| t.numel() == 0)
            || reference(c.op, &c.inputs, &c.attrs)
                .unwrap()
                .iter()
                .any(|t| t.numel() == 0)
    };
    let without: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !cases.iter().any(|c| c.op == *n && zero(c)))
        .collect();
    assert!(
        without.is_empty(),
        "ops without a zero-size case: {without:?}"
    );
}

/// The comparison itself: tolerances by dtype, NaN equals NaN, types and
/// integers exact.
#[test]
fn the_comparison_catches_differences() {
    use DType::*;
    let a = h(F32, &[3], &[1.0, -2.0, f64::NAN]);
    assert!(mismatch(&a, &a).is_none());
    assert!(mismatch(&h(F32, &[3], &[1.0 + 5e-6, -2.0, f64::NAN]), &a).is_none());
    assert!(mismatch(&h(F32, &[3], &[1.0 + 3e-5, -2.0, f64::NAN]), &a).is_some());
    assert!(mismatch(&h(F32, &[3], &[1.0, -2.0, 0.0]), &a).is_some());
    assert!(mismatch(&h(F64, &[3], &[1.0, -2.0, f64::NAN]), &a).is_some());
    assert!(mismatch(&h(F32, &[1, 3], &[1.0, -2.0, f64::NAN]), &a).is_some());
    let hb = h(BF16, &[2], &[1.0, 8.0]);
    assert!(mismatch(&h(BF16, &[2], &[1.0078125, 8.0625]), &hb).is_none());
    assert!(mismatch(&h(BF16, &[2], &[1.03125, 8.0]), &hb).is_some());
    // Exact beyond f64's 53 bits.
    let big = |v: i64| HostTensor::from_slice(I64, &[2], &[1i64, v]).unwrap();
    assert!(mismatch(&big(1 << 60), &big((1 << 60) + 1)).is_some());
    assert!(mismatch(&big(1 << 60), &big(1 << 60)).is_none());
    assert!(mismatch(&h(Bool, &[2], &[1.0, 0.0]), &h(Bool, &[2], &[1.0, 1.0])).is_some());
}

/// Every case of the table on the xla platform (the XLA CPU plugin), in
/// the strict mode with contiguous inputs, against the same reference:
/// every primitive lowers, so every case must run and match.
#[cfg(feature = "xla")]
#[test]
fn cases_on_the_xla_platform_match_the_reference() {
    let r = Runtime::new(&RuntimeOptions {
        platform: Some("xla".into()),
        host_chips: Some(1),
        host_topology: None,
        host_hbm_bytes: Some(512 << 20),
        cache: Some(CacheConfig::memory_only(4096)),
    })
    .unwrap();
    let st = r.default_stream(0).unwrap();
    let _mode = InMode::push(EagerMode::DeferNever);
    let (mut ran, mut problems) = (0usize, Vec::new());
    let cases = all_cases();
    for case in &cases {
        let id = lookup(case.op).unwrap();
        // The reference, evaluated from the graph the tolerance looks at.
        let types: Vec<TensorType> = case.inputs.iter().map(|t| t.ty.clone()).collect();
        let graph = build_graph(id, &types, &case.attrs).unwrap();
        let want = eval_graph(&graph, &case.inputs)
            .unwrap_or_else(|e| panic!("reference of {}: {e}", describe(case)));
        let result = case
            .inputs
            .iter()
            .map(|t| upload(&r, &st, t, false))
            .collect::<Result<Vec<_>>>()
            .and_then(|ins| r.call_op_alloc(id, &ins, &case.attrs, &st))
            .and_then(|outs| {
                outs.iter()
                    .map(|o| download(&r, &st, o))
                    .collect::<Result<Vec<_>>>()
            });
        match result {
            Err(e) => problems.push(format!("{}: {e}", describe(case))),
            Ok(got) => {
                ran += 1;
                // XLA sums in another order (pairs and vectors): an f32 sum
                // of n terms may differ by about n·eps·max|x| from ours,
                // which is more than the relative tolerance where terms
                // cancel. The table's longest sums have ~500 terms of
                // magnitude ≤ 2 (~6e-5); pointwise graphs keep 1e-6.
                let sums = graph.nodes().iter().any(|n| {
                    matches!(
                        n.prim,
                        crate::ir::Prim::Reduce { .. }
                            | crate::ir::Prim::DotGeneral { .. }
                            | crate::ir::Prim::Cumulative { .. }
                            | crate::ir::Prim::Convolution { .. }
                    )
                });
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    let tol = match (tolerance(w.dtype()), w.dtype()) {
                        (Some((rel, _)), DType::F32) if sums => Some((rel, 6e-5)),
                        (t, _) => t,
                    };
                    if let Some(m) = mismatch_within(g, w, tol) {
                        problems.push(format!("{} output {k}: {m}", describe(case)));
                    }
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
    assert_eq!(ran, cases.len());
}

/// Out-of-range indices are an error naming the primitive, the index and
/// its position, on the host platform in every mode and on xla (where XLA
/// itself would clamp a gather and drop a scatter update); nothing is
/// written.
#[test]
fn out_of_range_indices_are_errors_on_every_platform() {
    use DType::*;
    let x = f32s(&[4, 3], 2100);
    let cases = vec![
        (
            c(
                "index_select",
                vec![x.clone(), idx(I64, &[2], &[1, 4])],
                &[("dim", i(0))],
            ),
            "take: index 4 at position [1] is out of range: axis 0 has size 4",
        ),
        (
            c(
                "gather",
                vec![x.clone(), idx(I64, &[1, 2], &[0, 3])],
                &[("dim", i(1))],
            ),
            "gather: index 3 at position [0, 1] is out of range: axis 1 has size 3",
        ),
        (
            c(
                "scatter_add",
                vec![
                    x.clone(),
                    idx(I64, &[1, 3], &[0, 7, 1]),
                    f32s(&[1, 3], 2101),
                ],
                &[("dim", i(0))],
            ),
            "scatter: index 7 at position [0, 1] is out of range: axis 0 has size 4",
        ),
        (
            c(
                "embedding",
                vec![x.clone(), idx(I32, &[3], &[2, -1, 0])],
                &[],
            ),
            "take: index -1 at position [1] is out of range: axis 0 has size 4",
        ),
    ];
    #[cfg_attr(not(feature = "xla"), allow(unused_mut))]
    let mut runtimes = vec![(runtime(), MODES.to_vec())];
    #[cfg(feature = "xla")]
    runtimes.push((
        Runtime::new(&RuntimeOptions {
            platform: Some("xla".into()),
            host_chips: Some(1),
            host_topology: None,
            host_hbm_bytes: Some(256 << 20),
            cache: Some(CacheConfig::memory_only(256)),
        })
        .unwrap(),
        vec![EagerMode::DeferNever],
    ));
    for (r, modes) in &runtimes {
        for mode in modes {
            for (case, want) in &cases {
                let st = r
                    .create_stream(0, crate::platform::CoreKind::TensorCore, 0)
                    .unwrap();
                let inputs: Vec<DeviceTensor> = case
                    .inputs
                    .iter()
                    .map(|t| upload(r, &st, t, false).unwrap())
                    .collect();
                let id = lookup(case.op).unwrap();
                let e = run_in_mode(r, &st, *mode, id, &inputs, &case.attrs)
                    .err()
                    .unwrap_or_else(|| panic!("{} in {mode:?}: no error", case.op));
                assert!(
                    e.to_string().contains(want),
                    "{} in {mode:?} on {}: {e}",
                    case.op,
                    r.platform().name()
                );
            }
        }
    }
}

// ---------------------------------------------------------------- precision

/// Pops the pushed precision even when the body fails.
struct AtPrecision;
impl AtPrecision {
    fn push(p: crate::ir::Precision) -> AtPrecision {
        crate::precision::push(p);
        AtPrecision
    }
}
impl Drop for AtPrecision {
    fn drop(&mut self) {
        let _ = crate::precision::pop();
    }
}

/// Largest |got - exact| over the elements, in f64.
fn max_error(got: &HostTensor, exact: &HostTensor) -> f64 {
    got.to_f64_vec()
        .iter()
        .zip(exact.to_f64_vec())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
}

/// An op's f32 products take the precision in force when it is called, in
/// every mode (a deferred op keeps it after the pop, until its flush), and
/// the host gives what a TPU would: the op's graph built at that precision
/// with its products emulated (`ops::expand_precision`). DEFAULT is off
/// the f64 product by about bf16's rounding, HIGH by far less, HIGHEST is
/// f32.
#[test]
fn products_take_the_precision_in_force_when_called() {
    use crate::ir::Precision;
    let r = runtime();
    let st = r.default_stream(0).unwrap();
    let geo = [
        ("stride", is(&[1, 1])),
        ("padding", is(&[1, 0])),
        ("dilation", is(&[1, 1])),
        ("groups", i(1)),
    ];
    let cases = vec![
        c(
            "linear",
            vec![f32s(&[6, 40], 31), f32s(&[24, 40], 32), f32s(&[24], 33)],
            &[],
        ),
        c(
            "bmm",
            vec![f32s(&[3, 5, 33], 34), f32s(&[3, 33, 7], 35)],
            &[],
        ),
        c(
            "scaled_dot_product_attention",
            vec![
                f32s(&[2, 3, 5, 16], 36),
                f32s(&[2, 3, 9, 16], 37),
                f32s(&[2, 3, 9, 16], 38),
            ],
            &[("is_causal", b(true))],
        ),
        c(
            "conv2d",
            vec![f32s(&[1, 4, 6, 7], 39), f32s(&[5, 4, 3, 3], 40)],
            &geo,
        ),
    ];
    let mut problems = Vec::new();
    for case in &cases {
        let id = lookup(case.op).unwrap();
        let types: Vec<TensorType> = case.inputs.iter().map(|t| t.ty.clone()).collect();
        let wide: Vec<HostTensor> = case
            .inputs
            .iter()
            .map(|t| h(DType::F64, t.dims(), &t.to_f64_vec()))
            .collect();
        let exact = reference(case.op, &wide, &case.attrs).unwrap().remove(0);
        let dev: Vec<DeviceTensor> = case
            .inputs
            .iter()
            .map(|t| upload(&r, &st, t, false).unwrap())
            .collect();
        let mut errors = Vec::new();
        for p in [Precision::Default, Precision::High, Precision::Highest] {
            let graph = build_graph_at(id, &types, &case.attrs, p).unwrap();
            let want = eval_graph(&graph, &case.inputs).unwrap().remove(0);
            errors.push(max_error(&want, &exact));
            for mode in MODES {
                let _mode = InMode::push(mode);
                let outs = {
                    let _p = AtPrecision::push(p);
                    r.call_op_alloc(id, &dev, &case.attrs, &st).unwrap()
                };
                let got = download(&r, &st, &outs[0]).unwrap();
                if let Some(m) = mismatch(&got, &want) {
                    problems.push(format!("{} at {p:?} in {}: {m}", case.op, mode.name()));
                }
            }
        }
        // The rounding shows, and each step up removes most of it.
        let [default, high, highest] = [errors[0], errors[1], errors[2]];
        if !(default > 1e-3 && high < default / 50.0 && highest <= high.max(1e-5)) {
            problems.push(format!(
                "{}: errors against f64 DEFAULT {default:e}, HIGH {high:e}, HIGHEST {highest:e}",
                case.op
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
