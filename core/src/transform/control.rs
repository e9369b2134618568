//! Reverse and forward mode through control flow. A control node has
//! several results ([`Op::Get`](crate::ops::Op::Get) values), so the walks hand it all of its
//! results' cotangents (or all of its operands' tangents) at once and
//! these rules build new control nodes: the transformed bodies are traced
//! by replaying the original body graph and differentiating the replay.
//!
//! * **scan, reverse mode**: a residual scan runs the body again and
//!   stacks the carry entering every iteration; a reverse scan then runs
//!   the body's vjp at each iteration's carry and slice, carrying the
//!   carries' cotangent and the sum of the captured values' cotangents,
//!   and stacking the slices' cotangents. The residual scan is the primal
//!   scan with more results, so the passes merge the two and the forward
//!   pass runs once; the saved memory is the stacked carries.
//! * **switch**: a switch over the same index whose branches are the
//!   branches' vjps (or jvps), zeros where a branch has no gradient.
//! * **while_loop**: forward mode only (a while over the primal and
//!   tangent carries); reverse mode is an `Err`, as in JAX: its trip count
//!   is known only when it runs, so there is nothing to stack residuals in.
//! * **scan, forward mode**: a scan over the primal and tangent carries
//!   and slices, whose body is the body's jvp.

use crate::error::{arg_err, Result};
use crate::handle::array::Array;
use crate::ir::graph::Graph;
use crate::ops::batching::Batched;
use crate::ops::select::select;
use crate::ops::{Backward, BatchWalk, Forward};
use crate::ops::{ControlCall, ControlKind};
use crate::shape::{Aval, Dim, Shape};
use crate::trace::control::{build_scan, build_switch, build_while, replay, FlatBranch};
use crate::DType;

/// Positions of `values` with a float dtype.
fn floats(values: &[Array]) -> Vec<usize> {
    (0..values.len())
        .filter(|&i| values[i].dtype().is_float())
        .collect()
}

/// The values of `values` that are given, at `positions` (all given).
fn present(values: &[Option<Array>], positions: &[usize]) -> Vec<Array> {
    positions
        .iter()
        .filter_map(|&i| values.get(i).cloned().flatten())
        .collect()
}

/// Sets `seeds[offset + positions[k]]` to `values[k]` for every `k`.
fn seed(seeds: &mut [Option<Array>], offset: usize, positions: &[usize], values: &[Array]) {
    for (&i, v) in positions.iter().zip(values) {
        seeds[offset + i] = Some(v.clone());
    }
}

/// `grad` where given, else zeros like `like`.
fn or_zeros(grad: Option<Array>, like: &Array) -> Array {
    grad.unwrap_or_else(|| like.zeros_like())
}

/// The cotangents of a control node's operands `inputs` for the
/// cotangents `cts` of its results (`None` where zero);
/// `backward` is the reverse-mode walk, handed in by it.
pub(crate) fn vjp(
    call: &ControlCall,
    inputs: &[Array],
    cts: Vec<Option<Array>>,
    backward: Backward<'_>,
) -> Result<Vec<Option<Array>>> {
    match &call.kind {
        ControlKind::Scan { length, reverse } => {
            let graph = &call.graphs()[0];
            let carries = call.carry_operands();
            let consts = &inputs[..carries.start];
            let init = &inputs[carries.clone()];
            let xs = &inputs[carries.end..];
            let k = init.len();
            // The carry entering each iteration, stacked, after the
            // body's own results: the same body with more outputs, which the
            // passes merge with the primal scan (`merge_scans`), so the
            // forward pass runs once.
            let residual = build_scan(length.clone(), *reverse, consts, init, xs, |cs, c, x| {
                let outs = replay(graph, &[cs, c, x].concat())?;
                let mut ys = outs[k..].to_vec();
                ys.extend(c.iter().cloned());
                Ok((outs[..k].to_vec(), ys))
            })?;
            let stacked_carries = &residual[residual.len() - k..];
            let (float_consts, float_carries, float_xs) =
                (floats(consts), floats(init), floats(xs));
            let given_ys: Vec<usize> = (k..cts.len()).filter(|&i| cts[i].is_some()).collect();
            let ct_carry: Vec<Array> = float_carries
                .iter()
                .map(|&i| or_zeros(cts[i].clone(), &init[i]))
                .collect();
            let acc: Vec<Array> = float_consts
                .iter()
                .map(|&i| consts[i].zeros_like())
                .collect();
            let mut scanned: Vec<Array> = stacked_carries.to_vec();
            scanned.extend(xs.iter().cloned());
            scanned.extend(present(&cts, &given_ys));
            let (nfc, nxs) = (float_carries.len(), xs.len());
            // The body reads the consts as the values they are, not as
            // placeholders: what it computes from them alone (`wᵀ` for
            // `g · wᵀ`) is captured, so computed once outside the loop.
            let results = build_scan(
                length.clone(),
                !*reverse,
                &[],
                &[ct_carry, acc].concat(),
                &scanned,
                |_, carry, x| {
                    let cs = consts;
                    let (ct_c, acc) = carry.split_at(nfc);
                    let (c_i, rest) = x.split_at(k);
                    let (x_i, ct_y) = rest.split_at(nxs);
                    let wrt = [cs, c_i, x_i].concat();
                    let outs = replay(graph, &wrt)?;
                    let mut seeds: Vec<Option<Array>> = vec![None; outs.len()];
                    seed(&mut seeds, 0, &float_carries, ct_c);
                    seed(&mut seeds, 0, &given_ys, ct_y);
                    let grads = backward(&outs, seeds, &wrt)?;
                    let (g_consts, rest) = grads.split_at(cs.len());
                    let (g_carry, g_xs) = rest.split_at(k);
                    let mut new_carry: Vec<Array> = float_carries
                        .iter()
                        .map(|&i| or_zeros(g_carry[i].clone(), &c_i[i]))
                        .collect();
                    new_carry.extend(float_consts.iter().zip(acc).map(|(&i, a)| {
                        match &g_consts[i] {
                            Some(g) => a + g,
                            None => a.clone(),
                        }
                    }));
                    let ys = float_xs
                        .iter()
                        .map(|&i| or_zeros(g_xs[i].clone(), &x_i[i]))
                        .collect();
                    Ok((new_carry, ys))
                },
            )?;
            let mut grads: Vec<Option<Array>> = vec![None; inputs.len()];
            let (g_carry, rest) = results.split_at(nfc);
            let (g_consts, g_xs) = rest.split_at(float_consts.len());
            for (&i, g) in float_carries.iter().zip(g_carry) {
                grads[carries.start + i] = Some(g.clone());
            }
            for (&i, g) in float_consts.iter().zip(g_consts) {
                grads[i] = Some(g.clone());
            }
            for (&i, g) in float_xs.iter().zip(g_xs) {
                grads[carries.end + i] = Some(g.clone());
            }
            Ok(grads)
        }
        ControlKind::Switch => {
            let nc = call.num_consts;
            let (index, rest) = inputs.split_at(1);
            let (consts, operands) = rest.split_at(nc);
            let targets = floats(rest);
            let given: Vec<usize> = (0..cts.len()).filter(|&i| cts[i].is_some()).collect();
            let given_cts = present(&cts, &given);
            let branches: Vec<FlatBranch<'_>> = call
                .graphs()
                .iter()
                .map(|graph| {
                    let (targets, given) = (&targets, &given);
                    Box::new(move |cs: &[Array], ops: &[Array]| {
                        let (cs, cts) = cs.split_at(nc);
                        let wrt = [cs, ops].concat();
                        let outs = replay(graph, &wrt)?;
                        let mut seeds: Vec<Option<Array>> = vec![None; outs.len()];
                        seed(&mut seeds, 0, given, cts);
                        let grads = backward(&outs, seeds, &wrt)?;
                        Ok(targets
                            .iter()
                            .map(|&i| or_zeros(grads[i].clone(), &wrt[i]))
                            .collect())
                    }) as FlatBranch<'_>
                })
                .collect();
            let results = build_switch(
                &index[0],
                &[consts, &given_cts].concat(),
                operands,
                branches,
            )?;
            let mut grads: Vec<Option<Array>> = vec![None; inputs.len()];
            for (&i, g) in targets.iter().zip(results) {
                grads[1 + i] = Some(g);
            }
            Ok(grads)
        }
        ControlKind::While => Err(arg_err(
            "while_loop",
            "is forward-only: reverse-mode gradients cannot flow through it (its trip count is \
             known only when it runs, as in JAX); use `scan` or `fori_loop`, whose trip count \
             is static",
        )),
    }
}

/// The tangents of a control node's results when its operands `inputs`
/// have the tangents `tangents` (`None` where zero);
/// `push_tangents` is the forward-mode walk, handed in by it.
pub(crate) fn jvp(
    call: &ControlCall,
    inputs: &[Array],
    tangents: &[Option<Array>],
    push_tangents: Forward<'_>,
) -> Result<Vec<Option<Array>>> {
    let graphs = call.graphs();
    // The operands with a tangent, and their tangents.
    let given: Vec<usize> = (0..inputs.len())
        .filter(|&i| tangents[i].is_some())
        .collect();
    match &call.kind {
        ControlKind::Scan { length, reverse } => {
            let graph = &graphs[0];
            let carries = call.carry_operands();
            let consts = &inputs[..carries.start];
            let init = &inputs[carries.clone()];
            let xs = &inputs[carries.end..];
            let k = init.len();
            let float_carries = floats(init);
            let given_consts: Vec<usize> = given
                .iter()
                .copied()
                .filter(|&i| i < carries.start)
                .collect();
            let given_xs: Vec<usize> = given
                .iter()
                .copied()
                .filter(|&i| i >= carries.end)
                .collect();
            let mut scan_consts = consts.to_vec();
            scan_consts.extend(present(tangents, &given_consts));
            let mut carry = init.to_vec();
            carry.extend(
                float_carries
                    .iter()
                    .map(|&i| or_zeros(tangents[carries.start + i].clone(), &init[i])),
            );
            let mut scanned = xs.to_vec();
            scanned.extend(present(tangents, &given_xs));
            let xs_positions: Vec<usize> = given_xs.iter().map(|&i| i - carries.end).collect();
            let ys_float: Vec<usize> = (0..graph.outputs.len() - k)
                .filter(|&j| graph.nodes[graph.outputs[k + j]].aval.dtype.is_float())
                .collect();
            let results = build_scan(
                length.clone(),
                *reverse,
                &scan_consts,
                &carry,
                &scanned,
                |cs, c, x| {
                    let (cs, t_cs) = cs.split_at(consts.len());
                    let (c, t_c) = c.split_at(k);
                    let (x, t_x) = x.split_at(xs.len());
                    let wrt = [cs, c, x].concat();
                    let mut seeds: Vec<Option<Array>> = vec![None; wrt.len()];
                    seed(&mut seeds, 0, &given_consts, t_cs);
                    seed(&mut seeds, cs.len(), &float_carries, t_c);
                    seed(&mut seeds, cs.len() + k, &xs_positions, t_x);
                    let outs = replay(graph, &wrt)?;
                    let touts = push_tangents(&outs, &wrt, seeds)?;
                    let mut new_carry = outs[..k].to_vec();
                    new_carry.extend(
                        float_carries
                            .iter()
                            .map(|&i| or_zeros(touts[i].clone(), &outs[i])),
                    );
                    let ys = ys_float
                        .iter()
                        .map(|&j| or_zeros(touts[k + j].clone(), &outs[k + j]))
                        .collect();
                    Ok((new_carry, ys))
                },
            )?;
            let mut out: Vec<Option<Array>> = vec![None; call.results.len()];
            let t_carry = &results[k..k + float_carries.len()];
            for (&i, t) in float_carries.iter().zip(t_carry) {
                out[i] = Some(t.clone());
            }
            let t_ys = &results[k + float_carries.len()..];
            for (&j, t) in ys_float.iter().zip(t_ys) {
                out[k + j] = Some(t.clone());
            }
            Ok(out)
        }
        ControlKind::Switch => {
            let nc = call.num_consts;
            let (index, rest) = inputs.split_at(1);
            let (consts, operands) = rest.split_at(nc);
            let given_rest: Vec<usize> = given.iter().filter(|&&i| i > 0).map(|&i| i - 1).collect();
            let given_tangents = present(&tangents[1..], &given_rest);
            let result_floats: Vec<usize> = (0..call.results.len())
                .filter(|&i| call.results[i].dtype.is_float())
                .collect();
            let branches: Vec<FlatBranch<'_>> = graphs
                .iter()
                .map(|graph| {
                    let (given_rest, result_floats) = (&given_rest, &result_floats);
                    Box::new(move |cs: &[Array], ops: &[Array]| {
                        let (ops, ts) = ops.split_at(operands.len());
                        let wrt = [cs, ops].concat();
                        let mut seeds: Vec<Option<Array>> = vec![None; wrt.len()];
                        seed(&mut seeds, 0, given_rest, ts);
                        let outs = replay(graph, &wrt)?;
                        let touts = push_tangents(&outs, &wrt, seeds)?;
                        Ok(result_floats
                            .iter()
                            .map(|&i| or_zeros(touts[i].clone(), &outs[i]))
                            .collect())
                    }) as FlatBranch<'_>
                })
                .collect();
            let results = build_switch(
                &index[0],
                consts,
                &[operands, &given_tangents].concat(),
                branches,
            )?;
            let mut out: Vec<Option<Array>> = vec![None; call.results.len()];
            for (&i, t) in result_floats.iter().zip(results) {
                out[i] = Some(t);
            }
            Ok(out)
        }
        ControlKind::While => {
            let (test, body) = (&graphs[0], &graphs[1]);
            let carries = call.carry_operands();
            let consts = &inputs[..carries.start];
            let init = &inputs[carries.clone()];
            let k = init.len();
            let float_carries = floats(init);
            let given_consts: Vec<usize> = given
                .iter()
                .copied()
                .filter(|&i| i < carries.start)
                .collect();
            let mut loop_consts = consts.to_vec();
            loop_consts.extend(present(tangents, &given_consts));
            let mut carry = init.to_vec();
            carry.extend(
                float_carries
                    .iter()
                    .map(|&i| or_zeros(tangents[carries.start + i].clone(), &init[i])),
            );
            let nc = consts.len();
            let results = build_while(
                &loop_consts,
                &carry,
                |cs, c| Ok(replay(test, &[&cs[..nc], &c[..k]].concat())?.remove(0)),
                |cs, c| {
                    let (cs, t_cs) = cs.split_at(nc);
                    let (c, t_c) = c.split_at(k);
                    let wrt = [cs, c].concat();
                    let mut seeds: Vec<Option<Array>> = vec![None; wrt.len()];
                    seed(&mut seeds, 0, &given_consts, t_cs);
                    seed(&mut seeds, nc, &float_carries, t_c);
                    let outs = replay(body, &wrt)?;
                    let touts = push_tangents(&outs, &wrt, seeds)?;
                    let mut new_carry = outs.clone();
                    new_carry.extend(
                        float_carries
                            .iter()
                            .map(|&i| or_zeros(touts[i].clone(), &outs[i])),
                    );
                    Ok(new_carry)
                },
            )?;
            let mut out: Vec<Option<Array>> = vec![None; call.results.len()];
            for (&i, t) in float_carries.iter().zip(&results[k..]) {
                out[i] = Some(t.clone());
            }
            Ok(out)
        }
    }
}

/// Per-example stand-ins for values that are, under vmap, `batched`: fresh
/// placeholders of their per-example avals (the batched walk replaces them
/// by the batched values).
fn stand_ins(batched: &[Batched]) -> Vec<Array> {
    let trace = crate::trace::next_trace_id();
    batched
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let aval = b.value.aval();
            let shape = match b.axis {
                Some(axis) => {
                    let mut dims = aval.shape.dims().to_vec();
                    dims.remove(axis);
                    Shape(dims)
                }
                None => aval.shape.clone(),
            };
            Array::param(trace, i, Aval::new(shape, aval.dtype))
        })
        .collect()
}

/// `graph` replayed on `values` (batched along axis 0, or shared): its
/// outputs batched by `walk`, each with its batch axis first.
fn replay_batched(
    graph: &Graph,
    values: &[Batched],
    size: &Dim,
    walk: BatchWalk<'_>,
) -> Result<Vec<Array>> {
    let per_example = stand_ins(values);
    let outs = replay(graph, &per_example)?;
    let batched = walk(&outs, &per_example, values.to_vec(), size)?;
    Ok(batched.iter().map(|b| b.materialized(size)).collect())
}

/// A list of values `batched` along axis 0 where `flags` say, else shared.
fn placed(values: &[Array], flags: &[bool]) -> Vec<Batched> {
    values
        .iter()
        .zip(flags)
        .map(|(v, &b)| {
            if b {
                Batched::along(v.clone(), 0)
            } else {
                Batched::shared(v.clone())
            }
        })
        .collect()
}

/// The results of a control node under vmap, from its per-example
/// operands `operands` batched for `size` examples; `walk` is the batching
/// walk, handed in by it. Every carry is batched (a shared carry becomes
/// batched once the body mixes it with a batched value); scanned arrays
/// keep the scan axis first and get the batch axis second; a switch whose
/// index differs per example runs every branch and selects per example; a
/// while loop whose condition differs per example runs until no example's
/// holds, each example keeping its carry once its own condition fails.
pub(crate) fn batch(
    call: &ControlCall,
    operands: &[Batched],
    size: &Dim,
    walk: BatchWalk<'_>,
) -> Result<Vec<Batched>> {
    let graphs = call.graphs();
    let carries = call.carry_operands();
    let const_range = call.first_const()..carries.start;
    let consts: Vec<Array> = operands[const_range.clone()]
        .iter()
        .map(|b| b.front())
        .collect();
    let const_flags: Vec<bool> = operands[const_range]
        .iter()
        .map(|b| b.axis.is_some())
        .collect();
    let nc = consts.len();
    match &call.kind {
        ControlKind::Scan { length, reverse } => {
            let carry: Vec<Array> = operands[carries.clone()]
                .iter()
                .map(|b| b.materialized(size))
                .collect();
            let k = carry.len();
            let xs_batched = &operands[carries.end..];
            let x_flags: Vec<bool> = xs_batched.iter().map(|b| b.axis.is_some()).collect();
            // The scan axis stays first; the batch axis goes second.
            let xs: Vec<Array> = xs_batched
                .iter()
                .map(|b| match b.axis {
                    Some(_) => b.front().swap_axes(0, 1),
                    None => b.value.clone(),
                })
                .collect();
            let results = build_scan(
                length.clone(),
                *reverse,
                &consts,
                &carry,
                &xs,
                |cs, c, x| {
                    let mut values = placed(cs, &const_flags);
                    values.extend(c.iter().map(|v| Batched::along(v.clone(), 0)));
                    values.extend(placed(x, &x_flags));
                    let outs = replay_batched(&graphs[0], &values, size, walk)?;
                    Ok((outs[..k].to_vec(), outs[k..].to_vec()))
                },
            )?;
            Ok(results
                .into_iter()
                .enumerate()
                .map(|(i, r)| Batched::along(r, if i < k { 0 } else { 1 }))
                .collect())
        }
        ControlKind::Switch => {
            let ops: Vec<Array> = operands[carries.clone()]
                .iter()
                .map(|b| b.front())
                .collect();
            let op_flags: Vec<bool> = operands[carries].iter().map(|b| b.axis.is_some()).collect();
            let branch = |graph: &Graph, cs: &[Array], ops: &[Array]| {
                let mut values = placed(cs, &const_flags);
                values.extend(placed(ops, &op_flags));
                replay_batched(graph, &values, size, walk)
            };
            let index = &operands[0];
            if index.axis.is_none() {
                let branches: Vec<FlatBranch<'_>> = graphs
                    .iter()
                    .map(|graph| {
                        Box::new(move |cs: &[Array], ops: &[Array]| branch(graph, cs, ops))
                            as FlatBranch<'_>
                    })
                    .collect();
                let results = build_switch(&index.value, &consts, &ops, branches)?;
                return Ok(results.into_iter().map(|r| Batched::along(r, 0)).collect());
            }
            // Every branch runs; each example takes its own branch's result.
            let last = graphs.len() as f64 - 1.0;
            let chosen = index.front().cast(DType::F32).maximum(0.0).minimum(last);
            let mut results: Option<Vec<Array>> = None;
            for (b, graph) in graphs.iter().enumerate() {
                let outs = branch(graph, &consts, &ops)?;
                results = Some(match results {
                    None => outs,
                    Some(so_far) => so_far
                        .into_iter()
                        .zip(outs)
                        .map(|(prev, new)| {
                            let mut dims = vec![size.clone()];
                            dims.extend(std::iter::repeat_n(Dim::Known(1), new.ndim() - 1));
                            let take = chosen.equal(b as f64).reshape_to(Shape(dims));
                            select(&take, &new, &prev)
                        })
                        .collect(),
                });
            }
            Ok(results
                .unwrap_or_default()
                .into_iter()
                .map(|r| Batched::along(r, 0))
                .collect())
        }
        ControlKind::While => {
            let (test, body) = (&graphs[0], &graphs[1]);
            let carry: Vec<Array> = operands[carries]
                .iter()
                .map(|b| b.materialized(size))
                .collect();
            let run_test = |cs: &[Array], c: &[Array]| -> Result<Array> {
                let mut values = placed(cs, &const_flags);
                values.extend(c.iter().map(|v| Batched::along(v.clone(), 0)));
                Ok(replay_batched(test, &values, size, walk)?.remove(0))
            };
            let results = build_while(
                &consts,
                &carry,
                |cs, c| Ok(run_test(cs, c)?.cast(DType::F32).sum_all().greater(0.0)),
                |cs, c| {
                    let holds = run_test(cs, c)?;
                    let mut values = placed(&cs[..nc], &const_flags);
                    values.extend(c.iter().map(|v| Batched::along(v.clone(), 0)));
                    let outs = replay_batched(body, &values, size, walk)?;
                    Ok(outs
                        .into_iter()
                        .zip(c)
                        .map(|(new, old)| {
                            let mut dims = vec![size.clone()];
                            dims.extend(std::iter::repeat_n(Dim::Known(1), new.ndim() - 1));
                            select(&holds.reshape_to(Shape(dims)), &new, old)
                        })
                        .collect())
                },
            )?;
            Ok(results.into_iter().map(|r| Batched::along(r, 0)).collect())
        }
    }
}
