//! The accept loop, connection tasks and request handler.

use std::future::Future;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use serde::{Deserialize, Serialize};

use super::anthropic::{self, MessagesRequest};
use super::body::{Disconnect, MockBody};
use super::chat::{self, ChatRequest, Conversation};
use super::config::unix_now;
use super::log::{header_map, ReceivedRequest, RequestBody};
use super::reply::{
    anthropic_error_type, error_type, status_for_error_type, Completion, Reply, ReplyKind,
    StreamError, ANTHROPIC_CONTEXT_LENGTH_MESSAGE, CONTEXT_LENGTH_MESSAGE,
    SGLANG_CONTEXT_LENGTH_MESSAGE, VLLM_CONTEXT_LENGTH_MESSAGE,
};
use super::responses::{self, ResponsesRequest};
use super::tokens::Output;
use super::{sglang, vllm};
use super::{
    MockConfig, Shared, CHAT_COMPLETIONS_PATH, COUNT_TOKENS_PATH, MESSAGES_PATH,
    MODELS_MAX_MODEL_LEN, MODELS_PATH, RESPONSES_PATH, SGLANG_GENERATE_PATH, VLLM_GENERATE_PATH,
};

/// Runs hyper's background futures (HTTP/2 streams) as tasks of the server, ended on
/// shutdown like the connections.
#[derive(Debug, Clone)]
struct TrackedExecutor {
    tracker: TaskTracker,
    token: CancellationToken,
}

impl<F> hyper::rt::Executor<F> for TrackedExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        // A child token per task: polling `cancelled()` locks the token's waiter list, and
        // a child has its own, so busy tasks do not contend on the server's token.
        let token = self.token.child_token();
        self.tracker.spawn(async move {
            tokio::select! {
                biased;
                () = token.cancelled() => {}
                _ = future => {}
            }
        });
    }
}

/// Decrements the open-connection count when a connection task ends.
struct OpenConnection(Arc<Shared>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open_connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts connections until the token is cancelled; each is served by its own task.
pub(crate) async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, tracker: TaskTracker) {
    let token = shared.token.clone();
    let builder = auto::Builder::new(TrackedExecutor {
        tracker: tracker.clone(),
        token: token.clone(),
    });
    loop {
        let accepted = tokio::select! {
            biased;
            () = token.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(err) if is_per_connection(&err) => continue,
            Err(err) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(%err, "mock upstream: accept failed");
                tokio::select! {
                    () = token.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(10)) => continue,
                }
            }
        };
        // Latency matters more than packet count for small SSE events.
        let _ = stream.set_nodelay(true);
        let connection = shared.connections.fetch_add(1, Ordering::SeqCst) + 1;
        shared.open_connections.fetch_add(1, Ordering::SeqCst);
        shared.wake();

        let service_shared = Arc::clone(&shared);
        let service =
            service_fn(move |request| handle(Arc::clone(&service_shared), connection, request));
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let open = OpenConnection(Arc::clone(&shared));
        let token = token.child_token();
        tracker.spawn(async move {
            let _open = open;
            tokio::select! {
                biased;
                () = token.cancelled() => {}
                result = conn => {
                    if let Err(err) = result {
                        tracing::debug!(%err, connection, "mock upstream: connection ended with an error");
                    }
                }
            }
        });
    }
}

/// Accept errors that concern one connection only, so accepting goes on at once.
fn is_per_connection(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// The routes the mock answers by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Chat,
    Responses,
    Messages,
    CountTokens,
    VllmGenerate,
    SglangGenerate,
}

impl Route {
    fn of(path: &str) -> Option<Self> {
        match path {
            CHAT_COMPLETIONS_PATH => Some(Route::Chat),
            RESPONSES_PATH => Some(Route::Responses),
            MESSAGES_PATH => Some(Route::Messages),
            COUNT_TOKENS_PATH => Some(Route::CountTokens),
            VLLM_GENERATE_PATH => Some(Route::VllmGenerate),
            SGLANG_GENERATE_PATH => Some(Route::SglangGenerate),
            _ => None,
        }
    }

    fn dialect(self) -> Dialect {
        match self {
            Route::Chat => Dialect::Chat,
            Route::Responses => Dialect::Responses,
            Route::Messages | Route::CountTokens => Dialect::Anthropic,
            Route::VllmGenerate => Dialect::Vllm,
            Route::SglangGenerate => Dialect::Sglang,
        }
    }

    /// The methods the route answers: `POST`, and `PUT` too on SGLang's `/generate`.
    fn allows(self, method: &Method) -> bool {
        method == Method::POST || (self == Route::SglangGenerate && method == Method::PUT)
    }

    fn allow_header(self) -> &'static str {
        match self {
            Route::SglangGenerate => "POST, PUT",
            _ => "POST",
        }
    }
}

/// The wire format replies and errors are rendered in (Chat for paths of no dialect).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Chat,
    Responses,
    Anthropic,
    /// vLLM's `/inference/v1/generate`.
    Vllm,
    /// SGLang's `/generate`.
    Sglang,
}

/// Answers one request. `Err` makes hyper drop the connection without a response.
async fn handle(
    shared: Arc<Shared>,
    connection: usize,
    request: Request<Incoming>,
) -> Result<Response<MockBody>, Disconnect> {
    let received_at = Instant::now();
    let (parts, body) = request.into_parts();
    let route = Route::of(parts.uri.path());
    let dialect = route.map_or(Dialect::Chat, Route::dialect);
    let body = match Limited::new(body, shared.config.max_body_bytes)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => {
            record(&shared, &parts, &Bytes::new(), connection, received_at);
            let message = format!(
                "request body is larger than the mock's limit of {} bytes",
                shared.config.max_body_bytes
            );
            return Ok(error_response(
                dialect,
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
                &message,
            ));
        }
        // The client went away or broke the framing: nothing to answer.
        Err(_) => return Err(Disconnect),
    };
    record(&shared, &parts, &body, connection, received_at);
    if parts.method == Method::GET && parts.uri.path() == MODELS_PATH {
        return Ok(models(&shared));
    }

    // `count_tokens` never takes a scripted reply: clients call it between turns.
    let accepted = match route {
        Some(route) => route.allows(&parts.method),
        None => parts.method == Method::POST,
    };
    let scripted = if accepted && route != Some(Route::CountTokens) {
        shared.pop_reply()
    } else {
        None
    };
    let reply = match (scripted, route) {
        (Some(reply), _) => reply,
        (None, None) => {
            let message = format!("Invalid URL ({} {})", parts.method, parts.uri.path());
            return Ok(error_response(
                dialect,
                StatusCode::NOT_FOUND,
                None,
                &message,
            ));
        }
        (None, Some(route)) if !accepted => {
            let message = format!(
                "Method {} is not allowed on {}; use {}",
                parts.method,
                parts.uri.path(),
                route.allow_header()
            );
            let mut response =
                error_response(dialect, StatusCode::METHOD_NOT_ALLOWED, None, &message);
            response
                .headers_mut()
                .insert(ALLOW, HeaderValue::from_static(route.allow_header()));
            return Ok(response);
        }
        (None, Some(Route::CountTokens)) => return Ok(count_tokens(&body)),
        (None, Some(_)) => Reply::echo(),
    };
    let request_id = parts
        .headers
        .get("x-request-id")
        .and_then(|value| value.to_str().ok());
    respond(&shared, dialect, &body, reply, request_id).await
}

/// Counts the request and, with the log on, logs it; then wakes waiters.
fn record(shared: &Shared, parts: &Parts, body: &Bytes, connection: usize, received_at: Instant) {
    if shared.config.log_requests {
        let mut entry = ReceivedRequest {
            seq: 0,
            connection,
            method: parts.method.clone(),
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().map(str::to_owned),
            version: parts.version,
            headers: header_map(&parts.headers),
            body: RequestBody::from_bytes(body),
            received_at,
        };
        // Count under the log's lock, so a request that is counted is also in the log.
        let mut log = shared.log.lock();
        entry.seq = shared.requests.fetch_add(1, Ordering::SeqCst);
        log.push(entry);
    } else {
        shared.requests.fetch_add(1, Ordering::SeqCst);
    }
    shared.wake();
}

/// Sends a reply (after its header delay), in the route's dialect.
async fn respond(
    shared: &Shared,
    dialect: Dialect,
    body: &Bytes,
    reply: Reply,
    request_id: Option<&str>,
) -> Result<Response<MockBody>, Disconnect> {
    let config = &shared.config;
    let header_delay = reply.header_delay.unwrap_or(config.header_delay);
    if !header_delay.is_zero() {
        tokio::time::sleep(header_delay).await;
    }
    let chunk_delay = reply.chunk_delay.unwrap_or(config.chunk_delay);
    let mut response = match &reply.kind {
        ReplyKind::Hang => {
            shared.token.cancelled().await;
            return Err(Disconnect);
        }
        ReplyKind::Drop => return Err(Disconnect),
        ReplyKind::Fixed {
            status,
            content_type,
            body,
        } => full_response(
            *status,
            content_type.clone(),
            body.clone(),
            reply.disconnect_after,
        ),
        ReplyKind::Error { status, message } => json_response(
            *status,
            error_body(dialect, *status, None, message),
            reply.disconnect_after,
        ),
        ReplyKind::ContextLength => json_response(
            StatusCode::BAD_REQUEST,
            context_length_body(dialect),
            reply.disconnect_after,
        ),
        ReplyKind::Failed { code, message } => {
            failed_response(shared, dialect, body, code, message, &reply, chunk_delay)
        }
        ReplyKind::Events(events) => {
            let (events, abort) = cut(events.clone(), reply.disconnect_after);
            sse_response(MockBody::frames(events, chunk_delay, abort))
        }
        ReplyKind::Completion(completion) => match dialect {
            Dialect::Chat => chat_response(shared, body, completion, &reply, chunk_delay),
            Dialect::Responses => responses_response(shared, body, completion, &reply, chunk_delay),
            Dialect::Anthropic => messages_response(shared, body, completion, &reply, chunk_delay),
            Dialect::Vllm => output_response(
                vllm::respond(shared, body, completion, &reply, request_id),
                &reply,
                chunk_delay,
            ),
            Dialect::Sglang => output_response(
                sglang::respond(shared, body, completion, &reply),
                &reply,
                chunk_delay,
            ),
        },
    };
    for (name, value) in &reply.headers {
        response.headers_mut().append(name.clone(), value.clone());
    }
    Ok(response)
}

/// Parses the request a completion answers. Only the echo needs it: for a scripted
/// completion an unreadable body gives the default (empty) request.
fn parse_request<'b, T: Deserialize<'b> + Default>(
    body: &'b Bytes,
    completion: &Completion,
) -> Result<T, serde_json::Error> {
    match serde_json::from_slice(body) {
        Ok(request) => Ok(request),
        Err(err) if completion.echo => Err(err),
        Err(_) => Ok(T::default()),
    }
}

/// The number of the next answer (for its id).
fn next_number(shared: &Shared) -> u64 {
    shared.next_number()
}

/// A token route's answer framed as a response.
fn output_response(output: Output, reply: &Reply, chunk_delay: Duration) -> Response<MockBody> {
    match output {
        Output::Json(status, body) => json_response(status, body, reply.disconnect_after),
        Output::Stream(events) => {
            let (events, abort) = cut(events, reply.disconnect_after);
            sse_response(MockBody::frames(events, chunk_delay, abort))
        }
        Output::Error(status, body) => json_response(status, body, None),
    }
}

/// A stream error sent to a request that did not ask for a stream: an HTTP error.
fn stream_error_response(
    dialect: Dialect,
    error: &StreamError,
    reply: &Reply,
) -> Response<MockBody> {
    let status = status_for_error_type(&error.kind);
    json_response(
        status,
        error_body(dialect, status, Some(&error.kind), &error.message),
        reply.disconnect_after,
    )
}

/// The reply resolved against the request, its tool calls without an id numbered by
/// the server (`<call_prefix><N>`).
fn resolve<'a>(
    shared: &'a Shared,
    completion: &'a Completion,
    request: &'a dyn chat::Conversation,
    call_prefix: &str,
) -> chat::Answer<'a> {
    let mut next_call_id = || shared.call_ids.fetch_add(1, Ordering::Relaxed) + 1;
    chat::resolve(
        completion,
        request,
        &shared.config.default_model,
        call_prefix,
        &mut next_call_id,
    )
}

/// A request of `dialect` read and checked: parsed (400 when it is not), holding its
/// conversation when the reply echoes (400 with `missing`), and a scripted stream error
/// answered as a JSON error when the request asks for no stream.
fn checked_request<'b, R: Deserialize<'b> + Default + chat::Conversation>(
    body: &'b Bytes,
    completion: &Completion,
    reply: &Reply,
    dialect: Dialect,
    missing: &str,
) -> Result<R, Box<Response<MockBody>>> {
    let request: R =
        parse_request(body, completion).map_err(|err| Box::new(bad_request(dialect, &err)))?;
    if completion.echo && !request.has_input() {
        let response = error_response(dialect, StatusCode::BAD_REQUEST, None, missing);
        return Err(Box::new(response));
    }
    if let Some(error) = completion
        .stream_error
        .as_ref()
        .filter(|_| !request.streams())
    {
        return Err(Box::new(stream_error_response(dialect, error, reply)));
    }
    Ok(request)
}

/// A chat completion as JSON or as a stream, as the request asks.
fn chat_response(
    shared: &Shared,
    body: &Bytes,
    completion: &Completion,
    reply: &Reply,
    chunk_delay: Duration,
) -> Response<MockBody> {
    let config = &shared.config;
    let request: ChatRequest<'_> = match checked_request(
        body,
        completion,
        reply,
        Dialect::Chat,
        "'messages' is a required property",
    ) {
        Ok(request) => request,
        Err(response) => return *response,
    };
    let answer = resolve(shared, completion, &request, "call_");
    let id = format!("chatcmpl-mock-{}", next_number(shared));
    let created = config.created.unwrap_or_else(unix_now);
    if request.is_stream() {
        let error = completion.stream_error.as_ref();
        let shape = chat::StreamShape {
            chunks: reply.chunks.unwrap_or(config.chunks),
            include_usage: request.include_usage() && error.is_none(),
            crlf: reply.crlf,
            done: reply.done && error.is_none(),
        };
        let mut events = chat::render_stream(&answer, &id, created, shape);
        if let Some(error) = error {
            // Without usage and [DONE] the last event is the finish chunk: the error
            // takes its place.
            events.pop();
            let eol = if reply.crlf { "\r\n" } else { "\n" };
            let body = error_body(
                Dialect::Chat,
                StatusCode::INTERNAL_SERVER_ERROR,
                Some(&error.kind),
                &error.message,
            );
            let mut event = Vec::with_capacity(body.len() + 10);
            event.extend_from_slice(b"data: ");
            event.extend_from_slice(&body);
            event.extend_from_slice(eol.as_bytes());
            event.extend_from_slice(eol.as_bytes());
            events.push(Bytes::from(event));
        }
        let (events, abort) = cut(events, reply.disconnect_after);
        sse_response(MockBody::frames(events, chunk_delay, abort))
    } else {
        let json = chat::render_json(&answer, &id, created);
        json_response(StatusCode::OK, json, reply.disconnect_after)
    }
}

/// A Responses answer as JSON or as a stream, as the request asks.
fn responses_response(
    shared: &Shared,
    body: &Bytes,
    completion: &Completion,
    reply: &Reply,
    chunk_delay: Duration,
) -> Response<MockBody> {
    let config = &shared.config;
    let request: ResponsesRequest<'_> = match checked_request(
        body,
        completion,
        reply,
        Dialect::Responses,
        "Missing required parameter: 'input'.",
    ) {
        Ok(request) => request,
        Err(response) => return *response,
    };
    let answer = resolve(shared, completion, &request, "call_");
    let meta = responses::Meta {
        number: next_number(shared),
        created: config.created.unwrap_or_else(unix_now),
        model: answer.model,
        instructions: request.instructions(),
    };
    if request.is_stream() {
        let events = responses::render_stream(
            &answer,
            meta,
            stream_shape(config, reply),
            completion.stream_error.as_ref(),
        );
        let (events, abort) = cut(events, reply.disconnect_after);
        sse_response(MockBody::frames(events, chunk_delay, abort))
    } else {
        let json = responses::render_json(&answer, meta);
        json_response(StatusCode::OK, json, reply.disconnect_after)
    }
}

/// An Anthropic message as JSON or as a stream, as the request asks.
fn messages_response(
    shared: &Shared,
    body: &Bytes,
    completion: &Completion,
    reply: &Reply,
    chunk_delay: Duration,
) -> Response<MockBody> {
    let config = &shared.config;
    let request: MessagesRequest<'_> = match checked_request(
        body,
        completion,
        reply,
        Dialect::Anthropic,
        "messages: Field required",
    ) {
        Ok(request) => request,
        Err(response) => return *response,
    };
    let answer = resolve(shared, completion, &request, "toolu_");
    let number = next_number(shared);
    if request.is_stream() {
        let events = anthropic::render_stream(
            &answer,
            number,
            stream_shape(config, reply),
            completion.stream_error.as_ref(),
        );
        let (events, abort) = cut(events, reply.disconnect_after);
        sse_response(MockBody::frames(events, chunk_delay, abort))
    } else {
        let json = anthropic::render_json(&answer, number);
        json_response(StatusCode::OK, json, reply.disconnect_after)
    }
}

fn stream_shape(config: &MockConfig, reply: &Reply) -> responses::StreamShape {
    responses::StreamShape {
        chunks: reply.chunks.unwrap_or(config.chunks),
        crlf: reply.crlf,
        done: reply.done,
        sentinel: reply.sentinel,
    }
}

/// [`Reply::responses_failed`]: a failed response on the Responses route, a 500 elsewhere.
fn failed_response(
    shared: &Shared,
    dialect: Dialect,
    body: &Bytes,
    code: &str,
    message: &str,
    reply: &Reply,
    chunk_delay: Duration,
) -> Response<MockBody> {
    if dialect != Dialect::Responses {
        let status = StatusCode::INTERNAL_SERVER_ERROR;
        return json_response(
            status,
            error_body(dialect, status, None, message),
            reply.disconnect_after,
        );
    }
    let config = &shared.config;
    let request: ResponsesRequest<'_> = serde_json::from_slice(body).unwrap_or_default();
    let meta = responses::Meta {
        number: next_number(shared),
        created: config.created.unwrap_or_else(unix_now),
        model: request.model().unwrap_or(&config.default_model),
        instructions: request.instructions(),
    };
    if request.is_stream() {
        let events =
            responses::render_failed_stream(meta, code, message, stream_shape(config, reply));
        let (events, abort) = cut(events, reply.disconnect_after);
        sse_response(MockBody::frames(events, chunk_delay, abort))
    } else {
        let json = responses::render_failed_json(meta, code, message);
        json_response(StatusCode::OK, json, reply.disconnect_after)
    }
}

/// `GET /v1/models`: a vLLM-like listing of the default model.
fn models(shared: &Shared) -> Response<MockBody> {
    let model = &shared.config.default_model;
    let created = shared.config.created.unwrap_or(MockConfig::FIXED_CREATED);
    let body = serde_json::json!({
        "object": "list",
        "data": [{
            "id": model,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": model,
            "parent": null,
            "max_model_len": MODELS_MAX_MODEL_LEN,
        }],
    });
    let mut response = Response::new(MockBody::full(Bytes::from(body.to_string())));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, N the prompt count of the
/// same body on `/v1/messages`.
fn count_tokens(body: &Bytes) -> Response<MockBody> {
    let request: MessagesRequest<'_> = match serde_json::from_slice(body) {
        Ok(request) => request,
        Err(err) => return bad_request(Dialect::Anthropic, &err),
    };
    if request.messages.is_none() {
        return error_response(
            Dialect::Anthropic,
            StatusCode::BAD_REQUEST,
            None,
            "messages: Field required",
        );
    }
    json_response(
        StatusCode::OK,
        anthropic::render_count(request.prompt_tokens()),
        None,
    )
}

/// Keeps the first `disconnect_after` events; the body then aborts if a cut was asked for.
fn cut(mut events: Vec<Bytes>, disconnect_after: Option<usize>) -> (Vec<Bytes>, bool) {
    match disconnect_after {
        Some(n) => {
            events.truncate(n);
            (events, true)
        }
        None => (events, false),
    }
}

fn sse_response(body: MockBody) -> Response<MockBody> {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// A whole body; with `disconnect_after`, only its first half, then the connection drops.
fn full_response(
    status: StatusCode,
    content_type: HeaderValue,
    body: Bytes,
    disconnect_after: Option<usize>,
) -> Response<MockBody> {
    let body = match disconnect_after {
        None => MockBody::full(body),
        Some(_) => MockBody::frames(vec![body.slice(..body.len() / 2)], Duration::ZERO, true),
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, content_type);
    response
}

fn json_response(
    status: StatusCode,
    body: Bytes,
    disconnect_after: Option<usize>,
) -> Response<MockBody> {
    full_response(
        status,
        HeaderValue::from_static("application/json"),
        body,
        disconnect_after,
    )
}

#[derive(Serialize)]
struct OpenAiError<'a> {
    error: OpenAiErrorBody<'a>,
}

#[derive(Serialize)]
struct OpenAiErrorBody<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

fn openai_error(kind: &str, message: &str, param: Option<&str>, code: Option<&str>) -> Bytes {
    let mut buf = Vec::with_capacity(80 + message.len());
    chat::write_json(
        &mut buf,
        &OpenAiError {
            error: OpenAiErrorBody {
                message,
                kind,
                param,
                code,
            },
        },
    );
    Bytes::from(buf)
}

/// The dialect's error body; `kind` defaults to the type the dialect uses for `status`.
fn error_body(dialect: Dialect, status: StatusCode, kind: Option<&str>, message: &str) -> Bytes {
    match dialect {
        Dialect::Chat | Dialect::Responses => {
            openai_error(kind.unwrap_or(error_type(status)), message, None, None)
        }
        Dialect::Anthropic => {
            anthropic::error_body(kind.unwrap_or(anthropic_error_type(status)), message)
        }
        Dialect::Vllm => vllm::error_body(
            kind.unwrap_or(vllm::error_type(status)),
            status,
            None,
            message,
        ),
        Dialect::Sglang => sglang::error_body(status, message),
    }
}

/// The dialect's context-length error body (status 400).
fn context_length_body(dialect: Dialect) -> Bytes {
    let (param, code) = (Some("messages"), Some("context_length_exceeded"));
    match dialect {
        Dialect::Chat => openai_error("invalid_request_error", CONTEXT_LENGTH_MESSAGE, param, code),
        Dialect::Responses => openai_error(
            "invalid_request_error",
            CONTEXT_LENGTH_MESSAGE,
            Some("input"),
            code,
        ),
        Dialect::Anthropic => {
            anthropic::error_body("invalid_request_error", ANTHROPIC_CONTEXT_LENGTH_MESSAGE)
        }
        Dialect::Vllm => vllm::error_body(
            "BadRequestError",
            StatusCode::BAD_REQUEST,
            None,
            VLLM_CONTEXT_LENGTH_MESSAGE,
        ),
        Dialect::Sglang => {
            sglang::error_body(StatusCode::BAD_REQUEST, SGLANG_CONTEXT_LENGTH_MESSAGE)
        }
    }
}

/// An error generated by the mock itself, in the dialect's shape.
fn error_response(
    dialect: Dialect,
    status: StatusCode,
    kind: Option<&str>,
    message: &str,
) -> Response<MockBody> {
    json_response(status, error_body(dialect, status, kind, message), None)
}

/// The 400 for a body the echo cannot read.
fn bad_request(dialect: Dialect, err: &serde_json::Error) -> Response<MockBody> {
    let message = match (dialect, err.is_data()) {
        (Dialect::Chat, true) => format!("Invalid chat completion request: {err}"),
        (Dialect::Responses, true) => format!("Invalid Responses request: {err}"),
        (Dialect::Anthropic, true) => format!("Invalid Messages request: {err}"),
        (Dialect::Anthropic, false) => {
            format!("There was an error parsing the body of your request: {err}")
        }
        (Dialect::Vllm | Dialect::Sglang, true) => format!("Invalid generate request: {err}"),
        (_, false) => format!("We could not parse the JSON body of your request: {err}"),
    };
    error_response(dialect, StatusCode::BAD_REQUEST, None, &message)
}
