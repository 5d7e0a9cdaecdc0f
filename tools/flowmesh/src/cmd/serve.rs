//! `flowmesh validator`, `flowmesh router`, `flowmesh worker` (no subcommand): one service in this
//! process, until Ctrl-C or SIGTERM; each sets up its own log.

use flowmesh_nats::cli::{self, NatsArgs};
use flowmesh_nats::subjects;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ValidatorArgs {
    #[arg(long, env = "VALIDATOR_CONSUMER", default_value = subjects::VALIDATORS_CONSUMER)]
    consumer: String,
}

/// A worker's flags, and `--collect-hw`.
#[derive(clap::Args)]
pub struct ServeWorker {
    #[command(flatten)]
    args: Box<flowmesh_worker::WorkerArgs>,
    /// Print the probed hardware as JSON and exit.
    #[arg(long)]
    collect_hw: bool,
}

pub async fn validator(nats: &NatsArgs, args: ValidatorArgs) -> anyhow::Result<ExitCode> {
    cli::init_tracing();
    let (_t, shutdown) = cli::shutdown_on_signals();
    nats.install_metrics()?;
    let (_, handles) = nats.handles("flowmesh-validator").await?;
    let config = flowmesh_validator::Config { consumer: args.consumer, ..Default::default() };
    flowmesh_validator::run(config, handles, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

pub async fn router(nats: &NatsArgs, args: flowmesh_router::RouterArgs) -> anyhow::Result<ExitCode> {
    cli::init_tracing();
    let config = args.config();
    let (_t, shutdown) = cli::shutdown_on_signals();
    nats.install_metrics()?;
    let (client, handles) = nats.handles("flowmesh-router").await?;
    flowmesh_router::run(config, client, handles, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

pub async fn worker(nats: &NatsArgs, args: ServeWorker) -> anyhow::Result<ExitCode> {
    let config = args.args.config(&flowmesh_nats::host::name())?;
    if args.collect_hw {
        flowmesh_worker::print_hardware(&config).await?;
        return Ok(ExitCode::SUCCESS);
    }
    cli::init_tracing();
    let (_t, shutdown) = cli::shutdown_on_signals();
    nats.install_metrics()?;
    let (client, handles) = nats.handles("flowmesh-worker").await?;
    flowmesh_worker::run(config, client, handles, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}
