//! Where a task's files go and how they are read back: each worker writes its own object store,
//! and every reader checks what it fetches against the digest the task's `task.completed`
//! reported, so a file replaced in the store afterwards is refused, never handed on.

use flowmesh_domain::EventBody;
use flowmesh_nats::subjects;
use tests::{World, kinds};

/// A python stage that writes a file, and one downstream that reads it.
const DOC: &str = r#"apiVersion: flowmesh/v1
kind: Workflow
metadata: {name: owned-files}
spec:
  taskType: python
  stages:
    - name: make
      spec: {command: [sh, -c, 'echo "made by make" > "$FLOWMESH_OUTPUT_DIR/made.txt"; echo done']}
    - name: use
      dependsOn: [make]
      spec: {command: [sh, -c, 'cat inputs/make/made.txt']}
"#;

#[tokio::test]
async fn files_live_in_their_workers_own_store_and_a_replaced_file_is_refused() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let workflow = world.submit(DOC.as_bytes(), None).await?;
    let events = world.wait_workflow_end(&workflow).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}\n{events:#?}", kinds(&events));
    let made = events.iter().find_map(|e| match &e.body {
        EventBody::TaskCompleted(c) if c.task.stage == "make" => Some(c.clone()),
        _ => None,
    });
    let made = made.expect("make completed");
    let own = subjects::artifacts_bucket("w1");
    let file = made.artifacts.iter().find(|a| a.name == "made.txt").expect("made.txt is an artifact");
    assert!(made.artifacts.iter().all(|a| a.bucket.as_deref() == Some(own.as_str())), "{:?}", made.artifacts);
    let shared = world.handles.js.get_object_store(subjects::ARTIFACTS_BUCKET).await?;
    let in_shared = futures_util::StreamExt::collect::<Vec<_>>(shared.list().await?).await;
    assert!(in_shared.is_empty(), "files went to the shared store: {}", in_shared.len());

    // Fetched as reported, logs included.
    let out = world.dir.path().join("fetched");
    let fetched = flowmesh::views::fetch_results(&world.handles.js, &made.task.task_id, &out).await?;
    let names: Vec<&str> = fetched.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["results.json", "made.txt", "logs/stdout.log", "logs/stderr.log"], "{fetched:?}");
    assert_eq!(std::fs::read_to_string(out.join("made.txt"))?, "made by make\n");

    // Someone who can write the worker's store (here the test, as the admin could) replaces the
    // file: its store's own digest is the new one, the report's is not, and the reader refuses.
    let store = world.handles.js.get_object_store(&own).await?;
    store.put(file.object.as_str(), &mut b"replaced".as_slice()).await?;
    let refused =
        flowmesh::views::fetch_results(&world.handles.js, &made.task.task_id, &world.dir.path().join("again"))
            .await
            .expect_err("a replaced file was fetched");
    assert!(refused.to_string().contains("made.txt") && refused.to_string().contains(&file.digest), "{refused}");
    world.shutdown().await;
    Ok(())
}
