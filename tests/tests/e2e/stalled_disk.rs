//! A stalled trace disk holds the calls that record into it, never the event loop that
//! serves them: on a server with one loop, a rollout whose trace file stops taking bytes
//! has its next call held (the trace writer's queue is full), while another rollout's
//! calls on another connection of the same loop are answered, as are health checks.
//! Once the disk moves again, the held call is answered and every call of the stalled
//! rollout is in its trace, once.

use std::io::Read as _;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use intercept_core::{Interception, RecordSink, RolloutSession, SessionConfig, Upstream};
use intercept_server::{InterceptionServer, ServerConfig};
use intercept_test::harness::HttpClient;
use intercept_test::MockUpstream;
use intercept_trace::{JsonlSink, TraceWriter, WriterConfig};
use serde_json::json;

/// Generous bound for what must happen on a loaded machine.
const BOUND: Duration = Duration::from_secs(30);

/// Fills the pipe at `path` (opened for writing without blocking) until it takes no
/// more: the open end (the pipe keeps its bytes while one is open) and the bytes written.
fn fill(path: &std::path::Path) -> (tokio::net::unix::pipe::Sender, usize) {
    let sender = tokio::net::unix::pipe::OpenOptions::new()
        .read_write(true)
        .open_sender(path)
        .expect("the pipe opens for writing");
    let filler = [b'#'; 4096];
    let mut written = 0;
    loop {
        match sender.try_write(&filler) {
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return (sender, written),
            Err(e) => panic!("filling the pipe: {e}"),
        }
    }
}

/// On a failed assertion, reads the pipe empty in a thread of its own, so that the stuck
/// writer (whose drop waits for its thread) lets the failing test end.
struct Unstick(Option<std::path::PathBuf>);

impl Drop for Unstick {
    fn drop(&mut self) {
        if let (Some(path), true) = (self.0.take(), std::thread::panicking()) {
            std::thread::spawn(move || {
                if let Ok(mut pipe) = std::fs::File::open(&path) {
                    let _ = std::io::copy(&mut pipe, &mut std::io::sink());
                }
            });
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_trace_disk_holds_its_calls_not_the_event_loop() {
    let upstream = MockUpstream::start().await.expect("mock upstream");
    let server = InterceptionServer::new(ServerConfig {
        workers: 1,
        ..ServerConfig::default()
    })
    .expect("server");
    server.start().await.expect("start");

    // The stalled rollout's trace file: a pipe nobody reads, already full.
    let dir = tempfile::tempdir().expect("temp dir");
    let fifo = dir.path().join("stalled.jsonl");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo failed");
    let (filled, filler) = fill(&fifo);
    let writer = TraceWriter::start(WriterConfig {
        max_queued_bytes: 4096,
        flush_interval: Duration::from_millis(1),
    })
    .expect("trace writer");
    let sink = Arc::new(writer.sink(JsonlSink::open(&fifo).expect("the pipe opens")));
    drop(filled);
    let mut unstick = Unstick(Some(fifo.clone()));
    let model = |id: &str| SessionConfig::new(id, "mock-model", Upstream::new(upstream.base_url()));
    let stalled = Arc::new(
        RolloutSession::new(model("stalled"))
            .with_calls_in_memory(false)
            .with_sink(sink.clone()),
    );
    let healthy = Arc::new(RolloutSession::new(model("healthy")));
    let stalled_slot = server.acquire(stalled.clone()).await.expect("slot");
    let healthy_slot = server.acquire(healthy.clone()).await.expect("slot");

    // Each call asks something new of ~2 KB, so that its lines weigh that much however
    // little the log repeats of the calls before.
    let call = |client: HttpClient, base: String, secret: String, n: u64| async move {
        let url = format!("{base}/v1/chat/completions");
        let content = format!("question {n}: {}", "why? ".repeat(400));
        let body = json!({"model": "x", "messages": [{"role": "user", "content": content}]});
        client
            .send(Method::POST, &url, Some(&secret), Some(&body))
            .await
            .expect("the call is answered")
    };
    let base = stalled_slot.base_url.clone();
    let stalled_secret = stalled_slot.model_secret.expose().to_owned();

    // The stalled rollout's calls are answered until the queue is full; the next one is
    // held, waiting for room.
    let stalled_client = HttpClient::new();
    let mut answered = 0u64;
    while sink.room().is_none() {
        let resp = tokio::time::timeout(
            BOUND,
            call(
                stalled_client.clone(),
                base.clone(),
                stalled_secret.clone(),
                answered,
            ),
        )
        .await
        .expect("a call answered while the queue has room");
        assert_eq!(resp.status, StatusCode::OK);
        answered += 1;
        assert!(answered < 100, "the trace queue never filled");
    }
    let held = tokio::spawn(call(
        stalled_client.clone(),
        base.clone(),
        stalled_secret.clone(),
        answered,
    ));

    // The same loop serves the other rollout's calls, on another connection, meanwhile.
    let healthy_client = HttpClient::new();
    let healthy_secret = healthy_slot.model_secret.expose().to_owned();
    for n in 0..10 {
        let resp = tokio::time::timeout(
            BOUND,
            call(
                healthy_client.clone(),
                base.clone(),
                healthy_secret.clone(),
                n,
            ),
        )
        .await
        .expect("the event loop serves other connections while a call waits for room");
        assert_eq!(resp.status, StatusCode::OK);
    }
    let health = tokio::time::timeout(
        BOUND,
        healthy_client.send(Method::GET, &format!("{base}/healthz"), None, None),
    )
    .await
    .expect("health check answered")
    .expect("health check");
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(healthy.calls(), 10);
    assert!(
        !held.is_finished(),
        "the call past the queue's bound is held"
    );
    assert_eq!(
        stalled.calls() as u64,
        answered,
        "the held call has not recorded"
    );

    // The disk moves again: the held call is answered.
    unstick.0 = None;
    let reader = std::thread::spawn(move || {
        let mut pipe = std::fs::File::open(&fifo).expect("the pipe opens for reading");
        let mut skipped = vec![0u8; filler];
        pipe.read_exact(&mut skipped).expect("the filler");
        let mut log = Vec::new();
        pipe.read_to_end(&mut log).expect("the trace");
        log
    });
    let resp = tokio::time::timeout(BOUND, held)
        .await
        .expect("the held call is answered once the disk moves")
        .expect("join");
    assert_eq!(resp.status, StatusCode::OK);
    assert!(writer.room_waits().0 >= 1, "the wait is counted");

    // Every call of the stalled rollout is in its trace, once.
    stalled_slot.close().await;
    healthy_slot.close().await;
    server.stop().await.expect("stop");
    tokio::task::spawn_blocking({
        let writer = writer.clone();
        move || writer.close()
    })
    .await
    .expect("the writer closes");
    drop((stalled, sink, writer));
    let log = tokio::task::spawn_blocking(move || reader.join().expect("reader"))
        .await
        .expect("join");
    let read = intercept_core::log::LogReader::from_bytes(&log).expect("the trace reads");
    assert_eq!(read.calls().len() as u64, answered + 1);
}
