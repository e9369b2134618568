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
