//! `flowmesh-worker`: the worker as a standalone process (also `flowmesh worker`).

use clap::Parser;

#[derive(Parser)]
#[command(name = "flowmesh-worker", version, about = "FlowMesh worker")]
struct Cli {
    #[command(flatten)]
    nats: flowmesh_nats::cli::NatsArgs,
    #[command(flatten)]
    args: flowmesh_worker::WorkerArgs,
    /// Print the probed hardware as JSON and exit.
    #[arg(long)]
    collect_hw: bool,
}

fn main() -> anyhow::Result<()> {
    flowmesh_nats::cli::serve(serve())
}

async fn serve() -> anyhow::Result<()> {
    flowmesh_nats::cli::init_tracing();
    let cli = Cli::parse();
    let config = match cli.args.config(&flowmesh_nats::host::name()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("flowmesh-worker: {e}");
            std::process::exit(2);
        }
    };
    if cli.collect_hw {
        return flowmesh_worker::print_hardware(&config).await;
    }
    let (_trigger, shutdown) = flowmesh_nats::cli::shutdown_on_signals();
    cli.nats.install_metrics()?;
    let (client, handles) = cli.nats.handles("flowmesh-worker").await?;
    flowmesh_worker::run(config, client, handles, shutdown).await
}
