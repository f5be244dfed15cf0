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

/// The text of one step's swap of permutation entries k and `p` (a
/// `tensor<Bxi64>` value) in `q` ([B, m] i64), defining `{x}_q1`.
fn swap_entries(w: &mut impl FnMut(String), x: &str, q: &str, p: &str, b: u64, m: u64) {
    let qt = shaped(&[b, m], "i64");
    let vt = shaped(&[b], "i64");
    let bt = shaped(&[b, m], "i1");
    w(format!("{x}_qi = stablehlo.iota dim = 1 : {qt}"));
    w(format!(
        "{x}_qk = stablehlo.broadcast_in_dim {x}_k, dims = [] : (tensor<i64>) -> {qt}"
    ));
    w(format!(
        "{x}_qpb = stablehlo.broadcast_in_dim {p}, dims = [0] : ({vt}) -> {qt}"
    ));
    w(format!(
        "{x}_qatk = stablehlo.compare EQ, {x}_qi, {x}_qk, SIGNED : ({qt}, {qt}) -> {bt}"
    ));
    w(format!(
        "{x}_qatp = stablehlo.compare EQ, {x}_qi, {x}_qpb, SIGNED : ({qt}, {qt}) -> {bt}"
    ));
    w(format!("{x}_qz = stablehlo.constant dense<0> : {qt}"));
    w(format!(
        "{x}_qz0 = stablehlo.constant dense<0> : tensor<i64>"
    ));
    // The entries at k and at p, each a sum of one term.
    for (tag, at) in [("vk", "qatk"), ("vp", "qatp")] {
        w(format!(
            "{x}_{tag}m = stablehlo.select {x}_{at}, {q}, {x}_qz : ({bt}, {qt}, {qt}) -> {qt}"
        ));
        w(format!(
            "{x}_{tag} = \"stablehlo.reduce\"({x}_{tag}m, {x}_qz0) ({{\n      ^bb0(%a: tensor<i64>, %b: tensor<i64>):\n        %r = stablehlo.add %a, %b : tensor<i64>\n        stablehlo.return %r : tensor<i64>\n    }}) {{dimensions = array<i64: 1>}} : ({qt}, tensor<i64>) -> {vt}"
        ));
        w(format!(
            "{x}_{tag}b = stablehlo.broadcast_in_dim {x}_{tag}, dims = [0] : ({vt}) -> {qt}"
        ));
    }
    w(format!(
        "{x}_qs = stablehlo.select {x}_qatp, {x}_vkb, {q} : ({bt}, {qt}, {qt}) -> {qt}"
    ));
    w(format!(
        "{x}_q1 = stablehlo.select {x}_qatk, {x}_vpb, {x}_qs : ({bt}, {qt}, {qt}) -> {qt}"
    ));
}

/// A loop `{x}_w` over k in 0..steps carrying (k, the values typed
/// `types`, initially `inits`); `body` writes a step's lines, given the
/// carried names `{x}_c1..`, and names the values it returns. In the
/// generic form, whose last line `})` ends the operation (what
/// `without_locations` reads).
fn while_loop(
    w: &mut impl FnMut(String),
    x: &str,
    steps: u64,
    inits: &[&str],
    types: &[String],
    body: impl FnOnce(&mut dyn FnMut(String)) -> Vec<String>,
) {
    let all_types = std::iter::once("tensor<i64>".to_string())
        .chain(types.iter().cloned())
        .collect::<Vec<_>>()
        .join(", ");
    let block = std::iter::once(format!("{x}_k: tensor<i64>"))
        .chain(
            types
                .iter()
                .enumerate()
                .map(|(i, t)| format!("{x}_c{}: {t}", i + 1)),
        )
        .collect::<Vec<_>>()
        .join(", ");
    w(format!(
        "{x}_k0 = stablehlo.constant dense<0> : tensor<i64>"
    ));
    let mut lines = vec![
        format!(
            "{x}_w:{} = \"stablehlo.while\"({x}_k0, {}) ({{",
            inits.len() + 1,
            inits.join(", ")
        ),
        format!("      ^bb0({block}):"),
        format!("        {x}_end = stablehlo.constant dense<{steps}> : tensor<i64>"),
        format!(
            "        {x}_go = stablehlo.compare LT, {x}_k, {x}_end, SIGNED : (tensor<i64>, tensor<i64>) -> tensor<i1>"
        ),
        format!("        stablehlo.return {x}_go : tensor<i1>"),
        "    }, {".to_string(),
        format!("      ^bb0({block}):"),
    ];
    let mut inner = Vec::new();
    let results = body(&mut |s: String| inner.push(format!("        {s}")));
    lines.extend(inner);
    lines.push(format!(
        "        {x}_one = stablehlo.constant dense<1> : tensor<i64>"
    ));
    lines.push(format!(
        "        {x}_k1 = stablehlo.add {x}_k, {x}_one : tensor<i64>"
    ));
    lines.push(format!(
        "        stablehlo.return {x}_k1, {} : {all_types}",
        results.join(", ")
    ));
    lines.push(format!("    }}) : ({all_types}) -> ({all_types})"));
    w(lines.join("\n"));
}

/// LuFactor of `input` (typed `it`, dims [b.., m, n], of `d`) into the
/// values `outs` (lu, pivots, perm) typed `out_types`.
pub(super) fn lu_factor(
    w: &mut impl FnMut(String),
    input: &str,
    it: &str,
    dims: &[u64],
    d: DType,
    outs: [&str; 3],
    out_types: [&str; 3],
) {
    let r = dims.len();
    let (m, n) = (dims[r - 2], dims[r - 1]);
    let b: u64 = dims[..r - 2].iter().product();
    let k_steps = m.min(n);
    let x = format!("{}_lu", outs[0]);
    let e = elem(d);
    let at = shaped(&[b, m, n], e);
    let pt = shaped(&[b, k_steps], "i64");
    let qt = shaped(&[b, m], "i64");
    w(format!(
        "{x}_a0 = stablehlo.reshape {input} : ({it}) -> {at}"
    ));
    w(format!("{x}_p0 = stablehlo.constant dense<0> : {pt}"));
    w(format!("{x}_q0 = stablehlo.iota dim = 1 : {qt}"));
    let (a, p, q) = if k_steps == 0 || b == 0 {
        (format!("{x}_a0"), format!("{x}_p0"), format!("{x}_q0"))
    } else {
        let types = [at.clone(), pt.clone(), qt.clone()];
        let inits = [format!("{x}_a0"), format!("{x}_p0"), format!("{x}_q0")];
        let inits: Vec<&str> = inits.iter().map(String::as_str).collect();
        while_loop(w, &x, k_steps, &inits, &types, |w| {
            step(w, &x, b, m, n, k_steps, e);
            vec![format!("{x}_a2"), format!("{x}_p1"), format!("{x}_q1")]
        });
        (format!("{x}_w#1"), format!("{x}_w#2"), format!("{x}_w#3"))
    };
    for ((o, ot), (v, vt)) in outs.iter().zip(out_types).zip([(a, at), (p, pt), (q, qt)]) {
        w(format!("{o} = stablehlo.reshape {v} : ({vt}) -> {ot}"));
    }
}

/// One elimination step on the carried `{x}_c1` (matrix), `{x}_c2`
/// (pivots) and `{x}_c3` (permutation), defining `{x}_a2`, `{x}_p1` and
/// `{x}_q1`.
fn step(w: &mut dyn FnMut(String), x: &str, b: u64, m: u64, n: u64, k_steps: u64, e: &str) {
    let mut w = |s: String| w(s);
    let at = shaped(&[b, m, n], e);
    let ab = shaped(&[b, m, n], "i1");
    let ai = shaped(&[b, m, n], "i64");
    let ct = shaped(&[b, m], e);
    let cb = shaped(&[b, m], "i1");
    let ci = shaped(&[b, m], "i64");
    let rt = shaped(&[b, n], e);
    let ri = shaped(&[b, n], "i64");
    let rb = shaped(&[b, n], "i1");
    let vt = shaped(&[b], e);
    let vb = shaped(&[b], "i1");
    let vi = shaped(&[b], "i64");
    let st = format!("tensor<{e}>");
    let i64t = "tensor<i64>";
    let reduce = |w: &mut dyn FnMut(String),
                  out: &str,
                  src: &str,
                  init: &str,
                  op: &str,
                  t: &str,
                  from: &str,
                  to: &str| {
        w(format!(
            "{out} = \"stablehlo.reduce\"({src}, {init}) ({{\n      ^bb0(%a: {t}, %b: {t}):\n        %r = {op} %a, %b : {t}\n        stablehlo.return %r : {t}\n    }}) {{dimensions = array<i64: 1>}} : ({from}, {t}) -> {to}"
        ));
    };
    let a = format!("{x}_c1");
    w(format!("{x}_i0 = stablehlo.constant dense<0> : {i64t}"));
    w(format!("{x}_nz = stablehlo.constant dense<-0.0> : {st}"));
    w(format!("{x}_nzc = stablehlo.constant dense<-0.0> : {ct}"));
    w(format!("{x}_nzr = stablehlo.constant dense<-0.0> : {rt}"));
    w(format!("{x}_nza = stablehlo.constant dense<-0.0> : {at}"));
    // Column k, and the pivot row: the first largest magnitude at or
    // below k (rows above k are -2, NaN -1: NaN wins only alone).
    w(format!(
        "{x}_col3 = \"stablehlo.dynamic_slice\"({a}, {x}_i0, {x}_i0, {x}_k) {{slice_sizes = array<i64: {b}, {m}, 1>}} : ({at}, {i64t}, {i64t}, {i64t}) -> {}",
        shaped(&[b, m, 1], e)
    ));
    w(format!(
        "{x}_col = stablehlo.reshape {x}_col3 : ({}) -> {ct}",
        shaped(&[b, m, 1], e)
    ));
    w(format!("{x}_mag = stablehlo.abs {x}_col : {ct}"));
    w(format!("{x}_ri = stablehlo.iota dim = 1 : {ci}"));
    w(format!(
        "{x}_kc = stablehlo.broadcast_in_dim {x}_k, dims = [] : ({i64t}) -> {ci}"
    ));
    w(format!(
        "{x}_above = stablehlo.compare LT, {x}_ri, {x}_kc, SIGNED : ({ci}, {ci}) -> {cb}"
    ));
    w(format!(
        "{x}_isnan = stablehlo.compare NE, {x}_mag, {x}_mag, FLOAT : ({ct}, {ct}) -> {cb}"
    ));
    w(format!("{x}_m1 = stablehlo.constant dense<-1.0> : {ct}"));
    w(format!("{x}_m2 = stablehlo.constant dense<-2.0> : {ct}"));
    w(format!(
        "{x}_c0 = stablehlo.select {x}_isnan, {x}_m1, {x}_mag : ({cb}, {ct}, {ct}) -> {ct}"
    ));
    w(format!(
        "{x}_cand = stablehlo.select {x}_above, {x}_m2, {x}_c0 : ({cb}, {ct}, {ct}) -> {ct}"
    ));
    w(format!("{x}_m2s = stablehlo.constant dense<-2.0> : {st}"));
    reduce(
        &mut w,
        &format!("{x}_best"),
        &format!("{x}_cand"),
        &format!("{x}_m2s"),
        "stablehlo.maximum",
        &st,
        &ct,
        &vt,
    );
    w(format!(
        "{x}_bestb = stablehlo.broadcast_in_dim {x}_best, dims = [0] : ({vt}) -> {ct}"
    ));
    w(format!(
        "{x}_hit = stablehlo.compare EQ, {x}_cand, {x}_bestb, FLOAT : ({ct}, {ct}) -> {cb}"
    ));
    w(format!("{x}_mc = stablehlo.constant dense<{m}> : {ci}"));
    w(format!("{x}_ms = stablehlo.constant dense<{m}> : {i64t}"));
    w(format!(
        "{x}_idx = stablehlo.select {x}_hit, {x}_ri, {x}_mc : ({cb}, {ci}, {ci}) -> {ci}"
    ));
    reduce(
        &mut w,
        &format!("{x}_piv"),
        &format!("{x}_idx"),
        &format!("{x}_ms"),
        "stablehlo.minimum",
        i64t,
        &ci,
        &vi,
    );
    // Swap rows k and piv.
    w(format!("{x}_rows = stablehlo.iota dim = 1 : {ai}"));
    w(format!("{x}_cols = stablehlo.iota dim = 2 : {ai}"));
    w(format!(
        "{x}_pa = stablehlo.broadcast_in_dim {x}_piv, dims = [0] : ({vi}) -> {ai}"
    ));
    w(format!(
        "{x}_ka = stablehlo.broadcast_in_dim {x}_k, dims = [] : ({i64t}) -> {ai}"
    ));
    w(format!(
        "{x}_isp = stablehlo.compare EQ, {x}_rows, {x}_pa, SIGNED : ({ai}, {ai}) -> {ab}"
    ));
    w(format!(
        "{x}_isk = stablehlo.compare EQ, {x}_rows, {x}_ka, SIGNED : ({ai}, {ai}) -> {ab}"
    ));
    w(format!(
        "{x}_prm = stablehlo.select {x}_isp, {a}, {x}_nza : ({ab}, {at}, {at}) -> {at}"
    ));
    reduce(
        &mut w,
        &format!("{x}_prow"),
        &format!("{x}_prm"),
        &format!("{x}_nz"),
        "stablehlo.add",
        &st,
        &at,
        &rt,
    );
    w(format!(
        "{x}_krow3 = \"stablehlo.dynamic_slice\"({a}, {x}_i0, {x}_k, {x}_i0) {{slice_sizes = array<i64: {b}, 1, {n}>}} : ({at}, {i64t}, {i64t}, {i64t}) -> {}",
        shaped(&[b, 1, n], e)
    ));
    w(format!(
        "{x}_krow = stablehlo.reshape {x}_krow3 : ({}) -> {rt}",
        shaped(&[b, 1, n], e)
    ));
    w(format!(
        "{x}_prowb = stablehlo.broadcast_in_dim {x}_prow, dims = [0, 2] : ({rt}) -> {at}"
    ));
    w(format!(
        "{x}_krowb = stablehlo.broadcast_in_dim {x}_krow, dims = [0, 2] : ({rt}) -> {at}"
    ));
    w(format!(
        "{x}_s1 = stablehlo.select {x}_isp, {x}_krowb, {a} : ({ab}, {at}, {at}) -> {at}"
    ));
    w(format!(
        "{x}_a1 = stablehlo.select {x}_isk, {x}_prowb, {x}_s1 : ({ab}, {at}, {at}) -> {at}"
    ));
    // The pivot (row piv's element k), 1 in its place where it is 0.
    w(format!(
        "{x}_pv2 = \"stablehlo.dynamic_slice\"({x}_prow, {x}_i0, {x}_k) {{slice_sizes = array<i64: {b}, 1>}} : ({rt}, {i64t}, {i64t}) -> {}",
        shaped(&[b, 1], e)
    ));
    w(format!(
        "{x}_pv = stablehlo.reshape {x}_pv2 : ({}) -> {vt}",
        shaped(&[b, 1], e)
    ));
    w(format!("{x}_zv = stablehlo.constant dense<0.0> : {vt}"));
    w(format!("{x}_ov = stablehlo.constant dense<1.0> : {vt}"));
    w(format!(
        "{x}_pz = stablehlo.compare EQ, {x}_pv, {x}_zv, FLOAT : ({vt}, {vt}) -> {vb}"
    ));
    w(format!(
        "{x}_div = stablehlo.select {x}_pz, {x}_ov, {x}_pv : ({vb}, {vt}, {vt}) -> {vt}"
    ));
    // l = column k / pivot below row k; u = row piv right of column k.
    w(format!(
        "{x}_ck3 = \"stablehlo.dynamic_slice\"({x}_a1, {x}_i0, {x}_i0, {x}_k) {{slice_sizes = array<i64: {b}, {m}, 1>}} : ({at}, {i64t}, {i64t}, {i64t}) -> {}",
        shaped(&[b, m, 1], e)
    ));
    w(format!(
        "{x}_ck = stablehlo.reshape {x}_ck3 : ({}) -> {ct}",
        shaped(&[b, m, 1], e)
    ));
    w(format!(
        "{x}_divb = stablehlo.broadcast_in_dim {x}_div, dims = [0] : ({vt}) -> {ct}"
    ));
    w(format!("{x}_l = stablehlo.divide {x}_ck, {x}_divb : {ct}"));
    w(format!(
        "{x}_below = stablehlo.compare GT, {x}_ri, {x}_kc, SIGNED : ({ci}, {ci}) -> {cb}"
    ));
    w(format!("{x}_zc = stablehlo.constant dense<0.0> : {ct}"));
    w(format!(
        "{x}_lz = stablehlo.select {x}_below, {x}_l, {x}_zc : ({cb}, {ct}, {ct}) -> {ct}"
    ));
    w(format!("{x}_cj = stablehlo.iota dim = 1 : {ri}"));
    w(format!(
        "{x}_kr = stablehlo.broadcast_in_dim {x}_k, dims = [] : ({i64t}) -> {ri}"
    ));
    w(format!(
        "{x}_right = stablehlo.compare GT, {x}_cj, {x}_kr, SIGNED : ({ri}, {ri}) -> {rb}"
    ));
    w(format!("{x}_zr = stablehlo.constant dense<0.0> : {rt}"));
    w(format!(
        "{x}_u = stablehlo.select {x}_right, {x}_prow, {x}_zr : ({rb}, {rt}, {rt}) -> {rt}"
    ));
    w(format!(
        "{x}_lb = stablehlo.broadcast_in_dim {x}_lz, dims = [0, 1] : ({ct}) -> {at}"
    ));
    w(format!(
        "{x}_ub = stablehlo.broadcast_in_dim {x}_u, dims = [0, 2] : ({rt}) -> {at}"
    ));
    w(format!(
        "{x}_upd = stablehlo.multiply {x}_lb, {x}_ub : {at}"
    ));
    w(format!(
        "{x}_red = stablehlo.subtract {x}_a1, {x}_upd : {at}"
    ));
    // Rows below k keep the trailing block's update only right of k;
    // column k below the pivot stores l.
    w(format!(
        "{x}_bl = stablehlo.compare GT, {x}_rows, {x}_ka, SIGNED : ({ai}, {ai}) -> {ab}"
    ));
    w(format!(
        "{x}_rt = stablehlo.compare GT, {x}_cols, {x}_ka, SIGNED : ({ai}, {ai}) -> {ab}"
    ));
    w(format!(
        "{x}_atk = stablehlo.compare EQ, {x}_cols, {x}_ka, SIGNED : ({ai}, {ai}) -> {ab}"
    ));
    w(format!("{x}_trail = stablehlo.and {x}_bl, {x}_rt : {ab}"));
    w(format!("{x}_store = stablehlo.and {x}_bl, {x}_atk : {ab}"));
    w(format!(
        "{x}_a15 = stablehlo.select {x}_trail, {x}_red, {x}_a1 : ({ab}, {at}, {at}) -> {at}"
    ));
    w(format!(
        "{x}_a2 = stablehlo.select {x}_store, {x}_lb, {x}_a15 : ({ab}, {at}, {at}) -> {at}"
    ));
    // Pivot k and the permutation.
    let pt = shaped(&[b, k_steps], "i64");
    let pb = shaped(&[b, k_steps], "i1");
    w(format!("{x}_pi = stablehlo.iota dim = 1 : {pt}"));
    w(format!(
        "{x}_kp = stablehlo.broadcast_in_dim {x}_k, dims = [] : ({i64t}) -> {pt}"
    ));
    w(format!(
        "{x}_atp = stablehlo.compare EQ, {x}_pi, {x}_kp, SIGNED : ({pt}, {pt}) -> {pb}"
    ));
    w(format!(
        "{x}_pvb = stablehlo.broadcast_in_dim {x}_piv, dims = [0] : ({vi}) -> {pt}"
    ));
    w(format!(
        "{x}_p1 = stablehlo.select {x}_atp, {x}_pvb, {x}_c2 : ({pb}, {pt}, {pt}) -> {pt}"
    ));
    swap_entries(&mut w, x, &format!("{x}_c3"), &format!("{x}_piv"), b, m);
}

/// PivotsToPermutation of `input` (typed `it`, dims [b.., k]) into `out`
/// (typed `ot`, [b.., m]).
pub(super) fn pivots_to_permutation(
    w: &mut impl FnMut(String),
    input: &str,
    it: &str,
    dims: &[u64],
    m: u64,
    out: &str,
    ot: &str,
) {
    let r = dims.len();
    let k_steps = dims[r - 1];
    let b: u64 = dims[..r - 1].iter().product();
    let x = format!("{out}_pp");
    let pt = shaped(&[b, k_steps], "i64");
    let qt = shaped(&[b, m], "i64");
    w(format!(
        "{x}_p = stablehlo.reshape {input} : ({it}) -> {pt}"
    ));
    w(format!("{x}_q0 = stablehlo.iota dim = 1 : {qt}"));
    let q = if k_steps == 0 || b == 0 || m == 0 {
        format!("{x}_q0")
    } else {
        let types = [qt.clone()];
        let q0 = format!("{x}_q0");
        while_loop(w, &x, k_steps, &[q0.as_str()], &types, |w| {
            let mut w = |s: String| w(s);
            let vi = shaped(&[b], "i64");
            w(format!(
                "{x}_i0 = stablehlo.constant dense<0> : tensor<i64>"
            ));
            w(format!(
                "{x}_pk2 = \"stablehlo.dynamic_slice\"({x}_p, {x}_i0, {x}_k) {{slice_sizes = array<i64: {b}, 1>}} : ({pt}, tensor<i64>, tensor<i64>) -> {}",
                shaped(&[b, 1], "i64")
            ));
            w(format!(
                "{x}_pk = stablehlo.reshape {x}_pk2 : ({}) -> {vi}",
                shaped(&[b, 1], "i64")
            ));
            swap_entries(&mut w, &x, &format!("{x}_c1"), &format!("{x}_pk"), b, m);
            vec![format!("{x}_q1")]
        });
        format!("{x}_w#1")
    };
    w(format!("{out} = stablehlo.reshape {q} : ({qt}) -> {ot}"));
}

/// Cholesky of `input` (typed `it`, dims [b.., n, n], of `d`) into `out`
/// (typed `ot`): column j of L from A's column j less L's rows dotted
/// with row j (a product over the columns filled so far), divided by
/// sqrt(d_j); a pivot d_j not above 0 (or NaN) makes the column NaN, and
/// so every later one, as the host kernel.
pub(super) fn cholesky(
    w: &mut impl FnMut(String),
    input: &str,
    it: &str,
    dims: &[u64],
    d: DType,
    out: &str,
    ot: &str,
) {
    let r = dims.len();
    let n = dims[r - 1];
    let b: u64 = dims[..r - 2].iter().product();
    let x = format!("{out}_ch");
    let e = elem(d);
    let at = shaped(&[b, n, n], e);
    w(format!(
        "{x}_a0 = stablehlo.reshape {input} : ({it}) -> {at}"
    ));
    w(format!("{x}_l0 = stablehlo.constant dense<0.0> : {at}"));
    let l = if n == 0 || b == 0 {
        format!("{x}_l0")
    } else {
        let types = [at.clone(), at.clone()];
        let (a0, l0) = (format!("{x}_a0"), format!("{x}_l0"));
        while_loop(w, &x, n, &[a0.as_str(), l0.as_str()], &types, |w| {
            let mut w = |s: String| w(s);
            let vt = shaped(&[b, n], e);
            let vb = shaped(&[b, n], "i1");
            let vi = shaped(&[b, n], "i64");
            let st = shaped(&[b], e);
            let s1 = shaped(&[b, 1], e);
            let c1 = shaped(&[b, n, 1], e);
            let r1 = shaped(&[b, 1, n], e);
            let ab = shaped(&[b, n, n], "i1");
            let ai = shaped(&[b, n, n], "i64");
            let i64t = "tensor<i64>";
            let (a, l) = (format!("{x}_c1"), format!("{x}_c2"));
            w(format!("{x}_i0 = stablehlo.constant dense<0> : {i64t}"));
            w(format!(
                "{x}_row3 = \"stablehlo.dynamic_slice\"({l}, {x}_i0, {x}_k, {x}_i0) {{slice_sizes = array<i64: {b}, 1, {n}>}} : ({at}, {i64t}, {i64t}, {i64t}) -> {r1}"
            ));
            w(format!(
                "{x}_row = stablehlo.reshape {x}_row3 : ({r1}) -> {vt}"
            ));
            w(format!(
                "{x}_s = stablehlo.dot_general {l}, {x}_row, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [HIGHEST, HIGHEST] : ({at}, {vt}) -> {vt}"
            ));
            w(format!(
                "{x}_col3 = \"stablehlo.dynamic_slice\"({a}, {x}_i0, {x}_i0, {x}_k) {{slice_sizes = array<i64: {b}, {n}, 1>}} : ({at}, {i64t}, {i64t}, {i64t}) -> {c1}"
            ));
            w(format!(
                "{x}_col = stablehlo.reshape {x}_col3 : ({c1}) -> {vt}"
            ));
            w(format!("{x}_v = stablehlo.subtract {x}_col, {x}_s : {vt}"));
            w(format!(
                "{x}_d2 = \"stablehlo.dynamic_slice\"({x}_v, {x}_i0, {x}_k) {{slice_sizes = array<i64: {b}, 1>}} : ({vt}, {i64t}, {i64t}) -> {s1}"
            ));
            w(format!("{x}_d = stablehlo.reshape {x}_d2 : ({s1}) -> {st}"));
            w(format!(
                "{x}_db = stablehlo.broadcast_in_dim {x}_d, dims = [0] : ({st}) -> {vt}"
            ));
            w(format!("{x}_zv = stablehlo.constant dense<0.0> : {vt}"));
            let nan = if d == DType::F64 {
                "0x7FF8000000000000"
            } else {
                "0x7FC00000"
            };
            w(format!("{x}_nan = stablehlo.constant dense<{nan}> : {vt}"));
            w(format!(
                "{x}_ok = stablehlo.compare GT, {x}_db, {x}_zv, FLOAT : ({vt}, {vt}) -> {vb}"
            ));
            w(format!("{x}_rt = stablehlo.sqrt {x}_db : {vt}"));
            w(format!(
                "{x}_ljj = stablehlo.select {x}_ok, {x}_rt, {x}_nan : ({vb}, {vt}, {vt}) -> {vt}"
            ));
            w(format!("{x}_q = stablehlo.divide {x}_v, {x}_ljj : {vt}"));
            w(format!("{x}_ri = stablehlo.iota dim = 1 : {vi}"));
            w(format!(
                "{x}_kv = stablehlo.broadcast_in_dim {x}_k, dims = [] : ({i64t}) -> {vi}"
            ));
            w(format!(
                "{x}_isj = stablehlo.compare EQ, {x}_ri, {x}_kv, SIGNED : ({vi}, {vi}) -> {vb}"
            ));
            w(format!(
                "{x}_blw = stablehlo.compare GT, {x}_ri, {x}_kv, SIGNED : ({vi}, {vi}) -> {vb}"
            ));
            w(format!(
                "{x}_q1 = stablehlo.select {x}_blw, {x}_q, {x}_zv : ({vb}, {vt}, {vt}) -> {vt}"
            ));
            w(format!(
                "{x}_newc = stablehlo.select {x}_isj, {x}_ljj, {x}_q1 : ({vb}, {vt}, {vt}) -> {vt}"
            ));
            w(format!("{x}_cols = stablehlo.iota dim = 2 : {ai}"));
            w(format!(
                "{x}_ka = stablehlo.broadcast_in_dim {x}_k, dims = [] : ({i64t}) -> {ai}"
            ));
            w(format!(
                "{x}_atj = stablehlo.compare EQ, {x}_cols, {x}_ka, SIGNED : ({ai}, {ai}) -> {ab}"
            ));
            w(format!(
                "{x}_newb = stablehlo.broadcast_in_dim {x}_newc, dims = [0, 1] : ({vt}) -> {at}"
            ));
            w(format!(
                "{x}_l1 = stablehlo.select {x}_atj, {x}_newb, {l} : ({ab}, {at}, {at}) -> {at}"
            ));
            vec![a, format!("{x}_l1")]
        });
        format!("{x}_w#2")
    };
    w(format!("{out} = stablehlo.reshape {l} : ({at}) -> {ot}"));
}
