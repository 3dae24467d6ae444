//! A process that opens one Prime tunnel (against an in-process mock Prime API and the
//! fake frpc), writes its frpc's pid to a file, and waits to be killed. Used by
//! `tests/prime.rs` to check that a process killed with SIGKILL leaves no frpc behind.
//!
//! Usage: `frpc_parent <fake frpc> <home dir> <pid file>`

use std::path::PathBuf;
use std::time::Duration;

use intercept_test::prime::MockPrime;
use intercept_tunnel::prime::PrimeEnv;
use intercept_tunnel::{PrimeConfig, PrimeTunnel, RateLimit};

const KEY: &str = "frpc-parent-key";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, frpc, home, out] = args.as_slice() else {
        return Err("usage: frpc_parent <fake frpc> <home dir> <pid file>".into());
    };
    let home = PathBuf::from(home);
    let out = PathBuf::from(out);
    let mock = MockPrime::start(KEY).await?;
    // The port the tunnel forwards to; nothing is sent through it.
    let local = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let config = PrimeConfig {
        frpc_path: Some(PathBuf::from(frpc)),
        connection_timeout: Duration::from_secs(20),
        initial_backoff: Duration::from_millis(5),
        api_timeout: Duration::from_secs(10),
        rate_limit: RateLimit {
            path: Some(home.join("limiter.window")),
            ..RateLimit::default()
        },
        ..PrimeConfig::default()
    };
    let env = PrimeEnv::with_home(&home)
        .var("PRIME_API_KEY", KEY)
        .var("PRIME_API_BASE_URL", &mock.base_url());
    let tunnel = PrimeTunnel::with_env(config, env)?;
    let endpoint = tunnel.open(local.local_addr()?.port()).await?;
    let pid = endpoint.frpc_pid().await.ok_or("frpc has no pid")?;
    std::fs::write(out.with_extension("tmp"), pid.to_string())?;
    std::fs::rename(out.with_extension("tmp"), &out)?;
    // Killed long before this ends; the bound keeps a lost parent from lingering.
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok(())
}
