//! What a log holds, and how compact it is (`intercept trace stats`).

use std::collections::HashSet;

use intercept_core::log::{conversation_member, LogReader};
use intercept_core::CallRecord;
use serde::Serialize;
use serde_json::Value;

/// Counts and sizes of one log.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Stats {
    /// The session.
    pub session: String,
    /// Calls.
    pub calls: u64,
    /// Calls whose record could not be rebuilt (0 for a sound log).
    pub broken_calls: u64,
    /// Nodes.
    pub nodes: u64,
    /// Branches (leaves).
    pub branches: u64,
    /// Values.
    pub values: u64,
    /// Bytes of the log.
    pub bytes: u64,
    /// Bytes of the same calls as full records, one per line (the `full` format).
    pub full_bytes: u64,
    /// Bytes of the distinct content the calls carried (see [`unique_content`]).
    pub unique_bytes: u64,
    /// `bytes / unique_bytes`.
    pub bytes_per_unique: f64,
    /// `full_bytes / unique_bytes`.
    pub full_bytes_per_unique: f64,
    /// Whether the log has no end line (or a torn last line).
    pub incomplete: bool,
    /// Lines skipped.
    pub skipped: u64,
}

/// The distinct content of some calls, in bytes: each distinct conversation element
/// (message, input item), each distinct other request member (tool list, system prompt,
/// settings, as `"key":value`) and each distinct response, counted once at its compact
/// JSON length. What any record of these calls must hold at least once.
pub fn unique_content(records: &[CallRecord]) -> u64 {
    let mut seen: HashSet<(u128, usize)> = HashSet::new();
    let mut total = 0u64;
    let mut count = |text: String| {
        let key = (xxhash_rust::xxh3::xxh3_128(text.as_bytes()), text.len());
        if seen.insert(key) {
            total += text.len() as u64;
        }
    };
    for r in records {
        let conv = conversation_member(r.dialect);
        if let Value::Object(members) = r.request.to_value() {
            for (key, value) in members {
                match (&value, conv == Some(key.as_str())) {
                    (Value::Array(items), true) => {
                        for item in items {
                            count(item.to_string());
                        }
                    }
                    _ => count(format!("{}:{value}", Value::String(key))),
                }
            }
        }
        if let Some(response) = &r.response {
            count(response.to_value().to_string());
        }
    }
    total
}

/// The stats of a log read whole.
pub fn stats(log: &LogReader) -> Stats {
    let mut records = Vec::with_capacity(log.calls().len());
    let mut broken = 0;
    for i in 0..log.calls().len() {
        match log.record(i) {
            Ok(r) => records.push(r),
            Err(_) => broken += 1,
        }
    }
    let full_bytes: u64 = records
        .iter()
        .map(|r| r.to_json_vec().len() as u64 + 1)
        .sum();
    let unique = unique_content(&records);
    let episode = log.episode();
    let ratio = |b: u64| {
        if unique == 0 {
            0.0
        } else {
            b as f64 / unique as f64
        }
    };
    Stats {
        session: log.session().to_owned(),
        calls: log.calls().len() as u64,
        broken_calls: broken,
        nodes: episode.nodes.len() as u64,
        branches: episode.branches.len() as u64,
        values: log.values().len() as u64,
        bytes: log.bytes(),
        full_bytes,
        unique_bytes: unique,
        bytes_per_unique: ratio(log.bytes()),
        full_bytes_per_unique: ratio(full_bytes),
        incomplete: log.incomplete(),
        skipped: log.skipped().len() as u64,
    }
}
