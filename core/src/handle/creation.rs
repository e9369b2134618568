//! Constructors: arrays from host data, filled, ranges and random draws.
//! Every constructor checks its shape against [`crate::Limits`] and
//! allocates fallibly.

use crate::data::{HostData, HostElement};
use crate::error::{arg_err, Error, Result};
use crate::handle::array::Array;
use crate::limits::check_shape;
use crate::shape::Shape;
use crate::DType;
use std::sync::Arc;

impl Array {
    /// An array of `shape` from row-major `values`.
    pub fn from_vec<T: HostElement>(values: Vec<T>, shape: &[usize]) -> Result<Array> {
        if values.len() != check_shape("from_vec", shape, T::DTYPE)? {
            return Err(Error::DataLength {
                shape: shape.to_vec(),
                len: values.len(),
            });
        }
        Ok(Array::from_host(
            Arc::new(T::wrap(values)),
            Shape::known(shape),
        ))
    }

    /// An array of `shape` copied from `values`.
    pub fn from_slice<T: HostElement>(values: &[T], shape: &[usize]) -> Result<Array> {
        Array::from_vec(values.to_vec(), shape)
    }

    /// An array from host data and a shape whose element count matches.
    pub fn from_data(data: HostData, shape: &[usize]) -> Result<Array> {
        if data.len() != check_shape("from_data", shape, data.dtype())? {
            return Err(Error::DataLength {
                shape: shape.to_vec(),
                len: data.len(),
            });
        }
        Ok(Array::from_host(Arc::new(data), Shape::known(shape)))
    }

    /// A rank-0 array holding `value` converted to `dtype`.
    #[track_caller]
    pub fn scalar(value: f64, dtype: DType) -> Array {
        Array::filled("scalar", &[], value, dtype)
    }

    /// An array of `shape` filled with `value` converted to `dtype`; a
    /// shape too large for [`crate::Limits`] or for memory makes a failed
    /// array.
    #[track_caller]
    pub fn full(shape: &[usize], value: f64, dtype: DType) -> Array {
        Array::filled("full", shape, value, dtype)
    }

    /// Zeros of `shape` and `dtype`.
    #[track_caller]
    pub fn zeros(shape: &[usize], dtype: DType) -> Array {
        Array::filled("zeros", shape, 0.0, dtype)
    }

    /// Zeros with this array's shape (symbolic dims included) and dtype,
    /// built by broadcasting a scalar, so that nothing large is
    /// materialised until a kernel writes it.
    ///
    /// ```
    /// use kiln::Array;
    /// let x = Array::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// assert_eq!(x.zeros_like().to_vec::<f32>()?, vec![0.0, 0.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn zeros_like(&self) -> Array {
        Array::scalar(0.0, self.dtype()).broadcast_to(self.shape().clone())
    }

    /// Ones of `shape` and `dtype`.
    #[track_caller]
    pub fn ones(shape: &[usize], dtype: DType) -> Array {
        Array::filled("ones", shape, 1.0, dtype)
    }

    /// `full` under the name `op` (the constructor the user called).
    #[track_caller]
    fn filled(op: &str, shape: &[usize], value: f64, dtype: DType) -> Array {
        let data = check_shape(op, shape, dtype)
            .and_then(|len| HostData::try_filled(op, dtype, len, value));
        match data {
            Ok(data) => Array::from_host(Arc::new(data), Shape::known(shape)),
            Err(e) => Array::failed(e),
        }
    }

    /// `start, start + step, ...` below `stop` (above, for a negative step).
    pub fn arange(start: f64, stop: f64, step: f64, dtype: DType) -> Result<Array> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !stop.is_finite() {
            return Err(arg_err(
                "arange",
                format!("needs finite bounds and a non-zero step, got start={start} stop={stop} step={step}"),
            ));
        }
        let count = ((stop - start) / step).ceil().max(0.0);
        // `as` saturates, and every size check rejects usize::MAX.
        let len = if count.is_finite() {
            count as usize
        } else {
            usize::MAX
        };
        check_shape("arange", &[len], dtype)?;
        let values = (0..len).map(|i| start + step * i as f64);
        let data = HostData::try_from_f64s("arange", dtype, len, values)?;
        Ok(Array::from_host(Arc::new(data), Shape::known(&[len])))
    }

    /// Samples of a normal distribution from `key`; element `i` depends only
    /// on the key and `i`, on every platform.
    pub fn random_normal(key: crate::random::Key, shape: &[usize], dtype: DType) -> Result<Array> {
        let len = check_shape("random_normal", shape, dtype)?;
        let data = crate::random::normal(key.seed(), len, 0.0, 1.0, dtype)?;
        Ok(Array::from_host(Arc::new(data), Shape::known(shape)))
    }

    /// Samples of a uniform distribution on `[low, high)` from `key`.
    pub fn random_uniform(
        key: crate::random::Key,
        shape: &[usize],
        low: f64,
        high: f64,
        dtype: DType,
    ) -> Result<Array> {
        let len = check_shape("random_uniform", shape, dtype)?;
        let data = crate::random::uniform(key.seed(), len, low, high, dtype)?;
        Ok(Array::from_host(Arc::new(data), Shape::known(shape)))
    }
    /// Integers uniform on `[low, high)` from `key`, for an integer `dtype`
    /// (i32, u32, u8); element `i` depends only on the key and `i`, on
    /// every platform. `Err` when `low >= high`, when `dtype` is not an
    /// integer dtype, or when the range does not fit in it.
    ///
    /// ```
    /// use kiln::{random::Key, Array, DType};
    /// let tokens = Array::random_randint(Key::new(0), &[2, 3], 0, 50, DType::I32)?;
    /// assert_eq!(tokens.shape().to_string(), "[2,3]");
    /// assert!(tokens.to_vec::<i32>()?.iter().all(|t| (0..50).contains(t)));
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn random_randint(
        key: crate::random::Key,
        shape: &[usize],
        low: i64,
        high: i64,
        dtype: DType,
    ) -> Result<Array> {
        let len = check_shape("random_randint", shape, dtype)?;
        let data = crate::random::randint(key.seed(), len, low, high, dtype)?;
        Ok(Array::from_host(Arc::new(data), Shape::known(shape)))
    }
}
