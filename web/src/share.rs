//! Share links and exported reports.
//!
//! A program travels in the URL fragment, `#s=` followed by its deflated
//! text in URL-safe base64, so a link restores it without a server. A
//! run's report is exported as JSON and opened back in the viewer.

use crate::report::RunReport;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

/// What a share fragment starts with.
pub const FRAGMENT_PREFIX: &str = "#s=";
/// The most bytes a shared program may inflate to: a link cannot carry a
/// program larger than a script may be anyway.
pub const MAX_SHARED_BYTES: usize = 1 << 20;
/// Deflate's level: the best ratio, still instant at script sizes.
const LEVEL: u8 = 9;

/// The URL fragment carrying `script`.
///
/// ```
/// use kiln_web::share::{decode_fragment, encode_fragment};
/// let fragment = encode_fragment("let x = ones([2]);");
/// assert!(fragment.starts_with("#s="));
/// assert_eq!(decode_fragment(&fragment).unwrap(), "let x = ones([2]);");
/// ```
pub fn encode_fragment(script: &str) -> String {
    let packed = miniz_oxide::deflate::compress_to_vec(script.as_bytes(), LEVEL);
    format!("{FRAGMENT_PREFIX}{}", URL_SAFE_NO_PAD.encode(packed))
}

/// The script a fragment carries; an `Err` names what is wrong with it.
pub fn decode_fragment(fragment: &str) -> Result<String, String> {
    let body = fragment
        .strip_prefix(FRAGMENT_PREFIX)
        .ok_or_else(|| format!("a shared program's fragment starts with {FRAGMENT_PREFIX}"))?;
    let packed = URL_SAFE_NO_PAD
        .decode(body)
        .map_err(|e| format!("the shared program is not valid base64: {e}"))?;
    let bytes = miniz_oxide::inflate::decompress_to_vec_with_limit(&packed, MAX_SHARED_BYTES)
        .map_err(|e| format!("the shared program does not inflate: {e}"))?;
    String::from_utf8(bytes).map_err(|_| "the shared program is not UTF-8 text".to_string())
}

/// The program a page address's fragment (`location.hash`) carries:
/// `None` when it carries none, an `Err` saying what is wrong with a
/// damaged one (the page shows it, then the first example).
///
/// ```
/// use kiln_web::share::{encode_fragment, program_in_link};
/// assert_eq!(program_in_link("").unwrap(), None);
/// assert_eq!(program_in_link(&encode_fragment("1")).unwrap().as_deref(), Some("1"));
/// assert!(program_in_link("#s=%%%").unwrap_err().contains("not valid base64"));
/// ```
pub fn program_in_link(hash: &str) -> Result<Option<String>, String> {
    if !hash.starts_with(FRAGMENT_PREFIX) {
        return Ok(None);
    }
    decode_fragment(hash).map(Some).map_err(|e| {
        format!("the link's program cannot be read ({e}); showing the first example instead")
    })
}

/// A report as the JSON file the Export button saves.
pub fn export_report(report: &RunReport) -> Result<String, String> {
    serde_json::to_string_pretty(report).map_err(|e| format!("cannot export the report: {e}"))
}

/// A report read back from an exported file.
pub fn import_report(json: &str) -> Result<RunReport, String> {
    serde_json::from_str(json).map_err(|e| format!("not an exported Kiln report: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::examples::EXAMPLES;
    use crate::script::Session;

    #[test]
    fn every_example_round_trips_through_a_url_safe_fragment() {
        for e in EXAMPLES {
            let fragment = encode_fragment(e.script);
            assert!(fragment[FRAGMENT_PREFIX.len()..]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
            assert_eq!(decode_fragment(&fragment).unwrap(), e.script);
        }
    }

    #[test]
    fn a_long_program_compresses() {
        let script = EXAMPLES.map(|e| e.script).concat();
        assert!(encode_fragment(&script).len() < script.len());
    }

    #[test]
    fn a_damaged_fragment_is_an_error_naming_the_problem() {
        assert!(decode_fragment("#x=abc")
            .unwrap_err()
            .contains("starts with #s="));
        assert!(decode_fragment("#s=%%%").unwrap_err().contains("base64"));
        assert!(decode_fragment("#s=AAAA").unwrap_err().contains("inflate"));
    }

    #[test]
    fn a_link_without_a_program_is_not_an_error() {
        assert_eq!(program_in_link("").unwrap(), None);
        assert_eq!(program_in_link("#graph").unwrap(), None);
    }

    #[test]
    fn a_damaged_link_names_the_problem_and_what_is_shown_instead() {
        let truncated = &encode_fragment(EXAMPLES[0].script)[..43];
        for (hash, problem) in [
            ("#s=%%%", "not valid base64"),
            (truncated, "does not inflate"),
        ] {
            let e = program_in_link(hash).unwrap_err();
            assert!(e.starts_with("the link's program cannot be read"), "{e}");
            assert!(e.contains(problem), "{e}");
            assert!(e.ends_with("showing the first example instead"), "{e}");
        }
    }

    #[test]
    fn an_exported_report_carries_its_script() {
        let report = Session::new().run(EXAMPLES[1].script);
        let back = import_report(&export_report(&report).unwrap()).unwrap();
        assert_eq!(back.script, EXAMPLES[1].script);
    }

    #[test]
    fn an_exported_report_imports_with_its_figures() {
        let report = Session::new().run(EXAMPLES[0].script);
        let back = import_report(&export_report(&report).unwrap()).unwrap();
        assert_eq!(back.outputs, report.outputs);
        assert_eq!(
            back.functions[0].cache.miss_log,
            report.functions[0].cache.miss_log
        );
        assert!(import_report("{}")
            .unwrap_err()
            .starts_with("not an exported Kiln report"));
    }
}
