//! Fakes shared by intercept's tests, benchmarks and demo, starting with a scriptable mock
//! model server ([`MockUpstream`]) that speaks OpenAI Chat Completions
//! (`/v1/chat/completions`), OpenAI Responses (`/v1/responses`) and Anthropic Messages
//! (`/v1/messages`, `/v1/messages/count_tokens`), the dialect chosen by the route. A
//! scripted [`Reply`] is rendered in the dialect of the route that takes it.
//!
//! ```
//! use intercept_test::{MockUpstream, Reply};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let upstream = MockUpstream::start().await?;
//! upstream.push(Reply::text("Hello!").with_finish_reason("length"));
//!
//! // Any HTTP client pointed at `upstream.base_url()` works; a raw request keeps this short.
//! let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
//! let mut tcp = tokio::net::TcpStream::connect(upstream.addr()).await?;
//! tcp.write_all(format!(
//!     "POST /v1/chat/completions HTTP/1.1\r\nhost: mock\r\nconnection: close\r\n\
//!      content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
//!     body.len(),
//! ).as_bytes()).await?;
//! let mut response = String::new();
//! tcp.read_to_string(&mut response).await?;
//! assert!(response.contains(r#""content":"Hello!""#));
//! assert!(response.contains(r#""finish_reason":"length""#));
//!
//! // Without a scripted reply the mock echoes; every request is logged.
//! assert_eq!(upstream.requests()[0].json().unwrap()["model"], "m");
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
pub mod upstream;

pub use upstream::*;

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
