//! One model call, from the authenticated request to its record.
//!
//! After the request is accepted, the exchange is polled by the harness's connection
//! task and counted by the server's task tracker; if the harness disconnects, what is
//! left of it goes on as a task of that tracker (`detach`), so it is never dropped
//! half-way: every call that reaches the upstream ends in exactly one [`CallRecord`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::Instant;

use crate::redact::Redactor;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use hyper::body::Incoming;
use intercept_core::internal::{CapturedTokens, TokenCollector};
use intercept_core::internal::{Prepared, Summary};
use intercept_core::record::epoch_seconds;
use intercept_core::{
    CallError, CallInfo, CallRecord, Dialect, Error, HookAction, JsonBody, RawJson, Session,
    StopReason, TokenCapture,
};
use tokio::sync::oneshot;
use tracing::{debug, warn};

use crate::detach::ResponseBody;
use crate::detach::{error_response, json_response};
use crate::preamble::{authenticate, read_body, Shared};
use crate::registry::{Entry, InflightGuard};
use crate::upstream::{read_all, ReadError, UpstreamBody};

pub(crate) mod stream;
mod tokens;

/// The keepalive written while an upstream stream is silent: a bare comment line
/// without the blank line that would close an event.
pub(crate) const KEEPALIVE: &[u8] = b": keepalive\n";

/// Bytes of already-delivered upstream frames gathered into one write to the harness.
const READY_BATCH_LIMIT: usize = 64 * 1024;

/// Largest upstream error body kept (in the record and the harness's error message).
const ERROR_BODY_LIMIT: u64 = 64 * 1024;

/// A model call accepted for the upstream.
pub(crate) struct Call {
    shared: Arc<Shared>,
    entry: Arc<Entry>,
    /// Held for its `Drop`: keeps the session unsealed until the call recorded.
    _guard: InflightGuard,
    dialect: Arc<dyn Dialect>,
    prepared: Prepared,
    seq: u64,
    body: JsonBody,
    headers: HeaderMap,
    /// See [`Outgoing::hook_headers`].
    hook_headers: Vec<(String, String)>,
    started: SystemTime,
    /// Ownership of this attempt for retry coalescing (non-streamed calls) or of its
    /// idempotency key.
    claim: Option<crate::retry::Claim>,
    /// Counts the call in flight for pause; carries the pause epoch it was admitted in.
    admission: crate::pause::Admission,
    /// Token capture, when the session asked for it and the dialect can.
    capture: Capture,
    /// Index (in the upstream's engines) of the engine last tried; `usize::MAX`: none.
    engine: AtomicUsize,
    /// The `model` the harness's request named, before the session's was imposed.
    requested_model: Option<String>,
    /// What network-policy mediation removed (for the record).
    policy: Option<intercept_core::PolicyEvent>,
    /// The ids sent to and received from the engine, when the prompt was rendered to
    /// ids before it left (a session that generates, or the token path): filled by
    /// whoever made the answer, read by the record.
    tokens: Arc<parking_lot::Mutex<crate::tokens::TokenSlot>>,
}

/// What admitting a call produced: the rollout entered, the pause admission, and for a
/// non-streamed call its claim on the attempt (retry coalescing).
pub(crate) struct Admitted {
    pub(crate) entry: Arc<Entry>,
    pub(crate) guard: InflightGuard,
    pub(crate) admission: crate::pause::Admission,
    pub(crate) claim: Option<crate::retry::Claim>,
}

/// The request as prepared for the upstream: the dialect's reading of it, the body after
/// the session's model, sampling, hooks and network policy, and the token capture.
pub(crate) struct Outgoing {
    pub(crate) prepared: Prepared,
    pub(crate) seq: u64,
    pub(crate) body: JsonBody,
    pub(crate) headers: HeaderMap,
    /// The headers the session consumed ([`CallInfo::headers`]), for the response hook.
    pub(crate) hook_headers: Vec<(String, String)>,
    pub(crate) requested_model: Option<String>,
    pub(crate) policy: Option<intercept_core::PolicyEvent>,
    pub(crate) capture: Option<TokenCollector>,
}

impl Call {
    pub(crate) fn new(
        shared: Arc<Shared>,
        dialect: Arc<dyn Dialect>,
        admitted: Admitted,
        outgoing: Outgoing,
    ) -> Self {
        Call {
            shared,
            entry: admitted.entry,
            _guard: admitted.guard,
            dialect,
            prepared: outgoing.prepared,
            seq: outgoing.seq,
            body: outgoing.body,
            headers: outgoing.headers,
            hook_headers: outgoing.hook_headers,
            started: SystemTime::now(),
            claim: admitted.claim,
            admission: admitted.admission,
            capture: Capture::new(outgoing.capture),
            engine: AtomicUsize::new(usize::MAX),
            requested_model: outgoing.requested_model,
            policy: outgoing.policy,
            tokens: Arc::default(),
        }
    }
}

/// A call's token capture: off, or on with its collector until the relay takes it (the
/// record still knows capture was asked for).
pub(crate) enum Capture {
    Off,
    On(TokenCollector),
    Taken,
}

impl Capture {
    pub(crate) fn new(collector: Option<TokenCollector>) -> Self {
        collector.map_or(Capture::Off, Capture::On)
    }

    /// The collector, for the relay.
    fn take(&mut self) -> Option<TokenCollector> {
        match std::mem::replace(self, Capture::Taken) {
            Capture::On(c) => Some(c),
            Capture::Off => {
                *self = Capture::Off;
                None
            }
            Capture::Taken => None,
        }
    }

    fn asked(&self) -> bool {
        !matches!(self, Capture::Off)
    }
}

/// Where a call sends its response head. The harness's connection stays marked busy
/// (see [`crate::Connection::busy`]) until the answer's body is done: shutdown waits for
/// it, and once the call is cancelled the answer has a bounded time to go out.
pub(crate) struct Reply {
    tx: oneshot::Sender<Response<ResponseBody>>,
    busy: crate::serve::Busy,
}

impl Reply {
    pub(crate) fn new(
        tx: oneshot::Sender<Response<ResponseBody>>,
        busy: crate::serve::Busy,
    ) -> Self {
        Reply { tx, busy }
    }

    fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Sends the head; `Err` if nobody waits for it any more. A stream's body is
    /// written while `cancel` may still fire: the connection is told to end it then.
    fn send(
        mut self,
        mut resp: Response<ResponseBody>,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<(), ()> {
        if resp.body().is_stream() {
            self.busy.cancelled_by(cancel.clone());
        }
        resp.body_mut().hold(self.busy);
        self.tx.send(resp).map_err(drop)
    }
}

/// What a response hook decided.
enum HookOutcome {
    Unchanged,
    Rewritten(serde_json::Value),
    Stop(String),
}

/// Stops the rollout for a hook's `reason` and answers the condition that holds (the
/// first one wins).
pub(crate) fn stopped_by_hook(session: &dyn Session, reason: String) -> Error {
    let reason = StopReason::Hook(reason);
    session.stop_with(reason.clone());
    Error::RolloutStopped(session.stop_reason().unwrap_or(reason))
}

/// A 2xx answer to a non-streamed call, read whole.
struct JsonAnswer {
    body: Bytes,
    content_type: Option<HeaderValue>,
    /// When the response head arrived.
    head_at: Instant,
}

/// A failed call: the error to record, the one the harness is answered, and whether the
/// upstream's answer was cut off at `max_response_bytes`.
struct Failed {
    recorded: Error,
    answered: Error,
    truncated: bool,
}

impl Failed {
    /// `recorded` and the answer [`Call::answer`] gives it (which stops the rollout on a
    /// context-length error).
    fn new(call: &Call, recorded: Error) -> Self {
        Failed {
            answered: call.answer(&recorded),
            recorded,
            truncated: false,
        }
    }
}

/// How the call ended, for the record.
struct Outcome {
    status: u16,
    response: Option<RawJson>,
    summary: Summary,
    ttfb_ms: Option<f64>,
    client_disconnected: bool,
    error: Option<CallError>,
    /// `None`: capture off.
    tokens: Option<CapturedTokens>,
    /// The upstream's answer passed `max_response_bytes` and was cut off.
    truncated: bool,
}

/// The error of an upstream answer cut off at `limit` bytes (`max_response_bytes`).
fn too_large(limit: u64, received: u64, declared: Option<u64>) -> Error {
    Error::UpstreamMalformed(match declared {
        Some(declared) => format!(
            "the upstream declared a {declared}-byte answer, over max_response_bytes \
             ({limit} bytes); nothing of it was read. Raise max_response_bytes if answers \
             this large are expected"
        ),
        None => format!(
            "the upstream's answer passed max_response_bytes ({limit} bytes) at {received} \
             bytes received and was cut off. Raise max_response_bytes if answers this large \
             are expected"
        ),
    })
}

impl Outcome {
    fn failed(error: &Error) -> Self {
        Outcome {
            status: error.status(),
            response: None,
            summary: Summary::default(),
            ttfb_ms: None,
            client_disconnected: false,
            error: Some(CallError::from(error)),
            tokens: None,
            truncated: false,
        }
    }

    /// A failed call answered with `answered`'s HTTP error: the record's `status` and
    /// its `error.status` are both the status the harness got (a call cancelled by
    /// release is 409 in both, not 409 and 503).
    fn answered(recorded: &Error, answered: &Error) -> Self {
        let mut outcome = Outcome::failed(recorded);
        outcome.status = answered.status();
        if let Some(e) = &mut outcome.error {
            e.status = outcome.status;
        }
        outcome
    }
}

impl Call {
    /// Runs the exchange; sends the response head (and, for streams, feeds the body).
    pub(crate) async fn run(self, reply: Reply) {
        let span = tracing::debug_span!("call", session = %self.entry.session.id(), seq = self.seq, stream = self.prepared.stream);
        if self.prepared.stream {
            tracing::Instrument::instrument(self.run_stream(reply), span).await
        } else {
            tracing::Instrument::instrument(self.run_json(reply), span).await
        }
    }

    fn upstream_request(
        &self,
        base_url: &str,
    ) -> Result<http::Request<crate::http_body::SliceBody>, Error> {
        self.shared.upstream.request(
            &*self.dialect,
            self.entry.session.upstream(),
            base_url,
            Some(self.entry.session.id()),
            self.dialect.upstream_path(),
            &self.headers,
            &self.body,
        )
    }

    /// Replaces the upstream's API key in upstream text (bodies, events, errors).
    fn redactor(&self) -> Redactor {
        Redactor::new(self.entry.session.upstream().api_key.as_deref())
    }

    /// Why the call was cancelled: the rollout was released, or the server is stopping.
    fn cancellation(&self) -> Error {
        if self.entry.is_released() {
            Error::Cancelled("the rollout was released while the call was in flight".into())
        } else {
            Error::Cancelled("the server is shutting down".into())
        }
    }

    /// What the harness gets for a cancelled call.
    fn cancellation_reply(&self) -> Error {
        if self.entry.is_released() {
            Error::RolloutConcluded
        } else {
            Error::Cancelled("the server is shutting down; retry on another server".into())
        }
    }

    /// What the harness is told of a failure: a cancelled call's reply, a context-length
    /// error as the stop it causes, any other error as it is.
    fn answer(&self, e: &Error) -> Error {
        if matches!(e, Error::Cancelled(_)) {
            self.cancellation_reply()
        } else {
            self.stop_on_context_length(e)
        }
    }

    /// A context-length error stops the rollout with `context_length` (a clean truncation):
    /// the harness then gets 400 `rollout stopped: context_length`. Other errors pass.
    fn stop_on_context_length(&self, e: &Error) -> Error {
        if e.is_context_length() {
            self.entry.session.stop_with(StopReason::ContextLength);
            Error::RolloutStopped(StopReason::ContextLength)
        } else {
            e.clone()
        }
    }

    /// Sends the request to the session's engine and waits for the response head.
    ///
    /// The engine is the session's first in rendezvous order among those not marked
    /// down. One that refuses the connection is marked down and the next one is tried
    /// within the same call (the request never left); other transport failures mark it
    /// down and fail the call (the harness's SDK retries, on the next engine).
    async fn open(&self) -> Result<(Response<UpstreamBody>, Instant), Error> {
        // Transport and head errors may quote the upstream (a header name, a status).
        self.open_engine()
            .await
            .map_err(|e| self.redactor().error(e))
    }

    async fn open_engine(&self) -> Result<(Response<UpstreamBody>, Instant), Error> {
        if self.entry.session.generates() {
            return self.open_generated().await;
        }
        if let Some(tito) = &self.entry.tito {
            if let Some(opened) = self.open_tokens(tito).await? {
                return Ok(opened);
            }
        }
        self.send_to_engines(|engine| self.upstream_request(engine))
            .await
    }

    /// Sends the request `build` makes for an engine to the session's engine (see
    /// [`Call::open`]) and waits for the response head.
    async fn send_to_engines(
        &self,
        build: impl Fn(&str) -> Result<http::Request<crate::http_body::SliceBody>, Error>,
    ) -> Result<(Response<UpstreamBody>, Instant), Error> {
        let upstream = self.entry.session.upstream();
        let engines = upstream.engines();
        let session = self.entry.session.id();
        let health = &self.shared.engines;
        let multi = engines.len() > 1;
        // Engines already tried by this call (the first 64; more is not a real setup).
        let mut tried: u64 = 0;
        let bit = |i: usize| 1u64.checked_shl(i as u32).unwrap_or(0);
        loop {
            let choice = if multi {
                crate::routing::pick(session, engines, |i| {
                    tried & bit(i) == 0 && health.is_up(&engines[i])
                })
                // Every engine left is marked down: try the best of them anyway.
                .or_else(|| crate::routing::pick(session, engines, |i| tried & bit(i) == 0))
            } else {
                (tried == 0).then_some(0)
            };
            let Some(index) = choice else {
                return Err(Error::UpstreamUnavailable(format!(
                    "none of the {} engines accepted a connection",
                    engines.len()
                )));
            };
            tried |= bit(index);
            self.engine.store(index, Ordering::Relaxed);
            let engine = &engines[index];
            let req = build(engine)?;
            let send = self.shared.upstream.send_to(req);
            let sent = match self.shared.config.upstream_timeout {
                Some(t) => match tokio::time::timeout(t, send).await {
                    Ok(r) => r,
                    Err(_) => {
                        return Err(Error::UpstreamTimeout(format!(
                            "no response within the configured {} s",
                            t.as_secs_f64()
                        )))
                    }
                },
                None => send.await,
            };
            match sent {
                Ok(resp) => {
                    if multi {
                        health.mark_up(engine);
                    }
                    return Ok((resp, Instant::now()));
                }
                Err(failure) => {
                    if !multi {
                        return Err(failure.error);
                    }
                    health.mark_down(engine);
                    if failure.connect && tried.count_ones() < engines.len() as u32 {
                        warn!(session, %engine, error = ?failure.error.to_string(), "engine refused the connection; failing over");
                        continue;
                    }
                    return Err(failure.error);
                }
            }
        }
    }

    /// The answer of a session that generates its own ([`Session::generate`]), as if the
    /// upstream had sent it: the JSON response, or for a streamed call the dialect's
    /// stream made from it. Its token data waits in `self.tokens` for the record.
    async fn open_generated(&self) -> Result<(Response<UpstreamBody>, Instant), Error> {
        let info = CallInfo {
            dialect: self.dialect.kind(),
            stream: self.prepared.stream,
            seq: self.seq,
            headers: self.hook_headers.clone(),
        };
        let generate = self.entry.session.generate(&info, &self.body);
        let generated = match self.shared.config.upstream_timeout {
            Some(t) => tokio::time::timeout(t, generate).await.map_err(|_| {
                Error::UpstreamTimeout(format!(
                    "the session generated no answer within the configured {} s",
                    t.as_secs_f64()
                ))
            })??,
            None => generate.await?,
        };
        self.tokens.lock().tokens = generated.tokens;
        let (body, content_type) = if self.prepared.stream {
            let value: serde_json::Value =
                serde_json::from_slice(&generated.response).map_err(|e| {
                    Error::UpstreamMalformed(format!(
                        "the session's generated answer is not JSON: {e}"
                    ))
                })?;
            let events = self.dialect.synthesize_stream(&value);
            let mut out = bytes::BytesMut::with_capacity(events.iter().map(Bytes::len).sum());
            for e in events {
                out.extend_from_slice(&e);
            }
            (out.freeze(), "text/event-stream")
        } else {
            (generated.response, "application/json")
        };
        let resp = Response::builder()
            .status(StatusCode::OK)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(UpstreamBody::Made(crate::upstream::MadeBody::full(body)))
            .map_err(|e| Error::Internal(format!("cannot build the generated answer: {e}")))?;
        Ok((resp, Instant::now()))
    }

    /// Turns a non-2xx upstream answer into the failure to record and answer. A
    /// context-length error stops the rollout with `context_length` (a clean truncation;
    /// see [`Call::answer`]).
    async fn upstream_failure(&self, resp: Response<UpstreamBody>) -> Failed {
        let status = resp.status().as_u16();
        let redactor = self.redactor();
        let retry_after = resp
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(|v| redactor.str(v).into_owned());
        let text = match read_all(
            http_body_util::Limited::new(resp.into_body(), ERROR_BODY_LIMIT as usize),
            u64::MAX,
        )
        .await
        {
            Ok(b) => redactor.str(&String::from_utf8_lossy(&b)).into_owned(),
            Err(_) => String::from("(error body unreadable or over 64 KiB)"),
        };
        Failed::new(self, Error::upstream_status(status, text, retry_after))
    }

    /// Runs a non-streamed call: the upstream's answer is read whole, summarized and
    /// served (or the failure answered); the call is recorded before the answer goes out.
    async fn run_json(mut self, reply: Reply) {
        let mut capture = self.capture.take();
        let (mut outcome, response) = match self.read_json().await {
            Ok(answer) => match self.dialect.summarize(&answer.body) {
                Ok(summary) => self.serve_json(answer, summary, &mut capture).await,
                Err(e) => self.failure_answer(Failed::new(&self, e)),
            },
            Err(failed) => self.failure_answer(failed),
        };
        outcome.client_disconnected = reply.is_closed();
        outcome.tokens = capture.map(TokenCollector::finish);
        self.room_to_record().await;
        self.record(outcome);
        let _ = reply.send(response, &self.entry.cancel);
    }

    /// Waits until the session can take a record without blocking (a sink's bounded
    /// queue has room), unless the call is cancelled first. A stalled trace disk so
    /// holds the calls that record into it, each on its own time, never the event loop
    /// that serves them and their neighbours.
    async fn room_to_record(&self) {
        while let Some(wait) = self.entry.session.room_to_record() {
            tokio::select! {
                biased;
                _ = self.entry.cancel.cancelled() => return,
                _ = wait => {}
            }
        }
    }

    /// The upstream's 2xx answer, read whole, unless the call is cancelled first.
    async fn read_json(&self) -> Result<JsonAnswer, Failed> {
        tokio::select! {
            biased;
            _ = self.entry.cancel.cancelled() => Err(Failed::new(self, self.cancellation())),
            r = self.fetch_json() => r,
        }
    }

    /// Sends the request and reads the answer: a 2xx body (up to `max_response_bytes`,
    /// redacted) with its content type, or the failure.
    async fn fetch_json(&self) -> Result<JsonAnswer, Failed> {
        let (resp, head_at) = self.open().await.map_err(|e| Failed::new(self, e))?;
        if !resp.status().is_success() {
            return Err(self.upstream_failure(resp).await);
        }
        let redactor = self.redactor();
        let content_type = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .filter(|v| !redactor.is_active() || v.to_str().is_ok_and(|t| redactor.str(t) == t))
            .cloned();
        let limit = self.shared.config.max_response_bytes;
        let body = read_all(resp.into_body(), limit)
            .await
            .map_err(|e| match e {
                ReadError::TooLarge { received, declared } => Failed {
                    truncated: true,
                    ..Failed::new(self, too_large(limit, received, declared))
                },
                ReadError::Body(e) => Failed::new(
                    self,
                    Error::UpstreamUnavailable(format!(
                        "the upstream connection broke mid-response: {e}"
                    )),
                ),
            })?;
        Ok(JsonAnswer {
            body: redactor.bytes(body),
            content_type,
            head_at,
        })
    }

    /// A failed call answered with an HTTP error (a non-streamed call, or a stream that
    /// failed before its head was sent): the outcome to record and the error answer.
    fn failure_answer(&self, failed: Failed) -> (Outcome, Response<ResponseBody>) {
        let mut outcome = Outcome::answered(&failed.recorded, &failed.answered);
        outcome.truncated = failed.truncated;
        (outcome, error_response(&*self.dialect, &failed.answered))
    }

    /// A 2xx JSON answer and its summary: token capture strips what the harness did not
    /// ask for, the response hook may rewrite it or stop the rollout; the outcome to
    /// record and the answer to send.
    async fn serve_json(
        &mut self,
        answer: JsonAnswer,
        summary: Summary,
        capture: &mut Option<TokenCollector>,
    ) -> (Outcome, Response<ResponseBody>) {
        let JsonAnswer {
            body,
            content_type,
            head_at,
        } = answer;
        // Token capture: the harness (and the record's `response`) get the
        // reply without what the harness did not ask for.
        let body = match capture {
            Some(c) => c.strip_json(&body),
            None => body,
        };
        // A response hook may rewrite the answer or stop the rollout.
        let mut served = body.clone();
        let mut stop: Option<String> = None;
        let mut hook_error: Option<Error> = None;
        if self.entry.session.inspects_responses() {
            match serde_json::from_slice::<serde_json::Value>(&body) {
                Ok(value) => match self.response_hook(&value).await {
                    Ok(HookOutcome::Unchanged) => {}
                    Ok(HookOutcome::Rewritten(v)) => {
                        served = Bytes::from(serde_json::to_vec(&v).unwrap_or_default());
                    }
                    Ok(HookOutcome::Stop(reason)) => stop = Some(reason),
                    Err(e) => hook_error = Some(e),
                },
                Err(e) => hook_error = Some(Error::UpstreamMalformed(e.to_string())),
            }
        }
        let mut outcome = Outcome {
            status: 200,
            response: Some(RawJson::new(body)),
            summary,
            ttfb_ms: Some(ms_since(self.started, head_at)),
            client_disconnected: false,
            error: None,
            tokens: None,
            truncated: false,
        };
        if let Some(e) = hook_error {
            outcome.error = Some(CallError::from(&e));
            outcome.status = e.status();
            (outcome, error_response(&*self.dialect, &e))
        } else if let Some(reason) = stop {
            let e = stopped_by_hook(&*self.entry.session, reason);
            outcome.status = e.status();
            (outcome, error_response(&*self.dialect, &e))
        } else {
            if let Some(claim) = self.claim.take() {
                claim.served(crate::retry::Answer::Json {
                    body: served.clone(),
                    content_type: content_type.clone(),
                });
            }
            let mut resp = json_response(StatusCode::OK, served);
            if let Some(ct) = content_type {
                resp.headers_mut().insert(http::header::CONTENT_TYPE, ct);
            }
            (outcome, resp)
        }
    }

    /// Runs the session's response hook on a complete response.
    async fn response_hook(&self, response: &serde_json::Value) -> Result<HookOutcome, Error> {
        let info = CallInfo {
            dialect: self.dialect.kind(),
            stream: self.prepared.stream,
            seq: self.seq,
            headers: self.hook_headers.clone(),
        };
        let mut value = response.clone();
        match self.entry.session.on_response(&info, &mut value).await {
            Ok(HookAction::Stop(reason)) => Ok(HookOutcome::Stop(reason)),
            Ok(_) if value != *response => Ok(HookOutcome::Rewritten(value)),
            Ok(_) => Ok(HookOutcome::Unchanged),
            Err(e) => Err(Error::from_hook("response hook failed", e)),
        }
    }

    /// Records the call. The in-flight guard stays with `self`, so the session cannot be
    /// sealed before this record lands.
    fn record(&self, mut outcome: Outcome) {
        let session = &self.entry.session;
        if let Some(e) = &mut outcome.error {
            self.redactor().string(&mut e.message);
            // Foreign text goes in a `Debug` field: escaped, it cannot forge a log line.
            warn!(
                session = session.id(),
                seq = self.seq,
                kind = e.kind.as_str(),
                status = e.status,
                error = ?e.message,
                "model call failed"
            );
        } else {
            debug!(
                session = session.id(),
                seq = self.seq,
                "model call recorded"
            );
        }
        self.shared.stats.record(&outcome.error);
        // A call that failed before the relay began still says capture was asked for.
        let slot = std::mem::take(&mut *self.tokens.lock());
        // A stream's assembled response lists the calls that did not parse where the
        // JSON answer does.
        if let (Some(bad), Some(response)) = (&slot.malformed, &outcome.response) {
            outcome.response = Some(crate::tokens::with_malformed(
                self.dialect.kind(),
                response,
                bad,
            ));
        }
        let (mut token_path, mut token_reason) = slot
            .tokens
            .as_ref()
            .map_or((None, None), |t| (t.path, t.reason.clone()));
        if let Some(reason) = slot.chat_reason {
            token_path = Some(intercept_core::TokenPath::Chat);
            token_reason = Some(reason);
        }
        let tokens = match slot.tokens {
            Some(t) => CapturedTokens {
                status: TokenCapture::Captured,
                prompt_token_ids: Some(t.prompt_ids),
                completion_token_ids: Some(t.completion_ids),
                completion_logprobs: (!t.logprobs.is_empty()).then_some(t.logprobs),
            },
            None => self.captured(outcome.tokens),
        };
        // A turn that succeeded is the one the session's next turn bridges from.
        if let (Some(tito), Some(pending), None, Some(prompt), Some(completion)) = (
            &self.entry.tito,
            slot.pending,
            &outcome.error,
            &tokens.prompt_token_ids,
            &tokens.completion_token_ids,
        ) {
            let read;
            let message = match (&outcome.summary.message, &outcome.response) {
                (Some(m), _) => Some(&**m),
                (None, Some(response)) => {
                    read = intercept_core::episode::response_message(
                        self.dialect.kind(),
                        response.bytes(),
                    );
                    read.as_ref()
                }
                (None, None) => None,
            };
            if let (Some(message), 200) = (message, outcome.status) {
                tito.finished(pending, message, prompt, completion);
            }
        }
        let record = CallRecord {
            session: session.id().to_owned(),
            seq: self.seq,
            dialect: self.dialect.kind(),
            endpoint: self.dialect.upstream_path().to_owned(),
            model: self.body.str("model").unwrap_or_default(),
            requested_model: self.requested_model.clone(),
            stream: self.prepared.stream,
            sampling: self.dialect.sampling_of(&self.body),
            request: self.body.clone(),
            response: outcome.response,
            finish_reason: outcome.summary.finish_reason,
            usage: outcome.summary.usage,
            sampled: intercept_core::record::SampledHint::new(outcome.summary.message),
            status: outcome.status,
            started_at: epoch_seconds(self.started),
            ended_at: epoch_seconds(SystemTime::now()),
            ttfb_ms: outcome.ttfb_ms,
            client_disconnected: outcome.client_disconnected,
            error: outcome.error,
            epoch: self.admission.epoch,
            engine: session
                .upstream()
                .engines()
                .get(self.engine.load(Ordering::Relaxed))
                .cloned(),
            token_capture: tokens.status,
            prompt_token_ids: tokens.prompt_token_ids,
            completion_token_ids: tokens.completion_token_ids,
            completion_logprobs: tokens.completion_logprobs,
            token_path,
            token_reason,
            node: None,
            policy: self.policy.clone(),
            truncated: outcome.truncated,
        };
        session.record(record);
    }
    /// The tokens captured from the engine's reply, or what the record says when capture
    /// was asked for and nothing came (a call that failed before the relay began).
    fn captured(&self, tokens: Option<CapturedTokens>) -> CapturedTokens {
        match (tokens, self.capture.asked()) {
            (Some(t), _) => t,
            (None, true) => CapturedTokens {
                status: TokenCapture::Missing,
                ..CapturedTokens::default()
            },
            (None, false) => CapturedTokens::default(),
        }
    }
}

fn ms_since(start: SystemTime, at: Instant) -> f64 {
    let now_sys = SystemTime::now();
    let since_at = Instant::now().saturating_duration_since(at);
    now_sys
        .checked_sub(since_at)
        .and_then(|t| t.duration_since(start).ok())
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

/// A relayed auxiliary call (`/v1/messages/count_tokens`): authenticated, model forced,
/// forwarded with the harness's headers, never recorded.
pub(crate) async fn aux_call(
    shared: Arc<Shared>,
    dialect: Arc<dyn Dialect>,
    upstream_path: &str,
    req: http::Request<Incoming>,
) -> Response<ResponseBody> {
    let fail = |e: Error| error_response(&*dialect, &e);
    let (entry, _guard) = match authenticate(&shared, dialect.secret(req.headers())) {
        Ok(a) => a,
        Err(e) => return crate::preamble::refuse_unread(req.into_body(), fail(e)).await,
    };
    let (parts, body) = req.into_parts();
    let request = match aux_request(
        &shared,
        &*dialect,
        &entry,
        upstream_path,
        &parts.headers,
        body,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => {
            // The body may be partly read: this is the connection's last answer.
            let mut resp = fail(e);
            crate::preamble::close_after(&mut resp);
            return resp;
        }
    };
    let redactor = Redactor::new(entry.session.upstream().api_key.as_deref());
    let work = async {
        let resp = shared.upstream.send(request).await?;
        let status = resp.status();
        let body = read_all(resp.into_body(), 64 << 20).await.map_err(|_| {
            Error::UpstreamUnavailable("the upstream connection broke mid-response".into())
        })?;
        Ok::<_, Error>((status, body))
    };
    let result = tokio::select! {
        biased;
        _ = entry.cancel.cancelled() => Err(Error::RolloutConcluded),
        r = work => r,
    };
    match result {
        Ok((status, body)) if status.is_success() => json_response(status, redactor.bytes(body)),
        Ok((status, body)) => fail(Error::upstream_status(
            status.as_u16(),
            redactor.str(&String::from_utf8_lossy(&body)).into_owned(),
            None,
        )),
        Err(e) => fail(redactor.error(e)),
    }
}

/// The upstream request of an auxiliary call: the body read (the read ends when the
/// rollout is released), the session's model imposed, network policy mediated, for the
/// session's engine.
async fn aux_request(
    shared: &Shared,
    dialect: &dyn Dialect,
    entry: &Entry,
    upstream_path: &str,
    headers: &HeaderMap,
    body: Incoming,
) -> Result<http::Request<crate::http_body::SliceBody>, Error> {
    let bytes = read_body(shared, body, Some(&entry.cancel), "the request body").await?;
    let mut body = JsonBody::parse(bytes)?;
    let session = &entry.session;
    body.set("model", session.model())?;
    crate::network::mediate(dialect, session.network(), session.id(), &mut body)?;
    let upstream = session.upstream();
    let base_url = crate::preamble::engine_base_url(shared, &**session);
    shared.upstream.request(
        dialect,
        upstream,
        base_url,
        None,
        upstream_path,
        headers,
        &body,
    )
}
