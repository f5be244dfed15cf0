//! The primitive IR: element types, primitives aligned with StableHLO, and
//! checked graphs with a canonical form and a stable fingerprint.

pub mod dtype;
pub mod graph;
mod infer;
pub mod literal;
pub mod prim;
#[cfg(test)]
mod tests;

pub use dtype::DType;
pub use graph::{fingerprint_bytes, Alias, Graph, GraphBuilder, Node, TensorType, ValueId};
pub use prim::{
    BinaryOp, CompareOp, Precision, Prim, ReduceOp, RngDistribution, ScatterCombiner, UnaryOp,
};
