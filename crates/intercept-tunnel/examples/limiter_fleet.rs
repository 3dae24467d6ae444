//! One process of a simulated fleet: `hosts` independent rate limiters (each its own Redis
//! connection, as separate hosts would have) take `starts` tunnel starts each from one
//! Redis-backed window. Each start "reaches the provider" (a TCP connection to
//! `receiver`, which notes the arrival on its own clock and answers one byte) a random
//! latency after its reservation, and completes a random latency after the answer.
//! Used by `tests/redis_limiter.rs` to check what the provider sees.
//!
//! Usage: `limiter_fleet <redis url> <key> <shared|per-host> <rate> <window ms>
//! <margin ms> <hosts> <starts> <receiver addr>`; with `per-host`, every host gets a key
//! of its own (what host-local limiters amount to), for the control run.

use std::time::Duration;

use intercept_tunnel::{LimiterBackend, RateLimit, RateLimiter};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, key, sharing, rate, window_ms, margin_ms, hosts, starts, receiver] =
        args.as_slice()
    else {
        return Err(
            "usage: limiter_fleet <redis url> <key> <shared|per-host> <rate> \
                    <window ms> <margin ms> <hosts> <starts> <receiver addr>"
                .into(),
        );
    };
    let hosts: usize = hosts.parse()?;
    let starts: usize = starts.parse()?;
    let receiver: std::net::SocketAddr = receiver.parse()?;
    let mut tasks = Vec::new();
    for host in 0..hosts {
        let key = match sharing.as_str() {
            "shared" => key.clone(),
            _ => format!("{key}:{}:{host}", std::process::id()),
        };
        let limiter = RateLimiter::new(
            &RateLimit {
                enabled: true,
                rate: rate.parse()?,
                window: Duration::from_millis(window_ms.parse()?),
                max_wait: Duration::from_secs(60),
                margin: Duration::from_millis(margin_ms.parse()?),
                backend: LimiterBackend::Redis,
                url: Some(url.clone()),
                key: Some(key),
                ..RateLimit::default()
            },
            "unused",
        )?;
        tasks.push(tokio::spawn(async move {
            for _ in 0..starts {
                let permit = limiter.acquire().await.map_err(|e| e.to_string())?;
                tokio::time::sleep(Duration::from_millis(fastrand::u64(0..60))).await;
                let mut provider = tokio::net::TcpStream::connect(receiver)
                    .await
                    .map_err(|e| e.to_string())?;
                provider.write_all(b"s").await.map_err(|e| e.to_string())?;
                let mut ack = [0u8; 1];
                provider
                    .read_exact(&mut ack)
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::time::sleep(Duration::from_millis(fastrand::u64(0..60))).await;
                permit.complete().await;
            }
            Ok::<(), String>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}
