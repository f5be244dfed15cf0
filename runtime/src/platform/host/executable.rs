//! The host platform's executable: a checked graph run by the host kernels.
//! Inputs are gathered from device memory (any strided layout) into
//! contiguous host tensors, the graph runs, and results are scattered into
//! the output layouts. All inputs are read before any output is written,
//! so in-place ops are safe.

use super::fused::{run_plan, LoopProgram};
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
}

impl HostExecutable {
    pub fn new(graph: Graph) -> Self {
        let plan = fusion::plan(&graph);
        let programs = plan
            .kernels
            .iter()
            .map(|k| match k.kind {
                // A group the loop engine cannot take runs node by node.
                KernelKind::Loop { .. } => LoopProgram::compile(&graph, &plan, k).ok(),
                KernelKind::Single => None,
            })
            .collect();
        HostExecutable {
            params: graph.param_types(),
            outputs: graph.output_types(),
            plan,
            programs,
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
        for (p, t) in self.graph.params().iter().zip(inputs) {
            values[p.0 as usize] = Some(read_tensor(t)?);
        }
        run_plan(&self.graph, &self.plan, &self.programs, &mut values)?;
        for (v, t) in self.graph.outputs().iter().zip(outputs) {
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
