//! Everything at once: workflows keep arriving while the router, a worker and the validator are
//! each killed with SIGKILL mid-run and started again. Nothing may be lost or counted twice.

use flowmesh_domain::EventBody;
use flowmesh_domain::state::{State, TaskStatus, WorkflowStatus};
use std::collections::BTreeMap;
use tests::{World, kinds};

/// Two python stages that take a moment, so every kill lands on work in flight.
const DOC: &str = "apiVersion: flowmesh/v1\nkind: Workflow\nmetadata: {name: chaos}\nspec:\n  taskType: python\n  command: 'sleep 0.3; echo ok'\n  stages:\n    - {name: first}\n    - {name: second}\n";

fn ended(events: &[flowmesh_domain::Event]) -> usize {
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
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for e in &events {
        let key = match e.body.kind() {
            "submission.accepted" | "submission.rejected" => format!("verdict {}", e.body.scope().0),
            "workflow.completed" | "workflow.failed" | "workflow.cancelled" => format!("end {}", e.body.scope().0),
            _ if e.body.is_task_terminal() => format!("terminal {}", e.id),
            _ => continue,
        };
        *count.entry(key).or_default() += 1;
    }
    let repeated: Vec<_> = count.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeated.is_empty(), "counted twice: {repeated:?}");
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
