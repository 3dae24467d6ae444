//! The sidecar over pools and tunnels: an elastic pool that grows as sessions arrive, and
//! a static pool behind real (in-process) bore tunnels.

// Helpers outside #[test] functions panic on purpose, like the tests themselves.
#![allow(clippy::unwrap_used)]

mod common;

use common::control::Api;

use std::collections::HashSet;

use futures_util::future::join_all;
use http::{Method, StatusCode};
use intercept_cli::config::{Layers, ServeConfig};
use intercept_cli::sidecar::Sidecar;
use intercept_tunnel::BoreServer;
use serde_json::{json, Value};

fn config(flags: &[(&'static str, &str)]) -> ServeConfig {
    let flags: Vec<(&str, String)> = flags.iter().map(|(k, v)| (*k, v.to_string())).collect();
    ServeConfig::from_layers(Layers {
        file: None,
        env: &[],
        flags: &flags,
    })
    .unwrap()
}

/// Creates `n` sessions at once, runs one call on each, and checks each trace holds
/// exactly its own call. Returns the created sessions.
async fn sessions_with_one_call_each(api: &Api, n: usize) -> Vec<Value> {
    let created = join_all((0..n).map(|i| {
        let body = json!({"id": format!("rollout-{i}")});
        api.req(Method::POST, "/v1/sessions", Some(body))
    }))
    .await;
    let created: Vec<Value> = created
        .into_iter()
        .map(|r| {
            assert_eq!(
                r.status,
                StatusCode::CREATED,
                "{}",
                String::from_utf8_lossy(&r.body)
            );
            r.json().unwrap()
        })
        .collect();
    let answers = join_all(
        created
            .iter()
            .map(|s| api.chat(&s["env"], s["id"].as_str().unwrap())),
    )
    .await;
    for (s, answer) in created.iter().zip(answers) {
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        let id = s["id"].as_str().unwrap();
        let trace = api
            .json(Method::GET, &format!("/v1/sessions/{id}/trace"))
            .await;
        let calls = trace["calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{trace}");
        assert!(
            calls[0]["request"].to_string().contains(id),
            "{id}'s trace holds its own call: {trace}"
        );
    }
    created
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elastic_pool_grows_to_fit_the_sessions() {
    let sidecar = Sidecar::start(config(&[
        ("upstream", "mock"),
        ("interception", "elastic"),
        ("multiplex", "2"),
    ]))
    .await
    .unwrap();
    let api = Api::new(&sidecar);
    let before = api.json(Method::GET, "/v1/interception").await;
    assert_eq!(before["shape"], "elastic");
    assert_eq!(before["tunnel"], "none");
    assert_eq!(before["servers"], json!([]), "no server before demand");

    let created = sessions_with_one_call_each(&api, 5).await;
    let base_urls: HashSet<&str> = created
        .iter()
        .map(|s| s["base_url"].as_str().unwrap())
        .collect();
    assert_eq!(base_urls.len(), 3, "5 sessions, 2 per server: 3 servers");

    let shape = api.json(Method::GET, "/v1/interception").await;
    let servers = shape["servers"].as_array().unwrap();
    assert_eq!(servers.len(), 3, "{shape}");
    assert_eq!(shape["load"], 5);
    let mut loads: Vec<u64> = servers
        .iter()
        .map(|s| s["load"].as_u64().unwrap())
        .collect();
    loads.sort_unstable();
    assert_eq!(loads, [1, 2, 2]);
    for s in servers {
        assert_eq!(s["healthy"], true);
        assert!(base_urls.contains(s["base_url"].as_str().unwrap()), "{s}");
    }

    let text = api.metrics().await;
    assert!(text.contains("intercept_servers 3"), "{text}");
    assert!(text.contains("intercept_active_sessions 5"), "{text}");
    assert!(text.contains("intercept_tunnel_starts_total 0"), "{text}");

    for s in &created {
        let id = s["id"].as_str().unwrap();
        let released = api
            .json(Method::DELETE, &format!("/v1/sessions/{id}"))
            .await;
        assert_eq!(released["calls"].as_array().unwrap().len(), 1);
    }
    assert_eq!(api.json(Method::GET, "/v1/interception").await["load"], 0);
    sidecar.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_pool_behind_bore_tunnels() {
    let bore = BoreServer::bind("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let port = bore.control_addr().port().to_string();
    let sidecar = Sidecar::start(config(&[
        ("upstream", "mock"),
        ("interception", "static"),
        ("static_servers", "2"),
        ("tunnel", "bore"),
        ("bore_server", "127.0.0.1"),
        ("bore_port", &port),
    ]))
    .await
    .unwrap();
    let api = Api::new(&sidecar);
    let shape = api.json(Method::GET, "/v1/interception").await;
    assert_eq!(shape["shape"], "static");
    assert_eq!(shape["tunnel"], "bore");
    let servers = shape["servers"].as_array().unwrap();
    assert_eq!(servers.len(), 2, "{shape}");
    for s in servers {
        assert_eq!(s["healthy"], true, "{s}");
    }

    let created = sessions_with_one_call_each(&api, 4).await;
    let public: HashSet<&str> = created
        .iter()
        .map(|s| s["base_url"].as_str().unwrap())
        .collect();
    assert_eq!(public.len(), 2, "least-loaded spreads over both tunnels");
    for url in &public {
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    }
    let shape = api.json(Method::GET, "/v1/interception").await;
    let loads: Vec<u64> = shape["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["load"].as_u64().unwrap())
        .collect();
    assert_eq!(loads, [2, 2]);

    let text = api.metrics().await;
    assert!(text.contains("intercept_servers 2"), "{text}");
    assert!(text.contains("intercept_tunnel_starts_total 2"), "{text}");
    assert!(text.contains("intercept_tunnel_failures_total 0"), "{text}");

    sidecar.shutdown().await.unwrap();
    bore.shutdown().await;
}

#[tokio::test]
async fn a_tunnel_that_cannot_start_fails_the_start() {
    // Nothing listens on the bore port: the static pool's start fails, naming the shape.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port().to_string();
    drop(closed);
    let err = Sidecar::start(config(&[
        ("upstream", "mock"),
        ("interception", "static"),
        ("tunnel", "bore"),
        ("bore_server", "127.0.0.1"),
        ("bore_port", &port),
    ]))
    .await
    .unwrap_err();
    let message = format!("{err:#}");
    assert!(
        message.contains("interception = static, tunnel = bore"),
        "{message}"
    );
    assert!(message.contains("bore"), "{message}");

    let err = Sidecar::start(config(&[
        ("upstream", "mock"),
        ("tunnel", "bore"),
        ("bore_server", "127.0.0.1"),
        ("bore_secret_env", "INTERCEPT_TEST_SURELY_UNSET_BORE_SECRET"),
    ]))
    .await
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("INTERCEPT_TEST_SURELY_UNSET_BORE_SECRET"),
        "{err:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_behind_a_custom_tunnel() {
    // A "public" URL that is in fact the server's own loopback address: the custom tunnel
    // makes the server listen on `tunnel_port` and hands out `tunnel_url`.
    let free = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let url = format!("http://127.0.0.1:{port}/");
    let sidecar = Sidecar::start(config(&[
        ("upstream", "mock"),
        ("tunnel", "custom"),
        ("tunnel_url", &url),
        ("tunnel_port", &port.to_string()),
        ("tunnel_host", "127.0.0.1"),
    ]))
    .await
    .unwrap();
    let api = Api::new(&sidecar);
    let shape = api.json(Method::GET, "/v1/interception").await;
    assert_eq!(shape["shape"], "server");
    assert_eq!(shape["tunnel"], "custom");
    assert_eq!(
        shape["servers"],
        json!([{"base_url": url.trim_end_matches('/'), "load": 0, "healthy": true}])
    );
    let created = sessions_with_one_call_each(&api, 2).await;
    for s in &created {
        assert_eq!(s["base_url"], url.trim_end_matches('/'));
    }
    let text = api.metrics().await;
    assert!(text.contains("intercept_tunnel_starts_total 1"), "{text}");
    assert!(text.contains("intercept_servers 1"), "{text}");
    sidecar.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elastic_pool_behind_bore_tunnels_with_a_secret() {
    const SECRET_VAR: &str = "INTERCEPT_TEST_POOLS_BORE_SECRET";
    let bore = BoreServer::bind("127.0.0.1:0".parse().unwrap(), Some("pools-secret"))
        .await
        .unwrap();
    // Edition 2021: set_var is safe; this variable is read by this test only.
    std::env::set_var(SECRET_VAR, "pools-secret");
    let port = bore.control_addr().port().to_string();
    let sidecar = Sidecar::start(config(&[
        ("upstream", "mock"),
        ("interception", "elastic"),
        ("multiplex", "2"),
        ("tunnel", "bore"),
        ("bore_server", "127.0.0.1"),
        ("bore_port", &port),
        ("bore_secret_env", SECRET_VAR),
    ]))
    .await
    .unwrap();
    let api = Api::new(&sidecar);
    let created = sessions_with_one_call_each(&api, 3).await;
    let public: HashSet<&str> = created
        .iter()
        .map(|s| s["base_url"].as_str().unwrap())
        .collect();
    assert_eq!(public.len(), 2, "3 sessions, 2 per server: 2 tunnels");
    let shape = api.json(Method::GET, "/v1/interception").await;
    assert_eq!(shape["shape"], "elastic");
    assert_eq!(shape["servers"].as_array().unwrap().len(), 2, "{shape}");
    let text = api.metrics().await;
    assert!(text.contains("intercept_tunnel_starts_total 2"), "{text}");
    assert!(text.contains("intercept_tunnel_failures_total 0"), "{text}");
    sidecar.shutdown().await.unwrap();
    bore.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_elastic_pool_answers_503_naming_the_sidecar_settings() {
    let sidecar = Sidecar::start(config(&[
        ("upstream", "mock"),
        ("interception", "elastic"),
        ("multiplex", "1"),
        ("max_servers", "1"),
        ("wait_timeout_secs", "0.3"),
    ]))
    .await
    .unwrap();
    let api = Api::new(&sidecar);
    let first = api
        .req(Method::POST, "/v1/sessions", Some(json!({"id": "seated"})))
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let started = tokio::time::Instant::now();
    let second = api
        .req(Method::POST, "/v1/sessions", Some(json!({"id": "waits"})))
        .await;
    let waited = started.elapsed();
    assert_eq!(second.status, StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = second.json().unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("max_servers = 1"), "{message}");
    assert!(message.contains("wait_timeout_secs"), "{message}");
    assert!(!message.contains("wait_timeout,"), "{message}");
    // It waited for the configured 0.3 s, not the default 300 s.
    assert!(waited < std::time::Duration::from_secs(30), "{waited:?}");
    // The seat frees: the same request then succeeds.
    let released = api.req(Method::DELETE, "/v1/sessions/seated", None).await;
    assert_eq!(released.status, StatusCode::OK);
    let third = api
        .req(Method::POST, "/v1/sessions", Some(json!({"id": "waits"})))
        .await;
    assert_eq!(
        third.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&third.body)
    );
    sidecar.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bore_restart_keeps_urls_and_a_taken_port_marks_sessions_endpoint_lost() {
    let bore = BoreServer::bind("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let control = bore.control_addr().port();
    let port = control.to_string();
    let sidecar = Sidecar::start(config(&[
        ("upstream", "mock"),
        ("interception", "static"),
        ("static_servers", "1"),
        ("tunnel", "bore"),
        ("bore_server", "127.0.0.1"),
        ("bore_port", &port),
    ]))
    .await
    .unwrap();
    let api = Api::new(&sidecar);
    let created = sessions_with_one_call_each(&api, 1).await;
    let a = &created[0];
    let url = a["base_url"].as_str().unwrap().to_owned();
    assert_eq!(api.endpoint_lost("rollout-0").await, false);
    // Waits (bounded) until a chat through `env` answers `want`.
    let until = |env: Value, want: StatusCode| {
        let api = &api;
        async move {
            for _ in 0..300 {
                if api
                    .try_chat(&env, "again")
                    .await
                    .is_ok_and(|r| r.status == want)
                {
                    return true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            false
        }
    };

    // The bore server restarts: the tunnel comes back on the same public port by itself,
    // with no new session to prompt it, and the session's URL works again.
    bore.shutdown().await;
    let bore = BoreServer::bind(format!("127.0.0.1:{control}").parse().unwrap(), None)
        .await
        .unwrap();
    assert!(
        until(a["env"].clone(), StatusCode::OK).await,
        "the URL never came back"
    );
    assert_eq!(api.endpoint_lost("rollout-0").await, false);

    // It goes down again, and someone takes its public port meanwhile: the tunnel moves to
    // a new URL, and the session is marked, in its status and in the metrics.
    bore.shutdown().await;
    let old_port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let squatter = tokio::net::TcpListener::bind(("127.0.0.1", old_port))
        .await
        .unwrap();
    let bore = BoreServer::bind(format!("127.0.0.1:{control}").parse().unwrap(), None)
        .await
        .unwrap();
    let mut marked = false;
    for _ in 0..300 {
        if api.endpoint_lost("rollout-0").await == true {
            marked = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        marked,
        "the moved tunnel's session is never marked endpoint_lost"
    );
    let text = api.metrics().await;
    assert!(
        text.contains("intercept_sessions_endpoint_lost 1"),
        "{text}"
    );
    // A new session gets the new URL, which serves.
    let b = api
        .req(
            Method::POST,
            "/v1/sessions",
            Some(json!({"id": "after-move"})),
        )
        .await;
    assert_eq!(b.status, StatusCode::CREATED);
    let b: Value = b.json().unwrap();
    assert_ne!(b["base_url"].as_str().unwrap(), url);
    assert!(until(b["env"].clone(), StatusCode::OK).await);
    assert_eq!(api.endpoint_lost("after-move").await, false);
    drop(squatter);
    sidecar.shutdown().await.unwrap();
    bore.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bore_server_that_wants_a_secret_names_bore_secret_env() {
    let bore = BoreServer::bind("127.0.0.1:0".parse().unwrap(), Some("wanted"))
        .await
        .unwrap();
    let port = bore.control_addr().port().to_string();
    let err = Sidecar::start(config(&[
        ("upstream", "mock"),
        ("tunnel", "bore"),
        ("bore_server", "127.0.0.1"),
        ("bore_port", &port),
    ]))
    .await
    .unwrap_err();
    let message = format!("{err:#}");
    assert!(message.contains("requires a secret"), "{message}");
    assert!(message.contains("bore_secret_env"), "{message}");
    assert!(message.contains("--bore-secret-env"), "{message}");
    bore.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_wide_redis_limiter_gates_tunnel_starts_and_fails_closed_with_503() {
    let redis = intercept_test::redis::RedisServer::start().unwrap();
    let redis_port = redis.port();
    let bore = BoreServer::bind("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let port = bore.control_addr().port().to_string();
    let url = redis.url();
    let sidecar = Sidecar::start(config(&[
        ("upstream", "mock"),
        ("interception", "elastic"),
        ("multiplex", "2"),
        ("tunnel", "bore"),
        ("bore_server", "127.0.0.1"),
        ("bore_port", &port),
        ("rate_limit_backend", "redis"),
        ("rate_limit_url", &url),
        ("wait_timeout_secs", "30"),
    ]))
    .await
    .unwrap();
    let api = Api::new(&sidecar);
    // 3 sessions on 2 servers: 2 tunnel starts, each reserved in the shared window.
    sessions_with_one_call_each(&api, 3).await;
    let window = redis
        .command(&["HLEN", "intercept:limiter:bore-127.0.0.1"])
        .unwrap();
    assert_eq!(window.trim(), ":2", "both starts are in the fleet's window");

    // Redis goes away: the next server cannot check the budget, so it does not start.
    redis.kill();
    let fourth = api
        .req(Method::POST, "/v1/sessions", Some(json!({"id": "fits"})))
        .await;
    assert_eq!(
        fourth.status,
        StatusCode::CREATED,
        "a seat on a running server"
    );
    let fifth = api
        .req(
            Method::POST,
            "/v1/sessions",
            Some(json!({"id": "needs-a-tunnel"})),
        )
        .await;
    assert_eq!(fifth.status, StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = fifth.json().unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("Redis at redis://127.0.0.1:"), "{message}");
    assert!(message.contains("no tunnel is started"), "{message}");
    let text = api.metrics().await;
    let refused: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("intercept_tunnel_limiter_unavailable_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(refused >= 1, "{text}");
    assert!(text.contains("intercept_tunnel_starts_total 2"), "{text}");

    // Redis is back: starts pass the limiter again.
    let _back = intercept_test::redis::RedisServer::start_on(redis_port).unwrap();
    let sixth = api
        .req(Method::POST, "/v1/sessions", Some(json!({"id": "after"})))
        .await;
    assert_eq!(
        sixth.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&sixth.body)
    );
    sidecar.shutdown().await.unwrap();
    bore.shutdown().await;
}
