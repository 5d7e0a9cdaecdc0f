//! Operating the fleet as FlowMesh users do: `worker drain` next to cordon, `worker list`
//! showing what operators asked, and `workerTags` selecting workers by their WORKER_TAGS.

use flowmesh_domain::EventBody;
use flowmesh_domain::event::FailureReason;
use futures_util::StreamExt;
use tests::{World, output_text, worker_config};

fn doc(name: &str, command: &str, tags: &str) -> String {
    format!(
        "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {{name: {name}}}\nspec:\n  taskType: python\n  command: '{command}'\n  workerTags: {tags}\n"
    )
}

/// The `worker list --json` entry of `id`.
async fn listed(world: &World, id: &str) -> anyhow::Result<serde_json::Value> {
    let out = world.cli(&["worker", "list", "--json"]).await?;
    anyhow::ensure!(out.status.success(), "{}", output_text(&out));
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)?;
    list.into_iter().find(|w| w["snapshot"]["id"] == id).ok_or_else(|| anyhow::anyhow!("{id} is not listed"))
}

/// Polls `worker list` until `id`'s status reads `want` (snapshots follow on their own timer).
async fn wait_listed_status(world: &World, id: &str, want: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    loop {
        let entry = listed(world, id).await?;
        if entry["status"] == want {
            return Ok(());
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "{id} never listed as {want:?}: {entry}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

fn ran_on(events: &[flowmesh_domain::Event], workflow_id: &str) -> Option<String> {
    events.iter().find_map(|e| match &e.body {
        EventBody::TaskCompleted(c) if c.task.workflow_id == workflow_id => Some(c.worker_id.clone()),
        _ => None,
    })
}

#[tokio::test]
async fn worker_tags_select_workers_and_plan_explains_them() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    for (id, tags) in [("pool-a-1", vec!["pool-a"]), ("spot-1", vec!["pool-a", "spot"])] {
        let mut config = worker_config(&world, id, None);
        config.tags = tags.into_iter().map(str::to_owned).collect();
        world.worker(config).await?;
    }
    world
        .wait_for("both workers to join", |events| {
            events.iter().filter(|e| matches!(e.body, EventBody::WorkerJoined(_))).count() == 2
        })
        .await?;
    let entry = listed(&world, "spot-1").await?;
    assert_eq!(entry["snapshot"]["tags"], serde_json::json!(["pool-a", "spot"]), "{entry}");

    for _ in 0..3 {
        let wf = world.submit(doc("steady", "true", "[pool-a, \"!spot\"]").as_bytes(), None).await?;
        let events = world.wait_workflow_end(&wf).await?;
        assert_eq!(ran_on(&events, &wf).as_deref(), Some("pool-a-1"), "{:?}", tests::kinds(&events));
    }

    let file = world.dir.path().join("gpu-pool.yaml");
    std::fs::write(&file, doc("gpu", "true", "[gpu-pool]"))?;
    let out = world.cli(&["plan", file.to_str().unwrap()]).await?;
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(
        plan.contains("do not match workerTags [gpu-pool]") || plan.contains("does not match workerTags [gpu-pool]"),
        "{}",
        output_text(&out)
    );
    // No worker has the tag: after the grace period it fails like any capability mismatch.
    let wf = world.submit(doc("gpu", "true", "[gpu-pool]").as_bytes(), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert!(
        events.iter().any(|e| matches!(&e.body, EventBody::TaskPending(p) if p.message.contains("2 do not match workerTags [gpu-pool]"))),
        "{:?}",
        tests::kinds(&events)
    );
    assert!(tests::failed_for(&events, FailureReason::NoEligibleWorker), "{:?}", tests::kinds(&events));
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn worker_drain_stops_new_work_lets_running_work_finish_and_lists_it() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    // The running task holds until the test releases it, however slow the machine.
    let release = world.dir.path().join("release");
    let hold = format!("while [ ! -e {} ]; do sleep 0.05; done", release.display());
    let running = world.submit(doc("slow", &hold, "[]").as_bytes(), None).await?;
    world.wait_started(&running).await?;
    let out = world.cli(&["worker", "drain", "w1"]).await?;
    assert!(out.status.success(), "{}", output_text(&out));
    let entry = listed(&world, "w1").await?;
    assert_eq!((entry["draining"].as_bool(), entry["cordoned"].as_bool()), (Some(true), Some(false)), "{entry}");
    assert!(entry["status"].as_str().unwrap().contains("draining (1 running)"), "{entry}");
    let out = world.cli(&["worker", "list"]).await?;
    assert!(String::from_utf8_lossy(&out.stdout).contains("draining (1 running)"), "{}", output_text(&out));

    // Waiting on a drain is waiting for a slot: explained live on the hints subject, not stored.
    let mut hints = world.client.subscribe(flowmesh_nats::subjects::hint("wf-2", "wf-2-main")).await?;
    let queued = world.submit(doc("queued", "true", "[]").as_bytes(), None).await?;
    assert_eq!(queued, "wf-2");
    std::fs::write(&release, "")?;
    let events = world.wait_workflow_end(&running).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "what runs finishes");
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    loop {
        let hint = tokio::time::timeout_at(deadline, hints.next()).await?.expect("a hint");
        let hint: flowmesh_domain::event::Event = serde_json::from_slice(&hint.payload)?;
        match &hint.body {
            EventBody::TaskPending(p) if p.message.contains("1 is draining") => {
                assert_eq!(p.reason, "busy");
                break;
            }
            EventBody::TaskPending(_) => continue,
            other => panic!("a hint is a task.pending: {other:?}"),
        }
    }
    let stored = world.events();
    assert!(!stored.iter().any(|e| matches!(&e.body, EventBody::TaskPending(p) if p.task.workflow_id == queued)));
    wait_listed_status(&world, "w1", "idle, drained").await?;

    let out = world.cli(&["worker", "uncordon", "w1"]).await?;
    assert!(out.status.success(), "{}", output_text(&out));
    let events = world.wait_workflow_end(&queued).await?;
    assert_eq!(ran_on(&events, &queued).as_deref(), Some("w1"), "uncordon ends the drain");
    assert_eq!(listed(&world, "w1").await?["draining"], false);
    world.shutdown().await;
    Ok(())
}
