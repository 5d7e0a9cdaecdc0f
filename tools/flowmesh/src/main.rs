//! `flowmesh`: submit, watch, inspect and operate FlowMesh; `flowmesh dev` runs it all locally.
//! This file parses the arguments and dispatches; each verb lives in `cmd/`.

use clap::{Parser, Subcommand};
use flowmesh_nats::cli::NatsArgs;
use std::process::ExitCode;

mod cmd;

#[derive(Parser)]
#[command(name = "flowmesh", version, about = "FlowMesh on NATS: put every ML task on a worker that can really run it")]
struct Cli {
    #[command(flatten)]
    nats: NatsArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run nats-server, the validator, the router and workers in one process.
    Dev(cmd::dev::Args),
    /// Submit a workflow document (FILE, or - for stdin).
    Submit(cmd::submit::Args),
    /// Check documents offline, with the validator's own rules.
    Validate(cmd::validate::Args),
    /// Where each stage would be placed now, and why not elsewhere (nothing is submitted).
    Plan(cmd::plan::Args),
    /// Run a validator.
    Validator(cmd::serve::ValidatorArgs),
    /// Run the router.
    Router(flowmesh_router::RouterArgs),
    /// Run a worker, or inspect and operate the fleet (list, info, cordon, uncordon).
    #[command(args_conflicts_with_subcommands = true)]
    Worker {
        #[command(subcommand)]
        command: Option<cmd::worker::Command>,
        #[command(flatten)]
        serve: cmd::serve::ServeWorker,
    },
    /// Workflows, from the event log.
    Workflow {
        #[command(subcommand)]
        command: cmd::workflow::Command,
    },
    /// Tasks, from the event log.
    Task {
        #[command(subcommand)]
        command: cmd::task::Command,
    },
    /// Shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    Completions { shell: clap_complete::Shell },
    /// The raw event log.
    Events(cmd::events::Args),
    /// Results and artifacts.
    Result {
        #[command(subcommand)]
        command: cmd::result::Command,
    },
    /// Create or check the streams, buckets and object store defined in streams/.
    Streams {
        #[command(subcommand)]
        command: cmd::streams::Command,
    },
    /// Where a workflow's time went: per task waiting, queued, placement, run and upload, and
    /// the critical path; --svg FILE draws the timeline.
    Trace(cmd::trace::Args),
    /// A shell or a command in a running interactive ssh task (with your own key).
    Ssh {
        #[command(subcommand)]
        command: cmd::ssh::Command,
    },
    /// Submit synthetic workflows and report tasks/s and latency percentiles (with --raw, as a
    /// ratio to the raw JetStream round trip on the same server).
    Bench(cmd::bench::Args),
}

fn main() -> ExitCode {
    // Behave like other Unix tools when a pipe closes (`flowmesh events | head`): stop quietly.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    // As every service does (`dev`'s services and the bench's client gain from it); a panic is
    // reported with its message. A process that starts its own nats-server leaves it a core.
    let beside_its_server =
        matches!(&cli.command, Command::Dev(_) | Command::Bench(cmd::bench::Args { dev: true, .. }));
    let served = if beside_its_server {
        flowmesh_nats::cli::serve_beside_its_server(run(cli))
    } else {
        flowmesh_nats::cli::serve(run(cli))
    };
    match served {
        Ok(code) => code,
        Err(e) => {
            eprintln!("flowmesh: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let sets_up_its_own_log = matches!(
        cli.command,
        Command::Dev(_)
            | Command::Validator(_)
            | Command::Router(_)
            | Command::Worker { command: None, .. }
            | Command::Bench(_)
    );
    if !sets_up_its_own_log {
        // A client command prints warnings only: a failover being ridden out, for one.
        flowmesh_nats::cli::init_tracing_with("warn,async_nats=error");
    }
    let nats = &cli.nats;
    match cli.command {
        Command::Dev(args) => cmd::dev::run(nats, args).await,
        Command::Submit(args) => cmd::submit::run(nats, args).await,
        Command::Validate(args) => cmd::validate::run(&args),
        Command::Plan(args) => cmd::plan::run(nats, args).await,
        Command::Validator(args) => cmd::serve::validator(nats, args).await,
        Command::Router(args) => cmd::serve::router(nats, args).await,
        Command::Worker { command: Some(command), .. } => cmd::worker::run(nats, command).await,
        Command::Worker { command: None, serve } => cmd::serve::worker(nats, serve).await,
        Command::Workflow { command } => cmd::workflow::run(nats, command).await,
        Command::Task { command } => cmd::task::run(nats, command).await,
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "flowmesh", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Events(args) => cmd::events::run(nats, args).await,
        Command::Result { command } => cmd::result::run(nats, command).await,
        Command::Streams { command } => cmd::streams::run(nats, command).await,
        Command::Trace(args) => cmd::trace::run(nats, args).await,
        Command::Ssh { command } => cmd::ssh::run(nats, command).await,
        Command::Bench(args) => cmd::bench::run(nats, args).await,
    }
}

#[cfg(test)]
mod tests {
    /// clap checks a command line's consistency (unique names, valid defaults) only when it is
    /// built: build every subcommand here rather than at a user's first `--help`.
    #[test]
    fn every_subcommand_is_well_formed() {
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}
