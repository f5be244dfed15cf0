//! Graphs of primitives: typed values, a builder that checks every node as
//! it is added, a canonical serialization and a fingerprint that is the
//! same in every process and on every machine.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::dtype::DType;
use super::prim::{BinaryOp, Prim, UnaryOp};
use crate::error::{Error, Result};

/// Version of the canonical form; part of every fingerprint.
pub const GRAPH_FORMAT_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    pub dtype: DType,
    pub dims: Vec<u64>,
}

impl TensorType {
    pub fn new(dtype: DType, dims: &[u64]) -> Self {
        TensorType {
            dtype,
            dims: dims.to_vec(),
        }
    }
    pub fn scalar(dtype: DType) -> Self {
        TensorType {
            dtype,
            dims: vec![],
        }
    }
    pub fn rank(&self) -> usize {
        self.dims.len()
    }
    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }
    pub fn nbytes(&self) -> u64 {
        self.numel() * self.dtype.size() as u64
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.dims.iter().map(u64::to_string).collect();
        write!(f, "{}[{}]", self.dtype, dims.join(","))
    }
}

/// A value in a graph: a parameter or a node's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ValueId(pub u32);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub prim: Prim,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

/// A checked graph. Values are numbered in definition order: parameters
/// first, then each node's results; nodes only use earlier values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    params: Vec<ValueId>,
    nodes: Vec<Node>,
    outputs: Vec<ValueId>,
    types: Vec<TensorType>,
    /// Outputs stored over parameters (see [`Graph::with_aliases`]); left
    /// out of the canonical form when empty, so graphs without any keep
    /// their fingerprints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    aliases: Vec<Alias>,
}

/// Output `output` of a graph is stored over parameter `param`: whoever
/// runs it passes the same tensor for both (an in-place update, such as an
/// optimizer's), so a platform may write the result into the parameter's
/// memory. A platform that does must still give the right result when the
/// tensors turn out to differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Alias {
    pub output: u32,
    pub param: u32,
}

impl Graph {
    pub fn params(&self) -> &[ValueId] {
        &self.params
    }
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }
    pub fn outputs(&self) -> &[ValueId] {
        &self.outputs
    }
    /// Outputs stored over parameters, by output index (see [`Alias`]).
    pub fn aliases(&self) -> &[Alias] {
        &self.aliases
    }
    /// The parameter output `output` is stored over, if any.
    pub fn aliased_param(&self, output: usize) -> Option<usize> {
        self.aliases
            .iter()
            .find(|a| a.output as usize == output)
            .map(|a| a.param as usize)
    }

    /// This graph with `aliases` (sorted by output): each names an output
    /// and a parameter of the same type, and no output or parameter comes
    /// twice.
    pub fn with_aliases(mut self, mut aliases: Vec<Alias>) -> Result<Graph> {
        aliases.sort_by_key(|a| a.output);
        for (i, a) in aliases.iter().enumerate() {
            let (o, p) = (a.output as usize, a.param as usize);
            let (Some(&ov), Some(&pv)) = (self.outputs.get(o), self.params.get(p)) else {
                return Err(Error::invalid(format!(
                    "alias of output {o} over parameter {p}: the graph has {} outputs and {} \
                     parameters",
                    self.outputs.len(),
                    self.params.len()
                )));
            };
            if self.value_type(ov) != self.value_type(pv) {
                return Err(Error::invalid(format!(
                    "alias of output {o} ({}) over parameter {p} ({}): the types differ",
                    self.value_type(ov),
                    self.value_type(pv)
                )));
            }
            if aliases[..i]
                .iter()
                .any(|b| b.output == a.output || b.param == a.param)
            {
                return Err(Error::invalid(format!(
                    "alias of output {o} over parameter {p}: the output or the parameter \
                     is aliased twice"
                )));
            }
        }
        self.aliases = aliases;
        Ok(self)
    }
    pub fn value_type(&self, v: ValueId) -> &TensorType {
        &self.types[v.0 as usize]
    }
    /// For each value, the index of the node that produces it (None for a
    /// parameter).
    pub fn producers(&self) -> Vec<Option<usize>> {
        let mut producer = vec![None; self.num_values()];
        for (i, n) in self.nodes().iter().enumerate() {
            for o in &n.outputs {
                producer[o.0 as usize] = Some(i);
            }
        }
        producer
    }
    /// The index of the node that produces `v` (None for a parameter), by
    /// binary search: values are numbered in definition order, parameters
    /// first (`rebuild` checks it of a graph read back).
    pub fn producer_of(&self, v: ValueId) -> Option<usize> {
        let i = self
            .nodes
            .partition_point(|n| n.outputs.last().is_some_and(|o| o.0 < v.0));
        self.nodes
            .get(i)
            .filter(|n| n.outputs.contains(&v))
            .map(|_| i)
    }
    pub fn num_values(&self) -> usize {
        self.types.len()
    }
    pub fn param_types(&self) -> Vec<TensorType> {
        self.params
            .iter()
            .map(|&p| self.value_type(p).clone())
            .collect()
    }
    pub fn output_types(&self) -> Vec<TensorType> {
        self.outputs
            .iter()
            .map(|&p| self.value_type(p).clone())
            .collect()
    }

    /// The canonical serialization: compact JSON with a fixed field order.
    pub fn canonical(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Read a canonical serialization back, checking every node again: a
    /// corrupt or foreign text is an error, never a bad graph.
    pub fn from_canonical(text: &str) -> Result<Graph> {
        let raw: Graph = serde_json::from_str(text)
            .map_err(|e| Error::invalid(format!("not a tpurt graph: {e}")))?;
        raw.rebuild()
    }

    /// Stable across processes and machines: 128-bit FNV-1a of the format
    /// version and the canonical form, as 32 hex digits.
    pub fn fingerprint(&self) -> String {
        fingerprint_bytes(&[
            &GRAPH_FORMAT_VERSION.to_le_bytes(),
            self.canonical().as_bytes(),
        ])
    }

    fn rebuild(&self) -> Result<Graph> {
        let mut b = GraphBuilder::new();
        if self
            .params
            .iter()
            .enumerate()
            .any(|(i, p)| p.0 as usize != i)
        {
            return Err(Error::invalid("graph parameters must be the first values"));
        }
        for p in &self.params {
            let t = self
                .types
                .get(p.0 as usize)
                .ok_or_else(|| Error::invalid("graph parameter without a type"))?;
            b.param(t.clone());
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let outs = b
                .node(n.prim.clone(), &n.inputs)
                .map_err(|e| Error::invalid(format!("graph node {i} ({}): {e}", n.prim.name())))?;
            if outs != n.outputs {
                return Err(Error::invalid(format!(
                    "graph node {i}: result numbering differs"
                )));
            }
        }
        let g = b.build(&self.outputs)?;
        if g.types != self.types {
            return Err(Error::invalid(
                "graph value types differ from the ones its nodes produce",
            ));
        }
        g.with_aliases(self.aliases.clone())
    }
}

/// The result types of `prim` applied to operands of `inputs` types, or
/// the error that says why the node is invalid.
pub fn infer_types(prim: &Prim, inputs: &[TensorType]) -> Result<Vec<TensorType>> {
    super::infer::infer(prim, inputs)
        .map_err(|e| Error::invalid(format!("{}: {}", prim.name(), strip(&e))))
}

/// 128-bit FNV-1a over the parts, as 32 lowercase hex digits.
pub fn fingerprint_bytes(parts: &[&[u8]]) -> String {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    let mut h = OFFSET;
    for part in parts {
        for &b in (part.len() as u64).to_le_bytes().iter().chain(part.iter()) {
            h ^= b as u128;
            h = h.wrapping_mul(PRIME);
        }
    }
    format!("{h:032x}")
}

impl fmt::Display for Graph {
    /// A readable form, for dumps and errors (not parsed back).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let params: Vec<String> = self
            .params
            .iter()
            .map(|p| format!("%{}: {}", p.0, self.value_type(*p)))
            .collect();
        writeln!(f, "graph({}) {{", params.join(", "))?;
        for n in &self.nodes {
            let outs: Vec<String> = n.outputs.iter().map(|v| format!("%{}", v.0)).collect();
            let ins: Vec<String> = n.inputs.iter().map(|v| format!("%{}", v.0)).collect();
            let types: Vec<String> = n
                .outputs
                .iter()
                .map(|v| self.value_type(*v).to_string())
                .collect();
            let attrs = attributes(&n.prim);
            writeln!(
                f,
                "  {} = {}({}){} : {}",
                outs.join(", "),
                n.prim.name(),
                ins.join(", "),
                if attrs.is_empty() {
                    String::new()
                } else {
                    format!(" {attrs}")
                },
                types.join(", ")
            )?;
        }
        let outs: Vec<String> = self.outputs.iter().map(|v| format!("%{}", v.0)).collect();
        writeln!(f, "  return {}", outs.join(", "))?;
        for a in &self.aliases {
            let out = self.outputs[a.output as usize];
            writeln!(f, "  output {} (%{}) over %{}", a.output, out.0, a.param)?;
        }
        write!(f, "}}")
    }
}

fn attributes(p: &Prim) -> String {
    let v = serde_json::to_value(p).unwrap_or_default();
    match v {
        serde_json::Value::Object(m) => m
            .values()
            .next()
            .map(|inner| match inner {
                serde_json::Value::Object(fields) => {
                    let mut parts: Vec<String> = fields
                        .iter()
                        .filter(|(k, _)| k.as_str() != "bytes")
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                    if let Some(serde_json::Value::Array(b)) = fields.get("bytes") {
                        parts.push(format!("bytes=<{}>", b.len()));
                    }
                    parts.join(" ")
                }
                _ => String::new(),
            })
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// Builds a graph node by node; each node is checked (operand count, types,
/// attributes) when added, and the error names the primitive.
#[derive(Default)]
pub struct GraphBuilder {
    params: Vec<ValueId>,
    nodes: Vec<Node>,
    types: Vec<TensorType>,
}

impl GraphBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn param(&mut self, t: TensorType) -> ValueId {
        assert!(self.nodes.is_empty(), "parameters come before nodes");
        let v = ValueId(self.types.len() as u32);
        self.types.push(t);
        self.params.push(v);
        v
    }

    pub fn value_type(&self, v: ValueId) -> Result<&TensorType> {
        self.types
            .get(v.0 as usize)
            .ok_or_else(|| Error::invalid(format!("value %{} is not defined yet", v.0)))
    }

    /// Add a node; returns its results.
    pub fn node(&mut self, prim: Prim, inputs: &[ValueId]) -> Result<Vec<ValueId>> {
        let in_types: Vec<TensorType> = inputs
            .iter()
            .map(|&v| self.value_type(v).cloned())
            .collect::<Result<_>>()?;
        let out_types = super::infer::infer(&prim, &in_types)
            .map_err(|e| Error::invalid(format!("{}: {}", prim.name(), strip(&e))))?;
        let outputs: Vec<ValueId> = out_types
            .into_iter()
            .map(|t| {
                let v = ValueId(self.types.len() as u32);
                self.types.push(t);
                v
            })
            .collect();
        self.nodes.push(Node {
            prim,
            inputs: inputs.to_vec(),
            outputs: outputs.clone(),
        });
        Ok(outputs)
    }

    /// Add a node with one result.
    pub fn op(&mut self, prim: Prim, inputs: &[ValueId]) -> Result<ValueId> {
        let name = prim.name();
        let outs = self.node(prim, inputs)?;
        match outs.as_slice() {
            [one] => Ok(*one),
            _ => Err(Error::invalid(format!(
                "{name} has {} results, not one",
                outs.len()
            ))),
        }
    }

    pub fn unary(&mut self, op: UnaryOp, x: ValueId) -> Result<ValueId> {
        self.op(Prim::Unary(op), &[x])
    }

    pub fn binary(&mut self, op: BinaryOp, x: ValueId, y: ValueId) -> Result<ValueId> {
        self.op(Prim::Binary(op), &[x, y])
    }

    /// A scalar constant of `dtype` from an f64 (cast as the dtype casts).
    pub fn scalar(&mut self, dtype: DType, value: f64) -> Result<ValueId> {
        let bytes = super::literal::encode_scalar(dtype, value);
        self.op(
            Prim::Constant {
                dtype,
                dims: vec![],
                bytes,
            },
            &[],
        )
    }

    pub fn build(self, outputs: &[ValueId]) -> Result<Graph> {
        for o in outputs {
            if o.0 as usize >= self.types.len() {
                return Err(Error::invalid(format!(
                    "graph output %{} is not defined",
                    o.0
                )));
            }
        }
        Ok(Graph {
            params: self.params,
            nodes: self.nodes,
            outputs: outputs.to_vec(),
            types: self.types,
            aliases: Vec::new(),
        })
    }
}

fn strip(e: &Error) -> String {
    match e {
        Error::InvalidArgument(m) => m.clone(),
        other => other.to_string(),
    }
}
