//! User kernels: an op a program brings itself, with a mandatory shape rule,
//! a CPU reference evaluation (the oracle) and, optionally, a WGSL kernel
//! for GPU backends.
//!
//! The shape rule is what keeps shapeless compile total (seed mlx #3485:
//! a kernel whose output shapes cannot be inferred breaks it), and the
//! dispatch grid is a function of each call's resolved shapes, never
//! captured at trace time, so a shapeless executable called with a larger
//! size still writes every element.
//!
//! # The WGSL interface
//!
//! A kernel's bindings are fixed by its description, not guessed from its
//! source: all live in `@group(0)`;
//! * `@binding(0)` — `var<storage, read> params: array<u32>`: the sizes of
//!   the call (see [`kernel_params`]);
//! * `@binding(1)` — `var<storage, read_write>`: the output (for an
//!   in-place kernel, it holds the in-place input's elements on entry);
//! * `@binding(2)`, `@binding(3)`, … — `var<storage, read>`: the inputs in
//!   order, leaving out an in-place input.
//!
//! Buffers are arrays of 32-bit elements (`f32`, `i32`, `u32`). Template
//! constants are appended to the source as module-scope `const`s (WGSL
//! declarations are order-independent, so naga's line numbers stay the
//! user's). [`KernelBuilder::build`] validates the source with naga and
//! checks its bindings against the description.

use super::ShapeCx;
use crate::data::HostData;
use crate::error::{Error, Result};
use crate::handle::array::Array;
use crate::shape::{Aval, Shape};
use crate::DType;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The value of a template constant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TemplateValue {
    /// A WGSL `u32`.
    U32(u32),
    /// A WGSL `i32`.
    I32(i32),
    /// A WGSL `f32`.
    F32(f32),
    /// A WGSL `bool`.
    Bool(bool),
}

impl TemplateValue {
    /// The WGSL type name.
    pub fn wgsl_type(&self) -> &'static str {
        match self {
            TemplateValue::U32(_) => "u32",
            TemplateValue::I32(_) => "i32",
            TemplateValue::F32(_) => "f32",
            TemplateValue::Bool(_) => "bool",
        }
    }

    /// The WGSL literal: `4u`, `-2i`, `0.5f`, `true`.
    pub fn wgsl_literal(&self) -> String {
        match self {
            TemplateValue::U32(v) => format!("{v}u"),
            TemplateValue::I32(v) => format!("{v}i"),
            TemplateValue::F32(v) if v.is_finite() => format!("{v:?}f"),
            TemplateValue::F32(v) => format!("bitcast<f32>({}u)", v.to_bits()),
            TemplateValue::Bool(v) => v.to_string(),
        }
    }

    /// The value as an `f64`, for reference evaluations.
    pub fn as_f64(&self) -> f64 {
        match *self {
            TemplateValue::U32(v) => v.into(),
            TemplateValue::I32(v) => v.into(),
            TemplateValue::F32(v) => v.into(),
            TemplateValue::Bool(v) => u8::from(v).into(),
        }
    }

    /// Equality by bits, so `NaN` templates compare equal to themselves
    /// (template values are part of an op's identity).
    fn same(&self, other: &TemplateValue) -> bool {
        match (self, other) {
            (TemplateValue::F32(a), TemplateValue::F32(b)) => a.to_bits() == b.to_bits(),
            (a, b) => a == b,
        }
    }

    fn hash_bits<H: Hasher>(&self, state: &mut H) {
        match *self {
            TemplateValue::U32(v) => (0u8, v).hash(state),
            TemplateValue::I32(v) => (1u8, v).hash(state),
            TemplateValue::F32(v) => (2u8, v.to_bits()).hash(state),
            TemplateValue::Bool(v) => (3u8, v).hash(state),
        }
    }
}

impl fmt::Display for TemplateValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateValue::U32(v) => write!(f, "{v}"),
            TemplateValue::I32(v) => write!(f, "{v}"),
            TemplateValue::F32(v) => write!(f, "{v}"),
            TemplateValue::Bool(v) => write!(f, "{v}"),
        }
    }
}

impl From<u32> for TemplateValue {
    fn from(v: u32) -> Self {
        TemplateValue::U32(v)
    }
}

impl From<i32> for TemplateValue {
    fn from(v: i32) -> Self {
        TemplateValue::I32(v)
    }
}

impl From<f32> for TemplateValue {
    fn from(v: f32) -> Self {
        TemplateValue::F32(v)
    }
}

impl From<bool> for TemplateValue {
    fn from(v: bool) -> Self {
        TemplateValue::Bool(v)
    }
}

/// What a reference evaluation gets for one call.
pub struct ReferenceArgs<'a> {
    /// The inputs' data, in order.
    pub inputs: &'a [&'a HostData],
    /// The inputs' shapes.
    pub shapes: &'a [&'a [usize]],
    /// The output shape the shape rule gave for these inputs.
    pub out_shape: &'a [usize],
    /// The output dtype the shape rule gave.
    pub out_dtype: DType,
    /// The template constants of this call.
    pub templates: &'a [(String, TemplateValue)],
}

impl ReferenceArgs<'_> {
    /// Template constant `name` as an `f64` (`None` if the kernel has none).
    pub fn template(&self, name: &str) -> Option<f64> {
        self.templates
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_f64())
    }
}

/// The resolved shapes a grid function sees for one call.
pub struct GridArgs<'a> {
    /// The inputs' shapes.
    pub inputs: &'a [&'a [usize]],
    /// The output's shape.
    pub output: &'a [usize],
    /// The entry point's `@workgroup_size`.
    pub workgroup_size: [u32; 3],
}

impl GridArgs<'_> {
    /// The output's element count.
    pub fn output_len(&self) -> usize {
        self.output.iter().product()
    }
}

type ShapeRuleFn = dyn Fn(&[&Aval], &mut ShapeCx) -> Result<Aval> + Send + Sync;
type ReferenceFn = dyn Fn(&ReferenceArgs<'_>) -> Result<HostData> + Send + Sync;
type GridFn = dyn Fn(&GridArgs<'_>) -> [u32; 3] + Send + Sync;

/// A kernel's WGSL part, validated by [`KernelBuilder::build`].
#[derive(Clone)]
pub struct WgslKernel {
    source: String,
    entry_point: String,
    workgroup_size: [u32; 3],
    /// The element type of each input binding (`None` for an in-place
    /// input, which is read through the output) and of the output.
    input_elements: Vec<Option<DType>>,
    output_element: DType,
    grid: Option<Arc<GridFn>>,
}

impl WgslKernel {
    /// The source as written (without template constants).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The entry point's name.
    pub fn entry_point(&self) -> &str {
        &self.entry_point
    }

    /// The entry point's `@workgroup_size`.
    pub fn workgroup_size(&self) -> [u32; 3] {
        self.workgroup_size
    }

    /// The source with `templates` appended as module-scope constants.
    pub fn instantiate(&self, templates: &[(String, TemplateValue)]) -> String {
        let mut source = self.source.clone();
        if !source.ends_with('\n') {
            source.push('\n');
        }
        for (name, value) in templates {
            source.push_str(&format!(
                "const {name}: {} = {};\n",
                value.wgsl_type(),
                value.wgsl_literal()
            ));
        }
        source
    }

    /// The workgroups to dispatch for one call: the kernel's grid function,
    /// or by default enough workgroups along x for one invocation per
    /// output element.
    pub fn grid(&self, args: &GridArgs<'_>) -> [u32; 3] {
        match &self.grid {
            Some(grid) => grid(args),
            None => {
                let per_group: u64 = self.workgroup_size.iter().map(|&w| u64::from(w)).product();
                let groups = (args.output_len() as u64).div_ceil(per_group.max(1));
                [u32::try_from(groups).unwrap_or(u32::MAX), 1, 1]
            }
        }
    }

    /// `Err` unless the dtypes of a call fit the element types the source
    /// declares for its bindings.
    pub fn check_dtypes(&self, kernel: &str, inputs: &[DType], output: DType) -> Result<()> {
        let mismatch = |binding: usize, declared: DType, given: DType| Error::Kernel {
            kernel: kernel.to_string(),
            detail: format!(
                "binding {binding} is declared as array<{}> but is given {given}",
                wgsl_element(declared)
            ),
        };
        if output != self.output_element {
            return Err(mismatch(1, self.output_element, output));
        }
        let mut binding = 2;
        for (&declared, &given) in self.input_elements.iter().zip(inputs) {
            if let Some(declared) = declared {
                if declared != given {
                    return Err(mismatch(binding, declared, given));
                }
                binding += 1;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for WgslKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgslKernel")
            .field("entry_point", &self.entry_point)
            .field("workgroup_size", &self.workgroup_size)
            .finish_non_exhaustive()
    }
}

fn wgsl_element(dtype: DType) -> &'static str {
    match dtype {
        DType::I32 => "i32",
        DType::U32 => "u32",
        _ => "f32",
    }
}

/// The parameter words a kernel finds at binding 0: the output's element
/// count, the number of inputs, the output's rank and dims, then per input
/// its rank and dims. Sizes are 32-bit (`None` when one is larger).
///
/// ```
/// assert_eq!(
///     kiln::ops::kernel::kernel_params(&[&[2, 3]], &[6]),
///     Some(vec![6, 1, 1, 6, 2, 2, 3])
/// );
/// ```
pub fn kernel_params(inputs: &[&[usize]], output: &[usize]) -> Option<Vec<u32>> {
    let word = |n: usize| u32::try_from(n).ok();
    let mut params = vec![
        word(output.iter().product())?,
        word(inputs.len())?,
        word(output.len())?,
    ];
    for &d in output {
        params.push(word(d)?);
    }
    for shape in inputs {
        params.push(word(shape.len())?);
        for &d in *shape {
            params.push(word(d)?);
        }
    }
    Some(params)
}

struct KernelDef {
    name: String,
    inputs: Vec<String>,
    in_place: Option<usize>,
    templates: Vec<(String, TemplateValue)>,
    shape_rule: Box<ShapeRuleFn>,
    reference: Box<ReferenceFn>,
    wgsl: Option<WgslKernel>,
    batches_leading_dim: bool,
}

/// A user kernel, built by [`Kernel::builder`]. Cheap to clone; calls of
/// one kernel with equal template constants are one op to CSE, and the
/// GPU backends cache pipelines by instantiated source, never by name.
///
/// ```
/// use kiln::ops::kernel::Kernel;
/// use kiln::{Array, HostData};
///
/// let double = Kernel::builder("double", ["x"])
///     .shape_rule(|inputs, _| Ok(inputs[0].clone()))
///     .reference(|call| {
///         let x = call.inputs[0].to_f64_vec();
///         Ok(HostData::from_f64s(call.out_dtype, x.into_iter().map(|v| 2.0 * v)))
///     })
///     .wgsl(
///         "@group(0) @binding(0) var<storage, read> params: array<u32>;
///          @group(0) @binding(1) var<storage, read_write> out: array<f32>;
///          @group(0) @binding(2) var<storage, read> x: array<f32>;
///          @compute @workgroup_size(64)
///          fn main(@builtin(global_invocation_id) id: vec3<u32>) {
///              if id.x < params[0] { out[id.x] = 2.0 * x[id.x]; }
///          }",
///     )
///     .build()?;
/// let y = double.call(&[&Array::from_vec(vec![1.0f32, 2.5], &[2])?]);
/// assert_eq!(y.to_vec::<f32>()?, vec![2.0, 5.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Clone)]
pub struct Kernel(Arc<KernelDef>);

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.0.name)
            .field("inputs", &self.0.inputs)
            .field("in_place", &self.0.in_place)
            .field("wgsl", &self.0.wgsl)
            .finish_non_exhaustive()
    }
}

impl Kernel {
    /// Starts describing a kernel named `name` over inputs named `inputs`
    /// (the names appear in errors; their order is the binding order).
    pub fn builder<S: Into<String>>(
        name: impl Into<String>,
        inputs: impl IntoIterator<Item = S>,
    ) -> KernelBuilder {
        KernelBuilder {
            name: name.into(),
            inputs: inputs.into_iter().map(Into::into).collect(),
            in_place: None,
            templates: Vec::new(),
            shape_rule: None,
            reference: None,
            wgsl: None,
            entry_point: "main".into(),
            grid: None,
            batches_leading_dim: false,
        }
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The inputs' names, in binding order.
    pub fn inputs(&self) -> &[String] {
        &self.0.inputs
    }

    /// The input whose buffer the output may take, if the kernel works in
    /// place.
    pub fn in_place(&self) -> Option<usize> {
        self.0.in_place
    }

    /// Whether the kernel handles a leading batch dim itself (see
    /// [`KernelBuilder::batches_leading_dim`]).
    pub fn batches_leading_dim(&self) -> bool {
        self.0.batches_leading_dim
    }

    /// The WGSL part, if the kernel has one.
    pub fn wgsl(&self) -> Option<&WgslKernel> {
        self.0.wgsl.as_ref()
    }

    /// Applies the kernel with its default template constants.
    #[track_caller]
    pub fn call(&self, inputs: &[&Array]) -> Array {
        self.call_with(inputs, &[])
    }

    /// Applies the kernel with some template constants changed; a name the
    /// kernel does not declare, or a value of another type, makes a failed
    /// array.
    #[track_caller]
    pub fn call_with(&self, inputs: &[&Array], templates: &[(&str, TemplateValue)]) -> Array {
        match self.templates_with(templates) {
            Ok(templates) => Array::apply(
                super::Op::Kernel(KernelCall {
                    kernel: self.clone(),
                    templates,
                }),
                inputs.iter().map(|&a| a.clone()).collect(),
            ),
            Err(e) => Array::failed(e),
        }
    }

    fn templates_with(
        &self,
        changes: &[(&str, TemplateValue)],
    ) -> Result<Vec<(String, TemplateValue)>> {
        let mut templates = self.0.templates.clone();
        for (name, value) in changes {
            let slot = templates
                .iter_mut()
                .find(|(n, _)| n == name)
                .ok_or_else(|| self.error(format!("has no template constant `{name}`")))?;
            if slot.1.wgsl_type() != value.wgsl_type() {
                return Err(self.error(format!(
                    "template constant `{name}` is a {}, given a {}",
                    slot.1.wgsl_type(),
                    value.wgsl_type()
                )));
            }
            slot.1 = *value;
        }
        Ok(templates)
    }

    fn error(&self, detail: impl Into<String>) -> Error {
        Error::Kernel {
            kernel: self.0.name.clone(),
            detail: detail.into(),
        }
    }
}

/// One application of a [`Kernel`]: the kernel and its template constants.
/// Equal when the kernel is the same and the constants are equal.
#[derive(Clone, Debug)]
pub struct KernelCall {
    /// The kernel.
    pub kernel: Kernel,
    /// Every template constant with its value for this call.
    pub templates: Vec<(String, TemplateValue)>,
}

impl PartialEq for KernelCall {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.kernel.0, &other.kernel.0)
            && self.templates.len() == other.templates.len()
            && self
                .templates
                .iter()
                .zip(&other.templates)
                .all(|((a, x), (b, y))| a == b && x.same(y))
    }
}

impl Eq for KernelCall {}

impl Hash for KernelCall {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.kernel.0) as *const () as usize).hash(state);
        for (name, value) in &self.templates {
            name.hash(state);
            value.hash_bits(state);
        }
    }
}

impl KernelCall {
    /// `name[T=4, ALPHA=0.5]`, or the name alone without templates.
    pub fn describe(&self) -> String {
        if self.templates.is_empty() {
            return self.kernel.name().to_string();
        }
        let parts: Vec<String> = self
            .templates
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        format!("{}[{}]", self.kernel.name(), parts.join(", "))
    }

    /// The WGSL source of this call, template constants included.
    pub fn wgsl_source(&self) -> Option<String> {
        self.kernel
            .wgsl()
            .map(|wgsl| wgsl.instantiate(&self.templates))
    }

    pub(crate) fn shape_rule(&self, inputs: &[&Aval], cx: &mut ShapeCx) -> Result<Aval> {
        let expected = self.kernel.inputs().len();
        if inputs.len() != expected {
            return Err(self.kernel.error(format!(
                "expects {expected} inputs ({}), got {}",
                self.kernel.inputs().join(", "),
                inputs.len()
            )));
        }
        let aval = (self.kernel.0.shape_rule)(inputs, cx)?;
        if let Some(k) = self.kernel.in_place() {
            if !crate::symbolic::avals_equal(inputs[k], &aval) {
                return Err(self.kernel.error(format!(
                    "works in place on `{}` ({}) but its shape rule gives {aval}",
                    self.kernel.inputs()[k],
                    inputs[k]
                )));
            }
        }
        Ok(aval)
    }

    /// Runs the reference evaluation and checks its result against what
    /// the shape rule says for these concrete inputs.
    pub(crate) fn eval(
        &self,
        inputs: &[&HostData],
        in_shapes: &[&[usize]],
        out_shape: &[usize],
    ) -> Result<HostData> {
        let avals: Vec<Aval> = inputs
            .iter()
            .zip(in_shapes)
            .map(|(data, &shape)| Aval::new(Shape::known(shape), data.dtype()))
            .collect();
        let rule = self.shape_rule(&avals.iter().collect::<Vec<_>>(), &mut ShapeCx::new())?;
        if rule.shape.as_known().as_deref() != Some(out_shape) {
            return Err(self.kernel.error(format!(
                "its shape rule gives {rule} for these inputs, but the call expects {out_shape:?}"
            )));
        }
        let out_dtype = rule.dtype;
        let result = (self.kernel.0.reference)(&ReferenceArgs {
            inputs,
            shapes: in_shapes,
            out_shape,
            out_dtype,
            templates: &self.templates,
        })?;
        let expected: usize = out_shape.iter().product();
        if result.len() != expected || result.dtype() != out_dtype {
            return Err(self.kernel.error(format!(
                "its reference evaluation returned {} {} elements, but its shape rule said \
                 {out_dtype}{out_shape:?} ({expected} elements)",
                result.len(),
                result.dtype()
            )));
        }
        Ok(result)
    }
}

/// Describes a [`Kernel`]; [`build`](Self::build) checks the description.
#[must_use = "a kernel builder does nothing until `build` is called"]
pub struct KernelBuilder {
    name: String,
    inputs: Vec<String>,
    in_place: Option<String>,
    templates: Vec<(String, TemplateValue)>,
    shape_rule: Option<Box<ShapeRuleFn>>,
    reference: Option<Box<ReferenceFn>>,
    wgsl: Option<String>,
    entry_point: String,
    grid: Option<Arc<GridFn>>,
    batches_leading_dim: bool,
}

impl KernelBuilder {
    /// The output aval from the input avals (mandatory). Symbolic dims
    /// may appear; use `cx` to unify dims the kernel needs equal.
    pub fn shape_rule(
        mut self,
        rule: impl Fn(&[&Aval], &mut ShapeCx) -> Result<Aval> + Send + Sync + 'static,
    ) -> Self {
        self.shape_rule = Some(Box::new(rule));
        self
    }

    /// The CPU reference evaluation (mandatory): the oracle every backend
    /// is checked against, and what the CPU executor runs.
    pub fn reference(
        mut self,
        reference: impl Fn(&ReferenceArgs<'_>) -> Result<HostData> + Send + Sync + 'static,
    ) -> Self {
        self.reference = Some(Box::new(reference));
        self
    }

    /// The WGSL source (see the [module docs](self) for its bindings).
    pub fn wgsl(mut self, source: impl Into<String>) -> Self {
        self.wgsl = Some(source.into());
        self
    }

    /// The WGSL entry point (default `main`).
    pub fn entry_point(mut self, name: impl Into<String>) -> Self {
        self.entry_point = name.into();
        self
    }

    /// The workgroups to dispatch, from each call's resolved shapes
    /// (default: one invocation per output element along x).
    pub fn grid(
        mut self,
        grid: impl Fn(&GridArgs<'_>) -> [u32; 3] + Send + Sync + 'static,
    ) -> Self {
        self.grid = Some(Arc::new(grid));
        self
    }

    /// Declares a template constant with its default value.
    pub fn template(mut self, name: impl Into<String>, default: impl Into<TemplateValue>) -> Self {
        self.templates.push((name.into(), default.into()));
        self
    }

    /// Declares that the output may take the buffer of input `name`: the
    /// kernel updates the output in place, which holds that input's
    /// elements on entry. The reinplace pass decides per node whether the
    /// buffer is really shared; where it is not, backends copy the input
    /// into the output first.
    pub fn in_place(mut self, name: impl Into<String>) -> Self {
        self.in_place = Some(name.into());
        self
    }

    /// Declares the kernel's batching rule for [`crate::vmap`]: given every
    /// input with one more leading dim (the examples; inputs shared by all
    /// examples are broadcast), its shape rule, reference and WGSL compute
    /// every example's output along a leading dim of the result. Without
    /// it, vmap runs the kernel once per example (and the report says so).
    pub fn batches_leading_dim(mut self) -> Self {
        self.batches_leading_dim = true;
        self
    }

    /// Checks the description and makes the kernel: a missing shape rule
    /// or reference, an unknown in-place input, a repeated or malformed
    /// template name, and WGSL that does not parse, validate or match the
    /// described bindings are each an `Err`.
    pub fn build(self) -> Result<Kernel> {
        let err = |detail: String| Error::Kernel {
            kernel: self.name.clone(),
            detail,
        };
        let shape_rule = self
            .shape_rule
            .ok_or_else(|| err("has no shape rule; every kernel needs one".into()))?;
        let reference = self.reference.ok_or_else(|| {
            err("has no reference evaluation; every kernel needs one (the CPU oracle)".into())
        })?;
        let in_place = match &self.in_place {
            None => None,
            Some(name) => Some(self.inputs.iter().position(|n| n == name).ok_or_else(|| {
                err(format!(
                    "works in place on `{name}`, which is not one of its inputs ({})",
                    self.inputs.join(", ")
                ))
            })?),
        };
        for (i, (name, _)) in self.templates.iter().enumerate() {
            let identifier = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !identifier {
                return Err(err(format!(
                    "template constant `{name}` is not a WGSL identifier"
                )));
            }
            if self.templates[..i].iter().any(|(n, _)| n == name) {
                return Err(err(format!("template constant `{name}` is declared twice")));
            }
        }
        let wgsl = match self.wgsl {
            None => None,
            Some(source) => Some(
                wgsl::check(
                    source,
                    self.entry_point,
                    &self.templates,
                    self.inputs.len(),
                    in_place,
                    self.grid,
                )
                .map_err(err)?,
            ),
        };
        Ok(Kernel(Arc::new(KernelDef {
            name: self.name,
            inputs: self.inputs,
            in_place,
            templates: self.templates,
            shape_rule,
            reference,
            wgsl,
            batches_leading_dim: self.batches_leading_dim,
        })))
    }
}

/// naga validation of kernel sources.
pub(crate) mod wgsl {
    use super::{GridFn, TemplateValue, WgslKernel};
    use crate::DType;
    use naga::{AddressSpace, ScalarKind, StorageAccess, TypeInner};
    use std::sync::Arc;

    /// Parses and validates `source`, returning naga's diagnostic (with the
    /// offending source line) on failure.
    pub fn validate(source: &str) -> Result<naga::Module, String> {
        let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32
                | naga::valid::Capabilities::SHADER_FLOAT16,
        )
        .validate(&module)
        .map_err(|e| e.emit_to_string(source))?;
        Ok(module)
    }

    /// Validates a kernel source with its default templates and checks its
    /// entry point and bindings against the description.
    pub(super) fn check(
        source: String,
        entry_point: String,
        templates: &[(String, TemplateValue)],
        inputs: usize,
        in_place: Option<usize>,
        grid: Option<Arc<GridFn>>,
    ) -> Result<WgslKernel, String> {
        let mut kernel = WgslKernel {
            source,
            entry_point,
            workgroup_size: [1, 1, 1],
            input_elements: Vec::new(),
            output_element: DType::F32,
            grid,
        };
        let full = kernel.instantiate(templates);
        let module =
            validate(&full).map_err(|message| format!("WGSL does not validate:\n{message}"))?;
        let entry = module
            .entry_points
            .iter()
            .find(|e| e.name == kernel.entry_point)
            .ok_or_else(|| format!("WGSL has no entry point `{}`", kernel.entry_point))?;
        if entry.stage != naga::ShaderStage::Compute {
            return Err(format!(
                "entry point `{}` is not a compute shader",
                entry.name
            ));
        }
        kernel.workgroup_size = entry.workgroup_size;
        // Binding number → (element dtype, writable).
        let mut bound: Vec<(u32, DType, bool)> = Vec::new();
        for (_, var) in module.global_variables.iter() {
            let Some(binding) = &var.binding else {
                continue;
            };
            let name = var.name.as_deref().unwrap_or("?");
            if binding.group != 0 {
                return Err(format!(
                    "`{name}` is bound in group {}; kernels bind everything in group 0",
                    binding.group
                ));
            }
            let AddressSpace::Storage { access } = var.space else {
                return Err(format!(
                    "`{name}` (binding {}) is not a storage buffer",
                    binding.binding
                ));
            };
            let element = match &module.types[var.ty].inner {
                TypeInner::Array { base, .. } => match module.types[*base].inner {
                    TypeInner::Scalar(s) if s.width == 4 => match s.kind {
                        ScalarKind::Float => Some(DType::F32),
                        ScalarKind::Sint => Some(DType::I32),
                        ScalarKind::Uint => Some(DType::U32),
                        _ => None,
                    },
                    _ => None,
                },
                _ => None,
            }
            .ok_or_else(|| {
                format!(
                    "`{name}` (binding {}) is not an array of f32, i32 or u32",
                    binding.binding
                )
            })?;
            bound.push((
                binding.binding,
                element,
                access.contains(StorageAccess::STORE),
            ));
        }
        let at = |b: u32| bound.iter().find(|(n, ..)| *n == b).copied();
        match at(0) {
            Some((_, DType::U32, false)) | None => {}
            Some(_) => {
                return Err(
                    "binding 0 (the parameters) must be `var<storage, read> params: array<u32>`"
                        .into(),
                )
            }
        }
        kernel.output_element = match at(1) {
            Some((_, element, true)) => element,
            Some(_) => {
                return Err("binding 1 (the output) must be `var<storage, read_write>`".into())
            }
            None => return Err("WGSL declares no output at binding 1".into()),
        };
        let input_bindings = inputs - usize::from(in_place.is_some());
        let mut next = 2u32;
        for k in 0..inputs {
            if Some(k) == in_place {
                kernel.input_elements.push(None);
                continue;
            }
            match at(next) {
                Some((_, element, false)) => kernel.input_elements.push(Some(element)),
                Some(_) => {
                    return Err(format!(
                        "binding {next} (input {k}) must be `var<storage, read>`"
                    ))
                }
                None => {
                    return Err(format!(
                        "WGSL declares no binding {next} for input {k}; inputs are bound at \
                         2..{} in order{}",
                        2 + input_bindings,
                        if in_place.is_some() {
                            ", leaving out the in-place input (read it through the output)"
                        } else {
                            ""
                        }
                    ))
                }
            }
            next += 1;
        }
        if let Some((extra, ..)) = bound.iter().find(|(b, ..)| *b >= next) {
            return Err(format!(
                "binding {extra} is not described by the kernel: it has {input_bindings} input \
                 bindings (2..{next})"
            ));
        }
        Ok(kernel)
    }
}

pub use wgsl::validate as validate_wgsl;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::rule_checks as rules;

    /// A kernel that squares its one input elementwise (a CPU reference,
    /// no WGSL), declaring a batch rule when `batches` is set.
    fn square(name: &str, batches: bool) -> Kernel {
        let builder = Kernel::builder(name, ["x"])
            .shape_rule(|inputs, _| Ok(inputs[0].clone()))
            .reference(|call| {
                Ok(HostData::from_f64s(
                    call.out_dtype,
                    call.inputs[0].to_f64_vec().into_iter().map(|v| v * v),
                ))
            });
        let builder = if batches {
            builder.batches_leading_dim()
        } else {
            builder
        };
        builder.build().expect("a complete kernel")
    }

    #[test]
    fn a_kernel_has_no_jvp_and_the_error_names_it() {
        let kernel = square("square_no_jvp", false);
        let x = rules::normal(40, &[3]);
        let result = crate::jvp(move |x: Array| kernel.call(&[&x]), &x, &x);
        rules::assert_err_names(result, "square_no_jvp", "no jvp");
    }

    #[test]
    fn a_kernel_without_a_batch_rule_runs_once_per_example_on_the_report() {
        let kernel = square("square_looped", false);
        let f = move |x: Vec<Array>| kernel.call(&[&x[0]]);
        let report =
            rules::assert_batches_like_stacking("kernel", f, &[rules::normal(41, &[3, 2])]);
        let ops: Vec<(&str, usize)> = report
            .vmap_fallbacks
            .iter()
            .map(|f| (f.op.as_str(), f.examples))
            .collect();
        assert_eq!(ops, [("square_looped", 3)]);
    }

    #[test]
    fn a_kernel_that_batches_its_leading_dim_runs_once_for_all_examples() {
        let kernel = square("square_batched", true);
        let f = move |x: Vec<Array>| kernel.call(&[&x[0]]);
        let report =
            rules::assert_batches_like_stacking("kernel", f, &[rules::normal(42, &[3, 2])]);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }
}
