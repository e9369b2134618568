//! The bound on how deeply a tree may nest.
//!
//! Flatten and unflatten recurse once per level of nesting, and so do the
//! walks of a [`TreeDef`](super::TreeDef) (equality, hashing, display, the
//! cache's miss explanation). A script can build a list nested ten thousand
//! deep, which would overflow the stack (1 MiB on wasm32, 2 MiB on a test
//! thread) long before memory runs out. Every flatten and unflatten
//! therefore counts the levels it is inside, and refuses to go deeper than
//! [`MAX_TREE_DEPTH`] with an `Err` naming the path. The count is one
//! `Cell` per thread: a constant without a destructor, so it costs nothing
//! to a thread that never flattens and nothing after a thread ends.

use super::path::tree_err;
use crate::error::Result;
use std::cell::Cell;
use std::marker::PhantomData;

/// How many containers (lists, tuples, maps, options, structs, script
/// objects, registered nodes) may nest inside one another in a tree.
/// Flattening or unflattening a deeper tree is an `Err` naming the path
/// where the limit was reached, never a stack overflow.
///
/// Real argument trees nest a handful of levels (a model, its layers, a
/// layer's weights); the limit leaves a wide margin above them while every
/// recursive walk of a tree at this depth fits in a 1 MiB stack, the
/// smallest Kiln runs on (wasm32), unoptimized builds included.
///
/// ```
/// use kiln::{tree_flatten, Array, Error, Value, MAX_TREE_DEPTH};
/// let mut deep = Value::Array(Array::from_vec(vec![1.0_f32], &[1])?);
/// for _ in 0..=MAX_TREE_DEPTH {
///     deep = Value::List(vec![deep]);
/// }
/// let Err(Error::Tree { path, detail }) = tree_flatten(&deep) else {
///     panic!("a tree deeper than the limit must not flatten");
/// };
/// assert_eq!(path, "[0]".repeat(MAX_TREE_DEPTH));
/// assert!(detail.starts_with(&format!("nesting deeper than {MAX_TREE_DEPTH} levels")));
/// # Ok::<(), kiln::Error>(())
/// ```
pub const MAX_TREE_DEPTH: usize = 256;

thread_local! {
    /// Levels of nesting the current thread's flattens and unflattens are in.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// One level of nesting, held while a container's children are flattened
/// or unflattened; dropping it leaves the level.
pub(crate) struct Level {
    /// The count is per thread: a level must be left on the thread that
    /// entered it.
    not_send: PhantomData<*const ()>,
}

impl Level {
    /// Enters one more level, or fails (at the container about to nest too
    /// deep, so the caller's path prefixes lead to it) past the limit.
    pub(crate) fn enter() -> Result<Level> {
        DEPTH.with(|depth| {
            let current = depth.get();
            if current >= MAX_TREE_DEPTH {
                return Err(tree_err(format!(
                    "nesting deeper than {MAX_TREE_DEPTH} levels: Kiln's trees nest at most \
                     MAX_TREE_DEPTH containers, so that walking one cannot overflow the stack"
                )));
            }
            depth.set(current + 1);
            Ok(Level {
                not_send: PhantomData,
            })
        })
    }
}

impl Drop for Level {
    fn drop(&mut self) {
        DEPTH.with(|depth| depth.set(depth.get() - 1));
    }
}
