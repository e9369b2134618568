//! The layers of `core/src` import only downward.
//!
//! Reads every `core/src/**/*.rs`, extracts the modules each file refers to
//! (`crate::…` paths, `super::…` paths, and a `mod.rs`'s references to its
//! own child modules), maps every file to its layer and fails naming the
//! file and the import when one refers to a higher layer. It also finds
//! import circles between files: the only one allowed is the deliberate
//! circle between the `Array` handle (`handle/array.rs`) and the op
//! families (`ops/`), whose user methods sit beside each family's rules.
//!
//! Comments and `#[cfg(test)]` items are skipped: unit tests exercise the
//! whole stack and are no part of the library's layering. Paths through
//! the crate root's re-exports (`crate::DType`) resolve to the module the
//! root re-exports from; the root itself (`lib.rs`, with its old-path
//! facades such as `kiln::autodiff`) is the top layer.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// The layers from the bottom up: (name, which files belong to it).
/// The first matching rule wins.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "base",
        &[
            "tree/def.rs",
            "tree/path.rs",
            "tree/static_value.rs",
            "tree/depth.rs",
            "*.rs",
        ],
    ),
    ("ops and the handle", &["ops/", "handle/"]),
    ("tree", &["tree/"]),
    ("ir", &["ir/"]),
    ("trace", &["trace/"]),
    ("plan", &["plan/"]),
    ("exec", &["exec/"]),
    ("transform", &["transform/"]),
    ("compile", &["compile/"]),
    ("export", &["export/"]),
    ("models", &["nn/", "optim/", "io/"]),
];

/// Whether `file` is in the one import circle allowed on purpose.
fn in_deliberate_circle(file: &str) -> bool {
    file == "handle/array.rs" || file.starts_with("ops/")
}

/// The layer of `file` (a path relative to `src/`); `lib.rs` is above all.
fn layer(file: &str) -> Option<usize> {
    if file == "lib.rs" {
        return Some(LAYERS.len());
    }
    LAYERS.iter().position(|(_, rules)| {
        rules.iter().any(|rule| match rule.strip_prefix('*') {
            Some(ext) => !file.contains('/') && file.ends_with(ext),
            None if rule.ends_with('/') => file.starts_with(rule),
            None => file == *rule,
        })
    })
}

fn layer_name(layer: usize) -> &'static str {
    LAYERS.get(layer).map_or("the crate root", |(name, _)| name)
}

/// `source` without comments, string literals and `#[cfg(test)]` items.
fn strip(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &source[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |end| end + 2);
        } else if rest.starts_with('"') {
            let mut j = 1;
            while j < rest.len() && rest.as_bytes()[j] != b'"' {
                j += if rest.as_bytes()[j] == b'\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i += (j + 1).min(rest.len());
        } else if rest.starts_with("'\"'") {
            i += 3;
        } else if let Some(item) = rest.strip_prefix("#[cfg(test)]") {
            i += rest.len() - item.len() + skip_item(item);
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The length of the item at the start of `rest`: up to its `;` or its
/// balanced `{…}` block, whichever comes first.
fn skip_item(rest: &str) -> usize {
    let open = rest.find('{');
    let semi = rest.find(';');
    match (open, semi) {
        (Some(o), Some(s)) if s < o => s + 1,
        (None, Some(s)) => s + 1,
        (Some(o), _) => {
            let mut depth = 0;
            for (k, c) in rest[o..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            return o + k + 1;
                        }
                    }
                    _ => {}
                }
            }
            rest.len()
        }
        (None, None) => rest.len(),
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every module path `text` refers to after `prefix` (`crate::` or
/// `super::`), braces expanded: `crate::a::{b::C, d}` gives `a::b::C` and
/// `a::d`.
fn paths_after(text: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut start = 0;
    while let Some(at) = text[start..].find(prefix) {
        let at = start + at;
        start = at + prefix.len();
        if text[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        expand(&text[start..], Vec::new(), &mut found);
    }
    found
}

/// Reads one path (`a::b::{c, d::e}`) at the start of `text` into `found`.
fn expand(text: &str, mut base: Vec<String>, found: &mut Vec<Vec<String>>) {
    let mut rest = text.trim_start();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item_start = 0;
            for (k, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' | ',' if depth == 1 => {
                        let item = group[item_start..k].trim();
                        if !item.is_empty() {
                            expand(item, base.clone(), found);
                        }
                        item_start = k + 1;
                        if c == '}' {
                            return;
                        }
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            return;
        }
        let len = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
        if len == 0 {
            break;
        }
        base.push(rest[..len].to_string());
        match rest[len..].strip_prefix("::") {
            Some(more) => rest = more,
            None => break,
        }
    }
    if !base.is_empty() {
        found.push(base);
    }
}

/// The paths of `text`'s `pub use` statements (re-exports).
fn reexports_of(text: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    for (at, _) in text.match_indices("pub use ") {
        let rest = &text[at + "pub use ".len()..];
        let end = rest.find(';').unwrap_or(rest.len());
        expand(&rest[..end], Vec::new(), &mut paths);
    }
    paths
}

/// `text` without its `pub use` statements.
fn without_reexports(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("pub use ") {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        rest = &rest[rest.find(';').map_or(rest.len(), |end| end + 1)..];
    }
    out.push_str(rest);
    out
}

/// The module path of a file: `ops/mod.rs` is `ops`, `ops/unary.rs` is
/// `ops::unary`, `lib.rs` is the root.
fn module_of(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// One file's references that break the layering, and the edges between
/// files for the circle check.
struct Analysis {
    edges: BTreeMap<String, BTreeSet<String>>,
    violations: Vec<String>,
}

/// Checks `files` (path relative to `src/` → source).
fn analyze(files: &BTreeMap<String, String>) -> Analysis {
    let modules: BTreeMap<Vec<String>, String> =
        files.keys().map(|f| (module_of(f), f.clone())).collect();
    // Names the root re-exports, and the module each comes from.
    let mut root_names: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut external: BTreeSet<String> = BTreeSet::new();
    if let Some(lib) = files.get("lib.rs") {
        let lib = strip(lib);
        let mut start = 0;
        while let Some(at) = lib[start..].find("pub use ") {
            let at = start + at + "pub use ".len();
            start = at;
            let mut paths = Vec::new();
            expand(&lib[at..], Vec::new(), &mut paths);
            for mut path in paths {
                if path.first().is_some_and(|p| p == "crate") {
                    path.remove(0);
                }
                let Some(name) = path.last().cloned() else {
                    continue;
                };
                // A re-export from another crate (`kiln_derive::Tree`)
                // refers to no file of this one.
                if !modules.keys().any(|m| m.first() == path.first()) {
                    external.insert(name);
                    continue;
                }
                if !modules.contains_key(&path) {
                    path.pop();
                }
                root_names.insert(name, path);
            }
        }
    }
    // `#[macro_export]` macros live at the root but belong to their file.
    let macros: BTreeMap<String, &String> = files
        .iter()
        .flat_map(|(file, source)| {
            paths_after(source, "macro_rules!")
                .into_iter()
                .filter_map(move |path| Some((path.first()?.clone(), file)))
        })
        .collect();
    // What each file re-exports: item name → its real path, so `super::Home`
    // in `plan/verify.rs` refers to `plan/slots.rs`, not `plan/mod.rs`.
    let reexports: BTreeMap<&String, BTreeMap<String, Vec<String>>> = files
        .iter()
        .map(|(file, source)| {
            let own = module_of(file);
            let table = reexports_of(&strip(source))
                .into_iter()
                .filter_map(|mut path| {
                    if path.first().is_some_and(|p| p == "crate") {
                        path.remove(0);
                    } else {
                        path.splice(0..0, own.iter().cloned());
                    }
                    Some((path.last()?.clone(), path))
                })
                .collect();
            (file, table)
        })
        .collect();
    let resolve = |path: &[String]| -> Option<&String> {
        if let [name] = path {
            if let Some(file) = macros.get(name) {
                return Some(file);
            }
        }
        if path.first().is_some_and(|first| external.contains(first)) {
            return None;
        }
        let mut path = path.to_vec();
        if let Some(target) = path.first().and_then(|first| root_names.get(first)) {
            path.splice(0..1, target.iter().cloned());
        }
        // Follows re-exports, a bounded number of hops.
        for _ in 0..8 {
            let n = (0..=path.len())
                .rev()
                .find(|&n| modules.contains_key(&path[..n]))?;
            let file = &modules[&path[..n]];
            match path.get(n).and_then(|item| reexports[file].get(item)) {
                Some(target) if file != "lib.rs" => {
                    path = target.iter().chain(&path[n + 1..]).cloned().collect();
                }
                _ => return Some(file),
            }
        }
        None
    };
    let mut analysis = Analysis {
        edges: BTreeMap::new(),
        violations: Vec::new(),
    };
    for (file, source) in files {
        let text = strip(source);
        let own = module_of(file);
        let mut targets: Vec<(String, &String)> = Vec::new();
        for path in paths_after(&text, "crate::") {
            if let Some(target) = resolve(&path) {
                targets.push((format!("crate::{}", path.join("::")), target));
            }
        }
        // `super::` is the parent of this module (a `mod.rs` is its folder).
        let parent = &own[..own.len().saturating_sub(1)];
        for path in paths_after(&text, "super::") {
            let full: Vec<String> = parent.iter().cloned().chain(path.clone()).collect();
            if let Some(target) = resolve(&full) {
                targets.push((format!("super::{}", path.join("::")), target));
            }
        }
        // A folder's `mod.rs` (or the root) refers to its children by name.
        // Its `pub use child::Item` re-exports are its public face, not a
        // use: they count only when the item is named elsewhere in it too.
        let body = without_reexports(&text);
        for (module, target) in &modules {
            if module.len() == own.len() + 1 && module.starts_with(&own) {
                let child = &module[own.len()];
                let named = body
                    .match_indices(&format!("{child}::"))
                    .any(|(at, _)| !body[..at].ends_with(|c: char| is_ident(c) || c == ':'));
                if named {
                    targets.push((format!("{child}::…"), target));
                }
            }
        }
        for (item, path) in &reexports[file] {
            let used = body.match_indices(item.as_str()).any(|(at, _)| {
                !body[..at].ends_with(is_ident) && !body[at + item.len()..].starts_with(is_ident)
            });
            if let Some(target) = resolve(path).filter(|_| used) {
                targets.push((format!("{item} (re-exported)"), target));
            }
        }
        for (import, target) in targets {
            if target == file {
                continue;
            }
            analysis
                .edges
                .entry(file.clone())
                .or_default()
                .insert(target.clone());
            if let (Some(from), Some(to)) = (layer(file), layer(target)) {
                if to > from {
                    analysis.violations.push(format!(
                        "{file} ({}) imports `{import}` from {target} ({}), a higher layer",
                        layer_name(from),
                        layer_name(to)
                    ));
                }
            }
        }
    }
    for circle in circles(&analysis.edges) {
        let deliberate = circle.iter().any(|f| f == "handle/array.rs")
            && circle.iter().all(|f| in_deliberate_circle(f));
        if !deliberate {
            analysis
                .violations
                .push(format!("import circle: {}", circle.join(" → ")));
        }
    }
    analysis
}

/// The strongly connected components of more than one file (Tarjan).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w.as_str()) {
                visit(s, w);
                let low = s.low[v].min(s.low[w.as_str()]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w.as_str()) {
                let low = s.low[v].min(s.index[w.as_str()]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !state.index.contains_key(v.as_str()) {
            visit(&mut state, v);
        }
    }
    state.found
}

fn read_tree(root: &Path, dir: &Path, files: &mut BTreeMap<String, String>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            read_tree(root, &path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path
                .strip_prefix(root)
                .map(|p| p.to_string_lossy().replace('\\', "/"))
                .unwrap_or_default();
            let source = fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            files.insert(relative, source);
        }
    }
}

#[test]
fn core_imports_only_downward() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    read_tree(&root, &root, &mut files);
    let unmapped: Vec<&String> = files.keys().filter(|f| layer(f).is_none()).collect();
    assert!(unmapped.is_empty(), "files in no layer: {unmapped:?}");
    let analysis = analyze(&files);
    assert!(
        analysis.violations.is_empty(),
        "layering violations:\n{}",
        analysis.violations.join("\n")
    );
    // The deliberate circle is really there (else this check reads nothing).
    let circles = circles(&analysis.edges);
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert!(circles[0].contains(&"handle/array.rs".to_string()));
}

fn synthetic(files: &[(&str, &str)]) -> Vec<String> {
    let files = files
        .iter()
        .map(|(f, s)| (f.to_string(), s.to_string()))
        .collect();
    analyze(&files).violations
}

#[test]
fn checker_names_a_base_file_importing_a_higher_layer() {
    let violations = synthetic(&[
        ("lib.rs", "pub mod shape; pub mod compile;"),
        (
            "shape.rs",
            "use crate::compile::cache::{compile, Function};",
        ),
        ("compile/mod.rs", "pub mod cache;"),
        ("compile/cache.rs", "use crate::shape::Shape;"),
    ]);
    assert_eq!(
        violations[0],
        "shape.rs (base) imports `crate::compile::cache::compile` from compile/cache.rs \
         (compile), a higher layer"
    );
    assert!(violations[1].contains("`crate::compile::cache::Function`"));
    assert_eq!(violations[2], "import circle: compile/cache.rs → shape.rs");
}

#[test]
fn checker_resolves_root_reexports_and_skips_comments_and_tests() {
    let violations = synthetic(&[
        ("lib.rs", "pub mod ir; pub mod exec;\npub use exec::cpu::CpuBackend;"),
        (
            "ir/graph.rs",
            "// crate::exec::cpu is only named here\n#[cfg(test)]\nmod tests { use crate::exec::cpu::CpuBackend; }\nfn f() { crate::CpuBackend::run(); }",
        ),
        ("exec/cpu.rs", ""),
    ]);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].contains("ir/graph.rs (ir) imports `crate::CpuBackend::run`"));
}

#[test]
fn checker_finds_a_circle_inside_one_layer() {
    let violations = synthetic(&[
        ("compile/cache.rs", "use super::report::Report;"),
        ("compile/report.rs", "use super::cache::CacheKey;"),
        ("compile/mod.rs", ""),
    ]);
    assert_eq!(
        violations,
        vec!["import circle: compile/cache.rs → compile/report.rs".to_string()]
    );
}

#[test]
fn checker_allows_the_handle_and_families_circle() {
    let violations = synthetic(&[
        ("handle/array.rs", "use crate::ops::Op;"),
        ("handle/mod.rs", ""),
        (
            "ops/mod.rs",
            "pub mod unary; use crate::handle::array::Array;",
        ),
        (
            "ops/unary.rs",
            "use crate::handle::array::Array; use super::Op;",
        ),
    ]);
    assert!(violations.is_empty(), "{violations:?}");
}
