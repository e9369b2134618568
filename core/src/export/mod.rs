//! Export to StableHLO: a compiled function's graph as an MLIR module that
//! XLA (through JAX or PJRT), IREE and the other engines taking StableHLO
//! compile and run, sharded over many devices by their partitioners.
//!
//! [`Compiled::export`] writes the executable's graph after Kiln's passes
//! that change no meaning (simplification, CSE, DCE, implicit lowering);
//! a fused group is written as its members. Each op family becomes the
//! StableHLO ops that mean what Kiln's op means (`lower`), written as MLIR
//! text (`mlir`). Sharding is annotation only ([`Mesh`],
//! [`Exported::shard`]): Kiln partitions nothing itself.
//!
//! # Layering
//!
//! Export sits above `compile/` (the layers test, `core/tests/layers.rs`,
//! puts it there): it starts from a [`Compiled`] function, reads the graph
//! of its [`crate::Executable`] and its result tree
//! ([`Compiled::output_tree`]), and traces a custom op's forward (the trace
//! layer) to write it as its body. Nothing below imports it. It is a
//! module of the core, not a crate of its own, because of three hooks the
//! core keeps crate-private: a custom op's traced forward, the terms of a
//! symbolic size (written as code for dynamic dims) and the rendering of
//! tree paths as reports write them; as a crate it would make them public
//! API for one client. Everything else it reads is public (the graph, the
//! ops' parameters, avals).
//!
//! ```
//! use kiln::{compile, Array};
//! let f = compile(|(x, w): (Array, Array)| x.matmul(&w).tanh());
//! let x = Array::from_vec(vec![1.0f32; 8], &[2, 4])?;
//! let w = Array::from_vec(vec![0.5f32; 12], &[4, 3])?;
//! let exported = f.export(&(x, w))?;
//! let text = exported.stablehlo();
//! assert!(text.contains("func.func public @main"));
//! assert!(text.contains("stablehlo.dot_general"));
//! assert_eq!(exported.args()[0].path, "args[0]");
//! # Ok::<(), kiln::Error>(())
//! ```

mod lower;
mod mlir;
mod shard;

pub use shard::Mesh;

use crate::compile::report::arg_path;
use crate::compile::vmap::out_path;
use crate::compile::{Compiled, Function};
use crate::error::{Error, Result};
use crate::exec::Backend;
use crate::ir::graph::{Graph, ValueKind};
use crate::shape::{Aval, Dim, Shape};
use crate::tree::{tree_flatten, Tree};
use mlir::{tensor_type, Emitter, SymbolArgs, Value};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

/// One argument or result of an exported module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportedValue {
    /// Its tree path as reports write it: `args.params.w1`, `out[0]`.
    pub path: String,
    /// Its shape (symbolic dims in a shapeless export) and dtype.
    pub aval: Aval,
}

/// A compiled function written as a StableHLO module, with its arguments'
/// and results' tree paths, the symbols and guards of a shapeless export,
/// and (once given) a device mesh and shardings.
#[derive(Clone, Debug)]
pub struct Exported {
    args: Vec<ExportedValue>,
    results: Vec<ExportedValue>,
    /// The body of `@main`: its ops and its `return`.
    body: String,
    symbols: Vec<String>,
    guards: Vec<String>,
    mesh: Option<Mesh>,
    /// Per argument, then per result: the mesh axis each dim is split
    /// over, when sharded.
    shardings: BTreeMap<String, Vec<Option<String>>>,
}

impl<In, Out, F, B, M> Compiled<In, Out, F, B, M>
where
    In: Tree,
    Out: Tree,
    F: Function<In, Out, M>,
    B: Backend,
{
    /// The function, compiled for the signature of `args`, as a StableHLO
    /// module ([`Exported`]). A shapeless function exports with dynamic
    /// dims (`tensor<?x4xf32>`) and records its symbols and guards.
    ///
    /// An `Err` names what has no StableHLO form: a user WGSL kernel (by
    /// name and op id), an op over a symbolic size that StableHLO needs
    /// static.
    pub fn export(&self, args: &In) -> Result<Exported> {
        let exe = self.executable(args)?;
        let (leaves, input_tree) = tree_flatten(args)?;
        let output_tree = self.output_tree(args)?;
        let arg_paths: Vec<String> = input_tree.leaf_paths().iter().map(arg_path).collect();
        let result_paths: Vec<String> = output_tree.leaf_paths().iter().map(out_path).collect();
        let arg_avals: Vec<Aval> = leaves.iter().map(|l| l.aval().clone()).collect();
        export_graph(exe.graph(), &arg_paths, &arg_avals, &result_paths)
    }
}

/// Writes `graph` as `@main`. `leaf_avals` are the call's argument avals;
/// an argument the graph reads takes the graph's aval (symbolic when
/// shapeless).
fn export_graph(
    graph: &Graph,
    arg_paths: &[String],
    leaf_avals: &[Aval],
    result_paths: &[String],
) -> Result<Exported> {
    let mut avals: Vec<Aval> = leaf_avals.to_vec();
    for node in &graph.nodes {
        if let ValueKind::Input(i) = node.kind {
            if let Some(slot) = avals.get_mut(i) {
                *slot = node.aval.clone();
            }
        }
    }
    let inputs: Vec<Value> = avals
        .iter()
        .enumerate()
        .map(|(i, a)| Value {
            name: format!("%arg{i}"),
            dims: a.shape.dims().to_vec(),
            dtype: a.dtype,
        })
        .collect();
    let mut symbols = SymbolArgs::new();
    let mut symbol_lines = Vec::new();
    for (i, input) in inputs.iter().enumerate() {
        for (axis, d) in input.dims.iter().enumerate() {
            if let Some(s) = bare_symbol(d) {
                if let std::collections::btree_map::Entry::Vacant(slot) = symbols.entry(s) {
                    slot.insert((input.clone(), axis));
                    symbol_lines.push(format!("{s} = {}.shape[{axis}]", arg_paths[i]));
                }
            }
        }
    }
    let mut counter = 0;
    let mut e = Emitter::new(&mut counter, &symbols, 2);
    let outputs = lower::lower_graph(&mut e, graph, &inputs)?;
    let names: Vec<&str> = outputs.iter().map(|v| v.name.as_str()).collect();
    let types: Vec<String> = outputs.iter().map(Value::ty).collect();
    e.line(&format!(
        "return {} : {}",
        names.join(", "),
        types.join(", ")
    ));
    let body = e.finish();
    let named = |paths: &[String], values: &[Value]| -> Vec<ExportedValue> {
        paths
            .iter()
            .zip(values)
            .map(|(path, v)| ExportedValue {
                path: path.clone(),
                aval: Aval::new(Shape(v.dims.clone()), v.dtype),
            })
            .collect()
    };
    if result_paths.len() != outputs.len() {
        return Err(mlir::unsupported(format!(
            "the graph returns {} values for {} result leaves",
            outputs.len(),
            result_paths.len()
        )));
    }
    Ok(Exported {
        args: named(arg_paths, &inputs),
        results: named(result_paths, &outputs),
        body,
        symbols: symbol_lines,
        guards: graph
            .guards
            .iter()
            .map(|g| format!("{} ({})", g.condition, g.op))
            .collect(),
        mesh: None,
        shardings: BTreeMap::new(),
    })
}

/// The symbol a dim is, when it is a bare symbol.
fn bare_symbol(d: &Dim) -> Option<crate::shape::Symbol> {
    let Dim::Sym(expr) = d else { return None };
    let mut found = Vec::new();
    expr.symbols(&mut found);
    match found.as_slice() {
        [s] if **expr == crate::shape::SymExpr::symbol(*s) => Some(*s),
        _ => None,
    }
}

impl Exported {
    /// The arguments, in the order `@main` takes them (the flattened
    /// argument tree's leaves).
    pub fn args(&self) -> &[ExportedValue] {
        &self.args
    }

    /// The results, in the order `@main` returns them.
    pub fn results(&self) -> &[ExportedValue] {
        &self.results
    }

    /// Where each symbol of a shapeless export is read, like
    /// `s0 = args.x.shape[0]`; empty for a static export.
    pub fn symbols(&self) -> &[String] {
        &self.symbols
    }

    /// The conditions on the symbols every call must satisfy (as
    /// [`crate::Report::guards`] writes them); empty for a static export.
    pub fn guards(&self) -> &[String] {
        &self.guards
    }

    /// The module as MLIR text: `func.func public @main` over `tensor<…>`
    /// values, each argument named by `jax.arg_info` and each result by
    /// `jax.result_info` (their tree paths); with a mesh, the Shardy mesh
    /// and every argument's and result's `sdy.sharding`.
    pub fn stablehlo(&self) -> String {
        let partitions = self.mesh.as_ref().map_or(1, Mesh::devices);
        let mut attributes =
            format!("mhlo.num_partitions = {partitions} : i32, mhlo.num_replicas = 1 : i32");
        if !self.symbols.is_empty() {
            write!(
                attributes,
                ", jax.uses_shape_polymorphism = true, kiln.symbols = [{}], kiln.guards = [{}]",
                quoted(&self.symbols),
                quoted(&self.guards)
            )
            .unwrap_or(());
        }
        let mut text = format!("module @kiln attributes {{{attributes}}} {{\n");
        if let Some(mesh) = &self.mesh {
            writeln!(text, "  sdy.mesh @mesh = <[{}]>", mesh.axes_text()).unwrap_or(());
        }
        let args: Vec<String> = self
            .args
            .iter()
            .enumerate()
            .map(|(i, a)| {
                format!(
                    "%arg{i}: {} {{{}}}",
                    tensor_type(a.aval.shape.dims(), a.aval.dtype),
                    self.attributes("jax.arg_info", a)
                )
            })
            .collect();
        let results: Vec<String> = self
            .results
            .iter()
            .map(|r| {
                format!(
                    "{} {{{}}}",
                    tensor_type(r.aval.shape.dims(), r.aval.dtype),
                    self.attributes("jax.result_info", r)
                )
            })
            .collect();
        writeln!(
            text,
            "  func.func public @main({}) -> ({}) {{",
            args.join(", "),
            results.join(", ")
        )
        .unwrap_or(());
        text.push_str(&self.body);
        text.push_str("  }\n}\n");
        text
    }

    /// The attributes of one argument or result: its name and, with a
    /// mesh, its sharding (replicated unless [`Exported::shard`] said).
    fn attributes(&self, name_attribute: &str, value: &ExportedValue) -> String {
        let mut text = format!("{name_attribute} = \"{}\"", value.path);
        if self.mesh.is_some() {
            let dims: Vec<String> = match self.shardings.get(&value.path) {
                Some(spec) => spec
                    .iter()
                    .map(|axis| match axis {
                        Some(a) => format!("{{\"{a}\"}}"),
                        None => "{}".to_string(),
                    })
                    .collect(),
                None => vec!["{}".to_string(); value.aval.shape.rank()],
            };
            write!(
                text,
                ", sdy.sharding = #sdy.sharding<@mesh, [{}]>",
                dims.join(", ")
            )
            .unwrap_or(());
        }
        text
    }

    /// Writes [`Exported::stablehlo`] to `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.stablehlo()).map_err(|e| Error::InvalidArgument {
            op: "export".into(),
            detail: format!("cannot write {}: {e}", path.display()),
            at: None,
        })
    }
}

impl Exported {
    /// The module over the devices of `mesh`: every argument and result is
    /// replicated until [`Exported::shard`] splits it, and XLA partitions
    /// the program over `mesh.devices()` devices.
    pub fn with_mesh(mut self, mesh: Mesh) -> Exported {
        self.mesh = Some(mesh);
        self.shardings.clear();
        self
    }

    /// Splits the argument or result at `path` (`args.params.w1`,
    /// `out.loss`) along the mesh: `spec[d]` names the mesh axis dim `d`
    /// is split over (`None` keeps it whole). An `Err` names the path,
    /// the dim and the axis when there is no mesh yet, the path names no
    /// argument or result, the spec's length is not the rank, an axis is
    /// not the mesh's or is used twice, or an axis's size does not divide
    /// the dim it splits.
    ///
    /// ```
    /// use kiln::{compile, export::Mesh, Array};
    /// let f = compile(|(x, w): (Array, Array)| x.matmul(&w));
    /// let x = Array::from_vec(vec![1.0f32; 32], &[8, 4])?;
    /// let w = Array::from_vec(vec![1.0f32; 24], &[4, 6])?;
    /// let exported = f
    ///     .export(&(x, w))?
    ///     .with_mesh(Mesh::new([("data", 4), ("model", 2)])?)
    ///     .shard("args[0]", [Some("data"), None])?
    ///     .shard("args[1]", [None, Some("model")])?;
    /// assert!(exported.stablehlo().contains(r#"#sdy.sharding<@mesh, [{"data"}, {}]>"#));
    /// let err = exported.shard("args[1]", [None, Some("data")]).unwrap_err();
    /// assert!(err.to_string().contains("dim 1 of size 6 is not divisible by mesh axis `data`"));
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn shard<'s>(
        mut self,
        path: &str,
        spec: impl IntoIterator<Item = Option<&'s str>>,
    ) -> Result<Exported> {
        let spec: Vec<Option<String>> = spec.into_iter().map(|a| a.map(String::from)).collect();
        let Some(mesh) = &self.mesh else {
            return Err(shard::mesh_err(format!(
                "sharding `{path}` needs a mesh first (`with_mesh`)"
            )));
        };
        let value = self
            .args
            .iter()
            .chain(&self.results)
            .find(|v| v.path == path)
            .ok_or_else(|| {
                let known: Vec<&str> = self
                    .args
                    .iter()
                    .chain(&self.results)
                    .map(|v| v.path.as_str())
                    .collect();
                shard::mesh_err(format!(
                    "no argument or result at `{path}`; they are {}",
                    known.join(", ")
                ))
            })?;
        shard::check_spec(mesh, path, &value.aval, &spec)?;
        self.shardings.insert(path.to_string(), spec);
        Ok(self)
    }
}

/// `["a", "b"]`'s inside, each string quoted and escaped for MLIR.
fn quoted(items: &[String]) -> String {
    items
        .iter()
        .map(|s| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect::<Vec<_>>()
        .join(", ")
}
