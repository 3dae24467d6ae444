//! The `tokens` setting through the sidecar: the `tokens` field of `POST /v1/sessions`,
//! the `[tokens]` default of a config file it is merged over, where the session's
//! setting shows (`GET /v1/sessions/{id}`, the log header's settings), a call answered on
//! the token path, and the 400s of a bad setting. The tests that load Qwen3's real
//! tokenizer find it through `INTERCEPT_QWEN3_TOKENIZER` (a folder): without it they fail
//! under `CI` and are skipped with a notice otherwise.

// Helpers outside #[test] functions panic on purpose, like the tests themselves.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::control::{error_of, Api};
use http::{Method, StatusCode};
use intercept_cli::config::{Layers, ServeConfig, UpstreamSetting};
use intercept_cli::sidecar::Sidecar;
use intercept_core::log::LogReader;
use intercept_core::{CallRecord, TokenPath};
use intercept_test::{MockConfig, MockUpstream, Reply};
use serde_json::{json, Value};

/// Qwen3's tokenizer folder, or `None` (a notice) outside CI.
fn tokenizer_dir() -> Option<String> {
    match std::env::var("INTERCEPT_QWEN3_TOKENIZER") {
        Ok(dir) if !dir.is_empty() => Some(dir),
        _ if std::env::var_os("CI").is_some() => {
            panic!("INTERCEPT_QWEN3_TOKENIZER must name Qwen3's tokenizer folder under CI")
        }
        _ => {
            eprintln!("notice: INTERCEPT_QWEN3_TOKENIZER is not set; skipping this test");
            None
        }
    }
}

/// A sidecar on the embedded mock with a trace directory and the settings of `file` (a
/// config file's text).
async fn sidecar(dir: &Path, file: &str) -> Sidecar {
    let config = ServeConfig::from_layers(Layers {
        file: Some((Path::new("intercept.toml"), file)),
        env: &[],
        flags: &[],
    })
    .unwrap();
    Sidecar::start(ServeConfig {
        upstream: Some(UpstreamSetting::Mock),
        trace_dir: Some(dir.to_owned()),
        ..config
    })
    .await
    .unwrap()
}

/// `POST /v1/sessions` with `body`, answered 400 `invalid_request_error`: its message.
async fn refused(api: &Api, body: Value) -> String {
    let resp = api.req(Method::POST, "/v1/sessions", Some(body)).await;
    error_of(&resp, StatusCode::BAD_REQUEST, "invalid_request_error")
}

/// The session's `tokens` as `GET /v1/sessions/{id}` shows it.
async fn status_tokens(api: &Api, id: &str) -> Value {
    api.json(Method::GET, &format!("/v1/sessions/{id}"))
        .await
        .get("tokens")
        .cloned()
        .unwrap()
}

/// The session's settings as its log header records them.
async fn header_settings(api: &Api, id: &str) -> Value {
    let log = api
        .req(
            Method::GET,
            &format!("/v1/sessions/{id}/trace?format=log"),
            None,
        )
        .await;
    assert_eq!(log.status, StatusCode::OK);
    let log = LogReader::from_bytes(&log.body).unwrap();
    log.header().unwrap()["settings"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_tokens_field_is_a_400_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(dir.path(), "").await;
    let api = Api::new(&sidecar);
    let missing = dir.path().join("no-such-tokenizer");
    let missing = missing.to_str().unwrap();
    for (body, needles) in [
        (
            json!({"tokens": "qwen3"}),
            &["tokens: expected an object of renderer"][..],
        ),
        (
            json!({"tokens": {"renderer": "qwen3", "tokenizer": "/m", "thinking": true}}),
            &["tokens: unknown field \"thinking\"", "enable_thinking"][..],
        ),
        (
            json!({"tokens": {"renderer": "qwen3", "tokenizer": "/m", "engine": "tgi"}}),
            &["tokens.engine", "`tgi`", "vllm"][..],
        ),
        (
            json!({"tokens": {"renderer": "qwen3", "tokenizer": "/m", "on_mismatch": "retry"}}),
            &["tokens.on_mismatch", "`retry`"][..],
        ),
        (
            json!({"tokens": {"renderer": "qwen3", "tokenizer": "/m", "enable_thinking": "no"}}),
            &["tokens.enable_thinking: expected true or false"][..],
        ),
        // No default to merge over: renderer and tokenizer are required.
        (
            json!({"tokens": {"enable_thinking": false}}),
            &["missing field `renderer`", "no `tokens` default"][..],
        ),
        // The server refuses the session when it is acquired, naming the path.
        (
            json!({"id": "no-tokenizer", "tokens": {"renderer": "qwen3", "tokenizer": missing}}),
            &["tokens.tokenizer", missing][..],
        ),
    ] {
        let message = refused(&api, body.clone()).await;
        for needle in needles {
            assert!(message.contains(needle), "{body}: {message}");
        }
    }
    // A refused session leaves nothing behind: not a session, not a trace file, so the
    // id can be created again once the setting is right.
    let _ = error_of(
        &api.req(Method::GET, "/v1/sessions/no-tokenizer", None)
            .await,
        StatusCode::NOT_FOUND,
        "not_found_error",
    );
    assert!(!dir.path().join("no-tokenizer.jsonl").exists());
    let again = api.create(Some(json!({"id": "no-tokenizer"}))).await;
    assert_eq!(again["id"], "no-tokenizer");
    assert_eq!(status_tokens(&api, "no-tokenizer").await, Value::Null);
    assert!(header_settings(&api, "no-tokenizer")
        .await
        .get("tokens")
        .is_none());
    sidecar.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_renderer_is_a_400_naming_it() {
    let Some(tokenizer) = tokenizer_dir() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(dir.path(), "").await;
    let api = Api::new(&sidecar);
    let message = refused(
        &api,
        json!({"id": "llama", "tokens": {"renderer": "llama9", "tokenizer": tokenizer}}),
    )
    .await;
    assert!(
        message.contains("tokens.renderer") && message.contains("llama9"),
        "{message}"
    );
    assert!(!dir.path().join("llama.jsonl").exists());
    sidecar.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_takes_tokens_and_its_settings_show_them() {
    let Some(tokenizer) = tokenizer_dir() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(dir.path(), "").await;
    let api = Api::new(&sidecar);
    api.create(Some(json!({
        "id": "tito",
        "tokens": {"renderer": "qwen3", "tokenizer": tokenizer, "enable_thinking": false},
    })))
    .await;
    // The setting as the session holds it, its defaults filled in.
    let expected = json!({"renderer": "qwen3", "tokenizer": tokenizer, "engine": "vllm",
                          "on_mismatch": "render", "enable_thinking": false});
    assert_eq!(status_tokens(&api, "tito").await, expected);
    assert_eq!(header_settings(&api, "tito").await["tokens"], expected);
    // `null` and `false` are off, as is an absent field without a default.
    for (id, tokens) in [("off-null", json!(null)), ("off-false", json!(false))] {
        api.create(Some(json!({"id": id, "tokens": tokens}))).await;
        assert_eq!(status_tokens(&api, id).await, Value::Null);
        assert!(header_settings(&api, id).await.get("tokens").is_none());
    }
    // Released, the session still says what it was.
    let released = api.req(Method::DELETE, "/v1/sessions/tito", None).await;
    assert_eq!(released.status, StatusCode::OK);
    assert_eq!(status_tokens(&api, "tito").await, expected);
    sidecar.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_object_is_merged_over_the_config_files_default() {
    let Some(tokenizer) = tokenizer_dir() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = format!(
        "[tokens]\nrenderer = \"qwen3\"\ntokenizer = {}\non_mismatch = \"fail\"\n",
        toml::Value::String(tokenizer.clone())
    );
    let sidecar = sidecar(dir.path(), &file).await;
    let api = Api::new(&sidecar);
    let default = json!({"renderer": "qwen3", "tokenizer": tokenizer, "engine": "vllm",
                         "on_mismatch": "fail"});

    // Absent: the default.
    api.create(Some(json!({"id": "plain"}))).await;
    assert_eq!(status_tokens(&api, "plain").await, default);
    assert_eq!(header_settings(&api, "plain").await["tokens"], default);

    // One key: the default's others stay.
    api.create(Some(
        json!({"id": "no-thinking", "tokens": {"enable_thinking": false, "engine": "sglang"}}),
    ))
    .await;
    let mut merged = default.clone();
    merged["enable_thinking"] = json!(false);
    merged["engine"] = json!("sglang");
    assert_eq!(status_tokens(&api, "no-thinking").await, merged);
    assert_eq!(header_settings(&api, "no-thinking").await["tokens"], merged);

    // `null` turns the default off; a `null` key unsets the default's.
    api.create(Some(json!({"id": "off", "tokens": null}))).await;
    assert_eq!(status_tokens(&api, "off").await, Value::Null);
    assert!(header_settings(&api, "off").await.get("tokens").is_none());
    api.create(Some(
        json!({"id": "unset", "tokens": {"on_mismatch": null}}),
    ))
    .await;
    assert_eq!(status_tokens(&api, "unset").await["on_mismatch"], "render");

    // A merged setting the server refuses is a 400 all the same.
    let message = refused(&api, json!({"tokens": {"renderer": "llama9"}})).await;
    assert!(message.contains("llama9"), "{message}");
    sidecar.shutdown().await.unwrap();

    // A default whose tokenizer is not there fails the start, naming it.
    let missing = dir.path().join("missing");
    let e = Sidecar::start(ServeConfig {
        upstream: Some(UpstreamSetting::Mock),
        tokens: Some(intercept_core::TokensConfig::new(
            "qwen3",
            missing.to_str().unwrap(),
        )),
        ..ServeConfig::default()
    })
    .await
    .unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("setting `tokens`") && e.contains(missing.to_str().unwrap()),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_of_a_tokens_session_is_answered_on_the_token_path() {
    let Some(tokenizer) = tokenizer_dir() else {
        return;
    };
    // An engine that serves vLLM's token route with Qwen3's tokenizer.
    let engine = MockUpstream::start_with(MockConfig {
        tokenizer: Some(intercept_tokens::shared(&tokenizer).unwrap()),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    engine.push(Reply::text("Paris."));
    let dir = tempfile::tempdir().unwrap();
    let sidecar = sidecar(dir.path(), "").await;
    let api = Api::new(&sidecar);
    let created = api
        .create(Some(json!({
            "id": "tito-call",
            "upstream": {"base_url": format!("{}/v1", engine.base_url().trim_end_matches("/v1"))},
            "tokens": {"renderer": "qwen3", "tokenizer": tokenizer},
        })))
        .await;
    let resp = api.chat(&created["env"], "Capital of France?").await;
    assert_eq!(
        resp.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&resp.body)
    );
    let answer = resp.json().unwrap();
    assert_eq!(
        answer["choices"][0]["message"]["content"], "Paris.",
        "{answer}"
    );
    // The engine got token ids, and the record holds them with the path taken.
    let requests = engine.requests();
    assert_eq!(requests.len(), 1);
    assert!(
        requests[0].path.ends_with("/inference/v1/generate"),
        "{}",
        requests[0].path
    );
    let sent = requests[0].json().unwrap()["token_ids"].clone();
    let trace = api.json(Method::GET, "/v1/sessions/tito-call/trace").await;
    let record: CallRecord = serde_json::from_value(trace["calls"][0].clone()).unwrap();
    assert_eq!(record.token_path, Some(TokenPath::Rendered));
    assert_eq!(
        serde_json::to_value(record.prompt_token_ids.unwrap()).unwrap(),
        sent
    );
    assert!(!record.completion_token_ids.unwrap().is_empty());
    sidecar.shutdown().await.unwrap();
}
