//! The primitive operations, aligned with StableHLO. Every op of the op
//! library is built from these; every platform implements these and only
//! these. Broadcasting is explicit (`BroadcastInDim`), as in StableHLO.

use serde::{Deserialize, Serialize};

use super::dtype::DType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Expm1,
    Log,
    Log1p,
    Sqrt,
    Rsqrt,
    Tanh,
    /// 1 / (1 + exp(-x))
    Logistic,
    Sin,
    Cos,
    Erf,
    Floor,
    Ceil,
    /// Round half to even (as torch.round).
    Round,
    Sign,
    /// Logical not for bool, bitwise not for integers.
    Not,
    /// Bool result: neither inf nor nan.
    IsFinite,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// Integer division truncates toward zero (StableHLO); the op library
    /// builds floor division from it.
    Div,
    /// Remainder with the sign of the dividend (C fmod).
    Rem,
    Pow,
    Max,
    Min,
    /// Logical for bool, bitwise for integers.
    And,
    Or,
    Xor,
    Atan2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceOp {
    Sum,
    Prod,
    Max,
    Min,
    /// Bool or integers.
    And,
    Or,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScatterCombiner {
    /// The update replaces the value (last write wins for duplicate indices).
    Replace,
    Add,
    Mul,
    Max,
    Min,
}

/// How exactly a product (`DotGeneral`, `Convolution`) of f32 operands is
/// computed, as StableHLO's precision config and XLA's TPU backend read it:
/// `Default` multiplies the operands rounded to bf16 (one pass of the
/// matrix unit), `High` splits each operand into a bf16 head and a bf16
/// tail and sums three such products (bf16_3x, about 16 bits of the
/// mantissa), `Highest` is full f32 (torch's default,
/// `torch.get_float32_matmul_precision() == "highest"`). Products of other
/// dtypes ignore it. Every accumulation is f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u32)]
pub enum Precision {
    Default = 0,
    High = 1,
    #[default]
    Highest = 2,
}

impl Precision {
    /// From the C ABI's and the bindings' code: 0 DEFAULT, 1 HIGH,
    /// 2 HIGHEST.
    pub fn from_code(code: u32) -> Option<Precision> {
        match code {
            0 => Some(Precision::Default),
            1 => Some(Precision::High),
            2 => Some(Precision::Highest),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::Default => "DEFAULT",
            Precision::High => "HIGH",
            Precision::Highest => "HIGHEST",
        }
    }

    /// Left out of a graph's canonical form, so that the fingerprints of
    /// graphs without reduced-precision products never changed.
    pub fn is_highest(&self) -> bool {
        *self == Precision::Highest
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RngDistribution {
    /// Uniform in [0, 1).
    Uniform,
    /// Standard normal.
    Normal,
}

/// A primitive and its attributes. Operands and results are listed per variant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prim {
    /// () -> the literal. `bytes` are little-endian elements, row-major.
    Constant {
        dtype: DType,
        dims: Vec<u64>,
        bytes: Vec<u8>,
    },
    /// () -> dims, element i along `dimension` is i.
    Iota {
        dtype: DType,
        dims: Vec<u64>,
        dimension: usize,
    },
    /// (x) -> same type (IsFinite: bool).
    Unary(UnaryOp),
    /// (x, y) of one type -> that type.
    Binary(BinaryOp),
    /// (x, y) of one type -> bool.
    Compare(CompareOp),
    /// (pred: bool, on_true, on_false) of one shape -> on_true's type.
    Select,
    /// (min, x, max): min and max are scalars or x's shape.
    Clamp,
    /// (x) -> x's dims in `to`.
    Convert { to: DType },
    /// (x) -> x's dims in `to`, the same bytes read as `to` (of x's byte
    /// width; not bool): a float's bits as an integer and back.
    BitcastConvert { to: DType },
    /// (x) -> dims; operand dimension i maps to result dimension mapping[i]
    /// and has size 1 or dims[mapping[i]].
    BroadcastInDim { dims: Vec<u64>, mapping: Vec<usize> },
    /// (x) -> dims with the same element count.
    Reshape { dims: Vec<u64> },
    /// (x) -> result dimension i is operand dimension perm[i].
    Transpose { perm: Vec<usize> },
    /// (x) -> elements start..limit by stride per dimension.
    Slice {
        start: Vec<u64>,
        limit: Vec<u64>,
        stride: Vec<u64>,
    },
    /// (x, start_0, ..., start_{r-1}: i64 scalars) -> `sizes`; starts are
    /// clamped so the window fits (StableHLO).
    DynamicSlice { sizes: Vec<u64> },
    /// (x, update, start_0, ...: i64 scalars) -> x with update written at
    /// the (clamped) starts.
    DynamicUpdateSlice,
    /// (x, value: scalar of x's dtype) -> padded: `low`/`high` may be
    /// negative (cropping), `interior` inserts between elements.
    Pad {
        low: Vec<i64>,
        high: Vec<i64>,
        interior: Vec<u64>,
    },
    /// (x_0, x_1, ...) along `dimension`.
    Concatenate { dimension: usize },
    /// (x) -> x with `dimensions` reversed.
    Reverse { dimensions: Vec<usize> },
    /// (x) -> x with `dimensions` reduced away.
    Reduce {
        op: ReduceOp,
        dimensions: Vec<usize>,
    },
    /// (x) -> i64 index of the first max (or min) along `dimension`, which is removed.
    ArgReduce { max: bool, dimension: usize },
    /// (x) -> running reduction along `dimension` (cumsum, cumprod, cummax, cummin).
    Cumulative {
        op: ReduceOp,
        dimension: usize,
        reverse: bool,
    },
    /// (lhs, rhs) -> batch dims, then lhs free dims, then rhs free dims.
    DotGeneral {
        lhs_batch: Vec<usize>,
        rhs_batch: Vec<usize>,
        lhs_contract: Vec<usize>,
        rhs_contract: Vec<usize>,
        /// Of f32 operands (see [`Precision`]).
        #[serde(default, skip_serializing_if = "Precision::is_highest")]
        precision: Precision,
    },
    /// (x, index: integer, same rank) -> index's dims; out[i] = x[i with
    /// i[axis] replaced by index[i]] (torch.gather).
    Gather { axis: usize },
    /// (x, index: integer, any rank) -> x.dims[..axis] ++ index.dims ++
    /// x.dims[axis+1..] (torch.index_select / embedding).
    Take { axis: usize },
    /// (x, index: integer, updates: index's dims) -> x with updates
    /// combined in at x[i with i[axis] replaced by index[i]] (torch.scatter).
    Scatter {
        axis: usize,
        combiner: ScatterCombiner,
    },
    /// (x) -> (sorted values, i64 indices) along `dimension`.
    Sort {
        dimension: usize,
        descending: bool,
        stable: bool,
    },
    /// (seed: i64 scalar, offset: i64 scalar; their bits read as u64) ->
    /// dims of dtype; counter based (Philox 4x32-10 over positions
    /// offset + i: an f32-based uniform reads one word of a call, the others
    /// take a call each; the exact definition is in the host kernel
    /// `rng.rs`), so (seed, offset) gives the same numbers on every
    /// platform and mode.
    Rng {
        distribution: RngDistribution,
        dtype: DType,
        dims: Vec<u64>,
    },
    /// (input N,C,spatial..., weight O,C/groups,kernel...) -> N,O,spatial'...
    Convolution {
        stride: Vec<u64>,
        padding: Vec<(u64, u64)>,
        dilation: Vec<u64>,
        groups: u64,
        /// Of f32 operands (see [`Precision`]).
        #[serde(default, skip_serializing_if = "Precision::is_highest")]
        precision: Precision,
    },
    /// Solve a triangular system, batched (StableHLO's `triangular_solve`):
    /// (a [b.., m, m], rhs [b.., m, n] on the left side, [b.., n, m] on the
    /// right) -> x of rhs's shape with op(a) x = rhs (left) or x op(a) =
    /// rhs, op(a) = aᵀ with `transpose_a`. Only the triangle `lower` names
    /// is read; with `unit_diagonal` the diagonal is taken as ones. f32 or
    /// f64, the batch dims of both the same. A zero on the diagonal gives
    /// inf and NaN, as LAPACK's trsm.
    TriangularSolve {
        left_side: bool,
        lower: bool,
        unit_diagonal: bool,
        transpose_a: bool,
    },
    /// Cholesky factor, batched: a [b.., n, n] (f32 or f64, symmetric
    /// positive-definite, its lower triangle read) -> l [b.., n, n] with
    /// l lᵀ = a, zeros above the diagonal. From the first column whose
    /// leading minor is not positive-definite on, the columns are NaN
    /// (StableHLO's `cholesky` makes the whole matrix NaN, which cannot
    /// tell torch's info: the xla platform lowers this to a while loop).
    Cholesky,
    /// LU factorization with partial pivoting, batched, as LAPACK's getrf
    /// chooses: a [b.., m, n] (f32 or f64) -> (lu [b.., m, n]: L below the
    /// diagonal, its unit diagonal implied, U on and above; pivots
    /// [b.., min(m, n)] i64, 0-based: step i swapped row i with row
    /// pivots[i], the first of the largest magnitudes in column i at or
    /// below row i; perm [b.., m] i64: row i of the factored matrix is row
    /// perm[i] of a). A zero pivot leaves its column unscaled. XLA has no
    /// such operation: the xla platform lowers it to a while loop.
    LuFactor,
    /// The row permutation [b.., m] (i64) that LAPACK-style pivots
    /// [b.., k] (i64, 0-based, k <= m) make: the identity with entries i
    /// and pivots[i] swapped for i = 0, 1, .., k - 1. A pivot outside
    /// 0..m is an error.
    PivotsToPermutation { rows: u64 },
    /// Householder QR, batched, as LAPACK's geqrf packs it: a [b.., m, n]
    /// (f32 or f64) -> (qr [b.., m, n]: R on and above the diagonal, below
    /// it the reflectors' vectors v (v's leading 1 implied); tau
    /// [b.., min(m, n)]), Q = H_0 H_1 .. H_{k-1} with H_i = I - tau_i v_i
    /// v_iᵀ. Reflector i maps column i's part from row i down to (beta, 0,
    /// ..) with beta of the sign opposite to the diagonal element; a column
    /// already zero below the diagonal gets tau 0 (H = I). XLA has no such
    /// operation: the xla platform lowers it to a while loop.
    HouseholderQr,
    /// The first n columns of H_0 H_1 .. H_{k-1} (LAPACK's orgqr): (a
    /// [b.., m, n] holding the vectors below its diagonal as
    /// `HouseholderQr` packs them, m >= n; tau [b.., k], k <= n) -> q
    /// [b.., m, n]. Only a's strictly lower triangle is read.
    HouseholderProduct,
    /// Jacobi's method, batched, f32 or f64, in the operand's precision.
    /// Two-sided: a [b.., n, n] (symmetric; both triangles read) -> (w
    /// [b.., n], v [b.., n, n]) with vᵀ a v = diag(w): eigenvalues
    /// unsorted, eigenvector j in column j. One-sided (Hestenes): a
    /// [b.., m, n] -> (a v [b.., m, n], whose columns are orthogonal, so
    /// the singular values are their norms; v [b.., n, n]). Index pairs
    /// are rotated in a round-robin tournament, n / 2 disjoint pairs a
    /// round and every pair once a sweep (an odd n gets a bye), a pair
    /// left alone where its off element is at most eps · sqrt(|a_pp
    /// a_qq|) (eps the dtype's unit roundoff), until a sweep rotates no
    /// pair or 40 sweeps have run. XLA has no such operation: the xla
    /// platform lowers it to a while loop whose rounds are whole-matrix
    /// operations, the same arithmetic in the same order.
    Jacobi { two_sided: bool },
    /// Scaled dot-product attention, a composite: the op library emits it
    /// for the plain case (f32, no mask, no dropout), and a platform that
    /// has no kernel for it runs `ops::expand_composites`, which rewrites
    /// it into the primitives above (as StableHLO's `composite` does).
    ///
    /// (q [n.., h, l, e], k [n.., hk, s, e], v [n.., hk, s, ev]), all f32,
    /// rank at least 3, h a multiple of hk: query head i reads key/value
    /// head i / (h / hk) ->
    /// (softmax(scale · q kᵀ) v [n.., h, l, ev], the rows' logsumexp of
    /// the scaled scores [n.., h, l]). With `causal`, query i attends keys
    /// j <= i only (top left aligned). A row with no key gives 0 and -inf.
    /// An optional fourth operand, an f32 scalar known only at run time,
    /// multiplies the scale (`fusion::attention` passes a model's runtime
    /// scale so, instead of scaling q in a pass of its own).
    Attention { scale: f64, causal: bool },
    /// (grad_out [n.., h, l, ev], q, k, v, out, logsumexp) -> (dq, dk, dv)
    /// of `Attention` with the same attributes; dk and dv sum over the
    /// query heads that share a key/value head.
    AttentionBackward { scale: f64, causal: bool },
}

impl Prim {
    /// Short name for messages and the text form.
    pub fn name(&self) -> String {
        fn snake<T: Serialize>(t: &T) -> String {
            serde_json::to_value(t)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        }
        match self {
            Prim::Constant { .. } => "constant".into(),
            Prim::Iota { .. } => "iota".into(),
            Prim::Unary(op) => snake(op),
            Prim::Binary(op) => snake(op),
            Prim::Compare(op) => format!("compare_{}", snake(op)),
            Prim::Select => "select".into(),
            Prim::Clamp => "clamp".into(),
            Prim::Convert { .. } => "convert".into(),
            Prim::BitcastConvert { .. } => "bitcast_convert".into(),
            Prim::BroadcastInDim { .. } => "broadcast_in_dim".into(),
            Prim::Reshape { .. } => "reshape".into(),
            Prim::Transpose { .. } => "transpose".into(),
            Prim::Slice { .. } => "slice".into(),
            Prim::DynamicSlice { .. } => "dynamic_slice".into(),
            Prim::DynamicUpdateSlice => "dynamic_update_slice".into(),
            Prim::Pad { .. } => "pad".into(),
            Prim::Concatenate { .. } => "concatenate".into(),
            Prim::Reverse { .. } => "reverse".into(),
            Prim::Reduce { op, .. } => format!("reduce_{}", snake(op)),
            Prim::ArgReduce { max, .. } => if *max { "argmax" } else { "argmin" }.into(),
            Prim::Cumulative { op, .. } => format!("cumulative_{}", snake(op)),
            Prim::DotGeneral { .. } => "dot_general".into(),
            Prim::Gather { .. } => "gather".into(),
            Prim::Take { .. } => "take".into(),
            Prim::Scatter { .. } => "scatter".into(),
            Prim::Sort { .. } => "sort".into(),
            Prim::Rng { .. } => "rng".into(),
            Prim::Convolution { .. } => "convolution".into(),
            Prim::TriangularSolve { .. } => "triangular_solve".into(),
            Prim::Cholesky => "cholesky".into(),
            Prim::LuFactor => "lu_factor".into(),
            Prim::PivotsToPermutation { .. } => "pivots_to_permutation".into(),
            Prim::HouseholderQr => "householder_qr".into(),
            Prim::HouseholderProduct => "householder_product".into(),
            Prim::Jacobi { two_sided } => if *two_sided {
                "jacobi_eigen"
            } else {
                "jacobi_svd"
            }
            .into(),
            Prim::Attention { .. } => "attention".into(),
            Prim::AttentionBackward { .. } => "attention_backward".into(),
        }
    }

    /// A composite that `ops::expand_composites` rewrites into primitives
    /// for platforms without a kernel of their own for it.
    pub fn is_composite(&self) -> bool {
        matches!(
            self,
            Prim::Attention { .. } | Prim::AttentionBackward { .. }
        )
    }

    /// Elementwise: each output element depends only on the input elements
    /// at the same position. The fusion planner chains these.
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            Prim::Unary(_)
                | Prim::Binary(_)
                | Prim::Compare(_)
                | Prim::Select
                | Prim::Clamp
                | Prim::Convert { .. }
        )
    }
}
