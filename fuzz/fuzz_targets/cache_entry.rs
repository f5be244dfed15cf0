//! The persistent compile cache's entries: the fuzz input is written over
//! a real entry of a real program, and a fresh runtime runs the program
//! again. Whatever the bytes (torn, truncated, foreign, mutated), the
//! entry is either loaded or detected and rebuilt, and the results are the
//! program's. The same bytes also go straight to the host platform's
//! executable loader, which must refuse or load them, never crash.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tpurt_runtime::compile::CacheConfig;
use tpurt_runtime::ir::DType;
use tpurt_runtime::ops::{self, Attr, Attrs};
use tpurt_runtime::platform::host::{HostConfig, HostPlatform};
use tpurt_runtime::{DeviceTensor, Layout, Platform, Runtime};

struct Fixture {
    dir: PathBuf,
    entry: PathBuf,
    want: Vec<u8>,
    host: std::sync::Arc<HostPlatform>,
}

fn runtime(dir: &PathBuf) -> Runtime {
    let host = HostPlatform::new(HostConfig::resolve(Some(1), None, Some(16 << 20)).unwrap());
    Runtime::with_platform_and_cache(host, CacheConfig::memory_only(8).with_disk_dir(dir)).unwrap()
}

/// softmax of a fixed [4, 6] input: its bytes.
fn program(r: &Runtime) -> Vec<u8> {
    let s = r.default_stream(0).unwrap();
    let x: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin()).collect();
    let b = r.allocate(0, 96, &s).unwrap();
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    r.copy_host_to_device(&bytes, &b, &Layout::bytes(96), &s)
        .unwrap();
    let t = DeviceTensor::contiguous(b, DType::F32, &[4, 6]).unwrap();
    let op = ops::lookup("softmax").unwrap();
    let out = r
        .call_op_alloc(op, &[t], &Attrs::new().with("dim", Attr::Int(-1)), &s)
        .unwrap();
    let mut y = vec![0u8; 96];
    r.copy_device_to_host(&out[0].buffer, &Layout::bytes(96), &mut y, &s)
        .unwrap();
    y
}

static FIXTURE: OnceLock<Fixture> = OnceLock::new();

fn fixture() -> &'static Fixture {
    FIXTURE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("tpurt-fuzz-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let want = program(&runtime(&dir));
        let entry = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "entry"))
            .expect("the program wrote its entry");
        if let Ok(seed_dir) = std::env::var("TPURT_FUZZ_WRITE_SEED") {
            let _ = std::fs::write(
                PathBuf::from(seed_dir).join("entry"),
                std::fs::read(&entry).unwrap(),
            );
        }
        let host = HostPlatform::new(HostConfig::resolve(Some(1), None, Some(16 << 20)).unwrap());
        Fixture {
            dir,
            entry,
            want,
            host,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let _ = f.host.load_executable(data);
    std::fs::write(&f.entry, data).unwrap();
    let r = runtime(&f.dir);
    assert_eq!(program(&r), f.want, "a damaged entry changed the results");
    let st = r.compile_cache_stats();
    assert_eq!(st.misses + st.disk_hits, 1, "{st:?}");
});
