//! `flowmesh submit FILE [--watch]` (also `workflow submit`): submits a document, waits for its
//! verdict or, with `--watch`, follows the workflow to its end and prints its results.

use flowmesh::log;
use flowmesh::submit::{self, End};
use flowmesh_domain::EventBody;
use flowmesh_domain::state::State;
use flowmesh_nats::cli::NatsArgs;
use flowmesh_nats::subjects;
use futures_util::StreamExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
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

/// `--json` without `--watch`.
#[derive(serde::Serialize)]
struct Submitted<'a> {
    workflow_id: &'a str,
    accepted: bool,
}

/// `--json` with `--watch`.
#[derive(serde::Serialize)]
struct Watched<'a> {
    workflow_id: &'a str,
    /// `rejected`, `completed`, `failed` or `cancelled`.
    end: String,
    /// Each stage's result, by stage name.
    results: serde_json::Value,
}

pub async fn run(nats: &NatsArgs, args: Args) -> anyhow::Result<ExitCode> {
    let body = super::read_document(&args.file)?;
    let (_, handles) = nats.handles("flowmesh-cli").await?;
    // The id is scoped to this user: another user's `--msg-id` of the same text is another id.
    let msg_id = args.msg_id.as_deref().map(|given| nats.options("flowmesh-cli").scoped_msg_id(given)).transpose()?;
    let (workflow_id, seq) = submit::submit(&handles.js, body, msg_id.as_deref()).await?;
    eprintln!("submitted {workflow_id} ({} seq {seq})", subjects::SUBMISSIONS_STREAM);
    // From here the submission is stored and will be validated and run whatever happens to this
    // process: an error says so, so that nobody submits it a second time.
    let stored = |e: anyhow::Error| {
        e.context(format!(
            "{workflow_id} is stored and goes on without this command; following it failed \
             (`flowmesh workflow watch {workflow_id}` follows it again)"
        ))
    };
    if !args.watch {
        let accepted = verdict(&handles.js, &workflow_id, Duration::from_secs(30)).await.map_err(stored)?;
        if args.json {
            super::print_sorted_json(&Submitted { workflow_id: &workflow_id, accepted })?;
        }
        return Ok(super::exit(accepted));
    }
    let (end, state) =
        watch(&handles.js, &workflow_id, Duration::from_secs(args.timeout_sec), args.json).await.map_err(stored)?;
    let results = submit::results(&handles.js, &state, &workflow_id).await.map_err(stored)?;
    if args.json {
        let end_name = format!("{end:?}").to_lowercase();
        super::print_sorted_json(&Watched { workflow_id: &workflow_id, end: end_name, results })?;
    } else if end != End::Rejected {
        println!("{}", serde_json::to_string_pretty(&results)?);
    }
    Ok(super::exit(end.success()))
}

/// Follows a workflow to its end: a live table on a terminal, a line per event otherwise
/// (nothing when `quiet`).
pub async fn watch(
    js: &async_nats::jetstream::Context,
    workflow_id: &str,
    timeout: Duration,
    quiet: bool,
) -> anyhow::Result<(End, State)> {
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
            eprintln!("{}", flowmesh::table::printable(&p.to_string()));
        }
    }
    Ok(outcome)
}

/// Waits for the verdict only: `true` when accepted.
async fn verdict(js: &async_nats::jetstream::Context, workflow_id: &str, timeout: Duration) -> anyhow::Result<bool> {
    let stream = log::events(js, subjects::submission_events(workflow_id), true).await?;
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
            eprintln!("  {}", flowmesh::table::printable(&p.to_string()));
        }
    }
    Ok(matches!(event.body, EventBody::SubmissionAccepted(_)))
}
