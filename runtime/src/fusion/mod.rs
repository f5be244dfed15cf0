//! The fusion planner: the one place that decides where a kernel ends and
//! the next begins. Platforms take its plan as it is.
//!
//! Rules, applied in graph order:
//! - A *loop group* computes elementwise nodes (unary, binary, compare,
//!   select, clamp, convert) that share one iteration shape, in one pass.
//!   An elementwise node joins the newest group among its operands'
//!   producers when that group is a loop over its shape without an
//!   epilogue; otherwise the newest such loop that runs after all of its
//!   operands' producers (so a node reading only parameters joins the pass
//!   already under way); otherwise it starts a new loop group.
//! - A `reduce` over trailing dimensions of a loop group's shape, whose
//!   operand that group computes, becomes the group's epilogue: the same
//!   pass accumulates it. One set of trailing dimensions per group;
//!   after an epilogue the group takes no more nodes.
//! - *Loads*: a scalar constant, or a `broadcast_in_dim` / `reshape` whose
//!   operand is stored (a parameter or another kernel's result), is not run
//!   at all when only loop groups consume it and the graph does not return
//!   it: the groups read its operand through its index map.
//! - *Row phases*: a loop group with a trailing reduction, and the later
//!   loop groups over the same shape that read its reduction broadcast
//!   back along the reduced dimensions (softmax's max, then its sum, then
//!   its divide; layer_norm's mean, variance and normalization), become one
//!   kernel of several phases when each later phase reads only values
//!   ready before the first (parameters, earlier kernels) and, of the
//!   phases before it, f32 reductions through reshapes and broadcasts and
//!   f32 full-shape values element for element. A phase may also loop over
//!   the rows alone (layer_norm's `rsqrt(var / n + eps)`), reading rows'
//!   values; later phases read its f32 results as they read reductions.
//!   Rows are at most
//!   `ROW_PHASE_MAX` elements. A platform may run such a kernel row block
//!   by row block, every phase over a block before the next block, so a
//!   value passed between phases lives in cache, not memory.
//! - Loop groups hold f32, bf16, f16 and bool values; other dtypes run node
//!   by node. Every other node is a kernel of its own.
//! - A kernel stores a value when a later kernel (directly or through a
//!   load) uses it, or the graph returns it; other values stay in the pass.

mod attention;
mod simplify;

pub use attention::fuse_attention;
pub use simplify::{dot_operand_through_transpose, simplify};

use std::collections::HashSet;

use crate::ir::{DType, Graph, Node, Prim, ReduceOp, RngDistribution, ValueId};

#[derive(Clone, Debug, PartialEq)]
pub enum KernelKind {
    /// One node, run by the platform's primitive kernel.
    Single,
    /// Elementwise nodes over `shape`; the last `reduce_dims` dimensions
    /// are reduced by epilogue nodes (0 when there are none).
    Loop { shape: Vec<u64>, reduce_dims: usize },
    /// Loop groups over `shape` run as phases of one kernel (see *Row
    /// phases* above): each phase is a `Loop` kernel whose `stores` are
    /// the values it must keep, those of the whole kernel (stored to
    /// memory) and those later phases read (kept per row block). The
    /// first phase reduces the last `reduce_dims` dimensions; a later one
    /// reduces the same ones or none, or loops over the rows alone (a
    /// shape of as many elements as `shape` has rows).
    Rows {
        shape: Vec<u64>,
        reduce_dims: usize,
        phases: Vec<Kernel>,
    },
}

/// The longest row (elements reduced per output) a row-phase kernel
/// takes: a block of rows and the values its phases pass on should stay in
/// a core's cache (64K f32 elements are 256 KiB).
pub const ROW_PHASE_MAX: u64 = 1 << 16;

#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub kind: KernelKind,
    /// Indices into `graph.nodes()`, in graph order.
    pub nodes: Vec<usize>,
    /// Values this kernel must store, ascending.
    pub stores: Vec<ValueId>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub kernels: Vec<Kernel>,
    /// Load nodes that are not run: loop groups read through them.
    pub folded_loads: HashSet<usize>,
}

impl Plan {
    /// For each kernel, the values no later kernel reads and the graph does
    /// not return: a platform may free them once the kernel has run, so a
    /// large graph (a whole training step) holds only what is still to be
    /// used, not every intermediate until its end. A value read through a
    /// load (folded or not: a loop may read through either) counts as read
    /// by the kernel that reads the load.
    pub fn dead_after(&self, graph: &Graph) -> Vec<Vec<ValueId>> {
        let nodes = graph.nodes();
        let producer = graph.producers();
        let mut last: Vec<Option<usize>> = vec![None; graph.num_values()];
        for (k, ker) in self.kernels.iter().enumerate() {
            for &i in &ker.nodes {
                for o in &nodes[i].outputs {
                    last[o.0 as usize].get_or_insert(k);
                }
                for &v in &nodes[i].inputs {
                    let mut v = v;
                    loop {
                        last[v.0 as usize] = Some(k);
                        match producer[v.0 as usize] {
                            Some(p) if is_load(graph, &nodes[p]) => match nodes[p].inputs.first() {
                                Some(&u) => v = u,
                                None => break,
                            },
                            _ => break,
                        }
                    }
                }
            }
        }
        for v in graph.outputs() {
            last[v.0 as usize] = None;
        }
        let mut dead = vec![Vec::new(); self.kernels.len()];
        for (v, k) in last.iter().enumerate() {
            if let Some(k) = k {
                dead[*k].push(ValueId(v as u32));
            }
        }
        dead
    }

    /// Loop passes: one per loop kernel, one per phase of a row kernel.
    pub fn loop_count(&self) -> usize {
        self.kernels
            .iter()
            .map(|k| match &k.kind {
                KernelKind::Loop { .. } => 1,
                KernelKind::Rows { phases, .. } => phases.len(),
                KernelKind::Single => 0,
            })
            .sum()
    }
}

fn loop_dtype(d: DType) -> bool {
    matches!(d, DType::F32 | DType::BF16 | DType::F16 | DType::Bool)
}

/// A node a loop group reads through instead of reading its result: a
/// scalar constant, a broadcast, a reshape, a transpose, a static slice
/// (the loop reads the value underneath with strides and an offset, so
/// views of activations cost no copy), or a conversion to f32 of a
/// dtype loops do not hold (a pass reads such a value widened to f32,
/// which is what the conversion computes). The last keeps a Python
/// scalar's upload (an f64 converted to f32) from ordering the passes
/// that use it: an optimizer's per-parameter updates then share passes.
pub fn is_load(graph: &Graph, node: &Node) -> bool {
    match &node.prim {
        Prim::Constant { dims, dtype, .. } => dims.is_empty() && loop_dtype(*dtype),
        Prim::BroadcastInDim { .. }
        | Prim::Reshape { .. }
        | Prim::Transpose { .. }
        | Prim::Slice { .. } => true,
        Prim::Convert { to: DType::F32 } => node
            .inputs
            .first()
            .is_some_and(|v| widens_exactly(graph.value_type(*v).dtype)),
        Prim::Concatenate { dimension } => views_joined(graph, node, *dimension),
        _ => false,
    }
}

/// Whether a concatenation is one a loop reads piece by piece: along the
/// last dimension, of a dtype loops hold, its operands all views (through
/// loads) of one stored value, or all scalar constants (rotary
/// embeddings' `rotate_half` as `simplify` leaves it: a head's halves
/// swapped, and a sign for each half). Then, as for any load, the value
/// under the first operand is the one the concatenation reads.
fn views_joined(graph: &Graph, node: &Node, dimension: usize) -> bool {
    let out = graph.value_type(node.outputs[0]);
    dimension + 1 == out.rank() && loop_dtype(out.dtype) && views_of_one(graph, &node.inputs)
}

/// Whether `parts` are all views (through loads) of one stored value, or
/// all scalar constants: concatenated along the last dimension, what a
/// loop reads piece by piece (see `views_joined`).
pub(crate) fn views_of_one(graph: &Graph, parts: &[ValueId]) -> bool {
    // The stored value under a part, or None under a constant (a load
    // with nothing under it).
    let under = |v: ValueId| -> Option<ValueId> {
        let u = under_loads_by(graph, |w| graph.producer_of(w), v);
        match graph.producer_of(u) {
            Some(p) if is_load(graph, &graph.nodes()[p]) => None,
            _ => Some(u),
        }
    };
    let unders: Vec<Option<ValueId>> = parts.iter().map(|&v| under(v)).collect();
    match unders.first() {
        Some(None) => unders.iter().all(Option::is_none),
        Some(first) => unders.iter().all(|u| u == first),
        None => false,
    }
}

/// Dtypes a pass reads converted to f32 the way `convert` does (rounded
/// to nearest), that loop groups do not otherwise hold.
fn widens_exactly(d: DType) -> bool {
    matches!(
        d,
        DType::F64 | DType::I64 | DType::I32 | DType::I8 | DType::U8
    )
}

pub fn plan(graph: &Graph) -> Plan {
    let nodes = graph.nodes();
    let producer = graph.producers();
    let mut consumers: Vec<Vec<usize>> = vec![vec![]; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        for v in &n.inputs {
            if let Some(p) = producer[v.0 as usize] {
                consumers[p].push(i);
            }
        }
    }
    let returned: HashSet<ValueId> = graph.outputs().iter().copied().collect();

    // 1. Kernels, in graph order.
    let mut kernel_of: Vec<usize> = vec![usize::MAX; nodes.len()];
    let mut kernels: Vec<Kernel> = Vec::new();
    // The full-size values each loop group reads (sized up to the kernels
    // as loop nodes join; a kernel past its end reads nothing yet).
    let mut reads: Vec<HashSet<ValueId>> = Vec::new();
    let is_loop = |kernels: &Vec<Kernel>, k: usize| {
        matches!(
            kernels[k].kind,
            KernelKind::Loop { .. } | KernelKind::Rows { .. }
        )
    };
    for (i, n) in nodes.iter().enumerate() {
        let out = graph.value_type(n.outputs[0]);
        let elementwise = n.prim.is_elementwise()
            && loop_dtype(out.dtype)
            && n.inputs
                .iter()
                .all(|v| loop_dtype(graph.value_type(*v).dtype));
        if elementwise {
            // Loops read through loads, so a load's own kernel (if it gets
            // one) never orders a loop: look at what the load reads.
            let under: Vec<ValueId> = n
                .inputs
                .iter()
                .map(|v| under_loads(graph, &producer, *v))
                .collect();
            // (producer's kernel, reached through a load) of each input;
            // parameters and scalar constants have none.
            let roots: Vec<(usize, bool)> = n
                .inputs
                .iter()
                .zip(&under)
                .filter_map(|(v, u)| {
                    let p = producer[u.0 as usize].filter(|&p| !is_load(graph, &nodes[p]))?;
                    Some((kernel_of[p], u != v))
                })
                .collect();
            let newest = roots.iter().map(|&(k, _)| k).max();
            // A load reads a stored value: a node that reads a value of a
            // group through a load (a reshape there and back) cannot join
            // that group, whose pass has the value only in registers.
            let loaded_from = |k: usize| roots.iter().any(|&(r, loaded)| loaded && r == k);
            let open = |k: usize| matches!(&kernels[k].kind, KernelKind::Loop { shape, reduce_dims: 0 } if *shape == out.dims);
            // What the node reads at full size (through loads, so in any
            // shape of as many elements: a product's [1024, 688] result
            // read as [8, 128, 688]), which a pass it joins beside its
            // producers should already be reading.
            let full: Vec<ValueId> = under
                .into_iter()
                .filter(|v| graph.value_type(*v).numel() == out.numel())
                .collect();
            // The newest producer's group when it is open; else the newest
            // open group that runs after every producer and already reads
            // one of the node's full-size operands (a node that reads only
            // parameters, say `x * 0.5` beside `erf(x)`, joins the pass that
            // is already reading `x`; unrelated work of the same shape, an
            // optimizer's update of another parameter, stays apart: a pass
            // over many unrelated tensors reads too many streams at once).
            let joinable = match newest {
                Some(k) if open(k) && !loaded_from(k) => Some(k),
                _ => (0..kernels.len())
                    .rev()
                    .take_while(|&k| newest.is_none_or(|n| k > n))
                    .find(|&k| {
                        open(k)
                            && reads
                                .get(k)
                                .is_some_and(|r| full.iter().any(|v| r.contains(v)))
                    }),
            };
            let k = joinable.unwrap_or_else(|| {
                kernels.push(Kernel {
                    kind: KernelKind::Loop {
                        shape: out.dims.clone(),
                        reduce_dims: 0,
                    },
                    nodes: vec![],
                    stores: vec![],
                });
                kernels.len() - 1
            });
            kernel_of[i] = k;
            kernels[k].nodes.push(i);
            reads.resize_with(kernels.len(), HashSet::new);
            reads[k].extend(full);
            continue;
        }
        // A uniform draw depends only on its position: it joins the newest
        // open loop over its shape whose pass runs after its seed and
        // offset are known (constants always are).
        if let Prim::Rng {
            distribution: RngDistribution::Uniform,
            dtype,
            dims,
        } = &n.prim
        {
            if matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
                let ready_after = n
                    .inputs
                    .iter()
                    .filter_map(|v| producer[v.0 as usize])
                    .filter(|&p| !matches!(nodes[p].prim, Prim::Constant { .. }))
                    .map(|p| kernel_of[p])
                    .max();
                let joinable = (0..kernels.len()).rev().find(|&k| {
                    ready_after.is_none_or(|r| k > r)
                        && matches!(&kernels[k].kind, KernelKind::Loop { shape, reduce_dims: 0 } if shape == dims)
                });
                let k = joinable.unwrap_or_else(|| {
                    kernels.push(Kernel {
                        kind: KernelKind::Loop {
                            shape: dims.clone(),
                            reduce_dims: 0,
                        },
                        nodes: vec![],
                        stores: vec![],
                    });
                    kernels.len() - 1
                });
                kernel_of[i] = k;
                kernels[k].nodes.push(i);
                continue;
            }
        }
        if let Prim::Reduce { op, dimensions } = &n.prim {
            let xt = graph.value_type(n.inputs[0]);
            let r = dimensions.len();
            let trailing = r > 0
                && dimensions
                    .iter()
                    .enumerate()
                    .all(|(j, &d)| d == xt.rank() - r + j);
            let ok = trailing
                && matches!(
                    op,
                    ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min | ReduceOp::Prod
                )
                && matches!(xt.dtype, DType::F32 | DType::BF16 | DType::F16);
            if ok {
                let k = producer[n.inputs[0].0 as usize].map(|p| kernel_of[p]);
                // Any open loop over this shape may take it: the result is
                // stored at the end of that loop's pass, before any consumer.
                let fits = k.is_some_and(|k| {
                    matches!(&kernels[k].kind, KernelKind::Loop { shape, reduce_dims }
                        if *shape == xt.dims && (*reduce_dims == 0 || *reduce_dims == r))
                });
                let k = if fits {
                    k.unwrap_or_default()
                } else {
                    // A reduction of a stored value: a loop of its own.
                    kernels.push(Kernel {
                        kind: KernelKind::Single,
                        nodes: vec![],
                        stores: vec![],
                    });
                    kernels.len() - 1
                };
                kernels[k].kind = KernelKind::Loop {
                    shape: xt.dims.clone(),
                    reduce_dims: r,
                };
                kernel_of[i] = k;
                kernels[k].nodes.push(i);
                continue;
            }
        }
        kernel_of[i] = kernels.len();
        kernels.push(Kernel {
            kind: KernelKind::Single,
            nodes: vec![i],
            stores: vec![],
        });
    }

    // 1b. Views that run as kernels of their own, each just before the
    //    first kernel reading it.
    sink_load_kernels(graph, &consumers, &mut kernels, &mut kernel_of);

    // 2. Loads read through by loop groups. Reverse graph order, so each
    //    consumer's decision is known: a load folds when every consumer is
    //    a loop node or a folded load (chains of loads compose). Merges
    //    below move nodes between loop groups only, so they do not change
    //    this.
    let mut folded: HashSet<usize> = HashSet::new();
    for (i, n) in nodes.iter().enumerate().rev() {
        if !is_load(graph, n)
            || n.outputs.iter().any(|o| returned.contains(o))
            || consumers[i].is_empty()
        {
            continue;
        }
        let feeds_loops = consumers[i].iter().all(|&c| {
            folded.contains(&c) || (is_loop(&kernels, kernel_of[c]) && !is_load(graph, &nodes[c]))
        });
        if feeds_loops {
            folded.insert(i);
        }
    }

    // 3. Vertical merges: see `merge_into_consumers`.
    merge_into_consumers(
        graph,
        &producer,
        &consumers,
        &folded,
        &mut kernels,
        &mut kernel_of,
    );

    // 3b. Merges up: see `merge_into_producers`.
    merge_into_producers(graph, &producer, &mut kernels, &mut kernel_of);
    // 3c. Nodes only a later pass reads move there: see `move_to_readers`.
    move_to_readers(
        graph,
        &producer,
        &consumers,
        &returned,
        &mut kernels,
        &mut kernel_of,
    );

    // 4. Row phases: see `chain_row_phases`.
    chain_row_phases(graph, &producer, &mut kernels, &mut kernel_of);

    // 5. Stores: a value crossing kernels (a folded load's use counts as a
    //    use of its operand by the consumer's kernel), or returned.
    let mut stores: Vec<HashSet<ValueId>> = vec![HashSet::new(); kernels.len()];
    let need = |v: ValueId, user: usize, stores: &mut Vec<HashSet<ValueId>>| {
        if let Some(p) = producer[v.0 as usize] {
            if !folded.contains(&p) && kernel_of[p] != user {
                stores[kernel_of[p]].insert(v);
            }
        }
    };
    for (i, n) in nodes.iter().enumerate() {
        if folded.contains(&i) {
            continue;
        }
        let in_loop = is_loop(&kernels, kernel_of[i]) && !is_load(graph, n);
        for v in &n.inputs {
            // A loop reads through loads (folded or not) to the value
            // underneath; other kernels read through folded loads only.
            let mut v = *v;
            while let Some(p) = producer[v.0 as usize]
                .filter(|p| folded.contains(p) || (in_loop && is_load(graph, &nodes[*p])))
            {
                match nodes[p].inputs.first() {
                    Some(u) => v = *u,
                    None => break, // a scalar constant: nothing to store
                }
            }
            need(v, kernel_of[i], &mut stores);
        }
    }
    for o in graph.outputs() {
        if let Some(p) = producer[o.0 as usize] {
            stores[kernel_of[p]].insert(*o);
        }
    }
    let kernels = kernels
        .into_iter()
        .enumerate()
        // Emptied by a merge, or a lone load that loops read through.
        .filter(|(_, k)| match k.nodes[..] {
            [] => false,
            [only] => !folded.contains(&only),
            _ => true,
        })
        .map(|(idx, mut k)| {
            let mut s: Vec<ValueId> = stores[idx].iter().copied().collect();
            s.sort();
            k.stores = s;
            phase_stores(graph, &producer, &mut k);
            k
        })
        .collect();
    Plan {
        kernels,
        folded_loads: folded,
    }
}

/// Move each load that runs as a kernel of its own (a view that a
/// product or another non-loop kernel reads) to just before the first
/// kernel that reads it, where graph order put it just after its operand.
/// A view kernel only reads its operand, so it may run anywhere between;
/// where it sat, it stood between a loop group and a later group over the
/// same values, and `merge_into_consumers` could not join them (a gated
/// MLP's backward: the gradient of `up`, read by the next product through
/// a reshape, and the gradient of the gate's SiLU computed after it).
fn sink_load_kernels(
    graph: &Graph,
    consumers: &[Vec<usize>],
    kernels: &mut Vec<Kernel>,
    kernel_of: &mut [usize],
) {
    let nodes = graph.nodes();
    let lone_load = |k: &Kernel| {
        k.kind == KernelKind::Single && matches!(k.nodes[..], [i] if is_load(graph, &nodes[i]))
    };
    // Sort keys: (the kernel a view runs before, its place in a chain of
    // views: the one read first runs last); others keep their place.
    let mut key: Vec<(usize, usize)> = (0..kernels.len()).map(|k| (k, usize::MAX)).collect();
    // Reverse order: a view reading a view comes later in graph order.
    for k in (0..kernels.len()).rev() {
        if !lone_load(&kernels[k]) {
            continue;
        }
        let first = consumers[kernels[k].nodes[0]]
            .iter()
            .map(|&c| key[kernel_of[c]])
            .min();
        if let Some((at, rank)) = first {
            if at > k {
                key[k] = (at, rank - 1);
            }
        }
    }
    let mut order: Vec<usize> = (0..kernels.len()).collect();
    order.sort_by_key(|&k| key[k]);
    if order.iter().enumerate().all(|(to, &from)| to == from) {
        return;
    }
    let mut new_index = vec![0; kernels.len()];
    for (to, &from) in order.iter().enumerate() {
        new_index[from] = to;
    }
    let mut old: Vec<Option<Kernel>> = std::mem::take(kernels).into_iter().map(Some).collect();
    *kernels = order
        .iter()
        .map(|&k| old[k].take().expect("a permutation"))
        .collect();
    for k in kernel_of.iter_mut() {
        *k = new_index[*k];
    }
}

/// Join loop groups into row-phase kernels (see *Row phases* above). For
/// each loop group `k0` with a trailing reduction, in order, the later
/// loop groups over its shape that may follow it as phases move into it;
/// the kernel runs where `k0` ran, so a phase may read only values ready
/// by then.
fn chain_row_phases(
    graph: &Graph,
    producer: &[Option<usize>],
    kernels: &mut [Kernel],
    kernel_of: &mut [usize],
) {
    let nodes = graph.nodes();
    for k0 in 0..kernels.len() {
        let KernelKind::Loop { shape, reduce_dims } = kernels[k0].kind.clone() else {
            continue;
        };
        let rank = shape.len();
        let row: u64 = shape[rank - reduce_dims..].iter().product();
        if reduce_dims == 0 || row == 0 || row > ROW_PHASE_MAX || kernels[k0].nodes.is_empty() {
            continue;
        }
        let outer: u64 = shape[..rank - reduce_dims].iter().product();
        let ones = |d: &[u64]| -> Vec<u64> { d.iter().copied().filter(|&x| x != 1).collect() };
        let outer_dims = ones(&shape[..rank - reduce_dims]);
        let mut members = vec![k0];
        // Members that loop over the rows, not the whole shape.
        let mut per_row_members: HashSet<usize> = HashSet::new();
        for (j, candidate) in kernels.iter().enumerate().skip(k0 + 1) {
            let (full, per_row) = match &candidate.kind {
                KernelKind::Loop {
                    shape: s,
                    reduce_dims: r,
                } => (
                    *s == shape && (*r == 0 || *r == reduce_dims),
                    *r == 0 && ones(s) == outer_dims,
                ),
                _ => (false, false),
            };
            if !(full || per_row) || candidate.nodes.is_empty() {
                continue;
            }
            // Every value the group reads: a parameter or constant, its
            // own, an earlier kernel's, or an earlier phase's in a form a
            // row block has.
            let ready = candidate.nodes.iter().all(|&i| {
                nodes[i].inputs.iter().all(|&v| {
                    let u = under_loads(graph, producer, v);
                    let Some(p) = producer[u.0 as usize] else {
                        return true;
                    };
                    let k = kernel_of[p];
                    if is_load(graph, &nodes[p]) || k == j || k < k0 {
                        return true;
                    }
                    if !members.contains(&k) {
                        return false;
                    }
                    let ty = graph.value_type(u);
                    if matches!(nodes[p].prim, Prim::Reduce { .. }) || per_row_members.contains(&k)
                    {
                        // A row's value (its reduction, or computed from
                        // reductions), broadcast back along the row.
                        ty.dtype == DType::F32
                            && ty.numel() == outer
                            && row_broadcast(graph, producer, v, u)
                    } else {
                        full && v == u && ty.dims == shape && ty.dtype == DType::F32
                    }
                })
            });
            if ready {
                members.push(j);
                if !full {
                    per_row_members.insert(j);
                }
            }
        }
        if members.len() < 2 {
            continue;
        }
        let phases: Vec<Kernel> = members
            .iter()
            .map(|&m| Kernel {
                kind: kernels[m].kind.clone(),
                nodes: std::mem::take(&mut kernels[m].nodes),
                stores: vec![],
            })
            .collect();
        let mut all: Vec<usize> = phases
            .iter()
            .flat_map(|p| p.nodes.iter().copied())
            .collect();
        all.sort_unstable();
        for &i in &all {
            kernel_of[i] = k0;
        }
        kernels[k0] = Kernel {
            kind: KernelKind::Rows {
                shape,
                reduce_dims,
                phases,
            },
            nodes: all,
            stores: vec![],
        };
    }
}

/// Whether `v` is `u` through reshapes and broadcasts only (a row-phase
/// kernel checks the index map itself when it compiles).
fn row_broadcast(graph: &Graph, producer: &[Option<usize>], v: ValueId, u: ValueId) -> bool {
    let mut cur = v;
    while cur != u {
        let Some(p) = producer[cur.0 as usize] else {
            return false;
        };
        let n = &graph.nodes()[p];
        if !matches!(n.prim, Prim::Reshape { .. } | Prim::BroadcastInDim { .. }) {
            return false;
        }
        match n.inputs.first() {
            Some(&w) => cur = w,
            None => return false,
        }
    }
    true
}

/// The stores of each phase of a row-phase kernel: its values the kernel
/// stores, and those a later phase reads (through loads or not).
fn phase_stores(graph: &Graph, producer: &[Option<usize>], kernel: &mut Kernel) {
    let KernelKind::Rows { phases, .. } = &mut kernel.kind else {
        return;
    };
    let nodes = graph.nodes();
    let phase_of: std::collections::HashMap<usize, usize> = phases
        .iter()
        .enumerate()
        .flat_map(|(k, p)| p.nodes.iter().map(move |&i| (i, k)))
        .collect();
    let mut stores: Vec<HashSet<ValueId>> = vec![HashSet::new(); phases.len()];
    for v in &kernel.stores {
        if let Some(k) = producer[v.0 as usize].and_then(|p| phase_of.get(&p)) {
            stores[*k].insert(*v);
        }
    }
    for (q, phase) in phases.iter().enumerate() {
        for &i in &phase.nodes {
            for &v in &nodes[i].inputs {
                let u = under_loads(graph, producer, v);
                if let Some(&k) = producer[u.0 as usize].and_then(|p| phase_of.get(&p)) {
                    if k < q {
                        stores[k].insert(u);
                    }
                }
            }
        }
    }
    for (phase, s) in phases.iter_mut().zip(stores) {
        let mut s: Vec<ValueId> = s.into_iter().collect();
        s.sort();
        phase.stores = s;
    }
}

/// The value of `v` when a scalar constant makes it.
fn scalar_constant(graph: &Graph, producer: &[Option<usize>], v: ValueId) -> Option<f64> {
    match &graph.nodes()[producer[v.0 as usize]?].prim {
        Prim::Constant { dtype, dims, bytes } if dims.is_empty() => {
            Some(crate::ir::literal::decode(*dtype, bytes, 0))
        }
        _ => None,
    }
}

/// The value `v` reads through a chain of loads.
pub fn under_loads(graph: &Graph, producer: &[Option<usize>], v: ValueId) -> ValueId {
    under_loads_by(graph, |u| producer[u.0 as usize], v)
}

/// `under_loads` with `producer` giving each value's node.
fn under_loads_by(
    graph: &Graph,
    producer: impl Fn(ValueId) -> Option<usize>,
    mut v: ValueId,
) -> ValueId {
    while let Some(p) = producer(v).filter(|&p| is_load(graph, &graph.nodes()[p])) {
        match graph.nodes()[p].inputs.first() {
            Some(u) => v = *u,
            None => break,
        }
    }
    v
}

/// Merge a loop group into a later loop group over the same shape that
/// consumes its values, when no kernel in between reads them: the merged
/// pass computes them in registers instead of storing and reloading them.
/// Graph order interleaves independent chains (a foreach optimizer issues
/// one op for every parameter, then the next op for every parameter), so
/// a chain's groups are apart in the kernel list; this joins each chain
/// back into one pass.
fn merge_into_consumers(
    graph: &Graph,
    producer: &[Option<usize>],
    consumers: &[Vec<usize>],
    folded: &HashSet<usize>,
    kernels: &mut [Kernel],
    kernel_of: &mut [usize],
) {
    let nodes = graph.nodes();
    let loop_shape = |k: &Kernel| match &k.kind {
        KernelKind::Loop { shape, .. } => Some(shape.clone()),
        KernelKind::Single | KernelKind::Rows { .. } => None,
    };
    // Kernels reading each node's result, directly or through loads. A
    // load that is not folded is a kernel of its own that reads the stored
    // result (and loops read through it as well).
    let readers = |i: usize, kernel_of: &[usize]| -> Vec<(usize, bool)> {
        let mut out = Vec::new();
        let mut stack: Vec<(usize, bool)> = consumers[i].iter().map(|&c| (c, false)).collect();
        while let Some((c, loaded)) = stack.pop() {
            if is_load(graph, &nodes[c]) {
                if !folded.contains(&c) {
                    out.push((kernel_of[c], true));
                }
                stack.extend(consumers[c].iter().map(|&d| (d, true)));
            } else {
                out.push((kernel_of[c], loaded));
            }
        }
        out
    };
    for k in 0..kernels.len() {
        let Some(shape) = loop_shape(&kernels[k]) else {
            continue;
        };
        loop {
            // The newest earlier open group over this shape that `k` reads
            // directly, whose values no kernel between them reads.
            let mut candidates: Vec<usize> = kernels[k]
                .nodes
                .iter()
                .flat_map(|&i| nodes[i].inputs.iter())
                .filter_map(|v| producer[v.0 as usize])
                .map(|p| kernel_of[p])
                .filter(|&j| j < k)
                .collect();
            candidates.sort_unstable();
            candidates.dedup();
            let mergeable = candidates.into_iter().rev().find(|&j| {
                matches!(&kernels[j].kind, KernelKind::Loop { shape: s, reduce_dims: 0 } if *s == shape)
                    && !kernels[j].nodes.is_empty()
                    && kernels[j].nodes.iter().all(|&i| {
                        readers(i, kernel_of)
                            .iter()
                            .all(|&(r, loaded)| r == j || (r == k && !loaded) || r > k)
                    })
            });
            let Some(j) = mergeable else {
                break;
            };
            let moved = std::mem::take(&mut kernels[j].nodes);
            move_nodes(kernels, kernel_of, moved, k);
        }
    }
}

/// Merge a loop group into an earlier open loop group over the same shape
/// whose values it reads directly, when everything it reads is ready by
/// then: the earlier pass computes it too, instead of storing those values
/// for it. This is the case `merge_into_consumers` leaves: a kernel
/// between the two reads the earlier group's values (a gated MLP's
/// backward: the products that read the gradient of `up` run before the
/// SiLU's gradient, which reads the gradient of its output computed in
/// the same pass as `up`'s).
fn merge_into_producers(
    graph: &Graph,
    producer: &[Option<usize>],
    kernels: &mut [Kernel],
    kernel_of: &mut [usize],
) {
    let nodes = graph.nodes();
    for k in 0..kernels.len() {
        let KernelKind::Loop { shape, reduce_dims } = kernels[k].kind.clone() else {
            continue;
        };
        if kernels[k].nodes.is_empty() {
            continue;
        }
        // The kernels that make what `k` reads, and whether through a load.
        let mut made_in: Vec<(usize, bool)> = Vec::new();
        for &i in &kernels[k].nodes {
            for &v in &nodes[i].inputs {
                let u = under_loads(graph, producer, v);
                if let Some(p) = producer[u.0 as usize].filter(|&p| !is_load(graph, &nodes[p])) {
                    if kernel_of[p] != k {
                        made_in.push((kernel_of[p], u != v));
                    }
                }
            }
        }
        let Some(j) = made_in.iter().map(|&(j, _)| j).max() else {
            continue;
        };
        let fits = j < k
            && matches!(&kernels[j].kind, KernelKind::Loop { shape: s, reduce_dims: 0 } if *s == shape)
            && !kernels[j].nodes.is_empty()
            && !made_in.iter().any(|&(m, loaded)| m == j && loaded);
        if !fits {
            continue;
        }
        let moved = std::mem::take(&mut kernels[k].nodes);
        move_nodes(kernels, kernel_of, moved, j);
        kernels[j].kind = KernelKind::Loop { shape, reduce_dims };
    }
}

/// Move the elementwise nodes of a loop group that only one later loop
/// group over the same shape reads (directly), and that read nothing of
/// their own group but each other, into that later group: it computes
/// them from what they read, which is stored anyway, where the earlier
/// pass would store their results for it. Step 1 puts them there: a node
/// reading only stored values joins a pass already reading one of them
/// (a backward's `logistic(gate)` joins the forward's SiLU when one
/// recording holds both, and the forward pass then stored the SiLU
/// gradient's factor for the backward).
fn move_to_readers(
    graph: &Graph,
    producer: &[Option<usize>],
    consumers: &[Vec<usize>],
    returned: &HashSet<ValueId>,
    kernels: &mut [Kernel],
    kernel_of: &mut [usize],
) {
    let nodes = graph.nodes();
    for f in 0..kernels.len() {
        let KernelKind::Loop { shape, .. } = kernels[f].kind.clone() else {
            continue;
        };
        let mut moving: HashSet<usize> = kernels[f]
            .nodes
            .iter()
            .copied()
            .filter(|&i| nodes[i].prim.is_elementwise())
            .collect();
        // Drop nodes that another kernel reads, the graph returns, or that
        // read a value of the group staying behind, until none is left.
        loop {
            let stays: Vec<usize> = moving
                .iter()
                .copied()
                .filter(|&i| {
                    let n = &nodes[i];
                    let read_elsewhere = n.outputs.iter().any(|o| returned.contains(o))
                        || consumers[i].iter().any(|&c| {
                            !moving.contains(&c) && (kernel_of[c] <= f || is_load(graph, &nodes[c]))
                        });
                    let reads_behind = n.inputs.iter().any(|&v| {
                        let u = under_loads(graph, producer, v);
                        producer[u.0 as usize]
                            .is_some_and(|p| kernel_of[p] == f && (!moving.contains(&p) || u != v))
                    });
                    read_elsewhere || reads_behind
                })
                .collect();
            if stays.is_empty() {
                break;
            }
            for i in stays {
                moving.remove(&i);
            }
        }
        // The one later group that reads them, a loop over the same shape.
        let mut readers: Vec<usize> = moving
            .iter()
            .flat_map(|&i| consumers[i].iter())
            .filter(|c| !moving.contains(c))
            .map(|&c| kernel_of[c])
            .collect();
        readers.sort_unstable();
        readers.dedup();
        let [b] = readers[..] else {
            continue;
        };
        if !matches!(&kernels[b].kind, KernelKind::Loop { shape: s, .. } if *s == shape) {
            continue;
        }
        kernels[f].nodes.retain(|i| !moving.contains(i));
        move_nodes(kernels, kernel_of, moving, b);
    }
}

/// Move nodes (out of their kernel's list already) into kernel `to`,
/// whose nodes stay in graph order.
fn move_nodes(
    kernels: &mut [Kernel],
    kernel_of: &mut [usize],
    moved: impl IntoIterator<Item = usize>,
    to: usize,
) {
    for i in moved {
        kernel_of[i] = to;
        kernels[to].nodes.push(i);
    }
    kernels[to].nodes.sort_unstable();
}

#[cfg(test)]
mod tests;
