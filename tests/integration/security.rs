//! `streams/nats-server.conf`: every role can do its work, and nothing outside it.

use flowmesh_nats::connect::{NatsOptions, connect};
use std::time::Duration;
use tests::{World, role_password};

fn as_role(role: &'static str) -> [(&'static str, &'static str); 2] {
    [("NATS_USER", role), ("NATS_PASSWORD", role_password(role))]
}

async fn client(world: &World, role: &str) -> anyhow::Result<async_nats::jetstream::Context> {
    let options = NatsOptions {
        url: world.url(),
        name: role.to_owned(),
        user: Some(role.to_owned()),
        password: Some(role_password(role).to_owned()),
        ..Default::default()
    };
    Ok(async_nats::jetstream::new(connect(&options).await?))
}

/// A JetStream publish the server must refuse: an error, or no ack at all.
async fn refused(js: &async_nats::jetstream::Context, subject: &'static str) -> bool {
    let attempt = async {
        let ack = js.publish(subject, "{}".into()).await.map_err(|e| e.to_string())?;
        ack.await.map(|_| ()).map_err(|e| e.to_string())
    };
    // An allowed publish is acked in milliseconds; a refused one never is.
    !matches!(tokio::time::timeout(Duration::from_secs(1), attempt).await, Ok(Ok(())))
}

#[tokio::test]
async fn each_role_does_its_work_and_nothing_else() -> anyhow::Result<()> {
    let mut world = World::start_secured().await?;
    let results = world.dir.path().join("secure-worker");
    let service = as_role("service");
    world.process("validator", &["validator"], &service)?;
    world.process("router", &["router"], &[service[0], service[1], ("ROUTER_LEASE_TTL_SEC", "2")])?;
    let worker = as_role("worker");
    world.process(
        "worker",
        &["worker"],
        &[
            worker[0],
            worker[1],
            ("WORKER_ID", "sw"),
            ("RESULTS_DIR", results.to_str().unwrap()),
            ("HEARTBEAT_INTERVAL_SEC", "1"),
        ],
    )?;

    // The submitter runs the whole CLI path: submit, follow, fetch the result.
    let submitter = as_role("submitter");
    let out = tokio::process::Command::new(tests::flowmesh_bin())
        .args(["submit", "examples/valid/echo.yaml", "--watch"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .env("NATS_URL", world.url())
        .envs(submitter)
        .output()
        .await?;
    assert!(out.status.success(), "{}\nworker:\n{}", tests::output_text(&out), world.process_log("worker"));

    // Outside their roles, the server refuses them.
    let submitter_js = client(&world, "submitter").await?;
    assert!(refused(&submitter_js, "flowmesh.events.wf-9._.workflow.completed").await, "a submitter forges an event");
    assert!(refused(&submitter_js, "flowmesh.work.sw").await, "a submitter sends work");
    let worker_js = client(&world, "worker").await?;
    assert!(refused(&worker_js, "flowmesh.submit").await, "a worker submits");
    assert!(refused(&worker_js, "flowmesh.events.wf-9.wf-9-main.task.dispatched").await, "a worker dispatches");
    assert!(refused(&worker_js, "flowmesh.events.wf-9._.workflow.completed").await, "a worker ends a workflow");
    assert!(worker_js.delete_stream("FLOWMESH_EVENTS").await.is_err(), "a worker deletes the log");
    assert!(client(&world, "worker").await.is_ok());
    let wrong =
        async_nats::ConnectOptions::with_user_and_password("admin".into(), "guess".into()).connect(world.url()).await;
    assert!(wrong.is_err(), "a wrong password is refused");

    // Nothing refused reached a stream.
    let events = world.events();
    assert!(events.iter().all(|e| !e.id.contains("wf-9")), "no forged event in the log");
    let mut submissions = world.handles.js.get_stream("FLOWMESH_SUBMISSIONS").await?;
    assert_eq!(submissions.info().await?.state.messages, 1);
    world.shutdown().await;
    Ok(())
}
