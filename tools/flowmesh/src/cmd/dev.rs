//! `flowmesh dev`: nats-server, the validator, the router and workers in one process; `--demo`
//! submits the bundled echo example, prints its result and exits.

use anyhow::Context;
use flowmesh::{dev, submit};
use flowmesh_nats::cli::NatsArgs;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Keep data here (it survives a restart); a temporary folder otherwise.
    #[arg(long)]
    data: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// JSON file shaped like a snapshot's hardware: every dev worker simulates it.
    #[arg(long)]
    worker_hw: Option<PathBuf>,
    /// The nats-server binary (default: from PATH).
    #[arg(long)]
    nats_server: Option<PathBuf>,
    #[arg(long)]
    port: Option<u16>,
    /// Submit the bundled echo example, print its result, then exit.
    #[arg(long)]
    demo: bool,
    /// With --demo: keep the stack running afterwards.
    #[arg(long)]
    keep: bool,
    /// Seconds a task may find no capable worker before it fails (TASK_NO_WORKER_GRACE_SEC).
    #[arg(long, env = "TASK_NO_WORKER_GRACE_SEC", default_value_t = 60)]
    no_worker_grace_sec: u64,
    /// Seconds an ended workflow's events stay in the log before the router purges them; 0
    /// keeps them for ever (ROUTER_KEEP_ENDED_SEC).
    #[arg(long, env = "ROUTER_KEEP_ENDED_SEC", default_value_t = flowmesh_router::DEFAULT_KEEP_ENDED_SEC, value_parser = flowmesh_router::keep_ended_sec)]
    keep_ended_sec: u64,
}

pub async fn run(nats: &NatsArgs, args: Args) -> anyhow::Result<ExitCode> {
    nats.install_metrics()?;
    flowmesh_nats::cli::init_tracing_with("warn");
    let worker_hw = match &args.worker_hw {
        None => None,
        Some(path) => Some(
            serde_json::from_str(&std::fs::read_to_string(path)?)
                .with_context(|| format!("{} is not hardware JSON", path.display()))?,
        ),
    };
    let options = dev::StackOptions {
        data: args.data,
        workers: args.workers,
        worker_hw,
        nats_server: args.nats_server,
        port: args.port,
        no_worker_grace: Duration::from_secs(args.no_worker_grace_sec),
        keep_ended: flowmesh_router::keep_ended(args.keep_ended_sec),
        ..Default::default()
    };
    let mut stack = dev::Stack::start(options).await?;
    let url = stack.url();
    eprintln!("\nFlowMesh dev stack is up.\n  NATS_URL={url}\n  data: {}\n", stack.data_dir.display());
    eprintln!(
        "Try, in another terminal:\n  export NATS_URL={url}\n  flowmesh worker list\n  flowmesh submit examples/valid/echo_stages.yaml --watch\n  flowmesh workflow list\n"
    );
    if args.demo {
        let client = async_nats::connect(&url).await?;
        let js = async_nats::jetstream::new(client);
        let (workflow_id, _) = submit::submit(&js, dev::DEMO.as_bytes().to_vec(), Some("flowmesh-dev-demo")).await?;
        eprintln!("demo: submitted examples/valid/echo.yaml as {workflow_id}");
        let (end, state) = submit::follow(&js, &workflow_id, Duration::from_secs(120), |event, _| {
            if let Some(line) = submit::progress_line(event) {
                eprintln!("demo: {line}");
            }
        })
        .await?;
        let results = submit::results(&js, &state, &workflow_id).await?;
        println!("{}", serde_json::to_string_pretty(&results)?);
        if !args.keep {
            stack.stop().await;
            return Ok(super::exit(end.success()));
        }
    }
    let (_t, mut shutdown) = flowmesh_nats::cli::shutdown_on_signals();
    tokio::select! {
        _ = shutdown.wait() => {}
        (name, result) = stack.failed() => eprintln!("{name} stopped: {result:?}"),
    }
    stack.stop().await;
    Ok(ExitCode::SUCCESS)
}
