//! Replay and coalescing of SDK retries (`x-stainless-retry-count > 0`) and of calls
//! named by an `Idempotency-Key`.

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
    // The body now names two logical requests: a marked retry could be a retry of
    // either, so it is not answered with one of them but goes upstream.
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
    assert_eq!(
        h.upstream.request_count(),
        3,
        "an ambiguous retry goes upstream"
    );
    assert_eq!(session.trace().calls.len(), 3);
    assert_eq!(session.trace().replays, 0);
    // And stays ambiguous for the next retry.
    let again = post(
        &guard.base_url,
        "/v1/chat/completions",
        Some(&secret),
        body(),
        &retry,
    )
    .await;
    assert_eq!(again.status, 200);
    assert_eq!(h.upstream.request_count(), 4);
    assert_eq!(session.trace().replays, 0);
    guard.close().await;
}

#[tokio::test]
async fn a_retry_of_a_body_in_flight_twice_is_not_coalesced() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("retry-ambiguous-flight").await;
    let delay = Duration::from_millis(400);
    h.upstream.push_many([
        Reply::text("first").with_header_delay(delay),
        Reply::text("second").with_header_delay(delay),
        Reply::text("third"),
    ]);
    let base = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();
    let fresh = |n: usize| {
        let (b, s) = (base.clone(), secret.clone());
        async move {
            let _ = n;
            post(&b, "/v1/chat/completions", Some(&s), body(), &[]).await
        }
    };
    let one = tokio::spawn(fresh(1));
    h.upstream.wait_for_requests(1).await;
    let two = tokio::spawn(fresh(2));
    h.upstream.wait_for_requests(2).await;
    let retry = post(
        &base,
        "/v1/chat/completions",
        Some(&secret),
        body(),
        &[("x-stainless-retry-count", "1")],
    )
    .await;
    assert_eq!(retry.status, 200);
    assert!(retry.text().contains("third"), "{}", retry.text());
    assert_eq!(one.await.expect("join").status, 200);
    assert_eq!(two.await.expect("join").status, 200);
    assert_eq!(h.upstream.request_count(), 3);
    assert_eq!(session.trace().calls.len(), 3);
    assert_eq!(session.trace().replays, 0);
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

const KEY: &str = "idempotency-key";

#[tokio::test]
async fn a_key_names_one_call_whatever_the_retry_marker() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("key-replay").await;
    let secret = guard.model_secret.expose().to_owned();
    let first = post(
        &guard.base_url,
        "/v1/chat/completions",
        Some(&secret),
        body(),
        &[(KEY, "call-1")],
    )
    .await;
    assert_eq!(first.status, 200);
    let seen = h.upstream.last_request().expect("upstream asked");
    assert_eq!(
        seen.header(KEY),
        None,
        "the key is never forwarded upstream"
    );
    // Unmarked, marked: the key alone decides.
    for marker in ["0", "3"] {
        let again = post(
            &guard.base_url,
            "/v1/chat/completions",
            Some(&secret),
            body(),
            &[(KEY, "call-1"), ("x-stainless-retry-count", marker)],
        )
        .await;
        assert_eq!(again.status, 200);
        assert_eq!(again.body, first.body, "the replay is byte-identical");
        assert_eq!(
            again.headers.get("content-type"),
            first.headers.get("content-type")
        );
    }
    assert_eq!(h.upstream.request_count(), 1);
    // Another key is another call, even with the same body.
    let other = post(
        &guard.base_url,
        "/v1/chat/completions",
        Some(&secret),
        body(),
        &[(KEY, "call-2")],
    )
    .await;
    assert_eq!(other.status, 200);
    assert_eq!(h.upstream.request_count(), 2);
    let trace = session.trace();
    assert_eq!(trace.calls.len(), 2, "replays add no record");
    assert_eq!(trace.replays, 2);
    guard.close().await;
}

#[tokio::test]
async fn a_key_in_flight_is_joined() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("key-coalesce").await;
    h.upstream
        .push(Reply::text("computed once").with_header_delay(Duration::from_millis(300)));
    let base = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();
    let (b1, s1) = (base.clone(), secret.clone());
    let original = tokio::spawn(async move {
        post(
            &b1,
            "/v1/chat/completions",
            Some(&s1),
            body(),
            &[(KEY, "k")],
        )
        .await
    });
    h.upstream.wait_for_requests(1).await;
    let joined = post(
        &base,
        "/v1/chat/completions",
        Some(&secret),
        body(),
        &[(KEY, "k")],
    )
    .await;
    let original = original.await.expect("join");
    assert_eq!(original.status, 200);
    assert_eq!(joined.status, 200);
    assert_eq!(joined.body, original.body);
    assert_eq!(h.upstream.request_count(), 1);
    assert_eq!(session.trace().calls.len(), 1);
    assert_eq!(session.trace().replays, 1);
    guard.close().await;
}

#[tokio::test]
async fn a_key_reused_with_another_request_is_a_400_naming_it() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("key-mismatch").await;
    let secret = guard.model_secret.expose().to_owned();
    let first = post(
        &guard.base_url,
        "/v1/chat/completions",
        Some(&secret),
        body(),
        &[(KEY, "reused-key")],
    )
    .await;
    assert_eq!(first.status, 200);
    // Another body on the same path.
    let other = serde_json::to_vec(&chat_body("another question", false)).expect("json");
    let a = post(
        &guard.base_url,
        "/v1/chat/completions",
        Some(&secret),
        other,
        &[(KEY, "reused-key")],
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.text());
    let message = a.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("reused-key"), "{message}");
    assert_eq!(a.json()["error"]["type"], "invalid_request_error");
    // The same key on another route (Anthropic's): its error shape.
    let anthropic = serde_json::to_vec(&serde_json::json!({
        "model": "m", "max_tokens": 16,
        "messages": [{"role": "user", "content": "same question"}],
    }))
    .expect("json");
    let b = post(
        &guard.base_url,
        "/v1/messages",
        Some(&secret),
        anthropic,
        &[(KEY, "reused-key")],
    )
    .await;
    assert_eq!(b.status, 400, "{}", b.text());
    assert_eq!(b.json()["type"], "error");
    assert!(
        b.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("reused-key"),
        "{}",
        b.text()
    );
    assert_eq!(
        h.upstream.request_count(),
        1,
        "a refused call reaches no upstream"
    );
    assert_eq!(session.trace().calls.len(), 1);
    guard.close().await;
}

#[tokio::test]
async fn a_failed_keyed_call_is_forgotten_so_the_next_attempt_goes_upstream() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("key-failed").await;
    h.upstream.push(Reply::error(500, "engine died"));
    let secret = guard.model_secret.expose().to_owned();
    let first = post(
        &guard.base_url,
        "/v1/chat/completions",
        Some(&secret),
        body(),
        &[(KEY, "k")],
    )
    .await;
    assert_eq!(first.status, 500);
    let second = post(
        &guard.base_url,
        "/v1/chat/completions",
        Some(&secret),
        body(),
        &[(KEY, "k"), ("x-stainless-retry-count", "1")],
    )
    .await;
    assert_eq!(second.status, 200);
    assert_eq!(h.upstream.request_count(), 2);
    assert_eq!(session.trace().calls.len(), 2);
    guard.close().await;
}

#[tokio::test]
async fn at_most_64_completed_keys_are_kept_oldest_forgotten_first() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("key-capacity").await;
    let secret = guard.model_secret.expose().to_owned();
    for i in 0..65 {
        let key = format!("key-{i}");
        let a = post(
            &guard.base_url,
            "/v1/chat/completions",
            Some(&secret),
            body(),
            &[(KEY, key.as_str())],
        )
        .await;
        assert_eq!(a.status, 200);
    }
    assert_eq!(h.upstream.request_count(), 65);
    // key-1 .. key-64 are kept: replayed.
    let kept = post(
        &guard.base_url,
        "/v1/chat/completions",
        Some(&secret),
        body(),
        &[(KEY, "key-1")],
    )
    .await;
    assert_eq!(kept.status, 200);
    assert_eq!(h.upstream.request_count(), 65);
    // key-0 was the oldest: forgotten, so it is a new call.
    let forgotten = post(
        &guard.base_url,
        "/v1/chat/completions",
        Some(&secret),
        body(),
        &[(KEY, "key-0")],
    )
    .await;
    assert_eq!(forgotten.status, 200);
    assert_eq!(h.upstream.request_count(), 66);
    assert_eq!(session.trace().calls.len(), 66);
    assert_eq!(session.trace().replays, 1);
    guard.close().await;
}

#[tokio::test]
async fn a_keyed_stream_is_replayed_as_a_valid_stream() {
    let h = Harness::new().await;
    let (session, w, guard) = h.session("key-stream").await;
    let secret = guard.model_secret.expose().to_owned();
    let stream_body = serde_json::to_vec(&chat_body("stream me", true)).expect("json");
    let first = post(
        &guard.base_url,
        "/v1/chat/completions",
        Some(&secret),
        stream_body.clone(),
        &[(KEY, "s")],
    )
    .await;
    assert_eq!(first.status, 200);
    w.wait_for(1).await;
    let again = post(
        &guard.base_url,
        "/v1/chat/completions",
        Some(&secret),
        stream_body,
        &[(KEY, "s"), ("x-stainless-retry-count", "1")],
    )
    .await;
    assert_eq!(again.status, 200);
    assert_eq!(
        again
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/event-stream")
    );
    let text = again.text();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let content: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(content, "echo: stream me");
    assert_eq!(h.upstream.request_count(), 1);
    assert_eq!(session.trace().calls.len(), 1);
    assert_eq!(session.trace().replays, 1);
    guard.close().await;
}
