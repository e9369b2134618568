//! Counter-based random numbers: element `i` of a draw depends only on
//! `(seed, i)`, so results are identical on every platform, for every
//! length and in any evaluation order.
//!
//! Each element hashes `(seed, counter)` with the SplitMix64 finaliser;
//! normals use Box–Muller on two hashed uniforms. Transcendentals go through
//! `libm`, which is pure Rust and gives the same bits everywhere.

use crate::data::HostData;
use crate::error::{Error, Result};
use crate::DType;

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 64 random bits for `(seed, counter)`.
fn bits(seed: u64, counter: u64) -> u64 {
    mix(mix(seed).wrapping_add(counter.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// A uniform in `[0, 1)` with 53 random bits.
fn unit(seed: u64, counter: u64) -> f64 {
    (bits(seed, counter) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A random key: the explicit state every random draw starts from. Keys
/// derive new keys deterministically, so a program's randomness is a
/// function of the seed alone.
///
/// ```
/// use kiln::{random::Key, Array, DType};
/// let key = Key::new(42);
/// let [a, b] = [key.fold_in(0), key.fold_in(1)];
/// let x = Array::random_normal(a, &[3], DType::F32)?;
/// assert_eq!(x.to_vec::<f32>()?, Array::random_normal(a, &[3], DType::F32)?.to_vec::<f32>()?);
/// assert_ne!(a, b);
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key(u64);

impl Key {
    /// The key of a seed.
    pub fn new(seed: u64) -> Key {
        Key(seed)
    }

    /// The seed the draws of this key use.
    pub fn seed(self) -> u64 {
        self.0
    }

    /// A new key derived from this one and `data` (e.g. a step or layer index).
    pub fn fold_in(self, data: u64) -> Key {
        Key(bits(self.0 ^ GOLDEN, data))
    }

    /// `n` independent keys derived from this one; `Err` when `n` keys do
    /// not fit in memory.
    ///
    /// ```
    /// let keys = kiln::random::Key::new(1).split(3)?;
    /// assert_eq!(keys.len(), 3);
    /// assert!(kiln::random::Key::new(1).split(usize::MAX).is_err());
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn split(self, n: usize) -> Result<Vec<Key>> {
        let mut keys = crate::limits::try_vec("split", n)?;
        keys.extend((0..n as u64).map(|i| self.fold_in(i)));
        Ok(keys)
    }
}

fn require_float(op: &str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::DType {
            op: op.to_string(),
            detail: format!("random values need a floating dtype, got {dtype}"),
            operands: dtype.to_string(),
            at: None,
        })
    }
}

/// `len` values uniform in `[low, high)` (up to rounding to `dtype`).
///
/// ```
/// use kiln::{random::uniform, DType};
/// let a = uniform(7, 4, 0.0, 1.0, DType::F32).unwrap();
/// let b = uniform(7, 2, 0.0, 1.0, DType::F32).unwrap();
/// assert_eq!(a.to_f64_vec()[..2], b.to_f64_vec()[..]);
/// ```
pub fn uniform(seed: u64, len: usize, low: f64, high: f64, dtype: DType) -> Result<HostData> {
    require_float("uniform", dtype)?;
    let values = (0..len as u64).map(|i| low + (high - low) * unit(seed, i));
    HostData::try_from_f64s("random_uniform", dtype, len, values)
}

/// `len` values normally distributed with `mean` and `std`.
pub fn normal(seed: u64, len: usize, mean: f64, std: f64, dtype: DType) -> Result<HostData> {
    require_float("normal", dtype)?;
    let values = (0..len as u64).map(|i| {
        // Two counters per element; 1 - u keeps the logarithm finite.
        let u1 = 1.0 - unit(seed, 2 * i);
        let u2 = unit(seed, 2 * i + 1);
        let radius = libm::sqrt(-2.0 * libm::log(u1));
        mean + std * radius * libm::cos(2.0 * std::f64::consts::PI * u2)
    });
    HostData::try_from_f64s("random_normal", dtype, len, values)
}

/// `len` integers uniform in `[low, high)`, for an integer `dtype`.
///
/// Element `i` is `low + ⌊bits(seed, i) · (high - low) / 2⁶⁴⌋`: a
/// multiply-shift of the element's 64 hashed bits, so it depends only on
/// `(seed, i)` and its bias is below `(high - low) / 2⁶⁴`. `Err` when
/// `low >= high`, when `dtype` is not an integer dtype, or when
/// `[low, high)` does not fit in `dtype`.
///
/// ```
/// use kiln::{random::randint, DType};
/// let a = randint(7, 6, -3, 4, DType::I32)?.to_f64_vec();
/// assert!(a.iter().all(|&x| (-3.0..4.0).contains(&x)));
/// assert_eq!(randint(7, 2, -3, 4, DType::I32)?.to_f64_vec()[..], a[..2]);
/// assert!(randint(7, 6, 4, 4, DType::I32).is_err());
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn randint(seed: u64, len: usize, low: i64, high: i64, dtype: DType) -> Result<HostData> {
    let Some(values) = dtype.integer_range() else {
        return Err(Error::DType {
            op: "randint".to_string(),
            detail: format!("random integers need an integer dtype (i32, u32, u8), got {dtype}"),
            operands: dtype.to_string(),
            at: None,
        });
    };
    if low >= high {
        return Err(Error::InvalidArgument {
            op: "randint".to_string(),
            detail: format!("needs low < high, got low={low} high={high}"),
            at: None,
        });
    }
    let (low, high) = (i128::from(low), i128::from(high));
    if low < *values.start() || high - 1 > *values.end() {
        return Err(Error::InvalidArgument {
            op: "randint".to_string(),
            detail: format!(
                "[{low}, {high}) does not fit in {dtype}, which holds {}..={}",
                values.start(),
                values.end()
            ),
            at: None,
        });
    }
    // Below 2^33 (both bounds fit a 32-bit dtype), so the product fits u128.
    let range = (high - low) as u128;
    let draws = (0..len as u64).map(|i| {
        let offset = (u128::from(bits(seed, i)) * range) >> 64;
        (low + offset as i128) as f64
    });
    HostData::try_from_f64s("random_randint", dtype, len, draws)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_values_and_prefix_stable() {
        let a = uniform(42, 100, -1.0, 1.0, DType::F32).unwrap();
        let b = uniform(42, 10, -1.0, 1.0, DType::F32).unwrap();
        assert_eq!(a.to_f64_vec()[..10], b.to_f64_vec()[..]);
        let n1 = normal(3, 50, 0.0, 1.0, DType::F32).unwrap();
        let n2 = normal(3, 50, 0.0, 1.0, DType::F32).unwrap();
        assert_eq!(n1, n2);
    }

    #[test]
    fn different_seeds_differ() {
        let a = uniform(1, 8, 0.0, 1.0, DType::F32).unwrap();
        let b = uniform(2, 8, 0.0, 1.0, DType::F32).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn values_are_pinned_across_platforms() {
        // The stream is part of the contract: changing it breaks saved seeds.
        let got = uniform(0, 3, 0.0, 1.0, DType::F32).unwrap().to_f64_vec();
        let again: Vec<f64> = (0..3).map(|i| unit(0, i) as f32 as f64).collect();
        assert_eq!(got, again);
        assert_eq!(bits(0, 0), mix(mix(0).wrapping_add(GOLDEN)));
    }

    #[test]
    fn uniform_stays_in_range_with_plausible_mean() {
        let v = uniform(9, 10_000, 2.0, 4.0, DType::F32)
            .unwrap()
            .to_f64_vec();
        assert!(v.iter().all(|&x| (2.0..4.0).contains(&x)));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        assert!((mean - 3.0).abs() < 0.05, "{mean}");
    }

    #[test]
    fn normal_has_plausible_moments() {
        let v = normal(5, 20_000, 1.0, 2.0, DType::F32)
            .unwrap()
            .to_f64_vec();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!((mean - 1.0).abs() < 0.06, "{mean}");
        assert!((var.sqrt() - 2.0).abs() < 0.06, "{var}");
        assert!(v.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn half_dtypes_are_rounded_f64_values() {
        let h = uniform(11, 5, 0.0, 1.0, DType::BF16).unwrap();
        assert_eq!(h.dtype(), DType::BF16);
        let want = HostData::from_f64s(DType::BF16, (0..5).map(|i| unit(11, i)));
        assert_eq!(h, want);
    }

    #[test]
    fn integer_dtypes_are_rejected() {
        assert!(matches!(
            uniform(0, 3, 0.0, 1.0, DType::I32),
            Err(Error::DType { .. })
        ));
        assert!(matches!(
            normal(0, 3, 0.0, 1.0, DType::Bool),
            Err(Error::DType { .. })
        ));
    }
    #[test]
    fn randint_stays_in_range_and_hits_every_value() {
        let v = randint(13, 5_000, -2, 3, DType::I32).unwrap().to_f64_vec();
        assert!(v
            .iter()
            .all(|&x| (-2.0..3.0).contains(&x) && x.fract() == 0.0));
        for want in -2..3 {
            let count = v.iter().filter(|&&x| x == f64::from(want)).count();
            assert!((900..1100).contains(&count), "{want}: {count}");
        }
    }

    #[test]
    fn randint_is_deterministic_per_seed_and_index() {
        let a = randint(21, 40, 0, 1000, DType::U32).unwrap();
        let prefix = randint(21, 8, 0, 1000, DType::U32).unwrap();
        assert_eq!(a.to_f64_vec()[..8], prefix.to_f64_vec()[..]);
        assert_eq!(a, randint(21, 40, 0, 1000, DType::U32).unwrap());
        assert_ne!(a, randint(22, 40, 0, 1000, DType::U32).unwrap());
        let pinned: Vec<f64> = (0..8)
            .map(|i| ((u128::from(bits(21, i)) * 1000) >> 64) as f64)
            .collect();
        assert_eq!(prefix.to_f64_vec(), pinned);
    }

    #[test]
    fn randint_covers_a_full_u8_and_i32_range() {
        let bytes = randint(3, 2_000, 0, 256, DType::U8).unwrap();
        assert_eq!(bytes.dtype(), DType::U8);
        let v = bytes.to_f64_vec();
        assert!(v.iter().any(|&x| x >= 200.0) && v.iter().any(|&x| x < 50.0));
        let wide = randint(3, 100, i32::MIN.into(), i64::from(i32::MAX) + 1, DType::I32);
        assert!(wide.unwrap().to_f64_vec().iter().any(|&x| x < 0.0));
    }

    #[test]
    fn randint_rejects_empty_ranges_floats_and_bounds_beyond_the_dtype() {
        let empty = randint(0, 3, 5, 5, DType::I32).unwrap_err();
        assert!(empty.to_string().contains("low < high"), "{empty}");
        assert!(matches!(
            randint(0, 3, 0, 4, DType::F32),
            Err(Error::DType { .. })
        ));
        assert!(matches!(
            randint(0, 3, 0, 2, DType::Bool),
            Err(Error::DType { .. })
        ));
        let wide = randint(0, 3, 0, 257, DType::U8).unwrap_err();
        assert!(wide.to_string().contains("does not fit in u8"), "{wide}");
        assert!(randint(0, 3, -1, 2, DType::U32).is_err());
    }
}
