//! Device meshes and shardings, written as Shardy annotations (`sdy.mesh`,
//! `sdy.sharding`): the form jax 0.10.2 prints and XLA's partitioner
//! reads. Kiln checks them against the exported avals and partitions
//! nothing itself.

use crate::error::{Error, Result};
use crate::shape::Aval;

/// A logical mesh of devices: named axes with sizes, major to minor
/// (`data` = 4 × `model` = 2 is 8 devices).
///
/// ```
/// let mesh = kiln::export::Mesh::new([("data", 4), ("model", 2)])?;
/// assert_eq!(mesh.devices(), 8);
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mesh {
    axes: Vec<(String, usize)>,
}

pub(super) fn mesh_err(detail: String) -> Error {
    Error::InvalidArgument {
        op: "export".into(),
        detail,
        at: None,
    }
}

impl Mesh {
    /// A mesh of `axes` (name, size); an `Err` for no axes, an empty or
    /// repeated name, a size of 0, or more than 2^32 − 1 devices.
    pub fn new<S: Into<String>>(axes: impl IntoIterator<Item = (S, usize)>) -> Result<Mesh> {
        let axes: Vec<(String, usize)> = axes.into_iter().map(|(n, s)| (n.into(), s)).collect();
        if axes.is_empty() {
            return Err(mesh_err("a mesh needs at least one axis".into()));
        }
        for (i, (name, size)) in axes.iter().enumerate() {
            let valid =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(mesh_err(format!(
                    "mesh axis name `{name}` is not a word of letters, digits and `_`"
                )));
            }
            if *size == 0 {
                return Err(mesh_err(format!("mesh axis `{name}` has size 0")));
            }
            if axes[..i].iter().any(|(other, _)| other == name) {
                return Err(mesh_err(format!("mesh axis `{name}` is named twice")));
            }
        }
        let devices = axes.iter().try_fold(1usize, |n, (_, s)| n.checked_mul(*s));
        if devices.is_none_or(|n| n > u32::MAX as usize) {
            return Err(mesh_err(format!(
                "a mesh of {} has more devices than XLA can number",
                axes.iter()
                    .map(|(n, s)| format!("{n}={s}"))
                    .collect::<Vec<_>>()
                    .join(" × ")
            )));
        }
        Ok(Mesh { axes })
    }

    /// The axes, major to minor.
    pub fn axes(&self) -> &[(String, usize)] {
        &self.axes
    }

    /// How many devices the mesh spans (the product of its sizes).
    pub fn devices(&self) -> usize {
        self.axes.iter().map(|(_, s)| s).product()
    }

    /// `"data"=4, "model"=2`.
    pub(super) fn axes_text(&self) -> String {
        self.axes
            .iter()
            .map(|(n, s)| format!("\"{n}\"={s}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn size(&self, axis: &str) -> Option<usize> {
        self.axes.iter().find(|(n, _)| n == axis).map(|(_, s)| *s)
    }
}

/// `Err` unless `spec` splits the value at `path` (of `aval`) over axes of
/// `mesh` that divide its dims, each axis once.
pub(super) fn check_spec(
    mesh: &Mesh,
    path: &str,
    aval: &Aval,
    spec: &[Option<String>],
) -> Result<()> {
    let dims = aval.shape.dims();
    if spec.len() != dims.len() {
        return Err(mesh_err(format!(
            "sharding of `{path}` names {} dims, but it has {} ({})",
            spec.len(),
            dims.len(),
            aval
        )));
    }
    for (d, axis) in spec.iter().enumerate() {
        let Some(axis) = axis else { continue };
        let size = mesh.size(axis).ok_or_else(|| {
            mesh_err(format!(
                "sharding of `{path}` dim {d} names mesh axis `{axis}`, which the mesh \
                 (axes {}) lacks",
                mesh.axes_text()
            ))
        })?;
        if spec[..d]
            .iter()
            .any(|a| a.as_deref() == Some(axis.as_str()))
        {
            return Err(mesh_err(format!(
                "sharding of `{path}` splits two dims over mesh axis `{axis}`"
            )));
        }
        if let Some(n) = dims[d].known() {
            if n % size != 0 {
                return Err(mesh_err(format!(
                    "sharding of `{path}`: dim {d} of size {n} is not divisible by mesh axis \
                     `{axis}` of size {size}"
                )));
            }
        }
    }
    Ok(())
}
