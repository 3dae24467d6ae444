//! Logs of the format's earlier version read as they were written: a demo rollout's log
//! in `intercept.trace/2` (a tool loop of four calls, written by that version) gives back
//! the records that version's reader gave (`fixtures/trace-v2.records.jsonl`).

use intercept_core::log::{LogReader, SCHEMA};

const V2: &[u8] = include_bytes!("fixtures/trace-v2.jsonl");
const V2_RECORDS: &str = include_str!("fixtures/trace-v2.records.jsonl");

#[test]
fn a_version_2_log_reads_back_to_the_records_it_held() {
    assert_ne!(
        SCHEMA, "intercept.trace/2",
        "the fixture is of an earlier version"
    );
    let log = LogReader::from_bytes(V2).expect("a version 2 log is read");
    assert!(log.skipped().is_empty(), "{:?}", log.skipped());
    assert!(!log.incomplete());
    let want: Vec<serde_json::Value> = V2_RECORDS
        .lines()
        .map(|l| serde_json::from_str(l).expect("a record"))
        .collect();
    let got = log.records().expect("records");
    assert_eq!(got.len(), want.len());
    for (got, want) in got.iter().zip(&want) {
        assert_eq!(&serde_json::to_value(got).expect("json"), want);
    }
    // Its episode: the tool loop's nine messages on one branch, and the end line's
    // summary as written.
    let episode = log.episode();
    assert_eq!(episode.nodes.len(), 9);
    assert_eq!(episode.branches.len(), 1);
    let end = log.end().expect("an end line");
    assert_eq!(end.summary, episode.summary);
    assert_eq!(end.summary.nodes, 9);
    // Each node's hash as the line gave it.
    let line: serde_json::Value = serde_json::from_str(
        std::str::from_utf8(V2)
            .expect("utf-8")
            .lines()
            .nth(1)
            .expect("a node line"),
    )
    .expect("json");
    assert_eq!(
        episode.nodes[0].hash,
        line["hash"].as_str().expect("a hash")
    );
}
