//! tpurt-runtime: the core of tpurt. A [`Runtime`] owns a platform (the
//! emulated TPU `host`, or a PJRT plugin later), one HBM pool per chip, and
//! the streams and events that order work on each chip.

pub mod error;
pub mod memory;
pub mod platform;
pub mod stream;

pub use error::{Error, ErrorCode, Result};
