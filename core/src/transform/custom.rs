//! The user-facing constructors of custom ops ([`CustomOp`]): they flatten
//! trees of arguments, so they sit above the tree layer, and hand every op
//! its runtime (`Bodies` in `custom_runtime.rs`), which builds its executables.

use super::custom_runtime::Bodies;
use super::implicit::optimize;
use crate::error::Result;
use crate::handle::array::Array;
use crate::ops::custom::{CustomCall, CustomDef, CustomOp};
use crate::ops::Op;
use crate::shape::Dim;
use crate::tree::def::TreeDef;
use crate::tree::{tree_flatten, tree_unflatten, Tree};
use std::marker::PhantomData;
use std::sync::Arc;

impl<A: Tree + 'static> CustomOp<A> {
    /// An op named `name` computing `forward`, with no vjp (differentiating
    /// through it is an `Err` naming it).
    pub fn new(
        name: impl Into<String>,
        forward: impl Fn(&A) -> Result<Array> + Send + Sync + 'static,
    ) -> Self {
        let forward =
            move |def: &TreeDef, leaves: Vec<Array>| forward(&tree_unflatten(def, leaves)?);
        CustomOp {
            def: Arc::new(CustomDef {
                name: name.into(),
                forward: Arc::new(forward),
                vjp: None,
                jvp: None,
                vmap: None,
                runtime: Bodies::runtime(optimize),
            }),
            arguments: PhantomData,
        }
    }

    /// The same op with a vjp: from the arguments, the output and its
    /// cotangent, one cotangent per argument in the arguments' own tree
    /// type `G` (usually `A` itself; static fields take none). `G` may put
    /// `None` (an `Option`) where the arguments have a whole subtree that
    /// takes no gradient. A result of another structure, or a cotangent of
    /// another shape or dtype than its argument, is an `Err` naming the path.
    pub fn with_vjp<G: Tree>(
        self,
        vjp: impl Fn(&A, &Array, &Array) -> Result<G> + Send + Sync + 'static,
    ) -> Self {
        let vjp = move |def: &TreeDef, leaves: Vec<Array>, out: &Array, g: &Array| {
            tree_flatten(&vjp(&tree_unflatten(def, leaves)?, out, g)?)
        };
        CustomOp {
            def: Arc::new(CustomDef {
                name: self.def.name.clone(),
                forward: self.def.forward.clone(),
                vjp: Some(Arc::new(vjp)),
                jvp: self.def.jvp.clone(),
                vmap: self.def.vmap.clone(),
                runtime: Bodies::runtime(optimize),
            }),
            arguments: PhantomData,
        }
    }

    /// The same op with a jvp (forward mode): from the arguments, the
    /// output and the arguments' tangents (in the arguments' own tree type,
    /// zeros for leaves without one; static fields as in the arguments),
    /// the output's tangent. A tangent of another shape or dtype than the
    /// output is an `Err` naming the op.
    ///
    /// ```
    /// use kiln::ops::custom::CustomOp;
    /// use kiln::{jvp, Array};
    /// let cube = CustomOp::new("cube", |x: &Array| Ok(x * x * x))
    ///     .with_jvp(|x: &Array, _out: &Array, t: &Array| Ok(x * x * 3.0 * t));
    /// let x = Array::from_vec(vec![2.0f32], &[1])?;
    /// let (y, dy) = jvp(|x: Array| cube.call(&x), &x, &Array::from_vec(vec![1.0f32], &[1])?)?;
    /// assert_eq!((y.to_vec::<f32>()?, dy.to_vec::<f32>()?), (vec![8.0], vec![12.0]));
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn with_jvp(
        self,
        jvp: impl Fn(&A, &Array, &A) -> Result<Array> + Send + Sync + 'static,
    ) -> Self {
        let jvp = move |def: &TreeDef, primals: Vec<Array>, out: &Array, tangents: Vec<Array>| {
            jvp(
                &tree_unflatten(def, primals)?,
                out,
                &tree_unflatten(def, tangents)?,
            )
        };
        CustomOp {
            def: Arc::new(CustomDef {
                name: self.def.name.clone(),
                forward: self.def.forward.clone(),
                vjp: self.def.vjp.clone(),
                jvp: Some(Arc::new(jvp)),
                vmap: self.def.vmap.clone(),
                runtime: Bodies::runtime(optimize),
            }),
            arguments: PhantomData,
        }
    }

    /// The same op with a batching rule for [`crate::vmap`]: from the
    /// arguments with every array leaf batched along a new first axis of
    /// `size` examples (leaves shared by all examples broadcast; static
    /// fields as they are), the batched output, its batch axis first. A
    /// result of another shape or dtype is an `Err` naming the op. Without
    /// a rule, vmap runs the op once per example.
    ///
    /// ```
    /// use kiln::ops::custom::CustomOp;
    /// use kiln::{vmap, Array};
    /// let norm = CustomOp::new("norm", |x: &Array| Ok((x * x).sum_all().sqrt()))
    ///     .with_vmap(|x: &Array, _size| Ok((x * x).sum(&[-1], false).sqrt()));
    /// let xs = Array::from_vec(vec![3.0f32, 4.0, 6.0, 8.0], &[2, 2])?;
    /// let norms = vmap(|x: Array| norm.call(&x)).call(&xs)?;
    /// assert_eq!(norms.to_vec::<f32>()?, vec![5.0, 10.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn with_vmap(
        self,
        rule: impl Fn(&A, &Dim) -> Result<Array> + Send + Sync + 'static,
    ) -> Self {
        let rule = move |def: &TreeDef, leaves: Vec<Array>, size: &Dim| {
            rule(&tree_unflatten(def, leaves)?, size)
        };
        CustomOp {
            def: Arc::new(CustomDef {
                name: self.def.name.clone(),
                forward: self.def.forward.clone(),
                vjp: self.def.vjp.clone(),
                jvp: self.def.jvp.clone(),
                vmap: Some(Arc::new(rule)),
                runtime: Bodies::runtime(optimize),
            }),
            arguments: PhantomData,
        }
    }

    /// Applies the op: one node whose operands are the array leaves of
    /// `args` (a failed array if `args` does not flatten or the forward
    /// fails for these operands).
    pub fn call(&self, args: &A) -> Array {
        match tree_flatten(args) {
            Ok((leaves, args)) => Array::apply(
                Op::Custom(CustomCall {
                    def: self.def.clone(),
                    args,
                }),
                leaves,
            ),
            Err(e) => Array::failed(e),
        }
    }
}
