//! The emitter: what op builders write graphs with. It wraps the graph
//! builder with the conveniences ops need (numpy broadcasting, casts,
//! scalars, keepdim reductions, torch-style dimension wrapping).

use crate::error::{Error, Result};
use crate::ir::{
    BinaryOp, CompareOp, DType, GraphBuilder, Precision, Prim, ReduceOp, TensorType, UnaryOp,
    ValueId,
};

pub struct Emitter {
    pub g: GraphBuilder,
    /// The precision of the f32 products this op emits (the caller's
    /// setting when the op was built: `crate::precision`).
    pub precision: Precision,
}

/// Wrap a possibly negative dimension into 0..rank (rank 0 accepts 0 and -1).
pub fn wrap_dim(dim: i64, rank: usize) -> Result<usize> {
    let r = rank.max(1) as i64;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return Err(Error::invalid(format!(
            "dimension {dim} is out of range for a tensor of rank {rank} (expected {} to {})",
            -r,
            r - 1
        )));
    }
    Ok(d as usize)
}

/// As [`wrap_dim`], for ops that index one of the dimensions: a 0-d tensor
/// has none, which is an error (torch's words), not dimension 0.
pub fn existing_dim(dim: i64, rank: usize) -> Result<usize> {
    if rank == 0 {
        return Err(Error::invalid(format!(
            "dimension specified as {dim} but tensor has no dimensions"
        )));
    }
    wrap_dim(dim, rank)
}

/// numpy/torch broadcast of two shapes.
pub fn broadcast_shapes(a: &[u64], b: &[u64]) -> Result<Vec<u64>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let x = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let y = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::invalid(format!(
                "shapes {a:?} and {b:?} cannot be broadcast together (dimension {i}: {x} vs {y})"
            )))
            }
        };
    }
    Ok(out)
}

impl Emitter {
    pub fn new() -> Self {
        Self::with_precision(Precision::Highest)
    }

    pub fn with_precision(precision: Precision) -> Self {
        Emitter {
            g: GraphBuilder::new(),
            precision,
        }
    }

    /// The precision attribute of a product of `dtype` operands: the
    /// emitter's for f32, HIGHEST (the attribute left out) for the rest,
    /// which it does not change.
    pub fn product_precision(&self, dtype: DType) -> Precision {
        if dtype == DType::F32 {
            self.precision
        } else {
            Precision::Highest
        }
    }

    pub fn ty(&self, v: ValueId) -> TensorType {
        self.g
            .value_type(v)
            .cloned()
            .expect("emitter values are defined")
    }
    pub fn dims(&self, v: ValueId) -> Vec<u64> {
        self.ty(v).dims
    }
    pub fn dtype(&self, v: ValueId) -> DType {
        self.ty(v).dtype
    }
    pub fn rank(&self, v: ValueId) -> usize {
        self.ty(v).rank()
    }

    pub fn op(&mut self, prim: Prim, inputs: &[ValueId]) -> Result<ValueId> {
        self.g.op(prim, inputs)
    }

    pub fn unary(&mut self, op: UnaryOp, x: ValueId) -> Result<ValueId> {
        self.g.unary(op, x)
    }

    /// Binary op after broadcasting both operands to a common shape (both
    /// must already share a dtype).
    pub fn binary(&mut self, op: BinaryOp, x: ValueId, y: ValueId) -> Result<ValueId> {
        let (x, y) = self.broadcast_pair(x, y)?;
        self.g.binary(op, x, y)
    }

    pub fn add(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Add, x, y)
    }
    pub fn sub(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Sub, x, y)
    }
    pub fn mul(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Mul, x, y)
    }
    pub fn div(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Div, x, y)
    }
    pub fn max(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Max, x, y)
    }
    pub fn min(&mut self, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Min, x, y)
    }

    pub fn compare(&mut self, op: CompareOp, x: ValueId, y: ValueId) -> Result<ValueId> {
        let (x, y) = self.broadcast_pair(x, y)?;
        self.g.op(Prim::Compare(op), &[x, y])
    }

    /// select(pred, a, b) with broadcasting of all three.
    pub fn select(&mut self, pred: ValueId, a: ValueId, b: ValueId) -> Result<ValueId> {
        let dims = broadcast_shapes(&self.dims(pred), &self.dims(a))?;
        let dims = broadcast_shapes(&dims, &self.dims(b))?;
        let p = self.broadcast_to(pred, &dims)?;
        let a = self.broadcast_to(a, &dims)?;
        let b = self.broadcast_to(b, &dims)?;
        self.g.op(Prim::Select, &[p, a, b])
    }

    /// A scalar (rank 0) constant.
    pub fn scalar(&mut self, dtype: DType, value: f64) -> Result<ValueId> {
        self.g.scalar(dtype, value)
    }

    /// A constant of `like`'s dtype broadcast to `like`'s shape.
    pub fn full_like(&mut self, like: ValueId, value: f64) -> Result<ValueId> {
        let t = self.ty(like);
        let s = self.scalar(t.dtype, value)?;
        self.broadcast_to(s, &t.dims)
    }

    pub fn full(&mut self, dtype: DType, dims: &[u64], value: f64) -> Result<ValueId> {
        let s = self.scalar(dtype, value)?;
        self.broadcast_to(s, dims)
    }

    /// x op scalar, the scalar in x's dtype.
    pub fn binary_scalar(&mut self, op: BinaryOp, x: ValueId, value: f64) -> Result<ValueId> {
        let s = self.scalar(self.dtype(x), value)?;
        self.binary(op, x, s)
    }

    /// x compared with a scalar in x's dtype.
    pub fn compare_scalar(&mut self, op: CompareOp, x: ValueId, value: f64) -> Result<ValueId> {
        let s = self.scalar(self.dtype(x), value)?;
        self.compare(op, x, s)
    }

    /// A new value equal to `x`, bit for bit (a conversion to its dtype).
    pub fn identity(&mut self, x: ValueId) -> Result<ValueId> {
        let to = self.dtype(x);
        self.g.op(Prim::Convert { to }, &[x])
    }

    pub fn convert(&mut self, x: ValueId, to: DType) -> Result<ValueId> {
        if self.dtype(x) == to {
            return Ok(x);
        }
        self.g.op(Prim::Convert { to }, &[x])
    }

    /// numpy-style broadcast to `dims` (x's rank may be lower).
    pub fn broadcast_to(&mut self, x: ValueId, dims: &[u64]) -> Result<ValueId> {
        let xd = self.dims(x);
        if xd == dims {
            return Ok(x);
        }
        if xd.len() > dims.len() {
            return Err(Error::invalid(format!(
                "cannot broadcast shape {xd:?} to {dims:?}"
            )));
        }
        let offset = dims.len() - xd.len();
        let mapping: Vec<usize> = (0..xd.len()).map(|i| i + offset).collect();
        for (i, &n) in xd.iter().enumerate() {
            if n != 1 && n != dims[i + offset] {
                return Err(Error::invalid(format!(
                    "cannot broadcast shape {xd:?} to {dims:?}"
                )));
            }
        }
        self.g.op(
            Prim::BroadcastInDim {
                dims: dims.to_vec(),
                mapping,
            },
            &[x],
        )
    }

    pub fn broadcast_pair(&mut self, x: ValueId, y: ValueId) -> Result<(ValueId, ValueId)> {
        let dims = broadcast_shapes(&self.dims(x), &self.dims(y))?;
        Ok((self.broadcast_to(x, &dims)?, self.broadcast_to(y, &dims)?))
    }

    pub fn reshape(&mut self, x: ValueId, dims: &[u64]) -> Result<ValueId> {
        if self.dims(x) == dims {
            return Ok(x);
        }
        self.g.op(
            Prim::Reshape {
                dims: dims.to_vec(),
            },
            &[x],
        )
    }

    /// A stable sort along `dimension`: (sorted values, their i64
    /// positions).
    pub fn sort(
        &mut self,
        x: ValueId,
        dimension: usize,
        descending: bool,
    ) -> Result<(ValueId, ValueId)> {
        let outs = self.g.node(
            Prim::Sort {
                dimension,
                descending,
                stable: true,
            },
            &[x],
        )?;
        Ok((outs[0], outs[1]))
    }

    pub fn transpose(&mut self, x: ValueId, perm: &[usize]) -> Result<ValueId> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(x);
        }
        self.g.op(
            Prim::Transpose {
                perm: perm.to_vec(),
            },
            &[x],
        )
    }

    /// Reduce `dims` (already wrapped); keepdim leaves them as size 1.
    pub fn reduce(
        &mut self,
        op: ReduceOp,
        x: ValueId,
        dims: &[usize],
        keepdim: bool,
    ) -> Result<ValueId> {
        let mut dims = dims.to_vec();
        dims.sort_unstable();
        dims.dedup();
        let r = self.g.op(
            Prim::Reduce {
                op,
                dimensions: dims.clone(),
            },
            &[x],
        )?;
        if keepdim {
            let mut kept = self.dims(x);
            for &d in &dims {
                kept[d] = 1;
            }
            self.reshape(r, &kept)
        } else {
            Ok(r)
        }
    }

    /// Dimensions from a torch `dim` list attribute (None or empty: all).
    pub fn reduce_dims(&self, x: ValueId, dims: Option<&[i64]>) -> Result<Vec<usize>> {
        let rank = self.rank(x);
        match dims {
            None | Some([]) => Ok((0..rank).collect()),
            Some(ds) => {
                let mut out = Vec::new();
                for &d in ds {
                    let w = wrap_dim(d, rank)?;
                    if rank == 0 {
                        continue;
                    }
                    if out.contains(&w) {
                        return Err(Error::invalid(format!("dimension {d} appears twice")));
                    }
                    out.push(w);
                }
                Ok(out)
            }
        }
    }

    /// Number of elements over `dims`, as a scalar of `dtype`.
    pub fn count(&mut self, x: ValueId, dims: &[usize], dtype: DType) -> Result<ValueId> {
        let d = self.dims(x);
        let n: u64 = dims.iter().map(|&i| d[i]).product();
        self.scalar(dtype, n as f64)
    }
}

impl Default for Emitter {
    fn default() -> Self {
        Self::new()
    }
}
