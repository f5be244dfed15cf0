//! The host platform's loop engine: runs one loop group of the fusion plan
//! in a single pass over the iteration space, in chunks that stay in the
//! L1 cache. Values are f32 registers; a node whose result is bf16 or f16
//! rounds its register to that precision, as node-by-node evaluation does.
//! exp, erf, tanh and the logistic use the vectorizable forms of `vmath`
//! (within 4 ulps of the correctly rounded value), so fused results match
//! node-by-node ones to that accuracy. Trailing-dimension reductions
//! accumulate in f64 (as the reduce kernel does) while the pass runs.

use crate::fxhash::{FxHashMap, FxHashSet};

use half::{bf16, f16};

use super::kernels::{self, HostTensor};
use super::vmath;
use crate::error::{Error, Result};
use crate::fusion::{is_load, Kernel, KernelKind, Plan};
use crate::ir::{BinaryOp, CompareOp, DType, Graph, Prim, ReduceOp, TensorType, UnaryOp, ValueId};
use crate::platform::host::executable::read_tensor;
use crate::tensor::DeviceTensor;

/// Elements per chunk: 4 KiB of f32 per register, so the registers of a
/// group stay in L1/L2.
const CHUNK: usize = 1024;

/// A pass's per-source and per-output lists: inline up to eight, so a
/// small op's run allocates nothing for them.
type Few<T> = smallvec::SmallVec<[T; 8]>;

/// A pass's stored values and reductions: a tensor each, so fewer inline
/// (a returned list is moved, inline part and all).
type Outs<T> = smallvec::SmallVec<[T; 2]>;

/// Where a loop reads an outside value from.
#[derive(Clone, Debug)]
enum Source {
    /// A stored value, indexed as `offset + sum(index[d] * strides[d])`
    /// over the loop's shape (strides 0 where it broadcasts).
    Strided {
        value: ValueId,
        strides: Vec<u64>,
        offset: u64,
    },
    /// A scalar constant.
    Splat(f32),
    /// A concatenation along the loop's last dimension (see
    /// `fusion::is_load`): columns `lo..hi` read source `src`, a
    /// `Strided` or `Splat` source over the loop's shape but for its last
    /// dimension, `hi - lo` columns wide, at column `c - lo`.
    Pieces(Vec<(u64, u64, usize)>),
}

#[derive(Clone, Debug)]
enum Inst {
    Load {
        dst: usize,
        src: usize,
    },
    /// A convert: a move, then the `Round` that follows it.
    Move {
        dst: usize,
        a: usize,
    },
    Unary {
        op: UnaryOp,
        dst: usize,
        a: usize,
    },
    Binary {
        op: BinaryOp,
        dst: usize,
        a: usize,
        b: usize,
    },
    /// `second(first(a, b), c)`: two adds, subtracts or multiplies in one
    /// pass over the chunk, where `first`'s result is read by `second`
    /// alone (`chain_binaries`). Each op rounds to f32 as on its own.
    Chain {
        first: BinaryOp,
        second: BinaryOp,
        dst: usize,
        a: usize,
        b: usize,
        c: usize,
    },
    /// `(erf(x · c) + 1) · (x · h)`, GELU's exact form as the op library
    /// emits it (`fuse_gelu`), in one pass over the chunk rather than
    /// four; each op rounds to f32 as on its own.
    /// With a `bias`, of `x + bias`: the add before it joined too
    /// (`gelu_bias`), a linear layer's bias ahead of its activation.
    Gelu {
        dst: usize,
        x: usize,
        bias: Option<usize>,
        c: f32,
        h: f32,
    },
    /// `x · logistic(x)`, SiLU as the op library emits it, and with a
    /// `scale` the multiply after it when that is the product's one reader
    /// (`silu_scale`: a gated MLP's `silu(gate) · up`), in one pass rather
    /// than two or three (`fuse_silu`); each op rounds to f32 as on its
    /// own.
    Silu {
        dst: usize,
        x: usize,
        scale: Option<usize>,
    },
    /// SiLU's backward as the op library emits it,
    /// `(t · s) · (1 + x · (1 - s))` with `s = logistic(x)` and `t` the
    /// incoming gradient, in one pass rather than six (`fuse_silu`); each
    /// op rounds to f32 as on its own.
    SiluGrad {
        dst: usize,
        x: usize,
        t: usize,
    },
    Compare {
        op: CompareOp,
        dst: usize,
        a: usize,
        b: usize,
    },
    /// Dropout as the op library writes it, `(x · (u < keep)) · scale`,
    /// and the add after it when it is the result's one reader
    /// (`+ residual`), in one pass rather than three (`fuse_dropout`);
    /// each op rounds to f32 as on its own.
    Dropout {
        dst: usize,
        x: usize,
        u: usize,
        keep: f32,
        scale: f32,
        residual: Option<usize>,
    },
    Select {
        dst: usize,
        p: usize,
        a: usize,
        b: usize,
    },
    Clamp {
        dst: usize,
        lo: usize,
        x: usize,
        hi: usize,
    },
    /// Round a register to a dtype's precision (after a node of that dtype).
    Round {
        reg: usize,
        dtype: DType,
    },
    /// Uniform [0, 1) draws for the chunk's positions (Philox, as `rng`).
    Uniform {
        dst: usize,
        seed: Scalar,
        offset: Scalar,
        dtype: DType,
    },
    /// Write a register to the pass's `sink`-th stored output.
    Store {
        reg: usize,
        sink: usize,
    },
}

impl Inst {
    /// The register this instruction gives a new value (a `Round` rounds
    /// its register in place).
    fn def(&self) -> Option<usize> {
        match *self {
            Inst::Load { dst, .. }
            | Inst::Move { dst, .. }
            | Inst::Unary { dst, .. }
            | Inst::Binary { dst, .. }
            | Inst::Chain { dst, .. }
            | Inst::Gelu { dst, .. }
            | Inst::Silu { dst, .. }
            | Inst::SiluGrad { dst, .. }
            | Inst::Compare { dst, .. }
            | Inst::Dropout { dst, .. }
            | Inst::Select { dst, .. }
            | Inst::Clamp { dst, .. }
            | Inst::Uniform { dst, .. } => Some(dst),
            Inst::Round { .. } | Inst::Store { .. } => None,
        }
    }

    /// The registers this instruction reads.
    fn uses(&self) -> Vec<usize> {
        match *self {
            Inst::Load { .. } | Inst::Uniform { .. } => vec![],
            Inst::Move { a, .. } | Inst::Unary { a, .. } => vec![a],
            Inst::Gelu { x, bias, .. } => [x].into_iter().chain(bias).collect(),
            Inst::Silu { x, scale, .. } => [x].into_iter().chain(scale).collect(),
            Inst::SiluGrad { x, t, .. } => vec![x, t],
            Inst::Binary { a, b, .. } | Inst::Compare { a, b, .. } => vec![a, b],
            Inst::Chain { a, b, c, .. } => vec![a, b, c],
            Inst::Dropout { x, u, residual, .. } => [x, u].into_iter().chain(residual).collect(),
            Inst::Select { p, a, b, .. } => vec![p, a, b],
            Inst::Clamp { lo, x, hi, .. } => vec![lo, x, hi],
            Inst::Round { reg, .. } | Inst::Store { reg, .. } => vec![reg],
        }
    }

    /// The same instruction over registers renamed by `f`.
    fn renamed(&self, f: impl Fn(usize) -> usize) -> Inst {
        let mut i = self.clone();
        match &mut i {
            Inst::Load { dst, .. } | Inst::Uniform { dst, .. } => *dst = f(*dst),
            Inst::Move { dst, a } | Inst::Unary { dst, a, .. } => {
                (*dst, *a) = (f(*dst), f(*a));
            }
            Inst::Gelu { dst, x, bias, .. } => {
                (*dst, *x) = (f(*dst), f(*x));
                *bias = bias.map(&f);
            }
            Inst::Silu { dst, x, scale } => {
                (*dst, *x) = (f(*dst), f(*x));
                *scale = scale.map(&f);
            }
            Inst::SiluGrad { dst, x, t } => {
                (*dst, *x, *t) = (f(*dst), f(*x), f(*t));
            }
            Inst::Binary { dst, a, b, .. } | Inst::Compare { dst, a, b, .. } => {
                (*dst, *a, *b) = (f(*dst), f(*a), f(*b));
            }
            Inst::Select { dst, p, a, b } => {
                (*dst, *p, *a, *b) = (f(*dst), f(*p), f(*a), f(*b));
            }
            Inst::Chain { dst, a, b, c, .. } => {
                (*dst, *a, *b, *c) = (f(*dst), f(*a), f(*b), f(*c));
            }
            Inst::Dropout {
                dst,
                x,
                u,
                residual,
                ..
            } => {
                (*dst, *x, *u) = (f(*dst), f(*x), f(*u));
                *residual = residual.map(&f);
            }
            Inst::Clamp { dst, lo, x, hi } => {
                (*dst, *lo, *x, *hi) = (f(*dst), f(*lo), f(*x), f(*hi));
            }
            Inst::Round { reg, .. } | Inst::Store { reg, .. } => *reg = f(*reg),
        }
        i
    }
}

/// The group's nodes in an order that finishes each result (a stored
/// value, a reduction's operand) before starting the next, any order the
/// values allow: a pass computing many independent results (an
/// optimizer's update of every parameter of one shape) then holds few
/// values at once, where graph order would hold every parameter's.
fn depth_first(graph: &Graph, kernel: &Kernel, producer: &[Option<usize>]) -> Vec<usize> {
    let nodes = graph.nodes();
    let in_group: FxHashSet<usize> = kernel.nodes.iter().copied().collect();
    let mut used_in_group: FxHashSet<usize> = FxHashSet::default();
    for &i in &kernel.nodes {
        for v in &nodes[i].inputs {
            if let Some(p) = producer[v.0 as usize].filter(|p| in_group.contains(p)) {
                used_in_group.insert(p);
            }
        }
    }
    let mut order = Vec::with_capacity(kernel.nodes.len());
    let mut done: FxHashSet<usize> = FxHashSet::default();
    let results = kernel.nodes.iter().filter(|i| !used_in_group.contains(i));
    for &root in results.chain(&kernel.nodes) {
        // Post-order, with an explicit stack (chains can be long).
        let mut stack = vec![(root, false)];
        while let Some((i, expanded)) = stack.pop() {
            if done.contains(&i) {
                continue;
            }
            if expanded {
                done.insert(i);
                order.push(i);
                continue;
            }
            stack.push((i, true));
            for v in nodes[i].inputs.iter().rev() {
                if let Some(p) =
                    producer[v.0 as usize].filter(|p| in_group.contains(p) && !done.contains(p))
                {
                    stack.push((p, false));
                }
            }
        }
    }
    order
}

/// How many times each register is read: by instructions, and twice for
/// each store or epilogue (so a stored value never counts as read once).
fn read_counts(
    insts: &[Inst],
    stores: &[(usize, ValueId, DType)],
    epilogues: &[Epilogue],
) -> FxHashMap<usize, usize> {
    let mut reads: FxHashMap<usize, usize> = FxHashMap::default();
    for u in insts.iter().flat_map(Inst::uses) {
        *reads.entry(u).or_default() += 1;
    }
    for r in stores
        .iter()
        .map(|s| s.0)
        .chain(epilogues.iter().map(|e| e.reg))
    {
        *reads.entry(r).or_default() += 2;
    }
    reads
}

/// The registers a `Round` rounds (values of a half-precision dtype).
fn rounded_regs(insts: &[Inst]) -> FxHashSet<usize> {
    insts
        .iter()
        .filter_map(|i| match *i {
            Inst::Round { reg, .. } => Some(reg),
            _ => None,
        })
        .collect()
}

/// The instructions `pick` takes whose result is an f32 (not rounded)
/// read by one instruction alone: result register -> (position, what
/// `pick` gave). On registers before allocation.
fn read_once<T>(
    insts: &[Inst],
    stores: &[(usize, ValueId, DType)],
    epilogues: &[Epilogue],
    pick: impl Fn(&Inst) -> Option<T>,
) -> FxHashMap<usize, (usize, T)> {
    let reads = read_counts(insts, stores, epilogues);
    let rounded = rounded_regs(insts);
    insts
        .iter()
        .enumerate()
        .filter_map(|(k, i)| {
            let dst = i.def()?;
            if reads.get(&dst) != Some(&1) || rounded.contains(&dst) {
                return None;
            }
            Some((dst, (k, pick(i)?)))
        })
        .collect()
}

/// Where each register is defined: its instruction's position (on
/// registers before allocation, each defined once).
fn definitions(insts: &[Inst]) -> FxHashMap<usize, usize> {
    insts
        .iter()
        .enumerate()
        .filter_map(|(k, i)| Some((i.def()?, k)))
        .collect()
}

/// `insts` without the positions in `gone`, and with the instructions in
/// `joined` at their positions.
fn joined_in(
    insts: Vec<Inst>,
    gone: &FxHashSet<usize>,
    mut joined: FxHashMap<usize, Inst>,
) -> Vec<Inst> {
    insts
        .into_iter()
        .enumerate()
        .filter(|(k, _)| !gone.contains(k))
        .map(|(k, i)| joined.remove(&k).unwrap_or(i))
        .collect()
}

/// `insts` without the instructions at the positions in `gone`.
fn without(insts: Vec<Inst>, gone: &FxHashSet<usize>) -> Vec<Inst> {
    insts
        .into_iter()
        .enumerate()
        .filter(|(k, _)| !gone.contains(k))
        .map(|(_, i)| i)
        .collect()
}

/// Joins the op library's exact GELU, (erf(x · c) + 1) · (x · h) with
/// splats c and h, into one `Inst::Gelu` where its four intermediate
/// values are f32s read by the pattern alone. On registers before
/// allocation (each defined once), so x is still held where the product
/// stood; `splat_of` gives a constant register's value.
fn fuse_gelu(
    insts: Vec<Inst>,
    splat_of: impl Fn(usize) -> Option<f32>,
    stores: &[(usize, ValueId, DType)],
    epilogues: &[Epilogue],
) -> Vec<Inst> {
    let reads = read_counts(&insts, stores, epilogues);
    let def = definitions(&insts);
    let rounded = rounded_regs(&insts);
    // An intermediate the pattern may absorb: an f32 read once.
    let inner = |r: usize| reads.get(&r) == Some(&1) && !rounded.contains(&r);
    let defining = |r: usize| def.get(&r).map(|&k| (k, &insts[k]));
    // (k, x, s): instruction k computes x · s for a splat s.
    let times_splat = |r: usize| match defining(r)? {
        (
            k,
            &Inst::Binary {
                op: BinaryOp::Mul,
                a,
                b,
                ..
            },
        ) => [(a, b), (b, a)]
            .into_iter()
            .find_map(|(x, s)| Some((k, x, splat_of(s)?)).filter(|_| splat_of(x).is_none())),
        _ => None,
    };
    // The instructions a GELU ending in `out = hx · t3` replaces, and x, c
    // and h.
    let gelu = |hx: usize, t3: usize| -> Option<([usize; 4], usize, f32, f32)> {
        if !(inner(hx) && inner(t3)) {
            return None;
        }
        let (kh, x, h) = times_splat(hx)?;
        let (ka, t2) = match defining(t3)? {
            (
                k,
                &Inst::Binary {
                    op: BinaryOp::Add,
                    a,
                    b,
                    ..
                },
            ) => [(a, b), (b, a)]
                .into_iter()
                .find(|&(_, one)| splat_of(one) == Some(1.0))
                .map(|(t2, _)| (k, t2))?,
            _ => return None,
        };
        let (ke, t1) = match defining(t2)? {
            (
                k,
                &Inst::Unary {
                    op: UnaryOp::Erf,
                    a,
                    ..
                },
            ) if inner(t2) && inner(a) => (k, a),
            _ => return None,
        };
        let (km, x1, c) = times_splat(t1)?;
        (x1 == x).then_some(([kh, ka, ke, km], x, c, h))
    };
    let mut gone: FxHashSet<usize> = FxHashSet::default();
    let mut joined: FxHashMap<usize, Inst> = FxHashMap::default();
    for (k, i) in insts.iter().enumerate() {
        let Inst::Binary {
            op: BinaryOp::Mul,
            dst,
            a,
            b,
        } = *i
        else {
            continue;
        };
        if rounded.contains(&dst) {
            continue;
        }
        if let Some((parts, x, c, h)) = gelu(a, b).or_else(|| gelu(b, a)) {
            gone.extend(parts);
            joined.insert(
                k,
                Inst::Gelu {
                    dst,
                    x,
                    bias: None,
                    c,
                    h,
                },
            );
        }
    }
    joined_in(insts, &gone, joined)
}

/// Joins an add whose result only a GELU reads, and is not rounded, into
/// that GELU (`Inst::Gelu::bias`). On values, after `fuse_gelu`.
fn gelu_bias(
    insts: Vec<Inst>,
    stores: &[(usize, ValueId, DType)],
    epilogues: &[Epilogue],
) -> Vec<Inst> {
    let adds = read_once(&insts, stores, epilogues, |i| match *i {
        Inst::Binary {
            op: BinaryOp::Add,
            a,
            b,
            ..
        } => Some((a, b)),
        _ => None,
    });
    let mut gone: FxHashSet<usize> = FxHashSet::default();
    let mut insts = insts;
    for i in insts.iter_mut() {
        if let Inst::Gelu {
            x,
            bias: bias @ None,
            ..
        } = i
        {
            if let Some(&(k, (a, b))) = adds.get(x) {
                (*x, *bias) = (a, Some(b));
                gone.insert(k);
            }
        }
    }
    without(insts, &gone)
}

/// Joins SiLU and its backward as the op library emits them into one
/// instruction each, where their intermediate values are f32s the pattern
/// alone reads: `x · logistic(x)` into `Inst::Silu`, and `(t · s) · (1 +
/// x · (1 - s))` with `s = logistic(x)` (s read by those two ops alone)
/// into `Inst::SiluGrad`. Operands of a multiply or an add on either side
/// (the same f32 result either way round). On registers before allocation
/// (each defined once), ahead of `chain_binaries`, which would otherwise
/// take the multiplies in pairs.
fn fuse_silu(
    insts: Vec<Inst>,
    splat_of: impl Fn(usize) -> Option<f32>,
    stores: &[(usize, ValueId, DType)],
    epilogues: &[Epilogue],
) -> Vec<Inst> {
    let reads = read_counts(&insts, stores, epilogues);
    let def = definitions(&insts);
    let rounded = rounded_regs(&insts);
    let read = |r: usize, n: usize| reads.get(&r) == Some(&n) && !rounded.contains(&r);
    let defining = |r: usize| def.get(&r).map(|&k| (k, &insts[k]));
    let one = |r: usize| splat_of(r) == Some(1.0);
    // (k, x): instruction k computes logistic(x).
    let logistic = |s: usize| match defining(s)? {
        (
            k,
            &Inst::Unary {
                op: UnaryOp::Logistic,
                a,
                ..
            },
        ) => Some((k, a)),
        _ => None,
    };
    // (k, a, b): instruction k computes `op(a, b)`.
    let binary = |r: usize, want: BinaryOp| match defining(r)? {
        (k, &Inst::Binary { op, a, b, .. }) if op == want => Some((k, a, b)),
        _ => None,
    };
    // The instructions `p · q` ends as a SiLU backward replaces, x and t.
    let grad = |ts: usize, w: usize| -> Option<([usize; 5], usize, usize)> {
        if !(read(ts, 1) && read(w, 1)) {
            return None;
        }
        let (kts, a, b) = binary(ts, BinaryOp::Mul)?;
        let (kw, c, d) = binary(w, BinaryOp::Add)?;
        let m = [(c, d), (d, c)].into_iter().find(|&(o, _)| one(o))?.1;
        if !read(m, 1) {
            return None;
        }
        let (km, e, f) = binary(m, BinaryOp::Mul)?;
        // m = x · r with r = 1 - s, s = logistic(x).
        [(e, f), (f, e)].into_iter().find_map(|(x, r)| {
            if !read(r, 1) {
                return None;
            }
            let (kr, o, s) = binary(r, BinaryOp::Sub)?;
            if !one(o) || !read(s, 2) {
                return None;
            }
            let (ks, sx) = logistic(s)?;
            if sx != x {
                return None;
            }
            // ts = t · s.
            let t = [(a, b), (b, a)]
                .into_iter()
                .find(|&(_, s2)| s2 == s)
                .map(|(t, _)| t)?;
            (t != s).then_some(([kts, kw, km, kr, ks], x, t))
        })
    };
    let mut gone: FxHashSet<usize> = FxHashSet::default();
    let mut joined: FxHashMap<usize, Inst> = FxHashMap::default();
    for (k, i) in insts.iter().enumerate() {
        let Inst::Binary {
            op: BinaryOp::Mul,
            dst,
            a,
            b,
        } = *i
        else {
            continue;
        };
        if rounded.contains(&dst) {
            continue;
        }
        if let Some((parts, x, t)) = grad(a, b).or_else(|| grad(b, a)) {
            if parts.iter().all(|p| !gone.contains(p)) {
                gone.extend(parts);
                joined.insert(k, Inst::SiluGrad { dst, x, t });
            }
            continue;
        }
        // x · logistic(x), the logistic read here alone.
        let silu = [(a, b), (b, a)].into_iter().find_map(|(x, s)| {
            let (ks, sx) = logistic(s)?;
            (sx == x && read(s, 1) && !gone.contains(&ks)).then_some((ks, x))
        });
        if let Some((ks, x)) = silu {
            gone.insert(ks);
            joined.insert(
                k,
                Inst::Silu {
                    dst,
                    x,
                    scale: None,
                },
            );
        }
    }
    joined_in(insts, &gone, joined)
}

/// Joins a multiply whose operand is a SiLU read by it alone, and not
/// rounded, into that SiLU (`Inst::Silu::scale`), at the multiply's
/// place. On values, after `fuse_silu`.
fn silu_scale(
    insts: Vec<Inst>,
    stores: &[(usize, ValueId, DType)],
    epilogues: &[Epilogue],
) -> Vec<Inst> {
    let silus = read_once(&insts, stores, epilogues, |i| match *i {
        Inst::Silu { x, scale: None, .. } => Some(x),
        _ => None,
    });
    let mut gone: FxHashSet<usize> = FxHashSet::default();
    let mut insts = insts;
    for i in insts.iter_mut() {
        let Inst::Binary {
            op: BinaryOp::Mul,
            dst,
            a,
            b,
        } = *i
        else {
            continue;
        };
        let found = [(a, b), (b, a)].into_iter().find_map(|(y, u)| {
            let &(k, x) = silus.get(&y)?;
            (!gone.contains(&k)).then_some((k, x, u))
        });
        if let Some((k, x, u)) = found {
            *i = Inst::Silu {
                dst,
                x,
                scale: Some(u),
            };
            gone.insert(k);
        }
    }
    without(insts, &gone)
}

/// Joins an add, subtract or multiply whose result is read only by the
/// add, subtract or multiply right after it (loads aside: they move
/// before the pair) into one `Inst::Chain`: one
/// pass over the chunk instead of two, and no register written and read
/// back between them. Runs on values (before `allocate`), so "read only
/// by" counts every instruction, stored value and reduction. The result
/// may be the second op's either operand when that op is an add or a
/// multiply (the same f32 result either way round).
fn chain_binaries(
    insts: Vec<Inst>,
    stores: &[(usize, ValueId, DType)],
    epilogues: &[Epilogue],
) -> Vec<Inst> {
    let chainable = |op: BinaryOp| matches!(op, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul);
    let reads = read_counts(&insts, stores, epilogues);
    // An op that may start a chain: (op, result, operands).
    let starts = |i: &Inst| match *i {
        Inst::Binary { op, dst, a, b } if chainable(op) && reads.get(&dst) == Some(&1) => {
            Some((op, dst, a, b))
        }
        _ => None,
    };
    let mut out = Vec::with_capacity(insts.len());
    let mut held: Option<(BinaryOp, usize, usize, usize)> = None;
    for inst in insts {
        let Some((first, t, a, b)) = held else {
            held = starts(&inst);
            if held.is_none() {
                out.push(inst);
            }
            continue;
        };
        // Loads between the two go first (values: nothing is overwritten).
        if matches!(inst, Inst::Load { .. }) {
            out.push(inst);
            continue;
        }
        held = None;
        match inst {
            Inst::Binary {
                op: second,
                dst,
                a: x,
                b: y,
            } if chainable(second)
                && ((x == t && y != t)
                    || (y == t && x != t && matches!(second, BinaryOp::Add | BinaryOp::Mul))) =>
            {
                let c = if x == t { y } else { x };
                out.push(Inst::Chain {
                    first,
                    second,
                    dst,
                    a,
                    b,
                    c,
                });
            }
            _ => {
                out.push(Inst::Binary {
                    op: first,
                    dst: t,
                    a,
                    b,
                });
                // This one may start a chain of its own.
                held = starts(&inst);
                if held.is_none() {
                    out.push(inst);
                }
            }
        }
    }
    if let Some((op, dst, a, b)) = held {
        out.push(Inst::Binary { op, dst, a, b });
    }
    out
}

/// Joins dropout as the op library writes it, a `Chain` of two multiplies
/// `(x · m) · scale` where the mask m is `u < keep` (a comparison read by
/// that chain alone) and keep and scale are splats, into one
/// `Inst::Dropout`; and the add right after it that is its result's one
/// reader (dropout before a residual connection), loads aside. Runs on
/// values after `chain_binaries`, before `allocate`.
fn fuse_dropout(
    insts: Vec<Inst>,
    splat_of: impl Fn(usize) -> Option<f32>,
    stores: &[(usize, ValueId, DType)],
    epilogues: &[Epilogue],
) -> Vec<Inst> {
    let reads = read_counts(&insts, stores, epilogues);
    let rounded = rounded_regs(&insts);
    // Each mask's register: (u, keep).
    let mut masks: FxHashMap<usize, (usize, f32)> = FxHashMap::default();
    for i in &insts {
        if let Inst::Compare {
            op: CompareOp::Lt,
            dst,
            a,
            b,
        } = *i
        {
            if let Some(keep) =
                splat_of(b).filter(|_| reads.get(&dst) == Some(&1) && splat_of(a).is_none())
            {
                masks.insert(dst, (a, keep));
            }
        }
    }
    // The comparisons joined (by their result), dropped at the end.
    let mut joined: FxHashSet<usize> = FxHashSet::default();
    let mut out: Vec<Inst> = Vec::with_capacity(insts.len());
    let mut open: Option<usize> = None;
    for inst in &insts {
        // An add after an open dropout (loads go first): its residual.
        if let Some(at) = open {
            match *inst {
                Inst::Load { .. } => {
                    out.insert(at, inst.clone());
                    open = Some(at + 1);
                    continue;
                }
                Inst::Binary {
                    op: BinaryOp::Add,
                    dst,
                    a,
                    b,
                } => {
                    open = None;
                    if let Inst::Dropout {
                        dst: t, residual, ..
                    } = &mut out[at]
                    {
                        // (Opened only for an unrounded result read once.)
                        let other = if a == *t {
                            Some(b)
                        } else {
                            (b == *t).then_some(a)
                        };
                        if let Some(r) = other.filter(|&r| r != *t) {
                            *t = dst;
                            *residual = Some(r);
                            continue;
                        }
                    }
                }
                _ => open = None,
            }
        }
        let Inst::Chain {
            first: BinaryOp::Mul,
            second: BinaryOp::Mul,
            dst,
            a,
            b,
            c,
        } = *inst
        else {
            out.push(inst.clone());
            continue;
        };
        let masked = [(a, b), (b, a)]
            .into_iter()
            .find_map(|(x, m)| masks.get(&m).map(|&(u, keep)| (x, (m, u, keep))));
        match (masked, splat_of(c)) {
            (Some((x, (m, u, keep))), Some(scale)) if splat_of(x).is_none() => {
                joined.insert(m);
                out.push(Inst::Dropout {
                    dst,
                    x,
                    u,
                    keep,
                    scale,
                    residual: None,
                });
                if reads.get(&dst) == Some(&1) && !rounded.contains(&dst) {
                    open = Some(out.len() - 1);
                }
            }
            _ => out.push(inst.clone()),
        }
    }
    out.into_iter()
        .filter(|i| !matches!(*i, Inst::Compare { dst, .. } if joined.contains(&dst)))
        .collect()
}

/// Joins `x · x` read only by a sum (a variance's or rms_norm's sum of
/// squares) into that sum (`Epilogue::square`): one pass over the chunk
/// for the squares and their sum rather than two, and no register
/// written between them. The squares are still rounded to f32 before
/// they are added in f64, so the sum keeps its bits. On values, before
/// `allocate`.
fn square_sums(
    insts: Vec<Inst>,
    stores: &[(usize, ValueId, DType)],
    epilogues: &mut [Epilogue],
) -> Vec<Inst> {
    let reads = read_counts(&insts, stores, epilogues);
    let rounded = rounded_regs(&insts);
    let mut gone: FxHashSet<usize> = FxHashSet::default();
    for (k, inst) in insts.iter().enumerate() {
        let Inst::Binary {
            op: BinaryOp::Mul,
            dst,
            a,
            b,
        } = *inst
        else {
            continue;
        };
        // Read by one reduction (counted twice) and nothing else.
        if a != b || rounded.contains(&dst) || reads.get(&dst) != Some(&2) {
            continue;
        }
        if let Some(e) = epilogues
            .iter_mut()
            .find(|e| e.reg == dst && e.op == ReduceOp::Sum && !e.square)
        {
            e.reg = a;
            e.square = true;
            gone.insert(k);
        }
    }
    without(insts, &gone)
}

/// For each instruction, the sink it may write its result into instead
/// of its register: a computing instruction (one writing through
/// `split!` in `exec`) whose result a later `Store` writes out, with no
/// load between them (a parameter a pass stores over is loaded before the
/// store: see `LoopProgram::may_store_over`) and nothing rounding or
/// redefining the register. Whether it does is decided per chunk (an f32
/// sink, aligned); the `Store` then finds its register viewing the sink
/// and copies nothing.
fn writes_into(insts: &[Inst]) -> Vec<Option<usize>> {
    let mut into = vec![None; insts.len()];
    for (j, inst) in insts.iter().enumerate() {
        let Inst::Store { reg, sink } = *inst else {
            continue;
        };
        for i in (0..j).rev() {
            match insts[i] {
                Inst::Load { .. } | Inst::Uniform { .. } | Inst::Round { .. } => break,
                Inst::Store { .. } => continue,
                ref def if def.def() == Some(reg) => {
                    into[i] = Some(sink);
                    break;
                }
                _ => continue,
            }
        }
    }
    into
}

/// Stores each stored value right after the instructions computing it,
/// and gives each value a register only from its definition to its last
/// use, lowest free first (the compiler numbers one register per value);
/// the first `constants` instructions' registers are never reused. A
/// destination never shares a register with its operands. Returns the
/// instructions and the register count.
fn allocate(
    insts: Vec<Inst>,
    values: usize,
    constants: usize,
    stores: &mut [(usize, ValueId, DType)],
    epilogues: &mut [Epilogue],
) -> Result<(Vec<Inst>, usize)> {
    // Where each value is complete (after its rounding, if any).
    let mut complete = vec![usize::MAX; values];
    for (k, inst) in insts.iter().enumerate() {
        if let Some(d) = inst.def() {
            complete[d] = k;
        }
        if let Inst::Round { reg, .. } = inst {
            complete[*reg] = k;
        }
    }
    let mut store_after: FxHashMap<usize, Vec<usize>> = FxHashMap::default();
    for (sink, (reg, v, _)) in stores.iter().enumerate() {
        let k = complete[*reg];
        if k == usize::MAX {
            return Err(Error::Internal(format!(
                "stored value %{} is not computed by its pass",
                v.0
            )));
        }
        // A copy of a constant is stored at each chunk, after the
        // once-per-range loads.
        store_after
            .entry(k.max(constants.saturating_sub(1)))
            .or_default()
            .push(sink);
    }
    let mut with_stores = Vec::with_capacity(insts.len() + stores.len());
    for (k, inst) in insts.into_iter().enumerate() {
        with_stores.push(inst);
        for &sink in store_after.get(&k).into_iter().flatten() {
            with_stores.push(Inst::Store {
                reg: stores[sink].0,
                sink,
            });
        }
    }
    // Last use of each value; reductions read theirs after every chunk.
    let mut last = vec![None; values];
    for (k, inst) in with_stores.iter().enumerate() {
        for u in inst.uses() {
            last[u] = Some(k);
        }
    }
    for e in epilogues.iter() {
        last[e.reg] = Some(usize::MAX);
    }
    for inst in &with_stores[..constants] {
        if let Some(d) = inst.def() {
            last[d] = Some(usize::MAX);
        }
    }
    let mut phys = vec![usize::MAX; values];
    let mut free = std::collections::BTreeSet::new();
    let mut count = 0usize;
    for (k, inst) in with_stores.iter().enumerate() {
        for u in inst.uses() {
            if phys[u] == usize::MAX {
                return Err(Error::Internal(format!(
                    "register {u} read before it is set"
                )));
            }
        }
        // The destination is taken while the operands still hold theirs.
        if let Some(d) = inst.def() {
            phys[d] = free.pop_first().unwrap_or_else(|| {
                count += 1;
                count - 1
            });
        }
        for u in inst.uses() {
            if last[u] == Some(k) {
                free.insert(phys[u]);
            }
        }
        if let Some(d) = inst.def() {
            if last[d].is_none() {
                free.insert(phys[d]);
            }
        }
    }
    let insts = with_stores.iter().map(|i| i.renamed(|r| phys[r])).collect();
    for s in stores.iter_mut() {
        s.0 = phys[s.0];
    }
    for e in epilogues.iter_mut() {
        e.reg = phys[e.reg];
    }
    Ok((insts, count))
}

/// An i64 scalar operand: known when compiling, or read when the pass runs.
#[derive(Clone, Copy, Debug)]
enum Scalar {
    Const(u64),
    Value(ValueId),
}

#[derive(Clone, Debug)]
struct Epilogue {
    op: ReduceOp,
    reg: usize,
    out: ValueId,
    dtype: DType,
    /// Reduces the f32 squares of `reg` (a sum only): the multiply that
    /// made them joined into the reduction (`square_sums`).
    square: bool,
}

/// Graph parameters left in device memory, and graph outputs written
/// straight into device memory, by the loop engine (no staging copies).
#[derive(Default)]
pub struct DeviceIo<'a> {
    /// Parameters not read into host tensors up front.
    pub inputs: FxHashMap<ValueId, &'a DeviceTensor>,
    /// Results the loop engine stores directly (contiguous, used by no
    /// later kernel, aliasing no input but those in `overwritten`).
    pub outputs: FxHashMap<ValueId, &'a DeviceTensor>,
    /// Parameters whose memory a pass stores a result into while it reads
    /// them (an in-place update, see [`LoopProgram::may_store_over`]): a
    /// pass copies their chunks into registers, never reads them in place.
    pub overwritten: FxHashSet<ValueId>,
}

/// A value's data for a pass: host f32s, or f32s in device memory.
enum SourceData<'a> {
    Host(std::borrow::Cow<'a, [f32]>),
    /// `in_place`: a load may point its register at this memory (false
    /// while the pass also writes it).
    Device {
        ptr: *const f32,
        len: usize,
        in_place: bool,
    },
    None,
}

impl SourceData<'_> {
    fn len(&self) -> usize {
        match self {
            SourceData::Host(v) => v.len(),
            SourceData::Device { len, .. } => *len,
            SourceData::None => 0,
        }
    }

    /// Where `n` values from `at` already lie as aligned f32s, so a load
    /// may point its register there instead of copying them.
    #[inline(always)]
    fn direct(&self, at: usize, n: usize) -> Option<*const f32> {
        if n == 0 || at + n > self.len() {
            return None;
        }
        match self {
            SourceData::Host(v) => Some(v[at..at + n].as_ptr()),
            SourceData::Device { ptr, in_place, .. }
                if *in_place && ptr.align_offset(std::mem::align_of::<f32>()) == 0 =>
            {
                // SAFETY: at + n <= len (checked above), and the tensor's
                // `len` elements lie inside its segment (as in `read`).
                Some(unsafe { ptr.add(at) })
            }
            _ => None,
        }
    }

    /// Copy `out.len()` values from `at` with `step` (0: broadcast one value).
    #[inline(always)]
    fn read(&self, at: usize, step: usize, out: &mut [f32]) {
        let n = out.len();
        let last = if n == 0 { at } else { at + (n - 1) * step };
        if n == 0 || last >= self.len() {
            out.fill(f32::NAN); // unreachable for checked graphs; never reads out of bounds
            return;
        }
        match self {
            SourceData::Host(v) => {
                if step == 1 {
                    out.copy_from_slice(&v[at..at + n]);
                } else if step == 0 {
                    out.fill(v[at]);
                } else {
                    for (j, o) in out.iter_mut().enumerate() {
                        *o = v[at + j * step];
                    }
                }
            }
            SourceData::Device { ptr, .. } => {
                // SAFETY: [at, last] is inside the tensor's `len` elements
                // (checked above), which lie inside its buffer's segment
                // (checked when the tensor was described); the segment
                // stays allocated while the executing task holds the
                // buffer; stream order keeps writers away meanwhile.
                unsafe {
                    if step == 1 {
                        std::ptr::copy_nonoverlapping(ptr.add(at), out.as_mut_ptr(), n);
                    } else if step == 0 {
                        out.fill(ptr.add(at).read_unaligned());
                    } else {
                        for (j, o) in out.iter_mut().enumerate() {
                            *o = ptr.add(at + j * step).read_unaligned();
                        }
                    }
                }
            }
            SourceData::None => out.fill(0.0),
        }
    }
}

/// Where a stored value goes: a new host tensor, or device memory.
enum Target {
    Host(HostTensor),
    Device {
        ptr: *mut u8,
        len: usize,
    },
    /// Held per row block by a row-phase kernel (see `RowProgram`).
    Local,
}

/// Each source's strides and first element over the loop, and the
/// parameters gathered into host copies first (see `LoopProgram::layout`).
struct SourceLayout<'p> {
    /// The program's own strides, borrowed, where the source is read as
    /// the program assumes (nearly always).
    strides: Few<std::borrow::Cow<'p, [u64]>>,
    offsets: Few<u64>,
    staged: FxHashMap<ValueId, HostTensor>,
}

/// The sinks of a pass's stored values: the memory of each target, or of
/// `local` (f32 elements) for values held per row block.
fn sinks_of(
    outs: &mut [Target],
    stores: &[(usize, ValueId, DType)],
    local: &FxHashMap<ValueId, (*mut f32, usize)>,
) -> Few<Sink> {
    outs.iter_mut()
        .zip(stores)
        .map(|(o, (_, v, dtype))| match o {
            Target::Host(t) => Sink {
                ptr: t.bytes_mut().as_mut_ptr(),
                len: t.numel(),
                dtype: *dtype,
            },
            Target::Device { ptr, len } => Sink {
                ptr: *ptr,
                len: *len,
                dtype: *dtype,
            },
            // Registers hold values rounded to their dtype: f32 keeps them.
            Target::Local => {
                let (ptr, len) = local.get(v).copied().unwrap_or((std::ptr::null_mut(), 0));
                Sink {
                    ptr: ptr as *mut u8,
                    len,
                    dtype: DType::F32,
                }
            }
        })
        .collect()
}

fn red_sinks_of(red_outs: &mut [HostTensor], epilogues: &[Epilogue]) -> Few<Sink> {
    red_outs
        .iter_mut()
        .zip(epilogues)
        .map(|(t, e)| Sink {
            ptr: t.bytes_mut().as_mut_ptr(),
            len: t.numel(),
            dtype: e.dtype,
        })
        .collect()
}

/// The flat ranges [a, b) the threads of a pass over `n` elements take:
/// whole multiples of `unit`, one range per thread (see `worker_count`).
fn split(n: u64, unit: u64) -> Few<(u64, u64)> {
    let threads = worker_count(n) as u64;
    let per = n.div_ceil(unit.max(1)).div_ceil(threads).max(1) * unit.max(1);
    (0..threads)
        .map(|t| (t * per, ((t + 1) * per).min(n)))
        .filter(|(a, b)| a < b)
        .collect()
}

/// Run `f(thread, a, b)` for each range, on the thread pool when there
/// are several; a panic in one becomes an error.
fn run_split(
    ranges: &[(u64, u64)],
    f: impl Fn(usize, u64, u64) -> Result<()> + Sync,
) -> Result<()> {
    match ranges {
        [] => Ok(()),
        [(a, b)] => f(0, *a, *b),
        _ => {
            use rayon::prelude::*;
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                ranges
                    .par_iter()
                    .enumerate()
                    .map(|(t, &(a, b))| f(t, a, b))
                    .collect::<Result<Vec<()>>>()
            }))
            .unwrap_or_else(|_| Err(Error::Internal("a loop thread panicked".into())))
            .map(|_| ())
        }
    }
}

/// Where a pass writes one stored value: `len` elements of `dtype` at `ptr`.
struct Sink {
    ptr: *mut u8,
    len: usize,
    dtype: DType,
}

// SAFETY: threads of one pass write disjoint element ranges of a sink
// (their row ranges do not overlap), and the memory outlives the pass.
unsafe impl Sync for Sink {}
// SAFETY: the data behind a source is only read during the pass.
unsafe impl Sync for SourceData<'_> {}

/// Threads for a pass over `n` elements: one below 64K elements (handing
/// work to the pool costs more than it saves: a 32K-element add took 31 us
/// split and 17 us not), else `TPURT_HOST_THREADS`, by default one per
/// available core (at most 8).
fn worker_count(n: u64) -> usize {
    if n < (1 << 16) {
        return 1;
    }
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        // A bad setting was refused when the platform was made.
        host_threads(std::env::var("TPURT_HOST_THREADS").ok().as_deref(), cores)
            .unwrap_or(cores.clamp(1, 8))
    })
}

/// Whether some kernel of `graph` may split across threads: a node with
/// a result of at least the splitting size (products, attention and
/// reductions thread from about there too).
pub(crate) fn may_split(graph: &Graph) -> bool {
    graph.nodes().iter().any(|n| {
        n.outputs
            .iter()
            .chain(&n.inputs)
            .any(|v| worker_count(graph.value_type(*v).numel()) > 1)
    })
}

/// Threads for big passes: `TPURT_HOST_THREADS` (a whole number from 1 to
/// 256) when set, else one per core, at most 8.
pub(crate) fn host_threads(setting: Option<&str>, cores: usize) -> Result<usize> {
    match setting.map(str::trim).filter(|s| !s.is_empty()) {
        None => Ok(cores.clamp(1, 8)),
        Some(s) => match s.parse::<usize>() {
            Ok(t) if (1..=256).contains(&t) => Ok(t),
            _ => Err(Error::invalid(format!(
                "TPURT_HOST_THREADS={s:?} is not a thread count from 1 to 256"
            ))),
        },
    }
}

/// Where one chunk sits: its length, the rows it spans (a chunk crosses
/// rows when they are shorter than a chunk), its flat position, and the
/// pass's rng scalars.
#[derive(Clone, Copy)]
struct ChunkAt<'a> {
    len: usize,
    src: &'a [SourceData<'a>],
    strides: &'a [&'a [u64]],
    rows: &'a [RowPiece],
    /// Each source's offset of each piece's row, `rows.len()` × sources.
    row_bases: &'a [u64],
    flat0: u64,
    scalars: &'a FxHashMap<ValueId, u64>,
    /// The pass's stored outputs.
    sinks: &'a [Sink],
    /// Sinks written at flat position minus `shift` (see `Pass`).
    local_sinks: &'a [bool],
    shift: i64,
}

/// Part of a chunk inside one row: chunk elements `off..off + len` are
/// that row's columns `start..start + len`.
#[derive(Clone, Copy, Debug)]
struct RowPiece {
    off: usize,
    start: u64,
    len: usize,
}

/// One pass of a loop program over a range of rows.
struct Pass<'a> {
    program: &'a LoopProgram,
    /// i64 scalars the program reads (rng seeds and offsets).
    scalars: &'a FxHashMap<ValueId, u64>,
    src: &'a [SourceData<'a>],
    /// Each source's strides over the loop: the program's, or a strided
    /// parameter's own when it is read in place.
    strides: &'a [&'a [u64]],
    /// Each source's element at the loop's first position.
    offsets: &'a [u64],
    sinks: &'a [Sink],
    red_sinks: &'a [Sink],
    last: u64,
    /// Sources and sinks held per row block (a row-phase kernel's values
    /// passed between phases): indexed by flat position minus the shift
    /// given to `range_in`, not by flat position. Empty: none.
    local_sources: &'a [bool],
    local_sinks: &'a [bool],
}

/// A pass's register file and accumulators, reused across the ranges one
/// thread runs.
struct Registers {
    regs: Vec<f32>,
    /// Registers a load points straight at source memory (see `exec`).
    views: smallvec::SmallVec<[Option<*const f32>; 16]>,
    /// Registers that hold one value at every position, as that value:
    /// a binary op or comparison reads it as a scalar, anything else
    /// fills the register first (`materialize`).
    splats: smallvec::SmallVec<[Option<f32>; 16]>,
    acc: Few<f64>,
}

thread_local! {
    /// The register file a thread's last pass left behind, for its next
    /// one: a fresh one was a calloc and a memset of `registers * CHUNK`
    /// floats for every pass, most of a 16-element op's kernel time.
    static SPARE_REGS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

impl Registers {
    fn new(p: &LoopProgram) -> Self {
        // Every instruction writes its destination before any reads it
        // (see `allocate`), so what a reused register file held is never
        // read; only the new part of a grown one is zeroed.
        let mut regs = SPARE_REGS.with(|s| s.take());
        regs.resize(p.registers.max(1) * CHUNK, 0.0);
        Registers {
            regs,
            views: smallvec::smallvec![None; p.registers.max(1)],
            splats: smallvec::smallvec![None; p.registers.max(1)],
            acc: smallvec::smallvec![0.0; p.epilogues.len()],
        }
    }
}

impl Drop for Registers {
    fn drop(&mut self) {
        let regs = std::mem::take(&mut self.regs);
        SPARE_REGS.with(|s| {
            let spare = s.take();
            s.set(if spare.capacity() > regs.capacity() {
                spare
            } else {
                regs
            });
        });
    }
}

impl Pass<'_> {
    /// Flat positions [f0, f1) of the iteration space, row by row in
    /// chunks (f0 and f1 are multiples of the reduction length, so each
    /// call sees whole reductions).
    fn range(&self, f0: u64, f1: u64) -> Result<()> {
        self.range_in(f0, f1, 0, &mut Registers::new(self.program))
    }

    /// As `range`, with the registers given; local sources and sinks are
    /// addressed at flat position minus `shift`. Compiled for AVX-512 too
    /// (`cpu::dispatch`): the instructions' loops are the engine's
    /// arithmetic.
    fn range_in(&self, f0: u64, f1: u64, shift: i64, r: &mut Registers) -> Result<()> {
        #[cfg(target_arch = "x86_64")]
        if super::cpu::avx512() {
            // SAFETY: the CPU has the features `range_in_wide` is compiled
            // for (checked at run time by `avx512`).
            return unsafe { self.range_in_wide(f0, f1, shift, r) };
        }
        self.range_in_any(f0, f1, shift, r)
    }

    /// `range_in_any` compiled for AVX-512, as `cpu::dispatch` does, but a
    /// function of its own rather than a closure: the engine outgrew what
    /// the compiler would inline into `dispatch`'s wrapper, and the
    /// closure then ran without AVX-512.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
    fn range_in_wide(&self, f0: u64, f1: u64, shift: i64, r: &mut Registers) -> Result<()> {
        self.range_in_any(f0, f1, shift, r)
    }

    #[inline(always)]
    fn range_in_any(&self, f0: u64, f1: u64, shift: i64, r: &mut Registers) -> Result<()> {
        if f0 >= f1 || self.last == 0 {
            return Ok(());
        }
        let p = self.program;
        let rank = p.shape.len();
        let last = self.last;
        let Registers {
            regs,
            views,
            splats,
            acc,
        } = r;
        for (a, e) in acc.iter_mut().zip(&p.epilogues) {
            *a = identity(e.op);
        }
        let local = |flags: &[bool], i: usize| flags.get(i).copied().unwrap_or(false);
        // The multi-index of f0's row over all but the last dimension.
        let mut index: smallvec::SmallVec<[u64; 6]> =
            smallvec::smallvec![0u64; rank.saturating_sub(1)];
        let mut rest = f0 / last;
        for d in (0..index.len()).rev() {
            index[d] = rest % p.shape[d];
            rest /= p.shape[d];
        }
        let mut start = f0 % last;
        let mut flat = f0;
        // Chunks run across rows: with short rows (a head dimension of 32
        // under a transpose), one instruction per row would cost more in
        // dispatch than in arithmetic.
        let sources = p.sources.len();
        let mut rows: smallvec::SmallVec<[RowPiece; 8]> = smallvec::SmallVec::new();
        let mut row_bases: smallvec::SmallVec<[u64; 32]> = smallvec::SmallVec::new();
        // Each source's element at the current row's first column, kept
        // in step with the odometer below: recomputing it from the
        // multi-index for every row cost more than a short row's work.
        // (A splat's strides are empty: it steps by 0.)
        let mut bases: Few<u64> = self
            .strides
            .iter()
            .zip(self.offsets)
            .enumerate()
            .map(|(k, (strides, offset))| {
                let at = offset + index.iter().zip(*strides).map(|(i, s)| i * s).sum::<u64>();
                if local(self.local_sources, k) {
                    (at as i64 - shift) as u64
                } else {
                    at
                }
            })
            .collect();
        let (constants, body) = p.insts.split_at(p.constants);
        for inst in constants {
            if let Inst::Load { dst, src } = *inst {
                let out = &mut regs[dst * CHUNK..(dst + 1) * CHUNK];
                match &p.sources[src] {
                    Source::Splat(v) => out.fill(*v),
                    // All strides 0 (checked in `run`): one element everywhere.
                    Source::Strided { .. } => {
                        self.src[src].read(self.offsets[src] as usize, 0, out)
                    }
                    // Never loaded once (`constant` in `compile`).
                    Source::Pieces(_) => out.fill(f32::NAN),
                }
                // Filled, and read as a scalar where an op can.
                splats[dst] = Some(out[0]);
            }
        }
        while flat < f1 {
            let len = (f1 - flat).min(CHUNK as u64) as usize;
            rows.clear();
            row_bases.clear();
            let mut off = 0usize;
            while off < len {
                let take = ((last - start) as usize).min(len - off);
                rows.push(RowPiece {
                    off,
                    start,
                    len: take,
                });
                // Pushed one by one: a handful of bases, where
                // `extend_from_slice` called memcpy for each row piece.
                for &b in &bases {
                    row_bases.push(b);
                }
                off += take;
                start += take as u64;
                if start == last {
                    // Next row (odometer over all but the last dim), the
                    // bases stepping with it (wrapping: a local source's
                    // base may sit below its shift).
                    start = 0;
                    for d in (0..index.len()).rev() {
                        index[d] += 1;
                        if index[d] < p.shape[d] {
                            for (b, st) in bases.iter_mut().zip(self.strides) {
                                *b = b.wrapping_add(st.get(d).copied().unwrap_or(0));
                            }
                            break;
                        }
                        for (b, st) in bases.iter_mut().zip(self.strides) {
                            let step = st.get(d).copied().unwrap_or(0);
                            *b = b.wrapping_sub(step * (p.shape[d] - 1));
                        }
                        index[d] = 0;
                    }
                }
            }
            debug_assert_eq!(row_bases.len(), rows.len() * sources);
            let flat0 = flat;
            for (inst, &into) in body.iter().zip(&p.into[p.constants..]) {
                let at = ChunkAt {
                    len,
                    src: self.src,
                    strides: self.strides,
                    rows: &rows,
                    row_bases: &row_bases,
                    flat0,
                    scalars: self.scalars,
                    sinks: self.sinks,
                    local_sinks: self.local_sinks,
                    shift,
                };
                p.exec(inst, into, regs, views, splats, &at)?;
            }
            for (k, e) in p.epilogues.iter().enumerate() {
                materialize(regs, splats, e.reg);
                let r = register(regs, views, e.reg, len);
                // The chunk may span several reduction rows (short rows).
                let mut off = 0usize;
                while off < len {
                    let flat = flat0 + off as u64;
                    let to_end = (p.reduce_len - flat % p.reduce_len) as usize;
                    let take = to_end.min(len - off);
                    acc[k] = if e.square {
                        acc[k] + sum_sq_in_f64(&r[off..off + take])
                    } else {
                        accumulate(e.op, acc[k], &r[off..off + take])
                    };
                    off += take;
                    if (flat + take as u64).is_multiple_of(p.reduce_len) {
                        let outer = ((flat + take as u64) / p.reduce_len - 1) as usize;
                        let sink = &self.red_sinks[k];
                        store_device(sink.ptr, sink.len, sink.dtype, outer, &[acc[k] as f32]);
                        acc[k] = identity(e.op);
                    }
                }
            }
            flat += len as u64;
        }
        Ok(())
    }
}

/// The operand registers of an instruction writing register `dst`: those
/// below it and those above it in the register file, or views.
struct Operands<'a> {
    lo: &'a [f32],
    hi: &'a [f32],
    dst: usize,
    views: &'a [Option<*const f32>],
    len: usize,
}

impl<'a> Operands<'a> {
    #[inline(always)]
    fn get(&self, reg: usize) -> &'a [f32] {
        if let Some(p) = self.views[reg] {
            // SAFETY: as in `register`.
            return unsafe { std::slice::from_raw_parts(p, self.len) };
        }
        if reg < self.dst {
            &self.lo[reg * CHUNK..reg * CHUNK + self.len]
        } else {
            // `allocate` never gives an operand its destination's register.
            let at = (reg - self.dst - 1) * CHUNK;
            &self.hi[at..at + self.len]
        }
    }
}

/// Register `reg`'s values for the chunk: its view, or the register file.
#[inline(always)]
fn register<'a>(
    regs: &'a [f32],
    views: &[Option<*const f32>],
    reg: usize,
    len: usize,
) -> &'a [f32] {
    match views[reg] {
        // SAFETY: a view holds `len` aligned f32s of a source
        // (`SourceData::direct` checked the range) that outlives the pass
        // and that nothing writes during it: a result goes straight to
        // device memory only when it overlaps no input, and host values
        // are not written while read.
        Some(p) => unsafe { std::slice::from_raw_parts(p, len) },
        None => &regs[reg * CHUNK..reg * CHUNK + len],
    }
}

/// Fills register `reg` with its value if it is held as a splat.
#[inline(always)]
fn materialize(regs: &mut [f32], splats: &mut [Option<f32>], reg: usize) {
    if let Some(v) = splats[reg].take() {
        regs[reg * CHUNK..(reg + 1) * CHUNK].fill(v);
    }
}

/// A binary op's or comparison's operand: a register's values, or one
/// value for every position.
#[derive(Clone, Copy)]
enum Arg<'a> {
    Vals(&'a [f32]),
    Splat(f32),
}

/// A source's strides over a loop of `shape` when its value is a view
/// with element strides `own` rather than contiguous. `program` strides
/// the value's contiguous layout; each loop dimension that steps through
/// exactly one dimension of the value, within its extent, steps through
/// that dimension's own stride instead. None when a loop dimension spans
/// several (a reshape that merges dimensions) or two loop dimensions step
/// through one; the value is then gathered first.
fn strides_in_place(shape: &[u64], program: &[u64], dims: &[u64], own: &[u64]) -> Option<Vec<u64>> {
    let contiguous = kernels::contiguous_strides(dims);
    let mut used = vec![false; dims.len()];
    shape
        .iter()
        .zip(program)
        .map(|(&extent, &step)| {
            if step == 0 || extent == 1 {
                return Some(0);
            }
            let d = (0..dims.len()).find(|&d| dims[d] > 1 && contiguous[d] == step)?;
            if used[d] || extent > dims[d] {
                return None;
            }
            used[d] = true;
            Some(own[d])
        })
        .collect()
}

/// A loop group compiled for the host.
#[derive(Clone, Debug)]
pub struct LoopProgram {
    shape: Vec<u64>,
    /// Elements reduced per epilogue output (1 without epilogues).
    reduce_len: u64,
    sources: Vec<Source>,
    /// The first `constants` instructions load values that are the same
    /// at every position (scalars, broadcast or constant): they run once
    /// per range and their registers are never reused; the rest run per
    /// chunk.
    insts: Vec<Inst>,
    /// For each instruction, the sink it writes its result into where it
    /// can (`writes_into`): the `Store` of that result then copies nothing.
    into: Vec<Option<usize>>,
    constants: usize,
    registers: usize,
    /// Stored loop values: (register, value, dtype).
    stores: Vec<(usize, ValueId, DType)>,
    epilogues: Vec<Epilogue>,
    /// Folded loads that could not be expressed as strides: evaluated
    /// before the pass (node index).
    materialize: Vec<usize>,
}

fn contiguous(dims: &[u64]) -> Vec<u64> {
    kernels::contiguous_strides(dims)
}

/// The value of a chain of folded loads that ends in a scalar constant.
fn splat_through(graph: &Graph, producer: &[Option<usize>], v: ValueId) -> Option<f32> {
    let mut cur = v;
    loop {
        let p = producer[cur.0 as usize].filter(|p| is_load(graph, &graph.nodes()[*p]))?;
        match &graph.nodes()[p].prim {
            Prim::Constant { dtype, bytes, .. } => {
                return Some(crate::ir::literal::decode(*dtype, bytes, 0) as f32)
            }
            // Pieces of their own (`pieces_through`), even when constant.
            Prim::Concatenate { .. } => return None,
            _ => cur = *graph.nodes()[p].inputs.first()?,
        }
    }
}

/// How a loop of `shape` reads `v` through its chain of folded loads: the
/// stored value underneath, its element strides over the loop and the
/// element at the loop's first position. None when the chain is not a
/// strided view of that value (a reshape that merges dimensions a
/// transpose or slice left apart).
fn strides_through(
    graph: &Graph,
    producer: &[Option<usize>],
    v: ValueId,
    shape: &[u64],
) -> Option<(ValueId, Vec<u64>, u64)> {
    // Walk down to the stored value, remembering the loads on the way.
    let mut chain = Vec::new();
    let mut cur = v;
    while let Some(p) = producer[cur.0 as usize].filter(|p| is_load(graph, &graph.nodes()[*p])) {
        chain.push(p);
        cur = *graph.nodes()[p].inputs.first()?;
    }
    // Strides of `cur` as a contiguous tensor, then apply loads outward.
    let mut dims = graph.value_type(cur).dims.clone();
    let mut strides = contiguous(&dims);
    let mut offset = 0u64;
    // Where the current run of reshapes began: reshapes keep row-major
    // order, so a run is one reshape from there to where it ends (a
    // broadcast reshaped to another shape and back is the broadcast,
    // though the shape between has no strides).
    let mut run_start: Option<(Vec<u64>, Vec<u64>)> = None;
    for &p in chain.iter().rev() {
        let node = &graph.nodes()[p];
        let out = &graph.value_type(node.outputs[0]).dims;
        if !matches!(node.prim, Prim::Reshape { .. } | Prim::Convert { .. }) {
            if let Some((d0, s0)) = run_start.take() {
                strides = view_strides(&d0, &s0, &dims)?;
            }
        }
        match &node.prim {
            Prim::Reshape { .. } => {
                run_start.get_or_insert_with(|| (dims.clone(), strides.clone()));
            }
            // Read widened to f32, element for element.
            Prim::Convert { .. } => {}
            Prim::BroadcastInDim { dims: nd, mapping } => {
                let mut ns = vec![0u64; nd.len()];
                for (i, &m) in mapping.iter().enumerate() {
                    ns[m] = if dims[i] == 1 { 0 } else { strides[i] };
                }
                strides = ns;
            }
            Prim::Transpose { perm } => {
                strides = perm.iter().map(|&d| strides[d]).collect();
            }
            Prim::Slice { start, stride, .. } => {
                offset += start.iter().zip(&strides).map(|(a, s)| a * s).sum::<u64>();
                strides = strides.iter().zip(stride).map(|(s, k)| s * k).collect();
            }
            _ => return None,
        }
        dims = out.clone();
    }
    if let Some((d0, s0)) = run_start {
        strides = view_strides(&d0, &s0, &dims)?;
    }
    (dims == shape).then_some((cur, strides, offset))
}

/// How a loop of `shape` reads `v` when it is a concatenation along the
/// last dimension that loops read through (`fusion::is_load`): each
/// operand's columns and its source over those columns. None when an
/// operand is no strided view or scalar.
fn pieces_through(
    graph: &Graph,
    producer: &[Option<usize>],
    v: ValueId,
    shape: &[u64],
) -> Option<Vec<(u64, u64, Source)>> {
    let node = &graph.nodes()[producer[v.0 as usize]?];
    let Prim::Concatenate { dimension } = node.prim else {
        return None;
    };
    let last = shape.len().checked_sub(1)?;
    if dimension != last || graph.value_type(v).dims != shape || !is_load(graph, node) {
        return None;
    }
    let mut lo = 0;
    let mut parts = Vec::with_capacity(node.inputs.len());
    for &u in &node.inputs {
        let width = graph.value_type(u).dims[last];
        let mut part_shape = shape.to_vec();
        part_shape[last] = width;
        let source = match splat_through(graph, producer, u) {
            Some(x) => Source::Splat(x),
            None => {
                let (value, strides, offset) = strides_through(graph, producer, u, &part_shape)?;
                Source::Strided {
                    value,
                    strides,
                    offset,
                }
            }
        };
        parts.push((lo, lo + width, source));
        lo += width;
    }
    Some(parts)
}

/// The loads under `v` that loops read through, operands first.
fn loads_under(graph: &Graph, producer: &[Option<usize>], v: ValueId) -> Vec<usize> {
    let mut found = Vec::new();
    let mut stack = vec![v];
    while let Some(u) = stack.pop() {
        if let Some(p) = producer[u.0 as usize].filter(|&p| is_load(graph, &graph.nodes()[p])) {
            if !found.contains(&p) {
                found.push(p);
                stack.extend(&graph.nodes()[p].inputs);
            }
        }
    }
    // Nodes only read earlier values.
    found.sort_unstable();
    found
}

/// The strides that read a tensor of `dims` laid out with `strides` as a
/// tensor of `new` dims (the same elements in row-major order), or None
/// when no strides do: `new` would have to merge dimensions that are not
/// contiguous with each other.
fn view_strides(dims: &[u64], strides: &[u64], new: &[u64]) -> Option<Vec<u64>> {
    if dims.iter().product::<u64>() != new.iter().product::<u64>() {
        return None;
    }
    if new.contains(&0) {
        return Some(vec![0; new.len()]);
    }
    // Dimensions of extent one have no stride worth keeping.
    let old: Vec<(u64, u64)> = dims
        .iter()
        .zip(strides)
        .filter(|(d, _)| **d != 1)
        .map(|(d, s)| (*d, *s))
        .collect();
    let mut out = vec![0u64; new.len()];
    let (mut i, mut j) = (0, 0);
    while i < old.len() {
        // The longest run of old dimensions laid out one inside the next.
        let mut k = i;
        let mut extent = old[i].0;
        while k + 1 < old.len() && old[k].1 == old[k + 1].1 * old[k + 1].0 {
            k += 1;
            extent *= old[k].0;
        }
        // New dimensions that cover exactly that run step through it.
        let first = j;
        let mut covered = 1u64;
        while covered < extent {
            covered *= *new.get(j)?;
            j += 1;
        }
        if covered != extent {
            return None;
        }
        let mut step = old[k].1;
        for t in (first..j).rev() {
            out[t] = step;
            step *= new[t];
        }
        i = k + 1;
    }
    // Whatever is left can only be dimensions of extent one.
    new[j..].iter().all(|&d| d == 1).then_some(out)
}

impl LoopProgram {
    pub fn compile(graph: &Graph, kernel: &Kernel) -> Result<LoopProgram> {
        let KernelKind::Loop { shape, reduce_dims } = &kernel.kind else {
            return Err(Error::Internal("not a loop kernel".into()));
        };
        let nodes = graph.nodes();
        let producer = graph.producers();
        let in_group: FxHashSet<usize> = kernel.nodes.iter().copied().collect();
        let mut reg_of: FxHashMap<ValueId, usize> = FxHashMap::default();
        let mut registers = 0usize;
        let mut sources: Vec<Source> = Vec::new();
        let mut source_of: FxHashMap<ValueId, usize> = FxHashMap::default();
        let mut insts = Vec::new();
        let mut epilogues = Vec::new();
        let mut materialize = Vec::new();
        let reduce_len: u64 = shape[shape.len() - reduce_dims..].iter().product();

        for i in depth_first(graph, kernel, &producer) {
            let n = &nodes[i];
            // Operand registers, loading outside values on first use.
            let mut operand =
                |v: ValueId, insts: &mut Vec<Inst>, registers: &mut usize| -> Result<usize> {
                    if let Some(&r) = reg_of.get(&v) {
                        return Ok(r);
                    }
                    let src = if let Some(&s) = source_of.get(&v) {
                        s
                    } else {
                        let source = match splat_through(graph, &producer, v) {
                            Some(x) => Source::Splat(x),
                            None => match strides_through(graph, &producer, v, shape) {
                                Some((value, strides, offset)) => Source::Strided {
                                    value,
                                    strides,
                                    offset,
                                },
                                None => match pieces_through(graph, &producer, v, shape) {
                                    Some(parts) => {
                                        let mut at = Vec::with_capacity(parts.len());
                                        for (lo, hi, part) in parts {
                                            sources.push(part);
                                            at.push((lo, hi, sources.len() - 1));
                                        }
                                        Source::Pieces(at)
                                    }
                                    None => {
                                        // Evaluate the folded loads up front.
                                        for p in loads_under(graph, &producer, v) {
                                            if !materialize.contains(&p) {
                                                materialize.push(p);
                                            }
                                        }
                                        Source::Strided {
                                            value: v,
                                            strides: contiguous(shape),
                                            offset: 0,
                                        }
                                    }
                                },
                            },
                        };
                        sources.push(source);
                        source_of.insert(v, sources.len() - 1);
                        sources.len() - 1
                    };
                    let dst = *registers;
                    *registers += 1;
                    insts.push(Inst::Load { dst, src });
                    reg_of.insert(v, dst);
                    Ok(dst)
                };
            if let Prim::Rng { dtype, .. } = &n.prim {
                let scalar = |v: ValueId| match producer[v.0 as usize].map(|p| &nodes[p].prim) {
                    Some(Prim::Constant {
                        dtype: DType::I64,
                        bytes,
                        ..
                    }) if bytes.len() == 8 => {
                        Scalar::Const(u64::from_le_bytes(bytes[..8].try_into().unwrap_or([0; 8])))
                    }
                    _ => Scalar::Value(v),
                };
                let dst = registers;
                registers += 1;
                insts.push(Inst::Uniform {
                    dst,
                    seed: scalar(n.inputs[0]),
                    offset: scalar(n.inputs[1]),
                    dtype: *dtype,
                });
                reg_of.insert(n.outputs[0], dst);
                continue;
            }
            if let Prim::Reduce { op, .. } = &n.prim {
                let reg = operand(n.inputs[0], &mut insts, &mut registers)?;
                epilogues.push(Epilogue {
                    op: *op,
                    reg,
                    out: n.outputs[0],
                    dtype: graph.value_type(n.outputs[0]).dtype,
                    square: false,
                });
                continue;
            }
            let ins: Vec<usize> = n
                .inputs
                .iter()
                .map(|v| operand(*v, &mut insts, &mut registers))
                .collect::<Result<_>>()?;
            // A conversion to the operand's own dtype (a copy) is the
            // operand's register, and so is one to f32: registers hold
            // f32s, each already the value of its own dtype (a bool's
            // 0 or 1, an integer's value, a rounded half), so the f32 is
            // the value itself (a `Move` copied 4 KiB a chunk for a
            // dropout mask's conversion).
            if let Prim::Convert { to } = &n.prim {
                if graph.value_type(n.inputs[0]).dtype == *to || *to == DType::F32 {
                    reg_of.insert(n.outputs[0], ins[0]);
                    continue;
                }
            }
            let dst = registers;
            registers += 1;
            let inst = match &n.prim {
                Prim::Unary(op) => Inst::Unary {
                    op: *op,
                    dst,
                    a: ins[0],
                },
                Prim::Binary(op) => Inst::Binary {
                    op: *op,
                    dst,
                    a: ins[0],
                    b: ins[1],
                },
                Prim::Compare(op) => Inst::Compare {
                    op: *op,
                    dst,
                    a: ins[0],
                    b: ins[1],
                },
                Prim::Select => Inst::Select {
                    dst,
                    p: ins[0],
                    a: ins[1],
                    b: ins[2],
                },
                Prim::Clamp => Inst::Clamp {
                    dst,
                    lo: ins[0],
                    x: ins[1],
                    hi: ins[2],
                },
                Prim::Convert { .. } => Inst::Move { dst, a: ins[0] },
                other => return Err(Error::Internal(format!("{} in a loop group", other.name()))),
            };
            // A comparison's 0 or 1 is already a bool's value.
            let exact = matches!(inst, Inst::Compare { .. });
            insts.push(inst);
            let dtype = graph.value_type(n.outputs[0]).dtype;
            if dtype != DType::F32 && !(exact && dtype == DType::Bool) {
                insts.push(Inst::Round { reg: dst, dtype });
            }
            reg_of.insert(n.outputs[0], dst);
        }
        let mut stores: Vec<(usize, ValueId, DType)> = kernel
            .stores
            .iter()
            .filter(|v| {
                producer[v.0 as usize].is_some_and(|p| in_group.contains(&p))
                    && !epilogues.iter().any(|e: &Epilogue| e.out == **v)
            })
            .map(|v| (reg_of[v], *v, graph.value_type(*v).dtype))
            .collect();
        // Loads of one value for every position go first, once per range.
        let constant = |i: &Inst| match i {
            Inst::Load { src, .. } => match &sources[*src] {
                Source::Splat(_) => true,
                Source::Strided { strides, .. } => strides.iter().all(|&s| s == 0),
                Source::Pieces(_) => false,
            },
            _ => false,
        };
        let (mut ordered, rest): (Vec<Inst>, Vec<Inst>) = insts.into_iter().partition(constant);
        let constants = ordered.len();
        ordered.extend(rest);
        let splats: FxHashMap<usize, f32> = ordered[..constants]
            .iter()
            .filter_map(|i| match *i {
                Inst::Load { dst, src } => match sources[src] {
                    Source::Splat(v) => Some((dst, v)),
                    Source::Strided { .. } | Source::Pieces(_) => None,
                },
                _ => None,
            })
            .collect();
        let ordered = fuse_gelu(ordered, |r| splats.get(&r).copied(), &stores, &epilogues);
        let ordered = gelu_bias(ordered, &stores, &epilogues);
        let ordered = fuse_silu(ordered, |r| splats.get(&r).copied(), &stores, &epilogues);
        let ordered = silu_scale(ordered, &stores, &epilogues);
        let ordered = chain_binaries(ordered, &stores, &epilogues);
        let ordered = fuse_dropout(ordered, |r| splats.get(&r).copied(), &stores, &epilogues);
        let ordered = square_sums(ordered, &stores, &mut epilogues);
        let (insts, registers) =
            allocate(ordered, registers, constants, &mut stores, &mut epilogues)?;
        let into = writes_into(&insts);
        Ok(LoopProgram {
            shape: shape.clone(),
            reduce_len,
            sources,
            insts,
            into,
            constants,
            registers,
            stores,
            epilogues,
            materialize,
        })
    }

    /// Whether this pass may store `out` into the memory of parameter
    /// `param` (the same layout) while it reads `param`: it reads each
    /// element of `param` only at the position where it stores that
    /// element of `out` (element for element, nothing gathered first, no
    /// reduction), and loads it in every chunk before that store. Threads
    /// take disjoint positions, so none sees another's store.
    pub fn may_store_over(&self, out: ValueId, param: ValueId) -> bool {
        let Some(sink) = self.stores.iter().position(|s| s.1 == out) else {
            return false;
        };
        if !self.epilogues.is_empty() || !self.materialize.is_empty() {
            return false;
        }
        let in_order = contiguous(&self.shape);
        let reads: Vec<usize> = (0..self.sources.len())
            .filter(
                |&i| matches!(&self.sources[i], Source::Strided { value, .. } if *value == param),
            )
            .collect();
        // A piece of a concatenation reads its columns shifted.
        let pieced = self.sources.iter().any(|s| match s {
            Source::Pieces(parts) => parts.iter().any(|(_, _, src)| reads.contains(src)),
            _ => false,
        });
        let element_for_element = !pieced
            && reads.iter().all(|&i| match &self.sources[i] {
                Source::Strided {
                    strides, offset, ..
                } => {
                    *offset == 0
                        && (0..self.shape.len())
                            .all(|d| self.shape[d] == 1 || strides[d] == in_order[d])
                }
                Source::Splat(_) | Source::Pieces(_) => false,
            });
        let stored = self
            .insts
            .iter()
            .position(|i| matches!(i, Inst::Store { sink: k, .. } if *k == sink));
        let last_load = self
            .insts
            .iter()
            .rposition(|i| matches!(i, Inst::Load { src, .. } if reads.contains(src)));
        element_for_element
            && match (stored, last_load) {
                (Some(st), Some(ld)) => ld < st,
                (Some(_), None) => true,
                (None, _) => false,
            }
    }

    /// Run the pass: read sources from `values` (or device memory for the
    /// parameters in `io`), write stored values into `values` (or device
    /// memory for the results in `io`) and epilogue results into `values`.
    pub fn run(
        &self,
        graph: &Graph,
        values: &mut [Option<HostTensor>],
        io: &DeviceIo<'_>,
    ) -> Result<()> {
        for &p in &self.materialize {
            eval_node(graph, p, values, io)?;
        }
        let n: u64 = self.shape.iter().product();
        let mut outs = self.targets(graph, io, &Default::default());
        let mut red_outs = self.reduction_targets(graph);
        let layout = self.layout(values, io)?;
        {
            let src_data = self.source_data(values, &layout, io, &FxHashMap::default())?;
            let scalars = self.scalars(values, io)?;
            let sinks = sinks_of(&mut outs, &self.stores, &FxHashMap::default());
            let red_sinks = red_sinks_of(&mut red_outs, &self.epilogues);
            if !self.copy_as_strided(&layout, &src_data, &sinks)? {
                let strides: Few<&[u64]> = layout.strides.iter().map(|s| &s[..]).collect();
                let pass = Pass {
                    program: self,
                    scalars: &scalars,
                    src: &src_data,
                    strides: &strides,
                    offsets: &layout.offsets,
                    sinks: &sinks,
                    red_sinks: &red_sinks,
                    last: self.last(),
                    local_sources: &[],
                    local_sinks: &[],
                };
                run_split(&split(n, self.split_unit()), |_, a, b| pass.range(a, b))?;
            }
        }
        self.finish(values, io, outs, red_outs)
    }

    /// Whether the pass only loads one stored value and stores it as an
    /// f32 result (see `copy_as_strided`).
    fn is_copy(&self) -> bool {
        self.epilogues.is_empty()
            && self.constants == 0
            && matches!(self.sources[..], [Source::Strided { .. }])
            && matches!(self.stores[..], [(_, _, DType::F32)])
            && matches!(
                self.insts[..],
                [Inst::Load { dst, src: 0 }, Inst::Store { reg, sink: 0 }] if dst == reg
            )
    }

    /// A pass that only moves one value into an f32 result of another
    /// layout (a transposed view made contiguous: attention's heads going
    /// in and out, rotary halves) runs as one strided copy, whole runs of
    /// the innermost dimension at a time: through the loop, a chunk of
    /// short rows (32 elements under a head transpose) cost more in row
    /// bookkeeping than in copying. Returns whether it did; not when the
    /// result's memory overlaps the source's.
    fn copy_as_strided(
        &self,
        layout: &SourceLayout<'_>,
        src: &[SourceData<'_>],
        sinks: &[Sink],
    ) -> Result<bool> {
        let (true, [data], [sink], [strides], [offset]) = (
            self.is_copy(),
            src,
            sinks,
            &layout.strides[..],
            &layout.offsets[..],
        ) else {
            return Ok(false);
        };
        let from: &[f32] = match data {
            SourceData::Host(v) => v,
            // SAFETY: the tensor's `len` f32 elements lie inside its
            // buffer's segment (checked when the tensor was described),
            // which stays allocated while the executing task holds it, and
            // stream order keeps writers away meanwhile (as in `read`).
            SourceData::Device { ptr, len, .. } if ptr.align_offset(4) == 0 => unsafe {
                std::slice::from_raw_parts(*ptr, *len)
            },
            _ => return Ok(false),
        };
        let n: u64 = self.shape.iter().product();
        let into = sink.ptr as *const u8;
        let (lo, hi) = (
            from.as_ptr() as *const u8,
            from.as_ptr_range().end as *const u8,
        );
        if sink.ptr.is_null()
            || sink.len as u64 != n
            || (into < hi && into.wrapping_add(sink.len * 4) > lo)
        {
            return Ok(false);
        }
        // SAFETY: a sink is `len` f32 elements of memory this pass alone
        // writes (see `exec`'s `split!`), disjoint from the source (checked
        // above).
        let out = unsafe { std::slice::from_raw_parts_mut(sink.ptr, sink.len * 4) };
        let dims: Vec<usize> = self.shape.iter().map(|&d| d as usize).collect();
        // Strides are two's complement u64s (a reversed view steps back).
        let from_strides: Vec<isize> = strides.iter().map(|&s| s as i64 as isize).collect();
        let to_strides: Vec<isize> = contiguous(&self.shape)
            .into_iter()
            .map(|s| s as isize)
            .collect();
        kernels::StridedCopy::new(
            &dims,
            &from_strides,
            &to_strides,
            *offset as i64 as isize,
            0,
        )
        .run_bytes(4, bytemuck::cast_slice(from), out)?;
        Ok(true)
    }

    /// What threads split a pass into: whole reductions; a pass without
    /// one splits anywhere (at chunk boundaries), so one long row splits too.
    fn split_unit(&self) -> u64 {
        if self.epilogues.is_empty() {
            CHUNK as u64
        } else {
            self.reduce_len.max(1)
        }
    }

    /// The length of the loop's rows (its last dimension; 1 for a scalar).
    fn last(&self) -> u64 {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Where each stored value goes: device memory for the results in
    /// `io.outputs`, nothing for those in `local` (held per row block),
    /// else a new host tensor.
    fn targets(
        &self,
        graph: &Graph,
        io: &DeviceIo<'_>,
        local: &FxHashSet<ValueId>,
    ) -> Outs<Target> {
        self.stores
            .iter()
            .map(|(_, v, _)| {
                if local.contains(v) {
                    return Target::Local;
                }
                match io
                    .outputs
                    .get(v)
                    .and_then(|t| kernels::host_ptr(t).map(|p| (p, t)))
                {
                    Some((ptr, t)) => Target::Device {
                        ptr,
                        len: t.numel() as usize,
                    },
                    // The pass stores every element.
                    None => Target::Host(HostTensor::for_overwrite(graph.value_type(*v).clone())),
                }
            })
            .collect()
    }

    fn reduction_targets(&self, graph: &Graph) -> Outs<HostTensor> {
        self.epilogues
            .iter()
            .map(|e| HostTensor::zeros(graph.value_type(e.out).clone()))
            .collect()
    }

    /// Each source's strides and first element: the program's, or a
    /// strided f32 parameter's own (a transposed or expanded view is read
    /// in place). Parameters read neither way are staged: gathered into a
    /// contiguous host copy, converted to f32 once.
    fn layout(&self, values: &[Option<HostTensor>], io: &DeviceIo<'_>) -> Result<SourceLayout<'_>> {
        use std::borrow::Cow;
        let mut strides: Few<Cow<'_, [u64]>> = self
            .sources
            .iter()
            .map(|s| match s {
                Source::Strided { strides, .. } => Cow::Borrowed(&strides[..]),
                Source::Splat(_) | Source::Pieces(_) => Cow::Borrowed(&[][..]),
            })
            .collect();
        let mut offsets: Few<u64> = self
            .sources
            .iter()
            .map(|s| match s {
                Source::Strided { offset, .. } => *offset,
                Source::Splat(_) | Source::Pieces(_) => 0,
            })
            .collect();
        let mut staged: FxHashMap<ValueId, HostTensor> = FxHashMap::default();
        let mut in_place: FxHashMap<ValueId, Vec<(usize, Vec<u64>, u64)>> = FxHashMap::default();
        for (i, s) in self.sources.iter().enumerate() {
            let Source::Strided {
                value,
                strides: st,
                offset,
            } = s
            else {
                continue;
            };
            if values[value.0 as usize].is_some() || staged.contains_key(value) {
                continue;
            }
            let Some(t) = io.inputs.get(value) else {
                continue;
            };
            if t.dtype == DType::F32 && kernels::host_ptr(t).is_some() {
                // A view with no elements is never read (its first
                // element's index would divide by its zero-size dimension).
                if t.is_contiguous() || t.numel() == 0 {
                    continue;
                }
                if let Some(own) = strides_in_place(&self.shape, st, t.dims(), &t.layout.strides) {
                    // The first element's index, from the contiguous
                    // layout the program assumes to the view's own.
                    let contiguous = kernels::contiguous_strides(t.dims());
                    let own_offset = (0..t.dims().len())
                        .map(|d| (offset / contiguous[d]) % t.dims()[d] * t.layout.strides[d])
                        .sum();
                    in_place
                        .entry(*value)
                        .or_default()
                        .push((i, own, own_offset));
                    continue;
                }
            }
            in_place.remove(value);
            staged.insert(*value, read_tensor(t)?);
        }
        for (value, uses) in in_place {
            if staged.contains_key(&value) {
                continue;
            }
            for (i, own, own_offset) in uses {
                strides[i] = Cow::Owned(own);
                offsets[i] = own_offset;
            }
        }
        for inst in &self.insts[..self.constants] {
            if let Inst::Load { src, .. } = inst {
                if strides[*src].iter().any(|&s| s != 0) {
                    return Err(Error::Internal(format!(
                        "loop source {src} is loaded once but has strides {:?}",
                        strides[*src]
                    )));
                }
            }
        }
        Ok(SourceLayout {
            strides,
            offsets,
            staged,
        })
    }

    /// Each source's data as f32s: a host value (converted once if not
    /// f32), a staged copy, device memory, or memory of another phase of
    /// the same kernel (`chain`: f32 elements from a pointer).
    fn source_data<'a>(
        &self,
        values: &'a [Option<HostTensor>],
        layout: &'a SourceLayout<'_>,
        io: &DeviceIo<'a>,
        chain: &FxHashMap<ValueId, (*const f32, usize)>,
    ) -> Result<Few<SourceData<'a>>> {
        self.sources
            .iter()
            .map(|s| match s {
                Source::Splat(_) | Source::Pieces(_) => Ok(SourceData::None),
                Source::Strided { value, .. } => {
                    if let Some(&(ptr, len)) = chain.get(value) {
                        return Ok(SourceData::Device {
                            ptr,
                            len,
                            in_place: true,
                        });
                    }
                    if let Some(t) = values[value.0 as usize]
                        .as_ref()
                        .or_else(|| layout.staged.get(value))
                    {
                        return Ok(SourceData::Host(t.as_f32s()));
                    }
                    let t = io.inputs.get(value).ok_or_else(|| {
                        Error::Internal(format!("loop source %{} is not stored", value.0))
                    })?;
                    let ptr = kernels::host_ptr(t).ok_or_else(|| {
                        Error::Internal("device source without host memory".into())
                    })?;
                    // Elements from the first to the last the view reaches.
                    let reach = t.layout.byte_span().map_or(0, |(lo, hi)| (hi - lo) / 4);
                    Ok(SourceData::Device {
                        ptr: ptr as *const f32,
                        len: reach as usize,
                        in_place: !io.overwritten.contains(value),
                    })
                }
            })
            .collect()
    }

    /// Rng seeds and offsets computed by other kernels or passed in.
    fn scalars(
        &self,
        values: &[Option<HostTensor>],
        io: &DeviceIo<'_>,
    ) -> Result<FxHashMap<ValueId, u64>> {
        let mut scalars: FxHashMap<ValueId, u64> = FxHashMap::default();
        for inst in &self.insts {
            if let Inst::Uniform { seed, offset, .. } = inst {
                for s in [seed, offset] {
                    if let Scalar::Value(v) = s {
                        let t = match values[v.0 as usize].as_ref() {
                            Some(t) => t.clone(),
                            None => match io.inputs.get(v) {
                                Some(d) => read_tensor(d)?,
                                None => {
                                    return Err(Error::Internal(format!(
                                        "rng scalar %{} missing",
                                        v.0
                                    )))
                                }
                            },
                        };
                        scalars.insert(*v, t.get_f64(0) as i64 as u64);
                    }
                }
            }
        }
        Ok(scalars)
    }

    /// Put the stored values and reductions into `values` (empty
    /// iteration space: reductions give their identity). A value stored
    /// straight into an output's device memory becomes a view of that
    /// memory, for the kernels that read it later (a copy where the
    /// memory is not aligned for a view).
    fn finish(
        &self,
        values: &mut [Option<HostTensor>],
        io: &DeviceIo<'_>,
        outs: Outs<Target>,
        red_outs: Outs<HostTensor>,
    ) -> Result<()> {
        let n: u64 = self.shape.iter().product();
        let mut red_outs = red_outs;
        if n == 0 || self.last() == 0 {
            for (k, e) in self.epilogues.iter().enumerate() {
                let m = red_outs[k].numel();
                for j in 0..m {
                    store(&mut red_outs[k], e.dtype, j, &[identity(e.op) as f32]);
                }
            }
        }
        for ((_, v, _), t) in self.stores.iter().zip(outs) {
            match t {
                Target::Host(t) => values[v.0 as usize] = Some(t),
                Target::Device { .. } => {
                    if let Some(out) = io.outputs.get(v) {
                        // SAFETY: the executable hands a pass an output
                        // that overlaps no other output, and no input but
                        // those it may overwrite (which no kernel reads
                        // after this one: `store_over`); nothing writes it
                        // again during `execute`, and the task holds its
                        // buffer while `values` lives.
                        let view = unsafe { HostTensor::borrow_device(out) };
                        values[v.0 as usize] = Some(match view {
                            Some(view) => view,
                            None => read_tensor(out)?,
                        });
                    }
                }
                Target::Local => {}
            }
        }
        for (e, t) in self.epilogues.iter().zip(red_outs) {
            values[e.out.0 as usize] = Some(t);
        }
        Ok(())
    }

    #[inline(always)]
    fn exec(
        &self,
        inst: &Inst,
        into: Option<usize>,
        regs: &mut [f32],
        views: &mut [Option<*const f32>],
        splats: &mut [Option<f32>],
        at: &ChunkAt<'_>,
    ) -> Result<()> {
        let ChunkAt {
            len,
            src,
            strides,
            rows,
            row_bases,
            flat0,
            scalars,
            sinks,
            local_sinks,
            shift,
        } = *at;
        // Split the register file so a destination and its operands can be
        // borrowed at once (an operand's register is never the
        // destination's: see `allocate`).
        // Operands held as splats are filled first, except for the ops
        // that read them as scalars.
        let scalar_operands = matches!(
            inst,
            Inst::Binary { .. } | Inst::Chain { .. } | Inst::Compare { .. }
        );
        if !scalar_operands {
            match *inst {
                Inst::Unary { a, .. } | Inst::Move { a, .. } => materialize(regs, splats, a),
                Inst::Gelu { x, bias, .. } => {
                    for r in [x].into_iter().chain(bias) {
                        materialize(regs, splats, r);
                    }
                }
                Inst::Silu { x, scale, .. } => {
                    for r in [x].into_iter().chain(scale) {
                        materialize(regs, splats, r);
                    }
                }
                Inst::SiluGrad { x, t, .. } => {
                    for r in [x, t] {
                        materialize(regs, splats, r);
                    }
                }
                Inst::Select { p, a, b, .. } => {
                    for r in [p, a, b] {
                        materialize(regs, splats, r);
                    }
                }
                Inst::Dropout { x, u, .. } => {
                    for r in [x, u] {
                        materialize(regs, splats, r);
                    }
                }
                Inst::Clamp { lo, x, hi, .. } => {
                    for r in [lo, x, hi] {
                        materialize(regs, splats, r);
                    }
                }
                Inst::Store { reg, .. } | Inst::Round { reg, .. } => materialize(regs, splats, reg),
                _ => {}
            }
        }
        // Where this chunk's values of the sink the result is stored into
        // lie, when they are f32s the instruction may write in place of its
        // register (`writes_into`).
        // (Also the address of that first value as an f32, meaningful only
        // for an f32 sink.)
        let sink_at = |k: usize| {
            let s = &sinks[k];
            let at = if local_sinks.get(k).copied().unwrap_or(false) {
                (flat0 as i64 - shift) as usize
            } else {
                flat0 as usize
            };
            (s, at, (s.ptr as *mut f32).wrapping_add(at))
        };
        let direct: Option<*mut f32> = into.and_then(|k| {
            let (s, at, p) = sink_at(k);
            (s.dtype == DType::F32
                && at + len <= s.len
                && p.align_offset(std::mem::align_of::<f32>()) == 0)
                .then_some(p)
        });
        macro_rules! split {
            ($dst:expr) => {{
                views[$dst] = None;
                splats[$dst] = None;
                let (lo, rest) = regs.split_at_mut($dst * CHUNK);
                let (mid, hi) = rest.split_at_mut(CHUNK);
                let out: &mut [f32] = match direct {
                    // SAFETY: [at, at + len) lies inside the sink's `len`
                    // f32 elements (checked above), aligned, in memory
                    // that outlives the pass; this thread alone writes
                    // these positions (threads take disjoint ranges), and
                    // no operand views them: a sink is a new host tensor,
                    // a row block's slot of a value no source of this pass
                    // is, or an output aliasing no input but those a pass
                    // copies rather than views (`DeviceIo::overwritten`).
                    Some(p) => unsafe { std::slice::from_raw_parts_mut(p, len) },
                    None => &mut mid[..len],
                };
                (
                    Operands {
                        lo,
                        hi,
                        dst: $dst,
                        views: &*views,
                        len,
                    },
                    out,
                )
            }};
        }
        match *inst {
            Inst::Load { dst, src: s } => {
                views[dst] = None;
                splats[dst] = None;
                let out = &mut regs[dst * CHUNK..dst * CHUNK + len];
                match &self.sources[s] {
                    Source::Splat(v) => out.fill(*v),
                    Source::Pieces(parts) => {
                        let sources = self.sources.len();
                        for (i, r) in rows.iter().enumerate() {
                            let (c0, c1) = (r.start, r.start + r.len as u64);
                            for &(lo, hi, ps) in parts {
                                let (a, b) = (c0.max(lo), c1.min(hi));
                                if a >= b {
                                    continue;
                                }
                                let at = r.off + (a - c0) as usize;
                                let piece = &mut out[at..at + (b - a) as usize];
                                match &self.sources[ps] {
                                    Source::Splat(v) => piece.fill(*v),
                                    Source::Strided { .. } => {
                                        let step = *strides[ps].last().unwrap_or(&0);
                                        let base = row_bases[i * sources + ps] + (a - lo) * step;
                                        src[ps].read(base as usize, step as usize, piece);
                                    }
                                    // Parts are never concatenations (`compile`).
                                    Source::Pieces(_) => piece.fill(f32::NAN),
                                }
                            }
                        }
                    }
                    Source::Strided { .. } => {
                        let step = *strides[s].last().unwrap_or(&0);
                        let sources = self.sources.len();
                        let base =
                            |i: usize| (row_bases[i * sources + s] + rows[i].start * step) as usize;
                        // A chunk that is one contiguous run of f32s in the
                        // source is read where it lies.
                        let first = base(0);
                        let one_run = step == 1
                            && rows
                                .iter()
                                .enumerate()
                                .all(|(i, r)| base(i) == first + r.off);
                        match one_run.then(|| src[s].direct(first, len)).flatten() {
                            Some(p) => views[dst] = Some(p),
                            // One value broadcast along the chunk's one
                            // row (a row's mean in a layer_norm): a splat,
                            // not a fill.
                            None if step == 0 && rows.len() == 1 => {
                                let mut v = [0f32];
                                src[s].read(base(0), 0, &mut v);
                                splats[dst] = Some(v[0]);
                            }
                            None => {
                                for (i, r) in rows.iter().enumerate() {
                                    let piece = &mut out[r.off..r.off + r.len];
                                    src[s].read(base(i), step as usize, piece);
                                }
                            }
                        }
                    }
                }
            }
            Inst::Unary { op, dst, a } => {
                let (ops, out) = split!(dst);
                unary(op, out, ops.get(a));
            }
            Inst::Move { dst, a } => {
                let (ops, out) = split!(dst);
                out.copy_from_slice(ops.get(a));
            }
            Inst::Silu { dst, x, scale } => {
                let (ops, out) = split!(dst);
                vmath::silu_run(out, ops.get(x), scale.map(|u| ops.get(u)));
            }
            Inst::SiluGrad { dst, x, t } => {
                let (ops, out) = split!(dst);
                vmath::silu_grad_run(out, ops.get(x), ops.get(t));
            }
            Inst::Gelu { dst, x, bias, c, h } => {
                let (ops, out) = split!(dst);
                vmath::gelu_run(out, ops.get(x), bias.map(|b| ops.get(b)), c, h);
            }
            Inst::Binary { op, dst, a, b } => {
                let (sa, sb) = (splats[a], splats[b]);
                let (ops, out) = split!(dst);
                let x = sa.map_or_else(|| Arg::Vals(ops.get(a)), Arg::Splat);
                let y = sb.map_or_else(|| Arg::Vals(ops.get(b)), Arg::Splat);
                binary(op, out, x, y);
            }
            Inst::Chain {
                first,
                second,
                dst,
                a,
                b,
                c,
            } => {
                let (sa, sb, sc) = (splats[a], splats[b], splats[c]);
                let (ops, out) = split!(dst);
                let x = sa.map_or_else(|| Arg::Vals(ops.get(a)), Arg::Splat);
                let y = sb.map_or_else(|| Arg::Vals(ops.get(b)), Arg::Splat);
                let z = sc.map_or_else(|| Arg::Vals(ops.get(c)), Arg::Splat);
                chain(first, second, out, x, y, z);
            }
            Inst::Compare { op, dst, a, b } => {
                let (sa, sb) = (splats[a], splats[b]);
                let (ops, out) = split!(dst);
                let x = sa.map_or_else(|| Arg::Vals(ops.get(a)), Arg::Splat);
                let y = sb.map_or_else(|| Arg::Vals(ops.get(b)), Arg::Splat);
                compare(op, out, x, y);
            }
            Inst::Dropout {
                dst,
                x,
                u,
                keep,
                scale,
                residual,
            } => {
                let sr = residual.and_then(|r| splats[r]);
                let (ops, out) = split!(dst);
                let (x, u) = (ops.get(x), ops.get(u));
                let mask = |u: f32| if u < keep { 1.0 } else { 0.0 };
                match residual.map(|r| sr.map_or_else(|| Arg::Vals(ops.get(r)), Arg::Splat)) {
                    None => {
                        for ((o, &v), &w) in out.iter_mut().zip(x).zip(u) {
                            *o = (v * mask(w)) * scale;
                        }
                    }
                    Some(Arg::Vals(r)) => {
                        for (((o, &v), &w), &r) in out.iter_mut().zip(x).zip(u).zip(r) {
                            *o = (v * mask(w)) * scale + r;
                        }
                    }
                    Some(Arg::Splat(r)) => {
                        for ((o, &v), &w) in out.iter_mut().zip(x).zip(u) {
                            *o = (v * mask(w)) * scale + r;
                        }
                    }
                }
            }
            Inst::Select { dst, p, a, b } => {
                let (ops, out) = split!(dst);
                let (pr, x, y) = (ops.get(p), ops.get(a), ops.get(b));
                for j in 0..len {
                    out[j] = if pr[j] != 0.0 { x[j] } else { y[j] };
                }
            }
            Inst::Clamp {
                dst,
                lo: l,
                x,
                hi: h,
            } => {
                let (ops, out) = split!(dst);
                let (a, v, b) = (ops.get(l), ops.get(x), ops.get(h));
                for j in 0..len {
                    out[j] = if v[j].is_nan() {
                        v[j]
                    } else {
                        b[j].min(a[j].max(v[j]))
                    };
                    if a[j] > b[j] {
                        out[j] = b[j];
                    }
                }
            }
            Inst::Uniform {
                dst,
                seed,
                offset,
                dtype,
            } => {
                let get = |s: Scalar| match s {
                    Scalar::Const(v) => Ok(v),
                    Scalar::Value(v) => scalars
                        .get(&v)
                        .copied()
                        .ok_or_else(|| Error::Internal(format!("rng scalar %{} unknown", v.0))),
                };
                let (seed, offset) = (get(seed)?, get(offset)?);
                views[dst] = None;
                splats[dst] = None;
                let out = &mut regs[dst * CHUNK..dst * CHUNK + len];
                kernels::rng::uniform_f32_run(seed, offset, flat0, out);
                // Half precision: round once, staying below one (as `rng`).
                match dtype {
                    DType::BF16 => out.iter_mut().for_each(|v| {
                        let h = bf16::from_f32(*v);
                        *v = if h.to_f32() < 1.0 {
                            h
                        } else {
                            bf16::from_bits(bf16::ONE.to_bits() - 1)
                        }
                        .to_f32();
                    }),
                    DType::F16 => out.iter_mut().for_each(|v| {
                        let h = f16::from_f32(*v);
                        *v = if h.to_f32() < 1.0 {
                            h
                        } else {
                            f16::from_bits(f16::ONE.to_bits() - 1)
                        }
                        .to_f32();
                    }),
                    _ => {}
                }
            }
            Inst::Store { reg, sink } => {
                let (s, at, p) = sink_at(sink);
                // Written there already (`direct`): nothing to copy.
                if s.dtype == DType::F32 && views[reg] == Some(p as *const f32) {
                    return Ok(());
                }
                let vals = register(regs, views, reg, len);
                store_device(s.ptr, s.len, s.dtype, at, vals);
            }
            Inst::Round { reg, dtype } => {
                // Rounds follow computing instructions, never loads; a view
                // would be copied in first all the same.
                if let Some(p) = views[reg].take() {
                    // SAFETY: as in `register`.
                    let v = unsafe { std::slice::from_raw_parts(p, len) };
                    regs[reg * CHUNK..reg * CHUNK + len].copy_from_slice(v);
                }
                let r = &mut regs[reg * CHUNK..reg * CHUNK + len];
                match dtype {
                    DType::BF16 => r.iter_mut().for_each(|v| *v = bf16::from_f32(*v).to_f32()),
                    DType::F16 => r.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32()),
                    DType::Bool => r.iter_mut().for_each(|v| *v = (*v != 0.0) as u8 as f32),
                    _ => {}
                }
            }
        }
        // The result lies in the sink: later instructions read it there.
        if let (Some(p), Some(dst)) = (direct, inst.def()) {
            views[dst] = Some(p);
        }
        Ok(())
    }
}

/// Elements of a row block of a row-phase kernel: the rows whose values
/// one thread carries from phase to phase (64 KiB per f32 value).
const ROW_BLOCK: u64 = 16 * 1024;

/// A row-phase kernel (`KernelKind::Rows`) compiled for the host: the loop
/// program of each phase. When every value a phase reads from an earlier
/// one is read in the row block where it was written (a row's reduction
/// broadcast back along the row, a value read element for element), each
/// thread runs every phase over one block of rows before the next block,
/// so those values stay in its cache: a softmax reads its input and
/// writes its result once instead of three times each. Otherwise the
/// phases run one after another over the whole space, as separate loop
/// kernels would.
#[derive(Clone, Debug)]
pub struct RowProgram {
    phases: Vec<LoopProgram>,
    /// Phases that loop over the rows alone (one position per row).
    per_row: Vec<bool>,
    /// Elements per row.
    row: u64,
    /// Elements per row block (whole rows), when blocks are possible.
    block: Option<u64>,
    /// Values phases pass on that the kernel does not store: held in one
    /// block-sized slot per thread.
    local: Vec<ValueId>,
}

impl RowProgram {
    pub fn compile(graph: &Graph, kernel: &Kernel) -> Result<RowProgram> {
        let KernelKind::Rows {
            shape,
            reduce_dims,
            phases,
        } = &kernel.kind
        else {
            return Err(Error::Internal("not a row-phase kernel".into()));
        };
        let phases: Vec<LoopProgram> = phases
            .iter()
            .map(|p| LoopProgram::compile(graph, p))
            .collect::<Result<_>>()?;
        let rank = shape.len();
        let row: u64 = shape[rank - reduce_dims..].iter().product();
        let rows: u64 = shape[..rank - reduce_dims].iter().product();
        let per_row: Vec<bool> = phases.iter().map(|p| p.shape != *shape).collect();
        // How a phase over the whole shape reads a row's value: the row's
        // element wherever it is in the row.
        let mut broadcast = contiguous(&shape[..rank - reduce_dims]);
        broadcast.extend(std::iter::repeat_n(0, *reduce_dims));
        // Values an earlier phase made: (one per row?, dtype). Later
        // phases read them as f32 from the memory they were stored in (or
        // a block of it), so they must be f32 there.
        let mut made: FxHashMap<ValueId, (bool, DType)> = FxHashMap::default();
        let mut blocked = row > 0;
        let in_kernel: FxHashSet<usize> = kernel.nodes.iter().copied().collect();
        let producer = graph.producers();
        for (p, &rowwise) in phases.iter().zip(&per_row) {
            // Gathers run before any phase: of values from outside only.
            let gathers_inside = p.materialize.iter().any(|&m| {
                graph.nodes()[m]
                    .inputs
                    .iter()
                    .any(|v| producer[v.0 as usize].is_some_and(|q| in_kernel.contains(&q)))
            });
            if gathers_inside {
                return Err(Error::Internal(
                    "a row phase gathers a value of an earlier phase".into(),
                ));
            }
            let n: u64 = p.shape.iter().product();
            blocked &= p.materialize.is_empty()
                && if rowwise {
                    n == rows && p.epilogues.is_empty()
                } else {
                    p.epilogues.is_empty() || p.reduce_len == row
                };
            let in_order = contiguous(&p.shape);
            for s in &p.sources {
                let Source::Strided {
                    value,
                    strides,
                    offset,
                } = s
                else {
                    continue;
                };
                let Some(&(per_row_value, dtype)) = made.get(value) else {
                    continue;
                };
                let local = !per_row_value && !kernel.stores.contains(value);
                if dtype != DType::F32 && !local {
                    return Err(Error::Internal(format!(
                        "row phase reads %{} of an earlier phase as {dtype:?}",
                        value.0
                    )));
                }
                // A row's value along its row, a value of the whole shape
                // element for element: in the same block of rows.
                let expect = match (per_row_value, rowwise) {
                    (true, false) => &broadcast,
                    (true, true) | (false, false) => &in_order,
                    (false, true) => {
                        blocked = false;
                        continue;
                    }
                };
                blocked &= *offset == 0 && same_steps(&p.shape, strides, expect);
            }
            for e in &p.epilogues {
                made.insert(e.out, (true, e.dtype));
            }
            for (_, v, dtype) in &p.stores {
                made.insert(*v, (rowwise, *dtype));
            }
        }
        let local = phases
            .iter()
            .zip(&per_row)
            .filter(|(_, &rowwise)| !rowwise)
            .flat_map(|(p, _)| p.stores.iter().map(|s| s.1))
            .filter(|v| !kernel.stores.contains(v))
            .collect();
        Ok(RowProgram {
            phases,
            per_row,
            row,
            block: blocked.then(|| (ROW_BLOCK / row).max(1) * row),
            local,
        })
    }

    /// Whether the phases run row block by row block (else one after another).
    pub fn blocked(&self) -> bool {
        self.block.is_some()
    }

    pub fn run(
        &self,
        graph: &Graph,
        values: &mut [Option<HostTensor>],
        io: &DeviceIo<'_>,
    ) -> Result<()> {
        for p in &self.phases {
            for &m in &p.materialize {
                eval_node(graph, m, values, io)?;
            }
        }

        let n: u64 = self.phases[0].shape.iter().product();
        // Blocks: a slot of each local value per thread. Phase after phase:
        // one slot of the whole space.
        let (block, ranges) = match self.block {
            Some(block) => (block, split(n, block)),
            None => (n, Few::new()),
        };
        let slots = ranges.len().max(1) as u64;
        let local_set: FxHashSet<ValueId> = self.local.iter().copied().collect();
        let mut local: Vec<HostTensor> = self
            .local
            .iter()
            .map(|_| HostTensor::for_overwrite(TensorType::new(DType::F32, &[slots * block])))
            .collect();
        let mut outs: Vec<Outs<Target>> = self
            .phases
            .iter()
            .map(|p| p.targets(graph, io, &local_set))
            .collect();
        let mut red_outs: Vec<Outs<HostTensor>> = self
            .phases
            .iter()
            .map(|p| p.reduction_targets(graph))
            .collect();
        let layouts: Vec<SourceLayout> = self
            .phases
            .iter()
            .map(|p| p.layout(values, io))
            .collect::<Result<_>>()?;
        {
            // One pointer into each buffer the phases share, taken once:
            // sinks write through it and later phases read through it.
            let local_ptrs: FxHashMap<ValueId, (*mut f32, usize)> = self
                .local
                .iter()
                .zip(local.iter_mut())
                .map(|(v, t)| (*v, (t.bytes_mut().as_mut_ptr() as *mut f32, t.numel())))
                .collect();
            let mut chain: FxHashMap<ValueId, (*const f32, usize)> = local_ptrs
                .iter()
                .map(|(v, &(p, len))| (*v, (p as *const f32, len)))
                .collect();
            let mut sinks = Vec::new();
            let mut red_sinks = Vec::new();
            for (k, p) in self.phases.iter().enumerate() {
                let s = sinks_of(&mut outs[k], &p.stores, &local_ptrs);
                for (sink, (_, v, dtype)) in s.iter().zip(&p.stores) {
                    if *dtype == DType::F32 && !local_set.contains(v) {
                        chain.insert(*v, (sink.ptr as *const f32, sink.len));
                    }
                }
                let r = red_sinks_of(&mut red_outs[k], &p.epilogues);
                for (sink, e) in r.iter().zip(&p.epilogues) {
                    if e.dtype == DType::F32 {
                        chain.insert(e.out, (sink.ptr as *const f32, sink.len));
                    }
                }
                sinks.push(s);
                red_sinks.push(r);
            }
            let scalars: Vec<FxHashMap<ValueId, u64>> = self
                .phases
                .iter()
                .map(|p| p.scalars(values, io))
                .collect::<Result<_>>()?;
            let srcs: Vec<Few<SourceData<'_>>> = self
                .phases
                .iter()
                .zip(&layouts)
                .map(|(p, l)| p.source_data(values, l, io, &chain))
                .collect::<Result<_>>()?;
            let strides: Vec<Vec<&[u64]>> = layouts
                .iter()
                .map(|l| l.strides.iter().map(|s| &s[..]).collect())
                .collect();
            let local_sources: Vec<Vec<bool>> = self
                .phases
                .iter()
                .map(|p| {
                    p.sources
                        .iter()
                        .map(|s| matches!(s, Source::Strided { value, .. } if local_set.contains(value)))
                        .collect()
                })
                .collect();
            let local_sinks: Vec<Vec<bool>> = self
                .phases
                .iter()
                .map(|p| p.stores.iter().map(|s| local_set.contains(&s.1)).collect())
                .collect();
            let passes: Vec<Pass<'_>> = (0..self.phases.len())
                .map(|k| Pass {
                    program: &self.phases[k],
                    scalars: &scalars[k],
                    src: &srcs[k],
                    strides: &strides[k],
                    offsets: &layouts[k].offsets,
                    sinks: &sinks[k],
                    red_sinks: &red_sinks[k],
                    last: self.phases[k].last(),
                    local_sources: &local_sources[k],
                    local_sinks: &local_sinks[k],
                })
                .collect();
            if self.block.is_none() {
                for (pass, p) in passes.iter().zip(&self.phases) {
                    let n: u64 = p.shape.iter().product();
                    run_split(&split(n, p.split_unit()), |_, a, b| pass.range(a, b))?;
                }
            }
            // Block by block (no ranges when phase after phase).
            run_split(&ranges, |t, a, b| {
                let mut regs: Vec<Registers> = self.phases.iter().map(Registers::new).collect();
                // This thread's slot of the local values.
                let slot = t as u64 * block;
                let mut b0 = a;
                while b0 < b {
                    let b1 = (b0 + block).min(b);
                    for ((pass, r), &rowwise) in passes.iter().zip(&mut regs).zip(&self.per_row) {
                        if rowwise {
                            pass.range_in(b0 / self.row, b1 / self.row, 0, r)?;
                        } else {
                            pass.range_in(b0, b1, b0 as i64 - slot as i64, r)?;
                        }
                    }
                    b0 = b1;
                }
                Ok(())
            })?;
        }
        for ((p, o), r) in self.phases.iter().zip(outs).zip(red_outs) {
            p.finish(values, io, o, r)?;
        }
        Ok(())
    }
}

/// Whether `strides` step through a loop of `shape` as `expect` does,
/// wherever a dimension has more than one position.
fn same_steps(shape: &[u64], strides: &[u64], expect: &[u64]) -> bool {
    strides.len() == shape.len()
        && expect.len() == shape.len()
        && (0..shape.len()).all(|d| shape[d] == 1 || strides[d] == expect[d])
}

/// The loop engine's program for one kernel of a plan.
#[derive(Clone, Debug)]
pub enum Program {
    Loop(LoopProgram),
    Rows(RowProgram),
}

#[cfg(test)]
impl Program {
    /// Whether this is a pass that reads a concatenation piece by piece
    /// and gathers nothing up front.
    pub(crate) fn reads_pieces_in_place(&self) -> bool {
        matches!(self, Program::Loop(p) if p.materialize.is_empty()
            && p.sources.iter().any(|s| matches!(s, Source::Pieces(_))))
    }
}

impl Program {
    /// The program for a loop or row-phase kernel; None for a single node
    /// or a group the engine cannot take (those run node by node).
    pub fn compile(graph: &Graph, kernel: &Kernel) -> Option<Program> {
        match kernel.kind {
            KernelKind::Loop { .. } => LoopProgram::compile(graph, kernel).ok().map(Program::Loop),
            KernelKind::Rows { .. } => RowProgram::compile(graph, kernel).ok().map(Program::Rows),
            KernelKind::Single => None,
        }
    }

    pub fn run(
        &self,
        graph: &Graph,
        values: &mut [Option<HostTensor>],
        io: &DeviceIo<'_>,
    ) -> Result<()> {
        match self {
            Program::Loop(p) => p.run(graph, values, io),
            Program::Rows(p) => p.run(graph, values, io),
        }
    }

    /// See [`LoopProgram::may_store_over`]; a row-phase kernel never does.
    pub fn may_store_over(&self, out: ValueId, param: ValueId) -> bool {
        match self {
            Program::Loop(p) => p.may_store_over(out, param),
            Program::Rows(_) => false,
        }
    }
}

#[inline(always)]
fn store(out: &mut HostTensor, dtype: DType, at: usize, vals: &[f32]) {
    match dtype {
        DType::F32 => out.as_slice_mut::<f32>()[at..at + vals.len()].copy_from_slice(vals),
        DType::BF16 => {
            for (o, v) in out.as_slice_mut::<bf16>()[at..at + vals.len()]
                .iter_mut()
                .zip(vals)
            {
                *o = bf16::from_f32(*v);
            }
        }
        DType::F16 => {
            for (o, v) in out.as_slice_mut::<f16>()[at..at + vals.len()]
                .iter_mut()
                .zip(vals)
            {
                *o = f16::from_f32(*v);
            }
        }
        DType::Bool => {
            for (o, v) in out.as_slice_mut::<u8>()[at..at + vals.len()]
                .iter_mut()
                .zip(vals)
            {
                *o = (*v != 0.0) as u8;
            }
        }
        _ => {}
    }
}

/// Store f32 values as `dtype` into device memory of `total` elements.
#[inline(always)]
fn store_device(ptr: *mut u8, total: usize, dtype: DType, at: usize, vals: &[f32]) {
    if at + vals.len() > total {
        return; // unreachable: the output has the loop's shape
    }
    let n = vals.len();
    // SAFETY: [at, at + n) lies inside the output tensor's `total` elements
    // of `dtype` (checked above), which lie inside its buffer (checked when
    // described); the executing task holds the buffer; stream order keeps
    // other users away. Unaligned writes: device offsets are only element
    // aligned.
    unsafe {
        match dtype {
            DType::F32 => {
                std::ptr::copy_nonoverlapping(vals.as_ptr(), (ptr as *mut f32).add(at), n)
            }
            DType::BF16 => {
                let p = (ptr as *mut bf16).add(at);
                for (j, v) in vals.iter().enumerate() {
                    p.add(j).write_unaligned(bf16::from_f32(*v));
                }
            }
            DType::F16 => {
                let p = (ptr as *mut f16).add(at);
                for (j, v) in vals.iter().enumerate() {
                    p.add(j).write_unaligned(f16::from_f32(*v));
                }
            }
            DType::Bool => {
                let p = ptr.add(at);
                for (j, v) in vals.iter().enumerate() {
                    p.add(j).write((*v != 0.0) as u8);
                }
            }
            _ => {}
        }
    }
}

fn identity(op: ReduceOp) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Or => 0.0,
        ReduceOp::Prod | ReduceOp::And => 1.0,
        ReduceOp::Max => f64::NEG_INFINITY,
        ReduceOp::Min => f64::INFINITY,
    }
}

/// The element of `xs` that beats every other by `better` (`init` for
/// none), and whether any is NaN.
#[inline(always)]
fn extreme(xs: &[f32], init: f32, better: impl Fn(f32, f32) -> bool) -> (f32, bool) {
    const LANES: usize = 16;
    let mut lanes = [init; LANES];
    let mut nans = [false; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for k in 0..LANES {
            nans[k] |= c[k].is_nan();
            lanes[k] = if better(c[k], lanes[k]) {
                c[k]
            } else {
                lanes[k]
            };
        }
    }
    let mut m = init;
    let mut nan = nans.iter().any(|&n| n);
    for &v in lanes.iter().chain(chunks.remainder()) {
        nan |= v.is_nan();
        m = if better(v, m) { v } else { m };
    }
    (m, nan)
}

/// `sum_in_f64` of the f32 squares of `xs`, bit for bit (the same lanes
/// and order; each square rounded to f32 before it is widened).
#[inline(never)]
fn sum_sq_in_f64(xs: &[f32]) -> f64 {
    #[inline(always)]
    fn lanes_sum(xs: &[f32]) -> f64 {
        let mut lanes = [0f64; SUM_LANES];
        let mut chunks = xs.chunks_exact(SUM_LANES);
        for c in &mut chunks {
            for k in 0..SUM_LANES {
                lanes[k] += (c[k] * c[k]) as f64;
            }
        }
        let tail: f64 = chunks.remainder().iter().map(|&v| (v * v) as f64).sum();
        combine_lanes(&lanes) + tail
    }
    super::cpu::dispatch!(lanes_sum(xs))
}

/// The sum of `xs` in f64: thirty-two f64 lanes (four independent vector
/// adds in flight with AVX-512, eight with AVX2, so the adds' latency does
/// not bound the loop), then combined pairwise. A function of its own,
/// compiled for AVX-512 too (`cpu::dispatch`): inlined into the loop
/// engine's large body, the compiler left it scalar or two lanes wide.
#[inline(never)]
fn sum_in_f64(xs: &[f32]) -> f64 {
    #[inline(always)]
    fn lanes_sum(xs: &[f32]) -> f64 {
        let mut lanes = [0f64; SUM_LANES];
        let mut chunks = xs.chunks_exact(SUM_LANES);
        for c in &mut chunks {
            for k in 0..SUM_LANES {
                lanes[k] += c[k] as f64;
            }
        }
        let tail: f64 = chunks.remainder().iter().map(|&v| v as f64).sum();
        combine_lanes(&lanes) + tail
    }
    super::cpu::dispatch!(lanes_sum(xs))
}

const SUM_LANES: usize = 32;

/// The pairwise sum of `sum_in_f64`'s lanes. Not inlined: next to the
/// lanes' loop, the combining loop led the compiler to vectorize that
/// loop two lanes wide (xmm) instead of eight (zmm) or four (ymm).
#[inline(never)]
fn combine_lanes(lanes: &[f64; SUM_LANES]) -> f64 {
    let mut lanes = *lanes;
    let mut width = SUM_LANES;
    while width > 1 {
        width /= 2;
        for k in 0..width {
            lanes[k] += lanes[k + width];
        }
    }
    lanes[0]
}

#[inline(always)]
fn accumulate(op: ReduceOp, acc: f64, xs: &[f32]) -> f64 {
    match op {
        ReduceOp::Sum => acc + sum_in_f64(xs),
        ReduceOp::Prod => xs.iter().fold(acc, |a, &v| a * v as f64),
        // Max and min in sixteen f32 lanes (the compiler vectorizes the
        // selects; one running value would make each element wait for the
        // last), with NaN tracked on the side so it still propagates.
        ReduceOp::Max | ReduceOp::Min => {
            let max = op == ReduceOp::Max;
            let (m, nan) = if max {
                extreme(xs, f32::NEG_INFINITY, |v, m| v > m)
            } else {
                extreme(xs, f32::INFINITY, |v, m| v < m)
            };
            if nan || acc.is_nan() {
                f64::NAN
            } else if max {
                acc.max(m as f64)
            } else {
                acc.min(m as f64)
            }
        }
        ReduceOp::And | ReduceOp::Or => acc,
    }
}

/// 1.0 where `x op y` holds, else 0.0. The op is matched once per chunk,
/// outside the element loop, so each arm vectorizes (matched per element,
/// it was a jump table per element: a tenth of the dropout block's time).
#[inline(always)]
fn compare(op: CompareOp, out: &mut [f32], x: Arg<'_>, y: Arg<'_>) {
    macro_rules! cmp {
        ($f:expr) => {
            binary_loop(out, x, y, |a: f32, b: f32| if $f(a, b) { 1.0 } else { 0.0 })
        };
    }
    match op {
        CompareOp::Eq => cmp!(|a: f32, b: f32| a == b),
        CompareOp::Ne => cmp!(|a: f32, b: f32| a != b),
        CompareOp::Lt => cmp!(|a: f32, b: f32| a < b),
        CompareOp::Le => cmp!(|a: f32, b: f32| a <= b),
        CompareOp::Gt => cmp!(|a: f32, b: f32| a > b),
        CompareOp::Ge => cmp!(|a: f32, b: f32| a >= b),
    }
}

#[inline(always)]
fn unary(op: UnaryOp, out: &mut [f32], x: &[f32]) {
    macro_rules! map {
        ($f:expr) => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = $f(v);
            }
        };
    }
    match op {
        UnaryOp::Neg => map!(|v: f32| -v),
        UnaryOp::Abs => map!(|v: f32| v.abs()),
        UnaryOp::Exp => map!(vmath::exp_f32),
        UnaryOp::Expm1 => map!(|v: f32| v.exp_m1()),
        UnaryOp::Log => map!(|v: f32| v.ln()),
        UnaryOp::Log1p => map!(|v: f32| v.ln_1p()),
        UnaryOp::Sqrt => map!(|v: f32| v.sqrt()),
        UnaryOp::Rsqrt => map!(|v: f32| 1.0 / v.sqrt()),
        UnaryOp::Tanh => map!(vmath::tanh_f32),
        UnaryOp::Logistic => map!(vmath::logistic_f32),
        UnaryOp::Sin => map!(|v: f32| v.sin()),
        UnaryOp::Cos => map!(|v: f32| v.cos()),
        UnaryOp::Erf => vmath::erf_run(out, x),
        UnaryOp::Floor => map!(|v: f32| v.floor()),
        UnaryOp::Ceil => map!(|v: f32| v.ceil()),
        UnaryOp::Round => map!(|v: f32| v.round_ties_even()),
        UnaryOp::Sign => map!(|v: f32| if v > 0.0 {
            1.0
        } else if v < 0.0 {
            -1.0
        } else {
            v
        }),
        UnaryOp::Not => map!(|v: f32| (v == 0.0) as u8 as f32),
        UnaryOp::IsFinite => map!(|v: f32| v.is_finite() as u8 as f32),
    }
}

/// `out[j] = f(x[j], y[j])`, a splat operand read as its one value.
#[inline(always)]
fn binary_loop(out: &mut [f32], x: Arg<'_>, y: Arg<'_>, f: impl Fn(f32, f32) -> f32) {
    match (x, y) {
        (Arg::Vals(x), Arg::Vals(y)) => {
            for ((o, &a), &b) in out.iter_mut().zip(x).zip(y) {
                *o = f(a, b);
            }
        }
        (Arg::Vals(x), Arg::Splat(b)) => {
            for (o, &a) in out.iter_mut().zip(x) {
                *o = f(a, b);
            }
        }
        (Arg::Splat(a), Arg::Vals(y)) => {
            for (o, &b) in out.iter_mut().zip(y) {
                *o = f(a, b);
            }
        }
        (Arg::Splat(a), Arg::Splat(b)) => out.fill(f(a, b)),
    }
}

/// `out[j] = f(x[j], y[j], z[j])`, splat operands read as their one value.
#[inline(always)]
fn ternary_loop(
    out: &mut [f32],
    x: Arg<'_>,
    y: Arg<'_>,
    z: Arg<'_>,
    f: impl Fn(f32, f32, f32) -> f32,
) {
    use Arg::{Splat, Vals};
    match (x, y, z) {
        (Vals(x), Vals(y), Vals(z)) => {
            for (((o, &a), &b), &c) in out.iter_mut().zip(x).zip(y).zip(z) {
                *o = f(a, b, c);
            }
        }
        (Vals(x), Vals(y), Splat(c)) => {
            for ((o, &a), &b) in out.iter_mut().zip(x).zip(y) {
                *o = f(a, b, c);
            }
        }
        (Vals(x), Splat(b), Vals(z)) => {
            for ((o, &a), &c) in out.iter_mut().zip(x).zip(z) {
                *o = f(a, b, c);
            }
        }
        (Splat(a), Vals(y), Vals(z)) => {
            for ((o, &b), &c) in out.iter_mut().zip(y).zip(z) {
                *o = f(a, b, c);
            }
        }
        (Vals(x), Splat(b), Splat(c)) => {
            for (o, &a) in out.iter_mut().zip(x) {
                *o = f(a, b, c);
            }
        }
        (Splat(a), Vals(y), Splat(c)) => {
            for (o, &b) in out.iter_mut().zip(y) {
                *o = f(a, b, c);
            }
        }
        (Splat(a), Splat(b), Vals(z)) => {
            for (o, &c) in out.iter_mut().zip(z) {
                *o = f(a, b, c);
            }
        }
        (Splat(a), Splat(b), Splat(c)) => out.fill(f(a, b, c)),
    }
}

/// `Inst::Chain`: `second(first(x, y), z)`, each op rounding to f32.
#[inline(always)]
fn chain(first: BinaryOp, second: BinaryOp, out: &mut [f32], x: Arg<'_>, y: Arg<'_>, z: Arg<'_>) {
    macro_rules! pair {
        ($f:tt, $g:tt) => {
            ternary_loop(out, x, y, z, |a: f32, b: f32, c: f32| (a $f b) $g c)
        };
    }
    match (first, second) {
        (BinaryOp::Add, BinaryOp::Add) => pair!(+, +),
        (BinaryOp::Add, BinaryOp::Sub) => pair!(+, -),
        (BinaryOp::Add, BinaryOp::Mul) => pair!(+, *),
        (BinaryOp::Sub, BinaryOp::Add) => pair!(-, +),
        (BinaryOp::Sub, BinaryOp::Sub) => pair!(-, -),
        (BinaryOp::Sub, BinaryOp::Mul) => pair!(-, *),
        (BinaryOp::Mul, BinaryOp::Add) => pair!(*, +),
        (BinaryOp::Mul, BinaryOp::Sub) => pair!(*, -),
        (BinaryOp::Mul, BinaryOp::Mul) => pair!(*, *),
        // `chain_binaries` joins only the pairs above; any other pair
        // still computes, one element at a time.
        _ => ternary_loop(out, x, y, z, |a, b, c| {
            let mut t = [0f32];
            binary(first, &mut t, Arg::Splat(a), Arg::Splat(b));
            let mut r = [0f32];
            binary(second, &mut r, Arg::Splat(t[0]), Arg::Splat(c));
            r[0]
        }),
    }
}

#[inline(always)]
fn binary(op: BinaryOp, out: &mut [f32], x: Arg<'_>, y: Arg<'_>) {
    macro_rules! zip {
        ($f:expr) => {
            binary_loop(out, x, y, $f)
        };
    }
    match op {
        BinaryOp::Add => zip!(|a: f32, b: f32| a + b),
        BinaryOp::Sub => zip!(|a: f32, b: f32| a - b),
        BinaryOp::Mul => zip!(|a: f32, b: f32| a * b),
        BinaryOp::Div => zip!(|a: f32, b: f32| a / b),
        BinaryOp::Rem => zip!(|a: f32, b: f32| a % b),
        BinaryOp::Pow => zip!(|a: f32, b: f32| a.powf(b)),
        BinaryOp::Max => zip!(|a: f32, b: f32| if a.is_nan() || b.is_nan() {
            f32::NAN
        } else {
            a.max(b)
        }),
        BinaryOp::Min => zip!(|a: f32, b: f32| if a.is_nan() || b.is_nan() {
            f32::NAN
        } else {
            a.min(b)
        }),
        BinaryOp::And => zip!(|a: f32, b: f32| (a != 0.0 && b != 0.0) as u8 as f32),
        BinaryOp::Or => zip!(|a: f32, b: f32| (a != 0.0 || b != 0.0) as u8 as f32),
        BinaryOp::Xor => zip!(|a: f32, b: f32| ((a != 0.0) != (b != 0.0)) as u8 as f32),
        BinaryOp::Atan2 => zip!(|a: f32, b: f32| a.atan2(b)),
    }
}

/// Run one node with the primitive kernels: its inputs from `values`
/// (parameters still in device memory are read first), its results into
/// `values`.
fn eval_node(
    graph: &Graph,
    node: usize,
    values: &mut [Option<HostTensor>],
    io: &DeviceIo<'_>,
) -> Result<()> {
    let n = &graph.nodes()[node];
    if let Some(view) = transpose_in_place(n, values, io) {
        values[n.outputs[0].0 as usize] = Some(view);
        return Ok(());
    }
    if let Some(outs) = run_dot(n, values, io)? {
        for (o, t) in n.outputs.iter().zip(outs) {
            values[o.0 as usize] = Some(t);
        }
        return Ok(());
    }
    for v in &n.inputs {
        if values[v.0 as usize].is_none() {
            if let Some(t) = io.inputs.get(v) {
                // A contiguous input is read where it lies (copied on write).
                // SAFETY: `t` is an input of the executing executable, whose
                // task holds its buffer; during `execute` device memory is
                // written only by loop results stored straight into outputs
                // that overlap no input, and by the final output writes,
                // before which `HostExecutable::execute` copies every view
                // it still needs when an output overlaps an input.
                let view = unsafe { HostTensor::borrow_device(t) };
                values[v.0 as usize] = Some(match view {
                    Some(h) => h,
                    None => read_tensor(t)?,
                });
            }
        }
    }
    let ins: Vec<&HostTensor> = n
        .inputs
        .iter()
        .map(|v| {
            values[v.0 as usize]
                .as_ref()
                .ok_or_else(|| Error::Internal(format!("value %{} missing", v.0)))
        })
        .collect::<Result<_>>()?;
    let outs = kernels::eval(&n.prim, &ins)?;
    for (o, t) in n.outputs.iter().zip(outs) {
        values[o.0 as usize] = Some(t);
    }
    Ok(())
}

/// A transpose of a parameter that is itself a transposed view of dense
/// memory, back into that memory's order (attention's keys passed as
/// `k.transpose(-2, -1)`, transposed back for the attention primitive):
/// the memory, read where it lies. None otherwise; the kernel then runs.
fn transpose_in_place(
    n: &crate::ir::Node,
    values: &[Option<HostTensor>],
    io: &DeviceIo<'_>,
) -> Option<HostTensor> {
    let Prim::Transpose { perm } = &n.prim else {
        return None;
    };
    let v = n.inputs[0];
    if values[v.0 as usize].is_some() {
        return None;
    }
    let t = io.inputs.get(&v)?;
    if t.is_contiguous() {
        return None;
    }
    // SAFETY: as for the views of `eval_node`.
    let (memory, view_perm) = unsafe { HostTensor::borrow_device_permuted(t) }?;
    // The input is transpose(memory, view_perm); the node's result is
    // transpose(input, perm): memory itself when the two undo each other.
    let undone = perm
        .iter()
        .enumerate()
        .all(|(d, &p)| view_perm.get(p) == Some(&d));
    let dims: Vec<u64> = perm.iter().map(|&p| t.dims()[p]).collect();
    (undone && memory.dims() == &dims[..]).then_some(memory)
}

/// A dot_general, reading parameters where they lie and writing its
/// result straight into the output's device memory when the executable
/// chose to (a float output in `io.outputs`), leaving a view of it in
/// `values` for later kernels. A transposed parameter (torch passes a
/// linear layer's weight as `W.t()`, attention its keys as
/// `k.transpose(-2, -1)`) is read in its own memory order with the
/// dimension numbers restated, instead of gathered into a contiguous copy.
/// None when the node is not a product; the caller then runs it.
fn run_dot(
    n: &crate::ir::Node,
    values: &[Option<HostTensor>],
    io: &DeviceIo<'_>,
) -> Result<Option<Vec<HostTensor>>> {
    let Prim::DotGeneral {
        lhs_batch,
        rhs_batch,
        lhs_contract,
        rhs_contract,
        precision,
    } = &n.prim
    else {
        return Ok(None);
    };
    let mut dims = [
        (lhs_batch.clone(), lhs_contract.clone()),
        (rhs_batch.clone(), rhs_contract.clone()),
    ];
    // Operands read here; those already computed are read from `values`.
    let mut own: [Option<HostTensor>; 2] = [None, None];
    for (side, v) in n.inputs.iter().enumerate() {
        if values[v.0 as usize].is_some() {
            continue;
        }
        let Some(t) = io.inputs.get(v) else {
            return Err(Error::Internal(format!("value %{} missing", v.0)));
        };
        // SAFETY: as for the views of `eval_node`; these live only for
        // the product.
        let view = if t.is_contiguous() {
            unsafe { HostTensor::borrow_device(t) }
        } else {
            unsafe { HostTensor::borrow_device_permuted(t) }.and_then(|(view, perm)| {
                let (batch, contract) = &dims[side];
                let (batch, contract) =
                    crate::fusion::dot_operand_through_transpose(&perm, batch, contract)?;
                dims[side] = (batch, contract);
                Some(view)
            })
        };
        own[side] = Some(match view {
            Some(view) => view,
            None => read_tensor(t)?,
        });
    }
    let operand = |side: usize| {
        own[side]
            .as_ref()
            .or(values[n.inputs[side].0 as usize].as_ref())
            .ok_or_else(|| Error::Internal("a product's operand is missing".into()))
    };
    let [(lhs_batch, lhs_contract), (rhs_batch, rhs_contract)] = dims;
    let prim = Prim::DotGeneral {
        lhs_batch,
        rhs_batch,
        lhs_contract,
        rhs_contract,
        precision: *precision,
    };
    let ins = [operand(0)?, operand(1)?];
    let target = n.outputs.first().and_then(|o| io.outputs.get(o));
    let direct = target.and_then(|t| kernels::aligned_host_ptr(t).map(|p| (t, p)));
    if let Some((t, ptr)) = direct {
        let len = t.ty().nbytes() as usize;
        // SAFETY: the executable hands a product an output only when it is
        // contiguous, in host memory, and overlaps no input and no other
        // output; nothing else writes it during `execute`, and the task
        // holds its buffer.
        let dst = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        kernels::eval_dot_into(&prim, &ins, dst)?;
        // SAFETY: as above; from here on only read.
        let view = unsafe { HostTensor::borrow_device(t) }
            .ok_or_else(|| Error::Internal("a product's output cannot be read back".into()))?;
        return Ok(Some(vec![view]));
    }
    kernels::eval(&prim, &ins).map(Some)
}

/// A kernel as the profiler names it: what it computes and over what
/// shape, so the same kernel of every step sums into one row. A primitive:
/// its name and operand types; a loop: its shape and primitives (the first
/// dozen); a row kernel: also its phases, and whether it ran block by block.
fn kernel_label(graph: &Graph, kernel: &Kernel, program: Option<&Program>) -> String {
    let nodes = graph.nodes();
    let prims = || {
        let names: Vec<String> = kernel.nodes.iter().map(|&i| nodes[i].prim.name()).collect();
        let shown = names.len().min(12);
        let mut s = names[..shown].join(" ");
        if names.len() > shown {
            s += &format!(" +{} more", names.len() - shown);
        }
        s
    };
    let dims = |d: &[u64]| {
        let d: Vec<String> = d.iter().map(u64::to_string).collect();
        format!("[{}]", d.join(","))
    };
    match &kernel.kind {
        KernelKind::Single => {
            let Some(&i) = kernel.nodes.first() else {
                return "empty kernel".into();
            };
            let n = &nodes[i];
            let types = |vs: &[ValueId]| -> Vec<String> {
                vs.iter()
                    .map(|v| graph.value_type(*v).to_string())
                    .collect()
            };
            format!(
                "{} {} -> {}",
                n.prim.name(),
                types(&n.inputs).join(" "),
                types(&n.outputs).join(" ")
            )
        }
        KernelKind::Loop { shape, .. } => {
            let node_by_node = if program.is_none() {
                ", node by node"
            } else {
                ""
            };
            format!("loop {}{node_by_node}: {}", dims(shape), prims())
        }
        KernelKind::Rows { shape, phases, .. } => {
            let how = match program {
                Some(Program::Rows(r)) if r.blocked() => "by row blocks",
                Some(_) => "phase after phase",
                None => "node by node",
            };
            format!(
                "rows {} ({} phases, {how}): {}",
                dims(shape),
                phases.len(),
                prims()
            )
        }
    }
}

/// Run a whole plan over `values` (parameters set or in `io`; results
/// filled in, or written to device memory for the outputs in `io`), its
/// kernels in order; after kernel k, the values of `dead[k]` are dropped
/// (an empty `dead` keeps every value).
pub fn run_plan(
    graph: &Graph,
    plan: &Plan,
    programs: &[Option<Program>],
    values: &mut [Option<HostTensor>],
    io: &DeviceIo<'_>,
    dead: &[Vec<ValueId>],
) -> Result<()> {
    for (k, kernel) in plan.kernels.iter().enumerate() {
        let began = crate::profile::recording().then(std::time::Instant::now);
        match &programs[k] {
            Some(p) => p.run(graph, values, io)?,
            None => {
                for &i in &kernel.nodes {
                    eval_node(graph, i, values, io)?;
                }
            }
        }
        if let Some(t0) = began {
            let took = t0.elapsed();
            let label = || kernel_label(graph, kernel, programs[k].as_ref());
            crate::profile::record(crate::profile::EventKind::Kernel, label, 0, t0, took);
        }
        for v in dead.get(k).into_iter().flatten() {
            values[v.0 as usize] = None;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The program of every loop and row-phase kernel of `plan`, each of
    /// which must compile.
    pub(crate) fn compiled(graph: &Graph, plan: &Plan) -> Vec<Option<Program>> {
        plan.kernels
            .iter()
            .map(|k| match k.kind {
                KernelKind::Single => None,
                _ => Some(Program::compile(graph, k).unwrap_or_else(|| panic!("{k:?}"))),
            })
            .collect()
    }
    use crate::ir::TensorType;
    use crate::ops::{self, Attr, Attrs};
    use crate::platform::host::kernels::eval_graph;
    use proptest::prelude::*;

    #[test]
    fn a_sum_in_f64_counts_every_element_once() {
        // Every length up to three lanes' loops and a tail, on values whose
        // f64 sums are exact (eighths well below 2^52), so any order gives
        // the same sum and a lost or doubled element shows.
        let xs: Vec<f32> = (0..100)
            .map(|i| ((i * 37) % 101) as f32 / 8.0 - 5.0)
            .collect();
        for n in 0..=xs.len() {
            let want: f64 = xs[..n].iter().map(|&v| v as f64).sum();
            assert_eq!(sum_in_f64(&xs[..n]), want, "{n} elements");
            assert_eq!(
                accumulate(ReduceOp::Sum, 0.5, &xs[..n]),
                want + 0.5,
                "{n} elements"
            );
        }
    }

    /// Each compare gives 1.0 exactly where IEEE comparison holds (NaN
    /// compares unequal to everything, -0 equals +0), over a chunk longer
    /// than a vector and a ragged tail.
    #[test]
    fn compare_matches_ieee_comparison_elementwise() {
        let special = [
            f32::NAN,
            -0.0,
            0.0,
            1.0,
            -1.5,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        let x: Vec<f32> = (0..53).map(|i| special[i % special.len()]).collect();
        let y: Vec<f32> = (0..53).map(|i| special[(i / 7) % special.len()]).collect();
        for (op, f) in crate::platform::host::kernels::IEEE_COMPARES {
            let mut out = vec![7.0f32; x.len()];
            compare(op, &mut out, Arg::Vals(&x), Arg::Vals(&y));
            for j in 0..x.len() {
                let want = if f(x[j] as f64, y[j] as f64) {
                    1.0
                } else {
                    0.0
                };
                assert_eq!(out[j], want, "{op:?} {} {}", x[j], y[j]);
            }
        }
    }

    #[test]
    fn host_threads_reads_its_setting_and_refuses_bad_values() {
        assert_eq!(host_threads(None, 2).unwrap(), 2);
        assert_eq!(host_threads(None, 64).unwrap(), 8);
        assert_eq!(host_threads(Some(" "), 0).unwrap(), 1);
        assert_eq!(host_threads(Some("3"), 2).unwrap(), 3);
        for bad in ["0", "-1", "two", "1000"] {
            let e = host_threads(Some(bad), 2).unwrap_err().to_string();
            assert!(e.contains("TPURT_HOST_THREADS") && e.contains(bad), "{e}");
        }
    }

    fn input(ty: &TensorType, seed: u64) -> HostTensor {
        let n = ty.numel() as usize;
        let vals: Vec<f64> = (0..n)
            .map(|i| {
                let h = (i as u64 ^ seed).wrapping_mul(0x9E3779B97F4A7C15) >> 40;
                (h as f64 / (1u64 << 24) as f64) * 4.0 - 2.0
            })
            .collect();
        HostTensor::from_f64(ty.dtype, &ty.dims, &vals).unwrap()
    }

    /// The fused plan gives the node-by-node reference result.
    fn check(graph: &Graph, tol: f64) {
        let inputs: Vec<HostTensor> = graph
            .param_types()
            .iter()
            .enumerate()
            .map(|(i, t)| input(t, i as u64))
            .collect();
        let want = eval_graph(graph, &inputs).unwrap();
        for (got, w) in run_fused(graph, &inputs).iter().zip(&want) {
            assert_eq!(got.ty, w.ty);
            for (i, (a, b)) in got.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
                let ok =
                    (a.is_nan() && b.is_nan()) || *a == b || (a - b).abs() <= tol * (1.0 + b.abs());
                assert!(ok, "element {i}: fused {a} vs reference {b}\n{graph}");
            }
        }
    }

    /// `graph`'s outputs from its plan's kernels run on `inputs`, values
    /// dropped after their last use as an executable does.
    fn run_fused(graph: &Graph, inputs: &[HostTensor]) -> Vec<HostTensor> {
        let plan = crate::fusion::plan(graph);
        let programs = compiled(graph, &plan);
        let mut values: Vec<Option<HostTensor>> = vec![None; graph.num_values()];
        for (p, t) in graph.params().iter().zip(inputs) {
            values[p.0 as usize] = Some(t.clone());
        }
        let dead = plan.dead_after(graph);
        run_plan(
            graph,
            &plan,
            &programs,
            &mut values,
            &DeviceIo::default(),
            &dead,
        )
        .unwrap();
        graph
            .outputs()
            .iter()
            // Cloned: a graph may list one output twice.
            .map(|o| values[o.0 as usize].clone().unwrap())
            .collect()
    }

    /// A loop group is not merged into a later one past a kernel that reads
    /// its result through a load that is not folded (here a reshape that a
    /// product reads): that kernel runs before the merged pass. Before the
    /// fix, the plan ran the reshape first: "value %4 missing".
    #[test]
    fn a_group_is_not_merged_past_a_kernel_that_reads_it_through_a_load() {
        let t = TensorType::new(DType::F32, &[4, 4]);
        let mut g = crate::ir::GraphBuilder::new();
        let (x, w) = (g.param(t.clone()), g.param(t));
        let dot = |g: &mut crate::ir::GraphBuilder, l, r| {
            g.op(
                Prim::DotGeneral {
                    lhs_batch: vec![],
                    rhs_batch: vec![],
                    lhs_contract: vec![1],
                    rhs_contract: vec![0],
                    precision: Default::default(),
                },
                &[l, r],
            )
            .unwrap()
        };
        let a = g.binary(BinaryOp::Mul, x, x).unwrap();
        let a_rows = g.op(Prim::Reshape { dims: vec![2, 8] }, &[a]).unwrap();
        let c = dot(&mut g, x, w);
        // A later group over a's shape that reads `a` directly.
        let b = g.binary(BinaryOp::Add, a, c).unwrap();
        let b_cols = g.op(Prim::Reshape { dims: vec![8, 2] }, &[b]).unwrap();
        let out = dot(&mut g, a_rows, b_cols);
        check(&g.build(&[out]).unwrap(), 1e-6);
    }

    /// Independent chains issued op by op across tensors (as a foreach
    /// optimizer issues them) merge into one pass per chain; in each, a
    /// register freed early is reused, so destinations come below their
    /// operands too, and stored values are written as soon as they exist.
    #[test]
    fn interleaved_chains_reuse_registers_and_equal_the_reference() {
        let t = TensorType::new(DType::F32, &[37, 50]);
        let s = TensorType::new(DType::F64, &[]);
        let mut g = crate::ir::GraphBuilder::new();
        let chains = 3;
        let p: Vec<ValueId> = (0..chains).map(|_| g.param(t.clone())).collect();
        let m: Vec<ValueId> = (0..chains).map(|_| g.param(t.clone())).collect();
        let c: Vec<ValueId> = (0..chains).map(|_| g.param(s.clone())).collect();
        let scalar = |g: &mut crate::ir::GraphBuilder, v: ValueId| {
            let f = g.op(Prim::Convert { to: DType::F32 }, &[v]).unwrap();
            g.op(
                Prim::BroadcastInDim {
                    dims: vec![37, 50],
                    mapping: vec![],
                },
                &[f],
            )
            .unwrap()
        };
        // p * c, then exp(m), then sqrt(|p * c| + exp(m)) - p * c, op by op.
        let a: Vec<ValueId> = (0..chains)
            .map(|i| {
                let b = scalar(&mut g, c[i]);
                g.binary(BinaryOp::Mul, p[i], b).unwrap()
            })
            .collect();
        let e: Vec<ValueId> = (0..chains)
            .map(|i| g.unary(UnaryOp::Exp, m[i]).unwrap())
            .collect();
        let q: Vec<ValueId> = (0..chains)
            .map(|i| {
                let abs = g.unary(UnaryOp::Abs, a[i]).unwrap();
                let sum = g.binary(BinaryOp::Add, abs, e[i]).unwrap();
                let root = g.unary(UnaryOp::Sqrt, sum).unwrap();
                g.binary(BinaryOp::Sub, root, a[i]).unwrap()
            })
            .collect();
        let mut outs = e.clone();
        outs.extend(&q);
        let graph = g.build(&outs).unwrap();
        let plan = crate::fusion::plan(&graph);
        assert_eq!(plan.loop_count(), chains, "one pass per chain: {plan:#?}");
        for k in &plan.kernels {
            let program = LoopProgram::compile(&graph, k).unwrap();
            assert_eq!(program.stores.len(), 2, "exp(m) and the result");
            assert_eq!(program.constants, 1, "the scalar is loaded once per range");
            let values = program.insts.iter().filter(|i| i.def().is_some()).count();
            assert!(
                program.registers < values,
                "{} registers for {values} values",
                program.registers
            );
            assert!(
                program
                    .insts
                    .iter()
                    .any(|i| i.def().is_some_and(|d| i.uses().iter().any(|&u| u > d))),
                "some destination sits below an operand: {:?}",
                program.insts
            );
        }
        check(&graph, 1e-6);
    }

    /// A copy in a pass is its operand's register: every bit is kept
    /// (-0.0 too), stored beside a value computed from it.
    #[test]
    fn a_copy_in_a_pass_keeps_every_bit() {
        let t = TensorType::new(DType::F32, &[4]);
        let mut g = crate::ir::GraphBuilder::new();
        let x = g.param(t.clone());
        let c = g.op(Prim::Convert { to: DType::F32 }, &[x]).unwrap();
        let e = g.unary(UnaryOp::Exp, c).unwrap();
        let graph = g.build(&[c, e]).unwrap();
        let plan = crate::fusion::plan(&graph);
        assert_eq!(plan.loop_count(), 1, "{plan:?}");
        let xs = [-0.0f32, 0.0, -1.5, f32::NEG_INFINITY];
        let mut values: Vec<Option<HostTensor>> = vec![None; graph.num_values()];
        values[x.0 as usize] = Some(HostTensor::from_slice(DType::F32, &[4], &xs).unwrap());
        let programs = compiled(&graph, &plan);
        run_plan(
            &graph,
            &plan,
            &programs,
            &mut values,
            &DeviceIo::default(),
            &[],
        )
        .unwrap();
        let got = values[c.0 as usize]
            .as_ref()
            .unwrap()
            .as_slice::<f32>()
            .to_vec();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&xs));
    }

    /// A pass's stored results start from a reused scratch buffer that is
    /// not cleared: every element must be written, so none of its old
    /// bytes show (with and without a reduction epilogue).
    #[test]
    fn a_reused_buffers_old_bytes_never_show_in_a_pass() {
        let t = TensorType::new(DType::F32, &[512, 512]);
        for reduce in [false, true] {
            let mut g = crate::ir::GraphBuilder::new();
            let (x, y) = (g.param(t.clone()), g.param(t.clone()));
            let sum = g.binary(BinaryOp::Add, x, y).unwrap();
            let mut last = g.unary(UnaryOp::Exp, sum).unwrap();
            if reduce {
                let sum_rows = Prim::Reduce {
                    op: ReduceOp::Sum,
                    dimensions: vec![1],
                };
                last = g.op(sum_rows, &[last]).unwrap();
            }
            let graph = g.build(&[sum, last]).unwrap();
            let inputs = [input(&t, 1), input(&t, 2)];
            let want = eval_graph(&graph, &inputs).unwrap();
            let plan = crate::fusion::plan(&graph);
            let programs = compiled(&graph, &plan);
            let mut values: Vec<Option<HostTensor>> = vec![None; graph.num_values()];
            for (p, v) in graph.params().iter().zip(&inputs) {
                values[p.0 as usize] = Some(v.clone());
            }
            // 1 MiB buffers of garbage, dropped into the thread's scratch.
            for _ in 0..2 {
                let mut junk = HostTensor::zeros(t.clone());
                junk.bytes_mut().fill(0x7f);
                drop(junk);
            }
            run_plan(
                &graph,
                &plan,
                &programs,
                &mut values,
                &DeviceIo::default(),
                &[],
            )
            .unwrap();
            for (o, w) in graph.outputs().iter().zip(&want) {
                let got = values[o.0 as usize].as_ref().unwrap().to_f64_vec();
                for (i, (a, b)) in got.iter().zip(w.to_f64_vec()).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "element {i}: {a} vs {b}"
                    );
                }
            }
        }
    }

    fn op(name: &str, ins: &[TensorType], attrs: Attrs) -> Graph {
        ops::build_graph(ops::lookup(name).unwrap(), ins, &attrs).unwrap()
    }

    #[test]
    fn fused_ops_equal_the_reference() {
        let f = |d: &[u64]| TensorType::new(DType::F32, d);
        let h = |d: &[u64]| TensorType::new(DType::BF16, d);
        check(&op("gelu", &[f(&[33, 70])], Attrs::new()), 1e-6);
        check(
            &op(
                "gelu",
                &[h(&[9, 16])],
                Attrs::new().with("approximate", Attr::Str("tanh".into())),
            ),
            1e-2,
        );
        check(
            &op(
                "softmax",
                &[f(&[5, 300])],
                Attrs::new().with("dim", Attr::Int(-1)),
            ),
            1e-6,
        );
        check(
            &op(
                "softmax",
                &[f(&[6, 4])],
                Attrs::new().with("dim", Attr::Int(0)),
            ),
            1e-6,
        );
        check(
            &op(
                "log_softmax",
                &[h(&[3, 4100])],
                Attrs::new().with("dim", Attr::Int(1)),
            ),
            1e-2,
        );
        let ln = Attrs::new().with("normalized_shape", Attr::Ints(vec![64]));
        check(
            &op("layer_norm", &[f(&[7, 64]), f(&[64]), f(&[64])], ln.clone()),
            1e-5,
        );
        check(&op("rms_norm", &[h(&[7, 64]), h(&[64])], ln), 1e-2);
        check(
            &op(
                "sum",
                &[f(&[3, 5000])],
                Attrs::new().with("dim", Attr::Ints(vec![1])),
            ),
            1e-6,
        );
        check(
            &op(
                "mean",
                &[f(&[2, 3, 4])],
                Attrs::new().with("dim", Attr::Ints(vec![1, 2])),
            ),
            1e-6,
        );
        check(
            &op(
                "amax",
                &[f(&[4, 9])],
                Attrs::new().with("dim", Attr::Ints(vec![1])),
            ),
            0.0,
        );
        check(
            &op(
                "where",
                &[TensorType::new(DType::Bool, &[4, 1]), f(&[4, 5]), f(&[5])],
                Attrs::new(),
            ),
            0.0,
        );
        check(
            &op(
                "clamp",
                &[f(&[100])],
                Attrs::new()
                    .with("min", Attr::Float(-0.5))
                    .with("max", Attr::Float(0.5)),
            ),
            0.0,
        );
        check(&op("silu", &[h(&[3, 3])], Attrs::new()), 1e-2);
        check(
            &op(
                "cast",
                &[f(&[4, 4])],
                Attrs::new().with("dtype", Attr::DType(DType::F16)),
            ),
            0.0,
        );
        check(
            &op(
                "logsumexp",
                &[f(&[3, 7])],
                Attrs::new().with("dim", Attr::Ints(vec![1])),
            ),
            1e-6,
        );
        check(
            &op(
                "var",
                &[f(&[3, 17])],
                Attrs::new().with("dim", Attr::Ints(vec![1])),
            ),
            1e-5,
        );
        check(
            &op(
                "sum",
                &[f(&[0, 4])],
                Attrs::new().with("dim", Attr::Ints(vec![1])),
            ),
            0.0,
        );
    }

    /// Passes of 64K elements and more split across threads: one long
    /// row splits mid-row (at chunk boundaries), rows of odd length split
    /// mid-row with broadcast operands, reductions split between rows, and
    /// dropout's random draws keep their positions.
    #[test]
    fn threaded_passes_equal_the_reference() {
        let f = |d: &[u64]| TensorType::new(DType::F32, d);
        check(&op("gelu", &[f(&[(1 << 19) + 77])], Attrs::new()), 1e-6);
        check(
            &op("add", &[f(&[3, 100_003]), f(&[100_003])], Attrs::new()),
            0.0,
        );
        check(
            &op(
                "sum",
                &[f(&[5, 70_001])],
                Attrs::new().with("dim", Attr::Ints(vec![1])),
            ),
            1e-6,
        );
        check(
            &op(
                "dropout",
                &[f(&[300_001])],
                Attrs::new()
                    .with("p", Attr::Float(0.25))
                    .with("train", Attr::Bool(true))
                    .with("seed", Attr::Int(7)),
            ),
            0.0,
        );
    }

    /// An f32 constant `v` broadcast to `dims`.
    fn filled(g: &mut crate::ir::GraphBuilder, dims: &[u64], v: f64) -> crate::ir::ValueId {
        let c = g.scalar(DType::F32, v).unwrap();
        let to = Prim::BroadcastInDim {
            dims: dims.to_vec(),
            mapping: vec![],
        };
        g.op(to, &[c]).unwrap()
    }

    /// The sum of each row of a rank-2 value.
    fn sum_rows(g: &mut crate::ir::GraphBuilder, x: crate::ir::ValueId) -> crate::ir::ValueId {
        let sum = Prim::Reduce {
            op: ReduceOp::Sum,
            dimensions: vec![1],
        };
        g.op(sum, &[x]).unwrap()
    }

    /// A row's value broadcast along rows longer than a chunk (a row's
    /// mean in a layer_norm) and constants are held as splats: binary ops
    /// and comparisons read them as scalars (on either side, or both),
    /// every other reader gets them filled, and all equal the reference.
    #[test]
    fn splat_operands_in_every_position_equal_the_reference() {
        use crate::ir::{CompareOp, GraphBuilder};
        let mut g = GraphBuilder::new();
        let dims = [3u64, 1500];
        let x = g.param(TensorType::new(DType::F32, &dims));
        let sum = sum_rows(&mut g, x);
        let col = g.op(Prim::Reshape { dims: vec![3, 1] }, &[sum]).unwrap();
        let m = g
            .op(
                Prim::BroadcastInDim {
                    dims: dims.to_vec(),
                    mapping: vec![0, 1],
                },
                &[col],
            )
            .unwrap();
        let c = filled(&mut g, &dims, 0.25);
        let left = g.binary(BinaryOp::Sub, m, x).unwrap();
        let right = g.binary(BinaryOp::Div, x, m).unwrap();
        let both = g.binary(BinaryOp::Mul, m, c).unwrap();
        let unary = g.unary(UnaryOp::Tanh, m).unwrap();
        let lt = g.op(Prim::Compare(CompareOp::Lt), &[x, m]).unwrap();
        let gt = g.op(Prim::Compare(CompareOp::Gt), &[c, x]).unwrap();
        let picked = g.op(Prim::Select, &[lt, m, x]).unwrap();
        let clamped = g.op(Prim::Clamp, &[c, x, m]).unwrap();
        let mask = g.op(Prim::Convert { to: DType::F32 }, &[gt]).unwrap();
        let graph = g
            .build(&[left, right, both, unary, picked, clamped, mask, m])
            .unwrap();
        check(&graph, 1e-6);
    }

    /// An add, subtract or multiply read only by the next one runs with it
    /// as one `Chain`, with splat operands in each position, and the
    /// results equal node-by-node evaluation exactly. A result that is also
    /// stored, read twice, or the subtrahend of a subtraction is not
    /// joined.
    #[test]
    fn binaries_read_once_run_as_one_chain() {
        use crate::ir::GraphBuilder;
        let mut g = GraphBuilder::new();
        let dims = [4u64, 700];
        let t = TensorType::new(DType::F32, &dims);
        let (x, y, z) = (g.param(t.clone()), g.param(t.clone()), g.param(t));
        let c = filled(&mut g, &dims, 0.75);
        let bin = |g: &mut GraphBuilder, op, a, b| g.binary(op, a, b).unwrap();
        // Joined: (x + y) * z; z * (x - c), the result second; (c * x) - y;
        // (x * y) + c.
        let t1 = bin(&mut g, BinaryOp::Add, x, y);
        let j1 = bin(&mut g, BinaryOp::Mul, t1, z);
        let t2 = bin(&mut g, BinaryOp::Sub, x, c);
        let j2 = bin(&mut g, BinaryOp::Mul, z, t2);
        let t3 = bin(&mut g, BinaryOp::Mul, c, x);
        let j3 = bin(&mut g, BinaryOp::Sub, t3, y);
        let t4 = bin(&mut g, BinaryOp::Mul, x, y);
        let j4 = bin(&mut g, BinaryOp::Add, t4, c);
        // Not joined: z - (x * y); (x + z) also stored; (y - z) read twice.
        let t5 = bin(&mut g, BinaryOp::Mul, x, y);
        let n5 = bin(&mut g, BinaryOp::Sub, z, t5);
        let t6 = bin(&mut g, BinaryOp::Add, x, z);
        let n6 = bin(&mut g, BinaryOp::Mul, t6, y);
        let t7 = bin(&mut g, BinaryOp::Sub, y, z);
        let n7 = bin(&mut g, BinaryOp::Mul, t7, t7);
        let graph = g.build(&[j1, j2, j3, j4, n5, t6, n6, n7]).unwrap();
        check(&graph, 0.0);
        let insts: Vec<Inst> = loops_of(&graph).into_iter().flat_map(|l| l.insts).collect();
        let chains = insts
            .iter()
            .filter(|i| matches!(i, Inst::Chain { .. }))
            .count();
        assert_eq!(chains, 4, "{insts:?}");
    }

    /// The op library's exact GELU runs as one `Inst::Gelu`, in any
    /// operand order; one whose erf is also stored, or whose two products
    /// read different values, is left as it was. (Within 1e-6 of the
    /// reference, whose erf is not the engine's, as in
    /// `fused_ops_equal_the_reference`.)
    #[test]
    fn an_exact_gelu_runs_as_one_instruction() {
        use crate::ir::GraphBuilder;
        let count = |g: &Graph| {
            loops_of(g)
                .into_iter()
                .flat_map(|l| l.insts)
                .filter(|i| matches!(i, Inst::Gelu { .. }))
                .count()
        };
        for d in [DType::F32, DType::BF16, DType::F16] {
            let g = op("gelu", &[TensorType::new(d, &[7, 300])], Attrs::new());
            check(&g, if d == DType::F32 { 1e-6 } else { 1e-2 });
            if d == DType::F32 {
                assert_eq!(count(&g), 1, "{:?}", loops_of(&g));
            }
        }
        let mut g = GraphBuilder::new();
        let dims = [3u64, 500];
        let t = TensorType::new(DType::F32, &dims);
        let (x, y) = (g.param(t.clone()), g.param(t));
        let c = filled(&mut g, &dims, std::f64::consts::FRAC_1_SQRT_2);
        let one = filled(&mut g, &dims, 1.0);
        let half = filled(&mut g, &dims, 0.5);
        let bin = |g: &mut GraphBuilder, op, a, b| g.binary(op, a, b).unwrap();
        // Joined, operands swapped: (x · h) · (1 + erf(c · x)).
        let t1 = bin(&mut g, BinaryOp::Mul, c, x);
        let e = g.unary(UnaryOp::Erf, t1).unwrap();
        let t3 = bin(&mut g, BinaryOp::Add, one, e);
        let hx = bin(&mut g, BinaryOp::Mul, half, x);
        let j = bin(&mut g, BinaryOp::Mul, t3, hx);
        // Not joined: the erf stored too; products of x and of y.
        let t1 = bin(&mut g, BinaryOp::Mul, y, c);
        let stored = g.unary(UnaryOp::Erf, t1).unwrap();
        let t3 = bin(&mut g, BinaryOp::Add, stored, one);
        let hy = bin(&mut g, BinaryOp::Mul, y, half);
        let n1 = bin(&mut g, BinaryOp::Mul, hy, t3);
        let t1 = bin(&mut g, BinaryOp::Mul, y, c);
        let e = g.unary(UnaryOp::Erf, t1).unwrap();
        let t3 = bin(&mut g, BinaryOp::Add, e, one);
        let hx = bin(&mut g, BinaryOp::Mul, x, half);
        let n2 = bin(&mut g, BinaryOp::Mul, hx, t3);
        let graph = g.build(&[j, n1, stored, n2]).unwrap();
        check(&graph, 1e-6);
        assert_eq!(count(&graph), 1, "{:?}", loops_of(&graph));
        // A bias added before it (broadcast along rows) joins it too,
        // unless the sum is read elsewhere.
        for stored in [false, true] {
            let mut g = GraphBuilder::new();
            let x = g.param(TensorType::new(DType::F32, &dims));
            let b = g.param(TensorType::new(DType::F32, &[500]));
            let to = Prim::BroadcastInDim {
                dims: dims.to_vec(),
                mapping: vec![1],
            };
            let bb = g.op(to, &[b]).unwrap();
            let v = bin(&mut g, BinaryOp::Add, x, bb);
            let c = filled(&mut g, &dims, std::f64::consts::FRAC_1_SQRT_2);
            let one = filled(&mut g, &dims, 1.0);
            let half = filled(&mut g, &dims, 0.5);
            let t1 = bin(&mut g, BinaryOp::Mul, v, c);
            let e = g.unary(UnaryOp::Erf, t1).unwrap();
            let t3 = bin(&mut g, BinaryOp::Add, e, one);
            let hv = bin(&mut g, BinaryOp::Mul, v, half);
            let y = bin(&mut g, BinaryOp::Mul, hv, t3);
            let outs = if stored { vec![y, v] } else { vec![y] };
            let graph = g.build(&outs).unwrap();
            check(&graph, 1e-6);
            let insts: Vec<Inst> = loops_of(&graph).into_iter().flat_map(|l| l.insts).collect();
            let biased = insts
                .iter()
                .filter(|i| matches!(i, Inst::Gelu { bias: Some(_), .. }))
                .count();
            assert_eq!(biased, usize::from(!stored), "{insts:?}");
            assert_eq!(count(&graph), 1, "{insts:?}");
        }
    }

    /// SiLU, a gated MLP's `silu(gate) · up` and SiLU's backward, as the
    /// op library emits them, run as one instruction each and keep the
    /// bits of the separate passes (NaN, infinities, -0 and large values
    /// among the inputs); a piece read elsewhere stays apart.
    #[test]
    fn silu_and_its_backward_run_as_one_instruction_each() {
        use crate::ir::GraphBuilder;
        use vmath::logistic_f32;
        let silus = |g: &Graph| -> Vec<Inst> {
            loops_of(g)
                .into_iter()
                .flat_map(|l| l.insts)
                .filter(|i| matches!(i, Inst::Silu { .. } | Inst::SiluGrad { .. }))
                .collect()
        };
        // Inputs with the special values mixed in, and their f32s.
        let special = |ty: &TensorType, seed: u64| {
            let mut t = input(ty, seed);
            let odd = [
                f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                -0.0,
                0.0,
                90.0,
                -90.0,
                1e-40,
                -17.5,
            ];
            for (j, v) in odd.iter().enumerate() {
                let at = (j * 7 + seed as usize) * 4;
                t.bytes_mut()[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
            t
        };
        let f32s = |t: &HostTensor| -> Vec<f32> { bytemuck::cast_slice(t.bytes()).to_vec() };
        // The same bits, any NaN for a NaN.
        let same = |a: &[f32], b: &[f32]| {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(p, q)| p.to_bits() == q.to_bits() || p.is_nan() && q.is_nan())
        };
        let dims = [5u64, 300];
        let t = TensorType::new(DType::F32, &dims);

        // silu alone, from the op library.
        let g = op("silu", std::slice::from_ref(&t), Attrs::new());
        check(&g, 1e-6);
        let x = special(&t, 0);
        let want: Vec<f32> = f32s(&x).iter().map(|&v| v * logistic_f32(v)).collect();
        assert!(
            same(&f32s(&run_fused(&g, std::slice::from_ref(&x))[0]), &want),
            "SiLU differs"
        );
        assert!(
            matches!(silus(&g)[..], [Inst::Silu { scale: None, .. }]),
            "{:?}",
            loops_of(&g)
        );

        // silu(x) · u, and the same with the SiLU stored too.
        for stored in [false, true] {
            let mut g = GraphBuilder::new();
            let (x, u) = (g.param(t.clone()), g.param(t.clone()));
            let sx = g.unary(UnaryOp::Logistic, x).unwrap();
            let y = g.binary(BinaryOp::Mul, sx, x).unwrap();
            let z = g.binary(BinaryOp::Mul, u, y).unwrap();
            let graph = g.build(&if stored { vec![z, y] } else { vec![z] }).unwrap();
            check(&graph, 1e-6);
            let ins = [special(&t, 3), special(&t, 4)];
            let (xs, us) = (f32s(&ins[0]), f32s(&ins[1]));
            let want: Vec<f32> = xs
                .iter()
                .zip(&us)
                .map(|(&v, &w)| (v * logistic_f32(v)) * w)
                .collect();
            let got = run_fused(&graph, &ins);
            assert!(same(&f32s(&got[0]), &want), "gated SiLU differs");
            let found = silus(&graph);
            if stored {
                assert!(
                    matches!(found[..], [Inst::Silu { scale: None, .. }]),
                    "{found:?}"
                );
            } else {
                assert!(
                    matches!(found[..], [Inst::Silu { scale: Some(_), .. }]),
                    "{found:?}"
                );
            }
        }

        // silu_backward(grad, x) from the op library.
        let g = op("silu_backward", &[t.clone(), t.clone()], Attrs::new());
        check(&g, 1e-6);
        let ins = [special(&t, 5), special(&t, 6)];
        let (gs, xs) = (f32s(&ins[0]), f32s(&ins[1]));
        let want: Vec<f32> = gs
            .iter()
            .zip(&xs)
            .map(|(&d, &v)| {
                let s = logistic_f32(v);
                (d * s) * (1.0 + v * (1.0 - s))
            })
            .collect();
        assert!(
            same(&f32s(&run_fused(&g, &ins)[0]), &want),
            "SiLU backward differs"
        );
        assert!(
            matches!(silus(&g)[..], [Inst::SiluGrad { .. }]),
            "{:?}",
            loops_of(&g)
        );

        // Operands swapped: joined; the logistic stored too: apart, and
        // right.
        for stored in [false, true] {
            let mut g = GraphBuilder::new();
            let (d, x) = (g.param(t.clone()), g.param(t.clone()));
            let s = g.unary(UnaryOp::Logistic, x).unwrap();
            let one = filled(&mut g, &dims, 1.0);
            let r = g.binary(BinaryOp::Sub, one, s).unwrap();
            let m = g.binary(BinaryOp::Mul, r, x).unwrap();
            let w = g.binary(BinaryOp::Add, m, one).unwrap();
            let ds = g.binary(BinaryOp::Mul, s, d).unwrap();
            let out = g.binary(BinaryOp::Mul, w, ds).unwrap();
            let graph = g
                .build(&if stored { vec![out, s] } else { vec![out] })
                .unwrap();
            check(&graph, 1e-6);
            let found = silus(&graph);
            if stored {
                assert!(found.is_empty(), "{found:?}");
            } else {
                assert!(matches!(found[..], [Inst::SiluGrad { .. }]), "{found:?}");
            }
        }
    }

    /// A transposed view made contiguous (attention's heads) is one
    /// strided copy, of every dtype a loop reads as f32, and gives the
    /// reference's bits; the same view converted to bf16, or added to, is
    /// a loop pass as before.
    #[test]
    fn a_transpose_made_contiguous_is_one_strided_copy() {
        use crate::ir::GraphBuilder;
        // Heads and positions swapped, as attention's inputs are.
        let heads = |g: &mut GraphBuilder, x| {
            g.op(
                Prim::Transpose {
                    perm: vec![0, 2, 1, 3],
                },
                &[x],
            )
            .unwrap()
        };
        for (from, to, copy) in [
            (DType::F32, DType::F32, true),
            (DType::BF16, DType::F32, true),
            (DType::F16, DType::F32, true),
            (DType::F32, DType::BF16, false),
        ] {
            let mut g = GraphBuilder::new();
            let x = g.param(TensorType::new(from, &[2, 6, 4, 32]));
            let t = heads(&mut g, x);
            let c = g.op(Prim::Convert { to }, &[t]).unwrap();
            let graph = g.build(&[c]).unwrap();
            check(&graph, 0.0);
            let loops = loops_of(&graph);
            assert_eq!(loops.len(), 1, "{loops:?}");
            assert_eq!(loops[0].is_copy(), copy, "{from:?} -> {to:?}: {loops:?}");
        }
        let mut g = GraphBuilder::new();
        let x = g.param(TensorType::new(DType::F32, &[3, 5, 2, 32]));
        let t = heads(&mut g, x);
        let one = filled(&mut g, &[3, 2, 5, 32], 1.0);
        let y = g.binary(BinaryOp::Add, t, one).unwrap();
        let graph = g.build(&[y]).unwrap();
        check(&graph, 0.0);
        assert!(loops_of(&graph).iter().all(|l| !l.is_copy()));
    }

    /// The loop programs of a graph's plan.
    fn loops_of(graph: &Graph) -> Vec<LoopProgram> {
        let plan = crate::fusion::plan(graph);
        compiled(graph, &plan)
            .into_iter()
            .filter_map(|p| match p {
                Some(Program::Loop(l)) => Some(l),
                _ => None,
            })
            .collect()
    }

    /// Every loop program of a graph's plan, row-phase kernels' phases
    /// included.
    fn all_loops_of(graph: &Graph) -> Vec<LoopProgram> {
        let plan = crate::fusion::plan(graph);
        compiled(graph, &plan)
            .into_iter()
            .flat_map(|p| match p {
                Some(Program::Loop(l)) => vec![l],
                Some(Program::Rows(r)) => r.phases,
                None => vec![],
            })
            .collect()
    }

    #[test]
    fn a_sum_of_squares_is_one_pass_and_keeps_its_bits() {
        use crate::ir::GraphBuilder;
        let squared = |g: &Graph| -> usize {
            all_loops_of(g)
                .iter()
                .flat_map(|l| &l.epilogues)
                .filter(|e| e.square)
                .count()
        };
        // layer_norm's variance and rms_norm's mean square.
        for (name, attrs) in [
            (
                "layer_norm",
                Attrs::new().with("normalized_shape", Attr::Ints(vec![700])),
            ),
            (
                "rms_norm",
                Attrs::new().with("normalized_shape", Attr::Ints(vec![700])),
            ),
        ] {
            let g = op(name, &[TensorType::new(DType::F32, &[5, 700])], attrs);
            check(&g, 1e-5);
            assert_eq!(squared(&g), 1, "{name}: {:?}", all_loops_of(&g));
        }
        // sum(x · x) joined, and the same sum of a product that is an
        // output too (not joined): the same bits.
        let mut g = GraphBuilder::new();
        let x = g.param(TensorType::new(DType::F32, &[3, 2500]));
        let sq = g.binary(BinaryOp::Mul, x, x).unwrap();
        let joined = sum_rows(&mut g, sq);
        let kept = g.binary(BinaryOp::Mul, x, x).unwrap();
        let apart = sum_rows(&mut g, kept);
        let graph = g.build(&[joined, apart, kept]).unwrap();
        check(&graph, 1e-6);
        assert_eq!(squared(&graph), 1, "{:?}", all_loops_of(&graph));
        let out = run_fused(&graph, &[input(&graph.param_types()[0], 3)]);
        assert_eq!(
            out[0].bytes(),
            out[1].bytes(),
            "the joined sum of squares differs"
        );
    }

    /// A stored result is computed straight into its sink (the `Store`
    /// copies nothing), and what reads it after the store reads it there;
    /// one rounded to bf16 first is not, and all equal the reference.
    #[test]
    fn stored_results_are_written_into_their_sinks() {
        use crate::ir::GraphBuilder;
        let mut g = GraphBuilder::new();
        let dims = [3u64, 1500];
        let t = TensorType::new(DType::F32, &dims);
        let (x, y, z) = (g.param(t.clone()), g.param(t.clone()), g.param(t));
        let bin = |g: &mut GraphBuilder, op, a, b| g.binary(op, a, b).unwrap();
        // a stored, then read by b (also stored) and by the reduction.
        let a = bin(&mut g, BinaryOp::Add, x, y);
        let b = bin(&mut g, BinaryOp::Mul, a, z);
        let e = g.unary(UnaryOp::Neg, b).unwrap();
        let c = bin(&mut g, BinaryOp::Sub, e, a);
        let h = g.op(Prim::Convert { to: DType::BF16 }, &[c]).unwrap();
        let total = sum_rows(&mut g, a);
        let graph = g.build(&[a, b, c, h, total]).unwrap();
        check(&graph, 0.0);
        let loops = loops_of(&graph);
        assert_eq!(loops.len(), 1, "{loops:?}");
        let l = &loops[0];
        let written: Vec<ValueId> = l.into.iter().flatten().map(|&k| l.stores[k].1).collect();
        // Every f32 result computed into its sink; the bf16 one rounded
        // in its register and copied.
        assert_eq!(written, vec![a, b, c], "{:?}", l.insts);
    }

    /// A dropout's mask is a comparison (already 0 or 1) converted to f32
    /// (already the value): neither costs an instruction, and the result
    /// equals the reference.
    #[test]
    fn a_dropout_mask_is_neither_rounded_nor_copied() {
        let g = op(
            "dropout",
            &[TensorType::new(DType::F32, &[5, 300])],
            Attrs::new()
                .with("p", Attr::Float(0.25))
                .with("train", Attr::Bool(true))
                .with("seed", Attr::Int(7)),
        );
        check(&g, 0.0);
        let loops = loops_of(&g);
        assert_eq!(loops.len(), 1, "{loops:?}");
        let insts = &loops[0].insts;
        // The mask is an output too (read twice): compared on its own.
        assert!(
            insts.iter().any(|i| matches!(i, Inst::Compare { .. })),
            "{insts:?}"
        );
        assert!(
            !insts
                .iter()
                .any(|i| matches!(i, Inst::Move { .. } | Inst::Round { .. })),
            "{insts:?}"
        );
    }

    /// `(x · (u < keep)) · scale + r` over `dims`, as the op library's
    /// dropout and a residual add write it; returns (the sum, the product
    /// before it, the mask).
    fn dropout_residual(
        g: &mut crate::ir::GraphBuilder,
        x: crate::ir::ValueId,
        r: crate::ir::ValueId,
        dims: &[u64],
    ) -> (crate::ir::ValueId, crate::ir::ValueId, crate::ir::ValueId) {
        let key = |g: &mut crate::ir::GraphBuilder, v: i64| {
            let c = Prim::Constant {
                dtype: DType::I64,
                dims: vec![],
                bytes: v.to_le_bytes().to_vec(),
            };
            g.op(c, &[]).unwrap()
        };
        let (seed, offset) = (key(g, 1234), key(g, 77));
        let u = g
            .op(
                Prim::Rng {
                    distribution: crate::ir::RngDistribution::Uniform,
                    dtype: DType::F32,
                    dims: dims.to_vec(),
                },
                &[seed, offset],
            )
            .unwrap();
        let keep = filled(g, dims, 0.75);
        let mask = g.op(Prim::Compare(CompareOp::Lt), &[u, keep]).unwrap();
        let m = g.op(Prim::Convert { to: DType::F32 }, &[mask]).unwrap();
        let y = g.binary(BinaryOp::Mul, x, m).unwrap();
        let scale = filled(g, dims, 1.0 / 0.75);
        let z = g.binary(BinaryOp::Mul, y, scale).unwrap();
        (g.binary(BinaryOp::Add, r, z).unwrap(), z, mask)
    }

    #[test]
    fn dropout_and_its_residual_add_run_as_one_instruction() {
        use crate::ir::GraphBuilder;
        let dropouts = |g: &Graph| -> Vec<Inst> {
            loops_of(g)
                .into_iter()
                .flat_map(|l| l.insts)
                .filter(|i| matches!(i, Inst::Dropout { .. } | Inst::Compare { .. }))
                .collect()
        };
        let dims = [6u64, 700];
        let t = TensorType::new(DType::F32, &dims);
        // Joined with its add, whichever side of it.
        let mut g = GraphBuilder::new();
        let (x, r) = (g.param(t.clone()), g.param(t.clone()));
        let (out, _, _) = dropout_residual(&mut g, x, r, &dims);
        let graph = g.build(&[out]).unwrap();
        check(&graph, 0.0);
        let found = dropouts(&graph);
        assert!(
            matches!(
                found[..],
                [Inst::Dropout {
                    residual: Some(_),
                    ..
                }]
            ),
            "{found:?}"
        );
        // The product before the add is an output too: joined without it.
        let mut g = GraphBuilder::new();
        let (x, r) = (g.param(t.clone()), g.param(t.clone()));
        let (out, z, _) = dropout_residual(&mut g, x, r, &dims);
        let graph = g.build(&[out, z]).unwrap();
        check(&graph, 0.0);
        let found = dropouts(&graph);
        assert!(
            matches!(found[..], [Inst::Dropout { residual: None, .. }]),
            "{found:?}"
        );
        // The mask is an output too: not joined.
        let mut g = GraphBuilder::new();
        let (x, r) = (g.param(t.clone()), g.param(t));
        let (out, _, mask) = dropout_residual(&mut g, x, r, &dims);
        let graph = g.build(&[out, mask]).unwrap();
        check(&graph, 0.0);
        let found = dropouts(&graph);
        assert!(matches!(found[..], [Inst::Compare { .. }]), "{found:?}");
        // NaN and infinite inputs keep their bits' meaning through the
        // joined form (x · 0 is NaN for them, as unjoined).
        let mut g = GraphBuilder::new();
        let t = TensorType::new(DType::F32, &[4, 16]);
        let (x, r) = (g.param(t.clone()), g.param(t));
        let (out, _, _) = dropout_residual(&mut g, x, r, &[4, 16]);
        let graph = g.build(&[out]).unwrap();
        let mut xs = input(&graph.param_types()[0], 0);
        for (j, v) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0]
            .iter()
            .cycle()
            .take(64)
            .enumerate()
        {
            if j % 3 == 0 {
                xs.bytes_mut()[j * 4..j * 4 + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
        let inputs = vec![xs, input(&graph.param_types()[1], 1)];
        let want = eval_graph(&graph, &inputs).unwrap();
        assert_eq!(
            run_fused(&graph, &inputs)[0].bytes(),
            want[0].bytes(),
            "joined dropout differs from the reference"
        );
    }

    /// Whether the row-phase kernels of `graph`'s plan run block by block
    /// (one entry per row kernel).
    fn blocked_row_kernels(graph: &Graph) -> Vec<bool> {
        let plan = crate::fusion::plan(graph);
        compiled(graph, &plan)
            .into_iter()
            .filter_map(|p| match p {
                Some(Program::Rows(r)) => Some(r.blocked()),
                _ => None,
            })
            .collect()
    }

    /// Softmax, log_softmax, layer_norm and rms_norm are row-phase kernels
    /// run block by block, and give the node-by-node result: passes that
    /// split across threads, rows longer than a block (a row a block), a
    /// last block shorter than the others, half precision.
    #[test]
    fn row_phase_kernels_run_block_by_block_and_equal_the_reference() {
        let f = |d: &[u64]| TensorType::new(DType::F32, d);
        let h = |d: &[u64]| TensorType::new(DType::BF16, d);
        let last = Attrs::new().with("dim", Attr::Int(-1));
        let norm = |n: i64| Attrs::new().with("normalized_shape", Attr::Ints(vec![n]));
        let cases: Vec<(Graph, f64)> = vec![
            (op("softmax", &[f(&[8, 8, 64, 256])], last.clone()), 1e-6),
            (op("softmax", &[f(&[3, 40_001])], last.clone()), 1e-6),
            (op("log_softmax", &[f(&[37, 300])], last.clone()), 1e-6),
            (op("log_softmax", &[h(&[301, 260])], last.clone()), 1e-2),
            (
                op(
                    "layer_norm",
                    &[f(&[1000, 96]), f(&[96]), f(&[96])],
                    norm(96),
                ),
                1e-5,
            ),
            (
                op("rms_norm", &[h(&[513, 128]), h(&[128])], norm(128)),
                1e-2,
            ),
            (
                op("rms_norm", &[f(&[700, 100]), f(&[100])], norm(100)),
                1e-5,
            ),
        ];
        // Nothing to run: however it runs, it gives an empty result.
        check(&op("softmax", &[f(&[0, 16])], last.clone()), 0.0);
        check(&op("layer_norm", &[f(&[0, 8])], norm(8)), 0.0);
        for (graph, tol) in cases {
            let blocked = blocked_row_kernels(&graph);
            assert!(
                !blocked.is_empty() && blocked.iter().all(|&b| b),
                "{blocked:?}\n{graph}"
            );
            check(&graph, tol);
        }
    }

    /// A transposed view passed in and transposed back (attention's keys
    /// as `k.transpose(-2, -1)`) is its memory, read in place; a view the
    /// transpose does not undo, or one with gaps, is transposed by the
    /// kernel. Each gives the transpose of what the view shows.
    #[test]
    fn a_transpose_undoing_a_view_reads_its_memory() {
        use crate::{DeviceTensor, Layout, Runtime, RuntimeOptions};
        let r = Runtime::new(&RuntimeOptions {
            platform: Some("host".into()),
            cache: Some(crate::compile::CacheConfig::memory_only(16)),
            ..Default::default()
        })
        .unwrap();
        let s = r.default_stream(0).unwrap();
        let (a, b, c) = (2u64, 3u64, 5u64);
        let vals: Vec<f32> = (0..2 * a * b * c).map(|i| i as f32).collect();
        let buf = r.allocate(0, vals.len() as u64 * 4, &s).unwrap();
        r.copy_host_to_device(
            bytemuck::cast_slice(&vals),
            &buf,
            &Layout::bytes(buf.len()),
            &s,
        )
        .unwrap();
        // (view sizes, view strides, transpose perm): memory [a, b, c]
        // seen as [a, c, b] and transposed back; the same view transposed
        // otherwise; every other element (gaps) transposed back.
        let cases: [(&[u64], &[u64], &[usize]); 3] = [
            (&[a, c, b], &[b * c, 1, c], &[0, 2, 1]),
            (&[a, c, b], &[b * c, 1, c], &[1, 0, 2]),
            (&[a, c, b], &[2 * b * c, 2, 2 * c], &[0, 2, 1]),
        ];
        for (sizes, strides, perm) in cases {
            let view = DeviceTensor {
                buffer: buf.clone(),
                dtype: DType::F32,
                layout: Layout {
                    offset: 0,
                    sizes: sizes.into(),
                    strides: strides.into(),
                    elem_size: 4,
                },
            };
            let mut g = crate::ir::GraphBuilder::new();
            let x = g.param(view.ty());
            let y = g
                .op(
                    Prim::Transpose {
                        perm: perm.to_vec(),
                    },
                    &[x],
                )
                .unwrap();
            let exe = super::super::executable::HostExecutable::new(g.build(&[y]).unwrap());
            let out_ty = crate::platform::Executable::output_types(&exe)[0].clone();
            let ob = r.allocate(0, out_ty.nbytes(), &s).unwrap();
            let out = DeviceTensor::contiguous(ob, DType::F32, &out_ty.dims).unwrap();
            crate::platform::Executable::execute(
                &exe,
                std::slice::from_ref(&view),
                std::slice::from_ref(&out),
            )
            .unwrap();
            let mut got = vec![0u8; out_ty.nbytes() as usize];
            r.copy_device_to_host(&out.buffer, &out.layout, &mut got, &s)
                .unwrap();
            let got: &[f32] = bytemuck::cast_slice(&got);
            // The reference: the view read element by element, transposed.
            let at =
                |ix: &[u64]| vals[ix.iter().zip(strides).map(|(i, s)| i * s).sum::<u64>() as usize];
            let od = &out_ty.dims;
            let mut k = 0;
            for i in 0..od[0] {
                for j in 0..od[1] {
                    for l in 0..od[2] {
                        let o = [i, j, l];
                        let mut ix = [0u64; 3];
                        for d in 0..3 {
                            ix[perm[d]] = o[d];
                        }
                        assert_eq!(got[k], at(&ix), "{sizes:?} {strides:?} {perm:?} at {o:?}");
                        k += 1;
                    }
                }
            }
        }
    }

    /// A phase that reads a row's sum broadcast down the columns instead of
    /// along its row needs every row's sum first: the kernel then runs its
    /// phases one after another over the whole space, with the result
    /// separate passes give (threaded too).
    #[test]
    fn row_kernels_read_other_rows_phase_after_phase() {
        for n in [12u64, 300] {
            let mut g = crate::ir::GraphBuilder::new();
            let x = g.param(TensorType::new(DType::F32, &[n, n]));
            let e = g.unary(UnaryOp::Exp, x).unwrap();
            let s = g
                .op(
                    Prim::Reduce {
                        op: ReduceOp::Sum,
                        dimensions: vec![1],
                    },
                    &[e],
                )
                .unwrap();
            let down = g
                .op(
                    Prim::BroadcastInDim {
                        dims: vec![n, n],
                        mapping: vec![1],
                    },
                    &[s],
                )
                .unwrap();
            let y = g.binary(BinaryOp::Div, e, down).unwrap();
            let graph = g.build(&[y]).unwrap();
            assert_eq!(blocked_row_kernels(&graph), [false], "{graph}");
            check(&graph, 1e-6);
        }
    }

    #[test]
    fn strided_parameters_step_with_their_own_strides_where_they_can() {
        // A transposed [8, 300] of [300, 8] memory, read in order.
        assert_eq!(
            strides_in_place(&[8, 300], &[300, 1], &[8, 300], &[1, 8]),
            Some(vec![1, 8])
        );
        // Read through a transpose in the loop, and broadcast along a new
        // dimension; an expanded view keeps its zero stride.
        assert_eq!(
            strides_in_place(&[300, 4, 8], &[1, 0, 300], &[8, 300], &[0, 1]),
            Some(vec![1, 0, 0])
        );
        // A loop dimension merging two of the value's: gathered.
        assert_eq!(
            strides_in_place(&[8, 300], &[300, 1], &[8, 2, 150], &[1, 8, 16]),
            None
        );
        // Two loop dimensions stepping through one: gathered.
        assert_eq!(strides_in_place(&[2, 4], &[1, 1], &[1, 4], &[4, 1]), None);
    }

    /// A row's reduction broadcast along the row, reshaped to another
    /// shape and back (the shape between has no strides), is read by the
    /// next phase in place (found by the random graphs below: the phase
    /// did not compile).
    #[test]
    fn a_run_of_reshapes_reads_as_one() {
        use crate::ir::GraphBuilder;
        let (rows, cols) = (2u64, 3u64);
        let mut g = GraphBuilder::new();
        let x = g.param(TensorType::new(DType::F32, &[rows, cols]));
        let r = sum_rows(&mut g, x);
        let r2 = g
            .op(
                Prim::Reshape {
                    dims: vec![rows, 1],
                },
                &[r],
            )
            .unwrap();
        let b = g
            .op(
                Prim::BroadcastInDim {
                    dims: vec![rows, cols],
                    mapping: vec![0, 1],
                },
                &[r2],
            )
            .unwrap();
        let flip = g
            .op(
                Prim::Reshape {
                    dims: vec![cols, rows],
                },
                &[b],
            )
            .unwrap();
        let back = g
            .op(
                Prim::Reshape {
                    dims: vec![rows, cols],
                },
                &[flip],
            )
            .unwrap();
        let e = g.unary(UnaryOp::Exp, back).unwrap();
        let graph = g.build(&[e, flip]).unwrap();
        let plan = crate::fusion::plan(&graph);
        assert!(plan
            .kernels
            .iter()
            .any(|k| matches!(k.kind, KernelKind::Rows { .. })));
        check(&graph, 1e-5);
    }

    #[test]
    fn view_strides_split_and_merge_only_what_lies_in_order() {
        // Contiguous: any reshape.
        assert_eq!(view_strides(&[4, 6], &[6, 1], &[2, 12]), Some(vec![12, 1]));
        assert_eq!(view_strides(&[4, 6], &[6, 1], &[24]), Some(vec![1]));
        // A transposed [6, 4] read as [4, 6]: splitting a dimension works,
        // merging the two does not.
        assert_eq!(
            view_strides(&[6, 4], &[1, 6], &[3, 2, 4]),
            Some(vec![2, 1, 6])
        );
        assert_eq!(view_strides(&[6, 4], &[1, 6], &[24]), None);
        // Heads: [b, s, h, d] transposed to [b, h, s, d], merged back only
        // where dimensions stay in order.
        let (dims, strides) = ([2, 8, 3, 4], [96, 4, 32, 1]);
        assert_eq!(view_strides(&dims, &strides, &[16, 3, 4]), None);
        assert_eq!(view_strides(&dims, &strides, &[2, 8, 12]), None);
        assert_eq!(
            view_strides(&dims, &strides, &[2, 8, 3, 2, 2]),
            Some(vec![96, 4, 32, 2, 1])
        );
        // Extent-one dimensions come and go; broadcast (stride 0) stays 0.
        assert_eq!(
            view_strides(&[1, 5, 1], &[0, 2, 7], &[5, 1, 1]),
            Some(vec![2, 0, 0])
        );
        assert_eq!(
            view_strides(&[3, 4], &[0, 1], &[3, 2, 2]),
            Some(vec![0, 2, 1])
        );
        assert_eq!(view_strides(&[3, 4], &[0, 1], &[12]), None);
        assert_eq!(view_strides(&[3, 4], &[0, 0], &[12]), Some(vec![0]));
        // Element counts must agree; empty tensors need no strides.
        assert_eq!(view_strides(&[3, 4], &[4, 1], &[5]), None);
        assert_eq!(view_strides(&[0, 4], &[4, 1], &[4, 0]), Some(vec![0, 0]));
    }

    /// Rotary embedding over heads taken from a product, as Llama runs it:
    /// the passes read the heads through the reshape and transpose, and
    /// the negated half through its slice, in place (nothing gathered
    /// first); only what the concatenation reads (which no pass can) is
    /// stored: the transposed heads and the other half. The result is the
    /// reference's.
    #[test]
    fn head_transposes_and_half_slices_are_read_in_place() {
        let (b, s, h, d) = (2u64, 5, 3, 8);
        let mut g = crate::ir::GraphBuilder::new();
        let q = g.param(TensorType::new(DType::F32, &[b * s, h * d]));
        let cos = g.param(TensorType::new(DType::F32, &[s, d]));
        let sin = g.param(TensorType::new(DType::F32, &[s, d]));
        let w = g.param(TensorType::new(DType::F32, &[h * d, h * d]));
        let proj = g
            .op(
                Prim::DotGeneral {
                    lhs_batch: vec![],
                    rhs_batch: vec![],
                    lhs_contract: vec![1],
                    rhs_contract: vec![0],
                    precision: Default::default(),
                },
                &[q, w],
            )
            .unwrap();
        let split = g
            .op(
                Prim::Reshape {
                    dims: vec![b, s, h, d],
                },
                &[proj],
            )
            .unwrap();
        let heads = g
            .op(
                Prim::Transpose {
                    perm: vec![0, 2, 1, 3],
                },
                &[split],
            )
            .unwrap();
        let shape = vec![b, h, s, d];
        let half = |g: &mut crate::ir::GraphBuilder, from: u64| {
            let mut start = vec![0; 4];
            start[3] = from;
            let mut limit = shape.clone();
            limit[3] = from + d / 2;
            g.op(
                Prim::Slice {
                    start,
                    limit,
                    stride: vec![1; 4],
                },
                &[heads],
            )
            .unwrap()
        };
        let (x1, x2) = (half(&mut g, 0), half(&mut g, d / 2));
        let neg = g.unary(UnaryOp::Neg, x2).unwrap();
        let rotated = g
            .op(Prim::Concatenate { dimension: 3 }, &[neg, x1])
            .unwrap();
        let rows = |g: &mut crate::ir::GraphBuilder, t| {
            g.op(
                Prim::BroadcastInDim {
                    dims: shape.clone(),
                    mapping: vec![2, 3],
                },
                &[t],
            )
            .unwrap()
        };
        let (c, sn) = (rows(&mut g, cos), rows(&mut g, sin));
        let a = g.binary(BinaryOp::Mul, heads, c).unwrap();
        let r = g.binary(BinaryOp::Mul, rotated, sn).unwrap();
        let out = g.binary(BinaryOp::Add, a, r).unwrap();
        let graph = g.build(&[out]).unwrap();
        let plan = crate::fusion::plan(&graph);
        let own: Vec<String> = plan
            .kernels
            .iter()
            .filter(|k| matches!(k.kind, KernelKind::Single))
            .map(|k| graph.nodes()[k.nodes[0]].prim.name())
            .collect();
        assert_eq!(
            own,
            [
                "dot_general",
                "reshape",
                "transpose",
                "slice",
                "concatenate"
            ],
            "{plan:?}"
        );
        for k in &plan.kernels {
            if matches!(k.kind, KernelKind::Loop { .. }) {
                let p = LoopProgram::compile(&graph, k).unwrap();
                assert!(
                    p.materialize.is_empty(),
                    "gathered first: {:?}",
                    p.materialize
                );
            }
        }
        check(&graph, 1e-6);
    }

    /// Chunks span several short rows: a transposed operand read row by
    /// row inside one chunk, with and without a reduction over the short
    /// rows, in shapes whose rows end at odd places in a chunk, big enough
    /// to split across threads, and rows of a single element.
    #[test]
    fn chunks_across_short_rows_equal_the_reference() {
        let shapes: [&[u64]; 4] = [
            &[8, 128, 8, 32],
            &[2, 3, 5, 3],
            &[3, 700, 1, 7],
            &[4, 300, 1, 1],
        ];
        for dims in shapes {
            for reduce in [false, true] {
                let mut g = crate::ir::GraphBuilder::new();
                let x = g.param(TensorType::new(DType::F32, dims));
                let moved: Vec<u64> = [0, 2, 1, 3].iter().map(|&d| dims[d]).collect();
                let y = g.param(TensorType::new(DType::F32, &moved));
                let z = g.param(TensorType::new(DType::F32, &moved[2..]));
                let xt = g
                    .op(
                        Prim::Transpose {
                            perm: vec![0, 2, 1, 3],
                        },
                        &[x],
                    )
                    .unwrap();
                let prod = g.binary(BinaryOp::Mul, xt, y).unwrap();
                // A row broadcast over the short rows (rotary's cos and sin).
                let rows = Prim::BroadcastInDim {
                    dims: moved.clone(),
                    mapping: vec![2, 3],
                };
                let zb = g.op(rows, &[z]).unwrap();
                let biased = g.binary(BinaryOp::Add, prod, zb).unwrap();
                let mut out = g.unary(UnaryOp::Exp, biased).unwrap();
                if reduce {
                    let sum_rows = Prim::Reduce {
                        op: ReduceOp::Sum,
                        dimensions: vec![3],
                    };
                    out = g.op(sum_rows, &[out]).unwrap();
                }
                let graph = g.build(&[out]).unwrap();
                let plan = crate::fusion::plan(&graph);
                let last = plan.kernels.last().map(|k| &k.kind);
                assert!(
                    matches!(last, Some(KernelKind::Loop { .. })),
                    "{dims:?}: {plan:?}"
                );
                check(&graph, 1e-6);
            }
        }
    }

    #[derive(Clone, Debug)]
    enum Node {
        Unary(UnaryOp),
        Binary(BinaryOp, usize),
        BroadcastRow,
        ReduceLast(ReduceOp),
        ToBf16,
        /// Swap the two dimensions.
        Transpose,
        /// Columns from `start` (mod the width) by `step`.
        SliceCols(u64, u64),
        /// Reshape [a, b] to [b, a] (a view of a transposed value only
        /// when a or b is 1).
        ReshapeFlip,
    }

    fn node() -> impl Strategy<Value = Node> {
        prop_oneof![
            prop::sample::select(vec![
                UnaryOp::Exp,
                UnaryOp::Tanh,
                UnaryOp::Neg,
                UnaryOp::Logistic,
                UnaryOp::Erf,
                UnaryOp::Abs
            ])
            .prop_map(Node::Unary),
            (
                prop::sample::select(vec![
                    BinaryOp::Add,
                    BinaryOp::Mul,
                    BinaryOp::Sub,
                    BinaryOp::Max,
                    BinaryOp::Min
                ]),
                0..8usize
            )
                .prop_map(|(o, k)| Node::Binary(o, k)),
            Just(Node::BroadcastRow),
            prop::sample::select(vec![ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min])
                .prop_map(Node::ReduceLast),
            Just(Node::ToBf16),
            Just(Node::Transpose),
            (0..8u64, 1..4u64).prop_map(|(a, k)| Node::SliceCols(a, k)),
            Just(Node::ReshapeFlip),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        /// Random elementwise graphs with broadcasts and trailing reductions:
        /// the fused plan equals node-by-node evaluation.
        #[test]
        fn random_fused_graphs_equal_the_reference(nodes in prop::collection::vec(node(), 1..16), rows in 1..5u64, cols in 1..40u64) {
            use crate::ir::GraphBuilder;
            let mut g = GraphBuilder::new();
            let x = g.param(TensorType::new(DType::F32, &[rows, cols]));
            let b = g.param(TensorType::new(DType::F32, &[cols]));
            let mut vals = vec![x];
            for n in &nodes {
                let last = *vals.last().unwrap();
                let t = g.value_type(last).unwrap().clone();
                let v = match n {
                    Node::Unary(op) => g.unary(*op, last),
                    Node::Binary(op, k) => {
                        let other = vals[k % vals.len()];
                        if g.value_type(other).unwrap() == &t { g.binary(*op, last, other) } else { Ok(last) }
                    }
                    Node::BroadcastRow if t.dims == vec![rows, cols] => {
                        let bb = g.op(Prim::BroadcastInDim { dims: vec![rows, cols], mapping: vec![1] }, &[b]).unwrap();
                        let bb = if t.dtype == DType::F32 { bb } else { g.op(Prim::Convert { to: t.dtype }, &[bb]).unwrap() };
                        g.binary(BinaryOp::Add, last, bb)
                    }
                    Node::ReduceLast(op) if t.rank() == 2 && t.dtype == DType::F32 => {
                        let r = g.op(Prim::Reduce { op: *op, dimensions: vec![1] }, &[last]).unwrap();
                        let r2 = g.op(Prim::Reshape { dims: vec![t.dims[0], 1] }, &[r]).unwrap();
                        g.op(Prim::BroadcastInDim { dims: t.dims.clone(), mapping: vec![0, 1] }, &[r2])
                    }
                    Node::ToBf16 => g.op(Prim::Convert { to: DType::BF16 }, &[last]),
                    Node::Transpose if t.rank() == 2 => g.op(Prim::Transpose { perm: vec![1, 0] }, &[last]),
                    Node::SliceCols(a, k) if t.rank() == 2 && t.dims[1] > 0 => {
                        let start = a % t.dims[1];
                        g.op(Prim::Slice { start: vec![0, start], limit: t.dims.clone(), stride: vec![1, *k] }, &[last])
                    }
                    Node::ReshapeFlip if t.rank() == 2 => g.op(Prim::Reshape { dims: vec![t.dims[1], t.dims[0]] }, &[last]),
                    _ => Ok(last),
                }.unwrap();
                vals.push(v);
            }
            let outs = vec![*vals.last().unwrap(), vals[vals.len() / 2]];
            let graph = g.build(&outs).unwrap();
            let tol = if graph.output_types().iter().any(|t| t.dtype == DType::BF16) { 1e-2 } else { 1e-5 };
            check(&graph, tol);
        }
    }
}
