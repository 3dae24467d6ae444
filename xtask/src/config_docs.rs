//! `cargo xtask config-docs`: rewrites the settings table of `docs/configuration.md` from
//! the settings of `intercept serve` (`intercept_cli::config::SETTINGS`).
//!
//! The table is rendered and checked by the test `config_docs` of intercept-cli, which
//! owns the settings: it fails while the committed table differs (so the suite keeps the
//! page true), and rewrites the table when `INTERCEPT_WRITE_CONFIG_DOCS` is set, which is
//! what [`write()`] does. xtask itself does not build the command's crate.

use std::path::Path;

use anyhow::{Context as _, Result};

/// Rewrites the table of `docs/configuration.md` from the settings (by running
/// intercept-cli's `config_docs` test with `INTERCEPT_WRITE_CONFIG_DOCS=1`).
pub fn write(root: &Path) -> Result<()> {
    let mut cmd = crate::cargo();
    cmd.args([
        "test",
        "--quiet",
        "-p",
        "intercept-cli",
        "--test",
        "config_docs",
    ])
    .args(["--", "--nocapture"])
    .env("INTERCEPT_WRITE_CONFIG_DOCS", "1")
    .current_dir(root);
    crate::run_streaming(&mut cmd).context("rendering the settings table failed")
}
