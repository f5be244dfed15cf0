//! Side-by-side benchmarks. `bench/run [NAME...]` prints one JSON object
//! per line: name, ours, peer, peer_name, unit and ratio (peer over ours;
//! above 1 means tpurt is faster). Both sides run in the same process,
//! interleaved, and each figure is the median over repetitions.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::mpsc;
use std::time::Instant;

use tpurt_runtime::{CoreKind, Runtime, RuntimeOptions};

struct Row {
    name: String,
    ours: f64,
    peer: f64,
    peer_name: &'static str,
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
            peer_name: "system allocator (glibc malloc+free)",
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
        peer_name: "std mpsc channel to a worker thread",
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
        peer_name: "two worker threads chained by std mpsc channels",
        unit: "us/roundtrip",
    });
}

type Bench = fn(&mut Vec<Row>);

const ALL: &[(&str, Bench)] = &[
    ("pool_alloc_free", pool_alloc_free),
    ("stream_empty_task", stream_empty_task),
    ("event_roundtrip", event_roundtrip),
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
        if !ALL.iter().any(|(n, _)| n == a) {
            let names: Vec<_> = ALL.iter().map(|(n, _)| *n).collect();
            eprintln!("unknown benchmark {a:?}; known: {}", names.join(", "));
            std::process::exit(2);
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
