//! The control API: create and release sessions, read their traces, metrics and health.
//!
//! Every route but `GET /healthz` needs `Authorization: Bearer <token>`; every error is
//! `{"error": {"message", "type"}}`.
//!
//! | route | answer |
//! |---|---|
//! | `POST /v1/sessions` | `201` `{id, base_url, model_secret, state_secret, env}` |
//! | `GET /v1/sessions` | `{"sessions": [{id, status, calls}]}` |
//! | `GET /v1/sessions/{id}` | `{id, status, stop_condition, calls, usage, endpoint_lost, tokens}` |
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
    SessionStatus, Slot, SlotGuard, TokensConfig, Upstream,
};
use serde_json::{json, Map, Value};
use tracing::{info, warn};

use intercept_server::{render, render_message, Shape};

use crate::config::{check_base_url, check_tokens_patch, merge_tokens, TOKENS_FIELDS};
use intercept_trace::{JsonlSink, QueuedSink, TraceFormat};

mod create;
mod state;
mod traces;

pub(crate) use state::ControlState;
use state::{Held, Last};

pub use create::check_id;
use create::*;
use traces::*;

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
    let authorized = intercept_core::internal::bearer(req.headers())
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
            "tokens": held.tokens,
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

/// Serves the control API on `listener` until `stop` fires.
pub(crate) async fn serve_api(
    listener: tokio::net::TcpListener,
    state: Arc<ControlState>,
    stop: tokio_util::sync::CancellationToken,
) {
    let options = intercept_server::ServeOptions {
        header_read_timeout: state.config.header_read_timeout,
        max_connections: state.config.max_connections,
    };
    let service = hyper::service::service_fn(move |req| {
        let state = state.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(state, req).await) }
    });
    let serve = intercept_server::serve_connections(
        listener,
        move |_: &intercept_server::Connection| service.clone(),
        options,
        stop.cancelled_owned(),
    );
    tracing::Instrument::instrument(serve, tracing::info_span!("control_api")).await
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
            (br#"{"tokens":"qwen3"}"#, "tokens: expected an object of renderer"),
            (br#"{"tokens":true}"#, "null or false to turn the default off"),
            (br#"{"tokens":{"renderer":5}}"#, "tokens.renderer: expected a string"),
            (br#"{"tokens":{"tokenizer":" "}}"#, "tokens.tokenizer: must not be empty"),
            (br#"{"tokens":{"engine":"tgi"}}"#, "tokens.engine: unknown variant `tgi`"),
            (br#"{"tokens":{"on_mismatch":"retry"}}"#, "tokens.on_mismatch: unknown variant `retry`"),
            (br#"{"tokens":{"enable_thinking":"yes"}}"#, "tokens.enable_thinking: expected true"),
            (br#"{"tokens":{"thinking":true}}"#, "tokens: unknown field \"thinking\"; the fields are renderer"),
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

    #[test]
    fn tokens_fields() {
        use intercept_core::{OnMismatch, TokenEngine};
        let tokens = |body: &[u8]| parse_create(body, &[]).unwrap().tokens;
        assert_eq!(tokens(b"{}"), TokensField::Default);
        assert_eq!(tokens(br#"{"tokens":null}"#), TokensField::Off);
        assert_eq!(tokens(br#"{"tokens":false}"#), TokensField::Off);
        let TokensField::Merge(patch) = tokens(br#"{"tokens":{"enable_thinking":false}}"#) else {
            panic!("an object is merged")
        };
        // Over a default: the default's keys, the session's replacing them.
        let mut default = TokensConfig::new("qwen3", "/models/qwen3");
        default.engine = TokenEngine::Sglang;
        let merged = merge_tokens(Some(&default), &patch).unwrap();
        assert_eq!(merged.enable_thinking, Some(false));
        assert_eq!(merged.engine, TokenEngine::Sglang);
        assert_eq!(merged.tokenizer, "/models/qwen3");
        // Without one, renderer and tokenizer are required.
        let e = merge_tokens(None, &patch).unwrap_err();
        assert!(
            e.contains("missing field `renderer`") && e.contains("no `tokens` default"),
            "{e}"
        );
        // `null` unsets a key of the default.
        default.enable_thinking = Some(true);
        let TokensField::Merge(patch) =
            tokens(br#"{"tokens":{"enable_thinking":null,"on_mismatch":"chat","tokenizer":"/t"}}"#)
        else {
            panic!("an object is merged")
        };
        let merged = merge_tokens(Some(&default), &patch).unwrap();
        assert_eq!(merged.enable_thinking, None);
        assert_eq!(merged.on_mismatch, OnMismatch::Chat);
        assert_eq!(merged.tokenizer, "/t");
        assert_eq!(merged.renderer, "qwen3");
    }
}
