//! Weight files: trees of arrays in and out as
//! [safetensors](https://github.com/huggingface/safetensors).
//!
//! A file holds named tensors. Saving a tree writes each leaf under its
//! **tensor name**: its path in the tree with the steps joined by `.`,
//! a list or tuple position written as its number and a map key as its
//! text, so the leaf that [`KeyPath`](crate::KeyPath) displays as
//! `layers[0].attn.w` is the tensor `layers.0.attn.w`, as PyTorch and MLX
//! checkpoints name them ([`tensor_name`]; [`tensor_names`] lists a
//! tree's). An `Option` adds no step; `None` writes nothing.
//!
//! **Quantized weights** ([`AffineQuantized`](crate::implicit::AffineQuantized),
//! [`Nf4`](crate::implicit::Nf4), [`Int8`](crate::implicit::Int8)) are
//! written as MLX writes a quantized layer: `<path>.weight` holds the packed
//! codes (`u32[out, in·bits/32]`, codes packed lowest bits first along the
//! input axis, which is Kiln's own packing, so nothing is converted),
//! `<path>.scales` and, for the affine format, `<path>.biases`
//! (`[out, in/group_size]`, in the weight's float dtype). A file that
//! `mx.quantize` and `mx.save_safetensors` wrote loads into a template
//! holding an `AffineQuantized` under the layer's name. The format (bits,
//! group size) is not in the file: the template's is used, and a file of
//! another format differs from it in a shape.
//!
//! Loading into a tree takes a **template** of the tree: its structure,
//! names, shapes and dtypes are read, never its values (a template of
//! lazy zeros computes nothing). Every tensor is checked against it
//! before any is decoded, and the first mismatch is an
//! [`Error::Weights`] naming the tensor: the
//! template's leaves in order (missing from the file, or of another dtype
//! or shape, with both), then the file's tensors the tree does not have,
//! by name. A truncated or corrupt file is an `Err` too.
//!
//! Elements are little-endian, as the format says; a bool is one byte.
//! The in-memory forms ([`to_safetensors_bytes`],
//! [`from_safetensors_bytes`], [`map_from_safetensors_bytes`]) work on every
//! target, wasm32 included; the path forms read and write with `std::fs`
//! (on `wasm32-unknown-unknown` they return the `Err` the platform gives).
//!
//! ```
//! use kiln::io::{from_safetensors_bytes, to_safetensors_bytes};
//! use kiln::{Array, DType, Tree};
//!
//! #[derive(Tree)]
//! struct Layer {
//!     w: Array,
//!     b: Option<Array>,
//! }
//!
//! let layers = vec![Layer {
//!     w: Array::from_vec(vec![1.0f32, 2.0], &[1, 2])?,
//!     b: None,
//! }];
//! let bytes = to_safetensors_bytes(&layers)?;
//! let template = vec![Layer { w: Array::zeros(&[1, 2], DType::F32), b: None }];
//! let loaded = from_safetensors_bytes(&bytes, &template)?;
//! assert_eq!(loaded[0].w.to_vec::<f32>()?, vec![1.0, 2.0]);
//! # Ok::<(), kiln::Error>(())
//! ```

mod codec;
mod names;

pub use names::tensor_name;

use crate::error::{Error, Result};
use crate::tree::{tree_flatten, tree_unflatten, Tree};
use crate::Array;
use codec::{decode, dtype_label, file_dtype, Encoded};
use safetensors::tensor::TensorView;
use safetensors::SafeTensors;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The tensor names `tree`'s leaves take in a file, in leaf order (see the
/// [module docs](self)); `Err` when a leaf has no name (the tree is a bare
/// array) or two leaves share one.
///
/// ```
/// use kiln::implicit::AffineQuantized;
/// use kiln::io::tensor_names;
/// use kiln::{Array, DType, Tree};
///
/// #[derive(Tree)]
/// struct Attn {
///     q_proj: AffineQuantized,
///     norm: Vec<Array>,
/// }
///
/// let attn = Attn {
///     q_proj: AffineQuantized::quantize(&Array::zeros(&[64, 8], DType::F32), 4, 64),
///     norm: vec![Array::ones(&[8], DType::F32)],
/// };
/// let names = tensor_names(&attn)?;
/// assert_eq!(names, ["q_proj.weight", "q_proj.scales", "q_proj.biases", "norm.0"]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn tensor_names<T: Tree>(tree: &T) -> Result<Vec<String>> {
    let (_, def) = tree_flatten(tree)?;
    names::leaf_names(&def)
}

/// `tree` as the bytes of a safetensors file: each leaf under its tensor
/// name (see the [module docs](self)). The leaves are computed first.
pub fn to_safetensors_bytes<T: Tree>(tree: &T) -> Result<Vec<u8>> {
    let (leaves, def) = tree_flatten(tree)?;
    let names = names::leaf_names(&def)?;
    crate::eval(&leaves)?;
    let tensors = names
        .iter()
        .zip(&leaves)
        .map(|(name, leaf)| Ok((name.as_str(), Encoded::of(name, leaf)?)))
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize(tensors, None).map_err(|e| Error::Weights {
        tensor: String::new(),
        detail: format!("cannot write a safetensors file: {e}"),
    })
}

/// A new tree shaped like `template`, its leaves read from the bytes of a
/// safetensors file. The template's values are not read; every name, shape
/// and dtype is checked against it, and the first mismatch is an `Err`
/// naming the tensor (see the [module docs](self)).
pub fn from_safetensors_bytes<T: Tree>(bytes: &[u8], template: &T) -> Result<T> {
    let (leaves, def) = tree_flatten(template)?;
    let names = names::leaf_names(&def)?;
    let file = parse(bytes)?;
    let views = names
        .iter()
        .zip(&leaves)
        .map(|(name, leaf)| matching_view(&file, name, leaf))
        .collect::<Result<Vec<_>>>()?;
    check_no_extra(&file, &names)?;
    let arrays = names
        .iter()
        .zip(&views)
        .map(|(name, view)| decode(name, view))
        .collect::<Result<Vec<_>>>()?;
    tree_unflatten(&def, arrays)
}

/// Every tensor of the bytes of a safetensors file, by name, whatever
/// tree wrote it (the packed codes of quantized weights are `u32` arrays
/// like any other). `Err` for a corrupt file or a dtype Kiln lacks.
pub fn map_from_safetensors_bytes(bytes: &[u8]) -> Result<BTreeMap<String, Array>> {
    let file = parse(bytes)?;
    file.iter()
        .map(|(name, view)| Ok((name.to_string(), decode(name, &view)?)))
        .collect()
}

/// Writes `tree` to a safetensors file at `path` (see the
/// [module docs](self) for the names).
///
/// ```no_run
/// use kiln::io::{load_safetensors_into, save_safetensors};
/// use kiln::{Array, DType};
/// use std::collections::BTreeMap;
///
/// let params = BTreeMap::from([("w".to_string(), Array::ones(&[2, 2], DType::F32))]);
/// save_safetensors("params.safetensors", &params)?;
/// let loaded = load_safetensors_into("params.safetensors", &params)?;
/// assert_eq!(loaded["w"].to_vec::<f32>()?, vec![1.0; 4]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn save_safetensors<T: Tree>(path: impl AsRef<Path>, tree: &T) -> Result<()> {
    let path = path.as_ref();
    let bytes = to_safetensors_bytes(tree)?;
    std::fs::write(path, bytes).map_err(|e| io_error("write", path, &e))
}

/// A new tree shaped like `template`, read from the safetensors file at
/// `path`; see [`from_safetensors_bytes`] for the checks.
pub fn load_safetensors_into<T: Tree>(path: impl AsRef<Path>, template: &T) -> Result<T> {
    from_safetensors_bytes(&read(path.as_ref())?, template)
}

/// Every tensor of the safetensors file at `path`, by name; see
/// [`map_from_safetensors_bytes`].
pub fn load_safetensors_map(path: impl AsRef<Path>) -> Result<BTreeMap<String, Array>> {
    map_from_safetensors_bytes(&read(path.as_ref())?)
}

/// The bytes of the file at `path`.
fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| io_error("read", path, &e))
}

/// The error for a failed read or write of `path`.
fn io_error(action: &str, path: &Path, error: &std::io::Error) -> Error {
    Error::Weights {
        tensor: String::new(),
        detail: format!("cannot {action} `{}`: {error}", path.display()),
    }
}

/// The parsed header of `bytes`, its offsets checked against their length.
fn parse(bytes: &[u8]) -> Result<SafeTensors<'_>> {
    SafeTensors::deserialize(bytes).map_err(|e| Error::Weights {
        tensor: String::new(),
        detail: format!("not a valid safetensors file: {e}"),
    })
}

/// The file's tensor `name`, checked against the template's `leaf`.
fn matching_view<'a>(file: &SafeTensors<'a>, name: &str, leaf: &Array) -> Result<TensorView<'a>> {
    let mismatch = |detail: String| Error::Weights {
        tensor: name.to_string(),
        detail,
    };
    let view = file.tensor(name).map_err(|_| {
        mismatch(format!(
            "missing from the file (the tree has it as {})",
            leaf.aval()
        ))
    })?;
    if view.dtype() != file_dtype(leaf.dtype()) {
        return Err(mismatch(format!(
            "dtype differs: the file has {}, the tree {}",
            dtype_label(view.dtype()),
            leaf.dtype()
        )));
    }
    let dims = leaf
        .dims()
        .ok_or_else(|| mismatch(format!("the tree's shape {} is not concrete", leaf.aval())))?;
    if view.shape() != dims.as_slice() {
        return Err(mismatch(format!(
            "shape differs: the file has {:?}, the tree {:?}",
            view.shape(),
            dims
        )));
    }
    Ok(view)
}

/// `Err` naming the first tensor (by name) the file has and `names` lacks.
fn check_no_extra(file: &SafeTensors<'_>, names: &[String]) -> Result<()> {
    let wanted: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    let extra = file
        .names()
        .into_iter()
        .filter(|name| !wanted.contains(name))
        .min();
    match extra {
        Some(name) => Err(Error::Weights {
            tensor: name.to_string(),
            detail: "in the file but not in the tree".into(),
        }),
        None => Ok(()),
    }
}
