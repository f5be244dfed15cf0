//! Fault injection (`platform::faults`): the host platform made to fail at
//! segment allocation, compile, launch and copy. Each failure comes back as
//! an error naming what failed; a failed stream is reset and used again;
//! the memory statistics return to their earlier values; nothing leaks
//! (every segment goes back to the platform); and the same work then gives
//! the same results. In every eager mode.

use std::sync::Arc;

use tpurt_runtime::compile::CacheConfig;
use tpurt_runtime::eager::{pop_mode, push_mode, EagerMode};
use tpurt_runtime::ir::DType;
use tpurt_runtime::ops::{self, Attrs};
use tpurt_runtime::platform::faults::{FaultPlatform, FaultPoint, Faults};
use tpurt_runtime::platform::host::{HostConfig, HostPlatform};
use tpurt_runtime::{DeviceTensor, Layout, Runtime, Stream};

const MODES: [EagerMode; 3] = [
    EagerMode::DeferNever,
    EagerMode::DeferNeverAndLaunchBlocking,
    EagerMode::DeferAndFuse,
];

fn runtime() -> (Runtime, Arc<Faults>) {
    let host = HostPlatform::new(HostConfig::resolve(Some(1), None, Some(64 << 20)).unwrap());
    let fp = Arc::new(FaultPlatform::new(host));
    let faults = Arc::clone(fp.faults());
    let rt = Runtime::with_platform_and_cache(fp, CacheConfig::memory_only(64)).unwrap();
    (rt, faults)
}

fn upload(r: &Runtime, s: &Stream, v: &[f32]) -> tpurt_runtime::Result<DeviceTensor> {
    let b = r.allocate(0, (v.len() * 4) as u64, s)?;
    r.copy_host_to_device(bytemuck::cast_slice(v), &b, &Layout::bytes(b.len()), s)?;
    DeviceTensor::contiguous(b, DType::F32, &[v.len() as u64])
}

fn download(r: &Runtime, s: &Stream, t: &DeviceTensor) -> tpurt_runtime::Result<Vec<f32>> {
    let mut out = vec![0u8; t.ty().nbytes() as usize];
    r.copy_device_to_host(&t.buffer, &t.layout, &mut out, s)?;
    Ok(bytemuck::cast_slice(&out).to_vec())
}

/// exp(x) * 2 + x through two ops (fused under defer-and-fuse).
fn work(r: &Runtime, s: &Stream, x: &[f32]) -> tpurt_runtime::Result<Vec<f32>> {
    let t = upload(r, s, x)?;
    let e = r.call_op_alloc(
        ops::lookup("exp")?,
        std::slice::from_ref(&t),
        &Attrs::new(),
        s,
    )?;
    let two = upload(r, s, &vec![2.0; x.len()])?;
    let m = r.call_op_alloc(ops::lookup("mul")?, &[e[0].clone(), two], &Attrs::new(), s)?;
    let y = r.call_op_alloc(ops::lookup("add")?, &[m[0].clone(), t], &Attrs::new(), s)?;
    download(r, s, &y[0])
}

struct Mode;
impl Mode {
    fn push(m: EagerMode) -> Mode {
        push_mode(m).unwrap();
        Mode
    }
}
impl Drop for Mode {
    fn drop(&mut self) {
        let _ = pop_mode();
    }
}

/// What must come back after a fault: no block held, every segment
/// returned once the cache is emptied.
fn assert_clean(r: &Runtime, what: &str) {
    r.synchronize().ok();
    r.empty_cache(0).unwrap();
    let st = r.memory_stats(0).unwrap();
    assert_eq!(st.allocated_bytes.current, 0, "{what}: {st:?}");
    assert_eq!(st.active_bytes.current, 0, "{what}: {st:?}");
    assert_eq!(st.reserved_bytes.current, 0, "{what}: {st:?}");
    assert_eq!(st.num_segments.current, 0, "{what}: {st:?}");
    assert_eq!(
        st.num_segment_allocs, st.num_segment_frees,
        "{what}: every segment back to the platform"
    );
}

#[test]
fn every_fault_is_an_error_naming_its_point_and_leaves_nothing_behind() {
    let x: Vec<f32> = (0..4096).map(|i| (i as f32 * 0.001).sin()).collect();
    let (mut runs, mut survived, mut injected_total) = (0u64, 0u64, 0u64);
    for mode in MODES {
        let _m = Mode::push(mode);
        let want = {
            let (r, _) = runtime();
            let s = r.default_stream(0).unwrap();
            work(&r, &s, &x).unwrap()
        };
        for point in FaultPoint::ALL {
            let mut fired = 0;
            // Fail every call at the point after `skip` (a pool retries an
            // allocation once after releasing its cache; that fails too).
            for skip in [0u64, 1, 2, 3, 5] {
                // A fresh runtime: nothing compiled or cached yet.
                let (r, faults) = runtime();
                let s = r.default_stream(0).unwrap();
                faults.arm(point, skip, u64::MAX);
                let got = work(&r, &s, &x);
                faults.disarm();
                let injected = faults.injected(point);
                runs += 1;
                injected_total += injected;
                match got {
                    Ok(y) => {
                        // Never fired (fewer than `skip` calls reached the
                        // point): the result must be right.
                        assert_eq!(injected, 0, "{mode:?} {point:?} skip {skip}: no error");
                        assert_eq!(y, want);
                    }
                    Err(e) => {
                        fired += 1;
                        survived += 1;
                        let msg = e.to_string();
                        assert!(injected > 0, "{mode:?} {point:?}: {msg}");
                        assert!(
                            msg.contains("injected fault at") && msg.contains(point.name()),
                            "{mode:?} {point:?} skip {skip}: {msg}"
                        );
                        // A failed task poisons its stream: reset, then reuse.
                        s.reset();
                        assert_eq!(
                            work(&r, &s, &x).unwrap(),
                            want,
                            "{mode:?} {point:?} skip {skip}: after reset"
                        );
                    }
                }
                assert_clean(&r, &format!("{mode:?} {point:?} skip {skip}"));
            }
            assert!(fired > 0, "{mode:?}: no fault fired at {point:?}");
        }
    }
    // The figure the README's reliability section quotes.
    println!(
        "fault injection: {runs} runs, {survived} failed with an injected fault \
         ({injected_total} faults in all) and recovered"
    );
}

/// A single failed segment allocation is absorbed: the pool releases its
/// cache and asks again, and the second request succeeds.
#[test]
fn one_failed_segment_allocation_is_retried() {
    let (r, faults) = runtime();
    let s = r.default_stream(0).unwrap();
    faults.arm(FaultPoint::SegmentAllocation, 0, 1);
    let t = upload(&r, &s, &[1.0, 2.0, 3.0]).unwrap();
    assert_eq!(download(&r, &s, &t).unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(faults.injected(FaultPoint::SegmentAllocation), 1);
    assert!(r.memory_stats(0).unwrap().num_alloc_retries >= 1);
    drop(t);
    assert_clean(&r, "after the retried allocation");
}

/// A failed compile is not cached: the next call compiles again and works.
#[test]
fn a_failed_compile_is_not_remembered() {
    let (r, faults) = runtime();
    let s = r.default_stream(0).unwrap();
    let t = upload(&r, &s, &[0.0, 1.0]).unwrap();
    let exp = ops::lookup("exp").unwrap();
    faults.arm(FaultPoint::Compile, 0, 1);
    let e = r
        .call_op_alloc(exp, std::slice::from_ref(&t), &Attrs::new(), &s)
        .err()
        .unwrap();
    assert!(e.to_string().contains("injected fault at compile"), "{e}");
    let y = r.call_op_alloc(exp, &[t], &Attrs::new(), &s).unwrap();
    assert_eq!(
        download(&r, &s, &y[0]).unwrap(),
        vec![1.0, std::f32::consts::E]
    );
    assert_eq!(faults.calls(FaultPoint::Compile), 2);
}
