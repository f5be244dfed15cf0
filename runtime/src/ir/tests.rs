use super::*;

fn gelu_block() -> Graph {
    // y = x * 0.5 * (1 + erf(x / sqrt 2)) + b  (b broadcast over rows)
    let mut g = GraphBuilder::new();
    let x = g.param(TensorType::new(DType::F32, &[4, 8]));
    let b = g.param(TensorType::new(DType::F32, &[8]));
    let bb = g
        .op(
            Prim::BroadcastInDim {
                dims: vec![4, 8],
                mapping: vec![1],
            },
            &[b],
        )
        .unwrap();
    let c = g
        .scalar(DType::F32, std::f64::consts::FRAC_1_SQRT_2)
        .unwrap();
    let cb = g
        .op(
            Prim::BroadcastInDim {
                dims: vec![4, 8],
                mapping: vec![],
            },
            &[c],
        )
        .unwrap();
    let xs = g.binary(BinaryOp::Mul, x, cb).unwrap();
    let e = g.unary(UnaryOp::Erf, xs).unwrap();
    let y = g.binary(BinaryOp::Add, e, bb).unwrap();
    let s = g
        .op(
            Prim::Reduce {
                op: ReduceOp::Sum,
                dimensions: vec![1],
            },
            &[y],
        )
        .unwrap();
    g.build(&[y, s]).unwrap()
}

#[test]
fn builder_infers_types() {
    let g = gelu_block();
    assert_eq!(
        g.output_types(),
        vec![
            TensorType::new(DType::F32, &[4, 8]),
            TensorType::new(DType::F32, &[4])
        ]
    );
    assert_eq!(g.param_types().len(), 2);
    assert_eq!(g.nodes().len(), 7);
}

#[test]
fn canonical_form_round_trips_and_fingerprint_is_stable() {
    let g = gelu_block();
    let text = g.canonical();
    let back = Graph::from_canonical(&text).unwrap();
    assert_eq!(back, g);
    assert_eq!(back.fingerprint(), g.fingerprint());
    // The same program built again has the same fingerprint; a different
    // attribute changes it.
    assert_eq!(gelu_block().fingerprint(), g.fingerprint());
    let mut other = GraphBuilder::new();
    let x = other.param(TensorType::new(DType::F32, &[4, 8]));
    let y = other.unary(UnaryOp::Exp, x).unwrap();
    let other = other.build(&[y]).unwrap();
    assert_ne!(other.fingerprint(), g.fingerprint());
    // Pinned: the fingerprint must not change across processes, machines or
    // releases without a format version bump.
    insta::assert_snapshot!("gelu_block_fingerprint", g.fingerprint());
    insta::assert_snapshot!("gelu_block_text", g.to_string());
}

/// Aliases (outputs stored over parameters) are part of the canonical
/// form and the fingerprint when there are any, checked when set and when
/// read back, and absent from the form of a graph without them.
#[test]
fn aliases_are_checked_and_kept_in_the_canonical_form() {
    let g = gelu_block();
    assert!(!g.canonical().contains("aliases"));
    let y_over_x = Alias {
        output: 0,
        param: 0,
    };
    let a = gelu_block().with_aliases(vec![y_over_x]).unwrap();
    assert_eq!(a.aliases(), &[y_over_x]);
    assert_eq!((a.aliased_param(0), a.aliased_param(1)), (Some(0), None));
    assert_ne!(a.fingerprint(), g.fingerprint());
    let back = Graph::from_canonical(&a.canonical()).unwrap();
    assert_eq!(back, a);
    assert!(a.to_string().contains("output 0 (%"), "{a}");
    // Bad aliases name what is wrong.
    let bad = |output: u32, param: u32| {
        gelu_block()
            .with_aliases(vec![y_over_x, Alias { output, param }])
            .unwrap_err()
            .to_string()
    };
    // The sum, f32[4], over x, f32[4,8].
    assert!(bad(1, 0).contains("types differ"), "{}", bad(1, 0));
    assert!(bad(0, 0).contains("twice"), "{}", bad(0, 0));
    assert!(bad(2, 0).contains("2 outputs"), "{}", bad(2, 0));
    assert!(bad(0, 5).contains("2 parameters"), "{}", bad(0, 5));
    // A canonical text with a bad alias is refused when read back.
    let text = a.canonical().replace("\"param\":0", "\"param\":1");
    let e = Graph::from_canonical(&text).unwrap_err().to_string();
    assert!(e.contains("types differ"), "{e}");
}

#[test]
fn corrupt_or_inconsistent_canonical_text_is_rejected() {
    let text = gelu_block().canonical();
    assert!(Graph::from_canonical(&text[..text.len() / 2]).is_err());
    assert!(Graph::from_canonical("{\"hello\": 1}").is_err());
    // Change the declared type of a node result: detected by re-inference.
    let bad = text.replacen("\"dims\":[4]}", "\"dims\":[5]}", 1);
    assert_ne!(bad, text);
    let e = Graph::from_canonical(&bad).unwrap_err().to_string();
    assert!(e.contains("differ"), "{e}");
    // An operand that refers to a later value.
    let mut g = GraphBuilder::new();
    let x = g.param(TensorType::new(DType::F32, &[2]));
    assert!(g.unary(UnaryOp::Exp, ValueId(9)).is_err());
    let _ = x;
}

#[test]
fn bad_nodes_are_errors_naming_the_primitive() {
    let mut g = GraphBuilder::new();
    let x = g.param(TensorType::new(DType::F32, &[2, 3]));
    let i = g.param(TensorType::new(DType::I32, &[2, 3]));
    let cases: Vec<(Prim, Vec<ValueId>, &str)> = vec![
        (
            Prim::Binary(BinaryOp::Add),
            vec![x, i],
            "add: operands: f32[2,3] and i32[2,3] differ",
        ),
        (
            Prim::Unary(UnaryOp::Exp),
            vec![i],
            "exp: needs a floating-point operand",
        ),
        (
            Prim::Reshape { dims: vec![4] },
            vec![x],
            "reshape: cannot reshape f32[2,3] to [4]",
        ),
        (
            Prim::Transpose { perm: vec![0, 0] },
            vec![x],
            "is not a permutation",
        ),
        (
            Prim::DotGeneral {
                lhs_batch: vec![],
                rhs_batch: vec![],
                lhs_contract: vec![0],
                rhs_contract: vec![1],
                precision: Default::default(),
            },
            vec![x, x],
            "dot_general: lhs dimension 0 (size 2) and rhs dimension 1 (size 3) differ",
        ),
        (
            Prim::Slice {
                start: vec![0, 2],
                limit: vec![2, 4],
                stride: vec![1, 1],
            },
            vec![x],
            "limit 4",
        ),
        (
            Prim::Gather { axis: 1 },
            vec![x, x],
            "indices must be i32 or i64",
        ),
        (
            Prim::BroadcastInDim {
                dims: vec![2, 4],
                mapping: vec![0, 1],
            },
            vec![x],
            "cannot broadcast",
        ),
        (Prim::Select, vec![x, x, x], "predicate must be bool"),
    ];
    for (prim, ins, want) in cases {
        let e = g.node(prim.clone(), &ins).unwrap_err().to_string();
        assert!(e.contains(want), "{}: {e} (wanted {want:?})", prim.name());
    }
}

#[test]
fn shape_rules_of_structural_primitives() {
    let mut g = GraphBuilder::new();
    let x = g.param(TensorType::new(DType::F32, &[2, 3, 4]));
    let w = g.param(TensorType::new(DType::F32, &[2, 4, 5]));
    let idx = g.param(TensorType::new(DType::I64, &[7]));
    let t = |g: &GraphBuilder, v| g.value_type(v).unwrap().dims.clone();
    let d = g
        .op(
            Prim::DotGeneral {
                lhs_batch: vec![0],
                rhs_batch: vec![0],
                lhs_contract: vec![2],
                rhs_contract: vec![1],
                precision: Default::default(),
            },
            &[x, w],
        )
        .unwrap();
    assert_eq!(t(&g, d), vec![2, 3, 5]);
    let s = g
        .op(
            Prim::Slice {
                start: vec![0, 1, 0],
                limit: vec![2, 3, 4],
                stride: vec![1, 1, 3],
            },
            &[x],
        )
        .unwrap();
    assert_eq!(t(&g, s), vec![2, 2, 2]);
    let tk = g.op(Prim::Take { axis: 1 }, &[x, idx]).unwrap();
    assert_eq!(t(&g, tk), vec![2, 7, 4]);
    let zero = g.scalar(DType::F32, 0.0).unwrap();
    let p = g
        .op(
            Prim::Pad {
                low: vec![1, -1, 0],
                high: vec![0, 0, 2],
                interior: vec![0, 0, 1],
            },
            &[x, zero],
        )
        .unwrap();
    assert_eq!(t(&g, p), vec![3, 2, 9]);
    let c = g.op(Prim::Concatenate { dimension: 1 }, &[x, x]).unwrap();
    assert_eq!(t(&g, c), vec![2, 6, 4]);
    let sorted = g
        .node(
            Prim::Sort {
                dimension: 2,
                descending: true,
                stable: true,
            },
            &[x],
        )
        .unwrap();
    assert_eq!(sorted.len(), 2);
    assert_eq!(g.value_type(sorted[1]).unwrap().dtype, DType::I64);
    let img = g.param_after_nodes_is_refused();
    assert!(img);
}

impl GraphBuilder {
    fn param_after_nodes_is_refused(&mut self) -> bool {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.param(TensorType::scalar(DType::F32));
        }))
        .is_err()
    }
}

/// A product's precision is in the canonical form, and so in the
/// fingerprint, only when it is below HIGHEST: graphs of full-precision
/// products (all graphs before precisions existed) keep their text and
/// fingerprint, and a reduced one reads back as it was written.
#[test]
fn product_precision_is_canonical_only_below_highest() {
    let product = |precision: Precision| {
        let mut b = GraphBuilder::new();
        let x = b.param(TensorType::new(DType::F32, &[2, 3]));
        let y = b.param(TensorType::new(DType::F32, &[3, 4]));
        let d = b
            .op(
                Prim::DotGeneral {
                    lhs_batch: vec![],
                    rhs_batch: vec![],
                    lhs_contract: vec![1],
                    rhs_contract: vec![0],
                    precision,
                },
                &[x, y],
            )
            .unwrap();
        b.build(&[d]).unwrap()
    };
    let full = product(Precision::Highest);
    assert!(
        !full.canonical().contains("precision"),
        "{}",
        full.canonical()
    );
    let mut fingerprints = vec![full.fingerprint()];
    for p in [Precision::Default, Precision::High] {
        let g = product(p);
        let text = g.canonical();
        assert!(
            text.contains(&format!("\"precision\":\"{}\"", p.name().to_lowercase())),
            "{text}"
        );
        assert_eq!(Graph::from_canonical(&text).unwrap(), g);
        fingerprints.push(g.fingerprint());
    }
    fingerprints.sort();
    fingerprints.dedup();
    assert_eq!(fingerprints.len(), 3);
    // A graph written before precisions existed reads as HIGHEST.
    assert_eq!(Graph::from_canonical(&full.canonical()).unwrap(), full);
}

/// bitcast_convert reads an element's bytes as another type of the same
/// width; anything else is an error that says so.
#[test]
fn bitcast_convert_needs_the_same_width() {
    let mut g = GraphBuilder::new();
    let x = g.param(TensorType::new(DType::F32, &[2, 3]));
    let i = g.op(Prim::BitcastConvert { to: DType::I32 }, &[x]).unwrap();
    assert_eq!(
        g.value_type(i).unwrap(),
        &TensorType::new(DType::I32, &[2, 3])
    );
    for to in [DType::I64, DType::F16, DType::Bool] {
        let e = g
            .op(Prim::BitcastConvert { to }, &[x])
            .unwrap_err()
            .to_string();
        assert!(e.contains("of the same width"), "{e}");
    }
    // And it survives the canonical form.
    let graph = g.build(&[i]).unwrap();
    let back = Graph::from_canonical(&graph.canonical()).unwrap();
    assert_eq!(back, graph);
}
