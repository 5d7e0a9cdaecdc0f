//! `flowmesh`: submit, watch, inspect and operate FlowMesh; `flowmesh dev` runs it all locally.

use anyhow::Context;
use clap::{Parser, Subcommand};
use flowmesh::submit::{self, End};
use flowmesh::{bench, dev, log, views};
use flowmesh_domain::event::{Author, TaskCancelRequested, WorkerCordon};
use flowmesh_domain::{Event, EventBody};
use flowmesh_nats::cli::NatsArgs;
use flowmesh_nats::connect::{NatsOptions, connect};
use flowmesh_nats::{Handles, Topology};
use flowmesh_nats::{clock, publish, subjects};
use futures_util::StreamExt;
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

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
    Dev(DevArgs),
    /// Submit a workflow document (FILE, or - for stdin).
    Submit(SubmitArgs),
    /// Check documents offline, with the validator's own rules.
    Validate {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Where each stage would be placed now, and why not elsewhere (nothing is submitted).
    Plan {
        file: PathBuf,
        #[arg(long, env = "ROUTER_STRATEGY", default_value = "best_fit")]
        strategy: String,
        #[arg(long)]
        json: bool,
    },
    /// Run a validator.
    Validator {
        #[arg(long, env = "VALIDATOR_CONSUMER", default_value = subjects::VALIDATORS_CONSUMER)]
        consumer: String,
    },
    /// Run the router.
    Router(flowmesh_router::RouterArgs),
    /// Run a worker, or inspect and operate the fleet (list, info, cordon, uncordon).
    #[command(args_conflicts_with_subcommands = true)]
    Worker {
        #[command(subcommand)]
        command: Option<WorkerCommand>,
        #[command(flatten)]
        args: Box<flowmesh_worker::WorkerArgs>,
        /// Print the probed hardware as JSON and exit.
        #[arg(long)]
        collect_hw: bool,
    },
    /// Workflows, from the event log.
    Workflow {
        #[command(subcommand)]
        command: WorkflowCommand,
    },
    /// Tasks, from the event log.
    Task {
        #[command(subcommand)]
        command: TaskCommand,
    },
    /// Shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    Completions { shell: clap_complete::Shell },
    /// The raw event log.
    Events {
        #[arg(long)]
        follow: bool,
        #[arg(long)]
        workflow: Option<String>,
        #[arg(long)]
        task: Option<String>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Results and artifacts.
    Result {
        #[command(subcommand)]
        command: ResultCommand,
    },
    /// Create or check the streams, buckets and object store defined in streams/.
    Streams {
        #[command(subcommand)]
        command: StreamsCommand,
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
    Bench(BenchArgs),
}

#[derive(clap::Args)]
struct DevArgs {
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
}

#[derive(clap::Args)]
struct BenchArgs {
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

#[derive(clap::Args)]
struct SubmitArgs {
    file: PathBuf,
    /// Follow the workflow until it ends and print its results.
    #[arg(long, alias = "wait")]
    watch: bool,
    /// Id for an idempotent submission: the same user submitting the same id again gets the
    /// first submission back. Scoped to the user (stored as `USER:ID:TAG` when NATS_USER and a
    /// password or creds are set), so another user's id never matches it.
    #[arg(long)]
    msg_id: Option<String>,
    #[arg(long, default_value_t = 600)]
    timeout_sec: u64,
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum WorkerCommand {
    /// Every worker with its task types, hardware, slots and staleness.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One worker's whole snapshot.
    Info { id: String },
    /// Stop placing new work on a worker.
    Cordon { id: String },
    /// Place work on a worker again (also ends a drain).
    Uncordon { id: String },
    /// Stop placing new work on a worker and let what it runs finish; `worker list` shows
    /// `draining (N running)`, then `drained` (safe to stop it).
    Drain { id: String },
    /// Ask an idle worker to load a model ahead of the tasks that need it (a hint).
    Prewarm { id: String, model: String },
}

#[derive(Subcommand)]
enum TaskCommand {
    /// Tasks with their status, attempt and worker.
    List {
        #[arg(long)]
        workflow: Option<String>,
        #[arg(long)]
        status: Option<String>,
        #[arg(long = "type")]
        task_type: Option<String>,
        #[arg(long)]
        worker: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// One task's whole state.
    Info { id: String },
    /// Follow one task until it ends; print its result.
    Watch {
        id: String,
        #[arg(long, default_value_t = 600)]
        timeout_sec: u64,
    },
    /// A task's captured output: stored logs, or live output with --follow while it runs.
    Logs {
        id: String,
        #[arg(long)]
        follow: bool,
        /// Show stderr instead of stdout.
        #[arg(long)]
        stderr: bool,
    },
    /// Stop one task (its worker kills the executor; a queued task is never dispatched).
    #[command(visible_alias = "stop")]
    Cancel { id: String },
}

#[derive(Subcommand)]
enum WorkflowCommand {
    /// Submit a workflow document (as `flowmesh submit`).
    Submit(SubmitArgs),
    /// Check documents offline (as `flowmesh validate`).
    Validate {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Every task's captured output: stored, downloaded (--download DIR) or live (--follow).
    Logs(cmd::logs::Args),
    List {
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        owner: Option<String>,
        #[arg(long)]
        json: bool,
    },
    Info {
        id: String,
        #[arg(long)]
        json: bool,
    },
    Watch {
        id: String,
        #[arg(long, default_value_t = 600)]
        timeout_sec: u64,
    },
    Cancel {
        id: String,
    },
}

#[derive(Subcommand)]
enum ResultCommand {
    /// Download a task's results and artifacts, verifying their digests.
    Fetch {
        task: String,
        #[arg(long, default_value = ".")]
        out: PathBuf,
    },
    /// A task's results, logs and artifacts as one .tgz bundle, digests verified.
    Download(cmd::download::Args),
}

#[derive(Subcommand)]
enum StreamsCommand {
    Apply,
    /// Every stream's leader and replicas; exit 0 when each has a leader and current replicas.
    Status {
        /// Wait up to this many seconds for every stream to be healthy.
        #[arg(long, default_value_t = 0)]
        wait: u64,
        #[arg(long)]
        json: bool,
    },
    /// Print streams/nats-server.conf with a user of its own for each worker (`worker-ID`, its
    /// password in FLOWMESH_WORKER_ID_PASSWORD), allowed only that worker's work and keys, and
    /// for each submitter (`NAME`, its password in FLOWMESH_SUBMITTER_NAME_PASSWORD).
    ServerConfig {
        /// A worker id; repeat for each worker.
        #[arg(long = "worker")]
        workers: Vec<String>,
        /// A submitter's user name; repeat for each user.
        #[arg(long = "submitter")]
        submitters: Vec<String>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    // Behave like other Unix tools when a pipe closes (`flowmesh events | head`): stop quietly.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    match run(cli).await {
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
            | Command::Validator { .. }
            | Command::Router(_)
            | Command::Worker { command: None, .. }
            | Command::Bench(_)
    );
    if !sets_up_its_own_log {
        // A client command prints warnings only: a failover being ridden out, for one.
        flowmesh_nats::cli::init_tracing_with("warn,async_nats=error");
    }
    match cli.command {
        Command::Dev(args) => {
            cli.nats.install_metrics()?;
            dev_command(args).await
        }
        Command::Submit(args) => submit_command(&cli.nats, args).await,
        Command::Validate { files, json } => Ok(validate_command(&files, json)),
        Command::Plan { file, strategy, json } => plan_command(&cli.nats, &file, &strategy, json).await,
        Command::Validator { consumer } => {
            flowmesh_nats::cli::init_tracing();
            let (_t, shutdown) = flowmesh_nats::cli::shutdown_on_signals();
            cli.nats.install_metrics()?;
            let (_, handles) = cli.nats.handles("flowmesh-validator").await?;
            flowmesh_validator::run(flowmesh_validator::Config { consumer, ..Default::default() }, handles, shutdown)
                .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Router(args) => {
            flowmesh_nats::cli::init_tracing();
            let config = args.config()?;
            let (_t, shutdown) = flowmesh_nats::cli::shutdown_on_signals();
            cli.nats.install_metrics()?;
            let (client, handles) = cli.nats.handles("flowmesh-router").await?;
            flowmesh_router::run(config, client, handles, shutdown).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Worker { command: Some(command), .. } => worker_command(&cli.nats, command).await,
        Command::Worker { command: None, args, collect_hw } => {
            let config = args.config(&flowmesh_worker::default_hostname())?;
            if collect_hw {
                flowmesh_worker::print_hardware(&config).await?;
                return Ok(ExitCode::SUCCESS);
            }
            flowmesh_nats::cli::init_tracing();
            let (_t, shutdown) = flowmesh_nats::cli::shutdown_on_signals();
            cli.nats.install_metrics()?;
            let (client, handles) = cli.nats.handles("flowmesh-worker").await?;
            flowmesh_worker::run(config, client, handles, shutdown).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Workflow { command: WorkflowCommand::Validate { files, json } } => Ok(validate_command(&files, json)),
        Command::Workflow { command: WorkflowCommand::Submit(args) } => submit_command(&cli.nats, args).await,
        Command::Workflow { command } => workflow_command(&cli.nats, command).await,
        Command::Task { command } => task_command(&cli.nats, command).await,
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "flowmesh", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Events { follow, workflow, task, json } => {
            let (_, handles) = cli.nats.handles("flowmesh-cli").await?;
            let filter = match (&workflow, &task) {
                (_, Some(task)) => subjects::task_events(task),
                (Some(wf), None) => subjects::workflow_events(wf),
                (None, None) => format!("{}.>", subjects::EVENTS_PREFIX),
            };
            let stream = log::entries(&handles.js, filter, follow).await?;
            futures_util::pin_mut!(stream);
            while let Some(read) = stream.next().await {
                match (read?, json) {
                    (log::Read::Event(event), true) => println!("{}", serde_json::to_string(&event)?),
                    (log::Read::Event(event), false) => {
                        let line = submit::progress_line(&event).unwrap_or_else(|| event.id.clone());
                        println!("{}  {:<22} {}", event.time, event.body.kind(), line);
                    }
                    (log::Read::Skipped(s), true) => println!("{}", serde_json::json!({ "skipped": s })),
                    (log::Read::Skipped(s), false) => {
                        println!("skipped seq {} on {}: {}", s.seq, s.subject, s.reason)
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Result { command: ResultCommand::Download(args) } => {
            let (_, handles) = cli.nats.handles("flowmesh-cli").await?;
            cmd::download::run(&handles.js, args).await
        }
        Command::Result { command: ResultCommand::Fetch { task, out } } => {
            let (_, handles) = cli.nats.handles("flowmesh-cli").await?;
            for f in views::fetch_results(&handles.js, &task, &out).await? {
                let how = if f.verified { "digest verified" } else { "inline in its task.completed event" };
                println!("{}  {} bytes  ({how})", out.join(&f.name).display(), f.size);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(args) => bench_command(&cli.nats, args).await,
        Command::Ssh { command } => {
            let (_, handles) = cli.nats.handles("flowmesh-cli").await?;
            cmd::ssh::run(&handles.js, command).await
        }
        Command::Trace(args) => {
            let (_, handles) = cli.nats.handles("flowmesh-cli").await?;
            cmd::trace::run(&handles.js, args).await
        }
        Command::Streams { command: StreamsCommand::Status { wait, json } } => {
            let (_, handles) = cli.nats.handles("flowmesh-cli").await?;
            let deadline = std::time::Instant::now() + Duration::from_secs(wait);
            loop {
                let health = views::stream_health(&handles.js).await?;
                let healthy = health.iter().all(|h| h.healthy);
                if healthy || std::time::Instant::now() >= deadline {
                    if json {
                        println!("{}", serde_json::to_string_pretty(&health)?);
                    } else {
                        print!("{}", views::stream_health_table(&health));
                    }
                    return Ok(if healthy { ExitCode::SUCCESS } else { ExitCode::from(1) });
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        Command::Streams { command: StreamsCommand::ServerConfig { workers, submitters } } => {
            let config = flowmesh_nats::auth::server_config(&workers, &submitters).map_err(|e| anyhow::anyhow!(e))?;
            print!("{config}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Streams { command: StreamsCommand::Apply } => {
            cli.nats.handles("flowmesh-cli").await?;
            println!(
                "streams {}, {}, {}, buckets {}, {} and object store {} are in place ({} replica(s))",
                subjects::SUBMISSIONS_STREAM,
                subjects::EVENTS_STREAM,
                subjects::WORK_STREAM,
                subjects::WORKERS_BUCKET,
                subjects::CONTROL_BUCKET,
                subjects::ARTIFACTS_BUCKET,
                cli.nats.replicas
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn read_document(path: &PathBuf) -> anyhow::Result<Vec<u8>> {
    if path.as_os_str() == "-" {
        let mut body = Vec::new();
        std::io::stdin().read_to_end(&mut body)?;
        Ok(body)
    } else {
        std::fs::read(path).with_context(|| format!("reading {}", path.display()))
    }
}

async fn plan_command(nats: &NatsArgs, file: &PathBuf, strategy: &str, json: bool) -> anyhow::Result<ExitCode> {
    let strategy: flowmesh_domain::placement::Strategy = strategy.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    let body = read_document(file)?;
    let workflow = match flowmesh_domain::validate_submission(&body, "wf-plan") {
        Ok(w) => w,
        Err(problems) => {
            eprintln!("{} is not valid:\n{}", file.display(), flowmesh::plan::render_problems(&problems));
            return Ok(ExitCode::from(1));
        }
    };
    let (_, handles) = nats.handles("flowmesh-cli").await?;
    let live: Vec<_> =
        views::workers(&handles.js).await?.into_iter().filter(|(w, age)| *age <= w.ttl_sec).map(|(w, _)| w).collect();
    let fleet_state = log::fold(&handles.js, format!("{}.fleet.>", subjects::EVENTS_PREFIX)).await?;
    // Which running inference request an identical stage would share: read only when it can matter.
    let leaders = if workflow.tasks.iter().any(|t| t.task_type == "inference") {
        flowmesh_domain::schedule::merge_leaders(
            &log::fold(&handles.js, format!("{}.>", subjects::EVENTS_PREFIX)).await?,
        )
    } else {
        Default::default()
    };
    let (cordoned, draining) = (&fleet_state.cordoned, &fleet_state.draining);
    let plans = flowmesh::plan::plan(&workflow, &live, cordoned, draining, &leaders, strategy, clock::now_ms());
    if json {
        println!("{}", serde_json::to_string_pretty(&plans)?);
    } else {
        print!("{}", flowmesh::plan::render(&plans));
    }
    Ok(if plans.iter().all(|p| p.chosen.is_some()) { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn validate_command(files: &[PathBuf], json: bool) -> ExitCode {
    let mut all_ok = true;
    let mut report = Vec::new();
    for file in files {
        let outcome = read_document(file)
            .map_err(|e| e.to_string())
            .map(|body| flowmesh_domain::validate_submission(&body, "wf-0"));
        let problems = match outcome {
            Err(e) => vec![flowmesh_domain::Problem::new("/", e)],
            Ok(Ok(_)) => Vec::new(),
            Ok(Err(problems)) => problems,
        };
        all_ok &= problems.is_empty();
        if json {
            report.push(serde_json::json!({ "file": file, "valid": problems.is_empty(), "errors": problems }));
        } else if problems.is_empty() {
            println!("{}: valid", file.display());
        } else {
            println!("{}: {} problem(s)", file.display(), problems.len());
            for p in &problems {
                println!("  {p}");
            }
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
    }
    if all_ok { ExitCode::SUCCESS } else { ExitCode::from(1) }
}

async fn submit_command(nats: &NatsArgs, args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let body = read_document(&args.file)?;
    let (_, handles) = nats.handles("flowmesh-cli").await?;
    // The id is scoped to this user: another user's `--msg-id` of the same text is another id.
    let msg_id = args.msg_id.as_deref().map(|given| nats.options("flowmesh-cli").scoped_msg_id(given)).transpose()?;
    let (workflow_id, seq) = submit::submit(&handles.js, body, msg_id.as_deref()).await?;
    eprintln!("submitted {workflow_id} ({} seq {seq})", subjects::SUBMISSIONS_STREAM);
    if !args.watch {
        let accepted = verdict(&handles.js, &workflow_id, Duration::from_secs(30)).await?;
        if args.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({ "workflow_id": workflow_id, "accepted": accepted }))?
            );
        }
        return Ok(if accepted { ExitCode::SUCCESS } else { ExitCode::from(1) });
    }
    let (end, state) = watch(&handles.js, &workflow_id, Duration::from_secs(args.timeout_sec), args.json).await?;
    let results = submit::results(&handles.js, &state, &workflow_id).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "workflow_id": workflow_id, "end": format!("{end:?}").to_lowercase(), "results": results })
            )?
        );
    } else if end != End::Rejected {
        println!("{}", serde_json::to_string_pretty(&results)?);
    }
    Ok(if end.success() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Follows a workflow to its end: a live table on a terminal, a line per event otherwise.
async fn watch(
    js: &async_nats::jetstream::Context,
    workflow_id: &str,
    timeout: Duration,
    quiet: bool,
) -> anyhow::Result<(submit::End, flowmesh_domain::state::State)> {
    use std::io::IsTerminal;
    let live = !quiet && std::io::stderr().is_terminal();
    let mut view = submit::LiveView::default();
    let mut problems: Vec<String> = Vec::new();
    let outcome = submit::follow(js, workflow_id, timeout, |event, state| {
        if let EventBody::SubmissionRejected(r) = &event.body {
            problems = r.errors.iter().map(|p| format!("  {p}")).collect();
        }
        if live {
            let _ = view.draw(state, workflow_id, &mut std::io::stderr());
        } else if !quiet && let Some(line) = submit::progress_line(event) {
            eprintln!("{line}");
        }
    })
    .await?;
    if !problems.is_empty() {
        if live {
            eprintln!("rejected with {} problem(s)", problems.len());
        }
        for p in &problems {
            eprintln!("{p}");
        }
    }
    Ok(outcome)
}

/// Waits for the verdict only: `true` when accepted.
async fn verdict(js: &async_nats::jetstream::Context, workflow_id: &str, timeout: Duration) -> anyhow::Result<bool> {
    let stream = log::events(js, format!("{}.{workflow_id}._.submission.>", subjects::EVENTS_PREFIX), true).await?;
    futures_util::pin_mut!(stream);
    let event = tokio::time::timeout(timeout, stream.next())
        .await
        .map_err(|_| {
            anyhow::anyhow!("no verdict for {workflow_id} within {}s; is a validator running?", timeout.as_secs())
        })?
        .ok_or_else(|| anyhow::anyhow!("event stream ended"))??;
    if let Some(line) = submit::progress_line(&event) {
        eprintln!("{line}");
    }
    if let EventBody::SubmissionRejected(r) = &event.body {
        for p in &r.errors {
            eprintln!("  {p}");
        }
    }
    Ok(matches!(event.body, EventBody::SubmissionAccepted(_)))
}

async fn worker_command(nats: &NatsArgs, command: WorkerCommand) -> anyhow::Result<ExitCode> {
    let (client, handles) = nats.handles("flowmesh-cli").await?;
    match command {
        WorkerCommand::Prewarm { id, model } => return cmd::prewarm::run(&client, &handles.js, &id, &model).await,
        WorkerCommand::List { json } => {
            let workers = views::workers(&handles.js).await?;
            let mut fleet = log::fold(&handles.js, format!("{}.fleet.>", subjects::EVENTS_PREFIX)).await?;
            if !fleet.draining.is_empty() {
                // What a draining worker still runs is in the log (its snapshot lags a heartbeat).
                fleet = log::fold(&handles.js, format!("{}.>", subjects::EVENTS_PREFIX)).await?;
            }
            if json {
                let list: Vec<_> = workers
                    .iter()
                    .map(|(w, age)| {
                        serde_json::json!({
                            "snapshot": w,
                            "age_sec": age,
                            "cordoned": fleet.cordoned.contains(&w.id),
                            "draining": fleet.draining.contains(&w.id),
                            "status": views::worker_status(w, &fleet),
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                views::print_workers(&workers, &fleet);
            }
        }
        WorkerCommand::Info { id } => {
            let workers = views::workers(&handles.js).await?;
            let (w, _) = workers
                .iter()
                .find(|(w, _)| w.id == id)
                .ok_or_else(|| anyhow::anyhow!("no worker {id:?} in {}", subjects::WORKERS_BUCKET))?;
            println!("{}", serde_json::to_string_pretty(w)?);
        }
        WorkerCommand::Cordon { id } | WorkerCommand::Uncordon { id } | WorkerCommand::Drain { id }
            if !flowmesh_domain::ids::is_valid_worker_id(&id) =>
        {
            anyhow::bail!("{id:?} is not a worker id");
        }
        WorkerCommand::Cordon { id } => {
            operate(&handles.js, EventBody::WorkerCordoned(WorkerCordon { worker_id: id.clone() })).await?;
            println!("{id} cordoned: no new work will be placed on it");
        }
        WorkerCommand::Uncordon { id } => {
            operate(&handles.js, EventBody::WorkerUncordoned(WorkerCordon { worker_id: id.clone() })).await?;
            println!("{id} uncordoned");
        }
        WorkerCommand::Drain { id } => {
            operate(&handles.js, EventBody::WorkerDrainRequested(WorkerCordon { worker_id: id.clone() })).await?;
            println!("{id} draining: no new work; running tasks finish (see flowmesh worker list); uncordon to undo");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Publishes an operator's event; its id counts the operator events already in the log.
async fn operate(js: &async_nats::jetstream::Context, body: EventBody) -> anyhow::Result<()> {
    let now = clock::now_ms();
    let event = Event::new(body, clock::rfc3339(now), now);
    publish::publish_event(js, &event, Author::Service).await?;
    Ok(())
}

async fn workflow_command(nats: &NatsArgs, command: WorkflowCommand) -> anyhow::Result<ExitCode> {
    let (client, handles) = nats.handles("flowmesh-cli").await?;
    match command {
        // FlowMesh's spellings of the top-level verbs; `run` sends them there.
        WorkflowCommand::Submit(args) => return submit_command(nats, args).await,
        WorkflowCommand::Validate { files, json } => return Ok(validate_command(&files, json)),
        WorkflowCommand::Logs(args) => return cmd::logs::run(&client, &handles.js, args).await,
        WorkflowCommand::List { status, owner, json } => {
            let state = log::fold(&handles.js, format!("{}.*._.submission.>", subjects::EVENTS_PREFIX)).await?;
            let mut full = flowmesh_domain::state::State::default();
            // Statuses need every event of the listed workflows; one filtered read covers them.
            if !state.workflows.is_empty() {
                full = log::fold(&handles.js, format!("{}.>", subjects::EVENTS_PREFIX)).await?;
            }
            full.rejected.extend(state.rejected);
            let rows: Vec<Vec<String>> = views::workflow_rows(&full)
                .into_iter()
                .filter(|row| {
                    status.as_deref().is_none_or(|s| row[2] == s) && owner.as_deref().is_none_or(|o| row[4] == o)
                })
                .collect();
            if json {
                let list: Vec<_> = rows
                    .iter()
                    .map(|r| serde_json::json!({"workflow_id": r[0], "name": r[1], "status": r[2], "done": r[3], "owner": r[4], "submitted_at": r[5]}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                print!(
                    "{}",
                    flowmesh::table::render(&["WORKFLOW", "NAME", "STATUS", "DONE", "OWNER", "SUBMITTED"], &rows)
                );
            }
        }
        WorkflowCommand::Info { id, json } => {
            let state = log::fold(&handles.js, subjects::workflow_events(&id)).await?;
            if let Some(r) = state.rejected.get(&id) {
                println!("{id} was rejected:");
                for p in &r.errors {
                    println!("  {p}");
                }
                return Ok(ExitCode::from(1));
            }
            let wf = state.workflows.get(&id).ok_or_else(|| anyhow::anyhow!("no workflow {id}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(wf)?);
            } else {
                views::print_workflow(wf);
            }
        }
        WorkflowCommand::Watch { id, timeout_sec } => {
            let (end, _) = watch(&handles.js, &id, Duration::from_secs(timeout_sec), false).await?;
            return Ok(if end.success() { ExitCode::SUCCESS } else { ExitCode::from(1) });
        }
        WorkflowCommand::Cancel { id } => {
            let now = clock::now_ms();
            let body = EventBody::TaskCancelRequested(TaskCancelRequested {
                workflow_id: id.clone(),
                task_id: None,
                reason: "cancelled by operator".to_owned(),
            });
            publish::publish_event(&handles.js, &Event::new(body, clock::rfc3339(now), now), Author::Service).await?;
            println!("cancel requested for {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn task_command(nats: &NatsArgs, command: TaskCommand) -> anyhow::Result<ExitCode> {
    let (client, handles) = nats.handles("flowmesh-cli").await?;
    match command {
        TaskCommand::List { workflow, status, task_type, worker, json } => {
            let filter = match &workflow {
                Some(wf) => subjects::workflow_events(wf),
                None => format!("{}.>", subjects::EVENTS_PREFIX),
            };
            let state = log::fold(&handles.js, filter).await?;
            let tasks: Vec<&flowmesh_domain::state::TaskState> = state
                .workflows
                .values()
                .flat_map(|w| w.tasks.iter())
                .filter(|t| status.as_deref().is_none_or(|s| views::status_name(t.status) == s))
                .filter(|t| task_type.as_deref().is_none_or(|ty| t.def.task_type == ty))
                .filter(|t| worker.as_deref().is_none_or(|w| t.worker_id.as_deref() == Some(w)))
                .collect();
            if json {
                println!("{}", serde_json::to_string_pretty(&tasks)?);
            } else {
                print!("{}", views::task_table(&tasks));
            }
        }
        TaskCommand::Watch { id, timeout_sec } => {
            return cmd::task_watch::run(&handles.js, &id, Duration::from_secs(timeout_sec)).await;
        }
        TaskCommand::Info { id } => {
            let state = log::fold_task(&handles.js, &id).await?;
            let task = state.task(&id).ok_or_else(|| anyhow::anyhow!("no task {id}"))?;
            println!("{}", serde_json::to_string_pretty(task)?);
        }
        TaskCommand::Logs { id, follow, stderr } => {
            let stream = if stderr { "stderr" } else { "stdout" };
            if follow {
                return follow_logs(&client, &handles.js, &id, stream).await;
            }
            let state = log::fold_task(&handles.js, &id).await?;
            let task = state.task(&id).ok_or_else(|| anyhow::anyhow!("no task {id}"))?;
            let stores = flowmesh_nats::artifacts::Stores::new(&handles.js);
            let Some(bytes) = views::stored_log(&stores, task, stream).await? else {
                anyhow::bail!("no stored {stream} for {id}; a running task's output: flowmesh task logs {id} --follow");
            };
            std::io::Write::write_all(&mut std::io::stdout(), &bytes)?;
        }
        TaskCommand::Cancel { id } => {
            let state = log::fold_task(&handles.js, &id).await?;
            let task = state.task(&id).ok_or_else(|| anyhow::anyhow!("no task {id}"))?;
            let workflow_id = state
                .workflows
                .values()
                .find(|w| w.tasks.iter().any(|t| t.def.task_id == id))
                .map(|w| w.workflow_id.clone());
            let workflow_id = workflow_id.ok_or_else(|| anyhow::anyhow!("no workflow holds {id}"))?;
            if task.status.is_terminal() {
                anyhow::bail!("{id} already ended ({})", views::status_name(task.status));
            }
            let now = clock::now_ms();
            let body = EventBody::TaskCancelRequested(TaskCancelRequested {
                workflow_id,
                task_id: Some(id.clone()),
                reason: "cancelled by operator".to_owned(),
            });
            publish::publish_event(&handles.js, &Event::new(body, clock::rfc3339(now), now), Author::Service).await?;
            println!("cancel requested for {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints a task's live output until the task ends.
async fn follow_logs(
    client: &async_nats::Client,
    js: &async_nats::jetstream::Context,
    id: &str,
    stream: &str,
) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let mut output = client.subscribe(subjects::logs(id, stream)).await?;
    // The whole workflow's events: the fold learns the task from `submission.accepted`, which the
    // task's own subjects do not carry (following only those never saw the task end).
    let workflow_id = id.splitn(3, '-').take(2).collect::<Vec<_>>().join("-");
    let events = log::events(js, subjects::workflow_events(&workflow_id), true).await?;
    futures_util::pin_mut!(events);
    let mut state = flowmesh_domain::state::State::default();
    let mut printed_live = false;
    loop {
        tokio::select! {
            chunk = output.next() => match chunk {
                Some(message) => {
                    std::io::stdout().write_all(&message.payload)?;
                    std::io::stdout().flush()?;
                    printed_live |= !message.payload.is_empty();
                }
                None => return Ok(ExitCode::SUCCESS),
            },
            event = events.next() => match event {
                Some(event) => {
                    let event = event?;
                    state.apply(&event);
                    if let Some(t) = state.task(id)
                        && t.status.is_terminal()
                    {
                        // Followed too late to hear any of it live (the task ended first, or
                        // before it printed): the stored log is the whole output.
                        if !printed_live
                            && let Ok(Some(bytes)) =
                                views::stored_log(&flowmesh_nats::artifacts::Stores::new(js), t, stream).await
                        {
                            std::io::stdout().write_all(&bytes)?;
                        }
                        eprintln!("[{id} {}]", views::status_name(t.status));
                        return Ok(if t.status == flowmesh_domain::state::TaskStatus::Completed { ExitCode::SUCCESS } else { ExitCode::from(1) });
                    }
                }
                None => return Ok(ExitCode::SUCCESS),
            },
        }
    }
}

async fn bench_command(nats: &NatsArgs, args: BenchArgs) -> anyhow::Result<ExitCode> {
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
    Ok(if report.success() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

async fn dev_command(args: DevArgs) -> anyhow::Result<ExitCode> {
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
            return Ok(if end.success() { ExitCode::SUCCESS } else { ExitCode::from(1) });
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
