//! Helpers shared by the server's integration tests.
#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    missing_debug_implementations
)]

use std::sync::Arc;
use std::time::Duration;

pub mod fake_engine;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use intercept_core::{
    CallRecord, Interception, RecordSink, RolloutSession, SessionConfig, SlotGuard, Upstream,
};
use intercept_server::{InterceptionServer, ServerConfig};
use intercept_test::MockUpstream;
use serde_json::{json, Value};
use tokio::sync::Notify;

pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A sink that lets a test await records.
#[derive(Debug, Default)]
pub struct Waiter {
    pub count: std::sync::atomic::AtomicUsize,
    pub notify: Notify,
}

impl RecordSink for Waiter {
    fn on_record(&self, _record: &CallRecord) {
        self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }
}

impl Waiter {
    pub async fn wait_for(&self, n: usize) {
        tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let notified = self.notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.count.load(std::sync::atomic::Ordering::SeqCst) >= n {
                    return;
                }
                notified.await;
            }
        })
        .await
        .expect("records arrived in time");
    }
}

pub struct Harness {
    pub upstream: MockUpstream,
    pub server: InterceptionServer,
}

impl Harness {
    pub async fn new() -> Self {
        Self::with_config(ServerConfig::default()).await
    }

    pub async fn with_config(config: ServerConfig) -> Self {
        let upstream = MockUpstream::start().await.expect("mock upstream");
        let server = InterceptionServer::new(config).expect("server");
        server.start().await.expect("start");
        Harness { upstream, server }
    }

    pub fn session_config(&self, id: &str) -> SessionConfig {
        SessionConfig::new(
            id,
            "policy-model",
            Upstream::new(self.upstream.base_url()).with_api_key("sk-upstream-key"),
        )
        .with_sampling(
            json!({"temperature": 0.25})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        )
    }

    pub async fn session(&self, id: &str) -> (Arc<RolloutSession>, Arc<Waiter>, SlotGuard) {
        self.session_with(self.session_config(id)).await
    }

    pub async fn session_with(
        &self,
        config: SessionConfig,
    ) -> (Arc<RolloutSession>, Arc<Waiter>, SlotGuard) {
        let waiter = Arc::new(Waiter::default());
        let session = Arc::new(RolloutSession::new(config).with_sink(waiter.clone()));
        let guard = self.server.acquire(session.clone()).await.expect("acquire");
        (session, waiter, guard)
    }
}

pub fn chat_body(text: &str, stream: bool) -> Value {
    json!({
        "model": "whatever-the-harness-says",
        "messages": [{"role": "user", "content": text}],
        "stream": stream,
    })
}

pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub async fn post(
    base_url: &str,
    path: &str,
    secret: Option<&str>,
    body: impl Into<Bytes>,
    extra: &[(&str, &str)],
) -> Answer {
    let mut req =
        http::Request::post(format!("{base_url}{path}")).header("content-type", "application/json");
    if let Some(s) = secret {
        req = req.header("authorization", format!("Bearer {s}"));
    }
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(body.into())).expect("request");
    let resp = client().request(req).await.expect("response");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    Answer {
        status,
        headers,
        body,
    }
}

pub async fn post_json(base_url: &str, secret: Option<&str>, body: &Value) -> Answer {
    post(
        base_url,
        "/v1/chat/completions",
        secret,
        serde_json::to_vec(body).expect("json"),
        &[],
    )
    .await
}
