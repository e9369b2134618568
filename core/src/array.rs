//! `Array`: a cheap, clonable handle to a lazy node of the graph.

use crate::data::{HostData, HostElement};
use crate::error::{Error, Result};
use crate::shape::{Aval, Shape};
use crate::DType;
use std::sync::Arc;

/// A handle to an array value: data, a pending op, or a traced value.
#[derive(Clone, Debug)]
pub struct Array {
    node: Arc<Node>,
}

#[derive(Debug)]
struct Node {
    aval: Aval,
    data: Arc<HostData>,
}

impl Array {
    /// An array of `shape` from row-major `values`.
    pub fn from_vec<T: HostElement>(values: Vec<T>, shape: &[usize]) -> Result<Array> {
        if values.len() != shape.iter().product::<usize>() {
            return Err(Error::DataLength {
                shape: shape.to_vec(),
                len: values.len(),
            });
        }
        Ok(Array {
            node: Arc::new(Node {
                aval: Aval::new(Shape::known(shape), T::DTYPE),
                data: Arc::new(T::wrap(values)),
            }),
        })
    }

    /// The abstract value (shape and dtype).
    pub fn aval(&self) -> &Aval {
        &self.node.aval
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.node.aval.dtype
    }

    /// The elements as `T`.
    pub fn to_vec<T: HostElement>(&self) -> Result<Vec<T>> {
        Ok(self.node.data.to_vec())
    }
}
