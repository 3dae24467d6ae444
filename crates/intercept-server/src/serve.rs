//! The accept loop shared by the interception server and other HTTP front ends (the
//! sidecar's control API).

use std::error::Error as StdError;
use std::future::Future;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

/// How long the loop backs off after a failed `accept` (out of file descriptors and
/// the like) before accepting again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// Serves every connection accepted on `listener` with a clone of `service` until
/// `shutdown` resolves, then shuts down gracefully and returns.
///
/// - Each connection speaks HTTP/1.1 or HTTP/2 (prior knowledge), whichever the client
///   opens with, and has `TCP_NODELAY` set.
/// - A failed `accept` (out of file descriptors and the like) is logged; the loop backs
///   off for 20 ms and keeps serving.
/// - `shutdown` is checked before every accept. Once it resolves, the listener is
///   closed (no new connections), requests in flight (streamed responses included) run
///   to their end, idle keep-alive connections are closed, and the function returns
///   only after every connection task has ended: no task outlives it.
///
/// Run it as a task its owner awaits (a `TaskTracker`, a `JoinHandle`). Logs go to the
/// caller's `tracing` span.
///
/// ```
/// use std::convert::Infallible;
///
/// use bytes::Bytes;
/// use http::Response;
/// use http_body_util::Full;
/// use hyper::service::service_fn;
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// use tokio::net::{TcpListener, TcpStream};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = TcpListener::bind("127.0.0.1:0").await?;
/// let addr = listener.local_addr()?;
/// let service = service_fn(|_req| async {
///     Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
/// });
/// let stop = CancellationToken::new();
/// let server = tokio::spawn(intercept_server::serve_connections(
///     listener,
///     service,
///     stop.clone().cancelled_owned(),
/// ));
///
/// let mut tcp = TcpStream::connect(addr).await?;
/// tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await?;
/// let mut response = String::new();
/// tcp.read_to_string(&mut response).await?;
/// assert!(response.starts_with("HTTP/1.1 200 OK") && response.ends_with("ok"));
///
/// stop.cancel();
/// server.await.expect("the accept loop ended");
/// # Ok(())
/// # }
/// ```
pub async fn serve_connections<S, B>(
    listener: TcpListener,
    service: S,
    shutdown: impl Future<Output = ()>,
) where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    let graceful = GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    // Every connection task is owned here and awaited before the loop returns.
    let connections = TaskTracker::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let conn = builder
            .serve_connection(TokioIo::new(stream), service.clone())
            .into_owned();
        let conn = graceful.watch(conn);
        connections.spawn(async move {
            if let Err(e) = conn.await {
                debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    // In-flight responses finish; idle connections close.
    graceful.shutdown().await;
    connections.close();
    connections.wait().await;
}
