//! Tests of the training ops (random, losses, attention, backward ops,
//! convolutions, sort/topk/embedding_bag/index_put, optimizer steps)
//! through the host reference path. References are f64 loops written
//! here, known values, or central differences of the forward op in f64.

use super::*;
use crate::ir::DType;
use crate::platform::host::kernels::{eval_graph, HostTensor};

fn t(dtype: DType, dims: &[u64], v: &[f64]) -> HostTensor {
    HostTensor::from_f64(dtype, dims, v).unwrap()
}
fn f32s(dims: &[u64], v: &[f64]) -> HostTensor {
    t(DType::F32, dims, v)
}
fn f64s(dims: &[u64], v: &[f64]) -> HostTensor {
    t(DType::F64, dims, v)
}
fn i64s(dims: &[u64], v: &[i64]) -> HostTensor {
    HostTensor::from_slice(DType::I64, dims, v).unwrap()
}
fn scalar_i64(v: i64) -> HostTensor {
    i64s(&[], &[v])
}

fn run(op: &str, inputs: &[&HostTensor], attrs: &Attrs) -> Result<Vec<HostTensor>> {
    let id = lookup(op)?;
    let types: Vec<TensorType> = inputs.iter().map(|x| x.ty.clone()).collect();
    let g = build_graph(id, &types, attrs)?;
    let owned: Vec<HostTensor> = inputs.iter().map(|x| (*x).clone()).collect();
    eval_graph(&g, &owned)
}
fn runv(op: &str, inputs: &[&HostTensor], attrs: &Attrs) -> Vec<HostTensor> {
    run(op, inputs, attrs).unwrap_or_else(|e| panic!("{op}: {e}"))
}
fn run1(op: &str, inputs: &[&HostTensor], attrs: &Attrs) -> HostTensor {
    runv(op, inputs, attrs).remove(0)
}
fn err(op: &str, inputs: &[&HostTensor], attrs: &Attrs) -> String {
    match run(op, inputs, attrs) {
        Ok(v) => panic!("{op}: expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

fn close(got: &HostTensor, want: &[f64], tol: f64) {
    close_vec(&got.to_f64_vec(), want, tol)
}
fn close_vec(g: &[f64], want: &[f64], tol: f64) {
    assert_eq!(g.len(), want.len(), "lengths: {g:?} vs {want:?}");
    for (i, (a, b)) in g.iter().zip(want).enumerate() {
        let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= tol * (1.0 + b.abs());
        assert!(ok, "element {i}: got {a}, want {b} (all: {g:?})");
    }
}

fn at(pairs: &[(&str, Attr)]) -> Attrs {
    let mut a = Attrs::new();
    for (k, v) in pairs {
        a.set(k, v.clone());
    }
    a
}
fn int(v: i64) -> Attr {
    Attr::Int(v)
}
fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}
fn float(v: f64) -> Attr {
    Attr::Float(v)
}
fn flag(v: bool) -> Attr {
    Attr::Bool(v)
}
fn s(v: &str) -> Attr {
    Attr::Str(v.into())
}

/// Deterministic test data in [-1, 1).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// d/d inputs[wrt] of sum(op(inputs)[out] * cot), by central differences.
fn numeric_grad(
    op: &str,
    inputs: &[HostTensor],
    a: &Attrs,
    out: usize,
    cot: &[f64],
    wrt: usize,
) -> Vec<f64> {
    let types: Vec<TensorType> = inputs.iter().map(|x| x.ty.clone()).collect();
    let g = build_graph(lookup(op).unwrap(), &types, a).unwrap();
    let base = inputs[wrt].to_f64_vec();
    let h = 1e-6;
    let eval = |v: &[f64]| -> f64 {
        let mut ins = inputs.to_vec();
        ins[wrt] = t(inputs[wrt].dtype(), inputs[wrt].dims(), v);
        let o = eval_graph(&g, &ins).unwrap().remove(out).to_f64_vec();
        assert_eq!(o.len(), cot.len(), "cotangent length");
        o.iter().zip(cot).map(|(x, c)| x * c).sum()
    };
    (0..base.len())
        .map(|i| {
            let mut up = base.clone();
            up[i] += h;
            let mut down = base.clone();
            down[i] -= h;
            (eval(&up) - eval(&down)) / (2.0 * h)
        })
        .collect()
}

// ---------------------------------------------------------------- random

#[test]
fn randperm_draws_uniform_permutations() {
    let perm = |n: i64, seed: i64, offset: i64| -> Vec<usize> {
        run1(
            "randperm",
            &[&scalar_i64(seed), &scalar_i64(offset)],
            &at(&[("n", int(n))]),
        )
        .to_f64_vec()
        .iter()
        .map(|&v| v as usize)
        .collect()
    };
    // Permutations of 0..n; the same key gives the same one.
    for n in [0, 1, 2, 7, 1000] {
        let mut p = perm(n, 3, 11);
        assert_eq!(p, perm(n, 3, 11));
        p.sort_unstable();
        assert_eq!(p, (0..n as usize).collect::<Vec<_>>());
    }
    assert_ne!(perm(50, 3, 0), perm(50, 3, 100));
    assert_ne!(perm(50, 3, 0), perm(50, 4, 0));
    // All 24 orders of 4 about equally often: 4800 draws at consecutive
    // offsets (2n apart, as a frontend advances them), 200 expected each;
    // a chi-square with 23 degrees of freedom is below 60 with
    // probability 1 - 5e-5.
    let mut counts = std::collections::HashMap::new();
    for k in 0..4800 {
        *counts.entry(perm(4, 9, 8 * k)).or_insert(0u32) += 1;
    }
    assert_eq!(counts.len(), 24);
    let chi2: f64 = counts
        .values()
        .map(|&c| (f64::from(c) - 200.0).powi(2) / 200.0)
        .sum();
    assert!(chi2 < 60.0, "chi-square {chi2}: {counts:?}");
    // dtype: int32 and float results; a bool one or an n past the dtype
    // is refused.
    let r = run1(
        "randperm",
        &[],
        &at(&[
            ("n", int(5)),
            ("seed", int(1)),
            ("dtype", Attr::DType(DType::I32)),
        ]),
    );
    assert_eq!(r.ty.dtype, DType::I32);
    let e = err(
        "randperm",
        &[],
        &at(&[
            ("n", int(300)),
            ("seed", int(1)),
            ("dtype", Attr::DType(DType::U8)),
        ]),
    );
    assert!(e.contains("randperm: n = 300 does not fit dtype"), "{e}");
    let e = err("randperm", &[], &at(&[("n", int(-1)), ("seed", int(1))]));
    assert!(e.contains("n must be non-negative, got -1"), "{e}");
}

#[test]
fn uniform_and_normal_reproduce_the_generator() {
    // Known values of the Philox definition (platform/host/kernels/rng.rs).
    let a = at(&[("size", ints(&[3])), ("seed", int(42)), ("offset", int(7))]);
    let u = run1("uniform", &[], &a);
    assert_eq!(
        u.to_f64_vec(),
        [0.8506280779838562, 0.8510293960571289, 0.43557101488113403]
    );
    let n = run1(
        "normal",
        &[],
        &a.clone().with("dtype", Attr::DType(DType::F64)),
    );
    close(
        &n,
        &[1.2079763596247322, 0.9107377447826178, -0.31922567631441223],
        1e-15,
    );
    // Seed and offset as inputs give the same numbers as attributes.
    let by_input = run1(
        "uniform",
        &[&scalar_i64(42), &scalar_i64(7)],
        &at(&[("size", ints(&[3]))]),
    );
    assert_eq!(by_input, u);
    // Element i uses counter offset + i.
    let long = run1(
        "uniform",
        &[],
        &at(&[("size", ints(&[10])), ("seed", int(5)), ("offset", int(0))]),
    );
    let tail = run1(
        "uniform",
        &[],
        &at(&[("size", ints(&[7])), ("seed", int(5)), ("offset", int(3))]),
    );
    assert_eq!(long.to_f64_vec()[3..], tail.to_f64_vec()[..]);
    // Seeds use all 64 bits (not rounded through f64).
    let big = (1i64 << 60) + 1;
    let s1 = run1(
        "uniform",
        &[],
        &at(&[("size", ints(&[4])), ("seed", int(big))]),
    );
    let s2 = run1(
        "uniform",
        &[&scalar_i64(big), &scalar_i64(0)],
        &at(&[("size", ints(&[4]))]),
    );
    let s3 = run1(
        "uniform",
        &[],
        &at(&[("size", ints(&[4])), ("seed", int(1i64 << 60))]),
    );
    assert_eq!(s1, s2);
    assert_ne!(s1, s3);
}

#[test]
fn uniform_and_normal_ranges_moments_and_dtypes() {
    let n = 20_000;
    for dt in [DType::F32, DType::BF16, DType::F16] {
        let u = run1(
            "uniform",
            &[],
            &at(&[
                ("size", ints(&[n])),
                ("low", float(-2.0)),
                ("high", float(3.0)),
                ("dtype", Attr::DType(dt)),
                ("seed", int(11)),
            ]),
        );
        assert_eq!(u.ty, TensorType::new(dt, &[n as u64]));
        let v = u.to_f64_vec();
        assert!(v.iter().all(|&x| (-2.0..3.0).contains(&x)), "{dt}");
        let mean = v.iter().sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.05, "{dt}: {mean}");
        let z = run1(
            "normal",
            &[],
            &at(&[
                ("size", ints(&[n])),
                ("mean", float(1.0)),
                ("std", float(2.0)),
                ("dtype", Attr::DType(dt)),
                ("seed", int(3)),
                ("offset", int(100)),
            ]),
        )
        .to_f64_vec();
        let m = z.iter().sum::<f64>() / n as f64;
        let var = z.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n as f64;
        assert!(
            (m - 1.0).abs() < 0.06 && (var - 4.0).abs() < 0.2,
            "{dt}: {m} {var}"
        );
    }
    let e = err("uniform", &[], &at(&[("size", ints(&[2]))]));
    assert!(e.contains("uniform") && e.contains("seed"), "{e}");
    let e = err(
        "uniform",
        &[],
        &at(&[("size", ints(&[2])), ("seed", int(0)), ("low", float(2.0))]),
    );
    assert!(e.contains("low <= high"), "{e}");
    let e = err(
        "normal",
        &[],
        &at(&[
            ("size", ints(&[2])),
            ("seed", int(0)),
            ("dtype", Attr::DType(DType::I64)),
        ]),
    );
    assert!(e.contains("floating-point"), "{e}");
    let z = run1(
        "normal",
        &[],
        &at(&[("size", ints(&[0, 3])), ("seed", int(1))]),
    );
    assert_eq!(z.ty.dims, vec![0, 3]);
}

#[test]
fn bernoulli_draws_below_p() {
    let n = 4000usize;
    let mut p = vec![0.3; n];
    p[0] = 0.0;
    p[1] = 1.0;
    let pt = t(DType::BF16, &[n as u64], &p);
    let a = at(&[("seed", int(9)), ("offset", int(4))]);
    let b = run1("bernoulli", &[&pt], &a);
    assert_eq!(b.ty.dtype, DType::BF16);
    let v = b.to_f64_vec();
    assert_eq!((v[0], v[1]), (0.0, 1.0));
    assert!(v.iter().all(|&x| x == 0.0 || x == 1.0));
    let frac = v[2..].iter().sum::<f64>() / (n - 2) as f64;
    assert!((frac - 0.3).abs() < 0.04, "{frac}");
    // The same draws as uniform at the same (seed, offset).
    let u = run1("uniform", &[], &a.clone().with("size", ints(&[n as i64]))).to_f64_vec();
    let p32 = pt.to_f64_vec();
    for i in 0..n {
        assert_eq!(v[i], (u[i] < p32[i]) as u8 as f64, "element {i}");
    }
    // A p attribute with an input giving shape and dtype.
    let x = f32s(&[3], &[5.0, 6.0, 7.0]);
    let ones = run1("bernoulli", &[&x], &a.clone().with("p", float(1.0)));
    close(&ones, &[1.0, 1.0, 1.0], 0.0);
    let e = err("bernoulli", &[&i64s(&[1], &[1])], &a);
    assert!(e.contains("floating-point"), "{e}");
}

#[test]
fn dropout_keeps_scales_and_reproduces() {
    let n = 5000usize;
    let mut r = Lcg(1);
    let xv = r.vec(n);
    let x = f32s(&[50, 100], &xv);
    let a = at(&[("p", float(0.25)), ("seed", int(77)), ("offset", int(1000))]);
    let out = runv("dropout", &[&x], &a);
    assert_eq!(out[1].ty, TensorType::new(DType::Bool, &[50, 100]));
    let u = run1("uniform", &[], &a.clone().with("size", ints(&[50, 100]))).to_f64_vec();
    let (y, m) = (out[0].to_f64_vec(), out[1].to_f64_vec());
    let mut kept = 0;
    for i in 0..n {
        let keep = u[i] < 0.75;
        assert_eq!(m[i], keep as u8 as f64, "mask {i}");
        let want = if keep {
            xv[i] as f32 as f64 / 0.75
        } else {
            0.0
        };
        assert!((y[i] - want).abs() <= 1e-6 * (1.0 + want.abs()), "{i}");
        kept += keep as usize;
    }
    let frac = kept as f64 / n as f64;
    assert!((frac - 0.75).abs() < 0.03, "{frac}");
    // Same seed and offset, same mask; inputs instead of attributes too.
    let again = runv(
        "dropout",
        &[&x, &scalar_i64(77), &scalar_i64(1000)],
        &at(&[("p", float(0.25))]),
    );
    assert_eq!(again, out);
    // Identity in eval mode and for p = 0; zeros for p = 1.
    for a in [
        at(&[("p", float(0.5)), ("train", flag(false))]),
        at(&[("p", float(0.0))]),
    ] {
        let o = runv("dropout", &[&x], &a);
        assert_eq!(o[0], x);
        assert!(o[1].to_f64_vec().iter().all(|&b| b == 1.0));
    }
    let o = runv("dropout", &[&x], &at(&[("p", float(1.0))]));
    assert!(o[0].to_f64_vec().iter().all(|&v| v == 0.0));
    assert!(o[1].to_f64_vec().iter().all(|&b| b == 0.0));
    // bf16 keeps its dtype.
    let h = t(DType::BF16, &[4], &[1.0, 2.0, 3.0, 4.0]);
    let o = runv(
        "dropout",
        &[&h],
        &at(&[("p", float(0.5)), ("seed", int(0))]),
    );
    assert_eq!(o[0].ty.dtype, DType::BF16);
    for (y, (m, x)) in o[0]
        .to_f64_vec()
        .iter()
        .zip(o[1].to_f64_vec().iter().zip([1.0, 2.0, 3.0, 4.0]))
    {
        assert_eq!(*y, m * x * 2.0);
    }
    let e = err(
        "dropout",
        &[&x],
        &at(&[("p", float(1.5)), ("seed", int(0))]),
    );
    assert!(
        e.contains("dropout") && e.contains("between 0 and 1"),
        "{e}"
    );
    let e = err("dropout", &[&x], &at(&[("p", float(0.5))]));
    assert!(e.contains("seed"), "{e}");
}

#[test]
fn rrelu_draws_slopes_for_the_negative_elements() {
    let n = 4000usize;
    let mut r = Lcg(2);
    let xv = r.vec(n);
    let x = f64s(&[40, 100], &xv);
    let a = at(&[
        ("lower", float(0.1)),
        ("upper", float(0.3)),
        ("seed", int(5)),
        ("offset", int(64)),
    ]);
    let out = runv("rrelu_with_noise", &[&x], &a);
    // The slopes are the uniform draws at the same seed and offset, scaled.
    let u = run1(
        "uniform",
        &[],
        &a.clone()
            .with("size", ints(&[40, 100]))
            .with("dtype", Attr::DType(DType::F64)),
    )
    .to_f64_vec();
    let (y, noise) = (out[0].to_f64_vec(), out[1].to_f64_vec());
    let mut slopes = Vec::new();
    for i in 0..n {
        if xv[i] <= 0.0 {
            let want = 0.1 + 0.2 * u[i];
            assert!(
                (noise[i] - want).abs() < 1e-12,
                "{i}: {} vs {want}",
                noise[i]
            );
            slopes.push(noise[i]);
        } else {
            assert_eq!(noise[i], 1.0, "{i}");
        }
        assert!((y[i] - xv[i] * noise[i]).abs() < 1e-15, "{i}");
    }
    let mean = slopes.iter().sum::<f64>() / slopes.len() as f64;
    assert!((mean - 0.2).abs() < 0.01, "{mean}");
    // Seed and offset as inputs give the same; bf16 keeps its dtype.
    let again = runv(
        "rrelu_with_noise",
        &[&x, &scalar_i64(5), &scalar_i64(64)],
        &at(&[("lower", float(0.1)), ("upper", float(0.3))]),
    );
    assert_eq!(again, out);
    let h = t(DType::BF16, &[3], &[-1.0, 0.0, 2.0]);
    let o = runv("rrelu_with_noise", &[&h], &at(&[("seed", int(1))]));
    assert_eq!((o[0].dtype(), o[1].dtype()), (DType::BF16, DType::BF16));
    assert_eq!(o[0].to_f64_vec()[2], 2.0);
    let e = err(
        "rrelu_with_noise",
        &[&x],
        &at(&[
            ("lower", float(0.5)),
            ("upper", float(0.2)),
            ("seed", int(0)),
        ]),
    );
    assert!(e.contains("Lower bound"), "{e}");
}

// ---------------------------------------------------------------- losses

/// nll of f64 log-probs [n, c, inner] (inner = product of trailing dims).
fn nll_ref(
    x: &[f64],
    n: usize,
    c: usize,
    inner: usize,
    target: &[i64],
    weight: Option<&[f64]>,
    ignore: i64,
) -> (Vec<f64>, f64) {
    let mut losses = Vec::new();
    let mut tw = 0.0;
    for i in 0..n {
        for k in 0..inner {
            let tgt = target[i * inner + k];
            if tgt == ignore {
                losses.push(0.0);
                continue;
            }
            let w = weight.map_or(1.0, |w| w[tgt as usize]);
            losses.push(-w * x[(i * c + tgt as usize) * inner + k]);
            tw += w;
        }
    }
    (losses, tw)
}

#[test]
fn nll_loss_reductions_weights_and_ignore_index() {
    let mut r = Lcg(2);
    let xv = r.vec(12);
    let x = f32s(&[4, 3], &xv);
    let tv = [2i64, -100, 0, 1];
    let target = i64s(&[4], &tv);
    let wv = [0.5, 2.0, 1.5];
    let w = f32s(&[3], &wv);
    let (losses, tw) = nll_ref(&xv, 4, 3, 1, &tv, Some(&wv), -100);
    let sum: f64 = losses.iter().sum();
    let none = runv(
        "nll_loss",
        &[&x, &target, &w],
        &at(&[("reduction", s("none"))]),
    );
    close(&none[0], &losses, 1e-6);
    close(&none[1], &[0.0], 0.0);
    let sum_out = runv(
        "nll_loss",
        &[&x, &target, &w],
        &at(&[("reduction", int(2))]),
    );
    close(&sum_out[0], &[sum], 1e-6);
    close(&sum_out[1], &[tw], 1e-6);
    let mean = runv("nll_loss", &[&x, &target, &w], &Attrs::new());
    close(&mean[0], &[sum / tw], 1e-6);
    close(&mean[1], &[tw], 1e-6);
    // K-dimensional: [N, C, d1, d2] with target [N, d1, d2].
    let xv = r.vec(2 * 3 * 2 * 2);
    let x4 = f32s(&[2, 3, 2, 2], &xv);
    let tv = [0i64, 2, 1, 1, 2, 0, 1, -100];
    let t4 = i64s(&[2, 2, 2], &tv);
    let (losses, tw) = nll_ref(&xv, 2, 3, 4, &tv, None, -100);
    let none = run1("nll_loss", &[&x4, &t4], &at(&[("reduction", s("none"))]));
    assert_eq!(none.ty.dims, vec![2, 2, 2]);
    close(&none, &losses, 1e-6);
    let mean = run1("nll_loss", &[&x4, &t4], &Attrs::new());
    close(&mean, &[losses.iter().sum::<f64>() / tw], 1e-6);
    // Unbatched [C] input with a scalar target; a non-default ignore_index.
    let x1 = f32s(&[3], &[-0.5, -1.5, -2.5]);
    close(
        &run1("nll_loss", &[&x1, &i64s(&[], &[1])], &Attrs::new()),
        &[1.5],
        1e-7,
    );
    let all_ignored = runv(
        "nll_loss",
        &[&x1, &i64s(&[], &[1])],
        &at(&[("ignore_index", int(1))]),
    );
    assert!(all_ignored[0].get_f64(0).is_nan());
    close(&all_ignored[1], &[0.0], 0.0);
    // Half input: computed in f32, rounded once.
    let xh = t(DType::BF16, &[4, 3], &[-1.0; 12]);
    let o = run1("nll_loss", &[&xh, &target], &Attrs::new());
    assert_eq!(o.ty, TensorType::new(DType::BF16, &[]));
    close(&o, &[1.0], 0.0);
    // Errors.
    let e = err("nll_loss", &[&x, &i64s(&[3], &[0, 1, 2])], &Attrs::new());
    assert!(
        e.contains("nll_loss") && e.contains("expected target size [4]"),
        "{e}"
    );
    let e = err("nll_loss", &[&x, &f32s(&[4], &[0.0; 4])], &Attrs::new());
    assert!(e.contains("class indices"), "{e}");
    let e = err(
        "nll_loss",
        &[&x, &target, &f32s(&[2], &[1.0; 2])],
        &Attrs::new(),
    );
    assert!(e.contains("weight tensor should be defined"), "{e}");
    let e = err("nll_loss", &[&x, &target], &at(&[("reduction", s("avg"))]));
    assert!(e.contains("reduction \"avg\""), "{e}");
    // A target out of range (and not ignored) fails when the graph runs.
    let e = err("nll_loss", &[&x, &i64s(&[4], &[0, 1, 2, 3])], &Attrs::new());
    assert!(e.contains("out of range"), "{e}");
}

#[test]
fn nll_loss_backward_matches_numerical_gradient() {
    let mut r = Lcg(3);
    let x = f64s(&[3, 4, 2], &r.vec(24));
    let target = i64s(&[3, 2], &[1, 3, -100, 0, 2, 2]);
    let w = f64s(&[4], &[0.5, 1.0, 2.0, 3.0]);
    for (red, gshape) in [("mean", vec![]), ("sum", vec![]), ("none", vec![3, 2])] {
        let a = at(&[("reduction", s(red))]);
        let fwd = runv("nll_loss", &[&x, &target, &w], &a);
        let n: u64 = gshape.iter().product();
        let gv = r.vec(n as usize);
        let g = f64s(&gshape, &gv);
        let got = run1("nll_loss_backward", &[&g, &x, &target, &w, &fwd[1]], &a);
        let want = numeric_grad(
            "nll_loss",
            &[x.clone(), target.clone(), w.clone()],
            &a,
            0,
            &gv,
            0,
        );
        close(&got, &want, 1e-6);
        // Without weight (4 inputs).
        let fwd = runv("nll_loss", &[&x, &target], &a);
        let got = run1("nll_loss_backward", &[&g, &x, &target, &fwd[1]], &a);
        let want = numeric_grad("nll_loss", &[x.clone(), target.clone()], &a, 0, &gv, 0);
        close(&got, &want, 1e-6);
    }
    // One sample without a batch dimension: input [C], target [].
    let x1 = f64s(&[4], &r.vec(4));
    let t1 = i64s(&[], &[2]);
    for red in ["mean", "sum", "none"] {
        let a = at(&[("reduction", s(red))]);
        let fwd = runv("nll_loss", &[&x1, &t1, &w], &a);
        let gv = r.vec(1);
        let got = run1(
            "nll_loss_backward",
            &[&f64s(&[], &gv), &x1, &t1, &w, &fwd[1]],
            &a,
        );
        let want = numeric_grad(
            "nll_loss",
            &[x1.clone(), t1.clone(), w.clone()],
            &a,
            0,
            &gv,
            0,
        );
        close(&got, &want, 1e-6);
    }
    let e = err(
        "nll_loss_backward",
        &[&f64s(&[3], &[1.0; 3]), &x, &target, &f64s(&[], &[1.0])],
        &Attrs::new(),
    );
    assert!(e.contains("grad_output must have shape []"), "{e}");
    // A target out of range (and not ignored) fails, with a class weight
    // and without (the backward's one-hot needs its own check).
    let bad = i64s(&[3, 2], &[1, 3, -100, 4, 2, 2]);
    let tw = f64s(&[], &[5.0]);
    for ins in [vec![&tw, &x, &bad, &w, &tw], vec![&tw, &x, &bad, &tw]] {
        let e = err("nll_loss_backward", &ins, &Attrs::new());
        assert!(e.contains("out of range"), "{e}");
    }
}

/// Past 2^24 classes, f32 no longer tells neighbouring class positions
/// apart: the gradient's one-hot still lands on the target class alone.
#[test]
fn nll_loss_backward_past_f32_exact_class_positions() {
    let classes = (1u64 << 24) + 2;
    let x = HostTensor::zeros(TensorType::new(DType::F32, &[1, classes]));
    let target = (1i64 << 24) + 1;
    let got = run1(
        "nll_loss_backward",
        &[
            &t(DType::F32, &[], &[1.0]),
            &x,
            &i64s(&[1], &[target]),
            &t(DType::F32, &[], &[1.0]),
        ],
        &Attrs::new(),
    );
    let g = got.as_slice::<f32>();
    let hits: Vec<usize> = (0..g.len()).filter(|&i| g[i] != 0.0).collect();
    assert_eq!(hits, vec![target as usize]);
    assert_eq!(g[target as usize], -1.0);
}

fn log_softmax_rows(x: &[f64], n: usize, c: usize, inner: usize) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for i in 0..n {
        for k in 0..inner {
            let at = |j: usize| (i * c + j) * inner + k;
            let m = (0..c).map(|j| x[at(j)]).fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = (0..c).map(|j| (x[at(j)] - m).exp()).sum();
            for j in 0..c {
                out[at(j)] = x[at(j)] - m - s.ln();
            }
        }
    }
    out
}

#[test]
fn cross_entropy_with_label_smoothing_weights_and_probabilities() {
    let mut r = Lcg(4);
    let (n, c, inner) = (3usize, 4usize, 2usize);
    let xv: Vec<f64> = r.vec(n * c * inner).iter().map(|v| v * 3.0).collect();
    let x = f32s(&[3, 4, 2], &xv);
    let tv = [1i64, 3, -100, 0, 2, 2];
    let target = i64s(&[3, 2], &tv);
    let wv = [0.5, 1.0, 2.0, 3.0];
    let w = f32s(&[4], &wv);
    let lp = log_softmax_rows(&xv, n, c, inner);
    let ls = 0.2;
    for weighted in [false, true] {
        let wref = weighted.then_some(&wv[..]);
        let (nll, tw) = nll_ref(&lp, n, c, inner, &tv, wref, -100);
        // smooth_i = -sum_c w_c lp_ic, 0 when ignored.
        let smooth: Vec<f64> = (0..n * inner)
            .map(|ik| {
                let (i, k) = (ik / inner, ik % inner);
                if tv[ik] == -100 {
                    return 0.0;
                }
                -(0..c)
                    .map(|j| wref.map_or(1.0, |w| w[j]) * lp[(i * c + j) * inner + k])
                    .sum::<f64>()
            })
            .collect();
        let mix = |a: f64, b: f64| (1.0 - ls) * a + ls / c as f64 * b;
        let none: Vec<f64> = nll.iter().zip(&smooth).map(|(&a, &b)| mix(a, b)).collect();
        let sum = mix(nll.iter().sum(), smooth.iter().sum());
        let mean = mix(
            nll.iter().sum::<f64>() / tw,
            smooth.iter().sum::<f64>() / tw,
        );
        let mut inputs = vec![&x, &target];
        if weighted {
            inputs.push(&w);
        }
        for (red, want) in [("none", none), ("sum", vec![sum]), ("mean", vec![mean])] {
            let a = at(&[("reduction", s(red)), ("label_smoothing", float(ls))]);
            close(&run1("cross_entropy", &inputs, &a), &want, 1e-5);
        }
        // Without smoothing it is nll of log_softmax.
        let plain = run1("cross_entropy", &inputs, &Attrs::new());
        close(&plain, &[nll.iter().sum::<f64>() / tw], 1e-5);
    }
    // Class probabilities as the target (same shape as the logits).
    let probs: Vec<f64> = r.vec(n * c * inner).iter().map(|v| v.abs()).collect();
    let pt = f32s(&[3, 4, 2], &probs);
    let a = at(&[("label_smoothing", float(0.1))]);
    let mut total = 0.0;
    for (i, p) in probs.iter().enumerate() {
        let p = p * 0.9 + 0.1 / c as f64;
        total -= wv[(i / inner) % c] * p * lp[i];
    }
    close(
        &run1("cross_entropy", &[&x, &pt, &w], &a),
        &[total / (n * inner) as f64],
        1e-5,
    );
    // bf16 logits: f32 inside, one rounding.
    let xh = t(DType::BF16, &[3, 4, 2], &xv);
    let xr = xh.to_f64_vec();
    let lph = log_softmax_rows(&xr, n, c, inner);
    let (nll, tw) = nll_ref(&lph, n, c, inner, &tv, None, -100);
    let o = run1("cross_entropy", &[&xh, &target], &Attrs::new());
    assert_eq!(o.ty.dtype, DType::BF16);
    close(&o, &[nll.iter().sum::<f64>() / tw], 8e-3);
    let e = err(
        "cross_entropy",
        &[&x, &target],
        &at(&[("label_smoothing", float(1.5))]),
    );
    assert!(e.contains("label_smoothing must be between"), "{e}");
}

#[test]
fn mse_loss_and_backward() {
    let mut r = Lcg(5);
    let xv = r.vec(6);
    let yv = r.vec(3);
    let x = f64s(&[2, 3], &xv);
    let y = f64s(&[3], &yv);
    let sq: Vec<f64> = (0..6).map(|i| (xv[i] - yv[i % 3]).powi(2)).collect();
    close(
        &run1("mse_loss", &[&x, &y], &at(&[("reduction", s("none"))])),
        &sq,
        1e-12,
    );
    close(
        &run1("mse_loss", &[&x, &y], &Attrs::new()),
        &[sq.iter().sum::<f64>() / 6.0],
        1e-12,
    );
    close(
        &run1("mse_loss", &[&x, &y], &at(&[("reduction", s("sum"))])),
        &[sq.iter().sum::<f64>()],
        1e-12,
    );
    for (red, gshape) in [("mean", vec![]), ("sum", vec![]), ("none", vec![2u64, 3])] {
        let a = at(&[("reduction", s(red))]);
        let gv = r.vec(gshape.iter().product::<u64>() as usize);
        let g = f64s(&gshape, &gv);
        let got = run1("mse_loss_backward", &[&g, &x, &y], &a);
        let want = numeric_grad("mse_loss", &[x.clone(), y.clone()], &a, 0, &gv, 0);
        close(&got, &want, 1e-6);
    }
    let h = t(DType::F16, &[2], &[1.0, 3.0]);
    let o = run1(
        "mse_loss",
        &[&h, &t(DType::F16, &[2], &[0.0, 0.0])],
        &Attrs::new(),
    );
    assert_eq!(o.ty.dtype, DType::F16);
    close(&o, &[5.0], 0.0);
}

// ---------------------------------------------------------------- attention

struct AttnCase {
    b: usize,
    hq: usize,
    hk: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
}

/// f64 attention: (out [b, hq, l, ev], lse [b, hq, l]); `mask(bi, h, i, j)`
/// is None where masked out, else an additive bias; `keep(bi, h, i, j)` the
/// dropout factor.
fn attention_ref(
    c: &AttnCase,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    scale: f64,
    mask: &dyn Fn(usize, usize, usize, usize) -> Option<f64>,
    keep: &dyn Fn(usize, usize, usize, usize) -> f64,
) -> (Vec<f64>, Vec<f64>) {
    let g = c.hq / c.hk;
    let mut out = vec![0.0; c.b * c.hq * c.l * c.ev];
    let mut lse = vec![0.0; c.b * c.hq * c.l];
    for bi in 0..c.b {
        for h in 0..c.hq {
            let kh = h / g;
            for i in 0..c.l {
                let scores: Vec<Option<f64>> = (0..c.s)
                    .map(|j| {
                        mask(bi, h, i, j).map(|bias| {
                            let dot: f64 = (0..c.e)
                                .map(|d| {
                                    q[((bi * c.hq + h) * c.l + i) * c.e + d]
                                        * k[((bi * c.hk + kh) * c.s + j) * c.e + d]
                                })
                                .sum();
                            dot * scale + bias
                        })
                    })
                    .collect();
                let m = scores
                    .iter()
                    .flatten()
                    .cloned()
                    .fold(f64::NEG_INFINITY, f64::max);
                let row = (bi * c.hq + h) * c.l + i;
                if m == f64::NEG_INFINITY {
                    lse[row] = f64::NEG_INFINITY;
                    continue;
                }
                let z: f64 = scores.iter().flatten().map(|s| (s - m).exp()).sum();
                lse[row] = m + z.ln();
                for j in 0..c.s {
                    if let Some(sc) = scores[j] {
                        let p = (sc - m).exp() / z * keep(bi, h, i, j);
                        for d in 0..c.ev {
                            out[row * c.ev + d] += p * v[((bi * c.hk + kh) * c.s + j) * c.ev + d];
                        }
                    }
                }
            }
        }
    }
    (out, lse)
}

#[test]
fn attention_matches_reference_with_masks_causal_and_gqa() {
    let c = AttnCase {
        b: 2,
        hq: 4,
        hk: 2,
        l: 3,
        s: 5,
        e: 4,
        ev: 3,
    };
    let mut r = Lcg(6);
    let qv = r.vec(c.b * c.hq * c.l * c.e);
    let kv = r.vec(c.b * c.hk * c.s * c.e);
    let vv = r.vec(c.b * c.hk * c.s * c.ev);
    let q = f32s(&[2, 4, 3, 4], &qv);
    let k = f32s(&[2, 2, 5, 4], &kv);
    let v = f32s(&[2, 2, 5, 3], &vv);
    let gqa = at(&[("enable_gqa", flag(true))]);
    let scale = 0.5;
    let no_drop = |_: usize, _: usize, _: usize, _: usize| 1.0;
    // Plain, default scale.
    let o = runv("scaled_dot_product_attention", &[&q, &k, &v], &gqa);
    let (want, lse) = attention_ref(&c, &qv, &kv, &vv, 0.5, &|_, _, _, _| Some(0.0), &no_drop);
    assert_eq!(o[0].ty, TensorType::new(DType::F32, &[2, 4, 3, 3]));
    assert_eq!(o[1].ty, TensorType::new(DType::F32, &[2, 4, 3]));
    close(&o[0], &want, 1e-5);
    close(&o[1], &lse, 1e-5);
    // Causal with an explicit scale.
    let o = runv(
        "scaled_dot_product_attention",
        &[&q, &k, &v],
        &gqa.clone()
            .with("is_causal", flag(true))
            .with("scale", float(scale)),
    );
    let (want, lse) = attention_ref(
        &c,
        &qv,
        &kv,
        &vv,
        scale,
        &|_, _, i, j| (j <= i).then_some(0.0),
        &no_drop,
    );
    close(&o[0], &want, 1e-5);
    close(&o[1], &lse, 1e-5);
    // Bool mask [b, 1, l, s] broadcast over heads; row (b=1, i=2) fully masked.
    let allowed =
        |bi: usize, i: usize, j: usize| !((bi == 1 && i == 2) || (i + j + bi).is_multiple_of(3));
    let mut mv = Vec::new();
    for bi in 0..2 {
        for i in 0..3 {
            for j in 0..5 {
                mv.push(allowed(bi, i, j) as u8 as f64);
            }
        }
    }
    let mask = t(DType::Bool, &[2, 1, 3, 5], &mv);
    let o = runv("scaled_dot_product_attention", &[&q, &k, &v, &mask], &gqa);
    let (want, lse) = attention_ref(
        &c,
        &qv,
        &kv,
        &vv,
        0.5,
        &|bi, _, i, j| allowed(bi, i, j).then_some(0.0),
        &no_drop,
    );
    close(&o[0], &want, 1e-5);
    close(&o[1], &lse, 1e-5);
    assert!(want[(4 + 1) * 3 * 3 + 6..][..3].iter().all(|&x| x == 0.0));
    // Additive float mask [l, s].
    let bias = r.vec(15);
    let fm = f32s(&[3, 5], &bias);
    let o = runv("scaled_dot_product_attention", &[&q, &k, &v, &fm], &gqa);
    let (want, lse) = attention_ref(
        &c,
        &qv,
        &kv,
        &vv,
        0.5,
        &|_, _, i, j| Some(bias[i * 5 + j] as f32 as f64),
        &no_drop,
    );
    close(&o[0], &want, 1e-5);
    close(&o[1], &lse, 1e-5);
    // bf16: f32 inside, output bf16, logsumexp f32.
    let (qh, kh, vh) = (
        t(DType::BF16, &[2, 4, 3, 4], &qv),
        t(DType::BF16, &[2, 2, 5, 4], &kv),
        t(DType::BF16, &[2, 2, 5, 3], &vv),
    );
    let o = runv("scaled_dot_product_attention", &[&qh, &kh, &vh], &gqa);
    assert_eq!(o[0].ty.dtype, DType::BF16);
    assert_eq!(o[1].ty.dtype, DType::F32);
    let (want, lse) = attention_ref(
        &c,
        &qh.to_f64_vec(),
        &kh.to_f64_vec(),
        &vh.to_f64_vec(),
        0.5,
        &|_, _, _, _| Some(0.0),
        &no_drop,
    );
    close(&o[0], &want, 8e-3);
    close(&o[1], &lse, 1e-5);
    // Errors: no GQA flag, heads that do not divide, causal with a mask.
    let e = err("scaled_dot_product_attention", &[&q, &k, &v], &Attrs::new());
    assert!(e.contains("enable_gqa"), "{e}");
    let k3 = f32s(&[2, 3, 5, 4], &r.vec(120));
    let v3 = f32s(&[2, 3, 5, 3], &r.vec(90));
    let e = err("scaled_dot_product_attention", &[&q, &k3, &v3], &gqa);
    assert!(e.contains("multiple"), "{e}");
    let e = err(
        "scaled_dot_product_attention",
        &[&q, &k, &v, &mask],
        &gqa.clone().with("is_causal", flag(true)),
    );
    assert!(e.contains("is_causal"), "{e}");
}

#[test]
fn attention_dropout_uses_the_documented_mask() {
    let c = AttnCase {
        b: 1,
        hq: 2,
        hk: 2,
        l: 4,
        s: 6,
        e: 3,
        ev: 2,
    };
    let mut r = Lcg(7);
    let qv = r.vec(24);
    let kv = r.vec(36);
    let vv = r.vec(24);
    let (q, k, v) = (
        f64s(&[1, 2, 4, 3], &qv),
        f64s(&[1, 2, 6, 3], &kv),
        f64s(&[1, 2, 6, 2], &vv),
    );
    let p = 0.4;
    let a = at(&[
        ("dropout_p", float(p)),
        ("seed", int(123)),
        ("offset", int(8)),
    ]);
    let o = runv("scaled_dot_product_attention", &[&q, &k, &v], &a);
    let u = run1(
        "uniform",
        &[],
        &a.clone()
            .with("size", ints(&[1, 2, 4, 6]))
            .with("dtype", Attr::DType(DType::F64)),
    )
    .to_f64_vec();
    let keep = |_: usize, h: usize, i: usize, j: usize| {
        if u[(h * 4 + i) * 6 + j] < 1.0 - p {
            1.0 / (1.0 - p)
        } else {
            0.0
        }
    };
    let scale = 1.0 / 3f64.sqrt();
    let (want, lse) = attention_ref(&c, &qv, &kv, &vv, scale, &|_, _, _, _| Some(0.0), &keep);
    close(&o[0], &want, 1e-12);
    close(&o[1], &lse, 1e-12);
    // Seed and offset as inputs.
    let by_input = runv(
        "scaled_dot_product_attention",
        &[&q, &k, &v, &scalar_i64(123), &scalar_i64(8)],
        &at(&[("dropout_p", float(p))]),
    );
    assert_eq!(by_input, o);
}

/// (q dims, k dims, v dims, attributes, mask)
type AttnGradCase = (Vec<u64>, Vec<u64>, Vec<u64>, Attrs, Option<HostTensor>);

#[test]
fn attention_backward_matches_numerical_gradients() {
    let mut r = Lcg(8);
    // (q dims, k dims, v dims, attrs, mask)
    let bool_mask = t(
        DType::Bool,
        &[3, 4],
        &[1., 0., 1., 1., 1., 1., 0., 1., 0., 0., 0., 0.],
    );
    let float_mask = f64s(&[1, 1, 3, 4], &r.vec(12));
    let cases: Vec<AttnGradCase> = vec![
        (
            vec![1, 4, 3, 2],
            vec![1, 2, 4, 2],
            vec![1, 2, 4, 3],
            at(&[("enable_gqa", flag(true)), ("is_causal", flag(true))]),
            None,
        ),
        (
            vec![2, 2, 3, 2],
            vec![2, 2, 4, 2],
            vec![2, 2, 4, 3],
            at(&[("scale", float(0.7))]),
            Some(bool_mask),
        ),
        (
            vec![2, 2, 3, 2],
            vec![1, 4, 2],
            vec![4, 3],
            Attrs::new(),
            Some(float_mask),
        ),
        (
            vec![1, 2, 3, 2],
            vec![1, 2, 4, 2],
            vec![1, 2, 4, 3],
            at(&[
                ("dropout_p", float(0.3)),
                ("seed", int(5)),
                ("offset", int(2)),
            ]),
            None,
        ),
    ];
    for (ci, (qd, kd, vd, a, mask)) in cases.into_iter().enumerate() {
        let n = |d: &[u64]| d.iter().product::<u64>() as usize;
        let q = f64s(&qd, &r.vec(n(&qd)));
        let k = f64s(&kd, &r.vec(n(&kd)));
        let v = f64s(&vd, &r.vec(n(&vd)));
        let mut inputs = vec![q.clone(), k.clone(), v.clone()];
        if let Some(m) = &mask {
            inputs.push(m.clone());
        }
        let refs: Vec<&HostTensor> = inputs.iter().collect();
        let fwd = runv("scaled_dot_product_attention", &refs, &a);
        let gv = r.vec(fwd[0].numel());
        let g = f64s(fwd[0].dims(), &gv);
        let mut bwd_in = vec![&g, &q, &k, &v, &fwd[0], &fwd[1]];
        if let Some(m) = &mask {
            bwd_in.push(m);
        }
        let grads = runv("scaled_dot_product_attention_backward", &bwd_in, &a);
        for wrt in 0..3 {
            assert_eq!(grads[wrt].ty, inputs[wrt].ty, "case {ci} grad {wrt}");
            let want = numeric_grad("scaled_dot_product_attention", &inputs, &a, 0, &gv, wrt);
            let got = grads[wrt].to_f64_vec();
            for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-6 * (1.0 + y.abs()),
                    "case {ci} grad {wrt} element {i}: {x} vs {y}"
                );
            }
        }
    }
}

#[test]
fn attention_backward_in_bf16_follows_f64() {
    let mut r = Lcg(9);
    let h = |d: &[u64], r: &mut Lcg| t(DType::BF16, d, &r.vec(d.iter().product::<u64>() as usize));
    let q = h(&[1, 2, 4, 3], &mut r);
    let k = h(&[1, 2, 4, 3], &mut r);
    let v = h(&[1, 2, 4, 4], &mut r);
    let g = h(&[1, 2, 4, 4], &mut r);
    let a = at(&[("is_causal", flag(true))]);
    let fwd = runv("scaled_dot_product_attention", &[&q, &k, &v], &a);
    let grads = runv(
        "scaled_dot_product_attention_backward",
        &[&g, &q, &k, &v, &fwd[0], &fwd[1]],
        &a,
    );
    let up = |x: &HostTensor| f64s(x.dims(), &x.to_f64_vec());
    let (q64, k64, v64, g64) = (up(&q), up(&k), up(&v), up(&g));
    let fwd64 = runv("scaled_dot_product_attention", &[&q64, &k64, &v64], &a);
    let want = runv(
        "scaled_dot_product_attention_backward",
        &[&g64, &q64, &k64, &v64, &fwd64[0], &fwd64[1]],
        &a,
    );
    for i in 0..3 {
        assert_eq!(grads[i].ty.dtype, DType::BF16);
        close(&grads[i], &want[i].to_f64_vec(), 1e-2);
    }
}

// ---------------------------------------------------------------- backward ops

/// Checks `bwd(grad, fwd_input_or_output...)` against the numerical gradient
/// of `fwd` with respect to its first input, in f64.
fn check_unary_backward(
    fwd: &str,
    fa: &Attrs,
    bwd: &str,
    ba: &Attrs,
    use_output: bool,
    xv: &[f64],
) {
    let mut r = Lcg(10);
    let x = f64s(&[2, xv.len() as u64 / 2], xv);
    let y = run1(fwd, &[&x], fa);
    let gv = r.vec(xv.len());
    let g = f64s(x.dims(), &gv);
    let second = if use_output { &y } else { &x };
    let got = run1(bwd, &[&g, second], ba);
    let want = numeric_grad(fwd, std::slice::from_ref(&x), fa, 0, &gv, 0);
    close(&got, &want, 1e-6);
}

#[test]
fn activation_and_softmax_backwards_match_numerical_gradients() {
    let mut r = Lcg(11);
    let xv: Vec<f64> = r.vec(10).iter().map(|v| v * 3.0).collect();
    let none = Attrs::new();
    let dim = at(&[("dim", int(1))]);
    check_unary_backward("softmax", &dim, "softmax_backward", &dim, true, &xv);
    check_unary_backward("log_softmax", &dim, "log_softmax_backward", &dim, true, &xv);
    check_unary_backward("gelu", &none, "gelu_backward", &none, false, &xv);
    let tanh = at(&[("approximate", s("tanh"))]);
    check_unary_backward("gelu", &tanh, "gelu_backward", &tanh, false, &xv);
    check_unary_backward("silu", &none, "silu_backward", &none, false, &xv);
    check_unary_backward("sigmoid", &none, "sigmoid_backward", &none, true, &xv);
    check_unary_backward("tanh", &none, "tanh_backward", &none, true, &xv);
    check_unary_backward("relu", &none, "threshold_backward", &none, false, &xv);
    // threshold_backward is exactly 0 at or below the threshold.
    let g = f32s(&[4], &[1.0, 2.0, 3.0, 4.0]);
    let x = f32s(&[4], &[-1.0, 0.0, 0.5, 2.0]);
    close(
        &run1(
            "threshold_backward",
            &[&g, &x],
            &at(&[("threshold", float(0.5))]),
        ),
        &[0.0, 0.0, 0.0, 4.0],
        0.0,
    );
    // softmax_backward with input_dtype gives the input's dtype.
    let go = f32s(&[2], &[1.0, 0.0]);
    let y = f32s(&[2], &[0.25, 0.75]);
    let o = run1(
        "softmax_backward",
        &[&go, &y],
        &at(&[("dim", int(0)), ("input_dtype", Attr::DType(DType::BF16))]),
    );
    assert_eq!(o.ty.dtype, DType::BF16);
    close(&o, &[0.1875, -0.1875], 0.0);
    // Half inputs compute in f32.
    let gh = t(DType::BF16, &[2], &[1.0, 1.0]);
    let xh = t(DType::BF16, &[2], &[0.5, -0.5]);
    let o = run1("silu_backward", &[&gh, &xh], &none);
    assert_eq!(o.ty.dtype, DType::BF16);
    let sg = |v: f64| 1.0 / (1.0 + (-v).exp());
    close(
        &o,
        &[0.5, -0.5].map(|v: f64| sg(v) * (1.0 + v * (1.0 - sg(v)))),
        4e-3,
    );
}

#[test]
fn layer_norm_and_rms_norm_backward_match_numerical_gradients() {
    let mut r = Lcg(12);
    let x = f64s(&[3, 2, 4], &r.vec(24));
    let w = f64s(&[2, 4], &r.vec(8));
    let b = f64s(&[2, 4], &r.vec(8));
    let a = at(&[("normalized_shape", ints(&[2, 4])), ("eps", float(1e-5))]);
    let fwd = runv("layer_norm", &[&x, &w, &b], &a);
    let gv = r.vec(24);
    let g = f64s(&[3, 2, 4], &gv);
    let grads = runv(
        "layer_norm_backward",
        &[&g, &x, &fwd[1], &fwd[2], &w, &b],
        &a,
    );
    let inputs = [x.clone(), w.clone(), b.clone()];
    for (wrt, grad) in grads.iter().enumerate() {
        let want = numeric_grad("layer_norm", &inputs, &a, 0, &gv, wrt);
        close(grad, &want, 1e-6);
    }
    // No weight or bias; mean/rstd given without the kept dims.
    let fwd = runv("layer_norm", &[&x], &a);
    let mean = f64s(&[3], &fwd[1].to_f64_vec());
    let grads = runv("layer_norm_backward", &[&g, &x, &mean, &fwd[2]], &a);
    let want = numeric_grad("layer_norm", std::slice::from_ref(&x), &a, 0, &gv, 0);
    close(&grads[0], &want, 1e-6);
    assert_eq!(grads[1].ty.dims, vec![2, 4]);
    // output_mask leaves outputs uncomputed (zero elements).
    let masked = runv(
        "layer_norm_backward",
        &[&g, &x, &fwd[1], &fwd[2], &w, &b],
        &a.clone().with("output_mask", ints(&[1, 0, 0])),
    );
    assert_eq!(masked[0].ty.dims, vec![3, 2, 4]);
    assert_eq!((masked[1].numel(), masked[2].numel()), (0, 0));
    // rms_norm
    let ra = at(&[("normalized_shape", ints(&[4])), ("eps", float(1e-6))]);
    let w4 = f64s(&[4], &r.vec(4));
    let grads = runv("rms_norm_backward", &[&g, &x, &w4], &ra);
    for (wrt, grad) in grads.iter().enumerate() {
        let want = numeric_grad("rms_norm", &[x.clone(), w4.clone()], &ra, 0, &gv, wrt);
        close(grad, &want, 1e-6);
    }
    let grads = runv("rms_norm_backward", &[&g, &x], &ra);
    close(
        &grads[0],
        &numeric_grad("rms_norm", std::slice::from_ref(&x), &ra, 0, &gv, 0),
        1e-6,
    );
    // fused_rms_norm's rstd, handed to its backward, gives the same.
    let rms = runv("fused_rms_norm", &[&x, &w4], &ra);
    assert_eq!(rms[1].ty.dims, vec![3, 2, 1]);
    close(
        &rms[0],
        &runv("rms_norm", &[&x, &w4], &ra)[0].to_f64_vec(),
        0.0,
    );
    let fa = at(&[("normalized_shape", ints(&[4]))]);
    let fused = runv("fused_rms_norm_backward", &[&g, &x, &rms[1], &w4], &fa);
    for (wrt, grad) in fused.iter().enumerate() {
        let want = numeric_grad("rms_norm", &[x.clone(), w4.clone()], &ra, 0, &gv, wrt);
        close(grad, &want, 1e-6);
    }
    // bf16 layer norm backward against its f64 result.
    let xh = t(DType::BF16, &[3, 8], &x.to_f64_vec());
    let gh = t(DType::BF16, &[3, 8], &gv);
    let a8 = at(&[("normalized_shape", ints(&[8]))]);
    let fh = runv("layer_norm", &[&xh], &a8);
    let dh = runv("layer_norm_backward", &[&gh, &xh, &fh[1], &fh[2]], &a8);
    assert_eq!(dh[0].ty.dtype, DType::BF16);
    let x64 = f64s(&[3, 8], &xh.to_f64_vec());
    let g64 = f64s(&[3, 8], &gh.to_f64_vec());
    let f64_ = runv("layer_norm", &[&x64], &a8);
    let d64 = runv(
        "layer_norm_backward",
        &[&g64, &x64, &f64_[1], &f64_[2]],
        &a8,
    );
    close(&dh[0], &d64[0].to_f64_vec(), 2e-2);
    let e = err(
        "layer_norm_backward",
        &[&g, &x, &f64s(&[5], &[0.0; 5]), &fwd[2]],
        &a,
    );
    assert!(e.contains("mean of shape [5]"), "{e}");
}

#[test]
fn embedding_index_select_gather_and_cumsum_backward() {
    let idx = i64s(&[2, 3], &[1, 3, 1, 0, 3, 3]);
    let gv: Vec<f64> = (0..12).map(|i| i as f64 + 1.0).collect();
    let g = f32s(&[2, 3, 2], &gv);
    let dense = |pad: i64, freq: bool| {
        let ids = [1usize, 3, 1, 0, 3, 3];
        let mut count = [0.0; 5];
        for &i in &ids {
            count[i] += 1.0;
        }
        let mut out = vec![0.0; 10];
        for (p, &i) in ids.iter().enumerate() {
            if i as i64 == pad {
                continue;
            }
            for d in 0..2 {
                out[i * 2 + d] += gv[p * 2 + d] / if freq { count[i] } else { 1.0 };
            }
        }
        out
    };
    let a = at(&[("num_weights", int(5))]);
    let o = run1("embedding_backward", &[&g, &idx], &a);
    assert_eq!(o.ty.dims, vec![5, 2]);
    close(&o, &dense(-1, false), 0.0);
    close(
        &run1(
            "embedding_backward",
            &[&g, &idx],
            &a.clone().with("padding_idx", int(3)),
        ),
        &dense(3, false),
        0.0,
    );
    close(
        &run1(
            "embedding_backward",
            &[&g, &idx],
            &a.clone().with("scale_grad_by_freq", flag(true)),
        ),
        &dense(-1, true),
        1e-6,
    );
    // index_select / gather backward against numerical gradients (linear ops).
    let mut r = Lcg(13);
    let x = f64s(&[4, 3], &r.vec(12));
    let sel = i64s(&[3], &[2, 0, 2]);
    let sa = at(&[("dim", int(0))]);
    let gv = r.vec(9);
    let got = run1(
        "index_select_backward",
        &[&f64s(&[3, 3], &gv), &sel],
        &sa.clone().with("self_sizes", ints(&[4, 3])),
    );
    close(
        &got,
        &numeric_grad("index_select", &[x.clone(), sel.clone()], &sa, 0, &gv, 0),
        1e-6,
    );
    let gi = i64s(&[4, 2], &[0, 2, 1, 1, 2, 0, 0, 0]);
    let ga = at(&[("dim", int(1))]);
    let gv = r.vec(8);
    let got = run1(
        "gather_backward",
        &[&f64s(&[4, 2], &gv), &gi],
        &ga.clone().with("self_sizes", ints(&[4, 3])),
    );
    close(
        &got,
        &numeric_grad("gather", &[x.clone(), gi.clone()], &ga, 0, &gv, 0),
        1e-6,
    );
    let ca = at(&[("dim", int(1))]);
    let gv = r.vec(12);
    let got = run1("cumsum_backward", &[&f64s(&[4, 3], &gv)], &ca);
    close(
        &got,
        &numeric_grad("cumsum", std::slice::from_ref(&x), &ca, 0, &gv, 0),
        1e-6,
    );
    let e = err("embedding_backward", &[&g, &i64s(&[6], &[0; 6])], &a);
    assert!(e.contains("indices' shape"), "{e}");
}

// ---------------------------------------------------------------- sort, topk, conv, bags

#[test]
fn sort_and_topk() {
    let x = f32s(&[2, 4], &[3.0, 1.0, f64::NAN, 1.0, -1.0, 5.0, 2.0, 5.0]);
    let o = runv("sort", &[&x], &Attrs::new());
    close(&o[0], &[1.0, 1.0, 3.0, f64::NAN, -1.0, 2.0, 5.0, 5.0], 0.0);
    close(&o[1], &[1.0, 3.0, 0.0, 2.0, 0.0, 2.0, 1.0, 3.0], 0.0);
    let o = runv(
        "sort",
        &[&x],
        &at(&[("descending", flag(true)), ("stable", flag(true))]),
    );
    close(&o[0], &[f64::NAN, 3.0, 1.0, 1.0, 5.0, 5.0, 2.0, -1.0], 0.0);
    close(&o[1], &[2.0, 0.0, 1.0, 3.0, 1.0, 3.0, 2.0, 0.0], 0.0);
    let o = runv("sort", &[&x], &at(&[("dim", int(0))]));
    close(&o[1], &[1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0], 0.0);
    let o = runv("topk", &[&x], &at(&[("k", int(2))]));
    assert_eq!(o[0].ty.dims, vec![2, 2]);
    close(&o[0], &[f64::NAN, 3.0, 5.0, 5.0], 0.0);
    close(&o[1], &[2.0, 0.0, 1.0, 3.0], 0.0);
    let o = runv(
        "topk",
        &[&x],
        &at(&[("k", int(1)), ("dim", int(0)), ("largest", flag(false))]),
    );
    close(&o[0], &[-1.0, 1.0, 2.0, 1.0], 0.0);
    close(&o[1], &[1.0, 0.0, 1.0, 0.0], 0.0);
    let o = runv("topk", &[&x], &at(&[("k", int(0))]));
    assert_eq!(o[0].ty.dims, vec![2, 0]);
    let e = err("topk", &[&x], &at(&[("k", int(5))]));
    assert!(e.contains("topk") && e.contains("k=5"), "{e}");
    let sc = f32s(&[], &[4.0]);
    let o = runv("topk", &[&sc], &at(&[("k", int(1))]));
    assert_eq!(o[0].ty.dims, Vec::<u64>::new());
    let i = i64s(&[3], &[2, -7, 2]);
    close(&run1("sort", &[&i], &Attrs::new()), &[-7.0, 2.0, 2.0], 0.0);
}

/// mode: the most frequent value, the smallest of a tie, the index of its
/// last occurrence; each NaN counts once (torch's CPU kernel's choices).
#[test]
fn mode_takes_the_smallest_most_frequent_value() {
    let nan = f64::NAN;
    let x = f32s(
        &[3, 7],
        &[
            3.0, 1.0, 3.0, 2.0, 1.0, 3.0, 1.0, // 1 and 3 thrice: 1, at 6
            5.0, 5.0, 4.0, 4.0, 9.0, 9.0, 9.0, // 9, at 6
            2.0, nan, nan, 1.0, nan, 2.0, 0.0, // 2 twice; NaN never equal
        ],
    );
    let o = runv("mode", &[&x], &at(&[("dim", int(1))]));
    close(&o[0], &[1.0, 9.0, 2.0], 0.0);
    close(&o[1], &[6.0, 6.0, 5.0], 0.0);
    let col = runv(
        "mode",
        &[&x],
        &at(&[("dim", int(0)), ("keepdim", flag(true))]),
    );
    assert_eq!(col[0].ty.dims, vec![1, 7]);
    let ints = i64s(&[5], &[1, 2, 2, 1, 0]);
    let o = runv("mode", &[&ints], &Attrs::new());
    assert_eq!(o[0].ty.dims, Vec::<u64>::new());
    close(&o[0], &[1.0], 0.0);
    close(&o[1], &[3.0], 0.0);
    let e = err("mode", &[&f32s(&[2, 0], &[])], &Attrs::new());
    assert!(e.contains("non-zero size"), "{e}");
}

#[test]
fn kthvalue_and_median_pick_one_sorted_position() {
    let nan = f64::NAN;
    let x = f32s(&[2, 5], &[3.0, 1.0, 4.0, 1.0, 5.0, 2.0, nan, 0.0, nan, 7.0]);
    let o = runv("kthvalue", &[&x], &at(&[("k", int(2))]));
    close(&o[0], &[1.0, 2.0], 0.0);
    close(&o[1], &[3.0, 0.0], 0.0);
    let o = runv(
        "kthvalue",
        &[&x],
        &at(&[("k", int(5)), ("keepdim", flag(true))]),
    );
    assert_eq!(o[0].ty.dims, vec![2, 1]);
    close(&o[0], &[5.0, nan], 0.0);
    close(&o[1], &[4.0, 3.0], 0.0);
    let e = err("kthvalue", &[&x], &at(&[("k", int(6))]));
    assert!(e.contains("k=6") && e.contains("size 5"), "{e}");
    // median: the lower middle; a row with NaN gives its first NaN.
    let o = runv("median", &[&x], &at(&[("dim", int(1))]));
    close(&o[0], &[3.0, nan], 0.0);
    close(&o[1], &[0.0, 1.0], 0.0);
    // nanmedian: of the numbers 2, 0, 7.
    let o = runv(
        "median",
        &[&x],
        &at(&[("dim", int(-1)), ("ignore_nan", flag(true))]),
    );
    close(&o[0], &[3.0, 2.0], 0.0);
    close(&o[1], &[0.0, 0.0], 0.0);
    let all_nan = f32s(&[2], &[nan, nan]);
    let o = runv("median", &[&all_nan], &at(&[("ignore_nan", flag(true))]));
    close(&o[0], &[nan], 0.0);
    let even = i64s(&[4], &[8, -1, 5, 2]);
    let o = runv("median", &[&even], &Attrs::new());
    assert_eq!(o[0].ty.dims, Vec::<u64>::new());
    close(&o[0], &[2.0], 0.0);
    close(&o[1], &[3.0], 0.0);
    close(
        &run1("median", &[&f32s(&[0], &[])], &Attrs::new()),
        &[nan],
        0.0,
    );
    let e = err("median", &[&f32s(&[0, 2], &[])], &at(&[("dim", int(0))]));
    assert!(e.contains("non-zero size"), "{e}");
    let sc = f32s(&[], &[4.0]);
    let o = runv(
        "median",
        &[&sc],
        &at(&[("dim", int(0)), ("keepdim", flag(true))]),
    );
    assert_eq!(o[0].ty.dims, Vec::<u64>::new());
}

#[test]
fn searchsorted_is_torchs_binary_search() {
    let nan = f64::NAN;
    let bd = f32s(&[5], &[1.0, 2.0, 2.0, 3.0, nan]);
    let v = f32s(&[2, 3], &[0.0, 2.0, 2.5, 3.0, 9.0, nan]);
    close(
        &run1("searchsorted", &[&bd, &v], &Attrs::new()),
        &[0.0, 1.0, 5.0, 5.0, 5.0, 5.0],
        0.0,
    );
    let r = run1(
        "searchsorted",
        &[&bd, &v],
        &at(&[("right", flag(true)), ("out_int32", flag(true))]),
    );
    assert_eq!(r.ty.dtype, DType::I32);
    close(&r, &[0.0, 5.0, 5.0, 5.0, 5.0, 5.0], 0.0);
    // torch's values: a NaN met halfway sends the search right. Rows of
    // their own, read through a sorter; values promote (i64 -> f32).
    let rows = f32s(&[2, 3], &[5.0, 1.0, 3.0, 0.0, -1.0, -2.0]);
    let sorter = i64s(&[2, 3], &[1, 2, 0, 2, 1, 0]);
    let v = i64s(&[2, 2], &[3, 6, -1, 1]);
    close(
        &run1("searchsorted", &[&rows, &v, &sorter], &Attrs::new()),
        &[1.0, 3.0, 1.0, 3.0],
        0.0,
    );
    let e = err(
        "searchsorted",
        &[&rows, &i64s(&[3, 2], &[0; 6])],
        &Attrs::new(),
    );
    assert!(e.contains("first N-1 dimensions"), "{e}");
    let empty = f32s(&[0], &[]);
    close(
        &run1("searchsorted", &[&empty, &v], &Attrs::new()),
        &[0.0; 4],
        0.0,
    );
}

#[test]
fn repeat_interleave_repeats_each_index() {
    let r = i64s(&[5], &[2, 0, 3, 1, 0]);
    let got = run1("repeat_interleave", &[&r], &at(&[("output_size", int(6))]));
    assert_eq!(got.ty.dtype, DType::I64);
    close(&got, &[0.0, 0.0, 2.0, 2.0, 2.0, 3.0], 0.0);
    // int32 repeats give int32; a 0-dim repeat is one index.
    let r32 = t(DType::I32, &[3], &[1.0, 2.0, 1.0]);
    let got = run1(
        "repeat_interleave",
        &[&r32],
        &at(&[("output_size", int(4))]),
    );
    assert_eq!(got.ty.dtype, DType::I32);
    close(&got, &[0.0, 1.0, 1.0, 2.0], 0.0);
    let got = run1(
        "repeat_interleave",
        &[&scalar_i64(3)],
        &at(&[("output_size", int(3))]),
    );
    close(&got, &[0.0; 3], 0.0);
    // An output_size past the sum stays in range (the last index).
    let got = run1("repeat_interleave", &[&r], &at(&[("output_size", int(8))]));
    close(&got, &[0.0, 0.0, 2.0, 2.0, 2.0, 3.0, 4.0, 4.0], 0.0);
    let got = run1(
        "repeat_interleave",
        &[&i64s(&[0], &[])],
        &at(&[("output_size", int(0))]),
    );
    assert_eq!(got.ty.dims, vec![0]);
    let e = err(
        "repeat_interleave",
        &[&f32s(&[2], &[1.0, 2.0])],
        &at(&[("output_size", int(3))]),
    );
    assert!(
        e.contains("repeat_interleave: repeats must be a 0-dim or 1-dim int32 or int64"),
        "{e}"
    );
    let e = err(
        "repeat_interleave",
        &[&i64s(&[0], &[])],
        &at(&[("output_size", int(2))]),
    );
    assert!(e.contains("output_size 2 from no repeats"), "{e}");
}

#[test]
fn bincount_counts_and_sums_weights() {
    let x = i64s(&[6], &[0, 2, 2, 5, 2, 0]);
    let got = run1("bincount", &[&x], &at(&[("length", int(6))]));
    assert_eq!(got.ty.dtype, DType::I64);
    close(&got, &[2.0, 0.0, 3.0, 0.0, 0.0, 1.0], 0.0);
    // A longer length pads with zeros; a shorter one drops the values
    // past it (and negative ones).
    let got = run1("bincount", &[&x], &at(&[("length", int(8))]));
    close(&got, &[2.0, 0.0, 3.0, 0.0, 0.0, 1.0, 0.0, 0.0], 0.0);
    let neg = i64s(&[4], &[-1, 1, 3, 1]);
    let got = run1("bincount", &[&neg], &at(&[("length", int(2))]));
    close(&got, &[0.0, 2.0], 0.0);
    // Weights: f32 sums in f32, any other dtype in f64.
    let w = f32s(&[6], &[0.5, 1.0, 2.0, 3.0, 0.25, -1.0]);
    let got = run1("bincount", &[&x, &w], &at(&[("length", int(6))]));
    assert_eq!(got.ty.dtype, DType::F32);
    close(&got, &[-0.5, 0.0, 3.25, 0.0, 0.0, 3.0], 0.0);
    let wi = i64s(&[6], &[1, 2, 3, 4, 5, 6]);
    let got = run1("bincount", &[&x, &wi], &at(&[("length", int(6))]));
    assert_eq!(got.ty.dtype, DType::F64);
    close(&got, &[7.0, 0.0, 10.0, 0.0, 0.0, 4.0], 0.0);
    let got = run1(
        "bincount",
        &[&t(DType::U8, &[3], &[1.0, 1.0, 0.0])],
        &at(&[("length", int(2))]),
    );
    close(&got, &[1.0, 2.0], 0.0);
    let e = err(
        "bincount",
        &[&f32s(&[2], &[1.0, 2.0])],
        &at(&[("length", int(3))]),
    );
    assert!(
        e.contains("bincount: only supports 1-d integral inputs"),
        "{e}"
    );
    let e = err(
        "bincount",
        &[&x, &f32s(&[3], &[1.0; 3])],
        &at(&[("length", int(6))]),
    );
    assert!(e.contains("same length as input"), "{e}");
}

#[test]
fn cummax_cummin_and_logcumsumexp() {
    let nan = f64::NAN;
    let x = f32s(&[5], &[1.0, nan, 2.0, nan, 0.0]);
    let o = runv("cummax", &[&x], &at(&[("dim", int(0))]));
    close(&o[0], &[1.0, nan, nan, nan, nan], 0.0);
    close(&o[1], &[0.0, 1.0, 1.0, 3.0, 3.0], 0.0);
    let x = i64s(&[2, 4], &[5, 1, 5, 3, 1, 1, 0, 0]);
    let o = runv("cummin", &[&x], &at(&[("dim", int(1))]));
    close(&o[0], &[5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0], 0.0);
    close(&o[1], &[0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 2.0, 3.0], 0.0);
    let o = runv("cummax", &[&x], &at(&[("dim", int(0))]));
    close(&o[1], &[0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0], 0.0);
    let inf = f64::INFINITY;
    let x = f32s(&[6], &[-1000.0, 0.0, inf, inf, -inf, 1.0]);
    let r = run1("logcumsumexp", &[&x], &at(&[("dim", int(0))]));
    close(&r, &[-1000.0, 0.0, inf, inf, inf, inf], 0.0);
    let x = f32s(&[2, 3], &[0.0, 0.0, 0.0, -inf, -inf, 1.0]);
    let r = run1("logcumsumexp", &[&x], &at(&[("dim", int(1))]));
    let l2 = 2f64.ln();
    close(&r, &[0.0, l2, 3f64.ln(), -inf, -inf, 1.0], 1e-6);
    let e = err(
        "logcumsumexp",
        &[&i64s(&[2], &[1, 2])],
        &at(&[("dim", int(0))]),
    );
    assert!(e.contains("floating-point"), "{e}");
}

#[test]
fn masked_scatter_fills_true_elements_in_order() {
    let x = f32s(&[2, 3], &[0.0; 6]);
    let mask = t(DType::Bool, &[3], &[1.0, 0.0, 1.0]);
    let src = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let r = run1("masked_scatter", &[&x, &mask, &src], &Attrs::new());
    close(&r, &[1.0, 0.0, 2.0, 3.0, 0.0, 4.0], 0.0);
    let g = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let r = run1(
        "masked_scatter_backward",
        &[&g, &mask],
        &at(&[("sizes", ints(&[5]))]),
    );
    close(&r, &[1.0, 3.0, 4.0, 6.0, 0.0], 0.0);
    let e = err(
        "masked_scatter",
        &[&x, &f32s(&[3], &[1.0; 3]), &src],
        &Attrs::new(),
    );
    assert!(e.contains("boolean masks"), "{e}");
    let e = err(
        "masked_scatter",
        &[&x, &mask, &f64s(&[4], &[1.0; 4])],
        &Attrs::new(),
    );
    assert!(e.contains("same dtype"), "{e}");
}

#[test]
fn trace_and_cross() {
    let m = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let r = run1("trace", &[&m], &Attrs::new());
    assert_eq!(r.ty.dims, Vec::<u64>::new());
    close(&r, &[6.0], 0.0);
    let r = run1(
        "trace",
        &[&i64s(&[3, 2], &[1, 2, 3, 4, 5, 6])],
        &Attrs::new(),
    );
    assert_eq!(r.ty.dtype, DType::I64);
    close(&r, &[5.0], 0.0);
    let e = err("trace", &[&f32s(&[3], &[1.0; 3])], &Attrs::new());
    assert!(e.contains("expected a matrix"), "{e}");
    let a = f32s(&[2, 3], &[1.0, 0.0, 0.0, 1.0, 2.0, 3.0]);
    let b = f32s(&[1, 3], &[0.0, 1.0, 0.0]);
    let r = run1("linalg_cross", &[&a, &b], &Attrs::new());
    close(&r, &[0.0, 0.0, 1.0, -3.0, 0.0, 1.0], 0.0);
    let e = err(
        "linalg_cross",
        &[&f32s(&[2, 4], &[0.0; 8]), &f32s(&[2, 4], &[0.0; 8])],
        &Attrs::new(),
    );
    assert!(e.contains("must have length 3"), "{e}");
}

/// Naive 2-D convolution y = conv(x, w) and, for a cotangent gy, the
/// gradients dx and dw, by the definition.
#[allow(clippy::too_many_arguments)]
fn conv2d_ref(
    x: &[f64],
    xd: [usize; 4],
    w: &[f64],
    wd: [usize; 4],
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
    groups: usize,
    gy: Option<&[f64]>,
) -> (Vec<f64>, [usize; 4], Vec<f64>, Vec<f64>) {
    let [n, c, h, wi] = xd;
    let [o, cg, kh, kw] = wd;
    let oh = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) / stride[0] + 1;
    let ow = (wi + 2 * pad[1] - dil[1] * (kw - 1) - 1) / stride[1] + 1;
    let og = o / groups;
    let mut y = vec![0.0; n * o * oh * ow];
    let mut dx = vec![0.0; x.len()];
    let mut dw = vec![0.0; w.len()];
    for b in 0..n {
        for oc in 0..o {
            let grp = oc / og;
            for p in 0..oh {
                for q in 0..ow {
                    let yi = ((b * o + oc) * oh + p) * ow + q;
                    for ci in 0..cg {
                        let ch = grp * cg + ci;
                        for i in 0..kh {
                            for j in 0..kw {
                                let ih = (p * stride[0] + i * dil[0]) as i64 - pad[0] as i64;
                                let iw = (q * stride[1] + j * dil[1]) as i64 - pad[1] as i64;
                                if ih < 0 || iw < 0 || ih >= h as i64 || iw >= wi as i64 {
                                    continue;
                                }
                                let xi = ((b * c + ch) * h + ih as usize) * wi + iw as usize;
                                let wix = ((oc * cg + ci) * kh + i) * kw + j;
                                y[yi] += x[xi] * w[wix];
                                if let Some(gy) = gy {
                                    dx[xi] += gy[yi] * w[wix];
                                    dw[wix] += gy[yi] * x[xi];
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    (y, [n, o, oh, ow], dx, dw)
}

/// (x dims, w dims, stride, pad, dilation, groups)
type ConvCase = (
    [usize; 4],
    [usize; 4],
    [usize; 2],
    [usize; 2],
    [usize; 2],
    usize,
);

#[test]
fn conv2d_conv1d_and_convolution_backward_match_loops() {
    let mut r = Lcg(14);
    let cases: [ConvCase; 4] = [
        ([2, 4, 5, 6], [6, 2, 3, 2], [1, 2], [1, 0], [1, 1], 2),
        ([1, 3, 7, 7], [2, 3, 3, 3], [2, 2], [1, 2], [2, 1], 1),
        ([2, 2, 4, 5], [4, 1, 2, 3], [3, 1], [0, 1], [1, 2], 2),
        ([1, 1, 6, 1], [1, 1, 3, 1], [2, 1], [2, 0], [1, 1], 1),
    ];
    for (ci, (xd, wd, st, pd, dl, g)) in cases.into_iter().enumerate() {
        let u = |d: [usize; 4]| d.map(|v| v as u64);
        let xv = r.vec(xd.iter().product());
        let wv = r.vec(wd.iter().product());
        let bv = r.vec(wd[0]);
        let (y0, yd, _, _) = conv2d_ref(&xv, xd, &wv, wd, st, pd, dl, g, None);
        let gy = r.vec(y0.len());
        let (_, _, dx, dw) = conv2d_ref(&xv, xd, &wv, wd, st, pd, dl, g, Some(&gy));
        let x = f64s(&u(xd), &xv);
        let w = f64s(&u(wd), &wv);
        let b = f64s(&[wd[0] as u64], &bv);
        let to = |v: [usize; 2]| ints(&[v[0] as i64, v[1] as i64]);
        let a = at(&[
            ("stride", to(st)),
            ("padding", to(pd)),
            ("dilation", to(dl)),
            ("groups", int(g as i64)),
        ]);
        let y = run1("conv2d", &[&x, &w, &b], &a);
        assert_eq!(y.ty.dims, u(yd).to_vec(), "case {ci}");
        let plane = yd[2] * yd[3];
        let want: Vec<f64> = y0
            .iter()
            .enumerate()
            .map(|(i, v)| v + bv[(i / plane) % yd[1]])
            .collect();
        close(&y, &want, 1e-12);
        let grads = runv("convolution_backward", &[&f64s(&u(yd), &gy), &x, &w], &a);
        close(&grads[0], &dx, 1e-12);
        close(&grads[1], &dw, 1e-12);
        let db: Vec<f64> = (0..yd[1])
            .map(|oc| {
                (0..yd[0])
                    .map(|b| gy[(b * yd[1] + oc) * plane..][..plane].iter().sum::<f64>())
                    .sum()
            })
            .collect();
        close(&grads[2], &db, 1e-12);
        // A transposed convolution of gy is the dx above (its adjoint).
        let t_a = a.clone().with("transposed", flag(true)).with(
            "output_padding",
            ints(&[
                ((xd[2] + 2 * pd[0] - dl[0] * (wd[2] - 1) - 1) % st[0]) as i64,
                ((xd[3] + 2 * pd[1] - dl[1] * (wd[3] - 1) - 1) % st[1]) as i64,
            ]),
        );
        let tconv = run1("convolution", &[&f64s(&u(yd), &gy), &w], &t_a);
        assert_eq!(tconv.ty.dims, u(xd).to_vec(), "case {ci} transposed");
        close(&tconv, &dx, 1e-12);
        // Its backward: dinput is the forward convolution, dweight matches
        // the numerical gradient.
        let tg = r.vec(dx.len());
        let tgrads = runv(
            "convolution_backward",
            &[&f64s(&u(xd), &tg), &f64s(&u(yd), &gy), &w],
            &t_a,
        );
        let (fwd_of_tg, _, _, _) = conv2d_ref(&tg, xd, &wv, wd, st, pd, dl, g, None);
        close(&tgrads[0], &fwd_of_tg, 1e-12);
        let want = numeric_grad(
            "convolution",
            &[f64s(&u(yd), &gy), w.clone()],
            &t_a,
            0,
            &tg,
            1,
        );
        close(&tgrads[1], &want, 1e-6);
    }
    // conv1d is conv2d with a height of 1; unbatched input; "same" padding.
    let xv = r.vec(2 * 3 * 7);
    let wv = r.vec(4 * 3 * 3);
    let x1 = f32s(&[2, 3, 7], &xv);
    let w1 = f32s(&[4, 3, 3], &wv);
    let (y, _, _, _) = conv2d_ref(
        &xv,
        [2, 3, 1, 7],
        &wv,
        [4, 3, 1, 3],
        [1, 1],
        [0, 2],
        [1, 2],
        1,
        None,
    );
    let a = at(&[("padding", s("same")), ("dilation", int(2))]);
    let o = run1("conv1d", &[&x1, &w1], &a);
    assert_eq!(o.ty.dims, vec![2, 4, 7]);
    close(&o, &y, 1e-6);
    let o = run1("conv1d", &[&f32s(&[3, 7], &xv[..21]), &w1], &a);
    assert_eq!(o.ty.dims, vec![4, 7]);
    close(&o, &y[..28], 1e-6);
    // bf16 convolution rounds once.
    let xh = t(DType::BF16, &[2, 3, 7], &xv);
    let wh = t(DType::BF16, &[4, 3, 3], &wv);
    let (yh, _, _, _) = conv2d_ref(
        &xh.to_f64_vec(),
        [2, 3, 1, 7],
        &wh.to_f64_vec(),
        [4, 3, 1, 3],
        [1, 1],
        [0, 0],
        [1, 1],
        1,
        None,
    );
    let o = run1("conv1d", &[&xh, &wh], &Attrs::new());
    assert_eq!(o.ty.dtype, DType::BF16);
    close(&o, &yh, 8e-3);
    // Errors.
    let e = err("conv2d", &[&x1, &w1], &Attrs::new());
    assert!(e.contains("conv2d"), "{e}");
    let e = err(
        "conv1d",
        &[&x1, &f32s(&[4, 2, 3], &[0.0; 24])],
        &Attrs::new(),
    );
    assert!(e.contains("channels"), "{e}");
    let e = err("conv1d", &[&x1, &wh], &Attrs::new());
    assert!(e.contains("should be the same"), "{e}");
    let e = err(
        "conv1d",
        &[&x1, &w1],
        &at(&[("padding", s("same")), ("stride", int(2))]),
    );
    assert!(e.contains("strided"), "{e}");
}

#[test]
fn embedding_bag_modes_offsets_and_weights() {
    let wv: Vec<f64> = (0..10).map(|i| i as f64 * 0.5 - 2.0).collect();
    let weight = f32s(&[5, 2], &wv);
    let idx = [0usize, 2, 1, 3, 3, 1, 0];
    let indices = i64s(&[7], &idx.map(|i| i as i64));
    let bags: [&[usize]; 4] = [&[0, 2], &[], &[1, 3, 3], &[1, 0]];
    let psw_v = [0.5, 1.0, 2.0, -1.0, 1.5, 1.0, 3.0];
    let reference = |mode: &str, pad: Option<usize>, psw: bool| {
        let mut out = Vec::new();
        let mut start = 0;
        for bag in bags {
            for d in 0..2 {
                let vals: Vec<f64> = bag
                    .iter()
                    .enumerate()
                    .filter(|(_, &i)| Some(i) != pad)
                    .map(|(p, &i)| wv[i * 2 + d] * if psw { psw_v[start + p] } else { 1.0 })
                    .collect();
                out.push(match (mode, vals.len()) {
                    (_, 0) => 0.0,
                    ("sum", _) => vals.iter().sum(),
                    ("mean", n) => vals.iter().sum::<f64>() / n as f64,
                    _ => vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                });
            }
            start += bag.len();
        }
        out
    };
    let offsets = i64s(&[4], &[0, 2, 2, 5]);
    let last = i64s(&[5], &[0, 2, 2, 5, 7]);
    for mode in ["sum", "mean", "max"] {
        let a = at(&[("mode", s(mode))]);
        let o = runv("embedding_bag", &[&weight, &indices, &offsets], &a);
        assert_eq!(o[0].ty.dims, vec![4, 2]);
        close(&o[0], &reference(mode, None, false), 1e-6);
        close(&o[1], &[0., 0., 2., 2., 2., 3., 3.], 0.0);
        close(&o[2], &[2., 0., 3., 2.], 0.0);
        let o2 = runv(
            "embedding_bag",
            &[&weight, &indices, &last],
            &a.clone().with("include_last_offset", flag(true)),
        );
        assert_eq!(o2[0], o[0]);
        let o3 = runv(
            "embedding_bag",
            &[&weight, &indices, &offsets],
            &a.clone().with("padding_idx", int(3)),
        );
        close(&o3[0], &reference(mode, Some(3), false), 1e-6);
        close(&o3[2], &[2., 0., 1., 2.], 0.0);
    }
    // max_indices: the weight row of the maximum per bag and column.
    let o = runv(
        "embedding_bag",
        &[&weight, &indices, &offsets],
        &at(&[("mode", s("max"))]),
    );
    close(&o[3], &[2., 2., -1., -1., 3., 3., 1., 1.], 0.0);
    let psw = f32s(&[7], &psw_v);
    let o = run1(
        "embedding_bag",
        &[&weight, &indices, &offsets, &psw],
        &at(&[("mode", s("sum"))]),
    );
    close(&o, &reference("sum", None, true), 1e-6);
    // 2-D indices: fixed-size bags.
    let i2 = i64s(&[2, 3], &[0, 1, 2, 4, 4, 0]);
    let o = run1("embedding_bag", &[&weight, &i2], &at(&[("mode", int(1))]));
    let m = |rows: [usize; 3], d: usize| rows.iter().map(|&i| wv[i * 2 + d]).sum::<f64>() / 3.0;
    close(
        &o,
        &[
            m([0, 1, 2], 0),
            m([0, 1, 2], 1),
            m([4, 4, 0], 0),
            m([4, 4, 0], 1),
        ],
        1e-6,
    );
    let e = err(
        "embedding_bag",
        &[&weight, &indices, &offsets, &psw],
        &at(&[("mode", s("mean"))]),
    );
    assert!(e.contains("only supported for mode='sum'"), "{e}");
    let e = err("embedding_bag", &[&weight, &indices], &Attrs::new());
    assert!(e.contains("offsets"), "{e}");
}

#[test]
fn index_put_replaces_accumulates_and_masks() {
    let x = f32s(&[4, 2], &[0., 1., 2., 3., 4., 5., 6., 7.]);
    let idx = i64s(&[3], &[-1, 0, 3]);
    let vals = f32s(&[3, 2], &[10., 11., 20., 21., 30., 31.]);
    let o = run1("index_put", &[&x, &idx, &vals], &Attrs::new());
    // Index 3 twice (as -1 and 3): the last write wins.
    close(&o, &[20., 21., 2., 3., 4., 5., 30., 31.], 0.0);
    let o = run1(
        "index_put",
        &[&x, &idx, &vals],
        &at(&[("accumulate", flag(true))]),
    );
    close(&o, &[20., 22., 2., 3., 4., 5., 46., 49.], 0.0);
    // Values broadcast; 2-D indices.
    let i2 = i64s(&[1, 2], &[1, 2]);
    let o = run1("index_put", &[&x, &i2, &f32s(&[], &[9.0])], &Attrs::new());
    close(&o, &[0., 1., 9., 9., 9., 9., 6., 7.], 0.0);
    // A bool mask over the leading dim, and over every element.
    let m = t(DType::Bool, &[4], &[1., 0., 0., 1.]);
    let o = run1(
        "index_put",
        &[&x, &m, &f32s(&[2], &[-1., -2.])],
        &Attrs::new(),
    );
    close(&o, &[-1., -2., 2., 3., 4., 5., -1., -2.], 0.0);
    let full = t(DType::Bool, &[4, 2], &[0., 1., 0., 0., 0., 0., 1., 0.]);
    let o = run1(
        "index_put",
        &[&x, &full, &f32s(&[], &[0.5])],
        &at(&[("accumulate", flag(true))]),
    );
    close(&o, &[0., 1.5, 2., 3., 4., 5., 6.5, 7.], 0.0);
    let e = err(
        "index_put",
        &[&x, &m, &f32s(&[2, 2], &[0.0; 4])],
        &Attrs::new(),
    );
    assert!(e.contains("use where"), "{e}");
    let e = err(
        "index_put",
        &[&x, &i64s(&[1], &[4]), &f32s(&[], &[0.0])],
        &Attrs::new(),
    );
    assert!(e.contains("out of range"), "{e}");
}

// ---------------------------------------------------------------- optimizers

#[test]
fn sgd_step_follows_torch_optim_sgd() {
    let mut r = Lcg(15);
    let n = 6;
    let p0 = r.vec(n);
    let grads: Vec<Vec<f64>> = (0..3).map(|_| r.vec(n)).collect();
    for (momentum, dampening, wd, nesterov, maximize) in [
        (0.0, 0.0, 0.0, false, false),
        (0.9, 0.1, 0.01, false, false),
        (0.9, 0.0, 0.05, true, true),
    ] {
        let lr = 0.1;
        // Reference: torch.optim.SGD's single-tensor loop, in f64.
        let mut p = p0.clone();
        let mut buf: Option<Vec<f64>> = None;
        let mut pt = f64s(&[2, 3], &p0);
        let mut bt: Option<HostTensor> = None;
        for (step, g) in grads.iter().enumerate() {
            let mut d: Vec<f64> = g
                .iter()
                .zip(&p)
                .map(|(g, p)| (if maximize { -g } else { *g }) + wd * p)
                .collect();
            if momentum != 0.0 {
                let b: Vec<f64> = match &buf {
                    None => d.clone(),
                    Some(b) => b
                        .iter()
                        .zip(&d)
                        .map(|(b, g)| b * momentum + (1.0 - dampening) * g)
                        .collect(),
                };
                d = if nesterov {
                    d.iter().zip(&b).map(|(g, b)| g + momentum * b).collect()
                } else {
                    b.clone()
                };
                buf = Some(b);
            }
            p = p.iter().zip(&d).map(|(p, d)| p - lr * d).collect();
            let a = at(&[
                ("lr", float(lr)),
                ("momentum", float(momentum)),
                ("dampening", float(dampening)),
                ("weight_decay", float(wd)),
                ("nesterov", flag(nesterov)),
                ("maximize", flag(maximize)),
                ("first_step", flag(step == 0)),
            ]);
            let gt = f64s(&[2, 3], g);
            let mut ins = vec![&pt, &gt];
            if let Some(b) = &bt {
                ins.push(b);
            }
            let o = runv("sgd_step", &ins, &a);
            close(&o[0], &p, 1e-12);
            if momentum != 0.0 {
                close(&o[1], buf.as_ref().unwrap(), 1e-12);
                bt = Some(o[1].clone());
            } else {
                assert_eq!(o[1].numel(), 0);
            }
            pt = o[0].clone();
        }
    }
    // lr as an input gives the same as the attribute.
    let p = f32s(&[3], &[1.0, 2.0, 3.0]);
    let g = f32s(&[3], &[0.5, -0.5, 1.0]);
    let by_attr = runv("sgd_step", &[&p, &g], &at(&[("lr", float(0.25))]));
    let by_input = runv("sgd_step", &[&p, &g, &f32s(&[], &[0.25])], &Attrs::new());
    assert_eq!(by_attr, by_input);
    close(&by_attr[0], &[0.875, 2.125, 2.75], 0.0);
    let e = err(
        "sgd_step",
        &[&p, &g],
        &at(&[("lr", float(0.1)), ("nesterov", flag(true))]),
    );
    assert!(e.contains("nesterov"), "{e}");
}

#[test]
fn adamw_step_follows_torch_optim_adamw() {
    let mut r = Lcg(16);
    let n = 5;
    let p0 = r.vec(n);
    let grads: Vec<Vec<f64>> = (0..4).map(|_| r.vec(n)).collect();
    let (lr, b1, b2, eps, wd): (f64, f64, f64, f64, f64) = (1e-2, 0.9, 0.99, 1e-8, 0.1);
    for (amsgrad, maximize) in [(false, false), (true, true)] {
        let mut p = p0.clone();
        let mut m = vec![0.0; n];
        let mut v = vec![0.0; n];
        let mut vmax = vec![0.0; n];
        let mut ts = vec![
            f64s(&[n as u64], &p0),
            f64s(&[n as u64], &m),
            f64s(&[n as u64], &v),
            f64s(&[n as u64], &vmax),
        ];
        for (k, g) in grads.iter().enumerate() {
            let step = (k + 1) as f64;
            let bc1 = 1.0 - b1.powf(step);
            let bc2 = 1.0 - b2.powf(step);
            for i in 0..n {
                let gi = if maximize { -g[i] } else { g[i] };
                p[i] *= 1.0 - lr * wd;
                m[i] += (1.0 - b1) * (gi - m[i]);
                v[i] = v[i] * b2 + (1.0 - b2) * gi * gi;
                vmax[i] = vmax[i].max(v[i]);
                let second = if amsgrad { vmax[i] } else { v[i] };
                let denom = second.sqrt() / bc2.sqrt() + eps;
                p[i] += -(lr / bc1) * m[i] / denom;
            }
            let a = at(&[
                ("lr", float(lr)),
                ("beta1", float(b1)),
                ("beta2", float(b2)),
                ("eps", float(eps)),
                ("weight_decay", float(wd)),
                ("step", int(k as i64 + 1)),
                ("amsgrad", flag(amsgrad)),
                ("maximize", flag(maximize)),
            ]);
            let gt = f64s(&[n as u64], g);
            let mut ins = vec![&ts[0], &gt, &ts[1], &ts[2]];
            if amsgrad {
                ins.push(&ts[3]);
            }
            let o = runv("adamw_step", &ins, &a);
            // step and lr as inputs: the same numbers.
            let mut with_inputs = a.clone();
            with_inputs.set("step", Attr::None);
            with_inputs.set("lr", Attr::None);
            let (st, lt) = (f64s(&[], &[step]), f64s(&[], &[lr]));
            let mut ins2 = ins.clone();
            ins2.extend([&st, &lt]);
            let o2 = runv("adamw_step", &ins2, &with_inputs);
            for (x, y) in o.iter().zip(&o2) {
                close(y, &x.to_f64_vec(), 1e-14);
            }
            close(&o[0], &p, 1e-12);
            close(&o[1], &m, 1e-12);
            close(&o[2], &v, 1e-12);
            if amsgrad {
                close(&o[3], &vmax, 1e-12);
                ts = o;
            } else {
                ts = vec![o[0].clone(), o[1].clone(), o[2].clone(), ts[3].clone()];
            }
        }
    }
    // bf16 param with f32 states: f32 inside, each output keeps its dtype.
    let p = t(DType::BF16, &[2], &[1.0, -1.0]);
    let g = t(DType::BF16, &[2], &[0.5, 0.5]);
    let z = f32s(&[2], &[0.0, 0.0]);
    let a = at(&[
        ("lr", float(0.1)),
        ("step", int(1)),
        ("weight_decay", float(0.0)),
    ]);
    let o = runv("adamw_step", &[&p, &g, &z, &z], &a);
    assert_eq!(
        [o[0].ty.dtype, o[1].ty.dtype, o[2].ty.dtype],
        [DType::BF16, DType::F32, DType::F32]
    );
    // The first step moves each element by about lr * sign(g).
    close(&o[0], &[0.9, -1.1], 4e-3);
    let e = err("adamw_step", &[&p, &g, &z, &z], &at(&[("lr", float(0.1))]));
    assert!(e.contains("adamw_step") && e.contains("step"), "{e}");
    let e = err("adamw_step", &[&p, &g, &z, &f32s(&[3], &[0.0; 3])], &a);
    assert!(e.contains("exp_avg_sq"), "{e}");
}

#[test]
fn empty_inputs() {
    let x = f32s(&[0, 3], &[]);
    let target = i64s(&[0], &[]);
    let o = runv("nll_loss", &[&x, &target], &Attrs::new());
    assert!(o[0].get_f64(0).is_nan());
    let o = run1("nll_loss", &[&x, &target], &at(&[("reduction", s("sum"))]));
    close(&o, &[0.0], 0.0);
    let o = run1(
        "cross_entropy",
        &[&x, &target],
        &at(&[("reduction", s("none"))]),
    );
    assert_eq!(o.ty.dims, vec![0]);
    let o = runv(
        "dropout",
        &[&x],
        &at(&[("p", float(0.5)), ("seed", int(1))]),
    );
    assert_eq!(o[0].ty.dims, vec![0, 3]);
    // Attention over zero keys: zeros and a logsumexp of -inf.
    let q = f32s(&[1, 2, 2], &[1.0; 4]);
    let k = f32s(&[1, 0, 2], &[]);
    let v = f32s(&[1, 0, 3], &[]);
    let o = runv("scaled_dot_product_attention", &[&q, &k, &v], &Attrs::new());
    close(&o[0], &[0.0; 6], 0.0);
    close(&o[1], &[f64::NEG_INFINITY; 2], 0.0);
    // Convolution of an empty batch.
    let xc = f32s(&[0, 2, 5], &[]);
    let w = f32s(&[3, 2, 2], &[0.5; 12]);
    let y = run1("conv1d", &[&xc, &w], &Attrs::new());
    assert_eq!(y.ty.dims, vec![0, 3, 4]);
    let g = runv("convolution_backward", &[&y, &xc, &w], &Attrs::new());
    assert_eq!(g[0].ty.dims, vec![0, 2, 5]);
    close(&g[1], &[0.0; 12], 0.0);
    // Bags over no indices.
    let wt = f32s(&[3, 2], &[1.0; 6]);
    let o = runv(
        "embedding_bag",
        &[&wt, &i64s(&[0], &[]), &i64s(&[2], &[0, 0])],
        &at(&[("mode", s("max"))]),
    );
    close(&o[0], &[0.0; 4], 0.0);
    let o = run1(
        "embedding_backward",
        &[&f32s(&[0, 2], &[]), &i64s(&[0], &[])],
        &at(&[("num_weights", int(3))]),
    );
    close(&o, &[0.0; 6], 0.0);
}

/// multi_margin_loss by its definition: per sample Σ_{j ≠ y} w[y]
/// max(0, margin - x[y] + x[j])^p / C.
fn multi_margin_ref(
    x: &[f64],
    c: usize,
    y: &[i64],
    w: Option<&[f64]>,
    p: i32,
    margin: f64,
) -> Vec<f64> {
    y.iter()
        .enumerate()
        .map(|(n, &t)| {
            let row = &x[n * c..(n + 1) * c];
            let t = t as usize;
            let wy = w.map_or(1.0, |w| w[t]);
            let sum: f64 = (0..c)
                .filter(|&j| j != t)
                .map(|j| wy * (margin - row[t] + row[j]).max(0.0).powi(p))
                .sum();
            sum / c as f64
        })
        .collect()
}

/// multilabel_margin_loss by its definition: the listed classes end at
/// the first -1; Σ over listed j and unlisted k of max(0, 1 - (x[t_j] -
/// x[k])) / C.
fn multilabel_ref(x: &[f64], c: usize, t: &[i64]) -> (Vec<f64>, Vec<f64>) {
    let n = x.len() / c;
    let mut is_target = vec![0.0; n * c];
    let loss = (0..n)
        .map(|s| {
            let row = &x[s * c..(s + 1) * c];
            let listed: Vec<usize> = t[s * c..(s + 1) * c]
                .iter()
                .take_while(|&&v| v != -1)
                .map(|&v| v as usize)
                .collect();
            for &j in &listed {
                is_target[s * c + j] = 1.0;
            }
            let mut sum = 0.0;
            for &j in &listed {
                for k in (0..c).filter(|k| !listed.contains(k)) {
                    sum += (1.0 - (row[j] - row[k])).max(0.0);
                }
            }
            sum / c as f64
        })
        .collect();
    (loss, is_target)
}

#[test]
fn margin_losses_match_their_definitions_and_numerical_gradients() {
    let mut r = Lcg(31);
    let (n, c) = (3, 4);
    let xv: Vec<f64> = r.vec(n * c).iter().map(|v| v * 1.5).collect();
    let x = f64s(&[3, 4], &xv);
    let y = i64s(&[3], &[0, 3, 1]);
    let wv = [0.5, 1.5, 1.0, 2.0];
    let w = f64s(&[4], &wv);
    let gv = r.vec(n);
    let g = f64s(&[3], &gv);
    for p in [1, 2] {
        for weighted in [false, true] {
            let ins = if weighted {
                vec![x.clone(), y.clone(), w.clone()]
            } else {
                vec![x.clone(), y.clone()]
            };
            let refs: Vec<&HostTensor> = ins.iter().collect();
            let want = multi_margin_ref(&xv, c, &[0, 3, 1], weighted.then_some(&wv[..]), p, 0.7);
            let a = at(&[
                ("p", int(p as i64)),
                ("margin", float(0.7)),
                ("reduction", s("none")),
            ]);
            close(&run1("multi_margin_loss", &refs, &a), &want, 1e-12);
            let a_sum = a.clone().with("reduction", s("sum"));
            close(
                &run1("multi_margin_loss", &refs, &a_sum),
                &[want.iter().sum()],
                1e-12,
            );
            let a_mean = a.clone().with("reduction", s("mean"));
            let mean = want.iter().sum::<f64>() / n as f64;
            close(&run1("multi_margin_loss", &refs, &a_mean), &[mean], 1e-12);
            let mut bins = vec![&g];
            bins.extend(refs.iter().copied());
            let grad = run1("multi_margin_loss_backward", &bins, &a);
            close(
                &grad,
                &numeric_grad("multi_margin_loss", &ins, &a, 0, &gv, 0),
                1e-6,
            );
            // mean: the scalar grad over N.
            let half = f64s(&[], &[0.5]);
            let mut bins = vec![&half];
            bins.extend(refs.iter().copied());
            let grad = run1("multi_margin_loss_backward", &bins, &a_mean);
            let want = numeric_grad("multi_margin_loss", &ins, &a_mean, 0, &[0.5], 0);
            close(&grad, &want, 1e-6);
        }
    }
    // One sample as a [C] input and a 0-d target; a bad p.
    let one = f64s(&[4], &xv[4..8]);
    let a = at(&[("reduction", s("none"))]);
    let got = run1("multi_margin_loss", &[&one, &i64s(&[], &[3])], &a);
    assert_eq!(got.ty.dims, Vec::<u64>::new());
    close(
        &got,
        &multi_margin_ref(&xv[4..8], c, &[3], None, 1, 1.0),
        1e-12,
    );
    let e = err("multi_margin_loss", &[&x, &y], &at(&[("p", int(3))]));
    assert!(e.contains("only p == 1 and p == 2"), "{e}");
    let e = err(
        "multi_margin_loss",
        &[&x, &i64s(&[2], &[0, 1])],
        &Attrs::new(),
    );
    assert!(e.contains("inconsistent target size"), "{e}");

    let tv = [3, 0, -1, 1, 1, 2, 3, 0, -1, 0, 0, 0];
    let t = i64s(&[3, 4], &tv);
    let (want, want_is) = multilabel_ref(&xv, c, &tv);
    let a = at(&[("reduction", s("none"))]);
    let out = runv("multilabel_margin_loss", &[&x, &t], &a);
    close(&out[0], &want, 1e-12);
    close(&out[1], &want_is, 0.0);
    assert_eq!(out[1].dtype(), DType::F64);
    let grad = run1(
        "multilabel_margin_loss_backward",
        &[&g, &x, &t, &out[1]],
        &a,
    );
    let ins = [x.clone(), t.clone()];
    close(
        &grad,
        &numeric_grad("multilabel_margin_loss", &ins, &a, 0, &gv, 0),
        1e-6,
    );
    let a_mean = at(&[("reduction", s("mean"))]);
    let m = run1("multilabel_margin_loss", &[&x, &t], &a_mean);
    close(&m, &[want.iter().sum::<f64>() / n as f64], 1e-12);
    let half = f64s(&[], &[0.5]);
    let grad = run1(
        "multilabel_margin_loss_backward",
        &[&half, &x, &t, &out[1]],
        &a_mean,
    );
    let want = numeric_grad("multilabel_margin_loss", &ins, &a_mean, 0, &[0.5], 0);
    close(&grad, &want, 1e-6);
    let e = err("multilabel_margin_loss", &[&x, &i64s(&[3], &[0, 1, 2])], &a);
    assert!(e.contains("inconsistent target size"), "{e}");
}

#[test]
fn renorm_and_weight_norm_match_their_definitions() {
    let mut r = Lcg(32);
    let xv: Vec<f64> = r.vec(24).iter().map(|v| v * 2.0).collect();
    let x = f64s(&[3, 4, 2], &xv);
    // renorm along dim 0, p = 3: each [4, 2] slice's 3-norm to at most 1.
    let a = at(&[("p", float(3.0)), ("dim", int(0)), ("maxnorm", float(1.0))]);
    let want: Vec<f64> = xv
        .chunks(8)
        .flat_map(|s| {
            let norm = s.iter().map(|v| v.abs().powi(3)).sum::<f64>().cbrt();
            let f = if norm > 1.0 { 1.0 / (norm + 1e-7) } else { 1.0 };
            s.iter().map(move |v| v * f).collect::<Vec<_>>()
        })
        .collect();
    close(&run1("renorm", &[&x], &a), &want, 1e-12);
    let e = err(
        "renorm",
        &[&x],
        &at(&[("p", float(0.0)), ("dim", int(0)), ("maxnorm", float(1.0))]),
    );
    assert!(e.contains("non-positive-norm"), "{e}");
    let e = err("renorm", &[&f64s(&[3], &xv[..3])], &a);
    assert!(e.contains("at least 2 dimensions"), "{e}");

    // embedding_renorm: the rows named (row 2 twice), each above max_norm
    // 1.5 (its 1-norm) scaled to it.
    let table = f64s(&[6, 4], &xv[..24]);
    let idx = i64s(&[2, 2], &[0, 2, 2, 5]);
    let a = at(&[("max_norm", float(1.5)), ("norm_type", float(1.0))]);
    let got = run1("embedding_renorm", &[&table, &idx], &a);
    assert_eq!(got.ty.dims, vec![4, 4]);
    let want: Vec<f64> = [0usize, 2, 2, 5]
        .iter()
        .flat_map(|&r| {
            let row = &xv[r * 4..r * 4 + 4];
            let norm: f64 = row.iter().map(|v| v.abs()).sum();
            let f = if norm > 1.5 { 1.5 / (norm + 1e-7) } else { 1.0 };
            row.iter().map(move |v| v * f).collect::<Vec<_>>()
        })
        .collect();
    close(&got, &want, 1e-12);
    let e = err("embedding_renorm", &[&table, &f64s(&[1], &[0.0])], &a);
    assert!(e.contains("int or long"), "{e}");

    // weight_norm over every dim but 0, and its backward.
    let v = f64s(&[3, 8], &xv);
    let gv = [0.5, -1.0, 2.0];
    let g = f64s(&[3, 1], &gv);
    let a = at(&[("dim", int(0))]);
    let out = runv("weight_norm", &[&v, &g], &a);
    let norms: Vec<f64> = xv
        .chunks(8)
        .map(|s| s.iter().map(|v| v * v).sum::<f64>().sqrt())
        .collect();
    close(&out[1], &norms, 1e-12);
    let want: Vec<f64> = (0..24).map(|i| xv[i] * gv[i / 8] / norms[i / 8]).collect();
    close(&out[0], &want, 1e-12);
    let cot = r.vec(24);
    let gw = f64s(&[3, 8], &cot);
    let grads = runv("weight_norm_backward", &[&gw, &v, &g, &out[1]], &a);
    let ins = [v.clone(), g.clone()];
    close(
        &grads[0],
        &numeric_grad("weight_norm", &ins, &a, 0, &cot, 0),
        1e-6,
    );
    close(
        &grads[1],
        &numeric_grad("weight_norm", &ins, &a, 0, &cot, 1),
        1e-6,
    );
    // Along the last dim; bf16 keeps f32 norms.
    let g1 = f64s(&[1, 8], &[1.0; 8]);
    let out = runv("weight_norm", &[&v, &g1], &at(&[("dim", int(1))]));
    assert_eq!(out[1].ty.dims, vec![1, 8]);
    let vh = t(DType::BF16, &[3, 8], &xv);
    let out = runv("weight_norm", &[&vh, &t(DType::BF16, &[3, 1], &gv)], &a);
    assert_eq!((out[0].dtype(), out[1].dtype()), (DType::BF16, DType::F32));
    let e = err("weight_norm", &[&v, &g], &at(&[("dim", int(2))]));
    assert!(e.contains("out of range"), "{e}");
    let e = err("weight_norm", &[&v, &g1], &a);
    assert!(e.contains("g must have shape"), "{e}");
}

#[test]
fn pdist_is_the_upper_triangle_of_cdist_with_its_gradient() {
    let mut r = Lcg(33);
    let mut xv = r.vec(15);
    // Rows 1 and 3 equal: a zero distance, whose gradient is 0.
    let row1 = xv[3..6].to_vec();
    xv[9..12].copy_from_slice(&row1);
    let x = f64s(&[5, 3], &xv);
    for p in [2.0, 1.0, 3.0, f64::INFINITY] {
        let a = at(&[("p", float(p))]);
        let want: Vec<f64> = (0..5)
            .flat_map(|i| (i + 1..5).map(move |j| (i, j)))
            .map(|(i, j)| {
                let d = (0..3).map(|k| (xv[i * 3 + k] - xv[j * 3 + k]).abs());
                if p == f64::INFINITY {
                    d.fold(0.0, f64::max)
                } else {
                    d.map(|v| v.powf(p)).sum::<f64>().powf(1.0 / p)
                }
            })
            .collect();
        let got = run1("pdist", &[&x], &a);
        close(&got, &want, 1e-12);
        if p.is_finite() {
            let y = f64s(&[5, 3], &r.vec(15));
            let cot = r.vec(10);
            let d = run1("pdist", &[&y], &a);
            let grad = run1("pdist_backward", &[&f64s(&[10], &cot), &y, &d], &a);
            close(
                &grad,
                &numeric_grad("pdist", std::slice::from_ref(&y), &a, 0, &cot, 0),
                1e-6,
            );
        }
    }
    let one = run1("pdist", &[&f64s(&[1, 3], &xv[..3])], &Attrs::new());
    assert_eq!(one.ty.dims, vec![0]);
    let e = err("pdist", &[&f64s(&[15], &xv)], &Attrs::new());
    assert!(e.contains("only supports 2D"), "{e}");
}

#[test]
fn max_unpool_places_values_at_their_indices() {
    // [1, 2, 2, 2] values into 3 x 3 planes.
    let x = f32s(&[1, 2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let idx = i64s(&[1, 2, 2, 2], &[0, 2, 6, 8, 4, 4, 1, 3]);
    let a = at(&[("output_size", ints(&[3, 3]))]);
    let got = run1("max_unpool", &[&x, &idx], &a);
    assert_eq!(got.ty.dims, vec![1, 2, 3, 3]);
    let mut want = vec![0.0; 18];
    for (k, &i) in [0usize, 2, 6, 8].iter().enumerate() {
        want[i] = (k + 1) as f64;
    }
    // The second plane: 4 twice (the later value, 6, wins), 1 and 3.
    want[9 + 4] = 6.0;
    want[9 + 1] = 7.0;
    want[9 + 3] = 8.0;
    close(&got, &want, 0.0);
    // Unbatched 3-d.
    let x3 = f32s(&[1, 1, 1, 2], &[5.0, 6.0]);
    let i3 = i64s(&[1, 1, 1, 2], &[7, 0]);
    let got = run1(
        "max_unpool",
        &[&x3, &i3],
        &at(&[("output_size", ints(&[2, 2, 2]))]),
    );
    close(&got, &[6.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0], 0.0);
    let e = err("max_unpool", &[&x, &f32s(&[1, 2, 2, 2], &[0.0; 8])], &a);
    assert!(e.contains("int64"), "{e}");
    let e = err("max_unpool", &[&x, &i64s(&[1, 2, 4], &[0; 8])], &a);
    assert!(e.contains("same as that of the input"), "{e}");
    let e = run(
        "max_unpool",
        &[&x, &i64s(&[1, 2, 2, 2], &[0, 0, 0, 9, 0, 0, 0, 0])],
        &a,
    )
    .unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
}

#[test]
fn nonzero_static_lists_coordinates_then_fills() {
    let x = f32s(&[2, 3], &[0.0, 3.0, 0.0, 1.0, 0.0, 2.0]);
    let nz = |size: i64, fill: i64| {
        let a = at(&[("size", int(size)), ("fill_value", int(fill))]);
        let o = run1("nonzero_static", &[&x], &a);
        assert_eq!(o.ty.dims, vec![size as u64, 2]);
        o.as_slice::<i64>().to_vec()
    };
    assert_eq!(nz(2, -1), vec![0, 1, 1, 0]);
    assert_eq!(nz(3, -1), vec![0, 1, 1, 0, 1, 2]);
    let big = (1i64 << 60) + 1;
    assert_eq!(nz(8, big)[6..], [big; 10][..]);
    assert_eq!(nz(8, big)[..6], [0, 1, 1, 0, 1, 2]);
    let b = t(DType::Bool, &[3], &[1.0, 0.0, 1.0]);
    let o = run1("nonzero_static", &[&b], &at(&[("size", int(2))]));
    assert_eq!(o.as_slice::<i64>(), &[0, 2]);
    let e = err("nonzero_static", &[&x], &at(&[("size", int(-1))]));
    assert!(e.contains("non-negative"), "{e}");
}
