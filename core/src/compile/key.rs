//! The compile cache key: what a cached executable is valid for, owned
//! ([`CacheKey`]) and borrowed from a call's arguments (`KeyView`).

use crate::handle::array::Array;
use crate::hash::FastHasher;
use crate::shape::{Aval, Shape};
use crate::tree::def::TreeDef;
use crate::DType;
use std::fmt;
use std::hash::{Hash, Hasher};

/// How one argument leaf enters the cache key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LeafSignature {
    /// Shape and dtype (a normal compile).
    Aval(Aval),
    /// Dtype and rank only (a shapeless compile).
    DTypeRank(DType, usize),
}

impl fmt::Display for LeafSignature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeafSignature::Aval(a) => write!(f, "{a}"),
            LeafSignature::DTypeRank(d, r) => write!(f, "{d} rank {r}"),
        }
    }
}

/// Everything a cached executable is valid for. Equality is by value,
/// statics and aux data included; the hash only picks the bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheKey {
    /// The compiled function.
    pub function: u64,
    /// The argument tree's structure, statics and aux data.
    pub tree: TreeDef,
    /// One signature per array leaf.
    pub leaves: Vec<LeafSignature>,
    /// The backend that runs it.
    pub backend: String,
}

impl Hash for CacheKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.function.hash(state);
        self.tree.hash(state);
        for leaf in &self.leaves {
            match leaf {
                LeafSignature::Aval(a) => hash_leaf(state, a.dtype, Some(&a.shape), a.shape.rank()),
                LeafSignature::DTypeRank(d, r) => hash_leaf(state, *d, None, *r),
            }
        }
        self.backend.hash(state);
    }
}

/// Hashes one leaf signature; shared by [`CacheKey`] and [`KeyView`] so a
/// borrowed view finds the bucket of the equal owned key.
fn hash_leaf<H: Hasher>(state: &mut H, dtype: DType, shape: Option<&Shape>, rank: usize) {
    dtype.hash(state);
    rank.hash(state);
    if let Some(shape) = shape {
        shape.hash(state);
    }
}

/// A cache key borrowed from a call's flattened arguments: hashing and
/// comparing it allocates nothing, so a cache hit costs no key copy.
pub(crate) struct KeyView<'a> {
    pub(crate) function: u64,
    pub(crate) tree: &'a TreeDef,
    pub(crate) leaves: &'a [Array],
    pub(crate) shapeless: bool,
    pub(crate) backend: &'a str,
}

impl KeyView<'_> {
    pub(crate) fn hash(&self) -> u64 {
        let mut state = FastHasher::default();
        self.function.hash(&mut state);
        self.tree.hash(&mut state);
        for leaf in self.leaves {
            let shape = (!self.shapeless).then(|| leaf.shape());
            hash_leaf(&mut state, leaf.dtype(), shape, leaf.ndim());
        }
        self.backend.hash(&mut state);
        state.finish()
    }

    pub(crate) fn matches(&self, key: &CacheKey) -> bool {
        key.function == self.function
            && key.backend == self.backend
            && key.leaves.len() == self.leaves.len()
            && key
                .leaves
                .iter()
                .zip(self.leaves)
                .all(|(sig, leaf)| match sig {
                    LeafSignature::Aval(a) => !self.shapeless && a == leaf.aval(),
                    LeafSignature::DTypeRank(d, r) => {
                        self.shapeless && *d == leaf.dtype() && *r == leaf.ndim()
                    }
                })
            && key.tree == *self.tree
    }

    pub(crate) fn to_key(&self) -> CacheKey {
        CacheKey {
            function: self.function,
            tree: self.tree.clone(),
            leaves: self
                .leaves
                .iter()
                .map(|l| {
                    if self.shapeless {
                        LeafSignature::DTypeRank(l.dtype(), l.ndim())
                    } else {
                        LeafSignature::Aval(l.aval().clone())
                    }
                })
                .collect(),
            backend: self.backend.to_string(),
        }
    }
}

/// The bucket of `key` in a function's cache.
pub(crate) fn hash_key(key: &CacheKey) -> u64 {
    let mut state = FastHasher::default();
    key.hash(&mut state);
    state.finish()
}
