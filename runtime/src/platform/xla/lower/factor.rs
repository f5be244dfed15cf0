//! `Prim::LuFactor` and `Prim::PivotsToPermutation`, which XLA has no
//! operation for, and `Prim::Cholesky`, whose StableHLO operation fails a
//! whole matrix (all NaN) where torch reports the first failing minor, as
//! StableHLO while loops: one iteration per elimination step, column (or
//! swap), each of whole-matrix selects on the step number, so the module
//! stays the same size whatever the matrix (written out step by step, a
//! 256 x 256 inverse took 36 s to compile on the CPU plugin).
//!
//! Batch dims are flattened to one, B. The loop carries the step k, the
//! matrix, the pivots and the permutation. A row chosen per batch element
//! is read as a sum over rows of a select, with -0.0 as the filler and the
//! start, so the sum is that row exactly (signed zeros included).

use super::{elem, shaped};
use crate::ir::DType;

pub(super) const I64: &str = "tensor<i64>";

/// The lines of one function body, written through `w`, with the few
/// operation forms the loops use. Names are given whole (`%v3_lu_k`);
/// types are `tensor<..>` strings.
pub(super) struct Text<'a> {
    pub(super) w: &'a mut dyn FnMut(String),
}

impl Text<'_> {
    pub(super) fn line(&mut self, s: String) {
        (self.w)(s)
    }
    pub(super) fn constant(&mut self, out: &str, literal: &str, t: &str) {
        self.line(format!("{out} = stablehlo.constant dense<{literal}> : {t}"));
    }
    pub(super) fn iota(&mut self, out: &str, dim: usize, t: &str) {
        self.line(format!("{out} = stablehlo.iota dim = {dim} : {t}"));
    }
    /// `v` (typed `from`) broadcast to `to`, its dims at `dims`.
    pub(super) fn broadcast(&mut self, out: &str, v: &str, dims: &str, from: &str, to: &str) {
        self.line(format!(
            "{out} = stablehlo.broadcast_in_dim {v}, dims = [{dims}] : ({from}) -> {to}"
        ));
    }
    /// `a dir b` over two `t` values, the result typed `bt`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn compare(
        &mut self,
        out: &str,
        dir: &str,
        a: &str,
        b: &str,
        kind: &str,
        t: &str,
        bt: &str,
    ) {
        self.line(format!(
            "{out} = stablehlo.compare {dir}, {a}, {b}, {kind} : ({t}, {t}) -> {bt}"
        ));
    }
    pub(super) fn select(&mut self, out: &str, p: &str, a: &str, b: &str, bt: &str, t: &str) {
        self.line(format!(
            "{out} = stablehlo.select {p}, {a}, {b} : ({bt}, {t}, {t}) -> {t}"
        ));
    }
    /// An elementwise `op` (`stablehlo.add`, ..) of `args` typed `t`.
    pub(super) fn apply(&mut self, out: &str, op: &str, args: &str, t: &str) {
        self.line(format!("{out} = {op} {args} : {t}"));
    }
    pub(super) fn reshape(&mut self, out: &str, v: &str, from: &str, to: &str) {
        self.line(format!("{out} = stablehlo.reshape {v} : ({from}) -> {to}"));
    }
    /// `out`: identity matrices typed `t` ([B, p, q], ones where row ==
    /// column), with `{out}_d`, the diagonal's mask (typed `bt`), and
    /// `{out}_0`, zeros typed `t`, named for reuse; `it` is `t`'s shape in
    /// i64.
    pub(super) fn identity(&mut self, out: &str, t: &str, bt: &str, it: &str) {
        let (r, c, d) = (format!("{out}_r"), format!("{out}_c"), format!("{out}_d"));
        self.iota(&r, 1, it);
        self.iota(&c, 2, it);
        self.compare(&d, "EQ", &r, &c, "SIGNED", it, bt);
        self.constant(&format!("{out}_1"), "1.0", t);
        self.constant(&format!("{out}_0"), "0.0", t);
        self.select(out, &d, &format!("{out}_1"), &format!("{out}_0"), bt, t);
    }
    /// `v` (typed `from`) reduced over its dim 1 by `op` from `init`
    /// (a scalar of type `st`) to `to`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reduce_dim1(
        &mut self,
        out: &str,
        v: &str,
        init: &str,
        op: &str,
        st: &str,
        from: &str,
        to: &str,
    ) {
        self.reduce(out, v, init, op, st, from, to, "1")
    }
    /// `v` (typed `from`) reduced over `dims` ("0, 2") by `op` from `init`
    /// (a scalar of type `st`) to `to`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reduce(
        &mut self,
        out: &str,
        v: &str,
        init: &str,
        op: &str,
        st: &str,
        from: &str,
        to: &str,
        dims: &str,
    ) {
        self.line(format!(
            "{out} = \"stablehlo.reduce\"({v}, {init}) ({{\n      ^bb0(%a: {st}, %b: {st}):\n        %r = {op} %a, %b : {st}\n        stablehlo.return %r : {st}\n    }}) {{dimensions = array<i64: {dims}>}} : ({from}, {st}) -> {to}"
        ));
    }
    /// The slice of `sizes` of `v` (typed `from`) at the i64 scalar
    /// offsets `at`, reshaped to `to`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn slice_at(
        &mut self,
        out: &str,
        v: &str,
        at: &[&str],
        sizes: &[u64],
        from: &str,
        e: &str,
        to: &str,
    ) {
        let sliced = shaped(sizes, e);
        let offsets: Vec<String> = at.iter().map(|s| s.to_string()).collect();
        let types = vec![I64; at.len()].join(", ");
        let sizes: Vec<String> = sizes.iter().map(u64::to_string).collect();
        self.line(format!(
            "{out}_s = \"stablehlo.dynamic_slice\"({v}, {}) {{slice_sizes = array<i64: {}>}} : ({from}, {types}) -> {sliced}",
            offsets.join(", "),
            sizes.join(", ")
        ));
        self.reshape(out, &format!("{out}_s"), &sliced, to);
    }
}

/// [b.., m, n] as (B, m, n), B the batch dims' product.
pub(super) fn batch_matrix(dims: &[u64]) -> (u64, u64, u64) {
    let r = dims.len();
    (dims[..r - 2].iter().product(), dims[r - 2], dims[r - 1])
}

/// One step's swap of permutation entries k and `p` (a `tensor<Bxi64>`
/// value) in `q` ([B, m] i64), defining `{x}_q1`.
fn swap_entries(t: &mut Text, x: &str, q: &str, p: &str, b: u64, m: u64) {
    let qt = shaped(&[b, m], "i64");
    let vt = shaped(&[b], "i64");
    let bt = shaped(&[b, m], "i1");
    t.iota(&format!("{x}_qi"), 1, &qt);
    t.broadcast(&format!("{x}_qk"), &format!("{x}_k"), "", I64, &qt);
    t.broadcast(&format!("{x}_qpb"), p, "0", &vt, &qt);
    t.compare(
        &format!("{x}_qatk"),
        "EQ",
        &format!("{x}_qi"),
        &format!("{x}_qk"),
        "SIGNED",
        &qt,
        &bt,
    );
    t.compare(
        &format!("{x}_qatp"),
        "EQ",
        &format!("{x}_qi"),
        &format!("{x}_qpb"),
        "SIGNED",
        &qt,
        &bt,
    );
    t.constant(&format!("{x}_qz"), "0", &qt);
    t.constant(&format!("{x}_qz0"), "0", I64);
    // The entries at k and at p, each a sum of one term.
    for (tag, at) in [("vk", "qatk"), ("vp", "qatp")] {
        t.select(
            &format!("{x}_{tag}m"),
            &format!("{x}_{at}"),
            q,
            &format!("{x}_qz"),
            &bt,
            &qt,
        );
        t.reduce_dim1(
            &format!("{x}_{tag}"),
            &format!("{x}_{tag}m"),
            &format!("{x}_qz0"),
            "stablehlo.add",
            I64,
            &qt,
            &vt,
        );
        t.broadcast(&format!("{x}_{tag}b"), &format!("{x}_{tag}"), "0", &vt, &qt);
    }
    t.select(
        &format!("{x}_qs"),
        &format!("{x}_qatp"),
        &format!("{x}_vkb"),
        q,
        &bt,
        &qt,
    );
    t.select(
        &format!("{x}_q1"),
        &format!("{x}_qatk"),
        &format!("{x}_vpb"),
        &format!("{x}_qs"),
        &bt,
        &qt,
    );
}

/// A loop `{x}_w` over k in 0..steps carrying (k, the values typed
/// `types`, initially `inits`); `body` writes a step's lines, given the
/// carried names `{x}_c1..`, and names the values it returns. In the
/// generic form, whose last line `})` ends the operation (what
/// `without_locations` reads).
pub(super) fn while_loop(
    t: &mut Text,
    x: &str,
    steps: u64,
    inits: &[&str],
    types: &[String],
    body: impl FnOnce(&mut Text) -> Vec<String>,
) {
    while_loop_until(t, x, steps, inits, types, None, body)
}

/// `while_loop`, stopping early too where `stop` (writing the condition
/// region's lines from the same names, returning a `tensor<i1>` value)
/// holds.
pub(super) fn while_loop_until(
    t: &mut Text,
    x: &str,
    steps: u64,
    inits: &[&str],
    types: &[String],
    stop: Option<&dyn Fn(&mut Text) -> String>,
    body: impl FnOnce(&mut Text) -> Vec<String>,
) {
    let all_types = std::iter::once(I64.to_string())
        .chain(types.iter().cloned())
        .collect::<Vec<_>>()
        .join(", ");
    let block = std::iter::once(format!("{x}_k: {I64}"))
        .chain(
            types
                .iter()
                .enumerate()
                .map(|(i, ty)| format!("{x}_c{}: {ty}", i + 1)),
        )
        .collect::<Vec<_>>()
        .join(", ");
    t.constant(&format!("{x}_k0"), "0", I64);
    let mut lines = vec![
        format!(
            "{x}_w:{} = \"stablehlo.while\"({x}_k0, {}) ({{",
            inits.len() + 1,
            inits.join(", ")
        ),
        format!("      ^bb0({block}):"),
        format!("        {x}_end = stablehlo.constant dense<{steps}> : {I64}"),
        format!("        {x}_go = stablehlo.compare LT, {x}_k, {x}_end, SIGNED : ({I64}, {I64}) -> tensor<i1>"),
    ];
    let go = match stop {
        None => format!("{x}_go"),
        Some(stop) => {
            let mut cond = Vec::new();
            let halt = stop(&mut Text {
                w: &mut |s: String| cond.push(format!("        {s}")),
            });
            lines.extend(cond);
            lines.push(format!(
                "        {x}_more = stablehlo.not {halt} : tensor<i1>"
            ));
            lines.push(format!(
                "        {x}_go2 = stablehlo.and {x}_go, {x}_more : tensor<i1>"
            ));
            format!("{x}_go2")
        }
    };
    lines.extend([
        format!("        stablehlo.return {go} : tensor<i1>"),
        "    }, {".to_string(),
        format!("      ^bb0({block}):"),
    ]);
    let mut inner = Vec::new();
    let results = body(&mut Text {
        w: &mut |s: String| inner.push(format!("        {s}")),
    });
    lines.extend(inner);
    lines.push(format!(
        "        {x}_one = stablehlo.constant dense<1> : {I64}"
    ));
    lines.push(format!(
        "        {x}_k1 = stablehlo.add {x}_k, {x}_one : {I64}"
    ));
    lines.push(format!(
        "        stablehlo.return {x}_k1, {} : {all_types}",
        results.join(", ")
    ));
    lines.push(format!("    }}) : ({all_types}) -> ({all_types})"));
    t.line(lines.join("\n"));
}

/// LuFactor of `input` (typed `it`, dims [b.., m, n], of `d`) into the
/// values `outs` (lu, pivots, perm) typed `out_types`.
pub(super) fn lu_factor(
    w: &mut dyn FnMut(String),
    input: &str,
    it: &str,
    dims: &[u64],
    d: DType,
    outs: [&str; 3],
    out_types: [&str; 3],
) {
    let t = &mut Text { w };
    let (b, m, n) = batch_matrix(dims);
    let k_steps = m.min(n);
    let x = format!("{}_lu", outs[0]);
    let e = elem(d);
    let at = shaped(&[b, m, n], e);
    let pt = shaped(&[b, k_steps], "i64");
    let qt = shaped(&[b, m], "i64");
    t.reshape(&format!("{x}_a0"), input, it, &at);
    t.constant(&format!("{x}_p0"), "0", &pt);
    t.iota(&format!("{x}_q0"), 1, &qt);
    let (a, p, q) = if k_steps == 0 || b == 0 {
        (format!("{x}_a0"), format!("{x}_p0"), format!("{x}_q0"))
    } else {
        let types = [at.clone(), pt.clone(), qt.clone()];
        let inits = [format!("{x}_a0"), format!("{x}_p0"), format!("{x}_q0")];
        let inits: Vec<&str> = inits.iter().map(String::as_str).collect();
        while_loop(t, &x, k_steps, &inits, &types, |t| {
            step(t, &x, [b, m, n], k_steps, e);
            vec![format!("{x}_a2"), format!("{x}_p1"), format!("{x}_q1")]
        });
        (format!("{x}_w#1"), format!("{x}_w#2"), format!("{x}_w#3"))
    };
    for ((o, ot), (v, vt)) in outs.iter().zip(out_types).zip([(a, at), (p, pt), (q, qt)]) {
        t.reshape(o, &v, &vt, ot);
    }
}

/// One elimination step on the carried `{x}_c1` (matrix), `{x}_c2`
/// (pivots) and `{x}_c3` (permutation), defining `{x}_a2`, `{x}_p1` and
/// `{x}_q1`.
fn step(t: &mut Text, x: &str, [b, m, n]: [u64; 3], k_steps: u64, e: &str) {
    let v = |s: &str| format!("{x}_{s}");
    let (at, ab, ai) = (
        shaped(&[b, m, n], e),
        shaped(&[b, m, n], "i1"),
        shaped(&[b, m, n], "i64"),
    );
    let (ct, cb, ci) = (
        shaped(&[b, m], e),
        shaped(&[b, m], "i1"),
        shaped(&[b, m], "i64"),
    );
    let (rt, rb, ri) = (
        shaped(&[b, n], e),
        shaped(&[b, n], "i1"),
        shaped(&[b, n], "i64"),
    );
    let (vt, vb, vi) = (shaped(&[b], e), shaped(&[b], "i1"), shaped(&[b], "i64"));
    let st = format!("tensor<{e}>");
    let (a, k, i0) = (v("c1"), v("k"), v("i0"));
    t.constant(&i0, "0", I64);
    t.constant(&v("nz"), "-0.0", &st);
    t.constant(&v("nza"), "-0.0", &at);
    // Column k, and the pivot row: the first largest magnitude at or
    // below k (rows above k are -2, NaN -1: NaN wins only alone).
    t.slice_at(&v("col"), &a, &[&i0, &i0, &k], &[b, m, 1], &at, e, &ct);
    t.apply(&v("mag"), "stablehlo.abs", &v("col"), &ct);
    t.iota(&v("ri"), 1, &ci);
    t.broadcast(&v("kc"), &k, "", I64, &ci);
    t.compare(&v("above"), "LT", &v("ri"), &v("kc"), "SIGNED", &ci, &cb);
    t.compare(&v("isnan"), "NE", &v("mag"), &v("mag"), "FLOAT", &ct, &cb);
    t.constant(&v("m1"), "-1.0", &ct);
    t.constant(&v("m2"), "-2.0", &ct);
    t.select(&v("c0"), &v("isnan"), &v("m1"), &v("mag"), &cb, &ct);
    t.select(&v("cand"), &v("above"), &v("m2"), &v("c0"), &cb, &ct);
    t.constant(&v("m2s"), "-2.0", &st);
    t.reduce_dim1(
        &v("best"),
        &v("cand"),
        &v("m2s"),
        "stablehlo.maximum",
        &st,
        &ct,
        &vt,
    );
    t.broadcast(&v("bestb"), &v("best"), "0", &vt, &ct);
    t.compare(&v("hit"), "EQ", &v("cand"), &v("bestb"), "FLOAT", &ct, &cb);
    t.constant(&v("mc"), &m.to_string(), &ci);
    t.constant(&v("ms"), &m.to_string(), I64);
    t.select(&v("idx"), &v("hit"), &v("ri"), &v("mc"), &cb, &ci);
    t.reduce_dim1(
        &v("piv"),
        &v("idx"),
        &v("ms"),
        "stablehlo.minimum",
        I64,
        &ci,
        &vi,
    );
    // Swap rows k and piv.
    t.iota(&v("rows"), 1, &ai);
    t.iota(&v("cols"), 2, &ai);
    t.broadcast(&v("pa"), &v("piv"), "0", &vi, &ai);
    t.broadcast(&v("ka"), &k, "", I64, &ai);
    t.compare(&v("isp"), "EQ", &v("rows"), &v("pa"), "SIGNED", &ai, &ab);
    t.compare(&v("isk"), "EQ", &v("rows"), &v("ka"), "SIGNED", &ai, &ab);
    t.select(&v("prm"), &v("isp"), &a, &v("nza"), &ab, &at);
    t.reduce_dim1(
        &v("prow"),
        &v("prm"),
        &v("nz"),
        "stablehlo.add",
        &st,
        &at,
        &rt,
    );
    t.slice_at(&v("krow"), &a, &[&i0, &k, &i0], &[b, 1, n], &at, e, &rt);
    t.broadcast(&v("prowb"), &v("prow"), "0, 2", &rt, &at);
    t.broadcast(&v("krowb"), &v("krow"), "0, 2", &rt, &at);
    t.select(&v("s1"), &v("isp"), &v("krowb"), &a, &ab, &at);
    t.select(&v("a1"), &v("isk"), &v("prowb"), &v("s1"), &ab, &at);
    // The pivot (row piv's element k), 1 in its place where it is 0.
    t.slice_at(&v("pv"), &v("prow"), &[&i0, &k], &[b, 1], &rt, e, &vt);
    t.constant(&v("zv"), "0.0", &vt);
    t.constant(&v("ov"), "1.0", &vt);
    t.compare(&v("pz"), "EQ", &v("pv"), &v("zv"), "FLOAT", &vt, &vb);
    t.select(&v("div"), &v("pz"), &v("ov"), &v("pv"), &vb, &vt);
    // l = column k / pivot below row k; u = row piv right of column k.
    t.slice_at(&v("ck"), &v("a1"), &[&i0, &i0, &k], &[b, m, 1], &at, e, &ct);
    t.broadcast(&v("divb"), &v("div"), "0", &vt, &ct);
    t.apply(
        &v("l"),
        "stablehlo.divide",
        &format!("{}, {}", v("ck"), v("divb")),
        &ct,
    );
    t.compare(&v("below"), "GT", &v("ri"), &v("kc"), "SIGNED", &ci, &cb);
    t.constant(&v("zc"), "0.0", &ct);
    t.select(&v("lz"), &v("below"), &v("l"), &v("zc"), &cb, &ct);
    t.iota(&v("cj"), 1, &ri);
    t.broadcast(&v("kr"), &k, "", I64, &ri);
    t.compare(&v("right"), "GT", &v("cj"), &v("kr"), "SIGNED", &ri, &rb);
    t.constant(&v("zr"), "0.0", &rt);
    t.select(&v("u"), &v("right"), &v("prow"), &v("zr"), &rb, &rt);
    t.broadcast(&v("lb"), &v("lz"), "0, 1", &ct, &at);
    t.broadcast(&v("ub"), &v("u"), "0, 2", &rt, &at);
    t.apply(
        &v("upd"),
        "stablehlo.multiply",
        &format!("{}, {}", v("lb"), v("ub")),
        &at,
    );
    t.apply(
        &v("red"),
        "stablehlo.subtract",
        &format!("{}, {}", v("a1"), v("upd")),
        &at,
    );
    // Rows below k take the trailing block's update right of column k;
    // column k below the pivot stores l.
    t.compare(&v("bl"), "GT", &v("rows"), &v("ka"), "SIGNED", &ai, &ab);
    t.compare(&v("rt"), "GT", &v("cols"), &v("ka"), "SIGNED", &ai, &ab);
    t.compare(&v("atk"), "EQ", &v("cols"), &v("ka"), "SIGNED", &ai, &ab);
    t.apply(
        &v("trail"),
        "stablehlo.and",
        &format!("{}, {}", v("bl"), v("rt")),
        &ab,
    );
    t.apply(
        &v("store"),
        "stablehlo.and",
        &format!("{}, {}", v("bl"), v("atk")),
        &ab,
    );
    t.select(&v("a15"), &v("trail"), &v("red"), &v("a1"), &ab, &at);
    t.select(&v("a2"), &v("store"), &v("lb"), &v("a15"), &ab, &at);
    // Pivot k and the permutation.
    let (pt, pb) = (shaped(&[b, k_steps], "i64"), shaped(&[b, k_steps], "i1"));
    t.iota(&v("pi"), 1, &pt);
    t.broadcast(&v("kp"), &k, "", I64, &pt);
    t.compare(&v("atp"), "EQ", &v("pi"), &v("kp"), "SIGNED", &pt, &pb);
    t.broadcast(&v("pvb"), &v("piv"), "0", &vi, &pt);
    t.select(&v("p1"), &v("atp"), &v("pvb"), &v("c2"), &pb, &pt);
    swap_entries(t, x, &v("c3"), &v("piv"), b, m);
}

/// PivotsToPermutation of `input` (typed `it`, dims [b.., k]) into `out`
/// (typed `ot`, [b.., m]).
pub(super) fn pivots_to_permutation(
    w: &mut dyn FnMut(String),
    input: &str,
    it: &str,
    dims: &[u64],
    m: u64,
    out: &str,
    ot: &str,
) {
    let t = &mut Text { w };
    let r = dims.len();
    let k_steps = dims[r - 1];
    let b: u64 = dims[..r - 1].iter().product();
    let x = format!("{out}_pp");
    let pt = shaped(&[b, k_steps], "i64");
    let qt = shaped(&[b, m], "i64");
    t.reshape(&format!("{x}_p"), input, it, &pt);
    t.iota(&format!("{x}_q0"), 1, &qt);
    let q = if k_steps == 0 || b == 0 || m == 0 {
        format!("{x}_q0")
    } else {
        let q0 = format!("{x}_q0");
        while_loop(
            t,
            &x,
            k_steps,
            &[q0.as_str()],
            std::slice::from_ref(&qt),
            |t| {
                let (i0, pk) = (format!("{x}_i0"), format!("{x}_pk"));
                t.constant(&i0, "0", I64);
                let k = format!("{x}_k");
                t.slice_at(
                    &pk,
                    &format!("{x}_p"),
                    &[&i0, &k],
                    &[b, 1],
                    &pt,
                    "i64",
                    &shaped(&[b], "i64"),
                );
                swap_entries(t, &x, &format!("{x}_c1"), &pk, b, m);
                vec![format!("{x}_q1")]
            },
        );
        format!("{x}_w#1")
    };
    t.reshape(out, &q, &qt, ot);
}

/// Cholesky of `input` (typed `it`, dims [b.., n, n], of `d`) into `out`
/// (typed `ot`): column j of L from A's column j less L's rows dotted
/// with row j (a product over the columns filled so far), divided by
/// sqrt(d_j); a pivot d_j not above 0 (or NaN) makes the column NaN, and
/// so every later one, as the host kernel.
pub(super) fn cholesky(
    w: &mut dyn FnMut(String),
    input: &str,
    it: &str,
    dims: &[u64],
    d: DType,
    out: &str,
    ot: &str,
) {
    let t = &mut Text { w };
    let (b, _, n) = batch_matrix(dims);
    let x = format!("{out}_ch");
    let e = elem(d);
    let at = shaped(&[b, n, n], e);
    t.reshape(&format!("{x}_a0"), input, it, &at);
    t.constant(&format!("{x}_l0"), "0.0", &at);
    let l = if n == 0 || b == 0 {
        format!("{x}_l0")
    } else {
        let types = [at.clone(), at.clone()];
        let (a0, l0) = (format!("{x}_a0"), format!("{x}_l0"));
        while_loop(t, &x, n, &[a0.as_str(), l0.as_str()], &types, |t| {
            let v = |s: &str| format!("{x}_{s}");
            let (vt, vb, vi) = (
                shaped(&[b, n], e),
                shaped(&[b, n], "i1"),
                shaped(&[b, n], "i64"),
            );
            let st = shaped(&[b], e);
            let (ab, ai) = (shaped(&[b, n, n], "i1"), shaped(&[b, n, n], "i64"));
            let (a, l, k, i0) = (v("c1"), v("c2"), v("k"), v("i0"));
            t.constant(&i0, "0", I64);
            t.slice_at(&v("row"), &l, &[&i0, &k, &i0], &[b, 1, n], &at, e, &vt);
            t.line(format!(
                "{} = stablehlo.dot_general {l}, {}, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [HIGHEST, HIGHEST] : ({at}, {vt}) -> {vt}",
                v("s"),
                v("row")
            ));
            t.slice_at(&v("col"), &a, &[&i0, &i0, &k], &[b, n, 1], &at, e, &vt);
            t.apply(
                &v("v"),
                "stablehlo.subtract",
                &format!("{}, {}", v("col"), v("s")),
                &vt,
            );
            t.slice_at(&v("d"), &v("v"), &[&i0, &k], &[b, 1], &vt, e, &st);
            t.broadcast(&v("db"), &v("d"), "0", &st, &vt);
            t.constant(&v("zv"), "0.0", &vt);
            let nan = if d == DType::F64 {
                "0x7FF8000000000000"
            } else {
                "0x7FC00000"
            };
            t.constant(&v("nan"), nan, &vt);
            t.compare(&v("ok"), "GT", &v("db"), &v("zv"), "FLOAT", &vt, &vb);
            t.apply(&v("rt"), "stablehlo.sqrt", &v("db"), &vt);
            t.select(&v("ljj"), &v("ok"), &v("rt"), &v("nan"), &vb, &vt);
            t.apply(
                &v("q"),
                "stablehlo.divide",
                &format!("{}, {}", v("v"), v("ljj")),
                &vt,
            );
            t.iota(&v("ri"), 1, &vi);
            t.broadcast(&v("kv"), &k, "", I64, &vi);
            t.compare(&v("isj"), "EQ", &v("ri"), &v("kv"), "SIGNED", &vi, &vb);
            t.compare(&v("blw"), "GT", &v("ri"), &v("kv"), "SIGNED", &vi, &vb);
            t.select(&v("q1"), &v("blw"), &v("q"), &v("zv"), &vb, &vt);
            t.select(&v("newc"), &v("isj"), &v("ljj"), &v("q1"), &vb, &vt);
            t.iota(&v("cols"), 2, &ai);
            t.broadcast(&v("ka"), &k, "", I64, &ai);
            t.compare(&v("atj"), "EQ", &v("cols"), &v("ka"), "SIGNED", &ai, &ab);
            t.broadcast(&v("newb"), &v("newc"), "0, 1", &vt, &at);
            t.select(&v("l1"), &v("atj"), &v("newb"), &l, &ab, &at);
            vec![a, v("l1")]
        });
        format!("{x}_w#2")
    };
    t.reshape(out, &l, &at, ot);
}
