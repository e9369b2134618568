//! The `Array` handle: a cheap, clonable handle to a node of the lazy
//! graph ([`array`](mod@array)), and its constructors ([`creation`]). The op
//! families' user methods on it live beside each family's rules in
//! [`crate::ops`].

pub mod array;
pub mod creation;
