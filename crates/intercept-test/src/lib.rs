//! Fakes shared by intercept's tests and benchmarks. The mock model server
//! ([`MockUpstream`], a scriptable server that speaks Chat Completions, Responses and
//! Anthropic Messages) is the crate `intercept-mock`, re-exported here, so tests name every
//! fake from one crate.
//!
//! ```
//! use intercept_test::{MockUpstream, Reply};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let upstream = MockUpstream::start().await?;
//! upstream.push(Reply::text("Hello!"));
//! upstream.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! Beside it: [`prime`] (a mock Prime tunnel API and the `fake-frpc` binary), [`redis`]
//! (a `redis-server` on a loopback port), [`process`] (other processes alive, dead or
//! killed) and [`helper_binary`] (a binary of the workspace built for a test).

pub mod prime;
pub mod process;
pub mod redis;

pub use intercept_mock::*;

use std::path::{Path, PathBuf};

/// A helper executable next to the running test (`target/<profile>/<sub>/<name>`). `cargo
/// test --workspace` builds it fresh; when it is missing or older than any of `sources`
/// (paths relative to the workspace root), it is built with `cargo build <build_args>`
/// (`--release` too when the test runs from `target/release`).
///
/// # Panics
///
/// When the test's own path cannot be read, cargo cannot be run, or the build fails:
/// this is test setup.
#[allow(clippy::unwrap_used)]
pub fn helper_binary(sub: &str, name: &str, build_args: &[&str], sources: &[&str]) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> -> target/<profile>
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let bin = profile_dir
        .join(sub)
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let fresh = modified(&bin).is_some_and(|built| {
        sources
            .iter()
            .all(|s| modified(&root.join(s)).is_none_or(|changed| changed <= built))
    });
    if !fresh {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_string());
        let mut cmd = std::process::Command::new(cargo);
        cmd.arg("build").arg("-q").args(build_args);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("cannot run cargo");
        assert!(status.success(), "building {name} failed");
    }
    assert!(bin.exists(), "{} not found", bin.display());
    bin
}
