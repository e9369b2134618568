//! `cargo xtask api [--bless]`: the published crates' public API against its
//! snapshot, so that no public item disappears without a CHANGELOG line.
//!
//! The list comes from rustdoc's HTML, since stable rustdoc writes no JSON: a
//! crate's `all.html` names each public item by a public path, and each
//! item's page holds its fields,
//! variants, methods and associated items as anchors (`structfield.plans`),
//! the inherent ones before the trait implementations. The snapshot,
//! [`SNAPSHOT`], is one sorted path a line. An item in the snapshot but gone
//! now fails the check unless CHANGELOG.md names it (see [`changelog_name`]);
//! any other difference asks for `--bless`, so the snapshot is always the
//! API of the commit it lives in. An item is listed once, at the path
//! `all.html` gives it (its defining module's, where that module is public),
//! so dropping a second, re-exported path of an item (`kiln::Array` beside
//! `kiln::handle::array::Array`) is not seen. The list is Linux's: items behind
//! `cfg(target_vendor = "apple")` (`kiln_metal::MetalBackend`) or
//! `cfg(target_arch = "wasm32")` (`kiln::ops::relaxed`) are not in it.

use crate::ci::PUBLISHED;
use crate::process::{self, cargo, workspace_root};
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// The snapshot, relative to the workspace root.
const SNAPSHOT: &str = "docs/public-api.txt";

/// The anchor prefixes of an item's members on its page. A variant's named
/// field is `variant.V.field.f`.
const MEMBER_ANCHORS: &[&str] = &[
    "structfield.",
    "variant.",
    "method.",
    "tymethod.",
    "associatedconstant.",
    "associatedtype.",
];

/// The headings after which a page lists members that are not the item's own
/// (trait impls, auto and blanket impls, a `Deref` target's methods, a trait's
/// implementors).
const FOREIGN_SECTIONS: &[&str] = &[
    "id=\"trait-implementations\"",
    "id=\"synthetic-implementations\"",
    "id=\"blanket-implementations\"",
    "id=\"deref-methods",
    "id=\"foreign-impls\"",
    "id=\"implementors\"",
];

/// `cargo xtask api`: documents the published crates (as CI's `doc` step
/// does, so after it nothing is rebuilt) and checks, or with `--bless`
/// rewrites, the snapshot.
pub fn run(args: &[String]) -> Result<(), String> {
    let bless = match args {
        [] => false,
        [flag] if flag == "--bless" => true,
        _ => return Err(format!("usage: cargo xtask api [--bless] (got {args:?})")),
    };
    let mut doc = cargo();
    doc.args(["doc", "--no-deps"]);
    for krate in PUBLISHED {
        doc.args(["-p", krate]);
    }
    process::run(doc.env("RUSTDOCFLAGS", "-D warnings"))?;
    let doc_dir = process::target_dir().join("doc");
    let mut current = Vec::new();
    for krate in PUBLISHED {
        // rustdoc's folder is the crate's name as Rust code writes it.
        current.extend(crate_items(&doc_dir, &krate.replace('-', "_"))?);
    }
    current.sort();
    current.dedup();
    let root = workspace_root();
    let snapshot_path = root.join(SNAPSHOT);
    if bless {
        fs::write(&snapshot_path, current.join("\n") + "\n")
            .map_err(|e| format!("writing {}: {e}", snapshot_path.display()))?;
        eprintln!("api: wrote {} public items to {SNAPSHOT}", current.len());
        return Ok(());
    }
    let snapshot = read(&snapshot_path)?;
    let snapshot: Vec<String> = snapshot.lines().map(str::to_string).collect();
    let changelog = read(&root.join("CHANGELOG.md"))?;
    check(&snapshot, &current, &changelog)
}

fn read(path: &Path) -> Result<String, String> {
    fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// Every public item of `krate` and every member of those items, as paths
/// (`kiln_wgpu::Counters::programs`), from its documentation in `doc_dir`.
fn crate_items(doc_dir: &Path, krate: &str) -> Result<Vec<String>, String> {
    let folder = doc_dir.join(krate);
    let all = read(&folder.join("all.html"))?;
    let mut items = Vec::new();
    for (page, name) in item_links(&all) {
        let item = format!("{krate}::{name}");
        let html = read(&folder.join(&page))?;
        items.extend(members(&html).into_iter().map(|m| format!("{item}::{m}")));
        items.push(item);
    }
    Ok(items)
}

/// The `(page, path)` pairs of an `all.html`'s item list, e.g.
/// `("nn/struct.Linear.html", "nn::Linear")`.
fn item_links(all_html: &str) -> Vec<(String, String)> {
    let list = match all_html.find("class=\"all-items\"") {
        Some(start) => &all_html[start..],
        None => return Vec::new(),
    };
    list.split("<a href=\"")
        .skip(1)
        .filter_map(|link| {
            let (page, rest) = link.split_once('"')?;
            let name = rest.split_once('>')?.1.split_once("</a>")?.0;
            Some((page.to_string(), name.to_string()))
        })
        .collect()
}

/// The names of an item page's own members, sorted, e.g. `plans` for
/// `id="structfield.plans"`, `Weights::path` for a variant's field.
fn members(page_html: &str) -> Vec<String> {
    let own_end = FOREIGN_SECTIONS
        .iter()
        .filter_map(|heading| page_html.find(heading))
        .min()
        .unwrap_or(page_html.len());
    let names: BTreeSet<String> = page_html[..own_end]
        .split("id=\"")
        .skip(1)
        .filter_map(|rest| rest.split_once('"').map(|(id, _)| id))
        .filter_map(|id| {
            MEMBER_ANCHORS
                .iter()
                .find_map(|prefix| id.strip_prefix(prefix))
        })
        .map(|name| without_duplicate_suffix(name).replace(".field.", "::"))
        .collect();
    names.into_iter().collect()
}

/// rustdoc tells apart two anchors of one name (a method in two impl blocks)
/// with `-1`, `-2`, …; the API has one name.
fn without_duplicate_suffix(name: &str) -> &str {
    match name.rsplit_once('-') {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => name,
    }
}

/// What CHANGELOG.md must contain for `path` to have gone: its last two
/// segments below the crate (`Counters::plans`, `nn::Linear`), or the one
/// segment of a crate-root item (`Array`).
fn changelog_name(path: &str) -> String {
    let below_crate: Vec<&str> = path.split("::").skip(1).collect();
    let start = below_crate.len().saturating_sub(2);
    below_crate[start..].join("::")
}

/// Compares the current public items with the snapshot: an error names each
/// removed item CHANGELOG.md does not mention; short of that, any difference
/// is an error asking for `--bless`.
fn check(snapshot: &[String], current: &[String], changelog: &str) -> Result<(), String> {
    let now: BTreeSet<&str> = current.iter().map(String::as_str).collect();
    let then: BTreeSet<&str> = snapshot.iter().map(String::as_str).collect();
    let removed: Vec<&str> = then.difference(&now).copied().collect();
    let unlisted: Vec<String> = removed
        .iter()
        .filter(|path| !changelog.contains(&changelog_name(path)))
        .map(|path| {
            format!(
                "  {path} (CHANGELOG.md names no `{}`)",
                changelog_name(path)
            )
        })
        .collect();
    if !unlisted.is_empty() {
        return Err(format!(
            "{} public item(s) gone without a CHANGELOG.md line:\n{}\n\
             add a line for each, then `cargo xtask api --bless`",
            unlisted.len(),
            unlisted.join("\n")
        ));
    }
    let added = now.difference(&then).count();
    if added > 0 || !removed.is_empty() {
        return Err(format!(
            "{SNAPSHOT} is out of date ({added} new, {} removed and in CHANGELOG.md): \
             run `cargo xtask api --bless` and commit it",
            removed.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(list: &[&str]) -> Vec<String> {
        list.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn item_links_reads_paths_and_pages_from_the_all_items_list() {
        let all = r#"<h1>List of all items</h1><h3 id="structs">Structs</h3>
            <ul class="all-items"><li><a href="struct.Array.html">Array</a></li>
            <li><a href="nn/struct.Linear.html">nn::Linear</a></li></ul>
            <h3 id="functions">Functions</h3><ul class="all-items">
            <li><a href="fn.compile.html">compile</a></li></ul>"#;
        assert_eq!(
            item_links(all),
            vec![
                ("struct.Array.html".to_string(), "Array".to_string()),
                (
                    "nn/struct.Linear.html".to_string(),
                    "nn::Linear".to_string()
                ),
                ("fn.compile.html".to_string(), "compile".to_string()),
            ]
        );
    }

    #[test]
    fn members_keeps_inherent_ones_and_drops_trait_implementations() {
        let page = r#"<section id="structfield.programs" class="structfield">
            <h2 id="implementations">Implementations</h2>
            <section id="method.exp" class="method"></section>
            <section id="method.exp-1" class="method"></section>
            <section id="variant.Weights.field.path"></section>
            <h2 id="trait-implementations">Trait Implementations</h2>
            <section id="method.clone" class="method"></section>
            <h2 id="blanket-implementations"></h2><section id="method.into"></section>"#;
        assert_eq!(members(page), paths(&["Weights::path", "exp", "programs"]));
    }

    #[test]
    fn changelog_name_is_the_last_two_segments_below_the_crate() {
        assert_eq!(
            changelog_name("kiln_wgpu::Counters::plans"),
            "Counters::plans"
        );
        assert_eq!(changelog_name("kiln::nn::Linear"), "nn::Linear");
        assert_eq!(changelog_name("kiln::Array"), "Array");
    }

    #[test]
    fn check_fails_naming_a_removed_item_the_changelog_does_not_mention() {
        let snapshot = paths(&["kiln_wgpu::Counters", "kiln_wgpu::Counters::plans"]);
        let current = paths(&["kiln_wgpu::Counters", "kiln_wgpu::Counters::programs"]);
        let err = check(&snapshot, &current, "# Changelog\n").unwrap_err();
        assert!(err.contains("kiln_wgpu::Counters::plans"), "{err}");
        assert!(err.contains("1 public item(s) gone"), "{err}");
    }

    #[test]
    fn check_asks_for_bless_once_the_changelog_names_the_removal() {
        let snapshot = paths(&["kiln_wgpu::Counters::plans"]);
        let current = paths(&["kiln_wgpu::Counters::programs"]);
        let changelog = "* `kiln_wgpu::Counters::plans` is now `programs`\n";
        let err = check(&snapshot, &current, changelog).unwrap_err();
        assert!(err.contains("out of date (1 new, 1 removed"), "{err}");
        assert!(err.contains("--bless"), "{err}");
    }

    #[test]
    fn check_asks_for_bless_when_an_item_is_added() {
        let err = check(
            &paths(&["kiln::Array"]),
            &paths(&["kiln::Array", "kiln::Array::exp"]),
            "",
        )
        .unwrap_err();
        assert!(err.contains("1 new, 0 removed"), "{err}");
    }

    #[test]
    fn check_passes_when_the_api_matches_the_snapshot() {
        let api = paths(&["kiln::Array", "kiln::Array::exp"]);
        assert_eq!(check(&api, &api, ""), Ok(()));
    }
}
