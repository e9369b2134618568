//! Where in a user's program an op was written. A front end that knows
//! (the playground's script engine knows the line and column of every
//! call) sets the current location around each op it builds; every array
//! made meanwhile records it, traces carry it into graphs, and a compiled
//! function's [`crate::Report`] names the line that made each node.
//!
//! ```
//! use kiln::{at_location, Array, DType, SourceLocation};
//!
//! let x = Array::ones(&[2], DType::F32);
//! let here = SourceLocation { line: 3, column: 9 };
//! let y = at_location(Some(here), || x.exp());
//! assert_eq!(y.location(), Some(here));
//! assert_eq!(x.exp().location(), None);
//! ```

use serde::{Deserialize, Serialize};
use std::cell::Cell;
use std::fmt;
use std::panic::Location;

/// A 1-based line and column of the user's program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SourceLocation {
    /// The line, from 1.
    pub line: u32,
    /// The column, from 1.
    pub column: u32,
}

impl fmt::Display for SourceLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)
    }
}

thread_local! {
    /// Tracing runs on the caller's thread, so the location a front end
    /// set is the one of the op being built.
    static CURRENT: Cell<Option<SourceLocation>> = const { Cell::new(None) };
}

thread_local! {
    /// The `nn` composition being built, if any (the outermost one).
    static COMPOSITION: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// The `nn` composition (`softmax`, `layer_norm`, …) whose ops are being
/// built now, if any: arrays built meanwhile record it, and a
/// [`crate::Report`] names it for each node it made.
pub fn current_composition() -> Option<&'static str> {
    COMPOSITION.with(Cell::get)
}

thread_local! {
    /// The Rust line that called the outermost composition being built:
    /// an op inside it that fails names this line, not the composition's.
    static CALL_SITE: Cell<Option<&'static Location<'static>>> = const { Cell::new(None) };
}

/// The Rust line that called the outermost composition being built, if
/// one is being built.
pub(crate) fn composition_call_site() -> Option<&'static Location<'static>> {
    CALL_SITE.with(Cell::get)
}

/// Runs `f` as composition `name`: arrays it builds record it. Within
/// another composition the outer one stays (a `layer_norm` built of
/// `mean`s is one layer norm). An op inside that fails names the Rust
/// line that called the composition (a `#[track_caller]` caller passes
/// its own caller's line on).
///
/// ```
/// use kiln::{nn, Array, DType};
/// let y = nn::gelu(&Array::ones(&[2], DType::F32));
/// assert_eq!(y.composition(), Some("gelu"));
/// ```
#[track_caller]
pub fn in_composition<R>(name: &'static str, f: impl FnOnce() -> R) -> R {
    type Outer = (Option<&'static str>, Option<&'static Location<'static>>);
    struct Restore(Outer);
    impl Drop for Restore {
        fn drop(&mut self) {
            COMPOSITION.with(|c| c.set(self.0 .0));
            CALL_SITE.with(|c| c.set(self.0 .1));
        }
    }
    let caller = Location::caller();
    let outer = current_composition();
    let outer_site = composition_call_site();
    let _restore = Restore((
        COMPOSITION.with(|c| c.replace(outer.or(Some(name)))),
        CALL_SITE.with(|c| c.replace(outer_site.or(Some(caller)))),
    ));
    f()
}

/// The location arrays built now record, if a front end set one.
pub fn current_location() -> Option<SourceLocation> {
    CURRENT.with(Cell::get)
}

/// Runs `f` with `location` as the current location, then restores the
/// previous one (also when `f` panics), so nested calls each see their own.
pub fn at_location<R>(location: Option<SourceLocation>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<SourceLocation>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(location)));
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_locations_restore_the_outer_one() {
        let outer = SourceLocation { line: 1, column: 1 };
        let inner = SourceLocation { line: 2, column: 5 };
        at_location(Some(outer), || {
            assert_eq!(current_location(), Some(outer));
            at_location(Some(inner), || assert_eq!(current_location(), Some(inner)));
            assert_eq!(current_location(), Some(outer));
        });
        assert_eq!(current_location(), None);
    }

    #[test]
    fn a_panic_inside_still_restores_the_location() {
        let here = SourceLocation { line: 7, column: 3 };
        let caught = std::panic::catch_unwind(|| at_location(Some(here), || panic!("inside")));
        assert!(caught.is_err());
        assert_eq!(current_location(), None);
    }

    #[test]
    fn a_location_reads_as_line_and_column() {
        let here = SourceLocation {
            line: 4,
            column: 12,
        };
        assert_eq!(here.to_string(), "line 4, column 12");
    }
}
