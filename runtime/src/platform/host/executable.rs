//! The host platform's executable: a checked graph run by the host kernels.
//! Inputs are gathered from device memory (any strided layout) into
//! contiguous host tensors, the graph runs, and results are scattered into
//! the output layouts. All inputs are read before any output is written,
//! so in-place ops are safe.

use super::fused::{run_plan, DeviceIo, LoopProgram};
use super::kernels::HostTensor;
use crate::copy::{for_each_run, Layout};
use crate::error::{Error, Result};
use crate::fusion::{self, KernelKind, Plan};
use crate::ir::{Graph, TensorType};
use crate::platform::Executable;
use crate::tensor::DeviceTensor;

const MAGIC: &str = "tpurt-host-executable-1";

pub struct HostExecutable {
    graph: Graph,
    params: Vec<TensorType>,
    outputs: Vec<TensorType>,
    plan: Plan,
    /// The loop engine's program for each loop kernel of the plan.
    programs: Vec<Option<LoopProgram>>,
    /// Outputs a loop stores that no later kernel reads: these may be
    /// written straight into the output tensor.
    direct_ok: std::collections::HashSet<crate::ir::ValueId>,
}

impl HostExecutable {
    pub fn new(graph: Graph) -> Self {
        // Parameters and outputs stay as given; only the inside changes.
        let graph = fusion::simplify(&graph).unwrap_or(graph);
        let plan = fusion::plan(&graph);
        let programs: Vec<Option<LoopProgram>> = plan
            .kernels
            .iter()
            .map(|k| match k.kind {
                // A group the loop engine cannot take runs node by node.
                KernelKind::Loop { .. } => LoopProgram::compile(&graph, k).ok(),
                KernelKind::Single => None,
            })
            .collect();
        let direct_ok = direct_outputs(&graph, &plan, &programs);
        HostExecutable {
            params: graph.param_types(),
            outputs: graph.output_types(),
            plan,
            programs,
            direct_ok,
            graph,
        }
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Bytes from `serialize`, made by the host platform of `version`.
    pub fn deserialize(bytes: &[u8], version: &str) -> Result<Self> {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| Error::invalid("host executable is not UTF-8"))?;
        let mut parts = text.splitn(3, '\n');
        let (magic, ver, body) = (parts.next(), parts.next(), parts.next());
        if magic != Some(MAGIC) || ver != Some(version) {
            return Err(Error::invalid(format!(
                "not a host executable of version {version} (found {:?} {:?})",
                magic.unwrap_or(""),
                ver.unwrap_or("")
            )));
        }
        Ok(Self::new(Graph::from_canonical(body.unwrap_or(""))?))
    }
}

/// Graph outputs stored by a loop program and read by no other kernel.
fn direct_outputs(
    graph: &Graph,
    plan: &Plan,
    programs: &[Option<LoopProgram>],
) -> std::collections::HashSet<crate::ir::ValueId> {
    let nodes = graph.nodes();
    let mut producer = vec![None; graph.num_values()];
    for (i, n) in nodes.iter().enumerate() {
        for o in &n.outputs {
            producer[o.0 as usize] = Some(i);
        }
    }
    let mut kernel_of = vec![usize::MAX; nodes.len()];
    for (k, ker) in plan.kernels.iter().enumerate() {
        for &i in &ker.nodes {
            kernel_of[i] = k;
        }
    }
    // Values read across kernels (through folded loads).
    let mut read_elsewhere = std::collections::HashSet::new();
    for (k, ker) in plan.kernels.iter().enumerate() {
        for &i in &ker.nodes {
            for v in &nodes[i].inputs {
                let mut v = *v;
                while let Some(p) = producer[v.0 as usize].filter(|p| plan.folded_loads.contains(p))
                {
                    match nodes[p].inputs.first() {
                        Some(u) => v = *u,
                        None => break,
                    }
                }
                if producer[v.0 as usize].is_some_and(|p| kernel_of[p] != k) {
                    read_elsewhere.insert(v);
                }
            }
        }
    }
    graph
        .outputs()
        .iter()
        .copied()
        .filter(|v| {
            producer[v.0 as usize].is_some_and(|p| {
                let k = kernel_of[p];
                k != usize::MAX
                    && programs[k].is_some()
                    // Epilogue results are kept on the host by the engine.
                    && !matches!(nodes[p].prim, crate::ir::Prim::Reduce { .. })
            }) && !read_elsewhere.contains(v)
        })
        .collect()
}

/// Read a device tensor into a contiguous host tensor.
pub fn read_tensor(t: &DeviceTensor) -> Result<HostTensor> {
    let mut host = HostTensor::zeros(t.ty());
    let contiguous = Layout::contiguous(&t.layout.sizes, t.layout.elem_size);
    let seg = t.buffer.segment();
    let base = t.buffer.segment_offset();
    let dst = host.bytes_mut();
    for_each_run(&t.layout, &contiguous, |d, h, n| {
        seg.read(base + d, &mut dst[h as usize..(h + n) as usize])
    })?;
    Ok(host)
}

/// Write a contiguous host tensor into a device tensor's layout.
pub fn write_tensor(host: &HostTensor, t: &DeviceTensor) -> Result<()> {
    let contiguous = Layout::contiguous(&t.layout.sizes, t.layout.elem_size);
    let seg = t.buffer.segment();
    let base = t.buffer.segment_offset();
    let src = host.bytes();
    for_each_run(&contiguous, &t.layout, |h, d, n| {
        seg.write(base + d, &src[h as usize..(h + n) as usize])
    })
}

impl Executable for HostExecutable {
    fn param_types(&self) -> &[TensorType] {
        &self.params
    }

    fn output_types(&self) -> &[TensorType] {
        &self.outputs
    }

    fn execute(&self, inputs: &[DeviceTensor], outputs: &[DeviceTensor]) -> Result<()> {
        crate::platform::check_io("host executable", self, inputs, outputs)?;
        let mut values: Vec<Option<HostTensor>> = vec![None; self.graph.num_values()];
        // Parameters stay in device memory; kernels read them when needed.
        let mut io = DeviceIo::default();
        for (p, t) in self.graph.params().iter().zip(inputs) {
            io.inputs.insert(*p, t);
        }
        // Results of the loop engine go straight to device memory when the
        // output is contiguous, aliases no input and no later kernel reads it.
        let mut direct = std::collections::HashSet::new();
        for (v, t) in self.graph.outputs().iter().zip(outputs) {
            let ok = self.direct_ok.contains(v)
                && t.is_contiguous()
                && !inputs.iter().any(|i| i.may_overlap(t))
                && !outputs
                    .iter()
                    .any(|o| !std::ptr::eq(o, t) && o.may_overlap(t))
                && self.graph.outputs().iter().filter(|o| *o == v).count() == 1;
            if ok {
                io.outputs.insert(*v, t);
                direct.insert(*v);
            }
        }
        if std::env::var_os("TPURT_DEBUG_FLUSH").is_some() {
            eprintln!("execute: direct {:?}, plan {:?}", direct, self.plan);
        }
        run_plan(&self.graph, &self.plan, &self.programs, &mut values, &io)?;
        for (v, t) in self.graph.outputs().iter().zip(outputs) {
            if direct.contains(v) {
                continue;
            }
            if values[v.0 as usize].is_none() {
                if let Some(src) = io.inputs.get(v) {
                    values[v.0 as usize] = Some(read_tensor(src)?);
                }
            }
            let r = values[v.0 as usize]
                .as_ref()
                .ok_or_else(|| Error::Internal(format!("output %{} was not computed", v.0)))?;
            write_tensor(r, t)?;
        }
        Ok(())
    }

    fn serialize(&self) -> Option<Vec<u8>> {
        let version = format!("host-{}", env!("CARGO_PKG_VERSION"));
        Some(format!("{MAGIC}\n{version}\n{}", self.graph.canonical()).into_bytes())
    }
}
