//! A rollout's record, in one module tree: [`record`] (one call's [`CallRecord`] and its
//! JSON), [`log`] (the trace log a session writes and its reader) and [`episode`] (the
//! calls as a message graph), with the [`Message`](episode::Message) every dialect's
//! conversation is read into (`message.rs`, used by `record` and `episode`). The
//! modules depend one way: `message` ◀ `record` ◀ `episode` ◀ `log`. Writing and
//! reading files is the `intercept-trace` crate's. [`Trace`] is a session's calls whole;
//! a [`RecordSink`] receives them as they are recorded.

use std::fmt;

use serde::{Deserialize, Serialize};

mod canonical;
pub mod episode;
pub mod log;
mod message;
pub mod record;

use record::CallRecord;

/// A wait for room to record ([`Session::room_to_record`](crate::Session::room_to_record), [`RecordSink::room`]).
pub type RecordWait = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;

/// Receives what a session records, as it is recorded: each call's record, and the
/// session's trace log (see [`crate::trace::log`]) line by line. Both methods do nothing by
/// default; a sink implements what it stores.
pub trait RecordSink: Send + Sync + fmt::Debug {
    /// `None` when the sink takes what a record adds now, without blocking (the
    /// default); else a future that resolves once it has room (a bounded queue that is
    /// full). [`RolloutSession`](crate::RolloutSession) answers [`Session::room_to_record`](crate::Session::room_to_record) with its sinks'.
    fn room(&self) -> Option<RecordWait> {
        None
    }

    /// Called once per record, on the request path: keep it quick.
    fn on_record(&self, record: &CallRecord) {
        let _ = record;
    }

    /// Called with the log lines the session adds, in log order: the header when the sink
    /// is added, each call's lines as it is recorded, the end line at release. Called
    /// with the session's lock held (that keeps the order), on the request path: keep it
    /// quick, and do not call back into the session.
    fn on_log(&self, lines: &[u8]) {
        let _ = lines;
    }
}

/// A finished or in-progress rollout trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// Rollout id.
    pub id: String,
    /// Why the rollout stopped, if it did.
    pub stop_condition: Option<String>,
    /// Every call, in the order they ended.
    pub calls: Vec<CallRecord>,
    /// SDK retries answered without an upstream call (replayed or coalesced).
    #[serde(default)]
    pub replays: u64,
}

impl Trace {
    /// The trace as one JSON object, each record serialised with
    /// [`CallRecord::to_json_vec`]: a record that cannot be serialised becomes an error
    /// record, so the answer is always the whole trace.
    pub fn to_json_vec(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Head<'a> {
            id: &'a str,
            stop_condition: &'a Option<String>,
            replays: u64,
        }
        let head = Head {
            id: &self.id,
            stop_condition: &self.stop_condition,
            replays: self.replays,
        };
        // Plain strings and numbers: serialising them cannot fail.
        let bodies: usize = self.calls.iter().map(CallRecord::json_size_hint).sum();
        let mut out = Vec::with_capacity(bodies + 128);
        if serde_json::to_writer(&mut out, &head).is_err() {
            out.clear();
            out.extend_from_slice(b"{}");
        }
        out.pop(); // the closing brace
        out.extend_from_slice(if out.len() > 1 {
            b",\"calls\":["
        } else {
            b"\"calls\":["
        });
        for (i, call) in self.calls.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            call.write_json(&mut out);
        }
        out.extend_from_slice(b"]}");
        out
    }
}
