//! `Tree` for arrays, tuples, `Vec`, `Option`, maps, scalars, `Box` and `Arc`.
//!
//! Every container is one level of nesting: its flatten and unflatten hold
//! a [`Level`] while they walk the children, so a tree deeper than
//! [`MAX_TREE_DEPTH`](super::MAX_TREE_DEPTH) is an `Err`, not a stack
//! overflow (a recursive Rust type can nest as deep as its data).

use super::depth::Level;
use super::path::{prefix_error, tree_err, PathEntry};
use super::static_value::{F32Bits, F64Bits, StaticValue};
use super::{intern_key, Tree, TreeDef};
use crate::error::Result;
use crate::handle::array::Array;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::vec::IntoIter;

/// Leaves for containers: the next leaf or an error saying we ran out.
pub(crate) fn next_leaf(leaves: &mut IntoIter<Array>) -> Result<Array> {
    leaves.next().ok_or_else(|| {
        tree_err("ran out of leaves: the structure needs more leaves than were given")
    })
}

/// The error for a def of the wrong variant or length.
pub(crate) fn mismatch(expected: impl std::fmt::Display, def: &TreeDef) -> crate::Error {
    tree_err(format!("expected {expected}, found {}", describe(def)))
}

/// `Tuple`, `a Tuple of 2 children`, ... for error messages.
fn describe(def: &TreeDef) -> String {
    match def {
        TreeDef::Static(v) => format!("Static({v:?})"),
        TreeDef::Tuple(c) | TreeDef::List(c) => {
            format!("{} of {} children", def.variant_name(), c.len())
        }
        TreeDef::Node(n) => format!("Node `{}`", n.type_name),
        other => other.variant_name().to_string(),
    }
}

/// Unflattens each child def in `children`, prefixing errors with its index.
fn unflatten_indexed<T: Tree>(
    children: &[TreeDef],
    leaves: &mut IntoIter<Array>,
) -> Result<Vec<T>> {
    children
        .iter()
        .enumerate()
        .map(|(i, d)| T::unflatten(d, leaves).map_err(|e| prefix_error(e, PathEntry::Index(i))))
        .collect()
}

impl Tree for Array {
    fn flatten(&self, leaves: &mut Vec<Array>) -> Result<TreeDef> {
        leaves.push(self.clone());
        Ok(TreeDef::Leaf)
    }

    fn unflatten(def: &TreeDef, leaves: &mut IntoIter<Array>) -> Result<Self> {
        match def {
            TreeDef::Leaf => next_leaf(leaves),
            other => Err(mismatch("an array leaf", other)),
        }
    }
}

impl Tree for () {
    fn flatten(&self, _leaves: &mut Vec<Array>) -> Result<TreeDef> {
        Ok(TreeDef::Unit)
    }

    fn unflatten(def: &TreeDef, _leaves: &mut IntoIter<Array>) -> Result<Self> {
        match def {
            TreeDef::Unit => Ok(()),
            other => Err(mismatch("()", other)),
        }
    }
}

macro_rules! tuple_tree {
    ($n:literal; $($t:ident $i:tt),+) => {
        impl<$($t: Tree),+> Tree for ($($t,)+) {
            fn flatten(&self, leaves: &mut Vec<Array>) -> Result<TreeDef> {
                let _level = Level::enter()?;
                Ok(TreeDef::Tuple(vec![$(
                    self.$i.flatten(leaves).map_err(|e| prefix_error(e, PathEntry::Index($i)))?
                ),+]))
            }

            fn unflatten(def: &TreeDef, leaves: &mut IntoIter<Array>) -> Result<Self> {
                let _level = Level::enter()?;
                match def {
                    TreeDef::Tuple(c) if c.len() == $n => Ok(($(
                        $t::unflatten(&c[$i], leaves)
                            .map_err(|e| prefix_error(e, PathEntry::Index($i)))?,
                    )+)),
                    other => Err(mismatch(concat!("a tuple of ", $n, " children"), other)),
                }
            }
        }
    };
}

tuple_tree!(1; A 0);
tuple_tree!(2; A 0, B 1);
tuple_tree!(3; A 0, B 1, C 2);
tuple_tree!(4; A 0, B 1, C 2, D 3);
tuple_tree!(5; A 0, B 1, C 2, D 3, E 4);
tuple_tree!(6; A 0, B 1, C 2, D 3, E 4, F 5);
tuple_tree!(7; A 0, B 1, C 2, D 3, E 4, F 5, G 6);
tuple_tree!(8; A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7);

impl<T: Tree> Tree for Vec<T> {
    fn flatten(&self, leaves: &mut Vec<Array>) -> Result<TreeDef> {
        let _level = Level::enter()?;
        // Sized up front: collecting into `Result<Vec<_>>` cannot see the
        // length and would regrow the vector on every call.
        let mut children = Vec::with_capacity(self.len());
        for (i, x) in self.iter().enumerate() {
            children.push(
                x.flatten(leaves)
                    .map_err(|e| prefix_error(e, PathEntry::Index(i)))?,
            );
        }
        Ok(TreeDef::List(children))
    }

    fn unflatten(def: &TreeDef, leaves: &mut IntoIter<Array>) -> Result<Self> {
        let _level = Level::enter()?;
        match def {
            TreeDef::List(c) => unflatten_indexed(c, leaves),
            other => Err(mismatch("a list", other)),
        }
    }
}

impl<T: Tree> Tree for Option<T> {
    /// `Some` is a level of nesting; `None`, holding nothing, is not.
    fn flatten(&self, leaves: &mut Vec<Array>) -> Result<TreeDef> {
        Ok(TreeDef::Option(match self {
            None => None,
            Some(x) => {
                let _level = Level::enter()?;
                Some(Box::new(x.flatten(leaves)?))
            }
        }))
    }

    fn unflatten(def: &TreeDef, leaves: &mut IntoIter<Array>) -> Result<Self> {
        match def {
            TreeDef::Option(None) => Ok(None),
            TreeDef::Option(Some(d)) => {
                let _level = Level::enter()?;
                Ok(Some(T::unflatten(d, leaves)?))
            }
            other => Err(mismatch("an Option", other)),
        }
    }
}

impl<T: Tree> Tree for BTreeMap<String, T> {
    fn flatten(&self, leaves: &mut Vec<Array>) -> Result<TreeDef> {
        let _level = Level::enter()?;
        let mut children = Vec::with_capacity(self.len());
        for (k, x) in self {
            let def = x
                .flatten(leaves)
                .map_err(|e| prefix_error(e, PathEntry::Key(k.clone())))?;
            children.push((intern_key(k), def));
        }
        Ok(TreeDef::Map(children))
    }

    fn unflatten(def: &TreeDef, leaves: &mut IntoIter<Array>) -> Result<Self> {
        let _level = Level::enter()?;
        match def {
            TreeDef::Map(c) => c
                .iter()
                .map(|(k, d)| {
                    T::unflatten(d, leaves)
                        .map(|x| (k.to_string(), x))
                        .map_err(|e| prefix_error(e, PathEntry::Key(k.to_string())))
                })
                .collect(),
            other => Err(mismatch("a map", other)),
        }
    }
}

impl<T: Tree> Tree for Box<T> {
    fn flatten(&self, leaves: &mut Vec<Array>) -> Result<TreeDef> {
        (**self).flatten(leaves)
    }

    fn unflatten(def: &TreeDef, leaves: &mut IntoIter<Array>) -> Result<Self> {
        T::unflatten(def, leaves).map(Box::new)
    }
}

impl<T: Tree> Tree for Arc<T> {
    fn flatten(&self, leaves: &mut Vec<Array>) -> Result<TreeDef> {
        (**self).flatten(leaves)
    }

    /// Builds a new `Arc`; never shares or mutates the caller's.
    fn unflatten(def: &TreeDef, leaves: &mut IntoIter<Array>) -> Result<Self> {
        T::unflatten(def, leaves).map(Arc::new)
    }
}

/// A static of type `T` from `def`.
pub(crate) fn static_of<T: Clone + 'static>(def: &TreeDef, type_label: &str) -> Result<T> {
    match def {
        TreeDef::Static(v) => v
            .downcast_ref::<T>()
            .cloned()
            .ok_or_else(|| mismatch(format_args!("a static {type_label}"), def)),
        other => Err(mismatch(format_args!("a static {type_label}"), other)),
    }
}

macro_rules! static_tree {
    ($($t:ty),+) => {$(
        impl Tree for $t {
            fn flatten(&self, _leaves: &mut Vec<Array>) -> Result<TreeDef> {
                Ok(TreeDef::Static(StaticValue::new(self.clone())))
            }

            fn unflatten(def: &TreeDef, _leaves: &mut IntoIter<Array>) -> Result<Self> {
                static_of::<$t>(def, stringify!($t))
            }
        }
    )+};
}

static_tree!(bool, i32, i64, u32, u64, usize, String);

impl Tree for f32 {
    fn flatten(&self, _leaves: &mut Vec<Array>) -> Result<TreeDef> {
        Ok(TreeDef::Static(StaticValue::new(F32Bits(self.to_bits()))))
    }

    fn unflatten(def: &TreeDef, _leaves: &mut IntoIter<Array>) -> Result<Self> {
        static_of::<F32Bits>(def, "f32").map(|b| f32::from_bits(b.0))
    }
}

impl Tree for f64 {
    fn flatten(&self, _leaves: &mut Vec<Array>) -> Result<TreeDef> {
        Ok(TreeDef::Static(StaticValue::new(F64Bits(self.to_bits()))))
    }

    fn unflatten(def: &TreeDef, _leaves: &mut IntoIter<Array>) -> Result<Self> {
        static_of::<F64Bits>(def, "f64").map(|b| f64::from_bits(b.0))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{tree_flatten, tree_unflatten};
    use super::*;
    use crate::Error;

    fn arr(values: &[f32]) -> Array {
        Array::from_vec(values.to_vec(), &[values.len()]).unwrap()
    }

    fn data(a: &Array) -> Vec<f32> {
        a.to_vec::<f32>().unwrap()
    }

    fn round_trip<T: Tree>(value: &T) -> (T, TreeDef) {
        let (leaves, def) = tree_flatten(value).unwrap();
        assert_eq!(leaves.len(), def.num_leaves());
        (tree_unflatten(&def, leaves).unwrap(), def)
    }

    #[test]
    fn array_round_trips_as_a_leaf() {
        let (a, def) = round_trip(&arr(&[1.0, 2.0]));
        assert_eq!(def, TreeDef::Leaf);
        assert_eq!(data(&a), [1.0, 2.0]);
    }

    #[test]
    fn tuples_round_trip_up_to_arity_eight() {
        let (t, def) = round_trip(&(arr(&[1.0]),));
        assert_eq!(def.to_string(), "(*,)");
        assert_eq!(data(&t.0), [1.0]);
        let v = (1_i32, 2_i64, 3_u32, 4_u64, 5_usize, true, arr(&[7.0]), ());
        let (t, def) = round_trip(&v);
        assert_eq!(def.to_string(), "(1, 2, 3, 4, 5, true, *, ())");
        assert_eq!((t.0, t.1, t.2, t.3, t.4, t.5), (1, 2, 3, 4, 5, true));
        assert_eq!(data(&t.6), [7.0]);
    }

    #[test]
    fn vec_option_and_map_round_trip() {
        let mut m = BTreeMap::new();
        m.insert("b".to_string(), vec![Some(arr(&[2.0])), None]);
        m.insert("a".to_string(), vec![]);
        let (back, def) = round_trip(&m);
        assert_eq!(def.to_string(), r#"{"a": [], "b": [Some(*), None]}"#);
        assert_eq!(back["a"].len(), 0);
        assert_eq!(data(back["b"][0].as_ref().unwrap()), [2.0]);
        assert!(back["b"][1].is_none());
    }

    #[test]
    fn scalars_round_trip_as_statics() {
        let v = (1.5_f32, -0.0_f64, String::from("s"), f64::NAN);
        let (back, def) = round_trip(&v);
        assert_eq!(def.to_string(), r#"(1.5, -0.0, "s", NaN)"#);
        assert_eq!(back.0, 1.5);
        assert_eq!(back.1.to_bits(), (-0.0_f64).to_bits());
        assert_eq!(back.2, "s");
        assert!(back.3.is_nan());
        assert_eq!(
            def,
            tree_flatten(&v).unwrap().1,
            "NaN statics equal by bits"
        );
    }

    #[test]
    fn box_and_arc_delegate_and_arc_is_rebuilt() {
        let shared = Arc::new(vec![arr(&[3.0])]);
        let (back, def) = round_trip(&(Box::new(arr(&[1.0])), shared.clone()));
        assert_eq!(def.to_string(), "(*, [*])");
        assert_eq!(data(&back.0), [1.0]);
        assert!(!Arc::ptr_eq(&back.1, &shared));
        assert_eq!(data(&back.1[0]), [3.0]);
    }

    #[test]
    fn unflatten_rejects_a_wrong_variant_with_its_path() {
        let def = TreeDef::List(vec![TreeDef::Leaf, TreeDef::Tuple(vec![TreeDef::Leaf])]);
        let err = tree_unflatten::<Vec<Array>>(&def, vec![arr(&[1.0]), arr(&[2.0])]).unwrap_err();
        assert_eq!(
            err,
            Error::Tree {
                path: "[1]".into(),
                detail: "expected an array leaf, found Tuple of 1 children".into()
            }
        );
        let def = TreeDef::Tuple(vec![TreeDef::Leaf; 3]);
        let err = tree_unflatten::<(Array, Array)>(&def, vec![arr(&[1.0]); 3]).unwrap_err();
        assert_eq!(
            err,
            Error::Tree {
                path: "<root>".into(),
                detail: "expected a tuple of 2 children, found Tuple of 3 children".into()
            }
        );
    }

    #[test]
    fn unflatten_rejects_a_static_of_another_type() {
        let def = TreeDef::Static(StaticValue::new(3_i64));
        let err = tree_unflatten::<i32>(&def, vec![]).unwrap_err();
        assert_eq!(
            err,
            Error::Tree {
                path: "<root>".into(),
                detail: "expected a static i32, found Static(3)".into()
            }
        );
    }

    #[test]
    fn unflatten_rejects_too_few_and_too_many_leaves() {
        let def = TreeDef::List(vec![TreeDef::Leaf; 4]);
        let err = tree_unflatten::<Vec<Array>>(&def, vec![arr(&[1.0]); 3]).unwrap_err();
        assert_eq!(
            err,
            Error::Tree {
                path: "<root>".into(),
                detail: "ran out of leaves: the structure needs 4 leaves, 3 were given".into()
            }
        );
        let err = tree_unflatten::<Vec<Array>>(&def, vec![arr(&[1.0]); 5]).unwrap_err();
        assert_eq!(
            err,
            Error::Tree {
                path: "<root>".into(),
                detail: "5 leaves given, the structure takes 4".into()
            }
        );
    }

    #[test]
    fn direct_unflatten_running_out_names_the_path() {
        let def = TreeDef::List(vec![TreeDef::Leaf; 2]);
        let mut leaves = vec![arr(&[1.0])].into_iter();
        let err = <Vec<Array>>::unflatten(&def, &mut leaves).unwrap_err();
        assert!(
            matches!(&err, Error::Tree { path, detail } if path == "[1]" && detail.starts_with("ran out of leaves")),
            "{err:?}"
        );
    }
}
