//! Finding pieces of a script's source text: the argument of a
//! `compile(...)` call and the script's `fn` definitions.
//!
//! The compile cache of a script function is keyed by its *text*, so that
//! re-running an edited script keeps the caches of the functions whose text
//! did not change. Rhai's AST does not keep source text, so this module
//! scans it: a light lexer that knows strings, characters and comments
//! well enough to match brackets.

/// A byte offset in `source` for a 1-based Rhai line and column (columns
/// count characters). `None` when the position lies outside the text.
pub fn offset_of(source: &str, line: usize, column: usize) -> Option<usize> {
    let line_start = if line == 1 {
        0
    } else {
        source
            .match_indices('\n')
            .nth(line.checked_sub(2)?)
            .map(|(i, _)| i + 1)?
    };
    let rest = &source[line_start..];
    let in_line = rest
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(rest.len()))
        .nth(column.checked_sub(1)?)?;
    Some(line_start + in_line)
}

/// The text between the parentheses of the call whose name starts at byte
/// `start`: for `compile(|x| x * 2.0).shapeless()` at the `c`, the text
/// `|x| x * 2.0`. `None` when no balanced call follows.
pub fn call_argument(source: &str, start: usize) -> Option<&str> {
    let after_name = start
        + source
            .get(start..)?
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    let open = after_name + source[after_name..].find(|c: char| !c.is_whitespace())?;
    if !source[open..].starts_with('(') {
        return None;
    }
    let close = matching_close(source, open)?;
    Some(source[open + 1..close].trim())
}

/// The text of every `fn` definition of the script, in order, each from
/// `fn` (or `private fn`) to its closing brace.
pub fn function_definitions(source: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut scan = Scanner::new(source, 0);
    while let Some((at, c)) = scan.next_code_char() {
        if c != 'f' || !source[at..].starts_with("fn") || !is_word_at(source, at, 2) {
            continue;
        }
        let Some(open) = source[at..].find('{').map(|i| at + i) else {
            break;
        };
        let Some(close) = matching_close(source, open) else {
            break;
        };
        found.push(&source[at..=close]);
        scan = Scanner::new(source, close + 1);
    }
    found
}

/// A closure of a script: `|a, b| ...` where an expression starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClosureAt {
    /// The 1-based line of its opening `|`.
    pub line: usize,
    /// Its parameters, in order.
    pub params: Vec<String>,
}

/// Every closure of `source`, in order. A `|` opens one where an
/// expression starts (after `(`, `,`, `=`, `{`, `[`, `;`, `:` or at the
/// start) and is followed by identifiers separated by commas and a `|`;
/// elsewhere `|` is an operator.
pub fn closures(source: &str) -> Vec<ClosureAt> {
    let mut scanner = Scanner::new(source, 0);
    let code: Vec<(usize, char)> = std::iter::from_fn(|| scanner.next_code_char()).collect();
    let mut found = Vec::new();
    let mut previous = None;
    let mut k = 0;
    while k < code.len() {
        let (at, c) = code[k];
        let starts_expression = previous.is_none_or(|p| "(,={[;:".contains(p));
        if c == '|' && starts_expression {
            if let Some((params, close)) = closure_params(&code[k + 1..]) {
                found.push(ClosureAt {
                    line: source[..at].matches('\n').count() + 1,
                    params,
                });
                k += close + 2;
                previous = Some('|');
                continue;
            }
        }
        if !c.is_whitespace() {
            previous = Some(c);
        }
        k += 1;
    }
    found
}

/// The parameters between a closure's bars, given the code after its
/// opening `|`, and the index of the closing one.
fn closure_params(after: &[(usize, char)]) -> Option<(Vec<String>, usize)> {
    let close = after.iter().position(|&(_, c)| c == '|')?;
    let text: String = after[..close].iter().map(|&(_, c)| c).collect();
    if text.trim().is_empty() {
        return Some((Vec::new(), close));
    }
    let params: Vec<String> = text.split(',').map(|p| p.trim().to_string()).collect();
    let is_identifier = |p: &String| {
        p.chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_')
            && p.chars().all(|c| c.is_alphanumeric() || c == '_')
    };
    params.iter().all(is_identifier).then_some((params, close))
}

/// True when the `len` bytes at `at` form a whole word.
fn is_word_at(source: &str, at: usize, len: usize) -> bool {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let before = source[..at]
        .chars()
        .next_back()
        .is_none_or(|c| !is_ident(c));
    let after = source[at + len..]
        .chars()
        .next()
        .is_none_or(|c| !is_ident(c));
    before && after
}

/// The byte offset of the bracket closing the one at `open`.
fn matching_close(source: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut scan = Scanner::new(source, open);
    while let Some((at, c)) = scan.next_code_char() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(at);
                }
            }
            _ => {}
        }
    }
    None
}

/// Walks the characters of a script that are code: strings, characters and
/// comments are skipped whole.
struct Scanner<'a> {
    chars: std::iter::Peekable<std::str::CharIndices<'a>>,
    base: usize,
}

impl<'a> Scanner<'a> {
    fn new(source: &'a str, from: usize) -> Scanner<'a> {
        Scanner {
            chars: source[from..].char_indices().peekable(),
            base: from,
        }
    }

    fn next_code_char(&mut self) -> Option<(usize, char)> {
        loop {
            let (i, c) = self.chars.next()?;
            match c {
                '"' | '\'' | '`' => self.skip_quoted(c),
                '/' if self.chars.peek().map(|&(_, n)| n) == Some('/') => {
                    self.chars.find(|&(_, n)| n == '\n');
                }
                '/' if self.chars.peek().map(|&(_, n)| n) == Some('*') => {
                    self.chars.next();
                    self.skip_block_comment();
                }
                _ => return Some((self.base + i, c)),
            }
        }
    }

    fn skip_quoted(&mut self, quote: char) {
        while let Some((_, c)) = self.chars.next() {
            match c {
                '\\' if quote != '`' => {
                    self.chars.next();
                }
                c if c == quote => return,
                _ => {}
            }
        }
    }

    /// Rhai's block comments nest.
    fn skip_block_comment(&mut self) {
        let mut depth = 1usize;
        while let Some((_, c)) = self.chars.next() {
            let next = self.chars.peek().map(|&(_, n)| n);
            match (c, next) {
                ('*', Some('/')) => {
                    self.chars.next();
                    depth -= 1;
                    if depth == 0 {
                        return;
                    }
                }
                ('/', Some('*')) => {
                    self.chars.next();
                    depth += 1;
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_of_counts_lines_and_character_columns() {
        let src = "let a = 1;\nlet é = compile(x);";
        let at = offset_of(src, 2, 9).unwrap();
        assert_eq!(&src[at..at + 7], "compile");
        assert_eq!(offset_of(src, 3, 1), None);
    }

    #[test]
    fn call_argument_skips_brackets_in_strings_and_comments() {
        let src = "compile(|x| { let s = \")\"; /* ) */ x + 1 // )\n }).shapeless()";
        assert_eq!(
            call_argument(src, 0),
            Some("|x| { let s = \")\"; /* ) */ x + 1 // )\n }")
        );
    }

    #[test]
    fn call_argument_is_none_without_a_call() {
        assert_eq!(call_argument("compile + 1", 0), None);
        assert_eq!(call_argument("compile(|x| x", 0), None);
    }

    #[test]
    fn closures_are_found_with_their_lines_and_parameters() {
        let src =
            "let f = compile(|x| x | 1);\n// |no| comment\nlet g = |a, b| {\n  a.map(|| 2)\n};";
        let all = closures(src);
        let found: Vec<(usize, Vec<&str>)> = all
            .iter()
            .map(|c| (c.line, c.params.iter().map(String::as_str).collect()))
            .collect();
        assert_eq!(
            found,
            vec![(1, vec!["x"]), (3, vec!["a", "b"]), (4, vec![])]
        );
    }

    #[test]
    fn function_definitions_finds_each_fn_whole() {
        let src = "fn a(x) { if x { 1 } else { 2 } }\nlet fnord = 1;\n// fn c() {}\nprivate fn b() { \"}\" }";
        assert_eq!(
            function_definitions(src),
            vec!["fn a(x) { if x { 1 } else { 2 } }", "fn b() { \"}\" }"]
        );
    }
}
