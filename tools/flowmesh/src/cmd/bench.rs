//! `flowmesh bench`: submits synthetic workflows (on NATS_URL, or on a private `--dev` stack) and
//! reports tasks/s, latency percentiles and CPU per task; `--raw` adds the raw JetStream round
//! trip, `--rate` submits at a fixed rate, `--sweep` measures latency at 25/50/90% of the maximum.

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
    /// Submit this many workflows per second whatever is in flight (an open loop), instead of a
    /// burst at --concurrency: latency at a given load.
    #[arg(long, conflicts_with_all = ["concurrency", "sweep"])]
    rate: Option<f64>,
    /// After the burst, run again at 25%, 50% and 90% of the rate it reached (--tasks each), and
    /// report the latency of each.
    #[arg(long)]
    sweep: bool,
    /// Task types and weights: echo documents and python `command: 'true'` documents.
    #[arg(long, default_value = "echo=3,python=1")]
    mix: bench::Mix,
    /// Start a private dev stack for the run (and stop it afterwards) instead of using NATS_URL.
    #[arg(long)]
    pub dev: bool,
    /// With --dev: how many workers.
    #[arg(long, requires = "dev", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    workers: u16,
    /// With --dev: batch slots per worker (tasks each runs at once); the worker's default when unset.
    #[arg(long, requires = "dev", value_parser = clap::value_parser!(u32).range(1..=1024))]
    slots: Option<u32>,
    /// With --dev: the most work orders each worker queues beyond its slots, to have its next
    /// ones at hand when a task ends (WORKER_PREFETCH; it offers fewer while its runs are long);
    /// the worker's default when unset.
    #[arg(long, requires = "dev", value_parser = clap::value_parser!(u32).range(0..=1024))]
    prefetch: Option<u32>,
    /// With --dev: the nats-server binary (default: from PATH).
    #[arg(long, requires = "dev")]
    nats_server: Option<PathBuf>,
    /// With --dev: seconds an ended workflow's events stay in the log before the router purges
    /// them (ROUTER_KEEP_ENDED_SEC; 0 keeps them for ever).
    #[arg(long, requires = "dev", default_value_t = flowmesh_router::DEFAULT_KEEP_ENDED_SEC, value_parser = flowmesh_router::keep_ended_sec)]
    keep_ended_sec: u64,
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
    /// Also write every workflow's timeline to FILE as CSV (submitted_ms, to_start_ms,
    /// to_done_ms: ms from the first submission; an empty cell where nothing was measured), to see
    /// when a tail happened. With --sweep, each load's beside it, its percent before the extension
    /// (FILE-25.csv, FILE-50.csv, FILE-90.csv).
    #[arg(long, value_name = "FILE")]
    samples: Option<PathBuf>,
}

pub async fn run(nats: &NatsArgs, args: Args) -> anyhow::Result<ExitCode> {
    let mut options = bench::Options {
        tasks: args.tasks as usize,
        concurrency: args.concurrency as usize,
        rate: args.rate,
        mix: args.mix,
        raw_messages: args.raw_messages,
        timeout: Duration::from_secs(args.timeout_sec),
        ..Default::default()
    };
    flowmesh_nats::cli::init_tracing_with("warn,async_nats=error");
    let (_t, shutdown) = flowmesh_nats::cli::shutdown_on_signals();
    let (stack, js) = if args.dev {
        let stack = dev::Stack::start(dev::StackOptions {
            workers: usize::from(args.workers),
            batch_slots: args.slots,
            prefetch: args.prefetch,
            nats_server: args.nats_server,
            keep_ended: flowmesh_router::keep_ended(args.keep_ended_sec),
            ..Default::default()
        })
        .await?;
        eprintln!("bench: dev stack with {} worker(s) at {}", args.workers, stack.url());
        // Fresh workers publish their first snapshot within a heartbeat or two.
        options.fleet_wait = Duration::from_secs(30);
        // Measure the fleet asked for, not the first worker up.
        options.min_workers = usize::from(args.workers);
        options.cpu_of = vec![flowmesh::cpu::this("flowmesh bench and its dev stack (validator, router, workers)")];
        options
            .cpu_of
            .extend(stack.server.pid().map(|pid| flowmesh::cpu::Process { name: format!("nats-server {pid}"), pid }));
        // The private stack knows none of NATS_URL's credentials or TLS settings: a plain connection.
        let connection = NatsOptions { url: stack.url(), name: "flowmesh-bench".to_owned(), ..Default::default() };
        options.raw = args.raw.then(|| NatsOptions { name: "flowmesh-bench-raw".to_owned(), ..connection.clone() });
        let handles = Handles::ensure(&connect(&connection).await?, &Topology::load(1)?).await?;
        (Some(stack), handles.js)
    } else {
        let (_, handles, topology) = nats.handles_with_topology("flowmesh-bench").await?;
        options.raw = args.raw.then(|| nats.options("flowmesh-bench-raw"));
        // The raw ceiling is measured on a stream with the deployment's replicas.
        options.replicas = topology.replicas;
        // Whatever of the stack runs on this machine.
        options.cpu_of = flowmesh::cpu::local_processes("flowmesh bench");
        (None, handles.js)
    };
    eprintln!(
        "bench: {} task(s), mix {}, concurrency {}{}",
        options.tasks,
        options.mix,
        options.concurrency,
        if options.raw.is_some() { ", with the raw JetStream round trip" } else { "" }
    );
    let report = bench::run(&js, &options, shutdown.clone()).await;
    let mut sweep = Vec::new();
    if let Ok(burst) = &report
        && args.sweep
        && burst.success()
    {
        for percent in SWEEP_PERCENT {
            let rate = burst.tasks_per_sec * f64::from(percent) / 100.0;
            eprintln!("bench: {percent}% of {:.0} tasks/s: {rate:.0} submitted per second", burst.tasks_per_sec);
            let at_rate = bench::Options { rate: Some(rate), raw: None, ..options.clone() };
            match bench::run(&js, &at_rate, shutdown.clone()).await {
                Ok(r) => sweep.push(SweepPoint { percent, rate, report: r }),
                Err(e) => {
                    eprintln!("bench: the {percent}% run failed: {e:#}");
                    break;
                }
            }
        }
    }
    if let Some(stack) = stack {
        stack.stop().await;
    }
    let report = report?;
    if let Some(path) = &args.samples {
        let write = |path: &std::path::Path, r: &bench::Report| {
            std::fs::write(path, bench::samples_csv(&r.samples))
                .map_err(|e| anyhow::anyhow!("writing --samples {}: {e}", path.display()))
        };
        write(path, &report)?;
        for point in &sweep {
            write(&bench::point_samples_path(path, point.percent), &point.report)?;
        }
    }
    for r in std::iter::once(&report).chain(sweep.iter().map(|p| &p.report)) {
        for f in &r.failures {
            eprintln!("bench: {}: {}", f.workflow_id.as_deref().unwrap_or("(not submitted)"), f.reason);
        }
        if r.failed > r.failures.len() {
            eprintln!("bench: … and {} more failure(s)", r.failed - r.failures.len());
        }
    }
    let success = report.success() && sweep.iter().all(|p| p.report.success());
    match (args.json, args.sweep) {
        (true, false) => println!("{}", serde_json::to_string_pretty(&report)?),
        (true, true) => println!("{}", serde_json::to_string_pretty(&Sweep { burst: report, sweep })?),
        (false, _) => {
            print!("{}", bench::render(&report));
            for point in &sweep {
                println!("\nat {}% of the burst's rate ({:.0} submitted per second):", point.percent, point.rate);
                print!("{}", bench::render(&point.report));
            }
        }
    }
    Ok(super::exit(success))
}

/// The loads of `--sweep`, in percent of the burst's tasks/s.
const SWEEP_PERCENT: [u8; 3] = [25, 50, 90];

/// `--sweep --json`: the burst, then one run per load.
#[derive(serde::Serialize)]
struct Sweep {
    burst: bench::Report,
    sweep: Vec<SweepPoint>,
}

#[derive(serde::Serialize)]
struct SweepPoint {
    percent: u8,
    rate: f64,
    report: bench::Report,
}
