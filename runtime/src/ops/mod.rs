//! The op library: aten-level ops written once, from primitives. An op is
//! a function that emits a graph for given input types and attributes;
//! every platform runs that graph. Adding an op never touches a platform.
//!
//! Conventions (those of PyTorch, whose users call these):
//! - Inputs of different dtypes promote as torch.result_type does; inputs
//!   listed in the `wrapped` attribute (indices) count as Python scalars.
//! - Shapes broadcast as in numpy; negative dimensions count from the end.
//! - Errors name the op, then what was wrong.

/// An op's registry entry, as each op file lists its ops in `OPS`:
/// `def!("name", arity, build_fn)`. (Defined before the op modules, so
/// they all see it.)
macro_rules! def {
    ($name:expr, $n:expr, $f:expr) => {
        OpDef {
            name: $name,
            arity: $n,
            build: $f,
        }
    };
}

mod activation;
mod attention;
mod attrs;
mod backward;
mod bessel;
mod conv;
mod emit;
mod float_bits;
mod grid;
mod incomplete_gamma;
mod index;
mod linalg;
mod loss;
mod math;
mod matrix_exp;
#[cfg(test)]
mod modes_tests;
mod nn;
mod optim;
mod orthogonal;
mod pointwise;
mod pool;
pub mod promote;
mod qr;
mod random;
mod reduction;
mod shape;
mod solve;
mod sparse;
#[cfg(test)]
mod sparse_tests;
mod special;
mod spectral;
mod support;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod train_tests;
mod upsample;

use std::collections::HashMap;
use std::sync::OnceLock;

pub use attrs::{Attr, Attrs};
pub use emit::{broadcast_shapes, wrap_dim, Emitter};

use crate::error::{Error, Result};
use crate::ir::{DType, Graph, Precision, Prim, TensorType, ValueId};

pub type BuildFn = fn(&mut Emitter, &[ValueId], &Attrs) -> Result<Vec<ValueId>>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    Exactly(usize),
    /// Inclusive range: optional trailing inputs.
    Between(usize, usize),
    AtLeast(usize),
}

impl Arity {
    fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exactly(k) => n == k,
            Arity::Between(a, b) => (a..=b).contains(&n),
            Arity::AtLeast(k) => n >= k,
        }
    }
    fn describe(self) -> String {
        match self {
            Arity::Exactly(k) => format!("{k}"),
            Arity::Between(a, b) => format!("{a} to {b}"),
            Arity::AtLeast(k) => format!("at least {k}"),
        }
    }
}

pub struct OpDef {
    pub name: &'static str,
    pub arity: Arity,
    pub build: BuildFn,
}

/// An interned op: index into the registry, stable within a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u32);

struct Registry {
    defs: Vec<&'static OpDef>,
    /// Whether each op's graphs may hold products (dot_general,
    /// convolution, attention): those read the precision in force.
    products: Vec<bool>,
    by_name: HashMap<&'static str, OpId>,
}

fn registry() -> &'static Registry {
    static REG: OnceLock<Registry> = OnceLock::new();
    REG.get_or_init(|| {
        let mut defs: Vec<&'static OpDef> = Vec::new();
        let mut products = Vec::new();
        // The product groups build every dot_general, convolution and
        // attention primitive (a test checks every op's graphs).
        for (group, with_products) in [
            (pointwise::OPS, false),
            (math::OPS, false),
            (float_bits::OPS, false),
            (special::OPS, false),
            (bessel::OPS, false),
            (incomplete_gamma::OPS, false),
            (orthogonal::OPS, false),
            (activation::OPS, false),
            (reduction::OPS, false),
            (shape::OPS, false),
            (linalg::OPS, true),
            (solve::OPS, false),
            (qr::OPS, true),
            (matrix_exp::OPS, true),
            (spectral::OPS, false),
            (nn::OPS, false),
            (random::OPS, false),
            (loss::OPS, false),
            (attention::OPS, true),
            (backward::OPS, false),
            (conv::OPS, true),
            (index::OPS, false),
            (optim::OPS, false),
            (sparse::OPS, false),
            (pool::OPS, false),
            (upsample::OPS, false),
            (grid::OPS, false),
        ] {
            defs.extend(group.iter());
            products.extend(group.iter().map(|_| with_products));
        }
        let by_name = defs
            .iter()
            .enumerate()
            .map(|(i, d)| (d.name, OpId(i as u32)))
            .collect::<HashMap<_, _>>();
        assert_eq!(by_name.len(), defs.len(), "op names are unique");
        Registry {
            defs,
            products,
            by_name,
        }
    })
}

/// The op's id, or an error listing near names.
pub fn lookup(name: &str) -> Result<OpId> {
    let reg = registry();
    reg.by_name.get(name).copied().ok_or_else(|| {
        let mut near: Vec<&str> = reg
            .defs
            .iter()
            .map(|d| d.name)
            .filter(|n| n.contains(name) || name.contains(n) || n.get(..3) == name.get(..3))
            .collect();
        near.sort_unstable();
        near.truncate(8);
        Error::NotFound(format!(
            "op {name:?}{}",
            if near.is_empty() {
                String::new()
            } else {
                format!(" (similar: {})", near.join(", "))
            }
        ))
    })
}

pub fn op_name(id: OpId) -> &'static str {
    registry()
        .defs
        .get(id.0 as usize)
        .map_or("<unknown op>", |d| d.name)
}

/// Whether the op's graphs may hold products, whose precision is the one in
/// force when the op is called ([`crate::precision`]): a frontend that
/// follows its framework's precision setting passes it on before these.
pub fn reads_precision(id: OpId) -> bool {
    registry()
        .products
        .get(id.0 as usize)
        .copied()
        .unwrap_or(false)
}

/// The number of ops (ids are 0 to this, exclusive).
pub fn op_count() -> usize {
    registry().defs.len()
}

/// Every op's name, in registry order.
pub fn op_names() -> Vec<&'static str> {
    registry().defs.iter().map(|d| d.name).collect()
}

fn def(id: OpId) -> Result<&'static OpDef> {
    registry()
        .defs
        .get(id.0 as usize)
        .copied()
        .ok_or_else(|| Error::NotFound(format!("op id {}", id.0)))
}

/// The graph of `op` for these input types and attributes: its parameters
/// are the inputs, its outputs the op's results.
pub fn build_graph(op: OpId, inputs: &[TensorType], attrs: &Attrs) -> Result<Graph> {
    build_graph_at(op, inputs, attrs, Precision::Highest)
}

/// `build_graph` with the op's f32 products at `precision`.
pub fn build_graph_at(
    op: OpId,
    inputs: &[TensorType],
    attrs: &Attrs,
    precision: Precision,
) -> Result<Graph> {
    let d = def(op)?;
    let name = d.name;
    if !d.arity.accepts(inputs.len()) {
        return Err(Error::invalid(format!(
            "{name}: takes {} inputs, got {}",
            d.arity.describe(),
            inputs.len()
        )));
    }
    let mut e = Emitter::with_precision(precision);
    let params: Vec<ValueId> = inputs.iter().map(|t| e.g.param(t.clone())).collect();
    let outs = (d.build)(&mut e, &params, attrs).map_err(|err| match err {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{name}: {m}")),
        Error::Unimplemented(m) => Error::Unimplemented(format!("{name}: {m}")),
        other => other,
    })?;
    e.g.build(&outs)
}

/// `graph` with every composite primitive (`Prim::is_composite`)
/// rewritten into the primitives it is made of, for a platform that has no
/// kernel of its own for it. Parameters and outputs keep their order and
/// types.
pub fn expand_composites(graph: &Graph) -> Result<Graph> {
    if !graph.nodes().iter().any(|n| n.prim.is_composite()) {
        return Ok(graph.clone());
    }
    rewrite_nodes(graph, |e, prim, ins| {
        if prim.is_composite() {
            attention::expand(e, prim, ins)
        } else {
            e.g.node(prim.clone(), ins)
        }
    })
}

/// `graph` rebuilt node by node: `each` emits a node's results from its
/// primitive and its (rebuilt) inputs. Parameters, outputs and aliases
/// keep their order and types.
fn rewrite_nodes(
    graph: &Graph,
    mut each: impl FnMut(&mut Emitter, &Prim, &[ValueId]) -> Result<Vec<ValueId>>,
) -> Result<Graph> {
    let mut e = Emitter::new();
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for p in graph.params() {
        map.insert(*p, e.g.param(graph.value_type(*p).clone()));
    }
    for n in graph.nodes() {
        let ins: Vec<ValueId> = n.inputs.iter().map(|v| map[v]).collect();
        let outs = each(&mut e, &n.prim, &ins)?;
        for (o, v) in n.outputs.iter().zip(outs) {
            map.insert(*o, v);
        }
    }
    let outputs: Vec<ValueId> = graph.outputs().iter().map(|o| map[o]).collect();
    e.g.build(&outputs)?.with_aliases(graph.aliases().to_vec())
}

/// A product below HIGHEST precision: its precision, and the product at
/// HIGHEST.
fn reduced(prim: &Prim) -> Option<(Precision, Prim)> {
    let mut full = prim.clone();
    let p = match &mut full {
        Prim::DotGeneral { precision, .. } | Prim::Convolution { precision, .. } => {
            std::mem::take(precision)
        }
        _ => return None,
    };
    (p != Precision::Highest).then_some((p, full))
}

/// Whether `graph` has a product below HIGHEST precision.
pub fn has_reduced_precision(graph: &Graph) -> bool {
    graph.nodes().iter().any(|n| reduced(&n.prim).is_some())
}

/// `graph` with every f32 product below HIGHEST precision (`Precision`)
/// rewritten as a TPU's matrix unit computes it, from full-precision
/// products of rounded operands, for a platform without such a unit (the
/// host): DEFAULT multiplies the operands rounded to bf16; HIGH splits
/// each operand x into hi = bf16(x) and lo = bf16(x - hi) and sums
/// lo·hi + hi·lo, then hi·hi (bf16_3x). Every sum is f32, as on the chip;
/// only the order of the three products' sums may differ from a TPU's.
/// Parameters and outputs keep their order and types.
pub fn expand_precision(graph: &Graph) -> Result<Graph> {
    if !has_reduced_precision(graph) {
        return Ok(graph.clone());
    }
    // x rounded to bf16 and read back as f32.
    fn bf16(e: &mut Emitter, x: ValueId) -> Result<ValueId> {
        let r = e.g.op(Prim::Convert { to: DType::BF16 }, &[x])?;
        e.g.op(Prim::Convert { to: DType::F32 }, &[r])
    }
    rewrite_nodes(graph, |e, prim, ins| {
        let f32_operands = ins.iter().all(|&v| e.dtype(v) == DType::F32);
        match reduced(prim) {
            Some((p, full)) if f32_operands => {
                let (a, b) = (bf16(e, ins[0])?, bf16(e, ins[1])?);
                if p == Precision::Default {
                    return Ok(vec![e.op(full, &[a, b])?]);
                }
                let a_lo = e.sub(ins[0], a)?;
                let a_lo = bf16(e, a_lo)?;
                let b_lo = e.sub(ins[1], b)?;
                let b_lo = bf16(e, b_lo)?;
                let lo_hi = e.op(full.clone(), &[a_lo, b])?;
                let hi_lo = e.op(full.clone(), &[a, b_lo])?;
                let hi_hi = e.op(full, &[a, b])?;
                let small = e.add(lo_hi, hi_lo)?;
                Ok(vec![e.add(small, hi_hi)?])
            }
            _ => e.g.node(prim.clone(), ins),
        }
    })
}

/// A fresh copy of `v` (an op whose output must not be its input): a
/// conversion to its own dtype, which keeps every bit (`v + 0` turned
/// -0.0 into +0.0) and which a fused pass reads as `v` itself.
pub(crate) fn pointwise_copy(e: &mut Emitter, v: ValueId) -> Result<Vec<ValueId>> {
    Ok(vec![e.identity(v)?])
}

/// The result types of `op` for these inputs (to allocate outputs).
pub fn infer_outputs(op: OpId, inputs: &[TensorType], attrs: &Attrs) -> Result<Vec<TensorType>> {
    Ok(build_graph(op, inputs, attrs)?.output_types())
}
