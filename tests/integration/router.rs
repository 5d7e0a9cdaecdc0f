//! The router against a real server: capability-gated placement, explanations, placeholders,
//! conditions, worker loss, router crashes and hand-over.

use flowmesh_domain::EventBody;
use flowmesh_domain::event::FailureReason;
use flowmesh_domain::fleet::{Gpu, Hardware};
use tests::{World, example, kinds, worker_config};

const GIB: u64 = 1 << 30;

fn cpu_hw() -> Hardware {
    Hardware { cpu_cores: 8, memory_bytes: 32 * GIB, ..Default::default() }
}

fn gpu_hw() -> Hardware {
    Hardware {
        cpu_cores: 32,
        memory_bytes: 256 * GIB,
        gpus: vec![Gpu {
            index: 0,
            uuid: "GPU-sim-0".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_bytes: 80 * GIB,
        }],
        ..Default::default()
    }
}

/// A plugin file serving `ppo` with a shell command that records where it ran.
fn ppo_plugin(world: &World) -> std::path::PathBuf {
    let path = world.dir.path().join("ppo.toml");
    std::fs::write(
        &path,
        r#"[[executor]]
name = "fake-trl"
task_types = ["ppo"]
probe = ["true"]
command = ["/bin/sh", "-c", "printf '{\"ok\": true, \"trained\": \"%s\"}' \"$FLOWMESH_TASK_ID\" > \"$FLOWMESH_RESULT_FILE\""]
"#,
    )
    .unwrap();
    path
}

const PPO_GPU: &str = "apiVersion: flowmesh/v1\nkind: PPO\nmetadata: {name: ppo}\nspec:\n  taskType: ppo\n  resources: {hardware: {gpu: {count: 1, type: H100}}}\n";
const PPO_NO_GPU: &str = "apiVersion: flowmesh/v1\nkind: PPO\nmetadata: {name: ppo}\nspec: {taskType: ppo}\n";

fn stage_status<'a>(events: &'a [flowmesh_domain::Event], kind: &str) -> Vec<&'a flowmesh_domain::Event> {
    events.iter().filter(|e| e.body.kind() == kind).collect()
}

#[tokio::test]
async fn on_a_cpu_fleet_ppo_fails_with_an_explanation_while_echo_completes() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    world.worker(worker_config(&world, "cpu-1", Some(cpu_hw()))).await?;
    world.worker(worker_config(&world, "cpu-2", Some(cpu_hw()))).await?;
    let ppo = world.submit(PPO_NO_GPU.as_bytes(), None).await?;
    let echo = world.submit(&example("valid/echo.yaml"), None).await?;

    let echo_events = world.wait_workflow_end(&echo).await?;
    assert_eq!(echo_events.last().unwrap().body.kind(), "workflow.completed");
    let ppo_events = world.wait_workflow_end(&ppo).await?;
    assert_eq!(ppo_events.last().unwrap().body.kind(), "workflow.failed", "{:?}", kinds(&ppo_events));
    let failed = ppo_events.iter().find_map(|e| match &e.body {
        EventBody::TaskFailed(f) => Some(f.clone()),
        _ => None,
    });
    let failed = failed.expect("task.failed");
    assert_eq!(failed.reason, FailureReason::NoEligibleWorker);
    assert_eq!(failed.message, "0/2 workers can run stage \"main\": 2 do not serve task type \"ppo\"");
    let pending = ppo_events.iter().find_map(|e| match &e.body {
        EventBody::TaskPending(p) if p.explanation.workers == 2 => Some(p.clone()),
        _ => None,
    });
    let pending = pending.expect("a pending event that explains the wait");
    assert_eq!(pending.reason, "no_eligible_worker");
    assert_eq!(pending.explanation.reasons[0].code, "task_type");
    assert!(stage_status(&ppo_events, "task.dispatched").is_empty(), "never dispatched");
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn on_a_mixed_fleet_ppo_runs_on_the_gpu_worker_never_the_idle_cpu_one() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    let plugin = ppo_plugin(&world);
    let mut cpu = worker_config(&world, "cpu-1", Some(cpu_hw()));
    cpu.executors_file = Some(plugin.clone());
    let mut gpu = worker_config(&world, "gpu-1", Some(gpu_hw()));
    gpu.executors_file = Some(plugin);
    world.worker(cpu).await?;
    world.worker(gpu).await?;
    for _ in 0..3 {
        let wf = world.submit(PPO_GPU.as_bytes(), None).await?;
        let events = world.wait_workflow_end(&wf).await?;
        assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}", kinds(&events));
        for e in &events {
            if let EventBody::TaskDispatched(d) = &e.body {
                assert_eq!(d.worker_id, "gpu-1", "{}", d.message);
            }
            if let EventBody::TaskCompleted(c) = &e.body {
                assert_eq!(c.result.as_ref().unwrap()["trained"], serde_json::json!(c.task.task_id));
            }
        }
    }
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn placeholders_and_conditions_flow_through_a_real_run() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let stages = world.submit(&example("valid/echo_stages.yaml"), None).await?;
    let events = world.wait_workflow_end(&stages).await?;
    // echo_stages pins its stages to `cpu-worker-1`, which this fleet lacks: it must explain and fail.
    assert_eq!(events.last().unwrap().body.kind(), "workflow.failed");
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.body, EventBody::TaskFailed(f) if f.message.contains("not in selected_worker")))
    );

    let doc = String::from_utf8(example("valid/echo_stages.yaml"))?
        .replace("selected_worker: cpu-worker-1", "selected_worker: w1");
    let wf = world.submit(doc.as_bytes(), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}", kinds(&events));
    let summary = events.iter().find_map(|e| match &e.body {
        EventBody::TaskCompleted(c) if c.task.stage == "repeat" => c.result.clone(),
        _ => None,
    });
    assert_eq!(summary.unwrap()["items"], serde_json::json!([{"output": "good morning"}, {"output": "good night"}]));

    let cond = world.submit(&example("valid/conditional_echo_graph.yaml"), None).await?;
    let events = world.wait_workflow_end(&cond).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed");
    assert!(events.iter().any(|e| matches!(&e.body, EventBody::TaskSkipped(s) if s.task.stage == "publish")));
    assert!(events.iter().any(|e| matches!(&e.body, EventBody::TaskCompleted(c) if c.task.stage == "report")));
    world.shutdown().await;
    Ok(())
}

/// A python task that sleeps on its first attempt only, so a requeued attempt finishes fast.
const SLOW_FIRST_ATTEMPT: &str = "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {name: slow}\nspec:\n  taskType: python\n  command: 'if [ \"$FLOWMESH_ATTEMPT\" = 1 ]; then sleep 60; fi; echo done'\n";

#[tokio::test]
async fn a_killed_worker_s_task_is_requeued_and_completes_elsewhere_once() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    world.worker(worker_config(&world, "w1", None)).await?;
    let wf = world.submit(SLOW_FIRST_ATTEMPT.as_bytes(), None).await?;
    world
        .wait_for("the task to start on w1", |events| {
            events.iter().any(|e| matches!(&e.body, EventBody::TaskStarted(s) if s.worker_id == "w1"))
        })
        .await?;
    world.kill("w1");
    world.worker(worker_config(&world, "w2", None)).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}", kinds(&events));
    let all = world.events();
    assert!(all.iter().any(|e| matches!(&e.body, EventBody::WorkerLost(l) if l.worker_id == "w1")));
    let requeued: Vec<_> =
        events.iter().filter(|e| matches!(&e.body, EventBody::TaskRequeued(r) if r.reason == "worker_lost")).collect();
    assert_eq!(requeued.len(), 1);
    let terminal: Vec<_> = events.iter().filter(|e| e.body.is_task_terminal()).collect();
    assert_eq!(terminal.len(), 1, "exactly one terminal event: {:?}", kinds(&events));
    assert!(matches!(&terminal[0].body, EventBody::TaskCompleted(c) if c.worker_id == "w2" && c.task.attempt == 2));
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn kill_9_of_the_router_mid_workflow_then_restart_completes_without_duplicates() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.validator("validator", Default::default()).await?;
    world.worker(worker_config(&world, "w1", None)).await?;
    let env = [("ROUTER_LEASE_TTL_SEC", "2"), ("ROUTER_ID", "r1"), ("TASK_NO_WORKER_GRACE_SEC", "10")];
    world.process("router-1", &["router"], &env)?;
    // Three sequential stages, each a short python step, so the crash lands mid-workflow.
    let doc = "apiVersion: flowmesh/v1\nkind: Workflow\nmetadata: {name: chain}\nspec:\n  taskType: python\n  command: 'sleep 1; echo step'\n  stages:\n    - {name: one}\n    - {name: two}\n    - {name: three}\n";
    let wf = world.submit(doc.as_bytes(), None).await?;
    world
        .wait_for("stage one to complete", |events| {
            events.iter().any(|e| matches!(&e.body, EventBody::TaskCompleted(c) if c.task.stage == "one"))
        })
        .await?;
    world.kill9("router-1").await?;
    world.process(
        "router-2",
        &["router"],
        &[("ROUTER_LEASE_TTL_SEC", "2"), ("ROUTER_ID", "r2"), ("TASK_NO_WORKER_GRACE_SEC", "10")],
    )?;
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(
        events.last().unwrap().body.kind(),
        "workflow.completed",
        "{:?}\n{}",
        kinds(&events),
        world.process_log("router-2")
    );
    for stage in ["one", "two", "three"] {
        let done =
            events.iter().filter(|e| matches!(&e.body, EventBody::TaskCompleted(c) if c.task.stage == stage)).count();
        let dispatched =
            events.iter().filter(|e| matches!(&e.body, EventBody::TaskDispatched(d) if d.task.stage == stage)).count();
        assert_eq!((done, dispatched), (1, 1), "stage {stage}: {:?}", kinds(&events));
    }
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn with_two_routers_killing_the_leader_hands_over() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.validator("validator", Default::default()).await?;
    world.worker(worker_config(&world, "w1", None)).await?;
    world.process("router-a", &["router"], &[("ROUTER_LEASE_TTL_SEC", "2"), ("ROUTER_ID", "router-a")])?;
    let first = world.submit(&example("valid/echo.yaml"), None).await?;
    world.wait_workflow_end(&first).await?;
    world.process("router-b", &["router"], &[("ROUTER_LEASE_TTL_SEC", "2"), ("ROUTER_ID", "router-b")])?;
    // router-a holds the lease (it took it first); b stands by.
    let lease = world.handles.control.get("router-leader").await?.expect("a lease");
    assert!(String::from_utf8_lossy(&lease).contains("router-a"));
    world.kill9("router-a").await?;
    let second = world.submit(&example("valid/echo.yaml"), None).await?;
    let events = world.wait_workflow_end(&second).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{}", world.process_log("router-b"));
    let lease = world.handles.control.get("router-leader").await?.expect("a lease");
    assert!(String::from_utf8_lossy(&lease).contains("router-b"));
    assert!(world.process_log("router-b").contains("took the router lease"));
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_router_resumes_from_its_checkpoint_and_replays_only_newer_events() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.validator("validator", Default::default()).await?;
    world.worker(worker_config(&world, "w1", None)).await?;
    let checkpoint = world.dir.path().join("router-checkpoint");
    let env =
        [("ROUTER_LEASE_TTL_SEC", "2"), ("ROUTER_ID", "r1"), ("ROUTER_CHECKPOINT_DIR", checkpoint.to_str().unwrap())];
    world.process("router-1", &["router"], &env)?;
    let first = world.submit(&example("valid/echo.yaml"), None).await?;
    world.wait_workflow_end(&first).await?;
    // A polite stop writes the checkpoint.
    world.terminate("router-1")?;
    assert!(world.wait_exit("router-1").await?.success());
    world.process(
        "router-2",
        &["router"],
        &[("ROUTER_LEASE_TTL_SEC", "2"), ("ROUTER_ID", "r2"), ("ROUTER_CHECKPOINT_DIR", checkpoint.to_str().unwrap())],
    )?;
    let second = world.submit(&example("valid/echo.yaml"), None).await?;
    let events = world.wait_workflow_end(&second).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{}", world.process_log("router-2"));
    assert!(
        world.process_log("router-2").contains("resuming from the router checkpoint"),
        "{}",
        world.process_log("router-2")
    );
    let all = world.events();
    let dispatched =
        all.iter().filter(|e| matches!(&e.body, EventBody::TaskDispatched(d) if d.task.workflow_id == first)).count();
    let ends =
        all.iter().filter(|e| matches!(&e.body, EventBody::WorkflowCompleted(w) if w.workflow_id == first)).count();
    assert_eq!((dispatched, ends), (1, 1), "the first workflow is not touched again");
    world.shutdown().await;
    Ok(())
}
