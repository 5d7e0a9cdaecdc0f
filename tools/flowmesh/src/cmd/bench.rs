//! `flowmesh bench`: submits synthetic workflows (on NATS_URL, or on a private `--dev` stack) and
//! reports tasks/s and latency percentiles; `--raw` adds the raw JetStream round trip.

use flowmesh::{bench, dev};
use flowmesh_nats::cli::NatsArgs;
use flowmesh_nats::connect::{NatsOptions, connect};
use flowmesh_nats::{Handles, Topology};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Workflows to submit, one task each.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    tasks: u32,
    /// At most this many workflows in flight (submitted and not yet ended).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    concurrency: u32,
    /// Task types and weights: echo documents and python `command: 'true'` documents.
    #[arg(long, default_value = "echo=3,python=1")]
    mix: bench::Mix,
    /// Start a private dev stack for the run (and stop it afterwards) instead of using NATS_URL.
    #[arg(long)]
    dev: bool,
    /// With --dev: how many workers.
    #[arg(long, requires = "dev", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    workers: u16,
    /// With --dev: the nats-server binary (default: from PATH).
    #[arg(long, requires = "dev")]
    nats_server: Option<PathBuf>,
    /// Also measure the raw JetStream round trip (pipelined publish with acks, 256 in flight;
    /// consume with plain acks) on the same server, in a temporary stream deleted afterwards.
    #[arg(long)]
    raw: bool,
    /// Messages in the raw run.
    #[arg(long, requires = "raw", default_value_t = bench::RAW_MESSAGES)]
    raw_messages: usize,
    /// The whole pipeline run's limit; tasks not ended by then count as unfinished.
    #[arg(long, default_value_t = 600)]
    timeout_sec: u64,
    #[arg(long)]
    json: bool,
}

pub async fn run(nats: &NatsArgs, args: Args) -> anyhow::Result<ExitCode> {
    let mut options = bench::Options {
        tasks: args.tasks as usize,
        concurrency: args.concurrency as usize,
        mix: args.mix,
        raw: args.raw,
        raw_messages: args.raw_messages,
        timeout: Duration::from_secs(args.timeout_sec),
        replicas: usize::from(nats.replicas),
        ..Default::default()
    };
    flowmesh_nats::cli::init_tracing_with("warn,async_nats=error");
    let (_t, shutdown) = flowmesh_nats::cli::shutdown_on_signals();
    let (stack, js) = if args.dev {
        let stack = dev::Stack::start(dev::StackOptions {
            workers: usize::from(args.workers),
            nats_server: args.nats_server,
            ..Default::default()
        })
        .await?;
        eprintln!("bench: dev stack with {} worker(s) at {}", args.workers, stack.url());
        // Fresh workers publish their first snapshot within a heartbeat or two.
        options.fleet_wait = Duration::from_secs(30);
        // Measure the fleet asked for, not the first worker up.
        options.min_workers = usize::from(args.workers);
        // The private stack knows none of NATS_URL's credentials or TLS settings: a plain connection.
        let options = NatsOptions { url: stack.url(), name: "flowmesh-bench".to_owned(), ..Default::default() };
        let handles = Handles::ensure(&connect(&options).await?, &Topology::load(1)?).await?;
        (Some(stack), handles.js)
    } else {
        let (_, handles) = nats.handles("flowmesh-bench").await?;
        (None, handles.js)
    };
    eprintln!(
        "bench: {} task(s), mix {}, concurrency {}{}",
        options.tasks,
        options.mix,
        options.concurrency,
        if options.raw { ", with the raw JetStream round trip" } else { "" }
    );
    let report = bench::run(&js, &options, shutdown).await;
    if let Some(stack) = stack {
        stack.stop().await;
    }
    let report = report?;
    for f in &report.failures {
        eprintln!("bench: {}: {}", f.workflow_id.as_deref().unwrap_or("(not submitted)"), f.reason);
    }
    if report.failed > report.failures.len() {
        eprintln!("bench: … and {} more failure(s)", report.failed - report.failures.len());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", bench::render(&report));
    }
    Ok(super::exit(report.success()))
}
