//! The `intercept` command's library: the sidecar (`intercept serve`) and the demo
//! (`intercept demo`), reachable in-process so tests drive exactly what the binary runs.
//!
//! - [`sidecar::Sidecar`]: one interception plus a loopback, token-protected control API
//!   ([`control`]) that creates and releases sessions, returns traces, serves Prometheus
//!   [`metrics`] and appends trace files (through `intercept_trace`).
//! - [`config::ServeConfig`]: settings layered as file < `INTERCEPT_*` < flags.
//! - [`demo::run`]: simulated harnesses against an in-process sidecar on the mock model.
//! - [`run::run`]: the whole command line as a function (what the binary and the Python
//!   package's `intercept` entry point call).
//!
//! ```no_run
//! use intercept_cli::config::{ServeConfig, UpstreamSetting};
//! use intercept_cli::sidecar::Sidecar;
//!
//! # async fn run() -> anyhow::Result<()> {
//! let sidecar = Sidecar::start(ServeConfig {
//!     upstream: Some(UpstreamSetting::Mock),
//!     ..ServeConfig::default()
//! })
//! .await?;
//! println!("control API at {}", sidecar.control_url());
//! // POST {control_url}/v1/sessions with `Authorization: Bearer <token>` ...
//! sidecar.shutdown().await
//! # }
//! ```

pub mod cli;
pub mod config;
pub mod control;
pub mod demo;
pub mod logs;
pub mod metrics;
pub mod run;
pub mod sidecar;
pub mod trace;
mod tunnel;

pub use config::ServeConfig;
pub use demo::{DemoOptions, DemoSummary};
pub use sidecar::Sidecar;
