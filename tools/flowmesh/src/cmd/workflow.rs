//! `flowmesh workflow list|info|watch|cancel|logs` (and `submit`, `validate`, the top-level verbs
//! under their FlowMesh spellings): workflows, from the event log.

use super::{submit, validate};
use flowmesh::table;
use flowmesh::{log, views};
use flowmesh_domain::EventBody;
use flowmesh_domain::event::TaskCancelRequested;
use flowmesh_domain::state::{State, TaskState, WorkflowStatus};
use flowmesh_nats::cli::NatsArgs;
use flowmesh_nats::subjects;
use futures_util::StreamExt;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Submit a workflow document (as `flowmesh submit`).
    Submit(submit::Args),
    /// Check documents offline (as `flowmesh validate`).
    Validate(validate::Args),
    #[command(flatten)]
    FromLog(FromLog),
}

/// The subcommands that read the event log.
#[derive(clap::Subcommand)]
pub enum FromLog {
    /// Every task's captured output: stored, downloaded (--download DIR) or live (--follow).
    Logs(LogsArgs),
    List {
        #[arg(long, value_enum)]
        status: Option<ListedStatus>,
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

/// What `workflow list --status` picks: a workflow's status, or `rejected` (a submission that
/// never became a workflow), spelled as the STATUS column shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum ListedStatus {
    Running,
    Completed,
    Failed,
    Cancelled,
    Rejected,
}

impl ListedStatus {
    fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self).map(|v| v.get_name().to_owned()).unwrap_or_default()
    }
}

#[derive(clap::Args)]
pub struct LogsArgs {
    id: String,
    /// Print the live output of the running tasks until the workflow ends.
    #[arg(long, conflicts_with = "download")]
    follow: bool,
    /// Write every task's stdout.log and stderr.log to DIR/<task_id>/ instead of printing them.
    #[arg(long, value_name = "DIR")]
    download: Option<PathBuf>,
    /// Show stderr instead of stdout.
    #[arg(long)]
    stderr: bool,
}

pub async fn run(nats: &NatsArgs, command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Submit(args) => submit::run(nats, args).await,
        Command::Validate(args) => validate::run(&args),
        Command::FromLog(command) => from_log(nats, command).await,
    }
}

async fn from_log(nats: &NatsArgs, command: FromLog) -> anyhow::Result<ExitCode> {
    let (client, handles) = nats.handles("flowmesh-cli").await?;
    match command {
        FromLog::Logs(args) => return logs(&client, &handles.js, args).await,
        FromLog::List { status, owner, json } => {
            let state = log::fold(&handles.js, subjects::submission_events("*")).await?;
            let mut full = State::default();
            // Statuses need every event of the listed workflows; one filtered read covers them.
            if !state.workflows.is_empty() {
                full = log::fold(&handles.js, subjects::all_events()).await?;
            }
            full.rejected.extend(state.rejected);
            let rows: Vec<views::WorkflowRow> = views::workflow_rows(&full)
                .into_iter()
                .filter(|row| {
                    status.is_none_or(|s| row.status == s.name()) && owner.as_deref().is_none_or(|o| row.owner == o)
                })
                .collect();
            if json {
                super::print_sorted_json(&rows)?;
            } else {
                print!("{}", table::rows(&rows));
            }
        }
        FromLog::Info { id, json } => {
            let state = log::fold(&handles.js, subjects::workflow_events(&id)).await?;
            if let Some(r) = state.rejected.get(&id) {
                println!("{id} was rejected:");
                for p in &r.errors {
                    println!("  {}", flowmesh::table::printable(&p.to_string()));
                }
                return Ok(ExitCode::from(1));
            }
            let Some(wf) = state.workflows.get(&id) else {
                // The latest purge record lists every workflow whose events retention removed.
                match log::purged(&handles.js, &id).await {
                    Some(why) => anyhow::bail!("{why}"),
                    None => anyhow::bail!("no workflow {id}"),
                }
            };
            if json {
                println!("{}", serde_json::to_string_pretty(wf)?);
            } else {
                views::print_workflow(wf);
            }
        }
        FromLog::Watch { id, timeout_sec } => {
            let (end, _) = submit::watch(&handles.js, &id, Duration::from_secs(timeout_sec), false).await?;
            return Ok(super::exit(end.success()));
        }
        FromLog::Cancel { id } => {
            let body = EventBody::TaskCancelRequested(TaskCancelRequested {
                workflow_id: id.clone(),
                task_id: None,
                reason: "cancelled by operator".to_owned(),
            });
            super::operate(&handles.js, body).await?;
            println!("cancel requested for {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn header(t: &TaskState) -> String {
    format!("==> {} ({}) <==", t.def.task_id, t.def.stage)
}

/// `workflow logs WF`: every task's captured output, in the workflow's order: the stored logs
/// (`--download DIR` writes them to files), or live output with `--follow`.
async fn logs(
    client: &async_nats::Client,
    js: &async_nats::jetstream::Context,
    args: LogsArgs,
) -> anyhow::Result<ExitCode> {
    let state = log::fold(js, subjects::workflow_events(&args.id)).await?;
    let Some(wf) = state.workflows.get(&args.id) else {
        match log::purged(js, &args.id).await {
            Some(why) => anyhow::bail!("{why}"),
            None => anyhow::bail!("no workflow {}", args.id),
        }
    };
    let stores = flowmesh_nats::artifacts::Stores::new(js);
    let stream = if args.stderr { "stderr" } else { "stdout" };
    if let Some(dir) = &args.download {
        let mut written = 0;
        for t in &wf.tasks {
            for name in ["stdout", "stderr"] {
                if let Some(bytes) = views::stored_log(&stores, t, name).await? {
                    let path = dir.join(&t.def.task_id).join(format!("{name}.log"));
                    std::fs::create_dir_all(path.parent().expect("a task folder"))?;
                    std::fs::write(&path, &bytes)?;
                    println!("{}  {} bytes", path.display(), bytes.len());
                    written += 1;
                }
            }
        }
        anyhow::ensure!(written > 0, "no stored logs for {} yet", args.id);
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = std::io::stdout();
    let mut live = Vec::new();
    for t in &wf.tasks {
        match views::stored_log(&stores, t, stream).await? {
            Some(bytes) => {
                writeln!(out, "{}", header(t))?;
                out.write_all(&bytes)?;
            }
            None if args.follow && !t.status.is_terminal() => live.push(t.clone()),
            None if t.status.is_terminal() => eprintln!("{}: no {stream} (the task never ran)", t.def.task_id),
            None => eprintln!("{}: no stored {stream} yet; add --follow for live output", t.def.task_id),
        }
    }
    out.flush()?;
    if !args.follow || wf.status != WorkflowStatus::Running {
        return Ok(ExitCode::SUCCESS);
    }
    follow(client, js, &args.id, &live, stream).await
}

/// Live output of `tasks`, each line prefixed with its stage, until the workflow ends.
async fn follow(
    client: &async_nats::Client,
    js: &async_nats::jetstream::Context,
    workflow_id: &str,
    tasks: &[TaskState],
    stream: &str,
) -> anyhow::Result<ExitCode> {
    let mut subscriptions = Vec::new();
    for t in tasks {
        subscriptions.push(client.subscribe(subjects::logs_of(&t.def.task_id, stream)).await?);
    }
    let stages: std::collections::BTreeMap<&str, &str> =
        tasks.iter().map(|t| (t.def.task_id.as_str(), t.def.stage.as_str())).collect();
    let mut output = futures_util::stream::select_all(subscriptions);
    let events = log::events(js, subjects::workflow_events(workflow_id), true).await?;
    futures_util::pin_mut!(events);
    let mut state = State::default();
    let mut live = views::LiveOutput::default();
    let print = |shown: Vec<(String, Vec<u8>)>| -> std::io::Result<()> {
        let mut out = std::io::stdout();
        for (task, chunk) in shown {
            let stage = stages.get(task.as_str()).copied().unwrap_or(task.as_str());
            for line in String::from_utf8_lossy(&chunk).lines() {
                writeln!(out, "[{stage}] {line}")?;
            }
        }
        out.flush()
    };
    loop {
        tokio::select! {
            Some(message) = output.next() => print(live.take(&message.subject, &message.payload, &state))?,
            event = events.next() => {
                let Some(event) = event else { return Ok(ExitCode::SUCCESS) };
                let event = event?;
                state.apply(&event);
                print(live.release(&state))?;
                if event.body.ended_workflow() == Some(workflow_id)
                    && let Some(wf) = state.workflows.get(workflow_id)
                    && wf.status != WorkflowStatus::Running
                {
                    eprintln!("[{workflow_id} {}]", wf.status.as_str());
                    return Ok(if wf.status == WorkflowStatus::Completed { ExitCode::SUCCESS } else { ExitCode::from(1) });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ListedStatus;
    use clap::ValueEnum;
    use flowmesh_domain::state::WorkflowStatus;

    #[test]
    fn every_workflow_status_can_be_listed_by_the_name_the_table_shows() {
        for status in WorkflowStatus::value_variants() {
            let name = status.as_str();
            let listed = ListedStatus::from_str(name, false);
            assert_eq!(listed.map(ListedStatus::name), Ok(name.to_owned()), "--status {name}");
        }
        assert_eq!(ListedStatus::Rejected.name(), "rejected");
    }
}
