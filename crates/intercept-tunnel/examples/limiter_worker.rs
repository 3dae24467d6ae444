//! A process that takes `count` starts from a shared rate-limiter window file and prints,
//! per start, the reserved time and the time `acquire` returned (ms since the Unix epoch).
//! Used by `tests/limiter.rs` to check that separate processes never exceed the cap.
//!
//! Usage: `limiter_worker <window file> <rate> <window ms> <count>`

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use intercept_tunnel::{RateLimit, RateLimiter};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, path, rate, window_ms, count] = args.as_slice() else {
        return Err("usage: limiter_worker <window file> <rate> <window ms> <count>".into());
    };
    let limiter = RateLimiter::new(
        &RateLimit {
            enabled: true,
            rate: rate.parse()?,
            window: Duration::from_millis(window_ms.parse()?),
            max_wait: Duration::from_secs(60),
            margin: Duration::ZERO,
            path: Some(path.into()),
            ..RateLimit::default()
        },
        "worker",
    )?;
    for _ in 0..count.parse::<u32>()? {
        let permit = limiter.acquire().await?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
        println!("{} {now}", permit.at_ms);
    }
    Ok(())
}
