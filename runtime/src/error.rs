//! The runtime's one error type. Each variant maps to a stable numeric code
//! that the C ABI passes through unchanged (`tpurt_status_code`).

use std::fmt;

/// Stable error codes, shared with the C ABI (`TPURT_CODE_*`). Never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ErrorCode {
    /// An argument was wrong: a bad size, a mismatched shape, a null pointer.
    InvalidArgument = 1,
    /// A named thing (device, op, stream) does not exist.
    NotFound = 2,
    /// A pool could not satisfy an allocation even after releasing its cache.
    OutOfMemory = 3,
    /// A handle was null, stale, freed already or of the wrong kind.
    InvalidHandle = 4,
    /// A task failed earlier on this stream; the stream must be reset.
    StreamPoisoned = 5,
    /// The operation is valid in general but not in the current state.
    FailedPrecondition = 6,
    /// Not implemented on this platform or build.
    Unimplemented = 7,
    /// A platform (device, plugin) is missing or failed.
    Unavailable = 8,
    /// A bug in tpurt: please report it.
    Internal = 9,
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            ErrorCode::InvalidArgument => "INVALID_ARGUMENT",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::OutOfMemory => "OUT_OF_MEMORY",
            ErrorCode::InvalidHandle => "INVALID_HANDLE",
            ErrorCode::StreamPoisoned => "STREAM_POISONED",
            ErrorCode::FailedPrecondition => "FAILED_PRECONDITION",
            ErrorCode::Unimplemented => "UNIMPLEMENTED",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::Internal => "INTERNAL",
        };
        f.write_str(name)
    }
}

#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum Error {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    #[error("invalid handle: {0}")]
    InvalidHandle(String),
    #[error("stream {stream} is poisoned: task '{task}' failed: {message} (reset the stream to use it again)")]
    StreamPoisoned {
        stream: u64,
        task: String,
        message: String,
    },
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    #[error("unimplemented: {0}")]
    Unimplemented(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Error::NotFound(_) => ErrorCode::NotFound,
            Error::OutOfMemory(_) => ErrorCode::OutOfMemory,
            Error::InvalidHandle(_) => ErrorCode::InvalidHandle,
            Error::StreamPoisoned { .. } => ErrorCode::StreamPoisoned,
            Error::FailedPrecondition(_) => ErrorCode::FailedPrecondition,
            Error::Unimplemented(_) => ErrorCode::Unimplemented,
            Error::Unavailable(_) => ErrorCode::Unavailable,
            Error::Internal(_) => ErrorCode::Internal,
        }
    }

    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
