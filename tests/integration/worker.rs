//! Workers: what they advertise, and that no crash, stop or outage loses or repeats work.

use flowmesh_domain::EventBody;
use flowmesh_domain::event::FailureReason;
use flowmesh_domain::fleet::{Hardware, WorkerSnapshot};
use futures_util::StreamExt;
use tests::{World, kinds, worker_config};

async fn snapshot(world: &World, id: &str) -> anyhow::Result<WorkerSnapshot> {
    snapshot_where(world, id, |_| true).await
}

/// `id`'s snapshot once one in the bucket satisfies `wanted`.
async fn snapshot_where(
    world: &World,
    id: &str,
    wanted: impl Fn(&WorkerSnapshot) -> bool,
) -> anyhow::Result<WorkerSnapshot> {
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    let mut last = None;
    loop {
        if let Some(bytes) = world.handles.workers.get(id).await? {
            let snapshot: WorkerSnapshot = serde_json::from_slice(&bytes)?;
            if wanted(&snapshot) {
                return Ok(snapshot);
            }
            last = Some(snapshot);
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "no snapshot for {id} as wanted; the last: {last:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn only_constructible_plugins_are_advertised_and_the_router_respects_it() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    let plugins = world.dir.path().join("plugins.toml");
    std::fs::write(
        &plugins,
        r#"
[[executor]]
name = "trl"
task_types = ["sft"]
probe = ["true"]
command = ["/bin/sh", "-c", "echo '{}' > \"$FLOWMESH_RESULT_FILE\""]

[[executor]]
name = "broken"
task_types = ["ppo"]
probe = ["false"]
command = ["/bin/true"]

[[executor]]
name = "vllm"
task_types = ["dpo"]
requires_gpu = true
command = ["/bin/true"]
"#,
    )?;
    let mut config =
        worker_config(&world, "cpu-1", Some(Hardware { cpu_cores: 4, memory_bytes: 8 << 30, ..Default::default() }));
    config.executors_file = Some(plugins);
    world.worker(config).await?;
    let snap = snapshot(&world, "cpu-1").await?;
    assert!(snap.supported_task_types.contains(&"sft".to_owned()), "{:?}", snap.supported_task_types);
    assert!(!snap.supported_task_types.contains(&"ppo".to_owned()), "a plugin whose probe fails is not advertised");
    assert!(
        !snap.supported_task_types.contains(&"dpo".to_owned()),
        "a GPU-only plugin on a CPU worker is not advertised"
    );
    assert!(snap.simulated);
    let problems = flowmesh_domain::schema::check_worker(&serde_json::to_value(&snap)?);
    assert!(problems.is_empty(), "the snapshot matches schemas/worker.schema.json: {problems:?}");

    let wf =
        world.submit(b"apiVersion: flowmesh/v1\nkind: DPO\nmetadata: {name: d}\nspec: {taskType: dpo}\n", None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert!(!kinds(&events).contains(&"task.dispatched"), "never sent to a worker that cannot run it");
    assert!(tests::failed_for(&events, FailureReason::NoEligibleWorker), "{:?}", kinds(&events));
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_worker_killed_after_finishing_but_before_reporting_reports_once_and_never_reruns() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    let results = world.dir.path().join("w1-results");
    let counter = world.dir.path().join("runs.txt");
    let env = |failpoint: bool| {
        let mut env = vec![
            ("WORKER_ID", "w1".to_owned()),
            ("RESULTS_DIR", results.display().to_string()),
            ("HEARTBEAT_INTERVAL_SEC", "1".to_owned()),
            ("WORKER_TTL_SEC", "60".to_owned()),
            ("WORKER_ACK_WAIT_SEC", "2".to_owned()),
        ];
        if failpoint {
            env.push(("FLOWMESH_FAILPOINT", "after-journal-finish".to_owned()));
        }
        env
    };
    let as_refs = |env: &[(&'static str, String)]| env.iter().map(|(k, v)| (*k, v.clone())).collect::<Vec<_>>();
    let first = as_refs(&env(true));
    world.process("w1", &["worker"], &first.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>())?;
    let doc = format!(
        "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {{name: once}}\nspec:\n  taskType: python\n  command: 'echo run >> {}; echo done'\n",
        counter.display()
    );
    let wf = world.submit(doc.as_bytes(), None).await?;
    let status = world.wait_exit("w1").await?;
    assert!(!status.success(), "the failpoint killed the worker: {status:?}\n{}", world.process_log("w1"));
    assert!(!kinds(&world.events()).contains(&"task.completed"), "it died before reporting");
    assert_eq!(std::fs::read_to_string(&counter)?.lines().count(), 1);

    let second = as_refs(&env(false));
    world.process("w1-again", &["worker"], &second.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>())?;
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}", kinds(&events));
    // The old dispatch (its order inside) is redelivered once its ack wait passes; the journal
    // answers it.
    let log = world.handles.js.get_stream("FLOWMESH_EVENTS").await?;
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    loop {
        let info = log.consumer_info("worker-w1").await?;
        if info.num_ack_pending == 0 && info.num_pending == 0 {
            break;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "work order never acked: {info:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(std::fs::read_to_string(&counter)?.lines().count(), 1, "the finished task was not run again");
    let terminal = world.events().iter().filter(|e| e.body.is_task_terminal()).count();
    assert_eq!(terminal, 1, "reported exactly once");
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_worker_killed_in_the_middle_of_a_group_commit_loses_nothing_and_reruns_nothing_it_reported()
-> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    let (runs, gate) = (world.dir.path().join("runs"), world.dir.path().join("gate"));
    std::fs::create_dir_all(&runs)?;
    let results = world.dir.path().join("w1-results").display().to_string();
    let env = [
        ("WORKER_ID", "w1"),
        ("RESULTS_DIR", results.as_str()),
        ("HEARTBEAT_INTERVAL_SEC", "1"),
        ("WORKER_TTL_SEC", "60"),
        ("WORKER_ACK_WAIT_SEC", "2"),
        ("WORKER_BATCH_SLOTS", "8"),
    ];
    world.process("w1", &["worker"], &[&env[..], &[("FLOWMESH_FAILPOINT", "mid-group-commit")]].concat())?;
    let doc = |name: &str, wait: &str| {
        format!(
            "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {{name: {name}}}\nspec:\n  taskType: python\n  \
             command: 'echo run >> {}/{name}; {wait} echo done'\n",
            runs.display()
        )
    };
    // One task alone: its report is flushed on its own and stored before the batch.
    let alone = world.submit(doc("alone", "").as_bytes(), None).await?;
    world.wait_workflow_end(&alone).await?;
    // Eight tasks held at a gate end together: their reports are written while a flush runs.
    let wait = format!("while [ ! -e {} ]; do sleep 0.002; done;", gate.display());
    let mut workflows = vec![alone];
    for i in 0..8 {
        workflows.push(world.submit(doc(&format!("t{i}"), &wait).as_bytes(), None).await?);
    }
    // Each workflow's one task writes its runs to a file named after the workflow.
    let names: std::collections::HashMap<String, String> = workflows
        .iter()
        .enumerate()
        .map(|(i, wf)| (wf.clone(), if i == 0 { "alone".to_owned() } else { format!("t{}", i - 1) }))
        .collect();
    let name = |e: &flowmesh_domain::Event| names.get(e.body.scope().0).cloned().unwrap_or_default();
    world
        .wait_for("eight tasks running", |events| {
            events.iter().filter(|e| matches!(e.body, EventBody::TaskStarted(_)) && name(e).starts_with('t')).count()
                == 8
        })
        .await?;
    std::fs::write(&gate, b"")?;
    let status = world.wait_exit("w1").await?;
    assert!(!status.success(), "the failpoint killed the worker: {status:?}\n{}", world.process_log("w1"));

    let runs_of = |name: &str| std::fs::read_to_string(runs.join(name)).map(|s| s.lines().count()).unwrap_or(0);
    let reported_before: Vec<String> = world.events().iter().filter(|e| e.body.is_task_terminal()).map(name).collect();
    assert!(reported_before.contains(&"alone".to_owned()), "{reported_before:?}");
    let runs_before: Vec<(String, usize)> = reported_before.iter().map(|s| (s.clone(), runs_of(s))).collect();

    world.process("w1-again", &["worker"], &env)?;
    for wf in &workflows {
        let events = world.wait_workflow_end(wf).await?;
        assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{wf}: {:?}", kinds(&events));
    }
    let events = world.events();
    for task in names.values() {
        let ends = events.iter().filter(|e| e.body.is_task_terminal() && name(e) == *task).count();
        assert_eq!(ends, 1, "{task} has exactly one terminal event");
        assert!((1..=2).contains(&runs_of(task)), "{task} ran {} times", runs_of(task));
    }
    for (task, before) in runs_before {
        assert_eq!(runs_of(&task), before, "{task} was reported before the kill and never ran again");
    }
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn sigterm_drains_in_flight_work_then_leaves_the_fleet() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    world.worker_process("w1", &[])?;
    let doc = "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {name: drain}\nspec:\n  taskType: python\n  command: 'sleep 2; echo finished'\n";
    let wf = world.submit(doc.as_bytes(), None).await?;
    world.wait_for("the task to start", |events| kinds(events).contains(&"task.started")).await?;
    world.terminate("w1")?;
    let status = world.wait_exit("w1").await?;
    assert!(status.success(), "{status:?}\n{}", world.process_log("w1"));
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(
        events.last().unwrap().body.kind(),
        "workflow.completed",
        "the in-flight task finished: {:?}",
        kinds(&events)
    );
    world
        .wait_for("w1 to leave", |events| {
            events.iter().any(
                |e| matches!(&e.body, EventBody::WorkerLost(l) if l.worker_id == "w1" && l.reason == "left the fleet"),
            )
        })
        .await?;
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
#[ignore = "long suite: ./tools/test.sh --long"]
async fn a_nats_server_restart_mid_task_loses_nothing() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let doc = "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {name: outage}\nspec:\n  taskType: python\n  command: 'sleep 3; echo survived'\n";
    let wf = world.submit(doc.as_bytes(), None).await?;
    world.wait_for("the task to start", |events| kinds(events).contains(&"task.started")).await?;
    world.server.restart(None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}", kinds(&events));
    let completed = events.iter().find_map(|e| match &e.body {
        EventBody::TaskCompleted(c) => c.result.clone(),
        _ => None,
    });
    assert!(completed.unwrap()["stdout"].as_str().unwrap().contains("survived"));
    assert_eq!(events.iter().filter(|e| e.body.is_task_terminal()).count(), 1);
    world.shutdown().await;
    Ok(())
}

/// An outage longer than the workers' TTL is the server's, not the workers': after the router
/// regains contact it gives every worker a TTL to be heard again before judging it, so nothing
/// is declared lost and nothing runs twice.
#[tokio::test]
#[ignore = "long suite: ./tools/test.sh --long"]
async fn a_nats_outage_longer_than_the_ttl_loses_no_worker_and_reruns_nothing() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let doc = "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {name: outage}\nspec:\n  taskType: python\n  command: 'sleep 10; echo survived'\n";
    let wf = world.submit(doc.as_bytes(), None).await?;
    world.wait_for("the task to start", |events| kinds(events).contains(&"task.started")).await?;
    // The outage itself is the scenario: twice the worker's 4 s TTL.
    world.server.restart_after(None, std::time::Duration::from_secs(8)).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}", kinds(&events));
    let all = world.events();
    assert!(!kinds(&all).contains(&"worker.lost"), "{:?}", kinds(&all));
    assert!(!kinds(&events).contains(&"task.requeued"), "{:?}", kinds(&events));
    assert_eq!(events.iter().filter(|e| e.body.kind() == "task.started").count(), 1, "{:?}", kinds(&events));
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_python_stage_reads_its_upstream_inputs() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let wf = world.submit(&tests::example("valid/python.yaml"), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}\n{events:#?}", kinds(&events));
    let result = events.iter().find_map(|e| match &e.body {
        EventBody::TaskCompleted(c) if c.task.stage == "count" => c.result.clone(),
        _ => None,
    });
    assert_eq!(result.unwrap()["output"], serde_json::json!({"lines": 2, "metrics": {"total_words": 15}}));
    world.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_draining_worker_hands_back_what_outlives_its_grace_and_another_worker_finishes_it() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    world.worker_process("w1", &[("WORKER_DRAIN_GRACE_SEC", "1")])?;
    let doc = "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {name: long}\nspec:\n  taskType: python\n  command: 'if [ \"$FLOWMESH_ATTEMPT\" = 1 ]; then sleep 60; fi; echo finished'\n";
    let wf = world.submit(doc.as_bytes(), None).await?;
    world
        .wait_for("the task to start on w1", |events| {
            events.iter().any(|e| matches!(&e.body, EventBody::TaskStarted(s) if s.worker_id == "w1"))
        })
        .await?;
    world.terminate("w1")?;
    let status = world.wait_exit("w1").await?;
    assert!(status.success(), "a clean exit after the hand-back: {status:?}\n{}", world.process_log("w1"));
    world.worker(worker_config(&world, "w2", None)).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}", kinds(&events));
    assert!(
        events.iter().any(
            |e| matches!(&e.body, EventBody::TaskFailed(f) if f.reason == FailureReason::HandedBack && f.retryable)
        )
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.body, EventBody::TaskCompleted(c) if c.worker_id == "w2" && c.task.attempt == 2))
    );
    assert!(!kinds(&events).contains(&"task.cancelled"), "a hand-back is not a cancellation");
    world.shutdown().await;
    Ok(())
}

/// A worker asked to drain while NATS is unreachable stops within its grace periods instead of
/// retrying its reports forever; its journal keeps what it could not report.
#[tokio::test]
#[ignore = "long suite: ./tools/test.sh --long"]
async fn a_worker_draining_during_a_nats_outage_stops_within_its_grace() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    world.worker_process("w1", &[("WORKER_DRAIN_GRACE_SEC", "1")])?;
    // The first run of the task outlives the drain; any later run finishes at once.
    let marker = world.dir.path().join("ran-once");
    let doc = format!(
        "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {{name: long}}\nspec:\n  taskType: python\n  command: 'if [ ! -f {m} ]; then touch {m}; sleep 60; fi; echo finished'\n",
        m = marker.display()
    );
    world.submit(doc.as_bytes(), None).await?;
    world
        .wait_for("the task to start on w1", |events| {
            events.iter().any(|e| matches!(&e.body, EventBody::TaskStarted(s) if s.worker_id == "w1"))
        })
        .await?;
    world.server.stop().await;
    world.terminate("w1")?;
    let status = world.wait_exit("w1").await.map_err(|e| anyhow::anyhow!("{e}\n{}", world.process_log("w1")))?;
    assert!(status.success(), "a bounded drain with NATS down: {status:?}\n{}", world.process_log("w1"));
    assert!(world.process_log("w1").contains("the journal keeps them"), "{}", world.process_log("w1"));

    world.shutdown().await;
    Ok(())
}

/// The worker's durable consumer follows its settings: restarted with more slots and another ack
/// wait, it may hold that many tasks at once (the old limit would cap it silently).
#[tokio::test]
async fn a_worker_restarted_with_other_slots_gets_them() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    // Polls both consumers `worker-w1` (dispatches in the log, orders with secrets) until their
    // (max_ack_pending, ack_wait) are `want`.
    let wait_limits = async |world: &World, want: (i64, u64), log: &str| -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + tests::DEADLINE;
        let log_stream = world.handles.js.get_stream("FLOWMESH_EVENTS").await?;
        let work_stream = world.handles.js.get_stream("FLOWMESH_WORK").await?;
        loop {
            let mut found = Vec::new();
            for stream in [&log_stream, &work_stream] {
                found.push(match stream.consumer_info("worker-w1").await {
                    Ok(info) => Some((info.config.max_ack_pending, info.config.ack_wait.as_secs())),
                    Err(_) => None,
                });
            }
            if found.iter().all(|f| *f == Some(want)) {
                return Ok(());
            }
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "consumer limits {found:?}, want {want:?}\n{log}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    world.worker_process("w1", &[("WORKER_BATCH_SLOTS", "1"), ("WORKER_ACK_WAIT_SEC", "30")])?;
    // 1 batch slot + 1 service slot + the default queue.
    let queue = i64::from(flowmesh_worker::config::DEFAULT_PREFETCH);
    wait_limits(&world, (2 + queue, 30), "first start").await?;
    world.terminate("w1")?;
    assert!(world.wait_exit("w1").await?.success(), "{}", world.process_log("w1"));

    world.worker_process(
        "w1-again",
        &[("WORKER_ID", "w1"), ("WORKER_BATCH_SLOTS", "6"), ("WORKER_PREFETCH", "1"), ("WORKER_ACK_WAIT_SEC", "90")],
    )?;
    wait_limits(&world, (8, 90), "second start").await?;
    world.shutdown().await;
    Ok(())
}

/// FlowMesh's python convention without `inputs`: every upstream stage is mounted, a parameter
/// named after a stage gets its output, and `$FLOWMESH_PY_INPUTS` names the folders.
const PYTHON_TWO_STAGES: &str = r#"
apiVersion: flowmesh/v1
kind: Workflow
metadata: {name: python-upstream}
spec:
  taskType: python
  stages:
    - name: first
      spec:
        code: |
          def main():
              return {"words": 3}
    - name: second
      dependsOn: [first]
      spec:
        code: |
          import json, os
          def main(first, inputs):
              folders = json.loads(os.environ["FLOWMESH_PY_INPUTS"])
              with open(os.path.join(inputs["first"], "results.json")) as fh:
                  stored = json.load(fh)
              return {"got": first["words"], "stored": stored["output"]["words"],
                      "named": folders["first"].endswith("inputs/first")}
"#;

#[tokio::test]
async fn a_python_stage_without_inputs_reads_its_upstream_stage_by_name() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let wf = world.submit(PYTHON_TWO_STAGES.as_bytes(), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{events:#?}");
    let result = events.iter().find_map(|e| match &e.body {
        EventBody::TaskCompleted(c) if c.task.stage == "second" => c.result.clone(),
        _ => None,
    });
    assert_eq!(result.unwrap()["output"], serde_json::json!({"got": 3, "stored": 3, "named": true}));
    world.shutdown().await;
    Ok(())
}

/// Two documents: a python task that runs until `release` exists, and one that ends at once.
fn held_and_quick(release: &std::path::Path) -> (String, &'static str) {
    let held = format!(
        "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {{name: long}}\nspec:\n  taskType: python\n  command: 'while [ ! -f {} ]; do sleep 0.05; done; echo done'\n",
        release.display()
    );
    // One attempt only: an order handed back unrun must not spend it.
    let quick = "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {name: quick}\nspec:\n  taskType: python\n  maxAttempts: 1\n  command: 'echo quick'\n";
    (held, quick)
}

/// Submits the held task of `held_and_quick` (it runs until `release` exists) and waits until
/// it started; returns its workflow and the quick document.
async fn start_held(world: &World, release: &std::path::Path) -> anyhow::Result<(String, &'static str)> {
    let (held, quick) = held_and_quick(release);
    let workflow = world.submit(held.as_bytes(), None).await?;
    world.wait_started(&workflow).await?;
    Ok((workflow, quick))
}

/// Whether `events` hold a dispatch of workflow `wf`'s task to w1.
fn dispatched_to_w1(events: &[flowmesh_domain::Event], wf: &str) -> bool {
    events
        .iter()
        .any(|e| matches!(&e.body, EventBody::TaskDispatched(d) if d.task.workflow_id == wf && d.worker_id == "w1"))
}

/// Submits `document` and waits until its order is dispatched to w1, whose slot is busy: into
/// its queue. Returns its workflow.
async fn queued_on_w1(world: &World, document: &str) -> anyhow::Result<String> {
    let queued = world.submit(document.as_bytes(), None).await?;
    world.wait_for("an order to reach w1's queue", |events| dispatched_to_w1(events, &queued)).await?;
    Ok(queued)
}

/// A world with the control plane and w1, a worker of one slot and a queue of one.
async fn w1_with_one_queue_place() -> anyhow::Result<World> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    let mut config = worker_config(&world, "w1", None);
    (config.batch_slots, config.prefetch) = (1, 1);
    world.worker(config).await?;
    Ok(world)
}

/// When `task`'s run began on its worker: its `task.started`, or the `started_at` its completion
/// carries when it ended too fast to report a start.
fn run_began(events: &[flowmesh_domain::Event], task: &str) -> Option<String> {
    events.iter().find_map(|e| match &e.body {
        EventBody::TaskStarted(s) if s.task.task_id == task => Some(e.time.clone()),
        EventBody::TaskCompleted(c) if c.task.task_id == task => c.started_at.clone(),
        _ => None,
    })
}

/// Each attempt's end in `events`: (attempt, worker, `completed` or the failure's reason).
fn attempt_ends(events: &[flowmesh_domain::Event]) -> Vec<(u32, String, String)> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::TaskFailed(f) => Some((f.task.attempt, f.worker_id.clone()?, f.reason.to_string())),
            EventBody::TaskCompleted(c) => Some((c.task.attempt, c.worker_id.clone(), "completed".to_owned())),
            _ => None,
        })
        .collect()
}

/// Waits for workflow `queued` to complete, its order given back unrun by w1 and run by w2 on an
/// attempt that counts as its first (the task allows one).
async fn given_back_by_w1_then_run_on_w2(world: &World, queued: &str) -> anyhow::Result<()> {
    let events = world.wait_workflow_end(queued).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}", kinds(&events));
    let expected =
        [(1, "w1".to_owned(), FailureReason::Released.to_string()), (2, "w2".to_owned(), "completed".to_owned())];
    assert_eq!(attempt_ends(&events), expected, "{:?}", kinds(&events));
    Ok(())
}

/// Asserts that workflow `held` (a task of `held_and_quick` on `worker`) has not ended, then lets
/// it end and waits for it to complete.
async fn still_running_then_released(
    world: &World,
    held: &str,
    worker: &str,
    release: &std::path::Path,
) -> anyhow::Result<()> {
    let ended =
        world.events().iter().any(|e| matches!(&e.body, EventBody::TaskCompleted(c) if c.task.workflow_id == held));
    assert!(!ended, "{worker}'s task still runs");
    std::fs::write(release, b"")?;
    let events = world.wait_workflow_end(held).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}", kinds(&events));
    Ok(())
}

/// A worker offers the queue its slots can turn over within 100 ms (`queue::QueueDepth`): two
/// places before it has run anything, all it may hold (`WORKER_PREFETCH`) once its runs are
/// quick, none once a run holds its slot for a second, and the router then queues nothing on it.
/// Its snapshot says so at once, not at the next heartbeat.
#[tokio::test]
async fn a_worker_offers_a_queue_as_deep_as_its_runs_are_quick() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    let mut config = worker_config(&world, "w1", None);
    (config.batch_slots, config.prefetch) = (1, 4);
    // Heartbeats slower than any wait here: each offer below is published when it changes.
    (config.heartbeat_interval, config.ttl) = (std::time::Duration::from_secs(60), std::time::Duration::from_secs(240));
    world.worker(config).await?;
    assert_eq!(snapshot(&world, "w1").await?.prefetch, 2, "nothing measured yet");

    let quick = "apiVersion: flowmesh/v1\nkind: EchoTask\nmetadata: {name: quick}\nspec:\n  taskType: echo\n  data: {type: list, items: [a]}\n";
    let workflow = world.submit(quick.as_bytes(), None).await?;
    world.wait_workflow_end(&workflow).await?;
    snapshot_where(&world, "w1", |s| s.prefetch == 4).await?;

    let long = "apiVersion: flowmesh/v1\nkind: Python\nmetadata: {name: long}\nspec:\n  taskType: python\n  command: 'sleep 1'\n";
    let workflow = world.submit(long.as_bytes(), None).await?;
    world.wait_workflow_end(&workflow).await?;
    snapshot_where(&world, "w1", |s| s.prefetch == 0).await?;
    let out = world.cli(&["worker", "list"]).await?;
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.contains("0/1") && !listed.contains("queue"), "{}", tests::output_text(&out));

    // With the slot busy, a next order waits in the router (which says why on the hints
    // subject), not in w1's queue.
    let release = world.dir.path().join("release");
    let (held, quick) = start_held(&world, &release).await?;
    let mut hints = world.client.subscribe(format!("{}.>", flowmesh_nats::subjects::HINTS_PREFIX)).await?;
    let waiting = world.submit(quick.as_bytes(), None).await?;
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    loop {
        let hint = tokio::time::timeout_at(deadline, hints.next()).await?.expect("a hint");
        let hint: flowmesh_domain::Event = serde_json::from_slice(&hint.payload)?;
        if matches!(&hint.body, EventBody::TaskPending(p) if p.task.workflow_id == waiting && p.reason == "busy") {
            break;
        }
    }
    assert!(!dispatched_to_w1(&world.events(), &waiting), "queued on a worker that offers no queue");
    std::fs::write(&release, b"")?;
    for workflow in [held, waiting] {
        let events = world.wait_workflow_end(&workflow).await?;
        assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}", kinds(&events));
    }
    world.shutdown().await;
    Ok(())
}

/// A worker with one slot and a queue of one (`WORKER_PREFETCH=1`) takes its next order while a
/// task runs, never runs the two at once, starts the queued one once the slot frees, and a
/// queued task can be cancelled before it runs.
#[tokio::test]
async fn a_prefetching_worker_queues_its_next_order_and_runs_it_when_its_slot_frees() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    let mut config = worker_config(&world, "w1", None);
    (config.batch_slots, config.prefetch) = (1, 1);
    // Short, so that the queued order outlives it below.
    config.ack_wait = std::time::Duration::from_secs(2);
    let ack_wait = config.ack_wait;
    world.worker(config).await?;
    assert_eq!(snapshot(&world, "w1").await?.prefetch, 1, "the snapshot advertises the queue");
    let out = world.cli(&["worker", "list"]).await?;
    assert!(String::from_utf8_lossy(&out.stdout).contains("0/1, queue 0/1"), "{}", tests::output_text(&out));
    // The first task runs until the test lets it end.
    let release = world.dir.path().join("release");
    let (first, quick) = start_held(&world, &release).await?;

    // Queued behind the running task, then cancelled before it ever runs.
    let cancelled = queued_on_w1(&world, quick).await?;
    let out = world.cli(&["workflow", "cancel", &cancelled]).await?;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    let events = world.wait_workflow_end(&cancelled).await?;
    let reason = events.iter().find_map(|e| match &e.body {
        EventBody::TaskCancelled(c) if c.worker_id.as_deref() == Some("w1") => Some(c.reason.clone()),
        _ => None,
    });
    assert_eq!(reason.as_deref(), Some("cancelled while waiting for a slot, before it ran"), "{:?}", kinds(&events));
    assert_eq!(run_began(&events, &format!("{cancelled}-main")), None, "a cancelled queued task never ran");

    // Queued again; it runs only once the first has ended.
    let queued = queued_on_w1(&world, quick).await?;
    // It waits longer than two ack waits (time passing is the scenario here, not a stand-in for
    // an event): progress acks keep the server from delivering it again meanwhile.
    tokio::time::sleep(ack_wait * 5 / 2).await;
    let consumer = world.handles.js.get_stream("FLOWMESH_EVENTS").await?.consumer_info("worker-w1").await?;
    assert_eq!(consumer.num_redelivered, 0, "{consumer:#?}");
    // Its snapshot (sent every 500 ms) says the queue is taken, and `plan` counts it so: a next
    // task would wait, where the running slot alone would leave it a queue place.
    assert_eq!(snapshot(&world, "w1").await?.queued, 1);
    let out = world.cli(&["worker", "list"]).await?;
    assert!(String::from_utf8_lossy(&out.stdout).contains("1/1, queue 1/1"), "{}", tests::output_text(&out));
    let file = world.dir.path().join("quick.yaml");
    std::fs::write(&file, quick)?;
    let out = world.cli(&["plan", file.to_str().unwrap()]).await?;
    assert_eq!(out.status.code(), Some(1), "nothing can take it now: {}", tests::output_text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no free batch slot"), "{}", tests::output_text(&out));
    std::fs::write(&release, b"")?;
    let events = world.wait_workflow_end(&queued).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}", kinds(&events));
    let events = world.wait_workflow_end(&first).await?;
    let first_end = events.iter().find_map(|e| match &e.body {
        EventBody::TaskCompleted(c) if c.task.workflow_id == first => Some(e.time.clone()),
        _ => None,
    });
    let all = world.events();
    let began = run_began(&all, &format!("{queued}-main"));
    assert!(
        first_end.is_some() && began >= first_end,
        "the queued task began at {began:?}, before the running one ended at {first_end:?}"
    );
    world.shutdown().await;
    Ok(())
}

/// An order waiting in a busy worker's queue does not wait for that worker when a slot that can
/// run it is free elsewhere: the router asks for it back, the worker gives it back unrun (its
/// only attempt not spent), and the other worker runs it while the first task still runs.
#[tokio::test]
async fn a_queued_order_moves_to_a_worker_with_a_free_slot() -> anyhow::Result<()> {
    let mut world = w1_with_one_queue_place().await?;
    let release = world.dir.path().join("release");
    let (running, quick) = start_held(&world, &release).await?;
    let queued = queued_on_w1(&world, quick).await?;

    // A worker with a free slot joins while w1's task still runs.
    world.worker(worker_config(&world, "w2", None)).await?;
    given_back_by_w1_then_run_on_w2(&world, &queued).await?;
    still_running_then_released(&world, &running, "w1", &release).await?;
    world.shutdown().await;
    Ok(())
}

/// With every slot busy, an order that has waited its patience in one worker's queue while
/// another worker could run it is given back, waits in the router (not in the queue place it
/// left), and runs on the first slot to free, here the other worker's, while the task ahead of
/// it in its first queue still runs.
#[tokio::test]
async fn a_queued_order_past_its_patience_takes_the_first_slot_to_free() -> anyhow::Result<()> {
    let mut world = w1_with_one_queue_place().await?;
    let (release_1, release_2) = (world.dir.path().join("release-1"), world.dir.path().join("release-2"));
    let (on_w1, quick) = start_held(&world, &release_1).await?;
    let mut config = worker_config(&world, "w2", None);
    (config.batch_slots, config.prefetch) = (1, 0);
    world.worker(config).await?;
    start_held(&world, &release_2).await?;
    let queued = world.submit(quick.as_bytes(), None).await?;

    let given_back = world
        .wait_for("the queued order to be given back after its patience", |events| {
            events.iter().any(|e| {
                matches!(&e.body, EventBody::TaskFailed(f)
                    if f.task.workflow_id == queued && f.reason == FailureReason::Released && f.worker_id.as_deref() == Some("w1"))
            })
        })
        .await?;
    let dispatches: Vec<(u32, String)> = given_back
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::TaskDispatched(d) if d.task.workflow_id == queued => Some((d.task.attempt, d.worker_id.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(dispatches, [(1, "w1".to_owned())], "queued on w1 first");
    // w2's task ends first: the given-back task takes its slot, while w1's task still runs.
    std::fs::write(&release_2, b"")?;
    given_back_by_w1_then_run_on_w2(&world, &queued).await?;
    still_running_then_released(&world, &on_w1, "w1", &release_1).await?;
    world.shutdown().await;
    Ok(())
}

/// A stopping worker hands back the order waiting in its queue at once, unrun and unacked, while
/// its running task finishes; leaving the fleet requeues the queued task without spending its
/// only attempt, and another worker runs it.
#[tokio::test]
async fn a_stopping_worker_hands_back_its_queued_order_unrun_and_another_worker_runs_it() -> anyhow::Result<()> {
    stopping_worker_hands_back_its_queue(false).await
}

/// As above, with the router down while the worker leaves: the router started afterwards reads
/// from the bucket that the worker left cleanly, so the queued task still keeps its attempt.
#[tokio::test]
async fn a_router_started_after_a_worker_left_cleanly_requeues_its_queued_order_unrun() -> anyhow::Result<()> {
    stopping_worker_hands_back_its_queue(true).await
}

async fn stopping_worker_hands_back_its_queue(router_down_meanwhile: bool) -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.control_plane().await?;
    world.worker_process(
        "w1",
        &[("WORKER_BATCH_SLOTS", "1"), ("WORKER_PREFETCH", "1"), ("WORKER_DRAIN_GRACE_SEC", "60")],
    )?;
    let release = world.dir.path().join("release");
    let (running, quick) = start_held(&world, &release).await?;
    let queued = queued_on_w1(&world, quick).await?;

    if router_down_meanwhile {
        world.stop("router").await?;
    }
    // The running task is let go only once w1 says it drains, so its slot cannot free first.
    world.terminate("w1")?;
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    while snapshot(&world, "w1").await?.status != flowmesh_domain::fleet::WorkerStatus::Draining {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "w1 never said it drains");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    std::fs::write(&release, b"")?;
    let status = world.wait_exit("w1").await?;
    assert!(status.success(), "{status:?}\n{}", world.process_log("w1"));
    world.worker(worker_config(&world, "w2", None)).await?;
    if router_down_meanwhile {
        world.router("router").await?;
    }

    let events = world.wait_workflow_end(&queued).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed", "{:?}", kinds(&events));
    let by = |worker: &str| {
        events.iter().any(|e| match &e.body {
            EventBody::TaskStarted(s) => s.worker_id == worker,
            EventBody::TaskCompleted(c) => c.worker_id == worker,
            _ => false,
        })
    };
    assert!(!by("w1") && by("w2"), "the queued task ran on w2 only: {events:#?}");
    assert!(
        events.iter().any(|e| matches!(&e.body, EventBody::TaskRequeued(r)
            if r.worker_id.as_deref() == Some("w1") && r.reason == flowmesh_domain::state::REQUEUED_UNRUN)),
        "requeued unrun when w1 left, its only attempt not spent: {:?}",
        kinds(&events)
    );
    let events = world.wait_workflow_end(&running).await?;
    assert!(
        events.iter().any(|e| matches!(&e.body, EventBody::TaskCompleted(c) if c.worker_id == "w1")),
        "the running task finished on w1 within its grace: {:?}",
        kinds(&events)
    );
    // Nothing is left on w1, which left for good: the router forgets it and remembers w2 alone.
    let router = world
        .status_when("router", |s| s["caught_up"] == true && s["live_workers"] == 1 && s["known_workers"] == 1)
        .await?;
    assert_eq!((&router["known_workers"], &router["live_workers"]), (&1.into(), &1.into()), "{router}");
    world.shutdown().await;
    Ok(())
}
