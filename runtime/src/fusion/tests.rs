use super::*;
use crate::ir::{BinaryOp, GraphBuilder, TensorType, UnaryOp};
use crate::ops::{self, Attr, Attrs};

fn op_graph(name: &str, inputs: &[TensorType], attrs: Attrs) -> Graph {
    ops::build_graph(ops::lookup(name).unwrap(), inputs, &attrs).unwrap()
}

/// `a @ b` for 2-D `a` and `b`.
fn matmul(g: &mut GraphBuilder, a: ValueId, b: ValueId) -> ValueId {
    g.op(
        Prim::DotGeneral {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract: vec![1],
            rhs_contract: vec![0],
            precision: Default::default(),
        },
        &[a, b],
    )
    .unwrap()
}

/// `v` reversed along its first dimension: a kernel of its own.
fn reverse(g: &mut GraphBuilder, v: ValueId) -> ValueId {
    g.op(
        Prim::Reverse {
            dimensions: vec![0],
        },
        &[v],
    )
    .unwrap()
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
    // max-reduce epilogue, then exp/sum epilogue, then the divide: three
    // phases of one row kernel that stores only the result.
    assert_eq!(p.loop_count(), 3, "{p:#?}");
    assert_eq!(p.kernels.len(), 1, "{p:#?}");
    let KernelKind::Rows {
        shape,
        reduce_dims,
        phases,
    } = &p.kernels[0].kind
    else {
        panic!("{p:#?}")
    };
    assert_eq!((&shape[..], *reduce_dims), (&[8u64, 128][..], 1));
    assert_eq!(p.kernels[0].stores, g.outputs().to_vec());
    let reductions = |k: &Kernel| {
        k.nodes
            .iter()
            .filter(|&&i| matches!(g.nodes()[i].prim, Prim::Reduce { .. }))
            .count()
    };
    let counts: Vec<usize> = phases.iter().map(reductions).collect();
    assert_eq!(counts, [1, 1, 0], "{p:#?}");
    // Each of the first two phases hands its reduction on (and the
    // exponentials, or the shifted scores, that the next one reads).
    assert!(phases[..2].iter().all(|k| !k.stores.is_empty()), "{p:#?}");
    assert_eq!(phases[2].stores, g.outputs().to_vec());
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

/// gelu reads its parameter in two places: `erf(x / sqrt 2) + 1` and
/// `x * 0.5`. The second reads only the parameter, so it joins the pass
/// already reading `x` instead of starting a second pass that re-reads `x`
/// and reads back a stored `erf(..) + 1`.
#[test]
fn a_node_reading_only_parameters_joins_the_open_pass() {
    for approximate in ["none", "tanh"] {
        let g = op_graph(
            "gelu",
            &[TensorType::new(DType::F32, &[64, 32])],
            Attrs::new().with("approximate", Attr::Str(approximate.into())),
        );
        let p = plan(&g);
        assert_eq!(p.kernels.len(), 1, "{approximate}: {p:#?}");
        assert_eq!(p.kernels[0].stores, g.outputs().to_vec(), "{approximate}");
    }
    // It never joins a pass that runs before its operand exists: `neg`
    // reads the reverse of `exp(x)`, so it cannot join exp's pass, and
    // `abs(x)` (parameters only) joins the pass that already reads `x`.
    let mut g = GraphBuilder::new();
    let x = g.param(TensorType::new(DType::F32, &[8]));
    let a = g.unary(UnaryOp::Exp, x).unwrap();
    let r = reverse(&mut g, a);
    let b = g.unary(UnaryOp::Neg, r).unwrap();
    let c = g.unary(UnaryOp::Abs, x).unwrap();
    let graph = g.build(&[b, c]).unwrap();
    let p = plan(&graph);
    let nodes = graph.nodes();
    let kernel_of = |prim: Prim| {
        let node = nodes.iter().position(|n| n.prim == prim).unwrap();
        p.kernels
            .iter()
            .position(|k| k.nodes.contains(&node))
            .unwrap()
    };
    let (exp, rev, neg, abs) = (
        kernel_of(Prim::Unary(UnaryOp::Exp)),
        kernel_of(Prim::Reverse {
            dimensions: vec![0],
        }),
        kernel_of(Prim::Unary(UnaryOp::Neg)),
        kernel_of(Prim::Unary(UnaryOp::Abs)),
    );
    assert!(exp < rev && rev < neg, "{p:#?}");
    // abs joins the pass already reading x (exp's), not neg's, which
    // reads other values: unrelated work of one shape stays apart.
    assert_eq!(abs, exp, "{p:#?}");
    assert_eq!(p.kernels.len(), 3, "{p:#?}");
}

#[test]
fn a_node_reading_a_pass_value_through_a_load_starts_a_new_pass() {
    // rsqrt(broadcast(reshape(x + eps))): the reshape there and back maps
    // [8, 1] onto itself, but a load reads a stored value, so rsqrt cannot
    // join the add's pass (the loop engine failed: "loop source is not
    // stored"). Deferred reads derived through view primitives build this
    // shape, and so can a graph from the C ABI.
    let mut g = GraphBuilder::new();
    let x = g.param(TensorType::new(DType::F32, &[8, 1]));
    let a = g.binary(BinaryOp::Add, x, x).unwrap();
    let r = g.op(Prim::Reshape { dims: vec![8] }, &[a]).unwrap();
    let b = g
        .op(
            Prim::BroadcastInDim {
                dims: vec![8, 1],
                mapping: vec![0],
            },
            &[r],
        )
        .unwrap();
    let y = g.unary(UnaryOp::Rsqrt, b).unwrap();
    let graph = g.build(&[y]).unwrap();
    let p = plan(&graph);
    assert_eq!(p.loop_count(), 2, "{p:#?}");
    check_plan_equals_reference(&graph, &[(1..=8).map(|i| i as f32).collect()], 0.0);
}

/// The graph run by the host's loop engine as planned gives what
/// node-by-node evaluation gives (f32 parameters, in order), within
/// `tol * (1 + |want|)` (0: bit for bit; the engine's exp, erf and tanh
/// are within 4 ulps, which a later difference may magnify).
fn check_plan_equals_reference(graph: &Graph, params: &[Vec<f32>], tol: f64) {
    let want =
        crate::platform::host::kernels::eval_graph(graph, &host_inputs(graph, params)).unwrap();
    for (w, got) in want.iter().zip(run_planned(graph, params)) {
        for (g, w) in got.to_f64_vec().iter().zip(w.to_f64_vec()) {
            assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{g} against {w}");
        }
    }
}

fn host_inputs(
    graph: &Graph,
    params: &[Vec<f32>],
) -> Vec<crate::platform::host::kernels::HostTensor> {
    graph
        .param_types()
        .iter()
        .zip(params)
        .map(|(t, v)| {
            let v: Vec<f64> = v.iter().map(|&x| x as f64).collect();
            crate::platform::host::kernels::HostTensor::from_f64(t.dtype, &t.dims, &v).unwrap()
        })
        .collect()
}

/// The graph's results as the host's loop engine computes them, planned
/// (f32 parameters, in order).
fn run_planned(
    graph: &Graph,
    params: &[Vec<f32>],
) -> Vec<crate::platform::host::kernels::HostTensor> {
    let p = plan(graph);
    let programs: Vec<_> = p
        .kernels
        .iter()
        .map(|k| crate::platform::host::fused::Program::compile(graph, k))
        .collect();
    let mut values = vec![None; graph.num_values()];
    for (v, t) in graph.params().iter().zip(host_inputs(graph, params)) {
        values[v.0 as usize] = Some(t);
    }
    let dead = p.dead_after(graph);
    crate::platform::host::fused::run_plan(
        graph,
        &p,
        &programs,
        &mut values,
        &Default::default(),
        &dead,
    )
    .unwrap();
    graph
        .outputs()
        .iter()
        .map(|o| values[o.0 as usize].clone().unwrap())
        .collect()
}

#[test]
fn a_pass_merges_with_its_consumer_around_a_kernel_that_reads_it() {
    // exp(x) and neg(y) start passes of their own (they share no operand);
    // exp(x) + neg(y) joins neg's pass and pulls exp's pass in. When a
    // kernel between them (here a reverse) reads exp(x), neg's pass moves
    // up into exp's instead (it reads nothing the reverse makes), which
    // then stores exp(x) for the reverse; unless the sum also reads the
    // reverse's result: then the two passes stay apart.
    for (read_between, sum_reads_it) in [(false, false), (true, false), (true, true)] {
        let mut g = GraphBuilder::new();
        let x = g.param(TensorType::new(DType::F32, &[8]));
        let y = g.param(TensorType::new(DType::F32, &[8]));
        let a = g.unary(UnaryOp::Exp, x).unwrap();
        let mut outs = vec![];
        let r = read_between.then(|| reverse(&mut g, a));
        let b = g.unary(UnaryOp::Neg, y).unwrap();
        let mut c = g.binary(BinaryOp::Add, a, b).unwrap();
        match (r, sum_reads_it) {
            (Some(r), true) => c = g.binary(BinaryOp::Mul, c, r).unwrap(),
            (Some(r), false) => outs.push(r),
            (None, _) => {}
        }
        outs.push(c);
        let graph = g.build(&outs).unwrap();
        let p = plan(&graph);
        let kernel_of = |v: ValueId| {
            let node = graph
                .nodes()
                .iter()
                .position(|n| n.outputs.contains(&v))
                .unwrap();
            p.kernels
                .iter()
                .position(|k| k.nodes.contains(&node))
                .unwrap()
        };
        match (read_between, sum_reads_it) {
            (false, _) => {
                assert_eq!(p.kernels.len(), 1, "{p:#?}");
                assert_eq!(p.kernels[0].stores, vec![c], "{p:#?}");
            }
            (true, false) => {
                assert_eq!(p.loop_count(), 1, "{p:#?}");
                assert_eq!(kernel_of(a), kernel_of(c), "{p:#?}");
                assert_eq!(p.kernels[kernel_of(a)].stores, vec![a, c], "{p:#?}");
            }
            (true, true) => {
                assert_ne!(kernel_of(a), kernel_of(c), "{p:#?}");
                assert!(p.kernels[kernel_of(a)].stores.contains(&a), "{p:#?}");
            }
        }
        // Whatever the plan, the results are the graph's.
        let inputs: Vec<Vec<f32>> = (0..2)
            .map(|k| {
                (0..8)
                    .map(|i| (i as f32 - 3.5) * (k as f32 + 0.5))
                    .collect()
            })
            .collect();
        check_plan_equals_reference(&graph, &inputs, 1e-5);
    }
}

/// A value is dead after the last kernel that reads it, directly or
/// through a load; the graph's results never are.
#[test]
fn values_die_after_the_last_kernel_that_reads_them() {
    let t = TensorType::new(DType::F32, &[8, 8]);
    let mut g = GraphBuilder::new();
    let (x, y) = (g.param(t.clone()), g.param(t.clone()));
    let dot = || Prim::DotGeneral {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contract: vec![1],
        rhs_contract: vec![0],
        precision: Default::default(),
    };
    let a = g.op(dot(), &[x, y]).unwrap(); // kernel: product
    let e = g.unary(UnaryOp::Exp, a).unwrap(); // a pass reading a
    let b = g.op(dot(), &[e, y]).unwrap(); // product reading e
    let row = g.op(Prim::Reshape { dims: vec![64] }, &[a]).unwrap(); // a load of a
    let n = g.unary(UnaryOp::Neg, row).unwrap(); // a pass reading a through it
    let graph = g.build(&[b, n]).unwrap();
    let p = plan(&graph);
    let dead = p.dead_after(&graph);
    assert_eq!(dead.len(), p.kernels.len());
    let died = |v: ValueId| -> Option<usize> { dead.iter().position(|d| d.contains(&v)) };
    let kernel_of = |v: ValueId| {
        p.kernels
            .iter()
            .position(|k| {
                k.nodes
                    .iter()
                    .any(|&i| graph.nodes()[i].outputs.contains(&v))
            })
            .unwrap()
    };
    assert_eq!(
        died(a),
        Some(kernel_of(n)),
        "a is read through the reshape: {p:#?}"
    );
    assert_eq!(died(e), Some(kernel_of(b)), "{p:#?}");
    for v in [b, n] {
        assert_eq!(died(v), None, "{v:?} {p:#?}");
    }
}

/// The phases of the row kernel of `p`, or a panic.
fn row_phases(p: &Plan) -> &[Kernel] {
    let rows: Vec<&[Kernel]> = p
        .kernels
        .iter()
        .filter_map(|k| match &k.kind {
            KernelKind::Rows { phases, .. } => Some(&phases[..]),
            _ => None,
        })
        .collect();
    assert_eq!(rows.len(), 1, "{p:#?}");
    rows[0]
}

/// layer_norm's mean, its variance, `rsqrt(var / n + eps)` over the rows
/// alone, and the normalization are phases of one kernel, which stores
/// the result and the mean and rstd the backward reads, nothing else.
#[test]
fn layer_norm_is_one_row_kernel_with_phases_over_the_rows() {
    let g = op_graph(
        "layer_norm",
        &[
            TensorType::new(DType::F32, &[64, 96]),
            TensorType::new(DType::F32, &[96]),
            TensorType::new(DType::F32, &[96]),
        ],
        Attrs::new().with("normalized_shape", Attr::Ints(vec![96])),
    );
    let p = plan(&g);
    assert_eq!(p.kernels.len(), 1, "{p:#?}");
    let phases = row_phases(&p);
    let shapes: Vec<Vec<u64>> = phases
        .iter()
        .map(|k| match &k.kind {
            KernelKind::Loop { shape, .. } => shape.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(shapes.iter().any(|s| s == &[64, 96]), "{p:#?}");
    assert!(
        shapes.iter().any(|s| s.iter().product::<u64>() == 64),
        "a phase over the rows alone: {p:#?}"
    );
    let mut stored = p.kernels[0].stores.clone();
    let mut outputs = g.outputs().to_vec();
    stored.sort();
    outputs.sort();
    assert_eq!(stored, outputs);
}

/// One value per row of `dims`, broadcast along its row.
fn down_rows(g: &mut GraphBuilder, v: ValueId, dims: &[u64]) -> ValueId {
    g.op(
        Prim::BroadcastInDim {
            dims: dims.to_vec(),
            mapping: vec![0],
        },
        &[v],
    )
    .unwrap()
}

fn assert_no_row_kernel(p: &Plan) {
    assert!(
        p.kernels
            .iter()
            .all(|k| !matches!(k.kind, KernelKind::Rows { .. })),
        "{p:#?}"
    );
}

/// A later pass that reads a kernel between (here a reversal of the row
/// maxima) cannot be a phase: the row kernel would run before that kernel.
#[test]
fn a_pass_reading_a_kernel_after_the_reduction_is_not_a_phase() {
    let mut g = GraphBuilder::new();
    let x = g.param(TensorType::new(DType::F32, &[16, 32]));
    let m = g
        .op(
            Prim::Reduce {
                op: ReduceOp::Max,
                dimensions: vec![1],
            },
            &[x],
        )
        .unwrap();
    let r = reverse(&mut g, m);
    let b = down_rows(&mut g, r, &[16, 32]);
    let y = g.binary(BinaryOp::Sub, x, b).unwrap();
    assert_no_row_kernel(&plan(&g.build(&[y]).unwrap()));
}

/// A pass that reads a value of the reducing pass through a transpose
/// reads other rows than its own: not a phase.
#[test]
fn a_pass_reading_a_full_value_transposed_is_not_a_phase() {
    let mut g = GraphBuilder::new();
    let x = g.param(TensorType::new(DType::F32, &[16, 16]));
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
    let t = g.op(Prim::Transpose { perm: vec![1, 0] }, &[e]).unwrap();
    let b = down_rows(&mut g, s, &[16, 16]);
    let y = g.binary(BinaryOp::Div, t, b).unwrap();
    assert_no_row_kernel(&plan(&g.build(&[y]).unwrap()));
}

/// A gated MLP's backward: two products of the incoming gradient, a
/// matmul's result read through a reshape, with the two saved
/// activations. Both read the gradient, so they share one pass; they
/// were two when only a value of the loop's own dims counted as read.
#[test]
fn siblings_reading_a_reshaped_product_share_one_pass() {
    let mut g = GraphBuilder::new();
    let a = g.param(TensorType::new(DType::F32, &[12, 5]));
    let w = g.param(TensorType::new(DType::F32, &[5, 8]));
    let silu = g.param(TensorType::new(DType::F32, &[3, 4, 8]));
    let up = g.param(TensorType::new(DType::F32, &[3, 4, 8]));
    let d = matmul(&mut g, a, w);
    let read = |g: &mut GraphBuilder, other: ValueId| {
        let r = g
            .op(
                Prim::Reshape {
                    dims: vec![3, 4, 8],
                },
                &[d],
            )
            .unwrap();
        g.binary(BinaryOp::Mul, r, other).unwrap()
    };
    let d_up = read(&mut g, silu);
    let d_silu = read(&mut g, up);
    let t = g.unary(UnaryOp::Tanh, d_silu).unwrap();
    let graph = g.build(&[d_up, t]).unwrap();
    let p = plan(&graph);
    assert_eq!(p.loop_count(), 1, "{p:#?}");
    let mut stores = p.kernels.last().unwrap().stores.clone();
    stores.sort();
    assert_eq!(stores, vec![d_up, t], "{p:#?}");
}

/// A view that a product reads runs just before the product, not where
/// graph order put it: exp(x), read by a later product through a reshape,
/// then joins the pass that adds it to another product's result (which
/// that pass cannot move up past), instead of being stored and read back.
#[test]
fn a_view_kernel_waits_for_its_reader_and_leaves_passes_to_merge() {
    let mut g = GraphBuilder::new();
    let x = g.param(TensorType::new(DType::F32, &[4, 8]));
    let w = g.param(TensorType::new(DType::F32, &[8, 8]));
    let a = g.unary(UnaryOp::Exp, x).unwrap();
    let viewed = g.op(Prim::Reshape { dims: vec![4, 8] }, &[a]).unwrap();
    let m = matmul(&mut g, x, w);
    let c = g.binary(BinaryOp::Add, a, m).unwrap();
    let late = matmul(&mut g, viewed, w);
    let graph = g.build(&[c, late]).unwrap();
    let p = plan(&graph);
    assert_eq!(p.loop_count(), 1, "{p:#?}");
    let names: Vec<String> = p
        .kernels
        .iter()
        .map(|k| graph.nodes()[k.nodes[0]].prim.name())
        .collect();
    assert_eq!(
        names,
        ["dot_general", "exp", "reshape", "dot_general"],
        "{p:#?}"
    );
    let inputs: Vec<Vec<f32>> = [32, 64]
        .iter()
        .map(|&n| (0..n).map(|i| (i as f32 * 0.37).sin()).collect())
        .collect();
    check_plan_equals_reference(&graph, &inputs, 1e-5);
}

/// Rotary embeddings over [2, 4, 3, 8] (batch, heads, positions, head
/// dimension), as the op library and autograd record them: forward
/// `x * cos + cat(-x2, x1) * sin`, backward `cat(t2, -t1) + g * cos` with
/// `t = g * sin` (each half's gradient converted to its own dtype). After
/// `simplify`, each is one loop that reads its halves swapped piece by
/// piece, where the negations, the halves' copies and the concatenations
/// ran as kernels of their own; the results are the same bits.
#[test]
fn rotary_embeddings_forward_and_backward_are_one_pass_each() {
    let t = TensorType::new(DType::F32, &[2, 4, 3, 8]);
    let mut g = GraphBuilder::new();
    let x = g.param(t.clone());
    let grad = g.param(t.clone());
    let cos = g.param(TensorType::new(DType::F32, &[1, 1, 3, 8]));
    let sin = g.param(TensorType::new(DType::F32, &[1, 1, 3, 8]));
    let wide = |g: &mut GraphBuilder, v: ValueId| {
        g.op(
            Prim::BroadcastInDim {
                dims: vec![2, 4, 3, 8],
                mapping: vec![0, 1, 2, 3],
            },
            &[v],
        )
        .unwrap()
    };
    let half = |g: &mut GraphBuilder, v: ValueId, second: bool| {
        let at = if second { 4 } else { 0 };
        g.op(
            Prim::Slice {
                start: vec![0, 0, 0, at],
                limit: vec![2, 4, 3, at + 4],
                stride: vec![1, 1, 1, 1],
            },
            &[v],
        )
        .unwrap()
    };
    let concat = |g: &mut GraphBuilder, a: ValueId, b: ValueId| {
        g.op(Prim::Concatenate { dimension: 3 }, &[a, b]).unwrap()
    };
    let (c, s) = (wide(&mut g, cos), wide(&mut g, sin));
    // Forward.
    let x1 = half(&mut g, x, false);
    let x2 = half(&mut g, x, true);
    let minus_x2 = g.unary(UnaryOp::Neg, x2).unwrap();
    let rotated = concat(&mut g, minus_x2, x1);
    let xc = g.binary(BinaryOp::Mul, x, c).unwrap();
    let rs = g.binary(BinaryOp::Mul, rotated, s).unwrap();
    let y = g.binary(BinaryOp::Add, xc, rs).unwrap();
    // Backward.
    let gs = g.binary(BinaryOp::Mul, grad, s).unwrap();
    let t1 = half(&mut g, gs, false);
    let t2 = half(&mut g, gs, true);
    let minus_t1 = g.unary(UnaryOp::Neg, t1).unwrap();
    let own =
        |g: &mut GraphBuilder, v: ValueId| g.op(Prim::Convert { to: DType::F32 }, &[v]).unwrap();
    let (t2, minus_t1) = (own(&mut g, t2), own(&mut g, minus_t1));
    let back = concat(&mut g, t2, minus_t1);
    let gc = g.binary(BinaryOp::Mul, grad, c).unwrap();
    let dx = g.binary(BinaryOp::Add, back, gc).unwrap();
    let graph = g.build(&[y, dx]).unwrap();

    let simple = crate::fusion::simplify(&graph).unwrap();
    assert!(
        !simple
            .nodes()
            .iter()
            .any(|n| n.prim == Prim::Unary(UnaryOp::Neg)),
        "{simple}"
    );
    let p = plan(&simple);
    assert_eq!(p.kernels.len(), 2, "{simple}\n{p:#?}");
    assert_eq!(p.loop_count(), 2, "{simple}\n{p:#?}");
    for k in &p.kernels {
        let program = crate::platform::host::fused::Program::compile(&simple, k);
        assert!(
            program.is_some_and(|p| p.reads_pieces_in_place()),
            "{simple}"
        );
    }
    let inputs: Vec<Vec<f32>> = [192, 192, 24, 24]
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            (0..n)
                .map(|i| ((i * 7 + k * 3) as f32 * 0.13).sin() * 3.0)
                .collect()
        })
        .collect();
    let want =
        crate::platform::host::kernels::eval_graph(&graph, &host_inputs(&graph, &inputs)).unwrap();
    let got = run_planned(&simple, &inputs);
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(w.to_f64_vec(), g.to_f64_vec());
    }
}

/// Concatenations a loop reads piece by piece, over shapes whose rows
/// cross chunk and thread boundaries (rows of 7, 33 and 10 columns), in
/// two and three pieces, with the pieces reordered, one of them from a
/// transposed view: the same values as node by node. A concatenation of
/// views of two different values, or one a product reads, stays a kernel
/// and gives the same values too.
#[test]
fn concatenated_views_read_in_pieces_equal_the_reference() {
    let slice = |g: &mut GraphBuilder, v: ValueId, lo: u64, hi: u64, dims: &[u64]| {
        let last = dims.len() - 1;
        let mut start = vec![0; dims.len()];
        let mut limit = dims.to_vec();
        (start[last], limit[last]) = (lo, hi);
        g.op(
            Prim::Slice {
                start,
                limit,
                stride: vec![1; dims.len()],
            },
            &[v],
        )
        .unwrap()
    };
    for dims in [vec![3u64, 5, 7], vec![37, 33], vec![300, 10]] {
        let last = *dims.last().unwrap();
        let cuts: Vec<Vec<(u64, u64)>> = vec![
            vec![(last / 2, last), (0, last / 2)],
            vec![(last - 2, last), (1, last - 2), (0, 1)],
        ];
        for (case, cut) in cuts.iter().enumerate() {
            for variant in ["views", "two values", "transposed", "a product reads it"] {
                let mut g = GraphBuilder::new();
                let reversed: Vec<u64> = dims.iter().rev().copied().collect();
                let transposed = variant == "transposed";
                let x = g.param(TensorType::new(
                    DType::F32,
                    if transposed { &reversed } else { &dims },
                ));
                let y = g.param(TensorType::new(DType::F32, &dims));
                let w = g.param(TensorType::new(DType::F32, &[last, 4]));
                let x = if transposed {
                    let perm: Vec<usize> = (0..dims.len()).rev().collect();
                    g.op(Prim::Transpose { perm }, &[x]).unwrap()
                } else {
                    x
                };
                let parts: Vec<ValueId> = cut
                    .iter()
                    .enumerate()
                    .map(|(k, &(lo, hi))| {
                        let from = if variant == "two values" && k == 1 {
                            y
                        } else {
                            x
                        };
                        slice(&mut g, from, lo, hi, &dims)
                    })
                    .collect();
                let c = g
                    .op(
                        Prim::Concatenate {
                            dimension: dims.len() - 1,
                        },
                        &parts,
                    )
                    .unwrap();
                let e = g.unary(UnaryOp::Neg, c).unwrap();
                let mut outs = vec![g.binary(BinaryOp::Mul, e, y).unwrap()];
                if variant == "a product reads it" {
                    let d = g
                        .op(
                            Prim::DotGeneral {
                                lhs_batch: vec![],
                                rhs_batch: vec![],
                                lhs_contract: vec![dims.len() - 1],
                                rhs_contract: vec![0],
                                precision: Default::default(),
                            },
                            &[c, w],
                        )
                        .unwrap();
                    outs.push(d);
                }
                let graph = g.build(&outs).unwrap();
                let simple = crate::fusion::simplify(&graph).unwrap();
                let p = plan(&simple);
                let singles = p
                    .kernels
                    .iter()
                    .filter(|k| k.kind == KernelKind::Single)
                    .count();
                if matches!(variant, "views" | "transposed") {
                    assert_eq!(singles, 0, "{dims:?} {case} {variant}: {p:#?}");
                }
                let inputs: Vec<Vec<f32>> = graph
                    .param_types()
                    .iter()
                    .enumerate()
                    .map(|(k, t)| {
                        (0..t.numel())
                            .map(|i| (i as f32 * 0.71 + k as f32).sin())
                            .collect()
                    })
                    .collect();
                let want = crate::platform::host::kernels::eval_graph(
                    &graph,
                    &host_inputs(&graph, &inputs),
                )
                .unwrap();
                let got = run_planned(&simple, &inputs);
                for (w, g) in want.iter().zip(&got) {
                    let (w, g) = (w.to_f64_vec(), g.to_f64_vec());
                    // Products sum in another order: within rounding.
                    for (a, b) in w.iter().zip(&g) {
                        assert!(
                            (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
                            "{dims:?} {case} {variant}"
                        );
                    }
                }
            }
        }
    }
}

/// One recording with a gated MLP's forward and backward: the backward's
/// `logistic(gate)` and the factor it feeds read only `gate`, so they
/// join the forward's pass (which reads it); a kernel between (here a
/// reverse of the forward's result) keeps the backward's pass from
/// moving up. They move down to the backward's pass, which reads them,
/// instead of the forward's storing their result for it.
#[test]
fn nodes_only_a_later_pass_reads_move_to_it() {
    let t = TensorType::new(DType::F32, &[6, 8]);
    let mut g = GraphBuilder::new();
    let gate = g.param(t.clone());
    let up = g.param(t.clone());
    // Forward: silu(gate) * up.
    let s = g.unary(UnaryOp::Logistic, gate).unwrap();
    let silu = g.binary(BinaryOp::Mul, gate, s).unwrap();
    let act = g.binary(BinaryOp::Mul, silu, up).unwrap();
    let between = reverse(&mut g, act);
    // Backward's factor: 1 + gate * (1 - logistic(gate)).
    let s2 = g.unary(UnaryOp::Logistic, gate).unwrap();
    let one = g.scalar(DType::F32, 1.0).unwrap();
    let ones = g
        .op(
            Prim::BroadcastInDim {
                dims: vec![6, 8],
                mapping: vec![],
            },
            &[one],
        )
        .unwrap();
    let d = g.binary(BinaryOp::Sub, ones, s2).unwrap();
    let e = g.binary(BinaryOp::Mul, gate, d).unwrap();
    let factor = g.binary(BinaryOp::Add, ones, e).unwrap();
    let grad = g.binary(BinaryOp::Mul, between, s2).unwrap();
    let out = g.binary(BinaryOp::Mul, grad, factor).unwrap();
    let graph = g.build(&[act, out]).unwrap();
    let p = plan(&graph);
    assert_eq!(p.loop_count(), 2, "{p:#?}");
    let loops: Vec<&Kernel> = p
        .kernels
        .iter()
        .filter(|k| matches!(k.kind, KernelKind::Loop { .. }))
        .collect();
    assert_eq!(loops[0].stores, vec![act], "{p:#?}");
    assert_eq!(loops[1].stores, vec![out], "{p:#?}");
    let inputs: Vec<Vec<f32>> = (0..2)
        .map(|k| {
            (0..48)
                .map(|i| ((i * 5 + k) as f32 * 0.3).sin() * 2.0)
                .collect()
        })
        .collect();
    check_plan_equals_reference(&graph, &inputs, 1e-5);
}
