//! Shared helpers for the kernel tests; each kernel file has its own tests.
