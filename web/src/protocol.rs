//! The messages between the page and the Web Worker that owns Kiln.
//! Both halves are this crate, so the types are shared; they travel as
//! plain JS objects through `serde-wasm-bindgen`.

use crate::report::{Comparison, RunReport};
use serde::{Deserialize, Serialize};

/// From the page to the worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Request {
    /// Run a script; the answer carries the same `id`.
    Run {
        /// Pairs the report with its request: a run still queued when the
        /// user edits again is answered, but its report is stale.
        id: u64,
        /// The Rhai script.
        script: String,
    },
    /// Run a script once per what-if variant and compare the plans.
    Compare {
        /// Pairs the comparison with its request.
        id: u64,
        /// The Rhai script.
        script: String,
    },
}

/// From the worker to the page.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    /// The worker has loaded and runs scripts on `backend`.
    Ready {
        /// The backend's name.
        backend: String,
    },
    /// A run finished (or failed: see [`RunReport::error`]).
    Report {
        /// The request's id.
        id: u64,
        /// What the run did.
        report: RunReport,
    },
    /// The what-if variants of a script, side by side.
    Comparison {
        /// The request's id.
        id: u64,
        /// One row per variant.
        rows: Vec<Comparison>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_tagged_objects() {
        let request = Request::Run {
            id: 7,
            script: "1".to_string(),
        };
        let json = serde_json::to_value(&request).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"kind": "run", "id": 7, "script": "1"})
        );
        assert_eq!(serde_json::from_value::<Request>(json).unwrap(), request);
        let ready = serde_json::to_value(Response::Ready {
            backend: "cpu".to_string(),
        })
        .unwrap();
        assert_eq!(
            ready,
            serde_json::json!({"kind": "ready", "backend": "cpu"})
        );
    }
}
