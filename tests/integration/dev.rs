//! `flowmesh dev` keeps its data in `--data DIR`: a restarted stack remembers everything; the
//! servers it starts keep no subscription cache.

use flowmesh::dev::{Stack, StackOptions};
use flowmesh::submit::{self, End};
use std::time::Duration;

async fn run_echo(stack: &Stack) -> anyhow::Result<(String, End)> {
    let client = async_nats::connect(stack.url()).await?;
    let js = async_nats::jetstream::new(client);
    let (workflow_id, _) = submit::submit(&js, tests::example("valid/echo.yaml"), None).await?;
    let (end, _) = submit::follow(&js, &workflow_id, tests::DEADLINE, |_, _| {}).await?;
    Ok((workflow_id, end))
}

#[tokio::test]
async fn a_dev_stack_with_a_data_folder_survives_a_restart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let options = StackOptions {
        data: Some(dir.path().join("data")),
        heartbeat: Duration::from_millis(500),
        ..Default::default()
    };
    let stack = Stack::start(options.clone()).await?;
    let (first, end) = run_echo(&stack).await?;
    assert_eq!((first.as_str(), end), ("wf-1", End::Completed));
    stack.stop().await;

    let stack = Stack::start(options).await?;
    let client = async_nats::connect(stack.url()).await?;
    let js = async_nats::jetstream::new(client);
    let state = flowmesh::log::fold(&js, flowmesh_nats::subjects::all_events()).await?;
    assert_eq!(state.workflows["wf-1"].status, flowmesh_domain::state::WorkflowStatus::Completed, "the log survived");
    let (second, end) = run_echo(&stack).await?;
    assert_eq!((second.as_str(), end), ("wf-2", End::Completed), "numbering continues after the restart");
    stack.stop().await;
    Ok(())
}

/// A stack is ready when `start` returns: its router leads and already sees every worker, so
/// the first submission is placed at once (the demo once heard "no live workers" first).
#[tokio::test]
async fn a_started_stack_has_a_router_that_leads_and_sees_every_worker() -> anyhow::Result<()> {
    let stack = Stack::start(StackOptions { workers: 3, ..Default::default() }).await?;
    let client = async_nats::connect(stack.url()).await?;
    let reply = client.request(flowmesh_nats::subjects::status("router"), "".into()).await?;
    let status: serde_json::Value = serde_json::from_slice(&reply.payload)?;
    stack.stop().await;
    assert_eq!((&status["leader"], &status["live_workers"]), (&true.into(), &3.into()), "{status}");
    Ok(())
}

/// `flowmesh dev` on a free port with a data folder, once its worker has a snapshot in the bucket.
async fn flowmesh_dev_up(data: &std::path::Path) -> anyhow::Result<(tokio::process::Child, u16)> {
    let port = flowmesh::nats_server::free_port()?;
    let dev = tokio::process::Command::new(tests::flowmesh_bin())
        .args(["dev", "--port", &port.to_string(), "--data", data.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let url = format!("nats://127.0.0.1:{port}");
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    loop {
        if let Ok(client) = async_nats::connect(&url).await
            && let Ok(kv) = async_nats::jetstream::new(client).get_key_value("flowmesh_workers").await
            && kv.get("dev-worker-1").await.ok().flatten().is_some()
        {
            return Ok((dev, port));
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "flowmesh dev never came up");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn ctrl_c_stops_flowmesh_dev_and_its_nats_server() -> anyhow::Result<()> {
    let data = tempfile::tempdir()?;
    let (mut dev, port) = flowmesh_dev_up(data.path()).await?;
    let status = tests::interrupt(&mut dev).await?;
    assert!(status.success(), "a clean exit on Ctrl-C: {status:?}");
    assert!(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err(), "its nats-server stopped too");
    Ok(())
}

/// Killed outright, `flowmesh dev` cannot stop its server itself; the kernel does, so no server
/// is left holding the port and the store.
#[tokio::test]
async fn a_killed_flowmesh_dev_takes_its_nats_server_along() -> anyhow::Result<()> {
    let data = tempfile::tempdir()?;
    let (mut dev, port) = flowmesh_dev_up(data.path()).await?;
    dev.kill().await?;
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "nats-server still accepts on port {port}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Ok(())
}

/// What the server's monitoring port says of its subscription cache (`/subsz`'s `num_cache`), for
/// a server run from `config` once a subscriber has heard a few subjects.
async fn cached_subjects_of_a_server_run_from(config: &str) -> anyhow::Result<u64> {
    use flowmesh::nats_server::{NatsServer, free_port};
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("server.conf");
    let monitor = free_port()?;
    // The monitoring port is the test's instrument, on the loopback only.
    std::fs::write(&path, format!("{config}http: \"127.0.0.1:{monitor}\"\n"))?;
    let mut server = NatsServer::start_with(None, &dir.path().join("store"), None, Some(&path), &[]).await?;
    let client = async_nats::connect(server.url()).await?;
    let mut heard = client.subscribe("cache.>").await?;
    for n in 0..20 {
        client.publish(format!("cache.{n}"), "x".into()).await?;
    }
    for _ in 0..20 {
        tokio::time::timeout(tests::DEADLINE, futures_util::StreamExt::next(&mut heard))
            .await?
            .ok_or_else(|| anyhow::anyhow!("the subscription ended"))?;
    }
    let subsz = tests::http_get(monitor, "/subsz").await?;
    server.stop().await;
    let subsz: serde_json::Value = serde_json::from_str(&subsz).map_err(|e| anyhow::anyhow!("{e}: {subsz}"))?;
    subsz["num_cache"].as_u64().ok_or_else(|| anyhow::anyhow!("no num_cache in {subsz}"))
}

/// The servers the dev stack and the tests start keep no subscription cache: the server reads
/// `server_config` that way. The same file without the setting caches the subjects it matched,
/// so the count tells the two apart.
#[tokio::test]
async fn a_server_we_start_keeps_no_subscription_cache() -> anyhow::Result<()> {
    let ours = flowmesh::nats_server::server_config(flowmesh::nats_server::SYNC_INTERVAL);
    assert_eq!(cached_subjects_of_a_server_run_from(&ours).await?, 0, "{ours}");
    let without: String =
        ours.lines().filter(|l| !l.contains("disable_sublist_cache")).map(|l| format!("{l}\n")).collect();
    assert_ne!(without, ours, "the setting is a line of its own");
    assert!(cached_subjects_of_a_server_run_from(&without).await? > 0, "a server with its cache holds what it matched");
    Ok(())
}
