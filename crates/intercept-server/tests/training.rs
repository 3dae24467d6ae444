//! Training-grade capture: pause and resume under load, session-sticky engines with
//! fail-over, token ids and logprobs with byte-identical harness replies.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::fake_engine::{answer_text, ids_of, logprob_of, EngineConfig, FakeEngine};
use common::*;
use intercept_core::{
    Interception, PauseKind, PauseMode, RolloutSession, SessionConfig, TokenCapture, Upstream,
};
use intercept_server::routing::preference;
use intercept_server::{InterceptionServer, ServerConfig, GENERATED_HEADER};
use serde_json::{json, Value};

async fn server(config: ServerConfig) -> InterceptionServer {
    let server = InterceptionServer::new(config).expect("server");
    server.start().await.expect("start");
    server
}

fn config(id: &str, upstream: Upstream) -> SessionConfig {
    SessionConfig::new(id, "policy-model", upstream)
}

async fn rollout(
    server: &InterceptionServer,
    session: RolloutSession,
) -> (Arc<RolloutSession>, intercept_core::SlotGuard) {
    let session = Arc::new(session);
    let guard = server.acquire(session.clone()).await.expect("acquire");
    (session, guard)
}

fn engine(name: &str, token_ids: bool) -> EngineConfig {
    EngineConfig {
        name: name.into(),
        token_ids,
    }
}

/// Polls a condition of the server's own status (bounded): used to await held calls,
/// which have no other observable signal.
async fn until(mut cond: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("condition not reached in time");
}

// ---------------------------------------------------------------------------------------
// Pause and resume

#[tokio::test]
async fn hold_pause_under_load_serves_nothing_and_loses_nothing() {
    let eng = FakeEngine::start(engine("e", true)).await;
    let server = server(ServerConfig::default()).await;
    let (session, guard) = rollout(
        &server,
        RolloutSession::new(config("paused", Upstream::new(eng.base_url()))),
    )
    .await;
    let url = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();
    let call = |i: usize, stream: bool| {
        let (url, secret) = (url.clone(), secret.clone());
        tokio::spawn(async move {
            post_json(
                &url,
                Some(&secret),
                &chat_body(&format!("call {i}"), stream),
            )
            .await
        })
    };
    // Six calls in flight (three of them streams already relaying their first chunk).
    eng.block();
    let inflight: Vec<_> = (0..6).map(|i| call(i, i % 2 == 0)).collect();
    eng.wait_received(6).await;
    let status = server
        .pause(PauseMode::hold(Duration::from_secs(30)))
        .await
        .expect("pause");
    assert!(status.paused);
    assert_eq!(status.mode, Some(PauseKind::Hold));
    assert_eq!((status.epoch, status.inflight), (0, 6));
    // Ten more arrive during the pause: they are held, none reaches the engine.
    let held: Vec<_> = (6..16).map(|i| call(i, i % 3 == 0)).collect();
    until(|| server.pause_status().held == 10).await;
    // The in-flight calls finish, streams included; nothing new is served meanwhile.
    eng.release();
    for h in inflight {
        let a = h.await.expect("join");
        assert_eq!(a.status, 200, "{}", a.text());
        assert!(
            a.text().contains("echo: call") || a.text().contains("\"content\":\"echo:\""),
            "{}",
            a.text()
        );
    }
    server.wait_idle().await;
    let status = server.pause_status();
    assert_eq!((status.inflight, status.held), (0, 10));
    assert_eq!(eng.received(), 6, "no call was served during the pause");
    // Resume: every held call completes, in the new epoch.
    let status = server.resume().await.expect("resume");
    assert!(!status.paused);
    assert_eq!(status.epoch, 1);
    for h in held {
        let a = h.await.expect("join");
        assert_eq!(a.status, 200, "{}", a.text());
    }
    assert_eq!(eng.received(), 16);
    let trace = session.trace();
    assert_eq!(trace.calls.len(), 16);
    assert!(trace.calls.iter().all(|c| c.error.is_none()));
    let epochs = trace.calls.iter().fold([0usize; 2], |mut n, c| {
        n[c.epoch as usize] += 1;
        n
    });
    assert_eq!(epochs, [6, 10]);
    // The record's JSON carries the epoch.
    let line: Value = serde_json::from_str(&trace.calls[15].to_json_line()).expect("json");
    assert_eq!(line["epoch"], 1);
    guard.close().await;
    server.stop().await.expect("stop");
}

#[tokio::test]
async fn reject_pause_answers_429_with_retry_after_and_hold_times_out_with_503() {
    let eng = FakeEngine::start(engine("e", true)).await;
    let server = server(ServerConfig::default()).await;
    let (session, guard) = rollout(
        &server,
        RolloutSession::new(config("rejected", Upstream::new(eng.base_url()))),
    )
    .await;
    let secret = guard.model_secret.expose().to_owned();
    server
        .pause(PauseMode::reject(Duration::from_millis(2500)))
        .await
        .expect("pause");
    let bodies: Vec<Value> = (0..8)
        .map(|i| chat_body(&format!("r{i}"), i % 2 == 0))
        .collect();
    let answers = futures_util::future::join_all(
        bodies
            .iter()
            .map(|b| post_json(&guard.base_url, Some(&secret), b)),
    )
    .await;
    for a in &answers {
        assert_eq!(a.status, 429, "{}", a.text());
        assert_eq!(a.headers["retry-after"], "3");
        assert_eq!(a.headers[GENERATED_HEADER], "internal");
        assert_eq!(a.json()["error"]["type"], "rate_limit_error");
    }
    assert_eq!(eng.received(), 0);
    assert!(session.trace().calls.is_empty());
    // Hold with a short timeout: 503 with Retry-After once it elapses.
    server
        .pause(PauseMode::hold(Duration::from_millis(50)))
        .await
        .expect("pause");
    let a = post_json(&guard.base_url, Some(&secret), &chat_body("late", false)).await;
    assert_eq!(a.status, 503, "{}", a.text());
    assert_eq!(a.headers["retry-after"], "1");
    assert!(a.text().contains("paused"), "{}", a.text());
    let status = Interception::resume(&server).await.expect("resume");
    assert_eq!(status.epoch, 1);
    let a = post_json(&guard.base_url, Some(&secret), &chat_body("after", false)).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(session.trace().calls[0].epoch, 1);
    // Resuming twice does not move the epoch.
    assert_eq!(server.resume().await.expect("resume").epoch, 1);
    guard.close().await;
    server.stop().await.expect("stop");
}

#[tokio::test]
async fn releasing_a_held_rollout_answers_409() {
    let eng = FakeEngine::start(engine("e", true)).await;
    let server = server(ServerConfig::default()).await;
    let (_session, guard) = rollout(
        &server,
        RolloutSession::new(config("held-release", Upstream::new(eng.base_url()))),
    )
    .await;
    server
        .pause(PauseMode::hold(Duration::from_secs(30)))
        .await
        .expect("pause");
    let (url, secret) = (
        guard.base_url.clone(),
        guard.model_secret.expose().to_owned(),
    );
    let held =
        tokio::spawn(async move { post_json(&url, Some(&secret), &chat_body("x", false)).await });
    until(|| server.pause_status().held == 1).await;
    guard.close().await;
    assert_eq!(held.await.expect("join").status, 409);
    assert_eq!(server.pause_status().held, 0);
    server.stop().await.expect("stop");
}

// ---------------------------------------------------------------------------------------
// Session-sticky routing

#[tokio::test]
async fn sessions_stick_to_their_engine_and_fail_over_when_it_dies() {
    let mut engines = Vec::new();
    for i in 0..3 {
        engines.push(Some(
            FakeEngine::start(engine(&format!("engine-{i}"), true)).await,
        ));
    }
    let urls: Vec<String> = engines.iter().flatten().map(FakeEngine::base_url).collect();
    let server = server(ServerConfig {
        engine_retry_after: Duration::from_millis(200),
        ..ServerConfig::default()
    })
    .await;
    let mut rollouts = Vec::new();
    for i in 0..30 {
        let id = format!("sticky-{i}");
        rollouts.push(
            rollout(
                &server,
                RolloutSession::new(config(&id, Upstream::engines_of(urls.clone()))),
            )
            .await,
        );
    }
    let expected: HashMap<String, Vec<usize>> = rollouts
        .iter()
        .map(|(s, _)| (s.config().id.clone(), preference(&s.config().id, &urls)))
        .collect();
    let round = |tag: &'static str| {
        let calls = rollouts.iter().map(|(_, g)| {
            let (url, secret) = (g.base_url.clone(), g.model_secret.expose().to_owned());
            async move {
                let mut out = Vec::new();
                for n in 0..2 {
                    out.push(
                        post_json(
                            &url,
                            Some(&secret),
                            &chat_body(&format!("{tag}{n}"), n == 1),
                        )
                        .await,
                    );
                }
                out
            }
        });
        futures_util::future::join_all(calls)
    };
    for answers in round("before").await {
        assert!(answers.iter().all(|a| a.status == 200));
    }
    // Every session's calls went to its first engine, with X-Session-ID.
    for (session, _) in &rollouts {
        let id = &session.config().id;
        let first = &urls[expected[id][0]];
        for c in session.trace().calls {
            assert_eq!(c.engine.as_ref(), Some(first), "{id}");
        }
    }
    for (i, e) in engines.iter().flatten().enumerate() {
        for seen in e.seen() {
            let id = seen.session.expect("X-Session-ID sent");
            assert_eq!(expected[&id][0], i, "{id} reached engine {i}");
        }
    }
    // Kill the engine with the most sessions, mid-run.
    let victim = (0..3)
        .max_by_key(|i| expected.values().filter(|p| p[0] == *i).count())
        .unwrap_or(0);
    let victim_addr = engines[victim].take().expect("engine").kill().await;
    for answers in round("after").await {
        for a in answers {
            assert_eq!(
                a.status,
                200,
                "fail-over is invisible to the harness: {}",
                a.text()
            );
        }
    }
    let mut moved = 0;
    for (session, _) in &rollouts {
        let id = &session.config().id;
        let pref = &expected[id];
        let want = if pref[0] == victim { pref[1] } else { pref[0] };
        moved += usize::from(pref[0] == victim);
        for c in &session.trace().calls[2..] {
            assert_eq!(c.engine.as_ref(), Some(&urls[want]), "{id}");
            assert!(c.error.is_none());
        }
    }
    assert!(moved > 0);
    // The engine comes back: after its retry window, its sessions return to it.
    engines[victim] = Some(FakeEngine::restart(victim_addr, engine("engine-back", true)).await);
    let (back, guard) = rollouts
        .iter()
        .find(|(s, _)| expected[&s.config().id][0] == victim)
        .expect("a session of the victim");
    let mut returned = false;
    for _ in 0..100 {
        let a = post_json(
            &guard.base_url,
            Some(guard.model_secret.expose()),
            &chat_body("probe", false),
        )
        .await;
        assert_eq!(a.status, 200);
        if a.json()["model"] == "engine-back" {
            returned = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        returned,
        "{} never went back to its engine",
        back.config().id
    );
    drop(rollouts);
    server.stop().await.expect("stop");
}

// ---------------------------------------------------------------------------------------
// Token ids and logprobs

struct Pair {
    server: InterceptionServer,
    plain: (Arc<RolloutSession>, intercept_core::SlotGuard),
    captured: (Arc<RolloutSession>, intercept_core::SlotGuard),
}

async fn pair(eng: &FakeEngine) -> Pair {
    let server = server(ServerConfig::default()).await;
    let plain = rollout(
        &server,
        RolloutSession::new(config("plain", Upstream::new(eng.base_url()))),
    )
    .await;
    let captured = rollout(
        &server,
        RolloutSession::new(config("captured", Upstream::new(eng.base_url())))
            .with_capture_tokens(true),
    )
    .await;
    Pair {
        server,
        plain,
        captured,
    }
}

async fn both(p: &Pair, path: &str, body: &Value) -> (Answer, Answer) {
    let bytes = serde_json::to_vec(body).expect("json");
    let plain = post(
        &p.plain.1.base_url,
        path,
        Some(p.plain.1.model_secret.expose()),
        bytes.clone(),
        &[],
    )
    .await;
    let captured = post(
        &p.captured.1.base_url,
        path,
        Some(p.captured.1.model_secret.expose()),
        bytes,
        &[],
    )
    .await;
    (plain, captured)
}

#[tokio::test]
async fn vllm_capture_records_ids_and_logprobs_and_the_harness_sees_the_same_bytes() {
    let eng = FakeEngine::start(engine("vllm", true)).await;
    let p = pair(&eng).await;
    let cases = [
        (
            "/v1/chat/completions",
            chat_body("one two three", false),
            "one two three",
        ),
        (
            "/v1/chat/completions",
            chat_body("four five", true),
            "four five",
        ),
        (
            "/v1/completions",
            json!({"model": "x", "prompt": "six seven"}),
            "six seven",
        ),
        (
            "/v1/completions",
            json!({"model": "x", "prompt": "eight", "stream": true}),
            "eight",
        ),
    ];
    for (n, (path, body, prompt)) in cases.iter().enumerate() {
        let (plain, captured) = both(&p, path, body).await;
        assert_eq!(plain.status, 200, "{}", plain.text());
        assert_eq!(captured.status, 200, "{}", captured.text());
        assert_eq!(
            plain.text(),
            captured.text(),
            "the harness sees exactly the no-capture bytes ({path})"
        );
        assert!(
            !captured.text().contains("token_ids\":["),
            "{}",
            captured.text()
        );
        let record = p.captured.0.trace().calls[n].clone();
        assert_eq!(record.token_capture, TokenCapture::Captured, "{path}");
        let text = answer_text(prompt);
        let ids = ids_of(&text);
        assert_eq!(record.completion_token_ids.as_ref(), Some(&ids));
        assert_eq!(record.prompt_token_ids, Some(ids_of(prompt)));
        let lps: Vec<f64> = (0..ids.len()).map(logprob_of).collect();
        assert_eq!(record.completion_logprobs, Some(lps));
        assert_eq!(p.plain.0.trace().calls[n].token_capture, TokenCapture::Off);
        assert!(p.plain.0.trace().calls[n].completion_token_ids.is_none());
        // What went upstream asked for ids and sampled logprobs, never top_logprobs.
        let sent = &eng.seen()[2 * n + 1].body;
        assert_eq!(sent["return_token_ids"], true);
        assert!(
            sent["logprobs"] == json!(true) || sent["logprobs"] == json!(0),
            "{sent}"
        );
        assert!(sent.get("top_logprobs").is_none());
        assert!(eng.seen()[2 * n].body.get("return_token_ids").is_none());
        // The record round-trips through its JSON line.
        let back: intercept_core::CallRecord =
            serde_json::from_str(&record.to_json_line()).expect("round trip");
        assert_eq!(back, record);
    }
    // A harness that asked for logprobs itself keeps them.
    let mut body = chat_body("nine ten", false);
    body["logprobs"] = json!(true);
    let (plain, captured) = both(&p, "/v1/chat/completions", &body).await;
    assert_eq!(plain.text(), captured.text());
    assert!(captured.json()["choices"][0]["logprobs"]["content"].is_array());
    p.server.stop().await.expect("stop");
}

#[tokio::test]
async fn an_engine_without_token_ids_still_serves_and_the_record_says_so() {
    let eng = FakeEngine::start(engine("openai-like", false)).await;
    let p = pair(&eng).await;
    for (n, stream) in [false, true].into_iter().enumerate() {
        let (plain, captured) = both(
            &p,
            "/v1/chat/completions",
            &chat_body("no ids here", stream),
        )
        .await;
        assert_eq!(captured.status, 200, "{}", captured.text());
        assert_eq!(plain.text(), captured.text());
        let record = &p.captured.0.trace().calls[n];
        assert_eq!(record.token_capture, TokenCapture::Missing);
        assert_eq!(record.completion_token_ids, None);
        assert_eq!(record.prompt_token_ids, None);
        // Logprobs were still returned (and recorded), though the harness did not see them.
        assert_eq!(
            record.completion_logprobs.as_ref().map(Vec::len),
            Some(ids_of(&answer_text("no ids here")).len())
        );
        let line: Value = serde_json::from_str(&record.to_json_line()).expect("json");
        assert_eq!(line["token_capture"], "missing");
    }
    p.server.stop().await.expect("stop");
}

// ---------------------------------------------------------------------------------------
// Parallel turns on one session

/// Two calls in flight at once on one session, held by the engine until both arrived,
/// each extending the same prefix: both commit into the session's episode, the shared
/// prefix appears once (one root), and both sampled nodes exist.
#[tokio::test]
async fn parallel_turns_extending_one_prefix_share_it_in_the_episode() {
    let eng = FakeEngine::start(engine("e", false)).await;
    let server = server(ServerConfig::default()).await;
    let (session, guard) = rollout(
        &server,
        RolloutSession::new(config("parallel", Upstream::new(eng.base_url()))),
    )
    .await;
    let url = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();
    let system = json!({"role": "system", "content": "You are a subagent runner."});
    let eng = &eng;
    let parallel = |bodies: [Value; 2]| {
        let (url, secret) = (url.clone(), secret.clone());
        async move {
            eng.block();
            let calls: Vec<_> = bodies
                .into_iter()
                .map(|body| {
                    let (url, secret) = (url.clone(), secret.clone());
                    tokio::spawn(async move { post_json(&url, Some(&secret), &body).await })
                })
                .collect();
            let before = eng.received();
            eng.wait_received(before + 2).await;
            eng.release();
            let mut answers = Vec::new();
            for c in calls {
                let a = c.await.expect("join");
                assert_eq!(a.status, 200, "{}", a.text());
                answers.push(a.json()["choices"][0]["message"].clone());
            }
            answers
        }
    };

    // Two first turns at once under one system prompt: one root.
    let first = parallel([
        json!({"model": "m", "messages": [system, {"role": "user", "content": "task a"}]}),
        json!({"model": "m", "messages": [system, {"role": "user", "content": "task b"}]}),
    ])
    .await;
    // Two turns at once extending the same three-message prefix.
    let prefix = vec![
        system.clone(),
        json!({"role": "user", "content": "task a"}),
        first[0].clone(),
    ];
    let with = |text: &str| {
        let mut messages = prefix.clone();
        messages.push(json!({"role": "user", "content": text}));
        json!({"model": "m", "messages": messages})
    };
    parallel([with("branch x"), with("branch y")]).await;

    let trace = session.trace();
    assert_eq!(trace.calls.len(), 4);
    assert!(
        trace.calls.iter().all(|c| c.node.is_some()),
        "every call has its node"
    );
    let episode = session.episode();
    let roots: Vec<_> = episode
        .nodes
        .iter()
        .filter(|n| n.parent.is_none())
        .collect();
    assert_eq!(roots.len(), 1, "the system prompt is one root: {roots:?}");
    let count = |text: &str| {
        episode
            .nodes
            .iter()
            .filter(|n| {
                serde_json::to_string(&n.message)
                    .unwrap_or_default()
                    .contains(text)
            })
            .count()
    };
    // The shared prefix once each: system, task a, its answer.
    assert_eq!(count("subagent runner"), 1);
    assert_eq!(count("\"task a\""), 1);
    let sampled: Vec<_> = episode.nodes.iter().filter(|n| n.sampled).collect();
    assert_eq!(
        sampled.len(),
        4,
        "both sampled nodes of each parallel pair exist"
    );
    // system, task a, task b, their answers, branch x, branch y, their answers.
    assert_eq!(episode.nodes.len(), 9);
    assert_eq!(episode.branches.len(), 3, "task b, branch x, branch y");
    let answer_a = trace.calls[0..2]
        .iter()
        .find(|c| c.request.source().windows(6).any(|w| w == b"task a"))
        .and_then(|c| c.node)
        .expect("task a's node");
    let children: Vec<_> = episode
        .nodes
        .iter()
        .filter(|n| n.parent == Some(answer_a as u32))
        .collect();
    assert_eq!(children.len(), 2, "both branches hang off task a's answer");
    guard.close().await;
    server.stop().await.expect("stop");
}
