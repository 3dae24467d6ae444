//! The demo, in-process: summary numbers and JSONL trace files.

// Helpers outside #[test] functions panic on purpose, like the tests themselves.
#![allow(clippy::unwrap_used)]

use intercept_cli::demo::{run, DemoOptions};
use intercept_trace::read_trace_file;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_summary_matches_the_trace_files() {
    let dir = tempfile::tempdir().unwrap();
    let summary = run(DemoOptions {
        rollouts: 8,
        turns: Some(3),
        trace_dir: Some(dir.path().to_owned()),
    })
    .await
    .unwrap();
    assert!(summary.ok(), "{summary}");
    assert_eq!(summary.rollouts, 8);
    assert_eq!(summary.failed_rollouts, 0);
    assert_eq!(summary.errors, 0);
    // 3 turns each; rollouts 0 and 4 use a tool on turn 1, which costs one more call.
    assert_eq!(summary.calls, 8 * 3 + 2);
    assert_eq!(summary.recorded_calls, summary.calls);
    assert!(summary.latency_p50 <= summary.latency_p99);
    assert!(summary.latency_p99 > std::time::Duration::ZERO);
    assert!(summary.calls_per_second() > 0.0);
    assert_eq!(summary.trace_dir, dir.path());
    let text = summary.to_string();
    for needle in [
        "rollouts",
        "calls",
        "errors",
        "latency p50",
        "latency p99",
        "calls/s",
    ] {
        assert!(text.contains(needle), "{text}");
    }
    assert!(text.contains(&dir.path().display().to_string()), "{text}");

    let mut files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    // One trace log per rollout, each with its end line (and with it, the episode).
    let named = |suffix: &str| {
        files
            .iter()
            .filter(|f| f.to_string_lossy().ends_with(suffix))
            .count()
    };
    assert_eq!(named(".jsonl"), 8, "{files:?}");
    assert_eq!(files.len(), 8, "{files:?}");
    for f in &files {
        let log = intercept_trace::read_log_file(f).unwrap();
        assert!(!log.incomplete(), "{f:?}: {:?}", log.skipped());
        assert!(!log.episode().nodes.is_empty(), "{f:?}");
    }
    for (id, calls) in &summary.calls_by_session {
        let trace = read_trace_file(&dir.path().join(format!("{id}.jsonl"))).unwrap();
        assert!(
            trace.skipped.is_empty(),
            "{id}: torn lines {:?}",
            trace.skipped
        );
        assert_eq!(trace.records.len(), *calls, "{id}");
        let index: usize = id.trim_start_matches("demo-").parse().unwrap();
        let expected = if index.is_multiple_of(4) { 4 } else { 3 };
        assert_eq!(*calls, expected, "{id}");
        let mut seqs: Vec<u64> = trace.records.iter().map(|r| r.seq).collect();
        seqs.sort();
        assert_eq!(seqs, (0..*calls as u64).collect::<Vec<_>>(), "{id}");
        // The log is no larger than its calls as full records (the format that writes
        // each call's whole conversation again), short as the demo's sessions are.
        let log_bytes = std::fs::metadata(dir.path().join(format!("{id}.jsonl")))
            .unwrap()
            .len() as usize;
        let full_bytes: usize = trace
            .records
            .iter()
            .map(|r| r.to_json_vec().len() + 1)
            .sum();
        assert!(
            log_bytes <= full_bytes,
            "{id}: the log is {log_bytes} bytes, its calls as full records {full_bytes}"
        );
        for r in &trace.records {
            assert_eq!(&r.session, id);
            assert!(r.is_ok(), "{id}: {:?}", r.error);
            assert_eq!(r.status, 200);
            assert_eq!(r.stream, index % 2 == 1, "{id}");
            assert_eq!(r.model, "mock-model");
            assert_eq!(r.sampling["temperature"], 0.7);
            assert!(r.usage.completion_tokens > 0, "{id}: usage {:?}", r.usage);
        }
        if index.is_multiple_of(4) {
            assert!(
                trace
                    .records
                    .iter()
                    .any(|r| r.finish_reason.as_deref() == Some("tool_calls")),
                "{id}: no tool call recorded"
            );
        }
    }
}

#[tokio::test]
async fn demo_rejects_zero_rollouts() {
    let err = run(DemoOptions {
        rollouts: 0,
        ..DemoOptions::default()
    })
    .await
    .unwrap_err();
    assert!(err.to_string().contains("--rollouts"), "{err}");
}
