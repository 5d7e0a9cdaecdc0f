//! `flowmesh task watch ID`: follows one task to its end, a line per event about it on stderr,
//! its result on stdout when it completes.

use flowmesh::{log, submit, views};
use flowmesh_domain::state::{State, TaskStatus};
use flowmesh_domain::{EventBody, ids};
use flowmesh_nats::subjects;
use futures_util::StreamExt;
use std::process::ExitCode;
use std::time::Duration;

pub async fn run(js: &async_nats::jetstream::Context, id: &str, timeout: Duration) -> anyhow::Result<ExitCode> {
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
            eprintln!("{id} {}", views::status_name(t.status));
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
