//! `flowmesh events [--follow] [--workflow WF | --task TASK] [--json]`: the raw event log, a line
//! per event; what the log holds that is not a readable event is reported as skipped.

use flowmesh::table::printable;
use flowmesh::{log, submit};
use flowmesh_nats::cli::NatsArgs;
use flowmesh_nats::subjects;
use futures_util::StreamExt;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    follow: bool,
    #[arg(long)]
    workflow: Option<String>,
    #[arg(long)]
    task: Option<String>,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

/// The `--json` line for a message that is not a readable event.
#[derive(serde::Serialize)]
struct SkippedLine<'a> {
    skipped: &'a log::Skipped,
}

pub async fn run(nats: &NatsArgs, args: Args) -> anyhow::Result<ExitCode> {
    let (_, handles) = nats.handles("flowmesh-cli").await?;
    let filter = match (&args.workflow, &args.task) {
        (_, Some(task)) => subjects::task_events(task),
        (Some(wf), None) => subjects::workflow_events(wf),
        (None, None) => subjects::all_events(),
    };
    let stream = log::entries(&handles.js, filter, args.follow).await?;
    futures_util::pin_mut!(stream);
    while let Some(read) = stream.next().await {
        match (read?, args.json) {
            (log::Read::Event(event), true) => println!("{}", serde_json::to_string(&event)?),
            (log::Read::Event(event), false) => {
                let line = submit::progress_line(&event).unwrap_or_else(|| printable(&event.id).into_owned());
                println!("{}  {:<22} {}", printable(&event.time), event.body.kind(), line);
            }
            (log::Read::Skipped(skipped), true) => {
                println!("{}", serde_json::to_value(SkippedLine { skipped: &skipped })?)
            }
            (log::Read::Skipped(s), false) => {
                println!("skipped seq {} on {}: {}", s.seq, printable(&s.subject), printable(&s.reason))
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
