//! A Python callable told of each finished call of a session (`NativeSession.set_record_hook`).
//!
//! The server records a call before its answer goes out (a stream's withheld terminal
//! event included). At that moment the hook is *scheduled* on the session's event loop
//! (`loop.call_soon_threadsafe(hook, payload)`) and not awaited, so it costs the call
//! only the GIL hold of the scheduling and never holds back a stream. Because the
//! scheduling happens before the harness can see the answer, whatever the harness does
//! next on that loop (its next call's hooks, its process exit) runs after the hook.
//!
//! The payload is the record as JSON without its `request` (the hook's owner saw it in
//! `on_request`): `seq`, `stream`, `status`, `model`, `response`, `finish_reason`,
//! `usage`, `started_at`, `ended_at`, `ttfb_ms`, `client_disconnected`, `error`,
//! `truncated`.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde::Serialize;

use intercept_core::{CallError, CallRecord, RawJson, Usage};

/// The callable and the loop it runs on.
pub(crate) struct RecordHook {
    func: Py<PyAny>,
    event_loop: Py<PyAny>,
}

/// What the hook receives: the record without the request.
#[derive(Serialize)]
struct RecordView<'a> {
    seq: u64,
    stream: bool,
    status: u16,
    model: &'a str,
    response: &'a Option<RawJson>,
    finish_reason: &'a Option<String>,
    usage: &'a Usage,
    started_at: f64,
    ended_at: f64,
    ttfb_ms: Option<f64>,
    client_disconnected: bool,
    error: &'a Option<CallError>,
    truncated: bool,
}

impl RecordHook {
    pub(crate) fn new(func: Py<PyAny>, event_loop: Py<PyAny>) -> Self {
        RecordHook { func, event_loop }
    }

    /// Schedules the hook with `record` on its loop. A loop that is closed (or an
    /// interpreter that is exiting) drops the notification.
    pub(crate) fn deliver(&self, record: &CallRecord) {
        let view = RecordView {
            seq: record.seq,
            stream: record.stream,
            status: record.status,
            model: &record.model,
            response: &record.response,
            finish_reason: &record.finish_reason,
            usage: &record.usage,
            started_at: record.started_at,
            ended_at: record.ended_at,
            ttfb_ms: record.ttfb_ms,
            client_disconnected: record.client_disconnected,
            error: &record.error,
            truncated: record.truncated,
        };
        let Ok(payload) = serde_json::to_vec(&view) else {
            return;
        };
        let _ = crate::bridge::with_python(|py| {
            let scheduled = self.event_loop.bind(py).call_method1(
                "call_soon_threadsafe",
                (self.func.bind(py), PyBytes::new(py, &payload)),
            );
            if let Err(e) = scheduled {
                // The loop is closed: nobody is left to tell.
                drop(e);
            }
        });
    }
}
