//! The accept loop, connection tasks and request handler.

use std::future::Future;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

use super::body::{Disconnect, MockBody};
use super::chat::{self, ChatRequest, StreamShape};
use super::log::{header_map, ReceivedRequest, RequestBody};
use super::reply::{error_type, Completion, Reply, ReplyKind};
use super::{Shared, CHAT_COMPLETIONS_PATH};

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

/// Answers one request. `Err` makes hyper drop the connection without a response.
async fn handle(
    shared: Arc<Shared>,
    connection: usize,
    request: Request<Incoming>,
) -> Result<Response<MockBody>, Disconnect> {
    let received_at = Instant::now();
    let (parts, body) = request.into_parts();
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
            return Ok(error_response(StatusCode::PAYLOAD_TOO_LARGE, &message));
        }
        // The client went away or broke the framing: nothing to answer.
        Err(_) => return Err(Disconnect),
    };
    record(&shared, &parts, &body, connection, received_at);

    let scripted = if parts.method == Method::POST {
        shared.pop_reply()
    } else {
        None
    };
    let reply = match scripted {
        Some(reply) => reply,
        None if parts.uri.path() != CHAT_COMPLETIONS_PATH => {
            let message = format!("Invalid URL ({} {})", parts.method, parts.uri.path());
            return Ok(error_response(StatusCode::NOT_FOUND, &message));
        }
        None if parts.method != Method::POST => {
            let message = format!(
                "Method {} is not allowed on {CHAT_COMPLETIONS_PATH}; use POST",
                parts.method
            );
            let mut response = error_response(StatusCode::METHOD_NOT_ALLOWED, &message);
            response
                .headers_mut()
                .insert(ALLOW, HeaderValue::from_static("POST"));
            return Ok(response);
        }
        None => Reply::echo(),
    };
    respond(&shared, &body, reply).await
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

/// Sends a reply (after its header delay).
async fn respond(
    shared: &Shared,
    body: &Bytes,
    reply: Reply,
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
        ReplyKind::Events(events) => {
            let (events, abort) = cut(events.clone(), reply.disconnect_after);
            sse_response(MockBody::frames(events, chunk_delay, abort))
        }
        ReplyKind::Completion(completion) => {
            completion_response(shared, body, completion, &reply, chunk_delay)
        }
    };
    for (name, value) in &reply.headers {
        response.headers_mut().append(name.clone(), value.clone());
    }
    Ok(response)
}

/// A completion as JSON or as a stream, as the request asks.
fn completion_response(
    shared: &Shared,
    body: &Bytes,
    completion: &Completion,
    reply: &Reply,
    chunk_delay: Duration,
) -> Response<MockBody> {
    let config = &shared.config;
    let request: ChatRequest<'_> = match serde_json::from_slice(body) {
        Ok(request) => request,
        // Only the echo needs the request; a scripted completion answers anything.
        Err(err) if completion.echo => return bad_request(&err),
        Err(_) => ChatRequest::default(),
    };
    if completion.echo && request.messages.is_none() {
        return error_response(StatusCode::BAD_REQUEST, "'messages' is a required property");
    }
    let mut next_call_id = || shared.call_ids.fetch_add(1, Ordering::Relaxed) + 1;
    let answer = chat::resolve(
        completion,
        &request,
        &config.default_model,
        &mut next_call_id,
    );
    let id = format!(
        "chatcmpl-mock-{}",
        shared.completion_ids.fetch_add(1, Ordering::Relaxed) + 1
    );
    let created = config.created.unwrap_or_else(unix_now);
    if request.is_stream() {
        let shape = StreamShape {
            chunks: reply.chunks.unwrap_or(config.chunks),
            include_usage: request.include_usage(),
            crlf: reply.crlf,
            done: reply.done,
        };
        let events = chat::render_stream(&answer, &id, created, shape);
        let (events, abort) = cut(events, reply.disconnect_after);
        sse_response(MockBody::frames(events, chunk_delay, abort))
    } else {
        let json = chat::render_json(&answer, &id, created);
        full_response(
            StatusCode::OK,
            HeaderValue::from_static("application/json"),
            json,
            reply.disconnect_after,
        )
    }
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

/// An OpenAI-shaped error generated by the mock itself.
fn error_response(status: StatusCode, message: &str) -> Response<MockBody> {
    let body = serde_json::json!({
        "error": {
            "message": message,
            "type": error_type(status),
            "param": null,
            "code": null,
        }
    });
    full_response(
        status,
        HeaderValue::from_static("application/json"),
        Bytes::from(body.to_string()),
        None,
    )
}

/// The 400 for a body the echo cannot read.
fn bad_request(err: &serde_json::Error) -> Response<MockBody> {
    let message = if err.is_data() {
        format!("Invalid chat completion request: {err}")
    } else {
        format!("We could not parse the JSON body of your request: {err}")
    };
    error_response(StatusCode::BAD_REQUEST, &message)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}
