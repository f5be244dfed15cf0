//! Eager execution modes, as TorchTPU names them, and the op dispatcher.
//!
//! - `DeferNever` (strict, the default): each op's executable comes from
//!   the compile cache and is launched on the stream asynchronously.
//! - `DeferNeverAndLaunchBlocking` (debug): as strict, but the call waits
//!   for the op, then checks float outputs for NaN and Inf made from
//!   finite inputs (non-finite inputs, such as an attention mask's -inf,
//!   excuse what follows from them); errors name the op and the first
//!   offending position. (Index bounds are checked by the
//!   kernels in every mode.)
//! - `DeferAndFuse`: ops are recorded per stream and launched as one
//!   program at a flush (see `lazy/mod.rs` for the rules and the triggers).
//!
//! The mode is process-wide, with a per-thread override stack (push/pop).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum EagerMode {
    DeferNever = 0,
    DeferNeverAndLaunchBlocking = 1,
    DeferAndFuse = 2,
}

impl EagerMode {
    pub fn from_code(code: u32) -> Result<Self> {
        match code {
            0 => Ok(EagerMode::DeferNever),
            1 => Ok(EagerMode::DeferNeverAndLaunchBlocking),
            2 => Ok(EagerMode::DeferAndFuse),
            other => Err(Error::invalid(format!(
                "eager mode {other}; use 0 (DEFER_NEVER), 1 (DEFER_NEVER_AND_LAUNCH_BLOCKING) or 2 (DEFER_AND_FUSE)"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            EagerMode::DeferNever => "DEFER_NEVER",
            EagerMode::DeferNeverAndLaunchBlocking => "DEFER_NEVER_AND_LAUNCH_BLOCKING",
            EagerMode::DeferAndFuse => "DEFER_AND_FUSE",
        }
    }

    fn check_available(self) -> Result<()> {
        Ok(())
    }
}

static GLOBAL_MODE: AtomicU8 = AtomicU8::new(EagerMode::DeferNever as u8);

thread_local! {
    static THREAD_MODES: RefCell<Vec<EagerMode>> = const { RefCell::new(Vec::new()) };
}

/// The mode in force on this thread: its innermost pushed mode, else the
/// process-wide one.
pub fn current_mode() -> EagerMode {
    THREAD_MODES
        .with(|m| m.borrow().last().copied())
        .unwrap_or_else(|| {
            EagerMode::from_code(GLOBAL_MODE.load(Ordering::SeqCst) as u32)
                .unwrap_or(EagerMode::DeferNever)
        })
}

pub fn set_global_mode(mode: EagerMode) -> Result<()> {
    mode.check_available()?;
    GLOBAL_MODE.store(mode as u8, Ordering::SeqCst);
    Ok(())
}

/// Push a mode for this thread (a context manager's enter).
pub fn push_mode(mode: EagerMode) -> Result<()> {
    mode.check_available()?;
    THREAD_MODES.with(|m| m.borrow_mut().push(mode));
    Ok(())
}

/// Pop this thread's innermost pushed mode (a context manager's exit).
pub fn pop_mode() -> Result<EagerMode> {
    THREAD_MODES
        .with(|m| m.borrow_mut().pop())
        .ok_or_else(|| Error::FailedPrecondition("pop_mode without a matching push_mode".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_modes_stack_over_the_global_mode() {
        std::thread::spawn(|| {
            assert_eq!(current_mode(), EagerMode::DeferNever);
            push_mode(EagerMode::DeferNeverAndLaunchBlocking).unwrap();
            assert_eq!(current_mode(), EagerMode::DeferNeverAndLaunchBlocking);
            assert_eq!(pop_mode().unwrap(), EagerMode::DeferNeverAndLaunchBlocking);
            assert!(pop_mode().is_err());
            assert_eq!(current_mode(), EagerMode::DeferNever);
            push_mode(EagerMode::DeferAndFuse).unwrap();
            assert_eq!(current_mode(), EagerMode::DeferAndFuse);
            pop_mode().unwrap();
            assert!(EagerMode::from_code(7).is_err());
        })
        .join()
        .unwrap();
    }
}
