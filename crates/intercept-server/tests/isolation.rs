//! Many sessions calling concurrently: each trace holds exactly its own calls.

mod common;

use std::collections::HashMap;

use common::*;
use proptest::prelude::*;
use serde_json::json;

fn run_interleaving(calls: Vec<(usize, bool)>, sessions: usize) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let h = Harness::new().await;
        let mut slots = Vec::new();
        for i in 0..sessions {
            slots.push(h.session(&format!("iso-{i}")).await);
        }
        let mut tasks = Vec::new();
        let mut expected: HashMap<usize, usize> = HashMap::new();
        for (n, (s, stream)) in calls.into_iter().enumerate() {
            let s = s % sessions;
            *expected.entry(s).or_default() += 1;
            let base = slots[s].2.base_url.clone();
            let secret = slots[s].2.model_secret.expose().to_owned();
            tasks.push(tokio::spawn(async move {
                let body = json!({"messages":[{"role":"user","content": format!("from iso-{s} call {n}")}], "stream": stream});
                post_json(&base, Some(&secret), &body).await.status
            }));
        }
        for t in tasks {
            prop_assert_eq!(t.await.expect("join"), 200);
        }
        for (i, (session, _w, _g)) in slots.iter().enumerate() {
            let trace = session.trace();
            prop_assert_eq!(trace.calls.len(), expected.get(&i).copied().unwrap_or(0));
            let mut seqs: Vec<u64> = trace.calls.iter().map(|c| c.seq).collect();
            seqs.sort_unstable();
            prop_assert_eq!(seqs, (0..trace.calls.len() as u64).collect::<Vec<_>>());
            for call in &trace.calls {
                prop_assert_eq!(&call.session, &format!("iso-{i}"));
                let text = call.request.to_value()["messages"][0]["content"].as_str().unwrap_or_default().to_owned();
                prop_assert!(text.starts_with(&format!("from iso-{i} ")), "{} in trace of iso-{}", text, i);
                let answer = call.response.as_ref().expect("response").to_value();
                let content = answer["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned();
                prop_assert_eq!(content, format!("echo: {text}"));
            }
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    #[test]
    fn no_session_sees_another_sessions_call(
        sessions in 1usize..6,
        calls in prop::collection::vec((0usize..6, any::<bool>()), 1..24),
    ) {
        run_interleaving(calls, sessions)?;
    }
}

/// Which secret a request carries.
#[derive(Debug, Clone, Copy)]
enum Carrier {
    Model,
    State,
    Other,
}

fn run_capabilities(
    cases: Vec<(usize, Carrier, bool)>,
    sessions: usize,
) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let h = Harness::new().await;
        let mut slots = Vec::new();
        for i in 0..sessions {
            slots.push(h.session(&format!("cap-{i}")).await);
        }
        let c = client();
        for (s, carrier, model_route) in cases {
            let guard = &slots[s % sessions].2;
            let secret = match carrier {
                Carrier::Model => guard.model_secret.expose().to_owned(),
                Carrier::State => guard.state_secret.expose().to_owned(),
                Carrier::Other => {
                    slots[(s + 1) % sessions].2.state_secret.expose().to_owned() + "x"
                }
            };
            let status = if model_route {
                post_json(&guard.base_url, Some(&secret), &chat_body("x", false))
                    .await
                    .status
            } else {
                let req = http::Request::get(format!("{}/state", guard.base_url))
                    .header("authorization", format!("Bearer {secret}"))
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .expect("request");
                c.request(req).await.expect("response").status().as_u16()
            };
            let allowed = matches!(
                (carrier, model_route),
                (Carrier::Model, true) | (Carrier::State, false)
            );
            prop_assert_eq!(
                status,
                if allowed { 200 } else { 401 },
                "{:?} on model route {}",
                carrier,
                model_route
            );
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]
    /// A model secret never opens a state route and a state secret never a model route.
    #[test]
    fn secrets_open_only_their_own_capability(
        sessions in 1usize..4,
        cases in prop::collection::vec(
            (0usize..4, prop_oneof![Just(Carrier::Model), Just(Carrier::State), Just(Carrier::Other)], any::<bool>()),
            1..16,
        ),
    ) {
        run_capabilities(cases, sessions)?;
    }
}
