//! Traces as tables: given a workflow's events with their times, each task's phases and the
//! critical path.

use flowmesh_domain::event::{
    FailureReason, SubmissionAccepted, SubmissionRef, TaskCompleted, TaskDispatched, TaskFailed, TaskRef, TaskRequeued,
    TaskStarted, WorkflowEnded,
};
use flowmesh_domain::trace::{Phase, Trace, trace, unix_ms};
use flowmesh_domain::{Event, EventBody, validate_submission};

const T0: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

/// A time `ms` after T0, as writers put it in events.
fn at(ms: u64) -> String {
    format!("2026-01-01T00:{:02}:{:02}.{:03}Z", ms / 60_000, (ms / 1000) % 60, ms % 1000)
}

/// A scenario: the workflow of `doc`, and events appended at given times.
struct Log {
    events: Vec<Event>,
}

impl Log {
    fn new(doc: &str) -> Log {
        let workflow = validate_submission(doc.as_bytes(), "wf-1").expect("valid");
        let body = EventBody::SubmissionAccepted(SubmissionAccepted {
            workflow_id: "wf-1".into(),
            submission: SubmissionRef { stream: "S".into(), seq: 1, msg_id: None, validated_by: None },
            task_ids: workflow.tasks.iter().map(|t| t.task_id.clone()).collect(),
            workflow,
        });
        Log { events: vec![Event::new(body, at(0), 0)] }
    }

    fn push(&mut self, ms: u64, body: EventBody) -> &mut Log {
        self.events.push(Event::new(body, at(ms), ms));
        self
    }

    fn task(stage: &str, attempt: u32) -> TaskRef {
        TaskRef { workflow_id: "wf-1".into(), task_id: format!("wf-1-{stage}"), stage: stage.into(), attempt }
    }

    /// dispatched, started and completed (with `upload` ms of storing) on `worker`.
    fn run(&mut self, stage: &str, attempt: u32, worker: &str, times: [u64; 3], upload: Option<u64>) -> &mut Log {
        let task = Log::task(stage, attempt);
        self.push(
            times[0],
            EventBody::TaskDispatched(TaskDispatched {
                task: task.clone(),
                worker_id: worker.into(),
                task_type: "echo".into(),
                message: String::new(),
                order: None,
            }),
        );
        self.push(times[1], EventBody::TaskStarted(TaskStarted { task: task.clone(), worker_id: worker.into() }));
        self.push(
            times[2],
            EventBody::TaskCompleted(TaskCompleted {
                task,
                worker_id: worker.into(),
                result: None,
                result_object: None,
                artifacts: Vec::new(),
                upload_ms: upload,
                started_at: None,
            }),
        )
    }

    fn end(&mut self, ms: u64) -> Trace {
        self.push(ms, EventBody::WorkflowCompleted(WorkflowEnded { workflow_id: "wf-1".into(), reason: None }));
        trace(&self.events, "wf-1").expect("a trace")
    }
}

/// The spans of one stage as (phase, start, end).
fn spans(t: &Trace, stage: &str) -> Vec<(Phase, u64, u64)> {
    let task = t.tasks.iter().find(|x| x.stage == stage).expect("the stage");
    task.spans.iter().map(|s| (s.phase, s.start_ms, s.end_ms)).collect()
}

const CHAIN: &str =
    "apiVersion: flowmesh/v1\nkind: W\nspec:\n  taskType: echo\n  stages:\n    - {name: a}\n    - {name: b}\n";
const JOIN: &str = "apiVersion: flowmesh/v1\nkind: W\nspec:\n  taskType: echo\n  graph:\n    nodes:\n      - {name: a}\n      - {name: b}\n      - {name: join, dependsOn: [a, b]}\n";

#[test]
fn a_chain_waits_queues_is_placed_runs_and_uploads() {
    let t = Log::new(CHAIN)
        .run("a", 1, "w1", [100, 300, 1300], Some(200))
        .run("b", 1, "w1", [1400, 1500, 2500], None)
        .end(2500);
    assert_eq!(
        spans(&t, "a"),
        [(Phase::Queued, 0, 100), (Phase::Placement, 100, 300), (Phase::Run, 300, 1100), (Phase::Upload, 1100, 1300)]
    );
    assert_eq!(
        spans(&t, "b"),
        [
            (Phase::Waiting, 0, 1300),
            (Phase::Queued, 1300, 1400),
            (Phase::Placement, 1400, 1500),
            (Phase::Run, 1500, 2500)
        ]
    );
    assert_eq!((t.total_ms, t.outcome.as_str()), (2500, "completed"));
    assert_eq!(t.critical_path, ["a", "b"]);
    assert_eq!(t.tasks[0].total(Phase::Upload), 200);
}

#[test]
fn the_critical_path_runs_through_the_upstream_stage_that_ended_last() {
    let t = Log::new(JOIN)
        .run("a", 1, "w1", [10, 20, 1000], None)
        .run("b", 1, "w2", [10, 20, 3000], None)
        .run("join", 1, "w1", [3100, 3200, 4000], None)
        .end(4000);
    assert_eq!(t.critical_path, ["b", "join"]);
    let on: Vec<bool> = t.tasks.iter().map(|x| x.on_critical_path).collect();
    assert_eq!(on, [false, true, true]);
    assert_eq!(spans(&t, "join")[0], (Phase::Waiting, 0, 3000), "the join waits for the later root");
}

#[test]
fn a_retried_attempt_counts_its_failed_run_and_its_second_queue() {
    let mut log = Log::new(CHAIN);
    log.push(
        100,
        EventBody::TaskDispatched(TaskDispatched {
            task: Log::task("a", 1),
            worker_id: "w1".into(),
            task_type: "echo".into(),
            message: String::new(),
            order: None,
        }),
    )
    .push(200, EventBody::TaskStarted(TaskStarted { task: Log::task("a", 1), worker_id: "w1".into() }))
    .push(
        500,
        EventBody::TaskFailed(TaskFailed {
            task: Log::task("a", 1),
            worker_id: Some("w1".into()),
            reason: FailureReason::Other("boom".into()),
            message: String::new(),
            retryable: true,
        }),
    )
    .push(
        600,
        EventBody::TaskRequeued(TaskRequeued { task: Log::task("a", 2), reason: "boom".into(), worker_id: None }),
    )
    .run("a", 2, "w2", [700, 800, 1000], None)
    .run("b", 1, "w2", [1100, 1200, 1300], None);
    let t = log.end(1300);
    assert_eq!(
        spans(&t, "a"),
        [
            (Phase::Queued, 0, 100),
            (Phase::Placement, 100, 200),
            (Phase::Run, 200, 500),
            (Phase::Queued, 500, 700),
            (Phase::Placement, 700, 800),
            (Phase::Run, 800, 1000)
        ]
    );
    let a = &t.tasks[0];
    assert_eq!((a.attempts, a.worker_id.as_deref(), a.outcome.as_str()), (2, Some("w2"), "completed"));
    assert!(a.spans[2].failed && !a.spans[5].failed, "the failed run is marked");
}

#[test]
fn a_task_that_completed_before_its_start_was_due_runs_from_its_started_at() {
    let mut log = Log::new(CHAIN);
    for (stage, dispatched, started, ended) in [("a", 100, 104, 110), ("b", 200, 203, 205)] {
        log.push(
            dispatched,
            EventBody::TaskDispatched(TaskDispatched {
                task: Log::task(stage, 1),
                worker_id: "w1".into(),
                task_type: "echo".into(),
                message: String::new(),
                order: None,
            }),
        )
        .push(
            ended,
            EventBody::TaskCompleted(TaskCompleted {
                task: Log::task(stage, 1),
                worker_id: "w1".into(),
                result: None,
                result_object: None,
                artifacts: Vec::new(),
                upload_ms: None,
                started_at: Some(at(started)),
            }),
        );
    }
    let t = log.end(205);
    assert_eq!(spans(&t, "a"), [(Phase::Queued, 0, 100), (Phase::Placement, 100, 104), (Phase::Run, 104, 110)]);
    assert_eq!(
        spans(&t, "b"),
        [(Phase::Waiting, 0, 110), (Phase::Queued, 110, 200), (Phase::Placement, 200, 203), (Phase::Run, 203, 205)]
    );
    assert_eq!(t.tasks[1].outcome, "completed");
}

#[test]
fn a_running_workflow_is_traced_up_to_its_last_event() {
    let mut log = Log::new(CHAIN);
    log.push(
        100,
        EventBody::TaskDispatched(TaskDispatched {
            task: Log::task("a", 1),
            worker_id: "w1".into(),
            task_type: "echo".into(),
            message: String::new(),
            order: None,
        }),
    )
    .push(400, EventBody::TaskStarted(TaskStarted { task: Log::task("a", 1), worker_id: "w1".into() }));
    let t = trace(&log.events, "wf-1").unwrap();
    assert_eq!(t.outcome, "running");
    assert_eq!(spans(&t, "a"), [(Phase::Queued, 0, 100), (Phase::Placement, 100, 400)]);
    assert!(spans(&t, "b").is_empty(), "b has not become ready");
    assert!(t.critical_path.is_empty());
    assert!(trace(&log.events, "wf-2").is_err());
}

#[test]
fn rfc3339_times_read_as_unix_milliseconds() {
    for (text, want) in [
        ("2026-01-01T00:00:00Z", Some(T0)),
        ("2026-01-01T00:00:01.5Z", Some(T0 + 1500)),
        ("2026-01-01T00:00:00.123456789Z", Some(T0 + 123)),
        ("2026-01-01T01:00:00+01:00", Some(T0)),
        ("2025-12-31T19:00:00-05:00", Some(T0)),
        ("1970-01-01T00:00:00Z", Some(0)),
        ("2024-02-29T12:00:00Z", Some(1_709_208_000_000)),
        ("2026-13-01T00:00:00Z", None),
        ("2026-01-01 00:00", None),
        ("yesterday", None),
        // An offset's place holding other characters: refused, never sliced inside one. The
        // router folds a worker's completion time this way, so a panic here was a message
        // that stopped the router at every replay.
        ("2026-01-01T00:00:00\u{e9}1:00", None),
        ("2026-01-01T00:00:00+\u{e9}:00", None),
        ("2026-01-01T00:00:00+01:\u{e9}", None),
        ("2026-01-01T00:00:00+0a:00", None),
        ("2026-01-01T00:00:00.\u{e9}Z", None),
    ] {
        assert_eq!(unix_ms(text), want, "{text}");
    }
}
