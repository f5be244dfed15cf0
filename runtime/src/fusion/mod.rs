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
//! - Loop groups hold f32, bf16, f16 and bool values; other dtypes run node
//!   by node. Every other node is a kernel of its own.
//! - A kernel stores a value when a later kernel (directly or through a
//!   load) uses it, or the graph returns it; other values stay in the pass.

mod simplify;

pub use simplify::{dot_operand_through_transpose, simplify};

use std::collections::HashSet;

use crate::ir::{DType, Graph, Prim, ReduceOp, RngDistribution, ValueId};

#[derive(Clone, Debug, PartialEq)]
pub enum KernelKind {
    /// One node, run by the platform's primitive kernel.
    Single,
    /// Elementwise nodes over `shape`; the last `reduce_dims` dimensions
    /// are reduced by epilogue nodes (0 when there are none).
    Loop { shape: Vec<u64>, reduce_dims: usize },
}

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
    /// Nodes that run, one kernel per entry of `kernels`.
    pub fn loop_count(&self) -> usize {
        self.kernels
            .iter()
            .filter(|k| matches!(k.kind, KernelKind::Loop { .. }))
            .count()
    }
}

fn loop_dtype(d: DType) -> bool {
    matches!(d, DType::F32 | DType::BF16 | DType::F16 | DType::Bool)
}

/// A node a loop group reads through instead of reading its result: a
/// scalar constant, a broadcast or a reshape.
pub fn is_load(prim: &Prim) -> bool {
    match prim {
        Prim::Constant { dims, dtype, .. } => dims.is_empty() && loop_dtype(*dtype),
        Prim::BroadcastInDim { .. } | Prim::Reshape { .. } => true,
        _ => false,
    }
}

pub fn plan(graph: &Graph) -> Plan {
    let nodes = graph.nodes();
    let mut producer: Vec<Option<usize>> = vec![None; graph.num_values()];
    for (i, n) in nodes.iter().enumerate() {
        for o in &n.outputs {
            producer[o.0 as usize] = Some(i);
        }
    }
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
    let is_loop =
        |kernels: &Vec<Kernel>, k: usize| matches!(kernels[k].kind, KernelKind::Loop { .. });
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
            // (producer's kernel, reached through a load) of each input.
            let roots: Vec<(usize, bool)> = n
                .inputs
                .iter()
                .filter_map(|v| {
                    let (mut v, mut loaded) = (*v, false);
                    loop {
                        let p = producer[v.0 as usize]?;
                        if !is_load(&nodes[p].prim) {
                            return Some((kernel_of[p], loaded));
                        }
                        loaded = true;
                        v = *nodes[p].inputs.first()?;
                    }
                })
                .collect();
            let newest = roots.iter().map(|&(k, _)| k).max();
            // A load reads a stored value: a node that reads a value of a
            // group through a load (a reshape there and back) cannot join
            // that group, whose pass has the value only in registers.
            let loaded_from = |k: usize| roots.iter().any(|&(r, loaded)| loaded && r == k);
            let open = |k: usize| matches!(&kernels[k].kind, KernelKind::Loop { shape, reduce_dims: 0 } if *shape == out.dims);
            // The newest producer's group when it is open; else the newest
            // open group that runs after every producer (a node that reads
            // only parameters, say `x * 0.5` beside `erf(x)`, joins the pass
            // that is already reading `x`).
            let joinable = match newest {
                Some(k) if open(k) && !loaded_from(k) => Some(k),
                _ => (0..kernels.len())
                    .rev()
                    .take_while(|&k| newest.is_none_or(|n| k > n))
                    .find(|&k| open(k)),
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

    // 2. Loads read through by loop groups. Reverse graph order, so each
    //    consumer's decision is known: a load folds when every consumer is
    //    a loop node or a folded load (chains of loads compose).
    let mut folded: HashSet<usize> = HashSet::new();
    for (i, n) in nodes.iter().enumerate().rev() {
        if !is_load(&n.prim)
            || n.outputs.iter().any(|o| returned.contains(o))
            || consumers[i].is_empty()
        {
            continue;
        }
        let feeds_loops = consumers[i].iter().all(|&c| {
            folded.contains(&c) || (is_loop(&kernels, kernel_of[c]) && !is_load(&nodes[c].prim))
        });
        if feeds_loops {
            folded.insert(i);
        }
    }

    // 3. Stores: a value crossing kernels (a folded load's use counts as a
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
        let in_loop = is_loop(&kernels, kernel_of[i]) && !is_load(&n.prim);
        for v in &n.inputs {
            // A loop reads through loads (folded or not) to the value
            // underneath; other kernels read through folded loads only.
            let mut v = *v;
            while let Some(p) = producer[v.0 as usize]
                .filter(|p| folded.contains(p) || (in_loop && is_load(&nodes[*p].prim)))
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
        .filter(|(_, k)| !(k.nodes.len() == 1 && folded.contains(&k.nodes[0])))
        .map(|(idx, mut k)| {
            let mut s: Vec<ValueId> = stores[idx].iter().copied().collect();
            s.sort();
            k.stores = s;
            k
        })
        .collect();
    Plan {
        kernels,
        folded_loads: folded,
    }
}

#[cfg(test)]
mod tests;
