//! How large an array or a call may be, and the checked size arithmetic
//! that enforces it.
//!
//! Every aval Kiln creates passes `check_aval` (shape rules, through
//! [`crate::Array::apply`]) or `check_shape` (constructors, and every
//! value of a shapeless call once its dims are resolved). After that check
//! a shape's *extent* — the product of its dims with zeros counted as 1 —
//! times the element size fits `isize::MAX`, so element counts, strides and
//! byte sizes computed from it later cannot overflow and need no checks of
//! their own.

use crate::error::{Error, Result};
use crate::shape::{Aval, Dim};
use crate::DType;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The most bytes one array, and one call's buffers, may take.
///
/// Process-wide; [`Limits::set`] changes them (the playground sets its own).
/// A larger array or call is an [`Error::LimitExceeded`] naming the op, the
/// size and the limit, raised when the op is built where shapes are known,
/// and when a shapeless call resolves its shapes otherwise.
///
/// ```
/// use kiln::{Array, DType, Limits};
/// let previous = Limits::set(Limits { max_array_bytes: 1 << 20, ..Limits::current() });
/// let err = Array::zeros(&[1024, 1024], DType::F32).check().unwrap_err();
/// assert!(err.to_string().contains("4194304 bytes"), "{err}");
/// Limits::set(previous);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// The most bytes one array's elements may take.
    pub max_array_bytes: usize,
    /// The most bytes one call's buffers may take together (the sum of its
    /// plan's slots, each as large as the largest value it holds).
    pub max_call_bytes: usize,
}

/// The deepest nesting of floor divisions a symbolic dim may hold.
/// Nested divisions by constants flatten into one, so only programs that
/// alternate divisions with products of symbols get near it.
const MAX_SYMBOLIC_DEPTH: usize = 16;

/// No size may exceed this: Rust allocations are at most `isize::MAX` bytes.
const ADDRESS_SPACE: usize = isize::MAX as usize;

impl Limits {
    /// The defaults: generous natively (16 GiB per array, 64 GiB per call;
    /// an allocation the system cannot satisfy is still an `Err`), tight on
    /// wasm32, whose whole memory is 4 GiB (256 MiB per array, 1 GiB per call).
    pub const DEFAULT: Limits = if cfg!(target_arch = "wasm32") {
        Limits {
            max_array_bytes: 256 << 20,
            max_call_bytes: 1 << 30,
        }
    } else {
        Limits {
            max_array_bytes: 16 << 30,
            max_call_bytes: 64 << 30,
        }
    };

    /// The limits in force.
    pub fn current() -> Limits {
        Limits {
            max_array_bytes: MAX_ARRAY_BYTES.load(Ordering::Relaxed),
            max_call_bytes: MAX_CALL_BYTES.load(Ordering::Relaxed),
        }
    }

    /// Puts `limits` in force for the whole process and returns the previous
    /// ones. Values above `isize::MAX` are lowered to it.
    pub fn set(limits: Limits) -> Limits {
        let previous = Limits::current();
        MAX_ARRAY_BYTES.store(limits.max_array_bytes.min(ADDRESS_SPACE), Ordering::Relaxed);
        MAX_CALL_BYTES.store(limits.max_call_bytes.min(ADDRESS_SPACE), Ordering::Relaxed);
        previous
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::DEFAULT
    }
}

static MAX_ARRAY_BYTES: AtomicUsize = AtomicUsize::new(Limits::DEFAULT.max_array_bytes);
static MAX_CALL_BYTES: AtomicUsize = AtomicUsize::new(Limits::DEFAULT.max_call_bytes);

/// Checks a concrete shape of `dtype` made by `op`: its extent must fit the
/// address space and its bytes the array limit. Returns the element count.
pub(crate) fn check_shape(op: &str, dims: &[usize], dtype: DType) -> Result<usize> {
    let overflow = || Error::SizeOverflow {
        op: op.to_string(),
        aval: render(dims, dtype),
    };
    let extent = dims
        .iter()
        .try_fold(dtype.size_bytes(), |acc, &d| acc.checked_mul(d.max(1)))
        .filter(|&bytes| bytes <= ADDRESS_SPACE)
        .ok_or_else(overflow)?;
    let numel = if dims.contains(&0) {
        0
    } else {
        extent / dtype.size_bytes()
    };
    let bytes = numel * dtype.size_bytes();
    let limit = MAX_ARRAY_BYTES.load(Ordering::Relaxed);
    if bytes > limit {
        return Err(Error::LimitExceeded {
            op: op.to_string(),
            what: render(dims, dtype),
            bytes,
            limit,
            scope: "array",
            field: "max_array_bytes",
        });
    }
    Ok(numel)
}

/// Checks an aval a shape rule made for `op`. Known shapes go through
/// [`check_shape`]; a symbolic shape goes through it with each symbolic dim
/// counted as its largest coefficient (so its known part must fit the
/// address space and the array limit), and its dims may not nest deeper
/// than [`MAX_SYMBOLIC_DEPTH`]. The sizes themselves are checked per call,
/// once the symbols are bound.
pub(crate) fn check_aval(op: &str, aval: &Aval) -> Result<()> {
    if let Some(dims) = aval.shape.as_known() {
        return check_shape(op, &dims, aval.dtype).map(|_| ());
    }
    let nested = |d: &Dim| matches!(d, Dim::Sym(e) if e.depth() > MAX_SYMBOLIC_DEPTH);
    if let Some(d) = aval.shape.dims().iter().find(|d| nested(d)) {
        return Err(Error::InvalidArgument {
            op: op.to_string(),
            detail: format!(
                "symbolic dim {d} nests more than {MAX_SYMBOLIC_DEPTH} floor divisions; \
                 compile without `shapeless` for this program"
            ),
            at: None,
        });
    }
    let known_part: Vec<usize> = aval
        .shape
        .dims()
        .iter()
        .map(|d| match d {
            Dim::Known(n) => *n,
            Dim::Sym(e) => usize::try_from(e.max_coefficient()).unwrap_or(usize::MAX),
        })
        .collect();
    check_shape(op, &known_part, aval.dtype)
        .map(|_| ())
        .map_err(|e| match e {
            Error::SizeOverflow { op, .. } => Error::SizeOverflow {
                op,
                aval: aval.to_string(),
            },
            Error::LimitExceeded {
                op,
                bytes,
                limit,
                scope,
                field,
                ..
            } => Error::LimitExceeded {
                op,
                what: format!("{aval} (at least, with every symbol 1)"),
                bytes,
                limit,
                scope,
                field,
            },
            other => other,
        })
}

/// Checks the bytes one call's buffers take against the call limit.
pub(crate) fn check_call_bytes(bytes: Option<usize>) -> Result<()> {
    let limit = MAX_CALL_BYTES.load(Ordering::Relaxed);
    match bytes {
        Some(bytes) if bytes <= limit => Ok(()),
        _ => Err(Error::LimitExceeded {
            op: "call".to_string(),
            what: "the buffers of one call".to_string(),
            bytes: bytes.unwrap_or(usize::MAX),
            limit,
            scope: "call",
            field: "max_call_bytes",
        }),
    }
}

/// Allocates room for `len` elements, or an [`Error::Allocation`] naming
/// `op` when the system cannot give it.
pub(crate) fn try_vec<T>(op: &str, len: usize) -> Result<Vec<T>> {
    let mut values = Vec::new();
    values
        .try_reserve_exact(len)
        .map_err(|_| Error::Allocation {
            op: op.to_string(),
            bytes: len.saturating_mul(std::mem::size_of::<T>()),
        })?;
    Ok(values)
}

/// Outputs at least this large are asked of the allocator before an op
/// family allocates them; below it a refused allocation means the process
/// is out of memory anyway.
const PROBED_BYTES: usize = 1 << 20;

/// `Err` naming `op` when the system cannot give `bytes` now. The op
/// families allocate their outputs infallibly (`collect`, `vec!`), so the
/// reference evaluation asks for each large output's bytes first, fallibly,
/// and gives them back: an impossible output fails here instead of aborting
/// the process inside the family.
pub(crate) fn ensure_allocatable(op: &str, bytes: usize) -> Result<()> {
    if bytes >= PROBED_BYTES {
        try_vec::<u8>(op, bytes)?;
    }
    Ok(())
}

/// Renders a concrete shape like an aval: `f32[4,4]`.
fn render(dims: &[usize], dtype: DType) -> String {
    Aval::new(dims, dtype).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shape_whose_element_count_overflows_is_a_size_overflow() {
        let err = check_shape("zeros", &[usize::MAX, 2], DType::F32).unwrap_err();
        assert!(matches!(err, Error::SizeOverflow { .. }), "{err}");
        assert!(err.to_string().contains("zeros"), "{err}");
    }

    #[test]
    fn an_empty_shape_with_an_absurd_dim_still_overflows_its_extent() {
        // Strides of [0, 2^62] would overflow, so NumPy rejects it too.
        let err = check_shape("zeros", &[0, 1 << 62], DType::F32).unwrap_err();
        assert!(matches!(err, Error::SizeOverflow { .. }), "{err}");
        assert_eq!(check_shape("zeros", &[0, 1 << 20], DType::F32), Ok(0));
    }

    #[test]
    fn the_element_count_is_returned_for_shapes_within_the_limit() {
        assert_eq!(check_shape("full", &[3, 4], DType::F16), Ok(12));
        assert_eq!(check_shape("full", &[], DType::U8), Ok(1));
    }
}
