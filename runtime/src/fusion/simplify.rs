//! Graph simplification before planning: rewrites that remove work. A
//! transpose read only by `dot_general` is folded into the dot's dimension
//! numbers (a matmul with `k.transpose(-2, -1)` then reads `k` in place
//! instead of copying it); the sum of two zero tensors each updated in one
//! part of a dimension, the parts tiling it, becomes the concatenation of
//! the updates (`concat_tiled_updates`: autograd's gradient of a tensor
//! sliced in two, rotary embeddings' `rotate_half` among them); written-out
//! attention becomes one attention primitive (`super::attention`, which
//! changes results by rounding only); a chain of loads that a kernel other
//! than a loop reads is copied in one pass (`copy_load_chains`); nodes
//! nobody uses are dropped.

use std::collections::HashMap;

use crate::error::Result;
use crate::ir::{BinaryOp, DType, Graph, GraphBuilder, Prim, UnaryOp, ValueId};

/// The batch and contracting dimensions of a dot_general operand that is
/// `transpose(x, perm)`, restated as dimensions of `x`, so the product can
/// read `x` itself. None when the operand's free dimensions would change
/// order (the result lists them in order), which no restating can fix.
pub fn dot_operand_through_transpose(
    perm: &[usize],
    batch: &[usize],
    contract: &[usize],
) -> Option<(Vec<usize>, Vec<usize>)> {
    // Dimension d of the transposed value is dimension perm[d] of its input.
    let nb: Vec<usize> = batch.iter().map(|&d| perm[d]).collect();
    let nc: Vec<usize> = contract.iter().map(|&d| perm[d]).collect();
    let free: Vec<usize> = (0..perm.len())
        .filter(|d| !batch.contains(d) && !contract.contains(d))
        .map(|d| perm[d])
        .collect();
    if free.windows(2).any(|w| w[0] > w[1]) {
        return None;
    }
    Some((nb, nc))
}

/// The graph with transposes folded into dot_general operands, sums of
/// zero tensors updated in complementary parts concatenated, written-out
/// attention fused (`super::fuse_attention`) and chains of loads a
/// non-loop kernel reads copied in one pass, without the nodes that leaves
/// unread; the graph unchanged when nothing applies.
pub fn simplify(graph: &Graph) -> Result<Graph> {
    let folded = concat_tiled_updates(&fold_transposes(graph)?)?;
    let folded = join_halves(&folded)?;
    let fused = match super::fuse_attention(&folded)? {
        Some(fused) => rebuild(&fused, &HashMap::new())?,
        None => folded,
    };
    copy_load_chains(&fused)
}

/// Loads between `v` and the stored value under it that move data (all
/// but reshapes, which alias).
fn moving_loads(graph: &Graph, producer: &[Option<usize>], mut v: ValueId) -> usize {
    let mut n = 0;
    while let Some(p) = producer[v.0 as usize].filter(|&p| super::is_load(graph, &graph.nodes()[p]))
    {
        let node = &graph.nodes()[p];
        let Some(&u) = node.inputs.first() else {
            break;
        };
        n += usize::from(!matches!(node.prim, Prim::Reshape { .. }));
        v = u;
    }
    n
}

/// An operand of a kernel that is not a loop (a concatenation, attention,
/// a gather), made by two or more loads that move data (a slice then a
/// transpose: rotary embeddings' halves of a head) is read through a
/// `convert` to its own dtype: one pass reads the value under the loads
/// through their index map (a strided copy), where each load ran as a
/// kernel of its own and stored its whole result. Products are left
/// alone (they fold transposes into their dimension numbers).
fn copy_load_chains(graph: &Graph) -> Result<Graph> {
    let producer = graph.producers();
    let nodes = graph.nodes();
    let readers = readers_of(graph);
    // A concatenation loops read through is a kernel of its own all the
    // same when anything else reads it.
    let runs = |n: &crate::ir::Node| {
        !super::is_load(graph, n)
            || (matches!(n.prim, Prim::Concatenate { .. })
                && n.outputs.iter().any(|o| {
                    graph.outputs().contains(o)
                        || readers[o.0 as usize]
                            .iter()
                            .any(|&c| !nodes[c].prim.is_elementwise())
                }))
    };
    // (node, operand position) of each operand read through a copy.
    let copied: std::collections::HashSet<(usize, usize)> = nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            !n.prim.is_elementwise() && runs(n) && !matches!(n.prim, Prim::DotGeneral { .. })
        })
        .flat_map(|(i, n)| n.inputs.iter().enumerate().map(move |(k, &v)| (i, k, v)))
        .filter(|&(_, _, v)| {
            super::loop_dtype(graph.value_type(v).dtype) && moving_loads(graph, &producer, v) >= 2
        })
        .map(|(i, k, _)| (i, k))
        .collect();
    if copied.is_empty() {
        return Ok(graph.clone());
    }
    let mut b = GraphBuilder::new();
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for p in graph.params() {
        map.insert(*p, b.param(graph.value_type(*p).clone()));
    }
    for (i, n) in nodes.iter().enumerate() {
        let mut ins = Vec::with_capacity(n.inputs.len());
        for (k, &v) in n.inputs.iter().enumerate() {
            ins.push(if copied.contains(&(i, k)) {
                let to = graph.value_type(v).dtype;
                b.op(Prim::Convert { to }, &[map[&v]])?
            } else {
                map[&v]
            });
        }
        for (o, v) in n.outputs.iter().zip(b.node(n.prim.clone(), &ins)?) {
            map.insert(*o, v);
        }
    }
    let outputs: Vec<ValueId> = graph.outputs().iter().map(|o| map[o]).collect();
    b.build(&outputs)
}

/// Transposes read only by a dot_general folded into its dimension numbers.
fn fold_transposes(graph: &Graph) -> Result<Graph> {
    let nodes = graph.nodes();
    let mut producer: Vec<Option<usize>> = vec![None; graph.num_values()];
    let mut uses: Vec<usize> = vec![0; graph.num_values()];
    for (i, n) in nodes.iter().enumerate() {
        for o in &n.outputs {
            producer[o.0 as usize] = Some(i);
        }
        for v in &n.inputs {
            uses[v.0 as usize] += 1;
        }
    }
    for o in graph.outputs() {
        uses[o.0 as usize] += 1;
    }
    // New prims and inputs for dot nodes that absorb a transpose.
    let mut rewritten: HashMap<usize, (Prim, Vec<ValueId>)> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        let Prim::DotGeneral {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
            precision,
        } = &n.prim
        else {
            continue;
        };
        let (mut lb, mut rb, mut lc, mut rc) = (
            lhs_batch.clone(),
            rhs_batch.clone(),
            lhs_contract.clone(),
            rhs_contract.clone(),
        );
        let mut inputs = n.inputs.clone();
        let mut changed = false;
        for (side, input) in inputs.iter_mut().enumerate() {
            let v = *input;
            let Some(p) = producer[v.0 as usize] else {
                continue;
            };
            let Prim::Transpose { perm } = &nodes[p].prim else {
                continue;
            };
            if uses[v.0 as usize] != 1 {
                continue;
            }
            let (batch, contract) = if side == 0 {
                (&mut lb, &mut lc)
            } else {
                (&mut rb, &mut rc)
            };
            let Some((nb, nc)) = dot_operand_through_transpose(perm, batch, contract) else {
                continue;
            };
            *batch = nb;
            *contract = nc;
            *input = nodes[p].inputs[0];
            changed = true;
        }
        if changed {
            rewritten.insert(
                i,
                (
                    Prim::DotGeneral {
                        lhs_batch: lb,
                        rhs_batch: rb,
                        lhs_contract: lc,
                        rhs_contract: rc,
                        precision: *precision,
                    },
                    inputs,
                ),
            );
        }
    }
    if rewritten.is_empty() {
        return Ok(graph.clone());
    }
    rebuild(graph, &rewritten)
}

/// Whether `v` is zero everywhere: a constant whose bytes are all zero
/// (+0 in every dtype), through converts, broadcasts and reshapes.
fn is_zeros(graph: &Graph, producer: &[Option<usize>], v: ValueId) -> bool {
    let Some(p) = producer[v.0 as usize] else {
        return false;
    };
    let node = &graph.nodes()[p];
    match &node.prim {
        Prim::Constant { bytes, .. } => bytes.iter().all(|&b| b == 0),
        Prim::Convert { .. } | Prim::BroadcastInDim { .. } | Prim::Reshape { .. } => {
            is_zeros(graph, producer, node.inputs[0])
        }
        _ => false,
    }
}

/// The value of `v` when it is a scalar integer constant.
fn int_constant(graph: &Graph, producer: &[Option<usize>], v: ValueId) -> Option<i64> {
    let value = super::scalar_constant(graph, producer, v)?;
    graph
        .value_type(v)
        .dtype
        .is_integer()
        .then_some(value as i64)
}

/// A `dynamic_update_slice` of a zero tensor with constant indices: its
/// update, the one dimension the update does not fill, and where along it
/// the update starts (clamped as the primitive clamps it).
fn zero_update(
    graph: &Graph,
    producer: &[Option<usize>],
    v: ValueId,
) -> Option<(ValueId, usize, u64)> {
    let node = &graph.nodes()[producer[v.0 as usize]?];
    if !matches!(node.prim, Prim::DynamicUpdateSlice) || !is_zeros(graph, producer, node.inputs[0])
    {
        return None;
    }
    let full = &graph.value_type(node.inputs[0]).dims;
    let update = node.inputs[1];
    let part = &graph.value_type(update).dims;
    let mut cut = None;
    for (d, (&n, &u)) in full.iter().zip(part).enumerate() {
        let at = int_constant(graph, producer, node.inputs[2 + d])?.clamp(0, (n - u) as i64) as u64;
        if u != n {
            if cut.is_some() {
                return None;
            }
            cut = Some((d, at));
        }
    }
    let (d, at) = cut?;
    Some((update, d, at))
}

/// `add(dynamic_update_slice(zeros, a, ..), dynamic_update_slice(zeros, b,
/// ..))` where a and b fill complementary parts of one dimension becomes
/// `concatenate(a, b)` in the order of their parts: no zero tensor is
/// written and no second pass adds them. This is slice_backward's sum for
/// a tensor sliced in two (rotary embeddings' `rotate_half`). The values
/// are the sum's but for the sign of a zero: 0 + -0 is +0, where the
/// concatenation keeps -0.
fn concat_tiled_updates(graph: &Graph) -> Result<Graph> {
    let producer = graph.producers();
    let mut rewritten: HashMap<usize, (Prim, Vec<ValueId>)> = HashMap::new();
    for (i, n) in graph.nodes().iter().enumerate() {
        let (Prim::Binary(BinaryOp::Add), [x, y]) = (&n.prim, &n.inputs[..]) else {
            continue;
        };
        let (Some((a, da, at_a)), Some((b, db, at_b))) = (
            zero_update(graph, &producer, *x),
            zero_update(graph, &producer, *y),
        ) else {
            continue;
        };
        let (len_a, len_b) = (graph.value_type(a).dims[da], graph.value_type(b).dims[db]);
        let whole = graph.value_type(n.outputs[0]).dims[da];
        let ordered = if at_a == 0 && at_b == len_a {
            vec![a, b]
        } else if at_b == 0 && at_a == len_b {
            vec![b, a]
        } else {
            continue;
        };
        if da != db || len_a + len_b != whole {
            continue;
        }
        rewritten.insert(i, (Prim::Concatenate { dimension: da }, ordered));
    }
    if rewritten.is_empty() {
        return Ok(graph.clone());
    }
    rebuild(graph, &rewritten)
}

/// Concatenations along the last dimension of values computed the same
/// way from views of one stored value, some negated: rotary embeddings'
/// `rotate_half(x)`, `cat(-x2, x1)`, and its gradient, `cat(g2, -g1)` with
/// `g = grad * sin` sliced in two. Each becomes the same computation over
/// one concatenation of the views, times a concatenation of signs (-1 for
/// the negated parts): both are concatenations a loop reads piece by
/// piece (`super::is_load`), so the rotation costs no kernel of its own,
/// where the negation, each half's copy and the concatenation were
/// kernels. On the way, a conversion to a value's own dtype that only a
/// concatenation reads is dropped, and slices that are all an elementwise
/// node's readers move to its operands (slicing then computing gives the
/// same values). Exact: multiplying by 1 or -1 changes no bit but a NaN's
/// sign.
fn join_halves(graph: &Graph) -> Result<Graph> {
    let mut g = graph.clone();
    // Each round takes one step (a dropped conversion, slices moved, a
    // concatenation joined); the rotary pattern needs two.
    for _ in 0..4 {
        match join_halves_once(&g)? {
            Some(next) => g = next,
            None => break,
        }
    }
    Ok(g)
}

/// One round of `join_halves`; None when nothing applies.
fn join_halves_once(graph: &Graph) -> Result<Option<Graph>> {
    let nodes = graph.nodes();
    let producer = graph.producers();
    let readers = readers_of(graph);
    let returned: std::collections::HashSet<ValueId> = graph.outputs().iter().copied().collect();
    let only_read_by = |v: ValueId, f: &dyn Fn(&Prim) -> bool| {
        !returned.contains(&v)
            && !readers[v.0 as usize].is_empty()
            && readers[v.0 as usize].iter().all(|&c| f(&nodes[c].prim))
    };
    let made_by = |v: ValueId| producer[v.0 as usize].map(|p| &nodes[p]);
    let mut b = GraphBuilder::new();
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for p in graph.params() {
        map.insert(*p, b.param(graph.value_type(*p).clone()));
    }
    let mut changed = false;
    for n in nodes {
        let out = n.outputs[0];
        let ty = graph.value_type(out);
        let new = match &n.prim {
            Prim::Convert { to }
                if graph.value_type(n.inputs[0]).dtype == *to
                    && only_read_by(out, &|p| matches!(p, Prim::Concatenate { .. })) =>
            {
                Some(map[&n.inputs[0]])
            }
            Prim::Slice { .. } => match made_by(n.inputs[0]) {
                Some(e)
                    if e.prim.is_elementwise()
                        && e.outputs.len() == 1
                        && only_read_by(e.outputs[0], &|p| matches!(p, Prim::Slice { .. }))
                        && e.inputs.iter().all(|u| {
                            graph.value_type(*u).dims == graph.value_type(e.outputs[0]).dims
                        }) =>
                {
                    let mut ins = Vec::with_capacity(e.inputs.len());
                    for u in &e.inputs {
                        ins.push(b.op(n.prim.clone(), &[map[u]])?);
                    }
                    Some(b.op(e.prim.clone(), &ins)?)
                }
                _ => None,
            },
            Prim::Concatenate { dimension }
                if *dimension + 1 == ty.rank()
                    && matches!(ty.dtype, DType::F32 | DType::BF16 | DType::F16) =>
            {
                // Each part without its negation, and whether it had one.
                let stripped: Vec<(ValueId, bool)> = n
                    .inputs
                    .iter()
                    .map(|&v| match made_by(v) {
                        Some(m)
                            if m.prim == Prim::Unary(UnaryOp::Neg)
                                && only_read_by(v, &|p| matches!(p, Prim::Concatenate { .. })) =>
                        {
                            (m.inputs[0], true)
                        }
                        _ => (v, false),
                    })
                    .collect();
                let parts: Vec<ValueId> = stripped.iter().map(|p| p.0).collect();
                let negated = stripped.iter().any(|p| p.1);
                let plain = super::views_of_one(graph, &parts);
                if plain && !negated {
                    None
                } else if joinable(graph, &producer, &readers, &returned, &parts, 0) {
                    let joined = emit_joined(&mut b, &map, graph, &producer, &parts, *dimension)?;
                    Some(if negated {
                        let mut signs = Vec::with_capacity(stripped.len());
                        for (v, neg) in &stripped {
                            let one = b.scalar(ty.dtype, if *neg { -1.0 } else { 1.0 })?;
                            signs.push(b.op(
                                Prim::BroadcastInDim {
                                    dims: graph.value_type(*v).dims.clone(),
                                    mapping: vec![],
                                },
                                &[one],
                            )?);
                        }
                        let sign = b.op(
                            Prim::Concatenate {
                                dimension: *dimension,
                            },
                            &signs,
                        )?;
                        b.binary(BinaryOp::Mul, joined, sign)?
                    } else {
                        joined
                    })
                } else {
                    None
                }
            }
            _ => None,
        };
        match new {
            Some(v) if n.outputs.len() == 1 => {
                map.insert(out, v);
                changed = true;
            }
            _ => {
                let ins: Vec<ValueId> = n.inputs.iter().map(|v| map[v]).collect();
                for (o, v) in n.outputs.iter().zip(b.node(n.prim.clone(), &ins)?) {
                    map.insert(*o, v);
                }
            }
        }
    }
    if !changed {
        return Ok(None);
    }
    let outputs: Vec<ValueId> = graph.outputs().iter().map(|o| map[o]).collect();
    rebuild(&b.build(&outputs)?, &HashMap::new()).map(Some)
}

/// Whether `parts` concatenated are views of one value (`super::views_of_one`),
/// or each the same elementwise node, read only where it is concatenated,
/// over operands that are joinable in turn, so the node can run once over
/// their concatenations.
fn joinable(
    graph: &Graph,
    producer: &[Option<usize>],
    readers: &[Vec<usize>],
    returned: &std::collections::HashSet<ValueId>,
    parts: &[ValueId],
    depth: usize,
) -> bool {
    if super::views_of_one(graph, parts) {
        return true;
    }
    if depth >= 4 {
        return false;
    }
    let nodes = graph.nodes();
    let made: Option<Vec<&crate::ir::Node>> = parts
        .iter()
        .map(|&v| {
            producer[v.0 as usize].map(|p| &nodes[p]).filter(|n| {
                n.outputs.len() == 1 && readers[v.0 as usize].len() == 1 && !returned.contains(&v)
            })
        })
        .collect();
    let Some(made) = made else {
        return false;
    };
    let first = made[0];
    first.prim.is_elementwise()
        && made
            .iter()
            .all(|m| m.prim == first.prim && m.inputs.len() == first.inputs.len())
        && made.iter().zip(parts).all(|(m, &v)| {
            m.inputs
                .iter()
                .all(|u| graph.value_type(*u).dims == graph.value_type(v).dims)
        })
        && (0..first.inputs.len()).all(|j| {
            let operands: Vec<ValueId> = made.iter().map(|m| m.inputs[j]).collect();
            joinable(graph, producer, readers, returned, &operands, depth + 1)
        })
}

/// The concatenation of `parts` (`joinable`) along `dimension`, built in
/// `b` with each shared elementwise node run once over concatenations.
fn emit_joined(
    b: &mut GraphBuilder,
    map: &HashMap<ValueId, ValueId>,
    graph: &Graph,
    producer: &[Option<usize>],
    parts: &[ValueId],
    dimension: usize,
) -> Result<ValueId> {
    if super::views_of_one(graph, parts) {
        let ins: Vec<ValueId> = parts.iter().map(|v| map[v]).collect();
        return b.op(Prim::Concatenate { dimension }, &ins);
    }
    let nodes = graph.nodes();
    let made: Vec<&crate::ir::Node> = parts
        .iter()
        .filter_map(|&v| producer[v.0 as usize].map(|p| &nodes[p]))
        .collect();
    let mut ins = Vec::with_capacity(made[0].inputs.len());
    for j in 0..made[0].inputs.len() {
        let operands: Vec<ValueId> = made.iter().map(|m| m.inputs[j]).collect();
        ins.push(emit_joined(b, map, graph, producer, &operands, dimension)?);
    }
    b.op(made[0].prim.clone(), &ins)
}

/// The nodes reading each value, once per operand.
fn readers_of(graph: &Graph) -> Vec<Vec<usize>> {
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); graph.num_values()];
    for (i, n) in graph.nodes().iter().enumerate() {
        for v in &n.inputs {
            readers[v.0 as usize].push(i);
        }
    }
    readers
}

/// The graph with the nodes in `rewritten` given new prims and inputs,
/// without the nodes whose results nobody reads any more.
fn rebuild(graph: &Graph, rewritten: &HashMap<usize, (Prim, Vec<ValueId>)>) -> Result<Graph> {
    let nodes = graph.nodes();
    let mut live = vec![false; graph.num_values()];
    for o in graph.outputs() {
        live[o.0 as usize] = true;
    }
    let mut keep = vec![false; nodes.len()];
    for (i, n) in nodes.iter().enumerate().rev() {
        if n.outputs.iter().any(|o| live[o.0 as usize]) {
            keep[i] = true;
            let ins = rewritten.get(&i).map_or(&n.inputs, |(_, ins)| ins);
            for v in ins {
                live[v.0 as usize] = true;
            }
        }
    }
    let mut b = GraphBuilder::new();
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for p in graph.params() {
        map.insert(*p, b.param(graph.value_type(*p).clone()));
    }
    for (i, n) in nodes.iter().enumerate() {
        if !keep[i] {
            continue;
        }
        let (prim, ins) = match rewritten.get(&i) {
            Some((p, ins)) => (p.clone(), ins.clone()),
            None => (n.prim.clone(), n.inputs.clone()),
        };
        let ins: Vec<ValueId> = ins.iter().map(|v| map[v]).collect();
        let outs = b.node(prim, &ins)?;
        for (o, v) in n.outputs.iter().zip(outs) {
            map.insert(*o, v);
        }
    }
    let outputs: Vec<ValueId> = graph.outputs().iter().map(|o| map[o]).collect();
    b.build(&outputs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, TensorType};
    use crate::ops::{self, Attr, Attrs};
    use crate::platform::host::kernels::{eval_graph, HostTensor};

    /// The pieces of `add(dus(zeros, a, at_a), dus(zeros, b, at_b))` over
    /// [2, 3, 8], the updates cut along the last dimension: the zeros from
    /// `zero` (a scalar constant) and the last index of each update from
    /// `at` (constants, or a parameter where None).
    fn tiled_sum(widths: (u64, u64), at: (Option<i64>, Option<i64>), zero: f64) -> Graph {
        let mut g = GraphBuilder::new();
        let a = g.param(TensorType::new(DType::F32, &[2, 3, widths.0]));
        let b = g.param(TensorType::new(DType::F32, &[2, 3, widths.1]));
        let index = g.param(TensorType::scalar(DType::I64));
        let z = g.scalar(DType::F32, zero).unwrap();
        let z = g
            .op(
                Prim::BroadcastInDim {
                    dims: vec![2, 3, 8],
                    mapping: vec![],
                },
                &[z],
            )
            .unwrap();
        let update = |g: &mut GraphBuilder, u: ValueId, last: Option<i64>| {
            let zero_index = g.scalar(DType::I64, 0.0).unwrap();
            let last = match last {
                Some(v) => g.scalar(DType::I64, v as f64).unwrap(),
                None => index,
            };
            g.op(
                Prim::DynamicUpdateSlice,
                &[z, u, zero_index, zero_index, last],
            )
            .unwrap()
        };
        let ua = update(&mut g, a, at.0);
        let ub = update(&mut g, b, at.1);
        let y = g.binary(BinaryOp::Add, ua, ub).unwrap();
        g.build(&[y]).unwrap()
    }

    /// Inputs for `graph`'s parameters: element i of parameter k is
    /// `value(k, i)`.
    fn inputs_of(graph: &Graph, value: impl Fn(usize, usize) -> f64) -> Vec<HostTensor> {
        graph
            .param_types()
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let vals: Vec<f64> = (0..t.numel() as usize).map(|i| value(k, i)).collect();
                HostTensor::from_f64(t.dtype, &t.dims, &vals).unwrap()
            })
            .collect()
    }

    fn has(graph: &Graph, name: &str) -> bool {
        graph.nodes().iter().any(|n| n.prim.name() == name)
    }

    /// slice_backward's sum for a tensor sliced in two becomes one
    /// concatenation of the two gradients, in the order of their parts,
    /// with an index past the end clamped as the primitive clamps it.
    #[test]
    fn zero_tensors_updated_in_complementary_parts_and_summed_are_concatenated() {
        for (widths, at) in [
            ((5, 3), (Some(0), Some(5))),
            ((5, 3), (Some(3), Some(0))),
            ((5, 3), (Some(0), Some(99))), // clamped to 5
            ((1, 7), (Some(0), Some(1))),
        ] {
            let graph = tiled_sum(widths, at, 0.0);
            let simple = simplify(&graph).unwrap();
            assert!(has(&simple, "concatenate"), "{widths:?} {at:?}:\n{simple}");
            assert!(!has(&simple, "dynamic_update_slice"), "{simple}");
            assert_eq!(simple.output_types(), graph.output_types());
            let inputs = inputs_of(&graph, |k, i| ((i as f64 + 1.0) * (k as f64 + 0.7)).sin());
            let want = eval_graph(&graph, &inputs).unwrap();
            let got = eval_graph(&simple, &inputs).unwrap();
            assert_eq!(
                want[0].to_f64_vec(),
                got[0].to_f64_vec(),
                "{widths:?} {at:?}"
            );
        }
    }

    /// Parts that overlap or leave a gap, a base that is not zero, or an
    /// index known only at run time: the sum stays.
    #[test]
    fn updates_that_do_not_tile_zeros_stay_a_sum() {
        for (widths, at, zero) in [
            ((5, 3), (Some(0), Some(4)), 0.0),  // overlap
            ((4, 3), (Some(0), Some(4)), 0.0),  // a gap at 7
            ((5, 3), (Some(0), Some(5)), 1.0),  // ones, not zeros
            ((5, 3), (Some(0), Some(5)), -0.0), // -0: x + -0 keeps x's sign
            ((5, 3), (Some(0), None), 0.0),     // run-time index
        ] {
            let graph = tiled_sum(widths, at, zero);
            let simple = simplify(&graph).unwrap();
            assert!(
                !has(&simple, "concatenate"),
                "{widths:?} {at:?} {zero}:\n{simple}"
            );
        }
    }

    /// A slice then a transpose read by a concatenation (rotary
    /// embeddings' halves): one copy through both, where each ran as a
    /// kernel; a slice alone stays as it is.
    #[test]
    fn a_chain_of_loads_a_concatenation_reads_is_copied_in_one_pass() {
        // Half of x's last dimension (heads and positions swapped when
        // `transposes`) concatenated with a parameter of the same shape.
        let concatenated = |transposes: bool| {
            let mut g = GraphBuilder::new();
            let x = g.param(TensorType::new(DType::F32, &[2, 6, 3, 8]));
            let other: &[u64] = if transposes {
                &[2, 3, 6, 4]
            } else {
                &[2, 6, 3, 4]
            };
            let y = g.param(TensorType::new(DType::F32, other));
            let mut h = g
                .op(
                    Prim::Slice {
                        start: vec![0, 0, 0, 4],
                        limit: vec![2, 6, 3, 8],
                        stride: vec![1, 1, 1, 1],
                    },
                    &[x],
                )
                .unwrap();
            if transposes {
                h = g
                    .op(
                        Prim::Transpose {
                            perm: vec![0, 2, 1, 3],
                        },
                        &[h],
                    )
                    .unwrap();
            }
            let c = g.op(Prim::Concatenate { dimension: 3 }, &[h, y]).unwrap();
            g.build(&[c]).unwrap()
        };
        let graph = concatenated(true);
        let simple = simplify(&graph).unwrap();
        assert!(has(&simple, "convert"), "{simple}");
        let plan = crate::fusion::plan(&simple);
        let names: Vec<String> = plan
            .kernels
            .iter()
            .map(|k| simple.nodes()[k.nodes[0]].prim.name())
            .collect();
        assert_eq!(names, ["convert", "concatenate"], "{simple}");
        let inputs = inputs_of(&graph, |_, i| i as f64 * 0.25 - 7.0);
        let want = eval_graph(&graph, &inputs).unwrap();
        let got = eval_graph(&simple, &inputs).unwrap();
        assert_eq!(want[0].to_f64_vec(), got[0].to_f64_vec());
        // One moving load (the slice alone): no copy added.
        let graph = concatenated(false);
        assert_eq!(simplify(&graph).unwrap(), graph);
    }

    #[test]
    fn a_transposed_matmul_operand_is_read_in_place() {
        // scores = q @ k^T over [2, 3, 5, 4]
        let t = TensorType::new(DType::F32, &[2, 3, 5, 4]);
        let mut g = GraphBuilder::new();
        let q = g.param(t.clone());
        let k = g.param(t.clone());
        let kt = g
            .op(
                Prim::Transpose {
                    perm: vec![0, 1, 3, 2],
                },
                &[k],
            )
            .unwrap();
        let s = g
            .op(
                Prim::DotGeneral {
                    lhs_batch: vec![0, 1],
                    rhs_batch: vec![0, 1],
                    lhs_contract: vec![3],
                    rhs_contract: vec![2],
                    precision: Default::default(),
                },
                &[q, kt],
            )
            .unwrap();
        let graph = g.build(&[s]).unwrap();
        let simple = simplify(&graph).unwrap();
        assert!(
            !simple
                .nodes()
                .iter()
                .any(|n| matches!(n.prim, Prim::Transpose { .. })),
            "{simple}"
        );
        let vals: Vec<f64> = (0..120).map(|i| (i as f64 * 0.37).sin()).collect();
        let a = HostTensor::from_f64(DType::F32, &t.dims, &vals).unwrap();
        let b = HostTensor::from_f64(
            DType::F32,
            &t.dims,
            &vals.iter().map(|v| v * 2.0 - 0.5).collect::<Vec<_>>(),
        )
        .unwrap();
        let want = eval_graph(&graph, &[a.clone(), b.clone()]).unwrap();
        let got = eval_graph(&simple, &[a, b]).unwrap();
        // Same products, another summation order inside the GEMM: ulps apart.
        for (w, g) in want[0].to_f64_vec().iter().zip(got[0].to_f64_vec()) {
            assert!((w - g).abs() <= 1e-6 * (1.0 + w.abs()), "{w} vs {g}");
        }
    }

    #[test]
    fn a_transpose_used_elsewhere_or_reordering_free_dims_stays() {
        // Transpose also returned: kept.
        let g = ops::build_graph(
            ops::lookup("transpose").unwrap(),
            &[TensorType::new(DType::F32, &[3, 4])],
            &Attrs::new()
                .with("dim0", Attr::Int(0))
                .with("dim1", Attr::Int(1)),
        )
        .unwrap();
        assert_eq!(simplify(&g).unwrap(), g);
        // x^T @ y on 2-D: the free dim of x^T is x's dim 1, still one free dim: folded.
        let mut b = GraphBuilder::new();
        let x = b.param(TensorType::new(DType::F32, &[4, 3]));
        let y = b.param(TensorType::new(DType::F32, &[4, 5]));
        let xt = b.op(Prim::Transpose { perm: vec![1, 0] }, &[x]).unwrap();
        let d = b
            .op(
                Prim::DotGeneral {
                    lhs_batch: vec![],
                    rhs_batch: vec![],
                    lhs_contract: vec![1],
                    rhs_contract: vec![0],
                    precision: Default::default(),
                },
                &[xt, y],
            )
            .unwrap();
        let graph = b.build(&[d]).unwrap();
        let simple = simplify(&graph).unwrap();
        assert_eq!(simple.nodes().len(), 1);
        assert_eq!(simple.output_types(), graph.output_types());
        // A transpose that reorders two free dims is not folded.
        let mut b = GraphBuilder::new();
        let x = b.param(TensorType::new(DType::F32, &[2, 3, 4]));
        let y = b.param(TensorType::new(DType::F32, &[4, 5]));
        let xt = b
            .op(
                Prim::Transpose {
                    perm: vec![1, 0, 2],
                },
                &[x],
            )
            .unwrap();
        let d = b
            .op(
                Prim::DotGeneral {
                    lhs_batch: vec![],
                    rhs_batch: vec![],
                    lhs_contract: vec![2],
                    rhs_contract: vec![0],
                    precision: Default::default(),
                },
                &[xt, y],
            )
            .unwrap();
        let graph = b.build(&[d]).unwrap();
        assert_eq!(simplify(&graph).unwrap(), graph);
    }
}
