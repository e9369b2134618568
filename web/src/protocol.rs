//! The messages between the page and the Web Worker that owns Kiln.
//! Both halves are this crate, so the types are shared; they travel as
//! plain JS objects through `serde-wasm-bindgen`.

use crate::backend::{BackendChoice, BackendStatus};
use crate::report::{Comparison, RunReport, Verification};
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
    /// Run a script on the active backend and again on the CPU executor,
    /// and compare the values it shows.
    Verify {
        /// Pairs the answer with its request.
        id: u64,
        /// The Rhai script.
        script: String,
    },
    /// Run later scripts on `backend` (answered by a new `Ready`).
    SetBackend {
        /// The backend asked for.
        backend: BackendChoice,
    },
}

/// From the worker to the page.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    /// The worker has loaded (or switched backends) and runs scripts on
    /// `backend.active`.
    Ready {
        /// The backends, and the adapter the browser gave.
        backend: BackendStatus,
    },
    /// A run finished (or failed: see [`RunReport::error`]).
    Report {
        /// The request's id.
        id: u64,
        /// What the run did.
        report: RunReport,
    },
    /// A run on the active backend, and its values against the CPU's.
    Verified {
        /// The request's id.
        id: u64,
        /// The run on the active backend.
        report: RunReport,
        /// The largest difference to the CPU executor.
        verification: Verification,
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
            backend: BackendStatus {
                active: "cpu".to_string(),
                choices: vec![BackendChoice::Cpu],
                adapter: None,
                unavailable: Some("no adapter".to_string()),
                reopening: false,
                relaxed_products: false,
            },
        })
        .unwrap();
        assert_eq!(
            ready,
            serde_json::json!({"kind": "ready", "backend": {
                "active": "cpu", "choices": ["cpu"], "adapter": null, "unavailable": "no adapter",
                "reopening": false, "relaxed_products": false
            }})
        );
        let switch = Request::SetBackend {
            backend: BackendChoice::Webgpu,
        };
        assert_eq!(
            serde_json::to_value(&switch).unwrap(),
            serde_json::json!({"kind": "set_backend", "backend": "webgpu"})
        );
    }
}
