//! `Prim::Jacobi`, which XLA has no operation for, as one StableHLO while
//! loop whose iterations are the host kernel's rounds
//! (`platform/host/kernels/jacobi.rs`), in the same arithmetic.
//!
//! The matrix is kept in slot order, so that a slot's partner is its
//! mirror: the partner's row (or column) is the matrix reversed along
//! that dim, and the shift between rounds is three static slices
//! concatenated. The loop carries the matrix, v, the slot order (which
//! original index each slot holds) and whether the sweep so far rotated
//! anything; it stops at a sweep's start when the last sweep rotated
//! nothing, or after `MAX_SWEEPS`. The columns are put back in their
//! original order at the end by a product with the 0/1 permutation
//! matrix. An odd n gets one padding index of zeros, which no rotation
//! touches (its off elements are 0) and which is sliced off at the end.

use super::factor::{batch_matrix, while_loop_until, Text, I64};
use super::{elem, shaped};
use crate::ir::DType;
use crate::platform::host::kernels::JACOBI_MAX_SWEEPS;

/// Jacobi of `input` (typed `it`, dims [b.., m, n], of `d`) into the
/// values `outs` typed `out_types`: (w, v) two-sided, (a v, v) one-sided.
#[allow(clippy::too_many_arguments)]
pub(super) fn jacobi(
    w: &mut dyn FnMut(String),
    input: &str,
    it: &str,
    dims: &[u64],
    d: DType,
    two_sided: bool,
    outs: [&str; 2],
    out_types: [&str; 2],
) {
    let t = &mut Text { w };
    let (b, m, n) = batch_matrix(dims);
    let x = format!("{}_jc", outs[0]);
    let v = |s: &str| format!("{x}_{s}");
    let e = elem(d);
    let slots = n + n % 2;
    let rows = if two_sided { slots } else { m };
    let (at0, at) = (shaped(&[b, m, n], e), shaped(&[b, rows, slots], e));
    let (vt, vb, vi) = (
        shaped(&[b, slots, slots], e),
        shaped(&[b, slots, slots], "i1"),
        shaped(&[b, slots, slots], "i64"),
    );
    let pt = shaped(&[b, slots], e);
    let st = format!("tensor<{e}>");
    let ot = shaped(&[slots], "i64");
    t.reshape(&v("a0"), input, it, &at0);
    // The padding index (zeros) of an odd n.
    if slots != n || rows != m {
        t.constant(&v("z"), "0.0", &st);
        t.line(format!(
            "{} = \"stablehlo.pad\"({}, {}) {{edge_padding_low = array<i64: 0, 0, 0>, edge_padding_high = array<i64: 0, {}, {}>, interior_padding = array<i64: 0, 0, 0>}} : ({at0}, {st}) -> {at}",
            v("a"),
            v("a0"),
            v("z"),
            rows - m,
            slots - n
        ));
    } else {
        t.reshape(&v("a"), &v("a0"), &at0, &at);
    }
    t.identity(&v("v0"), &vt, &vb, &vi);
    t.iota(&v("o0"), 0, &ot);
    t.constant(&v("r0"), "false", "tensor<i1>");
    let rounds = slots.saturating_sub(1);
    let (a, vv, order) = if n < 2 || b == 0 {
        (v("a"), v("v0"), v("o0"))
    } else {
        let types = [at.clone(), vt.clone(), ot.clone(), "tensor<i1>".to_string()];
        let inits = [v("a"), v("v0"), v("o0"), v("r0")];
        let inits: Vec<&str> = inits.iter().map(String::as_str).collect();
        // Stop at a sweep's start (k a multiple of the rounds, k > 0) when
        // the last sweep rotated nothing.
        let stop = |t: &mut Text| {
            t.constant(&v("qsr"), &rounds.to_string(), I64);
            t.constant(&v("qs0"), "0", I64);
            t.apply(
                &v("qskm"),
                "stablehlo.remainder",
                &format!("{}, {}", v("k"), v("qsr")),
                I64,
            );
            t.compare(
                &v("qsst"),
                "EQ",
                &v("qskm"),
                &v("qs0"),
                "SIGNED",
                I64,
                "tensor<i1>",
            );
            t.compare(
                &v("qspos"),
                "GT",
                &v("k"),
                &v("qs0"),
                "SIGNED",
                I64,
                "tensor<i1>",
            );
            t.apply(&v("qsno"), "stablehlo.not", &v("c4"), "tensor<i1>");
            t.apply(
                &v("qsa"),
                "stablehlo.and",
                &format!("{}, {}", v("qsst"), v("qspos")),
                "tensor<i1>",
            );
            t.apply(
                &v("qhalt"),
                "stablehlo.and",
                &format!("{}, {}", v("qsa"), v("qsno")),
                "tensor<i1>",
            );
            v("qhalt")
        };
        while_loop_until(
            t,
            &x,
            JACOBI_MAX_SWEEPS * rounds,
            &inits,
            &types,
            Some(&stop),
            |t| {
                round(t, &x, two_sided, [b, rows, slots], e, rounds);
                vec![v("ia3"), v("iv2"), v("io2"), v("irot")]
            },
        );
        (v("w#1"), v("w#2"), v("w#3"))
    };
    // Columns back in their original order: P[j][i] = (order[j] == i).
    let (qt, qb, qi) = (
        shaped(&[slots, slots], e),
        shaped(&[slots, slots], "i1"),
        shaped(&[slots, slots], "i64"),
    );
    t.iota(&v("pc"), 1, &qi);
    t.broadcast(&v("pob"), &order, "0", &ot, &qi);
    t.compare(&v("pon"), "EQ", &v("pob"), &v("pc"), "SIGNED", &qi, &qb);
    t.constant(&v("p1"), "1.0", &qt);
    t.constant(&v("p0"), "0.0", &qt);
    t.select(&v("perm"), &v("pon"), &v("p1"), &v("p0"), &qb, &qt);
    let dot = |t: &mut Text, out: &str, lhs: &str, lt: &str, contract: usize, rt: &str| {
        t.line(format!(
            "{out} = stablehlo.dot_general {lhs}, {}, contracting_dims = [{contract}] x [0], precision = [HIGHEST, HIGHEST] : ({lt}, {qt}) -> {rt}",
            v("perm")
        ));
    };
    dot(t, &v("vo"), &vv, &vt, 2, &vt);
    let vn = shaped(&[b, n, n], e);
    t.line(format!(
        "{} = \"stablehlo.slice\"({}) {{start_indices = array<i64: 0, 0, 0>, limit_indices = array<i64: {b}, {n}, {n}>, strides = array<i64: 1, 1, 1>}} : ({vt}) -> {vn}",
        v("vs"),
        v("vo")
    ));
    t.reshape(outs[1], &v("vs"), &vn, out_types[1]);
    if two_sided {
        // The eigenvalues: the diagonal (the identity's mask).
        t.select(&v("dm"), &v("v0_d"), &a, &v("v0_0"), &vb, &vt);
        t.constant(&v("dz"), "0.0", &st);
        t.reduce(
            &v("dg"),
            &v("dm"),
            &v("dz"),
            "stablehlo.add",
            &st,
            &vt,
            &pt,
            "2",
        );
        dot(t, &v("wo"), &v("dg"), &pt, 1, &pt);
        let wn = shaped(&[b, n], e);
        t.line(format!(
            "{} = \"stablehlo.slice\"({}) {{start_indices = array<i64: 0, 0>, limit_indices = array<i64: {b}, {n}>, strides = array<i64: 1, 1>}} : ({pt}) -> {wn}",
            v("ws"),
            v("wo")
        ));
        t.reshape(outs[0], &v("ws"), &wn, out_types[0]);
    } else {
        dot(t, &v("ao"), &a, &at, 2, &at);
        t.line(format!(
            "{} = \"stablehlo.slice\"({}) {{start_indices = array<i64: 0, 0, 0>, limit_indices = array<i64: {b}, {m}, {n}>, strides = array<i64: 1, 1, 1>}} : ({at}) -> {at0}",
            v("as"),
            v("ao")
        ));
        t.reshape(outs[0], &v("as"), &at0, out_types[0]);
    }
}

/// One round on the carried `{x}_c1` (the matrix [B, rows, N]), `{x}_c2`
/// (v), `{x}_c3` (the slot order) and `{x}_c4` (rotated this sweep),
/// defining `{x}_a3`, `{x}_v2`, `{x}_o2` and `{x}_rot`.
fn round(t: &mut Text, x: &str, two_sided: bool, [b, rows, slots]: [u64; 3], e: &str, rounds: u64) {
    let v = |s: &str| format!("{x}_i{s}");
    let carried = |s: &str| format!("{x}_{s}");
    let at = shaped(&[b, rows, slots], e);
    let (ab, ai) = (
        shaped(&[b, rows, slots], "i1"),
        shaped(&[b, rows, slots], "i64"),
    );
    let vt = shaped(&[b, slots, slots], e);
    let (pt, pb, pi) = (
        shaped(&[b, slots], e),
        shaped(&[b, slots], "i1"),
        shaped(&[b, slots], "i64"),
    );
    let st = format!("tensor<{e}>");
    let (a, vv, order) = (carried("c1"), carried("c2"), carried("c3"));
    let bin = |t: &mut Text, out: &str, op: &str, l: &str, r: &str, ty: &str| {
        t.apply(&v(out), op, &format!("{l}, {r}"), ty);
    };
    let rev = |t: &mut Text, out: &str, val: &str, dim: usize, ty: &str| {
        t.line(format!(
            "{} = \"stablehlo.reverse\"({val}) {{dimensions = array<i64: {dim}>}} : ({ty}) -> {ty}",
            v(out)
        ));
    };
    let sum = |t: &mut Text, out: &str, val: &str, dim: &str| {
        t.reduce(&v(out), val, &v("z"), "stablehlo.add", &st, &at, &pt, dim);
    };
    // Rotated this sweep so far: nothing at a sweep's start.
    t.constant(&v("nr"), &rounds.to_string(), I64);
    t.constant(&v("n0"), "0", I64);
    t.apply(
        &v("km"),
        "stablehlo.remainder",
        &format!("{}, {}", carried("k"), v("nr")),
        I64,
    );
    t.compare(
        &v("fresh"),
        "EQ",
        &v("km"),
        &v("n0"),
        "SIGNED",
        I64,
        "tensor<i1>",
    );
    t.constant(&v("f"), "false", "tensor<i1>");
    t.line(format!(
        "{} = stablehlo.select {}, {}, {} : (tensor<i1>, tensor<i1>, tensor<i1>) -> tensor<i1>",
        v("rin"),
        v("fresh"),
        v("f"),
        carried("c4")
    ));
    // Each slot's diagonal element d and off element with its partner.
    t.constant(&v("z"), "0.0", &st);
    t.constant(&v("za"), "0.0", &at);
    if two_sided {
        t.iota(&v("ir"), 1, &ai);
        t.iota(&v("ic"), 2, &ai);
        t.compare(&v("ond"), "EQ", &v("ir"), &v("ic"), "SIGNED", &ai, &ab);
        t.select(&v("dm"), &v("ond"), &a, &v("za"), &ab, &at);
        sum(t, "d", &v("dm"), "2");
        t.constant(&v("last"), &(slots - 1).to_string(), &ai);
        bin(t, "mir", "stablehlo.subtract", &v("last"), &v("ir"), &ai);
        t.compare(&v("one"), "EQ", &v("ic"), &v("mir"), "SIGNED", &ai, &ab);
        t.select(&v("em"), &v("one"), &a, &v("za"), &ab, &at);
        sum(t, "e", &v("em"), "2");
    } else {
        bin(t, "sq", "stablehlo.multiply", &a, &a, &at);
        sum(t, "d", &v("sq"), "1");
        rev(t, "ar", &a, 2, &at);
        bin(t, "xy", "stablehlo.multiply", &a, &v("ar"), &at);
        sum(t, "e", &v("xy"), "1");
    }
    // The pair's (dp, dq, e) as the first slot holds them.
    t.iota(&v("si"), 1, &pi);
    t.constant(&v("half"), &(slots / 2).to_string(), &pi);
    t.compare(&v("first"), "LT", &v("si"), &v("half"), "SIGNED", &pi, &pb);
    rev(t, "dr", &v("d"), 1, &pt);
    rev(t, "er", &v("e"), 1, &pt);
    t.select(&v("dp"), &v("first"), &v("d"), &v("dr"), &pb, &pt);
    t.select(&v("dq"), &v("first"), &v("dr"), &v("d"), &pb, &pt);
    t.select(&v("ep"), &v("first"), &v("e"), &v("er"), &pb, &pt);
    // Negligible: |e| <= eps sqrt(|dp dq|), or below the smallest normal.
    let (eps, tiny) = if e == "f64" {
        (f64::EPSILON / 2.0, f64::MIN_POSITIVE)
    } else {
        (f64::from(f32::EPSILON) / 2.0, f64::from(f32::MIN_POSITIVE))
    };
    t.constant(&v("eps"), &format!("{eps:e}"), &pt);
    t.constant(&v("tiny"), &format!("{tiny:e}"), &pt);
    t.constant(&v("c0"), "0.0", &pt);
    t.constant(&v("c1v"), "1.0", &pt);
    t.constant(&v("c2v"), "2.0", &pt);
    t.apply(&v("mag"), "stablehlo.abs", &v("ep"), &pt);
    bin(t, "dd", "stablehlo.multiply", &v("dp"), &v("dq"), &pt);
    t.apply(&v("add"), "stablehlo.abs", &v("dd"), &pt);
    t.apply(&v("sdd"), "stablehlo.sqrt", &v("add"), &pt);
    bin(t, "thr", "stablehlo.multiply", &v("eps"), &v("sdd"), &pt);
    t.compare(&v("small"), "LE", &v("mag"), &v("thr"), "FLOAT", &pt, &pb);
    t.compare(&v("sub"), "LT", &v("mag"), &v("tiny"), "FLOAT", &pt, &pb);
    bin(t, "skip", "stablehlo.or", &v("small"), &v("sub"), &pb);
    // tau = (dq - dp) / 2e; t = sign(tau) / (|tau| + sqrt(1 + tau²)).
    bin(t, "num", "stablehlo.subtract", &v("dq"), &v("dp"), &pt);
    bin(t, "den", "stablehlo.multiply", &v("c2v"), &v("ep"), &pt);
    bin(t, "tau", "stablehlo.divide", &v("num"), &v("den"), &pt);
    t.apply(&v("r"), "stablehlo.abs", &v("tau"), &pt);
    bin(t, "inv", "stablehlo.divide", &v("c1v"), &v("r"), &pt);
    bin(t, "inv2", "stablehlo.multiply", &v("inv"), &v("inv"), &pt);
    bin(t, "h1a", "stablehlo.add", &v("c1v"), &v("inv2"), &pt);
    t.apply(&v("h1b"), "stablehlo.sqrt", &v("h1a"), &pt);
    bin(t, "h1", "stablehlo.multiply", &v("r"), &v("h1b"), &pt);
    bin(t, "r2", "stablehlo.multiply", &v("r"), &v("r"), &pt);
    bin(t, "h2a", "stablehlo.add", &v("c1v"), &v("r2"), &pt);
    t.apply(&v("h2"), "stablehlo.sqrt", &v("h2a"), &pt);
    t.compare(&v("big"), "GT", &v("r"), &v("c1v"), "FLOAT", &pt, &pb);
    t.select(&v("h"), &v("big"), &v("h1"), &v("h2"), &pb, &pt);
    bin(t, "rh", "stablehlo.add", &v("r"), &v("h"), &pt);
    bin(t, "t0", "stablehlo.divide", &v("c1v"), &v("rh"), &pt);
    t.apply(&v("tn"), "stablehlo.negate", &v("t0"), &pt);
    t.compare(&v("neg"), "LT", &v("tau"), &v("c0"), "FLOAT", &pt, &pb);
    t.select(&v("tt"), &v("neg"), &v("tn"), &v("t0"), &pb, &pt);
    bin(t, "t2", "stablehlo.multiply", &v("tt"), &v("tt"), &pt);
    bin(t, "ct", "stablehlo.add", &v("c1v"), &v("t2"), &pt);
    t.apply(&v("cs"), "stablehlo.sqrt", &v("ct"), &pt);
    bin(t, "cr", "stablehlo.divide", &v("c1v"), &v("cs"), &pt);
    bin(t, "sr", "stablehlo.multiply", &v("tt"), &v("cr"), &pt);
    t.select(&v("cc"), &v("skip"), &v("c1v"), &v("cr"), &pb, &pt);
    t.select(&v("s"), &v("skip"), &v("c0"), &v("sr"), &pb, &pt);
    t.apply(&v("sn"), "stablehlo.negate", &v("s"), &pt);
    t.select(&v("ss"), &v("first"), &v("sn"), &v("s"), &pb, &pt);
    // Any pair rotated, by a rotation that is not NaN (a NaN's rotation
    // spreads it, as the host kernel's does, but is no progress).
    t.apply(&v("move"), "stablehlo.not", &v("skip"), &pb);
    t.compare(&v("real"), "EQ", &v("sr"), &v("sr"), "FLOAT", &pt, &pb);
    bin(t, "did", "stablehlo.and", &v("move"), &v("real"), &pb);
    t.constant(&v("bf"), "false", "tensor<i1>");
    t.reduce(
        &v("any"),
        &v("did"),
        &v("bf"),
        "stablehlo.or",
        "tensor<i1>",
        &pb,
        "tensor<i1>",
        "0, 1",
    );
    bin(t, "rot", "stablehlo.or", &v("rin"), &v("any"), "tensor<i1>");
    // x c + partner(x) s: rows (two-sided), then columns; v's columns.
    let mix = |t: &mut Text, out: &str, val: &str, dim: usize, ty: &str| {
        let keep = if dim == 1 { "0, 1" } else { "0, 2" };
        t.broadcast(&v(&format!("{out}_c")), &v("cc"), keep, &pt, ty);
        t.broadcast(&v(&format!("{out}_s")), &v("ss"), keep, &pt, ty);
        rev(t, &format!("{out}_p"), val, dim, ty);
        bin(
            t,
            &format!("{out}_x"),
            "stablehlo.multiply",
            val,
            &v(&format!("{out}_c")),
            ty,
        );
        bin(
            t,
            &format!("{out}_y"),
            "stablehlo.multiply",
            &v(&format!("{out}_p")),
            &v(&format!("{out}_s")),
            ty,
        );
        bin(
            t,
            out,
            "stablehlo.add",
            &v(&format!("{out}_x")),
            &v(&format!("{out}_y")),
            ty,
        );
    };
    let cols_of = if two_sided {
        mix(t, "a1", &a, 1, &at);
        v("a1")
    } else {
        a.clone()
    };
    mix(t, "a2", &cols_of, 2, &at);
    mix(t, "v1", &vv, 2, &vt);
    // The shift: slot 0 stays, slot 1 takes slot N - 1's index, slot j + 1
    // slot j's.
    let shift = |t: &mut Text, out: &str, val: &str, dim: usize, dims: &[u64], elt: &str| {
        let ty = shaped(dims, elt);
        if slots <= 2 {
            t.reshape(&v(out), val, &ty, &ty);
            return;
        }
        let piece = |t: &mut Text, name: &str, from: u64, to: u64| {
            let mut lo = vec![0u64; dims.len()];
            let mut hi = dims.to_vec();
            lo[dim] = from;
            hi[dim] = to;
            let mut pd = dims.to_vec();
            pd[dim] = to - from;
            let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
            t.line(format!(
                "{} = \"stablehlo.slice\"({val}) {{start_indices = array<i64: {}>, limit_indices = array<i64: {}>, strides = array<i64: {}>}} : ({ty}) -> {}",
                v(name),
                list(&lo),
                list(&hi),
                vec!["1"; dims.len()].join(", "),
                shaped(&pd, elt)
            ));
            shaped(&pd, elt)
        };
        let (p0, p1, p2) = (format!("{out}_0"), format!("{out}_1"), format!("{out}_2"));
        let t0 = piece(t, &p0, 0, 1);
        let t1 = piece(t, &p1, slots - 1, slots);
        let t2 = piece(t, &p2, 1, slots - 1);
        t.line(format!(
            "{} = \"stablehlo.concatenate\"({}, {}, {}) {{dimension = {dim} : i64}} : ({t0}, {t1}, {t2}) -> {ty}",
            v(out),
            v(&p0),
            v(&p1),
            v(&p2)
        ));
    };
    if two_sided {
        shift(t, "a2r", &v("a2"), 1, &[b, rows, slots], e);
        shift(t, "a3", &v("a2r"), 2, &[b, rows, slots], e);
    } else {
        shift(t, "a3", &v("a2"), 2, &[b, rows, slots], e);
    }
    shift(t, "v2", &v("v1"), 2, &[b, slots, slots], e);
    shift(t, "o2", &order, 0, &[slots], "i64");
}
