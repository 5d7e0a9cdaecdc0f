//! Task merge: identical inference requests that arrive while one is queued or running share
//! one execution; each submitter's task gets its own events and result, and cancelling one
//! leaves the others alone.

use flowmesh_domain::EventBody;
use tests::{World, output_text, worker_config};

const DOC: &str = "apiVersion: flowmesh/v1\nkind: InferenceTask\nmetadata: {name: ask}\nspec:\n  taskType: inference\n  model: {source: {type: huggingface, identifier: Qwen/Qwen3-0.6B}}\n  inference: {max_tokens: 16, temperature: 0}\n  data: {type: list, items: [what is NATS?]}\n";

#[tokio::test]
async fn identical_inference_requests_share_one_execution_and_each_gets_its_result() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    // A stand-in runner that counts its executions and takes a moment (it waits for a go file).
    let runs = world.dir.path().join("runs.txt");
    let go = world.dir.path().join("go");
    let plugin = world.dir.path().join("infer.toml");
    std::fs::write(
        &plugin,
        format!(
            "[[executor]]\nname = \"stand-in\"\ntask_types = [\"inference\"]\nprobe = [\"true\"]\ncommand = [\"/bin/sh\", \"-c\", \"echo $FLOWMESH_TASK_ID >> {runs}; while [ ! -e {go} ]; do sleep 0.05; done; printf '{{\\\"items\\\": [{{\\\"output\\\": \\\"answer\\\"}}], \\\"by\\\": \\\"%s\\\"}}' $FLOWMESH_TASK_ID > $FLOWMESH_RESULT_FILE\"]\n",
            runs = runs.display(),
            go = go.display()
        ),
    )?;
    let mut config = worker_config(&world, "w1", None);
    config.executors_file = Some(plugin);
    config.batch_slots = 4;
    world.worker(config).await?;

    let first = world.submit(DOC.as_bytes(), None).await?;
    world.wait_started(&first).await?;
    let second = world.submit(DOC.as_bytes(), None).await?;
    let third = world.submit(DOC.as_bytes(), None).await?;
    let different = world.submit(DOC.replace("what is NATS?", "what is JetStream?").as_bytes(), None).await?;
    for wf in [&second, &third] {
        world
            .wait_for("the identical request to merge", |events| {
                events.iter().any(|e| matches!(&e.body, EventBody::TaskMerged(m) if m.task.workflow_id == *wf && m.into == format!("{first}-main")))
            })
            .await?;
    }
    let out = world.cli(&["task", "info", &format!("{second}-main")]).await?;
    let info: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(
        (info["status"].as_str(), info["merged_into"].as_str()),
        (Some("merged"), Some(format!("{first}-main").as_str())),
        "{info}"
    );
    let out = world.cli(&["task", "list", "--workflow", &second]).await?;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("merged with {first}-main")),
        "{}",
        output_text(&out)
    );

    // plan says an identical request would be merged, and with which.
    let file = world.dir.path().join("ask.yaml");
    std::fs::write(&file, DOC)?;
    let out = world.cli(&["plan", file.to_str().unwrap()]).await?;
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(plan.contains(&format!("would be merged with {first}-main")), "{}", output_text(&out));

    // Cancelling one merged task leaves the shared execution and the other merged task alone.
    let out = world.cli(&["task", "stop", &format!("{third}-main")]).await?;
    assert!(out.status.success(), "{}", output_text(&out));
    let events = world.wait_workflow_end(&third).await?;
    assert!(
        events.iter().any(|e| matches!(&e.body, EventBody::TaskCancelled(c) if c.worker_id.is_none())),
        "the merged task is cancelled without touching a worker: {:?}",
        tests::kinds(&events)
    );
    assert!(
        !world.events().iter().any(|e| matches!(&e.body, EventBody::TaskCancelled(c) if c.task.workflow_id == first)),
        "the shared execution goes on"
    );

    std::fs::write(&go, "")?;
    let watched = world.cli(&["workflow", "watch", &second]).await?;
    assert!(watched.status.success(), "{}", output_text(&watched));
    assert!(
        String::from_utf8_lossy(&watched.stderr).contains(&format!("merged with {first}-main")),
        "{}",
        output_text(&watched)
    );
    for wf in [&first, &second, &different] {
        let events = world.wait_workflow_end(wf).await?;
        assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{wf}: {:?}", tests::kinds(&events));
    }
    let result = |wf: &str| {
        world.events().into_iter().find_map(|e| match e.body {
            EventBody::TaskCompleted(c) if c.task.workflow_id == wf => c.result,
            _ => None,
        })
    };
    assert_eq!(result(&second), result(&first), "the merged task's result is the shared execution's");
    assert_eq!(result(&first).unwrap()["by"], format!("{first}-main"));
    let executions = std::fs::read_to_string(&runs)?;
    assert_eq!(
        executions.lines().count(),
        2,
        "one execution for three identical requests, one for the other: {executions}"
    );

    let dir = world.dir.path().join("fetched");
    let out = world.cli(&["result", "fetch", &format!("{second}-main"), "--out", dir.to_str().unwrap()]).await?;
    assert!(out.status.success(), "{}", output_text(&out));
    let fetched: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("results.json"))?)?;
    assert_eq!(Some(fetched), result(&second));
    world.shutdown().await;
    Ok(())
}
