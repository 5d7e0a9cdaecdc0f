//! A log written before event subjects put the worker first
//! (`<workflow>.<task>.<noun>.<verb>[.<worker>]`) is read as it was written: by the folds, by
//! every view of part of the log, by retention's latest record and by its purge.

use flowmesh_domain::event::{
    SubmissionAccepted, SubmissionRef, TaskCompleted, TaskDispatched, TaskRef, WorkerCordon, WorkflowsPurged,
};
use flowmesh_domain::ids::WorkflowIds;
use flowmesh_domain::state::{TaskStatus, WorkflowStatus};
use flowmesh_domain::{Event, EventBody};
use flowmesh_nats::subjects;
use futures_util::StreamExt;
use tests::World;

use crate::forgery::store;

fn event(body: EventBody) -> Event {
    Event::new(body, "2026-11-30T00:00:00Z".into(), 0)
}

#[tokio::test]
async fn a_workflow_begun_in_the_legacy_layout_reads_whole_after_the_upgrade() -> anyhow::Result<()> {
    let world = World::start().await?;
    let js = &world.handles.js;
    let workflow = flowmesh_domain::validate_submission(&tests::example("valid/echo.yaml"), "wf-1")
        .map_err(|p| anyhow::anyhow!("{p:?}"))?;
    let stage = workflow.tasks[0].stage.clone();
    let task = TaskRef { workflow_id: "wf-1".into(), task_id: "wf-1-".to_owned() + &stage, stage, attempt: 1 };
    let accepted = event(EventBody::SubmissionAccepted(SubmissionAccepted {
        workflow_id: "wf-1".into(),
        submission: SubmissionRef {
            stream: subjects::SUBMISSIONS_STREAM.into(),
            seq: 1,
            msg_id: None,
            validated_by: None,
        },
        task_ids: workflow.tasks.iter().map(|t| t.task_id.clone()).collect(),
        workflow,
    }));
    let dispatched = event(EventBody::TaskDispatched(TaskDispatched {
        task: task.clone(),
        worker_id: "w1".into(),
        task_type: "echo".into(),
        message: String::new(),
        order: None,
    }));
    let completed = event(EventBody::TaskCompleted(TaskCompleted {
        task: task.clone(),
        worker_id: "w1".into(),
        result: Some(serde_json::json!({"items": ["hello"]})),
        result_object: None,
        artifacts: Vec::new(),
        upload_ms: None,
        started_at: None,
    }));
    let cordoned = event(EventBody::WorkerCordoned(WorkerCordon { worker_id: "w2".into() }));
    let mut gone = WorkflowIds::default();
    gone.insert("wf-0");
    let purged = event(EventBody::WorkflowsPurged(WorkflowsPurged {
        workflows: gone.clone(),
        removing: WorkflowIds::default(),
    }));
    let json = |e: &Event| serde_json::to_vec(e).unwrap();
    // Before the upgrade: the verdict, the dispatch, a cordon and a purge record, where the
    // versions before wrote them.
    let legacy = [
        ("wf-1._.submission.accepted".to_owned(), &accepted),
        (format!("wf-1.{}.task.dispatched.w1", task.task_id), &dispatched),
        ("fleet.w2.worker.cordoned".to_owned(), &cordoned),
        ("_._.workflows.purged".to_owned(), &purged),
    ];
    for (suffix, e) in legacy {
        store(js, subjects::event(&suffix), Some(&e.id), json(e)).await?;
    }
    // Retention's latest record is the legacy one while no other was written.
    let record = flowmesh_nats::artifacts::purged_workflows(js).await?;
    assert_eq!(record.map(|(_, ids)| ids), Some(gone));

    // After it: the task's end, where its worker writes it now.
    store(js, subjects::event(&format!("w1.wf-1.{}.task.completed", task.task_id)), None, json(&completed)).await?;

    // A view of the workflow reads both sides, in order, and derives its end.
    let events: Vec<Event> = flowmesh::log::events(js, subjects::workflow_events("wf-1"), false)
        .await?
        .map(|e| e.expect("an event"))
        .collect()
        .await;
    let kinds: Vec<&str> = events.iter().map(|e| e.body.kind()).collect();
    assert_eq!(kinds, ["submission.accepted", "task.dispatched", "task.completed", "workflow.completed"]);
    let state = flowmesh::log::fold(js, subjects::workflow_events("wf-1")).await?;
    let folded = &state.workflows["wf-1"];
    assert_eq!(folded.status, WorkflowStatus::Completed);
    assert_eq!((folded.tasks[0].status, folded.tasks[0].worker_id.as_deref()), (TaskStatus::Completed, Some("w1")));
    // So do the views of one task, of the fleet and of every verdict, and the whole log.
    let task_view: Vec<&str> = flowmesh::log::events(js, subjects::task_events(&task.task_id), false)
        .await?
        .map(|e| e.expect("an event").body.kind())
        .collect()
        .await;
    assert_eq!(task_view, ["task.dispatched", "task.completed"]);
    assert!(flowmesh::log::fold(js, subjects::fleet_events()).await?.cordoned.contains("w2"));
    assert!(flowmesh::log::fold(js, subjects::submission_events("*")).await?.workflows.contains_key("wf-1"));
    let whole = flowmesh::log::fold(js, subjects::all_events()).await?;
    assert_eq!(whole.workflows["wf-1"].status, WorkflowStatus::Completed);
    assert!(whole.cordoned.contains("w2"));
    assert!(world.skipped().is_empty(), "{:?}", world.skipped());

    // A purge by subjects (a workflow whose sequences the router does not know) removes the
    // legacy part too, and nothing of another workflow's.
    let log = js.get_stream(subjects::EVENTS_STREAM).await?;
    let removed = flowmesh_nats::retention::purge_workflow(&log, "wf-1").await.map_err(anyhow::Error::msg)?;
    assert_eq!(removed, 3);
    let left = flowmesh::log::fold(js, subjects::all_events()).await?;
    assert!(!left.workflows.contains_key("wf-1") && left.cordoned.contains("w2"));
    world.shutdown().await;
    Ok(())
}
