//! `flowmesh trace WF [--svg FILE] [--json]`: from the event log, each task's waiting, queueing,
//! placement, run and upload times and the workflow's critical path; `--svg` draws the timeline.

use flowmesh::{log, timeline};
use flowmesh_nats::cli::NatsArgs;
use flowmesh_nats::subjects;
use futures_util::StreamExt;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    workflow: String,
    /// Also write the timeline as an SVG picture (one bar per task, coloured by phase).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

pub async fn run(nats: &NatsArgs, args: Args) -> anyhow::Result<ExitCode> {
    let (_, handles) = nats.handles("flowmesh-cli").await?;
    let stream = log::events(&handles.js, subjects::workflow_events(&args.workflow), false).await?;
    futures_util::pin_mut!(stream);
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        events.push(event?);
    }
    let trace = flowmesh_domain::trace::trace(&events, &args.workflow).map_err(|e| anyhow::anyhow!(e))?;
    if let Some(path) = &args.svg {
        std::fs::write(path, timeline::svg(&trace))?;
        eprintln!("timeline written to {}", path.display());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&trace)?);
    } else {
        println!(
            "{} ({}) {} in {}; critical path: {}",
            trace.workflow_id,
            trace.name,
            trace.outcome,
            timeline::duration(trace.total_ms),
            if trace.critical_path.is_empty() { "-".to_owned() } else { trace.critical_path.join(" -> ") }
        );
        print!("{}", timeline::table(&trace));
    }
    Ok(ExitCode::SUCCESS)
}
