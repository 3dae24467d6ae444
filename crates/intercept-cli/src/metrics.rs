//! Prometheus metrics of the sidecar, fed by a [`RecordSink`] shared by every session and
//! rendered as Prometheus text on `GET /metrics`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use intercept_core::{CallRecord, ErrorKind, RecordSink};
use parking_lot::Mutex;

/// Upper bounds (seconds) of the latency histograms' buckets.
pub const BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, value: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS.len()];
        }
        for (i, bound) in BUCKETS.iter().enumerate() {
            if value <= *bound {
                self.counts[i] += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }

    fn add(&mut self, other: &Histogram) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS.len()];
        }
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.sum += other.sum;
        self.count += other.count;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, bound) in BUCKETS.iter().enumerate() {
            let c = self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

#[derive(Debug, Default, Clone)]
struct Calls {
    by_label: BTreeMap<(String, u16), u64>,
    /// Calls from which the network policy removed something, by dialect.
    mediated: BTreeMap<&'static str, u64>,
    latency: Histogram,
    ttfb: Histogram,
}

impl Calls {
    /// Adds another core's counts.
    fn add(&mut self, other: &Calls) {
        for (label, n) in &other.by_label {
            *self.by_label.entry(label.clone()).or_default() += n;
        }
        for (dialect, n) in &other.mediated {
            *self.mediated.entry(dialect).or_default() += n;
        }
        self.latency.add(&other.latency);
        self.ttfb.add(&other.ttfb);
    }
}

/// One core's [`Calls`], alone on its cache lines.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Slot(Mutex<Calls>);

/// The slot of the calling thread among `n`: threads are numbered in the order they
/// first record, so the event loops, each a thread, count apart.
fn slot(n: usize) -> usize {
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    SLOT.with(|s| *s) % n
}

/// Gauges read at render time.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gauges {
    /// Sessions holding a slot.
    pub active_sessions: usize,
    /// Calls in flight.
    pub inflight_calls: usize,
    /// Interception servers running.
    pub servers: usize,
    /// Tunnels started.
    pub tunnel_starts: u64,
    /// Tunnel starts that failed.
    pub tunnel_failures: u64,
    /// Rate limiter calls that failed closed because its Redis could not be used.
    pub limiter_unavailable: u64,
    /// Sessions whose URL died with a tunnel that moved to a new URL.
    pub endpoint_lost_sessions: usize,
    /// Released sessions still remembered (bounded by `released_retention`).
    pub released_sessions: usize,
    /// Bytes of released traces held in memory (bounded by `released_trace_bytes`).
    pub released_trace_bytes: usize,
    /// Bytes of trace lines queued for the trace writer (bounded by `trace_queue_bytes`).
    pub trace_queue_bytes: usize,
    /// Trace lines the writer could not write.
    pub trace_lines_lost: u64,
    /// Calls that waited for room in the trace writer's queue before they recorded.
    pub trace_queue_waits: u64,
    /// Their time waiting, in seconds, summed.
    pub trace_queue_wait_seconds: f64,
}

/// The sidecar's counters and histograms. Calls are counted per core (each event loop
/// in a slot of its own) and summed when rendered.
#[derive(Debug)]
pub struct Metrics {
    calls: Box<[Slot]>,
    upstream_errors: AtomicU64,
    sessions_created: AtomicU64,
    sessions_released: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Metrics {
            calls: (0..cores.next_power_of_two().clamp(4, 256))
                .map(|_| Slot::default())
                .collect(),
            upstream_errors: AtomicU64::new(0),
            sessions_created: AtomicU64::new(0),
            sessions_released: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// Counts a created session.
    pub fn session_created(&self) {
        self.sessions_created.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a released session.
    pub fn session_released(&self) {
        self.sessions_released.fetch_add(1, Ordering::Relaxed);
    }

    /// Prometheus text exposition (format 0.0.4).
    pub fn render(&self, gauges: Gauges) -> String {
        let mut out = String::new();
        let mut calls = Calls::default();
        for slot in self.calls.iter() {
            calls.add(&slot.0.lock());
        }
        calls.render(&mut out);
        self.render_session_counters(&mut out);
        render_trace(&mut out, gauges);
        render_tunnels(&mut out, gauges);
        render_gauges(&mut out, gauges);
        out
    }

    /// Writes the upstream error and session created/released counters.
    fn render_session_counters(&self, out: &mut String) {
        write_counter(
            out,
            "intercept_upstream_errors_total",
            "Calls that failed because of the upstream (error status, timeout, unreachable, malformed).",
            self.upstream_errors.load(Ordering::Relaxed),
        );
        write_counter(
            out,
            "intercept_sessions_created_total",
            "Sessions created through the control API.",
            self.sessions_created.load(Ordering::Relaxed),
        );
        write_counter(
            out,
            "intercept_sessions_released_total",
            "Sessions released through the control API.",
            self.sessions_released.load(Ordering::Relaxed),
        );
    }
}

impl Calls {
    /// Writes the call counters (by label, mediated) and the latency and TTFB histograms.
    fn render(&self, out: &mut String) {
        out.push_str(
            "# HELP intercept_calls_total Model calls recorded, by dialect and HTTP status.\n\
             # TYPE intercept_calls_total counter\n",
        );
        for ((dialect, status), n) in &self.by_label {
            let _ = writeln!(
                out,
                "intercept_calls_total{{dialect=\"{dialect}\",status=\"{status}\"}} {n}"
            );
        }
        out.push_str(
            "# HELP intercept_mediated_calls_total Recorded model calls from which the network \
             policy removed provider-side capabilities, by dialect.\n\
             # TYPE intercept_mediated_calls_total counter\n",
        );
        for (dialect, n) in &self.mediated {
            let _ = writeln!(
                out,
                "intercept_mediated_calls_total{{dialect=\"{dialect}\"}} {n}"
            );
        }
        self.latency.render(
            out,
            "intercept_call_duration_seconds",
            "Duration of model calls, from request to record.",
        );
        self.ttfb.render(
            out,
            "intercept_time_to_first_byte_seconds",
            "Time to the first upstream body byte of model calls.",
        );
    }
}

/// Writes one counter (`HELP`, `TYPE` and its value).
fn write_counter(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
    );
}

/// Writes one gauge (`HELP`, `TYPE` and its value).
fn write_gauge(out: &mut String, name: &str, help: &str, v: usize) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

/// Writes the trace writer's lost-lines counter and queue gauge.
fn render_trace(out: &mut String, gauges: Gauges) {
    write_counter(
        out,
        "intercept_trace_lines_lost_total",
        "Trace lines (call records) the trace writer could not append to their file (each failure is also logged).",
        gauges.trace_lines_lost,
    );
    write_gauge(
        out,
        "intercept_trace_queue_bytes",
        "Bytes of trace lines handed to the trace writer and not yet written (bounded by trace_queue_bytes).",
        gauges.trace_queue_bytes,
    );
    write_counter(
        out,
        "intercept_trace_queue_waits_total",
        "Calls that waited for room in the trace writer's queue before recording (a slow or stalled disk).",
        gauges.trace_queue_waits,
    );
    let name = "intercept_trace_queue_wait_seconds_total";
    let _ = writeln!(
        out,
        "# HELP {name} Time calls spent waiting for room in the trace writer's queue, summed.\n# TYPE {name} counter\n{name} {}",
        gauges.trace_queue_wait_seconds
    );
}

/// Writes the tunnel counters: starts, failures and limiter refusals.
fn render_tunnels(out: &mut String, gauges: Gauges) {
    write_counter(
        out,
        "intercept_tunnel_starts_total",
        "Tunnels started.",
        gauges.tunnel_starts,
    );
    write_counter(
        out,
        "intercept_tunnel_failures_total",
        "Tunnel starts that failed.",
        gauges.tunnel_failures,
    );
    write_counter(
        out,
        "intercept_tunnel_limiter_unavailable_total",
        "Tunnel rate limiter calls refused because its Redis could not be reached or did not answer in time (the limiter fails closed).",
        gauges.limiter_unavailable,
    );
}

/// Writes the gauges of sessions, calls, servers and released sessions.
fn render_gauges(out: &mut String, gauges: Gauges) {
    write_gauge(
        out,
        "intercept_active_sessions",
        "Sessions holding a slot.",
        gauges.active_sessions,
    );
    write_gauge(
        out,
        "intercept_inflight_calls",
        "Model calls in flight.",
        gauges.inflight_calls,
    );
    write_gauge(
        out,
        "intercept_servers",
        "Interception servers running.",
        gauges.servers,
    );
    write_gauge(
        out,
        "intercept_sessions_endpoint_lost",
        "Sessions holding a slot whose URL is no longer served (their tunnel moved to a new URL).",
        gauges.endpoint_lost_sessions,
    );
    write_gauge(
        out,
        "intercept_released_sessions",
        "Released sessions still remembered (their ids answer stragglers 409, their status and trace stay readable).",
        gauges.released_sessions,
    );
    write_gauge(
        out,
        "intercept_released_trace_bytes",
        "Bytes of released sessions' traces and episodes held in memory (without a trace directory).",
        gauges.released_trace_bytes,
    );
}

impl RecordSink for Metrics {
    fn on_record(&self, record: &CallRecord) {
        let upstream = record.error.as_ref().is_some_and(|e| {
            matches!(
                e.kind,
                ErrorKind::UpstreamStatus
                    | ErrorKind::UpstreamTimeout
                    | ErrorKind::UpstreamUnavailable
                    | ErrorKind::UpstreamMalformed
            )
        });
        if upstream {
            self.upstream_errors.fetch_add(1, Ordering::Relaxed);
        }
        let mut calls = self.calls[slot(self.calls.len())].0.lock();
        *calls
            .by_label
            .entry((record.dialect.as_str().to_owned(), record.status))
            .or_default() += 1;
        if record.policy.is_some() {
            *calls.mediated.entry(record.dialect.as_str()).or_default() += 1;
        }
        calls
            .latency
            .observe((record.ended_at - record.started_at).max(0.0));
        if let Some(ms) = record.ttfb_ms {
            calls.ttfb.observe(ms / 1000.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_and_buckets() {
        let m = Metrics::default();
        let mut r: CallRecord = serde_json::from_value(serde_json::json!({
            "session": "s", "seq": 0, "dialect": "chat_completions", "endpoint": "/chat/completions",
            "model": "m", "stream": false, "sampling": {}, "request": {},
            "response": null, "finish_reason": null, "usage": {"prompt_tokens": 1,
            "completion_tokens": 2, "cached_input_tokens": 0, "reasoning_tokens": 0},
            "status": 200, "started_at": 10.0, "ended_at": 10.2, "ttfb_ms": 30.0, "error": null
        }))
        .unwrap();
        m.on_record(&r);
        r.status = 502;
        r.error = Some(intercept_core::CallError {
            kind: ErrorKind::UpstreamMalformed,
            message: "x".into(),
            status: 502,
        });
        m.on_record(&r);
        r.dialect = intercept_core::DialectKind::Messages;
        r.policy = Some(intercept_core::PolicyEvent::new(vec!["mcp_servers".into()]));
        m.on_record(&r);
        m.session_created();
        let text = m.render(Gauges {
            active_sessions: 3,
            servers: 1,
            ..Gauges::default()
        });
        assert!(
            text.contains("intercept_calls_total{dialect=\"chat_completions\",status=\"200\"} 1")
        );
        assert!(
            text.contains("intercept_calls_total{dialect=\"chat_completions\",status=\"502\"} 1")
        );
        assert!(text.contains("intercept_call_duration_seconds_bucket{le=\"0.1\"} 0"));
        assert!(text.contains("intercept_call_duration_seconds_bucket{le=\"0.25\"} 3"));
        assert!(text.contains("intercept_time_to_first_byte_seconds_bucket{le=\"0.05\"} 3"));
        assert!(text.contains("intercept_call_duration_seconds_count 3"));
        assert!(text.contains("intercept_mediated_calls_total{dialect=\"messages\"} 1"));
        assert!(!text.contains("intercept_mediated_calls_total{dialect=\"chat_completions\"}"));
        assert!(text.contains("intercept_upstream_errors_total 2"));
        assert!(text.contains("intercept_sessions_created_total 1"));
        assert!(text.contains("intercept_active_sessions 3"));
        assert!(text.contains("intercept_servers 1"));
    }
}
