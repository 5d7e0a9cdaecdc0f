//! Submitting a document and following its workflow to the end.

use crate::log;
use async_nats::jetstream::{self, message::PublishMessage};
use flowmesh_domain::state::{State, TaskStatus, WorkflowStatus};
use flowmesh_domain::{Event, EventBody, ids};
use flowmesh_nats::{retry, subjects};
use futures_util::StreamExt;
use std::time::Duration;

/// Publishes a submission; returns the workflow id it will get (from the stream sequence).
/// Every submission carries a `Nats-Msg-Id` (one of its own when none is given), so a publish
/// retried across a failover is stored once and answers with the first one's sequence.
pub async fn submit(js: &jetstream::Context, body: Vec<u8>, msg_id: Option<&str>) -> anyhow::Result<(String, u64)> {
    let msg_id = msg_id.map(str::to_owned).unwrap_or_else(fresh_msg_id);
    let body = bytes::Bytes::from(body);
    let ack = retry::patiently("storing the submission", retry::FAILOVER_BUDGET, || async {
        let publish = PublishMessage::build().payload(body.clone()).message_id(msg_id.as_str());
        Ok(js.send_publish(subjects::SUBMIT, publish).await?.await?)
    })
    .await
    .map_err(|e| anyhow::anyhow!("submission not stored: {e}"))?;
    Ok((ids::workflow_id(ack.sequence), ack.sequence))
}

/// A message id no other submission has: this process (its id and the instant of its first
/// submission) and a count of its submissions. Not the clock at each call: two calls may read
/// the same instant, and a clock stepped back repeats one, and either would make the stream take
/// a second document for the first one's retry, store nothing, and answer with the first one's
/// workflow.
fn fresh_msg_id() -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PROCESS: OnceLock<String> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let process = PROCESS.get_or_init(|| {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        format!("cli-{}-{nanos}", std::process::id())
    });
    format!("{process}-{}", COUNT.fetch_add(1, Ordering::Relaxed))
}

/// How a followed workflow ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Rejected,
    Completed,
    Failed,
    Cancelled,
}

impl End {
    pub fn success(self) -> bool {
        self == End::Completed
    }
}

/// Follows one workflow's events until its verdict is a rejection or the workflow ends.
/// `on_event` sees every event with the fold after it.
pub async fn follow(
    js: &jetstream::Context,
    workflow_id: &str,
    timeout: Duration,
    mut on_event: impl FnMut(&Event, &State),
) -> anyhow::Result<(End, State)> {
    // Why a task waits for a slot is not stored: the router says it on a core subject.
    let mut hints = js.client().subscribe(subjects::workflow_hints(workflow_id)).await?;
    let stream = log::events(js, subjects::workflow_events(workflow_id), true).await?;
    futures_util::pin_mut!(stream);
    let mut state = State::default();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let next = async {
            tokio::select! {
                event = stream.next() => Some(event),
                Some(hint) = hints.next() => {
                    if let Ok(hint) = serde_json::from_slice::<Event>(&hint.payload)
                        && matches!(hint.body, EventBody::TaskPending(_))
                    {
                        on_event(&hint, &state);
                    }
                    None
                }
            }
        };
        let event = match tokio::time::timeout_at(deadline, next).await {
            Err(_) => anyhow::bail!("{workflow_id} did not finish within {}s", timeout.as_secs()),
            Ok(None) => continue,
            Ok(Some(None)) => anyhow::bail!("the event stream ended before {workflow_id} finished"),
            Ok(Some(Some(event))) => event?,
        };
        state.apply(&event);
        on_event(&event, &state);
        if state.rejected.contains_key(workflow_id) {
            return Ok((End::Rejected, state));
        }
        // Stop at the workflow's end as the log shows it (stored, or derived right after its last
        // task's end), so that `on_event` sees that line too.
        if event.body.ended_workflow() == Some(workflow_id)
            && let Some(wf) = state.workflows.get(workflow_id)
        {
            let end = match wf.status {
                WorkflowStatus::Running => continue,
                WorkflowStatus::Completed => End::Completed,
                WorkflowStatus::Failed => End::Failed,
                WorkflowStatus::Cancelled => End::Cancelled,
            };
            return Ok((end, state));
        }
    }
}

/// One line for a person following a workflow, or `None` for events not worth a line. Fit to
/// print: what the event's writer wrote is [`crate::table::printable`].
pub fn progress_line(event: &Event) -> Option<String> {
    let line = match &event.body {
        EventBody::SubmissionAccepted(e) => {
            format!("accepted: {} task(s): {}", e.task_ids.len(), e.task_ids.join(", "))
        }
        EventBody::SubmissionRejected(e) => format!("rejected with {} problem(s)", e.errors.len()),
        EventBody::TaskPending(e) => format!("{:<12} waiting: {}", e.task.stage, e.message),
        EventBody::TaskDispatched(e) => {
            format!("{:<12} dispatched to {} (attempt {})", e.task.stage, e.worker_id, e.task.attempt)
        }
        EventBody::TaskMerged(e) => {
            format!("{:<12} merged with {} (one execution, its own result)", e.task.stage, e.into)
        }
        EventBody::TaskStarted(e) => format!("{:<12} started on {}", e.task.stage, e.worker_id),
        EventBody::TaskUpdated(e) => format!("{:<12} {}", e.task.stage, e.message),
        EventBody::TaskCompleted(e) => format!("{:<12} completed ({} artifact(s))", e.task.stage, e.artifacts.len()),
        EventBody::TaskFailed(e) => format!(
            "{:<12} failed: {} ({}){}",
            e.task.stage,
            e.message,
            e.reason,
            if e.retryable { ", retryable" } else { "" }
        ),
        EventBody::TaskRequeued(e) => {
            format!("{:<12} requeued as attempt {}: {}", e.task.stage, e.task.attempt, e.reason)
        }
        EventBody::TaskSkipped(e) => format!("{:<12} skipped: {}", e.task.stage, e.reason),
        EventBody::TaskCancelRequested(e) => format!("cancel requested: {}", e.reason),
        EventBody::TaskCancelled(e) => format!("{:<12} cancelled: {}", e.task.stage, e.reason),
        EventBody::WorkflowCompleted(e) => format!("workflow {} completed", e.workflow_id),
        EventBody::WorkflowFailed(e) => {
            format!("workflow {} failed: {}", e.workflow_id, e.reason.as_deref().unwrap_or(""))
        }
        EventBody::WorkflowCancelled(e) => format!("workflow {} cancelled", e.workflow_id),
        EventBody::WorkerJoined(_)
        | EventBody::WorkerLost(_)
        | EventBody::WorkerCordoned(_)
        | EventBody::WorkerUncordoned(_)
        | EventBody::WorkerDrainRequested(_)
        | EventBody::WorkerPrewarmRequested(_)
        | EventBody::WorkflowsPurged(_) => return None,
    };
    Some(crate::table::printable(&line).into_owned())
}

/// The results of a finished workflow, stage → result (fetched from the store when not inline).
pub async fn results(js: &jetstream::Context, state: &State, workflow_id: &str) -> anyhow::Result<serde_json::Value> {
    let mut out = serde_json::Map::new();
    let Some(wf) = state.workflows.get(workflow_id) else {
        return Ok(serde_json::Value::Object(out));
    };
    let stores = flowmesh_nats::artifacts::Stores::new(js);
    for t in &wf.tasks {
        let value = match (t.status, &t.result, &t.result_object) {
            (TaskStatus::Completed, Some(result), _) => result.clone(),
            (TaskStatus::Completed, None, Some(object)) => {
                let artifact = t.artifacts.iter().find(|a| &a.object == object);
                let artifact =
                    artifact.ok_or_else(|| anyhow::anyhow!("{}: {object} is not among its files", t.def.task_id))?;
                serde_json::from_slice(&stores.fetch(artifact).await?)?
            }
            (status, _, _) => {
                serde_json::json!({ "status": status, "reason": t.reason, "message": t.message })
            }
        };
        out.insert(t.def.stage.clone(), value);
    }
    Ok(serde_json::Value::Object(out))
}

/// A bar for a running stage from an ML runner's progress (`step`/`max_steps` or `item`/`items`),
/// e.g. `[######----] step 6/10 loss 1.2345`; `None` when the progress has no fraction.
pub fn progress_bar(progress: &serde_json::Value) -> Option<String> {
    let num = |k: &str| progress.get(k).and_then(serde_json::Value::as_f64);
    let (done, total, unit) = match (num("step"), num("max_steps"), num("item"), num("items")) {
        (Some(step), Some(max), _, _) if max > 0.0 => (step, max, "step"),
        (_, _, Some(item), Some(items)) if items > 0.0 => (item, items, "item"),
        _ => return None,
    };
    let width = 10usize;
    let filled = ((done / total).clamp(0.0, 1.0) * width as f64).round() as usize;
    let mut text = format!("[{}{}] {unit} {done}/{total}", "#".repeat(filled), "-".repeat(width - filled));
    if let Some(loss) = num("loss") {
        text += &format!(" loss {loss:.4}");
    }
    if let Some(tps) = num("tokens_per_second") {
        text += &format!(" {tps:.1} tokens/s");
    }
    Some(text)
}

/// A table of a workflow's stages (state, worker, attempt, elapsed), redrawn in place on a
/// terminal as events arrive.
#[derive(Default)]
pub struct LiveView {
    /// Lines drawn last time, to move the cursor back over them.
    drawn: usize,
    started: std::collections::HashMap<String, std::time::Instant>,
    finished: std::collections::HashMap<String, Duration>,
}

impl LiveView {
    /// The table for the current fold.
    pub fn render(&mut self, state: &State, workflow_id: &str) -> String {
        let Some(wf) = state.workflows.get(workflow_id) else {
            return format!("{workflow_id}: waiting for the verdict\n");
        };
        let rows: Vec<Vec<String>> = wf
            .tasks
            .iter()
            .map(|t| {
                let id = &t.def.task_id;
                if t.status.is_on_worker() || t.status.is_terminal() {
                    self.started.entry(id.clone()).or_insert_with(std::time::Instant::now);
                }
                if t.status.is_terminal() && !self.finished.contains_key(id) {
                    let took = self.started.get(id).map_or(Duration::ZERO, |s| s.elapsed());
                    self.finished.insert(id.clone(), took);
                }
                let elapsed = self.finished.get(id).copied().or_else(|| self.started.get(id).map(|s| s.elapsed()));
                let mut note = crate::views::task_note(t);
                if let (true, Some(bar)) = (t.status.is_on_worker(), t.progress.as_ref().and_then(progress_bar)) {
                    note = bar;
                }
                if note.chars().count() > 72 {
                    note = note.chars().take(71).collect::<String>() + "…";
                }
                vec![
                    t.def.stage.clone(),
                    t.status.as_str().to_owned(),
                    t.worker_id.clone().unwrap_or_else(|| "-".to_owned()),
                    t.attempt.to_string(),
                    elapsed.map_or_else(|| "-".to_owned(), |d| format!("{:.1}s", d.as_secs_f64())),
                    note,
                ]
            })
            .collect();
        let status = wf.status.as_str();
        format!(
            "{workflow_id} ({}) {status}\n{}",
            wf.name,
            crate::table::render(&["STAGE", "STATUS", "WORKER", "ATTEMPT", "ELAPSED", "NOTE"], &rows)
        )
    }

    /// Redraws the table over the previous one.
    pub fn draw(&mut self, state: &State, workflow_id: &str, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let text = self.render(state, workflow_id);
        if self.drawn > 0 {
            // Cursor up over the last table, then clear to the end of the screen.
            write!(out, "\x1b[{}A\x1b[J", self.drawn)?;
        }
        write!(out, "{text}")?;
        out.flush()?;
        self.drawn = text.lines().count();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{fresh_msg_id, progress_bar, progress_line};
    use flowmesh_domain::Event;
    use flowmesh_domain::event::{EventBody, FailureReason, TaskFailed, TaskRef};
    use serde_json::json;

    #[test]
    fn a_worker_s_failure_message_prints_as_text() {
        let task =
            TaskRef { workflow_id: "wf-1".into(), task_id: "wf-1-main".into(), stage: "main".into(), attempt: 1 };
        let failed = EventBody::TaskFailed(TaskFailed {
            task,
            worker_id: Some("w1".into()),
            reason: FailureReason::ExecutorError,
            message: "exit 1\x1b[2J\rall good".into(),
            retryable: false,
        });
        let line = progress_line(&Event::new(failed, "2026-11-27T00:00:00Z".into(), 0)).unwrap();
        assert_eq!(line, "main         failed: exit 1\\u{1b}[2J\\rall good (executor_error)");
    }

    #[test]
    fn message_ids_made_at_once_on_many_threads_never_repeat() {
        let threads: Vec<_> =
            (0..4).map(|_| std::thread::spawn(|| (0..20_000).map(|_| fresh_msg_id()).collect::<Vec<_>>())).collect();
        let ids: Vec<String> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        let distinct: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        assert!(ids.iter().all(|id| id.starts_with(&format!("cli-{}-", std::process::id()))), "{}", ids[0]);
    }

    #[test]
    fn a_bar_follows_steps_or_items() {
        let train = json!({"step": 1, "max_steps": 2, "loss": 4.25});
        assert_eq!(progress_bar(&train).unwrap(), "[#####-----] step 1/2 loss 4.2500");
        let infer = json!({"item": 3, "items": 3, "tokens_per_second": 12.5});
        assert_eq!(progress_bar(&infer).unwrap(), "[##########] item 3/3 12.5 tokens/s");
        assert_eq!(progress_bar(&json!({"message": "loading"})), None);
    }
}
