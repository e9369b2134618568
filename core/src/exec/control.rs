//! Control flow on the CPU: a control node's subgraphs run through their
//! own executables (planned once, when the enclosing executable was
//! built), once per iteration or for the branch taken.
//!
//! A loop's carries move from one iteration to the next without a copy:
//! the body's plan may write over them (they are donated to it), and each
//! carry buffer has one owner between iterations, so a carry the body
//! updates in place (a cache written by `dynamic_update_slice`) stays in
//! one buffer for the whole loop. The operands arrive shared, not copied
//! (a decode loop's constants are a model's weights): an initial carry the
//! caller still holds is copied by the body's first in-place write, one it
//! gave up (its last reader is the loop, or it was donated) is not.

use super::Executable;
use crate::data::HostData;
use crate::error::{Error, Result};
use crate::ops::{ControlCall, ControlKind};
use std::sync::Arc;

/// Runs an executable on argument buffers with its values' shapes: the
/// CPU executor, handed in by it.
pub(super) type RunBody<'a> =
    &'a dyn Fn(&Executable, Vec<Arc<HostData>>, &[Vec<usize>]) -> Result<Vec<Arc<HostData>>>;

/// The results of control node `call` over `operands` (of `shapes`), with
/// its subgraphs' executables `bodies`, each run by `run`. The carries are
/// moved out of `operands`; the rest are shared with the bodies.
pub(super) fn run_control(
    call: &ControlCall,
    bodies: &[Arc<Executable>],
    mut operands: Vec<Arc<HostData>>,
    shapes: &[&[usize]],
    run: RunBody<'_>,
) -> Result<Vec<Arc<HostData>>> {
    if bodies.len() != call.graphs().len() {
        return Err(Error::InvalidPlan {
            detail: format!(
                "`{}` has {} subgraphs but {} executables",
                call.name(),
                call.graphs().len(),
                bodies.len()
            ),
        });
    }
    let consts: Vec<Arc<HostData>> =
        operands[call.first_const()..call.carry_operands().start].to_vec();
    let carries = call.carry_operands();
    // The carries move out: a buffer the caller gave up is then the
    // body's alone, and the body writes it in place.
    let mut carry: Vec<Arc<HostData>> = carries
        .clone()
        .map(|i| std::mem::replace(&mut operands[i], Arc::new(HostData::U8(Vec::new()))))
        .collect();
    // A scan's scanned arrays are the operands after its carries; `row`
    // is the iteration's slice of each (no other construct slices).
    let inputs_of = |carry: Vec<Arc<HostData>>, row: Option<usize>| -> Result<Vec<Arc<HostData>>> {
        let mut inputs = consts.clone();
        inputs.extend(carry);
        let Some(i) = row else {
            return Ok(inputs);
        };
        for operand in carries.end..operands.len() {
            let (data, shape) = (&operands[operand], shapes[operand]);
            let len: usize = shape[1..].iter().product();
            inputs.push(Arc::new(data.range(i * len, len).ok_or_else(|| {
                Error::InvalidPlan {
                    detail: format!("`{}` reads row {i} of an operand of {shape:?}", call.name()),
                }
            })?));
        }
        Ok(inputs)
    };
    let in_shapes = |graph: usize| -> Vec<&[usize]> {
        call.subgraph_inputs(graph)
            .iter()
            .map(|i| {
                let shape = shapes[i.operand];
                if i.sliced {
                    &shape[1..]
                } else {
                    shape
                }
            })
            .collect()
    };
    match &call.kind {
        ControlKind::Scan { reverse, length } => {
            let body = &bodies[0];
            let body_shapes = body.resolve_shapes(&in_shapes(0))?.into_owned();
            // The scanned arrays' leading dim; a scan without any has a
            // static length.
            let length = match shapes.get(carries.end) {
                Some(first_scanned) => first_scanned[0],
                None => length.known().unwrap_or(0),
            };
            let graph = body.graph();
            let num_carry = carries.len();
            let mut ys: Vec<HostData> = graph.outputs[num_carry..]
                .iter()
                .map(|&o| {
                    let n: usize = body_shapes[o].iter().product();
                    HostData::try_filled("scan", graph.nodes[o].aval.dtype, n * length, 0.0)
                })
                .collect::<Result<_>>()?;
            for step in 0..length {
                let row = if *reverse { length - 1 - step } else { step };
                let inputs = inputs_of(std::mem::take(&mut carry), Some(row))?;
                let mut outputs = run(body, inputs, &body_shapes)?;
                for (y, out) in ys.iter_mut().zip(&outputs[num_carry..]) {
                    y.write_range(row * out.len(), out)
                        .map_err(|detail| Error::InvalidPlan { detail })?;
                }
                outputs.truncate(num_carry);
                carry = outputs;
            }
            carry.extend(ys.into_iter().map(Arc::new));
            Ok(carry)
        }
        ControlKind::While => {
            let (test, body) = (&bodies[0], &bodies[1]);
            let test_shapes = test.resolve_shapes(&in_shapes(0))?.into_owned();
            let body_shapes = body.resolve_shapes(&in_shapes(1))?.into_owned();
            loop {
                let holds = run(test, inputs_of(carry.clone(), None)?, &test_shapes)?
                    .first()
                    .is_some_and(|pred| pred.get_f64(0) != 0.0);
                if !holds {
                    return Ok(carry);
                }
                carry = run(body, inputs_of(carry, None)?, &body_shapes)?;
            }
        }
        ControlKind::Switch => {
            let last = bodies.len() - 1;
            let index = operands[0].get_f64(0).clamp(0.0, last as f64) as usize;
            let branch = &bodies[index];
            let branch_shapes = branch.resolve_shapes(&in_shapes(index))?.into_owned();
            run(branch, inputs_of(carry, None)?, &branch_shapes)
        }
    }
}
