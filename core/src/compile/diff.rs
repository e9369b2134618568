//! How two compiled entries differ: what differs between their cache keys
//! ([`crate::Compiled::key_difference`]) and what the compiler made of
//! each ([`Report::diff`]): nodes only one has, nodes both have whose aval,
//! op (fusion) or reinplace decision changed, and peak bytes.
//!
//! Nodes are matched by what made them, not by id (ids shift as soon as
//! one node is added): the op's name, the script position that made it and
//! how many such nodes came before it.
//!
//! ```
//! use kiln::{compile, Array, DType};
//! let f = compile(|x: Array| x.exp().sum(&[0], false));
//! f.call(&Array::ones(&[4], DType::F32))?;
//! f.call(&Array::ones(&[8], DType::F32))?;
//! let cache = f.cache();
//! let diff = cache.reports[0].diff(&cache.reports[1]);
//! assert!(diff.added.is_empty() && diff.removed.is_empty());
//! assert!(diff.changed.iter().any(|c| c.what.iter().any(|w| w == "aval f32[4] → f32[8]")));
//! assert_eq!(f.key_difference(0, 1)?[0].to_string(), "aval differs at leaf args: f32[4] → f32[8]");
//! # Ok::<(), kiln::Error>(())
//! ```

use super::report::{Report, ReportNode};
use crate::plan::ReinplaceDecision;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// What differs between the graphs and plans of two entries' reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportDiff {
    /// Nodes only the later report has (its node ids).
    pub added: Vec<usize>,
    /// Nodes only the earlier report has (its node ids).
    pub removed: Vec<usize>,
    /// Nodes both have that differ.
    pub changed: Vec<NodeChange>,
    /// The earlier plan's peak bytes.
    pub peak_before: usize,
    /// The later plan's peak bytes.
    pub peak_after: usize,
}

/// A node both reports have, and what differs about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeChange {
    /// Its id in the earlier report.
    pub before: usize,
    /// Its id in the later report.
    pub after: usize,
    /// Each difference: `aval f32[2,3] → f32[5,3]`, `op fused(exp, mul) →
    /// fused(exp)`, `reinplace in place of %1 → refused (…)`.
    pub what: Vec<String>,
}

impl Report {
    /// How `later`'s graph and plan differ from this report's (see the
    /// [module](crate::compile::diff)).
    pub fn diff(&self, later: &Report) -> ReportDiff {
        let before = identities(self);
        let after = identities(later);
        let by_identity: HashMap<&Identity, usize> =
            before.iter().enumerate().map(|(id, k)| (k, id)).collect();
        let mut matched = vec![false; self.nodes.len()];
        let mut diff = ReportDiff {
            peak_before: self.plan.memory.peak_bytes,
            peak_after: later.plan.memory.peak_bytes,
            ..ReportDiff::default()
        };
        for (id, identity) in after.iter().enumerate() {
            let Some(&old) = by_identity.get(identity) else {
                diff.added.push(id);
                continue;
            };
            matched[old] = true;
            let what = node_changes(&self.nodes[old], &later.nodes[id]);
            if !what.is_empty() {
                diff.changed.push(NodeChange {
                    before: old,
                    after: id,
                    what,
                });
            }
        }
        diff.removed = (0..self.nodes.len()).filter(|&id| !matched[id]).collect();
        diff
    }
}

/// What made a node: its op's name (`exp`, `fused`, `input args[0]`), the
/// script position, and how many nodes of both came before it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Identity {
    op: String,
    at: Option<(u32, u32)>,
    nth: usize,
}

fn identities(report: &Report) -> Vec<Identity> {
    let mut seen: HashMap<(String, Option<(u32, u32)>), usize> = HashMap::new();
    report
        .nodes
        .iter()
        .map(|node| {
            let op = op_name(&node.op).to_string();
            let at = node.location.map(|l| (l.line, l.column));
            let nth = seen.entry((op.clone(), at)).or_default();
            let identity = Identity { op, at, nth: *nth };
            *nth += 1;
            identity
        })
        .collect()
}

/// The op's name without its parameters: `sum(axes=[0])` is `sum`.
fn op_name(op: &str) -> &str {
    op.split('(').next().unwrap_or(op)
}

fn node_changes(before: &ReportNode, after: &ReportNode) -> Vec<String> {
    let mut what = Vec::new();
    if before.aval != after.aval {
        what.push(format!("aval {} → {}", before.aval, after.aval));
    }
    if before.op != after.op {
        what.push(format!("op {} → {}", before.op, after.op));
    }
    let (b, a) = (
        verdict(before.reinplace.as_ref()),
        verdict(after.reinplace.as_ref()),
    );
    if b != a {
        what.push(format!("reinplace {b} → {a}"));
    }
    what
}

/// A reinplace decision in a few words: `in place of %1`, `refused (…)`,
/// `none` for a node that has none.
fn verdict(decision: Option<&ReinplaceDecision>) -> String {
    let Some(decision) = decision else {
        return "none".to_string();
    };
    match decision.target() {
        Some(operand) => format!("in place of %{operand}"),
        None => {
            let reasons: Vec<String> = decision
                .operands
                .iter()
                .filter_map(|v| v.refusal.as_ref().map(ToString::to_string))
                .collect();
            format!("refused ({})", reasons.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{compile, Array, DType};

    #[test]
    fn a_diff_of_one_report_with_itself_is_empty() {
        let f = compile(|x: Array| (x.exp() * 2.0).sum(&[0], false));
        f.call(&Array::ones(&[4], DType::F32)).unwrap();
        let report = &f.cache().reports[0];
        let diff = report.diff(report);
        assert!(diff.added.is_empty() && diff.removed.is_empty() && diff.changed.is_empty());
        assert_eq!(diff.peak_before, diff.peak_after);
    }

    #[test]
    fn nodes_are_matched_by_what_made_them_and_new_ones_are_added() {
        let a = compile(|x: Array| x.exp()).fusion(false);
        let b = compile(|x: Array| x.exp().tanh()).fusion(false);
        let x = Array::ones(&[4], DType::F32);
        a.call(&x).unwrap();
        b.call(&x).unwrap();
        let (ra, rb) = (&a.cache().reports[0], &b.cache().reports[0]);
        let diff = ra.diff(rb);
        let added: Vec<&str> = diff
            .added
            .iter()
            .map(|&n| rb.nodes[n].op.as_str())
            .collect();
        assert_eq!(added, vec!["tanh"]);
        assert!(diff.removed.is_empty(), "{diff:?}");
    }
}
