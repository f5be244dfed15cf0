//! Op calls through the C ABI: op names (known and random), arities,
//! shapes, strides, offsets, dtypes and attributes against real buffers
//! (and stale handles), in every eager mode, chained. Each call either
//! runs or returns an error; a failed stream is reset. A crash, an abort,
//! a hang or an out-of-bounds access is a finding.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tpurt_fuzz::{decode, Runner};

static RUNNER: OnceLock<Runner> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let runner = RUNNER.get_or_init(Runner::new);
    let (mode, calls) = decode(data);
    runner.run(mode, &calls);
});
