//! `POST /v1/sessions`: the request read and checked, the session built, its trace
//! opened, registered.

use super::*;

/// What `POST /v1/sessions` may carry.
pub(super) struct CreateRequest {
    pub(super) id: Option<String>,
    pub(super) model: Option<String>,
    pub(super) sampling: Sampling,
    pub(super) limits: Limits,
    pub(super) upstream: Option<Upstream>,
    pub(super) task: Option<Value>,
    pub(super) capture_tokens: bool,
    pub(super) network: Option<NetworkPolicy>,
    pub(super) tokens: TokensField,
}

/// The `tokens` field of `POST /v1/sessions`.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum TokensField {
    /// Absent: the sidecar's default (`tokens` setting), if any.
    Default,
    /// `null` or `false`: off, whatever the default.
    Off,
    /// An object (its keys checked): merged over the default's keys.
    Merge(Map<String, Value>),
}

pub(super) fn bad(message: impl Into<String>) -> Resp {
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
pub(super) fn parse_create(
    body: &[u8],
    allowed_key_envs: &[String],
) -> Result<CreateRequest, String> {
    let mut out = CreateRequest {
        id: None,
        model: None,
        sampling: Sampling::new(),
        limits: Limits::default(),
        upstream: None,
        task: None,
        capture_tokens: false,
        network: None,
        tokens: TokensField::Default,
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
            "tokens" => {
                out.tokens = match v {
                    Value::Null | Value::Bool(false) => TokensField::Off,
                    Value::Object(map) => {
                        check_tokens_patch("tokens", map)?;
                        TokensField::Merge(map.clone())
                    }
                    _ => {
                        return Err(format!(
                            "tokens: expected an object of {TOKENS_FIELDS} (merged over the \
                             sidecar's `tokens` default), or null or false to turn the \
                             default off"
                        ))
                    }
                }
            }
            other => {
                return Err(format!(
                    "unknown field {other:?}; known: id, model, sampling, limits, upstream, task, \
                     capture_tokens, network, tokens"
                ))
            }
        }
    }
    Ok(out)
}

pub(super) fn parse_upstream(
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

pub(super) async fn create(state: &Arc<ControlState>, req: Request<Incoming>) -> Resp {
    try_create(state, req).await.unwrap_or_else(|resp| *resp)
}

/// `POST /v1/sessions` as its stages: read the request, fill in the sidecar's defaults,
/// open the trace file, build the session, register it and take a slot, answer; `Err`
/// is the answer of the stage that refused (boxed, as large).
pub(super) async fn try_create(
    state: &Arc<ControlState>,
    req: Request<Incoming>,
) -> Result<Resp, Box<Resp>> {
    let mut request = read_create(state, req).await?;
    let (id, model, upstream) = resolve_create(state, &mut request)?;
    let tokens =
        resolve_tokens(state, &request.tokens).map_err(|message| Box::new(bad(message)))?;
    let sink = open_trace(state, &id)?;
    let session = build_session(
        state,
        Resolved {
            id: id.clone(),
            model,
            upstream,
            tokens,
        },
        request,
        sink.as_ref(),
    );
    let slot = register(state, &id, session, sink).await?;
    Ok(created(state, &id, &slot))
}

/// Refuses while shutting down, reads the body (up to [`BODY_LIMIT`]) and parses it.
pub(super) async fn read_create(
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
pub(super) fn resolve_create(
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

/// The session's token-in/token-out: its `tokens` object merged over the sidecar's
/// default, the default, or none.
pub(super) fn resolve_tokens(
    state: &ControlState,
    field: &TokensField,
) -> Result<Option<TokensConfig>, String> {
    let default = state.config.tokens.as_ref();
    match field {
        TokensField::Default => Ok(default.cloned()),
        TokensField::Off => Ok(None),
        TokensField::Merge(patch) => merge_tokens(default, patch).map(Some),
    }
}

/// What a session is made of beyond its request: the resolved id, model, upstream and
/// token-in/token-out.
pub(super) struct Resolved {
    pub(super) id: String,
    pub(super) model: String,
    pub(super) upstream: Upstream,
    pub(super) tokens: Option<TokensConfig>,
}

/// Creates the session's trace file `<trace_dir>/<id>.jsonl` (never an existing one) and
/// its queued sink; `None` without a trace directory.
pub(super) fn open_trace(
    state: &ControlState,
    id: &str,
) -> Result<Option<Arc<QueuedSink>>, Box<Resp>> {
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
pub(super) fn build_session(
    state: &ControlState,
    resolved: Resolved,
    request: CreateRequest,
    sink: Option<&Arc<QueuedSink>>,
) -> Arc<RolloutSession> {
    let Resolved {
        id,
        model,
        upstream,
        tokens,
    } = resolved;
    let mut config = SessionConfig::new(id, model, upstream);
    if let Some(tokens) = tokens {
        config = config.with_tokens(tokens);
    }
    let mut session = RolloutSession::new(
        config
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
pub(super) async fn register(
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
        // The session's own settings were refused (an unknown renderer, a tokenizer
        // that cannot be read): the client's error, as the server words it.
        Err(e @ Error::InvalidRequest(_)) => {
            forget_unacquired(state, id);
            info!(session = %id, error = %e, "session refused");
            return Err(Box::new(error(e)));
        }
        Err(e) => {
            forget_unacquired(state, id);
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

/// Forgets a session that never had a slot, and removes its trace file (it holds the
/// header alone), so that the same id can be created again.
fn forget_unacquired(state: &ControlState, id: &str) {
    let held = state.sessions.lock().remove(id);
    if let Some(sink) = held.as_ref().and_then(|h| h.sink.as_ref()) {
        if let Err(e) = std::fs::remove_file(sink.path()) {
            warn!(session = %id, path = %sink.path().display(), error = %e, "cannot remove the trace file");
        }
    }
}

/// Counts and logs the created session and answers `201` with its slot and harness env.
pub(super) fn created(state: &ControlState, id: &str, slot: &Slot) -> Resp {
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

pub(super) fn duplicate(id: &str) -> Resp {
    error(Error::Conflict(format!(
        "a session with id {id:?} already exists; ids must be unique"
    )))
}

/// A generated id: `session-<run>-<n>`, `<run>` the 8 hex digits drawn at start (see
/// [`ControlState::run_id`]), so ids of two runs never collide.
pub(super) fn generate_id(state: &ControlState) -> Option<String> {
    let sessions = state.sessions.lock();
    (0..1024).find_map(|_| {
        let n = state.next_id.fetch_add(1, Ordering::Relaxed);
        let id = format!("session-{}-{n}", state.run_id);
        (!sessions.contains_key(&id)).then_some(id)
    })
}
