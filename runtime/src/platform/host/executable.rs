//! The host platform's executable: a checked graph run by the host kernels.
//! Inputs are gathered from device memory (any strided layout) into
//! contiguous host tensors, the graph runs, and results are scattered into
//! the output layouts. All inputs are read before any output is written,
//! so in-place ops are safe.

use super::kernels::{eval_graph, HostTensor};
use crate::copy::{for_each_run, Layout};
use crate::error::{Error, Result};
use crate::ir::{Graph, TensorType};
use crate::platform::Executable;
use crate::tensor::DeviceTensor;

const MAGIC: &str = "tpurt-host-executable-1";

pub struct HostExecutable {
    graph: Graph,
    params: Vec<TensorType>,
    outputs: Vec<TensorType>,
}

impl HostExecutable {
    pub fn new(graph: Graph) -> Self {
        HostExecutable {
            params: graph.param_types(),
            outputs: graph.output_types(),
            graph,
        }
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
        let host_inputs: Vec<HostTensor> = inputs.iter().map(read_tensor).collect::<Result<_>>()?;
        let results = eval_graph(&self.graph, &host_inputs)?;
        for (r, t) in results.iter().zip(outputs) {
            write_tensor(r, t)?;
        }
        Ok(())
    }

    fn serialize(&self) -> Option<Vec<u8>> {
        let version = format!("host-{}", env!("CARGO_PKG_VERSION"));
        Some(format!("{MAGIC}\n{version}\n{}", self.graph.canonical()).into_bytes())
    }
}
