//! Warm placement: a worker that already holds a task's model is preferred among the workers
//! that pass every rule, and `plan` and the dispatch say so.

use flowmesh_domain::EventBody;
use flowmesh_domain::fleet::Hardware;
use tests::{World, output_text, worker_config};

fn doc(model: &str, gpus: u32) -> String {
    format!(
        "apiVersion: flowmesh/v1\nkind: InferenceTask\nmetadata: {{name: warm}}\nspec:\n  taskType: inference\n  model: {{source: {{type: huggingface, identifier: {model}}}}}\n  resources: {{hardware: {{gpu: {{count: {gpus}}}}}}}\n  data: {{type: list, items: [hi]}}\n"
    )
}

fn dispatched(events: &[flowmesh_domain::Event], workflow_id: &str) -> (String, String) {
    events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::TaskDispatched(d) if d.task.workflow_id == workflow_id => {
                Some((d.worker_id.clone(), d.message.clone()))
            }
            _ => None,
        })
        .expect("dispatched")
}

/// The config of worker `id` with a stand-in inference executor whose prewarm "downloads" the
/// model into the worker's own hub cache, as a file of `bytes` bytes.
fn prewarming_worker(world: &World, id: &str, bytes: usize) -> anyhow::Result<flowmesh_worker::Config> {
    let plugin = world.dir.path().join(format!("{id}.toml"));
    std::fs::write(
        &plugin,
        format!(
            r#"[[executor]]
name = "stand-in"
task_types = ["inference"]
probe = ["true"]
command = ["true"]
prewarm = ["/bin/sh", "-c", "d=\"$FLOWMESH_MODEL_CACHE/models--$(echo \"$FLOWMESH_PREWARM_MODEL\" | sed 's#/#--#g')/blobs\"; mkdir -p \"$d\" && head -c {bytes} /dev/zero > \"$d/weights\""]
"#
        ),
    )?;
    let cache = world.dir.path().join(format!("{id}-hub"));
    std::fs::create_dir_all(&cache)?;
    let mut config = worker_config(world, id, None);
    config.executors_file = Some(plugin);
    config.model_cache = Some(cache);
    Ok(config)
}

#[tokio::test]
async fn a_worker_holding_the_model_wins_among_eligible_workers_and_plan_says_so() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    let plugin = world.dir.path().join("infer.toml");
    std::fs::write(
        &plugin,
        "[[executor]]\nname = \"stand-in\"\ntask_types = [\"inference\"]\nprobe = [\"true\"]\ncommand = [\"true\"]\n",
    )?;
    // A hub cache holding one model, the way a Hugging Face library leaves it on disk.
    let cache = world.dir.path().join("hub");
    std::fs::create_dir_all(cache.join("models--Qwen--Qwen3-0.6B/blobs"))?;
    std::fs::write(cache.join("models--Qwen--Qwen3-0.6B/blobs/weights"), vec![0u8; 4096])?;
    let big: Hardware = serde_json::from_slice(&tests::example("hardware/gpu-h100.json"))?;
    let small = Hardware { cpu_cores: 4, memory_bytes: 8 << 30, ..Default::default() };
    for (id, hardware, model_cache) in [("a-cold", big, None), ("b-warm", small, Some(cache))] {
        let mut config = worker_config(&world, id, Some(hardware));
        config.executors_file = Some(plugin.clone());
        config.model_cache = model_cache;
        world.worker(config).await?;
    }
    world
        .wait_for("both workers to join", |events| {
            events.iter().filter(|e| matches!(e.body, EventBody::WorkerJoined(_))).count() == 2
        })
        .await?;
    let out = world.cli(&["worker", "list", "--json"]).await?;
    let list: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let warm = list.as_array().unwrap().iter().find(|w| w["snapshot"]["id"] == "b-warm").unwrap();
    assert_eq!(
        warm["snapshot"]["warm_models"],
        serde_json::json!([{"id": "Qwen/Qwen3-0.6B", "size_bytes": 4096, "state": "cached"}])
    );

    let file = world.dir.path().join("warm.yaml");
    std::fs::write(&file, doc("Qwen/Qwen3-0.6B", 0))?;
    let out = world.cli(&["plan", file.to_str().unwrap()]).await?;
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(plan.contains("→ b-warm") && plan.contains("b-warm holds Qwen/Qwen3-0.6B warm (cached"), "{plan}");
    assert!(
        plan.lines().any(|l| l.contains("* b-warm") && l.contains("can run it; holds Qwen/Qwen3-0.6B warm")),
        "{plan}"
    );

    let wf = world.submit(doc("Qwen/Qwen3-0.6B", 0).as_bytes(), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    let (worker, message) = dispatched(&events, &wf);
    assert_eq!(worker, "b-warm", "{message}");
    assert!(message.contains("holds Qwen/Qwen3-0.6B warm"), "{message}");

    // Another model: the better fit wins, as without warmth.
    let wf = world.submit(doc("meta-llama/Llama-3.2-1B-Instruct", 0).as_bytes(), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(dispatched(&events, &wf).0, "a-cold");
    // The warm model but a GPU request: warmth never overrides a hardware rule.
    let wf = world.submit(doc("Qwen/Qwen3-0.6B", 1).as_bytes(), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(dispatched(&events, &wf).0, "a-cold");
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_prewarm_hint_makes_an_idle_worker_load_the_model_and_advertise_it() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    world.worker(prewarming_worker(&world, "w1", 2048)?).await?;
    world
        .wait_for("the worker to join", |events| events.iter().any(|e| matches!(e.body, EventBody::WorkerJoined(_))))
        .await?;

    let out = world.cli(&["worker", "prewarm", "w1", "Qwen/Qwen3-0.6B"]).await?;
    assert!(out.status.success(), "{}", output_text(&out));
    world
        .wait_for("the hint to be recorded", |events| {
            events.iter().any(|e| matches!(&e.body, EventBody::WorkerPrewarmRequested(p) if p.worker_id == "w1" && p.model == "Qwen/Qwen3-0.6B"))
        })
        .await?;
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    loop {
        let out = world.cli(&["worker", "info", "w1"]).await?;
        let snapshot: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        if snapshot["warm_models"]
            == serde_json::json!([{"id": "Qwen/Qwen3-0.6B", "size_bytes": 2048, "state": "cached"}])
        {
            break;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the model never showed as warm: {snapshot}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let file = world.dir.path().join("warm.yaml");
    std::fs::write(&file, doc("Qwen/Qwen3-0.6B", 0))?;
    let out = world.cli(&["plan", file.to_str().unwrap()]).await?;
    assert!(String::from_utf8_lossy(&out.stdout).contains("w1 holds Qwen/Qwen3-0.6B warm"), "{}", output_text(&out));
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn the_router_prewarms_a_model_on_an_idle_worker_while_the_upstream_stage_runs() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    world.worker(worker_config(&world, "cpu-1", None)).await?;
    world.worker(prewarming_worker(&world, "infer-1", 512)?).await?;
    world
        .wait_for("both workers to join", |events| {
            events.iter().filter(|e| matches!(e.body, EventBody::WorkerJoined(_))).count() == 2
        })
        .await?;
    let doc = "apiVersion: flowmesh/v1\nkind: Workflow\nmetadata:\n  name: ahead\n  annotations: {schedule_hint: {selected_worker: {selected: {prep: cpu-1}}}}\nspec:\n  stages:\n    - {name: prep, spec: {taskType: python, command: 'sleep 2'}}\n    - name: answer\n      spec: {taskType: inference, model: {source: {type: huggingface, identifier: Qwen/Qwen3-0.6B}}, data: {type: list, items: [hi]}}\n";
    let wf = world.submit(doc.as_bytes(), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}", tests::kinds(&events));
    let all = world.events();
    let hint = all.iter().position(|e| {
        matches!(&e.body, EventBody::WorkerPrewarmRequested(p) if p.worker_id == "infer-1" && p.model == "Qwen/Qwen3-0.6B")
    });
    let prep_done = all.iter().position(|e| matches!(&e.body, EventBody::TaskCompleted(c) if c.task.stage == "prep"));
    assert!(hint.is_some() && hint < prep_done, "the hint came while prep ran: {:?}", tests::kinds(&all));
    let answer = all
        .iter()
        .find_map(|e| match &e.body {
            EventBody::TaskDispatched(d) if d.task.stage == "answer" => Some((d.worker_id.clone(), d.message.clone())),
            _ => None,
        })
        .expect("answer dispatched");
    assert_eq!(answer.0, "infer-1", "{}", answer.1);
    assert!(answer.1.contains("infer-1 holds Qwen/Qwen3-0.6B warm"), "the prewarmed model made it warm: {}", answer.1);
    world.shutdown().await;
    Ok(())
}
