//! `flowmesh dev`: nats-server, the validator, the router and workers in one process; `--demo`
//! submits the bundled echo example, prints its result and exits.

use anyhow::Context;
use flowmesh::{dev, submit};
use flowmesh_nats::cli::NatsArgs;
use flowmesh_nats::shutdown::Shutdown;
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
    // Listening from the start: a Ctrl-C while the stack comes up, or during the demo, stops it
    // as cleanly as later.
    let (_t, mut shutdown) = flowmesh_nats::cli::shutdown_on_signals();
    let mut stack = dev::Stack::launch(options).await?;
    match until_interrupted(&mut shutdown, stack.ready()).await {
        None => return stopped(stack, Ok(ExitCode::SUCCESS)).await,
        Some(Err(e)) => return stopped(stack, Err(e)).await,
        Some(Ok(())) => {}
    }
    let url = stack.url();
    eprintln!("\nFlowMesh dev stack is up.\n  NATS_URL={url}\n  data: {}\n", stack.data_dir.display());
    eprintln!(
        "Try, in another terminal:\n  export NATS_URL={url}\n  flowmesh worker list\n  flowmesh submit examples/valid/echo_stages.yaml --watch\n  flowmesh workflow list\n"
    );
    if args.demo {
        match until_interrupted(&mut shutdown, demo(&url)).await {
            // The demo did not finish: 130, as a shell reports an interrupted command.
            None => return stopped(stack, Ok(ExitCode::from(130))).await,
            Some(Err(e)) => return stopped(stack, Err(e)).await,
            Some(Ok(success)) if !args.keep => return stopped(stack, Ok(super::exit(success))).await,
            Some(Ok(_)) => {}
        }
    }
    tokio::select! {
        _ = shutdown.wait() => {}
        (name, result) = stack.failed() => eprintln!("{name} stopped: {result:?}"),
    }
    stopped(stack, Ok(ExitCode::SUCCESS)).await
}

/// Submits the bundled echo example, follows it to its end and prints its results; whether it
/// succeeded.
async fn demo(url: &str) -> anyhow::Result<bool> {
    let client = async_nats::connect(url).await?;
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
    Ok(end.success())
}

/// `work`'s result, or `None` once a signal asked to stop first.
async fn until_interrupted<T>(shutdown: &mut Shutdown, work: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        done = work => Some(done),
        _ = shutdown.wait() => None,
    }
}

/// `outcome`, once the stack has stopped.
async fn stopped<T>(stack: dev::Stack, outcome: T) -> T {
    stack.stop().await;
    outcome
}
