//! A kernel before the lowering places it: what a generator returns
//! ([`KernelSpec`]), how its operands are read ([`View`]), what the device
//! offers ([`Target`]) and the errors of building one.

/// What the device offers the kernels beyond core WebGPU.
///
/// With `native_f16` (the adapter has SHADER_F16) kernels start with
/// `enable f16;` and read and write f16 buffers as `array<f16>`, one
/// element per invocation; otherwise f16 is read and written as packed
/// words through `unpack2x16float`/`pack2x16float`. Either way arithmetic
/// runs in f32 and rounds to f16 after every op, as the reference does, and
/// the buffer layout is the same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Target {
    /// The device computes with f16 natively (SHADER_F16).
    pub native_f16: bool,
}

use kiln::shape::{broadcast_strides, row_major_strides};
use kiln::DType;
use thiserror::Error;

/// What a kernel could not be built or validated for.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum KernelError {
    /// The op has no kernel for these operand dtypes.
    #[error("no WGSL kernel for `{op}` on {dtypes}")]
    Unsupported {
        /// The op's name.
        op: String,
        /// The operand dtypes, like `bool, bool`.
        dtypes: String,
    },
    /// A generated kernel failed naga validation: a bug in the generator,
    /// reported with the offending source.
    #[error("generated WGSL for `{op}` does not validate: {message}\n{wgsl}")]
    Invalid {
        /// What the kernel computes.
        op: String,
        /// naga's diagnostic.
        message: String,
        /// The kernel source.
        wgsl: String,
    },
    /// A size does not fit the 32-bit indexing of the kernels.
    #[error("`{op}` needs {elements} elements, more than 32-bit indexing allows")]
    TooLarge {
        /// The op's name.
        op: String,
        /// The element count.
        elements: usize,
    },
}

/// One kernel of one op: source, parameters and workgroup count, before
/// the lowering places its bindings (see [`abi`](crate::abi) for their order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSpec {
    /// The complete WGSL module (entry point `main`).
    pub source: String,
    /// The words of the parameter buffer (binding 0); never empty.
    pub params: Vec<u32>,
    /// Workgroups to run, before splitting over the x, y and z dimensions
    /// (the kernels index them flat).
    pub workgroups: u64,
    /// The operands bound at bindings 2.., in order: operands read through
    /// the output binding or inlined into the parameters take none.
    pub bound: Vec<usize>,
    /// The kernel reports bad input in a status word bound after the
    /// operands (out-of-range indices of `take`, `scatter_add` and
    /// `gather_qmm`; the encoding is in [`abi`](crate::abi)).
    pub status: bool,
    /// For a user kernel: its entry point and exact grid, dispatched as
    /// given; built-in kernels (entry point `main`) index their flat
    /// `workgroups` themselves.
    pub launch: Option<Launch>,
}

/// How a user kernel is launched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The entry point.
    pub entry_point: String,
    /// Workgroups along x, y and z, from the kernel's grid function.
    pub grid: [u32; 3],
    /// The entry point's `@workgroup_size`, for the adapter's limits.
    pub workgroup_size: [u32; 3],
}

/// How one operand of an index-to-element kernel is read: the element of
/// output position `p` (row-major over the output shape) is at
/// `offset + Σ p[d]·strides[d]` of the operand's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// The operand's dtype.
    pub dtype: DType,
    /// Element offset of output position zero.
    pub offset: usize,
    /// Element stride per output axis (0 where the operand is broadcast).
    pub strides: Vec<usize>,
    /// True when the view reads the buffer in order from element 0, so
    /// output element `i` is operand element `i`.
    pub contiguous: bool,
    /// True when the operand shares the output's buffer (an in-place
    /// kernel): it is read through the output binding, since one dispatch
    /// cannot bind a buffer both read-only and read-write. Only contiguous
    /// views of the output's dtype can share it.
    pub aliases_output: bool,
    /// A scalar operand carried in the parameters instead of a buffer (its
    /// word as [`words`](crate::abi::words) lays it out, the value in the low half for f16 and
    /// bf16), so a fused group with many constants binds few buffers.
    pub inline: Option<u32>,
    /// The operand is the same value as earlier operand `j` and is read
    /// through `j`'s binding: one dispatch may not bind overlapping ranges
    /// of a buffer when any of them is writable (WebGPU), so `x + x` binds
    /// `x` once. The two views must read the same elements the same way.
    pub same_as: Option<usize>,
}

impl View {
    /// A contiguous operand of exactly the output shape.
    pub fn contiguous(dtype: DType, shape: &[usize]) -> View {
        View {
            dtype,
            offset: 0,
            strides: row_major_strides(shape),
            contiguous: true,
            aliases_output: false,
            inline: None,
            same_as: None,
        }
    }

    /// A contiguous operand of shape `shape` broadcast (NumPy rules) to
    /// `out_shape`.
    pub fn broadcast(dtype: DType, shape: &[usize], out_shape: &[usize]) -> View {
        View::strided(dtype, 0, broadcast_strides(shape, out_shape), out_shape)
    }

    /// An arbitrary strided view over an output of shape `out_shape`.
    pub fn strided(dtype: DType, offset: usize, strides: Vec<usize>, out_shape: &[usize]) -> View {
        let contiguous =
            offset == 0 && nonunit_equal(&strides, &row_major_strides(out_shape), out_shape);
        View {
            dtype,
            offset,
            strides,
            contiguous,
            aliases_output: false,
            inline: None,
            same_as: None,
        }
    }

    /// A scalar of `dtype` whose storage word is `word`, carried in the
    /// kernel's parameters.
    pub fn inline(dtype: DType, word: u32) -> View {
        View {
            dtype,
            offset: 0,
            strides: Vec::new(),
            contiguous: false,
            aliases_output: false,
            inline: Some(word),
            same_as: None,
        }
    }

    /// True when every output element reads the same operand element.
    pub(crate) fn is_scalar(&self, out_shape: &[usize]) -> bool {
        self.strides
            .iter()
            .zip(out_shape)
            .all(|(&s, &n)| s == 0 || n == 1)
    }
}

/// Strides agree on every axis longer than 1 (axes of size 1 are never
/// stepped along).
fn nonunit_equal(a: &[usize], b: &[usize], shape: &[usize]) -> bool {
    a.len() == b.len() && (0..a.len()).all(|d| shape[d] == 1 || a[d] == b[d])
}

/// Checks a WGSL module with naga's parser and validator, with the
/// capabilities every WebGPU implementation has (`pack2x16float` and
/// `unpack2x16float` included) plus f16 for modules that enable it.
///
/// `Err` carries naga's diagnostic rendered against the source.
pub fn validate(source: &str) -> Result<(), String> {
    kiln::ops::kernel::validate_wgsl(source).map(|_| ())
}

/// Validates a generated kernel, turning a failure into [`KernelError::Invalid`].
pub fn checked(op: &str, spec: KernelSpec) -> Result<KernelSpec, KernelError> {
    validate(&spec.source).map_err(|message| KernelError::Invalid {
        op: op.to_string(),
        message,
        wgsl: spec.source.clone(),
    })?;
    Ok(spec)
}
