//! Lowering of the primitive IR to StableHLO text (MLIR), which every PJRT
//! plugin compiles. One function, `main`, whose parameters and results are
//! the graph's, followed by one i64[2] result per index check (below).
//! Every primitive lowers.
//!
//! XLA clamps an out-of-range gather index and drops an out-of-range
//! scatter update, where the host platform's kernels (and torch) refuse
//! them. So each take, gather and scatter also computes, in the program,
//! the first position of its index operand that lies outside the indexed
//! axis, and that index: the executable turns a hit into the host kernels'
//! error, before any output is written.
//!
//! XLA writes a dynamic_update_slice into its target's buffer in place,
//! fused with the computation of the update; where the update reads that
//! same buffer at other positions (a row plus a broadcast of its first
//! element), the CPU plugin's fused loop read elements it had already
//! overwritten (`x[0] += x[0, 0]` gave `[0, x01, x02, x03]`; an
//! optimization barrier around the update did not help, XLA removes it
//! before fusing). Such an update is selected over its target instead.

use std::fmt::Write;

mod factor;
mod householder;
mod jacobi;

/// The version of what this module emits, part of the xla platform's
/// version and so of every compile-cache key there: raise it when a module
/// would compute differently (a disk cache written before then is not
/// loaded). 2: f32 and f64 products at HIGHEST precision. 3: compiled
/// without excess precision (`options::DEFAULTS`); bf16 and f16
/// transcendental functions at f32. 4: bf16 and f16 scatter sums and
/// products at f32. 5: float max and min reductions propagate NaN. 6:
/// elementwise float max and min propagate NaN from either operand. 7:
/// Jacobi's sweeps end once only NaN rotates. 8: f32 uniforms' Philox
/// counters carry 1 in their top word (apart from the normals' blocks). 9:
/// a dynamic_update_slice whose update reads its own target
/// (`reads_its_target`: selected, not updated in place). 10: scalar i64
/// constants written exactly (they went through f64, so seeds and fill
/// values past 2^53 were rounded).
pub const LOWERING_VERSION: u32 = 10;

/// The precision a product or convolution of `d` operands is emitted at,
/// None for none given: f32 at the product's own (HIGHEST, full f32, as
/// torch computes it by default, unless the caller asked for less; a TPU
/// then takes bf16 passes and a GPU TF32), f64 at HIGHEST. (The CPU plugin
/// computes f32 in full whatever it says; bf16 and f16 lose nothing.)
fn product_precision(d: DType, p: Precision) -> Option<&'static str> {
    match d {
        DType::F32 => Some(p.name()),
        DType::F64 => Some(Precision::Highest.name()),
        _ => None,
    }
}

use crate::error::{Error, Result};
use crate::ir::{
    BinaryOp, CompareOp, DType, Graph, Precision, Prim, ReduceOp, RngDistribution, ScatterCombiner,
    TensorType, UnaryOp, ValueId,
};

/// Where XLA writes one output of a program lowered for execution
/// (`lower_aliased`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OutputSlot {
    /// A buffer of its own, which the caller copies out.
    Own,
    /// The buffer passed for one more parameter, after the graph's, of
    /// the output's type and aliased to it (unused by the body).
    Extra,
    /// The buffer passed for the graph's parameter of this index, aliased
    /// to the output: the output is stored over it (`ir::Alias`).
    Param(usize),
}

/// One indexed primitive's check: its index operand must lie in
/// 0..bound. Its extra result holds (first bad flat position, its index),
/// or (numel of the index, 0) when every index is in range.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexCheck {
    pub prim: String,
    pub axis: usize,
    pub bound: u64,
    pub index_dims: Vec<u64>,
}

impl IndexCheck {
    /// The error for a check's result, worded as the host kernels word it;
    /// None when every index was in range.
    pub fn error(&self, found: [i64; 2]) -> Option<Error> {
        let n: u64 = self.index_dims.iter().product();
        let [pos, v] = found;
        if pos < 0 || pos as u64 >= n {
            return None;
        }
        let mut flat = pos as u64;
        let mut at = vec![0u64; self.index_dims.len()];
        for (i, &d) in self.index_dims.iter().enumerate().rev() {
            if d > 0 {
                at[i] = flat % d;
                flat /= d;
            }
        }
        let (axis, bound) = (self.axis, self.bound);
        Some(Error::invalid(format!(
            "{}: index {v} at position {at:?} is out of range: axis {axis} has size {bound}, \
             so indices must lie in 0..{bound}",
            self.prim
        )))
    }
}

/// Emit the check of `index` (of type `index_ty`, dims `idims`) against
/// 0..bound as `{o}_chk`, an i64[2]: (first bad flat position or numel,
/// the index there or 0).
fn index_check(
    w: &mut impl FnMut(String),
    o: &str,
    index: &str,
    index_ty: &str,
    idims: &[u64],
    bound: u64,
) -> String {
    let n: u64 = idims.iter().product();
    let it = ty(&TensorType::new(DType::I64, idims));
    let ft = ty(&TensorType::new(DType::I64, &[n]));
    let bt = ty(&TensorType::new(DType::Bool, &[n]));
    let st = ty(&TensorType::scalar(DType::I64));
    let one = ty(&TensorType::new(DType::I64, &[1]));
    let c = format!("{o}_chk");
    w(format!(
        "{c}_i = stablehlo.convert {index} : ({index_ty}) -> {it}"
    ));
    w(format!("{c}_f = stablehlo.reshape {c}_i : ({it}) -> {ft}"));
    w(format!("{c}_zero = stablehlo.constant dense<0> : {ft}"));
    w(format!(
        "{c}_bound = stablehlo.constant dense<{bound}> : {ft}"
    ));
    w(format!(
        "{c}_lo = stablehlo.compare LT, {c}_f, {c}_zero, SIGNED : ({ft}, {ft}) -> {bt}"
    ));
    w(format!(
        "{c}_hi = stablehlo.compare GE, {c}_f, {c}_bound, SIGNED : ({ft}, {ft}) -> {bt}"
    ));
    w(format!("{c}_bad = stablehlo.or {c}_lo, {c}_hi : {bt}"));
    w(format!("{c}_pos = stablehlo.iota dim = 0 : {ft}"));
    w(format!("{c}_n = stablehlo.constant dense<{n}> : {ft}"));
    w(format!(
        "{c}_cand = stablehlo.select {c}_bad, {c}_pos, {c}_n : ({bt}, {ft}, {ft}) -> {ft}"
    ));
    w(format!("{c}_init = stablehlo.constant dense<{n}> : {st}"));
    w(format!(
        "{c}_first = \"stablehlo.reduce\"({c}_cand, {c}_init) ({{\n      ^bb0(%a: {st}, %b: {st}):\n        %r = stablehlo.minimum %a, %b : {st}\n        stablehlo.return %r : {st}\n    }}) {{dimensions = array<i64: 0>}} : ({ft}, {st}) -> {st}"
    ));
    w(format!(
        "{c}_firstb = stablehlo.broadcast_in_dim {c}_first, dims = [] : ({st}) -> {ft}"
    ));
    w(format!(
        "{c}_at = stablehlo.compare EQ, {c}_pos, {c}_firstb, SIGNED : ({ft}, {ft}) -> {bt}"
    ));
    w(format!(
        "{c}_vals = stablehlo.select {c}_at, {c}_f, {c}_zero : ({bt}, {ft}, {ft}) -> {ft}"
    ));
    w(format!("{c}_vinit = stablehlo.constant dense<0> : {st}"));
    w(format!(
        "{c}_val = \"stablehlo.reduce\"({c}_vals, {c}_vinit) ({{\n      ^bb0(%a: {st}, %b: {st}):\n        %r = stablehlo.add %a, %b : {st}\n        stablehlo.return %r : {st}\n    }}) {{dimensions = array<i64: 0>}} : ({ft}, {st}) -> {st}"
    ));
    w(format!(
        "{c}_first1 = stablehlo.reshape {c}_first : ({st}) -> {one}"
    ));
    w(format!(
        "{c}_val1 = stablehlo.reshape {c}_val : ({st}) -> {one}"
    ));
    w(format!(
        "{c} = \"stablehlo.concatenate\"({c}_first1, {c}_val1) {{dimension = 0 : i64}} : ({one}, {one}) -> {}",
        ty(&TensorType::new(DType::I64, &[2]))
    ));
    c
}

pub(crate) fn elem(d: DType) -> &'static str {
    match d {
        DType::Bool => "i1",
        DType::U8 => "ui8",
        DType::I8 => "i8",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => "f32",
        DType::F64 => "f64",
    }
}

fn ty(t: &TensorType) -> String {
    shaped(&t.dims, elem(t.dtype))
}

/// `tensor<dims x element>` for any element type name (also ui32/ui64,
/// which the IR has no dtype for).
fn shaped(dims: &[u64], element: &str) -> String {
    if dims.is_empty() {
        return format!("tensor<{element}>");
    }
    let dims: Vec<String> = dims.iter().map(u64::to_string).collect();
    format!("tensor<{}x{element}>", dims.join("x"))
}

/// Defines `{o}` as zeros of `d` in the result type `ot` (for results that
/// need no computation, where XLA rejects the empty operation).
fn zeros(w: &mut impl FnMut(String), o: &str, d: DType, ot: &str) {
    splat(w, o, &identity(ReduceOp::Sum, d), d, ot);
}

/// `o`, of type `ot` with elements `d`, every element `literal`.
fn splat(w: &mut impl FnMut(String), o: &str, literal: &str, d: DType, ot: &str) {
    let st = ty(&TensorType::scalar(d));
    w(format!(
        "{o}_elem = stablehlo.constant dense<{literal}> : {st}"
    ));
    w(format!(
        "{o} = stablehlo.broadcast_in_dim {o}_elem, dims = [] : ({st}) -> {ot}"
    ));
}

/// The comparison type of `stablehlo.compare` for elements of `d`.
fn compare_kind(d: DType) -> &'static str {
    if d.is_float() {
        "FLOAT"
    } else if matches!(d, DType::U8 | DType::Bool) {
        "UNSIGNED"
    } else {
        "SIGNED"
    }
}

fn list(v: &[usize]) -> String {
    v.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn nums<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(", ")
}

fn unary_name(op: UnaryOp) -> Option<&'static str> {
    Some(match op {
        UnaryOp::Neg => "stablehlo.negate",
        UnaryOp::Abs => "stablehlo.abs",
        UnaryOp::Exp => "stablehlo.exponential",
        UnaryOp::Expm1 => "stablehlo.exponential_minus_one",
        UnaryOp::Log => "stablehlo.log",
        UnaryOp::Log1p => "stablehlo.log_plus_one",
        UnaryOp::Sqrt => "stablehlo.sqrt",
        UnaryOp::Rsqrt => "stablehlo.rsqrt",
        UnaryOp::Tanh => "stablehlo.tanh",
        UnaryOp::Logistic => "stablehlo.logistic",
        UnaryOp::Sin => "stablehlo.sine",
        UnaryOp::Cos => "stablehlo.cosine",
        UnaryOp::Erf => "chlo.erf",
        UnaryOp::Floor => "stablehlo.floor",
        UnaryOp::Ceil => "stablehlo.ceil",
        UnaryOp::Round => "stablehlo.round_nearest_even",
        UnaryOp::Sign => "stablehlo.sign",
        UnaryOp::Not => "stablehlo.not",
        UnaryOp::IsFinite => return None,
    })
}

/// Whether a bf16 or f16 `op` is lowered at f32: the functions whose
/// result is not exact (neither a sign, a rounding nor a comparison).
fn widened_unary(op: UnaryOp) -> bool {
    matches!(
        op,
        UnaryOp::Exp
            | UnaryOp::Expm1
            | UnaryOp::Log
            | UnaryOp::Log1p
            | UnaryOp::Sqrt
            | UnaryOp::Rsqrt
            | UnaryOp::Tanh
            | UnaryOp::Logistic
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Erf
    )
}

fn binary_name(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "stablehlo.add",
        BinaryOp::Sub => "stablehlo.subtract",
        BinaryOp::Mul => "stablehlo.multiply",
        BinaryOp::Div => "stablehlo.divide",
        BinaryOp::Rem => "stablehlo.remainder",
        BinaryOp::Pow => "stablehlo.power",
        BinaryOp::Max => "stablehlo.maximum",
        BinaryOp::Min => "stablehlo.minimum",
        BinaryOp::And => "stablehlo.and",
        BinaryOp::Or => "stablehlo.or",
        BinaryOp::Xor => "stablehlo.xor",
        BinaryOp::Atan2 => "stablehlo.atan2",
    }
}

/// The body of a reduction's region over `st` scalars of `d`, from `%a`
/// and `%b` to `%r`. Float max and min propagate NaN, as the host and
/// torch do: the XLA CPU plugin's reductions with a bare maximum or
/// minimum drop it (amax of [1, NaN, 5] gave 5). The selects cost: amax
/// over all of 2048 x 4096 f32 took 8.5 ms against 2.5, per row 1.5-1.9
/// against 1.2-1.4 (a second reduction marking NaN rows cost as much).
fn reduce_region(op: ReduceOp, d: DType, st: &str) -> String {
    let f = reduce_body(op);
    if !(d.is_float() && matches!(op, ReduceOp::Max | ReduceOp::Min)) {
        return format!("%r = {f} %a, %b : {st}");
    }
    nan_propagating(f, "%a", "%b", st, "tensor<i1>", "%", "%r").join("\n        ")
}

/// The lines of `out = f(a, b)` for a float maximum or minimum `f` over
/// values of type `t` (`mask` its i1 shape) that propagate a NaN from
/// either operand: f, then a select on each operand's NaN. Intermediates
/// are named `{tmp}m`, `{tmp}an`, `{tmp}bn` and `{tmp}mb`.
fn nan_propagating(
    f: &str,
    a: &str,
    b: &str,
    t: &str,
    mask: &str,
    tmp: &str,
    out: &str,
) -> [String; 5] {
    [
        format!("{tmp}m = {f} {a}, {b} : {t}"),
        format!("{tmp}an = stablehlo.compare NE, {a}, {a}, FLOAT : ({t}, {t}) -> {mask}"),
        format!("{tmp}bn = stablehlo.compare NE, {b}, {b}, FLOAT : ({t}, {t}) -> {mask}"),
        format!("{tmp}mb = stablehlo.select {tmp}bn, {b}, {tmp}m : {mask}, {t}"),
        format!("{out} = stablehlo.select {tmp}an, {a}, {tmp}mb : {mask}, {t}"),
    ]
}

fn reduce_body(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "stablehlo.add",
        ReduceOp::Prod => "stablehlo.multiply",
        ReduceOp::Max => "stablehlo.maximum",
        ReduceOp::Min => "stablehlo.minimum",
        ReduceOp::And => "stablehlo.and",
        ReduceOp::Or => "stablehlo.or",
    }
}

/// The reduction's identity as a StableHLO literal of `d`.
fn identity(op: ReduceOp, d: DType) -> String {
    let float = d.is_float();
    match (op, float) {
        (ReduceOp::Sum | ReduceOp::Or, true) => "0.0".into(),
        (ReduceOp::Prod, true) => "1.0".into(),
        (ReduceOp::Max, true) => "0xFF800000".into(),
        (ReduceOp::Min, true) => "0x7F800000".into(),
        (ReduceOp::Sum | ReduceOp::Or, false) => {
            if d == DType::Bool { "false" } else { "0" }.into()
        }
        (ReduceOp::Prod | ReduceOp::And, _) => if d == DType::Bool { "true" } else { "1" }.into(),
        (ReduceOp::Max, false) => match d {
            DType::Bool => "false".into(),
            DType::U8 => "0".into(),
            DType::I8 => i8::MIN.to_string(),
            DType::I32 => i32::MIN.to_string(),
            _ => i64::MIN.to_string(),
        },
        (ReduceOp::Min, false) => match d {
            DType::Bool => "true".into(),
            DType::U8 => "255".into(),
            DType::I8 => i8::MAX.to_string(),
            DType::I32 => i32::MAX.to_string(),
            _ => i64::MAX.to_string(),
        },
    }
}

/// A float infinity literal of `d` for max/min identities (hex is per width).
fn float_inf(d: DType, negative: bool) -> &'static str {
    match (d, negative) {
        (DType::F32, true) => "0xFF800000",
        (DType::F32, false) => "0x7F800000",
        (DType::F64, true) => "0xFFF0000000000000",
        (DType::F64, false) => "0x7FF0000000000000",
        (DType::F16, true) => "0xFC00",
        (DType::F16, false) => "0x7C00",
        (_, true) => "0xFF80",
        (_, false) => "0x7F80",
    }
}

fn constant_literal(dtype: DType, dims: &[u64], bytes: &[u8]) -> String {
    if dims.is_empty() || dims.iter().product::<u64>() == 1 {
        let v = crate::ir::literal::decode(dtype, bytes, 0);
        return match dtype {
            DType::Bool => if v != 0.0 { "true" } else { "false" }.to_string(),
            d if d.is_float() => {
                if v.is_finite() {
                    format!("{v:.17e}")
                } else {
                    // Hex of the element's bytes, most significant first.
                    let hex: String = bytes.iter().rev().map(|b| format!("{b:02X}")).collect();
                    format!("0x{hex}")
                }
            }
            // i64 from its bytes: through f64, values past 2^53 round.
            DType::I64 => match bytes.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
                Some(b) => i64::from_le_bytes(b).to_string(),
                None => format!("{}", v as i64),
            },
            _ => format!("{}", v as i64),
        };
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02X}")).collect();
    format!("\"0x{hex}\"")
}

/// Emits, under the names `{o}_*`, full index vectors for torch.gather and
/// torch.scatter: for every element i of `index` (dims `idims`), the
/// vector i with i[axis] replaced by index[i], as i64, stacked on a last
/// dimension of length `rank`. Returns the name and type of the result.
fn full_indices(
    w: &mut impl FnMut(String),
    o: &str,
    index: &str,
    index_ty: &str,
    idims: &[u64],
    axis: usize,
    rank: usize,
) -> (String, String) {
    let it = ty(&TensorType::new(DType::I64, idims));
    let mut one = idims.to_vec();
    one.push(1);
    let ot1 = ty(&TensorType::new(DType::I64, &one));
    let mut full = idims.to_vec();
    full.push(rank as u64);
    let ft = ty(&TensorType::new(DType::I64, &full));
    let mut parts = Vec::new();
    for k in 0..rank {
        let v = format!("{o}_ix{k}");
        if k == axis {
            w(format!(
                "{v} = stablehlo.convert {index} : ({index_ty}) -> {it}"
            ));
        } else {
            w(format!("{v} = stablehlo.iota dim = {k} : {it}"));
        }
        w(format!("{v}_1 = stablehlo.reshape {v} : ({it}) -> {ot1}"));
        parts.push(format!("{v}_1"));
    }
    let name = format!("{o}_full");
    w(format!(
        "{name} = \"stablehlo.concatenate\"({}) {{dimension = {rank} : i64}} : ({}) -> {ft}",
        parts.join(", "),
        vec![ot1.as_str(); rank].join(", ")
    ));
    (name, ft)
}

/// Emits, under the names `{o}_*`, the Philox draw that the host kernel
/// `rng.rs` defines (its module docs are the specification), for a result
/// of type `out` from the i64 scalars `seed` and `offset`: counters
/// offset + i as 128-bit integers, ten Philox 4x32 rounds in u64
/// arithmetic on 32-bit words, then the distribution's transform. Ends by
/// defining `{o}`.
fn philox(
    w: &mut impl FnMut(String),
    o: &str,
    seed: &str,
    offset: &str,
    distribution: RngDistribution,
    out: &TensorType,
) {
    let dims = &out.dims;
    let n = out.numel();
    let u64t = shaped(dims, "ui64");
    let f64t = ty(&TensorType::new(DType::F64, dims));
    let ot = ty(out);
    let bd = |src: &str, st: &str, dt: &str| {
        format!("stablehlo.broadcast_in_dim {src}, dims = [] : ({st}) -> {dt}")
    };
    // The seed and the counter base as u64 scalars.
    w(format!(
        "{o}_seed = stablehlo.bitcast_convert {seed} : (tensor<i64>) -> tensor<ui64>"
    ));
    w(format!(
        "{o}_off = stablehlo.bitcast_convert {offset} : (tensor<i64>) -> tensor<ui64>"
    ));
    w(format!(
        "{o}_offb = {}",
        bd(&format!("{o}_off"), "tensor<ui64>", &u64t)
    ));
    w(format!("{o}_32 = stablehlo.constant dense<32> : {u64t}"));
    // Counters: offset + i (row-major), the carry as the third word.
    w(format!(
        "{o}_i1 = stablehlo.iota dim = 0 : tensor<{n}xui64>"
    ));
    w(format!(
        "{o}_i = stablehlo.reshape {o}_i1 : (tensor<{n}xui64>) -> {u64t}"
    ));
    w(format!("{o}_c = stablehlo.add {o}_offb, {o}_i : {u64t}"));
    let bt = shaped(dims, "i1");
    w(format!(
        "{o}_wrapped = stablehlo.compare LT, {o}_c, {o}_offb, UNSIGNED : ({u64t}, {u64t}) -> {bt}"
    ));
    // f32-based uniforms read one word per element: block
    // 16 floor(c / 64) + (c mod 16), word floor(c / 16) mod 4, with c's
    // carry as bit 64 and 1 as the top counter word (`rng.rs`); the others
    // take counter c itself.
    let per_word = distribution == RngDistribution::Uniform && out.dtype != DType::F64;
    let counter = if per_word {
        let c = |v: u64| format!("stablehlo.constant dense<{v}> : {u64t}");
        w(format!("{o}_6 = {}", c(6)));
        w(format!("{o}_4 = {}", c(4)));
        w(format!("{o}_58 = {}", c(58)));
        w(format!("{o}_15 = {}", c(15)));
        w(format!("{o}_3 = {}", c(3)));
        w(format!(
            "{o}_carry = stablehlo.convert {o}_wrapped : ({bt}) -> {u64t}"
        ));
        w(format!(
            "{o}_carryg = stablehlo.shift_left {o}_carry, {o}_58 : {u64t}"
        ));
        w(format!(
            "{o}_g0 = stablehlo.shift_right_logical {o}_c, {o}_6 : {u64t}"
        ));
        w(format!("{o}_g = stablehlo.or {o}_g0, {o}_carryg : {u64t}"));
        w(format!(
            "{o}_g16 = stablehlo.shift_left {o}_g, {o}_4 : {u64t}"
        ));
        w(format!("{o}_lane = stablehlo.and {o}_c, {o}_15 : {u64t}"));
        w(format!("{o}_blk = stablehlo.or {o}_g16, {o}_lane : {u64t}"));
        w(format!(
            "{o}_j0 = stablehlo.shift_right_logical {o}_c, {o}_4 : {u64t}"
        ));
        w(format!("{o}_j = stablehlo.and {o}_j0, {o}_3 : {u64t}"));
        format!("{o}_blk")
    } else {
        format!("{o}_c")
    };
    // The state and key words are u64 holding 32-bit values: a round's
    // products need 64 bits, and no conversions run between rounds.
    w(format!(
        "{o}_mask = stablehlo.constant dense<4294967295> : {u64t}"
    ));
    w(format!(
        "{o}_x0_0 = stablehlo.and {counter}, {o}_mask : {u64t}"
    ));
    w(format!(
        "{o}_x1_0 = stablehlo.shift_right_logical {counter}, {o}_32 : {u64t}"
    ));
    if per_word {
        w(format!("{o}_x2_0 = stablehlo.constant dense<0> : {u64t}"));
    } else {
        w(format!(
            "{o}_x2_0 = stablehlo.convert {o}_wrapped : ({bt}) -> {u64t}"
        ));
    }
    let top = u64::from(per_word);
    w(format!(
        "{o}_x3_0 = stablehlo.constant dense<{top}> : {u64t}"
    ));
    w(format!(
        "{o}_m0 = stablehlo.constant dense<3528531795> : {u64t}"
    ));
    w(format!(
        "{o}_m1 = stablehlo.constant dense<3449720151> : {u64t}"
    ));
    // The key schedule runs on scalars, each round's key words broadcast.
    let u = "tensor<ui64>";
    w(format!(
        "{o}_smask = stablehlo.constant dense<4294967295> : {u}"
    ));
    w(format!("{o}_s32 = stablehlo.constant dense<32> : {u}"));
    w(format!(
        "{o}_w0 = stablehlo.constant dense<2654435769> : {u}"
    ));
    w(format!(
        "{o}_w1 = stablehlo.constant dense<3144134277> : {u}"
    ));
    w(format!(
        "{o}_ka_0 = stablehlo.and {o}_seed, {o}_smask : {u}"
    ));
    w(format!(
        "{o}_kb_0 = stablehlo.shift_right_logical {o}_seed, {o}_s32 : {u}"
    ));
    for r in 0..10 {
        let (x0, x1, x2, x3) = (
            format!("{o}_x0_{r}"),
            format!("{o}_x1_{r}"),
            format!("{o}_x2_{r}"),
            format!("{o}_x3_{r}"),
        );
        if r > 0 {
            // The key schedule, mod 2^32.
            for (k, inc) in [("ka", "w0"), ("kb", "w1")] {
                w(format!(
                    "{o}_{k}_{r}s = stablehlo.add {o}_{k}_{}, {o}_{inc} : {u}",
                    r - 1
                ));
                w(format!(
                    "{o}_{k}_{r} = stablehlo.and {o}_{k}_{r}s, {o}_smask : {u}"
                ));
            }
        }
        for k in ["ka", "kb"] {
            w(format!(
                "{o}_{k}_{r}b = {}",
                bd(&format!("{o}_{k}_{r}"), u, &u64t)
            ));
        }
        let (ka, kb) = (format!("{o}_ka_{r}b"), format!("{o}_kb_{r}b"));
        let q = format!("{o}_r{r}");
        w(format!("{q}_p0 = stablehlo.multiply {x0}, {o}_m0 : {u64t}"));
        w(format!("{q}_p1 = stablehlo.multiply {x2}, {o}_m1 : {u64t}"));
        w(format!(
            "{q}_h0 = stablehlo.shift_right_logical {q}_p0, {o}_32 : {u64t}"
        ));
        w(format!(
            "{q}_h1 = stablehlo.shift_right_logical {q}_p1, {o}_32 : {u64t}"
        ));
        w(format!("{q}_y0a = stablehlo.xor {q}_h1, {x1} : {u64t}"));
        w(format!(
            "{o}_x0_{} = stablehlo.xor {q}_y0a, {ka} : {u64t}",
            r + 1
        ));
        w(format!(
            "{o}_x1_{} = stablehlo.and {q}_p1, {o}_mask : {u64t}",
            r + 1
        ));
        w(format!("{q}_y2a = stablehlo.xor {q}_h0, {x3} : {u64t}"));
        w(format!(
            "{o}_x2_{} = stablehlo.xor {q}_y2a, {kb} : {u64t}",
            r + 1
        ));
        w(format!(
            "{o}_x3_{} = stablehlo.and {q}_p0, {o}_mask : {u64t}",
            r + 1
        ));
    }
    let word = |k: usize| format!("{o}_x{k}_10");
    // 53 bits from (hi, lo) as f64 in [0, 1), under `name`.
    let bits53 = |w: &mut dyn FnMut(String), name: &str, hi: String, lo: String, plus_one: bool| {
        w(format!("{name}_21 = stablehlo.constant dense<21> : {u64t}"));
        w(format!("{name}_11 = stablehlo.constant dense<11> : {u64t}"));
        w(format!(
            "{name}_a = stablehlo.shift_left {hi}, {name}_21 : {u64t}"
        ));
        w(format!(
            "{name}_b = stablehlo.shift_right_logical {lo}, {name}_11 : {u64t}"
        ));
        w(format!(
            "{name}_bits = stablehlo.or {name}_a, {name}_b : {u64t}"
        ));
        let mut bits = format!("{name}_bits");
        if plus_one {
            w(format!("{name}_one = stablehlo.constant dense<1> : {u64t}"));
            w(format!(
                "{name}_bits1 = stablehlo.add {bits}, {name}_one : {u64t}"
            ));
            bits = format!("{name}_bits1");
        }
        w(format!(
            "{name}_f = stablehlo.convert {bits} : ({u64t}) -> {f64t}"
        ));
        w(format!(
            "{name}_scale = stablehlo.constant dense<1.1102230246251565e-16> : {f64t}"
        ));
        w(format!(
            "{name} = stablehlo.multiply {name}_f, {name}_scale : {f64t}"
        ));
    };
    match (distribution, out.dtype) {
        (RngDistribution::Uniform, DType::F64) => {
            bits53(w, &format!("{o}_u"), word(0), word(1), false);
            w(format!("{o} = stablehlo.reshape {o}_u : ({f64t}) -> {ot}"));
        }
        (RngDistribution::Uniform, d) => {
            let f32t = ty(&TensorType::new(DType::F32, dims));
            // Word j of each block: selected by comparisons with 0, 1, 2.
            let bt = shaped(dims, "i1");
            let mut pick = word(3);
            for k in (0..3).rev() {
                w(format!(
                    "{o}_jk{k} = stablehlo.constant dense<{k}> : {u64t}"
                ));
                w(format!(
                    "{o}_is{k} = stablehlo.compare EQ, {o}_j, {o}_jk{k}, UNSIGNED : ({u64t}, {u64t}) -> {bt}"
                ));
                w(format!(
                    "{o}_pick{k} = stablehlo.select {o}_is{k}, {}, {pick} : ({bt}, {u64t}, {u64t}) -> {u64t}",
                    word(k)
                ));
                pick = format!("{o}_pick{k}");
            }
            w(format!("{o}_8 = stablehlo.constant dense<8> : {u64t}"));
            w(format!(
                "{o}_top = stablehlo.shift_right_logical {pick}, {o}_8 : {u64t}"
            ));
            w(format!(
                "{o}_topf = stablehlo.convert {o}_top : ({u64t}) -> {f32t}"
            ));
            w(format!(
                "{o}_scale = stablehlo.constant dense<5.9604644775390625e-8> : {f32t}"
            ));
            w(format!(
                "{o}_u = stablehlo.multiply {o}_topf, {o}_scale : {f32t}"
            ));
            if d == DType::F32 {
                w(format!("{o} = stablehlo.reshape {o}_u : ({f32t}) -> {ot}"));
            } else {
                // Rounded once to the half type, kept below one.
                let below_one = if d == DType::F16 { "0x3BFF" } else { "0x3F7F" };
                w(format!(
                    "{o}_h = stablehlo.convert {o}_u : ({f32t}) -> {ot}"
                ));
                w(format!(
                    "{o}_max = stablehlo.constant dense<{below_one}> : {ot}"
                ));
                w(format!("{o} = stablehlo.minimum {o}_h, {o}_max : {ot}"));
            }
        }
        (RngDistribution::Normal, _) => {
            bits53(w, &format!("{o}_u1"), word(0), word(1), true);
            bits53(w, &format!("{o}_u2"), word(2), word(3), false);
            w(format!("{o}_ln = stablehlo.log {o}_u1 : {f64t}"));
            w(format!("{o}_m2 = stablehlo.constant dense<-2.0> : {f64t}"));
            w(format!(
                "{o}_r2 = stablehlo.multiply {o}_m2, {o}_ln : {f64t}"
            ));
            w(format!("{o}_rad = stablehlo.sqrt {o}_r2 : {f64t}"));
            w(format!(
                "{o}_tau = stablehlo.constant dense<6.283185307179586> : {f64t}"
            ));
            w(format!(
                "{o}_ang = stablehlo.multiply {o}_tau, {o}_u2 : {f64t}"
            ));
            w(format!("{o}_cos = stablehlo.cosine {o}_ang : {f64t}"));
            w(format!(
                "{o}_z = stablehlo.multiply {o}_rad, {o}_cos : {f64t}"
            ));
            w(format!("{o} = stablehlo.convert {o}_z : ({f64t}) -> {ot}"));
        }
    }
}

/// The half-precision values (bf16 or f16, both of one type) that a
/// product's two f32 operands are conversions of, if they are.
fn widened_halves(
    graph: &Graph,
    producer: &[Option<usize>],
    operands: &[ValueId],
) -> Option<[ValueId; 2]> {
    let source = |v: ValueId| -> Option<ValueId> {
        let node = &graph.nodes()[(*producer.get(v.0 as usize)?)?];
        match node.prim {
            Prim::Convert { to: DType::F32 } => Some(node.inputs[0]),
            _ => None,
        }
    };
    let (a, b) = (source(operands[0])?, source(operands[1])?);
    let d = graph.value_type(a).dtype;
    (matches!(d, DType::BF16 | DType::F16) && graph.value_type(b).dtype == d).then_some([a, b])
}

/// The module text for `graph`.
pub fn lower(graph: &Graph) -> Result<String> {
    lower_with_checks(graph).map(|(text, _)| text)
}

/// The module text for `graph`, and its index checks in the order of the
/// extra results.
pub fn lower_with_checks(graph: &Graph) -> Result<(String, Vec<IndexCheck>)> {
    lower_module(graph, &[])
}

/// As [`lower_with_checks`], for execution with outputs in place, each
/// where `slots` says (`tf.aliasing_output` on the parameter it names):
/// after the graph's parameters come the `Extra` ones, in output order.
/// The caller passes, donated, the buffer each aliased output is to be
/// written into.
pub fn lower_aliased(graph: &Graph, slots: &[OutputSlot]) -> Result<(String, Vec<IndexCheck>)> {
    let n_params = graph.params().len();
    let bad = slots.len() != graph.outputs().len()
        || slots.iter().enumerate().any(|(i, s)| match *s {
            OutputSlot::Param(p) => {
                p >= n_params
                    || graph.value_type(graph.params()[p]) != graph.value_type(graph.outputs()[i])
                    || slots[..i].contains(s)
            }
            _ => false,
        });
    if bad {
        return Err(Error::Internal(format!(
            "output slots {slots:?} for a graph of {n_params} parameters and {} outputs",
            graph.outputs().len()
        )));
    }
    lower_module(graph, slots)
}

/// Whether `update` reads the buffer of `target`, the operand an in-place
/// primitive writes: whether it depends on the value that buffer first
/// held, found through reshapes (bitcasts in XLA) and same-dtype converts.
fn reads_its_target(
    graph: &Graph,
    producer: &[Option<usize>],
    target: ValueId,
    update: ValueId,
) -> bool {
    let mut root = target;
    while let Some(k) = producer[root.0 as usize] {
        let n = &graph.nodes()[k];
        match &n.prim {
            Prim::Reshape { .. } => root = n.inputs[0],
            Prim::Convert { to } if graph.value_type(n.inputs[0]).dtype == *to => {
                root = n.inputs[0]
            }
            _ => break,
        }
    }
    let mut seen = vec![false; graph.num_values()];
    let mut stack = vec![update];
    while let Some(v) = stack.pop() {
        if v == root {
            return true;
        }
        if std::mem::replace(&mut seen[v.0 as usize], true) {
            continue;
        }
        if let Some(k) = producer[v.0 as usize] {
            stack.extend(graph.nodes()[k].inputs.iter().copied());
        }
    }
    false
}

fn lower_module(graph: &Graph, slots: &[OutputSlot]) -> Result<(String, Vec<IndexCheck>)> {
    // Composites (attention) become their primitives: XLA fuses those
    // itself, as it inlines a StableHLO composite's decomposition.
    let expanded = crate::ops::expand_composites(graph)?;
    let graph = &expanded;
    let name = |v: ValueId| format!("%v{}", v.0);
    let mut checks: Vec<IndexCheck> = Vec::new();
    let mut check_outs: Vec<String> = Vec::new();
    let t = |v: ValueId| ty(graph.value_type(v));
    let producer = graph.producers();
    let mut body = String::new();
    let mut w = |s: String| {
        let _ = writeln!(body, "    {s}");
    };
    for n in graph.nodes() {
        let out = n
            .outputs
            .first()
            .copied()
            .ok_or_else(|| Error::Internal("a node without results".into()))?;
        let o = name(out);
        let ot = t(out);
        let ins: Vec<String> = n.inputs.iter().map(|v| name(*v)).collect();
        let its: Vec<String> = n.inputs.iter().map(|v| t(*v)).collect();
        // Index operands XLA would clamp or drop: checked (module docs).
        let indexed = match &n.prim {
            Prim::Take { axis } => Some(("take", *axis)),
            Prim::Gather { axis } => Some(("gather", *axis)),
            Prim::Scatter { axis, .. } => Some(("scatter", *axis)),
            Prim::PivotsToPermutation { .. } => {
                Some(("pivots_to_permutation", graph.value_type(out).rank() - 1))
            }
            _ => None,
        };
        if let Some((prim, axis)) = indexed {
            // The index operand and the extent it indexes: a pivot indexes
            // the permutation's entries.
            let (at, bound) = match &n.prim {
                Prim::PivotsToPermutation { rows } => (0, *rows),
                _ => (
                    1,
                    graph
                        .value_type(n.inputs[0])
                        .dims
                        .get(axis)
                        .copied()
                        .unwrap_or(0),
                ),
            };
            let idims = graph.value_type(n.inputs[at]).dims.clone();
            if idims.iter().product::<u64>() > 0 {
                let c = index_check(&mut w, &o, &ins[at], &its[at], &idims, bound);
                check_outs.push(c);
                checks.push(IndexCheck {
                    prim: prim.into(),
                    axis,
                    bound,
                    index_dims: idims,
                });
            }
        }
        // A dynamic_update_slice whose update reads the buffer it writes
        // (module docs): the update placed into zeros, and a mask of where
        // it lands placed into falses (so both clamp their start as XLA
        // clamps it), selected over the target, which XLA computes as a
        // new value, not in place.
        if matches!(n.prim, Prim::DynamicUpdateSlice)
            && reads_its_target(graph, &producer, n.inputs[0], n.inputs[1])
        {
            let target = graph.value_type(n.inputs[0]);
            let update = graph.value_type(n.inputs[1]);
            let starts = ins[2..].join(", ");
            let start_types = its[2..].join(", ");
            zeros(&mut w, &format!("{o}_zeros"), target.dtype, &ot);
            w(format!(
                "{o}_placed = \"stablehlo.dynamic_update_slice\"({o}_zeros, {}, {starts}) : ({ot}, {}, {start_types}) -> {ot}",
                ins[1], its[1]
            ));
            let (mask_t, on_t) = (shaped(&target.dims, "i1"), shaped(&update.dims, "i1"));
            zeros(&mut w, &format!("{o}_off"), DType::Bool, &mask_t);
            splat(&mut w, &format!("{o}_on"), "true", DType::Bool, &on_t);
            w(format!(
                "{o}_mask = \"stablehlo.dynamic_update_slice\"({o}_off, {o}_on, {starts}) : ({mask_t}, {on_t}, {start_types}) -> {mask_t}"
            ));
            w(format!(
                "{o} = stablehlo.select {o}_mask, {o}_placed, {} : {mask_t}, {ot}",
                ins[0]
            ));
            continue;
        }
        match &n.prim {
            Prim::Constant { dtype, dims, bytes } => {
                w(format!("{o} = stablehlo.constant dense<{}> : {ot}", constant_literal(*dtype, dims, bytes)));
            }
            Prim::Iota { dimension, .. } => w(format!("{o} = stablehlo.iota dim = {dimension} : {ot}")),
            Prim::Unary(UnaryOp::IsFinite) => {
                w(format!("{o} = stablehlo.is_finite {} : ({}) -> {ot}", ins[0], its[0]));
            }
            // A transcendental function of bf16 or f16 at f32, rounded
            // once, as torch computes it (XLA's own f16 logistic differed
            // from torch's in a third of the elements).
            Prim::Unary(op)
                if widened_unary(*op) && matches!(graph.value_type(out).dtype, DType::BF16 | DType::F16) =>
            {
                let wide = shaped(&graph.value_type(out).dims, "f32");
                w(format!("{o}_in = stablehlo.convert {} : ({}) -> {wide}", ins[0], its[0]));
                if *op == UnaryOp::Erf {
                    w(format!("{o}_f32 = \"chlo.erf\"({o}_in) : ({wide}) -> {wide}"));
                } else {
                    let name = unary_name(*op).unwrap_or("stablehlo.abs");
                    w(format!("{o}_f32 = {name} {o}_in : {wide}"));
                }
                w(format!("{o} = stablehlo.convert {o}_f32 : ({wide}) -> {ot}"));
            }
            Prim::Unary(UnaryOp::Erf) => {
                // chlo has no short form here: the generic one.
                w(format!("{o} = \"chlo.erf\"({}) : ({}) -> {ot}", ins[0], its[0]));
            }
            // StableHLO's abs and sign take signed integers only: an
            // unsigned one is its own absolute value, and its sign is
            // whether it is not 0 (torch.abs and torch.sign of a uint8
            // tensor failed to compile).
            Prim::Unary(UnaryOp::Abs) if graph.value_type(out).dtype == DType::U8 => {
                w(format!("{o} = stablehlo.reshape {} : ({ot}) -> {ot}", ins[0]));
            }
            Prim::Unary(UnaryOp::Sign) if graph.value_type(out).dtype == DType::U8 => {
                let mask = shaped(&graph.value_type(out).dims, "i1");
                zeros(&mut w, &format!("{o}_z"), DType::U8, &ot);
                w(format!(
                    "{o}_nz = stablehlo.compare NE, {}, {o}_z, UNSIGNED : ({ot}, {ot}) -> {mask}",
                    ins[0]
                ));
                w(format!("{o} = stablehlo.convert {o}_nz : ({mask}) -> {ot}"));
            }
            Prim::Unary(op) => {
                let op = unary_name(*op).unwrap_or("stablehlo.abs");
                w(format!("{o} = {op} {} : {ot}", ins[0]));
            }
            // Float max and min propagate NaN from either side, as torch
            // and the host do: the XLA CPU plugin's maximum(0, NaN) gave 0
            // (while maximum(NaN, 0) gave NaN). Where an operand is a
            // constant (relu's 0), XLA folds its compare away.
            Prim::Binary(op @ (BinaryOp::Max | BinaryOp::Min)) if graph.value_type(out).dtype.is_float() => {
                let mask = shaped(&graph.value_type(out).dims, "i1");
                let tmp = format!("{o}_");
                for line in nan_propagating(binary_name(*op), &ins[0], &ins[1], &ot, &mask, &tmp, &o) {
                    w(line);
                }
            }
            Prim::Binary(op) => w(format!("{o} = {} {}, {} : {ot}", binary_name(*op), ins[0], ins[1])),
            Prim::Compare(op) => {
                let dir = match op {
                    CompareOp::Eq => "EQ",
                    CompareOp::Ne => "NE",
                    CompareOp::Lt => "LT",
                    CompareOp::Le => "LE",
                    CompareOp::Gt => "GT",
                    CompareOp::Ge => "GE",
                };
                let d = graph.value_type(n.inputs[0]).dtype;
                let kind = compare_kind(d);
                w(format!(
                    "{o} = stablehlo.compare {dir}, {}, {}, {kind} : ({}, {}) -> {ot}",
                    ins[0], ins[1], its[0], its[1]
                ));
            }
            Prim::Select => w(format!(
                "{o} = stablehlo.select {}, {}, {} : ({}, {}, {}) -> {ot}",
                ins[0], ins[1], ins[2], its[0], its[1], its[2]
            )),
            Prim::Clamp => w(format!(
                "{o} = stablehlo.clamp {}, {}, {} : ({}, {}, {}) -> {ot}",
                ins[0], ins[1], ins[2], its[0], its[1], its[2]
            )),
            Prim::Convert { .. } => w(format!("{o} = stablehlo.convert {} : ({}) -> {ot}", ins[0], its[0])),
            Prim::BitcastConvert { .. } => w(format!(
                "{o} = stablehlo.bitcast_convert {} : ({}) -> {ot}",
                ins[0], its[0]
            )),
            Prim::BroadcastInDim { mapping, .. } => w(format!(
                "{o} = stablehlo.broadcast_in_dim {}, dims = [{}] : ({}) -> {ot}",
                ins[0],
                list(mapping),
                its[0]
            )),
            Prim::Reshape { .. } => w(format!("{o} = stablehlo.reshape {} : ({}) -> {ot}", ins[0], its[0])),
            Prim::Transpose { perm } => w(format!(
                "{o} = stablehlo.transpose {}, dims = [{}] : ({}) -> {ot}",
                ins[0],
                list(perm),
                its[0]
            )),
            Prim::Slice { start, limit, stride } => w(format!(
                "{o} = \"stablehlo.slice\"({}) {{start_indices = array<i64: {}>, limit_indices = array<i64: {}>, strides = array<i64: {}>}} : ({}) -> {ot}",
                ins[0],
                nums(start),
                nums(limit),
                nums(stride),
                its[0]
            )),
            Prim::Pad { low, high, interior } => w(format!(
                "{o} = \"stablehlo.pad\"({}, {}) {{edge_padding_low = array<i64: {}>, edge_padding_high = array<i64: {}>, interior_padding = array<i64: {}>}} : ({}, {}) -> {ot}",
                ins[0],
                ins[1],
                nums(low),
                nums(high),
                nums(interior),
                its[0],
                its[1]
            )),
            Prim::Concatenate { dimension } => w(format!(
                "{o} = \"stablehlo.concatenate\"({}) {{dimension = {dimension} : i64}} : ({}) -> {ot}",
                ins.join(", "),
                its.join(", ")
            )),
            Prim::Reverse { dimensions } => w(format!(
                "{o} = \"stablehlo.reverse\"({}) {{dimensions = array<i64: {}>}} : ({}) -> {ot}",
                ins[0],
                list(dimensions),
                its[0]
            )),
            Prim::DynamicSlice { sizes } => w(format!(
                "{o} = \"stablehlo.dynamic_slice\"({}) {{slice_sizes = array<i64: {}>}} : ({}) -> {ot}",
                ins.join(", "),
                nums(sizes),
                its.join(", ")
            )),
            Prim::DynamicUpdateSlice => w(format!(
                "{o} = \"stablehlo.dynamic_update_slice\"({}) : ({}) -> {ot}",
                ins.join(", "),
                its.join(", ")
            )),
            Prim::Take { axis } => {
                // x[..axis] ++ index dims ++ x[axis+1..]: one gather whose
                // batch dims are the index's, each index a scalar into `axis`.
                let xt = graph.value_type(n.inputs[0]);
                if graph.value_type(out).numel() == 0 {
                    // Nothing to read (XLA rejects a slice of 1 along an
                    // empty axis, as for gather).
                    zeros(&mut w, &o, xt.dtype, &ot);
                    continue;
                }
                let k = graph.value_type(n.inputs[1]).rank();
                let r = xt.rank();
                let offset: Vec<usize> = (0..*axis).chain(axis + k..k + r - 1).collect();
                let mut sizes = xt.dims.clone();
                sizes[*axis] = 1;
                w(format!(
                    "{o} = \"stablehlo.gather\"({}, {}) {{dimension_numbers = #stablehlo.gather<offset_dims = [{}], collapsed_slice_dims = [{axis}], start_index_map = [{axis}], index_vector_dim = {k}>, slice_sizes = array<i64: {}>, indices_are_sorted = false}} : ({}, {}) -> {ot}",
                    ins[0],
                    ins[1],
                    list(&offset),
                    nums(&sizes),
                    its[0],
                    its[1]
                ));
            }
            Prim::Gather { axis } => {
                // One gather of single elements at full index vectors.
                let xt = graph.value_type(n.inputs[0]);
                let r = xt.rank();
                if graph.value_type(out).numel() == 0 {
                    // Nothing to read (XLA rejects slices of an empty operand).
                    zeros(&mut w, &o, xt.dtype, &ot);
                    continue;
                }
                let idims = graph.value_type(n.inputs[1]).dims.clone();
                let (full, ft) = full_indices(&mut w, &o, &ins[1], &its[1], &idims, *axis, r);
                let all: Vec<usize> = (0..r).collect();
                w(format!(
                    "{o} = \"stablehlo.gather\"({}, {full}) {{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [{}], start_index_map = [{}], index_vector_dim = {r}>, slice_sizes = array<i64: {}>, indices_are_sorted = false}} : ({}, {ft}) -> {ot}",
                    ins[0],
                    list(&all),
                    list(&all),
                    nums(&vec![1u64; r]),
                    its[0]
                ));
            }
            Prim::Scatter { axis, combiner } => {
                // One scatter of single elements at full index vectors.
                let d = graph.value_type(n.inputs[0]).dtype;
                let r = graph.value_type(n.inputs[0]).rank();
                let st = ty(&TensorType::scalar(d));
                if graph.value_type(n.inputs[0]).numel() == 0 || graph.value_type(n.inputs[1]).numel() == 0 {
                    // Nothing is written: x itself.
                    w(format!("{o} = stablehlo.reshape {} : ({}) -> {ot}", ins[0], its[0]));
                    continue;
                }
                let idims = graph.value_type(n.inputs[1]).dims.clone();
                let (full, ft) = full_indices(&mut w, &o, &ins[1], &its[1], &idims, *axis, r);
                let all: Vec<usize> = (0..r).collect();
                let combine = match combiner {
                    ScatterCombiner::Replace => None,
                    ScatterCombiner::Add if d == DType::Bool => Some("stablehlo.or"),
                    ScatterCombiner::Mul if d == DType::Bool => Some("stablehlo.and"),
                    ScatterCombiner::Add => Some("stablehlo.add"),
                    ScatterCombiner::Mul => Some("stablehlo.multiply"),
                    ScatterCombiner::Max => Some("stablehlo.maximum"),
                    ScatterCombiner::Min => Some("stablehlo.minimum"),
                };
                // Sums and products of bf16 or f16 at f32, rounded once, as
                // torch's CPU kernels and the host platform compute them
                // (XLA's per-update rounding made a bf16 index_add with
                // repeated rows differ from torch's in 113 of 128 elements).
                let widen = matches!(d, DType::BF16 | DType::F16)
                    && matches!(combiner, ScatterCombiner::Add | ScatterCombiner::Mul);
                let (x, xt, u, ut, res, rt, st) = if widen {
                    let x_dims = &graph.value_type(n.inputs[0]).dims;
                    let (wx, wu) = (shaped(x_dims, "f32"), shaped(&idims, "f32"));
                    w(format!("{o}_x = stablehlo.convert {} : ({}) -> {wx}", ins[0], its[0]));
                    w(format!("{o}_u = stablehlo.convert {} : ({}) -> {wu}", ins[2], its[2]));
                    let st = ty(&TensorType::scalar(DType::F32));
                    (format!("{o}_x"), wx.clone(), format!("{o}_u"), wu, format!("{o}_f32"), wx, st)
                } else {
                    (ins[0].clone(), its[0].clone(), ins[2].clone(), its[2].clone(), o.clone(), ot.clone(), st)
                };
                let body = match combine {
                    None => "stablehlo.return %b".to_string(),
                    Some(op) => format!("%r = {op} %a, %b : {st}\n        stablehlo.return %r"),
                };
                w(format!(
                    "{res} = \"stablehlo.scatter\"({x}, {full}, {u}) ({{\n      ^bb0(%a: {st}, %b: {st}):\n        {body} : {st}\n    }}) {{scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [{}], scatter_dims_to_operand_dims = [{}], index_vector_dim = {r}>, indices_are_sorted = false, unique_indices = false}} : ({xt}, {ft}, {ut}) -> {rt}",
                    list(&all),
                    list(&all),
                ));
                if widen {
                    w(format!("{o} = stablehlo.convert {res} : ({rt}) -> {ot}"));
                }
            }
            Prim::Convolution {
                stride,
                padding,
                dilation,
                groups,
                precision,
            } => {
                // torch's cross-correlation: NC<spatial> input, OI<spatial>
                // weight, NC<spatial> result.
                let xt = graph.value_type(n.inputs[0]);
                let wt = graph.value_type(n.inputs[1]);
                if xt.numel() == 0 || wt.numel() == 0 {
                    // No terms to sum: zeros (XLA rejects empty windows).
                    zeros(&mut w, &o, xt.dtype, &ot);
                    continue;
                }
                let sp: Vec<String> = (0..xt.rank() - 2).map(|i| i.to_string()).collect();
                let sp = sp.join(", ");
                let pads: Vec<String> = padding.iter().map(|(lo, hi)| format!("[{lo}, {hi}]")).collect();
                let precision = product_precision(xt.dtype, *precision).map_or(String::new(), |p| {
                    format!(", precision_config = [#stablehlo<precision {p}>, #stablehlo<precision {p}>]")
                });
                w(format!(
                    "{o} = \"stablehlo.convolution\"({}, {}) {{batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, f, {sp}]x[o, i, {sp}]->[b, f, {sp}]>, feature_group_count = {groups} : i64, lhs_dilation = array<i64: {}>, padding = dense<[{}]> : tensor<{}x2xi64>{precision}, rhs_dilation = array<i64: {}>, window_strides = array<i64: {}>}} : ({}, {}) -> {ot}",
                    ins[0],
                    ins[1],
                    nums(&vec![1u64; padding.len()]),
                    pads.join(", "),
                    padding.len(),
                    nums(dilation),
                    nums(stride),
                    its[0],
                    its[1]
                ));
            }
            Prim::Rng { distribution, dtype, .. } => {
                if !dtype.is_float() {
                    return Err(Error::invalid(format!("rng draws floating-point numbers, not {dtype}")));
                }
                let out_ty = graph.value_type(out);
                if out_ty.numel() == 0 {
                    zeros(&mut w, &o, *dtype, &ot);
                } else {
                    philox(&mut w, &o, &ins[0], &ins[1], *distribution, out_ty);
                }
            }
            Prim::ArgReduce { max, dimension } => {
                // A two-operand reduce over (value, index): keeps the first
                // max (min); NaN counts as the max (and the min), as torch.
                let xt = graph.value_type(n.inputs[0]);
                let d = xt.dtype;
                let st = ty(&TensorType::scalar(d));
                let it = ty(&TensorType::new(DType::I64, &xt.dims));
                let ist = "tensor<i64>";
                let bt = "tensor<i1>";
                let kind = compare_kind(d);
                let init = if d.is_float() {
                    float_inf(d, *max).to_string()
                } else {
                    identity(if *max { ReduceOp::Max } else { ReduceOp::Min }, d)
                };
                let better = if *max { "GT" } else { "LT" };
                let mut red_dims = xt.dims.clone();
                red_dims.remove(*dimension);
                let vt = ty(&TensorType::new(d, &red_dims));
                w(format!("{o}_iota = stablehlo.iota dim = {dimension} : {it}"));
                w(format!("{o}_v0 = stablehlo.constant dense<{init}> : {st}"));
                w(format!("{o}_i0 = stablehlo.constant dense<0> : {ist}"));
                w(format!(
                    "{o}_r:2 = \"stablehlo.reduce\"({}, {o}_iota, {o}_v0, {o}_i0) ({{\n      ^bb0(%av: {st}, %ai: {ist}, %bv: {st}, %bi: {ist}):\n        %an = stablehlo.compare NE, %av, %av, {kind} : ({st}, {st}) -> {bt}\n        %bn = stablehlo.compare NE, %bv, %bv, {kind} : ({st}, {st}) -> {bt}\n        %gt = stablehlo.compare {better}, %bv, %av, {kind} : ({st}, {st}) -> {bt}\n        %eq = stablehlo.compare EQ, %bv, %av, {kind} : ({st}, {st}) -> {bt}\n        %lo = stablehlo.compare LT, %bi, %ai, SIGNED : ({ist}, {ist}) -> {bt}\n        %tie = stablehlo.and %eq, %lo : {bt}\n        %win = stablehlo.or %gt, %tie : {bt}\n        %nan_tie = stablehlo.and %an, %bn : {bt}\n        %nan_first = stablehlo.and %nan_tie, %lo : {bt}\n        %not_an = stablehlo.not %an : {bt}\n        %b_nan_wins = stablehlo.and %bn, %not_an : {bt}\n        %not_bn = stablehlo.not %bn : {bt}\n        %neither = stablehlo.and %not_an, %not_bn : {bt}\n        %plain = stablehlo.and %neither, %win : {bt}\n        %t1 = stablehlo.or %b_nan_wins, %plain : {bt}\n        %take = stablehlo.or %t1, %nan_first : {bt}\n        %v = stablehlo.select %take, %bv, %av : ({bt}, {st}, {st}) -> {st}\n        %i = stablehlo.select %take, %bi, %ai : ({bt}, {ist}, {ist}) -> {ist}\n        stablehlo.return %v, %i : {st}, {ist}\n    }}) {{dimensions = array<i64: {dimension}>}} : ({}, {it}, {st}, {ist}) -> ({vt}, {ot})",
                    ins[0], its[0]
                ));
                // Name the index result as the node's value.
                w(format!("{o} = stablehlo.reshape {o}_r#1 : ({ot}) -> {ot}"));
            }
            Prim::TriangularSolve {
                left_side,
                lower,
                unit_diagonal,
                transpose_a,
            } => {
                if graph.value_type(n.inputs[1]).numel() == 0 {
                    // Nothing to solve: the empty right-hand side.
                    w(format!("{o} = stablehlo.reshape {} : ({}) -> {ot}", ins[1], its[1]));
                    continue;
                }
                let transpose = if *transpose_a { "TRANSPOSE" } else { "NO_TRANSPOSE" };
                w(format!(
                    "{o} = \"stablehlo.triangular_solve\"({}, {}) {{left_side = {left_side}, lower = {lower}, unit_diagonal = {unit_diagonal}, transpose_a = #stablehlo<transpose {transpose}>}} : ({}, {}) -> {ot}",
                    ins[0], ins[1], its[0], its[1]
                ));
            }
            Prim::Cholesky => {
                let xt = graph.value_type(n.inputs[0]);
                factor::cholesky(&mut w, &ins[0], &its[0], &xt.dims, xt.dtype, &o, &ot);
            }
            Prim::LuFactor => {
                let xt = graph.value_type(n.inputs[0]);
                let (p, q) = (name(n.outputs[1]), name(n.outputs[2]));
                let (pt, qt) = (t(n.outputs[1]), t(n.outputs[2]));
                factor::lu_factor(&mut w, &ins[0], &its[0], &xt.dims, xt.dtype, [&o, &p, &q], [&ot, &pt, &qt]);
            }
            Prim::HouseholderQr => {
                let xt = graph.value_type(n.inputs[0]);
                let tau = name(n.outputs[1]);
                let tt = t(n.outputs[1]);
                householder::householder_qr(&mut w, &ins[0], &its[0], &xt.dims, xt.dtype, [&o, &tau], [&ot, &tt]);
            }
            Prim::Jacobi { two_sided } => {
                let xt = graph.value_type(n.inputs[0]);
                let v = name(n.outputs[1]);
                let vt = t(n.outputs[1]);
                jacobi::jacobi(&mut w, &ins[0], &its[0], &xt.dims, xt.dtype, *two_sided, [&o, &v], [&ot, &vt]);
            }
            Prim::HouseholderProduct => {
                let xt = graph.value_type(n.inputs[0]);
                let k = *graph.value_type(n.inputs[1]).dims.last().unwrap_or(&0);
                householder::householder_product(&mut w, &ins[0], &its[0], &xt.dims, xt.dtype, &ins[1], &its[1], k, &o, &ot);
            }
            Prim::PivotsToPermutation { rows } => {
                let dims = &graph.value_type(n.inputs[0]).dims;
                factor::pivots_to_permutation(&mut w, &ins[0], &its[0], dims, *rows, &o, &ot);
            }
            Prim::Attention { .. } | Prim::AttentionBackward { .. } => {
                return Err(Error::Internal(format!(
                    "{} is a composite, expanded before lowering",
                    n.prim.name()
                )));
            }
            Prim::Sort { dimension, descending, .. } => {
                // Values and an iota of positions sorted together, always
                // stable; NaN above every number (last ascending, first
                // descending), as torch and the host platform.
                let xt = graph.value_type(n.inputs[0]);
                let d = xt.dtype;
                let st = ty(&TensorType::scalar(d));
                let it = ty(&TensorType::new(DType::I64, &xt.dims));
                let ist = "tensor<i64>";
                let bt = "tensor<i1>";
                let kind = compare_kind(d);
                let second = n
                    .outputs
                    .get(1)
                    .map(|v| name(*v))
                    .ok_or_else(|| Error::Internal("sort without its index result".into()))?;
                // a before b: a NaN-free ordering in the wanted direction,
                // or (descending) a NaN before a number, (ascending) a number
                // before a NaN.
                let (dir, nan_side) = if *descending {
                    ("GT", "%an, %not_bn")
                } else {
                    ("LT", "%not_an, %bn")
                };
                w(format!("{o}_iota = stablehlo.iota dim = {dimension} : {it}"));
                w(format!(
                    "{o}, {second} = \"stablehlo.sort\"({}, {o}_iota) ({{\n      ^bb0(%a: {st}, %b: {st}, %ai: {ist}, %bi: {ist}):\n        %an = stablehlo.compare NE, %a, %a, {kind} : ({st}, {st}) -> {bt}\n        %bn = stablehlo.compare NE, %b, %b, {kind} : ({st}, {st}) -> {bt}\n        %not_an = stablehlo.not %an : {bt}\n        %not_bn = stablehlo.not %bn : {bt}\n        %ord = stablehlo.compare {dir}, %a, %b, {kind} : ({st}, {st}) -> {bt}\n        %nan = stablehlo.and {nan_side} : {bt}\n        %before = stablehlo.or %ord, %nan : {bt}\n        stablehlo.return %before : {bt}\n    }}) {{dimension = {dimension} : i64, is_stable = true}} : ({}, {it}) -> ({ot}, {it})",
                    ins[0], its[0]
                ));
            }
            Prim::Cumulative { op, dimension, reverse } => {
                // A window as long as the dimension, padded on one side.
                let xt = graph.value_type(n.inputs[0]);
                let d = xt.dtype;
                let st = ty(&TensorType::scalar(d));
                let len = xt.dims[*dimension];
                if len == 0 {
                    // Nothing to accumulate (and XLA wants windows of 1 or more).
                    w(format!("{o} = stablehlo.reshape {} : ({}) -> {ot}", ins[0], its[0]));
                    continue;
                }
                let windows: Vec<u64> = (0..xt.rank()).map(|i| if i == *dimension { len } else { 1 }).collect();
                let strides = vec![1u64; xt.rank()];
                let pads: Vec<String> = (0..xt.rank())
                    .map(|i| {
                        let p = if i == *dimension { len.saturating_sub(1) } else { 0 };
                        if *reverse { format!("[0, {p}]") } else { format!("[{p}, 0]") }
                    })
                    .collect();
                let init = match (op, d.is_float()) {
                    (ReduceOp::Max, true) => float_inf(d, true).to_string(),
                    (ReduceOp::Min, true) => float_inf(d, false).to_string(),
                    _ => identity(*op, d),
                };
                w(format!("{o}_init = stablehlo.constant dense<{init}> : {st}"));
                w(format!(
                    "{o} = \"stablehlo.reduce_window\"({}, {o}_init) ({{\n      ^bb0(%a: {st}, %b: {st}):\n        {}\n        stablehlo.return %r : {st}\n    }}) {{window_dimensions = array<i64: {}>, window_strides = array<i64: {}>, padding = dense<[{}]> : tensor<{}x2xi64>}} : ({}, {st}) -> {ot}",
                    ins[0],
                    reduce_region(*op, d, &st),
                    nums(&windows),
                    nums(&strides),
                    pads.join(", "),
                    xt.rank(),
                    its[0]
                ));
            }
            Prim::Reduce { op, dimensions } => {
                let d = graph.value_type(n.inputs[0]).dtype;
                let st = ty(&TensorType::scalar(d));
                let init = format!("{o}_init");
                let lit = match (op, d.is_float()) {
                    (ReduceOp::Max, true) => float_inf(d, true).to_string(),
                    (ReduceOp::Min, true) => float_inf(d, false).to_string(),
                    _ => identity(*op, d),
                };
                w(format!("{init} = stablehlo.constant dense<{lit}> : {st}"));
                w(format!(
                    "{o} = \"stablehlo.reduce\"({}, {init}) ({{\n      ^bb0(%a: {st}, %b: {st}):\n        {}\n        stablehlo.return %r : {st}\n    }}) {{dimensions = array<i64: {}>}} : ({}, {st}) -> {ot}",
                    ins[0],
                    reduce_region(*op, d, &st),
                    list(dimensions),
                    its[0]
                ));
            }
            Prim::DotGeneral {
                lhs_batch,
                rhs_batch,
                lhs_contract,
                rhs_contract,
                precision,
            } => {
                // An f32 product of two half-precision values widened to
                // f32 (the op library's addmm and linear in bf16 and f16,
                // rounded once after the bias): the half operands
                // themselves with an f32 result, which is the same
                // product (each half product is exact in f32, the sums
                // are f32 either way) and keeps a TPU's or a GPU's half
                // matrix units, where f32 operands at HIGHEST would not.
                let widened = widened_halves(graph, &producer, &n.inputs);
                let (ins, its) = match widened {
                    Some(halves) => (
                        halves.iter().map(|v| name(*v)).collect::<Vec<_>>(),
                        halves.iter().map(|v| t(*v)).collect::<Vec<_>>(),
                    ),
                    None => (ins, its),
                };
                let first = graph.value_type(n.inputs[0]).dtype;
                let precision = match product_precision(first, *precision) {
                    Some(p) if widened.is_none() => format!(", precision = [{p}, {p}]"),
                    _ => String::new(),
                };
                w(format!(
                    "{o} = stablehlo.dot_general {}, {}, batching_dims = [{}] x [{}], contracting_dims = [{}] x [{}]{precision} : ({}, {}) -> {ot}",
                    ins[0],
                    ins[1],
                    list(lhs_batch),
                    list(rhs_batch),
                    list(lhs_contract),
                    list(rhs_contract),
                    its[0],
                    its[1]
                ))
            }
        }
    }
    let stored_over = |p: usize| slots.iter().position(|s| *s == OutputSlot::Param(p));
    let mut params: Vec<String> = graph
        .params()
        .iter()
        .enumerate()
        .map(|(k, p)| match stored_over(k) {
            Some(i) => format!("{}: {} {{tf.aliasing_output = {i} : i32}}", name(*p), t(*p)),
            None => format!("{}: {}", name(*p), t(*p)),
        })
        .collect();
    for ((i, v), _) in graph
        .outputs()
        .iter()
        .enumerate()
        .zip(slots)
        .filter(|(_, s)| **s == OutputSlot::Extra)
    {
        params.push(format!(
            "%out{i}: {} {{tf.aliasing_output = {i} : i32}}",
            t(*v)
        ));
    }
    let mut outs: Vec<String> = graph.outputs().iter().map(|v| name(*v)).collect();
    let mut out_types: Vec<String> = graph.outputs().iter().map(|v| t(*v)).collect();
    for c in check_outs {
        outs.push(c);
        out_types.push(ty(&TensorType::new(DType::I64, &[2])));
    }
    let mut m = String::new();
    let _ = writeln!(m, "module @tpurt {{");
    let _ = writeln!(
        m,
        "  func.func public @main({}) -> ({}) {{",
        params.join(", "),
        out_types.join(", ")
    );
    m.push_str(&body);
    let _ = writeln!(
        m,
        "    return {} : {}",
        outs.join(", "),
        out_types.join(", ")
    );
    let _ = writeln!(m, "  }}");
    let _ = writeln!(m, "}}");
    // An empty dense i64 array is spelled `array<i64>` in MLIR; the emitters
    // above write `array<i64: {list}>`, which an empty list (a reduction of
    // a 0-d tensor over no dimensions, say) would leave unparsable.
    Ok((m.replace("array<i64: >", "array<i64>"), checks))
}

/// `module` (text from [`lower_module`]) with every operation located
/// nowhere (`loc(unknown)`), the form compiled. MLIR gives each operation
/// parsed from text its line and column, and XLA keeps them as every HLO
/// instruction's metadata, in the executable and in its serialized form:
/// the blob of ANCHORS' block (a) went from 43,323 to 39,841 bytes without
/// them, and `PJRT_Executable_DeserializeAndLoad`, which rebuilds the
/// module from that proto three times over, about 10-20% faster (a warm
/// start from the disk cache). An operation ends on a line that starts
/// with a value, `stablehlo.`, `return` or the `})` closing its regions,
/// and does not itself open a region.
pub fn without_locations(module: &str) -> String {
    let mut out = String::with_capacity(module.len() + module.len() / 4);
    out.push_str("#unknown = loc(unknown)\n");
    for line in module.lines() {
        let t = line.trim_start();
        let ends_op = ["%", "stablehlo.", "return ", "})"]
            .iter()
            .any(|p| t.starts_with(p))
            && !t.ends_with('{')
            && !t.ends_with('(');
        out.push_str(line);
        if ends_op {
            out.push_str(" loc(#unknown)");
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{self, Attr, Attrs};

    fn op(name: &str, types: &[TensorType], attrs: Attrs) -> Graph {
        ops::build_graph(ops::lookup(name).unwrap(), types, &attrs).unwrap()
    }

    /// Scalar constants print exactly: i64 past 2^53 and at its extremes.
    #[test]
    fn scalar_constants_are_exact() {
        for v in [(1i64 << 60) + 1, i64::MIN, i64::MAX, -3] {
            assert_eq!(
                constant_literal(DType::I64, &[], &v.to_le_bytes()),
                v.to_string()
            );
        }
        assert_eq!(
            constant_literal(DType::I32, &[1], &(-7i32).to_le_bytes()),
            "-7"
        );
    }

    /// A dynamic_update_slice whose update reads its own target (through
    /// a reshape) becomes a select; one whose update comes from elsewhere
    /// (a KV cache's new rows) stays an update in place.
    #[test]
    fn an_update_that_reads_its_target_is_selected_over_it() {
        use crate::ir::GraphBuilder;
        let f = |d: &[u64]| TensorType::new(DType::F32, d);
        let build = |own: bool| {
            let mut b = GraphBuilder::new();
            let x = b.param(f(&[4, 4]));
            let other = b.param(f(&[4]));
            let a = b.unary(UnaryOp::Exp, x).unwrap();
            let flat = b.op(Prim::Reshape { dims: vec![16] }, &[a]).unwrap();
            let update = if own {
                let row = b
                    .op(
                        Prim::Slice {
                            start: vec![0],
                            limit: vec![4],
                            stride: vec![1],
                        },
                        &[flat],
                    )
                    .unwrap();
                b.binary(BinaryOp::Add, row, other).unwrap()
            } else {
                b.unary(UnaryOp::Neg, other).unwrap()
            };
            let at = b.scalar(DType::I64, 0.0).unwrap();
            let out = b.op(Prim::DynamicUpdateSlice, &[flat, update, at]).unwrap();
            b.build(&[out]).unwrap()
        };
        assert!(lower(&build(true)).unwrap().contains("stablehlo.select"));
        assert!(!lower(&build(false)).unwrap().contains("stablehlo.select"));
    }

    /// The factorization is one while loop, not a step per row: the module
    /// for a 256 x 256 inverse is as long as a 4 x 4's (bar the digits).
    #[test]
    fn lu_is_a_loop_whatever_the_size() {
        let inv = |n: u64| {
            let g = op(
                "linalg_inv",
                &[TensorType::new(DType::F32, &[n, n])],
                Attrs::new(),
            );
            lower(&g).unwrap()
        };
        let (small, large) = (inv(4), inv(256));
        assert_eq!(small.matches("stablehlo.while").count(), 1, "{small}");
        assert_eq!(small.lines().count(), large.lines().count());
        assert!(large.len() < small.len() + small.len() / 4);
        assert!(small.contains("stablehlo.triangular_solve"));
    }

    /// QR and its Q are a loop each: a 200 x 100 factorization's module is
    /// as long as a 6 x 3's.
    #[test]
    fn qr_is_two_loops_whatever_the_size() {
        let qr = |m: u64, n: u64| {
            let g = op(
                "linalg_qr",
                &[TensorType::new(DType::F64, &[m, n])],
                Attrs::new(),
            );
            lower(&g).unwrap()
        };
        let (small, large) = (qr(6, 3), qr(200, 100));
        assert_eq!(small.matches("stablehlo.while").count(), 2, "{small}");
        assert_eq!(small.lines().count(), large.lines().count());
    }

    /// The SVD is three loops (Jacobi's rounds, QR, its Q) whatever the
    /// size; eigh one.
    #[test]
    fn svd_and_eigh_are_loops_whatever_the_size() {
        let graph = |op_name: &str, dims: &[u64]| {
            let g = op(op_name, &[TensorType::new(DType::F32, dims)], Attrs::new());
            lower(&g).unwrap()
        };
        let (small, large) = (
            graph("linalg_svd", &[6, 3]),
            graph("linalg_svd", &[200, 101]),
        );
        assert_eq!(small.matches("stablehlo.while").count(), 3, "{small}");
        assert_eq!(small.lines().count(), large.lines().count());
        let (small, large) = (
            graph("linalg_eigh", &[5, 5]),
            graph("linalg_eigh", &[129, 129]),
        );
        assert_eq!(small.matches("stablehlo.while").count(), 1, "{small}");
        assert_eq!(small.lines().count(), large.lines().count());
    }

    /// A bf16 or f16 transcendental function is computed at f32 and
    /// rounded once (torch's way); exact ones and f32 stay as they are.
    #[test]
    fn half_precision_functions_run_at_f32() {
        for dt in [DType::BF16, DType::F16] {
            let sig = lower(&op("sigmoid", &[TensorType::new(dt, &[4])], Attrs::new())).unwrap();
            assert!(
                sig.contains("stablehlo.logistic %v1_in : tensor<4xf32>"),
                "{sig}"
            );
            let abs = lower(&op("abs", &[TensorType::new(dt, &[4])], Attrs::new())).unwrap();
            assert!(!abs.contains("f32"), "{abs}");
        }
        let f = lower(&op(
            "exp",
            &[TensorType::new(DType::F32, &[4])],
            Attrs::new(),
        ))
        .unwrap();
        assert!(!f.contains("_in"), "{f}");
    }

    /// f32 products carry the caller's precision to XLA (a TPU takes bf16
    /// passes for DEFAULT and HIGH); bf16 products carry none.
    #[test]
    fn products_carry_their_precision() {
        let f = |dt: DType, d: &[u64]| TensorType::new(dt, d);
        for (p, want) in [
            (Precision::Default, "DEFAULT"),
            (Precision::High, "HIGH"),
            (Precision::Highest, "HIGHEST"),
        ] {
            for (name, types, attrs) in [
                (
                    "mm",
                    vec![f(DType::F32, &[4, 8]), f(DType::F32, &[8, 3])],
                    Attrs::new(),
                ),
                (
                    "conv2d",
                    vec![f(DType::F32, &[1, 2, 5, 5]), f(DType::F32, &[3, 2, 3, 3])],
                    Attrs::new(),
                ),
            ] {
                let g = ops::build_graph_at(ops::lookup(name).unwrap(), &types, &attrs, p).unwrap();
                let text = lower(&g).unwrap();
                let attr = if name == "mm" {
                    format!("precision = [{want}, {want}]")
                } else {
                    format!(
                        "precision_config = [#stablehlo<precision {want}>, #stablehlo<precision {want}>]"
                    )
                };
                assert!(text.contains(&attr), "{name} at {p:?}: {text}");
            }
            let bf = ops::build_graph_at(
                ops::lookup("mm").unwrap(),
                &[f(DType::BF16, &[4, 8]), f(DType::BF16, &[8, 3])],
                &Attrs::new(),
                p,
            )
            .unwrap();
            assert!(!lower(&bf).unwrap().contains("precision"));
        }
    }

    #[test]
    fn emitted_modules_are_pinned() {
        let f = |d: &[u64]| TensorType::new(DType::F32, d);
        let softmax = lower(&op(
            "softmax",
            &[f(&[2, 8])],
            Attrs::new().with("dim", Attr::Int(-1)),
        ))
        .unwrap();
        insta::assert_snapshot!("softmax_2x8", softmax);
        let linear = lower(&op(
            "linear",
            &[f(&[4, 8]), f(&[16, 8]), f(&[16])],
            Attrs::new(),
        ))
        .unwrap();
        insta::assert_snapshot!("linear_4x8_16", linear);
        // For execution, an output may have one more parameter, aliased,
        // or be stored over one of the graph's.
        let add = op("add", &[f(&[2, 3]), f(&[2, 3])], Attrs::new());
        let (extra, _) = lower_aliased(&add, &[OutputSlot::Extra]).unwrap();
        insta::assert_snapshot!("add_2x3_aliased", extra);
        let (over, _) = lower_aliased(&add, &[OutputSlot::Param(1)]).unwrap();
        insta::assert_snapshot!("add_2x3_stored_over_its_second_operand", over);
        let (own, _) = lower_aliased(&add, &[OutputSlot::Own]).unwrap();
        assert_eq!(own, lower(&add).unwrap());
        // A slot naming no parameter of the output's type is refused.
        let sum = op("sum", &[f(&[2, 3])], Attrs::new());
        assert!(lower_aliased(&sum, &[OutputSlot::Param(0)]).is_err());
        assert!(lower_aliased(&add, &[OutputSlot::Param(2)]).is_err());
        assert!(lower_aliased(&add, &[]).is_err());
    }

    /// The lowerings written as regions or index vectors, pinned.
    #[test]
    fn index_sort_and_window_lowerings_are_pinned() {
        let f = |d: &[u64]| TensorType::new(DType::F32, d);
        let i = |d: &[u64]| TensorType::new(DType::I64, d);
        let dim = |d: i64| Attrs::new().with("dim", Attr::Int(d));
        let cases = [
            ("sort_3x4", op("sort", &[f(&[3, 4])], dim(-1))),
            ("argmax_3x4", op("argmax", &[f(&[3, 4])], dim(1))),
            ("cumsum_3x4", op("cumsum", &[f(&[3, 4])], dim(0))),
            (
                "gather_3x4",
                op("gather", &[f(&[3, 4]), i(&[3, 2])], dim(1)),
            ),
            (
                "scatter_add_3x4",
                op("scatter_add", &[f(&[3, 4]), i(&[2, 4]), f(&[2, 4])], dim(0)),
            ),
            (
                // Summed at f32 and rounded once.
                "scatter_add_bf16_3x4",
                op(
                    "scatter_add",
                    &[
                        TensorType::new(DType::BF16, &[3, 4]),
                        i(&[2, 4]),
                        TensorType::new(DType::BF16, &[2, 4]),
                    ],
                    dim(0),
                ),
            ),
            (
                "conv2d_1x2x5x5",
                op(
                    "conv2d",
                    &[f(&[1, 2, 5, 5]), f(&[4, 1, 3, 3])],
                    Attrs::new()
                        .with("groups", Attr::Int(2))
                        .with("padding", Attr::Ints(vec![1, 1])),
                ),
            ),
        ];
        for (name, g) in cases {
            insta::assert_snapshot!(name, lower(&g).unwrap());
        }
    }

    /// Every operation, a region's and the one holding the region too,
    /// ends located nowhere; lines that open or head a region, and the
    /// module's and function's, do not.
    #[test]
    fn compiled_text_locates_every_operation_nowhere() {
        let f = |d: &[u64]| TensorType::new(DType::F32, d);
        let g = op(
            "argmax",
            &[f(&[3, 4])],
            Attrs::new().with("dim", Attr::Int(1)),
        );
        let text = lower(&g).unwrap();
        let bare = without_locations(&text);
        let lines: Vec<&str> = bare.lines().collect();
        assert_eq!(lines[0], "#unknown = loc(unknown)");
        assert_eq!(lines.len(), text.lines().count() + 1);
        let located = |needle: &str| {
            let l = lines.iter().find(|l| l.contains(needle)).unwrap();
            l.ends_with(" loc(#unknown)")
        };
        assert!(located("stablehlo.iota"));
        assert!(located("%an = stablehlo.compare NE"));
        assert!(located("stablehlo.return %v, %i"));
        assert!(located("}) {dimensions"));
        assert!(located("return %v1 :"));
        assert!(!located("\"stablehlo.reduce\"("));
        assert!(!located("^bb0("));
        assert!(!located("module @tpurt"));
        assert!(!located("func.func"));
        assert_eq!(bare.matches(" loc(#unknown)").count(), 25);
    }
}
