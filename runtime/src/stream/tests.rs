//! Stream and event semantics, on the executors of a real host runtime.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::platform::CoreKind;
use crate::runtime::{Runtime, RuntimeOptions};

fn runtime(chips: u32) -> Runtime {
    Runtime::new(&RuntimeOptions {
        platform: Some("host".into()),
        host_chips: Some(chips),
        host_topology: None,
        host_hbm_bytes: Some(64 << 20),
        cache: Some(crate::compile::CacheConfig::memory_only(64)),
    })
    .unwrap()
}

/// Run `f` on a thread and fail the test if it takes longer than `limit`
/// (a hang shows up as a failure, not a stuck suite).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .expect("did not finish in time: a hang")
}

#[test]
fn tasks_on_one_stream_run_in_order() {
    let rt = runtime(1);
    let s = rt.create_stream(0, CoreKind::TensorCore, 0).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    for i in 0..500 {
        let log = Arc::clone(&log);
        s.submit("push", move || {
            log.lock().unwrap().push(i);
            Ok(())
        })
        .unwrap();
    }
    s.synchronize().unwrap();
    assert_eq!(*log.lock().unwrap(), (0..500).collect::<Vec<_>>());
    assert!(s.query().unwrap());
}

#[test]
fn wait_event_orders_work_across_streams_and_cores() {
    let rt = runtime(2);
    let a = rt.create_stream(0, CoreKind::TensorCore, 0).unwrap();
    let b = rt.create_stream(1, CoreKind::SparseCore, 0).unwrap();
    let flag = Arc::new(AtomicBool::new(false));
    let f = Arc::clone(&flag);
    a.submit("slow producer", move || {
        std::thread::sleep(Duration::from_millis(30));
        f.store(true, Ordering::SeqCst);
        Ok(())
    })
    .unwrap();
    let e = rt.create_event(false);
    e.record(&a).unwrap();
    assert_eq!(e.query(), Ok(false));
    b.wait_event(&e).unwrap();
    let seen = Arc::new(AtomicBool::new(false));
    let (f, s2) = (Arc::clone(&flag), Arc::clone(&seen));
    b.submit("consumer", move || {
        s2.store(f.load(Ordering::SeqCst), Ordering::SeqCst);
        Ok(())
    })
    .unwrap();
    b.synchronize().unwrap();
    assert!(
        seen.load(Ordering::SeqCst),
        "the consumer ran before the producer"
    );
    assert_eq!(e.query(), Ok(true));
}

#[test]
fn a_waiting_stream_does_not_block_other_streams_of_its_core() {
    let rt = runtime(1);
    let producer = rt.create_stream(0, CoreKind::SparseCore, 0).unwrap();
    let waiter = rt.create_stream(0, CoreKind::TensorCore, 0).unwrap();
    let other = rt.create_stream(0, CoreKind::TensorCore, 0).unwrap();
    let (tx, rx) = mpsc::channel::<()>();
    let rx = Mutex::new(rx);
    producer
        .submit("gate", move || {
            rx.lock().unwrap().recv_timeout(Duration::from_secs(5)).ok();
            Ok(())
        })
        .unwrap();
    waiter.wait_stream(&producer).unwrap();
    // `other` shares the TensorCore executor with `waiter`, which is stuck.
    other.submit("independent", || Ok(())).unwrap();
    within(Duration::from_secs(2), move || other.synchronize()).unwrap();
    tx.send(()).unwrap();
    within(Duration::from_secs(5), move || waiter.synchronize()).unwrap();
}

#[test]
fn unrecorded_events_are_complete_and_timing_needs_a_flag() {
    let rt = runtime(1);
    let s = rt.default_stream(0).unwrap();
    let e = rt.create_event(false);
    assert_eq!(e.query(), Ok(true));
    e.synchronize().unwrap();
    s.wait_event(&e).unwrap();
    e.record(&s).unwrap();
    e.synchronize().unwrap();
    let err = e.elapsed_time(&e).unwrap_err();
    assert!(err.to_string().contains("without timing"), "{err}");
    let t = rt.create_event(true);
    assert!(t
        .elapsed_time(&t)
        .unwrap_err()
        .to_string()
        .contains("not been recorded"));
}

#[test]
fn elapsed_time_measures_the_work_between_events() {
    let rt = runtime(1);
    let s = rt.create_stream(0, CoreKind::TensorCore, 0).unwrap();
    let (start, end) = (rt.create_event(true), rt.create_event(true));
    start.record(&s).unwrap();
    s.submit("sleep", || {
        std::thread::sleep(Duration::from_millis(20));
        Ok(())
    })
    .unwrap();
    end.record(&s).unwrap();
    end.synchronize().unwrap();
    let ms = start.elapsed_time(&end).unwrap();
    assert!(ms >= 19.0, "elapsed {ms} ms for a 20 ms task");
    assert!(end.elapsed_time(&start).unwrap() <= -19.0);
}

#[test]
fn a_failed_task_poisons_its_stream_until_reset() {
    let rt = runtime(1);
    let s = rt.create_stream(0, CoreKind::TensorCore, 0).unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    s.submit("ok before", || Ok(())).unwrap();
    s.submit("bad_kernel", || Err(Error::invalid("index 7 out of range")))
        .unwrap();
    let r = Arc::clone(&ran);
    // Submitted before the failure is seen: accepted, then skipped.
    let _ = s.submit("after", move || {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    let e = rt.create_event(false);
    e.record(&s).unwrap();
    let err = s.synchronize().unwrap_err();
    assert_eq!(err.code(), crate::ErrorCode::StreamPoisoned);
    let text = err.to_string();
    assert!(
        text.contains("bad_kernel") && text.contains("index 7 out of range"),
        "{text}"
    );
    assert!(
        e.synchronize().is_err(),
        "an event after the failure reports it"
    );
    assert!(s.query().is_err());
    assert!(
        s.submit("refused", || Ok(())).is_err(),
        "a poisoned stream refuses work"
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "work after a failure is skipped"
    );
    let cleared = s.reset().expect("reset returns the error it cleared");
    assert!(cleared.to_string().contains("bad_kernel"));
    let r = Arc::clone(&ran);
    s.submit("after reset", move || {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
    .unwrap();
    s.synchronize().unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[test]
fn a_panicking_task_is_an_error_not_a_crash() {
    let rt = runtime(1);
    let s = rt.create_stream(0, CoreKind::TensorCore, 0).unwrap();
    s.submit("explodes", || panic!("kernel bug")).unwrap();
    let err = s.synchronize().unwrap_err().to_string();
    assert!(
        err.contains("explodes") && err.contains("kernel bug"),
        "{err}"
    );
    s.reset();
    s.submit("fine", || Ok(())).unwrap();
    s.synchronize().unwrap();
}

#[test]
fn waiting_on_failed_work_fails_instead_of_hanging() {
    let rt = runtime(1);
    let a = rt.create_stream(0, CoreKind::TensorCore, 0).unwrap();
    let b = rt.create_stream(0, CoreKind::SparseCore, 0).unwrap();
    a.submit("producer", || Err(Error::Internal("device fault".into())))
        .unwrap();
    b.wait_stream(&a).unwrap();
    b.submit("consumer", || Ok(())).unwrap();
    let err = within(Duration::from_secs(5), move || b.synchronize())
        .unwrap_err()
        .to_string();
    assert!(err.contains("device fault"), "{err}");
}

#[test]
fn higher_priority_streams_run_first() {
    let rt = runtime(1);
    let gate = rt.create_stream(0, CoreKind::TensorCore, -2).unwrap();
    let low = rt.create_stream(0, CoreKind::TensorCore, 0).unwrap();
    let high = rt.create_stream(0, CoreKind::TensorCore, -1).unwrap();
    let (tx, rx) = mpsc::channel::<()>();
    let rx = Mutex::new(rx);
    gate.submit("gate", move || {
        rx.lock().unwrap().recv_timeout(Duration::from_secs(5)).ok();
        Ok(())
    })
    .unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    for i in 0..5 {
        let l = Arc::clone(&log);
        low.submit("low", move || {
            l.lock().unwrap().push(("low", i));
            Ok(())
        })
        .unwrap();
        let l = Arc::clone(&log);
        high.submit("high", move || {
            l.lock().unwrap().push(("high", i));
            Ok(())
        })
        .unwrap();
    }
    tx.send(()).unwrap();
    rt.synchronize_device(0).unwrap();
    let log = log.lock().unwrap();
    let kinds: Vec<_> = log.iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, [["high"; 5], ["low"; 5]].concat(), "{log:?}");
}

#[test]
fn dropping_the_runtime_finishes_queued_work_without_hanging() {
    let done = Arc::new(AtomicUsize::new(0));
    let d = Arc::clone(&done);
    within(Duration::from_secs(10), move || {
        let rt = runtime(2);
        let s = rt.create_stream(1, CoreKind::SparseCore, 0).unwrap();
        let buf = rt.allocate(1, 4096, &s).unwrap();
        for _ in 0..50 {
            let d = Arc::clone(&d);
            let b = buf.clone();
            s.submit("work", move || {
                std::thread::sleep(Duration::from_micros(200));
                b.segment().fill(b.segment_offset(), 8, 1)?;
                d.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
        }
        drop(buf);
        drop(rt);
        // The stream outlived its runtime: it refuses new work.
        assert!(s.submit("late", || Ok(())).is_err());
    });
    assert_eq!(done.load(Ordering::SeqCst), 50);
}

#[test]
fn stress_many_threads_streams_and_events() {
    within(Duration::from_secs(60), || {
        let rt = Arc::new(runtime(4));
        let total = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..6)
            .map(|t| {
                let rt = Arc::clone(&rt);
                let total = Arc::clone(&total);
                std::thread::spawn(move || {
                    let chip = t % 4;
                    let core = if t % 2 == 0 {
                        CoreKind::TensorCore
                    } else {
                        CoreKind::SparseCore
                    };
                    let mine = rt.create_stream(chip, core, (t % 3) as i32 - 1).unwrap();
                    let peer = rt
                        .create_stream((chip + 1) % 4, CoreKind::TensorCore, 0)
                        .unwrap();
                    let counter = Arc::new(AtomicUsize::new(0));
                    let start = Instant::now();
                    let mut n = 0;
                    while n < 300 && start.elapsed() < Duration::from_secs(20) {
                        let c = Arc::clone(&counter);
                        mine.submit("inc", move || {
                            c.fetch_add(1, Ordering::SeqCst);
                            Ok(())
                        })
                        .unwrap();
                        let e = Event::new(n % 7 == 0);
                        e.record(&mine).unwrap();
                        peer.wait_event(&e).unwrap();
                        let (c, expect) = (Arc::clone(&counter), n + 1);
                        peer.submit("check", move || {
                            if c.load(Ordering::SeqCst) < expect {
                                return Err(Error::Internal("peer ran before the event".into()));
                            }
                            Ok(())
                        })
                        .unwrap();
                        if n % 50 == 0 {
                            mine.wait_stream(&peer).unwrap();
                            let buf = rt.allocate(chip, 1 << 16, &mine).unwrap();
                            buf.record_stream(&peer);
                        }
                        n += 1;
                    }
                    peer.synchronize().unwrap();
                    mine.synchronize().unwrap();
                    assert_eq!(counter.load(Ordering::SeqCst), n);
                    total.fetch_add(n, Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        rt.synchronize().unwrap();
        for chip in 0..4 {
            rt.pool(chip).unwrap().check_invariants().unwrap();
        }
        assert!(total.load(Ordering::SeqCst) > 0);
    });
}

use super::Event;
