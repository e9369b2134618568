//! `StaticValue`: a non-array value that is part of a tree's structure.

use std::any::{Any, TypeId};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, OnceLock};

/// What a type needs to be stored in a [`StaticValue`].
pub trait StaticBound: Any + fmt::Debug + Hash + Eq + Clone + Send + Sync {}

impl<T: Any + fmt::Debug + Hash + Eq + Clone + Send + Sync> StaticBound for T {}

/// Object-safe view of a [`StaticBound`] value.
trait DynStatic: Any + fmt::Debug + Send + Sync {
    fn as_any(&self) -> &dyn Any;
    fn eq_dyn(&self, other: &dyn DynStatic) -> bool;
    fn hash_dyn(&self, state: &mut dyn Hasher);
}

impl<T: StaticBound> DynStatic for T {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn eq_dyn(&self, other: &dyn DynStatic) -> bool {
        other
            .as_any()
            .downcast_ref::<T>()
            .is_some_and(|other| self == other)
    }

    fn hash_dyn(&self, mut state: &mut dyn Hasher) {
        TypeId::of::<T>().hash(&mut state);
        self.hash(&mut state);
    }
}

/// A cheaply clonable, type-erased static value (aux data, a scalar argument,
/// a `#[tree(static)]` field).
///
/// Equality is by value: both sides must hold the same type and compare equal
/// with that type's `==`. The hash only selects a bucket; it never decides
/// equality, so colliding hashes of different values still compare unequal.
///
/// ```
/// use kiln::StaticValue;
/// let a = StaticValue::new(3_i64);
/// assert_eq!(a, StaticValue::new(3_i64));
/// assert_ne!(a, StaticValue::new(3_i32)); // different types are never equal
/// assert_eq!(a.downcast_ref::<i64>(), Some(&3));
/// assert_eq!(a.to_string(), "3");
/// ```
#[derive(Clone)]
pub struct StaticValue(Arc<dyn DynStatic>);

impl StaticValue {
    /// Wraps `value`.
    pub fn new<T: StaticBound>(value: T) -> StaticValue {
        StaticValue(Arc::new(value))
    }

    /// The unit value `()`, shared (no allocation per call).
    pub fn unit() -> StaticValue {
        static UNIT: OnceLock<StaticValue> = OnceLock::new();
        UNIT.get_or_init(|| StaticValue::new(())).clone()
    }

    /// Whether this holds `()`.
    pub fn is_unit(&self) -> bool {
        self.downcast_ref::<()>().is_some()
    }

    /// The value, if it is a `T`.
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref::<T>()
    }
}

impl PartialEq for StaticValue {
    fn eq(&self, other: &StaticValue) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.eq_dyn(&*other.0)
    }
}

impl Eq for StaticValue {}

impl Hash for StaticValue {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash_dyn(state);
    }
}

impl fmt::Debug for StaticValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for StaticValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// An `f32` compared and hashed by its bits, so it can be a static value.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct F32Bits(pub(crate) u32);

/// An `f64` compared and hashed by its bits, so it can be a static value.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct F64Bits(pub(crate) u64);

impl fmt::Debug for F32Bits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", f32::from_bits(self.0))
    }
}

impl fmt::Debug for F64Bits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", f64::from_bits(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::DefaultHasher;

    /// Every value hashes the same: equality must still tell them apart.
    #[derive(Clone, Debug, PartialEq, Eq)]
    struct Colliding(u32);

    impl Hash for Colliding {
        fn hash<H: Hasher>(&self, state: &mut H) {
            0_u8.hash(state);
        }
    }

    fn hash_of(v: &StaticValue) -> u64 {
        let mut h = DefaultHasher::new();
        v.hash(&mut h);
        h.finish()
    }

    #[test]
    fn colliding_hashes_of_different_values_are_unequal() {
        let a = StaticValue::new(Colliding(1));
        let b = StaticValue::new(Colliding(2));
        assert_eq!(hash_of(&a), hash_of(&b));
        assert_ne!(a, b);
        assert_eq!(a, StaticValue::new(Colliding(1)));
    }

    #[test]
    fn different_types_with_equal_bits_are_unequal() {
        assert_ne!(StaticValue::new(1_u32), StaticValue::new(1_i32));
        assert_ne!(StaticValue::new(()), StaticValue::new(0_u8));
    }

    #[test]
    fn equal_values_hash_equally() {
        let a = StaticValue::new(String::from("relu"));
        let b = StaticValue::new(String::from("relu"));
        assert_eq!(a, b);
        assert_eq!(hash_of(&a), hash_of(&b));
    }

    #[test]
    fn floats_compare_by_bits_and_print_as_floats() {
        let nan = StaticValue::new(F64Bits(f64::NAN.to_bits()));
        assert_eq!(nan, nan.clone());
        assert_eq!(nan, StaticValue::new(F64Bits(f64::NAN.to_bits())));
        assert_ne!(
            StaticValue::new(F32Bits(0.0_f32.to_bits())),
            StaticValue::new(F32Bits((-0.0_f32).to_bits()))
        );
        assert_eq!(
            StaticValue::new(F32Bits(1.5_f32.to_bits())).to_string(),
            "1.5"
        );
    }

    #[test]
    fn display_and_debug_delegate_to_the_value() {
        let v = StaticValue::new(String::from("a"));
        assert_eq!(format!("{v}"), "\"a\"");
        assert_eq!(format!("{v:?}"), "\"a\"");
        assert!(StaticValue::unit().is_unit());
    }
}
