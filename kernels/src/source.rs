//! Assembly of index-to-element kernels (each output element a function of
//! its index) and the elementwise/fused-group generator built on it.

use crate::abi::{bindings, status_binding};
use crate::element::{self, buffer_type, is_packed, lane_type};
use crate::spec::{KernelError, KernelSpec, Target, View};
use kiln::ops::{FusedArg, FusedStep};
use kiln::{Aval, DType, Op, ShapeCx};
use std::fmt::Write;

/// Helpers every kernel includes.
const PRELUDE: &str = include_str!("wgsl/prelude.wgsl");

/// The start of every module for `target` computing one element per
/// invocation; see [`prelude_lanes`].
pub(crate) fn prelude(target: Target) -> String {
    prelude_lanes(target, 1)
}

/// The start of a module for `target` whose invocations compute `lanes`
/// elements each: the f16 extension where used, the helpers, and the op
/// library over `lanes`-wide values.
pub(crate) fn prelude_lanes(target: Target, lanes: usize) -> String {
    let f16 = if target.native_f16 {
        "enable f16;\n"
    } else {
        ""
    };
    format!(
        "{f16}{PRELUDE}{}{}",
        element::lane_aliases(lanes),
        element::OPS
    )
}
const MAIN: &str = include_str!("wgsl/elementwise.wgsl");
const MAIN_PACKED: &str = include_str!("wgsl/elementwise_packed.wgsl");

/// Invocations per workgroup of the index-to-element mains.
const WORKGROUP: u64 = 256;

/// Elements per invocation of a vectorized elementwise kernel.
const VECTOR: usize = 4;

/// Element count as a 32-bit kernel parameter.
pub(crate) fn param(op: &str, n: usize) -> Result<u32, KernelError> {
    u32::try_from(n).map_err(|_| KernelError::TooLarge {
        op: op.to_string(),
        elements: n,
    })
}

/// An index-to-element kernel before assembly.
pub(crate) struct ElementKernel<'a> {
    /// The op, for messages.
    pub op: &'a str,
    /// Operands, bound at 2.. and readable as `load_k(i)` (raw element
    /// `i`) and `at_k(i)` (the element output `i` reads through the view).
    pub views: &'a [View],
    /// The output shape and dtype.
    pub out_shape: &'a [usize],
    /// The output dtype.
    pub out_dtype: DType,
    /// Defines `element(i: u32) -> T` (and anything it needs).
    pub element: String,
    /// Parameters after the element count, at params[1..].
    pub params: Vec<u32>,
    /// The device's capabilities.
    pub target: Target,
    /// Binds a status word after the operands (see [`KernelSpec::status`]).
    pub status: bool,
    /// Elements each invocation computes: 1, or [`VECTOR`] for an
    /// elementwise kernel whose element count it divides, with the output
    /// and every contiguous operand read as vec4 words (one-word dtypes
    /// only); `element(i)` then returns the four elements of group `i`.
    pub lanes: usize,
}

impl ElementKernel<'_> {
    /// The complete module, its parameters and workgroup count.
    pub(crate) fn assemble(self) -> Result<KernelSpec, KernelError> {
        let lanes = self.lanes;
        let numel: usize = self.out_shape.iter().product();
        let packed_out = is_packed(self.out_dtype, self.target);
        // The mains' bound: elements, or groups of `lanes` elements.
        let mut params = vec![param(self.op, numel / lanes)?];
        params.extend(&self.params);
        let bound: Vec<usize> = (0..self.views.len())
            .filter(|&k| {
                let view = &self.views[k];
                !view.aliases_output && view.inline.is_none() && view.same_as.is_none()
            })
            .collect();
        // Contiguous operands of a vectorized kernel are read a vec4 at a time.
        let vector_read = |view: &View| lanes > 1 && view.contiguous;
        let words = lane_type(DType::U32, lanes);
        let elements: Vec<(usize, &str)> = bound
            .iter()
            .map(|&k| {
                let view = &self.views[k];
                let element = if vector_read(view) {
                    words.as_str()
                } else {
                    buffer_type(view.dtype, self.target)
                };
                (k, element)
            })
            .collect();
        let out_element = if lanes > 1 {
            words.as_str()
        } else {
            buffer_type(self.out_dtype, self.target)
        };
        let mut source = prelude_lanes(self.target, lanes);
        source.push_str(&bindings(&elements, out_element));
        if self.status {
            source.push_str(&status_binding(bound.len() + 2));
        }
        let _ = writeln!(source, "alias T = {};", lane_type(self.out_dtype, lanes));
        let shape_at = params.len();
        let strided = self
            .views
            .iter()
            .any(|v| !v.contiguous && v.inline.is_none() && !v.is_scalar(self.out_shape));
        if strided {
            for &n in self.out_shape {
                params.push(param(self.op, n)?);
            }
        }
        for (k, view) in self.views.iter().enumerate() {
            if view.aliases_output && !(view.contiguous && view.dtype == self.out_dtype) {
                return Err(KernelError::Unsupported {
                    op: format!("{} in place", self.op),
                    dtypes: format!("a {} operand not laid out as the output", view.dtype),
                });
            }
            // The binding it is read through: its own, the output's, or an
            // earlier operand's holding the same value.
            let reads = match view.same_as {
                Some(j)
                    if j < k
                        && self.views[j]
                            == View {
                                same_as: None,
                                ..view.clone()
                            } =>
                {
                    &self.views[j]
                }
                Some(j) => {
                    return Err(KernelError::Unsupported {
                        op: self.op.to_string(),
                        dtypes: format!("operand {k} read as operand {j}, which differs"),
                    })
                }
                None => view,
            };
            let shared = view.same_as.unwrap_or(k);
            // Parameters are words whatever the target.
            let (buffer, target) = if reads.aliases_output {
                ("out".to_string(), self.target)
            } else if view.inline.is_some() {
                ("params".to_string(), Target::default())
            } else {
                (format!("in_{shared}"), self.target)
            };
            let load_lanes = if vector_read(view) { lanes } else { 1 };
            source.push_str(&element::load_fn(
                &format!("load_{k}"),
                &buffer,
                view.dtype,
                target,
                load_lanes,
            ));
            let lane = lane_type(view.dtype, lanes);
            if let Some(literal) = view
                .inline
                .and_then(|word| element::literal(view.dtype, word))
            {
                // Baked into the source, so the compiler folds it into the arithmetic.
                let _ = writeln!(
                    source,
                    "fn at_{k}(i: u32) -> {lane} {{\n    return {lane}({literal});\n}}"
                );
                continue;
            }
            let index = if let Some(word) = view.inline {
                // A non-finite float or a float zero (see `literal`) is read
                // from the low half (or whole) of one parameter word.
                let at = params.len();
                params.push(word);
                let per_word = if is_packed(view.dtype, Target::default()) {
                    2
                } else {
                    1
                };
                format!("{}u", at * per_word)
            } else if view.contiguous {
                "i".to_string()
            } else {
                let at = params.len();
                params.push(param(self.op, view.offset)?);
                if view.is_scalar(self.out_shape) {
                    format!("params[{at}]")
                } else {
                    for &s in &view.strides {
                        params.push(param(self.op, s)?);
                    }
                    let _ = writeln!(source, "fn index_{k}(i: u32) -> u32 {{");
                    let _ = writeln!(source, "    var rem = i;\n    var idx = params[{at}];");
                    for d in (0..self.out_shape.len()).rev() {
                        let _ = writeln!(
                            source,
                            "    idx += (rem % params[{}]) * params[{}];\n    rem /= params[{}];",
                            shape_at + d,
                            at + 1 + d,
                            shape_at + d
                        );
                    }
                    source.push_str("    return idx;\n}\n");
                    if lanes > 1 {
                        // Each lane of group `i` reads its own element.
                        let reads: Vec<String> = (0..lanes)
                            .map(|j| format!("load_{k}(index_{k}({lanes}u * i + {j}u))"))
                            .collect();
                        let _ = writeln!(
                            source,
                            "fn at_{k}(i: u32) -> {lane} {{\n    return {lane}({});\n}}",
                            reads.join(", ")
                        );
                        continue;
                    }
                    format!("index_{k}(i)")
                }
            };
            let read = format!("load_{k}({index})");
            // A single element read for every lane is splatted.
            let value = if lanes > 1 && load_lanes == 1 {
                format!("{lane}({read})")
            } else {
                read
            };
            let _ = writeln!(
                source,
                "fn at_{k}(i: u32) -> {lane} {{\n    return {value};\n}}"
            );
        }
        source.push_str(&self.element);
        source.push_str(&element::store_fn(self.out_dtype, self.target, lanes));
        let invocations = if packed_out {
            source.push_str(MAIN_PACKED);
            numel.div_ceil(2)
        } else {
            source.push_str(MAIN);
            numel / lanes
        };
        Ok(KernelSpec {
            source,
            params,
            workgroups: (invocations as u64).div_ceil(WORKGROUP),
            bound,
            status: self.status,
            launch: None,
        })
    }
}

/// The dtype each step of a fused program produces, by the members' own
/// shape rules (every operand viewed over the output shape).
pub(crate) fn step_dtypes(
    op: &str,
    steps: &[FusedStep],
    inputs: &[View],
    out_shape: &[usize],
) -> Result<Vec<DType>, KernelError> {
    let avals: Vec<Aval> = inputs
        .iter()
        .map(|view| Aval::new(out_shape, view.dtype))
        .collect();
    let refs: Vec<&Aval> = avals.iter().collect();
    let unsupported = |detail: String| KernelError::Unsupported {
        op: op.to_string(),
        dtypes: detail,
    };
    if steps
        .iter()
        .flat_map(|s| &s.args)
        .any(|arg| matches!(arg, FusedArg::Input(k) if *k >= inputs.len()))
    {
        return Err(unsupported(format!("{} operands", inputs.len())));
    }
    kiln::ops::fused::step_avals(steps, &refs, &mut ShapeCx::new())
        .map(|avals| avals.into_iter().map(|aval| aval.dtype).collect())
        .map_err(|e| unsupported(e.to_string()))
}

/// One kernel computing an elementwise op or a whole fused group: every
/// member runs in registers, only the group's operands are read and only
/// its result is written.
///
/// `operands` are the op's operands as views over the output shape.
pub fn elementwise(
    op: &Op,
    operands: &[View],
    out_shape: &[usize],
    out_dtype: DType,
    target: Target,
) -> Result<KernelSpec, KernelError> {
    let single;
    let steps: &[FusedStep] = match op {
        Op::Fused(kernel) => kernel.steps(),
        Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast(_) => {
            single = [FusedStep {
                op: op.clone(),
                args: (0..operands.len()).map(FusedArg::Input).collect(),
            }];
            &single
        }
        other => {
            return Err(KernelError::Unsupported {
                op: other.name().to_string(),
                dtypes: "an elementwise kernel".into(),
            })
        }
    };
    let dtypes = step_dtypes(op.name(), steps, operands, out_shape)?;
    let numel: usize = out_shape.iter().product();
    // Four elements per invocation where every value is one word per
    // element: vec4 reads and arithmetic, a quarter of the invocations.
    let one_word = |d: &DType| !matches!(d, DType::F16 | DType::BF16);
    let lanes = if numel > 0
        && numel.is_multiple_of(VECTOR)
        && one_word(&out_dtype)
        && dtypes.iter().all(one_word)
        && operands.iter().all(|v| one_word(&v.dtype))
    {
        VECTOR
    } else {
        1
    };
    let mut body = "fn element(i: u32) -> T {\n".to_string();
    let mut loaded = vec![false; operands.len()];
    let mut lines = String::new();
    for (j, step) in steps.iter().enumerate() {
        let mut args = Vec::with_capacity(step.args.len());
        let mut arg_dtypes = Vec::with_capacity(step.args.len());
        for arg in &step.args {
            match *arg {
                FusedArg::Input(k) => {
                    if !loaded[k] {
                        loaded[k] = true;
                        let _ = writeln!(body, "    let x{k} = at_{k}(i);");
                    }
                    args.push(format!("x{k}"));
                    arg_dtypes.push(operands[k].dtype);
                }
                FusedArg::Step(s) => {
                    args.push(format!("s{s}"));
                    arg_dtypes.push(dtypes[s]);
                }
            }
        }
        let expr = match &step.op {
            Op::Unary(u) => element::unary(*u, arg_dtypes[0], &args[0])?,
            Op::Binary(b) => element::binary(*b, arg_dtypes[0], &args[0], &args[1])?,
            Op::Select => element::select(arg_dtypes[1], &args[0], &args[1], &args[2]),
            Op::Cast(d) => element::cast(arg_dtypes[0], *d, &args[0])?,
            other => {
                return Err(KernelError::Unsupported {
                    op: other.name().to_string(),
                    dtypes: "a fused group".into(),
                })
            }
        };
        let _ = writeln!(lines, "    let s{j} = {expr};");
    }
    body.push_str(&lines);
    let _ = writeln!(body, "    return s{};\n}}", steps.len() - 1);
    ElementKernel {
        op: op.name(),
        views: operands,
        out_shape,
        out_dtype,
        element: body,
        params: Vec::new(),
        target,
        status: false,
        lanes,
    }
    .assemble()
}
