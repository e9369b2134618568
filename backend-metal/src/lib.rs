//! Kiln's native Metal backend.
#![warn(missing_docs)]

pub mod msl;
