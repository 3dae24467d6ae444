//! Replay and coalescing of SDK retries (`x-stainless-retry-count > 0`).

mod common;

use std::time::Duration;

use common::*;
use intercept_test::Reply;

fn body() -> Vec<u8> {
    serde_json::to_vec(&chat_body("same question", false)).expect("json")
}

#[tokio::test]
async fn marked_retry_after_a_served_response_replays_it() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("retry-replay").await;
    let secret = guard.model_secret.expose().to_owned();
    let first = post(
        &guard.base_url,
        "/v1/chat/completions",
        Some(&secret),
        body(),
        &[("x-stainless-retry-count", "0")],
    )
    .await;
    assert_eq!(first.status, 200);
    let again = post(
        &guard.base_url,
        "/v1/chat/completions",
        Some(&secret),
        body(),
        &[("x-stainless-retry-count", "1")],
    )
    .await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body, first.body, "the replay is byte-identical");
    assert_eq!(
        h.upstream.request_count(),
        1,
        "no upstream call for the replay"
    );
    let trace = session.trace();
    assert_eq!(trace.calls.len(), 1, "a replay adds no record");
    assert_eq!(trace.replays, 1);
    guard.close().await;
}

#[tokio::test]
async fn unmarked_repeats_always_reach_the_upstream() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("retry-fresh").await;
    let secret = guard.model_secret.expose().to_owned();
    let mut answers = Vec::new();
    for _ in 0..2 {
        let a = post(
            &guard.base_url,
            "/v1/chat/completions",
            Some(&secret),
            body(),
            &[],
        )
        .await;
        assert_eq!(a.status, 200);
        answers.push(a.body);
    }
    assert_eq!(
        h.upstream.request_count(),
        2,
        "a repeated body alone is no proof of a retry"
    );
    assert_eq!(session.trace().calls.len(), 2);
    // The fresh attempt superseded the first: a marked retry now gets the second answer.
    let retry = [("x-stainless-retry-count", "1")];
    let r = post(
        &guard.base_url,
        "/v1/chat/completions",
        Some(&secret),
        body(),
        &retry,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, answers[1]);
    assert_eq!(h.upstream.request_count(), 2);
    assert_eq!(session.trace().replays, 1);
    guard.close().await;
}

#[tokio::test]
async fn marked_retry_during_the_attempt_shares_its_answer() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("retry-coalesce").await;
    h.upstream
        .push(Reply::text("computed once").with_header_delay(Duration::from_millis(300)));
    let base = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();
    let (b1, s1) = (base.clone(), secret.clone());
    let original =
        tokio::spawn(
            async move { post(&b1, "/v1/chat/completions", Some(&s1), body(), &[]).await },
        );
    h.upstream.wait_for_requests(1).await;
    let retry = post(
        &base,
        "/v1/chat/completions",
        Some(&secret),
        body(),
        &[("x-stainless-retry-count", "1")],
    )
    .await;
    let original = original.await.expect("join");
    assert_eq!(original.status, 200);
    assert_eq!(retry.status, 200);
    assert_eq!(retry.body, original.body);
    assert_eq!(h.upstream.request_count(), 1);
    assert_eq!(session.trace().calls.len(), 1);
    assert_eq!(session.trace().replays, 1);
    guard.close().await;
}

#[tokio::test]
async fn a_failed_original_answers_its_coalesced_retry_with_503() {
    let h = Harness::new().await;
    let (_session, _w, guard) = h.session("retry-failed").await;
    h.upstream
        .push(Reply::error(500, "engine died").with_header_delay(Duration::from_millis(300)));
    let base = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();
    let (b1, s1) = (base.clone(), secret.clone());
    let original =
        tokio::spawn(
            async move { post(&b1, "/v1/chat/completions", Some(&s1), body(), &[]).await },
        );
    h.upstream.wait_for_requests(1).await;
    let retry = post(
        &base,
        "/v1/chat/completions",
        Some(&secret),
        body(),
        &[("x-stainless-retry-count", "1")],
    )
    .await;
    assert_eq!(original.await.expect("join").status, 500);
    assert_eq!(retry.status, 503);
    assert!(
        retry.text().contains("upstream attempt failed"),
        "{}",
        retry.text()
    );
    assert_eq!(h.upstream.request_count(), 1);
    guard.close().await;
}

#[tokio::test]
async fn streams_are_never_replayed() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("retry-stream").await;
    let secret = guard.model_secret.expose().to_owned();
    let stream_body = serde_json::to_vec(&chat_body("q", true)).expect("json");
    for n in ["0", "1"] {
        let a = post(
            &guard.base_url,
            "/v1/chat/completions",
            Some(&secret),
            stream_body.clone(),
            &[("x-stainless-retry-count", n)],
        )
        .await;
        assert_eq!(a.status, 200);
    }
    assert_eq!(h.upstream.request_count(), 2);
    assert_eq!(session.trace().calls.len(), 2);
    guard.close().await;
}
