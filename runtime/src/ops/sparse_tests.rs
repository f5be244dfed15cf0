//! The SparseCore ops against f64 loops written here: forward, the
//! coalesced row-sparse gradient, each fused optimizer (touched rows only),
//! and the checker's report of the first bad entry. (modes_tests runs them
//! in every mode and on xla against the host reference.)

use super::*;
use crate::ir::DType;
use crate::platform::host::kernels::{eval_graph, HostTensor};

fn run(op: &str, inputs: &[HostTensor], attrs: &[(&str, Attr)]) -> Result<Vec<HostTensor>> {
    let id = lookup(op)?;
    let types: Vec<TensorType> = inputs.iter().map(|x| x.ty.clone()).collect();
    let mut a = Attrs::new();
    for (k, v) in attrs {
        a.set(k, v.clone());
    }
    let g = build_graph(id, &types, &a)?;
    eval_graph(&g, inputs)
}

fn ints(dt: DType, v: &[i64]) -> HostTensor {
    let f: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    HostTensor::from_f64(dt, &[v.len() as u64], &f).unwrap()
}
fn f32s(dims: &[u64], v: &[f64]) -> HostTensor {
    HostTensor::from_f64(DType::F32, dims, v).unwrap()
}
/// Deterministic values in [-1, 1).
fn vals(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}
fn close(got: &HostTensor, want: &[f64], tol: f64, what: &str) {
    let g = got.to_f64_vec();
    assert_eq!(g.len(), want.len(), "{what}");
    for (i, (a, b)) in g.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what}[{i}]: got {a}, want {b}"
        );
    }
}

/// A CSR with repeats, padding and one out-of-range id (entry 5).
struct Case {
    rp: Vec<i64>,
    ids: Vec<i64>,
    samples: Vec<i64>,
    gains: Vec<f64>,
    v: usize,
    d: usize,
    b: usize,
}

impl Case {
    fn new() -> Self {
        Case {
            rp: vec![4, 7],
            ids: vec![4, 1, 0, 1, 4, 9, 4, 2, 3],
            samples: vec![0, 0, 1, 2, 3, 3, 2, 1, 0],
            gains: vals(9, 1),
            v: 6,
            d: 3,
            b: 4,
        }
    }
    fn inputs(&self) -> Vec<HostTensor> {
        vec![
            ints(DType::I32, &self.rp),
            ints(DType::I64, &self.ids),
            ints(DType::I32, &self.samples),
            f32s(&[self.gains.len() as u64], &self.gains),
        ]
    }
    /// The entries that take part: before rp[-1], ids in range.
    fn live(&self) -> impl Iterator<Item = usize> + '_ {
        let end = *self.rp.last().unwrap() as usize;
        (0..end).filter(|&i| (self.ids[i] as usize) < self.v)
    }
    fn forward(&self, table: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; self.b * self.d];
        for i in self.live() {
            for k in 0..self.d {
                out[self.samples[i] as usize * self.d + k] +=
                    self.gains[i] * table[self.ids[i] as usize * self.d + k];
            }
        }
        out
    }
    /// Summed gradient per row, and which rows were touched.
    fn row_grads(&self, grad: &[f64]) -> (Vec<f64>, Vec<bool>) {
        let mut g = vec![0.0; self.v * self.d];
        let mut touched = vec![false; self.v];
        for i in self.live() {
            let r = self.ids[i] as usize;
            touched[r] = true;
            for k in 0..self.d {
                g[r * self.d + k] += self.gains[i] * grad[self.samples[i] as usize * self.d + k];
            }
        }
        (g, touched)
    }
}

#[test]
fn forward_sums_weighted_rows_into_samples_and_skips_padding() {
    let c = Case::new();
    let table = vals(c.v * c.d, 2);
    let mut ins = c.inputs();
    ins.push(f32s(&[c.v as u64, c.d as u64], &table));
    let out = run("sparse_dense_matmul", &ins, &[("batch_size", Attr::Int(4))]).unwrap();
    assert_eq!(out[0].ty.dims, vec![4, 3]);
    close(&out[0], &c.forward(&table), 1e-6, "forward");
}

#[test]
fn gradient_is_coalesced_and_row_sparse() {
    let c = Case::new();
    let grad = vals(c.b * c.d, 3);
    let mut ins = c.inputs();
    ins.push(f32s(&[c.b as u64, c.d as u64], &grad));
    let out = run(
        "sparse_dense_matmul_grad",
        &ins,
        &[("num_rows", Attr::Int(6))],
    )
    .unwrap();
    let (g, touched) = c.row_grads(&grad);
    let rows: Vec<i64> = out[0].to_f64_vec().iter().map(|&x| x as i64).collect();
    let want_rows: Vec<i64> = (0..c.v as i64).filter(|&r| touched[r as usize]).collect();
    let k = want_rows.len();
    assert_eq!(&rows[..k], &want_rows[..]);
    assert!(rows[k..].iter().all(|&r| r == -1), "{rows:?}");
    let mut want = vec![0.0; rows.len() * c.d];
    for (j, &r) in want_rows.iter().enumerate() {
        want[j * c.d..(j + 1) * c.d].copy_from_slice(&g[r as usize * c.d..(r as usize + 1) * c.d]);
    }
    close(&out[1], &want, 1e-6, "values");
}

/// Each optimizer against its formula, applied to touched rows only.
#[test]
fn fused_updates_touch_only_the_rows_looked_up() {
    let c = Case::new();
    let (v, d) = (c.v, c.d);
    let table = vals(v * d, 4);
    let grad = vals(c.b * d, 5);
    let (g, touched) = c.row_grads(&grad);
    let lr = 0.05;
    let state = |seed| -> Vec<f64> { vals(v * d, seed).iter().map(|x| x.abs()).collect() };
    let base = |extra: Vec<HostTensor>| {
        let mut ins = c.inputs();
        ins.push(f32s(&[v as u64, d as u64], &table));
        ins.extend(extra);
        ins.push(f32s(&[c.b as u64, d as u64], &grad));
        ins.push(f32s(&[], &[lr]));
        ins
    };
    let vd = [v as u64, d as u64];

    // SGD
    let out = run("sparse_dense_matmul_grad_with_sgd", &base(vec![]), &[]).unwrap();
    let want: Vec<f64> = (0..v * d).map(|j| table[j] - lr * g[j]).collect();
    close(&out[0], &want, 1e-6, "sgd table");

    // Adagrad
    let acc = state(6);
    let eps = 1e-3;
    let out = run(
        "sparse_dense_matmul_grad_with_adagrad",
        &base(vec![f32s(&vd, &acc)]),
        &[("eps", Attr::Float(eps))],
    )
    .unwrap();
    let mut wt = table.clone();
    let mut wa = acc.clone();
    for j in 0..v * d {
        if touched[j / d] {
            wa[j] += g[j] * g[j];
            wt[j] -= lr * g[j] / (wa[j].sqrt() + eps);
        }
    }
    close(&out[0], &wt, 1e-5, "adagrad table");
    close(&out[1], &wa, 1e-5, "adagrad accumulator");

    // Row-wise Adagrad, accumulator [V]
    let racc: Vec<f64> = state(7)[..v].to_vec();
    let out = run(
        "sparse_dense_matmul_grad_with_rowwise_adagrad",
        &base(vec![f32s(&[v as u64], &racc)]),
        &[("eps", Attr::Float(eps))],
    )
    .unwrap();
    let mut wt = table.clone();
    let mut wa = racc.clone();
    for r in (0..v).filter(|&r| touched[r]) {
        wa[r] += (0..d).map(|k| g[r * d + k].powi(2)).sum::<f64>() / d as f64;
        for k in 0..d {
            wt[r * d + k] -= lr * g[r * d + k] / (wa[r].sqrt() + eps);
        }
    }
    assert_eq!(out[1].ty.dims, vec![v as u64]);
    close(&out[0], &wt, 1e-5, "rowwise table");
    close(&out[1], &wa, 1e-5, "rowwise accumulator");

    // Adam (lazy: untouched rows keep their moments)
    let (m, vel) = (vals(v * d, 8), state(9));
    let (b1, b2) = (0.8, 0.95);
    let out = run(
        "sparse_dense_matmul_grad_with_adam",
        &base(vec![f32s(&vd, &m), f32s(&vd, &vel)]),
        &[
            ("beta1", Attr::Float(b1)),
            ("beta2", Attr::Float(b2)),
            ("eps", Attr::Float(eps)),
        ],
    )
    .unwrap();
    let (mut wt, mut wm, mut wv) = (table.clone(), m.clone(), vel.clone());
    for j in (0..v * d).filter(|&j| touched[j / d]) {
        wm[j] = b1 * m[j] + (1.0 - b1) * g[j];
        wv[j] = b2 * vel[j] + (1.0 - b2) * g[j] * g[j];
        wt[j] -= lr * wm[j] / (wv[j].sqrt() + eps);
    }
    close(&out[0], &wt, 1e-5, "adam table");
    close(&out[1], &wm, 1e-5, "adam momentum");
    close(&out[2], &wv, 1e-5, "adam velocity");
}

#[test]
fn the_check_reports_the_first_bad_entry_of_the_lowest_kind() {
    let check = |rp: &[i64], ids: &[i64], samples: &[i64], gains: &[f64]| -> Vec<i64> {
        let ins = vec![
            ints(DType::I32, rp),
            ints(DType::I32, ids),
            ints(DType::I32, samples),
            f32s(&[gains.len() as u64], gains),
        ];
        let out = run(
            "sparse_csr_check",
            &ins,
            &[("num_rows", Attr::Int(5)), ("batch_size", Attr::Int(2))],
        )
        .unwrap();
        out[0].to_f64_vec().iter().map(|&x| x as i64).collect()
    };
    let ok = [1.0, 1.0, 1.0, 1.0];
    assert_eq!(
        check(&[2, 4], &[0, 4, 1, 2], &[0, 1, 0, 1], &ok),
        [0, -1, 0]
    );
    // An id past the table at position 2 (and a padded bad id ignored).
    assert_eq!(check(&[2, 3], &[0, 4, 5, 9], &[0, 1, 0, 1], &ok), [2, 2, 5]);
    assert_eq!(
        check(&[2, 4], &[0, -1, 1, 2], &[0, 1, 0, 1], &ok),
        [2, 1, -1]
    );
    // A sample id past the batch.
    assert_eq!(check(&[2, 4], &[0, 1, 1, 2], &[0, 1, 2, 1], &ok), [3, 2, 2]);
    // A NaN gain (position as the value).
    assert_eq!(
        check(
            &[2, 4],
            &[0, 1, 1, 2],
            &[0, 1, 0, 1],
            &[1.0, f64::NAN, 1.0, 1.0]
        ),
        [4, 1, 1]
    );
    // Row pointers that decrease or run past the entries win over ids.
    assert_eq!(check(&[3, 2], &[0, 9, 1, 2], &[0, 1, 0, 1], &ok), [1, 1, 2]);
    assert_eq!(check(&[2, 5], &[0, 1, 1, 2], &[0, 1, 0, 1], &ok), [1, 1, 5]);
}

#[test]
fn shape_and_dtype_errors_name_the_input() {
    let c = Case::new();
    let mut ins = c.inputs();
    ins.push(f32s(&[6], &vals(6, 1)));
    let e = run("sparse_dense_matmul", &ins, &[("batch_size", Attr::Int(4))]).unwrap_err();
    assert!(e.to_string().contains("embedding_table"), "{e}");
    let mut ins = c.inputs();
    ins[2] = ints(DType::I32, &[0, 1]);
    ins.push(f32s(&[6, 3], &vals(18, 1)));
    let e = run("sparse_dense_matmul", &ins, &[("batch_size", Attr::Int(4))]).unwrap_err();
    assert!(e.to_string().contains("sample_ids"), "{e}");
    // An accumulator of the wrong shape.
    let mut ins = c.inputs();
    ins.push(f32s(&[6, 3], &vals(18, 1)));
    ins.push(f32s(&[6, 2], &vals(12, 1)));
    ins.push(f32s(&[4, 3], &vals(12, 1)));
    ins.push(f32s(&[], &[0.1]));
    let e = run("sparse_dense_matmul_grad_with_adagrad", &ins, &[]).unwrap_err();
    assert!(e.to_string().contains("accumulator"), "{e}");
    // A learning rate that is not one float.
    let mut ins = c.inputs();
    ins.push(f32s(&[6, 3], &vals(18, 1)));
    ins.push(f32s(&[4, 3], &vals(12, 1)));
    ins.push(f32s(&[2], &[0.1, 0.2]));
    let e = run("sparse_dense_matmul_grad_with_sgd", &ins, &[]).unwrap_err();
    assert!(e.to_string().contains("learning_rate"), "{e}");
}

/// With every entry padding (or out of range), no row moves, nor any
/// optimizer state (Adam's moments would decay if a dead entry updated one).
#[test]
fn no_live_entry_leaves_table_and_state_unchanged() {
    let (v, d) = (4usize, 2usize);
    let table = vals(v * d, 11);
    let m = vals(v * d, 12);
    let vel: Vec<f64> = vals(v * d, 13).iter().map(|x| x.abs()).collect();
    let vd = [v as u64, d as u64];
    for rp in [0i64, 3] {
        // rp 0: all padding; rp 3: three entries whose ids are past the table.
        let ins = |extra: Vec<HostTensor>| {
            let mut ins = vec![
                ints(DType::I32, &[rp]),
                ints(DType::I32, &[7, 9, 8, 0]),
                ints(DType::I32, &[0, 1, 1, 0]),
                f32s(&[4], &[1.0, 1.0, 1.0, 1.0]),
                f32s(&vd, &table),
            ];
            ins.extend(extra);
            ins.push(f32s(&[2, d as u64], &vals(2 * d, 14)));
            ins.push(f32s(&[], &[0.5]));
            ins
        };
        let out = run("sparse_dense_matmul_grad_with_sgd", &ins(vec![]), &[]).unwrap();
        close(&out[0], &table, 1e-7, "sgd");
        let out = run(
            "sparse_dense_matmul_grad_with_adagrad",
            &ins(vec![f32s(&vd, &vel)]),
            &[],
        )
        .unwrap();
        close(&out[0], &table, 1e-7, "adagrad table");
        close(&out[1], &vel, 1e-7, "adagrad accumulator");
        let out = run(
            "sparse_dense_matmul_grad_with_adam",
            &ins(vec![f32s(&vd, &m), f32s(&vd, &vel)]),
            &[],
        )
        .unwrap();
        close(&out[0], &table, 1e-7, "adam table");
        close(&out[1], &m, 1e-7, "adam momentum");
        close(&out[2], &vel, 1e-7, "adam velocity");
    }
}
