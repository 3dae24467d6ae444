//! The control channel of the long-running bench programs: one JSON line on stdout
//! when ready, then commands on stdin, one per line. `stats` prints one JSON line of
//! counters; `quit` or the end of stdin stops the program, so a program whose parent
//! died stops by itself.

use std::future::Future;

use anyhow::Result;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Prints `value` as one line on stdout (line-buffered, so the parent sees it now).
pub fn announce(value: &serde_json::Value) {
    println!("{value}");
}

/// Serves `stats` commands with `stats()` until `quit` or the end of stdin.
pub async fn serve<F, Fut>(mut stats: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = serde_json::Value>,
{
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        match line.trim() {
            "stats" => announce(&stats().await),
            "quit" => break,
            "" => {}
            other => announce(
                &serde_json::json!({ "error": format!("unknown command `{other}`; use stats or quit") }),
            ),
        }
    }
    Ok(())
}
