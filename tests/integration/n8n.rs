//! FlowMesh's n8n-style JSON workflows through the whole stack: submitted as they are, run as
//! the equivalent graph, or rejected naming what is unsupported.

use flowmesh_domain::EventBody;
use tests::{World, output_text, worker_config};

/// A worker with a simulated GPU and a stand-in runner for inference and sft: its result echoes
/// the work order it got, so the test can see what each task was given.
async fn ml_stack(world: &mut World) -> anyhow::Result<()> {
    world.control_plane().await?;
    let plugin = world.dir.path().join("ml.toml");
    std::fs::write(
        &plugin,
        r#"[[executor]]
name = "stand-in-runner"
task_types = ["inference", "sft"]
probe = ["true"]
command = ["/bin/sh", "-c", "printf '{\"ok\": true, \"final_model_archive\": \"%s/model.tgz\", \"items\": [{\"output\": \"from %s\"}], \"order\": %s}' \"$FLOWMESH_TASK_ID\" \"$FLOWMESH_TASK_ID\" \"$(cat \"$FLOWMESH_TASK_FILE\")\" > \"$FLOWMESH_RESULT_FILE\""]
"#,
    )?;
    let hardware = serde_json::from_slice(&tests::example("hardware/gpu-h100.json"))?;
    let mut config = worker_config(world, "gpu-1", Some(hardware));
    config.executors_file = Some(plugin);
    world.worker(config).await
}

#[tokio::test]
async fn n8n_workflows_run_as_their_graph_or_are_rejected_naming_what_is_unsupported() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    ml_stack(&mut world).await?;

    let out =
        world.cli(&["validate", "examples/n8n/fan_in_synthesis.json", "examples/n8n/sft_then_inference.json"]).await?;
    assert!(out.status.success(), "{}", output_text(&out));

    let out = world.cli(&["submit", "examples/n8n/sft_then_inference.json", "--watch"]).await?;
    assert!(out.status.success(), "{}", output_text(&out));
    let results: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let order = &results["Inference"]["order"];
    assert_eq!(
        order["spec"]["checkpoint"]["load"]["url"], "wf-1-SFT/model.tgz",
        "the inference loads what SFT trained: {results:#}"
    );
    assert_eq!(order["spec"]["model"]["source"]["identifier"], "Qwen/Qwen3-0.6B");
    assert_eq!(results["SFT"]["order"]["spec"]["training"]["num_train_epochs"], 1);

    let wf = world.submit(&tests::example("n8n/fan_in_synthesis.json"), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}", tests::kinds(&events));
    let position = |kind: &str, stage: &str| {
        events
            .iter()
            .position(|e| e.body.kind() == kind && e.body.task().is_some_and(|t| t.stage == stage))
            .unwrap_or_else(|| panic!("{kind} {stage}: {:?}", tests::kinds(&events)))
    };
    let synthesis = position("task.dispatched", "Synthesis");
    assert!(
        synthesis > position("task.completed", "Inference-A") && synthesis > position("task.completed", "Inference-B")
    );
    assert!(position("task.dispatched", "Inference-B") < position("task.completed", "Inference-A"), "two roots");

    let out = world.cli(&["submit", "examples/n8n/unsupported_openai.json"]).await?;
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nodes/3/type") && err.contains("\"Message a model\" calls an OpenAI-style API"), "{err}");
    // The CLI read the verdict from the log; the harness's own reader may get to it a moment later.
    world
        .wait_for("one verdict listing every unsupported node", |events| {
            events.iter().any(|e| matches!(&e.body, EventBody::SubmissionRejected(r) if r.errors.len() == 3))
        })
        .await?;
    world.shutdown().await;
    Ok(())
}
