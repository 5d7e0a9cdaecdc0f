//! `flowmesh dev` keeps its data in `--data DIR`: a restarted stack remembers everything.

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

#[tokio::test]
async fn ctrl_c_stops_flowmesh_dev_and_its_nats_server() -> anyhow::Result<()> {
    let port = flowmesh::nats_server::free_port()?;
    let data = tempfile::tempdir()?;
    let mut dev = tokio::process::Command::new(tests::flowmesh_bin())
        .args(["dev", "--port", &port.to_string(), "--data", data.path().to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let url = format!("nats://127.0.0.1:{port}");
    let deadline = tokio::time::Instant::now() + tests::DEADLINE;
    // Ready once its worker has a snapshot in the bucket.
    loop {
        if let Ok(client) = async_nats::connect(&url).await
            && let Ok(kv) = async_nats::jetstream::new(client).get_key_value("flowmesh_workers").await
            && kv.get("dev-worker-1").await.ok().flatten().is_some()
        {
            break;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "flowmesh dev never came up");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let status = tests::interrupt(&mut dev).await?;
    assert!(status.success(), "a clean exit on Ctrl-C: {status:?}");
    assert!(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err(), "its nats-server stopped too");
    Ok(())
}
