//! `docs/script-api.md`, the script API reference, generated from the
//! signatures of every function the playground registers (Rhai's own list,
//! which needs its `metadata` feature: a dev-dependency only, as it adds
//! half a megabyte to the module). The test below fails when the file is
//! stale; `KILN_BLESS=1 cargo test -p kiln-web script_api` rewrites it.

use super::catalog::SUMMARIES;
use super::Session;
use std::collections::BTreeMap;

/// Where the reference lives, from the crate's directory.
const REFERENCE: &str = "../docs/script-api.md";

/// One registered signature in the reference's terms: `(receiver, name,
/// parameters, result)`, with a receiver for a method on an array.
type Entry = (Option<String>, String, Vec<String>, String);

/// A Rust or Rhai type as the reference names it.
fn type_name(raw: &str) -> String {
    let raw = raw.trim();
    let raw = raw.strip_prefix("&mut ").unwrap_or(raw);
    let raw = raw.strip_prefix('&').unwrap_or(raw);
    // `Result<T, Box<EvalAltResult>>`: functions that may fail give `T`.
    let raw = match raw.strip_prefix("core::result::Result<") {
        Some(rest) => rest.split(',').next().unwrap_or(rest),
        None => raw,
    };
    let last = raw.rsplit("::").next().unwrap_or(raw);
    match last {
        // Rhai's own arrays are the script's lists.
        "array" => "list",
        "Array" | "ndarray" => "ndarray",
        "Dynamic" => "any",
        "ScriptCompiled" => "Compiled",
        "ScriptObject" => "Object",
        "ScriptCustomOp" => "CustomOp",
        "ScriptKernel" => "Kernel",
        "ImmutableString" | "String" | "str" => "string",
        other => other,
    }
    .to_string()
}

/// Parses `name(_: T, _: U) -> R` into an [`Entry`].
fn entry(signature: &str) -> Entry {
    let (name, rest) = signature.split_once('(').unwrap_or((signature, ")"));
    let (params, result) = split_at_closing_paren(rest);
    let mut params: Vec<String> = if params.trim().is_empty() {
        Vec::new()
    } else {
        split_params(params)
            .iter()
            // Functions of a module (`nn::`) come without types.
            .map(|p| {
                p.split_once(':')
                    .map_or("any".to_string(), |(_, t)| type_name(t))
            })
            .collect()
    };
    let result = match result.trim().trim_start_matches("->").trim() {
        "" => "any".to_string(),
        typed => type_name(typed),
    };
    let receiver = params
        .first()
        .filter(|first| first.as_str() == "ndarray" && signature.contains("&mut"))
        .cloned();
    if receiver.is_some() {
        params.remove(0);
    }
    (receiver, name.to_string(), params, result)
}

/// `rest` (what follows a signature's `(`) split at the `)` that closes the
/// parameter list: the result type may hold parentheses of its own
/// (`Result<(), …>`).
fn split_at_closing_paren(rest: &str) -> (&str, &str) {
    let mut depth = 0usize;
    for (i, c) in rest.char_indices() {
        match c {
            '(' | '<' => depth += 1,
            ')' if depth == 0 => return (&rest[..i], &rest[i + 1..]),
            ')' | '>' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    (rest, "")
}

/// Splits a parameter list at its top-level commas (types hold commas).
fn split_params(params: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut depth = 0usize;
    for c in params.chars() {
        match c {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(String::new());
                continue;
            }
            _ => {}
        }
        parts.last_mut().expect("one part at least").push(c);
    }
    parts
}

/// How a call of `entry` reads in a script.
fn usage((receiver, name, params, result): &Entry) -> String {
    let args = params.join(", ");
    let is_operator = !name.starts_with(|c: char| c.is_alphabetic() || c == '_');
    if let Some(property) = name.strip_prefix("get$") {
        return format!("x.{property} → {result}");
    }
    if name == "index$get$" {
        return format!("obj[{args}] → {result}");
    }
    if name == "index$set$" {
        return format!("obj[{}] = {}", params[..1].join(""), params[1..].join(", "));
    }
    match (receiver, is_operator, params.as_slice()) {
        (Some(_), true, []) => format!("{name}x → {result}"),
        (Some(_), true, [rhs]) => format!("x {name} {rhs} → {result}"),
        (None, true, [lhs, rhs]) => format!("{lhs} {name} {rhs} → {result}"),
        (Some(_), false, _) => format!("x.{name}({args}) → {result}"),
        _ => format!("{name}({args}) → {result}"),
    }
}

/// The reference's text.
fn reference() -> String {
    let signatures = Session::new().engine.gen_fn_signatures(false);
    let mut sections: BTreeMap<&str, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for signature in &signatures {
        let e = entry(signature);
        let is_operator = !e.1.starts_with(|c: char| c.is_alphabetic() || c == '_');
        let section = if e.1.starts_with("get$") || e.1.starts_with("index$") {
            "4. Properties and indexing"
        } else if is_operator {
            "3. Operators"
        } else if e.0.is_some() {
            "2. Methods of ndarray"
        } else {
            "1. Functions"
        };
        sections
            .entry(section)
            .or_default()
            .entry(e.1.clone())
            .or_default()
            .push(usage(&e));
    }
    let mut text = String::from(
        "# Script API reference\n\n\
         Generated from the signatures of every function the playground registers \
         (`web/src/script/reference.rs`; `KILN_BLESS=1 cargo test -p kiln-web script_api` \
         rewrites this file, and the test fails when it is stale). Types: `ndarray` is a \
         Kiln array, `list` a Rhai array (`[2, 3]`), `map` a Rhai object map, `Fn` a \
         closure (`|x| x * 2.0`), `any` any value, `Object` an object of a registered node \
         class, `Compiled` a compiled function (Rhai records the `nn::` module's functions \
         without types: they take and give `ndarray`s, with `i64` axes and `f64` epsilons). \
         Calls that may fail raise a script error naming the problem and the script line. \
         Each entry ends with what it does, from the one table of summaries \
         (`web/src/script/catalog.rs`), which a test holds to the registered names.\n",
    );
    for (section, functions) in sections {
        let title = section.split_once(". ").map_or(section, |(_, t)| t);
        text.push_str(&format!("\n## {title}\n\n"));
        for (name, mut usages) in functions {
            usages.sort();
            usages.dedup();
            let shown = name
                .trim_start_matches("get$")
                .trim_start_matches("index$get$")
                .trim_start_matches("index$set$");
            let shown = if shown.is_empty() { "[]" } else { shown };
            text.push_str(&format!("* **`{shown}`**: "));
            let list: Vec<String> = usages.iter().map(|u| format!("`{u}`")).collect();
            text.push_str(&list.join(", "));
            if let Some((_, summary)) = SUMMARIES.iter().find(|(n, _)| *n == shown) {
                text.push_str(&format!(" — {summary}"));
            }
            text.push('\n');
        }
    }
    text
}

#[test]
fn the_script_api_reference_is_generated_from_the_registered_functions() {
    let generated = reference();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(REFERENCE);
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("docs/script-api.md is writable");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/script-api.md is stale: run `KILN_BLESS=1 cargo test -p kiln-web script_api`"
    );
    // Spot checks of the reading: a method, an operator, a namespaced
    // function and a property.
    for expected in [
        "`x.exp() → ndarray`",
        "`x @ ndarray → ndarray`",
        "`nn::softmax(any, any) → any`",
        "`x.shape → list`",
        "`compile(Fn) → Compiled`",
    ] {
        assert!(generated.contains(expected), "{expected} in:\n{generated}");
    }
}

#[test]
fn a_result_of_nothing_keeps_the_parameters_apart_from_the_result() {
    let entry = entry("register_node(_: &str, _: array, _: array) -> core::result::Result<(),alloc::boxed::Box<rhai::types::error::EvalAltResult>>");
    assert_eq!(usage(&entry), "register_node(string, list, list) → ()");
}

#[test]
fn signatures_read_as_calls() {
    let method = entry("exp(_: &mut ndarray) -> core::result::Result<kiln::array::Array,alloc::boxed::Box<rhai::types::error::EvalAltResult>>");
    assert_eq!(usage(&method), "x.exp() → ndarray");
    let function = entry("zeros(_: array, _: string) -> core::result::Result<kiln::array::Array,alloc::boxed::Box<rhai::types::error::EvalAltResult>>");
    assert_eq!(usage(&function), "zeros(list, string) → ndarray");
    let operator = entry("-(_: f64, _: ndarray) -> core::result::Result<kiln::array::Array,alloc::boxed::Box<rhai::types::error::EvalAltResult>>");
    assert_eq!(usage(&operator), "f64 - ndarray → ndarray");
    let negation = entry("-(_: &mut ndarray) -> core::result::Result<kiln::array::Array,alloc::boxed::Box<rhai::types::error::EvalAltResult>>");
    assert_eq!(usage(&negation), "-x → ndarray");
}
