//! `serve` as current FlowMesh has it: `accessMode: proxy`, and an `apiKey` that the task gets
//! while no event (nor anything built from events) ever holds it.

use flowmesh_domain::EventBody;
use tests::{World, output_text, worker_config};

const KEY: &str = "s3cr3t-key-7f1c";

#[tokio::test]
async fn a_serve_api_key_reaches_the_task_and_never_the_event_log() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    // A stand-in endpoint: it reports whether its task file carried the key (never the key).
    let plugin = world.dir.path().join("serve.toml");
    std::fs::write(
        &plugin,
        format!(
            r#"[[executor]]
name = "fake-vllm-serve"
task_types = ["serve"]
probe = ["true"]
command = ["/bin/sh", "-c", "if grep -q '{KEY}' \"$FLOWMESH_TASK_FILE\"; then k=true; else k=false; fi; printf '{{\"key_seen\": %s}}' $k > \"$FLOWMESH_RESULT_FILE\""]
"#
        ),
    )?;
    let mut config = worker_config(&world, "w1", None);
    config.executors_file = Some(plugin);
    world.worker(config).await?;

    let doc = format!(
        "apiVersion: flowmesh/v1\nkind: ServeTask\nmetadata: {{name: endpoint}}\nspec:\n  taskType: serve\n  model: {{source: {{type: huggingface, identifier: Qwen/Qwen3-0.6B}}}}\n  accessMode: proxy\n  apiKey: {KEY}\n  port: 8000\n"
    );
    let wf = world.submit(doc.as_bytes(), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    let result = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::TaskCompleted(c) => c.result.clone(),
            _ => None,
        })
        .unwrap_or_else(|| panic!("completed: {:?}", tests::kinds(&events)));
    assert_eq!(result["key_seen"], true, "the task got the key");

    let log = serde_json::to_string(&world.events())?;
    assert!(!log.contains(KEY), "no event holds the key");
    assert!(log.contains(flowmesh_domain::secret::REDACTED), "the accepted workflow holds the placeholder");
    // Its dispatch carries no order: the order, with the key, went to the worker's work subject.
    let dispatch = events.iter().find_map(|e| match &e.body {
        EventBody::TaskDispatched(d) => Some(d.clone()),
        _ => None,
    });
    assert!(dispatch.is_some_and(|d| d.order.is_none()), "{:?}", tests::kinds(&events));
    let work = world.handles.js.get_stream(flowmesh_nats::subjects::WORK_STREAM).await?.info().await?.state.clone();
    assert_eq!(work.last_sequence, 1, "{work:?}");
    let out = world.cli(&["task", "info", &format!("{wf}-main")]).await?;
    assert!(out.status.success() && !String::from_utf8_lossy(&out.stdout).contains(KEY), "{}", output_text(&out));

    let empty = doc.replace(&format!("apiKey: {KEY}"), "apiKey: ''");
    let wf = world.submit(empty.as_bytes(), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    let EventBody::SubmissionRejected(r) = &events.last().unwrap().body else { panic!("rejected: {events:?}") };
    assert!(r.errors.iter().any(|p| p.path == "/spec/apiKey"), "{:?}", r.errors);
    world.shutdown().await;
    Ok(())
}
