//! tpurt-runtime: the core of tpurt. A [`Runtime`] owns a platform (the
//! emulated TPU `host`, or a PJRT plugin later), one HBM pool per chip, and
//! the streams and events that order work on each chip.

pub mod buffer;
pub mod compile;
pub mod copy;
pub mod eager;
pub mod error;
pub mod fusion;
pub mod fxhash;
pub mod ir;
mod lazy;
pub mod memory;
pub mod ops;
pub mod platform;
pub mod precision;
pub mod profile;
pub mod runtime;
pub mod stream;
pub mod tensor;

pub use buffer::Buffer;
pub use copy::Layout;
pub use error::{Error, ErrorCode, Result};
pub use platform::{CoreKind, DeviceInfo, Platform};
pub use runtime::{HostDestination, HostReadback, HostSource, Runtime, RuntimeOptions};
pub use stream::{Event, Fence, Stream, StreamId};
pub use tensor::DeviceTensor;
