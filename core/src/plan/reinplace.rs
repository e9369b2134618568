//! The reinplace pass: for every node that may write over an operand
//! (elementwise ops, and kernels over their declared in-place input),
//! whether its output is written into that operand's buffer, with the
//! reason for every operand it could not take.

use super::Lifetime;
use crate::ir::graph::{Graph, ValueId, ValueKind};
use crate::shape::{Dim, Shape};
use crate::symbolic::DimFacts;
use crate::DType;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Why an operand's buffer may not hold the node's output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason")]
pub enum Refusal {
    /// The operand is a caller's argument that was not donated.
    CallerInput {
        /// The argument leaf.
        leaf: usize,
    },
    /// The operand is constant data shared by every call.
    Constant,
    /// A node scheduled after this one reads the operand (as any operand,
    /// mutated or not).
    ReadLater {
        /// The last node that reads it.
        reader: ValueId,
    },
    /// The operand is returned to the caller and must survive.
    GraphOutput {
        /// Its position among the outputs.
        index: usize,
    },
    /// The operand is broadcast up to a larger output.
    ShapeGrows {
        /// The operand's shape.
        operand: String,
        /// The output's shape.
        output: String,
    },
    /// The shapes may differ for some call: a symbolic dim of one is not
    /// provably equal to the other's.
    ShapeNotProvablyEqual {
        /// The operand's shape.
        operand: String,
        /// The output's shape.
        output: String,
    },
    /// The output has another dtype than the operand.
    DtypeChanges {
        /// The operand's dtype.
        operand: DType,
        /// The output's dtype.
        output: DType,
    },
    /// The node also reads the operand as an input it may not write over
    /// (a kernel given its in-place input twice).
    AlsoReadAs {
        /// The other operand position.
        position: usize,
    },
    /// The operand was eligible, but another eligible operand was taken.
    MultipleCandidates {
        /// The operand whose buffer was taken.
        chosen: ValueId,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::CallerInput { leaf } => {
                write!(f, "caller's argument (leaf {leaf}), not donated")
            }
            Refusal::Constant => f.write_str("constant data shared by every call"),
            Refusal::ReadLater { reader } => write!(f, "read later by %{reader}"),
            Refusal::GraphOutput { index } => write!(f, "returned as output {index}"),
            Refusal::ShapeGrows { operand, output } => {
                write!(f, "broadcast from {operand} to {output}")
            }
            Refusal::ShapeNotProvablyEqual { operand, output } => {
                write!(f, "shape {operand} not provably equal to {output}")
            }
            Refusal::DtypeChanges { operand, output } => {
                write!(f, "dtype changes from {operand} to {output}")
            }
            Refusal::AlsoReadAs { position } => {
                write!(
                    f,
                    "also read as input {position}, which is not written in place"
                )
            }
            Refusal::MultipleCandidates { chosen } => {
                write!(f, "eligible, but %{chosen} was taken instead")
            }
        }
    }
}

/// What happened to one distinct operand of an elementwise node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperandVerdict {
    /// The operand value.
    pub operand: ValueId,
    /// The operand positions where the node reads it (`x + x` reads one
    /// value at two positions).
    pub positions: Vec<usize>,
    /// `None` when its buffer was taken, otherwise why not.
    pub refusal: Option<Refusal>,
}

/// The reinplace decision for one elementwise node, taken or refused, with
/// a verdict for every distinct operand.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReinplaceDecision {
    /// The node.
    pub node: ValueId,
    /// The node's op, as reports show it.
    pub op: String,
    /// One verdict per distinct operand, in operand order.
    pub operands: Vec<OperandVerdict>,
}

impl ReinplaceDecision {
    /// The operand whose buffer the output takes, if any.
    pub fn target(&self) -> Option<ValueId> {
        self.operands
            .iter()
            .find(|v| v.refusal.is_none())
            .map(|v| v.operand)
    }

    /// `in place of %3` or `refused: %3 read later by %7; %4 …`.
    pub fn summary(&self) -> String {
        if let Some(target) = self.target() {
            return format!("in place of %{target}");
        }
        let reasons: Vec<String> = self
            .operands
            .iter()
            .filter_map(|v| v.refusal.as_ref().map(|r| format!("%{} {r}", v.operand)))
            .collect();
        format!("refused: {}", reasons.join("; "))
    }
}

/// Decides every elementwise node of `graph`, in schedule order. `donated`
/// marks the argument leaves whose buffers the caller gave up; `lifetimes`
/// are the values' lifetimes ([`lifetimes`](super::lifetimes)).
pub fn reinplace(
    graph: &Graph,
    donated: &[bool],
    lifetimes: &[Lifetime],
) -> Vec<ReinplaceDecision> {
    let n = graph.nodes.len();
    let mut output_index = vec![None; n];
    for (index, &o) in graph.outputs.iter().enumerate() {
        output_index[o].get_or_insert(index);
    }
    let facts = graph.dim_facts();
    let mut decisions = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let ValueKind::Op(op) = &node.kind else {
            continue;
        };
        if !(0..node.inputs.len()).any(|position| op.may_write_over(position)) {
            continue;
        }
        let mut operands: Vec<OperandVerdict> = Vec::with_capacity(node.inputs.len());
        for (position, &j) in node.inputs.iter().enumerate() {
            if !op.may_write_over(position) {
                continue;
            }
            if let Some(seen) = operands.iter_mut().find(|v| v.operand == j) {
                seen.positions.push(position);
                continue;
            }
            let operand = &graph.nodes[j];
            let refusal = match operand.kind {
                ValueKind::Input(leaf) if !donated.get(leaf).copied().unwrap_or(false) => {
                    Some(Refusal::CallerInput { leaf })
                }
                ValueKind::Constant(_) => Some(Refusal::Constant),
                _ => None,
            }
            .or_else(|| {
                let read_elsewhere = node
                    .inputs
                    .iter()
                    .enumerate()
                    .find(|&(p, &k)| k == j && !op.may_write_over(p));
                read_elsewhere.map(|(position, _)| Refusal::AlsoReadAs { position })
            })
            .or_else(|| output_index[j].map(|index| Refusal::GraphOutput { index }))
            .or_else(|| {
                (operand.aval.dtype != node.aval.dtype).then_some(Refusal::DtypeChanges {
                    operand: operand.aval.dtype,
                    output: node.aval.dtype,
                })
            })
            .or_else(|| shape_refusal(&facts, &operand.aval.shape, &node.aval.shape))
            .or_else(|| {
                // Outputs were refused above, so a later end is a reader.
                let last = lifetimes[j].last;
                (last > i).then_some(Refusal::ReadLater { reader: last })
            });
            operands.push(OperandVerdict {
                operand: j,
                positions: vec![position],
                refusal,
            });
        }
        // The first eligible operand is taken; the others say so.
        let mut chosen = None;
        for verdict in &mut operands {
            if verdict.refusal.is_none() {
                match chosen {
                    None => chosen = Some(verdict.operand),
                    Some(chosen) => verdict.refusal = Some(Refusal::MultipleCandidates { chosen }),
                }
            }
        }
        decisions.push(ReinplaceDecision {
            node: i,
            op: op.describe(),
            operands,
        });
    }
    decisions
}

/// Why an operand of shape `operand` cannot hold an output of shape
/// `output`, if it cannot: equality must be provable, dim by dim, from the
/// graph's guards.
fn shape_refusal(facts: &DimFacts, operand: &Shape, output: &Shape) -> Option<Refusal> {
    if facts.shapes_equal(operand, output) {
        return None;
    }
    let describe = |grows: bool| {
        let (operand, output) = (operand.to_string(), output.to_string());
        if grows {
            Refusal::ShapeGrows { operand, output }
        } else {
            Refusal::ShapeNotProvablyEqual { operand, output }
        }
    };
    if operand.rank() != output.rank() {
        return Some(describe(true));
    }
    let grows = operand
        .dims()
        .iter()
        .zip(output.dims())
        .any(|(a, b)| match (a, b) {
            (Dim::Known(x), Dim::Known(y)) => x != y,
            (Dim::Known(1), _) => true,
            _ => false,
        });
    Some(describe(grows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::Symbol;

    #[test]
    fn symbolic_shapes_are_refused_unless_the_guards_make_them_equal() {
        let (s0, s1) = (Dim::symbol(Symbol(0)), Dim::symbol(Symbol(1)));
        let (a, b) = (Shape(vec![s0.clone()]), Shape(vec![s1.clone()]));
        let none = DimFacts::new();
        assert_eq!(
            shape_refusal(&none, &a, &b),
            Some(Refusal::ShapeNotProvablyEqual {
                operand: "[s0]".into(),
                output: "[s1]".into()
            })
        );
        let guarded = DimFacts::from_equalities([("add", &s0, &s1)]);
        assert_eq!(shape_refusal(&guarded, &a, &b), None);
        assert!(matches!(
            shape_refusal(&guarded, &Shape::known(&[1]), &b),
            Some(Refusal::ShapeGrows { .. })
        ));
    }
}
