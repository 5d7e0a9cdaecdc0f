//! `flowmesh workflow logs WF`: every task's captured output, in the workflow's order — the
//! stored logs (`--download DIR` writes them to files), or live output with `--follow`.

use flowmesh::{log, views};
use flowmesh_domain::state::{State, TaskState, WorkflowStatus};
use flowmesh_nats::subjects;
use futures_util::StreamExt;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    pub id: String,
    /// Print the live output of the running tasks until the workflow ends.
    #[arg(long, conflicts_with = "download")]
    pub follow: bool,
    /// Write every task's stdout.log and stderr.log to DIR/<task_id>/ instead of printing them.
    #[arg(long, value_name = "DIR")]
    pub download: Option<PathBuf>,
    /// Show stderr instead of stdout.
    #[arg(long)]
    pub stderr: bool,
}

fn header(t: &TaskState) -> String {
    format!("==> {} ({}) <==", t.def.task_id, t.def.stage)
}

pub async fn run(
    client: &async_nats::Client,
    js: &async_nats::jetstream::Context,
    args: Args,
) -> anyhow::Result<ExitCode> {
    let state = log::fold(js, subjects::workflow_events(&args.id)).await?;
    let Some(wf) = state.workflows.get(&args.id) else {
        anyhow::bail!("no workflow {}", args.id);
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
        let stage = t.def.stage.clone();
        let subscriber = client.subscribe(subjects::logs(&t.def.task_id, stream)).await?;
        subscriptions.push(subscriber.map(move |m| (stage.clone(), m.payload)).boxed());
    }
    let mut output = futures_util::stream::select_all(subscriptions);
    let events = log::events(js, subjects::workflow_events(workflow_id), true).await?;
    futures_util::pin_mut!(events);
    let mut state = State::default();
    loop {
        tokio::select! {
            Some((stage, chunk)) = output.next() => {
                let mut out = std::io::stdout();
                for line in String::from_utf8_lossy(&chunk).lines() {
                    writeln!(out, "[{stage}] {line}")?;
                }
                out.flush()?;
            }
            event = events.next() => {
                let Some(event) = event else { return Ok(ExitCode::SUCCESS) };
                state.apply(&event?);
                if let Some(wf) = state.workflows.get(workflow_id)
                    && wf.status != WorkflowStatus::Running
                {
                    eprintln!("[{workflow_id} {}]", flowmesh::views::workflow_status_name(wf.status));
                    return Ok(if wf.status == WorkflowStatus::Completed { ExitCode::SUCCESS } else { ExitCode::from(1) });
                }
            }
        }
    }
}
