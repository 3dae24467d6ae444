//! What appending trace lines costs on this machine, with no proxy around it: the floor
//! under what recording a call to a file can cost.
//!
//! [`measure`] appends lines of a given size round-robin to a number of files, one
//! `write` per line, the way the sidecar's trace writer appends to its sessions' files
//! (`O_APPEND`, the page-cache hint of [`intercept_trace::release_page_cache`]
//! every [`PAGE_CACHE_HINT_EVERY`] bytes per file), and reads the thread's CPU time
//! around the loop. The benchmark runs it (`bench-write`) pinned to the proxies' core,
//! with the mean trace line of its json c16 case, and sets the result beside nginx's CPU
//! per request: whatever else a recording proxy does, each recorded call costs at least
//! this much more than a proxy that records nothing.
//!
//! ```no_run
//! use intercept_bench::write_cost::{measure, WriteCostConfig};
//!
//! let dir = std::env::temp_dir().join("write-cost");
//! let cost = measure(&WriteCostConfig {
//!     files: 1000,
//!     line_bytes: 3300,
//!     lines: 300_000,
//!     ..WriteCostConfig::new(&dir)
//! })?;
//! println!("{:.2} µs of CPU per line", cost.cpu_us_per_line());
//! # Ok::<(), std::io::Error>(())
//! ```

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub use intercept_trace::PAGE_CACHE_HINT_EVERY;
use serde::{Deserialize, Serialize};

use crate::procfs;

/// What [`measure`] writes.
#[derive(Debug, Clone)]
pub struct WriteCostConfig {
    /// The folder the files are made in (created if missing; it should hold nothing
    /// else, since the files are created anew, `0.jsonl`, `1.jsonl`, …).
    pub dir: PathBuf,
    /// Files written in turn.
    pub files: usize,
    /// Bytes per line, its newline included (at least 1).
    pub line_bytes: usize,
    /// Lines written in all.
    pub lines: u64,
    /// Lines appended to a file by one `write` (at least 1): the same bytes in fewer,
    /// larger writes.
    pub lines_per_write: usize,
    /// Bytes appended to a file between two page-cache hints (0: no hint).
    pub hint_every: u64,
}

impl WriteCostConfig {
    /// Files written in turn by default: the benchmark's sessions.
    pub const FILES: usize = 1000;
    /// Bytes per line by default: about a json c16 call's trace line.
    pub const LINE_BYTES: usize = 3300;
    /// Lines written by default.
    pub const LINES: u64 = 300_000;

    /// [`Self::FILES`] files, [`Self::LINES`] lines of [`Self::LINE_BYTES`] bytes, one
    /// per `write`, the sidecar's page-cache hint, in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        WriteCostConfig {
            dir: dir.into(),
            files: Self::FILES,
            line_bytes: Self::LINE_BYTES,
            lines: Self::LINES,
            lines_per_write: 1,
            hint_every: PAGE_CACHE_HINT_EVERY,
        }
    }
}

/// What the lines cost, per line.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WriteCost {
    /// Lines written.
    pub lines: u64,
    /// Bytes per line.
    pub line_bytes: usize,
    /// Files written in turn.
    pub files: usize,
    /// Lines per `write`.
    pub lines_per_write: usize,
    /// The thread's user time per line, in µs (the loop itself).
    pub user_us_per_line: f64,
    /// The thread's system time per line, in µs (the kernel's append).
    pub system_us_per_line: f64,
    /// Wall time per line, in µs.
    pub wall_us_per_line: f64,
    /// Page-cache hints given.
    pub hints: u64,
}

impl WriteCost {
    /// User and system time per line, in µs.
    pub fn cpu_us_per_line(&self) -> f64 {
        self.user_us_per_line + self.system_us_per_line
    }
}

/// Appends `config.lines` lines of `config.line_bytes` bytes (`x`s and a newline)
/// round-robin to `config.files` new files in `config.dir`, `config.lines_per_write`
/// lines per `write` (the last write fewer if they do not divide), and returns the calling thread's CPU time per line. The files stay; the caller removes
/// them. CPU time comes from `/proc/thread-self/stat` (clock ticks, 10 ms): write for a
/// second or more for a figure within a few per cent. Where `/proc` is missing the CPU
/// figures are NaN.
pub fn measure(config: &WriteCostConfig) -> std::io::Result<WriteCost> {
    if config.files == 0 || config.line_bytes == 0 || config.lines_per_write == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "write cost: at least one file, one byte per line and one line per write",
        ));
    }
    std::fs::create_dir_all(&config.dir)?;
    let mut files = (0..config.files)
        .map(|i| open_new(&config.dir.join(format!("{i}.jsonl"))))
        .collect::<std::io::Result<Vec<File>>>()?;
    let mut unadvised = vec![0u64; config.files];
    let mut line = vec![b'x'; config.line_bytes];
    line[config.line_bytes - 1] = b'\n';
    let batch = line.repeat(config.lines_per_write);
    let mut hints = 0;

    let cpu0 = thread_cpu_ticks();
    let t0 = Instant::now();
    let (mut written, mut turn) = (0u64, 0usize);
    while written < config.lines {
        let n = (config.lines - written).min(config.lines_per_write as u64) as usize;
        let i = turn % config.files;
        files[i].write_all(&batch[..n * config.line_bytes])?;
        written += n as u64;
        turn += 1;
        unadvised[i] += (n * config.line_bytes) as u64;
        if config.hint_every > 0 && unadvised[i] >= config.hint_every {
            intercept_trace::release_page_cache(&files[i]);
            unadvised[i] = 0;
            hints += 1;
        }
    }
    let wall = t0.elapsed();
    let cpu1 = thread_cpu_ticks();

    let per_line_us = |ticks: u64| {
        ticks as f64 * 1e6 / procfs::CLOCK_TICKS_PER_SECOND as f64 / config.lines.max(1) as f64
    };
    let (user, system) = match (cpu0, cpu1) {
        (Some((u0, s0)), Some((u1, s1))) => (per_line_us(u1 - u0), per_line_us(s1 - s0)),
        _ => (f64::NAN, f64::NAN),
    };
    Ok(WriteCost {
        lines: config.lines,
        line_bytes: config.line_bytes,
        files: config.files,
        lines_per_write: config.lines_per_write,
        user_us_per_line: user,
        system_us_per_line: system,
        wall_us_per_line: wall.as_secs_f64() * 1e6 / config.lines.max(1) as f64,
        hints,
    })
}

/// Creates `path` anew for appending, as the sidecar creates a session's trace file.
fn open_new(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    file.set_len(0)?;
    Ok(file)
}

/// The calling thread's `(utime, stime)` in clock ticks.
fn thread_cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    procfs::parse_stat_times(&stat)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("intercept-write-cost-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// `lines` lines of `line_bytes` over `files` files in `dir`, a hint every
    /// `hint_every` bytes, one line per write.
    fn small(
        dir: &Path,
        files: usize,
        line_bytes: usize,
        lines: u64,
        hint_every: u64,
    ) -> WriteCostConfig {
        WriteCostConfig {
            files,
            line_bytes,
            lines,
            hint_every,
            ..WriteCostConfig::new(dir)
        }
    }

    /// The lines of file `i` in `dir`, each checked to be whole: `line_bytes - 1` `x`s
    /// and a newline.
    fn lines_of(dir: &Path, i: usize, line_bytes: usize) -> usize {
        let text = std::fs::read_to_string(dir.join(format!("{i}.jsonl"))).unwrap();
        assert_eq!(text.len() % line_bytes, 0, "file {i}");
        text.split_terminator('\n')
            .inspect(|line| assert_eq!(*line, "x".repeat(line_bytes - 1), "file {i}"))
            .count()
    }

    #[test]
    fn lines_go_round_robin_whole_and_hints_are_counted() {
        let dir = temp_dir("round-robin");
        let cost = measure(&small(&dir, 3, 100, 20, 250)).unwrap();
        assert_eq!(
            (
                cost.lines,
                cost.line_bytes,
                cost.files,
                cost.lines_per_write
            ),
            (20, 100, 3, 1),
            "{cost:?}"
        );
        // 20 lines over 3 files: 7, 7 and 6.
        let per_file: Vec<usize> = (0..3).map(|i| lines_of(&dir, i, 100)).collect();
        assert_eq!(per_file, [7, 7, 6]);
        // A hint each time a file has 300 bytes unadvised (three lines): twice in the
        // files of seven lines, twice in the one of six.
        assert_eq!(cost.hints, 6);
        assert!(cost.wall_us_per_line > 0.0);
        if Path::new("/proc/thread-self/stat").exists() {
            assert!(cost.cpu_us_per_line().is_finite(), "{cost:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lines_per_write_go_to_one_file_and_the_rest_goes_last() {
        let dir = temp_dir("per-write");
        let config = WriteCostConfig {
            lines_per_write: 2,
            ..small(&dir, 3, 100, 7, 0)
        };
        let cost = measure(&config).unwrap();
        assert_eq!((cost.lines, cost.lines_per_write, cost.hints), (7, 2, 0));
        // Writes of 2, 2, 2, then the seventh line alone to the first file again.
        let per_file: Vec<usize> = (0..3).map(|i| lines_of(&dir, i, 100)).collect();
        assert_eq!(per_file, [3, 2, 2]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_second_run_starts_the_files_anew() {
        let dir = temp_dir("anew");
        let config = small(&dir, 2, 10, 4, 0);
        measure(&config).unwrap();
        let cost = measure(&config).unwrap();
        assert_eq!(cost.hints, 0);
        for i in 0..2 {
            assert_eq!(
                lines_of(&dir, i, 10),
                2,
                "file {i} holds the second run's two lines only"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn no_files_empty_lines_or_empty_writes_are_refused() {
        let dir = temp_dir("refused");
        let no_lines_per_write = WriteCostConfig {
            lines_per_write: 0,
            ..small(&dir, 3, 100, 10, 0)
        };
        for config in [
            small(&dir, 0, 100, 10, 0),
            small(&dir, 3, 0, 10, 0),
            no_lines_per_write,
        ] {
            let err = measure(&config).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        }
        assert!(!dir.exists(), "nothing is made for a refused config");
    }

    #[test]
    fn the_cost_reads_back_from_its_json() {
        let cost = WriteCost {
            lines: 10,
            line_bytes: 100,
            files: 2,
            lines_per_write: 1,
            user_us_per_line: 0.5,
            system_us_per_line: 2.0,
            wall_us_per_line: 2.6,
            hints: 1,
        };
        let json = serde_json::to_string(&cost).unwrap();
        assert_eq!(serde_json::from_str::<WriteCost>(&json).unwrap(), cost);
        assert_eq!(cost.cpu_us_per_line(), 2.5);
    }
}
