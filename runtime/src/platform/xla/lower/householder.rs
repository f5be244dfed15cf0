//! `Prim::HouseholderQr` and `Prim::HouseholderProduct`, which XLA has no
//! operation for, as StableHLO while loops (the forms of `factor.rs`): one
//! iteration per reflector, each a few whole-matrix operations selected by
//! the step number, so the module's size does not grow with the matrix.
//!
//! Batch dims are flattened to one, B. Column j's reflector is formed as
//! the host kernel forms it (LAPACK's larfg): alpha the diagonal element,
//! beta = -sign(alpha) ‖col[j..]‖, tau = (beta - alpha) / beta and v =
//! col[j + 1..] / (alpha - beta); a column zero below the diagonal gets
//! tau 0. A reflector is applied as A - tau v (vᵀ A).

use super::factor::{batch_matrix, while_loop, Text, I64};
use super::{elem, shaped};
use crate::ir::DType;

/// The shapes one step works in: the matrix [B, m, n], a column [B, m],
/// a row [B, n], one per batch element [B]; each of element `e`, i1 and
/// i64.
struct Shapes {
    b: u64,
    m: u64,
    mat: [String; 3],
    col: [String; 3],
    row: String,
    per: [String; 2],
    scalar: String,
}

impl Shapes {
    fn new(b: u64, m: u64, n: u64, e: &str) -> Shapes {
        let three = |d: &[u64]| [shaped(d, e), shaped(d, "i1"), shaped(d, "i64")];
        Shapes {
            b,
            m,
            mat: three(&[b, m, n]),
            col: three(&[b, m]),
            row: shaped(&[b, n], e),
            per: [shaped(&[b], e), shaped(&[b], "i1")],
            scalar: format!("tensor<{e}>"),
        }
    }
}

/// The reflector of column `j` (an i64 scalar) of `a`, as the column's
/// vector `{x}_v` [B, m] (zeros above row j, 1 at j, v below) with, for
/// the QR step, `{x}_alpha`, `{x}_beta`, `{x}_tau` and `{x}_triv` [B].
/// With `stored`, the column holds v below the diagonal already (the
/// product's input): no norms, tau read by the caller.
fn column_vector(t: &mut Text, x: &str, a: &str, j: &str, s: &Shapes, e: &str, stored: bool) {
    let v = |n: &str| format!("{x}_{n}");
    let [mt, _, _] = &s.mat;
    let [ct, cb, ci] = &s.col;
    let [pt, pb] = &s.per;
    t.constant(&v("i0"), "0", I64);
    t.slice_at(
        &v("col"),
        a,
        &[&v("i0"), &v("i0"), j],
        &[s.b, s.m, 1],
        mt,
        e,
        ct,
    );
    t.iota(&v("ri"), 1, ci);
    t.broadcast(&v("jc"), j, "", I64, ci);
    t.compare(&v("isj"), "EQ", &v("ri"), &v("jc"), "SIGNED", ci, cb);
    t.compare(&v("below"), "GT", &v("ri"), &v("jc"), "SIGNED", ci, cb);
    t.constant(&v("zc"), "0.0", ct);
    t.constant(&v("oc"), "1.0", ct);
    t.select(&v("unit"), &v("isj"), &v("oc"), &v("zc"), cb, ct);
    if stored {
        t.select(&v("v"), &v("below"), &v("col"), &v("unit"), cb, ct);
        return;
    }
    // alpha exactly: a sum of one term with -0.0 as filler and start.
    t.constant(&v("nzc"), "-0.0", ct);
    t.constant(&v("nz"), "-0.0", &s.scalar);
    t.constant(&v("z"), "0.0", &s.scalar);
    t.select(&v("am"), &v("isj"), &v("col"), &v("nzc"), cb, ct);
    t.reduce_dim1(
        &v("alpha"),
        &v("am"),
        &v("nz"),
        "stablehlo.add",
        &s.scalar,
        ct,
        pt,
    );
    t.apply(
        &v("sq"),
        "stablehlo.multiply",
        &format!("{0}, {0}", v("col")),
        ct,
    );
    t.select(&v("sqb"), &v("below"), &v("sq"), &v("zc"), cb, ct);
    t.reduce_dim1(
        &v("xn2"),
        &v("sqb"),
        &v("z"),
        "stablehlo.add",
        &s.scalar,
        ct,
        pt,
    );
    t.apply(
        &v("asq"),
        "stablehlo.multiply",
        &format!("{0}, {0}", v("alpha")),
        pt,
    );
    t.apply(
        &v("n2"),
        "stablehlo.add",
        &format!("{}, {}", v("asq"), v("xn2")),
        pt,
    );
    t.apply(&v("norm"), "stablehlo.sqrt", &v("n2"), pt);
    t.apply(&v("negn"), "stablehlo.negate", &v("norm"), pt);
    t.constant(&v("zp"), "0.0", pt);
    t.constant(&v("op"), "1.0", pt);
    t.compare(&v("neg"), "LT", &v("alpha"), &v("zp"), "FLOAT", pt, pb);
    t.select(&v("beta"), &v("neg"), &v("norm"), &v("negn"), pb, pt);
    t.compare(&v("triv"), "EQ", &v("xn2"), &v("zp"), "FLOAT", pt, pb);
    // Where trivial, beta is replaced by 1 in the divisions (their results
    // are not used).
    t.select(&v("bd"), &v("triv"), &v("op"), &v("beta"), pb, pt);
    t.apply(
        &v("bma"),
        "stablehlo.subtract",
        &format!("{}, {}", v("bd"), v("alpha")),
        pt,
    );
    t.apply(
        &v("tq"),
        "stablehlo.divide",
        &format!("{}, {}", v("bma"), v("bd")),
        pt,
    );
    t.select(&v("tau"), &v("triv"), &v("zp"), &v("tq"), pb, pt);
    t.apply(
        &v("amb"),
        "stablehlo.subtract",
        &format!("{}, {}", v("alpha"), v("bd")),
        pt,
    );
    t.apply(
        &v("sc"),
        "stablehlo.divide",
        &format!("{}, {}", v("op"), v("amb")),
        pt,
    );
    t.select(&v("scl"), &v("triv"), &v("zp"), &v("sc"), pb, pt);
    t.broadcast(&v("sclb"), &v("scl"), "0", pt, ct);
    t.apply(
        &v("vs"),
        "stablehlo.multiply",
        &format!("{}, {}", v("col"), v("sclb")),
        ct,
    );
    t.select(&v("v"), &v("below"), &v("vs"), &v("unit"), cb, ct);
}

/// `{x}_q1` = q - tau (v (vᵀ q)) for the column vector `{x}_v` [B, m]
/// and `tau` [B], q [B, m, n]; with `cols_after` (an i64 scalar), only
/// the columns right of it change.
fn reflect(t: &mut Text, x: &str, q: &str, tau: &str, s: &Shapes, cols_after: Option<&str>) {
    let v = |n: &str| format!("{x}_{n}");
    let [mt, mb, mi] = &s.mat;
    let ct = &s.col[0];
    let pt = &s.per[0];
    t.line(format!(
        "{} = stablehlo.dot_general {}, {q}, batching_dims = [0] x [0], contracting_dims = [1] x [1], precision = [HIGHEST, HIGHEST] : ({ct}, {mt}) -> {}",
        v("w"),
        v("v"),
        s.row
    ));
    t.broadcast(&v("vb"), &v("v"), "0, 1", ct, mt);
    t.broadcast(&v("wb"), &v("w"), "0, 2", &s.row, mt);
    t.broadcast(&v("tb"), tau, "0", pt, mt);
    t.apply(
        &v("vw"),
        "stablehlo.multiply",
        &format!("{}, {}", v("vb"), v("wb")),
        mt,
    );
    t.apply(
        &v("tvw"),
        "stablehlo.multiply",
        &format!("{}, {}", v("tb"), v("vw")),
        mt,
    );
    match cols_after {
        None => t.apply(
            &v("q1"),
            "stablehlo.subtract",
            &format!("{q}, {}", v("tvw")),
            mt,
        ),
        Some(j) => {
            t.apply(
                &v("upd"),
                "stablehlo.subtract",
                &format!("{q}, {}", v("tvw")),
                mt,
            );
            t.iota(&v("cols"), 2, mi);
            t.broadcast(&v("ja"), j, "", I64, mi);
            t.compare(&v("right"), "GT", &v("cols"), &v("ja"), "SIGNED", mi, mb);
            t.select(&v("q1"), &v("right"), &v("upd"), q, mb, mt);
        }
    }
}

/// HouseholderQr of `input` (typed `it`, dims [b.., m, n], of `d`) into
/// the values `outs` (qr, tau) typed `out_types`.
pub(super) fn householder_qr(
    w: &mut dyn FnMut(String),
    input: &str,
    it: &str,
    dims: &[u64],
    d: DType,
    outs: [&str; 2],
    out_types: [&str; 2],
) {
    let t = &mut Text { w };
    let (b, m, n) = batch_matrix(dims);
    let k = m.min(n);
    let x = format!("{}_qr", outs[0]);
    let e = elem(d);
    let s = Shapes::new(b, m, n, e);
    let at = s.mat[0].clone();
    let tt = shaped(&[b, k], e);
    t.reshape(&format!("{x}_a0"), input, it, &at);
    t.constant(&format!("{x}_t0"), "0.0", &tt);
    let (a, tau) = if k == 0 || b == 0 {
        (format!("{x}_a0"), format!("{x}_t0"))
    } else {
        let (a0, t0) = (format!("{x}_a0"), format!("{x}_t0"));
        let types = [at.clone(), tt.clone()];
        while_loop(t, &x, k, &[&a0, &t0], &types, |t| {
            let v = |n: &str| format!("{x}_{n}");
            let j = v("k");
            column_vector(t, &x, &v("c1"), &j, &s, e, false);
            reflect(t, &x, &v("c1"), &v("tau"), &s, Some(&j));
            // Column j: v below the diagonal, beta on it (alpha where the
            // reflector is the identity).
            let [ct, cb, _] = &s.col;
            let [pt, pb] = &s.per;
            t.select(&v("dg"), &v("triv"), &v("alpha"), &v("beta"), pb, pt);
            t.broadcast(&v("dgb"), &v("dg"), "0", pt, ct);
            t.select(&v("c_at"), &v("isj"), &v("dgb"), &v("col"), cb, ct);
            t.select(&v("newc"), &v("below"), &v("v"), &v("c_at"), cb, ct);
            let [mt, mb, mi] = &s.mat;
            t.compare(&v("atj"), "EQ", &v("cols"), &v("ja"), "SIGNED", mi, mb);
            t.broadcast(&v("newb"), &v("newc"), "0, 1", ct, mt);
            t.select(&v("a2"), &v("atj"), &v("newb"), &v("q1"), mb, mt);
            let (tb, ti) = (shaped(&[b, k], "i1"), shaped(&[b, k], "i64"));
            t.iota(&v("ti"), 1, &ti);
            t.broadcast(&v("jt"), &j, "", I64, &ti);
            t.compare(&v("att"), "EQ", &v("ti"), &v("jt"), "SIGNED", &ti, &tb);
            t.broadcast(&v("taub"), &v("tau"), "0", pt, &tt);
            t.select(&v("t1"), &v("att"), &v("taub"), &v("c2"), &tb, &tt);
            vec![v("a2"), v("t1")]
        });
        (format!("{x}_w#1"), format!("{x}_w#2"))
    };
    t.reshape(outs[0], &a, &at, out_types[0]);
    t.reshape(outs[1], &tau, &tt, out_types[1]);
}

/// HouseholderProduct of `input` (typed `it`, dims [b.., m, n], of `d`)
/// and `tau` (typed `tt`, [b.., k]) into `out` (typed `ot`): from the
/// identity's first n columns, reflector k - 1 first.
#[allow(clippy::too_many_arguments)]
pub(super) fn householder_product(
    w: &mut dyn FnMut(String),
    input: &str,
    it: &str,
    dims: &[u64],
    d: DType,
    tau: &str,
    tt: &str,
    k: u64,
    out: &str,
    ot: &str,
) {
    let t = &mut Text { w };
    let (b, m, n) = batch_matrix(dims);
    let x = format!("{out}_hp");
    let e = elem(d);
    let s = Shapes::new(b, m, n, e);
    let [mt, mb, mi] = s.mat.clone();
    let kt = shaped(&[b, k], e);
    t.reshape(&format!("{x}_a"), input, it, &mt);
    t.reshape(&format!("{x}_tau"), tau, tt, &kt);
    t.identity(&format!("{x}_q0"), &mt, &mb, &mi);
    let q = if k == 0 || b == 0 || n == 0 {
        format!("{x}_q0")
    } else {
        let q0 = format!("{x}_q0");
        while_loop(t, &x, k, &[&q0], std::slice::from_ref(&mt), |t| {
            let v = |n: &str| format!("{x}_{n}");
            // j = k - 1 - step.
            t.constant(&v("last"), &(k - 1).to_string(), I64);
            t.apply(
                &v("j"),
                "stablehlo.subtract",
                &format!("{}, {}", v("last"), v("k")),
                I64,
            );
            column_vector(t, &x, &v("a"), &v("j"), &s, e, true);
            t.slice_at(
                &v("tj"),
                &v("tau"),
                &[&v("i0"), &v("j")],
                &[b, 1],
                &kt,
                e,
                &s.per[0],
            );
            reflect(t, &x, &v("c1"), &v("tj"), &s, None);
            vec![v("q1")]
        });
        format!("{x}_w#1")
    };
    t.reshape(out, &q, &mt, ot);
}
