//! The walking skeleton: one echo task from `nats pub` to a stored result.

use flowmesh_domain::EventBody;
use flowmesh_domain::schema::check_event;
use tests::{World, example, kinds};

#[tokio::test]
async fn echo_from_nats_pub_to_stored_result() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    world.nats_pub(&example("valid/echo.yaml")).await?;

    let events = world.wait_workflow_end("wf-1").await?;
    let task_events: Vec<_> = events
        .iter()
        .filter(|e| e.body.task().is_some() || matches!(e.body, EventBody::SubmissionAccepted(_)))
        .collect();
    let order: Vec<&str> = task_events.iter().map(|e| e.body.kind()).filter(|k| *k != "task.pending").collect();
    // An echo completes before its start is due: no `task.started`, its completion says when.
    assert_eq!(order, ["submission.accepted", "task.dispatched", "task.completed"], "{:?}", kinds(&events));
    assert_eq!(events.last().map(|e| e.body.kind()), Some("workflow.completed"));
    // That end is derived by the reader from the task's, not stored: besides the wait for the
    // worker to join (task.pending), three messages on the log.
    let log = world.handles.js.get_stream(flowmesh_nats::subjects::EVENTS_STREAM).await?;
    let stored: Vec<(String, usize)> = futures_util::TryStreamExt::try_collect(
        log.info_with_subjects(flowmesh_nats::subjects::workflow_events("wf-1")).await?,
    )
    .await?;
    let stored: Vec<(String, usize)> = stored.into_iter().filter(|(s, _)| !s.ends_with(".task.pending")).collect();
    assert_eq!(stored.iter().map(|(_, n)| n).sum::<usize>(), 3, "{stored:?}");
    assert!(stored.iter().all(|(subject, _)| !subject.contains(".workflow.")), "{stored:?}");
    // The dispatch is the work order: on its worker's subject, carrying the order, and the work
    // stream (orders that hold a secret) took nothing.
    assert!(
        stored
            .iter()
            .any(|(subject, _)| subject.starts_with("flowmesh.events.w1.") && subject.ends_with(".task.dispatched")),
        "{stored:?}"
    );
    let order = events.iter().find_map(|e| match &e.body {
        EventBody::TaskDispatched(d) => d.order.clone(),
        _ => None,
    });
    assert_eq!(order.map(|o| (o.task_type, o.attempt)), Some(("echo".to_owned(), 1)));
    let work = world.handles.js.get_stream(flowmesh_nats::subjects::WORK_STREAM).await?.info().await?.state.clone();
    assert_eq!(work.last_sequence, 0, "{work:?}");

    let task_id = match &events[0].body {
        EventBody::SubmissionAccepted(a) => {
            assert_eq!(a.workflow_id, "wf-1");
            assert_eq!(a.submission.stream, "FLOWMESH_SUBMISSIONS");
            assert_eq!(a.submission.seq, 1);
            a.task_ids[0].clone()
        }
        other => panic!("first event should be the verdict, got {other:?}"),
    };
    for e in events.iter().filter_map(|e| e.body.task()) {
        assert_eq!((e.workflow_id.as_str(), e.task_id.as_str(), e.attempt), ("wf-1", task_id.as_str(), 1));
    }
    let workers: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::TaskDispatched(d) => Some(d.worker_id.as_str()),
            EventBody::TaskStarted(s) => Some(s.worker_id.as_str()),
            EventBody::TaskCompleted(c) => Some(c.worker_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(workers, ["w1", "w1"]);

    let completed = events.iter().find_map(|e| match &e.body {
        EventBody::TaskCompleted(c) => Some(c.clone()),
        _ => None,
    });
    let completed = completed.expect("a completion");
    let expected = serde_json::json!({"ok": true, "count": 3, "items": [{"output": "hello"}, {"output": "from"}, {"output": "flowmesh"}]});
    assert_eq!(completed.result, Some(expected.clone()));
    let completion = events.iter().find(|e| matches!(e.body, EventBody::TaskCompleted(_))).expect("a completion");
    let started_at = completed.started_at.as_deref().expect("started_at on a completion without a start");
    let (started, ended) =
        (flowmesh_domain::trace::unix_ms(started_at), flowmesh_domain::trace::unix_ms(&completion.time));
    assert!(started.is_some() && started <= ended, "{started_at} then {}", completion.time);
    // An echo stores nothing: no object, no artifact, no folder on the worker; its result is inline.
    assert_eq!(completed.result_object, None);
    assert!(completed.artifacts.is_empty(), "{:?}", completed.artifacts);
    assert!(!world.dir.path().join("results/w1").join(&task_id).exists(), "an echo made a task folder");
    for bucket in
        [flowmesh_nats::subjects::artifacts_bucket("w1"), flowmesh_nats::subjects::ARTIFACTS_BUCKET.to_owned()]
    {
        let store = world.handles.js.get_object_store(&bucket).await?;
        let stored = futures_util::StreamExt::collect::<Vec<_>>(store.list().await?).await;
        assert!(stored.is_empty(), "an echo stored objects in {bucket}: {}", stored.len());
    }

    // Fetching it writes the inline result as results.json, and says it was not downloaded.
    let out = world.dir.path().join("fetched");
    let fetched = flowmesh::views::fetch_results(&world.handles.js, &task_id, &out).await?;
    let names: Vec<(&str, bool)> = fetched.iter().map(|f| (f.name.as_str(), f.verified)).collect();
    assert_eq!(names, [("results.json", false)]);
    let written: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("results.json"))?)?;
    assert_eq!(written, expected);

    // Every event on the log validates against schemas/event.schema.json.
    for e in world.events() {
        let problems = check_event(&serde_json::to_value(&e)?);
        assert!(problems.is_empty(), "{} does not match the event schema: {problems:?}", e.id);
    }
    world.shutdown().await;
    Ok(())
}
