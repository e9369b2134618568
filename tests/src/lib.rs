//! Integration tests live in `tests/tests/`; this library holds shared helpers.

pub mod bench;
