//! Retention against a real server: the router purges the events of workflows that ended longer
//! ago than it keeps them, stores a record of it first, and leaves what runs alone; a router
//! that folds the log from nothing afterwards agrees with the one that purged.

use flowmesh_nats::subjects;
use futures_util::StreamExt;
use std::time::Duration;
use tests::{DEADLINE, World, router_config, worker_config};

/// Asks for a GPU no worker here has: it waits for one (a long grace), so its workflow runs on.
const WAITS_FOR_A_GPU: &str = "apiVersion: flowmesh/v1\nkind: PPO\nmetadata: {name: waits}\nspec:\n  taskType: ppo\n  resources: {hardware: {gpu: {count: 1, type: H100}}}\n";

/// How many messages the log holds on the subjects `filter` matches.
async fn stored(world: &World, filter: &str) -> anyhow::Result<usize> {
    let stream = world.handles.js.get_stream(subjects::EVENTS_STREAM).await?;
    let mut subjects = stream.info_with_subjects(filter).await?;
    let mut count = 0;
    while let Some(entry) = subjects.next().await {
        count += entry?.1;
    }
    Ok(count)
}

#[tokio::test]
async fn ended_workflows_events_are_purged_after_the_kept_period_and_a_fresh_router_agrees() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.validator("validator", flowmesh_validator::Config::default()).await?;
    let config = |instance: &str| {
        let mut config = router_config(instance);
        config.keep_ended = Some(Duration::from_secs(1));
        config.schedule.no_worker_grace_ms = 10 * 60_000;
        config
    };
    world.router_with(config("r1")).await?;
    world.worker(worker_config(&world, "w1", None)).await?;

    let waits = world.submit(WAITS_FOR_A_GPU.as_bytes(), None).await?;
    let ended = world.submit(&tests::example("valid/echo.yaml"), None).await?;
    world.wait_workflow_end(&ended).await?;
    assert!(stored(&world, &subjects::workflow_events(&ended)).await? >= 3);

    // The record comes first, then the purge.
    world
        .wait_for("the purge record", |events| {
            events.iter().any(
                |e| matches!(&e.body, flowmesh_domain::EventBody::WorkflowsPurged(p) if p.workflows.contains(&ended)),
            )
        })
        .await?;
    until_gone(&world, &ended).await?;
    // What runs keeps every event; the record is there, once.
    assert!(stored(&world, &subjects::workflow_events(&waits)).await? >= 2, "{waits} lost events");
    assert_eq!(stored(&world, &subjects::purge_records()).await?, 1);
    let r1 = world.status_when("router", |s| s["purged_workflows"] == 1 && s["running_workflows"] == 1).await?;
    assert!(r1["purged_workflows"] == 1 && r1["running_workflows"] == 1, "{r1}");

    // A person asking about it is told why it is gone.
    let out = world.cli(&["workflow", "info", &ended]).await?;
    assert!(!out.status.success() && tests::output_text(&out).contains("purged"), "{}", tests::output_text(&out));

    // A router that folds the log from nothing holds what the first one held.
    world.stop("r1").await?;
    world.router_with(config("r2")).await?;
    let r2 =
        world.status_when("router", |s| s["instance"] == "r2" && s["leader"] == true && s["caught_up"] == true).await?;
    for field in ["workflows", "running_workflows", "purged_workflows"] {
        assert_eq!(r2[field], r1[field], "{field}: r1 {r1}, r2 {r2}");
    }
    world.shutdown().await;
    Ok(())
}

/// Waits until the log holds nothing of `workflow`.
async fn until_gone(world: &World, workflow: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while stored(world, &subjects::workflow_events(workflow)).await? > 0 {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "{workflow}'s events are still in the log");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A stack (validator, worker `w1`) and router `r1` under `config`, which runs one echo workflow
/// to its end, folds that end and stops: the workflow's id.
async fn ended_under(world: &mut World, config: flowmesh_router::Config) -> anyhow::Result<String> {
    world.validator("validator", flowmesh_validator::Config::default()).await?;
    world.worker(worker_config(world, "w1", None)).await?;
    world.router_with(config).await?;
    let ended = world.submit(&tests::example("valid/echo.yaml"), None).await?;
    world.wait_workflow_end(&ended).await?;
    // The end is folded (and so in a checkpoint written at the stop) once the router says so.
    world.status_when("router", |s| s["running_workflows"] == 0 && s["caught_up"] == true).await?;
    world.stop("r1").await?;
    Ok(ended)
}

/// A router resumed from its checkpoint did not fold the events of a workflow that ended
/// before it: it cannot know their sequences, and purges them by the workflow's subjects.
#[tokio::test]
async fn a_router_resumed_from_its_checkpoint_purges_what_it_did_not_see_by_subjects() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    let checkpoint = world.dir.path().join("router-checkpoint");
    let config = |keep: Duration| {
        let mut config = router_config("r1");
        config.checkpoint_dir = Some(checkpoint.clone());
        config.keep_ended = Some(keep);
        config
    };
    let ended = ended_under(&mut world, config(Duration::from_secs(3600))).await?;
    assert!(stored(&world, &subjects::workflow_events(&ended)).await? >= 3);

    world.router_with(config(Duration::from_secs(1))).await?;
    until_gone(&world, &ended).await?;
    let status = world.status_when("router", |s| s["purged_workflows"] == 1).await?;
    assert_eq!(status["purged_workflows"], 1, "{status}");
    world.shutdown().await;
    Ok(())
}

/// Late reports of a purged workflow, more than one purge round deletes.
const LATE_REPORTS: usize = 4_200;

/// A leader that stored a purge record and stopped before its round removed anything: the
/// router that takes over removes what that record's round names, although none of it is due
/// by its own kept period, and every report of that workflow that came after the record.
#[tokio::test]
async fn a_router_taking_over_removes_what_the_latest_records_round_left_behind() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    let config = |instance: &str| {
        let mut config = router_config(instance);
        config.keep_ended = Some(Duration::from_secs(3600));
        config
    };
    let ended = ended_under(&mut world, config("r1")).await?;

    // What r1 would have stored before removing anything, had its kept period been over.
    let mut listed = flowmesh_domain::ids::WorkflowIds::default();
    listed.insert(&ended);
    let record = flowmesh_domain::EventBody::WorkflowsPurged(flowmesh_domain::event::WorkflowsPurged {
        workflows: listed.clone(),
        removing: listed,
    });
    let record = flowmesh_domain::Event::new(record, flowmesh_nats::clock::now_rfc3339(), 0);
    flowmesh_nats::publish::publish_event(&world.handles.js, &record, flowmesh_domain::event::Author::Service).await?;
    // And reports of the purged workflow after its record (a worker a week late), each under an
    // id of its own so the stream keeps it: more than one round deletes (4,096), and all go.
    let completion = world
        .events()
        .into_iter()
        .find(|e| matches!(&e.body, flowmesh_domain::EventBody::TaskCompleted(c) if c.task.workflow_id == ended))
        .ok_or_else(|| anyhow::anyhow!("no completion of {ended}"))?;
    let mut sent = Vec::new();
    for n in 0..LATE_REPORTS {
        let mut late = completion.clone();
        late.id = format!("{}.late.{n}", completion.id);
        let author = flowmesh_domain::event::Author::Worker("w1");
        sent.push(flowmesh_nats::publish::send_event(&world.handles.js, &late, author).await?);
    }
    for in_flight in sent {
        in_flight.stored(&world.handles.js).await?;
    }
    assert!(stored(&world, &subjects::workflow_events(&ended)).await? >= 3 + LATE_REPORTS);

    world.router_with(config("r2")).await?;
    until_gone(&world, &ended).await?;
    let status = world.status_when("router", |s| s["purged_workflows"] == 1 && s["leader"] == true).await?;
    assert_eq!(status["instance"], "r2", "{status}");
    world.shutdown().await;
    Ok(())
}

/// A python stage that prints: its stdout log is stored in its worker's object store.
const PRINTS: &str = "apiVersion: flowmesh/v1\nkind: Workflow\nmetadata: {name: prints}\nspec:\n  stages:\n    - name: say\n      spec:\n        taskType: python\n        entrypoint: run\n        code: |\n          def run(inputs):\n              print('a line for the store')\n              return {'ok': True}\n";

/// How many messages object store `bucket`'s stream holds (records and chunks).
async fn store_messages(world: &World, bucket: &str) -> anyhow::Result<u64> {
    let mut stream = world.handles.js.get_stream(subjects::object_stream(bucket)).await?;
    Ok(stream.info().await?.state.messages)
}

/// An upload that stopped halfway (a worker killed while storing a file) leaves chunks that no
/// record names. The admin's pruning keeps them while they may still be an upload in progress and
/// removes them once they are older than that, with or without a purge record, and keeps every
/// stored file.
#[tokio::test]
async fn the_chunks_of_an_upload_that_stopped_halfway_are_removed_once_old_and_stored_files_stay() -> anyhow::Result<()>
{
    let world = World::start().await?;
    let bucket = subjects::ARTIFACTS_BUCKET;
    let store = world.handles.js.get_object_store(bucket).await?;
    let kept = subjects::artifact("wf-1-say", "results.json");
    store.put(kept.as_str(), &mut &b"{\"said\": 1}"[..]).await?;
    // Two chunks of an upload whose record was never written.
    for chunk in [&b"half of a checkpoint"[..], b"and no record"] {
        world.handles.js.publish(format!("$O.{bucket}.C.INTERRUPTEDUPLOAD"), chunk.into()).await?.await?;
    }
    assert_eq!(store_messages(&world, bucket).await?, 2 + 2);

    let prune = |age: Option<&'static str>| {
        let world = &world;
        async move {
            let mut args = vec!["streams", "prune-artifacts", "--json"];
            args.extend(age.map(|age| ["--orphans-older-than", age]).into_iter().flatten());
            let out = world.cli(&args).await?;
            anyhow::ensure!(out.status.success(), "{}", tests::output_text(&out));
            let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)?;
            let row = rows.into_iter().find(|r| r["bucket"] == bucket).unwrap_or_default();
            Ok::<_, anyhow::Error>((row["orphans"].clone(), row["kept"].clone(), row["removed"].clone()))
        }
    };
    // Fresh chunks may be an upload in progress: kept under the default hour.
    assert_eq!(prune(None).await?, (0.into(), 1.into(), 0.into()));
    assert_eq!(store_messages(&world, bucket).await?, 2 + 2);
    // Old enough, they go; the stored file stays, whole.
    assert_eq!(prune(Some("0")).await?, (1.into(), 1.into(), 0.into()));
    assert_eq!(store_messages(&world, bucket).await?, 2, "only the stored file's record and chunk stay");
    let mut bytes = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut store.get(kept.as_str()).await?, &mut bytes).await?;
    assert_eq!(bytes, b"{\"said\": 1}");
    world.shutdown().await;
    Ok(())
}

/// A worker prunes its own store of what an upload that stopped halfway left, even where nothing
/// was ever purged from the log, and keeps its stored files.
#[tokio::test]
async fn a_worker_removes_the_chunks_of_its_own_uploads_that_stopped_halfway() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    let mut worker = worker_config(&world, "w1", None);
    worker.artifacts_prune = Some(Duration::from_millis(100));
    worker.artifacts_orphans_older_than = Duration::from_secs(1);
    world.worker(worker).await?;
    let bucket = subjects::artifacts_bucket("w1");
    // The worker makes its store as it starts.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let store = loop {
        match world.handles.js.get_object_store(&bucket).await {
            Ok(store) => break store,
            Err(e) => anyhow::ensure!(tokio::time::Instant::now() < deadline, "w1 made no store {bucket}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let kept = subjects::artifact("wf-1-say", "results.json");
    store.put(kept.as_str(), &mut &b"{}"[..]).await?;
    world.handles.js.publish(format!("$O.{bucket}.C.INTERRUPTEDUPLOAD"), "half a file".into()).await?.await?;
    // The orphan goes once its chunk is a second old; the stored file's record and chunk stay.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while store_messages(&world, &bucket).await? != 2 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{bucket} holds {} messages, expected 2",
            store_messages(&world, &bucket).await?
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store.info(&kept).await.map_err(|e| anyhow::anyhow!("{kept} was removed: {e}"))?;
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_worker_removes_the_files_of_purged_workflows_from_its_store_and_keeps_the_rest() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.validator("validator", flowmesh_validator::Config::default()).await?;
    let config = |instance: &str, keep_ended: Option<Duration>| {
        let mut config = router_config(instance);
        config.keep_ended = keep_ended;
        config.schedule.no_worker_grace_ms = 10 * 60_000;
        config
    };
    // First a router that keeps everything, so the ended workflow's files are seen in the store.
    world.router_with(config("r1", None)).await?;
    let mut worker = worker_config(&world, "w1", None);
    worker.artifacts_prune = Some(Duration::from_millis(200));
    world.worker(worker).await?;
    let bucket = subjects::artifacts_bucket("w1");

    let waits = world.submit(WAITS_FOR_A_GPU.as_bytes(), None).await?;
    let ended = world.submit(PRINTS.as_bytes(), None).await?;
    let end = world.wait_workflow_end(&ended).await?;
    assert!(end.iter().any(|e| matches!(&e.body, flowmesh_domain::EventBody::TaskCompleted(_))), "{end:?}");
    let store = world.handles.js.get_object_store(&bucket).await?;
    let log = subjects::log_object(&format!("{ended}-say"), "stdout");
    store.info(&log).await.map_err(|e| anyhow::anyhow!("{log} is not in {bucket}: {e}"))?;
    // Files of a workflow still running, and one not named after a task, stay.
    let running = subjects::artifact(&format!("{waits}-main"), "notes.txt");
    store.put(running.as_str(), &mut &b"still needed"[..]).await?;
    store.put("models/shared.bin", &mut &b"not a task's"[..]).await?;
    let kept = 2 * 2; // each a record and one chunk
    assert!(store_messages(&world, &bucket).await? > kept);

    // A router that keeps ended workflows a second purges the ended one; the worker follows.
    world.stop("r1").await?;
    world.router_with(config("r2", Some(Duration::from_secs(1)))).await?;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while store.info(&log).await.is_ok() {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "{log} is still in {bucket}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    world
        .wait_for("the purge record", |events| {
            events.iter().any(
                |e| matches!(&e.body, flowmesh_domain::EventBody::WorkflowsPurged(p) if p.workflows.contains(&ended)),
            )
        })
        .await?;
    // Removed whole: no chunk and no deletion marker stays, only what is kept.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while store_messages(&world, &bucket).await? != kept {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{bucket} holds {} messages, expected {kept}",
            store_messages(&world, &bucket).await?
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for name in [running.as_str(), "models/shared.bin"] {
        store.info(name).await.map_err(|e| anyhow::anyhow!("{name} was removed: {e}"))?;
    }
    assert_eq!(stored(&world, &subjects::workflow_events(&ended)).await?, 0, "{ended}'s events stayed");

    // Asking for its task or its files says why they are gone.
    for args in [["task", "info"], ["result", "fetch"]] {
        let out = world.cli(&[args[0], args[1], &format!("{ended}-say")]).await?;
        let text = tests::output_text(&out);
        assert!(!out.status.success() && text.contains("purged"), "{args:?}: {text}");
    }

    // The shared store, which no worker prunes, is the admin's: one command prunes every store.
    let shared = world.handles.js.get_object_store(subjects::ARTIFACTS_BUCKET).await?;
    let old = subjects::artifact(&format!("{ended}-say"), "results.json");
    shared.put(old.as_str(), &mut &b"{}"[..]).await?;
    let out = world.cli(&["streams", "prune-artifacts", "--json"]).await?;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)?;
    let row = |bucket: &str| rows.iter().find(|r| r["bucket"] == bucket).cloned().unwrap_or_default();
    assert_eq!(row(subjects::ARTIFACTS_BUCKET)["removed"], 1, "{rows:?}");
    assert_eq!((row(&bucket)["removed"].clone(), row(&bucket)["kept"].clone()), (0.into(), 2.into()), "{rows:?}");
    assert!(shared.info(&old).await.is_err(), "{old} is still in the shared store");
    world.shutdown().await;
    Ok(())
}
