//! Several processes sharing one rate-limiter window file never exceed the cap together.
//!
//! The worker is the `limiter_worker` example, which `cargo test` builds with the tests.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::process::Command;

fn worker() -> PathBuf {
    intercept_test::helper_binary(
        "examples",
        "limiter_worker",
        &["-p", "intercept-tunnel", "--example", "limiter_worker"],
        &[
            "crates/intercept-tunnel/examples/limiter_worker.rs",
            "crates/intercept-tunnel/src/limiter.rs",
        ],
    )
}

#[test]
fn separate_processes_never_exceed_the_cap_in_any_window() {
    const RATE: usize = 4;
    const WINDOW_MS: u128 = 300;
    const PROCESSES: usize = 4;
    const EACH: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shared.window");
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(worker())
                .arg(&file)
                .arg(RATE.to_string())
                .arg(WINDOW_MS.to_string())
                .arg(EACH.to_string())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut reserved = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        for line in String::from_utf8(out.stdout).unwrap().lines() {
            let (at, returned) = line.split_once(' ').unwrap();
            let (at, returned): (u128, u128) = (at.parse().unwrap(), returned.parse().unwrap());
            assert!(returned >= at, "a start went out before its reserved time");
            reserved.push(at);
        }
    }
    assert_eq!(reserved.len(), PROCESSES * EACH);
    reserved.sort_unstable();
    // In every half-open window (t - W, t] ending at a start, at most RATE starts.
    for (i, &end) in reserved.iter().enumerate() {
        let in_window = reserved[..=i]
            .iter()
            .filter(|&&s| s + WINDOW_MS > end)
            .count();
        assert!(
            in_window <= RATE,
            "{in_window} starts in one window: {reserved:?}"
        );
    }
    // 16 starts at 4 per window span at least 3 windows.
    assert!(reserved[reserved.len() - 1] - reserved[0] >= 3 * WINDOW_MS);
}
