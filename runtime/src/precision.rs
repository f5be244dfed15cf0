//! The precision of f32 products (matmul, linear, attention's products,
//! convolution), as `torch.tpu.precision` and XLA's precision config name
//! it (see [`Precision`]). Process-wide, with a per-thread override stack
//! (push/pop), as the eager mode is. Read when an op's graph is built, so a
//! recorded op keeps the precision it was called under; HIGHEST, torch's
//! default, unless set.
//!
//! On `xla` the products carry it to XLA (a TPU or GPU runs it in
//! hardware; the XLA CPU plugin computes f32 in full whatever it says). On
//! `host` it is emulated: the operands are rounded as a TPU's matrix unit
//! rounds them (`ops::expand_precision`), so a model sees on the emulated
//! chip the numbers it would see on a TPU.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::{Error, Result};
pub use crate::ir::Precision;

static GLOBAL: AtomicU8 = AtomicU8::new(Precision::Highest as u8);

thread_local! {
    static THREAD: RefCell<Vec<Precision>> = const { RefCell::new(Vec::new()) };
}

/// The precision of a C ABI or binding code, or an error naming it.
pub fn from_code(code: u32) -> Result<Precision> {
    Precision::from_code(code).ok_or_else(|| {
        Error::invalid(format!(
            "matmul precision {code}; use 0 (DEFAULT), 1 (HIGH) or 2 (HIGHEST)"
        ))
    })
}

/// The precision in force on this thread: its innermost pushed one, else
/// the process-wide one.
pub fn current() -> Precision {
    THREAD
        .with(|s| s.borrow().last().copied())
        .unwrap_or_else(|| {
            Precision::from_code(GLOBAL.load(Ordering::SeqCst) as u32).unwrap_or(Precision::Highest)
        })
}

pub fn set_global(p: Precision) {
    GLOBAL.store(p as u8, Ordering::SeqCst);
}

/// Push a precision for this thread (a context manager's enter).
pub fn push(p: Precision) {
    THREAD.with(|s| s.borrow_mut().push(p));
}

/// Pop this thread's innermost pushed precision (a context manager's exit).
pub fn pop() -> Result<Precision> {
    THREAD.with(|s| s.borrow_mut().pop()).ok_or_else(|| {
        Error::FailedPrecondition("matmul precision pop without a matching push".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_precisions_stack_over_the_global_one() {
        std::thread::spawn(|| {
            assert_eq!(current(), Precision::Highest);
            push(Precision::Default);
            assert_eq!(current(), Precision::Default);
            push(Precision::High);
            assert_eq!(current(), Precision::High);
            assert_eq!(pop().unwrap(), Precision::High);
            assert_eq!(pop().unwrap(), Precision::Default);
            assert!(pop()
                .unwrap_err()
                .to_string()
                .contains("without a matching push"));
            assert!(from_code(3)
                .unwrap_err()
                .to_string()
                .contains("matmul precision 3"));
            assert_eq!(from_code(1).unwrap(), Precision::High);
        })
        .join()
        .unwrap();
    }
}
