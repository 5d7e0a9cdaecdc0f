//! `flowmesh-router`: the router as a standalone process (also `flowmesh router`).

use clap::Parser;

#[derive(Parser)]
#[command(name = "flowmesh-router", version, about = "FlowMesh router")]
struct Cli {
    #[command(flatten)]
    nats: flowmesh_nats::cli::NatsArgs,
    #[command(flatten)]
    args: flowmesh_router::RouterArgs,
}

fn main() -> anyhow::Result<()> {
    flowmesh_nats::cli::serve(serve())
}

async fn serve() -> anyhow::Result<()> {
    flowmesh_nats::cli::init_tracing();
    let cli = Cli::parse();
    let (_trigger, shutdown) = flowmesh_nats::cli::shutdown_on_signals();
    let config = cli.args.config();
    cli.nats.install_metrics()?;
    let (client, handles) = cli.nats.handles("flowmesh-router").await?;
    flowmesh_router::run(config, client, handles, shutdown).await
}
