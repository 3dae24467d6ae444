//! The prime backend against the mock Prime API (`intercept_test::prime`) and the fake
//! frpc binary: a full request goes client → "public" URL (mock frps) → fake frpc →
//! local server.
//!
//! The fake frpc binary comes from `$INTERCEPT_FAKE_FRPC`, else from this test's target
//! directory (`cargo test --workspace` builds it); when it is missing or older than its
//! source, it is built with `cargo build -p intercept-test --bin fake-frpc`
//! ([`intercept_test::prime::fake_frpc`]).

// Helpers outside `#[test]` functions unwrap too: this is test code.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use intercept_core::{Endpoint, ErrorKind, Tunnel};
use intercept_test::prime::{fake_frpc, FrpcMode, MockPrime};
use intercept_test::process::{self, exits_soon, kill9};
use intercept_tunnel::prime::{install, FrpcInstall, PrimeEnv};
use intercept_tunnel::{PrimeConfig, PrimeEndpoint, PrimeTunnel, RateLimit, TunnelErrorKind};

const KEY: &str = "test-api-key";

struct Fixture {
    mock: MockPrime,
    home: tempfile::TempDir,
    app: common::HelloServer,
}

impl Fixture {
    async fn new() -> Fixture {
        Fixture {
            mock: MockPrime::start(KEY).await.unwrap(),
            home: tempfile::tempdir().unwrap(),
            app: common::hello_server("hello").await,
        }
    }

    fn env(&self) -> PrimeEnv {
        PrimeEnv::with_home(self.home.path())
            .var("PRIME_API_KEY", KEY)
            .var("PRIME_API_BASE_URL", &self.mock.base_url())
    }

    fn config(&self) -> PrimeConfig {
        PrimeConfig {
            frpc_path: Some(fake_frpc()),
            connection_timeout: Duration::from_secs(20),
            initial_backoff: Duration::from_millis(5),
            api_timeout: Duration::from_secs(10),
            rate_limit: RateLimit {
                path: Some(self.home.path().join("limiter.window")),
                ..RateLimit::default()
            },
            ..PrimeConfig::default()
        }
    }

    fn tunnel(&self, config: PrimeConfig) -> PrimeTunnel {
        PrimeTunnel::with_env(config, self.env()).unwrap()
    }

    fn tunnels_dir(&self) -> PathBuf {
        self.home.path().join(".prime/tunnels")
    }

    fn config_files(&self) -> usize {
        std::fs::read_dir(self.tunnels_dir())
            .map(|d| d.count())
            .unwrap_or(0)
    }

    fn starts(&self) -> usize {
        std::fs::read_to_string(self.home.path().join("limiter.window"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }
}

#[tokio::test]
async fn success_end_to_end_then_teardown_cleans_everything() {
    let f = Fixture::new().await;
    let tunnel = f.tunnel(f.config());
    assert_eq!(tunnel.kind(), "prime");
    let endpoint = tunnel.open(f.app.port).await.unwrap();
    let url = endpoint.url();
    let live = f.mock.live_tunnels();
    assert_eq!(live.len(), 1);
    assert_eq!(url, live[0].url);
    assert_eq!(live[0].local_port, f.app.port);
    assert_eq!(live[0].status, "connected");
    assert_eq!(f.starts(), 1, "one start went through the rate limiter");

    // A full request: client -> public URL (mock frps) -> fake frpc -> local server.
    assert_eq!(
        common::get(&format!("{url}/v1/chat/completions"))
            .await
            .unwrap(),
        (200, "hello /v1/chat/completions".into())
    );

    // The config file: private, escaped, parsed back by frpc.
    let path = endpoint.config_path().await.unwrap();
    assert!(path.starts_with(f.tunnels_dir()));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&f.tunnels_dir()), 0o700);
    }
    let doc: toml::Table = toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(doc["auth"]["token"].as_str(), Some("tok\"1\\x"));
    assert_eq!(doc["metadatas"]["binding_secret"].as_str(), Some("bs-1\n"));

    assert!(endpoint.health().await.is_healthy());
    let status = endpoint.status().await.unwrap();
    assert_eq!(status.registration.as_deref(), Some("connected"));
    assert!(status.frpc_running && !status.gone);
    let pid = endpoint.frpc_pid().await.unwrap();
    assert!(process::alive(pid));
    let auth_ok = f
        .mock
        .seen()
        .iter()
        .all(|r| r.path.starts_with("/api/v1/tunnel"));
    assert!(auth_ok);

    endpoint.teardown().await.unwrap();
    assert!(f.mock.live_tunnels().is_empty(), "registration deleted");
    assert!(!path.exists(), "config removed");
    assert!(!process::alive(pid), "frpc gone");
    assert!(!endpoint.health().await.is_healthy());
    assert!(common::get(&format!("{url}/x")).await.is_err());
    f.mock.shutdown().await;
}

#[tokio::test]
async fn each_frpc_failure_class_is_typed_and_cleaned_up() {
    let f = Fixture::new().await;
    let cases = [
        (FrpcMode::Gone, TunnelErrorKind::Gone, "tunnel is inactive"),
        (
            FrpcMode::Rejected,
            TunnelErrorKind::Rejected,
            "invalid authentication token",
        ),
        (
            FrpcMode::ProxyRefused,
            TunnelErrorKind::ProxyRefused,
            "already exists",
        ),
        (FrpcMode::Exit, TunnelErrorKind::Connection, "scripted exit"),
    ];
    let tunnel = f.tunnel(PrimeConfig {
        retries: 0,
        ..f.config()
    });
    for (mode, kind, text) in cases {
        f.mock.push_frpc_mode(mode);
        let err = tunnel.open(f.app.port).await.unwrap_err();
        assert_eq!(err.kind(), kind, "{mode:?}: {err}");
        assert!(err.to_string().contains(text), "{mode:?}: {err}");
        assert!(
            f.mock.live_tunnels().is_empty(),
            "{mode:?}: registration deleted"
        );
        assert_eq!(f.config_files(), 0, "{mode:?}: config removed");
        let pid = f.mock.tunnels().values().last().unwrap().frpc_pid.unwrap();
        assert!(!process::alive(pid), "{mode:?}: frpc killed");
    }
    f.mock.shutdown().await;
}

#[tokio::test]
async fn connection_timeout_is_typed_and_cleaned_up() {
    let f = Fixture::new().await;
    f.mock.push_frpc_mode(FrpcMode::Hang);
    let tunnel = f.tunnel(PrimeConfig {
        retries: 0,
        connection_timeout: Duration::from_millis(700),
        ..f.config()
    });
    let err = tunnel.open(f.app.port).await.unwrap_err();
    assert_eq!(err.kind(), TunnelErrorKind::Timeout, "{err}");
    assert!(err.to_string().contains("timed out after"), "{err}");
    assert!(err.retryable());
    assert!(f.mock.live_tunnels().is_empty());
    assert_eq!(f.config_files(), 0);
    f.mock.shutdown().await;
}

#[tokio::test]
async fn retryable_failures_are_retried_and_the_rest_are_not() {
    let f = Fixture::new().await;
    let tunnel = f.tunnel(f.config());
    // A 503 from the API, then a refused proxy, then success: three attempts.
    f.mock.fail_next_create(503, "try later");
    f.mock.push_frpc_mode(FrpcMode::ProxyRefused);
    let endpoint = tunnel.open(f.app.port).await.unwrap();
    assert_eq!(f.mock.count("POST", "/api/v1/tunnel"), 3);
    assert_eq!(
        f.mock.live_tunnels().len(),
        1,
        "the refused one was deleted"
    );
    assert_eq!(f.starts(), 3, "every attempt went through the limiter");
    assert_eq!(
        common::get(&format!("{}/ok", endpoint.url()))
            .await
            .unwrap()
            .1,
        "hello /ok"
    );
    endpoint.teardown().await.unwrap();

    // Auth failures are not retried.
    f.mock.fail_next_create(401, "Unauthorized");
    let before = f.mock.count("POST", "/api/v1/tunnel");
    let err = tunnel.open(f.app.port).await.unwrap_err();
    assert_eq!(err.kind(), TunnelErrorKind::Auth);
    assert_eq!(f.mock.count("POST", "/api/v1/tunnel"), before + 1);

    // Retries run out: the last error is returned.
    for _ in 0..4 {
        f.mock.fail_next_create(500, "boom");
    }
    let err = tunnel.open(f.app.port).await.unwrap_err();
    assert_eq!(err.kind(), TunnelErrorKind::Api);
    assert!(err.to_string().contains("boom"), "{err}");
    f.mock.shutdown().await;
}

#[tokio::test]
async fn api_status_mapping_through_the_trait() {
    let f = Fixture::new().await;
    let tunnel: Arc<dyn Tunnel> = Arc::new(f.tunnel(PrimeConfig {
        retries: 0,
        ..f.config()
    }));
    let cases = [
        (401, "nope", "PRIME_API_KEY", false),
        (402, "pay", "billing", false),
        (
            400,
            "maximum number of tunnels reached",
            "delete unused tunnels",
            false,
        ),
        (400, "bad local port", "bad local port", false),
        (500, "internal", "internal", true),
        (429, "slow down", "slow down", true),
        (404, "no such route", "unexpected empty response", false),
    ];
    for (status, detail, text, retryable) in cases {
        f.mock.fail_next_create(status, detail);
        let err = tunnel.expose(f.app.port).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Tunnel);
        assert_eq!(err.status(), 502);
        assert_eq!(err.retryable(), retryable, "{status}: {err}");
        assert!(err.to_string().contains(text), "{status}: {err}");
    }
    // A wrong key is refused by the API itself.
    let env = f.env().var("PRIME_API_KEY", "wrong");
    let bad = PrimeTunnel::with_env(
        PrimeConfig {
            retries: 0,
            ..f.config()
        },
        env,
    )
    .unwrap();
    let err = bad.open(f.app.port).await.unwrap_err();
    assert_eq!(err.kind(), TunnelErrorKind::Auth);
    // An unreachable API is a retryable connection error.
    let env = f.env().var("PRIME_API_BASE_URL", "http://127.0.0.1:1");
    let down = PrimeTunnel::with_env(
        PrimeConfig {
            retries: 0,
            ..f.config()
        },
        env,
    )
    .unwrap();
    let err = down.open(f.app.port).await.unwrap_err();
    assert_eq!(err.kind(), TunnelErrorKind::Connection, "{err}");
    assert!(err.retryable());
    f.mock.shutdown().await;
}

#[tokio::test]
async fn restart_keeps_the_registration_and_url() {
    let f = Fixture::new().await;
    let endpoint = f.tunnel(f.config()).open(f.app.port).await.unwrap();
    let url = endpoint.url();
    let id = endpoint.tunnel_id().await.unwrap();
    let pid = endpoint.frpc_pid().await.unwrap();
    endpoint.restart().await.unwrap();
    assert_eq!(endpoint.url(), url);
    assert_eq!(endpoint.tunnel_id().await.unwrap(), id);
    assert_ne!(endpoint.frpc_pid().await.unwrap(), pid);
    assert!(!process::alive(pid), "the old frpc was stopped");
    assert_eq!(f.mock.tunnels()[&id].logins, 2);
    assert_eq!(f.mock.count("POST", "/api/v1/tunnel"), 1);
    assert_eq!(
        common::get(&format!("{url}/r")).await.unwrap().1,
        "hello /r"
    );
    endpoint.teardown().await.unwrap();
    f.mock.shutdown().await;
}

#[tokio::test]
async fn a_killed_frpc_is_restarted_by_refresh() {
    let f = Fixture::new().await;
    let endpoint = f.tunnel(f.config()).open(f.app.port).await.unwrap();
    let url = endpoint.url();
    let pid = endpoint.frpc_pid().await.unwrap();
    kill9(pid);
    let exit = tokio::time::timeout(Duration::from_secs(10), endpoint.frpc_exited())
        .await
        .unwrap();
    assert!(!exit.contains("code 0"), "{exit}");
    let health = endpoint.health().await;
    assert!(!health.is_healthy(), "{health:?}");
    assert!(!endpoint.status().await.unwrap().frpc_running);

    assert_eq!(
        endpoint.refresh().await.unwrap(),
        url,
        "same registration, same URL"
    );
    assert!(endpoint.health().await.is_healthy());
    assert_eq!(
        f.mock.count("POST", "/api/v1/tunnel"),
        1,
        "no new registration"
    );
    assert_eq!(
        common::get(&format!("{url}/healed")).await.unwrap().1,
        "hello /healed"
    );
    endpoint.teardown().await.unwrap();
    f.mock.shutdown().await;
}

#[tokio::test]
async fn an_expired_registration_is_replaced_by_refresh() {
    let f = Fixture::new().await;
    let endpoint = f
        .tunnel(PrimeConfig {
            health_ttl: Duration::ZERO,
            ..f.config()
        })
        .open(f.app.port)
        .await
        .unwrap();
    let old_url = endpoint.url();
    let old_id = endpoint.tunnel_id().await.unwrap();
    f.mock.set_status(&old_id, "expired");
    let health = endpoint.health().await;
    assert_eq!(
        health,
        intercept_core::Health::Unhealthy(format!("tunnel {old_id} is expired"))
    );
    let status = endpoint.status().await.unwrap();
    assert!(status.gone);

    let new_url = endpoint.refresh().await.unwrap();
    assert_ne!(new_url, old_url);
    assert_eq!(endpoint.url(), new_url);
    assert_ne!(endpoint.tunnel_id().await.unwrap(), old_id);
    assert!(
        f.mock.tunnels()[&old_id].deleted,
        "the old registration was deleted"
    );
    assert_eq!(f.mock.live_tunnels().len(), 1);
    assert_eq!(f.starts(), 2, "the re-mint went through the rate limiter");
    assert_eq!(
        common::get(&format!("{new_url}/new")).await.unwrap().1,
        "hello /new"
    );
    endpoint.teardown().await.unwrap();
    f.mock.shutdown().await;
}

#[tokio::test]
async fn health_asks_the_api_at_most_once_per_ttl_and_survives_a_flaky_api() {
    let f = Fixture::new().await;
    let endpoint = f.tunnel(f.config()).open(f.app.port).await.unwrap();
    let gets = || f.mock.count("GET", "/api/v1/tunnel/");
    for _ in 0..5 {
        assert!(endpoint.health().await.is_healthy());
    }
    assert_eq!(gets(), 1, "cached for the 60 s TTL");

    let flaky = f
        .tunnel(PrimeConfig {
            health_ttl: Duration::ZERO,
            ..f.config()
        })
        .open(f.app.port)
        .await
        .unwrap();
    f.mock.set_get_status(Some(503));
    assert!(
        flaky.health().await.is_healthy(),
        "an API outage is not a dead tunnel"
    );
    assert_eq!(flaky.refresh().await.unwrap(), flaky.url());
    f.mock.set_get_status(None);
    endpoint.teardown().await.unwrap();
    flaky.teardown().await.unwrap();
    f.mock.shutdown().await;
}

#[tokio::test]
async fn dropping_or_panicking_cleans_up() {
    let f = Fixture::new().await;
    let tunnel = f.tunnel(f.config());

    let endpoint = tunnel.open(f.app.port).await.unwrap();
    let pid = endpoint.frpc_pid().await.unwrap();
    let path = endpoint.config_path().await.unwrap();
    drop(endpoint);
    assert!(!path.exists());
    assert!(
        f.mock
            .wait_until(Duration::from_secs(10), |m| m.live_tunnels().is_empty())
            .await,
        "dropping the endpoint deletes the registration"
    );
    assert!(exits_soon(pid).await, "frpc killed on drop");

    let (tx, rx) = tokio::sync::oneshot::channel();
    let t = tunnel.clone();
    let port = f.app.port;
    let task = tokio::spawn(async move {
        let endpoint = t.open(port).await.unwrap();
        tx.send(endpoint.frpc_pid().await.unwrap()).unwrap();
        panic!("a rollout handler panicked while holding the endpoint");
    });
    let pid = rx.await.unwrap();
    assert!(task.await.unwrap_err().is_panic());
    assert!(
        f.mock
            .wait_until(Duration::from_secs(10), |m| m.live_tunnels().is_empty())
            .await,
        "a panic deletes the registration"
    );
    assert_eq!(f.config_files(), 0);
    assert!(exits_soon(pid).await, "frpc killed after the panic");
    f.mock.shutdown().await;
}

fn tarball(member: &str, bytes: &[u8]) -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    let mut readme = tar::Header::new_gnu();
    readme.set_size(5);
    readme.set_mode(0o644);
    readme.set_cksum();
    builder
        .append_data(&mut readme, "frp_0.66.0_x/README", &b"hello"[..])
        .unwrap();
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o755);
    header.set_cksum();
    builder.append_data(&mut header, member, bytes).unwrap();
    builder.into_inner().unwrap().finish().unwrap()
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn frpc_is_downloaded_verified_installed_and_run() {
    let f = Fixture::new().await;
    let platform = install::platform().expect("tests run on a platform frp supports");
    let binary = std::fs::read(fake_frpc()).unwrap();
    let tgz = tarball(&format!("frp_0.66.0_{platform}/frpc"), &binary);
    f.mock
        .add_file(&format!("frp_0.66.0_{platform}.tar.gz"), tgz.clone());
    let install = |sha: &str| FrpcInstall {
        release_url: format!(
            "{}/_redirect/frp_{{version}}_{{platform}}.tar.gz",
            f.mock.base_url()
        ),
        sha256: [(platform.to_string(), sha.to_string())].into(),
        ..FrpcInstall::default()
    };
    let bin_dir = f.home.path().join(".prime/bin");

    // A checksum mismatch installs nothing and registers nothing.
    let bad = f.tunnel(PrimeConfig {
        frpc_path: None,
        frpc: install(&"0".repeat(64)),
        ..f.config()
    });
    let err = bad.open(f.app.port).await.unwrap_err();
    assert_eq!(err.kind(), TunnelErrorKind::Download, "{err}");
    assert!(err.to_string().contains("checksum"), "{err}");
    assert!(!err.retryable());
    assert!(!bin_dir.join("frpc").exists());
    assert_eq!(f.mock.count("POST", "/api/v1/tunnel"), 0);

    // No pinned checksum: refuses to download, says what to do.
    let unpinned = f.tunnel(PrimeConfig {
        frpc_path: None,
        frpc: FrpcInstall {
            sha256: Default::default(),
            ..install("")
        },
        ..f.config()
    });
    let err = unpinned.open(f.app.port).await.unwrap_err();
    assert!(err.to_string().contains("FRPC_PATH"), "{err}");

    // The right checksum: downloaded (through a redirect), installed, run.
    let good = f.tunnel(PrimeConfig {
        frpc_path: None,
        frpc: install(&sha256_hex(&tgz)),
        ..f.config()
    });
    let endpoint = good.open(f.app.port).await.unwrap();
    assert_eq!(std::fs::read(bin_dir.join("frpc")).unwrap(), binary);
    assert_eq!(
        std::fs::read_to_string(bin_dir.join(".frpc_version")).unwrap(),
        "0.66.0"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(bin_dir.join("frpc"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o755, 0o755);
    }
    assert_eq!(
        common::get(&format!("{}/dl", endpoint.url()))
            .await
            .unwrap()
            .1,
        "hello /dl"
    );
    endpoint.teardown().await.unwrap();

    // Installed with the right marker: not downloaded again (the served file is now junk).
    f.mock
        .add_file(&format!("frp_0.66.0_{platform}.tar.gz"), b"junk".to_vec());
    let again = good.open(f.app.port).await.unwrap();
    again.teardown().await.unwrap();

    // FRPC_PATH wins over the installed copy; a missing one is a config error.
    let env = f.env().var("FRPC_PATH", "/nonexistent/frpc");
    let err = PrimeTunnel::with_env(
        PrimeConfig {
            frpc_path: None,
            ..f.config()
        },
        env,
    )
    .unwrap()
    .open(f.app.port)
    .await
    .unwrap_err();
    assert_eq!(err.kind(), TunnelErrorKind::Config);
    assert!(err.to_string().contains("/nonexistent/frpc"), "{err}");
    f.mock.shutdown().await;
}

#[tokio::test]
async fn a_gone_report_from_a_running_frpc_is_classified_and_healed() {
    let f = Fixture::new().await;
    let endpoint = f.tunnel(f.config()).open(f.app.port).await.unwrap();
    let old_url = endpoint.url();
    let old_id = endpoint.tunnel_id().await.unwrap();
    // The service drops the connected tunnel; frpc keeps running but says so.
    f.mock.kick(&old_id);
    tokio::time::timeout(Duration::from_secs(10), endpoint.gone_or_exited())
        .await
        .expect("frpc's output is read continuously");
    let health = endpoint.health().await;
    assert!(
        matches!(&health, intercept_core::Health::Unhealthy(why) if why.contains("gone")),
        "{health:?}"
    );
    assert!(endpoint.status().await.unwrap().gone);
    let err = endpoint.restart().await.unwrap_err();
    assert_eq!(
        err.kind(),
        TunnelErrorKind::Gone,
        "a restart cannot revive it"
    );

    let new_url = endpoint.refresh().await.unwrap();
    assert_ne!(new_url, old_url);
    assert!(f.mock.tunnels()[&old_id].deleted);
    assert!(endpoint.health().await.is_healthy());
    assert_eq!(
        common::get(&format!("{new_url}/back")).await.unwrap().1,
        "hello /back"
    );
    endpoint.teardown().await.unwrap();
    f.mock.shutdown().await;
}

#[tokio::test]
async fn teardown_with_the_api_down_kills_frpc_and_reports_the_failure() {
    let f = Fixture::new().await;
    let tunnel = f.tunnel(f.config());
    let endpoints = futures_join3(&tunnel, f.app.port).await;
    let pids: Vec<u32> = {
        let mut v = Vec::new();
        for e in &endpoints {
            v.push(e.frpc_pid().await.unwrap());
        }
        v
    };
    // The API goes away (connections refused) before the sidecar shuts down.
    let Fixture { mock, home, app } = f;
    mock.shutdown().await;
    let results = tokio::join!(
        endpoints[0].teardown(),
        endpoints[1].teardown(),
        endpoints[2].teardown()
    );
    for result in [results.0, results.1, results.2] {
        let err = result.expect_err("a delete that failed must be reported, not logged away");
        assert_eq!(err.kind(), intercept_core::ErrorKind::Tunnel, "{err}");
    }
    for pid in pids {
        assert!(exits_soon(pid).await, "frpc {pid} must be killed first");
    }
    let left = std::fs::read_dir(home.path().join(".prime/tunnels")).map_or(0, |d| d.count());
    assert_eq!(left, 0, "config files removed");
    drop(app);
}

async fn futures_join3(tunnel: &PrimeTunnel, port: u16) -> Vec<PrimeEndpoint> {
    let (a, b, c) = tokio::join!(tunnel.open(port), tunnel.open(port), tunnel.open(port));
    vec![a.unwrap(), b.unwrap(), c.unwrap()]
}

/// The `frpc_parent` example: opens a tunnel, writes its frpc's pid, waits to be killed.
fn frpc_parent() -> PathBuf {
    intercept_test::helper_binary(
        "examples",
        "frpc_parent",
        &["-p", "intercept-tunnel", "--example", "frpc_parent"],
        &[
            "crates/intercept-tunnel/examples/frpc_parent.rs",
            "crates/intercept-tunnel/src/prime/frpc.rs",
        ],
    )
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_sigkilled_process_leaves_no_frpc_behind() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("frpc.pid");
    let mut child = std::process::Command::new(frpc_parent())
        .arg(fake_frpc())
        .arg(dir.path())
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let frpc = loop {
        if let Ok(text) = std::fs::read_to_string(&out) {
            break text.trim().parse::<u32>().unwrap();
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the child process ended ({status}) before starting frpc");
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the child never started frpc"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(process::alive(frpc), "frpc runs while its parent does");
    // No teardown, no drop: the parent is gone at once.
    child.kill().unwrap();
    child.wait().unwrap();
    let gone = exits_soon(frpc).await;
    if !gone {
        kill9(frpc);
    }
    assert!(gone, "frpc {frpc} outlived its SIGKILLed parent");
}

#[tokio::test]
async fn a_tunnel_reaped_at_the_edge_is_seen_by_health_and_re_minted_by_refresh() {
    let f = Fixture::new().await;
    let endpoint = f
        .tunnel(PrimeConfig {
            health_ttl: Duration::ZERO,
            ..f.config()
        })
        .open(f.app.port)
        .await
        .unwrap();
    let old_url = endpoint.url();
    let old_id = endpoint.tunnel_id().await.unwrap();
    // A live tunnel's URL reaches the app: the probe of its `GET /` sees the app.
    assert!(endpoint.health().await.is_healthy());
    assert!(
        tokio::time::timeout(Duration::from_millis(200), endpoint.dead())
            .await
            .is_err(),
        "a live tunnel is not dead"
    );

    // The service reaps it: the API still lists it connected and frpc runs, but the
    // edge answers 404.
    f.mock.reap(&old_id);
    assert_eq!(f.mock.tunnels()[&old_id].status, "connected");
    let (status, body) = common::get(&format!("{old_url}/v1/models")).await.unwrap();
    assert_eq!(
        (status, body.as_str()),
        (404, intercept_tunnel::prime::REAPED)
    );
    let health = endpoint.health().await;
    let intercept_core::Health::Unhealthy(why) = &health else {
        panic!("a reaped tunnel is healthy: {health:?}")
    };
    assert!(why.contains("reaped") && why.contains(&old_id), "{why}");
    tokio::time::timeout(Duration::from_secs(5), endpoint.dead())
        .await
        .expect("a reaped tunnel is dead");

    // refresh cannot restart frpc into it: it mints a new tunnel.
    let new_url = endpoint.refresh().await.unwrap();
    assert_ne!(new_url, old_url);
    assert!(f.mock.tunnels()[&old_id].deleted);
    assert_eq!(f.starts(), 2, "the re-mint went through the rate limiter");
    assert!(endpoint.health().await.is_healthy());
    assert_eq!(
        common::get(&format!("{new_url}/x")).await.unwrap().1,
        "hello /x"
    );
    endpoint.teardown().await.unwrap();
    f.mock.shutdown().await;
}

#[tokio::test]
async fn a_harness_report_of_a_reaped_tunnel_marks_only_that_url_dead() {
    let f = Fixture::new().await;
    // The API is asked once per minute: a report must not wait for it.
    let endpoint = f.tunnel(f.config()).open(f.app.port).await.unwrap();
    let url = endpoint.url();
    assert!(endpoint.health().await.is_healthy());
    let stderr = "httpx.HTTPStatusError: Client error '404 Not Found' for url \
                  'https://x.tunnel.invalid/v1/chat/completions'\nTUNNEL NOT FOUND OR NO LONGER ACTIVE";
    // Text of another failure is not recognised; a report for a URL the endpoint has
    // already left is recognised but changes nothing.
    assert!(!endpoint.report_failure(&url, "connection reset by peer"));
    assert!(endpoint.report_failure("http://127.0.0.1:1", stderr));
    assert!(endpoint.health().await.is_healthy());
    assert!(
        tokio::time::timeout(Duration::from_millis(200), endpoint.dead())
            .await
            .is_err()
    );

    assert!(endpoint.report_failure(&format!("{url}/"), stderr));
    tokio::time::timeout(Duration::from_secs(5), endpoint.dead())
        .await
        .expect("a reported tunnel is dead at once");
    let health = endpoint.health().await;
    assert!(
        matches!(&health, intercept_core::Health::Unhealthy(w) if w.contains("harness reports")),
        "{health:?}"
    );
    assert_eq!(
        f.mock.count("GET", "/api/v1/tunnel/"),
        1,
        "no second API call"
    );
    let new_url = endpoint.refresh().await.unwrap();
    assert_ne!(new_url, url);
    assert!(endpoint.health().await.is_healthy());
    endpoint.teardown().await.unwrap();
    f.mock.shutdown().await;
}
