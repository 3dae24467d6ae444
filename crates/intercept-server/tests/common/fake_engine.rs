//! A small vLLM-like engine for tests: Chat Completions and legacy Completions, JSON or
//! SSE, written byte for byte the way vLLM's OpenAI server writes them (compact JSON,
//! `null` for fields not requested, `prompt_token_ids` / `token_ids` / `logprobs` when
//! asked for with `return_token_ids` / `logprobs`). It can pretend to be an engine that
//! ignores `return_token_ids`, block its answers until released, and be killed (its port
//! then refuses connections) and restarted on the same port.
#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    missing_debug_implementations
)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How the engine behaves.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Name written as the response's `model`.
    pub name: String,
    /// Whether `return_token_ids` is honoured (vLLM >= 0.10.2) or ignored.
    pub token_ids: bool,
}

/// What a request asked for.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub session: Option<String>,
    pub body: Value,
}

#[derive(Debug)]
struct State {
    config: EngineConfig,
    seen: Mutex<Vec<Seen>>,
    received: AtomicUsize,
    arrived: Notify,
    /// While false, answers wait (a stream after its first chunk).
    open: watch::Sender<bool>,
}

/// A running fake engine.
pub struct FakeEngine {
    pub addr: SocketAddr,
    state: Arc<State>,
    stop: CancellationToken,
    tasks: TaskTracker,
}

/// The completion text the engine writes for a prompt.
pub fn answer_text(prompt: &str) -> String {
    format!("echo: {prompt}")
}

/// Token ids of a text (one per whitespace-separated word, deterministic).
pub fn ids_of(text: &str) -> Vec<u32> {
    text.split(' ')
        .map(|w| {
            w.bytes()
                .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
                % 150_000
        })
        .collect()
}

/// The logprob the engine gives the i-th completion token (exact in binary).
pub fn logprob_of(i: usize) -> f64 {
    -((i % 7) as f64 + 1.0) / 8.0
}

/// The words of the answer, each but the first with its leading space.
fn pieces(text: &str) -> Vec<String> {
    text.split(' ')
        .enumerate()
        .map(|(i, w)| {
            if i == 0 {
                w.to_owned()
            } else {
                format!(" {w}")
            }
        })
        .collect()
}

impl FakeEngine {
    pub async fn start(config: EngineConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::serve(listener, config)
    }

    /// Restarts a killed engine on its old port.
    pub async fn restart(addr: SocketAddr, config: EngineConfig) -> Self {
        let listener = TcpListener::bind(addr).await.expect("rebind the same port");
        Self::serve(listener, config)
    }

    fn serve(listener: TcpListener, config: EngineConfig) -> Self {
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(State {
            config,
            seen: Mutex::new(Vec::new()),
            received: AtomicUsize::new(0),
            arrived: Notify::new(),
            open: watch::Sender::new(true),
        });
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let (s, st, t) = (state.clone(), stop.clone(), tasks.clone());
        tasks.spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    _ = st.cancelled() => break,
                    r = listener.accept() => match r { Ok(c) => c, Err(_) => continue },
                };
                let s = s.clone();
                let st2 = st.clone();
                t.spawn(async move {
                    let service = service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(handle(s, req).await) }
                    });
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        _ = st2.cancelled() => {}
                        _ = conn => {}
                    }
                });
            }
        });
        FakeEngine {
            addr,
            state,
            stop,
            tasks,
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Requests received so far.
    pub fn received(&self) -> usize {
        self.state.received.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` requests arrived.
    pub async fn wait_received(&self, n: usize) {
        tokio::time::timeout(std::time::Duration::from_secs(20), async {
            loop {
                let notified = self.state.arrived.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.received() >= n {
                    return;
                }
                notified.await;
            }
        })
        .await
        .expect("requests arrived in time");
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().clone()
    }

    /// Answers wait (JSON before its body, streams after their first chunk) until
    /// [`FakeEngine::release`].
    pub fn block(&self) {
        self.state.open.send_replace(false);
    }

    pub fn release(&self) {
        self.state.open.send_replace(true);
    }

    /// Stops listening and drops every connection: the port refuses connections.
    pub async fn kill(self) -> SocketAddr {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        self.addr
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn handle(state: Arc<State>, req: http::Request<Incoming>) -> http::Response<Body> {
    let path = req.uri().path().to_owned();
    let session = req
        .headers()
        .get("x-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    state.seen.lock().push(Seen {
        path: path.clone(),
        session,
        body: body.clone(),
    });
    state.received.fetch_add(1, Ordering::SeqCst);
    state.arrived.notify_waiters();
    if path.ends_with("/inference/v1/generate") {
        // vLLM's token endpoint: a fixed completion closed by Qwen3's `<|im_end|>`.
        let mut ids = ids_of("generated here");
        ids.push(151_645);
        let logprobs: Vec<Value> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| serde_json::json!({"token": format!("token_id:{id}"), "logprob": logprob_of(i)}))
            .collect();
        let answer = serde_json::json!({"request_id": "gen", "choices": [{"index": 0,
            "token_ids": ids, "logprobs": {"content": logprobs}, "finish_reason": "stop"}]});
        let mut resp =
            http::Response::new(BodyExt::boxed(Full::new(Bytes::from(answer.to_string()))));
        resp.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("application/json"),
        );
        return resp;
    }
    let chat = path.ends_with("/chat/completions");
    let prompt = if chat {
        body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_owned()
    } else {
        body["prompt"].as_str().unwrap_or("").to_owned()
    };
    let ask = Ask {
        chat,
        ids: state.config.token_ids && body["return_token_ids"] == Value::Bool(true),
        logprobs: if chat {
            body["logprobs"] == Value::Bool(true)
        } else {
            !body["logprobs"].is_null()
        },
        usage: body["stream_options"]["include_usage"] == Value::Bool(true),
        model: state.config.name.clone(),
        prompt_ids: ids_of(&prompt),
        text: answer_text(&prompt),
    };
    let mut open = state.open.subscribe();
    if body["stream"] == Value::Bool(true) {
        let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
        tokio::spawn(async move {
            let events = ask.stream();
            let mut events = events.into_iter();
            if let Some(first) = events.next() {
                let _ = tx.send(Ok(Frame::data(Bytes::from(first)))).await;
            }
            let _ = open.wait_for(|o| *o).await;
            for e in events {
                if tx.send(Ok(Frame::data(Bytes::from(e)))).await.is_err() {
                    return;
                }
            }
        });
        let body = StreamBody::new(tokio_stream_from(rx));
        let mut resp = http::Response::new(BodyExt::boxed(body));
        resp.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("text/event-stream"),
        );
        resp
    } else {
        let _ = open.wait_for(|o| *o).await;
        let mut resp = http::Response::new(BodyExt::boxed(Full::new(Bytes::from(ask.json()))));
        resp.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("application/json"),
        );
        resp
    }
}

fn tokio_stream_from(
    mut rx: mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

struct Ask {
    chat: bool,
    ids: bool,
    logprobs: bool,
    usage: bool,
    model: String,
    prompt_ids: Vec<u32>,
    text: String,
}

fn list<T: ToString>(v: &[T]) -> String {
    format!(
        "[{}]",
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    )
}

fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

impl Ask {
    fn or_null(&self, on: bool, text: String) -> String {
        if on {
            text
        } else {
            "null".into()
        }
    }

    fn usage_json(&self) -> String {
        let c = ids_of(&self.text).len();
        let p = self.prompt_ids.len();
        format!(
            "{{\"prompt_tokens\":{p},\"total_tokens\":{},\"completion_tokens\":{c},\"prompt_tokens_details\":null}}",
            p + c
        )
    }

    /// Logprobs of completion tokens `from..from + words.len()`.
    fn logprobs_json(&self, words: &[String], from: usize) -> String {
        let lps: Vec<f64> = (from..from + words.len()).map(logprob_of).collect();
        if self.chat {
            let content: Vec<String> = words
                .iter()
                .zip(&lps)
                .map(|(w, l)| {
                    format!(
                        "{{\"token\":{},\"logprob\":{l},\"bytes\":{},\"top_logprobs\":[]}}",
                        js(w),
                        list(w.as_bytes())
                    )
                })
                .collect();
            format!("{{\"content\":[{}]}}", content.join(","))
        } else {
            let tokens: Vec<String> = words.iter().map(|w| js(w)).collect();
            format!(
                "{{\"text_offset\":{},\"token_logprobs\":{},\"tokens\":[{}],\"top_logprobs\":null}}",
                list(&vec![0; words.len()]),
                list(&lps),
                tokens.join(",")
            )
        }
    }

    fn json(&self) -> String {
        let words = pieces(&self.text);
        let ids = ids_of(&self.text);
        let lp = self.or_null(self.logprobs, self.logprobs_json(&words, 0));
        let token_ids = self.or_null(self.ids, list(&ids));
        let prompt_ids = self.or_null(self.ids, list(&self.prompt_ids));
        if self.chat {
            format!(
                "{{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1,\"model\":{},\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":{},\"refusal\":null,\"tool_calls\":[],\"reasoning_content\":null}},\"logprobs\":{lp},\"finish_reason\":\"stop\",\"stop_reason\":null,\"token_ids\":{token_ids}}}],\"service_tier\":null,\"system_fingerprint\":null,\"usage\":{},\"prompt_logprobs\":null,\"prompt_token_ids\":{prompt_ids},\"kv_transfer_params\":null}}",
                js(&self.model),
                js(&self.text),
                self.usage_json()
            )
        } else {
            format!(
                "{{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":{},\"choices\":[{{\"index\":0,\"text\":{},\"logprobs\":{lp},\"finish_reason\":\"stop\",\"stop_reason\":null,\"prompt_logprobs\":null,\"prompt_token_ids\":{prompt_ids},\"token_ids\":{token_ids}}}],\"usage\":{},\"kv_transfer_params\":null}}",
                js(&self.model),
                js(&self.text),
                self.usage_json()
            )
        }
    }

    fn stream(&self) -> Vec<String> {
        let words = pieces(&self.text);
        let ids = ids_of(&self.text);
        let model = js(&self.model);
        let mut out = Vec::new();
        let data = |s: String| format!("data: {s}\n\n");
        if self.chat {
            let prompt_ids = self.or_null(self.ids, list(&self.prompt_ids));
            out.push(data(format!("{{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":{model},\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}],\"prompt_token_ids\":{prompt_ids}}}")));
            for (i, w) in words.iter().enumerate() {
                let lp = self.or_null(self.logprobs, self.logprobs_json(&words[i..=i], i));
                let tid = self.or_null(self.ids, list(&ids[i..=i]));
                out.push(data(format!("{{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":{model},\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{}}},\"logprobs\":{lp},\"finish_reason\":null,\"token_ids\":{tid}}}]}}", js(w))));
            }
            let tid = self.or_null(self.ids, "[]".into());
            out.push(data(format!("{{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":{model},\"choices\":[{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":null,\"token_ids\":{tid}}}]}}")));
            if self.usage {
                out.push(data(format!("{{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":{model},\"choices\":[],\"usage\":{}}}", self.usage_json())));
            }
        } else {
            for (i, w) in words.iter().enumerate() {
                let lp = self.or_null(self.logprobs, self.logprobs_json(&words[i..=i], i));
                let tid = self.or_null(self.ids, list(&ids[i..=i]));
                let pid = self.or_null(self.ids && i == 0, list(&self.prompt_ids));
                let finish = if i + 1 == words.len() {
                    "\"stop\""
                } else {
                    "null"
                };
                out.push(data(format!("{{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":{model},\"choices\":[{{\"index\":0,\"text\":{},\"logprobs\":{lp},\"finish_reason\":{finish},\"stop_reason\":null,\"prompt_token_ids\":{pid},\"token_ids\":{tid}}}],\"usage\":null}}", js(w))));
            }
            if self.usage {
                out.push(data(format!("{{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":{model},\"choices\":[],\"usage\":{}}}", self.usage_json())));
            }
        }
        out.push("data: [DONE]\n\n".into());
        out
    }
}
