//! The log's size on agent-shaped traffic through a real server: linear in what the
//! rollout adds, against the full format's quadratic growth.

// Measuring programs: they time real work on the process's clock, in and out of
// runtimes.
#![allow(clippy::disallowed_types)]

use intercept_bench::trace_size::{measure, Case, Workload};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forty_turn_tool_loop_logs_its_unique_content_about_once() {
    let r = measure(Case {
        sessions: 2,
        turns: 40,
        workload: Workload::Agent,
    })
    .await
    .unwrap();
    assert_eq!(r.calls, 80);
    assert!(r.log_ratio <= 1.2, "{r:#?}");
    // The full format repeats the conversation and the tools at every call.
    assert!(r.full_ratio >= 8.0, "{r:#?}");
    // One copy in memory: the log, not the bodies.
    assert!(r.memory_ratio <= 0.3, "{r:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn screenshots_carried_by_every_request_are_written_once() {
    let r = measure(Case {
        sessions: 1,
        turns: 20,
        workload: Workload::Screenshots,
    })
    .await
    .unwrap();
    assert!(r.log_ratio <= 1.2, "{r:#?}");
    assert!(r.reduction >= 5.0, "{r:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_sessions_log_no_more_than_their_full_records() {
    // From two calls on, a log is no larger than the records alone; one call's is no
    // larger than the full format's files (its header and end line are more than the
    // record's session id), and with agent-sized calls about its unique content.
    for (workload, turns) in [
        (Workload::Agent, 1),
        (Workload::Agent, 3),
        (Workload::Short, 1),
        (Workload::Short, 3),
        (Workload::Short, 5),
    ] {
        let r = measure(Case {
            sessions: 2,
            turns,
            workload,
        })
        .await
        .unwrap();
        assert_eq!(r.calls, 2 * turns as u64);
        if turns == 1 {
            assert!(r.log_bytes <= r.full_bytes, "{r:#?}");
        } else {
            assert!(r.log_bytes <= r.records_bytes, "{r:#?}");
        }
        if workload == Workload::Agent && turns == 1 {
            assert!(r.log_ratio <= 1.5, "{r:#?}");
        }
    }
}
