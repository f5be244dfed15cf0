//! Primitive graphs from their canonical text (what the compile cache
//! stores and fingerprints): random and mutated text either parses or is
//! refused; a graph that parses is checked, planned, compiled and run by
//! the host platform on zero-filled inputs (and, with the xla feature,
//! lowered to StableHLO text), each step either working or returning an
//! error. Never a crash, an abort or an out-of-bounds access.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tpurt_runtime::ir::Graph;
use tpurt_runtime::platform::host::kernels::{eval_graph, HostTensor};
use tpurt_runtime::platform::host::{HostConfig, HostPlatform};
use tpurt_runtime::Platform;

static HOST: OnceLock<std::sync::Arc<HostPlatform>> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(graph) = Graph::from_canonical(text) else {
        return;
    };
    // Inputs of at most 1 Mi elements in all (the graph's own sizes may
    // still be large: those are refused or run).
    let params = graph.param_types();
    if params.iter().map(|t| t.numel()).sum::<u64>() > 1 << 20 {
        return;
    }
    let inputs: Vec<HostTensor> = params
        .iter()
        .map(|t| HostTensor::zeros(t.clone()))
        .collect();
    let _ = eval_graph(&graph, &inputs);
    let host = HOST.get_or_init(|| {
        HostPlatform::new(HostConfig::resolve(Some(1), None, Some(16 << 20)).unwrap())
    });
    let _ = host.compile(&graph);
    #[cfg(feature = "xla")]
    let _ = tpurt_runtime::platform::xla::lower::lower(&graph);
});
