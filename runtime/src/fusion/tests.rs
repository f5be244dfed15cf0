use super::*;
use crate::ir::{BinaryOp, GraphBuilder, TensorType, UnaryOp};
use crate::ops::{self, Attr, Attrs};

fn op_graph(name: &str, inputs: &[TensorType], attrs: Attrs) -> Graph {
    ops::build_graph(ops::lookup(name).unwrap(), inputs, &attrs).unwrap()
}

#[test]
fn an_elementwise_chain_is_one_loop_with_folded_broadcasts() {
    // gelu(x + b) with b broadcast: one loop, the broadcast and scalars folded.
    let mut g = GraphBuilder::new();
    let x = g.param(TensorType::new(DType::F32, &[64, 32]));
    let b = g.param(TensorType::new(DType::F32, &[32]));
    let bb = g
        .op(
            Prim::BroadcastInDim {
                dims: vec![64, 32],
                mapping: vec![1],
            },
            &[b],
        )
        .unwrap();
    let h = g.binary(BinaryOp::Add, x, bb).unwrap();
    let e = g.unary(UnaryOp::Erf, h).unwrap();
    let y = g.binary(BinaryOp::Mul, e, h).unwrap();
    let graph = g.build(&[y]).unwrap();
    let p = plan(&graph);
    assert_eq!(p.kernels.len(), 1, "{p:?}");
    assert_eq!(p.loop_count(), 1);
    assert_eq!(p.kernels[0].stores, vec![y]);
    assert!(p.folded_loads.contains(&0));
}

#[test]
fn softmax_fuses_its_reductions_as_epilogues() {
    let g = op_graph(
        "softmax",
        &[TensorType::new(DType::F32, &[8, 128])],
        Attrs::new().with("dim", Attr::Int(-1)),
    );
    let p = plan(&g);
    // max-reduce epilogue, then exp/sum epilogue, then the divide: three passes.
    assert_eq!(p.loop_count(), 3, "{p:#?}");
    assert!(
        p.kernels
            .iter()
            .all(|k| matches!(k.kind, KernelKind::Loop { .. })),
        "{p:#?}"
    );
}

#[test]
fn non_elementwise_nodes_are_kernels_of_their_own_and_values_are_stored_once() {
    let g = op_graph(
        "linear",
        &[
            TensorType::new(DType::F32, &[4, 8]),
            TensorType::new(DType::F32, &[16, 8]),
            TensorType::new(DType::F32, &[16]),
        ],
        Attrs::new(),
    );
    let p = plan(&g);
    let singles = p
        .kernels
        .iter()
        .filter(|k| k.kind == KernelKind::Single)
        .count();
    assert!(singles >= 2, "transpose and dot_general run alone: {p:#?}");
    // Every value read by a later kernel is stored by its producer.
    let stored: HashSet<ValueId> = p
        .kernels
        .iter()
        .flat_map(|k| k.stores.iter().copied())
        .collect();
    assert!(g.outputs().iter().all(|o| stored.contains(o)));
}

#[test]
fn integer_values_run_node_by_node() {
    let mut g = GraphBuilder::new();
    let x = g.param(TensorType::new(DType::I64, &[16]));
    let y = g.binary(BinaryOp::Add, x, x).unwrap();
    let z = g.binary(BinaryOp::Mul, y, x).unwrap();
    let p = plan(&g.build(&[z]).unwrap());
    assert_eq!(p.loop_count(), 0);
    assert_eq!(p.kernels.len(), 2);
}
