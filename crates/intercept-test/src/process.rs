//! Other processes, as tests see them: alive, dead, killed (Unix, through `kill`).

use std::time::Duration;

/// Whether `pid` is a live (or unreaped) process this one may signal (`kill -0`).
pub fn alive(pid: u32) -> bool {
    std::process::Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Whether `pid` is dead: gone, or a zombie awaiting its reaper.
pub fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
        Err(_) => !alive(pid),
    }
}

/// Whether `pid` dies within 10 s. Nothing notifies a test of another process's death (a
/// child dropped with `kill_on_drop`, say, is killed by the runtime shortly after), so
/// this polls.
pub async fn exits_soon(pid: u32) -> bool {
    for _ in 0..500 {
        if dead(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Sends SIGKILL to `pid`.
///
/// # Panics
///
/// When `kill` cannot be run or refuses: this is test setup.
pub fn kill9(pid: u32) {
    let ok = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -9 {pid} failed");
}
