//! `work::report`: how a run's outcome becomes the event its worker publishes. One table.

use flowmesh_domain::EventBody;
use flowmesh_domain::event::{FailureReason, TaskRef};
use flowmesh_domain::work::{Completion, Outcome, report};
use serde_json::json;

fn task() -> TaskRef {
    TaskRef { workflow_id: "wf-1".into(), task_id: "wf-1-main".into(), stage: "main".into(), attempt: 2 }
}

/// What a row expects of the event: its kind, and for a failure its reason, whether it is
/// retryable and a piece of its message.
#[derive(Debug, PartialEq)]
enum Want {
    Completed,
    Cancelled(&'static str),
    Failed(FailureReason, bool, &'static str),
}

#[test]
fn every_outcome_becomes_its_report() {
    let completion = Completion {
        result: Some(json!({"ok": true})),
        upload_ms: Some(3),
        started_at: Some("2026-11-24T09:00:00Z".into()),
        ..Completion::default()
    };
    let rows: Vec<(&str, Outcome, Want)> = vec![
        ("a result", Outcome::Completed(completion.clone()), Want::Completed),
        (
            "a declared file not produced",
            Outcome::MissingArtifact("model.bin".into()),
            Want::Failed(FailureReason::MissingArtifact, false, "\"model.bin\" was not produced"),
        ),
        (
            "a store that did not take the results",
            Outcome::UploadFailed("storing results.json: timed out".into()),
            Want::Failed(FailureReason::ResultUploadFailed, true, "timed out"),
        ),
        ("cancelled by a person", Outcome::Cancelled { handed_back: false }, Want::Cancelled("while running")),
        (
            "cancelled by a person while queued",
            Outcome::CancelledWaiting,
            Want::Cancelled("while waiting for a slot, before it ran"),
        ),
        (
            "stopped by the worker's drain",
            Outcome::Cancelled { handed_back: true },
            Want::Failed(FailureReason::HandedBack, true, "worker w1 stopped before the task finished"),
        ),
        (
            "over its maximum runtime",
            Outcome::TimedOut { limit_secs: 90 },
            Want::Failed(FailureReason::MaxRuntimeExceeded, false, "maximum runtime of 90s"),
        ),
        (
            "an executor asking for a retry",
            Outcome::Failed { message: "exited with 75".into(), retryable: true },
            Want::Failed(FailureReason::ExecutorError, true, "exited with 75"),
        ),
        (
            "an executor failing for good",
            Outcome::Failed { message: "exited with status 2".into(), retryable: false },
            Want::Failed(FailureReason::ExecutorError, false, "status 2"),
        ),
    ];
    for (case, outcome, want) in rows {
        let body = report(task(), "w1", outcome);
        assert_eq!(body.task(), Some(&task()), "{case}: the report names the run's task and attempt");
        assert_eq!(body.reporter(), Some("w1"), "{case}: the report names its worker");
        match (&body, &want) {
            (EventBody::TaskCompleted(c), Want::Completed) => {
                assert_eq!(
                    (&c.result, c.upload_ms, &c.started_at),
                    (&completion.result, completion.upload_ms, &completion.started_at),
                    "{case}"
                );
            }
            (EventBody::TaskCancelled(c), Want::Cancelled(reason)) => {
                assert_eq!(c.reason, format!("cancelled {reason}"), "{case}")
            }
            (EventBody::TaskFailed(f), Want::Failed(reason, retryable, message)) => {
                assert_eq!((&f.reason, f.retryable), (reason, *retryable), "{case}");
                assert!(f.message.contains(message), "{case}: {:?} lacks {message:?}", f.message);
            }
            _ => panic!("{case}: got {}, want {want:?}", body.kind()),
        }
    }
}

#[test]
fn failure_reasons_read_and_write_their_names_and_keep_unknown_ones() {
    for (name, reason) in [
        ("executor_error", FailureReason::ExecutorError),
        ("no_eligible_worker", FailureReason::NoEligibleWorker),
        ("worker_lost", FailureReason::WorkerLost),
        ("quota_exceeded", FailureReason::Other("quota_exceeded".into())),
    ] {
        assert_eq!(serde_json::from_value::<FailureReason>(json!(name)).unwrap(), reason);
        assert_eq!(serde_json::to_value(&reason).unwrap(), json!(name));
        assert_eq!(reason.as_str(), name);
    }
}
