//! `Array`: a cheap, clonable handle to a node of the lazy graph.
//!
//! Ops never fail at the call site: a shape or dtype error makes a *failed*
//! array that carries the error, every op on a failed array passes the first
//! error on, and it surfaces as an `Err` from [`Array::eval`], the readers,
//! or the compiled call. This keeps `x.exp() * 2.0 + &y` readable while bad
//! input still ends as an `Err` naming the op and the shapes.

use crate::buffer::{host_data, DeviceBuffer, ReadBack};
use crate::data::HostData;
use crate::error::{arg_err, Error, Result};
use crate::limits::check_aval;
use crate::location::{
    composition_call_site, current_composition, current_location, SourceLocation,
};
use crate::ops::{Condition, Guard, Op, ShapeCx};
use crate::shape::{Aval, Shape};
use crate::DType;
use std::fmt;
use std::panic::Location;
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
    /// The value once computed and on the host (always set for `Data`
    /// made from host data).
    pub(crate) value: OnceLock<Arc<HostData>>,
    /// The value once computed on a device that keeps it (a GPU buffer):
    /// read back into `value` when someone reads it.
    pub(crate) resident: OnceLock<Resident>,
    /// Where the user's program made it, when a front end said.
    pub(crate) location: Option<SourceLocation>,
    /// The `nn` composition that made it, if one did.
    pub(crate) composition: Option<&'static str>,
}

/// A value kept on the device that computed it.
pub(crate) struct Resident {
    pub(crate) device: Arc<dyn ReadBack>,
    pub(crate) buffer: DeviceBuffer,
}

pub(crate) enum NodeKind {
    /// Concrete data given at creation, or a device's result.
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
    /// overflow the stack. A value no one else holds goes to the host pool,
    /// for the next output of its size.
    fn drop(&mut self) {
        if let Some(value) = self.value.take().and_then(Arc::into_inner) {
            crate::pool::give_back(value);
        }
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
    #[track_caller]
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
                resident: OnceLock::new(),
                location: current_location(),
                composition: current_composition(),
            }),
        }
    }

    /// An array of known `shape` holding `data` (lengths already checked).
    #[track_caller]
    pub(crate) fn from_host(data: Arc<HostData>, shape: Shape) -> Array {
        let aval = Aval::new(shape, data.dtype());
        Array::make(aval, NodeKind::Data, Some(data))
    }

    /// An array of known `shape` whose value is `buffer` on `device`: host
    /// data at once when it is a host buffer, else read back on demand.
    #[track_caller]
    pub(crate) fn from_device(
        device: Arc<dyn ReadBack>,
        buffer: DeviceBuffer,
        shape: Shape,
        dtype: DType,
    ) -> Array {
        if let Some(data) = host_data(&buffer) {
            return Array::from_host(data, shape);
        }
        let array = Array::make(Aval::new(shape, dtype), NodeKind::Data, None);
        array.set_resident(device, buffer);
        array
    }

    /// A traced argument.
    #[track_caller]
    pub(crate) fn param(trace: u64, index: usize, aval: Aval) -> Array {
        Array::make(aval, NodeKind::Param { trace, index }, None)
    }

    /// A failed array carrying `error`: what a function built of ops
    /// returns for input it cannot take (a layer given a bad size), so
    /// that the error surfaces, like an op's, where the array is used or
    /// read. The error names the Rust line that called the op (the caller
    /// of the outermost composition being built, else the caller of the
    /// `#[track_caller]` chain that got here).
    ///
    /// ```
    /// use kiln::{Array, Error};
    /// let bad = Array::failed(Error::InvalidArgument { op: "mine".into(), detail: "no".into(), at: None });
    /// assert!((bad.exp() + 1.0).check().is_err());
    /// ```
    #[track_caller]
    pub fn failed(error: Error) -> Array {
        let site = composition_call_site().unwrap_or(Location::caller());
        let error = error.called_at(site);
        Array::make(
            Aval::new(Shape::scalar(), DType::F32),
            NodeKind::Failed(error),
            None,
        )
    }

    /// Applies `op` to `inputs`: runs its shape rule now and builds a pending
    /// node (or a failed one).
    #[track_caller]
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
            Ok(aval) => {
                // Later shape checks of the trace may rely on what the rule
                // assumed.
                for guard in &cx.guards {
                    if let Condition::Equal(a, b) = &guard.condition {
                        crate::symbolic::assume_equal(&guard.op, a, b);
                    }
                }
                Array::make(
                    aval,
                    NodeKind::Op {
                        op,
                        inputs: Mutex::new(inputs),
                        guards: cx.guards,
                    },
                    None,
                )
            }
            Err(e) => Array::failed(e),
        }
    }

    // ----- creation -------------------------------------------------------

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

    /// The bytes its elements take, when every dim is known.
    pub fn nbytes(&self) -> Option<usize> {
        self.node
            .aval
            .shape
            .numel_known()
            .map(|n| n * self.dtype().size_bytes())
    }

    /// Where the user's program made this array, if the front end set a
    /// location while it was built (see [`crate::at_location`]).
    pub fn location(&self) -> Option<SourceLocation> {
        self.node.location
    }

    /// The `nn` composition that made it (`softmax`, `layer_norm`), if
    /// one did (see [`crate::in_composition`]).
    pub fn composition(&self) -> Option<&'static str> {
        self.node.composition
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

    /// True when the value is computed, on the host or kept on a device.
    pub fn is_computed(&self) -> bool {
        self.is_materialized() || self.node.resident.get().is_some()
    }

    /// The device that keeps the value, when it was computed there and not
    /// read back yet (`None` for host values and pending arrays).
    pub fn device_name(&self) -> Option<&str> {
        match self.node.resident.get() {
            Some(r) if !self.is_materialized() => Some(r.device.name()),
            _ => None,
        }
    }

    /// True for a traced argument (inside `compile`).
    pub fn is_tracer(&self) -> bool {
        matches!(self.node.kind, NodeKind::Param { .. })
    }

    pub(crate) fn value(&self) -> Option<&Arc<HostData>> {
        self.node.value.get()
    }

    /// The value's buffer on the device named `device`, if it is kept
    /// there.
    pub(crate) fn buffer_on(&self, device: &str) -> Option<DeviceBuffer> {
        self.node
            .resident
            .get()
            .filter(|r| r.device.name() == device)
            .map(|r| r.buffer.clone())
    }

    /// The value as host data, read back (blocking) from the device that
    /// keeps it if need be; `None` while it is pending or a tracer.
    pub(crate) fn host_value(&self) -> Result<Option<Arc<HostData>>> {
        if let Some(value) = self.value() {
            return Ok(Some(value.clone()));
        }
        match self.node.resident.get() {
            Some(r) => {
                let data = r.device.download(&r.buffer)?;
                self.set_value(data.clone());
                Ok(Some(data))
            }
            None => Ok(None),
        }
    }

    /// Reads the value back from the device that keeps it without blocking
    /// (nothing to do for host values).
    pub(crate) async fn read_back(&self) -> Result<()> {
        if self.is_materialized() {
            return Ok(());
        }
        if let Some(r) = self.node.resident.get() {
            let data = r.device.download_async(&r.buffer).await?;
            self.set_value(data);
        }
        Ok(())
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

    /// Records a value kept on `device` and forgets the inputs that
    /// produced it.
    pub(crate) fn set_resident(&self, device: Arc<dyn ReadBack>, buffer: DeviceBuffer) {
        if self.node.resident.set(Resident { device, buffer }).is_ok() {
            if let NodeKind::Op { inputs, .. } = &self.node.kind {
                let taken = std::mem::take(&mut *inputs.lock().unwrap_or_else(|p| p.into_inner()));
                drop(taken);
            }
        }
    }

    // ----- elementwise ----------------------------------------------------

    /// `Err` with this array's own error when an op that built it failed:
    /// a failed array has no real rank, so an op that reads axes or shapes
    /// must pass the first error on before it looks at them.
    pub(crate) fn first_error(&self) -> Result<()> {
        match self.error() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// `axis` for this array, counted from the end when negative.
    pub(crate) fn normalize_axis(&self, op: &str, axis: isize) -> Result<usize> {
        self.first_error()?;
        normalize_axis(op, axis, self.ndim())
    }

    pub(crate) fn normalize_axes(&self, op: &str, axes: &[isize]) -> Result<Vec<usize>> {
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

    // ----- matmul ---------------------------------------------------------

    // ----- layout -------------------------------------------------------
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
