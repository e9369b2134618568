//! Errors in script terms: what Kiln and Rhai say, rewritten where their
//! words are Rust's (a `Limits` field to raise, a function scripts do not
//! have) or Rhai's internals (a closure's hashed name, a bare "function not
//! found" where the script called an existing function with other types).

use crate::source::closures;
use rhai::AST;
use std::collections::BTreeMap;

/// The reference of every registered function, generated from their
/// signatures (a test keeps it in step with the engine).
const SCRIPT_API: &str = include_str!("../../../docs/script-api.md");

/// A Kiln error as a script reads it.
///
/// ```
/// # use kiln_web::script::script_message;
/// let e = kiln::Error::LimitExceeded {
///     op: "ones".into(),
///     what: "f32[8192,8192]".into(),
///     bytes: 256 << 20,
///     limit: 64 << 20,
///     scope: "array",
///     field: "max_array_bytes",
/// };
/// assert_eq!(
///     script_message(&e),
///     "`ones`: f32[8192,8192] needs 256 MiB, above the playground's limit of 64 MiB per array"
/// );
/// ```
pub fn script_message(e: &kiln::Error) -> String {
    // A script's error names the script's line (its location, shown beside
    // it), not the Rust line of the binding that built the op.
    let e = &e.clone().without_call_site();
    match e {
        kiln::Error::LimitExceeded {
            op,
            what,
            bytes,
            limit,
            scope,
            ..
        } => format!(
            "`{op}`: {what} needs {}, above the playground's limit of {} per {scope}",
            mebibytes(*bytes),
            mebibytes(*limit)
        ),
        // Kiln's advice names `vjp`, which scripts do not have.
        kiln::Error::Shape {
            op,
            detail,
            operands,
            at,
        } if op == "grad" && detail.contains("`vjp`") => kiln::Error::Shape {
            op: op.clone(),
            detail: "the function must return a scalar float loss (reduce other outputs \
                     to one, with `.sum()` or `.mean()`)"
                .to_string(),
            operands: operands.clone(),
            at: *at,
        }
        .to_string(),
        other => other.to_string(),
    }
}

/// `bytes` in MiB, whole where it is whole (`64 MiB`, `34.3 MiB`).
fn mebibytes(bytes: usize) -> String {
    let mib = bytes as f64 / f64::from(1 << 20);
    if bytes.is_multiple_of(1 << 20) {
        format!("{mib} MiB")
    } else {
        format!("{mib:.1} MiB")
    }
}

/// Rhai's "function not found" for `signature` (`sum (ndarray, i64, bool)`,
/// `anon$1153f750dc280e11 (ndarray)`) in script terms: a closure named by
/// its line and parameters, a registered function with the overloads it
/// has. `None` when neither applies (Rhai's own words then stand).
pub(super) fn function_not_found(signature: &str, script: &str, ast: &AST) -> Option<String> {
    let (name, args) = signature.split_once(" (")?;
    let args: Vec<&str> = args
        .strip_suffix(')')?
        .split(", ")
        .filter(|a| !a.is_empty())
        .collect();
    if name.starts_with("anon$") {
        let params: Vec<String> = ast
            .iter_functions()
            .find(|f| f.name == name)?
            .params
            .iter()
            .map(|p| p.to_string())
            .collect();
        return Some(closure_arity(&params, &args, script));
    }
    let overloads = api_overloads().remove(name)?;
    let args: Vec<&str> = args.iter().map(|&a| script_type(a)).collect();
    Some(format!(
        "no `{name}` takes ({}); did you mean {}?",
        args.join(", "),
        or_list(&overloads)
    ))
}

/// A closure called with a number of arguments it does not take. Rhai's
/// closure functions take the variables they capture first: `params` ends
/// with the closure's own, `args` starts with the captured values.
fn closure_arity(params: &[String], args: &[&str], script: &str) -> String {
    let candidates: Vec<_> = closures(script)
        .into_iter()
        .filter(|c| params.ends_with(&c.params))
        .collect();
    // The closure written with the most parameters of those Rhai names.
    let own = candidates
        .iter()
        .map(|c| c.params.len())
        .max()
        .unwrap_or(params.len());
    let captured = params.len() - own;
    let lines: Vec<String> = candidates
        .iter()
        .filter(|c| c.params.len() == own)
        .map(|c| format!("line {}", c.line))
        .collect();
    let which = match lines.len() {
        0 => "a closure".to_string(),
        _ => format!("the closure at {}", lines.join(" or ")),
    };
    let given: Vec<&str> = args
        .iter()
        .skip(captured)
        .map(|&a| script_type(a))
        .collect();
    format!(
        "{which} (`|{}|`) takes {own} argument{}, but was called with {} ({})",
        params[captured..].join(", "),
        if own == 1 { "" } else { "s" },
        given.len(),
        given.join(", ")
    )
}

/// A type as the script reference names it.
fn script_type(rhai: &str) -> &str {
    match rhai {
        "array" => "list",
        "Fn" | "FnPtr" => "Fn",
        other => other,
    }
}

/// `a`, `a or b`, `a, b or c`.
fn or_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// Every registered function's overloads, from the script reference: for
/// `sum`, `x.sum()`, `x.sum(i64)`, ... (return types left out).
fn api_overloads() -> BTreeMap<&'static str, Vec<String>> {
    SCRIPT_API
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("* **`")?;
            let (name, signatures) = rest.split_once("`**: ")?;
            let overloads = signatures
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|s| s.split(" → ").next().unwrap_or(s).to_string())
                .collect();
            Some((name, overloads))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_error_does_not_name_the_bindings_rust_line() {
        let x = kiln::Array::ones(&[2], kiln::DType::F32);
        let error = (&x + &kiln::Array::ones(&[3], kiln::DType::F32))
            .check()
            .expect_err("2 and 3 do not broadcast");
        assert!(error.call_site().is_some());
        let message = script_message(&error);
        assert!(message.starts_with("shape error in `add`"), "{message}");
        assert!(!message.contains(".rs:"), "{message}");
    }

    #[test]
    fn sizes_are_in_mebibytes() {
        assert_eq!(mebibytes(64 << 20), "64 MiB");
        assert_eq!(mebibytes(36_000_000), "34.3 MiB");
    }

    #[test]
    fn the_reference_gives_every_overload_of_a_method() {
        assert_eq!(
            api_overloads()["sum"],
            ["x.sum()", "x.sum(i64)", "x.sum(list)", "x.sum(list, bool)"]
        );
    }

    #[test]
    fn or_lists_read_as_english() {
        let items = ["a", "b", "c"].map(String::from);
        assert_eq!(or_list(&items[..1]), "a");
        assert_eq!(or_list(&items), "a, b or c");
    }
}
