//! A session's trace and episode: live from its log, or after release from its trace
//! file or the last copy kept.

use super::*;

/// The final trace of a released session: rebuilt from its log held in memory, or (with
/// a trace directory) read back from its file.
pub(super) async fn final_trace(
    state: &ControlState,
    id: &str,
    last: &Last,
) -> Result<Vec<u8>, Resp> {
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
pub(super) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(format!("the reader stopped: {e}")))
}

/// A trace read back from `<dir>/<id>.jsonl` (either format): every whole line's record,
/// a log's rebuilt.
pub(super) async fn trace_from_file(
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
    blocking(move || crate::trace::trace_json(&text, &id2, stop_condition, replays))
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
pub(super) async fn final_episode(
    state: &ControlState,
    id: &str,
    last: &Last,
) -> Result<Vec<u8>, Resp> {
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
pub(super) fn trace_query(query: Option<&str>) -> Result<bool, String> {
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
pub(super) async fn trace_log(state: &ControlState, id: &str) -> Resp {
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

pub(super) async fn trace(state: &ControlState, id: &str) -> Resp {
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

pub(super) async fn episode(state: &ControlState, id: &str) -> Resp {
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
pub(super) fn episode_flag(query: Option<&str>) -> Result<bool, String> {
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
