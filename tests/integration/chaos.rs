//! Everything at once: workflows keep arriving while the router, a worker and the validator are
//! each killed with SIGKILL mid-run and started again. Nothing may be lost or counted twice.

use flowmesh_domain::state::{State, TaskStatus, WorkflowStatus};
use flowmesh_domain::{Event, EventBody};
use std::collections::BTreeMap;
use std::time::Duration;
use tests::{World, kinds};

/// Two python stages that take a moment, so every kill lands on work in flight.
const DOC: &str = "apiVersion: flowmesh/v1\nkind: Workflow\nmetadata: {name: chaos}\nspec:\n  taskType: python\n  command: 'sleep 0.3; echo ok'\n  stages:\n    - {name: first}\n    - {name: second}\n";

/// The events `key` names, by key; fails naming every event of a key met more than once, so a
/// failure shows who wrote each copy.
fn counted_once(events: &[Event], key: impl Fn(&Event) -> Option<String>) -> BTreeMap<String, Vec<&Event>> {
    let mut count: BTreeMap<String, Vec<&Event>> = BTreeMap::new();
    for e in events {
        if let Some(key) = key(e) {
            count.entry(key).or_default().push(e);
        }
    }
    let repeated: Vec<_> = count.iter().filter(|(_, seen)| seen.len() > 1).collect();
    assert!(repeated.is_empty(), "counted twice: {repeated:#?}");
    count
}

fn ended(events: &[Event]) -> usize {
    events.iter().filter(|e| matches!(e.body.kind(), "workflow.completed" | "workflow.failed")).count()
}

#[tokio::test]
#[ignore = "long suite: ./tools/test.sh --long"]
async fn kill_9_of_each_service_mid_run_loses_nothing_and_ends_each_task_once() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    let router = |id: &'static str| [("ROUTER_ID", id), ("ROUTER_LEASE_TTL_SEC", "2")];
    let worker = [("WORKER_TTL_SEC", "60"), ("WORKER_ACK_WAIT_SEC", "2")];
    world.process("validator-1", &["validator"], &[])?;
    world.process("router-1", &["router"], &router("r1"))?;
    world.worker_process("w1", &worker)?;
    world.worker_process("w2", &worker)?;

    let mut workflows = Vec::new();
    let mut submit = async |world: &World, n: usize| -> anyhow::Result<()> {
        for _ in 0..n {
            workflows.push(world.submit(DOC.as_bytes(), None).await?);
        }
        Ok(())
    };
    submit(&world, 8).await?;
    world.wait_for("2 workflows to end", |events| ended(events) >= 2).await?;
    world.kill9("router-1").await?;
    submit(&world, 8).await?;
    world.process("router-2", &["router"], &router("r2"))?;
    world.wait_for("6 workflows to end", |events| ended(events) >= 6).await?;
    world.kill9("w1").await?;
    world.worker_process("w1-again", &[worker[0], worker[1], ("WORKER_ID", "w1")])?;
    submit(&world, 8).await?;
    world.kill9("validator-1").await?;
    world.process("validator-2", &["validator"], &[])?;
    // Only the second validator is alive for this one, whatever the first had done before it died.
    submit(&world, 1).await?;
    let total = workflows.len();
    let events = world.wait_for("every workflow to end", |events| ended(events) >= total).await?;

    // The fold of the whole log: every workflow completed, every task completed.
    let mut state = State::default();
    for event in &events {
        state.apply(event);
    }
    for id in &workflows {
        let wf = &state.workflows[id];
        assert_eq!(wf.status, WorkflowStatus::Completed, "{id}: {:?}", kinds(&events));
        assert!(wf.tasks.iter().all(|t| t.status == TaskStatus::Completed), "{id}");
    }
    // One verdict per submission, one workflow end per workflow, and at most one terminal event
    // per task attempt in the log (a killed worker's task is re-run under the same attempt).
    let count = counted_once(&events, |e| match e.body.kind() {
        "submission.accepted" | "submission.rejected" => Some(format!("verdict {}", e.body.scope().0)),
        "workflow.completed" | "workflow.failed" | "workflow.cancelled" => Some(format!("end {}", e.body.scope().0)),
        _ if e.body.is_task_terminal() => Some(format!("terminal {}", e.id)),
        _ => None,
    });
    assert_eq!(count.keys().filter(|k| k.starts_with("verdict ")).count(), total);
    assert_eq!(count.keys().filter(|k| k.starts_with("end ")).count(), total);
    assert_eq!(count.keys().filter(|k| k.starts_with("terminal ")).count(), 2 * total);
    // The kills were real: the second router took over, the second validator gave verdicts.
    assert!(world.process_log("router-2").contains("took the router lease"), "{}", world.process_log("router-2"));
    let validators: std::collections::BTreeSet<_> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::SubmissionAccepted(a) => a.submission.validated_by.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(validators.len(), 2, "{validators:?}");
    world.shutdown().await;
    Ok(())
}

/// How many tasks the whole-house run submits: `FLOWMESH_CHAOS_TASKS`, 400 by default (what CI's
/// long suite runs). The full size: `FLOWMESH_CHAOS_TASKS=10000 ./tools/test.sh --long chaos::`.
fn chaos_tasks() -> usize {
    std::env::var("FLOWMESH_CHAOS_TASKS").ok().and_then(|n| n.parse().ok()).unwrap_or(400)
}

/// Four echo stages in a row: each workflow is four tasks, each waiting for the one before.
const PIPELINE: &str = "apiVersion: flowmesh/v1\nkind: Workflow\nmetadata: {name: chaos-pipeline}\nspec:\n  taskType: echo\n  data: {type: list, items: [a, b]}\n  stages:\n    - {name: s1}\n    - {name: s2, dependsOn: [s1]}\n    - {name: s3, dependsOn: [s2]}\n    - {name: s4, dependsOn: [s3]}\n";
const STAGES: [&str; 4] = ["s1", "s2", "s3", "s4"];

/// Submits `n` pipelines as the admin; the ids of those the stream acknowledged go to `acknowledged`,
/// the errors of those it refused are returned.
async fn submit_pipelines(world: &World, n: usize, acknowledged: &mut Vec<String>) -> Vec<String> {
    let mut refused = Vec::new();
    for _ in 0..n {
        match world.submit(PIPELINE.as_bytes(), None).await {
            Ok(id) => acknowledged.push(id),
            Err(e) => refused.push(e.to_string()),
        }
    }
    refused
}

/// The chaos suite in one run, on the shipped roles with a user per worker: pipelines keep
/// arriving while every service is killed with SIGKILL (the routers, both workers, the
/// validator, some at once), the submissions stream is capped while no validator runs, a worker
/// user forges an acceptance, claims the next verdict's and task's ids and completes tasks it
/// never ran, and the server is down for longer than the workers' TTL. At the end: every
/// acknowledged submission has one verdict and one workflow end with every task completed, what
/// the capped stream refused was refused to its submitter, no forged event was folded, and no
/// task attempt ended twice.
#[tokio::test]
#[ignore = "long suite: ./tools/test.sh --long"]
async fn every_failure_at_once_loses_no_acknowledged_submission_and_folds_no_forgery() -> anyhow::Result<()> {
    use crate::forgery::{as_role, event_json, login, store};
    use flowmesh_domain::event::{SubmissionAccepted, SubmissionRef, TaskCompleted, TaskRef};
    use flowmesh_nats::subjects;

    let started = std::time::Instant::now();
    let tasks = chaos_tasks();
    let per_round = tasks.div_ceil(4 * 7).max(1);
    let ids = ["w1", "w2", "evil"].map(String::from);
    let config = flowmesh_nats::auth::server_config(&ids, &[]).map_err(anyhow::Error::msg)?;
    let mut world = World::start_secured_with(
        &config,
        &[
            ("FLOWMESH_WORKER_W1_PASSWORD", "w1-secret"),
            ("FLOWMESH_WORKER_W2_PASSWORD", "w2-secret"),
            ("FLOWMESH_WORKER_EVIL_PASSWORD", "evil-secret"),
        ],
    )
    .await?;
    let [router_user, router_password] = as_role("router");
    let router = |id: &'static str| [router_user, router_password, ("ROUTER_ID", id), ("ROUTER_LEASE_TTL_SEC", "2")];
    // A 4 s TTL, so the outage below outlasts it; work orders come back 2 s after a killed worker.
    let worker = |id: &'static str, user: &'static str, password: &'static str| {
        [
            ("WORKER_ID", id),
            ("NATS_USER", user),
            ("NATS_PASSWORD", password),
            ("WORKER_TTL_SEC", "4"),
            ("WORKER_ACK_WAIT_SEC", "2"),
        ]
    };
    world.process("validator-1", &["validator"], &as_role("validator"))?;
    world.process("router-1", &["router"], &router("r1"))?;
    world.process("router-2", &["router"], &router("r2"))?;
    world.worker_process("w1", &worker("w1", "worker-w1", "w1-secret"))?;
    world.worker_process("w2", &worker("w2", "worker-w2", "w2-secret"))?;
    let mut acknowledged = Vec::new();
    let mut refused = Vec::new();

    // 1–2. The routers and a worker die mid-run and come back.
    refused.extend(submit_pipelines(&world, per_round, &mut acknowledged).await);
    world.kill9("router-1").await?;
    refused.extend(submit_pipelines(&world, per_round, &mut acknowledged).await);
    world.process("router-1b", &["router"], &router("r1"))?;
    world.kill9("w1").await?;
    world.worker_process("w1b", &worker("w1", "worker-w1", "w1-secret"))?;
    refused.extend(submit_pipelines(&world, per_round, &mut acknowledged).await);

    // 3. No validator, and an operator caps the submissions stream 10 above what it holds: ten
    //    more are acknowledged, the rest refused to their submitter; then the cap is lifted.
    world.kill9("validator-1").await?;
    let submissions = subjects::SUBMISSIONS_STREAM;
    let mut stream_config = world.handles.js.get_stream(submissions).await?.info().await?.config.clone();
    let held = world.handles.js.get_stream(submissions).await?.info().await?.state.messages;
    stream_config.max_messages = held as i64 + 10;
    world.handles.js.update_stream(&stream_config).await?;
    let mut capped = Vec::new();
    let refused_by_cap = submit_pipelines(&world, 15, &mut capped).await;
    assert_eq!((capped.len(), refused_by_cap.len()), (10, 5), "{refused_by_cap:?}");
    assert!(refused_by_cap.iter().all(|e| e.contains("submission not stored")), "{refused_by_cap:?}");
    acknowledged.extend(capped);
    stream_config.max_messages = -1;
    world.handles.js.update_stream(&stream_config).await?;
    world.process("validator-2", &["validator"], &as_role("validator"))?;

    // 4. A worker user forges: a workflow nobody submitted, the next submission's verdict id and
    //    its first task's end id, and completions of that workflow's tasks it never ran.
    let evil = login(&world, "worker-evil", "evil-secret").await?;
    let fake =
        flowmesh_domain::validate_submission(PIPELINE.as_bytes(), "wf-forged").map_err(|p| anyhow::anyhow!("{p:?}"))?;
    let accepted = event_json(EventBody::SubmissionAccepted(SubmissionAccepted {
        workflow_id: "wf-forged".into(),
        submission: SubmissionRef { stream: submissions.into(), seq: 1, msg_id: None, validated_by: None },
        task_ids: fake.tasks.iter().map(|t| t.task_id.clone()).collect(),
        workflow: fake,
    }));
    store(&evil, subjects::event("evil.wf-forged.wf-forged-s1.task.completed"), None, accepted).await?;
    let next = world.handles.js.get_stream(submissions).await?.info().await?.state.last_sequence + 1;
    let victim = format!("wf-{next}");
    let claims = [format!("sub.{next}.verdict"), format!("{victim}-s1.1.end")];
    for claim in &claims {
        let subject = subjects::event(&format!("evil.{victim}.{victim}-s1.task.updated"));
        store(&evil, subject, Some(claim), b"{}".to_vec()).await?;
    }
    for stage in STAGES {
        let task_id = format!("{victim}-{stage}");
        let forged = event_json(EventBody::TaskCompleted(TaskCompleted {
            task: TaskRef { workflow_id: victim.clone(), task_id: task_id.clone(), stage: stage.into(), attempt: 1 },
            worker_id: "evil".into(),
            result: Some(serde_json::json!({"forged": true})),
            result_object: None,
            artifacts: Vec::new(),
            upload_ms: None,
            started_at: None,
        }));
        store(&evil, subjects::event(&format!("evil.{victim}.{task_id}.task.completed")), None, forged).await?;
    }
    refused.extend(submit_pipelines(&world, per_round, &mut acknowledged).await);
    assert!(acknowledged.contains(&victim), "the victim {victim} was not submitted");

    // 5. The server is down for longer than the workers' TTL.
    world.server.restart_after(None, Duration::from_secs(9)).await?;
    refused.extend(submit_pipelines(&world, per_round, &mut acknowledged).await);

    // 6. Everything at once: both routers, a worker and the validator.
    for name in ["router-2", "router-1b", "w2", "validator-2"] {
        world.kill9(name).await?;
    }
    refused.extend(submit_pipelines(&world, per_round, &mut acknowledged).await);
    world.process("validator-3", &["validator"], &as_role("validator"))?;
    world.process("router-3", &["router"], &router("r3"))?;
    world.worker_process("w2b", &worker("w2", "worker-w2", "w2-secret"))?;
    refused.extend(submit_pipelines(&world, per_round, &mut acknowledged).await);
    assert!(refused.is_empty(), "refused outside the cap: {refused:?}");

    let total = acknowledged.len();
    let events = world
        .wait_for_count("every acknowledged workflow to end", total, tests::DEADLINE * 2, ended)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nrouter-3:\n{}", world.process_log("router-3")))?;

    // Nothing acknowledged is lost: a verdict and an end each, every task completed.
    let mut state = State::default();
    for event in &events {
        state.apply(event);
    }
    for id in &acknowledged {
        let wf = state.workflows.get(id).ok_or_else(|| anyhow::anyhow!("{id} has no verdict"))?;
        assert_eq!(wf.status, WorkflowStatus::Completed, "{id}");
        assert!(wf.tasks.iter().all(|t| t.status == TaskStatus::Completed), "{id}");
    }
    // No forgery folded: no forged workflow, no forged result, the victim's tasks run by w1 or w2.
    assert!(!state.workflows.contains_key("wf-forged"), "the forged workflow was folded");
    assert!(events.iter().all(|e| e.body.scope().0 != "wf-forged"), "the forged workflow reached a reader");
    let folded: Vec<_> = state.workflows.values().flat_map(|w| &w.tasks).collect();
    assert!(
        folded.iter().all(|t| t.result.as_ref().is_none_or(|r| r.get("forged").is_none())),
        "a forged result was folded"
    );
    for stage in STAGES {
        let t = state.task(&format!("{victim}-{stage}")).expect("a victim task");
        assert!(matches!(t.worker_id.as_deref(), Some("w1" | "w2")), "{victim}-{stage} ran on {:?}", t.worker_id);
    }
    // One verdict per acknowledged submission, one end per workflow, one terminal event per attempt.
    let count = counted_once(&events, |e| match e.body.kind() {
        "submission.accepted" | "submission.rejected" => Some(format!("verdict {}", e.body.scope().0)),
        "workflow.completed" | "workflow.failed" | "workflow.cancelled" => Some(format!("end {}", e.body.scope().0)),
        _ if e.body.is_task_terminal() && e.body.reporter() != Some("evil") => {
            Some(format!("terminal {}", e.id.split('~').next().unwrap_or(&e.id)))
        }
        _ => None,
    });
    assert_eq!(count.keys().filter(|k| k.starts_with("verdict ")).count(), total);
    assert_eq!(count.keys().filter(|k| k.starts_with("end ")).count(), total);
    let requeues = events.iter().filter(|e| e.body.kind() == "task.requeued").count();
    eprintln!(
        "chaos: {} tasks in {total} acknowledged workflows ({} refused by the cap), {requeues} requeued, \
         {} events, {} skipped as unreadable, {:.0} s",
        4 * total,
        refused_by_cap.len(),
        events.len(),
        world.skipped().len(),
        started.elapsed().as_secs_f64()
    );
    world.shutdown().await;
    Ok(())
}
