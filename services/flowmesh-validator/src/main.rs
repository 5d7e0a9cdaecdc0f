//! `flowmesh-validator`: the validator as a standalone process (also `flowmesh validator`).

use clap::Parser;

#[derive(Parser)]
#[command(name = "flowmesh-validator", version, about = "FlowMesh validator")]
struct Cli {
    #[command(flatten)]
    nats: flowmesh_nats::cli::NatsArgs,
    /// Durable consumer name shared by all validators.
    #[arg(long, env = "VALIDATOR_CONSUMER", default_value = flowmesh_nats::subjects::VALIDATORS_CONSUMER)]
    consumer: String,
}

fn main() -> anyhow::Result<()> {
    flowmesh_nats::cli::serve(serve())
}

async fn serve() -> anyhow::Result<()> {
    flowmesh_nats::cli::init_tracing();
    let cli = Cli::parse();
    let (_trigger, shutdown) = flowmesh_nats::cli::shutdown_on_signals();
    cli.nats.install_metrics()?;
    let (client, handles) = cli.nats.handles("flowmesh-validator").await?;
    let _ = client;
    flowmesh_validator::run(
        flowmesh_validator::Config { consumer: cli.consumer, ..Default::default() },
        handles,
        shutdown,
    )
    .await
}
