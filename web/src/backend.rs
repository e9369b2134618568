//! Which backend the playground's worker runs scripts on, what the
//! browser says about its WebGPU adapter, and how the header words them.

use crate::report::Verification;
use serde::{Deserialize, Serialize};

/// A backend the page can ask the worker for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendChoice {
    /// `kiln-wgpu` on the browser's WebGPU adapter.
    Webgpu,
    /// Kiln's CPU executor (in WebAssembly).
    Cpu,
}

impl BackendChoice {
    /// The name the header shows.
    pub fn label(self) -> &'static str {
        match self {
            BackendChoice::Webgpu => "WebGPU",
            BackendChoice::Cpu => "CPU",
        }
    }

    /// The choice a Kiln backend name belongs to (`wgpu:…` or `cpu`).
    pub fn of_backend(name: &str) -> Option<BackendChoice> {
        if name.starts_with("wgpu") {
            Some(BackendChoice::Webgpu)
        } else if name == "cpu" {
            Some(BackendChoice::Cpu)
        } else {
            None
        }
    }
}

/// What the browser reports of its WebGPU adapter (`GPUAdapterInfo`;
/// Chromium leaves the device name and description empty).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterInfo {
    /// `vendor`, like `google`.
    pub vendor: String,
    /// `architecture`, like `swiftshader`.
    pub architecture: String,
    /// `device`.
    pub device: String,
    /// `description`.
    pub description: String,
    /// Whether it is a fallback (software) adapter.
    pub is_fallback: bool,
}

impl AdapterInfo {
    /// One line for the header: the fields the browser filled in, and
    /// whether it is a fallback adapter.
    pub fn summary(&self) -> String {
        let mut parts: Vec<&str> = [
            &self.vendor,
            &self.architecture,
            &self.device,
            &self.description,
        ]
        .into_iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect();
        parts.dedup();
        let named = if parts.is_empty() {
            "adapter without a name".to_string()
        } else {
            parts.join(" / ")
        };
        if self.is_fallback {
            format!("{named} (fallback adapter)")
        } else {
            named
        }
    }
}

/// Where the worker stands: the backend it runs on, the ones it offers,
/// and the adapter (or why there is no WebGPU).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackendStatus {
    /// The Kiln name of the backend scripts run on (`cpu`, `wgpu:…`).
    pub active: String,
    /// The backends the page may switch to.
    pub choices: Vec<BackendChoice>,
    /// The WebGPU adapter, when the browser gave one.
    pub adapter: Option<AdapterInfo>,
    /// Why WebGPU is not offered, when it is not.
    pub unavailable: Option<String>,
    /// Whether the worker is still opening WebGPU, running scripts on the
    /// CPU meanwhile (after Stop, while the GPU finishes the stopped
    /// run's work, which no browser can cancel).
    #[serde(default)]
    pub reopening: bool,
    /// Whether the CPU executor's f32 products run on the relaxed-SIMD
    /// kernel module (loaded where the browser validates relaxed SIMD).
    #[serde(default)]
    pub relaxed_products: bool,
}

impl BackendStatus {
    /// The header's words (its tooltip) for the CPU executor's products.
    pub fn cpu_products(&self) -> &'static str {
        if self.relaxed_products {
            "CPU products: relaxed-SIMD kernel module (fused multiply-adds)"
        } else {
            "CPU products: simd128 kernel (a multiply, then an add)"
        }
    }

    /// The header's words for the active backend.
    pub fn label(&self) -> String {
        match BackendChoice::of_backend(&self.active) {
            Some(BackendChoice::Webgpu) => match &self.adapter {
                Some(adapter) => format!("WebGPU ({})", adapter.summary()),
                None => "WebGPU".to_string(),
            },
            Some(BackendChoice::Cpu) if self.reopening => "CPU (WebGPU reopening)".to_string(),
            Some(BackendChoice::Cpu) if self.unavailable.is_some() => "CPU (no WebGPU)".to_string(),
            Some(BackendChoice::Cpu) => "CPU".to_string(),
            None => self.active.clone(),
        }
    }
}

impl Verification {
    /// One line for the header: the largest difference to the CPU.
    pub fn summary(&self) -> String {
        let backend =
            BackendChoice::of_backend(&self.backend).map_or(self.backend.as_str(), |c| c.label());
        match &self.error {
            Some(e) => format!("verify on {backend}: {e}"),
            None => {
                let at = self.largest.as_ref().map_or_else(String::new, |d| {
                    let index: Vec<String> = d.index.iter().map(ToString::to_string).collect();
                    format!(
                        ", at \"{}\" [{}]: {} on {backend}, {} on the CPU",
                        d.label,
                        index.join(", "),
                        element(d.device),
                        element(d.cpu)
                    )
                });
                format!(
                    "verify on {backend}: largest difference to the CPU {:.3e} \
                     (relative {:.3e}) over {} values{at}",
                    self.max_abs_diff, self.max_rel_diff, self.compared
                )
            }
        }
    }
}

/// An element as the outputs print it: `nan`, `-inf`, `1.386294`.
fn element(x: f64) -> String {
    match x {
        x if x.is_nan() => "nan".to_string(),
        x if x.is_infinite() => if x > 0.0 { "inf" } else { "-inf" }.to_string(),
        x => format!("{}", x as f32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_map_to_choices() {
        assert_eq!(
            BackendChoice::of_backend("wgpu:"),
            Some(BackendChoice::Webgpu)
        );
        assert_eq!(BackendChoice::of_backend("cpu"), Some(BackendChoice::Cpu));
        assert_eq!(BackendChoice::of_backend("metal"), None);
        assert_eq!(
            serde_json::to_value(BackendChoice::Webgpu).unwrap(),
            serde_json::json!("webgpu")
        );
    }

    #[test]
    fn the_header_names_the_adapter_the_browser_describes() {
        let status = BackendStatus {
            active: "wgpu:".to_string(),
            choices: vec![BackendChoice::Webgpu, BackendChoice::Cpu],
            adapter: Some(AdapterInfo {
                vendor: "google".to_string(),
                architecture: "swiftshader".to_string(),
                is_fallback: true,
                ..AdapterInfo::default()
            }),
            unavailable: None,
            reopening: false,
            relaxed_products: false,
        };
        assert_eq!(
            status.label(),
            "WebGPU (google / swiftshader (fallback adapter))"
        );
        assert_eq!(AdapterInfo::default().summary(), "adapter without a name");
    }

    #[test]
    fn the_cpu_fallback_says_there_is_no_webgpu() {
        let status = BackendStatus {
            active: "cpu".to_string(),
            choices: vec![BackendChoice::Cpu],
            adapter: None,
            unavailable: Some("navigator.gpu is missing".to_string()),
            reopening: false,
            relaxed_products: false,
        };
        assert_eq!(status.label(), "CPU (no WebGPU)");
    }

    #[test]
    fn the_cpu_says_while_webgpu_reopens() {
        let status = BackendStatus {
            active: "cpu".to_string(),
            choices: vec![BackendChoice::Cpu],
            adapter: None,
            unavailable: Some("the GPU is finishing the stopped run's work".to_string()),
            reopening: true,
            relaxed_products: false,
        };
        assert_eq!(status.label(), "CPU (WebGPU reopening)");
    }

    #[test]
    fn the_tooltip_says_which_kernel_runs_the_cpu_products() {
        let mut status = BackendStatus {
            active: "cpu".to_string(),
            choices: vec![BackendChoice::Cpu],
            adapter: None,
            unavailable: None,
            reopening: false,
            relaxed_products: false,
        };
        assert_eq!(
            status.cpu_products(),
            "CPU products: simd128 kernel (a multiply, then an add)"
        );
        status.relaxed_products = true;
        assert_eq!(
            status.cpu_products(),
            "CPU products: relaxed-SIMD kernel module (fused multiply-adds)"
        );
    }

    #[test]
    fn a_verification_summary_gives_the_largest_difference() {
        let v = Verification {
            backend: "wgpu:".to_string(),
            compared: 80,
            max_abs_diff: 2.8e-6,
            max_rel_diff: 1.4e-6,
            largest: None,
            error: None,
        };
        assert_eq!(
            v.summary(),
            "verify on WebGPU: largest difference to the CPU 2.800e-6 (relative 1.400e-6) \
             over 80 values"
        );
    }

    #[test]
    fn a_verification_summary_names_the_value_and_element_that_differ() {
        let v = Verification {
            backend: "wgpu:".to_string(),
            compared: 4,
            max_abs_diff: f64::INFINITY,
            max_rel_diff: f64::INFINITY,
            largest: Some(crate::report::Difference {
                label: "log".to_string(),
                index: vec![0],
                device: 0.0,
                cpu: f64::NAN,
            }),
            error: None,
        };
        assert_eq!(
            v.summary(),
            "verify on WebGPU: largest difference to the CPU inf (relative inf) over 4 values, \
             at \"log\" [0]: 0 on WebGPU, nan on the CPU"
        );
    }
}
