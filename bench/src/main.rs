//! Side-by-side benchmarks. `bench/run [NAME...]` prints one JSON object
//! per line: name, ours, peer, peer_name, unit and ratio (peer over ours;
//! above 1 means tpurt is faster). Both sides run in the same process,
//! interleaved, and each figure is the median over repetitions.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::mpsc;
use std::time::Instant;

use tpurt_runtime::compile::CacheConfig;
use tpurt_runtime::eager::{pop_mode, push_mode, EagerMode};
use tpurt_runtime::ir::DType;
use tpurt_runtime::ops::{self, Attr, Attrs};
use tpurt_runtime::{CoreKind, DeviceTensor, Layout as TLayout, Runtime, RuntimeOptions, Stream};

struct Row {
    name: String,
    ours: f64,
    peer: f64,
    peer_name: std::borrow::Cow<'static, str>,
    unit: &'static str,
}

impl Row {
    fn print(&self) {
        let line = serde_json::json!({
            "name": self.name,
            "ours": round(self.ours),
            "peer": round(self.peer),
            "peer_name": self.peer_name,
            "unit": self.unit,
            "ratio": round(self.peer / self.ours),
        });
        println!("{line}");
    }
}

fn round(x: f64) -> f64 {
    if x.abs() >= 100.0 {
        x.round()
    } else {
        (x * 1000.0).round() / 1000.0
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Run `ours` and `peer` alternately `reps` times; each call does `ops`
/// operations. Returns the median nanoseconds per operation of each.
fn paired(reps: usize, ops: usize, mut ours: impl FnMut(), mut peer: impl FnMut()) -> (f64, f64) {
    // Warm both up once.
    ours();
    peer();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t = Instant::now();
        ours();
        a.push(t.elapsed().as_nanos() as f64 / ops as f64);
        let t = Instant::now();
        peer();
        b.push(t.elapsed().as_nanos() as f64 / ops as f64);
    }
    (median(a), median(b))
}

fn runtime() -> Runtime {
    Runtime::new(&RuntimeOptions {
        platform: Some("host".into()),
        ..Default::default()
    })
    .expect("host runtime")
}

/// Allocate and free cached sizes from a chip's HBM pool, against the
/// system allocator (malloc/free) with the same sizes.
fn pool_alloc_free(rows: &mut Vec<Row>) {
    let rt = runtime();
    let pool = rt.pool(0).unwrap();
    let stream = rt.default_stream(0).unwrap();
    let clock = stream.clock();
    for (label, size) in [
        ("4KiB", 4u64 << 10),
        ("256KiB", 256 << 10),
        ("4MiB", 4 << 20),
        ("64MiB", 64 << 20),
    ] {
        let ops = 20_000;
        let layout = Layout::from_size_align(size as usize, 64).unwrap();
        let (ours, peer) = paired(
            15,
            ops,
            || {
                for _ in 0..ops {
                    let b = pool.allocate(size, clock).unwrap();
                    pool.free(black_box(b));
                }
            },
            || {
                for _ in 0..ops {
                    // SAFETY: non-zero layout; the pointer is freed with the same layout.
                    unsafe {
                        let p = System.alloc(black_box(layout));
                        assert!(!p.is_null());
                        System.dealloc(black_box(p), layout);
                    }
                }
            },
        );
        rows.push(Row {
            name: format!("pool_alloc_free_{label}"),
            ours,
            peer,
            peer_name: "system allocator (glibc malloc+free)".into(),
            unit: "ns/op",
        });
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// A bare worker thread fed boxed closures through std's channel: the
/// least an executor can do.
fn channel_worker() -> (mpsc::Sender<Job>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel::<Job>();
    let h = std::thread::spawn(move || {
        while let Ok(job) = rx.recv() {
            job();
        }
    });
    (tx, h)
}

/// Empty tasks launched on a stream, then one synchronize; per task.
fn stream_empty_task(rows: &mut Vec<Row>) {
    let rt = runtime();
    let stream = rt.create_stream(0, CoreKind::TensorCore, 0).unwrap();
    let (tx, worker) = channel_worker();
    let ops = 20_000;
    let (ours, peer) = paired(
        15,
        ops,
        || {
            for _ in 0..ops {
                stream.submit("empty", || Ok(())).unwrap();
            }
            stream.synchronize().unwrap();
        },
        || {
            for _ in 0..ops {
                tx.send(Box::new(|| {})).unwrap();
            }
            let (done_tx, done_rx) = mpsc::channel();
            tx.send(Box::new(move || done_tx.send(()).unwrap()))
                .unwrap();
            done_rx.recv().unwrap();
        },
    );
    drop(tx);
    worker.join().unwrap();
    rows.push(Row {
        name: "stream_empty_task".into(),
        ours: ours / 1000.0,
        peer: peer / 1000.0,
        peer_name: "std mpsc channel to a worker thread".into(),
        unit: "us/task",
    });
}

/// Host -> stream A (a task, an event) -> stream B (waits on the event,
/// runs a task) -> host (synchronize): one round trip per iteration.
fn event_roundtrip(rows: &mut Vec<Row>) {
    let rt = runtime();
    let a = rt.create_stream(0, CoreKind::TensorCore, 0).unwrap();
    let b = rt.create_stream(0, CoreKind::SparseCore, 0).unwrap();
    let event = rt.create_event(false);
    let (to_a, wa) = channel_worker();
    let (to_b, wb) = channel_worker();
    let ops = 2_000;
    let (ours, peer) = paired(
        11,
        ops,
        || {
            for _ in 0..ops {
                a.submit("produce", || Ok(())).unwrap();
                event.record(&a).unwrap();
                b.wait_event(&event).unwrap();
                b.submit("consume", || Ok(())).unwrap();
                b.synchronize().unwrap();
            }
        },
        || {
            for _ in 0..ops {
                let (done_tx, done_rx) = mpsc::channel();
                let to_b = to_b.clone();
                to_a.send(Box::new(move || {
                    to_b.send(Box::new(move || done_tx.send(()).unwrap()))
                        .unwrap();
                }))
                .unwrap();
                done_rx.recv().unwrap();
            }
        },
    );
    drop((to_a, to_b));
    wa.join().unwrap();
    wb.join().unwrap();
    rows.push(Row {
        name: "event_roundtrip".into(),
        ours: ours / 1000.0,
        peer: peer / 1000.0,
        peer_name: "two worker threads chained by std mpsc channels".into(),
        unit: "us/roundtrip",
    });
}

type Bench = fn(&mut Vec<Row>);

fn rt_memory_cache() -> Runtime {
    Runtime::new(&RuntimeOptions {
        platform: Some("host".into()),
        cache: Some(CacheConfig::memory_only(4096)),
        ..Default::default()
    })
    .expect("host runtime")
}

fn upload(r: &Runtime, s: &Stream, dims: &[u64], seed: u32) -> DeviceTensor {
    let n: u64 = dims.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i as u32).wrapping_mul(2654435761) ^ seed) as f32 / u32::MAX as f32 - 0.5)
        .collect();
    let b = r.allocate(0, n * 4, s).unwrap();
    r.copy_host_to_device(bytemuck::cast_slice(&v), &b, &TLayout::bytes(n * 4), s)
        .unwrap();
    DeviceTensor::contiguous(b, DType::F32, dims).unwrap()
}

fn call(r: &Runtime, s: &Stream, name: &str, ins: &[&DeviceTensor], attrs: Attrs) -> DeviceTensor {
    let ins: Vec<DeviceTensor> = ins.iter().map(|t| (*t).clone()).collect();
    r.call_op_alloc(ops::lookup(name).unwrap(), &ins, &attrs, s)
        .unwrap()
        .remove(0)
}

/// bias + GELU(erf) + dropout(0.1) + residual + layer_norm, as one model
/// block issues it (ANCHORS' block; a fixed dropout seed, so every step is
/// the same program).
fn block_a(r: &Runtime, s: &Stream, x: &DeviceTensor, b: &DeviceTensor) -> DeviceTensor {
    let h = call(r, s, "add", &[x, b], Attrs::new());
    let g = call(r, s, "gelu", &[&h], Attrs::new());
    let dropout = Attrs::new()
        .with("p", Attr::Float(0.1))
        .with("seed", Attr::Int(1234))
        .with("offset", Attr::Int(0));
    let d = call(r, s, "dropout", &[&g], dropout);
    let y = call(r, s, "add", &[&d, x], Attrs::new());
    let ln = Attrs::new().with("normalized_shape", Attr::Ints(vec![1024]));
    call(r, s, "layer_norm", &[&y], ln)
}

/// softmax(q k^T / 8) v over [8, 8, 256, 64].
fn block_b(
    r: &Runtime,
    s: &Stream,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
) -> DeviceTensor {
    let kt = call(
        r,
        s,
        "transpose",
        &[k],
        Attrs::new()
            .with("dim0", Attr::Int(-2))
            .with("dim1", Attr::Int(-1)),
    );
    let sc = call(r, s, "matmul", &[q, &kt], Attrs::new());
    // Queued, as a frontend uploads a Python scalar: a synchronous copy
    // would wait for the stream and so cut a deferred recording in two.
    let eight = r.allocate(0, 4, s).unwrap();
    r.copy_host_to_device_async(8f32.to_le_bytes().to_vec(), &eight, &TLayout::bytes(4), s)
        .unwrap();
    let eight = DeviceTensor::contiguous(eight, DType::F32, &[]).unwrap();
    let sc = call(r, s, "div", &[&sc, &eight], Attrs::new());
    let p = call(
        r,
        s,
        "softmax",
        &[&sc],
        Attrs::new().with("dim", Attr::Int(-1)),
    );
    call(r, s, "matmul", &[&p, v], Attrs::new())
}

fn timed_step(mode: EagerMode, s: &Stream, step: &dyn Fn() -> DeviceTensor) {
    push_mode(mode).unwrap();
    let out = step();
    pop_mode().unwrap();
    s.synchronize().unwrap();
    drop(out);
}

/// One row from two steps timed alternately (7 repetitions, medians):
/// each side is a stream, the mode it runs in, and the step.
type Side<'a> = (&'a Stream, EagerMode, &'a dyn Fn() -> DeviceTensor);

fn step_row(
    rows: &mut Vec<Row>,
    name: &str,
    peer_name: impl Into<std::borrow::Cow<'static, str>>,
    ours: Side,
    peer: Side,
) {
    let (ours, peer) = paired(
        7,
        1,
        || timed_step(ours.1, ours.0, ours.2),
        || timed_step(peer.1, peer.0, peer.2),
    );
    rows.push(Row {
        name: name.into(),
        ours: ours / 1e6,
        peer: peer / 1e6,
        peer_name: peer_name.into(),
        unit: "ms/step",
    });
}

/// The same block under DEFER_AND_FUSE (ours) and strict DEFER_NEVER (peer).
fn defer_vs_strict(rows: &mut Vec<Row>) {
    let r = rt_memory_cache();
    let s = r.default_stream(0).unwrap();
    let x = upload(&r, &s, &[4096, 1024], 1);
    let b = upload(&r, &s, &[1024], 2);
    let a = || block_a(&r, &s, &x, &b);
    step_row(
        rows,
        "defer_vs_strict_bias_gelu_dropout_residual_layernorm_4096x1024",
        "tpurt strict (DEFER_NEVER) on the same block",
        (&s, EagerMode::DeferAndFuse, &a),
        (&s, EagerMode::DeferNever, &a),
    );
    let q = upload(&r, &s, &[8, 8, 256, 64], 3);
    let k = upload(&r, &s, &[8, 8, 256, 64], 4);
    let v = upload(&r, &s, &[8, 8, 256, 64], 5);
    let bb = || block_b(&r, &s, &q, &k, &v);
    step_row(
        rows,
        "defer_vs_strict_softmax_attention_8x8x256x64",
        "tpurt strict (DEFER_NEVER) on the same block",
        (&s, EagerMode::DeferAndFuse, &bb),
        (&s, EagerMode::DeferNever, &bb),
    );
}

/// The xla platform over the plugin `find_plugin` picks (one chip), what
/// the xla rows name that plugin, and the suffix of their row names: the
/// XLA CPU plugin's rows keep their names; another plugin's
/// (`bench/gpu-check` runs them on the CUDA plugin) end in `_on_` and its
/// platform, so a GPU's figures are never read as the CPU plugin's.
#[cfg(feature = "xla")]
fn xla_platform() -> (
    std::sync::Arc<tpurt_runtime::platform::xla::XlaPlatform>,
    String,
    String,
) {
    use tpurt_runtime::platform::xla::{find_plugin, XlaPlatform};
    let p = XlaPlatform::load(&find_plugin().expect("a PJRT plugin"), 1).expect("xla platform");
    let (plugin, suffix) = match p.plugin_platform() {
        "cpu" => ("XLA CPU plugin".into(), String::new()),
        "cuda" => ("CUDA plugin".into(), "_on_cuda".into()),
        other => (format!("{other} plugin"), format!("_on_{other}")),
    };
    (p, plugin, suffix)
}

/// The same deferred blocks on the host platform (ours) and on the xla
/// platform over the XLA CPU plugin (peer; see `xla_platform`), each a
/// flush of one program: our fused loops against XLA's own fusion. Built
/// only with the bench's `xla` feature, which `bench/run` turns on when
/// the plugin is installed.
#[cfg(feature = "xla")]
fn host_vs_xla(rows: &mut Vec<Row>) {
    let host = rt_memory_cache();
    let (p, plugin, suffix) = xla_platform();
    let xla =
        Runtime::with_platform_and_cache(p, CacheConfig::memory_only(4096)).expect("xla runtime");
    let (hs, xs) = (
        host.default_stream(0).unwrap(),
        xla.default_stream(0).unwrap(),
    );
    let (hx, hb) = (
        upload(&host, &hs, &[4096, 1024], 1),
        upload(&host, &hs, &[1024], 2),
    );
    let (xx, xb) = (
        upload(&xla, &xs, &[4096, 1024], 1),
        upload(&xla, &xs, &[1024], 2),
    );
    let ha = || block_a(&host, &hs, &hx, &hb);
    let xa = || block_a(&xla, &xs, &xx, &xb);
    let peer_name = format!("the same deferred block on the xla platform ({plugin}, one module)");
    step_row(
        rows,
        &format!("host_vs_xla_bias_gelu_dropout_residual_layernorm_4096x1024{suffix}"),
        peer_name.clone(),
        (&hs, EagerMode::DeferAndFuse, &ha),
        (&xs, EagerMode::DeferAndFuse, &xa),
    );
    let hq: Vec<DeviceTensor> = (3..6)
        .map(|k| upload(&host, &hs, &[8, 8, 256, 64], k))
        .collect();
    let xq: Vec<DeviceTensor> = (3..6)
        .map(|k| upload(&xla, &xs, &[8, 8, 256, 64], k))
        .collect();
    let hb2 = || block_b(&host, &hs, &hq[0], &hq[1], &hq[2]);
    let xb2 = || block_b(&xla, &xs, &xq[0], &xq[1], &xq[2]);
    step_row(
        rows,
        &format!("host_vs_xla_softmax_attention_8x8x256x64{suffix}"),
        peer_name,
        (&hs, EagerMode::DeferAndFuse, &hb2),
        (&xs, EagerMode::DeferAndFuse, &xb2),
    );
}

/// y = x * 2 + 1 over 64 MiB through the fused loop, against a memcpy of
/// the same bytes (read + write): ratio = fused throughput / memcpy's.
fn fused_bandwidth(rows: &mut Vec<Row>) {
    let r = rt_memory_cache();
    let s = r.default_stream(0).unwrap();
    let n = 16u64 << 20;
    let x = upload(&r, &s, &[n], 7);
    let two = upload(&r, &s, &[], 8);
    let step = || {
        let y = call(&r, &s, "mul", &[&x, &two], Attrs::new());
        call(&r, &s, "add", &[&y, &two], Attrs::new())
    };
    let src = vec![1u8; (n * 4) as usize];
    let mut dst = vec![0u8; (n * 4) as usize];
    let (ours, peer) = paired(
        7,
        1,
        || timed_step(EagerMode::DeferAndFuse, &s, &step),
        || {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        },
    );
    rows.push(Row {
        name: "fused_elementwise_64MiB_vs_memcpy".into(),
        ours: ours / 1e6,
        peer: peer / 1e6,
        peer_name: "memcpy of the same bytes (read + write)".into(),
        unit: "ms",
    });
}

/// f32 matmul through the runtime (strict, synchronized) against the gemm
/// crate called directly on the same sizes, both using 2 threads.
fn matmul(rows: &mut Vec<Row>) {
    let r = rt_memory_cache();
    let s = r.default_stream(0).unwrap();
    for n in [512u64, 1024, 2048] {
        let a = upload(&r, &s, &[n, n], 11);
        let b = upload(&r, &s, &[n, n], 12);
        let av: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 * 0.1).collect();
        let bv = av.clone();
        let mut cv = vec![0f32; (n * n) as usize];
        let nn = n as usize;
        let flops = 2.0 * (n as f64).powi(3);
        // About 0.2 s a side: five products of 512 (1 ms each) gave
        // medians that moved by 10% between runs.
        let reps = (0.2 / (flops / 300e9)).clamp(5.0, 61.0) as usize;
        let (ours, peer) = paired(
            reps,
            1,
            || {
                let c = call(&r, &s, "mm", &[&a, &b], Attrs::new());
                s.synchronize().unwrap();
                drop(c);
            },
            || {
                // SAFETY: the three buffers hold n*n f32 each, row-major, and do not overlap.
                unsafe {
                    gemm::gemm(
                        nn,
                        nn,
                        nn,
                        cv.as_mut_ptr(),
                        1,
                        nn as isize,
                        false,
                        av.as_ptr(),
                        1,
                        nn as isize,
                        bv.as_ptr(),
                        1,
                        nn as isize,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::Rayon(2),
                    )
                };
                black_box(&cv);
            },
        );
        eprintln!(
            "matmul {n}: tpurt {:.0} GFLOP/s, gemm directly {:.0} GFLOP/s",
            flops / ours,
            flops / peer
        );
        rows.push(Row {
            name: format!("matmul_f32_{n}"),
            ours: ours / 1e6,
            peer: peer / 1e6,
            peer_name: "gemm crate called directly".into(),
            unit: "ms",
        });
    }
}

/// The block's first run on an empty compile cache against a warm run.
fn cold_vs_warm(rows: &mut Vec<Row>) {
    let mut colds = Vec::new();
    let mut warms = Vec::new();
    for _ in 0..5 {
        let r = rt_memory_cache();
        let s = r.default_stream(0).unwrap();
        let x = upload(&r, &s, &[256, 1024], 1);
        let b = upload(&r, &s, &[1024], 2);
        let a = || block_a(&r, &s, &x, &b);
        let t = Instant::now();
        timed_step(EagerMode::DeferAndFuse, &s, &a);
        colds.push(t.elapsed().as_nanos() as f64);
        let t = Instant::now();
        timed_step(EagerMode::DeferAndFuse, &s, &a);
        warms.push(t.elapsed().as_nanos() as f64);
    }
    rows.push(Row {
        name: "first_step_cold_vs_warm_cache_block_256x1024".into(),
        ours: median(warms) / 1e6,
        peer: median(colds) / 1e6,
        peer_name: "the same step on an empty compile cache (first run)".into(),
        unit: "ms",
    });
}

/// The first step of a fresh runtime on the xla platform: compiled by XLA
/// into an empty cache directory (peer), or loaded from the directory a
/// previous runtime filled (ours: PJRT DeserializeAndLoad). Fresh runtimes
/// in one process; the plugin's client is shared.
#[cfg(feature = "xla")]
fn xla_cold_vs_warm(rows: &mut Vec<Row>) {
    let (p, plugin, suffix) = xla_platform();
    let base = std::env::temp_dir().join(format!("tpurt-bench-xla-cache-{}", std::process::id()));
    let step = |dir: &std::path::Path| -> f64 {
        let r = Runtime::with_platform_and_cache(
            p.clone(),
            CacheConfig::memory_only(64).with_disk_dir(dir),
        )
        .unwrap();
        let s = r.default_stream(0).unwrap();
        let x = upload(&r, &s, &[256, 1024], 1);
        let b = upload(&r, &s, &[1024], 2);
        let a = || block_a(&r, &s, &x, &b);
        let t = Instant::now();
        timed_step(EagerMode::DeferAndFuse, &s, &a);
        t.elapsed().as_nanos() as f64
    };
    let (mut colds, mut warms) = (Vec::new(), Vec::new());
    for k in 0..5 {
        let dir = base.join(k.to_string());
        colds.push(step(&dir));
        warms.push(step(&dir));
    }
    let _ = std::fs::remove_dir_all(&base);
    rows.push(Row {
        name: format!("xla_first_step_warm_disk_cache_vs_cold_compile_block_256x1024{suffix}"),
        ours: median(warms) / 1e6,
        peer: median(colds) / 1e6,
        peer_name: format!(
            "the same first step compiled by XLA ({plugin}) into an empty cache directory"
        )
        .into(),
        unit: "ms",
    });
}

/// A tiny add through the whole runtime (strict: dispatch, memo lookup,
/// launch, execute) against the host kernel called directly on host
/// tensors: the dispatch overhead per op.
fn tiny_add(rows: &mut Vec<Row>) {
    use tpurt_runtime::platform::host::kernels::{eval, HostTensor};
    let r = rt_memory_cache();
    let s = r.default_stream(0).unwrap();
    let x = upload(&r, &s, &[16], 1);
    let out = call(&r, &s, "add", &[&x, &x], Attrs::new());
    let hx = HostTensor::from_f64(DType::F32, &[16], &[1.0; 16]).unwrap();
    let prim = tpurt_runtime::ir::Prim::Binary(tpurt_runtime::ir::BinaryOp::Add);
    let ops_n = 2000;
    let (ours, peer) = paired(
        9,
        ops_n,
        || strict_adds(&r, &s, &x, &out, ops_n),
        || {
            for _ in 0..ops_n {
                black_box(eval(&prim, &[&hx, &hx]).unwrap());
            }
        },
    );
    rows.push(Row {
        name: "tiny_add_16_through_runtime".into(),
        ours: ours / 1000.0,
        peer: peer / 1000.0,
        peer_name: "the host add kernel called directly (no dispatch)".into(),
        unit: "us/op",
    });
}

/// `n` strict-mode adds of `x` to itself into `out`, then a synchronize:
/// the "ours" side of the tiny-op launch benchmarks.
fn strict_adds(r: &Runtime, s: &Stream, x: &DeviceTensor, out: &DeviceTensor, n: usize) {
    let add = ops::lookup("add").unwrap();
    for _ in 0..n {
        r.call_op(
            add,
            &[x.clone(), x.clone()],
            std::slice::from_ref(out),
            &Attrs::new(),
            s,
        )
        .unwrap();
    }
    s.synchronize().unwrap();
}

/// A tiny op's launch cost on the xla platform through the whole runtime
/// (strict mode: dispatch, the stream's executor, input views and the
/// in-place output), against a bare PJRT execute of the same add with its
/// inputs uploaded once (execute, await the output, destroy it).
#[cfg(feature = "xla")]
fn xla_tiny_add(rows: &mut Vec<Row>) {
    use tpurt_runtime::ir::TensorType;
    use tpurt_runtime::platform::host::kernels::HostTensor;
    let (p, plugin, suffix) = xla_platform();
    let r = Runtime::with_platform_and_cache(p.clone(), CacheConfig::memory_only(64))
        .expect("xla runtime");
    let s = r.default_stream(0).unwrap();
    let x = upload(&r, &s, &[16], 1);
    let out = call(&r, &s, "add", &[&x, &x], Attrs::new());
    let add = ops::lookup("add").unwrap();
    let f16 = TensorType::new(DType::F32, &[16]);
    let graph = ops::build_graph(add, &[f16.clone(), f16], &Attrs::new()).unwrap();
    let hx = HostTensor::from_f64(DType::F32, &[16], &[1.0; 16]).unwrap();
    let bare = p
        .bare_program(&graph, &[hx.clone(), hx])
        .expect("bare PJRT program");
    let ops_n = 2000;
    let (ours, peer) = paired(
        9,
        ops_n,
        || strict_adds(&r, &s, &x, &out, ops_n),
        || {
            for _ in 0..ops_n {
                bare.run().unwrap();
            }
        },
    );
    rows.push(Row {
        name: format!("xla_tiny_add_16_through_runtime{suffix}"),
        ours: ours / 1000.0,
        peer: peer / 1000.0,
        peer_name: format!("a bare PJRT execute of the same add ({plugin})").into(),
        unit: "us/op",
    });
}

/// A step of 200 tiny ops (a chain on 64 floats), deferred: the cost of
/// recording, building the fused graph and finding it in the cache, per
/// op, against strict dispatch of the same ops.
fn deferred_tiny_step(rows: &mut Vec<Row>) {
    let r = rt_memory_cache();
    let s = r.default_stream(0).unwrap();
    let x = upload(&r, &s, &[64], 1);
    let step = || {
        let mut v = x.clone();
        for i in 0..200 {
            let op = if i % 2 == 0 { "add" } else { "mul" };
            v = call(&r, &s, op, &[&v, &x], Attrs::new());
        }
        v
    };
    let (ours, peer) = paired(
        9,
        200,
        || timed_step(EagerMode::DeferAndFuse, &s, &step),
        || timed_step(EagerMode::DeferNever, &s, &step),
    );
    rows.push(Row {
        name: "deferred_200_tiny_ops_per_op".into(),
        ours: ours / 1000.0,
        peer: peer / 1000.0,
        peer_name: "tpurt strict (DEFER_NEVER) on the same ops".into(),
        unit: "us/op",
    });
}

/// Profiling aid: a 2048 matmul's executable run on this thread vs on a stream.
fn mm_probe(_: &mut Vec<Row>) {
    let r = rt_memory_cache();
    let s = r.default_stream(0).unwrap();
    let n = 2048u64;
    let a = upload(&r, &s, &[n, n], 11);
    let b = upload(&r, &s, &[n, n], 12);
    let c = call(&r, &s, "mm", &[&a, &b], Attrs::new());
    let types = vec![a.ty(), b.ty()];
    let exe = r
        .op_executable(ops::lookup("mm").unwrap(), &types, &Attrs::new())
        .unwrap();
    for _ in 0..3 {
        let t = Instant::now();
        exe.execute(&[a.clone(), b.clone()], std::slice::from_ref(&c))
            .unwrap();
        let direct = t.elapsed();
        let t = Instant::now();
        let c2 = call(&r, &s, "mm", &[&a, &b], Attrs::new());
        s.synchronize().unwrap();
        let streamed = t.elapsed();
        drop(c2);
        eprintln!("mm 2048: on this thread {direct:?}, through a stream {streamed:?}");
    }
}

/// Profiling aid: the deferred block alone, repeatedly (no peer, no
/// output; `TPURT_PROFILE_STEPS` steps, 20 unless set; in strict mode
/// when `TPURT_PROFILE_MODE` is `strict`).
fn defer_only(_: &mut Vec<Row>) {
    let r = rt_memory_cache();
    let s = r.default_stream(0).unwrap();
    let which = std::env::var("TPURT_PROFILE_BLOCK").unwrap_or_default();
    let x = upload(&r, &s, &[4096, 1024], 1);
    let b = upload(&r, &s, &[1024], 2);
    let two = upload(&r, &s, &[], 8);
    let a = || block_a(&r, &s, &x, &b);
    let e = || {
        let y = call(&r, &s, "mul", &[&x, &two], Attrs::new());
        call(&r, &s, "add", &[&y, &two], Attrs::new())
    };
    let q = upload(&r, &s, &[8, 8, 256, 64], 3);
    let att = || block_b(&r, &s, &q, &q, &q);
    let steps = std::env::var("TPURT_PROFILE_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let mode = match std::env::var("TPURT_PROFILE_MODE").as_deref() {
        Ok("strict") => EagerMode::DeferNever,
        _ => EagerMode::DeferAndFuse,
    };
    for _ in 0..steps {
        if which == "elementwise" {
            timed_step(mode, &s, &e);
        } else if which == "attention" {
            timed_step(mode, &s, &att);
        } else {
            timed_step(mode, &s, &a);
        }
    }
}

/// Profiling aid: rms_norm over [8, 128, 256], softmax over
/// [8, 8, 256, 256] and layer_norm over [4096, 1024], strict, each op synchronized (`TPURT_PROBE_OP` picks one,
/// `TPURT_PROBE_REPS` sets the count); prints the minimum and median.
fn rows_probe(_: &mut Vec<Row>) {
    let r = rt_memory_cache();
    let s = r.default_stream(0).unwrap();
    let x = upload(&r, &s, &[8, 8, 256, 256], 1);
    let y = upload(&r, &s, &[4096, 1024], 2);
    let z = upload(&r, &s, &[8, 128, 256], 3);
    for (name, input, attrs) in [
        (
            "rms_norm",
            &z,
            Attrs::new().with("normalized_shape", Attr::Ints(vec![256])),
        ),
        ("softmax", &x, Attrs::new().with("dim", Attr::Int(-1))),
        (
            "layer_norm",
            &y,
            Attrs::new().with("normalized_shape", Attr::Ints(vec![1024])),
        ),
    ] {
        if std::env::var("TPURT_PROBE_OP").is_ok_and(|o| o != name) {
            continue;
        }
        let mut ts = vec![];
        let reps: usize = std::env::var("TPURT_PROBE_REPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(40);
        for _ in 0..reps {
            let t = Instant::now();
            let out = call(&r, &s, name, &[input], attrs.clone());
            s.synchronize().unwrap();
            ts.push(t.elapsed().as_secs_f64() * 1e3);
            drop(out);
        }
        let min = ts.iter().cloned().fold(f64::INFINITY, f64::min);
        eprintln!("{name}: min {min:.3} ms, median {:.3} ms", median(ts));
    }
}

/// Profiling aid: one unary or binary op over [8, 128, 688] f32 (or
/// attention over [8, 8, 256, 64]), strict,
/// each call synchronized (`TPURT_PROBE_OP`, default `exp`;
/// `TPURT_PROBE_REPS`); prints the minimum and median.
fn op_probe(_: &mut Vec<Row>) {
    let r = rt_memory_cache();
    let s = r.default_stream(0).unwrap();
    let name = std::env::var("TPURT_PROBE_OP").unwrap_or_else(|_| "exp".into());
    let (dims, dims2): (&[u64], &[u64]) = if name.contains("attention") {
        (&[8, 8, 256, 64], &[8, 8, 256, 64])
    } else if name == "mm" {
        (&[1024, 256], &[256, 688])
    } else {
        (&[8, 128, 688], &[8, 128, 688])
    };
    let mut x = upload(&r, &s, dims, 1);
    let mut y = upload(&r, &s, dims2, 2);
    // TPURT_PROBE_MM=m,k,n[,t]: the product's shape; t: lhs is a
    // transposed view of a [k, m] tensor (as a weight gradient reads it).
    if let Ok(spec) = std::env::var("TPURT_PROBE_MM") {
        let f: Vec<&str> = spec.split(',').collect();
        let (m, k, n): (u64, u64, u64) = (
            f[0].parse().unwrap(),
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
        );
        if f.get(3) == Some(&"t") {
            let t = upload(&r, &s, &[k, m], 1);
            x = DeviceTensor::new(t.buffer, DType::F32, 0, &[m, k], Some(&[1, m])).unwrap();
        } else {
            x = upload(&r, &s, &[m, k], 1);
        }
        y = upload(&r, &s, &[k, n], 2);
    }
    let reps: usize = std::env::var("TPURT_PROBE_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let binary = ["add", "sub", "mul", "div", "maximum", "pow", "mm"].contains(&name.as_str());
    let ins: Vec<&DeviceTensor> = if name.contains("attention") {
        vec![&x, &y, &x]
    } else if binary {
        vec![&x, &y]
    } else {
        vec![&x]
    };
    let mut ts = vec![];
    for _ in 0..reps {
        let t = Instant::now();
        let out = call(&r, &s, &name, &ins, Attrs::new());
        s.synchronize().unwrap();
        ts.push(t.elapsed().as_secs_f64() * 1e6);
        drop(out);
    }
    let min = ts.iter().cloned().fold(f64::INFINITY, f64::min);
    eprintln!("{name}: min {min:.1} us, median {:.1} us", median(ts));
}

const ALL: &[(&str, Bench)] = &[
    ("pool_alloc_free", pool_alloc_free),
    ("stream_empty_task", stream_empty_task),
    ("event_roundtrip", event_roundtrip),
    ("defer_vs_strict", defer_vs_strict),
    ("fused_bandwidth", fused_bandwidth),
    ("matmul", matmul),
    ("cold_vs_warm", cold_vs_warm),
    ("tiny_add", tiny_add),
    ("deferred_tiny_step", deferred_tiny_step),
    #[cfg(feature = "xla")]
    ("host_vs_xla", host_vs_xla),
    #[cfg(feature = "xla")]
    ("xla_cold_vs_warm", xla_cold_vs_warm),
    #[cfg(feature = "xla")]
    ("xla_tiny_add", xla_tiny_add),
];

/// Profiling aids: run only when named (they print no JSON).
const AIDS: &[(&str, Bench)] = &[
    ("mm_probe", mm_probe),
    ("defer_only", defer_only),
    ("rows_probe", rows_probe),
    ("op_probe", op_probe),
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        for (name, _) in ALL {
            println!("{name}");
        }
        return;
    }
    for a in &args {
        if !ALL.iter().chain(AIDS).any(|(n, _)| n == a) {
            let names: Vec<_> = ALL.iter().map(|(n, _)| *n).collect();
            eprintln!("unknown benchmark {a:?}; known: {}", names.join(", "));
            std::process::exit(2);
        }
    }
    for (name, bench) in AIDS {
        if args.iter().any(|a| a == name) {
            bench(&mut Vec::new());
        }
    }
    for (name, bench) in ALL {
        if args.is_empty() || args.iter().any(|a| a == name) {
            let mut rows = Vec::new();
            bench(&mut rows);
            for r in &rows {
                r.print();
            }
        }
    }
}
