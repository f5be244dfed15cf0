//! Result types of each primitive, and the checks that make a node valid.
//! Errors say what is wrong in the terms of the primitive's operands.

use super::dtype::DType;
use super::graph::TensorType;
use super::prim::{BinaryOp, Prim, ReduceOp, UnaryOp};
use crate::error::{Error, Result};

fn err<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::invalid(msg))
}

fn arity(ins: &[TensorType], n: usize) -> Result<()> {
    if ins.len() != n {
        return err(format!("takes {n} operands, got {}", ins.len()));
    }
    Ok(())
}

fn same_type(a: &TensorType, b: &TensorType, what: &str) -> Result<()> {
    if a != b {
        return err(format!("{what}: {a} and {b} differ"));
    }
    Ok(())
}

fn check_dims_perm(perm: &[usize], rank: usize, what: &str) -> Result<()> {
    let mut seen = vec![false; rank];
    if perm.len() != rank {
        return err(format!("{what} has {} entries for rank {rank}", perm.len()));
    }
    for &p in perm {
        if p >= rank || std::mem::replace(&mut seen[p], true) {
            return err(format!("{what} {perm:?} is not a permutation of 0..{rank}"));
        }
    }
    Ok(())
}

fn check_unique_dims(dims: &[usize], rank: usize, what: &str) -> Result<()> {
    let mut seen = vec![false; rank];
    for &d in dims {
        if d >= rank || std::mem::replace(&mut seen[d], true) {
            return err(format!(
                "{what} {dims:?}: each must be a distinct dimension below rank {rank}"
            ));
        }
    }
    Ok(())
}

fn checked_numel(dims: &[u64]) -> Result<u64> {
    dims.iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= (1u64 << 48))
        .ok_or_else(|| Error::invalid(format!("dims {dims:?} hold too many elements")))
}

pub(super) fn infer(prim: &Prim, ins: &[TensorType]) -> Result<Vec<TensorType>> {
    let one = |t: TensorType| Ok(vec![t]);
    match prim {
        Prim::Constant { dtype, dims, bytes } => {
            arity(ins, 0)?;
            let n = checked_numel(dims)?;
            if bytes.len() as u64 != n * dtype.size() as u64 {
                return err(format!(
                    "{} bytes for {} elements of {dtype}",
                    bytes.len(),
                    n
                ));
            }
            one(TensorType::new(*dtype, dims))
        }
        Prim::Iota {
            dtype,
            dims,
            dimension,
        } => {
            arity(ins, 0)?;
            checked_numel(dims)?;
            if *dimension >= dims.len() {
                return err(format!(
                    "dimension {dimension} is not below rank {}",
                    dims.len()
                ));
            }
            one(TensorType::new(*dtype, dims))
        }
        Prim::Unary(op) => {
            arity(ins, 1)?;
            let t = &ins[0];
            let float_only = !matches!(
                op,
                UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Not | UnaryOp::IsFinite
            );
            if float_only && !t.dtype.is_float() {
                return err(format!("needs a floating-point operand, got {t}"));
            }
            if *op == UnaryOp::Not && t.dtype.is_float() {
                return err(format!("needs a bool or integer operand, got {t}"));
            }
            if matches!(op, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign) && t.dtype == DType::Bool {
                return err(format!("is not defined for bool, got {t}"));
            }
            if *op == UnaryOp::IsFinite {
                return one(TensorType::new(DType::Bool, &t.dims));
            }
            one(t.clone())
        }
        Prim::Binary(op) => {
            arity(ins, 2)?;
            same_type(&ins[0], &ins[1], "operands")?;
            let d = ins[0].dtype;
            match op {
                BinaryOp::And | BinaryOp::Or | BinaryOp::Xor if d.is_float() => {
                    return err(format!("needs bool or integer operands, got {}", ins[0]))
                }
                BinaryOp::Pow | BinaryOp::Atan2 if !d.is_float() => {
                    return err(format!("needs floating-point operands, got {}", ins[0]))
                }
                BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Rem
                    if d == DType::Bool =>
                {
                    return err("is not defined for bool operands")
                }
                _ => {}
            }
            one(ins[0].clone())
        }
        Prim::Compare(_) => {
            arity(ins, 2)?;
            same_type(&ins[0], &ins[1], "operands")?;
            one(TensorType::new(DType::Bool, &ins[0].dims))
        }
        Prim::Select => {
            arity(ins, 3)?;
            if ins[0].dtype != DType::Bool || ins[0].dims != ins[1].dims {
                return err(format!(
                    "predicate must be bool of the operands' dims, got {}",
                    ins[0]
                ));
            }
            same_type(&ins[1], &ins[2], "on_true and on_false")?;
            one(ins[1].clone())
        }
        Prim::Clamp => {
            arity(ins, 3)?;
            let x = &ins[1];
            for (t, name) in [(&ins[0], "min"), (&ins[2], "max")] {
                if t.dtype != x.dtype || !(t.dims.is_empty() || t.dims == x.dims) {
                    return err(format!(
                        "{name} must be a scalar or of x's type {x}, got {t}"
                    ));
                }
            }
            one(x.clone())
        }
        Prim::Convert { to } => {
            arity(ins, 1)?;
            one(TensorType::new(*to, &ins[0].dims))
        }
        Prim::BitcastConvert { to } => {
            arity(ins, 1)?;
            let from = ins[0].dtype;
            if from.size() != to.size() || from == DType::Bool || *to == DType::Bool {
                return err(format!(
                    "bitcast_convert reads the bytes of one element as another of the same \
                     width (not bool): {from} to {to} is not that"
                ));
            }
            one(TensorType::new(*to, &ins[0].dims))
        }
        Prim::BroadcastInDim { dims, mapping } => {
            arity(ins, 1)?;
            let x = &ins[0];
            checked_numel(dims)?;
            if mapping.len() != x.rank() {
                return err(format!(
                    "mapping has {} entries for operand rank {}",
                    mapping.len(),
                    x.rank()
                ));
            }
            for (i, &m) in mapping.iter().enumerate() {
                if m >= dims.len() || (i > 0 && m <= mapping[i - 1]) {
                    return err(format!(
                        "mapping {mapping:?} must be increasing and below rank {}",
                        dims.len()
                    ));
                }
                if x.dims[i] != 1 && x.dims[i] != dims[m] {
                    return err(format!(
                        "operand dimension {i} of size {} cannot broadcast to {}",
                        x.dims[i], dims[m]
                    ));
                }
            }
            one(TensorType::new(x.dtype, dims))
        }
        Prim::Reshape { dims } => {
            arity(ins, 1)?;
            if checked_numel(dims)? != ins[0].numel() {
                return err(format!("cannot reshape {} to {dims:?}", ins[0]));
            }
            one(TensorType::new(ins[0].dtype, dims))
        }
        Prim::Transpose { perm } => {
            arity(ins, 1)?;
            check_dims_perm(perm, ins[0].rank(), "perm")?;
            let dims: Vec<u64> = perm.iter().map(|&p| ins[0].dims[p]).collect();
            one(TensorType::new(ins[0].dtype, &dims))
        }
        Prim::Slice {
            start,
            limit,
            stride,
        } => {
            arity(ins, 1)?;
            let x = &ins[0];
            if start.len() != x.rank() || limit.len() != x.rank() || stride.len() != x.rank() {
                return err(format!(
                    "start, limit and stride need {} entries each",
                    x.rank()
                ));
            }
            let mut dims = Vec::new();
            for i in 0..x.rank() {
                if start[i] > limit[i] || limit[i] > x.dims[i] || stride[i] == 0 {
                    return err(format!(
                        "dimension {i}: start {} limit {} stride {} do not fit size {}",
                        start[i], limit[i], stride[i], x.dims[i]
                    ));
                }
                dims.push((limit[i] - start[i]).div_ceil(stride[i]));
            }
            one(TensorType::new(x.dtype, &dims))
        }
        Prim::DynamicSlice { sizes } => {
            let x = ins
                .first()
                .ok_or_else(|| Error::invalid("needs an operand"))?;
            arity(ins, 1 + x.rank())?;
            check_starts(&ins[1..])?;
            if sizes.len() != x.rank() || sizes.iter().zip(&x.dims).any(|(s, d)| s > d) {
                return err(format!("sizes {sizes:?} do not fit {x}"));
            }
            one(TensorType::new(x.dtype, sizes))
        }
        Prim::DynamicUpdateSlice => {
            let x = ins
                .first()
                .ok_or_else(|| Error::invalid("needs an operand"))?;
            arity(ins, 2 + x.rank())?;
            let u = &ins[1];
            if u.dtype != x.dtype
                || u.rank() != x.rank()
                || u.dims.iter().zip(&x.dims).any(|(a, b)| a > b)
            {
                return err(format!("update {u} does not fit into {x}"));
            }
            check_starts(&ins[2..])?;
            one(x.clone())
        }
        Prim::Pad {
            low,
            high,
            interior,
        } => {
            arity(ins, 2)?;
            let x = &ins[0];
            if ins[1] != TensorType::scalar(x.dtype) {
                return err(format!(
                    "pad value must be a {} scalar, got {}",
                    x.dtype, ins[1]
                ));
            }
            if low.len() != x.rank() || high.len() != x.rank() || interior.len() != x.rank() {
                return err(format!(
                    "low, high and interior need {} entries each",
                    x.rank()
                ));
            }
            let mut dims = Vec::new();
            for i in 0..x.rank() {
                let base = if x.dims[i] == 0 {
                    0
                } else {
                    x.dims[i] + (x.dims[i] - 1) * interior[i]
                } as i64;
                let d = base + low[i] + high[i];
                if d < 0 {
                    return err(format!("dimension {i} would have negative size {d}"));
                }
                dims.push(d as u64);
            }
            one(TensorType::new(x.dtype, &dims))
        }
        Prim::Concatenate { dimension } => {
            let first = ins
                .first()
                .ok_or_else(|| Error::invalid("needs at least one operand"))?;
            if *dimension >= first.rank() {
                return err(format!(
                    "dimension {dimension} is not below rank {}",
                    first.rank()
                ));
            }
            let mut dims = first.dims.clone();
            dims[*dimension] = 0;
            for t in ins {
                let ok = t.dtype == first.dtype
                    && t.rank() == first.rank()
                    && (0..t.rank()).all(|i| i == *dimension || t.dims[i] == first.dims[i]);
                if !ok {
                    return err(format!(
                        "{t} does not match {first} outside dimension {dimension}"
                    ));
                }
                dims[*dimension] += t.dims[*dimension];
            }
            one(TensorType::new(first.dtype, &dims))
        }
        Prim::Reverse { dimensions } => {
            arity(ins, 1)?;
            check_unique_dims(dimensions, ins[0].rank(), "dimensions")?;
            one(ins[0].clone())
        }
        Prim::Reduce { op, dimensions } => {
            arity(ins, 1)?;
            let x = &ins[0];
            check_unique_dims(dimensions, x.rank(), "dimensions")?;
            if matches!(op, ReduceOp::And | ReduceOp::Or) && x.dtype.is_float() {
                return err(format!("needs bool or integer elements, got {x}"));
            }
            let dims: Vec<u64> = (0..x.rank())
                .filter(|i| !dimensions.contains(i))
                .map(|i| x.dims[i])
                .collect();
            one(TensorType::new(x.dtype, &dims))
        }
        Prim::ArgReduce { dimension, .. } => {
            arity(ins, 1)?;
            let x = &ins[0];
            if *dimension >= x.rank() || x.dims[*dimension] == 0 {
                return err(format!("dimension {dimension} of {x} is missing or empty"));
            }
            let mut dims = x.dims.clone();
            dims.remove(*dimension);
            one(TensorType::new(DType::I64, &dims))
        }
        Prim::Cumulative { op, dimension, .. } => {
            arity(ins, 1)?;
            if *dimension >= ins[0].rank() {
                return err(format!(
                    "dimension {dimension} is not below rank {}",
                    ins[0].rank()
                ));
            }
            if matches!(op, ReduceOp::And | ReduceOp::Or) {
                return err("and/or are not cumulative ops");
            }
            one(ins[0].clone())
        }
        Prim::DotGeneral {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
            ..
        } => {
            arity(ins, 2)?;
            let (l, r) = (&ins[0], &ins[1]);
            if l.dtype != r.dtype || l.dtype == DType::Bool {
                return err(format!("operands {l} and {r} need one numeric dtype"));
            }
            let mut lused: Vec<usize> = lhs_batch.iter().chain(lhs_contract).copied().collect();
            let mut rused: Vec<usize> = rhs_batch.iter().chain(rhs_contract).copied().collect();
            check_unique_dims(&lused, l.rank(), "lhs batch and contracting dimensions")?;
            check_unique_dims(&rused, r.rank(), "rhs batch and contracting dimensions")?;
            if lhs_batch.len() != rhs_batch.len() || lhs_contract.len() != rhs_contract.len() {
                return err("lhs and rhs need as many batch and contracting dimensions");
            }
            for (a, b) in lhs_batch
                .iter()
                .zip(rhs_batch)
                .chain(lhs_contract.iter().zip(rhs_contract))
            {
                if l.dims[*a] != r.dims[*b] {
                    return err(format!(
                        "lhs dimension {a} (size {}) and rhs dimension {b} (size {}) differ",
                        l.dims[*a], r.dims[*b]
                    ));
                }
            }
            lused.sort_unstable();
            rused.sort_unstable();
            let mut dims: Vec<u64> = lhs_batch.iter().map(|&d| l.dims[d]).collect();
            dims.extend(
                (0..l.rank())
                    .filter(|d| !lused.contains(d))
                    .map(|d| l.dims[d]),
            );
            dims.extend(
                (0..r.rank())
                    .filter(|d| !rused.contains(d))
                    .map(|d| r.dims[d]),
            );
            one(TensorType::new(l.dtype, &dims))
        }
        Prim::Gather { axis } => {
            arity(ins, 2)?;
            let (x, idx) = (&ins[0], &ins[1]);
            index_type(idx)?;
            if *axis >= x.rank() || idx.rank() != x.rank() {
                return err(format!(
                    "index {idx} needs the rank of {x} and axis {axis} below it"
                ));
            }
            if (0..x.rank()).any(|d| d != *axis && idx.dims[d] > x.dims[d]) {
                return err(format!(
                    "index {idx} is larger than {x} outside axis {axis}"
                ));
            }
            one(TensorType::new(x.dtype, &idx.dims))
        }
        Prim::Take { axis } => {
            arity(ins, 2)?;
            let (x, idx) = (&ins[0], &ins[1]);
            index_type(idx)?;
            if *axis >= x.rank() {
                return err(format!("axis {axis} is not below the rank of {x}"));
            }
            let mut dims = x.dims[..*axis].to_vec();
            dims.extend(&idx.dims);
            dims.extend(&x.dims[axis + 1..]);
            one(TensorType::new(x.dtype, &dims))
        }
        Prim::Scatter { axis, .. } => {
            arity(ins, 3)?;
            let (x, idx, upd) = (&ins[0], &ins[1], &ins[2]);
            index_type(idx)?;
            if *axis >= x.rank()
                || idx.rank() != x.rank()
                || upd.dims != idx.dims
                || upd.dtype != x.dtype
            {
                return err(format!(
                    "x {x}, index {idx} and updates {upd} do not agree (axis {axis})"
                ));
            }
            if (0..x.rank()).any(|d| d != *axis && idx.dims[d] > x.dims[d]) {
                return err(format!(
                    "index {idx} is larger than {x} outside axis {axis}"
                ));
            }
            one(x.clone())
        }
        Prim::TriangularSolve { left_side, .. } => {
            arity(ins, 2)?;
            let (a, b) = (&ins[0], &ins[1]);
            if !matches!(a.dtype, DType::F32 | DType::F64) || b.dtype != a.dtype {
                return err(format!(
                    "needs f32 or f64 operands of one dtype, got {a} and {b}"
                ));
            }
            let r = a.rank();
            if r < 2 || b.rank() != r || a.dims[r - 1] != a.dims[r - 2] {
                return err(format!(
                    "needs square matrices a and a right-hand side of the same rank, got {a} and {b}"
                ));
            }
            let m = a.dims[r - 1];
            let along = if *left_side {
                b.dims[r - 2]
            } else {
                b.dims[r - 1]
            };
            if a.dims[..r - 2] != b.dims[..r - 2] || along != m {
                return err(format!(
                    "a {a} and right-hand side {b} do not agree ({} side)",
                    if *left_side { "left" } else { "right" }
                ));
            }
            one(b.clone())
        }
        Prim::Cholesky => {
            arity(ins, 1)?;
            let a = &ins[0];
            let r = a.rank();
            if !matches!(a.dtype, DType::F32 | DType::F64)
                || r < 2
                || a.dims[r - 1] != a.dims[r - 2]
            {
                return err(format!("needs f32 or f64 square matrices, got {a}"));
            }
            one(a.clone())
        }
        Prim::LuFactor => {
            arity(ins, 1)?;
            let a = &ins[0];
            let r = a.rank();
            if !matches!(a.dtype, DType::F32 | DType::F64) || r < 2 {
                return err(format!("needs f32 or f64 matrices, got {a}"));
            }
            let (m, n) = (a.dims[r - 2], a.dims[r - 1]);
            let mut pivots = a.dims[..r - 2].to_vec();
            pivots.push(m.min(n));
            let mut perm = a.dims[..r - 2].to_vec();
            perm.push(m);
            Ok(vec![
                a.clone(),
                TensorType::new(DType::I64, &pivots),
                TensorType::new(DType::I64, &perm),
            ])
        }
        Prim::HouseholderQr => {
            arity(ins, 1)?;
            let a = &ins[0];
            let r = a.rank();
            if !matches!(a.dtype, DType::F32 | DType::F64) || r < 2 {
                return err(format!("needs f32 or f64 matrices, got {a}"));
            }
            let mut tau = a.dims[..r - 2].to_vec();
            tau.push(a.dims[r - 2].min(a.dims[r - 1]));
            Ok(vec![a.clone(), TensorType::new(a.dtype, &tau)])
        }
        Prim::Jacobi { two_sided } => {
            arity(ins, 1)?;
            let a = &ins[0];
            let r = a.rank();
            if !matches!(a.dtype, DType::F32 | DType::F64)
                || r < 2
                || (*two_sided && a.dims[r - 1] != a.dims[r - 2])
            {
                return err(format!(
                    "needs f32 or f64 {}matrices, got {a}",
                    if *two_sided { "square " } else { "" }
                ));
            }
            let n = a.dims[r - 1];
            let mut v = a.dims[..r - 2].to_vec();
            v.extend([n, n]);
            let first = if *two_sided {
                TensorType::new(a.dtype, &a.dims[..r - 1])
            } else {
                a.clone()
            };
            Ok(vec![first, TensorType::new(a.dtype, &v)])
        }
        Prim::HouseholderProduct => {
            arity(ins, 2)?;
            let (a, tau) = (&ins[0], &ins[1]);
            let r = a.rank();
            if !matches!(a.dtype, DType::F32 | DType::F64)
                || r < 2
                || tau.dtype != a.dtype
                || tau.rank() + 1 != r
                || tau.dims[..r - 2] != a.dims[..r - 2]
                || a.dims[r - 2] < a.dims[r - 1]
                || tau.dims[r - 2] > a.dims[r - 1]
            {
                return err(format!(
                    "needs f32 or f64 matrices [b.., m, n] with m >= n and tau [b.., k] \
                     of their dtype with k <= n, got {a} and {tau}"
                ));
            }
            one(a.clone())
        }
        Prim::PivotsToPermutation { rows } => {
            arity(ins, 1)?;
            let p = &ins[0];
            if p.dtype != DType::I64 || p.rank() < 1 || p.dims[p.rank() - 1] > *rows {
                return err(format!(
                    "needs i64 pivots, at most {rows} along the last dim, got {p}"
                ));
            }
            let mut dims = p.dims.clone();
            let last = dims.len() - 1;
            dims[last] = *rows;
            one(TensorType::new(DType::I64, &dims))
        }
        Prim::Sort { dimension, .. } => {
            arity(ins, 1)?;
            if *dimension >= ins[0].rank() {
                return err(format!(
                    "dimension {dimension} is not below rank {}",
                    ins[0].rank()
                ));
            }
            Ok(vec![
                ins[0].clone(),
                TensorType::new(DType::I64, &ins[0].dims),
            ])
        }
        Prim::Rng { dtype, dims, .. } => {
            arity(ins, 2)?;
            for t in ins {
                if *t != TensorType::scalar(DType::I64) {
                    return err(format!("seed and offset must be i64 scalars, got {t}"));
                }
            }
            if !dtype.is_float() {
                return err(format!("draws floating-point numbers, not {dtype}"));
            }
            checked_numel(dims)?;
            one(TensorType::new(*dtype, dims))
        }
        Prim::Convolution {
            stride,
            padding,
            dilation,
            groups,
            ..
        } => {
            arity(ins, 2)?;
            let (x, w) = (&ins[0], &ins[1]);
            let spatial = x.rank().saturating_sub(2);
            if x.rank() < 3 || w.rank() != x.rank() || x.dtype != w.dtype || !x.dtype.is_float() {
                return err(format!(
                    "input {x} and weight {w} need one float dtype and rank 3 or more"
                ));
            }
            if stride.len() != spatial || padding.len() != spatial || dilation.len() != spatial {
                return err(format!(
                    "stride, padding and dilation need {spatial} entries each"
                ));
            }
            if *groups == 0 || x.dims[1] != w.dims[1] * groups || w.dims[0] % groups != 0 {
                return err(format!(
                    "channels of {x} and {w} do not fit {groups} groups"
                ));
            }
            let mut dims = vec![x.dims[0], w.dims[0]];
            for i in 0..spatial {
                let k = dilation[i] * (w.dims[2 + i].max(1) - 1) + 1;
                let padded = x.dims[2 + i] + padding[i].0 + padding[i].1;
                if stride[i] == 0 || dilation[i] == 0 || padded < k {
                    return err(format!("spatial dimension {i}: kernel does not fit"));
                }
                dims.push((padded - k) / stride[i] + 1);
            }
            one(TensorType::new(x.dtype, &dims))
        }
        Prim::Attention { scale, .. } => {
            if !(3..=4).contains(&ins.len()) {
                return err(format!("takes 3 or 4 operands, got {}", ins.len()));
            }
            if ins.len() == 4 && ins[3] != TensorType::scalar(DType::F32) {
                return err(format!(
                    "the runtime scale (operand 3) {} is not an f32 scalar",
                    ins[3]
                ));
            }
            let (rows, ev) = attention_operands(&ins[0], &ins[1], &ins[2], *scale)?;
            let mut out = rows.clone();
            out.push(ev);
            Ok(vec![
                TensorType::new(DType::F32, &out),
                TensorType::new(DType::F32, &rows),
            ])
        }
        Prim::AttentionBackward { scale, .. } => {
            arity(ins, 6)?;
            let (rows, ev) = attention_operands(&ins[1], &ins[2], &ins[3], *scale)?;
            let mut out = rows.clone();
            out.push(ev);
            let out = TensorType::new(DType::F32, &out);
            for (t, what) in [(&ins[0], "grad_out"), (&ins[4], "out")] {
                if *t != out {
                    return err(format!("{what} {t} is not the attention output {out}"));
                }
            }
            let lse = TensorType::new(DType::F32, &rows);
            if ins[5] != lse {
                return err(format!("logsumexp {} is not {lse}", ins[5]));
            }
            Ok(ins[1..4].to_vec())
        }
    }
}

/// Checks attention's q, k and v; returns the query rows' dims (q's but
/// the last) and the value width.
fn attention_operands(
    q: &TensorType,
    k: &TensorType,
    v: &TensorType,
    scale: f64,
) -> Result<(Vec<u64>, u64)> {
    if [q, k, v].iter().any(|t| t.dtype != DType::F32) {
        return err(format!("q {q}, k {k} and v {v} must be f32"));
    }
    let r = q.rank();
    if r < 3 || k.rank() != r || v.rank() != r {
        return err(format!(
            "q {q}, k {k} and v {v} need one rank, at least 3 ([.., heads, rows, width])"
        ));
    }
    let (h, hk) = (q.dims[r - 3], k.dims[r - 3]);
    let fits = q.dims[..r - 3] == k.dims[..r - 3]
        && k.dims[..r - 1] == v.dims[..r - 1]
        && q.dims[r - 1] == k.dims[r - 1]
        && if hk == 0 { h == 0 } else { h % hk == 0 };
    if !fits {
        return err(format!(
            "q {q}, k {k} and v {v} do not fit [.., h, l, e], [.., hk, s, e], [.., hk, s, ev] \
             with h a multiple of hk"
        ));
    }
    if !scale.is_finite() {
        return err(format!("scale {scale} is not finite"));
    }
    Ok((q.dims[..r - 1].to_vec(), v.dims[r - 1]))
}

fn index_type(t: &TensorType) -> Result<()> {
    if !matches!(t.dtype, DType::I32 | DType::I64) {
        return err(format!("indices must be i32 or i64, got {t}"));
    }
    Ok(())
}

fn check_starts(starts: &[TensorType]) -> Result<()> {
    for t in starts {
        if *t != TensorType::scalar(DType::I64) {
            return err(format!("start indices must be i64 scalars, got {t}"));
        }
    }
    Ok(())
}
