//! A mock of the Prime tunnel API plus the "frps" side of its tunnels, for tests of the
//! `prime` tunnel backend together with the `fake-frpc` binary.
//!
//! [`MockPrime`] is a real HTTP/1.1 server on `127.0.0.1`:
//!
//! - `POST /api/v1/tunnel` registers a tunnel (201 with a `TunnelInfo` JSON body). Its
//!   `url` is `http://127.0.0.1:<public port>`: the mock listens on that port and forwards
//!   each connection to the port the tunnel's frpc registered, so a request to the public
//!   URL really reaches the exposed local server. `server_host`/`server_port` point at the
//!   mock itself, which plays frps.
//! - `GET /api/v1/tunnel/{id}` answers the registration (404 once deleted);
//!   `DELETE /api/v1/tunnel/{id}` deletes it (404 if unknown) and closes its public port.
//! - Every API route checks `Authorization: Bearer <api key>` (401 otherwise).
//! - `POST /_fake/frpc/login` is what `fake-frpc` calls at start: the mock answers which
//!   behaviour to act out ([`FrpcMode`]): `gone` for a deleted, expired or terminated
//!   tunnel, `rejected` for a wrong token or binding secret, else the next scripted mode
//!   ([`MockPrime::push_frpc_mode`]) or `success`.
//! - `POST /_fake/frpc/wait` (from a connected `fake-frpc`) answers `{"event": "gone"}`
//!   once [`MockPrime::kick`] was called for the tunnel (or it was deleted).
//! - `GET /_files/<name>` serves bytes added with [`MockPrime::add_file`];
//!   `GET /_redirect/<name>` answers 302 to it (for download tests).
//!
//! Failures are scripted: [`MockPrime::fail_next_create`] queues error answers for the
//! next registrations, [`MockPrime::set_get_status`] makes `GET` fail (a flaky API),
//! [`MockPrime::set_status`] changes a registration's status (e.g. `expired`), and
//! [`MockPrime::freeze`] leaves every API request unanswered (a hanging API), and
//! [`MockPrime::reap`] has a tunnel's public port answer every request as the Prime edge
//! answers for a reaped tunnel (404 `Tunnel not found or no longer active`) while its
//! registration and its frpc carry on as if nothing happened.
//!
//! All tasks belong to the mock; [`MockPrime::shutdown`] (or drop) stops them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The `fake-frpc` binary for a test: `$INTERCEPT_FAKE_FRPC` when set, else the one built
/// beside the running test ([`crate::helper_binary`]), rebuilt when it is missing or older
/// than its source.
pub fn fake_frpc() -> std::path::PathBuf {
    static PATH: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(p) = std::env::var_os("INTERCEPT_FAKE_FRPC") {
            return p.into();
        }
        crate::helper_binary(
            "",
            "fake-frpc",
            &["-p", "intercept-test", "--bin", "fake-frpc"],
            &["crates/intercept-test/src/bin/fake-frpc.rs"],
        )
    })
    .clone()
}

/// What a `fake-frpc` acts out after logging in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrpcMode {
    /// Prints `start proxy success` and forwards traffic.
    Success,
    /// Prints `start error: tunnel is inactive` and stays up.
    Gone,
    /// Prints `connect to server error: invalid authentication token` and stays up.
    Rejected,
    /// Prints `start error: proxy [...] already exists` and stays up.
    ProxyRefused,
    /// Prints an error line and exits with code 1.
    Exit,
    /// Prints nothing relevant and stays up (the caller times out).
    Hang,
}

impl FrpcMode {
    /// The wire name (`success`, `gone`, `rejected`, `proxy-refused`, `exit`, `hang`).
    pub fn as_str(self) -> &'static str {
        match self {
            FrpcMode::Success => "success",
            FrpcMode::Gone => "gone",
            FrpcMode::Rejected => "rejected",
            FrpcMode::ProxyRefused => "proxy-refused",
            FrpcMode::Exit => "exit",
            FrpcMode::Hang => "hang",
        }
    }
}

/// A registration as the mock holds it.
#[derive(Debug, Clone)]
pub struct MockTunnel {
    /// The tunnel id.
    pub id: String,
    /// `pending`, `connected`, `expired`, `terminated` ...
    pub status: String,
    /// Whether it was deleted.
    pub deleted: bool,
    /// The local port it was registered for.
    pub local_port: u16,
    /// Its public URL.
    pub url: String,
    /// The pid of the frpc that logged in last, if any.
    pub frpc_pid: Option<u32>,
    /// How many frpc processes logged in for it.
    pub logins: u32,
    /// Whether [`MockPrime::kick`] told its frpc that the tunnel is gone.
    pub kicked: bool,
    /// Whether [`MockPrime::reap`] reaped it at the edge.
    pub reaped: bool,
    token: String,
    binding_secret: String,
    frpc_port: Arc<AtomicU16>,
    public: CancellationToken,
    edge_reaped: Arc<std::sync::atomic::AtomicBool>,
}

impl MockTunnel {
    fn info(&self, server_port: u16) -> Value {
        json!({
            "tunnel_id": self.id,
            "name": null,
            "hostname": format!("{}.mock.invalid", self.id),
            "url": self.url,
            "frp_token": self.token,
            "binding_secret": self.binding_secret,
            "server_host": "127.0.0.1",
            "server_port": server_port,
            "local_port": self.local_port,
            "labels": [],
            "status": self.status,
            "expires_at": null,
        })
    }
}

/// One request the mock saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    /// The method.
    pub method: String,
    /// The path.
    pub path: String,
    /// The JSON body, if any.
    pub body: Option<Value>,
}

struct State {
    api_key: String,
    port: u16,
    tunnels: Mutex<BTreeMap<String, MockTunnel>>,
    create_failures: Mutex<VecDeque<(u16, String)>>,
    modes: Mutex<VecDeque<FrpcMode>>,
    get_status: Mutex<Option<u16>>,
    frozen: std::sync::atomic::AtomicBool,
    files: Mutex<HashMap<String, Bytes>>,
    seen: Mutex<Vec<SeenRequest>>,
    ids: AtomicU64,
    changes: watch::Sender<u64>,
    token: CancellationToken,
    tracker: TaskTracker,
}

impl State {
    fn changed(&self) {
        self.changes.send_modify(|v| *v += 1);
    }
}

/// A running mock Prime API. See the [module docs](self).
pub struct MockPrime {
    addr: SocketAddr,
    state: Arc<State>,
}

impl fmt::Debug for MockPrime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockPrime")
            .field("addr", &self.addr)
            .finish()
    }
}

impl MockPrime {
    /// Starts a mock on `127.0.0.1` and a free port that accepts `api_key`.
    pub async fn start(api_key: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (changes, _) = watch::channel(0);
        let state = Arc::new(State {
            api_key: api_key.to_string(),
            port: addr.port(),
            tunnels: Mutex::new(BTreeMap::new()),
            create_failures: Mutex::new(VecDeque::new()),
            modes: Mutex::new(VecDeque::new()),
            get_status: Mutex::new(None),
            frozen: std::sync::atomic::AtomicBool::new(false),
            files: Mutex::new(HashMap::new()),
            seen: Mutex::new(Vec::new()),
            ids: AtomicU64::new(0),
            changes,
            token: CancellationToken::new(),
            tracker: TaskTracker::new(),
        });
        let s = Arc::clone(&state);
        state.tracker.spawn(accept_loop(listener, s));
        Ok(MockPrime { addr, state })
    }

    /// The address the mock listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The API base URL (`PRIME_API_BASE_URL`), `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answers the next registration with `status` and `{"detail": detail}`.
    pub fn fail_next_create(&self, status: u16, detail: &str) {
        self.state
            .create_failures
            .lock()
            .push_back((status, detail.to_string()));
    }

    /// Makes the next frpc login act out `mode` (FIFO; `success` when empty).
    pub fn push_frpc_mode(&self, mode: FrpcMode) {
        self.state.modes.lock().push_back(mode);
    }

    /// Freezes the API (`true`): its requests are read, logged and then left unanswered
    /// until it thaws (`false`) or shuts down. The tunnels' public URLs keep working.
    pub fn freeze(&self, frozen: bool) {
        self.state.frozen.store(frozen, Ordering::SeqCst);
        self.state.changed();
    }

    /// Makes every `GET /api/v1/tunnel/{id}` answer `status` (`None`: normal answers).
    pub fn set_get_status(&self, status: Option<u16>) {
        *self.state.get_status.lock() = status;
    }

    /// Sets a registration's status (e.g. `expired`).
    pub fn set_status(&self, id: &str, status: &str) {
        if let Some(t) = self.state.tunnels.lock().get_mut(id) {
            t.status = status.to_string();
        }
        self.state.changed();
    }

    /// Tells the tunnel's running frpc (a `fake-frpc` in `success` mode waits for this)
    /// to print `connect to server error: tunnel not registered`, as frpc does when the
    /// service dropped a connected tunnel.
    pub fn kick(&self, id: &str) {
        if let Some(t) = self.state.tunnels.lock().get_mut(id) {
            t.kicked = true;
        }
        self.state.changed();
    }

    /// Reaps the tunnel at the edge only: its public port answers each request 404
    /// `Tunnel not found or no longer active`, while the API still lists it as it was and
    /// its frpc stays connected.
    pub fn reap(&self, id: &str) {
        if let Some(t) = self.state.tunnels.lock().get_mut(id) {
            t.reaped = true;
            t.edge_reaped.store(true, Ordering::SeqCst);
        }
        self.state.changed();
    }

    /// Serves `bytes` at `/_files/<name>` (and a redirect to it at `/_redirect/<name>`).
    pub fn add_file(&self, name: &str, bytes: impl Into<Bytes>) {
        self.state
            .files
            .lock()
            .insert(name.to_string(), bytes.into());
    }

    /// Every registration ever made, by id.
    pub fn tunnels(&self) -> BTreeMap<String, MockTunnel> {
        self.state.tunnels.lock().clone()
    }

    /// Registrations not deleted.
    pub fn live_tunnels(&self) -> Vec<MockTunnel> {
        self.state
            .tunnels
            .lock()
            .values()
            .filter(|t| !t.deleted)
            .cloned()
            .collect()
    }

    /// Every API request seen (method, path, body).
    pub fn seen(&self) -> Vec<SeenRequest> {
        self.state.seen.lock().clone()
    }

    /// How many requests with this method went to paths starting with `prefix`.
    pub fn count(&self, method: &str, prefix: &str) -> usize {
        self.state
            .seen
            .lock()
            .iter()
            .filter(|r| r.method == method && r.path.starts_with(prefix))
            .count()
    }

    /// Waits (at most `timeout`) until `done(self)` holds; returns whether it did.
    pub async fn wait_until(&self, timeout: Duration, done: impl Fn(&MockPrime) -> bool) -> bool {
        let mut rx = self.state.changes.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|_| done(self)))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Stops the mock and every tunnel's public port, waiting for its tasks.
    pub async fn shutdown(self) {
        self.state.token.cancel();
        self.state.tracker.close();
        self.state.tracker.wait().await;
    }
}

impl Drop for MockPrime {
    fn drop(&mut self) {
        self.state.token.cancel();
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = state.token.cancelled() => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let s = Arc::clone(&state);
        state.tracker.spawn(async move {
            let token = s.token.clone();
            let svc = service_fn(move |req| {
                let s = Arc::clone(&s);
                async move { Ok::<_, Infallible>(handle(&s, req).await) }
            });
            let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = token.cancelled() => {}
            }
        });
    }
}

fn reply(status: u16, body: Value) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

async fn handle(state: &Arc<State>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let auth = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let json: Option<Value> = serde_json::from_slice(&body).ok();

    if let Some(name) = path.strip_prefix("/_files/") {
        return match state.files.lock().get(name) {
            Some(bytes) => Response::new(Full::new(bytes.clone())),
            None => reply(404, json!({"detail": "no such file"})),
        };
    }
    if let Some(name) = path.strip_prefix("/_redirect/") {
        let mut resp = reply(302, json!({}));
        if let Ok(v) = http::HeaderValue::from_str(&format!("/_files/{name}")) {
            resp.headers_mut().insert(http::header::LOCATION, v);
        }
        return resp;
    }
    if method == Method::POST && path == "/_fake/frpc/wait" {
        let id = json
            .as_ref()
            .and_then(|b| b.get("tunnel_id"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let done = || {
            state
                .tunnels
                .lock()
                .get(&id)
                .is_none_or(|t| t.kicked || t.deleted)
        };
        let mut rx = state.changes.subscribe();
        tokio::select! {
            _ = rx.wait_for(|_| done()) => {}
            _ = state.token.cancelled() => {}
        }
        return reply(200, json!({"event": "gone"}));
    }
    if method == Method::POST && path == "/_fake/frpc/login" {
        return reply(200, json!({ "mode": login(state, json.as_ref()).as_str() }));
    }

    state.seen.lock().push(SeenRequest {
        method: method.to_string(),
        path: path.clone(),
        body: json.clone(),
    });
    state.changed();
    if state.frozen.load(Ordering::SeqCst) {
        let mut rx = state.changes.subscribe();
        tokio::select! {
            _ = rx.wait_for(|_| !state.frozen.load(Ordering::SeqCst)) => {}
            _ = state.token.cancelled() => {}
        }
    }
    if auth.as_deref() != Some(&format!("Bearer {}", state.api_key)) {
        return reply(401, json!({"detail": "Unauthorized"}));
    }
    let id = path.strip_prefix("/api/v1/tunnel/").map(str::to_string);
    match (method, path.as_str(), id) {
        (Method::POST, "/api/v1/tunnel", _) => create(state, json.as_ref()).await,
        (Method::GET, _, Some(id)) => {
            if let Some(status) = *state.get_status.lock() {
                return reply(status, json!({"detail": "scripted failure"}));
            }
            match state.tunnels.lock().get(&id) {
                Some(t) if !t.deleted => reply(200, t.info(state.port)),
                _ => reply(404, json!({"detail": "Tunnel not found"})),
            }
        }
        (Method::DELETE, _, Some(id)) => {
            let found = {
                let mut tunnels = state.tunnels.lock();
                match tunnels.get_mut(&id) {
                    Some(t) if !t.deleted => {
                        t.deleted = true;
                        t.status = "terminated".into();
                        t.public.cancel();
                        true
                    }
                    _ => false,
                }
            };
            state.changed();
            if found {
                reply(200, json!({"success": true}))
            } else {
                reply(404, json!({"detail": "Tunnel not found"}))
            }
        }
        _ => reply(404, json!({"detail": "no such route"})),
    }
}

async fn create(state: &Arc<State>, body: Option<&Value>) -> Response<Full<Bytes>> {
    if let Some((status, detail)) = state.create_failures.lock().pop_front() {
        return reply(status, json!({ "detail": detail }));
    }
    let Some(local_port) = body
        .and_then(|b| b.get("local_port"))
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
    else {
        return reply(422, json!({"detail": "local_port is required"}));
    };
    let listener = match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await {
        Ok(l) => l,
        Err(e) => return reply(500, json!({ "detail": e.to_string() })),
    };
    let public_port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let n = state.ids.fetch_add(1, Ordering::Relaxed) + 1;
    let frpc_port = Arc::new(AtomicU16::new(0));
    let public = state.token.child_token();
    let tunnel = MockTunnel {
        id: format!("tun-{n}"),
        status: "pending".into(),
        deleted: false,
        local_port,
        url: format!("http://127.0.0.1:{public_port}"),
        frpc_pid: None,
        logins: 0,
        kicked: false,
        reaped: false,
        // Values that need escaping in TOML, on purpose.
        token: format!("tok\"{n}\\x"),
        binding_secret: format!("bs-{n}\n"),
        frpc_port: Arc::clone(&frpc_port),
        public: public.clone(),
        edge_reaped: Arc::default(),
    };
    state.tracker.spawn(public_port_loop(
        listener,
        frpc_port,
        Arc::clone(&tunnel.edge_reaped),
        public,
        state.tracker.clone(),
    ));
    let info = tunnel.info(state.port);
    state.tunnels.lock().insert(tunnel.id.clone(), tunnel);
    state.changed();
    reply(201, info)
}

/// What the Prime edge answers for a reaped tunnel.
const REAPED_ANSWER: &[u8] = b"HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\n\
content-length: 36\r\nconnection: close\r\n\r\nTunnel not found or no longer active";

/// Forwards each connection to the public port to the port frpc registered (or, once
/// reaped, answers it as the edge does).
async fn public_port_loop(
    listener: TcpListener,
    frpc_port: Arc<AtomicU16>,
    reaped: Arc<std::sync::atomic::AtomicBool>,
    token: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = token.cancelled() => return,
        };
        let Ok((mut inbound, _)) = accepted else {
            continue;
        };
        let port = frpc_port.load(Ordering::SeqCst);
        let token = token.clone();
        if reaped.load(Ordering::SeqCst) {
            tracker.spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                // Read the request's head (any first read will do), answer, close.
                let mut head = [0u8; 4096];
                let answer = async {
                    let _ = inbound.read(&mut head).await;
                    let _ = inbound.write_all(REAPED_ANSWER).await;
                    let _ = inbound.shutdown().await;
                };
                let _ = tokio::time::timeout(Duration::from_secs(5), answer).await;
            });
            continue;
        }
        tracker.spawn(async move {
            if port == 0 {
                return; // no frpc: the connection is closed at once
            }
            let Ok(mut outbound) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await else {
                return;
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                _ = token.cancelled() => {}
            }
        });
    }
}

fn login(state: &Arc<State>, body: Option<&Value>) -> FrpcMode {
    let field = |k: &str| {
        body.and_then(|b| b.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let id = field("tunnel_id");
    let mode = {
        let mut tunnels = state.tunnels.lock();
        match tunnels.get_mut(id) {
            None => FrpcMode::Gone,
            Some(t) if t.deleted || t.status == "expired" || t.status == "terminated" => {
                FrpcMode::Gone
            }
            Some(t) if t.token != field("token") || t.binding_secret != field("binding_secret") => {
                FrpcMode::Rejected
            }
            Some(t) => {
                let mode = state.modes.lock().pop_front().unwrap_or(FrpcMode::Success);
                t.logins += 1;
                t.frpc_pid = body
                    .and_then(|b| b.get("pid"))
                    .and_then(Value::as_u64)
                    .and_then(|p| u32::try_from(p).ok());
                if mode == FrpcMode::Success {
                    let port = body
                        .and_then(|b| b.get("port"))
                        .and_then(Value::as_u64)
                        .and_then(|p| u16::try_from(p).ok())
                        .unwrap_or(0);
                    t.frpc_port.store(port, Ordering::SeqCst);
                    t.status = "connected".into();
                }
                mode
            }
        }
    };
    state.changed();
    mode
}
