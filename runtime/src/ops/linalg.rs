//! Matrix products: matmul (torch semantics), mm, bmm, addmm, baddbmm,
//! linear, dot, outer.

use super::attrs::Attrs;
use super::emit::{broadcast_shapes, Emitter};
use super::{Arity, OpDef};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, DType, Prim, ValueId};

fn check_numeric(e: &Emitter, x: ValueId) -> Result<()> {
    if e.dtype(x) == DType::Bool {
        return Err(Error::invalid(
            "matrix products of bool tensors are not supported",
        ));
    }
    Ok(())
}

/// [..., M, K] x [..., K, N] with broadcast batch dims (both rank >= 2).
fn batched(e: &mut Emitter, a: ValueId, b: ValueId) -> Result<ValueId> {
    let (ad, bd) = (e.dims(a), e.dims(b));
    let (ar, br) = (ad.len(), bd.len());
    if ad[ar - 1] != bd[br - 2] {
        return Err(Error::invalid(format!(
            "shapes {ad:?} and {bd:?} cannot be multiplied ({}x{} and {}x{})",
            ad[ar - 2],
            ad[ar - 1],
            bd[br - 2],
            bd[br - 1]
        )));
    }
    let batch = broadcast_shapes(&ad[..ar - 2], &bd[..br - 2])?;
    let nb = batch.len();
    let mut at = batch.clone();
    at.extend(&ad[ar - 2..]);
    let mut bt = batch.clone();
    bt.extend(&bd[br - 2..]);
    let a = e.broadcast_to(a, &at)?;
    let b = e.broadcast_to(b, &bt)?;
    let bdims: Vec<usize> = (0..nb).collect();
    let precision = e.product_precision(e.dtype(a));
    e.op(
        Prim::DotGeneral {
            lhs_batch: bdims.clone(),
            rhs_batch: bdims,
            lhs_contract: vec![nb + 1],
            rhs_contract: vec![nb],
            precision,
        },
        &[a, b],
    )
}

/// torch.matmul: 1-D operands are vectors; batch dims broadcast.
pub(super) fn matmul_values(e: &mut Emitter, a: ValueId, b: ValueId) -> Result<ValueId> {
    check_numeric(e, a)?;
    check_numeric(e, b)?;
    let (a, b) = {
        let (xs, _) = super::pointwise::promote(e, &[a, b], &Attrs::new())?;
        (xs[0], xs[1])
    };
    let (ar, br) = (e.rank(a), e.rank(b));
    if ar == 0 || br == 0 {
        return Err(Error::invalid(
            "both arguments to matmul need at least 1 dimension",
        ));
    }
    let a2 = if ar == 1 {
        e.reshape(a, &[1, e.dims(a)[0]])?
    } else {
        a
    };
    let b2 = if br == 1 {
        e.reshape(b, &[e.dims(b)[0], 1])?
    } else {
        b
    };
    let r = batched(e, a2, b2)?;
    let mut out = e.dims(r);
    if br == 1 {
        out.pop();
    }
    if ar == 1 {
        let n = out.len();
        out.remove(n - if br == 1 { 1 } else { 2 });
    }
    e.reshape(r, &out)
}

fn matmul(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    Ok(vec![matmul_values(e, x[0], x[1])?])
}

fn need_rank(e: &Emitter, x: ValueId, r: usize, what: &str) -> Result<()> {
    if e.rank(x) != r {
        return Err(Error::invalid(format!(
            "{what} must be {r}-D, got {:?}",
            e.dims(x)
        )));
    }
    Ok(())
}

fn mm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    need_rank(e, x[0], 2, "self")?;
    need_rank(e, x[1], 2, "mat2")?;
    matmul(e, x, a)
}

fn bmm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    need_rank(e, x[0], 3, "self")?;
    need_rank(e, x[1], 3, "mat2")?;
    if e.dims(x[0])[0] != e.dims(x[1])[0] {
        return Err(Error::invalid(format!(
            "batch sizes differ: {:?} and {:?}",
            e.dims(x[0]),
            e.dims(x[1])
        )));
    }
    matmul(e, x, a)
}

/// beta * input + alpha * (m1 @ m2); beta = 0 ignores input (even NaN).
fn add_scaled(e: &mut Emitter, input: ValueId, prod: ValueId, a: &Attrs) -> Result<ValueId> {
    let beta = a.float_or("beta", 1.0)?;
    let alpha = a.float_or("alpha", 1.0)?;
    let prod = if alpha != 1.0 {
        e.binary_scalar(BinaryOp::Mul, prod, alpha)?
    } else {
        prod
    };
    let input = e.convert(input, e.dtype(prod))?;
    if beta == 0.0 {
        let dims = broadcast_shapes(&e.dims(input), &e.dims(prod))?;
        return e.broadcast_to(prod, &dims);
    }
    let input = if beta != 1.0 {
        e.binary_scalar(BinaryOp::Mul, input, beta)?
    } else {
        input
    };
    e.add(input, prod)
}

/// Whether products of these operands round to a half type (bf16, f16).
/// (Matrix operands have dimensions, so both promote at one priority.)
fn half_product(e: &Emitter, m1: ValueId, m2: ValueId) -> Option<DType> {
    use super::promote::{result_type, Priority};
    let dt = result_type(&[
        (e.dtype(m1), Priority::Dimensioned),
        (e.dtype(m2), Priority::Dimensioned),
    ]);
    matches!(dt, DType::BF16 | DType::F16).then_some(dt)
}

/// `beta * input + alpha * product(m1, m2)`, rounded once. In a half type
/// the product, its scaling and the sum are computed in f32 and rounded to
/// the half type at the end, as torch's CPU and CUDA kernels do (the
/// product rounded before the input was added made a bf16 Linear with a
/// bias differ from torch's in about a quarter of its elements, by one
/// unit in the last place). The f32 product of half values is exact
/// element by element, so it is the half product before its rounding.
fn add_product(
    e: &mut Emitter,
    x: &[ValueId],
    a: &Attrs,
    product: fn(&mut Emitter, &[ValueId], &Attrs) -> Result<Vec<ValueId>>,
) -> Result<Vec<ValueId>> {
    let plain = a.float_or("beta", 1.0)? == 0.0 && a.float_or("alpha", 1.0)? == 1.0;
    match half_product(e, x[1], x[2]) {
        Some(half) if !plain => {
            let wide = [
                x[0],
                e.convert(x[1], DType::F32)?,
                e.convert(x[2], DType::F32)?,
            ];
            let p = product(e, &wide[1..], a)?[0];
            let sum = add_scaled(e, wide[0], p, a)?;
            Ok(vec![e.convert(sum, half)?])
        }
        _ => {
            let p = product(e, &x[1..], a)?[0];
            Ok(vec![add_scaled(e, x[0], p, a)?])
        }
    }
}

fn addmm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    add_product(e, x, a, mm)
}

fn baddbmm(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    add_product(e, x, a, bmm)
}

/// linear(x, weight[out, in], bias?) = x @ weight^T + bias (with a bias
/// in a half type, rounded once as addmm is).
fn linear(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    let w = x[1];
    let wt = match e.rank(w) {
        1 => w,
        2 => e.transpose(w, &[1, 0])?,
        _ => {
            return Err(Error::invalid(format!(
                "weight must be 1-D or 2-D, got {:?}",
                e.dims(w)
            )))
        }
    };
    match x.get(2) {
        // As addmm: the bias added to the f32 product, rounded once.
        Some(&b) if half_product(e, x[0], wt).is_some() => {
            add_product(e, &[b, x[0], wt], &Attrs::new(), matmul)
        }
        Some(&b) => {
            let y = matmul_values(e, x[0], wt)?;
            let b = e.convert(b, e.dtype(y))?;
            Ok(vec![e.add(y, b)?])
        }
        None => Ok(vec![matmul_values(e, x[0], wt)?]),
    }
}

fn dot(e: &mut Emitter, x: &[ValueId], a: &Attrs) -> Result<Vec<ValueId>> {
    need_rank(e, x[0], 1, "self")?;
    need_rank(e, x[1], 1, "tensor")?;
    matmul(e, x, a)
}

fn outer(e: &mut Emitter, x: &[ValueId], _: &Attrs) -> Result<Vec<ValueId>> {
    need_rank(e, x[0], 1, "self")?;
    need_rank(e, x[1], 1, "vec2")?;
    let (n, m) = (e.dims(x[0])[0], e.dims(x[1])[0]);
    let a = e.reshape(x[0], &[n, 1])?;
    let b = e.reshape(x[1], &[1, m])?;
    let (xs, _) = super::pointwise::promote(e, &[a, b], &Attrs::new())?;
    Ok(vec![e.mul(xs[0], xs[1])?])
}

macro_rules! def {
    ($name:literal, $n:expr, $f:ident) => {
        OpDef {
            name: $name,
            arity: $n,
            build: $f,
        }
    };
}

pub(super) const OPS: &[OpDef] = &[
    def!("matmul", Arity::Exactly(2), matmul),
    def!("mm", Arity::Exactly(2), mm),
    def!("bmm", Arity::Exactly(2), bmm),
    def!("addmm", Arity::Exactly(3), addmm),
    def!("baddbmm", Arity::Exactly(3), baddbmm),
    def!("linear", Arity::Between(2, 3), linear),
    def!("dot", Arity::Exactly(2), dot),
    def!("outer", Arity::Exactly(2), outer),
];
