//! `GET /v1/models`: the session's upstream listing relayed (so agent loops can read
//! `max_model_len`), with any dialect's auth; never recorded, never failing the harness.

mod common;

use std::time::Duration;

use tokio::time::Instant;

use common::*;
use intercept_core::{Session, SessionConfig, Upstream};
use intercept_server::ServerConfig;
use intercept_test::MODELS_MAX_MODEL_LEN;
use tokio::net::TcpListener;

async fn get_models(base_url: &str, auth: (&str, String)) -> Answer {
    let req = http::Request::get(format!("{base_url}/v1/models"))
        .header(auth.0, auth.1)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    let resp = client().request(req).await.expect("response");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    Answer {
        status,
        headers,
        body,
    }
}

fn ids(a: &Answer) -> Vec<String> {
    a.json()["data"]
        .as_array()
        .expect("a data array")
        .iter()
        .filter_map(|m| m["id"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn the_upstream_listing_is_relayed_with_the_session_model_added() {
    let h = Harness::new().await;
    let mut config = h.session_config("models-relay");
    config
        .upstream
        .headers
        .push(("x-tenant".into(), "team-a".into()));
    let (session, _w, guard) = h.session_with(config).await;
    let secret = guard.model_secret.expose().to_owned();

    let bearer = get_models(
        &guard.base_url,
        ("authorization", format!("Bearer {secret}")),
    )
    .await;
    assert_eq!(bearer.status, 200, "{}", bearer.text());
    let listing = bearer.json();
    assert_eq!(listing["data"][0]["id"], "mock-model");
    assert_eq!(listing["data"][0]["max_model_len"], MODELS_MAX_MODEL_LEN);
    assert_eq!(ids(&bearer), ["mock-model", "policy-model"]);
    let seen = h
        .upstream
        .last_request()
        .expect("the listing was asked for");
    assert_eq!(seen.method, http::Method::GET);
    assert_eq!(seen.path, "/v1/models");
    assert_eq!(seen.header("authorization"), Some("Bearer sk-upstream-key"));
    assert_eq!(seen.header("x-tenant"), Some("team-a"));

    // An Anthropic harness authenticates with `x-api-key`; so is the upstream asked.
    let anthropic = get_models(&guard.base_url, ("x-api-key", secret.clone())).await;
    assert_eq!(anthropic.status, 200, "{}", anthropic.text());
    assert_eq!(ids(&anthropic), ["mock-model", "policy-model"]);
    let seen = h.upstream.last_request().expect("asked again");
    assert_eq!(seen.header("x-api-key"), Some("sk-upstream-key"));
    assert!(seen.header("anthropic-version").is_some());
    assert_eq!(seen.header("authorization"), None);

    // Never recorded, never counted as a call.
    assert_eq!(session.trace().calls.len(), 0);
    assert_eq!(h.server.stats().calls(), 0);
    guard.close().await;
}

#[tokio::test]
async fn a_listing_that_names_the_session_model_is_relayed_as_it_is() {
    let h = Harness::new().await;
    let config = SessionConfig::new(
        "models-same",
        "mock-model",
        Upstream::new(h.upstream.base_url()),
    );
    let (_s, _w, guard) = h.session_with(config).await;
    let secret = guard.model_secret.expose().to_owned();
    let a = get_models(
        &guard.base_url,
        ("authorization", format!("Bearer {secret}")),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(ids(&a), ["mock-model"]);
    guard.close().await;
}

#[tokio::test]
async fn an_unreachable_or_silent_upstream_lists_the_session_model_alone() {
    // A port nobody listens on.
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let dead = format!("http://{}/v1", closed.local_addr().expect("addr"));
    drop(closed);
    // A listener that takes connections and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let silent_url = format!("http://{}/v1", silent.local_addr().expect("addr"));

    let h = Harness::with_config(ServerConfig {
        models_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    })
    .await;
    for (id, url) in [("models-dead", dead), ("models-silent", silent_url)] {
        let config = SessionConfig::new(id, "policy-model", Upstream::new(url));
        let (session, _w, guard) = h.session_with(config).await;
        let secret = guard.model_secret.expose().to_owned();
        let started = Instant::now();
        let a = get_models(
            &guard.base_url,
            ("authorization", format!("Bearer {secret}")),
        )
        .await;
        assert_eq!(a.status, 200, "{id}: {}", a.text());
        assert_eq!(ids(&a), ["policy-model"], "{id}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{id}: bounded by models_timeout"
        );
        assert_eq!(session.trace().calls.len(), 0);
        assert!(session.stop_reason().is_none(), "the rollout goes on");
        guard.close().await;
    }
    drop(silent);
}

#[tokio::test]
async fn an_upstream_error_lists_the_session_model_alone() {
    let h = Harness::new().await;
    // The mock has no `/v1/v1/models`: a 404.
    let config = SessionConfig::new(
        "models-404",
        "policy-model",
        Upstream::new(format!("{}/v1", h.upstream.base_url())),
    );
    let (_s, _w, guard) = h.session_with(config).await;
    let secret = guard.model_secret.expose().to_owned();
    let a = get_models(
        &guard.base_url,
        ("authorization", format!("Bearer {secret}")),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(ids(&a), ["policy-model"]);
    guard.close().await;
}
