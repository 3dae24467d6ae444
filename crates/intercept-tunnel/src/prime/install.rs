//! Finding or installing the frpc binary (where `prime_tunnel` 0.1.15 looks for it and
//! what it downloads).
//!
//! Order: an explicit path from the config, then `$FRPC_PATH`, then `~/.prime/bin/frpc`
//! when its `.frpc_version` marker names the wanted version. Otherwise the release tarball
//! is downloaded from [`FrpcInstall::release_url`], its SHA-256 checked against the pinned
//! checksum for this platform, the `frpc` member extracted, made executable and renamed
//! into place atomically (the marker too).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::account::PrimeEnv;
use super::api::{https_client, require_tls_for};
use crate::error::TunnelError;

/// The frp version intercept expects.
pub const FRP_VERSION: &str = "0.66.0";

/// The largest tarball accepted.
const MAX_DOWNLOAD: usize = 100 * 1024 * 1024;

/// How frpc is downloaded when it is not installed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FrpcInstall {
    /// The frp version (`.frpc_version` must match it).
    pub version: String,
    /// The release tarball URL; `{version}` and `{platform}` (e.g. `linux_amd64`) are
    /// substituted.
    pub release_url: String,
    /// Pinned SHA-256 (hex) of the tarball per platform. A platform without a checksum is
    /// never downloaded: install frpc yourself and set `FRPC_PATH`, or pin one here.
    pub sha256: BTreeMap<String, String>,
    /// How error messages tell the user to pin a checksum (default: "in the tunnel
    /// config (`frpc.sha256.<platform>`)"); a front end names its own setting (the sidecar:
    /// `frpc_sha256`). Not part of config files.
    #[serde(skip)]
    pub pin_hint: Option<String>,
}

impl Default for FrpcInstall {
    fn default() -> Self {
        FrpcInstall {
            version: FRP_VERSION.into(),
            release_url:
                "https://github.com/fatedier/frp/releases/download/v{version}/frp_{version}_{platform}.tar.gz"
                    .into(),
            sha256: BTreeMap::new(),
            pin_hint: None,
        }
    }
}

/// This machine's frp platform name (`linux_amd64`, `linux_arm64`, `darwin_amd64`,
/// `darwin_arm64`), if frp ships one.
pub fn platform() -> Option<&'static str> {
    match (std::env::consts::OS, std::env::consts::ARCH) {
        ("linux", "x86_64") => Some("linux_amd64"),
        ("linux", "aarch64") => Some("linux_arm64"),
        ("macos", "x86_64") => Some("darwin_amd64"),
        ("macos", "aarch64") => Some("darwin_arm64"),
        _ => None,
    }
}

/// Returns a usable frpc path, installing it if needed.
pub(crate) async fn ensure_frpc(
    explicit: Option<&Path>,
    env: &PrimeEnv,
    install: &FrpcInstall,
) -> Result<PathBuf, TunnelError> {
    let configured = explicit.map(Path::to_path_buf).or_else(|| {
        env.vars
            .get("FRPC_PATH")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    });
    if let Some(path) = configured {
        if path.is_file() {
            return Ok(path);
        }
        return Err(TunnelError::Config(format!(
            "frpc not found at {}; fix the configured frpc path or FRPC_PATH",
            path.display()
        )));
    }
    let bin_dir = env.prime_dir().join("bin");
    let bin = bin_dir.join("frpc");
    let marker = bin_dir.join(".frpc_version");
    let installed = std::fs::read_to_string(&marker).unwrap_or_default();
    if bin.is_file() && installed.trim() == install.version {
        return Ok(bin);
    }
    let platform = platform().ok_or_else(|| {
        TunnelError::Download(format!(
            "frp has no build for {}/{}; install frpc and set FRPC_PATH",
            std::env::consts::OS,
            std::env::consts::ARCH
        ))
    })?;
    download(install, platform, &bin_dir).await?;
    Ok(bin)
}

/// Downloads, verifies and installs frpc into `bin_dir` for `platform`.
pub(crate) async fn download(
    install: &FrpcInstall,
    platform: &str,
    bin_dir: &Path,
) -> Result<(), TunnelError> {
    let expected = install
        .sha256
        .get(platform)
        .map(|s| s.trim().to_ascii_lowercase())
        .ok_or_else(|| {
            let hint = install
                .pin_hint
                .clone()
                .unwrap_or_else(|| format!("in the tunnel config (frpc.sha256.{platform})"));
            TunnelError::Download(format!(
                "no pinned SHA-256 for frp {} on {platform}; install frpc and set FRPC_PATH, \
                 or pin the checksum {hint}",
                install.version
            ))
        })?;
    let url = install
        .release_url
        .replace("{version}", &install.version)
        .replace("{platform}", platform);
    tracing::info!(%url, "downloading frpc");
    let body = fetch(&url).await?;
    let actual: String = Sha256::digest(&body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if actual != expected {
        return Err(TunnelError::Download(format!(
            "frpc download from {url} failed its checksum (expected {expected}, got {actual}); \
             nothing was installed"
        )));
    }
    let bin_dir = bin_dir.to_path_buf();
    let version = install.version.clone();
    tokio::task::spawn_blocking(move || install_tarball(&body, &bin_dir, &version))
        .await
        .map_err(|e| TunnelError::Download(format!("frpc install thread failed: {e}")))?
}

async fn fetch(url: &str) -> Result<Bytes, TunnelError> {
    let client = https_client()?;
    let mut url = url.to_string();
    for _ in 0..5 {
        require_tls_for(&url)?;
        let uri: http::Uri = url
            .parse()
            .map_err(|e| TunnelError::Download(format!("bad frpc release URL {url}: {e}")))?;
        let req = http::Request::get(uri.clone())
            .header(
                "user-agent",
                concat!("intercept-tunnel/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(Bytes::new()))
            .map_err(|e| TunnelError::Download(format!("bad request for {url}: {e}")))?;
        let resp = tokio::time::timeout(Duration::from_secs(120), client.request(req))
            .await
            .map_err(|_| TunnelError::Download(format!("downloading {url} timed out")))?
            .map_err(|e| TunnelError::Download(format!("cannot download {url}: {e}")))?;
        let status = resp.status();
        if status.is_redirection() {
            let location = resp
                .headers()
                .get(http::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .ok_or_else(|| TunnelError::Download(format!("{url} redirected nowhere")))?;
            url = if location.starts_with('/') {
                format!(
                    "{}://{}{location}",
                    uri.scheme_str().unwrap_or("https"),
                    uri.authority().map(|a| a.as_str()).unwrap_or_default()
                )
            } else {
                location.to_string()
            };
            continue;
        }
        if !status.is_success() {
            return Err(TunnelError::Download(format!(
                "downloading frpc from {url} answered {status}; install frpc and set FRPC_PATH"
            )));
        }
        let body = tokio::time::timeout(
            Duration::from_secs(300),
            Limited::new(resp.into_body(), MAX_DOWNLOAD).collect(),
        )
        .await
        .map_err(|_| TunnelError::Download(format!("downloading {url} timed out")))?
        .map_err(|e| TunnelError::Download(format!("downloading {url} failed: {e}")))?;
        return Ok(body.to_bytes());
    }
    Err(TunnelError::Download(format!(
        "too many redirects from {url}"
    )))
}

/// Extracts the `frpc` member of a `.tar.gz` into `bin_dir/frpc` (atomically) and writes
/// the version marker (atomically).
fn install_tarball(tarball: &[u8], bin_dir: &Path, version: &str) -> Result<(), TunnelError> {
    let err = |what: &str, e: std::io::Error| TunnelError::Download(format!("{what}: {e}"));
    std::fs::create_dir_all(bin_dir).map_err(|e| err("cannot create the frpc directory", e))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(tarball));
    let entries = archive
        .entries()
        .map_err(|e| err("the frpc tarball is unreadable", e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| err("the frpc tarball is unreadable", e))?;
        let is_frpc = entry
            .path()
            .ok()
            .and_then(|p| p.file_name().map(|n| n == "frpc"))
            .unwrap_or(false);
        if !is_frpc || !entry.header().entry_type().is_file() {
            continue;
        }
        let mut data = Vec::new();
        entry
            .read_to_end(&mut data)
            .map_err(|e| err("the frpc tarball is unreadable", e))?;
        let tmp = bin_dir.join(format!(".frpc.tmp-{}", std::process::id()));
        std::fs::write(&tmp, &data).map_err(|e| err("cannot write frpc", e))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| err("cannot make frpc executable", e))?;
        }
        std::fs::rename(&tmp, bin_dir.join("frpc")).map_err(|e| err("cannot install frpc", e))?;
        let tmp_marker = bin_dir.join(format!(".frpc_version.tmp-{}", std::process::id()));
        std::fs::write(&tmp_marker, version).map_err(|e| err("cannot write the marker", e))?;
        std::fs::rename(&tmp_marker, bin_dir.join(".frpc_version"))
            .map_err(|e| err("cannot write the marker", e))?;
        return Ok(());
    }
    Err(TunnelError::Download(
        "the frpc tarball has no `frpc` member".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unpinned_platform_is_never_downloaded_and_the_message_names_the_pin() {
        let dir = tempfile::tempdir().expect("dir");
        let mut install = FrpcInstall {
            // Never reached: the checksum is missing, so nothing is fetched.
            release_url: "http://127.0.0.1:9/{version}/{platform}".into(),
            ..FrpcInstall::default()
        };
        let e = download(&install, "linux_amd64", dir.path())
            .await
            .expect_err("no checksum");
        assert!(
            e.to_string()
                .contains("in the tunnel config (frpc.sha256.linux_amd64)"),
            "{e}"
        );
        install.pin_hint = Some("with frpc_sha256 (--frpc-sha256)".into());
        let e = download(&install, "linux_amd64", dir.path())
            .await
            .expect_err("no checksum");
        assert!(
            e.to_string().contains("pin the checksum with frpc_sha256"),
            "{e}"
        );
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
    }
}
