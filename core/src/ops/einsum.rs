//! `einsum`: one or two operands' subscripts lowered to sums, `permute`,
//! `reshape` and one batched `matmul`, as a named composition.

use crate::error::{arg_err, shape_err, Error, Result};
use crate::handle::array::Array;
use crate::location::in_composition;
use crate::shape::{Dim, Shape};

/// The contraction `subscripts` names over `operands`, as
/// `jax.numpy.einsum`: `"ij,jk->ik"` (a matrix product), `"bij,bjk->bik"`
/// (batched), `"i,i->"` (a dot), `"ij->ji"` (a transpose), `"ij->"` (a
/// sum), `"i,j->ij"` (an outer product). Without `->`, the output holds
/// the indices that appear once, in alphabetical order (NumPy's implicit
/// mode). An index in one operand only and not in the output is summed
/// first; the rest becomes one batched [`Array::matmul`] (batch indices
/// shared by both operands and the output, contracted ones by both
/// operands only), so its gradient, batching and kernels are matmul's.
///
/// Supported: one or two operands of one dtype, each index a letter at
/// most once per operand. Anything else is an `Err` naming the form:
/// three or more operands, `...` (ellipsis), a repeated index inside one
/// operand (a diagonal, `"ii->i"`), an output index no operand has, or
/// sizes that differ for one index.
///
/// ```
/// use kiln::Array;
/// let a = Array::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
/// let b = Array::from_vec(vec![5.0f32, 6.0, 7.0, 8.0], &[2, 2])?;
/// let ab = kiln::einsum("ij,jk->ik", &[&a, &b]);
/// assert_eq!(ab.to_vec::<f32>()?, a.matmul(&b).to_vec::<f32>()?);
/// assert!(kiln::einsum("ii->i", &[&a]).to_vec::<f32>().is_err());
/// # Ok::<(), kiln::Error>(())
/// ```
#[track_caller]
pub fn einsum(subscripts: &str, operands: &[&Array]) -> Array {
    in_composition("einsum", || {
        contract(subscripts, operands).unwrap_or_else(Array::failed)
    })
}

fn unsupported(subscripts: &str, why: impl std::fmt::Display) -> Error {
    arg_err("einsum", format!("`{subscripts}`: {why}"))
}

/// The parsed subscripts: each operand's indices and the output's.
struct Spec {
    inputs: Vec<Vec<char>>,
    output: Vec<char>,
}

fn parse(subscripts: &str, arity: usize) -> Result<Spec> {
    let compact: String = subscripts.chars().filter(|c| !c.is_whitespace()).collect();
    if compact.contains('.') {
        return Err(unsupported(subscripts, "ellipsis (`...`) is not supported"));
    }
    let (lhs, rhs) = match compact.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (compact.as_str(), None),
    };
    let inputs: Vec<Vec<char>> = lhs.split(',').map(|s| s.chars().collect()).collect();
    if inputs.len() > 2 {
        return Err(unsupported(
            subscripts,
            format!(
                "{} operands; einsum takes one or two (nest calls for more)",
                inputs.len()
            ),
        ));
    }
    if inputs.len() != arity {
        return Err(unsupported(
            subscripts,
            format!("names {} operands, {arity} given", inputs.len()),
        ));
    }
    let letters = lhs.chars().chain(rhs.unwrap_or("").chars());
    if let Some(c) = letters
        .filter(|&c| c != ',')
        .find(|c| !c.is_ascii_alphabetic())
    {
        return Err(unsupported(
            subscripts,
            format!("`{c}` is not an index letter"),
        ));
    }
    for indices in &inputs {
        if let Some(c) = repeated(indices) {
            return Err(unsupported(
                subscripts,
                format!(
                    "index `{c}` repeats within one operand (a diagonal), which is not supported"
                ),
            ));
        }
    }
    let output: Vec<char> = match rhs {
        Some(r) => r.chars().collect(),
        None => {
            let mut once: Vec<char> = inputs
                .iter()
                .flatten()
                .copied()
                .filter(|c| inputs.iter().flatten().filter(|d| *d == c).count() == 1)
                .collect();
            once.sort_unstable();
            once
        }
    };
    if let Some(c) = repeated(&output) {
        return Err(unsupported(
            subscripts,
            format!("output index `{c}` repeats"),
        ));
    }
    if let Some(c) = output
        .iter()
        .find(|c| !inputs.iter().flatten().any(|d| d == *c))
    {
        return Err(unsupported(
            subscripts,
            format!("output index `{c}` is in no operand"),
        ));
    }
    Ok(Spec { inputs, output })
}

/// The first index that appears twice.
fn repeated(indices: &[char]) -> Option<char> {
    indices
        .iter()
        .enumerate()
        .find(|(i, c)| indices[..*i].contains(c))
        .map(|(_, c)| *c)
}

/// An operand with the index of each axis.
#[derive(Clone)]
struct Labelled {
    array: Array,
    indices: Vec<char>,
}

impl Labelled {
    fn dim(&self, c: char) -> Dim {
        let axis = self.indices.iter().position(|&d| d == c).unwrap_or(0);
        self.array.shape().dims()[axis].clone()
    }

    /// Sums the axes whose index is not in `keep`.
    fn sum_except(self, keep: &[char]) -> Labelled {
        let axes: Vec<isize> = (0..self.indices.len())
            .filter(|&a| !keep.contains(&self.indices[a]))
            .map(|a| a as isize)
            .collect();
        if axes.is_empty() {
            return self;
        }
        Labelled {
            array: self.array.sum(&axes, false),
            indices: self
                .indices
                .into_iter()
                .filter(|c| keep.contains(c))
                .collect(),
        }
    }

    /// The array with its axes in the order of `order` (each an index of it).
    fn arranged(&self, order: &[char]) -> Array {
        let perm: Vec<usize> = order
            .iter()
            .filter_map(|c| self.indices.iter().position(|d| d == c))
            .collect();
        match perm.iter().enumerate().all(|(i, &p)| i == p) {
            true => self.array.clone(),
            false => self.array.permute(&perm),
        }
    }
}

fn contract(subscripts: &str, operands: &[&Array]) -> Result<Array> {
    for x in operands {
        x.first_error()?;
    }
    let spec = parse(subscripts, operands.len())?;
    let labelled: Vec<Labelled> = operands
        .iter()
        .zip(&spec.inputs)
        .map(|(x, indices)| {
            if x.ndim() != indices.len() {
                return Err(shape_err(
                    "einsum",
                    &[x.aval()],
                    format!(
                        "`{}` names {} axes of a rank-{} operand",
                        indices.iter().collect::<String>(),
                        indices.len(),
                        x.ndim()
                    ),
                ));
            }
            Ok(Labelled {
                array: (*x).clone(),
                indices: indices.clone(),
            })
        })
        .collect::<Result<_>>()?;
    check_sizes(subscripts, &labelled)?;
    match labelled.as_slice() {
        [a] => Ok(a.clone().sum_except(&spec.output).arranged(&spec.output)),
        [a, b] => Ok(product(a.clone(), b.clone(), &spec.output)),
        _ => Err(unsupported(subscripts, "needs one or two operands")),
    }
}

/// `Err` when one index has two sizes that are not provably equal.
fn check_sizes(subscripts: &str, operands: &[Labelled]) -> Result<()> {
    let mut seen: Vec<(char, Dim)> = Vec::new();
    for x in operands {
        for &c in &x.indices {
            let d = x.dim(c);
            match seen.iter().find(|(s, _)| *s == c) {
                Some((_, size)) if *size != d => {
                    let avals: Vec<_> = operands.iter().map(|o| o.array.aval()).collect();
                    return Err(shape_err(
                        "einsum",
                        &avals,
                        format!("`{subscripts}`: index `{c}` has sizes {size} and {d}"),
                    ));
                }
                Some(_) => {}
                None => seen.push((c, d)),
            }
        }
    }
    Ok(())
}

/// Two operands as one batched matmul `[batch.., M, K] @ [batch.., K, N]`.
fn product(a: Labelled, b: Labelled, output: &[char]) -> Array {
    let needed = |x: &Labelled, other: &Labelled| -> Vec<char> {
        x.indices
            .iter()
            .copied()
            .filter(|c| output.contains(c) || other.indices.contains(c))
            .collect()
    };
    let (a_keep, b_keep) = (needed(&a, &b), needed(&b, &a));
    let (a, b) = (a.sum_except(&a_keep), b.sum_except(&b_keep));
    let shared = |c: &char| b.indices.contains(c);
    let batch: Vec<char> = a
        .indices
        .iter()
        .copied()
        .filter(|c| shared(c) && output.contains(c))
        .collect();
    let contracted: Vec<char> = a
        .indices
        .iter()
        .copied()
        .filter(|c| shared(c) && !output.contains(c))
        .collect();
    let a_free: Vec<char> = a.indices.iter().copied().filter(|c| !shared(c)).collect();
    let b_free: Vec<char> = b
        .indices
        .iter()
        .copied()
        .filter(|c| !a.indices.contains(c))
        .collect();
    let dims = |x: &Labelled, cs: &[char]| -> Vec<Dim> { cs.iter().map(|&c| x.dim(c)).collect() };
    let merged = |ds: Vec<Dim>| ds.iter().fold(Dim::Known(1), |acc, d| acc.mul(d));
    let batch_dims = dims(&a, &batch);
    let with_batch = |rest: Vec<Dim>| Shape(batch_dims.iter().cloned().chain(rest).collect());
    let lhs = a
        .arranged(&[batch.clone(), a_free.clone(), contracted.clone()].concat())
        .reshape_to(with_batch(vec![
            merged(dims(&a, &a_free)),
            merged(dims(&a, &contracted)),
        ]));
    let rhs = b
        .arranged(&[batch.clone(), contracted.clone(), b_free.clone()].concat())
        .reshape_to(with_batch(vec![
            merged(dims(&b, &contracted)),
            merged(dims(&b, &b_free)),
        ]));
    let result_dims: Vec<Dim> = dims(&a, &a_free)
        .into_iter()
        .chain(dims(&b, &b_free))
        .collect();
    let result = Labelled {
        array: lhs.matmul(&rhs).reshape_to(with_batch(result_dims)),
        indices: [batch, a_free, b_free].concat(),
    };
    result.arranged(output)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::rule_checks as rules;
    use crate::DType;

    /// `Σ_j a[i, j] · b[j, k]` by loops.
    fn matmul_reference(a: &[f64], b: &[f64], (m, k, n): (usize, usize, usize)) -> Vec<f64> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..k {
                for l in 0..n {
                    out[i * n + l] += a[i * k + j] * b[j * n + l];
                }
            }
        }
        out
    }

    #[test]
    fn two_operand_contractions_match_loops() {
        let a = rules::normal(1, &[2, 3]);
        let b = rules::normal(2, &[3, 4]);
        let want = matmul_reference(&rules::values(&a), &rules::values(&b), (2, 3, 4));
        let got = einsum("ij,jk->ik", &[&a, &b]);
        let got_t = einsum("ij,jk->ki", &[&a, &b]);
        for i in 0..2 {
            for k in 0..4 {
                let w = want[i * 4 + k];
                assert!((rules::values(&got)[i * 4 + k] - w).abs() < 1e-5);
                assert!((rules::values(&got_t)[k * 2 + i] - w).abs() < 1e-5);
            }
        }
        // Implicit mode: the indices that appear once, alphabetically.
        rules::assert_close("implicit", &einsum("ij,jk", &[&a, &b]), &got, 0.0, 0.0);
    }

    #[test]
    fn batched_outer_dot_and_summed_forms_match_loops() {
        let a = rules::normal(3, &[2, 3, 4]);
        let b = rules::normal(4, &[2, 4, 5]);
        let got = einsum("bij,bjk->bik", &[&a, &b]);
        rules::assert_close("batched", &got, &a.matmul(&b), 1e-6, 1e-6);
        let u = rules::array(&[1.0, 2.0, 3.0], &[3]);
        let v = rules::array(&[4.0, 5.0], &[2]);
        let outer = einsum("i,j->ij", &[&u, &v]);
        assert_eq!(
            outer.to_vec::<f32>().unwrap(),
            [4.0, 5.0, 8.0, 10.0, 12.0, 15.0]
        );
        assert_eq!(einsum("i,i->", &[&u, &u]).to_vec::<f32>().unwrap(), [14.0]);
        // `k` in b only and not in the output is summed before the product.
        let m = rules::array(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
        let summed = einsum("i,ik->", &[&u, &m]);
        assert_eq!(
            summed.to_vec::<f32>().unwrap(),
            [1.0 * 3.0 + 2.0 * 7.0 + 3.0 * 11.0]
        );
        assert_eq!(
            einsum("ij->ji", &[&m]).to_vec::<f32>().unwrap(),
            [1.0, 3.0, 5.0, 2.0, 4.0, 6.0]
        );
        assert_eq!(einsum("ij->", &[&m]).to_vec::<f32>().unwrap(), [21.0]);
    }

    #[test]
    fn integer_operands_contract_exactly() {
        let a = Array::from_vec(vec![1i32, 2, 3, 4], &[2, 2]).unwrap();
        let got = einsum("ij,jk->ik", &[&a, &a]).to_vec::<i32>().unwrap();
        assert_eq!(got, [7, 10, 15, 22]);
    }

    #[test]
    fn unsupported_forms_are_errors_naming_them() {
        let a = rules::normal(5, &[2, 2]);
        let cases: [(&str, Vec<&Array>, &str); 6] = [
            ("ii->i", vec![&a], "repeats within one operand"),
            ("...ij,jk->ik", vec![&a, &a], "ellipsis"),
            ("ij,jk,kl->il", vec![&a, &a, &a], "3 operands"),
            ("ij,jk->iz", vec![&a, &a], "`z` is in no operand"),
            ("ijk,jk->i", vec![&a, &a], "names 3 axes"),
            ("i1,1k->ik", vec![&a, &a], "not an index letter"),
        ];
        for (subscripts, operands, detail) in cases {
            rules::assert_err_names(einsum(subscripts, &operands).check(), "einsum", detail);
        }
        let b = rules::normal(6, &[3, 2]);
        rules::assert_err_names(
            einsum("ij,jk->ik", &[&a, &b]).check(),
            "einsum",
            "sizes 2 and 3",
        );
    }

    #[test]
    fn einsum_differentiates_and_batches_through_matmul() {
        let x = rules::normal(7, &[2, 3]);
        let y = rules::normal(8, &[3, 2, 4]);
        let f = |x: Vec<Array>| einsum("ij,jbk->bik", &[&x[0], &x[1]]);
        rules::assert_jvp_matches_central_difference("einsum", f, &[x.clone(), y.clone()]);
        let xs = rules::normal(9, &[3, 2, 3]);
        let ys = rules::normal(10, &[3, 3, 2, 4]);
        rules::assert_batches_like_stacking("einsum", f, &[xs, ys]);
        assert_eq!(
            einsum("ij,jk->ik", &[&x, &rules::normal(11, &[3, 1])]).dtype(),
            DType::F32
        );
    }
}
