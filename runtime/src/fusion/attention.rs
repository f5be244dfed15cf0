//! Attention written out, `softmax(q kᵀ · c) v` as a model's eager
//! attention or ANCHORS' block issues it, becomes one `Prim::Attention`,
//! whose host kernel works on blocks of query rows and never stores the
//! scores or the probabilities (inductor's fuse_attention pass rewrites
//! the same pattern into torch's SDPA).
//!
//! What is matched, in primitives: a product of q [B.., L, E] with k
//! [B.., S, E] (or kᵀ [B.., E, S]) over the same batch dimensions; reshapes
//! that keep the last dimension; an optional scale, a multiply or divide
//! by a broadcast f32 scalar; the softmax over the last dimension as the op
//! library writes it (max, subtract, exp, sum, divide); reshapes back to the
//! product's shape; a product with v [B.., S, Ev]. Every value between the
//! two products is f32 and read by the pattern alone, so a training step's
//! forward, whose backward reads the probabilities, keeps its own ops, and
//! so does attention with a mask or dropout.
//!
//! The result differs from the written-out ops by rounding only: a scale
//! known when compiling multiplies the scores inside the kernel, and so
//! does one passed in at run time (the primitive's optional fourth
//! operand; a divisor c as 1 / c).

use std::collections::HashMap;

use crate::error::Result;
use crate::ir::{
    BinaryOp, DType, Graph, GraphBuilder, Precision, Prim, ReduceOp, UnaryOp, ValueId,
};

/// How the scores are scaled before the softmax.
#[derive(Clone, Copy, Debug)]
enum Scale {
    /// By a number known now (what `Prim::Attention` takes).
    Known(f64),
    /// Multiplied (`divide` false) or divided by this f32 scalar value.
    Runtime { value: ValueId, divide: bool },
}

/// One matched attention.
#[derive(Debug)]
struct Match {
    q: ValueId,
    k: ValueId,
    /// k is given transposed ([.., E, S]).
    k_transposed: bool,
    v: ValueId,
    scale: Scale,
}

struct Walk<'a> {
    graph: &'a Graph,
    producer: Vec<Option<usize>>,
    uses: Vec<usize>,
    returned: Vec<bool>,
}

impl Walk<'_> {
    /// The node computing `v` when it is f32, read `uses` times, and not
    /// returned.
    fn inner(&self, v: ValueId, uses: usize) -> Option<usize> {
        let i = v.0 as usize;
        let t = self.graph.value_type(v);
        (t.dtype == DType::F32 && self.uses[i] == uses && !self.returned[i])
            .then_some(self.producer[i])
            .flatten()
    }

    /// `v` through reshapes that keep its last dimension (each read once).
    fn under_reshapes(&self, mut v: ValueId) -> Option<ValueId> {
        let last = |v: ValueId| self.graph.value_type(v).dims.last().copied();
        loop {
            let Some(p) = self.producer[v.0 as usize] else {
                return Some(v);
            };
            let n = &self.graph.nodes()[p];
            if !matches!(n.prim, Prim::Reshape { .. }) {
                return Some(v);
            }
            let u = n.inputs[0];
            if self.inner(v, 1).is_none() || last(u) != last(v) {
                return None;
            }
            v = u;
        }
    }

    /// x when `v` is reduce(x) over x's last dimension, with its dimension
    /// kept (reshaped to size 1) and broadcast back to x's shape.
    fn row_statistic(&self, v: ValueId, op: ReduceOp) -> Option<ValueId> {
        let nodes = self.graph.nodes();
        let b = &nodes[self.inner(v, 1)?];
        let Prim::BroadcastInDim { dims, mapping } = &b.prim else {
            return None;
        };
        let r = &nodes[self.inner(b.inputs[0], 1)?];
        if !matches!(r.prim, Prim::Reshape { .. }) {
            return None;
        }
        let red = &nodes[self.inner(r.inputs[0], 1)?];
        let Prim::Reduce { op: o, dimensions } = &red.prim else {
            return None;
        };
        let x = red.inputs[0];
        let xd = &self.graph.value_type(x).dims;
        let rank = xd.len();
        let mut kept = xd.clone();
        *kept.last_mut()? = 1;
        (*o == op
            && *dimensions == [rank - 1]
            && self.graph.value_type(r.outputs[0]).dims == kept
            && dims == xd
            && *mapping == (0..rank).collect::<Vec<_>>())
        .then_some(x)
    }

    /// (lhs, rhs, rhs contracted on its second-last dimension) when node
    /// `i` is a product over leading batch dimensions contracting lhs's
    /// last dimension with rhs's last or second-last one.
    fn batched_product(&self, i: usize) -> Option<(ValueId, ValueId, bool)> {
        let n = &self.graph.nodes()[i];
        let Prim::DotGeneral {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
            // The fused attention computes its products in full f32.
            precision: Precision::Highest,
        } = &n.prim
        else {
            return None;
        };
        let (l, r) = (n.inputs[0], n.inputs[1]);
        let (ld, rd) = (
            &self.graph.value_type(l).dims,
            &self.graph.value_type(r).dims,
        );
        let rank = ld.len();
        let batch: Vec<usize> = (0..rank.checked_sub(2)?).collect();
        let ok = rd.len() == rank
            && *lhs_batch == batch
            && *rhs_batch == batch
            && ld[..rank - 2] == rd[..rank - 2]
            && *lhs_contract == [rank - 1];
        if !ok {
            return None;
        }
        match rhs_contract[..] {
            [c] if c == rank - 1 => Some((l, r, false)),
            [c] if c == rank - 2 => Some((l, r, true)),
            _ => None,
        }
    }

    /// The attention whose second product is node `i`.
    fn attention(&self, i: usize) -> Option<Match> {
        let nodes = self.graph.nodes();
        let (p, v, on_rows) = self.batched_product(i)?;
        // probabilities · v: v is [.., S, Ev], contracted on S.
        if !on_rows {
            return None;
        }
        // The probabilities: exp / rowsum(exp), under reshapes.
        let div = &nodes[self.inner(self.under_reshapes(p)?, 1)?];
        if div.prim != Prim::Binary(BinaryOp::Div) {
            return None;
        }
        let ex = div.inputs[0];
        if self.row_statistic(div.inputs[1], ReduceOp::Sum)? != ex {
            return None;
        }
        let exp = &nodes[self.inner(ex, 2)?];
        if exp.prim != Prim::Unary(UnaryOp::Exp) {
            return None;
        }
        let sub = &nodes[self.inner(exp.inputs[0], 1)?];
        if sub.prim != Prim::Binary(BinaryOp::Sub) {
            return None;
        }
        let s = sub.inputs[0];
        if self.row_statistic(sub.inputs[1], ReduceOp::Max)? != s {
            return None;
        }
        // The scale, if any, then the scores under reshapes.
        let sp = self.inner(s, 2)?;
        let scaled = match &nodes[sp].prim {
            Prim::Binary(op @ (BinaryOp::Mul | BinaryOp::Div)) => {
                let (x, y) = (nodes[sp].inputs[0], nodes[sp].inputs[1]);
                // A multiply may take the scalar first.
                let (t, c) = match (self.scalar(y), *op) {
                    (Some(c), _) => (x, c),
                    (None, BinaryOp::Mul) => (y, self.scalar(x)?),
                    (None, _) => return None,
                };
                let divide = *op == BinaryOp::Div;
                let scale = match self.constant(c) {
                    Some(x) if divide => Scale::Known(1.0 / x),
                    Some(x) => Scale::Known(x),
                    None => Scale::Runtime { value: c, divide },
                };
                Some((t, scale))
            }
            _ => None,
        };
        let (scores, reads) = match scaled {
            Some((t, _)) => (self.under_reshapes(t)?, 1),
            // Unscaled: the max and the subtract read the scores (or a
            // reshape of them) themselves.
            None => match &nodes[sp].prim {
                Prim::Reshape { .. } => {
                    let u = nodes[sp].inputs[0];
                    let dims = |v: ValueId| &self.graph.value_type(v).dims;
                    (dims(u).last() == dims(s).last()).then_some(())?;
                    (self.under_reshapes(u)?, 1)
                }
                _ => (s, 2),
            },
        };
        let scale = scaled.map_or(Scale::Known(1.0), |(_, scale)| scale);
        let first = self.inner(scores, reads)?;
        let (q, k, k_transposed) = self.batched_product(first)?;
        // The probabilities enter the second product in the first one's shape.
        if self.graph.value_type(scores).dims != self.graph.value_type(p).dims {
            return None;
        }
        Some(Match {
            q,
            k,
            k_transposed,
            v,
            scale,
        })
    }

    /// The f32 scalar that `v` broadcasts (read by this broadcast only).
    fn scalar(&self, v: ValueId) -> Option<ValueId> {
        let b = &self.graph.nodes()[self.inner(v, 1)?];
        let Prim::BroadcastInDim { mapping, .. } = &b.prim else {
            return None;
        };
        let c = b.inputs[0];
        let t = self.graph.value_type(c);
        (mapping.is_empty() && t.dims.is_empty() && t.dtype == DType::F32).then_some(c)
    }

    /// The value of a scalar constant.
    fn constant(&self, v: ValueId) -> Option<f64> {
        super::scalar_constant(self.graph, &self.producer, v)
    }
}

/// The graph with each written-out attention as one `Prim::Attention`;
/// None when there is none.
pub fn fuse_attention(graph: &Graph) -> Result<Option<Graph>> {
    let nodes = graph.nodes();
    let mut walk = Walk {
        graph,
        producer: graph.producers(),
        uses: vec![0; graph.num_values()],
        returned: vec![false; graph.num_values()],
    };
    for n in nodes {
        for v in &n.inputs {
            walk.uses[v.0 as usize] += 1;
        }
    }
    for o in graph.outputs() {
        walk.returned[o.0 as usize] = true;
    }
    let matches: HashMap<usize, Match> = (0..nodes.len())
        .filter(|&i| matches!(nodes[i].prim, Prim::DotGeneral { .. }))
        .filter_map(|i| walk.attention(i).map(|m| (i, m)))
        .filter(|(_, m)| {
            let types = [m.q, m.k, m.v].map(|x| graph.value_type(x).clone());
            // Checked as the primitive checks (k given as [.., S, E]).
            let mut types = types.to_vec();
            if m.k_transposed {
                let d = &mut types[1].dims;
                let r = d.len();
                d.swap(r - 1, r - 2);
            }
            crate::ir::graph::infer_types(
                &Prim::Attention {
                    scale: 1.0,
                    causal: false,
                },
                &types,
            )
            .is_ok()
        })
        .collect();
    if matches.is_empty() {
        return Ok(None);
    }
    // Rebuild: each match's attention where its second product was; the
    // ops it replaces are dead now (nothing else reads them), and
    // `simplify` drops them.
    let mut b = GraphBuilder::new();
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for p in graph.params() {
        map.insert(*p, b.param(graph.value_type(*p).clone()));
    }
    for (i, n) in nodes.iter().enumerate() {
        if let Some(m) = matches.get(&i) {
            let mut k = map[&m.k];
            if m.k_transposed {
                let r = graph.value_type(m.k).rank();
                let mut perm: Vec<usize> = (0..r).collect();
                perm.swap(r - 1, r - 2);
                k = b.op(Prim::Transpose { perm }, &[k])?;
            }
            let mut operands = vec![map[&m.q], k, map[&m.v]];
            let scale = match m.scale {
                Scale::Known(s) => s,
                // The kernel multiplies its scale by the fourth operand;
                // a divisor becomes its reciprocal, one scalar division
                // where scaling q took a pass over q.
                Scale::Runtime { value, divide } => {
                    let mut c = map[&value];
                    if divide {
                        let one = b.scalar(DType::F32, 1.0)?;
                        c = b.binary(BinaryOp::Div, one, c)?;
                    }
                    operands.push(c);
                    1.0
                }
            };
            let outs = b.node(
                Prim::Attention {
                    scale,
                    causal: false,
                },
                &operands,
            )?;
            map.insert(n.outputs[0], outs[0]);
            continue;
        }
        let ins: Vec<ValueId> = n.inputs.iter().map(|v| map[v]).collect();
        let outs = b.node(n.prim.clone(), &ins)?;
        for (o, v) in n.outputs.iter().zip(outs) {
            map.insert(*o, v);
        }
    }
    let outputs: Vec<ValueId> = graph.outputs().iter().map(|o| map[o]).collect();
    Ok(Some(b.build(&outputs)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::TensorType;
    use crate::platform::host::kernels::{eval_graph, HostTensor};

    /// How a test writes its attention out.
    #[derive(Clone, Copy)]
    struct Written {
        /// k passed as kᵀ [.., E, S].
        transposed_k: bool,
        /// 0: no scale; 1: times a constant; 2: divided by a constant;
        /// 3: divided by an f32 parameter; 4: an i64 parameter converted;
        /// 5: times an f32 parameter, the parameter first.
        scale: u8,
        /// The softmax over [2, 3, L, S] of a [6, L, S] product.
        reshaped: bool,
        /// Also return the probabilities (a training forward saves them).
        probs_returned: bool,
        /// Add a mask to the scores before the softmax.
        masked: bool,
    }

    const PLAIN: Written = Written {
        transposed_k: false,
        scale: 2,
        reshaped: false,
        probs_returned: false,
        masked: false,
    };

    fn row_stat(g: &mut GraphBuilder, x: ValueId, op: ReduceOp, dims: &[u64]) -> ValueId {
        let r = dims.len();
        let red = g
            .op(
                Prim::Reduce {
                    op,
                    dimensions: vec![r - 1],
                },
                &[x],
            )
            .unwrap();
        let mut kept = dims.to_vec();
        kept[r - 1] = 1;
        let red = g.op(Prim::Reshape { dims: kept }, &[red]).unwrap();
        g.op(
            Prim::BroadcastInDim {
                dims: dims.to_vec(),
                mapping: (0..r).collect(),
            },
            &[red],
        )
        .unwrap()
    }

    /// a · b over batch dimension 0, contracting a's dimension 2 with b's `rhs`.
    fn batched_product(g: &mut GraphBuilder, a: ValueId, b: ValueId, rhs: usize) -> ValueId {
        g.op(
            Prim::DotGeneral {
                lhs_batch: vec![0],
                rhs_batch: vec![0],
                lhs_contract: vec![2],
                rhs_contract: vec![rhs],
                precision: Default::default(),
            },
            &[a, b],
        )
        .unwrap()
    }

    /// softmax(q kᵀ · scale) v over batch [6], L 5, S 7, E 4, Ev 3.
    fn written(w: Written) -> Graph {
        let (b, l, s, e, ev) = (6u64, 5u64, 7u64, 4u64, 3u64);
        let mut g = GraphBuilder::new();
        let f = |d: &[u64]| TensorType::new(DType::F32, d);
        let q = g.param(f(&[b, l, e]));
        let k = g.param(if w.transposed_k {
            f(&[b, e, s])
        } else {
            f(&[b, s, e])
        });
        let v = g.param(f(&[b, s, ev]));
        let c = match w.scale {
            3 | 5 => Some(g.param(f(&[]))),
            4 => Some(g.param(TensorType::new(DType::I64, &[]))),
            _ => None,
        };
        let mask = w.masked.then(|| g.param(f(&[b, l, s])));
        let scores = batched_product(&mut g, q, k, if w.transposed_k { 1 } else { 2 });
        let mut dims = vec![b, l, s];
        let mut x = scores;
        if w.reshaped {
            dims = vec![2, 3, l, s];
            x = g.op(Prim::Reshape { dims: dims.clone() }, &[x]).unwrap();
        }
        let scalar = |g: &mut GraphBuilder, value: ValueId| {
            g.op(
                Prim::BroadcastInDim {
                    dims: dims.clone(),
                    mapping: vec![],
                },
                &[value],
            )
            .unwrap()
        };
        x = match w.scale {
            1 => {
                let c = g.scalar(DType::F32, 0.5).unwrap();
                let c = scalar(&mut g, c);
                g.binary(BinaryOp::Mul, c, x).unwrap()
            }
            2 => {
                let c = g.scalar(DType::F32, 2.0).unwrap();
                let c = scalar(&mut g, c);
                g.binary(BinaryOp::Div, x, c).unwrap()
            }
            3 | 4 => {
                let mut c = c.unwrap();
                if w.scale == 4 {
                    c = g.op(Prim::Convert { to: DType::F32 }, &[c]).unwrap();
                }
                let c = scalar(&mut g, c);
                g.binary(BinaryOp::Div, x, c).unwrap()
            }
            5 => {
                let c = scalar(&mut g, c.unwrap());
                g.binary(BinaryOp::Mul, c, x).unwrap()
            }
            _ => x,
        };
        if let Some(m) = mask {
            x = g.binary(BinaryOp::Add, x, m).unwrap();
        }
        let m = row_stat(&mut g, x, ReduceOp::Max, &dims);
        let sh = g.binary(BinaryOp::Sub, x, m).unwrap();
        let ex = g.unary(UnaryOp::Exp, sh).unwrap();
        let sum = row_stat(&mut g, ex, ReduceOp::Sum, &dims);
        let mut p = g.binary(BinaryOp::Div, ex, sum).unwrap();
        let probs = p;
        if w.reshaped {
            p = g
                .op(
                    Prim::Reshape {
                        dims: vec![b, l, s],
                    },
                    &[p],
                )
                .unwrap();
        }
        let out = batched_product(&mut g, p, v, 1);
        let outs = if w.probs_returned {
            vec![out, probs]
        } else {
            vec![out]
        };
        g.build(&outs).unwrap()
    }

    fn inputs(graph: &Graph) -> Vec<HostTensor> {
        graph
            .param_types()
            .iter()
            .enumerate()
            .map(|(j, t)| {
                if t.dtype == DType::I64 {
                    return HostTensor::from_f64(DType::I64, &[], &[3.0]).unwrap();
                }
                let vals: Vec<f64> = (0..t.numel())
                    .map(|i| ((i as f64 + 1.0) * (0.37 + j as f64)).sin())
                    .collect();
                HostTensor::from_f64(t.dtype, &t.dims, &vals).unwrap()
            })
            .collect()
    }

    fn prims(graph: &Graph) -> Vec<String> {
        graph.nodes().iter().map(|n| n.prim.name()).collect()
    }

    /// Every way the scores get scaled and the softmax reshaped fuses into
    /// one attention, reading no product, with the written-out result.
    #[test]
    fn written_out_attention_becomes_one_attention_with_its_result() {
        let mut cases = vec![];
        for scale in 0..6 {
            for transposed_k in [false, true] {
                for reshaped in [false, true] {
                    cases.push(Written {
                        transposed_k,
                        scale,
                        reshaped,
                        ..PLAIN
                    });
                }
            }
        }
        for w in cases {
            let graph = written(w);
            let fused = crate::fusion::simplify(&graph).unwrap();
            let names = prims(&fused);
            assert!(
                names.contains(&"attention".to_string()),
                "{names:?}\n{graph}"
            );
            assert!(
                !names.iter().any(|n| n == "dot_general" || n == "exp"),
                "{names:?}"
            );
            // A scale known only at run time reaches the kernel as its
            // scalar operand: no pass over q or the scores scales them.
            for n in fused.nodes() {
                let big = fused.value_type(n.outputs[0]).numel() > 1;
                let kt = matches!(n.prim, Prim::Transpose { .. });
                assert!(
                    !big || kt || n.prim.name() == "attention",
                    "{} over a tensor\n{fused}",
                    n.prim.name()
                );
            }
            let ins = inputs(&graph);
            let want = eval_graph(&graph, &ins).unwrap();
            let got = eval_graph(&fused, &ins).unwrap();
            for (a, b) in got[0].to_f64_vec().iter().zip(want[0].to_f64_vec()) {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{a} vs {b}\n{fused}"
                );
            }
        }
    }

    /// Attention whose probabilities something else reads (a training
    /// forward), or with a mask added, keeps its written-out ops.
    #[test]
    fn attention_read_elsewhere_or_masked_is_left_alone() {
        for w in [
            Written {
                probs_returned: true,
                ..PLAIN
            },
            Written {
                masked: true,
                ..PLAIN
            },
        ] {
            let graph = written(w);
            assert!(fuse_attention(&graph).unwrap().is_none(), "{graph}");
        }
    }
}
