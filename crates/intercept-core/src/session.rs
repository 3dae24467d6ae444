//! One rollout as the server sees it: the [`Session`] trait and the ready
//! [`RolloutSession`].

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::body::JsonBody;
use crate::dialect_kind::DialectKind;
use crate::error::Error;
use crate::trace::record::CallRecord;
pub use crate::trace::{RecordSink, RecordWait, Trace};

pub use crate::rollout::{
    Limits, OnMismatch, Sampling, StopReason, TokenEngine, TokensConfig, Totals, Upstream,
};

/// What a request hook decided.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HookAction {
    /// Go on (the body may have been rewritten in place).
    Continue,
    /// Stop the rollout with this condition; the harness gets 400 `rollout stopped: <name>`.
    Stop(String),
}

/// When a tool hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolPhase {
    /// Before the harness uses the tool result (may short-circuit it).
    Before,
    /// After the tool ran.
    After,
}

/// What a tool hook decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolAction {
    /// Use the result as it is.
    Allow,
    /// Use this tool message instead.
    Rewrite {
        /// The replacement tool message.
        message: serde_json::Value,
    },
    /// Stop the rollout.
    Stop {
        /// The stop condition.
        reason: String,
    },
}

/// What the server tells a request hook about the call.
#[derive(Debug, Clone)]
pub struct CallInfo {
    /// The wire format.
    pub dialect: DialectKind,
    /// Whether a stream was requested.
    pub stream: bool,
    /// Per-session sequence number of the call.
    pub seq: u64,
    /// The request headers the session consumes ([`Session::hook_headers`]) that the
    /// call carried: lower-case name and value, in the order of `hook_headers` (one
    /// value per name: the last, when a header was sent twice). Empty for sessions that
    /// consume none.
    pub headers: Vec<(String, String)>,
}

/// Request headers the server never hands to a session through
/// [`Session::hook_headers`], whatever it asks: they carry secrets.
pub const SECRET_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "cookie",
];

/// The body `{"phase": "before" | "after", "message": <tool message>}` of `POST /tool`
/// answered with [`Session::on_tool`]: the default [`Session::tool`].
///
/// A stopped rollout answers `{"action": "stop", "reason": <condition>}` without asking
/// the hook; a hook's [`ToolAction::Stop`] stops the rollout
/// ([`Session::stop_with`] a [`StopReason::Hook`]) and answers the condition that won.
pub async fn tool_by_phase<S>(session: &S, body: &[u8]) -> Result<serde_json::Value, Error>
where
    S: Session + ?Sized,
{
    let answer = |action: &ToolAction| {
        serde_json::to_value(action).map_err(|e| Error::Internal(e.to_string()))
    };
    if let Some(reason) = session.stop_condition() {
        return answer(&ToolAction::Stop { reason });
    }
    #[derive(Deserialize)]
    struct ToolCall {
        phase: ToolPhase,
        message: serde_json::Value,
    }
    let call: ToolCall = serde_json::from_slice(body).map_err(|e| {
        Error::invalid(format!(
            "expected {{\"phase\": \"before\"|\"after\", \"message\": <tool message>}}: {e}"
        ))
    })?;
    if !call.message.is_object() {
        return Err(Error::invalid("`message` must be a tool message object"));
    }
    match session.on_tool(call.phase, &call.message).await? {
        ToolAction::Stop { reason } => {
            session.stop_with(StopReason::Hook(reason.clone()));
            answer(&ToolAction::Stop {
                reason: session.stop_condition().unwrap_or(reason),
            })
        }
        action => answer(&action),
    }
}

/// A model call's answer made by the session itself ([`Session::generate`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// The dialect's complete JSON response, as the upstream would have answered.
    pub response: bytes::Bytes,
    /// The ids that went to and came from the engine, when the session rendered the
    /// prompt itself.
    pub tokens: Option<crate::trace::record::TurnTokens>,
}

/// One rollout, as the server sees it.
///
/// Only [`Session::id`], [`Session::model`], [`Session::upstream`] and
/// [`Session::record`] are required; every other method has a default, so a custom
/// session is a few lines. The server guarantees:
///
/// - [`Session::record`] is called exactly once per upstream exchange, never after
///   [`Session::on_release`];
/// - hooks are awaited on the request path: they may be async, and a slow hook delays
///   only its own call;
/// - after release, no hook runs and no record arrives.
#[async_trait]
pub trait Session: Send + Sync + fmt::Debug + 'static {
    /// The rollout id (sent upstream as `X-Session-ID`).
    fn id(&self) -> &str;

    /// The model every call is sent with.
    fn model(&self) -> &str;

    /// Sampling settings imposed on every call.
    fn sampling(&self) -> Sampling {
        Sampling::new()
    }

    /// Where calls go.
    fn upstream(&self) -> &Upstream;

    /// Whether to capture token ids and logprobs for training (Chat Completions and
    /// legacy Completions): the upstream is asked for them (`return_token_ids`,
    /// `logprobs`), the record gets them, and the harness's reply is stripped of what it
    /// did not ask for. Off by default.
    fn capture_tokens(&self) -> bool {
        false
    }

    /// The rollout's network policy: what the model provider may reach on its behalf.
    /// A restricted policy makes the server mediate every request after the request hook
    /// ([`crate::Dialect::mediate`]); the default is unrestricted (nothing is mediated,
    /// at the cost of one branch per call).
    fn network(&self) -> &crate::network::NetworkPolicy {
        crate::network::NetworkPolicy::unrestricted()
    }

    /// Checked before each call: `Err(reason)` refuses it with 400 `rollout stopped:
    /// <reason>`. The default refuses once [`Session::stop_reason`] is set.
    fn check(&self) -> Result<(), StopReason> {
        match self.stop_reason() {
            Some(reason) => Err(reason),
            None => Ok(()),
        }
    }

    /// Names of request headers this session consumes (lower case): the server hands
    /// their values to the hooks in [`CallInfo::headers`] and does not forward them
    /// upstream. Headers of [`SECRET_HEADERS`] are never handed over. None by default.
    fn hook_headers(&self) -> &[String] {
        &[]
    }

    /// Runs before a call is sent upstream, after the model and sampling were imposed.
    /// May rewrite the body or stop the rollout. An [`Error`] it returns is the call's
    /// answer (an [`Error::Internal`] becomes 502 `hook_failed`), and nothing is recorded.
    async fn on_request(
        &self,
        _call: &CallInfo,
        _body: &mut JsonBody,
    ) -> Result<HookAction, Error> {
        Ok(HookAction::Continue)
    }

    /// Whether [`Session::on_response`] must see responses. When true, streams are
    /// buffered (memory up to a bound, then a temporary file) until the hook has run;
    /// keepalive comments flow meanwhile.
    fn inspects_responses(&self) -> bool {
        false
    }

    /// Runs on the complete response (for a stream, the assembled one) before the
    /// harness sees it, when [`Session::inspects_responses`] is true. May rewrite it (a
    /// rewritten stream is re-emitted as a minimal valid stream of the dialect) or stop
    /// the rollout (the call is recorded; the harness gets `rollout stopped: <name>`).
    async fn on_response(
        &self,
        _call: &CallInfo,
        _response: &mut serde_json::Value,
    ) -> Result<HookAction, Error> {
        Ok(HookAction::Continue)
    }

    /// A harness-run tool's result, before (`phase = before`) or after it is used. May
    /// allow it, rewrite it or stop the rollout. Asked by the default [`Session::tool`].
    async fn on_tool(
        &self,
        _phase: ToolPhase,
        _message: &serde_json::Value,
    ) -> Result<ToolAction, Error> {
        Ok(ToolAction::Allow)
    }

    /// Answers `POST /tool` (the model secret's tool channel): `body` is the request's
    /// body as sent, the value is the JSON answer (200); an [`Error`] is answered with
    /// its status and a flat `{"error": <text>}` body. The server awaits it while the
    /// rollout is live and drops it (answering 409) when the rollout is released, or the
    /// server stops, first. The default speaks intercept's own protocol
    /// ([`tool_by_phase`]: `{phase, message}` in, a [`ToolAction`] out); a session may
    /// speak another (a tool gate's `{tool_call_id, name, arguments}`).
    async fn tool(&self, body: &[u8]) -> Result<serde_json::Value, Error> {
        tool_by_phase(self, body).await
    }

    /// Token-in/token-out: when set, the server renders each model call's conversation
    /// to token ids, generates on the engine's token endpoint and parses the completion
    /// ids back into the dialect's answer ([`TokensConfig`]). Default: off.
    fn tokens(&self) -> Option<&TokensConfig> {
        None
    }

    /// Whether this session answers its model calls itself ([`Session::generate`])
    /// instead of having them relayed to its upstream (a train client that renders
    /// prompts to token ids and generates on its own engine). Default: false.
    fn generates(&self) -> bool {
        false
    }

    /// Answers one model call, when [`Session::generates`] is true: `body` is the request
    /// as it would have gone upstream (model, sampling, hooks and network policy applied).
    /// The answer is the dialect's complete JSON response; the server serves it as the
    /// upstream's (a streamed call gets it as the dialect's stream) and records it with
    /// its token data. An [`Error`] is the call's answer and its record's error, with its
    /// status (an [`Error::UpstreamStatus`] keeps the engine's). The server drops the
    /// future when the rollout is released, the harness is gone past its grace, or the
    /// server stops.
    async fn generate(&self, _call: &CallInfo, _body: &JsonBody) -> Result<Generated, Error> {
        Err(Error::Internal(
            "this session does not generate its answers (Session::generates is false)".into(),
        ))
    }

    /// Receives every finished call.
    fn record(&self, record: CallRecord);

    /// Whether [`Session::record`] would have to wait for room (a sink whose bounded
    /// queue is full): `None` when it takes a record now (the default), else a future
    /// that resolves once there is room. The server awaits it before each record, on the
    /// call's own time: a full queue slows its calls, never the thread that serves them.
    /// It races the call's cancellation: a call cancelled (released, shut down) while it
    /// waits records anyway, so a release never waits on a stalled disk.
    fn room_to_record(&self) -> Option<RecordWait> {
        None
    }

    /// Why the rollout stopped, if it did. `None` by default.
    fn stop_reason(&self) -> Option<StopReason> {
        None
    }

    /// Stops the rollout for `reason` (the first condition wins); the server stops
    /// rollouts through this. The default ignores it.
    fn stop_with(&self, _reason: StopReason) {}

    /// [`Session::stop_reason`] as the text the records and the wire carry.
    fn stop_condition(&self) -> Option<String> {
        self.stop_reason().map(|r| r.as_str().to_owned())
    }

    /// The rollout's shared state document (`GET /state`).
    fn state(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Replaces the state document (`PUT /state`); last write wins.
    fn set_state(&self, _state: serde_json::Value) -> Result<(), Error> {
        Err(Error::invalid("this session keeps no state"))
    }

    /// The rollout's task document, served by the default [`Session::task_body`].
    fn task(&self) -> Option<serde_json::Value> {
        None
    }

    /// The whole answer of `GET /task` (the state secret's task channel). The default is
    /// `{"id": <rollout id>, "task": <`[`Session::task`]`>}`, or 404 when there is no
    /// task; a session whose tool servers expect another shape answers it here. An
    /// [`Error`] is answered with its status and a flat `{"error": <text>}` body.
    fn task_body(&self) -> Result<serde_json::Value, Error> {
        match self.task() {
            Some(task) => Ok(serde_json::json!({ "id": self.id(), "task": task })),
            None => Err(Error::NotFound {
                method: "GET".into(),
                path: "/task (this rollout has no task)".into(),
            }),
        }
    }

    /// Called when a marked SDK retry was answered without an upstream call (a replay
    /// of the last served response, or a share of an identical attempt in flight).
    /// Such answers add no record.
    fn on_replay(&self) {}

    /// Called once when the rollout's slot is released, after every in-flight call has
    /// recorded. Nothing reaches the session afterwards.
    fn on_release(&self) {}
}

/// Configuration of a [`RolloutSession`].
///
/// Built with [`SessionConfig::new`] and the `with_*` methods (or deserialised), so that
/// a new field, with its default, is not a breaking change; the fields stay public to
/// read and to set.
///
/// ```
/// use intercept_core::{Limits, SessionConfig, Upstream};
///
/// let upstream = Upstream::new("http://127.0.0.1:8000/v1");
/// let config = SessionConfig::new("rollout-7", "policy-model", upstream)
///     .with_limits(Limits { max_turns: Some(16), ..Limits::default() });
/// assert_eq!(config.limits.max_turns, Some(16));
/// assert!(config.task.is_none());
/// ```
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SessionConfig {
    /// Rollout id.
    pub id: String,
    /// Model to impose.
    pub model: String,
    /// Sampling to impose.
    #[serde(default)]
    pub sampling: Sampling,
    /// Upstream to call.
    pub upstream: Upstream,
    /// Limits.
    #[serde(default)]
    pub limits: Limits,
    /// Task document served on `GET /task`.
    #[serde(default)]
    pub task: Option<serde_json::Value>,
    /// Network policy (see [`Session::network`]); unrestricted by default.
    #[serde(default)]
    pub network: crate::network::NetworkPolicy,
    /// Token-in/token-out (see [`Session::tokens`]); off by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Box<TokensConfig>>,
}

impl SessionConfig {
    /// The configuration of rollout `id`, imposing `model` and calling `upstream`, with
    /// the defaults for the rest: no sampling imposed, no limits, no task, an
    /// unrestricted network.
    pub fn new(id: impl Into<String>, model: impl Into<String>, upstream: Upstream) -> Self {
        SessionConfig {
            id: id.into(),
            model: model.into(),
            sampling: Sampling::default(),
            upstream,
            limits: Limits::default(),
            task: None,
            network: crate::network::NetworkPolicy::default(),
            tokens: None,
        }
    }

    /// With this sampling imposed on every call.
    pub fn with_sampling(mut self, sampling: Sampling) -> Self {
        self.sampling = sampling;
        self
    }

    /// With these limits.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// With this task document (served on `GET /task`; `None`: none).
    pub fn with_task(mut self, task: impl Into<Option<serde_json::Value>>) -> Self {
        self.task = task.into();
        self
    }

    /// With this network policy.
    pub fn with_network(mut self, network: crate::network::NetworkPolicy) -> Self {
        self.network = network;
        self
    }

    /// With token-in/token-out ([`TokensConfig`]).
    pub fn with_tokens(mut self, tokens: TokensConfig) -> Self {
        self.tokens = Some(Box::new(tokens));
        self
    }
}

/// The settings a session's log header records: what the session imposes and where it
/// calls (never the upstream's key or headers).
fn settings_of(config: &SessionConfig, capture_tokens: bool) -> serde_json::Value {
    let upstream = if config.upstream.base_urls.is_empty() {
        vec![config.upstream.base_url.clone()]
    } else {
        config.upstream.base_urls.clone()
    };
    let mut settings = serde_json::json!({
        "model": config.model,
        "sampling": config.sampling,
        "limits": config.limits,
        "upstream": upstream,
        "capture_tokens": capture_tokens,
    });
    if let Some(tokens) = &config.tokens {
        settings["tokens"] = serde_json::to_value(tokens).unwrap_or_default();
    }
    settings
}

/// The lifecycle status of a [`RolloutSession`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SessionStatus {
    /// Accepting calls.
    Active,
    /// A stop condition is set; calls are refused.
    Stopped,
    /// The slot was released; the trace is sealed.
    Released,
}

impl SessionStatus {
    /// Its name, as it is serialized: `active`, `stopped` or `released`.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Active => "active",
            SessionStatus::Stopped => "stopped",
            SessionStatus::Released => "released",
        }
    }
}

#[derive(Debug)]
struct Inner {
    /// The trace log's writer: the episode, and what it needs to write each call as
    /// what it adds; made by the first call (an idle session holds none).
    log: Option<Box<crate::trace::log::LogWriter>>,
    /// The log's lines after the header, kept in memory (see
    /// [`RolloutSession::with_calls_in_memory`]), each call's in one piece, in chunks
    /// that never move: recording a call never copies the lines before it.
    lines: crate::chunked::Chunked<Box<[u8]>>,
    /// Bytes of `lines`.
    line_bytes: usize,
    /// Records made (also those not kept in memory).
    recorded: usize,
    totals: Totals,
    stop: Option<StopReason>,
    state: serde_json::Value,
    released: bool,
    replays: u64,
}

/// The ready session: imposes a model and sampling, enforces [`Limits`], keeps the
/// trace in memory as its log ([`crate::trace::log`]: each message, tool list and token once,
/// never a call's whole body) and forwards records and log lines to optional
/// [`RecordSink`]s.
///
/// A session whose sinks store the log (a trace file) need not keep a second copy: with
/// [`RolloutSession::with_calls_in_memory`]`(false)` it keeps only the count, the totals
/// and what writing the log needs (the episode and its indexes), and
/// [`RolloutSession::trace`] has no calls.
///
/// ```
/// use intercept_core::{RolloutSession, SessionConfig, Upstream, Limits, Session};
///
/// let sampling = serde_json::json!({"temperature": 0.7}).as_object().cloned().unwrap_or_default();
/// let upstream = Upstream::new("http://127.0.0.1:8000/v1");
/// let session = RolloutSession::new(
///     SessionConfig::new("rollout-1", "policy", upstream)
///         .with_sampling(sampling)
///         .with_limits(Limits { max_turns: Some(8), ..Limits::default() }),
/// );
/// assert_eq!(session.model(), "policy");
/// assert!(session.trace().calls.is_empty());
/// ```
#[derive(Debug)]
pub struct RolloutSession {
    config: SessionConfig,
    capture_tokens: bool,
    keep_calls: bool,
    sinks: Vec<Arc<dyn RecordSink>>,
    /// When the session was made, seconds since the Unix epoch (its log's header says
    /// it; the header is written from the configuration when asked for, not kept).
    created_at: f64,
    inner: Mutex<Inner>,
}

impl RolloutSession {
    /// Stops the rollout with a condition of the caller's own
    /// ([`StopReason::Custom`]); the first condition wins.
    pub fn stop(&self, reason: &str) {
        self.stop_with(StopReason::Custom(reason.to_owned()));
    }

    /// A new, active session.
    pub fn new(config: SessionConfig) -> Self {
        RolloutSession {
            config,
            capture_tokens: false,
            keep_calls: true,
            sinks: Vec::new(),
            created_at: crate::trace::record::epoch_seconds(std::time::SystemTime::now()),
            inner: Mutex::new(Inner {
                log: None,
                lines: Default::default(),
                line_bytes: 0,
                recorded: 0,
                totals: Totals::default(),
                stop: None,
                state: serde_json::Value::Null,
                released: false,
                replays: 0,
            }),
        }
    }

    /// Whether the records are kept in memory (the default) for [`RolloutSession::trace`].
    /// Turn it off only when a sink stores them: the trace then has no calls, while the
    /// count, the totals, the limits and the episode work as before.
    pub fn with_calls_in_memory(mut self, keep: bool) -> Self {
        self.keep_calls = keep;
        self
    }

    /// Whether the records are kept in memory (see
    /// [`RolloutSession::with_calls_in_memory`]).
    pub fn calls_in_memory(&self) -> bool {
        self.keep_calls
    }

    /// Adds a sink that sees every record and every log line; it is handed the log's
    /// header at once.
    pub fn with_sink(mut self, sink: Arc<dyn RecordSink>) -> Self {
        sink.on_log(&self.header());
        self.sinks.push(sink);
        self
    }

    /// Turns token capture on or off (see [`Session::capture_tokens`]). Call it before
    /// adding sinks: the log's header says it.
    pub fn with_capture_tokens(mut self, capture: bool) -> Self {
        self.capture_tokens = capture;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// A copy of the trace so far, each record rebuilt from the log (without calls when
    /// they are not kept in memory).
    pub fn trace(&self) -> Trace {
        let (log, stop, replays) = {
            let inner = self.inner.lock();
            let log = self.keep_calls.then(|| self.log_of(&inner));
            (
                log,
                inner.stop.as_ref().map(|r| r.as_str().to_owned()),
                inner.replays,
            )
        };
        let calls = log
            .and_then(|log| crate::trace::log::LogReader::from_bytes(&log).ok())
            .map(|read| {
                (0..read.calls().len())
                    .filter_map(|i| read.record(i).ok())
                    .collect()
            })
            .unwrap_or_default();
        Trace {
            id: self.config.id.clone(),
            stop_condition: stop,
            calls,
            replays,
        }
    }

    /// The trace log so far (see [`crate::trace::log`]): the header, every call's lines and,
    /// once released, the end line. Without calls in memory, the header and end only
    /// (the sinks hold the rest).
    pub fn log(&self) -> Vec<u8> {
        let inner = self.inner.lock();
        self.log_of(&inner)
    }

    /// The log's header line.
    fn header(&self) -> Vec<u8> {
        let settings = settings_of(&self.config, self.capture_tokens);
        crate::trace::log::header_line(&self.config.id, self.created_at, settings)
    }

    fn log_of(&self, inner: &Inner) -> Vec<u8> {
        let mut out = self.header();
        out.reserve(inner.line_bytes);
        for lines in inner.lines.iter() {
            out.extend_from_slice(lines);
        }
        out
    }

    /// Bytes of log lines the session wrote, by kind (also those not kept in memory).
    pub fn log_bytes(&self) -> crate::trace::log::LogBytes {
        self.inner
            .lock()
            .log
            .as_ref()
            .map(|log| log.bytes())
            .unwrap_or_default()
    }

    /// Heap bytes the session holds for its record: the log's graph and indexes, and the
    /// lines kept in memory (for memory accounting).
    pub fn record_heap_bytes(&self) -> usize {
        let inner = self.inner.lock();
        inner.log.as_ref().map_or(0, |log| log.heap_bytes()) + inner.line_bytes
    }

    /// The rollout as a message graph (see [`crate::trace::episode`]), built call by call as
    /// the records arrived: the same as `self.trace().episode()`, without rebuilding.
    pub fn episode(&self) -> crate::trace::episode::Episode {
        match &self.inner.lock().log {
            Some(log) => log.episode(),
            None => crate::trace::episode::EpisodeBuilder::new().episode(&self.config.id),
        }
    }

    /// The number of recorded calls.
    pub fn calls(&self) -> usize {
        self.inner.lock().recorded
    }

    /// SDK retries answered without an upstream call.
    pub fn replays(&self) -> u64 {
        self.inner.lock().replays
    }

    /// Turn and token totals.
    pub fn totals(&self) -> Totals {
        self.inner.lock().totals
    }

    /// Lifecycle status.
    pub fn status(&self) -> SessionStatus {
        let inner = self.inner.lock();
        if inner.released {
            SessionStatus::Released
        } else if inner.stop.is_some() {
            SessionStatus::Stopped
        } else {
            SessionStatus::Active
        }
    }
}

#[async_trait]
impl Session for RolloutSession {
    fn id(&self) -> &str {
        &self.config.id
    }

    fn model(&self) -> &str {
        &self.config.model
    }

    fn sampling(&self) -> Sampling {
        self.config.sampling.clone()
    }

    fn upstream(&self) -> &Upstream {
        &self.config.upstream
    }

    fn capture_tokens(&self) -> bool {
        self.capture_tokens
    }

    fn network(&self) -> &crate::network::NetworkPolicy {
        &self.config.network
    }

    fn tokens(&self) -> Option<&TokensConfig> {
        self.config.tokens.as_deref()
    }

    fn check(&self) -> Result<(), StopReason> {
        let mut inner = self.inner.lock();
        if let Some(stop) = &inner.stop {
            return Err(stop.clone());
        }
        if let Some(hit) = inner.totals.exceeded(&self.config.limits) {
            inner.stop = Some(StopReason::Limit(hit));
            return Err(StopReason::Limit(hit));
        }
        Ok(())
    }

    fn room_to_record(&self) -> Option<RecordWait> {
        self.sinks.iter().find_map(|sink| sink.room())
    }

    fn record(&self, mut record: CallRecord) {
        let mut inner = self.inner.lock();
        if inner.released {
            drop(inner);
            for sink in &self.sinks {
                sink.on_record(&record);
            }
            return;
        }
        let mut lines = Vec::new();
        let id = &self.config.id;
        let log = inner
            .log
            .get_or_insert_with(|| Box::new(crate::trace::log::LogWriter::new(id)));
        log.record(&mut record, &mut lines);
        // Under the lock: each sink sees the lines in log order.
        for sink in &self.sinks {
            sink.on_log(&lines);
        }
        if record.error.is_none() {
            inner.totals.add(&record.usage);
        }
        inner.recorded += 1;
        if self.keep_calls {
            inner.line_bytes += lines.len();
            inner.lines.push(lines.into_boxed_slice());
        }
        drop(inner);
        for sink in &self.sinks {
            sink.on_record(&record);
        }
    }

    fn stop_reason(&self) -> Option<StopReason> {
        self.inner.lock().stop.clone()
    }

    fn stop_with(&self, reason: StopReason) {
        let mut inner = self.inner.lock();
        if inner.stop.is_none() {
            inner.stop = Some(reason);
        }
    }

    fn state(&self) -> serde_json::Value {
        self.inner.lock().state.clone()
    }

    fn set_state(&self, state: serde_json::Value) -> Result<(), Error> {
        let mut inner = self.inner.lock();
        if inner.released {
            return Err(Error::RolloutConcluded);
        }
        inner.state = state;
        Ok(())
    }

    fn task(&self) -> Option<serde_json::Value> {
        self.config.task.clone()
    }

    fn on_replay(&self) {
        self.inner.lock().replays += 1;
    }

    fn on_release(&self) {
        let mut inner = self.inner.lock();
        if inner.released {
            return;
        }
        inner.released = true;
        let end = crate::trace::log::LogEnd {
            ended_at: crate::trace::record::epoch_seconds(std::time::SystemTime::now()),
            stop_condition: inner.stop.as_ref().map(|r| r.as_str().to_owned()),
            calls: inner.recorded as u64,
            replays: inner.replays,
            summary: inner
                .log
                .as_ref()
                .map(|log| log.summary())
                .unwrap_or_default(),
        };
        let line = crate::trace::log::end_line(&end);
        for sink in &self.sinks {
            sink.on_log(&line);
        }
        if self.keep_calls {
            inner.line_bytes += line.len();
            inner.lines.push(line.into_boxed_slice());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::record::Usage;

    fn call(seq: u64) -> CallRecord {
        serde_json::from_value(serde_json::json!({
            "session": "r", "seq": seq, "dialect": "chat_completions", "endpoint": "/chat/completions",
            "model": "m", "stream": false, "sampling": {}, "request": {"messages": []},
            "response": {"choices": []}, "finish_reason": "stop",
            "usage": serde_json::to_value(Usage::default()).expect("usage"),
            "status": 200, "started_at": 1.0, "ended_at": 2.0, "ttfb_ms": null, "error": null,
        }))
        .expect("record")
    }

    #[test]
    fn a_record_that_cannot_be_serialised_becomes_an_error_record_not_a_null_trace() {
        let mut broken = call(1);
        // Not UTF-8: the one thing a recorded body can still fail on.
        broken.response = Some(crate::body::RawJson::new(bytes::Bytes::from_static(
            b"\"\xff\"",
        )));
        assert!(serde_json::to_vec(&broken).is_err());
        let trace = Trace {
            id: "r".into(),
            stop_condition: None,
            calls: vec![call(0), broken, call(2)],
            replays: 3,
        };
        let v: serde_json::Value = serde_json::from_slice(&trace.to_json_vec()).expect("json");
        assert_eq!(v["id"], "r");
        assert_eq!(v["replays"], 3);
        let calls = v["calls"].as_array().expect("calls");
        assert_eq!(calls.len(), 3);
        assert_eq!(calls[0], serde_json::to_value(call(0)).expect("value"));
        assert_eq!(calls[1]["seq"], 1);
        assert_eq!(calls[1]["error"]["kind"], "internal");
        assert!(
            calls[1]["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("could not be serialised")),
            "{v}"
        );
        // A whole trace reads back as a `Trace`.
        let back: Trace = serde_json::from_slice(&trace.to_json_vec()).expect("trace");
        assert_eq!(back.calls.len(), 3);
    }

    #[test]
    fn log_lines_are_kept_in_chunks_that_never_move_and_in_order() {
        let s = RolloutSession::new(SessionConfig::new("r", "m", Upstream::new("http://x/v1")));
        let mut first_chunk = None;
        for seq in 0..1000 {
            s.record(call(seq));
            let ptr = s.inner.lock().lines.first_ptr();
            assert_eq!(
                *first_chunk.get_or_insert(ptr),
                ptr,
                "the first records moved"
            );
        }
        assert_eq!(s.calls(), 1000);
        let trace = s.trace();
        assert_eq!(
            trace.calls.iter().map(|c| c.seq).collect::<Vec<_>>(),
            (0..1000).collect::<Vec<_>>()
        );
        // 8 + 16 + ... + 256, then chunks of 256.
        assert_eq!(
            s.inner.lock().lines.chunk_capacities(),
            [8, 16, 32, 64, 128, 256, 256, 256]
        );
    }

    #[test]
    fn without_calls_in_memory_the_count_totals_and_episode_stay() {
        let s = RolloutSession::new(SessionConfig::new("r", "m", Upstream::new("http://x/v1")))
            .with_calls_in_memory(false);
        assert!(!s.calls_in_memory());
        let mut c = call(0);
        c.usage.completion_tokens = 7;
        s.record(c);
        s.record(call(1));
        assert_eq!(s.calls(), 2);
        assert!(s.trace().calls.is_empty());
        assert_eq!(s.totals().turns, 2);
        assert_eq!(s.totals().output_tokens, 7);
        assert_eq!(s.episode().summary.calls, 2);
    }

    #[test]
    fn stop_wins_once_and_release_seals() {
        let s = RolloutSession::new(SessionConfig {
            id: "r".into(),
            model: "m".into(),
            sampling: Sampling::new(),
            upstream: Upstream::new("http://x/v1/"),
            limits: Limits::default(),
            task: None,
            network: Default::default(),
            tokens: None,
        });
        assert_eq!(s.upstream().base_url, "http://x/v1");
        assert_eq!(s.upstream().engines(), ["http://x/v1".to_string()]);
        assert!(!s.capture_tokens());
        assert!(s.check().is_ok());
        s.stop("first");
        s.stop("second");
        assert_eq!(s.check(), Err(StopReason::Custom("first".to_string())));
        assert_eq!(s.status(), SessionStatus::Stopped);
        s.on_release();
        assert_eq!(s.status(), SessionStatus::Released);
        assert!(matches!(
            s.set_state(serde_json::json!({})),
            Err(Error::RolloutConcluded)
        ));
    }
}
