//! What Linux says about a process: CPU time from `/proc/<pid>/stat` (and per thread
//! from `/proc/<pid>/task/*/stat`), memory from `/proc/<pid>/status`. Every function
//! returns `None` (or nothing) where `/proc` is unavailable.

use std::time::Duration;

/// Clock ticks per second of `/proc/<pid>/stat` times (`USER_HZ`, 100 on every Linux
/// architecture intercept runs on).
pub const CLOCK_TICKS_PER_SECOND: u64 = 100;

/// User + system CPU time consumed so far by process `pid` (all its threads).
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (utime, stime) = parse_stat_times(&stat)?;
    Some(Duration::from_millis(
        (utime + stime) * 1000 / CLOCK_TICKS_PER_SECOND,
    ))
}

/// `(utime, stime)` in clock ticks from the text of `/proc/<pid>/stat`.
pub fn parse_stat_times(stat: &str) -> Option<(u64, u64)> {
    // The command name (field 2) may hold spaces and parentheses: fields after it are
    // counted from the last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime field 15.
    let utime = fields.get(11)?.parse().ok()?;
    let stime = fields.get(12)?.parse().ok()?;
    Some((utime, stime))
}

/// The parent pid (field 4) from the text of `/proc/<pid>/stat`.
pub fn parse_stat_ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The command name (field 2, a thread's name for a task) from the text of
/// `/proc/<pid>/stat`.
pub fn parse_stat_comm(stat: &str) -> Option<&str> {
    Some(&stat[stat.find('(')? + 1..stat.rfind(')')?])
}

/// CPU time of the threads of process `pid` by thread name, threads of one name summed
/// (a runtime's workers share a name): `(name, (utime, stime))` in clock ticks, sorted by
/// name. Empty where `/proc` is unavailable.
pub fn thread_times(pid: u32) -> std::collections::BTreeMap<String, (u64, u64)> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.filter_map(|t| t.ok()) {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        if let (Some(name), Some((user, sys))) = (parse_stat_comm(&stat), parse_stat_times(&stat)) {
            let entry: &mut (u64, u64) = out.entry(name.to_owned()).or_default();
            entry.0 += user;
            entry.1 += sys;
        }
    }
    out
}

/// Time the threads of process `pid` have run on a CPU, in nanoseconds: the first field
/// of each `/proc/<pid>/task/<tid>/schedstat`, summed. Unlike [`cpu_time`] (10 ms clock
/// ticks) it resolves a single call. Threads that already exited are not counted, so
/// read it only around work done by long-lived threads (a server's runtime workers).
/// `None` where the kernel keeps no schedstat.
pub fn run_ns(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0u64;
    let mut any = false;
    for task in tasks.filter_map(|t| t.ok()) {
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        if let Some(ns) = parse_schedstat_ns(&text) {
            total += ns;
            any = true;
        }
    }
    any.then_some(total)
}

/// The on-CPU nanoseconds (first field) of a `schedstat` text.
pub fn parse_schedstat_ns(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// Pids whose parent is `pid` (scans `/proc`).
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|s| parse_stat_ppid(&s))
                == Some(pid)
        })
        .collect()
}

/// A `kB` field of `/proc/<pid>/status` (e.g. `VmRSS`, `VmHWM`), in KiB.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status_kib(&status, field)
}

/// A `kB` field from the text of `/proc/<pid>/status`.
pub fn parse_status_kib(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let value = line.strip_prefix(field)?.strip_prefix(':')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// This process's resident set size, in KiB.
pub fn self_rss_kib() -> Option<u64> {
    status_kib(std::process::id(), "VmRSS")
}

/// This process's peak resident set size (`VmHWM`), in KiB.
pub fn self_hwm_kib() -> Option<u64> {
    status_kib(std::process::id(), "VmHWM")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_times_skip_a_command_with_spaces() {
        let stat = "42 (my (odd) proc) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0";
        assert_eq!(parse_stat_times(stat), Some((250, 75)));
        assert_eq!(parse_stat_ppid(stat), Some(1));
        assert_eq!(parse_stat_comm(stat), Some("my (odd) proc"));
    }

    #[test]
    fn status_fields_in_kib() {
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(1024));
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(2048));
        assert_eq!(parse_status_kib(status, "VmSwap"), None);
    }

    #[test]
    fn schedstat_is_nanoseconds_on_cpu() {
        assert_eq!(parse_schedstat_ns("123456789 42 7\n"), Some(123_456_789));
        assert_eq!(parse_schedstat_ns(""), None);
        if std::path::Path::new("/proc/self/task").exists() {
            let before = run_ns(std::process::id());
            // Some work this thread does on a CPU.
            let mut x = 0u64;
            for i in 0..2_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            std::hint::black_box(x);
            if let (Some(a), Some(b)) = (before, run_ns(std::process::id())) {
                assert!(b > a, "{a} -> {b}");
            }
        }
    }

    #[test]
    fn this_process_is_visible() {
        if std::path::Path::new("/proc/self/stat").exists() {
            assert!(cpu_time(std::process::id()).is_some());
            assert!(self_rss_kib().is_some_and(|k| k > 0));
            let threads = thread_times(std::process::id());
            assert!(!threads.is_empty(), "no thread of this process is listed");
        }
    }
}
