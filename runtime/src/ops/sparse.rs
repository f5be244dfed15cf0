//! SparseCore embedding ops: a sparse (CSR/COO) matrix of samples by table
//! rows times a dense embedding table, its row-sparse gradient, and the
//! optimizer updates fused into that backward (TorchTPU's
//! `sparse_dense_matmul*` family).
//!
//! The sparse matrix comes as four tensors:
//! - `row_pointers` [P] (integer): the end of each partition's entries
//!   (one partition per SparseCore), non-decreasing; entries at or past
//!   `row_pointers[P - 1]` are padding and take no part;
//! - `embedding_ids` [N] (integer): the table row of each entry;
//! - `sample_ids` [N] (integer): the output row (sample) of each entry;
//! - `gains` [N] (float): each entry's weight (1 for sum pooling, 1/len
//!   for mean, or a per-sample weight).
//!
//! The forward is `out[sample_ids[i]] += gains[i] * table[embedding_ids[i]]`.
//! An entry whose ids fall outside the table or the batch is left out, so
//! nothing reads or writes out of bounds on any platform;
//! `sparse_csr_check` reports the first such entry, which the frontends
//! turn into an error naming the table and the position.
//!
//! Gradients are row-sparse: entries are sorted by row, and each touched
//! row's gradient is the sum of its entries'; the optimizers update the
//! touched rows only (untouched rows and their state are unchanged, as in
//! fbgemm's and TorchTPU's fused updates). The work is O(N log N + N D) in
//! the number of entries N, plus the copy of the table (and state) that a
//! functional update makes.

use super::attrs::Attrs;
use super::emit::Emitter;
use super::index::per_row;
use super::support::{compute_dtype, iota};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CompareOp, DType, Prim, ReduceOp, ScatterCombiner, UnaryOp, ValueId};

/// The four CSR inputs, checked for shape and dtype and cleaned: entries
/// that are padding or out of range have `live` false, id and sample 0 and
/// gain 0 (in the compute dtype `cd`).
struct Csr {
    n: u64,
    live: ValueId,
    ids: ValueId,
    samples: ValueId,
    gains: ValueId,
}

fn vector(e: &mut Emitter, v: ValueId, what: &str) -> Result<ValueId> {
    if e.rank(v) != 1 {
        return Err(Error::invalid(format!(
            "{what} must be 1-D, got {}",
            e.ty(v)
        )));
    }
    Ok(v)
}

fn int_vector(e: &mut Emitter, v: ValueId, what: &str) -> Result<ValueId> {
    let v = vector(e, v, what)?;
    if !e.dtype(v).is_integer() || e.dtype(v) == DType::Bool {
        return Err(Error::invalid(format!(
            "{what} must be an integer tensor, got {}",
            e.ty(v)
        )));
    }
    e.convert(v, DType::I64)
}

/// Entries before `row_pointers[-1]` (clamped to N), as a bool [N].
fn active(e: &mut Emitter, row_pointers: ValueId, n: u64) -> Result<ValueId> {
    let rp = int_vector(e, row_pointers, "row_pointers")?;
    let p = e.dims(rp)[0];
    if p == 0 {
        return Err(Error::invalid(
            "row_pointers must have at least one entry (the end of the last partition)",
        ));
    }
    let last = e.op(
        Prim::Slice {
            start: vec![p - 1],
            limit: vec![p],
            stride: vec![1],
        },
        &[rp],
    )?;
    let last = e.reshape(last, &[])?;
    let pos = iota(e, &[n], 0)?;
    e.compare(CompareOp::Lt, pos, last)
}

/// `lo <= v < hi` for an i64 vector.
fn in_range(e: &mut Emitter, v: ValueId, hi: u64) -> Result<ValueId> {
    let zero = e.scalar(DType::I64, 0.0)?;
    let hi = e.scalar(DType::I64, hi as f64)?;
    let ge = e.compare(CompareOp::Ge, v, zero)?;
    let lt = e.compare(CompareOp::Lt, v, hi)?;
    e.binary(BinaryOp::And, ge, lt)
}

fn csr(e: &mut Emitter, x: &[ValueId], rows: u64, batch: u64, cd: DType) -> Result<Csr> {
    let ids = int_vector(e, x[1], "embedding_ids")?;
    let n = e.dims(ids)[0];
    let samples = int_vector(e, x[2], "sample_ids")?;
    let gains = vector(e, x[3], "gains")?;
    for (v, what) in [(samples, "sample_ids"), (gains, "gains")] {
        if e.dims(v)[0] != n {
            return Err(Error::invalid(format!(
                "{what} must have one entry per embedding id ({n}), got {}",
                e.ty(v)
            )));
        }
    }
    if !e.dtype(gains).is_float() {
        return Err(Error::invalid(format!(
            "gains must be a float tensor, got {}",
            e.ty(gains)
        )));
    }
    let act = active(e, x[0], n)?;
    let id_ok = in_range(e, ids, rows)?;
    let sample_ok = in_range(e, samples, batch)?;
    let live = e.binary(BinaryOp::And, act, id_ok)?;
    let live = e.binary(BinaryOp::And, live, sample_ok)?;
    let zero_i = e.scalar(DType::I64, 0.0)?;
    let ids = e.select(live, ids, zero_i)?;
    let samples = e.select(live, samples, zero_i)?;
    let gains = e.convert(gains, cd)?;
    let zero = e.scalar(cd, 0.0)?;
    let gains = e.select(live, gains, zero)?;
    Ok(Csr {
        n,
        live,
        ids,
        samples,
        gains,
    })
}

fn table_of(e: &mut Emitter, t: ValueId, what: &str) -> Result<(u64, u64, DType)> {
    if e.rank(t) != 2 || !e.dtype(t).is_float() {
        return Err(Error::invalid(format!(
            "{what} must be a 2-D float tensor [rows, dim], got {}",
            e.ty(t)
        )));
    }
    let d = e.dims(t);
    Ok((d[0], d[1], compute_dtype(e.dtype(t))?))
}

fn take_rows(e: &mut Emitter, t: ValueId, idx: ValueId) -> Result<ValueId> {
    e.op(Prim::Take { axis: 0 }, &[t, idx])
}

fn scatter_rows(
    e: &mut Emitter,
    base: ValueId,
    idx: ValueId,
    upd: ValueId,
    c: ScatterCombiner,
) -> Result<ValueId> {
    let d = e.dims(upd)[1];
    let idx = per_row(e, idx, d)?;
    e.op(
        Prim::Scatter {
            axis: 0,
            combiner: c,
        },
        &[base, idx, upd],
    )
}

fn positive(a: &Attrs, name: &str) -> Result<u64> {
    let v = a.int(name)?;
    if v < 0 {
        return Err(Error::invalid(format!("{name} must be >= 0, got {v}")));
    }
    Ok(v as u64)
}

/// sparse_dense_matmul(row_pointers, embedding_ids, sample_ids, gains,
/// table [V, D]; batch_size) -> [batch_size, D] in the table's dtype.
fn sparse_dense_matmul(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let (rows, d, cd) = table_of(e, x[4], "embedding_table")?;
    let batch = positive(a, "batch_size")?;
    let c = csr(e, x, rows, batch, cd)?;
    let r = take_rows(e, x[4], c.ids)?;
    let r = e.convert(r, cd)?;
    let g = per_row(e, c.gains, d)?;
    let r = e.mul(r, g)?;
    let base = e.full(cd, &[batch, d], 0.0)?;
    let out = scatter_rows(e, base, c.samples, r, ScatterCombiner::Add)?;
    Ok(vec![e.convert(out, e.dtype(x[4]))?])
}

/// The row-sparse gradient of the CSR inputs `x[..4]` against the
/// activation gradient `grad` [B, D]: entries sorted by row (`rows` [N],
/// padding and out-of-range entries last, with row `v`), each sorted
/// entry's segment (its position among the distinct rows) `seg` [N], and
/// the summed gradient of each segment `sums` [N, D] (zero past the last).
struct RowGrad {
    rows: ValueId,
    seg: ValueId,
    sums: ValueId,
}

fn row_grad(e: &mut Emitter, c: &Csr, grad: ValueId, v: u64, cd: DType) -> Result<RowGrad> {
    let n = c.n;
    let d = e.dims(grad)[1];
    let g = take_rows(e, grad, c.samples)?;
    let g = e.convert(g, cd)?;
    let w = per_row(e, c.gains, d)?;
    let g = e.mul(g, w)?;
    // Sort by row; dead entries take row v, past every real row.
    let vv = e.scalar(DType::I64, v as f64)?;
    let key = e.select(c.live, c.ids, vv)?;
    let (rows, perm) = e.sort(key, 0, false)?;
    let g = take_rows(e, g, perm)?;
    // A segment starts where the row differs from the previous one.
    let first = if n == 0 {
        e.full(DType::Bool, &[0], 0.0)?
    } else {
        let before = e.full(DType::I64, &[1], -1.0)?;
        let head = e.op(
            Prim::Slice {
                start: vec![0],
                limit: vec![n - 1],
                stride: vec![1],
            },
            &[rows],
        )?;
        let prev = e.op(Prim::Concatenate { dimension: 0 }, &[before, head])?;
        e.compare(CompareOp::Ne, rows, prev)?
    };
    let starts = e.convert(first, DType::I64)?;
    let seg = e.op(
        Prim::Cumulative {
            op: ReduceOp::Sum,
            dimension: 0,
            reverse: false,
        },
        &[starts],
    )?;
    let seg = e.binary_scalar(BinaryOp::Sub, seg, 1.0)?;
    let base = e.full(cd, &[n, d], 0.0)?;
    let sums = scatter_rows(e, base, seg, g, ScatterCombiner::Add)?;
    Ok(RowGrad { rows, seg, sums })
}

/// The CSR inputs, table and gradient of a `*_grad*` op, checked.
fn grad_inputs(
    e: &mut Emitter,
    x: &[ValueId],
    table: ValueId,
    grad: ValueId,
) -> Result<(Csr, RowGrad, u64, u64, DType)> {
    let (v, d, cd) = table_of(e, table, "embedding_table")?;
    if e.rank(grad) != 2 || e.dims(grad)[1] != d || !e.dtype(grad).is_float() {
        return Err(Error::invalid(format!(
            "the activation gradient must be a float tensor [batch, {d}], got {}",
            e.ty(grad)
        )));
    }
    let batch = e.dims(grad)[0];
    let c = csr(e, x, v, batch, cd)?;
    let rg = row_grad(e, &c, grad, v, cd)?;
    Ok((c, rg, v, d, cd))
}

/// sparse_dense_matmul_grad(row_pointers, embedding_ids, sample_ids,
/// gains, grad [B, D]; num_rows) -> (rows [N] i64, values [N, D]): the
/// coalesced row-sparse gradient of the table: the first k entries of
/// `rows` are the k distinct rows touched (ascending) and `values` their
/// summed gradients; the rest are -1 and 0.
fn sparse_dense_matmul_grad(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let v = positive(a, "num_rows")?;
    let grad = x[4];
    if e.rank(grad) != 2 || !e.dtype(grad).is_float() {
        return Err(Error::invalid(format!(
            "the activation gradient must be a 2-D float tensor [batch, dim], got {}",
            e.ty(grad)
        )));
    }
    let (batch, cd) = (e.dims(grad)[0], compute_dtype(e.dtype(grad))?);
    let c = csr(e, x, v, batch, cd)?;
    let rg = row_grad(e, &c, grad, v, cd)?;
    let n = c.n;
    let vv = e.scalar(DType::I64, v as f64)?;
    let real = e.compare(CompareOp::Lt, rg.rows, vv)?;
    let none = e.scalar(DType::I64, -1.0)?;
    let marked = e.select(real, rg.rows, none)?;
    let base = e.full(DType::I64, &[n], -1.0)?;
    // Every entry of a segment writes the same row, so the order of the
    // duplicate writes does not matter.
    let rows = e.op(
        Prim::Scatter {
            axis: 0,
            combiner: ScatterCombiner::Replace,
        },
        &[base, rg.seg, marked],
    )?;
    Ok(vec![rows, e.convert(rg.sums, e.dtype(grad))?])
}

/// The learning rate input: a float scalar or one-element tensor.
fn lr_input(e: &mut Emitter, v: ValueId, cd: DType) -> Result<ValueId> {
    let t = e.ty(v);
    if t.numel() != 1 || !t.dtype.is_float() {
        return Err(Error::invalid(format!(
            "learning_rate must be a float tensor with one element, got {t}"
        )));
    }
    let s = e.reshape(v, &[])?;
    e.convert(s, cd)
}

/// Which fused update an op applies.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Update {
    Sgd,
    Adagrad,
    RowwiseAdagrad,
    Adam,
}

impl Update {
    /// Optimizer state tensors between the table and the gradient.
    fn states(self) -> usize {
        match self {
            Update::Sgd => 0,
            Update::Adagrad | Update::RowwiseAdagrad => 1,
            Update::Adam => 2,
        }
    }
}

/// A state tensor checked against the table: [V, D], or [V] / [V, 1] for
/// row-wise Adagrad. Returned as [V, D'] (D' = D or 1) in `cd`.
fn state_of(
    e: &mut Emitter,
    s: ValueId,
    v: u64,
    d: u64,
    rowwise: bool,
    cd: DType,
    what: &str,
) -> Result<ValueId> {
    let dims = e.dims(s);
    let ok = e.dtype(s).is_float()
        && if rowwise {
            dims == [v] || dims == [v, 1]
        } else {
            dims == [v, d]
        };
    if !ok {
        let want = if rowwise {
            format!("[{v}] or [{v}, 1]")
        } else {
            format!("[{v}, {d}]")
        };
        return Err(Error::invalid(format!(
            "{what} must be a float tensor {want} (the table's rows), got {}",
            e.ty(s)
        )));
    }
    let s = e.reshape(s, &[v, if rowwise { 1 } else { d }])?;
    e.convert(s, cd)
}

/// sparse_dense_matmul_grad_with_{sgd, adagrad, rowwise_adagrad, adam}:
/// (row_pointers, embedding_ids, sample_ids, gains, table [V, D],
/// states..., grad [B, D], learning_rate) with attributes eps (adagrad,
/// adam), beta1 and beta2 (adam) -> (table, states...), each in its
/// input's dtype and shape. For each touched row with summed gradient g:
///
/// - sgd: w -= lr g
/// - adagrad: a += g^2; w -= lr g / (sqrt(a) + eps)
/// - rowwise_adagrad: a += mean(g^2); w -= lr g / (sqrt(a) + eps)
/// - adam: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
///   w -= lr m / (sqrt(v) + eps) (no bias correction: the ops take no step
///   count, as TorchTPU's do not)
fn fused_update(e: &mut Emitter, x: &[ValueId], a: &Attrs, u: Update) -> Result<Vec<ValueId>> {
    let k = u.states();
    if x.len() != 7 + k {
        return Err(Error::invalid(format!(
            "takes row_pointers, embedding_ids, sample_ids, gains, embedding_table, {}\
             grad and learning_rate; got {} inputs",
            match u {
                Update::Sgd => "",
                Update::Adagrad | Update::RowwiseAdagrad => "accumulator, ",
                Update::Adam => "momentum, velocity, ",
            },
            x.len()
        )));
    }
    let table = x[4];
    let grad = x[5 + k];
    let (_, rg, v, d, cd) = grad_inputs(e, x, table, grad)?;
    let lr = lr_input(e, x[6 + k], cd)?;
    // Each sorted entry updates its row from the row's summed gradient, and
    // duplicates compute the same values, so their writes agree. Dead
    // entries (sorted last) stand in for the last live one: its row, its
    // segment, so the same values again; with no live entry at all they
    // write row 0's old values back.
    let vv = e.scalar(DType::I64, v as f64)?;
    let real = e.compare(CompareOp::Lt, rg.rows, vv)?;
    let none = e.scalar(DType::I64, -1.0)?;
    let last_of = |e: &mut Emitter, vals: ValueId| -> Result<ValueId> {
        let live = e.select(real, vals, none)?;
        e.reduce(ReduceOp::Max, live, &[0], false)
    };
    let last_row = last_of(e, rg.rows)?;
    let last_seg = last_of(e, rg.seg)?;
    let zero_i = e.scalar(DType::I64, 0.0)?;
    let any = e.compare(CompareOp::Ge, last_row, zero_i)?;
    let last_row = e.select(any, last_row, zero_i)?;
    let last_seg = e.select(any, last_seg, zero_i)?;
    let idx = e.select(real, rg.rows, last_row)?;
    let seg = e.select(real, rg.seg, last_seg)?;
    let g = take_rows(e, rg.sums, seg)?;
    let keep = |e: &mut Emitter, new: ValueId, old: ValueId| e.select(any, new, old);
    let w_all = e.convert(table, cd)?;
    let w = take_rows(e, w_all, idx)?;
    let eps = a.float_or("eps", 1e-10)?;
    let (new_w, new_states): (ValueId, Vec<ValueId>) = match u {
        Update::Sgd => {
            let step = e.mul(g, lr)?;
            (e.sub(w, step)?, vec![])
        }
        Update::Adagrad | Update::RowwiseAdagrad => {
            let rowwise = u == Update::RowwiseAdagrad;
            let acc_all = state_of(e, x[5], v, d, rowwise, cd, "accumulator")?;
            let acc0 = take_rows(e, acc_all, idx)?;
            let g2 = e.mul(g, g)?;
            let g2 = if rowwise {
                let s = e.reduce(ReduceOp::Sum, g2, &[1], true)?;
                e.binary_scalar(BinaryOp::Div, s, d.max(1) as f64)?
            } else {
                g2
            };
            let acc = e.add(acc0, g2)?;
            let den = e.unary(UnaryOp::Sqrt, acc)?;
            let den = e.binary_scalar(BinaryOp::Add, den, eps)?;
            let step = e.mul(g, lr)?;
            let step = e.div(step, den)?;
            let acc = keep(e, acc, acc0)?;
            let new_acc = scatter_rows(e, acc_all, idx, acc, ScatterCombiner::Replace)?;
            (e.sub(w, step)?, vec![new_acc])
        }
        Update::Adam => {
            let b1 = a.float_or("beta1", 0.9)?;
            let b2 = a.float_or("beta2", 0.999)?;
            let m_all = state_of(e, x[5], v, d, false, cd, "momentum")?;
            let v_all = state_of(e, x[6], v, d, false, cd, "velocity")?;
            let m0 = take_rows(e, m_all, idx)?;
            let vel0 = take_rows(e, v_all, idx)?;
            let m = e.binary_scalar(BinaryOp::Mul, m0, b1)?;
            let gm = e.binary_scalar(BinaryOp::Mul, g, 1.0 - b1)?;
            let m = e.add(m, gm)?;
            let vel = e.binary_scalar(BinaryOp::Mul, vel0, b2)?;
            let g2 = e.mul(g, g)?;
            let g2 = e.binary_scalar(BinaryOp::Mul, g2, 1.0 - b2)?;
            let vel = e.add(vel, g2)?;
            let den = e.unary(UnaryOp::Sqrt, vel)?;
            let den = e.binary_scalar(BinaryOp::Add, den, eps)?;
            let step = e.mul(m, lr)?;
            let step = e.div(step, den)?;
            let m = keep(e, m, m0)?;
            let vel = keep(e, vel, vel0)?;
            let new_m = scatter_rows(e, m_all, idx, m, ScatterCombiner::Replace)?;
            let new_v = scatter_rows(e, v_all, idx, vel, ScatterCombiner::Replace)?;
            (e.sub(w, step)?, vec![new_m, new_v])
        }
    };
    let new_w = keep(e, new_w, w)?;
    let new_table = scatter_rows(e, w_all, idx, new_w, ScatterCombiner::Replace)?;
    let mut outs = vec![new_table];
    outs.extend(new_states);
    // Each output in its input's dtype and shape.
    let mut res = Vec::with_capacity(outs.len());
    for (i, o) in outs.into_iter().enumerate() {
        let like = x[4 + i];
        let o = e.convert(o, e.dtype(like))?;
        let dims = e.dims(like);
        res.push(e.reshape(o, &dims)?);
    }
    Ok(res)
}

fn grad_sgd(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    fused_update(e, x, a, Update::Sgd)
}
fn grad_adagrad(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    fused_update(e, x, a, Update::Adagrad)
}
fn grad_rowwise_adagrad(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    fused_update(e, x, a, Update::RowwiseAdagrad)
}
fn grad_adam(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    fused_update(e, x, a, Update::Adam)
}

/// sparse_csr_check(row_pointers, embedding_ids, sample_ids, gains;
/// num_rows, batch_size) -> i64 [3]: (kind, position, value) of the first
/// bad entry, or (0, -1, 0). Kinds: 1 a row pointer decreases, is negative
/// or runs past the entries (position: the pointer's index); 2 an
/// embedding id outside 0..num_rows; 3 a sample id outside 0..batch_size;
/// 4 a gain that is NaN or infinite.
fn sparse_csr_check(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    let rows = positive(a, "num_rows")?;
    let batch = positive(a, "batch_size")?;
    let ids = int_vector(e, x[1], "embedding_ids")?;
    let n = e.dims(ids)[0];
    let samples = int_vector(e, x[2], "sample_ids")?;
    let gains = vector(e, x[3], "gains")?;
    if e.dims(samples)[0] != n || e.dims(gains)[0] != n || !e.dtype(gains).is_float() {
        return Err(Error::invalid(format!(
            "sample_ids and gains must have one entry per embedding id ({n}), got {} and {}",
            e.ty(samples),
            e.ty(gains)
        )));
    }
    let rp = int_vector(e, x[0], "row_pointers")?;
    let p = e.dims(rp)[0];
    if p == 0 {
        return Err(Error::invalid(
            "row_pointers must have at least one entry (the end of the last partition)",
        ));
    }
    // (kind, position, value) candidates: the first bad one of each kind,
    // then the lowest kind present.
    let first_bad = |e: &mut Emitter, bad: ValueId, vals: ValueId, len: u64, kind: f64| {
        if len == 0 {
            let found = e.scalar(DType::Bool, 0.0)?;
            let zero = e.scalar(DType::I64, 0.0)?;
            let none = e.scalar(DType::I64, -1.0)?;
            return Ok::<_, Error>((found, [zero, none, zero]));
        }
        let pos = iota(e, &[len], 0)?;
        let big = e.scalar(DType::I64, len as f64)?;
        let cand = e.select(bad, pos, big)?;
        let at = e.reduce(ReduceOp::Min, cand, &[0], false)?;
        let found = e.compare(CompareOp::Lt, at, big)?;
        let zero = e.scalar(DType::I64, 0.0)?;
        let safe = e.select(found, at, zero)?;
        let safe1 = e.reshape(safe, &[1])?;
        let val = e.op(Prim::Take { axis: 0 }, &[vals, safe1])?;
        let val = e.reshape(val, &[])?;
        let k = e.scalar(DType::I64, kind)?;
        let kind = e.select(found, k, zero)?;
        let none = e.scalar(DType::I64, -1.0)?;
        let at = e.select(found, at, none)?;
        let val = e.select(found, val, zero)?;
        Ok::<_, Error>((found, [kind, at, val]))
    };
    // Row pointers: non-decreasing, within 0..=n.
    let zero = e.full(DType::I64, &[1], 0.0)?;
    let head = e.op(
        Prim::Slice {
            start: vec![0],
            limit: vec![p - 1],
            stride: vec![1],
        },
        &[rp],
    )?;
    let prev = e.op(Prim::Concatenate { dimension: 0 }, &[zero, head])?;
    let dec = e.compare(CompareOp::Lt, rp, prev)?;
    let nn = e.scalar(DType::I64, n as f64)?;
    let past = e.compare(CompareOp::Gt, rp, nn)?;
    let rp_bad = e.binary(BinaryOp::Or, dec, past)?;
    let c1 = first_bad(e, rp_bad, rp, p, 1.0)?;
    let act = active(e, x[0], n)?;
    let id_ok = in_range(e, ids, rows)?;
    let id_bad = e.unary(UnaryOp::Not, id_ok)?;
    let id_bad = e.binary(BinaryOp::And, act, id_bad)?;
    let c2 = first_bad(e, id_bad, ids, n, 2.0)?;
    let s_ok = in_range(e, samples, batch)?;
    let s_bad = e.unary(UnaryOp::Not, s_ok)?;
    let s_bad = e.binary(BinaryOp::And, act, s_bad)?;
    let c3 = first_bad(e, s_bad, samples, n, 3.0)?;
    let gf = e.convert(gains, DType::F64)?;
    let diff = e.sub(gf, gf)?; // NaN for NaN and +-inf, else 0
    let zf = e.scalar(DType::F64, 0.0)?;
    let g_ok = e.compare(CompareOp::Eq, diff, zf)?;
    let g_bad = e.unary(UnaryOp::Not, g_ok)?;
    let g_bad = e.binary(BinaryOp::And, act, g_bad)?;
    let pos_as_val = iota(e, &[n], 0)?;
    let c4 = first_bad(e, g_bad, pos_as_val, n, 4.0)?;
    let mut out = c4.1;
    for (found, cand) in [c3, c2, c1] {
        for i in 0..3 {
            out[i] = e.select(found, cand[i], out[i])?;
        }
    }
    let parts = out
        .iter()
        .map(|&v| e.reshape(v, &[1]))
        .collect::<Result<Vec<_>>>()?;
    Ok(vec![e.op(Prim::Concatenate { dimension: 0 }, &parts)?])
}

pub(super) const OPS: &[OpDef] = &[
    def!(
        "sparse_dense_matmul",
        Arity::Exactly(5),
        sparse_dense_matmul
    ),
    def!(
        "sparse_dense_matmul_grad",
        Arity::Exactly(5),
        sparse_dense_matmul_grad
    ),
    def!(
        "sparse_dense_matmul_grad_with_sgd",
        Arity::Exactly(7),
        grad_sgd
    ),
    def!(
        "sparse_dense_matmul_grad_with_adagrad",
        Arity::Exactly(8),
        grad_adagrad
    ),
    def!(
        "sparse_dense_matmul_grad_with_rowwise_adagrad",
        Arity::Exactly(8),
        grad_rowwise_adagrad
    ),
    def!(
        "sparse_dense_matmul_grad_with_adam",
        Arity::Exactly(9),
        grad_adam
    ),
    def!("sparse_csr_check", Arity::Exactly(4), sparse_csr_check),
];
