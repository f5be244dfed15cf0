//! The host platform's executable: a checked graph run by the host kernels.
//! Inputs are gathered from device memory (any strided layout) into
//! contiguous host tensors, the graph runs, and results are scattered into
//! the output layouts. All inputs are read before any output is written,
//! so in-place ops are safe; the one exception is a pass that stores a
//! result over an input it reads element for element (an in-place update,
//! see `store_over`), which reads each chunk before it stores it.

use super::fused::{run_plan, DeviceIo, Program};
use super::kernels::HostTensor;
use crate::copy::{for_each_run, Layout};
use crate::error::{Error, Result};
use crate::fusion::{self, Plan};
use crate::fxhash::{FxHashMap, FxHashSet};
use crate::ir::{Graph, TensorType, ValueId};
use crate::platform::Executable;
use crate::tensor::DeviceTensor;

/// Version 2 stores the graph as it was given, which a later build
/// simplifies and plans anew; version 1 stored the simplified graph, so a
/// later build of the same version kept an earlier build's simplification
/// (its fixes and its new rewrites never reached a warm disk cache). Such
/// entries are refused and rebuilt.
const MAGIC: &str = "tpurt-host-executable-2";

pub struct HostExecutable {
    /// The graph as given (what `serialize` stores).
    source: Graph,
    /// The graph simplified (`fusion::simplify`), which the plan runs.
    graph: Graph,
    params: Vec<TensorType>,
    outputs: Vec<TensorType>,
    plan: Plan,
    /// The loop engine's program for each loop or row-phase kernel of
    /// the plan.
    programs: Vec<Option<Program>>,
    /// Outputs a loop stores (other than reductions) and float products:
    /// these may be written straight into the output tensor, where later
    /// kernels read them (`direct_outputs`).
    direct_ok: FxHashSet<crate::ir::ValueId>,
    /// Where those outputs may be written over parameters (in-place
    /// updates: `store_over`).
    in_place: InPlace,
    /// Whether a kernel may split across threads (see `execute`).
    threaded: bool,
    /// Values to drop after each kernel (`Plan::dead_after`).
    dead: Vec<Vec<crate::ir::ValueId>>,
}

impl HostExecutable {
    pub fn new(graph: Graph) -> Self {
        // Parameters and outputs stay as given; only the inside changes.
        let source = graph;
        let graph = fusion::simplify(&source).unwrap_or_else(|_| source.clone());
        let plan = fusion::plan(&graph);
        // A group the loop engine cannot take runs node by node.
        let programs: Vec<Option<Program>> = plan
            .kernels
            .iter()
            .map(|k| Program::compile(&graph, k))
            .collect();
        let direct_ok = direct_outputs(&graph, &plan, &programs);
        let in_place = store_over(&graph, &plan, &programs, &direct_ok);
        let threaded = crate::platform::host::fused::may_split(&graph);
        HostExecutable {
            source,
            threaded,
            dead: plan.dead_after(&graph),
            params: graph.param_types(),
            outputs: graph.output_types(),
            plan,
            programs,
            direct_ok,
            in_place,
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

/// Graph outputs that kernels may write straight into device memory: those
/// a loop program stores and float products. Later kernels that read one
/// read a view of the output's memory (see `LoopProgram::finish`), so a
/// value the program both keeps (an activation the backward reads) and
/// uses is written once, in place, instead of into a host tensor copied
/// into the output at the end.
fn direct_outputs(
    graph: &Graph,
    plan: &Plan,
    programs: &[Option<Program>],
) -> FxHashSet<crate::ir::ValueId> {
    let nodes = graph.nodes();
    let producer = graph.producers();
    let mut kernel_of = vec![usize::MAX; nodes.len()];
    for (k, ker) in plan.kernels.iter().enumerate() {
        for &i in &ker.nodes {
            kernel_of[i] = k;
        }
    }
    let float_product = |p: usize, v: &crate::ir::ValueId| {
        matches!(nodes[p].prim, crate::ir::Prim::DotGeneral { .. })
            && matches!(
                graph.value_type(*v).dtype,
                crate::ir::DType::F32 | crate::ir::DType::F64
            )
    };
    graph
        .outputs()
        .iter()
        .copied()
        .filter(|v| {
            producer[v.0 as usize].is_some_and(|p| {
                let k = kernel_of[p];
                if k == usize::MAX {
                    return false;
                }
                if programs[k].is_none() {
                    return float_product(p, v);
                }
                // Epilogue results are kept on the host by the engine.
                !matches!(nodes[p].prim, crate::ir::Prim::Reduce { .. })
            })
        })
        .collect()
}

/// Where direct outputs may be written over parameters' memory (updates
/// run in place, see `store_over`).
#[derive(Default)]
struct InPlace {
    /// For each direct output a loop stores, the parameters it may be
    /// stored over: read by that loop's pass element for element before
    /// the store (`may_store_over`).
    over: FxHashMap<ValueId, Vec<ValueId>>,
    /// The kernel of each direct output a loop stores.
    kernel: FxHashMap<ValueId, usize>,
    /// Parameters (not outputs) that only kernels keeping no view of them
    /// read, with the last of those kernels.
    last_read: FxHashMap<ValueId, usize>,
}

impl InPlace {
    /// Whether output `v` may be written where it overlaps parameter `p`
    /// (`same_view`: the same buffer, layout and dtype): stored over it in
    /// order, or stored after the last kernel that reads it.
    fn may_overwrite(&self, v: ValueId, p: ValueId, same_view: bool) -> bool {
        (same_view && self.over.get(&v).is_some_and(|ps| ps.contains(&p)))
            || self
                .kernel
                .get(&v)
                .zip(self.last_read.get(&p))
                .is_some_and(|(k, j)| j < k)
    }
}

/// Parameters that direct outputs a loop stores may be written over: one
/// read by that loop's kernel, and otherwise only by kernels before it
/// that keep no view of it (loops and products make new values; a kernel
/// run node by node may hand on a view, a reshape say), so nothing reads
/// it after the store, which the pass reads element for element before it
/// stores (`may_store_over`); and any other view of a parameter that only
/// such kernels before the loop read. An optimizer's update of a
/// parameter and its moments, run in place, then writes straight into
/// them instead of into host tensors copied back, also when the same
/// program's forward and backward read the parameter (transposed, as a
/// linear layer's weight).
fn store_over(
    graph: &Graph,
    plan: &Plan,
    programs: &[Option<Program>],
    direct_ok: &FxHashSet<ValueId>,
) -> InPlace {
    let nodes = graph.nodes();
    let producer = graph.producers();
    // The kernels reading each parameter, through any chain of loads.
    let mut readers: FxHashMap<ValueId, FxHashSet<usize>> = FxHashMap::default();
    for (k, ker) in plan.kernels.iter().enumerate() {
        for &i in &ker.nodes {
            for &v in &nodes[i].inputs {
                let v = fusion::under_loads(graph, &producer, v);
                if producer[v.0 as usize].is_none() {
                    readers.entry(v).or_default().insert(k);
                }
            }
        }
    }
    // Kernels whose results are new memory, never a view of an input: the
    // loop engine's, and products.
    let fresh = |j: usize| {
        programs[j].is_some()
            || plan.kernels[j]
                .nodes
                .iter()
                .all(|&i| matches!(nodes[i].prim, crate::ir::Prim::DotGeneral { .. }))
    };
    let mut in_place = InPlace::default();
    for (p, r) in &readers {
        if !graph.outputs().contains(p) && r.iter().all(|&j| fresh(j)) {
            in_place.last_read.insert(*p, *r.iter().max().unwrap_or(&0));
        }
    }
    for (k, ker) in plan.kernels.iter().enumerate() {
        let Some(program) = &programs[k] else {
            continue;
        };
        for v in ker.stores.iter().filter(|v| direct_ok.contains(v)) {
            in_place.kernel.insert(*v, k);
            let params: Vec<ValueId> = graph
                .params()
                .iter()
                .copied()
                .filter(|p| {
                    !graph.outputs().contains(p)
                        && readers.get(p).is_some_and(|r| {
                            r.contains(&k) && r.iter().all(|&j| j == k || (j < k && fresh(j)))
                        })
                        && graph.value_type(*p) == graph.value_type(*v)
                        && program.may_store_over(*v, *p)
                })
                .collect();
            if !params.is_empty() {
                in_place.over.insert(*v, params);
            }
        }
    }
    in_place
}

/// Read a device tensor into a contiguous host tensor.
pub fn read_tensor(t: &DeviceTensor) -> Result<HostTensor> {
    let mut host = HostTensor::zeros(t.ty());
    let contiguous = Layout::contiguous(&t.layout.sizes, t.layout.elem_size);
    let seg = t.buffer.segment();
    let base = t.buffer.segment_offset();
    let dst = host.bytes_mut();
    // A strided view (a transposed operand, a column) has short runs: one
    // segment read each would cost a bounds-checked call per element. When
    // the bytes it spans are not much more than its own, read the span once
    // and gather from it in memory.
    if let Some((lo, hi)) = t.layout.byte_span() {
        let span_len = hi - lo;
        if !t.is_contiguous() && span_len <= 4 * (dst.len() as u64).max(4096) {
            // u64 words keep the span aligned for the typed gathers below.
            let mut words = vec![0u64; span_len.div_ceil(8) as usize];
            let span = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..span_len as usize];
            seg.read(base + lo, span)?;
            let span = &*span;
            if gather_blocked(&t.layout, lo, span, dst) {
                return Ok(host);
            }
            return for_each_run(&t.layout, &contiguous, |d, h, n| {
                let from = (d - lo) as usize;
                dst[h as usize..(h + n) as usize].copy_from_slice(&span[from..from + n as usize]);
                Ok(())
            })
            .map(|()| host);
        }
    }
    for_each_run(&t.layout, &contiguous, |d, h, n| {
        seg.read(base + d, &mut dst[h as usize..(h + n) as usize])
    })?;
    Ok(host)
}

/// Gather a strided view whose last dimension is not contiguous (a
/// transposed operand) into row-major `dst`, tiling the last two
/// dimensions so both sides stay in cache. `span` holds the view's bytes
/// from byte `lo` of its buffer. False (nothing written) for layouts it
/// does not handle: element sizes other than 2, 4 and 8, a unit inner
/// stride (runs are long then), or fewer than two dimensions.
fn gather_blocked(layout: &Layout, lo: u64, span: &[u8], dst: &mut [u8]) -> bool {
    fn typed<T: bytemuck::Pod>(layout: &Layout, lo: u64, span: &[u8], dst: &mut [u8]) -> bool {
        let (Ok(src), Ok(out)) = (
            bytemuck::try_cast_slice::<u8, T>(span),
            bytemuck::try_cast_slice_mut::<u8, T>(dst),
        ) else {
            return false;
        };
        let es = std::mem::size_of::<T>() as u64;
        let rank = layout.sizes.len();
        let (n0, n1) = (
            layout.sizes[rank - 2] as usize,
            layout.sizes[rank - 1] as usize,
        );
        let (s0, s1) = (
            layout.strides[rank - 2] as usize,
            layout.strides[rank - 1] as usize,
        );
        let outer: Vec<(u64, u64)> = layout.sizes[..rank - 2]
            .iter()
            .zip(&layout.strides[..rank - 2])
            .map(|(&n, &s)| (n, s))
            .collect();
        let first = ((layout.offset - lo) / es) as usize;
        let mut index = vec![0u64; outer.len()];
        let mut out_base = 0usize;
        const TILE: usize = 32;
        loop {
            let base = first
                + outer
                    .iter()
                    .zip(&index)
                    .map(|(&(_, s), &i)| (i * s) as usize)
                    .sum::<usize>();
            for ib in (0..n0).step_by(TILE) {
                for jb in (0..n1).step_by(TILE) {
                    for i in ib..(ib + TILE).min(n0) {
                        let row = &mut out[out_base + i * n1..out_base + (i + 1) * n1];
                        let from = base + i * s0;
                        for (j, o) in row
                            .iter_mut()
                            .enumerate()
                            .take((jb + TILE).min(n1))
                            .skip(jb)
                        {
                            *o = src[from + j * s1];
                        }
                    }
                }
            }
            out_base += n0 * n1;
            // Next outer index, row-major.
            let mut d = outer.len();
            loop {
                if d == 0 {
                    return true;
                }
                d -= 1;
                index[d] += 1;
                if index[d] < outer[d].0 {
                    break;
                }
                index[d] = 0;
            }
        }
    }
    let rank = layout.sizes.len();
    if rank < 2 || layout.strides[rank - 1] == 1 || layout.sizes.contains(&0) {
        return false;
    }
    match layout.elem_size {
        2 => typed::<u16>(layout, lo, span, dst),
        4 => typed::<u32>(layout, lo, span, dst),
        8 => typed::<u64>(layout, lo, span, dst),
        _ => false,
    }
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
        // Sized up front: a map that grows rehashes (a few hundred
        // instructions of a tiny op's run).
        let mut io = DeviceIo {
            inputs: FxHashMap::with_capacity_and_hasher(inputs.len(), Default::default()),
            outputs: FxHashMap::with_capacity_and_hasher(outputs.len(), Default::default()),
            overwritten: FxHashSet::default(),
        };
        for (p, t) in self.graph.params().iter().zip(inputs) {
            io.inputs.insert(*p, t);
        }
        // Results of the loop engine go straight to device memory when the
        // output is contiguous, no later kernel reads it, and it aliases no
        // input, or only the very inputs its pass may store it over.
        let mut direct = FxHashSet::with_capacity_and_hasher(outputs.len(), Default::default());
        for (v, t) in self.graph.outputs().iter().zip(outputs) {
            let mut overwritten = Vec::new();
            let inputs_ok = self
                .graph
                .params()
                .iter()
                .zip(inputs)
                .filter(|(_, i)| i.may_overlap(t))
                .all(|(p, i)| {
                    let same = i.buffer.same_buffer(&t.buffer)
                        && i.layout == t.layout
                        && i.dtype == t.dtype;
                    overwritten.push(*p);
                    self.in_place.may_overwrite(*v, *p, same)
                });
            let ok = self.direct_ok.contains(v)
                && t.is_contiguous()
                && inputs_ok
                && !outputs
                    .iter()
                    .any(|o| !std::ptr::eq(o, t) && o.may_overlap(t))
                && self.graph.outputs().iter().filter(|o| *o == v).count() == 1;
            if ok {
                io.outputs.insert(*v, t);
                io.overwritten.extend(overwritten);
                direct.insert(*v);
            }
        }
        if crate::lazy::debug_flush() {
            eprintln!("execute: direct {:?}, plan {:?}", direct, self.plan);
        }
        // A plan whose kernels split across threads runs on the thread
        // pool's workers as a whole: a kernel's split then starts from a
        // worker (the others still spinning from the previous kernel), not
        // from this thread, which would hand every kernel over and sleep
        // until it is done (two context switches per kernel).
        let run = |values: &mut [Option<HostTensor>]| {
            run_plan(
                &self.graph,
                &self.plan,
                &self.programs,
                values,
                &io,
                &self.dead,
            )
        };
        if self.threaded {
            rayon::scope(|_| run(&mut values))?;
        } else {
            run(&mut values)?;
        }
        // The values of the outputs written below may be views of input
        // memory (contiguous inputs are read in place, and a kernel may
        // pass one through). Writing an output that overlaps an input would
        // change what such a view shows, so then those views are copied
        // first. (Kernels are done: no other value is read again.)
        if outputs
            .iter()
            .any(|o| inputs.iter().any(|i| i.may_overlap(o)))
        {
            for v in self.graph.outputs().iter().filter(|v| !direct.contains(v)) {
                if let Some(t) = values[v.0 as usize].as_mut() {
                    if t.data.is_view() {
                        t.data.as_bytes_mut();
                    }
                }
            }
        }
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
        Some(format!("{MAGIC}\n{version}\n{}", self.source.canonical()).into_bytes())
    }
}

#[cfg(test)]
mod gather_tests {
    use super::*;

    /// The blocked gather equals the run-by-run copy for transposed,
    /// batched and broadcast views in every element size it takes.
    #[test]
    fn blocked_gather_matches_the_run_by_run_copy() {
        let cases: [(&[u64], &[u64], u64); 4] = [
            (&[37, 70], &[1, 37], 0),               // a transpose, ragged tiles
            (&[3, 33, 40], &[1320, 1, 33], 5),      // batched transpose with an offset
            (&[2, 5, 64], &[64, 0, 1 + 64 * 2], 0), // broadcast rows, wide strides
            (&[4, 1, 9], &[9, 9, 36], 0),
        ];
        for (sizes, strides, offset_elems) in cases {
            for es in [2u64, 4, 8] {
                let layout = Layout {
                    offset: offset_elems * es,
                    sizes: sizes.into(),
                    strides: strides.into(),
                    elem_size: es,
                };
                let (lo, hi) = layout.byte_span().unwrap();
                let buffer: Vec<u8> = (0..hi).map(|b| (b * 7 + b / 3) as u8).collect();
                let mut words = vec![0u64; (hi - lo).div_ceil(8) as usize];
                let span =
                    &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..(hi - lo) as usize];
                span.copy_from_slice(&buffer[lo as usize..]);
                let n = layout.nbytes() as usize;
                let mut dst_words = vec![0u64; n.div_ceil(8)];
                let dst = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut dst_words)[..n];
                assert!(gather_blocked(&layout, lo, span, dst), "{sizes:?} {es}");
                let mut want = vec![0u8; n];
                let contiguous = Layout::contiguous(sizes, es);
                for_each_run(&layout, &contiguous, |d, h, k| {
                    want[h as usize..(h + k) as usize]
                        .copy_from_slice(&buffer[d as usize..(d + k) as usize]);
                    Ok(())
                })
                .unwrap();
                assert_eq!(dst, &want[..], "{sizes:?} {strides:?} {es}");
            }
        }
    }
}

#[cfg(test)]
mod store_over_tests {
    use super::*;
    use crate::ir::{BinaryOp, DType, GraphBuilder, Prim};

    fn f32s(dims: &[u64]) -> TensorType {
        TensorType::new(DType::F32, dims)
    }

    /// The plain matrix product: lhs [m, k] . rhs [k, n].
    fn matmul() -> Prim {
        Prim::DotGeneral {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract: vec![1],
            rhs_contract: vec![0],
            precision: Default::default(),
        }
    }

    /// `p * 0.5 + g` over [3, 4], and the broadcast 0.5 it scales by.
    fn halved_plus(b: &mut GraphBuilder, p: ValueId, g: ValueId) -> (ValueId, ValueId) {
        let half = b.scalar(DType::F32, 0.5).unwrap();
        let half = b
            .op(
                Prim::BroadcastInDim {
                    dims: vec![3, 4],
                    mapping: vec![],
                },
                &[half],
            )
            .unwrap();
        let scaled = b.binary(BinaryOp::Mul, p, half).unwrap();
        (b.binary(BinaryOp::Add, scaled, g).unwrap(), half)
    }

    /// `p * 0.5 + g` and `m * 0.9`: an update of each parameter, as an
    /// optimizer's in-place step records it, plus `extra` on top.
    fn update(
        extra: impl FnOnce(&mut GraphBuilder, ValueId, ValueId, ValueId) -> Vec<ValueId>,
    ) -> Graph {
        let mut b = GraphBuilder::new();
        let (p, g, m) = (
            b.param(f32s(&[3, 4])),
            b.param(f32s(&[3, 4])),
            b.param(f32s(&[3, 4])),
        );
        let (p_new, half) = halved_plus(&mut b, p, g);
        let m_new = b.binary(BinaryOp::Mul, m, half).unwrap();
        let mut outs = vec![p_new, m_new];
        outs.extend(extra(&mut b, p, m, p_new));
        b.build(&outs).unwrap()
    }

    fn over(exe: &HostExecutable, out: usize) -> Vec<ValueId> {
        let v = exe.graph().outputs()[out];
        exe.in_place.over.get(&v).cloned().unwrap_or_default()
    }

    #[test]
    fn an_update_may_store_over_the_parameters_it_reads_in_order() {
        let exe = HostExecutable::new(update(|_, _, _, _| vec![]));
        let params = exe.graph().params().to_vec();
        // p_new could go over p or g (each read where it is stored).
        assert_eq!(over(&exe, 0), vec![params[0], params[1]]);
        assert_eq!(over(&exe, 1), vec![params[2]]);
        // p also read transposed: its elements are read at other positions.
        let exe = HostExecutable::new(update(|b, p, _, _| {
            let t = b.op(Prim::Transpose { perm: vec![1, 0] }, &[p]).unwrap();
            let t = b.op(Prim::Reshape { dims: vec![3, 4] }, &[t]).unwrap();
            vec![b.binary(BinaryOp::Sub, t, p).unwrap()]
        }));
        assert_eq!(over(&exe, 0), vec![], "{:?}", exe.plan());
        // m also read by a product (another kernel, which may run later).
        let exe = HostExecutable::new(update(|b, _, m, _| {
            let dot = Prim::DotGeneral {
                lhs_batch: vec![],
                rhs_batch: vec![],
                lhs_contract: vec![1],
                rhs_contract: vec![1],
                precision: Default::default(),
            };
            vec![b.op(dot, &[m, m]).unwrap()]
        }));
        assert_eq!(over(&exe, 1), vec![]);
        assert_eq!(over(&exe, 0).len(), 2);
    }

    /// Run in place (outputs over their inputs), with and without the
    /// stores going straight into the parameters: strict's results.
    /// A one-chip host runtime and its default stream.
    fn host_runtime() -> (crate::runtime::Runtime, crate::stream::Stream) {
        use crate::runtime::{Runtime, RuntimeOptions};
        let r = Runtime::new(&RuntimeOptions {
            platform: Some("host".into()),
            host_chips: Some(1),
            host_topology: None,
            host_hbm_bytes: Some(64 << 20),
            cache: Some(crate::compile::CacheConfig::memory_only(8)),
        })
        .unwrap();
        let s = r.default_stream(0).unwrap();
        (r, s)
    }

    fn upload(
        r: &crate::runtime::Runtime,
        s: &crate::stream::Stream,
        dims: &[u64],
        v: &[f32],
    ) -> DeviceTensor {
        let b = r.allocate(0, (v.len() * 4) as u64, s).unwrap();
        r.copy_host_to_device(bytemuck::cast_slice(v), &b, &Layout::bytes(b.len()), s)
            .unwrap();
        DeviceTensor::contiguous(b, DType::F32, dims).unwrap()
    }

    fn download(
        r: &crate::runtime::Runtime,
        s: &crate::stream::Stream,
        t: &DeviceTensor,
    ) -> Vec<f32> {
        let mut out = vec![0u8; t.ty().nbytes() as usize];
        r.copy_device_to_host(&t.buffer, &t.layout, &mut out, s)
            .unwrap();
        bytemuck::cast_slice::<u8, f32>(&out).to_vec()
    }

    #[test]
    fn updates_run_in_place_give_the_results_of_separate_outputs() {
        let (r, s) = host_runtime();
        let upload = |v: &[f32]| upload(&r, &s, &[3, 4], v);
        let download = |t: &DeviceTensor| download(&r, &s, t);
        let pv: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let gv: Vec<f32> = (0..12).map(|i| 100.0 - i as f32).collect();
        let mv: Vec<f32> = (0..12).map(|i| -(i as f32)).collect();
        let rows = |b: &mut GraphBuilder, p: ValueId, _, _| {
            // p's first row broadcast down: read out of order, so p_new is
            // not stored over p; the update of m still is.
            let row = b
                .op(
                    Prim::Slice {
                        start: vec![0, 0],
                        limit: vec![1, 4],
                        stride: vec![1, 1],
                    },
                    &[p],
                )
                .unwrap();
            let row = b.op(Prim::Reshape { dims: vec![4] }, &[row]).unwrap();
            let down = b
                .op(
                    Prim::BroadcastInDim {
                        dims: vec![3, 4],
                        mapping: vec![1],
                    },
                    &[row],
                )
                .unwrap();
            vec![b.binary(BinaryOp::Add, p, down).unwrap()]
        };
        // p read again after p_new is stored over it, in the same pass: the
        // pass must have copied p's chunk, not pointed at p's memory.
        let after = |b: &mut GraphBuilder, p: ValueId, _, p_new: ValueId| {
            vec![b.binary(BinaryOp::Sub, p_new, p).unwrap()]
        };
        // The extra output's element i, from p and g.
        type Want = fn(usize, &[f32], &[f32]) -> f32;
        let cases: [(Graph, Want); 3] = [
            (update(|_, _, _, _| vec![]), |_, _, _| 0.0),
            (update(rows), |i, p, _| p[i] + p[i % 4]),
            (update(after), |i, p, g| p[i] * 0.5 + g[i] - p[i]),
        ];
        for (graph, extra_want) in cases {
            let exe = HostExecutable::new(graph);
            let extra = exe.graph().outputs().len() - 2;
            let (p, g, m) = (upload(&pv), upload(&gv), upload(&mv));
            let extras: Vec<DeviceTensor> = (0..extra).map(|_| upload(&[0.0; 12])).collect();
            let mut outs = vec![p.clone(), m.clone()];
            outs.extend(extras.iter().cloned());
            exe.execute(&[p.clone(), g, m.clone()], &outs).unwrap();
            let want_p: Vec<f32> = pv.iter().zip(&gv).map(|(p, g)| p * 0.5 + g).collect();
            let want_m: Vec<f32> = mv.iter().map(|m| m * 0.5).collect();
            assert_eq!(download(&p), want_p);
            assert_eq!(download(&m), want_m);
            for e in &extras {
                let want: Vec<f32> = (0..12).map(|i| extra_want(i, &pv, &gv)).collect();
                assert_eq!(download(e), want);
            }
        }
    }

    /// A loop's output that a later kernel reads (an activation the
    /// backward keeps and the next layer uses) is stored once, straight
    /// into the output's memory, and the later kernel reads it there.
    #[test]
    fn an_output_read_by_a_later_kernel_is_stored_in_place() {
        let mut b = GraphBuilder::new();
        let (x, w) = (b.param(f32s(&[3, 4])), b.param(f32s(&[4, 2])));
        let y = b.unary(crate::ir::UnaryOp::Neg, x).unwrap();
        let z = b.op(matmul(), &[y, w]).unwrap();
        // And by a loop (which may be y's own).
        let y2 = b.binary(BinaryOp::Mul, y, y).unwrap();
        let exe = HostExecutable::new(b.build(&[y, z, y2]).unwrap());
        assert!(
            exe.direct_ok.contains(&exe.graph().outputs()[0]),
            "{:?}",
            exe.plan()
        );
        let (r, s) = host_runtime();
        let xv: Vec<f32> = (0..12).map(|i| i as f32 - 5.0).collect();
        let wv: Vec<f32> = (0..8).map(|i| (i % 3) as f32 + 0.5).collect();
        let (xt, wt) = (upload(&r, &s, &[3, 4], &xv), upload(&r, &s, &[4, 2], &wv));
        let outs = [
            upload(&r, &s, &[3, 4], &[0.0; 12]),
            upload(&r, &s, &[3, 2], &[0.0; 6]),
            upload(&r, &s, &[3, 4], &[0.0; 12]),
        ];
        exe.execute(&[xt, wt], &outs).unwrap();
        let yv: Vec<f32> = xv.iter().map(|v| -v).collect();
        let zv: Vec<f32> = (0..6)
            .map(|k| (0..4).map(|j| yv[k / 2 * 4 + j] * wv[j * 2 + k % 2]).sum())
            .collect();
        assert_eq!(download(&r, &s, &outs[0]), yv);
        assert_eq!(download(&r, &s, &outs[1]), zv);
        let y2v: Vec<f32> = yv.iter().map(|v| v * v).collect();
        assert_eq!(download(&r, &s, &outs[2]), y2v);
    }

    /// A parameter the program's products read before its update (the
    /// forward's and backward's products read a weight, the optimizer then
    /// updates it) is updated in place; one that a kernel run node by node
    /// reads first (which may hand on a view of it) is not.
    #[test]
    fn an_update_stores_over_a_parameter_products_read_before_it() {
        // `first` reads p (and x) before p_new = p * 0.5 + g.
        let graph = |first: &dyn Fn(&mut GraphBuilder, ValueId, ValueId) -> ValueId| {
            let mut b = GraphBuilder::new();
            let (p, g, x) = (
                b.param(f32s(&[3, 4])),
                b.param(f32s(&[3, 4])),
                b.param(f32s(&[2, 3])),
            );
            let y = first(&mut b, p, x);
            let (p_new, _) = halved_plus(&mut b, p, g);
            b.build(&[p_new, y]).unwrap()
        };
        let product =
            |b: &mut GraphBuilder, p: ValueId, x: ValueId| b.op(matmul(), &[x, p]).unwrap();
        let exe = HostExecutable::new(graph(&product));
        let (p, g) = (exe.graph().params()[0], exe.graph().params()[1]);
        // (p_new may go over g as well: read in order, by this loop only.)
        assert_eq!(over(&exe, 0), vec![p, g], "{:?}", exe.plan());
        let concat = |b: &mut GraphBuilder, p: ValueId, _| {
            b.op(Prim::Concatenate { dimension: 0 }, &[p, p]).unwrap()
        };
        assert_eq!(over(&HostExecutable::new(graph(&concat)), 0), vec![g]);

        // Run: the product saw p before the update went over it.
        let (r, s) = host_runtime();
        let pv: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let gv: Vec<f32> = (0..12).map(|i| 1.0 - i as f32).collect();
        let xv: Vec<f32> = (0..6).map(|i| (i % 4) as f32 - 1.5).collect();
        let (pt, gt, xt) = (
            upload(&r, &s, &[3, 4], &pv),
            upload(&r, &s, &[3, 4], &gv),
            upload(&r, &s, &[2, 3], &xv),
        );
        let y = upload(&r, &s, &[2, 4], &[0.0; 8]);
        exe.execute(&[pt.clone(), gt, xt], &[pt.clone(), y.clone()])
            .unwrap();
        let want_p: Vec<f32> = pv.iter().zip(&gv).map(|(p, g)| p * 0.5 + g).collect();
        let want_y: Vec<f32> = (0..8)
            .map(|k| (0..3).map(|j| xv[k / 4 * 3 + j] * pv[j * 4 + k % 4]).sum())
            .collect();
        assert_eq!(download(&r, &s, &pt), want_p);
        assert_eq!(download(&r, &s, &y), want_y);
    }

    /// The same memory as two parameters, a weight and its transpose (a
    /// linear layer's forward reads `w.t()`, the optimizer updates `w`):
    /// the update may overwrite the transposed view when a product read it
    /// before, not when one reads it after; both give the same results.
    #[test]
    fn an_update_overwrites_another_view_only_after_its_last_read() {
        // [p, g, x, wt]: y = x . wt (wt [4, 3], given as p transposed) read
        // before or after p_new = p * 0.5 + g.
        let graph = |product_first: bool| {
            let mut b = GraphBuilder::new();
            let (p, g, x, wt) = (
                b.param(f32s(&[3, 4])),
                b.param(f32s(&[3, 4])),
                b.param(f32s(&[2, 4])),
                b.param(f32s(&[4, 3])),
            );
            let mut y = None;
            if product_first {
                y = Some(b.op(matmul(), &[x, wt]).unwrap());
            }
            let g2 = b.binary(BinaryOp::Add, g, g).unwrap();
            let p_new = b.binary(BinaryOp::Sub, p, g2).unwrap();
            let y = y.unwrap_or_else(|| b.op(matmul(), &[x, wt]).unwrap());
            b.build(&[p_new, y]).unwrap()
        };
        let (r, s) = host_runtime();
        let pv: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let gv: Vec<f32> = (0..12).map(|i| 0.25 * i as f32).collect();
        let xv: Vec<f32> = (0..8).map(|i| (i % 3) as f32 - 1.0).collect();
        for product_first in [true, false] {
            let exe = HostExecutable::new(graph(product_first));
            let ps = exe.graph().params().to_vec();
            let p_new = exe.graph().outputs()[0];
            assert_eq!(
                exe.in_place.may_overwrite(p_new, ps[3], false),
                product_first,
                "{:?}",
                exe.plan()
            );
            let pt = upload(&r, &s, &[3, 4], &pv);
            let wt = DeviceTensor::new(pt.buffer.clone(), DType::F32, 0, &[4, 3], Some(&[1, 4]))
                .unwrap();
            let y = upload(&r, &s, &[2, 3], &[0.0; 6]);
            let ins = [
                pt.clone(),
                upload(&r, &s, &[3, 4], &gv),
                upload(&r, &s, &[2, 4], &xv),
                wt,
            ];
            exe.execute(&ins, &[pt.clone(), y.clone()]).unwrap();
            let want_p: Vec<f32> = pv.iter().zip(&gv).map(|(p, g)| p - 2.0 * g).collect();
            // wt[j][c] = p[c][j], the old p.
            let want_y: Vec<f32> = (0..6)
                .map(|k| {
                    (0..4)
                        .map(|j| xv[k / 3 * 4 + j] * pv[(k % 3) * 4 + j])
                        .sum()
                })
                .collect();
            assert_eq!(
                download(&r, &s, &pt),
                want_p,
                "product first {product_first}"
            );
            assert_eq!(
                download(&r, &s, &y),
                want_y,
                "product first {product_first}"
            );
        }
    }
}

#[cfg(test)]
mod serialize_tests {
    use super::*;
    use crate::ir::{DType, GraphBuilder, Prim};

    /// x · wᵀ with the transpose written out, which simplification folds
    /// into the product.
    fn graph() -> Graph {
        let mut b = GraphBuilder::new();
        let x = b.param(TensorType::new(DType::F32, &[2, 3]));
        let w = b.param(TensorType::new(DType::F32, &[4, 3]));
        let wt = b.op(Prim::Transpose { perm: vec![1, 0] }, &[w]).unwrap();
        let dot = Prim::DotGeneral {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract: vec![1],
            rhs_contract: vec![0],
            precision: Default::default(),
        };
        let y = b.op(dot, &[x, wt]).unwrap();
        b.build(&[y]).unwrap()
    }

    /// The disk entry holds the graph as given, not as this build
    /// simplified it, so a later build simplifies it with its own rules;
    /// an entry of the format that held the simplified graph is refused.
    #[test]
    fn a_serialized_executable_holds_the_graph_as_given() {
        let g = graph();
        let exe = HostExecutable::new(g.clone());
        assert_ne!(exe.graph().canonical(), g.canonical(), "nothing simplified");
        let bytes = exe.serialize().unwrap();
        let version = format!("host-{}", env!("CARGO_PKG_VERSION"));
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert_eq!(text, format!("{MAGIC}\n{version}\n{}", g.canonical()));
        let back = HostExecutable::deserialize(&bytes, &version).unwrap();
        assert_eq!(back.graph().canonical(), exe.graph().canonical());
        assert_eq!(back.source.canonical(), g.canonical());
        let old = format!(
            "tpurt-host-executable-1\n{version}\n{}",
            exe.graph().canonical()
        );
        let e = HostExecutable::deserialize(old.as_bytes(), &version)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not a host executable"), "{e}");
    }
}
