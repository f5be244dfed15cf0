//! Streams and events.

pub mod clock;

pub use clock::{Fence, StreamClock, StreamId};
