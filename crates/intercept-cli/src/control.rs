//! The control API: create and release sessions, read their traces, metrics and health.
//!
//! Every route but `GET /healthz` needs `Authorization: Bearer <token>`; every error is
//! `{"error": {"message", "type"}}`.
//!
//! | route | answer |
//! |---|---|
//! | `POST /v1/sessions` | `201` `{id, base_url, model_secret, state_secret, env}` |
//! | `GET /v1/sessions` | `{"sessions": [{id, status, calls}]}` |
//! | `GET /v1/sessions/{id}` | `{id, status, stop_condition, calls, usage, endpoint_lost}` |
//! | `GET /v1/sessions/{id}/trace` | `{id, stop_condition, calls: [CallRecord]}`; with a trace directory read back from the trace file (of a live session once the queued lines are written), without one held in memory (a released one up to `released_trace_bytes`, 410 once dropped) |
//! | `GET /v1/sessions/{id}/episode` | the session's episode: `{session, nodes, branches, summary}` (see `intercept_core::episode`) |
//! | `DELETE /v1/sessions/{id}` | releases the slot, returns the final trace (every `DELETE`, concurrent ones too, waits for the release to finish); with `?episode=true` also `episode`; with a trace folder, writes `<id>.episode.json` |
//! | `GET /v1/interception` | `{shape, tunnel, load, servers: [{base_url, load, healthy}], pause: {paused, mode, epoch, inflight, held}}` |
//! | `POST /v1/pause` | `{"mode": "hold"\|"reject", "timeout_secs", "retry_after_secs"}` → the pause status |
//! | `POST /v1/resume` | the pause status (epoch + 1 if it was paused) |
//! | `GET /metrics` | Prometheus text |
//! | `GET /healthz` | `{"status": "ok"}` (no token) |

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use intercept_core::{
    Error, Limits, NetworkPolicy, RecordSink, RolloutSession, Sampling, Session, SessionConfig,
    SessionStatus, Slot, SlotGuard, Upstream,
};
use serde_json::{json, Map, Value};
use tracing::{info, warn};

use intercept_server::{render, render_message, Shape};

use crate::config::check_base_url;
use crate::sidecar::{ControlState, Held, Last};
use intercept_trace::{JsonlSink, QueuedSink, TraceFormat};

/// Largest control request body accepted (16 MiB).
pub const BODY_LIMIT: usize = 16 << 20;

/// Longest session id accepted.
pub const MAX_ID_LEN: usize = 128;

type Resp = Response<Full<Bytes>>;

fn respond(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Resp {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    resp
}

fn ok_json(status: StatusCode, value: &Value) -> Resp {
    respond(
        status,
        "application/json",
        serde_json::to_vec(value).unwrap_or_default(),
    )
}

/// An error answer, rendered by the server's one mapper ([`render`]): the error decides
/// the status, the `type` and the headers; its text is the message.
fn error(error: Error) -> Resp {
    render(&error, Shape::Control).map(Full::new)
}

/// [`error`] in the control API's own words, for the errors whose text is the model
/// routes' (401, 404, 405, 413).
fn worded(error: Error, message: impl AsRef<str>) -> Resp {
    render_message(&error, message.as_ref(), Shape::Control).map(Full::new)
}

/// Handles one control request.
pub(crate) async fn handle(state: Arc<ControlState>, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if path == "/healthz" {
        return match method {
            Method::GET => ok_json(StatusCode::OK, &json!({"status": "ok"})),
            _ => not_allowed(&method, &path),
        };
    }
    let authorized = intercept_core::dialect::bearer(req.headers())
        .is_some_and(|candidate| state.token.matches(candidate));
    if !authorized {
        return worded(
            Error::Unauthorized,
            "missing or wrong control token: send `Authorization: Bearer <token>` with the \
             token from the ready line",
        );
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (segments.as_slice(), &method) {
        (["v1", "sessions"], &Method::POST) => create(&state, req).await,
        (["v1", "sessions"], &Method::GET) => list(&state),
        (["v1", "sessions", id], &Method::GET) => status(&state, id),
        (["v1", "sessions", id], &Method::DELETE) => match episode_flag(req.uri().query()) {
            Ok(with_episode) => delete(&state, id, with_episode).await,
            Err(message) => bad(message),
        },
        (["v1", "sessions", id, "trace"], &Method::GET) => match trace_query(req.uri().query()) {
            Ok(false) => trace(&state, id).await,
            Ok(true) => trace_log(&state, id).await,
            Err(e) => error(Error::InvalidRequest(e)),
        },
        (["v1", "sessions", id, "episode"], &Method::GET) => episode(&state, id).await,
        (["v1", "interception"], &Method::GET) => interception(&state).await,
        (["v1", "pause"], &Method::POST) => pause(&state, req).await,
        (["v1", "resume"], &Method::POST) => pause_answer(state.server.resume().await),
        (["metrics"], &Method::GET) => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            state.metrics.render(state.gauges().await),
        ),
        (["v1", "sessions"], _)
        | (["v1", "sessions", _], _)
        | (["v1", "sessions", _, "trace" | "episode"], _)
        | (["v1", "interception"], _)
        | (["v1", "pause" | "resume"], _)
        | (["metrics"], _) => not_allowed(&method, &path),
        _ => worded(
            Error::NotFound {
                method: method.to_string(),
                path: path.clone(),
            },
            format!("no route {method} {path}; see docs/sidecar.md for the control API"),
        ),
    }
}

fn not_allowed(method: &Method, path: &str) -> Resp {
    worded(
        Error::MethodNotAllowed {
            method: method.to_string(),
            path: path.to_owned(),
        },
        format!("{method} is not allowed on {path}"),
    )
}

/// What `POST /v1/sessions` may carry.
struct CreateRequest {
    id: Option<String>,
    model: Option<String>,
    sampling: Sampling,
    limits: Limits,
    upstream: Option<Upstream>,
    task: Option<Value>,
    capture_tokens: bool,
    network: Option<NetworkPolicy>,
}

fn bad(message: impl Into<String>) -> Resp {
    error(Error::InvalidRequest(message.into()))
}

/// Checks a session id: 1–128 characters of `A-Z a-z 0-9 . _ -`, not starting with `.`
/// (it names the trace file).
pub fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(format!("id: must be 1 to {MAX_ID_LEN} characters"));
    }
    if id.starts_with('.')
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err(format!(
            "id: {id:?} may hold only letters, digits, `.`, `_` and `-`, and must not start \
             with `.`"
        ));
    }
    Ok(())
}

/// Parses a `POST /v1/sessions` body; `allowed_key_envs`: the variables a session may
/// name as `upstream.api_key_env`.
fn parse_create(body: &[u8], allowed_key_envs: &[String]) -> Result<CreateRequest, String> {
    let mut out = CreateRequest {
        id: None,
        model: None,
        sampling: Sampling::new(),
        limits: Limits::default(),
        upstream: None,
        task: None,
        capture_tokens: false,
        network: None,
    };
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(out);
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let Value::Object(fields) = value else {
        return Err("the body must be a JSON object".into());
    };
    let string = |key: &str, v: &Value| -> Result<Option<String>, String> {
        match v {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s.clone())),
            _ => Err(format!("{key}: expected a string")),
        }
    };
    for (key, v) in &fields {
        match key.as_str() {
            "id" => {
                out.id = string("id", v)?;
                if let Some(id) = &out.id {
                    check_id(id)?;
                }
            }
            "model" => {
                out.model = string("model", v)?;
                if out.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
                    return Err("model: must not be empty".into());
                }
            }
            "sampling" => match v {
                Value::Null => {}
                Value::Object(map) => out.sampling = map.clone(),
                _ => {
                    return Err(
                        "sampling: expected an object such as {\"temperature\": 0.7}".into(),
                    )
                }
            },
            "limits" => {
                if !v.is_null() {
                    out.limits = serde_json::from_value(v.clone()).map_err(|e| {
                        format!(
                            "limits: {e} (known: max_turns, max_input_tokens, \
                             max_output_tokens, max_total_tokens; non-negative integers)"
                        )
                    })?;
                }
            }
            "upstream" => match v {
                Value::Null => {}
                Value::Object(map) => out.upstream = Some(parse_upstream(map, allowed_key_envs)?),
                _ => {
                    return Err(
                        "upstream: expected an object {\"base_url\", \"api_key_env\"}".into(),
                    )
                }
            },
            "task" => {
                if !v.is_null() {
                    out.task = Some(v.clone());
                }
            }
            "capture_tokens" => match v {
                Value::Null => {}
                Value::Bool(b) => out.capture_tokens = *b,
                _ => return Err("capture_tokens: expected true or false".into()),
            },
            "network" => {
                if !v.is_null() {
                    out.network = Some(serde_json::from_value(v.clone()).map_err(|e| {
                        format!(
                            "network: {e} (expected {{\"allow\": [patterns], \"block\": \
                             [patterns], \"on_violation\": \"strip\"|\"reject\"}}; a pattern \
                             is `*`, `*.domain` or a host)"
                        )
                    })?);
                }
            }
            other => {
                return Err(format!(
                    "unknown field {other:?}; known: id, model, sampling, limits, upstream, task, \
                     capture_tokens, network"
                ))
            }
        }
    }
    Ok(out)
}

fn parse_upstream(
    map: &Map<String, Value>,
    allowed_key_envs: &[String],
) -> Result<Upstream, String> {
    let mut base_url = None;
    let mut base_urls: Vec<String> = Vec::new();
    let mut key_env = None;
    for (key, v) in map {
        match (key.as_str(), v) {
            ("base_urls", Value::Array(items)) if !items.is_empty() => {
                for (i, item) in items.iter().enumerate() {
                    let Value::String(s) = item else {
                        return Err(format!("upstream.base_urls[{i}]: expected a string"));
                    };
                    base_urls.push(
                        check_base_url(s).map_err(|e| format!("upstream.base_urls[{i}]: {e}"))?,
                    );
                }
            }
            ("base_urls", _) => {
                return Err("upstream.base_urls: expected a non-empty array of URLs".into())
            }
            ("base_url", Value::String(s)) => {
                base_url = Some(check_base_url(s).map_err(|e| format!("upstream.base_url: {e}"))?)
            }
            ("base_url", _) => return Err("upstream.base_url: expected a string".into()),
            ("api_key_env", Value::String(s)) => key_env = Some(s.clone()),
            ("api_key_env", Value::Null) => {}
            ("api_key_env", _) => return Err("upstream.api_key_env: expected a string".into()),
            (other, _) => {
                return Err(format!(
                    "upstream: unknown field {other:?}; known: base_url, base_urls, api_key_env"
                ))
            }
        }
    }
    let mut upstream = match (base_url, base_urls.is_empty()) {
        (None, true) => return Err("upstream.base_url: required (or base_urls)".into()),
        (Some(url), true) => Upstream::new(url),
        (None, false) => Upstream::engines_of(base_urls),
        (Some(_), false) => {
            return Err("upstream: give either base_url or base_urls, not both".into())
        }
    };
    if let Some(var) = key_env {
        if !allowed_key_envs.contains(&var) {
            let allowed = if allowed_key_envs.is_empty() {
                "none is allowed: start the sidecar with --upstream-api-key-env or \
                 --allowed-key-envs"
                    .to_owned()
            } else {
                format!("allowed: {}", allowed_key_envs.join(", "))
            };
            return Err(format!(
                "upstream.api_key_env: {var:?} is not a variable this sidecar lets sessions \
                 name ({allowed}; set --allowed-key-envs to allow more)"
            ));
        }
        let key = std::env::var(&var).map_err(|_| {
            format!("upstream.api_key_env: the environment variable {var:?} is not set in the sidecar's environment")
        })?;
        upstream.api_key = Some(key);
    }
    Ok(upstream)
}

async fn create(state: &Arc<ControlState>, req: Request<Incoming>) -> Resp {
    try_create(state, req).await.unwrap_or_else(|resp| *resp)
}

/// `POST /v1/sessions` as its stages: read the request, fill in the sidecar's defaults,
/// open the trace file, build the session, register it and take a slot, answer; `Err`
/// is the answer of the stage that refused (boxed, as large).
async fn try_create(state: &Arc<ControlState>, req: Request<Incoming>) -> Result<Resp, Box<Resp>> {
    let mut request = read_create(state, req).await?;
    let (id, model, upstream) = resolve_create(state, &mut request)?;
    let sink = open_trace(state, &id)?;
    let session = build_session(state, id.clone(), model, upstream, request, sink.as_ref());
    let slot = register(state, &id, session, sink).await?;
    Ok(created(state, &id, &slot))
}

/// Refuses while shutting down, reads the body (up to [`BODY_LIMIT`]) and parses it.
async fn read_create(
    state: &ControlState,
    req: Request<Incoming>,
) -> Result<CreateRequest, Box<Resp>> {
    if !state.accepting.load(Ordering::SeqCst) {
        return Err(Box::new(error(Error::Unavailable(
            "the sidecar is shutting down; no new sessions".into(),
        ))));
    }
    let body = match Limited::new(req.into_body(), BODY_LIMIT).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(Box::new(worded(
                Error::PayloadTooLarge {
                    limit: BODY_LIMIT as u64,
                },
                format!("the body exceeds {BODY_LIMIT} bytes"),
            )))
        }
        Err(e) => return Err(Box::new(bad(format!("could not read the body: {e}")))),
    };
    parse_create(&body, &state.config.key_envs_allowed()).map_err(|message| Box::new(bad(message)))
}

/// The session's id, model and upstream: the request's, else the sidecar's defaults (a
/// generated id).
fn resolve_create(
    state: &ControlState,
    request: &mut CreateRequest,
) -> Result<(String, String, Upstream), Box<Resp>> {
    let Some(model) = request.model.take().or_else(|| state.default_model.clone()) else {
        return Err(Box::new(bad(
            "model: required (the sidecar has no default model; start it with --model)",
        )));
    };
    let Some(upstream) = request
        .upstream
        .take()
        .or_else(|| state.default_upstream.clone())
    else {
        return Err(Box::new(bad(
            "upstream: required (the sidecar has no default upstream; start it with --upstream)",
        )));
    };
    let id = match request.id.take() {
        Some(id) => id,
        None => match generate_id(state) {
            Some(id) => id,
            None => {
                return Err(Box::new(error(Error::Unavailable(
                    "could not generate a free session id; retry, or give an explicit id".into(),
                ))))
            }
        },
    };
    Ok((id, model, upstream))
}

/// Creates the session's trace file `<trace_dir>/<id>.jsonl` (never an existing one) and
/// its queued sink; `None` without a trace directory.
fn open_trace(state: &ControlState, id: &str) -> Result<Option<Arc<QueuedSink>>, Box<Resp>> {
    let Some(dir) = &state.config.trace_dir else {
        return Ok(None);
    };
    if state.sessions.lock().contains_key(id) {
        return Err(Box::new(duplicate(id)));
    }
    let path = dir.join(format!("{id}.jsonl"));
    match JsonlSink::create_new(&path) {
        Ok(s) => {
            let s = s.with_format(state.config.trace_format);
            Ok(state.writer.as_ref().map(|w| Arc::new(w.sink(s))))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Err(Box::new(error(Error::Conflict(format!(
                "the trace file {} already exists (a rollout of an earlier run, or \
                     of a session released and forgotten, has this id); a session never \
                     appends to another rollout's file: choose another id, or move the \
                     file away",
                path.display()
            )))))
        }
        Err(e) => {
            warn!(session = %id, path = %path.display(), error = %e, "cannot create the trace file");
            Err(Box::new(error(Error::Unavailable(format!(
                "cannot create the trace file {} of session {id:?}: {e}; retry once \
                     the sidecar has resources again (open files, disk space)",
                path.display()
            )))))
        }
    }
}

/// Builds the session from the request, recording to the metrics and, with one, to
/// `sink`.
fn build_session(
    state: &ControlState,
    id: String,
    model: String,
    upstream: Upstream,
    request: CreateRequest,
    sink: Option<&Arc<QueuedSink>>,
) -> Arc<RolloutSession> {
    let mut session = RolloutSession::new(
        SessionConfig::new(id, model, upstream)
            .with_sampling(request.sampling)
            .with_limits(request.limits)
            .with_task(request.task)
            .with_network(
                request
                    .network
                    .unwrap_or_else(|| state.default_network.clone()),
            ),
    )
    .with_capture_tokens(request.capture_tokens)
    // With a trace file, the file is the trace: no second copy in memory.
    .with_calls_in_memory(sink.is_none())
    .with_sink(state.metrics.clone() as Arc<dyn RecordSink>);
    if let Some(sink) = sink {
        session = session.with_sink(sink.clone() as Arc<dyn RecordSink>);
    }
    Arc::new(session)
}

/// Registers the session under `id` (unless taken), acquires its slot and keeps the
/// guard; unregisters it when the slot cannot be had or the sidecar shut down meanwhile.
async fn register(
    state: &ControlState,
    id: &str,
    session: Arc<RolloutSession>,
    sink: Option<Arc<QueuedSink>>,
) -> Result<Slot, Box<Resp>> {
    {
        let mut sessions = state.sessions.lock();
        if sessions.contains_key(id) {
            return Err(Box::new(duplicate(id)));
        }
        sessions.insert(id.to_owned(), Held::new(session.clone(), sink));
    }
    let guard = match state
        .server
        .acquire(session.clone() as Arc<dyn Session>)
        .await
    {
        Ok(g) => g,
        Err(e) => {
            state.sessions.lock().remove(id);
            warn!(session = %id, error = %e, "could not acquire a slot");
            return Err(Box::new(error(Error::Unavailable(format!(
                "could not acquire a slot: {e}"
            )))));
        }
    };
    let slot = guard.slot().clone();
    let mut sessions = state.sessions.lock();
    match sessions.get_mut(id) {
        Some(held) if !held.released => held.guard = Some(guard),
        // Shut down while acquiring: the guard drops here and frees the slot.
        _ => {
            if let Some(held) = sessions.remove(id) {
                held.done.token.cancel();
            }
            return Err(Box::new(error(Error::Unavailable(
                "the sidecar is shutting down; no new sessions".into(),
            ))));
        }
    }
    Ok(slot)
}

/// Counts and logs the created session and answers `201` with its slot and harness env.
fn created(state: &ControlState, id: &str, slot: &Slot) -> Resp {
    state.metrics.session_created();
    info!(session = %id, "session created");
    let env: Map<String, Value> = slot
        .harness_env()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), Value::String(v)))
        .collect();
    ok_json(
        StatusCode::CREATED,
        &json!({
            "id": id,
            "base_url": slot.base_url,
            "model_secret": slot.model_secret.expose(),
            "state_secret": slot.state_secret.expose(),
            "env": env,
        }),
    )
}

fn duplicate(id: &str) -> Resp {
    error(Error::Conflict(format!(
        "a session with id {id:?} already exists; ids must be unique"
    )))
}

/// A generated id: `session-<run>-<n>`, `<run>` the 8 hex digits drawn at start (see
/// [`ControlState::run_id`]), so ids of two runs never collide.
fn generate_id(state: &ControlState) -> Option<String> {
    let sessions = state.sessions.lock();
    (0..1024).find_map(|_| {
        let n = state.next_id.fetch_add(1, Ordering::Relaxed);
        let id = format!("session-{}-{n}", state.run_id);
        (!sessions.contains_key(&id)).then_some(id)
    })
}

fn unknown(method: &Method, id: &str) -> Resp {
    worded(
        Error::NotFound {
            method: method.to_string(),
            path: format!("/v1/sessions/{id}"),
        },
        format!("no session {id:?} (never created, or released long enough ago to be forgotten)"),
    )
}

fn status_name(s: SessionStatus) -> &'static str {
    s.as_str()
}

/// The live session, or what stays of it once released.
enum View {
    Live(Arc<RolloutSession>),
    Released(Arc<Last>),
}

fn view_of(state: &ControlState, id: &str) -> Option<View> {
    let sessions = state.sessions.lock();
    let held = sessions.get(id)?;
    match (&held.session, &held.last) {
        (Some(s), _) => Some(View::Live(s.clone())),
        (None, Some(l)) => Some(View::Released(l.clone())),
        (None, None) => None,
    }
}

fn list(state: &ControlState) -> Resp {
    let mut sessions: Vec<Value> = state
        .sessions
        .lock()
        .iter()
        .map(|(id, h)| json!({"id": id, "status": status_name(h.status()), "calls": h.calls()}))
        .collect();
    sessions.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    ok_json(StatusCode::OK, &json!({ "sessions": sessions }))
}

fn status(state: &ControlState, id: &str) -> Resp {
    let answer = {
        let sessions = state.sessions.lock();
        let Some(held) = sessions.get(id) else {
            return unknown(&Method::GET, id);
        };
        json!({
            "id": id,
            "status": status_name(held.status()),
            "stop_condition": held.stop_condition(),
            "calls": held.calls(),
            "usage": held.totals(),
            "endpoint_lost": held.guard.as_ref().is_some_and(SlotGuard::endpoint_lost),
        })
    };
    ok_json(StatusCode::OK, &answer)
}

/// 410: a released session is remembered but its trace is no longer held.
fn gone(id: &str, what: &str, why: String) -> Resp {
    error(Error::Gone(format!(
        "the {what} of released session {id:?} is no longer available: {why}"
    )))
}

fn evicted(state: &ControlState) -> String {
    format!(
        "released traces are held in memory up to released_trace_bytes ({} bytes), oldest \
         dropped first; read the DELETE answer, or run with --trace-dir to read released \
         traces back from their files",
        state.config.released_trace_bytes
    )
}

/// The final trace of a released session: rebuilt from its log held in memory, or (with
/// a trace directory) read back from its file.
async fn final_trace(state: &ControlState, id: &str, last: &Last) -> Result<Vec<u8>, Resp> {
    let Some(dir) = &state.config.trace_dir else {
        let Some(log) = last.kept.lock().clone() else {
            return Err(gone(id, "trace", evicted(state)));
        };
        let (id2, stop, replays) = (id.to_owned(), last.stop_condition.clone(), last.replays);
        return blocking(move || crate::trace::trace_json(&log, &id2, stop, replays))
            .await
            .map_err(|e| gone(id, "trace", format!("its log cannot be read: {e}")));
    };
    trace_from_file(dir, id, last.stop_condition.clone(), last.replays).await
}

/// Runs `work` on a blocking thread (a log is read and rebuilt there, not on the
/// runtime's threads).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(format!("the reader stopped: {e}")))
}

/// A trace read back from `<dir>/<id>.jsonl` (either format): every whole line's record,
/// a log's rebuilt.
async fn trace_from_file(
    dir: &std::path::Path,
    id: &str,
    stop_condition: Option<String>,
    replays: u64,
) -> Result<Vec<u8>, Resp> {
    let path = dir.join(format!("{id}.jsonl"));
    let text = tokio::fs::read(&path).await.map_err(|e| {
        gone(
            id,
            "trace",
            format!("its trace file {} cannot be read: {e}", path.display()),
        )
    })?;
    let id2 = id.to_owned();
    blocking(move || {
        if intercept_trace::is_log(&text) {
            return crate::trace::trace_json(&text, &id2, stop_condition, replays);
        }
        let file = intercept_trace::parse_trace(&text).map_err(|e| e.to_string())?;
        Ok(intercept_core::Trace {
            id: id2,
            stop_condition,
            calls: file.records,
            replays,
        }
        .to_json_vec())
    })
    .await
    .map_err(|e| {
        gone(
            id,
            "trace",
            format!("its trace file {} cannot be read: {e}", path.display()),
        )
    })
}

/// The episode of a released session: from its log held in memory, its log file, or
/// (`trace_format = full`) `<id>.episode.json`.
async fn final_episode(state: &ControlState, id: &str, last: &Last) -> Result<Vec<u8>, Resp> {
    let Some(dir) = &state.config.trace_dir else {
        let Some(log) = last.kept.lock().clone() else {
            return Err(gone(id, "episode", evicted(state)));
        };
        return blocking(move || crate::trace::episode_json(&log))
            .await
            .map_err(|e| gone(id, "episode", format!("its log cannot be read: {e}")));
    };
    if state.config.trace_format == TraceFormat::Log {
        let path = dir.join(format!("{id}.jsonl"));
        let text = tokio::fs::read(&path).await.map_err(|e| {
            gone(
                id,
                "episode",
                format!("its trace file {} cannot be read: {e}", path.display()),
            )
        })?;
        return blocking(move || crate::trace::episode_json(&text))
            .await
            .map_err(|e| gone(id, "episode", format!("its log cannot be read: {e}")));
    }
    let path = dir.join(format!("{id}.episode.json"));
    let mut text = tokio::fs::read(&path).await.map_err(|e| {
        gone(
            id,
            "episode",
            format!("its episode file {} cannot be read: {e}", path.display()),
        )
    })?;
    let trimmed = text.trim_ascii_end().len();
    text.truncate(trimmed);
    Ok(text)
}

/// The `format` query of `GET /v1/sessions/{id}/trace`: whether the log is asked for.
fn trace_query(query: Option<&str>) -> Result<bool, String> {
    let mut log = false;
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("format", "log") => log = true,
            ("format", "records") => log = false,
            ("format", other) => {
                return Err(format!(
                    "format: expected log (the trace log, docs/traces.md) or records (full \
                     records, the default), got {other:?}"
                ))
            }
            (other, _) => {
                return Err(format!(
                    "unknown query parameter {other:?} (the trace takes only \
                     `format=log|records`)"
                ))
            }
        }
    }
    Ok(log)
}

/// `GET /v1/sessions/{id}/trace?format=log`: the session's log as it stands.
async fn trace_log(state: &ControlState, id: &str) -> Resp {
    let ndjson = |body: Vec<u8>| respond(StatusCode::OK, "application/x-ndjson", body);
    let from_file = || -> Result<std::path::PathBuf, Box<Resp>> {
        let Some(dir) = &state.config.trace_dir else {
            return Err(Box::new(unknown(&Method::GET, id)));
        };
        if state.config.trace_format != TraceFormat::Log {
            return Err(Box::new(error(Error::Conflict(format!(
                "session {id:?} is written with trace_format = full: its file holds full \
                 records, not the log; read GET /v1/sessions/{id}/trace"
            )))));
        }
        Ok(dir.join(format!("{id}.jsonl")))
    };
    let path = match view_of(state, id) {
        Some(View::Live(session)) if session.calls_in_memory() => return ndjson(session.log()),
        Some(View::Live(_)) => {
            state.flush_traces().await;
            from_file()
        }
        Some(View::Released(last)) => match last.kept.lock().clone() {
            Some(log) => return ndjson(log.to_vec()),
            None if state.config.trace_dir.is_none() => {
                return gone(id, "trace", evicted(state));
            }
            None => from_file(),
        },
        None => return unknown(&Method::GET, id),
    };
    let path = match path {
        Ok(p) => p,
        Err(resp) => return *resp,
    };
    match tokio::fs::read(&path).await {
        Ok(text) => ndjson(text),
        Err(e) => gone(
            id,
            "trace",
            format!("its trace file {} cannot be read: {e}", path.display()),
        ),
    }
}

async fn trace(state: &ControlState, id: &str) -> Resp {
    match view_of(state, id) {
        Some(View::Live(session)) if !session.calls_in_memory() => {
            // The trace file is the trace: write what is queued, then read it back.
            state.flush_traces().await;
            let Some(dir) = &state.config.trace_dir else {
                return respond(
                    StatusCode::OK,
                    "application/json",
                    session.trace().to_json_vec(),
                );
            };
            let stop = intercept_core::Session::stop_condition(&*session);
            match trace_from_file(dir, id, stop, session.replays()).await {
                Ok(body) => respond(StatusCode::OK, "application/json", body),
                Err(resp) => resp,
            }
        }
        Some(View::Live(session)) => respond(
            StatusCode::OK,
            "application/json",
            session.trace().to_json_vec(),
        ),
        Some(View::Released(last)) => match final_trace(state, id, &last).await {
            Ok(body) => respond(StatusCode::OK, "application/json", body),
            Err(resp) => resp,
        },
        None => unknown(&Method::GET, id),
    }
}

async fn episode(state: &ControlState, id: &str) -> Resp {
    match view_of(state, id) {
        Some(View::Live(session)) => respond(
            StatusCode::OK,
            "application/json",
            serde_json::to_vec(&session.episode()).unwrap_or_else(|e| {
                serde_json::to_vec(
                    &json!({ "error": format!("the episode cannot be serialised: {e}") }),
                )
                .unwrap_or_default()
            }),
        ),
        Some(View::Released(last)) => match final_episode(state, id, &last).await {
            Ok(body) => respond(StatusCode::OK, "application/json", body),
            Err(resp) => resp,
        },
        None => unknown(&Method::GET, id),
    }
}

/// The `episode` query flag of `DELETE /v1/sessions/{id}`.
fn episode_flag(query: Option<&str>) -> Result<bool, String> {
    let mut with = false;
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (key, value) = pair.split_once('=').unwrap_or((pair, "true"));
        match (key, value) {
            ("episode", "true" | "1") => with = true,
            ("episode", "false" | "0") => with = false,
            ("episode", other) => {
                return Err(format!("episode: expected true or false, got {other:?}"))
            }
            (other, _) => {
                return Err(format!(
                    "unknown query parameter {other:?} (DELETE takes only `episode=true|false`)"
                ))
            }
        }
    }
    Ok(with)
}

/// Extra time a `DELETE` waits for a release beyond `shutdown_grace` (the grace of the
/// calls it cancels).
pub const RELEASE_WAIT_MARGIN: std::time::Duration = std::time::Duration::from_secs(5);

/// `DELETE /v1/sessions/{id}`: the first one starts the release (in a task of its own,
/// so a client that goes away cannot cut it short); every one, first or not, waits until
/// the release finished and answers the final trace.
async fn delete(state: &Arc<ControlState>, id: &str, with_episode: bool) -> Resp {
    let (done, start) = {
        let mut sessions = state.sessions.lock();
        let Some(held) = sessions.get_mut(id) else {
            return unknown(&Method::DELETE, id);
        };
        if !held.released && held.guard.is_none() {
            return error(Error::Conflict(format!(
                "session {id:?} is still being created; retry"
            )));
        }
        held.released = true;
        let start = held
            .guard
            .take()
            .and_then(|g| Some((held.session.clone()?, g)));
        (held.done.clone(), start)
    };
    if let Some((session, guard)) = start {
        let state = state.clone();
        let id = id.to_owned();
        let task = state.clone();
        task.releases
            .spawn(async move { state.finish_release(&id, session, guard).await });
    }
    let wait = state.config.shutdown_grace + RELEASE_WAIT_MARGIN;
    if tokio::time::timeout(wait, done.token.cancelled())
        .await
        .is_err()
    {
        return error(Error::Unavailable(format!(
            "the release of session {id:?} has not finished after {:.0} s (a call in flight \
                 has not ended yet); retry the DELETE for the final trace",
            wait.as_secs_f64()
        )));
    }
    let Some(last) = done.last.get().cloned() else {
        return unknown(&Method::DELETE, id);
    };
    let mut answer = match final_trace(state, id, &last).await {
        Ok(a) => a,
        Err(resp) => return resp,
    };
    if with_episode && answer.last() == Some(&b'}') {
        // The trace is an object: the episode goes in as one more member.
        let episode = match final_episode(state, id, &last).await {
            Ok(e) => e,
            Err(resp) => return resp,
        };
        answer.pop();
        answer.extend_from_slice(b",\"episode\":");
        answer.extend_from_slice(&episode);
        answer.push(b'}');
    }
    respond(StatusCode::OK, "application/json", answer)
}

async fn interception(state: &ControlState) -> Resp {
    let servers = state.server.servers().await;
    ok_json(
        StatusCode::OK,
        &json!({
            "shape": state.config.interception.as_str(),
            "tunnel": state.config.tunnel.as_str(),
            "load": state.server.load(),
            "servers": servers,
            "pause": state.server.pause_status(),
        }),
    )
}

/// Default longest hold of `POST /v1/pause` in mode `hold` (seconds).
pub const DEFAULT_HOLD_SECS: f64 = 600.0;

/// Default `Retry-After` of `POST /v1/pause` in mode `reject` (seconds).
pub const DEFAULT_RETRY_AFTER_SECS: f64 = 5.0;

fn parse_pause(body: &[u8]) -> Result<intercept_core::PauseMode, String> {
    let fields: Map<String, Value> = if body.iter().all(u8::is_ascii_whitespace) {
        Map::new()
    } else {
        match serde_json::from_slice(body) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err("the body must be a JSON object".into()),
            Err(e) => return Err(format!("the body is not valid JSON: {e}")),
        }
    };
    for key in fields.keys() {
        if !matches!(key.as_str(), "mode" | "timeout_secs" | "retry_after_secs") {
            return Err(format!(
                "unknown field {key:?}; known: mode, timeout_secs, retry_after_secs"
            ));
        }
    }
    let secs = |key: &str, default: f64| -> Result<std::time::Duration, String> {
        match fields.get(key) {
            None | Some(Value::Null) => Ok(std::time::Duration::from_secs_f64(default)),
            Some(v) => v
                .as_f64()
                .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
                .ok_or_else(|| format!("{key}: expected a number of seconds (>= 0)")),
        }
    };
    match fields.get("mode").and_then(Value::as_str).unwrap_or("hold") {
        "hold" => Ok(intercept_core::PauseMode::hold(secs(
            "timeout_secs",
            DEFAULT_HOLD_SECS,
        )?)),
        "reject" => Ok(intercept_core::PauseMode::reject(secs(
            "retry_after_secs",
            DEFAULT_RETRY_AFTER_SECS,
        )?)),
        other => Err(format!(
            "mode: {other:?} is not a mode; expected hold or reject"
        )),
    }
}

fn pause_answer(result: Result<intercept_core::PauseStatus, intercept_core::Error>) -> Resp {
    match result {
        Ok(status) => ok_json(
            StatusCode::OK,
            &serde_json::to_value(status).unwrap_or(Value::Null),
        ),
        Err(e) => error(e),
    }
}

/// `POST /v1/pause`: pauses model calls (weight sync) and answers the pause status at
/// once; poll `GET /v1/interception` until `pause.inflight` is 0 before swapping weights.
async fn pause(state: &ControlState, req: Request<Incoming>) -> Resp {
    let body = match Limited::new(req.into_body(), BODY_LIMIT).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return bad(format!("could not read the body: {e}")),
    };
    match parse_pause(&body) {
        Ok(mode) => pause_answer(state.server.pause(mode).await),
        Err(message) => bad(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert!(check_id("rollout-7.a_b").is_ok());
        for bad in ["", ".hidden", "a/b", "..", "sp ace", &"x".repeat(129)] {
            assert!(check_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn create_bodies() {
        let r = parse_create(b"", &[]).unwrap();
        assert!(r.id.is_none() && r.upstream.is_none());
        let r = parse_create(
            br#"{"id":"a","model":"m","sampling":{"temperature":0.5},"limits":{"max_turns":3},
                "upstream":{"base_url":"http://127.0.0.1:9/v1/"},"task":{"q":1}}"#,
            &[],
        )
        .unwrap();
        assert_eq!(r.limits.max_turns, Some(3));
        assert_eq!(r.upstream.unwrap().base_url, "http://127.0.0.1:9/v1");
        assert_eq!(r.sampling["temperature"], 0.5);
        assert!(!r.capture_tokens);
        let r = parse_create(
            br#"{"capture_tokens":true,"upstream":{"base_urls":["http://a:1/v1","http://b:1/v1/"]}}"#,
            &[],
        )
        .unwrap();
        assert!(r.capture_tokens);
        assert!(r.network.is_none());
        let r = parse_create(
            br#"{"network":{"allow":["*.python.org"],"on_violation":"reject"}}"#,
            &[],
        )
        .unwrap();
        let network = r.network.unwrap();
        assert!(network.is_restricted() && network.allows_host("docs.python.org"));
        assert_eq!(network.on_violation(), intercept_core::OnViolation::Reject);
        assert_eq!(
            r.upstream.map(|u| u.base_url),
            None,
            "no upstream was given"
        );
        let r = parse_create(
            br#"{"capture_tokens":true,"upstream":{"base_urls":["http://a:1/v1","http://b:1/v1/"]}}"#,
            &[],
        )
        .unwrap();
        assert_eq!(
            r.upstream.unwrap().engines(),
            ["http://a:1/v1", "http://b:1/v1"]
        );
        assert!(matches!(
            parse_pause(br#"{"mode":"reject","retry_after_secs":2}"#),
            Ok(intercept_core::PauseMode::Reject { retry_after }) if retry_after.as_secs() == 2
        ));
        assert!(matches!(
            parse_pause(b""),
            Ok(intercept_core::PauseMode::Hold { .. })
        ));
        for bad in [
            &br#"{"mode":"nap"}"#[..],
            br#"{"timeout_secs":-1}"#,
            br#"{"wait":1}"#,
        ] {
            assert!(parse_pause(bad).is_err());
        }
        for (body, needle) in [
            (&br#"[1]"#[..], "JSON object"),
            (b"{", "not valid JSON"),
            (br#"{"idd":"a"}"#, "\"idd\""),
            (br#"{"id":5}"#, "id:"),
            (br#"{"model":""}"#, "model:"),
            (br#"{"sampling":3}"#, "sampling:"),
            (br#"{"limits":{"max_turn":3}}"#, "limits:"),
            (br#"{"limits":{"max_turns":-3}}"#, "limits:"),
            (br#"{"upstream":{"base_url":"ftp://x"}}"#, "upstream.base_url"),
            (br#"{"upstream":{}}"#, "upstream.base_url"),
            (br#"{"upstream":{"url":"http://x"}}"#, "upstream:"),
            (br#"{"upstream":{"base_urls":[]}}"#, "upstream.base_urls"),
            (br#"{"upstream":{"base_urls":["ftp://x"]}}"#, "upstream.base_urls[0]"),
            (
                br#"{"upstream":{"base_url":"http://a/v1","base_urls":["http://b/v1"]}}"#,
                "not both",
            ),
            (br#"{"capture_tokens":"yes"}"#, "capture_tokens"),
            (br#"{"network":{"allow":["http://x.org"]}}"#, "network: network.allow: host pattern"),
            (br#"{"network":{"allow":"*"}}"#, "network:"),
            (br#"{"network":{"deny":[]}}"#, "network:"),
            (br#"{"network":{"on_violation":"drop"}}"#, "network:"),
            (
                br#"{"upstream":{"base_url":"http://x","api_key_env":"INTERCEPT_TEST_SURELY_UNSET_VAR"}}"#,
                "upstream.api_key_env",
            ),
        ] {
            let allowed = ["INTERCEPT_TEST_SURELY_UNSET_VAR".to_owned()];
            let e = parse_create(body, &allowed).err().unwrap();
            assert!(e.contains(needle), "{}: {e}", String::from_utf8_lossy(body));
        }
        // A variable the sidecar does not allow is refused before it is read.
        let body = br#"{"upstream":{"base_url":"http://x","api_key_env":"HOME"}}"#;
        let e = parse_create(body, &["MY_KEY".to_owned()]).err().unwrap();
        assert!(
            e.contains("\"HOME\" is not a variable") && e.contains("allowed: MY_KEY"),
            "{e}"
        );
        let e = parse_create(body, &[]).err().unwrap();
        assert!(e.contains("none is allowed"), "{e}");
    }
}
