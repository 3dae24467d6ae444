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
