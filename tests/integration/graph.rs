//! Graph semantics on a real stack: graph roots run side by side, `node_execution_order`
//! epochs hold the next epoch back until the previous one has ended.

use flowmesh_domain::{Event, EventBody};
use tests::World;

const ROOTS: &str = "apiVersion: flowmesh/v1\nkind: Workflow\nmetadata: {name: roots}\nspec:\n  taskType: python\n  command: 'sleep 1'\n  graph:\n    nodes:\n      - {name: a}\n      - {name: b}\n      - {name: join, dependsOn: [a, b]}\n";

/// Position of the first event that matches.
fn first(events: &[Event], what: impl Fn(&EventBody) -> bool) -> usize {
    events.iter().position(|e| what(&e.body)).expect("the event happened")
}

fn started(stage: &'static str) -> impl Fn(&EventBody) -> bool {
    move |b| matches!(b, EventBody::TaskStarted(s) if s.task.stage == stage)
}

fn completed(stage: &'static str) -> impl Fn(&EventBody) -> bool {
    move |b| matches!(b, EventBody::TaskCompleted(s) if s.task.stage == stage)
}

#[tokio::test]
async fn graph_roots_run_in_parallel_and_epochs_are_barriers() -> anyhow::Result<()> {
    let mut world = World::start().await?;
    world.stack().await?;
    let wf = world.submit(ROOTS.as_bytes(), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed");
    let ends = first(&events, completed("a")).min(first(&events, completed("b")));
    assert!(
        first(&events, started("a")) < ends && first(&events, started("b")) < ends,
        "both roots run before either ends: {:?}",
        tests::kinds(&events)
    );
    assert!(first(&events, started("join")) > first(&events, completed("a")).max(first(&events, completed("b"))));

    // The same graph with b first, then a: a waits for b to end although it has no dependsOn.
    let ordered = ROOTS.replace(
        "metadata: {name: roots}",
        "metadata:\n  name: ordered\n  annotations:\n    schedule_hint:\n      node_execution_order: [[b], [a], [join]]",
    );
    let wf = world.submit(ordered.as_bytes(), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    assert_eq!(events.last().unwrap().body.kind(), "workflow.completed");
    assert!(first(&events, started("a")) > first(&events, completed("b")), "{:?}", tests::kinds(&events));

    let bad = ROOTS.replace(
        "metadata: {name: roots}",
        "metadata:\n  name: bad\n  annotations:\n    schedule_hint:\n      node_execution_order: [[b], [a]]",
    );
    let wf = world.submit(bad.as_bytes(), None).await?;
    let events = world.wait_workflow_end(&wf).await?;
    let EventBody::SubmissionRejected(r) = &events.last().unwrap().body else { panic!("rejected: {events:?}") };
    assert!(r.errors.iter().any(|p| p.message.contains("missing: join")), "{:?}", r.errors);
    world.shutdown().await;
    Ok(())
}
