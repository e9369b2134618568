//! WGSL to the Metal Shading Language through naga's MSL writer: the one
//! part of the Metal backend that is portable, so it is built and tested
//! on every platform.
//!
//! A [`Program`](kiln_kernels::Program) dispatch binds its ranges at WGSL
//! bindings `0..n` of group 0 (see [`kiln_kernels::abi`]); the translation
//! maps binding `b` to Metal buffer index `b`, writable, and puts the sizes
//! buffer naga's bounds checks read at index `n`: one `uint` per global
//! holding a runtime-sized array, in declaration order, each the byte size
//! of the range bound there ([`MslKernel::sized_bindings`]).

use naga::back::msl;
use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};
use naga::valid::{Capabilities, ValidationFlags, Validator};
use naga::{ResourceBinding, ShaderStage};
use thiserror::Error;

/// The Metal Shading Language version the kernels are written for:
/// macOS 12 and iOS 15 have it, and it has every feature naga uses here.
pub const MSL_VERSION: (u8, u8) = (2, 4);

/// Why a kernel could not be translated.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum MslError {
    /// The WGSL does not parse or validate.
    #[error("the WGSL of `{op}` is invalid: {message}")]
    Invalid {
        /// The op it computes.
        op: String,
        /// naga's diagnostic.
        message: String,
    },
    /// The module has no compute entry point of that name.
    #[error("the WGSL of `{op}` has no compute entry point `{entry_point}`")]
    NoEntryPoint {
        /// The op.
        op: String,
        /// The entry point asked for.
        entry_point: String,
    },
    /// naga's MSL writer refused it (a binding the map does not cover, a
    /// feature Metal lacks).
    #[error("the WGSL of `{op}` does not translate to MSL: {message}")]
    Untranslatable {
        /// The op.
        op: String,
        /// naga's message.
        message: String,
    },
}

/// A kernel in the Metal Shading Language.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MslKernel {
    /// The MSL source.
    pub source: String,
    /// The name of the kernel function in it.
    pub function: String,
    /// Threads per threadgroup (the WGSL `@workgroup_size`).
    pub threads_per_group: [u32; 3],
    /// The buffer index of the sizes buffer, when the kernel has one.
    pub sizes_index: Option<u32>,
    /// Per entry of the sizes buffer, the WGSL binding whose byte size it
    /// holds.
    pub sized_bindings: Vec<u32>,
}

/// Translates `wgsl` (the kernel of `op`, binding `bindings` buffers at
/// group 0) for `entry_point` to MSL: every binding `b` at buffer index
/// `b`, the sizes buffer at index `bindings`; integer division guarded as
/// WGSL defines it; out-of-range indices restricted and out-of-range buffer
/// accesses reading zero and writing nothing; workgroup memory zeroed as
/// WGSL requires.
pub fn translate(
    op: &str,
    wgsl: &str,
    entry_point: &str,
    bindings: u32,
) -> Result<MslKernel, MslError> {
    let invalid = |message: String| MslError::Invalid {
        op: op.to_string(),
        message,
    };
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| invalid(e.emit_to_string(wgsl)))?;
    let info = Validator::new(
        ValidationFlags::all(),
        Capabilities::SHADER_FLOAT16_IN_FLOAT32 | Capabilities::SHADER_FLOAT16,
    )
    .validate(&module)
    .map_err(|e| invalid(e.emit_to_string(wgsl)))?;
    let entry = module
        .entry_points
        .iter()
        .find(|ep| ep.stage == ShaderStage::Compute && ep.name == entry_point)
        .ok_or_else(|| MslError::NoEntryPoint {
            op: op.to_string(),
            entry_point: entry_point.to_string(),
        })?;
    let slot = |index: u32| {
        u8::try_from(index).map_err(|_| MslError::Untranslatable {
            op: op.to_string(),
            message: format!("{bindings} bindings exceed Metal's buffer indices"),
        })
    };
    let mut resources = msl::BindingMap::default();
    for binding in 0..bindings {
        resources.insert(
            ResourceBinding { group: 0, binding },
            msl::BindTarget {
                buffer: Some(slot(binding)?),
                mutable: true,
                ..Default::default()
            },
        );
    }
    let sized_bindings: Vec<u32> = module
        .global_variables
        .iter()
        // The writer's own rule for which globals get a `_mslBufferSizes`
        // member, so the entries line up with the struct it declares.
        .filter(|(_, var)| {
            module.types[var.ty]
                .inner
                .needs_host_buffer_byte_size(&module.types)
        })
        .filter_map(|(_, var)| var.binding.as_ref().map(|b| b.binding))
        .collect();
    let sizes_index = (!sized_bindings.is_empty()).then_some(bindings);
    let mut per_entry_point_map = msl::EntryPointResourceMap::default();
    per_entry_point_map.insert(
        entry_point.to_string(),
        msl::EntryPointResources {
            resources,
            immediates_buffer: None,
            sizes_buffer: sizes_index.map(slot).transpose()?,
        },
    );
    let options = msl::Options {
        lang_version: MSL_VERSION,
        per_entry_point_map,
        fake_missing_bindings: false,
        bounds_check_policies: BoundsCheckPolicies {
            index: BoundsCheckPolicy::Restrict,
            buffer: BoundsCheckPolicy::ReadZeroSkipWrite,
            ..BoundsCheckPolicies::default()
        },
        zero_initialize_workgroup_memory: true,
        emit_int_div_checks: true,
        ..msl::Options::default()
    };
    let pipeline = msl::PipelineOptions {
        entry_point: Some((ShaderStage::Compute, entry_point.to_string())),
        ..msl::PipelineOptions::default()
    };
    let untranslatable = |message: String| MslError::Untranslatable {
        op: op.to_string(),
        message,
    };
    let (source, translation) = msl::write_string(&module, &info, &options, &pipeline)
        .map_err(|e| untranslatable(e.to_string()))?;
    let function = translation
        .entry_point_names
        .into_iter()
        .next()
        .ok_or_else(|| untranslatable("no entry point was written".into()))?
        .map_err(|e| untranslatable(e.to_string()))?;
    Ok(MslKernel {
        source,
        function,
        threads_per_group: entry.workgroup_size,
        sizes_index,
        sized_bindings,
    })
}
