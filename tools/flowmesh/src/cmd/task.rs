//! `flowmesh task list|info|watch|logs|cancel` (`stop`): tasks, from the event log.

use flowmesh::{log, submit, views};
use flowmesh_domain::event::TaskCancelRequested;
use flowmesh_domain::state::{State, TaskState, TaskStatus};
use flowmesh_domain::{EventBody, ids};
use flowmesh_nats::cli::NatsArgs;
use flowmesh_nats::subjects;
use futures_util::StreamExt;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Tasks with their status, attempt and worker.
    List {
        #[arg(long)]
        workflow: Option<String>,
        #[arg(long, value_enum)]
        status: Option<TaskStatus>,
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

pub async fn run(nats: &NatsArgs, command: Command) -> anyhow::Result<ExitCode> {
    let (client, handles) = nats.handles("flowmesh-cli").await?;
    match command {
        Command::List { workflow, status, task_type, worker, json } => {
            let filter = match &workflow {
                Some(wf) => subjects::workflow_events(wf),
                None => subjects::all_events(),
            };
            let state = log::fold(&handles.js, filter).await?;
            let tasks: Vec<&TaskState> = state
                .workflows
                .values()
                .flat_map(|w| w.tasks.iter())
                .filter(|t| status.is_none_or(|s| t.status == s))
                .filter(|t| task_type.as_deref().is_none_or(|ty| t.def.task_type == ty))
                .filter(|t| worker.as_deref().is_none_or(|w| t.worker_id.as_deref() == Some(w)))
                .collect();
            if json {
                println!("{}", serde_json::to_string_pretty(&tasks)?);
            } else {
                print!("{}", views::task_table(&tasks));
            }
        }
        Command::Watch { id, timeout_sec } => {
            return watch(&handles.js, &id, Duration::from_secs(timeout_sec)).await;
        }
        Command::Info { id } => {
            let state = log::fold_task(&handles.js, &id).await?;
            let task = state.task(&id).ok_or_else(|| anyhow::anyhow!("no task {id}"))?;
            println!("{}", serde_json::to_string_pretty(task)?);
        }
        Command::Logs { id, follow, stderr } => {
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
        Command::Cancel { id } => {
            let state = log::fold_task(&handles.js, &id).await?;
            let task = state.task(&id).ok_or_else(|| anyhow::anyhow!("no task {id}"))?;
            let workflow_id = state
                .workflows
                .values()
                .find(|w| w.tasks.iter().any(|t| t.def.task_id == id))
                .map(|w| w.workflow_id.clone());
            let workflow_id = workflow_id.ok_or_else(|| anyhow::anyhow!("no workflow holds {id}"))?;
            if task.status.is_terminal() {
                anyhow::bail!("{id} already ended ({})", task.status.as_str());
            }
            let body = EventBody::TaskCancelRequested(TaskCancelRequested {
                workflow_id,
                task_id: Some(id.clone()),
                reason: "cancelled by operator".to_owned(),
            });
            super::operate(&handles.js, body).await?;
            println!("cancel requested for {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `task watch ID`: follows one task to its end, a line per event about it on stderr, its result
/// on stdout when it completes.
async fn watch(js: &async_nats::jetstream::Context, id: &str, timeout: Duration) -> anyhow::Result<ExitCode> {
    let workflow_id =
        ids::workflow_of_task(id).ok_or_else(|| anyhow::anyhow!("{id:?} is not a task id (wf-<n>-<stage>)"))?;
    // The task is born in its workflow's verdict: follow the whole workflow, show this task.
    let events = log::events(js, subjects::workflow_events(workflow_id), true).await?;
    futures_util::pin_mut!(events);
    let mut state = State::default();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let event = match tokio::time::timeout_at(deadline, events.next()).await {
            Err(_) => anyhow::bail!("{id} did not end within {}s", timeout.as_secs()),
            Ok(None) => anyhow::bail!("the event stream ended before {id} did"),
            Ok(Some(event)) => event?,
        };
        state.apply(&event);
        if state.rejected.contains_key(workflow_id) {
            anyhow::bail!("{workflow_id} was rejected; it has no tasks");
        }
        if state.workflows.contains_key(workflow_id) && state.task(id).is_none() {
            anyhow::bail!("no task {id} in {workflow_id}");
        }
        let about_this_task = match &event.body {
            EventBody::TaskCancelRequested(c) => c.task_id.as_deref().is_none_or(|t| t == id),
            body => body.task().is_some_and(|t| t.task_id == id),
        };
        if about_this_task && let Some(line) = submit::progress_line(&event) {
            eprintln!("{line}");
        }
        if let Some(t) = state.task(id)
            && t.status.is_terminal()
        {
            eprintln!("{id} {}", t.status.as_str());
            if t.status == TaskStatus::Completed {
                let results = submit::results(js, &state, workflow_id).await?;
                if let Some(result) = results.get(&t.def.stage) {
                    println!("{}", serde_json::to_string_pretty(result)?);
                }
                return Ok(ExitCode::SUCCESS);
            }
            return Ok(ExitCode::from(1));
        }
    }
}

/// `task logs ID --follow`: prints a task's live output until the task ends.
async fn follow_logs(
    client: &async_nats::Client,
    js: &async_nats::jetstream::Context,
    id: &str,
    stream: &str,
) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let mut output = client.subscribe(subjects::logs_of(id, stream)).await?;
    // The whole workflow's events: the fold learns the task from `submission.accepted`, which the
    // task's own subjects do not carry (following only those never saw the task end).
    let workflow_id = id.splitn(3, '-').take(2).collect::<Vec<_>>().join("-");
    let events = log::events(js, subjects::workflow_events(&workflow_id), true).await?;
    futures_util::pin_mut!(events);
    let mut state = State::default();
    let mut live = views::LiveOutput::default();
    let mut printed_live = false;
    let mut print = |shown: Vec<(String, Vec<u8>)>| -> std::io::Result<()> {
        for (_, chunk) in shown {
            std::io::stdout().write_all(&chunk)?;
            printed_live |= !chunk.is_empty();
        }
        std::io::stdout().flush()
    };
    loop {
        tokio::select! {
            chunk = output.next() => match chunk {
                Some(message) => print(live.take(&message.subject, &message.payload, &state))?,
                None => return Ok(ExitCode::SUCCESS),
            },
            event = events.next() => match event {
                Some(event) => {
                    let event = event?;
                    state.apply(&event);
                    print(live.release(&state))?;
                    if let Some(t) = state.task(id)
                        && t.status.is_terminal()
                    {
                        // Followed too late to hear any of it live (the task ended first, or
                        // before it printed): the stored log is the whole output.
                        if !printed_live
                            && let Some(bytes) =
                                views::stored_log(&flowmesh_nats::artifacts::Stores::new(js), t, stream).await?
                        {
                            std::io::stdout().write_all(&bytes)?;
                            std::io::stdout().flush()?;
                        }
                        eprintln!("[{id} {}]", t.status.as_str());
                        return Ok(super::exit(t.status == TaskStatus::Completed));
                    }
                }
                None => return Ok(ExitCode::SUCCESS),
            },
        }
    }
}
