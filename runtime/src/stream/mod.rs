//! Streams and events.
//!
//! Promises:
//! - Work submitted to one stream runs in order; across streams only
//!   through events, `wait_event` and `wait_stream`.
//! - Events are real: `query`, `synchronize`, cross-stream waits and
//!   `elapsed_time` (when created with timing).
//! - A failed task poisons its stream. The error names the task and comes
//!   back from the next submit, query or synchronize on that stream and from
//!   every event recorded after it; `reset` drains the stream and clears it.
//!   Streams that waited on failed work fail too, so nothing hangs.

pub mod clock;
mod event;
pub(crate) mod executor;
#[allow(clippy::module_inception)]
mod stream;

#[cfg(test)]
mod tests;

pub use clock::{Failure, Fence, StreamClock, StreamId};
pub use event::Event;
pub(crate) use executor::Executor;
pub use executor::TaskFn;
pub use stream::Stream;
