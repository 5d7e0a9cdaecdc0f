//! `Event::read`: a message of the log is folded only when its body agrees with its subject and
//! the subject's author may write that kind. One table, one `check`.

use flowmesh_domain::event::{
    Author, FailureReason, MAX_EVENT_BYTES, TaskCompleted, TaskDispatched, TaskFailed, TaskRef, TaskStarted,
    Unreadable, WorkflowEnded,
};
use flowmesh_domain::work::WorkOrder;
use flowmesh_domain::{Event, EventBody};

fn task() -> TaskRef {
    TaskRef { workflow_id: "wf-1".into(), task_id: "wf-1-main".into(), stage: "main".into(), attempt: 1 }
}

fn started(worker: &str) -> Event {
    Event::new(EventBody::TaskStarted(TaskStarted { task: task(), worker_id: worker.into() }), "t".into(), 0)
}

fn completed(worker: &str) -> Event {
    let body = EventBody::TaskCompleted(TaskCompleted {
        task: task(),
        worker_id: worker.into(),
        result: None,
        result_object: Some("wf-1-main/results.json".into()),
        artifacts: Vec::new(),
        upload_ms: None,
        started_at: None,
    });
    Event::new(body, "t".into(), 0)
}

fn failed(worker: Option<&str>) -> Event {
    let body = EventBody::TaskFailed(TaskFailed {
        task: task(),
        worker_id: worker.map(str::to_owned),
        reason: FailureReason::ExecutorError,
        message: "m".into(),
        retryable: false,
    });
    Event::new(body, "t".into(), 0)
}

fn dispatched() -> Event {
    let body = EventBody::TaskDispatched(TaskDispatched {
        task: task(),
        worker_id: "w1".into(),
        task_type: "echo".into(),
        message: "m".into(),
        order: None,
    });
    Event::new(body, "t".into(), 0)
}

fn workflow_completed(id: &str) -> Event {
    Event::new(EventBody::WorkflowCompleted(WorkflowEnded { workflow_id: id.into(), reason: None }), "t".into(), 0)
}

type Reader = fn(&str, &[u8]) -> Result<Event, Unreadable>;

/// What `read` makes of `payload` on `suffix`: `Ok(kind)` or the error's variant name.
fn check(read: Reader, suffix: &str, payload: &[u8]) -> Result<&'static str, &'static str> {
    read(suffix, payload).map(|e| e.body.kind()).map_err(|e| match e {
        Unreadable::TooLarge { .. } => "too large",
        Unreadable::NotAnEvent(_) => "not an event",
        Unreadable::WrongAuthor { .. } => "wrong author",
        Unreadable::SubjectMismatch { .. } => "subject mismatch",
    })
}

fn json(e: &Event) -> Vec<u8> {
    serde_json::to_vec(e).unwrap()
}

/// (what, subject suffix, payload, what `read` makes of it).
type Case = (&'static str, String, Vec<u8>, Result<&'static str, &'static str>);

#[test]
fn a_body_is_believed_only_where_its_subject_agrees() {
    let s = "wf-1.wf-1-main.task.started";
    let cases: Vec<Case> = vec![
        ("a worker's own report", format!("w1.{s}"), json(&started("w1")), Ok("task.started")),
        ("a report naming another worker", format!("w2.{s}"), json(&started("w1")), Err("wrong author")),
        ("a report on a service subject", format!("_.{s}"), json(&started("w1")), Err("wrong author")),
        (
            "a completion under a worker's name",
            "w1.wf-1.wf-1-main.task.completed".into(),
            json(&completed("w1")),
            Ok("task.completed"),
        ),
        (
            "a completion on a service subject",
            "_.wf-1.wf-1-main.task.completed".into(),
            json(&completed("w1")),
            Err("wrong author"),
        ),
        (
            "the router's failure (no worker)",
            "_.wf-1.wf-1-main.task.failed".into(),
            json(&failed(None)),
            Ok("task.failed"),
        ),
        (
            "the router's failure about a lost worker",
            "_.wf-1.wf-1-main.task.failed".into(),
            json(&failed(Some("w1"))),
            Ok("task.failed"),
        ),
        (
            "a worker's failure naming no worker",
            "w1.wf-1.wf-1-main.task.failed".into(),
            json(&failed(None)),
            Err("wrong author"),
        ),
        (
            "a dispatch on its worker's subject",
            "w1.wf-1.wf-1-main.task.dispatched".into(),
            json(&dispatched()),
            Ok("task.dispatched"),
        ),
        (
            "a dispatch on no worker's subject",
            "_.wf-1.wf-1-main.task.dispatched".into(),
            json(&dispatched()),
            Err("subject mismatch"),
        ),
        (
            "a dispatch on another worker's subject",
            "w2.wf-1.wf-1-main.task.dispatched".into(),
            json(&dispatched()),
            Err("subject mismatch"),
        ),
        (
            "a workflow's end under a worker's name",
            "w1.wf-1._.workflow.completed".into(),
            json(&workflow_completed("wf-1")),
            Err("wrong author"),
        ),
        (
            "a workflow's end",
            "_.wf-1._.workflow.completed".into(),
            json(&workflow_completed("wf-1")),
            Ok("workflow.completed"),
        ),
        (
            "another workflow than the subject's",
            "_.wf-2._.workflow.completed".into(),
            json(&workflow_completed("wf-1")),
            Err("subject mismatch"),
        ),
        (
            "a kind other than the subject's",
            "w1.wf-1.wf-1-main.task.completed".into(),
            json(&started("w1")),
            Err("subject mismatch"),
        ),
        // Tokens are compared whole.
        ("a worker whose id begins with the report's", format!("w10.{s}"), json(&started("w1")), Err("wrong author")),
        (
            "a dispatch to a worker whose id begins with its own",
            "w10.wf-1.wf-1-main.task.dispatched".into(),
            json(&dispatched()),
            Err("subject mismatch"),
        ),
        (
            "a task whose id begins with the body's",
            "w1.wf-1.wf-1-mainx.task.started".into(),
            json(&started("w1")),
            Err("subject mismatch"),
        ),
        (
            "a token after the kind",
            "w1.wf-1.wf-1-main.task.dispatched.x".into(),
            json(&dispatched()),
            Err("wrong author"),
        ),
        (
            "the worker after the kind and before it",
            "w1.wf-1.wf-1-main.task.started.w1".into(),
            json(&started("w1")),
            Err("wrong author"),
        ),
        (
            "the tokens out of order",
            "w1.wf-1-main.wf-1.task.dispatched".into(),
            json(&dispatched()),
            Err("subject mismatch"),
        ),
        ("an empty object", format!("w1.{s}"), b"{}".to_vec(), Err("not an event")),
    ];
    for (what, suffix, payload, want) in cases {
        assert_eq!(check(Event::read, &suffix, &payload), want, "{what}");
        assert_eq!(check(Event::read_skipping_orders, &suffix, &payload), want, "{what}, skipping orders");
    }
}

/// A log written before the worker-first layout (`<workflow>.<task>.<noun>.<verb>`, with the
/// worker after a report's or a dispatch's kind) is believed as it was then, and no more.
#[test]
fn a_legacy_subject_is_believed_only_where_it_agrees() {
    let s = "wf-1.wf-1-main.task.started";
    let cases: Vec<Case> = vec![
        ("a worker's own report", format!("{s}.w1"), json(&started("w1")), Ok("task.started")),
        ("a report naming another worker", format!("{s}.w2"), json(&started("w1")), Err("wrong author")),
        ("a report on a service subject", s.into(), json(&started("w1")), Err("wrong author")),
        (
            "a completion under a worker's name",
            "wf-1.wf-1-main.task.completed.w1".into(),
            json(&completed("w1")),
            Ok("task.completed"),
        ),
        (
            "the router's failure (no worker)",
            "wf-1.wf-1-main.task.failed".into(),
            json(&failed(None)),
            Ok("task.failed"),
        ),
        (
            "the router's failure about a lost worker",
            "wf-1.wf-1-main.task.failed".into(),
            json(&failed(Some("w1"))),
            Ok("task.failed"),
        ),
        (
            "a worker's failure naming no worker",
            "wf-1.wf-1-main.task.failed.w1".into(),
            json(&failed(None)),
            Err("wrong author"),
        ),
        (
            "a dispatch on its worker's subject",
            "wf-1.wf-1-main.task.dispatched.w1".into(),
            json(&dispatched()),
            Ok("task.dispatched"),
        ),
        (
            "a dispatch stored before dispatches named their worker",
            "wf-1.wf-1-main.task.dispatched".into(),
            json(&dispatched()),
            Ok("task.dispatched"),
        ),
        (
            "a dispatch on another worker's subject",
            "wf-1.wf-1-main.task.dispatched.w2".into(),
            json(&dispatched()),
            Err("subject mismatch"),
        ),
        (
            "an acceptance body on a task subject",
            "wf-1.wf-1-main.task.started.w1".into(),
            json(&workflow_completed("wf-1")),
            Err("wrong author"),
        ),
        (
            "a kind other than the subject's",
            "wf-1.wf-1-main.task.completed.w1".into(),
            json(&started("w1")),
            Err("subject mismatch"),
        ),
        (
            "another workflow than the subject's",
            "wf-2._.workflow.completed".into(),
            json(&workflow_completed("wf-1")),
            Err("subject mismatch"),
        ),
        ("an empty object", format!("{s}.w1"), b"{}".to_vec(), Err("not an event")),
        ("a truncated body", format!("{s}.w1"), json(&started("w1"))[..20].to_vec(), Err("not an event")),
        (
            "a wrongly typed field",
            format!("{s}.w1"),
            br#"{"id":1,"time":"t","type":"task.started"}"#.to_vec(),
            Err("not an event"),
        ),
        ("not JSON", format!("{s}.w1"), b"\xff\x00garbage".to_vec(), Err("not an event")),
        // Found by the event fuzz test: the decoding skips a field it does not know without
        // reading its strings, and so took this until it checked the encoding first.
        (
            "bytes that are not UTF-8 in a field the body does not know",
            format!("{s}.w1"),
            [&json(&started("w1"))[..1], b"\"note\":\"\xc3(\",", &json(&started("w1"))[1..]].concat(),
            Err("not an event"),
        ),
        // serde's message quotes the offending value; cut to 200 bytes inside a character, it
        // panicked in `read` itself, in every build: one such report stopped every reader.
        (
            "a wrongly typed field holding a long text that is not ASCII",
            format!("{s}.w1"),
            format!(
                r#"{{"id":"x","time":"t","type":"task.started","workflow_id":"wf-1","task_id":"wf-1-main","stage":"main","attempt":"a{}","worker_id":"w1"}}"#,
                "\u{e9}".repeat(300)
            )
            .into_bytes(),
            Err("not an event"),
        ),
        // Also found by it: serde's derived decoding refuses this (its buffer of unknown fields
        // stops at 128 levels), which made debug builds panic on the comparison of the two.
        (
            "a field the body does not know, nested 200 levels deep",
            format!("{s}.w1"),
            [
                &json(&started("w1"))[..1],
                format!("\"note\":{}1{},", "[".repeat(200), "]".repeat(200)).as_bytes(),
                &json(&started("w1"))[1..],
            ]
            .concat(),
            Ok("task.started"),
        ),
        (
            "a kind this version does not know",
            "wf-1.wf-1-main.task.exploded".into(),
            br#"{"id":"x","time":"t","type":"task.exploded","workflow_id":"wf-1"}"#.to_vec(),
            Err("not an event"),
        ),
        (
            "an envelope without its body",
            format!("{s}.w1"),
            br#"{"id":"x","time":"t","type":"task.started"}"#.to_vec(),
            Err("not an event"),
        ),
        (
            "a body after the end of the event",
            format!("{s}.w1"),
            [json(&started("w1")), b" {}".to_vec()].concat(),
            Err("not an event"),
        ),
        ("over the size limit", format!("{s}.w1"), vec![b' '; MAX_EVENT_BYTES + 1], Err("too large")),
        ("no subject at all", String::new(), json(&dispatched()), Err("subject mismatch")),
        // Tokens are compared whole: an id that begins like the body's is another id.
        (
            "a workflow whose id begins with the body's",
            "wf-10._.workflow.completed".into(),
            json(&workflow_completed("wf-1")),
            Err("subject mismatch"),
        ),
        (
            "a task whose id begins with the body's",
            "wf-1.wf-1-mainx.task.started.w1".into(),
            json(&started("w1")),
            Err("subject mismatch"),
        ),
        (
            "a kind that begins with the body's",
            "wf-1.wf-1-main.task.startedx.w1".into(),
            json(&started("w1")),
            Err("subject mismatch"),
        ),
        ("a worker whose id begins with the report's", format!("{s}.w10"), json(&started("w1")), Err("wrong author")),
        (
            "a dispatch to a worker whose id begins with its own",
            "wf-1.wf-1-main.task.dispatched.w10".into(),
            json(&dispatched()),
            Err("subject mismatch"),
        ),
        (
            "a token after a dispatch's worker",
            "wf-1.wf-1-main.task.dispatched.w1.x".into(),
            json(&dispatched()),
            Err("subject mismatch"),
        ),
        (
            "a service's event with the tokens out of order",
            "wf-1-main.wf-1.task.dispatched.w1".into(),
            json(&dispatched()),
            Err("subject mismatch"),
        ),
    ];
    for (what, suffix, payload, want) in cases {
        assert_eq!(check(Event::read, &suffix, &payload), want, "{what}");
        assert_eq!(check(Event::read_skipping_orders, &suffix, &payload), want, "{what}, skipping orders");
    }
}

/// The fold's reader leaves a dispatch's order out and takes everything else as `read` does.
#[test]
fn a_fold_reads_a_dispatch_without_its_order() {
    let order = WorkOrder {
        workflow_id: "wf-1".into(),
        task_id: "wf-1-main".into(),
        stage: "main".into(),
        attempt: 1,
        task_type: "echo".into(),
        spec: serde_json::json!({"taskType": "echo", "data": {"type": "list", "items": ["a", {"b": [1]}]}}).into(),
        upstream: Default::default(),
        upstream_artifacts: Default::default(),
        upstream_results: Default::default(),
    };
    let mut carrying = dispatched();
    let EventBody::TaskDispatched(d) = &mut carrying.body else { unreachable!() };
    d.order = Some(Box::new(order));
    let suffix = carrying.subject_suffix(Author::Service);
    assert_eq!(Event::read(&suffix, &json(&carrying)), Ok(carrying.clone()));
    let without = Event::read_skipping_orders(&suffix, &json(&carrying)).unwrap();
    assert_eq!(without, dispatched(), "all but the order");
    for event in [started("w1"), completed("w1"), failed(None), workflow_completed("wf-1")] {
        let author = match &event.body {
            EventBody::TaskStarted(_) | EventBody::TaskCompleted(_) => Author::Worker("w1"),
            _ => Author::Service,
        };
        let suffix = event.subject_suffix(author);
        assert_eq!(Event::read_skipping_orders(&suffix, &json(&event)), Ok(event.clone()), "{suffix}");
    }
    // The order is skipped as JSON, not read as an order: only a worker, which takes it, finds
    // that it is none. Only the router writes dispatches.
    let odd = String::from_utf8(json(&dispatched())).unwrap().replacen('{', r#"{"order":{"not":"an order"},"#, 1);
    assert_eq!(check(Event::read, &suffix, odd.as_bytes()), Err("not an event"));
    assert_eq!(check(Event::read_skipping_orders, &suffix, odd.as_bytes()), Ok("task.dispatched"));
    let broken = String::from_utf8(json(&dispatched())).unwrap().replacen('{', r#"{"order":{"not"},"#, 1);
    assert_eq!(check(Event::read_skipping_orders, &suffix, broken.as_bytes()), Err("not an event"));
}

#[test]
fn what_a_writer_publishes_reads_back() {
    for (event, author) in [
        (started("w1"), Author::Worker("w1")),
        (completed("gpu-7"), Author::Worker("gpu-7")),
        (failed(Some("w1")), Author::Worker("w1")),
        (failed(Some("w1")), Author::Service),
        (dispatched(), Author::Service),
        (workflow_completed("wf-1"), Author::Service),
    ] {
        let suffix = event.subject_suffix(author);
        assert_eq!(Event::read(&suffix, &json(&event)), Ok(event.clone()), "{suffix}");
    }
}

/// A subject reads one way only: no kind's verb is a kind's noun, so the tokens of a legacy
/// subject (`<workflow>.<task>.<noun>.<verb>.<worker>`) never end in a kind, and the layout is
/// told from the subject alone.
#[test]
fn a_subject_has_one_layout() {
    use flowmesh_domain::event::Layout;
    let nouns: Vec<&str> = EventBody::KINDS.iter().map(|k| k.split_once('.').unwrap().0).collect();
    for kind in EventBody::KINDS {
        let (_, verb) = kind.split_once('.').unwrap();
        assert!(!nouns.contains(&verb), "{kind}: its verb is a noun");
        assert!(EventBody::is_kind(kind));
    }
    let cases = [
        ("w1.wf-1.wf-1-main.task.completed", Layout::WorkerFirst),
        ("_.wf-1._.submission.accepted", Layout::WorkerFirst),
        ("_._._.workflows.purged", Layout::WorkerFirst),
        // Legacy: a report, a dispatch, a service's event, a dispatch without its worker.
        ("wf-1.wf-1-main.task.completed.w1", Layout::Legacy),
        ("wf-1.wf-1-main.task.dispatched.w1", Layout::Legacy),
        ("wf-1._.submission.accepted", Layout::Legacy),
        ("wf-1.wf-1-main.task.dispatched", Layout::Legacy),
        // Neither: read as legacy, and refused there.
        ("w1.wf-1.wf-1-main.task.exploded", Layout::Legacy),
        ("w1.wf-1.wf-1-main.task.completed.x", Layout::Legacy),
        ("", Layout::Legacy),
    ];
    for (suffix, layout) in cases {
        assert_eq!(Layout::of(suffix), layout, "{suffix}");
    }
    // `_` first means no worker, so no worker may be called that.
    assert!(!flowmesh_domain::ids::is_valid_worker_id("_"));
    assert!(flowmesh_domain::ids::is_valid_worker_id("gpu_1") && flowmesh_domain::ids::is_valid_worker_id("__"));
}
