//! `Array`: a cheap, clonable handle to a node of the lazy graph.
//!
//! Ops never fail at the call site: a shape or dtype error makes a *failed*
//! array that carries the error, every op on a failed array passes the first
//! error on, and it surfaces as an `Err` from [`Array::eval`], the readers,
//! or the compiled call. This keeps `x.exp() * 2.0 + &y` readable while bad
//! input still ends as an `Err` naming the op and the shapes.

use crate::data::{HostData, HostElement};
use crate::error::{arg_err, Error, Result};
use crate::limits::{check_aval, check_shape};
use crate::ops::{BinaryOp, Guard, Op, ReduceOp, ShapeCx, SliceAxis, UnaryOp};
use crate::shape::{Aval, Dim, Shape};
use crate::DType;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

/// A handle to an array value: data, a pending op, or a traced value.
///
/// ```
/// use kiln::{Array, DType};
/// let x = Array::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
/// let y = (x.exp() * 2.0 + 1.0).sum_all();
/// assert!((y.item::<f32>()? - (2.0 * (1f32.exp() + 2f32.exp() + 3f32.exp()) + 3.0)).abs() < 1e-4);
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Clone)]
pub struct Array {
    pub(crate) node: Arc<Node>,
}

pub(crate) struct Node {
    pub(crate) aval: Aval,
    pub(crate) kind: NodeKind,
    /// The value once computed (always set for `Data`).
    pub(crate) value: OnceLock<Arc<HostData>>,
}

pub(crate) enum NodeKind {
    /// Concrete data given at creation.
    Data,
    /// Argument `index` of the trace with id `trace`.
    Param { trace: u64, index: usize },
    /// A pending op. The inputs are dropped once the value is computed, so
    /// long eager loops do not keep their whole history alive.
    Op {
        op: Op,
        inputs: Mutex<Vec<Array>>,
        guards: Vec<Guard>,
    },
    /// An op whose shape rule rejected its operands.
    Failed(Error),
}

impl Drop for Node {
    /// Drops chains of pending ops iteratively: a 10,000-op chain must not
    /// overflow the stack.
    fn drop(&mut self) {
        if let NodeKind::Op { inputs, .. } = &mut self.kind {
            let mut stack = std::mem::take(inputs.get_mut().unwrap_or_else(|p| p.into_inner()));
            while let Some(array) = stack.pop() {
                if let Ok(mut node) = Arc::try_unwrap(array.node) {
                    if let NodeKind::Op { inputs, .. } = &mut node.kind {
                        stack.append(inputs.get_mut().unwrap_or_else(|p| p.into_inner()));
                    }
                }
            }
        }
    }
}

impl Array {
    fn make(aval: Aval, kind: NodeKind, value: Option<Arc<HostData>>) -> Array {
        let cell = OnceLock::new();
        if let Some(v) = value {
            let _ = cell.set(v);
        }
        Array {
            node: Arc::new(Node {
                aval,
                kind,
                value: cell,
            }),
        }
    }

    /// An array of known `shape` holding `data` (lengths already checked).
    pub(crate) fn from_host(data: Arc<HostData>, shape: Shape) -> Array {
        let aval = Aval::new(shape, data.dtype());
        Array::make(aval, NodeKind::Data, Some(data))
    }

    /// A traced argument.
    pub(crate) fn param(trace: u64, index: usize, aval: Aval) -> Array {
        Array::make(aval, NodeKind::Param { trace, index }, None)
    }

    /// A failed array carrying `error`.
    pub(crate) fn failed(error: Error) -> Array {
        Array::make(
            Aval::new(Shape::scalar(), DType::F32),
            NodeKind::Failed(error),
            None,
        )
    }

    /// Applies `op` to `inputs`: runs its shape rule now and builds a pending
    /// node (or a failed one).
    pub fn apply(op: Op, inputs: Vec<Array>) -> Array {
        if let Some(err) = inputs.iter().find_map(|a| a.error()) {
            return Array::failed(err.clone());
        }
        let avals: Vec<&Aval> = inputs.iter().map(|a| a.aval()).collect();
        let mut cx = ShapeCx::new();
        let checked = op
            .shape_rule(&avals, &mut cx)
            .and_then(|aval| check_aval(op.name(), &aval).map(|()| aval));
        match checked {
            Ok(aval) => Array::make(
                aval,
                NodeKind::Op {
                    op,
                    inputs: Mutex::new(inputs),
                    guards: cx.guards,
                },
                None,
            ),
            Err(e) => Array::failed(e),
        }
    }

    // ----- creation -------------------------------------------------------

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
    pub fn scalar(value: f64, dtype: DType) -> Array {
        Array::filled("scalar", &[], value, dtype)
    }

    /// An array of `shape` filled with `value` converted to `dtype`; a
    /// shape too large for [`crate::Limits`] or for memory makes a failed
    /// array.
    pub fn full(shape: &[usize], value: f64, dtype: DType) -> Array {
        Array::filled("full", shape, value, dtype)
    }

    /// Zeros of `shape` and `dtype`.
    pub fn zeros(shape: &[usize], dtype: DType) -> Array {
        Array::filled("zeros", shape, 0.0, dtype)
    }

    /// Ones of `shape` and `dtype`.
    pub fn ones(shape: &[usize], dtype: DType) -> Array {
        Array::filled("ones", shape, 1.0, dtype)
    }

    /// `full` under the name `op` (the constructor the user called).
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

    // ----- inspection ---------------------------------------------------

    /// The abstract value (shape and dtype).
    pub fn aval(&self) -> &Aval {
        &self.node.aval
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.node.aval.shape
    }

    /// The sizes, when every dim is known (always, outside a shapeless trace).
    pub fn dims(&self) -> Option<Vec<usize>> {
        self.node.aval.shape.as_known()
    }

    /// Number of dims.
    pub fn ndim(&self) -> usize {
        self.node.aval.shape.rank()
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.node.aval.dtype
    }

    /// The error this array carries, if an op that built it failed.
    pub fn error(&self) -> Option<&Error> {
        match &self.node.kind {
            NodeKind::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// `Ok(self)` unless an op that built it failed.
    pub fn check(self) -> Result<Array> {
        match self.error() {
            Some(e) => Err(e.clone()),
            None => Ok(self),
        }
    }

    /// True when the value is computed and held on the host.
    pub fn is_materialized(&self) -> bool {
        self.node.value.get().is_some()
    }

    /// True for a traced argument (inside `compile`).
    pub fn is_tracer(&self) -> bool {
        matches!(self.node.kind, NodeKind::Param { .. })
    }

    pub(crate) fn value(&self) -> Option<&Arc<HostData>> {
        self.node.value.get()
    }

    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.node) as usize
    }

    /// Records a computed value and forgets the inputs that produced it.
    pub(crate) fn set_value(&self, value: Arc<HostData>) {
        if self.node.value.set(value).is_ok() {
            if let NodeKind::Op { inputs, .. } = &self.node.kind {
                let taken = std::mem::take(&mut *inputs.lock().unwrap_or_else(|p| p.into_inner()));
                drop(taken);
            }
        }
    }

    // ----- execution ----------------------------------------------------

    /// Computes the value if it is pending (through the cached eager
    /// pipeline: passes + CPU executor).
    pub fn eval(&self) -> Result<()> {
        crate::eval::eval(std::slice::from_ref(self))
    }

    /// The computed host data.
    pub fn data(&self) -> Result<Arc<HostData>> {
        self.eval()?;
        self.value().cloned().ok_or_else(|| Error::ReadTracer {
            aval: self.aval().to_string(),
        })
    }

    /// The elements as `T`, which must be the array's dtype.
    pub fn to_vec<T: HostElement>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() && self.error().is_none() {
            return Err(Error::ReadBack {
                aval: self.aval().to_string(),
                requested: format!("Vec<{}>; cast it first", T::DTYPE),
            });
        }
        let data = self.data()?;
        Ok(T::slice(&data).map(<[T]>::to_vec).unwrap_or_default())
    }

    /// The single element of a size-1 array.
    pub fn item<T: HostElement>(&self) -> Result<T> {
        let values = self.to_vec::<T>()?;
        match values.as_slice() {
            [v] => Ok(*v),
            _ => Err(Error::ReadBack {
                aval: self.aval().to_string(),
                requested: format!("a single {}", T::DTYPE),
            }),
        }
    }

    // ----- elementwise ----------------------------------------------------

    fn unary(&self, op: UnaryOp) -> Array {
        Array::apply(Op::Unary(op), vec![self.clone()])
    }

    fn binary(&self, op: BinaryOp, rhs: impl Operand) -> Array {
        let rhs = rhs.into_array(self.dtype());
        Array::apply(Op::Binary(op), vec![self.clone(), rhs])
    }

    /// `-x`.
    pub fn neg(&self) -> Array {
        self.unary(UnaryOp::Neg)
    }
    /// `|x|`.
    pub fn abs(&self) -> Array {
        self.unary(UnaryOp::Abs)
    }
    /// `e^x`.
    pub fn exp(&self) -> Array {
        self.unary(UnaryOp::Exp)
    }
    /// Natural logarithm.
    pub fn log(&self) -> Array {
        self.unary(UnaryOp::Log)
    }
    /// Sine.
    pub fn sin(&self) -> Array {
        self.unary(UnaryOp::Sin)
    }
    /// Cosine.
    pub fn cos(&self) -> Array {
        self.unary(UnaryOp::Cos)
    }
    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Array {
        self.unary(UnaryOp::Tanh)
    }
    /// Square root.
    pub fn sqrt(&self) -> Array {
        self.unary(UnaryOp::Sqrt)
    }
    /// `1 / sqrt(x)`.
    pub fn rsqrt(&self) -> Array {
        self.unary(UnaryOp::Rsqrt)
    }
    /// `1 / (1 + e^-x)`.
    pub fn sigmoid(&self) -> Array {
        self.unary(UnaryOp::Sigmoid)
    }
    /// `max(x, 0)`.
    pub fn relu(&self) -> Array {
        self.unary(UnaryOp::Relu)
    }
    /// The error function.
    pub fn erf(&self) -> Array {
        self.unary(UnaryOp::Erf)
    }

    /// `self ** rhs` (floats).
    pub fn pow(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Pow, rhs)
    }
    /// Elementwise maximum.
    pub fn maximum(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Maximum, rhs)
    }
    /// Elementwise minimum.
    pub fn minimum(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Minimum, rhs)
    }
    /// `self == rhs` as bool.
    pub fn equal(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Eq, rhs)
    }
    /// `self != rhs` as bool.
    pub fn not_equal(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Ne, rhs)
    }
    /// `self < rhs` as bool.
    pub fn less(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Lt, rhs)
    }
    /// `self <= rhs` as bool.
    pub fn less_equal(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Le, rhs)
    }
    /// `self > rhs` as bool.
    pub fn greater(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Gt, rhs)
    }
    /// `self >= rhs` as bool.
    pub fn greater_equal(&self, rhs: impl Operand) -> Array {
        self.binary(BinaryOp::Ge, rhs)
    }

    /// `where(self, on_true, on_false)` with `self` a bool condition.
    pub fn select(&self, on_true: impl Operand, on_false: impl Operand) -> Array {
        // Numbers take the dtype of the array branch (f32 if both are numbers).
        let dtype = on_true.dtype().or(on_false.dtype()).unwrap_or(DType::F32);
        Array::apply(
            Op::Select,
            vec![
                self.clone(),
                on_true.into_array(dtype),
                on_false.into_array(dtype),
            ],
        )
    }

    /// Elementwise conversion to `dtype`.
    pub fn cast(&self, dtype: DType) -> Array {
        Array::apply(Op::Cast(dtype), vec![self.clone()])
    }

    // ----- reductions ---------------------------------------------------

    /// `Err` with this array's own error when an op that built it failed:
    /// a failed array has no real rank, so an op that reads axes or shapes
    /// must pass the first error on before it looks at them.
    fn first_error(&self) -> Result<()> {
        match self.error() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// `axis` for this array, counted from the end when negative.
    fn normalize_axis(&self, op: &str, axis: isize) -> Result<usize> {
        self.first_error()?;
        normalize_axis(op, axis, self.ndim())
    }

    fn normalize_axes(&self, op: &str, axes: &[isize]) -> Result<Vec<usize>> {
        self.first_error()?;
        let rank = self.ndim();
        let mut out = Vec::with_capacity(axes.len());
        for &a in axes {
            let n = normalize_axis(op, a, rank)?;
            if out.contains(&n) {
                return Err(arg_err(op, format!("axis {a} given twice in {axes:?}")));
            }
            out.push(n);
        }
        out.sort_unstable();
        Ok(out)
    }

    fn reduce(&self, op: ReduceOp, axes: &[isize], keepdims: bool) -> Array {
        match self.normalize_axes(op.name(), axes) {
            Ok(axes) => Array::apply(Op::Reduce { op, axes, keepdims }, vec![self.clone()]),
            Err(e) => Array::failed(e),
        }
    }

    fn all_axes(&self) -> Vec<isize> {
        (0..self.ndim() as isize).collect()
    }

    /// Sum over `axes` (negative counts from the end).
    pub fn sum(&self, axes: &[isize], keepdims: bool) -> Array {
        self.reduce(ReduceOp::Sum, axes, keepdims)
    }
    /// Sum of every element (a scalar).
    pub fn sum_all(&self) -> Array {
        self.sum(&self.all_axes(), false)
    }
    /// Maximum over `axes`.
    pub fn max(&self, axes: &[isize], keepdims: bool) -> Array {
        self.reduce(ReduceOp::Max, axes, keepdims)
    }
    /// Minimum over `axes`.
    pub fn min(&self, axes: &[isize], keepdims: bool) -> Array {
        self.reduce(ReduceOp::Min, axes, keepdims)
    }
    /// Mean over `axes`: the sum divided by the element count (known per
    /// call in a shapeless compile); NaN over an empty axis.
    ///
    /// As in JAX, integer and bool arrays average to f32, and f16/bf16 sum
    /// and divide in f32 and round once at the end, so neither a sum above
    /// the 16-bit range (65,504 for f16) nor a count above it (or above 255
    /// for u8) spoils the result.
    ///
    /// ```
    /// use kiln::{Array, DType};
    /// let bytes = Array::full(&[300], 200.0, DType::U8);
    /// assert_eq!(bytes.mean_all().to_vec::<f32>().unwrap(), [200.0]);
    /// ```
    pub fn mean(&self, axes: &[isize], keepdims: bool) -> Array {
        match self.normalize_axes("mean", axes) {
            Ok(norm) => {
                let count = Array::apply(
                    Op::DimSize {
                        axes: norm,
                        dtype: DType::F32,
                    },
                    vec![self.clone()],
                );
                let wide = match self.dtype() {
                    DType::F32 => self.clone(),
                    _ => self.cast(DType::F32),
                };
                let mean = wide.sum(axes, keepdims) / count;
                match self.dtype() {
                    DType::F16 | DType::BF16 => mean.cast(self.dtype()),
                    _ => mean,
                }
            }
            Err(e) => Array::failed(e),
        }
    }
    /// Mean of every element.
    pub fn mean_all(&self) -> Array {
        self.mean(&self.all_axes(), false)
    }
    /// Index (u32) of the maximum along `axis`, first on ties.
    pub fn argmax(&self, axis: isize, keepdims: bool) -> Array {
        match self.normalize_axis("argmax", axis) {
            Ok(axis) => Array::apply(Op::ArgMax { axis, keepdims }, vec![self.clone()]),
            Err(e) => Array::failed(e),
        }
    }

    // ----- matmul ---------------------------------------------------------

    /// Matrix product with NumPy semantics: rank-1 operands are promoted
    /// (and the added axis removed), batch dims broadcast.
    pub fn matmul(&self, rhs: &Array) -> Array {
        let lhs_vec = self.ndim() == 1;
        let rhs_vec = rhs.ndim() == 1;
        let a = if lhs_vec {
            self.expand_dims(0)
        } else {
            self.clone()
        };
        let b = if rhs_vec {
            rhs.expand_dims(1)
        } else {
            rhs.clone()
        };
        let mut out = Array::apply(Op::Matmul, vec![a, b]);
        if rhs_vec {
            out = out.squeeze(&[-1]);
        }
        if lhs_vec {
            out = out.squeeze(&[-2 + rhs_vec as isize]);
        }
        out
    }

    // ----- layout -------------------------------------------------------

    /// Same elements in a new shape; one entry may be `-1` (inferred).
    pub fn reshape(&self, shape: &[i64]) -> Array {
        match self.infer_reshape(shape) {
            Ok(target) => self.reshape_to(target),
            Err(e) => Array::failed(e),
        }
    }

    fn infer_reshape(&self, shape: &[i64]) -> Result<Shape> {
        self.first_error()?;
        let infer: Vec<usize> = (0..shape.len()).filter(|&i| shape[i] == -1).collect();
        if infer.len() > 1 || shape.iter().any(|&d| d < -1) {
            return Err(arg_err(
                "reshape",
                format!("target {shape:?} may hold one -1 and otherwise sizes ≥ 0"),
            ));
        }
        // Saturating: the result's size check rejects an absurd target.
        let known = shape
            .iter()
            .filter(|&&d| d >= 0)
            .fold(1usize, |acc, &d| acc.saturating_mul(d as usize));
        let mut dims: Vec<Dim> = shape
            .iter()
            .map(|&d| Dim::Known(d.max(0) as usize))
            .collect();
        if let Some(&i) = infer.first() {
            let numel = self.shape().numel();
            dims[i] = match numel {
                Dim::Known(n) if known == 0 || n % known != 0 => {
                    return Err(crate::error::shape_err(
                        "reshape",
                        &[self.aval()],
                        format!("cannot infer -1 in {shape:?}: {n} elements are not a multiple of {known}"),
                    ))
                }
                Dim::Known(n) => Dim::Known(n / known),
                Dim::Sym(e) => Dim::from_expr(e.floor_div(known.max(1) as u64)),
            };
        }
        Ok(Shape(dims))
    }

    /// Same elements in the given shape (dims may be symbolic).
    pub fn reshape_to(&self, shape: impl Into<Shape>) -> Array {
        let shape = shape.into();
        if *self.shape() == shape {
            return self.clone();
        }
        Array::apply(Op::Reshape(shape), vec![self.clone()])
    }

    /// Permutes the axes: output axis `i` is input axis `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Array {
        Array::apply(Op::Permute(perm.to_vec()), vec![self.clone()])
    }

    /// Reverses the axes (matrix transpose for rank 2).
    pub fn transpose(&self) -> Array {
        let perm: Vec<usize> = (0..self.ndim()).rev().collect();
        self.permute(&perm)
    }

    /// Swaps two axes.
    pub fn swap_axes(&self, a: isize, b: isize) -> Array {
        let rank = self.ndim();
        match (
            self.normalize_axis("swap_axes", a),
            self.normalize_axis("swap_axes", b),
        ) {
            (Ok(a), Ok(b)) => {
                let mut perm: Vec<usize> = (0..rank).collect();
                perm.swap(a, b);
                self.permute(&perm)
            }
            (Err(e), _) | (_, Err(e)) => Array::failed(e),
        }
    }

    /// NumPy broadcast to `shape`.
    pub fn broadcast_to(&self, shape: impl Into<Shape>) -> Array {
        let shape = shape.into();
        if *self.shape() == shape {
            return self.clone();
        }
        Array::apply(Op::BroadcastTo(shape), vec![self.clone()])
    }

    /// Strided slice with one [`SliceAxis`] per dim.
    pub fn slice(&self, axes: &[SliceAxis]) -> Array {
        Array::apply(Op::Slice(axes.to_vec()), vec![self.clone()])
    }

    /// Slice of one axis: `start..stop` by `step`, other axes whole.
    pub fn slice_axis(&self, axis: isize, start: i64, stop: Option<i64>, step: i64) -> Array {
        match self.normalize_axis("slice", axis) {
            Ok(axis) => {
                let mut axes = vec![SliceAxis::full(); self.ndim()];
                axes[axis] = SliceAxis { start, stop, step };
                self.slice(&axes)
            }
            Err(e) => Array::failed(e),
        }
    }

    /// Inserts a size-1 axis at `axis` (negative counts from the end of the result).
    pub fn expand_dims(&self, axis: isize) -> Array {
        let axis = self
            .first_error()
            .and_then(|()| normalize_axis("expand_dims", axis, self.ndim() + 1));
        match axis {
            Ok(axis) => {
                let mut dims = self.shape().0.clone();
                dims.insert(axis, Dim::Known(1));
                Array::apply(Op::Reshape(Shape(dims)), vec![self.clone()])
            }
            Err(e) => Array::failed(e),
        }
    }

    /// Removes the given size-1 axes (all size-1 axes when empty).
    pub fn squeeze(&self, axes: &[isize]) -> Array {
        if self.error().is_some() {
            return self.clone();
        }
        let dims = &self.shape().0;
        let axes = if axes.is_empty() {
            (0..dims.len())
                .filter(|&i| dims[i] == Dim::Known(1))
                .collect()
        } else {
            match self.normalize_axes("squeeze", axes) {
                Ok(a) => a,
                Err(e) => return Array::failed(e),
            }
        };
        if let Some(&bad) = axes.iter().find(|&&i| dims[i] != Dim::Known(1)) {
            return Array::failed(crate::error::shape_err(
                "squeeze",
                &[self.aval()],
                format!("axis {bad} has size {}, not 1", dims[bad]),
            ));
        }
        let kept: Vec<Dim> = (0..dims.len())
            .filter(|i| !axes.contains(i))
            .map(|i| dims[i].clone())
            .collect();
        Array::apply(Op::Reshape(Shape(kept)), vec![self.clone()])
    }

    /// NumPy `take`: entries along `axis` picked by integer `indices`.
    pub fn take(&self, indices: &Array, axis: isize) -> Array {
        if indices.error().is_some() && self.error().is_none() {
            return indices.clone();
        }
        match self.normalize_axis("take", axis) {
            Ok(axis) => Array::apply(Op::Take { axis }, vec![self.clone(), indices.clone()]),
            Err(e) => Array::failed(e),
        }
    }
}

/// Concatenates arrays along `axis`.
pub fn concat(arrays: &[Array], axis: isize) -> Array {
    if let Some(failed) = arrays.iter().find(|a| a.error().is_some()) {
        return failed.clone();
    }
    let rank = arrays.first().map_or(0, Array::ndim);
    match normalize_axis("concat", axis, rank) {
        Ok(axis) => Array::apply(Op::Concat { axis }, arrays.to_vec()),
        Err(e) => Array::failed(e),
    }
}

/// `where(cond, on_true, on_false)`.
pub fn select(cond: &Array, on_true: impl Operand, on_false: impl Operand) -> Array {
    cond.select(on_true, on_false)
}

/// Normalizes a possibly negative axis for an array of `rank` dims.
pub(crate) fn normalize_axis(op: &str, axis: isize, rank: usize) -> Result<usize> {
    let n = if axis < 0 { axis + rank as isize } else { axis };
    if n < 0 || n as usize >= rank {
        return Err(arg_err(
            op,
            format!("axis {axis} is out of range for rank {rank}"),
        ));
    }
    Ok(n as usize)
}

/// Something usable as an op operand: an array, or a Rust number that
/// becomes a scalar of the other operand's dtype.
pub trait Operand {
    /// The dtype of an array operand; `None` for a number.
    fn dtype(&self) -> Option<DType>;
    /// The operand as an array; numbers take `dtype`.
    fn into_array(self, dtype: DType) -> Array;
}

impl Operand for Array {
    fn dtype(&self) -> Option<DType> {
        Some(Array::dtype(self))
    }
    fn into_array(self, _: DType) -> Array {
        self
    }
}

impl Operand for &Array {
    fn dtype(&self) -> Option<DType> {
        Some(Array::dtype(self))
    }
    fn into_array(self, _: DType) -> Array {
        self.clone()
    }
}

macro_rules! number_operand {
    ($($t:ty),*) => {$(
        impl Operand for $t {
            fn dtype(&self) -> Option<DType> {
                None
            }
            fn into_array(self, dtype: DType) -> Array {
                Array::scalar(self as f64, dtype)
            }
        }
    )*};
}
number_operand!(f32, f64);

macro_rules! integer_operand {
    ($($t:ty),*) => {$(
        impl Operand for $t {
            fn dtype(&self) -> Option<DType> {
                None
            }
            fn into_array(self, dtype: DType) -> Array {
                // Rounded once from the exact integer: `self as f64` would
                // round an i64 or usize above 2^53 twice.
                Array::scalar(dtype.round_integer(self as i128), dtype)
            }
        }
    )*};
}
integer_operand!(i32, i64, u32, usize);

macro_rules! operator {
    ($trait:ident, $method:ident, $op:expr) => {
        impl<R: Operand> std::ops::$trait<R> for Array {
            type Output = Array;
            fn $method(self, rhs: R) -> Array {
                self.binary($op, rhs)
            }
        }
        impl<R: Operand> std::ops::$trait<R> for &Array {
            type Output = Array;
            fn $method(self, rhs: R) -> Array {
                self.binary($op, rhs)
            }
        }
        impl std::ops::$trait<Array> for f32 {
            type Output = Array;
            fn $method(self, rhs: Array) -> Array {
                Array::scalar(self as f64, rhs.dtype()).binary($op, rhs)
            }
        }
        impl std::ops::$trait<&Array> for f32 {
            type Output = Array;
            fn $method(self, rhs: &Array) -> Array {
                Array::scalar(self as f64, rhs.dtype()).binary($op, rhs)
            }
        }
    };
}
operator!(Add, add, BinaryOp::Add);
operator!(Sub, sub, BinaryOp::Sub);
operator!(Mul, mul, BinaryOp::Mul);
operator!(Div, div, BinaryOp::Div);

impl std::ops::Neg for Array {
    type Output = Array;
    fn neg(self) -> Array {
        Array::neg(&self)
    }
}

impl std::ops::Neg for &Array {
    type Output = Array;
    fn neg(self) -> Array {
        Array::neg(self)
    }
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.node.kind {
            NodeKind::Failed(e) => write!(f, "Array(error: {e})"),
            NodeKind::Param { index, .. } => write!(f, "Array(tracer #{index}: {})", self.aval()),
            NodeKind::Op { op, .. } if self.value().is_none() => {
                write!(f, "Array(pending {}: {})", op.name(), self.aval())
            }
            _ => write!(f, "Array({})", self.aval()),
        }
    }
}
