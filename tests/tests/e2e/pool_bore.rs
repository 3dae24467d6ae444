//! An elastic pool over real bore tunnels: a bore server in-process on loopback, servers
//! of `multiplex = 2` sessions each coming up behind tunnels of their own, real chat
//! requests (async-openai) through the tunnels' public URLs to the mock upstream, and every
//! tunnel torn down at stop.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_openai::config::OpenAIConfig;
use async_openai::types::chat::CreateChatCompletionRequest;
use async_trait::async_trait;
use futures_util::future::join_all;
use intercept_core::{
    BindAddr, Endpoint, Error, Health, RolloutSession, Session, SessionConfig, Tunnel, Upstream,
};
use intercept_pool::{
    make_interception_with, ElasticConfig, ElasticEntry, InterceptionConfig, TunnelSpec,
};
use intercept_server::ServerConfig;
use intercept_test::MockUpstream;
use intercept_tunnel::{BoreServer, TunnelConfig};
use serde_json::json;

/// The bore tunnel configuration, with every endpoint it mints kept so the test can see
/// it torn down.
#[derive(Debug, Clone)]
struct Recorded {
    config: TunnelConfig,
    endpoints: Arc<Mutex<Vec<Arc<Watched>>>>,
}

impl TunnelSpec for Recorded {
    fn is_none(&self) -> bool {
        false
    }

    fn make(&self) -> Result<Arc<dyn Tunnel>, Error> {
        Ok(Arc::new(RecordingTunnel {
            inner: self.config.make()?,
            endpoints: self.endpoints.clone(),
        }))
    }
}

#[derive(Debug)]
struct RecordingTunnel {
    inner: Arc<dyn Tunnel>,
    endpoints: Arc<Mutex<Vec<Arc<Watched>>>>,
}

#[async_trait]
impl Tunnel for RecordingTunnel {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn bind_addr(&self) -> BindAddr {
        self.inner.bind_addr()
    }

    async fn expose(&self, port: u16) -> Result<Arc<dyn Endpoint>, Error> {
        let endpoint = Arc::new(Watched {
            inner: self.inner.expose(port).await?,
            local_port: port,
            teardowns: Mutex::new(0),
        });
        self.endpoints
            .lock()
            .expect("endpoints")
            .push(endpoint.clone());
        Ok(endpoint)
    }
}

/// An endpoint that counts its teardowns.
struct Watched {
    inner: Arc<dyn Endpoint>,
    local_port: u16,
    teardowns: Mutex<u32>,
}

impl fmt::Debug for Watched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watched")
            .field("url", &self.inner.url())
            .field("local_port", &self.local_port)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Endpoint for Watched {
    fn url(&self) -> String {
        self.inner.url()
    }

    async fn health(&self) -> Health {
        self.inner.health().await
    }

    async fn refresh(&self) -> Result<String, Error> {
        self.inner.refresh().await
    }

    async fn teardown(&self) -> Result<(), Error> {
        *self.teardowns.lock().expect("teardowns") += 1;
        self.inner.teardown().await
    }
}

fn request(value: serde_json::Value) -> CreateChatCompletionRequest {
    serde_json::from_value(value).expect("a valid chat request")
}

/// `host:port` of an `http://host:port` URL.
fn authority(url: &str) -> String {
    url.trim_start_matches("http://")
        .split('/')
        .next()
        .expect("authority")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elastic_pool_over_real_bore_tunnels() {
    const SESSIONS: usize = 6;
    const MULTIPLEX: usize = 2;

    let bore = BoreServer::bind("127.0.0.1:0".parse().expect("addr"), Some("e2e-secret"))
        .await
        .expect("bore server");
    let upstream = MockUpstream::start().await.expect("mock upstream");
    let tunnel: TunnelConfig = serde_json::from_value(json!({
        "type": "bore",
        "server": "127.0.0.1",
        "control_port": bore.control_addr().port(),
        "secret": "e2e-secret",
    }))
    .expect("bore config");
    let endpoints = Arc::new(Mutex::new(Vec::new()));
    let config = InterceptionConfig::Elastic(ElasticEntry {
        tunnel: Recorded {
            config: tunnel,
            endpoints: endpoints.clone(),
        },
        pool: ElasticConfig {
            multiplex: MULTIPLEX,
            ..ElasticConfig::default()
        },
        unknown: serde_json::Map::new(),
    });
    let pool = make_interception_with(&config, true, ServerConfig::default()).expect("pool");
    pool.start().await.expect("start");

    // A burst of acquires: ceil(6 / 2) = 3 servers, each behind its own bore tunnel.
    let sessions: Vec<Arc<RolloutSession>> = (0..SESSIONS)
        .map(|i| {
            Arc::new(RolloutSession::new(SessionConfig::new(
                format!("bore-rollout-{i}"),
                "policy-model",
                Upstream::new(upstream.base_url()),
            )))
        })
        .collect();
    let guards = join_all(sessions.iter().map(|s| pool.acquire(s.clone())))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .expect("acquire");

    let minted: Vec<Arc<Watched>> = endpoints.lock().expect("endpoints").clone();
    assert_eq!(minted.len(), SESSIONS / MULTIPLEX, "one tunnel per server");
    let public: HashSet<String> = minted.iter().map(|e| e.url()).collect();
    assert_eq!(public.len(), minted.len(), "every tunnel has its own URL");
    for e in &minted {
        let url = e.url();
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        assert_ne!(
            authority(&url),
            format!("127.0.0.1:{}", e.local_port),
            "the public URL is the tunnel's, not the server's own address"
        );
    }
    let handed_out: HashSet<String> = guards.iter().map(|g| g.base_url.clone()).collect();
    assert_eq!(handed_out, public, "slots point harnesses at the tunnels");

    let servers = pool.servers().await;
    assert_eq!(servers.len(), SESSIONS / MULTIPLEX);
    for s in &servers {
        assert!(s.healthy, "{s:?}");
        assert_eq!(s.load, MULTIPLEX, "{s:?}");
        assert!(
            public.contains(s.base_url.as_deref().expect("url")),
            "{s:?}"
        );
    }

    // Two real chat calls per rollout through its tunnel, all at once.
    let calls = guards.iter().zip(&sessions).flat_map(|(guard, session)| {
        let env: std::collections::HashMap<_, _> = guard.harness_env().into_iter().collect();
        let client = crate::openai(
            OpenAIConfig::new()
                .with_api_base(env["OPENAI_BASE_URL"].clone())
                .with_api_key(env["OPENAI_API_KEY"].clone()),
        );
        let id = session.id().to_owned();
        (0..2).map(move |turn| {
            let client = client.clone();
            let text = format!("{id} turn {turn}");
            async move {
                let resp = client
                    .chat()
                    .create(request(json!({
                        "model": "gpt-4o",
                        "messages": [{"role": "user", "content": text}],
                    })))
                    .await
                    .expect("completion through the tunnel");
                (text, resp.choices[0].message.content.clone())
            }
        })
    });
    for (text, answer) in join_all(calls).await {
        assert_eq!(answer.as_deref(), Some(format!("echo: {text}").as_str()));
    }
    assert_eq!(upstream.request_count(), SESSIONS * 2);

    // Each trace holds its own two calls (in either order: they ran at once) and nobody
    // else's.
    for session in &sessions {
        let trace = session.trace();
        let mut sent: Vec<String> = trace
            .calls
            .iter()
            .map(|call| {
                assert_eq!(call.model, "policy-model");
                assert_eq!(call.status, 200);
                call.request.to_value()["messages"][0]["content"]
                    .as_str()
                    .expect("content")
                    .to_owned()
            })
            .collect();
        sent.sort();
        let id = session.id();
        assert_eq!(
            sent,
            [format!("{id} turn 0"), format!("{id} turn 1")],
            "{id} holds exactly its own calls"
        );
    }

    for guard in guards {
        guard.close().await;
    }
    pool.stop().await.expect("stop");

    // Every tunnel torn down exactly once; the endpoints say so.
    assert!(pool.servers().await.is_empty());
    for e in &minted {
        assert_eq!(*e.teardowns.lock().expect("teardowns"), 1, "{e:?}");
        let health = e.health().await;
        assert!(!health.is_healthy(), "{e:?}: {health:?}");
    }
    // And the bore server closes their public ports. It notices a client gone at its
    // next heartbeat, with no event to await from here: poll with a deadline.
    for e in &minted {
        let addr = authority(&e.url());
        tokio::time::timeout(Duration::from_secs(10), async {
            while tokio::net::TcpStream::connect(&addr).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the public port {addr} is still open after stop"));
    }

    bore.shutdown().await;
    upstream.shutdown().await;
}
