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
    world.process("validator", &["validator"], &as_role("validator"))?;
    let router = as_role("router");
    world.process("router", &["router"], &[router[0], router[1], ("ROUTER_LEASE_TTL_SEC", "2")])?;
    let worker = as_role("worker");
    world.process(
        "worker",
        &["worker"],
        &[
            worker[0],
            worker[1],
            ("WORKER_ID", "sw"),
            // The shared worker user has no store of its own (no identity of its own).
            ("WORKER_ARTIFACTS_BUCKET", flowmesh_nats::subjects::ARTIFACTS_BUCKET),
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

    // Services answer requests through `allow_responses` alone (no role may publish on an inbox).
    for (subject, service) in [
        ("flowmesh.router.status", "router"),
        ("flowmesh.validator.status", "validator"),
        ("flowmesh.worker.sw.status", "worker"),
    ] {
        let reply = tokio::time::timeout(tests::DEADLINE, async {
            loop {
                match world.client.request(subject, "".into()).await {
                    Ok(reply) => return reply,
                    // The status endpoint may not be registered yet: ask again.
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        })
        .await;
        assert!(reply.is_ok_and(|r| !r.payload.is_empty()), "no status from the {service}");
    }

    // Outside their roles, the server refuses them.
    let submitter_js = client(&world, "submitter").await?;
    assert!(refused(&submitter_js, "flowmesh.events._.wf-9._.workflow.completed").await, "a submitter forges an event");
    assert!(refused(&submitter_js, "flowmesh.work.sw").await, "a submitter sends work");
    let worker_js = client(&world, "worker").await?;
    assert!(refused(&worker_js, "flowmesh.submit").await, "a worker submits");
    assert!(refused(&worker_js, "flowmesh.events.other.wf-9.wf-9-main.task.dispatched").await, "a worker dispatches");
    assert!(
        refused(&worker_js, "flowmesh.events.sw.wf-9.wf-9-main.task.dispatched").await,
        "a worker dispatches to itself"
    );
    assert!(refused(&worker_js, "flowmesh.events._.wf-9._.workflow.completed").await, "a worker ends a workflow");
    assert!(
        refused(&worker_js, "flowmesh.events._.wf-9.wf-9-main.task.failed").await,
        "a worker fails a task in a service's name"
    );
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

/// A worker with a user of its own (`flowmesh streams server-config --worker ID`, as an operator
/// makes the file) runs its work, and cannot take, read or impersonate another worker's.
#[tokio::test]
async fn a_worker_user_reaches_only_its_own_work() -> anyhow::Result<()> {
    let out = tokio::process::Command::new(tests::flowmesh_bin())
        .args(["streams", "server-config", "--worker", "own", "--worker", "other"])
        .output()
        .await?;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    let config = String::from_utf8(out.stdout)?;
    let mut world = World::start_secured_with(
        &config,
        &[("FLOWMESH_WORKER_OWN_PASSWORD", "own-secret"), ("FLOWMESH_WORKER_OTHER_PASSWORD", "other-secret")],
    )
    .await?;
    world.process("validator", &["validator"], &as_role("validator"))?;
    let router = as_role("router");
    world.process("router", &["router"], &[router[0], router[1], ("ROUTER_LEASE_TTL_SEC", "2")])?;
    world.worker_process("own", &[("NATS_USER", "worker-own"), ("NATS_PASSWORD", "own-secret")])?;

    // Its whole path works under the narrowed user: heartbeat, its consumer, reports, results.
    let workflow_id = world.submit(&tests::example("valid/echo.yaml"), None).await?;
    let events = world.wait_workflow_end(&workflow_id).await?;
    assert!(
        events.iter().any(|e| tests::workflow_ended(e, &workflow_id) && e.body.kind() == "workflow.completed"),
        "{:?}\nworker:\n{}",
        tests::kinds(&events),
        world.process_log("own")
    );

    // A refused request is never answered: a short timeout keeps each refusal short.
    let own = async_nats::jetstream::ContextBuilder::new().timeout(Duration::from_secs(1)).build(
        async_nats::ConnectOptions::with_user_and_password("worker-own".into(), "own-secret".into())
            .custom_inbox_prefix(flowmesh_nats::subjects::inbox_prefix("worker-own"))
            .connect(world.url())
            .await?,
    );
    let work = own.get_stream("FLOWMESH_WORK").await?;
    let take = |name: &str, filter: &str| {
        work.create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some(name.to_owned()),
            filter_subject: filter.to_owned(),
            ..Default::default()
        })
    };
    assert!(take("worker-other", "flowmesh.work.other").await.is_err(), "it takes another's work");
    assert!(take("worker-own", "flowmesh.work.other").await.is_err(), "its consumer reads another's subject");
    assert!(take("sneaky", "flowmesh.work.>").await.is_err(), "it reads every worker's work");
    assert!(work.get_raw_message(1).await.is_err(), "it reads a work order from the stream");
    let log = own.get_stream("FLOWMESH_EVENTS").await?;
    let queue = |name: &str, filter: String| {
        log.create_consumer(async_nats::jetstream::consumer::push::Config {
            durable_name: Some(name.to_owned()),
            deliver_subject: flowmesh_nats::subjects::dispatch_inbox("_INBOX_worker-own", "own"),
            filter_subject: filter,
            ..Default::default()
        })
    };
    let dispatches = flowmesh_nats::subjects::dispatches;
    assert!(queue("worker-other", dispatches("other")).await.is_err(), "it takes another's dispatches");
    assert!(queue("worker-own", dispatches("other")).await.is_err(), "its queue reads another's dispatches");
    assert!(queue("sneaky", dispatches("*")).await.is_err(), "it takes every worker's dispatches");
    let workers = own.get_key_value("flowmesh_workers").await?;
    assert!(workers.put("other", "{}".into()).await.is_err(), "it writes another's snapshot");
    assert!(workers.get("own").await?.is_some(), "it reads the fleet");
    // The same refusals are not a broken server: its own key can be written.
    let snapshot = workers.get("own").await?.expect("the worker's snapshot");
    assert!(workers.put("own", snapshot.clone()).await.is_ok());
    // Under its own key it can still only describe itself: a snapshot there naming the other
    // worker is not believed (the router ignores it as `worker list` does).
    let mut posing: serde_json::Value = serde_json::from_slice(&snapshot)?;
    posing["id"] = "other".into();
    assert!(workers.put("own", serde_json::to_vec(&posing)?.into()).await.is_ok());
    let out = world.cli_with(&["worker", "list", "--json"], &as_role("admin")).await?;
    assert!(out.status.success(), "{}", tests::output_text(&out));
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)?;
    let ids: Vec<&serde_json::Value> = listed.iter().map(|w| &w["snapshot"]["id"]).collect();
    assert!(ids.iter().all(|id| id.is_string() && *id != "other"), "{listed:?}");
    world.shutdown().await;
    Ok(())
}

/// `flowmesh submit --msg-id` is scoped to the submitting user: another user's id of the same
/// text is another submission, and ids another user stores ahead of time take nothing.
#[tokio::test]
async fn a_msg_id_belongs_to_the_user_who_submitted_it() -> anyhow::Result<()> {
    let config = flowmesh_nats::auth::server_config(&[], &["alice".to_owned()]).map_err(|e| anyhow::anyhow!(e))?;
    let mut world =
        World::start_secured_with(&config, &[("FLOWMESH_SUBMITTER_ALICE_PASSWORD", "alice-secret")]).await?;
    world.process("validator", &["validator"], &as_role("validator"))?;
    let submit = |user: &'static str, password: &'static str, file: &'static str, id: &'static str| {
        let url = world.url();
        async move {
            let out = tokio::process::Command::new(tests::flowmesh_bin())
                .args(["submit", file, "--msg-id", id])
                .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
                .env("NATS_URL", url)
                .envs([("NATS_USER", user), ("NATS_PASSWORD", password)])
                .output()
                .await?;
            let text = tests::output_text(&out);
            anyhow::ensure!(out.status.success(), "{user}: {text}");
            let workflow = text.split_whitespace().skip_while(|w| *w != "submitted").nth(1);
            workflow.map(str::to_owned).ok_or_else(|| anyhow::anyhow!("no workflow id in {text}"))
        }
    };
    let alice = submit("alice", "alice-secret", "examples/valid/echo.yaml", "run-7").await?;
    let bob = submit("submitter", role_password("submitter"), "examples/valid/echo.yaml", "run-7").await?;
    assert_ne!(alice, bob, "another user's run-7 returned alice's submission");
    assert_eq!(submit("alice", "alice-secret", "examples/valid/echo.yaml", "run-7").await?, alice, "alice's retry");

    // The other user stores under ids alice might use, as given and in her scope's shape.
    let other = async_nats::jetstream::new(
        async_nats::ConnectOptions::with_user_and_password("submitter".into(), role_password("submitter").into())
            .custom_inbox_prefix(flowmesh_nats::subjects::inbox_prefix("submitter"))
            .connect(world.url())
            .await?,
    );
    let mut claimed = Vec::new();
    for id in ["run-8", "alice:run-8", "alice:run-8:00000000000000000000000000000000"] {
        let publish =
            async_nats::jetstream::message::PublishMessage::build().payload("not alice's".into()).message_id(id);
        claimed.push(format!("wf-{}", other.send_publish("flowmesh.submit", publish).await?.await?.sequence));
    }
    let eighth = submit("alice", "alice-secret", "examples/valid/echo.yaml", "run-8").await?;
    assert!(!claimed.contains(&eighth), "alice's run-8 returned {eighth}, one of the claims {claimed:?}");
    world.shutdown().await;
    Ok(())
}
