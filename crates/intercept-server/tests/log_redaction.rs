//! What upstream text may not do to intercept's logs: leak the upstream's key or forge
//! log lines. One test in its own binary, so that it can own the process-wide tracing
//! subscriber: a per-thread default misses events that other threads' tests race to
//! register first.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::*;
use intercept_core::Interception;
use intercept_test::Reply;

/// The key the harness's sessions send upstream (see `Harness::session_config`).
const KEY: &str = "sk-upstream-key";

/// A `MakeWriter` into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }
}

#[tokio::test]
async fn an_upstream_that_echoes_its_key_or_forges_log_lines_leaks_nothing() {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    // The process-wide subscriber: this binary holds this one test, so every thread and
    // task of the server logs into `logs`, whatever the test runner does with threads.
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    let h = Harness::new().await;
    let (session, w, guard) = h.session("leaky").await;
    let base = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();
    let forged = "2026-12-03T00:00:00.000000Z  INFO intercept: forged line";

    // A 401 echoing the key, with a newline, a fake log prefix, a NUL and an escape.
    h.upstream.push(Reply::error(
        401,
        format!("bad key Bearer {KEY}\n{forged}\u{0}\u{1b}[2J"),
    ));
    let a = post_json(&base, Some(&secret), &chat_body("x", false)).await;
    assert_eq!(a.status, 401);
    assert!(!a.text().contains(KEY), "{}", a.text());
    assert!(
        a.text().contains("bad key Bearer <redacted>"),
        "{}",
        a.text()
    );
    // A 200 answer and a stream that quote it.
    h.upstream.push(Reply::text(format!("the key is {KEY}")));
    let a = post_json(&base, Some(&secret), &chat_body("x", false)).await;
    assert_eq!(a.status, 200);
    assert!(!a.text().contains(KEY), "{}", a.text());
    h.upstream
        .push(Reply::text(format!("stream {KEY} again {KEY}")).with_chunks(1));
    let a = post_json(&base, Some(&secret), &chat_body("x", true)).await;
    assert_eq!(a.status, 200);
    assert!(!a.text().contains(KEY), "{}", a.text());
    assert!(a.text().contains("<redacted>"), "{}", a.text());
    // An in-stream error event that quotes it.
    h.upstream.push(Reply::stream_error(
        "authentication_error",
        format!("key {KEY} revoked"),
    ));
    let a = post_json(&base, Some(&secret), &chat_body("x", true)).await;
    assert!(!a.text().contains(KEY), "{}", a.text());
    // A retry-after header that quotes it.
    h.upstream.push(Reply::error(429, "slow").with_header(
        http::header::RETRY_AFTER,
        http::HeaderValue::from_static("sk-upstream-key"),
    ));
    let a = post_json(&base, Some(&secret), &chat_body("x", false)).await;
    assert_eq!(a.status, 429);
    assert!(
        a.headers
            .get(http::header::RETRY_AFTER)
            .is_none_or(|v| v.as_bytes() != KEY.as_bytes()),
        "{:?}",
        a.headers
    );
    w.wait_for(5).await;
    let trace = serde_json::to_string(&session.trace().calls).expect("trace");
    assert!(!trace.contains(KEY), "{trace}");
    guard.close().await;
    h.server.stop().await.expect("stop");

    let logs = logs.text();
    assert!(logs.contains("model call failed"), "{logs}");
    assert!(!logs.contains(KEY), "{logs}");
    for line in logs.lines() {
        assert!(
            !line.starts_with("2026-12-03T00:00:00"),
            "forged line: {line}\n{logs}"
        );
        assert!(
            !line.contains('\u{0}') && !line.contains('\u{1b}'),
            "raw control: {line:?}"
        );
    }
    assert!(logs.contains("\\n2026-12-03T00:00:00"), "{logs}");
}
