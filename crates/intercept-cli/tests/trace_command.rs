//! `intercept trace cat | stats | export` on logs the demo wrote through real HTTP, and
//! their errors.

// Helpers outside #[test] functions panic on purpose, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use intercept_cli::demo::{run, DemoOptions};
use intercept_core::CallRecord;

async fn demo_logs(dir: &std::path::Path) -> Vec<PathBuf> {
    let summary = run(DemoOptions {
        rollouts: 4,
        turns: Some(4),
        trace_dir: Some(dir.to_owned()),
    })
    .await
    .unwrap();
    assert!(summary.ok(), "{summary}");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cat_stats_and_export_read_the_logs() {
    let dir = tempfile::tempdir().unwrap();
    let files = demo_logs(dir.path()).await;
    assert_eq!(files.len(), 4);

    // cat: one full record per call, the records the log rebuilds.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    intercept_cli::trace::cat(&files[..1], &mut out, &mut err).unwrap();
    assert!(err.is_empty(), "{}", String::from_utf8_lossy(&err));
    let printed: Vec<CallRecord> = out
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    let read = intercept_trace::read_trace_file(&files[0]).unwrap();
    assert_eq!(printed, read.records);
    assert!(printed.len() >= 4);

    // stats: one JSON line per file, the log at about its unique content.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    intercept_cli::trace::stats(&files, &mut out, &mut err).unwrap();
    let lines: Vec<serde_json::Value> = out
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4);
    for s in &lines {
        assert_eq!(s["incomplete"], false, "{s}");
        assert_eq!(s["broken_calls"], 0, "{s}");
        assert!(s["calls"].as_u64().unwrap() >= 4, "{s}");
        assert!(s["branches"].as_u64().unwrap() >= 1, "{s}");
        assert!(s["unique_bytes"].as_u64().unwrap() > 0, "{s}");
        let file = std::path::Path::new(s["file"].as_str().unwrap());
        assert_eq!(
            s["bytes"].as_u64(),
            Some(std::fs::metadata(file).unwrap().len())
        );
        assert!(s["full_bytes"].as_u64().unwrap() > 0, "{s}");
    }

    // export: one row per branch of every log.
    let out = dir.path().join("branches.parquet");
    let mut err = Vec::new();
    let rows = intercept_cli::trace::export(&files, &out, &mut err).unwrap();
    let branches: usize = files
        .iter()
        .map(|f| {
            intercept_trace::read_log_file(f)
                .unwrap()
                .episode()
                .branches
                .len()
        })
        .sum();
    assert_eq!(rows, branches);
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(&bytes[..4], b"PAR1");
    assert_eq!(&bytes[bytes.len() - 4..], b"PAR1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_log_is_read_and_said_incomplete_and_other_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let files = demo_logs(dir.path()).await;
    let text = std::fs::read(&files[0]).unwrap();
    let torn = dir.path().join("torn.log");
    std::fs::write(&torn, &text[..text.len() - 7]).unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    intercept_cli::trace::cat(std::slice::from_ref(&torn), &mut out, &mut err).unwrap();
    let err = String::from_utf8(err).unwrap();
    assert!(err.contains("torn") && err.contains("incomplete"), "{err}");
    let whole = intercept_trace::read_trace_file(&files[0])
        .unwrap()
        .records
        .len();
    assert_eq!(out.iter().filter(|b| **b == b'\n').count(), whole);

    // Not a log, and no file at all: errors that say what is wrong.
    let full = dir.path().join("full.txt");
    std::fs::write(&full, b"{\"session\":\"s\"}\n").unwrap();
    let e = intercept_cli::trace::stats(&[full], &mut Vec::new(), &mut Vec::new()).unwrap_err();
    assert!(format!("{e:#}").contains("not a trace log"), "{e:#}");
    let missing = dir.path().join("missing.jsonl");
    let e =
        intercept_cli::trace::export(&[missing], &dir.path().join("x.parquet"), &mut Vec::new())
            .unwrap_err();
    assert!(format!("{e:#}").contains("cannot read"), "{e:#}");
    // The binary: a bad command line is exit status 2, with clap's message.
    assert_eq!(
        intercept_cli::run::run([
            "intercept",
            "trace",
            "export",
            "--format",
            "csv",
            "--out",
            "x",
            "f"
        ]),
        2
    );
}

/// Runs the `intercept` binary with `args`: (status, stdout, stderr).
fn intercept(args: &[&std::ffi::OsStr]) -> (std::process::ExitStatus, Vec<u8>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_intercept"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status,
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_reads_a_folder_as_its_jsonl_files_in_name_order() {
    let dir = tempfile::tempdir().unwrap();
    let files = demo_logs(dir.path()).await;
    assert_eq!(files.len(), 4);
    // Files that are not `*.jsonl` (and folders inside) are not traces.
    std::fs::write(dir.path().join("notes.txt"), b"not a trace").unwrap();
    std::fs::create_dir(dir.path().join("inner.jsonl")).unwrap();
    let folder = dir.path().as_os_str();

    // cat: every file's records, the files in name order.
    let (status, out, err) = tokio::task::spawn_blocking({
        let folder = folder.to_owned();
        move || intercept(&["trace".as_ref(), "cat".as_ref(), &folder])
    })
    .await
    .unwrap();
    assert!(status.success(), "{err}");
    let printed: Vec<CallRecord> = out
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    let expected: Vec<CallRecord> = files
        .iter()
        .flat_map(|f| intercept_trace::read_trace_file(f).unwrap().records)
        .collect();
    assert_eq!(printed, expected);

    // A reader that stops (`| head -1`) ends cat quietly: the folder eight times is more
    // than the pipe holds, so cat writes into a pipe nobody reads any more.
    let mut args: Vec<&std::ffi::OsStr> = vec!["trace".as_ref(), "cat".as_ref()];
    args.extend(std::iter::repeat_n(folder, 8));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_intercept"))
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    assert!(first.starts_with('{'), "{first}");
    let done = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "{:?}: {err}", done.status);
    assert!(err.is_empty(), "{err}");
    assert!(out.len() * 8 > 1 << 16, "the output outgrows a pipe");

    // stats: one line per file, in name order.
    let (status, out, err) = intercept(&["trace".as_ref(), "stats".as_ref(), folder]);
    assert!(status.success(), "{err}");
    let named: Vec<String> = out
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_slice(l).unwrap();
            v["file"].as_str().unwrap().to_owned()
        })
        .collect();
    let want: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    assert_eq!(named, want);

    // export: every file's branches, as the files named one by one give them.
    let table = dir.path().join("folder.parquet");
    let (status, _, err) = intercept(&[
        "trace".as_ref(),
        "export".as_ref(),
        "--out".as_ref(),
        table.as_os_str(),
        folder,
    ]);
    assert!(status.success(), "{err}");
    let rows =
        intercept_cli::trace::export(&files, &dir.path().join("files.parquet"), &mut Vec::new())
            .unwrap();
    assert!(rows >= 4);
    assert!(err.contains(&format!("{rows} ")), "{err}");
    assert!(std::fs::metadata(&table).unwrap().len() > 0);
}
