//! Kiln's error type.

use crate::shape::Aval;
use crate::DType;
use std::panic::Location;
use thiserror::Error;

/// The Rust call site an error names: the user's line that called the op
/// (`Array` methods are `#[track_caller]`).
pub type CallSite = &'static Location<'static>;

/// `", at file:line:column"` for a known call site, else nothing.
fn call_site_suffix(at: &Option<CallSite>) -> String {
    at.map_or(String::new(), |site| format!(", at {site}"))
}

/// Everything that can go wrong in Kiln, with the context needed to find it.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum Error {
    /// An op was given operands whose shapes do not fit its shape rule.
    #[error("shape error in `{op}`: {detail} (operands: {operands}){}", call_site_suffix(.at))]
    Shape {
        /// The op's name.
        op: String,
        /// What is wrong.
        detail: String,
        /// The operand avals, rendered like `f32[4,4], f32[3]`.
        operands: String,
        /// The user's Rust line that called the op, when an `Array` method
        /// made the error.
        at: Option<CallSite>,
    },
    /// An op was given an operand of a dtype it does not accept.
    #[error("dtype error in `{op}`: {detail} (operands: {operands}){}", call_site_suffix(.at))]
    DType {
        /// The op's name.
        op: String,
        /// What is wrong.
        detail: String,
        /// The operand avals.
        operands: String,
        /// The user's Rust line that called the op, when an `Array` method
        /// made the error.
        at: Option<CallSite>,
    },
    /// An argument of an op (axis, permutation, index, ...) is invalid.
    #[error("invalid argument to `{op}`: {detail}{}", call_site_suffix(.at))]
    InvalidArgument {
        /// The op's name.
        op: String,
        /// What is wrong.
        detail: String,
        /// The user's Rust line that called the op, when an `Array` method
        /// made the error.
        at: Option<CallSite>,
    },
    /// Creating an array from data whose length does not fit the shape.
    #[error("cannot make an array of shape {shape:?} from {len} elements")]
    DataLength {
        /// The requested shape.
        shape: Vec<usize>,
        /// The number of elements given.
        len: usize,
    },
    /// Reading an array back as the wrong element type or shape.
    #[error("cannot read {aval} as {requested}")]
    ReadBack {
        /// The array's aval.
        aval: String,
        /// What was asked for.
        requested: String,
    },
    /// A tree could not be flattened or rebuilt.
    #[error("tree error at `{path}`: {detail}")]
    Tree {
        /// The path of the offending node, like `p.layers[2].w`.
        path: String,
        /// What is wrong.
        detail: String,
    },
    /// A traced value was read as data inside `compile`.
    #[error(
        "cannot read a traced value inside `compile` ({aval}); return it from the function instead"
    )]
    ReadTracer {
        /// The traced value's aval.
        aval: String,
    },
    /// A shapeless executable was called with shapes that break a condition
    /// its trace relied on.
    #[error("shapeless call does not satisfy `{condition}` (recorded by `{op}`): {detail}")]
    ShapeGuard {
        /// The condition, like `s1 == 4`.
        condition: String,
        /// The op that recorded it.
        op: String,
        /// The sizes of this call.
        detail: String,
    },
    /// A runtime failure while executing an op (index out of range, ...).
    #[error("runtime error in `{op}`: {detail}")]
    Runtime {
        /// The op's name.
        op: String,
        /// What is wrong.
        detail: String,
    },
    /// A buffer plan broke an invariant (a bug in the planner, caught by
    /// the verifier or by an executor replaying the plan).
    #[error("invalid buffer plan: {detail}")]
    InvalidPlan {
        /// What the verifier or executor found.
        detail: String,
    },
    /// A size does not fit the address space: the element count of a
    /// shape (with zero dims counted as 1) times its element size
    /// overflows.
    #[error("`{op}`: {aval} is too large: its size overflows the address space")]
    SizeOverflow {
        /// The op or constructor that made the shape.
        op: String,
        /// The aval, like `f32[18446744073709551615,2]`.
        aval: String,
    },
    /// An array or a call needs more bytes than [`crate::Limits`] allow.
    #[error(
        "`{op}`: {what} needs {bytes} bytes, above the limit of {limit} bytes per {scope}; \
         raise `Limits::{field}` with `kiln::Limits::set`"
    )]
    LimitExceeded {
        /// The op, constructor or `call`.
        op: String,
        /// What was too large, like `f32[65536,65536]`.
        what: String,
        /// The bytes it needs.
        bytes: usize,
        /// The limit in force.
        limit: usize,
        /// `array` or `call`.
        scope: &'static str,
        /// The [`crate::Limits`] field to raise.
        field: &'static str,
    },
    /// The system could not allocate a host buffer.
    #[error("`{op}`: cannot allocate {bytes} bytes")]
    Allocation {
        /// The op or constructor that asked.
        op: String,
        /// The bytes asked for.
        bytes: usize,
    },
    /// A user kernel is malformed or was misused: its description, its
    /// WGSL (with naga's diagnostic), or a call that breaks what it said.
    #[error("kernel `{kernel}`: {detail}")]
    Kernel {
        /// The kernel's name.
        kernel: String,
        /// What is wrong.
        detail: String,
    },
    /// A weight file could not be read or written, or does not match the
    /// tree it is loaded into (see [`crate::io`]): `tensor` is the tensor's
    /// name in the file (like `layers.0.w`), empty when the problem is the
    /// file as a whole (a truncated or corrupt header, an I/O failure).
    #[error(
        "weights: {}{detail}",
        if tensor.is_empty() { String::new() } else { format!("tensor `{tensor}`: ") }
    )]
    Weights {
        /// The tensor's name in the file; empty for the whole file.
        tensor: String,
        /// What is wrong: which of name, shape or dtype differs, with both
        /// sides.
        detail: String,
    },
    /// A backend failed.
    #[error("backend `{backend}`: {detail}")]
    Backend {
        /// The backend's name.
        backend: String,
        /// What is wrong.
        detail: String,
    },
}

impl Error {
    /// The Rust call site the error names, if it names one.
    pub fn call_site(&self) -> Option<CallSite> {
        match self {
            Error::Shape { at, .. }
            | Error::DType { at, .. }
            | Error::InvalidArgument { at, .. } => *at,
            _ => None,
        }
    }

    /// This error without its Rust call site: for a front end whose users
    /// do not write Rust (the playground's scripts name their own line),
    /// where the line of Kiln's binding would only be noise.
    pub fn without_call_site(mut self) -> Error {
        if let Error::Shape { at, .. }
        | Error::DType { at, .. }
        | Error::InvalidArgument { at, .. } = &mut self
        {
            *at = None;
        }
        self
    }

    /// This error naming `site`, unless it names one already (the first
    /// call site, where the mistake was made, is the one kept) or is of a
    /// kind that names none.
    pub(crate) fn called_at(mut self, site: CallSite) -> Error {
        if let Error::Shape { at, .. }
        | Error::DType { at, .. }
        | Error::InvalidArgument { at, .. } = &mut self
        {
            at.get_or_insert(site);
        }
        self
    }
}

/// Kiln's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Renders operand avals for error messages: `f32[4,4], f32[3]`.
pub(crate) fn render_avals(avals: &[&Aval]) -> String {
    avals
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A shape error for `op` over `avals`.
pub(crate) fn shape_err(op: &str, avals: &[&Aval], detail: impl Into<String>) -> Error {
    Error::Shape {
        op: op.to_string(),
        detail: detail.into(),
        operands: render_avals(avals),
        at: None,
    }
}

/// A dtype error for `op` over `avals`.
pub(crate) fn dtype_err(op: &str, avals: &[&Aval], detail: impl Into<String>) -> Error {
    Error::DType {
        op: op.to_string(),
        detail: detail.into(),
        operands: render_avals(avals),
        at: None,
    }
}

/// An invalid-argument error for `op`.
pub(crate) fn arg_err(op: &str, detail: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op: op.to_string(),
        detail: detail.into(),
        at: None,
    }
}

/// Requires `dtype` to be a float for `op`.
pub(crate) fn require_float(op: &str, aval: &Aval) -> Result<()> {
    if aval.dtype.is_float() {
        Ok(())
    } else {
        Err(dtype_err(
            op,
            &[aval],
            format!("expects a floating dtype, got {}", aval.dtype),
        ))
    }
}

/// Requires two dtypes to match for `op`.
pub(crate) fn require_same_dtype(op: &str, a: &Aval, b: &Aval) -> Result<DType> {
    if a.dtype == b.dtype {
        Ok(a.dtype)
    } else {
        Err(dtype_err(
            op,
            &[a, b],
            format!("operand dtypes differ: {} vs {}", a.dtype, b.dtype),
        ))
    }
}
