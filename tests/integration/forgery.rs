//! Trust: a worker on the bus cannot write history. Its reports are believed only under its own
//! name (the subject, which NATS permissions bind to its user) and only for the attempt the
//! router dispatched to it; a message id it claims ahead of time costs the victim nothing; and
//! what it publishes that no reader can use is skipped and counted, never a stop.

use async_nats::jetstream::{self, message::PublishMessage};
use flowmesh_domain::event::{Author, SubmissionAccepted, SubmissionRef, TaskCompleted, TaskRef};
use flowmesh_domain::{Event, EventBody};
use flowmesh_nats::subjects;
use std::time::Duration;
use tests::{World, role_password};

pub(crate) fn as_role(role: &'static str) -> [(&'static str, &'static str); 2] {
    [("NATS_USER", role), ("NATS_PASSWORD", role_password(role))]
}

/// A JetStream context logged in as `user`, with a short timeout: a refused request is never
/// answered.
pub(crate) async fn login(world: &World, user: &str, password: &str) -> anyhow::Result<jetstream::Context> {
    let client = async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
        .custom_inbox_prefix(subjects::inbox_prefix(user))
        .connect(world.url())
        .await?;
    Ok(jetstream::ContextBuilder::new().timeout(Duration::from_secs(1)).build(client))
}

/// Publishes and waits for the stream's ack; `Err` when the server refuses.
pub(crate) async fn store(
    js: &jetstream::Context,
    subject: String,
    msg_id: Option<&str>,
    payload: Vec<u8>,
) -> anyhow::Result<u64> {
    let mut publish = PublishMessage::build().payload(payload.into());
    if let Some(id) = msg_id {
        publish = publish.message_id(id);
    }
    let ack = tokio::time::timeout(Duration::from_secs(2), async { js.send_publish(subject, publish).await?.await })
        .await??;
    Ok(ack.sequence)
}

/// The `Nats-Msg-Id` of every message of the event log.
async fn message_ids(js: &jetstream::Context) -> anyhow::Result<Vec<String>> {
    let stream = js.get_stream(subjects::EVENTS_STREAM).await?;
    let last = stream.get_info().await?.state.last_sequence;
    let mut ids = Vec::new();
    for seq in 1..=last {
        let message = stream.get_raw_message(seq).await?;
        if let Some(id) = message.headers.get(async_nats::header::NATS_MESSAGE_ID) {
            ids.push(id.as_str().to_owned());
        }
    }
    Ok(ids)
}

pub(crate) fn event_json(body: EventBody) -> Vec<u8> {
    serde_json::to_vec(&Event::new(body, "2026-11-23T00:00:00Z".into(), 0)).unwrap()
}

/// A python stage that runs until the file `gate` exists, so the test can act while it runs.
fn gated(gate: &std::path::Path) -> String {
    format!(
        "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {{name: gated}}\nspec:\n  taskType: python\n  entrypoint: run\n  \
         timeoutSeconds: 60\n  code: |\n    import os, time\n    def run(inputs):\n        while not os.path.exists({gate:?}):\n            \
         time.sleep(0.05)\n        return {{\"real\": True}}\n"
    )
}

#[tokio::test]
async fn a_worker_cannot_forge_accept_complete_or_preclaim() -> anyhow::Result<()> {
    let out = tokio::process::Command::new(tests::flowmesh_bin())
        .args(["streams", "server-config", "--worker", "own", "--worker", "evil"])
        .output()
        .await?;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    let mut world = World::start_secured_with(
        &String::from_utf8(out.stdout)?,
        &[("FLOWMESH_WORKER_OWN_PASSWORD", "own-secret"), ("FLOWMESH_WORKER_EVIL_PASSWORD", "evil-secret")],
    )
    .await?;
    world.process("validator", &["validator"], &as_role("validator"))?;
    let router = as_role("router");
    world.process("router", &["router"], &[router[0], router[1], ("ROUTER_LEASE_TTL_SEC", "2")])?;
    world.worker_process("own", &[("NATS_USER", "worker-own"), ("NATS_PASSWORD", "own-secret")])?;
    let evil = login(&world, "worker-evil", "evil-secret").await?;

    // 1. A workflow the validator never saw, as a `submission.accepted` on evil's own subject.
    let forged_workflow = flowmesh_domain::validate_submission(&tests::example("valid/echo.yaml"), "wf-900")
        .map_err(|p| anyhow::anyhow!("{p:?}"))?;
    let accepted = event_json(EventBody::SubmissionAccepted(SubmissionAccepted {
        workflow_id: "wf-900".into(),
        submission: SubmissionRef {
            stream: subjects::SUBMISSIONS_STREAM.into(),
            seq: 900,
            msg_id: None,
            validated_by: None,
        },
        task_ids: forged_workflow.tasks.iter().map(|t| t.task_id.clone()).collect(),
        workflow: forged_workflow,
    }));
    store(&evil, subjects::event("evil.wf-900.wf-900-main.task.started"), None, accepted.clone()).await?;
    // Where only the validator may write, the server refuses it.
    assert!(store(&evil, subjects::event("_.wf-900._.submission.accepted"), None, accepted).await.is_err());

    // 2. Ids claimed ahead of time: the next submission's verdict and its task's end.
    let next = world.handles.js.get_stream(subjects::SUBMISSIONS_STREAM).await?.info().await?.state.last_sequence + 1;
    let (victim, task) = (format!("wf-{next}"), format!("wf-{next}-main"));
    for id in [format!("sub.{next}.verdict"), format!("{task}.1.end"), format!("{task}.1.started")] {
        store(&evil, subjects::event(&format!("evil.{victim}.{task}.task.updated")), Some(&id), b"{}".to_vec()).await?;
    }

    // 3. The victim's task runs on `own`; evil completes it with a made-up result, once in its
    //    own name and once claiming to be `own`.
    let gate = world.dir.path().join("gate");
    let workflow_id = world.submit(gated(&gate).as_bytes(), None).await?;
    assert_eq!(workflow_id, victim);
    world
        .wait_for("the victim's task to start on own", |events| {
            events.iter().any(|e| matches!(&e.body, EventBody::TaskStarted(s) if s.task.task_id == task))
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nworker:\n{}", world.process_log("own")))?;
    let forged_end = |worker: &str| {
        let body = EventBody::TaskCompleted(TaskCompleted {
            task: TaskRef { workflow_id: victim.clone(), task_id: task.clone(), stage: "main".into(), attempt: 1 },
            worker_id: worker.into(),
            result: Some(serde_json::json!({"forged": true})),
            result_object: Some(format!("{task}/results.json")),
            artifacts: Vec::new(),
            upload_ms: None,
            started_at: None,
        });
        Event::new(body, "2026-11-23T00:00:00Z".into(), 0)
    };
    for claimed in ["evil", "own"] {
        let event = forged_end(claimed);
        let subject = subjects::event(&event.subject_suffix(Author::Worker("evil")));
        store(&evil, subject, Some(&format!("forged.{claimed}")), serde_json::to_vec(&event)?).await?;
    }
    // Under own's name, the server refuses it.
    let as_own = forged_end("own");
    assert!(
        store(
            &evil,
            subjects::event(&as_own.subject_suffix(Author::Worker("own"))),
            None,
            serde_json::to_vec(&as_own)?
        )
        .await
        .is_err(),
        "evil wrote a report under own's name"
    );
    std::fs::write(&gate, b"go")?;
    let events = world.wait_workflow_end(&workflow_id).await?;

    // The victim got the verdict, its real run and its real result, once each.
    let completed: Vec<&TaskCompleted> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::TaskCompleted(c) => Some(c),
            _ => None,
        })
        .collect();
    assert!(
        events.iter().any(|e| e.body.kind() == "workflow.completed"),
        "{:?}\nrouter:\n{}",
        tests::kinds(&events),
        world.process_log("router")
    );
    assert_eq!(completed.len(), 2, "the real report and evil's own-name forgery are both stored");
    let state = {
        let mut state = flowmesh_domain::state::State::default();
        world.events().iter().for_each(|e| {
            state.apply(e);
        });
        state
    };
    let folded = state.task(&task).expect("the victim's task");
    assert_eq!(folded.worker_id.as_deref(), Some("own"));
    assert_eq!(
        folded.result.as_ref().map(|r| &r["output"]),
        Some(&serde_json::json!({"real": true})),
        "the fold took a forged result"
    );
    assert!(
        world.events().iter().all(|e| e.body.scope().0 != "wf-900"),
        "the forged workflow reached the log's readers"
    );
    assert!(!state.workflows.contains_key("wf-900"), "the forged workflow was folded");
    // The pre-claimed ids did not drop the real verdict, start and end: their writers saw a
    // duplicate on another subject and stored them under fresh message ids.
    let verdicts = events.iter().filter(|e| e.body.kind() == "submission.accepted").count();
    assert_eq!(verdicts, 1);
    assert!(events.iter().any(|e| matches!(&e.body, EventBody::TaskStarted(s) if s.worker_id == "own")));
    let stored_ids = message_ids(&world.handles.js).await?;
    for claimed in [format!("sub.{next}.verdict"), format!("{task}.1.end"), format!("{task}.1.started")] {
        assert!(
            stored_ids.iter().any(|id| id.starts_with(&format!("{claimed}~"))),
            "{claimed} was not stored under a fresh id: {stored_ids:?}"
        );
    }

    // What was skipped: the acceptance under evil's name, the forgery claiming own, and the three
    // `{}` bodies that claimed ids.
    let skipped = world.skipped();
    assert_eq!(skipped.len(), 5, "{skipped:#?}");
    assert!(skipped.iter().all(|s| s.subject.starts_with("flowmesh.events.evil.")), "{skipped:#?}");
    world.shutdown().await;
    Ok(())
}

/// Every kind of body a worker could publish on every subject it may write, then a normal
/// workflow: all readers skip and count the junk, and every view still works.
#[tokio::test]
async fn malformed_events_are_skipped_counted_and_shown_never_a_stop() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let truncated = {
        let mut json = event_json(EventBody::WorkflowCompleted(flowmesh_domain::event::WorkflowEnded {
            workflow_id: "wf-1".into(),
            reason: None,
        }));
        json.truncate(json.len() / 2);
        json
    };
    let bodies: Vec<(&str, Vec<u8>)> = vec![
        ("empty object", b"{}".to_vec()),
        ("truncated", truncated),
        ("wrongly typed", br#"{"id": 7, "time": [], "type": "task.started", "worker_id": false}"#.to_vec()),
        ("not json", b"\x00\xffnot json at all".to_vec()),
        ("oversized", format!("{{\"id\": \"{}\"}}", "x".repeat(900_000)).into_bytes()),
    ];
    let mut junk = Vec::new();
    for kind in subjects::REPORT_KINDS {
        for (what, body) in &bodies {
            let subject = subjects::event(&format!("w1.wf-1.wf-1-main.{kind}"));
            let seq = store(&world.handles.js, subject.clone(), None, body.clone()).await?;
            junk.push((seq, subject, *what));
        }
    }

    let workflow_id = world.submit(&tests::example("valid/echo.yaml"), None).await?;
    let events = world.wait_workflow_end(&workflow_id).await?;
    assert!(events.iter().any(|e| e.body.kind() == "workflow.completed"), "{:?}", tests::kinds(&events));

    // The harness's own reader skipped exactly the junk, by sequence and subject.
    let skipped: Vec<(u64, String)> = world.skipped().into_iter().map(|s| (s.seq, s.subject)).collect();
    let expected: Vec<(u64, String)> = junk.iter().map(|(seq, subject, _)| (*seq, subject.clone())).collect();
    assert_eq!(skipped, expected);

    // The router counts them and never folds them (its status is refreshed on its tick: wait for
    // the one that has seen the whole workflow).
    let status = world.status_when("router", |s| s["workflows"] == serde_json::json!(1)).await?;
    assert_eq!(status["unreadable_events"], serde_json::json!(junk.len()), "{status}");

    // `events` shows each with its sequence and subject, and goes on to the real ones.
    let out = world.cli(&["events", "--json"]).await?;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout)?.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let shown: Vec<(u64, String)> = lines
        .iter()
        .filter_map(|l| l.get("skipped"))
        .map(|s| (s["seq"].as_u64().unwrap(), s["subject"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(shown, expected);
    assert!(lines.iter().any(|l| l["type"] == "workflow.completed"));
    let text = world.cli(&["events"]).await?;
    let text = String::from_utf8(text.stdout)?;
    assert_eq!(text.lines().filter(|l| l.starts_with("skipped seq ")).count(), junk.len(), "{text}");

    // The views built on the log still work.
    for args in [
        vec!["workflow", "list"],
        vec!["workflow", "info", workflow_id.as_str()],
        vec!["events", "--workflow", "wf-1"],
        vec!["worker", "list"],
    ] {
        let out = world.cli(&args).await?;
        assert!(out.status.success(), "flowmesh {args:?}: {}", tests::output_text(&out));
    }
    world.shutdown().await;
    Ok(())
}

/// A writer whose id somebody claimed first stores its event again under a fresh id. When it
/// publishes the same event again (its ack was lost, or it stopped before acking what caused the
/// event), it finds that copy, the latest on its own subject, and stores nothing more. Before,
/// each retry stored another copy: in the chaos run a redelivered submission whose verdict id was
/// claimed got two verdicts.
#[tokio::test]
async fn a_retried_publish_of_a_claimed_id_finds_its_copy_and_stores_no_other() -> anyhow::Result<()> {
    use flowmesh_domain::event::TaskCancelRequested;
    let world = World::start().await?;
    let js = &world.handles.js;
    let body = TaskCancelRequested { workflow_id: "wf-7".into(), task_id: None, reason: "operator".into() };
    let event = Event::new(EventBody::TaskCancelRequested(body), "2026-11-27T00:00:00Z".into(), 0);
    store(js, subjects::event("evil.wf-7.wf-7-main.task.updated"), Some(&event.id), b"{}".to_vec()).await?;

    let first = flowmesh_nats::publish::publish_event(js, &event, Author::Service).await?;
    let again = flowmesh_nats::publish::publish_event(js, &event, Author::Service).await?;
    assert_eq!(again, first, "the retry stored a second copy");
    let subject = subjects::event(&event.subject_suffix(Author::Service));
    let events = js.get_stream_no_info(subjects::EVENTS_STREAM).await?;
    let latest = events.get_last_raw_message_by_subject(&subject).await?;
    assert_eq!(latest.sequence, first);
    let id = latest.headers.get(async_nats::header::NATS_MESSAGE_ID).map(|v| v.as_str().to_owned());
    assert!(id.as_deref().is_some_and(|id| id.starts_with(&format!("{}~", event.id))), "stored as {id:?}");
    world.shutdown().await;
    Ok(())
}

/// Two writers that may each dispatch or end one attempt store it once: a second router's
/// dispatch of an attempt to another worker (a lease changing hands mid-round), a worker's end
/// after the router's end of its attempt and the router's end after that worker's. Another
/// worker's end in the same id is a claim, and is stored again.
#[tokio::test]
async fn one_attempt_dispatched_or_ended_by_two_writers_is_stored_once() -> anyhow::Result<()> {
    use flowmesh_domain::event::{FailureReason, TaskDispatched, TaskFailed};
    let world = World::start().await?;
    let js = &world.handles.js;
    let task = |attempt| TaskRef { workflow_id: "wf-3".into(), task_id: "wf-3-s1".into(), stage: "s1".into(), attempt };
    let event = |body| Event::new(body, "2026-11-27T00:00:00Z".into(), 0);
    let dispatch = |worker: &str| {
        event(EventBody::TaskDispatched(TaskDispatched {
            task: task(1),
            worker_id: worker.into(),
            task_type: "echo".into(),
            message: String::new(),
            order: None,
        }))
    };
    let completed = |attempt, worker: &str| {
        event(EventBody::TaskCompleted(TaskCompleted {
            task: task(attempt),
            worker_id: worker.into(),
            result: Some(serde_json::json!({"by": worker})),
            result_object: None,
            artifacts: Vec::new(),
            upload_ms: None,
            started_at: None,
        }))
    };
    let lost = |attempt| {
        event(EventBody::TaskFailed(TaskFailed {
            task: task(attempt),
            worker_id: Some("w1".into()),
            reason: FailureReason::WorkerLost,
            message: "worker w1 was lost".into(),
            retryable: false,
        }))
    };
    let publish = |event: Event, author| async move { flowmesh_nats::publish::publish_event(js, &event, author).await };

    use flowmesh_nats::publish::{Settled, send_event};
    let first = publish(dispatch("w1"), Author::Service).await?;
    let second = send_event(js, &dispatch("w2"), Author::Service).await?.settled(js).await?;
    assert_eq!(second, Settled::StoodFor(first), "the second dispatch of attempt 1");
    let retried = send_event(js, &dispatch("w1"), Author::Service).await?.settled(js).await?;
    assert_eq!(retried, Settled::Written(first), "a retry of the first");
    let ended = publish(completed(1, "w1"), Author::Worker("w1")).await?;
    assert_eq!(publish(lost(1), Author::Service).await?, ended, "the router's end after the worker's");
    let ended = publish(lost(2), Author::Service).await?;
    assert_eq!(publish(completed(2, "w1"), Author::Worker("w1")).await?, ended, "the worker's end after the router's");
    let claimed = publish(completed(1, "w2"), Author::Worker("w2")).await?;

    let ids = message_ids(js).await?;
    assert_eq!(ids[..3], ["wf-3-s1.1.dispatched", "wf-3-s1.1.end", "wf-3-s1.2.end"], "{ids:?}");
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert!(ids[3].starts_with("wf-3-s1.1.end~") && claimed > ended, "{ids:?}");
    world.shutdown().await;
    Ok(())
}
