//! The page's help: the script API reference (`docs/script-api.md`,
//! embedded when the crate is built, so the page and the file never
//! disagree), cut into sections a search box filters, and the keyboard
//! shortcuts.

/// `docs/script-api.md` as it was when the crate was built.
pub const SCRIPT_API: &str = include_str!("../../docs/script-api.md");

/// The page's keyboard and pointer shortcuts: (keys, what they do).
pub const SHORTCUTS: &[(&str, &str)] = &[
    ("Ctrl+Enter (⌘+Enter)", "run the script in the editor"),
    ("Ctrl+Z / Ctrl+Shift+Z", "undo / redo in the editor"),
    ("Ctrl+F", "find in the editor"),
    ("Tab / Shift+Tab", "indent / unindent the selected lines"),
    ("drag, wheel", "pan and zoom the graph"),
    (
        "click",
        "select a box, a group, a reinplace row, a bar or a slot",
    ),
];

/// One `##` section of the reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelpSection {
    /// Its heading: `Functions`, `Methods of ndarray`, ….
    pub title: String,
    /// Its prose, one string per paragraph line.
    pub text: Vec<String>,
    /// Its entries, in the file's order.
    pub entries: Vec<HelpEntry>,
}

/// One documented name with its overloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelpEntry {
    /// The function, method or operator: `arange`, `nn::softmax`, `@`.
    pub name: String,
    /// Its overloads as the file writes them, code in backticks.
    pub text: String,
}

/// The sections of a reference written like `docs/script-api.md`: the
/// text before the first `##` is a section titled by the `#` heading;
/// each `* **`name`**: text` line is an entry.
pub fn help_sections(markdown: &str) -> Vec<HelpSection> {
    let mut sections: Vec<HelpSection> = Vec::new();
    for line in markdown.lines().map(str::trim) {
        if let Some(title) = line.strip_prefix("## ").or_else(|| line.strip_prefix("# ")) {
            sections.push(HelpSection {
                title: title.to_string(),
                text: Vec::new(),
                entries: Vec::new(),
            });
            continue;
        }
        let Some(section) = sections.last_mut() else {
            continue;
        };
        match entry(line) {
            Some(entry) => section.entries.push(entry),
            None if !line.is_empty() => section.text.push(line.to_string()),
            None => {}
        }
    }
    sections
}

/// The entry a `* **`name`**: text` line documents.
fn entry(line: &str) -> Option<HelpEntry> {
    let rest = line.strip_prefix("* **`")?;
    // A name may itself hold `**` (the power operator): the name ends at
    // the first closing code span followed by the colon.
    let end = rest.find("`**: ")?;
    Some(HelpEntry {
        name: rest[..end].to_string(),
        text: rest[end + "`**: ".len()..].to_string(),
    })
}

/// The sections narrowed to what `query` finds (ignoring case): a section
/// whose title matches whole, else its entries whose name or overloads
/// match; sections left empty are dropped. An empty query keeps all.
pub fn filter_help(sections: &[HelpSection], query: &str) -> Vec<HelpSection> {
    let query = query.trim().to_lowercase();
    if query.is_empty() {
        return sections.to_vec();
    }
    let found = |text: &str| text.to_lowercase().contains(&query);
    sections
        .iter()
        .filter_map(|section| {
            if found(&section.title) {
                return Some(section.clone());
            }
            let entries: Vec<HelpEntry> = section
                .entries
                .iter()
                .filter(|e| found(&e.name) || found(&e.text))
                .cloned()
                .collect();
            (!entries.is_empty()).then(|| HelpSection {
                title: section.title.clone(),
                text: Vec::new(),
                entries,
            })
        })
        .collect()
}

/// `text` cut at its backticks: (is code, part), code parts without the
/// backticks, so the page can set them in monospace.
pub fn code_spans(text: &str) -> Vec<(bool, &str)> {
    text.split('`')
        .enumerate()
        .filter(|(_, part)| !part.is_empty())
        .map(|(i, part)| (i % 2 == 1, part))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_reference_has_its_sections_and_every_entry() {
        let sections = help_sections(SCRIPT_API);
        let titles: Vec<&str> = sections.iter().map(|s| s.title.as_str()).collect();
        assert_eq!(
            titles,
            [
                "Script API reference",
                "Functions",
                "Methods of ndarray",
                "Operators",
                "Properties and indexing"
            ]
        );
        let entries: usize = sections.iter().map(|s| s.entries.len()).sum();
        let lines = SCRIPT_API
            .lines()
            .filter(|l| l.starts_with("* **`"))
            .count();
        assert_eq!(entries, lines);
        assert!(!sections[0].text.is_empty(), "the introduction is kept");
    }

    #[test]
    fn an_operator_named_with_stars_keeps_its_name() {
        let line = "* **`**`**: `x ** f64 → ndarray`";
        assert_eq!(
            entry(line),
            Some(HelpEntry {
                name: "**".to_string(),
                text: "`x ** f64 → ndarray`".to_string()
            })
        );
    }

    #[test]
    fn a_search_keeps_matching_entries_and_whole_matching_sections() {
        let sections = help_sections(SCRIPT_API);
        let softmax = filter_help(&sections, "SOFTMAX");
        let names: Vec<&str> = softmax
            .iter()
            .flat_map(|s| s.entries.iter().map(|e| e.name.as_str()))
            .collect();
        assert_eq!(names, ["nn::log_softmax", "nn::softmax"]);
        let operators = filter_help(&sections, "operators");
        assert_eq!(operators.len(), 1);
        assert_eq!(operators[0].entries, sections[3].entries);
        assert_eq!(filter_help(&sections, "  "), sections);
        assert!(filter_help(&sections, "no such thing").is_empty());
    }

    #[test]
    fn code_spans_alternate_text_and_code() {
        assert_eq!(
            code_spans("`ones(list) → ndarray`, or `x.T`"),
            vec![
                (true, "ones(list) → ndarray"),
                (false, ", or "),
                (true, "x.T")
            ]
        );
    }
}
